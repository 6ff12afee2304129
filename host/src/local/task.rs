//! Local mode's job loop: reads batches of NDJSON lines from the input
//! files, runs them through the [`Task`] into a transaction, and commits on
//! the interval through the [`LocalCommitter`]. The order of the steps at a
//! transaction's edges is the core task's (see `tally_core::task`).
//!
//! A batch the plugin traps on is dropped and its events are retried one by
//! one, so the event to blame is dead-lettered alone with the reason and
//! the events around it are applied exactly once (see
//! `docs/architecture.md`, invariant 5).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_core::commit::TwoPhaseCommitter;
use tally_core::hot_swap::{PluginSlot, SwapPolicy};
use tally_core::observe::{JobObserver, RunSummary};
use tally_core::plugin::{Event, JobContext, LoadedPlugin, PluginError, Processor};
use tally_core::state::{StateError, StateStore};
use tally_core::task::{Committed, Ran, RunError, Task};
use tally_core::transaction::Transaction;
use tally_state_rocks::RocksStore;

use crate::local::committer::{CommitError, LocalCommitter};
use crate::config::JobConfig;
use crate::lock::{DirLock, LockError};
use crate::local::sink::Lineage;
use crate::local::source::{InputRecord, LocalSource, SourceError};

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
    /// A batch failed in a way that ends the run (the store, the
    /// configuration, a plugin failing on everything).
    #[error(transparent)]
    Run(#[from] RunError),
    /// The job configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// An earlier commit failed; the task must be reopened, which recovers
    /// from the last commit.
    #[error("an earlier commit of job `{job}` failed; open the job again to recover from its last commit")]
    Failed {
        /// The job.
        job: String,
    },
}

impl TaskError {
    /// Whether opening the job again may help (the disk or a commit
    /// failed), or only a person can (a replaced input, a bad config, a
    /// broken plugin).
    pub fn is_retryable(&self) -> bool {
        match self {
            TaskError::Source(
                SourceError::Shrunk { .. } | SourceError::Changed { .. } | SourceError::Replaced { .. } | SourceError::Outside { .. } | SourceError::Rewritten { .. },
            )
            | TaskError::Config(_) => false,
            TaskError::Run(run) => run.is_retryable(),
            _ => true,
        }
    }

    /// Whether a new plugin version is the fix: the job waits for one.
    pub fn needs_new_plugin(&self) -> bool {
        matches!(self, TaskError::Run(run) if run.needs_new_plugin())
    }
}

/// Turns input records into plugin events, moving their bytes; records
/// over the job's record limit are dead-lettered in `txn` instead. Returns
/// how many were.
pub fn to_events(records: &mut Vec<InputRecord>, events: &mut Vec<Event>, txn: &mut Transaction) -> u64 {
    events.clear();
    let limit = txn.limits().max_record_bytes;
    let mut oversized = 0;
    for record in records.drain(..) {
        if let Some(size) = record.oversized {
            tally_core::batch::dead_letter_oversized(txn, record.position, record.value, size, limit);
            oversized += 1;
            continue;
        }
        events.push(Event { partition: record.position.partition, offset: record.position.offset, timestamp_ms: None, key: None, value: record.value });
    }
    oversized
}

