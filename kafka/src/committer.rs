//! Kafka mode's committer: opens the Kafka transaction, sends a
//! transaction's changelog records and input offsets (its outputs go
//! through the record collector, [`super::collector`]), commits them as one
//! Kafka transaction (or, `at_least_once`, flushes then commits the
//! offsets), and only then applies the state to RocksDB.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, ConsumerGroupMetadata,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use super::keys::{ChangelogKey, checkpoint_key, included_key, split_namespaced, split_source_id};
pub use super::producer::{DeliveryTracker, JobProducer, Recovery, classify};
use crate::config::Guarantee;
use tally_core::commit::TwoPhaseCommitter;
use tally_core::state::{StateError, StateStore, StoreCommit};
use tally_core::transaction::Transaction;

/// Largest output or state value a Kafka job may write: librdkafka refuses
/// records over `message.max.bytes` (1,000,000), key and headers included.
pub const MAX_KAFKA_VALUE_BYTES: u32 = 900_000;

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
    pub(super) producer: Arc<JobProducer>,
    guarantee: Guarantee,
    pub(super) addresses: Addresses,
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

    pub(super) fn ensure_open(&self) -> Result<(), KafkaError> {
        if self.guarantee == Guarantee::ExactlyOnce && !self.open.load(Ordering::SeqCst) {
            self.producer.begin_transaction()?;
            self.open.store(true, Ordering::SeqCst);
        }
        Ok(())
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
            let mut record = BaseRecord::<[u8], [u8]>::to(&self.addresses.changelog)
                .partition(partition)
                .key(&record_key[..]);
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
            let marker = BaseRecord::<[u8], [u8]>::to(&self.addresses.changelog)
                .partition(partition)
                .key(&marker_key[..])
                .payload(next_text.as_bytes());
            self.send(marker)?;
            offsets.add_partition_offset(topic, partition, Offset::Offset(next))?;
            meta.push((included_key(topic, partition), next_text.into_bytes()));
        }
        let group = match self.guarantee {
            Guarantee::ExactlyOnce => Some(
                consumer
                    .group_metadata()
                    .ok_or(KafkaError::Global(RDKafkaErrorCode::InvalidGroupId))?,
            ),
            Guarantee::AtLeastOnce => None,
        };
        Ok(Some(SentTransaction { changes, offsets, group, meta, touched }))
    }

    /// Second half of a commit, on any thread: commits `sent` as one Kafka
    /// transaction with its input offsets (`at_least_once`: waits for its
    /// records, then commits the offsets), then applies its state to
    /// RocksDB. The producer must not be used for anything else meanwhile.
    /// On success the caller calls [`Transaction::commit_finished`].
    pub fn commit_sent<C: ConsumerContext>(
        &self,
        sent: SentTransaction,
        consumer: &BaseConsumer<C>,
    ) -> Result<(), KafkaCommitError> {
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

    fn prepare(
        &mut self,
        txn: &mut Transaction,
        positions: &BTreeMap<u32, i64>,
    ) -> Result<Option<SentTransaction>, KafkaCommitError> {
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
