//! An operator's verdict on a record waiting as `unknown`, after checking
//! the receiver: `applied` (it is delivered) or `not_applied` (send it
//! again). `tally deliver resolve` drops the verdict in the delivery's
//! inbox (`<state_dir>/resolve/`); the deliverer applies it to the ledger
//! within a poll, or when it next starts, and then removes it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ledger::{Ledger, LedgerError, Outcome};

/// What the operator found at the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The receiver applied the record: it is delivered.
    Applied,
    /// The receiver never applied it: it is sent again.
    NotApplied,
}

/// A verdict on one record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    /// The record's idempotency key.
    pub key: String,
    /// What the operator found.
    pub verdict: Verdict,
}

/// The inbox of verdicts of a delivery.
pub struct Inbox {
    dir: PathBuf,
}

impl Inbox {
    /// The inbox of the delivery whose state is in `state_dir`.
    pub fn new(state_dir: &Path) -> Inbox {
        Inbox { dir: state_dir.join("resolve") }
    }

    /// Leaves `resolution` for the deliverer.
    pub fn put(&self, resolution: &Resolution) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        let name: String =
            Sha256::digest(resolution.key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        let path = self.dir.join(format!("{name}.json"));
        let temporary = self.dir.join(format!("{name}.tmp"));
        std::fs::write(&temporary, serde_json::to_vec(resolution).expect("verdicts serialize"))?;
        std::fs::rename(&temporary, &path)?;
        Ok(path)
    }

    /// The verdicts waiting, each with its file.
    pub fn waiting(&self) -> Result<Vec<(PathBuf, Resolution)>, LedgerError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(LedgerError::new(&self.dir, err.to_string())),
        };
        let mut waiting = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|extension| extension != "json") {
                continue;
            }
            match std::fs::read(&path).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok()) {
                Some(resolution) => waiting.push((path, resolution)),
                None => {
                    tracing::warn!(path = %path.display(), "a verdict in the inbox is not readable; it is ignored");
                }
            }
        }
        Ok(waiting)
    }

    /// Removes an applied verdict's file.
    pub fn done(&self, path: &Path) {
        let _ = std::fs::remove_file(path);
    }
}

/// Applies `resolution` to the ledger: the record's new outcome, or
/// `None` when no record with its key waits as `unknown` (or retrying).
pub fn apply(ledger: &Ledger, resolution: &Resolution) -> Result<Option<Outcome>, LedgerError> {
    let Some(mut entry) = ledger.entry(&resolution.key)? else {
        tracing::warn!(key = %resolution.key, "a verdict names no record this delivery has sent; it is ignored");
        return Ok(None);
    };
    if !matches!(entry.outcome, Outcome::Unknown | Outcome::Retrying | Outcome::Sending) {
        tracing::warn!(key = %resolution.key, outcome = ?entry.outcome, "a verdict names a settled record; it is ignored");
        return Ok(None);
    }
    match resolution.verdict {
        Verdict::Applied => {
            entry.outcome = Outcome::Delivered;
            entry.last_error = Some("resolved by an operator: applied".into());
        }
        Verdict::NotApplied => {
            entry.outcome = Outcome::Retrying;
            entry.maybe_applied_since_ms = None;
            entry.last_error = Some("resolved by an operator: not applied; sent again".into());
        }
    }
    ledger.put(&resolution.key, &entry)?;
    Ok(Some(entry.outcome))
}
