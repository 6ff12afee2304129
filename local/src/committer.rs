//! Committers make a transaction durable in one step. Local mode's:
//! write and fsync the output bytes, then one RocksDB `WriteBatch` holds the
//! state changes, the input positions and the committed output lengths.
//! A crash before the batch leaves extra output bytes, which recovery cuts
//! off; a crash after it loses nothing.

use std::sync::Arc;

use crate::sink::{Lineage, LocalSink, SinkError};
use crate::source::LocalPosition;
use tally_core::commit::TwoPhaseCommitter;
use tally_core::state::{StateError, StateStore, StoreCommit};
use tally_core::transaction::Transaction;

/// Metadata key prefix of committed input positions (`input/<index>`).
const INPUT_PREFIX: &str = "input/";
/// Metadata key prefix of committed output lengths (`output/<name>`).
const OUTPUT_PREFIX: &str = "output/";

/// A failed commit. Its state and positions were not committed, but some of
/// its output bytes may already be in the files: stop using the committer;
/// reopening the job recovers (cuts those bytes off).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// Writing outputs failed.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// Writing state failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// Committed metadata is unreadable or does not match the job.
    #[error("{0}")]
    Metadata(String),
}

/// What a committer recovered: where to resume reading.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Committed position of each input partition.
    pub positions: Vec<LocalPosition>,
}

/// A committed input position, with the file it belongs to.
#[derive(serde::Serialize, serde::Deserialize)]
struct CommittedInput {
    file: String,
    #[serde(flatten)]
    position: LocalPosition,
}

/// The local-mode committer.
pub struct LocalCommitter {
    store: Arc<dyn StateStore>,
    sink: LocalSink,
    lineage: Lineage,
    output_names: Vec<String>,
}

impl LocalCommitter {
    /// Recovers a local job's outputs and positions from `store`: cuts the
    /// output files to their committed lengths and returns where each input
    /// resumes. Refuses inputs renamed or reordered since the last commit.
    pub fn recover(
        store: Arc<dyn StateStore>,
        output_dir: &std::path::Path,
        output_names: &[String],
        lineage: Lineage,
    ) -> Result<(LocalCommitter, Recovered), CommitError> {
        let lengths = committed_lengths(&*store, output_names)?;
        let committed_inputs = read_indexed(&*store, INPUT_PREFIX, |bytes| {
            serde_json::from_slice::<CommittedInput>(bytes).ok()
        })?;
        if committed_inputs.len() > lineage.partitions.len() {
            return Err(CommitError::Metadata(format!(
                "this state directory has committed positions for {} inputs, but the job names {}; \
                 keep the job's inputs as they were, or use a new state directory",
                committed_inputs.len(),
                lineage.partitions.len()
            )));
        }
        let mut positions = Vec::with_capacity(committed_inputs.len());
        for (index, committed) in committed_inputs.into_iter().enumerate() {
            if committed.file != lineage.partitions[index] {
                return Err(CommitError::Metadata(format!(
                    "input {index} was `{}` when this state was committed, but the job now names `{}` there; \
                     keep the inputs in the same order, or use a new state directory",
                    committed.file, lineage.partitions[index]
                )));
            }
            positions.push(committed.position);
        }
        let sink = LocalSink::open(output_dir, output_names, &lengths)?;
        // Claim new outputs (committed length 0) before writing to them, so a
        // crash before the first commit is recovered like any other.
        let claims: Vec<(Vec<u8>, Vec<u8>)> = output_names
            .iter()
            .zip(&lengths)
            .filter(|(_, len)| len.is_none())
            .map(|(name, _)| (committed_length_key(name), b"0".to_vec()))
            .collect();
        if !claims.is_empty() {
            store.commit(StoreCommit { state: Vec::new(), meta: claims })?;
        }
        let output_names = output_names.to_vec();
        Ok((LocalCommitter { store, sink, lineage, output_names }, Recovered { positions }))
    }

    /// Path of output `index` (the last is the dead-letter output).
    pub fn output_path(&self, index: usize) -> &std::path::Path {
        self.sink.path(index)
    }
}

impl LocalCommitter {
    /// Formats the open transaction's outputs so far (taking them from
    /// `txn`) and writes them ahead of its commit once enough wait; not
    /// when a later record may still replace one (an output emitted
    /// `latest_per_key`).
    pub fn stage(&mut self, txn: &mut Transaction) -> Result<(), CommitError> {
        if !txn.sends_outputs_early() {
            return Ok(());
        }
        self.format(txn);
        self.sink.stage()?;
        Ok(())
    }

    fn format(&mut self, txn: &mut Transaction) {
        if !txn.plugin_digest.is_empty() {
            self.lineage.set_plugin_digest(&txn.plugin_digest);
        }
        self.sink.format(txn.outputs(), txn.dead_letters(), &self.lineage);
        txn.outputs_sent();
    }
}

impl TwoPhaseCommitter for LocalCommitter {
    type Positions = [LocalPosition];
    type Prepared = StoreCommit;
    type Error = CommitError;

