//! Durable keyed state: the [`StateStore`] trait every backend implements,
//! the in-memory backend (the test driver's), and the [`conformance`] suite
//! every backend's tests run (RocksDB's is in `tally-state-rocks`).
//!
//! A store holds two namespaces: the plugin's `state` and the host's `meta`
//! (committed input positions, committed output lengths). A [`StoreCommit`]
//! writes both atomically and durably, which is what makes a local-mode
//! commit one step.

use crate::sync::lock;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// The backend's own error, kept whole (its chain is its context).
pub type BackendError = Box<dyn std::error::Error + Send + Sync>;

/// A failure of the state backend (its message says what failed). Not the
/// plugin's fault: the run stops, and opening the job again may help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The store could not be opened.
    #[error("cannot open the state store at `{}`: {source}", path.display())]
    Open {
        /// The store's directory.
        path: PathBuf,
        /// What the backend said.
        source: BackendError,
    },
    /// A read failed.
    #[error("reading state failed: {0}")]
    Read(#[source] BackendError),
    /// A commit failed; nothing of it was applied.
    #[error("committing state failed: {0}")]
    Commit(#[source] BackendError),
    /// What the store holds is not what Tally wrote there.
    #[error(
        "the state store is damaged: {what}; restore the state directory from a backup, or in Kafka mode delete it to rebuild it from the changelog"
    )]
    Damaged {
        /// What was found, and where.
        what: String,
    },
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
    /// The state entries whose key starts with `prefix`, in key order (a
    /// period job reads one partition's periods so).
    fn scan_state_prefix(&self, prefix: &[u8]) -> Result<Vec<Entry>, StateError> {
        let mut entries = self.scan_state()?;
        entries.retain(|(key, _)| key.starts_with(prefix));
        Ok(entries)
    }
    /// Applies `commit` atomically and durably (synced to disk when the
    /// backend is on disk). On error nothing of it is applied.
    fn commit(&self, commit: StoreCommit) -> Result<(), StateError>;
    /// Starts a bulk load: many writes, made durable in chunks (a Kafka
    /// job's restore from its changelog).
    fn bulk_load(&self) -> Box<dyn BulkLoad + '_>;
}

/// Writes loaded in bulk (a Kafka job's restore from its changelog):
/// buffered, then made durable together, with a checkpoint that says how
/// far they reach, by [`BulkLoad::checkpoint`]; [`BulkLoad::finish`] waits
/// until every checkpoint is durable. Loaded writes must be safe to load
/// again (a changelog replayed from its last checkpoint): a crash loses
/// what was loaded since the last durable checkpoint, never what such a
/// checkpoint claims. Nothing reads the store until the load is finished,
/// and a store has one load at a time.
pub trait BulkLoad {
    /// Buffers a state put (`Some`) or delete (`None`); a later write of a
    /// key wins over an earlier one.
    fn state(&mut self, key: &[u8], value: Option<&[u8]>);
    /// Bytes of keys and values buffered since the last checkpoint.
    fn buffered_bytes(&self) -> usize;
    /// Makes what is buffered durable, then `checkpoint` (metadata puts),
    /// in that order. It may return before they are durable (a backend
    /// that writes in the background); an error is the failure of an
    /// earlier checkpoint.
    fn checkpoint(&mut self, checkpoint: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StateError>;
    /// How many of the checkpoints handed over are durable so far.
    fn durable_checkpoints(&self) -> u64;
    /// Waits until every checkpoint handed over is durable, or says why one
    /// is not.
    fn finish(&mut self) -> Result<(), StateError>;
}

/// A [`BulkLoad`] for backends without a faster path: each checkpoint is
/// one ordinary (durable, atomic) commit.
pub struct CommitEachCheckpoint<'s> {
    store: &'s dyn StateStore,
    pending: StoreCommit,
    bytes: usize,
    committed: u64,
}

impl<'s> CommitEachCheckpoint<'s> {
    /// A bulk load into `store`.
    pub fn new(store: &'s dyn StateStore) -> CommitEachCheckpoint<'s> {
        CommitEachCheckpoint { store, pending: StoreCommit::default(), bytes: 0, committed: 0 }
    }
}

impl BulkLoad for CommitEachCheckpoint<'_> {
    fn state(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.bytes += key.len() + value.map_or(0, <[u8]>::len);
        self.pending.state.push((key.to_vec(), value.map(<[u8]>::to_vec)));
    }

    fn buffered_bytes(&self) -> usize {
        self.bytes
    }

