//! A served job's `[[deliver]]` sections: which of its outputs go to which
//! target, within what the operator allows its tenant.
//!
//! A tenant names the output and the target's settings; the operator owns
//! the rest in the host file's `[tenants.<name>.deliver]`: the URL
//! prefixes the tenant's HTTP deliveries may reach (nothing else: an
//! uploaded job must not turn the host into a proxy to its neighbours or
//! its own admin port), the secret header sent with them, and the
//! PostgreSQL database the tenant's rows go into. The tenant's types have
//! no field for any of these. The delivery's state, dead letters and
//! ledger topic are the host's too.

use std::path::PathBuf;

use axum::http::Uri;
use serde::Deserialize;
use tally_deliver::DeliverSettings;
use tally_deliver::settings::{
    HttpSettings, PostgresSettings, Target, TenantHttpTable, secret_from_file,
};

use super::config::InvalidHostFile;
use super::registry::JobDir;
use crate::config::{JobConfig, Mode};

/// Most `[[deliver]]` sections one served job may have.
pub const MAX_DELIVERIES: usize = 4;

/// Most requests in flight one served delivery may have.
pub const MAX_SERVED_IN_FLIGHT: usize = 32;
/// The longest `http.timeout` and `http.connect_timeout` of a served
/// delivery: stopping a delivery (a change, a promotion, a delete) waits
/// for its requests in flight.
pub const MAX_SERVED_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// What the operator allows a tenant's deliveries (`[tenants.<name>.deliver]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantDelivery {
    /// URL prefixes the tenant's HTTP deliveries (and lookups) may reach,
    /// such as `"https://billing.example/usage"`: same scheme, host and
    /// port, and a path under the prefix's.
    #[serde(default)]
    pub urls: Vec<String>,
    /// The header sent with every request of the tenant's HTTP deliveries,
    /// whose value is read from `secret_file` (default `Authorization`).
    #[serde(default)]
    pub secret_header: Option<String>,
    /// The file holding that header's value, one line.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// The database the tenant's PostgreSQL deliveries write into.
    #[serde(default)]
    pub postgres_url: Option<String>,
    /// The certificates (PEM) that sign that server's, for `sslmode=require`.
    #[serde(default)]
    pub postgres_ca_file: Option<PathBuf>,
}

impl TenantDelivery {
    /// Checks the operator's settings for tenant `tenant`.
    pub fn validate(&self, tenant: &str) -> Result<(), InvalidHostFile> {
        for url in &self.urls {
            if let Err(why) = AllowedUrl::parse(url) {
                return Err(InvalidHostFile(format!(
                    "tenant `{tenant}`: deliver.urls entry {url:?} {why}; give an http:// or https:// URL with a host, such as \"https://billing.example/usage\""
                )));
            }
        }
        if self.secret_header.is_some() && self.secret_file.is_none() {
            return Err(InvalidHostFile(format!(
                "tenant `{tenant}`: deliver.secret_header needs deliver.secret_file, the file holding its value"
            )));
        }
        if let Some(url) = &self.postgres_url
            && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            return Err(InvalidHostFile(format!(
                "tenant `{tenant}`: deliver.postgres_url must be a postgres://user:password@host:port/database URL"
            )));
        }
        Ok(())
    }
}

/// A served job's `[[deliver]]` section as its tenant writes it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServedDelivery {
    /// The job's output that is delivered.
    pub output: String,
    /// `POST` each record to a billing HTTP API under the tenant's allowed URLs.
    #[serde(default)]
    pub http: Option<TenantHttpTable>,
    /// Upsert each record into a table of the tenant's database.
    #[serde(default)]
    pub postgres: Option<ServedPostgres>,
}

/// A served PostgreSQL delivery: the table; the database is the operator's.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServedPostgres {
    /// The table, as `name` or `schema.name`.
    pub table: String,
    /// Records per transaction (default 500).
    #[serde(default)]
    pub batch_size: Option<usize>,
}

