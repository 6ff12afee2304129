//! Restoring a Kafka job's RocksDB from its changelog (the format is in
//! [`crate::changelog`]): each partition from its checkpoint to its end,
//! through librdkafka's consumer or, opt-in, from the leaders directly.
//! The job's state updater (`job/state_updater.rs`) runs it on a thread
//! of its own, beside the processing of partitions already restored.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use super::QuietEof;
use super::changelog::{Restoring, apply, checkpoint, read_offset, to_go};
use super::fetch::{ConsumerQueue, FetchQueue, Fetched, Router};
use super::fetch_wire::{FetchAnswer, PartitionAnswer};
use super::keys::checkpoint_key;
use super::leader_fetch::{FetchSettings, LeaderConnection, LeaderError};
use super::record_batch::{self, BatchError, Batches, ReadCommitted};
use super::topics::{ADMIN_TIMEOUT, watermarks};
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
    #[error(
        "restoring from changelog `{topic}` stalled: nothing arrived from partition(s) {partitions:?} for {seconds} s \
             (kafka.restore_stall_ms); is the broker up?"
    )]
    Stuck {
        /// The topic.
        topic: String,
        /// The partitions not read to their end.
        partitions: Vec<i32>,
        /// The stall limit, in seconds.
        seconds: u64,
    },
    /// The changelog holds a record Tally did not write.
    #[error(
        "changelog `{topic}` partition {partition} offset {offset} holds a record Tally did not write; \
             the changelog topic must belong to this job alone"
    )]
    Foreign {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset.
        offset: i64,
    },
    /// The broker handed over changelog bytes that do not add up (their
    /// CRC or lengths): its copy of the changelog is damaged, or was
    /// damaged on the way (retry later; if it persists, the changelog
    /// partition must be repaired from a replica).
    #[error("changelog `{topic}` partition {partition}: {source}")]
    Corrupt {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// What does not add up.
        source: BatchError,
    },
    /// Writing the restored state failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// The restore was stopped before its end (its partitions were revoked,
    /// or the session is ending); what it read up to then is checkpointed.
    #[error(
        "restoring from changelog `{topic}` stopped: its partitions were revoked, or the job is stopping"
    )]
    Cancelled {
        /// The topic.
        topic: String,
    },
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
    /// Time until the last record was read: the rest of `elapsed` went to
    /// writing what the store still held.
    pub read: Duration,
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
    /// How to fetch from the partitions' leaders; `None`: the consumer
    /// reads everything.
    leader_fetch: Option<FetchSettings>,
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

impl Restorer {
    /// A restorer reading `topic` with `consumer` (a `read_committed`
    /// consumer with partition EOF events, see
    /// [`super::topics::restore_config`]) into `store`, reporting to
    /// `progress`, within `limits`; with `leader_fetch`, it fetches from
    /// the partitions' leaders itself and uses the consumer only for what
    /// that cannot read (see [`crate::leader_fetch`]).
    pub fn new(
        consumer: BaseConsumer<QuietEof>,
        store: Arc<dyn StateStore>,
        topic: String,
        limits: RestoreLimits,
        leader_fetch: Option<FetchSettings>,
        progress: Arc<RestoreProgress>,
    ) -> Restorer {
        Restorer {
            queue: ConsumerQueue::of(&consumer),
            consumer,
            store,
            topic,
            limits,
            leader_fetch,
            progress,
        }
    }

    /// The consumer, for reading the group's committed offsets.
    pub fn consumer(&self) -> &BaseConsumer<QuietEof> {
        &self.consumer
    }

    /// The changelog topic it restores from.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Which of `partitions` have changelog records past their checkpoint,
    /// each with its next offset to apply and its end (its last stable
    /// offset: `read_committed`), as the broker says now.
    pub(crate) fn to_read(&self, partitions: &[i32]) -> Result<Vec<Restoring>, RestoreError> {
        let kafka = |source| RestoreError::Kafka { topic: self.topic.clone(), source };
        let mut restoring = Vec::with_capacity(partitions.len());
        for &partition in partitions {
            let checkpoint = read_offset(&*self.store, &checkpoint_key(partition))?.unwrap_or(0);
            let (low, end) = watermarks(&self.consumer, &self.topic, partition).map_err(kafka)?;
            let next = checkpoint.max(low);
            if next < end {
                restoring.push(Restoring {
                    partition,
                    next,
                    end,
                    finished: false,
                    touched: false,
                    included: Vec::new(),
                });
            }
        }
        Ok(restoring)
    }

