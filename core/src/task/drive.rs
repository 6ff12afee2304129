//! The one job loop every driver runs: [`Task::drive`]. A [`Driver`] says
//! where records come from and how a commit is made durable; the loop owns
//! when each step happens (see the order in [`crate::task`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{Committed, Ran, RunError, Task};
use crate::batch::BatchOutcome;
use crate::observe::RunSummary;
use crate::plugin::Event;
use crate::transaction::Transaction;

/// How long a job that commits when caught up waits for input while
/// records wait for their commit.
const CAUGHT_UP_LOOK: Duration = Duration::from_millis(1);

/// What a driver read for the open transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// `events` holds a batch of `read` records, `oversized` of which the
    /// driver already dead-lettered in the transaction (they are not in
    /// `events`). With `more_buffered`, the driver holds more of what it
    /// read: the loop runs those before a commit.
    Batch {
        /// Records the batch stands for.
        read: usize,
        /// Of them, dead-lettered for their size.
        oversized: u64,
        /// Whether more read records wait in the driver.
        more_buffered: bool,
    },
    /// Nothing was read this turn; a commit may be due.
    Nothing,
    /// The input has nothing more for now: what is open commits at once,
    /// then the driver waits for more ([`Driver::wait_for_input`]).
    Dry,
    /// The open transaction was taken from the job (Kafka revoked its
    /// partitions): it is dropped, its input read again by its new owner.
    Lost(&'static str),
    /// The input is at its end: what is open commits, and the run ends.
    End,
}

/// What became of a commit.
#[derive(Debug)]
pub enum CommitOutcome {
    /// It took effect. `None`: it carried no input (nothing to report).
    Done(Option<Committed>),
    /// It finishes in the background while the next transaction runs;
    /// [`Driver::settle`] tells its outcome.
    InFlight,
    /// The driver's transaction was aborted (the broker aborted it) and
    /// the driver went back to the last commit: the work is redone.
    Aborted(String),
}

/// How [`Driver::settle`] treats a commit in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Take its outcome if it has one, or if the driver must have it
    /// before it goes on (Kafka: before a rebalance is served).
    IfReady,
    /// Wait for its outcome.
    Wait,
    /// The run failed: wait for its outcome, and undo nothing if it failed
    /// (the driver's next run starts from the last commit anyway).
    AfterFailure,
}

/// How a run ended without error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The input reached its end, and everything is committed.
    End,
    /// The job was asked to stop: everything processed is committed, or
    /// (stopped during a plugin call) dropped, to be redone by the next run.
    Stopped,
}

/// Where a job's records come from and how its commits are made durable:
/// local files, Kafka. The loop in [`Task::drive`] calls these; a driver
/// never orders the task's steps itself.
pub trait Driver {
    /// The driver's error; batches' run failures become one.
    type Error: From<RunError> + std::fmt::Display;

    /// Reads the next batch into `events` (cleared first), waiting at most
    /// `wait` for input. Records over the record limit are dead-lettered in
    /// `txn` instead.
    fn next_batch(
        &mut self,
        txn: &mut Transaction,
        events: &mut Vec<Event>,
        wait: Duration,
    ) -> Result<Input, Self::Error>;

    /// The batch in `events` ran into `txn` (`on_trial`: a plugin version
    /// on trial ran it): note where the input stands, stage what is written.
    fn ran(
        &mut self,
        txn: &mut Transaction,
        events: &[Event],
        outcome: &BatchOutcome,
        on_trial: bool,
    ) -> Result<(), Self::Error>;

    /// Makes the open transaction durable, carrying `carried`. With
    /// `may_overlap`, the commit may finish while the next transaction runs
    /// ([`CommitOutcome::InFlight`]).
    fn commit(
        &mut self,
        txn: &mut Transaction,
        carried: RunSummary,
        may_overlap: bool,
    ) -> Result<CommitOutcome, Self::Error>;

    /// The outcome of a commit in flight, if there is one (see [`Settle`]).
    fn settle(
        &mut self,
        txn: &mut Transaction,
        how: Settle,
    ) -> Result<Option<CommitOutcome>, Self::Error> {
        let _ = (txn, how);
        Ok(None)
    }

    /// Undoes what was written since the last commit and goes back to it:
    /// the input is read again from there.
    fn discard(&mut self, txn: &mut Transaction) -> Result<(), Self::Error>;

