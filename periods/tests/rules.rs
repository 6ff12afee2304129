//! The period rules, through the crate's public API: worked cases whose
//! expected records are computed by hand (in the comments), and property
//! tests that the records never depend on where transactions end or where
//! a process restarted from its committed entries.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use proptest::prelude::*;
use tally_periods::{
    Addition, Aggregation, EventFacts, Folded, Offer, PartitionPeriods, PeriodCounts, PeriodRecord,
    PeriodSettings, PeriodsTable, Verdict, refusal_of_facts,
};

/// A `sum` meter: the state is the total as decimal text; a payload is a
/// quantity, `bad` is refused, and so is an event that would take its
/// period's total past `limit` (a refusal that depends on the state).
struct Sum {
    /// The payloads of the batch offered, by index.
    payloads: Vec<Vec<u8>>,
    limit: u64,
    /// Calls of `add`, and additions in them.
    calls: usize,
    additions: usize,
}

impl Sum {
    fn new(limit: u64) -> Sum {
        Sum { payloads: Vec::new(), limit, calls: 0, additions: 0 }
    }
}

fn number(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok().and_then(|text| text.parse().ok())
}

impl Aggregation for Sum {
    type Error = String;

    fn add(
        &mut self,
        states: &[Option<&[u8]>],
        additions: &[Addition],
        _tentative: bool,
    ) -> Result<Folded, String> {
        self.calls += 1;
        self.additions += additions.len();
        let mut totals: Vec<u64> =
            states.iter().map(|state| state.map_or(0, |state| number(state).unwrap())).collect();
        for (index, addition) in additions.iter().enumerate() {
            let Some(quantity) = number(&self.payloads[addition.event]) else {
                let reason = "quantity is not a number".to_string();
                return Ok(Folded::Refused { addition: index, reason });
            };
            let total = totals[addition.period] + quantity;
            if total > self.limit {
                let reason = format!("the total would pass {}", self.limit);
                return Ok(Folded::Refused { addition: index, reason });
            }
            totals[addition.period] = total;
        }
        Ok(Folded::States(totals.iter().map(|total| total.to_string().into_bytes()).collect()))
    }

    fn value(&mut self, state: &[u8]) -> Result<u64, String> {
        Ok(number(state).unwrap())
    }
}

fn settings(table: &str) -> Arc<PeriodSettings> {
    let table: PeriodsTable = serde_json::from_str(table).unwrap();
    Arc::new(PeriodSettings::try_from(table).unwrap())
}

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn event(id: &str, time: &str, customer: &str) -> EventFacts {
    EventFacts {
        id: id.to_string(),
        time: at(time),
        key: vec![("customer".into(), customer.into()), ("metric".into(), "calls".into())],
        customer: customer.to_string(),
    }
}

/// A partition under test, with what it emitted.
struct Partition {
    periods: PartitionPeriods,
    records: Vec<PeriodRecord>,
    sum: Sum,
}

impl Partition {
    fn new(settings: Arc<PeriodSettings>) -> Partition {
        Partition {
            periods: PartitionPeriods::new(settings),
            records: Vec::new(),
            sum: Sum::new(u64::MAX),
        }
    }

    /// Offers an event that arrived at its own event time.
    fn offer(&mut self, event: &EventFacts, quantity: &str) -> Verdict {
        self.offer_arriving(event, quantity, event.time)
    }

    fn offer_arriving(
        &mut self,
        event: &EventFacts,
        quantity: &str,
        arrival: Timestamp,
    ) -> Verdict {
        self.sum.payloads = vec![quantity.as_bytes().to_vec()];
        self.periods
            .offer(event, quantity.as_bytes(), arrival, &mut self.sum, &mut self.records)
            .unwrap()
    }

    fn end_transaction(&mut self) {
        self.periods.end_transaction(&mut self.sum, &mut self.records).unwrap();
    }

    /// The records emitted since the last call, as (type, label, value,
    /// version, previous) for a compact comparison.
    fn emitted(&mut self) -> Vec<(&'static str, String, u64, u32, Option<u64>)> {
        std::mem::take(&mut self.records)
            .into_iter()
            .map(|record| {
                let kind = if record.is_final() { "final" } else { "adjustment" };
                (kind, record.period.label, record.value, record.version, record.previous)
            })
            .collect()
    }
}

fn reason(verdict: Verdict) -> String {
    match verdict {
        Verdict::DeadLetter(reason) => reason,
        Verdict::Applied => panic!("applied, not a dead letter"),
    }
}