    /// Writes and syncs the rest of the transaction's output lines, and
    /// makes the one store batch that will commit it: its state changes,
    /// the input positions and the output files' new lengths. A crash after
    /// this leaves output bytes past the committed lengths, which recovery
    /// cuts off.
    fn prepare(
        &mut self,
        txn: &mut Transaction,
        positions: &[LocalPosition],
    ) -> Result<StoreCommit, CommitError> {
        self.format(txn);
        let lengths = self.sink.sync()?;
        let mut meta = Vec::with_capacity(positions.len() + lengths.len());
        for (index, position) in positions.iter().enumerate() {
            let committed = CommittedInput {
                file: self.lineage.partitions[index].clone(),
                position: *position,
            };
            let value = serde_json::to_vec(&committed).expect("positions serialize");
            meta.push((format!("{INPUT_PREFIX}{index:08}").into_bytes(), value));
        }
        for (name, len) in self.output_names.iter().zip(&lengths) {
            meta.push((committed_length_key(name), len.to_string().into_bytes()));
        }
        Ok(StoreCommit { state: txn.overlay.changes(), meta })
    }

    /// The commit point: one synced store batch. The caller then calls
    /// [`Transaction::committed`].
    fn commit(&self, prepared: StoreCommit) -> Result<(), CommitError> {
        self.store.commit(prepared)?;
        Ok(())
    }

    /// Cuts every output back to the length the store committed: the lines
    /// an aborted transaction staged, or synced in [`Self::prepare`].
    fn abort(&mut self) -> Result<(), CommitError> {
        let lengths = committed_lengths(&*self.store, &self.output_names)?;
        // `recover` claimed every output: each has a committed length.
        let lengths: Vec<u64> = lengths.into_iter().map(Option::unwrap_or_default).collect();
        self.sink.cut_to(&lengths)?;
        Ok(())
    }
}

impl LocalCommitter {
    /// Both phases, then the transaction is emptied: `txn` is committed
    /// with the input `positions`. On error the commit point was not
    /// reached: stop, and reopen the job, which recovers from the last commit.
    pub fn commit_all(
        &mut self,
        txn: &mut Transaction,
        positions: &[LocalPosition],
    ) -> Result<(), CommitError> {
        let prepared = self.prepare(txn, positions)?;
        self.commit(prepared)?;
        txn.committed();
        Ok(())
    }
}

/// The committed length of each of `output_names` (`None`: never claimed).
/// The metadata key under which a job commits output `name`'s length.
pub fn committed_length_key(name: &str) -> Vec<u8> {
    format!("{OUTPUT_PREFIX}{name}").into_bytes()
}

/// A committed output length as stored under [`committed_length_key`].
pub fn parse_committed_length(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok().and_then(|text| text.parse::<u64>().ok())
}

fn committed_lengths(
    store: &dyn StateStore,
    output_names: &[String],
) -> Result<Vec<Option<u64>>, CommitError> {
    let mut committed = std::collections::HashMap::new();
    for (key, value) in store.scan_meta(OUTPUT_PREFIX.as_bytes())? {
        let len = parse_committed_length(&value).ok_or_else(|| damaged(&key))?;
        committed.insert(key[OUTPUT_PREFIX.len()..].to_vec(), len);
    }
    Ok(output_names.iter().map(|name| committed.get(name.as_bytes()).copied()).collect())
}

/// Reads `<prefix><index>` metadata entries in index order.
fn read_indexed<T>(
    store: &dyn StateStore,
    prefix: &str,
    parse: impl Fn(&[u8]) -> Option<T>,
) -> Result<Vec<T>, CommitError> {
    store
        .scan_meta(prefix.as_bytes())?
        .into_iter()
        .map(|(key, value)| parse(&value).ok_or_else(|| damaged(&key)))
        .collect()
}

