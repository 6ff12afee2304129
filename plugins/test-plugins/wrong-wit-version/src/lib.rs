//! A plugin built for `tally:plugin@0.2.0`.

wit_bindgen::generate!({ path: "wit", world: "plugin" });

#[allow(dead_code)]
struct Future;

impl exports::tally::plugin::aggregator::Guest for Future {
    fn process(events: Vec<Vec<u8>>) -> u32 {
        events.len() as u32
    }
}

// Exported only in the wasm build: the names are not valid native symbols.
#[cfg(target_arch = "wasm32")]
export!(Future);
