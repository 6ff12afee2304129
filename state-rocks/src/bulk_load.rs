//! A bulk load into RocksDB (a Kafka job's restore from its changelog) by
//! SST files, around the memtable and the write-ahead log: the loader
//! copies each write into a [`Chunk`] (one buffer of keys and values, one
//! index); a writer thread sorts each full chunk as it comes (and lays
//! its bytes out in key order, so what follows reads memory in order),
//! merges every few sorted chunks into one SST file in the store's
//! `bulk-load` directory and ingests the file into the state column
//! family. Reading
//! the changelog and sorting overlap; chunk buffers go back to the loader,
//! so they are allocated a few times, not once per chunk.
//!
//! A checkpoint follows the chunks before it through the same queue: the
//! writer writes their file and commits the checkpoint (synced) once the
//! file is ingested (an ingested file is synced, and so is the manifest
//! that names it). The loader does not wait for that;
//! [`BulkLoad::finish`] does. A crash loses the chunks not ingested and
//! the checkpoints not committed, never a write a committed checkpoint
//! claims; files ingested beyond the last checkpoint are loaded again on
//! the next restore, to the same result (a file ingested later wins over
//! one ingested earlier).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tally_core::state::{BulkLoad, StateError};

use super::{STATE_CF, cf_of, commit_meta, state_options};
use tally_core::sync::lock;

/// When a chunk is full, and how many make a file.
#[derive(Debug, Clone, Copy)]
pub(super) struct ChunkLimits {
    /// Bytes of keys and values: with `chunks_per_file`, bounds the memory
    /// of the chunks (the one filling, the queued one, the sorted ones
    /// waiting for their file) whatever the size of the state's values.
    pub bytes: usize,
    /// Writes: bounds the index, whatever the size of the state's keys.
    pub writes: usize,
    /// Sorted chunks merged into one SST file (fewer at a checkpoint).
    pub chunks_per_file: usize,
    /// Writes from which a file is built as two, of two key ranges, on
    /// two threads (the last file of a restore is built after the last
    /// read, while nothing else runs).
    pub split_writes: usize,
}

impl ChunkLimits {
    /// Chunks of 16 MiB or 256 Ki writes, sorted as they come (so sorting
    /// overlaps reading the changelog), at most five to a file; each
    /// checkpoint cuts a file too, so at the restore's default of one
    /// checkpoint per 64 MiB the files are the 64 MiB between checkpoints
    /// (five chunks leave room for the part of a chunk before the
    /// checkpoint, which would otherwise make a small file of its own).
    /// The files overlap each other (a changelog is in no key order), so
    /// RocksDB compacts them together once four are in its level 0:
    /// large files keep that rare (with files of 32 MiB, a 3 M-key restore
    /// used 2.8–3.8 CPU s against 2.4 with 64 MiB ones). At most seven
    /// chunks are held (the one filling, the one queued, five sorted),
    /// and the writer's spare buffer: about 190 MiB with their indexes.
    /// Files of 64 Ki writes or more are built in two halves at once.
    pub(super) const DEFAULT: ChunkLimits = ChunkLimits {
        bytes: 16 << 20,
        writes: 256 << 10,
        chunks_per_file: 5,
        split_writes: 64 << 10,
    };
}

/// Full chunks queued for the writer before the loader waits for it.
const QUEUED_CHUNKS: usize = 1;

/// Where in a chunk's buffer one write is.
#[derive(Debug, Clone, Copy)]
struct Write {
    at: u32,
    /// Its place among the chunk's writes, in the order they came: orders
    /// writes of one key (`at` cannot: a delete of an empty key takes no
    /// bytes, so the write after it starts at the same place).
    seq: u32,
    key_len: u32,
    /// `None` for a delete.
    value_len: Option<u32>,
    /// Eight bytes of the key (big-endian, zero-padded) from the depth
    /// being sorted, and how many of them are the key's: comparing the
    /// pair orders keys as their bytes do, without reading the keys.
    word: u64,
    word_len: u8,
}

