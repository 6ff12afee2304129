//! Builds Python plugins: a project (`pyproject.toml`; `[tool.tally]
//! module`, default `app`, names the plugin's module, and `[tool.tally]
//! world = "periods-plugin"` makes it a period plugin) is staged with
//! Tally's Python SDK as the package `tally`, then made into a component
//! by componentize-py (CPython), with every WASI import stubbed: the
//! component imports only `tally:plugin` (state, output and log; a period
//! plugin only log).

use std::path::Path;
use std::process::Command;

use crate::stage::{
    World, find_tool, is_plain_name, read_manifest_text, stage_sources, write_files,
};
use crate::{BuildError, BuiltPlugin};

/// The Python SDK, built into every Python plugin as `tally`: the SDK
/// always matches the contract this host links. (Its `testing` module is
/// for native tests and stays out.)
const PYTHON_SDK: &[(&str, &str)] = &[
    ("tally/__init__.py", include_str!("../../python/tally/__init__.py")),
    ("tally/periods.py", include_str!("../../python/tally/periods.py")),
];
/// The PyPI package that builds Python plugins, at the version checked.
pub const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";
/// Where a plugin project's own virtual environment keeps it.
const LOCAL_TOOL: &str = ".venv/bin/componentize-py";
/// The module a project builds when `[tool.tally] module` is not given.
const DEFAULT_MODULE: &str = "app";

/// Builds the Python plugin project in `dir` into a component under `target_dir`.
pub fn build_python(dir: &Path, target_dir: &Path) -> Result<BuiltPlugin, BuildError> {
    let Manifest { package, module, world } = read_manifest(dir)?;
    let tool = find_tool("TALLY_COMPONENTIZE_PY", dir, LOCAL_TOOL, "componentize-py")
        .ok_or(BuildError::NoPythonToolchain)?;
    let stage = target_dir.join("python").join(&package);
    stage_sources(dir, &stage, target_dir, &["py"])?;
    write_files(&stage, PYTHON_SDK)?;
    write_files(&stage, &[("wit/plugin.wit", world.wit())])?;
    let component = target_dir.join(format!("{}.wasm", package.replace('-', "_")));
    let status = Command::new(&tool)
        .arg("--quiet")
        .arg("--wit-path")
        .arg(stage.join("wit"))
        .args(["--world", world.name(), "componentize", &module, "--stub-wasi", "--python-path"])
        .arg(&stage)
        .arg("--output")
        .arg(&component)
        // Only the staged sources: not the packages of whichever virtual
        // environment the build runs in.
        .env_remove("VIRTUAL_ENV")
        .status()
        .map_err(|source| BuildError::Spawn { program: tool.display().to_string(), source })?;
    if !status.success() {
        return Err(BuildError::Tool { tool: COMPONENTIZE_PY, package });
    }
    Ok(BuiltPlugin { package, component })
}

/// What a project's `pyproject.toml` says of its plugin.
struct Manifest {
    /// The project's name.
    package: String,
    /// The module componentize-py builds.
    module: String,
    /// The contract it is built against.
    world: World,
}

/// The project's name, plugin module and world, from its `pyproject.toml`.
fn read_manifest(dir: &Path) -> Result<Manifest, BuildError> {
    let not_a_project =
        |reason: String| BuildError::NotAPackage { path: dir.to_path_buf(), reason };
    let text = read_manifest_text(&dir.join("pyproject.toml")).map_err(not_a_project)?;
    let manifest: toml::Table = text.parse().map_err(|err: toml::de::Error| {
        not_a_project(format!("pyproject.toml is not TOML: {err}"))
    })?;
    let name = manifest
        .get("project")
        .and_then(|project| project.get("name"))
        .and_then(|name| name.as_str())
        .ok_or_else(|| not_a_project("pyproject.toml has no [project] name".into()))?;
    if !is_plain_name(name) {
        return Err(not_a_project(format!(
            "project name {name:?} must use only letters, digits, `-`, `_`, `.`"
        )));
    }
    let tally = manifest.get("tool").and_then(|tool| tool.get("tally"));
    let world = match tally.and_then(|tally| tally.get("world")) {
        None => World::Plugin,
        Some(world) => World::named(Some(
            world
                .as_str()
                .ok_or_else(|| not_a_project("[tool.tally] world must be a string".into()))?,
        ))
        .map_err(|reason| not_a_project(format!("[tool.tally] {reason}")))?,
    };
    let module = match tally.and_then(|tally| tally.get("module")) {
        None => DEFAULT_MODULE,
        Some(module) => module
            .as_str()
            .ok_or_else(|| not_a_project("[tool.tally] module must be a string".into()))?,
    };
    let is_identifier = |part: &str| {
        part.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if !module.split('.').all(is_identifier) {
        return Err(not_a_project(format!(
            "[tool.tally] module {module:?} must be a dotted module name like `billing`"
        )));
    }
    let top = module.split('.').next().unwrap_or(module);
    if ["tally", "wit_world", "componentize_py_types", "plugin"].contains(&top) {
        return Err(not_a_project(format!(
            "[tool.tally] module {module:?} would shadow the SDK or the world: rename it"
        )));
    }
    let path = dir.join(module.replace('.', "/"));
    if !path.with_extension("py").is_file() && !path.join("__init__.py").is_file() {
        return Err(not_a_project(format!(
            "its module `{module}` has no `{}.py`",
            module.replace('.', "/")
        )));
    }
    Ok(Manifest { package: name.to_string(), module: module.to_string(), world })
}
