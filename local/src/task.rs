//! Local mode's driver: reads batches of NDJSON lines from the input files
//! for the core's job loop ([`Task::drive`]), and commits through the
//! [`LocalCommitter`]. The order of the steps is the loop's.
//!
//! A batch the plugin traps on is dropped and its events are retried one by
//! one, so the event to blame is dead-lettered alone with the reason and
//! the events around it are applied exactly once (see
//! `docs/architecture.md`, invariant 5).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use tally_core::batch::BatchOutcome;
use tally_core::commit::TwoPhaseCommitter;
use tally_core::hot_swap::{PluginSlot, SwapPolicy};
use tally_core::observe::{JobObserver, RunSummary};
use tally_core::plugin::{Event, JobContext, LoadedPlugin, PluginError, Processor};
use tally_core::state::{StateError, StateStore};
use tally_core::task::{CommitOutcome, Committed, Driver, Finish, Input, RunError, Task};
use tally_core::transaction::Transaction;
use tally_state_rocks::RocksStore;

use crate::committer::{CommitError, LocalCommitter};
use crate::config::LocalConfig;
use crate::sink::Lineage;
use crate::source::{InputRecord, LocalPosition, LocalSource, SourceError};
use tally_core::lock::{DirLock, LockError};
use tally_core::settings::{InvalidJob, JobSettings};

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
    Config(#[from] InvalidJob),
    /// An earlier commit failed; the task must be reopened, which recovers
    /// from the last commit.
    #[error(
        "an earlier commit of job `{job}` failed; open the job again to recover from its last commit"
    )]
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
                SourceError::Shrunk { .. }
                | SourceError::Changed { .. }
                | SourceError::Replaced { .. }
                | SourceError::Outside { .. }
                | SourceError::Rewritten { .. },
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
/// how many were. `arrival_ms` (a period job's: when the lines were read)
/// becomes each event's timestamp.
pub fn to_events(
    records: &mut Vec<InputRecord>,
    events: &mut Vec<Event>,
    txn: &mut Transaction,
    arrival_ms: Option<i64>,
) -> u64 {
    events.clear();
    let limit = txn.limits().max_record_bytes;
    let mut oversized = 0;
    for record in records.drain(..) {
        if let Some(size) = record.oversized {
            tally_core::batch::dead_letter_oversized(
                txn,
                record.position,
                record.value,
                size,
                limit,
            );
            oversized += 1;
            continue;
        }
        events.push(Event {
            partition: record.position.partition,
            offset: record.position.offset,
            timestamp_ms: arrival_ms,
            key: None,
            value: record.value,
        });
    }
    oversized
}

/// A local-mode job: NDJSON inputs through a processor into output files,
/// exactly once across crashes.
pub struct LocalTask {
    task: Task,
    files: Files,
    store: Arc<dyn StateStore>,
    /// Set when a run failed: what is in memory can no longer be committed.
    failed: bool,
    _locks: Vec<DirLock>,
}

/// Local mode's [`Driver`]: the input files, read in batches, and the
/// committer of the output files and the state.
struct Files {
    config: JobSettings,
    local: LocalConfig,
    source: LocalSource,
    committer: LocalCommitter,
    /// Where the inputs stand in the last commit (a rollback reads on from here).
    committed_positions: Vec<LocalPosition>,
    records: Vec<InputRecord>,
    context: JobContext,
    /// A following period job's partitions read to their end, and since
    /// when (their idleness; see `docs/periods.md`).
    at_end_since: BTreeMap<u32, Instant>,
    /// Of them, those idle and closed by idleness since they went idle.
    idle_closed: BTreeSet<u32>,
}

/// How long a following job waits before looking for new input lines.
pub const FOLLOW_POLL: Duration = Duration::from_millis(50);

impl LocalTask {
    /// Opens a local job running `plugin`: locks the state directory,
    /// recovers the last commit (cutting uncommitted output), and positions
    /// the inputs after the last committed record.
    pub fn open(
        config: &JobSettings,
        local: &LocalConfig,
        plugin: &LoadedPlugin,
    ) -> Result<LocalTask, TaskError> {
        LocalTask::open_in(config, local, plugin, JobContext::new(&config.name))
    }

    /// Like [`LocalTask::open`], with the plugin's instances in `context`
    /// (stopped by its signal, seated in the host's CPU sharing).
    pub fn open_in(
        config: &JobSettings,
        local: &LocalConfig,
        plugin: &LoadedPlugin,
        context: JobContext,
    ) -> Result<LocalTask, TaskError> {
        let context = context.with_plugin_config(config.plugin_config.as_deref().unwrap_or("{}"));
        let make = plugin.processor_maker(config.limits, context.clone());
        LocalTask::open_with_in(config, local, context, make)
    }

