//! The period rules of one input partition, applied record by record in
//! offset order (Flink's window operator with an event-time clock, and
//! Kafka Streams' `onWindowClose`, for calendar periods):
//!
//! 1. an event time past its arrival plus `max_future` is a dead letter
//!    (`future:`), and the watermark does not move;
//! 2. an event whose period ended `horizon` or more before the effective
//!    watermark, or whose period may be forgotten already (under a shorter
//!    horizon of an earlier run), is a dead letter (`too_old:`);
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
//! A batch of events is offered whole ([`PartitionPeriods::offer_all`]):
//! the rules decide each event in order as if the aggregation accepts it,
//! and the aggregation folds the accepted events into their periods in one
//! call ([`Aggregation::add`]), before any period's value is needed. Should
//! it refuse one, what the batch did is undone and its events are offered
//! one at a time: the verdicts and records are those of one event at a
//! time, whatever the batch.
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
/// Longest customer (whose time zone decides an event's period), in bytes.
pub const MAX_CUSTOMER_BYTES: usize = 1024;

/// The fields of an aggregation key, in the plugin's order: they lead a
/// period record and name it, with the period's label.
pub type AggregationKey = Vec<(String, String)>;

/// One event to add to a period, in a call of [`Aggregation::add`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addition {
    /// The period's index in the call's states.
    pub period: usize,
    /// The event's time.
    pub time: Timestamp,
    /// The event's index in the offered batch ([`PartitionPeriods::offer_all`]).
    pub event: usize,
}

/// What a call of [`Aggregation::add`] gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Folded {
    /// Each period's state after its additions, in the order of the call's
    /// states.
    States(Vec<Vec<u8>>),
    /// The first addition refused (its index in the call), and why:
    /// nothing else of the call counts.
    Refused {
        /// Index of the refused addition.
        addition: usize,
        /// The reason, for the event's dead letter.
        reason: String,
    },
}

/// How events change a period's state, and the period's value: the
/// plugin's part.
pub trait Aggregation {
    /// A failed call (a trap): the transaction cannot go on.
    type Error: std::fmt::Display;

    /// Folds `additions`, in order, into the periods whose states are
    /// `states` (`None`: the period has no event yet): each addition's
    /// event changes the state of its period. The states after the fold,
    /// or the first addition refused. A `tentative` call (a batch tried
    /// whole) may refuse for any reason of the caller's (a failure, a
    /// state over a limit) and should count nothing against the plugin:
    /// the rules then offer the events one at a time, each in a call that
    /// is not tentative.
    fn add(
        &mut self,
        states: &[Option<&[u8]>],
        additions: &[Addition],
        tentative: bool,
    ) -> Result<Folded, Self::Error>;

    /// The value of a period whose state is `state`.
    fn value(&mut self, state: &[u8]) -> Result<u64, Self::Error>;
}

/// An event offered to a partition's rules.
#[derive(Debug, Clone, Copy)]
pub struct Offer<'a> {
    /// What the plugin said of it.
    pub facts: &'a EventFacts,
    /// Its bytes (their digest tells a conflicting retry apart).
    pub payload: &'a [u8],
    /// When it reached the host.
    pub arrival: Timestamp,
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

/// The first 8 bytes of a seen event's payload's SHA-256: a retry with
/// another payload is told apart (either way it is not applied).
pub(crate) type PayloadDigest = [u8; 8];

