//! One batch of events through the plugin into the transaction, so that a
//! bad event costs only itself (invariant 5 of `docs/architecture.md`).
//!
//! - A batch's first call gets the job's per-batch limits: CPU
//!   (`limits.cpu_budget_ms`), output and state bytes.
//! - An event the plugin rejects must leave nothing, whatever the plugin
//!   wrote for it: the call's state changes and outputs are dropped, the
//!   rejected events dead-lettered with the plugin's reason, and the rest of
//!   the batch is run again without them.
//! - If a call fails (a trap, a broken limit), its work is dropped and its
//!   events are retried one by one, so only the culprit is dead-lettered.
//!   Each retry has limits of its own: an equal share of the batch's CPU
//!   budget (at least one [`EPOCH_TICK`]), and the output and state bytes
//!   the batch's kept retries have left. A batch thus uses at most about
//!   three times its CPU budget, however many of its events loop.
//! - A plugin that fails on [`Limits::max_failures_in_a_row`] events in a
//!   row (across batches) stops the job: every event failing is a broken
//!   plugin, not bad input.

use std::time::Duration;

use crate::limits::{EPOCH_TICK, Limits};
pub use crate::observe::BatchOutcome;
use crate::plugin::{Event, ProcessError, Processor, Rejection};
use crate::text::{MAX_REASON_BYTES, cut, sanitize};
use crate::transaction::{CallLimits, CallUsage, DeadLetter, SourcePosition, Transaction};

/// Calls of one batch that run the whole (rest of the) batch at once: the
/// first, and one again without the events it rejected. Rejections past
/// that are sorted out event by event.
const WHOLE_BATCH_CALLS: usize = 2;

impl BatchOutcome {
    fn failed(&mut self, reason: &str) {
        self.traps += 1;
        if self.first_failure.is_none() {
            self.first_failure = Some(reason.to_string());
        }
    }
}

/// Runs a job's batches, remembering across them how many events in a row
/// the plugin failed on.
#[derive(Debug, Default)]
pub struct BatchRunner {
    failures_in_a_row: u64,
    last_failure: String,
}

impl BatchRunner {
    /// A runner with no failures yet.
    pub fn new() -> BatchRunner {
        BatchRunner::default()
    }

    /// Runs `events` through `processor` into `txn`: rejected events become
    /// dead letters and leave nothing else; if a call fails, its events are
    /// retried one by one so that only the failing ones are dead-lettered.
    /// Errs when the host fails, the job is stopping, or the plugin failed
    /// on too many events in a row.
    pub fn run(
        &mut self,
        processor: &mut dyn Processor,
        txn: &mut Transaction,
        events: &[Event],
    ) -> Result<BatchOutcome, ProcessError> {
        let before = txn.outputs().len();
        let mut outcome = BatchOutcome::default();
        let mut rest: Vec<Event>;
        let mut remaining = events;
        for _ in 0..WHOLE_BATCH_CALLS {
            txn.set_call_limits(CallLimits::batch(txn.limits()));
            match call(processor, txn, remaining) {
                Ok(rejections) if rejections.is_empty() => {
                    txn.keep_batch();
                    count_kept(&mut outcome, txn, remaining.len());
                    self.succeeded();
                    return Ok(finish(outcome, txn, before));
                }
                Ok(rejections) => {
                    // Whatever the plugin wrote for the rejected events goes:
                    // the rest runs again without them.
                    txn.drop_batch();
                    self.succeeded();
                    rest = reject(txn, remaining, &rejections, &mut outcome);
                    remaining = &rest;
                    if remaining.is_empty() {
                        return Ok(finish(outcome, txn, before));
                    }
                }
                Err(ProcessError::Plugin(reason)) => {
                    txn.drop_batch();
                    outcome.failed(&reason);
                    if remaining.len() == 1 {
                        dead_letter(txn, &remaining[0], &reason);
                        outcome.dead_lettered += 1;
                        self.failed(&reason, txn.limits())?;
                        return Ok(finish(outcome, txn, before));
                    }
                    tracing::warn!(events = remaining.len(), reason = %sanitize(&reason, MAX_REASON_BYTES), "plugin failed on a batch; retrying its events one by one");
                    break;
                }
                Err(other) => {
                    txn.drop_batch();
                    return Err(other);
                }
            }
        }
        self.isolate(processor, txn, remaining, &mut outcome)?;
        Ok(finish(outcome, txn, before))
    }

