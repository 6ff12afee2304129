//! Where a job's first run starts when it is not the start of its inputs
//! (`tally replay --from`, see `docs/versions.md`).
//!
//! A Kafka job starts each partition where its consumer group's committed
//! offset is, and the state updater checks that the restored state includes
//! input up to that offset. So a start is seeded as the job's first
//! transaction, under its own transactional id: for every input partition,
//! the changelog's position marker (the state includes the partition up to
//! its start) and the group's offset, committed together. A restore then
//! finds exactly what a run that had processed everything before the start
//! would have left, on this machine or on another, including for a
//! partition with nothing to read after its start.

use std::collections::BTreeMap;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use super::{KAFKA_TIMEOUT, KafkaJob};
use crate::KafkaJobError;
use crate::collector::RecordCollector;
use crate::keys::included_key;
use crate::producer::{DeliveryTracker, JobProducer};
use crate::topics::{self, ClientRole};
use crate::transaction::{TransactionError, TransactionOwner};

/// Where a job's first run starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartAt {
    /// The next offset to read, per (input topic, partition); a partition
    /// not named starts at its first offset.
    Offsets(BTreeMap<(String, i32), i64>),
    /// Each input partition from its first record whose Kafka timestamp is
    /// at or after this time (its end when it has none).
    Time(jiff::Timestamp),
}

/// What [`KafkaJob::seed_start`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seeded {
    /// The start is committed: the next offset per (input topic, partition).
    Now(BTreeMap<(String, i32), i64>),
    /// The group already had exactly these offsets: the same start, seeded
    /// before, with nothing processed since.
    Before(BTreeMap<(String, i32), i64>),
}

/// Why a start cannot be seeded.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The job ran before: its state goes on from its committed offsets.
    #[error(
        "job `{job}` has already started: its consumer group `{group}` has committed offset {offset} for `{topic}` partition \
         {partition}. A start applies when a job (a version) first runs; run it without a start to go on from where it \
         committed, or replay into a new version"
    )]
    AlreadyStarted {
        /// The job.
        job: String,
        /// Its consumer group.
        group: String,
        /// An input topic the group has an offset for.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The offset.
        offset: i64,
    },
    /// The job's state already includes input (its group's offsets may
    /// have expired): a start would count records twice.
    #[error(
        "job `{job}` has already run: its state includes `{topic}` partition {partition} up to offset {included} \
         (its consumer group's offsets may have expired). A start applies when a job (a version) first runs; replay into a \
         new version"
    )]
    StateExists {
        /// The job.
        job: String,
        /// An input topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The next offset the state includes.
        included: i64,
    },
    /// An offset names a topic the job does not read.
    #[error(
        "the start names `{topic}`, which is not an input of job `{job}` (its inputs: {inputs})"
    )]
    NotAnInput {
        /// The job.
        job: String,
        /// The topic named.
        topic: String,
        /// The job's inputs, listed.
        inputs: String,
    },
    /// An offset names a partition the topic does not have.
    #[error("the start names partition {partition} of `{topic}`, which has {partitions} partitions (0 to {})", partitions - 1)]
    NoSuchPartition {
        /// The topic.
        topic: String,
        /// The partition named.
        partition: i32,
        /// How many it has.
        partitions: i32,
    },
    /// An offset lies outside its partition's records.
    #[error(
        "the start's offset {offset} of `{topic}` partition {partition} is outside its records: give an offset from {low} \
         (its first record) to {high} (its end)"
    )]
    OutsideRecords {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset named.
        offset: i64,
        /// The partition's first offset.
        low: i64,
        /// Its end (the next offset written).
        high: i64,
    },
    /// The job's state store could not be read.
    #[error("seeding the start of job `{job}`: reading its state failed: {reason}")]
    State {
        /// The job.
        job: String,
        /// Why.
        reason: String,
    },
    /// A position marker could not be delivered (`at_least_once`).
    #[error("seeding the start of job `{job}`: {reason}")]
    Undelivered {
        /// The job.
        job: String,
        /// What the delivery report said.
        reason: String,
    },
    /// A Kafka call failed.
    #[error("seeding the start of job `{job}`: {doing} failed: {source}")]
    Kafka {
        /// The job.
        job: String,
        /// The call.
        doing: &'static str,
        /// Why.
        source: KafkaError,
    },
}

impl KafkaJob {
    /// Seeds `start` as this job's first transaction, before its first run
    /// (see the module's doc). Refused once the group has committed
    /// offsets, unless they are exactly the start's (seeded before, nothing
    /// processed since). Call before [`KafkaJob::run_until`].
    pub fn seed_start(&self, start: &StartAt) -> Result<Seeded, KafkaJobError> {
        self.seed(start).map_err(|err| KafkaJobError::Start(Box::new(err)))
    }

