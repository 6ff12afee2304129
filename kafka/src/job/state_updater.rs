//! The state updater: restores newly assigned partitions on a thread of
//! its own, beside the processing of the partitions already restored (the
//! role of Kafka Streams' state updater, KIP-869).
//!
//! The rebalance handler only assigns the partitions paused and counts the
//! assignment ([`Generation`]); the session hands the assignment to the
//! updater, which checks it (a kept changelog), restores it, checks what it
//! restored against the group's committed offsets (no rewind, no state
//! behind them), and reports each set of partitions ready. The session then
//! resumes them. Partitions with little to read past their checkpoint
//! (a restarted process's, usually) are restored and reported first, so a
//! long restore of one partition does not hold up the others. A revocation moves the generation on, which
//! stops a restore at its next read (its progress checkpointed), and a
//! report of an older generation is dropped.
//!
//! The poll thread never waits for a restore, so a restore longer than
//! `max.poll.interval.ms` does not cost the process its place in the group.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

use super::{KAFKA_TIMEOUT, Restart, SessionError};
use crate::changelog::read_offset;
use crate::config::Guarantee;
use crate::keys::{checkpoint_key, included_key};
use crate::restore::{RestoreError, Restorer};
use crate::transaction::TransactionOwner;
use crate::{KafkaJobError, SetupError};
use tally_core::state::StateStore;

/// Changelog offsets a partition's restore may have to read and still go
/// with the quick ones (a commit marker, a few transactions: a fraction of
/// a second), before the partitions with more.
const QUICK_RESTORE_OFFSETS: i64 = 10_000;
/// How long the updater waits between looks at state still behind the
/// group's offsets (a previous owner's transaction settling).
const BEHIND_RECHECK: Duration = Duration::from_millis(500);

/// Counts the consumer's assignments and revocations: work for an older
/// count is stale. Shared by the rebalance handler, which moves it on, and
/// the updater, which stops work that went stale.
#[derive(Default)]
pub(super) struct Generation(AtomicU64);

impl Generation {
    /// The current count.
    pub(super) fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Makes everything begun so far stale; returns the new count.
    pub(super) fn advance(&self) -> u64 {
        self.0.fetch_add(1, Ordering::AcqRel) + 1
    }
}

/// Partitions `(input topic, partition)` assigned in one generation, to
/// restore.
pub(super) struct Assignment {
    pub(super) generation: u64,
    pub(super) partitions: Vec<(String, i32)>,
}

/// Next input offset a restored state includes, per `(input topic,
/// partition)` that has one.
pub(super) type Included = Vec<((String, i32), i64)>;

/// Partitions restored and checked (or the reason they could not be).
pub(super) struct Restored {
    pub(super) generation: u64,
    /// `(input topic, partition)` of every input for the partition numbers
    /// restored.
    pub(super) partitions: Vec<(String, i32)>,
    /// Next input offset the restored state includes, where it has one.
    pub(super) result: Result<Included, SessionError>,
}

/// Why restoring and checking partitions stopped short.
enum Stopped {
    /// Its partitions were revoked (or the session is ending).
    Stale,
    /// The session ends on this.
    Failed(SessionError),
}

impl From<SessionError> for Stopped {
    fn from(failure: SessionError) -> Stopped {
        Stopped::Failed(failure)
    }
}

/// A partition whose restored state includes less input than the group
/// has committed.
struct Behind {
    topic: String,
    partition: i32,
    group_offset: i64,
    /// Next input offset the state includes, if any.
    included: Option<i64>,
}

/// What the updater's thread needs to restore and check partitions.
pub(super) struct UpdaterParts {
    pub(super) job: String,
    pub(super) group: String,
    pub(super) guarantee: Guarantee,
    /// For the changelog's end as the producer sees it (`read_uncommitted`).
    pub(super) owner: Arc<TransactionOwner>,
    pub(super) restorer: Arc<Restorer>,
    pub(super) store: Arc<dyn StateStore>,
    /// Longest a restored state may stay behind the group's offsets.
    pub(super) settle: Duration,
    pub(super) generation: Arc<Generation>,
}

/// The session's handle on the updater's thread; dropping it stops the
/// thread's work at its next read.
pub(super) struct StateUpdater<'scope> {
    assignments: Option<Sender<Assignment>>,
    restored: Receiver<Restored>,
    generation: Arc<Generation>,
    _thread: ScopedJoinHandle<'scope, ()>,
}

