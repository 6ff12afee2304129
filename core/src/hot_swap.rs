//! Hot loading: a new plugin version, compiled and checked off the
//! processing path, waits in a [`PluginSlot`] until its job reaches a
//! transaction boundary. It then runs on trial for one transaction: if it
//! traps, or rejects more than [`SwapPolicy::max_reject_share`] of that
//! transaction's events, the job aborts the transaction and redoes it with
//! the previous version. No transaction ever mixes two versions, so the
//! plugin digest in the output lineage changes exactly at a commit.

use crate::sync::lock;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Deserialize;

use crate::batch::BatchOutcome;
use crate::limits::Limits;
use crate::observe::JobObserver;
pub use crate::observe::SwapEvent;
use crate::plugin::{JobContext, LoadedPlugin, Processor};
use crate::transaction::Transaction;

/// How a job judges a new plugin version on trial.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SwapPolicy {
    /// A new version that rejects more than this share of the events of its
    /// first transaction is rolled back (a trap always rolls it back).
    pub max_reject_share: f64,
}

impl Default for SwapPolicy {
    fn default() -> Self {
        SwapPolicy { max_reject_share: 0.5 }
    }
}

/// Where a new plugin version waits for its job's next transaction boundary.
pub struct PluginSlot {
    pending: Mutex<Option<(LoadedPlugin, Instant)>>,
}

impl PluginSlot {
    /// An empty slot.
    pub fn new() -> Arc<PluginSlot> {
        Arc::new(PluginSlot { pending: Mutex::new(None) })
    }

    /// Offers `plugin` to the job; returns the version pushed earlier that
    /// the job had not taken yet, which it now never will.
    pub fn push(&self, plugin: LoadedPlugin) -> Option<LoadedPlugin> {
        let displaced = lock(&self.pending).replace((plugin, Instant::now()));
        displaced.map(|(plugin, _)| plugin)
    }

    /// Takes the waiting version back if it is `digest`.
    pub fn take_if(&self, digest: &str) -> Option<LoadedPlugin> {
        let mut pending = lock(&self.pending);
        if pending.as_ref().is_some_and(|(plugin, _)| plugin.digest() == digest) {
            return pending.take().map(|(plugin, _)| plugin);
        }
        None
    }

    fn take(&self) -> Option<(LoadedPlugin, Instant)> {
        lock(&self.pending).take()
    }

    fn is_pending(&self) -> bool {
        lock(&self.pending).is_some()
    }
}

/// The version on trial, and the one to go back to.
struct Trial {
    digest: String,
    previous: Box<dyn Processor>,
    events: u64,
    rejected: u64,
}

/// A job's side of hot loading: takes pushed versions at transaction
/// boundaries and judges them on their first transaction.
pub struct HotSwap {
    slot: Arc<PluginSlot>,
    limits: Limits,
    policy: SwapPolicy,
    observer: Arc<dyn JobObserver>,
    context: JobContext,
    trial: Option<Trial>,
}

impl HotSwap {
    /// Hot loading for a job with sandbox `limits`, fed by `slot`; new
    /// versions are instantiated in the job's `context`.
    pub fn new(
        slot: Arc<PluginSlot>,
        limits: Limits,
        policy: SwapPolicy,
        observer: Arc<dyn JobObserver>,
        context: JobContext,
    ) -> HotSwap {
        HotSwap { slot, limits, policy, observer, context, trial: None }
    }

    /// Whether a new version is running its trial transaction (a failing
    /// batch then rolls it back rather than being retried event by event).
    pub fn on_trial(&self) -> bool {
        self.trial.is_some()
    }

    /// Whether no version waits for a transaction's outcome: none on trial
    /// and none pushed. Only then may a commit overlap the next transaction.
    pub fn is_idle(&self) -> bool {
        self.trial.is_none() && !self.slot.is_pending()
    }

    /// A transaction committed: a version on trial that ran events in it
    /// passed its trial and is the job's plugin now.
    pub fn committed(&mut self) {
        if self.trial.as_ref().is_some_and(|trial| trial.events > 0) {
            let trial = self.trial.take().expect("checked above");
            tracing::info!(plugin = %trial.digest, "new plugin version passed its first transaction");
            self.observer.swapped(&SwapEvent::Activated { digest: trial.digest });
        }
    }