    fn seed(&self, start: &StartAt) -> Result<Seeded, StartError> {
        let (job, kafka) = (&self.config.name, &self.kafka);
        let failed = |doing| move |source| StartError::Kafka { job: job.clone(), doing, source };
        let group = kafka.group_id(job);
        let consumer: BaseConsumer = topics::base_config(kafka, ClientRole::Consumer)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .map_err(failed("creating a consumer"))?;
        let offsets = self.start_offsets(&consumer, start)?;
        let mut wanted = TopicPartitionList::new();
        for (topic, partition) in offsets.keys() {
            wanted.add_partition(topic, *partition);
        }
        let committed = consumer
            .committed_offsets(wanted, KAFKA_TIMEOUT)
            .map_err(failed("reading the group's committed offsets"))?;
        let mut any_committed = None;
        let mut all_at_start = true;
        for element in committed.elements() {
            element.error().map_err(failed("reading the group's committed offsets"))?;
            let wanted = offsets.get(&(element.topic().to_string(), element.partition()));
            match element.offset() {
                Offset::Offset(offset) => {
                    all_at_start &= wanted == Some(&offset);
                    any_committed.get_or_insert((
                        element.topic().to_string(),
                        element.partition(),
                        offset,
                    ));
                }
                _ => all_at_start = false,
            }
        }
        match any_committed {
            Some(_) if all_at_start => return Ok(Seeded::Before(offsets)),
            Some((topic, partition, offset)) => {
                return Err(StartError::AlreadyStarted {
                    job: job.clone(),
                    group,
                    topic,
                    partition,
                    offset,
                });
            }
            None => {}
        }
        // No offsets, yet state: the group's offsets expired after a run.
        for (topic, partition) in offsets.keys() {
            let included =
                crate::changelog::read_offset(&*self.store, &included_key(topic, *partition))
                    .map_err(|err| StartError::State {
                        job: job.clone(),
                        reason: err.to_string(),
                    })?;
            if let Some(included) = included {
                return Err(StartError::StateExists {
                    job: job.clone(),
                    topic: topic.clone(),
                    partition: *partition,
                    included,
                });
            }
        }

        let producer: JobProducer = topics::producer_config(&self.config, kafka, &self.instance)
            .create_with_context(DeliveryTracker::new(self.layout.changelog.clone()))
            .map_err(failed("creating a producer"))?;
        let owner = std::sync::Arc::new(TransactionOwner::new(
            std::sync::Arc::new(producer),
            kafka.guarantee,
            KAFKA_TIMEOUT,
        ));
        owner.fence_earlier_producers().map_err(failed("fencing earlier producers"))?;
        let collector = RecordCollector::new(owner.clone(), self.addresses());
        let mut list = TopicPartitionList::new();
        for ((topic, partition), &next) in &offsets {
            let index = kafka.inputs.iter().position(|input| input == topic).unwrap_or_default();
            collector
                .send_position(index, *partition, next)
                .map_err(failed("sending the changelog's position markers"))?;
            list.add_partition_offset(topic, *partition, Offset::Offset(next))
                .map_err(failed("listing the start's offsets"))?;
        }
        let metadata = consumer.group_metadata();
        let committing = owner.commit(&list, metadata.as_ref(), &consumer);
        committing.map_err(|err| match err {
            TransactionError::Kafka(source) => {
                StartError::Kafka { job: job.clone(), doing: "committing the start", source }
            }
            TransactionError::Delivery(reason) => {
                StartError::Undelivered { job: job.clone(), reason }
            }
        })?;
        tracing::info!(job = %job, ?offsets, "start seeded: the group's offsets and the changelog's positions");
        Ok(Seeded::Now(offsets))
    }

    /// The next offset per input partition that `start` means, each checked
    /// against its partition's records.
    fn start_offsets(
        &self,
        consumer: &BaseConsumer,
        start: &StartAt,
    ) -> Result<BTreeMap<(String, i32), i64>, StartError> {
        let (job, kafka) = (&self.config.name, &self.kafka);
        let partitions = self.layout.partitions;
        let bounds = |topic: &str, partition: i32| {
            consumer.fetch_watermarks(topic, partition, KAFKA_TIMEOUT).map_err(|source| {
                StartError::Kafka {
                    job: job.clone(),
                    doing: "reading a partition's offsets",
                    source,
                }
            })
        };
        if let StartAt::Offsets(named) = start {
            for ((topic, partition), &offset) in named {
                if !kafka.inputs.contains(topic) {
                    return Err(StartError::NotAnInput {
                        job: job.clone(),
                        topic: topic.clone(),
                        inputs: kafka.inputs.join(", "),
                    });
                }
                if !(0..partitions).contains(partition) {
                    return Err(StartError::NoSuchPartition {
                        topic: topic.clone(),
                        partition: *partition,
                        partitions,
                    });
                }
                let (low, high) = bounds(topic, *partition)?;
                if offset < low || offset > high {
                    return Err(StartError::OutsideRecords {
                        topic: topic.clone(),
                        partition: *partition,
                        offset,
                        low,
                        high,
                    });
                }
            }
        }
        let found = match start {
            StartAt::Time(at) => {
                let mut query = TopicPartitionList::new();
                for topic in &kafka.inputs {
                    for partition in 0..partitions {
                        query
                            .add_partition_offset(
                                topic,
                                partition,
                                Offset::Offset(at.as_millisecond()),
                            )
                            .map_err(|source| StartError::Kafka {
                                job: job.clone(),
                                doing: "listing the partitions",
                                source,
                            })?;
                    }
                }
                let found = consumer.offsets_for_times(query, KAFKA_TIMEOUT).map_err(|source| {
                    StartError::Kafka {
                        job: job.clone(),
                        doing: "looking up offsets by time",
                        source,
                    }
                })?;
                found
                    .elements()
                    .iter()
                    .filter_map(|element| match element.offset() {
                        Offset::Offset(offset) => {
                            Some(((element.topic().to_string(), element.partition()), offset))
                        }
                        _ => None,
                    })
                    .collect()
            }
            StartAt::Offsets(named) => named.clone(),
        };
        let mut offsets = BTreeMap::new();
        for topic in &kafka.inputs {
            for partition in 0..partitions {
                let key = (topic.clone(), partition);
                let next = match (found.get(&key), start) {
                    (Some(&offset), _) => offset,
                    // No record at or after the time: the partition's end.
                    (None, StartAt::Time(_)) => bounds(topic, partition)?.1,
                    // Not named: its first record.
                    (None, StartAt::Offsets(_)) => bounds(topic, partition)?.0,
                };
                offsets.insert(key, next);
            }
        }
        Ok(offsets)
    }
}