/// What the committed entries hold of the ids of the periods that end at
/// one instant: how many chunks, holding the first how many of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct StoredIds {
    chunks: u64,
    ids: usize,
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
    /// The latest period end whose state and ids may have been purged:
    /// events of periods ending then or before are too old, whatever the
    /// horizon is now (a longer one must not open a forgotten period anew).
    forgotten_through: Option<Timestamp>,
    /// Periods not yet final.
    open: BTreeMap<PeriodId, PeriodState>,
    /// Final periods, kept for adjustments until the horizon.
    closed: BTreeMap<PeriodId, PeriodState>,
    /// Final periods changed in this transaction.
    marked: BTreeSet<PeriodId>,
    /// Seen ids; a randomly seeded hash keeps crafted ids from colliding.
    seen: HashMap<SeenId, PayloadDigest, foldhash::fast::RandomState>,
    /// Seen ids by their period's end (they are purged with it, once the
    /// effective watermark reaches that end plus the horizon), in the order
    /// they were remembered.
    ids_by_end: BTreeMap<Timestamp, Vec<SeenId>>,
    /// How much of each end's ids the committed entries hold: the ids
    /// after those are stored by the next `take_changes`.
    stored_ids: BTreeMap<Timestamp, StoredIds>,
    /// Periods changed since the last [`PartitionPeriods::take_changes`],
    /// encoded there: once per transaction, not once per event.
    dirty: BTreeSet<PeriodId>,
    /// Whether the watermark moved since the last `take_changes`.
    watermark_moved: bool,
    /// Whether `forgotten_through` moved since the last `take_changes`.
    forgotten_moved: bool,
    /// Other entries changed since the last `take_changes` (deleted
    /// periods, the idle watermark).
    changed: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    counts: PeriodCounts,
    /// While a batch is tried whole: how to undo it.
    journal: Option<Journal>,
    /// While a batch is tried whole: the additions not folded yet.
    window: Window,
}

/// What a batch tried whole changed, to undo it should the aggregation
/// refuse one of its events: the partition's small parts as they were,
/// the periods it touched as they were, and its changes to the seen ids
/// and marks in order.
#[derive(Debug, Clone)]
struct Journal {
    watermark: Option<Timestamp>,
    idle_through: Option<Timestamp>,
    forgotten_through: Option<Timestamp>,
    watermark_moved: bool,
    forgotten_moved: bool,
    counts: PeriodCounts,
    dirty: BTreeSet<PeriodId>,
    changed: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Each touched period as it was: (open, closed).
    periods: hashbrown::HashMap<PeriodId, (Option<PeriodState>, Option<PeriodState>)>,
    log: Vec<Undo>,
}

/// A seen event id: one copy in memory, shared by the map of seen ids and
/// the index by period end.
type SeenId = std::sync::Arc<str>;

/// One change to the seen ids or marks, undone in reverse order.
#[derive(Debug, Clone)]
enum Undo {
    /// An id was remembered, last under this period end.
    Seen(Timestamp),
    /// The ids of the periods ending then were forgotten, and their stored
    /// chunks.
    Purged(Timestamp, Vec<(SeenId, Option<PayloadDigest>)>, Option<StoredIds>),
    /// A period was marked for an adjustment.
    Marked(PeriodId),
    /// A period's mark was taken away.
    Unmarked(PeriodId),
}

/// Additions not folded yet: the periods they go to (with each one's state
/// before the first of them) and the additions, in order.
#[derive(Debug, Clone, Default)]
struct Window {
    slots: hashbrown::HashMap<PeriodId, usize>,
    periods: Vec<(PeriodId, Option<Vec<u8>>)>,
    additions: Vec<Addition>,
}

/// A period named by borrowed parts, to look it up among [`PeriodId`]s
/// without copying an event's key: it hashes as the tuple does.
#[derive(Hash)]
struct PeriodRef<'a>(Timestamp, &'a [(String, String)], &'a str);

impl hashbrown::Equivalent<PeriodId> for PeriodRef<'_> {
    fn equivalent(&self, id: &PeriodId) -> bool {
        self.0 == id.0 && self.1 == id.1.as_slice() && self.2 == id.2
    }
}

/// Why the rules stopped short: the aggregation failed, or a batch tried
/// whole must be offered one event at a time.
enum Stop<E> {
    Failed(E),
    OneByOne,
}

impl<E> From<E> for Stop<E> {
    fn from(err: E) -> Stop<E> {
        Stop::Failed(err)
    }
}

impl PartitionPeriods {
    /// An empty partition under `settings`.
    pub fn new(settings: std::sync::Arc<PeriodSettings>) -> PartitionPeriods {
        PartitionPeriods {
            settings,
            watermark: None,
            idle_through: None,
            forgotten_through: None,
            open: BTreeMap::new(),
            closed: BTreeMap::new(),
            marked: BTreeSet::new(),
            seen: HashMap::default(),
            ids_by_end: BTreeMap::new(),
            stored_ids: BTreeMap::new(),
            dirty: BTreeSet::new(),
            watermark_moved: false,
            forgotten_moved: false,
            changed: BTreeMap::new(),
            counts: PeriodCounts::default(),
            journal: None,
            window: Window::default(),
        }
    }

