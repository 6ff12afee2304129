//! The delivery file (`tally deliver <file.toml>`): which job's committed
//! output goes where, read and checked into [`DeliverSettings`]. Every
//! setting and its default is listed in `docs/delivery.md`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::{SignedDuration, Span, SpanRelativeTo};
use serde::Deserialize;

/// Most requests in flight a delivery may allow.
pub const MAX_IN_FLIGHT_LIMIT: usize = 256;

/// A delivery file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeliverFile {
    job: PathBuf,
    output: String,
    state_dir: PathBuf,
    #[serde(default)]
    dead_letters: Option<PathBuf>,
    #[serde(default)]
    ledger_topic: Option<String>,
    #[serde(default)]
    ledger_retention: Option<String>,
    http: Option<HttpTable>,
    postgres: Option<PostgresTable>,
}

/// The `[postgres]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostgresTable {
    url: String,
    table: String,
    #[serde(default)]
    delivery: Option<String>,
    #[serde(default)]
    batch_size: Option<usize>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
}

/// The `[http]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpTable {
    url: String,
    #[serde(default)]
    idempotency_header: Option<String>,
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    connect_timeout: Option<String>,
    #[serde(default)]
    max_in_flight: Option<usize>,
    #[serde(default)]
    key_retention: Option<String>,
    #[serde(default)]
    lookup_url: Option<String>,
    #[serde(default)]
    body: Option<Body>,
    #[serde(default)]
    retry_initial: Option<String>,
    #[serde(default)]
    retry_max: Option<String>,
    #[serde(default)]
    secret_header: Option<String>,
    #[serde(default)]
    secret_file: Option<PathBuf>,
    #[serde(default)]
    secret_env: Option<String>,
}

/// The `[http]` settings a tenant of `tally serve` gives in a served
/// job's `[[deliver]]` section: everything but the secret header, which
/// only the operator sets (the host file's `[tenants.<name>.deliver]`).
/// Each field means what it means in a delivery file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct TenantHttpTable {
    pub url: String,
    #[serde(default)]
    pub idempotency_header: Option<String>,
    #[serde(default)]
    pub timeout: Option<String>,
    #[serde(default)]
    pub connect_timeout: Option<String>,
    #[serde(default)]
    pub max_in_flight: Option<usize>,
    #[serde(default)]
    pub key_retention: Option<String>,
    #[serde(default)]
    pub lookup_url: Option<String>,
    #[serde(default)]
    pub body: Option<Body>,
    #[serde(default)]
    pub retry_initial: Option<String>,
    #[serde(default)]
    pub retry_max: Option<String>,
}

/// What a request's body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Body {
    /// The record's `value`, as the job wrote it (the default).
    Value,
    /// The whole output line: key, value, lineage and idempotency key.
    Record,
}

/// A checked delivery: where the records come from and where they go.
#[derive(Debug, Clone)]
pub struct DeliverSettings {
    /// The job file whose committed outputs are delivered (as written:
    /// relative paths are resolved by the caller against the delivery
    /// file's directory).
    pub job: PathBuf,
    /// The job's output that is delivered.
    pub output: String,
    /// The delivery's own state: its position and ledger.
    pub state_dir: PathBuf,
    /// Where records the target refused for good are written.
    pub dead_letters: PathBuf,
    /// A Kafka job's delivery: the compacted topic its ledger is mirrored
    /// to (default: `tally-<job>-<output>-delivery-ledger`, set by the
    /// caller).
    pub ledger_topic: Option<String>,
    /// How long a settled record's ledger entry stays once the position
    /// has passed it (default 24 h); then only its count stays.
    pub ledger_retention: Duration,
    /// Where the records go.
    pub target: Target,
}

/// Where a delivery's records go: one target, by construction.
#[derive(Debug, Clone)]
pub enum Target {
    /// `POST` to a billing HTTP API.
    Http(HttpSettings),
    /// Rows upserted into a PostgreSQL table.
    Postgres(PostgresSettings),
}

/// Most records one PostgreSQL transaction may carry.
pub const MAX_BATCH_SIZE: usize = 10_000;