fn damaged(key: &[u8]) -> CommitError {
    CommitError::Metadata(format!(
        "committed metadata `{}` is unreadable; the state directory is damaged",
        String::from_utf8_lossy(key)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tally_core::commit::conformance::{Backend, KEY, OUTPUT, Visible};
    use tally_core::limits::Limits;
    use tally_core::state::{MemoryStore, StateError};
    use tally_core::transaction::SourcePosition;

    /// A store whose commits fail on demand: the crash window between the
    /// output fsync and the state commit, made deterministic.
    #[derive(Default)]
    struct FailingStore {
        inner: MemoryStore,
        fail_commits: AtomicBool,
    }

    impl StateStore for FailingStore {
        fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
            self.inner.get_many(keys)
        }
        fn get_meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
            self.inner.get_meta(key)
        }
        fn scan_meta(&self, prefix: &[u8]) -> Result<Vec<tally_core::state::Entry>, StateError> {
            self.inner.scan_meta(prefix)
        }
        fn scan_state(&self) -> Result<Vec<tally_core::state::Entry>, StateError> {
            self.inner.scan_state()
        }
        fn commit(&self, commit: StoreCommit) -> Result<(), StateError> {
            if self.fail_commits.load(Ordering::Relaxed) {
                return Err(StateError::Commit("injected failure".into()));
            }
            self.inner.commit(commit)
        }
        fn bulk_load(&self) -> Box<dyn tally_core::state::BulkLoad + '_> {
            Box::new(tally_core::state::CommitEachCheckpoint::new(self))
        }
    }

    fn lineage() -> Lineage {
        Lineage::new("job", vec!["in.ndjson".into()], "sha256:00")
    }

    fn txn_with_one_output(store: Arc<dyn StateStore>, offset: u64) -> Transaction {
        let mut txn = Transaction::new(store, vec!["totals".to_string()].into(), Limits::default());
        txn.begin_batch(std::iter::once(SourcePosition { partition: 0, offset }));
        txn.put_many(vec![(b"k".to_vec(), offset.to_string().into_bytes())]).unwrap();
        txn.emit_many("totals", [(0, None, b"1".to_vec())]).unwrap();
        txn.keep_batch();
        txn
    }

    #[test]
    fn a_commit_that_fails_after_the_output_fsync_is_undone_by_recovery() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FailingStore::default());
        let names = vec!["totals".to_string(), "dead-letters".to_string()];
        let (mut committer, recovered) =
            LocalCommitter::recover(store.clone(), dir.path(), &names, lineage()).unwrap();
        assert!(recovered.positions.is_empty());

        let first = LocalPosition { next_line: 1, byte: 10, last_line: None };
        committer.commit_all(&mut txn_with_one_output(store.clone(), 0), &[first]).unwrap();
        let committed_output = std::fs::read(dir.path().join("totals.ndjson")).unwrap();

        store.fail_commits.store(true, Ordering::Relaxed);
        let second = LocalPosition { next_line: 2, byte: 20, last_line: None };
        let err = committer
            .commit_all(&mut txn_with_one_output(store.clone(), 1), &[second])
            .unwrap_err();
        assert!(err.to_string().contains("injected failure"));
        // The output bytes of the failed commit reached the file...
        assert!(
            std::fs::read(dir.path().join("totals.ndjson")).unwrap().len() > committed_output.len()
        );

        // ...and recovery cuts them, resuming from the first commit.
        store.fail_commits.store(false, Ordering::Relaxed);
        drop(committer);
        let (_, recovered) =
            LocalCommitter::recover(store.clone(), dir.path(), &names, lineage()).unwrap();
        assert_eq!(recovered.positions, vec![first]);
        assert_eq!(std::fs::read(dir.path().join("totals.ndjson")).unwrap(), committed_output);
        assert_eq!(store.get_many(&[b"k"]).unwrap(), vec![Some(b"0".to_vec())]);
    }

    /// Local mode's committer over a real RocksDB store and real files.
    struct LocalBackend {
        dir: tempfile::TempDir,
        store: Arc<dyn StateStore>,
    }

    impl LocalBackend {
        fn new() -> LocalBackend {
            let dir = tempfile::tempdir().unwrap();
            let store = tally_state_rocks::RocksStore::open(&dir.path().join("db")).unwrap();
            LocalBackend { dir, store: Arc::new(store) }
        }
    }

    impl Backend for LocalBackend {
        type Committer = LocalCommitter;

        fn open(&mut self) -> LocalCommitter {
            let names = vec![OUTPUT.to_string(), "dead-letters".to_string()];
            LocalCommitter::recover(self.store.clone(), self.dir.path(), &names, lineage())
                .unwrap()
                .0
        }

        fn transaction(&mut self) -> Transaction {
            Transaction::new(self.store.clone(), vec![OUTPUT.to_string()].into(), Limits::default())
        }

        fn positions<R>(&self, included: u64, with: impl FnOnce(&[LocalPosition]) -> R) -> R {
            with(&[LocalPosition { next_line: included, byte: included * 10, last_line: None }])
        }

        fn visible(&mut self) -> Visible {
            let lines = std::fs::read_to_string(self.dir.path().join("totals.ndjson")).unwrap();
            let outputs = lines
                .lines()
                .map(|line| {
                    let line: serde_json::Value = serde_json::from_str(line).unwrap();
                    line["value"].as_str().expect("a text value").to_string()
                })
                .collect();
            let state = self.store.get_many(&[KEY]).unwrap().remove(0);
            let state = state.map(|value| String::from_utf8(value).unwrap());
            let inputs = read_indexed(&*self.store, INPUT_PREFIX, |bytes| {
                serde_json::from_slice::<CommittedInput>(bytes).ok()
            })
            .unwrap();
            let included = inputs.first().map_or(0, |input| input.position.next_line);
            Visible { outputs, state, included }
        }
    }

    #[test]
    fn the_local_committer_meets_the_committer_conformance_suite() {
        tally_core::commit::conformance::run(LocalBackend::new);
    }
}
