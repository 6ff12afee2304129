//! The state overlay: a transaction's state changes, held in memory until
//! the transaction commits (DESIGN invariant 2: local state is never ahead
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

use crate::state_store::{StateError, StateStore};

/// How many committed entries the read cache holds before it is cleared.
pub const DEFAULT_CACHE_ENTRIES: usize = 1 << 20;

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
}

impl Default for Overlay {
    fn default() -> Self {
        Overlay::with_cache_entries(DEFAULT_CACHE_ENTRIES)
    }
}

impl Overlay {
    /// An empty overlay whose committed-value cache holds up to `cache_entries`.
    pub fn with_cache_entries(cache_entries: usize) -> Overlay {
        Overlay {
            batch: Layer::default(),
            transaction: Layer::default(),
            committing: Layer::default(),
            committed: Layer::default(),
            cache_entries,
        }
    }

    /// Reads keys, newest layer first, going to `store` only for keys no
    /// layer knows (in one `get_many`).
    pub fn get_many(&mut self, keys: &[Vec<u8>], store: &dyn StateStore) -> Result<Vec<Value>, StateError> {
        let mut values = Vec::with_capacity(keys.len());
        let mut missing = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            match self.layered(key) {
                Some(value) => values.push(value.clone()),
                None => {
                    values.push(None);
                    missing.push(index);
                }
            }
        }
        if !missing.is_empty() {
            let missing_keys: Vec<&[u8]> = missing.iter().map(|&index| keys[index].as_slice()).collect();
            let stored = store.get_many(&missing_keys)?;
            for (index, value) in missing.into_iter().zip(stored) {
                if self.committed.len() < self.cache_entries {
                    self.committed.insert(keys[index].clone(), value.clone());
                }
                values[index] = value;
            }
        }
        Ok(values)
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
        Overlay::cache(&mut self.committed, &mut self.transaction, self.cache_entries);
    }

    /// The transaction's commit starts while the next transaction runs: its
    /// changes move to the committing layer, where reads still see them,
    /// and are returned for the committer. One commit at a time.
    pub fn begin_commit(&mut self) -> Vec<(Vec<u8>, Value)> {
        debug_assert!(self.committing.is_empty(), "a commit is already in flight");
        let changes = self.changes();
        std::mem::swap(&mut self.committing, &mut self.transaction);
        self.transaction.clear();
        changes
    }

    /// The commit begun with [`Overlay::begin_commit`] is done: its changes
    /// become the cached committed values.
    pub fn finish_commit(&mut self) {
        Overlay::cache(&mut self.committed, &mut self.committing, self.cache_entries);
    }

    fn cache(committed: &mut Layer, changes: &mut Layer, cache_entries: usize) {
        if committed.len() + changes.len() > cache_entries {
            committed.clear();
        }
        committed.extend(changes.drain());
    }

    /// Forgets the cached committed values (the store changed underneath,
    /// as when a restore applied changelog records).
    pub fn forget_cache(&mut self) {
        self.committed.clear();
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
    use crate::state_store::{MemoryStore, StoreCommit};

    fn store_with(key: &[u8], value: &[u8]) -> MemoryStore {
        let store = MemoryStore::default();
        store.commit(StoreCommit { state: vec![(key.to_vec(), Some(value.to_vec()))], meta: vec![] }).unwrap();
        store
    }

    #[test]
    fn reads_own_writes_before_the_store() {
        let store = store_with(b"k", b"stored");
        let mut overlay = Overlay::default();
        assert_eq!(overlay.get_many(&[b"k".to_vec()], &store).unwrap(), vec![Some(b"stored".to_vec())]);
        overlay.put(b"k".to_vec(), b"new".to_vec());
        assert_eq!(overlay.get_many(&[b"k".to_vec()], &store).unwrap(), vec![Some(b"new".to_vec())]);
        overlay.keep_batch();
        overlay.delete(b"k".to_vec());
        assert_eq!(overlay.get_many(&[b"k".to_vec()], &store).unwrap(), vec![None]);
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
        assert_eq!(overlay.get_many(&[b"b".to_vec()], &store).unwrap(), vec![None]);
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
        assert_eq!(overlay.get_many(&[b"k".to_vec()], &store).unwrap(), vec![Some(b"stored".to_vec())]);
    }

    #[test]
    fn a_commit_in_flight_is_read_under_the_next_transaction_and_aborted_with_it() {
        let store = store_with(b"k", b"stored");
        let mut overlay = Overlay::default();
        overlay.put(b"k".to_vec(), b"1".to_vec());
        overlay.keep_batch();
        assert_eq!(overlay.begin_commit(), vec![(b"k".to_vec(), Some(b"1".to_vec()))]);
        assert!(overlay.changes().is_empty(), "the next transaction starts empty");
        assert_eq!(overlay.get_many(&[b"k".to_vec()], &store).unwrap(), vec![Some(b"1".to_vec())]);
        overlay.put(b"k".to_vec(), b"2".to_vec());
        overlay.keep_batch();
        overlay.finish_commit();
        assert_eq!(overlay.changes(), vec![(b"k".to_vec(), Some(b"2".to_vec()))]);
        assert_eq!(overlay.begin_commit(), vec![(b"k".to_vec(), Some(b"2".to_vec()))]);
        overlay.abort();
        // The first commit's value is cached; the aborted one is gone.
        assert_eq!(overlay.get_many(&[b"k".to_vec()], &store).unwrap(), vec![Some(b"1".to_vec())]);
    }

    #[test]
    fn committed_values_are_served_from_the_cache() {
        let store = MemoryStore::default();
        let mut overlay = Overlay::default();
        overlay.put(b"k".to_vec(), b"v".to_vec());
        overlay.keep_batch();
        overlay.committed();
        assert!(overlay.is_empty());
        assert_eq!(overlay.get_many(&[b"k".to_vec()], &store).unwrap(), vec![Some(b"v".to_vec())]);
    }
}
