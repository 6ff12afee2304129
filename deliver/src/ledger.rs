//! The delivery ledger: the delivery's position in the output and, per
//! record (by idempotency key), its attempts, their times and its last
//! outcome, in a RocksDB database of its own. Writes go through RocksDB's
//! log without a sync each (a killed process loses none of them);
//! [`Ledger::sync`] makes them durable against power loss, at each
//! position advance. A lost entry only means a record is sent again, with
//! the same key and body.
//!
//! A delivery of a Kafka job mirrors its ledger into a compacted topic
//! (a [`Mirror`], given by the host): a new ledger starts from the
//! mirror, so a deliverer on a new machine resumes where the last one
//! stopped; an attempt is in the mirror before its request goes out.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::source::Positions;

/// Key of the delivery's positions (per partition, the offset before
/// which every record is settled).
const POSITIONS_KEY: &[u8] = b"positions";
/// Key prefix of the records' entries.
const ENTRY_PREFIX: &[u8] = b"entry/";
/// Key of the running deliverer's statistics.
const STATS_KEY: &[u8] = b"stats";
/// The key of the counts of pruned entries.
const PRUNED_KEY: &[u8] = b"pruned";

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
    /// Its partition in the output (0 for a local output).
    #[serde(default)]
    pub partition: u32,
    /// Its offset in the partition.
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
    pub fn unsent(partition: u32, offset: u64, body_sha256: String) -> Entry {
        Entry {
            partition,
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

/// Settled entries removed from the ledger, by outcome: the status
/// still counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pruned {
    /// Delivered records whose entries were removed.
    pub delivered: u64,
    /// Dead-lettered records whose entries were removed (their dead
    /// letters stay).
    pub failed: u64,
}

/// A key and its value, as the ledger stores them.
pub type Write = (Vec<u8>, Vec<u8>);

/// A durable copy of a ledger's writes elsewhere (a compacted Kafka
/// topic), from which a new ledger starts.
pub trait Mirror: Send + Sync {
    /// Sends one write: the value of `key` now.
    fn send(&self, key: &[u8], value: &[u8]) -> Result<(), String>;
    /// Sends the removal of `key` (a tombstone).
    fn delete(&self, key: &[u8]) -> Result<(), String>;
    /// Waits until every write sent is stored.
    fn flush(&self) -> Result<(), String>;
    /// Every key's last value the mirror holds.
    fn load(&self) -> Result<Vec<Write>, String>;
    /// Where it is, for messages.
    fn describe(&self) -> String;
}

/// The delivery ledger.
pub struct Ledger {
    db: rocksdb::DB,
    path: PathBuf,
    mirror: Option<Arc<dyn Mirror>>,
}

impl Ledger {
    /// Opens (creating if needed) the ledger in directory `path`.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        let db = rocksdb::DB::open(&options, path).map_err(|err| error(path, err))?;
        Ok(Ledger { db, path: path.to_path_buf(), mirror: None })
    }

    /// Opens the ledger in `path`, its writes mirrored to `mirror`; a
    /// ledger that holds nothing yet first takes everything the mirror
    /// holds (a deliverer on a new machine).
    pub fn open_mirrored(path: &Path, mirror: Arc<dyn Mirror>) -> Result<Ledger, LedgerError> {
        let mut ledger = Ledger::open(path)?;
        let positioned = ledger.db.get(POSITIONS_KEY).map_err(|err| error(path, err))?.is_some();
        let has_entries = ledger
            .db
            .prefix_iterator(ENTRY_PREFIX)
            .next()
            .transpose()
            .map_err(|err| error(path, err))?
            .is_some_and(|(key, _)| key.starts_with(ENTRY_PREFIX));
        if !positioned && !has_entries {
            let held = mirror.load().map_err(|reason| {
                LedgerError::new(
                    path,
                    format!("cannot read its mirror {}: {reason}", mirror.describe()),
                )
            })?;
            if !held.is_empty() {
                tracing::info!(records = held.len(), mirror = %mirror.describe(), "a new ledger starts from its mirror");
            }
            let mut batch = rocksdb::WriteBatch::default();
            for (key, value) in held {
                if key == POSITIONS_KEY || key == PRUNED_KEY || key.starts_with(ENTRY_PREFIX) {
                    batch.put(key, value);
                }
            }
            ledger.db.write(batch).map_err(|err| error(path, err))?;
            ledger.sync()?;
        }
        ledger.mirror = Some(mirror);
        Ok(ledger)
    }

    /// Sends a write to the mirror, if there is one.
    fn mirror(&self, key: &[u8], value: &[u8]) -> Result<(), LedgerError> {
        match &self.mirror {
            None => Ok(()),
            Some(mirror) => mirror
                .send(key, value)
                .map_err(|reason| self.mirror_failed(mirror.as_ref(), reason)),
        }
    }

    /// Waits until the mirror, if there is one, holds every write so far:
    /// before a request goes out, its attempt is there.
    pub fn mirror_flush(&self) -> Result<(), LedgerError> {
        match &self.mirror {
            None => Ok(()),
            Some(mirror) => {
                mirror.flush().map_err(|reason| self.mirror_failed(mirror.as_ref(), reason))
            }
        }
    }

    fn mirror_failed(&self, mirror: &dyn Mirror, reason: String) -> LedgerError {
        LedgerError::new(
            &self.path,
            format!(
                "cannot write its mirror {}: {reason}; the deliverer stops (start it again once the cluster is reachable)",
                mirror.describe()
            ),
        )
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
        Ok(Ledger { db, path: path.to_path_buf(), mirror: None })
    }

    /// The positions: in each partition, every record before its
    /// position is settled.
    pub fn positions(&self) -> Result<Positions, LedgerError> {
        let value = self.db.get(POSITIONS_KEY).map_err(|err| error(&self.path, err))?;
        match value {
            None => Ok(Positions::new()),
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|_| self.damaged("positions")),
        }
    }

    /// Records `positions`, and makes every write so far durable (in the
    /// mirror too).
    pub fn set_positions(&self, positions: &Positions) -> Result<(), LedgerError> {
        let value = serde_json::to_vec(positions).expect("positions serialize");
        self.db.put(POSITIONS_KEY, &value).map_err(|err| error(&self.path, err))?;
        self.mirror(POSITIONS_KEY, &value)?;
        self.sync()?;
        self.mirror_flush()
    }

    /// A failure of this ledger, for `reason`.
    pub(crate) fn failed(&self, reason: String) -> LedgerError {
        LedgerError::new(&self.path, reason)
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
        let key = entry_key(key);
        self.db.put(&key, &value).map_err(|err| error(&self.path, err))?;
        self.mirror(&key, &value)
    }

    /// Writes many entries in one write.
    pub fn put_many(&self, entries: &[(String, Entry)]) -> Result<(), LedgerError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut batch = rocksdb::WriteBatch::default();
        let mut writes = Vec::with_capacity(entries.len());
        for (key, entry) in entries {
            let write = (entry_key(key), serde_json::to_vec(entry).expect("entries serialize"));
            batch.put(&write.0, &write.1);
            writes.push(write);
        }
        self.db.write(batch).map_err(|err| error(&self.path, err))?;
        for (key, value) in &writes {
            self.mirror(key, value)?;
        }
        Ok(())
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

    /// The counts of pruned entries.
    pub fn pruned(&self) -> Result<Pruned, LedgerError> {
        let value = self.db.get(PRUNED_KEY).map_err(|err| error(&self.path, err))?;
        match value {
            None => Ok(Pruned::default()),
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|_| self.damaged("pruned")),
        }
    }

    /// Removes the entries of records settled (delivered or dead-lettered)
    /// before `positions` — so never read again — whose last request was
    /// before `before_ms`, counting them in [`Ledger::pruned`]; the mirror
    /// gets a tombstone for each. Returns how many were removed.
    pub fn prune(&self, positions: &Positions, before_ms: i64) -> Result<u64, LedgerError> {
        let mut pruned = self.pruned()?;
        let mut removed = Vec::new();
        for item in self.db.prefix_iterator(ENTRY_PREFIX) {
            let (key, value) = item.map_err(|err| error(&self.path, err))?;
            if !key.starts_with(ENTRY_PREFIX) {
                break;
            }
            let Ok(entry) = serde_json::from_slice::<Entry>(&value) else { continue };
            let passed = positions.get(&entry.partition).is_some_and(|&at| entry.offset < at);
            if !passed || entry.last_attempt_ms >= before_ms {
                continue;
            }
            match entry.outcome {
                Outcome::Delivered => pruned.delivered += 1,
                Outcome::Failed => pruned.failed += 1,
                Outcome::Sending | Outcome::Retrying | Outcome::Unknown => continue,
            }
            removed.push(key.to_vec());
        }
        if removed.is_empty() {
            return Ok(0);
        }
        // The counts and the removals in one write: a crash loses neither half.
        let counts = serde_json::to_vec(&pruned).expect("counts serialize");
        let mut batch = rocksdb::WriteBatch::default();
        batch.put(PRUNED_KEY, &counts);
        for key in &removed {
            batch.delete(key);
        }
        self.db.write(batch).map_err(|err| error(&self.path, err))?;
        if let Some(mirror) = &self.mirror {
            let failed = |reason| self.mirror_failed(mirror.as_ref(), reason);
            mirror.send(PRUNED_KEY, &counts).map_err(failed)?;
            for key in &removed {
                mirror.delete(key).map_err(failed)?;
            }
        }
        self.sync()?;
        self.mirror_flush()?;
        Ok(removed.len() as u64)
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
            partition: 1,
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
            assert_eq!(ledger.positions().unwrap(), Positions::new());
            ledger.put("billing/a/v1", &entry).unwrap();
            ledger.set_positions(&[(0, 40), (1, 7)].into()).unwrap();
            let view = Ledger::view(&dir.path().join("ledger"), &dir.path().join("view")).unwrap();
            assert_eq!(view.entries().unwrap(), vec![("billing/a/v1".to_string(), entry.clone())]);
        }
        let ledger = Ledger::open(&dir.path().join("ledger")).unwrap();
        assert_eq!(ledger.positions().unwrap(), [(0, 40), (1, 7)].into());
        assert_eq!(ledger.entry("billing/a/v1").unwrap(), Some(entry));
        assert_eq!(ledger.entry("billing/b/v1").unwrap(), None);
    }

    /// A mirror in memory, as the compacted topic keeps it: each key's
    /// last value.
    #[derive(Default)]
    struct Memory(std::sync::Mutex<std::collections::BTreeMap<Vec<u8>, Vec<u8>>>);

    impl Mirror for Memory {
        fn send(&self, key: &[u8], value: &[u8]) -> Result<(), String> {
            self.0.lock().unwrap().insert(key.to_vec(), value.to_vec());
            Ok(())
        }
        fn delete(&self, key: &[u8]) -> Result<(), String> {
            self.0.lock().unwrap().remove(key);
            Ok(())
        }
        fn flush(&self) -> Result<(), String> {
            Ok(())
        }
        fn load(&self) -> Result<Vec<Write>, String> {
            Ok(self.0.lock().unwrap().clone().into_iter().collect())
        }
        fn describe(&self) -> String {
            "memory".into()
        }
    }

    #[test]
    fn only_settled_entries_the_position_passed_are_pruned_and_still_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mirror = Arc::new(Memory::default());
        let ledger = Ledger::open_mirrored(&dir.path().join("a"), mirror.clone()).unwrap();
        let entry = |offset: u64, outcome: Outcome, last_attempt_ms: i64| Entry {
            outcome,
            last_attempt_ms,
            ..Entry::unsent(0, offset, "ab".into())
        };
        ledger.put("old-delivered", &entry(1, Outcome::Delivered, 100)).unwrap();
        ledger.put("old-failed", &entry(2, Outcome::Failed, 100)).unwrap();
        ledger.put("old-unknown", &entry(3, Outcome::Unknown, 100)).unwrap();
        ledger.put("recent", &entry(4, Outcome::Delivered, 900)).unwrap();
        ledger.put("past-the-position", &entry(10, Outcome::Delivered, 100)).unwrap();
        let positions: Positions = [(0, 10)].into();
        assert_eq!(ledger.prune(&positions, 500).unwrap(), 2);
        let left: Vec<String> = ledger.entries().unwrap().into_iter().map(|(k, _)| k).collect();
        assert_eq!(left, ["old-unknown", "past-the-position", "recent"]);
        assert_eq!(ledger.pruned().unwrap(), Pruned { delivered: 1, failed: 1 });
        assert_eq!(ledger.prune(&positions, 500).unwrap(), 0, "nothing twice");
        drop(ledger);
        // A new machine starts from the mirror without the pruned entries, with their counts.
        let second = Ledger::open_mirrored(&dir.path().join("b"), mirror).unwrap();
        assert_eq!(second.entries().unwrap().len(), 3);
        assert_eq!(second.pruned().unwrap(), Pruned { delivered: 1, failed: 1 });
    }

    #[test]
    fn a_new_ledger_starts_from_its_mirror_and_an_old_one_from_itself() {
        let dir = tempfile::tempdir().unwrap();
        let mirror = Arc::new(Memory::default());
        let mut entry = Entry::unsent(2, 5, "cd".into());
        {
            let first = Ledger::open_mirrored(&dir.path().join("a"), mirror.clone()).unwrap();
            first.put("billing/b/v1", &entry).unwrap();
            first.set_positions(&[(2, 5)].into()).unwrap();
            first.put_stats(&Stats::default()).unwrap();
        }
        assert!(mirror.0.lock().unwrap().keys().all(|key| key.as_slice() != STATS_KEY));
        let second = Ledger::open_mirrored(&dir.path().join("b"), mirror.clone()).unwrap();
        assert_eq!(second.positions().unwrap(), [(2, 5)].into());
        assert_eq!(second.entry("billing/b/v1").unwrap(), Some(entry.clone()));
        drop(second);
        // A ledger with entries of its own keeps them.
        entry.attempting(9);
        Ledger::open(&dir.path().join("a")).unwrap().put("billing/b/v1", &entry).unwrap();
        mirror.0.lock().unwrap().clear();
        let reopened = Ledger::open_mirrored(&dir.path().join("a"), mirror).unwrap();
        assert_eq!(reopened.entry("billing/b/v1").unwrap(), Some(entry));
    }
}
