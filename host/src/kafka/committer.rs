//! Kafka mode's committer: sends a transaction's outputs (with lineage
//! headers), its changelog records and its input offsets, commits them as
//! one Kafka transaction (or, `at_least_once`, flushes then commits the
//! offsets), and only then applies the state to RocksDB.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::config::FromClientConfigAndContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

use super::keys::{checkpoint_key, included_key, split_namespaced, split_source_id, ChangelogKey};
use crate::config::Guarantee;
use tally_core::commit::TwoPhaseCommitter;
use tally_core::state::{StateError, StateStore, StoreCommit};
use tally_core::transaction::{SourcePosition, Transaction};

/// Header of the input topic an output record came from.
pub const HEADER_SOURCE_TOPIC: &str = "tally.source.topic";
/// Header of the input partition an output record came from.
pub const HEADER_SOURCE_PARTITION: &str = "tally.source.partition";
/// Header of the input offset an output record came from.
pub const HEADER_SOURCE_OFFSET: &str = "tally.source.offset";
/// Header of the digest of the plugin that produced a record.
pub const HEADER_PLUGIN: &str = "tally.plugin";
/// Header of the deterministic idempotency key
/// `<job>/<topic>/<partition>/<offset>/<n>`: the same on every re-run of the
/// same input, so a downstream effect can dedupe.
pub const HEADER_IDEMPOTENCY_KEY: &str = "tally.idempotency-key";
/// Header of a dead letter's reason.
pub const HEADER_REASON: &str = "tally.reason";
/// Header of a dead letter whose record was cut: its original length.
pub const HEADER_TRUNCATED_FROM: &str = "tally.truncated-from";
/// Most bytes of a record a dead letter keeps.
pub const MAX_DEAD_LETTER_BYTES: usize = 512 << 10;
/// Most bytes of a dead letter's reason.
const MAX_REASON_BYTES: usize = 4 << 10;
/// Largest output or state value a Kafka job may write: librdkafka refuses
/// records over `message.max.bytes` (1,000,000), key and headers included.
pub const MAX_KAFKA_VALUE_BYTES: u32 = 900_000;

/// The longest prefix of `text` of at most `max` bytes that ends on a
/// character boundary.
fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Delivery reports: the first failure, and how far each changelog
/// partition was written (its restore checkpoint).
pub struct DeliveryTracker {
    changelog: String,
    deliveries: Mutex<Deliveries>,
}

#[derive(Default)]
struct Deliveries {
    first_error: Option<String>,
    changelog_next: HashMap<i32, i64>,
}

impl DeliveryTracker {
    /// A tracker noting delivered offsets of topic `changelog`.
    pub fn new(changelog: String) -> DeliveryTracker {
        DeliveryTracker { changelog, deliveries: Mutex::default() }
    }

    fn take_error(&self) -> Option<String> {
        self.deliveries.lock().expect("delivery lock").first_error.take()
    }

    fn changelog_next(&self, partition: i32) -> Option<i64> {
        self.deliveries.lock().expect("delivery lock").changelog_next.get(&partition).copied()
    }
}

impl ClientContext for DeliveryTracker {
    fn error(&self, error: KafkaError, reason: &str) {
        super::log_client_error(error, reason);
    }
}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let mut deliveries = self.deliveries.lock().expect("delivery lock");
        match result {
            Ok(record) if record.topic() == self.changelog => {
                let next = deliveries.changelog_next.entry(record.partition()).or_insert(0);
                *next = (*next).max(record.offset() + 1);
            }
            Ok(_) => {}
            Err((err, record)) => {
                deliveries.first_error.get_or_insert_with(|| format!("sending to `{}` failed: {err}", record.topic()));
            }
        }
    }
}

/// How long each poll of a [`JobProducer`]'s delivery thread lasts, and so
/// the longest that dropping the producer waits for the thread to end.
const DELIVERY_POLL: Duration = Duration::from_millis(10);

