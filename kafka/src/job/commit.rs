//! The commit in flight: a transaction whose records are sent (phase one,
//! on the job loop) and whose commit point runs on a thread of the
//! session's scope while the next transaction runs, and what it carried,
//! counted once it took effect.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::committer::KafkaCommitError;
use tally_core::observe::RunSummary;

/// A commit whose records are sent and whose Kafka commit runs on a thread
/// of its own.
pub(super) struct InFlight<'scope> {
    /// `None` when there was nothing to commit.
    pub(super) finishing:
        Option<std::thread::ScopedJoinHandle<'scope, (Result<(), KafkaCommitError>, Instant)>>,
    pub(super) done: CommitDone,
}

impl InFlight<'_> {
    pub(super) fn is_finished(&self) -> bool {
        self.finishing.as_ref().is_none_or(|finishing| finishing.is_finished())
    }

    /// Waits for the commit; when it took effect.
    pub(super) fn join(&mut self) -> Result<Instant, KafkaCommitError> {
        match self.finishing.take() {
            None => Ok(Instant::now()),
            Some(finishing) => {
                let (result, finished) =
                    finishing.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                result.map(|()| finished)
            }
        }
    }
}

/// What a transaction carried, counted once its commit takes effect.
pub(super) struct CommitDone {
    pub(super) started: Instant,
    /// Next offset per source id.
    pub(super) positions: BTreeMap<u32, i64>,
    /// First offset per source id it read.
    pub(super) first: HashMap<u32, i64>,
    pub(super) carried: RunSummary,
}
