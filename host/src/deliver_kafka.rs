//! A Kafka job's side of `tally deliver`: its output topic read
//! `read_committed` as a delivery [`Source`] (records of aborted or open
//! transactions are never delivered), and the delivery ledger mirrored
//! into a compacted topic (a [`Mirror`]), so a deliverer on a new machine
//! resumes where the last one stopped. See `docs/delivery.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer as _, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tally_deliver::{KafkaRecord, Line, Mirror, Payload, Positions, Source, SourceError};
use tally_kafka::{HEADER_IDEMPOTENCY_KEY, QuietEof};

/// How long a metadata, flush or mirror read may take.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);
/// The first poll of a read waits this long for a record.
const FIRST_POLL: Duration = Duration::from_millis(10);
/// How often a read looks for partitions added to the topic since.
const PARTITIONS_CHECK: Duration = Duration::from_secs(5);
/// Longest that look may take; the read goes on without it when it fails.
const PARTITIONS_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The default compacted topic of a delivery's ledger.
pub fn default_ledger_topic(job: &str, output: &str) -> String {
    format!("tally-{job}-{output}-delivery-ledger")
}

/// A Kafka job's output topic, read `read_committed` from positions.
pub struct KafkaOutput {
    consumer: BaseConsumer<QuietEof>,
    topic: String,
    partitions: BTreeSet<i32>,
    /// Partitions whose end the last read reached.
    at_end: BTreeSet<i32>,
    /// Where the delivery started, for partitions found later.
    positions: Positions,
    /// When the topic's partitions were last looked up.
    checked: Instant,
}

impl KafkaOutput {
    /// Reads `topic` with a consumer of `base` (the job's brokers and
    /// client settings).
    pub fn new(
        mut base: ClientConfig,
        topic: &str,
        group: &str,
    ) -> Result<KafkaOutput, SourceError> {
        base.set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .set("auto.offset.reset", "earliest");
        let consumer = base.create_with_context(QuietEof).map_err(|err| read_error(topic, err))?;
        Ok(KafkaOutput {
            consumer,
            topic: topic.to_string(),
            partitions: BTreeSet::new(),
            at_end: BTreeSet::new(),
            positions: Positions::default(),
            checked: Instant::now(),
        })
    }

    /// The topic's partitions now (none when it does not exist).
    fn topic_partitions(&self, timeout: Duration) -> Result<BTreeSet<i32>, KafkaError> {
        let metadata = self.consumer.fetch_metadata(Some(&self.topic), timeout)?;
        Ok(metadata
            .topics()
            .iter()
            .filter(|topic| topic.name() == self.topic && topic.error().is_none())
            .flat_map(|topic| topic.partitions().iter().map(|partition| partition.id()))
            .collect())
    }

    /// Each partition of `partitions` where the delivery starts: its
    /// position, or the partition's start.
    fn assignment(&self, partitions: &BTreeSet<i32>) -> Result<TopicPartitionList, SourceError> {
        let mut assignment = TopicPartitionList::new();
        for &partition in partitions {
            let offset = match self.positions.get(&(partition as u32)) {
                Some(&offset) => Offset::Offset(offset as i64),
                None => Offset::Beginning,
            };
            assignment
                .add_partition_offset(&self.topic, partition, offset)
                .map_err(|err| read_error(&self.topic, err))?;
        }
        Ok(assignment)
    }

    /// Starts reading partitions added to the topic since the last look
    /// (an operator may add some while the job runs; their records would
    /// never be delivered otherwise). A failed look is tried again later.
    fn read_new_partitions(&mut self) -> Result<(), SourceError> {
        self.checked = Instant::now();
        let now = match self.topic_partitions(PARTITIONS_CHECK_TIMEOUT) {
            Ok(now) => now,
            Err(err) => {
                tracing::warn!(topic = %self.topic, error = %err, "looking for partitions added to the job's output");
                return Ok(());
            }
        };
        let added: BTreeSet<i32> = now.difference(&self.partitions).copied().collect();
        if added.is_empty() {
            return Ok(());
        }
        tracing::info!(topic = %self.topic, ?added, "partitions added to the job's output; delivering them too");
        let assignment = self.assignment(&added)?;
        self.consumer
            .incremental_assign(&assignment)
            .map_err(|err| read_error(&self.topic, err))?;
        self.partitions.extend(added);
        Ok(())
    }

