//! The task: what every driver (local files, Kafka) shares of a running
//! job — the plugin version running, the open transaction, hot loading
//! and what observers are told — and the one ordering of the steps at a
//! transaction's edges:
//!
//! 1. at a boundary (nothing uncommitted) a pushed version may come in,
//!    on trial ([`Task::at_boundary`]);
//! 2. each batch runs through the plugin and a version on trial is judged
//!    on it ([`Task::run`]);
//! 3. before a commit the trial is judged on the whole transaction
//!    ([`Task::judge_transaction`]);
//! 4. a failed trial puts the previous version back *before* anything
//!    that can fail is undone, so the failed version never runs again
//!    whatever the driver's discard does ([`Task::roll_back`]);
//! 5. a commit that took effect is reported, and passes a trial
//!    ([`Task::committed`]).
//!
//! [`Task::drive`] is the one loop that calls these steps, for every
//! driver. The drivers ([`Driver`]) own what differs: where records come
//! from, how a commit is made durable, and how the input goes back to the
//! last commit. See `docs/architecture.md`.

mod drive;

pub use drive::{CommitOutcome, Driver, Finish, Input, Settle};

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::{BatchOutcome, BatchRunner};
use crate::hot_swap::{HotSwap, PluginSlot, SwapPolicy};
use crate::limits::Limits;
use crate::observe::{CommitReport, JobObserver, NoObserver, RunSummary};
use crate::plugin::{Event, JobContext, PluginError, ProcessError, Processor};
use crate::state::StateError;
use crate::transaction::Transaction;

/// Why a batch ended the run: a failure that is not one event's. Nothing
/// of the open transaction was committed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The state store failed (not the plugin's fault).
    #[error(transparent)]
    State(#[from] StateError),
    /// The plugin could not be instantiated again after a failure.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The job's configuration does not fit the plugin (it emitted to an
    /// undeclared output).
    #[error("job `{job}` stopped before committing anything more: {message}")]
    Misconfigured {
        /// The job.
        job: String,
        /// What does not fit, and the fix.
        message: String,
    },
    /// The plugin failed on too many events in a row: it is broken, and
    /// the job stops rather than dead-letter its whole input.
    #[error(
        "job `{job}` stopped before committing anything more: {message}; fix the plugin (push a new version) and resume the job"
    )]
    PluginFailing {
        /// The job.
        job: String,
        /// The last failure, with the limit it broke.
        message: String,
    },
}

impl RunError {
    /// Whether opening the job again may help (the store failed, an
    /// instance could not start), or only a person can (the configuration,
    /// a broken plugin).
    pub fn is_retryable(&self) -> bool {
        matches!(self, RunError::State(_) | RunError::Plugin(_))
    }

    /// Whether a new plugin version is the fix (the job should wait, paused,
    /// for one rather than be retried).
    pub fn needs_new_plugin(&self) -> bool {
        matches!(self, RunError::PluginFailing { .. })
    }

    fn of_batch(err: ProcessError, job: &str) -> RunError {
        match err {
            ProcessError::Host(state) => RunError::State(state),
            ProcessError::Instantiate(plugin) => RunError::Plugin(plugin),
            ProcessError::Misconfigured(message) => {
                RunError::Misconfigured { job: job.to_string(), message }
            }
            ProcessError::FailingInARow(message) => {
                RunError::PluginFailing { job: job.to_string(), message }
            }
            // Batches end plugin failures as dead letters; were one to come
            // through (or a stop not taken as one), the job stops rather
            // than lose the event.
            ProcessError::Plugin(message) => {
                RunError::PluginFailing { job: job.to_string(), message }
            }
            ProcessError::Stopped => RunError::PluginFailing {
                job: job.to_string(),
                message: "the call was stopped".into(),
            },
        }
    }
}

/// A transaction holding this many bytes commits before its interval is up,
/// so a burst of big outputs or state cannot grow the host without bound.
pub const MAX_TRANSACTION_BYTES: u64 = 256 << 20;

/// What running one batch came to.
#[derive(Debug)]
enum Ran {
    /// The batch is in the transaction (its rejections as dead letters).
    Done(BatchOutcome),
    /// The version on trial failed on it: roll back, then read the input
    /// again from the last commit.
    TrialFailed(String),
    /// The job was asked to stop during the call: drop the transaction;
    /// the next run redoes it.
    Stopped,
}