/// The job's producer, with a thread of its own serving delivery reports.
/// rdkafka's `ThreadedProducer` does the same, but polls in steps of
/// 100 ms, and dropping it waits for the step to end: 50 ms on average at
/// every session end, restarts and rebalances included.
pub struct JobProducer {
    producer: Arc<BaseProducer<DeliveryTracker>>,
    stop: Arc<AtomicBool>,
    deliveries: Option<std::thread::JoinHandle<()>>,
}

impl FromClientConfigAndContext<DeliveryTracker> for JobProducer {
    fn from_config_and_context(config: &ClientConfig, tracker: DeliveryTracker) -> KafkaResult<JobProducer> {
        let producer: Arc<BaseProducer<DeliveryTracker>> = Arc::new(config.create_with_context(tracker)?);
        let stop = Arc::new(AtomicBool::new(false));
        let deliveries = {
            let (producer, stop) = (producer.clone(), stop.clone());
            std::thread::Builder::new()
                .name("tally-deliveries".to_string())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        producer.poll(DELIVERY_POLL);
                    }
                })
                .map_err(|err| KafkaError::ClientCreation(format!("cannot start the delivery report thread: {err}")))?
        };
        Ok(JobProducer { producer, stop, deliveries: Some(deliveries) })
    }
}

impl std::ops::Deref for JobProducer {
    type Target = BaseProducer<DeliveryTracker>;

    fn deref(&self) -> &Self::Target {
        &self.producer
    }
}

impl Drop for JobProducer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(deliveries) = self.deliveries.take() {
            let _ = deliveries.join();
        }
    }
}

/// Names and settings the committer needs to address records.
pub struct Addresses {
    /// Job name (first part of idempotency keys).
    pub job: String,
    /// Input topics, by index.
    pub inputs: Vec<String>,
    /// Output topics, by output index.
    pub outputs: Vec<String>,
    /// Dead-letter topic.
    pub dead_letter: String,
    /// Changelog topic.
    pub changelog: String,
}

/// A transaction whose records are sent, waiting for its Kafka commit
/// ([`KafkaCommitter::commit_sent`]).
pub struct SentTransaction {
    changes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    offsets: TopicPartitionList,
    /// The consumer group's metadata, under `exactly_once`.
    group: Option<ConsumerGroupMetadata>,
    meta: Vec<(Vec<u8>, Vec<u8>)>,
    touched: BTreeSet<i32>,
}

/// Sends and commits a Kafka job's transactions.
pub struct KafkaCommitter {
    producer: Arc<JobProducer>,
    guarantee: Guarantee,
    addresses: Addresses,
    store: Arc<dyn StateStore>,
    /// Whether a Kafka transaction is open; shared with the rebalance
    /// handler, which aborts it before partitions are given up.
    open: Arc<AtomicBool>,
    timeout: Duration,
}

/// A failed commit or send.
#[derive(Debug, thiserror::Error)]
pub enum KafkaCommitError {
    /// Kafka refused or failed; [`classify`] says what to do.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A record could not be delivered (`at_least_once`).
    #[error("{0}")]
    Delivery(String),
    /// The Kafka transaction committed but RocksDB could not be written:
    /// the state is behind the log, and restoring catches it up.
    #[error(transparent)]
    State(#[from] StateError),
}

/// What to do after a failed Kafka operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Abort the transaction, drop the overlay, rewind to the committed
    /// offsets, and go on.
    Abort,
    /// Drop the producer and the consumer, rejoin, restore: fenced, fatal,
    /// or a commit whose outcome is unknown.
    Restart,
}

/// Classifies a Kafka error of a transactional operation.
pub fn classify(err: &KafkaError) -> Recovery {
    match err {
        KafkaError::Transaction(err) if err.txn_requires_abort() && !err.is_fatal() => Recovery::Abort,
        _ => Recovery::Restart,
    }
}