    fn checkpoint(&mut self, checkpoint: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StateError> {
        let mut pending = std::mem::take(&mut self.pending);
        self.bytes = 0;
        pending.meta.extend(checkpoint.iter().cloned());
        self.store.commit(pending)?;
        self.committed += 1;
        Ok(())
    }

    fn durable_checkpoints(&self) -> u64 {
        self.committed
    }

    fn finish(&mut self) -> Result<(), StateError> {
        Ok(()) // each checkpoint was one durable commit
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
        let maps = lock(&self.maps);
        Ok(keys.iter().map(|key| maps.state.get(*key).cloned()).collect())
    }

    fn get_meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        Ok(lock(&self.maps).meta.get(key).cloned())
    }

    fn scan_meta(&self, prefix: &[u8]) -> Result<Vec<Entry>, StateError> {
        Ok(scan_prefix(&lock(&self.maps).meta, prefix))
    }

    fn scan_state(&self) -> Result<Vec<Entry>, StateError> {
        Ok(lock(&self.maps).state.iter().map(clone_entry).collect())
    }

    fn scan_state_prefix(&self, prefix: &[u8]) -> Result<Vec<Entry>, StateError> {
        Ok(scan_prefix(&lock(&self.maps).state, prefix))
    }

    fn commit(&self, commit: StoreCommit) -> Result<(), StateError> {
        let mut maps = lock(&self.maps);
        for (key, value) in commit.state {
            match value {
                Some(value) => maps.state.insert(key, value),
                None => maps.state.remove(&key),
            };
        }
        maps.meta.extend(commit.meta);
        Ok(())
    }

    fn bulk_load(&self) -> Box<dyn BulkLoad + '_> {
        Box::new(CommitEachCheckpoint::new(self))
    }
}

/// The entries of `map` whose key starts with `prefix`, in key order.
fn scan_prefix(map: &BTreeMap<Vec<u8>, Vec<u8>>, prefix: &[u8]) -> Vec<Entry> {
    map.range(prefix.to_vec()..)
        .take_while(|(key, _)| key.starts_with(prefix))
        .map(clone_entry)
        .collect()
}

fn clone_entry((key, value): (&Vec<u8>, &Vec<u8>)) -> (Vec<u8>, Vec<u8>) {
    (key.clone(), value.clone())
}

/// The behaviour every backend must have. A backend's tests call
/// [`conformance::run`] with a way to make a fresh, empty store.
#[cfg(any(test, feature = "conformance"))]
pub mod conformance {
    use super::{StateError, StateStore, StoreCommit};

    /// The value of a store call that must succeed, or a failure naming the
    /// call and the backend's error.
    fn ok<T>(result: Result<T, StateError>, call: &str) -> T {
        result.unwrap_or_else(|err| panic!("the store under test failed `{call}`: {err}"))
    }

