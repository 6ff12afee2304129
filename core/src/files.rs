//! Small file operations the host's own bookkeeping needs.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` whole or not at all: a synced temporary file
/// renamed over it, then the directory synced. `path`'s directory must exist.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let parent =
        path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    std::fs::File::open(parent)?.sync_all()
}
