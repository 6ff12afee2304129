//! The delivery ledger: the delivery's position in the output and, per
//! record (by idempotency key), its attempts, their times and its last
//! outcome, in a RocksDB database of its own. Writes go through RocksDB's
//! log without a sync each (a killed process loses none of them);
//! [`Ledger::sync`] makes them durable against power loss, at each
//! position advance. A lost entry only means a record is sent again, with
//! the same key and body.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Key of the delivery's position (the offset before which every record
/// is settled).
const POSITION_KEY: &[u8] = b"position";
/// Key prefix of the records' entries.
const ENTRY_PREFIX: &[u8] = b"entry/";
/// Key of the running deliverer's statistics.
const STATS_KEY: &[u8] = b"stats";

/// A record's last outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// A request is (or was, when the deliverer stopped) in flight.
    Sending,
    /// The last request failed in a way worth retrying.
    Retrying,
    /// The receiver applied it.
    Delivered,
    /// It may have been applied and the receiver no longer remembers its
    /// key: it waits for a lookup or an operator, and is not re-sent.
    Unknown,
    /// The receiver refused it for good: a dead letter.
    Failed,
}

/// What the ledger knows of one record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Its offset in the output.
    pub offset: u64,
    /// SHA-256 of the body first sent with its key (hex): a key is never
    /// sent with another body.
    pub body_sha256: String,
    /// Requests sent for it.
    pub attempts: u64,
    /// When the first request was sent (Unix milliseconds).
    pub first_attempt_ms: i64,
    /// When the last request was sent.
    pub last_attempt_ms: i64,
    /// Since when the receiver may have applied it without saying so (the
    /// first request since the last "never applied" that may have reached
    /// it); `key_retention` counts from here.
    #[serde(default)]
    pub maybe_applied_since_ms: Option<i64>,
    /// Its last outcome.
    pub outcome: Outcome,
    /// What the last attempt said, when it was not a delivery.
    #[serde(default)]
    pub last_error: Option<String>,
}

impl Entry {
    /// The entry of a record never sent, whose body has digest `body_sha256`.
    pub fn unsent(offset: u64, body_sha256: String) -> Entry {
        Entry {
            offset,
            body_sha256,
            attempts: 0,
            first_attempt_ms: 0,
            last_attempt_ms: 0,
            maybe_applied_since_ms: None,
            outcome: Outcome::Sending,
            last_error: None,
        }
    }

    /// Records a request about to go out at `now_ms`: from here on the
    /// receiver may have applied it.
    pub fn attempting(&mut self, now_ms: i64) {
        self.attempts += 1;
        if self.first_attempt_ms == 0 {
            self.first_attempt_ms = now_ms;
        }
        self.last_attempt_ms = now_ms;
        self.maybe_applied_since_ms.get_or_insert(now_ms);
        self.outcome = Outcome::Sending;
    }
}

/// A running deliverer's counters, as it last wrote them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// When they were written (Unix milliseconds).
    pub at_ms: i64,
    /// Median time from a record's first request to its delivery (ms).
    pub latency_p50_ms: u64,
    /// 99th percentile of the same.
    pub latency_p99_ms: u64,
    /// Records the deliverer has read and not yet settled.
    pub pending: u64,
}

/// A failure of the ledger's database.
#[derive(Debug, thiserror::Error)]
#[error("delivery ledger `{}`: {reason}", path.display())]
pub struct LedgerError {
    path: PathBuf,
    reason: String,
}

impl LedgerError {
    /// A failure of the ledger at `path`.
    pub(crate) fn new(path: &Path, reason: String) -> LedgerError {
        LedgerError { path: path.to_path_buf(), reason }
    }
}

/// The delivery ledger.
pub struct Ledger {
    db: rocksdb::DB,
    path: PathBuf,
}

