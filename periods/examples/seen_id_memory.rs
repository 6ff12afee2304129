//! Heap bytes per remembered event id: a partition offered `N` events of
//! one customer and metric, each with an id of its own (13 bytes, as
//! `evt-000000001`), all inside one month (so none is forgotten), with
//! the committed changes taken every 10,000 events as a job would. The
//! heap is counted by a wrapper around the system allocator: what the
//! partition holds after the events, less what it held before, per id.
//!
//! `cargo run --release -p tally-periods --example seen_id_memory [N…]`

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use jiff::{SignedDuration, Timestamp};
use tally_periods::{
    Addition, Aggregation, EventFacts, Folded, PartitionPeriods, PeriodSettings, PeriodsTable,
    Verdict,
};

/// The system allocator, counting the bytes it has handed out and not
/// had back.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: each call goes straight to `System`, which upholds the
// `GlobalAlloc` contract; the counter only observes the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        IN_USE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        IN_USE.fetch_add(new_size, Ordering::Relaxed);
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Every period's state is `1`: the measure is of the ids, not the states.
struct Constant;

impl Aggregation for Constant {
    type Error = String;

    fn add(
        &mut self,
        states: &[Option<&[u8]>],
        _additions: &[Addition],
        _tentative: bool,
    ) -> Result<Folded, String> {
        Ok(Folded::States(states.iter().map(|_| b"1".to_vec()).collect()))
    }

    fn value(&mut self, _state: &[u8]) -> Result<u64, String> {
        Ok(1)
    }
}

/// Heap bytes per id held by a partition that remembered `count` ids.
fn bytes_per_id(count: usize) -> f64 {
    let settings = Arc::new(PeriodSettings::try_from(PeriodsTable::default()).unwrap());
    let start: Timestamp = "2026-11-01T00:00:00Z".parse().unwrap();
    // Spread over the first 25 days of November: the month stays open.
    let step = SignedDuration::from_secs(25 * 86_400) / count.max(1) as i32;
    let before = IN_USE.load(Ordering::Relaxed);
    let mut partition = PartitionPeriods::new(settings);
    let mut records = Vec::new();
    let mut event = EventFacts {
        id: String::new(),
        time: start,
        key: vec![("customer".into(), "acme".into()), ("metric".into(), "calls".into())],
        customer: "acme".into(),
    };
    for index in 0..count {
        event.id = format!("evt-{index:09}");
        event.time = start + step * index as i32;
        let verdict = partition
            .offer(&event, event.id.as_bytes(), event.time, &mut Constant, &mut records)
            .unwrap();
        assert!(matches!(verdict, Verdict::Applied), "event {index}: {verdict:?}");
        if index % 10_000 == 9_999 {
            drop(partition.take_changes());
        }
    }
    drop(partition.take_changes());
    drop(event);
    assert!(records.is_empty(), "no period closed");
    assert_eq!(partition.seen_ids(), count);
    let held = IN_USE.load(Ordering::Relaxed) - before;
    drop(partition);
    held as f64 / count as f64
}

fn main() {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .map(|arg| arg.parse().expect("each argument is a number of ids"))
        .collect();
    let counts = if counts.is_empty() { vec![100_000, 1_000_000] } else { counts };
    for count in counts {
        println!(
            "{count} ids of 13 bytes: {:.1} heap bytes per id (a hash map's capacity doubles: the figure varies with the count)",
            bytes_per_id(count)
        );
    }
}
