//! The lock that keeps two `tally run`s off one state directory, or one
//! output directory (local mode's fencing).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// Name of the lock file inside a locked directory.
pub const LOCK_FILE: &str = "tally.lock";

/// Why a directory could not be locked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another process holds the lock.
    #[error(
        "directory `{}` is in use by another tally process{holder}; stop it first, or give this run other state and output directories",
        dir.display()
    )]
    Held {
        /// The directory.
        dir: PathBuf,
        /// Who holds it, as its lock file says.
        holder: String,
    },
    /// The lock file could not be created.
    #[error("cannot lock directory `{}`: {source}", dir.display())]
    Io {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// An exclusive lock on a directory, released when dropped (or when the
/// process dies, even by SIGKILL).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Creates `dir` if needed and locks it, or says who holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock, LockError> {
        let io_error = |source| LockError::Io { dir: dir.to_path_buf(), source };
        std::fs::create_dir_all(dir).map_err(io_error)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(LOCK_FILE))
            .map_err(io_error)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let holder = if pid.trim().is_empty() {
                    String::new()
                } else {
                    format!(" (pid {})", pid.trim())
                };
                return Err(LockError::Held { dir: dir.to_path_buf(), holder });
            }
            Err(std::fs::TryLockError::Error(err)) => return Err(io_error(err)),
        }
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| write!(file, "{}", std::process::id()))
            .map_err(io_error)?;
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let err = DirLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is in use by another tally process"), "{err}");
        assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }
}