/// A commit that took effect, as the driver saw it.
#[derive(Debug, Clone)]
pub struct Committed {
    /// When it took effect.
    pub at: Instant,
    /// How long making it durable took.
    pub took: Duration,
    /// Input behind the end after it, when the driver knows.
    pub lag: Option<u64>,
    /// What the transaction carried.
    pub carried: RunSummary,
}

/// One job's engine: its plugin version, open transaction, hot loading and
/// observer. Drivers call its steps; it owns their order.
pub struct Task {
    job: String,
    processor: Box<dyn Processor>,
    txn: Transaction,
    hot_swap: Option<HotSwap>,
    observer: Arc<dyn JobObserver>,
    context: JobContext,
    batches: BatchRunner,
    commit_interval: Duration,
    /// Whether it also commits as soon as its input is caught up (see
    /// [`Task::commit_when_caught_up`]).
    commit_when_caught_up: bool,
    /// What the open transaction processed: counted in the run's summary
    /// when it commits, so records redone after an abort count once.
    uncommitted: RunSummary,
}

impl Task {
    /// Job `job`'s task, running `processor` into `txn`, its instances in
    /// `context`, committing every `commit_interval`.
    pub fn new(
        job: &str,
        processor: Box<dyn Processor>,
        mut txn: Transaction,
        context: JobContext,
        commit_interval: Duration,
    ) -> Task {
        txn.plugin_digest = processor.digest().to_string();
        Task {
            job: job.to_string(),
            processor,
            txn,
            hot_swap: None,
            observer: Arc::new(NoObserver),
            context,
            batches: BatchRunner::new(),
            commit_interval,
            commit_when_caught_up: false,
            uncommitted: RunSummary::default(),
        }
    }

    /// Also commits as soon as the input is caught up and no commit is in
    /// flight, not only every `commit_interval`: output comes promptly
    /// while the input is quiet, at the cost of more transactions while
    /// it is slow (see `docs/kafka-mode.md`).
    pub fn commit_when_caught_up(&mut self, yes: bool) {
        self.commit_when_caught_up = yes;
    }

    /// Lets new plugin versions pushed into `slot` be swapped in at
    /// transaction boundaries (instantiated under `limits`), and reports
    /// commits and swaps to `observer`.
    pub fn attach(
        &mut self,
        slot: Arc<PluginSlot>,
        limits: Limits,
        policy: SwapPolicy,
        observer: Arc<dyn JobObserver>,
    ) {
        self.hot_swap =
            Some(HotSwap::new(slot, limits, policy, observer.clone(), self.context.clone()));
        self.observer = observer;
    }

    /// The job's plugin context (its stop signal and CPU seat).
    pub fn context(&self) -> &JobContext {
        &self.context
    }

    /// Digest of the plugin version running now.
    pub fn plugin_digest(&self) -> &str {
        self.processor.digest()
    }

    /// A period job's partitions: watermarks, open periods, seen ids and
    /// what their rules did (`None` for a job without periods).
    pub fn period_status(&self) -> Option<Vec<crate::periods::PartitionStatus>> {
        self.txn.periods.as_ref().map(|book| book.status())
    }

    /// Whether a version runs its trial transaction.
    fn on_trial(&self) -> bool {
        self.hot_swap.as_ref().is_some_and(HotSwap::on_trial)
    }

    /// Whether no version waits for a transaction's outcome (none on trial,
    /// none pushed): only then may a commit overlap the next transaction.
    fn swap_idle(&self) -> bool {
        self.hot_swap.as_ref().is_none_or(HotSwap::is_idle)
    }

    /// Whether the open transaction should commit now: its interval since
    /// `last_commit` is up, or it holds [`MAX_TRANSACTION_BYTES`].
    fn commit_due(&self, last_commit: Instant) -> bool {
        last_commit.elapsed() >= self.commit_interval
            || self.txn.pending_bytes() >= MAX_TRANSACTION_BYTES
    }

    /// Whether the open transaction should commit early: the job commits
    /// when caught up, it is, its transaction holds records, no commit is
    /// in flight, and no version is on trial (a trial is judged on an
    /// interval's transaction, not on its first few events).
    fn commit_early<D: Driver>(&self, driver: &D) -> bool {
        self.commit_when_caught_up
            && self.swap_idle()
            && self.uncommitted.records > 0
            && driver.caught_up_now()
            && !driver.commit_in_flight()
    }

