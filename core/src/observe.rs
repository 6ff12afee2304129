//! Observation: what a running job reports (commits, aborts, swaps,
//! batches) to whoever listens (the host's status, metrics and plugin
//! history), and the counts of a run.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;

/// What one batch did to the transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Events applied.
    pub applied: u64,
    /// Events dead-lettered.
    pub dead_lettered: u64,
    /// Of them, refused by a period job's rules whatever the plugin
    /// (retries, late and future events): not held against a plugin
    /// version on trial.
    pub refused_by_rules: u64,
    /// Output records the batch added (dead letters not included).
    pub outputs: u64,
    /// Plugin calls that trapped or broke a limit.
    pub traps: u64,
    /// Why the first of them failed.
    pub first_failure: Option<String>,
}

/// What happened to a pushed plugin version.
#[derive(Debug, Clone, PartialEq)]
pub enum SwapEvent {
    /// The version was swapped in and runs its trial transaction.
    OnTrial {
        /// The version's digest.
        digest: String,
    },
    /// The version's first transaction committed: it is the job's plugin now.
    Activated {
        /// The version's digest.
        digest: String,
    },
    /// The version failed its trial transaction, which was aborted and is
    /// redone by `restored`.
    RolledBack {
        /// The version's digest.
        digest: String,
        /// The digest of the version put back.
        restored: String,
        /// Why.
        reason: String,
    },
    /// The version could not be instantiated; the job kept its plugin.
    Refused {
        /// The version's digest.
        digest: String,
        /// Why.
        reason: String,
    },
}

/// What a plugin instance has used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PluginUsage {
    /// CPU time spent in plugin calls (host calls it made included).
    pub cpu: Duration,
    /// Linear memory the instance holds now, in bytes.
    pub memory_bytes: u64,
    /// Traps and limit breaches so far.
    pub traps: u64,
}

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
    /// A period job's partitions after a commit (in Kafka mode the next
    /// transaction may have run a little further).
    fn periods(&self, _partitions: &[crate::periods::PartitionStatus]) {}
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

/// A job's state restore as it goes (Kafka mode: rebuilding RocksDB from
/// the changelog). The restorer updates it; the host's status, metrics and
/// log read it. It counts into prometheus gauges, so a served job's
/// metrics carry the same figures its status shows.
#[derive(Debug, Default)]
pub struct RestoreProgress {
    /// 1 while a restore runs.
    active: Gauge,
    /// Records applied by the restore running (or the last one).
    done: Gauge,
    /// Changelog offsets left to read, an upper bound on the records left
    /// (compaction and transaction markers leave gaps).
    remaining: Gauge,
    /// Records applied per second of the restore so far.
    rate: Gauge<f64, AtomicU64>,
    started: std::sync::Mutex<Option<Instant>>,
}

/// What a [`RestoreProgress`] shows while a restore runs.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RestoreSnapshot {
    /// Changelog records applied so far.
    pub records_done: u64,
    /// Changelog offsets left to read (an upper bound on the records left).
    pub records_to_go: u64,
    /// Records applied per second, since the restore started.
    pub records_per_second: f64,
    /// Estimated seconds until the restore ends, once a rate is known.
    pub seconds_left: Option<f64>,
}

impl RestoreProgress {
    /// Progress counting into the given gauges (a served job's metrics).
    pub fn counting_into(
        active: Gauge,
        done: Gauge,
        remaining: Gauge,
        rate: Gauge<f64, AtomicU64>,
    ) -> RestoreProgress {
        RestoreProgress { active, done, remaining, rate, started: std::sync::Mutex::default() }
    }

    /// A restore of at most `to_go` records starts.
    pub fn start(&self, to_go: u64) {
        *crate::sync::lock(&self.started) = Some(Instant::now());
        self.done.set(0);
        self.remaining.set(clamp(to_go));
        self.rate.set(0.0);
        self.active.set(1);
    }

    /// The restore has applied `done` records and has `to_go` offsets left.
    pub fn advance(&self, done: u64, to_go: u64) {
        let Some(started) = *crate::sync::lock(&self.started) else { return };
        self.done.set(clamp(done));
        self.remaining.set(clamp(to_go));
        self.rate.set(done as f64 / started.elapsed().as_secs_f64().max(1e-3));
    }

    /// The restore ended (done or failed).
    pub fn finish(&self) {
        crate::sync::lock(&self.started).take();
        self.remaining.set(0);
        self.active.set(0);
    }

    /// The figures now, while a restore runs.
    pub fn snapshot(&self) -> Option<RestoreSnapshot> {
        crate::sync::lock(&self.started).as_ref()?;
        let records_done = self.done.get().max(0) as u64;
        let records_to_go = self.remaining.get().max(0) as u64;
        let records_per_second = self.rate.get();
        let seconds_left =
            (records_per_second > 0.0).then(|| records_to_go as f64 / records_per_second);
        Some(RestoreSnapshot { records_done, records_to_go, records_per_second, seconds_left })
    }
}

impl std::fmt::Display for RestoreSnapshot {
    /// `1200000 records restored, at most 800000 to go, 950000 records/s, about 0.8 s left`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} records restored, at most {} to go, {:.0} records/s",
            self.records_done, self.records_to_go, self.records_per_second
        )?;
        match self.seconds_left {
            Some(seconds) => write!(f, ", about {seconds:.1} s left"),
            None => write!(f, ", time left not known yet"),
        }
    }
}

fn clamp(count: u64) -> i64 {
    count.min(i64::MAX as u64) as i64
}
