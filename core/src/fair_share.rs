//! Fair sharing of the host's cores among tenants (`tally serve`).
//!
//! Each job thread holds a [`CpuSeat`] of its tenant while it works. A
//! tenant may have at most as many seats taken at once as its share of the
//! cores: `max(1, round(cores × share / Σ shares of the active tenants))`,
//! where a tenant is active while any of its jobs works or waits for a seat
//! (and for [`ACTIVE_WINDOW`] after). So a tenant with one job beside a
//! tenant with six looping jobs on two cores keeps a core to itself: the
//! six take turns on the other. A lone tenant may use every core.
//!
//! Job threads check their seat at safe points: before each batch, and at
//! every epoch tick inside plugin code ([`crate::limits::EPOCH_TICK`]). A
//! job over its tenant's seats, or holding one for [`SLICE`] while another
//! of its tenant's jobs waits, gives it up there and queues again; a job
//! about to wait (for input, a commit, a pause) gives it up at once.
//!
//! A job whose plugin calls mostly fail (more than [`DEMOTE_AT_FAILED_SHARE`]
//! of its recent plugin CPU went to calls that trapped or broke a limit) is
//! demoted: while another tenant's jobs work, it runs at most
//! [`DEMOTED_DUTY`] of the time. Its calls produce nothing; its tenant's
//! share of the cores is for jobs that do. (Two cores share caches and
//! memory bandwidth: a neighbour burning its core still slows a job on the
//! other one by a tenth or more.)

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::sync::lock;

/// How long a tenant counts as active after its last job stopped working:
/// a job that waits briefly between batches (a commit, a poll) keeps its
/// tenant's share.
pub const ACTIVE_WINDOW: Duration = Duration::from_millis(250);

/// How long a job may keep a seat while another job of its tenant waits.
pub const SLICE: Duration = Duration::from_millis(20);

/// Above this share of a job's recent plugin CPU spent in failing calls,
/// the job is demoted.
pub const DEMOTE_AT_FAILED_SHARE: f64 = 0.25;
/// The share of the time a demoted job may run while other tenants' jobs work.
pub const DEMOTED_DUTY: f64 = 0.1;
/// How long plugin CPU is remembered for demotion (its decay time).
const HEALTH_MEMORY: Duration = Duration::from_secs(2);
/// Plugin CPU (decayed seconds) a job must have used before it can be demoted.
const HEALTH_MIN_CPU: f64 = 0.05;
/// Longest a demoted job sleeps at once.
const MAX_DEMOTED_PAUSE: Duration = Duration::from_millis(500);

/// How often a waiting job looks again without being woken (a tenant that
/// went idle frees seats without waking anyone). A stop wakes it at once
/// ([`CpuSeat::wake`]).
const WAIT_STEP: Duration = Duration::from_millis(50);

/// The host's cores, shared among tenants by their weights.
#[derive(Clone)]
pub struct CpuScheduler {
    inner: Arc<Inner>,
}

struct Inner {
    cores: usize,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    tenants: HashMap<String, Tenant>,
}

struct Tenant {
    share: u32,
    running: usize,
    /// Tickets of the jobs waiting for a seat, served lowest first.
    waiting: BTreeSet<u64>,
    next_ticket: u64,
    last_active: Instant,
}

impl Tenant {
    fn new(share: u32) -> Tenant {
        Tenant {
            share: share.max(1),
            running: 0,
            waiting: BTreeSet::new(),
            next_ticket: 0,
            last_active: Instant::now() - ACTIVE_WINDOW,
        }
    }

    fn active(&self, now: Instant) -> bool {
        self.running > 0
            || !self.waiting.is_empty()
            || now.duration_since(self.last_active) < ACTIVE_WINDOW
    }
}

impl CpuScheduler {
    /// A scheduler of `cores` cores (at least one).
    pub fn new(cores: usize) -> CpuScheduler {
        CpuScheduler {
            inner: Arc::new(Inner {
                cores: cores.max(1),
                state: Mutex::default(),
                changed: Condvar::new(),
            }),
        }
    }

