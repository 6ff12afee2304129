//! Local mode: NDJSON files in, NDJSON files out, exactly once across
//! crashes. One file is one partition.
//!
//! - [`source`]: reading input lines in batches, resuming at a position.
//! - [`task`]: the job loop ([`LocalTask`]) on the core's task.
//! - [`committer`]: one commit = output bytes synced, then one RocksDB
//!   batch with the state, the input positions and the output lengths;
//!   recovery cuts what a crash left past them.
//! - [`sink`]: the output files and the lineage each record carries.
//!
//! The formats are in `docs/formats.md`.

pub(crate) mod committer;
pub mod config;
pub(crate) mod sink;
pub(crate) mod source;
mod task;

pub use committer::CommitError;
pub use sink::SinkError;
pub use source::SourceError;
pub use task::{LocalTask, TaskError};
