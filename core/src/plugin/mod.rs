//! The plugin runtime: compiles a component once, checks it, and runs it in
//! sandboxed instances, one per task.
//!
//! Every instance has its own `Store` with a memory limit (all its linear
//! memories together) and a CPU budget per batch: a ticker thread advances
//! the engine's epoch every [`EPOCH_TICK`], and at each tick the store
//! compares the thread's CPU time spent in the call with the budget (fuel
//! metering measured 40% slower on the billing job). A plugin that breaks
//! either is stopped, not the host. The
//! engine is configured for determinism (no threads: the feature is not
//! compiled in; deterministic relaxed SIMD), and a plugin can reach nothing
//! but the `tally:plugin` imports, so re-running a batch gives the same
//! result. NaN canonicalization is off: it cost 17% of the billing job's
//! CPU, and without it only the payload bits of NaNs can differ, and only
//! between CPU architectures, never between runs on one host.

mod bindings;
pub mod check;
pub mod compiler;
pub mod context;
pub mod contract;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, ResourceLimiter, Store, UpdateDeadline};

pub use bindings::{Event, Rejection, WIT_PACKAGE, WIT_VERSION};
pub use check::{ComponentInfo, PluginError};
pub use context::{JobContext, StopSignal};

use crate::limits::Limits;
use crate::state::{MemoryStore, StateError};
use crate::transaction::{CallLimits, HostCallError, Transaction, Violation};

/// Why a batch failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The plugin misbehaved on this batch (trap, budget, limit); the
    /// message is the dead-letter reason if one event is to blame.
    #[error("{0}")]
    Plugin(String),
    /// The host failed (state store); not the plugin's fault.
    #[error(transparent)]
    Host(#[from] StateError),
    /// The job and the plugin disagree (an undeclared output); the job must stop.
    #[error("{0}")]
    Misconfigured(String),
    /// The plugin could not be re-instantiated after a failure.
    #[error(transparent)]
    Instantiate(#[from] PluginError),
    /// The job was asked to stop, and the call was interrupted: its batch
    /// (and transaction) must be dropped and read again by the next run.
    #[error("the job was asked to stop during a plugin call")]
    Stopped,
    /// The plugin failed on too many events in a row: it is broken, and the
    /// job must stop rather than dead-letter its whole input.
    #[error("{0}")]
    FailingInARow(String),
}

/// Something that turns a batch of events into state changes and outputs
/// recorded in a [`Transaction`]: a Wasm plugin instance, or (for
/// benchmarks) the same logic compiled natively.
pub trait Processor {
    /// Processes `events` in order; returns the events the plugin refused.
    /// On `Err`, the caller must drop the batch from the transaction.
    fn process(
        &mut self,
        events: &[Event],
        txn: &mut Transaction,
    ) -> Result<Vec<Rejection>, ProcessError>;

    /// The digest that identifies the running code in output lineage.
    fn digest(&self) -> &str;

    /// CPU time and memory used so far (zero for native processors).
    fn usage(&self) -> PluginUsage {
        PluginUsage::default()
    }
}

/// What a plugin instance has used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PluginUsage {
    /// CPU time spent in plugin calls (host calls it made included).
    pub cpu: Duration,
    /// Linear memory the instance holds now, in bytes.
    pub memory_bytes: u64,
    /// Traps and limit breaches so far.
    pub traps: u64,
}