#[test]
fn a_new_york_month_closes_once_adjusts_and_forgets_at_its_horizon() {
    let mut partition = Partition::new(settings(
        r#"{"grace": "24h", "horizon": "35d", "max_future": "5m",
            "time_zones": {"acme": "America/New_York"}}"#,
    ));
    // November in New York: 2026-11-01T04:00Z to 2026-12-01T05:00Z.
    assert_eq!(partition.offer(&event("a", "2026-11-10T12:00:00Z", "acme"), "5"), Verdict::Applied);
    // 18:00 on 30 November in New York, though 1 December in UTC.
    assert_eq!(partition.offer(&event("b", "2026-12-01T00:00:00Z", "acme"), "7"), Verdict::Applied);
    assert!(
        reason(partition.offer(&event("a", "2026-11-10T12:00:00Z", "acme"), "5"))
            .starts_with("duplicate: event id \"a\"")
    );
    assert!(
        reason(partition.offer(&event("a", "2026-11-10T12:00:00Z", "acme"), "6"))
            .starts_with("duplicate_conflict: event id \"a\"")
    );
    assert!(
        reason(partition.offer(&event("x", "2026-11-10T12:00:00Z", "acme"), "bad"))
            .starts_with("refused: quantity is not a number")
    );
    assert_eq!(partition.emitted(), vec![]);

    // 2026-12-02T05:00Z is the end (12-01T05:00Z) plus the grace: closes.
    assert_eq!(partition.offer(&event("c", "2026-12-02T04:59:59Z", "acme"), "1"), Verdict::Applied);
    assert_eq!(partition.emitted(), vec![]);
    assert_eq!(partition.offer(&event("d", "2026-12-02T05:00:00Z", "acme"), "1"), Verdict::Applied);
    assert_eq!(partition.emitted(), vec![("final", "2026-11".into(), 12, 1, None)]);

    // Two late events in one transaction: one adjustment, 12 -> 15.
    assert_eq!(partition.offer(&event("e", "2026-11-20T00:00:00Z", "acme"), "1"), Verdict::Applied);
    assert_eq!(partition.offer(&event("f", "2026-11-21T00:00:00Z", "acme"), "2"), Verdict::Applied);
    partition.end_transaction();
    assert_eq!(partition.emitted(), vec![("adjustment", "2026-11".into(), 15, 2, Some(12))]);
    // A transaction that changes nothing final adjusts nothing.
    partition.end_transaction();
    assert_eq!(partition.emitted(), vec![]);

    // More than 5 minutes past its arrival: future, and the watermark
    // stays (December would close otherwise).
    let arrival = at("2026-12-03T00:00:00Z");
    let future = event("g", "2027-01-05T00:00:00Z", "acme");
    assert!(reason(partition.offer_arriving(&future, "1", arrival)).starts_with("future: "));
    assert_eq!(partition.periods.watermark(), Some(at("2026-12-02T05:00:00Z")));

    // 2027-01-05T05:00Z: November's end plus 35 days. December (ends
    // 2027-01-01T05:00Z) closes at 2027-01-02T05:00Z on the way.
    assert_eq!(partition.offer(&event("h", "2027-01-05T05:00:00Z", "acme"), "1"), Verdict::Applied);
    assert_eq!(partition.emitted(), vec![("final", "2026-12".into(), 2, 1, None)]);
    // November is gone: a late event and a retry of `a` are too old.
    assert!(reason(partition.offer(&event("i", "2026-11-30T00:00:00Z", "acme"), "1")).starts_with(
        "too_old: its period 2026-11 (America/New_York) ended at 2026-12-01T05:00:00Z"
    ));
    assert!(
        reason(partition.offer(&event("a", "2026-11-10T12:00:00Z", "acme"), "5"))
            .starts_with("too_old: ")
    );
    // December's ids are still known.
    assert!(
        reason(partition.offer(&event("d", "2026-12-02T05:00:00Z", "acme"), "1"))
            .starts_with("duplicate: ")
    );
    let counts = partition.periods.counts();
    assert_eq!(
        (counts.finals, counts.adjustments, counts.duplicates, counts.conflicts),
        (2, 1, 2, 1)
    );
    assert_eq!((counts.future, counts.too_old), (1, 2));
}

