//! The sandbox limits of a plugin instance and how a job emits outputs:
//! the vocabulary every driver and the plugin runtime share.

use std::time::Duration;

use serde::Deserialize;

/// How often the engine's epoch advances: CPU budgets are checked, and
/// counted, in these ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Linear memory a plugin instance may grow to.
pub const DEFAULT_MEMORY_BYTES: u64 = 64 << 20;
/// CPU budget of one plugin call (one batch), in milliseconds of the
/// calling thread's CPU time. A batch of 1024 billing events takes about 2 ms.
pub const DEFAULT_CPU_BUDGET_MS: u64 = 1_000;
/// Largest state key or output record key a plugin may write.
pub const DEFAULT_MAX_KEY_BYTES: u32 = 4 << 10;
/// Largest state value or output record value a plugin may write.
pub const DEFAULT_MAX_VALUE_BYTES: u32 = 1 << 20;
/// Most output bytes (keys and values) a plugin may emit per batch.
pub const DEFAULT_MAX_OUTPUT_BYTES_PER_BATCH: u64 = 64 << 20;
/// Most state bytes (keys and values) a plugin may write per batch.
pub const DEFAULT_MAX_STATE_BYTES_PER_BATCH: u64 = 64 << 20;
/// Events in a row the plugin may fail on (trap or break a limit) before
/// the job stops.
pub const DEFAULT_MAX_FAILURES_IN_A_ROW: u64 = 100;
/// Largest input record (a line of a local input, a Kafka record's value)
/// handed to a plugin; larger ones are dead-lettered unread.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 1 << 20;
/// Most bytes of records one batch holds (besides `batch_size` records):
/// a batch is handed to the plugin at once when it has this many.
pub const MAX_BATCH_BYTES: u64 = 64 << 20;

/// Which of the plugin's records for an output a commit writes.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Emit {
    /// Every record the plugin emits.
    #[default]
    EveryUpdate,
    /// Of the records a transaction emits with the same key, only the last
    /// (records without a key are all written): a running total's
    /// latest value per commit, as Kafka Streams' record cache forwards it.
    /// Each record written is one the plugin emitted, with its own lineage
    /// and idempotency key; which intermediate ones are skipped depends on
    /// where commits fall.
    LatestPerKey,
}

/// What one plugin instance may use. There is no "unlimited".
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Linear memory, in bytes.
    pub memory_bytes: u64,
    /// CPU budget of one plugin call (one batch), in milliseconds of thread
    /// CPU time; checked every [`EPOCH_TICK`], so a call may
    /// run up to one tick past it.
    pub cpu_budget_ms: u64,
    /// Largest state key or output record key, in bytes.
    pub max_key_bytes: u32,
    /// Largest state value or output value, in bytes (in Kafka mode at most
    /// 900,000, so a record with its key and headers fits librdkafka's
    /// default `message.max.bytes`).
    pub max_value_bytes: u32,
    /// Most output bytes per batch: keys and values, and 128 bytes per
    /// record for what holding it costs.
    pub max_output_bytes_per_batch: u64,
    /// Most state bytes written per batch: keys and values written, keys
    /// deleted, and 64 bytes per write or delete.
    pub max_state_bytes_per_batch: u64,
    /// Events in a row the plugin may fail on before the job stops (under
    /// `tally serve`: is paused, with the reason in its status).
    pub max_failures_in_a_row: u64,
    /// Largest input record handed to the plugin, in bytes; a larger one is
    /// dead-lettered with the reason, and not read into memory.
    pub max_record_bytes: u64,
}

impl Limits {
    /// Most bytes of records one batch holds: [`MAX_BATCH_BYTES`], and no
    /// more than the plugin's memory could take.
    pub fn batch_bytes(&self) -> u64 {
        MAX_BATCH_BYTES.min(self.memory_bytes)
    }
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
            max_failures_in_a_row: DEFAULT_MAX_FAILURES_IN_A_ROW,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
        }
    }
}
