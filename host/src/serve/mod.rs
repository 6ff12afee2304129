//! `tally serve`: one host running many tenants' jobs, each on its own
//! thread with its own plugin instance, limits and state directory, managed
//! through an authenticated admin API ([`api`]).
//!
//! Jobs, their plugin versions and whether they are paused persist in the
//! data directory ([`registry`]): a restarted host resumes every job from
//! its last commit.

pub mod api;
pub mod config;
pub mod delivery_runner;
pub mod delivery_spec;
pub mod error;
pub mod job_spec;
mod promotion;
pub mod registry;
pub mod runner;
pub mod shadow;
pub mod wire;

use error::ServeError;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tally_core::sync::lock;

use crate::metrics::HostMetrics;
use tally_core::fair_share::CpuScheduler;
use tally_core::lock::DirLock;
use tally_core::plugin::compiler::{CompileError, CompileLimits, Compiler};
use tally_core::plugin::{LoadedPlugin, PluginRuntime};

use crate::versions::Version;
use config::HostConfig;
use registry::{JobDir, JobRecord, PluginVersion, VersionStatus};
use runner::JobRuntime;
use shadow::Shadow;
use tally_deliver::settings::Target;
use wire::{JobStatus, StateValue};

/// Longest a delete waits for its job to stop before it answers; the job's
/// files are removed once it has, even if that is later.
const DELETE_WAIT: Duration = Duration::from_secs(10);

/// A refused or failed admin request: the HTTP status and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl ApiError {
    fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into() }
    }

    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, message)
    }

    fn not_found(name: &str) -> ApiError {
        ApiError::new(404, format!("no job named `{name}`; `tally jobs list` shows your jobs"))
    }

    fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, message)
    }
}

impl From<ServeError> for ApiError {
    /// A job being deleted is a conflict; anything else is the host's own
    /// trouble, whose details (paths) stay in its log.
    fn from(err: ServeError) -> ApiError {
        match &err {
            ServeError::Deleted { .. } | ServeError::Promoting { .. } => {
                ApiError::new(409, err.to_string())
            }
            _ => {
                tracing::error!(error = %err, "an admin request failed on the host's side");
                ApiError::internal("the host could not update the job's files (its log says why)")
            }
        }
    }
}

impl From<CompileError> for ApiError {
    fn from(err: CompileError) -> ApiError {
        match &err {
            CompileError::Busy(_) => ApiError::new(429, err.to_string()),
            err if err.is_the_uploads_fault() => ApiError::new(422, err.to_string()),
            _ => {
                // The host's own trouble: its details (paths) stay in its log.
                tracing::error!(error = %err, "cannot compile an upload");
                ApiError::internal(
                    "the host could not compile the upload (its log says why); nothing changed",
                )
            }
        }
    }
}

/// What a push did.
#[derive(Debug, Clone)]
pub struct Pushed {
    /// The version, as the history shows it.
    pub version: PluginVersion,
    /// Whether it was offered to the job (`false`: the job already runs it,
    /// or has it waiting or on trial, and nothing changed).
    pub accepted: bool,
}

type JobKey = (String, String);

/// The running host.
pub struct Host {
    config: HostConfig,
    plugins: PluginRuntime,
    compiler: Compiler,
    cpu: CpuScheduler,
    metrics: HostMetrics,
    jobs: Mutex<BTreeMap<JobKey, Arc<JobRuntime>>>,
    /// Names being deployed or deleted right now, with the plugin memory
    /// they will hold.
    deploying: Mutex<HashMap<JobKey, u64>>,
    /// Jobs on disk that could not be resumed at start, and why.
    broken: Mutex<BTreeMap<JobKey, String>>,
    threads: Mutex<HashMap<JobKey, JoinHandle<()>>>,
    /// Held by the one promotion that runs (see [`Host::promote_shadow`]).
    promotion: Mutex<()>,
    _lock: DirLock,
}

