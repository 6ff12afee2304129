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
//! every epoch tick inside plugin code ([`crate::plugin::EPOCH_TICK`]). A
//! job over its tenant's seats, or holding one for [`SLICE`] while another
//! of its tenant's jobs waits, gives it up there and queues again; a job
//! about to wait (for input, a commit, a pause) gives it up at once.

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

/// How often a waiting job looks whether it was asked to stop.
const WAIT_STEP: Duration = Duration::from_millis(10);

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
        Tenant { share: share.max(1), running: 0, waiting: BTreeSet::new(), next_ticket: 0, last_active: Instant::now() - ACTIVE_WINDOW }
    }

    fn active(&self, now: Instant) -> bool {
        self.running > 0 || !self.waiting.is_empty() || now.duration_since(self.last_active) < ACTIVE_WINDOW
    }
}

impl CpuScheduler {
    /// A scheduler of `cores` cores (at least one).
    pub fn new(cores: usize) -> CpuScheduler {
        CpuScheduler { inner: Arc::new(Inner { cores: cores.max(1), state: Mutex::default(), changed: Condvar::new() }) }
    }

    /// A scheduler of this machine's cores.
    pub fn for_this_machine() -> CpuScheduler {
        CpuScheduler::new(std::thread::available_parallelism().map_or(1, usize::from))
    }

    /// Sets `tenant`'s weight (at least 1).
    pub fn set_share(&self, tenant: &str, share: u32) {
        let mut state = lock(&self.inner.state);
        state.tenants.entry(tenant.to_string()).or_insert_with(|| Tenant::new(share)).share = share.max(1);
    }

    /// A seat of `tenant` for one job thread; not taken yet.
    pub fn seat(&self, tenant: &str) -> Arc<CpuSeat> {
        lock(&self.inner.state).tenants.entry(tenant.to_string()).or_insert_with(|| Tenant::new(1));
        Arc::new(CpuSeat { inner: self.inner.clone(), tenant: tenant.to_string(), held: Mutex::new(None) })
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
        let seats = (self.cores as f64 * f64::from(own.share) / active.max(1) as f64).round() as usize;
        seats.clamp(1, self.cores)
    }
}

/// One job thread's claim on its tenant's share of the cores.
pub struct CpuSeat {
    inner: Arc<Inner>,
    tenant: String,
    /// When the seat was taken, while it is held.
    held: Mutex<Option<Instant>>,
}

impl CpuSeat {
    /// Makes sure the calling job thread holds its seat: keeps it, hands it
    /// to a waiting job of the same tenant after [`SLICE`], gives it up when
    /// the tenant holds more than its share, and waits for one when it has
    /// none. Returns at once (without a seat) once `stop` is set.
    pub fn run(&self, stop: &AtomicBool) {
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
            let tenant = state.tenants.get_mut(&self.tenant).expect("a seat's tenant is registered");
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
            state = self.inner.changed.wait_timeout(state, WAIT_STEP).map_or_else(|poisoned| poisoned.into_inner().0, |(state, _)| state);
        }
    }

    /// Gives the seat up (the job thread is about to wait).
    pub fn idle(&self) {
        let mut held = lock(&self.held);
        if held.take().is_some() {
            let mut state = lock(&self.inner.state);
            let tenant = state.tenants.get_mut(&self.tenant).expect("a seat's tenant is registered");
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
        std::thread::sleep(Duration::from_millis(100));
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
        assert!(lock(&first.held).is_some(), "the first job got its seat back once the second idled");
        first.idle();
        let third = scheduler.seat("a");
        first.run(&stop);
        third.run(&AtomicBool::new(true));
        assert!(lock(&third.held).is_none(), "a stopping job does not wait for a seat");
    }
}
