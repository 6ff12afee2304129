//! The host's data directory: one directory per job, with the job file as
//! deployed, every plugin version pushed, and the job's record.
//!
//! ```text
//! <data_dir>/jobs/<tenant>/<job>/
//!     job.toml             the job as deployed
//!     record.json          paused or not; each plugin version and its fate
//!     plugins/<hex>.wasm   every version pushed, kept for rollback
//!     state/               the job's state (RocksDB, lock, instance id)
//!     out/                 a local job's output files
//! ```

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::error::ServeError;

/// What became of a pushed plugin version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionStatus {
    /// Waiting for the job's next transaction boundary.
    Pending,
    /// Running its trial transaction.
    OnTrial,
    /// The version the job runs.
    Active,
    /// Ran before a newer version took over; available for rollback.
    Retired,
    /// Failed its first transaction and was rolled back.
    RolledBack,
    /// Could not be started.
    Refused,
}

/// One pushed plugin version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginVersion {
    /// `sha256:<hex>` of the component.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
    /// When it was pushed, in seconds since the Unix epoch.
    pub pushed_at: u64,
    /// What became of it.
    pub status: VersionStatus,
    /// Why it was rolled back or refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its component was removed from the job's directory (past
    /// `plugin_versions_kept`): it can no longer be rolled back to.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

/// Most entries a job's history keeps; older entries of removed versions go.
pub const MAX_HISTORY_ENTRIES: usize = 200;

impl PluginVersion {
    /// A version pushed now.
    pub fn new(digest: &str, size: u64, status: VersionStatus) -> PluginVersion {
        let pushed_at =
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
        PluginVersion {
            digest: digest.to_string(),
            size,
            pushed_at,
            status,
            reason: None,
            removed: false,
        }
    }
}

/// What the host remembers about a job besides its job file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Paused by its tenant: stays paused across host restarts.
    pub paused: bool,
    /// Every version pushed, oldest first.
    pub versions: Vec<PluginVersion>,
}

impl JobRecord {
    /// The version the job runs.
    pub fn active(&self) -> Option<&PluginVersion> {
        self.versions.iter().rev().find(|version| version.status == VersionStatus::Active)
    }

    /// A version waiting for its trial, or on it.
    pub fn pending(&self) -> Option<&PluginVersion> {
        self.versions.iter().rev().find(|version| {
            matches!(version.status, VersionStatus::Pending | VersionStatus::OnTrial)
        })
    }

    /// The version that ran before the active one (what `rollback` returns to).
    pub fn previous(&self) -> Option<&PluginVersion> {
        let active = self.active()?;
        self.versions.iter().rev().find(|version| {
            version.status == VersionStatus::Retired
                && version.digest != active.digest
                && !version.removed
        })
    }

    /// The version with `digest` if it is the active one, or waiting or on
    /// trial: pushing it again changes nothing.
    pub fn undecided_or_active(&self, digest: &str) -> Option<&PluginVersion> {
        self.versions.iter().rev().find(|version| {
            version.digest == digest
                && matches!(
                    version.status,
                    VersionStatus::Active | VersionStatus::Pending | VersionStatus::OnTrial
                )
        })
    }

    /// Keeps the components of the active version, of those waiting or on
    /// trial, and of the newest `kept` versions pushed; marks the others
    /// removed and returns their digests (their files are to be deleted).
    /// The history itself keeps at most [`MAX_HISTORY_ENTRIES`] entries.
    pub fn prune(&mut self, kept: usize) -> Vec<String> {
        let mut keep: Vec<&str> = Vec::new();
        for version in self.versions.iter().rev() {
            let live = matches!(
                version.status,
                VersionStatus::Active | VersionStatus::Pending | VersionStatus::OnTrial
            );
            let newest = keep.len() < kept && !version.removed;
            if (live || newest) && !keep.contains(&version.digest.as_str()) {
                keep.push(&version.digest);
            }
        }
        let keep: Vec<String> = keep.into_iter().map(str::to_string).collect();
        let mut removed = Vec::new();
        for version in &mut self.versions {
            if !version.removed && !keep.contains(&version.digest) {
                version.removed = true;
                if !removed.contains(&version.digest) {
                    removed.push(version.digest.clone());
                }
            }
        }
        while self.versions.len() > MAX_HISTORY_ENTRIES {
            match self.versions.iter().position(|version| version.removed) {
                Some(oldest) => drop(self.versions.remove(oldest)),
                None => break,
            }
        }
        removed
    }

