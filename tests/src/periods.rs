//! Billing-period input for the end-to-end tests, and a model of the
//! period rules written apart from the code under test: its own civil
//! calendar and its own table of the zones' UTC offsets (from the tz
//! database's rules for 2024–2027, written out by hand), no jiff.
//!
//! The model reads each partition's lines in order as `docs/periods.md`
//! says the host does, and says which FINAL each period gets, the value
//! its last version settles at, and which lines are dead letters, of
//! which kind.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use crate::Rng;

const HOUR: i64 = 3_600;
const DAY: i64 = 86_400;
/// The job's `[periods]` in these tests: the defaults.
pub const GRACE: i64 = DAY;
pub const HORIZON: i64 = 35 * DAY;

/// The zones the tests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    Utc,
    NewYork,
    LordHowe,
    Kathmandu,
    Adelaide,
    Havana,
}

impl Zone {
    pub fn name(self) -> &'static str {
        match self {
            Zone::Utc => "UTC",
            Zone::NewYork => "America/New_York",
            Zone::LordHowe => "Australia/Lord_Howe",
            Zone::Kathmandu => "Asia/Kathmandu",
            Zone::Adelaide => "Australia/Adelaide",
            Zone::Havana => "America/Havana",
        }
    }

    /// Seconds east of UTC at the instant `t`.
    pub fn offset_at(self, t: i64) -> i64 {
        let within =
            |ranges: &[(&str, &str)]| ranges.iter().any(|(from, to)| utc(from) <= t && t < utc(to));
        match self {
            Zone::Utc => 0,
            Zone::Kathmandu => 5 * HOUR + 45 * 60,
            // DST from the second Sunday of March at 02:00 to the first
            // Sunday of November at 02:00, local time.
            Zone::NewYork => {
                let dst = within(&[
                    ("2025-03-09T07:00:00", "2025-11-02T06:00:00"),
                    ("2026-03-08T07:00:00", "2026-11-01T06:00:00"),
                ]);
                if dst { -4 * HOUR } else { -5 * HOUR }
            }
            // +10:30, and +11:00 (a 30-minute DST) from the first Sunday of
            // October at 02:00 to the first Sunday of April at 02:00.
            Zone::LordHowe => {
                let dst = within(&[
                    ("2024-10-05T15:30:00", "2025-04-05T15:00:00"),
                    ("2025-10-04T15:30:00", "2026-04-04T15:00:00"),
                    ("2026-10-03T15:30:00", "2027-04-03T15:00:00"),
                ]);
                if dst { 11 * HOUR } else { 10 * HOUR + 30 * 60 }
            }
            // +9:30, and +10:30 from the first Sunday of October at 02:00
            // to the first Sunday of April at 03:00.
            Zone::Adelaide => {
                let dst = within(&[
                    ("2024-10-05T16:30:00", "2025-04-05T16:30:00"),
                    ("2025-10-04T16:30:00", "2026-04-04T16:30:00"),
                    ("2026-10-03T16:30:00", "2027-04-03T16:30:00"),
                ]);
                if dst { 10 * HOUR + 30 * 60 } else { 9 * HOUR + 30 * 60 }
            }
            // Cuba: DST from midnight of the second Sunday of March (a
            // skipped midnight); under tzdata 2026 it does not end on
            // 2026-11-01 (the next fall-back is 2027-11-07, a repeated
            // midnight).
            Zone::Havana => {
                let dst = within(&[
                    ("2025-03-09T05:00:00", "2025-11-02T05:00:00"),
                    ("2026-03-08T05:00:00", "2027-11-07T05:00:00"),
                ]);
                if dst { -4 * HOUR } else { -5 * HOUR }
            }
        }
    }

    /// The UTC instant of local midnight opening `year`-`month`-01 (no
    /// zone here changes its offset at that midnight).
    fn month_start(self, year: i64, month: i64) -> i64 {
        let local = days_from_civil(year, month, 1) * DAY;
        [self.offset_at(local - 11 * HOUR), self.offset_at(local + 11 * HOUR)]
            .into_iter()
            .find(|&offset| self.offset_at(local - offset) == offset)
            .map(|offset| local - offset)
            .expect("a month's first midnight exists")
    }

    /// The calendar month of the instant `t`: its label, start and end.
    pub fn month_of(self, t: i64) -> (String, i64, i64) {
        let local = t + self.offset_at(t);
        let (year, month, _) = civil_from_days(local.div_euclid(DAY));
        let (next_year, next_month) = if month == 12 { (year + 1, 1) } else { (year, month + 1) };
        (
            format!("{year:04}-{month:02}"),
            self.month_start(year, month),
            self.month_start(next_year, next_month),
        )
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date of a day count since 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `2026-03-08T05:00:00` (UTC) as seconds since 1970.
pub fn utc(text: &str) -> i64 {
    let number = |range: std::ops::Range<usize>| text[range].parse::<i64>().unwrap();
    days_from_civil(number(0..4), number(5..7), number(8..10)) * DAY
        + number(11..13) * HOUR
        + number(14..16) * 60
        + number(17..19)
}

/// `t` as RFC 3339 at `offset` seconds east of UTC.
pub fn rfc3339(t: i64, offset: i64) -> String {
    let local = t + offset;
    let (year, month, day) = civil_from_days(local.div_euclid(DAY));
    let second = local.rem_euclid(DAY);
    let mut text = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        second / HOUR,
        second % HOUR / 60,
        second % 60
    );
    if offset == 0 {
        text.push('Z');
    } else {
        let sign = if offset < 0 { '-' } else { '+' };
        let offset = offset.abs();
        write!(text, "{sign}{:02}:{:02}", offset / HOUR, offset % HOUR / 60).unwrap();
    }
    text
}

