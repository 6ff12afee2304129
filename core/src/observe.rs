//! Observation: what a running job reports (commits, aborts, swaps,
//! batches) to whoever listens (the host's status, metrics and plugin
//! history), and the counts of a run.

use std::time::{Duration, Instant};

use crate::batch::BatchOutcome;
use crate::hot_swap::SwapEvent;
use crate::plugin::PluginUsage;

/// What a job reports as it runs: commits, aborts, swaps. The host's
/// status, metrics and plugin history listen here.
pub trait JobObserver: Send + Sync {
    /// A transaction committed.
    fn committed(&self, _commit: &CommitReport) {}
    /// A transaction was aborted and its input will be read again.
    fn aborted(&self, _reason: &str) {}
    /// A plugin version was activated, rolled back or refused.
    fn swapped(&self, _event: &SwapEvent) {}
    /// A batch ran (counts are of that batch).
    fn batch(&self, _events: usize, _outcome: &BatchOutcome) {}
}

/// One committed transaction, as observers see it.
#[derive(Debug, Clone)]
pub struct CommitReport {
    /// When the commit finished.
    pub at: Instant,
    /// How long the commit took.
    pub took: Duration,
    /// Digest of the plugin version that produced the transaction.
    pub plugin_digest: String,
    /// Records behind the input's end after this commit, when known
    /// (Kafka: summed consumer lag in records; local: unread bytes).
    pub lag: Option<u64>,
    /// Plugin CPU time and memory so far.
    pub usage: PluginUsage,
    /// What the transaction carried: records read, outputs and dead letters
    /// written. (In Kafka mode the next transaction may already run.)
    pub carried: RunSummary,
}

/// An observer that ignores everything.
pub struct NoObserver;
impl JobObserver for NoObserver {}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Records read from the inputs in this run.
    pub records: u64,
    /// Records applied by the plugin.
    pub applied: u64,
    /// Records sent to the dead-letter output.
    pub dead_lettered: u64,
    /// Output records written (dead letters not included).
    pub outputs: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Whether the run stopped on request before the inputs' end (after
    /// committing everything it had processed).
    pub stopped_early: bool,
}

impl RunSummary {
    /// Counts a batch of `records` input records that the plugin processed.
    pub fn count_batch(&mut self, records: usize, outcome: &BatchOutcome) {
        self.records += records as u64;
        self.applied += outcome.applied;
        self.dead_lettered += outcome.dead_lettered;
        self.outputs += outcome.outputs;
    }

    /// Adds the counts of a later part of the same run.
    pub fn absorb(&mut self, later: &RunSummary) {
        self.records += later.records;
        self.applied += later.applied;
        self.dead_lettered += later.dead_lettered;
        self.outputs += later.outputs;
        self.commits += later.commits;
        self.stopped_early |= later.stopped_early;
    }

    /// One line for people: counts, commits, time and rate.
    pub fn describe(&self, job: &str) -> String {
        let seconds = self.elapsed.as_secs_f64();
        format!(
            "job `{job}`: {} records ({} applied, {} dead-lettered), {} outputs, {} commits in {seconds:.2}s ({:.0} records/s)",
            self.records,
            self.applied,
            self.dead_lettered,
            self.outputs,
            self.commits,
            self.records as f64 / seconds.max(1e-9)
        )
    }
}

