//! The Kafka job loop: consume, run the plugin, commit on the interval;
//! restore state when partitions arrive, abort the in-flight transaction
//! before partitions leave, and rebuild the clients when Kafka fails.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::changelog::{checkpoint_key, included_key, read_offset, RestoreError, Restorer};
use super::committer::{
    classify, Addresses, DeliveryTracker, JobProducer, KafkaCommitError, KafkaCommitter, Recovery, MAX_KAFKA_VALUE_BYTES,
};
use super::fetch::{FetchQueue, Fetched, FetchedRecord, Router};
use super::topics::{self, TopicLayout};
use super::{namespace, source_id, split_source_id, KafkaJobError, QuietEof};
use crate::config::{Guarantee, JobConfig, KafkaConfig};
use crate::lock::DirLock;
use crate::batch::BatchRunner;
use crate::plugin::{Event, JobContext, LoadedPlugin, PluginError, Processor};
use crate::state_store::{RocksStore, StateStore};
use crate::hot_swap::{CommitReport, HotSwap, JobObserver, NoObserver, PluginSlot, SwapPolicy};
use crate::task::{RunSummary, TaskError, MAX_TRANSACTION_BYTES};
use crate::transaction::Transaction;

/// How long a transactional call (init, send offsets, commit, abort) may take.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a session start waits for a client to reach a learned broker
/// (see [`topics::connect_to_cluster`]).
const CONNECT_BUDGET: Duration = Duration::from_secs(2);
/// Longest an idle job loop waits for records before it looks at the
/// consumer's own queue (rebalances, errors) again.
const IDLE_FETCH_WAIT: Duration = Duration::from_millis(10);
/// Most events the job loop serves from the consumer's own queue before it
/// reads records again.
const MAX_EVENTS_PER_TURN: usize = 1000;
/// Longest wait between attempts to rebuild a failed session.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How a Kafka job runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KafkaRunOptions {
    /// Stop (after committing) once every assigned partition has been read
    /// to its end; for tests, benchmarks and backfills.
    pub until_caught_up: bool,
}

/// A Kafka job in this process: its plugin, its local state, and the loop
/// that recovers from Kafka failures by rebuilding its clients.
pub struct KafkaJob {
    config: JobConfig,
    kafka: KafkaConfig,
    layout: TopicLayout,
    store: Arc<dyn StateStore>,
    processor: Box<dyn Processor>,
    txn: Transaction,
    instance: String,
    hot_swap: Option<HotSwap>,
    observer: Arc<dyn JobObserver>,
    context: JobContext,
    batches: BatchRunner,
    /// The changelog restorer, made by the first session and kept: its
    /// consumer never joins the group, so a new session can use it as it
    /// is, and closing it costs 100 ms (rdkafka polls for the close in
    /// steps of 100 ms).
    restorer: Option<Arc<Restorer>>,
    _lock: DirLock,
}

/// Why a session (one consumer and one producer) ended early.
enum SessionError {
    /// Kafka failed, fenced us, or left a commit's outcome unknown: build
    /// new clients, rejoin, restore, and go on.
    Restart(String),
    /// Retrying does not help.
    Fatal(KafkaJobError),
    /// The job was asked to stop during a plugin call: the open
    /// transaction is aborted, and redone by the next run.
    Stopped,
}

impl SessionError {
    /// A failure of the job's own parts (its state, its plugin, its
    /// configuration): retrying does not help.
    fn fatal(err: impl Into<TaskError>) -> SessionError {
        SessionError::Fatal(KafkaJobError::Task(err.into()))
    }
}

impl From<KafkaError> for SessionError {
    fn from(err: KafkaError) -> Self {
        SessionError::Restart(err.to_string())
    }
}

/// How a session ended without error.
#[derive(Debug, PartialEq, Eq)]
enum SessionEnd {
    Stopped,
    CaughtUp,
}

impl KafkaJob {
    /// Opens Kafka job `config` running `plugin`: locks its state
    /// directory, and checks (or creates) its topics.
    pub fn open(config: &JobConfig, plugin: &LoadedPlugin) -> Result<KafkaJob, KafkaJobError> {
        KafkaJob::open_in(config, plugin, JobContext::new(&config.name))
    }

    /// Like [`KafkaJob::open`], with the plugin's instances in `context`
    /// (stopped by its signal, seated in the host's CPU sharing).
    pub fn open_in(config: &JobConfig, plugin: &LoadedPlugin, context: JobContext) -> Result<KafkaJob, KafkaJobError> {
        let make = plugin.processor_maker(config.limits, context.clone());
        KafkaJob::open_with_in(config, context, make)
    }

    /// Like [`KafkaJob::open`], with the processor made by `make_processor`.
    pub fn open_with(
        config: &JobConfig,
        make_processor: impl FnOnce() -> Result<Box<dyn Processor>, PluginError>,
    ) -> Result<KafkaJob, KafkaJobError> {
        KafkaJob::open_with_in(config, JobContext::new(&config.name), make_processor)
    }

    fn open_with_in(
        config: &JobConfig,
        context: JobContext,
        make_processor: impl FnOnce() -> Result<Box<dyn Processor>, PluginError>,
    ) -> Result<KafkaJob, KafkaJobError> {
        config.validate().map_err(TaskError::from)?;
        let kafka = config.kafka().map_err(TaskError::from)?.clone();
        let processor = make_processor().map_err(TaskError::from)?;
        let lock = DirLock::acquire(&kafka.state_dir).map_err(TaskError::from)?;
        let instance = instance_id(&kafka.state_dir).map_err(|message| KafkaJobError::Setup { job: config.name.clone(), message })?;
        let layout = topics::prepare(config, &kafka)?;
        let store: Arc<dyn StateStore> =
            Arc::new(RocksStore::open(&kafka.state_dir.join("db")).map_err(TaskError::from)?);
        let mut limits = config.limits;
        limits.max_value_bytes = limits.max_value_bytes.min(MAX_KAFKA_VALUE_BYTES);
        let mut txn = Transaction::new(store.clone(), config.outputs.clone().into(), limits).with_emit(config.emit_per_output());
        txn.plugin_digest = processor.digest().to_string();
        tracing::info!(job = %config.name, plugin = %processor.digest(), partitions = layout.partitions, instance = %instance, "Kafka job opened");
        Ok(KafkaJob {
            config: config.clone(),
            kafka,
            layout,
            store,
            processor,
            txn,
            instance,
            hot_swap: None,
            observer: Arc::new(NoObserver),
            context,
            batches: BatchRunner::new(),
            restorer: None,
            _lock: lock,
        })
    }