    /// The open transaction was dropped for a reason that is not the
    /// version's fault (a Kafka abort, a rebalance, a restart): its trial
    /// starts over with the redo.
    pub fn aborted(&mut self) {
        if let Some(trial) = &mut self.trial {
            trial.events = 0;
            trial.rejected = 0;
        }
    }

    /// At a transaction boundary (nothing uncommitted): swaps in a pushed
    /// version for a trial transaction. Keeps `txn`'s plugin digest in step
    /// with `processor`.
    pub fn at_boundary(&mut self, processor: &mut Box<dyn Processor>, txn: &mut Transaction) {
        if self.context.stopping() {
            // A version started now would be stopped while it starts, and
            // judged as refused: it waits in the slot for the next run.
            return;
        }
        let Some((plugin, pushed_at)) = self.slot.take() else { return };
        let started = if plugin.kind() == processor.kind() {
            plugin.processor(self.limits, self.context.clone()).map_err(|err| err.to_string())
        } else {
            Err(format!(
                "it is {}, but the job runs {}: a job keeps its kind of plugin",
                plugin.kind().describe(),
                processor.kind().describe()
            ))
        };
        match started {
            Ok(instance) => {
                let previous = std::mem::replace(processor, instance);
                // A version still on trial (no committed transaction yet) is
                // replaced outright: go back to the last accepted one if the
                // newest fails.
                let previous = match self.trial.take() {
                    Some(trial) => {
                        let reason = format!(
                            "superseded by {} before its first transaction committed",
                            plugin.digest()
                        );
                        self.observer.swapped(&SwapEvent::Refused { digest: trial.digest, reason });
                        trial.previous
                    }
                    None => previous,
                };
                tracing::info!(plugin = %plugin.digest(), previous = %previous.digest(), waited_us = pushed_at.elapsed().as_micros() as u64, "swapped in a new plugin version for a trial transaction");
                self.trial = Some(Trial {
                    digest: plugin.digest().to_string(),
                    previous,
                    events: 0,
                    rejected: 0,
                });
                txn.plugin_digest = plugin.digest().to_string();
                self.observer.swapped(&SwapEvent::OnTrial { digest: plugin.digest().to_string() });
            }
            Err(err) => {
                let event =
                    SwapEvent::Refused { digest: plugin.digest().to_string(), reason: err.clone() };
                tracing::warn!(plugin = %plugin.digest(), error = %err, "new plugin version could not start; keeping the running one");
                self.observer.swapped(&event);
            }
        }
    }

    /// Counts a batch the version on trial ran; `Some(reason)` if it failed
    /// its trial (then call [`HotSwap::roll_back`]).
    pub fn judge_batch(&mut self, events: usize, outcome: &BatchOutcome) -> Option<String> {
        let trial = self.trial.as_mut()?;
        trial.events += events as u64;
        trial.rejected += outcome.dead_lettered.saturating_sub(outcome.refused_by_rules);
        if let Some(trap) = &outcome.first_failure {
            return Some(format!("it failed on its first transaction: {trap}"));
        }
        None
    }

    /// Before the trial transaction commits: `Some(reason)` if the version
    /// rejected too large a share of it.
    pub fn judge_transaction(&self) -> Option<String> {
        let trial = self.trial.as_ref()?;
        let share = trial.rejected as f64 / trial.events.max(1) as f64;
        (share > self.policy.max_reject_share).then(|| {
            format!(
                "it rejected {} of the {} events of its first transaction ({:.0}%, more than max_reject_share = {})",
                trial.rejected,
                trial.events,
                share * 100.0,
                self.policy.max_reject_share
            )
        })
    }