impl KafkaCommitter {
    /// A committer sending with `producer` (already `init_transactions`ed
    /// under `exactly_once`) and applying state to `store`.
    pub fn new(
        producer: Arc<JobProducer>,
        guarantee: Guarantee,
        addresses: Addresses,
        store: Arc<dyn StateStore>,
        open: Arc<AtomicBool>,
        timeout: Duration,
    ) -> KafkaCommitter {
        KafkaCommitter { producer, guarantee, addresses, store, open, timeout }
    }

    fn ensure_open(&self) -> Result<(), KafkaError> {
        if self.guarantee == Guarantee::ExactlyOnce && !self.open.load(Ordering::SeqCst) {
            self.producer.begin_transaction()?;
            self.open.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Sends the transaction's outputs and dead letters so far (they become
    /// visible only when the transaction commits).
    pub fn send_outputs(&self, txn: &mut Transaction) -> Result<(), KafkaError> {
        if txn.outputs.is_empty() && txn.dead_letters.is_empty() {
            return Ok(());
        }
        self.ensure_open()?;
        let digest = &txn.plugin_digest;
        for output in txn.outputs.drain(..) {
            let headers = self.lineage(output.source, output.sequence, digest);
            let topic = &self.addresses.outputs[output.output];
            let mut record = BaseRecord::<[u8], [u8]>::to(topic).payload(&output.value[..]).headers(headers);
            if let Some(key) = &output.key {
                record = record.key(&key[..]);
            }
            self.send(record)?;
        }
        for dead in txn.dead_letters.drain(..) {
            // A record near the broker's size limit plus our headers would
            // be refused, and the job would retry it forever: keep its
            // start, and say how long it was.
            let reason = truncate_utf8(&dead.reason, MAX_REASON_BYTES);
            let mut headers = self.lineage(dead.source, 0, digest).insert(Header { key: HEADER_REASON, value: Some(reason) });
            let mut payload = &dead.record[..];
            let original_length = payload.len().to_string();
            if payload.len() > MAX_DEAD_LETTER_BYTES {
                payload = &payload[..MAX_DEAD_LETTER_BYTES];
                headers = headers.insert(Header { key: HEADER_TRUNCATED_FROM, value: Some(original_length.as_str()) });
            }
            let record = BaseRecord::<[u8], [u8]>::to(&self.addresses.dead_letter).payload(payload).headers(headers);
            self.send(record)?;
        }
        Ok(())
    }

    fn lineage(&self, source: SourcePosition, sequence: u32, plugin_digest: &str) -> OwnedHeaders {
        let (topic, partition) = split_source_id(source.partition);
        let topic = &self.addresses.inputs[topic];
        let mut partition_text = itoa::Buffer::new();
        let partition_text = partition_text.format(partition);
        let mut offset_text = itoa::Buffer::new();
        let offset_text = offset_text.format(source.offset);
        let mut sequence_text = itoa::Buffer::new();
        let sequence_text = sequence_text.format(sequence);
        // `<job>/<topic>/<partition>/<offset>/<n>`, built without `format!`:
        // this runs once per output record.
        let mut key = String::with_capacity(self.addresses.job.len() + topic.len() + 40);
        for part in [self.addresses.job.as_str(), "/", topic, "/", partition_text, "/", offset_text, "/", sequence_text] {
            key.push_str(part);
        }
        OwnedHeaders::new_with_capacity(6)
            .insert(Header { key: HEADER_SOURCE_TOPIC, value: Some(topic.as_str()) })
            .insert(Header { key: HEADER_SOURCE_PARTITION, value: Some(partition_text) })
            .insert(Header { key: HEADER_SOURCE_OFFSET, value: Some(offset_text) })
            .insert(Header { key: HEADER_PLUGIN, value: Some(plugin_digest) })
            .insert(Header { key: HEADER_IDEMPOTENCY_KEY, value: Some(key.as_str()) })
    }

    /// Sends one record, waiting while the producer's queue is full.
    fn send(&self, mut record: BaseRecord<'_, [u8], [u8]>) -> Result<(), KafkaError> {
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((err, _)) => return Err(err),
            }
        }
    }

