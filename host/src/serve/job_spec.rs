//! A job file as a tenant deploys it to `tally serve`: the same TOML as
//! for `tally run`, minus everything the host decides.
//!
//! The file is parsed into [`ServedJob`], a type of its own that has no
//! field for what the host owns: the plugin path (the plugin comes with the
//! upload), state and output directories (the job's directory), brokers,
//! consumer group and client settings (the host's). No TOML form — a table,
//! dotted keys, an inline table, a positional array, an array of tables —
//! can set such a field, because there is none to set. The host then builds
//! the [`JobConfig`] it runs from the served job and its own settings.
//!
//! A local job's inputs must be regular files inside its tenant's
//! `input_dir`; a Kafka job may use only topics named `<tenant>.*`; sandbox
//! limits stay under the host's caps.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use tally_deliver::DeliverSettings;

use crate::config::{
    ConfigError, DEFAULT_MAX_OUTPUT_BYTES_PER_BATCH, DEFAULT_MAX_STATE_BYTES_PER_BATCH, Emit,
    Guarantee, InvalidJob, JobConfig, JobSettings, KafkaConfig, Limits, LocalConfig, Mode,
    ModeError, default_batch_size, default_commit_interval_ms, default_create_partitions,
    default_dead_letter_output, default_transaction_timeout_ms, period_settings,
};
use tally_core::hot_swap::SwapPolicy;
use tally_local::SourceError;

use super::config::{HostConfig, TenantConfig};
use super::delivery_spec::{self, DeliverySpecError, ServedDelivery};
use super::registry::JobDir;

/// Most partitions a served job may have its topics created with.
const MAX_CREATE_PARTITIONS: u32 = 256;

/// Largest job file a tenant may deploy.
pub const MAX_JOB_FILE_BYTES: usize = 64 << 10;

/// Largest `limits.max_record_bytes` a served job may ask for.
pub const MAX_RECORD_BYTES: u64 = 16 << 20;

/// Largest `limits.max_failures_in_a_row` a served job may ask for: each
/// failing event retried alone costs at least a tick of CPU (and a fresh
/// instance), so this bounds what a broken plugin's batch costs.
pub const MAX_FAILURES_IN_A_ROW: u64 = 1000;

/// Names a tenant might try to set, each with why the host sets it: used
/// only to explain a refusal (the types below cannot hold them anyway).
const HOST_OWNED: &[(&str, &str)] = &[
    (
        "plugin",
        "the plugin is uploaded with the job (`tally jobs deploy <job.toml> --plugin <file>`)",
    ),
    ("state_dir", "the host keeps each job's state in its data directory"),
    ("output_dir", "the host keeps a local job's outputs in its data directory"),
    (
        "brokers",
        "jobs use the brokers the host is configured with (kafka_brokers in the host file)",
    ),
    ("group", "the host names each job's consumer group (tally-<tenant>.<job>)"),
    ("client", "the host owns the Kafka client settings of the jobs it runs"),
    (
        "secret_file",
        "the operator sets a tenant's secret header (deliver.secret_file of the tenant in the host file)",
    ),
    (
        "secret_env",
        "the operator sets a tenant's secret header (deliver.secret_file of the tenant in the host file)",
    ),
    (
        "secret_header",
        "the operator sets a tenant's secret header (deliver.secret_header of the tenant in the host file)",
    ),
    (
        "url",
        "a PostgreSQL delivery writes into the database the operator gives the tenant (deliver.postgres_url in the host file)",
    ),
    ("ca_file", "the operator sets the tenant's database certificates (deliver.postgres_ca_file)"),
    ("ledger_topic", "the host names each delivery's ledger topic"),
    ("dead_letters", "the host keeps each delivery's dead letters in the job's directory"),
];