    /// A scheduler of this machine's cores.
    pub fn for_this_machine() -> CpuScheduler {
        CpuScheduler::new(std::thread::available_parallelism().map_or(1, usize::from))
    }

    /// Sets `tenant`'s weight (at least 1).
    pub fn set_share(&self, tenant: &str, share: u32) {
        let mut state = lock(&self.inner.state);
        state.tenants.entry(tenant.to_string()).or_insert_with(|| Tenant::new(share)).share =
            share.max(1);
    }

    /// A seat of `tenant` for one job thread; not taken yet.
    pub fn seat(&self, tenant: &str) -> Arc<CpuSeat> {
        lock(&self.inner.state).tenants.entry(tenant.to_string()).or_insert_with(|| Tenant::new(1));
        let health = Health { failed: 0.0, total: 0.0, at: Instant::now(), running_since: None };
        Arc::new(CpuSeat {
            inner: self.inner.clone(),
            tenant: tenant.to_string(),
            held: Mutex::new(None),
            health: Mutex::new(health),
        })
    }

    /// How many seats `tenant` may hold at once now.
    pub fn seats_of(&self, tenant: &str) -> usize {
        let state = lock(&self.inner.state);
        self.inner.seats(&state, tenant, Instant::now())
    }
}

impl Inner {
    fn seats(&self, state: &State, tenant: &str, now: Instant) -> usize {
        let Some(own) = state.tenants.get(tenant) else { return 1 };
        let active: u64 = state
            .tenants
            .iter()
            .filter(|(name, other)| *name == tenant || other.active(now))
            .map(|(_, other)| u64::from(other.share))
            .sum();
        let seats =
            (self.cores as f64 * f64::from(own.share) / active.max(1) as f64).round() as usize;
        seats.clamp(1, self.cores)
    }

    fn others_active(&self, state: &State, tenant: &str, now: Instant) -> bool {
        state.tenants.iter().any(|(name, other)| name != tenant && other.active(now))
    }
}

/// A job's recent plugin CPU, decayed, and how much of it failed.
struct Health {
    failed: f64,
    total: f64,
    at: Instant,
    /// Since when a demoted job has been running without a pause.
    running_since: Option<Instant>,
}

impl Health {
    fn decay(&mut self, now: Instant) {
        let factor =
            (-now.duration_since(self.at).as_secs_f64() / HEALTH_MEMORY.as_secs_f64()).exp();
        self.failed *= factor;
        self.total *= factor;
        self.at = now;
    }

    fn demoted(&self) -> bool {
        self.total > HEALTH_MIN_CPU && self.failed > DEMOTE_AT_FAILED_SHARE * self.total
    }
}

/// One job thread's claim on its tenant's share of the cores.
pub struct CpuSeat {
    inner: Arc<Inner>,
    tenant: String,
    /// When the seat was taken, while it is held.
    held: Mutex<Option<Instant>>,
    health: Mutex<Health>,
}

impl CpuSeat {
    /// Makes sure the calling job thread holds its seat: keeps it, hands it
    /// to a waiting job of the same tenant after [`SLICE`], gives it up when
    /// the tenant holds more than its share, and waits for one when it has
    /// none. Returns at once (without a seat) once `stop` is set.
    pub fn run(&self, stop: &AtomicBool) {
        self.pause_if_demoted(stop);
        let mut held = lock(&self.held);
        let mut state = lock(&self.inner.state);
        let now = Instant::now();
        let seats = self.inner.seats(&state, &self.tenant, now);
        let tenant = state.tenants.get_mut(&self.tenant).expect("a seat's tenant is registered");
        tenant.last_active = now;
        if let Some(since) = *held {
            let others_wait = !tenant.waiting.is_empty();
            if tenant.running <= seats && !(others_wait && now.duration_since(since) >= SLICE) {
                return;
            }
            tenant.running -= 1;
            *held = None;
            self.inner.changed.notify_all();
        }
        let ticket = tenant.next_ticket;
        tenant.next_ticket += 1;
        tenant.waiting.insert(ticket);
        loop {
            let now = Instant::now();
            let seats = self.inner.seats(&state, &self.tenant, now);
            let tenant =
                state.tenants.get_mut(&self.tenant).expect("a seat's tenant is registered");
            tenant.last_active = now;
            let first = tenant.waiting.first() == Some(&ticket);
            if stop.load(Ordering::Relaxed) || (first && tenant.running < seats) {
                tenant.waiting.remove(&ticket);
                if !stop.load(Ordering::Relaxed) {
                    tenant.running += 1;
                    *held = Some(now);
                }
                self.inner.changed.notify_all();
                return;
            }
            state = self
                .inner
                .changed
                .wait_timeout(state, WAIT_STEP)
                .map_or_else(|poisoned| poisoned.into_inner().0, |(state, _)| state);
        }
    }

