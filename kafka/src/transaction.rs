//! The job's transaction owner, in the role of Kafka Streams'
//! `StreamsProducer`: the one place that knows whether a Kafka transaction
//! is open. It begins one with the first record sent into it, commits it
//! with the input offsets, aborts it, and says what a failed call means
//! ([`classify`]). The record collector sends through it, the committer
//! commits through it, and the rebalance handler aborts through it; none of
//! them touches the transaction's state.
//!
//! Under `at_least_once` there is no Kafka transaction: records are sent
//! as they come, and a commit waits for their delivery and then commits
//! the offsets through the consumer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, ConsumerGroupMetadata,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer};

use crate::config::Guarantee;
use crate::producer::JobProducer;

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
        KafkaError::Transaction(err) if err.txn_requires_abort() && !err.is_fatal() => {
            Recovery::Abort
        }
        _ => Recovery::Restart,
    }
}

/// The job's producer and the Kafka transaction it has open, if any.
pub struct TransactionOwner {
    producer: Arc<JobProducer>,
    guarantee: Guarantee,
    /// Whether a Kafka transaction is open (`exactly_once` only). Atomic:
    /// the rebalance handler aborts from inside the consumer's poll, and a
    /// commit finishes on the session's commit thread.
    open: AtomicBool,
    /// How long a transactional call may take.
    timeout: Duration,
}

impl TransactionOwner {
    /// The owner of `producer`'s transactions under `guarantee`.
    pub fn new(producer: Arc<JobProducer>, guarantee: Guarantee, timeout: Duration) -> Self {
        TransactionOwner { producer, guarantee, open: AtomicBool::new(false), timeout }
    }

    /// Under `exactly_once`, fences every earlier producer with this
    /// transactional id and aborts the transaction it left open. Call once,
    /// before anything is sent.
    pub fn fence_earlier_producers(&self) -> Result<(), KafkaError> {
        if self.guarantee == Guarantee::ExactlyOnce {
            self.producer.init_transactions(self.timeout)?;
        }
        Ok(())
    }

    /// The producer, for what is not the transaction's: delivery reports
    /// and the cluster's metadata.
    pub fn producer(&self) -> &JobProducer {
        &self.producer
    }

    /// The job's guarantee: with `exactly_once`, transactions.
    pub fn guarantee(&self) -> Guarantee {
        self.guarantee
    }

    /// Whether a Kafka transaction is open: something was sent since the
    /// last commit or abort.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }

    /// Sends one record into the transaction, beginning it if none is open
    /// (`exactly_once`); waits while the producer's queue is full.
    pub(crate) fn send(&self, mut record: BaseRecord<'_, [u8], [u8]>) -> Result<(), KafkaError> {
        self.begin_if_closed()?;
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

    /// Begins a transaction unless one is open (`exactly_once`).
    pub(crate) fn begin_if_closed(&self) -> Result<(), KafkaError> {
        if self.guarantee == Guarantee::ExactlyOnce && !self.is_open() {
            self.producer.begin_transaction()?;
            self.open.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    /// The commit point. Under `exactly_once`: adds `offsets` (for the
    /// consumer `group`) to the open transaction, waits until every record
    /// sent is delivered, and commits the transaction. Under
    /// `at_least_once`: waits for every record, fails if one was not
    /// delivered, then commits `offsets` through `consumer`. After an error
    /// the caller asks [`classify`] what to do. The producer must not send
    /// meanwhile.
    pub(crate) fn commit<C: ConsumerContext>(
        &self,
        offsets: &TopicPartitionList,
        group: Option<&ConsumerGroupMetadata>,
        consumer: &BaseConsumer<C>,
    ) -> Result<(), TransactionError> {
        match self.guarantee {
            Guarantee::ExactlyOnce => {
                let group = group.ok_or(KafkaError::Global(RDKafkaErrorCode::InvalidGroupId))?;
                let started = Instant::now();
                if offsets.count() > 0 {
                    self.producer.send_offsets_to_transaction(offsets, group, self.timeout)?;
                }
                let offsets_sent = Instant::now();
                self.wait_delivered()?;
                let delivered = Instant::now();
                self.producer.commit_transaction(self.timeout)?;
                self.open.store(false, Ordering::SeqCst);
                tracing::debug!(
                    offsets_us = (offsets_sent - started).as_micros() as u64,
                    delivered_us = (delivered - offsets_sent).as_micros() as u64,
                    commit_us = delivered.elapsed().as_micros() as u64,
                    "transaction committed"
                );
            }
            Guarantee::AtLeastOnce => {
                self.wait_delivered()?;
                if let Some(error) = self.producer.context().take_error() {
                    return Err(TransactionError::Delivery(error));
                }
                if offsets.count() > 0 {
                    consumer.commit(offsets, CommitMode::Sync)?;
                }
            }
        }
        Ok(())
    }

    /// Aborts the open transaction, if any: nothing sent since the last
    /// commit becomes visible to `read_committed` readers. Whether one was
    /// open.
    ///
    /// It first waits (up to the timeout) for the records sent: librdkafka
    /// ends a transaction as soon as it has *sent* AddPartitionsToTxn, and
    /// right after a commit the coordinator refuses that request while it
    /// still writes the commit's markers; the abort then reaches a
    /// coordinator with no open transaction, which is fatal to the producer
    /// (INVALID_TXN_STATE, librdkafka issue 4849). A record is delivered
    /// only once its partition joined the transaction, so after the wait
    /// the abort ends a transaction the coordinator knows.
    pub fn abort(&self) -> Result<bool, KafkaError> {
        if self.guarantee == Guarantee::ExactlyOnce && self.open.swap(false, Ordering::SeqCst) {
            if let Err(err) = self.wait_delivered() {
                tracing::debug!(%err, "aborting with records still in flight");
            }
            self.producer.abort_transaction(self.timeout)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Waits until every record sent is acknowledged (or failed).
    ///
    /// rdkafka's `flush` (which `commit_transaction` also calls) polls in
    /// steps of 100 ms while the delivery thread serves the reports, so
    /// every commit took at least 100 ms and held the job loop that long;
    /// waiting here first makes its flush a no-op.
    fn wait_delivered(&self) -> Result<(), KafkaError> {
        let deadline = Instant::now() + self.timeout;
        while self.producer.in_flight_count() > 0 {
            if Instant::now() >= deadline {
                return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }
}

/// A failed commit point.
#[derive(Debug, thiserror::Error)]
pub enum TransactionError {
    /// Kafka refused or failed; [`classify`] says what to do.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A record could not be delivered (`at_least_once`).
    #[error("{0}")]
    Delivery(String),
}
