//! A served job's shadow promoted: its version becomes the job's live one,
//! its plugin and `[plugin_config]` the job's, and each delivery switches
//! with it without billing anyone twice (see `docs/versions.md`).
//!
//! The host stops the job, its shadow and its deliveries (each commits
//! what it processed); lets each delivery deliver what the live version
//! committed, for at most [`SETTLE_WAIT`]; plans and writes each
//! delivery's switch, then the job's live pointer — the promotion's commit
//! point ([`crate::promotion::promote`]); then *adopts* the shadow (its
//! plugin and job file become the job's, its directory goes) and starts the
//! job again, as the new version. A host killed before the pointer starts
//! the job and its shadow as they were; killed after it, it finishes the
//! adoption when it starts ([`Host::adopt_promoted_shadow`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tally_core::sync::lock;
use tally_deliver::RunOptions;

use super::error::ServeError;
use super::registry::{JobDir, PluginVersion, VersionStatus};
use super::runner::JobRuntime;
use super::wire::{JobState, Promoted};
use super::{ApiError, Host, job_spec};
use crate::promote;
use crate::promotion::{self, DeliveryToSwitch, Reading};
use crate::versions::Version;

/// How long a promotion lets each delivery deliver what the live version
/// committed, and settle it, before it gives up (and changes nothing).
pub const SETTLE_WAIT: Duration = Duration::from_secs(20);

/// How long a promotion waits for a shadow that is still starting (just
/// started, or the host just restarted) to run before it refuses.
pub const SHADOW_START_WAIT: Duration = Duration::from_secs(30);

impl Host {
    /// Makes the shadow of `tenant`'s job `name` its live version: see the
    /// module. Refused, with nothing changed, while the shadow is not
    /// running well, a pushed version waits for its trial, or a delivery
    /// has records in doubt once [`SETTLE_WAIT`] has passed.
    pub fn promote_shadow(
        self: &Arc<Self>,
        tenant: &str,
        name: &str,
    ) -> Result<Promoted, ApiError> {
        let job = self.job(tenant, name)?;
        wait_while_shadow_starts(&job, SHADOW_START_WAIT);
        // One promotion at a time on the host: it reads both versions'
        // outputs whole.
        let Ok(_one) = self.promotion.try_lock() else {
            return Err(ApiError::new(
                409,
                "another promotion runs on this host right now; try again in a few seconds",
            ));
        };
        // Nothing else starts, discards, deploys or deletes the job meanwhile.
        let keys = [
            (tenant.to_string(), name.to_string()),
            (tenant.to_string(), format!("{name}#shadow")),
        ];
        {
            let mut deploying = lock(&self.deploying);
            if keys.iter().any(|key| deploying.contains_key(key)) {
                return Err(ApiError::new(
                    409,
                    format!(
                        "job `{name}` or its shadow is being started, discarded, promoted or deleted right now; try again"
                    ),
                ));
            }
            for key in &keys {
                deploying.insert(key.clone(), 0);
            }
        }
        let result = self.check_promotable(tenant, name, &job).and_then(|version| {
            let promote = std::panic::AssertUnwindSafe(|| {
                self.promote_reserved(tenant, name, &job, version)
            });
            std::panic::catch_unwind(promote).unwrap_or_else(|_| {
                tracing::error!(%tenant, job = %name, "a promotion failed (a bug); starting the job again from its files");
                self.restart(tenant, name, &job)?;
                Err(ApiError::internal(
                    "the promotion failed on the host's side (a bug: it was logged); the job starts again from its files",
                ))
            })
        });
        let mut deploying = lock(&self.deploying);
        for key in &keys {
            deploying.remove(key);
        }
        result
    }

