//! One Kafka session (a consumer and a producer): building the clients,
//! and the session's driver of the core's job loop, which reads records
//! for it, sends their outputs, and guards against records the state
//! already holds.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaErrorCode;

use super::commit::InFlight;
use super::progress::{Progress, rewind};
use super::rebalance::Rebalancer;
use super::{
    CONNECT_BUDGET, IDLE_FETCH_WAIT, KAFKA_TIMEOUT, KafkaJob, KafkaRunOptions, MAX_EVENTS_PER_TURN,
    Restart, SessionEnd, SessionError,
};
use crate::changelog::{RestoreLimits, Restorer};
use crate::committer::{Addresses, DeliveryTracker, JobProducer, KafkaCommitter};
use crate::config::{Guarantee, KafkaConfig};
use crate::fetch::{FetchQueue, Fetched, FetchedRecord, Router};
use crate::keys::{namespace, source_id, split_source_id};
use crate::{KafkaJobError, QuietEof, SetupError, topics};
use tally_core::batch::BatchOutcome;
use tally_core::observe::RunSummary;
use tally_core::plugin::{Event, JobContext};
use tally_core::settings::JobSettings;
use tally_core::task::{CommitOutcome, Driver, Finish, Input, Settle};
use tally_core::transaction::{SourcePosition, Transaction};

impl KafkaJob {
    pub(super) fn run_session(
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
                let progress = self.task.context().restore.clone();
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
        let open = Arc::new(AtomicBool::new(false));
        let router = Arc::new(Router::default());
        let consumer_config = topics::consumer_config(config, kafka, &self.instance);
        let rebalancer = Rebalancer {
            router: router.clone(),
            job: config.name.clone(),
            group: kafka.group_id(&config.name),
            inputs: kafka.inputs.clone(),
            guarantee: kafka.guarantee,
            producer: producer.clone(),
            open: open.clone(),
            restorer: restorer.clone(),
            store: self.store.clone(),
            settle,
            start_without_commit: topics::start_without_commit(&consumer_config),
            events: Mutex::default(),
        };
        let consumer: BaseConsumer<Rebalancer> = consumer_config
            .create_with_context(rebalancer)
            .map_err(|err| self.client_error(err))?;
        // Open before subscribing: every assigned partition is routed to it.
        let fetch = FetchQueue::open(&consumer, router, config.batch_size);
        let topics: Vec<&str> = kafka.inputs.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        // The group join goes on in librdkafka's threads while the other
        // clients connect: the assignment is handled (and restored) only
        // when the loop first polls, after the producer is ready. They
        // connect before they are used: a restore or a coordinator lookup
        // begun earlier would wait on librdkafka's retry timers.
        topics::connect_to_cluster(producer.client(), CONNECT_BUDGET);
        if new_restorer {
            topics::connect_to_cluster(restorer.consumer().client(), CONNECT_BUDGET);
        }
        if kafka.guarantee == Guarantee::ExactlyOnce {
            // Fences an earlier process with our transactional id and
            // aborts the transaction it left open.
            producer.init_transactions(KAFKA_TIMEOUT)?;
        }
        let addresses = Addresses {
            job: config.name.clone(),
            inputs: kafka.inputs.clone(),
            outputs: config
                .outputs
                .iter()
                .map(|name| kafka.output_topic(name).unwrap_or_default().to_string())
                .collect(),
            dead_letter: kafka.dead_letter_topic.clone(),
            changelog: self.layout.changelog.clone(),
        };
        let committer = KafkaCommitter::new(
            producer,
            kafka.guarantee,
            addresses,
            self.store.clone(),
            open,
            KAFKA_TIMEOUT,
        );
        let KafkaJob { config, kafka, task, .. } = self;
        let result = std::thread::scope(|scope| {
            let mut session = Session {
                job: config,
                kafka,
                consumer: &consumer,
                fetch,
                committer: &committer,
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

    /// A client that cannot even be created has a bad setting: say which.
    pub(super) fn client_error(&self, err: KafkaError) -> SessionError {
        SessionError::Fatal(KafkaJobError::Setup {
            job: self.config.name.clone(),
            source: SetupError::Client(err),
        })
    }
}

/// One session's [`Driver`]: its clients, where it stands in its
/// partitions, and the commit in flight on a thread of the session's scope.
pub(super) struct Session<'s, 'scope, 'env> {
    pub(super) job: &'s JobSettings,
    pub(super) kafka: &'s KafkaConfig,
    pub(super) consumer: &'scope BaseConsumer<Rebalancer>,
    pub(super) fetch: FetchQueue<'scope>,
    pub(super) committer: &'scope KafkaCommitter,
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
                .send_outputs(txn)
                .map_err(|source| Restart::Call { doing: "sending the outputs", source })?;
        }
        Ok(())
    }

    fn commit(
        &mut self,
        txn: &mut Transaction,
        carried: RunSummary,
        may_overlap: bool,
    ) -> Result<CommitOutcome, SessionError> {
        self.commit_transaction(txn, carried, may_overlap)
    }

    fn settle(
        &mut self,
        txn: &mut Transaction,
        how: Settle,
    ) -> Result<Option<CommitOutcome>, SessionError> {
        self.settle_in_flight(txn, how)
    }

    /// Aborts the transaction and moves the consumer back to the committed
    /// offsets.
    fn discard(&mut self, _txn: &mut Transaction) -> Result<(), SessionError> {
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
        if rebalanced.assigned {
            txn.overlay.forget_cache();
        }
        if rebalanced.revoked {
            // The rebalance handler aborted the transaction; what was read
            // for it is read again by whoever owns it now.
            self.progress.forget_uncommitted();
            self.progress.included.clear();
        }
        for ((topic, partition), next) in rebalanced.included {
            if let Some(index) = self.kafka.inputs.iter().position(|input| *input == topic) {
                self.progress.included.insert(source_id(index, partition), next);
            }
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
                return Ok(None);
            }
            wait = Duration::ZERO; // more may be waiting: fill the batch first
        }
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
    fn caught_up(&self) -> bool {
        let Ok(assignment) = self.consumer.assignment() else { return false };
        let assigned = assignment.elements();
        !assigned.is_empty() && self.progress.at_end.len() >= assigned.len()
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
                progress.at_end.insert((topic, partition));
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
