//! A transaction in progress: its state overlay, its buffered outputs and
//! dead letters, and the host side of the plugin's `state`, `output` and
//! `log` calls, with the job's limits enforced on each.
//!
//! Nothing here is durable; the committer makes a transaction durable in one
//! step, or the task drops it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::limits::{Emit, Limits};
use crate::overlay::{Overlay, ReadError};
use crate::periods::PeriodBook;
use crate::state::{StateError, StateStore};

/// Where an input record came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourcePosition {
    /// Partition index within the job.
    pub partition: u32,
    /// Offset (line number in local mode) within the partition.
    pub offset: u64,
}

/// A record for an output, waiting for the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingOutput {
    /// Index of the output among the job's declared outputs.
    pub output: usize,
    /// Record key.
    pub key: Option<Vec<u8>>,
    /// Record value.
    pub value: Vec<u8>,
    /// The input record that caused it.
    pub source: SourcePosition,
    /// Its number among the records caused by the same input record; with
    /// `source` it makes the idempotency key.
    pub sequence: u32,
    /// What the record states, when that, not the input record that
    /// happened to cause it, identifies it (a period's FINAL: its key,
    /// period and version): then it makes the idempotency key, so every
    /// run, replay or restore gives the same fact the same key.
    pub fact: Option<String>,
}

/// A refused or trapping input record, waiting for the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Where the record came from.
    pub source: SourcePosition,
    /// Why it was not applied.
    pub reason: String,
    /// The record as read.
    pub record: Vec<u8>,
}

/// Why a plugin call broke one of the job's limits or rules; the plugin is
/// stopped (a trap) and the message says which rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Violation(pub String);

/// A failing host call: the plugin broke a rule, the job and the plugin
/// disagree, or the host itself failed.
#[derive(Debug, thiserror::Error)]
pub enum HostCallError {
    /// The plugin broke a limit or rule on this event: dead-letter it.
    #[error(transparent)]
    Violation(#[from] Violation),
    /// The job's configuration does not fit the plugin (an undeclared
    /// output): every event would fail, so the job must stop instead of
    /// dead-lettering its whole input.
    #[error("{0}")]
    Misconfigured(String),
    /// The state store failed: not the plugin's fault.
    #[error(transparent)]
    State(#[from] StateError),
}

/// A transaction's uncommitted work, and the host calls that add to it.
pub struct Transaction {
    /// Uncommitted state changes.
    pub overlay: Overlay,
    /// Uncommitted output records, in emission order (read through
    /// [`Transaction::outputs`], let go through [`Transaction::outputs_sent`]).
    outputs: Vec<PendingOutput>,
    /// Uncommitted dead letters.
    dead_letters: Vec<DeadLetter>,
    /// The most recent error the plugin logged in this batch (a panic
    /// message, with the Rust SDK), for the dead-letter reason of a trap.
    pub last_plugin_error: Option<String>,
    /// Digest of the plugin version this transaction runs (one version per
    /// transaction: versions are swapped only between transactions).
    pub plugin_digest: String,
    /// A period job's periods, watermarks and seen event ids, as the
    /// transaction leaves them (`None` for other jobs; see
    /// [`crate::periods`]). Marked stale when the transaction is dropped.
    pub periods: Option<Box<PeriodBook>>,
    store: Arc<dyn StateStore>,
    output_names: Arc<[String]>,
    limits: Limits,
    batch: Vec<SourcePosition>,
    batch_sequences: Vec<u32>,
    batch_outputs_start: usize,
    batch_dead_letters_start: usize,
    /// Of the dead letters since the call began, those a period job's
    /// rules made whatever the plugin.
    batch_rule_dead_letters: u64,
    /// [`Transaction::pending_bytes`] when the current call began.
    batch_pending_start: u64,
    /// What the plugin call running now may use.
    call: CallLimits,
    /// What it used so far.
    used: CallUsage,
    pending_bytes: u64,
    namespace: Vec<u8>,
    /// Per output index; empty: every record of every output.
    emit: Vec<Emit>,
    /// Per output index emitted [`Emit::LatestPerKey`], where each
    /// namespaced key's record sits in `outputs`. Keys come from the plugin:
    /// a randomly seeded hash keeps crafted collisions from costing the
    /// host CPU outside the plugin's budget.
    latest: Vec<HashMap<Vec<u8>, usize, foldhash::fast::RandomState>>,
}

/// What one plugin call may use: CPU, output bytes and state bytes. A
/// batch's first call gets the job's per-batch limits; after it fails, each
/// event retried alone gets a share (see the batch runner, `batch.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct CallLimits {
    /// CPU time the call may use.
    pub cpu: Duration,
    /// Output bytes (keys and values) the call may emit.
    pub output_bytes: u64,
    /// State bytes (keys and values written, keys deleted) the call may write.
    pub state_bytes: u64,
    /// Set when the call retries one event of a failed batch of this many
    /// events: the limits are that event's share of the batch's.
    pub retry_of: Option<usize>,
    /// Set when the call is one event's of a batch of this many, each
    /// with its share of the budget (a period plugin's `add`).
    pub share_of: Option<usize>,
    /// The job's per-batch limits, for messages.
    pub batch: Limits,
}

impl CallLimits {
    /// The limits of a batch's first call: the job's per-batch limits.
    pub fn batch(limits: &Limits) -> CallLimits {
        CallLimits {
            cpu: Duration::from_millis(limits.cpu_budget_ms),
            output_bytes: limits.max_output_bytes_per_batch,
            state_bytes: limits.max_state_bytes_per_batch,
            retry_of: None,
            share_of: None,
            batch: *limits,
        }
    }

