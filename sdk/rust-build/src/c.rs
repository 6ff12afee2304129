//! Builds C plugins: a directory of `.c` files (its name is the plugin's;
//! `test_*.c` are its native tests and stay out) is compiled with clang for
//! `wasm32-wasi` against wasi-libc, together with Tally's C SDK and the
//! checked-in `tally:plugin` bindings, then made into a component. A
//! plugin that includes `tally_periods.h` is a period plugin
//! (`tally:plugin@0.2.0`): it gets that SDK and those bindings. The SDK
//! uses only libc's memory functions, so the component imports no WASI at
//! all; a plugin that calls what needs WASI (stdio, clocks, files) is
//! refused, naming the import.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::stage::{World, io, is_plain_name, on_path, path_dirs, write_files};
use crate::{BuildError, BuiltPlugin, componentize, write_if_changed};

/// What a C plugin is built with, for one contract: the SDK and the
/// bindings, from the `tally` binary's own copy (they always match the
/// contract this host links), and the component type the bindings link in
/// (from `wit-bindgen c`).
struct Sdk {
    /// (file name, text): headers, and the sources compiled with the plugin
    /// (`tally_json.c`, the JSON decoder both SDKs share, is included by
    /// the SDK's source).
    files: &'static [(&'static str, &'static str)],
    /// The `.c` files of `files` to compile.
    sources: [&'static str; 2],
    /// The component-type object file's name and bytes.
    component_type: (&'static str, &'static [u8]),
}

/// The SDK of the `process` contract (`tally.h`).
const PLUGIN_SDK: Sdk = Sdk {
    files: &[
        ("tally.h", include_str!("../../c/tally.h")),
        ("tally.c", include_str!("../../c/tally.c")),
        ("tally_json.h", include_str!("../../c/tally_json.h")),
        ("tally_json.c", include_str!("../../c/tally_json.c")),
        ("plugin.h", include_str!("../../c/bindings/plugin.h")),
        ("plugin.c", include_str!("../../c/bindings/plugin.c")),
    ],
    sources: ["tally.c", "plugin.c"],
    component_type: ("plugin_component_type.o", COMPONENT_TYPE),
};
/// The SDK of the period contract (`tally_periods.h`).
const PERIODS_SDK: Sdk = Sdk {
    files: &[
        ("tally_periods.h", include_str!("../../c/tally_periods.h")),
        ("tally_periods.c", include_str!("../../c/tally_periods.c")),
        ("tally_json.h", include_str!("../../c/tally_json.h")),
        ("tally_json.c", include_str!("../../c/tally_json.c")),
        ("periods_plugin.h", include_str!("../../c/bindings/periods_plugin.h")),
        ("periods_plugin.c", include_str!("../../c/bindings/periods_plugin.c")),
    ],
    sources: ["tally_periods.c", "periods_plugin.c"],
    component_type: (
        "periods_plugin_component_type.o",
        include_bytes!("../../c/bindings/periods_plugin_component_type.o"),
    ),
};
/// The component type the `process` bindings link in.
const COMPONENT_TYPE: &[u8] = include_bytes!("../../c/bindings/plugin_component_type.o");

/// The object file, from `wit-bindgen c`, that carries `world`'s
/// component type.
pub(crate) fn component_type(world: World) -> &'static [u8] {
    match world {
        World::Plugin => PLUGIN_SDK.component_type.1,
        World::Periods => PERIODS_SDK.component_type.1,
    }
}
/// Most bytes of a plugin source read to find which SDK it includes.
const MAX_SOURCE_BYTES: u64 = 16 << 20;
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
    let sdk = match world_of(dir)? {
        World::Plugin => &PLUGIN_SDK,
        World::Periods => &PERIODS_SDK,
    };
    let clang = find_clang().ok_or(BuildError::NoCToolchain)?;
    let stage = target_dir.join("c").join(&package);
    if stage.exists() {
        std::fs::remove_dir_all(&stage).map_err(io("clearing", &stage))?;
    }
    write_files(&stage.join("sdk"), sdk.files)?;
    let component_type = stage.join("sdk").join(sdk.component_type.0);
    std::fs::write(&component_type, sdk.component_type.1)
        .map_err(io("writing", &component_type))?;
    let module = stage.join(format!("{package}.core.wasm"));
    let status = Command::new(&clang)
        .args(FLAGS)
        .arg("-I")
        .arg(dir)
        .arg("-I")
        .arg(stage.join("sdk"))
        .args(&sources)
        .args(sdk.sources.map(|source| stage.join("sdk").join(source)))
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

/// The contract of the plugin in `dir`: a period plugin when one of its
/// top-level `.c` or `.h` files includes `tally_periods.h`.
fn world_of(dir: &Path) -> Result<World, BuildError> {
    for entry in std::fs::read_dir(dir).map_err(io("reading", dir))? {
        let path = entry.map_err(io("reading", dir))?.path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        if !path.is_file()
            || name.starts_with("test_")
            || !(name.ends_with(".c") || name.ends_with(".h"))
        {
            continue;
        }
        let size = std::fs::metadata(&path).map_err(io("reading", &path))?.len();
        if size > MAX_SOURCE_BYTES {
            return Err(BuildError::NotAPackage {
                path: dir.to_path_buf(),
                reason: format!(
                    "`{name}` has {size} bytes, more than a plugin source may ({MAX_SOURCE_BYTES})"
                ),
            });
        }
        let text = std::fs::read(&path).map_err(io("reading", &path))?;
        if String::from_utf8_lossy(&text).lines().any(includes_periods_header) {
            return Ok(World::Periods);
        }
    }
    Ok(World::Plugin)
}

/// Whether a line of C is `#include "tally_periods.h"` (or `<…>`).
fn includes_periods_header(line: &str) -> bool {
    let Some(directive) = line.trim_start().strip_prefix('#') else { return false };
    let Some(header) = directive.trim_start().strip_prefix("include") else { return false };
    matches!(header.trim(), "\"tally_periods.h\"" | "<tally_periods.h>")
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
