//! The consumer's rebalance handler: aborts the in-flight transaction
//! before partitions leave, restores state before any record of a new
//! partition is delivered, and checks what it restored (whole namespaces,
//! a kept changelog, no rewind of the group's offsets).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::{KAFKA_TIMEOUT, Restart, SessionError};
use crate::changelog::{RestoreError, Restorer, read_offset};
use crate::config::Guarantee;
use crate::fetch::Router;
use crate::keys::{checkpoint_key, included_key};
use crate::transaction::TransactionOwner;
use crate::{KafkaJobError, SetupError};
use tally_core::state::StateStore;
use tally_core::sync::lock;

/// A partition this process got of some inputs but not of all, with an
/// input it lacks.
pub(super) fn split_namespace<'a>(
    inputs: &'a [String],
    assigned: &[(String, i32)],
) -> Option<(i32, &'a str)> {
    let assigned_set: BTreeSet<(&str, i32)> =
        assigned.iter().map(|(topic, partition)| (topic.as_str(), *partition)).collect();
    assigned.iter().find_map(|(_, partition)| {
        let missing =
            inputs.iter().find(|topic| !assigned_set.contains(&(topic.as_str(), *partition)))?;
        Some((*partition, missing.as_str()))
    })
}

/// What happened in rebalance callbacks since the job loop last looked.
#[derive(Default)]
pub(super) struct RebalanceEvents {
    pub(super) revoked: bool,
    pub(super) assigned: bool,
    /// Next input offset the restored state includes, per assigned
    /// `(topic, partition)`.
    pub(super) included: Vec<((String, i32), i64)>,
    pub(super) failure: Option<SessionError>,
}

/// What [`Rebalancer::restore_and_check`] found for the assigned partitions.
#[derive(Default)]
pub(super) struct Checked {
    /// Next input offset the restored state includes, where it has one.
    pub(super) included: Vec<((String, i32), i64)>,
    /// The group's committed offset of every assigned partition.
    pub(super) committed: Vec<((String, i32), Option<i64>)>,
}

/// The consumer's rebalance handler: aborts the in-flight transaction
/// before partitions are given up, and restores state (and checks for a
/// rewind) before any record of a new partition is delivered.
pub(super) struct Rebalancer {
    /// Routes newly assigned partitions to the job loop's fetch queue.
    pub(super) router: Arc<Router>,
    pub(super) job: String,
    pub(super) group: String,
    pub(super) inputs: Vec<String>,
    pub(super) guarantee: Guarantee,
    /// The job's transaction owner: a revocation aborts through it.
    pub(super) owner: Arc<TransactionOwner>,
    pub(super) restorer: Arc<Restorer>,
    pub(super) store: Arc<dyn StateStore>,
    pub(super) settle: Duration,
    /// Where a partition without a committed offset starts (`auto.offset.reset`).
    pub(super) start_without_commit: Offset,
    pub(super) events: Mutex<RebalanceEvents>,
}

impl Rebalancer {
    pub(super) fn take_events(&self) -> RebalanceEvents {
        std::mem::take(&mut *lock(&self.events))
    }

    fn note(&self, update: impl FnOnce(&mut RebalanceEvents)) {
        update(&mut lock(&self.events));
    }

    /// Restores the state of newly assigned partitions, then compares what
    /// it includes with the group's committed offsets.
    fn restore_and_check(&self, assigned: &[(String, i32)]) -> Result<Checked, SessionError> {
        let partitions: Vec<i32> = assigned
            .iter()
            .map(|(_, partition)| *partition)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        self.check_changelog_kept(&partitions)?;
        // Measured from the first restore's end: a long restore does not
        // shorten the wait for a previous owner's transaction to settle.
        let mut deadline = None;
        loop {
            self.restorer.restore(&partitions).map_err(|err| match err {
                RestoreError::Foreign { .. } => SessionError::Fatal(KafkaJobError::Setup {
                    job: self.job.clone(),
                    source: SetupError::ForeignChangelog(err),
                }),
                RestoreError::State(state) => SessionError::fatal(state),
                other => Restart::Restore(other).into(),
            })?;
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.settle);
            let mut wanted = TopicPartitionList::new();
            for (topic, partition) in assigned {
                wanted.add_partition(topic, *partition);
            }
            let committed = super::progress::every_offset_read(
                self.restorer.consumer().committed_offsets(wanted, KAFKA_TIMEOUT)?,
            )?;
            let mut behind = Vec::new();
            let mut checked = Checked::default();
            for element in committed.elements() {
                let (topic, partition) = (element.topic(), element.partition());
                let group_offset = match element.offset() {
                    Offset::Offset(offset) => Some(offset),
                    _ => None,
                };
                checked.committed.push(((topic.to_string(), partition), group_offset));
                let included = read_offset(&*self.store, &included_key(topic, partition))
                    .map_err(SessionError::fatal)?;
                if let Some(included) = included {
                    checked.included.push(((topic.to_string(), partition), included));
                }
                match (group_offset, included) {
                    (group, Some(included)) if group.unwrap_or(0) < included => {
                        let rewound = KafkaJobError::GroupRewound {
                            job: self.job.clone(),
                            group: self.group.clone(),
                            topic: topic.to_string(),
                            partition,
                            group_offset: group,
                            included,
                        };
                        if self.guarantee == Guarantee::ExactlyOnce {
                            return Err(SessionError::Fatal(rewound));
                        }
                        tracing::warn!(job = %self.job, "{rewound} (at_least_once: going on, those records count again)");
                    }
                    (Some(group), included) if group > included.unwrap_or(0) => {
                        behind.push((topic.to_string(), partition, group, included))
                    }
                    _ => {}
                }
            }
            if behind.is_empty() {
                return Ok(checked);
            }
            if Instant::now() >= deadline {
                // Usually a transaction's commit markers still on their way
                // to the changelog: rejoin and look again (with backoff).
                let (topic, partition, group, included) = &behind[0];
                return Err(Restart::StateBehind {
                    group: self.group.clone(),
                    topic: topic.clone(),
                    partition: *partition,
                    group_offset: *group,
                    included: included.unwrap_or(0),
                }
                .into());
            }
            // A transaction of the previous owner is still settling.
            tracing::info!(job = %self.job, ?behind, "state is behind the group's offsets; waiting for the previous owner's transaction to settle");
            std::thread::sleep(Duration::from_millis(500));
        }
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