#[test]
fn an_idle_partition_closes_by_another_partitions_watermark_without_taking_it() {
    let mut partition = Partition::new(settings(r#"{"grace": "1h", "horizon": "35d"}"#));
    assert_eq!(
        partition.offer(&event("a", "2026-11-10T00:00:00Z", "globex"), "4"),
        Verdict::Applied
    );
    // UTC November ends 2026-12-01T00:00Z; with the grace, 01:00Z.
    let mut records = Vec::new();
    partition
        .periods
        .close_idle(at("2026-12-01T00:59:59Z"), &mut Sum::new(u64::MAX), &mut records)
        .unwrap();
    assert!(records.is_empty());
    partition
        .periods
        .close_idle(at("2026-12-01T01:00:00Z"), &mut Sum::new(u64::MAX), &mut records)
        .unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!((records[0].period.label.as_str(), records[0].value), ("2026-11", 4));
    assert_eq!(partition.periods.watermark(), Some(at("2026-11-10T00:00:00Z")), "own stays");
    assert_eq!(partition.periods.effective_watermark(), Some(at("2026-12-01T01:00:00Z")));
    // A lower watermark adopted later changes nothing.
    partition
        .periods
        .close_idle(at("2026-11-20T00:00:00Z"), &mut Sum::new(u64::MAX), &mut records)
        .unwrap();
    assert_eq!(partition.periods.effective_watermark(), Some(at("2026-12-01T01:00:00Z")));
    // A record arriving late for the closed month adjusts it.
    assert_eq!(
        partition.offer(&event("b", "2026-11-11T00:00:00Z", "globex"), "1"),
        Verdict::Applied
    );
    partition.end_transaction();
    assert_eq!(partition.emitted(), vec![("adjustment", "2026-11".into(), 5, 2, Some(4))]);
}

#[test]
fn periods_close_in_end_then_key_order_whatever_the_order_they_opened() {
    let mut partition = Partition::new(settings(
        r#"{"calendar": "day", "grace": "1h", "horizon": "3d",
            "time_zones": {"tokyo": "Asia/Tokyo", "paris": "Europe/Paris"}}"#,
    ));
    // Days end at 15:00Z in Tokyo (+9) and 23:00Z in Paris (+1, winter).
    for (id, time, customer) in [
        ("1", "2026-12-01T12:00:00Z", "paris"),
        ("2", "2026-12-01T12:00:00Z", "tokyo"),
        ("3", "2026-12-01T13:00:00Z", "acme"),
    ] {
        assert_eq!(partition.offer(&event(id, time, customer), "1"), Verdict::Applied);
    }
    assert_eq!(partition.offer(&event("4", "2026-12-03T00:00:00Z", "acme"), "1"), Verdict::Applied);
    let closed: Vec<(String, String)> = std::mem::take(&mut partition.records)
        .into_iter()
        .map(|record| (record.period.end.to_string(), record.key[0].1.clone()))
        .collect();
    assert_eq!(
        closed,
        [
            // Tokyo's 1 December ends 2026-12-01T15:00Z, Paris's at 23:00Z,
            // UTC's (acme) 2026-12-02T00:00Z.
            ("2026-12-01T15:00:00Z".to_string(), "tokyo".to_string()),
            ("2026-12-01T23:00:00Z".to_string(), "paris".to_string()),
            ("2026-12-02T00:00:00Z".to_string(), "acme".to_string()),
        ]
    );
}

#[test]
fn oversized_ids_and_keys_are_refused_naming_the_limit() {
    let mut partition = Partition::new(settings("{}"));
    let long_id = event(&"i".repeat(257), "2026-11-10T00:00:00Z", "acme");
    assert!(reason(partition.offer(&long_id, "1")).contains("1 to 256 bytes, this one is 257"));
    let mut wide = event("ok", "2026-11-10T00:00:00Z", "acme");
    wide.key = (0..17).map(|field| (field.to_string(), String::new())).collect();
    assert!(reason(partition.offer(&wide, "1")).contains("16 fields of 1024 bytes in all"));
}

#[test]
fn past_max_seen_ids_a_new_id_is_refused_and_a_retry_is_still_known() {
    let mut partition = Partition::new(settings(r#"{"max_seen_ids": 2}"#));
    assert_eq!(partition.offer(&event("a", "2026-11-10T00:00:00Z", "acme"), "1"), Verdict::Applied);
    assert_eq!(partition.offer(&event("b", "2026-11-11T00:00:00Z", "acme"), "1"), Verdict::Applied);
    let refused = reason(partition.offer(&event("c", "2026-11-12T00:00:00Z", "acme"), "1"));
    assert!(
        refused.starts_with("refused: the partition remembers 2 event ids, periods.max_seen_ids"),
        "{refused}"
    );
    assert!(
        reason(partition.offer(&event("a", "2026-11-10T00:00:00Z", "acme"), "1"))
            .starts_with("duplicate:")
    );
    // Once November's ids are purged (its end plus the horizon), new ids count again.
    assert_eq!(partition.offer(&event("d", "2027-01-10T00:00:00Z", "acme"), "1"), Verdict::Applied);
    assert_eq!(partition.offer(&event("e", "2027-01-11T00:00:00Z", "acme"), "1"), Verdict::Applied);
}

/// A seen id stored in the first format (an entry of its own: key `s` and
/// the id, value its expiry in whole seconds and a digest) is still a
/// duplicate after a restore, and the next commit moves it into a chunk.
#[test]
fn a_seen_id_stored_the_first_way_is_kept_and_rewritten_as_a_chunk() {
    let settings = settings("{}");
    // November in UTC ends 2026-12-01; plus the 35-day horizon.
    let expires = at("2027-01-05T00:00:00Z").as_second();
    let mut value = expires.to_be_bytes().to_vec();
    value.extend_from_slice(&[0; 8]);
    let legacy = (b"sevt-1".to_vec(), value);
    let mut partition = Partition::new(settings.clone());
    partition.periods = PartitionPeriods::restore(settings.clone(), [legacy.clone()]).unwrap();
    assert_eq!(partition.periods.seen_ids(), 1);
    assert!(partition.periods.is_dirty(), "the first format is rewritten");
    let retry = partition.offer(&event("evt-1", "2026-11-10T00:00:00Z", "utc"), "1");
    assert!(reason(retry).starts_with("duplicate"), "still remembered");
    let changes = partition.periods.take_changes();
    assert!(changes.contains(&(legacy.0.clone(), None)), "its entry is deleted: {changes:?}");
    let committed: Vec<(Vec<u8>, Vec<u8>)> =
        changes.into_iter().filter_map(|(key, value)| Some((key, value?))).collect();
    assert!(committed.iter().any(|(key, _)| key[0] == b'e'), "and written into a chunk");
    let restored = PartitionPeriods::restore(settings, committed).unwrap();
    assert_eq!(restored.seen_ids(), 1);
    assert!(!restored.is_dirty());
}

/// An expiry's chunks are numbered from 0 without a gap; a store whose
/// numbers skip is damaged (a purge would leave the others behind).
#[test]
fn chunks_of_seen_ids_with_a_gap_are_damaged() {
    let settings = settings("{}");
    let mut partition = Partition::new(settings.clone());
    partition.offer(&event("a", "2026-11-10T00:00:00Z", "acme"), "1");
    let entries: Vec<(Vec<u8>, Vec<u8>)> = partition
        .periods
        .take_changes()
        .into_iter()
        .filter_map(|(key, value)| Some((key, value?)))
        .collect();
    assert!(PartitionPeriods::restore(settings.clone(), entries.clone()).is_ok());
    let renumbered = entries.into_iter().map(|(mut key, value)| {
        if key[0] == b'e' {
            let last = key.len() - 1;
            key[last] = 1;
        }
        (key, value)
    });
    let damaged = PartitionPeriods::restore(settings, renumbered).unwrap_err();
    assert!(damaged.to_string().contains("numbered from 0 without a gap"), "{damaged}");
}

/// One step of a generated run.
#[derive(Debug, Clone)]
enum Step {
    /// An event: id number, customer, minutes after the run's start its
    /// time lies, minutes it arrived after that, quantity.
    Event { id: u8, customer: u8, minutes: i64, late_arrival: i64, quantity: u8 },
    /// A transaction ends (and commits).
    Commit,
    /// The partition is idle: close it through this many minutes.
    Idle { minutes: i64 },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    // About four months of event time around New York's and Lord Howe's
    // DST changes (October-November 2026), in a handful of zones.
    let event = (0u8..40, 0u8..4, 0i64..150_000, -10i64..20, 0u8..10).prop_map(
        |(id, customer, minutes, late_arrival, quantity)| Step::Event {
            id,
            customer,
            minutes,
            late_arrival,
            quantity,
        },
    );
    let step = prop_oneof![
        8 => event,
        2 => Just(Step::Commit),
        1 => (0i64..150_000).prop_map(|minutes| Step::Idle { minutes }),
    ];
    prop::collection::vec(step, 1..200)
}

const CUSTOMERS: [&str; 4] = ["acme", "globex", "initech", "umbrella"];

fn generated_settings() -> Arc<PeriodSettings> {
    settings(
        r#"{"calendar": "day", "grace": "6h", "horizon": "10d", "max_future": "5m",
            "time_zones": {"acme": "America/New_York", "globex": "Australia/Lord_Howe",
                           "initech": "Asia/Kathmandu"}}"#,
    )
}

/// How a generated run is driven.
#[derive(Debug, Clone, Copy)]
struct Drive<'a> {
    /// Restart from the committed entries after these commits.
    restarts: &'a [usize],
    /// Offer the events between two other steps in batches of at most
    /// this many (1: one at a time).
    batch: usize,
    /// The meter refuses a period's total past this.
    limit: u64,
}

const ONE_BY_ONE: Drive<'static> = Drive { restarts: &[], batch: 1, limit: u64::MAX };

/// What a generated run gave: every record of a committed transaction,
/// the verdicts, the committed entries and the counts.
struct Ran {
    records: Vec<PeriodRecord>,
    verdicts: Vec<Verdict>,
    entries: BTreeMap<Vec<u8>, Vec<u8>>,
    counts: PeriodCounts,
}

/// An event step's facts, payload and arrival.
fn offered(step: &Step) -> Option<(EventFacts, String, Timestamp)> {
    let Step::Event { id, customer, minutes: at_minute, late_arrival, quantity } = step else {
        return None;
    };
    let customer = CUSTOMERS[usize::from(*customer)];
    let facts = EventFacts {
        id: format!("event-{id}"),
        time: minutes(*at_minute),
        key: vec![("customer".into(), customer.into())],
        customer: customer.into(),
    };
    // A quantity of 9 is written so that the meter refuses it.
    let payload = if *quantity == 9 { "bad".to_string() } else { quantity.to_string() };
    Some((facts, payload, minutes(at_minute + late_arrival)))
}

fn minutes(count: i64) -> Timestamp {
    at("2026-09-20T00:00:00Z") + jiff::SignedDuration::from_mins(count)
}

/// Runs `steps`, committing where they say (and at the end), driven as
/// `drive` says.
fn run(steps: &[Step], drive: Drive<'_>) -> Ran {
    let settings = generated_settings();
    let mut entries: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut partition = PartitionPeriods::new(settings.clone());
    let mut sum = Sum::new(drive.limit);
    let (mut records, mut pending, mut verdicts) = (Vec::new(), Vec::new(), Vec::new());
    let mut commits = 0;
    let mut batch: Vec<(EventFacts, String, Timestamp)> = Vec::new();
    let steps: Vec<&Step> = steps.iter().chain([&Step::Commit]).collect();
    for (index, step) in steps.iter().enumerate() {
        if let Some(event) = offered(step) {
            batch.push(event);
            let next_is_event = steps.get(index + 1).is_some_and(|next| offered(next).is_some());
            if batch.len() < drive.batch && next_is_event {
                continue;
            }
            sum.payloads =
                batch.iter().map(|(_, payload, _)| payload.clone().into_bytes()).collect();
            let offers: Vec<Offer<'_>> = batch
                .iter()
                .map(|(facts, payload, arrival)| Offer {
                    facts,
                    payload: payload.as_bytes(),
                    arrival: *arrival,
                })
                .collect();
            let before = pending.len();
            let offered = partition.offer_all(&offers, &mut sum, &mut pending).unwrap();
            assert_eq!(
                offered.iter().map(|offered| offered.records).sum::<usize>(),
                pending.len() - before,
                "each record is told to its event"
            );
            verdicts.extend(offered.into_iter().map(|offered| offered.verdict));
            batch.clear();
            continue;
        }
        match step {
            Step::Idle { minutes: through } => {
                partition.close_idle(minutes(*through), &mut sum, &mut pending).unwrap();
            }
            Step::Commit => {
                partition.end_transaction(&mut sum, &mut pending).unwrap();
                for (key, value) in partition.take_changes() {
                    match value {
                        Some(value) => entries.insert(key, value),
                        None => entries.remove(&key),
                    };
                }
                records.append(&mut pending);
                commits += 1;
                if drive.restarts.contains(&commits) {
                    let committed = entries.clone().into_iter();
                    partition = PartitionPeriods::restore(settings.clone(), committed).unwrap();
                }
            }
            Step::Event { .. } => unreachable!("offered above"),
        }
    }
    Ran { records, verdicts, entries, counts: partition.counts() }
}

/// Each period's FINAL value and its last value, by (key, label).
fn settled(records: &[PeriodRecord]) -> BTreeMap<(String, String), (u64, u64, u32)> {
    let mut settled = BTreeMap::new();
    for record in records {
        let id = (record.key[0].1.clone(), record.period.label.clone());
        let entry = settled.entry(id).or_insert((record.value, record.value, record.version));
        assert!(record.version > entry.2 || record.is_final(), "versions rise: {record:?}");
        if record.is_final() {
            assert_eq!(entry.2, 1, "one FINAL per period: {record:?}");
        }
        entry.1 = record.value;
        entry.2 = record.version;
    }
    settled
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// A process restarted from its committed entries after any commit
    /// emits what one that never stopped emits, record for record.
    #[test]
    fn a_restart_from_the_committed_entries_changes_no_record(
        steps in steps(),
        restarts in prop::collection::vec(1usize..40, 0..4),
    ) {
        let uninterrupted = run(&steps, ONE_BY_ONE);
        let restarted = run(&steps, Drive { restarts: &restarts, ..ONE_BY_ONE });
        prop_assert_eq!(uninterrupted.records, restarted.records);
        prop_assert_eq!(uninterrupted.verdicts, restarted.verdicts);
    }

    /// Where transactions end changes how many ADJUSTMENTs there are, never
    /// the FINALs, the verdicts, or where each period's value settles.
    #[test]
    fn transaction_boundaries_change_no_final_and_no_settled_value(steps in steps()) {
        let without_commits: Vec<Step> =
            steps.iter().filter(|step| !matches!(step, Step::Commit)).cloned().collect();
        let committing = run(&steps, ONE_BY_ONE);
        let once = run(&without_commits, ONE_BY_ONE);
        let finals = |records: &[PeriodRecord]| -> Vec<PeriodRecord> {
            records.iter().filter(|record| record.is_final()).cloned().collect()
        };
        prop_assert_eq!(finals(&committing.records), finals(&once.records));
        prop_assert_eq!(committing.verdicts, once.verdicts);
        let settled_once: BTreeMap<_, _> =
            settled(&once.records).into_iter().map(|(id, (first, last, _))| (id, (first, last))).collect();
        let settled_committing: BTreeMap<_, _> =
            settled(&committing.records).into_iter().map(|(id, (first, last, _))| (id, (first, last))).collect();
        prop_assert_eq!(settled_committing, settled_once);
    }

    /// Events offered in batches (folded whole, or one by one after a
    /// refusal, a state-dependent one included) give the records, the
    /// verdicts and the committed entries of events offered one at a time.
    #[test]
    fn batches_change_no_record_verdict_or_entry(
        steps in steps(),
        batch in 2usize..40,
        limit in prop_oneof![Just(u64::MAX), 5u64..60],
        restarts in prop::collection::vec(1usize..40, 0..3),
    ) {
        let one_by_one = run(&steps, Drive { restarts: &restarts, batch: 1, limit });
        let batched = run(&steps, Drive { restarts: &restarts, batch, limit });
        prop_assert_eq!(one_by_one.records, batched.records);
        prop_assert_eq!(one_by_one.verdicts, batched.verdicts);
        prop_assert_eq!(one_by_one.entries, batched.entries);
        prop_assert_eq!(one_by_one.counts, batched.counts);
    }
}

/// A batch that forgets a period marked by an earlier batch of the same
/// transaction (its ADJUSTMENT goes out first), then meets a refused
/// event, is undone whole: the period is marked again, and the events one
/// at a time emit that ADJUSTMENT once.
#[test]
fn an_undone_batch_gives_back_the_marks_it_took() {
    let event =
        |id, minutes| Step::Event { id, customer: 0, minutes, late_arrival: 0, quantity: 1 };
    let steps = [
        event(1, 0),
        event(2, 2 * 1440),
        Step::Commit,
        // Late: 20 September (New York) is final; it is marked.
        event(3, 10),
        // Closing nothing, it ends the batch.
        Step::Idle { minutes: 0 },
        // Far ahead: 20 September is forgotten, after its ADJUSTMENT...
        event(4, 20 * 1440),
        // ...and this one is refused, so the batch is undone.
        Step::Event { id: 5, customer: 0, minutes: 20 * 1440, late_arrival: 0, quantity: 9 },
    ];
    let one_by_one = run(&steps, ONE_BY_ONE);
    let batched = run(&steps, Drive { batch: 2, ..ONE_BY_ONE });
    let adjustments = one_by_one.records.iter().filter(|record| !record.is_final()).count();
    assert_eq!(adjustments, 1, "{:?}", one_by_one.records);
    assert_eq!(one_by_one.records, batched.records);
    assert_eq!(one_by_one.verdicts, batched.verdicts);
    assert_eq!(one_by_one.entries, batched.entries);
}

/// A refused event that would raise the watermark far enough to close and
/// forget periods and ids closes and forgets nothing, tried whole or not:
/// a retry of a remembered id is still a duplicate.
#[test]
fn a_refused_event_forgets_no_id_in_a_batch_either() {
    let event =
        |id, minutes, quantity| Step::Event { id, customer: 0, minutes, late_arrival: 0, quantity };
    let steps = [
        event(1, 0, 1),
        Step::Commit,
        // Refused (a quantity of 9): tried whole, its addition is folded,
        // and refused, before anything closes...
        event(2, 20 * 1440, 9),
        event(3, 5, 1),
        Step::Idle { minutes: 0 },
        // ...so id 1 is remembered.
        event(1, 0, 1),
    ];
    let one_by_one = run(&steps, ONE_BY_ONE);
    let batched = run(&steps, Drive { batch: 2, ..ONE_BY_ONE });
    assert!(
        matches!(one_by_one.verdicts.last(), Some(Verdict::DeadLetter(reason)) if reason.starts_with("duplicate:")),
        "{:?}",
        one_by_one.verdicts
    );
    assert_eq!(one_by_one.verdicts, batched.verdicts);
    assert_eq!(one_by_one.records, batched.records);
    assert_eq!(one_by_one.entries, batched.entries);
}

/// A batch the meter accepts whole is folded in one call, a batch with a
/// refused event one event at a time, with the same verdicts.
#[test]
fn a_batch_is_folded_in_one_call_unless_an_event_is_refused() {
    let settings = settings("{}");
    let ids = ["a", "b", "c", "d"];
    let facts: Vec<EventFacts> = ids
        .iter()
        .map(|id| event(id, "2026-11-10T12:00:00Z", if *id == "b" { "globex" } else { "acme" }))
        .collect();
    let offer = |payloads: &[&str], sum: &mut Sum| {
        let mut partition = PartitionPeriods::new(settings.clone());
        sum.payloads = payloads.iter().map(|payload| payload.as_bytes().to_vec()).collect();
        let offers: Vec<Offer<'_>> = facts
            .iter()
            .zip(payloads)
            .map(|(facts, payload)| Offer {
                facts,
                payload: payload.as_bytes(),
                arrival: facts.time,
            })
            .collect();
        let offered = partition.offer_all(&offers, sum, &mut Vec::new()).unwrap();
        let verdicts: Vec<Verdict> = offered.into_iter().map(|offered| offered.verdict).collect();
        (verdicts, partition.take_changes())
    };
    let mut sum = Sum::new(u64::MAX);
    let (verdicts, _) = offer(&["1", "2", "3", "4"], &mut sum);
    assert_eq!(verdicts, vec![Verdict::Applied; 4]);
    assert_eq!((sum.calls, sum.additions), (1, 4), "one call folds the batch");

    let mut sum = Sum::new(u64::MAX);
    let (verdicts, changes) = offer(&["1", "bad", "3", "4"], &mut sum);
    assert_eq!(verdicts[1], Verdict::DeadLetter("refused: quantity is not a number".into()));
    assert_eq!(verdicts.iter().filter(|verdict| **verdict == Verdict::Applied).count(), 3);
    // The whole batch (refused at its second addition), then each event.
    assert_eq!(sum.calls, 1 + 4);
    let mut one_by_one = Partition::new(settings.clone());
    for (facts, payload) in facts.iter().zip(["1", "bad", "3", "4"]) {
        one_by_one.offer(facts, payload);
    }
    assert_eq!(changes, one_by_one.periods.take_changes());
}

#[test]
fn facts_past_their_bounds_are_refused_naming_the_bound_and_the_size() {
    let base = event("e1", "2026-11-01T00:00:00Z", "acme");
    let with = |change: &dyn Fn(&mut EventFacts)| {
        let mut facts = base.clone();
        change(&mut facts);
        refusal_of_facts(&facts)
    };
    assert_eq!(refusal_of_facts(&base), None);
    assert_eq!(with(&|f| f.id = "x".repeat(256)), None, "256 bytes is allowed");
    assert_eq!(
        with(&|f| f.id = String::new()).as_deref(),
        Some("refused: an event id must be 1 to 256 bytes, this one is 0")
    );
    assert_eq!(
        with(&|f| f.id = "x".repeat(257)).as_deref(),
        Some("refused: an event id must be 1 to 256 bytes, this one is 257")
    );
    assert_eq!(
        with(&|f| f.key = (0..17).map(|n| (n.to_string(), String::new())).collect()).as_deref(),
        Some(
            "refused: an aggregation key may have 16 fields of 1024 bytes in all, this one has 17 of 24"
        )
    );
    assert_eq!(with(&|f| f.key = vec![("k".into(), "v".repeat(1023))]), None);
    assert_eq!(
        with(&|f| f.key = vec![("k".into(), "v".repeat(1024))]).as_deref(),
        Some(
            "refused: an aggregation key may have 16 fields of 1024 bytes in all, this one has 1 of 1025"
        )
    );
    // The host's own fields of a period record are not the plugin's to name.
    let refused = with(&|f| f.key.insert(0, ("type".into(), "adjustment".into()))).unwrap();
    assert!(refused.contains("may not be named \"type\""), "{refused}");
    let refused = with(&|f| f.key.push(("value".into(), "1".into()))).unwrap();
    assert!(refused.contains("may not be named \"value\""), "{refused}");
    let refused = with(&|f| f.key.push(f.key[0].clone())).unwrap();
    assert!(refused.contains("names field"), "{refused}");
    assert!(refused.contains("twice"), "{refused}");
    assert_eq!(with(&|f| f.customer = "c".repeat(1024)), None);
    assert_eq!(
        with(&|f| f.customer = "c".repeat(1025)).as_deref(),
        Some("refused: a customer may have at most 1024 bytes, this one has 1025")
    );
}

/// A horizon made longer between runs keeps periods and ids longer from
/// then on, and never opens a period the partition forgot under the
/// shorter one: that would be a second FINAL, and its ids counted again.
#[test]
fn a_longer_horizon_after_a_restart_never_opens_a_forgotten_period_anew() {
    let mut store = std::collections::BTreeMap::new();
    let mut commit = |partition: &mut Partition| {
        partition.end_transaction();
        for (key, value) in partition.periods.take_changes() {
            match value {
                Some(value) => store.insert(key, value),
                None => store.remove(&key),
            };
        }
        store.clone()
    };
    let short = settings(r#"{"grace": "24h", "horizon": "35d"}"#);
    let mut partition = Partition::new(short.clone());
    // November in UTC ends 2026-12-01T00:00Z, December 2027-01-01T00:00Z.
    assert_eq!(partition.offer(&event("a", "2026-11-10T00:00:00Z", "acme"), "5"), Verdict::Applied);
    assert_eq!(partition.offer(&event("b", "2026-12-02T00:00:00Z", "acme"), "1"), Verdict::Applied);
    assert_eq!(partition.emitted(), vec![("final", "2026-11".into(), 5, 1, None)]);
    // November's end plus 35 days: November is forgotten, December final.
    assert_eq!(partition.offer(&event("c", "2027-01-05T00:00:00Z", "acme"), "1"), Verdict::Applied);
    assert_eq!(partition.emitted(), vec![("final", "2026-12".into(), 1, 1, None)]);
    let entries = commit(&mut partition);

    // The next run has a 60-day horizon: November would be within it.
    let long = settings(r#"{"grace": "24h", "horizon": "60d"}"#);
    let mut partition = Partition::new(long.clone());
    partition.periods = PartitionPeriods::restore(long.clone(), entries).unwrap();
    let late = reason(partition.offer(&event("d", "2026-11-20T00:00:00Z", "acme"), "7"));
    assert!(
        late.starts_with("too_old: its period 2026-11 (UTC) ended at 2026-12-01T00:00:00Z, when this partition's periods may be forgotten already"),
        "{late}"
    );
    assert!(
        reason(partition.offer(&event("a", "2026-11-10T00:00:00Z", "acme"), "5"))
            .starts_with("too_old: ")
    );
    assert_eq!(partition.emitted(), vec![], "no second FINAL for November");

    // December stays adjustable, and its ids known, for 60 days: past its
    // end plus 35 days (2027-02-05) a retry of `b` is still a duplicate.
    assert_eq!(partition.offer(&event("e", "2027-02-10T00:00:00Z", "acme"), "1"), Verdict::Applied);
    assert_eq!(partition.emitted(), vec![("final", "2027-01".into(), 1, 1, None)]);
    assert!(
        reason(partition.offer(&event("b", "2026-12-02T00:00:00Z", "acme"), "1"))
            .starts_with("duplicate: ")
    );
    assert_eq!(partition.offer(&event("f", "2026-12-20T00:00:00Z", "acme"), "2"), Verdict::Applied);
    partition.end_transaction();
    assert_eq!(partition.emitted(), vec![("adjustment", "2026-12".into(), 3, 2, Some(1))]);
    let entries = commit(&mut partition);

    // And so after one more restart, with the 35 days again: December
    // (ended 2027-01-01, plus 35 days) is forgotten at once, November too.
    let mut partition = Partition::new(short.clone());
    partition.periods = PartitionPeriods::restore(short, entries).unwrap();
    assert!(
        reason(partition.offer(&event("g", "2026-12-21T00:00:00Z", "acme"), "1"))
            .starts_with("too_old: ")
    );
    assert!(
        reason(partition.offer(&event("h", "2026-11-21T00:00:00Z", "acme"), "1"))
            .starts_with("too_old: ")
    );
}

/// A store written before the partition kept how far it may have forgotten
/// (no `f` entry) gets that line from the first event it takes after the
/// upgrade: a horizon raised at a later restart then opens nothing anew.
#[test]
fn a_store_from_before_the_forgotten_line_gets_it_at_its_next_event() {
    let short = settings(r#"{"grace": "24h", "horizon": "35d"}"#);
    let mut partition = Partition::new(short.clone());
    assert_eq!(partition.offer(&event("a", "2026-11-10T00:00:00Z", "acme"), "5"), Verdict::Applied);
    assert_eq!(partition.offer(&event("b", "2027-01-05T00:00:00Z", "acme"), "1"), Verdict::Applied);
    partition.end_transaction();
    let mut old: BTreeMap<Vec<u8>, Vec<u8>> = partition
        .periods
        .take_changes()
        .into_iter()
        .filter_map(|(key, value)| Some((key, value?)))
        .collect();
    assert_eq!(partition.emitted(), vec![("final", "2026-11".into(), 5, 1, None)]);
    // As the store was before the line was kept.
    assert!(old.remove(b"f".as_slice()).is_some(), "the line is committed: {old:?}");

    // The upgraded run, same horizon: its first event keeps the line.
    let mut partition = Partition::new(short.clone());
    partition.periods = PartitionPeriods::restore(short, old.clone()).unwrap();
    assert_eq!(partition.offer(&event("c", "2027-01-06T00:00:00Z", "acme"), "1"), Verdict::Applied);
    partition.end_transaction();
    for (key, value) in partition.periods.take_changes() {
        match value {
            Some(value) => old.insert(key, value),
            None => old.remove(&key),
        };
    }
    let long = settings(r#"{"grace": "24h", "horizon": "60d"}"#);
    let mut partition = Partition::new(long.clone());
    partition.periods = PartitionPeriods::restore(long, old).unwrap();
    let late = reason(partition.offer(&event("d", "2026-11-20T00:00:00Z", "acme"), "7"));
    assert!(late.contains("may be forgotten already"), "{late}");
    assert_eq!(partition.emitted(), vec![], "no second FINAL for November");
}