    /// First half of a commit, on the job loop: sends the transaction's
    /// outputs (those not sent with [`KafkaCommitter::send_outputs`] yet),
    /// its changelog records and its input positions' markers, and moves
    /// its state changes to the overlay's committing layer, so the next
    /// transaction can run while [`KafkaCommitter::commit_sent`] commits this
    /// one. `positions`: next offset per source id. `None` if there is
    /// nothing to commit.
    pub fn send_transaction<C: ConsumerContext>(
        &self,
        txn: &mut Transaction,
        positions: &BTreeMap<u32, i64>,
        consumer: &BaseConsumer<C>,
    ) -> Result<Option<SentTransaction>, KafkaCommitError> {
        self.send_outputs(txn)?;
        if txn.overlay.is_empty() && positions.is_empty() && !self.open.load(Ordering::SeqCst) {
            return Ok(None);
        }
        self.ensure_open()?;
        let changes = txn.begin_commit();
        // Partitions whose changelog this commit writes: their restore
        // checkpoints move with it.
        let mut touched = BTreeSet::new();
        for (key, value) in &changes {
            // Every key a Kafka job writes has its namespace (the
            // transaction adds it): the fallback to partition 0 is never taken.
            let (partition, user_key) = split_namespaced(key).unwrap_or((0, key));
            touched.insert(partition);
            let record_key = ChangelogKey::State(user_key).to_bytes();
            let mut record = BaseRecord::<[u8], [u8]>::to(&self.addresses.changelog).partition(partition).key(&record_key[..]);
            if let Some(value) = value {
                record = record.payload(&value[..]);
            }
            self.send(record)?;
        }
        let mut offsets = TopicPartitionList::new();
        let mut meta = Vec::new();
        for (&source, &next) in positions {
            let (topic, partition) = split_source_id(source);
            touched.insert(partition);
            let topic = &self.addresses.inputs[topic];
            let next_text = next.to_string();
            let marker_key = ChangelogKey::Offset(topic).to_bytes();
            let marker =
                BaseRecord::<[u8], [u8]>::to(&self.addresses.changelog).partition(partition).key(&marker_key[..]).payload(next_text.as_bytes());
            self.send(marker)?;
            offsets.add_partition_offset(topic, partition, Offset::Offset(next))?;
            meta.push((included_key(topic, partition), next_text.into_bytes()));
        }
        let group = match self.guarantee {
            Guarantee::ExactlyOnce => Some(consumer.group_metadata().ok_or(KafkaError::Global(RDKafkaErrorCode::InvalidGroupId))?),
            Guarantee::AtLeastOnce => None,
        };
        Ok(Some(SentTransaction { changes, offsets, group, meta, touched }))
    }

    /// Second half of a commit, on any thread: commits `sent` as one Kafka
    /// transaction with its input offsets (`at_least_once`: waits for its
    /// records, then commits the offsets), then applies its state to
    /// RocksDB. The producer must not be used for anything else meanwhile.
    /// On success the caller calls [`Transaction::commit_finished`].
    pub fn commit_sent<C: ConsumerContext>(&self, sent: SentTransaction, consumer: &BaseConsumer<C>) -> Result<(), KafkaCommitError> {
        let SentTransaction { changes, offsets, group, mut meta, touched } = sent;
        match self.guarantee {
            Guarantee::ExactlyOnce => {
                let group = group.ok_or(KafkaError::Global(RDKafkaErrorCode::InvalidGroupId))?;
                if offsets.count() > 0 {
                    self.producer.send_offsets_to_transaction(&offsets, &group, self.timeout)?;
                }
                self.wait_delivered()?;
                self.producer.commit_transaction(self.timeout)?;
                self.open.store(false, Ordering::SeqCst);
            }
            Guarantee::AtLeastOnce => {
                self.wait_delivered()?;
                if let Some(error) = self.producer.context().take_error() {
                    return Err(KafkaCommitError::Delivery(error));
                }
                if offsets.count() > 0 {
                    consumer.commit(&offsets, CommitMode::Sync)?;
                }
            }
        }
        // The log has it: now RocksDB may (invariant 2).
        for partition in touched {
            if let Some(next) = self.producer.context().changelog_next(partition) {
                meta.push((checkpoint_key(partition), next.to_string().into_bytes()));
            }
        }
        self.store.commit(StoreCommit { state: changes, meta })?;
        Ok(())
    }