/// A `[[deliver]]` section the host does not run; nothing was deployed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeliverySpecError {
    /// More sections than a job may have.
    #[error("a served job may have at most {MAX_DELIVERIES} [[deliver]] sections, got {got}")]
    TooMany {
        /// How many the job has.
        got: usize,
    },
    /// An output the job does not have, or one delivered twice.
    #[error(
        "[[deliver]] output {output:?} must be one of the job's outputs ({outputs}), each delivered at most once"
    )]
    Output {
        /// The output named.
        output: String,
        /// The job's outputs.
        outputs: String,
    },
    /// Neither or both targets.
    #[error(
        "[[deliver]] of output {output:?}: give an [deliver.http] or a [deliver.postgres] table, exactly one"
    )]
    Target {
        /// The output.
        output: String,
    },
    /// A URL outside what the operator allows the tenant.
    #[error(
        "[[deliver]] of output {output:?}: {key} {url:?} is not under a URL tenant `{tenant}` may deliver to ({allowed}); use one of those, or ask the operator to add yours to deliver.urls in the host file"
    )]
    UrlRefused {
        /// The output.
        output: String,
        /// The setting.
        key: &'static str,
        /// The URL as given.
        url: String,
        /// The tenant.
        tenant: String,
        /// What the tenant may reach.
        allowed: String,
    },
    /// A PostgreSQL delivery of a tenant without a database.
    #[error(
        "tenant `{tenant}` has no deliver.postgres_url in the host configuration, so its jobs cannot deliver into PostgreSQL; ask the operator for one"
    )]
    NoDatabase {
        /// The tenant.
        tenant: String,
    },
    /// `max_in_flight` over the host's cap.
    #[error(
        "[[deliver]] of output {output:?}: http.max_in_flight may be at most {MAX_SERVED_IN_FLIGHT} on this host, got {got}"
    )]
    InFlight {
        /// The output.
        output: String,
        /// What the job asked for.
        got: usize,
    },
    /// A request timeout over the host's cap.
    #[error(
        "[[deliver]] of output {output:?}: {key} may be at most {}s on this host (MAX_SERVED_TIMEOUT), got {}s",
        MAX_SERVED_TIMEOUT.as_secs(),
        got.as_secs_f64()
    )]
    Timeout {
        /// The output.
        output: String,
        /// The setting (`http.timeout`, `http.connect_timeout`).
        key: &'static str,
        /// What the job asked for.
        got: std::time::Duration,
    },
    /// A setting the delivery cannot use.
    #[error("[[deliver]] of output {output:?}: {source}")]
    Settings {
        /// The output.
        output: String,
        /// What is wrong.
        source: tally_deliver::SettingsError,
    },
}

/// The deliveries of `tenant`'s job `job`, kept in `dir`, checked against
/// what the operator allows.
pub fn deliveries(
    sections: &[ServedDelivery],
    job: &JobConfig,
    tenant: &str,
    allowed: &TenantDelivery,
    dir: &JobDir,
) -> Result<Vec<DeliverSettings>, DeliverySpecError> {
    let outputs = &job.settings.outputs;
    if sections.len() > MAX_DELIVERIES {
        return Err(DeliverySpecError::TooMany { got: sections.len() });
    }
    let mut settings = Vec::with_capacity(sections.len());
    for (index, section) in sections.iter().enumerate() {
        let output = section.output.clone();
        let repeated = sections[..index].iter().any(|earlier| earlier.output == output);
        if repeated || !outputs.contains(&output) {
            return Err(DeliverySpecError::Output { output, outputs: outputs.join(", ") });
        }
        let target = match (&section.http, &section.postgres) {
            (Some(http), None) => Target::Http(http_target(http, &output, tenant, allowed)?),
            (None, Some(postgres)) => {
                let Some(url) = &allowed.postgres_url else {
                    return Err(DeliverySpecError::NoDatabase { tenant: tenant.to_string() });
                };
                let postgres = PostgresSettings::for_tenant(
                    url,
                    &postgres.table,
                    postgres.batch_size,
                    allowed.postgres_ca_file.clone(),
                )
                .map_err(|source| DeliverySpecError::Settings { output: output.clone(), source })?;
                Target::Postgres(postgres)
            }
            _ => return Err(DeliverySpecError::Target { output }),
        };
        let state_dir = dir.delivery_dir(&output);
        settings.push(DeliverSettings {
            job: dir.job_file(),
            dead_letters: state_dir.join("dead-letters.ndjson"),
            state_dir,
            // Job names have no `.`: no two jobs' ledgers share a topic.
            ledger_topic: matches!(job.mode, Mode::Kafka(_))
                .then(|| format!("tally-{}.{output}.delivery-ledger", job.settings.name)),
            output,
            ledger_retention: std::time::Duration::from_secs(24 * 3600),
            target,
        });
    }
    Ok(settings)
}

