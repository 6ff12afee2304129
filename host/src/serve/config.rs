//! The host configuration of `tally serve`: where it listens, where it
//! keeps its jobs, and the tenants with their tokens.
//!
//! ```toml
//! listen = "127.0.0.1:7070"     # loopback unless you say otherwise
//! data_dir = "tally-data"
//! max_upload_bytes = 33554432   # largest request body (plugin uploads)
//! metrics_token = "..."         # bearer token for /metrics (optional)
//! kafka_brokers = "127.0.0.1:9092"  # the cluster Kafka jobs use (none: no Kafka jobs)
//! # kafka_create_topics = false  # whether tenants' jobs may create their topics
//! max_memory_bytes = 1073741824 # the most a job's plugin may ask for
//! max_cpu_budget_ms = 10000
//! # plugin_versions_kept = 5     # per job, on disk (the active one always)
//! # plugin_log_lines_per_second = 100, max_plugin_log_line_bytes = 1024
//! # max_compile_seconds = 30, max_compile_memory_bytes = 2147483648
//!
//! [tenants.acme]
//! token = "a-long-random-secret"
//! input_dir = "inputs/acme"     # local jobs of this tenant read only here
//! max_jobs = 16                 # the most jobs the tenant may have
//! cpu_share = 1                 # weight of the tenant's share of the cores
//! max_total_memory_bytes = 4294967296  # sum of its jobs' limits.memory_bytes
//! max_seen_ids = 10000000       # event ids a period job's partition may remember
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Shortest bearer token accepted: guessing must be hopeless.
pub const MIN_TOKEN_CHARS: usize = 16;

/// `tally serve`'s configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// Address of the admin API.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Where jobs, their plugin versions, state and outputs live.
    pub data_dir: PathBuf,
    /// Largest request body, in bytes.
    #[serde(default = "default_max_upload_bytes")]
    pub max_upload_bytes: u64,
    /// Bearer token that may read `/metrics` (all tenants' jobs); without
    /// one, `/metrics` is not served.
    #[serde(default)]
    pub metrics_token: Option<String>,
    /// Bootstrap servers of the cluster every Kafka job uses; without them,
    /// Kafka jobs are refused.
    #[serde(default)]
    pub kafka_brokers: Option<String>,
    /// Whether served Kafka jobs may have their missing topics created
    /// (`kafka.create_topics`). Off by default: on a shared cluster the
    /// operator creates tenants' topics (and quotas), not the tenants.
    #[serde(default)]
    pub kafka_create_topics: bool,
    /// The most linear memory a job may give its plugin (`limits.memory_bytes`).
    #[serde(default = "default_max_memory_bytes")]
    pub max_memory_bytes: u64,
    /// The largest CPU budget per batch a job may give its plugin (`limits.cpu_budget_ms`).
    #[serde(default = "default_max_cpu_budget_ms")]
    pub max_cpu_budget_ms: u64,
    /// Plugin versions each job keeps on disk (the active one, and one on
    /// trial, are always kept): older ones are removed, and can no longer
    /// be rolled back to.
    #[serde(default = "default_plugin_versions_kept")]
    pub plugin_versions_kept: usize,
    /// Lines per second each job's plugin may log; more are dropped (and
    /// counted in `tally_plugin_log_lines_dropped_total`).
    #[serde(default = "default_plugin_log_lines_per_second")]
    pub plugin_log_lines_per_second: u32,
    /// Longest plugin log line kept, in bytes; longer ones are cut.
    #[serde(default = "default_max_plugin_log_line_bytes")]
    pub max_plugin_log_line_bytes: usize,
    /// Longest an upload's compile may take (CPU and wall clock), in seconds.
    #[serde(default = "default_max_compile_seconds")]
    pub max_compile_seconds: u64,
    /// Most memory (address space) an upload's compile may use, in bytes.
    #[serde(default = "default_max_compile_memory_bytes")]
    pub max_compile_memory_bytes: u64,
    /// The Kafka client settings of every job the host runs (TLS, SASL,
    /// timeouts), as a job file's `[kafka.client]`; the operator's alone.
    #[serde(default)]
    pub kafka: HostKafka,
    /// Tenants by name.
    pub tenants: BTreeMap<String, TenantConfig>,
}

/// The host file's `[kafka]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostKafka {
    /// librdkafka properties for every client of the host's jobs (a
    /// `producer.`, `consumer.` or `admin.` prefix: for those clients only).
    #[serde(default)]
    pub client: BTreeMap<String, String>,
}

