//! The period rules of one input partition, applied record by record in
//! offset order (Flink's window operator with an event-time clock, and
//! Kafka Streams' `onWindowClose`, for calendar periods):
//!
//! 1. an event time past its arrival plus `max_future` is a dead letter
//!    (`future:`), and the watermark does not move;
//! 2. an event whose period ended `horizon` or more before the effective
//!    watermark is a dead letter (`too_old:`);
//! 3. an event id already seen in the partition is not applied: a dead
//!    letter `duplicate:`, or `duplicate_conflict:` when its payload
//!    differs from the first one's (the first one wins);
//! 4. otherwise the aggregation adds the event to its period's state; a
//!    period already final is marked for an adjustment;
//! 5. the watermark rises to the event time, and every open period whose
//!    end plus `grace` is at or before the effective watermark closes, in
//!    (end, key) order: its FINAL record, version 1.
//!
//! At the end of each transaction every marked period whose value changed
//! emits an ADJUSTMENT (the next version). A period's state and its event
//! ids are purged once the effective watermark reaches its end plus
//! `horizon`. The effective watermark is the partition's own (the highest
//! event time it accepted) or, if higher, the one idleness closed it
//! through ([`PartitionPeriods::close_idle`]): another partition's
//! watermark is never taken as this one's own.
//!
//! Everything here is state the host commits in the transaction:
//! [`PartitionPeriods::take_changes`] hands over what changed since the
//! last call as entries of a stable encoding ([`crate::codec`]), and
//! [`PartitionPeriods::restore`] rebuilds the partition from them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use jiff::{SignedDuration, Timestamp};

use crate::calendar::{OutOfRange, Period};
use crate::codec::{self, Entry, Stored};
use crate::settings::PeriodSettings;

/// What a plugin says about one event, before it is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventFacts {
    /// The producer's id of the event: its retries carry the same one.
    pub id: String,
    /// When the event happened.
    pub time: Timestamp,
    /// The aggregation key's fields, in order (e.g. customer, metric).
    pub key: AggregationKey,
    /// The customer whose time zone the event's period follows.
    pub customer: String,
}

/// How a refusal for a full seen-id store begins.
const SEEN_IDS_FULL: &str = "refused: the partition remembers";

/// Whether a dead letter's reason is one the rules give whatever the
/// plugin: a retry, a conflicting retry, a future, too old or out of range
/// event, a full seen-id store. Any other (a malformed description, the
/// plugin's own refusal) is the plugin's.
pub fn refused_by_rule(reason: &str) -> bool {
    ["duplicate:", "duplicate_conflict:", "future:", "too_old:", "out_of_range:", SEEN_IDS_FULL]
        .iter()
        .any(|prefix| reason.starts_with(prefix))
}

/// Longest event id, in bytes: every id is remembered until its horizon.
pub const MAX_EVENT_ID_BYTES: usize = 256;
/// Most fields of an aggregation key.
pub const MAX_KEY_FIELDS: usize = 16;
/// Most bytes of an aggregation key's names and values together.
pub const MAX_KEY_BYTES: usize = 1024;

/// The fields of an aggregation key, in the plugin's order: they lead a
/// period record and name it, with the period's label.
pub type AggregationKey = Vec<(String, String)>;

/// What adding an event to a period's state gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Added {
    /// The period's new state.
    State(Vec<u8>),
    /// The plugin refused the event, saying why: it does not count.
    Refused(String),
}

/// How events change a period's state, and the period's value: the
/// plugin's part.
pub trait Aggregation {
    /// A failed call (a trap): the transaction cannot go on.
    type Error: std::fmt::Display;

    /// The state of a period after `payload` (the event's bytes), whose
    /// event time is `time`, is added to `state` (`None`: the period's
    /// first event), or a refusal.
    fn add(
        &mut self,
        state: Option<&[u8]>,
        time: Timestamp,
        payload: &[u8],
    ) -> Result<Added, Self::Error>;

    /// The value of a period whose state is `state`.
    fn value(&mut self, state: &[u8]) -> Result<u64, Self::Error>;
}