    fn commit_of(state: &[(&str, Option<&str>)], meta: &[(&str, &str)]) -> StoreCommit {
        StoreCommit {
            state: state
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec())))
                .collect(),
            meta: meta
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect(),
        }
    }

    /// Runs every check below, each on a fresh store from `fresh`.
    pub fn run<S: StateStore>(mut fresh: impl FnMut() -> S) {
        reads_what_was_committed(&fresh());
        keeps_state_and_meta_apart(&fresh());
        scans_in_key_order_within_the_prefix(&fresh());
        later_writes_in_one_commit_win(&fresh());
        bulk_loads_land_at_their_checkpoints(&fresh());
    }

    /// Reads see every commit: puts, deletes and metadata.
    pub fn reads_what_was_committed(store: &dyn StateStore) {
        assert_eq!(ok(store.get_many(&[b"a"]), "get_many"), vec![None]);
        ok(
            store.commit(commit_of(&[("a", Some("1")), ("b", Some("2"))], &[("pos/0", "10")])),
            "commit",
        );
        ok(
            store.commit(commit_of(
                &[("a", None), ("c", Some("3"))],
                &[("pos/0", "20"), ("pos/1", "5")],
            )),
            "commit",
        );
        assert_eq!(
            ok(store.get_many(&[b"a", b"b", b"c"]), "get_many"),
            vec![None, Some(b"2".to_vec()), Some(b"3".to_vec())]
        );
        assert_eq!(ok(store.get_meta(b"pos/0"), "get_meta"), Some(b"20".to_vec()));
        assert_eq!(ok(store.get_meta(b"nope"), "get_meta"), None);
        let positions = ok(store.scan_meta(b"pos/"), "scan_meta");
        assert_eq!(
            positions,
            vec![(b"pos/0".to_vec(), b"20".to_vec()), (b"pos/1".to_vec(), b"5".to_vec())]
        );
        assert_eq!(ok(store.scan_state(), "scan_state").len(), 2);
    }

    /// The same key in state and in metadata are two keys.
    pub fn keeps_state_and_meta_apart(store: &dyn StateStore) {
        ok(store.commit(commit_of(&[("k", Some("state"))], &[("k", "meta")])), "commit");
        assert_eq!(ok(store.get_many(&[b"k"]), "get_many"), vec![Some(b"state".to_vec())]);
        assert_eq!(ok(store.get_meta(b"k"), "get_meta"), Some(b"meta".to_vec()));
    }

    /// A metadata scan returns its prefix's keys in byte order and nothing
    /// past them; a state scan returns everything in byte order.
    pub fn scans_in_key_order_within_the_prefix(store: &dyn StateStore) {
        ok(
            store.commit(commit_of(
                &[("b", Some("2")), ("a", Some("1")), ("\u{ff}", Some("3"))],
                &[("p/b", "2"), ("p/a", "1"), ("p", "0"), ("q/a", "9")],
            )),
            "commit",
        );
        let keys: Vec<Vec<u8>> =
            ok(store.scan_meta(b"p/"), "scan_meta").into_iter().map(|(key, _)| key).collect();
        assert_eq!(keys, vec![b"p/a".to_vec(), b"p/b".to_vec()]);
        let keys: Vec<Vec<u8>> =
            ok(store.scan_state(), "scan_state").into_iter().map(|(key, _)| key).collect();
        assert_eq!(keys, vec![b"a".to_vec(), b"b".to_vec(), "\u{ff}".as_bytes().to_vec()]);
        ok(store.commit(commit_of(&[("ab", Some("4")), ("b0", Some("5"))], &[])), "commit");
        let keys: Vec<Vec<u8>> = ok(store.scan_state_prefix(b"a"), "scan_state_prefix")
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        assert_eq!(keys, vec![b"a".to_vec(), b"ab".to_vec()]);
        assert_eq!(ok(store.scan_state_prefix(b"c"), "scan_state_prefix"), vec![]);
        assert_eq!(
            ok(store.get_many(&[b"b", b"b", b"zz"]), "get_many"),
            vec![Some(b"2".to_vec()), Some(b"2".to_vec()), None],
            "one result per key asked, repeats included"
        );
    }

    /// A bulk load's writes land at its checkpoint, later ones winning,
    /// with the checkpoint; deletes remove what was there.
    pub fn bulk_loads_land_at_their_checkpoints(store: &dyn StateStore) {
        ok(store.commit(commit_of(&[("gone", Some("0")), ("kept", Some("0"))], &[])), "commit");
        let mut load = store.bulk_load();
        load.state(b"k", Some(b"1"));
        load.state(b"gone", None);
        assert_eq!(load.buffered_bytes(), 1 + 1 + 4);
        ok(load.checkpoint(&[(b"checkpoint/0".to_vec(), b"2".to_vec())]), "bulk checkpoint");
        assert_eq!(load.buffered_bytes(), 0);
        ok(load.finish(), "bulk finish");
        assert_eq!(
            ok(store.get_many(&[b"k", b"gone"]), "get_many"),
            vec![Some(b"1".to_vec()), None]
        );
        load.state(b"k", Some(b"2"));
        load.state(b"j", Some(b"3"));
        load.state(b"j", None);
        load.state(b"k", Some(b"4"));
        ok(load.checkpoint(&[(b"checkpoint/0".to_vec(), b"6".to_vec())]), "bulk checkpoint");
        ok(
            load.checkpoint(&[(b"checkpoint/1".to_vec(), b"1".to_vec())]),
            "an empty bulk checkpoint",
        );
        ok(load.finish(), "bulk finish");
        assert_eq!(
            load.durable_checkpoints(),
            3,
            "every checkpoint is durable once the load is finished"
        );
        drop(load);
        let values = ok(store.get_many(&[b"k", b"j", b"gone", b"kept"]), "get_many");
        assert_eq!(values, vec![Some(b"4".to_vec()), None, None, Some(b"0".to_vec())]);
        assert_eq!(ok(store.get_meta(b"checkpoint/0"), "get_meta"), Some(b"6".to_vec()));
        assert_eq!(ok(store.get_meta(b"checkpoint/1"), "get_meta"), Some(b"1".to_vec()));
    }

    /// Within one commit, a later write of a key wins over an earlier one.
    pub fn later_writes_in_one_commit_win(store: &dyn StateStore) {
        ok(
            store.commit(commit_of(
                &[("k", Some("1")), ("k", None), ("j", None), ("j", Some("2"))],
                &[],
            )),
            "commit",
        );
        assert_eq!(ok(store.get_many(&[b"k", b"j"]), "get_many"), vec![None, Some(b"2".to_vec())]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_store_meets_the_contract() {
        conformance::run(MemoryStore::default);
    }
}
