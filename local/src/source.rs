//! The local source: NDJSON files, one file per partition. A record is a
//! line; its offset is the line number. Positions are (line, byte) pairs, so
//! a restart seeks straight to the first uncommitted line.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use tally_core::batch::OVERSIZED_PREFIX_BYTES;
use tally_core::transaction::SourcePosition;

/// Read buffer per input file.
const READ_BUFFER_BYTES: usize = 1 << 20;

/// A failure reading the inputs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// An input file could not be opened or read.
    #[error("cannot read input `{}`: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An input file is shorter than what was already committed from it.
    #[error(
        "input `{}` has {len} bytes, but {committed} bytes of it were already processed and committed: \
         it was truncated or replaced; restore the original file, or start over with a new state directory and output directory",
        path.display()
    )]
    Shrunk {
        /// The file.
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
        /// The committed length.
        committed: u64,
    },
    /// An input of a confined job is not a regular file inside its directory.
    #[error("input `{}` is not a regular file inside the directory this job may read ({}); use a plain file there", path.display(), root.display())]
    Outside {
        /// The file.
        path: PathBuf,
        /// The directory the job may read.
        root: PathBuf,
    },
    /// A followed input was replaced by another file (rotated away).
    #[error(
        "input `{}` was replaced by another file while the job followed it (log rotation?); \
         inputs must only grow: append to the file instead of replacing it",
        path.display()
    )]
    Replaced {
        /// The file.
        path: PathBuf,
    },
    /// The bytes before the committed position are no longer a line end.
    #[error(
        "input `{}` changed: byte {committed}, where processing resumes, no longer starts a line \
         (was the file rewritten, or its last line extended?); restore the original file, \
         or start over with a new state directory and output directory",
        path.display()
    )]
    Changed {
        /// The file.
        path: PathBuf,
        /// The committed length.
        committed: u64,
    },
    /// The line before the committed position is not the one committed.
    #[error(
        "input `{}` changed: the line that ends at byte {committed}, the last one processed and committed, \
         now reads differently (was the file replaced or rewritten?); going on would skip or repeat records. \
         Restore the original file, or start over with a new state directory and output directory",
        path.display()
    )]
    Rewritten {
        /// The file.
        path: PathBuf,
        /// The committed length.
        committed: u64,
    },
}

/// How far a partition has been read: the next line and its byte position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LocalPosition {
    /// Line number of the next record.
    pub next_line: u64,
    /// Byte position of the next record.
    pub byte: u64,
    /// Fingerprint of the line that ends at `byte` (see [`line_fingerprint`]):
    /// a resume checks that the file still holds that line there. Absent
    /// at the start of a file, and in positions committed before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_line: Option<u64>,
}

/// A line's fingerprint, without its line ending: the first 8 bytes of its
/// SHA-256, big-endian. Stable across versions: it is stored with every
/// committed position.
pub fn line_fingerprint(line: &[u8]) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update(line);
    fingerprint_of(hasher)
}

/// Where the first newline in `bytes` is.
fn find_newline(bytes: &[u8]) -> Option<usize> {
    memchr::memchr(b'\n', bytes)
}

/// The fingerprint a hasher fed with a line's bytes gives.
fn fingerprint_of(hasher: Sha256) -> u64 {
    let digest = hasher.finalize();
    u64::from_be_bytes(digest[..8].try_into().expect("a SHA-256 has 32 bytes"))
}

/// One record read from an input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRecord {
    /// Where it came from.
    pub position: SourcePosition,
    /// The line, without its line ending (only its first bytes when it is
    /// oversized).
    pub value: Vec<u8>,
    /// Set when the line is longer than the source's record limit: its
    /// size in bytes. It was not read into memory; dead-letter it.
    pub oversized: Option<u64>,
}

struct Partition {
    path: PathBuf,
    reader: BufReader<File>,
    position: LocalPosition,
    exhausted: bool,
    /// A line over the record limit, being read past (it may still be
    /// appended to, in follow mode).
    skipping: Option<Skipped>,
}

