//! Builds JavaScript and TypeScript plugins: a package (`package.json`, its
//! `main` the module that exports `aggregator`; with `"tally": { "world":
//! "periods-plugin" }`, a period plugin exporting `config` and `periods`)
//! is staged with Tally's JavaScript SDK as the package `tally` (`tally`,
//! `tally/periods`), compiled by the package's own `tsc` when `main` is a
//! `.ts` file, then made into a component by componentize-qjs (QuickJS),
//! with every WASI import stubbed: the component imports only
//! `tally:plugin` (state, output and log; a period plugin only log).

use std::path::Path;
use std::process::Command;

use crate::stage::{
    World, find_tool, is_inside, is_plain_name, read_manifest_text, stage_sources, write_files,
};
use crate::{BuildError, BuiltPlugin};

/// The JavaScript SDK, built into every JavaScript plugin as the package
/// `tally` (with its types, which a TypeScript build checks against): the
/// SDK always matches the contracts this host links.
macro_rules! sdk_files {
    ($($file:literal),* $(,)?) => {
        &[$((concat!("node_modules/tally/", $file), include_str!(concat!("../../js/", $file)))),*]
    };
}
const JS_SDK: &[(&str, &str)] = sdk_files!(
    "package.json",
    "tally.js",
    "tally.d.ts",
    "json.js",
    "json.d.ts",
    "logger.js",
    "periods.js",
    "periods.d.ts",
);
/// The npm package that builds JavaScript plugins, at the version checked.
pub const COMPONENTIZE_QJS: &str = "componentize-qjs@0.4.5";
/// Where a plugin package's own install of it lives.
const LOCAL_TOOL: &str = "node_modules/.bin/componentize-qjs";
/// Where a TypeScript package's own compiler lives.
const LOCAL_TSC: &str = "node_modules/.bin/tsc";
/// Where the stage keeps the JavaScript a TypeScript build emits.
const EMITTED: &str = ".tally-js";

/// Builds the JavaScript plugin package in `dir` into a component under
/// `target_dir`.
pub fn build_js(dir: &Path, target_dir: &Path) -> Result<BuiltPlugin, BuildError> {
    let Manifest { package, main, world } = read_manifest(dir)?;
    let tool = find_tool("TALLY_COMPONENTIZE_QJS", dir, LOCAL_TOOL, "componentize-qjs")
        .ok_or(BuildError::NoJsToolchain)?;
    let stage = target_dir.join("js").join(&package);
    stage_sources(dir, &stage, target_dir, &["js", "mjs", "json", "ts", "mts"])?;
    write_files(&stage, JS_SDK)?;
    write_files(&stage, &[("wit/plugin.wit", world.wit())])?;
    let entry = match main.strip_suffix(".ts") {
        None => stage.join(&main),
        Some(module) => {
            compile_typescript(dir, &stage, &package)?;
            stage.join(EMITTED).join(format!("{module}.js"))
        }
    };
    let component = target_dir.join(format!("{}.wasm", package.replace('-', "_")));
    let status = Command::new(&tool)
        .arg("--wit")
        .arg(stage.join("wit"))
        .arg("--js")
        .arg(&entry)
        .arg("--module-root")
        .arg(&stage)
        .args(["--world", world.name(), "--stub-wasi", "--sync", "--output"])
        .arg(&component)
        .status()
        .map_err(|source| BuildError::Spawn { program: tool.display().to_string(), source })?;
    if !status.success() {
        return Err(BuildError::Tool { tool: COMPONENTIZE_QJS, package });
    }
    Ok(BuiltPlugin { package, component })
}

/// Compiles the staged TypeScript package with its `tsconfig.json` (types
/// checked against the staged SDK's) into the stage's [`EMITTED`].
fn compile_typescript(dir: &Path, stage: &Path, package: &str) -> Result<(), BuildError> {
    let tsc =
        find_tool("TALLY_TSC", dir, LOCAL_TSC, "tsc").ok_or(BuildError::NoTypeScriptCompiler)?;
    let status = Command::new(&tsc)
        .arg("-p")
        .arg(stage.join("tsconfig.json"))
        .arg("--outDir")
        .arg(stage.join(EMITTED))
        .arg("--rootDir")
        .arg(stage)
        .args(["--noEmit", "false"])
        .status()
        .map_err(|source| BuildError::Spawn { program: tsc.display().to_string(), source })?;
    if !status.success() {
        return Err(BuildError::Tool { tool: "tsc", package: package.to_string() });
    }
    Ok(())
}

/// What a package's `package.json` says of its plugin.
struct Manifest {
    /// The package's name, without its scope.
    package: String,
    /// Its entry module (`.js`, or `.ts` for TypeScript).
    main: String,
    /// The contract it is built against.
    world: World,
}

/// The package's name, entry module and world, from its `package.json`.
fn read_manifest(dir: &Path) -> Result<Manifest, BuildError> {
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
    if main.ends_with(".ts") && !dir.join("tsconfig.json").is_file() {
        return Err(not_a_package(format!(
            "its \"main\" `{main}` is TypeScript but it has no tsconfig.json: add one that compiles it"
        )));
    }
    let world = match &manifest["tally"]["world"] {
        serde_json::Value::Null => World::Plugin,
        serde_json::Value::String(world) => World::named(Some(world))
            .map_err(|reason| not_a_package(format!("package.json \"tally\": {reason}")))?,
        _ => {
            return Err(not_a_package("package.json \"tally\": \"world\" must be a string".into()));
        }
    };
    Ok(Manifest { package: name.to_string(), main: main.to_string(), world })
}
