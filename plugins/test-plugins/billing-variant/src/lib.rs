//! The usage-billing plugin's own source, compiled as another crate: a
//! second build whose component bytes (and so digest) differ while every
//! total is the same. Hot-swap tests alternate the two.

#[path = "../../../usage-billing/src/lib.rs"]
mod billing;

/// Makes this build's bytes differ from usage-billing's for certain.
#[used]
static VARIANT: [u8; 24] = *b"tally billing variant v2";
