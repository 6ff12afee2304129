//! Reading the job's input records in batches.
//!
//! rust-rdkafka hands a consumer's records over one poll at a time, and
//! each poll pays a queue lock, four clock reads and an allocation (about
//! 0.18 µs per record in a profile of the billing job, more than half of
//! what its job thread spent consuming). librdkafka can hand over a batch
//! at once (`rd_kafka_consume_batch_queue`), but not from the consumer's
//! own queue here: rebalances arrive there as events rust-rdkafka serves,
//! and a batch read would serve them as "unassign everything".
//!
//! So the assigned partitions' records are routed to a queue of their own,
//! a [`FetchQueue`], read in batches; rebalances and client errors stay on
//! the consumer's queue, which the job loop still polls. A partition is
//! routed before it is assigned, so every record it delivers goes to the
//! fetch queue, in order. It must be routed again at every assignment:
//! librdkafka undoes the routing when a partition stops, yet no longer
//! sends it to the consumer's queue either, so a partition assigned
//! without routing would stall. A seek or a revocation makes librdkafka
//! drop the records fetched before it, in this queue as in the consumer's.

use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use tally_core::sync::lock;

/// Where the consumer's rebalance handler routes newly assigned
/// partitions: the open [`FetchQueue`], if there is one.
#[derive(Default)]
pub struct Router {
    queue: Mutex<Option<QueuePtr>>,
}

/// A librdkafka queue handle, owned by the [`FetchQueue`] that made it.
struct QueuePtr(*mut rd::rd_kafka_queue_t);

// SAFETY: librdkafka queues may be used from any thread; the pointer is only
// used under the router's lock, and destroyed by its owner after leaving it.
unsafe impl Send for QueuePtr {}

impl Router {
    /// Sends partition `partition` of `topic`'s records (and its
    /// end-of-partition events) to the fetch queue. Call it before the
    /// partition is assigned. Without an open fetch queue, or for a topic
    /// name with a NUL byte, records stay on the consumer's queue, where the
    /// job loop reads them too.
    pub fn route<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        topic: &str,
        partition: i32,
    ) {
        let guard = lock(&self.queue);
        let (Some(queue), Ok(topic)) = (guard.as_ref(), CString::new(topic)) else { return };
        // SAFETY: the client pointer is valid while `consumer` lives, `topic`
        // is NUL-terminated, and `queue` stays open while the lock is held.
        // The partition handle is only a reference: destroying it keeps the
        // routing, which the partition's queue holds on to.
        unsafe {
            let partition_queue = rd::rd_kafka_queue_get_partition(
                consumer.client().native_ptr(),
                topic.as_ptr(),
                partition,
            );
            if !partition_queue.is_null() {
                rd::rd_kafka_queue_forward(partition_queue, queue.0);
                rd::rd_kafka_queue_destroy(partition_queue);
            }
        }
    }
}

/// A reference to a consumer's own queue (rebalances, errors, log lines),
/// to see whether events wait there: a zero-timeout poll serves only one.
/// Its owner drops it before the consumer.
pub struct ConsumerQueue(*mut rd::rd_kafka_queue_t);

// SAFETY: librdkafka queues may be used from any thread; the reference is
// only read for its length, and released once, in `drop`.
unsafe impl Send for ConsumerQueue {}
// SAFETY: as for `Send`: librdkafka's queue length is safe to read from
// any thread at once, and nothing else is done through a shared reference.
unsafe impl Sync for ConsumerQueue {}

impl ConsumerQueue {
    /// The queue of `consumer` (none without a group).
    pub fn of<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> ConsumerQueue {
        // SAFETY: the client pointer is valid while `consumer` lives; the
        // reference taken here is released in `drop`.
        ConsumerQueue(unsafe { rd::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) })
    }

    /// Whether events wait to be served.
    pub fn has_events(&self) -> bool {
        // SAFETY: a non-null reference is valid until `drop`.
        !self.0.is_null() && unsafe { rd::rd_kafka_queue_length(self.0) } > 0
    }
}

impl Drop for ConsumerQueue {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: releases the reference taken in `of`, once.
            unsafe { rd::rd_kafka_queue_destroy(self.0) };
        }
    }
}

/// The queue the job's assigned partitions deliver their records to; it
/// borrows the consumer, so it is closed before the consumer is.
pub struct FetchQueue<'c> {
    router: Arc<Router>,
    queue: *mut rd::rd_kafka_queue_t,
    /// The consumer's own queue, to see whether it holds events.
    consumer_queue: ConsumerQueue,
    /// Room for one batch of message pointers.
    batch: Vec<*mut rd::rd_kafka_message_t>,
    _consumer: std::marker::PhantomData<&'c ()>,
}

/// One item read from a [`FetchQueue`].
pub enum Fetched<'m> {
    /// A record of an assigned partition.
    Record(FetchedRecord<'m>),
    /// A partition was read to its end: `(topic, partition, offset)`, the
    /// offset it ended at (the end librdkafka saw: a `read_committed`
    /// consumer's is the last stable offset), where known.
    End(&'m str, i32, Option<i64>),
    /// A consumer error for a partition, in librdkafka's words.
    Error(rdkafka::types::RDKafkaErrorCode, String),
}

/// A record read from a [`FetchQueue`], valid until the next one is read.
pub struct FetchedRecord<'m>(&'m rd::rd_kafka_message_t);

