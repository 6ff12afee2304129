//! What a job hands each instance of its plugin besides the limits: a way
//! to stop a call mid-way, its seat in the host's CPU sharing, its log
//! channel, and the meters its status and metrics read as calls run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::fair_share::CpuSeat;
use crate::sync::lock;
use crate::text::{MAX_REASON_BYTES, sanitize};

/// Set to make a job stop: between batches, and within a plugin call at
/// its next epoch tick (the call is interrupted and its transaction redone
/// by the next run).
pub type StopSignal = Arc<AtomicBool>;

/// A job's plugin instances' shared surroundings. Cheap to clone.
#[derive(Clone)]
pub struct JobContext {
    /// Stops the job, even inside a plugin call.
    pub stop: StopSignal,
    /// The job thread's seat in the host's CPU sharing (`tally serve`).
    pub seat: Option<Arc<CpuSeat>>,
    /// Where the plugin's log lines go.
    pub log: Arc<PluginLog>,
    /// What the job's plugin calls use, as they run.
    pub meters: Arc<PluginMeters>,
    /// The job file's `[plugin_config]` as JSON (`{}` when it has none),
    /// handed to a period plugin when it starts.
    pub plugin_config: Arc<str>,
}

impl JobContext {
    /// The context of job `job` (its name in log lines), with no CPU seat.
    pub fn new(job: &str) -> JobContext {
        JobContext::with(
            Arc::new(AtomicBool::new(false)),
            None,
            PluginLog::new(None, job, LogLimits::default()),
            PluginMeters::default(),
        )
    }

    /// A context of the given parts.
    pub fn with(
        stop: StopSignal,
        seat: Option<Arc<CpuSeat>>,
        log: PluginLog,
        meters: PluginMeters,
    ) -> JobContext {
        JobContext {
            stop,
            seat,
            log: Arc::new(log),
            meters: Arc::new(meters),
            plugin_config: Arc::from("{}"),
        }
    }

    /// The same context, handing `config` (JSON) to period plugins.
    pub fn with_plugin_config(mut self, config: &str) -> JobContext {
        self.plugin_config = Arc::from(config);
        self
    }

    /// Whether the job was asked to stop.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Takes (or keeps) the job thread's CPU seat before work; returns at
    /// once when the job is stopping.
    pub fn run(&self) {
        if let Some(seat) = &self.seat {
            seat.run(&self.stop);
        }
    }

    /// Counts a plugin call for the job's CPU seat (a job whose calls mostly
    /// fail is demoted: see [`crate::fair_share`]).
    pub fn report_call(&self, cpu: Duration, failed: bool) {
        if let Some(seat) = &self.seat {
            seat.report_call(cpu, failed);
        }
    }

    /// Asks the job to stop: between batches, inside a plugin call at its
    /// next epoch tick, and while it waits for a CPU seat.
    pub fn stop_now(&self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(seat) = &self.seat {
            seat.wake();
        }
    }

    /// Gives the CPU seat up: the job thread is about to wait (for input,
    /// a commit, a pause), so another job of its tenant may run.
    pub fn idle(&self) {
        if let Some(seat) = &self.seat {
            seat.idle();
        }
    }
}

/// Counts and gauges of a job's plugin calls, updated while they run (not
/// only at commits), so a plugin stuck in a loop shows in status and
/// metrics at once. Each is shared with the job's metrics, when it has some.
#[derive(Default)]
pub struct PluginMeters {
    /// CPU time spent in plugin calls (their host calls included).
    pub cpu_seconds: Counter<f64, AtomicU64>,
    /// Plugin calls that trapped or broke a limit.
    pub traps: Counter,
    /// Plugin calls stopped for exceeding their CPU budget.
    pub cpu_budget_breaches: Counter,
    /// Plugin log lines dropped by the rate limit.
    pub log_lines_dropped: Counter,
    /// Memory (linear memories and tables) the current instance holds.
    pub memory_bytes: Gauge,
    /// The last failure of a plugin call, with when it happened.
    last_failure: Mutex<Option<(Instant, String)>>,
}

impl PluginMeters {
    /// Meters counting into the given counters and gauge (a job's metrics).
    pub fn counting_into(
        cpu_seconds: Counter<f64, AtomicU64>,
        traps: Counter,
        cpu_budget_breaches: Counter,
        log_lines_dropped: Counter,
        memory_bytes: Gauge,
    ) -> PluginMeters {
        PluginMeters {
            cpu_seconds,
            traps,
            cpu_budget_breaches,
            log_lines_dropped,
            memory_bytes,
            last_failure: Mutex::default(),
        }
    }

