//! The task: the job loop that reads batches from the source, runs them
//! through the plugin into a transaction, and commits on the interval.
//!
//! A batch the plugin traps on is dropped and its events are retried one by
//! one, so the event to blame is dead-lettered alone with the reason and
//! the events around it are applied exactly once (DESIGN invariant 5).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::committer::{CommitError, Committer, LocalCommitter};
use crate::config::JobConfig;
use crate::lock::{LockError, DirLock};
use crate::plugin::{Event, LoadedPlugin, PluginError, ProcessError, Processor};
use crate::sink::Lineage;
use crate::source::{InputRecord, LocalSource, SourceError};
use crate::state_store::{RocksStore, StateError, StateStore};
use crate::transaction::{DeadLetter, SourcePosition, Transaction};

/// Why a job stopped before finishing its inputs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    /// The state directory is locked or unusable.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The state store failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// Reading inputs failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A commit failed.
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// The plugin could not be loaded or instantiated.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The job's configuration does not fit the plugin; nothing of the
    /// transaction in progress was committed.
    #[error("job `{job}` stopped before committing anything more: {message}")]
    Misconfigured { job: String, message: String },
    /// The job configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// An earlier commit failed; the task must be reopened, which recovers
    /// from the last commit.
    #[error("an earlier commit of job `{job}` failed; open the job again to recover from its last commit")]
    Failed { job: String },
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Records read from the inputs in this run.
    pub records: u64,
    /// Records applied by the plugin.
    pub applied: u64,
    /// Records sent to the dead-letter output.
    pub dead_lettered: u64,
    /// Output records written (dead letters not included).
    pub outputs: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Whether the run stopped on request before the inputs' end (after
    /// committing everything it had processed).
    pub stopped_early: bool,
}

impl RunSummary {
    /// One line for people: counts, commits, time and rate.
    pub fn describe(&self, job: &str) -> String {
        let seconds = self.elapsed.as_secs_f64();
        format!(
            "job `{job}`: {} records ({} applied, {} dead-lettered), {} outputs, {} commits in {seconds:.2}s ({:.0} records/s)",
            self.records,
            self.applied,
            self.dead_lettered,
            self.outputs,
            self.commits,
            self.records as f64 / seconds.max(1e-9)
        )
    }
}

/// What one batch did to the transaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Events applied.
    pub applied: u64,
    /// Events dead-lettered.
    pub dead_lettered: u64,
}

/// Runs `events` through `processor` into `txn`. Rejected events become dead
/// letters; if the plugin fails on the batch, the batch is dropped and its
/// events are retried one at a time, so only the failing ones are
/// dead-lettered. Errs only when the host itself fails.
pub fn process_batch(
    processor: &mut dyn Processor,
    txn: &mut Transaction,
    events: &[Event],
) -> Result<BatchOutcome, ProcessError> {
    txn.reset_batch_budget();
    process_or_isolate(processor, txn, events)
}

/// [`process_batch`] without resetting the budget: the retries of a
/// failed batch share the batch's budget.
fn process_or_isolate(
    processor: &mut dyn Processor,
    txn: &mut Transaction,
    events: &[Event],
) -> Result<BatchOutcome, ProcessError> {
    let mut outcome = BatchOutcome::default();
    match run_once(processor, txn, events) {
        Ok(rejected) => {
            outcome.dead_lettered = rejected;
            outcome.applied = events.len() as u64 - rejected;
        }
        Err(ProcessError::Plugin(reason)) if events.len() == 1 => {
            dead_letter(txn, &events[0], reason);
            outcome.dead_lettered = 1;
        }
        Err(ProcessError::Plugin(reason)) => {
            tracing::warn!(events = events.len(), %reason, "plugin failed on a batch; retrying its events one by one");
            for event in events {
                let one = process_or_isolate(processor, txn, std::slice::from_ref(event))?;
                outcome.applied += one.applied;
                outcome.dead_lettered += one.dead_lettered;
            }
        }
        Err(host) => return Err(host),
    }
    Ok(outcome)
}