impl<'c> FetchQueue<'c> {
    /// Opens the fetch queue of `consumer`, whose context routes assigned
    /// partitions through `router`; room for batches of `batch_size`.
    pub fn open<C: ConsumerContext>(
        consumer: &'c BaseConsumer<C>,
        router: Arc<Router>,
        batch_size: usize,
    ) -> FetchQueue<'c> {
        // SAFETY: the client pointer is valid while `consumer` lives; the
        // queue is destroyed in `drop`, which the borrow puts first.
        let queue = unsafe { rd::rd_kafka_queue_new(consumer.client().native_ptr()) };
        assert!(!queue.is_null(), "librdkafka could not create a queue");
        let consumer_queue = ConsumerQueue::of(consumer);
        *lock(&router.queue) = Some(QueuePtr(queue));
        FetchQueue {
            router,
            queue,
            consumer_queue,
            batch: vec![std::ptr::null_mut(); batch_size.max(1)],
            _consumer: std::marker::PhantomData,
        }
    }

    /// Whether the consumer's own queue holds events to serve (rebalances,
    /// errors, log lines): a zero-timeout poll serves only one.
    pub fn consumer_events_waiting(&self) -> bool {
        // Without a group there is no consumer queue: the loop polls once a turn.
        self.consumer_queue.has_events()
    }

    /// Reads up to `max` items (at most the batch size), waiting up to
    /// `timeout` for the first, and hands each to `each`; returns how many
    /// were read.
    pub fn read(
        &mut self,
        timeout: Duration,
        max: usize,
        mut each: impl FnMut(Fetched<'_>),
    ) -> usize {
        let max = max.min(self.batch.len());
        if max == 0 {
            return 0;
        }
        // SAFETY: `batch` has room for `max` pointers, and the queue is open.
        let read = unsafe {
            rd::rd_kafka_consume_batch_queue(
                self.queue,
                super::timeout_ms(timeout),
                self.batch.as_mut_ptr(),
                max,
            )
        };
        let read = usize::try_from(read).unwrap_or(0);
        // Destroys what `each` did not get to if it panics: a message kept
        // holds its partition, and closing the consumer would wait for it.
        let mut batch = DestroyRest { messages: &self.batch[..read], next: 0 };
        while let Some(&message) = batch.messages.get(batch.next) {
            // SAFETY: librdkafka returned `read` valid messages, each ours to
            // destroy once, after its last use.
            let item = unsafe { &*message };
            match item.err {
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => {
                    each(Fetched::Record(FetchedRecord(item)))
                }
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                    each(Fetched::End(topic_name(item), item.partition, Some(item.offset)))
                }
                code => {
                    // SAFETY: an error message's text is a NUL-terminated string it owns.
                    let text = unsafe { CStr::from_ptr(rd::rd_kafka_message_errstr(message)) }
                        .to_string_lossy()
                        .into_owned();
                    each(Fetched::Error(code.into(), text))
                }
            }
            batch.next += 1;
            // SAFETY: see above; `item` is not used after this.
            unsafe { rd::rd_kafka_message_destroy(message) };
        }
        read
    }
}

/// Messages of a batch read, from `next` on not yet destroyed.
struct DestroyRest<'b> {
    messages: &'b [*mut rd::rd_kafka_message_t],
    next: usize,
}

impl Drop for DestroyRest<'_> {
    fn drop(&mut self) {
        for &message in &self.messages[self.next..] {
            // SAFETY: returned by librdkafka and not destroyed yet.
            unsafe { rd::rd_kafka_message_destroy(message) };
        }
    }
}

impl Drop for FetchQueue<'_> {
    fn drop(&mut self) {
        // Out of the router first, so no partition is routed to a closed queue.
        lock(&self.router.queue).take();
        // SAFETY: created in `open`, destroyed once, while the consumer lives
        // (as is `consumer_queue`, dropped after this).
        unsafe { rd::rd_kafka_queue_destroy(self.queue) };
    }
}

impl<'m> FetchedRecord<'m> {
    /// The same view of a record polled from the consumer's own queue.
    pub fn of(message: &'m rdkafka::message::BorrowedMessage<'_>) -> FetchedRecord<'m> {
        // SAFETY: a borrowed message points to a valid librdkafka message
        // for as long as it lives.
        FetchedRecord(unsafe { &*message.ptr() })
    }

    /// The input topic's name.
    pub fn topic(&self) -> &str {
        topic_name(self.0)
    }

    /// The input partition.
    pub fn partition(&self) -> i32 {
        self.0.partition
    }

    /// The record's offset.
    pub fn offset(&self) -> i64 {
        self.0.offset
    }

    /// The record's key, if it has one.
    pub fn key(&self) -> Option<&[u8]> {
        // SAFETY: librdkafka keeps `key_len` bytes at `key` while the message lives.
        (!self.0.key.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(self.0.key as *const u8, self.0.key_len) })
    }

    /// The record's value, if it has one.
    pub fn payload(&self) -> Option<&[u8]> {
        // SAFETY: as for the key.
        (!self.0.payload.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(self.0.payload as *const u8, self.0.len) })
    }

    /// The record's timestamp (create or log-append time), in ms since the epoch.
    pub fn timestamp_ms(&self) -> Option<i64> {
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: the message is valid, and `kind` a place to write to.
        let millis = unsafe { rd::rd_kafka_message_timestamp(self.0, &mut kind) };
        (kind != rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE && millis >= 0)
            .then_some(millis)
    }
}

/// The topic a message came from ("" if librdkafka did not say).
fn topic_name(message: &rd::rd_kafka_message_t) -> &str {
    if message.rkt.is_null() {
        return "";
    }
    // SAFETY: a consumed message's topic handle lives as long as the message,
    // and its name is NUL-terminated.
    unsafe { CStr::from_ptr(rd::rd_kafka_topic_name(message.rkt)) }.to_str().unwrap_or("")
}
