//! Where a delivery reads a job's committed output: the [`Source`] trait,
//! the lines it hands out and the positions it starts from. A local job's
//! output file is one partition ([`crate::local_output`]); a Kafka job's
//! output topic is read `read_committed` by the host's implementation
//! (this crate has no Kafka client).

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Per partition, the offset of the first record not yet settled (a
/// local output is partition 0, its offsets byte offsets).
pub type Positions = BTreeMap<u32, u64>;

/// One committed record of the output.
#[derive(Debug)]
pub struct Line {
    /// Its partition (0 for a local output).
    pub partition: u32,
    /// Its offset in the partition (a byte offset in a local output).
    pub offset: u64,
    /// The offset of the next record.
    pub next: u64,
    /// What it holds.
    pub payload: Payload,
}

/// What a committed record holds, as read.
#[derive(Debug)]
pub enum Payload {
    /// A local output line, without its line end.
    Json(Vec<u8>),
    /// A record of a Kafka output topic.
    Kafka(KafkaRecord),
    /// A record longer than a delivery reads: its length.
    TooLong(u64),
}

/// A record of a Kafka output topic: its key and value as the job wrote
/// them, its idempotency key and lineage from its headers.
#[derive(Debug, Clone, Default)]
pub struct KafkaRecord {
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub value: Option<Vec<u8>>,
    /// Its `tally.idempotency-key` header.
    pub idempotency_key: Option<String>,
    /// Its other `tally.` headers (lineage: source topic, partition,
    /// offset, plugin), by name without the prefix.
    pub lineage: BTreeMap<String, String>,
}

/// A failure reading the committed output.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The job's store, output file or topic cannot be read.
    #[error("cannot read the committed output `{}`: {reason}", path.display())]
    Read {
        /// The file, store or topic.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The job's committed output is shorter than what was delivered.
    #[error(
        "output `{}` has {committed} committed bytes, but this delivery has read up to byte {position}: \
         the job's state or output was replaced; deliver the new output with a new delivery state_dir",
        path.display()
    )]
    Shrunk {
        /// The output file.
        path: PathBuf,
        /// What the job has committed.
        committed: u64,
        /// What the delivery has read.
        position: u64,
    },
}

/// A job's committed output, read in order within each partition.
pub trait Source: Send {
    /// Reads from `positions` on (a partition not named: from its start),
    /// forgetting what was read before.
    fn start(&mut self, positions: &Positions) -> Result<(), SourceError>;
    /// Up to `max` committed records not read yet, in order within each
    /// partition; none when nothing more is committed.
    fn read(&mut self, max: usize) -> Result<Vec<Line>, SourceError>;
    /// Whether the last [`Source::read`] reached the end of what the job
    /// had committed in every partition.
    fn caught_up(&self) -> bool;
}