    /// Like [`LocalTask::open`], with the processor made by `make_processor`
    /// (benchmarks use it to run the same logic natively).
    pub fn open_with(
        config: &JobSettings,
        local: &LocalConfig,
        make_processor: impl FnOnce() -> Result<Box<dyn Processor>, PluginError>,
    ) -> Result<LocalTask, TaskError> {
        LocalTask::open_with_in(config, local, JobContext::new(&config.name), make_processor)
    }

    fn open_with_in(
        config: &JobSettings,
        local: &LocalConfig,
        context: JobContext,
        make_processor: impl FnOnce() -> Result<Box<dyn Processor>, PluginError>,
    ) -> Result<LocalTask, TaskError> {
        config.validate()?;
        local.validate(config)?;
        // Refuse a missing input or a plugin that cannot start before
        // anything is created on disk.
        match &local.confine_to {
            None => LocalSource::check_readable(&local.inputs)?,
            Some(root) => drop(LocalSource::open_confined(&local.inputs, &[], Some(root))?),
        }
        let processor = make_processor()?;
        config.check_plugin_kind(processor.kind())?;
        let mut locks = vec![DirLock::acquire(&local.state_dir)?];
        if local.output_dir != local.state_dir {
            locks.push(DirLock::acquire(&local.output_dir)?);
        }
        let store: Arc<dyn StateStore> = Arc::new(RocksStore::open(&local.state_dir.join("db"))?);
        let mut output_names = config.outputs.clone();
        output_names.push(config.dead_letter_output.clone());
        let mut txn = Transaction::new(store.clone(), config.outputs.clone().into(), config.limits)
            .with_emit(config.emit_per_output());
        if let Some(book) = config.period_book() {
            txn = txn.with_periods(book);
        }
        let partitions = local.inputs.iter().map(|path| partition_name(path)).collect();
        let lineage = Lineage::new(&config.name, partitions, processor.digest());
        let file_names: Vec<String> =
            output_names.iter().map(|name| format!("{name}{}", local.output_suffix)).collect();
        let (committer, recovered) =
            LocalCommitter::recover(store.clone(), &local.output_dir, &file_names, lineage)?;
        let source = Files::open_source(config, local, &recovered.positions)?;
        tracing::info!(job = %config.name, plugin = %processor.digest(), resumed_from = ?recovered.positions, "local job opened");
        Ok(LocalTask {
            task: Task::new(
                &config.name,
                processor,
                txn,
                context.clone(),
                config.commit_interval(),
            ),
            files: Files {
                config: config.clone(),
                local: local.clone(),
                committed_positions: source.positions(),
                source,
                committer,
                records: Vec::with_capacity(config.batch_size),
                context,
                at_end_since: BTreeMap::new(),
                idle_closed: BTreeSet::new(),
            },
            store,
            failed: false,
            _locks: locks,
        })
    }

    /// Lets new plugin versions pushed into `slot` be swapped in at
    /// transaction boundaries, and reports commits and swaps to `observer`.
    pub fn attach(
        &mut self,
        slot: Arc<PluginSlot>,
        policy: SwapPolicy,
        observer: Arc<dyn JobObserver>,
    ) {
        self.task.attach(slot, self.files.config.limits, policy, observer);
    }

    /// The job's committed state (for queries; reads see the last commit).
    pub fn store(&self) -> Arc<dyn StateStore> {
        self.store.clone()
    }

    /// Digest of the plugin version running now.
    pub fn plugin_digest(&self) -> &str {
        self.task.plugin_digest()
    }

    /// A period job's partitions (see [`Task::period_status`]).
    pub fn period_status(&self) -> Option<Vec<tally_core::periods::PartitionStatus>> {
        self.task.period_status()
    }

    /// The name partition `index` goes by: its input file's name.
    pub fn partition_name(&self, index: u32) -> Option<String> {
        self.files.local.inputs.get(index as usize).map(|path| partition_name(path))
    }

    /// Path of output `name`'s file.
    pub fn output_path(&self, name: &str) -> Option<PathBuf> {
        let config = &self.files.config;
        let index = config
            .outputs
            .iter()
            .position(|output| output == name)
            .or_else(|| (name == config.dead_letter_output).then_some(config.outputs.len()))?;
        Some(self.files.committer.output_path(index).to_path_buf())
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
            return Err(TaskError::Failed { job: self.files.config.name.clone() });
        }
        self.files.source.set_follow(follow);
        let started = Instant::now();
        let mut summary = RunSummary::default();
        match self.task.drive(&mut self.files, stop, &mut summary) {
            Ok(finish) => {
                summary.stopped_early = finish == Finish::Stopped;
                summary.elapsed = started.elapsed();
                let config = &self.files.config;
                tracing::info!(job = %config.name, records = summary.records, dead_lettered = summary.dead_lettered, commits = summary.commits, "inputs done");
                Ok(summary)
            }
            Err(err) => {
                self.failed = true;
                // Best effort: reopening the task cuts the files back anyway.
                let _ = self.files.committer.abort();
                Err(err)
            }
        }
    }
}

