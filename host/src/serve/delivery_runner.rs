//! One delivery of a served job, beside the job: its thread (the same
//! deliverer `tally deliver` runs, restarted with backoff when it fails),
//! its stop, and its status for the admin API and `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tally_core::sync::lock;
use tally_deliver::resolve::{Inbox, Resolution, Verdict};
use tally_deliver::settings::Target;
use tally_deliver::status::UnknownRecord;
use tally_deliver::{DeliverSettings, RunOptions};

use crate::config::JobConfig;
use crate::promotion::{self, Reading};

/// A status read from the ledger is reused for this long: reading it
/// opens a view of the ledger and walks its entries.
const STATUS_FRESH_FOR: Duration = Duration::from_secs(1);

/// The longest wait before a failed deliverer is started again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A delivery as the admin API shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeliveryStatus {
    /// The job's output it delivers.
    pub output: String,
    /// `http` or `postgres`.
    pub target: String,
    /// `running`, `failed` (restarting after a backoff) or `stopped`.
    pub state: String,
    /// Why its deliverer last failed (the host's paths left out).
    pub last_error: Option<String>,
    /// What its ledger says: positions, records per outcome, the oldest
    /// record not settled, latencies.
    #[serde(flatten)]
    pub ledger: tally_deliver::status::Status,
}

/// One running delivery of a served job.
pub struct DeliveryRunner {
    settings: DeliverSettings,
    stop: Arc<AtomicBool>,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
    state: std::sync::Mutex<RunnerState>,
    status: std::sync::Mutex<Option<(Instant, tally_deliver::status::Status)>>,
}

#[derive(Default)]
struct RunnerState {
    running: bool,
    last_error: Option<String>,
}

impl DeliveryRunner {
    /// A delivery that runs `settings` once started.
    pub fn new(settings: DeliverSettings) -> Arc<DeliveryRunner> {
        Arc::new(DeliveryRunner {
            settings,
            stop: Arc::new(AtomicBool::new(false)),
            thread: std::sync::Mutex::new(None),
            state: std::sync::Mutex::new(RunnerState::default()),
            status: std::sync::Mutex::new(None),
        })
    }

    /// What it runs.
    pub fn settings(&self) -> &DeliverSettings {
        &self.settings
    }

    /// The output it delivers.
    pub fn output(&self) -> &str {
        &self.settings.output
    }

    /// Starts its thread, which delivers the committed output of `job` (as
    /// its file describes it: the live version's, after a promotion) until
    /// [`DeliveryRunner::stop`]; `redact` takes the host's paths out of
    /// what a tenant sees.
    pub fn start(
        self: &Arc<Self>,
        job: JobConfig,
        tenant: &str,
        redact: impl Fn(&str) -> String + Send + 'static,
    ) {
        let runner = self.clone();
        let tenant = tenant.to_string();
        let thread = std::thread::Builder::new()
            .name(format!("deliver-{}-{}", job.settings.name, self.settings.output))
            .spawn(move || runner.run(&job, &tenant, redact))
            .expect("spawning a delivery thread");
        *lock(&self.thread) = Some(thread);
    }

    /// Asks the deliverer to stop after the requests in flight.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Waits for its thread to end (after [`DeliveryRunner::stop`]).
    pub fn join(&self) {
        let thread = lock(&self.thread).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }

    fn run(&self, job: &JobConfig, tenant: &str, redact: impl Fn(&str) -> String) {
        let mut backoff = Duration::from_secs(1);
        while !self.stop.load(Ordering::SeqCst) {
            lock(&self.state).running = true;
            let started = Instant::now();
            let attempt = std::panic::AssertUnwindSafe(|| {
                let mut settings = self.settings.clone();
                // A switch a promotion left is finished first.
                let name = format!("of output {:?}", settings.output);
                let reading = promotion::finish_switch(&name, job, &mut settings, &self.stop)?;
                if let Reading::Interrupted = reading {
                    return anyhow::Ok(());
                }
                let (mut source, mirror) = promotion::live_output(job, &mut settings, &reading)?;
                tally_deliver::run(
                    &settings,
                    source.as_mut(),
                    mirror,
                    self.stop.clone(),
                    RunOptions { until_caught_up: false },
                )?;
                anyhow::Ok(())
            });
            let error = match std::panic::catch_unwind(attempt) {
                Ok(Ok(())) => None,
                Ok(Err(err)) => Some(format!("{err:#}")),
                Err(_) => Some("the deliverer failed (a bug, in the host's log)".to_string()),
            };
            let mut state = lock(&self.state);
            state.running = false;
            let Some(error) = error else { break };
            tracing::error!(%tenant, job = %job.settings.name, output = %self.settings.output, %error, "delivery failed; starting it again after a backoff");
            state.last_error = Some(redact(&error));
            drop(state);
            if started.elapsed() > Duration::from_secs(60) {
                backoff = Duration::from_secs(1);
            }
            let until = Instant::now() + backoff;
            while Instant::now() < until && !self.stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Its status: the ledger's (at most [`STATUS_FRESH_FOR`] old) and its thread's.
    pub fn status(&self) -> DeliveryStatus {
        let ledger = {
            let mut cached = lock(&self.status);
            match &*cached {
                Some((at, status)) if at.elapsed() < STATUS_FRESH_FOR => status.clone(),
                _ => {
                    // Before its first start the ledger does not exist: nothing delivered yet.
                    let status = self.read_ledger().map(|(status, _)| status).unwrap_or_default();
                    *cached = Some((Instant::now(), status.clone()));
                    status
                }
            }
        };
        let state = lock(&self.state);
        DeliveryStatus {
            output: self.settings.output.clone(),
            target: match self.settings.target {
                Target::Http(_) => "http",
                Target::Postgres(_) => "postgres",
            }
            .to_string(),
            state: if state.running {
                "running"
            } else if self.stop.load(Ordering::SeqCst) {
                "stopped"
            } else {
                "failed"
            }
            .to_string(),
            last_error: state.last_error.clone(),
            ledger,
        }
    }

    /// The records waiting as `unknown` for the tenant.
    pub fn unknown(&self) -> Vec<UnknownRecord> {
        self.read_ledger().map(|(_, unknown)| unknown).unwrap_or_default()
    }

    /// Queues the tenant's verdict on a record waiting as `unknown`; the
    /// deliverer applies it within a second.
    pub fn resolve(&self, key: String, applied: bool) -> Result<(), String> {
        let verdict = if applied { Verdict::Applied } else { Verdict::NotApplied };
        Inbox::new(&self.settings.state_dir)
            .put(&Resolution { key, verdict })
            .map(|_| ())
            .map_err(|err| err.to_string())
    }

    fn read_ledger(
        &self,
    ) -> Result<
        (tally_deliver::status::Status, Vec<UnknownRecord>),
        tally_deliver::ledger::LedgerError,
    > {
        if !self.settings.state_dir.join("ledger").exists() {
            return Ok(Default::default());
        }
        tally_deliver::status::status(&self.settings.state_dir)
    }
}