/// What is kept of a line too long to hold: its size, its first bytes and
/// the running hash of its fingerprint.
struct Skipped {
    size: u64,
    /// Bytes read, its line ending included once there is one.
    consumed: u64,
    prefix: Vec<u8>,
    hasher: Sha256,
    /// A `\r` not hashed yet: part of the line unless a `\n` follows.
    held_cr: bool,
}

impl Skipped {
    fn new(start: &[u8]) -> Skipped {
        let mut skipped = Skipped {
            size: 0,
            consumed: 0,
            prefix: Vec::with_capacity(OVERSIZED_PREFIX_BYTES),
            hasher: Sha256::new(),
            held_cr: false,
        };
        skipped.feed(start);
        skipped.consumed = start.len() as u64;
        skipped
    }

    /// More of the line, without its newline.
    fn feed(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if std::mem::take(&mut self.held_cr) {
            self.hasher.update(b"\r");
        }
        let (hashed, held) = match bytes.split_last() {
            Some((b'\r', rest)) => (rest, true),
            _ => (bytes, false),
        };
        self.hasher.update(hashed);
        self.held_cr = held;
        self.size += bytes.len() as u64;
        let room = OVERSIZED_PREFIX_BYTES - self.prefix.len();
        self.prefix.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// The line is complete; `newline` when it ended with one.
    fn finish(mut self, newline: bool) -> LineRead {
        if self.held_cr {
            if newline {
                // The `\r` was the line ending's: out of the size, and out of
                // the prefix if it got that far.
                self.size -= 1;
                self.prefix.truncate(self.size.min(OVERSIZED_PREFIX_BYTES as u64) as usize);
            } else {
                self.hasher.update(b"\r");
            }
        }
        LineRead::Oversized {
            bytes: self.consumed,
            size: self.size,
            prefix: self.prefix,
            fingerprint: fingerprint_of(self.hasher),
        }
    }
}

/// What reading one line gave.
enum LineRead {
    /// Nothing more in the file.
    End,
    /// A line still being appended (follow mode): read it once whole.
    Partial,
    /// A line in `line`, `bytes` long with its line ending.
    Line {
        /// Its length with its line ending.
        bytes: u64,
    },
    /// A line over the limit, `bytes` long with its line ending.
    Oversized {
        /// Its length with its line ending.
        bytes: u64,
        /// Its size in bytes.
        size: u64,
        /// Its first bytes, kept for its dead letter.
        prefix: Vec<u8>,
        /// Its fingerprint (see [`line_fingerprint`]).
        fingerprint: u64,
    },
}

impl Partition {
    /// Reads the next line into `line` (empty), holding at most `max`
    /// bytes of it (plus its line ending): a longer line is read past, not
    /// into memory.
    fn read_line(
        &mut self,
        line: &mut Vec<u8>,
        max: u64,
        follow: bool,
    ) -> std::io::Result<LineRead> {
        loop {
            let buf = self.reader.fill_buf()?;
            if buf.is_empty() {
                if let Some(skipped) = self.skipping.take() {
                    if follow {
                        // Go on from here once more is appended; nothing is re-read.
                        self.skipping = Some(skipped);
                        return Ok(LineRead::Partial);
                    }
                    return Ok(skipped.finish(false));
                }
                if line.is_empty() {
                    return Ok(LineRead::End);
                }
                if follow {
                    self.reader.seek_relative(-(line.len() as i64))?;
                    line.clear();
                    return Ok(LineRead::Partial);
                }
                return Ok(LineRead::Line { bytes: line.len() as u64 });
            }
            let newline = find_newline(buf);
            let chunk = &buf[..newline.map_or(buf.len(), |at| at)];
            let taken = newline.map_or(buf.len(), |at| at + 1);
            // The limit is on the record without its line ending: one more
            // byte may be the `\r` of a `\r\n`.
            if self.skipping.is_none() && (line.len() + chunk.len()) as u64 > max + 1 {
                self.skipping = Some(Skipped::new(line));
                line.clear();
            }
            match &mut self.skipping {
                Some(skipped) => {
                    skipped.feed(chunk);
                    skipped.consumed += taken as u64;
                    self.reader.consume(taken);
                    if newline.is_some() {
                        return Ok(self.skipping.take().expect("skipping a line").finish(true));
                    }
                }
                None => {
                    line.extend_from_slice(&buf[..taken]);
                    self.reader.consume(taken);
                    if newline.is_some() {
                        return Ok(LineRead::Line { bytes: line.len() as u64 });
                    }
                }
            }
        }
    }
}

/// NDJSON input files read in round-robin batches.
pub struct LocalSource {
    partitions: Vec<Partition>,
    line: Vec<u8>,
    /// Partition the next batch starts with, so that batches smaller than
    /// the number of partitions still visit every partition in turn.
    next_start: usize,
    /// Whether a last line without its newline is still being written
    /// (left for later) rather than the file's final record.
    follow: bool,
    /// Longest line handed out whole; longer ones come as oversized.
    max_record_bytes: u64,
    /// Most bytes of lines one batch holds.
    max_batch_bytes: u64,
}

impl LocalSource {
    /// Opens `paths`, each positioned at `positions[i]` (or the start),
    /// unconfined (the tests' shorthand; jobs use [`LocalSource::open_confined`]).
    #[cfg(test)]
    pub fn open(
        paths: &[PathBuf],
        positions: &[LocalPosition],
    ) -> Result<LocalSource, SourceError> {
        LocalSource::open_confined(paths, positions, None)
    }