impl<'scope> StateUpdater<'scope> {
    /// Starts the updater's thread in `scope`.
    pub(super) fn start<'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        parts: UpdaterParts,
    ) -> StateUpdater<'scope> {
        let (assignments, to_restore) = mpsc::channel::<Assignment>();
        let (report, restored) = mpsc::channel::<Restored>();
        let generation = parts.generation.clone();
        let thread = std::thread::Builder::new()
            .name(format!("tally-restore-{}", parts.job))
            .spawn_scoped(scope, move || {
                for assignment in to_restore {
                    if !parts.restore_and_check(assignment, &report) {
                        break;
                    }
                }
            })
            .expect("spawning the state updater's thread");
        StateUpdater { assignments: Some(assignments), restored, generation, _thread: thread }
    }

    /// Whether `assignment` is the consumer's latest (not revoked since).
    pub(super) fn is_current(&self, assignment: &Assignment) -> bool {
        assignment.generation == self.generation.now()
    }

    /// Restores `assignment`'s partitions (after any earlier assignment's
    /// work stops, being stale by now).
    pub(super) fn restore(&self, assignment: Assignment) {
        if let Some(assignments) = &self.assignments {
            // The thread only ends with the session, which owns `self`.
            let _ = assignments.send(assignment);
        }
    }

    /// The next report of the current generation, if one is ready.
    pub(super) fn try_restored(&self) -> Option<Restored> {
        loop {
            match self.restored.try_recv() {
                Ok(restored) if restored.generation == self.generation.now() => {
                    return Some(restored);
                }
                Ok(_) => continue, // stale: its partitions were revoked since
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return None,
            }
        }
    }
}

impl Drop for StateUpdater<'_> {
    /// Stops the restore under way (the session ends); the scope then
    /// waits for the thread, which finds no more work.
    fn drop(&mut self) {
        self.generation.advance();
        self.assignments.take();
    }
}

impl UpdaterParts {
    /// Restores and checks `assignment`, reporting to `report`: first the
    /// partitions with little to read, then the rest (each set is loaded
    /// and made durable as one). Returns false once the session is gone.
    fn restore_and_check(&self, assignment: Assignment, report: &Sender<Restored>) -> bool {
        let generation = assignment.generation;
        if self.generation.now() != generation {
            return true;
        }
        let numbers: Vec<i32> = assignment
            .partitions
            .iter()
            .map(|(_, partition)| *partition)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let of = |numbers: &[i32]| -> Vec<(String, i32)> {
            assignment
                .partitions
                .iter()
                .filter(|(_, partition)| numbers.contains(partition))
                .cloned()
                .collect()
        };
        let long = self.check_changelog_kept(&numbers).and_then(|()| {
            let to_read =
                self.restorer.to_read(&numbers).map_err(|err| self.restore_failed(err))?;
            Ok(to_read
                .iter()
                .filter(|partition| partition.end - partition.next > QUICK_RESTORE_OFFSETS)
                .map(|partition| partition.partition)
                .collect::<Vec<i32>>())
        });
        let groups = match long {
            Ok(long) if long.is_empty() || long.len() == numbers.len() => vec![numbers],
            Ok(long) => {
                let quick = numbers.iter().copied().filter(|n| !long.contains(n)).collect();
                vec![quick, long]
            }
            Err(failure) => {
                let failed = Restored {
                    generation,
                    partitions: assignment.partitions,
                    result: Err(failure),
                };
                return report.send(failed).is_ok();
            }
        };
        for numbers in groups {
            let partitions = of(&numbers);
            let result = match self.restore_checked(&numbers, &partitions, generation) {
                Ok(included) => Ok(included),
                Err(Stopped::Stale) => return true, // a newer assignment follows
                Err(Stopped::Failed(failure)) => Err(failure),
            };
            let failed = result.is_err();
            if report.send(Restored { generation, partitions, result }).is_err() {
                return false;
            }
            if failed {
                return true; // the session ends on it
            }
        }
        true
    }

    /// A restore's failure, as the session takes it.
    fn restore_failed(&self, err: RestoreError) -> SessionError {
        match err {
            RestoreError::Foreign { .. } => SessionError::Fatal(KafkaJobError::Setup {
                job: self.job.clone(),
                source: SetupError::ForeignChangelog(err),
            }),
            RestoreError::State(state) => SessionError::fatal(state),
            other => Restart::Restore(other).into(),
        }
    }