    /// Lets new plugin versions pushed into `slot` be swapped in at
    /// transaction boundaries, and reports commits and swaps to `observer`.
    pub fn attach(&mut self, slot: Arc<PluginSlot>, policy: SwapPolicy, observer: Arc<dyn JobObserver>) {
        self.hot_swap = Some(HotSwap::new(slot, self.config.limits, policy, observer.clone(), self.context.clone()));
        self.observer = observer;
    }

    /// The job's committed state: each key starts with its input
    /// partition's [`namespace`].
    pub fn store(&self) -> Arc<dyn StateStore> {
        self.store.clone()
    }

    /// Number of input partitions (state namespaces).
    pub fn partitions(&self) -> i32 {
        self.layout.partitions
    }

    /// Digest of the plugin version running now.
    pub fn plugin_digest(&self) -> &str {
        self.processor.digest()
    }

    /// Runs until `stop` is set (or, with `until_caught_up`, until the
    /// assigned partitions are read to their end), committing what it
    /// processed before returning. Kafka failures rebuild the clients and
    /// go on; only failures retrying cannot fix end the run.
    pub fn run_until(&mut self, stop: &AtomicBool, options: KafkaRunOptions) -> Result<RunSummary, KafkaJobError> {
        let started = Instant::now();
        let mut summary = RunSummary::default();
        let mut backoff = Duration::from_millis(250);
        loop {
            let session_started = Instant::now();
            match self.run_session(stop, options, &mut summary) {
                Ok(end) => {
                    summary.stopped_early = end == SessionEnd::Stopped;
                    break;
                }
                Err(SessionError::Fatal(err)) => return Err(err),
                Err(SessionError::Stopped) => {
                    summary.stopped_early = true;
                    break;
                }
                Err(SessionError::Restart(reason)) => {
                    tracing::warn!(job = %self.config.name, %reason, "Kafka session failed; rejoining the group and restoring state");
                    if session_started.elapsed() > Duration::from_secs(30) {
                        backoff = Duration::from_millis(250);
                    }
                    let resume_at = Instant::now() + backoff;
                    self.context.idle();
                    while Instant::now() < resume_at {
                        if stop.load(Ordering::Relaxed) {
                            summary.stopped_early = true;
                            summary.elapsed = started.elapsed();
                            return Ok(summary);
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        summary.elapsed = started.elapsed();
        Ok(summary)
    }

    fn run_session(&mut self, stop: &AtomicBool, options: KafkaRunOptions, summary: &mut RunSummary) -> Result<SessionEnd, SessionError> {
        let (config, kafka) = (&self.config, &self.kafka);
        let tracker = DeliveryTracker::new(self.layout.changelog.clone());
        let producer: Arc<JobProducer> = Arc::new(
            topics::producer_config(config, kafka, &self.instance).create_with_context(tracker).map_err(|err| self.client_error(err))?,
        );
        let settle = Duration::from_millis(2 * kafka.transaction_timeout_ms) + Duration::from_secs(10);
        let (restorer, new_restorer) = match &self.restorer {
            Some(restorer) => (restorer.clone(), false),
            None => {
                let consumer: BaseConsumer<QuietEof> =
                    topics::restore_config(config, kafka).create_with_context(QuietEof).map_err(|err| self.client_error(err))?;
                let restorer = Arc::new(Restorer::new(consumer, self.store.clone(), self.layout.changelog.clone(), settle));
                (self.restorer.insert(restorer).clone(), true)
            }
        };
        let (config, kafka) = (&self.config, &self.kafka);
        let open = Arc::new(AtomicBool::new(false));
        let router = Arc::new(Router::default());
        let consumer_config = topics::consumer_config(config, kafka, &self.instance);
        let rebalancer = Rebalancer {
            router: router.clone(),
            job: config.name.clone(),
            group: kafka.group_id(&config.name),
            inputs: kafka.inputs.clone(),
            guarantee: kafka.guarantee,
            producer: producer.clone(),
            open: open.clone(),
            restorer: restorer.clone(),
            store: self.store.clone(),
            settle,
            start_without_commit: topics::start_without_commit(&consumer_config),
            events: Mutex::default(),
        };
        let consumer: BaseConsumer<Rebalancer> =
            consumer_config.create_with_context(rebalancer).map_err(|err| self.client_error(err))?;
        // Open before subscribing: every assigned partition is routed to it.
        let mut fetch = FetchQueue::open(&consumer, router, config.batch_size);
        let topics: Vec<&str> = kafka.inputs.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        // The group join goes on in librdkafka's threads while the other
        // clients connect: the assignment is handled (and restored) only
        // when the loop first polls, after the producer is ready. They
        // connect before they are used: a restore or a coordinator lookup
        // begun earlier would wait on librdkafka's retry timers.
        topics::connect_to_cluster(producer.client(), CONNECT_BUDGET);
        if new_restorer {
            topics::connect_to_cluster(restorer.consumer().client(), CONNECT_BUDGET);
        }
        if kafka.guarantee == Guarantee::ExactlyOnce {
            // Fences an earlier process with our transactional id and
            // aborts the transaction it left open.
            producer.init_transactions(KAFKA_TIMEOUT)?;
        }
        let addresses = Addresses {
            job: config.name.clone(),
            inputs: kafka.inputs.clone(),
            outputs: config.outputs.iter().map(|name| kafka.output_topic(name).unwrap_or_default().to_string()).collect(),
            dead_letter: kafka.dead_letter_topic.clone(),
            changelog: self.layout.changelog.clone(),
        };
        let committer = KafkaCommitter::new(producer, kafka.guarantee, addresses, self.store.clone(), open, KAFKA_TIMEOUT);
        self.drop_transaction("a new Kafka session starts");
        let result = self.consume(&consumer, &mut fetch, &committer, stop, options, summary);
        // Hand over cleanly: abort what is open, then leave the group.
        let _ = committer.abort();
        self.drop_transaction("the Kafka session ended");
        drop(fetch);
        drop(consumer);
        result
    }

    /// A client that cannot even be created has a bad setting: say which.
    fn client_error(&self, err: KafkaError) -> SessionError {
        SessionError::Fatal(KafkaJobError::Setup {
            job: self.config.name.clone(),
            message: format!("cannot create a Kafka client: {err}; check kafka.client and kafka.brokers"),
        })
    }

    /// Runs the job loop; each transaction's Kafka commit overlaps the
    /// next one's processing, on a thread of the session's scope.
    fn consume(
        &mut self,
        consumer: &BaseConsumer<Rebalancer>,
        fetch: &mut FetchQueue<'_>,
        committer: &KafkaCommitter,
        stop: &AtomicBool,
        options: KafkaRunOptions,
        summary: &mut RunSummary,
    ) -> Result<SessionEnd, SessionError> {
        std::thread::scope(|scope| {
            let mut commits = Commits { scope, in_flight: None };
            let result = self.consume_in(consumer, fetch, committer, stop, options, summary, &mut commits);
            if let Some(mut in_flight) = commits.in_flight.take() {
                // The session failed while a commit was in flight: count it
                // if it took effect; the clients close after it ends.
                if let Ok(finished) = in_flight.join() {
                    self.commit_took_effect(consumer, in_flight.done, finished, &mut Progress::default(), summary);
                }
            }
            result
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn consume_in<'scope>(
        &mut self,
        consumer: &'scope BaseConsumer<Rebalancer>,
        fetch: &mut FetchQueue<'_>,
        committer: &'scope KafkaCommitter,
        stop: &AtomicBool,
        options: KafkaRunOptions,
        summary: &mut RunSummary,
        commits: &mut Commits<'scope, '_>,
    ) -> Result<SessionEnd, SessionError> {
        let interval = self.config.commit_interval();
        let batch_size = self.config.batch_size;
        let mut progress = Progress { pending: Vec::with_capacity(batch_size), ..Progress::default() };
        let mut last_commit = Instant::now();
        self.at_boundary();
        loop {
            if stop.load(Ordering::Relaxed) {
                // Records read but not run are left for the next run (the
                // committed offsets stop before them): commit what was.
                progress.pending.clear();
                progress.pending_bytes = 0;
                progress.oversized.clear();
                if self.commit(consumer, committer, &mut progress, summary, commits, Overlap::No)? {
                    return Ok(SessionEnd::Stopped);
                }
                continue;
            }
            // Take a finished commit's outcome at once (its outputs wait for
            // the producer), and any commit's before a rebalance is served:
            // a revocation aborts the open transaction.
            let settle = commits.in_flight.as_ref().is_some_and(|in_flight| in_flight.is_finished() || fetch.consumer_events_waiting());
            if settle && !self.settle(consumer, committer, &mut progress, summary, commits)? {
                continue;
            }
            let wait = if progress.pending.is_empty() {
                interval.saturating_sub(last_commit.elapsed()).min(Duration::from_millis(100))
            } else {
                Duration::ZERO
            };
            // Rebalances and client errors arrive on the consumer's own
            // queue, records on the fetch queue: serve the first before
            // reading the second. A poll serves one event, so poll while
            // events wait (a bounded number: log lines may keep coming).
            let mut failure = None;
            let polls = if commits.in_flight.is_some() { 0 } else { MAX_EVENTS_PER_TURN };
            for served in 0..polls {
                if served > 0 && !fetch.consumer_events_waiting() {
                    break;
                }
                match consumer.poll(Duration::ZERO) {
                    // Only a partition the router missed delivers here.
                    Some(Ok(record)) => self.fetched(&mut progress, Fetched::Record(FetchedRecord::of(&record)), &mut failure),
                    Some(Err(KafkaError::PartitionEOF(partition))) => {
                        // Only with one input does this queue say which topic ended.
                        if let [input] = self.kafka.inputs.as_slice() {
                            self.fetched(&mut progress, Fetched::End(input, partition), &mut failure);
                        }
                    }
                    Some(Err(err)) => {
                        let code = err.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Unknown);
                        self.fetched(&mut progress, Fetched::Error(code, err.to_string()), &mut failure)
                    }
                    None => {}
                }
            }
            let rebalanced = consumer.context().take_events();
            if let Some(failure) = rebalanced.failure {
                return Err(failure);
            }
            if rebalanced.revoked {
                // The rebalance handler aborted the transaction; what was
                // read for it is read again by whoever owns it now.
                self.drop_transaction("partitions were revoked");
                progress.forget_uncommitted();
                progress.included.clear();
            }
            if rebalanced.assigned {
                self.txn.overlay.forget_cache();
                for ((topic, partition), next) in rebalanced.included {
                    if let Some(index) = self.kafka.inputs.iter().position(|input| *input == topic) {
                        progress.included.insert(source_id(index, partition), next);
                    }
                }
            }
            let room = batch_size.saturating_sub(progress.pending.len());
            let wait = if progress.pending.is_empty() { wait.min(IDLE_FETCH_WAIT) } else { Duration::ZERO };
            if !wait.is_zero() {
                // Waiting for records: another job of the tenant may use the CPU.
                self.context.idle();
            }
            let read = fetch.read(wait, room, |item| self.fetched(&mut progress, item, &mut failure));
            if let Some(reason) = failure {
                return Err(SessionError::Restart(reason));
            }
            if read > 0 && progress.pending.len() < batch_size && progress.pending_bytes < self.config.limits.batch_bytes() {
                continue; // more may be waiting: fill the batch first
            }
            if !self.process_or_roll_back(consumer, committer, &mut progress, commits.in_flight.is_some())? {
                continue;
            }
            if last_commit.elapsed() >= interval || self.txn.pending_bytes() >= MAX_TRANSACTION_BYTES {
                self.commit(consumer, committer, &mut progress, summary, commits, Overlap::Yes)?;
                last_commit = Instant::now();
            }
            if options.until_caught_up
                && progress.pending.is_empty()
                && self.caught_up(consumer, &progress.at_end)
                && self.commit(consumer, committer, &mut progress, summary, commits, Overlap::No)?
            {
                return Ok(SessionEnd::CaughtUp);
            }
        }
    }

    /// Whether every assigned partition has reported its end since it last
    /// delivered a record.
    fn caught_up(&self, consumer: &BaseConsumer<Rebalancer>, at_end: &BTreeSet<(usize, i32)>) -> bool {
        let Ok(assignment) = consumer.assignment() else { return false };
        let assigned = assignment.elements();
        !assigned.is_empty() && at_end.len() >= assigned.len()
    }

    /// Takes one item read from the input: a record joins the pending
    /// batch, a partition's end is noted, a fatal client error is put in
    /// `failure` (the session restarts).
    fn fetched(&self, progress: &mut Progress, item: Fetched<'_>, failure: &mut Option<String>) {
        match item {
            Fetched::Record(record) => {
                // Naming the topic costs a C string conversion per record:
                // skip it when there is only one.
                let topic = match self.kafka.inputs.len() {
                    1 => 0,
                    _ => self.kafka.inputs.iter().position(|input| input == record.topic()).unwrap_or(0),
                };
                let partition = record.partition();
                if !progress.at_end.is_empty() {
                    progress.at_end.remove(&(topic, partition));
                }
                let payload = record.payload().unwrap_or_default();
                let source = source_id(topic, partition);
                let offset = record.offset() as u64;
                let value = if payload.len() as u64 > self.config.limits.max_record_bytes {
                    // Kept as a prefix for the dead letter, never whole.
                    progress.oversized.insert((source, offset), payload.len());
                    payload[..payload.len().min(crate::source::OVERSIZED_PREFIX_BYTES)].to_vec()
                } else {
                    payload.to_vec()
                };
                let event = Event { partition: source, offset, timestamp_ms: record.timestamp_ms(), key: record.key().map(<[u8]>::to_vec), value };
                progress.pending_bytes += (event.value.len() + event.key.as_ref().map_or(0, Vec::len)) as u64;
                progress.first.entry(event.partition).or_insert(event.offset as i64);
                progress.pending.push(event);
            }
            Fetched::End(topic, partition) => {
                if let Some(topic) = self.kafka.inputs.iter().position(|input| input == topic) {
                    progress.at_end.insert((topic, partition));
                }
            }
            Fetched::Error(code, text) => {
                tracing::warn!(job = %self.config.name, error = %text, "consumer error");
                if code == RDKafkaErrorCode::Fatal {
                    *failure = Some(text);
                }
            }
        }
    }

    /// Takes a pushed plugin version, if any (nothing is uncommitted here).
    fn at_boundary(&mut self) {
        if let Some(swap) = &mut self.hot_swap {
            swap.at_boundary(&mut self.processor, &mut self.txn);
        }
    }

    /// [`KafkaJob::process`], rolling a plugin version on trial back if it
    /// fails; `false` after a rollback (the input is read again).
    fn process_or_roll_back(
        &mut self,
        consumer: &BaseConsumer<Rebalancer>,
        committer: &KafkaCommitter,
        progress: &mut Progress,
        commit_in_flight: bool,
    ) -> Result<bool, SessionError> {
        match self.process(progress, committer, commit_in_flight)? {
            None => Ok(true),
            Some(reason) => {
                self.roll_back(consumer, committer, progress, reason)?;
                Ok(false)
            }
        }
    }

    /// Aborts the transaction (a trial version failed it), puts the
    /// previous plugin version back, and rewinds to the committed offsets.
    fn roll_back(
        &mut self,
        consumer: &BaseConsumer<Rebalancer>,
        committer: &KafkaCommitter,
        progress: &mut Progress,
        reason: String,
    ) -> Result<(), SessionError> {
        // The previous version first: whatever happens to the abort, the
        // failed version never runs (or counts as accepted) again.
        if let Some(swap) = &mut self.hot_swap {
            swap.roll_back(&mut self.processor, &mut self.txn, reason.clone());
        }
        committer.abort()?;
        self.drop_transaction(&reason);
        rewind(consumer, &progress.first)?;
        progress.forget_uncommitted();
        Ok(())
    }

    /// Drops the open transaction's work (Kafka has aborted it or will):
    /// observers stop counting it, and a trial starts over with the redo.
    fn drop_transaction(&mut self, reason: &str) {
        self.txn.abort();
        self.batches.transaction_dropped();
        self.observer.aborted(reason);
        if let Some(swap) = &mut self.hot_swap {
            swap.aborted();
        }
    }

    /// Runs the pending records through the plugin, one batch per input
    /// partition (each in its partition's state namespace), and sends the
    /// outputs into the open transaction. Under `exactly_once`, a record
    /// below what the state already includes (the consumer was moved back:
    /// an offset reset, a truncated log) stops the job instead of counting
    /// twice.
    /// Returns why a plugin version on trial failed, if it did (nothing is
    /// sent then). While a commit is in flight the producer is its own:
    /// outputs wait in the transaction.
    fn process(
        &mut self,
        progress: &mut Progress,
        committer: &KafkaCommitter,
        commit_in_flight: bool,
    ) -> Result<Option<String>, SessionError> {
        if progress.pending.is_empty() {
            return Ok(None);
        }
        let pending = &mut progress.pending;
        pending.sort_by_key(|event| split_source_id(event.partition).1);
        for batch in pending.chunk_by(|a, b| split_source_id(a.partition).1 == split_source_id(b.partition).1) {
            if self.kafka.guarantee == Guarantee::ExactlyOnce {
                // Runs of one source (a batch holds one partition number of
                // every input topic): one lookup per run, not per record.
                for run in batch.chunk_by(|a, b| a.partition == b.partition) {
                    let included = progress.included.get(&run[0].partition).copied().unwrap_or(0);
                    let lowest = run.iter().map(|event| event.offset).min().unwrap_or(0) as i64;
                    if lowest < included {
                        let (topic, partition) = split_source_id(run[0].partition);
                        return Err(SessionError::Fatal(KafkaJobError::Rewind(format!(
                            "Kafka job `{}` stopped: it was handed offset {lowest} of `{}` partition {partition}, but its state \
                             already includes that partition up to offset {included}; the consumer was moved back (an offset \
                             reset, or a truncated log), and going on would count those records twice. To reprocess history, \
                             replay into a new output version: run the job under a new name writing to new output topics",
                            self.config.name, self.kafka.inputs[topic]
                        ))));
                    }
                }
            }
            self.txn.set_namespace(&namespace(split_source_id(batch[0].partition).1));
            let on_trial = self.hot_swap.as_ref().is_some_and(HotSwap::on_trial);
            let fitting: Vec<Event>;
            let mut to_run = batch;
            let mut too_large = 0;
            if !progress.oversized.is_empty() {
                let limit = self.config.limits.max_record_bytes;
                fitting = batch
                    .iter()
                    .filter(|event| match progress.oversized.remove(&(event.partition, event.offset)) {
                        None => true,
                        Some(size) => {
                            let source = crate::transaction::SourcePosition { partition: event.partition, offset: event.offset };
                            crate::batch::dead_letter_oversized(&mut self.txn, source, event.value.clone(), size as u64, limit);
                            too_large += 1;
                            false
                        }
                    })
                    .cloned()
                    .collect();
                to_run = &fitting;
            }
            let mut outcome = if to_run.is_empty() {
                crate::batch::BatchOutcome::default()
            } else {
                self.batches.run_with(on_trial, &mut *self.processor, &mut self.txn, to_run).map_err(|err| {
                    match TaskError::from_batch(err, &self.config.name) {
                        Some(err) => SessionError::fatal(err),
                        None => SessionError::Stopped,
                    }
                })?
            };
            // A version on trial is judged on the events it ran.
            let judged = self.hot_swap.as_mut().and_then(|swap| swap.judge_batch(to_run.len(), &outcome));
            outcome.dead_lettered += too_large;
            self.observer.batch(batch.len(), &outcome);
            if let Some(reason) = judged {
                return Ok(Some(reason));
            }
            progress.uncommitted.count_batch(batch.len(), &outcome);
            for run in batch.chunk_by(|a, b| a.partition == b.partition) {
                let highest = run.iter().map(|event| event.offset).max().unwrap_or(0) as i64;
                let next = progress.positions.entry(run[0].partition).or_insert(0);
                *next = (*next).max(highest + 1);
            }
        }
        pending.clear();
        progress.pending_bytes = 0;
        // Without a Kafka transaction, sent records are visible at once: a
        // version on trial keeps its outputs until the trial is judged.
        let on_trial = self.hot_swap.as_ref().is_some_and(HotSwap::on_trial);
        if self.txn.sends_outputs_early() && !commit_in_flight && !(on_trial && self.kafka.guarantee == Guarantee::AtLeastOnce) {
            committer.send_outputs(&mut self.txn).map_err(|err| SessionError::Restart(err.to_string()))?;
        }
        Ok(None)
    }

    /// Commits the open transaction: sends its records, then leaves its
    /// Kafka commit to a thread and goes on with the next transaction, or,
    /// with `Overlap::No` or while a plugin version waits for a
    /// transaction's outcome, waits for it. A commit still in flight is
    /// settled first. `false` if Kafka aborted a transaction (then the
    /// consumer is back at the committed offsets and the work is redone).
    fn commit<'scope>(
        &mut self,
        consumer: &'scope BaseConsumer<Rebalancer>,
        committer: &'scope KafkaCommitter,
        progress: &mut Progress,
        summary: &mut RunSummary,
        commits: &mut Commits<'scope, '_>,
        overlap: Overlap,
    ) -> Result<bool, SessionError> {
        if !self.settle(consumer, committer, progress, summary, commits)? {
            return Ok(false);
        }
        if let Some(reason) = self.hot_swap.as_ref().and_then(HotSwap::judge_transaction) {
            self.roll_back(consumer, committer, progress, reason)?;
            return Ok(false);
        }
        let started = Instant::now();
        let sent = match committer.send_transaction(&mut self.txn, &progress.positions, consumer) {
            Ok(sent) => sent,
            Err(err) => return self.commit_failed(consumer, committer, progress, err),
        };
        let finishing = sent.map(|sent| {
            commits.scope.spawn(move || {
                let result = committer.commit_sent(sent, consumer);
                (result, Instant::now())
            })
        });
        let done = CommitDone {
            started,
            positions: std::mem::take(&mut progress.positions),
            first: std::mem::take(&mut progress.first),
            uncommitted: std::mem::take(&mut progress.uncommitted),
        };
        let overlaps = finishing.is_some() && overlap == Overlap::Yes && self.hot_swap.as_ref().is_none_or(HotSwap::is_idle);
        commits.in_flight = Some(InFlight { finishing, done });
        if overlaps {
            return Ok(true);
        }
        let committed = self.settle(consumer, committer, progress, summary, commits)?;
        if committed {
            self.at_boundary();
        }
        Ok(committed)
    }

    /// Waits for the commit in flight, if any, and takes its outcome:
    /// `false` if Kafka aborted it (then the open transaction, which built
    /// on its state, is dropped too, and the consumer is back at the
    /// committed offsets).
    fn settle(
        &mut self,
        consumer: &BaseConsumer<Rebalancer>,
        committer: &KafkaCommitter,
        progress: &mut Progress,
        summary: &mut RunSummary,
        commits: &mut Commits<'_, '_>,
    ) -> Result<bool, SessionError> {
        let Some(mut in_flight) = commits.in_flight.take() else { return Ok(true) };
        if !in_flight.is_finished() {
            // Waiting for Kafka: another job of the tenant may use the CPU.
            self.context.idle();
        }
        match in_flight.join() {
            Ok(finished) => {
                self.commit_took_effect(consumer, in_flight.done, finished, progress, summary);
                Ok(true)
            }
            Err(err) => {
                // Where a partition has no committed offset, the rewind goes
                // back to the first offset read since the last commit: this
                // transaction's, not the open one's.
                progress.first.extend(in_flight.done.first);
                self.commit_failed(consumer, committer, progress, err)
            }
        }
    }

    /// Counts a commit that took effect at `finished`.
    fn commit_took_effect(
        &mut self,
        consumer: &BaseConsumer<Rebalancer>,
        done: CommitDone,
        finished: Instant,
        progress: &mut Progress,
        summary: &mut RunSummary,
    ) {
        self.txn.commit_finished();
        let took = finished.saturating_duration_since(done.started);
        summary.absorb(&done.uncommitted);
        if !done.positions.is_empty() {
            summary.commits += 1;
            self.observer.committed(&CommitReport {
                at: finished,
                took,
                plugin_digest: self.txn.plugin_digest.clone(),
                lag: consumer_lag(consumer),
                usage: self.processor.usage(),
                carried: done.uncommitted.clone(),
            });
        }
        progress.included.extend(done.positions);
        if let Some(swap) = &mut self.hot_swap {
            swap.committed();
        }
        tracing::debug!(job = %self.config.name, took_us = took.as_micros() as u64, "committed");
    }

    /// Handles a failed commit: an abortable error aborts and rewinds
    /// (`Ok(false)`); anything else ends the session.
    fn commit_failed(
        &mut self,
        consumer: &BaseConsumer<Rebalancer>,
        committer: &KafkaCommitter,
        progress: &mut Progress,
        err: KafkaCommitError,
    ) -> Result<bool, SessionError> {
        match err {
            KafkaCommitError::Kafka(err) if classify(&err) == Recovery::Abort => {
                tracing::warn!(job = %self.config.name, error = %err, "transaction aborted; rewinding to the committed offsets");
                committer.abort()?;
                self.drop_transaction(&err.to_string());
                rewind(consumer, &progress.first)?;
                progress.forget_uncommitted();
                Ok(false)
            }
            KafkaCommitError::State(err) => Err(SessionError::fatal(err)),
            err => Err(SessionError::Restart(format!("commit failed, outcome unknown or fenced: {err}"))),
        }
    }
}

/// Whether a commit may overlap the next transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overlap {
    Yes,
    /// The commit ends before the loop goes on (the run is stopping).
    No,
}

/// The session's commit thread scope, and the commit in flight in it.
struct Commits<'scope, 'env> {
    scope: &'scope std::thread::Scope<'scope, 'env>,
    in_flight: Option<InFlight<'scope>>,
}

/// A commit whose records are sent and whose Kafka commit runs on a thread
/// of its own.
struct InFlight<'scope> {
    /// `None` when there was nothing to commit.
    finishing: Option<std::thread::ScopedJoinHandle<'scope, (Result<(), KafkaCommitError>, Instant)>>,
    done: CommitDone,
}

impl InFlight<'_> {
    fn is_finished(&self) -> bool {
        self.finishing.as_ref().is_none_or(|finishing| finishing.is_finished())
    }

    /// Waits for the commit; when it took effect.
    fn join(&mut self) -> Result<Instant, KafkaCommitError> {
        match self.finishing.take() {
            None => Ok(Instant::now()),
            Some(finishing) => {
                let (result, finished) = finishing.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                result.map(|()| finished)
            }
        }
    }
}

/// What a transaction carried, counted once its commit takes effect.
struct CommitDone {
    started: Instant,
    /// Next offset per source id.
    positions: BTreeMap<u32, i64>,
    /// First offset per source id it read.
    first: HashMap<u32, i64>,
    uncommitted: RunSummary,
}

/// Where the job loop is within the assigned partitions.
#[derive(Default)]
struct Progress {
    /// Records read but not yet run through the plugin.
    pending: Vec<Event>,
    /// Bytes of their keys and values.
    pending_bytes: u64,
    /// Of them, those over `limits.max_record_bytes`: (source id, offset)
    /// and their size. They hold only a prefix, and are dead-lettered
    /// instead of run.
    oversized: HashMap<(u32, u64), usize>,
    /// Next offset per source id, of the records in the open transaction.
    positions: BTreeMap<u32, i64>,
    /// First offset per source id read since the last commit (where a
    /// rewind goes for a partition with no committed offset).
    first: HashMap<u32, i64>,
    /// Next offset per source id that the committed state includes.
    included: HashMap<u32, i64>,
    /// Input partitions read to their end (for `until_caught_up`).
    at_end: BTreeSet<(usize, i32)>,
    /// What the open transaction processed: added to the run's summary when
    /// it commits, so records redone after an abort count once.
    uncommitted: RunSummary,
}

impl Progress {
    /// The open transaction is gone: what was read for it is read again.
    fn forget_uncommitted(&mut self) {
        self.pending.clear();
        self.pending_bytes = 0;
        self.oversized.clear();
        self.positions.clear();
        self.first.clear();
        self.at_end.clear();
        self.uncommitted = RunSummary::default();
    }
}

/// Records between the consumer's positions and the ends of its assigned
/// partitions, from the watermarks librdkafka last fetched (no request).
fn consumer_lag<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> Option<u64> {
    let positions = consumer.position().ok()?;
    let mut lag = 0u64;
    for element in positions.elements() {
        let topic = std::ffi::CString::new(element.topic()).ok()?;
        let (mut low, mut high) = (0i64, 0i64);
        // SAFETY: the client pointer is valid while `consumer` lives, `topic`
        // is a NUL-terminated string, and the two out-pointers are valid.
        // rdkafka 0.39 has no safe wrapper for this cached (no request) call.
        let status = unsafe {
            rdkafka::bindings::rd_kafka_get_watermark_offsets(
                consumer.client().native_ptr(),
                topic.as_ptr(),
                element.partition(),
                &mut low,
                &mut high,
            )
        };
        if status != rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || high < 0 {
            return None;
        }
        if let Offset::Offset(position) = element.offset() {
            lag += (high - position).max(0) as u64;
        }
    }
    Some(lag)
}

/// Moves the consumer back to the group's committed offsets; a partition
/// the group has no offset for goes back to the first offset the open
/// transaction read of it (`first`, by source id), not to the start of the
/// log or its end (`auto.offset.reset`).
fn rewind(consumer: &BaseConsumer<Rebalancer>, first: &HashMap<u32, i64>) -> Result<(), KafkaError> {
    let committed = consumer.committed(KAFKA_TIMEOUT)?;
    let inputs = &consumer.context().inputs;
    for element in committed.elements() {
        let offset = match element.offset() {
            Offset::Offset(offset) => Offset::Offset(offset),
            _ => {
                let topic = inputs.iter().position(|input| input == element.topic());
                match topic.and_then(|topic| first.get(&source_id(topic, element.partition()))) {
                    Some(&offset) => Offset::Offset(offset),
                    // Nothing of it was read in this transaction: leave it.
                    None => continue,
                }
            }
        };
        consumer.seek(element.topic(), element.partition(), offset, KAFKA_TIMEOUT)?;
    }
    Ok(())
}

/// Reads (or creates) the id that makes this state directory's
/// transactional id: the same after a restart, so a restarted process
/// fences its previous incarnation and aborts what it left open.
fn instance_id(state_dir: &Path) -> Result<String, String> {
    let path = state_dir.join("instance-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if valid_instance_id(id.trim()) => return Ok(id.trim().to_string()),
        Ok(id) => {
            return Err(format!(
                "`{}` holds {:?}, not an instance id (16 hex digits); delete the file to give this state directory a new one",
                path.display(),
                id.trim()
            ));
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(format!("cannot read `{}`: {err}", path.display())),
    }
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut bytes))
        .map_err(|err| format!("cannot read /dev/urandom for an instance id: {err}"))?;
    let id: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    // Written whole or not at all: a torn file would give several processes
    // the same (empty) transactional id.
    crate::files::write_atomically(&path, id.as_bytes()).map_err(|err| format!("cannot write `{}`: {err}", path.display()))?;
    Ok(id)
}

fn valid_instance_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|byte| byte.is_ascii_hexdigit())
}

