//! What the serve runner needs of a job, whichever mode it runs in: one
//! [`Job`] trait over the local and the Kafka driver, and [`JobError`],
//! the retry policy every driver's error carries.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tally_core::hot_swap::{PluginSlot, SwapPolicy};
use tally_core::observe::{JobObserver, RestoreProgress, RunSummary};
use tally_core::plugin::{JobContext, LoadedPlugin};
use tally_core::state::StateStore;

use crate::config::JobConfig;
use tally_kafka::{KafkaJob, KafkaJobError, KafkaRunOptions, StartAt};
use tally_local::{LocalTask, TaskError};

/// A driver's error, saying itself what should happen next.
pub trait JobError: std::error::Error {
    /// Whether opening the job again may help (Kafka or the disk failed),
    /// or only a person can (a bad configuration, a replaced input, a
    /// rewind).
    fn is_retryable(&self) -> bool;

    /// Whether a new plugin version is the fix: the job waits for one.
    fn needs_new_plugin(&self) -> bool;
}

/// A job in either mode, as the runner drives it.
pub trait Job: Sized {
    /// Why it stopped.
    type Error: JobError;

    /// Opens job `config` running `plugin`, its instances in `context`.
    fn open(
        config: &JobConfig,
        plugin: &LoadedPlugin,
        context: JobContext,
    ) -> Result<Self, Self::Error>;

    /// Lets pushed versions in at transaction boundaries, reporting to `observer`.
    fn attach(&mut self, slot: Arc<PluginSlot>, policy: SwapPolicy, observer: Arc<dyn JobObserver>);

    /// Reports its state restores to `progress` (Kafka mode; a local job
    /// restores nothing).
    fn report_restores_to(&mut self, _progress: Arc<RestoreProgress>) {}

    /// The committed state, and how many input partitions namespace it (0:
    /// not namespaced).
    fn state(&self) -> (Arc<dyn StateStore>, i32);

    /// Makes `start` its first transaction, before it first runs (a Kafka
    /// job's replay from a time or offsets: see [`KafkaJob::seed_start`]).
    /// A local job starts at its inputs' start: nothing to seed.
    fn seed_start(&self, _start: &StartAt) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Runs until `stop` is set, committing what it processed: a local job
    /// follows its inputs as they grow, a Kafka job keeps consuming.
    fn run(&mut self, stop: &AtomicBool) -> Result<RunSummary, Self::Error>;
}

impl JobError for TaskError {
    fn is_retryable(&self) -> bool {
        TaskError::is_retryable(self)
    }

    fn needs_new_plugin(&self) -> bool {
        TaskError::needs_new_plugin(self)
    }
}

impl JobError for KafkaJobError {
    fn is_retryable(&self) -> bool {
        KafkaJobError::is_retryable(self)
    }

    fn needs_new_plugin(&self) -> bool {
        KafkaJobError::needs_new_plugin(self)
    }
}

impl Job for LocalTask {
    type Error = TaskError;

    fn open(
        config: &JobConfig,
        plugin: &LoadedPlugin,
        context: JobContext,
    ) -> Result<Self, TaskError> {
        LocalTask::open_in(&config.settings, config.local()?, plugin, context)
    }

    fn attach(
        &mut self,
        slot: Arc<PluginSlot>,
        policy: SwapPolicy,
        observer: Arc<dyn JobObserver>,
    ) {
        LocalTask::attach(self, slot, policy, observer);
    }

    fn state(&self) -> (Arc<dyn StateStore>, i32) {
        (self.store(), 0)
    }

    fn run(&mut self, stop: &AtomicBool) -> Result<RunSummary, TaskError> {
        self.run_following(stop)
    }
}

impl Job for KafkaJob {
    type Error = KafkaJobError;

    fn open(
        config: &JobConfig,
        plugin: &LoadedPlugin,
        context: JobContext,
    ) -> Result<Self, KafkaJobError> {
        KafkaJob::open_in(&config.settings, config.kafka()?, plugin, context)
    }

    fn attach(
        &mut self,
        slot: Arc<PluginSlot>,
        policy: SwapPolicy,
        observer: Arc<dyn JobObserver>,
    ) {
        KafkaJob::attach(self, slot, policy, observer);
    }

    fn report_restores_to(&mut self, progress: Arc<RestoreProgress>) {
        KafkaJob::report_restores_to(self, progress);
    }

    fn state(&self) -> (Arc<dyn StateStore>, i32) {
        (self.store(), self.partitions())
    }

    fn seed_start(&self, start: &StartAt) -> Result<(), KafkaJobError> {
        KafkaJob::seed_start(self, start).map(|_| ())
    }

    fn run(&mut self, stop: &AtomicBool) -> Result<RunSummary, KafkaJobError> {
        self.run_until(stop, KafkaRunOptions::default())
    }
}
