//! Job configuration: what to run, on what, with which limits.
//!
//! A job is a TOML file (or the equivalent `tally run` flags):
//!
//! ```toml
//! name = "billing"
//! plugin = "usage_billing.wasm"      # relative to the job file
//! outputs = ["totals"]
//! commit_interval_ms = 100
//!
//! [local]
//! inputs = ["usage-0.ndjson", "usage-1.ndjson"]   # one file = one partition
//! output_dir = "out"
//! state_dir = "state"
//!
//! [limits]
//! memory_bytes = 67108864
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Commit interval when the job does not set one.
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_millis(100);
/// Events handed to the plugin per call when the job does not say.
pub const DEFAULT_BATCH_SIZE: usize = 1024;
/// Name of the dead-letter output when the job does not set one.
pub const DEFAULT_DEAD_LETTER_OUTPUT: &str = "dead-letters";
/// Linear memory a plugin instance may grow to.
pub const DEFAULT_MEMORY_BYTES: u64 = 64 << 20;
/// CPU budget of one plugin call (one batch), in milliseconds of the
/// calling thread's CPU time. A batch of 1024 billing events takes about 2 ms.
pub const DEFAULT_CPU_BUDGET_MS: u64 = 1_000;
/// Largest state key a plugin may write.
pub const DEFAULT_MAX_KEY_BYTES: u32 = 4 << 10;
/// Largest state value or output record value a plugin may write.
pub const DEFAULT_MAX_VALUE_BYTES: u32 = 1 << 20;
/// Most output bytes (keys and values) a plugin may emit per batch.
pub const DEFAULT_MAX_OUTPUT_BYTES_PER_BATCH: u64 = 64 << 20;
/// Most state bytes (keys and values) a plugin may write per batch.
pub const DEFAULT_MAX_STATE_BYTES_PER_BATCH: u64 = 64 << 20;
/// Largest batch a job may ask for.
pub const MAX_BATCH_SIZE: usize = 65_536;

/// A bad job configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The job file could not be read.
    #[error("cannot read job file `{}`: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// The job file is not valid TOML or has unknown or mistyped fields.
    #[error("job file `{}` is invalid: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    /// A value is out of range or inconsistent.
    #[error("job `{job}`: {message}")]
    Invalid { job: String, message: String },
}

/// One job: a plugin over inputs, with outputs and limits.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// Job name; it prefixes idempotency keys, so keep it stable.
    pub name: String,
    /// Path of the plugin component.
    pub plugin: PathBuf,
    /// Outputs the plugin may emit to.
    pub outputs: Vec<String>,
    /// Where rejected and trapping events go.
    #[serde(default = "default_dead_letter_output")]
    pub dead_letter_output: String,
    /// How often a transaction commits, in milliseconds.
    #[serde(default = "default_commit_interval_ms")]
    pub commit_interval_ms: u64,
    /// Most events per plugin call.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Sandbox limits of the plugin.
    #[serde(default)]
    pub limits: Limits,
    /// Local mode: NDJSON files in, NDJSON files out.
    pub local: LocalConfig,
}

/// Local mode's inputs, outputs and state.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LocalConfig {
    /// NDJSON input files, one partition each.
    pub inputs: Vec<PathBuf>,
    /// Directory of the output files (`<output>.ndjson`).
    pub output_dir: PathBuf,
    /// Directory of the job's state (RocksDB) and its lock.
    pub state_dir: PathBuf,
}

/// What one plugin instance may use. There is no "unlimited".
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Linear memory, in bytes.
    pub memory_bytes: u64,
    /// CPU budget of one plugin call (one batch), in milliseconds of thread
    /// CPU time; checked every [`crate::plugin::EPOCH_TICK`], so a call may
    /// run up to one tick past it.
    pub cpu_budget_ms: u64,
    /// Largest state key, in bytes.
    pub max_key_bytes: u32,
    /// Largest state value or output value, in bytes.
    pub max_value_bytes: u32,
    /// Most output bytes per batch (its retries included).
    pub max_output_bytes_per_batch: u64,
    /// Most state bytes written per batch (its retries included).
    pub max_state_bytes_per_batch: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: DEFAULT_MEMORY_BYTES,
            cpu_budget_ms: DEFAULT_CPU_BUDGET_MS,
            max_key_bytes: DEFAULT_MAX_KEY_BYTES,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            max_output_bytes_per_batch: DEFAULT_MAX_OUTPUT_BYTES_PER_BATCH,
            max_state_bytes_per_batch: DEFAULT_MAX_STATE_BYTES_PER_BATCH,
        }
    }
}

fn default_dead_letter_output() -> String {
    DEFAULT_DEAD_LETTER_OUTPUT.to_string()
}
fn default_commit_interval_ms() -> u64 {
    DEFAULT_COMMIT_INTERVAL.as_millis() as u64
}
fn default_batch_size() -> usize {
    DEFAULT_BATCH_SIZE
}

