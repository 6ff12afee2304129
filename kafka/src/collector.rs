//! The record collector: sends a transaction's records into the open
//! Kafka transaction — outputs and dead letters, each with its lineage
//! headers and idempotency key (`docs/formats.md`), and the changelog
//! records of its state changes and input positions. It only sends,
//! through the [`TransactionOwner`]; the committer decides when a
//! transaction commits.

use std::collections::BTreeSet;
use std::sync::Arc;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::BaseRecord;

use super::keys::{ChangelogKey, split_namespaced, split_source_id};
use super::transaction::TransactionOwner;
use tally_core::text;
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
/// Names the collector addresses records by.
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
    /// A period job's watermark topic.
    pub watermarks: Option<String>,
}

/// Sends a job's records through its transaction owner.
pub struct RecordCollector {
    owner: Arc<TransactionOwner>,
    addresses: Addresses,
}

impl RecordCollector {
    /// A collector sending through `owner` to `addresses`.
    pub fn new(owner: Arc<TransactionOwner>, addresses: Addresses) -> RecordCollector {
        RecordCollector { owner, addresses }
    }

    /// The topics it sends to.
    pub fn addresses(&self) -> &Addresses {
        &self.addresses
    }

    /// Sends the transaction's outputs and dead letters so far (they become
    /// visible only when the transaction commits).
    pub fn send_outputs(&self, txn: &mut Transaction) -> Result<(), KafkaError> {
        if txn.outputs().is_empty() && txn.dead_letters().is_empty() {
            return Ok(());
        }
        let digest = &txn.plugin_digest;
        for output in txn.outputs() {
            let headers = match &output.fact {
                None => self.lineage(output.source, output.sequence, digest),
                Some(fact) => self.fact_lineage(output.source, fact, digest),
            };
            let topic = &self.addresses.outputs[output.output];
            let mut record =
                BaseRecord::<[u8], [u8]>::to(topic).payload(&output.value[..]).headers(headers);
            if let Some(key) = &output.key {
                record = record.key(&key[..]);
            }
            self.owner.send(record)?;
        }
        for dead in txn.dead_letters() {
            // A record near the broker's size limit plus our headers would
            // be refused, and the job would retry it forever: keep its
            // start, and say how long it was.
            // Reasons are cut where they are made (tally_core::text): this
            // bound, room for that cut's note included, only backs it up.
            let reason = text::prefix(&dead.reason, 2 * text::MAX_REASON_BYTES);
            let mut headers = self
                .lineage(dead.source, 0, digest)
                .insert(Header { key: HEADER_REASON, value: Some(reason) });
            let mut payload = &dead.record[..];
            let original_length = payload.len().to_string();
            if payload.len() > MAX_DEAD_LETTER_BYTES {
                payload = &payload[..MAX_DEAD_LETTER_BYTES];
                headers = headers.insert(Header {
                    key: HEADER_TRUNCATED_FROM,
                    value: Some(original_length.as_str()),
                });
            }
            let record = BaseRecord::<[u8], [u8]>::to(&self.addresses.dead_letter)
                .payload(payload)
                .headers(headers);
            self.owner.send(record)?;
        }
        txn.outputs_sent();
        Ok(())
    }

    /// Sends the changelog records of state `changes` (a delete as a
    /// tombstone), each to its namespace's partition; returns the
    /// partitions written.
    pub fn send_changes(
        &self,
        changes: &[(Vec<u8>, Option<Vec<u8>>)],
    ) -> Result<BTreeSet<i32>, KafkaError> {
        let mut touched = BTreeSet::new();
        for (key, value) in changes {
            // Every key a Kafka job writes has its namespace (the
            // transaction adds it): the fallback to partition 0 is never taken.
            let (partition, user_key) = split_namespaced(key).unwrap_or((0, key));
            touched.insert(partition);
            let record_key = ChangelogKey::State(user_key).to_bytes();
            let mut record = BaseRecord::<[u8], [u8]>::to(&self.addresses.changelog)
                .partition(partition)
                .key(&record_key[..]);
            if let Some(value) = value {
                record = record.payload(&value[..]);
            }
            self.owner.send(record)?;
        }
        Ok(touched)
    }

    /// Sends partition `partition`'s own watermark `at` to the job's
    /// watermark topic, for the job's other instances (a job without
    /// periods has none: nothing is sent).
    pub fn send_watermark(&self, partition: u32, at: jiff::Timestamp) -> Result<(), KafkaError> {
        match &self.addresses.watermarks {
            Some(topic) => crate::watermarks::send(&self.owner, topic, partition, at),
            None => Ok(()),
        }
    }

    /// Sends the changelog's marker of how far input `topic` (by index)
    /// partition `partition` is included: `next`, its next offset.
    pub fn send_position(&self, topic: usize, partition: i32, next: i64) -> Result<(), KafkaError> {
        let next_text = next.to_string();
        let marker_key = ChangelogKey::Offset(&self.addresses.inputs[topic]).to_bytes();
        let marker = BaseRecord::<[u8], [u8]>::to(&self.addresses.changelog)
            .partition(partition)
            .key(&marker_key[..])
            .payload(next_text.as_bytes());
        self.owner.send(marker)
    }

    /// The lineage of a record that states a fact (a period's FINAL or
    /// ADJUSTMENT): its idempotency key is `<job>/<fact>`.
    fn fact_lineage(
        &self,
        source: SourcePosition,
        fact: &str,
        plugin_digest: &str,
    ) -> OwnedHeaders {
        let (topic, partition) = split_source_id(source.partition);
        let topic = &self.addresses.inputs[topic];
        let partition_text = partition.to_string();
        let offset_text = source.offset.to_string();
        let key = format!("{}/{fact}", self.addresses.job);
        OwnedHeaders::new_with_capacity(6)
            .insert(Header { key: HEADER_SOURCE_TOPIC, value: Some(topic.as_str()) })
            .insert(Header { key: HEADER_SOURCE_PARTITION, value: Some(partition_text.as_str()) })
            .insert(Header { key: HEADER_SOURCE_OFFSET, value: Some(offset_text.as_str()) })
            .insert(Header { key: HEADER_PLUGIN, value: Some(plugin_digest) })
            .insert(Header { key: HEADER_IDEMPOTENCY_KEY, value: Some(key.as_str()) })
    }

    pub(super) fn lineage(
        &self,
        source: SourcePosition,
        sequence: u32,
        plugin_digest: &str,
    ) -> OwnedHeaders {
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
        for part in [
            self.addresses.job.as_str(),
            "/",
            topic,
            "/",
            partition_text,
            "/",
            offset_text,
            "/",
            sequence_text,
        ] {
            key.push_str(part);
        }
        OwnedHeaders::new_with_capacity(6)
            .insert(Header { key: HEADER_SOURCE_TOPIC, value: Some(topic.as_str()) })
            .insert(Header { key: HEADER_SOURCE_PARTITION, value: Some(partition_text) })
            .insert(Header { key: HEADER_SOURCE_OFFSET, value: Some(offset_text) })
            .insert(Header { key: HEADER_PLUGIN, value: Some(plugin_digest) })
            .insert(Header { key: HEADER_IDEMPOTENCY_KEY, value: Some(key.as_str()) })
    }
}
