//! `tally serve`: one host running many tenants' jobs, each on its own
//! thread with its own plugin instance, limits and state directory, managed
//! through an authenticated admin API ([`api`]).
//!
//! Jobs, their plugin versions and whether they are paused persist in the
//! data directory ([`registry`]): a restarted host resumes every job from
//! its last commit.

pub mod api;
pub mod config;
pub mod job_spec;
pub mod registry;
pub mod runner;

use crate::sync::lock;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde::Serialize;

use crate::lock::DirLock;
use crate::metrics::HostMetrics;
use crate::plugin::{LoadedPlugin, PluginRuntime};

use config::HostConfig;
use registry::{JobDir, JobRecord, PluginVersion, VersionStatus};
use runner::{JobRuntime, JobStatus};

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

/// One committed state value, as an interactive query returns it.
#[derive(Debug, Clone, Serialize)]
pub struct StateValue {
    /// The key asked for.
    pub key: String,
    /// The committed value: JSON when it is JSON, else text.
    pub value: serde_json::Value,
    /// The input partition holding it (Kafka jobs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
}

type JobKey = (String, String);

/// The running host.
pub struct Host {
    config: HostConfig,
    plugins: PluginRuntime,
    metrics: HostMetrics,
    jobs: Mutex<BTreeMap<JobKey, Arc<JobRuntime>>>,
    /// Names being deployed or deleted right now.
    deploying: Mutex<HashSet<JobKey>>,
    /// Jobs on disk that could not be resumed at start, and why.
    broken: Mutex<BTreeMap<JobKey, String>>,
    threads: Mutex<HashMap<JobKey, JoinHandle<()>>>,
    _lock: DirLock,
}

