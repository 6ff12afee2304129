//! A broken billing version: it panics (traps) on the first event of every
//! batch, as a bad release might. Pushed into a running job, it must be
//! rolled back with nothing of its work committed.

use serde::Deserialize;
use tally_sdk::{Aggregate, Reject};

/// Any JSON object.
#[derive(Deserialize)]
pub struct Anything {}

/// Traps on every event.
#[derive(Default)]
pub struct BrokenBilling;

impl Aggregate for BrokenBilling {
    type Event<'a> = Anything;
    type Key = String;
    type State = u64;
    type Output = u64;
    const OUTPUT: &'static str = "totals";

    fn key(&self, _event: &Anything) -> Result<String, Reject> {
        panic!("billing v3 regression: the period table is empty");
    }

    fn apply(&self, _key: &String, total: &u64, _event: Anything) -> Result<u64, Reject> {
        Ok(*total)
    }

    fn emit(&self, _key: &String, total: &u64) -> Option<u64> {
        Some(*total)
    }
}

tally_sdk::export!(BrokenBilling);