/// What became of one offered event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It counted in its period.
    Applied,
    /// It did not count; the reason starts with its kind (`future:`,
    /// `too_old:`, `duplicate:`, `duplicate_conflict:`, `out_of_range:`,
    /// `refused:`).
    DeadLetter(String),
}

/// A period record for the output: a FINAL or an ADJUSTMENT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeriodRecord {
    /// The aggregation key.
    pub key: AggregationKey,
    /// The period.
    pub period: Period,
    /// The zone whose calendar made it.
    pub time_zone: String,
    /// Its value now.
    pub value: u64,
    /// 1 for the FINAL, then one more for each ADJUSTMENT.
    pub version: u32,
    /// The value of the previous version (ADJUSTMENTs only).
    pub previous: Option<u64>,
}

impl PeriodRecord {
    /// Whether it is the period's FINAL record.
    pub fn is_final(&self) -> bool {
        self.version == 1
    }

    /// How much the value changed since the previous version (0 for a
    /// FINAL).
    pub fn delta(&self) -> i128 {
        self.previous.map_or(0, |previous| i128::from(self.value) - i128::from(previous))
    }
}

/// Identifies a period of a partition, in closing order.
type PeriodId = (Timestamp, AggregationKey, String);

/// A period the partition holds: open, or final and still adjustable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeriodState {
    pub(crate) start: Timestamp,
    pub(crate) time_zone: String,
    /// The aggregation's state.
    pub(crate) state: Vec<u8>,
    /// 0 while open; the last version emitted once final.
    pub(crate) version: u32,
    /// The value of the last version emitted.
    pub(crate) value: u64,
}

/// An event id the partition has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SeenId {
    /// When it may be forgotten: its period's end plus the horizon.
    pub(crate) expires: Timestamp,
    /// The first 8 bytes of its payload's SHA-256: a retry with another
    /// payload is told apart (either way it is not applied).
    pub(crate) digest: [u8; 8],
}

/// Counts of what the partition did, for status and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeriodCounts {
    /// FINAL records emitted.
    pub finals: u64,
    /// ADJUSTMENT records emitted.
    pub adjustments: u64,
    /// Duplicates with the first payload.
    pub duplicates: u64,
    /// Duplicates with another payload.
    pub conflicts: u64,
    /// Events too far in the future.
    pub future: u64,
    /// Events too old.
    pub too_old: u64,
}

/// The periods, watermark and seen event ids of one input partition.
#[derive(Debug, Clone)]
pub struct PartitionPeriods {
    settings: std::sync::Arc<PeriodSettings>,
    /// The highest event time accepted.
    watermark: Option<Timestamp>,
    /// The effective watermark idleness closed the partition through.
    idle_through: Option<Timestamp>,
    /// Periods not yet final.
    open: BTreeMap<PeriodId, PeriodState>,
    /// Final periods, kept for adjustments until the horizon.
    closed: BTreeMap<PeriodId, PeriodState>,
    /// Final periods changed in this transaction.
    marked: BTreeSet<PeriodId>,
    /// Seen ids; a randomly seeded hash keeps crafted ids from colliding.
    seen: HashMap<String, SeenId, foldhash::fast::RandomState>,
    /// Seen ids by expiry, for the purge.
    expiring: BTreeMap<Timestamp, Vec<String>>,
    /// Periods changed since the last [`PartitionPeriods::take_changes`],
    /// encoded there: once per transaction, not once per event.
    dirty: BTreeSet<PeriodId>,
    /// Whether the watermark moved since the last `take_changes`.
    watermark_moved: bool,
    /// Other entries changed since the last `take_changes` (seen ids,
    /// deletions, the idle watermark).
    changed: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    counts: PeriodCounts,
}

impl PartitionPeriods {
    /// An empty partition under `settings`.
    pub fn new(settings: std::sync::Arc<PeriodSettings>) -> PartitionPeriods {
        PartitionPeriods {
            settings,
            watermark: None,
            idle_through: None,
            open: BTreeMap::new(),
            closed: BTreeMap::new(),
            marked: BTreeSet::new(),
            seen: HashMap::default(),
            expiring: BTreeMap::new(),
            dirty: BTreeSet::new(),
            watermark_moved: false,
            changed: BTreeMap::new(),
            counts: PeriodCounts::default(),
        }
    }