/// How often the engine's epoch advances; CPU budgets are counted in these.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Owns the Wasmtime engine; one per host.
#[derive(Clone)]
pub struct PluginRuntime {
    engine: Engine,
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
    fn prepare(
        &self,
        name: &str,
        digest: &str,
        size: usize,
        component: &wasmtime::component::Component,
    ) -> Result<LoadedPlugin, PluginError> {
        let info = check::component_info(&self.engine, component);
        check::check_contract(name, &info)?;
        let instantiate_error = |err: wasmtime::Error| PluginError::Instantiate {
            name: name.to_string(),
            reason: format!("{err:#}"),
        };
        let mut linker = Linker::<StoreData>::new(&self.engine);
        bindings::PluginWorld::add_to_linker::<_, HasSelf<StoreData>>(&mut linker, |data| data)
            .map_err(instantiate_error)?;
        let pre = linker.instantiate_pre(component).map_err(instantiate_error)?;
        let pre = bindings::PluginWorldPre::new(pre).map_err(instantiate_error)?;
        Ok(LoadedPlugin {
            inner: Arc::new(LoadedInner {
                engine: self.engine.clone(),
                name: name.to_string(),
                digest: digest.to_string(),
                size,
                info,
                pre,
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

/// Most core instances, memories and tables one plugin may create.
const MAX_INSTANCES: usize = 64;
const MAX_MEMORIES: usize = 16;
const MAX_TABLES: usize = 64;
/// What one table element costs the host (a pointer), counted in the
/// plugin's memory limit with its linear memories.
const TABLE_ELEMENT_BYTES: u64 = std::mem::size_of::<usize>() as u64;
/// What an instance costs the host beyond its memories and tables (its
/// context, globals and bookkeeping), counted in the memory limit too.
const INSTANCE_BYTES: u64 = 64 << 10;

/// CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec to write into; CLOCK_THREAD_CPUTIME_ID
    // is supported on every Linux.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
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
    pub verdict: Result<(), PluginError>,
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// The digest that identifies plugin bytes in lineage: `sha256:<hex>`.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// A compiled, checked plugin; cheap to clone, instantiated per task.
#[derive(Clone)]
pub struct LoadedPlugin {
    inner: Arc<LoadedInner>,
}

struct LoadedInner {
    engine: Engine,
    name: String,
    digest: String,
    size: usize,
    info: ComponentInfo,
    pre: bindings::PluginWorldPre<StoreData>,
}

impl LoadedPlugin {
    /// File name the plugin was loaded from.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// `sha256:<hex>` of the component bytes.
    pub fn digest(&self) -> &str {
        &self.inner.digest
    }

    /// Size of the component in bytes.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The component's imports and exports.
    pub fn info(&self) -> &ComponentInfo {
        &self.inner.info
    }

    /// A fresh sandboxed instance with `limits`, on its own (its log lines
    /// tagged with the plugin's name; nothing can stop a call but its budget).
    pub fn instantiate(&self, limits: Limits) -> Result<PluginInstance, PluginError> {
        self.instantiate_in(limits, JobContext::new(self.name()))
    }

    /// What makes the job's first instance when the job opens (after its
    /// checks, so a refused job instantiates nothing).
    pub fn processor_maker(
        &self,
        limits: Limits,
        context: JobContext,
    ) -> impl FnOnce() -> Result<Box<dyn Processor>, PluginError> + use<> {
        let plugin = self.clone();
        move || Ok(Box::new(plugin.instantiate_in(limits, context)?) as Box<dyn Processor>)
    }

    /// A fresh sandboxed instance with `limits`, for the job of `context`.
    pub fn instantiate_in(
        &self,
        limits: Limits,
        context: JobContext,
    ) -> Result<PluginInstance, PluginError> {
        let sandbox = Sandbox::new(self, limits, &context)?;
        Ok(PluginInstance {
            sandbox: Some(sandbox),
            plugin: self.clone(),
            limits,
            context,
            cpu: Duration::ZERO,
            traps: 0,
        })
    }
}

/// What a plugin's `Store` holds: the transaction it works on (the
/// caller's, swapped in for the duration of a call; an empty placeholder in
/// between), its limits, and its job's context.
pub struct StoreData {
    txn: Transaction,
    context: JobContext,
    memory_limit: u64,
    memory_used: u64,
    memory_exceeded: bool,
    /// The CPU budget of the call running now.
    call: CallLimits,
    call_started: Duration,
    /// Thread CPU time already added to the job's meters.
    cpu_metered: Duration,
    cpu_exceeded: bool,
    stopped: bool,
    violation: Option<Violation>,
    misconfigured: Option<String>,
    host_failure: Option<StateError>,
}

impl StoreData {
    /// Counts `bytes` more of the host's memory against the plugin's limit.
    fn grow(&mut self, bytes: u64, what: &str) -> wasmtime::Result<bool> {
        if self.memory_used.saturating_add(bytes) > self.memory_limit {
            self.memory_exceeded = true;
            return Err(wasmtime::Error::msg(format!(
                "plugin exceeded its memory limit growing {what}"
            )));
        }
        self.memory_used += bytes;
        self.context.meters.memory_bytes.set(self.memory_used.min(i64::MAX as u64) as i64);
        Ok(true)
    }

    /// Adds the CPU time used since the last look to the job's meters.
    fn meter_cpu(&mut self) -> Duration {
        let now = thread_cpu_time();
        let delta = now.saturating_sub(self.cpu_metered.max(self.call_started));
        self.context.meters.cpu_seconds.inc_by(delta.as_secs_f64());
        self.cpu_metered = now;
        now.saturating_sub(self.call_started)
    }
}

impl ResourceLimiter for StoreData {
    /// Counts every memory of the store against one limit.
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grow(desired.saturating_sub(current) as u64, "a linear memory")
    }

    /// Tables count against the same limit, at what each element costs.
    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grow(
            (desired.saturating_sub(current) as u64).saturating_mul(TABLE_ELEMENT_BYTES),
            "a table",
        )
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

impl StoreData {
    /// Records why a host call failed and turns it into a trap.
    fn fail(&mut self, err: HostCallError) -> wasmtime::Error {
        let message = err.to_string();
        match err {
            HostCallError::Violation(violation) => self.violation = Some(violation),
            HostCallError::Misconfigured(message) => self.misconfigured = Some(message),
            HostCallError::State(state) => self.host_failure = Some(state),
        }
        wasmtime::Error::msg(message)
    }
}

/// Most entries (keys, writes, records) one host call may carry: each
/// costs the host work, and a call cannot be stopped halfway.
pub const MAX_ENTRIES_PER_CALL: usize = 1 << 20;

impl StoreData {
    /// Refuses a host call `call` with more than [`MAX_ENTRIES_PER_CALL`] entries.
    fn check_entries(&mut self, call: &str, entries: usize) -> wasmtime::Result<()> {
        if entries > MAX_ENTRIES_PER_CALL {
            return Err(self.fail(HostCallError::Violation(Violation(format!(
                "plugin passed {entries} entries to {call}, more than the {MAX_ENTRIES_PER_CALL} one call may carry"
            )))));
        }
        Ok(())
    }
}

impl bindings::types::Host for StoreData {}

impl bindings::state::Host for StoreData {
    fn get(&mut self, key: Vec<u8>) -> wasmtime::Result<Option<Vec<u8>>> {
        let limit = self.memory_limit;
        match self.txn.get_many(std::slice::from_ref(&key), limit) {
            Ok(mut values) => Ok(values.pop().flatten()),
            Err(err) => Err(self.fail(err)),
        }
    }

    fn get_many(&mut self, keys: Vec<Vec<u8>>) -> wasmtime::Result<Vec<Option<Vec<u8>>>> {
        self.check_entries("state.get-many", keys.len())?;
        let limit = self.memory_limit;
        self.txn.get_many(&keys, limit).map_err(|err| self.fail(err))
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> wasmtime::Result<()> {
        self.txn.put_many(vec![(key, value)]).map_err(|v| self.fail(v.into()))
    }

    fn put_many(&mut self, entries: Vec<(Vec<u8>, Vec<u8>)>) -> wasmtime::Result<()> {
        self.check_entries("state.put-many", entries.len())?;
        self.txn.put_many(entries).map_err(|v| self.fail(v.into()))
    }

    fn delete(&mut self, key: Vec<u8>) -> wasmtime::Result<()> {
        self.txn.delete_many(vec![key]).map_err(|v| self.fail(v.into()))
    }

    fn delete_many(&mut self, keys: Vec<Vec<u8>>) -> wasmtime::Result<()> {
        self.check_entries("state.delete-many", keys.len())?;
        self.txn.delete_many(keys).map_err(|v| self.fail(v.into()))
    }
}

impl bindings::output::Host for StoreData {
    fn emit(&mut self, output: String, record: bindings::OutputRecord) -> wasmtime::Result<()> {
        self.emit_many(output, vec![record])
    }

    fn emit_many(
        &mut self,
        output: String,
        records: Vec<bindings::OutputRecord>,
    ) -> wasmtime::Result<()> {
        self.check_entries("output.emit-many", records.len())?;
        let records = records.into_iter().map(|record| (record.event, record.key, record.value));
        self.txn.emit_many(&output, records).map_err(|err| self.fail(err))
    }
}

/// Longest plugin error line kept as a trap's dead-letter reason.
const MAX_LOGGED_ERROR_BYTES: usize = 1024;

impl bindings::log::Host for StoreData {
    fn log(&mut self, level: bindings::Level, message: String) -> wasmtime::Result<()> {
        let level = match level {
            bindings::Level::Trace => tracing::Level::TRACE,
            bindings::Level::Debug => tracing::Level::DEBUG,
            bindings::Level::Info => tracing::Level::INFO,
            bindings::Level::Warn => tracing::Level::WARN,
            bindings::Level::Error => tracing::Level::ERROR,
        };
        self.context.log.write(level, &message);
        if level == tracing::Level::ERROR {
            // A panic message, with the Rust SDK: the reason of the trap that follows.
            self.txn.last_plugin_error = Some(context::sanitize(&message, MAX_LOGGED_ERROR_BYTES));
        }
        Ok(())
    }
}

/// A running, sandboxed instance of a plugin.
pub struct PluginInstance {
    /// `None` after a trap: a fresh one is made for the next call.
    sandbox: Option<Sandbox>,
    plugin: LoadedPlugin,
    limits: Limits,
    context: JobContext,
    cpu: Duration,
    traps: u64,
}

/// One instantiation: its `Store` and the bindings to its exports.
struct Sandbox {
    store: Store<StoreData>,
    bindings: bindings::PluginWorld,
}

impl Sandbox {
    /// A fresh store with `limits`, and the plugin instantiated in it.
    fn new(
        plugin: &LoadedPlugin,
        limits: Limits,
        context: &JobContext,
    ) -> Result<Sandbox, PluginError> {
        let placeholder = Transaction::new(Arc::new(MemoryStore::default()), Arc::from([]), limits);
        let data = StoreData {
            txn: placeholder,
            context: context.clone(),
            memory_limit: limits.memory_bytes,
            memory_used: 0,
            memory_exceeded: false,
            call: CallLimits::batch(&limits),
            call_started: thread_cpu_time(),
            cpu_metered: Duration::ZERO,
            cpu_exceeded: false,
            stopped: false,
            violation: None,
            misconfigured: None,
            host_failure: None,
        };
        let mut store = Store::new(&plugin.inner.engine, data);
        store.limiter(|data| data as &mut dyn ResourceLimiter);
        // What a host call may copy out of the plugin (its arguments, and
        // the lists it returns): no more than its memory limit, so aliased
        // lists cannot make the host build more than the plugin could hold.
        store.set_hostcall_fuel(usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX));
        // At every epoch tick: stop the call if the job is stopping or the
        // call has used its CPU budget (host calls made by the plugin count
        // too; waiting does not), and take the job's turn on the CPU.
        store.epoch_deadline_callback(|mut context| {
            let data = context.data_mut();
            data.context.run();
            if data.context.stopping() {
                data.stopped = true;
                return Ok(UpdateDeadline::Interrupt);
            }
            if data.meter_cpu() > data.call.cpu {
                data.cpu_exceeded = true;
                return Ok(UpdateDeadline::Interrupt);
            }
            Ok(UpdateDeadline::Continue(1))
        });
        // Instantiation runs guest code too (start functions, allocator setup).
        store.set_epoch_deadline(1);
        let instance_bytes = INSTANCE_BYTES;
        store.data_mut().grow(instance_bytes, "its instance").map_err(|err| {
            PluginError::Instantiate { name: plugin.name().to_string(), reason: format!("{err:#}") }
        })?;
        let bindings = plugin.inner.pre.instantiate(&mut store).map_err(|err| {
            let data = store.data();
            let reason = if data.memory_exceeded {
                format!("it needs more than its memory limit of {} bytes (limits.memory_bytes) to start", limits.memory_bytes)
            } else if data.cpu_exceeded {
                format!("it used more than its CPU budget of {} ms (limits.cpu_budget_ms) to start", limits.cpu_budget_ms)
            } else {
                // Its backtrace can carry names the plugin chose.
                context::sanitize(&format!("{err:#}"), MAX_LOGGED_ERROR_BYTES)
            };
            PluginError::Instantiate { name: plugin.name().to_string(), reason }
        })?;
        store.data_mut().meter_cpu();
        Ok(Sandbox { store, bindings })
    }
}

/// The marker of wasmtime's hostcall-fuel trap: a call copied more than the
/// store allows out of the plugin.
const HOSTCALL_FUEL_EXHAUSTED: &str = "fuel allocated for hostcalls has been exhausted";

impl PluginInstance {
    /// Why the last call failed, as a dead-letter reason.
    fn failure(
        &self,
        data: &mut StoreData,
        err: wasmtime::Error,
        logged: Option<String>,
    ) -> ProcessError {
        if data.stopped {
            return ProcessError::Stopped;
        }
        if let Some(state) = data.host_failure.take() {
            return ProcessError::Host(state);
        }
        if let Some(message) = data.misconfigured.take() {
            return ProcessError::Misconfigured(message);
        }
        if let Some(violation) = data.violation.take() {
            return ProcessError::Plugin(violation.0);
        }
        if data.memory_exceeded {
            return ProcessError::Plugin(format!(
                "plugin exceeded its memory limit of {} MiB (limits.memory_bytes = {}; linear memories and tables count)",
                self.limits.memory_bytes >> 20,
                self.limits.memory_bytes
            ));
        }
        if data.cpu_exceeded {
            self.context.meters.cpu_budget_breaches.inc();
            return ProcessError::Plugin(data.call.cpu_exceeded_reason());
        }
        if format!("{err:#}").contains(HOSTCALL_FUEL_EXHAUSTED) {
            return ProcessError::Plugin(format!(
                "plugin passed more than its memory limit of {} bytes (limits.memory_bytes) between itself and the host in one call",
                self.limits.memory_bytes
            ));
        }
        let trap = err
            .downcast_ref::<wasmtime::Trap>()
            .map_or_else(|| format!("{err}"), |trap| trap.to_string());
        // Wasmtime's text can carry names the plugin chose.
        let trap = context::sanitize(&trap, MAX_LOGGED_ERROR_BYTES);
        match logged {
            Some(logged) => ProcessError::Plugin(format!("plugin trapped ({trap}): {logged}")),
            None => ProcessError::Plugin(format!("plugin trapped: {trap}")),
        }
    }
}

impl Processor for PluginInstance {
    fn process(
        &mut self,
        events: &[Event],
        txn: &mut Transaction,
    ) -> Result<Vec<Rejection>, ProcessError> {
        self.context.run();
        if self.context.stopping() {
            return Err(ProcessError::Stopped);
        }
        // A fresh instance (after a trap) starts within its own budget, the
        // job's per-batch one; its CPU counts as this call's for the CPU
        // sharing, so a plugin failing at once after a costly start is seen.
        let started = thread_cpu_time();
        let sandbox = match &mut self.sandbox {
            Some(sandbox) => sandbox,
            None => match Sandbox::new(&self.plugin, self.limits, &self.context) {
                Ok(sandbox) => self.sandbox.insert(sandbox),
                Err(_) if self.context.stopping() => return Err(ProcessError::Stopped),
                Err(err) => {
                    self.context.report_call(thread_cpu_time().saturating_sub(started), true);
                    return Err(err.into());
                }
            },
        };
        let Sandbox { store, bindings } = sandbox;
        let data = store.data_mut();
        data.call = txn.call_limits().clone();
        let instantiated = thread_cpu_time();
        data.call_started = instantiated;
        data.cpu_metered = instantiated;
        store.set_epoch_deadline(1);
        std::mem::swap(&mut store.data_mut().txn, txn);
        let result = bindings.tally_plugin_aggregator().call_process(&mut *store, events);
        std::mem::swap(&mut store.data_mut().txn, txn);
        let cpu = store.data_mut().meter_cpu();
        self.cpu += cpu;
        let with_start = cpu + instantiated.saturating_sub(started);
        self.context.report_call(with_start, result.is_err() && !store.data().stopped);
        match result {
            Ok(rejections) => Ok(rejections),
            Err(err) => {
                let Some(mut sandbox) = self.sandbox.take() else {
                    unreachable!("the call ran in a sandbox")
                };
                let failure =
                    self.failure(sandbox.store.data_mut(), err, txn.last_plugin_error.take());
                if !matches!(failure, ProcessError::Stopped) {
                    self.traps += 1;
                    self.context.meters.failed(&failure.to_string());
                }
                // After a trap the guest's memory may be inconsistent: the
                // next call starts over in a fresh instance.
                self.context.meters.memory_bytes.set(0);
                Err(failure)
            }
        }
    }

    fn digest(&self) -> &str {
        self.plugin.digest()
    }

    fn usage(&self) -> PluginUsage {
        let memory_bytes =
            self.sandbox.as_ref().map_or(0, |sandbox| sandbox.store.data().memory_used);
        PluginUsage { cpu: self.cpu, memory_bytes, traps: self.traps }
    }
}