    /// Records why a plugin call failed.
    pub fn failed(&self, reason: &str) {
        self.traps.inc();
        *lock(&self.last_failure) = Some((Instant::now(), sanitize(reason, MAX_REASON_BYTES)));
    }

    /// The last failure of a plugin call and how long ago it was.
    pub fn last_failure(&self) -> Option<(Duration, String)> {
        lock(&self.last_failure).as_ref().map(|(at, reason)| (at.elapsed(), reason.clone()))
    }
}

/// Bounds on a job's plugin log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimits {
    /// Lines per second a plugin may log (more are dropped and counted).
    pub lines_per_second: u32,
    /// Longest line kept, in bytes; longer lines are cut.
    pub max_line_bytes: usize,
}

/// Plugin log lines per second when the host does not say.
pub const DEFAULT_LOG_LINES_PER_SECOND: u32 = 100;
/// Longest plugin log line kept when the host does not say.
pub const DEFAULT_MAX_LOG_LINE_BYTES: usize = 1024;

impl Default for LogLimits {
    fn default() -> Self {
        LogLimits {
            lines_per_second: DEFAULT_LOG_LINES_PER_SECOND,
            max_line_bytes: DEFAULT_MAX_LOG_LINE_BYTES,
        }
    }
}

/// A job's plugin log: lines tagged with the tenant and job, cut to a
/// length, escaped so that no line can forge another, and rate-limited
/// (a token bucket holding one second of lines).
pub struct PluginLog {
    tenant: Option<String>,
    job: String,
    limits: LogLimits,
    bucket: Mutex<Bucket>,
    dropped: Counter,
}

struct Bucket {
    tokens: f64,
    at: Instant,
    dropped_since_said: u64,
    said_at: Instant,
}

impl PluginLog {
    /// The log of `tenant`'s job `job` (no tenant under `tally run`).
    pub fn new(tenant: Option<&str>, job: &str, limits: LogLimits) -> PluginLog {
        let now = Instant::now();
        PluginLog {
            tenant: tenant.map(str::to_string),
            job: job.to_string(),
            limits,
            bucket: Mutex::new(Bucket {
                tokens: f64::from(limits.lines_per_second),
                at: now,
                dropped_since_said: 0,
                said_at: now,
            }),
            dropped: Counter::default(),
        }
    }

    /// Counts dropped lines in `counter` too (the job's metric).
    pub fn count_drops_in(mut self, counter: Counter) -> PluginLog {
        self.dropped = counter;
        self
    }

    /// Lines dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// Writes one plugin line at `level`, if the rate allows.
    pub fn write(&self, level: tracing::Level, message: &str) {
        if !self.admit() {
            return;
        }
        let line = sanitize(message, self.limits.max_line_bytes);
        let tenant = self.tenant.as_deref().unwrap_or("");
        let job = self.job.as_str();
        match level {
            tracing::Level::ERROR => {
                tracing::error!(target: "tally::plugin", tenant, job, "{line}")
            }
            tracing::Level::WARN => tracing::warn!(target: "tally::plugin", tenant, job, "{line}"),
            tracing::Level::INFO => tracing::info!(target: "tally::plugin", tenant, job, "{line}"),
            tracing::Level::DEBUG => {
                tracing::debug!(target: "tally::plugin", tenant, job, "{line}")
            }
            tracing::Level::TRACE => {
                tracing::trace!(target: "tally::plugin", tenant, job, "{line}")
            }
        }
    }

    fn admit(&self) -> bool {
        let mut bucket = lock(&self.bucket);
        let now = Instant::now();
        let rate = f64::from(self.limits.lines_per_second);
        bucket.tokens =
            (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(rate.max(1.0));
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return true;
        }
        self.dropped.inc();
        bucket.dropped_since_said += 1;
        // Said once a second at most, by the host (not as a plugin line).
        if now.duration_since(bucket.said_at) >= Duration::from_secs(1) {
            let dropped = std::mem::take(&mut bucket.dropped_since_said);
            bucket.said_at = now;
            tracing::warn!(
                tenant = self.tenant.as_deref().unwrap_or(""),
                job = %self.job,
                dropped,
                limit = self.limits.lines_per_second,
                "plugin log lines dropped: over the job's rate limit of lines per second"
            );
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_rate_limited() {
        let log = PluginLog::new(
            Some("acme"),
            "billing",
            LogLimits { lines_per_second: 5, max_line_bytes: 64 },
        );
        for _ in 0..20 {
            log.write(tracing::Level::INFO, "line");
        }
        assert!(
            log.dropped() >= 14,
            "a burst beyond one second of lines is dropped: {}",
            log.dropped()
        );
    }
}
