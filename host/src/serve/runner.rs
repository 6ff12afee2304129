//! One job under `tally serve`: its thread, its controls (pause, resume,
//! stop), its status, and the observer that turns commits and swaps into
//! status, metrics and plugin history.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tally_core::batch::BatchOutcome;
use tally_core::fair_share::CpuSeat;
use tally_core::hot_swap::{PluginSlot, SwapEvent};
use tally_core::observe::{CommitReport, JobObserver};
use tally_core::plugin::context::{LogLimits, PluginLog};
use tally_core::plugin::{JobContext, LoadedPlugin};
use tally_core::state::StateStore;
use tally_core::sync::lock;
use tally_core::text::{MAX_REASON_BYTES, sanitize};

use crate::config::JobConfig;
use crate::job::{Job, JobError};
use crate::metrics::JobMetrics;
use crate::versions::Version;
use tally_kafka::KafkaJob;
use tally_local::LocalTask;

use super::delivery_runner::DeliveryRunner;
use super::error::ServeError;
use super::registry::{JobDir, JobRecord, VersionStatus};
use super::shadow::Shadow;
use super::wire::{JobMode, JobState, JobStatus, LagUnit, PeriodPartition};

/// A job that has not committed for this long reports no throughput.
const IDLE_AFTER: Duration = Duration::from_secs(5);

impl JobStatus {
    /// A job whose files are on disk but which could not be resumed when
    /// the host started, and why.
    pub fn broken(name: &str, reason: &str) -> JobStatus {
        JobStatus {
            name: name.to_string(),
            mode: JobMode::Unknown,
            state: JobState::Broken,
            plugin: String::new(),
            output_version: String::new(),
            pending_plugin: None,
            on_trial: None,
            records: 0,
            throughput: 0.0,
            lag: None,
            lag_unit: LagUnit::Unknown,
            commits: 0,
            rollbacks: 0,
            last_error: Some(reason.to_string()),
            last_swap: None,
            cpu_seconds: 0.0,
            traps: 0,
            cpu_budget_breaches: 0,
            log_lines_dropped: 0,
            last_plugin_failure: None,
            demoted: false,
            restore: None,
            periods: None,
            deliveries: Vec::new(),
            shadow: None,
        }
    }
}

/// Controls and status shared by a job's thread and the admin API.
pub struct JobRuntime {
    /// The tenant owning the job.
    pub tenant: String,
    /// The job's name, as its tenant calls it.
    pub name: String,
    /// The config the host runs: its live version's (see [`Version::of`]).
    pub config: JobConfig,
    /// The job as its file describes it (v1's names): its versions and
    /// deliveries are named from it.
    pub base_config: JobConfig,
    /// The version it runs.
    pub version: Version,
    /// Where its files are.
    pub dir: JobDir,
    /// Where pushed versions wait for the job.
    pub slot: Arc<PluginSlot>,
    /// Its metrics.
    pub metrics: JobMetrics,
    /// Host paths and what a tenant sees instead, longest first.
    redactions: Vec<(String, String)>,
    /// What its plugin instances share: the stop signal (set to make the
    /// current run commit and return, and any plugin call stop at its next
    /// epoch tick), the CPU seat, the log, the live meters.
    context: JobContext,
    /// Set (under the record lock) once a delete or a promotion began:
    /// nothing more is written through this runtime.
    deleted: AtomicBool,
    /// Set with `deleted` by a promotion: the job starts again under a
    /// new runtime.
    promoted: AtomicBool,
    control: Mutex<Control>,
    wake: Condvar,
    status: Mutex<StatusInner>,
    /// The record on disk, kept in step.
    record: Mutex<JobRecord>,
    /// Every version this host has compiled for the job, by digest.
    plugins: Mutex<HashMap<String, LoadedPlugin>>,
    /// The committed state, while the job is open.
    store: Mutex<Option<(Arc<dyn StateStore>, i32)>>,
    /// Its deliveries, each beside the job with a thread of its own.
    deliveries: Mutex<Vec<Arc<DeliveryRunner>>>,
    /// Held while the deliveries are replaced, and by [`JobRuntime::end`]:
    /// a job ending never leaves a new delivery running.
    replacing: Mutex<()>,
    /// A candidate running beside it, if any.
    shadow: Mutex<Option<Arc<Shadow>>>,
    /// Where a replay starts, seeded when the job first opens, and the
    /// file that keeps it until then.
    start: Mutex<Option<(tally_kafka::StartAt, std::path::PathBuf)>>,
}