    /// Like [`LocalSource::open`]; with `root`, every file actually opened
    /// (after all links) must be a regular file inside `root`, or it is
    /// refused: checked on the open file, so no link swapped in between a
    /// check and the open can lead out.
    pub fn open_confined(
        paths: &[PathBuf],
        positions: &[LocalPosition],
        root: Option<&Path>,
    ) -> Result<LocalSource, SourceError> {
        let partitions = paths
            .iter()
            .enumerate()
            .map(|(index, path)| {
                let position = positions.get(index).copied().unwrap_or_default();
                open_partition(path, position, root)
            })
            .collect::<Result<_, _>>()?;
        Ok(LocalSource {
            partitions,
            line: Vec::new(),
            next_start: 0,
            follow: false,
            max_record_bytes: tally_core::limits::DEFAULT_MAX_RECORD_BYTES,
            max_batch_bytes: tally_core::limits::MAX_BATCH_BYTES,
        })
    }

    /// A batch ends once its lines hold `max` bytes (at least one line).
    pub fn set_max_batch_bytes(&mut self, max: u64) {
        self.max_batch_bytes = max.max(1);
    }

    /// Lines longer than `max` bytes (without their line ending) are not
    /// read into memory: they come as [`InputRecord::oversized`].
    pub fn set_max_record_bytes(&mut self, max: u64) {
        self.max_record_bytes = max;
    }

    /// Checks that every input can be opened, without reading it.
    pub fn check_readable(paths: &[PathBuf]) -> Result<(), SourceError> {
        for path in paths {
            File::open(path).map_err(|source| SourceError::Read { path: path.clone(), source })?;
        }
        Ok(())
    }