/// One plugin call over `events`; returns how many it rejected.
fn run_once(processor: &mut dyn Processor, txn: &mut Transaction, events: &[Event]) -> Result<u64, ProcessError> {
    txn.begin_batch(events.iter().map(|e| SourcePosition { partition: e.partition, offset: e.offset }));
    let mut rejections = match processor.process(events, txn) {
        Ok(rejections) => rejections,
        Err(err) => {
            txn.drop_batch();
            return Err(err);
        }
    };
    rejections.sort_by_key(|r| r.index);
    rejections.dedup_by_key(|r| r.index);
    if let Some(bad) = rejections.iter().find(|r| r.index as usize >= events.len()) {
        txn.drop_batch();
        return Err(ProcessError::Plugin(format!(
            "plugin rejected event {}, but the batch has {} events",
            bad.index,
            events.len()
        )));
    }
    let rejected: Vec<u32> = rejections.iter().map(|r| r.index).collect();
    txn.drop_outputs_of(&rejected);
    txn.keep_batch();
    for rejection in &rejections {
        dead_letter(txn, &events[rejection.index as usize], rejection.reason.clone());
    }
    Ok(rejections.len() as u64)
}

fn dead_letter(txn: &mut Transaction, event: &Event, reason: String) {
    let source = SourcePosition { partition: event.partition, offset: event.offset };
    txn.dead_letters.push(DeadLetter { source, reason, record: event.value.clone() });
}

/// Turns input records into plugin events, moving their bytes.
pub fn to_events(records: &mut Vec<InputRecord>, events: &mut Vec<Event>) {
    events.clear();
    events.extend(records.drain(..).map(|record| Event {
        partition: record.position.partition,
        offset: record.position.offset,
        timestamp_ms: None,
        key: None,
        value: record.value,
    }));
}

/// A transaction holding this many bytes commits before its interval is up,
/// so a burst of big outputs or state cannot grow the host without bound.
pub const MAX_TRANSACTION_BYTES: u64 = 256 << 20;

/// A local-mode job: NDJSON inputs through a processor into output files,
/// exactly once across crashes.
pub struct LocalTask {
    config: JobConfig,
    source: LocalSource,
    processor: Box<dyn Processor>,
    txn: Transaction,
    committer: LocalCommitter,
    /// Set when a run failed: what is in memory can no longer be committed.
    failed: bool,
    _locks: Vec<DirLock>,
}

impl LocalTask {
    /// Opens a local job running `plugin`: locks the state directory,
    /// recovers the last commit (cutting uncommitted output), and positions
    /// the inputs after the last committed record.
    pub fn open(config: &JobConfig, plugin: &LoadedPlugin) -> Result<LocalTask, TaskError> {
        let plugin = plugin.clone();
        let limits = config.limits;
        LocalTask::open_with(config, move || Ok(Box::new(plugin.instantiate(limits)?)))
    }

    /// Like [`LocalTask::open`], with the processor made by `make_processor`
    /// (benchmarks use it to run the same logic natively).
    pub fn open_with(
        config: &JobConfig,
        make_processor: impl FnOnce() -> Result<Box<dyn Processor>, PluginError>,
    ) -> Result<LocalTask, TaskError> {
        config.validate()?;
        let local = config.local()?;
        // Refuse a missing input or a plugin that cannot start before
        // anything is created on disk.
        LocalSource::check_readable(&local.inputs)?;
        let processor = make_processor()?;
        let mut locks = vec![DirLock::acquire(&local.state_dir)?];
        if local.output_dir != local.state_dir {
            locks.push(DirLock::acquire(&local.output_dir)?);
        }
        let store: Arc<dyn StateStore> = Arc::new(RocksStore::open(&local.state_dir.join("db"))?);
        let mut output_names = config.outputs.clone();
        output_names.push(config.dead_letter_output.clone());
        let txn = Transaction::new(store.clone(), config.outputs.clone().into(), config.limits);
        let partitions = local.inputs.iter().map(|path| partition_name(path)).collect();
        let lineage = Lineage::new(&config.name, partitions, processor.digest());
        let processor_digest = processor.digest().to_string();
        let (committer, recovered) = LocalCommitter::recover(store, &local.output_dir, &output_names, lineage)?;
        let source = LocalSource::open(&local.inputs, &recovered.positions)?;
        tracing::info!(job = %config.name, plugin = %processor_digest, resumed_from = ?recovered.positions, "local job opened");
        Ok(LocalTask { config: config.clone(), source, processor, txn, committer, failed: false, _locks: locks })
    }

