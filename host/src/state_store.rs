//! Durable keyed state: the [`StateStore`] trait and its two backends,
//! RocksDB (the real one) and memory (the test driver's).
//!
//! A store holds two namespaces: the plugin's `state` and the host's `meta`
//! (committed input positions, committed output lengths). A [`StoreCommit`]
//! writes both atomically and durably, which is what makes a local-mode
//! commit one step.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A failure of the state backend (its message says what failed). Not the
/// plugin's fault: the run stops.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The store could not be opened.
    #[error("cannot open the state store at `{}`: {reason}", path.display())]
    Open { path: PathBuf, reason: String },
    /// A read failed.
    #[error("reading state failed: {0}")]
    Read(String),
    /// A commit failed; nothing of it was applied.
    #[error("committing state failed: {0}")]
    Commit(String),
}

fn read_error(err: rocksdb::Error) -> StateError {
    StateError::Read(err.into_string())
}

/// A key and its value, as scans return them.
pub type Entry = (Vec<u8>, Vec<u8>);

/// Everything one transaction changes in a store, applied atomically.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StoreCommit {
    /// State writes: `Some` puts, `None` deletes.
    pub state: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Host metadata writes (positions, output lengths).
    pub meta: Vec<(Vec<u8>, Vec<u8>)>,
}

/// A durable keyed store with a state namespace and a metadata namespace.
pub trait StateStore: Send + Sync {
    /// Reads state keys; one result per key, in order.
    fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StateError>;
    /// Reads one metadata key.
    fn get_meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError>;
    /// All metadata entries whose key starts with `prefix`, in key order.
    fn scan_meta(&self, prefix: &[u8]) -> Result<Vec<Entry>, StateError>;
    /// All state entries, in key order (for inspection and tests).
    fn scan_state(&self) -> Result<Vec<Entry>, StateError>;
    /// Applies `commit` atomically and durably (synced to disk when the
    /// backend is on disk). On error nothing of it is applied.
    fn commit(&self, commit: StoreCommit) -> Result<(), StateError>;
}

/// Column family of the plugin's state.
const STATE_CF: &str = "state";
/// Column family of the host's metadata.
const META_CF: &str = "meta";

/// The RocksDB backend.
pub struct RocksStore {
    db: rocksdb::DB,
}

impl RocksStore {
    /// Opens (creating if needed) the store in directory `path`.
    pub fn open(path: &Path) -> Result<RocksStore, StateError> {
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        let db = rocksdb::DB::open_cf(&options, path, [STATE_CF, META_CF])
            .map_err(|err| StateError::Open { path: path.to_path_buf(), reason: err.into_string() })?;
        Ok(RocksStore { db })
    }

    fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(name).expect("column families are created on open")
    }

    fn scan(&self, cf: &str, prefix: &[u8]) -> Result<Vec<Entry>, StateError> {
        let mode = rocksdb::IteratorMode::From(prefix, rocksdb::Direction::Forward);
        let mut entries = Vec::new();
        for item in self.db.iterator_cf(self.cf(cf), mode) {
            let (key, value) = item.map_err(read_error)?;
            if !key.starts_with(prefix) {
                break;
            }
            entries.push((key.into_vec(), value.into_vec()));
        }
        Ok(entries)
    }
}

impl StateStore for RocksStore {
    fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        let cf = self.cf(STATE_CF);
        self.db
            .batched_multi_get_cf(cf, keys.iter(), false)
            .into_iter()
            .map(|value| value.map(|value| value.map(|slice| slice.to_vec())).map_err(read_error))
            .collect()
    }

    fn get_meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.db.get_cf(self.cf(META_CF), key).map_err(read_error)
    }

    fn scan_meta(&self, prefix: &[u8]) -> Result<Vec<Entry>, StateError> {
        self.scan(META_CF, prefix)
    }

    fn scan_state(&self) -> Result<Vec<Entry>, StateError> {
        self.scan(STATE_CF, b"")
    }

    fn commit(&self, commit: StoreCommit) -> Result<(), StateError> {
        let mut batch = rocksdb::WriteBatch::default();
        let (state, meta) = (self.cf(STATE_CF), self.cf(META_CF));
        for (key, value) in &commit.state {
            match value {
                Some(value) => batch.put_cf(state, key, value),
                None => batch.delete_cf(state, key),
            }
        }
        for (key, value) in &commit.meta {
            batch.put_cf(meta, key, value);
        }
        let mut options = rocksdb::WriteOptions::default();
        options.set_sync(true);
        self.db.write_opt(batch, &options).map_err(|err| StateError::Commit(err.into_string()))
    }
}

