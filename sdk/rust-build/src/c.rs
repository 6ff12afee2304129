//! Builds C plugins: a directory of `.c` files (its name is the plugin's;
//! `test_*.c` are its native tests and stay out) is compiled with clang for
//! `wasm32-wasi` against wasi-libc, together with Tally's C SDK and the
//! checked-in `tally:plugin` bindings, then made into a component. The SDK
//! uses only libc's memory functions, so the component imports no WASI at
//! all; a plugin that calls what needs WASI (stdio, clocks, files) is
//! refused, naming the import.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::stage::{io, is_plain_name, on_path, path_dirs, write_files};
use crate::{BuildError, BuiltPlugin, componentize, write_if_changed};

/// The SDK and the bindings, built into every C plugin from the `tally`
/// binary's own copy: they always match the contract this host links.
const SDK_FILES: &[(&str, &str)] = &[
    ("tally.h", include_str!("../../c/tally.h")),
    ("tally.c", include_str!("../../c/tally.c")),
    ("plugin.h", include_str!("../../c/bindings/plugin.h")),
    ("plugin.c", include_str!("../../c/bindings/plugin.c")),
];
/// The component type the bindings link in (from `wit-bindgen c`).
pub(crate) const COMPONENT_TYPE: &[u8] = include_bytes!("../../c/bindings/plugin_component_type.o");
/// The Debian packages that build C plugins.
pub const C_TOOLCHAIN: &str = "clang-22 lld-22 wasi-libc libclang-rt-22-dev-wasm32";
/// Compiler flags: wasi-libc for malloc and the mem* functions, no start
/// files (a plugin is a library), small and without debug information.
const FLAGS: &[&str] = &[
    "--target=wasm32-wasi",
    "-Wno-deprecated", // clang 22 prefers the name wasm32-wasip1; Debian's wasi-libc is installed as wasm32-wasi
    "-std=c11",
    "-O2",
    "-Wall",
    "-nostartfiles",
    "-Wl,--no-entry",
    "-Wl,--strip-debug",
];

/// Builds the C plugin in `dir` into a component under `target_dir`.
pub fn build_c(dir: &Path, target_dir: &Path) -> Result<BuiltPlugin, BuildError> {
    let package = package_name(dir)?;
    let sources = plugin_sources(dir)?;
    let clang = find_clang().ok_or(BuildError::NoCToolchain)?;
    let stage = target_dir.join("c").join(&package);
    if stage.exists() {
        std::fs::remove_dir_all(&stage).map_err(io("clearing", &stage))?;
    }
    write_files(&stage.join("sdk"), SDK_FILES)?;
    let component_type = stage.join("sdk/plugin_component_type.o");
    std::fs::write(&component_type, COMPONENT_TYPE).map_err(io("writing", &component_type))?;
    let module = stage.join(format!("{package}.core.wasm"));
    let status = Command::new(&clang)
        .args(FLAGS)
        .arg("-I")
        .arg(dir)
        .arg("-I")
        .arg(stage.join("sdk"))
        .args(&sources)
        .arg(stage.join("sdk/tally.c"))
        .arg(stage.join("sdk/plugin.c"))
        .arg(&component_type)
        .arg("-o")
        .arg(&module)
        .status()
        .map_err(|source| BuildError::Spawn { program: clang.display().to_string(), source })?;
    if !status.success() {
        return Err(BuildError::Tool { tool: "clang", package });
    }
    let bytes = std::fs::read(&module).map_err(io("reading", &module))?;
    let component = componentize(&bytes).map_err(|reason| BuildError::Componentize {
        package: package.clone(),
        reason: if reason.contains("wasi_snapshot_preview1") {
            format!("it calls a libc function that needs WASI (stdio, time, files, environment), which plugins cannot import: {reason}")
        } else {
            reason
        },
    })?;
    let path = target_dir.join(format!("{}.wasm", package.replace('-', "_")));
    write_if_changed(&path, &component)?;
    Ok(BuiltPlugin { package, component: path })
}

/// Whether `dir` holds a C plugin: `.c` files at its top.
pub(crate) fn is_c_plugin(dir: &Path) -> bool {
    plugin_sources(dir).is_ok_and(|sources| !sources.is_empty())
}

/// The plugin's `.c` files, but its tests (`test_*.c`), in name order.
fn plugin_sources(dir: &Path) -> Result<Vec<PathBuf>, BuildError> {
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io("reading", dir))? {
        let path = entry.map_err(io("reading", dir))?.path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        if path.is_file() && name.ends_with(".c") && !name.starts_with("test_") {
            sources.push(path);
        }
    }
    sources.sort();
    Ok(sources)
}

/// The plugin's name: its directory's.
fn package_name(dir: &Path) -> Result<String, BuildError> {
    let absolute = std::fs::canonicalize(dir).map_err(io("reading", dir))?;
    let name = absolute.file_name().and_then(|name| name.to_str()).unwrap_or_default();
    if !is_plain_name(name) {
        return Err(BuildError::NotAPackage {
            path: dir.to_path_buf(),
            reason: format!(
                "a C plugin is named by its directory, and {name:?} must use only letters, digits, `-`, `_`, `.`"
            ),
        });
    }
    Ok(name.to_string())
}

/// `$TALLY_CLANG`, else the newest `clang-<version>` on `PATH`, else `clang`.
fn find_clang() -> Option<PathBuf> {
    if let Some(clang) = std::env::var_os("TALLY_CLANG") {
        return Some(PathBuf::from(clang));
    }
    let newest = path_dirs()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.strip_prefix("clang-")?.parse().ok()?;
            Some((version, entry.path()))
        })
        .max();
    newest.map(|(_, path)| path).or_else(|| on_path("clang"))
}