    /// Counts a plugin call of the job: the CPU it used, and whether it failed.
    pub fn report_call(&self, cpu: Duration, failed: bool) {
        let mut health = lock(&self.health);
        health.decay(Instant::now());
        health.total += cpu.as_secs_f64();
        if failed {
            health.failed += cpu.as_secs_f64();
        }
    }

    /// Whether the job is demoted now (its calls mostly fail).
    pub fn is_demoted(&self) -> bool {
        let mut health = lock(&self.health);
        health.decay(Instant::now());
        health.demoted()
    }

    /// A demoted job that ran for a tick while other tenants' jobs work
    /// sleeps, seat given up, long enough to keep to [`DEMOTED_DUTY`].
    fn pause_if_demoted(&self, stop: &AtomicBool) {
        let now = Instant::now();
        let Some(pause) = self.demoted_pause(now) else { return };
        self.idle();
        let until = now + pause;
        let mut state = lock(&self.inner.state);
        while !stop.load(Ordering::Relaxed) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .inner
                .changed
                .wait_timeout(state, left)
                .map_or_else(|poisoned| poisoned.into_inner().0, |(state, _)| state);
        }
        drop(state);
        lock(&self.health).running_since = Some(Instant::now());
    }

    /// How long the job pauses at `now`: nothing unless it is demoted and
    /// another tenant works, and then in proportion to how long it ran.
    fn demoted_pause(&self, now: Instant) -> Option<Duration> {
        let others_active = self.inner.others_active(&lock(&self.inner.state), &self.tenant, now);
        let mut health = lock(&self.health);
        health.decay(now);
        if !health.demoted() || !others_active {
            // Running time counts from here, should others come.
            health.running_since = Some(now);
            return None;
        }
        let ran = now.duration_since(*health.running_since.get_or_insert(now));
        if ran < crate::limits::EPOCH_TICK {
            return None;
        }
        health.running_since = None;
        Some(ran.mul_f64(1.0 / DEMOTED_DUTY - 1.0).min(MAX_DEMOTED_PAUSE))
    }

    /// Wakes the jobs waiting for a seat, so that one asked to stop sees it.
    pub fn wake(&self) {
        self.inner.changed.notify_all();
    }

    /// Gives the seat up (the job thread is about to wait).
    pub fn idle(&self) {
        let mut held = lock(&self.held);
        if held.take().is_some() {
            let mut state = lock(&self.inner.state);
            let tenant =
                state.tenants.get_mut(&self.tenant).expect("a seat's tenant is registered");
            tenant.running -= 1;
            tenant.last_active = Instant::now();
            self.inner.changed.notify_all();
        }
    }
}