    /// Restores partitions `numbers` (`partitions`: of every input), then
    /// compares what their state includes with the group's committed
    /// offsets; restores again while the state is behind them, up to the
    /// settle time.
    fn restore_checked(
        &self,
        numbers: &[i32],
        partitions: &[(String, i32)],
        generation: u64,
    ) -> Result<Included, Stopped> {
        let cancelled = || self.generation.now() != generation;
        // Measured from the first restore's end: a long restore does not
        // shorten the wait for a previous owner's transaction to settle.
        let mut deadline = None;
        loop {
            match self.restorer.restore(numbers, &cancelled) {
                Ok(_) => {}
                Err(RestoreError::Cancelled { .. }) => return Err(Stopped::Stale),
                Err(err) => return Err(Stopped::Failed(self.restore_failed(err))),
            }
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.settle);
            let mut included = Vec::new();
            let Some(behind) = self.behind_the_group(partitions, &mut included)? else {
                return Ok(included);
            };
            if Instant::now() >= deadline {
                // Usually a transaction's commit markers still on their way
                // to the changelog: rejoin and look again (with backoff).
                return Err(Stopped::Failed(
                    Restart::StateBehind {
                        group: self.group.clone(),
                        topic: behind.topic,
                        partition: behind.partition,
                        group_offset: behind.group_offset,
                        included: behind.included.unwrap_or(0),
                    }
                    .into(),
                ));
            }
            tracing::info!(job = %self.job, topic = %behind.topic, partition = behind.partition, group_offset = behind.group_offset,
                included = ?behind.included, "state is behind the group's offsets; waiting for the previous owner's transaction to settle");
            let wake = Instant::now() + BEHIND_RECHECK;
            while Instant::now() < wake {
                if cancelled() {
                    return Err(Stopped::Stale);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Reads the group's committed offsets of `partitions` and compares each
    /// with what the restored state includes (put in `included`). A group
    /// behind the state was rewound: fatal under `exactly_once`. Returns a
    /// partition whose state is behind the group, if one is.
    fn behind_the_group(
        &self,
        partitions: &[(String, i32)],
        included: &mut Included,
    ) -> Result<Option<Behind>, SessionError> {
        let mut wanted = TopicPartitionList::new();
        for (topic, partition) in partitions {
            wanted.add_partition(topic, *partition);
        }
        let committed = super::progress::every_offset_read(
            self.restorer.consumer().committed_offsets(wanted, KAFKA_TIMEOUT)?,
        )?;
        let mut behind = None;
        for element in committed.elements() {
            let (topic, partition) = (element.topic(), element.partition());
            let group_offset = match element.offset() {
                Offset::Offset(offset) => Some(offset),
                _ => None,
            };
            let state = read_offset(&*self.store, &included_key(topic, partition))
                .map_err(SessionError::fatal)?;
            if let Some(state) = state {
                included.push(((topic.to_string(), partition), state));
            }
            match (group_offset, state) {
                (group, Some(state)) if group.unwrap_or(0) < state => {
                    let rewound = KafkaJobError::GroupRewound {
                        job: self.job.clone(),
                        group: self.group.clone(),
                        topic: topic.to_string(),
                        partition,
                        group_offset: group,
                        included: state,
                    };
                    if self.guarantee == Guarantee::ExactlyOnce {
                        return Err(SessionError::Fatal(rewound));
                    }
                    tracing::warn!(job = %self.job, "{rewound} (at_least_once: going on, those records count again)");
                }
                (Some(group_offset), state) if group_offset > state.unwrap_or(0) => {
                    behind.get_or_insert(Behind {
                        topic: topic.to_string(),
                        partition,
                        group_offset,
                        included: state,
                    });
                }
                _ => {}
            }
        }
        Ok(behind)
    }

    /// Refuses partitions whose local state has read the changelog further
    /// than the changelog now reaches: the topic lost records since (it was
    /// deleted and recreated, or truncated), so no other process could
    /// restore that state, and going on would write a changelog that does
    /// not add up. The producer is asked, not the restore consumer: its
    /// `read_uncommitted` end is the log's end, where a `read_committed`
    /// one stops at a transaction still open.
    fn check_changelog_kept(&self, partitions: &[i32]) -> Result<(), SessionError> {
        let changelog = self.restorer.topic();
        for &partition in partitions {
            let checkpoint = read_offset(&*self.store, &checkpoint_key(partition))
                .map_err(SessionError::fatal)?;
            let Some(checkpoint) = checkpoint.filter(|&checkpoint| checkpoint > 0) else {
                continue;
            };
            let (_, end) = self
                .owner
                .producer()
                .client()
                .fetch_watermarks(changelog, partition, KAFKA_TIMEOUT)
                .map_err(|err| {
                    SessionError::from(Restart::ChangelogEnd {
                        changelog: changelog.to_string(),
                        partition,
                        source: err,
                    })
                })?;
            if checkpoint > end {
                return Err(SessionError::Fatal(KafkaJobError::Setup {
                    job: self.job.clone(),
                    source: SetupError::ChangelogLost {
                        changelog: changelog.to_string(),
                        partition,
                        end,
                        checkpoint,
                    },
                }));
            }
        }
        Ok(())
    }
}