/// The meters of the tests' `[plugin_config]`.
pub const PLUGIN_CONFIG: &str = r#"meters = { calls = "sum", requests = "count", peak_gb = "max", storage_gb = "latest", seats = { unique_count = "user" } }"#;
const METRICS: [&str; 5] = ["calls", "requests", "peak_gb", "storage_gb", "seats"];

/// The customers: their zone and the partition (file) their events go to.
pub const CUSTOMERS: [(&str, Zone, usize); 7] = [
    ("acme", Zone::NewYork, 0),
    ("umbrella", Zone::Adelaide, 0),
    ("globex", Zone::LordHowe, 1),
    ("pied", Zone::Havana, 1),
    ("initech", Zone::Kathmandu, 2),
    // The partition that goes idle in March and must close its months
    // by the others' watermarks.
    ("hooli", Zone::Utc, 3),
    // The partition empty from the start, that receives records later.
    ("wayne", Zone::Utc, 4),
];

/// The `time_zones` table of the job (hooli and wayne get the default).
pub fn time_zones_table() -> String {
    let zones: Vec<String> = CUSTOMERS
        .iter()
        .filter(|(_, zone, _)| *zone != Zone::Utc)
        .map(|(customer, zone, _)| format!("{customer} = {:?}", zone.name()))
        .collect();
    format!("{{ {} }}", zones.join(", "))
}

fn zone_of(customer: &str) -> Zone {
    CUSTOMERS.iter().find(|(name, _, _)| *name == customer).map_or(Zone::Utc, |c| c.1)
}

/// One generated line.
#[derive(Debug, Clone)]
pub struct PeriodLine {
    pub line: String,
    pub facts: Option<Facts>,
}

/// What a well-formed line says.
#[derive(Debug, Clone)]
pub struct Facts {
    pub id: String,
    pub time: i64,
    pub customer: String,
    pub metric: String,
    pub quantity: u64,
    pub user: String,
}

/// Generated input: the lines of partitions 0 to 4 (4 empty: `later`
/// holds what it receives after the first run).
pub struct PeriodInput {
    pub partitions: Vec<Vec<PeriodLine>>,
    pub later: Vec<PeriodLine>,
}

/// `per_partition` lines in each of partitions 0 to 2, across Dec 2025 to
/// Nov 2026, with duplicates, conflicts, late, too-old, future and
/// malformed lines; partition 3 stops in March; partition 4's lines come
/// later (February's).
pub fn generate(seed: u64, per_partition: usize) -> PeriodInput {
    let mut rng = Rng::new(seed);
    let mut partitions = vec![Vec::new(); 5];
    let spans = [
        (0, utc("2025-12-01T00:00:00"), utc("2026-11-25T00:00:00"), per_partition),
        (1, utc("2025-12-01T00:00:00"), utc("2026-11-25T00:00:00"), per_partition),
        (2, utc("2025-12-01T00:00:00"), utc("2026-11-25T00:00:00"), per_partition),
        (3, utc("2026-01-01T00:00:00"), utc("2026-03-20T00:00:00"), per_partition / 6),
    ];
    for (partition, from, to, count) in spans {
        partitions[partition] = lines(&mut rng, partition, from, to, count);
    }
    let later = lines(
        &mut rng,
        4,
        utc("2026-02-01T00:00:00"),
        utc("2026-02-27T00:00:00"),
        per_partition / 10,
    );
    PeriodInput { partitions, later }
}

