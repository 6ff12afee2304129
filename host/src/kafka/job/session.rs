//! One Kafka session (a consumer and a producer): building the clients,
//! the job loop that reads records, runs them through the task and sends
//! their outputs, and the guard against records the state already holds.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaErrorCode;

use super::commit::{Commits, Overlap};
use super::progress::{rewind, Progress};
use super::rebalance::Rebalancer;
use super::{KafkaJob, KafkaRunOptions, Restart, SessionEnd, SessionError, CONNECT_BUDGET, IDLE_FETCH_WAIT, KAFKA_TIMEOUT, MAX_EVENTS_PER_TURN};
use crate::config::Guarantee;
use crate::kafka::changelog::Restorer;
use crate::kafka::committer::{Addresses, DeliveryTracker, JobProducer, KafkaCommitter};
use crate::kafka::fetch::{FetchQueue, Fetched, FetchedRecord, Router};
use crate::kafka::keys::{namespace, source_id, split_source_id};
use crate::kafka::{topics, KafkaJobError, QuietEof};
use tally_core::observe::RunSummary;
use tally_core::plugin::Event;
use tally_core::task::Ran;

impl KafkaJob {
    pub(super) fn run_session(&mut self, stop: &AtomicBool, options: KafkaRunOptions, summary: &mut RunSummary) -> Result<SessionEnd, SessionError> {
        let (config, kafka) = (&self.config, &self.kafka);
        let tracker = DeliveryTracker::new(self.layout.changelog.clone());
        let producer: Arc<JobProducer> = Arc::new(
            topics::producer_config(config, kafka, &self.instance).create_with_context(tracker).map_err(|err| self.client_error(err))?,
        );
        let settle = Duration::from_millis(2 * kafka.transaction_timeout_ms) + Duration::from_secs(10);
        let (restorer, new_restorer) = match &self.restorer {
            Some(restorer) => (restorer.clone(), false),
            None => {
                let consumer: BaseConsumer<QuietEof> =
                    topics::restore_config(config, kafka).create_with_context(QuietEof).map_err(|err| self.client_error(err))?;
                let restorer = Arc::new(Restorer::new(consumer, self.store.clone(), self.layout.changelog.clone(), settle));
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
        let consumer: BaseConsumer<Rebalancer> =
            consumer_config.create_with_context(rebalancer).map_err(|err| self.client_error(err))?;
        // Open before subscribing: every assigned partition is routed to it.
        let mut fetch = FetchQueue::open(&consumer, router, config.batch_size);
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
            outputs: config.outputs.iter().map(|name| kafka.output_topic(name).unwrap_or_default().to_string()).collect(),
            dead_letter: kafka.dead_letter_topic.clone(),
            changelog: self.layout.changelog.clone(),
        };
        let committer = KafkaCommitter::new(producer, kafka.guarantee, addresses, self.store.clone(), open, KAFKA_TIMEOUT);
        self.task.drop_transaction("a new Kafka session starts");
        let result = self.consume(&consumer, &mut fetch, &committer, stop, options, summary);
        // Hand over cleanly: abort what is open, then leave the group.
        let _ = committer.abort();
        self.task.drop_transaction("the Kafka session ended");
        drop(fetch);
        drop(consumer);
        result
    }

    /// A client that cannot even be created has a bad setting: say which.
    pub(super) fn client_error(&self, err: KafkaError) -> SessionError {
        SessionError::Fatal(KafkaJobError::Setup {
            job: self.config.name.clone(),
            message: format!("cannot create a Kafka client: {err}; check kafka.client and kafka.brokers"),
        })
    }

    /// Runs the job loop; each transaction's Kafka commit overlaps the
    /// next one's processing, on a thread of the session's scope.
    pub(super) fn consume(
        &mut self,
        consumer: &BaseConsumer<Rebalancer>,
        fetch: &mut FetchQueue<'_>,
        committer: &KafkaCommitter,
        stop: &AtomicBool,
        options: KafkaRunOptions,
        summary: &mut RunSummary,
    ) -> Result<SessionEnd, SessionError> {
        std::thread::scope(|scope| {
            let mut commits = Commits { scope, in_flight: None };
            let result = self.consume_in(consumer, fetch, committer, stop, options, summary, &mut commits);
            if let Some(mut in_flight) = commits.in_flight.take() {
                // The session failed while a commit was in flight: count it
                // if it took effect; the clients close after it ends.
                if let Ok(finished) = in_flight.join() {
                    self.commit_took_effect(consumer, in_flight.done, finished, &mut Progress::default(), summary);
                }
            }
            result
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn consume_in<'scope>(
        &mut self,
        consumer: &'scope BaseConsumer<Rebalancer>,
        fetch: &mut FetchQueue<'_>,
        committer: &'scope KafkaCommitter,
        stop: &AtomicBool,
        options: KafkaRunOptions,
        summary: &mut RunSummary,
        commits: &mut Commits<'scope, '_>,
    ) -> Result<SessionEnd, SessionError> {
        let interval = self.config.commit_interval();
        let batch_size = self.config.batch_size;
        let mut progress = Progress { pending: Vec::with_capacity(batch_size), ..Progress::default() };
        let mut last_commit = Instant::now();
        self.task.at_boundary();
        loop {
            if stop.load(Ordering::Relaxed) {
                // Records read but not run are left for the next run (the
                // committed offsets stop before them): commit what was.
                progress.pending.clear();
                progress.pending_bytes = 0;
                progress.oversized.clear();
                if self.commit(consumer, committer, &mut progress, summary, commits, Overlap::No)? {
                    return Ok(SessionEnd::Stopped);
                }
                continue;
            }
            // Take a finished commit's outcome at once (its outputs wait for
            // the producer), and any commit's before a rebalance is served:
            // a revocation aborts the open transaction.
            let settle = commits.in_flight.as_ref().is_some_and(|in_flight| in_flight.is_finished() || fetch.consumer_events_waiting());
            if settle && !self.settle(consumer, committer, &mut progress, summary, commits)? {
                continue;
            }
            let wait = if progress.pending.is_empty() {
                interval.saturating_sub(last_commit.elapsed()).min(Duration::from_millis(100))
            } else {
                Duration::ZERO
            };
            // Rebalances and client errors arrive on the consumer's own
            // queue, records on the fetch queue: serve the first before
            // reading the second. A poll serves one event, so poll while
            // events wait (a bounded number: log lines may keep coming).
            let mut failure = None;
            let polls = if commits.in_flight.is_some() { 0 } else { MAX_EVENTS_PER_TURN };
            for served in 0..polls {
                if served > 0 && !fetch.consumer_events_waiting() {
                    break;
                }
                match consumer.poll(Duration::ZERO) {
                    // Only a partition the router missed delivers here.
                    Some(Ok(record)) => self.fetched(&mut progress, Fetched::Record(FetchedRecord::of(&record)), &mut failure),
                    Some(Err(KafkaError::PartitionEOF(partition))) => {
                        // Only with one input does this queue say which topic ended.
                        if let [input] = self.kafka.inputs.as_slice() {
                            self.fetched(&mut progress, Fetched::End(input, partition), &mut failure);
                        }
                    }
                    Some(Err(err)) => {
                        let code = err.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Unknown);
                        self.fetched(&mut progress, Fetched::Error(code, err.to_string()), &mut failure)
                    }
                    None => {}
                }
            }
            let rebalanced = consumer.context().take_events();
            if let Some(failure) = rebalanced.failure {
                return Err(failure);
            }
            if rebalanced.revoked {
                // The rebalance handler aborted the transaction; what was
                // read for it is read again by whoever owns it now.
                self.task.drop_transaction("partitions were revoked");
                progress.forget_uncommitted();
                progress.included.clear();
            }
            if rebalanced.assigned {
                self.task.txn().overlay.forget_cache();
                for ((topic, partition), next) in rebalanced.included {
                    if let Some(index) = self.kafka.inputs.iter().position(|input| *input == topic) {
                        progress.included.insert(source_id(index, partition), next);
                    }
                }
            }
            let room = batch_size.saturating_sub(progress.pending.len());
            let wait = if progress.pending.is_empty() { wait.min(IDLE_FETCH_WAIT) } else { Duration::ZERO };
            if !wait.is_zero() {
                // Waiting for records: another job of the tenant may use the CPU.
                self.task.context().idle();
            }
            let read = fetch.read(wait, room, |item| self.fetched(&mut progress, item, &mut failure));
            if let Some(reason) = failure {
                return Err(Restart::Consumer(reason).into());
            }
            if read > 0 && progress.pending.len() < batch_size && progress.pending_bytes < self.config.limits.batch_bytes() {
                continue; // more may be waiting: fill the batch first
            }
            if !self.process_or_roll_back(consumer, committer, &mut progress, commits.in_flight.is_some())? {
                continue;
            }
            if self.task.commit_due(last_commit) {
                self.commit(consumer, committer, &mut progress, summary, commits, Overlap::Yes)?;
                last_commit = Instant::now();
            }
            if options.until_caught_up
                && progress.pending.is_empty()
                && self.caught_up(consumer, &progress.at_end)
                && self.commit(consumer, committer, &mut progress, summary, commits, Overlap::No)?
            {
                return Ok(SessionEnd::CaughtUp);
            }
        }
    }

    /// Whether every assigned partition has reported its end since it last
    /// delivered a record.
    pub(super) fn caught_up(&self, consumer: &BaseConsumer<Rebalancer>, at_end: &BTreeSet<(usize, i32)>) -> bool {
        let Ok(assignment) = consumer.assignment() else { return false };
        let assigned = assignment.elements();
        !assigned.is_empty() && at_end.len() >= assigned.len()
    }

    /// Takes one item read from the input: a record joins the pending
    /// batch, a partition's end is noted, a fatal client error is put in
    /// `failure` (the session restarts).
    pub(super) fn fetched(&self, progress: &mut Progress, item: Fetched<'_>, failure: &mut Option<String>) {
        match item {
            Fetched::Record(record) => {
                // Naming the topic costs a C string conversion per record:
                // skip it when there is only one.
                let topic = match self.kafka.inputs.len() {
                    1 => 0,
                    _ => self.kafka.inputs.iter().position(|input| input == record.topic()).unwrap_or(0),
                };
                let partition = record.partition();
                if !progress.at_end.is_empty() {
                    progress.at_end.remove(&(topic, partition));
                }
                let payload = record.payload().unwrap_or_default();
                let source = source_id(topic, partition);
                let offset = record.offset() as u64;
                let value = if payload.len() as u64 > self.config.limits.max_record_bytes {
                    // Kept as a prefix for the dead letter, never whole.
                    progress.oversized.insert((source, offset), payload.len());
                    payload[..payload.len().min(tally_core::batch::OVERSIZED_PREFIX_BYTES)].to_vec()
                } else {
                    payload.to_vec()
                };
                let event = Event { partition: source, offset, timestamp_ms: record.timestamp_ms(), key: record.key().map(<[u8]>::to_vec), value };
                progress.pending_bytes += (event.value.len() + event.key.as_ref().map_or(0, Vec::len)) as u64;
                progress.first.entry(event.partition).or_insert(event.offset as i64);
                progress.pending.push(event);
            }
            Fetched::End(topic, partition) => {
                if let Some(topic) = self.kafka.inputs.iter().position(|input| input == topic) {
                    progress.at_end.insert((topic, partition));
                }
            }
            Fetched::Error(code, text) => {
                tracing::warn!(job = %self.config.name, error = %text, "consumer error");
                if code == RDKafkaErrorCode::Fatal {
                    *failure = Some(text);
                }
            }
        }
    }

    /// [`KafkaJob::process`], rolling a plugin version on trial back if it
    /// fails; `false` after a rollback (the input is read again).
    pub(super) fn process_or_roll_back(
        &mut self,
        consumer: &BaseConsumer<Rebalancer>,
        committer: &KafkaCommitter,
        progress: &mut Progress,
        commit_in_flight: bool,
    ) -> Result<bool, SessionError> {
        match self.process(progress, committer, commit_in_flight)? {
            None => Ok(true),
            Some(reason) => {
                self.roll_back(consumer, committer, progress, reason)?;
                Ok(false)
            }
        }
    }

    /// Aborts the transaction (a trial version failed it), puts the
    /// previous plugin version back, and rewinds to the committed offsets.
    pub(super) fn roll_back(
        &mut self,
        consumer: &BaseConsumer<Rebalancer>,
        committer: &KafkaCommitter,
        progress: &mut Progress,
        reason: String,
    ) -> Result<(), SessionError> {
        // The task puts the previous version back first: whatever happens
        // to the abort, the failed version never runs again.
        self.task.roll_back(reason);
        committer.abort()?;
        rewind(consumer, &progress.first)?;
        progress.forget_uncommitted();
        Ok(())
    }

    /// Runs the pending records through the plugin, one batch per input
    /// partition (each in its partition's state namespace), and sends the
    /// outputs into the open transaction. Under `exactly_once`, a record
    /// below what the state already includes (the consumer was moved back:
    /// an offset reset, a truncated log) stops the job instead of counting
    /// twice.
    /// Returns why a plugin version on trial failed, if it did (nothing is
    /// sent then). While a commit is in flight the producer is its own:
    /// outputs wait in the transaction.
    pub(super) fn process(
        &mut self,
        progress: &mut Progress,
        committer: &KafkaCommitter,
        commit_in_flight: bool,
    ) -> Result<Option<String>, SessionError> {
        if progress.pending.is_empty() {
            return Ok(None);
        }
        let pending = &mut progress.pending;
        pending.sort_by_key(|event| split_source_id(event.partition).1);
        for batch in pending.chunk_by(|a, b| split_source_id(a.partition).1 == split_source_id(b.partition).1) {
            if self.kafka.guarantee == Guarantee::ExactlyOnce {
                // Runs of one source (a batch holds one partition number of
                // every input topic): one lookup per run, not per record.
                for run in batch.chunk_by(|a, b| a.partition == b.partition) {
                    let included = progress.included.get(&run[0].partition).copied().unwrap_or(0);
                    let lowest = run.iter().map(|event| event.offset).min().unwrap_or(0) as i64;
                    if lowest < included {
                        let (topic, partition) = split_source_id(run[0].partition);
                        return Err(SessionError::Fatal(KafkaJobError::Rewind(format!(
                            "Kafka job `{}` stopped: it was handed offset {lowest} of `{}` partition {partition}, but its state \
                             already includes that partition up to offset {included}; the consumer was moved back (an offset \
                             reset, or a truncated log), and going on would count those records twice. To reprocess history, \
                             replay into a new output version: run the job under a new name writing to new output topics",
                            self.config.name, self.kafka.inputs[topic]
                        ))));
                    }
                }
            }
            self.task.txn().set_namespace(&namespace(split_source_id(batch[0].partition).1));
            let fitting: Vec<Event>;
            let mut to_run = batch;
            let mut too_large = 0;
            if !progress.oversized.is_empty() {
                let limit = self.config.limits.max_record_bytes;
                fitting = batch
                    .iter()
                    .filter(|event| match progress.oversized.remove(&(event.partition, event.offset)) {
                        None => true,
                        Some(size) => {
                            let source = tally_core::transaction::SourcePosition { partition: event.partition, offset: event.offset };
                            tally_core::batch::dead_letter_oversized(self.task.txn(), source, event.value.clone(), size as u64, limit);
                            too_large += 1;
                            false
                        }
                    })
                    .cloned()
                    .collect();
                to_run = &fitting;
            }
            let outcome = match self.task.run(to_run, batch.len(), too_large).map_err(SessionError::fatal)? {
                Ran::Done(outcome) => outcome,
                Ran::TrialFailed(reason) => return Ok(Some(reason)),
                Ran::Stopped => return Err(SessionError::Stopped),
            };
            progress.uncommitted.count_batch(batch.len(), &outcome);
            for run in batch.chunk_by(|a, b| a.partition == b.partition) {
                let highest = run.iter().map(|event| event.offset).max().unwrap_or(0) as i64;
                let next = progress.positions.entry(run[0].partition).or_insert(0);
                *next = (*next).max(highest + 1);
            }
        }
        pending.clear();
        progress.pending_bytes = 0;
        // Without a Kafka transaction, sent records are visible at once: a
        // version on trial keeps its outputs until the trial is judged.
        let on_trial = self.task.on_trial();
        if self.task.txn().sends_outputs_early() && !commit_in_flight && !(on_trial && self.kafka.guarantee == Guarantee::AtLeastOnce) {
            committer.send_outputs(self.task.txn()).map_err(|source| Restart::Call { doing: "sending the outputs", source })?;
        }
        Ok(None)
    }
}
