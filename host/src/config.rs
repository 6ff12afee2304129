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
//!
//! A Kafka job has a `[kafka]` section instead of `[local]` (see
//! [`KafkaConfig`]).

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use tally_core::limits::*;
pub use tally_core::settings::{
    DEFAULT_BATCH_SIZE, DEFAULT_COMMIT_INTERVAL, DEFAULT_DEAD_LETTER_OUTPUT, InvalidJob,
    JobSettings, MAX_BATCH_SIZE, MAX_OUTPUTS,
};
pub use tally_kafka::{
    DEFAULT_CREATE_PARTITIONS, DEFAULT_TRANSACTION_TIMEOUT_MS, Guarantee, KafkaConfig,
};
pub use tally_local::LocalConfig;

/// A bad job configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The job file could not be read.
    #[error("cannot read job file `{}`: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The job file is not valid TOML or has unknown or mistyped fields.
    #[error("job file `{}` is invalid: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong (the parser names the field), and the fix.
        source: toml::de::Error,
    },
    /// A value is out of range or inconsistent.
    #[error(transparent)]
    Invalid(#[from] InvalidJob),
}

/// One job: what every job sets, and where it reads and writes.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(try_from = "JobFile")]
pub struct JobConfig {
    /// Name, plugin, outputs, interval, batch size, limits, hot swap, emit.
    pub settings: JobSettings,
    /// Where the job reads and writes: files, or Kafka topics.
    pub mode: Mode,
}

/// Where a job reads and writes: its `[local]` or its `[kafka]` section.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// Local mode: NDJSON files in, NDJSON files out.
    Local(LocalConfig),
    /// Kafka mode: topics in, topics out, exactly once by Kafka transactions.
    Kafka(KafkaConfig),
}

/// A job file as written: one of `[local]` and `[kafka]`, checked into a
/// [`Mode`] when read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobFile {
    /// Job name; it prefixes idempotency keys, so keep it stable.
    name: String,
    /// Path of the plugin component.
    plugin: PathBuf,
    /// Outputs the plugin may emit to.
    outputs: Vec<String>,
    /// Where rejected and trapping events go.
    #[serde(default = "default_dead_letter_output")]
    dead_letter_output: String,
    /// How often a transaction commits, in milliseconds.
    #[serde(default = "default_commit_interval_ms")]
    commit_interval_ms: u64,
    /// Most events per plugin call.
    #[serde(default = "default_batch_size")]
    batch_size: usize,
    /// Sandbox limits of the plugin.
    #[serde(default)]
    limits: Limits,
    /// Local mode: NDJSON files in, NDJSON files out.
    #[serde(default)]
    local: Option<LocalConfig>,
    /// Kafka mode: topics in, topics out, exactly once by Kafka transactions.
    #[serde(default)]
    kafka: Option<KafkaConfig>,
    /// How a new plugin version pushed into the running job is judged.
    #[serde(default)]
    hot_swap: tally_core::hot_swap::SwapPolicy,
    /// Which of the plugin's records a commit writes, per output
    /// (`emit = { totals = "latest_per_key" }`); unnamed outputs get
    /// every record.
    #[serde(default)]
    emit: std::collections::BTreeMap<String, Emit>,
    /// Billing periods: the host owns event time (see `docs/periods.md`).
    #[serde(default)]
    periods: Option<tally_periods::PeriodsTable>,
    /// Handed to the plugin, as JSON, when it starts.
    #[serde(default)]
    plugin_config: Option<toml::Table>,
}

/// A job file with both mode sections, or neither, or bad `[periods]`.
#[derive(Debug, thiserror::Error)]
pub enum ModeError {
    /// Both `[local]` and `[kafka]`.
    #[error("give either a [local] or a [kafka] section, not both")]
    Both,
    /// Neither.
    #[error(
        "say where the job reads and writes: add a [local] section (files) or a [kafka] section (topics)"
    )]
    Neither,
    /// A `[periods]` value out of range or inconsistent.
    #[error("[periods] {0}")]
    Periods(#[from] tally_periods::InvalidPeriods),
    /// A `[plugin_config]` value JSON cannot carry as written.
    #[error("[plugin_config] {0}")]
    PluginConfig(String),
}

