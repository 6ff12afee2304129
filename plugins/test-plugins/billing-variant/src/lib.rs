//! The usage-billing plugin's own source, compiled as another crate: a
//! second build whose component bytes (and so digest) differ while every
//! total is the same. Hot-swap tests alternate the two.

// Off wasm32 (the crate's own `cargo test`), `export!`, the only user of
// the plugin's types, expands to nothing.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
#[path = "../../../usage-billing/src/lib.rs"]
mod billing;

/// Makes this build's bytes differ from usage-billing's for certain.
#[used]
static VARIANT: [u8; 24] = *b"tally billing variant v2";
