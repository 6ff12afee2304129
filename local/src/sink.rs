//! The local sink: one NDJSON file per output, `<output_dir>/<name>.ndjson`.
//!
//! Every line carries its lineage (invariant 7 of `docs/architecture.md`): the source partition
//! and offset, the plugin digest and a deterministic idempotency key:
//!
//! ```text
//! {"key":{..},"value":..,"source":{"partition":"usage-0.ndjson","offset":12},"plugin":"sha256:0a0cc431694e80a6","idempotency_key":"billing/0/12/0"}
//! ```
//!
//! `plugin` is the first 16 hex digits of the component's SHA-256 (the whole
//! digest is logged and shown by `tally plugin inspect`): enough to tell
//! versions apart, at a fraction of the bytes on every line.
//!
//! Dead letters go to the dead-letter output's file, with the reason and the
//! record as read. Appends become durable with [`LocalSink::sync`]; after a
//! crash, [`LocalSink::open`] cuts each file back to its committed length.
//! [`LocalSink::stage`] writes a transaction's lines while it is still
//! open and starts their writeback, so the fsync at its commit has little
//! left to wait for; [`LocalSink::cut_to`] cuts them again if it aborts.
//! Only bytes up to a file's committed length are output: a reader of a
//! running job's files must not trust what lies beyond.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use rustc_hash::FxHashSet;
use serde::de::IgnoredAny;

use tally_core::transaction::{DeadLetter, PendingOutput, SourcePosition};

/// A failure writing outputs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// An output file could not be opened, written or synced.
    #[error("cannot write output `{}`: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An output file holds bytes this job never committed (a fresh state
    /// directory over an old output directory).
    #[error(
        "output `{}` already holds {len} bytes that this job's state directory never committed; \
         Tally will not overwrite them: move the file away, or use another output directory",
        path.display()
    )]
    Foreign {
        /// The file.
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
    },
    /// An output file is shorter than what was committed to it.
    #[error(
        "output `{}` has {len} bytes, but {committed} bytes were committed to it: it was changed outside Tally; \
         restore it, or start over with a new state directory and output directory",
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
}

/// Static parts of every line's lineage.
#[derive(Debug, Clone)]
pub struct Lineage {
    /// Job name, the first part of idempotency keys.
    pub job: String,
    /// Partition names (input file names), by index.
    pub partitions: Vec<String>,
    /// The same names as JSON strings, quoted once rather than on every line.
    quoted_partitions: Vec<String>,
    /// Digest of the plugin that produced the records, as written on lines.
    pub plugin_digest: String,
}

/// Hex digits of the plugin digest written on every line.
const LINE_DIGEST_HEX: usize = 16;

impl Lineage {
    /// Lineage of `job` over `partitions`, run by the plugin with `digest`
    /// (`sha256:<hex>`, shortened on lines).
    pub fn new(job: &str, partitions: Vec<String>, digest: &str) -> Lineage {
        let quoted_partitions = partitions
            .iter()
            .map(|name| serde_json::to_string(name).expect("a string serializes"))
            .collect();
        Lineage {
            job: job.to_string(),
            partitions,
            quoted_partitions,
            plugin_digest: short_digest(digest).to_string(),
        }
    }

    /// Records that the plugin version with `digest` runs (a no-op, without
    /// allocating, when it already did).
    pub fn set_plugin_digest(&mut self, digest: &str) {
        let short = short_digest(digest);
        if short != self.plugin_digest {
            self.plugin_digest = short.to_string();
        }
    }
}

/// `sha256:<hex>` shortened to the digits written on lines: a prefix.
fn short_digest(digest: &str) -> &str {
    match digest.split_once(':') {
        Some((algorithm, hex)) if hex.len() > LINE_DIGEST_HEX => {
            digest.get(..algorithm.len() + 1 + LINE_DIGEST_HEX).unwrap_or(digest)
        }
        _ => digest,
    }
}

struct OutputFile {
    path: PathBuf,
    file: File,
    /// Committed length.
    len: u64,
    /// Bytes written after `len` by the open transaction, not yet synced.
    staged: u64,
    /// Formatted bytes not yet written.
    pending: Vec<u8>,
}