impl TryFrom<JobFile> for JobConfig {
    type Error = ModeError;

    fn try_from(file: JobFile) -> Result<JobConfig, ModeError> {
        let mode = match (file.local, file.kafka) {
            (Some(local), None) => Mode::Local(local),
            (None, Some(kafka)) => Mode::Kafka(kafka),
            (Some(_), Some(_)) => return Err(ModeError::Both),
            (None, None) => return Err(ModeError::Neither),
        };
        let (periods, plugin_config) = period_settings(file.periods, file.plugin_config)?;
        Ok(JobConfig {
            settings: JobSettings {
                name: file.name,
                plugin: file.plugin,
                outputs: file.outputs,
                dead_letter_output: file.dead_letter_output,
                commit_interval_ms: file.commit_interval_ms,
                batch_size: file.batch_size,
                limits: file.limits,
                hot_swap: file.hot_swap,
                emit: file.emit,
                periods,
                plugin_config,
            },
            mode,
        })
    }
}

/// A job file's `[periods]`, checked, and its `[plugin_config]` as JSON.
pub(crate) fn period_settings(
    periods: Option<tally_periods::PeriodsTable>,
    plugin_config: Option<toml::Table>,
) -> Result<(Option<std::sync::Arc<tally_periods::PeriodSettings>>, Option<String>), ModeError> {
    let periods =
        periods.map(tally_periods::PeriodSettings::try_from).transpose()?.map(std::sync::Arc::new);
    let plugin_config = plugin_config.map(|table| plugin_config_json(&table)).transpose()?;
    Ok((periods, plugin_config))
}

/// The job's `[plugin_config]` as the JSON its plugin gets: refused where
/// JSON would change a value (a date or time, a float that is not finite).
pub fn plugin_config_json(table: &toml::Table) -> Result<String, ModeError> {
    fn check(path: &str, value: &toml::Value) -> Result<(), ModeError> {
        match value {
            toml::Value::Datetime(at) => Err(ModeError::PluginConfig(format!(
                "{path} = {at}: dates and times have no JSON form; write it as a string (\"{at}\")"
            ))),
            toml::Value::Float(x) if !x.is_finite() => Err(ModeError::PluginConfig(format!(
                "{path} = {x}: JSON has no such number; write a finite one or a string"
            ))),
            toml::Value::Array(items) => items
                .iter()
                .enumerate()
                .try_for_each(|(n, item)| check(&format!("{path}[{n}]"), item)),
            toml::Value::Table(table) => {
                table.iter().try_for_each(|(key, item)| check(&format!("{path}.{key}"), item))
            }
            _ => Ok(()),
        }
    }
    table.iter().try_for_each(|(key, value)| check(key, value))?;
    Ok(serde_json::to_string(table).expect("a TOML table is JSON (its keys are strings)"))
}

pub(crate) fn default_dead_letter_output() -> String {
    DEFAULT_DEAD_LETTER_OUTPUT.to_string()
}
pub(crate) fn default_commit_interval_ms() -> u64 {
    DEFAULT_COMMIT_INTERVAL.as_millis() as u64
}
pub(crate) fn default_batch_size() -> usize {
    DEFAULT_BATCH_SIZE
}
pub(crate) fn default_create_partitions() -> u32 {
    DEFAULT_CREATE_PARTITIONS
}
pub(crate) fn default_transaction_timeout_ms() -> u64 {
    DEFAULT_TRANSACTION_TIMEOUT_MS
}