    /// Runs each event alone, with its share of the batch's limits.
    fn isolate(
        &mut self,
        processor: &mut dyn Processor,
        txn: &mut Transaction,
        events: &[Event],
        outcome: &mut BatchOutcome,
    ) -> Result<(), ProcessError> {
        let limits = *txn.limits();
        let share = (Duration::from_millis(limits.cpu_budget_ms) / events.len().max(1) as u32)
            .max(EPOCH_TICK);
        let mut kept = CallUsage::default();
        for event in events {
            let event = std::slice::from_ref(event);
            txn.set_call_limits(CallLimits {
                cpu: share,
                output_bytes: limits.max_output_bytes_per_batch.saturating_sub(kept.output_bytes),
                state_bytes: limits.max_state_bytes_per_batch.saturating_sub(kept.state_bytes),
                retry_of: Some(events.len()),
                share_of: None,
                batch: limits,
            });
            match call(processor, txn, event) {
                Ok(rejections) if rejections.is_empty() => {
                    txn.keep_batch();
                    let used = txn.call_usage();
                    kept.output_bytes += used.output_bytes;
                    kept.state_bytes += used.state_bytes;
                    count_kept(outcome, txn, 1);
                    self.succeeded();
                }
                Ok(rejections) => {
                    txn.drop_batch();
                    self.succeeded();
                    reject(txn, event, &rejections, outcome);
                }
                Err(ProcessError::Plugin(reason)) => {
                    txn.drop_batch();
                    outcome.failed(&reason);
                    dead_letter(txn, &event[0], &reason);
                    outcome.dead_lettered += 1;
                    self.failed(&reason, &limits)?;
                }
                Err(other) => {
                    txn.drop_batch();
                    return Err(other);
                }
            }
        }
        Ok(())
    }

    /// Like [`BatchRunner::run`], for a plugin version on trial: a failing
    /// call is dropped from the transaction and reported in
    /// [`BatchOutcome::first_failure`], not retried event by event (the
    /// version is about to be rolled back, and the batch redone).
    pub fn run_on_trial(
        &mut self,
        processor: &mut dyn Processor,
        txn: &mut Transaction,
        events: &[Event],
    ) -> Result<BatchOutcome, ProcessError> {
        let before = txn.outputs().len();
        let mut outcome = BatchOutcome::default();
        let mut rest: Vec<Event>;
        let mut remaining = events;
        loop {
            txn.set_call_limits(CallLimits::batch(txn.limits()));
            let failure = match call(processor, txn, remaining) {
                Ok(rejections) if rejections.is_empty() => {
                    txn.keep_batch();
                    count_kept(&mut outcome, txn, remaining.len());
                    return Ok(finish(outcome, txn, before));
                }
                Ok(rejections) => {
                    txn.drop_batch();
                    rest = reject(txn, remaining, &rejections, &mut outcome);
                    remaining = &rest;
                    if remaining.is_empty() {
                        return Ok(finish(outcome, txn, before));
                    }
                    continue;
                }
                Err(ProcessError::Plugin(reason)) => {
                    outcome.traps = 1;
                    reason
                }
                // A version on trial that emits to an undeclared output, or
                // cannot even start again, fails its trial; the previous
                // version goes on.
                Err(ProcessError::Misconfigured(reason)) => reason,
                Err(ProcessError::Instantiate(err)) => err.to_string(),
                Err(other) => {
                    txn.drop_batch();
                    return Err(other);
                }
            };
            txn.drop_batch();
            outcome.first_failure = Some(failure);
            return Ok(finish(outcome, txn, before));
        }
    }

    /// [`BatchRunner::run_on_trial`] when `on_trial`, else [`BatchRunner::run`].
    pub fn run_with(
        &mut self,
        on_trial: bool,
        processor: &mut dyn Processor,
        txn: &mut Transaction,
        events: &[Event],
    ) -> Result<BatchOutcome, ProcessError> {
        if on_trial {
            self.run_on_trial(processor, txn, events)
        } else {
            self.run(processor, txn, events)
        }
    }

    /// The transaction was dropped, to be redone: its failures will be
    /// counted again when they happen again.
    pub fn transaction_dropped(&mut self) {
        self.failures_in_a_row = 0;
    }

    fn succeeded(&mut self) {
        self.failures_in_a_row = 0;
    }

    fn failed(&mut self, reason: &str, limits: &Limits) -> Result<(), ProcessError> {
        self.failures_in_a_row += 1;
        self.last_failure.clear();
        self.last_failure.push_str(reason);
        if self.failures_in_a_row >= limits.max_failures_in_a_row {
            let failures = std::mem::take(&mut self.failures_in_a_row);
            return Err(ProcessError::FailingInARow(format!(
                "its plugin failed on {failures} events in a row (limits.max_failures_in_a_row = {}), the last with: {}",
                limits.max_failures_in_a_row,
                sanitize(&self.last_failure, MAX_REASON_BYTES)
            )));
        }
        Ok(())
    }
}

