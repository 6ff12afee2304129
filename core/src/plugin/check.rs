//! What the host checks before it runs a plugin: that the file is a
//! component, that it was built for a WIT version this host links, and that
//! it imports nothing outside Tally's interfaces.

use std::path::PathBuf;

use wasmtime::Engine;
use wasmtime::component::Component;

use super::bindings::{WIT_PACKAGE, WIT_VERSION};
use super::contract::{self, Mismatch, Side};

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
    #[error(
        "plugin `{name}` is not a WebAssembly file (it does not start with `\\0asm`); build one with `tally plugin build <crate dir>`"
    )]
    NotWasm {
        /// The plugin (its file or upload name).
        name: String,
    },
    /// The file is a core module, not a component.
    #[error(
        "plugin `{name}` is a core WebAssembly module, not a component; build it with `tally plugin build <crate dir>` (or wrap it with `wasm-tools component new`)"
    )]
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
    #[error(
        "plugin `{name}` was built for {WIT_PACKAGE}@{found}, but this host runs {WIT_PACKAGE}@{WIT_VERSION}; rebuild it with a tally-sdk for {WIT_VERSION}"
    )]
    WrongWitVersion {
        /// The plugin (its file or upload name).
        name: String,
        /// The contract version it was built for.
        found: String,
    },
    /// The component imports something the host does not provide.
    #[error(
        "plugin `{name}` imports `{import}`, which Tally does not provide: plugins may only use {WIT_PACKAGE}'s state, output and log"
    )]
    ForbiddenImport {
        /// The plugin (its file or upload name).
        name: String,
        /// The import, as the component names it.
        import: String,
    },
    /// An interface the component imports or exports differs from the
    /// host's: an item the host does not have, or one of another type.
    #[error(
        "plugin `{name}` {side} `{interface}`, which {mismatch}; rebuild it against {WIT_PACKAGE}@{WIT_VERSION}'s WIT (wit/tally-plugin@{WIT_VERSION}) with a tally-sdk for {WIT_VERSION}"
    )]
    Mismatch {
        /// The plugin (its file or upload name).
        name: String,
        /// Whether the plugin imports or exports the interface.
        side: Side,
        /// The interface, as the component names it.
        interface: String,
        /// What differs (boxed: it is large, and errors travel in `Result`s).
        mismatch: Box<Mismatch>,
    },
    /// The component does not export the entry point.
    #[error(
        "plugin `{name}` does not export `{WIT_PACKAGE}/{REQUIRED_EXPORT}@{WIT_VERSION}` (it exports: {exports}); is it a Tally plugin? Use `tally_sdk::export!`"
    )]
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

/// Checks, before anything is compiled, that `bytes` are a component this
/// host links and calls: every import is an interface of the contract the
/// host provides, item by item with exactly the component's types, and
/// the entry point is exported with the type the host calls. A plugin
/// importing `wasi:sockets` is refused for the cost of reading its import
/// section; one whose `state` import has a function more, or a parameter
/// of another type, for the cost of reading its types (function bodies
/// are left to the compiler).
pub fn check_component(name: &str, bytes: &[u8]) -> Result<(), PluginError> {
    let info = check_names(name, bytes)?;
    let types = read_types(name, bytes)?;
    let mismatch = |side, item: &str, mismatch| PluginError::Mismatch {
        name: name.to_string(),
        side,
        interface: item.to_string(),
        mismatch: Box::new(mismatch),
    };
    for import in &info.imports {
        let (interface, _) = tally_interface(import).ok_or_else(|| {
            PluginError::ForbiddenImport { name: name.to_string(), import: import.clone() }
        })?;
        let item = types
            .component_item_for_import(import)
            .ok_or_else(|| invalid(name, format!("its import `{import}` has no type")))?;
        contract::check_item(types.as_ref(), Side::Import, interface, &item.ty)
            .map_err(|found| mismatch(Side::Import, import, found))?;
    }
    let entry_point = contract::versioned(REQUIRED_EXPORT);
    let item = types
        .component_item_for_export(&entry_point)
        .ok_or_else(|| invalid(name, format!("its export `{entry_point}` has no type")))?;
    contract::check_item(types.as_ref(), Side::Export, REQUIRED_EXPORT, &item.ty)
        .map_err(|found| mismatch(Side::Export, &entry_point, found))
}

/// The first half of [`check_component`], for the cost of reading the
/// import and export sections: a component whose imports are all
/// interfaces this host links and that exports the entry point. The
/// serve host runs it before an upload waits for its compile; the types
/// are checked in the compile worker, within its bounds.
pub fn check_names(name: &str, bytes: &[u8]) -> Result<ComponentInfo, PluginError> {
    check_is_component(name, bytes)?;
    let info = read_names(name, bytes)?;
    check_contract(name, &info)?;
    Ok(info)
}

fn invalid(name: &str, reason: impl std::fmt::Display) -> PluginError {
    PluginError::Invalid { name: name.to_string(), reason: reason.to_string() }
}

