//! The delivery's dead letters: records the target refused for good, and
//! lines that are no output record, one JSON line each, synced before the
//! ledger says so. A record already there (a restart after the line was
//! written but before the ledger was) is not written twice.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// One dead letter, as written.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The record's idempotency key (`offset/<partition>/<offset>` for a
    /// record that has none).
    pub idempotency_key: String,
    /// Its partition in the output (0 for a local output).
    #[serde(default)]
    pub partition: u32,
    /// Its offset in the partition.
    pub offset: u64,
    /// Why: the receiver's status and answer, or what is wrong with the line.
    pub reason: String,
    /// The receiver's status, when it refused the record.
    #[serde(default)]
    pub status: Option<u16>,
    /// Requests sent for it.
    pub attempts: u64,
    /// The body it was sent with (JSON), when it is a record.
    #[serde(default)]
    pub body: Option<Box<RawValue>>,
}

/// The key a dead letter of a record without an idempotency key has.
pub fn malformed_key(partition: u32, offset: u64) -> String {
    format!("offset/{partition}/{offset}")
}

/// The dead-letter file of a delivery.
pub struct DeadLetters {
    path: PathBuf,
    inner: Mutex<(File, HashSet<String>)>,
}

impl DeadLetters {
    /// Opens (creating if needed) the file at `path`.
    pub fn open(path: &Path) -> std::io::Result<DeadLetters> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut written = HashSet::new();
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(err) => return Err(err),
        };
        // A line torn by a crash mid-write is cut, and written again.
        let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |end| end + 1);
        for line in bytes[..whole].split(|&b| b == b'\n') {
            if let Ok(letter) = serde_json::from_slice::<DeadLetter>(line) {
                written.insert(letter.idempotency_key);
            }
        }
        if whole < bytes.len() {
            OpenOptions::new().write(true).open(path)?.set_len(whole as u64)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(DeadLetters { path: path.to_path_buf(), inner: Mutex::new((file, written)) })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `letter` (unless its key is there already), synced.
    pub fn write(&self, letter: &DeadLetter) -> std::io::Result<()> {
        let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (file, written) = &mut *inner;
        if written.contains(&letter.idempotency_key) {
            return Ok(());
        }
        let mut line = serde_json::to_vec(letter).expect("dead letters serialize");
        line.push(b'\n');
        file.write_all(&line)?;
        file.sync_data()?;
        written.insert(letter.idempotency_key.clone());
        Ok(())
    }
}
