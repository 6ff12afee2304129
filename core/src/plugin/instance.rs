//! A loaded plugin and its sandboxed instances: instantiating one in a
//! fresh `Store` within the job's limits, calling it on a batch, and
//! turning a failed call into its dead-letter reason.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Engine, Store, UpdateDeadline};

use super::check::PluginKind;
use super::host_imports::MAX_LOGGED_ERROR_BYTES;
use super::periods::PeriodInstance;
use super::store::{INSTANCE_BYTES, StoreData, thread_cpu_time};
use super::{
    ComponentInfo, Event, JobContext, PluginError, PluginUsage, ProcessError, Processor, Rejection,
    bindings,
};
use crate::limits::Limits;
use crate::state::MemoryStore;
use crate::transaction::CallLimits;
use crate::transaction::Transaction;
use wasmtime::ResourceLimiter;

/// A compiled, checked plugin; cheap to clone, instantiated per task.
#[derive(Clone)]
pub struct LoadedPlugin {
    pub(super) inner: Arc<LoadedInner>,
}

pub(super) struct LoadedInner {
    pub(super) engine: Engine,
    pub(super) name: String,
    pub(super) digest: String,
    pub(super) size: usize,
    pub(super) info: ComponentInfo,
    pub(super) linked: Linked,
}

/// A component linked to the host's imports, ready to instantiate: by
/// the contract it was built for.
pub(super) enum Linked {
    /// A process plugin (`tally:plugin@0.1.0`).
    Process(bindings::PluginWorldPre<StoreData>),
    /// A period plugin (`tally:plugin@0.2.0`).
    Periods(bindings::periods::PeriodsWorldPre<StoreData>),
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

    /// The contract the plugin was built for.
    pub fn kind(&self) -> PluginKind {
        match self.inner.linked {
            Linked::Process(_) => PluginKind::Process,
            Linked::Periods(_) => PluginKind::Periods,
        }
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
        move || plugin.processor(limits, context)
    }

