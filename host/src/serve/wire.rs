//! The admin API's bodies: what the server sends and the client reads,
//! one set of types for both, so the CLI never reads JSON by string keys.
//! The routes and examples are in `docs/admin-api.md`.

use serde::{Deserialize, Serialize};

pub use super::registry::{PluginVersion, VersionStatus};
pub use tally_core::observe::RestoreSnapshot;

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Opening: recovering state, joining the group.
    Starting,
    /// Processing (or waiting for input).
    Running,
    /// Rebuilding its state from the changelog (Kafka mode) before it
    /// processes anything; `restore` says how far it is.
    Restoring,
    /// Paused by its tenant; everything processed is committed.
    Paused,
    /// Failed; the host retries with backoff (see `last_error`).
    Failed,
    /// Stopped for good (host shutting down, or the job deleted).
    Stopped,
    /// Could not be resumed when the host started (see `last_error`): fix
    /// the cause and restart the host, or delete the job.
    Broken,
}

/// What `status` shows about a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    /// The job's name.
    pub name: String,
    /// `local` or `kafka`.
    pub mode: JobMode,
    /// Where the job is in its life.
    pub state: JobState,
    /// Digest of the plugin version running.
    pub plugin: String,
    /// The output version live (`v1` unless a shadow was promoted): whose
    /// state and outputs the job writes.
    #[serde(default)]
    pub output_version: String,
    /// A pushed version waiting for its trial, or on it, if any.
    pub pending_plugin: Option<String>,
    /// The version running its trial transaction now, if any.
    pub on_trial: Option<String>,
    /// Input records in committed transactions since the host started.
    pub records: u64,
    /// Committed input records per second, over the last few seconds.
    pub throughput: f64,
    /// How far behind the input the job is after its last commit.
    pub lag: Option<u64>,
    /// The unit of `lag`: `records` (Kafka) or `bytes` (local files).
    pub lag_unit: LagUnit,
    /// Transactions committed since the host started.
    pub commits: u64,
    /// Plugin versions rolled back since the host started.
    pub rollbacks: u64,
    /// The last thing that went wrong since the host started, if anything
    /// did (it stays after the job recovers; `state` says how it is now).
    pub last_error: Option<String>,
    /// What the last push led to.
    pub last_swap: Option<String>,
    /// CPU seconds the job's plugin calls used since the host started,
    /// counted as they run.
    pub cpu_seconds: f64,
    /// Plugin calls that trapped or broke a limit since the host started.
    pub traps: u64,
    /// Of them, calls stopped for exceeding their CPU budget.
    pub cpu_budget_breaches: u64,
    /// Plugin log lines dropped by the rate limit.
    pub log_lines_dropped: u64,
    /// The plugin's last failure, and how many seconds ago it was.
    pub last_plugin_failure: Option<String>,
    /// Whether the job is demoted now: its plugin calls mostly fail, so it
    /// runs only a tenth of the time while other tenants' jobs work.
    pub demoted: bool,
    /// While the job restores its state: records done, records to go, the
    /// rate and an estimate of the time left.
    #[serde(default)]
    pub restore: Option<RestoreSnapshot>,
    /// A period job's partitions after its last commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub periods: Option<Vec<PeriodPartition>>,
    /// Its deliveries (`[[deliver]]`), one per delivered output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deliveries: Vec<super::delivery_runner::DeliveryStatus>,
    /// Its shadow, if a candidate plugin runs beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowStatus>,
}

/// Body of a request starting a shadow: a candidate plugin run on the
/// job's input beside the live version, never delivered.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowRequest {
    /// The candidate plugin component, base64-encoded; none: the job's
    /// own plugin, replayed.
    #[serde(default)]
    pub plugin: Option<String>,
    /// A `[plugin_config]` table (TOML) the candidate gets instead of the
    /// job's; none: the job's own.
    #[serde(default)]
    pub plugin_config: Option<String>,
    /// Where it starts, as `tally replay --from` takes it: `earliest` (the
    /// default), or for a Kafka job an RFC 3339 time or offsets.
    #[serde(default)]
    pub from: Option<String>,
}

/// A job's shadow, as the job's status shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShadowStatus {
    /// The version it writes (`v2`): its state and outputs are its own.
    pub version: String,
    /// Digest of the candidate plugin.
    pub plugin: String,
    /// Where it is in its life (`paused` once its plugin kept failing).
    pub state: JobState,
    /// Input records in its committed transactions since the host started.
    pub records: u64,
    /// How far behind the input it is after its last commit.
    pub lag: Option<u64>,
    /// The last thing that went wrong with it, if anything did.
    pub last_error: Option<String>,
    /// CPU seconds its plugin calls used since the host started.
    pub cpu_seconds: f64,
    /// Its plugin calls that trapped or broke a limit.
    pub traps: u64,
    /// Its outputs against the live version's, per output, as of the last
    /// check (every few seconds).
    pub diff: Vec<RunningDiff>,
}