    /// After [`Input::Dry`], with nothing open: waits a little for input.
    fn wait_for_input(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The job is stopping: forget records read but not run (they stay
    /// after the committed position, for the next run).
    fn stopping(&mut self) {}

    /// The partitions that are idle now (read to their end, and staying
    /// there; see `docs/periods.md`): a period job closes what idleness
    /// closes in them before the commit. `at_end`: the input is at its
    /// end, and every partition counts as idle. A driver may tell the
    /// transaction's periods what it knows of partitions it does not own.
    fn idle_partitions(&mut self, txn: &mut Transaction, at_end: bool) -> Vec<u32> {
        let _ = (txn, at_end);
        Vec::new()
    }

    /// Whether a partition went idle since idleness last closed anything
    /// in it: a commit is due even with no input (a following job's
    /// dry input).
    fn idle_due(&mut self) -> bool {
        false
    }

    /// Whether the last read took everything the input had: the job is
    /// caught up with it for now. A driver that cannot tell says `false`.
    fn caught_up_now(&self) -> bool {
        false
    }

    /// Whether a commit is in flight (not settled yet).
    fn commit_in_flight(&self) -> bool {
        false
    }
}

impl Task {
    /// Runs the job loop over `driver` until the input ends or `stop` is
    /// set, counting what commits in `summary`. After an error the open
    /// transaction is dropped; the driver must go back to its last commit
    /// before it is driven again. This is the one place the
    /// steps are ordered: boundary, run and trial judgement, roll-back,
    /// transaction judgement, commit.
    pub fn drive<D: Driver>(
        &mut self,
        driver: &mut D,
        stop: &AtomicBool,
        summary: &mut RunSummary,
    ) -> Result<Finish, D::Error> {
        let result = self.turns(driver, stop, summary);
        if let Err(err) = &result {
            // A commit in flight may still have taken effect: count it.
            // What is open is dropped; the driver's next run starts from
            // the last commit.
            if let Ok(Some(outcome @ CommitOutcome::Done(_))) =
                driver.settle(&mut self.txn, Settle::AfterFailure)
            {
                self.settled(outcome, summary);
            }
            self.drop_transaction(&err.to_string());
        }
        result
    }

    fn turns<D: Driver>(
        &mut self,
        driver: &mut D,
        stop: &AtomicBool,
        summary: &mut RunSummary,
    ) -> Result<Finish, D::Error> {
        let mut events = Vec::new();
        let mut last_commit = Instant::now();
        self.at_boundary();
        loop {
            if stop.load(Ordering::Relaxed) || self.context.stopping() {
                driver.stopping();
                if self.commit(driver, summary, false)? {
                    return Ok(Finish::Stopped);
                }
                continue;
            }
            if let Some(outcome) = driver.settle(&mut self.txn, Settle::IfReady)?
                && !self.settled(outcome, summary)
            {
                continue;
            }
            let mut wait = self.commit_interval.saturating_sub(last_commit.elapsed());
            if self.commit_when_caught_up && self.uncommitted.records > 0 {
                // Look again soon: the commit in flight may finish first.
                wait = wait.min(CAUGHT_UP_LOOK);
            }
            let more_buffered = match driver.next_batch(&mut self.txn, &mut events, wait)? {
                Input::Batch { read, oversized, more_buffered } => {
                    match self.run(&events, read, oversized)? {
                        Ran::Done(outcome) => {
                            let on_trial = self.on_trial();
                            driver.ran(&mut self.txn, &events, &outcome, on_trial)?
                        }
                        Ran::TrialFailed(reason) => {
                            self.roll_back(reason);
                            driver.discard(&mut self.txn)?;
                            continue;
                        }
                        Ran::Stopped => {
                            // What was not committed is read again by the next run.
                            self.drop_transaction("the job was stopped during a plugin call");
                            driver.discard(&mut self.txn)?;
                            return Ok(Finish::Stopped);
                        }
                    }
                    more_buffered
                }
                Input::Nothing => false,
                Input::Lost(reason) => {
                    self.drop_transaction(reason);
                    continue;
                }
                Input::Dry => {
                    if (self.uncommitted.records > 0 || driver.idle_due())
                        && !self.commit_at(driver, summary, false, false)?
                    {
                        continue;
                    }
                    last_commit = Instant::now();
                    self.context.idle();
                    driver.wait_for_input()?;
                    self.at_boundary();
                    continue;
                }
                Input::End => {
                    if self.commit_at(driver, summary, false, true)? {
                        return Ok(Finish::End);
                    }
                    // A version on trial failed the last transaction: redo
                    // it with the version restored.
                    continue;
                }
            };
            if !more_buffered && (self.commit_due(last_commit) || self.commit_early(driver)) {
                self.commit(driver, summary, true)?;
                last_commit = Instant::now();
            }
        }
    }

    /// Settles a commit in flight, judges the open transaction and commits
    /// it (or rolls it back). `false` if it did not commit: its input is
    /// read again.
    fn commit<D: Driver>(
        &mut self,
        driver: &mut D,
        summary: &mut RunSummary,
        may_overlap: bool,
    ) -> Result<bool, D::Error> {
        self.commit_at(driver, summary, may_overlap, false)
    }

    /// [`Task::commit`]; `at_end`: the input is at its end.
    fn commit_at<D: Driver>(
        &mut self,
        driver: &mut D,
        summary: &mut RunSummary,
        may_overlap: bool,
        at_end: bool,
    ) -> Result<bool, D::Error> {
        if let Some(outcome) = driver.settle(&mut self.txn, Settle::Wait)?
            && !self.settled(outcome, summary)
        {
            return Ok(false);
        }
        let idle = driver.idle_partitions(&mut self.txn, at_end);
        if !self.end_transaction(&idle)? {
            // Stopped during a plugin call: the next run redoes it.
            self.drop_transaction("the job was stopped during a plugin call");
            driver.discard(&mut self.txn)?;
            return Ok(false);
        }
        if let Some(reason) = self.judge_transaction() {
            self.roll_back(reason);
            driver.discard(&mut self.txn)?;
            return Ok(false);
        }
        let carried = std::mem::take(&mut self.uncommitted);
        // Only with no version waiting for a transaction's outcome.
        let overlap = may_overlap && self.swap_idle();
        match driver.commit(&mut self.txn, carried, overlap)? {
            CommitOutcome::InFlight => Ok(true),
            outcome => {
                let committed = self.settled(outcome, summary);
                if committed {
                    self.at_boundary();
                }
                Ok(committed)
            }
        }
    }

    /// Takes a commit's outcome: `false` if it was aborted (the open
    /// transaction is dropped with it).
    fn settled(&mut self, outcome: CommitOutcome, summary: &mut RunSummary) -> bool {
        match outcome {
            CommitOutcome::Done(commit) => {
                if let Some(commit) = &commit {
                    summary.commits += 1;
                    summary.absorb(&commit.carried);
                }
                self.committed(commit);
                true
            }
            CommitOutcome::InFlight => true,
            CommitOutcome::Aborted(reason) => {
                self.drop_transaction(&reason);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::limits::Limits;
    use crate::plugin::{JobContext, ProcessError, Processor, Rejection};
    use crate::state::MemoryStore;

    /// A plugin that accepts every event, or is stopped on its call
    /// `stop_at_call` (from 0).
    #[derive(Default)]
    struct Accepts {
        stop_at_call: Option<usize>,
        calls: usize,
    }

    impl Processor for Accepts {
        fn process(
            &mut self,
            _events: &[Event],
            _txn: &mut Transaction,
        ) -> Result<Vec<Rejection>, ProcessError> {
            self.calls += 1;
            if self.stop_at_call == Some(self.calls - 1) {
                return Err(ProcessError::Stopped);
            }
            Ok(Vec::new())
        }
        fn digest(&self) -> &str {
            "sha256:accepts"
        }
    }

    /// What the scripted driver does on a call, in order.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Step {
        Batch(usize),
        Lost,
        Dry,
        End,
        Fail,
    }

    /// A driver that reads a script, and logs the calls the loop makes.
    #[derive(Default)]
    struct Scripted {
        script: Vec<Step>,
        next: usize,
        /// Commits that abort (by their number, from 0), and that finish in
        /// the background.
        aborting: Vec<usize>,
        overlapping: bool,
        /// What `caught_up_now` says.
        caught_up: bool,
        commits: usize,
        in_flight: Option<RunSummary>,
        calls: Vec<String>,
    }

    #[derive(Debug, thiserror::Error)]
    enum Failed {
        #[error("the driver failed")]
        Driver,
        #[error(transparent)]
        Run(#[from] RunError),
    }

    impl Driver for Scripted {
        type Error = Failed;

        fn next_batch(
            &mut self,
            _txn: &mut Transaction,
            events: &mut Vec<Event>,
            _wait: Duration,
        ) -> Result<Input, Failed> {
            events.clear();
            let step = self.script.get(self.next).copied().unwrap_or(Step::End);
            self.next += 1;
            self.calls.push(format!("{step:?}"));
            Ok(match step {
                Step::Batch(count) => {
                    let event = |offset| Event {
                        partition: 0,
                        offset,
                        timestamp_ms: None,
                        key: None,
                        value: b"{}".to_vec(),
                    };
                    events.extend((0..count as u64).map(event));
                    Input::Batch { read: count, oversized: 0, more_buffered: false }
                }
                Step::Lost => Input::Lost("partitions were revoked"),
                Step::Dry => Input::Dry,
                Step::End => Input::End,
                Step::Fail => return Err(Failed::Driver),
            })
        }

        fn ran(
            &mut self,
            _txn: &mut Transaction,
            events: &[Event],
            _outcome: &BatchOutcome,
            _on_trial: bool,
        ) -> Result<(), Failed> {
            self.calls.push(format!("ran {}", events.len()));
            Ok(())
        }

        fn commit(
            &mut self,
            txn: &mut Transaction,
            carried: RunSummary,
            may_overlap: bool,
        ) -> Result<CommitOutcome, Failed> {
            let number = self.commits;
            self.commits += 1;
            self.calls.push(format!("commit {}", carried.records));
            if self.aborting.contains(&number) {
                // The broker aborted it: the driver goes back to the start.
                self.next = 0;
                return Ok(CommitOutcome::Aborted("aborted by the broker".into()));
            }
            if may_overlap && self.overlapping {
                self.in_flight = Some(carried);
                return Ok(CommitOutcome::InFlight);
            }
            txn.committed();
            Ok(CommitOutcome::Done(Some(Committed {
                at: Instant::now(),
                took: Duration::ZERO,
                lag: None,
                carried,
            })))
        }

        fn settle(
            &mut self,
            _txn: &mut Transaction,
            how: Settle,
        ) -> Result<Option<CommitOutcome>, Failed> {
            if how == Settle::IfReady {
                return Ok(None); // still in flight
            }
            let Some(carried) = self.in_flight.take() else { return Ok(None) };
            self.calls.push(format!("settle {how:?}"));
            Ok(Some(CommitOutcome::Done(Some(Committed {
                at: Instant::now(),
                took: Duration::ZERO,
                lag: None,
                carried,
            }))))
        }

        fn discard(&mut self, _txn: &mut Transaction) -> Result<(), Failed> {
            self.calls.push("discard".into());
            self.next = 0;
            Ok(())
        }

        fn wait_for_input(&mut self) -> Result<(), Failed> {
            self.calls.push("wait".into());
            Ok(())
        }

        fn caught_up_now(&self) -> bool {
            self.caught_up
        }

        fn commit_in_flight(&self) -> bool {
            self.in_flight.is_some()
        }
    }

    fn task(commit_interval: Duration) -> Task {
        let txn =
            Transaction::new(Arc::new(MemoryStore::default()), Arc::from([]), Limits::default());
        Task::new(
            "test",
            Box::new(Accepts::default()),
            txn,
            JobContext::new("test"),
            commit_interval,
        )
    }

    fn drive(
        driver: &mut Scripted,
        commit_interval: Duration,
    ) -> (Result<Finish, Failed>, RunSummary) {
        let mut summary = RunSummary::default();
        let result = task(commit_interval).drive(driver, &AtomicBool::new(false), &mut summary);
        (result, summary)
    }

    #[test]
    fn batches_commit_at_the_end_of_the_input() {
        let mut driver = Scripted {
            script: vec![Step::Batch(3), Step::Batch(2), Step::End],
            ..Scripted::default()
        };
        let (result, summary) = drive(&mut driver, Duration::from_secs(3600));
        assert_eq!(result.unwrap(), Finish::End);
        assert_eq!((summary.records, summary.commits), (5, 1));
        assert_eq!(driver.calls, ["Batch(3)", "ran 3", "Batch(2)", "ran 2", "End", "commit 5"]);
    }

    #[test]
    fn a_job_that_commits_when_caught_up_commits_at_once_unless_a_commit_is_in_flight() {
        let mut driver = Scripted {
            script: vec![Step::Batch(3), Step::Batch(2), Step::End],
            overlapping: true,
            caught_up: true,
            ..Scripted::default()
        };
        let mut eager = task(Duration::from_secs(3600));
        eager.commit_when_caught_up(true);
        let mut summary = RunSummary::default();
        let result = eager.drive(&mut driver, &AtomicBool::new(false), &mut summary);
        assert_eq!(result.unwrap(), Finish::End);
        assert_eq!(
            driver.calls,
            [
                "Batch(3)",
                "ran 3",
                "commit 3",
                "Batch(2)",
                "ran 2",
                "End",
                "settle Wait",
                "commit 2"
            ],
            "the first batch commits at once; the second waits for the commit in flight"
        );
        assert_eq!((summary.records, summary.commits), (5, 2));

        // Not caught up (more input waits): the interval decides.
        let mut driver = Scripted {
            script: vec![Step::Batch(3), Step::Batch(2), Step::End],
            ..Scripted::default()
        };
        let mut eager = task(Duration::from_secs(3600));
        eager.commit_when_caught_up(true);
        eager.drive(&mut driver, &AtomicBool::new(false), &mut RunSummary::default()).unwrap();
        assert_eq!(driver.calls, ["Batch(3)", "ran 3", "Batch(2)", "ran 2", "End", "commit 5"]);
    }

    #[test]
    fn an_aborted_commit_is_redone_and_its_records_count_once() {
        let mut driver = Scripted {
            script: vec![Step::Batch(3), Step::End],
            aborting: vec![0],
            ..Scripted::default()
        };
        let (result, summary) = drive(&mut driver, Duration::from_secs(3600));
        assert_eq!(result.unwrap(), Finish::End);
        assert_eq!((summary.records, summary.commits), (3, 1));
        assert_eq!(
            driver.calls,
            ["Batch(3)", "ran 3", "End", "commit 3", "Batch(3)", "ran 3", "End", "commit 3"]
        );
    }

    #[test]
    fn a_lost_transaction_is_dropped_and_not_counted() {
        let mut driver = Scripted {
            script: vec![Step::Batch(3), Step::Lost, Step::Batch(2), Step::End],
            ..Scripted::default()
        };
        let (_, summary) = drive(&mut driver, Duration::from_secs(3600));
        assert_eq!(
            (summary.records, summary.commits),
            (2, 1),
            "the lost transaction's 3 records are its new owner's"
        );
    }

    #[test]
    fn dry_input_commits_what_is_open_before_waiting() {
        let mut driver = Scripted {
            script: vec![Step::Batch(4), Step::Dry, Step::Dry, Step::End],
            ..Scripted::default()
        };
        let (_, summary) = drive(&mut driver, Duration::from_secs(3600));
        assert_eq!(
            driver.calls,
            ["Batch(4)", "ran 4", "Dry", "commit 4", "wait", "Dry", "wait", "End", "commit 0"]
        );
        assert_eq!((summary.records, summary.commits), (4, 2));
    }

    #[test]
    fn a_commit_in_flight_is_settled_before_the_next_and_counted_after_a_failure() {
        // A zero interval: every batch commits, in the background.
        let mut driver = Scripted {
            script: vec![Step::Batch(1), Step::Batch(2), Step::Fail],
            overlapping: true,
            ..Scripted::default()
        };
        let (result, summary) = drive(&mut driver, Duration::ZERO);
        assert!(matches!(result, Err(Failed::Driver)));
        assert_eq!(
            driver.calls,
            [
                "Batch(1)",
                "ran 1",
                "commit 1",
                "Batch(2)",
                "ran 2",
                "settle Wait",
                "commit 2",
                "Fail",
                "settle AfterFailure"
            ]
        );
        assert_eq!(
            (summary.records, summary.commits),
            (3, 2),
            "both commits took effect, the last after the failure"
        );
    }

    #[test]
    fn a_stop_during_a_plugin_call_goes_back_to_the_last_commit() {
        let mut driver = Scripted {
            script: vec![Step::Batch(1), Step::Batch(2), Step::End],
            ..Scripted::default()
        };
        let txn =
            Transaction::new(Arc::new(MemoryStore::default()), Arc::from([]), Limits::default());
        let plugin = Accepts { stop_at_call: Some(1), calls: 0 };
        let mut task = Task::new(
            "test",
            Box::new(plugin),
            txn,
            JobContext::new("test"),
            Duration::from_secs(3600),
        );
        let mut summary = RunSummary::default();
        let result = task.drive(&mut driver, &AtomicBool::new(false), &mut summary);
        assert_eq!(result.unwrap(), Finish::Stopped);
        assert_eq!(driver.calls, ["Batch(1)", "ran 1", "Batch(2)", "discard"]);
        assert_eq!(
            (summary.records, summary.commits),
            (0, 0),
            "nothing committed: the next run redoes both batches"
        );
    }

    #[test]
    fn a_stop_commits_what_was_processed() {
        let mut driver = Scripted { script: vec![Step::Batch(2)], ..Scripted::default() };
        let mut summary = RunSummary::default();
        let stop = AtomicBool::new(true);
        let result = task(Duration::from_secs(3600)).drive(&mut driver, &stop, &mut summary);
        assert_eq!(result.unwrap(), Finish::Stopped);
        assert_eq!(driver.calls, ["commit 0"], "nothing is read once the stop is asked");
    }
}