    fn record(&self, message: &rdkafka::message::BorrowedMessage<'_>) -> Line {
        let mut record = KafkaRecord {
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec),
            ..KafkaRecord::default()
        };
        if let Some(headers) = message.headers() {
            for header in headers.iter() {
                let value = header.value.map(|value| String::from_utf8_lossy(value).into_owned());
                if header.key == HEADER_IDEMPOTENCY_KEY {
                    record.idempotency_key = value;
                } else if let (Some(name), Some(value)) = (header.key.strip_prefix("tally."), value)
                {
                    record.lineage.insert(name.to_string(), value);
                }
            }
        }
        let offset = message.offset().max(0) as u64;
        Line {
            partition: message.partition().max(0) as u32,
            offset,
            next: offset + 1,
            payload: Payload::Kafka(record),
        }
    }
}

impl Source for KafkaOutput {
    fn start(&mut self, positions: &Positions) -> Result<(), SourceError> {
        let partitions =
            self.topic_partitions(KAFKA_TIMEOUT).map_err(|err| read_error(&self.topic, err))?;
        if partitions.is_empty() {
            return Err(SourceError::Read {
                path: PathBuf::from(&self.topic),
                reason:
                    "the topic does not exist; run the job first (it creates its output topics)"
                        .into(),
            });
        }
        self.positions = positions.clone();
        let assignment = self.assignment(&partitions)?;
        self.consumer.assign(&assignment).map_err(|err| read_error(&self.topic, err))?;
        self.partitions = partitions;
        self.at_end.clear();
        self.checked = Instant::now();
        Ok(())
    }

    fn read(&mut self, max: usize) -> Result<Vec<Line>, SourceError> {
        if self.checked.elapsed() >= PARTITIONS_CHECK {
            self.read_new_partitions()?;
        }
        let mut lines = Vec::new();
        let mut wait = FIRST_POLL;
        while lines.len() < max {
            match self.consumer.poll(wait) {
                None => break,
                Some(Ok(message)) => {
                    self.at_end.remove(&message.partition());
                    lines.push(self.record(&message));
                }
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    self.at_end.insert(partition);
                }
                Some(Err(err)) => {
                    // The client retries on its own; a delivery waits.
                    tracing::warn!(topic = %self.topic, error = %err, "reading the job's output");
                    break;
                }
            }
            wait = Duration::ZERO;
        }
        Ok(lines)
    }

    fn caught_up(&self) -> bool {
        !self.partitions.is_empty() && self.at_end.len() == self.partitions.len()
    }
}

fn read_error(topic: &str, err: KafkaError) -> SourceError {
    SourceError::Read { path: PathBuf::from(topic), reason: err.to_string() }
}

/// The mirror producer's context: it remembers the first write the
/// cluster refused.
#[derive(Default)]
struct MirrorContext {
    failed: Mutex<Option<String>>,
}

impl ClientContext for MirrorContext {
    fn error(&self, error: KafkaError, reason: &str) {
        tally_kafka::log_client_error(error, reason);
    }
}

impl ProducerContext for MirrorContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((err, _)) = result {
            let mut failed = self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            failed.get_or_insert_with(|| err.to_string());
        }
    }
}

/// A delivery ledger's mirror: a compacted topic of one partition, each
/// ledger key's last value. Its producer's delivery reports are served by
/// the sends and flushes themselves (no thread of its own).
pub struct KafkaLedgerMirror {
    producer: BaseProducer<MirrorContext>,
    base: ClientConfig,
    topic: String,
}

