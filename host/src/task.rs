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
use crate::hot_swap::{CommitReport, HotSwap, JobObserver, NoObserver, PluginSlot, SwapPolicy};
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
    /// Counts a batch of `records` input records that the plugin processed.
    pub fn count_batch(&mut self, records: usize, outcome: &BatchOutcome) {
        self.records += records as u64;
        self.applied += outcome.applied;
        self.dead_lettered += outcome.dead_lettered;
        self.outputs += outcome.outputs;
    }

    /// Adds the counts of a later part of the same run.
    pub fn absorb(&mut self, later: &RunSummary) {
        self.records += later.records;
        self.applied += later.applied;
        self.dead_lettered += later.dead_lettered;
        self.outputs += later.outputs;
        self.commits += later.commits;
        self.stopped_early |= later.stopped_early;
    }

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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Events applied.
    pub applied: u64,
    /// Events dead-lettered.
    pub dead_lettered: u64,
    /// Output records the batch added (dead letters not included).
    pub outputs: u64,
    /// Plugin calls that trapped or broke a limit.
    pub traps: u64,
    /// Why the first of them failed.
    pub first_failure: Option<String>,
}

impl BatchOutcome {
    fn add(&mut self, other: BatchOutcome) {
        self.applied += other.applied;
        self.dead_lettered += other.dead_lettered;
        self.outputs += other.outputs;
        self.traps += other.traps;
        if self.first_failure.is_none() {
            self.first_failure = other.first_failure;
        }
    }
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
    let before = txn.outputs.len();
    let mut outcome = process_or_isolate(processor, txn, events)?;
    outcome.outputs = (txn.outputs.len() - before) as u64;
    Ok(outcome)
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
            dead_letter(txn, &events[0], reason.clone());
            outcome.dead_lettered = 1;
            outcome.traps = 1;
            outcome.first_failure = Some(reason);
        }
        Err(ProcessError::Plugin(reason)) => {
            tracing::warn!(events = events.len(), %reason, "plugin failed on a batch; retrying its events one by one");
            outcome.traps = 1;
            outcome.first_failure = Some(reason);
            for event in events {
                outcome.add(process_or_isolate(processor, txn, std::slice::from_ref(event))?);
            }
        }
        Err(host) => return Err(host),
    }
    Ok(outcome)
}

/// Like [`process_batch`], for a plugin version on trial: a failing batch
/// is dropped from the transaction and reported in
/// [`BatchOutcome::first_failure`], not retried event by event (the
/// version is about to be rolled back, and the batch redone).
pub fn process_batch_on_trial(
    processor: &mut dyn Processor,
    txn: &mut Transaction,
    events: &[Event],
) -> Result<BatchOutcome, ProcessError> {
    txn.reset_batch_budget();
    let before = txn.outputs.len();
    match run_once(processor, txn, events) {
        Ok(rejected) => Ok(BatchOutcome {
            applied: events.len() as u64 - rejected,
            dead_lettered: rejected,
            outputs: (txn.outputs.len() - before) as u64,
            ..BatchOutcome::default()
        }),
        Err(ProcessError::Plugin(reason)) => Ok(BatchOutcome { traps: 1, first_failure: Some(reason), ..BatchOutcome::default() }),
        // A version on trial that emits to an undeclared output, or cannot
        // even start again, fails its trial; the previous version goes on.
        Err(ProcessError::Misconfigured(reason)) => Ok(BatchOutcome { first_failure: Some(reason), ..BatchOutcome::default() }),
        Err(ProcessError::Instantiate(err)) => Ok(BatchOutcome { first_failure: Some(err.to_string()), ..BatchOutcome::default() }),
        Err(host) => Err(host),
    }
}

/// [`process_batch_on_trial`] while `hot_swap` has a version on trial, else [`process_batch`].
pub fn process_batch_with(
    hot_swap: Option<&HotSwap>,
    processor: &mut dyn Processor,
    txn: &mut Transaction,
    events: &[Event],
) -> Result<BatchOutcome, ProcessError> {
    if hot_swap.is_some_and(HotSwap::on_trial) {
        process_batch_on_trial(processor, txn, events)
    } else {
        process_batch(processor, txn, events)
    }
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
    txn.push_dead_letter(DeadLetter { source, reason, record: event.value.clone() });
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
    store: Arc<dyn StateStore>,
    /// Where the inputs stand in the last commit (a rollback reads on from here).
    committed_positions: Vec<crate::source::LocalPosition>,
    hot_swap: Option<HotSwap>,
    observer: Arc<dyn JobObserver>,
    /// Set when a run failed: what is in memory can no longer be committed.
    failed: bool,
    _locks: Vec<DirLock>,
}