/// One tenant.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant's bearer token.
    pub token: String,
    /// Directory the tenant's local jobs read their inputs from; local
    /// jobs are refused for a tenant without one.
    #[serde(default)]
    pub input_dir: Option<PathBuf>,
    /// The most jobs the tenant may have at once.
    #[serde(default = "default_max_jobs")]
    pub max_jobs: usize,
    /// The tenant's weight in sharing the host's cores among the tenants
    /// whose jobs are busy.
    #[serde(default = "default_cpu_share")]
    pub cpu_share: u32,
    /// The most the tenant's jobs' `limits.memory_bytes` may add up to.
    #[serde(default = "default_max_total_memory_bytes")]
    pub max_total_memory_bytes: u64,
    /// The most event ids one partition of the tenant's period jobs may
    /// remember (`periods.max_seen_ids`, and its value when unset).
    #[serde(default = "default_max_seen_ids")]
    pub max_seen_ids: u64,
    /// Where the tenant's jobs may deliver their outputs (`[[deliver]]`),
    /// and with what secret; nowhere unless set.
    #[serde(default)]
    pub deliver: super::delivery_spec::TenantDelivery,
}

fn default_max_seen_ids() -> u64 {
    10_000_000
}

fn default_max_jobs() -> usize {
    16
}

fn default_cpu_share() -> u32 {
    1
}

fn default_max_total_memory_bytes() -> u64 {
    4 << 30
}

fn default_plugin_versions_kept() -> usize {
    5
}

fn default_plugin_log_lines_per_second() -> u32 {
    tally_core::plugin::context::DEFAULT_LOG_LINES_PER_SECOND
}

fn default_max_plugin_log_line_bytes() -> usize {
    tally_core::plugin::context::DEFAULT_MAX_LOG_LINE_BYTES
}

fn default_max_compile_seconds() -> u64 {
    30
}

fn default_max_compile_memory_bytes() -> u64 {
    2 << 30
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7070))
}

fn default_max_upload_bytes() -> u64 {
    32 << 20
}

fn default_max_memory_bytes() -> u64 {
    1 << 30
}

fn default_max_cpu_budget_ms() -> u64 {
    10_000
}

/// Tenant and job names: letters, digits and `-`. Kafka names are built
/// from them with `.` (`tally-<tenant>.<job>`), and Kafka treats `.` and
/// `_` alike, so neither may appear inside a name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// A host file value out of range or inconsistent; the message says what
/// to change.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InvalidHostFile(pub String);

/// A host file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostFileError {
    /// It could not be read.
    #[error("cannot read host file `{}`: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not valid TOML, or has unknown or mistyped fields.
    #[error("host file `{}` is invalid: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong (the parser names the field).
        source: toml::de::Error,
    },
    /// A value is out of range or inconsistent.
    #[error("host file `{}`: {source}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What to change.
        source: InvalidHostFile,
    },
}

impl HostConfig {
    /// Reads and checks a host file; relative paths are taken relative to it.
    pub fn from_file(path: &Path) -> Result<HostConfig, HostFileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| HostFileError::Read { path: path.to_path_buf(), source })?;
        let mut config: HostConfig = toml::from_str(&text)
            .map_err(|source| HostFileError::Parse { path: path.to_path_buf(), source })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |path: &mut PathBuf| {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        };
        resolve(&mut config.data_dir);
        for tenant in config.tenants.values_mut() {
            let deliver = &mut tenant.deliver;
            let paths =
                [&mut tenant.input_dir, &mut deliver.secret_file, &mut deliver.postgres_ca_file];
            for path in paths.into_iter().flatten() {
                resolve(path);
            }
        }
        config
            .validate()
            .map_err(|source| HostFileError::Invalid { path: path.to_path_buf(), source })?;
        Ok(config)
    }

    /// Checks names and tokens; the message says what to change.
    pub fn validate(&self) -> Result<(), InvalidHostFile> {
        if self.tenants.is_empty() {
            return Err(InvalidHostFile(
                "add at least one tenant: [tenants.<name>] with a token".into(),
            ));
        }
        let mut tokens = std::collections::HashSet::new();
        for (name, tenant) in &self.tenants {
            if !valid_name(name) {
                return Err(InvalidHostFile(format!(
                    "tenant name {name:?} must use only letters, digits and `-` (at most 64)"
                )));
            }
            if name.to_ascii_lowercase().starts_with("tally") {
                // Tally's own Kafka names start with `tally-`: a tenant `tally-x`
                // could otherwise claim topics such as `tally-x.job-state-changelog`.
                return Err(InvalidHostFile(format!(
                    "tenant name {name:?} may not start with `tally`"
                )));
            }
            if tenant.token.chars().count() < MIN_TOKEN_CHARS {
                return Err(InvalidHostFile(format!(
                    "tenant `{name}`: the token must have at least {MIN_TOKEN_CHARS} characters"
                )));
            }
            if !tokens.insert(tenant.token.as_str()) {
                return Err(InvalidHostFile(format!(
                    "tenant `{name}` shares its token with another tenant; give each tenant its own"
                )));
            }
        }
        if let Some(token) = &self.metrics_token
            && (token.chars().count() < MIN_TOKEN_CHARS || tokens.contains(token.as_str()))
        {
            return Err(InvalidHostFile(format!(
                "metrics_token must have at least {MIN_TOKEN_CHARS} characters and differ from every tenant's token"
            )));
        }
        if self.max_upload_bytes < 1024 {
            return Err(InvalidHostFile("max_upload_bytes must be at least 1024".into()));
        }
        for (name, tenant) in &self.tenants {
            if tenant.cpu_share == 0 || tenant.cpu_share > 1000 {
                return Err(InvalidHostFile(format!(
                    "tenant `{name}`: cpu_share must be between 1 and 1000, got {}",
                    tenant.cpu_share
                )));
            }
            if tenant.max_seen_ids == 0 {
                return Err(InvalidHostFile(format!(
                    "tenant `{name}`: max_seen_ids must be at least 1 (its period jobs could count no event)"
                )));
            }
            tenant.deliver.validate(name)?;
            if tenant.max_total_memory_bytes < 1 << 20 {
                return Err(InvalidHostFile(format!(
                    "tenant `{name}`: max_total_memory_bytes must be at least 1048576 (1 MiB)"
                )));
            }
        }
        tally_kafka::check_client_settings(&self.kafka.client).map_err(InvalidHostFile)?;
        if !self.kafka.client.is_empty() && self.kafka_brokers.is_none() {
            return Err(InvalidHostFile(
                "kafka.client is set but kafka_brokers is not: give the brokers the settings are for".into(),
            ));
        }
        if self.plugin_versions_kept == 0 {
            return Err(InvalidHostFile("plugin_versions_kept must be at least 1".into()));
        }
        if self.plugin_log_lines_per_second == 0 || self.max_plugin_log_line_bytes < 64 {
            return Err(InvalidHostFile("plugin_log_lines_per_second must be at least 1 and max_plugin_log_line_bytes at least 64".into()));
        }
        if self.max_compile_seconds == 0 || self.max_compile_memory_bytes < 64 << 20 {
            return Err(InvalidHostFile("max_compile_seconds must be at least 1 and max_compile_memory_bytes at least 67108864 (64 MiB)".into()));
        }
        Ok(())
    }

    /// The bounds on each job's plugin log.
    pub fn log_limits(&self) -> tally_core::plugin::context::LogLimits {
        tally_core::plugin::context::LogLimits {
            lines_per_second: self.plugin_log_lines_per_second,
            max_line_bytes: self.max_plugin_log_line_bytes,
        }
    }

    /// The tenant whose token is `token`, compared in constant time.
    pub fn tenant_of(&self, token: &str) -> Option<&str> {
        self.tenants
            .iter()
            .find(|(_, tenant)| same_secret(&tenant.token, token))
            .map(|(name, _)| name.as_str())
    }
}

