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

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use super::fetch::{ConsumerQueue, FetchQueue, Fetched, Router};
use super::keys::{checkpoint_key, included_key, namespace, ChangelogKey};
use super::QuietEof;
use tally_core::observe::RestoreProgress;
use tally_core::state::{BulkLoad, StateError, StateStore};

/// Most changelog records handed over by one read of the fetch queue.
const READ_BATCH: usize = 10_000;
/// Longest one read waits for its batch to fill; reads until the
/// partitions' ends are not slowed by it, the last one is.
const READ_WAIT: Duration = Duration::from_millis(5);
/// How often restore progress is published (status, metrics).
const PUBLISH_EVERY: Duration = Duration::from_millis(200);
/// How often restore progress is logged.
const LOG_EVERY: Duration = Duration::from_secs(2);
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
    /// The consumer reported an error while reading the changelog (retry later).
    #[error("restoring from changelog `{topic}` failed: {error}")]
    Consumer {
        /// The topic.
        topic: String,
        /// librdkafka's words.
        error: String,
    },
    /// Neither a record nor a partition's end arrived for the stall limit
    /// (retry later; a slow restore that makes progress never fails).
    #[error("restoring from changelog `{topic}` stalled: nothing arrived from partition(s) {partitions:?} for {seconds} s \
             (kafka.restore_stall_ms); is the broker up?")]
    Stuck {
        /// The topic.
        topic: String,
        /// The partitions not read to their end.
        partitions: Vec<i32>,
        /// The stall limit, in seconds.
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
    /// Bytes of their keys and values.
    pub bytes: u64,
    /// Time it took.
    pub elapsed: Duration,
    /// CPU time the whole process used meanwhile (librdkafka's and
    /// RocksDB's threads too).
    pub cpu: Duration,
}

/// CPU time this process has used so far (every thread).
fn process_cpu_time() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid place to write a timespec to.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Rebuilds RocksDB state from the changelog topic.
pub struct Restorer {
    /// Declared before `consumer`, so it is released first.
    queue: ConsumerQueue,
    consumer: BaseConsumer<QuietEof>,
    store: Arc<dyn StateStore>,
    topic: String,
    limits: RestoreLimits,
    progress: Arc<RestoreProgress>,
}

/// How a restore is bounded.
#[derive(Debug, Clone, Copy)]
pub struct RestoreLimits {
    /// A restore fails when neither a record nor a partition's end arrives
    /// for this long.
    pub stall: Duration,
    /// Bytes of keys and values applied between two checkpoints.
    pub checkpoint_bytes: u64,
}

/// One partition being restored.
struct Restoring {
    partition: i32,
    /// Next changelog offset to apply.
    next: i64,
    /// The partition's end when the restore began (its last stable offset).
    end: i64,
    /// Read to its end.
    finished: bool,
    /// Applied records since the last checkpoint.
    touched: bool,
    /// Latest included offset per input topic read since the last
    /// checkpoint (written with the checkpoint).
    included: Vec<(String, i64)>,
}