    /// The version of `job`'s shadow, if it can be promoted now (checked
    /// under the promotion's reservation).
    fn check_promotable(
        &self,
        tenant: &str,
        name: &str,
        job: &JobRuntime,
    ) -> Result<Version, ApiError> {
        let Some(shadow) = job.shadow().filter(|_| job.dir.shadow().exists()) else {
            return Err(ApiError::new(
                404,
                format!(
                    "job `{name}` has no shadow to promote; start one with `tally plugin push {name} <file> --shadow`"
                ),
            ));
        };
        let status = shadow.status();
        if !matches!(status.state, JobState::Running | JobState::Restoring) {
            return Err(ApiError::new(
                409,
                format!(
                    "the shadow of job `{name}` ({}) is {}{}: only a shadow that runs is promoted; wait until it runs, or discard it",
                    status.version,
                    format!("{:?}", status.state).to_lowercase(),
                    status.last_error.map(|error| format!(" ({error})")).unwrap_or_default()
                ),
            ));
        }
        if job.dir.shadow().path().join("from").exists() {
            return Err(ApiError::new(
                409,
                format!(
                    "the shadow of job `{name}` has not seeded its replay's start yet; promote it once it has (`tally jobs status {name}`)"
                ),
            ));
        }
        if let Some(pending) = job.record().pending() {
            return Err(ApiError::new(
                409,
                format!(
                    "job `{name}` has plugin version {} waiting for its trial; promote once it is judged (`tally jobs status {name}`)",
                    pending.digest
                ),
            ));
        }
        // The job file the job will start from must be one the host takes:
        // after the commit point there is no going back.
        let tenant_config =
            self.config.tenants.get(tenant).ok_or_else(|| ApiError::new(401, "unknown tenant"))?;
        let text = promoted_job_file(&job.dir).map_err(ApiError::from)?;
        if let Err(err) = job_spec::parse(&text, tenant, tenant_config, &self.config) {
            return Err(ApiError::new(
                409,
                format!(
                    "job `{name}` with its shadow's job file and its own deliveries would be refused ({err}): discard the shadow and start one the job file can take"
                ),
            ));
        }
        Ok(shadow.version())
    }

    fn promote_reserved(
        self: &Arc<Self>,
        tenant: &str,
        name: &str,
        job: &Arc<JobRuntime>,
        version: Version,
    ) -> Result<Promoted, ApiError> {
        let from = job.version;
        // Nothing changes through this runtime any more (a push, a pause):
        // the job starts again from its files under a new one.
        job.try_mark_promoted().map_err(|digest| {
            ApiError::new(
                409,
                format!(
                    "job `{name}` has plugin version {digest} waiting for its trial; promote once it is judged (`tally jobs status {name}`)"
                ),
            )
        })?;
        // The job, its shadow and its deliveries stop, each committing what
        // it processed: the outputs stand still.
        job.end();
        let thread = lock(&self.threads).remove(&(tenant.to_string(), name.to_string()));
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        job.join_deliveries();
        job.join_shadow();
        let settled = settle_deliveries(job);
        let promoted = settled.and_then(|()| {
            let deliveries = job
                .deliveries()
                .iter()
                .map(|delivery| DeliveryToSwitch {
                    name: format!("of output {:?}", delivery.output()),
                    settings: delivery.settings().clone(),
                })
                .collect();
            promotion::promote(&job.base_config, version, deliveries)
        });
        let summaries = match promoted {
            Ok(summaries) => summaries,
            Err(err) => {
                let reason = job.redact(&format!("{err:#}"));
                tracing::warn!(%tenant, job = %name, %version, error = %reason, "promotion refused; the job goes on as it was");
                self.restart(tenant, name, job)?;
                return Err(ApiError::new(
                    409,
                    format!(
                        "job `{name}`: {version} was not promoted, and the job goes on as it was: {reason}"
                    ),
                ));
            }
        };
        tracing::info!(%tenant, job = %name, %version, %from, "shadow promoted");
        self.restart(tenant, name, job)?;
        Ok(Promoted {
            job: name.to_string(),
            version: version.to_string(),
            from: from.to_string(),
            deliveries: summaries,
        })
    }

    /// Starts `tenant`'s job `name` again from its files, in place of the
    /// stopped `job` (finishing a promotion its files show).
    fn restart(&self, tenant: &str, name: &str, job: &Arc<JobRuntime>) -> Result<(), ApiError> {
        let key = (tenant.to_string(), name.to_string());
        // Stopped already, unless a failure cut the promotion short.
        job.mark_promoted();
        job.end();
        let thread = lock(&self.threads).remove(&key);
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        job.join_deliveries();
        job.join_shadow();
        self.metrics.remove(&job.metrics.labels, &job.status().plugin);
        if let Some(shadow) = job.take_shadow() {
            let runtime = shadow.runtime();
            self.metrics.remove(&runtime.metrics.labels, &runtime.status().plugin);
        }
        // Its entry is replaced as it starts: no moment without one.
        let dir = JobDir::new(&self.config.data_dir, tenant, name);
        self.resume_job(tenant, name, dir).map_err(|err| {
            tracing::error!(%tenant, job = %name, error = %err, "cannot start the job again; fix the cause and restart the host");
            let shown = job.redact(&err.to_string());
            lock(&self.jobs).remove(&key);
            lock(&self.broken).insert(key, shown.clone());
            ApiError::internal(format!("job `{name}` cannot start again: {shown}"))
        })
    }