    /// Partition `p` of every input feeds one state namespace, so a process
    /// must own partition `p` of all inputs or none: otherwise two processes
    /// would write the same state (as when processes of one job subscribe
    /// to different inputs during a rolling change).
    fn check_whole_namespaces(&self, assigned: &[(String, i32)]) -> Result<(), SessionError> {
        match split_namespace(&self.inputs, assigned) {
            None => Ok(()),
            Some((partition, missing)) => Err(SessionError::Fatal(KafkaJobError::Setup {
                job: self.job.clone(),
                source: SetupError::SplitNamespace { partition, missing: missing.to_string() },
            })),
        }
    }
}

impl ClientContext for Rebalancer {
    fn error(&self, error: KafkaError, reason: &str) {
        crate::log_client_error(error, reason);
    }
}

impl ConsumerContext for Rebalancer {
    /// Replaces rust-rdkafka's default handler, which assigns before the
    /// state is restored: here the assignment starts each partition at the
    /// offset the rewind check read, so librdkafka need not fetch it again.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.assign(consumer, partitions)
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.revoke(consumer),
            _ => {
                tracing::warn!(job = %self.job, error = %RDKafkaErrorCode::from(err), "rebalance failed");
                let _ = consumer.unassign();
            }
        }
    }
}

impl Rebalancer {
    /// Restores the assigned partitions' state and checks it against the
    /// group's offsets, then starts fetching them: from the committed
    /// offsets just checked, or per `auto.offset.reset` where the group has
    /// none. No record of a partition reaches the job loop before its state.
    fn assign(&self, consumer: &BaseConsumer<Self>, partitions: &TopicPartitionList) {
        // Every assigned partition's records go to the job loop's fetch queue.
        for element in partitions.elements() {
            self.router.route(consumer, element.topic(), element.partition());
        }
        let assigned: Vec<(String, i32)> = partitions
            .elements()
            .iter()
            .map(|element| (element.topic().to_string(), element.partition()))
            .collect();
        tracing::info!(job = %self.job, ?assigned, "partitions assigned");
        let result = self.check_whole_namespaces(&assigned).and_then(|()| {
            if assigned.is_empty() {
                Ok(Checked::default())
            } else {
                self.restore_and_check(&assigned)
            }
        });
        // After a failure the session ends; the partitions are assigned
        // anyway, with librdkafka's own starting offsets, so the consumer's
        // state stays what librdkafka expects until it is closed.
        let mut start = partitions.clone();
        if let Ok(checked) = &result {
            for ((topic, partition), committed) in &checked.committed {
                let offset = committed.map_or(self.start_without_commit, Offset::Offset);
                let _ = start.set_partition_offset(topic, *partition, offset);
            }
        }
        let assign_failure = consumer.assign(&start).err().map(|source| {
            Restart::Call { doing: "assigning the partitions the group gave this process", source }
                .into()
        });
        self.note(|events| {
            events.assigned = true;
            match result {
                Ok(checked) => events.included = checked.included,
                Err(failure) => events.failure = Some(failure),
            }
            if events.failure.is_none() {
                events.failure = assign_failure;
            }
        });
    }

    /// Nothing of the in-flight transaction may commit once another
    /// process may own its partitions: abort it, then give them up.
    fn revoke(&self, consumer: &BaseConsumer<Self>) {
        let mut failure = None;
        match self.owner.abort() {
            Ok(true) => {
                tracing::info!(job = %self.job, "partitions revoked; the in-flight transaction was aborted")
            }
            Ok(false) => tracing::info!(job = %self.job, "partitions revoked"),
            Err(err) => {
                failure = Some(
                    Restart::Call { doing: "aborting the transaction on revocation", source: err }
                        .into(),
                );
                tracing::info!(job = %self.job, "partitions revoked; aborting the in-flight transaction failed");
            }
        }
        let _ = consumer.unassign();
        self.note(|events| {
            events.revoked = true;
            if failure.is_some() {
                events.failure = failure;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_owned_for_every_input_or_not_at_all() {
        let inputs = vec!["usage".to_string(), "credits".to_string()];
        let both = vec![
            ("usage".to_string(), 0),
            ("credits".to_string(), 0),
            ("usage".to_string(), 2),
            ("credits".to_string(), 2),
        ];
        assert_eq!(split_namespace(&inputs, &both), None);
        let half =
            vec![("usage".to_string(), 0), ("credits".to_string(), 0), ("usage".to_string(), 1)];
        assert_eq!(split_namespace(&inputs, &half), Some((1, "credits")));
    }
}
