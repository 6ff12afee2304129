//! Builds plugins into Tally Wasm components: Rust crates, JavaScript
//! packages ([`build_js`]), Python projects ([`build_python`]), Go modules
//! ([`build_go`]) and C sources ([`build_c`]); [`build`] tells which a
//! directory holds.
//!
//! A plugin crate (a `cdylib` using `tally-sdk`) is compiled for
//! `wasm32-unknown-unknown`, which gives a component with no WASI imports at
//! all, then wrapped into a component with `wit-component`.
//!
//! Two toolchains are supported, tried in this order:
//! 1. rustup's, when the `wasm32-unknown-unknown` target is installed
//!    (`rustup target add wasm32-unknown-unknown`);
//! 2. Debian's `rustc-web` with the standard library built from source
//!    (`apt-get install rustc-web cargo-web rust-web-src lld-22`).
//!
//! ```no_run
//! let built = tally_plugin_build::build_crate("plugins/usage-billing".as_ref(), "target/tally-wasm".as_ref())?;
//! println!("component at {}", built.component.display());
//! # Ok::<(), tally_plugin_build::BuildError>(())
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

mod c;
mod go;
mod js;
mod python;
mod stage;

pub use c::{C_TOOLCHAIN, build_c};
pub use go::{GO_TOOLCHAIN, build_go, componentize_with_closed_wasi};
pub use js::{COMPONENTIZE_QJS, build_js};
pub use python::{COMPONENTIZE_PY, build_python};

/// The Rust target plugins are compiled for.
pub const WASM_TARGET: &str = "wasm32-unknown-unknown";

/// Release-profile settings for plugin builds.
const PLUGIN_PROFILE: &[&str] =
    &["opt-level=3", "debug=false", "strip=\"debuginfo\"", "lto=true", "codegen-units=1"];

/// Where Debian's `rustc-web` lives.
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
/// Where Debian's `cargo-web` lives.
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
/// Standard-library source shipped by Debian's `rust-web-src`.
const DEBIAN_STD_SOURCE: &str = "/usr/lib/rustlib/src/rust/library";
/// Where Debian's `lld-*` packages put the wasm linker (Debian's rustc has
/// no `rust-lld` of its own).
const DEBIAN_LLVM_DIRS: &str = "/usr/lib";