impl KafkaLedgerMirror {
    /// The mirror in `topic` (created, compacted, when missing) of a
    /// cluster `base` reaches.
    pub fn open(base: &ClientConfig, topic: &str) -> anyhow::Result<KafkaLedgerMirror> {
        let admin: AdminClient<DefaultClientContext> = base.create()?;
        let new =
            NewTopic::new(topic, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact");
        let options = AdminOptions::new().operation_timeout(Some(KAFKA_TIMEOUT));
        let results = futures_executor::block_on(admin.create_topics([&new], &options))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => {
                    anyhow::bail!("cannot create the delivery ledger's topic `{topic}`: {code}")
                }
            }
        }
        let mut config = base.clone();
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "0")
            .set("message.timeout.ms", "30000");
        let producer = config.create_with_context(MirrorContext::default())?;
        Ok(KafkaLedgerMirror { producer, base: base.clone(), topic: topic.to_string() })
    }

    fn failure(&self) -> Option<String> {
        self.producer
            .context()
            .failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl KafkaLedgerMirror {
    /// Queues `record`, waiting (up to the Kafka timeout) while the
    /// producer's queue is full.
    fn produce(&self, mut record: BaseRecord<'_, [u8], [u8]>) -> Result<(), String> {
        if let Some(failure) = self.failure() {
            return Err(failure);
        }
        let deadline = Instant::now() + KAFKA_TIMEOUT;
        loop {
            match self.producer.send(record) {
                Ok(()) => {
                    self.producer.poll(Duration::ZERO);
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if Instant::now() < deadline =>
                {
                    record = back;
                    self.producer.poll(Duration::from_millis(5));
                }
                Err((err, _)) => return Err(err.to_string()),
            }
        }
    }
}

impl Mirror for KafkaLedgerMirror {
    fn send(&self, key: &[u8], value: &[u8]) -> Result<(), String> {
        self.produce(BaseRecord::to(&self.topic).key(key).payload(value))
    }

    fn delete(&self, key: &[u8]) -> Result<(), String> {
        // No payload: a tombstone, which compaction removes with the key.
        self.produce(BaseRecord::to(&self.topic).key(key))
    }

    fn flush(&self) -> Result<(), String> {
        self.producer.flush(KAFKA_TIMEOUT).map_err(|err| err.to_string())?;
        match self.failure() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    fn load(&self) -> Result<Vec<tally_deliver::ledger::Write>, String> {
        let mut config = self.base.clone();
        config
            .set("group.id", format!("{}-load", self.topic))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false");
        let consumer: BaseConsumer<QuietEof> =
            config.create_with_context(QuietEof).map_err(|err| err.to_string())?;
        let (low, high) = consumer
            .fetch_watermarks(&self.topic, 0, KAFKA_TIMEOUT)
            .map_err(|err| err.to_string())?;
        let mut held = BTreeMap::new();
        if high <= low {
            return Ok(Vec::new());
        }
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(&self.topic, 0, Offset::Beginning)
            .map_err(|err| err.to_string())?;
        consumer.assign(&assignment).map_err(|err| err.to_string())?;
        let mut last_progress = Instant::now();
        loop {
            if last_progress.elapsed() > KAFKA_TIMEOUT {
                return Err(format!(
                    "no record arrived for {} s before its end at offset {high}",
                    KAFKA_TIMEOUT.as_secs()
                ));
            }
            match consumer.poll(Duration::from_millis(100)) {
                None => {}
                Some(Ok(message)) => {
                    last_progress = Instant::now();
                    match (message.key(), message.payload()) {
                        (Some(key), Some(value)) => {
                            held.insert(key.to_vec(), value.to_vec());
                        }
                        // A tombstone: the key was pruned.
                        (Some(key), None) => {
                            held.remove(key);
                        }
                        _ => {}
                    }
                    if message.offset() + 1 >= high {
                        return Ok(held.into_iter().collect());
                    }
                }
                Some(Err(err)) => {
                    tracing::warn!(topic = %self.topic, error = %err, "reading the delivery ledger's mirror")
                }
            }
        }
    }

    fn describe(&self) -> String {
        format!("topic `{}`", self.topic)
    }
}