    /// Applies the changelog of `partitions` from each one's checkpoint to
    /// its end (its last stable offset: `read_committed`). The ends are
    /// asked of the broker first: a partition already restored is not read.
    /// Stops with [`RestoreError::Cancelled`] soon after `cancelled` says
    /// so, its progress checkpointed.
    pub fn restore(
        &self,
        partitions: &[i32],
        cancelled: &dyn Fn() -> bool,
    ) -> Result<RestoreReport, RestoreError> {
        let started = Instant::now();
        let cpu_at_start = process_cpu_time();
        let mut restoring = self.to_read(partitions)?;
        if restoring.is_empty() {
            return Ok(RestoreReport { elapsed: started.elapsed(), ..RestoreReport::default() });
        }
        self.drop_stale_events();
        let offsets = to_go(&restoring);
        tracing::info!(topic = %self.topic, partitions = ?restoring.iter().map(|slot| (slot.partition, slot.next, slot.end)).collect::<Vec<_>>(),
            to_go = offsets, "restoring state from the changelog: (partition, from, end) offsets");
        self.progress.start(offsets);
        let result = self.read_to_end(&mut restoring, started, cancelled);
        self.progress.finish();
        let mut report = result?;
        report.cpu = process_cpu_time().saturating_sub(cpu_at_start);
        let seconds = report.elapsed.as_secs_f64().max(1e-3);
        tracing::info!(
            topic = %self.topic, ?partitions, records = report.records, bytes = report.bytes, took_ms = report.elapsed.as_millis() as u64,
            read_ms = report.read.as_millis() as u64, cpu_ms = report.cpu.as_millis() as u64, records_per_second = (report.records as f64 / seconds).round(), "restored state from the changelog"
        );
        Ok(report)
    }

