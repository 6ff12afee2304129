//! One Kafka session's driver of the core's job loop: it reads records for
//! the loop, sends their outputs, guards against records the state already
//! holds, and commits in two phases, the commit point on a thread of its
//! own while the next transaction runs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::commit::{CommitDone, InFlight};
use super::progress::{Progress, consumer_lag, rewind};
use super::rebalance::Rebalancer;
use super::state_updater::StateUpdater;
use super::{IDLE_FETCH_WAIT, KafkaRunOptions, MAX_EVENTS_PER_TURN, Restart, SessionError};
use crate::KafkaJobError;
use crate::committer::{KafkaCommitError, KafkaCommitter, KafkaTransactions, Recovery, classify};
use crate::config::{Guarantee, KafkaConfig};
use crate::fetch::{FetchQueue, Fetched, FetchedRecord};
use crate::keys::{namespace, source_id, split_source_id};
use crate::watermarks::SharedWatermarks;
use tally_core::batch::BatchOutcome;
use tally_core::commit::TwoPhaseCommitter;
use tally_core::observe::RunSummary;
use tally_core::plugin::{Event, JobContext};
use tally_core::settings::JobSettings;
use tally_core::task::{CommitOutcome, Committed, Driver, Input, Settle};
use tally_core::transaction::{SourcePosition, Transaction};

/// One session's [`Driver`]: its clients, where it stands in its
/// partitions, and the commit in flight on a thread of the session's scope.
pub(super) struct Session<'s, 'scope, 'env> {
    pub(super) job: &'s JobSettings,
    pub(super) kafka: &'s KafkaConfig,
    pub(super) consumer: &'scope BaseConsumer<Rebalancer>,
    pub(super) fetch: FetchQueue<'scope>,
    pub(super) committer: &'scope KafkaCommitter,
    /// Restores newly assigned partitions beside the processing.
    pub(super) updater: StateUpdater<'scope>,
    pub(super) scope: &'scope std::thread::Scope<'scope, 'env>,
    /// A commit whose records are sent, finishing on its own thread.
    pub(super) in_flight: Option<InFlight<'scope>>,
    pub(super) progress: Progress,
    /// Next offset per source id after the batch handed to the loop.
    pub(super) batch_ends: Vec<(u32, i64)>,
    /// A fatal consumer error seen while reading (the session restarts).
    pub(super) failure: Option<String>,
    pub(super) options: KafkaRunOptions,
    pub(super) context: JobContext,
    /// A period job's view of the watermarks its other instances commit.
    pub(super) watermarks: Option<SharedWatermarks>,
    /// The own watermarks sent to the watermark topic, per partition, in
    /// a commit that took effect or in the open transaction.
    pub(super) shared: BTreeMap<u32, Timestamp>,
    /// Changelog partitions added to the open Kafka transaction ahead of
    /// its commit ([`Session::register_changelog_partitions`]).
    pub(super) registered: BTreeSet<i32>,
    /// Whether the last read took all the fetch queue held.
    pub(super) drained: bool,
}

