//! Local mode: NDJSON files in, NDJSON files out, exactly once across
//! crashes. One file is one partition.
//!
//! - `source`: reading input lines in batches, resuming at a position.
//! - `task`: the driver ([`LocalTask`]) of the core's job loop.
//! - `committer`: one commit = output bytes synced, then one RocksDB
//!   batch with the state, the input positions and the output lengths;
//!   recovery cuts what a crash left past them.
//! - `sink`: the output files and the lineage each record carries.
//!
//! The formats are in `docs/formats.md`.

#![warn(missing_docs)]

mod committer;
mod config;
mod sink;
mod source;
mod task;

pub use committer::{CommitError, committed_length_key, parse_committed_length};
pub use config::LocalConfig;
pub use sink::SinkError;
pub use source::SourceError;
pub use task::{LocalTask, TaskError};

/// Opens `input` the way a job confined to `input_dir` would (a regular
/// file inside it, readable), and closes it again.
pub fn check_confined_input(
    input: &std::path::Path,
    input_dir: &std::path::Path,
) -> Result<(), SourceError> {
    source::LocalSource::open_confined(
        std::slice::from_ref(&input.to_path_buf()),
        &[],
        Some(input_dir),
    )
    .map(drop)
}
