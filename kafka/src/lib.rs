//! Kafka mode: input topics in, output topics out, exactly once.
//!
//! Per transaction, one Kafka transaction carries the output records, the
//! changelog records of the state changes and the input offsets
//! (`send_offsets_to_transaction`); only after it committed is the state
//! overlay applied to RocksDB, with the changelog checkpoint (invariants
//! 1 and 2 of `docs/architecture.md`). A process that lost its partitions is fenced by the
//! group generation in the offsets it sends (KIP-447) and by its producer
//! epoch (invariant 3).
//!
//! State is kept per input partition, like Kafka Streams' tasks: partition
//! `p` of every input topic feeds one state namespace, whose changelog is
//! partition `p` of the job's changelog topic. Records that must be
//! aggregated together must share a partition (produce them with the same
//! key).
//!
//! - [`topics`]: client settings, topic checks and creation.
//! - [`changelog`]: the changelog record format and restore.
//! - [`producer`]: the job's producer and its delivery reports; which
//!   failures abort and which restart.
//! - [`collector`]: sending outputs and dead letters with their lineage.
//! - [`committer`]: the transaction: changelog, offsets, commit, state.
//! - [`fetch`]: reading the input's records in batches.
//! - [`leader_fetch`], [`fetch_wire`], [`record_batch`]: restores fetching
//!   the changelog from its partitions' leaders and reading its batches in
//!   place.
//! - [`job`]: the job loop, rebalances, and recovery from Kafka failures.
//! - [`keys`]: the layout of source ids, state, metadata and changelog keys.

#![warn(missing_docs)]

mod changelog;
mod collector;
pub mod committer;
mod config;
mod fetch;
mod fetch_wire;
mod job;
pub mod keys;
mod leader_fetch;
mod producer;
mod record_batch;
mod restore;
mod topics;
pub mod transaction;
mod watermarks;

pub use collector::HEADER_IDEMPOTENCY_KEY;
pub use config::{
    DEFAULT_CREATE_PARTITIONS, DEFAULT_RESTORE_CHECKPOINT_BYTES, DEFAULT_RESTORE_STALL_MS,
    DEFAULT_TRANSACTION_TIMEOUT_MS, Guarantee, KafkaConfig, RestoreFetch, check_client_settings,
    default_restore_stall_ms,
};
pub use job::{InstanceIdError, KafkaJob, KafkaRunOptions, Seeded, StartAt, StartError};
pub use restore::RestoreError;
pub use topics::{
    ClientRole, RESTORE_DEFAULTS, TopicLayout, base_config, prepare as prepare_topics,
};