impl Restorer {
    /// A restorer reading `topic` with `consumer` (a `read_committed`
    /// consumer with partition EOF events, see
    /// [`super::topics::restore_config`]) into `store`, reporting to
    /// `progress`, within `limits`.
    pub fn new(consumer: BaseConsumer<QuietEof>, store: Arc<dyn StateStore>, topic: String, limits: RestoreLimits, progress: Arc<RestoreProgress>) -> Restorer {
        Restorer { queue: ConsumerQueue::of(&consumer), consumer, store, topic, limits, progress }
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
    /// its end (its last stable offset: `read_committed`). The ends are
    /// asked of the broker first: a partition already restored is not read.
    pub fn restore(&self, partitions: &[i32]) -> Result<RestoreReport, RestoreError> {
        let started = Instant::now();
        let cpu_at_start = process_cpu_time();
        let kafka = |source| RestoreError::Kafka { topic: self.topic.clone(), source };
        let mut restoring = Vec::with_capacity(partitions.len());
        for &partition in partitions {
            let checkpoint = read_offset(&*self.store, &checkpoint_key(partition))?.unwrap_or(0);
            let (low, end) = self.consumer.fetch_watermarks(&self.topic, partition, super::topics::ADMIN_TIMEOUT).map_err(kafka)?;
            let next = checkpoint.max(low);
            if next < end {
                restoring.push(Restoring { partition, next, end, finished: false, touched: false, included: Vec::new() });
            }
        }
        if restoring.is_empty() {
            return Ok(RestoreReport { elapsed: started.elapsed(), ..RestoreReport::default() });
        }
        self.drop_stale_events();
        let router = Arc::new(Router::default());
        let mut fetch = FetchQueue::open(&self.consumer, router.clone(), READ_BATCH);
        let mut assignment = TopicPartitionList::new();
        for partition in &restoring {
            router.route(&self.consumer, &self.topic, partition.partition);
            assignment.add_partition_offset(&self.topic, partition.partition, Offset::Offset(partition.next)).map_err(kafka)?;
        }
        self.consumer.assign(&assignment).map_err(kafka)?;
        let offsets = to_go(&restoring);
        tracing::info!(topic = %self.topic, partitions = ?restoring.iter().map(|slot| (slot.partition, slot.next, slot.end)).collect::<Vec<_>>(),
            to_go = offsets, "restoring state from the changelog: (partition, from, end) offsets");
        self.progress.start(offsets);
        let result = self.apply_until_end(&mut fetch, &mut restoring, started);
        self.progress.finish();
        let _ = self.consumer.unassign();
        drop(fetch);
        let mut report = result?;
        report.cpu = process_cpu_time().saturating_sub(cpu_at_start);
        let seconds = report.elapsed.as_secs_f64().max(1e-3);
        tracing::info!(
            topic = %self.topic, ?partitions, records = report.records, bytes = report.bytes, took_ms = report.elapsed.as_millis() as u64,
            cpu_ms = report.cpu.as_millis() as u64, records_per_second = (report.records as f64 / seconds).round(), "restored state from the changelog"
        );
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

    /// Reads the assigned partitions to their ends into a bulk load of the
    /// store, checkpointing every `checkpoint_bytes` and at the end.
    fn apply_until_end(&self, fetch: &mut FetchQueue<'_>, restoring: &mut [Restoring], started: Instant) -> Result<RestoreReport, RestoreError> {
        let mut load = self.store.bulk_load();
        let mut report = RestoreReport::default();
        let mut key = Vec::new();
        let mut last_arrival = Instant::now();
        let mut last_log = Instant::now();
        let mut last_publish = Instant::now();
        let mut failure: Option<RestoreError> = None;
        let mut current = 0usize;
        let mut durable = 0;
        while restoring.iter().any(|partition| !partition.finished) {
            let read = fetch.read(READ_WAIT, READ_BATCH, |item| {
                if failure.is_some() {
                    return;
                }
                let partition = match &item {
                    Fetched::Record(record) => record.partition(),
                    Fetched::End(_, partition) => *partition,
                    Fetched::Error(_, text) => {
                        failure = Some(RestoreError::Consumer { topic: self.topic.clone(), error: text.clone() });
                        return;
                    }
                };
                if restoring[current].partition != partition {
                    match restoring.iter().position(|restoring| restoring.partition == partition) {
                        Some(found) => current = found,
                        None => return, // not assigned by this restore
                    }
                }
                let slot = &mut restoring[current];
                match item {
                    // Every offset before the end taken up front is read
                    // (or was a transaction marker, or aborted): the
                    // checkpoint may skip them all.
                    Fetched::End(..) => {
                        slot.finished = true;
                        slot.touched |= slot.next < slot.end;
                        slot.next = slot.next.max(slot.end);
                    }
                    Fetched::Record(record) => {
                        let offset = record.offset();
                        match apply(&mut *load, &mut key, slot, record.key(), record.payload()) {
                            Some(bytes) => {
                                report.records += 1;
                                report.bytes += bytes as u64;
                                slot.next = offset + 1;
                                slot.touched = true;
                            }
                            None => failure = Some(RestoreError::Foreign { topic: self.topic.clone(), partition, offset }),
                        }
                    }
                    Fetched::Error(..) => {}
                }
            });
            if let Some(failure) = failure {
                return Err(failure);
            }
            if read > 0 {
                last_arrival = Instant::now();
            } else if last_arrival.elapsed() >= self.limits.stall {
                return Err(RestoreError::Stuck {
                    topic: self.topic.clone(),
                    partitions: restoring.iter().filter(|partition| !partition.finished).map(|partition| partition.partition).collect(),
                    seconds: self.limits.stall.as_secs(),
                });
            }
            if load.buffered_bytes() as u64 >= self.limits.checkpoint_bytes {
                checkpoint(&mut *load, restoring)?;
            }
            if load.durable_checkpoints() > durable {
                durable = load.durable_checkpoints();
                tracing::info!(topic = %self.topic, checkpoints = durable, "restore checkpoint: what is restored up to it survives a crash");
            }
            if last_publish.elapsed() >= PUBLISH_EVERY {
                self.progress.advance(report.records, to_go(restoring));
                last_publish = Instant::now();
            }
            if last_log.elapsed() >= LOG_EVERY {
                if let Some(snapshot) = self.progress.snapshot() {
                    tracing::info!(topic = %self.topic, records = report.records, to_go = snapshot.records_to_go,
                        records_per_second = snapshot.records_per_second.round(), seconds_left = snapshot.seconds_left.map(|s| (s * 10.0).round() / 10.0),
                        "restoring state from the changelog: {snapshot}");
                }
                last_log = Instant::now();
            }
        }
        checkpoint(&mut *load, restoring)?;
        load.finish()?;
        report.elapsed = started.elapsed();
        Ok(report)
    }
}

/// Offsets left to read in `restoring`.
fn to_go(restoring: &[Restoring]) -> u64 {
    restoring.iter().filter(|partition| !partition.finished).map(|partition| (partition.end - partition.next).max(0) as u64).sum()
}

/// Makes the restore durable up to each partition's next offset: the
/// applied writes first, then the checkpoints and included offsets.
fn checkpoint(load: &mut dyn BulkLoad, restoring: &mut [Restoring]) -> Result<(), StateError> {
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
fn apply(load: &mut dyn BulkLoad, key: &mut Vec<u8>, slot: &mut Restoring, record_key: Option<&[u8]>, value: Option<&[u8]>) -> Option<usize> {
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
        Restoring { partition, next: 0, end: 100, finished: false, touched: false, included: Vec::new() }
    }

    #[test]
    fn records_restore_into_their_partitions_namespace_and_checkpoint_with_their_offsets() {
        let store = MemoryStore::default();
        let mut load = store.bulk_load();
        let (mut key, mut slot) = (Vec::new(), restoring(2));
        assert_eq!(apply(&mut *load, &mut key, &mut slot, Some(&ChangelogKey::State(b"acme").to_bytes()), Some(b"7")), Some(6));
        assert_eq!(apply(&mut *load, &mut key, &mut slot, Some(&ChangelogKey::State(b"gone").to_bytes()), None), Some(5));
        assert_eq!(apply(&mut *load, &mut key, &mut slot, Some(&ChangelogKey::Offset("usage").to_bytes()), Some(b"41")), Some(8));
        assert_eq!(apply(&mut *load, &mut key, &mut slot, Some(&ChangelogKey::Offset("usage").to_bytes()), Some(b"42")), Some(8));
        assert_eq!(slot.included, vec![("usage".to_string(), 42)], "only the latest included offset is kept");
        assert_eq!(store.get_meta(&included_key("usage", 2)).unwrap(), None, "included offsets wait for the checkpoint");
        slot.next = 4;
        slot.touched = true;
        let mut slots = [slot];
        checkpoint(&mut *load, &mut slots).unwrap();
        load.finish().unwrap();
        drop(load);
        assert_eq!(store.get_many(&[&namespaced(2, b"acme"), &namespaced(2, b"gone")]).unwrap(), vec![Some(b"7".to_vec()), None]);
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
        assert!(apply(&mut *load, &mut key, &mut slot, Some(&ChangelogKey::Offset("usage").to_bytes()), Some(b"not a number")).is_none());
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