impl Host {
    /// Locks the data directory and resumes every job in it. Uploads are
    /// compiled by `compile_worker` (the `tally` binary: see
    /// [`tally_core::plugin::compiler`]).
    pub fn open(config: HostConfig, compile_worker: PathBuf) -> Result<Arc<Host>, ServeError> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(ServeError::file("create the data directory", &config.data_dir))?;
        let data_lock = DirLock::acquire(&config.data_dir)?;
        let plugins = PluginRuntime::new()?;
        let limits = CompileLimits {
            seconds: config.max_compile_seconds,
            memory_bytes: config.max_compile_memory_bytes,
        };
        let compiler = Compiler::new(compile_worker, config.data_dir.join("compiled"), limits);
        let cpu = CpuScheduler::for_this_machine();
        for (name, tenant) in &config.tenants {
            cpu.set_share(name, tenant.cpu_share);
        }
        let host = Arc::new(Host {
            config,
            plugins,
            compiler,
            cpu,
            metrics: HostMetrics::new(),
            jobs: Mutex::default(),
            deploying: Mutex::default(),
            broken: Mutex::default(),
            threads: Mutex::default(),
            promotion: Mutex::default(),
            _lock: data_lock,
        });
        for (tenant, name, dir) in registry::list_jobs(&host.config.data_dir)? {
            match host.resume_job(&tenant, &name, dir) {
                Ok(()) => tracing::info!(%tenant, job = %name, "job resumed"),
                Err(err) => {
                    tracing::error!(%tenant, job = %name, error = %err, "cannot resume job; fix the cause and restart the host");
                    let shown = runner::redact_paths(
                        &err.to_string(),
                        &[(host.config.data_dir.display().to_string(), "<data_dir>".to_string())],
                    );
                    lock(&host.broken).insert((tenant, name), shown);
                }
            }
        }
        Ok(host)
    }

    /// The host's configuration.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// The longest a request may take: one that compiles waits its turn and compiles.
    pub fn longest_request(&self) -> std::time::Duration {
        CompileLimits {
            seconds: self.config.max_compile_seconds,
            memory_bytes: self.config.max_compile_memory_bytes,
        }
        .longest_request()
    }

    /// Every job's metrics in Prometheus text format.
    pub fn render_metrics(&self) -> String {
        let jobs: Vec<Arc<JobRuntime>> = lock(&self.jobs).values().cloned().collect();
        for job in jobs {
            for delivery in job.deliveries() {
                job.metrics.delivery(&delivery.status());
            }
        }
        self.metrics.render()
    }

    /// The job file kept in `dir`, as `tenant`'s limits read it now.
    fn read_job_file(&self, tenant: &str, dir: &JobDir) -> Result<job_spec::ParsedJob, ServeError> {
        let tenant_config = self
            .config
            .tenants
            .get(tenant)
            .ok_or_else(|| ServeError::TenantGone { tenant: tenant.to_string() })?;
        let text = std::fs::read_to_string(dir.job_file())
            .map_err(ServeError::file("read", dir.job_file()))?;
        Ok(job_spec::parse(&text, tenant, tenant_config, &self.config)?)
    }

    fn resume_job(&self, tenant: &str, name: &str, dir: JobDir) -> Result<(), ServeError> {
        // A promotion of its shadow cut short after its commit point.
        self.adopt_promoted_shadow(tenant, &dir)?;
        let parsed = self.read_job_file(tenant, &dir)?;
        let version = crate::promote::live_version(&parsed.config)
            .map_err(|err| ServeError::Promotion { reason: format!("{err:#}") })?;
        let mut record = dir.read_record()?;
        let active = record.active().ok_or(ServeError::NoActiveVersion)?.clone();
        let plugin = self.load_version(tenant, &dir, &active.digest)?;
        // Pushed before the restart and not judged yet: offered again below.
        let mut pending = None;
        if let Some(version) = record.pending().cloned() {
            match self.load_version(tenant, &dir, &version.digest) {
                Ok(loaded) => pending = Some(loaded),
                Err(err) => {
                    record.failed(
                        &version.digest,
                        VersionStatus::Refused,
                        &format!("could not be loaded after a host restart: {err}"),
                    );
                    dir.write_record(&record)?;
                }
            }
        }
        let runtime = self.runtime(tenant, name, version, parsed, dir, record, plugin);
        runtime.metrics.set_plugin_info("", &active.digest);
        if let Some(plugin) = pending {
            runtime.offer(plugin);
        }
        self.start(tenant, name, runtime.clone());
        if runtime.dir.shadow().exists() {
            match self.resume_shadow(tenant, name, &runtime) {
                Ok(version) => tracing::info!(%tenant, job = %name, %version, "shadow resumed"),
                Err(err) => {
                    tracing::error!(%tenant, job = %name, error = %err, "cannot resume the job's shadow; discard it (`tally plugin discard`) and start it again")
                }
            }
        }
        Ok(())
    }

    /// Starts again the shadow a job had when the host stopped.
    fn resume_shadow(
        &self,
        tenant: &str,
        name: &str,
        job: &Arc<JobRuntime>,
    ) -> Result<Version, ServeError> {
        let dir = job.dir.shadow();
        let version_file = dir.path().join("version");
        let version = std::fs::read_to_string(&version_file)
            .map_err(ServeError::file("read", &version_file))?;
        let version = Version::parse(version.trim())
            .map_err(|err| ServeError::Shadow { reason: err.to_string() })?;
        if version == Version::LIVE || version == job.version {
            return Err(ServeError::Shadow {
                reason: format!("its version file names the live version ({version})"),
            });
        }
        let parsed = self.read_job_file(tenant, &dir)?;
        let record = dir.read_record()?;
        let active = record.active().ok_or(ServeError::NoActiveVersion)?.clone();
        let plugin = self.load_version(tenant, &dir, &active.digest)?;
        // A replay's start not seeded yet.
        let from_file = dir.path().join("from");
        let start = match std::fs::read_to_string(&from_file) {
            Ok(from) => replay_from(&parsed.config, from.trim())
                .map_err(|err| ServeError::Shadow { reason: err.message })?,
            Err(_) => None,
        };
        let runtime =
            self.shadow_runtime(tenant, name, version, parsed.config, dir, record, plugin);
        if let Some(start) = start {
            runtime.start_at(start, from_file);
        }
        let shadow = Shadow::start(version, runtime, job.config.clone());
        if let Err(reason) = job.set_shadow(shadow.clone()) {
            shadow.join();
            let runtime = shadow.runtime();
            self.metrics.remove(&runtime.metrics.labels, &runtime.status().plugin);
            return Err(ServeError::Shadow { reason: reason.to_string() });
        }
        Ok(version)
    }

    /// The runtime of a job's shadow: its own metrics (`<job>@<version>`)
    /// and seat in the tenant's CPU share, no deliveries.
    #[allow(clippy::too_many_arguments)]
    fn shadow_runtime(
        &self,
        tenant: &str,
        name: &str,
        version: Version,
        config: crate::config::JobConfig,
        dir: JobDir,
        record: JobRecord,
        plugin: LoadedPlugin,
    ) -> Arc<JobRuntime> {
        let parsed = job_spec::ParsedJob { name: name.to_string(), config, deliveries: Vec::new() };
        let runtime = self.runtime(
            tenant,
            &format!("{name}@{version}"),
            version,
            parsed,
            dir,
            record,
            plugin,
        );
        runtime.metrics.set_plugin_info("", &runtime.status().plugin);
        runtime
    }

    /// A job's runtime, running `version` of the job `parsed` describes,
    /// with its seat in the tenant's CPU share and its metrics labelled
    /// `metrics_name`.
    #[allow(clippy::too_many_arguments)]
    fn runtime(
        &self,
        tenant: &str,
        metrics_name: &str,
        version: Version,
        parsed: job_spec::ParsedJob,
        dir: JobDir,
        record: JobRecord,
        plugin: LoadedPlugin,
    ) -> Arc<JobRuntime> {
        let metrics = self.metrics.job(tenant, metrics_name);
        let config = self.version_config(version, &parsed.config);
        JobRuntime::new(
            tenant,
            &parsed.name,
            (version, config, parsed.config),
            dir,
            record,
            plugin,
            metrics,
            self.cpu.seat(tenant),
            self.config.log_limits(),
            parsed.deliveries,
        )
    }

    /// A version kept in a job's directory: its compiled form from the
    /// cache, compiled anew (in a worker) only if the cache lost it.
    fn load_version(
        &self,
        tenant: &str,
        dir: &JobDir,
        digest: &str,
    ) -> Result<LoadedPlugin, ServeError> {
        let path = dir.plugin_file(digest);
        let bytes = std::fs::read(&path)
            .map_err(|source| ServeError::ReadVersion { digest: digest.to_string(), source })?;
        let found = tally_core::plugin::digest(&bytes);
        if found != digest {
            return Err(ServeError::VersionChanged { digest: digest.to_string(), found });
        }
        Ok(self.compiler.load(&self.plugins, tenant, &format!("version {digest}"), &bytes)?)
    }

    fn start(&self, tenant: &str, name: &str, runtime: Arc<JobRuntime>) {
        let key = (tenant.to_string(), name.to_string());
        let thread = runtime.spawn();
        lock(&self.jobs).insert(key.clone(), runtime);
        lock(&self.threads).insert(key, thread);
    }

    /// `tenant`'s job `name`; another tenant's job is reported as missing.
    pub fn job(&self, tenant: &str, name: &str) -> Result<Arc<JobRuntime>, ApiError> {
        let key = (tenant.to_string(), name.to_string());
        if let Some(job) = lock(&self.jobs).get(&key) {
            return Ok(job.clone());
        }
        match lock(&self.broken).get(&key) {
            Some(reason) => Err(ApiError::new(
                409,
                format!(
                    "job `{name}` could not be resumed when the host started: {reason}; fix that and restart the host, or delete the job"
                ),
            )),
            None => Err(ApiError::not_found(name)),
        }
    }

    /// The statuses of `tenant`'s jobs, with those that could not be
    /// resumed when the host started (state `broken`).
    pub fn list(&self, tenant: &str) -> Vec<JobStatus> {
        // Statuses are read without the jobs' lock held: a job's own locks
        // can wait on its disk.
        let jobs: Vec<Arc<JobRuntime>> = lock(&self.jobs)
            .iter()
            .filter(|((owner, _), _)| owner == tenant)
            .map(|(_, job)| job.clone())
            .collect();
        let mut statuses: Vec<JobStatus> = jobs.iter().map(|job| job.status()).collect();
        let broken = lock(&self.broken);
        statuses.extend(
            broken
                .iter()
                .filter(|((owner, _), _)| owner == tenant)
                .map(|((_, name), reason)| JobStatus::broken(name, reason)),
        );
        statuses.sort_by(|a, b| a.name.cmp(&b.name));
        statuses
    }

    /// Deploys job file `text` with `plugin` for `tenant`. Checks everything
    /// before writing anything: a refused deploy changes nothing.
    pub fn deploy(&self, tenant: &str, text: &str, plugin: &[u8]) -> Result<JobStatus, ApiError> {
        let tenant_config =
            self.config.tenants.get(tenant).ok_or_else(|| ApiError::new(401, "unknown tenant"))?;
        let parsed = job_spec::parse(text, tenant, tenant_config, &self.config)
            .map_err(|err| ApiError::bad_request(err.to_string()))?;
        let name = parsed.name.clone();
        let key = (tenant.to_string(), name.clone());
        if let Some(reason) = lock(&self.broken).get(&key) {
            return Err(ApiError::new(
                409,
                format!(
                    "job `{name}` exists on disk but could not be resumed: {reason}; delete it first"
                ),
            ));
        }
        {
            let jobs = lock(&self.jobs);
            let mut deploying = lock(&self.deploying);
            let asked = parsed.config.settings.limits.memory_bytes;
            if !jobs.contains_key(&key) {
                self.within_limits(tenant, &jobs, &deploying, asked, "this job")?;
            }
            if jobs.contains_key(&key) || !reserve(&mut deploying, &key, asked) {
                return Err(ApiError::new(
                    409,
                    format!(
                        "job `{name}` already exists; push a new plugin version with `tally plugin push {name} <file>`, or delete the job first"
                    ),
                ));
            }
        }
        let result = self.create(tenant, &name, parsed, text, plugin);
        lock(&self.deploying).remove(&key);
        result
    }

    /// Refuses one more job or shadow of `tenant` with `asked` bytes of
    /// plugin memory past the tenant's `max_jobs` or
    /// `max_total_memory_bytes`: a shadow counts as a job.
    fn within_limits(
        &self,
        tenant: &str,
        jobs: &BTreeMap<JobKey, Arc<JobRuntime>>,
        deploying: &HashMap<JobKey, u64>,
        asked: u64,
        what: &str,
    ) -> Result<(), ApiError> {
        let tenant_config =
            self.config.tenants.get(tenant).ok_or_else(|| ApiError::new(401, "unknown tenant"))?;
        let (mut owned, mut memory) = (0usize, 0u64);
        for ((owner, _), job) in jobs.iter() {
            if owner == tenant {
                owned += 1;
                memory += job.config.settings.limits.memory_bytes;
                if let Some(shadow) = job.shadow() {
                    owned += 1;
                    memory += shadow.runtime().config.settings.limits.memory_bytes;
                }
            }
        }
        for ((owner, _), reserved) in deploying.iter() {
            if owner == tenant {
                owned += 1;
                memory += reserved;
            }
        }
        if owned >= tenant_config.max_jobs {
            return Err(ApiError::new(
                409,
                format!(
                    "tenant `{tenant}` already has {owned} jobs and shadows, its limit (max_jobs in the host file, {}); delete a job or discard a shadow first",
                    tenant_config.max_jobs
                ),
            ));
        }
        if memory + asked > tenant_config.max_total_memory_bytes {
            return Err(ApiError::new(
                409,
                format!(
                    "tenant `{tenant}`'s jobs and shadows already have {memory} bytes of plugin memory (limits.memory_bytes); {what}'s {asked} more would pass its limit of {} (max_total_memory_bytes in the host file); lower limits.memory_bytes, delete a job or discard a shadow",
                    tenant_config.max_total_memory_bytes
                ),
            ));
        }
        Ok(())
    }

    fn create(
        &self,
        tenant: &str,
        name: &str,
        parsed: job_spec::ParsedJob,
        text: &str,
        bytes: &[u8],
    ) -> Result<JobStatus, ApiError> {
        let plugin = self.compile(tenant, name, bytes)?;
        let config = &parsed.config;
        if let crate::config::Mode::Kafka(kafka) = &config.mode {
            // Missing topics are a bad deploy, said now, not a job failing later.
            tally_kafka::prepare_topics(&config.settings, kafka)
                .map_err(|err| ApiError::bad_request(err.to_string()))?;
        }
        let dir = JobDir::new(&self.config.data_dir, tenant, name);
        if dir.exists() {
            return Err(ApiError::new(
                409,
                format!("job `{name}` still has files in the data directory; delete the job first"),
            ));
        }
        if dir.path().exists() {
            // Left by a deploy or delete that did not finish: no record, so no job.
            std::fs::remove_dir_all(dir.path()).map_err(|err| {
                tracing::error!(path = %dir.path().display(), error = %err, "cannot clear a job directory left by an unfinished deploy");
                ApiError::internal(format!("cannot clear the files an earlier deploy of `{name}` left: {}", err.kind()))
            })?;
        }
        let mut record = JobRecord::default();
        record.pushed(PluginVersion::new(
            plugin.digest(),
            bytes.len() as u64,
            VersionStatus::Active,
        ));
        let written = dir
            .create()
            .and_then(|()| dir.write_file(&dir.plugin_file(plugin.digest()), bytes))
            .and_then(|()| dir.write_file(&dir.job_file(), text.as_bytes()))
            // The record last: without it the directory is not a job.
            .and_then(|()| dir.write_record(&record));
        if let Err(err) = written {
            let _ = std::fs::remove_dir_all(dir.path());
            tracing::error!(%tenant, job = %name, error = %err, "cannot write a deployed job's files");
            return Err(ApiError::internal(format!(
                "the host cannot write job `{name}`'s files (its disk?); nothing was deployed"
            )));
        }
        let runtime =
            self.runtime(tenant, name, Version::LIVE, parsed, dir, record, plugin.clone());
        runtime.metrics.set_plugin_info("", plugin.digest());
        let status = runtime.status();
        self.start(tenant, name, runtime);
        tracing::info!(%tenant, job = %name, plugin = %plugin.digest(), "job deployed");
        Ok(status)
    }

    /// Checks and compiles an upload in a bounded worker, in `tenant`'s
    /// turn, off every job's processing path (or takes it from the cache).
    fn compile(&self, tenant: &str, name: &str, bytes: &[u8]) -> Result<LoadedPlugin, ApiError> {
        Ok(self.compiler.load(&self.plugins, tenant, &format!("upload for job {name}"), bytes)?)
    }

    /// Pauses or resumes `tenant`'s job `name`.
    pub fn set_paused(
        &self,
        tenant: &str,
        name: &str,
        paused: bool,
    ) -> Result<JobStatus, ApiError> {
        let job = self.job(tenant, name)?;
        job.set_paused(paused)?;
        Ok(job.status())
    }

    /// Stops `tenant`'s job `name` (committing what it processed) and
    /// deletes its directory: state, outputs and plugin versions. A Kafka
    /// job's topics and consumer group stay on the brokers.
    pub fn delete(self: &Arc<Self>, tenant: &str, name: &str) -> Result<(), ApiError> {
        let key = (tenant.to_string(), name.to_string());
        if lock(&self.broken).contains_key(&key) {
            JobDir::new(&self.config.data_dir, tenant, name).remove()?;
            lock(&self.broken).remove(&key);
            return Ok(());
        }
        let job = self.job(tenant, name)?;
        // Held until the files are gone: no deploy of the name meanwhile,
        // nor while its shadow is started or discarded.
        let mut deploying = lock(&self.deploying);
        if deploying.contains_key(&(tenant.to_string(), format!("{name}#shadow")))
            || !reserve(&mut deploying, &key, job.config.settings.limits.memory_bytes)
        {
            return Err(ApiError::new(
                409,
                format!(
                    "job `{name}` is being deployed or deleted, or its shadow started or discarded, right now; try again"
                ),
            ));
        }
        drop(deploying);
        // A promotion meanwhile replaced the runtime: delete the new one.
        let current = lock(&self.jobs).get(&key).cloned();
        if !current.is_some_and(|current| Arc::ptr_eq(&current, &job)) {
            lock(&self.deploying).remove(&key);
            return Err(ApiError::new(
                409,
                format!("job `{name}` was promoted or started again meanwhile; try again"),
            ));
        }
        job.mark_deleted();
        job.end();
        let thread = lock(&self.threads).remove(&key);
        let finish = {
            let (job, key, tenant, name) =
                (job.clone(), key.clone(), tenant.to_string(), name.to_string());
            move |host: &Host| {
                if let Some(thread) = thread {
                    let _ = thread.join();
                }
                job.join_deliveries();
                job.join_shadow();
                let removed = job.dir.remove();
                lock(&host.jobs).remove(&key);
                host.metrics.remove(&job.metrics.labels, &job.status().plugin);
                if let Some(shadow) = job.take_shadow() {
                    let runtime = shadow.runtime();
                    host.metrics.remove(&runtime.metrics.labels, &runtime.status().plugin);
                }
                lock(&host.deploying).remove(&key);
                match &removed {
                    Ok(()) => tracing::info!(%tenant, job = %name, "job deleted"),
                    Err(err) => {
                        tracing::error!(%tenant, job = %name, error = %err, "job stopped, but its files could not all be removed")
                    }
                }
                removed
            }
        };
        // The job stops within a tick even mid-call; a job stuck elsewhere
        // (a Kafka restore, say) is finished off in the background.
        let (done, finished) = std::sync::mpsc::channel();
        let host = self.clone();
        std::thread::Builder::new()
            .name(format!("delete-{tenant}.{name}"))
            .spawn(move || {
                let removed = finish(&host);
                let _ = done.send(removed);
            })
            .map_err(|err| ApiError::internal(format!("cannot start the delete: {err}")))?;
        match finished.recv_timeout(DELETE_WAIT) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(ApiError::internal(
                "the job stopped, but some of its files could not be removed; the host's log says which",
            )),
            Err(_) => Err(ApiError::new(
                202,
                format!("job `{name}` is stopping; its files are removed once it has"),
            )),
        }
    }

    /// Compiles and checks `bytes`, then offers them to the job: they are
    /// swapped in at its next transaction boundary. The version the job
    /// runs, or has waiting or on trial, is not pushed again.
    pub fn push(&self, tenant: &str, name: &str, bytes: &[u8]) -> Result<Pushed, ApiError> {
        let job = self.job(tenant, name)?;
        let digest = tally_core::plugin::digest(bytes);
        if let Some(current) = job.record().undecided_or_active(&digest) {
            return Ok(Pushed { version: current.clone(), accepted: false });
        }
        let plugin = self.compile(tenant, name, bytes)?;
        job.dir.write_file(&job.dir.plugin_file(plugin.digest()), bytes).map_err(|err| {
            tracing::error!(%tenant, job = %name, error = %err, "cannot write a pushed plugin version");
            ApiError::internal("the host cannot write the plugin version (its disk?); nothing was pushed")
        })?;
        let version =
            PluginVersion::new(plugin.digest(), bytes.len() as u64, VersionStatus::Pending);
        let removed = job.push(plugin, version.clone(), self.config.plugin_versions_kept)?;
        // A compiled form is shared by every job and shadow with the same plugin.
        let jobs: Vec<Arc<JobRuntime>> = lock(&self.jobs).values().cloned().collect();
        let runtimes: Vec<Arc<JobRuntime>> = jobs
            .iter()
            .flat_map(|job| {
                std::iter::once(job.clone())
                    .chain(job.shadow().map(|shadow| shadow.runtime().clone()))
            })
            .collect();
        for digest in removed {
            let in_use = runtimes.iter().any(|other| {
                other
                    .record()
                    .versions
                    .iter()
                    .any(|version| version.digest == digest && !version.removed)
            });
            if !in_use {
                self.compiler.remove(&self.plugins, &digest);
            }
        }
        tracing::info!(%tenant, job = %name, plugin = %version.digest, "plugin version pushed");
        Ok(Pushed { version, accepted: true })
    }

    /// Pushes the version that ran before the active one again.
    pub fn rollback(&self, tenant: &str, name: &str) -> Result<Pushed, ApiError> {
        let job = self.job(tenant, name)?;
        let previous = job.record().previous().cloned().ok_or_else(|| {
            ApiError::new(409, format!("job `{name}` has no earlier version to go back to; `tally plugin history {name}` lists its versions"))
        })?;
        let bytes = std::fs::read(job.dir.plugin_file(&previous.digest)).map_err(|err| {
            ApiError::internal(format!("cannot read version {}: {}", previous.digest, err.kind()))
        })?;
        self.push(tenant, name, &bytes)
    }

    /// Starts a shadow of `tenant`'s job `name`: the candidate `bytes`
    /// (with `plugin_config`, a TOML table, instead of the job's, if
    /// given) runs the job's logic on its input from the start, into a
    /// version of its own, never delivered, beside the live version. It
    /// counts as one of the tenant's jobs. Checks everything before it
    /// writes anything.
    pub fn start_shadow(
        &self,
        tenant: &str,
        name: &str,
        plugin: Option<&[u8]>,
        plugin_config: Option<&str>,
        from: Option<&str>,
    ) -> Result<JobStatus, ApiError> {
        let job = self.job(tenant, name)?;
        // No candidate: the live plugin, replayed (with another
        // `[plugin_config]`, or from another start).
        let live_plugin;
        let bytes = match plugin {
            Some(bytes) => bytes,
            None => {
                let digest = job.status().plugin;
                live_plugin = std::fs::read(job.dir.plugin_file(&digest)).map_err(|err| {
                    ApiError::internal(format!(
                        "cannot read the job's plugin {digest}: {}",
                        err.kind()
                    ))
                })?;
                &live_plugin
            }
        };
        if let Some(shadow) = job.shadow() {
            return Err(ApiError::new(
                409,
                format!(
                    "job `{name}` already has a shadow ({}); discard it first with `tally plugin discard {name}`",
                    shadow.version()
                ),
            ));
        }
        let tenant_config =
            self.config.tenants.get(tenant).ok_or_else(|| ApiError::new(401, "unknown tenant"))?;
        let mut table = deployed_job_file(&job, tenant, name)?;
        // Never delivered: its outputs are compared, not sent.
        table.remove("deliver");
        if let Some(text) = plugin_config {
            refuse_over_job_file_size("`plugin_config`", text)?;
            let config: toml::Table = toml::from_str(text).map_err(|err| {
                ApiError::bad_request(format!(
                    "`plugin_config` must be a TOML table (the candidate's [plugin_config]): {err}"
                ))
            })?;
            table.insert("plugin_config".to_string(), toml::Value::Table(config));
        }
        let text = toml::to_string(&table).map_err(|err| {
            ApiError::internal(format!("cannot write the shadow's job file: {err}"))
        })?;
        let parsed = job_spec::parse(&text, tenant, tenant_config, &self.config)
            .map_err(|err| ApiError::bad_request(format!("the shadow's job: {err}")))?;
        let start = from
            .map(|from| {
                replay_from(&parsed.config, from).map(|start| start.map(|start| (from, start)))
            })
            .transpose()?
            .flatten();
        let key = (tenant.to_string(), format!("{name}#shadow"));
        {
            let jobs = lock(&self.jobs);
            let mut deploying = lock(&self.deploying);
            let asked = parsed.config.settings.limits.memory_bytes;
            self.within_limits(tenant, &jobs, &deploying, asked, "a shadow")?;
            if deploying.contains_key(&(tenant.to_string(), name.to_string()))
                || !reserve(&mut deploying, &key, asked)
            {
                return Err(ApiError::new(
                    409,
                    format!(
                        "job `{name}` or its shadow is being started, discarded or deleted right now; try again"
                    ),
                ));
            }
        }
        // Checked again under the reservation: nothing else starts or
        // discards this job's shadow now.
        let on_disk = job.dir.shadow().exists();
        let result = if job.shadow().is_some() || on_disk {
            Err(ApiError::new(
                409,
                format!(
                    "job `{name}` already has a shadow; discard it first with `tally plugin discard {name}`"
                ),
            ))
        } else {
            self.create_shadow(tenant, name, &job, (parsed, &text, start), bytes)
        };
        lock(&self.deploying).remove(&key);
        result?;
        tracing::info!(%tenant, job = %name, "shadow started");
        Ok(job.status())
    }

    fn create_shadow(
        &self,
        tenant: &str,
        name: &str,
        job: &Arc<JobRuntime>,
        (parsed, text, start): (job_spec::ParsedJob, &str, Option<(&str, tally_kafka::StartAt)>),
        bytes: &[u8],
    ) -> Result<(), ApiError> {
        let plugin = self.compile(tenant, name, bytes)?;
        let disk = |err: ServeError| {
            tracing::error!(%tenant, job = %name, error = %err, "cannot write a shadow's files");
            ApiError::internal(
                "the host cannot write the shadow's files (its disk?); no shadow was started",
            )
        };
        // A number no version of the job had: a Kafka version's topics and
        // group outlive it.
        let last_file = self.last_version_file(tenant, name);
        let last = std::fs::read_to_string(&last_file)
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok())
            .unwrap_or(1);
        let on_disk =
            Version::on_disk(&job.base_config).last().map_or(1, |version| version.number());
        let number = last.max(on_disk) + 1;
        let version = Version::parse(&number.to_string()).map_err(|_| {
            ApiError::new(
                409,
                format!(
                    "job `{name}` has used every version number; deploy it again under a new name"
                ),
            )
        })?;
        let config = self.version_config(version, &parsed.config);
        if let crate::config::Mode::Kafka(kafka) = &config.mode {
            tally_kafka::prepare_topics(&config.settings, kafka).map_err(|err| {
                let who = if kafka.create_topics {
                    "the host creates them"
                } else {
                    "this host does not create tenants' topics (kafka_create_topics in the host file): the operator creates the version's topics first"
                };
                ApiError::bad_request(format!(
                    "the shadow writes topics of its own ({version}: each output topic and the dead-letter topic with `.{version}` appended; {who}): {err}"
                ))
            })?;
        }
        let dir = job.dir.shadow();
        if dir.path().exists() {
            // Left by a start or discard that did not finish (no record:
            // checked under the reservation), so no shadow.
            std::fs::remove_dir_all(dir.path())
                .map_err(|err| disk(ServeError::file("remove", dir.path())(err)))?;
        }
        let mut record = JobRecord::default();
        record.pushed(PluginVersion::new(
            plugin.digest(),
            bytes.len() as u64,
            VersionStatus::Active,
        ));
        std::fs::create_dir_all(last_file.parent().expect("a file in a directory"))
            .map_err(ServeError::file("create", &last_file))
            .and_then(|()| job.dir.write_file(&last_file, version.number().to_string().as_bytes()))
            .and_then(|()| dir.create())
            .and_then(|()| dir.write_file(&dir.plugin_file(plugin.digest()), bytes))
            .and_then(|()| dir.write_file(&dir.job_file(), text.as_bytes()))
            .and_then(|()| {
                dir.write_file(&dir.path().join("version"), version.to_string().as_bytes())
            })
            .and_then(|()| match &start {
                Some((from, _)) => dir.write_file(&dir.path().join("from"), from.as_bytes()),
                None => Ok(()),
            })
            // The record last: without it the directory is not a shadow.
            .and_then(|()| dir.write_record(&record))
            .map_err(|err| {
                let _ = std::fs::remove_dir_all(dir.path());
                disk(err)
            })?;
        let runtime =
            self.shadow_runtime(tenant, name, version, parsed.config, dir.clone(), record, plugin);
        if let Some((_, start)) = start {
            runtime.start_at(start, dir.path().join("from"));
        }
        let shadow = Shadow::start(version, runtime, job.config.clone());
        if let Err(reason) = job.set_shadow(shadow.clone()) {
            // The job ended meanwhile (a host shutdown): nothing of it stays.
            shadow.join();
            let failures =
                self.remove_shadow_files(job, &(version, Some(shadow.runtime().clone())));
            if !failures.is_empty() {
                tracing::error!(%tenant, job = %name, errors = ?failures, "a refused shadow's files could not all be removed");
            }
            return Err(ApiError::new(409, format!("job `{name}`: {reason}")));
        }
        Ok(())
    }

    /// Where the last version number a shadow of `tenant`'s job `name`
    /// took is kept: outside the job's directory, so a job deployed again
    /// under the name never takes a number (and Kafka topics) again.
    fn last_version_file(&self, tenant: &str, name: &str) -> PathBuf {
        self.config.data_dir.join("versions-used").join(tenant).join(name)
    }

    /// `job` as its `version` runs it: its own names (see
    /// [`Version::of`]), creating its Kafka topics only where the host lets
    /// tenants create topics.
    fn version_config(
        &self,
        version: Version,
        job: &crate::config::JobConfig,
    ) -> crate::config::JobConfig {
        let mut config = version.of(job);
        if version != Version::LIVE
            && let crate::config::Mode::Kafka(kafka) = &mut config.mode
        {
            kafka.create_topics = self.config.kafka_create_topics;
        }
        config
    }

    /// Removes a stopped shadow's files, its state and outputs, and its
    /// metrics; returns what could not be removed.
    fn remove_shadow_files(
        &self,
        job: &JobRuntime,
        shadow: &(Version, Option<Arc<JobRuntime>>),
    ) -> Vec<String> {
        let (version, runtime) = shadow;
        if let Some(runtime) = runtime {
            self.metrics.remove(&runtime.metrics.labels, &runtime.status().plugin);
        }
        let mut failures = Vec::new();
        if let Err(err) = job.dir.shadow().remove()
            && job.dir.shadow().path().exists()
        {
            failures.push(err.to_string());
        }
        // Never the live version's: a shadow is v2 or later, and not live.
        if *version == Version::LIVE || *version == job.version {
            return failures;
        }
        let (state_dir, output_dir) = match &version.of(&job.base_config).mode {
            crate::config::Mode::Local(local) => {
                (local.state_dir.clone(), Some(local.output_dir.clone()))
            }
            crate::config::Mode::Kafka(kafka) => (kafka.state_dir.clone(), None),
        };
        for path in std::iter::once(state_dir).chain(output_dir) {
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => failures.push(format!("{}: {err}", path.display())),
            }
        }
        failures
    }

    /// Stops `tenant`'s job `name`'s shadow and deletes its state and
    /// outputs (a Kafka version's topics and group stay on the brokers).
    /// The live version is not touched.
    pub fn discard_shadow(
        self: &Arc<Self>,
        tenant: &str,
        name: &str,
    ) -> Result<wire::Discarded, ApiError> {
        let job = self.job(tenant, name)?;
        // One start or discard of a job's shadow at a time, and none while
        // the job is deployed or deleted.
        let key = (tenant.to_string(), format!("{name}#shadow"));
        {
            let mut deploying = lock(&self.deploying);
            if deploying.contains_key(&(tenant.to_string(), name.to_string()))
                || !reserve(&mut deploying, &key, 0)
            {
                return Err(ApiError::new(
                    409,
                    format!(
                        "job `{name}` or its shadow is being started, discarded or deleted right now; try again"
                    ),
                ));
            }
        }
        let result = self.discard_shadow_of(tenant, name, &job);
        lock(&self.deploying).remove(&key);
        result
    }

    fn discard_shadow_of(
        self: &Arc<Self>,
        tenant: &str,
        name: &str,
        job: &Arc<JobRuntime>,
    ) -> Result<wire::Discarded, ApiError> {
        let dir = job.dir.shadow();
        let shadow = job.take_shadow();
        let version = match &shadow {
            Some(shadow) => Some(shadow.version()),
            None => std::fs::read_to_string(dir.path().join("version"))
                .ok()
                .and_then(|text| Version::parse(text.trim()).ok()),
        };
        let Some(version) =
            version.filter(|version| *version != Version::LIVE && *version != job.version)
        else {
            return Err(ApiError::new(
                404,
                format!(
                    "job `{name}` has no shadow; start one with `tally plugin push {name} <file> --shadow`"
                ),
            ));
        };
        if let Some(shadow) = &shadow {
            shadow.end();
        }
        // The shadow stops within a tick even mid-call; one stuck elsewhere
        // (a Kafka restore, say) is finished off in the background.
        let (done, finished) = std::sync::mpsc::channel();
        let (job, tenant_name, job_name) = (job.clone(), tenant.to_string(), name.to_string());
        let host = self.clone();
        let finish = move || {
            if let Some(shadow) = &shadow {
                shadow.join();
            }
            let runtime = shadow.as_ref().map(|shadow| shadow.runtime().clone());
            let failures = host.remove_shadow_files(&job, &(version, runtime));
            if failures.is_empty() {
                tracing::info!(tenant = %tenant_name, job = %job_name, %version, "shadow discarded");
            } else {
                tracing::error!(tenant = %tenant_name, job = %job_name, errors = ?failures, "a shadow stopped, but its files could not all be removed");
            }
            let _ = done.send(failures.is_empty());
        };
        std::thread::Builder::new()
            .name(format!("discard-{tenant}.{name}"))
            .spawn(finish)
            .map_err(|err| ApiError::internal(format!("cannot start the discard: {err}")))?;
        match finished.recv_timeout(DELETE_WAIT) {
            Ok(true) => {
                Ok(wire::Discarded { job: name.to_string(), discarded: version.to_string() })
            }
            Ok(false) => Err(ApiError::internal(
                "the shadow stopped, but some of its files could not be removed; the host's log says which",
            )),
            Err(_) => Err(ApiError::new(
                202,
                format!(
                    "the shadow of job `{name}` ({version}) is stopping; its files are removed once it has"
                ),
            )),
        }
    }

    /// Every version pushed to the job, oldest first.
    pub fn history(&self, tenant: &str, name: &str) -> Result<Vec<PluginVersion>, ApiError> {
        Ok(self.job(tenant, name)?.record().versions)
    }

    /// The committed value of `key` in the job's state.
    pub fn state_get(&self, tenant: &str, name: &str, key: &str) -> Result<StateValue, ApiError> {
        let job = self.job(tenant, name)?;
        let (store, partitions) = job
            .store()
            .ok_or_else(|| {
                ApiError::new(
                    409,
                    format!("job `{name}` is not open: paused since the host started (resume it), or failing (`tally jobs status {name}` shows its last error)"),
                )
            })?;
        let keys: Vec<(Option<i32>, Vec<u8>)> = if partitions == 0 {
            vec![(None, key.as_bytes().to_vec())]
        } else {
            (0..partitions)
                .map(|partition| {
                    (Some(partition), tally_kafka::keys::namespaced(partition, key.as_bytes()))
                })
                .collect()
        };
        let refs: Vec<&[u8]> = keys.iter().map(|(_, key)| key.as_slice()).collect();
        let values = store.get_many(&refs).map_err(|err| {
            tracing::error!(%tenant, job = %name, error = %err, "cannot read a committed state value");
            ApiError::internal("the host could not read the job's state (its log says why)")
        })?;
        for ((partition, _), value) in keys.iter().zip(values) {
            if let Some(value) = value {
                let value = serde_json::from_slice(&value).unwrap_or_else(|_| {
                    serde_json::Value::String(String::from_utf8_lossy(&value).into_owned())
                });
                return Ok(StateValue { key: key.to_string(), value, partition: *partition });
            }
        }
        Err(ApiError::new(
            404,
            format!(
                "job `{name}` has no committed value for key {key:?}; keys are matched byte for byte (the Rust SDK stores them as JSON)"
            ),
        ))
    }

    /// The delivery of `output` of `tenant`'s job `name`.
    fn delivery(
        &self,
        tenant: &str,
        name: &str,
        output: &str,
    ) -> Result<Arc<delivery_runner::DeliveryRunner>, ApiError> {
        let job = self.job(tenant, name)?;
        job.delivery(output).ok_or_else(|| {
            let deliveries = job.deliveries();
            let delivered: Vec<&str> = deliveries.iter().map(|d| d.output()).collect();
            ApiError::new(
                404,
                format!(
                    "job `{name}` delivers no output {output:?} (delivered: {}); add a [[deliver]] section to its job file",
                    if delivered.is_empty() { "none".to_string() } else { delivered.join(", ") }
                ),
            )
        })
    }

    /// Changes `tenant`'s job `name`'s deliveries in place: `text` holds
    /// its new `[[deliver]]` sections (none: it delivers nothing). Checked
    /// as a deploy checks them; an output delivered before and after keeps
    /// its ledger and goes on where it was, so nothing is sent twice. Its
    /// target kind and body cannot change in place (the ledger's records
    /// were sent as they were): remove its delivery first. The job runs on.
    pub fn set_deliveries(
        &self,
        tenant: &str,
        name: &str,
        text: &str,
    ) -> Result<JobStatus, ApiError> {
        let job = self.job(tenant, name)?;
        let tenant_config =
            self.config.tenants.get(tenant).ok_or_else(|| ApiError::new(401, "unknown tenant"))?;
        refuse_over_job_file_size("the deliveries", text)?;
        let mut sections: toml::Table = toml::from_str(text).map_err(|err| {
            ApiError::bad_request(format!(
                "the deliveries must be TOML `[[deliver]]` sections: {err}"
            ))
        })?;
        if let Some(other) = sections.keys().find(|key| *key != "deliver") {
            return Err(ApiError::bad_request(format!(
                "only `[[deliver]]` sections change in place; `{}` is part of the job itself: delete the job and deploy it again to change it",
                tally_core::text::sanitize(other, 100)
            )));
        }
        let mut table = deployed_job_file(&job, tenant, name)?;
        match sections.remove("deliver") {
            Some(deliver) => table.insert("deliver".to_string(), deliver),
            None => table.remove("deliver"),
        };
        let changed = toml::to_string(&table)
            .map_err(|err| ApiError::internal(format!("cannot write the job file: {err}")))?;
        let parsed = job_spec::parse(&changed, tenant, tenant_config, &self.config)
            .map_err(|err| ApiError::bad_request(err.to_string()))?;
        job.change_deliveries(
            |running| {
                for new in &parsed.deliveries {
                    let Some(old) = running.iter().find(|old| old.output() == new.output) else {
                        if job.version != Version::LIVE {
                            return Err(ApiError::bad_request(format!(
                                "job `{name}` runs {} (promoted): a delivery of output {:?} added now would send {}'s records as new ones to a receiver that may hold an older version's; deploy the job under a new name to deliver to a new receiver",
                                job.version, new.output, job.version
                            )));
                        }
                        continue;
                    };
                    let refusal = match (&old.settings().target, &new.target) {
                        (Target::Http(old), Target::Http(new)) if old.body != new.body => Some(format!(
                            "its HTTP body would change from {:?} to {:?}, and a record is never sent again with another body",
                            old.body, new.body
                        )),
                        (Target::Http(old), Target::Http(new))
                            if old.idempotency_header != new.idempotency_header =>
                        {
                            Some(format!(
                                "its idempotency header would change from {:?} to {:?}, and a record in doubt sent again under another header is a new request to the receiver",
                                old.idempotency_header, new.idempotency_header
                            ))
                        }
                        (Target::Http(_), Target::Postgres(_)) | (Target::Postgres(_), Target::Http(_)) => {
                            Some("its target would change between HTTP and PostgreSQL".to_string())
                        }
                        _ => None,
                    };
                    if let Some(refusal) = refusal {
                        let kafka = matches!(job.config.mode, crate::config::Mode::Kafka(_));
                        let then = if kafka {
                            "a Kafka job's delivery keeps its ledger topic, so a delivery of this output added again resumes from it as it was: deploy the job under a new name to deliver it otherwise"
                        } else {
                            "remove its [[deliver]] section first (its delivery state goes with it), then add the new one"
                        };
                        return Err(ApiError::bad_request(format!(
                            "output {:?} cannot change its delivery in place: {refusal}; {then}",
                            new.output
                        )));
                    }
                }
                job.dir.write_file(&job.dir.job_file(), changed.as_bytes()).map_err(|err| {
                    tracing::error!(%tenant, job = %name, error = %err, "cannot write a job's file");
                    ApiError::internal("the host cannot write the job's file (its disk?); nothing changed")
                })?;
                Ok(parsed.deliveries)
            },
            |why| ApiError::new(409, format!("job `{name}`: {why}")),
        )?;
        tracing::info!(%tenant, job = %name, "deliveries changed in place");
        Ok(job.status())
    }

    /// The records of a delivery waiting as `unknown` for the tenant.
    pub fn delivery_unknown(
        &self,
        tenant: &str,
        name: &str,
        output: &str,
    ) -> Result<Vec<tally_deliver::status::UnknownRecord>, ApiError> {
        Ok(self.delivery(tenant, name, output)?.unknown())
    }

    /// Settles a delivery's record waiting as `unknown`: `applied` after
    /// the tenant checked its receiver applied it, or not (sent again).
    pub fn delivery_resolve(
        &self,
        tenant: &str,
        name: &str,
        output: &str,
        key: String,
        applied: bool,
    ) -> Result<wire::Resolved, ApiError> {
        let delivery = self.delivery(tenant, name, output)?;
        if !delivery.unknown().iter().any(|record| record.key == key) {
            return Err(ApiError::new(
                404,
                format!(
                    "no record of job `{name}`'s delivery of {output:?} waits as unknown with key {:?}; list them with GET /v1/jobs/{name}/deliveries/{output}/unknown",
                    tally_core::text::sanitize(&key, 200)
                ),
            ));
        }
        delivery.resolve(key.clone(), applied).map_err(|err| {
            tracing::error!(%tenant, job = %name, %output, error = %err, "cannot queue a resolution");
            ApiError::internal("the host cannot write the resolution (its disk?); try again")
        })?;
        let then = if applied {
            "counts as delivered within a second"
        } else {
            "is sent again within a second, with the same key and body"
        };
        Ok(wire::Resolved { key, then: then.to_string() })
    }

    /// Stops every job, each committing what it processed.
    pub fn shutdown(&self) {
        let jobs: Vec<Arc<JobRuntime>> = lock(&self.jobs).values().cloned().collect();
        for job in &jobs {
            job.end();
        }
        let threads: Vec<JoinHandle<()>> =
            lock(&self.threads).drain().map(|(_, thread)| thread).collect();
        for thread in threads {
            let _ = thread.join();
        }
        for job in &jobs {
            job.join_deliveries();
            job.join_shadow();
        }
        tracing::info!(jobs = jobs.len(), "every job stopped");
    }
}

