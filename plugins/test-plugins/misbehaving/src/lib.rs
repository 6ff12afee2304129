//! Counts events per key `k` into output `counts`, unless the event's `do`
//! asks it to misbehave: `panic`, `spin` (loop forever), `hog` (allocate
//! until memory runs out) or `reject`.

use std::hint::black_box;

use serde::Deserialize;
use tally_sdk::{Aggregate, Reject};

#[derive(Deserialize)]
pub struct Command {
    k: String,
    #[serde(default, rename = "do")]
    action: String,
}

#[derive(Default)]
pub struct Misbehaving;

impl Aggregate for Misbehaving {
    type Event<'a> = Command;
    type Key = String;
    type State = u64;
    type Output = u64;
    const OUTPUT: &'static str = "counts";

    fn key(&self, command: &Command) -> Result<String, Reject> {
        Ok(command.k.clone())
    }

    fn apply(&self, key: &String, count: &u64, command: Command) -> Result<u64, Reject> {
        match command.action.as_str() {
            "panic" => panic!("asked to panic on key {key}"),
            "spin" => {
                let mut spins = 0u64;
                loop {
                    spins = black_box(spins.wrapping_add(1));
                }
            }
            "hog" => {
                let mut hog: Vec<Vec<u8>> = Vec::new();
                loop {
                    hog.push(black_box(vec![1u8; 1 << 20]));
                }
            }
            "reject" => Err(Reject::new("asked to reject")),
            _ => Ok(count + 1),
        }
    }

    fn emit(&self, _key: &String, count: &u64) -> Option<u64> {
        Some(*count)
    }
}

tally_sdk::export!(Misbehaving);