#[derive(Default)]
struct Control {
    paused: bool,
    ended: bool,
    /// Failed in a way retrying cannot fix; waits for a resume.
    halted: bool,
}

/// Why a job's run ended with an error, and what the job does next.
struct Failure {
    message: String,
    then: AfterFailure,
}

/// What a failed job does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterFailure {
    /// Reopen from the last commit, with backoff (Kafka or disk trouble).
    Retry,
    /// Wait for a resume: only a person can fix this (a replaced input, an
    /// offset rewind, a bad configuration).
    Halt,
    /// Pause, across restarts too: the plugin is broken (it failed on many
    /// events in a row); push a fixed version and resume.
    Pause,
}

impl Failure {
    /// What to do after `err`: the error itself says.
    fn of(err: impl JobError) -> Failure {
        let then = match (err.needs_new_plugin(), err.is_retryable()) {
            (true, _) => AfterFailure::Pause,
            (false, true) => AfterFailure::Retry,
            (false, false) => AfterFailure::Halt,
        };
        Failure { message: sanitize(&err.to_string(), 2 * MAX_REASON_BYTES), then }
    }
}

struct StatusInner {
    state: JobState,
    plugin: String,
    records: u64,
    throughput: f64,
    lag: Option<u64>,
    last_commit: Option<Instant>,
    last_error: Option<String>,
    last_swap: Option<String>,
    on_trial: Option<String>,
    periods: Option<Vec<PeriodPartition>>,
}

