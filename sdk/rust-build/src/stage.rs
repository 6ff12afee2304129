//! What the builds of interpreted languages share: a staging copy of the
//! plugin's sources, the build tool's lookup, and bounded manifest reads.

use std::path::{Path, PathBuf};

use crate::BuildError;

/// The `process` contract (`tally:plugin@0.1.0`, world `plugin`).
const PLUGIN_WIT: &str = include_str!("../../../wit/tally-plugin@0.1.0/plugin.wit");
/// The period contract (`tally:plugin@0.2.0`, world `periods-plugin`).
const PERIODS_WIT: &str = include_str!("../../../wit/tally-plugin@0.2.0/plugin.wit");

/// The contract a plugin in another language is built against: its WIT
/// world. (A Rust plugin's SDK macro picks it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum World {
    /// `tally:plugin@0.1.0`: `process`, with state and outputs.
    Plugin,
    /// `tally:plugin@0.2.0`: a period plugin (`describe`, `add`, `value`).
    Periods,
}

impl World {
    /// The world's name in its WIT package.
    pub fn name(self) -> &'static str {
        match self {
            World::Plugin => "plugin",
            World::Periods => "periods-plugin",
        }
    }

    /// The WIT package that defines it.
    pub(crate) fn wit(self) -> &'static str {
        match self {
            World::Plugin => PLUGIN_WIT,
            World::Periods => PERIODS_WIT,
        }
    }

    /// The world a manifest names (`None`: not named, the `process` one);
    /// `Err` says which names there are.
    pub(crate) fn named(name: Option<&str>) -> Result<World, String> {
        match name {
            None | Some("plugin") => Ok(World::Plugin),
            Some("periods-plugin") => Ok(World::Periods),
            Some(other) => Err(format!(
                "world {other:?} is not one Tally builds: name \"periods-plugin\" \
                 (a period plugin, tally:plugin@0.2.0) or \"plugin\" (the default, tally:plugin@0.1.0)"
            )),
        }
    }
}

/// Most bytes of a plugin manifest (`package.json`, `pyproject.toml`) read.
pub(crate) const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// A failed `action` on `path`, for `map_err`.
pub(crate) fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BuildError {
    let path = path.to_path_buf();
    move |source| BuildError::Io { action, path, source }
}

/// Reads a manifest of at most [`MAX_MANIFEST_BYTES`]; `Err` says why not.
pub(crate) fn read_manifest_text(path: &Path) -> Result<String, String> {
    let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let size = std::fs::metadata(path).map_err(|err| format!("cannot read {name}: {err}"))?.len();
    if size > MAX_MANIFEST_BYTES {
        return Err(format!("{name} has {size} bytes, more than {MAX_MANIFEST_BYTES}"));
    }
    std::fs::read_to_string(path).map_err(|err| format!("cannot read {name}: {err}"))
}

/// Whether `name` is a package name fit for a file name.
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !name.starts_with('.')
}

/// Whether `relative` stays inside the directory it is relative to.
pub(crate) fn is_inside(relative: &Path) -> bool {
    !relative.is_absolute()
        && !relative.components().any(|part| matches!(part, std::path::Component::ParentDir))
}

/// Empties `stage`, then copies the files of `dir` whose extension is in
/// `extensions` into it, recursively: not hidden directories (`.venv`,
/// `.git`), `node_modules`, `target`, `__pycache__`, nor the build's own
/// output `target_dir`, which may sit inside the plugin.
pub(crate) fn stage_sources(
    dir: &Path,
    stage: &Path,
    target_dir: &Path,
    extensions: &[&str],
) -> Result<(), BuildError> {
    if stage.exists() {
        std::fs::remove_dir_all(stage).map_err(io("clearing", stage))?;
    }
    std::fs::create_dir_all(target_dir).map_err(io("creating", target_dir))?;
    let skip = std::fs::canonicalize(target_dir).ok();
    copy_sources(dir, stage, skip.as_deref(), extensions)
}

fn copy_sources(
    dir: &Path,
    stage: &Path,
    skip: Option<&Path>,
    extensions: &[&str],
) -> Result<(), BuildError> {
    std::fs::create_dir_all(stage).map_err(io("creating", stage))?;
    for entry in std::fs::read_dir(dir).map_err(io("reading", dir))? {
        let entry = entry.map_err(io("reading", dir))?;
        let path = entry.path();
        let name = entry.file_name();
        let kind = entry.file_type().map_err(io("reading", &path))?;
        let skipped =
            ["node_modules", "target", "__pycache__"].iter().any(|skipped| name == *skipped)
                || name.to_string_lossy().starts_with('.');
        if kind.is_dir() && !skipped && std::fs::canonicalize(&path).ok().as_deref() != skip {
            copy_sources(&path, &stage.join(&name), skip, extensions)?;
        } else if kind.is_file()
            && path
                .extension()
                .and_then(|ext| ext.to_str())
                .is_some_and(|ext| extensions.contains(&ext))
        {
            std::fs::copy(&path, stage.join(&name)).map_err(io("copying", &path))?;
        }
    }
    Ok(())
}

/// Writes `files` (path relative to `root`, text) under `root`.
pub(crate) fn write_files(root: &Path, files: &[(&str, &str)]) -> Result<(), BuildError> {
    for (relative, text) in files {
        let path = root.join(relative);
        let parent = path.parent().expect("a file sits in a directory");
        std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
        std::fs::write(&path, text).map_err(io("writing", &path))?;
    }
    Ok(())
}

/// A build tool: the path in `$env_var`, the plugin's own install at
/// `dir/local`, or `name` on `PATH`; `None` when there is none.
pub(crate) fn find_tool(env_var: &str, dir: &Path, local: &str, name: &str) -> Option<PathBuf> {
    if let Some(tool) = std::env::var_os(env_var) {
        return Some(PathBuf::from(tool));
    }
    let local = dir.join(local);
    if local.is_file() {
        return Some(local);
    }
    on_path(name)
}

/// The directories of `PATH`.
pub(crate) fn path_dirs() -> impl Iterator<Item = PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
}

/// `name` in a directory of `PATH`.
pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    path_dirs().map(|dir| dir.join(name)).find(|path| path.is_file())
}