/// A partition this process got of some inputs but not of all, with an
/// input it lacks.
fn split_namespace<'a>(inputs: &'a [String], assigned: &[(String, i32)]) -> Option<(i32, &'a str)> {
    let assigned_set: BTreeSet<(&str, i32)> = assigned.iter().map(|(topic, partition)| (topic.as_str(), *partition)).collect();
    assigned.iter().find_map(|(_, partition)| {
        let missing = inputs.iter().find(|topic| !assigned_set.contains(&(topic.as_str(), *partition)))?;
        Some((*partition, missing.as_str()))
    })
}

/// What happened in rebalance callbacks since the job loop last looked.
#[derive(Default)]
struct RebalanceEvents {
    revoked: bool,
    assigned: bool,
    /// Next input offset the restored state includes, per assigned
    /// `(topic, partition)`.
    included: Vec<((String, i32), i64)>,
    failure: Option<SessionError>,
}

/// What [`Rebalancer::restore_and_check`] found for the assigned partitions.
#[derive(Default)]
struct Checked {
    /// Next input offset the restored state includes, where it has one.
    included: Vec<((String, i32), i64)>,
    /// The group's committed offset of every assigned partition.
    committed: Vec<((String, i32), Option<i64>)>,
}

/// The consumer's rebalance handler: aborts the in-flight transaction
/// before partitions are given up, and restores state (and checks for a
/// rewind) before any record of a new partition is delivered.
struct Rebalancer {
    /// Routes newly assigned partitions to the job loop's fetch queue.
    router: Arc<Router>,
    job: String,
    group: String,
    inputs: Vec<String>,
    guarantee: Guarantee,
    producer: Arc<JobProducer>,
    open: Arc<AtomicBool>,
    restorer: Arc<Restorer>,
    store: Arc<dyn StateStore>,
    settle: Duration,
    /// Where a partition without a committed offset starts (`auto.offset.reset`).
    start_without_commit: Offset,
    events: Mutex<RebalanceEvents>,
}