/// A job as its tenant may write it: everything but what the host owns.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServedJob {
    /// The job's name within its tenant: letters, digits and `-`.
    pub name: String,
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
    /// Sandbox limits of the plugin, under the host's caps.
    #[serde(default)]
    pub limits: Limits,
    /// How a pushed plugin version is judged.
    #[serde(default)]
    pub hot_swap: SwapPolicy,
    /// Which of the plugin's records a commit writes, per output.
    #[serde(default)]
    pub emit: BTreeMap<String, Emit>,
    /// Local mode: files of the tenant's input directory.
    #[serde(default)]
    pub local: Option<ServedLocal>,
    /// Kafka mode: the tenant's topics on the host's cluster.
    #[serde(default)]
    pub kafka: Option<ServedKafka>,
    /// Billing periods (see `docs/periods.md`); `max_seen_ids` at most the
    /// tenant's.
    #[serde(default)]
    pub periods: Option<tally_periods::PeriodsTable>,
    /// Handed to a period plugin, as JSON, when it is instantiated.
    #[serde(default)]
    pub plugin_config: Option<toml::Table>,
    /// Outputs delivered to a billing API or a database, each beside the
    /// job (see `docs/delivery.md`).
    #[serde(default)]
    pub deliver: Vec<ServedDelivery>,
}

/// A served local job's inputs; outputs and state live in the job's directory.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServedLocal {
    /// Files inside the tenant's `input_dir` (relative paths, no `..`).
    pub inputs: Vec<String>,
}

/// A served Kafka job's topics; brokers, group, client settings and state
/// are the host's.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServedKafka {
    /// Input topics (`<tenant>.<name>`).
    pub inputs: Vec<String>,
    /// Topic of each output.
    pub outputs: BTreeMap<String, String>,
    /// Topic of rejected and trapping records.
    pub dead_letter_topic: String,
    /// `exactly_once` (default) or `at_least_once`.
    #[serde(default)]
    pub guarantee: Guarantee,
    /// Create missing topics.
    #[serde(default)]
    pub create_topics: bool,
    /// Partitions of topics created when no input topic exists yet.
    #[serde(default = "default_create_partitions")]
    pub create_partitions: u32,
    /// Kafka transaction timeout, in milliseconds.
    #[serde(default = "default_transaction_timeout_ms")]
    pub transaction_timeout_ms: u64,
    /// How long a state restore may go without progress before it is
    /// retried, in milliseconds.
    #[serde(default = "tally_kafka::default_restore_stall_ms")]
    pub restore_stall_ms: u64,
}

/// Why a tenant's job file was refused; each says what to change. Nothing
/// was deployed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobSpecError {
    /// The file is larger than a job file may be.
    #[error("the job file has {bytes} bytes; a job file may have at most {MAX_JOB_FILE_BYTES}")]
    TooLarge {
        /// Its size.
        bytes: usize,
    },
    /// The file is not TOML.
    #[error("the job file is not valid TOML: {0}")]
    NotToml(#[source] toml::de::Error),
    /// The file sets something only the host sets.
    #[error("remove `{field}` from the job file: {why} ({})", source.message())]
    HostOwned {
        /// The field.
        field: &'static str,
        /// Who sets it instead.
        why: &'static str,
        /// The parser's error.
        source: toml::de::Error,
    },
    /// A field is unknown, missing or mistyped (the parser's words).
    #[error("the job file is invalid: {}", .0.message())]
    Invalid(#[source] toml::de::Error),
    /// The job's name is not one the host accepts.
    #[error("job name {0:?} must be non-empty and use only letters, digits and `-` (at most 64)")]
    BadName(String),
    /// The job does not pass the checks every job passes.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Both `[local]` and `[kafka]`, or neither.
    #[error(transparent)]
    Mode(#[from] ModeError),
    /// A local job of a tenant without an input directory.
    #[error(
        "tenant `{tenant}` has no input_dir in the host configuration, so it cannot run local jobs; use a [kafka] job, or ask the operator for an input_dir"
    )]
    NoInputDir {
        /// The tenant.
        tenant: String,
    },
    /// A Kafka job on a host without brokers.
    #[error("this host runs no Kafka jobs (its host file has no kafka_brokers); use a [local] job")]
    NoKafka,
    /// An input path that could leave the tenant's input directory.
    #[error(
        "input {input:?} must be a path inside the tenant's input directory, without `..` or a leading `/` (like \"usage-0.ndjson\")"
    )]
    InputPath {
        /// The path as given.
        input: String,
    },
    /// An input that leads outside the input directory once links are followed.
    #[error("input `{input}` leads outside the tenant's input directory, or is not a regular file")]
    InputOutside {
        /// The input, inside the tenant's directory.
        input: String,
    },
    /// An input that does not exist yet.
    #[error(
        "input `{input}` does not exist in the tenant's input directory; put the file there first"
    )]
    InputMissing {
        /// The input, inside the tenant's directory.
        input: String,
    },
    /// An input that cannot be opened.
    #[error("input `{input}` cannot be opened: {kind}")]
    InputUnreadable {
        /// The input, inside the tenant's directory.
        input: String,
        /// Why (no host path).
        kind: std::io::ErrorKind,
    },
    /// A topic outside the tenant's names.
    #[error(
        "topic `{topic}` is not one of tenant `{tenant}`'s: a job may only use topics named `{tenant}.<name>`"
    )]
    ForeignTopic {
        /// The topic.
        topic: String,
        /// The tenant.
        tenant: String,
    },
    /// `kafka.create_topics` on a host that does not create topics.
    #[error(
        "this host does not create tenants' topics (kafka_create_topics in the host file): ask the operator to create them, and remove kafka.create_topics"
    )]
    CreateTopicsRefused,
    /// A `[[deliver]]` section the host does not run.
    #[error(transparent)]
    Delivery(#[from] DeliverySpecError),
    /// A setting over the host's cap.
    #[error("{setting} may be at most {max} on this host{why}, got {got}")]
    OverCap {
        /// The setting.
        setting: &'static str,
        /// The host's cap.
        max: u64,
        /// What the job asked for.
        got: u64,
        /// Where the cap comes from, if the host file sets it.
        why: String,
    },
}

