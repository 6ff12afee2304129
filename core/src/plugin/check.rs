//! What the host checks before it runs a plugin: that the file is a
//! component, that it was built for a WIT version this host links, and that
//! it imports nothing outside Tally's interfaces.

use std::path::PathBuf;

use wasmtime::component::Component;
use wasmtime::Engine;

use super::bindings::{WIT_PACKAGE, WIT_VERSION};

/// Interfaces a plugin may import, without version.
const ALLOWED_IMPORTS: &[&str] = &["state", "output", "log", "types"];
/// The interface a plugin must export, without version.
const REQUIRED_EXPORT: &str = "aggregator";

/// Why a plugin was refused. Nothing was run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// The file could not be read.
    #[error("cannot read plugin `{}`: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not WebAssembly.
    #[error("plugin `{name}` is not a WebAssembly file (it does not start with `\\0asm`); build one with `tally plugin build <crate dir>`")]
    NotWasm {
        /// The plugin (its file or upload name).
        name: String,
    },
    /// The file is a core module, not a component.
    #[error("plugin `{name}` is a core WebAssembly module, not a component; build it with `tally plugin build <crate dir>` (or wrap it with `wasm-tools component new`)")]
    NotAComponent {
        /// The plugin (its file or upload name).
        name: String,
    },
    /// The component does not validate or compile.
    #[error("plugin `{name}` is not a valid component: {reason}")]
    Invalid {
        /// The plugin (its file or upload name).
        name: String,
        /// Why.
        reason: String,
    },
    /// The component was built for another version of the contract.
    #[error("plugin `{name}` was built for {WIT_PACKAGE}@{found}, but this host runs {WIT_PACKAGE}@{WIT_VERSION}; rebuild it with a tally-sdk for {WIT_VERSION}")]
    WrongWitVersion {
        /// The plugin (its file or upload name).
        name: String,
        /// The contract version it was built for.
        found: String,
    },
    /// The component imports something the host does not provide.
    #[error("plugin `{name}` imports `{import}`, which Tally does not provide: plugins may only use {WIT_PACKAGE}'s state, output and log")]
    ForbiddenImport {
        /// The plugin (its file or upload name).
        name: String,
        /// The import, as the component names it.
        import: String,
    },
    /// The component does not export the entry point.
    #[error("plugin `{name}` does not export `{WIT_PACKAGE}/{REQUIRED_EXPORT}@{WIT_VERSION}` (it exports: {exports}); is it a Tally plugin? Use `tally_sdk::export!`")]
    MissingEntryPoint {
        /// The plugin (its file or upload name).
        name: String,
        /// What it exports instead.
        exports: String,
    },
    /// The Wasm engine could not be created (a host problem, not a plugin's).
    #[error("cannot start the WebAssembly engine: {0}")]
    Engine(String),
    /// Linking or instantiating failed despite the checks.
    #[error("plugin `{name}` cannot be instantiated: {reason}")]
    Instantiate {
        /// The plugin (its file or upload name).
        name: String,
        /// Why.
        reason: String,
    },
}

/// What a component says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentInfo {
    /// Names of the component's imports (`tally:plugin/state@0.1.0`).
    pub imports: Vec<String>,
    /// Names of the component's exports.
    pub exports: Vec<String>,
}

/// Refuses bytes that are not a component, with the reason.
pub fn check_is_component(name: &str, bytes: &[u8]) -> Result<(), PluginError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(PluginError::NotWasm { name: name.to_string() });
    }
    // Bytes 4..8 are the version and layer: [1, 0, 0, 0] for a core module.
    if bytes[4..8] == [1, 0, 0, 0] {
        return Err(PluginError::NotAComponent { name: name.to_string() });
    }
    Ok(())
}

