//! Tally's durable state: [`RocksStore`], the RocksDB backend of
//! [`tally_core::state::StateStore`]. Its tests run the core's conformance
//! suite, the same one the in-memory store passes.
#![warn(missing_docs)]

mod bulk_load;

use std::path::Path;
use std::sync::Arc;

use tally_core::state::{BulkLoad, Entry, StateError, StateStore, StoreCommit};

/// Column family of the plugin's state.
const STATE_CF: &str = "state";
/// Column family of the host's metadata.
const META_CF: &str = "meta";

fn read_error(err: rocksdb::Error) -> StateError {
    StateError::Read(Box::new(err))
}

fn commit_error(err: rocksdb::Error) -> StateError {
    StateError::Commit(Box::new(err))
}

/// How a commit reaches the disk before [`StateStore::commit`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Written to RocksDB's write-ahead log and synced (fsync): the store is
    /// the only durable copy of the state (local mode).
    Fsync,
    /// Written to RocksDB's write-ahead log, not synced: a killed process
    /// loses nothing (the kernel holds the log), and a machine that loses
    /// power may lose its last commits, whole (RocksDB recovers a prefix of
    /// its writes, each commit's state with its checkpoint), which the
    /// restore then reads again from the changelog. For Kafka mode, where
    /// the Kafka transaction is the commit point and the changelog the
    /// durable copy; an fsync per commit only delayed the next commit
    /// (Kafka Streams writes its stores without a log at all).
    ChangelogBacked,
}

/// The RocksDB backend: one column family per namespace, every commit one
/// `WriteBatch` (synced or not: [`Durability`]); bulk loads ingest SST
/// files (see [`bulk_load`]).
pub struct RocksStore {
    /// Shared with a bulk load's writer thread.
    db: Arc<rocksdb::DB>,
    /// Options of every commit's write.
    commit_options: rocksdb::WriteOptions,
}

impl RocksStore {
    /// Opens (creating if needed) the store in directory `path`; every
    /// commit is synced ([`Durability::Fsync`]).
    pub fn open(path: &Path) -> Result<RocksStore, StateError> {
        RocksStore::open_with(path, Durability::Fsync)
    }

    /// Opens (creating if needed) the store in directory `path`, committing
    /// with `durability`.
    pub fn open_with(path: &Path, durability: Durability) -> Result<RocksStore, StateError> {
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        let families = [(STATE_CF, state_options()), (META_CF, rocksdb::Options::default())];
        let db = rocksdb::DB::open_cf_with_opts(&options, path, families)
            .map_err(|err| StateError::Open { path: path.to_path_buf(), source: Box::new(err) })?;
        let commit_options = match durability {
            Durability::Fsync => synced(),
            Durability::ChangelogBacked => rocksdb::WriteOptions::default(),
        };
        Ok(RocksStore { db: Arc::new(db), commit_options })
    }

    fn scan(&self, cf: &str, prefix: &[u8]) -> Result<Vec<Entry>, StateError> {
        let mode = rocksdb::IteratorMode::From(prefix, rocksdb::Direction::Forward);
        let mut entries = Vec::new();
        for item in self.db.iterator_cf(cf_of(&self.db, cf), mode) {
            let (key, value) = item.map_err(read_error)?;
            if !key.starts_with(prefix) {
                break;
            }
            entries.push((key.into_vec(), value.into_vec()));
        }
        Ok(entries)
    }
}

/// A read-only view of a store another process owns (RocksDB's
/// secondary instance): what that process committed, caught up on demand.
/// A delivery reads a running job's committed output lengths through it.
pub struct RocksView {
    db: rocksdb::DB,
}

impl RocksView {
    /// Opens a view of the store in `primary`, keeping the view's own
    /// files (its info log) in `view_dir`.
    pub fn open(primary: &Path, view_dir: &Path) -> Result<RocksView, StateError> {
        let options = rocksdb::Options::default();
        let db =
            rocksdb::DB::open_cf_as_secondary(&options, primary, view_dir, [STATE_CF, META_CF])
                .map_err(|err| StateError::Open {
                    path: primary.to_path_buf(),
                    source: Box::new(err),
                })?;
        Ok(RocksView { db })
    }

    /// Catches up with what the owner committed since the last call.
    pub fn catch_up(&self) -> Result<(), StateError> {
        self.db.try_catch_up_with_primary().map_err(read_error)
    }

    /// The committed value of metadata entry `key`.
    pub fn get_meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.db.get_cf(cf_of(&self.db, META_CF), key).map_err(read_error)
    }
}

/// Options of the state column family; a bulk load's SST files are
/// written with the same (their comparator and table format must match).
fn state_options() -> rocksdb::Options {
    rocksdb::Options::default()
}