impl ServedJob {
    /// Parses a tenant's job file; the message says what is wrong.
    pub fn parse(text: &str) -> Result<ServedJob, JobSpecError> {
        if text.len() > MAX_JOB_FILE_BYTES {
            return Err(JobSpecError::TooLarge { bytes: text.len() });
        }
        let table: toml::Table = toml::from_str(text).map_err(JobSpecError::NotToml)?;
        toml::Value::Table(table).try_into().map_err(explain)
    }
}

/// The parser's message, with why a host-owned name is refused.
fn explain(err: toml::de::Error) -> JobSpecError {
    for (field, why) in HOST_OWNED {
        if err.message().contains(&format!("unknown field `{field}`")) {
            return JobSpecError::HostOwned { field, why, source: err };
        }
    }
    JobSpecError::Invalid(err)
}

/// A tenant's job as the host runs it.
#[derive(Debug)]
pub struct ParsedJob {
    /// The job's name as the tenant calls it.
    pub name: String,
    /// The config the host runs.
    pub config: JobConfig,
    /// Its deliveries, each run beside the job.
    pub deliveries: Vec<DeliverSettings>,
}

/// Parses `text` as `tenant`'s job. The host runs it as `<tenant>.<name>`,
/// so Kafka groups, transactional ids and changelogs of two tenants'
/// same-named jobs never meet.
pub fn parse(
    text: &str,
    tenant_name: &str,
    tenant: &TenantConfig,
    host: &HostConfig,
) -> Result<ParsedJob, JobSpecError> {
    let mut served = ServedJob::parse(text)?;
    let name = served.name.clone();
    if !super::config::valid_name(&name) {
        return Err(JobSpecError::BadName(name));
    }
    let dir = JobDir::new(&host.data_dir, tenant_name, &name);
    let sections = std::mem::take(&mut served.deliver);
    let config = served.into_config(tenant_name, tenant, host, &dir)?;
    let deliveries =
        delivery_spec::deliveries(&sections, &config, tenant_name, &tenant.deliver, &dir)?;
    // Said in the tenant's terms: the job's name without the tenant prefix.
    config.validate().map_err(|InvalidJob { message, .. }| {
        ConfigError::Invalid(InvalidJob { job: name.clone(), message })
    })?;
    check_caps(&config, tenant_name, host)?;
    if let (Mode::Local(local), Some(input_dir)) = (&config.mode, tenant.input_dir.as_deref()) {
        check_inputs(input_dir, &local.inputs)?;
    }
    Ok(ParsedJob { name, config, deliveries })
}