impl Drop for CpuSeat {
    fn drop(&mut self) {
        self.idle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_gets_its_share_of_the_cores_and_a_lone_tenant_all_of_them() {
        let scheduler = CpuScheduler::new(2);
        scheduler.set_share("good", 1);
        scheduler.set_share("noisy", 1);
        let stop = AtomicBool::new(false);
        let noisy: Vec<Arc<CpuSeat>> = (0..3).map(|_| scheduler.seat("noisy")).collect();
        noisy[0].run(&stop);
        assert_eq!(scheduler.seats_of("noisy"), 2, "alone, a tenant may use every core");
        noisy[1].run(&stop);
        let good = scheduler.seat("good");
        good.run(&stop);
        assert_eq!(scheduler.seats_of("noisy"), 1, "two active tenants share two cores");
        // The noisy tenant gives its second seat up at its next safe point,
        // and waits there for one.
        let stopping = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (seat, stopping) = (noisy[1].clone(), stopping.clone());
            std::thread::spawn(move || seat.run(&stopping))
        };
        // Until the waiter waits (however long its thread takes to start).
        while lock(&scheduler.inner.state).tenants["noisy"].waiting.is_empty() {
            std::thread::yield_now();
        }
        {
            let state = lock(&scheduler.inner.state);
            assert_eq!((state.tenants["noisy"].running, state.tenants["good"].running), (1, 1));
            assert_eq!(state.tenants["noisy"].waiting.len(), 1);
        }
        stopping.store(true, Ordering::Relaxed);
        waiter.join().unwrap();
        assert!(lock(&noisy[1].held).is_none());
    }

    #[test]
    fn a_job_whose_calls_mostly_fail_is_demoted_while_others_work() {
        let scheduler = CpuScheduler::new(2);
        let stop = AtomicBool::new(false);
        let failing = scheduler.seat("noisy");
        failing.report_call(Duration::from_millis(80), false);
        failing.report_call(Duration::from_millis(20), true);
        assert!(
            !failing.is_demoted(),
            "a fifth of its CPU in failing calls is bad input, not a broken plugin"
        );
        failing.report_call(Duration::from_millis(200), true);
        assert!(failing.is_demoted());
        // Alone, a demoted job runs on. (Times are the scheduler's clock,
        // given: the test does not depend on how fast it runs.)
        let tick = crate::limits::EPOCH_TICK;
        let start = Instant::now();
        assert_eq!(failing.demoted_pause(start), None);
        assert_eq!(
            failing.demoted_pause(start + tick * 2),
            None,
            "no other tenant works: no pause"
        );
        // Beside a working tenant, it pauses nine ticks for each it ran,
        // counted from its last call alone.
        let good = scheduler.seat("good");
        good.run(&stop);
        let alone = start + tick * 2;
        lock(&scheduler.inner.state).tenants.get_mut("good").unwrap().last_active =
            alone + tick * 15;
        assert_eq!(
            failing.demoted_pause(alone + tick / 2),
            None,
            "less than a tick run: no pause yet"
        );
        assert_eq!(
            failing.demoted_pause(alone + tick * 2),
            Some(tick * 18),
            "two ticks run: eighteen paused"
        );
        assert_eq!(
            failing.demoted_pause(alone + tick * 2),
            None,
            "after a pause, its running time counts anew"
        );
        assert_eq!(
            failing.demoted_pause(alone + tick * 15),
            Some(MAX_DEMOTED_PAUSE),
            "a pause is bounded"
        );
    }

    #[test]
    fn jobs_of_one_tenant_take_turns_and_a_stop_ends_the_wait() {
        let scheduler = CpuScheduler::new(1);
        let stop = AtomicBool::new(false);
        let first = scheduler.seat("a");
        first.run(&stop);
        let second = scheduler.seat("a");
        let waiter = std::thread::spawn(move || {
            second.run(&AtomicBool::new(false));
            second
        });
        std::thread::sleep(SLICE * 2);
        // Past its slice, with a sibling waiting, the holder hands over.
        let stopping = AtomicBool::new(false);
        let handed = std::thread::spawn(move || {
            first.run(&stopping);
            first
        });
        let second = waiter.join().unwrap();
        second.idle();
        let first = handed.join().unwrap();
        assert!(
            lock(&first.held).is_some(),
            "the first job got its seat back once the second idled"
        );
        first.idle();
        let third = scheduler.seat("a");
        first.run(&stop);
        third.run(&AtomicBool::new(true));
        assert!(lock(&third.held).is_none(), "a stopping job does not wait for a seat");
    }
}