impl Driver for Session<'_, '_, '_> {
    type Error = SessionError;

    /// Hands the loop the records read, one input partition number at a
    /// time (each runs in its partition's state namespace); reads more
    /// when none are left.
    fn next_batch(
        &mut self,
        txn: &mut Transaction,
        events: &mut Vec<Event>,
        wait: Duration,
    ) -> Result<Input, SessionError> {
        events.clear();
        if self.progress.pending.is_empty() {
            if let Some(lost) = self.read(txn, wait)? {
                return Ok(lost);
            }
            if self.progress.pending.is_empty() {
                let caught_up = self.options.until_caught_up && self.caught_up();
                return Ok(if caught_up { Input::End } else { Input::Nothing });
            }
            self.progress.pending.sort_by_key(|event| split_source_id(event.partition).1);
        }
        self.take_partition(txn, events)
    }

    fn ran(
        &mut self,
        txn: &mut Transaction,
        _events: &[Event],
        _outcome: &BatchOutcome,
        on_trial: bool,
    ) -> Result<(), SessionError> {
        for (source, next) in self.batch_ends.drain(..) {
            let position = self.progress.positions.entry(source).or_insert(0);
            *position = (*position).max(next);
        }
        if !self.progress.pending.is_empty() {
            return Ok(());
        }
        // Without a Kafka transaction, sent records are visible at once: a
        // version on trial keeps its outputs until the trial is judged.
        // While a commit is in flight the producer is its own: outputs wait
        // in the transaction.
        let at_least_once_trial = on_trial && self.kafka.guarantee == Guarantee::AtLeastOnce;
        if txn.sends_outputs_early() && self.in_flight.is_none() && !at_least_once_trial {
            self.committer
                .collector()
                .send_outputs(txn)
                .map_err(|source| Restart::Call { doing: "sending the outputs", source })?;
            self.register_changelog_partitions().map_err(|source| Restart::Call {
                doing: "sending the changelog's position markers",
                source,
            })?;
        }
        Ok(())
    }

    fn commit(
        &mut self,
        txn: &mut Transaction,
        carried: RunSummary,
        may_overlap: bool,
    ) -> Result<CommitOutcome, SessionError> {
        self.prepare_and_commit(txn, carried, may_overlap)
    }

    fn settle(
        &mut self,
        txn: &mut Transaction,
        how: Settle,
    ) -> Result<Option<CommitOutcome>, SessionError> {
        self.settle_if(txn, how)
    }

    /// The last read took all the fetch queue held, and every partition
    /// the job reads (restored) reported its end since its last record: a
    /// backlog that only arrives slower than the job runs is not caught up.
    fn caught_up_now(&self) -> bool {
        let progress = &self.progress;
        self.drained
            && progress.pending.is_empty()
            && progress.assigned.difference(&progress.restoring).all(|&partition| {
                (0..self.kafka.inputs.len())
                    .all(|topic| progress.at_end.contains_key(&(topic, partition)))
            })
    }

    fn commit_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Aborts the transaction and moves the consumer back to the committed
    /// offsets.
    fn discard(&mut self, _txn: &mut Transaction) -> Result<(), SessionError> {
        self.shared.clear();
        self.registered.clear();
        self.committer.abort()?;
        rewind(self.consumer, &self.progress.first)?;
        self.progress.forget_uncommitted();
        Ok(())
    }

    /// Records read but not run are left for the next run (the committed
    /// offsets stop before them).
    fn stopping(&mut self) {
        self.progress.pending.clear();
        self.progress.pending_bytes = 0;
        self.progress.oversized.clear();
    }

    /// A period job's partitions that have been read to their end for
    /// `idle_timeout` (all those at their end, `at_end`); the periods
    /// learn the watermarks the job's other instances committed.
    fn idle_partitions(&mut self, txn: &mut Transaction, at_end: bool) -> Vec<u32> {
        let (Some(periods), Some(book)) = (&self.job.periods, txn.periods.as_deref_mut()) else {
            return Vec::new();
        };
        let Some(watermarks) = self.watermarks.as_mut().and_then(SharedWatermarks::look) else {
            // Until the others' committed watermarks are read to their
            // end, the lowest of them is not known: nothing is idle yet.
            return Vec::new();
        };
        book.set_others(watermarks.iter().map(|(&p, &at)| (p, at)));
        let timeout = periods.idle_timeout.unsigned_abs();
        let progress = &self.progress;
        progress
            .at_end
            .iter()
            .filter(|((topic, partition), since)| {
                // A partition with records read but not run is not idle.
                let source = source_id(*topic, *partition);
                !progress.restoring.contains(partition)
                    && !progress.pending.iter().any(|event| event.partition == source)
                    && (at_end || since.elapsed() >= timeout)
            })
            .map(|(&(topic, partition), _)| source_id(topic, partition))
            .collect()
    }
}