/// Formatted bytes an output holds before [`LocalSink::stage`] writes them.
const STAGE_BYTES: usize = 1 << 20;

/// The output files of a local job; the last one is the dead-letter output.
pub struct LocalSink {
    files: Vec<OutputFile>,
    known_keys: KnownJsonKeys,
}

/// Output keys already found to be one-line JSON. An aggregation's keys
/// repeat (billing has one per customer, metric and month), and checking
/// every output's key again cost ~7% of a local billing job's CPU.
#[derive(Default)]
struct KnownJsonKeys(FxHashSet<Box<[u8]>>);

impl KnownJsonKeys {
    /// Keys remembered at most; then the set starts over.
    const CAPACITY: usize = 4096;
    /// Longest key remembered.
    const MAX_KEY_BYTES: usize = 512;

    /// Writes `key` as [`write_json_or_text`] does, checking it only if it
    /// is not known.
    fn write(&mut self, line: &mut Vec<u8>, key: &[u8]) {
        if self.0.contains(key) {
            line.extend_from_slice(key);
        } else if is_one_line_json(key) {
            line.extend_from_slice(key);
            if key.len() <= Self::MAX_KEY_BYTES {
                if self.0.len() >= Self::CAPACITY {
                    self.0.clear();
                }
                self.0.insert(key.into());
            }
        } else {
            write_json_string(line, &String::from_utf8_lossy(key));
        }
    }
}

impl LocalSink {
    /// Opens (creating) `<dir>/<name>.ndjson` for each of `names`, cut back
    /// to `committed[i]` bytes. `None` means nothing was ever committed to
    /// it: the file must then be missing or empty.
    pub fn open(
        dir: &Path,
        names: &[String],
        committed: &[Option<u64>],
    ) -> Result<LocalSink, SinkError> {
        std::fs::create_dir_all(dir)
            .map_err(|source| SinkError::Write { path: dir.to_path_buf(), source })?;
        let files = names
            .iter()
            .enumerate()
            .map(|(index, name)| {
                let path = dir.join(format!("{name}.ndjson"));
                let write_error = |source| SinkError::Write { path: path.clone(), source };
                let file = OpenOptions::new().create(true).append(true).open(&path).map_err(write_error)?;
                let len = file.metadata().map_err(write_error)?.len();
                let Some(committed) = committed.get(index).copied().flatten() else {
                    if len > 0 {
                        return Err(SinkError::Foreign { path, len });
                    }
                    return Ok(OutputFile { path, file, len: 0, staged: 0, pending: Vec::new() });
                };
                if len < committed {
                    return Err(SinkError::Shrunk { path, len, committed });
                }
                if len > committed {
                    tracing::info!(output = %path.display(), from = len, to = committed, "cutting uncommitted output");
                    file.set_len(committed).map_err(write_error)?;
                    file.sync_all().map_err(write_error)?;
                }
                Ok(OutputFile { path, file, len: committed, staged: 0, pending: Vec::new() })
            })
            .collect::<Result<_, _>>()?;
        Ok(LocalSink { files, known_keys: KnownJsonKeys::default() })
    }

    /// Path of output `index`.
    pub fn path(&self, index: usize) -> &Path {
        &self.files[index].path
    }

    /// Formats `outputs` and `dead_letters` into the pending bytes of their files.
    pub fn format(
        &mut self,
        outputs: &[PendingOutput],
        dead_letters: &[DeadLetter],
        lineage: &Lineage,
    ) {
        for record in outputs {
            let line = &mut self.files[record.output].pending;
            line.extend_from_slice(b"{\"key\":");
            match &record.key {
                Some(key) => self.known_keys.write(line, key),
                None => line.extend_from_slice(b"null"),
            }
            line.extend_from_slice(b",\"value\":");
            write_json_or_text(line, &record.value);
            match &record.fact {
                None => write_lineage(line, record.source, record.sequence, lineage),
                Some(fact) => write_fact_lineage(line, record.source, fact, lineage),
            }
            line.extend_from_slice(b"}\n");
        }
        let dead_letter_file = self.files.len() - 1;
        for dead in dead_letters {
            let line = &mut self.files[dead_letter_file].pending;
            line.extend_from_slice(b"{\"reason\":");
            write_json_string(line, &dead.reason);
            line.extend_from_slice(b",\"record\":");
            write_json_string(line, &String::from_utf8_lossy(&dead.record));
            write_lineage(line, dead.source, 0, lineage);
            line.extend_from_slice(b"}\n");
        }
    }

