//! Where the job loop stands in its partitions, and moving the consumer
//! back to the last commit.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use super::KAFKA_TIMEOUT;
use super::rebalance::Rebalancer;
use crate::keys::source_id;
use tally_core::plugin::Event;

/// Where the job loop is within the assigned partitions.
#[derive(Default)]
pub(super) struct Progress {
    /// Records read but not yet run through the plugin.
    pub(super) pending: Vec<Event>,
    /// Bytes of their keys and values.
    pub(super) pending_bytes: u64,
    /// Of them, those over `limits.max_record_bytes`: (source id, offset)
    /// and their size. They hold only a prefix, and are dead-lettered
    /// instead of run.
    pub(super) oversized: HashMap<(u32, u64), usize>,
    /// Next offset per source id, of the records in the open transaction.
    pub(super) positions: BTreeMap<u32, i64>,
    /// First offset per source id read since the last commit (where a
    /// rewind goes for a partition with no committed offset).
    pub(super) first: HashMap<u32, i64>,
    /// Next offset per source id that the committed state includes.
    pub(super) included: HashMap<u32, i64>,
    /// Input partitions read to their end (for `until_caught_up`, and a
    /// period job's idleness), and since when.
    pub(super) at_end: BTreeMap<(usize, i32), Instant>,
    /// Partition numbers assigned to this instance.
    pub(super) assigned: BTreeSet<i32>,
    /// Partition numbers assigned whose state is still being restored
    /// (paused: none of their records may arrive).
    pub(super) restoring: BTreeSet<i32>,
}

impl Progress {
    /// The open transaction is gone: what was read for it is read again.
    pub(super) fn forget_uncommitted(&mut self) {
        self.pending.clear();
        self.pending_bytes = 0;
        self.oversized.clear();
        self.positions.clear();
        self.first.clear();
        self.at_end.clear();
    }
}

/// Records between the consumer's positions and the ends of its assigned
/// partitions, from the watermarks librdkafka last fetched (no request).
pub(super) fn consumer_lag<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> Option<u64> {
    let positions = consumer.position().ok()?;
    let mut lag = 0u64;
    for element in positions.elements() {
        let topic = std::ffi::CString::new(element.topic()).ok()?;
        let (mut low, mut high) = (0i64, 0i64);
        // SAFETY: the client pointer is valid while `consumer` lives, `topic`
        // is a NUL-terminated string, and the two out-pointers are valid.
        // rdkafka 0.39 has no safe wrapper for this cached (no request) call.
        let status = unsafe {
            rdkafka::bindings::rd_kafka_get_watermark_offsets(
                consumer.client().native_ptr(),
                topic.as_ptr(),
                element.partition(),
                &mut low,
                &mut high,
            )
        };
        if status != rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || high < 0
        {
            return None;
        }
        if let Offset::Offset(position) = element.offset() {
            lag += (high - position).max(0) as u64;
        }
    }
    Some(lag)
}

/// The group's committed offsets as librdkafka read them, if it read
/// every partition's: a partition whose offset it could not read (the
/// group's coordinator loading or moving after a broker restart, offsets
/// of a transaction not settled yet) is an error, not "no committed
/// offset", which would look like a group moved back by hand and stop an
/// exactly-once job.
pub(super) fn every_offset_read(
    committed: TopicPartitionList,
) -> Result<TopicPartitionList, KafkaError> {
    for element in committed.elements() {
        element.error()?;
    }
    Ok(committed)
}

/// Moves the consumer back to the group's committed offsets; a partition
/// the group has no offset for goes back to the first offset the open
/// transaction read of it (`first`, by source id), not to the start of the
/// log or its end (`auto.offset.reset`).
pub(super) fn rewind(
    consumer: &BaseConsumer<Rebalancer>,
    first: &HashMap<u32, i64>,
) -> Result<(), KafkaError> {
    let committed = every_offset_read(consumer.committed(KAFKA_TIMEOUT)?)?;
    let inputs = &consumer.context().inputs;
    for element in committed.elements() {
        let offset = match element.offset() {
            Offset::Offset(offset) => Offset::Offset(offset),
            _ => {
                let topic = inputs.iter().position(|input| input == element.topic());
                match topic.and_then(|topic| first.get(&source_id(topic, element.partition()))) {
                    Some(&offset) => Offset::Offset(offset),
                    // Nothing of it was read in this transaction: leave it.
                    None => continue,
                }
            }
        };
        consumer.seek(element.topic(), element.partition(), offset, KAFKA_TIMEOUT)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::bindings as rd;

    #[test]
    fn a_partition_whose_committed_offset_could_not_be_read_is_an_error_not_no_offset() {
        let mut committed = TopicPartitionList::new();
        committed.add_partition_offset("usage", 0, Offset::Offset(41)).unwrap();
        committed.add_partition_offset("usage", 1, Offset::Invalid).unwrap();
        assert!(every_offset_read(committed.clone()).is_ok(), "no committed offset is an answer");
        // SAFETY: the list has two elements; only the second's error code is written.
        unsafe {
            (*(*committed.ptr()).elems.add(1)).err =
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS
        };
        let err = every_offset_read(committed).expect_err("partition 1's offset was not read");
        assert!(err.to_string().contains("Coordinator load in progress"), "{err}");
    }
}
