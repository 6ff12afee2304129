//! The Kafka job loop: consume, run the plugin, commit on the interval;
//! restore state when partitions arrive, abort the in-flight transaction
//! before partitions leave, and rebuild the clients when Kafka fails.

mod commit;
mod instance_id;

pub use instance_id::InstanceIdError;
mod progress;
mod rebalance;
mod session;
mod start;
mod state_updater;

pub use start::{Seeded, StartAt, StartError};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;

use progress::Progress;
use rebalance::Rebalancer;
use session::Session;
use state_updater::{Generation, StateUpdater, UpdaterParts};

use super::KafkaJobError;
use super::committer::{
    Addresses, DeliveryTracker, JobProducer, KafkaCommitError, KafkaCommitter,
    MAX_KAFKA_VALUE_BYTES, RecordCollector, TransactionOwner,
};
use super::fetch::{FetchQueue, Router};
use super::restore::{RestoreError, RestoreLimits, Restorer};
use super::topics::{self, TopicLayout};
use super::watermarks::SharedWatermarks;
use super::{QuietEof, SetupError};
use tally_core::hot_swap::{PluginSlot, SwapPolicy};
use tally_core::observe::{JobObserver, RestoreProgress, RunSummary};
use tally_core::plugin::{JobContext, LoadedPlugin, PluginError, Processor};
use tally_core::state::StateStore;
use tally_core::task::{Finish, RunError, Task};
use tally_core::transaction::Transaction;
use tally_state_rocks::{Durability, RocksStore};

use crate::config::{Guarantee, KafkaConfig};
use tally_core::lock::DirLock;
use tally_core::settings::{InvalidJob, JobSettings};

/// How long a transactional call (init, send offsets, commit, abort) may take.
pub(super) const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a session start waits for a client to reach a learned broker
/// (see [`topics::connect_to_cluster`]).
pub(super) const CONNECT_BUDGET: Duration = Duration::from_secs(2);
/// Longest an idle job loop waits for records before it looks at the
/// consumer's own queue (rebalances, errors) again.
pub(super) const IDLE_FETCH_WAIT: Duration = Duration::from_millis(10);
/// Most events the job loop serves from the consumer's own queue before it
/// reads records again.
pub(super) const MAX_EVENTS_PER_TURN: usize = 1000;
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
    config: JobSettings,
    kafka: KafkaConfig,
    layout: TopicLayout,
    store: Arc<dyn StateStore>,
    task: Task,
    instance: String,
    /// The changelog restorer, made by the first session and kept: its
    /// consumer never joins the group, so a new session can use it as it
    /// is, and closing it costs 100 ms (rdkafka polls for the close in
    /// steps of 100 ms).
    restorer: Option<Arc<Restorer>>,
    /// Where restores report how far they got (the host's status and
    /// metrics): [`KafkaJob::report_restores_to`].
    restore_progress: Arc<RestoreProgress>,
    _lock: DirLock,
}

/// Why a session (one consumer and one producer) ended early.
pub(super) enum SessionError {
    /// Kafka failed, fenced us, or left a commit's outcome unknown: build
    /// new clients, rejoin, restore, and go on.
    Restart(Restart),
    /// Retrying does not help.
    Fatal(KafkaJobError),
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionError::Restart(restart) => restart.fmt(f),
            SessionError::Fatal(err) => err.fmt(f),
        }
    }
}

impl From<RunError> for SessionError {
    fn from(err: RunError) -> Self {
        SessionError::Fatal(err.into())
    }
}

impl SessionError {
    /// A failure of the job's own parts (its state, its plugin, its
    /// configuration): retrying does not help.
    pub(super) fn fatal(err: impl Into<KafkaJobError>) -> SessionError {
        SessionError::Fatal(err.into())
    }
}

impl From<KafkaError> for SessionError {
    fn from(err: KafkaError) -> Self {
        SessionError::Restart(Restart::Kafka(err))
    }
}

impl From<Restart> for SessionError {
    fn from(restart: Restart) -> Self {
        SessionError::Restart(restart)
    }
}

