//! Builds JavaScript plugins: a package (`package.json`, its `main` the
//! module that exports `aggregator`) is staged with Tally's JavaScript SDK
//! as the module `tally`, then made into a component by componentize-qjs
//! (QuickJS), with every WASI import stubbed: the component imports only
//! `tally:plugin` (state, output, log).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{BuildError, BuiltPlugin};

/// The JavaScript SDK, built into every JavaScript plugin as `tally`: the
/// SDK always matches the contract this host links.
const JS_SDK: &str = include_str!("../../js/tally.js");
/// Its types, staged beside it for editors.
const JS_SDK_TYPES: &str = include_str!("../../js/tally.d.ts");
/// The contract JavaScript plugins are built against.
const PLUGIN_WIT: &str = include_str!("../../../wit/tally-plugin@0.1.0/plugin.wit");
/// The npm package that builds JavaScript plugins, at the version checked.
pub const COMPONENTIZE_QJS: &str = "componentize-qjs@0.4.5";
/// Where a plugin package's own install of it lives.
const LOCAL_TOOL: &str = "node_modules/.bin/componentize-qjs";
/// Most bytes of `package.json` read.
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// Builds the JavaScript plugin package in `dir` into a component under
/// `target_dir`.
pub fn build_js(dir: &Path, target_dir: &Path) -> Result<BuiltPlugin, BuildError> {
    let (package, main) = read_manifest(dir)?;
    let tool = componentize_qjs(dir)?;
    let stage = target_dir.join("js").join(&package);
    if stage.exists() {
        std::fs::remove_dir_all(&stage).map_err(io("clearing", &stage))?;
    }
    std::fs::create_dir_all(target_dir).map_err(io("creating", target_dir))?;
    let skip = std::fs::canonicalize(target_dir).ok();
    copy_sources(dir, &stage, skip.as_deref())?;
    let sdk = stage.join("node_modules").join("tally");
    std::fs::create_dir_all(&sdk).map_err(io("creating", &sdk))?;
    for (name, text) in [
        ("index.js", JS_SDK),
        ("index.d.ts", JS_SDK_TYPES),
        ("package.json", "{\"name\":\"tally\",\"type\":\"module\",\"main\":\"index.js\",\"types\":\"index.d.ts\"}\n"),
    ] {
        std::fs::write(sdk.join(name), text).map_err(io("writing", &sdk.join(name)))?;
    }
    let wit = stage.join("wit");
    std::fs::create_dir_all(&wit).map_err(io("creating", &wit))?;
    std::fs::write(wit.join("plugin.wit"), PLUGIN_WIT).map_err(io("writing", &wit))?;
    let component = target_dir.join(format!("{}.wasm", package.replace('-', "_")));
    let status = Command::new(&tool)
        .arg("--wit")
        .arg(&wit)
        .arg("--js")
        .arg(stage.join(&main))
        .arg("--module-root")
        .arg(&stage)
        .args(["--world", "plugin", "--stub-wasi", "--sync", "--output"])
        .arg(&component)
        .status()
        .map_err(|source| BuildError::Spawn { program: tool.display().to_string(), source })?;
    if !status.success() {
        return Err(BuildError::Tool { tool: COMPONENTIZE_QJS, package });
    }
    Ok(BuiltPlugin { package, component })
}

/// A failed `action` on `path`, for `map_err`.
fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BuildError {
    let path = path.to_path_buf();
    move |source| BuildError::Io { action, path, source }
}

/// The package's name and entry module, from its `package.json`.
fn read_manifest(dir: &Path) -> Result<(String, String), BuildError> {
    let path = dir.join("package.json");
    let not_a_package = |reason: String| BuildError::NotAPackage { path: dir.to_path_buf(), reason };
    let size = std::fs::metadata(&path).map_err(|err| not_a_package(format!("cannot read package.json: {err}")))?.len();
    if size > MAX_MANIFEST_BYTES {
        return Err(not_a_package(format!("package.json has {size} bytes, more than {MAX_MANIFEST_BYTES}")));
    }
    let text = std::fs::read_to_string(&path).map_err(|err| not_a_package(format!("cannot read package.json: {err}")))?;
    let manifest: serde_json::Value =
        serde_json::from_str(&text).map_err(|err| not_a_package(format!("package.json is not JSON: {err}")))?;
    let name = manifest["name"].as_str().ok_or_else(|| not_a_package("package.json has no \"name\"".into()))?;
    let name = name.rsplit('/').next().unwrap_or(name); // a scope is not part of the file name
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(not_a_package(format!("package name {name:?} must use only letters, digits, `-`, `_`, `.`")));
    }
    let main = manifest["main"].as_str().unwrap_or("index.js");
    let main_path = Path::new(main);
    if main_path.is_absolute() || main_path.components().any(|part| matches!(part, std::path::Component::ParentDir)) {
        return Err(not_a_package(format!("\"main\" {main:?} must be a path inside the package")));
    }
    if !dir.join(main_path).is_file() {
        return Err(not_a_package(format!("its \"main\" module `{main}` does not exist")));
    }
    Ok((name.to_string(), main.to_string()))
}

/// Copies the package's modules (`.js`, `.mjs`, `.json`) into `stage`:
/// not its `node_modules`, `target` or hidden directories, nor `skip` (the
/// build's own output, which may sit inside the package).
fn copy_sources(dir: &Path, stage: &Path, skip: Option<&Path>) -> Result<(), BuildError> {
    std::fs::create_dir_all(stage).map_err(io("creating", stage))?;
    for entry in std::fs::read_dir(dir).map_err(io("reading", dir))? {
        let entry = entry.map_err(io("reading", dir))?;
        let path = entry.path();
        let name = entry.file_name();
        let kind = entry.file_type().map_err(io("reading", &path))?;
        let skipped = name == "node_modules" || name == "target" || name.to_string_lossy().starts_with('.');
        if kind.is_dir() && !skipped && std::fs::canonicalize(&path).ok().as_deref() != skip {
            copy_sources(&path, &stage.join(&name), skip)?;
        } else if kind.is_file() && matches!(path.extension().and_then(|ext| ext.to_str()), Some("js" | "mjs" | "json")) {
            std::fs::copy(&path, stage.join(&name)).map_err(io("copying", &path))?;
        }
    }
    Ok(())
}

/// componentize-qjs: `$TALLY_COMPONENTIZE_QJS`, the package's own install,
/// or the one on `PATH`.
fn componentize_qjs(dir: &Path) -> Result<PathBuf, BuildError> {
    if let Some(tool) = std::env::var_os("TALLY_COMPONENTIZE_QJS") {
        return Ok(PathBuf::from(tool));
    }
    let local = dir.join(LOCAL_TOOL);
    if local.is_file() {
        return Ok(local);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|path| path.join("componentize-qjs"))
        .find(|path| path.is_file());
    on_path.ok_or(BuildError::NoJsToolchain)
}
