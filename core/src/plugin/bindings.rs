//! The generated host bindings of `tally:plugin@0.1.0` (process plugins)
//! and `tally:plugin@0.2.0` (period plugins, in [`periods`]). Only this
//! module sees `bindgen!` output; the rest of the host uses what it
//! re-exports.

wasmtime::component::bindgen!({
    path: "../wit/tally-plugin@0.1.0",
    world: "plugin",
    imports: { default: trappable },
});

pub use Plugin as PluginWorld;
pub use PluginPre as PluginWorldPre;
pub use tally::plugin::types::{Event, Level, OutputRecord, Rejection};
pub use tally::plugin::{log, output, state, types};

/// The WIT package version of process plugins this host links.
pub const WIT_VERSION: &str = "0.1.0";
/// The WIT package version of period plugins this host links.
pub const PERIODS_WIT_VERSION: &str = "0.2.0";
/// The WIT package name.
pub const WIT_PACKAGE: &str = "tally:plugin";

/// The bindings of `tally:plugin@0.2.0`, the period plugins' contract.
pub mod periods {
    wasmtime::component::bindgen!({
        path: "../wit/tally-plugin@0.2.0",
        world: "periods-plugin",
        imports: { default: trappable },
    });

    pub use PeriodsPlugin as PeriodsWorld;
    pub use PeriodsPluginPre as PeriodsWorldPre;
    pub use exports::tally::plugin::periods::{Addition, Refusal};
    pub use tally::plugin::types::{Event, EventFacts, EventTime, Instant, Level};
    pub use tally::plugin::{log, types};
}