/// Runs `events` through `processor` into `txn` with a fresh runner (the
/// test driver's path; a job keeps one [`BatchRunner`] across batches).
pub fn process_batch(
    processor: &mut dyn Processor,
    txn: &mut Transaction,
    events: &[Event],
) -> Result<BatchOutcome, ProcessError> {
    BatchRunner::new().run(processor, txn, events)
}

/// Counts `events` of a kept call: applied, but for those the host itself
/// dead-lettered during it (a period job's rules).
fn count_kept(outcome: &mut BatchOutcome, txn: &Transaction, events: usize) {
    let refused = txn.dead_letters_in_call().min(events as u64);
    outcome.applied += events as u64 - refused;
    outcome.dead_lettered += refused;
    outcome.refused_by_rules += txn.rule_dead_letters_in_call().min(refused);
}

fn finish(mut outcome: BatchOutcome, txn: &Transaction, before: usize) -> BatchOutcome {
    outcome.outputs = txn.outputs().len().saturating_sub(before) as u64;
    outcome
}

/// One plugin call over `events`, its work left open in the transaction
/// (the caller keeps or drops it); returns the rejections, sorted and
/// without repeats.
fn call(
    processor: &mut dyn Processor,
    txn: &mut Transaction,
    events: &[Event],
) -> Result<Vec<Rejection>, ProcessError> {
    txn.begin_batch(
        events.iter().map(|e| SourcePosition { partition: e.partition, offset: e.offset }),
    );
    let mut rejections = processor.process(events, txn)?;
    rejections.sort_by_key(|r| r.index);
    rejections.dedup_by_key(|r| r.index);
    if let Some(bad) = rejections.iter().find(|r| r.index as usize >= events.len()) {
        return Err(ProcessError::Plugin(format!(
            "plugin rejected event {}, but the batch has {} events",
            bad.index,
            events.len()
        )));
    }
    Ok(rejections)
}

/// Dead-letters the rejected events; returns the others, in order.
fn reject(
    txn: &mut Transaction,
    events: &[Event],
    rejections: &[Rejection],
    outcome: &mut BatchOutcome,
) -> Vec<Event> {
    for rejection in rejections {
        dead_letter(txn, &events[rejection.index as usize], &rejection.reason);
    }
    outcome.dead_lettered += rejections.len() as u64;
    let mut rejected = rejections.iter().map(|r| r.index as usize).peekable();
    let mut rest = Vec::with_capacity(events.len() - rejections.len());
    for (index, event) in events.iter().enumerate() {
        if rejected.peek() == Some(&index) {
            rejected.next();
        } else {
            rest.push(event.clone());
        }
    }
    rest
}

/// How many of an oversized record's first bytes its dead letter keeps.
pub const OVERSIZED_PREFIX_BYTES: usize = 1024;

/// Dead-letters a record over `limit` (`limits.max_record_bytes`) without
/// running it; `prefix` is what was kept of it (its first bytes).
pub fn dead_letter_oversized(
    txn: &mut Transaction,
    source: SourcePosition,
    prefix: Vec<u8>,
    size: u64,
    limit: u64,
) {
    let reason = format!(
        "the record has {size} bytes, over the job's limit of {limit} bytes (limits.max_record_bytes); only its first bytes are kept here"
    );
    txn.push_dead_letter(DeadLetter { source, reason, record: prefix });
}

