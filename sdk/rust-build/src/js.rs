//! Builds JavaScript plugins: a package (`package.json`, its `main` the
//! module that exports `aggregator`) is staged with Tally's JavaScript SDK
//! as the module `tally`, then made into a component by componentize-qjs
//! (QuickJS), with every WASI import stubbed: the component imports only
//! `tally:plugin` (state, output, log).

use std::path::Path;
use std::process::Command;

use crate::stage::{
    PLUGIN_WIT, find_tool, is_inside, is_plain_name, read_manifest_text, stage_sources, write_files,
};
use crate::{BuildError, BuiltPlugin};

/// The JavaScript SDK, built into every JavaScript plugin as `tally`: the
/// SDK always matches the contract this host links.
const JS_SDK: &str = include_str!("../../js/tally.js");
/// Its types, staged beside it for editors.
const JS_SDK_TYPES: &str = include_str!("../../js/tally.d.ts");
/// The npm package that builds JavaScript plugins, at the version checked.
pub const COMPONENTIZE_QJS: &str = "componentize-qjs@0.4.5";
/// Where a plugin package's own install of it lives.
const LOCAL_TOOL: &str = "node_modules/.bin/componentize-qjs";

/// Builds the JavaScript plugin package in `dir` into a component under
/// `target_dir`.
pub fn build_js(dir: &Path, target_dir: &Path) -> Result<BuiltPlugin, BuildError> {
    let (package, main) = read_manifest(dir)?;
    let tool = find_tool("TALLY_COMPONENTIZE_QJS", dir, LOCAL_TOOL, "componentize-qjs")
        .ok_or(BuildError::NoJsToolchain)?;
    let stage = target_dir.join("js").join(&package);
    stage_sources(dir, &stage, target_dir, &["js", "mjs", "json"])?;
    write_files(
        &stage,
        &[
            ("node_modules/tally/index.js", JS_SDK),
            ("node_modules/tally/index.d.ts", JS_SDK_TYPES),
            (
                "node_modules/tally/package.json",
                "{\"name\":\"tally\",\"type\":\"module\",\"main\":\"index.js\",\"types\":\"index.d.ts\"}\n",
            ),
            ("wit/plugin.wit", PLUGIN_WIT),
        ],
    )?;
    let component = target_dir.join(format!("{}.wasm", package.replace('-', "_")));
    let status = Command::new(&tool)
        .arg("--wit")
        .arg(stage.join("wit"))
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

/// The package's name and entry module, from its `package.json`.
fn read_manifest(dir: &Path) -> Result<(String, String), BuildError> {
    let not_a_package =
        |reason: String| BuildError::NotAPackage { path: dir.to_path_buf(), reason };
    let text = read_manifest_text(&dir.join("package.json")).map_err(not_a_package)?;
    let manifest: serde_json::Value = serde_json::from_str(&text)
        .map_err(|err| not_a_package(format!("package.json is not JSON: {err}")))?;
    let name = manifest["name"]
        .as_str()
        .ok_or_else(|| not_a_package("package.json has no \"name\"".into()))?;
    let name = name.rsplit('/').next().unwrap_or(name); // a scope is not part of the file name
    if !is_plain_name(name) {
        return Err(not_a_package(format!(
            "package name {name:?} must use only letters, digits, `-`, `_`, `.`"
        )));
    }
    let main = manifest["main"].as_str().unwrap_or("index.js");
    if !is_inside(Path::new(main)) {
        return Err(not_a_package(format!("\"main\" {main:?} must be a path inside the package")));
    }
    if !dir.join(main).is_file() {
        return Err(not_a_package(format!("its \"main\" module `{main}` does not exist")));
    }
    Ok((name.to_string(), main.to_string()))
}