impl ServedJob {
    /// The config the host runs: the tenant's settings, with the host's
    /// paths, brokers and names.
    fn into_config(
        self,
        tenant_name: &str,
        tenant: &TenantConfig,
        host: &HostConfig,
        dir: &JobDir,
    ) -> Result<JobConfig, JobSpecError> {
        let mode = match (self.local, self.kafka) {
            (Some(_), Some(_)) => return Err(ModeError::Both.into()),
            (None, None) => return Err(ModeError::Neither.into()),
            (Some(local), None) => {
                let Some(input_dir) = &tenant.input_dir else {
                    return Err(JobSpecError::NoInputDir { tenant: tenant_name.to_string() });
                };
                let inputs = local
                    .inputs
                    .iter()
                    .map(|input| inside(input_dir, input))
                    .collect::<Result<_, _>>()?;
                // Checked again on every file the job opens, after it is open.
                Mode::Local(LocalConfig {
                    inputs,
                    output_dir: dir.output_dir(),
                    state_dir: dir.state_dir(),
                    confine_to: Some(input_dir.clone()),
                    output_suffix: String::new(),
                })
            }
            (None, Some(kafka)) => {
                let Some(brokers) = &host.kafka_brokers else {
                    return Err(JobSpecError::NoKafka);
                };
                Mode::Kafka(KafkaConfig {
                    brokers: brokers.clone(),
                    group: None,
                    inputs: kafka.inputs,
                    outputs: kafka.outputs,
                    dead_letter_topic: kafka.dead_letter_topic,
                    state_dir: dir.state_dir(),
                    guarantee: kafka.guarantee,
                    create_topics: kafka.create_topics,
                    create_partitions: kafka.create_partitions,
                    transaction_timeout_ms: kafka.transaction_timeout_ms,
                    // Not a tenant's to choose: it multiplies the shared
                    // broker's transactions while the input is slow.
                    commit_when_caught_up: false,
                    restore_stall_ms: kafka.restore_stall_ms,
                    restore_checkpoint_bytes: tally_kafka::DEFAULT_RESTORE_CHECKPOINT_BYTES,
                    restore_fetch: tally_kafka::RestoreFetch::default(),
                    client: host.kafka.client.clone(),
                })
            }
        };
        let mut periods = self.periods;
        if let Some(periods) = &mut periods {
            let cap = tenant.max_seen_ids;
            match periods.max_seen_ids {
                Some(asked) if asked > cap => {
                    return Err(JobSpecError::OverCap {
                        setting: "periods.max_seen_ids",
                        max: cap,
                        got: asked,
                        why: " (the tenant's max_seen_ids)".into(),
                    });
                }
                Some(_) => {}
                None => periods.max_seen_ids = Some(cap),
            }
        }
        let (periods, plugin_config) = period_settings(periods, self.plugin_config)?;
        Ok(JobConfig {
            settings: JobSettings {
                name: format!("{tenant_name}.{}", self.name),
                plugin: dir.path().join("plugins"),
                outputs: self.outputs,
                dead_letter_output: self.dead_letter_output,
                commit_interval_ms: self.commit_interval_ms,
                batch_size: self.batch_size,
                limits: self.limits,
                hot_swap: self.hot_swap,
                emit: self.emit,
                periods,
                plugin_config,
            },
            mode,
        })
    }
}

