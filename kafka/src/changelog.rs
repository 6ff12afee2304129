//! The changelog: what a Kafka job writes about its state, and how a
//! process rebuilds its RocksDB from it.
//!
//! Partition `p` of the changelog topic holds the state of input partition
//! `p`. Record keys start with one byte saying what they are:
//! - `s` + state key: the key's new value (a tombstone deletes it);
//! - `o` + input topic: the next input offset the state includes, written
//!   in every transaction that read from that topic's partition `p`. It is
//!   how a restored state knows which input it already counted, so an
//!   out-of-band rewind of the group's offsets is caught (invariant 6 of `docs/architecture.md`).
//!
//! RocksDB keeps, next to the state, the same "included" offsets and a
//! checkpoint per partition: the changelog offset to restore from.

use tally_core::state::{BulkLoad, StateError, StateStore};

use super::keys::{ChangelogKey, checkpoint_key, included_key, namespace};

/// Reads a decimal offset stored under `key`.
pub fn read_offset(store: &dyn StateStore, key: &[u8]) -> Result<Option<i64>, StateError> {
    match store.get_meta(key)? {
        None => Ok(None),
        Some(bytes) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|text| text.parse().ok())
            .map(Some)
            .ok_or_else(|| StateError::Damaged {
                what: format!("metadata `{}` is not an offset", String::from_utf8_lossy(key)),
            }),
    }
}

/// One partition being restored.
pub(crate) struct Restoring {
    pub(crate) partition: i32,
    /// Next changelog offset to apply.
    pub(crate) next: i64,
    /// The partition's end when the restore began (its last stable offset).
    pub(crate) end: i64,
    /// Read to its end.
    pub(crate) finished: bool,
    /// Applied records since the last checkpoint.
    pub(crate) touched: bool,
    /// Latest included offset per input topic read since the last
    /// checkpoint (written with the checkpoint).
    pub(crate) included: Vec<(String, i64)>,
}

impl Restoring {
    /// Moves past what was read up to `next` (records, transaction
    /// markers, aborted batches alike): the checkpoint may skip it.
    pub(crate) fn advance_to(&mut self, next: i64) {
        if next > self.next {
            self.next = next;
            self.touched = true;
        }
    }

    /// The partition was read to its end: every offset before the end
    /// taken up front was read (or was a transaction marker, or aborted).
    pub(crate) fn finish(&mut self) {
        self.finished = true;
        self.advance_to(self.end);
    }

    /// The consumer says it read the partition to `offset`: finished if
    /// that is at or past the end taken up front. A shorter end is not the
    /// partition's end: a leader newly elected may not have caught up
    /// yet, and what it lacks is still to be read (the stall limit bounds
    /// the wait).
    pub(crate) fn ended_at(&mut self, offset: i64) {
        if offset >= self.end {
            self.finish();
        }
    }
}

/// Offsets left to read in `restoring`.
pub(crate) fn to_go(restoring: &[Restoring]) -> u64 {
    restoring
        .iter()
        .filter(|partition| !partition.finished)
        .map(|partition| partition.end.saturating_sub(partition.next).max(0) as u64)
        .sum()
}

/// Makes the restore durable up to each partition's next offset: the
/// applied writes first, then the checkpoints and included offsets.
pub(crate) fn checkpoint(
    load: &mut dyn BulkLoad,
    restoring: &mut [Restoring],
) -> Result<(), StateError> {
    let mut meta = Vec::new();
    for partition in restoring.iter_mut().filter(|partition| partition.touched) {
        partition.touched = false;
        meta.push((checkpoint_key(partition.partition), partition.next.to_string().into_bytes()));
        for (topic, offset) in partition.included.drain(..) {
            meta.push((included_key(&topic, partition.partition), offset.to_string().into_bytes()));
        }
    }
    if meta.is_empty() {
        return Ok(());
    }
    load.checkpoint(&meta)
}

