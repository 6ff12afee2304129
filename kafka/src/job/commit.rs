//! The commit pipeline of a session's driver: a transaction's records are
//! sent, its Kafka commit finishes on a thread of its own while the next
//! transaction runs, and its outcome is taken (counted, or aborted and
//! rewound).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use super::progress::{consumer_lag, rewind};
use super::session::Session;
use super::{Restart, SessionError};
use crate::committer::{KafkaCommitError, KafkaTransactions, Recovery, classify};
use tally_core::commit::TwoPhaseCommitter;
use tally_core::observe::RunSummary;
use tally_core::task::{CommitOutcome, Committed, Settle};
use tally_core::transaction::Transaction;

impl Session<'_, '_, '_> {
    /// Commits the open transaction: sends its records, then leaves its
    /// Kafka commit to a thread and goes on with the next transaction
    /// (`may_overlap`), or waits for it.
    pub(super) fn commit_transaction(
        &mut self,
        txn: &mut Transaction,
        carried: RunSummary,
        may_overlap: bool,
    ) -> Result<CommitOutcome, SessionError> {
        let started = Instant::now();
        // Phase one here; phase two, the commit point, on the commit thread.
        let mut two_phase =
            KafkaTransactions { committer: self.committer, consumer: self.consumer };
        let sent = match two_phase.prepare(txn, &self.progress.positions) {
            Ok(sent) => sent,
            Err(err) => return self.commit_failed(err, Settle::Wait),
        };
        let finishing = sent.map(|sent| {
            self.scope.spawn(move || {
                let result = two_phase.commit(Some(sent));
                (result, Instant::now())
            })
        });
        let done = CommitDone {
            started,
            positions: std::mem::take(&mut self.progress.positions),
            first: std::mem::take(&mut self.progress.first),
            carried,
        };
        let in_background = finishing.is_some() && may_overlap;
        self.in_flight = Some(InFlight { finishing, done });
        if in_background {
            return Ok(CommitOutcome::InFlight);
        }
        self.finish_in_flight(txn, Settle::Wait)
    }

    /// The outcome of the commit in flight: with [`Settle::IfReady`], only
    /// once it finished or a rebalance waits (a revocation aborts the open
    /// transaction, so the commit's outcome comes first).
    pub(super) fn settle_in_flight(
        &mut self,
        txn: &mut Transaction,
        how: Settle,
    ) -> Result<Option<CommitOutcome>, SessionError> {
        let Some(in_flight) = &self.in_flight else { return Ok(None) };
        if how == Settle::IfReady
            && !in_flight.is_finished()
            && !self.fetch.consumer_events_waiting()
        {
            return Ok(None);
        }
        self.finish_in_flight(txn, how).map(Some)
    }

    fn finish_in_flight(
        &mut self,
        txn: &mut Transaction,
        how: Settle,
    ) -> Result<CommitOutcome, SessionError> {
        let Some(mut in_flight) = self.in_flight.take() else {
            return Ok(CommitOutcome::Done(None));
        };
        if !in_flight.is_finished() {
            // Waiting for Kafka: another job of the tenant may use the CPU.
            self.context.idle();
        }
        match in_flight.join() {
            Ok(finished) => Ok(self.took_effect(txn, in_flight.done, finished)),
            Err(err) => {
                // Where a partition has no committed offset, the rewind goes
                // back to the first offset read since the last commit: this
                // transaction's, not the open one's.
                self.progress.first.extend(in_flight.done.first);
                self.commit_failed(err, how)
            }
        }
    }

    /// A commit that took effect at `finished`.
    fn took_effect(
        &mut self,
        txn: &mut Transaction,
        done: CommitDone,
        finished: Instant,
    ) -> CommitOutcome {
        txn.commit_finished();
        let took = finished.saturating_duration_since(done.started);
        let report = (!done.positions.is_empty()).then(|| Committed {
            at: finished,
            took,
            lag: consumer_lag(self.consumer),
            carried: done.carried,
        });
        self.progress.included.extend(done.positions);
        tracing::debug!(job = %self.job.name, took_us = took.as_micros() as u64, "committed");
        CommitOutcome::Done(report)
    }

    /// Handles a failed commit: an abortable error aborts and rewinds
    /// ([`CommitOutcome::Aborted`]; after a run's failure, nothing is
    /// undone: the next session starts from the committed offsets);
    /// anything else ends the session.
    fn commit_failed(
        &mut self,
        err: KafkaCommitError,
        how: Settle,
    ) -> Result<CommitOutcome, SessionError> {
        match err {
            KafkaCommitError::Kafka(err) if classify(&err) == Recovery::Abort => {
                if how != Settle::AfterFailure {
                    tracing::warn!(job = %self.job.name, error = %err, "transaction aborted; rewinding to the committed offsets");
                    self.committer.abort()?;
                    rewind(self.consumer, &self.progress.first)?;
                    self.progress.forget_uncommitted();
                }
                Ok(CommitOutcome::Aborted(err.to_string()))
            }
            KafkaCommitError::State(err) => Err(SessionError::fatal(err)),
            err => Err(Restart::Commit(err).into()),
        }
    }
}

/// A commit whose records are sent and whose Kafka commit runs on a thread
/// of its own.
pub(super) struct InFlight<'scope> {
    /// `None` when there was nothing to commit.
    pub(super) finishing:
        Option<std::thread::ScopedJoinHandle<'scope, (Result<(), KafkaCommitError>, Instant)>>,
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
                let (result, finished) =
                    finishing.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
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
    pub(super) carried: RunSummary,
}