impl Session<'_, '_, '_> {
    /// Serves the consumer's own queue (rebalances, client errors), then
    /// reads records, waiting at most `wait` for the first, until a batch
    /// is full or nothing more waits. `Some` if partitions were revoked:
    /// the open transaction is lost.
    fn read(
        &mut self,
        txn: &mut Transaction,
        wait: Duration,
    ) -> Result<Option<Input>, SessionError> {
        // Rebalances and client errors arrive on the consumer's own queue,
        // records on the fetch queue: serve the first before reading the
        // second. A poll serves one event, so poll while events wait (a
        // bounded number: log lines may keep coming). While a commit is in
        // flight they wait: a revocation aborts the open transaction.
        let polls = if self.in_flight.is_some() { 0 } else { MAX_EVENTS_PER_TURN };
        for served in 0..polls {
            if served > 0 && !self.fetch.consumer_events_waiting() {
                break;
            }
            let mut take = |fetched| {
                take_fetched(self.job, self.kafka, &mut self.progress, fetched, &mut self.failure)
            };
            match self.consumer.poll(Duration::ZERO) {
                // Only a partition the router missed delivers here.
                Some(Ok(record)) => take(Fetched::Record(FetchedRecord::of(&record))),
                // Only with one input does this queue say which topic ended.
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    if let [input] = self.kafka.inputs.as_slice() {
                        take(Fetched::End(input, partition, None));
                    }
                }
                Some(Err(err)) => take(Fetched::Error(consumer_error_code(&err), err.to_string())),
                None => {}
            }
        }
        let rebalanced = self.consumer.context().take_events();
        if let Some(failure) = rebalanced.failure {
            return Err(failure);
        }
        if rebalanced.revoked {
            // The rebalance handler aborted the transaction; what was read
            // for it is read again by whoever owns it now.
            self.registered.clear();
            self.progress.forget_uncommitted();
            self.progress.included.clear();
            self.progress.restoring.clear();
            self.progress.assigned.clear();
            self.shared.clear();
        }
        if let Some(assignment) = rebalanced.assigned
            && self.updater.is_current(&assignment)
        {
            self.progress.restoring =
                assignment.partitions.iter().map(|(_, partition)| *partition).collect();
            self.progress.assigned = self.progress.restoring.clone();
            self.updater.restore(assignment);
        }
        self.resume_restored(txn)?;
        if let Some(book) = txn.periods.as_deref_mut() {
            // A period job's book holds the partitions assigned and restored.
            let progress = &self.progress;
            book.own(
                progress
                    .assigned
                    .difference(&progress.restoring)
                    .map(|&partition| source_id(0, partition))
                    .collect(),
            );
        }
        if rebalanced.revoked {
            return Ok(Some(Input::Lost("partitions were revoked")));
        }
        let batch_size = self.job.batch_size;
        let batch_bytes = self.job.limits.batch_bytes();
        let mut wait = wait.min(IDLE_FETCH_WAIT);
        loop {
            if !wait.is_zero() {
                // Waiting for records: another job of the tenant may use the CPU.
                self.context.idle();
            }
            let room = batch_size.saturating_sub(self.progress.pending.len());
            let (job, kafka, progress, failure) =
                (self.job, self.kafka, &mut self.progress, &mut self.failure);
            let read = self
                .fetch
                .read(wait, room, |item| take_fetched(job, kafka, progress, item, failure));
            if let Some(reason) = self.failure.take() {
                return Err(Restart::Consumer(reason).into());
            }
            if read == 0
                || self.progress.pending.len() >= batch_size
                || self.progress.pending_bytes >= batch_bytes
            {
                self.drained = read == 0;
                return Ok(None);
            }
            wait = Duration::ZERO; // more may be waiting: fill the batch first
        }
    }

    /// Resumes the partitions the state updater restored and checked since
    /// the last look; their state includes input up to the offsets it read.
    fn resume_restored(&mut self, txn: &mut Transaction) -> Result<(), SessionError> {
        while let Some(restored) = self.updater.try_restored() {
            let included = restored.result?;
            // The store changed underneath: the restore wrote their state.
            txn.overlay.forget_cache();
            for ((topic, partition), next) in included {
                if let Some(index) = self.kafka.inputs.iter().position(|input| *input == topic) {
                    self.progress.included.insert(source_id(index, partition), next);
                }
            }
            let mut resume = TopicPartitionList::new();
            for (topic, partition) in &restored.partitions {
                resume.add_partition(topic, *partition);
                self.progress.restoring.remove(partition);
            }
            self.consumer.resume(&resume).map_err(|source| Restart::Call {
                doing: "resuming the partitions restored",
                source,
            })?;
            tracing::info!(job = %self.job.name, partitions = ?restored.partitions, "state restored and checked; reading the partitions");
        }
        Ok(())
    }

    /// Moves the pending records of the lowest input partition number into
    /// `events`, in that partition's state namespace. Under
    /// `exactly_once`, a record below what the state already includes (the
    /// consumer was moved back: an offset reset, a truncated log) stops the
    /// job instead of counting twice.
    fn take_partition(
        &mut self,
        txn: &mut Transaction,
        events: &mut Vec<Event>,
    ) -> Result<Input, SessionError> {
        self.batch_ends.clear();
        let progress = &mut self.progress;
        let number = split_source_id(progress.pending[0].partition).1;
        let len = progress
            .pending
            .iter()
            .take_while(|event| split_source_id(event.partition).1 == number)
            .count();
        let batch = &progress.pending[..len];
        // Runs of one source (a batch holds one partition number of every
        // input topic): one lookup per run, not per record.
        for run in batch.chunk_by(|a, b| a.partition == b.partition) {
            let lowest = run.iter().map(|event| event.offset).min().unwrap_or(0) as i64;
            let highest = run.iter().map(|event| event.offset).max().unwrap_or(0) as i64;
            self.batch_ends.push((run[0].partition, highest + 1));
            let included = progress.included.get(&run[0].partition).copied().unwrap_or(0);
            if self.kafka.guarantee == Guarantee::ExactlyOnce && lowest < included {
                let (topic, partition) = split_source_id(run[0].partition);
                return Err(SessionError::Fatal(KafkaJobError::Rewind {
                    job: self.job.name.clone(),
                    topic: self.kafka.inputs[topic].clone(),
                    partition,
                    offset: lowest,
                    included,
                }));
            }
        }
        txn.set_namespace(&namespace(number));
        let limit = self.job.limits.max_record_bytes;
        let mut oversized = 0;
        for event in progress.pending.drain(..len) {
            if let Some(size) = progress.oversized.remove(&(event.partition, event.offset)) {
                let source = SourcePosition { partition: event.partition, offset: event.offset };
                tally_core::batch::dead_letter_oversized(
                    txn,
                    source,
                    event.value,
                    size as u64,
                    limit,
                );
                oversized += 1;
                continue;
            }
            events.push(event);
        }
        if progress.pending.is_empty() {
            progress.pending_bytes = 0;
        }
        Ok(Input::Batch { read: len, oversized, more_buffered: !progress.pending.is_empty() })
    }

    /// Whether every assigned partition has reported its end since it last
    /// delivered a record.
    /// A period job's partitions must also have been idle for its
    /// `idle_timeout`, so what idleness closes is closed before the end.
    fn caught_up(&self) -> bool {
        let Ok(assignment) = self.consumer.assignment() else { return false };
        let assigned = assignment.elements();
        let idle_for = self.job.periods.as_ref().map(|periods| periods.idle_timeout.unsigned_abs());
        let at_end = self
            .progress
            .at_end
            .values()
            .filter(|since| idle_for.is_none_or(|idle_for| since.elapsed() >= idle_for))
            .count();
        !assigned.is_empty() && at_end >= assigned.len()
    }
}

