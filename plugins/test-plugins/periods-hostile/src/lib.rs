//! A period plugin that misbehaves as each event asks, written against the
//! raw `tally:plugin@0.2.0` bindings (no SDK in the way). An event is
//! `{"id": "...", "do": "<what>", "quantity": <n>}` as plain text fields;
//! its time is `ts` if it has one, else 2026-11-10T12:00:00Z; customer
//! `acme`.
//!
//! - `ok`: counts `quantity`;
//! - `trap-describe`, `loop-describe`: fail while describing (its batch
//!   is described again event by event);
//! - `extra-facts`: describes two events for one;
//! - `huge-id`: an event id of 1 MiB;
//! - `huge-addend`: an addend of 8 MiB;
//! - `big-addend`: counts `quantity`, with an addend of 512 KiB (the event
//!   and spaces);
//! - `trap-add`, `loop-add`: fail while adding;
//! - `huge-state`: a period state of 8 MiB;
//! - `trap-value`: marks the state, whose value then traps.
//!
//! `configure` refuses `{"refuse": true}` with a message.

wit_bindgen::generate!({ path: "../../../wit/tally-plugin@0.2.0", world: "periods-plugin" });

use exports::tally::plugin::config::Guest as Config;
use exports::tally::plugin::periods::{Addition, Guest as Periods, Refusal};
use tally::plugin::types::{Event, EventFacts, EventTime, Level};

/// Logs panic messages at error level before the trap, as the SDKs do: the
/// host names them in the dead letter's reason.
fn hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            tally::plugin::log::log(Level::Error, &info.to_string())
        }))
    });
}

#[allow(dead_code)]
struct Hostile;

/// The text of field `name` in a flat JSON object (no escapes).
fn field<'a>(value: &'a str, name: &str) -> &'a str {
    let Some(start) = value.find(&format!("\"{name}\":")) else { return "" };
    let rest = value[start + name.len() + 3..].trim_start();
    let rest = rest.strip_prefix('"').unwrap_or(rest);
    let end = rest.find(['"', ',', '}']).unwrap_or(rest.len());
    &rest[..end]
}

fn text(event: &Event) -> &str {
    std::str::from_utf8(&event.value).unwrap_or("")
}

#[allow(clippy::empty_loop)]
fn spin() -> ! {
    loop {
        std::hint::black_box(());
    }
}

impl Config for Hostile {
    fn configure(config: String) -> Result<(), String> {
        if config.contains("\"refuse\":true") {
            return Err("this plugin refuses to run: {\"refuse\": true}".into());
        }
        Ok(())
    }
}

/// A period's state after the event whose text is `addend` (this plugin's
/// addend is the whole event).
fn add_one(state: Option<Vec<u8>>, addend: &[u8]) -> Vec<u8> {
    let value = std::str::from_utf8(addend).unwrap_or("");
    let total = state
        .as_deref()
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.trim_start_matches('!').parse::<u64>().ok())
        .unwrap_or(0);
    let poisoned = state.as_deref().is_some_and(|s| s.starts_with(b"!"));
    match field(value, "do") {
        "trap-add" => panic!("add trapped as asked"),
        "loop-add" => spin(),
        "huge-state" => return vec![b'7'; 8 << 20],
        _ => {}
    }
    let quantity: u64 = field(value, "quantity").parse().unwrap_or(0);
    let marked = poisoned || field(value, "do") == "trap-value";
    format!("{}{}", if marked { "!" } else { "" }, total + quantity).into_bytes()
}

impl Periods for Hostile {
    fn describe(events: Vec<Event>) -> Vec<Result<EventFacts, String>> {
        hook();
        let mut described = Vec::new();
        for event in &events {
            let value = text(event);
            let ts = match field(value, "ts") {
                "" => "2026-11-10T12:00:00Z",
                ts => ts,
            };
            let facts = |id: String| EventFacts {
                id,
                time: EventTime::Rfc3339(ts.into()),
                key: vec![("customer".into(), "acme".into())],
                customer: "acme".into(),
                addend: event.value.clone(),
            };
            match field(value, "do") {
                "trap-describe" => panic!("describe trapped as asked"),
                "loop-describe" => spin(),
                "extra-facts" => {
                    described.push(Ok(facts(field(value, "id").into())));
                    described.push(Ok(facts("extra".into())));
                }
                "huge-id" => described.push(Ok(facts("x".repeat(1 << 20)))),
                "big-addend" => {
                    let mut addend = event.value.clone();
                    addend.resize(512 << 10, b' ');
                    described.push(Ok(EventFacts { addend, ..facts(field(value, "id").into()) }))
                }
                "huge-addend" => described.push(Ok(EventFacts {
                    addend: vec![b'7'; 8 << 20],
                    ..facts(field(value, "id").into())
                })),
                _ => described.push(Ok(facts(field(value, "id").into()))),
            }
        }
        described
    }

    fn add(
        states: Vec<Option<Vec<u8>>>,
        addends: Vec<Vec<u8>>,
        additions: Vec<Addition>,
    ) -> Result<Vec<Vec<u8>>, Refusal> {
        hook();
        let mut states = states;
        for addition in &additions {
            let addend = &addends[addition.addend as usize];
            let state = &mut states[addition.period as usize];
            *state = Some(add_one(state.take(), addend));
        }
        Ok(states.into_iter().map(Option::unwrap_or_default).collect())
    }

    fn value(state: Vec<u8>) -> u64 {
        hook();
        if state.starts_with(b"!") {
            panic!("value trapped as asked");
        }
        std::str::from_utf8(&state).ok().and_then(|s| s.parse().ok()).unwrap_or(0)
    }
}

// Exported only in the wasm build: the names are not valid native symbols.
#[cfg(target_arch = "wasm32")]
export!(Hostile);