    /// The partition as its committed `entries` (from
    /// [`PartitionPeriods::take_changes`]) left it.
    pub fn restore(
        settings: std::sync::Arc<PeriodSettings>,
        entries: impl IntoIterator<Item = Entry>,
    ) -> Result<PartitionPeriods, codec::Damaged> {
        let mut partition = PartitionPeriods::new(settings);
        // Each period end's chunks and the highest one's number: they must be
        // numbered 0 to n, or a purge would leave some behind.
        let mut highest_chunk: BTreeMap<Timestamp, u64> = BTreeMap::new();
        let mut first_format = Vec::new();
        for (key, value) in entries {
            match codec::decode(&key, &value)? {
                Stored::Watermark(at) => partition.watermark = Some(at),
                Stored::IdleThrough(at) => partition.idle_through = Some(at),
                Stored::ForgottenThrough(at) => partition.forgotten_through = Some(at),
                Stored::Period(id, period) => {
                    let into = if period.version == 0 {
                        &mut partition.open
                    } else {
                        &mut partition.closed
                    };
                    into.insert(id, period);
                }
                Stored::SeenIds { period_end, chunk, ids } => {
                    let stored = partition.stored_ids.entry(period_end).or_default();
                    stored.chunks += 1;
                    stored.ids += ids.len();
                    let highest = highest_chunk.entry(period_end).or_default();
                    *highest = (*highest).max(chunk);
                    let ids_by_end = partition.ids_by_end.entry(period_end).or_default();
                    for (id, digest) in ids {
                        let id = SeenId::from(id);
                        ids_by_end.push(id.clone());
                        partition.seen.insert(id, digest);
                    }
                }
                Stored::SeenId { id, period_end, digest } => {
                    first_format.push((key, id, period_end, digest));
                }
            }
        }
        // Ids in the first format, an entry each, follow their end's
        // chunks as ids not stored yet: the next commit writes them into a
        // chunk and deletes their entries.
        for (key, id, period_end, digest) in first_format {
            let id = SeenId::from(id);
            partition.changed.insert(key, None);
            partition.ids_by_end.entry(period_end).or_default().push(id.clone());
            partition.seen.insert(id, digest);
        }
        for (period_end, stored) in &partition.stored_ids {
            let highest = highest_chunk.get(period_end).copied().unwrap_or_default();
            if highest.checked_add(1) != Some(stored.chunks) {
                return Err(codec::Damaged {
                    key: codec::seen_ids_key(*period_end, highest),
                    what: "the chunks of seen ids of one period end, which are numbered from 0 without a gap",
                });
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
        let offer = Offer { facts: event, payload, arrival };
        exact(self.offer_one(0, &offer, aggregation, out))
    }

    /// Applies a batch of events, in order, as [`PartitionPeriods::offer`]
    /// one at a time would, appending the FINAL records they close to
    /// `out`; what became of each, in order. The batch is tried whole
    /// first (see the module), so the aggregation is called once per
    /// batch rather than once per event, unless it refuses an event. An
    /// `Err` is the aggregation's failure: the partition is left as
    /// before the batch, and the transaction cannot go on.
    pub fn offer_all<A: Aggregation>(
        &mut self,
        offers: &[Offer<'_>],
        aggregation: &mut A,
        out: &mut Vec<PeriodRecord>,
    ) -> Result<Vec<Offered>, A::Error> {
        if offers.len() > 1 {
            let mark = out.len();
            self.begin_whole();
            let tried = self.offer_each(offers, aggregation, out).and_then(|offered| {
                self.flush(aggregation)?;
                Ok(offered)
            });
            match tried {
                Ok(offered) => {
                    self.journal = None;
                    return Ok(offered);
                }
                Err(Stop::Failed(err)) => {
                    self.undo();
                    out.truncate(mark);
                    return Err(err);
                }
                Err(Stop::OneByOne) => {
                    self.undo();
                    out.truncate(mark);
                }
            }
        }
        exact(self.offer_each(offers, aggregation, out))
    }

    fn offer_each<A: Aggregation>(
        &mut self,
        offers: &[Offer<'_>],
        aggregation: &mut A,
        out: &mut Vec<PeriodRecord>,
    ) -> Result<Vec<Offered>, Stop<A::Error>> {
        let mut offered = Vec::with_capacity(offers.len());
        for (index, offer) in offers.iter().enumerate() {
            let before = out.len();
            let verdict = self.offer_one(index, offer, aggregation, out)?;
            offered.push(Offered { verdict, records: out.len() - before });
        }
        Ok(offered)
    }

    /// Rules 1 to 5 for the batch's event `index`: its addition folded
    /// now, or, while a batch is tried whole, later.
    fn offer_one<A: Aggregation>(
        &mut self,
        index: usize,
        offer: &Offer<'_>,
        aggregation: &mut A,
        out: &mut Vec<PeriodRecord>,
    ) -> Result<Verdict, Stop<A::Error>> {
        let (event, arrival) = (offer.facts, offer.arrival);
        if let Some(refusal) = refusal_of_facts(event) {
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
        // Computed for each event: where a zone's clocks went back across
        // midnight, an instant inside one period's range can belong to the
        // period before it (its local date says so), so a period found for
        // one event is no answer for the next.
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
        if let Some(forgotten) = self.forgotten_through
            && period.end <= forgotten
        {
            self.counts.too_old += 1;
            return Ok(Verdict::DeadLetter(format!(
                "too_old: its period {} ({}) ended at {}, when this partition's periods may be forgotten already (through {forgotten}, under a shorter periods.horizon than {} of an earlier run)",
                period.label,
                zone.name(),
                period.end,
                friendly(settings.horizon)
            )));
        }
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
        let digest = codec::payload_digest(offer.payload);
        if let Some(seen) = self.seen.get(event.id.as_str()) {
            return Ok(Verdict::DeadLetter(if *seen == digest {
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
        // While a batch is tried whole, a period it added to since the last
        // fold is touched, dirty and marked already: its next addition only
        // joins the fold.
        if self.journal.is_some()
            && let Some(&slot) =
                self.window.slots.get(&PeriodRef(period.end, &event.key, &period.label))
        {
            self.window.additions.push(Addition { period: slot, time: event.time, event: index });
            self.remember(event, period.end, digest);
            return self.applied(event.time, aggregation, out);
        }
        let id: PeriodId = (period.end, event.key.clone(), period.label.clone());
        let is_final = !self.open.contains_key(&id) && self.closed.contains_key(&id);
        let addition = Addition { period: 0, time: event.time, event: index };
        let added = if self.journal.is_some() {
            let slot = match self.window.slots.get(&id) {
                Some(&slot) => slot,
                None => {
                    // The batch's first addition to it since the last fold:
                    // kept as it was, if the batch has not touched it yet.
                    self.touch(&id);
                    let held = self.open.get(&id).or_else(|| self.closed.get(&id));
                    let held = held.map(|period| period.state.clone());
                    let slot = self.window.periods.len();
                    self.window.periods.push((id.clone(), held));
                    self.window.slots.insert(id.clone(), slot);
                    slot
                }
            };
            self.window.additions.push(Addition { period: slot, ..addition });
            // Folded before anything reads it (a value, the batch's end).
            None
        } else {
            let held = self.open.get(&id).or_else(|| self.closed.get(&id));
            let held = held.map(|period| period.state.as_slice());
            match aggregation.add(&[held], &[addition], false)? {
                Folded::States(mut states) if states.len() == 1 => states.pop(),
                Folded::States(states) => {
                    return Ok(Verdict::DeadLetter(format!(
                        "refused: the plugin gave {} states for one period",
                        states.len()
                    )));
                }
                Folded::Refused { reason, .. } => {
                    return Ok(Verdict::DeadLetter(format!("refused: {reason}")));
                }
            }
        };
        let entry = if is_final {
            self.mark(&id);
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
        if let Some(state) = added {
            entry.state = state;
        }
        self.dirty.insert(id);
        self.remember(event, period.end, digest);
        self.applied(event.time, aggregation, out)
    }

    /// Remembers an applied event's id, with the period that ends at
    /// `period_end`.
    fn remember(&mut self, event: &EventFacts, period_end: Timestamp, digest: PayloadDigest) {
        let id = SeenId::from(event.id.as_str());
        self.seen.insert(id.clone(), digest);
        self.ids_by_end.entry(period_end).or_default().push(id);
        if let Some(journal) = &mut self.journal {
            journal.log.push(Undo::Seen(period_end));
        }
    }

    /// Rule 5 after an event at `time` is applied.
    fn applied<A: Aggregation>(
        &mut self,
        time: Timestamp,
        aggregation: &mut A,
        out: &mut Vec<PeriodRecord>,
    ) -> Result<Verdict, Stop<A::Error>> {
        if self.watermark.is_none_or(|watermark| time > watermark) {
            self.watermark = Some(time);
            self.watermark_moved = true;
        }
        self.close_and_purge(aggregation, out)?;
        Ok(Verdict::Applied)
    }

    /// Starts trying a batch whole: what it changes is journaled.
    fn begin_whole(&mut self) {
        self.window = Window::default();
        self.journal = Some(Journal {
            watermark: self.watermark,
            idle_through: self.idle_through,
            forgotten_through: self.forgotten_through,
            watermark_moved: self.watermark_moved,
            forgotten_moved: self.forgotten_moved,
            counts: self.counts,
            dirty: self.dirty.clone(),
            changed: self.changed.clone(),
            periods: hashbrown::HashMap::new(),
            log: Vec::new(),
        });
    }

    /// Keeps period `id` as it is now in the journal, if one is kept and
    /// does not hold it yet.
    fn touch(&mut self, id: &PeriodId) {
        if let Some(journal) = &mut self.journal
            && !journal.periods.contains_key(id)
        {
            let before = (self.open.get(id).cloned(), self.closed.get(id).cloned());
            journal.periods.insert(id.clone(), before);
        }
    }

    /// Marks period `id` for an adjustment.
    fn mark(&mut self, id: &PeriodId) {
        if self.marked.insert(id.clone())
            && let Some(journal) = &mut self.journal
        {
            journal.log.push(Undo::Marked(id.clone()));
        }
    }

    /// Undoes the batch tried whole: the partition is as it was before.
    fn undo(&mut self) {
        self.window = Window::default();
        let Some(journal) = self.journal.take() else { return };
        for undo in journal.log.into_iter().rev() {
            match undo {
                Undo::Seen(period_end) => {
                    if let Some(ids) = self.ids_by_end.get_mut(&period_end) {
                        if let Some(id) = ids.pop() {
                            self.seen.remove(&id);
                        }
                        if ids.is_empty() {
                            self.ids_by_end.remove(&period_end);
                        }
                    }
                }
                Undo::Purged(period_end, forgotten, stored) => {
                    let mut ids = Vec::with_capacity(forgotten.len());
                    for (id, digest) in forgotten {
                        if let Some(digest) = digest {
                            self.seen.insert(id.clone(), digest);
                        }
                        ids.push(id);
                    }
                    self.ids_by_end.insert(period_end, ids);
                    if let Some(stored) = stored {
                        self.stored_ids.insert(period_end, stored);
                    }
                }
                Undo::Marked(id) => {
                    self.marked.remove(&id);
                }
                Undo::Unmarked(id) => {
                    self.marked.insert(id);
                }
            }
        }
        for (id, (open, closed)) in journal.periods {
            match open {
                Some(period) => self.open.insert(id.clone(), period),
                None => self.open.remove(&id),
            };
            match closed {
                Some(period) => self.closed.insert(id, period),
                None => self.closed.remove(&id),
            };
        }
        self.watermark = journal.watermark;
        self.idle_through = journal.idle_through;
        self.forgotten_through = journal.forgotten_through;
        self.watermark_moved = journal.watermark_moved;
        self.forgotten_moved = journal.forgotten_moved;
        self.counts = journal.counts;
        self.dirty = journal.dirty;
        self.changed = journal.changed;
    }

    /// Folds the additions not folded yet into their periods, in one call;
    /// a refusal (or an answer of the wrong shape) sends the batch back to
    /// be offered one event at a time.
    fn flush<A: Aggregation>(&mut self, aggregation: &mut A) -> Result<(), Stop<A::Error>> {
        let window = std::mem::take(&mut self.window);
        if window.additions.is_empty() {
            return Ok(());
        }
        let states: Vec<Option<&[u8]>> =
            window.periods.iter().map(|(_, held)| held.as_deref()).collect();
        let Folded::States(folded) = aggregation.add(&states, &window.additions, true)? else {
            return Err(Stop::OneByOne);
        };
        if folded.len() != window.periods.len() {
            return Err(Stop::OneByOne);
        }
        for ((id, _), state) in window.periods.into_iter().zip(folded) {
            let held = match self.open.get_mut(&id) {
                Some(period) => period,
                None => self.closed.get_mut(&id).ok_or(Stop::OneByOne)?,
            };
            held.state = state;
        }
        Ok(())
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
            // Nothing to adopt; but what is due under the settings now (a
            // shorter grace or horizon since the last run) closes still.
            return exact(self.close_and_purge(aggregation, out));
        }
        self.idle_through = Some(adopted);
        let stored = codec::idle_through(adopted);
        self.changed.insert(stored.0, Some(stored.1));
        exact(self.close_and_purge(aggregation, out))
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
        if std::mem::take(&mut self.forgotten_moved)
            && let Some(through) = self.forgotten_through
        {
            let (key, value) = codec::forgotten_through(through);
            self.changed.insert(key, Some(value));
        }
        for (period_end, ids) in &self.ids_by_end {
            let stored = self.stored_ids.get(period_end).copied().unwrap_or_default();
            if ids.len() <= stored.ids {
                continue;
            }
            let fresh =
                ids[stored.ids..].iter().filter_map(|id| Some((&**id, *self.seen.get(id)?)));
            let chunks = codec::seen_ids(*period_end, stored.chunks, fresh);
            let stored = StoredIds { chunks: stored.chunks + chunks.len() as u64, ids: ids.len() };
            self.stored_ids.insert(*period_end, stored);
            self.changed.extend(chunks.into_iter().map(|(key, value)| (key, Some(value))));
        }
        std::mem::take(&mut self.changed).into_iter().collect()
    }

    /// Whether ids were remembered that the committed entries do not hold.
    fn has_unstored_ids(&self) -> bool {
        self.ids_by_end.iter().any(|(period_end, ids)| {
            ids.len() > self.stored_ids.get(period_end).map_or(0, |stored| stored.ids)
        })
    }

    /// Whether anything changed since the last
    /// [`PartitionPeriods::take_changes`] or is marked for an adjustment.
    /// (After an aborted transaction the host restores the partition from
    /// its committed entries instead.)
    pub fn is_dirty(&self) -> bool {
        !self.changed.is_empty()
            || self.has_unstored_ids()
            || !self.dirty.is_empty()
            || self.watermark_moved
            || self.forgotten_moved
            || !self.marked.is_empty()
    }

    /// Rule 5 and the purge, at the effective watermark.
    /// Whether a watermark raised to `time` would purge a seen id: an
    /// event that makes room for its own id is not refused for the room.
    fn would_purge_one(&self, time: Timestamp) -> bool {
        let effective = self.effective_watermark().map_or(time, |effective| effective.max(time));
        let horizon = self.settings.horizon;
        self.ids_by_end
            .first_key_value()
            .is_some_and(|(period_end, _)| after(*period_end, horizon) <= effective)
    }

    fn close_and_purge<A: Aggregation>(
        &mut self,
        aggregation: &mut A,
        out: &mut Vec<PeriodRecord>,
    ) -> Result<(), Stop<A::Error>> {
        let Some(effective) = self.effective_watermark() else { return Ok(()) };
        let grace = self.settings.grace;
        let horizon = self.settings.horizon;
        let closes =
            self.open.first_key_value().is_some_and(|(id, _)| after(id.0, grace) <= effective);
        let forgets =
            self.closed.first_key_value().is_some_and(|(id, _)| after(id.0, horizon) <= effective);
        if closes || forgets {
            // A value is read: what the batch added must be in it.
            self.flush(aggregation)?;
        }
        while let Some((id, _)) = self.open.first_key_value() {
            if after(id.0, grace) > effective {
                break;
            }
            let id = id.clone();
            self.touch(&id);
            let Some(mut period) = self.open.remove(&id) else { break };
            let value = aggregation.value(&period.state)?;
            period.version = 1;
            period.value = value;
            out.push(record(&id, &period, None));
            self.counts.finals += 1;
            self.dirty.insert(id.clone());
            self.closed.insert(id, period);
        }
        while let Some((id, _)) = self.closed.first_key_value() {
            if after(id.0, horizon) > effective {
                break;
            }
            let id = id.clone();
            self.touch(&id);
            let Some(mut period) = self.closed.remove(&id) else { break };
            // A late event changed it in this transaction: its adjustment
            // goes out before it is forgotten.
            if self.marked.remove(&id) {
                if let Some(journal) = &mut self.journal {
                    journal.log.push(Undo::Unmarked(id.clone()));
                }
                adjust(&id, &mut period, aggregation, out, &mut self.dirty, &mut self.counts)?;
            }
            self.dirty.remove(&id);
            self.changed.insert(codec::period_key(&id), None);
        }
        while let Some(entry) = self.ids_by_end.first_entry() {
            if after(*entry.key(), horizon) > effective {
                break;
            }
            let (period_end, ids) = entry.remove_entry();
            let mut forgotten = Vec::new();
            for id in ids {
                let digest = self.seen.remove(&id);
                if self.journal.is_some() {
                    forgotten.push((id, digest));
                }
            }
            // Ids remembered since the last commit were never stored.
            let stored = self.stored_ids.remove(&period_end);
            for chunk in 0..stored.map_or(0, |stored| stored.chunks) {
                self.changed.insert(codec::seen_ids_key(period_end, chunk), None);
            }
            if let Some(journal) = &mut self.journal {
                journal.log.push(Undo::Purged(period_end, forgotten, stored));
            }
        }
        // Whatever ends at or before `effective - horizon` is gone now (or,
        // in a store from before this line was kept, may be): a longer
        // horizon later must not open such a period anew.
        let line = effective.saturating_sub(horizon).unwrap_or(Timestamp::MIN);
        if self.forgotten_through.is_none_or(|through| through < line) {
            self.forgotten_through = Some(line);
            self.forgotten_moved = true;
        }
        Ok(())
    }
}

/// What became of one event of a batch offered whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offered {
    /// Whether it counted.
    pub verdict: Verdict,
    /// How many records it closed, appended in order to the batch's.
    pub records: usize,
}

/// The result of rules that fold every addition at once (never a batch
/// tried whole, which alone defers its additions).
fn exact<T, E>(result: Result<T, Stop<E>>) -> Result<T, E> {
    match result {
        Ok(value) => Ok(value),
        Err(Stop::Failed(err)) => Err(err),
        Err(Stop::OneByOne) => unreachable!("only a batch tried whole defers its additions"),
    }
}

/// The fields the host writes in every period record's key or value: an
/// aggregation key field may not take one of their names.
pub const RESERVED_KEY_FIELDS: &[&str] = &[
    "type",
    "period",
    "time_zone",
    "start",
    "end",
    "value",
    "version",
    "previous",
    "delta",
    "tzdata",
];

/// Why a plugin's description of an event is refused before any rule
/// reads it (an id, key or customer past its bound), if it is.
pub fn refusal_of_facts(event: &EventFacts) -> Option<String> {
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
    for (index, (name, _)) in event.key.iter().enumerate() {
        if RESERVED_KEY_FIELDS.contains(&name.as_str()) {
            return Some(format!(
                "refused: an aggregation key field may not be named {:?}: the host writes that field of every period record (the reserved names: {})",
                name,
                RESERVED_KEY_FIELDS.join(", ")
            ));
        }
        if event.key[..index].iter().any(|(earlier, _)| earlier == name) {
            return Some(format!(
                "refused: the aggregation key names field {:?} twice; each field once",
                name
            ));
        }
    }
    if event.customer.len() > MAX_CUSTOMER_BYTES {
        return Some(format!(
            "refused: a customer may have at most {MAX_CUSTOMER_BYTES} bytes, this one has {}",
            event.customer.len()
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
