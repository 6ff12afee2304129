//! Per-job metrics in Prometheus text format, served at `/metrics` by
//! `tally serve`. Counts are of committed work: a transaction that is
//! aborted (and redone) is counted once, when its redo commits.

use std::sync::{Arc, Mutex};
use tally_core::sync::lock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use tally_core::batch::BatchOutcome;
use tally_core::hot_swap::SwapEvent;
use tally_core::observe::{CommitReport, RestoreProgress};
use tally_core::plugin::context::PluginMeters;

/// The content type of [`HostMetrics::render`]'s text.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4";

/// Labels of every job metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    /// The tenant owning the job.
    pub tenant: String,
    /// The job's name.
    pub job: String,
}

/// Labels of the plugin-version info metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabels {
    tenant: String,
    job: String,
    digest: String,
}

/// Labels of a period job's partition metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabels {
    tenant: String,
    job: String,
    partition: String,
}

/// Labels of what a period job's rules did in one partition.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeriodKindLabels {
    tenant: String,
    job: String,
    partition: String,
    kind: &'static str,
}

/// What the rules count, by the `kind` label.
const PERIOD_KINDS: [&str; 6] =
    ["final", "adjustment", "duplicate", "duplicate_conflict", "future", "too_old"];

/// The per-partition families of period jobs.
#[derive(Clone, Default)]
struct PeriodFamilies {
    watermark: Family<PartitionLabels, Gauge>,
    effective_watermark: Family<PartitionLabels, Gauge>,
    open: Family<PartitionLabels, Gauge>,
    seen_ids: Family<PartitionLabels, Gauge>,
    records: Family<PeriodKindLabels, Gauge>,
    /// The partitions each job reported, to forget them with the job.
    reported: Arc<Mutex<std::collections::HashMap<JobLabels, std::collections::BTreeSet<u32>>>>,
}

impl PeriodFamilies {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "period_watermark_seconds",
            "Period jobs: each partition's own watermark (the highest event time it accepted), Unix seconds",
            self.watermark.clone(),
        );
        registry.register(
            "period_effective_watermark_seconds",
            "Period jobs: the watermark each partition's periods close by (its own, or the one idleness closed it through), Unix seconds",
            self.effective_watermark.clone(),
        );
        registry.register(
            "period_open_periods",
            "Period jobs: periods not yet final, per partition",
            self.open.clone(),
        );
        registry.register(
            "period_seen_ids",
            "Period jobs: event ids remembered for de-duplication, per partition",
            self.seen_ids.clone(),
        );
        registry.register(
            "period_records",
            "Period jobs: FINALs and ADJUSTMENTs emitted and events the rules refused, by kind, per partition, since the job's periods were last read from its state",
            self.records.clone(),
        );
    }

    fn labels(job: &JobLabels, partition: u32) -> PartitionLabels {
        PartitionLabels {
            tenant: job.tenant.clone(),
            job: job.job.clone(),
            partition: partition.to_string(),
        }
    }

    fn set(&self, job: &JobLabels, partitions: &[tally_core::periods::PartitionStatus]) {
        lock(&self.reported)
            .entry(job.clone())
            .or_default()
            .extend(partitions.iter().map(|partition| partition.partition));
        for status in partitions {
            let labels = PeriodFamilies::labels(job, status.partition);
            let seconds = |at: Option<jiff::Timestamp>| at.map_or(0, |at| at.as_second());
            self.watermark.get_or_create(&labels).set(seconds(status.watermark));
            self.effective_watermark
                .get_or_create(&labels)
                .set(seconds(status.effective_watermark));
            self.open.get_or_create(&labels).set(status.open_periods as i64);
            self.seen_ids.get_or_create(&labels).set(status.seen_ids as i64);
            let counts = &status.counts;
            let values = [
                counts.finals,
                counts.adjustments,
                counts.duplicates,
                counts.conflicts,
                counts.future,
                counts.too_old,
            ];
            for (kind, value) in PERIOD_KINDS.into_iter().zip(values) {
                let labels = PeriodKindLabels {
                    tenant: labels.tenant.clone(),
                    job: labels.job.clone(),
                    partition: labels.partition.clone(),
                    kind,
                };
                self.records.get_or_create(&labels).set(value.min(i64::MAX as u64) as i64);
            }
        }
    }

    fn remove(&self, job: &JobLabels) {
        let Some(partitions) = lock(&self.reported).remove(job) else { return };
        for partition in partitions {
            let labels = PeriodFamilies::labels(job, partition);
            for family in [&self.watermark, &self.effective_watermark, &self.open, &self.seen_ids] {
                family.remove(&labels);
            }
            for kind in PERIOD_KINDS {
                self.records.remove(&PeriodKindLabels {
                    tenant: labels.tenant.clone(),
                    job: labels.job.clone(),
                    partition: labels.partition.clone(),
                    kind,
                });
            }
        }
    }
}