    /// Records a push.
    pub fn pushed(&mut self, version: PluginVersion) {
        self.versions.push(version);
    }

    /// `digest`, still waiting, was replaced by a newer push before the job
    /// took it.
    pub fn superseded(&mut self, digest: &str, by: &str) {
        if digest == by {
            return;
        }
        if let Some(version) =
            self.versions.iter_mut().rev().find(|version| {
                version.digest == digest && version.status == VersionStatus::Pending
            })
        {
            version.status = VersionStatus::Refused;
            version.reason = Some(format!("superseded by {by} before the job took it"));
        }
    }

    /// The job took `digest` for its trial transaction: older versions
    /// still waiting or on trial will never run.
    pub fn on_trial(&mut self, digest: &str) {
        let Some(index) = self.versions.iter().rposition(|version| {
            version.digest == digest
                && matches!(version.status, VersionStatus::Pending | VersionStatus::OnTrial)
        }) else {
            return;
        };
        for older in &mut self.versions[..index] {
            if matches!(older.status, VersionStatus::Pending | VersionStatus::OnTrial) {
                older.status = VersionStatus::Refused;
                older.reason = Some(format!("superseded by {digest} before it was judged"));
            }
        }
        self.versions[index].status = VersionStatus::OnTrial;
    }

    /// `digest` passed its trial: it is active, the one before retired.
    pub fn activated(&mut self, digest: &str) {
        let Some(index) = self.versions.iter().rposition(|version| {
            version.digest == digest
                && matches!(version.status, VersionStatus::Pending | VersionStatus::OnTrial)
        }) else {
            return;
        };
        for version in &mut self.versions {
            if version.status == VersionStatus::Active {
                version.status = VersionStatus::Retired;
            }
        }
        self.versions[index].status = VersionStatus::Active;
    }

    /// `digest` failed its trial or could not start.
    pub fn failed(&mut self, digest: &str, status: VersionStatus, reason: &str) {
        if let Some(version) = self.latest_undecided(digest) {
            version.status = status;
            version.reason = Some(reason.to_string());
        }
    }

    fn latest_undecided(&mut self, digest: &str) -> Option<&mut PluginVersion> {
        self.versions.iter_mut().rev().find(|version| {
            version.digest == digest
                && matches!(version.status, VersionStatus::Pending | VersionStatus::OnTrial)
        })
    }
}

/// Where one job's files are.
#[derive(Debug, Clone)]
pub struct JobDir {
    path: PathBuf,
    /// The job's own directory (a shadow's is inside it).
    root: PathBuf,
}

