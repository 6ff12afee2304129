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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::fetch::ConsumerQueue;
use super::keys::{checkpoint_key, included_key, namespaced, ChangelogKey};
use super::QuietEof;
use tally_core::state::{StateError, StateStore, StoreCommit};

/// Records applied to RocksDB per write while restoring.
const RESTORE_CHUNK: usize = 10_000;
/// How often restore progress is logged.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// Most stale events a restore serves before it starts.
const MAX_STALE_EVENTS: usize = 10_000;

/// Reads a decimal offset stored under `key`.
pub fn read_offset(store: &dyn StateStore, key: &[u8]) -> Result<Option<i64>, StateError> {
    match store.get_meta(key)? {
        None => Ok(None),
        Some(bytes) => std::str::from_utf8(&bytes).ok().and_then(|text| text.parse().ok()).map(Some).ok_or_else(|| {
            StateError::Damaged { what: format!("metadata `{}` is not an offset", String::from_utf8_lossy(key)) }
        }),
    }
}

/// A failed restore.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// Reading the changelog failed (retry later).
    #[error("restoring from changelog `{topic}` failed: {source}")]
    Kafka {
        /// The topic.
        topic: String,
        /// Why.
        source: KafkaError,
    },
    /// The changelog did not reach its end in time (retry later).
    #[error("restoring from changelog `{topic}` did not reach the end of partition(s) {partitions:?} within {seconds} s")]
    Stuck {
        /// The topic.
        topic: String,
        /// The partitions.
        partitions: Vec<i32>,
        /// How long, in seconds.
        seconds: u64,
    },
    /// The changelog holds a record Tally did not write.
    #[error("changelog `{topic}` partition {partition} offset {offset} holds a record Tally did not write; \
             the changelog topic must belong to this job alone")]
    Foreign {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset.
        offset: i64,
    },
    /// Writing the restored state failed.
    #[error(transparent)]
    State(#[from] StateError),
}

/// What a restore did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Changelog records applied.
    pub records: u64,
    /// Time it took.
    pub elapsed: Duration,
}

/// Rebuilds RocksDB state from the changelog topic.
pub struct Restorer {
    /// Declared before `consumer`, so it is released first.
    queue: ConsumerQueue,
    consumer: BaseConsumer<QuietEof>,
    store: Arc<dyn StateStore>,
    topic: String,
    timeout: Duration,
}

impl Restorer {
    /// A restorer reading `topic` with `consumer` (a `read_committed`
    /// consumer with partition EOF events, see
    /// [`super::topics::restore_config`]) into `store`; a restore that has
    /// not reached the end after `timeout` fails.
    pub fn new(consumer: BaseConsumer<QuietEof>, store: Arc<dyn StateStore>, topic: String, timeout: Duration) -> Restorer {
        Restorer { queue: ConsumerQueue::of(&consumer), consumer, store, topic, timeout }
    }

    /// The consumer, for reading the group's committed offsets.
    pub fn consumer(&self) -> &BaseConsumer<QuietEof> {
        &self.consumer
    }

    /// The changelog topic it restores from.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Applies the changelog of `partitions` from each one's checkpoint to
    /// its end (its last stable offset: `read_committed`).
    pub fn restore(&self, partitions: &[i32]) -> Result<RestoreReport, RestoreError> {
        let started = Instant::now();
        let kafka = |source| RestoreError::Kafka { topic: self.topic.clone(), source };
        let mut assignment = TopicPartitionList::new();
        let mut next: BTreeMap<i32, i64> = BTreeMap::new();
        for &partition in partitions {
            let from = read_offset(&*self.store, &checkpoint_key(partition))?.unwrap_or(0);
            next.insert(partition, from);
            assignment.add_partition_offset(&self.topic, partition, Offset::Offset(from)).map_err(kafka)?;
        }
        self.drop_stale_events();
        self.consumer.assign(&assignment).map_err(kafka)?;
        let result = self.apply_until_end(next, started);
        let _ = self.consumer.unassign();
        let report = result?;
        tracing::info!(topic = %self.topic, ?partitions, records = report.records, took_ms = report.elapsed.as_millis() as u64, "restored state from the changelog");
        Ok(report)
    }

    /// Serves what the consumer queued while no restore ran (the restorer
    /// lives as long as its job): errors of a broker outage long over, each
    /// already logged, and log lines. A restore fails only on what happens
    /// during it.
    fn drop_stale_events(&self) {
        // A zero-timeout poll serves one event; log lines may keep coming.
        for _ in 0..MAX_STALE_EVENTS {
            if !self.queue.has_events() {
                break;
            }
            let _ = self.consumer.poll(Duration::ZERO);
        }
    }

