//! Tally's delivery stage: a job's committed outputs delivered to a
//! billing HTTP API effectively once, or into PostgreSQL exactly once. Each record is `POST`ed with the
//! job's idempotency key for it; a ledger remembers every record's attempts
//! and outcome, so a restarted deliverer resumes where the last one
//! stopped, never sends a key with another body, and never re-sends
//! blindly a record the receiver may have applied after it forgot the key.
//! See `docs/delivery.md`.
#![warn(missing_docs)]

pub mod attempts;
pub mod dead_letters;
pub mod deliverer;
pub mod http;
pub mod ledger;
pub mod local_output;
pub mod postgres;
pub mod record;
pub mod resolve;
pub mod settings;
pub mod source;
pub mod status;

pub use deliverer::{DeliverError, RunOptions, RunSummary, run};
pub use ledger::Mirror;
pub use local_output::LocalOutput;
pub use settings::{DeliverSettings, SettingsError};
pub use source::{KafkaRecord, Line, Payload, Positions, Source, SourceError};
