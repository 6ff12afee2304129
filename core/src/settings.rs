//! What every job sets, whatever it reads and writes: its name, plugin,
//! outputs, commit interval, batch size, limits, hot-swap policy and emit
//! modes, with their checks. Each driver adds its own section (local files,
//! Kafka topics); the job file that joins them is the host's.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tally_periods::PeriodSettings;

use crate::hot_swap::SwapPolicy;
use crate::limits::{Emit, Limits};

/// Commit interval when the job does not set one.
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_millis(100);
/// Events handed to the plugin per call when the job does not say.
pub const DEFAULT_BATCH_SIZE: usize = 1024;
/// Name of the dead-letter output when the job does not set one.
pub const DEFAULT_DEAD_LETTER_OUTPUT: &str = "dead-letters";
/// Largest batch a job may ask for.
pub const MAX_BATCH_SIZE: usize = 65_536;
/// Most outputs a job may declare.
pub const MAX_OUTPUTS: usize = 64;

/// A job setting out of range or inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("job `{job}`: {message}")]
pub struct InvalidJob {
    /// The job.
    pub job: String,
    /// What is wrong, and the fix.
    pub message: String,
}

/// What every job sets, in every mode.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSettings {
    /// Job name; it prefixes idempotency keys, so keep it stable.
    pub name: String,
    /// Path of the plugin component.
    pub plugin: PathBuf,
    /// Outputs the plugin may emit to.
    pub outputs: Vec<String>,
    /// Where rejected and trapping events go.
    pub dead_letter_output: String,
    /// How often a transaction commits, in milliseconds.
    pub commit_interval_ms: u64,
    /// Most events per plugin call.
    pub batch_size: usize,
    /// Sandbox limits of the plugin.
    pub limits: Limits,
    /// How a new plugin version pushed into the running job is judged.
    pub hot_swap: SwapPolicy,
    /// Which of the plugin's records a commit writes, per output.
    pub emit: BTreeMap<String, Emit>,
    /// The job's billing periods, when it declares `[periods]`: the host
    /// then owns event time and the plugin must be a period plugin.
    pub periods: Option<Arc<PeriodSettings>>,
    /// The job's `[plugin_config]` as JSON, handed to a period plugin
    /// when it starts.
    pub plugin_config: Option<String>,
}

impl JobSettings {
    /// Job `name` running `plugin` into `outputs`, with every other setting
    /// at its default.
    pub fn new(name: &str, plugin: PathBuf, outputs: Vec<String>) -> JobSettings {
        JobSettings {
            name: name.to_string(),
            plugin,
            outputs,
            dead_letter_output: DEFAULT_DEAD_LETTER_OUTPUT.to_string(),
            commit_interval_ms: DEFAULT_COMMIT_INTERVAL.as_millis() as u64,
            batch_size: DEFAULT_BATCH_SIZE,
            limits: Limits::default(),
            hot_swap: SwapPolicy::default(),
            emit: BTreeMap::new(),
            periods: None,
            plugin_config: None,
        }
    }

    /// Index of the output a period job's FINAL and ADJUSTMENT records go
    /// to (`None` for a job without periods, or one naming no output).
    pub fn periods_output(&self) -> Option<usize> {
        let periods = self.periods.as_ref()?;
        self.outputs.iter().position(|output| *output == periods.output)
    }

    /// The book a period job's transaction keeps (`None` without periods).
    pub fn period_book(&self) -> Option<crate::periods::PeriodBook> {
        let output = self.periods_output()?;
        Some(crate::periods::PeriodBook::new(self.periods.clone()?, output))
    }

    /// Refuses a period plugin in a job without `[periods]`, and a process
    /// plugin in one with them, saying which is which.
    pub fn check_plugin_kind(&self, kind: crate::plugin::PluginKind) -> Result<(), InvalidJob> {
        use crate::plugin::PluginKind;
        let message = match (self.periods.is_some(), kind) {
            (true, PluginKind::Process) => format!(
                "it declares [periods], but its plugin is {}: build a period plugin (tally_sdk::export_periods!), or remove [periods]",
                kind.describe()
            ),
            (false, PluginKind::Periods) => format!(
                "its plugin is {}, which needs the host to own event time: declare [periods] in the job file (see docs/periods.md)",
                kind.describe()
            ),
            _ => return Ok(()),
        };
        Err(InvalidJob { job: self.name.clone(), message })
    }