    /// Reads up to `max` records into `out`, taking an equal share from each
    /// partition that has records left; reads nothing once all are exhausted.
    pub fn next_batch(
        &mut self,
        max: usize,
        out: &mut Vec<InputRecord>,
    ) -> Result<(), SourceError> {
        let live = self.partitions.iter().filter(|p| !p.exhausted).count();
        if live == 0 {
            return Ok(());
        }
        let share = (max / live).max(1);
        let count = self.partitions.len();
        let start = self.next_start;
        self.next_start = (start + 1) % count;
        let mut bytes = out.iter().map(|record| record.value.len() as u64).sum::<u64>();
        for index in (start..count).chain(0..start) {
            let partition = &mut self.partitions[index];
            let mut taken = 0;
            let mut last_fingerprint = None;
            while taken < share
                && !partition.exhausted
                && out.len() < max
                && bytes < self.max_batch_bytes
            {
                self.line.clear();
                let read = partition
                    .read_line(&mut self.line, self.max_record_bytes, self.follow)
                    .map_err(|source| SourceError::Read { path: partition.path.clone(), source })?;
                let position = SourcePosition {
                    partition: index as u32,
                    offset: partition.position.next_line,
                };
                let record = match read {
                    LineRead::End | LineRead::Partial => {
                        partition.exhausted = true;
                        break;
                    }
                    LineRead::Line { bytes } => {
                        partition.position.byte += bytes;
                        let mut value = std::mem::take(&mut self.line);
                        trim_line_ending(&mut value);
                        last_fingerprint = None;
                        match value.len() as u64 {
                            size if size > self.max_record_bytes => {
                                last_fingerprint = Some(line_fingerprint(&value));
                                value.truncate(OVERSIZED_PREFIX_BYTES);
                                InputRecord { position, value, oversized: Some(size) }
                            }
                            _ => InputRecord { position, value, oversized: None },
                        }
                    }
                    LineRead::Oversized { bytes, size, prefix, fingerprint } => {
                        partition.position.byte += bytes;
                        last_fingerprint = Some(fingerprint);
                        InputRecord { position, value: prefix, oversized: Some(size) }
                    }
                };
                partition.position.next_line += 1;
                bytes += record.value.len() as u64;
                out.push(record);
                taken += 1;
            }
            // Once per partition and batch, not per line: the last line read.
            if taken > 0 {
                let last = out.last().expect("this partition just pushed a record");
                partition.position.last_line =
                    Some(last_fingerprint.unwrap_or_else(|| line_fingerprint(&last.value)));
            }
        }
        Ok(())
    }

    /// Where each partition will continue reading.
    pub fn positions(&self) -> Vec<LocalPosition> {
        self.partitions.iter().map(|p| p.position).collect()
    }

    /// Makes a last line without its newline wait until it is complete
    /// (for inputs that are still being appended to).
    pub fn set_follow(&mut self, follow: bool) {
        self.follow = follow;
    }

    /// Whether [`LocalSource::set_follow`] is on.
    pub fn is_following(&self) -> bool {
        self.follow
    }

    /// Reads on past the ends found so far: lines appended since are read.
    /// A followed input must only grow: a file cut shorter or replaced is
    /// an error, not an input that looks idle.
    pub fn look_again(&mut self) -> Result<(), SourceError> {
        use std::os::unix::fs::MetadataExt;
        for partition in &mut self.partitions {
            let read_error = |source| SourceError::Read { path: partition.path.clone(), source };
            let on_disk = std::fs::metadata(&partition.path).map_err(read_error)?;
            let open = partition.reader.get_ref().metadata().map_err(read_error)?;
            if on_disk.ino() != open.ino() || on_disk.dev() != open.dev() {
                return Err(SourceError::Replaced { path: partition.path.clone() });
            }
            if on_disk.len() < partition.position.byte {
                return Err(SourceError::Shrunk {
                    path: partition.path.clone(),
                    len: on_disk.len(),
                    committed: partition.position.byte,
                });
            }
            partition.exhausted = false;
        }
        Ok(())
    }

    /// Bytes of the inputs not read yet, if the files can be measured.
    pub fn unread_bytes(&self) -> Option<u64> {
        let mut unread = 0;
        for partition in &self.partitions {
            let len = std::fs::metadata(&partition.path).ok()?.len();
            unread += len.saturating_sub(partition.position.byte);
        }
        Some(unread)
    }

    /// The partitions read to their end (until [`LocalSource::look_again`]).
    pub fn exhausted_partitions(&self) -> impl Iterator<Item = u32> + '_ {
        self.partitions.iter().enumerate().filter(|(_, p)| p.exhausted).map(|(i, _)| i as u32)
    }

    /// Whether every partition has been read to its end.
    #[cfg(test)]
    pub fn is_exhausted(&self) -> bool {
        self.partitions.iter().all(|p| p.exhausted)
    }
}

