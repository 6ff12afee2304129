/* Rust's Debug escaping of characters, for the configuration's messages
 * (`meters.x = "…"`), which quote a string as Rust's `{:?}` does. */
#ifndef BILLING_UNICODE_H
#define BILLING_UNICODE_H

#include <stdbool.h>
#include <stdint.h>

/** Whether Rust's `{:?}` of a string writes `c` as `\u{...}` (controls,
 * DEL, non-printable and grapheme-extending characters). */
bool rust_debug_escapes(uint32_t c);

#endif