/// The PostgreSQL target's checked settings.
#[derive(Clone)]
pub struct PostgresSettings {
    /// The connection URL (`postgres://user:password@host:port/db`).
    pub url: String,
    /// The table, as `name` or `schema.name` (each part an identifier).
    pub table: String,
    /// The delivery's name in `tally_delivery_positions` (default: the
    /// job's name and the output, set by the caller).
    pub delivery: Option<String>,
    /// Records per transaction.
    pub batch_size: usize,
    /// The certificates (PEM) that sign the server's, for `sslmode=require`
    /// (default: the system's roots).
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for PostgresSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password.
        f.debug_struct("PostgresSettings")
            .field("table", &self.table)
            .field("delivery", &self.delivery)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

/// The HTTP target's checked settings.
#[derive(Clone)]
pub struct HttpSettings {
    /// Where each record is `POST`ed.
    pub url: String,
    /// The header that carries the record's idempotency key.
    pub idempotency_header: String,
    /// Longest each step of a request may take: sending it, waiting for
    /// the answer, reading the answer.
    pub timeout: Duration,
    /// Longest a connection may take to open.
    pub connect_timeout: Duration,
    /// Most requests in flight (each to a different key).
    pub max_in_flight: usize,
    /// How long the receiver remembers an idempotency key: a request whose
    /// outcome is unknown is re-sent only within it.
    pub key_retention: Duration,
    /// `GET` by key (`{key}` in it): 200 applied, 404 never applied.
    pub lookup_url: Option<String>,
    /// What a request's body is.
    pub body: Body,
    /// The first retry's backoff ceiling (it doubles per attempt).
    pub retry_initial: Duration,
    /// The largest backoff.
    pub retry_max: Duration,
    /// A secret header (name, value) sent on every request, never logged.
    pub secret: Option<(String, String)>,
}

impl std::fmt::Debug for HttpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSettings")
            .field("url", &self.url)
            .field("idempotency_header", &self.idempotency_header)
            .field("timeout", &self.timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("key_retention", &self.key_retention)
            .field("lookup_url", &self.lookup_url)
            .field("secret", &self.secret.as_ref().map(|(name, _)| (name, "<redacted>")))
            .finish_non_exhaustive()
    }
}

/// A delivery file that cannot be used, and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file cannot be read.
    #[error("cannot read delivery file `{}`: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a delivery file.
    #[error("delivery file `{}` is not valid: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: Box<toml::de::Error>,
    },
    /// A setting has a value that cannot work.
    #[error("delivery setting `{key}` = {value:?} cannot be used: {problem}")]
    Invalid {
        /// The setting.
        key: String,
        /// Its value as written.
        value: String,
        /// What is wrong and what to write instead.
        problem: String,
    },
}

impl DeliverSettings {
    /// Reads delivery file `path`; relative paths in it are taken relative
    /// to the file.
    pub fn from_file(path: &Path) -> Result<DeliverSettings, SettingsError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| SettingsError::Read { path: path.to_path_buf(), source })?;
        let file: DeliverFile = toml::from_str(&text).map_err(|source| SettingsError::Parse {
            path: path.to_path_buf(),
            source: Box::new(source),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        DeliverSettings::from_table(file, base)
    }

    fn from_table(file: DeliverFile, base: &Path) -> Result<DeliverSettings, SettingsError> {
        let resolve = |path: PathBuf| if path.is_relative() { base.join(path) } else { path };
        let target = match (file.http, file.postgres) {
            (Some(http), None) => Target::Http(HttpSettings::from_table(http)?),
            (None, Some(mut postgres)) => {
                postgres.ca_file = postgres.ca_file.map(resolve);
                Target::Postgres(PostgresSettings::from_table(postgres)?)
            }
            (None, None) => {
                return Err(invalid(
                    "http",
                    "",
                    "give an [http] table with at least `url`, or a [postgres] table with `url` and `table` (see docs/delivery.md)",
                ));
            }
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "postgres",
                    "",
                    "give an [http] or a [postgres] table, not both",
                ));
            }
        };
        let state_dir = resolve(file.state_dir);
        let dead_letters = match file.dead_letters {
            Some(path) => resolve(path),
            None => state_dir.join("dead-letters.ndjson"),
        };
        if let Some(topic) = &file.ledger_topic {
            let legal = |b: u8| b.is_ascii_alphanumeric() || b"._-".contains(&b);
            if topic.is_empty() || topic.len() > 249 || !topic.bytes().all(legal) {
                return Err(invalid(
                    "ledger_topic",
                    topic,
                    "give a Kafka topic name: 1 to 249 letters, digits, '.', '_' or '-'",
                ));
            }
        }
        Ok(DeliverSettings {
            job: resolve(file.job),
            output: file.output,
            state_dir,
            dead_letters,
            ledger_topic: file.ledger_topic,
            ledger_retention: duration("ledger_retention", file.ledger_retention, "24h")?,
            target,
        })
    }
}