impl Write {
    /// Its key, in its chunk's `data`.
    fn key<'d>(&self, data: &'d [u8]) -> &'d [u8] {
        &data[self.at as usize..][..self.key_len as usize]
    }

    /// Its value (`None`: a delete), in its chunk's `data`.
    fn value<'d>(&self, data: &'d [u8]) -> Option<&'d [u8]> {
        let start = self.at as usize + self.key_len as usize;
        self.value_len.map(|len| &data[start..][..len as usize])
    }

    fn load_word(&mut self, key: &[u8], depth: usize) {
        let rest = key.get(depth..).unwrap_or_default();
        let len = rest.len().min(8);
        let mut bytes = [0u8; 8];
        bytes[..len].copy_from_slice(&rest[..len]);
        self.word = u64::from_be_bytes(bytes);
        self.word_len = len as u8;
    }
}

/// Key bytes sorted eight at a time before the rest of a run of keys that
/// share them is sorted by comparison: bounds the sort's recursion
/// whatever the keys.
const WORD_SORTED_BYTES: usize = 256;

/// Sorts `writes` (whose keys share their first `depth` bytes) by key, a
/// later write of a key after an earlier one: sorts by the next eight key
/// bytes, held in each write, then each run that shares them by the
/// eight after (keys that share long prefixes, like a job's namespaced
/// state keys, are not compared byte by byte again and again).
fn sort_writes(data: &[u8], writes: &mut [Write], depth: usize) {
    if writes.len() < 2 {
        return;
    }
    if depth >= WORD_SORTED_BYTES {
        writes.sort_unstable_by(|a, b| a.key(data).cmp(b.key(data)).then(a.seq.cmp(&b.seq)));
        return;
    }
    for write in writes.iter_mut() {
        write.load_word(write.key(data), depth);
    }
    writes.sort_unstable_by_key(|write| (write.word, write.word_len));
    let mut start = 0;
    while start < writes.len() {
        let shared = (writes[start].word, writes[start].word_len);
        let end = start
            + writes[start..]
                .iter()
                .position(|write| (write.word, write.word_len) != shared)
                .unwrap_or(writes.len() - start);
        let run = &mut writes[start..end];
        if shared.1 == 8 {
            sort_writes(data, run, depth + 8); // the keys may go on
        } else {
            run.sort_unstable_by_key(|write| write.seq); // the same key: in the order written
        }
        start = end;
    }
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

    fn unallocated() -> Chunk {
        Chunk { data: Vec::new(), writes: Vec::new() }
    }

    /// Whether a write of `len` bytes must go into the next chunk.
    fn is_full_for(&self, len: usize, limits: ChunkLimits) -> bool {
        !self.writes.is_empty()
            && (self.data.len() + len > limits.bytes || self.writes.len() >= limits.writes)
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
        let seq = self.writes.len() as u32; // fewer than `ChunkLimits::writes`
        self.writes.push(Write {
            at,
            seq,
            key_len: key.len() as u32,
            value_len,
            word: 0,
            word_len: 0,
        });
    }

    /// Orders the writes by key, a later write of a key after an earlier
    /// one, and lays their bytes out in that order (through `spare`, which
    /// gets the old buffer back): merging and building files then read
    /// memory in order instead of jumping about a 16 MiB buffer.
    fn sort(&mut self, spare: &mut Vec<u8>) {
        sort_writes(&self.data, &mut self.writes, 0);
        spare.clear();
        spare.reserve(self.data.len());
        for write in &mut self.writes {
            let start = write.at as usize;
            let end = start + write.key_len as usize + write.value_len.unwrap_or(0) as usize;
            write.at = spare.len() as u32;
            spare.extend_from_slice(&self.data[start..end]);
        }
        std::mem::swap(&mut self.data, spare);
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

/// Why a load fails when its writer thread is gone (it panicked).
const WRITER_GONE: &str = "the restore's writer thread stopped (a bug: see the log)";

/// The first failure of a load: every later checkpoint reports it.
type Failure = Arc<Mutex<Option<String>>>;

/// Checkpoints the writer has committed.
type Committed = Arc<AtomicU64>;

fn fail(failure: &Failure, why: String) {
    lock(failure).get_or_insert(why);
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
        let (give_back, emptied) = mpsc::sync_channel(limits.chunks_per_file + QUEUED_CHUNKS);
        let failure = Failure::default();
        let files = db.path().join("bulk-load");
        if let Err(err) = empty_directory(&files) {
            fail(
                &failure,
                format!("preparing `{}` for the restore's files failed: {err}", files.display()),
            );
        }
        let committed = Committed::default();
        let writer = std::thread::Builder::new()
            .name("tally-restore-writer".into())
            .spawn({
                let (failure, committed) = (failure.clone(), committed.clone());
                move || {
                    write_until_closed(
                        &db, &files, limits, &queue, &give_back, &failure, &committed,
                    )
                }
            })
            .expect("spawning a thread");
        let chunk = Chunk::with_limits(limits);
        RocksBulkLoad {
            chunk,
            limits,
            bytes: 0,
            work: Some(work),
            emptied,
            failure,
            committed,
            writer: Some(writer),
        }
    }

    /// Hands `work` to the writer; a writer that is gone (it panicked) is
    /// a bug, reported at the next checkpoint.
    fn send(&self, work: Work) {
        let sent = self.work.as_ref().is_some_and(|queue| queue.send(work).is_ok());
        if !sent {
            fail(&self.failure, WRITER_GONE.into());
        }
    }

    fn hand_over_chunk(&mut self) {
        if self.chunk.writes.is_empty() {
            return;
        }
        // The next chunk is taken after the hand-over, which may wait for
        // the writer to give one back: no more chunks than the limits say.
        let full = std::mem::replace(&mut self.chunk, Chunk::unallocated());
        self.send(Work::Ingest(full));
        self.chunk = self.emptied.try_recv().unwrap_or_else(|_| Chunk::with_limits(self.limits));
    }

    fn failed(&self) -> Result<(), StateError> {
        match lock(&self.failure).as_ref() {
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
            fail(&self.failure, WRITER_GONE.into());
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

/// The writer thread: sorts each chunk as it comes, merges every
/// `chunks_per_file` sorted chunks into one SST file and ingests it;
/// commits each checkpoint once the chunks before it are ingested. After
/// the first failure it only empties chunks (the failure fails every later
/// checkpoint).
fn write_until_closed(
    db: &rocksdb::DB,
    dir: &Path,
    limits: ChunkLimits,
    queue: &mpsc::Receiver<Work>,
    give_back: &mpsc::SyncSender<Chunk>,
    failure: &Failure,
    committed: &Committed,
) {
    let mut files = Files {
        db,
        dir,
        options: state_options(),
        ingest: rocksdb::IngestExternalFileOptions::default(),
        split_writes: limits.split_writes,
        written: 0,
    };
    files.ingest.set_move_files(true);
    let mut sorted: Vec<Chunk> = Vec::with_capacity(limits.chunks_per_file);
    let mut spare = Vec::new();
    let ok = || lock(failure).is_none();
    let mut write_file = |sorted: &mut Vec<Chunk>| {
        if ok()
            && !sorted.is_empty()
            && let Err(why) = files.write(sorted)
        {
            fail(failure, why);
        }
        for mut chunk in sorted.drain(..) {
            chunk.clear();
            let _ = give_back.try_send(chunk);
        }
    };
    while let Ok(work) = queue.recv() {
        match work {
            Work::Ingest(mut chunk) => {
                if ok() {
                    chunk.sort(&mut spare); // after a failure, chunks are only given back
                }
                sorted.push(chunk);
                if sorted.len() >= limits.chunks_per_file {
                    write_file(&mut sorted);
                }
            }
            Work::Checkpoint(meta) => {
                write_file(&mut sorted);
                if ok() {
                    match commit_meta(db, &meta) {
                        Ok(()) => _ = committed.fetch_add(1, Ordering::Release),
                        Err(err) => {
                            fail(failure, format!("committing a restore checkpoint failed: {err}"))
                        }
                    }
                }
            }
            Work::Finish(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// The SST files of one load, ingested into the state column family.
struct Files<'d> {
    db: &'d rocksdb::DB,
    dir: &'d Path,
    /// The state column family's.
    options: rocksdb::Options,
    ingest: rocksdb::IngestExternalFileOptions,
    split_writes: usize,
    written: u64,
}

impl Files<'_> {
    /// Merges `sorted` chunks into one file, or two of two key ranges at
    /// once, and ingests them (in one step: they do not overlap).
    fn write(&mut self, sorted: &[Chunk]) -> Result<(), String> {
        let runs: Vec<Run<'_>> = sorted.iter().map(Run::of).collect();
        let ranges = split_in_two(&runs, self.split_writes);
        let paths: Vec<PathBuf> = ranges
            .iter()
            .map(|_| {
                self.written += 1;
                self.dir.join(format!("restore-{}.sst", self.written))
            })
            .collect();
        let options = &self.options;
        let built = std::thread::scope(|scope| {
            let others: Vec<_> = ranges[1..]
                .iter()
                .zip(&paths[1..])
                .map(|(runs, path)| scope.spawn(move || build_file(options, runs, path)))
                .collect();
            let first = build_file(options, &ranges[0], &paths[0]);
            others.into_iter().fold(first, |built, other| {
                built.and(other.join().unwrap_or_else(|_| Err(SPLIT_BUILDER_GONE.into())))
            })
        });
        let result = built.and_then(|()| {
            let ingest = self.db.ingest_external_file_cf_opts(
                cf_of(self.db, STATE_CF),
                &self.ingest,
                paths.iter().collect(),
            );
            ingest.map_err(|err| {
                format!("ingesting restored state from `{}` failed: {err}", self.dir.display())
            })
        });
        for path in &paths {
            let _ = std::fs::remove_file(path); // moved into the store, unless ingesting failed
        }
        result
    }
}

/// Why a file fails when the thread building its upper key range is gone.
const SPLIT_BUILDER_GONE: &str =
    "the thread building half of a restore's file stopped (a bug: see the log)";

/// Merges `runs` into a new SST file at `path`.
fn build_file(options: &rocksdb::Options, runs: &[Run<'_>], path: &Path) -> Result<(), String> {
    let mut file = rocksdb::SstFileWriter::create(options);
    let built =
        file.open(path).and_then(|()| merge_into(runs, &mut file)).and_then(|()| file.finish());
    built.map_err(|err| format!("writing restored state into `{}` failed: {err}", path.display()))
}

/// Some sorted writes of one chunk.
#[derive(Clone, Copy)]
struct Run<'c> {
    data: &'c [u8],
    writes: &'c [Write],
}

impl<'c> Run<'c> {
    fn of(chunk: &'c Chunk) -> Run<'c> {
        Run { data: &chunk.data, writes: &chunk.writes }
    }

    fn key(&self, n: usize) -> Option<&'c [u8]> {
        self.writes.get(n).map(|write| write.key(self.data))
    }

    /// This run's writes of keys below `key`, and the rest.
    fn split_at_key(&self, key: &[u8]) -> (Run<'c>, Run<'c>) {
        let at = self.writes.partition_point(|write| write.key(self.data) < key);
        let (low, high) = self.writes.split_at(at);
        (Run { writes: low, ..*self }, Run { writes: high, ..*self })
    }
}

/// `runs` as one key range, or as two (every write of a key in the same
/// one) when they hold `split_writes` writes or more: split at the middle
/// key of the longest run.
fn split_in_two<'c>(runs: &[Run<'c>], split_writes: usize) -> Vec<Vec<Run<'c>>> {
    let whole = vec![runs.to_vec()];
    if runs.iter().map(|run| run.writes.len()).sum::<usize>() < split_writes {
        return whole;
    }
    let Some(longest) = runs.iter().max_by_key(|run| run.writes.len()) else { return whole };
    let Some(middle) = longest.key(longest.writes.len() / 2) else { return whole };
    let (low, high): (Vec<Run<'c>>, Vec<Run<'c>>) =
        runs.iter().map(|run| run.split_at_key(middle)).unzip();
    if low.iter().all(|run| run.writes.is_empty()) {
        return whole; // every key is the middle one or above it
    }
    vec![low, high]
}

/// Writes the last write of each key of `runs` (each sorted; a later
/// run's writes came after an earlier one's) into `file`, in key order.
fn merge_into(
    runs: &[Run<'_>],
    file: &mut rocksdb::SstFileWriter<'_>,
) -> Result<(), rocksdb::Error> {
    let mut heads = vec![0usize; runs.len()];
    // The runs whose next write is of the least key.
    let mut holders = Vec::with_capacity(runs.len());
    loop {
        let mut least: Option<&[u8]> = None;
        holders.clear();
        for (n, run) in runs.iter().enumerate() {
            let Some(key) = run.key(heads[n]) else { continue };
            match least.map(|least| key.cmp(least)) {
                None | Some(std::cmp::Ordering::Less) => {
                    least = Some(key);
                    holders.clear();
                    holders.push(n);
                }
                Some(std::cmp::Ordering::Equal) => holders.push(n),
                Some(std::cmp::Ordering::Greater) => {}
            }
        }
        let Some(key) = least else { return Ok(()) };
        for &n in &holders {
            heads[n] += 1;
            while runs[n].key(heads[n]) == Some(key) {
                heads[n] += 1;
            }
        }
        // The latest write of the key: the last one in the latest run holding it.
        let latest = *holders.last().expect("the least key has a holder");
        let write = runs[latest].writes[heads[latest] - 1];
        match write.value(runs[latest].data) {
            Some(value) => file.put(key, value)?,
            None => file.delete(key)?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys made to trip a sort by words: zero bytes, prefixes of each
    /// other, repeats, and runs sharing more than [`WORD_SORTED_BYTES`].
    fn awkward_keys() -> Vec<Vec<u8>> {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        (0..6_000)
            .map(|n| {
                let mut key = if n % 7 == 0 {
                    vec![b'x'; WORD_SORTED_BYTES + (next() % 20) as usize]
                } else {
                    Vec::new()
                };
                let len = (next() % 20) as usize;
                key.extend((0..len).map(|_| [0x00, 0x01, b'a', 0xff][(next() % 4) as usize]));
                key
            })
            .collect()
    }

    #[test]
    fn a_file_splits_into_two_key_ranges_that_share_no_key() {
        let limits =
            ChunkLimits { bytes: 1 << 20, writes: 1 << 20, chunks_per_file: 3, split_writes: 100 };
        let keys = awkward_keys();
        // The key a split of the longest chunk's would be at: in every chunk.
        let middle = {
            let mut sorted = keys.clone();
            sorted.sort();
            sorted[keys.len() / 2].clone()
        };
        // Three sorted chunks of different lengths, sharing many keys.
        let chunks: Vec<Chunk> = [(0, 6_000), (1_000, 2_500), (3_000, 3_300)]
            .into_iter()
            .map(|(from, to)| {
                let mut chunk = Chunk::with_limits(limits);
                for key in &keys[from..to] {
                    chunk.push(key, None);
                }
                if from > 0 {
                    chunk.push(&middle, None);
                }
                chunk.sort(&mut Vec::new());
                chunk
            })
            .collect();
        let runs: Vec<Run<'_>> = chunks.iter().map(Run::of).collect();
        let keys_of = |runs: &[Run<'_>]| -> Vec<Vec<u8>> {
            let mut keys: Vec<Vec<u8>> = runs
                .iter()
                .flat_map(|run| run.writes.iter().map(|write| write.key(run.data).to_vec()))
                .collect();
            keys.sort();
            keys
        };
        let ranges = split_in_two(&runs, limits.split_writes);
        assert_eq!(ranges.len(), 2, "6,000 writes or more make two files");
        let (low, high) = (keys_of(&ranges[0]), keys_of(&ranges[1]));
        assert!(
            low.last() < high.first(),
            "every key of the lower range is below every key of the upper one"
        );
        assert_eq!([low, high].concat(), keys_of(&runs), "no write is lost or doubled");
        assert_eq!(
            split_in_two(&runs[2..], 302).len(),
            1,
            "fewer writes than `split_writes` make one file"
        );
    }

    #[test]
    fn sorting_by_words_orders_writes_as_their_key_bytes_then_their_order_and_lays_them_out_so() {
        let limits = ChunkLimits {
            bytes: 1 << 20,
            writes: 1 << 20,
            chunks_per_file: 1,
            split_writes: usize::MAX,
        };
        let mut chunk = Chunk::with_limits(limits);
        for (n, key) in awkward_keys().iter().enumerate() {
            chunk.push(key, (n % 3 != 0).then(|| n.to_string()).as_deref().map(str::as_bytes));
        }
        let mut expected = chunk.writes.clone();
        expected.sort_by(|a, b| a.key(&chunk.data).cmp(b.key(&chunk.data)).then(a.seq.cmp(&b.seq)));
        let contents = |data: &[u8], writes: &[Write]| -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
            writes
                .iter()
                .map(|write| (write.key(data).to_vec(), write.value(data).map(<[u8]>::to_vec)))
                .collect()
        };
        let expected = contents(&chunk.data, &expected);
        chunk.sort(&mut Vec::new());
        assert!(
            contents(&chunk.data, &chunk.writes) == expected,
            "sorted by key, then in the order written"
        );
        let mut at = 0;
        for write in &chunk.writes {
            assert_eq!(write.at, at, "the bytes are laid out in sorted order");
            at += write.key_len + write.value_len.unwrap_or(0);
        }
    }
}