impl JobDir {
    /// The directory of `tenant`'s job `name` under `data_dir`.
    pub fn new(data_dir: &Path, tenant: &str, name: &str) -> JobDir {
        let path = data_dir.join("jobs").join(tenant).join(name);
        JobDir { root: path.clone(), path }
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The job's own directory: this one, or for a shadow its job's. Every
    /// file of the job and its versions is under it.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the job's shadow keeps its record, plugin and job file (its
    /// state and outputs are its version's, under the job's).
    pub fn shadow(&self) -> JobDir {
        JobDir { path: self.root.join("shadow"), root: self.root.clone() }
    }

    /// The job file as deployed.
    pub fn job_file(&self) -> PathBuf {
        self.path.join("job.toml")
    }

    /// The component file of plugin version `digest`.
    pub fn plugin_file(&self, digest: &str) -> PathBuf {
        let hex = digest.split_once(':').map_or(digest, |(_, hex)| hex);
        self.path.join("plugins").join(format!("{hex}.wasm"))
    }

    /// The job's state directory.
    pub fn state_dir(&self) -> PathBuf {
        self.path.join("state")
    }

    /// A local job's output directory.
    pub fn output_dir(&self) -> PathBuf {
        self.path.join("out")
    }

    /// The state (position, ledger, dead letters) of the delivery of
    /// `output` (prefixed: an output may be named `..`).
    pub fn delivery_dir(&self, output: &str) -> PathBuf {
        self.path.join("deliver").join(format!("output-{output}"))
    }

    /// Creates the job's directories (deploy only: nothing else creates them).
    pub fn create(&self) -> Result<(), ServeError> {
        let plugins = self.path.join("plugins");
        std::fs::create_dir_all(&plugins).map_err(ServeError::file("create", &plugins))
    }

    /// Whether a job (its record) is on disk here.
    pub fn exists(&self) -> bool {
        self.path.join("record.json").exists()
    }

    /// Deletes the job's files: the record first, so a delete cut short
    /// leaves no half job that a restart would try to resume.
    pub fn remove(&self) -> Result<(), ServeError> {
        let record = self.path.join("record.json");
        match std::fs::remove_file(&record) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(ServeError::file("remove", &record)(err)),
        }
        if let Ok(dir) = std::fs::File::open(&self.path) {
            let _ = dir.sync_all();
        }
        std::fs::remove_dir_all(&self.path).map_err(ServeError::file("remove", &self.path))
    }

    /// Reads the job's record.
    pub fn read_record(&self) -> Result<JobRecord, ServeError> {
        let path = self.path.join("record.json");
        let bytes = std::fs::read(&path).map_err(ServeError::file("read", &path))?;
        serde_json::from_slice(&bytes).map_err(|source| ServeError::DamagedRecord { path, source })
    }

    /// Writes the job's record, whole or not at all.
    pub fn write_record(&self, record: &JobRecord) -> Result<(), ServeError> {
        write_atomically(
            &self.path.join("record.json"),
            &serde_json::to_vec_pretty(record).expect("records serialize"),
        )
    }

    /// Writes a file of the job, whole or not at all.
    pub fn write_file(&self, path: &Path, bytes: &[u8]) -> Result<(), ServeError> {
        write_atomically(path, bytes)
    }
}

/// [`tally_core::files::write_atomically`], with the path in the error.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ServeError> {
    tally_core::files::write_atomically(path, bytes).map_err(ServeError::file("write", path))
}

