//! Tally's host: the drivers that run a job over real inputs and outputs,
//! on the engine in `tally-core`, and `tally serve`.
//!
//! - Local mode (NDJSON files): [`local`], state in `tally-state-rocks`.
//! - Kafka mode (topics, exactly once by Kafka transactions): [`kafka`].
//! - Many tenants' jobs in one process, with an admin API: [`serve`].
//! - The admin API's client: [`client`].
//!
//! The dependencies point one way: the `tally` binary → [`serve`] → the
//! drivers → `tally-core`. See `docs/architecture.md`.
//!
//! ```no_run
//! use tally_core::plugin::PluginRuntime;
//! use tally_host::{config::JobConfig, local::LocalTask};
//!
//! let job = JobConfig::from_file("billing.toml".as_ref())?;
//! let plugin = PluginRuntime::new()?.load_file(&job.plugin)?;
//! let summary = LocalTask::open(&job, &plugin)?.run()?;
//! println!("{} records, {} dead-lettered", summary.records, summary.dead_lettered);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub mod client;
pub mod config;
pub mod job;
pub mod kafka;
pub mod local;
pub mod lock;
mod metrics;
pub mod serve;