/// The host's caps on what a served job may ask for, and its tenant's topics.
fn check_caps(
    config: &JobConfig,
    tenant_name: &str,
    host: &HostConfig,
) -> Result<(), JobSpecError> {
    let over = |setting: &'static str, max: u64, got: u64, why: &str| {
        Err(JobSpecError::OverCap { setting, max, got, why: why.to_string() })
    };
    if let Mode::Kafka(kafka) = &config.mode {
        let prefix = format!("{tenant_name}.");
        let topics =
            kafka.inputs.iter().chain(kafka.outputs.values()).chain([&kafka.dead_letter_topic]);
        for topic in topics {
            if !topic.starts_with(&prefix) || topic.starts_with("tally-") {
                return Err(JobSpecError::ForeignTopic {
                    topic: topic.clone(),
                    tenant: tenant_name.to_string(),
                });
            }
        }
        if kafka.create_topics && !host.kafka_create_topics {
            return Err(JobSpecError::CreateTopicsRefused);
        }
        if kafka.create_partitions > MAX_CREATE_PARTITIONS {
            return over(
                "kafka.create_partitions",
                MAX_CREATE_PARTITIONS.into(),
                kafka.create_partitions.into(),
                "",
            );
        }
    }
    let limits = &config.settings.limits;
    if limits.memory_bytes > host.max_memory_bytes {
        return over(
            "limits.memory_bytes",
            host.max_memory_bytes,
            limits.memory_bytes,
            " (max_memory_bytes)",
        );
    }
    if limits.cpu_budget_ms > host.max_cpu_budget_ms {
        return over(
            "limits.cpu_budget_ms",
            host.max_cpu_budget_ms,
            limits.cpu_budget_ms,
            " (max_cpu_budget_ms)",
        );
    }
    // What one batch may make the host buffer: no more than the defaults.
    if limits.max_output_bytes_per_batch > DEFAULT_MAX_OUTPUT_BYTES_PER_BATCH {
        return over(
            "limits.max_output_bytes_per_batch",
            DEFAULT_MAX_OUTPUT_BYTES_PER_BATCH,
            limits.max_output_bytes_per_batch,
            "",
        );
    }
    if limits.max_state_bytes_per_batch > DEFAULT_MAX_STATE_BYTES_PER_BATCH {
        return over(
            "limits.max_state_bytes_per_batch",
            DEFAULT_MAX_STATE_BYTES_PER_BATCH,
            limits.max_state_bytes_per_batch,
            "",
        );
    }
    if limits.max_failures_in_a_row > MAX_FAILURES_IN_A_ROW {
        return over(
            "limits.max_failures_in_a_row",
            MAX_FAILURES_IN_A_ROW,
            limits.max_failures_in_a_row,
            "",
        );
    }
    // A record is read into memory whole, and into the plugin's too.
    let records = MAX_RECORD_BYTES.min(limits.memory_bytes);
    if limits.max_record_bytes > records {
        return over(
            "limits.max_record_bytes",
            records,
            limits.max_record_bytes,
            &format!(" ({MAX_RECORD_BYTES}, and no more than limits.memory_bytes)"),
        );
    }
    Ok(())
}

/// Opens each input the way the job will ([`tally_local::check_confined_input`]):
/// a regular file inside `input_dir` once every link is followed. Said at
/// deploy in the tenant's terms (paths inside its input directory, never
/// the host's); the job checks again on every open.
fn check_inputs(input_dir: &Path, inputs: &[PathBuf]) -> Result<(), JobSpecError> {
    for input in inputs {
        let shown = input.strip_prefix(input_dir).unwrap_or(input).display().to_string();
        match tally_local::check_confined_input(input, input_dir) {
            Ok(_) => {}
            Err(SourceError::Outside { .. }) => {
                return Err(JobSpecError::InputOutside { input: shown });
            }
            Err(SourceError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Err(JobSpecError::InputMissing { input: shown });
            }
            Err(SourceError::Read { source, .. }) => {
                return Err(JobSpecError::InputUnreadable { input: shown, kind: source.kind() });
            }
            Err(_) => {
                return Err(JobSpecError::InputUnreadable {
                    input: shown,
                    kind: std::io::ErrorKind::Other,
                });
            }
        }
    }
    Ok(())
}