/// An HTTP target within the tenant's allowed URLs, with the operator's
/// secret header.
fn http_target(
    table: &TenantHttpTable,
    output: &str,
    tenant: &str,
    allowed: &TenantDelivery,
) -> Result<HttpSettings, DeliverySpecError> {
    let prefixes: Vec<AllowedUrl> =
        allowed.urls.iter().filter_map(|url| AllowedUrl::parse(url).ok()).collect();
    let lookup = table.lookup_url.as_deref().map(|url| ("http.lookup_url", url));
    for (key, url) in [("http.url", table.url.as_str())].into_iter().chain(lookup) {
        // `{key}` is filled in per record with percent-encoded unreserved characters only.
        let concrete = url.replace("{key}", "k");
        let fits = AllowedUrl::parse(&concrete)
            .is_ok_and(|asked| prefixes.iter().any(|prefix| prefix.contains(&asked)));
        if !fits {
            return Err(DeliverySpecError::UrlRefused {
                output: output.to_string(),
                key,
                url: url.to_string(),
                tenant: tenant.to_string(),
                allowed: if allowed.urls.is_empty() {
                    "none".to_string()
                } else {
                    allowed.urls.join(", ")
                },
            });
        }
    }
    if let Some(got) = table.max_in_flight.filter(|&got| got > MAX_SERVED_IN_FLIGHT) {
        return Err(DeliverySpecError::InFlight { output: output.to_string(), got });
    }
    let settings_error =
        |source| DeliverySpecError::Settings { output: output.to_string(), source };
    let secret = match &allowed.secret_file {
        Some(file) => Some(
            secret_from_file("deliver", allowed.secret_header.clone(), file)
                .map_err(settings_error)?,
        ),
        None => None,
    };
    let mut table = table.clone();
    table.max_in_flight = Some(table.max_in_flight.unwrap_or(16).min(MAX_SERVED_IN_FLIGHT));
    let settings = HttpSettings::for_tenant(table, secret).map_err(settings_error)?;
    for (key, got) in
        [("http.timeout", settings.timeout), ("http.connect_timeout", settings.connect_timeout)]
    {
        if got > MAX_SERVED_TIMEOUT {
            return Err(DeliverySpecError::Timeout { output: output.to_string(), key, got });
        }
    }
    Ok(settings)
}

/// A URL reduced to what decides where a request goes: scheme, host, port
/// and path.
#[derive(Debug, PartialEq, Eq)]
struct AllowedUrl {
    https: bool,
    host: String,
    port: u16,
    path: String,
}

impl AllowedUrl {
    /// Parses `url`; refuses user info, a query or fragment in odd places,
    /// and paths a server could resolve elsewhere (`.`/`..` segments, their
    /// percent-encoded forms, backslashes).
    fn parse(url: &str) -> Result<AllowedUrl, &'static str> {
        let uri: Uri = url.parse().map_err(|_| "is not a URL")?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err("must start with http:// or https://"),
        };
        let authority = uri.authority().ok_or("has no host")?;
        if authority.as_str().contains('@') {
            return Err("must not carry a user name or password");
        }
        let host = authority.host().to_ascii_lowercase();
        if host.is_empty() {
            return Err("has no host");
        }
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let path = uri.path().to_string();
        let lowered = path.to_ascii_lowercase();
        let dot_segment = path.split('/').any(|segment| segment == "." || segment == "..");
        if dot_segment || lowered.contains("%2e") || lowered.contains("%2f") || path.contains('\\')
        {
            return Err("must not have `.` or `..` path segments (or encoded dots and slashes)");
        }
        Ok(AllowedUrl { https, host, port, path })
    }

    /// Whether `asked` is at or under this prefix.
    fn contains(&self, asked: &AllowedUrl) -> bool {
        if (self.https, &self.host, self.port) != (asked.https, &asked.host, asked.port) {
            return false;
        }
        let prefix = self.path.trim_end_matches('/');
        match asked.path.strip_prefix(prefix) {
            Some(rest) => rest.is_empty() || rest.starts_with('/'),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allows(prefix: &str, url: &str) -> bool {
        let prefix = AllowedUrl::parse(prefix).unwrap();
        AllowedUrl::parse(url).is_ok_and(|asked| prefix.contains(&asked))
    }

    #[test]
    fn a_url_is_allowed_only_under_a_prefix_on_the_same_origin() {
        assert!(allows("https://billing.example/usage", "https://billing.example/usage"));
        assert!(allows("https://billing.example/usage", "https://Billing.Example:443/usage/x?y=1"));
        assert!(allows("https://billing.example/", "https://billing.example/anything"));
        assert!(allows("http://127.0.0.1:8080", "http://127.0.0.1:8080/usage"));
        for refused in [
            "https://billing.example/usagex",
            "https://billing.example/other",
            "http://billing.example/usage",
            "https://billing.example:8443/usage",
            "https://billing.example.evil/usage",
            "https://evil@billing.example/usage",
            "https://billing.example/usage/../admin",
            "https://billing.example/usage/%2e%2e/admin",
            "https://billing.example/usage/..%2fadmin",
            "https://billing.example/usage\\..\\admin",
            "file:///etc/passwd",
            "http://127.0.0.1:7070/v1/jobs",
        ] {
            assert!(!allows("https://billing.example/usage", refused), "{refused}");
        }
    }
}
