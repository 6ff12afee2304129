//! A bulk load into RocksDB (a Kafka job's restore from its changelog) by
//! SST files, around the memtable and the write-ahead log: the loader
//! copies each write into a [`Chunk`] (one buffer of keys and values, one
//! index), and a writer thread sorts each full chunk by key, writes it as
//! an SST file in the store's `bulk-load` directory and ingests the file
//! into the state column family. Reading the changelog and building files
//! overlap; chunk buffers go back to the loader, so they are allocated
//! once.
//!
//! A checkpoint follows the chunks before it through the same queue: the
//! writer commits it (synced) once they are ingested (an ingested file is
//! synced, and so is the manifest that names it). The loader does not
//! wait for that; [`BulkLoad::finish`] does. A crash loses the chunks not
//! ingested and the checkpoints not committed, never a write a committed
//! checkpoint claims; chunks ingested beyond the last checkpoint are
//! loaded again on the next restore, to the same result (a file ingested
//! later wins over one ingested earlier).

use std::path::Path;
use std::sync::mpsc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tally_core::state::{BulkLoad, StateError};

use super::{cf_of, commit_meta, STATE_CF};

/// When a chunk is full.
#[derive(Debug, Clone, Copy)]
pub(super) struct ChunkLimits {
    /// Bytes of keys and values: bounds the memory of the chunks (the one
    /// filling, the queued ones, the one being written) whatever the size
    /// of the state's values.
    pub bytes: usize,
    /// Writes: bounds the index, whatever the size of the state's keys.
    pub writes: usize,
}

impl ChunkLimits {
    /// 16 MiB or 512 Ki writes: large enough that a million restored keys
    /// make a handful of files, small enough that the last chunk (the one
    /// the loader waits for) takes a fraction of a second.
    pub(super) const DEFAULT: ChunkLimits = ChunkLimits { bytes: 16 << 20, writes: 512 << 10 };
}

/// Full chunks queued for the writer before the loader waits for it.
const QUEUED_CHUNKS: usize = 1;

/// Where in a chunk's buffer one write is.
#[derive(Debug, Clone, Copy)]
struct Write {
    at: u32,
    key_len: u32,
    /// `None` for a delete.
    value_len: Option<u32>,
}

/// Writes in the order they were loaded: keys and values in one buffer.
struct Chunk {
    data: Vec<u8>,
    writes: Vec<Write>,
}

impl Chunk {
    fn with_limits(limits: ChunkLimits) -> Chunk {
        Chunk { data: Vec::with_capacity(limits.bytes), writes: Vec::with_capacity(limits.writes) }
    }

    /// Whether a write of `len` bytes must go into the next chunk.
    fn is_full_for(&self, len: usize, limits: ChunkLimits) -> bool {
        !self.writes.is_empty() && (self.data.len() + len > limits.bytes || self.writes.len() >= limits.writes)
    }

    fn push(&mut self, key: &[u8], value: Option<&[u8]>) {
        // A chunk is handed over well before 4 GiB, and no single key or
        // value comes near it (Kafka's records are at most 2 GiB).
        let at = u32::try_from(self.data.len()).expect("a chunk holds less than 4 GiB");
        self.data.extend_from_slice(key);
        let value_len = value.map(|value| {
            self.data.extend_from_slice(value);
            value.len() as u32
        });
        self.writes.push(Write { at, key_len: key.len() as u32, value_len });
    }

    fn key<'d>(data: &'d [u8], write: &Write) -> &'d [u8] {
        &data[write.at as usize..][..write.key_len as usize]
    }

    fn value<'d>(data: &'d [u8], write: &Write) -> Option<&'d [u8]> {
        let start = write.at as usize + write.key_len as usize;
        write.value_len.map(|len| &data[start..][..len as usize])
    }

    fn clear(&mut self) {
        self.data.clear();
        self.writes.clear();
    }
}

/// What the writer thread is asked to do, in order.
enum Work {
    Ingest(Chunk),
    /// Commit this metadata (every chunk before it is ingested).
    Checkpoint(Vec<(Vec<u8>, Vec<u8>)>),
    /// Answer once everything before is done.
    Finish(mpsc::SyncSender<()>),
}

/// The first failure of a load: every later checkpoint reports it.
type Failure = Arc<Mutex<Option<String>>>;

/// Checkpoints the writer has committed.
type Committed = Arc<AtomicU64>;

fn fail(failure: &Failure, why: String) {
    failure.lock().expect("failure lock").get_or_insert(why);
}

/// [`BulkLoad`] of a [`super::RocksStore`].
pub(super) struct RocksBulkLoad {
    chunk: Chunk,
    limits: ChunkLimits,
    /// Bytes of keys and values since the last checkpoint.
    bytes: usize,
    /// `None` once dropped.
    work: Option<mpsc::SyncSender<Work>>,
    /// Emptied chunks, back from the writer.
    emptied: mpsc::Receiver<Chunk>,
    failure: Failure,
    committed: Committed,
    writer: Option<JoinHandle<()>>,
}