fn open_partition(
    path: &Path,
    position: LocalPosition,
    root: Option<&Path>,
) -> Result<Partition, SourceError> {
    let read_error = |source| SourceError::Read { path: path.to_path_buf(), source };
    let mut file = match root {
        None => File::open(path).map_err(read_error)?,
        Some(root) => open_inside(path, root)?,
    };
    let len = file.metadata().map_err(read_error)?.len();
    if len < position.byte {
        return Err(SourceError::Shrunk {
            path: path.to_path_buf(),
            len,
            committed: position.byte,
        });
    }
    // The committed position must sit at a line start, or the file changed.
    if position.byte > 0 && position.byte < len {
        let mut before = [0u8; 1];
        file.seek(SeekFrom::Start(position.byte - 1)).map_err(read_error)?;
        file.read_exact(&mut before).map_err(read_error)?;
        if before[0] != b'\n' {
            return Err(SourceError::Changed {
                path: path.to_path_buf(),
                committed: position.byte,
            });
        }
    }
    if let Some(expected) = position.last_line
        && fingerprint_of_line_ending_at(&mut file, position.byte).map_err(read_error)? != expected
    {
        return Err(SourceError::Rewritten { path: path.to_path_buf(), committed: position.byte });
    }
    file.seek(SeekFrom::Start(position.byte)).map_err(read_error)?;
    Ok(Partition {
        path: path.to_path_buf(),
        reader: BufReader::with_capacity(READ_BUFFER_BYTES, file),
        position,
        exhausted: false,
        skipping: None,
    })
}

/// Where the line of `file` that ends at byte `end` starts: found by
/// reading backwards a block at a time to the newline before it (or the
/// file's start), without holding the line.
fn line_start_before(file: &mut File, end: u64) -> std::io::Result<u64> {
    const BLOCK: u64 = 64 << 10;
    let mut block = vec![0; BLOCK as usize];
    // The line's own last byte (its newline, or the file's last byte) aside.
    let mut searched_end = end.saturating_sub(1);
    while searched_end > 0 {
        let from = searched_end.saturating_sub(BLOCK);
        let block = &mut block[..(searched_end - from) as usize];
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(block)?;
        if let Some(newline) = memchr::memrchr(b'\n', block) {
            return Ok(from + newline as u64 + 1);
        }
        searched_end = from;
    }
    Ok(0)
}

/// The fingerprint ([`line_fingerprint`]) of the line of `file` that ends
/// at byte `end`, its line ending left out; read in blocks, whatever its
/// length.
fn fingerprint_of_line_ending_at(file: &mut File, end: u64) -> std::io::Result<u64> {
    const BLOCK: usize = 64 << 10;
    let start = line_start_before(file, end)?;
    file.seek(SeekFrom::Start(start))?;
    let mut remaining = end - start;
    let mut skipped = Skipped::new(&[]);
    let mut block = vec![0; BLOCK];
    let mut newline = false;
    while remaining > 0 {
        let len = remaining.min(BLOCK as u64) as usize;
        file.read_exact(&mut block[..len])?;
        remaining -= len as u64;
        let mut chunk = &block[..len];
        if remaining == 0 && chunk.last() == Some(&b'\n') {
            chunk = &chunk[..len - 1];
            newline = true;
        }
        skipped.feed(chunk);
    }
    match skipped.finish(newline) {
        LineRead::Oversized { fingerprint, .. } => Ok(fingerprint),
        _ => unreachable!("finish gives an oversized read"),
    }
}

/// Opens `path` (without blocking on a FIFO) and checks that what was
/// opened is a regular file inside `root`.
fn open_inside(path: &Path, root: &Path) -> Result<File, SourceError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let read_error = |source| SourceError::Read { path: path.to_path_buf(), source };
    let outside = || SourceError::Outside { path: path.to_path_buf(), root: root.to_path_buf() };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(read_error)?;
    if !file.metadata().map_err(read_error)?.is_file() {
        return Err(outside());
    }
    let opened =
        std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).map_err(read_error)?;
    let root = root
        .canonicalize()
        .map_err(|source| SourceError::Read { path: root.to_path_buf(), source })?;
    if !opened.starts_with(&root) {
        return Err(outside());
    }
    Ok(file)
}