/// An in-memory backend with the same behaviour, minus durability.
#[derive(Default)]
pub struct MemoryStore {
    maps: Mutex<MemoryMaps>,
}

/// Both namespaces, behind one lock so a commit is atomic.
#[derive(Default)]
struct MemoryMaps {
    state: BTreeMap<Vec<u8>, Vec<u8>>,
    meta: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl StateStore for MemoryStore {
    fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        let maps = self.maps.lock().expect("memory store lock");
        Ok(keys.iter().map(|key| maps.state.get(*key).cloned()).collect())
    }

    fn get_meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.maps.lock().expect("memory store lock").meta.get(key).cloned())
    }

    fn scan_meta(&self, prefix: &[u8]) -> Result<Vec<Entry>, StateError> {
        let maps = self.maps.lock().expect("memory store lock");
        Ok(maps.meta.range(prefix.to_vec()..).take_while(|(key, _)| key.starts_with(prefix)).map(clone_entry).collect())
    }

    fn scan_state(&self) -> Result<Vec<Entry>, StateError> {
        Ok(self.maps.lock().expect("memory store lock").state.iter().map(clone_entry).collect())
    }

    fn commit(&self, commit: StoreCommit) -> Result<(), StateError> {
        let mut maps = self.maps.lock().expect("memory store lock");
        for (key, value) in commit.state {
            match value {
                Some(value) => maps.state.insert(key, value),
                None => maps.state.remove(&key),
            };
        }
        maps.meta.extend(commit.meta);
        Ok(())
    }
}

fn clone_entry((key, value): (&Vec<u8>, &Vec<u8>)) -> (Vec<u8>, Vec<u8>) {
    (key.clone(), value.clone())
}

/// The behaviour every backend must have; run against each below.
#[cfg(test)]
mod contract {
    use super::*;

    fn commit_of(state: &[(&str, Option<&str>)], meta: &[(&str, &str)]) -> StoreCommit {
        StoreCommit {
            state: state.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()))).collect(),
            meta: meta.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())).collect(),
        }
    }

    pub fn reads_what_was_committed(store: &dyn StateStore) {
        assert_eq!(store.get_many(&[b"a"]).unwrap(), vec![None]);
        store.commit(commit_of(&[("a", Some("1")), ("b", Some("2"))], &[("pos/0", "10")])).unwrap();
        store.commit(commit_of(&[("a", None), ("c", Some("3"))], &[("pos/0", "20"), ("pos/1", "5")])).unwrap();
        assert_eq!(store.get_many(&[b"a", b"b", b"c"]).unwrap(), vec![None, Some(b"2".to_vec()), Some(b"3".to_vec())]);
        assert_eq!(store.get_meta(b"pos/0").unwrap(), Some(b"20".to_vec()));
        assert_eq!(store.get_meta(b"nope").unwrap(), None);
        let positions = store.scan_meta(b"pos/").unwrap();
        assert_eq!(positions, vec![(b"pos/0".to_vec(), b"20".to_vec()), (b"pos/1".to_vec(), b"5".to_vec())]);
        assert_eq!(store.scan_state().unwrap().len(), 2);
    }

    pub fn keeps_state_and_meta_apart(store: &dyn StateStore) {
        store.commit(commit_of(&[("k", Some("state"))], &[("k", "meta")])).unwrap();
        assert_eq!(store.get_many(&[b"k"]).unwrap(), vec![Some(b"state".to_vec())]);
        assert_eq!(store.get_meta(b"k").unwrap(), Some(b"meta".to_vec()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_store_meets_the_contract() {
        contract::reads_what_was_committed(&MemoryStore::default());
        contract::keeps_state_and_meta_apart(&MemoryStore::default());
    }

    #[test]
    fn rocks_store_meets_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        contract::reads_what_was_committed(&RocksStore::open(&dir.path().join("a")).unwrap());
        contract::keeps_state_and_meta_apart(&RocksStore::open(&dir.path().join("b")).unwrap());
    }

    #[test]
    fn rocks_store_keeps_commits_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = RocksStore::open(dir.path()).unwrap();
            store.commit(StoreCommit { state: vec![(b"k".to_vec(), Some(b"v".to_vec()))], meta: vec![] }).unwrap();
        }
        let store = RocksStore::open(dir.path()).unwrap();
        assert_eq!(store.get_many(&[b"k"]).unwrap(), vec![Some(b"v".to_vec())]);
    }
}