/// Where a shadow of `job` starts, read from `from` as `tally replay
/// --from` reads it: `None` for `earliest`, its inputs' start; a time or
/// offsets for a Kafka job only.
fn replay_from(
    job: &crate::config::JobConfig,
    from: &str,
) -> Result<Option<tally_kafka::StartAt>, ApiError> {
    const MAX_FROM_BYTES: usize = 64 << 10;
    if from.len() > MAX_FROM_BYTES {
        return Err(ApiError::bad_request(format!(
            "`from` has {} bytes; at most {MAX_FROM_BYTES} (a time, or an offset per partition)",
            from.len()
        )));
    }
    let bad = |err: anyhow::Error| ApiError::bad_request(format!("`from`: {err:#}"));
    match &job.mode {
        crate::config::Mode::Kafka(kafka) => {
            crate::replay_start::parse(from, &kafka.inputs).map_err(bad)
        }
        crate::config::Mode::Local(_) if from == "earliest" => Ok(None),
        crate::config::Mode::Local(_) => Err(ApiError::bad_request(format!(
            "`from` {:?}: a local job's input lines carry no Kafka timestamps or offsets to start at; replay it from earliest",
            tally_core::text::sanitize(from, 100)
        ))),
    }
}

/// `job`'s file as deployed, as a TOML table.
fn deployed_job_file(job: &JobRuntime, tenant: &str, name: &str) -> Result<toml::Table, ApiError> {
    let current = std::fs::read_to_string(job.dir.job_file()).map_err(|err| {
        tracing::error!(%tenant, job = %name, error = %err, "cannot read a job's file");
        ApiError::internal("the host cannot read the job's file (its disk?); nothing changed")
    })?;
    toml::from_str(&current).map_err(|err| {
        ApiError::internal(format!("the job's file as deployed no longer reads as TOML: {err}"))
    })
}

