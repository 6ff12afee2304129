//! The engine (configured for sandboxed, deterministic plugins, with its
//! epoch ticker), compiling and checking components, and the compile cache.

use std::path::Path;
use std::sync::Arc;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine};

use super::check::PluginKind;
use super::instance::{Linked, LoadedInner, LoadedPlugin};
use super::store::StoreData;
use super::{ComponentInfo, PluginError, bindings, check, digest};
use crate::limits::EPOCH_TICK;

/// Owns the Wasmtime engine; one per host.
#[derive(Clone)]
pub struct PluginRuntime {
    pub(super) engine: Engine,
}

impl PluginRuntime {
    /// An engine configured for sandboxed, deterministic plugins.
    pub fn new() -> Result<PluginRuntime, PluginError> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        config.relaxed_simd_deterministic(true);
        if std::env::var_os("TALLY_PLUGIN_PERFMAP").is_some_and(|value| value == "1") {
            // `perf report` then names plugin functions (/tmp/perf-<pid>.map).
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config).map_err(|err| PluginError::Engine(format!("{err:#}")))?;
        spawn_epoch_ticker(&engine);
        Ok(PluginRuntime { engine })
    }

    /// Reads, compiles and checks the plugin at `path`.
    pub fn load_file(&self, path: &Path) -> Result<LoadedPlugin, PluginError> {
        let bytes = std::fs::read(path)
            .map_err(|source| PluginError::Read { path: path.to_path_buf(), source })?;
        self.load(&file_name(path), &bytes)
    }

    /// Like [`PluginRuntime::load_file`], keeping the compiled form in
    /// `cache_dir` by digest and engine configuration (as the serve host's
    /// compile cache does): the next load of the same file skips compiling
    /// (seconds for a JavaScript plugin). A cached form that does not load
    /// is compiled again; a cache that cannot be written is only logged.
    ///
    /// `cache_dir` must be writable by this user alone (compiled code is
    /// run as it is): `tally run` uses the user's own cache directory.
    pub fn load_file_cached(
        &self,
        path: &Path,
        cache_dir: &Path,
    ) -> Result<LoadedPlugin, PluginError> {
        let bytes = std::fs::read(path)
            .map_err(|source| PluginError::Read { path: path.to_path_buf(), source })?;
        let name = file_name(path);
        let digest = digest(&bytes);
        let cached = self.cache_entry(cache_dir, &digest);
        if let Some(plugin) = self.load_cache_entry(&name, &digest, bytes.len(), &cached) {
            return Ok(plugin);
        }
        let compiled = self.precompile(&name, &bytes)?;
        // A temporary file of its own, renamed into place: processes
        // starting together never see each other's half-written file.
        let stored = std::fs::create_dir_all(cache_dir).and_then(|()| {
            use std::io::Write as _;
            let mut file = tempfile::Builder::new().prefix(".compiling-").tempfile_in(cache_dir)?;
            file.write_all(&compiled)?;
            file.as_file().sync_all()?;
            file.persist(&cached).map(drop).map_err(|err| err.error)
        });
        if let Err(err) = stored {
            tracing::warn!(path = %cached.display(), error = %err, "cannot cache the compiled plugin; the next start compiles it again");
        }
        // SAFETY: `compiled` is what this engine serialized a moment ago.
        let component =
            unsafe { wasmtime::component::Component::deserialize(&self.engine, &compiled) }
                .map_err(|err| PluginError::Invalid {
                    name: name.clone(),
                    reason: format!("its compiled form cannot be loaded: {err:#}"),
                })?;
        self.prepare(&name, &digest, bytes.len(), &component)
    }

    /// Compiles and checks a plugin; `name` is used in messages. Its
    /// imports are checked before it is compiled.
    pub fn load(&self, name: &str, bytes: &[u8]) -> Result<LoadedPlugin, PluginError> {
        check::check_component(name, bytes)?;
        let component = check::compile(&self.engine, name, bytes)?;
        self.prepare(name, &digest(bytes), bytes.len(), &component)
    }

    /// Loads a plugin compiled earlier by this host's engine configuration
    /// (see [`compiler`]) from `path`.
    ///
    /// The file must have been written by Tally's own compiler: compiled
    /// code is run as it is, so it must never come from a tenant.
    pub fn load_compiled(
        &self,
        name: &str,
        digest: &str,
        size: usize,
        path: &Path,
    ) -> Result<LoadedPlugin, PluginError> {
        // SAFETY: the file holds the output of `Component::serialize` by
        // this binary's compiler (Tally's compile worker, into the host's
        // own data directory, which tenants cannot write); wasmtime checks
        // that it was made for this engine's version and configuration.
        let component =
            unsafe { wasmtime::component::Component::deserialize_file(&self.engine, path) }
                .map_err(|err| PluginError::Invalid {
                    name: name.to_string(),
                    reason: format!(
                        "its compiled form `{}` cannot be loaded: {err:#}",
                        path.display()
                    ),
                })?;
        self.prepare(name, digest, size, &component)
    }

    /// Where a compile cache in `cache_dir` keeps the compiled form of
    /// `digest` for this engine: by digest and [`PluginRuntime::compatibility_key`].
    pub fn cache_entry(&self, cache_dir: &Path, digest: &str) -> std::path::PathBuf {
        let hex = digest.split_once(':').map_or(digest, |(_, hex)| hex);
        cache_dir.join(format!("{hex}-{}.cwasm", self.compatibility_key()))
    }

    /// The plugin cached at `entry`, if there is one that loads; an entry
    /// that does not load is removed (and logged), to be compiled again.
    pub fn load_cache_entry(
        &self,
        name: &str,
        digest: &str,
        size: usize,
        entry: &Path,
    ) -> Option<LoadedPlugin> {
        if !entry.is_file() {
            return None;
        }
        match self.load_compiled(name, digest, size, entry) {
            Ok(plugin) => Some(plugin),
            Err(err) => {
                tracing::warn!(path = %entry.display(), error = %err, "a cached compiled plugin cannot be loaded; compiling it again");
                let _ = std::fs::remove_file(entry);
                None
            }
        }
    }

    /// A hash of what compiled code depends on in this engine (its version
    /// and configuration): part of a compiled plugin's cache key.
    pub fn compatibility_key(&self) -> String {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    }

    /// The engine's compiled form of `bytes` (for the compile worker).
    pub fn precompile(&self, name: &str, bytes: &[u8]) -> Result<Vec<u8>, PluginError> {
        check::check_component(name, bytes)?;
        let component = check::compile(&self.engine, name, bytes)?;
        check::check_contract(name, &check::component_info(&self.engine, &component))?;
        component.serialize().map_err(|err| PluginError::Invalid {
            name: name.to_string(),
            reason: format!("cannot serialize its compiled form: {err:#}"),
        })
    }

    /// Checks a compiled component against the contract and links it.
    pub(super) fn prepare(
        &self,
        name: &str,
        digest: &str,
        size: usize,
        component: &wasmtime::component::Component,
    ) -> Result<LoadedPlugin, PluginError> {
        let info = check::component_info(&self.engine, component);
        let kind = check::check_contract(name, &info)?;
        let instantiate_error = |err: wasmtime::Error| PluginError::Instantiate {
            name: name.to_string(),
            reason: format!("{err:#}"),
        };
        let mut linker = Linker::<StoreData>::new(&self.engine);
        let linked = match kind {
            PluginKind::Process => {
                bindings::PluginWorld::add_to_linker::<_, HasSelf<StoreData>>(
                    &mut linker,
                    |data| data,
                )
                .map_err(instantiate_error)?;
                let pre = linker.instantiate_pre(component).map_err(instantiate_error)?;
                Linked::Process(bindings::PluginWorldPre::new(pre).map_err(instantiate_error)?)
            }
            PluginKind::Periods => {
                bindings::periods::PeriodsWorld::add_to_linker::<_, HasSelf<StoreData>>(
                    &mut linker,
                    |data| data,
                )
                .map_err(instantiate_error)?;
                let pre = linker.instantiate_pre(component).map_err(instantiate_error)?;
                Linked::Periods(
                    bindings::periods::PeriodsWorldPre::new(pre).map_err(instantiate_error)?,
                )
            }
        };
        Ok(LoadedPlugin {
            inner: Arc::new(LoadedInner {
                engine: self.engine.clone(),
                name: name.to_string(),
                digest: digest.to_string(),
                size,
                info,
                linked,
            }),
        })
    }

    /// Describes the plugin at `path` and whether this host would run it
    /// (for `tally plugin inspect`). Errs only when it is not a component.
    pub fn inspect(&self, path: &Path) -> Result<Inspection, PluginError> {
        let bytes = std::fs::read(path)
            .map_err(|source| PluginError::Read { path: path.to_path_buf(), source })?;
        let name = file_name(path);
        let component = check::compile(&self.engine, &name, &bytes)?;
        let info = check::component_info(&self.engine, &component);
        let verdict = check::check_component(&name, &bytes);
        Ok(Inspection { digest: digest(&bytes), size: bytes.len(), name, info, verdict })
    }
}

/// Advances the engine's epoch every [`EPOCH_TICK`] until the engine is dropped.
fn spawn_epoch_ticker(engine: &Engine) {
    let engine = engine.weak();
    std::thread::Builder::new()
        .name("tally-epoch".into())
        .spawn(move || {
            while let Some(engine) = engine.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        .expect("spawning the epoch ticker thread");
}

/// What `tally plugin inspect` shows.
#[derive(Debug)]
pub struct Inspection {
    /// File name.
    pub name: String,
    /// `sha256:<hex>` of the bytes.
    pub digest: String,
    /// Size in bytes.
    pub size: usize,
    /// Imports and exports.
    pub info: ComponentInfo,
    /// Whether this host would run it, and if not why.
    pub verdict: Result<PluginKind, PluginError>,
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}