/// Why a Kafka job stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaJobError {
    /// The job's topics, brokers or state do not fit together.
    #[error("Kafka job `{job}`: {source}")]
    Setup {
        /// The job.
        job: String,
        /// What does not fit, and the fix.
        source: SetupError,
    },
    /// At start, the group's committed offsets are below what the state
    /// already includes: someone moved them back by hand.
    #[error(
        "Kafka job `{job}` refuses to start: consumer group `{group}` has {} for `{topic}` partition {partition}, \
         but the job's state already includes that partition's records up to offset {included}. Someone moved the group's \
         offsets back by hand; processing from there would count those records twice. To reprocess history, replay into a \
         new output version instead (`tally replay <job.toml> --version v2`: its own group, changelog, state and output \
         topics). To undo the reset, set the group's offset for `{topic}` partition {partition} back to {included}.",
        group_offset.map_or_else(|| "no committed offset".to_string(), |offset| format!("committed offset {offset}"))
    )]
    GroupRewound {
        /// The job.
        job: String,
        /// Its consumer group.
        group: String,
        /// The input topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The group's committed offset, if it has one.
        group_offset: Option<i64>,
        /// Next offset the state includes.
        included: i64,
    },
    /// While running, the consumer was handed a record the state already
    /// includes: it was moved back (an offset reset, a truncated log).
    #[error(
        "Kafka job `{job}` stopped: it was handed offset {offset} of `{topic}` partition {partition}, but its state \
         already includes that partition up to offset {included}; the consumer was moved back (an offset \
         reset, or a truncated log), and going on would count those records twice. To reprocess history, \
         replay into a new output version (`tally replay <job.toml> --version v2`)"
    )]
    Rewind {
        /// The job.
        job: String,
        /// The input topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset handed over.
        offset: i64,
        /// Next offset the state includes.
        included: i64,
    },
    /// A Kafka client failed in a way retrying does not fix.
    #[error("Kafka job `{job}`: {source}")]
    Kafka {
        /// The job.
        job: String,
        /// Why.
        source: rdkafka::error::KafkaError,
    },
    /// The state directory is locked or unusable.
    #[error(transparent)]
    Lock(#[from] tally_core::lock::LockError),
    /// The state store failed.
    #[error(transparent)]
    State(#[from] tally_core::state::StateError),
    /// The plugin could not be instantiated.
    #[error(transparent)]
    Plugin(#[from] tally_core::plugin::PluginError),
    /// A batch failed in a way that ends the run (the store, the
    /// configuration, a plugin failing on everything).
    #[error(transparent)]
    Run(#[from] tally_core::task::RunError),
    /// The job configuration is invalid.
    #[error(transparent)]
    Config(#[from] tally_core::settings::InvalidJob),
    /// A start (`tally replay --from`) could not be seeded.
    #[error(transparent)]
    Start(Box<job::StartError>),
}

/// What of a Kafka job's clients, topics or state does not fit; each says
/// what to change. Retrying does not help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// librdkafka refused the client configuration.
    #[error("cannot create a Kafka client: {0}; check kafka.client and kafka.brokers")]
    Client(#[source] rdkafka::error::KafkaError),
    /// The cluster's topics could not be listed.
    #[error(
        "cannot read topic metadata from {brokers}: {source}; check that the brokers run and are reachable, and kafka.client's security settings (TLS, SASL) if the cluster needs them (locally: scripts/kafka start)"
    )]
    Metadata {
        /// The brokers asked.
        brokers: String,
        /// Why.
        source: rdkafka::error::KafkaError,
    },
    /// Two inputs have different partition counts.
    #[error(
        "input topics `{first}` ({first_partitions} partitions) and `{second}` ({second_partitions} partitions) differ; \
         partition p of every input feeds one state, so inputs must have the same number of partitions"
    )]
    InputsDiffer {
        /// One input.
        first: String,
        /// Its partitions.
        first_partitions: i32,
        /// Another.
        second: String,
        /// Its partitions.
        second_partitions: i32,
    },
    /// Topics the job needs do not exist and it may not create them.
    #[error(
        "topic(s) {} do not exist; create them (for example: scripts/kafka topics --create --topic {} --partitions {partitions}), \
         or set kafka.create_topics = true",
        missing.iter().map(|topic| format!("`{topic}`")).collect::<Vec<_>>().join(", "),
        missing.first().map_or("", String::as_str)
    )]
    TopicsMissing {
        /// The missing topics.
        missing: Vec<String>,
        /// Partitions they should have.
        partitions: i32,
    },
    /// The changelog has another partition count than the inputs.
    #[error(
        "changelog topic `{changelog}` has {count} partitions but the inputs have {partitions}; \
         state cannot follow its partitions. Keep the inputs' partition count, or run the job under a new name"
    )]
    ChangelogPartitions {
        /// The changelog topic.
        changelog: String,
        /// Its partitions.
        count: i32,
        /// The inputs' partitions.
        partitions: i32,
    },
    /// Creating topics failed.
    #[error("creating topics failed: {0}")]
    CreateTopics(#[source] rdkafka::error::KafkaError),
    /// The broker refused one topic.
    #[error("creating topic `{topic}` failed: {code}")]
    CreateTopic {
        /// The topic.
        topic: String,
        /// The broker's answer.
        code: rdkafka::types::RDKafkaErrorCode,
    },
    /// The state directory's instance id cannot be had.
    #[error(transparent)]
    InstanceId(#[from] job::InstanceIdError),
    /// The changelog holds records Tally did not write.
    #[error(transparent)]
    ForeignChangelog(restore::RestoreError),
    /// The changelog ends before what this process's state has read of it.
    #[error(
        "changelog topic `{changelog}` partition {partition} ends at offset {end}, but this process's state has \
         read it up to offset {checkpoint}: the topic lost records since (deleted and recreated, or truncated), \
         so no other process could restore this state. Tally stops rather than write a changelog that does not \
         add up. To rebuild the state from the input, run the job under a new name (a new group, changelog and \
         state directory) writing to new output topics"
    )]
    ChangelogLost {
        /// The changelog topic.
        changelog: String,
        /// The partition.
        partition: i32,
        /// Where it ends now.
        end: i64,
        /// How far the state had read it.
        checkpoint: i64,
    },
    /// The process was given partition `p` of some inputs but not of all.
    #[error(
        "this process was given partition {partition} of some inputs but not of `{missing}`; partition {partition} of \
         every input feeds one state, so every process of the job must read the same inputs \
         (change kafka.inputs on all processes together: stop them all, then start them with the new inputs)"
    )]
    SplitNamespace {
        /// The partition number.
        partition: i32,
        /// An input it is missing from.
        missing: String,
    },
}

impl KafkaJobError {
    /// Whether opening the job again may help (Kafka or the disk failed),
    /// or only a person can (a rewind, topics that do not fit, a bad
    /// configuration, a broken plugin).
    pub fn is_retryable(&self) -> bool {
        match self {
            KafkaJobError::Run(run) => run.is_retryable(),
            KafkaJobError::Rewind { .. }
            | KafkaJobError::GroupRewound { .. }
            | KafkaJobError::Setup { .. }
            | KafkaJobError::Config(_) => false,
            KafkaJobError::Kafka { .. }
            | KafkaJobError::Lock(_)
            | KafkaJobError::State(_)
            | KafkaJobError::Plugin(_) => true,
            KafkaJobError::Start(start) => matches!(**start, job::StartError::Kafka { .. }),
        }
    }

    /// Whether a new plugin version is the fix: the job waits for one.
    pub fn needs_new_plugin(&self) -> bool {
        matches!(self, KafkaJobError::Run(run) if run.needs_new_plugin())
    }
}

/// Logs a librdkafka client error, leaving out partition-end events (they
/// are how Tally learns a partition was read to its end, not errors).
pub fn log_client_error(error: rdkafka::error::KafkaError, reason: &str) {
    if !matches!(error, rdkafka::error::KafkaError::PartitionEOF(_))
        && error.rdkafka_error_code() != Some(rdkafka::types::RDKafkaErrorCode::PartitionEOF)
    {
        tracing::warn!(target: "tally::kafka", %error, reason, "Kafka client error");
    }
}

/// A consumer context that logs client errors through [`log_client_error`].
pub struct QuietEof;

impl rdkafka::ClientContext for QuietEof {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        log_client_error(error, reason);
    }
}

impl rdkafka::consumer::ConsumerContext for QuietEof {}

/// A timeout as librdkafka's C API takes it: milliseconds in an `int`.
pub(crate) fn timeout_ms(timeout: std::time::Duration) -> i32 {
    timeout.as_millis().min(i32::MAX as u128) as i32
}