impl Ledger {
    /// Opens (creating if needed) the ledger in directory `path`.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        let db = rocksdb::DB::open(&options, path).map_err(|err| error(path, err))?;
        Ok(Ledger { db, path: path.to_path_buf() })
    }

    /// A read-only view of the ledger a running deliverer owns, caught up
    /// to now (its own files in `view_dir`).
    pub fn view(path: &Path, view_dir: &Path) -> Result<Ledger, LedgerError> {
        if !path.join("CURRENT").exists() {
            return Err(LedgerError {
                path: path.to_path_buf(),
                reason: "there is no ledger here: this delivery has not run yet".into(),
            });
        }
        let options = rocksdb::Options::default();
        let db = rocksdb::DB::open_as_secondary(&options, path, view_dir)
            .map_err(|err| error(path, err))?;
        db.try_catch_up_with_primary().map_err(|err| error(path, err))?;
        Ok(Ledger { db, path: path.to_path_buf() })
    }

    /// The position: every record before it is settled.
    pub fn position(&self) -> Result<u64, LedgerError> {
        let value = self.db.get(POSITION_KEY).map_err(|err| error(&self.path, err))?;
        match value {
            None => Ok(0),
            Some(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or_else(|| self.damaged("position")),
        }
    }

    /// Records `position`, and makes every write so far durable.
    pub fn set_position(&self, position: u64) -> Result<(), LedgerError> {
        self.db.put(POSITION_KEY, position.to_string()).map_err(|err| error(&self.path, err))?;
        self.sync()
    }

    /// Makes every write so far durable.
    pub fn sync(&self) -> Result<(), LedgerError> {
        self.db.flush_wal(true).map_err(|err| error(&self.path, err))
    }

    /// The entry of idempotency key `key`.
    pub fn entry(&self, key: &str) -> Result<Option<Entry>, LedgerError> {
        let value = self.db.get(entry_key(key)).map_err(|err| error(&self.path, err))?;
        value.map(|bytes| serde_json::from_slice(&bytes).map_err(|_| self.damaged(key))).transpose()
    }

    /// Writes `key`'s entry.
    pub fn put(&self, key: &str, entry: &Entry) -> Result<(), LedgerError> {
        let value = serde_json::to_vec(entry).expect("entries serialize");
        self.db.put(entry_key(key), value).map_err(|err| error(&self.path, err))
    }

    /// Writes many entries in one write.
    pub fn put_many(&self, entries: &[(String, Entry)]) -> Result<(), LedgerError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut batch = rocksdb::WriteBatch::default();
        for (key, entry) in entries {
            batch.put(entry_key(key), serde_json::to_vec(entry).expect("entries serialize"));
        }
        self.db.write(batch).map_err(|err| error(&self.path, err))
    }

    /// Every entry, in key order.
    pub fn entries(&self) -> Result<Vec<(String, Entry)>, LedgerError> {
        let mut entries = Vec::new();
        for item in self.db.prefix_iterator(ENTRY_PREFIX) {
            let (key, value) = item.map_err(|err| error(&self.path, err))?;
            if !key.starts_with(ENTRY_PREFIX) {
                break;
            }
            let key = String::from_utf8_lossy(&key[ENTRY_PREFIX.len()..]).into_owned();
            let entry = serde_json::from_slice(&value).map_err(|_| self.damaged(&key))?;
            entries.push((key, entry));
        }
        Ok(entries)
    }

    /// The running deliverer's last counters.
    pub fn stats(&self) -> Result<Option<Stats>, LedgerError> {
        let value = self.db.get(STATS_KEY).map_err(|err| error(&self.path, err))?;
        Ok(value.and_then(|bytes| serde_json::from_slice(&bytes).ok()))
    }

    /// Writes the running deliverer's counters.
    pub fn put_stats(&self, stats: &Stats) -> Result<(), LedgerError> {
        let value = serde_json::to_vec(stats).expect("stats serialize");
        self.db.put(STATS_KEY, value).map_err(|err| error(&self.path, err))
    }

    fn damaged(&self, what: &str) -> LedgerError {
        LedgerError {
            path: self.path.clone(),
            reason: format!(
                "its entry for {what:?} is damaged; restore the state directory or start a new one"
            ),
        }
    }
}

fn entry_key(key: &str) -> Vec<u8> {
    [ENTRY_PREFIX, key.as_bytes()].concat()
}

fn error(path: &Path, err: rocksdb::Error) -> LedgerError {
    LedgerError { path: path.to_path_buf(), reason: err.into_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_the_position_survive_a_reopen_and_show_in_a_view() {
        let dir = tempfile::tempdir().unwrap();
        let entry = Entry {
            offset: 12,
            body_sha256: "ab".into(),
            attempts: 2,
            first_attempt_ms: 1,
            last_attempt_ms: 2,
            maybe_applied_since_ms: Some(1),
            outcome: Outcome::Unknown,
            last_error: Some("no answer".into()),
        };
        {
            let ledger = Ledger::open(&dir.path().join("ledger")).unwrap();
            assert_eq!(ledger.position().unwrap(), 0);
            ledger.put("billing/a/v1", &entry).unwrap();
            ledger.set_position(40).unwrap();
            let view = Ledger::view(&dir.path().join("ledger"), &dir.path().join("view")).unwrap();
            assert_eq!(view.entries().unwrap(), vec![("billing/a/v1".to_string(), entry.clone())]);
        }
        let ledger = Ledger::open(&dir.path().join("ledger")).unwrap();
        assert_eq!(ledger.position().unwrap(), 40);
        assert_eq!(ledger.entry("billing/a/v1").unwrap(), Some(entry));
        assert_eq!(ledger.entry("billing/b/v1").unwrap(), None);
    }
}