fn lines(rng: &mut Rng, partition: usize, from: i64, to: i64, count: usize) -> Vec<PeriodLine> {
    let customers: Vec<&str> = CUSTOMERS.iter().filter(|c| c.2 == partition).map(|c| c.0).collect();
    let mut out: Vec<PeriodLine> = Vec::with_capacity(count);
    let step = (to - from) / count.max(1) as i64;
    for n in 0..count {
        // Whole minutes: events of one minute tie for `latest`.
        let base = (from + step * n as i64) / 60 * 60;
        let roll = rng.below(1000);
        let earlier = (!out.is_empty()).then(|| rng.below(out.len() as u64) as usize);
        let line = match (roll, earlier) {
            // A retry: the same line again.
            (0..=19, Some(at)) => out[at].clone(),
            // A conflicting retry: an earlier id with another quantity.
            (20..=29, Some(at)) if out[at].facts.is_some() => {
                let mut facts = out[at].facts.clone().unwrap();
                facts.quantity += 1 + rng.below(5);
                render(rng, facts)
            }
            _ => {
                let customer = customers[rng.below(customers.len() as u64) as usize];
                let time = match roll {
                    // Late by up to three days: around a period's grace.
                    30..=59 => base - rng.below(3 * DAY as u64) as i64,
                    // Late by up to a month: after its FINAL, within the horizon.
                    60..=69 => base - rng.below(30) as i64 * DAY - rng.below(DAY as u64) as i64,
                    70..=74 => base - 120 * DAY,
                    75..=79 => utc("2099-01-01T00:00:00") + rng.below(DAY as u64) as i64,
                    _ => base + rng.below(120) as i64 * 60,
                };
                let facts = Facts {
                    id: format!("p{partition}-{n}"),
                    time,
                    customer: customer.to_string(),
                    metric: METRICS[rng.below(METRICS.len() as u64) as usize].to_string(),
                    quantity: rng.below(1000),
                    user: ["ana", "Zoë", "bo\\\"b", "日本", "eve"][rng.below(5) as usize]
                        .to_string(),
                };
                if (80..=84).contains(&roll) {
                    PeriodLine {
                        line: format!(
                            r#"{{"id":"p{partition}-{n}","customer":"{customer}","metric":"calls","quantity":-1,"ts":"{}"}}"#,
                            rfc3339(time, 0)
                        ),
                        facts: None,
                    }
                } else {
                    render(rng, facts)
                }
            }
        };
        out.push(line);
    }
    out
}

fn render(rng: &mut Rng, facts: Facts) -> PeriodLine {
    // Half the times in the customer's own offset.
    let offset = if rng.below(2) == 0 { 0 } else { zone_of(&facts.customer).offset_at(facts.time) };
    let line = format!(
        r#"{{"id":"{}","customer":"{}","metric":"{}","quantity":{},"ts":"{}","user":"{}"}}"#,
        facts.id,
        facts.customer,
        facts.metric,
        facts.quantity,
        rfc3339(facts.time, offset),
        facts.user
    );
    PeriodLine { line, facts: Some(facts) }
}

/// A period in the model: (end, customer, metric, label).
pub type PeriodId = (i64, String, String, String);

/// What the model says a run produces.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Expected {
    /// Each period that gets a FINAL: its start, zone, FINAL value and the
    /// value its last version settles at.
    pub finals: BTreeMap<PeriodId, ExpectedPeriod>,
    /// Each dead-lettered line, by (partition, line): its reason's kind.
    pub dead_letters: BTreeMap<(usize, u64), String>,
}

/// One closed period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedPeriod {
    pub start: i64,
    pub zone: &'static str,
    pub final_value: u64,
    pub settled_value: u64,
}

#[derive(Debug, Clone)]
enum MeterState {
    Sum(u64),
    Count(u64),
    Max(u64),
    Latest(i64, u64),
    Unique(BTreeSet<String>),
}

impl MeterState {
    fn new(facts: &Facts) -> MeterState {
        match facts.metric.as_str() {
            "calls" => MeterState::Sum(facts.quantity),
            "requests" => MeterState::Count(1),
            "peak_gb" => MeterState::Max(facts.quantity),
            "storage_gb" => MeterState::Latest(facts.time, facts.quantity),
            _ => MeterState::Unique(BTreeSet::from([unescape(&facts.user)])),
        }
    }