    /// How each output (by index, as in `outputs`) is emitted.
    pub fn emit_per_output(&self) -> Vec<Emit> {
        self.outputs.iter().map(|name| self.emit.get(name).copied().unwrap_or_default()).collect()
    }

    /// The commit interval as a duration.
    pub fn commit_interval(&self) -> Duration {
        Duration::from_millis(self.commit_interval_ms)
    }

    /// Checks ranges and consistency; the message says what to change.
    pub fn validate(&self) -> Result<(), InvalidJob> {
        let invalid = |message: String| Err(InvalidJob { job: self.name.clone(), message });
        if self.name.is_empty()
            || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return invalid(format!(
                "name {:?} must be non-empty and use only letters, digits, `-`, `_`, `.`",
                self.name
            ));
        }
        if self.outputs.is_empty() {
            return invalid(
                "declare at least one output the plugin emits to (outputs = [\"totals\"])".into(),
            );
        }
        if self.outputs.len() > MAX_OUTPUTS {
            return invalid(format!(
                "a job may declare at most {MAX_OUTPUTS} outputs, this one declares {}",
                self.outputs.len()
            ));
        }
        let mut names: Vec<&str> = self.outputs.iter().map(String::as_str).collect();
        names.push(&self.dead_letter_output);
        for name in &names {
            if name.is_empty()
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return invalid(format!(
                    "output name {name:?} must use only letters, digits, `-`, `_`, `.`"
                ));
            }
        }
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
            return invalid(format!(
                "output `{}` is declared twice (the dead-letter output counts too)",
                pair[0]
            ));
        }
        if let Some(name) = self.emit.keys().find(|name| !self.outputs.contains(name)) {
            return invalid(format!(
                "emit names output `{name}`, which the job does not declare (declared: {}); dead letters are always all written",
                self.outputs.join(", ")
            ));
        }
        if self.commit_interval_ms == 0 {
            return invalid("commit_interval_ms must be at least 1".into());
        }
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return invalid(format!(
                "batch_size must be between 1 and {MAX_BATCH_SIZE}, got {}",
                self.batch_size
            ));
        }
        let share = self.hot_swap.max_reject_share;
        if !(0.0..=1.0).contains(&share) {
            return invalid(format!(
                "hot_swap.max_reject_share must be between 0 and 1, got {share}"
            ));
        }
        if self.plugin_config.is_some() && self.periods.is_none() {
            return invalid(
                "[plugin_config] is handed to period plugins, and this job declares no [periods]: remove it, or declare [periods] (see docs/periods.md)".into(),
            );
        }
        if let Some(periods) = &self.periods {
            if self.periods_output().is_none() {
                return invalid(format!(
                    "periods.output is `{}`, which the job does not declare (declared: {}); add it to outputs, or name one in [periods] output = \"...\"",
                    periods.output,
                    self.outputs.join(", ")
                ));
            }
            if self.emit.get(&periods.output).is_some_and(|emit| *emit != Emit::EveryUpdate) {
                return invalid(format!(
                    "output `{}` carries FINAL and ADJUSTMENT records, each of which counts: remove it from emit (every record is written)",
                    periods.output
                ));
            }
        }
        let limits = &self.limits;
        let tick_ms = crate::limits::EPOCH_TICK.as_millis() as u64;
        if limits.memory_bytes < (1 << 20)
            || limits.max_key_bytes == 0
            || limits.max_value_bytes == 0
        {
            return invalid(
                "limits must be positive, and limits.memory_bytes at least 1 MiB (1048576)".into(),
            );
        }
        if limits.cpu_budget_ms < tick_ms {
            return invalid(format!(
                "limits.cpu_budget_ms must be at least {tick_ms} (the budget is checked every {tick_ms} ms)"
            ));
        }
        if limits.max_failures_in_a_row == 0 || limits.max_record_bytes == 0 {
            return invalid(
                "limits.max_failures_in_a_row and limits.max_record_bytes must be at least 1"
                    .into(),
            );
        }
        Ok(())
    }
}