/// What made a session restart; each says what failed. Retrying (new
/// clients, a new group membership, a new restore) is the remedy for all.
#[derive(Debug, thiserror::Error)]
pub(super) enum Restart {
    /// A Kafka call failed.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A Kafka call, named, failed.
    #[error("{doing} failed: {source}")]
    Call { doing: &'static str, source: KafkaError },
    /// A commit failed with its outcome unknown, or the producer was fenced.
    #[error("commit failed, outcome unknown or fenced: {0}")]
    Commit(#[source] KafkaCommitError),
    /// Restoring state from the changelog failed.
    #[error(transparent)]
    Restore(RestoreError),
    /// Reading the end of a changelog partition failed.
    #[error("reading the end of changelog `{changelog}` partition {partition} failed: {source}")]
    ChangelogEnd { changelog: String, partition: i32, source: KafkaError },
    /// The consumer reported a fatal error (librdkafka's words).
    #[error("the consumer failed: {0}")]
    Consumer(String),
    /// The restored state is behind the group's committed offsets, still
    /// after the settle time.
    #[error(
        "group `{group}` has committed offset {group_offset} for `{topic}` partition {partition}, but the state restored from the \
         changelog includes input only up to offset {included}. Either a transaction's commit markers have not reached the \
         changelog yet (this clears by itself), or the changelog lost records (deleted or recreated) or the group is \
         shared with another application; if it persists, stop the job and investigate before restarting it"
    )]
    StateBehind { group: String, topic: String, partition: i32, group_offset: i64, included: i64 },
}

/// How a session ended without error.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SessionEnd {
    Stopped,
    CaughtUp,
}

impl KafkaJob {
    /// Opens Kafka job `config` running `plugin`: locks its state
    /// directory, and checks (or creates) its topics.
    pub fn open(
        config: &JobSettings,
        kafka: &KafkaConfig,
        plugin: &LoadedPlugin,
    ) -> Result<KafkaJob, KafkaJobError> {
        KafkaJob::open_in(config, kafka, plugin, JobContext::new(&config.name))
    }

    /// Like [`KafkaJob::open`], with the plugin's instances in `context`
    /// (stopped by its signal, seated in the host's CPU sharing).
    pub fn open_in(
        config: &JobSettings,
        kafka: &KafkaConfig,
        plugin: &LoadedPlugin,
        context: JobContext,
    ) -> Result<KafkaJob, KafkaJobError> {
        let context = context.with_plugin_config(config.plugin_config.as_deref().unwrap_or("{}"));
        let make = plugin.processor_maker(config.limits, context.clone());
        KafkaJob::open_with_in(config, kafka, context, make)
    }

    /// Like [`KafkaJob::open`], with the processor made by `make_processor`.
    pub fn open_with(
        config: &JobSettings,
        kafka: &KafkaConfig,
        make_processor: impl FnOnce() -> Result<Box<dyn Processor>, PluginError>,
    ) -> Result<KafkaJob, KafkaJobError> {
        KafkaJob::open_with_in(config, kafka, JobContext::new(&config.name), make_processor)
    }

    fn open_with_in(
        config: &JobSettings,
        kafka: &KafkaConfig,
        context: JobContext,
        make_processor: impl FnOnce() -> Result<Box<dyn Processor>, PluginError>,
    ) -> Result<KafkaJob, KafkaJobError> {
        config.validate()?;
        kafka.validate(config)?;
        if config.periods.is_some() && kafka.guarantee != Guarantee::ExactlyOnce {
            return Err(InvalidJob {
                job: config.name.clone(),
                message: "it declares [periods] with guarantee = \"at_least_once\": a period's FINAL and the watermarks shared with the job's other instances are only right inside a Kafka transaction; use exactly_once (the default)".into(),
            }
            .into());
        }
        if config.periods.is_some() && kafka.inputs.len() > 1 {
            return Err(InvalidJob {
                job: config.name.clone(),
                message: format!(
                    "it declares [periods] and reads {} input topics; a period job reads one (its partitions are the periods' partitions): merge the inputs into one topic, or run one job per topic",
                    kafka.inputs.len()
                ),
            }
            .into());
        }
        let kafka = kafka.clone();
        let processor = make_processor()?;
        config.check_plugin_kind(processor.kind())?;
        let lock = DirLock::acquire(&kafka.state_dir)?;
        let instance = instance_id::instance_id(&kafka.state_dir)
            .map_err(|err| KafkaJobError::Setup { job: config.name.clone(), source: err.into() })?;
        let layout = topics::prepare(config, &kafka)?;
        // The Kafka transaction is the commit point and the changelog the
        // durable copy: RocksDB's commits need no fsync (see `Durability`).
        let store: Arc<dyn StateStore> = Arc::new(RocksStore::open_with(
            &kafka.state_dir.join("db"),
            Durability::ChangelogBacked,
        )?);
        let mut limits = config.limits;
        limits.max_value_bytes = limits.max_value_bytes.min(MAX_KAFKA_VALUE_BYTES);
        let mut txn = Transaction::new(store.clone(), config.outputs.clone().into(), limits)
            .with_emit(config.emit_per_output());
        if let Some(mut book) = config.period_book() {
            // Nothing is owned before the group assigns partitions.
            book.own(std::collections::BTreeSet::new());
            txn = txn.with_periods(book);
        }
        tracing::info!(job = %config.name, plugin = %processor.digest(), partitions = layout.partitions, instance = %instance, "Kafka job opened");
        let mut task = Task::new(&config.name, processor, txn, context, config.commit_interval());
        task.commit_when_caught_up(kafka.commit_when_caught_up);
        Ok(KafkaJob {
            config: config.clone(),
            kafka,
            layout,
            store,
            task,
            instance,
            restorer: None,
            restore_progress: Arc::default(),
            _lock: lock,
        })
    }

