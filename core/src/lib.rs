//! Tally's engine, shared by every driver: the plugin runtime and its
//! sandbox, keyed state behind a trait, the transaction that holds one
//! commit's work, batch processing, hot loading, observation, and the
//! [`task::Task`] that owns the order of a transaction's steps.
//!
//! It depends on no RocksDB, no Kafka client and no HTTP stack: drivers
//! (`tally-state-rocks`, the host's local and Kafka modes) and the plugin
//! test driver (`tally-testing`) build on it. The data path:
//! [`plugin`] → [`batch`] → [`transaction`] / [`overlay`] → [`state`],
//! ordered by [`task`]. See `docs/architecture.md`.
#![warn(missing_docs)]

pub mod batch;
pub mod commit;
pub mod fair_share;
pub mod files;
pub mod hot_swap;
pub mod limits;
pub mod lock;
pub mod observe;
pub mod overlay;
pub mod periods;
pub mod plugin;
pub mod settings;
pub mod state;
pub mod sync;
pub mod task;
pub mod text;
pub mod transaction;