    /// The limits of one of `events` calls a batch makes event by event:
    /// an equal share of the batch's CPU budget, at least one tick.
    pub fn share(limits: &Limits, events: usize) -> CallLimits {
        let budget = Duration::from_millis(limits.cpu_budget_ms);
        let cpu = (budget / events.max(1) as u32).max(crate::limits::EPOCH_TICK);
        CallLimits { cpu, share_of: Some(events), ..CallLimits::batch(limits) }
    }

    /// The dead-letter reason of a call stopped on its CPU budget.
    pub fn cpu_exceeded_reason(&self) -> String {
        let batch_ms = self.batch.cpu_budget_ms;
        if let Some(events) = self.share_of {
            return format!(
                "plugin exceeded its CPU budget of {} ms for this event (its share of the batch's limits.cpu_budget_ms = {batch_ms} over {events} events, at least one {} ms tick)",
                self.cpu.as_millis(),
                crate::limits::EPOCH_TICK.as_millis()
            );
        }
        match self.retry_of {
            None => format!(
                "plugin exceeded its CPU budget of {batch_ms} ms per batch (limits.cpu_budget_ms)"
            ),
            Some(events) => format!(
                "plugin exceeded its CPU budget of {} ms for this event, retried alone after its batch failed (its share of the batch's limits.cpu_budget_ms = {batch_ms} over {events} events, at least one {} ms tick)",
                self.cpu.as_millis(),
                crate::limits::EPOCH_TICK.as_millis()
            ),
        }
    }
}

/// What the plugin call running now has used.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CallUsage {
    /// Output bytes emitted.
    pub output_bytes: u64,
    /// State bytes written.
    pub state_bytes: u64,
}

impl Transaction {
    /// An empty transaction over `store`, for a plugin that may emit to `output_names`.
    pub fn new(
        store: Arc<dyn StateStore>,
        output_names: Arc<[String]>,
        limits: Limits,
    ) -> Transaction {
        Transaction {
            overlay: Overlay::default(),
            outputs: Vec::new(),
            dead_letters: Vec::new(),
            last_plugin_error: None,
            plugin_digest: String::new(),
            periods: None,
            store,
            output_names,
            limits,
            batch: Vec::new(),
            batch_sequences: Vec::new(),
            batch_outputs_start: 0,
            batch_dead_letters_start: 0,
            batch_rule_dead_letters: 0,
            batch_pending_start: 0,
            call: CallLimits::batch(&limits),
            used: CallUsage::default(),
            pending_bytes: 0,
            namespace: Vec::new(),
            emit: Vec::new(),
            latest: Vec::new(),
        }
    }

    /// The transaction keeps the records a commit writes: `emit` says how,
    /// per output index.
    pub fn with_emit(mut self, emit: Vec<Emit>) -> Transaction {
        self.emit = emit;
        self
    }

    /// Whether outputs may leave before the commit. When an output is
    /// emitted [`Emit::LatestPerKey`], a later record can still replace one
    /// of its records, so all outputs wait for the commit.
    pub fn sends_outputs_early(&self) -> bool {
        self.emit.iter().all(|emit| *emit == Emit::EveryUpdate)
    }

    /// The job's periods: the transaction keeps them (see [`crate::periods`]).
    pub fn with_periods(mut self, book: PeriodBook) -> Transaction {
        self.periods = Some(Box::new(book));
        self
    }