impl PostgresSettings {
    /// A served job's PostgreSQL target: the operator's database (`url`,
    /// `ca_file`), the tenant's `table` and `batch_size`.
    pub fn for_tenant(
        url: &str,
        table: &str,
        batch_size: Option<usize>,
        ca_file: Option<PathBuf>,
    ) -> Result<PostgresSettings, SettingsError> {
        PostgresSettings::from_table(PostgresTable {
            url: url.to_string(),
            table: table.to_string(),
            delivery: None,
            batch_size,
            ca_file,
        })
    }

    fn from_table(table: PostgresTable) -> Result<PostgresSettings, SettingsError> {
        if !(table.url.starts_with("postgres://") || table.url.starts_with("postgresql://")) {
            return Err(invalid(
                "postgres.url",
                "<url>",
                "give a postgres://user:password@host:port/database URL",
            ));
        }
        let identifier = |part: &str| {
            let mut bytes = part.bytes();
            part.len() <= 63
                && bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        };
        let parts: Vec<&str> = table.table.split('.').collect();
        if parts.len() > 2 || !parts.iter().all(|part| identifier(part)) {
            return Err(invalid(
                "postgres.table",
                &table.table,
                "give a table name (letters, digits and _, at most 63, not starting with a digit), optionally as schema.table",
            ));
        }
        let batch_size = table.batch_size.unwrap_or(500);
        if !(1..=MAX_BATCH_SIZE).contains(&batch_size) {
            return Err(invalid(
                "postgres.batch_size",
                &batch_size.to_string(),
                &format!("give 1 to {MAX_BATCH_SIZE}"),
            ));
        }
        if table.delivery.as_ref().is_some_and(|name| name.is_empty() || name.len() > 200) {
            return Err(invalid("postgres.delivery", "", "give a name of 1 to 200 bytes"));
        }
        Ok(PostgresSettings {
            url: table.url,
            table: table.table,
            delivery: table.delivery,
            batch_size,
            ca_file: table.ca_file,
        })
    }
}

impl HttpSettings {
    /// A served job's HTTP target: the tenant's settings, with the secret
    /// header the operator configured for the tenant (if any).
    pub fn for_tenant(
        table: TenantHttpTable,
        secret: Option<(String, String)>,
    ) -> Result<HttpSettings, SettingsError> {
        let settings = HttpSettings::from_table(HttpTable {
            url: table.url,
            idempotency_header: table.idempotency_header,
            timeout: table.timeout,
            connect_timeout: table.connect_timeout,
            max_in_flight: table.max_in_flight,
            key_retention: table.key_retention,
            lookup_url: table.lookup_url,
            body: table.body,
            retry_initial: table.retry_initial,
            retry_max: table.retry_max,
            secret_header: None,
            secret_file: None,
            secret_env: None,
        })?;
        Ok(HttpSettings { secret, ..settings })
    }