/// How long a following job waits before looking for new input lines.
pub const FOLLOW_POLL: Duration = Duration::from_millis(50);

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
        match &local.confine_to {
            None => LocalSource::check_readable(&local.inputs)?,
            Some(root) => drop(LocalSource::open_confined(&local.inputs, &[], Some(root))?),
        }
        let processor = make_processor()?;
        let mut locks = vec![DirLock::acquire(&local.state_dir)?];
        if local.output_dir != local.state_dir {
            locks.push(DirLock::acquire(&local.output_dir)?);
        }
        let store: Arc<dyn StateStore> = Arc::new(RocksStore::open(&local.state_dir.join("db"))?);
        let mut output_names = config.outputs.clone();
        output_names.push(config.dead_letter_output.clone());
        let mut txn = Transaction::new(store.clone(), config.outputs.clone().into(), config.limits).with_emit(config.emit_per_output());
        txn.plugin_digest = processor.digest().to_string();
        let partitions = local.inputs.iter().map(|path| partition_name(path)).collect();
        let lineage = Lineage::new(&config.name, partitions, processor.digest());
        let (committer, recovered) = LocalCommitter::recover(store.clone(), &local.output_dir, &output_names, lineage)?;
        let source = LocalSource::open_confined(&local.inputs, &recovered.positions, local.confine_to.as_deref())?;
        tracing::info!(job = %config.name, plugin = %processor.digest(), resumed_from = ?recovered.positions, "local job opened");
        Ok(LocalTask {
            config: config.clone(),
            committed_positions: source.positions(),
            source,
            processor,
            txn,
            committer,
            store,
            hot_swap: None,
            observer: Arc::new(NoObserver),
            failed: false,
            _locks: locks,
        })
    }

    /// Lets new plugin versions pushed into `slot` be swapped in at
    /// transaction boundaries, and reports commits and swaps to `observer`.
    pub fn attach(&mut self, slot: Arc<PluginSlot>, policy: SwapPolicy, observer: Arc<dyn JobObserver>) {
        self.hot_swap = Some(HotSwap::new(slot, self.config.limits, policy, observer.clone()));
        self.observer = observer;
    }

    /// The job's committed state (for queries; reads see the last commit).
    pub fn store(&self) -> Arc<dyn StateStore> {
        self.store.clone()
    }

    /// Digest of the plugin version running now.
    pub fn plugin_digest(&self) -> &str {
        self.processor.digest()
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
        self.run_guarded(stop, false)
    }

    /// Like [`LocalTask::run_until`], but at the end of the inputs it waits
    /// for more lines (appended to the input files) instead of returning; a
    /// last line without its newline is left until it is complete.
    pub fn run_following(&mut self, stop: &AtomicBool) -> Result<RunSummary, TaskError> {
        self.run_guarded(stop, true)
    }

    fn run_guarded(&mut self, stop: &AtomicBool, follow: bool) -> Result<RunSummary, TaskError> {
        if self.failed {
            return Err(TaskError::Failed { job: self.config.name.clone() });
        }
        self.source.set_follow(follow);
        let result = self.run_batches(stop, follow);
        if let Err(err) = &result {
            self.failed = true;
            self.txn.abort();
            // Best effort: reopening the task cuts the files back anyway.
            let _ = self.committer.discard();
            self.observer.aborted(&err.to_string());
        }
        result
    }

    fn run_batches(&mut self, stop: &AtomicBool, follow: bool) -> Result<RunSummary, TaskError> {
        let started = Instant::now();
        let interval = self.config.commit_interval();
        let mut summary = RunSummary::default();
        let mut records = Vec::with_capacity(self.config.batch_size);
        let mut events = Vec::with_capacity(self.config.batch_size);
        let mut last_commit = Instant::now();
        // Counts of the open transaction, added to `summary` when it commits.
        let mut uncommitted = RunSummary::default();
        self.at_boundary();
        loop {
            if stop.load(Ordering::Relaxed) {
                summary.stopped_early = true;
                break;
            }
            self.source.next_batch(self.config.batch_size, &mut records)?;
            if records.is_empty() {
                if !follow {
                    break;
                }
                if uncommitted.records > 0 && !self.commit_or_roll_back(&mut summary, &mut uncommitted)? {
                    continue;
                }
                last_commit = Instant::now();
                std::thread::sleep(FOLLOW_POLL);
                self.at_boundary();
                self.source.look_again()?;
                continue;
            }
            to_events(&mut records, &mut events);
            let processed = process_batch_with(self.hot_swap.as_ref(), &mut *self.processor, &mut self.txn, &events);
            let outcome = processed.map_err(|err| match err {
                ProcessError::Host(state) => TaskError::State(state),
                ProcessError::Instantiate(plugin) => TaskError::Plugin(plugin),
                ProcessError::Misconfigured(message) => TaskError::Misconfigured { job: self.config.name.clone(), message },
                ProcessError::Plugin(_) => unreachable!("plugin failures end as dead letters"),
            })?;
            self.observer.batch(events.len(), &outcome);
            if let Some(reason) = self.hot_swap.as_mut().and_then(|swap| swap.judge_batch(events.len(), &outcome)) {
                self.roll_back(reason, &mut uncommitted)?;
                continue;
            }
            uncommitted.count_batch(events.len(), &outcome);
            self.committer.stage(&mut self.txn)?;
            if last_commit.elapsed() >= interval || self.txn.pending_bytes() >= MAX_TRANSACTION_BYTES {
                if self.commit_or_roll_back(&mut summary, &mut uncommitted)? {
                    self.at_boundary();
                }
                last_commit = Instant::now();
            }
        }
        if self.commit_or_roll_back(&mut summary, &mut uncommitted)? {
            self.at_boundary();
        } else if !summary.stopped_early {
            // The redo of a rolled-back transaction: finish the inputs with
            // the restored version.
            let rest = self.run_batches(stop, follow)?;
            summary.absorb(&rest);
        }
        summary.elapsed = started.elapsed();
        tracing::info!(job = %self.config.name, records = summary.records, dead_lettered = summary.dead_lettered, commits = summary.commits, "inputs done");
        Ok(summary)
    }

    /// Takes a pushed plugin version, if any (nothing is uncommitted here).
    fn at_boundary(&mut self) {
        if let Some(swap) = &mut self.hot_swap {
            swap.at_boundary(&mut self.processor, &mut self.txn);
        }
    }

    /// Commits, unless a version on trial failed the transaction: then
    /// rolls back and returns `false` (the input is read again).
    fn commit_or_roll_back(&mut self, summary: &mut RunSummary, uncommitted: &mut RunSummary) -> Result<bool, TaskError> {
        if let Some(reason) = self.hot_swap.as_ref().and_then(HotSwap::judge_transaction) {
            self.roll_back(reason, uncommitted)?;
            return Ok(false);
        }
        let carried = std::mem::take(uncommitted);
        self.commit(summary, &carried)?;
        summary.absorb(&carried);
        if let Some(swap) = &mut self.hot_swap {
            swap.committed();
        }
        Ok(true)
    }

    /// Aborts the transaction, puts the previous plugin version back, and
    /// reads the inputs again from the last commit.
    fn roll_back(&mut self, reason: String, uncommitted: &mut RunSummary) -> Result<(), TaskError> {
        self.txn.abort();
        self.committer.discard()?;
        self.observer.aborted(&reason);
        if let Some(swap) = &mut self.hot_swap {
            swap.roll_back(&mut self.processor, &mut self.txn, reason);
        }
        let local = self.config.local()?;
        let follow = self.source.is_following();
        self.source = LocalSource::open_confined(&local.inputs, &self.committed_positions, local.confine_to.as_deref())?;
        self.source.set_follow(follow);
        *uncommitted = RunSummary::default();
        Ok(())
    }

    fn commit(&mut self, summary: &mut RunSummary, carried: &RunSummary) -> Result<(), TaskError> {
        let positions = self.source.positions();
        let started = Instant::now();
        self.committer.commit(&mut self.txn, &positions)?;
        summary.commits += 1;
        let took = started.elapsed();
        tracing::debug!(job = %self.config.name, took_us = took.as_micros() as u64, "committed");
        self.observer.committed(&CommitReport {
            at: Instant::now(),
            took,
            plugin_digest: self.txn.plugin_digest.clone(),
            lag: self.source.unread_bytes(),
            usage: self.processor.usage(),
            carried: carried.clone(),
        });
        self.committed_positions = positions;
        Ok(())
    }
}

/// The name a partition goes by in lineage: its file name.
fn partition_name(path: &std::path::Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |name| name.to_string_lossy().into_owned())
}