/// A local-mode job: NDJSON inputs through a processor into output files,
/// exactly once across crashes.
pub struct LocalTask {
    config: JobConfig,
    source: LocalSource,
    task: Task,
    committer: LocalCommitter,
    store: Arc<dyn StateStore>,
    /// Where the inputs stand in the last commit (a rollback reads on from here).
    committed_positions: Vec<crate::local::source::LocalPosition>,
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
        LocalTask::open_in(config, plugin, JobContext::new(&config.name))
    }

    /// Like [`LocalTask::open`], with the plugin's instances in `context`
    /// (stopped by its signal, seated in the host's CPU sharing).
    pub fn open_in(config: &JobConfig, plugin: &LoadedPlugin, context: JobContext) -> Result<LocalTask, TaskError> {
        let make = plugin.processor_maker(config.limits, context.clone());
        LocalTask::open_with_in(config, context, make)
    }

    /// Like [`LocalTask::open`], with the processor made by `make_processor`
    /// (benchmarks use it to run the same logic natively).
    pub fn open_with(
        config: &JobConfig,
        make_processor: impl FnOnce() -> Result<Box<dyn Processor>, PluginError>,
    ) -> Result<LocalTask, TaskError> {
        LocalTask::open_with_in(config, JobContext::new(&config.name), make_processor)
    }

    fn open_with_in(
        config: &JobConfig,
        context: JobContext,
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
        let txn = Transaction::new(store.clone(), config.outputs.clone().into(), config.limits).with_emit(config.emit_per_output());
        let partitions = local.inputs.iter().map(|path| partition_name(path)).collect();
        let lineage = Lineage::new(&config.name, partitions, processor.digest());
        let (committer, recovered) = LocalCommitter::recover(store.clone(), &local.output_dir, &output_names, lineage)?;
        let mut source = LocalSource::open_confined(&local.inputs, &recovered.positions, local.confine_to.as_deref())?;
        source.set_max_record_bytes(config.limits.max_record_bytes);
        source.set_max_batch_bytes(config.limits.batch_bytes());
        tracing::info!(job = %config.name, plugin = %processor.digest(), resumed_from = ?recovered.positions, "local job opened");
        Ok(LocalTask {
            config: config.clone(),
            committed_positions: source.positions(),
            source,
            task: Task::new(&config.name, processor, txn, context, config.commit_interval()),
            committer,
            store,
            failed: false,
            _locks: locks,
        })
    }

    /// Lets new plugin versions pushed into `slot` be swapped in at
    /// transaction boundaries, and reports commits and swaps to `observer`.
    pub fn attach(&mut self, slot: Arc<PluginSlot>, policy: SwapPolicy, observer: Arc<dyn JobObserver>) {
        self.task.attach(slot, self.config.limits, policy, observer);
    }

    /// The job's committed state (for queries; reads see the last commit).
    pub fn store(&self) -> Arc<dyn StateStore> {
        self.store.clone()
    }

    /// Digest of the plugin version running now.
    pub fn plugin_digest(&self) -> &str {
        self.task.plugin_digest()
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
            self.task.drop_transaction(&err.to_string());
            // Best effort: reopening the task cuts the files back anyway.
            let _ = self.committer.abort();
        }
        result
    }

    fn run_batches(&mut self, stop: &AtomicBool, follow: bool) -> Result<RunSummary, TaskError> {
        let started = Instant::now();
        let mut summary = RunSummary::default();
        let mut records = Vec::with_capacity(self.config.batch_size);
        let mut events = Vec::with_capacity(self.config.batch_size);
        let mut last_commit = Instant::now();
        // Counts of the open transaction, added to `summary` when it commits.
        let mut uncommitted = RunSummary::default();
        self.task.at_boundary();
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
                self.task.context().idle();
                std::thread::sleep(FOLLOW_POLL);
                self.task.at_boundary();
                self.source.look_again()?;
                continue;
            }
            let read = records.len();
            let oversized = to_events(&mut records, &mut events, self.task.txn());
            let outcome = match self.task.run(&events, read, oversized)? {
                Ran::Done(outcome) => outcome,
                Ran::TrialFailed(reason) => {
                    self.roll_back(reason, &mut uncommitted)?;
                    continue;
                }
                Ran::Stopped => {
                    // Stopped mid-call: what was not committed is read again.
                    self.abandon("the job was stopped during a plugin call", &mut uncommitted)?;
                    summary.stopped_early = true;
                    summary.elapsed = started.elapsed();
                    return Ok(summary);
                }
            };
            uncommitted.count_batch(read, &outcome);
            self.committer.stage(self.task.txn())?;
            if self.task.commit_due(last_commit) {
                if self.commit_or_roll_back(&mut summary, &mut uncommitted)? {
                    self.task.at_boundary();
                }
                last_commit = Instant::now();
            }
        }
        if self.commit_or_roll_back(&mut summary, &mut uncommitted)? {
            self.task.at_boundary();
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

    /// Commits, unless a version on trial failed the transaction: then
    /// rolls back and returns `false` (the input is read again).
    fn commit_or_roll_back(&mut self, summary: &mut RunSummary, uncommitted: &mut RunSummary) -> Result<bool, TaskError> {
        if let Some(reason) = self.task.judge_transaction() {
            self.roll_back(reason, uncommitted)?;
            return Ok(false);
        }
        let carried = std::mem::take(uncommitted);
        // The commit waits on the disk: another job may use the CPU meanwhile.
        self.task.context().idle();
        let positions = self.source.positions();
        let started = Instant::now();
        self.committer.commit_all(self.task.txn(), &positions)?;
        let took = started.elapsed();
        tracing::debug!(job = %self.config.name, took_us = took.as_micros() as u64, "committed");
        summary.commits += 1;
        summary.absorb(&carried);
        self.committed_positions = positions;
        self.task.committed(Some(Committed { at: Instant::now(), took, lag: self.source.unread_bytes(), carried }));
        Ok(true)
    }

    /// A version on trial failed: the task puts the previous version back,
    /// then the output written since the last commit is cut and the inputs
    /// are read again from it.
    fn roll_back(&mut self, reason: String, uncommitted: &mut RunSummary) -> Result<(), TaskError> {
        self.task.roll_back(reason);
        self.committer.abort()?;
        self.reread_from_last_commit(uncommitted)
    }

    /// Drops the open transaction for a reason that is not the plugin
    /// version's fault (a stop mid-call): a version on trial starts its
    /// trial over, and the inputs are read again from the last commit.
    fn abandon(&mut self, reason: &str, uncommitted: &mut RunSummary) -> Result<(), TaskError> {
        self.task.drop_transaction(reason);
        self.committer.abort()?;
        self.reread_from_last_commit(uncommitted)
    }

    fn reread_from_last_commit(&mut self, uncommitted: &mut RunSummary) -> Result<(), TaskError> {
        let local = self.config.local()?;
        let follow = self.source.is_following();
        self.source = LocalSource::open_confined(&local.inputs, &self.committed_positions, local.confine_to.as_deref())?;
        self.source.set_max_record_bytes(self.config.limits.max_record_bytes);
        self.source.set_max_batch_bytes(self.config.limits.batch_bytes());
        self.source.set_follow(follow);
        *uncommitted = RunSummary::default();
        Ok(())
    }
}

/// The name a partition goes by in lineage: its file name.
fn partition_name(path: &std::path::Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |name| name.to_string_lossy().into_owned())
}
