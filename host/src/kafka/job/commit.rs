//! The commit pipeline of a session: a transaction's records are sent, its
//! Kafka commit finishes on a thread of its own while the next transaction
//! runs, and its outcome is taken (counted, or aborted and rewound).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use rdkafka::consumer::BaseConsumer;

use super::progress::{consumer_lag, rewind, Progress};
use super::rebalance::Rebalancer;
use super::{KafkaJob, Restart, SessionError};
use crate::kafka::committer::{classify, KafkaCommitError, KafkaCommitter, KafkaTransactions, Recovery};
use tally_core::commit::TwoPhaseCommitter;
use tally_core::observe::RunSummary;
use tally_core::task::Committed;

impl KafkaJob {
    /// Commits the open transaction: sends its records, then leaves its
    /// Kafka commit to a thread and goes on with the next transaction, or,
    /// with `Overlap::No` or while a plugin version waits for a
    /// transaction's outcome, waits for it. A commit still in flight is
    /// settled first. `false` if Kafka aborted a transaction (then the
    /// consumer is back at the committed offsets and the work is redone).
    pub(super) fn commit<'scope>(
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
        if let Some(reason) = self.task.judge_transaction() {
            self.roll_back(consumer, committer, progress, reason)?;
            return Ok(false);
        }
        let started = Instant::now();
        // Phase one here; phase two, the commit point, on the commit thread.
        let mut two_phase = KafkaTransactions { committer, consumer };
        let sent = match two_phase.prepare(self.task.txn(), &progress.positions) {
            Ok(sent) => sent,
            Err(err) => return self.commit_failed(consumer, committer, progress, err),
        };
        let finishing = sent.map(|sent| {
            commits.scope.spawn(move || {
                let result = two_phase.commit(Some(sent));
                (result, Instant::now())
            })
        });
        let done = CommitDone {
            started,
            positions: std::mem::take(&mut progress.positions),
            first: std::mem::take(&mut progress.first),
            uncommitted: std::mem::take(&mut progress.uncommitted),
        };
        let overlaps = finishing.is_some() && overlap == Overlap::Yes && self.task.swap_idle();
        commits.in_flight = Some(InFlight { finishing, done });
        if overlaps {
            return Ok(true);
        }
        let committed = self.settle(consumer, committer, progress, summary, commits)?;
        if committed {
            self.task.at_boundary();
        }
        Ok(committed)
    }

    /// Waits for the commit in flight, if any, and takes its outcome:
    /// `false` if Kafka aborted it (then the open transaction, which built
    /// on its state, is dropped too, and the consumer is back at the
    /// committed offsets).
    pub(super) fn settle(
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
            self.task.context().idle();
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
    pub(super) fn commit_took_effect(
        &mut self,
        consumer: &BaseConsumer<Rebalancer>,
        done: CommitDone,
        finished: Instant,
        progress: &mut Progress,
        summary: &mut RunSummary,
    ) {
        self.task.txn().commit_finished();
        let took = finished.saturating_duration_since(done.started);
        summary.absorb(&done.uncommitted);
        let report = (!done.positions.is_empty()).then(|| {
            summary.commits += 1;
            Committed { at: finished, took, lag: consumer_lag(consumer), carried: done.uncommitted }
        });
        progress.included.extend(done.positions);
        self.task.committed(report);
        tracing::debug!(job = %self.config.name, took_us = took.as_micros() as u64, "committed");
    }

    /// Handles a failed commit: an abortable error aborts and rewinds
    /// (`Ok(false)`); anything else ends the session.
    pub(super) fn commit_failed(
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
                self.task.drop_transaction(&err.to_string());
                rewind(consumer, &progress.first)?;
                progress.forget_uncommitted();
                Ok(false)
            }
            KafkaCommitError::State(err) => Err(SessionError::fatal(err)),
            err => Err(Restart::Commit(err).into()),
        }
    }
}

/// Whether a commit may overlap the next transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Overlap {
    Yes,
    /// The commit ends before the loop goes on (the run is stopping).
    No,
}

/// The session's commit thread scope, and the commit in flight in it.
pub(super) struct Commits<'scope, 'env> {
    pub(super) scope: &'scope std::thread::Scope<'scope, 'env>,
    pub(super) in_flight: Option<InFlight<'scope>>,
}

/// A commit whose records are sent and whose Kafka commit runs on a thread
/// of its own.
pub(super) struct InFlight<'scope> {
    /// `None` when there was nothing to commit.
    pub(super) finishing: Option<std::thread::ScopedJoinHandle<'scope, (Result<(), KafkaCommitError>, Instant)>>,
    pub(super) done: CommitDone,
}

impl InFlight<'_> {
    pub(super) fn is_finished(&self) -> bool {
        self.finishing.as_ref().is_none_or(|finishing| finishing.is_finished())
    }

    /// Waits for the commit; when it took effect.
    pub(super) fn join(&mut self) -> Result<Instant, KafkaCommitError> {
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
pub(super) struct CommitDone {
    pub(super) started: Instant,
    /// Next offset per source id.
    pub(super) positions: BTreeMap<u32, i64>,
    /// First offset per source id it read.
    pub(super) first: HashMap<u32, i64>,
    pub(super) uncommitted: RunSummary,
}