impl Rebalancer {
    fn take_events(&self) -> RebalanceEvents {
        std::mem::take(&mut *self.events.lock().expect("rebalance lock"))
    }

    fn note(&self, update: impl FnOnce(&mut RebalanceEvents)) {
        update(&mut self.events.lock().expect("rebalance lock"));
    }

    /// Restores the state of newly assigned partitions, then compares what
    /// it includes with the group's committed offsets.
    fn restore_and_check(&self, assigned: &[(String, i32)]) -> Result<Checked, SessionError> {
        let partitions: Vec<i32> = assigned.iter().map(|(_, partition)| *partition).collect::<BTreeSet<_>>().into_iter().collect();
        self.check_changelog_kept(&partitions)?;
        let deadline = Instant::now() + self.settle;
        loop {
            self.restorer.restore(&partitions).map_err(|err| match err {
                RestoreError::Foreign { .. } => SessionError::Fatal(KafkaJobError::Setup { job: self.job.clone(), message: err.to_string() }),
                RestoreError::State(state) => SessionError::fatal(state),
                other => SessionError::Restart(other.to_string()),
            })?;
            let mut wanted = TopicPartitionList::new();
            for (topic, partition) in assigned {
                wanted.add_partition(topic, *partition);
            }
            let committed = self.restorer.consumer().committed_offsets(wanted, KAFKA_TIMEOUT)?;
            let mut behind = Vec::new();
            let mut checked = Checked::default();
            for element in committed.elements() {
                let (topic, partition) = (element.topic(), element.partition());
                let group_offset = match element.offset() {
                    Offset::Offset(offset) => Some(offset),
                    _ => None,
                };
                checked.committed.push(((topic.to_string(), partition), group_offset));
                let included = read_offset(&*self.store, &included_key(topic, partition)).map_err(SessionError::fatal)?;
                if let Some(included) = included {
                    checked.included.push(((topic.to_string(), partition), included));
                }
                match (group_offset, included) {
                    (group, Some(included)) if group.unwrap_or(0) < included => {
                        let message = self.rewind_message(topic, partition, group, included);
                        if self.guarantee == Guarantee::ExactlyOnce {
                            return Err(SessionError::Fatal(KafkaJobError::Rewind(message)));
                        }
                        tracing::warn!(job = %self.job, "{message} (at_least_once: going on, those records count again)");
                    }
                    (Some(group), included) if group > included.unwrap_or(0) => behind.push((topic.to_string(), partition, group, included)),
                    _ => {}
                }
            }
            if behind.is_empty() {
                return Ok(checked);
            }
            if Instant::now() >= deadline {
                // Usually a transaction's commit markers still on their way
                // to the changelog: rejoin and look again (with backoff).
                let (topic, partition, group, included) = &behind[0];
                return Err(SessionError::Restart(format!(
                    "group `{}` has committed offset {group} for `{topic}` partition {partition}, but the state restored from the \
                     changelog includes input only up to offset {}. Either a transaction's commit markers have not reached the \
                     changelog yet (this clears by itself), or the changelog lost records (deleted or recreated) or the group is \
                     shared with another application; if it persists, stop the job and investigate before restarting it",
                    self.group,
                    included.unwrap_or(0)
                )));
            }
            // A transaction of the previous owner is still settling.
            tracing::info!(job = %self.job, ?behind, "state is behind the group's offsets; waiting for the previous owner's transaction to settle");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Refuses partitions whose local state has read the changelog further
    /// than the changelog now reaches: the topic lost records since (it was
    /// deleted and recreated, or truncated), so no other process could
    /// restore that state, and going on would write a changelog that does
    /// not add up. The producer is asked, not the restore consumer: its
    /// `read_uncommitted` end is the log's end, where a `read_committed`
    /// one stops at a transaction still open.
    fn check_changelog_kept(&self, partitions: &[i32]) -> Result<(), SessionError> {
        let changelog = self.restorer.topic();
        for &partition in partitions {
            let checkpoint = read_offset(&*self.store, &checkpoint_key(partition)).map_err(SessionError::fatal)?;
            let Some(checkpoint) = checkpoint.filter(|&checkpoint| checkpoint > 0) else { continue };
            let (_, end) = self.producer.client().fetch_watermarks(changelog, partition, KAFKA_TIMEOUT).map_err(|err| {
                SessionError::Restart(format!("reading the end of changelog `{changelog}` partition {partition} failed: {err}"))
            })?;
            if checkpoint > end {
                return Err(SessionError::Fatal(KafkaJobError::Setup {
                    job: self.job.clone(),
                    message: format!(
                        "changelog topic `{changelog}` partition {partition} ends at offset {end}, but this process's state has \
                         read it up to offset {checkpoint}: the topic lost records since (deleted and recreated, or truncated), \
                         so no other process could restore this state. Tally stops rather than write a changelog that does not \
                         add up. To rebuild the state from the input, run the job under a new name (a new group, changelog and \
                         state directory) writing to new output topics"
                    ),
                }));
            }
        }
        Ok(())
    }

    /// Partition `p` of every input feeds one state namespace, so a process
    /// must own partition `p` of all inputs or none: otherwise two processes
    /// would write the same state (as when processes of one job subscribe
    /// to different inputs during a rolling change).
    fn check_whole_namespaces(&self, assigned: &[(String, i32)]) -> Result<(), SessionError> {
        match split_namespace(&self.inputs, assigned) {
            None => Ok(()),
            Some((partition, missing)) => Err(SessionError::Fatal(KafkaJobError::Setup {
                    job: self.job.clone(),
                    message: format!(
                        "this process was given partition {partition} of some inputs but not of `{missing}`; partition {partition} of \
                         every input feeds one state, so every process of the job must read the same inputs \
                         (change kafka.inputs on all processes together: stop them all, then start them with the new inputs)"
                ),
            })),
        }
    }

    fn rewind_message(&self, topic: &str, partition: i32, group: Option<i64>, included: i64) -> String {
        let group_text = group.map_or_else(|| "no committed offset".to_string(), |offset| format!("committed offset {offset}"));
        format!(
            "Kafka job `{job}` refuses to start: consumer group `{group_id}` has {group_text} for `{topic}` partition {partition}, \
             but the job's state already includes that partition's records up to offset {included}. Someone moved the group's \
             offsets back by hand; processing from there would count those records twice. To reprocess history, replay into a \
             new output version instead: run the job under a new name (a new group, changelog and state directory) writing to \
             new output topics. To undo the reset, set the group's offset for `{topic}` partition {partition} back to {included}.",
            job = self.job,
            group_id = self.group,
        )
    }
}

impl ClientContext for Rebalancer {
    fn error(&self, error: KafkaError, reason: &str) {
        super::log_client_error(error, reason);
    }
}

impl ConsumerContext for Rebalancer {
    /// Replaces rust-rdkafka's default handler, which assigns before the
    /// state is restored: here the assignment starts each partition at the
    /// offset the rewind check read, so librdkafka need not fetch it again.
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, partitions: &mut TopicPartitionList) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => self.assign(consumer, partitions),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.revoke(consumer),
            _ => {
                tracing::warn!(job = %self.job, error = %RDKafkaErrorCode::from(err), "rebalance failed");
                let _ = consumer.unassign();
            }
        }
    }
}

