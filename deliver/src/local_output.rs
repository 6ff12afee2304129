//! A local job's committed output, read for delivery: the output file up
//! to the length the job committed (read from the job's own store through
//! a [`RocksView`], so a running job is never disturbed), line by line, as
//! partition 0. Bytes past that length may still be cut by the job: they
//! are never read.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};

use tally_state_rocks::RocksView;

use crate::source::{Line, Payload, Positions, Source, SourceError};

/// Most bytes read from the output at once.
const READ_CHUNK_BYTES: usize = 4 << 20;

/// A local job's committed output.
pub struct LocalOutput {
    file_path: PathBuf,
    job_db: PathBuf,
    view_dir: PathBuf,
    output: String,
    view: Option<RocksView>,
    file: Option<File>,
    /// The offset of the first line not handed out.
    cursor: u64,
    /// The committed length when last looked at.
    committed: u64,
    /// Lines read and not yet handed out, in order.
    buffered: VecDeque<Line>,
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
            cursor: 0,
            committed: 0,
            buffered: VecDeque::new(),
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
            lines.push(Line {
                partition: 0,
                offset: from + start as u64,
                next: from + end as u64 + 1,
                payload: Payload::Json(buffer[start..end].to_vec()),
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
                        partition: 0,
                        offset: from,
                        next: line_end + 1,
                        payload: Payload::TooLong(line_end - from),
                    });
                    break;
                }
                next += take as u64;
            }
        }
        Ok(lines)
    }
}

impl Source for LocalOutput {
    fn start(&mut self, positions: &Positions) -> Result<(), SourceError> {
        self.cursor = positions.get(&0).copied().unwrap_or(0);
        self.buffered.clear();
        Ok(())
    }

    fn read(&mut self, max: usize) -> Result<Vec<Line>, SourceError> {
        if self.buffered.is_empty() {
            if self.cursor >= self.committed {
                self.committed = self.committed_length()?;
            }
            self.buffered = self.read_chunk(self.cursor, self.committed)?.into();
        }
        let take = max.min(self.buffered.len());
        let lines: Vec<Line> = self.buffered.drain(..take).collect();
        if let Some(last) = lines.last() {
            self.cursor = last.next;
        }
        Ok(lines)
    }

    fn caught_up(&self) -> bool {
        self.buffered.is_empty() && self.cursor >= self.committed
    }
}
