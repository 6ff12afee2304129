//! The plugin runtime: compiles a component once, checks it, and runs it in
//! sandboxed instances, one per task.
//!
//! Every instance has its own `Store` with a memory limit (all its linear
//! memories together) and a CPU budget per batch: a ticker thread advances
//! the engine's epoch every [`EPOCH_TICK`], and at each tick the store
//! compares the thread's CPU time spent in the call with the budget (fuel
//! metering measured 40% slower on the billing job). A plugin that breaks
//! either is stopped, not the host. The
//! engine is configured for determinism (no threads: the feature is not
//! compiled in; deterministic relaxed SIMD), and a plugin can reach nothing
//! but the `tally:plugin` imports, so re-running a batch gives the same
//! result. NaN canonicalization is off: it cost 17% of the billing job's
//! CPU, and without it only the payload bits of NaNs can differ, and only
//! between CPU architectures, never between runs on one host.
//!
//! One job per module: `runtime` (the engine, its epoch ticker, compiling,
//! checking and caching components), `store` (what an instance's `Store`
//! holds and the limits it enforces), `host_imports` (the `tally:plugin`
//! imports a plugin calls), `instance` (instantiating a loaded plugin and
//! calling it on a batch); `check` and `contract` refuse what the host
//! would not run, `compiler` compiles uploads in a bounded worker.

mod bindings;
pub mod check;
pub mod compiler;
pub mod context;
pub mod contract;
mod host_imports;
mod instance;
pub mod period_processor;
pub mod periods;
mod runtime;
mod store;

use sha2::{Digest, Sha256};

pub use bindings::periods::{EventFacts as DescribedEvent, EventTime};
pub use bindings::{Event, PERIODS_WIT_VERSION, Rejection, WIT_PACKAGE, WIT_VERSION};
pub use check::{ComponentInfo, PluginError, PluginKind};
pub use context::{JobContext, StopSignal};
pub use instance::{LoadedPlugin, PluginInstance};
pub use runtime::{Inspection, PluginRuntime};
pub use store::{MAX_ENTRIES_PER_CALL, StoreData};

#[cfg(doc)]
use crate::limits::EPOCH_TICK;
pub use crate::observe::PluginUsage;
use crate::state::StateError;
use crate::transaction::Transaction;

/// Why a batch failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The plugin misbehaved on this batch (trap, budget, limit); the
    /// message is the dead-letter reason if one event is to blame.
    #[error("{0}")]
    Plugin(String),
    /// The host failed (state store); not the plugin's fault.
    #[error(transparent)]
    Host(#[from] StateError),
    /// The job and the plugin disagree (an undeclared output); the job must stop.
    #[error("{0}")]
    Misconfigured(String),
    /// The plugin could not be re-instantiated after a failure.
    #[error(transparent)]
    Instantiate(#[from] PluginError),
    /// The job was asked to stop, and the call was interrupted: its batch
    /// (and transaction) must be dropped and read again by the next run.
    #[error("the job was asked to stop during a plugin call")]
    Stopped,
    /// The plugin failed on too many events in a row: it is broken, and the
    /// job must stop rather than dead-letter its whole input.
    #[error("{0}")]
    FailingInARow(String),
}

/// Something that turns a batch of events into state changes and outputs
/// recorded in a [`Transaction`]: a Wasm plugin instance, or (for
/// benchmarks) the same logic compiled natively.
pub trait Processor {
    /// Processes `events` in order; returns the events the plugin refused.
    /// On `Err`, the caller must drop the batch from the transaction.
    fn process(
        &mut self,
        events: &[Event],
        txn: &mut Transaction,
    ) -> Result<Vec<Rejection>, ProcessError>;

    /// The digest that identifies the running code in output lineage.
    fn digest(&self) -> &str;

    /// CPU time and memory used so far (zero for native processors).
    fn usage(&self) -> PluginUsage {
        PluginUsage::default()
    }

    /// The contract of the code running: a new version must be of the same.
    fn kind(&self) -> PluginKind {
        PluginKind::Process
    }

    /// The open transaction was dropped, to be redone: what the processor
    /// counted of it (failures in a row) counts again when it happens again.
    fn transaction_dropped(&mut self) {}

    /// The open transaction is about to commit: does what is due at its
    /// end (a period job's ADJUSTMENTs) in it.
    fn end_transaction(&mut self, txn: &mut Transaction) -> Result<(), ProcessError> {
        let _ = txn;
        Ok(())
    }

    /// The job's partitions `idle` have read to their end and stayed there
    /// (see `docs/periods.md`): closes what idleness closes (a period job's
    /// FINALs) in the open transaction, which carries no input for it.
    fn close_idle(&mut self, txn: &mut Transaction, idle: &[u32]) -> Result<(), ProcessError> {
        let _ = (txn, idle);
        Ok(())
    }
}

/// The digest that identifies plugin bytes in lineage: `sha256:<hex>`.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}