impl Rebalancer {
    /// Restores the assigned partitions' state and checks it against the
    /// group's offsets, then starts fetching them: from the committed
    /// offsets just checked, or per `auto.offset.reset` where the group has
    /// none. No record of a partition reaches the job loop before its state.
    fn assign(&self, consumer: &BaseConsumer<Self>, partitions: &TopicPartitionList) {
        // Every assigned partition's records go to the job loop's fetch queue.
        for element in partitions.elements() {
            self.router.route(consumer, element.topic(), element.partition());
        }
        let assigned: Vec<(String, i32)> =
            partitions.elements().iter().map(|element| (element.topic().to_string(), element.partition())).collect();
        tracing::info!(job = %self.job, ?assigned, "partitions assigned");
        let result = self.check_whole_namespaces(&assigned).and_then(|()| {
            if assigned.is_empty() { Ok(Checked::default()) } else { self.restore_and_check(&assigned) }
        });
        // After a failure the session ends; the partitions are assigned
        // anyway, with librdkafka's own starting offsets, so the consumer's
        // state stays what librdkafka expects until it is closed.
        let mut start = partitions.clone();
        if let Ok(checked) = &result {
            for ((topic, partition), committed) in &checked.committed {
                let offset = committed.map_or(self.start_without_commit, Offset::Offset);
                let _ = start.set_partition_offset(topic, *partition, offset);
            }
        }
        let assign_failure = consumer
            .assign(&start)
            .err()
            .map(|err| SessionError::Restart(format!("assigning the partitions the group gave this process failed: {err}")));
        self.note(|events| {
            events.assigned = true;
            match result {
                Ok(checked) => events.included = checked.included,
                Err(failure) => events.failure = Some(failure),
            }
            if events.failure.is_none() {
                events.failure = assign_failure;
            }
        });
    }

