//! What a plugin instance's `Store` holds (the transaction it works on, its
//! limits, its job's context) and the limits it enforces as the plugin
//! runs: memory (linear memories, tables, instances), CPU per call, the
//! entries one host call may carry.

use std::time::Duration;

use wasmtime::ResourceLimiter;

use super::JobContext;
use crate::state::StateError;
use crate::transaction::{CallLimits, HostCallError, Transaction, Violation};

/// Most core instances, memories and tables one plugin may create.
pub(super) const MAX_INSTANCES: usize = 64;
pub(super) const MAX_MEMORIES: usize = 16;
pub(super) const MAX_TABLES: usize = 64;
/// What one table element costs the host (a pointer), counted in the
/// plugin's memory limit with its linear memories.
pub(super) const TABLE_ELEMENT_BYTES: u64 = std::mem::size_of::<usize>() as u64;
/// What an instance costs the host beyond its memories and tables (its
/// context, globals and bookkeeping), counted in the memory limit too.
pub(super) const INSTANCE_BYTES: u64 = 64 << 10;

/// [`StoreData::call_started`] of a call whose start was not measured.
pub(super) const NOT_MEASURED: Duration = Duration::MAX;

/// CPU time the calling thread has used.
pub(super) fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec to write into; CLOCK_THREAD_CPUTIME_ID
    // is supported on every Linux.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// What a plugin's `Store` holds: the transaction it works on (the
/// caller's, swapped in for the duration of a call; an empty placeholder in
/// between), its limits, and its job's context.
pub struct StoreData {
    pub(super) txn: Transaction,
    pub(super) context: JobContext,
    pub(super) memory_limit: u64,
    pub(super) memory_used: u64,
    pub(super) memory_exceeded: bool,
    /// The CPU budget of the call running now.
    pub(super) call: CallLimits,
    /// Thread CPU time when the call running now started, or
    /// [`NOT_MEASURED`] until its first epoch tick (period plugins' calls,
    /// too many and too short to read the clock for each).
    pub(super) call_started: Duration,
    /// Thread CPU time already added to the job's meters.
    pub(super) cpu_metered: Duration,
    /// CPU time added to the job's meters by [`StoreData::meter_cpu`] in all.
    pub(super) cpu_metered_total: Duration,
    pub(super) cpu_exceeded: bool,
    pub(super) stopped: bool,
    pub(super) violation: Option<Violation>,
    pub(super) misconfigured: Option<String>,
    pub(super) host_failure: Option<StateError>,
}

impl StoreData {
    /// Counts `bytes` more of the host's memory against the plugin's limit.
    pub(super) fn grow(&mut self, bytes: u64, what: &str) -> wasmtime::Result<bool> {
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
    pub(super) fn meter_cpu(&mut self) -> Duration {
        let now = thread_cpu_time();
        if self.call_started == NOT_MEASURED {
            // The call's first tick: its budget counts from here (at most
            // one tick late).
            self.call_started = now;
            self.cpu_metered = now;
            return Duration::ZERO;
        }
        let delta = now.saturating_sub(self.cpu_metered.max(self.call_started));
        self.context.meters.cpu_seconds.inc_by(delta.as_secs_f64());
        self.cpu_metered_total += delta;
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
    pub(super) fn fail(&mut self, err: HostCallError) -> wasmtime::Error {
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
    pub(super) fn check_entries(&mut self, call: &str, entries: usize) -> wasmtime::Result<()> {
        if entries > MAX_ENTRIES_PER_CALL {
            return Err(self.fail(HostCallError::Violation(Violation(format!(
                "plugin passed {entries} entries to {call}, more than the {MAX_ENTRIES_PER_CALL} one call may carry"
            )))));
        }
        Ok(())
    }
}