    /// Reports every restore's progress to `progress` (the host's status
    /// and metrics read it); unreported otherwise. Call before running.
    pub fn report_restores_to(&mut self, progress: Arc<RestoreProgress>) {
        self.restore_progress = progress;
    }

    /// Lets new plugin versions pushed into `slot` be swapped in at
    /// transaction boundaries, and reports commits and swaps to `observer`.
    pub fn attach(
        &mut self,
        slot: Arc<PluginSlot>,
        policy: SwapPolicy,
        observer: Arc<dyn JobObserver>,
    ) {
        self.task.attach(slot, self.config.limits, policy, observer);
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
        self.task.plugin_digest()
    }

    /// A period job's partitions held by this instance (`None` for a job
    /// without periods).
    pub fn period_status(&self) -> Option<Vec<tally_core::periods::PartitionStatus>> {
        self.task.period_status()
    }

    /// Runs until `stop` is set (or, with `until_caught_up`, until the
    /// assigned partitions are read to their end), committing what it
    /// processed before returning. Kafka failures rebuild the clients and
    /// go on; only failures retrying cannot fix end the run.
    pub fn run_until(
        &mut self,
        stop: &AtomicBool,
        options: KafkaRunOptions,
    ) -> Result<RunSummary, KafkaJobError> {
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
                Err(SessionError::Restart(reason)) => {
                    tracing::warn!(job = %self.config.name, %reason, "Kafka session failed; rejoining the group and restoring state");
                    if session_started.elapsed() > Duration::from_secs(30) {
                        backoff = Duration::from_millis(250);
                    }
                    let resume_at = Instant::now() + backoff;
                    self.task.context().idle();
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
    /// One session: builds the clients (a producer and its transaction
    /// owner, the group's consumer with its rebalance handler, the restore
    /// consumer once), then drives the core's loop with a [`Session`].
    fn run_session(
        &mut self,
        stop: &AtomicBool,
        options: KafkaRunOptions,
        summary: &mut RunSummary,
    ) -> Result<SessionEnd, SessionError> {
        let (config, kafka) = (&self.config, &self.kafka);
        let tracker = DeliveryTracker::new(self.layout.changelog.clone());
        let producer: Arc<JobProducer> = Arc::new(
            topics::producer_config(config, kafka, &self.instance)
                .create_with_context(tracker)
                .map_err(|err| self.client_error(err))?,
        );
        let settle =
            Duration::from_millis(2 * kafka.transaction_timeout_ms) + Duration::from_secs(10);
        let (restorer, new_restorer) = match &self.restorer {
            Some(restorer) => (restorer.clone(), false),
            None => {
                let restore_config = topics::restore_config(config, kafka);
                let leader_fetch = topics::leader_fetch_settings(kafka, &restore_config);
                let consumer: BaseConsumer<QuietEof> = restore_config
                    .create_with_context(QuietEof)
                    .map_err(|err| self.client_error(err))?;
                let limits = RestoreLimits {
                    stall: Duration::from_millis(kafka.restore_stall_ms),
                    checkpoint_bytes: kafka.restore_checkpoint_bytes,
                };
                let progress = self.restore_progress.clone();
                let changelog = self.layout.changelog.clone();
                let restorer = Arc::new(Restorer::new(
                    consumer,
                    self.store.clone(),
                    changelog,
                    limits,
                    leader_fetch,
                    progress,
                ));
                (self.restorer.insert(restorer).clone(), true)
            }
        };
        let (config, kafka) = (&self.config, &self.kafka);
        let owner = Arc::new(TransactionOwner::new(producer, kafka.guarantee, KAFKA_TIMEOUT));
        let router = Arc::new(Router::default());
        let consumer_config = topics::consumer_config(config, kafka, &self.instance);
        let generation = Arc::new(Generation::default());
        let rebalancer = Rebalancer {
            router: router.clone(),
            job: config.name.clone(),
            inputs: kafka.inputs.clone(),
            owner: owner.clone(),
            generation: generation.clone(),
            events: Mutex::default(),
        };
        let updater_parts = UpdaterParts {
            job: config.name.clone(),
            group: kafka.group_id(&config.name),
            guarantee: kafka.guarantee,
            owner: owner.clone(),
            restorer: restorer.clone(),
            store: self.store.clone(),
            settle,
            generation,
        };
        let consumer: BaseConsumer<Rebalancer> = consumer_config
            .create_with_context(rebalancer)
            .map_err(|err| self.client_error(err))?;
        // Open before subscribing: every assigned partition is routed to it.
        let fetch = FetchQueue::open(&consumer, router, config.batch_size);
        let topics: Vec<&str> = kafka.inputs.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        // The group join goes on in librdkafka's threads while the other
        // clients connect: the assignment is handled (and its restore
        // begun) only when the loop first polls, after the producer is ready. They
        // connect before they are used: a restore or a coordinator lookup
        // begun earlier would wait on librdkafka's retry timers.
        topics::connect_to_cluster(owner.producer().client(), CONNECT_BUDGET);
        if new_restorer {
            topics::connect_to_cluster(restorer.consumer().client(), CONNECT_BUDGET);
        }
        // Fences an earlier process with our transactional id and aborts
        // the transaction it left open (exactly_once).
        owner.fence_earlier_producers()?;
        let addresses = self.addresses();
        let watermarks = match &self.layout.watermarks {
            Some(topic) => Some(
                SharedWatermarks::open(
                    topics::watermark_config(config, kafka),
                    topic,
                    self.layout.partitions.max(0) as u32,
                )
                .map_err(|err| self.client_error(err))?,
            ),
            None => None,
        };
        let collector = RecordCollector::new(owner.clone(), addresses);
        let committer = KafkaCommitter::new(owner, collector, self.store.clone());
        let KafkaJob { config, kafka, task, .. } = self;
        let result = std::thread::scope(|scope| {
            let mut session = Session {
                job: config,
                kafka,
                consumer: &consumer,
                fetch,
                committer: &committer,
                updater: StateUpdater::start(scope, updater_parts),
                scope,
                in_flight: None,
                progress: Progress {
                    pending: Vec::with_capacity(config.batch_size),
                    ..Progress::default()
                },
                batch_ends: Vec::new(),
                failure: None,
                options,
                context: task.context().clone(),
                watermarks,
                shared: BTreeMap::new(),
                registered: BTreeSet::new(),
                drained: false,
            };
            task.drive(&mut session, stop, summary)
        });
        // Hand over cleanly: abort what is open, then leave the group.
        let _ = committer.abort();
        drop(consumer);
        Ok(match result? {
            Finish::Stopped => SessionEnd::Stopped,
            Finish::End => SessionEnd::CaughtUp,
        })
    }

    /// The topics the job's records go to.
    fn addresses(&self) -> Addresses {
        let (config, kafka) = (&self.config, &self.kafka);
        Addresses {
            job: config.name.clone(),
            inputs: kafka.inputs.clone(),
            outputs: config
                .outputs
                .iter()
                .map(|name| kafka.output_topic(name).unwrap_or_default().to_string())
                .collect(),
            dead_letter: kafka.dead_letter_topic.clone(),
            changelog: self.layout.changelog.clone(),
            watermarks: self.layout.watermarks.clone(),
        }
    }

    /// A client that cannot even be created has a bad setting: say which.
    pub(super) fn client_error(&self, err: KafkaError) -> SessionError {
        SessionError::Fatal(KafkaJobError::Setup {
            job: self.config.name.clone(),
            source: SetupError::Client(err),
        })
    }
}