/// Loads one changelog record of `slot`'s partition: a state write into
/// `load` (its key built in `key`, reused), or an included offset kept for
/// the next checkpoint. Returns the record's key and value bytes; `None`
/// if it is not a record Tally writes.
pub(crate) fn apply(
    load: &mut dyn BulkLoad,
    key: &mut Vec<u8>,
    slot: &mut Restoring,
    record_key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> Option<usize> {
    let record_key = record_key?;
    let bytes = record_key.len() + value.map_or(0, <[u8]>::len);
    match ChangelogKey::parse(record_key)? {
        ChangelogKey::State(state_key) => {
            key.clear();
            key.extend_from_slice(&namespace(slot.partition));
            key.extend_from_slice(state_key);
            load.state(key, value);
        }
        ChangelogKey::Offset(topic) => {
            let offset: i64 = std::str::from_utf8(value?).ok()?.parse().ok()?;
            match slot.included.iter_mut().find(|(known, _)| known == topic) {
                Some((_, latest)) => *latest = offset,
                None => slot.included.push((topic.to_string(), offset)),
            }
        }
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::namespaced;
    use tally_core::state::MemoryStore;

    fn restoring(partition: i32) -> Restoring {
        Restoring {
            partition,
            next: 0,
            end: 100,
            finished: false,
            touched: false,
            included: Vec::new(),
        }
    }

    #[test]
    fn records_restore_into_their_partitions_namespace_and_checkpoint_with_their_offsets() {
        let store = MemoryStore::default();
        let mut load = store.bulk_load();
        let (mut key, mut slot) = (Vec::new(), restoring(2));
        assert_eq!(
            apply(
                &mut *load,
                &mut key,
                &mut slot,
                Some(&ChangelogKey::State(b"acme").to_bytes()),
                Some(b"7")
            ),
            Some(6)
        );
        assert_eq!(
            apply(
                &mut *load,
                &mut key,
                &mut slot,
                Some(&ChangelogKey::State(b"gone").to_bytes()),
                None
            ),
            Some(5)
        );
        assert_eq!(
            apply(
                &mut *load,
                &mut key,
                &mut slot,
                Some(&ChangelogKey::Offset("usage").to_bytes()),
                Some(b"41")
            ),
            Some(8)
        );
        assert_eq!(
            apply(
                &mut *load,
                &mut key,
                &mut slot,
                Some(&ChangelogKey::Offset("usage").to_bytes()),
                Some(b"42")
            ),
            Some(8)
        );
        assert_eq!(
            slot.included,
            vec![("usage".to_string(), 42)],
            "only the latest included offset is kept"
        );
        assert_eq!(
            store.get_meta(&included_key("usage", 2)).unwrap(),
            None,
            "included offsets wait for the checkpoint"
        );
        slot.next = 4;
        slot.touched = true;
        let mut slots = [slot];
        checkpoint(&mut *load, &mut slots).unwrap();
        load.finish().unwrap();
        drop(load);
        assert_eq!(
            store.get_many(&[&namespaced(2, b"acme"), &namespaced(2, b"gone")]).unwrap(),
            vec![Some(b"7".to_vec()), None]
        );
        assert_eq!(store.get_meta(&included_key("usage", 2)).unwrap(), Some(b"42".to_vec()));
        assert_eq!(store.get_meta(&checkpoint_key(2)).unwrap(), Some(b"4".to_vec()));
        assert!(!slots[0].touched && slots[0].included.is_empty());
    }

    #[test]
    fn foreign_records_are_refused() {
        let store = MemoryStore::default();
        let mut load = store.bulk_load();
        let (mut key, mut slot) = (Vec::new(), restoring(0));
        assert!(apply(&mut *load, &mut key, &mut slot, Some(b"xkey"), Some(b"1")).is_none());
        assert!(apply(&mut *load, &mut key, &mut slot, None, Some(b"1")).is_none());
        assert!(
            apply(
                &mut *load,
                &mut key,
                &mut slot,
                Some(&ChangelogKey::Offset("usage").to_bytes()),
                Some(b"not a number")
            )
            .is_none()
        );
    }

    #[test]
    fn an_end_short_of_the_one_taken_up_front_is_not_the_end() {
        let mut slot = restoring(0);
        slot.next = 40;
        slot.ended_at(60); // a leader not caught up yet
        assert!(!slot.finished && slot.next == 40, "offsets 40 to 99 are still to read");
        slot.ended_at(100);
        assert!(
            slot.finished && slot.next == 100 && slot.touched,
            "read to its end: the checkpoint moves to it"
        );
    }

    #[test]
    fn offsets_to_go_count_only_unfinished_partitions() {
        let mut slots = [restoring(0), restoring(1)];
        slots[0].next = 40;
        assert_eq!(to_go(&slots), 160);
        slots[1].finished = true;
        assert_eq!(to_go(&slots), 60);
    }
}
