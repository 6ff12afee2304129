//! What the host checks before it runs a plugin: that the file is a
//! component, that it was built for a WIT version this host links, and that
//! it imports nothing outside Tally's interfaces.

use std::path::PathBuf;

use wasmtime::Engine;
use wasmtime::component::Component;

use super::bindings::{PERIODS_WIT_VERSION, WIT_PACKAGE, WIT_VERSION};
use super::contract::{self, Mismatch, Side};

/// Which contract a plugin was built for, told by what it exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginKind {
    /// `tally:plugin@0.1.0`: `process` turns batches into state changes
    /// and outputs.
    Process,
    /// `tally:plugin@0.2.0`: the event facts, `add` and `value` of a job
    /// that declares `[periods]` (the host owns event time and state).
    Periods,
}

impl PluginKind {
    /// The contract version.
    pub fn version(self) -> &'static str {
        match self {
            PluginKind::Process => WIT_VERSION,
            PluginKind::Periods => PERIODS_WIT_VERSION,
        }
    }

    /// Interfaces such a plugin may import, without version.
    fn allowed_imports(self) -> &'static [&'static str] {
        match self {
            PluginKind::Process => &["state", "output", "log", "types"],
            PluginKind::Periods => &["log", "types"],
        }
    }

    /// Interfaces such a plugin must export, without version: the first
    /// names the kind.
    fn required_exports(self) -> &'static [&'static str] {
        match self {
            PluginKind::Process => &["aggregator"],
            PluginKind::Periods => &["periods", "config"],
        }
    }

    /// What such a plugin may import, for messages.
    fn allowed_text(self) -> &'static str {
        match self {
            PluginKind::Process => "plugins may only use tally:plugin's state, output and log",
            PluginKind::Periods => {
                "period plugins may only use tally:plugin's log (the host keeps their state and writes their records)"
            }
        }
    }

    /// What a job with such a plugin is, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            PluginKind::Process => "a process plugin (tally:plugin@0.1.0)",
            PluginKind::Periods => "a period plugin (tally:plugin@0.2.0)",
        }
    }
}