/// Compares secrets without an early exit on the first differing byte.
pub fn same_secret(expected: &str, given: &str) -> bool {
    use sha2::{Digest, Sha256};
    let (expected, given) = (Sha256::digest(expected.as_bytes()), Sha256::digest(given.as_bytes()));
    expected.iter().zip(given.iter()).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(tenants: &str) -> Result<HostConfig, String> {
        let config: HostConfig = toml::from_str(&format!("data_dir = \"d\"\n{tenants}"))
            .map_err(|err| err.to_string())?;
        config.validate().map(|()| config).map_err(|err| err.to_string())
    }

    #[test]
    fn tokens_must_be_long_and_distinct() {
        assert!(host("[tenants.a]\ntoken = \"short\"").unwrap_err().contains("at least 16"));
        let shared =
            "[tenants.a]\ntoken = \"0123456789abcdef\"\n[tenants.b]\ntoken = \"0123456789abcdef\"";
        assert!(host(shared).unwrap_err().contains("shares its token"));
        let ok = host(
            "[tenants.a]\ntoken = \"0123456789abcdef\"\n[tenants.b]\ntoken = \"fedcba9876543210\"",
        )
        .unwrap();
        assert_eq!(ok.tenant_of("fedcba9876543210"), Some("b"));
        assert_eq!(ok.tenant_of("fedcba987654321"), None);
        assert_eq!(ok.listen, default_listen(), "loopback unless configured");
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(
            host("[tenants.a]\ntoken = \"0123456789abcdef\"\nadmin = true")
                .unwrap_err()
                .contains("unknown field")
        );
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

            /// A host file of any shape is read or refused with a message.
            #[test]
            fn any_host_file_is_read_or_refused(lines in prop::collection::vec(prop::sample::select(vec![
                "data_dir = \"d\"", "listen = \"0.0.0.0:1\"", "listen = \"nonsense\"", "max_upload_bytes = 0",
                "metrics_token = \"x\"", "plugin_versions_kept = 0", "max_compile_seconds = 0", "[tenants.a]",
                "[tenants.tally-x]", "[tenants.\"a b\"]", "token = \"0123456789abcdef\"", "token = \"short\"",
                "cpu_share = 0", "cpu_share = 4294967295", "max_total_memory_bytes = 1", "input_dir = \"i\"", "max_jobs = 0",
            ]), 0..12)) {
                let text = lines.join("\n");
                match host(&text.replacen("data_dir = \"d\"", "", 1)) {
                    Ok(config) => prop_assert!(config.validate().is_ok()),
                    Err(message) => prop_assert!(!message.is_empty()),
                }
            }
        }
    }
}