impl Files {
    /// A following period job notes which partitions are at their end
    /// after a read: one that delivered a record is idle no more.
    fn note_ends(&mut self) {
        if self.config.periods.is_none() || !self.source.is_following() {
            return;
        }
        for record in &self.records {
            self.at_end_since.remove(&record.position.partition);
            self.idle_closed.remove(&record.position.partition);
        }
        // A partition not read this time (the batch filled first) keeps
        // its time: only a record ends its idleness.
        let at_end: BTreeSet<u32> = self.source.exhausted_partitions().collect();
        let now = Instant::now();
        for partition in at_end {
            self.at_end_since.entry(partition).or_insert(now);
        }
    }

    /// The inputs, positioned at `positions` and bounded by the job's limits.
    fn open_source(
        config: &JobSettings,
        local: &LocalConfig,
        positions: &[LocalPosition],
    ) -> Result<LocalSource, TaskError> {
        let mut source =
            LocalSource::open_confined(&local.inputs, positions, local.confine_to.as_deref())?;
        source.set_max_record_bytes(config.limits.max_record_bytes);
        source.set_max_batch_bytes(config.limits.batch_bytes());
        Ok(source)
    }
}

impl Driver for Files {
    type Error = TaskError;

    fn next_batch(
        &mut self,
        txn: &mut Transaction,
        events: &mut Vec<Event>,
        _wait: Duration,
    ) -> Result<Input, TaskError> {
        self.source.next_batch(self.config.batch_size, &mut self.records)?;
        self.note_ends();
        if self.records.is_empty() {
            return Ok(if self.source.is_following() { Input::Dry } else { Input::End });
        }
        let read = self.records.len();
        // A period job's events arrive when their lines are read: the
        // wall clock bounds how far in the future an event time may lie.
        let arrival_ms =
            self.config.periods.is_some().then(|| jiff::Timestamp::now().as_millisecond());
        let oversized = to_events(&mut self.records, events, txn, arrival_ms);
        Ok(Input::Batch { read, oversized, more_buffered: false })
    }

    fn ran(
        &mut self,
        txn: &mut Transaction,
        _events: &[Event],
        _outcome: &BatchOutcome,
        _on_trial: bool,
    ) -> Result<(), TaskError> {
        Ok(self.committer.stage(txn)?)
    }

    fn commit(
        &mut self,
        txn: &mut Transaction,
        carried: RunSummary,
        _may_overlap: bool,
    ) -> Result<CommitOutcome, TaskError> {
        // The commit waits on the disk: another job may use the CPU meanwhile.
        self.context.idle();
        let positions = self.source.positions();
        let started = Instant::now();
        self.committer.commit_all(txn, &positions)?;
        let took = started.elapsed();
        tracing::debug!(job = %self.config.name, took_us = took.as_micros() as u64, "committed");
        self.committed_positions = positions;
        Ok(CommitOutcome::Done(Some(Committed {
            at: Instant::now(),
            took,
            lag: self.source.unread_bytes(),
            carried,
        })))
    }

    /// Cuts the output written since the last commit and reads the inputs
    /// again from it.
    fn discard(&mut self, _txn: &mut Transaction) -> Result<(), TaskError> {
        // What idleness closed is dropped too: close it again.
        self.idle_closed.clear();
        self.committer.abort()?;
        let follow = self.source.is_following();
        self.source = Files::open_source(&self.config, &self.local, &self.committed_positions)?;
        self.source.set_follow(follow);
        Ok(())
    }

    fn wait_for_input(&mut self) -> Result<(), TaskError> {
        std::thread::sleep(FOLLOW_POLL);
        Ok(self.source.look_again()?)
    }

    /// At the end of the inputs every partition is idle: a run that read
    /// everything closes what idleness closes before its last commit. A
    /// following job's partition is idle once read to its end for
    /// `idle_timeout`.
    fn idle_partitions(&mut self, _txn: &mut Transaction, at_end: bool) -> Vec<u32> {
        let Some(periods) = &self.config.periods else { return Vec::new() };
        if at_end {
            return (0..self.local.inputs.len() as u32).collect();
        }
        let timeout = periods.idle_timeout.unsigned_abs();
        let idle: Vec<u32> = self
            .at_end_since
            .iter()
            .filter(|(_, since)| since.elapsed() >= timeout)
            .map(|(&partition, _)| partition)
            .collect();
        self.idle_closed.extend(&idle);
        idle
    }

    fn idle_due(&mut self) -> bool {
        let Some(periods) = &self.config.periods else { return false };
        let timeout = periods.idle_timeout.unsigned_abs();
        self.at_end_since.iter().any(|(partition, since)| {
            since.elapsed() >= timeout && !self.idle_closed.contains(partition)
        })
    }
}

/// The name a partition goes by in lineage: its file name.
fn partition_name(path: &std::path::Path) -> String {
    path.file_name()
        .map_or_else(|| path.display().to_string(), |name| name.to_string_lossy().into_owned())
}