    fn add(&mut self, facts: &Facts) {
        match self {
            MeterState::Sum(sum) => *sum += facts.quantity,
            MeterState::Count(count) => *count += 1,
            MeterState::Max(max) => *max = (*max).max(facts.quantity),
            MeterState::Latest(time, value) => {
                if facts.time > *time {
                    *time = facts.time;
                    *value = facts.quantity;
                }
            }
            MeterState::Unique(seen) => {
                seen.insert(unescape(&facts.user));
            }
        }
    }

    fn value(&self) -> u64 {
        match self {
            MeterState::Sum(v) | MeterState::Count(v) | MeterState::Max(v) => *v,
            MeterState::Latest(_, v) => *v,
            MeterState::Unique(seen) => seen.len() as u64,
        }
    }
}

fn unescape(user: &str) -> String {
    user.replace("\\\"", "\"")
}

#[derive(Default)]
struct ModelPartition {
    watermark: Option<i64>,
    idle_through: Option<i64>,
    open: BTreeMap<PeriodId, (i64, MeterState)>,
    closed: BTreeMap<PeriodId, (i64, MeterState)>,
    seen: HashMap<String, (i64, String)>,
}

impl ModelPartition {
    fn effective(&self) -> Option<i64> {
        self.watermark.max(self.idle_through)
    }

    fn close(&mut self, expected: &mut Expected) {
        let Some(effective) = self.effective() else { return };
        let closing: Vec<PeriodId> =
            self.open.keys().filter(|id| id.0 + GRACE <= effective).cloned().collect();
        for id in closing {
            let (start, state) = self.open.remove(&id).unwrap();
            let zone = zone_of(&id.1).name();
            let value = state.value();
            expected.finals.insert(
                id.clone(),
                ExpectedPeriod { start, zone, final_value: value, settled_value: value },
            );
            self.closed.insert(id, (start, state));
        }
        self.closed.retain(|id, _| id.0 + HORIZON > effective);
        self.seen.retain(|_, (expires, _)| *expires > effective);
    }
}

/// What the host must make of `runs` (each a list of (partition, line)
/// in read order per partition; each run ends with every partition idle).
pub fn expect(runs: &[Vec<(usize, u64, &PeriodLine)>]) -> Expected {
    let mut expected = Expected::default();
    let mut partitions: BTreeMap<usize, ModelPartition> = BTreeMap::new();
    for run in runs {
        for &(partition, offset, line) in run {
            let state = partitions.entry(partition).or_default();
            let mut dead = |kind: &str| {
                expected.dead_letters.insert((partition, offset), kind.to_string());
            };
            let Some(facts) = &line.facts else {
                dead("malformed");
                continue;
            };
            if facts.time > utc("2098-01-01T00:00:00") {
                dead("future");
                continue;
            }
            let (label, start, end) = zone_of(&facts.customer).month_of(facts.time);
            if state.effective().is_some_and(|effective| effective >= end + HORIZON) {
                dead("too_old");
                continue;
            }
            if let Some((_, first)) = state.seen.get(&facts.id) {
                dead(if *first == line.line { "duplicate" } else { "duplicate_conflict" });
                continue;
            }
            let id: PeriodId = (end, facts.customer.clone(), facts.metric.clone(), label);
            if let Some((_, meter)) = state.closed.get_mut(&id) {
                meter.add(facts);
                expected.finals.get_mut(&id).unwrap().settled_value = meter.value();
            } else {
                match state.open.get_mut(&id) {
                    Some((_, meter)) => meter.add(facts),
                    None => {
                        state.open.insert(id, (start, MeterState::new(facts)));
                    }
                }
            }
            state.seen.insert(facts.id.clone(), (end + HORIZON, line.line.clone()));
            state.watermark = Some(state.watermark.map_or(facts.time, |w| w.max(facts.time)));
            state.close(&mut expected);
        }
        // The run read everything: every partition is idle, and adopts the
        // lowest own watermark among the others.
        let watermarks: Vec<(usize, i64)> =
            partitions.iter().filter_map(|(p, s)| s.watermark.map(|w| (*p, w))).collect();
        for (partition, state) in &mut partitions {
            let adopted =
                watermarks.iter().filter(|(other, _)| other != partition).map(|(_, w)| *w).min();
            if let Some(adopted) = adopted
                && state.effective().is_none_or(|effective| effective < adopted)
            {
                state.idle_through = Some(adopted);
                state.close(&mut expected);
            }
        }
    }
    expected
}