/// Every job directory under `data_dir`: `(tenant, job name, directory)`.
pub fn list_jobs(data_dir: &Path) -> Result<Vec<(String, String, JobDir)>, ServeError> {
    let root = data_dir.join("jobs");
    let mut jobs = Vec::new();
    let read = |dir: &Path| -> Result<Vec<String>, ServeError> {
        match std::fs::read_dir(dir) {
            Ok(entries) => {
                let mut names = Vec::new();
                for entry in entries {
                    let entry = entry.map_err(ServeError::file("list", dir))?;
                    if entry.path().is_dir() {
                        names.push(entry.file_name().to_string_lossy().into_owned());
                    }
                }
                names.sort();
                Ok(names)
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(err) => Err(ServeError::file("list", dir)(err)),
        }
    };
    for tenant in read(&root)? {
        for name in read(&root.join(&tenant))? {
            // A deploy that did not finish leaves no record: not a job.
            let dir = JobDir::new(data_dir, &tenant, &name);
            if dir.path().join("record.json").exists() {
                jobs.push((tenant.clone(), name, dir));
            }
        }
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_move_from_pending_to_active_to_retired() {
        let mut record = JobRecord::default();
        record.pushed(PluginVersion::new("sha256:a", 1, VersionStatus::Active));
        record.pushed(PluginVersion::new("sha256:b", 1, VersionStatus::Pending));
        assert_eq!(record.pending().unwrap().digest, "sha256:b");
        record.activated("sha256:b");
        assert_eq!(record.active().unwrap().digest, "sha256:b");
        assert_eq!(record.previous().unwrap().digest, "sha256:a");
        record.pushed(PluginVersion::new("sha256:c", 1, VersionStatus::Pending));
        record.failed("sha256:c", VersionStatus::RolledBack, "trapped");
        assert_eq!(
            record.active().unwrap().digest,
            "sha256:b",
            "a rollback keeps the active version"
        );
        assert_eq!(record.versions[2].reason.as_deref(), Some("trapped"));
    }

    #[test]
    fn a_push_during_a_trial_does_not_lose_the_version_on_trial() {
        let mut record = JobRecord::default();
        record.pushed(PluginVersion::new("sha256:a", 1, VersionStatus::Active));
        record.pushed(PluginVersion::new("sha256:b", 1, VersionStatus::Pending));
        record.on_trial("sha256:b");
        record.pushed(PluginVersion::new("sha256:c", 1, VersionStatus::Pending));
        record.activated("sha256:b");
        assert_eq!(record.active().unwrap().digest, "sha256:b");
        assert_eq!(record.pending().unwrap().digest, "sha256:c");
        // d displaces c in the slot; then e goes on trial over a stale d.
        record.pushed(PluginVersion::new("sha256:d", 1, VersionStatus::Pending));
        record.superseded("sha256:c", "sha256:d");
        record.pushed(PluginVersion::new("sha256:e", 1, VersionStatus::Pending));
        record.on_trial("sha256:e");
        let statuses: Vec<VersionStatus> =
            record.versions.iter().map(|version| version.status).collect();
        use VersionStatus::*;
        assert_eq!(statuses, [Retired, Active, Refused, Refused, OnTrial]);
    }

    #[test]
    fn old_versions_are_pruned_but_the_active_and_undecided_ones_stay() {
        let mut record = JobRecord::default();
        record.pushed(PluginVersion::new("sha256:a", 1, VersionStatus::Active));
        for digest in ["b", "c", "d"] {
            let digest = format!("sha256:{digest}");
            record.pushed(PluginVersion::new(&digest, 1, VersionStatus::Pending));
            record.activated(&digest);
        }
        record.pushed(PluginVersion::new("sha256:e", 1, VersionStatus::Pending));
        assert_eq!(
            record.undecided_or_active("sha256:e").map(|v| v.status),
            Some(VersionStatus::Pending)
        );
        assert_eq!(
            record.undecided_or_active("sha256:b"),
            None,
            "a retired version may be pushed again"
        );
        assert_eq!(
            record.prune(3),
            ["sha256:a", "sha256:b"],
            "kept: e (waiting), d (active), and the newest three: e, d, c"
        );
        assert_eq!(record.previous().unwrap().digest, "sha256:c");
        assert!(record.versions.iter().filter(|v| v.removed).count() == 2);
        assert!(record.prune(3).is_empty(), "pruning twice removes nothing more");
        assert_eq!(
            record.prune(1),
            ["sha256:c"],
            "the active and the waiting versions stay, however few are kept"
        );
        assert!(record.previous().is_none(), "a removed version cannot be rolled back to");
    }

    #[test]
    fn records_survive_a_round_trip_and_half_deployed_jobs_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let job = JobDir::new(dir.path(), "acme", "billing");
        job.create().unwrap();
        let mut record = JobRecord { paused: true, ..JobRecord::default() };
        record.pushed(PluginVersion::new("sha256:a", 7, VersionStatus::Active));
        job.write_record(&record).unwrap();
        assert_eq!(job.read_record().unwrap(), record);
        std::fs::create_dir_all(JobDir::new(dir.path(), "acme", "half").path()).unwrap();
        let listed: Vec<String> =
            list_jobs(dir.path()).unwrap().into_iter().map(|(_, name, _)| name).collect();
        assert_eq!(listed, ["billing"]);
    }
}