    /// A fresh instance of the job's processor: a process plugin's
    /// instance, or a period plugin's under the host's period rules (the
    /// job's `[periods]` live in its transaction).
    pub fn processor(
        &self,
        limits: Limits,
        context: JobContext,
    ) -> Result<Box<dyn Processor>, PluginError> {
        Ok(match self.kind() {
            PluginKind::Process => Box::new(self.instantiate_in(limits, context)?),
            PluginKind::Periods => Box::new(super::period_processor::PeriodProcessor::new(
                PeriodInstance::new(self, limits, context)?,
            )),
        })
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

/// A fresh store for an instance of `plugin` with `limits`, for the job of
/// `context`: the memory limit, the CPU budget checked at every epoch
/// tick, the job's stop signal.
pub(super) fn new_store(
    plugin: &LoadedPlugin,
    limits: Limits,
    context: &JobContext,
) -> Result<Store<StoreData>, PluginError> {
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
        cpu_metered_total: Duration::ZERO,
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
    store.data_mut().grow(INSTANCE_BYTES, "its instance").map_err(|err| {
        PluginError::Instantiate { name: plugin.name().to_string(), reason: format!("{err:#}") }
    })?;
    Ok(store)
}

/// Why instantiating `plugin` in `store` failed, in its words.
pub(super) fn instantiate_failure(
    plugin: &LoadedPlugin,
    store: &Store<StoreData>,
    limits: Limits,
    err: &wasmtime::Error,
) -> PluginError {
    let data = store.data();
    let reason = if data.memory_exceeded {
        format!(
            "it needs more than its memory limit of {} bytes (limits.memory_bytes) to start",
            limits.memory_bytes
        )
    } else if data.cpu_exceeded {
        format!(
            "it used more than its CPU budget of {} ms (limits.cpu_budget_ms) to start",
            limits.cpu_budget_ms
        )
    } else {
        // Its backtrace can carry names the plugin chose.
        crate::text::sanitize(&format!("{err:#}"), MAX_LOGGED_ERROR_BYTES)
    };
    PluginError::Instantiate { name: plugin.name().to_string(), reason }
}

impl Sandbox {
    /// A fresh store with `limits`, and the plugin instantiated in it.
    fn new(
        plugin: &LoadedPlugin,
        limits: Limits,
        context: &JobContext,
    ) -> Result<Sandbox, PluginError> {
        let Linked::Process(pre) = &plugin.inner.linked else {
            return Err(PluginError::Instantiate {
                name: plugin.name().to_string(),
                reason: "it is a period plugin (tally:plugin@0.2.0): it runs in a job that declares [periods]".into(),
            });
        };
        let mut store = new_store(plugin, limits, context)?;
        let bindings = pre
            .instantiate(&mut store)
            .map_err(|err| instantiate_failure(plugin, &store, limits, &err))?;
        store.data_mut().meter_cpu();
        Ok(Sandbox { store, bindings })
    }
}

/// Why a call failed, as a dead-letter reason: `logged` is the last
/// error line the plugin logged (a panic message).
pub(super) fn call_failure(
    data: &mut StoreData,
    err: wasmtime::Error,
    logged: Option<String>,
    limits: &Limits,
    context: &JobContext,
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
            limits.memory_bytes >> 20,
            limits.memory_bytes
        ));
    }
    if data.cpu_exceeded {
        context.meters.cpu_budget_breaches.inc();
        return ProcessError::Plugin(data.call.cpu_exceeded_reason());
    }
    // Classified by type, never by wasmtime's text: a trap is the
    // plugin's code stopping (a panic, `unreachable`, a bad access);
    // anything else is wasmtime refusing a value that crossed the
    // boundary: more than the call may copy (its hostcall fuel, set to
    // the memory limit) or a malformed one (a pointer out of bounds,
    // bad UTF-8). The host's own refusals were taken above.
    let Some(trap) = err.downcast_ref::<wasmtime::Trap>() else {
        return ProcessError::Plugin(format!(
            "plugin passed a value the host cannot take: more than its memory limit of {} bytes \
             (limits.memory_bytes) between itself and the host in one call, or a malformed one ({})",
            limits.memory_bytes,
            crate::text::sanitize(&err.to_string(), MAX_LOGGED_ERROR_BYTES)
        ));
    };
    // Its text can carry names the plugin chose.
    let trap = crate::text::sanitize(&trap.to_string(), MAX_LOGGED_ERROR_BYTES);
    match logged {
        Some(logged) => ProcessError::Plugin(format!("plugin trapped ({trap}): {logged}")),
        None => ProcessError::Plugin(format!("plugin trapped: {trap}")),
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
                let failure = call_failure(
                    sandbox.store.data_mut(),
                    err,
                    txn.last_plugin_error.take(),
                    &self.limits,
                    &self.context,
                );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::PluginRuntime;
    use crate::plugin::check::mutated_contracts::{component_of_module, contract};

    /// A plugin whose `process` runs `body` (core WAT, with `imports` at
    /// the module's top), then returns no rejections.
    fn plugin(imports: &str, body: &str) -> LoadedPlugin {
        let wat = format!(
            r#"(module
  {imports}
  (memory (export "memory") 1)
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) (i32.const 1024))
  (func (export "tally:plugin/aggregator@0.1.0#process") (param i32 i32) (result i32)
    {body}
    (i32.store (i32.const 0) (i32.const 0))
    (i32.store (i32.const 4) (i32.const 0))
    (i32.const 0))
)"#
        );
        let (resolve, world) = contract();
        let bytes = component_of_module(&resolve, world, wat::parse_str(&wat).unwrap()).unwrap();
        PluginRuntime::new().unwrap().load("test.wasm", &bytes).unwrap()
    }

    fn failure_of(plugin: &LoadedPlugin) -> ProcessError {
        let mut instance = plugin.instantiate(Limits::default()).unwrap();
        let mut txn = Transaction::new(
            Arc::new(MemoryStore::default()),
            vec!["totals".to_string()].into(),
            Limits::default(),
        );
        let event =
            Event { partition: 0, offset: 0, timestamp_ms: None, key: None, value: b"{}".to_vec() };
        txn.begin_batch(std::iter::once(crate::transaction::SourcePosition {
            partition: 0,
            offset: 0,
        }));
        instance.process(&[event], &mut txn).unwrap_err()
    }

    #[test]
    fn a_plugin_that_runs_cleanly_has_nothing_to_say() {
        let plugin = plugin("", "");
        let mut instance = plugin.instantiate(Limits::default()).unwrap();
        let mut txn = Transaction::new(
            Arc::new(MemoryStore::default()),
            vec!["totals".to_string()].into(),
            Limits::default(),
        );
        assert!(instance.process(&[], &mut txn).unwrap().is_empty());
        assert_eq!(instance.usage().traps, 0);
    }

    #[test]
    fn a_trap_is_told_by_its_type() {
        let failure = failure_of(&plugin("", "unreachable"));
        let ProcessError::Plugin(reason) = failure else { panic!("{failure:?}") };
        assert!(reason.starts_with("plugin trapped: "), "{reason}");
        assert!(reason.contains("unreachable"), "{reason}");
    }

    #[test]
    fn a_value_the_host_cannot_take_is_not_a_trap() {
        // `get-many` with a list of 2^28 keys the plugin does not have:
        // wasmtime refuses it as it crosses, before the host sees a key.
        let imports = r#"(import "tally:plugin/state@0.1.0" "get-many" (func $get_many (param i32 i32 i32)))"#;
        let failure = failure_of(&plugin(
            imports,
            "(call $get_many (i32.const 64) (i32.const 268435456) (i32.const 8))",
        ));
        let ProcessError::Plugin(reason) = failure else { panic!("{failure:?}") };
        assert!(reason.starts_with("plugin passed a value the host cannot take"), "{reason}");
        assert!(reason.contains("limits.memory_bytes"), "{reason}");
    }
}