impl JobConfig {
    /// Reads a job file; relative paths in it are taken relative to the file.
    pub fn from_file(path: &Path) -> Result<JobConfig, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        let mut job: JobConfig = toml::from_str(&text)
            .map_err(|err| ConfigError::Parse { path: path.to_path_buf(), message: err.to_string() })?;
        let base = path.parent().unwrap_or(Path::new("."));
        job.resolve_paths(base);
        job.validate()?;
        Ok(job)
    }

    fn resolve_paths(&mut self, base: &Path) {
        let resolve = |path: &mut PathBuf| {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        };
        resolve(&mut self.plugin);
        self.local.inputs.iter_mut().for_each(resolve);
        resolve(&mut self.local.output_dir);
        resolve(&mut self.local.state_dir);
    }

    /// The commit interval as a duration.
    pub fn commit_interval(&self) -> Duration {
        Duration::from_millis(self.commit_interval_ms)
    }

    /// Checks ranges and consistency; the message says what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |message: String| Err(ConfigError::Invalid { job: self.name.clone(), message });
        if self.name.is_empty() || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return invalid(format!("name {:?} must be non-empty and use only letters, digits, `-`, `_`, `.`", self.name));
        }
        if self.outputs.is_empty() {
            return invalid("declare at least one output the plugin emits to (outputs = [\"totals\"])".into());
        }
        let mut names: Vec<&str> = self.outputs.iter().map(String::as_str).collect();
        names.push(&self.dead_letter_output);
        for name in &names {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
                return invalid(format!("output name {name:?} must use only letters, digits, `-`, `_`, `.`"));
            }
        }
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
            return invalid(format!("output `{}` is declared twice (the dead-letter output counts too)", pair[0]));
        }
        if self.commit_interval_ms == 0 {
            return invalid("commit_interval_ms must be at least 1".into());
        }
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return invalid(format!("batch_size must be between 1 and {MAX_BATCH_SIZE}, got {}", self.batch_size));
        }
        if self.local.inputs.is_empty() {
            return invalid("local.inputs must name at least one NDJSON file".into());
        }
        let mut file_names: Vec<_> = self.local.inputs.iter().map(|path| path.file_name()).collect();
        file_names.sort_unstable();
        if let Some(pair) = file_names.windows(2).find(|pair| pair[0] == pair[1]) {
            return invalid(format!(
                "two inputs share the file name {:?}; input file names name partitions in lineage, so they must differ",
                pair[0].unwrap_or_default()
            ));
        }
        let limits = &self.limits;
        let tick_ms = crate::plugin::EPOCH_TICK.as_millis() as u64;
        if limits.memory_bytes < (1 << 20) || limits.max_key_bytes == 0 || limits.max_value_bytes == 0 {
            return invalid("limits must be positive, and limits.memory_bytes at least 1 MiB (1048576)".into());
        }
        if limits.cpu_budget_ms < tick_ms {
            return invalid(format!("limits.cpu_budget_ms must be at least {tick_ms} (the budget is checked every {tick_ms} ms)"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = r#"
        name = "billing"
        plugin = "billing.wasm"
        outputs = ["totals"]
        [local]
        inputs = ["in/p0.ndjson"]
        output_dir = "out"
        state_dir = "/var/state"
    "#;

    fn write_job(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn a_job_file_gets_defaults_and_paths_relative_to_itself() {
        let (dir, path) = write_job(JOB);
        let job = JobConfig::from_file(&path).unwrap();
        assert_eq!(job.commit_interval(), DEFAULT_COMMIT_INTERVAL);
        assert_eq!(job.dead_letter_output, "dead-letters");
        assert_eq!(job.limits, Limits::default());
        assert_eq!(job.plugin, dir.path().join("billing.wasm"));
        assert_eq!(job.local.inputs, vec![dir.path().join("in/p0.ndjson")]);
        assert_eq!(job.local.state_dir, PathBuf::from("/var/state"));
    }

    #[test]
    fn an_unknown_field_is_named() {
        let (_dir, path) = write_job(&JOB.replace("outputs", "commit_intervall = 5\noutputs"));
        let err = JobConfig::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("unknown field `commit_intervall`"), "{err}");
    }

    #[test]
    fn inconsistent_values_say_what_to_change() {
        let (_dir, path) = write_job(&JOB.replace(r#"["totals"]"#, r#"["totals", "dead-letters"]"#));
        let err = JobConfig::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("output `dead-letters` is declared twice"), "{err}");
        let (_dir, path) = write_job(&JOB.replace(r#"outputs = ["totals"]"#, "outputs = []"));
        assert!(JobConfig::from_file(&path).unwrap_err().to_string().contains("declare at least one output"));
    }
}