/// `relative` under `input_dir`, refusing anything that could leave it.
fn inside(input_dir: &Path, relative: &str) -> Result<PathBuf, JobSpecError> {
    let path = Path::new(relative);
    if relative.is_empty()
        || !path.components().all(|component| matches!(component, Component::Normal(_)))
    {
        return Err(JobSpecError::InputPath { input: relative.to_string() });
    }
    Ok(input_dir.join(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(input_dir: Option<&Path>) -> TenantConfig {
        let mut tenant: TenantConfig = toml::from_str("token = \"0123456789abcdef\"").unwrap();
        tenant.input_dir = input_dir.map(Path::to_path_buf);
        tenant
    }

    fn host() -> HostConfig {
        let mut host: HostConfig =
            toml::from_str("data_dir = \"/data\"\nkafka_brokers = \"127.0.0.1:9092\"\n[tenants]\n")
                .unwrap();
        host.data_dir = "/data".into();
        host
    }

    const LOCAL: &str =
        "name = \"billing\"\noutputs = [\"totals\"]\n[local]\ninputs = [\"usage-0.ndjson\"]\n";
    const KAFKA: &str = "name = \"billing\"\noutputs = [\"totals\"]\n[kafka]\ninputs = [\"acme.usage\"]\noutputs = { totals = \"acme.totals\" }\ndead_letter_topic = \"acme.dead\"\n";

    #[test]
    fn the_host_places_files_and_qualifies_the_name() {
        let inputs = tempfile::tempdir().unwrap();
        std::fs::write(inputs.path().join("usage-0.ndjson"), "").unwrap();
        let ParsedJob { name, config, .. } =
            parse(LOCAL, "acme", &tenant(Some(inputs.path())), &host()).unwrap();
        assert_eq!(name, "billing");
        assert_eq!(config.settings.name, "acme.billing");
        let local = config.local().unwrap().clone();
        assert_eq!(local.inputs, [inputs.path().join("usage-0.ndjson")]);
        assert_eq!(local.state_dir, Path::new("/data/jobs/acme/billing/state"));
        assert_eq!(local.output_dir, Path::new("/data/jobs/acme/billing/out"));
        assert_eq!(local.confine_to.as_deref(), Some(inputs.path()));
    }

    #[test]
    fn escapes_unknown_fields_and_missing_inputs_are_refused_in_the_tenants_terms() {
        let inputs = tempfile::tempdir().unwrap();
        std::fs::write(inputs.path().join("usage-0.ndjson"), "").unwrap();
        let tenant = tenant(Some(inputs.path()));
        let data = &host();
        let err = parse(&LOCAL.replace("usage-0", "../../etc/passwd"), "acme", &tenant, data)
            .unwrap_err()
            .to_string();
        assert!(err.contains("without `..`"), "{err}");
        let err = parse(&format!("{LOCAL}colour = \"red\"\n"), "acme", &tenant, data)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `colour`"), "{err}");
        let err = parse("name = [", "acme", &tenant, data).unwrap_err().to_string();
        assert!(err.contains("not valid TOML"), "{err}");
        let err = parse(LOCAL, "acme", &super::tests::tenant(None), data).unwrap_err().to_string();
        assert!(err.contains("no input_dir"), "{err}");
        std::os::unix::fs::symlink("/etc/hostname", inputs.path().join("link.ndjson")).unwrap();
        let err = parse(&LOCAL.replace("usage-0", "link"), "acme", &tenant, data)
            .unwrap_err()
            .to_string();
        assert!(err.contains("leads outside"), "{err}");
        let err = parse(&LOCAL.replace("usage-0", "missing"), "acme", &tenant, data)
            .unwrap_err()
            .to_string();
        assert!(err.contains("input `missing.ndjson` does not exist"), "{err}");
        assert!(
            !err.contains(&inputs.path().display().to_string()),
            "the host's paths stay the host's: {err}"
        );
        let err = parse(&"#".repeat(MAX_JOB_FILE_BYTES + 1), "acme", &tenant, data)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("at most {MAX_JOB_FILE_BYTES}")), "{err}");
    }

    /// Every TOML form of a field the host owns, for both modes: none can
    /// reach the config the host runs.
    #[test]
    fn host_owned_fields_cannot_be_written_in_any_toml_form() {
        let inputs = tempfile::tempdir().unwrap();
        std::fs::write(inputs.path().join("usage-0.ndjson"), "").unwrap();
        let tenant = tenant(Some(inputs.path()));
        let attempts = [
            // Top level, as a key, a dotted key and inside an inline table.
            format!("plugin = \"/tmp/x.wasm\"\n{LOCAL}"),
            LOCAL.replace("[local]", "[local]\nstate_dir = \"/any/state\""),
            LOCAL.replace("[local]", "[local]\noutput_dir = \"/any/out\""),
            LOCAL.replace("[local]\ninputs = [\"usage-0.ndjson\"]", "local.inputs = [\"usage-0.ndjson\"]\nlocal.state_dir = \"/any\""),
            LOCAL.replace("[local]\ninputs = [\"usage-0.ndjson\"]", "local = { inputs = [\"usage-0.ndjson\"], output_dir = \"/any\" }"),
            // Positional arrays fill the served type's own fields only.
            LOCAL.replace("[local]\ninputs = [\"usage-0.ndjson\"]", "local = [[\"usage-0.ndjson\"], \"/any/out\", \"/any/state\"]"),
            // Arrays of tables.
            LOCAL.replace("[local]", "[[local]]"),
            KAFKA.replace("[kafka]", "[kafka]\nbrokers = \"127.0.0.1:1\""),
            KAFKA.replace("[kafka]", "[kafka]\ngroup = \"tally-globex.billing\""),
            KAFKA.replace("[kafka]", "[kafka]\nstate_dir = \"/any/state\""),
            format!("{KAFKA}[kafka.client]\n\"plugin.library.paths\" = \"/tmp/evil.so\"\n"),
            format!("{KAFKA}kafka.client.\"plugin.library.paths\" = \"/tmp/evil.so\"\n").replacen("[kafka]\n", "", 1).replace("inputs = [\"acme.usage\"]", "kafka.inputs = [\"acme.usage\"]").replace("outputs = { totals = \"acme.totals\" }\ndead", "kafka.outputs = { totals = \"acme.totals\" }\nkafka.dead"),
            "name = \"billing\"\noutputs = [\"totals\"]\nkafka = [\"127.0.0.1:1\", \"tally-acme.billing\", [\"acme.in\"], {totals = \"acme.out\"}, \"acme.dead\", \"/any/state\", \"exactly_once\", false, 1, 10000, {\"plugin.library.paths\" = \"/tmp/evil.so\"}]\n".to_string(),
            "name = \"billing\"\noutputs = [\"totals\"]\nkafka = { inputs = [\"acme.in\"], outputs = {totals = \"acme.out\"}, dead_letter_topic = \"acme.dead\", client = {\"plugin.library.paths\" = \"/tmp/evil.so\"} }\n".to_string(),
            "name = \"billing\"\noutputs = [\"totals\"]\n[[kafka]]\ninputs = [\"acme.in\"]\nbrokers = \"127.0.0.1:1\"\n".to_string(),
        ];
        for text in &attempts {
            match parse(text, "acme", &tenant, &host()) {
                Ok(parsed) => panic!("accepted {text:?} as {:?}", parsed.config),
                Err(err) => assert!(!err.to_string().is_empty(), "{text}"),
            }
        }
        // The refusals of named fields say what to do.
        let err = parse(&attempts[1], "acme", &tenant, &host()).unwrap_err().to_string();
        assert!(err.contains("remove `state_dir`") && err.contains("data directory"), "{err}");
        let err = parse(&attempts[10], "acme", &tenant, &host()).unwrap_err().to_string();
        assert!(err.contains("remove `client`"), "{err}");
    }

    #[test]
    fn kafka_jobs_use_the_hosts_brokers_and_only_their_tenants_topics() {
        let config = parse(KAFKA, "acme", &tenant(None), &host()).unwrap().config;
        let kafka = config.kafka().unwrap().clone();
        assert_eq!(kafka.brokers, "127.0.0.1:9092");
        assert!(
            kafka.client.is_empty() && kafka.group.is_none(),
            "the host's settings, not the tenant's"
        );
        assert_eq!(kafka.state_dir, Path::new("/data/jobs/acme/billing/state"));
        let err =
            parse(&KAFKA.replace("acme.usage", "globex.usage"), "acme", &tenant(None), &host())
                .unwrap_err()
                .to_string();
        assert!(err.contains("not one of tenant `acme`'s"), "{err}");
        let err = parse(
            &format!("{KAFKA}[limits]\nmemory_bytes = 1099511627776\n"),
            "acme",
            &tenant(None),
            &host(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("at most") && err.contains("max_memory_bytes"), "{err}");
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        /// Keys a tenant might write, the host's own among them.
        const KEYS: &[&str] = &[
            "name",
            "outputs",
            "plugin",
            "local",
            "kafka",
            "inputs",
            "state_dir",
            "output_dir",
            "brokers",
            "group",
            "client",
            "limits",
            "memory_bytes",
            "cpu_budget_ms",
            "dead_letter_topic",
            "commit_interval_ms",
            "emit",
            "totals",
            "plugin.library.paths",
            "bootstrap.servers",
            "max_record_bytes",
            "confine_to",
            "hot_swap",
        ];

        fn value() -> impl Strategy<Value = String> {
            let leaf = prop_oneof![
                "[a-z./_-]{0,12}".prop_map(|text| format!("{text:?}")),
                any::<i64>().prop_map(|n| n.to_string()),
                any::<bool>().prop_map(|b| b.to_string()),
                Just("\"acme.usage\"".to_string()),
                Just("\"usage.ndjson\"".to_string()),
                Just("[\"usage.ndjson\"]".to_string()),
                Just("\"/etc/passwd\"".to_string()),
                Just("\"../../x\"".to_string()),
            ];
            leaf.prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4)
                        .prop_map(|items| format!("[{}]", items.join(", "))),
                    prop::collection::vec((prop::sample::select(KEYS), inner), 0..4).prop_map(
                        |pairs| format!(
                            "{{ {} }}",
                            pairs
                                .iter()
                                .map(|(k, v)| format!("{k:?} = {v}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    ),
                ]
            })
        }

        fn document() -> impl Strategy<Value = String> {
            let line = prop_oneof![
                (prop::sample::select(KEYS), value())
                    .prop_map(|(key, value)| format!("{key:?} = {value}")),
                (prop::sample::select(KEYS), prop::sample::select(KEYS), value())
                    .prop_map(|(a, b, value)| format!("{a:?}.{b:?} = {value}")),
                prop::sample::select(KEYS).prop_map(|key| format!("[{key:?}]")),
                prop::sample::select(KEYS).prop_map(|key| format!("[[{key:?}]]")),
                (prop::sample::select(KEYS), prop::sample::select(KEYS))
                    .prop_map(|(a, b)| format!("[{a:?}.{b:?}]")),
            ];
            prop::collection::vec(line, 0..12).prop_map(|lines| lines.join("\n"))
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

            /// Whatever a tenant writes, the config the host runs holds
            /// only the host's paths, brokers and client settings.
            #[test]
            fn no_job_file_reaches_what_the_host_owns(text in document()) {
                let dir = tempfile::tempdir().unwrap();
                std::fs::write(dir.path().join("usage.ndjson"), "").unwrap();
                let inputs = dir.path().to_path_buf();
                let tenant = tenant(Some(&inputs));
                if let Ok(ParsedJob { name, config, .. }) = parse(&text, "acme", &tenant, &host()) {
                    prop_assert!(crate::serve::config::valid_name(&name));
                    prop_assert_eq!(&config.settings.name, &format!("acme.{name}"));
                    prop_assert_eq!(&config.settings.plugin, &Path::new("/data/jobs/acme").join(&name).join("plugins"));
                    if let Ok(local) = config.local() {
                        prop_assert!(local.inputs.iter().all(|input| input.starts_with(&inputs) && !input.components().any(|c| matches!(c, Component::ParentDir))));
                        prop_assert!(local.state_dir.starts_with("/data/jobs/acme") && local.output_dir.starts_with("/data/jobs/acme"));
                    }
                    if let Ok(kafka) = config.kafka() {
                        prop_assert_eq!(kafka.brokers.as_str(), "127.0.0.1:9092");
                        prop_assert!(kafka.client.is_empty() && kafka.group.is_none());
                        prop_assert!(kafka.state_dir.starts_with("/data/jobs/acme"));
                    }
                }
            }

            /// Bytes that are not even TOML are refused with a message.
            #[test]
            fn any_bytes_are_refused_or_parsed_without_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
                let text = String::from_utf8_lossy(&bytes);
                if let Err(message) = parse(&text, "acme", &tenant(None), &host()) {
                    prop_assert!(!message.to_string().is_empty());
                }
            }
        }
    }
}