fn dead_letter(txn: &mut Transaction, event: &Event, reason: &str) {
    let source = SourcePosition { partition: event.partition, offset: event.offset };
    let reason = cut(reason, MAX_REASON_BYTES);
    txn.push_dead_letter(DeadLetter { source, reason, record: event.value.clone() });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::state::MemoryStore;

    /// Writes state `k<offset>` and emits one record for every event; rejects
    /// events whose value is `reject`, fails on `fail`, and with `emit:N`
    /// emits N bytes.
    struct Scripted {
        calls: usize,
    }

    impl Processor for Scripted {
        fn process(
            &mut self,
            events: &[Event],
            txn: &mut Transaction,
        ) -> Result<Vec<Rejection>, ProcessError> {
            self.calls += 1;
            let mut rejections = Vec::new();
            for (index, event) in events.iter().enumerate() {
                let value = String::from_utf8(event.value.clone()).unwrap();
                txn.put_many(vec![(
                    format!("k{}", event.offset).into_bytes(),
                    b"written".to_vec(),
                )])
                .map_err(|v| ProcessError::Plugin(v.0))?;
                let bytes = value.strip_prefix("emit:").map_or(1, |n| n.parse().unwrap());
                txn.emit_many("totals", [(index as u32, None, vec![b'x'; bytes])])
                    .map_err(|e| ProcessError::Plugin(e.to_string()))?;
                match value.as_str() {
                    "reject" => rejections
                        .push(Rejection { index: index as u32, reason: "asked to".into() }),
                    "fail" => return Err(ProcessError::Plugin("failed as asked".into())),
                    _ => {}
                }
            }
            Ok(rejections)
        }
        fn digest(&self) -> &str {
            "sha256:scripted"
        }
    }

    fn events(values: &[&str]) -> Vec<Event> {
        values
            .iter()
            .enumerate()
            .map(|(offset, value)| Event {
                partition: 0,
                offset: offset as u64,
                timestamp_ms: None,
                key: None,
                value: value.as_bytes().to_vec(),
            })
            .collect()
    }

    fn transaction(limits: Limits) -> Transaction {
        Transaction::new(
            Arc::new(MemoryStore::default()),
            vec!["totals".to_string()].into(),
            limits,
        )
    }

    fn written(txn: &Transaction) -> Vec<String> {
        let mut keys: Vec<String> = txn
            .overlay
            .changes()
            .into_iter()
            .map(|(key, _)| String::from_utf8(key).unwrap())
            .collect();
        keys.sort();
        keys
    }

    #[test]
    fn a_rejected_event_leaves_no_state_and_no_output_whatever_the_plugin_wrote() {
        let mut txn = transaction(Limits::default());
        let mut plugin = Scripted { calls: 0 };
        let outcome =
            BatchRunner::new().run(&mut plugin, &mut txn, &events(&["a", "reject", "b"])).unwrap();
        assert_eq!((outcome.applied, outcome.dead_lettered, outcome.outputs), (2, 1, 2));
        assert_eq!(written(&txn), ["k0", "k2"], "the write for the rejected event was undone");
        assert_eq!(txn.outputs().iter().map(|o| o.source.offset).collect::<Vec<_>>(), [0, 2]);
        assert_eq!(txn.dead_letters()[0].reason, "asked to");
        assert_eq!(plugin.calls, 2, "the rest ran once more without the rejected event");
    }

    #[test]
    fn each_retry_has_its_own_budget_so_only_the_culprit_is_dead_lettered() {
        let limits = Limits { max_output_bytes_per_batch: 10_000, ..Limits::default() };
        let mut txn = transaction(limits);
        let mut plugin = Scripted { calls: 0 };
        let batch = events(&["a", "b", "emit:20000", "c", "d"]);
        let outcome = BatchRunner::new().run(&mut plugin, &mut txn, &batch).unwrap();
        assert_eq!(
            (outcome.applied, outcome.dead_lettered, outcome.traps),
            (4, 1, 2),
            "{outcome:?}"
        );
        assert_eq!(txn.dead_letters()[0].source.offset, 2);
        assert!(
            txn.dead_letters()[0].reason.contains("limits.max_output_bytes_per_batch"),
            "{}",
            txn.dead_letters()[0].reason
        );
        assert_eq!(written(&txn), ["k0", "k1", "k3", "k4"]);
    }

    #[test]
    fn a_plugin_failing_on_many_events_in_a_row_stops_the_job() {
        let limits = Limits { max_failures_in_a_row: 3, ..Limits::default() };
        let mut txn = transaction(limits);
        let mut runner = BatchRunner::new();
        let outcome = runner
            .run(&mut Scripted { calls: 0 }, &mut txn, &events(&["fail", "fail", "ok"]))
            .unwrap();
        assert_eq!(
            (outcome.applied, outcome.dead_lettered),
            (1, 2),
            "a success ends the run of failures"
        );
        let err = runner
            .run(&mut Scripted { calls: 0 }, &mut txn, &events(&["fail", "fail", "fail", "fail"]))
            .unwrap_err();
        assert!(
            matches!(&err, ProcessError::FailingInARow(message) if message.contains("3 events in a row") && message.contains("failed as asked")),
            "{err}"
        );
    }

    #[test]
    fn long_reasons_are_cut() {
        let reason = cut(&"é".repeat(1000), 11);
        assert_eq!(reason, "ééééé … (1990 more bytes cut)");
    }
}