    /// The store the transaction reads through.
    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.store
    }

    /// Dead letters added since the current call began (events the host
    /// itself refused in it, as a period job's rules do).
    pub fn dead_letters_in_call(&self) -> u64 {
        self.dead_letters.len().saturating_sub(self.batch_dead_letters_start) as u64
    }

    /// The outputs the plugin may emit to, by index.
    pub fn output_names(&self) -> &[String] {
        &self.output_names
    }

    /// The job's limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// What the next plugin call may use.
    pub fn set_call_limits(&mut self, call: CallLimits) {
        self.call = call;
    }

    /// What the current plugin call may use.
    pub fn call_limits(&self) -> &CallLimits {
        &self.call
    }

    /// What the current (or last) plugin call used.
    pub fn call_usage(&self) -> CallUsage {
        self.used
    }

    /// Puts the plugin's state keys under `namespace` from now on: the keys
    /// it reads and writes are stored as `namespace ++ key`. Kafka mode gives
    /// each input partition its own namespace; local mode uses none.
    pub fn set_namespace(&mut self, namespace: &[u8]) {
        self.namespace.clear();
        self.namespace.extend_from_slice(namespace);
    }

    fn namespaced(&self, key: Vec<u8>) -> Vec<u8> {
        if self.namespace.is_empty() {
            return key;
        }
        let mut full = Vec::with_capacity(self.namespace.len() + key.len());
        full.extend_from_slice(&self.namespace);
        full.extend_from_slice(&key);
        full
    }

    /// Starts a plugin call over events from `positions` (one per event, in order).
    pub fn begin_batch(&mut self, positions: impl Iterator<Item = SourcePosition>) {
        self.batch.clear();
        self.batch.extend(positions);
        self.batch_sequences.clear();
        self.batch_sequences.resize(self.batch.len(), 0);
        self.batch_outputs_start = self.outputs.len();
        self.batch_dead_letters_start = self.dead_letters.len();
        self.batch_rule_dead_letters = 0;
        self.batch_pending_start = self.pending_bytes;
        self.last_plugin_error = None;
        self.used = CallUsage::default();
    }

    /// The output records not sent yet, in emission order.
    pub fn outputs(&self) -> &[PendingOutput] {
        &self.outputs
    }

    /// The dead letters not sent yet.
    pub fn dead_letters(&self) -> &[DeadLetter] {
        &self.dead_letters
    }

    /// The outputs and dead letters so far were sent (or written) ahead
    /// of the commit: they leave the transaction, whose commit makes them
    /// count. Their bytes stay in [`Transaction::pending_bytes`]: the open
    /// transaction holds them until it commits. Only where no output is
    /// emitted latest per key ([`Transaction::sends_outputs_early`]), or
    /// at the commit: a later record could no longer replace one sent.
    pub fn outputs_sent(&mut self) {
        self.outputs.clear();
        self.dead_letters.clear();
        self.latest.iter_mut().for_each(HashMap::clear);
        self.batch_outputs_start = 0;
        self.batch_dead_letters_start = 0;
        self.batch_rule_dead_letters = 0;
    }

    /// About how many bytes the transaction holds (outputs, dead letters
    /// and state writes, with what holding each record costs); the task
    /// commits early when it grows too big.
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Drops this call's outputs caused by the events at `indices` (events
    /// the plugin rejected: a rejected event must leave no output).
    pub fn drop_outputs_of(&mut self, indices: &[u32]) {
        if indices.is_empty() {
            return;
        }
        let rejected: std::collections::HashSet<SourcePosition> =
            indices.iter().filter_map(|&index| self.batch.get(index as usize).copied()).collect();
        let start = self.batch_outputs_start;
        let mut kept = start;
        for index in start..self.outputs.len() {
            if !rejected.contains(&self.outputs[index].source) {
                self.outputs.swap(kept, index);
                kept += 1;
            }
        }
        self.outputs.truncate(kept);
    }

    /// The batch succeeded: keep its state changes and outputs.
    pub fn keep_batch(&mut self) {
        self.overlay.keep_batch();
        if !self.sends_outputs_early() {
            self.keep_latest_per_key();
        }
    }

    /// Replaces each earlier record of the same output, key and state
    /// namespace by this batch's last one, in place, for the outputs emitted
    /// [`Emit::LatestPerKey`]; keyless records are all kept. The namespace
    /// counts because each Kafka partition keeps its own state: the same key
    /// from two partitions is two running totals, each with its own latest.
    fn keep_latest_per_key(&mut self) {
        if self.latest.len() < self.output_names.len() {
            self.latest.resize_with(self.output_names.len(), HashMap::default);
        }
        // Compacts the batch's records in place, as `drop_outputs_of` does:
        // kept ones move down to `kept`, folded ones into their key's slot.
        let mut kept = self.batch_outputs_start;
        let mut fold_key = Vec::new();
        for index in self.batch_outputs_start..self.outputs.len() {
            let record = &self.outputs[index];
            let folded = self.emit.get(record.output) == Some(&Emit::LatestPerKey);
            let Some(key) = record.key.as_ref().filter(|_| folded) else {
                self.outputs.swap(kept, index);
                kept += 1;
                continue;
            };
            fold_key.clear();
            fold_key.extend_from_slice(&self.namespace);
            fold_key.extend_from_slice(key);
            let slots = &mut self.latest[record.output];
            match slots.get(&fold_key) {
                Some(&slot) => {
                    // The replaced record lands at `index`, past `kept`: cut below.
                    self.outputs.swap(slot, index);
                    let replaced = &self.outputs[index];
                    self.pending_bytes = self
                        .pending_bytes
                        .saturating_sub(record_bytes(replaced) + HELD_RECORD_BYTES);
                }
                None => {
                    slots.insert(fold_key.clone(), kept);
                    self.outputs.swap(kept, index);
                    kept += 1;
                }
            }
        }
        self.outputs.truncate(kept);
    }

    /// Adds a dead letter; its bytes count towards the transaction's size.
    pub fn push_dead_letter(&mut self, dead: DeadLetter) {
        self.pending_bytes += (dead.record.len() + dead.reason.len()) as u64 + HELD_RECORD_BYTES;
        self.dead_letters.push(dead);
    }

    /// Adds a dead letter a period job's rules made whatever the plugin
    /// (a retry, a late or future event), counted apart for a trial.
    pub fn push_rule_dead_letter(&mut self, dead: DeadLetter) {
        self.push_dead_letter(dead);
        self.batch_rule_dead_letters += 1;
    }

    /// Dead letters of the current call that a period job's rules made.
    pub fn rule_dead_letters_in_call(&self) -> u64 {
        self.batch_rule_dead_letters
    }

    /// The batch failed: forget its state changes and outputs.
    pub fn drop_batch(&mut self) {
        self.overlay.drop_batch();
        self.periods_go_stale();
        self.outputs.truncate(self.batch_outputs_start);
        // What the call added is gone again (dead letters come after).
        self.pending_bytes = self.batch_pending_start;
    }

    /// Position of event `index` of the current batch.
    pub fn position(&self, index: u32) -> Result<SourcePosition, Violation> {
        self.batch.get(index as usize).copied().ok_or_else(|| {
            Violation(format!(
                "plugin referred to event {index}, but the batch has {} events",
                self.batch.len()
            ))
        })
    }

    /// Drops everything uncommitted, a commit in flight included.
    pub fn abort(&mut self) {
        self.overlay.abort();
        self.periods_go_stale();
        self.clear_outputs();
    }

    /// The transaction was committed: its buffers are empty again.
    pub fn committed(&mut self) {
        self.overlay.committed();
        self.clear_outputs();
    }

    /// Phase one of a commit that overlaps the next transaction: returns
    /// the state changes to commit, which reads still see until
    /// [`Transaction::prepared_took_effect`], and the next transaction
    /// starts. Its outputs must have been sent.
    pub fn prepare(&mut self) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        debug_assert!(self.outputs.is_empty() && self.dead_letters.is_empty(), "outputs not sent");
        self.clear_outputs();
        self.overlay.prepare()
    }

    /// The commit prepared with [`Transaction::prepare`] took effect.
    pub fn prepared_took_effect(&mut self) {
        self.overlay.prepared_took_effect();
    }

    /// What the periods hold in memory may include dropped work: they are
    /// read again from the store before their next use.
    fn periods_go_stale(&mut self) {
        if let Some(book) = &mut self.periods {
            book.mark_stale();
        }
    }

    /// Host-owned state writes (`None`: delete), outside the plugin's
    /// namespace and limits: a period job's entries. They go straight into
    /// the transaction (not the batch: they are written between batches
    /// too, at its end), and count towards its size.
    pub fn put_host_state(&mut self, entries: Vec<(Vec<u8>, Option<Vec<u8>>)>) {
        for (key, value) in entries {
            let value_bytes = value.as_ref().map_or(0, Vec::len);
            self.pending_bytes += (key.len() + value_bytes) as u64 + STATE_ENTRY_BYTES;
            self.overlay.put_in_transaction(key, value);
        }
    }

    /// A record the host emits itself (a period's FINAL or ADJUSTMENT) to
    /// output index `output`, caused by the input at `source`, identified
    /// by `fact`.
    pub fn emit_fact(
        &mut self,
        output: usize,
        key: Vec<u8>,
        value: Vec<u8>,
        source: SourcePosition,
        fact: String,
    ) {
        let record =
            PendingOutput { output, key: Some(key), value, source, sequence: 0, fact: Some(fact) };
        self.pending_bytes += record_bytes(&record) + HELD_RECORD_BYTES;
        self.outputs.push(record);
    }

    fn clear_outputs(&mut self) {
        self.outputs.clear();
        self.dead_letters.clear();
        self.latest.iter_mut().for_each(HashMap::clear);
        self.pending_bytes = 0;
    }

    /// Host side of `state.get-many`: the values of `keys`, at most `limit`
    /// bytes in all (what the plugin could hold), or a violation naming it.
    pub fn get_many(
        &mut self,
        keys: &[Vec<u8>],
        limit: u64,
    ) -> Result<Vec<Option<Vec<u8>>>, HostCallError> {
        for key in keys {
            self.check_key(key)?;
        }
        let read = if self.namespace.is_empty() {
            self.overlay.get_many(keys, &*self.store, limit)
        } else {
            let keys: Vec<Vec<u8>> = keys.iter().map(|key| self.namespaced(key.clone())).collect();
            self.overlay.get_many(&keys, &*self.store, limit)
        };
        read.map_err(|err| match err {
            ReadError::State(state) => HostCallError::State(state),
            ReadError::TooLarge { limit } => HostCallError::Violation(Violation(format!(
                "plugin read {} state keys whose values total more than its memory limit of {limit} bytes (limits.memory_bytes) could hold",
                keys.len()
            ))),
        })
    }

    /// Host side of `state.put` and `state.put-many`.
    pub fn put_many(&mut self, entries: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), Violation> {
        for (key, value) in entries {
            self.check_key(&key)?;
            if value.len() > self.limits.max_value_bytes as usize {
                return Err(Violation(format!(
                    "plugin wrote a state value of {} bytes, over the job's limit of {} bytes (limits.max_value_bytes)",
                    value.len(),
                    self.limits.max_value_bytes
                )));
            }
            let bytes = (key.len() + value.len()) as u64 + STATE_ENTRY_BYTES;
            self.count_state_bytes(bytes)?;
            let key = self.namespaced(key);
            self.overlay.put(key, value);
        }
        Ok(())
    }

    /// Host side of `state.delete` and `state.delete-many`: a delete is held
    /// until the commit too, so its key counts as state bytes.
    pub fn delete_many(&mut self, keys: Vec<Vec<u8>>) -> Result<(), Violation> {
        for key in keys {
            self.check_key(&key)?;
            self.count_state_bytes(key.len() as u64 + STATE_ENTRY_BYTES)?;
            let key = self.namespaced(key);
            self.overlay.delete(key);
        }
        Ok(())
    }

    fn count_state_bytes(&mut self, bytes: u64) -> Result<(), Violation> {
        self.used.state_bytes += bytes;
        if self.used.state_bytes > self.call.state_bytes {
            return Err(self.over_bytes_limit(
                "wrote",
                "state",
                self.call.state_bytes,
                self.limits.max_state_bytes_per_batch,
                "max_state_bytes_per_batch",
            ));
        }
        self.pending_bytes += bytes;
        Ok(())
    }

    /// The violation of a call that `did` more `what` bytes than its
    /// `allowed` (the job's `per_batch`, or an event's share of it).
    fn over_bytes_limit(
        &self,
        did: &str,
        what: &str,
        allowed: u64,
        per_batch: u64,
        setting: &str,
    ) -> Violation {
        Violation(match self.call.retry_of {
            None => format!(
                "plugin {did} more than the job's limit of {allowed} {what} bytes in one batch (limits.{setting})"
            ),
            Some(_) => format!(
                "plugin {did} more than the {allowed} {what} bytes this event had left, retried alone after its batch failed, \
                 of the job's limit of {per_batch} per batch (limits.{setting})"
            ),
        })
    }

    fn check_key(&self, key: &[u8]) -> Result<(), Violation> {
        if key.len() > self.limits.max_key_bytes as usize {
            return Err(Violation(format!(
                "plugin used a state key of {} bytes, over the job's limit of {} bytes (limits.max_key_bytes)",
                key.len(),
                self.limits.max_key_bytes
            )));
        }
        Ok(())
    }

    /// Host side of `output.emit` and `output.emit-many`: records for
    /// output `name`, each `(event, key, value)` caused by event `event` of
    /// the batch.
    pub fn emit_many(
        &mut self,
        name: &str,
        records: impl IntoIterator<Item = (u32, Option<Vec<u8>>, Vec<u8>)>,
    ) -> Result<(), HostCallError> {
        let output = self.output_names.iter().position(|declared| declared == name).ok_or_else(|| {
            HostCallError::Misconfigured(format!(
                "plugin emitted to output `{}`, which the job does not declare (declared: {}); add it to the job's outputs",
                crate::text::sanitize(name, 64),
                self.output_names.join(", ")
            ))
        })?;
        for (event, key, value) in records {
            self.emit_one(output, name, event, key, value)?;
        }
        Ok(())
    }

    /// One record for output index `output` (named `name`).
    fn emit_one(
        &mut self,
        output: usize,
        name: &str,
        event: u32,
        key: Option<Vec<u8>>,
        value: Vec<u8>,
    ) -> Result<(), Violation> {
        let source = self.position(event)?;
        if let Some(key) = key.as_ref().filter(|key| key.len() > self.limits.max_key_bytes as usize)
        {
            return Err(Violation(format!(
                "plugin emitted a key of {} bytes to `{name}`, over the job's limit of {} bytes (limits.max_key_bytes)",
                key.len(),
                self.limits.max_key_bytes
            )));
        }
        if value.len() > self.limits.max_value_bytes as usize {
            return Err(Violation(format!(
                "plugin emitted a value of {} bytes to `{name}`, over the job's limit of {} bytes (limits.max_value_bytes)",
                value.len(),
                self.limits.max_value_bytes
            )));
        }
        let sequence = &mut self.batch_sequences[event as usize];
        let record = PendingOutput { output, key, value, source, sequence: *sequence, fact: None };
        // A record costs what holding it costs too: a flood of empty
        // records is bounded like one of big ones.
        let bytes = record_bytes(&record) + HELD_RECORD_BYTES;
        self.used.output_bytes += bytes;
        if self.used.output_bytes > self.call.output_bytes {
            return Err(self.over_bytes_limit(
                "emitted",
                "output",
                self.call.output_bytes,
                self.limits.max_output_bytes_per_batch,
                "max_output_bytes_per_batch",
            ));
        }
        self.pending_bytes += bytes;
        self.outputs.push(record);
        *sequence += 1;
        Ok(())
    }
}

