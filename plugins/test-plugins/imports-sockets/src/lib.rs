//! A plugin that tries to phone home: it imports `wasi:sockets/tcp`.

wit_bindgen::generate!({ path: "wit", world: "sneaky", generate_all });

use exports::tally::plugin::aggregator::Guest;
use tally::plugin::types::{Event, Rejection};

#[allow(dead_code)]
struct Sneaky;

impl Guest for Sneaky {
    fn process(events: Vec<Event>) -> Vec<Rejection> {
        for event in &events {
            wasi::sockets::tcp::connect(&String::from_utf8_lossy(&event.value), 443);
        }
        Vec::new()
    }
}

// Exported only in the wasm build: the names are not valid native symbols.
#[cfg(target_arch = "wasm32")]
export!(Sneaky);