/// Labels of a served job's delivery metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabels {
    tenant: String,
    job: String,
    output: String,
}

/// Labels of a delivery's records in one state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryStateLabels {
    tenant: String,
    job: String,
    output: String,
    state: &'static str,
}

/// A delivery's records, by the `state` label.
const DELIVERY_STATES: [&str; 4] = ["delivered", "retrying", "unknown", "failed"];

/// The per-output families of served jobs' deliveries, set from each
/// delivery's status when `/metrics` is read.
#[derive(Clone, Default)]
struct DeliveryFamilies {
    records: Family<DeliveryStateLabels, Gauge>,
    oldest_unsettled: Family<DeliveryLabels, Gauge>,
    latency_p50: Family<DeliveryLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    latency_p99: Family<DeliveryLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    running: Family<DeliveryLabels, Gauge>,
    /// The outputs each job reported, to forget them with the job.
    reported: Arc<Mutex<std::collections::HashMap<JobLabels, std::collections::BTreeSet<String>>>>,
}

impl DeliveryFamilies {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "delivery_records",
            "Served jobs' deliveries: records by state in the delivery's ledger (delivered, retrying, unknown: waiting for an operator, failed: dead letters)",
            self.records.clone(),
        );
        registry.register(
            "delivery_oldest_unsettled_seconds",
            "Served jobs' deliveries: age of the oldest record sent and not settled (0: none)",
            self.oldest_unsettled.clone(),
        );
        registry.register(
            "delivery_latency_p50_seconds",
            "Served jobs' deliveries: median time from a record's first request to its delivery, over the last 1,024",
            self.latency_p50.clone(),
        );
        registry.register(
            "delivery_latency_p99_seconds",
            "Served jobs' deliveries: 99th percentile of the same",
            self.latency_p99.clone(),
        );
        registry.register(
            "delivery_running",
            "Served jobs' deliveries: 1 while the deliverer runs, 0 while it waits to restart after a failure",
            self.running.clone(),
        );
    }

    fn set(&self, job: &JobLabels, status: &crate::serve::delivery_runner::DeliveryStatus) {
        lock(&self.reported).entry(job.clone()).or_default().insert(status.output.clone());
        let labels = DeliveryLabels {
            tenant: job.tenant.clone(),
            job: job.job.clone(),
            output: status.output.clone(),
        };
        let ledger = &status.ledger;
        let counts = [ledger.delivered, ledger.retrying, ledger.unknown, ledger.failed];
        for (state, count) in DELIVERY_STATES.into_iter().zip(counts) {
            let labels = DeliveryStateLabels {
                tenant: job.tenant.clone(),
                job: job.job.clone(),
                output: status.output.clone(),
                state,
            };
            self.records.get_or_create(&labels).set(count.min(i64::MAX as u64) as i64);
        }
        let oldest = ledger.oldest_unsettled_age_s.unwrap_or(0);
        self.oldest_unsettled.get_or_create(&labels).set(oldest.min(i64::MAX as u64) as i64);
        if let Some(stats) = &ledger.stats {
            self.latency_p50.get_or_create(&labels).set(stats.latency_p50_ms as f64 / 1000.0);
            self.latency_p99.get_or_create(&labels).set(stats.latency_p99_ms as f64 / 1000.0);
        }
        self.running.get_or_create(&labels).set(i64::from(status.state == "running"));
    }

    fn remove(&self, job: &JobLabels) {
        let Some(outputs) = lock(&self.reported).remove(job) else { return };
        for output in outputs {
            let labels =
                DeliveryLabels { tenant: job.tenant.clone(), job: job.job.clone(), output };
            for state in DELIVERY_STATES {
                self.records.remove(&DeliveryStateLabels {
                    tenant: labels.tenant.clone(),
                    job: labels.job.clone(),
                    output: labels.output.clone(),
                    state,
                });
            }
            self.oldest_unsettled.remove(&labels);
            self.latency_p50.remove(&labels);
            self.latency_p99.remove(&labels);
            self.running.remove(&labels);
        }
    }
}