    fn apply_until_end(&self, mut next: BTreeMap<i32, i64>, started: Instant) -> Result<RestoreReport, RestoreError> {
        let mut unfinished: std::collections::BTreeSet<i32> = next.keys().copied().collect();
        let mut chunk = StoreCommit::default();
        let mut touched = std::collections::BTreeSet::new();
        let mut records = 0u64;
        let mut last_progress = Instant::now();
        while !unfinished.is_empty() {
            if started.elapsed() > self.timeout {
                return Err(RestoreError::Stuck {
                    topic: self.topic.clone(),
                    partitions: unfinished.into_iter().collect(),
                    seconds: self.timeout.as_secs(),
                });
            }
            match self.consumer.poll(Duration::from_millis(200)) {
                None => continue,
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    unfinished.remove(&partition);
                }
                Some(Err(err)) => return Err(RestoreError::Kafka { topic: self.topic.clone(), source: err }),
                Some(Ok(record)) => {
                    let partition = record.partition();
                    apply(&mut chunk, partition, record.key(), record.payload()).ok_or_else(|| RestoreError::Foreign {
                        topic: self.topic.clone(),
                        partition,
                        offset: record.offset(),
                    })?;
                    next.insert(partition, record.offset() + 1);
                    touched.insert(partition);
                    records += 1;
                    if chunk.state.len() + chunk.meta.len() >= RESTORE_CHUNK {
                        self.write(&mut chunk, &mut touched, &next)?;
                    }
                    if last_progress.elapsed() >= PROGRESS_EVERY {
                        tracing::info!(topic = %self.topic, records, remaining_partitions = ?unfinished, "restoring state from the changelog");
                        last_progress = Instant::now();
                    }
                }
            }
        }
        self.write(&mut chunk, &mut touched, &next)?;
        Ok(RestoreReport { records, elapsed: started.elapsed() })
    }

    /// Writes a chunk of restored records with the checkpoints of the
    /// partitions they came from.
    fn write(&self, chunk: &mut StoreCommit, touched: &mut std::collections::BTreeSet<i32>, next: &BTreeMap<i32, i64>) -> Result<(), StateError> {
        if touched.is_empty() {
            return Ok(());
        }
        for partition in std::mem::take(touched) {
            chunk.meta.push((checkpoint_key(partition), next[&partition].to_string().into_bytes()));
        }
        self.store.commit(std::mem::take(chunk))
    }
}

/// Adds one changelog record of `partition` to `chunk`; `None` if it is not
/// a record Tally writes.
fn apply(chunk: &mut StoreCommit, partition: i32, key: Option<&[u8]>, value: Option<&[u8]>) -> Option<()> {
    match ChangelogKey::parse(key?)? {
        ChangelogKey::State(key) => chunk.state.push((namespaced(partition, key), value.map(<[u8]>::to_vec))),
        ChangelogKey::Offset(topic) => {
            let offset: i64 = std::str::from_utf8(value?).ok()?.parse().ok()?;
            chunk.meta.push((included_key(topic, partition), offset.to_string().into_bytes()));
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_restore_into_their_partitions_namespace() {
        let mut chunk = StoreCommit::default();
        apply(&mut chunk, 2, Some(&ChangelogKey::State(b"acme").to_bytes()), Some(b"7")).unwrap();
        apply(&mut chunk, 2, Some(&ChangelogKey::State(b"gone").to_bytes()), None).unwrap();
        apply(&mut chunk, 2, Some(&ChangelogKey::Offset("usage").to_bytes()), Some(b"42")).unwrap();
        let mut acme = crate::keys::namespace(2).to_vec();
        acme.extend_from_slice(b"acme");
        let mut gone = crate::keys::namespace(2).to_vec();
        gone.extend_from_slice(b"gone");
        assert_eq!(chunk.state, vec![(acme, Some(b"7".to_vec())), (gone, None)]);
        assert_eq!(chunk.meta, vec![(included_key("usage", 2), b"42".to_vec())]);
    }

    #[test]
    fn foreign_records_are_refused() {
        let mut chunk = StoreCommit::default();
        assert!(apply(&mut chunk, 0, Some(b"xkey"), Some(b"1")).is_none());
        assert!(apply(&mut chunk, 0, None, Some(b"1")).is_none());
        assert!(apply(&mut chunk, 0, Some(&ChangelogKey::Offset("usage").to_bytes()), Some(b"not a number")).is_none());
    }
}