impl RocksBulkLoad {
    /// Starts the writer thread of a bulk load into `db`, its files in
    /// `db`'s `bulk-load` directory (emptied first: what a crash left).
    pub(super) fn start(db: Arc<rocksdb::DB>, limits: ChunkLimits) -> RocksBulkLoad {
        let (work, queue) = mpsc::sync_channel(QUEUED_CHUNKS);
        let (give_back, emptied) = mpsc::sync_channel(QUEUED_CHUNKS + 1);
        let failure = Failure::default();
        let files = db.path().join("bulk-load");
        if let Err(err) = empty_directory(&files) {
            fail(&failure, format!("preparing `{}` for the restore's files failed: {err}", files.display()));
        }
        let committed = Committed::default();
        let writer = std::thread::Builder::new()
            .name("tally-restore-writer".into())
            .spawn({
                let (failure, committed) = (failure.clone(), committed.clone());
                move || write_until_closed(&db, &files, &queue, &give_back, &failure, &committed)
            })
            .expect("spawning a thread");
        let chunk = Chunk::with_limits(limits);
        RocksBulkLoad { chunk, limits, bytes: 0, work: Some(work), emptied, failure, committed, writer: Some(writer) }
    }

    /// Hands `work` to the writer; a writer that is gone (it panicked) is
    /// a bug, reported at the next checkpoint.
    fn send(&self, work: Work) {
        let sent = self.work.as_ref().is_some_and(|queue| queue.send(work).is_ok());
        if !sent {
            fail(&self.failure, "the restore's writer thread stopped (a bug: see the log)".into());
        }
    }

    fn hand_over_chunk(&mut self) {
        if self.chunk.writes.is_empty() {
            return;
        }
        let next = self.emptied.try_recv().unwrap_or_else(|_| Chunk::with_limits(self.limits));
        let full = std::mem::replace(&mut self.chunk, next);
        self.send(Work::Ingest(full));
    }

    fn failed(&self) -> Result<(), StateError> {
        match self.failure.lock().expect("failure lock").as_ref() {
            Some(why) => Err(StateError::Commit(why.clone().into())),
            None => Ok(()),
        }
    }
}

impl BulkLoad for RocksBulkLoad {
    fn state(&mut self, key: &[u8], value: Option<&[u8]>) {
        let len = key.len() + value.map_or(0, <[u8]>::len);
        self.bytes += len;
        if self.chunk.is_full_for(len, self.limits) {
            self.hand_over_chunk();
        }
        self.chunk.push(key, value);
    }

    fn buffered_bytes(&self) -> usize {
        self.bytes
    }

    fn checkpoint(&mut self, meta: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StateError> {
        self.failed()?;
        self.hand_over_chunk();
        self.send(Work::Checkpoint(meta.to_vec()));
        self.bytes = 0;
        Ok(())
    }

    fn durable_checkpoints(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    fn finish(&mut self) -> Result<(), StateError> {
        let (done, answer) = mpsc::sync_channel(1);
        self.send(Work::Finish(done));
        if answer.recv().is_err() {
            fail(&self.failure, "the restore's writer thread stopped (a bug: see the log)".into());
        }
        self.failed()
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

/// Removes what `dir` holds, creating it if needed.
fn empty_directory(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
        _ => {}
    }
    std::fs::create_dir_all(dir)
}

/// The writer thread: ingests each chunk as an SST file, commits each
/// checkpoint after the chunks before it. After the first failure it only
/// empties chunks (the failure fails every later checkpoint).
fn write_until_closed(db: &rocksdb::DB, dir: &Path, queue: &mpsc::Receiver<Work>, give_back: &mpsc::SyncSender<Chunk>, failure: &Failure, committed: &Committed) {
    let options = rocksdb::Options::default(); // the state column family's
    let mut ingest = rocksdb::IngestExternalFileOptions::default();
    ingest.set_move_files(true);
    let mut files = 0u64;
    let ok = || failure.lock().expect("failure lock").is_none();
    while let Ok(work) = queue.recv() {
        match work {
            Work::Ingest(mut chunk) => {
                if ok() {
                    files += 1;
                    let path = dir.join(format!("chunk-{files}.sst"));
                    if let Err(err) = ingest_chunk(db, &options, &ingest, &mut chunk, &path) {
                        fail(failure, format!("writing restored state into `{}` failed: {err}", path.display()));
                    }
                    let _ = std::fs::remove_file(&path); // moved into the store, unless ingesting failed
                }
                chunk.clear();
                let _ = give_back.try_send(chunk);
            }
            Work::Checkpoint(meta) => {
                if ok() {
                    match commit_meta(db, &meta) {
                        Ok(()) => _ = committed.fetch_add(1, Ordering::Release),
                        Err(err) => fail(failure, format!("committing a restore checkpoint failed: {err}")),
                    }
                }
            }
            Work::Finish(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Sorts `chunk` by key (a later write of a key after an earlier one),
/// writes the last write of each key into an SST file at `path` and
/// ingests it into the state column family.
fn ingest_chunk(db: &rocksdb::DB, options: &rocksdb::Options, ingest: &rocksdb::IngestExternalFileOptions, chunk: &mut Chunk, path: &Path) -> Result<(), rocksdb::Error> {
    let Chunk { data, writes } = chunk;
    writes.sort_unstable_by(|a, b| Chunk::key(data, a).cmp(Chunk::key(data, b)).then(a.at.cmp(&b.at)));
    let mut file = rocksdb::SstFileWriter::create(options);
    file.open(path)?;
    for (n, write) in writes.iter().enumerate() {
        let key = Chunk::key(data, write);
        if writes.get(n + 1).is_some_and(|next| Chunk::key(data, next) == key) {
            continue; // a later write of this key wins
        }
        match Chunk::value(data, write) {
            Some(value) => file.put(key, value)?,
            None => file.delete(key)?,
        }
    }
    file.finish()?;
    db.ingest_external_file_cf_opts(cf_of(db, STATE_CF), ingest, vec![path])
}