type Counters = Family<JobLabels, Counter>;
type Gauges = Family<JobLabels, Gauge>;

fn commit_histogram() -> Histogram {
    // 1 ms to ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Every job's metrics, in one registry.
pub struct HostMetrics {
    registry: Registry,
    records_in: Counters,
    records_out: Counters,
    dead_letters: Counters,
    commits: Counters,
    aborts: Counters,
    commit_seconds: Family<JobLabels, Histogram, fn() -> Histogram>,
    consumer_lag: Gauges,
    input_lag_bytes: Gauges,
    plugin_cpu_seconds: Family<JobLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
    plugin_memory: Gauges,
    traps: Counters,
    cpu_budget_breaches: Counters,
    log_lines_dropped: Counters,
    swaps: Counters,
    rollbacks: Counters,
    running: Gauges,
    plugin_info: Family<PluginLabels, Gauge>,
    restoring: Gauges,
    restore_records_done: Gauges,
    restore_records_to_go: Gauges,
    restore_records_per_second: Family<JobLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    periods: PeriodFamilies,
    deliveries: DeliveryFamilies,
}

impl Default for HostMetrics {
    fn default() -> Self {
        HostMetrics::new()
    }
}

impl HostMetrics {
    /// An empty registry with every family registered.
    pub fn new() -> HostMetrics {
        let mut registry = Registry::with_prefix("tally");
        let metrics = HostMetrics {
            records_in: Counters::default(),
            records_out: Counters::default(),
            dead_letters: Counters::default(),
            commits: Counters::default(),
            aborts: Counters::default(),
            commit_seconds: Family::new_with_constructor(commit_histogram),
            consumer_lag: Gauges::default(),
            input_lag_bytes: Gauges::default(),
            plugin_cpu_seconds: Family::default(),
            plugin_memory: Gauges::default(),
            traps: Counters::default(),
            cpu_budget_breaches: Counters::default(),
            log_lines_dropped: Counters::default(),
            swaps: Counters::default(),
            rollbacks: Counters::default(),
            running: Gauges::default(),
            plugin_info: Family::default(),
            restoring: Gauges::default(),
            restore_records_done: Gauges::default(),
            restore_records_to_go: Gauges::default(),
            restore_records_per_second: Family::default(),
            periods: PeriodFamilies::default(),
            deliveries: DeliveryFamilies::default(),
            registry: Registry::default(),
        };
        registry.register(
            "records_in",
            "Input records in committed transactions (dead-lettered ones included)",
            metrics.records_in.clone(),
        );
        registry.register(
            "records_out",
            "Output records committed (dead letters not included)",
            metrics.records_out.clone(),
        );
        registry.register(
            "dead_letters",
            "Records committed to the dead-letter output",
            metrics.dead_letters.clone(),
        );
        registry.register("commits", "Transactions committed", metrics.commits.clone());
        registry.register(
            "aborts",
            "Transactions aborted and redone (Kafka errors, plugin rollbacks)",
            metrics.aborts.clone(),
        );
        registry.register(
            "commit_seconds",
            "Time to commit one transaction",
            metrics.commit_seconds.clone(),
        );
        registry.register(
            "consumer_lag_records",
            "Kafka jobs: records between the consumer and the ends of its partitions",
            metrics.consumer_lag.clone(),
        );
        registry.register(
            "input_lag_bytes",
            "Local jobs: bytes of the input files not read yet",
            metrics.input_lag_bytes.clone(),
        );
        registry.register(
            "plugin_cpu_seconds",
            "CPU time spent in plugin calls, counted as they run",
            metrics.plugin_cpu_seconds.clone(),
        );
        registry.register(
            "plugin_memory_bytes",
            "Memory (linear memories, tables) the plugin instance holds",
            metrics.plugin_memory.clone(),
        );
        registry.register(
            "plugin_traps",
            "Plugin calls that trapped or broke a limit, counted as they happen",
            metrics.traps.clone(),
        );
        registry.register(
            "plugin_cpu_budget_breaches",
            "Plugin calls stopped for exceeding their CPU budget",
            metrics.cpu_budget_breaches.clone(),
        );
        registry.register(
            "plugin_log_lines_dropped",
            "Plugin log lines dropped by the job's rate limit",
            metrics.log_lines_dropped.clone(),
        );
        registry.register(
            "plugin_swaps",
            "Plugin versions activated by a hot swap",
            metrics.swaps.clone(),
        );
        registry.register(
            "plugin_rollbacks",
            "Plugin versions rolled back after failing their first transaction",
            metrics.rollbacks.clone(),
        );
        registry.register(
            "job_running",
            "1 while the job is processing, 0 when paused, failed or stopped",
            metrics.running.clone(),
        );
        registry.register(
            "plugin_info",
            "The plugin version a job runs (value 1)",
            metrics.plugin_info.clone(),
        );
        registry.register(
            "restoring",
            "Kafka jobs: 1 while the job rebuilds its state from the changelog",
            metrics.restoring.clone(),
        );
        registry.register(
            "restore_records_done",
            "Kafka jobs: changelog records applied by the restore running (or the last one)",
            metrics.restore_records_done.clone(),
        );
        registry.register("restore_records_to_go", "Kafka jobs: changelog offsets the restore running has left to read (an upper bound on its records)", metrics.restore_records_to_go.clone());
        registry.register(
            "restore_records_per_second",
            "Kafka jobs: records the restore running (or the last one) applied per second",
            metrics.restore_records_per_second.clone(),
        );
        metrics.periods.register(&mut registry);
        metrics.deliveries.register(&mut registry);
        HostMetrics { registry, ..metrics }
    }

    /// The registry in Prometheus text format.
    pub fn render(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }

    /// Handles to one job's metrics.
    pub fn job(&self, tenant: &str, job: &str) -> JobMetrics {
        let labels = JobLabels { tenant: tenant.to_string(), job: job.to_string() };
        JobMetrics {
            records_in: self.records_in.get_or_create(&labels).clone(),
            records_out: self.records_out.get_or_create(&labels).clone(),
            dead_letters: self.dead_letters.get_or_create(&labels).clone(),
            commits: self.commits.get_or_create(&labels).clone(),
            aborts: self.aborts.get_or_create(&labels).clone(),
            commit_seconds: self.commit_seconds.get_or_create(&labels).clone(),
            consumer_lag: self.consumer_lag.get_or_create(&labels).clone(),
            input_lag_bytes: self.input_lag_bytes.get_or_create(&labels).clone(),
            plugin_cpu_seconds: self.plugin_cpu_seconds.get_or_create(&labels).clone(),
            plugin_memory: self.plugin_memory.get_or_create(&labels).clone(),
            traps: self.traps.get_or_create(&labels).clone(),
            cpu_budget_breaches: self.cpu_budget_breaches.get_or_create(&labels).clone(),
            log_lines_dropped: self.log_lines_dropped.get_or_create(&labels).clone(),
            swaps: self.swaps.get_or_create(&labels).clone(),
            rollbacks: self.rollbacks.get_or_create(&labels).clone(),
            running: self.running.get_or_create(&labels).clone(),
            plugin_info: self.plugin_info.clone(),
            restore: Arc::new(RestoreProgress::counting_into(
                self.restoring.get_or_create(&labels).clone(),
                self.restore_records_done.get_or_create(&labels).clone(),
                self.restore_records_to_go.get_or_create(&labels).clone(),
                self.restore_records_per_second.get_or_create(&labels).clone(),
            )),
            periods: self.periods.clone(),
            deliveries: self.deliveries.clone(),
            labels,
            pending: Mutex::default(),
        }
    }

    /// Forgets a deleted job.
    pub fn remove(&self, labels: &JobLabels, digest: &str) {
        for family in [
            &self.records_in,
            &self.records_out,
            &self.dead_letters,
            &self.commits,
            &self.aborts,
            &self.traps,
            &self.cpu_budget_breaches,
            &self.log_lines_dropped,
            &self.swaps,
            &self.rollbacks,
        ] {
            family.remove(labels);
        }
        for family in [
            &self.consumer_lag,
            &self.input_lag_bytes,
            &self.plugin_memory,
            &self.running,
            &self.restoring,
            &self.restore_records_done,
            &self.restore_records_to_go,
        ] {
            family.remove(labels);
        }
        self.commit_seconds.remove(labels);
        self.plugin_cpu_seconds.remove(labels);
        self.restore_records_per_second.remove(labels);
        self.plugin_info.remove(&plugin_labels(labels, digest));
        self.periods.remove(labels);
        self.deliveries.remove(labels);
    }
}

fn plugin_labels(labels: &JobLabels, digest: &str) -> PluginLabels {
    PluginLabels {
        tenant: labels.tenant.clone(),
        job: labels.job.clone(),
        digest: digest.to_string(),
    }
}

/// One job's metrics; updated by the job's observer.
pub struct JobMetrics {
    /// The job's labels.
    pub labels: JobLabels,
    records_in: Counter,
    records_out: Counter,
    dead_letters: Counter,
    commits: Counter,
    aborts: Counter,
    commit_seconds: Histogram,
    consumer_lag: Gauge,
    input_lag_bytes: Gauge,
    plugin_cpu_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    plugin_memory: Gauge,
    traps: Counter,
    cpu_budget_breaches: Counter,
    log_lines_dropped: Counter,
    swaps: Counter,
    rollbacks: Counter,
    running: Gauge,
    plugin_info: Family<PluginLabels, Gauge>,
    /// The job's restore progress, counting into its restore gauges.
    pub restore: Arc<RestoreProgress>,
    /// Counts of the open transaction.
    pending: Mutex<Pending>,
    periods: PeriodFamilies,
    deliveries: DeliveryFamilies,
}

#[derive(Default)]
struct Pending {
    records: u64,
    outputs: u64,
    dead_letters: u64,
}

impl JobMetrics {
    /// Meters for the job's plugin calls that count into these metrics as
    /// the calls run (CPU, traps, budget breaches, memory).
    pub fn plugin_meters(&self) -> PluginMeters {
        PluginMeters::counting_into(
            self.plugin_cpu_seconds.clone(),
            self.traps.clone(),
            self.cpu_budget_breaches.clone(),
            self.log_lines_dropped.clone(),
            self.plugin_memory.clone(),
        )
    }

    /// The counter of the job's dropped plugin log lines.
    pub fn log_lines_dropped(&self) -> Counter {
        self.log_lines_dropped.clone()
    }

    /// A batch ran in the open transaction.
    pub fn batch(&self, events: usize, outcome: &BatchOutcome) {
        let mut pending = lock(&self.pending);
        pending.records += events as u64;
        pending.outputs += outcome.outputs;
        pending.dead_letters += outcome.dead_lettered;
    }

    /// A transaction committed; returns the records it held. Batches of
    /// the next transaction may have run already: they stay pending.
    pub fn committed(&self, commit: &CommitReport, kafka: bool) -> u64 {
        let mut pending = lock(&self.pending);
        let carried = &commit.carried;
        pending.records = pending.records.saturating_sub(carried.records);
        pending.outputs = pending.outputs.saturating_sub(carried.outputs);
        pending.dead_letters = pending.dead_letters.saturating_sub(carried.dead_lettered);
        let records = carried.records;
        self.records_in.inc_by(records);
        self.records_out.inc_by(carried.outputs);
        self.dead_letters.inc_by(carried.dead_lettered);
        self.commits.inc();
        self.commit_seconds.observe(commit.took.as_secs_f64());
        if let Some(lag) = commit.lag {
            let gauge = if kafka { &self.consumer_lag } else { &self.input_lag_bytes };
            gauge.set(lag.min(i64::MAX as u64) as i64);
        }
        records
    }

    /// The open transaction was aborted: its counts are dropped (its redo counts).
    pub fn aborted(&self) {
        let mut pending = lock(&self.pending);
        if pending.records == 0 {
            return; // nothing was open
        }
        self.aborts.inc();
        pending.records = 0;
        pending.outputs = 0;
        pending.dead_letters = 0;
    }

    /// A plugin version was activated or rolled back.
    pub fn swapped(&self, event: &SwapEvent) {
        match event {
            SwapEvent::Activated { .. } => self.swaps.inc(),
            SwapEvent::RolledBack { .. } => self.rollbacks.inc(),
            SwapEvent::OnTrial { .. } | SwapEvent::Refused { .. } => 0,
        };
    }

    /// Reports `digest` as the job's plugin version instead of `previous`.
    pub fn set_plugin_info(&self, previous: &str, digest: &str) {
        self.plugin_info.remove(&plugin_labels(&self.labels, previous));
        self.plugin_info.get_or_create(&plugin_labels(&self.labels, digest)).set(1);
    }

    /// A period job's partitions after a commit.
    pub fn periods(&self, partitions: &[tally_core::periods::PartitionStatus]) {
        self.periods.set(&self.labels, partitions);
    }

    /// Sets the metrics of one of the job's deliveries from its status.
    pub fn delivery(&self, status: &crate::serve::delivery_runner::DeliveryStatus) {
        self.deliveries.set(&self.labels, status);
    }

    /// Whether the job is processing.
    pub fn set_running(&self, running: bool) {
        self.running.set(i64::from(running));
    }

    /// Commits so far.
    pub fn commits(&self) -> u64 {
        self.commits.get()
    }

    /// Rollbacks so far.
    pub fn rollbacks(&self) -> u64 {
        self.rollbacks.get()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use tally_core::batch::BatchOutcome;
    use tally_core::observe::RunSummary;

    fn commit_of(records: u64, outputs: u64) -> CommitReport {
        CommitReport {
            at: Instant::now(),
            took: Duration::from_millis(1),
            plugin_digest: "sha256:test".to_string(),
            lag: None,
            usage: Default::default(),
            carried: RunSummary { records, applied: records, outputs, ..RunSummary::default() },
        }
    }

    #[test]
    fn a_commit_counts_its_own_transaction_and_leaves_the_next_one_pending() {
        let metrics = HostMetrics::new().job("acme", "billing");
        let batch = |events: u64| BatchOutcome {
            applied: events,
            outputs: events,
            ..BatchOutcome::default()
        };
        metrics.batch(10, &batch(10));
        // Kafka mode: the next transaction runs while this one commits.
        metrics.batch(4, &batch(4));
        assert_eq!(metrics.committed(&commit_of(10, 10), true), 10);
        assert_eq!((metrics.records_in.get(), metrics.records_out.get()), (10, 10));
        // The next transaction aborts: its counts go, the first one's stay.
        metrics.aborted();
        assert_eq!((metrics.records_in.get(), metrics.aborts.get()), (10, 1));
        metrics.batch(4, &batch(4));
        assert_eq!(metrics.committed(&commit_of(4, 4), true), 4);
        assert_eq!(
            (metrics.records_in.get(), metrics.records_out.get(), metrics.commits.get()),
            (14, 14, 2)
        );
    }
}
