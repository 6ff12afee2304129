//! A bulk load into RocksDB (a Kafka job's restore from its changelog),
//! as Kafka Streams restores: the writes go into `WriteBatch`es of 10,000
//! writes or 4 MiB (each allocated once at the size of the last) that a writer thread
//! writes with the write-ahead log off, so reading the changelog and
//! inserting into the memtable overlap; a checkpoint writes
//! what is left, flushes the state column family (its memtable becomes an
//! SST file, synced) and only then commits the checkpoint, synced.
//!
//! A crash loses the writes not flushed yet, never what a checkpoint
//! claims; writes an automatic flush kept beyond the last checkpoint are
//! loaded again on the next restore, to the same result.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use tally_core::state::{BulkLoad, StateError};

use super::{cf_of, commit_error, commit_meta, STATE_CF};

/// Writes per batch handed to the writer thread.
const BATCH_WRITES: usize = 10_000;
/// Bytes a batch may reach before it is handed over however few writes it
/// holds: state values may be up to a megabyte each, and 10,000 of them
/// must not be held in memory at once.
const BATCH_BYTES: usize = 4 << 20;
/// Batches queued for the writer thread before the loader waits for it.
const QUEUED_BATCHES: usize = 2;

/// What the writer thread is asked to do, in order.
enum Work {
    Write(rocksdb::WriteBatch),
    /// Flush, then commit the metadata, then answer.
    Checkpoint { meta: Vec<(Vec<u8>, Vec<u8>)>, done: mpsc::SyncSender<Result<(), StateError>> },
}

/// [`BulkLoad`] of a [`super::RocksStore`].
pub(super) struct RocksBulkLoad {
    db: Arc<rocksdb::DB>,
    batch: rocksdb::WriteBatch,
    /// Bytes of keys and values since the last checkpoint.
    bytes: usize,
    /// `None` once dropped.
    work: Option<mpsc::SyncSender<Work>>,
    writer: Option<JoinHandle<()>>,
}

impl RocksBulkLoad {
    /// Starts the writer thread of a bulk load into `db`.
    pub(super) fn start(db: Arc<rocksdb::DB>) -> RocksBulkLoad {
        let (work, queue) = mpsc::sync_channel(QUEUED_BATCHES);
        let writer = std::thread::Builder::new()
            .name("tally-restore-writer".into())
            .spawn({
                let db = db.clone();
                move || write_until_closed(&db, &queue)
            })
            .expect("spawning a thread");
        RocksBulkLoad { db, batch: rocksdb::WriteBatch::default(), bytes: 0, work: Some(work), writer: Some(writer) }
    }

    /// Hands `work` to the writer. A writer that is gone (it panicked) is
    /// a bug: say so at the checkpoint.
    fn send(&self, work: Work) -> Result<(), StateError> {
        let gone = || StateError::Commit("the restore's writer thread stopped (a bug: see the log)".into());
        self.work.as_ref().ok_or_else(gone)?.send(work).map_err(|_| gone())
    }

    fn hand_over_batch(&mut self) -> Result<(), StateError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let next = rocksdb::WriteBatch::with_capacity_bytes(self.batch.size_in_bytes());
        let full = std::mem::replace(&mut self.batch, next);
        self.send(Work::Write(full))
    }
}

impl BulkLoad for RocksBulkLoad {
    fn state(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.bytes += key.len() + value.map_or(0, <[u8]>::len);
        let state = cf_of(&self.db, STATE_CF);
        match value {
            Some(value) => self.batch.put_cf(state, key, value),
            None => self.batch.delete_cf(state, key),
        }
        // A failed hand-over means the writer is gone: the checkpoint says so.
        if self.batch.len() >= BATCH_WRITES || self.batch.size_in_bytes() >= BATCH_BYTES {
            let _ = self.hand_over_batch();
        }
    }

    fn buffered_bytes(&self) -> usize {
        self.bytes
    }

    fn checkpoint(&mut self, meta: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StateError> {
        self.hand_over_batch()?;
        let (done, answer) = mpsc::sync_channel(1);
        self.send(Work::Checkpoint { meta: meta.to_vec(), done })?;
        self.bytes = 0;
        answer.recv().unwrap_or_else(|_| Err(StateError::Commit("the restore's writer thread stopped (a bug: see the log)".into())))
    }
}

impl Drop for RocksBulkLoad {
    fn drop(&mut self) {
        self.work = None; // the writer finishes what it holds, then stops
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// The writer thread: writes each batch into the memtable, around the
/// write-ahead log; flushes and commits at each checkpoint.
fn write_until_closed(db: &rocksdb::DB, queue: &mpsc::Receiver<Work>) {
    let mut unlogged = rocksdb::WriteOptions::default();
    unlogged.disable_wal(true);
    // The first failed write fails every later checkpoint of this load.
    let mut failed: Option<String> = None;
    while let Ok(work) = queue.recv() {
        match work {
            Work::Write(batch) => {
                if failed.is_none() {
                    if let Err(err) = db.write_opt(batch, &unlogged) {
                        failed = Some(err.to_string());
                    }
                }
            }
            Work::Checkpoint { meta, done } => {
                let result = match &failed {
                    Some(err) => Err(StateError::Commit(format!("writing restored state failed: {err}").into())),
                    None => db.flush_cf(cf_of(db, STATE_CF)).map_err(commit_error).and_then(|()| commit_meta(db, &meta)),
                };
                let _ = done.send(result);
            }
        }
    }
}