/// Why a plugin could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No toolchain that can target wasm32 was found.
    #[error(
        "no Rust toolchain that can build wasm32 plugins was found: run `rustup target add {WASM_TARGET}`, \
         or on Debian `apt-get install rustc-web cargo-web rust-web-src lld-22`"
    )]
    NoWasmToolchain,
    /// The crate directory has no readable `Cargo.toml` with a package name.
    #[error("`{path}` is not a plugin crate: {reason}")]
    NotACrate { path: PathBuf, reason: String },
    /// The directory's `package.json` or `pyproject.toml` does not describe a plugin.
    #[error("`{}` is not a plugin package: {reason}", path.display())]
    NotAPackage {
        /// The directory.
        path: PathBuf,
        /// What is wrong, and the fix.
        reason: String,
    },
    /// cargo could not be started.
    #[error("could not run `{program}`: {source}")]
    Spawn { program: String, source: std::io::Error },
    /// cargo ran and failed; its output was printed above.
    #[error("cargo failed to build {packages} for {WASM_TARGET} (its errors are printed above)")]
    Cargo { packages: String },
    /// The build produced no `.wasm` file where expected.
    #[error("the build of `{package}` produced no `{}`: is it a `cdylib` crate?", path.display())]
    NoModule { package: String, path: PathBuf },
    /// The module could not be made into a component.
    #[error("`{package}` could not be made into a component: {reason}")]
    Componentize { package: String, reason: String },
    /// No componentize-qjs to build a JavaScript plugin with.
    #[error(
        "building a JavaScript plugin needs the npm package {COMPONENTIZE_QJS}: run `npm install --save-dev {COMPONENTIZE_QJS}` \
         in the plugin's directory (or `npm install -g {COMPONENTIZE_QJS}`), or set TALLY_COMPONENTIZE_QJS to its path"
    )]
    NoJsToolchain,
    /// No TypeScript compiler to build a TypeScript plugin with.
    #[error(
        "building a TypeScript plugin needs the npm package typescript: run `npm install --save-dev typescript` \
         in the plugin's directory, or set TALLY_TSC to a `tsc`"
    )]
    NoTypeScriptCompiler,
    /// No componentize-py to build a Python plugin with.
    #[error(
        "building a Python plugin needs the PyPI package {COMPONENTIZE_PY}: run `python3 -m venv .venv && .venv/bin/pip install {COMPONENTIZE_PY}` \
         in the plugin's directory (or install it on PATH), or set TALLY_COMPONENTIZE_PY to its path"
    )]
    NoPythonToolchain,
    /// No clang to build a C plugin with.
    #[error(
        "building a C plugin needs clang with a wasm32 linker and wasi-libc: on Debian `apt-get install {C_TOOLCHAIN}`, \
         or set TALLY_CLANG to a clang that targets wasm32-wasi"
    )]
    NoCToolchain,
    /// No Go to build a Go plugin with.
    #[error("building a Go plugin needs {GO_TOOLCHAIN}, or TALLY_GO set to a `go` binary")]
    NoGoToolchain,
    /// A language's build tool ran and failed; its output was printed above.
    #[error("{tool} failed to build `{package}` (its errors are printed above)")]
    Tool {
        /// The tool.
        tool: &'static str,
        /// The plugin package.
        package: String,
    },
    /// The directory holds no plugin this tool knows how to build.
    #[error(
        "`{}` holds no plugin to build: a Rust plugin has a Cargo.toml, a JavaScript one a package.json, a Python one a pyproject.toml, a Go one a go.mod, a C one .c files",
        path.display()
    )]
    UnknownLanguage {
        /// The directory.
        path: PathBuf,
    },
    /// Reading or writing a file failed.
    #[error("{action} `{}`: {source}", path.display())]
    Io { action: &'static str, path: PathBuf, source: std::io::Error },
}

/// A plugin built into a component.
#[derive(Debug, Clone)]
pub struct BuiltPlugin {
    /// The cargo package name.
    pub package: String,
    /// Path of the component file.
    pub component: PathBuf,
}

/// A toolchain able to build for [`WASM_TARGET`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Toolchain {
    /// The `cargo` on `PATH`, whose rustc has the wasm32 standard library.
    Rustup,
    /// Debian's `rustc-web`, building the standard library from source and
    /// linking with LLVM's `wasm-ld` at `linker`.
    Debian { linker: PathBuf },
}

impl Toolchain {
    /// Finds a toolchain, preferring rustup's wasm32 target.
    pub fn detect() -> Result<Toolchain, BuildError> {
        if rustup_has_wasm_target() {
            Ok(Toolchain::Rustup)
        } else if Path::new(DEBIAN_RUSTC).exists()
            && Path::new(DEBIAN_CARGO).exists()
            && Path::new(DEBIAN_STD_SOURCE).exists()
            && let Some(linker) = debian_wasm_linker()
        {
            Ok(Toolchain::Debian { linker })
        } else {
            Err(BuildError::NoWasmToolchain)
        }
    }

    /// A `cargo build --release` command for `packages` of the workspace
    /// (or crate) at `manifest_path`, into `target_dir`.
    fn cargo_build(&self, manifest_path: &Path, packages: &[&str], target_dir: &Path) -> Command {
        let mut command = match self {
            Toolchain::Rustup => Command::new("cargo"),
            Toolchain::Debian { .. } => Command::new(DEBIAN_CARGO),
        };
        clear_outer_cargo_env(&mut command);
        command.arg("build").arg("--release").arg("--target").arg(WASM_TARGET);
        command.arg("--manifest-path").arg(manifest_path).arg("--target-dir").arg(target_dir);
        // Small, fast plugins whatever the workspace's release profile says.
        for setting in PLUGIN_PROFILE {
            command.arg("--config").arg(format!("profile.release.{setting}"));
        }
        for package in packages {
            command.arg("-p").arg(package);
        }
        if let Toolchain::Debian { linker } = self {
            command.env("RUSTC_BOOTSTRAP", "1").env("RUSTC", DEBIAN_RUSTC);
            command.env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", linker);
            command.arg("-Zbuild-std=std,panic_abort");
        }
        command
    }
}