    /// Writes the pending bytes of every output holding at least
    /// [`STAGE_BYTES`] of them, and asks the kernel to start writing them
    /// to disk, without waiting (they are not committed).
    pub fn stage(&mut self) -> Result<(), SinkError> {
        for output in &mut self.files {
            if output.pending.len() >= STAGE_BYTES {
                let staged_before = output.staged;
                output.write_pending()?;
                start_writeback(
                    &output.file,
                    output.len + staged_before,
                    output.staged - staged_before,
                );
            }
        }
        Ok(())
    }

    /// Writes and syncs the pending bytes; returns every file's new length.
    pub fn sync(&mut self) -> Result<Vec<u64>, SinkError> {
        for output in &mut self.files {
            output.write_pending()?;
            if output.staged == 0 {
                continue;
            }
            output
                .file
                .sync_data()
                .map_err(|source| SinkError::Write { path: output.path.clone(), source })?;
            output.len += output.staged;
            output.staged = 0;
        }
        Ok(self.files.iter().map(|output| output.len).collect())
    }

    /// Cuts every file back to `lengths`, its committed length: drops the
    /// lines of a transaction that will not commit, whether pending, staged
    /// or already synced by its prepare.
    pub fn cut_to(&mut self, lengths: &[u64]) -> Result<(), SinkError> {
        for (output, &length) in self.files.iter_mut().zip(lengths) {
            debug_assert!(length <= output.len, "a committed length is a synced one");
            output.pending.clear();
            if output.staged > 0 || output.len != length {
                output
                    .file
                    .set_len(length)
                    .map_err(|source| SinkError::Write { path: output.path.clone(), source })?;
            }
            output.len = length;
            output.staged = 0;
        }
        Ok(())
    }
}

impl OutputFile {
    /// Appends the pending bytes to the file (uncommitted until synced).
    fn write_pending(&mut self) -> Result<(), SinkError> {
        if !self.pending.is_empty() {
            (&self.file)
                .write_all(&self.pending)
                .map_err(|source| SinkError::Write { path: self.path.clone(), source })?;
            self.staged += self.pending.len() as u64;
            self.pending.clear();
        }
        Ok(())
    }
}

/// Starts writeback of `len` bytes of `file` from `offset` (Linux); the
/// fsync at commit then waits for less. Only a hint: failures are ignored,
/// the fsync reports real ones.
fn start_writeback(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd as _;
        // SAFETY: sync_file_range only reads the descriptor and the numbers.
        unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                offset as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// `,"source":{..},"plugin":"..","idempotency_key":".."` (no closing
/// brace). The job name and digest need no escaping (config validation
/// allows only `[A-Za-z0-9._-]` in job names).
fn write_lineage(line: &mut Vec<u8>, source: SourcePosition, sequence: u32, lineage: &Lineage) {
    write_source_and_plugin(line, source, lineage);
    let mut number = itoa::Buffer::new();
    line.extend_from_slice(b",\"idempotency_key\":\"");
    line.extend_from_slice(lineage.job.as_bytes());
    for part in [u64::from(source.partition), source.offset, u64::from(sequence)] {
        line.push(b'/');
        line.extend_from_slice(number.format(part).as_bytes());
    }
    line.push(b'"');
}

/// Like [`write_lineage`], for a record that states a fact (a period's
/// FINAL or ADJUSTMENT): its idempotency key is `<job>/<fact>`, whatever
/// input record happened to cause it.
fn write_fact_lineage(line: &mut Vec<u8>, source: SourcePosition, fact: &str, lineage: &Lineage) {
    write_source_and_plugin(line, source, lineage);
    line.extend_from_slice(b",\"idempotency_key\":");
    write_json_string(line, &format!("{}/{fact}", lineage.job));
}

/// `,"source":{..},"plugin":".."`.
fn write_source_and_plugin(line: &mut Vec<u8>, source: SourcePosition, lineage: &Lineage) {
    let mut number = itoa::Buffer::new();
    line.extend_from_slice(b",\"source\":{\"partition\":");
    line.extend_from_slice(lineage.quoted_partitions[source.partition as usize].as_bytes());
    line.extend_from_slice(b",\"offset\":");
    line.extend_from_slice(number.format(source.offset).as_bytes());
    line.extend_from_slice(b"},\"plugin\":\"");
    line.extend_from_slice(lineage.plugin_digest.as_bytes());
    line.push(b'"');
}

/// Embeds `bytes` as is when they are UTF-8 JSON on one line, else as a
/// JSON string.
fn write_json_or_text(line: &mut Vec<u8>, bytes: &[u8]) {
    if is_one_line_json(bytes) {
        line.extend_from_slice(bytes);
    } else {
        write_json_string(line, &String::from_utf8_lossy(bytes));
    }
}

/// Whether `bytes` are one JSON value, in UTF-8, on one line.
fn is_one_line_json(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes).is_ok_and(|text| !text.contains(['\n', '\r']))
        && serde_json::from_slice::<IgnoredAny>(bytes).is_ok()
}

