//! Tally's host: the job file, one [`job::Job`] trait over both drivers
//! (`tally-local`, `tally-kafka`), `tally serve` and its client.
//!
//! - The job file, its mode-independent settings and its mode: [`config`].
//! - Many tenants' jobs in one process, with an admin API: [`serve`].
//! - The admin API's client: [`client`].
//! - Where a delivery (`tally deliver`, a served job's `[[deliver]]`)
//!   reads a job's committed output from: [`delivery`], [`deliver_kafka`].
//! - Output versions (`tally replay`, `tally diff`, `tally promote`):
//!   [`versions`], [`diff`], [`replay_start`], [`promote`], [`promotion`].
//! - `/metrics` for the one job `tally run` runs: [`run_metrics`].
//!
//! The dependencies point one way: the `tally` binary → [`serve`] → the
//! drivers (`tally-local`, `tally-kafka`) → `tally-state-rocks` →
//! `tally-core`. See `docs/architecture.md`.
//!
//! ```no_run
//! use tally_core::plugin::PluginRuntime;
//! use tally_host::config::JobConfig;
//! use tally_local::LocalTask;
//!
//! let job = JobConfig::from_file("billing.toml".as_ref())?;
//! let plugin = PluginRuntime::new()?.load_file(&job.settings.plugin)?;
//! let summary = LocalTask::open(&job.settings, job.local()?, &plugin)?.run()?;
//! println!("{} records, {} dead-lettered", summary.records, summary.dead_lettered);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub mod client;
pub mod config;
pub mod deliver_kafka;
pub mod delivery;
pub mod diff;
pub mod job;
mod metrics;
pub mod promote;
pub mod promotion;
pub mod replay_start;
pub mod run_metrics;
pub mod serve;
pub mod versions;