/// Whether the rustc on `PATH` has the wasm32 standard library installed.
fn rustup_has_wasm_target() -> bool {
    let mut command = Command::new("rustc");
    clear_outer_cargo_env(&mut command);
    let Ok(output) = command.args(["--print", "sysroot"]).output() else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_string();
    output.status.success()
        && Path::new(&sysroot).join("lib/rustlib").join(WASM_TARGET).join("lib").is_dir()
}

/// The newest `/usr/lib/llvm-<version>/bin/wasm-ld`.
fn debian_wasm_linker() -> Option<PathBuf> {
    let mut linkers: Vec<(u32, PathBuf)> = std::fs::read_dir(DEBIAN_LLVM_DIRS)
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.strip_prefix("llvm-")?.parse().ok()?;
            let linker = entry.path().join("bin/wasm-ld");
            linker.exists().then_some((version, linker))
        })
        .collect();
    linkers.sort();
    linkers.pop().map(|(_, linker)| linker)
}

/// Removes what an outer cargo (a build script's or test's environment)
/// sets, so the nested build behaves like one run from a shell.
fn clear_outer_cargo_env(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let outer_cargo = name.starts_with("CARGO_")
            && name != "CARGO_HOME"
            && !name.starts_with("CARGO_NET_")
            && !name.starts_with("CARGO_REGISTRIES_")
            && !name.starts_with("CARGO_HTTP_");
        let outer_rustc =
            name.starts_with("RUSTC") || name.starts_with("RUSTDOC") || name == "RUSTFLAGS";
        let build_script = matches!(
            name,
            "TARGET" | "HOST" | "OPT_LEVEL" | "PROFILE" | "DEBUG" | "OUT_DIR" | "NUM_JOBS"
        );
        if outer_cargo || outer_rustc || build_script {
            command.env_remove(name);
        }
    }
}

/// The language a plugin directory is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// A Rust crate (`Cargo.toml`) using `tally-sdk`.
    Rust,
    /// A JavaScript package (`package.json`) using the `tally` module.
    JavaScript,
    /// A Python project (`pyproject.toml`) using the `tally` package.
    Python,
    /// A Go module (`go.mod`) using the `tally` package.
    Go,
    /// C sources (`*.c`) using `tally.h`.
    C,
}

impl Language {
    /// What `dir` holds: a `Cargo.toml` is Rust, a `package.json`
    /// JavaScript, a `pyproject.toml` Python, a `go.mod` Go, `.c` files
    /// (and none of those) C.
    pub fn of(dir: &Path) -> Result<Language, BuildError> {
        if dir.join("Cargo.toml").is_file() {
            Ok(Language::Rust)
        } else if dir.join("package.json").is_file() {
            Ok(Language::JavaScript)
        } else if dir.join("pyproject.toml").is_file() {
            Ok(Language::Python)
        } else if dir.join("go.mod").is_file() {
            Ok(Language::Go)
        } else if c::is_c_plugin(dir) {
            Ok(Language::C)
        } else {
            Err(BuildError::UnknownLanguage { path: dir.to_path_buf() })
        }
    }
}

/// Builds the plugin in `dir`, in whichever language it is written, into a
/// component under `target_dir`.
pub fn build(dir: &Path, target_dir: &Path) -> Result<BuiltPlugin, BuildError> {
    match Language::of(dir)? {
        Language::Rust => build_crate(dir, target_dir),
        Language::JavaScript => build_js(dir, target_dir),
        Language::Python => build_python(dir, target_dir),
        Language::Go => build_go(dir, target_dir),
        Language::C => build_c(dir, target_dir),
    }
}

/// Builds the plugin crate in `crate_dir` into a component under `target_dir`.
pub fn build_crate(crate_dir: &Path, target_dir: &Path) -> Result<BuiltPlugin, BuildError> {
    let manifest_path = crate_dir.join("Cargo.toml");
    let package = package_name(&manifest_path)?;
    let mut built = build_packages(&manifest_path, &[package.as_str()], target_dir)?;
    Ok(built.remove(0))
}