/// Checks, before anything is compiled, that `bytes` are a component
/// whose own imports are all ones this host links: a plugin importing
/// `wasi:sockets` is refused for the cost of reading its import section.
/// (Parsing only: validation is part of compiling.)
pub fn check_imports(name: &str, bytes: &[u8]) -> Result<(), PluginError> {
    check_is_component(name, bytes)?;
    let invalid = |err: wasmparser::BinaryReaderError| PluginError::Invalid { name: name.to_string(), reason: err.to_string() };
    let mut imports = Vec::new();
    // Nested modules and components have imports of their own, satisfied
    // inside the component: only the outermost ones reach the host.
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.map_err(invalid)? {
            wasmparser::Payload::ModuleSection { .. } | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            wasmparser::Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    imports.push(import.map_err(invalid)?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    check_import_names(name, &imports)
}

/// Compiles a component (the slow step: do it off the hot path).
pub fn compile(engine: &Engine, name: &str, bytes: &[u8]) -> Result<Component, PluginError> {
    check_is_component(name, bytes)?;
    Component::new(engine, bytes).map_err(|err| PluginError::Invalid { name: name.to_string(), reason: format!("{err:#}") })
}

/// The import and export names of a compiled component.
pub fn component_info(engine: &Engine, component: &Component) -> ComponentInfo {
    let ty = component.component_type();
    ComponentInfo {
        imports: ty.imports(engine).map(|(name, _)| name.to_string()).collect(),
        exports: ty.exports(engine).map(|(name, _)| name.to_string()).collect(),
    }
}

/// Splits `tally:plugin/state@0.1.0` into (`state`, `0.1.0`) when it names
/// an interface of the Tally package.
fn tally_interface(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix(WIT_PACKAGE)?.strip_prefix('/')?;
    Some(rest.split_once('@').unwrap_or((rest, "")))
}

/// Refuses any import this host does not link, naming it.
fn check_import_names(name: &str, imports: &[String]) -> Result<(), PluginError> {
    for import in imports {
        match tally_interface(import) {
            Some((_, version)) if version != WIT_VERSION => {
                return Err(PluginError::WrongWitVersion { name: name.to_string(), found: version.to_string() });
            }
            Some((interface, _)) if ALLOWED_IMPORTS.contains(&interface) => {}
            _ => return Err(PluginError::ForbiddenImport { name: name.to_string(), import: import.clone() }),
        }
    }
    Ok(())
}

/// Checks a component's imports and exports against what this host links.
pub fn check_contract(name: &str, info: &ComponentInfo) -> Result<(), PluginError> {
    check_import_names(name, &info.imports)?;
    let entry_points: Vec<(&str, &str)> =
        info.exports.iter().filter_map(|export| tally_interface(export)).filter(|(i, _)| *i == REQUIRED_EXPORT).collect();
    if entry_points.iter().any(|(_, version)| *version == WIT_VERSION) {
        return Ok(());
    }
    match entry_points.first() {
        Some((_, version)) => Err(PluginError::WrongWitVersion { name: name.to_string(), found: version.to_string() }),
        None => Err(PluginError::MissingEntryPoint {
            name: name.to_string(),
            exports: if info.exports.is_empty() { "nothing".to_string() } else { info.exports.join(", ") },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(imports: &[&str], exports: &[&str]) -> ComponentInfo {
        ComponentInfo {
            imports: imports.iter().map(|s| s.to_string()).collect(),
            exports: exports.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_tally_plugin_passes() {
        let plugin = info(&["tally:plugin/state@0.1.0", "tally:plugin/output@0.1.0"], &["tally:plugin/aggregator@0.1.0"]);
        check_contract("p.wasm", &plugin).unwrap();
    }

    #[test]
    fn a_foreign_import_is_named() {
        let plugin = info(&["tally:plugin/state@0.1.0", "wasi:sockets/tcp@0.2.0"], &["tally:plugin/aggregator@0.1.0"]);
        let err = check_contract("p.wasm", &plugin).unwrap_err().to_string();
        assert_eq!(
            err,
            "plugin `p.wasm` imports `wasi:sockets/tcp@0.2.0`, which Tally does not provide: plugins may only use tally:plugin's state, output and log"
        );
    }

    #[test]
    fn another_contract_version_is_named() {
        let err = check_contract("p.wasm", &info(&[], &["tally:plugin/aggregator@0.2.0"])).unwrap_err().to_string();
        assert!(err.contains("built for tally:plugin@0.2.0, but this host runs tally:plugin@0.1.0"), "{err}");
        let err = check_contract("p.wasm", &info(&["tally:plugin/state@0.0.9"], &[])).unwrap_err().to_string();
        assert!(err.contains("built for tally:plugin@0.0.9"), "{err}");
    }

    #[test]
    fn non_components_are_told_apart() {
        assert!(matches!(check_is_component("a", b"hello world"), Err(PluginError::NotWasm { .. })));
        assert!(matches!(check_is_component("a", b"\0asm\x01\0\0\0"), Err(PluginError::NotAComponent { .. })));
        check_is_component("a", b"\0asm\x0d\0\x01\0").unwrap();
    }
}