fn write_json_string(line: &mut Vec<u8>, text: &str) {
    serde_json::to_writer(line, text).expect("writing to a Vec cannot fail");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lineage() -> Lineage {
        Lineage::new("billing", vec!["p0.ndjson".into()], "sha256:ab")
    }

    #[test]
    fn lines_carry_lineage_and_only_synced_bytes_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let names = vec!["totals".to_string(), "dead-letters".to_string()];
        let mut sink = LocalSink::open(dir.path(), &names, &[None, None]).unwrap();
        let output = PendingOutput {
            output: 0,
            key: Some(b"\"acme\"".to_vec()),
            value: b"{\"total\":3}".to_vec(),
            source: SourcePosition { partition: 0, offset: 7 },
            sequence: 1,
            fact: None,
        };
        let dead = DeadLetter {
            source: SourcePosition { partition: 0, offset: 8 },
            reason: "bad".into(),
            record: b"x\"y".to_vec(),
        };
        sink.format(std::slice::from_ref(&output), &[dead], &lineage());
        let lengths = sink.sync().unwrap();
        let totals = std::fs::read_to_string(sink.path(0)).unwrap();
        assert_eq!(
            totals,
            "{\"key\":\"acme\",\"value\":{\"total\":3},\"source\":{\"partition\":\"p0.ndjson\",\"offset\":7},\"plugin\":\"sha256:ab\",\"idempotency_key\":\"billing/0/7/1\"}\n"
        );
        let dead_line: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(sink.path(1)).unwrap()).unwrap();
        assert_eq!(dead_line["reason"], "bad");
        assert_eq!(dead_line["record"], "x\"y");

        // Bytes written after the last commit are cut on reopen, and the
        // next writes append after the committed ones.
        sink.format(std::slice::from_ref(&output), &[], &lineage());
        sink.sync().unwrap();
        let committed: Vec<Option<u64>> = lengths.iter().copied().map(Some).collect();
        let mut sink = LocalSink::open(dir.path(), &names, &committed).unwrap();
        assert_eq!(std::fs::read_to_string(sink.path(0)).unwrap(), totals);
        sink.format(&[output], &[], &lineage());
        sink.sync().unwrap();
        assert_eq!(std::fs::read_to_string(sink.path(0)).unwrap(), totals.repeat(2));
    }

    #[test]
    fn staged_lines_reach_the_file_before_the_commit_and_are_cut_if_it_aborts() {
        let dir = tempfile::tempdir().unwrap();
        let names = vec!["totals".to_string(), "dead-letters".to_string()];
        let mut sink = LocalSink::open(dir.path(), &names, &[None, None]).unwrap();
        let output = |offset| PendingOutput {
            output: 0,
            key: None,
            value: vec![b'7'; 1000],
            source: SourcePosition { partition: 0, offset },
            sequence: 0,
            fact: None,
        };
        let many: Vec<PendingOutput> = (0..1100).map(output).collect(); // over STAGE_BYTES formatted
        let file_len = |sink: &LocalSink| std::fs::metadata(sink.path(0)).unwrap().len();

        sink.format(&many, &[], &lineage());
        sink.stage().unwrap();
        assert!(
            file_len(&sink) >= STAGE_BYTES as u64,
            "staged lines are written before the commit"
        );
        sink.cut_to(&[0, 0]).unwrap();
        assert_eq!(file_len(&sink), 0, "an abort cuts them");

        sink.format(&[output(0)], &[], &lineage());
        sink.stage().unwrap();
        assert_eq!(file_len(&sink), 0, "a few lines wait for more");
        sink.format(&many, &[], &lineage());
        sink.stage().unwrap();
        sink.format(&[output(1)], &[], &lineage());
        let lengths = sink.sync().unwrap();
        assert_eq!(lengths[0], file_len(&sink), "the commit covers staged and pending lines");
        let text = std::fs::read_to_string(sink.path(0)).unwrap();
        assert_eq!(text.lines().count(), 1102);

        // An abort after a commit cuts back to the committed length only.
        sink.format(&many, &[], &lineage());
        sink.stage().unwrap();
        sink.cut_to(&lengths).unwrap();
        assert_eq!(std::fs::read_to_string(sink.path(0)).unwrap(), text);

        // An abort after a prepare that synced lines, before the commit
        // point, cuts those too.
        sink.format(&many, &[], &lineage());
        sink.sync().unwrap();
        sink.cut_to(&lengths).unwrap();
        assert_eq!(std::fs::read_to_string(sink.path(0)).unwrap(), text);
    }

    #[test]
    fn lines_carry_a_short_plugin_digest() {
        let lineage =
            Lineage::new("job", vec![], &format!("sha256:{}", "0123456789abcdef".repeat(4)));
        assert_eq!(lineage.plugin_digest, "sha256:0123456789abcdef");
    }

    #[test]
    fn a_value_that_is_not_one_line_of_utf8_json_is_written_as_a_string() {
        for (value, written) in [
            (&b"not json"[..], &b"\"not json\""[..]),
            (b"\"bad \xff utf-8\"", b"\"\\\"bad \xef\xbf\xbd utf-8\\\"\""),
            (b"{\"a\":1}\r", b"\"{\\\"a\\\":1}\\r\""),
        ] {
            let mut line = Vec::new();
            write_json_or_text(&mut line, value);
            assert_eq!(String::from_utf8_lossy(&line), String::from_utf8_lossy(written));
        }
    }

    #[test]
    fn a_remembered_key_is_written_as_a_new_one_is() {
        let mut known = KnownJsonKeys::default();
        for key in [&b"{\"customer\":\"acme\"}"[..], b"not json", b"{\"a\":\n1}"] {
            let mut expected = Vec::new();
            write_json_or_text(&mut expected, key);
            for _ in 0..2 {
                let mut line = Vec::new();
                known.write(&mut line, key);
                assert_eq!(String::from_utf8_lossy(&line), String::from_utf8_lossy(&expected));
            }
        }
        assert_eq!(known.0.len(), 1, "only the JSON key is remembered");
        for n in 0..KnownJsonKeys::CAPACITY + 1 {
            known.write(&mut Vec::new(), n.to_string().as_bytes());
        }
        assert!(known.0.len() <= KnownJsonKeys::CAPACITY, "the set is bounded");
    }

    #[test]
    fn a_shrunk_output_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err =
            LocalSink::open(dir.path(), &["totals".into()], &[Some(10)]).err().unwrap().to_string();
        assert!(err.contains("has 0 bytes, but 10 bytes were committed"), "{err}");
    }

    #[test]
    fn an_output_this_job_never_committed_is_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("totals.ndjson"), "someone else's line\n").unwrap();
        let err =
            LocalSink::open(dir.path(), &["totals".into()], &[None]).err().unwrap().to_string();
        assert!(
            err.contains("already holds 20 bytes that this job's state directory never committed"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("totals.ndjson")).unwrap(),
            "someone else's line\n"
        );
    }
}