fn trim_line_ending(line: &mut Vec<u8>) {
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    #[test]
    fn a_confined_source_opens_only_regular_files_inside_its_root() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let inside = write(root.path(), "in.ndjson", "{}\n");
        let secret = write(elsewhere.path(), "secret.ndjson", "{}\n");
        assert!(
            LocalSource::open_confined(std::slice::from_ref(&inside), &[], Some(root.path()))
                .is_ok()
        );
        let link = root.path().join("link.ndjson");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let err = LocalSource::open_confined(std::slice::from_ref(&link), &[], Some(root.path()))
            .err()
            .unwrap();
        assert!(matches!(err, SourceError::Outside { .. }), "{err}");
        assert!(
            LocalSource::open(&[link], &[]).is_ok(),
            "unconfined (tally run) follows links as before"
        );
        let fifo = root.path().join("fifo.ndjson");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let err = LocalSource::open_confined(&[fifo], &[], Some(root.path())).err().unwrap();
        assert!(
            matches!(err, SourceError::Outside { .. }),
            "a FIFO is refused without blocking: {err}"
        );
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn values(records: &[InputRecord]) -> Vec<(u32, u64, String)> {
        records
            .iter()
            .map(|r| {
                (
                    r.position.partition,
                    r.position.offset,
                    String::from_utf8(r.value.clone()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn reads_partitions_in_turn_and_resumes_from_a_position() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a", "a0\na1\r\na2");
        let b = write(dir.path(), "b", "b0\n");
        let mut source = LocalSource::open(&[a.clone(), b.clone()], &[]).unwrap();
        let mut batch = Vec::new();
        source.next_batch(4, &mut batch).unwrap();
        assert_eq!(
            values(&batch),
            vec![(0, 0, "a0".into()), (0, 1, "a1".into()), (1, 0, "b0".into())]
        );
        let resume = source.positions();
        assert_eq!(
            resume[0],
            LocalPosition { next_line: 2, byte: 7, last_line: Some(line_fingerprint(b"a1")) }
        );

        let mut source = LocalSource::open(&[a, b], &resume).unwrap();
        let mut batch = Vec::new();
        source.next_batch(10, &mut batch).unwrap();
        assert_eq!(values(&batch), vec![(0, 2, "a2".into())]);
        batch.clear();
        source.next_batch(10, &mut batch).unwrap();
        assert!(batch.is_empty() && source.is_exhausted());
    }

    #[test]
    fn an_input_changed_under_the_committed_position_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a", "a0\na1\n");
        let err =
            LocalSource::open(&[a], &[LocalPosition { next_line: 1, byte: 2, last_line: None }])
                .err()
                .unwrap()
                .to_string();
        assert!(err.contains("no longer starts a line"), "{err}");
    }

    #[test]
    fn batches_smaller_than_the_partition_count_still_visit_every_partition() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> =
            (0..3).map(|p| write(dir.path(), &format!("p{p}"), "x\ny\n")).collect();
        let mut source = LocalSource::open(&paths, &[]).unwrap();
        let mut seen = Vec::new();
        for _ in 0..3 {
            let mut batch = Vec::new();
            source.next_batch(1, &mut batch).unwrap();
            seen.extend(batch.iter().map(|r| r.position.partition));
        }
        assert_eq!(seen, vec![0, 1, 2]);
    }

    #[test]
    fn an_input_rewritten_under_the_committed_position_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a", "acme 1\nacme 2\nacme 3\n");
        let mut source = LocalSource::open(std::slice::from_ref(&a), &[]).unwrap();
        let mut batch = Vec::new();
        source.next_batch(2, &mut batch).unwrap();
        let resume = source.positions();
        // The same file resumes; the same lengths with other bytes do not.
        assert!(LocalSource::open(std::slice::from_ref(&a), &resume).is_ok());
        std::fs::write(&a, "acme 1\nhool 2\nacme 3\n").unwrap();
        let err = LocalSource::open(&[a], &resume).err().unwrap().to_string();
        assert!(err.contains("the line that ends at byte 14, the last one processed and committed, now reads differently"), "{err}");
    }

    #[test]
    fn the_line_before_a_position_is_found_across_blocks_and_at_the_file_start() {
        let dir = tempfile::tempdir().unwrap();
        let long = "x".repeat(150_000);
        let text = format!("first\n{long}\r\nlast-without-newline");
        let path = write(dir.path(), "a", &text);
        let mut file = File::open(&path).unwrap();
        assert_eq!(
            fingerprint_of_line_ending_at(&mut file, 6).unwrap(),
            line_fingerprint(b"first")
        );
        assert_eq!(
            fingerprint_of_line_ending_at(&mut file, 6 + 150_002).unwrap(),
            line_fingerprint(long.as_bytes())
        );
        assert_eq!(
            fingerprint_of_line_ending_at(&mut file, text.len() as u64).unwrap(),
            line_fingerprint(b"last-without-newline")
        );
        assert_eq!(fingerprint_of_line_ending_at(&mut file, 0).unwrap(), line_fingerprint(b""));
    }

    #[test]
    fn a_line_over_the_record_limit_is_read_past_not_into_memory() {
        let dir = tempfile::tempdir().unwrap();
        let long = "y".repeat(300_000);
        let a = write(dir.path(), "a", &format!("short\n{long}\r\nafter\n"));
        let mut source = LocalSource::open(std::slice::from_ref(&a), &[]).unwrap();
        source.set_max_record_bytes(1000);
        let mut batch = Vec::new();
        source.next_batch(10, &mut batch).unwrap();
        let sizes: Vec<(u64, Option<u64>, usize)> =
            batch.iter().map(|r| (r.position.offset, r.oversized, r.value.len())).collect();
        assert_eq!(
            sizes,
            vec![(0, None, 5), (1, Some(300_000), OVERSIZED_PREFIX_BYTES), (2, None, 5)]
        );
        // Resuming right after the long line checks its fingerprint.
        let mut source = LocalSource::open(std::slice::from_ref(&a), &[]).unwrap();
        source.set_max_record_bytes(1000);
        let mut two = Vec::new();
        source.next_batch(2, &mut two).unwrap();
        let resume = source.positions();
        assert_eq!(resume[0].last_line, Some(line_fingerprint(long.as_bytes())));
        assert!(LocalSource::open(&[a], &resume).is_ok());
    }

    #[test]
    fn a_long_line_still_being_appended_is_not_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a", &"z".repeat(5000));
        let mut source = LocalSource::open(std::slice::from_ref(&a), &[]).unwrap();
        source.set_max_record_bytes(100);
        source.set_follow(true);
        let mut batch = Vec::new();
        source.next_batch(10, &mut batch).unwrap();
        assert!(batch.is_empty(), "the line is not complete yet");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&a)
            .unwrap()
            .write_all(format!("{}\nnext\n", "z".repeat(5000)).as_bytes())
            .unwrap();
        source.look_again().unwrap();
        source.next_batch(10, &mut batch).unwrap();
        let sizes: Vec<Option<u64>> = batch.iter().map(|r| r.oversized).collect();
        assert_eq!(sizes, vec![Some(10_000), None]);
        assert_eq!(source.positions()[0].byte, 10_006);
    }

    #[test]
    fn a_shrunk_input_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a", "a0\n");
        let err =
            LocalSource::open(&[a], &[LocalPosition { next_line: 5, byte: 100, last_line: None }])
                .err()
                .unwrap()
                .to_string();
        assert!(err.contains("has 3 bytes, but 100 bytes of it were already processed"), "{err}");
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        /// The records a file's bytes hold: each line without its ending,
        /// and whether it is over `max` bytes.
        fn expected(bytes: &[u8], max: u64) -> Vec<(Vec<u8>, Option<u64>)> {
            let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
            if lines.last().is_some_and(|last| last.is_empty()) {
                lines.pop();
            }
            let ends_without_newline = !bytes.is_empty() && bytes.last() != Some(&b'\n');
            let count = lines.len();
            lines
                .into_iter()
                .enumerate()
                .map(|(index, line)| {
                    // `\r\n` ends a line; a last line without `\n` keeps its `\r`.
                    let line = match line.split_last() {
                        Some((b'\r', rest)) if !(ends_without_newline && index == count - 1) => {
                            rest
                        }
                        _ => line,
                    };
                    let size = line.len() as u64;
                    if size > max {
                        (line[..line.len().min(OVERSIZED_PREFIX_BYTES)].to_vec(), Some(size))
                    } else {
                        (line.to_vec(), None)
                    }
                })
                .collect()
        }

        fn content() -> impl Strategy<Value = Vec<u8>> {
            let piece = prop_oneof![
                Just(b"\n".to_vec()),
                Just(b"\r\n".to_vec()),
                Just(b"\r".to_vec()),
                prop::collection::vec(any::<u8>(), 0..40),
                "[a-z{}\":,]{0,30}".prop_map(String::into_bytes),
                (1usize..3000).prop_map(|len| vec![b'x'; len]),
            ];
            prop::collection::vec(piece, 0..30).prop_map(|pieces| pieces.concat())
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

            /// Any bytes read in any batch sizes give exactly the file's
            /// lines, each at its place, the long ones flagged and not held;
            /// resuming from any committed position gives the rest.
            #[test]
            fn any_input_reads_as_its_lines_and_resumes_anywhere(bytes in content(), max in 1u64..200, batch in 1usize..7, cut in any::<prop::sample::Index>()) {
                let dir = tempfile::tempdir().unwrap();
                let path = write(dir.path(), "in.ndjson", "");
                std::fs::write(&path, &bytes).unwrap();
                let read_all = |positions: &[LocalPosition]| {
                    let mut source = LocalSource::open(std::slice::from_ref(&path), positions).unwrap();
                    source.set_max_record_bytes(max);
                    let mut records = Vec::new();
                    let mut marks = vec![source.positions()[0]];
                    loop {
                        let mut out = Vec::new();
                        source.next_batch(batch, &mut out).unwrap();
                        if out.is_empty() {
                            break;
                        }
                        records.extend(out);
                        marks.push(source.positions()[0]);
                    }
                    (records, marks)
                };
                let (records, marks) = read_all(&[]);
                let want = expected(&bytes, max);
                let got: Vec<(Vec<u8>, Option<u64>)> = records.iter().map(|r| (r.value.clone(), r.oversized)).collect();
                prop_assert_eq!(&got, &want);
                prop_assert!(records.iter().enumerate().all(|(line, r)| r.position.offset == line as u64));
                let end = *marks.last().unwrap();
                prop_assert_eq!(end.byte, bytes.len() as u64);
                prop_assert_eq!(end.next_line, want.len() as u64);
                // Resume from a position a commit could have stored.
                let mark = marks[cut.index(marks.len())];
                let (rest, _) = read_all(&[mark]);
                let rest: Vec<(Vec<u8>, Option<u64>)> = rest.iter().map(|r| (r.value.clone(), r.oversized)).collect();
                prop_assert_eq!(&rest[..], &want[mark.next_line as usize..]);
            }

            /// A followed input that grows in two parts, split anywhere (in
            /// a long line too), gives its complete lines once each.
            #[test]
            fn a_followed_input_split_anywhere_reads_its_complete_lines(bytes in content(), max in 1u64..200, batch in 1usize..7, split in any::<prop::sample::Index>()) {
                let dir = tempfile::tempdir().unwrap();
                let path = write(dir.path(), "in.ndjson", "");
                let at = split.index(bytes.len() + 1);
                std::fs::write(&path, &bytes[..at]).unwrap();
                let mut source = LocalSource::open(std::slice::from_ref(&path), &[]).unwrap();
                source.set_max_record_bytes(max);
                source.set_follow(true);
                let mut records = Vec::new();
                let mut drain = |source: &mut LocalSource| loop {
                    let mut out = Vec::new();
                    source.next_batch(batch, &mut out).unwrap();
                    if out.is_empty() {
                        break;
                    }
                    records.extend(out);
                };
                drain(&mut source);
                std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(&bytes[at..]).unwrap();
                source.look_again().unwrap();
                drain(&mut source);
                // Following, a last line without its newline is not complete yet.
                let complete = &bytes[..bytes.iter().rposition(|&b| b == b'\n').map_or(0, |at| at + 1)];
                let want = expected(complete, max);
                let got: Vec<(Vec<u8>, Option<u64>)> = records.iter().map(|r| (r.value.clone(), r.oversized)).collect();
                prop_assert_eq!(&got, &want);
                prop_assert_eq!(source.positions()[0].byte, complete.len() as u64);
            }
        }
    }
}
