//! Two-phase commit: how a driver makes a transaction durable in one step.
//!
//! [`TwoPhaseCommitter::prepare`] puts everything of the transaction where
//! its commit will make it count (output files written and synced; records
//! sent inside a Kafka transaction) without making it count yet;
//! [`TwoPhaseCommitter::commit`] is the commit point. A crash between the
//! two loses nothing and counts nothing twice: recovery drops what was
//! prepared. The split is Kafka Streams' prepare/post commit and Arroyo's
//! two-phase sinks; it lets a driver run `commit` on another thread while
//! the next transaction runs (Kafka mode does). Local mode's and Kafka
//! mode's committers implement it; see `docs/architecture.md`.

use crate::transaction::Transaction;

/// Makes a transaction durable in two phases.
pub trait TwoPhaseCommitter {
    /// Where the inputs stand after the transaction: its commit stores them
    /// with its state and outputs.
    type Positions: ?Sized;
    /// What phase one hands to phase two.
    type Prepared: Send;
    /// A failed phase: the commit point was not reached.
    type Error: std::error::Error;

    /// Phase one: writes or sends everything of `txn` (its outputs, dead
    /// letters and state changes) with the input `positions`, without
    /// making any of it count.
    fn prepare(
        &mut self,
        txn: &mut Transaction,
        positions: &Self::Positions,
    ) -> Result<Self::Prepared, Self::Error>;

    /// Phase two, the commit point: once it returns `Ok`, the transaction
    /// counts, whatever crashes next.
    fn commit(&self, prepared: Self::Prepared) -> Result<(), Self::Error>;

    /// Drops what was written or sent of a transaction that will not
    /// commit; its input is read again from the last commit.
    fn abort(&mut self) -> Result<(), Self::Error>;
}
