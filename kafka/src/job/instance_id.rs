//! The instance id of a state directory: what makes its transactional id,
//! the same across restarts.

use std::path::{Path, PathBuf};

/// Why a state directory's instance id cannot be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstanceIdError {
    /// The file holds something else than an id.
    #[error("`{}` holds {found:?}, not an instance id (16 hex digits); delete the file to give this state directory a new one", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What it holds.
        found: String,
    },
    /// Reading or writing it failed.
    #[error("cannot {action} `{}`: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
}

/// Reads (or creates) the id that makes this state directory's
/// transactional id: the same after a restart, so a restarted process
/// fences its previous incarnation and aborts what it left open.
pub(super) fn instance_id(state_dir: &Path) -> Result<String, InstanceIdError> {
    let path = state_dir.join("instance-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if valid_instance_id(id.trim()) => return Ok(id.trim().to_string()),
        Ok(id) => return Err(InstanceIdError::Damaged { found: id.trim().to_string(), path }),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(io("read", &path)(err)),
    }
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut bytes))
        .map_err(io("read an instance id from", Path::new("/dev/urandom")))?;
    let id: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    // Written whole or not at all: a torn file would give several processes
    // the same (empty) transactional id.
    tally_core::files::write_atomically(&path, id.as_bytes()).map_err(io("write", &path))?;
    Ok(id)
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> InstanceIdError {
    let path = path.to_path_buf();
    move |source| InstanceIdError::Io { action, path, source }
}

pub(super) fn valid_instance_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|byte| byte.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_id_is_kept_and_a_damaged_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let id = instance_id(dir.path()).unwrap();
        assert!(valid_instance_id(&id));
        assert_eq!(instance_id(dir.path()).unwrap(), id, "the same directory keeps its id");
        std::fs::write(dir.path().join("instance-id"), "").unwrap();
        let err = instance_id(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not an instance id") && err.contains("delete the file"), "{err}");
    }
}