    /// Commits the transaction whole: [`KafkaCommitter::send_transaction`],
    /// then [`KafkaCommitter::commit_sent`], on this thread. After an error
    /// the caller aborts, as after any failed commit ([`Transaction::abort`]
    /// drops the committing changes too).
    pub fn commit<C: ConsumerContext>(
        &self,
        txn: &mut Transaction,
        positions: &BTreeMap<u32, i64>,
        consumer: &BaseConsumer<C>,
    ) -> Result<(), KafkaCommitError> {
        if let Some(sent) = self.send_transaction(txn, positions, consumer)? {
            self.commit_sent(sent, consumer)?;
            txn.commit_finished();
        }
        Ok(())
    }

    /// Waits until every record sent is acknowledged (or failed).
    ///
    /// rdkafka's `flush` (which `commit_transaction` also calls) polls in
    /// steps of 100 ms while the delivery thread serves the reports, so
    /// every commit took at least 100 ms and held the job loop that long;
    /// waiting here first makes its flush a no-op.
    fn wait_delivered(&self) -> Result<(), KafkaError> {
        let deadline = std::time::Instant::now() + self.timeout;
        while self.producer.in_flight_count() > 0 {
            if std::time::Instant::now() >= deadline {
                return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// Aborts the open Kafka transaction, if any; the caller drops the
    /// overlay and rewinds the consumer.
    pub fn abort(&self) -> Result<(), KafkaError> {
        if self.guarantee == Guarantee::ExactlyOnce && self.open.swap(false, Ordering::SeqCst) {
            self.producer.abort_transaction(self.timeout)?;
        }
        Ok(())
    }
}

/// A session's committer and consumer: the two phases of a Kafka commit.
/// [`TwoPhaseCommitter::prepare`] sends the transaction's records and
/// offsets ([`KafkaCommitter::send_transaction`], on the job loop);
/// [`TwoPhaseCommitter::commit`] commits the Kafka transaction and then
/// applies the state to RocksDB ([`KafkaCommitter::commit_sent`], on the
/// session's commit thread, while the next transaction runs).
pub struct KafkaTransactions<'s, C: ConsumerContext> {
    /// The producer's side.
    pub committer: &'s KafkaCommitter,
    /// The consumer whose group the offsets are committed for.
    pub consumer: &'s BaseConsumer<C>,
}

impl<C: ConsumerContext> Clone for KafkaTransactions<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C: ConsumerContext> Copy for KafkaTransactions<'_, C> {}

impl<C: ConsumerContext> TwoPhaseCommitter for KafkaTransactions<'_, C> {
    type Positions = BTreeMap<u32, i64>;
    /// `None` when there was nothing to commit.
    type Prepared = Option<SentTransaction>;
    type Error = KafkaCommitError;

    fn prepare(&mut self, txn: &mut Transaction, positions: &BTreeMap<u32, i64>) -> Result<Option<SentTransaction>, KafkaCommitError> {
        self.committer.send_transaction(txn, positions, self.consumer)
    }

    fn commit(&self, prepared: Option<SentTransaction>) -> Result<(), KafkaCommitError> {
        match prepared {
            None => Ok(()),
            Some(sent) => self.committer.commit_sent(sent, self.consumer),
        }
    }

    fn abort(&mut self) -> Result<(), KafkaCommitError> {
        Ok(self.committer.abort()?)
    }
}