/// Column family `name` of `db`.
fn cf_of<'d>(db: &'d rocksdb::DB, name: &str) -> &'d rocksdb::ColumnFamily {
    db.cf_handle(name).expect("column families are created on open")
}

/// Writes `meta` in one synced write.
fn commit_meta(db: &rocksdb::DB, meta: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StateError> {
    let mut batch = rocksdb::WriteBatch::default();
    let cf = cf_of(db, META_CF);
    for (key, value) in meta {
        batch.put_cf(cf, key, value);
    }
    db.write_opt(batch, &synced()).map_err(commit_error)
}

fn synced() -> rocksdb::WriteOptions {
    let mut options = rocksdb::WriteOptions::default();
    options.set_sync(true);
    options
}

impl StateStore for RocksStore {
    fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        let cf = cf_of(&self.db, STATE_CF);
        self.db
            .batched_multi_get_cf(cf, keys.iter(), false)
            .into_iter()
            .map(|value| value.map(|value| value.map(|slice| slice.to_vec())).map_err(read_error))
            .collect()
    }

    fn get_meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.db.get_cf(cf_of(&self.db, META_CF), key).map_err(read_error)
    }

    fn scan_meta(&self, prefix: &[u8]) -> Result<Vec<Entry>, StateError> {
        self.scan(META_CF, prefix)
    }

    fn scan_state(&self) -> Result<Vec<Entry>, StateError> {
        self.scan(STATE_CF, b"")
    }

    fn scan_state_prefix(&self, prefix: &[u8]) -> Result<Vec<Entry>, StateError> {
        self.scan(STATE_CF, prefix)
    }

    fn commit(&self, commit: StoreCommit) -> Result<(), StateError> {
        let mut batch = rocksdb::WriteBatch::default();
        let (state, meta) = (cf_of(&self.db, STATE_CF), cf_of(&self.db, META_CF));
        for (key, value) in &commit.state {
            match value {
                Some(value) => batch.put_cf(state, key, value),
                None => batch.delete_cf(state, key),
            }
        }
        for (key, value) in &commit.meta {
            batch.put_cf(meta, key, value);
        }
        self.db.write_opt(batch, &self.commit_options).map_err(commit_error)
    }

    fn bulk_load(&self) -> Box<dyn BulkLoad + '_> {
        Box::new(bulk_load::RocksBulkLoad::start(self.db.clone(), bulk_load::ChunkLimits::DEFAULT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_core::state::conformance;

    #[test]
    fn rocks_store_meets_the_core_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let mut next = 0;
        conformance::run(|| {
            next += 1;
            RocksStore::open(&dir.path().join(next.to_string())).unwrap()
        });
    }

    #[test]
    fn rocks_store_keeps_commits_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = RocksStore::open(dir.path()).unwrap();
            store
                .commit(StoreCommit {
                    state: vec![(b"k".to_vec(), Some(b"v".to_vec()))],
                    meta: vec![],
                })
                .unwrap();
        }
        let store = RocksStore::open(dir.path()).unwrap();
        assert_eq!(store.get_many(&[b"k"]).unwrap(), vec![Some(b"v".to_vec())]);
    }

    #[test]
    fn an_unopenable_directory_names_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-directory");
        std::fs::write(&file, "x").unwrap();
        let err = RocksStore::open(&file).err().expect("a file is no store directory").to_string();
        assert!(err.contains("not-a-directory"), "{err}");
    }

    /// Copies the files of an open store: what a crash would leave.
    fn crash_image(from: &Path, to: &Path) {
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_file() {
                std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
            }
        }
        std::fs::remove_file(to.join("LOCK")).unwrap();
    }

    #[test]
    fn a_bulk_load_is_on_disk_once_finished_though_it_bypasses_the_memtable_and_the_write_ahead_log()
     {
        let (dir, image) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let store = RocksStore::open(dir.path()).unwrap();
        let mut load = store.bulk_load();
        for n in 0..25_000u32 {
            load.state(format!("k{n}").as_bytes(), Some(&n.to_be_bytes()));
        }
        load.checkpoint(&[(b"checkpoint".to_vec(), b"25000".to_vec())]).unwrap();
        load.finish().unwrap();
        crash_image(dir.path(), image.path());
        let crashed = RocksStore::open(image.path()).unwrap();
        assert_eq!(crashed.get_meta(b"checkpoint").unwrap(), Some(b"25000".to_vec()));
        assert_eq!(
            crashed.get_many(&[b"k0", b"k24999"]).unwrap(),
            vec![Some(0u32.to_be_bytes().to_vec()), Some(24_999u32.to_be_bytes().to_vec())]
        );
        assert_eq!(
            crashed.scan_state().unwrap().len(),
            25_000,
            "every write before the checkpoint is on disk"
        );
    }

    #[test]
    fn a_changelog_backed_commit_is_in_the_write_ahead_log_when_it_returns() {
        let (dir, image) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let store = RocksStore::open_with(dir.path(), Durability::ChangelogBacked).unwrap();
        for n in 0..3u8 {
            store
                .commit(StoreCommit {
                    state: vec![(vec![b'k', n], Some(vec![n]))],
                    meta: vec![(b"checkpoint".to_vec(), vec![n])],
                })
                .unwrap();
        }
        // A killed process leaves its log with the kernel: every commit is there.
        crash_image(dir.path(), image.path());
        let crashed = RocksStore::open(image.path()).unwrap();
        assert_eq!(crashed.get_meta(b"checkpoint").unwrap(), Some(vec![2]));
        assert_eq!(
            crashed.get_many(&[b"k\x00", b"k\x01", b"k\x02"]).unwrap(),
            vec![Some(vec![0]), Some(vec![1]), Some(vec![2])]
        );
    }

    fn put(n: u32) -> (Vec<u8>, Option<Vec<u8>>) {
        (format!("k{:05}", n % 997).into_bytes(), Some(n.to_be_bytes().to_vec()))
    }

    #[test]
    fn a_bulk_load_of_many_chunks_keeps_the_last_write_of_each_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        store
            .commit(StoreCommit {
                state: vec![
                    (b"old".to_vec(), Some(b"0".to_vec())),
                    (b"k00001".to_vec(), Some(b"0".to_vec())),
                ],
                meta: vec![],
            })
            .unwrap();
        // Chunks of at most 64 bytes or 7 writes, three to a file: a key's
        // writes span many chunks and files.
        let limits =
            bulk_load::ChunkLimits { bytes: 64, writes: 7, chunks_per_file: 3, split_writes: 8 };
        let mut load = bulk_load::RocksBulkLoad::start(store.db.clone(), limits);
        let mut expected = std::collections::BTreeMap::new();
        for n in 0..1_500u32 {
            let (key, mut value) = put(n);
            if n % 5 == 0 {
                value = None; // deletes too, of keys in earlier files
            }
            if n % 50 == 0 {
                load.state(&key, Some(b"overwritten")); // in the same chunk
            }
            load.state(&key, value.as_deref());
            expected.insert(key, value);
            if n % 10 == 4 {
                // A key of the chunk before, most often in the same file.
                let (key, _) = put(n - 4);
                let value = (n + 100_000).to_be_bytes().to_vec();
                load.state(&key, Some(&value));
                expected.insert(key, Some(value));
            }
            if n % 300 == 299 {
                load.checkpoint(&[(b"checkpoint".to_vec(), (n + 1).to_string().into_bytes())])
                    .unwrap();
            }
        }
        load.state(b"old", None);
        expected.insert(b"old".to_vec(), None);
        load.checkpoint(&[(b"checkpoint".to_vec(), b"end".to_vec())]).unwrap();
        load.finish().unwrap();
        drop(load);
        let kept: Vec<(Vec<u8>, Vec<u8>)> =
            expected.into_iter().filter_map(|(key, value)| Some((key, value?))).collect();
        assert_eq!(store.scan_state().unwrap(), kept);
        assert_eq!(store.get_meta(b"checkpoint").unwrap(), Some(b"end".to_vec()));
        assert_eq!(
            std::fs::read_dir(dir.path().join("bulk-load")).unwrap().count(),
            0,
            "every file was moved into the store"
        );
    }

    #[test]
    fn a_bulk_load_clears_what_a_crashed_one_left() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        std::fs::create_dir_all(dir.path().join("bulk-load")).unwrap();
        std::fs::write(dir.path().join("bulk-load/restore-1.sst"), b"half a file").unwrap();
        let mut load = store.bulk_load();
        load.state(b"k", Some(b"v"));
        load.checkpoint(&[]).unwrap();
        load.finish().unwrap();
        assert_eq!(store.get_many(&[b"k"]).unwrap(), vec![Some(b"v".to_vec())]);
    }

    #[test]
    fn a_failed_ingest_fails_the_load_and_commits_no_later_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        let mut load = store.bulk_load();
        std::fs::remove_dir_all(dir.path().join("bulk-load")).unwrap(); // nowhere to write the file
        load.state(b"k", Some(b"v"));
        load.checkpoint(&[(b"checkpoint".to_vec(), b"1".to_vec())]).unwrap();
        let err = load.finish().expect_err("the chunk could not be written").to_string();
        assert!(err.contains("bulk-load"), "{err}");
        assert!(
            load.checkpoint(&[(b"checkpoint".to_vec(), b"2".to_vec())]).is_err(),
            "a failed load stays failed"
        );
        drop(load);
        assert_eq!(store.get_meta(b"checkpoint").unwrap(), None);
        assert_eq!(store.get_many(&[b"k"]).unwrap(), vec![None]);
    }
}
