//! Watermarks shared across a period job's instances, through the broker:
//! each instance writes its partitions' own watermarks to the job's
//! compacted watermark topic inside the transaction that moved them, and
//! reads the others' back `read_committed`. An idle partition adopts the
//! lowest of them (see `docs/periods.md`), so it never learns a watermark
//! that was not committed with the records that raised it.
//!
//! A record's key is the partition's number and its value the watermark
//! as RFC 3339 text; the topic has one partition, so its compacted length
//! is one record per partition.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::BaseRecord;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::QuietEof;
use super::transaction::TransactionOwner;

/// Most records one look at the topic takes, so a long backlog cannot hold
/// the job loop: the rest are taken at the next look.
const MAX_RECORDS_PER_LOOK: usize = 10_000;

/// The compacted topic of job `job`'s shared watermarks.
pub fn watermark_topic(job: &str) -> String {
    format!("tally-{job}-watermarks")
}

/// Sends partition `partition`'s own watermark `at` into the open
/// transaction (it begins one if none is open).
pub(crate) fn send(
    owner: &TransactionOwner,
    topic: &str,
    partition: u32,
    at: Timestamp,
) -> Result<(), rdkafka::error::KafkaError> {
    let key = partition.to_string();
    let value = at.to_string();
    owner.send(BaseRecord::to(topic).partition(0).key(key.as_bytes()).payload(value.as_bytes()))
}

/// What one instance knows of every partition's committed own watermark.
pub(crate) struct SharedWatermarks {
    consumer: BaseConsumer<QuietEof>,
    known: BTreeMap<u32, Timestamp>,
    /// The job's partitions: a record naming another is passed over, so
    /// what the topic holds cannot grow `known` past them.
    partitions: u32,
    /// Whether the topic was read to its end once: until then the lowest
    /// watermark is not known.
    read_to_end: bool,
}

impl SharedWatermarks {
    /// Reads `topic` from its start with consumer settings `config`, for a
    /// job of `partitions` input partitions.
    pub(crate) fn open(
        mut config: ClientConfig,
        topic: &str,
        partitions: u32,
    ) -> Result<SharedWatermarks, rdkafka::error::KafkaError> {
        super::topics::read_committed_from_start(&mut config);
        let consumer: BaseConsumer<QuietEof> = config.create_with_context(QuietEof)?;
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(topic, 0, Offset::Beginning)?;
        consumer.assign(&assignment)?;
        Ok(SharedWatermarks { consumer, known: BTreeMap::new(), partitions, read_to_end: false })
    }

    /// Takes what arrived since the last look (without waiting), and
    /// returns each partition's latest committed watermark; `None` until
    /// the topic was read to its end once.
    pub(crate) fn look(&mut self) -> Option<&BTreeMap<u32, Timestamp>> {
        for _ in 0..MAX_RECORDS_PER_LOOK {
            let Some(item) = self.consumer.poll(Duration::ZERO) else { break };
            // A client error is logged by the context and retried by
            // librdkafka; a record that does not parse is not Tally's and
            // is passed over.
            let record = match item {
                Ok(record) => record,
                Err(rdkafka::error::KafkaError::PartitionEOF(_)) => {
                    self.read_to_end = true;
                    continue;
                }
                Err(_) => continue,
            };
            use rdkafka::Message as _;
            let partition = record
                .key()
                .and_then(|key| std::str::from_utf8(key).ok())
                .and_then(|key| key.parse::<u32>().ok())
                .filter(|&partition| partition < self.partitions);
            let at = record
                .payload()
                .and_then(|value| std::str::from_utf8(value).ok())
                .and_then(|value| value.parse::<Timestamp>().ok());
            match (partition, at) {
                (Some(partition), Some(at)) => {
                    let known = self.known.entry(partition).or_insert(at);
                    *known = (*known).max(at);
                }
                _ => tracing::warn!(
                    offset = record.offset(),
                    "a record of the watermark topic is not one of the job's partitions and an RFC 3339 time; passed over"
                ),
            }
        }
        self.read_to_end.then_some(&self.known)
    }
}