/// The code a consumer's error is taken by: a fatal one (a static member
/// fenced by its own rejoin after a broker restart, say) is
/// [`RDKafkaErrorCode::Fatal`] whatever its own code, so it ends the
/// session: the consumer reads nothing more.
fn consumer_error_code(err: &KafkaError) -> RDKafkaErrorCode {
    match err {
        KafkaError::MessageConsumptionFatal(_) => RDKafkaErrorCode::Fatal,
        err => err.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Unknown),
    }
}

/// Takes one item read from the input: a record joins the pending batch, a
/// partition's end is noted, a fatal client error is put in `failure` (the
/// session restarts).
fn take_fetched(
    job: &JobSettings,
    kafka: &KafkaConfig,
    progress: &mut Progress,
    item: Fetched<'_>,
    failure: &mut Option<String>,
) {
    match item {
        Fetched::Record(record) => {
            // Naming the topic costs a C string conversion per record: skip
            // it when there is only one.
            let topic = match kafka.inputs.len() {
                1 => 0,
                _ => kafka.inputs.iter().position(|input| input == record.topic()).unwrap_or(0),
            };
            let partition = record.partition();
            if !progress.restoring.is_empty() && progress.restoring.contains(&partition) {
                // The partition was assigned paused: nothing of it may run
                // before its state. Rejoining starts it over, safely.
                *failure = Some(format!(
                    "a record of `{}` partition {partition} arrived while its state was still being restored",
                    record.topic()
                ));
                return;
            }
            if !progress.at_end.is_empty() {
                progress.at_end.remove(&(topic, partition));
            }
            let payload = record.payload().unwrap_or_default();
            let source = source_id(topic, partition);
            let offset = record.offset() as u64;
            let value = if payload.len() as u64 > job.limits.max_record_bytes {
                // Kept as a prefix for the dead letter, never whole.
                progress.oversized.insert((source, offset), payload.len());
                payload[..payload.len().min(tally_core::batch::OVERSIZED_PREFIX_BYTES)].to_vec()
            } else {
                payload.to_vec()
            };
            let event = Event {
                partition: source,
                offset,
                timestamp_ms: record.timestamp_ms(),
                key: record.key().map(<[u8]>::to_vec),
                value,
            };
            progress.pending_bytes +=
                (event.value.len() + event.key.as_ref().map_or(0, Vec::len)) as u64;
            progress.first.entry(event.partition).or_insert(event.offset as i64);
            progress.pending.push(event);
        }
        Fetched::End(topic, partition, _) => {
            if let Some(topic) = kafka.inputs.iter().position(|input| input == topic) {
                progress.at_end.entry((topic, partition)).or_insert_with(Instant::now);
            }
        }
        Fetched::Error(code, text) => {
            tracing::warn!(job = %job.name, error = %text, "consumer error");
            if code == RDKafkaErrorCode::Fatal {
                *failure = Some(text);
            }
        }
    }
}

