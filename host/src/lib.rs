//! Tally's host: runs user aggregation logic as sandboxed WebAssembly
//! components over streams, with exactly-once results.
//!
//! The data path, one module per step:
//! [`source`] → [`task`] → [`batch`] → [`plugin`] → [`transaction`] / [`overlay`] →
//! [`committer`] → [`sink`] and [`state_store`]. Kafka mode's source,
//! committer and changelog are in [`kafka`].
//!
//! ```no_run
//! use tally_host::{config::JobConfig, plugin::PluginRuntime, task::LocalTask};
//!
//! let job = JobConfig::from_file("billing.toml".as_ref())?;
//! let plugin = PluginRuntime::new()?.load_file(&job.plugin)?;
//! let summary = LocalTask::open(&job, &plugin)?.run()?;
//! println!("{} records, {} dead-lettered", summary.records, summary.dead_lettered);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod batch;
pub mod client;
pub mod committer;
pub mod config;
pub mod fair_share;
pub mod files;
pub mod hot_swap;
pub mod kafka;
pub mod lock;
pub mod metrics;
pub mod overlay;
pub mod plugin;
pub mod serve;
pub mod sink;
pub mod source;
pub mod state_store;
pub mod sync;
pub mod task;
pub mod testing;
pub mod transaction;