/// Reserves `key` with `memory` bytes unless something holds it already
/// (a reservation it does not own is never changed); `false` if held.
fn reserve(deploying: &mut HashMap<JobKey, u64>, key: &JobKey, memory: u64) -> bool {
    match deploying.entry(key.clone()) {
        std::collections::hash_map::Entry::Occupied(_) => false,
        std::collections::hash_map::Entry::Vacant(vacant) => {
            vacant.insert(memory);
            true
        }
    }
}

/// Refuses TOML `what` larger than a whole job file may be, before it is
/// parsed (a parse holds many times its size).
fn refuse_over_job_file_size(what: &str, text: &str) -> Result<(), ApiError> {
    if text.len() > job_spec::MAX_JOB_FILE_BYTES {
        return Err(ApiError::bad_request(format!(
            "{what} has {} bytes; it is part of a job file, which may have at most {} (MAX_JOB_FILE_BYTES)",
            text.len(),
            job_spec::MAX_JOB_FILE_BYTES
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_side_failure_answers_without_the_hosts_paths() {
        let path = std::path::PathBuf::from("/srv/tally-data/jobs/acme/billing/record.json");
        let source = std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} is read-only", path.display()),
        );
        let answer =
            ApiError::from(ServeError::File { action: "write", path: path.clone(), source });
        assert_eq!(answer.status, 500);
        assert!(!answer.message.contains("/srv/tally-data"), "{}", answer.message);
        assert!(answer.message.contains("log says why"), "{}", answer.message);
        let deleted = ApiError::from(ServeError::Deleted { job: "acme.billing".into() });
        assert_eq!(
            (deleted.status, deleted.message.as_str()),
            (409, "job `acme.billing` is being deleted")
        );
    }
}