/// One output of the shadow against the live version's: per key, the
/// value that counts (a period's FINAL with its ADJUSTMENTs applied).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningDiff {
    /// The output.
    pub output: String,
    /// When it was checked (seconds since the Unix epoch).
    pub checked_at: u64,
    /// Whether both sides were read to all they had committed then.
    pub caught_up: bool,
    /// Records read of the live version's output.
    pub live_records: u64,
    /// Records read of the shadow's.
    pub shadow_records: u64,
    /// Where each partition's read of the live output ended.
    pub live_positions: std::collections::BTreeMap<u32, u64>,
    /// Where each partition's read of the shadow's output ended.
    pub shadow_positions: std::collections::BTreeMap<u32, u64>,
    /// Keys with the same value in both.
    pub equal: u64,
    /// Keys whose values differ.
    pub changed: u64,
    /// Keys only the live version has (so far).
    pub only_live: u64,
    /// Keys only the shadow has (so far).
    pub only_shadow: u64,
    /// The first changed keys, with both values.
    pub examples: Vec<ChangedKey>,
    /// Why the diff stopped or could not be read, if it did.
    pub error: Option<String>,
}

/// A key whose value the shadow changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangedKey {
    /// The key (JSON).
    pub key: serde_json::Value,
    /// The live version's value.
    pub live: serde_json::Value,
    /// The shadow's.
    pub shadow: serde_json::Value,
    /// `shadow - live`, when both are numbers.
    pub delta: Option<serde_json::Value>,
}

/// What discarding a shadow answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discarded {
    /// The job.
    pub job: String,
    /// The shadow's version, whose state and outputs are gone.
    pub discarded: String,
}

/// What promoting a shadow answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Promoted {
    /// The job.
    pub job: String,
    /// The version live now (the shadow's).
    pub version: String,
    /// The version live before.
    pub from: String,
    /// What each delivery's receiver gets first.
    pub deliveries: Vec<crate::promotion::SwitchSummary>,
}

/// One partition of a period job, as its status shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodPartition {
    /// The input partition.
    pub partition: u32,
    /// Its own watermark (RFC 3339), if it accepted an event.
    pub watermark: Option<String>,
    /// The watermark its periods close by: its own, or the one idleness
    /// closed it through.
    pub effective_watermark: Option<String>,
    /// Whether idleness closed it past its own watermark (a record
    /// arriving ends that).
    pub idle: bool,
    /// Periods not yet final.
    pub open_periods: u64,
    /// Event ids remembered for de-duplication.
    pub seen_ids: u64,
    /// FINAL records emitted.
    pub finals: u64,
    /// ADJUSTMENT records emitted.
    pub adjustments: u64,
    /// Retries refused (`duplicate:`).
    pub duplicates: u64,
    /// Retries with another payload refused (`duplicate_conflict:`).
    pub conflicts: u64,
    /// Events too far in the future refused (`future:`).
    pub future: u64,
    /// Events too old refused (`too_old:`).
    pub too_old: u64,
}

impl From<&tally_core::periods::PartitionStatus> for PeriodPartition {
    fn from(status: &tally_core::periods::PartitionStatus) -> PeriodPartition {
        let counts = &status.counts;
        PeriodPartition {
            partition: status.partition,
            watermark: status.watermark.map(|at| at.to_string()),
            effective_watermark: status.effective_watermark.map(|at| at.to_string()),
            idle: status.effective_watermark > status.watermark,
            open_periods: status.open_periods as u64,
            seen_ids: status.seen_ids as u64,
            finals: counts.finals,
            adjustments: counts.adjustments,
            duplicates: counts.duplicates,
            conflicts: counts.conflicts,
            future: counts.future,
            too_old: counts.too_old,
        }
    }
}

/// How a job reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobMode {
    /// NDJSON files.
    Local,
    /// Kafka topics.
    Kafka,
    /// Not known: the job could not be resumed.
    Unknown,
}

/// The unit of a job's lag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LagUnit {
    /// Records (Kafka: summed consumer lag).
    Records,
    /// Bytes (local files: unread bytes).
    Bytes,
    /// Not known.
    #[serde(rename = "")]
    Unknown,
}

/// One committed state value, as an interactive query returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateValue {
    /// The key asked for.
    pub key: String,
    /// The committed value: JSON when it is JSON, else text.
    pub value: serde_json::Value,
    /// The input partition holding it (Kafka jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
}

/// Body of a deploy request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeployRequest {
    /// The job file (TOML).
    pub job: String,
    /// The plugin component, base64-encoded.
    pub plugin: String,
}

/// Body of a request changing a job's deliveries in place.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesRequest {
    /// The job's new `[[deliver]]` sections (TOML; empty: none).
    pub deliver: String,
}

/// Body of a request settling a delivery's record waiting as `unknown`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveRequest {
    /// The record's idempotency key.
    pub key: String,
    /// `true`: the receiver applied it (it counts as delivered); `false`:
    /// it never did (it is sent again).
    pub applied: bool,
}

/// What a resolve request answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolved {
    /// The record's idempotency key.
    pub key: String,
    /// What happens next.
    pub then: String,
}

/// What a delete answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    /// The job deleted.
    pub deleted: String,
}