impl JobConfig {
    /// Reads a job file; relative paths in it are taken relative to the file.
    pub fn from_file(path: &Path) -> Result<JobConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        let mut job: JobConfig = toml::from_str(&text)
            .map_err(|source| ConfigError::Parse { path: path.to_path_buf(), source })?;
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
        resolve(&mut self.settings.plugin);
        match &mut self.mode {
            Mode::Local(local) => {
                local.inputs.iter_mut().for_each(resolve);
                resolve(&mut local.output_dir);
                resolve(&mut local.state_dir);
            }
            Mode::Kafka(kafka) => resolve(&mut kafka.state_dir),
        }
    }

    /// The local section, or an error saying the job is not a local job.
    pub fn local(&self) -> Result<&LocalConfig, InvalidJob> {
        match &self.mode {
            Mode::Local(local) => Ok(local),
            Mode::Kafka(_) => Err(InvalidJob {
                job: self.settings.name.clone(),
                message: "this is not a local job: it has no [local] section".into(),
            }),
        }
    }

    /// The kafka section, or an error saying the job is not a Kafka job.
    pub fn kafka(&self) -> Result<&KafkaConfig, InvalidJob> {
        match &self.mode {
            Mode::Kafka(kafka) => Ok(kafka),
            Mode::Local(_) => Err(InvalidJob {
                job: self.settings.name.clone(),
                message: "this is not a Kafka job: it has no [kafka] section".into(),
            }),
        }
    }

    /// Checks ranges and consistency, the settings and then the mode's
    /// section; the message says what to change.
    pub fn validate(&self) -> Result<(), InvalidJob> {
        self.settings.validate()?;
        match &self.mode {
            Mode::Local(local) => local.validate(&self.settings),
            Mode::Kafka(kafka) => kafka.validate(&self.settings),
        }
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
        assert_eq!(job.settings.commit_interval(), DEFAULT_COMMIT_INTERVAL);
        assert_eq!(job.settings.dead_letter_output, "dead-letters");
        assert_eq!(job.settings.limits, Limits::default());
        assert_eq!(job.settings.emit_per_output(), vec![Emit::EveryUpdate]);
        assert_eq!(job.settings.plugin, dir.path().join("billing.wasm"));
        let local = job.local().unwrap();
        assert_eq!(local.inputs, vec![dir.path().join("in/p0.ndjson")]);
        assert_eq!(local.state_dir, PathBuf::from("/var/state"));
    }

    #[test]
    fn an_unknown_field_is_named() {
        let (_dir, path) = write_job(&JOB.replace("outputs", "commit_intervall = 5\noutputs"));
        let err = JobConfig::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("unknown field `commit_intervall`"), "{err}");
    }

    #[test]
    fn emit_is_chosen_per_declared_output() {
        let two_outputs = JOB.replace(r#"["totals"]"#, r#"["totals", "alerts"]"#);
        let (_dir, path) = write_job(
            &two_outputs.replace("outputs =", "emit = { totals = \"latest_per_key\" }\noutputs ="),
        );
        assert_eq!(
            JobConfig::from_file(&path).unwrap().settings.emit_per_output(),
            vec![Emit::LatestPerKey, Emit::EveryUpdate]
        );
        let (_dir, path) =
            write_job(&JOB.replace("outputs =", "emit = { totals = \"latest\" }\noutputs ="));
        let err = JobConfig::from_file(&path).unwrap_err().to_string();
        assert!(
            err.contains("unknown variant `latest`, expected `every_update` or `latest_per_key`"),
            "{err}"
        );
        let (_dir, path) = write_job(
            &JOB.replace("outputs =", "emit = { dead-letters = \"latest_per_key\" }\noutputs ="),
        );
        let err = JobConfig::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("emit names output `dead-letters`, which the job does not declare (declared: totals)"), "{err}");
    }

    #[test]
    fn inconsistent_values_say_what_to_change() {
        let (_dir, path) =
            write_job(&JOB.replace(r#"["totals"]"#, r#"["totals", "dead-letters"]"#));
        let err = JobConfig::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("output `dead-letters` is declared twice"), "{err}");
        let (_dir, path) = write_job(&JOB.replace(r#"outputs = ["totals"]"#, "outputs = []"));
        assert!(
            JobConfig::from_file(&path)
                .unwrap_err()
                .to_string()
                .contains("declare at least one output")
        );
    }

    const KAFKA_JOB: &str = r#"
        name = "billing"
        plugin = "billing.wasm"
        outputs = ["totals"]
        [kafka]
        brokers = "127.0.0.1:9092"
        inputs = ["usage"]
        outputs = { totals = "billing-totals" }
        dead_letter_topic = "billing-dead-letters"
        state_dir = "state"
    "#;

    #[test]
    fn a_kafka_job_gets_defaults() {
        let (dir, path) = write_job(KAFKA_JOB);
        let job = JobConfig::from_file(&path).unwrap();
        let kafka = job.kafka().unwrap();
        assert_eq!(kafka.guarantee, Guarantee::ExactlyOnce);
        assert_eq!(kafka.group_id(&job.settings.name), "tally-billing");
        assert_eq!(kafka.state_dir, dir.path().join("state"));
        assert!(job.local().is_err());
    }

    #[test]
    fn kafka_mistakes_say_what_to_change() {
        let cases = [
            (
                KAFKA_JOB.replace("outputs = { totals", "outputs = { total"),
                "output `totals` has no topic",
            ),
            (KAFKA_JOB.replace("\"usage\"", "\"billing-totals\""), "both an input and an output"),
            (KAFKA_JOB.replace("\"usage\"", "\"us age\""), "not a valid Kafka topic name"),
            (
                KAFKA_JOB.replace("[kafka]", "guarantee = \"twice\"\n[kafka]"),
                "unknown field `guarantee`",
            ),
            (format!("{KAFKA_JOB}\nguarantee = \"twice\""), "unknown variant `twice`"),
            (format!("{JOB}\n{}", &KAFKA_JOB[KAFKA_JOB.find("[kafka]").unwrap()..]), "not both"),
            (
                format!("{KAFKA_JOB}\n[kafka.client]\n\"isolation.level\" = \"read_uncommitted\""),
                "may not set `isolation.level`",
            ),
            (
                format!("{KAFKA_JOB}\n[kafka.client]\n\"producer.transactional.id\" = \"x\""),
                "may not set `producer.transactional.id`",
            ),
            (format!("{KAFKA_JOB}\n[kafka.client]\n\"consumer.\" = \"x\""), "names no property"),
        ];
        for (text, expected) in cases {
            let (_dir, path) = write_job(&text);
            let err = JobConfig::from_file(&path).unwrap_err().to_string();
            assert!(err.contains(expected), "expected {expected:?} in: {err}");
        }
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

            /// A job file of any bytes is read or refused with a message,
            /// never a panic; a config read is one that validates.
            #[test]
            fn any_job_file_is_read_or_refused(text in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..400).prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
                prop::collection::vec(prop::sample::select(vec![
                    "name = \"j\"", "plugin = \"p.wasm\"", "outputs = [\"totals\"]", "[local]", "inputs = [\"a\"]",
                    "output_dir = \"o\"", "state_dir = \"s\"", "[kafka]", "brokers = \"b:1\"", "[limits]",
                    "memory_bytes = 0", "cpu_budget_ms = 18446744073709551615", "batch_size = 0", "commit_interval_ms = 1",
                    "max_record_bytes = 1", "emit = { totals = \"latest_per_key\" }", "[kafka.client]", "\"x.y\" = \"1\"",
                ]), 0..14).prop_map(|lines| lines.join("\n")),
            ]) {
                let (_dir, path) = write_job(&text);
                match JobConfig::from_file(&path) {
                    Ok(job) => prop_assert!(job.validate().is_ok()),
                    Err(err) => prop_assert!(!err.to_string().is_empty()),
                }
            }
        }
    }
}