    /// The partition as its committed `entries` (from
    /// [`PartitionPeriods::take_changes`]) left it.
    pub fn restore(
        settings: std::sync::Arc<PeriodSettings>,
        entries: impl IntoIterator<Item = Entry>,
    ) -> Result<PartitionPeriods, codec::Damaged> {
        let mut partition = PartitionPeriods::new(settings);
        for (key, value) in entries {
            match codec::decode(&key, &value)? {
                Stored::Watermark(at) => partition.watermark = Some(at),
                Stored::IdleThrough(at) => partition.idle_through = Some(at),
                Stored::Period(id, period) => {
                    let into = if period.version == 0 {
                        &mut partition.open
                    } else {
                        &mut partition.closed
                    };
                    into.insert(id, period);
                }
                Stored::Seen(id, seen) => {
                    partition.expiring.entry(seen.expires).or_default().push(id.clone());
                    partition.seen.insert(id, seen);
                }
            }
        }
        Ok(partition)
    }

    /// The partition's own watermark: the highest event time it accepted.
    pub fn watermark(&self) -> Option<Timestamp> {
        self.watermark
    }

    /// The watermark its periods close by: its own, or the one idleness
    /// closed it through if that is higher.
    pub fn effective_watermark(&self) -> Option<Timestamp> {
        self.watermark.max(self.idle_through)
    }

    /// Periods not yet final.
    pub fn open_periods(&self) -> usize {
        self.open.len()
    }

    /// Event ids remembered.
    pub fn seen_ids(&self) -> usize {
        self.seen.len()
    }

    /// What it did so far in this process.
    pub fn counts(&self) -> PeriodCounts {
        self.counts
    }

    /// Applies one event (rules 1 to 5, see the module), appending the
    /// FINAL records it closes to `out`. `arrival` is when the record
    /// reached the host. An `Err` is the aggregation's failure: the
    /// transaction cannot go on.
    pub fn offer<A: Aggregation>(
        &mut self,
        event: &EventFacts,
        payload: &[u8],
        arrival: Timestamp,
        aggregation: &mut A,
        out: &mut Vec<PeriodRecord>,
    ) -> Result<Verdict, A::Error> {
        if let Some(refusal) = malformed(event) {
            return Ok(Verdict::DeadLetter(refusal));
        }
        let settings = self.settings.clone();
        let latest_allowed = arrival.saturating_add(settings.max_future).unwrap_or(arrival);
        if event.time > latest_allowed {
            self.counts.future += 1;
            return Ok(Verdict::DeadLetter(format!(
                "future: event time {} is more than periods.max_future ({}) past its arrival at {arrival}",
                event.time,
                friendly(settings.max_future)
            )));
        }
        let zone = settings.zone_of(&event.customer);
        let period = match settings.calendar.period_of(event.time, zone) {
            Ok(period) => period,
            Err(OutOfRange { .. }) => {
                return Ok(Verdict::DeadLetter(format!(
                    "out_of_range: event time {} has no period in {}: it lies at the edge of the calendar (years -9999 to 9999)",
                    event.time,
                    zone.name()
                )));
            }
        };
        let purge_at = after(period.end, settings.horizon);
        if let Some(effective) = self.effective_watermark()
            && effective >= purge_at
        {
            self.counts.too_old += 1;
            return Ok(Verdict::DeadLetter(format!(
                "too_old: its period {} ({}) ended at {}, periods.horizon ({}) or more before the partition's watermark {effective}",
                period.label,
                zone.name(),
                period.end,
                friendly(settings.horizon)
            )));
        }
        let digest = codec::payload_digest(payload);
        if let Some(seen) = self.seen.get(&event.id) {
            return Ok(Verdict::DeadLetter(if seen.digest == digest {
                self.counts.duplicates += 1;
                format!("duplicate: event id {:?} was counted already", event.id)
            } else {
                self.counts.conflicts += 1;
                format!(
                    "duplicate_conflict: event id {:?} was counted already with another payload; the first one counts",
                    event.id
                )
            }));
        }
        if self.seen.len() as u64 >= settings.max_seen_ids && !self.would_purge_one(event.time) {
            return Ok(Verdict::DeadLetter(format!(
                "{SEEN_IDS_FULL} {} event ids, periods.max_seen_ids; an id is kept until its period's end plus periods.horizon ({}), so raise the limit or shorten the horizon, and send the event again",
                self.seen.len(),
                friendly(settings.horizon)
            )));
        }
        let id: PeriodId = (period.end, event.key.clone(), period.label.clone());
        let (held, is_final) = match self.open.get(&id) {
            Some(open) => (Some(&open.state), false),
            None => {
                (self.closed.get(&id).map(|closed| &closed.state), self.closed.contains_key(&id))
            }
        };
        let state = match aggregation.add(held.map(Vec::as_slice), event.time, payload)? {
            Added::State(state) => state,
            Added::Refused(why) => return Ok(Verdict::DeadLetter(format!("refused: {why}"))),
        };
        let entry = if is_final {
            self.marked.insert(id.clone());
            self.closed.get_mut(&id).expect("a final period is held")
        } else {
            self.open.entry(id.clone()).or_insert_with(|| PeriodState {
                start: period.start,
                time_zone: zone.name().to_string(),
                state: Vec::new(),
                version: 0,
                value: 0,
            })
        };
        entry.state = state;
        self.dirty.insert(id);
        let seen = SeenId { expires: purge_at, digest };
        let stored = codec::seen(&event.id, &seen);
        self.changed.insert(stored.0, Some(stored.1));
        self.seen.insert(event.id.clone(), seen);
        self.expiring.entry(purge_at).or_default().push(event.id.clone());

        if self.watermark.is_none_or(|watermark| event.time > watermark) {
            self.watermark = Some(event.time);
            self.watermark_moved = true;
        }
        self.close_and_purge(aggregation, out)?;
        Ok(Verdict::Applied)
    }