/// The names of the component's own imports and exports, from its import
/// and export sections. Nested modules and components have imports of
/// their own, satisfied inside the component: only the outermost reach
/// the host. (Parsing only: validation is part of compiling.)
fn read_names(name: &str, bytes: &[u8]) -> Result<ComponentInfo, PluginError> {
    let mut info = ComponentInfo { imports: Vec::new(), exports: Vec::new() };
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.map_err(|err| invalid(name, err))? {
            wasmparser::Payload::ModuleSection { .. }
            | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            wasmparser::Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    info.imports
                        .push(import.map_err(|err| invalid(name, err))?.name.name.to_string());
                }
            }
            wasmparser::Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    info.exports
                        .push(export.map_err(|err| invalid(name, err))?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(info)
}

/// The types of the component's outermost imports and exports, from
/// validating its structure; function bodies are skipped (the compiler
/// validates them), so this costs a fraction of a compile.
fn read_types(name: &str, bytes: &[u8]) -> Result<wasmparser::types::Types, PluginError> {
    // wasmparser's default features are a superset of what the engine
    // enables: a component using one the engine lacks passes here and is
    // refused by the compiler, as invalid (never a failure to link).
    let mut validator =
        wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::default());
    let mut types = None;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|err| invalid(name, err))?;
        // The last `End` is the outermost component's.
        if let wasmparser::ValidPayload::End(end) =
            validator.payload(&payload).map_err(|err| invalid(name, err))?
        {
            types = Some(end);
        }
    }
    types.ok_or_else(|| invalid(name, "it ends before its end"))
}

/// Compiles a component (the slow step: do it off the hot path).
pub fn compile(engine: &Engine, name: &str, bytes: &[u8]) -> Result<Component, PluginError> {
    check_is_component(name, bytes)?;
    Component::new(engine, bytes)
        .map_err(|err| PluginError::Invalid { name: name.to_string(), reason: format!("{err:#}") })
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
                return Err(PluginError::WrongWitVersion {
                    name: name.to_string(),
                    found: version.to_string(),
                });
            }
            Some((interface, _)) if ALLOWED_IMPORTS.contains(&interface) => {}
            _ => {
                return Err(PluginError::ForbiddenImport {
                    name: name.to_string(),
                    import: import.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Checks a component's imports and exports against what this host links.
pub fn check_contract(name: &str, info: &ComponentInfo) -> Result<(), PluginError> {
    check_import_names(name, &info.imports)?;
    let entry_points: Vec<(&str, &str)> = info
        .exports
        .iter()
        .filter_map(|export| tally_interface(export))
        .filter(|(i, _)| *i == REQUIRED_EXPORT)
        .collect();
    if entry_points.iter().any(|(_, version)| *version == WIT_VERSION) {
        return Ok(());
    }
    match entry_points.first() {
        Some((_, version)) => {
            Err(PluginError::WrongWitVersion { name: name.to_string(), found: version.to_string() })
        }
        None => Err(PluginError::MissingEntryPoint {
            name: name.to_string(),
            exports: if info.exports.is_empty() {
                "nothing".to_string()
            } else {
                info.exports.join(", ")
            },
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
        let plugin = info(
            &["tally:plugin/state@0.1.0", "tally:plugin/output@0.1.0"],
            &["tally:plugin/aggregator@0.1.0"],
        );
        check_contract("p.wasm", &plugin).unwrap();
    }

    #[test]
    fn a_foreign_import_is_named() {
        let plugin = info(
            &["tally:plugin/state@0.1.0", "wasi:sockets/tcp@0.2.0"],
            &["tally:plugin/aggregator@0.1.0"],
        );
        let err = check_contract("p.wasm", &plugin).unwrap_err().to_string();
        assert_eq!(
            err,
            "plugin `p.wasm` imports `wasi:sockets/tcp@0.2.0`, which Tally does not provide: plugins may only use tally:plugin's state, output and log"
        );
    }

    #[test]
    fn another_contract_version_is_named() {
        let err = check_contract("p.wasm", &info(&[], &["tally:plugin/aggregator@0.2.0"]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("built for tally:plugin@0.2.0, but this host runs tally:plugin@0.1.0"),
            "{err}"
        );
        let err = check_contract("p.wasm", &info(&["tally:plugin/state@0.0.9"], &[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("built for tally:plugin@0.0.9"), "{err}");
    }

    #[test]
    fn non_components_are_told_apart() {
        assert!(matches!(
            check_is_component("a", b"hello world"),
            Err(PluginError::NotWasm { .. })
        ));
        assert!(matches!(
            check_is_component("a", b"\0asm\x01\0\0\0"),
            Err(PluginError::NotAComponent { .. })
        ));
        check_is_component("a", b"\0asm\x0d\0\x01\0").unwrap();
    }
}

#[cfg(test)]
pub(crate) mod mutated_contracts;