    fn from_table(table: HttpTable) -> Result<HttpSettings, SettingsError> {
        check_url("http.url", &table.url)?;
        if let Some(lookup) = &table.lookup_url {
            check_url("http.lookup_url", lookup)?;
            if !lookup.contains("{key}") {
                return Err(invalid(
                    "http.lookup_url",
                    lookup,
                    "it must name the record's key as {key}, e.g. \"https://billing.example/usage/{key}\"",
                ));
            }
        }
        let max_in_flight = table.max_in_flight.unwrap_or(16);
        if !(1..=MAX_IN_FLIGHT_LIMIT).contains(&max_in_flight) {
            return Err(invalid(
                "http.max_in_flight",
                &max_in_flight.to_string(),
                &format!("give 1 to {MAX_IN_FLIGHT_LIMIT}"),
            ));
        }
        let header = |key: &str, value: Option<String>, default: &str| {
            let name = value.unwrap_or_else(|| default.to_string());
            if is_header_name(&name) {
                Ok(name)
            } else {
                Err(invalid(key, &name, "give an HTTP header name, such as \"Idempotency-Key\""))
            }
        };
        let idempotency_header =
            header("http.idempotency_header", table.idempotency_header, "Idempotency-Key")?;
        let secret = match (table.secret_header, table.secret_file, table.secret_env) {
            (None, None, None) => None,
            (name, Some(file), None) => Some(secret_from_file("http", name, &file)?),
            (name, None, Some(variable)) => {
                let name = header("http.secret_header", name, "Authorization")?;
                let value = std::env::var(&variable).map_err(|_| {
                    invalid(
                        "http.secret_env",
                        &variable,
                        "that environment variable is not set (or not UTF-8)",
                    )
                })?;
                Some((name, secret_value("http.secret_env", value)?))
            }
            (Some(name), None, None) => {
                return Err(invalid(
                    "http.secret_header",
                    &name,
                    "say where its value comes from: http.secret_file or http.secret_env",
                ));
            }
            (_, Some(_), Some(variable)) => {
                return Err(invalid(
                    "http.secret_env",
                    &variable,
                    "give http.secret_file or http.secret_env, not both",
                ));
            }
        };
        let retry_initial = duration("http.retry_initial", table.retry_initial, "200ms")?;
        let retry_max = duration("http.retry_max", table.retry_max, "30s")?;
        if retry_max < retry_initial {
            return Err(invalid(
                "http.retry_max",
                &format!("{retry_max:?}"),
                "it must be at least http.retry_initial",
            ));
        }
        Ok(HttpSettings {
            url: table.url,
            idempotency_header,
            timeout: duration("http.timeout", table.timeout, "10s")?,
            connect_timeout: duration("http.connect_timeout", table.connect_timeout, "5s")?,
            max_in_flight,
            key_retention: duration("http.key_retention", table.key_retention, "24h")?,
            lookup_url: table.lookup_url,
            body: table.body.unwrap_or(Body::Value),
            retry_initial,
            retry_max,
            secret,
        })
    }
}

fn invalid(key: &str, value: &str, problem: &str) -> SettingsError {
    SettingsError::Invalid { key: key.into(), value: value.into(), problem: problem.into() }
}

/// A URL the client can use: http or https, with a host.
fn check_url(key: &str, url: &str) -> Result<(), SettingsError> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(()),
        _ => Err(invalid(key, url, "give an http:// or https:// URL with a host")),
    }
}

/// A secret header (`name`, default `Authorization`) whose value is the
/// one line of `file`; `section` names the settings' table in errors.
pub fn secret_from_file(
    section: &str,
    name: Option<String>,
    file: &Path,
) -> Result<(String, String), SettingsError> {
    let key = format!("{section}.secret_header");
    let name = name.unwrap_or_else(|| "Authorization".to_string());
    if !is_header_name(&name) {
        return Err(invalid(&key, &name, "give an HTTP header name, such as \"Authorization\""));
    }
    let key = format!("{section}.secret_file");
    let value = std::fs::read_to_string(file).map_err(|err| {
        invalid(
            &key,
            &file.display().to_string(),
            &format!("it cannot be read ({err}); give a readable file holding the header's value"),
        )
    })?;
    Ok((name, secret_value(&key, value)?))
}

/// An HTTP header name (RFC 9110's token).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A secret header's value: one line, without its line end.
fn secret_value(key: &str, value: String) -> Result<String, SettingsError> {
    let value = value.trim_end_matches(['\r', '\n']).to_string();
    if value.is_empty() || value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
        // The value itself is never echoed.
        return Err(invalid(
            key,
            "<secret>",
            "the value must be one non-empty line without control characters",
        ));
    }
    Ok(value)
}

