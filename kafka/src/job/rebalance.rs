//! The consumer's rebalance handler: aborts the in-flight transaction
//! before partitions leave, and takes new partitions paused, for the
//! state updater (`state_updater.rs`) to restore: no record of a partition
//! is delivered before its state is restored and checked.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{ClientContext, TopicPartitionList};

use super::state_updater::{Assignment, Generation};
use super::{Restart, SessionError};
use crate::fetch::Router;
use crate::transaction::TransactionOwner;
use crate::{KafkaJobError, SetupError};
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
    /// Partitions assigned (paused, to restore), the latest assignment's.
    pub(super) assigned: Option<Assignment>,
    pub(super) failure: Option<SessionError>,
}

/// The consumer's rebalance handler: aborts the in-flight transaction
/// before partitions are given up, and assigns new partitions paused.
pub(super) struct Rebalancer {
    /// Routes newly assigned partitions to the job loop's fetch queue.
    pub(super) router: Arc<Router>,
    pub(super) job: String,
    pub(super) inputs: Vec<String>,
    /// The job's transaction owner: a revocation aborts through it.
    pub(super) owner: Arc<TransactionOwner>,
    /// Moved on by every assignment and revocation: the state updater
    /// stops work that went stale.
    pub(super) generation: Arc<Generation>,
    pub(super) events: Mutex<RebalanceEvents>,
}

impl Rebalancer {
    pub(super) fn take_events(&self) -> RebalanceEvents {
        std::mem::take(&mut *lock(&self.events))
    }

    fn note(&self, update: impl FnOnce(&mut RebalanceEvents)) {
        update(&mut lock(&self.events));
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
    /// Replaces rust-rdkafka's default handler, which assigns partitions
    /// fetching: here they are assigned paused, until their state is
    /// restored.
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
                self.generation.advance();
                let _ = consumer.unassign();
            }
        }
    }
}

impl Rebalancer {
    /// Starts fetching the assigned partitions paused, each from the
    /// group's committed offset (or per `auto.offset.reset` where it has
    /// none), and leaves their restore to the state updater: the session
    /// resumes each once its state is restored and checked. Nothing here
    /// waits on the network, so the poll thread stays within
    /// `max.poll.interval.ms` however long a restore takes.
    fn assign(&self, consumer: &BaseConsumer<Self>, partitions: &TopicPartitionList) {
        let generation = self.generation.advance();
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
        let check = self.check_whole_namespaces(&assigned);
        // Paused before any fetch starts: librdkafka applies the pause
        // before the committed offsets it looks up arrive, and the pause
        // drops whatever was fetched before it.
        let failure = consumer
            .assign(partitions)
            .and_then(|()| if assigned.is_empty() { Ok(()) } else { consumer.pause(partitions) })
            .err()
            .map(|source| {
                Restart::Call {
                    doing: "assigning (paused) the partitions the group gave this process",
                    source,
                }
                .into()
            });
        self.note(|events| {
            events.assigned = Some(Assignment { generation, partitions: assigned });
            events.failure = events.failure.take().or(check.err()).or(failure);
        });
    }

    /// Nothing of the in-flight transaction may commit once another
    /// process may own its partitions: abort it, then give them up.
    fn revoke(&self, consumer: &BaseConsumer<Self>) {
        // A restore of these partitions stops at once.
        self.generation.advance();
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
