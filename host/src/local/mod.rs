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

pub mod committer;
pub mod config;
pub mod sink;
pub mod source;
pub mod task;

pub use task::{LocalTask, TaskError};