    /// Path of output `name`'s file.
    pub fn output_path(&self, name: &str) -> Option<PathBuf> {
        let index = self.config.outputs.iter().position(|output| output == name).or_else(|| {
            (name == self.config.dead_letter_output).then_some(self.config.outputs.len())
        })?;
        Some(self.committer.output_path(index).to_path_buf())
    }

    /// Processes every input to its end, committing every commit interval
    /// and once at the end.
    pub fn run(&mut self) -> Result<RunSummary, TaskError> {
        self.run_until(&AtomicBool::new(false))
    }

    /// Like [`LocalTask::run`], but stops early once `stop` is set (checked
    /// between batches), committing what was processed: a clean shutdown.
    /// After an error the task refuses to run again: open the job anew.
    pub fn run_until(&mut self, stop: &AtomicBool) -> Result<RunSummary, TaskError> {
        if self.failed {
            return Err(TaskError::Failed { job: self.config.name.clone() });
        }
        let result = self.run_batches(stop);
        if result.is_err() {
            self.failed = true;
            self.txn.abort();
        }
        result
    }

    fn run_batches(&mut self, stop: &AtomicBool) -> Result<RunSummary, TaskError> {
        let started = Instant::now();
        let interval = self.config.commit_interval();
        let mut summary = RunSummary::default();
        let mut records = Vec::with_capacity(self.config.batch_size);
        let mut events = Vec::with_capacity(self.config.batch_size);
        let mut last_commit = Instant::now();
        loop {
            if stop.load(Ordering::Relaxed) {
                summary.stopped_early = true;
                break;
            }
            self.source.next_batch(self.config.batch_size, &mut records)?;
            if records.is_empty() {
                break;
            }
            summary.records += records.len() as u64;
            to_events(&mut records, &mut events);
            let outputs_before = self.txn.outputs.len();
            let outcome = process_batch(&mut *self.processor, &mut self.txn, &events).map_err(|err| match err {
                ProcessError::Host(state) => TaskError::State(state),
                ProcessError::Instantiate(plugin) => TaskError::Plugin(plugin),
                ProcessError::Misconfigured(message) => TaskError::Misconfigured { job: self.config.name.clone(), message },
                ProcessError::Plugin(_) => unreachable!("plugin failures end as dead letters"),
            })?;
            summary.applied += outcome.applied;
            summary.dead_lettered += outcome.dead_lettered;
            summary.outputs += (self.txn.outputs.len() - outputs_before) as u64;
            if last_commit.elapsed() >= interval || self.txn.pending_bytes() >= MAX_TRANSACTION_BYTES {
                self.commit(&mut summary)?;
                last_commit = Instant::now();
            }
        }
        self.commit(&mut summary)?;
        summary.elapsed = started.elapsed();
        tracing::info!(job = %self.config.name, records = summary.records, dead_lettered = summary.dead_lettered, commits = summary.commits, "inputs done");
        Ok(summary)
    }

    fn commit(&mut self, summary: &mut RunSummary) -> Result<(), TaskError> {
        let positions = self.source.positions();
        let started = Instant::now();
        self.committer.commit(&mut self.txn, &positions)?;
        summary.commits += 1;
        tracing::debug!(job = %self.config.name, took_us = started.elapsed().as_micros() as u64, "committed");
        Ok(())
    }
}

/// The name a partition goes by in lineage: its file name.
fn partition_name(path: &std::path::Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |name| name.to_string_lossy().into_owned())
}
