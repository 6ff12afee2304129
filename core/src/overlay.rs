//! The state overlay: a transaction's state changes, held in memory until
//! the transaction commits (invariant 2 of `docs/architecture.md`: local state is never ahead
//! of the log).
//!
//! Four layers, read newest first:
//! - the current batch's writes, dropped if the plugin traps on the batch;
//! - the open transaction's writes, handed to the committer at commit;
//! - the writes of a transaction being committed while the next one runs
//!   (Kafka mode commits in the background);
//! - a cache of committed values, so hot keys are not read from the store
//!   on every batch (like Kafka Streams' record cache).

use std::collections::HashMap;

use foldhash::fast::RandomState;

use crate::state::{StateError, StateStore};

/// How many committed entries the read cache holds before it is cleared.
pub const DEFAULT_CACHE_ENTRIES: usize = 1 << 20;
/// How many bytes of committed keys and values the read cache holds
/// before it is cleared.
pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;
/// What one entry of a read costs beyond its value's bytes (its slot in the
/// result, its key's copy and bookkeeping), counted against a read's limit.
pub const ENTRY_BYTES: u64 = 64;
/// Keys read from the store in one go by a bounded read.
const STORE_READ_CHUNK: usize = 64;

/// A value in a layer: `None` means deleted.
type Value = Option<Vec<u8>>;

/// One layer. Keys come from input data, so the hash is seeded (foldhash:
/// a fraction of SipHash's cost, still no fixed collisions to aim at).
type Layer = HashMap<Vec<u8>, Value, RandomState>;

/// Uncommitted state changes over a [`StateStore`].
#[derive(Debug)]
pub struct Overlay {
    batch: Layer,
    transaction: Layer,
    committing: Layer,
    committed: Layer,
    cache_entries: usize,
    cache_bytes: u64,
    /// Bytes of keys and values in `committed`.
    cached_bytes: u64,
}

/// Why a read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The store failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// The values asked for total more than the read may return.
    #[error("the values read total more than {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
}

impl Default for Overlay {
    fn default() -> Self {
        Overlay::with_cache(DEFAULT_CACHE_ENTRIES, DEFAULT_CACHE_BYTES)
    }
}

impl Overlay {
    /// An empty overlay whose committed-value cache holds up to
    /// `cache_entries` entries and `cache_bytes` bytes.
    pub fn with_cache(cache_entries: usize, cache_bytes: u64) -> Overlay {
        Overlay {
            batch: Layer::default(),
            transaction: Layer::default(),
            committing: Layer::default(),
            committed: Layer::default(),
            cache_entries,
            cache_bytes,
            cached_bytes: 0,
        }
    }

    /// Reads keys, newest layer first, going to `store` only for keys no
    /// layer knows (each distinct key once). Stops with
    /// [`ReadError::TooLarge`] as soon as the values found, with
    /// [`ENTRY_BYTES`] for each entry, total more than `limit`: nothing past
    /// that is copied, however often a key is repeated.
    pub fn get_many(
        &mut self,
        keys: &[Vec<u8>],
        store: &dyn StateStore,
        limit: u64,
    ) -> Result<Vec<Value>, ReadError> {
        let mut total = 0u64;
        let count = |total: &mut u64, value: &Value| -> Result<(), ReadError> {
            *total = total
                .saturating_add(ENTRY_BYTES + value.as_ref().map_or(0, |value| value.len() as u64));
            if *total > limit { Err(ReadError::TooLarge { limit }) } else { Ok(()) }
        };
        let mut values = Vec::with_capacity(keys.len().min(4096));
        let mut missing: HashMap<&[u8], Vec<usize>, RandomState> = HashMap::default();
        for (index, key) in keys.iter().enumerate() {
            match self.layered(key) {
                Some(value) => {
                    count(&mut total, value)?;
                    values.push(value.clone());
                }
                None => {
                    count(&mut total, &None)?;
                    values.push(None);
                    missing.entry(key.as_slice()).or_default().push(index);
                }
            }
        }
        let missing: Vec<(&[u8], Vec<usize>)> = missing.into_iter().collect();
        for chunk in missing.chunks(STORE_READ_CHUNK) {
            let chunk_keys: Vec<&[u8]> = chunk.iter().map(|(key, _)| *key).collect();
            let stored = store.get_many(&chunk_keys)?;
            for ((key, indices), value) in chunk.iter().zip(stored) {
                for &index in indices {
                    // Each copy counts; its entry was counted above.
                    total -= ENTRY_BYTES;
                    count(&mut total, &value)?;
                    values[index] = value.clone();
                }
                self.cache_one(key, value);
            }
        }
        Ok(values)
    }

    fn cache_one(&mut self, key: &[u8], value: Value) {
        let bytes = (key.len() + value.as_ref().map_or(0, Vec::len)) as u64;
        if self.committed.len() < self.cache_entries
            && self.cached_bytes + bytes <= self.cache_bytes
        {
            self.cached_bytes += bytes;
            self.committed.insert(key.to_vec(), value);
        }
    }

