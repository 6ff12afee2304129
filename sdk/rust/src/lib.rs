//! Write Tally aggregation plugins in Rust.
//!
//! A Tally plugin is a WebAssembly component that turns batches of input
//! events into state updates and output records. The host owns consumption,
//! state and transactions, so whatever the plugin computes is applied exactly
//! once. This crate hides the component plumbing: you describe a keyed
//! aggregation with typed (serde) events, keys, state and outputs, and
//! [`export!`] turns it into the plugin's entry point.
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use tally_sdk::{Aggregate, Reject};
//!
//! #[derive(Deserialize)]
//! struct Click { page: String }
//!
//! #[derive(Serialize)]
//! struct PageCount { page: String, clicks: u64 }
//!
//! #[derive(Default)]
//! struct ClicksPerPage;
//!
//! impl Aggregate for ClicksPerPage {
//!     type Event<'a> = Click;
//!     type Key = String;
//!     type State = u64;
//!     type Output = PageCount;
//!     const OUTPUT: &'static str = "counts";
//!
//!     fn key(&self, click: &Click) -> Result<String, Reject> {
//!         Ok(click.page.clone())
//!     }
//!     fn apply(&self, _page: &String, clicks: &u64, _click: Click) -> Result<u64, Reject> {
//!         Ok(clicks + 1)
//!     }
//!     fn emit(&self, page: &String, clicks: &u64) -> Option<PageCount> {
//!         Some(PageCount { page: page.clone(), clicks: *clicks })
//!     }
//! }
//!
//! tally_sdk::export!(ClicksPerPage);
//! ```
//!
//! Build it with `tally plugin build <crate dir>`; test it with the
//! test driver (`tally_testing::PluginTest`, crate `tally-testing`) from an ordinary
//! `cargo test`.
//!
//! Events arrive as JSON (each record's value is decoded into
//! [`Aggregate::Event`]); keys, state and outputs are stored and emitted as
//! JSON. An event that does not decode, or that [`Aggregate::key`] or
//! [`Aggregate::apply`] rejects, goes to the job's dead-letter output with
//! the reason, and changes nothing. A batch of N events costs three host
//! calls: one `get-many`, one `put-many`, one `emit-many`.
//!
//! For full control (raw bytes, several outputs, deletes) implement
//! [`Plugin`] instead of [`Aggregate`].

mod aggregate;
pub mod periods;
mod types;

#[doc(hidden)]
pub mod bindings;

pub use aggregate::{Aggregate, Reject, run_aggregate};
pub use periods::{EventTime, Facts, Instant, Periods};
pub use types::{Event, Host, Level, OutputRecord, Plugin, Rejection};

/// Exports a [`Plugin`] (or an [`Aggregate`]) as this component's entry point.
///
/// The type must implement [`Default`]; a fresh value handles each batch.
/// Use it once per plugin crate, at the top level. It exports nothing when
/// the crate is compiled natively (for tests and benchmarks).
#[macro_export]
macro_rules! export {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct TallyPluginExport;

            impl $crate::bindings::Guest for TallyPluginExport {
                fn process(
                    events: ::std::vec::Vec<$crate::bindings::WitEvent>,
                ) -> ::std::vec::Vec<$crate::bindings::WitRejection> {
                    $crate::bindings::process::<$plugin>(events)
                }
            }

            $crate::bindings::export_plugin!(TallyPluginExport with_types_in $crate::bindings::generated);
        };
    };
}

/// Exports a [`Periods`] implementation as this component's period plugin
/// (`tally:plugin@0.2.0`): configured once per instance with the job's
/// `[plugin_config]`, then called by the host's period rules. Use it once
/// per plugin crate, at the top level; it exports nothing natively.
#[macro_export]
macro_rules! export_periods {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            static PLUGIN: ::std::sync::OnceLock<$plugin> = ::std::sync::OnceLock::new();

            fn plugin() -> &'static $plugin {
                PLUGIN.get().expect("the host configures a period plugin before calling it")
            }

            struct TallyPeriodsExport;

            impl $crate::bindings::ConfigGuest for TallyPeriodsExport {
                fn configure(config: ::std::string::String) -> ::std::result::Result<(), ::std::string::String> {
                    $crate::bindings::install_periods_panic_hook();
                    let configured = $crate::periods::configure::<$plugin>(&config)?;
                    // One configuration per instance: a second call changes nothing.
                    let _ = PLUGIN.set(configured);
                    Ok(())
                }
            }

            impl $crate::bindings::PeriodsGuest for TallyPeriodsExport {
                fn describe(
                    events: ::std::vec::Vec<$crate::bindings::WitPeriodEvent>,
                ) -> ::std::vec::Vec<::std::result::Result<$crate::bindings::WitFacts, ::std::string::String>> {
                    $crate::bindings::describe_all(plugin(), events)
                }

                fn add(
                    states: ::std::vec::Vec<::std::option::Option<::std::vec::Vec<u8>>>,
                    addends: ::std::vec::Vec<::std::vec::Vec<u8>>,
                    additions: ::std::vec::Vec<$crate::bindings::WitAddition>,
                ) -> ::std::result::Result<::std::vec::Vec<::std::vec::Vec<u8>>, $crate::bindings::WitRefusal> {
                    $crate::bindings::add_all(plugin(), states, addends, additions)
                }

                fn value(state: ::std::vec::Vec<u8>) -> u64 {
                    $crate::bindings::install_periods_panic_hook();
                    $crate::periods::value(plugin(), &state)
                }
            }

            $crate::bindings::export_periods_plugin!(TallyPeriodsExport with_types_in $crate::bindings::periods_generated);
        };
    };
}