impl Session<'_, '_, '_> {
    /// Commits the open transaction: prepares it (sends its records), then
    /// leaves its commit point to a thread and goes on with the next
    /// transaction (`may_overlap`), or waits for it.
    fn prepare_and_commit(
        &mut self,
        txn: &mut Transaction,
        carried: RunSummary,
        may_overlap: bool,
    ) -> Result<CommitOutcome, SessionError> {
        let started = Instant::now();
        if let Err(source) = self.share_watermarks(txn) {
            return self.commit_failed(KafkaCommitError::Kafka(source), Settle::Wait);
        }
        // Phase one here; phase two, the commit point, on the commit thread.
        let mut two_phase =
            KafkaTransactions { committer: self.committer, consumer: self.consumer };
        let prepared = {
            let positions = self.fenced_positions(txn);
            two_phase.prepare(txn, &positions)
        };
        // The next Kafka transaction registers its partitions anew.
        self.registered.clear();
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(err) => return self.commit_failed(err, Settle::Wait),
        };
        let finishing = prepared.map(|prepared| {
            self.scope.spawn(move || {
                let result = two_phase.commit(Some(prepared));
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
        self.settle_now(txn, Settle::Wait)
    }

    /// Adds the changelog partitions of the input partitions read in the
    /// open transaction to its Kafka transaction now, not at its commit:
    /// each is sent its last committed position marker again (true of the
    /// state at every point since), so librdkafka registers the partition
    /// with the transaction (AddPartitionsToTxn) while the job still
    /// processes, and the commit waits for one round trip to the
    /// transaction coordinator less. The commit's own marker follows it.
    /// Under `exactly_once` only: without a transaction there is nothing
    /// to register.
    fn register_changelog_partitions(&mut self) -> Result<(), KafkaError> {
        if self.kafka.guarantee != Guarantee::ExactlyOnce {
            return Ok(());
        }
        for &source in self.progress.positions.keys() {
            let (topic, partition) = split_source_id(source);
            if self.registered.contains(&partition) {
                continue;
            }
            if let Some(&included) = self.progress.included.get(&source) {
                self.committer.collector().send_position(topic, partition, included)?;
                self.registered.insert(partition);
            }
        }
        Ok(())
    }

    /// The input positions a commit carries. A period job's commit also
    /// carries the committed position of every partition it owns and did
    /// not read in it: a commit that only closes idle partitions then
    /// still goes with the group's offsets, so the broker fences it when
    /// this instance has lost the group (a zombie closing periods its
    /// successor closes too).
    fn fenced_positions(&self, txn: &Transaction) -> std::borrow::Cow<'_, BTreeMap<u32, i64>> {
        let mut positions = std::borrow::Cow::Borrowed(&self.progress.positions);
        if txn.periods.is_none()
            || self.kafka.guarantee != Guarantee::ExactlyOnce
            || txn.overlay.is_empty()
        {
            return positions;
        }
        for (&source, &next) in &self.progress.included {
            let partition = split_source_id(source).1;
            if self.progress.assigned.contains(&partition)
                && !self.progress.restoring.contains(&partition)
                && !positions.contains_key(&source)
            {
                positions.to_mut().insert(source, next);
            }
        }
        positions
    }

    /// Sends the own watermarks that moved since they were last sent into
    /// the open transaction: the job's other instances learn them when,
    /// and only if, it commits.
    fn share_watermarks(&mut self, txn: &Transaction) -> Result<(), KafkaError> {
        let Some(book) = txn.periods.as_deref() else { return Ok(()) };
        for (partition, at) in book.watermarks() {
            if self.shared.get(&partition) != Some(&at) {
                self.committer.collector().send_watermark(partition, at)?;
                self.shared.insert(partition, at);
            }
        }
        Ok(())
    }

    /// The outcome of the commit in flight: with [`Settle::IfReady`], only
    /// once it finished or a rebalance waits (a revocation aborts the open
    /// transaction, so the commit's outcome comes first).
    fn settle_if(
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
        self.settle_now(txn, how).map(Some)
    }

    /// Waits for the commit in flight and takes its outcome.
    fn settle_now(
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
            Ok(finished) => Ok(self.committed(txn, in_flight.done, finished)),
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
    fn committed(
        &mut self,
        txn: &mut Transaction,
        done: CommitDone,
        finished: Instant,
    ) -> CommitOutcome {
        txn.prepared_took_effect();
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
                self.shared.clear();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fatal_consumer_error_ends_the_session_whatever_its_code() {
        assert_eq!(
            consumer_error_code(&KafkaError::MessageConsumptionFatal(
                RDKafkaErrorCode::FencedInstanceId
            )),
            RDKafkaErrorCode::Fatal
        );
        assert_eq!(
            consumer_error_code(&KafkaError::MessageConsumption(
                RDKafkaErrorCode::BrokerTransportFailure
            )),
            RDKafkaErrorCode::BrokerTransportFailure
        );
    }
}