    /// Reads every partition of `restoring` to its end into a bulk load
    /// of the store: from the leaders where it can, the rest through the
    /// consumer.
    /// A restore stopped by `cancelled` keeps what it read: it ends with a
    /// checkpoint, as one read to the end does.
    fn read_to_end(
        &self,
        restoring: &mut [Restoring],
        started: Instant,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<RestoreReport, RestoreError> {
        let mut run = Run::new(self, cancelled);
        let result = self.read_all(&mut run, restoring);
        match result {
            Ok(()) => run.finish(restoring, started),
            Err(RestoreError::Cancelled { topic }) => {
                run.finish(restoring, started)?;
                Err(RestoreError::Cancelled { topic })
            }
            Err(err) => Err(err),
        }
    }

    fn read_all(&self, run: &mut Run<'_>, restoring: &mut [Restoring]) -> Result<(), RestoreError> {
        if let Some(settings) = &self.leader_fetch
            && let Some(why) = self.read_from_leaders(run, restoring, settings)?
        {
            tracing::warn!(topic = %self.topic, "restore: reading the rest of the changelog through librdkafka's consumer (slower): {why}");
        }
        if restoring.iter().any(|partition| !partition.finished) {
            self.read_from_consumer(run, restoring)?;
        }
        Ok(())
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

    /// Reads the unfinished partitions of `restoring` to their ends through
    /// the consumer, from each one's next offset.
    fn read_from_consumer(
        &self,
        run: &mut Run<'_>,
        restoring: &mut [Restoring],
    ) -> Result<(), RestoreError> {
        let kafka = |source| RestoreError::Kafka { topic: self.topic.clone(), source };
        let router = Arc::new(Router::default());
        let mut fetch = FetchQueue::open(&self.consumer, router.clone(), READ_BATCH);
        let mut assignment = TopicPartitionList::new();
        for partition in restoring.iter().filter(|partition| !partition.finished) {
            router.route(&self.consumer, &self.topic, partition.partition);
            assignment
                .add_partition_offset(
                    &self.topic,
                    partition.partition,
                    Offset::Offset(partition.next),
                )
                .map_err(kafka)?;
        }
        self.consumer.assign(&assignment).map_err(kafka)?;
        let result = self.consume_until_end(run, &mut fetch, restoring);
        let _ = self.consumer.unassign();
        drop(fetch);
        result
    }

    fn consume_until_end(
        &self,
        run: &mut Run<'_>,
        fetch: &mut FetchQueue<'_>,
        restoring: &mut [Restoring],
    ) -> Result<(), RestoreError> {
        let mut failure: Option<RestoreError> = None;
        let mut current = 0usize;
        while restoring.iter().any(|partition| !partition.finished) {
            let read = fetch.read(READ_WAIT, READ_BATCH, |item| {
                if failure.is_some() {
                    return;
                }
                let partition = match &item {
                    Fetched::Record(record) => record.partition(),
                    Fetched::End(_, partition, _) => *partition,
                    Fetched::Error(_, text) => {
                        failure = Some(RestoreError::Consumer {
                            topic: self.topic.clone(),
                            error: text.clone(),
                        });
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
                    Fetched::End(_, _, offset) => slot.ended_at(offset.unwrap_or(slot.next)),
                    // Past the end taken up front: not this restore's.
                    Fetched::Record(_) if slot.finished => {}
                    Fetched::Record(record) => {
                        match run.record(slot, record.offset(), record.key(), record.payload()) {
                            Ok(()) => slot.ended_at(slot.next),
                            Err(err) => failure = Some(err),
                        }
                    }
                    Fetched::Error(..) => {}
                }
            });
            if let Some(failure) = failure {
                return Err(failure);
            }
            run.step(restoring, read > 0)?;
        }
        Ok(())
    }

    /// Reads the unfinished partitions of `restoring` from their leaders
    /// until each is read to its end. Returns why it stopped early if the
    /// rest must be read through the consumer.
    fn read_from_leaders(
        &self,
        run: &mut Run<'_>,
        restoring: &mut [Restoring],
        settings: &FetchSettings,
    ) -> Result<Option<String>, RestoreError> {
        let mut leaders: Vec<Leader> = Vec::new();
        let mut turn = 0usize;
        // Each kind of failure is logged once per LOG_EVERY: a broker being
        // restarted fails every connection for seconds. Kinds apart: a
        // failed connection must not hide that a fetch failed after it.
        let mut last_warnings: [Option<Instant>; 2] = [None; 2];
        let mut warn = |kind: usize, what: &str, why: &str| {
            let last_warning = &mut last_warnings[kind];
            if last_warning.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
                tracing::warn!(topic = %self.topic, "restore: {what}: {why}");
                *last_warning = Some(Instant::now());
            }
        };
        while restoring.iter().any(|partition| !partition.finished) {
            let step = if leaders.is_empty() {
                self.connect_leaders(restoring, settings).map(|connected| {
                    leaders = connected;
                    false
                })
            } else {
                turn = turn.wrapping_add(1);
                self.fetch_from_leaders(run, restoring, &mut leaders, settings, turn)
            };
            match step {
                Ok(arrived) => run.step(restoring, arrived)?,
                Err(Interrupted::Retry(why)) => {
                    let (kind, what) = if leaders.is_empty() {
                        (0, "connecting to the changelog's leaders failed, retrying")
                    } else {
                        (1, "fetching from the changelog's leaders failed, connecting again")
                    };
                    warn(kind, what, &why);
                    leaders.clear();
                    std::thread::sleep(RECONNECT_BACKOFF);
                    run.step(restoring, false)?;
                }
                Err(Interrupted::Fallback(why)) => return Ok(Some(why)),
                Err(Interrupted::Failed(err)) => return Err(err),
            }
        }
        Ok(None)
    }

    /// Connects to the leader of each unfinished partition (the cluster's
    /// metadata, from the consumer, says who leads).
    fn connect_leaders(
        &self,
        restoring: &[Restoring],
        settings: &FetchSettings,
    ) -> Result<Vec<Leader>, Interrupted> {
        let metadata =
            self.consumer.fetch_metadata(Some(&self.topic), ADMIN_TIMEOUT).map_err(|err| {
                Interrupted::Retry(format!("asking the cluster's metadata failed: {err}"))
            })?;
        let topic = metadata.topics().iter().find(|topic| topic.name() == self.topic);
        let mut leaders: Vec<Leader> = Vec::new();
        for (slot, partition) in
            restoring.iter().enumerate().filter(|(_, partition)| !partition.finished)
        {
            let leader = topic
                .and_then(|topic| {
                    topic.partitions().iter().find(|found| found.id() == partition.partition)
                })
                .map(|found| found.leader());
            let broker = leader
                .and_then(|leader| metadata.brokers().iter().find(|broker| broker.id() == leader));
            let Some(broker) = broker else {
                return Err(Interrupted::Retry(format!(
                    "partition {} has no leader the metadata names",
                    partition.partition
                )));
            };
            match leaders.iter_mut().find(|known| known.id == broker.id()) {
                Some(known) => known.slots.push(slot),
                None => {
                    let address = format!("{}:{}", broker.host(), broker.port());
                    let connection = LeaderConnection::connect(&address, settings, CONNECT_TIMEOUT)
                        .map_err(Interrupted::from_leader)?;
                    leaders.push(Leader {
                        id: broker.id(),
                        connection,
                        slots: vec![slot],
                        fetches: 0,
                        heard: false,
                    });
                }
            }
        }
        Ok(leaders)
    }

    /// One step of reading from the leaders: a fetch sent to each leader
    /// with none in flight, and one answer, if it comes soon, applied; the
    /// leader's next fetch is sent before the answer is applied, so the
    /// broker reads while this thread writes (a broker throttling a quota
    /// holds the next request until the throttle ends, KIP-219). Returns
    /// whether anything arrived (records, markers, an end).
    fn fetch_from_leaders(
        &self,
        run: &mut Run<'_>,
        restoring: &mut [Restoring],
        leaders: &mut [Leader],
        settings: &FetchSettings,
        turn: usize,
    ) -> Result<bool, Interrupted> {
        for leader in leaders.iter_mut().filter(|leader| !leader.connection.is_fetching()) {
            let wanted = leader.fetch_list(restoring, &[]);
            if !wanted.is_empty() {
                leader
                    .connection
                    .send_fetch(&self.topic, &wanted, settings)
                    .map_err(Interrupted::from_leader)?;
            }
        }
        let fetching = leaders.iter().filter(|leader| leader.connection.is_fetching()).count();
        let Some(leader) = leaders
            .iter_mut()
            .filter(|leader| leader.connection.is_fetching())
            .nth(turn % fetching.max(1))
        else {
            return Ok(false);
        };
        let Some(answer) =
            leader.connection.receive_fetch(LEADER_WAIT).map_err(Interrupted::from_leader)?
        else {
            return Ok(leader.connection.partial_progress(PARTIAL_PROGRESS));
        };
        let read = answer.read().map_err(|err| {
            Interrupted::Fallback(format!("broker {} {err}", leader.connection.broker()))
        });
        let arrived =
            read.and_then(|read| self.apply_fetch_answer(run, restoring, leader, &read, settings));
        leader.connection.reuse(answer);
        if matches!(arrived, Ok(true)) && !leader.heard {
            leader.heard = true;
            tracing::info!(topic = %self.topic, broker = leader.id,
                "restore: records arriving from the leader at {}", leader.connection.broker());
        }
        arrived
    }

    /// Applies what a fetch answer from `leader` holds; sends the leader's
    /// next fetch first, from where the answer leaves each partition.
    fn apply_fetch_answer(
        &self,
        run: &mut Run<'_>,
        restoring: &mut [Restoring],
        leader: &mut Leader,
        read: &FetchAnswer<'_>,
        settings: &FetchSettings,
    ) -> Result<bool, Interrupted> {
        if read.error_code != 0 {
            return Err(Interrupted::Retry(format!(
                "broker {} answered a fetch with error code {}",
                leader.connection.broker(),
                read.error_code
            )));
        }
        // Where each partition stands after this answer, from its batch
        // headers alone.
        let mut answers: Vec<Answer<'_>> = Vec::new();
        for data in read.partitions.iter().filter(|data| data.topic == self.topic.as_bytes()) {
            let Some(slot) = leader
                .slots
                .iter()
                .copied()
                .find(|&slot| restoring[slot].partition == data.partition)
            else {
                continue;
            };
            match data.error_code {
                0 => {}
                code if RETRIABLE_PARTITION_ERRORS.contains(&code) => {
                    return Err(Interrupted::Retry(format!(
                        "partition {} answered with error code {code}",
                        data.partition
                    )));
                }
                code => {
                    return Err(Interrupted::Fallback(format!(
                        "partition {} answered with error code {code}",
                        data.partition
                    )));
                }
            }
            let partition = &restoring[slot];
            let next = record_batch::next_offset_after(data.records)
                .map_or(partition.next, |next| next.max(partition.next));
            // Read to the end taken up front. Nothing less is an end: a
            // leader answering with less (newly elected, not caught up)
            // has more to come (see docs/kafka-mode.md, "Restoring state").
            answers.push(Answer { slot, data, next, finished: next >= partition.end });
        }
        let next_fetch = leader.fetch_list(restoring, &answers);
        if !next_fetch.is_empty() {
            leader
                .connection
                .send_fetch(&self.topic, &next_fetch, settings)
                .map_err(Interrupted::from_leader)?;
        }
        let mut arrived = false;
        for answer in &answers {
            let slot = &mut restoring[answer.slot];
            arrived |= self.apply_answer(run, slot, answer.data)?;
            slot.advance_to(answer.next);
            if answer.finished {
                slot.finish();
                arrived = true;
            }
        }
        Ok(arrived)
    }

    /// Applies one partition's part of a fetch answer: the records a
    /// `read_committed` consumer would be handed. Returns whether it moved
    /// the partition on (a broker sending what was read already is not
    /// progress, for the stall limit).
    fn apply_answer(
        &self,
        run: &mut Run<'_>,
        slot: &mut Restoring,
        data: &PartitionAnswer<'_>,
    ) -> Result<bool, Interrupted> {
        let mut filter = ReadCommitted::new(data.aborted.iter().copied());
        let before = slot.next;
        let partition = slot.partition;
        let batch_error = |err: BatchError| match err {
            BatchError::Unsupported { .. } => {
                Interrupted::Fallback(format!("changelog partition {partition}: {err}"))
            }
            BatchError::Corrupt { .. } => Interrupted::Failed(RestoreError::Corrupt {
                topic: self.topic.clone(),
                partition,
                source: err,
            }),
        };
        for batch in Batches::new(data.records) {
            let batch = batch.map_err(batch_error)?;
            if filter.keeps(&batch).map_err(batch_error)? {
                for record in batch.records().map_err(batch_error)? {
                    let record = record.map_err(batch_error)?;
                    if record.offset >= slot.next {
                        run.record(slot, record.offset, record.key, record.value)
                            .map_err(Interrupted::Failed)?;
                    }
                }
            }
            slot.advance_to(batch.last_offset().saturating_add(1));
        }
        Ok(slot.next > before)
    }
}

/// How long one wait for a leader's answer lasts before the restore looks
/// at its clock (progress, stall limit).
const LEADER_WAIT: Duration = Duration::from_millis(100);
/// Bytes of an answer still arriving that count as progress for the
/// stall limit (a 64 MiB answer on a slow link takes a while; a broker
/// trickling bytes does not keep a restore alive).
const PARTIAL_PROGRESS: usize = 64 << 10;
/// How long connecting to a leader (and asking its API versions) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before connecting to the leaders again after a failure.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(200);
/// Partition errors after which the leaders are looked up again: the
/// leader moved or is not ready (Kafka's error codes 3, 5, 6, 9, 56, 74,
/// 75, 78). Any other makes the consumer read the rest, as it always did.
const RETRIABLE_PARTITION_ERRORS: &[i16] = &[3, 5, 6, 9, 56, 74, 75, 78];

/// Why reading from the leaders stopped.
enum Interrupted {
    /// Connect again (after a pause); the stall limit still applies.
    Retry(String),
    /// Read the rest through the consumer.
    Fallback(String),
    /// The restore fails.
    Failed(RestoreError),
}

impl Interrupted {
    fn from_leader(err: LeaderError) -> Interrupted {
        if err.is_retriable() {
            Interrupted::Retry(err.to_string())
        } else {
            Interrupted::Fallback(err.to_string())
        }
    }
}

/// A connection to a leader, and the partitions it leads.
struct Leader {
    id: i32,
    connection: LeaderConnection,
    /// Indexes into the restore's partitions.
    slots: Vec<usize>,
    /// Fetches sent to it: rotates the order of its partitions.
    fetches: usize,
    /// Whether records have arrived from it on this connection (said once
    /// in the log: an operator, and the broker-restart test, see the
    /// restore reading).
    heard: bool,
}

impl Leader {
    /// The partitions it leads that are left to read once `answers` are
    /// applied, each with its next offset, in an order rotated by one
    /// place each time (a broker answers the first partition with data
    /// whatever its size: each gets to be first in turn).
    fn fetch_list(&mut self, restoring: &[Restoring], answers: &[Answer<'_>]) -> Vec<(i32, i64)> {
        let mut list: Vec<(i32, i64)> = Vec::with_capacity(self.slots.len());
        for &slot in &self.slots {
            let partition = &restoring[slot];
            match answers.iter().find(|answer| answer.slot == slot) {
                _ if partition.finished => {}
                Some(answer) if answer.finished => {}
                Some(answer) => list.push((partition.partition, answer.next)),
                None => list.push((partition.partition, partition.next)),
            }
        }
        if !list.is_empty() {
            self.fetches = self.fetches.wrapping_add(1);
            let by = self.fetches % list.len();
            list.rotate_left(by);
        }
        list
    }
}

/// One partition's part of a fetch answer, and where it leaves the partition.
struct Answer<'r> {
    /// Index into the restore's partitions.
    slot: usize,
    data: &'r PartitionAnswer<'r>,
    /// The offset after the answer's last whole batch.
    next: i64,
    /// Whether the partition is read to its end with it.
    finished: bool,
}

/// One restore's writes and bookkeeping, whichever way it reads.
struct Run<'r> {
    restorer: &'r Restorer,
    load: Box<dyn BulkLoad + 'r>,
    report: RestoreReport,
    /// The state key being built (reused).
    key: Vec<u8>,
    last_arrival: Instant,
    last_log: Instant,
    last_publish: Instant,
    durable: u64,
    /// Whether to stop before the end.
    cancelled: &'r dyn Fn() -> bool,
}

impl<'r> Run<'r> {
    fn new(restorer: &'r Restorer, cancelled: &'r dyn Fn() -> bool) -> Run<'r> {
        let now = Instant::now();
        Run {
            restorer,
            cancelled,
            load: restorer.store.bulk_load(),
            report: RestoreReport::default(),
            key: Vec::new(),
            last_arrival: now,
            last_log: now,
            last_publish: now,
            durable: 0,
        }
    }