    fn layered(&self, key: &[u8]) -> Option<&Value> {
        self.batch
            .get(key)
            .or_else(|| self.transaction.get(key))
            .or_else(|| self.committing.get(key))
            .or_else(|| self.committed.get(key))
    }

    /// Writes a key in the current batch.
    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.batch.insert(key, Some(value));
    }

    /// Deletes a key in the current batch.
    pub fn delete(&mut self, key: Vec<u8>) {
        self.batch.insert(key, None);
    }

    /// Writes (`Some`) or deletes (`None`) a key straight in the
    /// transaction, past the batch: the host's own entries (a period
    /// job's), which no batch's failure takes back — only the
    /// transaction's.
    pub fn put_in_transaction(&mut self, key: Vec<u8>, value: Value) {
        self.transaction.insert(key, value);
    }

    /// The batch succeeded: its writes join the transaction.
    pub fn keep_batch(&mut self) {
        if self.transaction.is_empty() {
            std::mem::swap(&mut self.transaction, &mut self.batch);
        } else {
            self.transaction.extend(self.batch.drain());
        }
    }

    /// The batch failed: its writes are forgotten.
    pub fn drop_batch(&mut self) {
        self.batch.clear();
    }

    /// Whether the transaction has state changes.
    pub fn is_empty(&self) -> bool {
        self.transaction.is_empty() && self.batch.is_empty()
    }

    /// The transaction's changes, for the committer (batch writes must have
    /// been kept or dropped first).
    pub fn changes(&self) -> Vec<(Vec<u8>, Value)> {
        debug_assert!(self.batch.is_empty(), "a batch is still open");
        self.transaction.iter().map(|(key, value)| (key.clone(), value.clone())).collect()
    }

    /// The transaction committed: its changes become the cached committed values.
    pub fn committed(&mut self) {
        let mut changes = std::mem::take(&mut self.transaction);
        self.cache(&mut changes);
        self.transaction = changes;
    }

    /// The transaction's commit starts while the next transaction runs: its
    /// changes move to the committing layer, where reads still see them,
    /// and are returned for the committer. One commit at a time.
    pub fn prepare(&mut self) -> Vec<(Vec<u8>, Value)> {
        debug_assert!(self.committing.is_empty(), "a commit is already in flight");
        let changes = self.changes();
        std::mem::swap(&mut self.committing, &mut self.transaction);
        self.transaction.clear();
        changes
    }

    /// The commit begun with [`Overlay::prepare`] is done: its changes
    /// become the cached committed values.
    pub fn prepared_took_effect(&mut self) {
        let mut changes = std::mem::take(&mut self.committing);
        self.cache(&mut changes);
        self.committing = changes;
    }

    /// Moves committed `changes` into the cache (emptying `changes`, whose
    /// allocation stays for reuse); the cache starts over when they would
    /// not fit.
    fn cache(&mut self, changes: &mut Layer) {
        let bytes: u64 = changes
            .iter()
            .map(|(key, value)| (key.len() + value.as_ref().map_or(0, Vec::len)) as u64)
            .sum();
        if self.committed.len() + changes.len() > self.cache_entries
            || self.cached_bytes + bytes > self.cache_bytes
        {
            self.forget_cache();
        }
        if changes.len() > self.cache_entries || bytes > self.cache_bytes {
            // Even alone they would not fit: only what reads bring in is cached.
            changes.clear();
            return;
        }
        self.cached_bytes += bytes;
        // Replaced entries stay counted until the cache starts over.
        self.committed.extend(changes.drain());
    }

    /// Forgets the cached committed values (the store changed underneath,
    /// as when a restore applied changelog records).
    pub fn forget_cache(&mut self) {
        self.committed.clear();
        self.cached_bytes = 0;
    }

    /// The transaction was aborted (and with it any commit in flight, whose
    /// outcome it built on): their changes are forgotten.
    pub fn abort(&mut self) {
        self.batch.clear();
        self.transaction.clear();
        self.committing.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{MemoryStore, StoreCommit};

    fn store_with(key: &[u8], value: &[u8]) -> MemoryStore {
        let store = MemoryStore::default();
        store
            .commit(StoreCommit { state: vec![(key.to_vec(), Some(value.to_vec()))], meta: vec![] })
            .unwrap();
        store
    }

    #[test]
    fn reads_own_writes_before_the_store() {
        let store = store_with(b"k", b"stored");
        let mut overlay = Overlay::default();
        assert_eq!(
            overlay.get_many(&[b"k".to_vec()], &store, u64::MAX).unwrap(),
            vec![Some(b"stored".to_vec())]
        );
        overlay.put(b"k".to_vec(), b"new".to_vec());
        assert_eq!(
            overlay.get_many(&[b"k".to_vec()], &store, u64::MAX).unwrap(),
            vec![Some(b"new".to_vec())]
        );
        overlay.keep_batch();
        overlay.delete(b"k".to_vec());
        assert_eq!(overlay.get_many(&[b"k".to_vec()], &store, u64::MAX).unwrap(), vec![None]);
    }

    #[test]
    fn a_dropped_batch_leaves_the_transaction_as_it_was() {
        let store = MemoryStore::default();
        let mut overlay = Overlay::default();
        overlay.put(b"a".to_vec(), b"1".to_vec());
        overlay.keep_batch();
        overlay.put(b"a".to_vec(), b"2".to_vec());
        overlay.put(b"b".to_vec(), b"2".to_vec());
        overlay.drop_batch();
        assert_eq!(overlay.changes(), vec![(b"a".to_vec(), Some(b"1".to_vec()))]);
        assert_eq!(overlay.get_many(&[b"b".to_vec()], &store, u64::MAX).unwrap(), vec![None]);
    }

    #[test]
    fn nothing_reaches_the_store_and_an_abort_forgets_everything() {
        let store = store_with(b"k", b"stored");
        let mut overlay = Overlay::default();
        overlay.put(b"k".to_vec(), b"new".to_vec());
        overlay.keep_batch();
        assert_eq!(store.get_many(&[b"k"]).unwrap(), vec![Some(b"stored".to_vec())]);
        overlay.abort();
        assert!(overlay.is_empty());
        assert_eq!(
            overlay.get_many(&[b"k".to_vec()], &store, u64::MAX).unwrap(),
            vec![Some(b"stored".to_vec())]
        );
    }

    #[test]
    fn a_commit_in_flight_is_read_under_the_next_transaction_and_aborted_with_it() {
        let store = store_with(b"k", b"stored");
        let mut overlay = Overlay::default();
        overlay.put(b"k".to_vec(), b"1".to_vec());
        overlay.keep_batch();
        assert_eq!(overlay.prepare(), vec![(b"k".to_vec(), Some(b"1".to_vec()))]);
        assert!(overlay.changes().is_empty(), "the next transaction starts empty");
        assert_eq!(
            overlay.get_many(&[b"k".to_vec()], &store, u64::MAX).unwrap(),
            vec![Some(b"1".to_vec())]
        );
        overlay.put(b"k".to_vec(), b"2".to_vec());
        overlay.keep_batch();
        overlay.prepared_took_effect();
        assert_eq!(overlay.changes(), vec![(b"k".to_vec(), Some(b"2".to_vec()))]);
        assert_eq!(overlay.prepare(), vec![(b"k".to_vec(), Some(b"2".to_vec()))]);
        overlay.abort();
        // The first commit's value is cached; the aborted one is gone.
        assert_eq!(
            overlay.get_many(&[b"k".to_vec()], &store, u64::MAX).unwrap(),
            vec![Some(b"1".to_vec())]
        );
    }

    #[test]
    fn a_read_stops_at_its_limit_however_often_a_key_repeats() {
        let store = store_with(b"big", &[7u8; 1000]);
        let mut overlay = Overlay::default();
        let keys = vec![b"big".to_vec(); 100_000];
        let err = overlay.get_many(&keys, &store, 64 << 10).unwrap_err();
        assert!(matches!(err, ReadError::TooLarge { limit: 65536 }), "{err}");
        // Served from a layer, the same.
        overlay.put(b"big".to_vec(), vec![1u8; 1000]);
        assert!(matches!(
            overlay.get_many(&keys, &store, 64 << 10),
            Err(ReadError::TooLarge { .. })
        ));
        let few = vec![b"big".to_vec(); 10];
        assert_eq!(overlay.get_many(&few, &store, 64 << 10).unwrap().len(), 10);
    }

    #[test]
    fn the_read_cache_is_bounded_in_bytes() {
        let store = MemoryStore::default();
        let mut overlay = Overlay::with_cache(1000, 100);
        overlay.put(b"a".to_vec(), vec![0; 60]);
        overlay.keep_batch();
        overlay.committed();
        assert_eq!(overlay.cached_bytes, 61);
        overlay.put(b"b".to_vec(), vec![0; 60]);
        overlay.keep_batch();
        overlay.committed();
        assert_eq!(
            overlay.cached_bytes, 61,
            "the cache started over rather than grow past its bytes"
        );
        assert!(overlay.layered(b"a").is_none() && overlay.layered(b"b").is_some());
        let _ = store;
    }

    #[test]
    fn committed_values_are_served_from_the_cache() {
        let store = MemoryStore::default();
        let mut overlay = Overlay::default();
        overlay.put(b"k".to_vec(), b"v".to_vec());
        overlay.keep_batch();
        overlay.committed();
        assert!(overlay.is_empty());
        assert_eq!(
            overlay.get_many(&[b"k".to_vec()], &store, u64::MAX).unwrap(),
            vec![Some(b"v".to_vec())]
        );
    }
}
