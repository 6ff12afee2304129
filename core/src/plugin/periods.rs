//! A period plugin's sandboxed instance (`tally:plugin@0.2.0`): configured
//! once with the job's `[plugin_config]` when it starts, then called by the
//! host's period rules — `describe` per batch, `add` per batch (event by
//! event after it refuses one), `value` per FINAL or ADJUSTMENT — each call within the job's CPU budget
//! and its memory limit. A call that fails leaves the instance to be made
//! anew (and configured again) for the next one.

use std::time::Duration;

use wasmtime::Store;

use super::bindings::periods as wit;
use super::instance::{Linked, call_failure, instantiate_failure, new_store};
use super::store::{NOT_MEASURED, StoreData, thread_cpu_time};
use super::{Event, JobContext, LoadedPlugin, PluginError, PluginUsage, ProcessError};
use crate::limits::Limits;
use crate::transaction::CallLimits;

/// What `describe` said of one event: its facts, or why it is malformed.
pub type Described = Result<wit::EventFacts, String>;

/// A running, sandboxed instance of a period plugin.
pub struct PeriodInstance {
    /// `None` after a failed call: a fresh one is made for the next.
    sandbox: Option<PeriodSandbox>,
    plugin: LoadedPlugin,
    limits: Limits,
    context: JobContext,
    cpu: Duration,
    traps: u64,
    session: Option<Session>,
    /// What each call of the session but a whole batch's `describe` may use.
    share: CallLimits,
}

/// The calls of one batch (or transaction end), measured together: a
/// call is too short to read the CPU clock around each.
struct Session {
    started: Duration,
    /// CPU time the epoch ticks added to the job's meters meanwhile.
    metered_by_ticks: Duration,
    failed: bool,
}

struct PeriodSandbox {
    store: Store<StoreData>,
    bindings: wit::PeriodsWorld,
}

impl PeriodSandbox {
    /// Instantiates `plugin` and hands it the job's configuration.
    fn new(
        plugin: &LoadedPlugin,
        limits: Limits,
        context: &JobContext,
    ) -> Result<PeriodSandbox, PluginError> {
        let Linked::Periods(pre) = &plugin.inner.linked else {
            return Err(PluginError::Instantiate {
                name: plugin.name().to_string(),
                reason: "it is a process plugin (tally:plugin@0.1.0), not a period plugin: a job that declares [periods] needs one built with `tally_sdk::export_periods!`".into(),
            });
        };
        let mut store = new_store(plugin, limits, context)?;
        let bindings = pre
            .instantiate(&mut store)
            .map_err(|err| instantiate_failure(plugin, &store, limits, &err))?;
        let configured = bindings
            .tally_plugin_config()
            .call_configure(&mut store, &context.plugin_config)
            .map_err(|err| instantiate_failure(plugin, &store, limits, &err))?;
        if let Err(refusal) = configured {
            return Err(PluginError::Instantiate {
                name: plugin.name().to_string(),
                reason: format!(
                    "it refused the job's [plugin_config]: {}",
                    crate::text::sanitize(&refusal, crate::text::MAX_REASON_BYTES)
                ),
            });
        }
        store.data_mut().meter_cpu();
        Ok(PeriodSandbox { store, bindings })
    }
}

impl PeriodInstance {
    /// A fresh instance of the period plugin `plugin`, configured.
    pub fn new(
        plugin: &LoadedPlugin,
        limits: Limits,
        context: JobContext,
    ) -> Result<PeriodInstance, PluginError> {
        let sandbox = PeriodSandbox::new(plugin, limits, &context)?;
        Ok(PeriodInstance {
            sandbox: Some(sandbox),
            plugin: plugin.clone(),
            limits,
            context,
            cpu: Duration::ZERO,
            traps: 0,
            session: None,
            share: CallLimits::batch(&limits),
        })
    }

    /// Starts measuring the calls that follow, until [`PeriodInstance::end`],
    /// for a batch of `events`: a whole batch's `describe` may use the
    /// job's CPU budget, every other call its share (at least one tick).
    pub fn begin(&mut self, events: usize) {
        self.share = CallLimits::share(&self.limits, events);
        self.session = Some(Session {
            started: thread_cpu_time(),
            metered_by_ticks: Duration::ZERO,
            failed: false,
        });
    }

    /// Ends the measure begun by [`PeriodInstance::begin`]: the calls' CPU
    /// time counts for the job (its meters, its CPU seat).
    pub fn end(&mut self) {
        let Some(session) = self.session.take() else { return };
        let cpu = thread_cpu_time().saturating_sub(session.started);
        self.cpu += cpu;
        let unmetered = cpu.saturating_sub(session.metered_by_ticks);
        self.context.meters.cpu_seconds.inc_by(unmetered.as_secs_f64());
        self.context.report_call(cpu, session.failed);
    }

    /// The digest of the plugin's bytes.
    pub fn digest(&self) -> &str {
        self.plugin.digest()
    }

    /// CPU time and memory used so far.
    pub fn usage(&self) -> PluginUsage {
        let memory_bytes =
            self.sandbox.as_ref().map_or(0, |sandbox| sandbox.store.data().memory_used);
        PluginUsage { cpu: self.cpu, memory_bytes, traps: self.traps }
    }