    /// Step 1, at a transaction boundary: takes a pushed plugin version, if
    /// any, for a trial transaction.
    fn at_boundary(&mut self) {
        if let Some(swap) = &mut self.hot_swap {
            swap.at_boundary(&mut self.processor, &mut self.txn);
        }
    }

    /// Step 2: runs `events` (of `read` records, `oversized` of which the
    /// driver already dead-lettered) through the plugin into the
    /// transaction, and judges a version on trial on them. A failure that is
    /// not one event's (the store, the configuration, a plugin failing on
    /// everything) is an error: the run ends.
    fn run(&mut self, events: &[Event], read: usize, oversized: u64) -> Result<Ran, RunError> {
        let on_trial = self.on_trial();
        let mut outcome = if events.is_empty() {
            BatchOutcome::default()
        } else {
            match self.batches.run_with(on_trial, &mut *self.processor, &mut self.txn, events) {
                Ok(outcome) => outcome,
                Err(ProcessError::Stopped) => return Ok(Ran::Stopped),
                Err(err) => return Err(RunError::of_batch(err, &self.job)),
            }
        };
        // A version on trial is judged on the events it ran.
        let judged =
            self.hot_swap.as_mut().and_then(|swap| swap.judge_batch(events.len(), &outcome));
        outcome.dead_lettered += oversized;
        self.observer.batch(read, &outcome);
        if judged.is_none() {
            self.uncommitted.count_batch(read, &outcome);
        }
        Ok(match judged {
            Some(reason) => Ran::TrialFailed(reason),
            None => Ran::Done(outcome),
        })
    }

    /// Step 2b, before a commit: the work due at the transaction's end — a
    /// period job's FINALs for the partitions in `idle`, and its
    /// ADJUSTMENTs. `false`: the job was stopped during a plugin call (the
    /// transaction must be dropped). Its records count as the
    /// transaction's outputs.
    fn end_transaction(&mut self, idle: &[u32]) -> Result<bool, RunError> {
        let before = self.txn.outputs().len();
        let result = self
            .processor
            .close_idle(&mut self.txn, idle)
            .and_then(|()| self.processor.end_transaction(&mut self.txn));
        match result {
            Ok(()) => {
                let emitted = self.txn.outputs().len().saturating_sub(before) as u64;
                self.uncommitted.outputs += emitted;
                Ok(true)
            }
            Err(ProcessError::Stopped) => Ok(false),
            Err(err) => Err(RunError::of_batch(err, &self.job)),
        }
    }

    /// Step 3, before a commit: `Some(reason)` if the version on trial
    /// rejected too large a share of the transaction (then roll back).
    fn judge_transaction(&self) -> Option<String> {
        self.hot_swap.as_ref().and_then(HotSwap::judge_transaction)
    }

    /// Step 4: a version on trial failed the transaction. Puts the previous
    /// version back first — whatever happens to the driver's discard after
    /// this, the failed version never runs again — then drops the
    /// transaction. The driver then discards what it wrote and reads the
    /// input again from the last commit.
    fn roll_back(&mut self, reason: String) {
        if let Some(swap) = &mut self.hot_swap {
            swap.roll_back(&mut self.processor, &mut self.txn, reason.clone());
        }
        self.drop_transaction(&reason);
    }

    /// Drops the open transaction for a reason that is not the running
    /// version's fault (a stop mid-call, a Kafka abort, a rebalance, a
    /// failure that ended the run): its work is forgotten and a version on
    /// trial starts its trial over with the redo.
    fn drop_transaction(&mut self, reason: &str) {
        self.uncommitted = RunSummary::default();
        self.txn.abort();
        self.batches.transaction_dropped();
        self.processor.transaction_dropped();
        self.observer.aborted(reason);
        if let Some(swap) = &mut self.hot_swap {
            swap.aborted();
        }
    }

    /// Step 5: a commit took effect. `commit` is reported to the observer
    /// (`None`: it carried no input, nothing to report); a version on trial
    /// that ran events in it has passed.
    fn committed(&mut self, commit: Option<Committed>) {
        if let Some(commit) = commit {
            self.observer.committed(&CommitReport {
                at: commit.at,
                took: commit.took,
                plugin_digest: self.txn.plugin_digest.clone(),
                lag: commit.lag,
                usage: self.processor.usage(),
                carried: commit.carried,
            });
        }
        if let Some(swap) = &mut self.hot_swap {
            swap.committed();
        }
        if let Some(book) = &self.txn.periods {
            self.observer.periods(&book.status());
        }
    }
}