/// Builds `packages` of the workspace at `manifest_path` in one cargo run
/// (the standard library, when built from source, is built once) and turns
/// each into a component at `<target_dir>/components/<package>.wasm`.
pub fn build_packages(
    manifest_path: &Path,
    packages: &[&str],
    target_dir: &Path,
) -> Result<Vec<BuiltPlugin>, BuildError> {
    let toolchain = Toolchain::detect()?;
    let mut command = toolchain.cargo_build(manifest_path, packages, target_dir);
    let status = command
        .status()
        .map_err(|source| BuildError::Spawn { program: format!("{command:?}"), source })?;
    if !status.success() {
        return Err(BuildError::Cargo { packages: packages.join(", ") });
    }
    let components_dir = target_dir.join("components");
    std::fs::create_dir_all(&components_dir).map_err(|source| BuildError::Io {
        action: "creating",
        path: components_dir.clone(),
        source,
    })?;
    packages
        .iter()
        .map(|package| {
            let module_path = target_dir
                .join(WASM_TARGET)
                .join("release")
                .join(format!("{}.wasm", package.replace('-', "_")));
            if !module_path.exists() {
                return Err(BuildError::NoModule {
                    package: package.to_string(),
                    path: module_path,
                });
            }
            let module = std::fs::read(&module_path).map_err(|source| BuildError::Io {
                action: "reading",
                path: module_path.clone(),
                source,
            })?;
            let component = componentize(&module).map_err(|reason| BuildError::Componentize {
                package: package.to_string(),
                reason,
            })?;
            let component_path = components_dir.join(format!("{package}.wasm"));
            write_if_changed(&component_path, &component)?;
            Ok(BuiltPlugin { package: package.to_string(), component: component_path })
        })
        .collect()
}

/// Wraps a core module built with `wit-bindgen` into a component.
pub fn componentize(module: &[u8]) -> Result<Vec<u8>, String> {
    wit_component::ComponentEncoder::default()
        .module(module)
        .and_then(|encoder| encoder.validate(true).encode())
        .map_err(|err| format!("{err:#}"))
}

/// Writes `bytes` unless the file already holds them, so file times (and
/// whatever rebuilds on them) move only on a real change.
fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<(), BuildError> {
    if std::fs::read(path).is_ok_and(|existing| existing == bytes) {
        return Ok(());
    }
    std::fs::write(path, bytes).map_err(|source| BuildError::Io {
        action: "writing",
        path: path.to_path_buf(),
        source,
    })
}

/// The `[package] name` of a `Cargo.toml`.
fn package_name(manifest_path: &Path) -> Result<String, BuildError> {
    let not_a_crate =
        |reason: String| BuildError::NotACrate { path: manifest_path.to_path_buf(), reason };
    let text =
        std::fs::read_to_string(manifest_path).map_err(|err| not_a_crate(err.to_string()))?;
    let manifest: toml::Table =
        text.parse().map_err(|err: toml::de::Error| not_a_crate(err.to_string()))?;
    manifest
        .get("package")
        .and_then(|package| package.get("name"))
        .and_then(|name| name.as_str())
        .map(str::to_string)
        .ok_or_else(|| not_a_crate("it has no [package] name".to_string()))
}

/// Where plugin builds go when not told: `$CARGO_TARGET_DIR/tally-wasm`,
/// else `target/tally-wasm` of the workspace that holds `crate_dir`. One
/// shared directory means the standard library is built once for all plugins.
pub fn default_target_dir(crate_dir: &Path) -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir).join("tally-wasm");
    }
    let mut command = Command::new("cargo");
    clear_outer_cargo_env(&mut command);
    let workspace_manifest = command
        .args(["locate-project", "--workspace", "--message-format", "plain"])
        .current_dir(crate_dir)
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()));
    let root = workspace_manifest.as_deref().and_then(Path::parent).unwrap_or(crate_dir);
    root.join("target").join("tally-wasm")
}