    /// Closes the partition through `adopted`, a watermark of the job's
    /// other partitions, while it is idle: its FINALs and purges as if its
    /// effective watermark were that high. Its own watermark stays; a
    /// lower `adopted` changes nothing.
    pub fn close_idle<A: Aggregation>(
        &mut self,
        adopted: Timestamp,
        aggregation: &mut A,
        out: &mut Vec<PeriodRecord>,
    ) -> Result<(), A::Error> {
        if self.effective_watermark().is_some_and(|effective| effective >= adopted) {
            return Ok(());
        }
        self.idle_through = Some(adopted);
        let stored = codec::idle_through(adopted);
        self.changed.insert(stored.0, Some(stored.1));
        self.close_and_purge(aggregation, out)
    }

    /// The transaction's end: an ADJUSTMENT for each final period changed
    /// in it whose value moved, in (end, key) order.
    pub fn end_transaction<A: Aggregation>(
        &mut self,
        aggregation: &mut A,
        out: &mut Vec<PeriodRecord>,
    ) -> Result<(), A::Error> {
        for id in std::mem::take(&mut self.marked) {
            if let Some(period) = self.closed.get_mut(&id) {
                adjust(&id, period, aggregation, out, &mut self.dirty, &mut self.counts)?;
            }
        }
        Ok(())
    }