    /// Puts the previous version back after a failed trial. The caller has
    /// aborted the trial transaction and redoes its input.
    pub fn roll_back(
        &mut self,
        processor: &mut Box<dyn Processor>,
        txn: &mut Transaction,
        reason: String,
    ) {
        let Some(trial) = self.trial.take() else { return };
        *processor = trial.previous;
        txn.plugin_digest = processor.digest().to_string();
        tracing::warn!(plugin = %trial.digest, restored = %processor.digest(), reason = %crate::text::sanitize(&reason, crate::text::MAX_REASON_BYTES), "new plugin version rolled back");
        self.observer.swapped(&SwapEvent::RolledBack {
            digest: trial.digest,
            restored: processor.digest().to_string(),
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::{Event, ProcessError, Rejection};
    use crate::state::MemoryStore;

    struct Named(&'static str);

    impl Processor for Named {
        fn process(
            &mut self,
            _events: &[Event],
            _txn: &mut Transaction,
        ) -> Result<Vec<Rejection>, ProcessError> {
            Ok(Vec::new())
        }
        fn digest(&self) -> &str {
            self.0
        }
    }

    #[derive(Default)]
    struct Events(Mutex<Vec<SwapEvent>>);

    impl JobObserver for Events {
        fn swapped(&self, event: &SwapEvent) {
            lock(&self.0).push(event.clone());
        }
    }

    /// A hot swap with `new` on trial, `old` to go back to.
    fn on_trial(events: Arc<Events>) -> (HotSwap, Box<dyn Processor>, Transaction) {
        let mut swap = HotSwap::new(
            PluginSlot::new(),
            Limits::default(),
            SwapPolicy { max_reject_share: 0.5 },
            events,
            JobContext::new("test"),
        );
        swap.trial = Some(Trial {
            digest: "sha256:new".into(),
            previous: Box::new(Named("sha256:old")),
            events: 0,
            rejected: 0,
        });
        let txn =
            Transaction::new(Arc::new(MemoryStore::default()), Arc::from([]), Limits::default());
        (swap, Box::new(Named("sha256:new")), txn)
    }

    fn rejecting(rejected: u64) -> BatchOutcome {
        BatchOutcome { dead_lettered: rejected, ..BatchOutcome::default() }
    }

    #[test]
    fn rejecting_more_than_the_share_rolls_back_to_the_previous_version() {
        let events = Arc::new(Events::default());
        let (mut swap, mut processor, mut txn) = on_trial(events.clone());
        assert_eq!(
            swap.judge_batch(100, &rejecting(30)),
            None,
            "rejections alone are judged on the whole transaction"
        );
        assert_eq!(swap.judge_batch(100, &rejecting(90)), None);
        let reason = swap.judge_transaction().expect("120 of 200 rejected is over half");
        assert!(
            reason.contains("120 of the 200") && reason.contains("max_reject_share = 0.5"),
            "{reason}"
        );
        swap.roll_back(&mut processor, &mut txn, reason);
        assert_eq!(processor.digest(), "sha256:old");
        assert_eq!(txn.plugin_digest, "sha256:old");
        assert!(!swap.on_trial());
        assert!(
            matches!(&lock(&events.0)[..], [SwapEvent::RolledBack { digest, restored, .. }] if digest == "sha256:new" && restored == "sha256:old")
        );
    }

    #[test]
    fn retries_and_late_events_a_period_job_refuses_are_not_held_against_the_version() {
        let (mut swap, _, _) = on_trial(Arc::new(Events::default()));
        let replayed =
            BatchOutcome { dead_lettered: 95, refused_by_rules: 90, ..BatchOutcome::default() };
        assert_eq!(swap.judge_batch(100, &replayed), None);
        assert_eq!(swap.judge_transaction(), None, "5 of 100 are the version's");
        let refused = BatchOutcome { dead_lettered: 96, ..BatchOutcome::default() };
        assert_eq!(swap.judge_batch(100, &refused), None);
        assert!(swap.judge_transaction().unwrap().contains("101 of the 200"));
    }

    #[test]
    fn a_trap_fails_the_trial_at_once_and_a_clean_commit_passes_it() {
        let events = Arc::new(Events::default());
        let (mut swap, _, _) = on_trial(events.clone());
        let trapped = BatchOutcome {
            traps: 1,
            first_failure: Some("plugin trapped: unreachable".into()),
            ..BatchOutcome::default()
        };
        assert!(swap.judge_batch(10, &trapped).unwrap().contains("unreachable"));

        let (mut swap, _, _) = on_trial(events.clone());
        swap.committed();
        assert!(swap.on_trial(), "a commit without events of the new version proves nothing");
        swap.judge_batch(10, &rejecting(1));
        swap.aborted();
        swap.committed();
        assert!(swap.on_trial(), "an aborted transaction's events do not count");
        swap.judge_batch(10, &rejecting(1));
        assert_eq!(swap.judge_transaction(), None);
        swap.committed();
        assert!(!swap.on_trial());
        assert!(
            matches!(lock(&events.0).last(), Some(SwapEvent::Activated { digest }) if digest == "sha256:new")
        );
    }
}