impl Host {
    /// Locks the data directory and resumes every job in it.
    pub fn open(config: HostConfig) -> Result<Arc<Host>, String> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|err| format!("cannot create the data directory `{}`: {err}", config.data_dir.display()))?;
        let data_lock = DirLock::acquire(&config.data_dir).map_err(|err| err.to_string())?;
        let plugins = PluginRuntime::new().map_err(|err| err.to_string())?;
        let host = Arc::new(Host {
            config,
            plugins,
            metrics: HostMetrics::new(),
            jobs: Mutex::default(),
            deploying: Mutex::default(),
            broken: Mutex::default(),
            threads: Mutex::default(),
            _lock: data_lock,
        });
        for (tenant, name, dir) in registry::list_jobs(&host.config.data_dir)? {
            match host.resume_job(&tenant, &name, dir) {
                Ok(()) => tracing::info!(%tenant, job = %name, "job resumed"),
                Err(err) => {
                    tracing::error!(%tenant, job = %name, error = %err, "cannot resume job; fix the cause and restart the host");
                    lock(&host.broken).insert((tenant, name), err);
                }
            }
        }
        Ok(host)
    }

    /// The host's configuration.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// Every job's metrics in Prometheus text format.
    pub fn render_metrics(&self) -> String {
        self.metrics.render()
    }

    fn resume_job(&self, tenant: &str, name: &str, dir: JobDir) -> Result<(), String> {
        let tenant_config = self.config.tenants.get(tenant).ok_or_else(|| format!("tenant `{tenant}` is no longer in the host configuration"))?;
        let text = std::fs::read_to_string(dir.job_file()).map_err(|err| format!("cannot read `{}`: {err}", dir.job_file().display()))?;
        let (_, config) = job_spec::parse(&text, tenant, tenant_config, &self.config)?;
        let mut record = dir.read_record()?;
        let active = record.active().ok_or("its record names no active plugin version")?.clone();
        let plugin = self.load_version(&dir, &active.digest)?;
        // Pushed before the restart and not judged yet: offered again below.
        let mut pending = None;
        if let Some(version) = record.pending().cloned() {
            match self.load_version(&dir, &version.digest) {
                Ok(loaded) => pending = Some(loaded),
                Err(err) => {
                    record.failed(&version.digest, VersionStatus::Refused, &format!("could not be loaded after a host restart: {err}"));
                    dir.write_record(&record)?;
                }
            }
        }
        let runtime = JobRuntime::new(tenant, name, config, dir, record, plugin, self.metrics.job(tenant, name));
        runtime.metrics.set_plugin_info("", &active.digest);
        if let Some(plugin) = pending {
            runtime.offer(plugin);
        }
        self.start(tenant, name, runtime);
        Ok(())
    }

    fn load_version(&self, dir: &JobDir, digest: &str) -> Result<LoadedPlugin, String> {
        let path = dir.plugin_file(digest);
        let plugin = self.plugins.load_file(&path).map_err(|err| err.to_string())?;
        if plugin.digest() != digest {
            return Err(format!("`{}` does not hold plugin version {digest} any more (its digest is {})", path.display(), plugin.digest()));
        }
        Ok(plugin)
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
                format!("job `{name}` could not be resumed when the host started: {reason}; fix that and restart the host, or delete the job"),
            )),
            None => Err(ApiError::not_found(name)),
        }
    }

    /// The statuses of `tenant`'s jobs, with those that could not be
    /// resumed when the host started (state `broken`).
    pub fn list(&self, tenant: &str) -> Vec<JobStatus> {
        let mut statuses: Vec<JobStatus> =
            lock(&self.jobs).iter().filter(|((owner, _), _)| owner == tenant).map(|(_, job)| job.status()).collect();
        let broken = lock(&self.broken);
        statuses.extend(broken.iter().filter(|((owner, _), _)| owner == tenant).map(|((_, name), reason)| JobStatus::broken(name, reason)));
        statuses.sort_by(|a, b| a.name.cmp(&b.name));
        statuses
    }

    /// Deploys job file `text` with `plugin` for `tenant`. Checks everything
    /// before writing anything: a refused deploy changes nothing.
    pub fn deploy(&self, tenant: &str, text: &str, plugin: &[u8]) -> Result<JobStatus, ApiError> {
        let tenant_config = self.config.tenants.get(tenant).ok_or_else(|| ApiError::new(401, "unknown tenant"))?;
        let (name, config) = job_spec::parse(text, tenant, tenant_config, &self.config).map_err(ApiError::bad_request)?;
        let key = (tenant.to_string(), name.clone());
        if let Some(reason) = lock(&self.broken).get(&key) {
            return Err(ApiError::new(409, format!("job `{name}` exists on disk but could not be resumed: {reason}; delete it first")));
        }
        {
            let jobs = lock(&self.jobs);
            let mut deploying = lock(&self.deploying);
            let owned = jobs.keys().chain(deploying.iter()).filter(|(owner, _)| owner == tenant).count();
            if owned >= tenant_config.max_jobs && !jobs.contains_key(&key) {
                return Err(ApiError::new(
                    409,
                    format!("tenant `{tenant}` already has {owned} jobs, its limit (max_jobs in the host file); delete one first"),
                ));
            }
            if jobs.contains_key(&key) || !deploying.insert(key.clone()) {
                return Err(ApiError::new(
                    409,
                    format!("job `{name}` already exists; push a new plugin version with `tally plugin push {name} <file>`, or delete the job first"),
                ));
            }
        }
        let result = self.create(tenant, &name, config, text, plugin);
        lock(&self.deploying).remove(&key);
        result
    }

    fn create(&self, tenant: &str, name: &str, config: crate::config::JobConfig, text: &str, bytes: &[u8]) -> Result<JobStatus, ApiError> {
        let plugin = self.compile(name, bytes)?;
        if let Some(kafka) = &config.kafka {
            // Missing topics are a bad deploy, said now, not a job failing later.
            crate::kafka::topics::prepare(&config, kafka).map_err(|err| ApiError::bad_request(err.to_string()))?;
        }
        let dir = JobDir::new(&self.config.data_dir, tenant, name);
        if dir.exists() {
            return Err(ApiError::new(409, format!("job `{name}` still has files in the data directory ({}); delete the job first", dir.path().display())));
        }
        if dir.path().exists() {
            // Left by a deploy or delete that did not finish: no record, so no job.
            std::fs::remove_dir_all(dir.path()).map_err(|err| ApiError::internal(format!("cannot clear `{}`: {err}", dir.path().display())))?;
        }
        let mut record = JobRecord::default();
        record.pushed(PluginVersion::new(plugin.digest(), bytes.len() as u64, VersionStatus::Active));
        let written = dir
            .create()
            .and_then(|()| dir.write_file(&dir.plugin_file(plugin.digest()), bytes))
            .and_then(|()| dir.write_file(&dir.job_file(), text.as_bytes()))
            // The record last: without it the directory is not a job.
            .and_then(|()| dir.write_record(&record));
        if let Err(err) = written {
            let _ = std::fs::remove_dir_all(dir.path());
            return Err(ApiError::internal(err));
        }
        let runtime = JobRuntime::new(tenant, name, config, dir, record, plugin.clone(), self.metrics.job(tenant, name));
        runtime.metrics.set_plugin_info("", plugin.digest());
        let status = runtime.status();
        self.start(tenant, name, runtime);
        tracing::info!(%tenant, job = %name, plugin = %plugin.digest(), "job deployed");
        Ok(status)
    }

    /// Compiles and checks an upload, off every job's processing path.
    fn compile(&self, name: &str, bytes: &[u8]) -> Result<LoadedPlugin, ApiError> {
        self.plugins.load(&format!("upload for job {name}"), bytes).map_err(|err| ApiError::new(422, err.to_string()))
    }

    /// Pauses or resumes `tenant`'s job `name`.
    pub fn set_paused(&self, tenant: &str, name: &str, paused: bool) -> Result<JobStatus, ApiError> {
        let job = self.job(tenant, name)?;
        job.set_paused(paused).map_err(ApiError::internal)?;
        Ok(job.status())
    }

    /// Stops `tenant`'s job `name` (committing what it processed) and
    /// deletes its directory: state, outputs and plugin versions. A Kafka
    /// job's topics and consumer group stay on the brokers.
    pub fn delete(&self, tenant: &str, name: &str) -> Result<(), ApiError> {
        let key = (tenant.to_string(), name.to_string());
        if lock(&self.broken).contains_key(&key) {
            JobDir::new(&self.config.data_dir, tenant, name).remove().map_err(ApiError::internal)?;
            lock(&self.broken).remove(&key);
            return Ok(());
        }
        let job = self.job(tenant, name)?;
        // Held until the files are gone: no deploy of the name meanwhile.
        if !lock(&self.deploying).insert(key.clone()) {
            return Err(ApiError::new(409, format!("job `{name}` is being deployed or deleted right now; try again")));
        }
        job.mark_deleted();
        job.end();
        let thread = lock(&self.threads).remove(&key);
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        let removed = job.dir.remove();
        lock(&self.jobs).remove(&key);
        self.metrics.remove(&job.metrics.labels, &job.status().plugin);
        lock(&self.deploying).remove(&key);
        removed.map_err(|err| ApiError::internal(format!("job stopped, but its files could not all be removed: {err}")))?;
        tracing::info!(%tenant, job = %name, "job deleted");
        Ok(())
    }

    /// Compiles and checks `bytes`, then offers them to the job: they are
    /// swapped in at its next transaction boundary.
    pub fn push(&self, tenant: &str, name: &str, bytes: &[u8]) -> Result<PluginVersion, ApiError> {
        let job = self.job(tenant, name)?;
        let plugin = self.compile(name, bytes)?;
        job.dir.write_file(&job.dir.plugin_file(plugin.digest()), bytes).map_err(ApiError::internal)?;
        let version = PluginVersion::new(plugin.digest(), bytes.len() as u64, VersionStatus::Pending);
        job.push(plugin, version.clone()).map_err(ApiError::internal)?;
        tracing::info!(%tenant, job = %name, plugin = %version.digest, "plugin version pushed");
        Ok(version)
    }

    /// Pushes the version that ran before the active one again.
    pub fn rollback(&self, tenant: &str, name: &str) -> Result<PluginVersion, ApiError> {
        let job = self.job(tenant, name)?;
        let previous = job.record().previous().cloned().ok_or_else(|| {
            ApiError::new(409, format!("job `{name}` has no earlier version to go back to; `tally plugin history {name}` lists its versions"))
        })?;
        let bytes = std::fs::read(job.dir.plugin_file(&previous.digest))
            .map_err(|err| ApiError::internal(format!("cannot read version {}: {err}", previous.digest)))?;
        self.push(tenant, name, &bytes)
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
            (0..partitions).map(|partition| (Some(partition), [&crate::kafka::namespace(partition)[..], key.as_bytes()].concat())).collect()
        };
        let refs: Vec<&[u8]> = keys.iter().map(|(_, key)| key.as_slice()).collect();
        let values = store.get_many(&refs).map_err(|err| ApiError::internal(err.to_string()))?;
        for ((partition, _), value) in keys.iter().zip(values) {
            if let Some(value) = value {
                let value = serde_json::from_slice(&value)
                    .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&value).into_owned()));
                return Ok(StateValue { key: key.to_string(), value, partition: *partition });
            }
        }
        Err(ApiError::new(
            404,
            format!("job `{name}` has no committed value for key {key:?}; keys are matched byte for byte (the Rust SDK stores them as JSON)"),
        ))
    }

    /// Stops every job, each committing what it processed.
    pub fn shutdown(&self) {
        let jobs: Vec<Arc<JobRuntime>> = lock(&self.jobs).values().cloned().collect();
        for job in &jobs {
            job.end();
        }
        let threads: Vec<JoinHandle<()>> = lock(&self.threads).drain().map(|(_, thread)| thread).collect();
        for thread in threads {
            let _ = thread.join();
        }
        tracing::info!(jobs = jobs.len(), "every job stopped");
    }
}
