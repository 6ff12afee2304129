//! The generated host bindings of `tally:plugin@0.1.0`. Only this module
//! sees `bindgen!` output; the rest of the host uses what it re-exports.

wasmtime::component::bindgen!({
    path: "../wit/tally-plugin@0.1.0",
    world: "plugin",
    imports: { default: trappable },
});

pub use Plugin as PluginWorld;
pub use PluginPre as PluginWorldPre;
pub use tally::plugin::types::{Event, Level, OutputRecord, Rejection};
pub use tally::plugin::{log, output, state, types};

/// The WIT package version this host links.
pub const WIT_VERSION: &str = "0.1.0";
/// The WIT package name.
pub const WIT_PACKAGE: &str = "tally:plugin";