    /// Finishes a promotion of the shadow kept in `dir` whose live pointer
    /// was written: the shadow's plugin becomes the job's active version,
    /// its job file (with the job's `[[deliver]]` sections) the job's, and
    /// its directory goes (its state and outputs are its version's, under
    /// the job's). Does nothing when the shadow's version is not live. Each
    /// step may run again: a host killed in it finishes it when it starts.
    pub(super) fn adopt_promoted_shadow(
        &self,
        tenant: &str,
        dir: &JobDir,
    ) -> Result<(), ServeError> {
        let shadow = dir.shadow();
        if !shadow.exists() {
            return Ok(());
        }
        let base = self.read_job_file(tenant, dir)?.config;
        let live = promote::live_version(&base)
            .map_err(|err| ServeError::Promotion { reason: format!("{err:#}") })?;
        let version_file = shadow.path().join("version");
        let version = std::fs::read_to_string(&version_file)
            .map_err(ServeError::file("read", &version_file))?;
        if Version::parse(version.trim()).ok() != Some(live) || live == Version::LIVE {
            return Ok(());
        }
        let shadow_record = shadow.read_record()?;
        let active = shadow_record.active().ok_or(ServeError::NoActiveVersion)?.clone();
        let bytes = std::fs::read(shadow.plugin_file(&active.digest))
            .map_err(|source| ServeError::ReadVersion { digest: active.digest.clone(), source })?;
        dir.write_file(&dir.plugin_file(&active.digest), &bytes)?;
        let text = promoted_job_file(dir)?;
        dir.write_file(&dir.job_file(), text.as_bytes())?;
        let mut record = dir.read_record()?;
        if record.active().map(|version| &version.digest) != Some(&active.digest) {
            record.pushed(PluginVersion::new(&active.digest, active.size, VersionStatus::Pending));
            record.activated(&active.digest);
            dir.write_record(&record)?;
        }
        shadow.remove()?;
        tracing::info!(%tenant, job = %dir.path().display(), %live, "the promoted shadow's plugin and job file are the job's");
        Ok(())
    }
}

/// The job file a promotion of the shadow kept in `dir` gives the job: the
/// shadow's (its `[plugin_config]`), with the job's `[[deliver]]` sections.
fn promoted_job_file(dir: &JobDir) -> Result<String, ServeError> {
    let failed = |reason: String| ServeError::Promotion { reason };
    let read_table = |path: std::path::PathBuf| -> Result<toml::Table, ServeError> {
        let text = std::fs::read_to_string(&path).map_err(ServeError::file("read", &path))?;
        toml::from_str(&text).map_err(|err| failed(format!("`{}`: {err}", path.display())))
    };
    let mut table = read_table(dir.shadow().job_file())?;
    if let Some(deliver) = read_table(dir.job_file())?.remove("deliver") {
        table.insert("deliver".to_string(), deliver);
    }
    toml::to_string(&table).map_err(|err| failed(err.to_string()))
}

/// Waits, for at most `most`, while `job`'s shadow is starting: opening its
/// state and plugin after it was started or the host restarted. A shadow
/// that runs, failed or is gone ends the wait at once; the promotion then
/// judges what it finds.
fn wait_while_shadow_starts(job: &JobRuntime, most: Duration) {
    let deadline = Instant::now() + most;
    while Instant::now() < deadline
        && job.shadow().is_some_and(|shadow| shadow.status().state == JobState::Starting)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Lets each of `job`'s deliveries (stopped) deliver what the live
/// version committed, for at most [`SETTLE_WAIT`] in all: what is in doubt
/// after it (the receiver does not answer, a record waits as `unknown`)
/// refuses the promotion.
fn settle_deliveries(job: &JobRuntime) -> anyhow::Result<()> {
    let deliveries = job.deliveries();
    if deliveries.is_empty() {
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let timer = {
        let (stop, done) = (stop.clone(), done.clone());
        std::thread::spawn(move || {
            let until = Instant::now() + SETTLE_WAIT;
            while Instant::now() < until && !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(50));
            }
            stop.store(true, Ordering::SeqCst);
        })
    };
    let result = (|| {
        for delivery in &deliveries {
            let mut settings = delivery.settings().clone();
            let name = format!("of output {:?}", settings.output);
            let reading = promotion::finish_switch(&name, &job.base_config, &mut settings, &stop)?;
            if let Reading::Interrupted = reading {
                anyhow::bail!(
                    "delivery {name} was still sending the corrections of the last promotion after {SETTLE_WAIT:?}; promote again once its receiver answers"
                );
            }
            let (mut source, mirror) =
                promotion::live_output(&job.base_config, &mut settings, &reading)?;
            tally_deliver::run(
                &settings,
                source.as_mut(),
                mirror,
                stop.clone(),
                RunOptions { until_caught_up: true },
            )?;
        }
        anyhow::Ok(())
    })();
    done.store(true, Ordering::SeqCst);
    let _ = timer.join();
    result
}
