//! `/metrics` for the one job `tally run` runs (`--metrics <address>`):
//! the families `tally serve` exports (see `docs/serve.md`), labelled
//! `tenant=""` and the job's name, among them a Kafka job's restore
//! progress while it rebuilds its state.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context as _;
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use tally_core::batch::BatchOutcome;
use tally_core::hot_swap::SwapEvent;
use tally_core::observe::{CommitReport, JobObserver, RestoreProgress};
use tally_core::plugin::context::{JobContext, LogLimits, PluginLog};

use crate::metrics::{HostMetrics, JobMetrics, PROMETHEUS_TEXT};

/// One job's metrics and the server that exports them.
pub struct RunMetrics {
    job: Arc<JobMetrics>,
    kafka: bool,
    address: SocketAddr,
}

impl RunMetrics {
    /// Binds `listen` (`host:port`; port 0 picks a free one) and serves
    /// `GET /metrics` for job `name` from a thread of its own, for as
    /// long as the process runs.
    pub fn serve(listen: &str, name: &str, kafka: bool) -> anyhow::Result<RunMetrics> {
        let listener = TcpListener::bind(listen).with_context(|| {
            format!("listening for metrics on `{listen}` (--metrics): is the address free?")
        })?;
        listener.set_nonblocking(true).context("setting up the metrics listener")?;
        let address = listener.local_addr().context("setting up the metrics listener")?;
        let host = Arc::new(HostMetrics::new());
        let job = Arc::new(host.job("", name));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the metrics server")?;
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let render = move || {
                        let host = host.clone();
                        async move {
                            ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], host.render())
                                .into_response()
                        }
                    };
                    let app = Router::new().route("/metrics", get(render));
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => {
                            if let Err(err) = axum::serve(listener, app).await {
                                tracing::warn!(%address, "the metrics server stopped: {err}");
                            }
                        }
                        Err(err) => {
                            tracing::warn!(%address, "the metrics server could not start: {err}")
                        }
                    }
                })
            })
            .context("starting the metrics server")?;
        Ok(RunMetrics { job, kafka, address })
    }

    /// Where the metrics are served.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Says the job runs plugin `digest` (`tally_job_running`,
    /// `tally_plugin_info`).
    pub fn started(&self, digest: &str) {
        self.job.set_plugin_info("", digest);
        self.job.set_running(true);
    }

    /// The job's context, with its plugin's meters counting into the metrics.
    pub fn context(&self, name: &str) -> JobContext {
        let log = PluginLog::new(None, name, LogLimits::default())
            .count_drops_in(self.job.log_lines_dropped());
        JobContext::with(Arc::new(AtomicBool::new(false)), None, log, self.job.plugin_meters())
    }

    /// Where a Kafka job's restores count into the metrics.
    pub fn restore_progress(&self) -> Arc<RestoreProgress> {
        self.job.restore.clone()
    }

    /// Turns the job's commits, aborts, batches and swaps into metrics.
    pub fn observer(&self) -> Arc<dyn JobObserver> {
        Arc::new(Observer { job: self.job.clone(), kafka: self.kafka })
    }
}

struct Observer {
    job: Arc<JobMetrics>,
    kafka: bool,
}

impl JobObserver for Observer {
    fn committed(&self, commit: &CommitReport) {
        self.job.committed(commit, self.kafka);
    }

    fn periods(&self, partitions: &[tally_core::periods::PartitionStatus]) {
        self.job.periods(partitions);
    }

    fn aborted(&self, _reason: &str) {
        self.job.aborted();
    }

    fn swapped(&self, event: &SwapEvent) {
        self.job.swapped(event);
    }

    fn batch(&self, events: usize, outcome: &BatchOutcome) {
        self.job.batch(events, outcome);
    }
}
