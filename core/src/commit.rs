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

/// The behaviour every committer must have, whatever it commits to. A
/// driver's tests call [`conformance::run`] with a [`conformance::Backend`]
/// over real parts (a real store, real files or a real broker): each check
/// commits, aborts or "crashes" (drops the committer between its phases),
/// reopens the committer as a restarted process would, and compares what a
/// reader then sees with what must count.
#[cfg(any(test, feature = "conformance"))]
pub mod conformance {
    use super::TwoPhaseCommitter;
    use crate::transaction::{SourcePosition, Transaction};

    /// The output every check's transactions emit to.
    pub const OUTPUT: &str = "totals";
    /// The state key every check's transactions write.
    pub const KEY: &[u8] = b"k";

    /// What a reader sees of a backend once its committer is reopened: what
    /// counts.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Visible {
        /// The values committed to [`OUTPUT`], in order.
        pub outputs: Vec<String>,
        /// The committed value of [`KEY`].
        pub state: Option<String>,
        /// The committed position: how many input records are included.
        pub included: u64,
    }

    /// A committer under test, with what it commits to.
    pub trait Backend {
        /// The committer.
        type Committer: TwoPhaseCommitter;

        /// Opens the committer as a starting process does, recovering from
        /// (and fencing) whatever an earlier committer left. An earlier one
        /// may still exist: it was dropped without a commit or an abort.
        fn open(&mut self) -> Self::Committer;

        /// A new, empty transaction over the committed state, with the one
        /// output [`OUTPUT`] (and whatever else the backend's driver sets).
        fn transaction(&mut self) -> Transaction;

        /// Calls `with` with the positions meaning "the first `included`
        /// input records are included".
        fn positions<R>(
            &self,
            included: u64,
            with: impl FnOnce(&<Self::Committer as TwoPhaseCommitter>::Positions) -> R,
        ) -> R;

        /// What a reader sees now (only called after [`Backend::open`]).
        fn visible(&mut self) -> Visible;
    }

    /// Runs every check below, each on a fresh backend from `fresh`.
    pub fn run<B: Backend>(mut fresh: impl FnMut() -> B) {
        a_committed_transaction_counts_whole(&mut fresh());
        an_aborted_transaction_counts_nothing(&mut fresh());
        a_crash_after_prepare_loses_nothing_and_counts_nothing(&mut fresh());
        aborts_right_after_commits_count_nothing(&mut fresh());
    }

    /// The value a call of the committer under test must return, or a
    /// failure naming the call and the committer's error.
    fn ok<T, E: std::fmt::Display>(result: Result<T, E>, call: &str) -> T {
        result.unwrap_or_else(|err| panic!("the committer under test failed `{call}`: {err}"))
    }

    /// Transaction `n` (from 1) reads input record `n - 1`, sets [`KEY`] to
    /// `n` and emits `total-n`; it is prepared with `n` records included.
    fn prepare_transaction<B: Backend>(
        backend: &mut B,
        committer: &mut B::Committer,
        n: u64,
    ) -> (Transaction, <B::Committer as TwoPhaseCommitter>::Prepared) {
        let mut txn = backend.transaction();
        txn.begin_batch(std::iter::once(SourcePosition { partition: 0, offset: n - 1 }));
        ok(txn.put_many(vec![(KEY.to_vec(), n.to_string().into_bytes())]), "put_many");
        ok(txn.emit_many(OUTPUT, [(0, None, format!("total-{n}").into_bytes())]), "emit_many");
        txn.keep_batch();
        let prepared = backend.positions(n, |positions| committer.prepare(&mut txn, positions));
        (txn, ok(prepared, "prepare"))
    }

    /// Both phases of transaction `n`.
    fn commit_transaction<B: Backend>(backend: &mut B, committer: &mut B::Committer, n: u64) {
        let (_txn, prepared) = prepare_transaction(backend, committer, n);
        ok(committer.commit(prepared), "commit");
    }

    /// What must be visible once transactions `1..=n` committed.
    fn after(n: u64) -> Visible {
        Visible {
            outputs: (1..=n).map(|i| format!("total-{i}")).collect(),
            state: (n > 0).then(|| n.to_string()),
            included: n,
        }
    }

    /// A committed transaction counts whole, for the committer that
    /// committed it and for every later one: outputs, state and position.
    pub fn a_committed_transaction_counts_whole<B: Backend>(backend: &mut B) {
        let mut committer = backend.open();
        assert_eq!(backend.visible(), after(0), "a new backend shows nothing");
        commit_transaction(backend, &mut committer, 1);
        commit_transaction(backend, &mut committer, 2);
        drop(committer);
        let mut committer = backend.open();
        assert_eq!(backend.visible(), after(2), "two committed transactions, seen after a restart");
        commit_transaction(backend, &mut committer, 3);
        drop(committer);
        backend.open();
        assert_eq!(backend.visible(), after(3), "a third, committed by the restarted committer");
    }

    /// An aborted transaction counts nothing, and the committer goes on.
    pub fn an_aborted_transaction_counts_nothing<B: Backend>(backend: &mut B) {
        let mut committer = backend.open();
        commit_transaction(backend, &mut committer, 1);
        let (_txn, prepared) = prepare_transaction(backend, &mut committer, 2);
        drop(prepared);
        ok(committer.abort(), "abort");
        commit_transaction(backend, &mut committer, 2);
        drop(committer);
        backend.open();
        assert_eq!(
            backend.visible(),
            after(2),
            "the aborted transaction left nothing; its retry counts once"
        );
    }

    /// Aborts that follow commits at once (while a Kafka coordinator may
    /// still be writing the commit's markers) count nothing, and the
    /// committer goes on each time.
    pub fn aborts_right_after_commits_count_nothing<B: Backend>(backend: &mut B) {
        const ROUNDS: u64 = 50;
        let mut committer = backend.open();
        for n in 1..=ROUNDS {
            commit_transaction(backend, &mut committer, n);
            let (_txn, prepared) = prepare_transaction(backend, &mut committer, n + 1);
            drop(prepared);
            ok(committer.abort(), "abort");
        }
        drop(committer);
        backend.open();
        assert_eq!(backend.visible(), after(ROUNDS), "no aborted transaction left anything");
    }

    /// A committer dropped between its phases (a crash) loses nothing
    /// committed, and nothing of the prepared transaction counts: not when
    /// the next process opens, and not twice once that process commits it.
    pub fn a_crash_after_prepare_loses_nothing_and_counts_nothing<B: Backend>(backend: &mut B) {
        let mut committer = backend.open();
        commit_transaction(backend, &mut committer, 1);
        let (_txn, prepared) = prepare_transaction(backend, &mut committer, 2);
        std::mem::forget(prepared);
        drop(committer);
        let mut committer = backend.open();
        assert_eq!(backend.visible(), after(1), "the prepared transaction did not count");
        commit_transaction(backend, &mut committer, 2);
        drop(committer);
        backend.open();
        assert_eq!(backend.visible(), after(2), "its retry counts once");
    }
}
