//! What a delivery has done, from its ledger (read through a view, so a
//! running deliverer is not disturbed): records per outcome, the oldest
//! one not yet settled, the latencies, and the records waiting as
//! `unknown` for an operator.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ledger::{Entry, Ledger, LedgerError, Outcome, Stats};

/// A delivery's status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Per output partition (0 for a local output), the offset before
    /// which every record is settled.
    pub positions: crate::source::Positions,
    /// Records the receiver applied.
    pub delivered: u64,
    /// Records whose last request failed, to be retried (or in flight).
    pub retrying: u64,
    /// Records that may have been applied after the receiver forgot their
    /// key: they wait for a lookup or an operator.
    pub unknown: u64,
    /// Records refused for good: in the dead letters.
    pub failed: u64,
    /// Age of the oldest record sent and not settled, in seconds.
    pub oldest_unsettled_age_s: Option<u64>,
    /// The running deliverer's last counters.
    pub stats: Option<Stats>,
}

/// A record waiting as `unknown`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnknownRecord {
    /// Its idempotency key.
    pub key: String,
    /// What the ledger knows of it.
    #[serde(flatten)]
    pub entry: Entry,
}

/// Reads the status of the delivery whose state is in `state_dir`.
pub fn status(state_dir: &Path) -> Result<(Status, Vec<UnknownRecord>), LedgerError> {
    let view_dir = tempfile_dir(state_dir)?;
    let ledger = Ledger::view(&state_dir.join("ledger"), view_dir.path())?;
    let pruned = ledger.pruned()?;
    let mut status = Status {
        positions: ledger.positions()?,
        stats: ledger.stats()?,
        delivered: pruned.delivered,
        failed: pruned.failed,
        ..Status::default()
    };
    let mut unknown = Vec::new();
    let now = crate::deliverer::now_ms();
    let mut oldest: Option<i64> = None;
    for (key, entry) in ledger.entries()? {
        match entry.outcome {
            Outcome::Delivered => status.delivered += 1,
            Outcome::Failed => status.failed += 1,
            Outcome::Sending | Outcome::Retrying => status.retrying += 1,
            Outcome::Unknown => status.unknown += 1,
        }
        if matches!(entry.outcome, Outcome::Sending | Outcome::Retrying | Outcome::Unknown) {
            oldest =
                Some(oldest.map_or(entry.first_attempt_ms, |at| at.min(entry.first_attempt_ms)));
        }
        if entry.outcome == Outcome::Unknown {
            unknown.push(UnknownRecord { key, entry });
        }
    }
    status.oldest_unsettled_age_s = oldest.map(|at| ((now - at).max(0) / 1000) as u64);
    Ok((status, unknown))
}

/// A fresh directory for a view's own files, removed when dropped.
fn tempfile_dir(state_dir: &Path) -> Result<tempfile::TempDir, LedgerError> {
    tempfile::Builder::new()
        .prefix("ledger-view-")
        .tempdir_in(state_dir)
        .map_err(|err| LedgerError::new(state_dir, err.to_string()))
}