    /// The entries changed since the last call, to commit with the
    /// transaction (`None`: delete the entry).
    pub fn take_changes(&mut self) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        for id in std::mem::take(&mut self.dirty) {
            // A period purged since it changed is already a deletion.
            if let Some(period) = self.open.get(&id).or_else(|| self.closed.get(&id)) {
                let (key, value) = codec::period(&id, period);
                self.changed.insert(key, Some(value));
            }
        }
        if std::mem::take(&mut self.watermark_moved)
            && let Some(watermark) = self.watermark
        {
            let (key, value) = codec::watermark(watermark);
            self.changed.insert(key, Some(value));
        }
        std::mem::take(&mut self.changed).into_iter().collect()
    }

    /// Whether anything changed since the last
    /// [`PartitionPeriods::take_changes`] or is marked for an adjustment.
    /// (After an aborted transaction the host restores the partition from
    /// its committed entries instead.)
    pub fn is_dirty(&self) -> bool {
        !self.changed.is_empty()
            || !self.dirty.is_empty()
            || self.watermark_moved
            || !self.marked.is_empty()
    }

    /// Rule 5 and the purge, at the effective watermark.
    /// Whether a watermark raised to `time` would purge a seen id: an
    /// event that makes room for its own id is not refused for the room.
    fn would_purge_one(&self, time: Timestamp) -> bool {
        let effective = self.effective_watermark().map_or(time, |effective| effective.max(time));
        self.expiring.first_key_value().is_some_and(|(expires, _)| *expires <= effective)
    }

    fn close_and_purge<A: Aggregation>(
        &mut self,
        aggregation: &mut A,
        out: &mut Vec<PeriodRecord>,
    ) -> Result<(), A::Error> {
        let Some(effective) = self.effective_watermark() else { return Ok(()) };
        let grace = self.settings.grace;
        while let Some(entry) = self.open.first_entry() {
            if after(entry.key().0, grace) > effective {
                break;
            }
            let (id, mut period) = entry.remove_entry();
            let value = aggregation.value(&period.state)?;
            period.version = 1;
            period.value = value;
            out.push(record(&id, &period, None));
            self.counts.finals += 1;
            self.dirty.insert(id.clone());
            self.closed.insert(id, period);
        }
        let horizon = self.settings.horizon;
        while let Some(entry) = self.closed.first_entry() {
            if after(entry.key().0, horizon) > effective {
                break;
            }
            let (id, mut period) = entry.remove_entry();
            // A late event changed it in this transaction: its adjustment
            // goes out before it is forgotten.
            if self.marked.remove(&id) {
                adjust(&id, &mut period, aggregation, out, &mut self.dirty, &mut self.counts)?;
            }
            self.dirty.remove(&id);
            self.changed.insert(codec::period_key(&id), None);
        }
        while let Some(entry) = self.expiring.first_entry() {
            if *entry.key() > effective {
                break;
            }
            for id in entry.remove() {
                self.seen.remove(&id);
                self.changed.insert(codec::seen_key(&id), None);
            }
        }
        Ok(())
    }
}

/// Why `event`'s facts cannot be kept, if they cannot.
fn malformed(event: &EventFacts) -> Option<String> {
    if event.id.is_empty() || event.id.len() > MAX_EVENT_ID_BYTES {
        return Some(format!(
            "refused: an event id must be 1 to {MAX_EVENT_ID_BYTES} bytes, this one is {}",
            event.id.len()
        ));
    }
    let key_bytes: usize = event.key.iter().map(|(name, value)| name.len() + value.len()).sum();
    if event.key.len() > MAX_KEY_FIELDS || key_bytes > MAX_KEY_BYTES {
        return Some(format!(
            "refused: an aggregation key may have {MAX_KEY_FIELDS} fields of {MAX_KEY_BYTES} bytes in all, this one has {} of {key_bytes}",
            event.key.len()
        ));
    }
    None
}

/// Emits `period`'s next version if its value moved.
fn adjust<A: Aggregation>(
    id: &PeriodId,
    period: &mut PeriodState,
    aggregation: &mut A,
    out: &mut Vec<PeriodRecord>,
    dirty: &mut BTreeSet<PeriodId>,
    counts: &mut PeriodCounts,
) -> Result<(), A::Error> {
    let value = aggregation.value(&period.state)?;
    if value != period.value {
        let previous = period.value;
        period.version += 1;
        period.value = value;
        out.push(record(id, period, Some(previous)));
        counts.adjustments += 1;
        dirty.insert(id.clone());
    }
    Ok(())
}

fn record(id: &PeriodId, period: &PeriodState, previous: Option<u64>) -> PeriodRecord {
    PeriodRecord {
        key: id.1.clone(),
        period: Period { label: id.2.clone(), start: period.start, end: id.0 },
        time_zone: period.time_zone.clone(),
        value: period.value,
        version: period.version,
        previous,
    }
}

/// `at + length`, or the end of time.
fn after(at: Timestamp, length: SignedDuration) -> Timestamp {
    at.saturating_add(length).unwrap_or(Timestamp::MAX)
}

/// A duration as a job file writes it (`48h`, `35d`, `1500ms`).
fn friendly(length: SignedDuration) -> String {
    if length.subsec_nanos() != 0 {
        return format!("{}ms", length.as_millis());
    }
    match length.as_secs() {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}