/// Parses `key`'s duration (`10s`, `250ms`, `24h`, `35d`; a day is 24
/// hours), or `default`; it must be positive.
fn duration(key: &str, value: Option<String>, default: &str) -> Result<Duration, SettingsError> {
    let text = value.unwrap_or_else(|| default.to_string());
    let span: Span = text.parse().map_err(|_| {
        invalid(key, &text, "write a duration such as \"10s\", \"250ms\", \"24h\" or \"35d\"")
    })?;
    let length = span.to_duration(SpanRelativeTo::days_are_24_hours()).map_err(|_| {
        invalid(key, &text, "months and years have no fixed length; give days instead (\"35d\")")
    })?;
    if length <= SignedDuration::ZERO {
        return Err(invalid(key, &text, "it must be longer than zero"));
    }
    Duration::try_from(length).map_err(|_| invalid(key, &text, "it is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> Result<DeliverSettings, SettingsError> {
        let file: DeliverFile = toml::from_str(text).unwrap();
        DeliverSettings::from_table(file, Path::new("/deliveries"))
    }

    const MINIMAL: &str = "job = \"billing.toml\"\noutput = \"periods\"\nstate_dir = \"state\"\n[http]\nurl = \"https://billing.example/usage\"\n";

    #[test]
    fn a_minimal_file_gets_the_documented_defaults() {
        let settings = settings(MINIMAL).unwrap();
        assert_eq!(settings.job, Path::new("/deliveries/billing.toml"));
        assert_eq!(settings.dead_letters, Path::new("/deliveries/state/dead-letters.ndjson"));
        let Target::Http(http) = settings.target else { panic!("an http target") };
        assert_eq!(http.idempotency_header, "Idempotency-Key");
        assert_eq!(http.timeout, Duration::from_secs(10));
        assert_eq!(http.connect_timeout, Duration::from_secs(5));
        assert_eq!(http.max_in_flight, 16);
        assert_eq!(http.key_retention, Duration::from_secs(24 * 3600));
        assert_eq!(http.retry_initial, Duration::from_millis(200));
        assert_eq!(http.retry_max, Duration::from_secs(30));
        assert_eq!(http.body, Body::Value);
        assert!(http.lookup_url.is_none() && http.secret.is_none());
    }

    #[test]
    fn bad_settings_name_the_setting_and_the_fix() {
        let cases = [
            ("max_in_flight = 0", "http.max_in_flight", "1 to 256"),
            ("timeout = \"soon\"", "http.timeout", "duration such as"),
            ("key_retention = \"1 month\"", "http.key_retention", "give days instead"),
            ("lookup_url = \"https://billing.example/usage\"", "http.lookup_url", "{key}"),
            ("idempotency_header = \"Bad Header\"", "http.idempotency_header", "header name"),
            (
                "secret_header = \"Authorization\"",
                "http.secret_header",
                "secret_file or http.secret_env",
            ),
            ("retry_initial = \"1m\"", "http.retry_max", "at least http.retry_initial"),
        ];
        for (line, key, fix) in cases {
            let err = settings(&format!("{MINIMAL}{line}\n")).unwrap_err().to_string();
            assert!(err.contains(key) && err.contains(fix), "{line}: {err}");
        }
        let no_url =
            settings(&MINIMAL.replace("https://billing.example/usage", "ftp://x")).unwrap_err();
        assert!(no_url.to_string().contains("http:// or https://"), "{no_url}");
        let no_http = settings("job = \"j\"\noutput = \"o\"\nstate_dir = \"s\"\n").unwrap_err();
        assert!(no_http.to_string().contains("[http] table"), "{no_http}");
        let both = format!("{MINIMAL}[postgres]\nurl = \"postgres://u@h/d\"\ntable = \"t\"\n");
        assert!(settings(&both).unwrap_err().to_string().contains("not both"));
    }

    #[test]
    fn a_postgres_table_name_is_an_identifier_or_refused() {
        let file = |table: &str| {
            format!(
                "job = \"j\"\noutput = \"o\"\nstate_dir = \"s\"\n[postgres]\nurl = \"postgres://tally:pw@127.0.0.1/tally\"\ntable = {table:?}\n"
            )
        };
        for good in ["billing_periods", "billing.periods", "_t1"] {
            let Target::Postgres(postgres) = settings(&file(good)).unwrap().target else {
                panic!()
            };
            assert_eq!((postgres.table.as_str(), postgres.batch_size), (good, 500));
            assert!(!format!("{postgres:?}").contains("pw"));
        }
        for bad in ["", "1st", "a.b.c", "x; DROP TABLE y", "\"quoted\"", "a-b"] {
            let err = settings(&file(bad)).unwrap_err().to_string();
            assert!(err.contains("postgres.table") && err.contains("schema.table"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_secret_comes_from_the_environment_and_is_never_shown() {
        // SAFETY: this test's variable is its own; nothing else reads it.
        unsafe { std::env::set_var("TALLY_DELIVER_TEST_SECRET", "Bearer s3cr3t\n") };
        let settings =
            settings(&format!("{MINIMAL}secret_env = \"TALLY_DELIVER_TEST_SECRET\"\n")).unwrap();
        let Target::Http(http) = settings.target else { panic!("an http target") };
        let secret = http.secret.clone().unwrap();
        assert_eq!(secret, ("Authorization".to_string(), "Bearer s3cr3t".to_string()));
        assert!(!format!("{http:?}").contains("s3cr3t"));
    }
}