    /// The job's limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// What each of `events` says about itself, one result per event.
    pub fn describe(&mut self, events: &[wit::Event]) -> Result<Vec<Described>, ProcessError> {
        let count = events.len();
        let limits = if count > 1 { CallLimits::batch(&self.limits) } else { self.share.clone() };
        let described = self.call(limits, |store, plugin| {
            plugin.tally_plugin_periods().call_describe(store, events)
        })?;
        if described.len() != count {
            return Err(ProcessError::Plugin(format!(
                "plugin described {} events, but the batch has {count}",
                described.len()
            )));
        }
        Ok(described)
    }

    /// The plugin's fold of `additions` (each naming one of `states` and
    /// one of `addends`): the periods' states after it, or the addition it
    /// refuses. A fold of `k` additions may use `k` events' shares of the
    /// batch's CPU budget (at most the budget), so the folds of a batch
    /// together use about one budget however often it folds.
    pub fn add(
        &mut self,
        states: &[Option<Vec<u8>>],
        addends: &[Vec<u8>],
        additions: &[wit::Addition],
    ) -> Result<Result<Vec<Vec<u8>>, wit::Refusal>, ProcessError> {
        let mut limits = self.share.clone();
        let shares = u32::try_from(additions.len()).unwrap_or(u32::MAX).max(1);
        let budget = Duration::from_millis(self.limits.cpu_budget_ms);
        limits.cpu = limits.cpu.saturating_mul(shares).min(budget.max(limits.cpu));
        self.call(limits, |store, plugin| {
            plugin.tally_plugin_periods().call_add(store, states, addends, additions)
        })
    }

    /// The value of a period whose state is `state`.
    pub fn value(&mut self, state: &[u8]) -> Result<u64, ProcessError> {
        let limits = self.share.clone();
        self.call(limits, |store, plugin| plugin.tally_plugin_periods().call_value(store, state))
    }

    /// One call, within `limits` (its CPU counted from the call's first
    /// epoch tick, so no clock is read around each call); a failure drops
    /// the sandbox (the next call makes a fresh one).
    fn call<R>(
        &mut self,
        limits: CallLimits,
        run: impl FnOnce(&mut Store<StoreData>, &wit::PeriodsWorld) -> wasmtime::Result<R>,
    ) -> Result<R, ProcessError> {
        self.context.run();
        if self.context.stopping() {
            return Err(ProcessError::Stopped);
        }
        let sandbox = match &mut self.sandbox {
            Some(sandbox) => sandbox,
            None => match PeriodSandbox::new(&self.plugin, self.limits, &self.context) {
                Ok(sandbox) => self.sandbox.insert(sandbox),
                Err(_) if self.context.stopping() => return Err(ProcessError::Stopped),
                Err(err) => {
                    if let Some(session) = &mut self.session {
                        session.failed = true;
                    }
                    return Err(err.into());
                }
            },
        };
        let PeriodSandbox { store, bindings } = sandbox;
        let data = store.data_mut();
        data.call = limits;
        data.call_started = NOT_MEASURED;
        data.cpu_metered = NOT_MEASURED;
        data.txn.last_plugin_error = None;
        let metered_before = data.cpu_metered_total;
        store.set_epoch_deadline(1);
        let result = run(&mut *store, bindings);
        let data = store.data();
        let stopped = data.stopped;
        if let Some(session) = &mut self.session {
            session.metered_by_ticks += data.cpu_metered_total.saturating_sub(metered_before);
            session.failed |= result.is_err() && !stopped;
        }
        match result {
            Ok(value) => Ok(value),
            Err(err) => {
                let Some(mut sandbox) = self.sandbox.take() else {
                    unreachable!("the call ran in a sandbox")
                };
                let data = sandbox.store.data_mut();
                let logged = data.txn.last_plugin_error.take();
                let failure = call_failure(data, err, logged, &self.limits, &self.context);
                if !matches!(failure, ProcessError::Stopped) {
                    self.traps += 1;
                    self.context.meters.failed(&failure.to_string());
                }
                self.context.meters.memory_bytes.set(0);
                Err(failure)
            }
        }
    }
}

/// `time` as seconds and nanoseconds within 0..1e9 (jiff counts an
/// instant before 1970 with negative nanoseconds).
pub fn instant(time: jiff::Timestamp) -> wit::Instant {
    let (seconds, nanoseconds) = (time.as_second(), time.subsec_nanosecond());
    if nanoseconds < 0 {
        wit::Instant { seconds: seconds - 1, nanoseconds: (nanoseconds + 1_000_000_000) as u32 }
    } else {
        wit::Instant { seconds, nanoseconds: nanoseconds as u32 }
    }
}

/// An event as the period contract carries it.
pub fn to_wit(event: &Event) -> wit::Event {
    wit::Event {
        partition: event.partition,
        offset: event.offset,
        timestamp_ms: event.timestamp_ms,
        key: event.key.clone(),
        value: event.value.clone(),
    }
}
