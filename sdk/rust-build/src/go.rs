//! Builds Go plugins: a module (`go.mod`; its main package calls
//! `tally.Export` from an init func, or, a period plugin, imports
//! `tally/periods` and calls `periods.Export`) is staged with Tally's Go SDK
//! and the checked-in `tally:plugin` bindings, compiled by Go for `wasip1`
//! (`-buildmode=c-shared`), then made into a component with Tally's closed
//! `wasi_snapshot_preview1` adapter (`sdk/go/closed-wasi.wat`) answering the
//! Go runtime's WASI calls inside the component: no arguments, environment
//! or files, stdout and stderr to the plugin log, the batch's time for
//! clocks and a generator seeded from its input position. The component
//! imports only `tally:plugin` (state, output and log; a period plugin
//! only log).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::stage::{
    World, io, is_plain_name, on_path, read_manifest_text, stage_sources, write_files,
};
use crate::{BuildError, BuiltPlugin, write_if_changed};

/// The SDK, the bindings and their support module, built into every Go
/// plugin from the `tally` binary's own copy (paths under `sdk/go`).
macro_rules! sdk_files {
    ($($path:literal),* $(,)?) => { &[$(($path, include_str!(concat!("../../go/", $path)))),*] };
}
const SDK_FILES: &[(&str, &str)] = sdk_files!(
    "go.mod",
    "tally.go",
    "json.go",
    "scan.go",
    "internal/host/host.go",
    "internal/periodhost/periodhost.go",
    "export_tally_plugin_aggregator/host.go",
    "export_tally_plugin_aggregator/process.go",
    "export_tally_plugin_config/config.go",
    "export_tally_plugin_periods/periods.go",
    "periods/periods.go",
    "periods/engine.go",
    "periods/log.go",
    "periods/log_wasip1.go",
    "bindings/tally_plugin_aggregator/empty.s",
    "bindings/tally_plugin_aggregator/wit_bindings.go",
    "bindings/tally_plugin_log/empty.s",
    "bindings/tally_plugin_log/wit_bindings.go",
    "bindings/tally_plugin_output/empty.s",
    "bindings/tally_plugin_output/wit_bindings.go",
    "bindings/tally_plugin_state/empty.s",
    "bindings/tally_plugin_state/wit_bindings.go",
    "bindings/tally_plugin_types/empty.s",
    "bindings/tally_plugin_types/wit_bindings.go",
    "bindings/periods/tally_plugin_log/empty.s",
    "bindings/periods/tally_plugin_log/wit_bindings.go",
    "bindings/periods/tally_plugin_periods/empty.s",
    "bindings/periods/tally_plugin_periods/wit_bindings.go",
    "bindings/periods/tally_plugin_types/empty.s",
    "bindings/periods/tally_plugin_types/wit_bindings.go",
    "third_party/pkg/go.mod",
    "third_party/pkg/LICENSE",
    "third_party/pkg/wit/runtime/empty.s",
    "third_party/pkg/wit/runtime/runtime.go",
    "third_party/pkg/wit/types/option.go",
    "third_party/pkg/wit/types/result.go",
    "third_party/pkg/wit/types/tuple.go",
    "third_party/pkg/wit/types/unit.go",
);
/// The main-package glue the bindings generator writes: the `process` export.
const EXPORTS_GLUE: &str = include_str!("../../go/bindings/wit_exports.go.txt");
/// The same for a period plugin: the `config` and `periods` exports.
const PERIODS_EXPORTS_GLUE: &str = include_str!("../../go/bindings/wit_exports_periods.go.txt");
/// The closed `wasi_snapshot_preview1` the Go runtime's imports link to:
/// `sdk/go/closed-wasi.wat` assembled, with the world it imports (the
/// plugin log) embedded. `tests/all/closed_wasi.rs` checks it is, and
/// writes it again with TALLY_REGENERATE=1.
const CLOSED_WASI: &[u8] = include_bytes!("../../go/closed-wasi.wasm");
/// The same for a period plugin, whose log is `tally:plugin/log@0.2.0`.
const CLOSED_WASI_PERIODS: &[u8] = include_bytes!("../../go/closed-wasi-periods.wasm");
/// The SDK package whose import makes a Go plugin a period plugin.
const PERIODS_PACKAGE: &str = "tally/periods";
/// What builds Go plugins.
pub const GO_TOOLCHAIN: &str =
    "Go 1.25 or newer (https://go.dev/dl, or Debian's golang-go from bookworm-backports)";

