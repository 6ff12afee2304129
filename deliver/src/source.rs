//! A local job's committed output, read for delivery: the output file up
//! to the length the job committed (read from the job's own store through
//! a [`RocksView`], so a running job is never disturbed), line by line.
//! Bytes past that length may still be cut by the job: they are never read.

use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};

use tally_state_rocks::RocksView;

/// Most bytes read from the output at once.
const READ_CHUNK_BYTES: usize = 4 << 20;

/// One line of the committed output.
#[derive(Debug)]
pub struct Line {
    /// Its byte offset.
    pub offset: u64,
    /// The offset just past its line end.
    pub next: u64,
    /// Its bytes, or its length when it is longer than a read.
    pub bytes: Result<Vec<u8>, u64>,
}

/// A failure reading the committed output.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The job's store or output file cannot be read.
    #[error("cannot read the committed output `{}`: {reason}", path.display())]
    Read {
        /// The file or store.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The job's committed output is shorter than what was delivered.
    #[error(
        "output `{}` has {committed} committed bytes, but this delivery has read up to byte {position}: \
         the job's state or output was replaced; deliver the new output with a new delivery state_dir",
        path.display()
    )]
    Shrunk {
        /// The output file.
        path: PathBuf,
        /// What the job has committed.
        committed: u64,
        /// What the delivery has read.
        position: u64,
    },
}

/// A local job's committed output.
pub struct LocalOutput {
    file_path: PathBuf,
    job_db: PathBuf,
    view_dir: PathBuf,
    output: String,
    view: Option<RocksView>,
    file: Option<File>,
    /// Lines read and not yet handed out, in order.
    buffered: std::collections::VecDeque<Line>,
}

impl LocalOutput {
    /// The output `output` of a local job whose file is `file_path` and
    /// whose store is `job_db`; the view's own files go in `view_dir`.
    pub fn new(
        file_path: PathBuf,
        job_db: PathBuf,
        view_dir: PathBuf,
        output: String,
    ) -> LocalOutput {
        LocalOutput {
            file_path,
            job_db,
            view_dir,
            output,
            view: None,
            file: None,
            buffered: std::collections::VecDeque::new(),
        }
    }

    /// The output file.
    pub fn path(&self) -> &Path {
        &self.file_path
    }

    /// How many bytes of the output the job has committed (0 before its
    /// first commit).
    pub fn committed_length(&mut self) -> Result<u64, SourceError> {
        let read_error =
            |path: &Path, reason: String| SourceError::Read { path: path.to_path_buf(), reason };
        if self.view.is_none() {
            if !self.job_db.join("CURRENT").exists() {
                return Ok(0);
            }
            std::fs::create_dir_all(&self.view_dir)
                .map_err(|err| read_error(&self.view_dir, err.to_string()))?;
            let view = RocksView::open(&self.job_db, &self.view_dir)
                .map_err(|err| read_error(&self.job_db, err.to_string()))?;
            self.view = Some(view);
        }
        let view = self.view.as_ref().expect("opened above");
        view.catch_up().map_err(|err| read_error(&self.job_db, err.to_string()))?;
        let key = tally_local::committed_length_key(&self.output);
        match view.get_meta(&key).map_err(|err| read_error(&self.job_db, err.to_string()))? {
            None => Ok(0),
            Some(value) => tally_local::parse_committed_length(&value).ok_or_else(|| {
                read_error(
                    &self.job_db,
                    format!("its committed length of `{}` is damaged", self.output),
                )
            }),
        }
    }

    /// Up to `max` whole lines from `from`, all before `committed` (fewer
    /// when a read's worth of bytes holds fewer).
    pub fn read(
        &mut self,
        from: u64,
        committed: u64,
        max: usize,
    ) -> Result<Vec<Line>, SourceError> {
        if self.buffered.front().is_none_or(|line| line.offset != from) {
            self.buffered = self.read_chunk(from, committed)?.into();
        }
        let take = max.min(self.buffered.len());
        Ok(self.buffered.drain(..take).collect())
    }

    /// The whole lines between `from` and `committed`, up to about a
    /// read's worth of bytes.
    fn read_chunk(&mut self, from: u64, committed: u64) -> Result<Vec<Line>, SourceError> {
        if committed < from {
            return Err(SourceError::Shrunk {
                path: self.file_path.clone(),
                committed,
                position: from,
            });
        }
        if committed == from {
            return Ok(Vec::new());
        }
        let path = self.file_path.clone();
        let read_error =
            |err: std::io::Error| SourceError::Read { path: path.clone(), reason: err.to_string() };
        if self.file.is_none() {
            self.file = Some(File::open(&self.file_path).map_err(read_error)?);
        }
        let file = self.file.as_mut().expect("opened above");
        let wanted = (committed - from).min(READ_CHUNK_BYTES as u64) as usize;
        let mut buffer = vec![0; wanted];
        file.seek(SeekFrom::Start(from)).map_err(read_error)?;
        file.read_exact(&mut buffer).map_err(read_error)?;
        let mut lines = Vec::new();
        let mut start = 0;
        while let Some(end) = buffer[start..].iter().position(|&b| b == b'\n') {
            let end = start + end;
            let offset = from + start as u64;
            lines.push(Line {
                offset,
                next: from + end as u64 + 1,
                bytes: Ok(buffer[start..end].to_vec()),
            });
            start = end + 1;
        }
        if lines.is_empty() {
            // One line longer than a read: find its end, and say how long.
            let mut next = from + wanted as u64;
            let mut chunk = vec![0; 64 << 10];
            loop {
                if next >= committed {
                    // Committed lengths end at line ends; a file without
                    // one there was changed outside Tally.
                    return Err(SourceError::Read {
                        path: self.file_path.clone(),
                        reason: format!(
                            "its committed bytes end inside a line at byte {committed}"
                        ),
                    });
                }
                let take = (committed - next).min(chunk.len() as u64) as usize;
                file.read_exact(&mut chunk[..take]).map_err(read_error)?;
                if let Some(end) = chunk[..take].iter().position(|&b| b == b'\n') {
                    let line_end = next + end as u64;
                    lines.push(Line {
                        offset: from,
                        next: line_end + 1,
                        bytes: Err(line_end - from),
                    });
                    break;
                }
                next += take as u64;
            }
        }
        Ok(lines)
    }
}