/// What holding a state write or delete costs beyond its bytes, counted
/// in the state budget.
pub const STATE_ENTRY_BYTES: u64 = 64;

/// What holding a record costs beyond its bytes (its struct and
/// allocations), counted in [`Transaction::pending_bytes`] so that many tiny
/// records held until the commit still bound the transaction's memory.
pub const HELD_RECORD_BYTES: u64 = 128;

/// Bytes an output record counts for: its key and value.
fn record_bytes(record: &PendingOutput) -> u64 {
    (record.value.len() + record.key.as_ref().map_or(0, Vec::len)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::MemoryStore;

    fn transaction(limits: Limits) -> Transaction {
        Transaction::new(
            Arc::new(MemoryStore::default()),
            vec!["totals".to_string()].into(),
            limits,
        )
    }

    fn positions(n: u64) -> impl Iterator<Item = SourcePosition> {
        (0..n).map(|offset| SourcePosition { partition: 0, offset })
    }

    #[test]
    fn host_entries_written_between_batches_are_in_the_commit() {
        // A period job's ADJUSTMENTs change its entries after the last
        // batch: they must commit with the transaction, not wait for a
        // next batch that a crash may never run.
        let mut txn = transaction(Limits::default());
        txn.begin_batch(positions(1));
        txn.put_host_state(vec![(b"p/in-batch".to_vec(), Some(b"1".to_vec()))]);
        txn.keep_batch();
        txn.put_host_state(vec![
            (b"p/after".to_vec(), Some(b"2".to_vec())),
            (b"p/gone".to_vec(), None),
        ]);
        let mut changes = txn.overlay.changes();
        changes.sort();
        assert_eq!(
            changes,
            [
                (b"p/after".to_vec(), Some(b"2".to_vec())),
                (b"p/gone".to_vec(), None),
                (b"p/in-batch".to_vec(), Some(b"1".to_vec())),
            ]
        );
        txn.abort();
        assert!(txn.overlay.changes().is_empty(), "an abort takes them back");
    }

    #[test]
    fn outputs_carry_their_source_and_a_sequence_per_event() {
        let mut txn = transaction(Limits::default());
        txn.begin_batch(positions(2));
        txn.emit_many("totals", [(1, None, b"a".to_vec())]).unwrap();
        txn.emit_many("totals", [(1, None, b"b".to_vec())]).unwrap();
        txn.emit_many("totals", [(0, None, b"c".to_vec())]).unwrap();
        let got: Vec<(u64, u32)> =
            txn.outputs.iter().map(|o| (o.source.offset, o.sequence)).collect();
        assert_eq!(got, vec![(1, 0), (1, 1), (0, 0)]);
    }

    #[test]
    fn namespaces_keep_partitions_apart() {
        let mut txn = transaction(Limits::default());
        txn.begin_batch(positions(1));
        txn.set_namespace(b"p0/");
        txn.put_many(vec![(b"k".to_vec(), b"zero".to_vec())]).unwrap();
        txn.set_namespace(b"p1/");
        assert_eq!(txn.get_many(&[b"k".to_vec()], u64::MAX).unwrap(), vec![None]);
        txn.put_many(vec![(b"k".to_vec(), b"one".to_vec())]).unwrap();
        txn.keep_batch();
        let mut changes = txn.overlay.changes();
        changes.sort();
        assert_eq!(
            changes,
            vec![
                (b"p0/k".to_vec(), Some(b"zero".to_vec())),
                (b"p1/k".to_vec(), Some(b"one".to_vec()))
            ]
        );
    }

    #[test]
    fn a_dropped_batch_takes_its_outputs_with_it() {
        let mut txn = transaction(Limits::default());
        txn.begin_batch(positions(1));
        txn.emit_many("totals", [(0, None, b"kept".to_vec())]).unwrap();
        txn.keep_batch();
        txn.begin_batch(positions(1));
        txn.emit_many("totals", [(0, None, b"dropped".to_vec())]).unwrap();
        txn.put_many(vec![(b"k".to_vec(), b"v".to_vec())]).unwrap();
        txn.drop_batch();
        assert_eq!(txn.outputs.len(), 1);
        assert_eq!(txn.outputs[0].value, b"kept");
        assert!(txn.overlay.is_empty());
    }

    /// An output record as the tests compare it: key, value, source offset.
    type Emitted<'t> = (Option<&'t [u8]>, &'t [u8], u64);

    fn emitted(txn: &Transaction) -> Vec<Emitted<'_>> {
        txn.outputs
            .iter()
            .map(|o| (o.key.as_deref(), o.value.as_slice(), o.source.offset))
            .collect()
    }

    #[test]
    fn latest_per_key_keeps_each_keys_last_record_where_its_first_stood() {
        let mut txn = transaction(Limits::default()).with_emit(vec![Emit::LatestPerKey]);
        assert!(!txn.sends_outputs_early());
        txn.begin_batch(positions(3));
        let key = |k: &[u8]| Some(k.to_vec());
        txn.emit_many(
            "totals",
            [
                (0, key(b"a"), b"1".to_vec()),
                (1, key(b"b"), b"2".to_vec()),
                (2, key(b"a"), b"3".to_vec()),
            ],
        )
        .unwrap();
        txn.keep_batch();
        txn.begin_batch(positions(2));
        txn.emit_many("totals", [(0, None, b"keyless".to_vec()), (1, key(b"b"), b"4".to_vec())])
            .unwrap();
        txn.keep_batch();
        assert_eq!(
            emitted(&txn),
            vec![
                (Some(&b"a"[..]), &b"3"[..], 2),
                (Some(&b"b"[..]), &b"4"[..], 1),
                (None, &b"keyless"[..], 0)
            ]
        );
        assert_eq!(
            txn.pending_bytes(),
            2 + 2 + 7 + 3 * HELD_RECORD_BYTES,
            "replaced records no longer count"
        );

        // A dropped batch, or a rejected event, replaces nothing.
        txn.begin_batch(positions(1));
        txn.emit_many("totals", [(0, key(b"a"), b"dropped".to_vec())]).unwrap();
        txn.drop_batch();
        txn.begin_batch(positions(2));
        txn.emit_many(
            "totals",
            [(0, key(b"b"), b"rejected".to_vec()), (1, key(b"c"), b"5".to_vec())],
        )
        .unwrap();
        txn.drop_outputs_of(&[0]);
        txn.keep_batch();
        let values: Vec<&[u8]> = txn.outputs.iter().map(|o| o.value.as_slice()).collect();
        assert_eq!(values, vec![&b"3"[..], b"4", b"keyless", b"5"]);

        // After the commit, keys start over.
        txn.committed();
        txn.begin_batch(positions(1));
        txn.emit_many("totals", [(0, key(b"a"), b"6".to_vec())]).unwrap();
        txn.keep_batch();
        assert_eq!(emitted(&txn), vec![(Some(&b"a"[..]), &b"6"[..], 0)]);
    }

    #[test]
    fn latest_per_key_folds_within_a_state_namespace_only() {
        let mut txn = transaction(Limits::default()).with_emit(vec![Emit::LatestPerKey]);
        for (namespace, value) in [(b"p0/", b"1"), (b"p1/", b"2"), (b"p0/", b"3")] {
            txn.set_namespace(namespace);
            txn.begin_batch(positions(1));
            txn.emit_many("totals", [(0, Some(b"k".to_vec()), value.to_vec())]).unwrap();
            txn.keep_batch();
        }
        let values: Vec<&[u8]> = txn.outputs.iter().map(|o| o.value.as_slice()).collect();
        assert_eq!(
            values,
            vec![&b"3"[..], b"2"],
            "each partition's running total keeps its latest"
        );
    }

    #[test]
    fn only_outputs_emitted_latest_per_key_are_folded() {
        let names: Arc<[String]> = vec!["totals".to_string(), "alerts".to_string()].into();
        let two = |emit| {
            Transaction::new(Arc::new(MemoryStore::default()), names.clone(), Limits::default())
                .with_emit(emit)
        };
        let same_key_twice = |txn: &mut Transaction| {
            txn.begin_batch(positions(2));
            for output in ["totals", "alerts"] {
                txn.emit_many(
                    output,
                    [
                        (0, Some(b"a".to_vec()), b"1".to_vec()),
                        (1, Some(b"a".to_vec()), b"2".to_vec()),
                    ],
                )
                .unwrap();
            }
            txn.keep_batch();
            txn.outputs.iter().map(|o| (o.output, o.source.offset)).collect::<Vec<_>>()
        };
        let mut every = two(vec![Emit::EveryUpdate, Emit::EveryUpdate]);
        assert!(every.sends_outputs_early());
        assert_eq!(same_key_twice(&mut every), vec![(0, 0), (0, 1), (1, 0), (1, 1)]);
        let mut mixed = two(vec![Emit::LatestPerKey, Emit::EveryUpdate]);
        assert!(
            !mixed.sends_outputs_early(),
            "nothing leaves early while any output may still be replaced"
        );
        assert_eq!(same_key_twice(&mut mixed), vec![(0, 1), (1, 0), (1, 1)]);
    }

    #[test]
    fn rule_breaking_calls_are_refused_with_the_rule_named() {
        // Two records of 8 bytes cost 2 * (8 + 128): one byte too many.
        let limits = Limits {
            max_key_bytes: 4,
            max_value_bytes: 8,
            max_output_bytes_per_batch: 2 * (8 + HELD_RECORD_BYTES) - 1,
            ..Limits::default()
        };
        let mut txn = transaction(limits);
        txn.begin_batch(positions(1));
        let unknown = txn.emit_many("audit", [(0, None, b"x".to_vec())]).unwrap_err();
        assert!(
            matches!(unknown, HostCallError::Misconfigured(_)),
            "an undeclared output stops the job: {unknown}"
        );
        assert!(
            unknown
                .to_string()
                .contains("output `audit`, which the job does not declare (declared: totals)"),
            "{unknown}"
        );
        let missing_event =
            txn.emit_many("totals", [(3, None, b"x".to_vec())]).unwrap_err().to_string();
        assert!(missing_event.contains("event 3, but the batch has 1 events"), "{missing_event}");
        assert!(
            txn.put_many(vec![(b"long-key".to_vec(), b"v".to_vec())])
                .unwrap_err()
                .0
                .contains("max_key_bytes")
        );
        assert!(
            txn.put_many(vec![(b"k".to_vec(), vec![0; 9])])
                .unwrap_err()
                .0
                .contains("max_value_bytes")
        );
        assert!(
            txn.emit_many("totals", [(0, Some(b"long-key".to_vec()), b"v".to_vec())])
                .unwrap_err()
                .to_string()
                .contains("max_key_bytes")
        );
        txn.emit_many("totals", [(0, None, vec![0; 8])]).unwrap();
        assert!(
            txn.emit_many("totals", [(0, None, vec![0; 8])])
                .unwrap_err()
                .to_string()
                .contains("max_output_bytes_per_batch")
        );
    }
}