    /// Loads one changelog record of `slot`'s partition.
    fn record(
        &mut self,
        slot: &mut Restoring,
        offset: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Result<(), RestoreError> {
        match apply(&mut *self.load, &mut self.key, slot, key, value) {
            Some(bytes) => {
                self.report.records += 1;
                self.report.bytes += bytes as u64;
                slot.next = offset.saturating_add(1);
                slot.touched = true;
                Ok(())
            }
            None => Err(RestoreError::Foreign {
                topic: self.restorer.topic.clone(),
                partition: slot.partition,
                offset,
            }),
        }
    }

    /// After each read (`arrived`: it brought something): stops a
    /// cancelled restore, fails a stalled one, checkpoints every
    /// `checkpoint_bytes`, publishes and logs progress.
    fn step(&mut self, restoring: &mut [Restoring], arrived: bool) -> Result<(), RestoreError> {
        let (topic, limits, progress) =
            (&self.restorer.topic, &self.restorer.limits, &self.restorer.progress);
        if (self.cancelled)() {
            return Err(RestoreError::Cancelled { topic: topic.clone() });
        }
        if arrived {
            self.last_arrival = Instant::now();
        } else if self.last_arrival.elapsed() >= limits.stall {
            return Err(RestoreError::Stuck {
                topic: topic.clone(),
                partitions: restoring
                    .iter()
                    .filter(|partition| !partition.finished)
                    .map(|partition| partition.partition)
                    .collect(),
                seconds: limits.stall.as_secs(),
            });
        }
        if self.load.buffered_bytes() as u64 >= limits.checkpoint_bytes {
            checkpoint(&mut *self.load, restoring)?;
        }
        if self.load.durable_checkpoints() > self.durable {
            self.durable = self.load.durable_checkpoints();
            tracing::info!(%topic, checkpoints = self.durable, "restore checkpoint: what is restored up to it survives a crash");
        }
        if self.last_publish.elapsed() >= PUBLISH_EVERY {
            progress.advance(self.report.records, to_go(restoring));
            self.last_publish = Instant::now();
        }
        if self.last_log.elapsed() >= LOG_EVERY {
            if let Some(snapshot) = progress.snapshot() {
                tracing::info!(%topic, records = self.report.records, to_go = snapshot.records_to_go,
                    records_per_second = snapshot.records_per_second.round(), seconds_left = snapshot.seconds_left.map(|s| (s * 10.0).round() / 10.0),
                    "restoring state from the changelog: {snapshot}");
            }
            self.last_log = Instant::now();
        }
        Ok(())
    }

    /// The last checkpoint, once every partition is read to its end; waits
    /// until the load is durable.
    fn finish(
        mut self,
        restoring: &mut [Restoring],
        started: Instant,
    ) -> Result<RestoreReport, RestoreError> {
        self.report.read = started.elapsed();
        checkpoint(&mut *self.load, restoring)?;
        self.load.finish()?;
        self.report.elapsed = started.elapsed();
        Ok(self.report)
    }
}