/// Every kind, in the order the host tells them apart.
const KINDS: [PluginKind; 2] = [PluginKind::Process, PluginKind::Periods];

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
        "plugin `{name}` was built for {WIT_PACKAGE}@{found}, but this host runs {WIT_PACKAGE}@{WIT_VERSION} for process plugins (`aggregator`) and {WIT_PACKAGE}@{PERIODS_WIT_VERSION} for period plugins (`periods`); rebuild it with a current tally-sdk"
    )]
    WrongWitVersion {
        /// The plugin (its file or upload name).
        name: String,
        /// The contract version it was built for.
        found: String,
    },
    /// The component imports something the host does not provide.
    #[error("plugin `{name}` imports `{import}`, which Tally does not provide: {allowed}")]
    ForbiddenImport {
        /// The plugin (its file or upload name).
        name: String,
        /// The import, as the component names it.
        import: String,
        /// What such a plugin may import.
        allowed: &'static str,
    },
    /// An interface the component imports or exports differs from the
    /// host's: an item the host does not have, or one of another type.
    #[error(
        "plugin `{name}` {side} `{interface}`, which {mismatch}; rebuild it against {WIT_PACKAGE}@{version}'s WIT (wit/tally-plugin@{version}) with a tally-sdk for {version}"
    )]
    Mismatch {
        /// The contract version the plugin was checked against.
        version: &'static str,
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
        "plugin `{name}` does not export `{WIT_PACKAGE}/aggregator@{WIT_VERSION}` (a process plugin) nor `{WIT_PACKAGE}/periods@{PERIODS_WIT_VERSION}` with `{WIT_PACKAGE}/config@{PERIODS_WIT_VERSION}` (a period plugin) (it exports: {exports}); is it a Tally plugin? Use `tally_sdk::export!` or `tally_sdk::export_periods!`"
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
pub fn check_component(name: &str, bytes: &[u8]) -> Result<PluginKind, PluginError> {
    let (info, kind) = check_names(name, bytes)?;
    let types = read_types(name, bytes)?;
    let mismatch = |side, item: &str, mismatch| PluginError::Mismatch {
        version: kind.version(),
        name: name.to_string(),
        side,
        interface: item.to_string(),
        mismatch: Box::new(mismatch),
    };
    for import in &info.imports {
        let (interface, _) =
            tally_interface(import).ok_or_else(|| PluginError::ForbiddenImport {
                name: name.to_string(),
                import: import.clone(),
                allowed: kind.allowed_text(),
            })?;
        let item = types
            .component_item_for_import(import)
            .ok_or_else(|| invalid(name, format!("its import `{import}` has no type")))?;
        contract::check_item(types.as_ref(), Side::Import, kind.version(), interface, &item.ty)
            .map_err(|found| mismatch(Side::Import, import, found))?;
    }
    for export in kind.required_exports() {
        let entry_point = contract::versioned(export, kind.version());
        let item = types
            .component_item_for_export(&entry_point)
            .ok_or_else(|| invalid(name, format!("its export `{entry_point}` has no type")))?;
        contract::check_item(types.as_ref(), Side::Export, kind.version(), export, &item.ty)
            .map_err(|found| mismatch(Side::Export, &entry_point, found))?;
    }
    Ok(kind)
}

/// The first half of [`check_component`], for the cost of reading the
/// import and export sections: a component whose imports are all
/// interfaces this host links and that exports the entry point. The
/// serve host runs it before an upload waits for its compile; the types
/// are checked in the compile worker, within its bounds.
pub fn check_names(name: &str, bytes: &[u8]) -> Result<(ComponentInfo, PluginKind), PluginError> {
    check_is_component(name, bytes)?;
    let info = read_names(name, bytes)?;
    let kind = check_contract(name, &info)?;
    Ok((info, kind))
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

/// Which kind of plugin the exports make: the first kind whose required
/// exports are all there, at its version.
fn kind_of(exports: &[String]) -> Option<PluginKind> {
    KINDS.into_iter().find(|kind| {
        kind.required_exports().iter().all(|required| {
            exports
                .iter()
                .filter_map(|export| tally_interface(export))
                .any(|(interface, version)| interface == *required && version == kind.version())
        })
    })
}

/// Refuses any import this host does not link for a plugin of `kind`
/// (`None`: the exports made no kind), naming it.
fn check_import_names(
    name: &str,
    imports: &[String],
    kind: Option<PluginKind>,
) -> Result<(), PluginError> {
    let wrong_version = |version: &str| PluginError::WrongWitVersion {
        name: name.to_string(),
        found: version.to_string(),
    };
    for import in imports {
        let forbidden = || PluginError::ForbiddenImport {
            name: name.to_string(),
            import: import.clone(),
            allowed: kind.unwrap_or(PluginKind::Process).allowed_text(),
        };
        let Some((interface, version)) = tally_interface(import) else {
            return Err(forbidden());
        };
        match kind {
            Some(kind) if version != kind.version() => return Err(wrong_version(version)),
            Some(kind) if !kind.allowed_imports().contains(&interface) => return Err(forbidden()),
            Some(_) => {}
            None if KINDS.iter().all(|kind| kind.version() != version) => {
                return Err(wrong_version(version));
            }
            None => {}
        }
    }
    Ok(())
}

/// Checks a component's imports and exports against what this host
/// links; returns the kind of plugin it is.
pub fn check_contract(name: &str, info: &ComponentInfo) -> Result<PluginKind, PluginError> {
    let kind = kind_of(&info.exports);
    check_import_names(name, &info.imports, kind)?;
    if let Some(kind) = kind {
        return Ok(kind);
    }
    let entry_points: Vec<(&str, &str)> = info
        .exports
        .iter()
        .filter_map(|export| tally_interface(export))
        .filter(|(interface, _)| ["aggregator", "periods"].contains(interface))
        .collect();
    // An entry point of a version this host runs, without the rest of its
    // kind's exports, is missing those: not built for another version.
    let runs = |(interface, version): &&(&str, &str)| {
        KINDS
            .iter()
            .any(|kind| kind.version() == *version && kind.required_exports()[0] == *interface)
    };
    match entry_points.first().filter(|entry| !runs(entry)) {
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
        assert_eq!(check_contract("p.wasm", &plugin).unwrap(), PluginKind::Process);
    }

    #[test]
    fn a_period_plugin_passes_and_may_import_only_log() {
        let exports = ["tally:plugin/periods@0.2.0", "tally:plugin/config@0.2.0"];
        let plugin = info(&["tally:plugin/log@0.2.0"], &exports);
        assert_eq!(check_contract("p.wasm", &plugin).unwrap(), PluginKind::Periods);
        let err = check_contract("p.wasm", &info(&["tally:plugin/state@0.2.0"], &exports))
            .unwrap_err()
            .to_string();
        assert!(err.contains("imports `tally:plugin/state@0.2.0`, which Tally does not provide"));
        assert!(err.contains("period plugins may only use tally:plugin's log"), "{err}");
        let err = check_contract("p.wasm", &info(&["tally:plugin/state@0.1.0"], &exports))
            .unwrap_err()
            .to_string();
        assert!(err.contains("was built for tally:plugin@0.1.0"), "{err}");
        let err = check_contract("p.wasm", &info(&[], &["tally:plugin/periods@0.2.0"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not export"), "{err}");
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
