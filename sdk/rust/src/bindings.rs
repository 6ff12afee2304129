//! The component boundary: generated `tally:plugin@0.1.0` bindings and the
//! glue between them and the plain types of this crate. Not public API.

use crate::types::{Event, Host, Level, OutputRecord, Plugin};

#[allow(missing_docs)]
pub mod generated {
    wit_bindgen::generate!({
        path: "../../wit/tally-plugin@0.1.0",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "export_plugin",
        default_bindings_module: "tally_sdk::bindings::generated",
        // Imports take borrowed lists: a batch's keys and outputs go to the
        // host straight from the plugin's buffers, without copies.
        ownership: Borrowing { duplicate_if_necessary: true },
    });
}

pub use generated::export_plugin;
pub use generated::exports::tally::plugin::aggregator::Guest;
pub use generated::tally::plugin::types::{Event as WitEvent, Rejection as WitRejection};

use generated::tally::plugin::{log, output, state, types};

/// The host as seen from inside a component: the `tally:plugin` imports.
struct ComponentHost;

impl Host for ComponentHost {
    fn get_many(&mut self, keys: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
        state::get_many(keys)
    }

    fn put_many(&mut self, entries: &[(&[u8], &[u8])]) {
        state::put_many(entries)
    }

    fn delete_many(&mut self, keys: &[&[u8]]) {
        state::delete_many(keys)
    }

    fn emit_many(&mut self, name: &str, records: &[OutputRecord<'_>]) {
        let records: Vec<types::OutputRecord<'_>> = records
            .iter()
            .map(|record| types::OutputRecord {
                event: record.event,
                key: record.key,
                value: record.value,
            })
            .collect();
        output::emit_many(name, &records)
    }

    fn log(&mut self, level: Level, message: &str) {
        let level = match level {
            Level::Trace => types::Level::Trace,
            Level::Debug => types::Level::Debug,
            Level::Info => types::Level::Info,
            Level::Warn => types::Level::Warn,
            Level::Error => types::Level::Error,
        };
        log::log(level, message)
    }
}

/// Runs one exported `process` call on a fresh `P`.
pub fn process<P: Plugin + Default>(events: Vec<WitEvent>) -> Vec<WitRejection> {
    install_panic_hook();
    let events = events
        .into_iter()
        .map(|event| Event {
            partition: event.partition,
            offset: event.offset,
            timestamp_ms: event.timestamp_ms,
            key: event.key,
            value: event.value,
        })
        .collect();
    P::default()
        .process(events, &mut ComponentHost)
        .into_iter()
        .map(|rejection| WitRejection { index: rejection.index, reason: rejection.reason })
        .collect()
}

/// Sends panic messages to the host log before the trap, so the host can
/// name the panic in the dead-letter reason.
fn install_panic_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            log::log(types::Level::Error, &format!("panic: {info}"))
        }));
    });
}

/// The generated `tally:plugin@0.2.0` bindings of period plugins.
#[allow(missing_docs)]
pub mod periods_generated {
    wit_bindgen::generate!({
        path: "../../wit/tally-plugin@0.2.0",
        world: "periods-plugin",
        pub_export_macro: true,
        export_macro_name: "export_periods_plugin",
        default_bindings_module: "tally_sdk::bindings::periods_generated",
    });
}

pub use periods_generated::export_periods_plugin;
pub use periods_generated::exports::tally::plugin::config::Guest as ConfigGuest;
pub use periods_generated::exports::tally::plugin::periods::{
    Addition as WitAddition, Guest as PeriodsGuest, Refusal as WitRefusal,
};
pub use periods_generated::tally::plugin::types::{
    Event as WitPeriodEvent, EventFacts as WitFacts, EventTime as WitEventTime,
    Instant as WitInstant,
};

/// Runs `describe` over a batch.
pub fn describe_all<P: crate::Periods>(
    plugin: &P,
    events: Vec<WitPeriodEvent>,
) -> Vec<Result<WitFacts, String>> {
    install_periods_panic_hook();
    events
        .iter()
        .map(|event| {
            crate::periods::describe(plugin, &event.value).map(|facts| WitFacts {
                id: facts.id,
                time: match facts.time {
                    crate::EventTime::Rfc3339(text) => WitEventTime::Rfc3339(text),
                    crate::EventTime::UnixMillis(millis) => WitEventTime::UnixMillis(millis),
                },
                key: facts.key,
                customer: facts.customer,
                addend: facts.addend,
            })
        })
        .collect()
}

/// Runs `add`: folds a batch's additions into their periods' states.
pub fn add_all<P: crate::Periods>(
    plugin: &P,
    states: Vec<Option<Vec<u8>>>,
    addends: Vec<Vec<u8>>,
    additions: Vec<WitAddition>,
) -> Result<Vec<Vec<u8>>, WitRefusal> {
    install_periods_panic_hook();
    let refusal = |index: usize, reason: String| WitRefusal { addition: index as u32, reason };
    let mut folded = Vec::with_capacity(additions.len());
    for (index, addition) in additions.iter().enumerate() {
        let Some(addend) = addends.get(addition.addend as usize) else {
            let reason =
                format!("the addition names addend {}, of {}", addition.addend, addends.len());
            return Err(refusal(index, reason));
        };
        folded.push(crate::periods::Addition {
            period: addition.period as usize,
            time: crate::Instant {
                seconds: addition.time.seconds,
                nanoseconds: addition.time.nanoseconds,
            },
            addend,
        });
    }
    crate::periods::add_all(plugin, &states, &folded)
        .map_err(|(index, reason)| refusal(index, reason))
}

/// Sends panic messages to the host log before the trap (period plugins):
/// every export installs it first.
pub fn install_periods_panic_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            periods_generated::tally::plugin::log::log(
                periods_generated::tally::plugin::types::Level::Error,
                &format!("panic: {info}"),
            )
        }));
    });
}