impl JobRuntime {
    /// A job that will run `plugin` (its active version), on `seat` of its
    /// tenant's share of the cores, logging within `log_limits`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        tenant: &str,
        name: &str,
        (version, config, base_config): (Version, JobConfig, JobConfig),
        dir: JobDir,
        record: JobRecord,
        plugin: LoadedPlugin,
        metrics: JobMetrics,
        seat: Arc<CpuSeat>,
        log_limits: LogLimits,
        deliveries: Vec<tally_deliver::DeliverSettings>,
    ) -> Arc<JobRuntime> {
        let paused = record.paused;
        let log = PluginLog::new(Some(tenant), name, log_limits)
            .count_drops_in(metrics.log_lines_dropped());
        let context = JobContext::with(
            Arc::new(AtomicBool::new(paused)),
            Some(seat),
            log,
            metrics.plugin_meters(),
        );
        let mut redactions = vec![(dir.root().display().to_string(), format!("<job {name}>"))];
        if let Some(input_dir) = config.local().ok().and_then(|local| local.confine_to.as_ref()) {
            redactions.push((input_dir.display().to_string(), "<input_dir>".to_string()));
            if let Ok(canonical) = input_dir.canonicalize() {
                redactions.push((canonical.display().to_string(), "<input_dir>".to_string()));
            }
        }
        redactions.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
        Arc::new(JobRuntime {
            redactions,
            tenant: tenant.to_string(),
            name: name.to_string(),
            config,
            base_config,
            version,
            dir,
            slot: PluginSlot::new(),
            metrics,
            context,
            deleted: AtomicBool::new(false),
            promoted: AtomicBool::new(false),
            control: Mutex::new(Control { paused, ..Control::default() }),
            wake: Condvar::new(),
            status: Mutex::new(StatusInner {
                state: if paused { JobState::Paused } else { JobState::Starting },
                plugin: plugin.digest().to_string(),
                records: 0,
                throughput: 0.0,
                lag: None,
                last_commit: None,
                last_error: None,
                last_swap: None,
                on_trial: None,
                periods: None,
            }),
            record: Mutex::new(record),
            plugins: Mutex::new(HashMap::from([(plugin.digest().to_string(), plugin)])),
            store: Mutex::new(None),
            deliveries: Mutex::new(deliveries.into_iter().map(DeliveryRunner::new).collect()),
            replacing: Mutex::new(()),
            shadow: Mutex::new(None),
            start: Mutex::new(None),
        })
    }

    /// Makes the job start at `start` (a replay's start) when it first
    /// opens, before it runs; `kept_in` holds it until then and is removed
    /// once it is seeded. Call before [`JobRuntime::spawn`].
    pub fn start_at(&self, start: tally_kafka::StartAt, kept_in: std::path::PathBuf) {
        *lock(&self.start) = Some((start, kept_in));
    }

    /// Starts the job's thread, and its deliveries'.
    pub fn spawn(self: &Arc<Self>) -> JoinHandle<()> {
        for delivery in &self.deliveries() {
            self.start_delivery(delivery);
        }
        let runtime = self.clone();
        std::thread::Builder::new()
            .name(format!("job-{}", self.config.settings.name))
            .spawn(move || runtime.run())
            .expect("spawning a job thread")
    }

    fn start_delivery(&self, delivery: &Arc<DeliveryRunner>) {
        let redactions = self.redactions.clone();
        delivery.start(self.base_config.clone(), &self.tenant, move |message| {
            redact_paths(message, &redactions)
        });
    }

    fn is_kafka(&self) -> bool {
        matches!(self.config.mode, crate::config::Mode::Kafka(_))
    }

    /// The job's status now.
    pub fn status(&self) -> JobStatus {
        // Never holds both locks: the observer takes record, then status.
        let pending_plugin = lock(&self.record).pending().map(|version| version.digest.clone());
        let meters = &self.context.meters;
        // Read before the status lock: a ledger is on disk.
        let deliveries = self.deliveries().iter().map(|delivery| delivery.status()).collect();
        let shadow = self.shadow().map(|shadow| shadow.status());
        let status = lock(&self.status);
        let restore = self.metrics.restore.snapshot();
        JobStatus {
            name: self.name.clone(),
            mode: if self.is_kafka() { JobMode::Kafka } else { JobMode::Local },
            state: match status.state {
                JobState::Running | JobState::Starting if restore.is_some() => JobState::Restoring,
                state => state,
            },
            plugin: status.plugin.clone(),
            output_version: self.version.to_string(),
            pending_plugin,
            on_trial: status.on_trial.clone(),
            records: status.records,
            // No commit for a while: nothing is flowing.
            throughput: match status.last_commit {
                Some(last) if last.elapsed() < IDLE_AFTER => {
                    (status.throughput * 10.0).round() / 10.0
                }
                _ => 0.0,
            },
            lag: status.lag,
            lag_unit: if self.is_kafka() { LagUnit::Records } else { LagUnit::Bytes },
            commits: self.metrics.commits(),
            rollbacks: self.metrics.rollbacks(),
            last_error: status.last_error.as_deref().map(|error| self.redact(error)),
            last_swap: status.last_swap.clone(),
            cpu_seconds: (meters.cpu_seconds.get() * 1000.0).round() / 1000.0,
            traps: meters.traps.get(),
            cpu_budget_breaches: meters.cpu_budget_breaches.get(),
            log_lines_dropped: meters.log_lines_dropped.get(),
            last_plugin_failure: meters
                .last_failure()
                .map(|(ago, reason)| format!("{reason} ({}s ago)", ago.as_secs())),
            demoted: self.context.seat.as_ref().is_some_and(|seat| seat.is_demoted()),
            restore,
            periods: status.periods.clone(),
            deliveries,
            shadow,
        }
    }

    /// `message` as the job's tenant may see it: the host's own paths (its
    /// data directory, the tenant's input directory) left out.
    pub fn redact(&self, message: &str) -> String {
        redact_paths(message, &self.redactions)
    }

    /// The job's record (plugin history).
    pub fn record(&self) -> JobRecord {
        lock(&self.record).clone()
    }

    /// The committed state and the number of state namespaces (Kafka
    /// partitions; 0 for a local job), while the job is open.
    pub fn store(&self) -> Option<(Arc<dyn StateStore>, i32)> {
        lock(&self.store).clone()
    }

    /// Offers a compiled, checked version to the job; it is swapped in at
    /// the next transaction boundary and judged on its first transaction.
    /// Keeps the components of `kept` versions on disk (and those the job
    /// runs or will): returns the digests whose files were removed.
    pub fn push(
        &self,
        plugin: LoadedPlugin,
        version: super::registry::PluginVersion,
        kept: usize,
    ) -> Result<Vec<String>, ServeError> {
        // Under the record lock, so the record and the slot agree.
        let mut record = lock(&self.record);
        if self.deleted.load(Ordering::SeqCst) {
            return Err(self.retired());
        }
        if record.undecided_or_active(plugin.digest()).is_some() {
            // Pushed twice at once: the first push stands.
            return Ok(Vec::new());
        }
        let displaced = self.offer(plugin.clone());
        let mut updated = record.clone();
        updated.pushed(version);
        if let Some(displaced) = &displaced {
            updated.superseded(displaced.digest(), plugin.digest());
            lock(&self.plugins).remove(displaced.digest());
        }
        let removed = updated.prune(kept);
        if let Err(err) = self.dir.write_record(&updated) {
            // Not recorded, so not offered either.
            let _ = self.slot.take_if(plugin.digest());
            if let Some(displaced) = displaced {
                self.slot.push(displaced);
            }
            return Err(err);
        }
        *record = updated;
        for digest in &removed {
            let _ = std::fs::remove_file(self.dir.plugin_file(digest));
        }
        Ok(removed)
    }

    /// Makes `plugin` known to the job and puts it in the slot; returns the
    /// version it displaced there.
    pub fn offer(&self, plugin: LoadedPlugin) -> Option<LoadedPlugin> {
        lock(&self.plugins).insert(plugin.digest().to_string(), plugin.clone());
        self.slot.push(plugin)
    }

    /// Refuses every change from now on: the job is being promoted, and
    /// starts again under a new runtime. Refused (nothing marked) while a
    /// pushed version waits for its trial: its digest.
    pub fn try_mark_promoted(&self) -> Result<(), String> {
        let record = lock(&self.record);
        // Checked under the lock a push takes: none slips in after.
        if let Some(pending) = record.pending() {
            return Err(pending.digest.clone());
        }
        self.mark_promoted();
        Ok(())
    }

    /// Refuses every change from now on, whatever waits.
    pub fn mark_promoted(&self) {
        self.promoted.store(true, Ordering::SeqCst);
        self.deleted.store(true, Ordering::SeqCst);
    }

    /// Why a change is refused once [`JobRuntime::mark_deleted`] or
    /// [`JobRuntime::mark_promoted`] ran.
    fn retired(&self) -> ServeError {
        if self.promoted.load(Ordering::SeqCst) {
            ServeError::Promoting { job: self.name.clone() }
        } else {
            ServeError::Deleted { job: self.name.clone() }
        }
    }

    /// Refuses every change from now on: the job is being deleted.
    pub fn mark_deleted(&self) {
        let _record = lock(&self.record);
        self.deleted.store(true, Ordering::SeqCst);
        if let Some(shadow) = self.shadow() {
            shadow.runtime().mark_deleted();
        }
    }

    /// Its shadow, if a candidate runs beside it.
    pub fn shadow(&self) -> Option<Arc<Shadow>> {
        lock(&self.shadow).clone()
    }

    /// Sets `shadow` running beside the job; refused (and `shadow` ended)
    /// once the job is being deleted or stopped, or has a shadow already.
    pub fn set_shadow(&self, shadow: Arc<Shadow>) -> Result<(), &'static str> {
        let _record = lock(&self.record);
        let mut current = lock(&self.shadow);
        let refusal = if self.deleted.load(Ordering::SeqCst) || lock(&self.control).ended {
            Some("the job is being deleted or stopped")
        } else if current.is_some() {
            Some("the job has a shadow already")
        } else {
            None
        };
        if let Some(refusal) = refusal {
            shadow.end();
            return Err(refusal);
        }
        *current = Some(shadow);
        Ok(())
    }

    /// Takes its shadow away (to discard it).
    pub fn take_shadow(&self) -> Option<Arc<Shadow>> {
        lock(&self.shadow).take()
    }

    /// Waits for its shadow's threads to end (after [`JobRuntime::end`]).
    pub fn join_shadow(&self) {
        if let Some(shadow) = self.shadow() {
            shadow.join();
        }
    }

    /// Pauses (`true`) or resumes the job, and remembers it across restarts.
    pub fn set_paused(&self, paused: bool) -> Result<(), ServeError> {
        {
            let mut record = lock(&self.record);
            if self.deleted.load(Ordering::SeqCst) {
                return Err(self.retired());
            }
            let updated = JobRecord { paused, ..record.clone() };
            self.dir.write_record(&updated)?;
            *record = updated;
        }
        let mut control = lock(&self.control);
        control.paused = paused;
        if !paused {
            control.halted = false;
        }
        // A job being ended stays stopped whatever a resume says.
        if paused || control.ended {
            self.context.stop_now();
        } else {
            self.context.stop.store(false, Ordering::SeqCst);
        }
        drop(control);
        self.wake.notify_all();
        Ok(())
    }

    /// The delivery of `output`, if the job delivers it.
    pub fn delivery(&self, output: &str) -> Option<Arc<DeliveryRunner>> {
        lock(&self.deliveries).iter().find(|delivery| delivery.output() == output).cloned()
    }

    /// Its deliveries.
    pub fn deliveries(&self) -> Vec<Arc<DeliveryRunner>> {
        lock(&self.deliveries).clone()
    }

    /// Changes the job's deliveries while it runs, one change at a time:
    /// `change` sees the running deliveries and returns the new settings
    /// (or refuses; nothing changes then); the running deliveries stop after
    /// their requests in flight and end (listed until then), the state of
    /// outputs no longer delivered is removed, and the new ones start (an
    /// output delivered before and after goes on from its ledger). A change
    /// under way, or a job being deleted or stopped, is refused with
    /// `refuse`'s error.
    pub fn change_deliveries<E>(
        &self,
        change: impl FnOnce(&[Arc<DeliveryRunner>]) -> Result<Vec<tally_deliver::DeliverSettings>, E>,
        refuse: impl FnOnce(&'static str) -> E,
    ) -> Result<(), E> {
        let _replacing = match self.replacing.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                return Err(refuse(
                    "a change of this job's deliveries is under way; try again once it is done",
                ));
            }
        };
        if self.deleted.load(Ordering::SeqCst) || lock(&self.control).ended {
            return Err(refuse("the job is being deleted or stopped"));
        }
        let old = self.deliveries();
        let settings = change(&old)?;
        for delivery in &old {
            delivery.stop();
        }
        for delivery in &old {
            delivery.join();
        }
        for delivery in &old {
            let kept = settings.iter().any(|new| new.output == delivery.output());
            if !kept {
                let state_dir = &delivery.settings().state_dir;
                if let Err(err) = std::fs::remove_dir_all(state_dir) {
                    tracing::warn!(job = %self.name, output = delivery.output(), error = %err, "cannot remove the state of a delivery no longer run");
                }
            }
        }
        let new: Vec<Arc<DeliveryRunner>> = settings.into_iter().map(DeliveryRunner::new).collect();
        if !lock(&self.control).ended {
            for delivery in &new {
                self.start_delivery(delivery);
            }
        }
        *lock(&self.deliveries) = new;
        Ok(())
    }

    /// Waits for the deliveries' threads to end (after [`JobRuntime::end`]).
    pub fn join_deliveries(&self) {
        for delivery in &self.deliveries() {
            delivery.join();
        }
    }

    /// Makes the job commit what it processed and its thread return, and
    /// its deliveries stop after their requests in flight.
    pub fn end(&self) {
        let _replacing = lock(&self.replacing);
        for delivery in &self.deliveries() {
            delivery.stop();
        }
        lock(&self.control).ended = true;
        self.context.stop_now();
        self.wake.notify_all();
        if let Some(shadow) = self.shadow() {
            shadow.end();
        }
    }

    fn set_state(&self, state: JobState) {
        lock(&self.status).state = state;
        self.metrics.set_running(state == JobState::Running);
    }

    /// Waits while paused; `false` once the job is to end.
    fn wait_while_paused(&self) -> bool {
        let mut control = lock(&self.control);
        loop {
            if control.ended {
                return false;
            }
            if !control.paused && !control.halted {
                return true;
            }
            if !control.halted {
                self.set_state(JobState::Paused);
            }
            control = self.wake.wait(control).expect("control lock");
        }
    }

    /// Sleeps `pause` unless the job is ended or paused meanwhile.
    fn sleep_unless_stopped(&self, pause: Duration) {
        let control = lock(&self.control);
        let _ = self
            .wake
            .wait_timeout_while(control, pause, |control| !control.ended && !control.paused);
    }

    /// The job's thread: open, run until stopped, and on failure reopen
    /// with backoff (from the last commit).
    fn run(self: Arc<Self>) {
        let mut backoff = Duration::from_secs(1);
        while self.wait_while_paused() {
            self.set_state(JobState::Starting);
            self.prepare_to_open();
            let opened_at = Instant::now();
            // A bug of the host's must stop this job, not leave it looking
            // alive with its thread gone.
            let run = std::panic::AssertUnwindSafe(|| {
                if self.is_kafka() {
                    self.run_job::<KafkaJob>()
                } else {
                    self.run_job::<LocalTask>()
                }
            });
            let result = std::panic::catch_unwind(run).unwrap_or_else(|panic| {
                let what = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
                Err(Failure {
                    message: format!("the host failed on this job (a bug, in its log: {what}); nothing past the last commit counted"),
                    then: AfterFailure::Halt,
                })
            });
            *lock(&self.store) = None;
            // Whatever comes next, this thread does not work for a while.
            self.context.idle();
            match result {
                Ok(()) => backoff = Duration::from_secs(1),
                Err(Failure { message, then: AfterFailure::Halt }) => {
                    tracing::error!(tenant = %self.tenant, job = %self.name, error = %message, "job stopped: retrying cannot fix this; resume it once fixed");
                    lock(&self.status).last_error = Some(format!(
                        "{message} (the job waits: fix this, then `tally jobs resume {}`)",
                        self.name
                    ));
                    self.set_state(JobState::Failed);
                    lock(&self.control).halted = true;
                }
                Err(Failure { message, then: AfterFailure::Pause }) => {
                    tracing::error!(tenant = %self.tenant, job = %self.name, error = %message, "job paused: its plugin keeps failing");
                    lock(&self.status).last_error = Some(format!(
                        "{message} (the job is paused: push a fixed version with `tally plugin push {0}`, then `tally jobs resume {0}`)",
                        self.name
                    ));
                    if let Err(err) = self.set_paused(true) {
                        tracing::error!(tenant = %self.tenant, job = %self.name, error = %err, "cannot record the pause");
                        lock(&self.control).halted = true;
                    }
                }
                Err(Failure { message, .. }) => {
                    tracing::error!(tenant = %self.tenant, job = %self.name, error = %message, "job failed; reopening it from its last commit");
                    lock(&self.status).last_error = Some(message);
                    self.set_state(JobState::Failed);
                    if opened_at.elapsed() > Duration::from_secs(60) {
                        backoff = Duration::from_secs(1);
                    }
                    self.sleep_unless_stopped(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
        self.set_state(JobState::Stopped);
    }

    /// Before (re)opening: counts of a transaction that died with the last
    /// task are dropped, and a version that was waiting or on trial there is
    /// offered again (it was never judged).
    fn prepare_to_open(&self) {
        self.metrics.aborted();
        lock(&self.status).on_trial = None;
        let record = lock(&self.record);
        if let Some(pending) = record.pending() {
            let plugin = lock(&self.plugins).get(&pending.digest).cloned();
            if let Some(plugin) = plugin {
                // The newest undecided version; older ones are refused when it goes on trial.
                let _ = self.slot.push(plugin);
            }
        }
    }

    fn active_plugin(&self) -> Result<LoadedPlugin, ServeError> {
        let digest = lock(&self.status).plugin.clone();
        let plugin = lock(&self.plugins).get(&digest).cloned();
        plugin.ok_or(ServeError::NotLoaded { digest })
    }

    fn observer(self: &Arc<Self>) -> Arc<dyn JobObserver> {
        Arc::new(Observer { runtime: self.clone() })
    }

    /// Opens the job as a `J`, then runs it until it is deleted or the
    /// host stops, waiting while it is paused.
    fn run_job<J: Job>(self: &Arc<Self>) -> Result<(), Failure> {
        let plugin = self
            .active_plugin()
            .map_err(|err| Failure { message: err.to_string(), then: AfterFailure::Halt })?;
        let mut job = J::open(&self.config, &plugin, self.context.clone()).map_err(Failure::of)?;
        let start = lock(&self.start).take();
        if let Some((start, kept_in)) = start {
            // Seeded again after a crash before the file went: the same
            // start, nothing processed since, is accepted.
            if let Err(err) = job.seed_start(&start) {
                *lock(&self.start) = Some((start, kept_in));
                return Err(Failure::of(err));
            }
            if let Err(err) = std::fs::remove_file(&kept_in)
                && err.kind() != std::io::ErrorKind::NotFound
            {
                tracing::error!(tenant = %self.tenant, job = %self.name, error = %err, "cannot remove a seeded start's file");
            }
        }
        job.attach(self.slot.clone(), self.config.settings.hot_swap, self.observer());
        job.report_restores_to(self.metrics.restore.clone());
        *lock(&self.store) = Some(job.state());
        while self.wait_while_paused() {
            self.set_state(JobState::Running);
            job.run(&self.context.stop).map_err(Failure::of)?;
        }
        Ok(())
    }
}

/// `message` with each of `redactions`' paths replaced by its stand-in.
pub fn redact_paths(message: &str, redactions: &[(String, String)]) -> String {
    let mut message = message.to_string();
    for (path, shown) in redactions {
        if !path.is_empty() && message.contains(path.as_str()) {
            message = message.replace(path.as_str(), shown);
        }
    }
    message
}

/// Turns a job's reports into its status, metrics and plugin history.
struct Observer {
    runtime: Arc<JobRuntime>,
}

impl JobObserver for Observer {
    fn committed(&self, commit: &CommitReport) {
        let runtime = &self.runtime;
        let records = runtime.metrics.committed(commit, runtime.is_kafka());
        let mut status = lock(&runtime.status);
        status.records += records;
        status.lag = commit.lag;
        if let Some(last) = status.last_commit {
            let seconds = commit.at.duration_since(last).as_secs_f64().max(1e-3);
            // Smoothed over roughly the last ten commits.
            status.throughput = 0.9 * status.throughput + 0.1 * (records as f64 / seconds);
        }
        status.last_commit = Some(commit.at);
    }

    fn aborted(&self, _reason: &str) {
        self.runtime.metrics.aborted();
    }

    fn periods(&self, partitions: &[tally_core::periods::PartitionStatus]) {
        self.runtime.metrics.periods(partitions);
        lock(&self.runtime.status).periods =
            Some(partitions.iter().map(PeriodPartition::from).collect());
    }

    fn batch(&self, events: usize, outcome: &BatchOutcome) {
        self.runtime.metrics.batch(events, outcome);
    }

    fn swapped(&self, event: &SwapEvent) {
        let runtime = &self.runtime;
        runtime.metrics.swapped(event);
        let mut record = lock(&runtime.record);
        let mut status = lock(&runtime.status);
        let previous = status.plugin.clone();
        if status.on_trial.as_deref() == Some(event_digest(event)) {
            status.on_trial = None;
        }
        // What a failed version says is kept (in the history too): cut it.
        let cut = |reason: &str| sanitize(reason, MAX_REASON_BYTES);
        match event {
            SwapEvent::OnTrial { digest } => {
                record.on_trial(digest);
                status.on_trial = Some(digest.clone());
            }
            SwapEvent::Activated { digest } => {
                record.activated(digest);
                status.plugin = digest.clone();
                status.last_swap = Some(format!("{digest} is active"));
                // Retired versions leave memory (a rollback loads one again).
                let pending = record.pending().map(|version| version.digest.clone());
                lock(&runtime.plugins)
                    .retain(|kept, _| kept == digest || Some(kept) == pending.as_ref());
            }
            SwapEvent::RolledBack { digest, restored, reason } => {
                let reason = cut(reason);
                record.failed(digest, VersionStatus::RolledBack, &reason);
                status.last_swap =
                    Some(format!("{digest} was rolled back to {restored}: {reason}"));
                lock(&runtime.plugins).remove(digest);
            }
            SwapEvent::Refused { digest, reason } => {
                let reason = cut(reason);
                record.failed(digest, VersionStatus::Refused, &reason);
                status.last_swap = Some(format!("{digest} could not start: {reason}"));
                if record.undecided_or_active(digest).is_none() {
                    lock(&runtime.plugins).remove(digest);
                }
            }
        }
        if let SwapEvent::Activated { digest } = event {
            runtime.metrics.set_plugin_info(&previous, digest);
        }
        if runtime.deleted.load(Ordering::SeqCst) {
            return;
        }
        if let Err(err) = runtime.dir.write_record(&record) {
            tracing::error!(tenant = %runtime.tenant, job = %runtime.name, error = %err, "cannot save the plugin history");
            // The tenant sees what failed, not the host's paths.
            status.last_error =
                Some("the host could not save the plugin history (its log says why)".into());
        }
    }
}

fn event_digest(event: &SwapEvent) -> &str {
    match event {
        SwapEvent::OnTrial { digest } | SwapEvent::Activated { digest } => digest,
        SwapEvent::RolledBack { digest, .. } | SwapEvent::Refused { digest, .. } => digest,
    }
}
