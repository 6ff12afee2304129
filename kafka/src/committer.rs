//! Kafka mode's committer: a commit in two phases, in one vocabulary with
//! the core's [`TwoPhaseCommitter`]. `prepare` sends the rest of a
//! transaction's records through the record collector (outputs, dead
//! letters, changelog records, input positions) and moves its state changes
//! to the overlay's committing layer; `commit`, the commit point, commits
//! the Kafka transaction with the input offsets through the transaction
//! owner and only then applies the state to RocksDB (invariant 2);
//! `abort` aborts the Kafka transaction. Under `at_least_once` the commit
//! waits for the records, then commits the offsets.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

pub use super::collector::{Addresses, RecordCollector};
use super::keys::{checkpoint_key, included_key, split_source_id};
pub use super::producer::{DeliveryTracker, JobProducer};
pub use super::transaction::{Recovery, TransactionError, TransactionOwner, classify};
use crate::config::Guarantee;
use tally_core::commit::TwoPhaseCommitter;
use tally_core::state::{StateError, StateStore, StoreCommit};
use tally_core::transaction::Transaction;

/// Largest output or state value a Kafka job may write: librdkafka refuses
/// records over `message.max.bytes` (1,000,000), key and headers included.
pub const MAX_KAFKA_VALUE_BYTES: u32 = 900_000;

/// A transaction whose records are sent, waiting for its commit point
/// ([`KafkaCommitter::commit`]).
pub struct Prepared {
    changes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    offsets: TopicPartitionList,
    /// The consumer group's metadata, under `exactly_once`.
    group: Option<ConsumerGroupMetadata>,
    meta: Vec<(Vec<u8>, Vec<u8>)>,
    touched: BTreeSet<i32>,
}

/// Commits a Kafka job's transactions.
pub struct KafkaCommitter {
    owner: Arc<TransactionOwner>,
    collector: RecordCollector,
    store: Arc<dyn StateStore>,
}

/// A failed phase of a commit.
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

impl From<TransactionError> for KafkaCommitError {
    fn from(err: TransactionError) -> KafkaCommitError {
        match err {
            TransactionError::Kafka(err) => KafkaCommitError::Kafka(err),
            TransactionError::Delivery(why) => KafkaCommitError::Delivery(why),
        }
    }
}

impl KafkaCommitter {
    /// A committer whose records `collector` sends, whose transactions
    /// `owner` commits (it must have fenced earlier producers), and whose
    /// state goes to `store` once committed.
    pub fn new(
        owner: Arc<TransactionOwner>,
        collector: RecordCollector,
        store: Arc<dyn StateStore>,
    ) -> KafkaCommitter {
        KafkaCommitter { owner, collector, store }
    }

    /// The record collector, for outputs sent before the commit.
    pub fn collector(&self) -> &RecordCollector {
        &self.collector
    }

    /// Phase one, on the job loop: sends the transaction's outputs (those
    /// not sent early), its changelog records and its input positions'
    /// markers, and moves its state changes to the overlay's committing
    /// layer, so the next transaction can run while [`KafkaCommitter::commit`]
    /// commits this one. `positions`: next offset per source id. `None`
    /// if there is nothing to commit.
    pub fn prepare<C: ConsumerContext>(
        &self,
        txn: &mut Transaction,
        positions: &BTreeMap<u32, i64>,
        consumer: &BaseConsumer<C>,
    ) -> Result<Option<Prepared>, KafkaCommitError> {
        self.collector.send_outputs(txn)?;
        if txn.overlay.is_empty() && positions.is_empty() && !self.owner.is_open() {
            return Ok(None);
        }
        self.owner.begin_if_closed()?;
        let changes = txn.prepare();
        // Partitions whose changelog this commit writes: their restore
        // checkpoints move with it.
        let mut touched = self.collector.send_changes(&changes)?;
        let mut offsets = TopicPartitionList::new();
        let mut meta = Vec::new();
        for (&source, &next) in positions {
            let (topic, partition) = split_source_id(source);
            touched.insert(partition);
            self.collector.send_position(topic, partition, next)?;
            let topic = &self.collector.addresses().inputs[topic];
            offsets.add_partition_offset(topic, partition, Offset::Offset(next))?;
            meta.push((included_key(topic, partition), next.to_string().into_bytes()));
        }
        let group = match self.owner.guarantee() {
            Guarantee::ExactlyOnce => Some(
                consumer
                    .group_metadata()
                    .ok_or(KafkaError::Global(RDKafkaErrorCode::InvalidGroupId))?,
            ),
            Guarantee::AtLeastOnce => None,
        };
        Ok(Some(Prepared { changes, offsets, group, meta, touched }))
    }

    /// Phase two, the commit point, on any thread: commits `prepared` with
    /// its input offsets through the transaction owner, then applies its
    /// state to RocksDB with the changelog checkpoints. The producer must
    /// not be used for anything else meanwhile. On success the caller calls
    /// [`Transaction::prepared_took_effect`].
    pub fn commit<C: ConsumerContext>(
        &self,
        prepared: Prepared,
        consumer: &BaseConsumer<C>,
    ) -> Result<(), KafkaCommitError> {
        let Prepared { changes, offsets, group, mut meta, touched } = prepared;
        self.owner.commit(&offsets, group.as_ref(), consumer)?;
        // The log has it: now RocksDB may (invariant 2).
        for partition in touched {
            if let Some(next) = self.owner.producer().context().changelog_next(partition) {
                meta.push((checkpoint_key(partition), next.to_string().into_bytes()));
            }
        }
        let applying = std::time::Instant::now();
        self.store.commit(StoreCommit { state: changes, meta })?;
        tracing::debug!(store_us = applying.elapsed().as_micros() as u64, "state applied");
        Ok(())
    }

    /// Aborts the open Kafka transaction, if any; the caller drops the
    /// overlay and rewinds the consumer.
    pub fn abort(&self) -> Result<(), KafkaError> {
        self.owner.abort().map(drop)
    }
}

/// A session's committer and consumer, as the core's two-phase committer:
/// [`KafkaCommitter::prepare`] on the job loop, [`KafkaCommitter::commit`]
/// on the session's commit thread while the next transaction runs,
/// [`KafkaCommitter::abort`].
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
    type Prepared = Option<Prepared>;
    type Error = KafkaCommitError;

    fn prepare(
        &mut self,
        txn: &mut Transaction,
        positions: &BTreeMap<u32, i64>,
    ) -> Result<Option<Prepared>, KafkaCommitError> {
        self.committer.prepare(txn, positions, self.consumer)
    }

    fn commit(&self, prepared: Option<Prepared>) -> Result<(), KafkaCommitError> {
        match prepared {
            None => Ok(()),
            Some(prepared) => self.committer.commit(prepared, self.consumer),
        }
    }

    fn abort(&mut self) -> Result<(), KafkaCommitError> {
        Ok(self.committer.abort()?)
    }
}