/// Builds the Go plugin module in `dir` into a component under `target_dir`.
pub fn build_go(dir: &Path, target_dir: &Path) -> Result<BuiltPlugin, BuildError> {
    let package = module_name(dir)?;
    let go = find_go().ok_or(BuildError::NoGoToolchain)?;
    let stage = target_dir.join("go").join(&package);
    let plugin = stage.join("plugin");
    stage_sources(dir, &plugin, target_dir, &["go", "mod", "sum"])?;
    remove_tests(&plugin)?;
    write_files(&stage.join("sdk"), SDK_FILES)?;
    let sdk = stage.join("sdk");
    let go_command = |args: &[&str]| {
        let mut command = Command::new(&go);
        command.args(args).current_dir(&plugin);
        command
            .env("GOOS", "wasip1")
            .env("GOARCH", "wasm")
            .env("GOTOOLCHAIN", "local")
            .env("GOWORK", "off");
        // Everything is staged: nothing is fetched.
        command.env("GOFLAGS", "-mod=mod").env("GOPROXY", "off");
        command
    };
    let replace_tally = format!("-replace=tally={}", sdk.display());
    let replace_pkg =
        format!("-replace=go.bytecodealliance.org/pkg={}", sdk.join("third_party/pkg").display());
    let module = stage.join(format!("{package}.core.wasm"));
    let steps: [Vec<String>; 2] = [
        vec![
            "mod".into(),
            "edit".into(),
            replace_tally,
            replace_pkg,
            "-require=tally@v0.0.0".into(),
            "-require=go.bytecodealliance.org/pkg@v0.4.0".into(),
        ],
        vec![
            "build".into(),
            "-buildmode=c-shared".into(),
            "-trimpath".into(),
            // The bindings' support module reaches runtime.sbrk (before the
            // runtime starts, cabi_realloc has no heap to allocate from).
            "-ldflags=-checklinkname=0".into(),
            "-o".into(),
            module.display().to_string(),
            ".".into(),
        ],
    ];
    let [edit, build] = steps;
    let run = |step: &[String]| -> Result<Vec<u8>, BuildError> {
        let args: Vec<&str> = step.iter().map(String::as_str).collect();
        let output = go_command(&args)
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|source| BuildError::Spawn { program: go.display().to_string(), source })?;
        if !output.status.success() {
            return Err(BuildError::Tool { tool: "go", package: package.clone() });
        }
        Ok(output.stdout)
    };
    run(&edit)?;
    // The main package's imports say which contract it is built against.
    let imports = run(&["list".into(), "-f".into(), "{{join .Imports \" \"}}".into(), ".".into()])?;
    let world = if String::from_utf8_lossy(&imports)
        .split_whitespace()
        .any(|import| import == PERIODS_PACKAGE)
    {
        World::Periods
    } else {
        World::Plugin
    };
    let (glue, adapter) = match world {
        World::Plugin => (EXPORTS_GLUE, CLOSED_WASI),
        World::Periods => (PERIODS_EXPORTS_GLUE, CLOSED_WASI_PERIODS),
    };
    write_files(&plugin, &[("tally_exports.go", glue)])?;
    run(&build)?;
    let mut core = std::fs::read(&module).map_err(io("reading", &module))?;
    core.extend_from_slice(&component_type_section(world));
    let component = componentize_with_adapter(&core, adapter)
        .map_err(|reason| BuildError::Componentize { package: package.clone(), reason })?;
    let path = target_dir.join(format!("{}.wasm", package.replace('-', "_")));
    write_if_changed(&path, &component)?;
    Ok(BuiltPlugin { package, component: path })
}

/// Wraps a core module that imports `wasi_snapshot_preview1` into a
/// component whose only imports are `tally:plugin`'s.
pub fn componentize_with_closed_wasi(module: &[u8]) -> Result<Vec<u8>, String> {
    componentize_with_adapter(module, CLOSED_WASI)
}

/// Wraps a core module with `adapter` as its `wasi_snapshot_preview1`.
fn componentize_with_adapter(module: &[u8], adapter: &[u8]) -> Result<Vec<u8>, String> {
    wit_component::ComponentEncoder::default()
        .module(module)
        .and_then(|encoder| encoder.adapter("wasi_snapshot_preview1", adapter))
        .and_then(|encoder| encoder.validate(true).encode())
        .map_err(|err| format!("{err:#}"))
}

/// The `component-type` custom section (the `world`, encoded) that
/// wit-bindgen puts in the C bindings' object file: Go's bindings carry
/// none, so the Go module gets this one appended.
fn component_type_section(world: World) -> Vec<u8> {
    fn leb(bytes: &[u8], at: &mut usize) -> usize {
        let (mut value, mut shift) = (0usize, 0);
        loop {
            let byte = bytes[*at];
            *at += 1;
            value |= ((byte & 0x7f) as usize) << shift;
            if byte < 0x80 {
                return value;
            }
            shift += 7;
        }
    }
    let object = crate::c::component_type(world);
    let mut at = 8; // magic and version
    while at < object.len() {
        let (id, start) = (object[at], at);
        at += 1;
        let size = leb(object, &mut at);
        let end = at + size;
        let mut name_at = at;
        let name_len = leb(object, &mut name_at);
        if id == 0 && object[name_at..name_at + name_len].starts_with(b"component-type") {
            return object[start..end].to_vec();
        }
        at = end;
    }
    unreachable!("the checked-in bindings carry a component-type section")
}

/// Drops the staged `_test.go` files: tests are for `go test`, natively.
fn remove_tests(dir: &Path) -> Result<(), BuildError> {
    for entry in std::fs::read_dir(dir).map_err(io("reading", dir))? {
        let path = entry.map_err(io("reading", dir))?.path();
        if path.is_dir() {
            remove_tests(&path)?;
        } else if path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.ends_with("_test.go"))
        {
            std::fs::remove_file(&path).map_err(io("removing", &path))?;
        }
    }
    Ok(())
}

/// The last element of the `module` path in `go.mod`.
fn module_name(dir: &Path) -> Result<String, BuildError> {
    let not_a_module = |reason: String| BuildError::NotAPackage { path: dir.to_path_buf(), reason };
    let text = read_manifest_text(&dir.join("go.mod")).map_err(not_a_module)?;
    let module = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("module "))
        .map(|module| module.trim().trim_matches('"'))
        .ok_or_else(|| not_a_module("go.mod has no `module` line".into()))?;
    let name = module.rsplit('/').next().unwrap_or(module);
    if !is_plain_name(name) {
        return Err(not_a_module(format!(
            "module name {name:?} must end in letters, digits, `-`, `_`, `.`"
        )));
    }
    Ok(name.to_string())
}

/// `$TALLY_GO`, the `go` on `PATH`, or the official install's.
fn find_go() -> Option<PathBuf> {
    if let Some(go) = std::env::var_os("TALLY_GO") {
        return Some(PathBuf::from(go));
    }
    on_path("go").or_else(|| Some(PathBuf::from("/usr/local/go/bin/go")).filter(|go| go.is_file()))
}