    /// Nothing of the in-flight transaction may commit once another
    /// process may own its partitions: abort it, then give them up.
    fn revoke(&self, consumer: &BaseConsumer<Self>) {
        let mut failure = None;
        if self.guarantee == Guarantee::ExactlyOnce && self.open.swap(false, Ordering::SeqCst) {
            if let Err(err) = self.producer.abort_transaction(KAFKA_TIMEOUT) {
                failure = Some(SessionError::Restart(format!("aborting the transaction on revocation failed: {err}")));
            }
            tracing::info!(job = %self.job, "partitions revoked; the in-flight transaction was aborted");
        } else {
            tracing::info!(job = %self.job, "partitions revoked");
        }
        let _ = consumer.unassign();
        self.note(|events| {
            events.revoked = true;
            if failure.is_some() {
                events.failure = failure;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_owned_for_every_input_or_not_at_all() {
        let inputs = vec!["usage".to_string(), "credits".to_string()];
        let both = vec![("usage".to_string(), 0), ("credits".to_string(), 0), ("usage".to_string(), 2), ("credits".to_string(), 2)];
        assert_eq!(split_namespace(&inputs, &both), None);
        let half = vec![("usage".to_string(), 0), ("credits".to_string(), 0), ("usage".to_string(), 1)];
        assert_eq!(split_namespace(&inputs, &half), Some((1, "credits")));
    }

    #[test]
    fn an_instance_id_is_kept_and_a_damaged_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let id = instance_id(dir.path()).unwrap();
        assert!(valid_instance_id(&id));
        assert_eq!(instance_id(dir.path()).unwrap(), id, "the same directory keeps its id");
        std::fs::write(dir.path().join("instance-id"), "").unwrap();
        let err = instance_id(dir.path()).unwrap_err();
        assert!(err.contains("not an instance id") && err.contains("delete the file"), "{err}");
    }
}
