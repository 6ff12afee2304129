//! `tally promote`: a version becomes the job's live version, and each
//! delivery of the job switches with it without billing anyone twice (see
//! `docs/versions.md`).
//!
//! Two files carry a promotion, each written whole (a temporary file
//! renamed into place) so a kill leaves the old one or the new one:
//! - the job's **live pointer** (`<state_dir>/live-version.json`): which
//!   version `tally run` runs, and where its outputs stood when it became
//!   live;
//! - per delivery, its **switch** (`<delivery state_dir>/switch.json`):
//!   the corrections the receiver gets first (one ADJUSTMENT per period
//!   whose delivered value the new version changes; the new version's
//!   records of keys never delivered), where the new version's output is
//!   read from after them, and by how much the versions of each already
//!   billed period shift, so the receiver's version numbers go on.
//!
//! The switches are written before the pointer: a promotion killed
//! halfway has not happened, and running it again computes the same
//! switches (the same corrections, under the same idempotency keys).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tally_deliver::ledger::{Entry, Outcome};
use tally_deliver::{Line, Payload, Positions, Source, SourceError};

use crate::config::{JobConfig, Mode};
use crate::diff::{Record, counted_value, delta};
use crate::versions::Version;

/// The job's live version, when a promotion made one other than v1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Live {
    /// The live version (`v2`).
    pub version: String,
    /// The version that was live before.
    pub from: String,
    /// When it became live (RFC 3339).
    pub promoted_at: String,
    /// Per output, where the version's committed output ended then.
    pub outputs: BTreeMap<String, Positions>,
}

/// Where `job` keeps its live pointer: in v1's state directory.
pub fn live_path(job: &JobConfig) -> PathBuf {
    let state_dir = match &job.mode {
        Mode::Local(local) => &local.state_dir,
        Mode::Kafka(kafka) => &kafka.state_dir,
    };
    state_dir.join("live-version.json")
}

/// The job's live pointer, if a promotion wrote one.
pub fn live(job: &JobConfig) -> anyhow::Result<Option<Live>> {
    let path = live_path(job);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
            format!("the live pointer `{}` is damaged; promote a version again", path.display())
        })?)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("reading `{}`", path.display())),
    }
}

/// The job's live version: the live pointer's, or v1.
pub fn live_version(job: &JobConfig) -> anyhow::Result<Version> {
    match live(job)? {
        Some(live) => Ok(Version::parse(&live.version)?),
        None => Ok(Version::LIVE),
    }
}

/// A delivery's switch from one version's output to another's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Switch {
    /// The version delivered before.
    pub from: String,
    /// The version delivered after.
    pub to: String,
    /// Where `to`'s output is read from once the corrections are delivered.
    pub positions: Positions,
    /// Per key already billed (canonical JSON), what to add to the
    /// `version` of `to`'s later period records of it.
    pub shifts: BTreeMap<String, i64>,
    /// What the receiver gets first, in order.
    pub corrections: Vec<Correction>,
    /// Whether the delivery finished the switch: its corrections are
    /// settled and it reads `to` from `positions` on.
    #[serde(default)]
    pub done: bool,
}

/// The partition number under which a delivery's ledger keeps its
/// switch's corrections (no output has that many partitions).
pub const CORRECTIONS_PARTITION: u32 = u32::MAX;

impl Switch {
    /// The version the delivery reads: `to` once the switch is done.
    pub fn reading(&self) -> &str {
        if self.done { &self.to } else { &self.from }
    }
}

/// One record the receiver gets at a switch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Correction {
    /// Its key.
    pub key: Value,
    /// Its value.
    pub value: Value,
    /// Its idempotency key.
    pub idempotency_key: String,
}

/// Where a delivery keeps its switch.
pub fn switch_path(delivery_state: &Path) -> PathBuf {
    delivery_state.join("switch.json")
}

/// A delivery's switch, if a promotion wrote one.
pub fn read_switch(delivery_state: &Path) -> anyhow::Result<Option<Switch>> {
    let path = switch_path(delivery_state);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
            format!("the delivery's switch `{}` is damaged; promote again", path.display())
        })?)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("reading `{}`", path.display())),
    }
}

/// Writes `value` as JSON to `path` whole: a temporary file, synced, then
/// renamed into place.
pub fn write_whole(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating `{}`", dir.display()))?;
    let mut file = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a file in `{}`", dir.display()))?;
    serde_json::to_writer_pretty(&mut file, value)?;
    file.as_file().sync_all()?;
    file.persist(path).with_context(|| format!("writing `{}`", path.display()))?;
    if let Ok(dir) = std::fs::File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// What a delivery's ledger says of the records it read.
pub struct Delivered {
    /// Per partition, the offset before which every record is settled.
    pub positions: Positions,
    /// Entries by idempotency key.
    pub entries: HashMap<String, Entry>,
    /// Idempotency keys of the records dead-lettered.
    pub dead_letters: HashSet<String>,
}

impl Delivered {
    /// Whether the receiver applied `record`: its entry says delivered, or
    /// the position passed it (its entry pruned) and it was not refused.
    fn applied(&self, record: &Record) -> bool {
        let Some(key) = &record.idempotency_key else { return false };
        match self.entries.get(key) {
            Some(entry) => entry.outcome == Outcome::Delivered,
            None => {
                self.positions.get(&record.partition).is_some_and(|next| record.offset < *next)
                    && !self.dead_letters.contains(key)
            }
        }
    }
}

/// The receiver's view of one key: its last applied record.
struct Billed {
    value: Value,
}

/// The `version` of a period record (FINAL or ADJUSTMENT), if it is one.
fn period_version(value: &Value) -> Option<i64> {
    let kind = value.get("type").and_then(Value::as_str)?;
    matches!(kind, "final" | "adjustment").then(|| value.get("version")?.as_i64())?
}

/// Computes a delivery's switch from version `from` to version `to`.
///
/// `earlier`: the switch that made `from` the delivered version, if one
/// did (its corrections were delivered, and `from`'s records before its
/// positions never were). `old`: `from`'s records in output order;
/// `delivered`: what the ledger says of them. `new`: `to`'s records up to
/// `positions`, where its output is read from after the switch.
pub fn plan_switch(
    (from, to): (&str, &str),
    earlier: Option<&Switch>,
    old: &[Record],
    delivered: &Delivered,
    new: &[Record],
    positions: Positions,
) -> Switch {
    // The receiver's view, key by key.
    let mut billed: HashMap<String, Billed> = HashMap::new();
    let mut old_shifts = &BTreeMap::new();
    let mut old_start = Positions::new();
    if let Some(earlier) = earlier {
        for correction in &earlier.corrections {
            billed.insert(correction.key.to_string(), Billed { value: correction.value.clone() });
        }
        old_shifts = &earlier.shifts;
        old_start = earlier.positions.clone();
    }
    for record in old {
        let read_before =
            old_start.get(&record.partition).is_some_and(|start| record.offset < *start);
        if read_before || !delivered.applied(record) {
            continue;
        }
        let key = record.key.to_string();
        let mut value = record.value.clone();
        shift_version(&mut value, old_shifts.get(&key).copied().unwrap_or(0));
        billed.insert(key, Billed { value });
    }

    let mut last_of: HashMap<String, usize> = HashMap::new();
    for (index, record) in new.iter().enumerate() {
        last_of.insert(record.key.to_string(), index);
    }
    let mut switch = Switch {
        from: from.to_string(),
        to: to.to_string(),
        positions,
        shifts: BTreeMap::new(),
        corrections: Vec::new(),
        done: false,
    };
    for (index, record) in new.iter().enumerate() {
        let key = record.key.to_string();
        let idempotency_key = record.idempotency_key.clone().unwrap_or_default();
        let Some(billed) = billed.get(&key) else {
            // Never billed: the receiver gets the new version's records of it.
            switch.corrections.push(Correction {
                key: record.key.clone(),
                value: record.value.clone(),
                idempotency_key,
            });
            continue;
        };
        if last_of[&key] != index {
            continue;
        }
        let (billed_version, new_version) =
            (period_version(&billed.value), period_version(&record.value));
        let same = counted_value(billed.value.clone()) == counted_value(record.value.clone());
        match (billed_version, new_version) {
            (Some(billed_version), Some(new_version)) => {
                let next = if same { billed_version } else { billed_version + 1 };
                if next != new_version {
                    switch.shifts.insert(key.clone(), next - new_version);
                }
                if !same {
                    let mut adjustment = record.value.clone();
                    let previous = billed.value.get("value").cloned().unwrap_or(Value::Null);
                    let now = record.value.get("value").cloned().unwrap_or(Value::Null);
                    adjustment["type"] = "adjustment".into();
                    adjustment["delta"] = delta(&previous, &now).unwrap_or(Value::Null);
                    adjustment["previous"] = previous;
                    adjustment["version"] = next.into();
                    switch.corrections.push(Correction {
                        key: record.key.clone(),
                        value: adjustment,
                        idempotency_key: format!("{idempotency_key}/promoted-from-{from}"),
                    });
                }
            }
            // Not a period record (a running total): the latest one, whole.
            _ if !same => switch.corrections.push(Correction {
                key: record.key.clone(),
                value: record.value.clone(),
                idempotency_key,
            }),
            _ => {}
        }
    }
    switch
}

/// Adds `shift` to a period record's `version`.
pub fn shift_version(value: &mut Value, shift: i64) {
    if shift == 0 {
        return;
    }
    if let Some(version) = period_version(value) {
        value["version"] = (version + shift).into();
    }
}

/// A switch's corrections as a committed output of one partition
/// ([`CORRECTIONS_PARTITION`]): offset `i` is the `i`-th correction.
pub struct Corrections {
    lines: Vec<Vec<u8>>,
    next: usize,
}

impl Corrections {
    /// The corrections of `switch`, as output lines.
    pub fn new(switch: &Switch) -> Corrections {
        let lines = switch
            .corrections
            .iter()
            .map(|correction| {
                serde_json::to_vec(&serde_json::json!({
                    "key": correction.key,
                    "value": correction.value,
                    "idempotency_key": correction.idempotency_key,
                }))
                .expect("JSON serializes")
            })
            .collect();
        Corrections { lines, next: 0 }
    }
}

impl Source for Corrections {
    fn start(&mut self, positions: &Positions) -> Result<(), SourceError> {
        let start = positions.get(&CORRECTIONS_PARTITION).map_or(0, |next| *next as usize);
        self.next = start.min(self.lines.len());
        Ok(())
    }

    fn read(&mut self, max: usize) -> Result<Vec<Line>, SourceError> {
        let end = (self.next + max).min(self.lines.len());
        let lines = (self.next..end)
            .map(|offset| Line {
                partition: CORRECTIONS_PARTITION,
                offset: offset as u64,
                next: offset as u64 + 1,
                payload: Payload::Json(self.lines[offset].clone()),
            })
            .collect();
        self.next = end;
        Ok(lines)
    }

    fn caught_up(&self) -> bool {
        self.next == self.lines.len()
    }
}

/// The new version's output after a switch, its period records' versions
/// shifted where the switch says (the receiver's numbering goes on).
pub struct Shifted<'a> {
    /// The output.
    pub inner: &'a mut dyn Source,
    /// Per key (canonical JSON), the shift.
    pub shifts: &'a BTreeMap<String, i64>,
}

impl Source for Shifted<'_> {
    fn start(&mut self, positions: &Positions) -> Result<(), SourceError> {
        self.inner.start(positions)
    }

    fn read(&mut self, max: usize) -> Result<Vec<Line>, SourceError> {
        let mut lines = self.inner.read(max)?;
        if self.shifts.is_empty() {
            return Ok(lines);
        }
        for line in &mut lines {
            match &mut line.payload {
                Payload::Json(bytes) => {
                    let Ok(mut record) = serde_json::from_slice::<Value>(bytes) else { continue };
                    let Some(&shift) = self.shifts.get(&record["key"].to_string()) else {
                        continue;
                    };
                    shift_version(&mut record["value"], shift);
                    *bytes = serde_json::to_vec(&record).expect("JSON serializes");
                }
                Payload::Kafka(record) => {
                    let key = record
                        .key
                        .as_deref()
                        .and_then(|key| serde_json::from_slice::<Value>(key).ok());
                    let Some(&shift) = key.and_then(|key| self.shifts.get(&key.to_string())) else {
                        continue;
                    };
                    let Some(mut value) = record
                        .value
                        .as_deref()
                        .and_then(|value| serde_json::from_slice::<Value>(value).ok())
                    else {
                        continue;
                    };
                    shift_version(&mut value, shift);
                    record.value = Some(serde_json::to_vec(&value).expect("JSON serializes"));
                }
                Payload::TooLong(_) => {}
            }
        }
        Ok(lines)
    }

    fn caught_up(&self) -> bool {
        self.inner.caught_up()
    }
}

/// Refuses a promotion while a record of the delivery may have reached
/// the receiver without being settled: its outcome decides what the
/// receiver was billed.
pub fn check_settled(delivered: &Delivered, file: &Path) -> anyhow::Result<()> {
    let unsettled: Vec<&String> = delivered
        .entries
        .iter()
        .filter(|(_, entry)| {
            matches!(entry.outcome, Outcome::Sending | Outcome::Retrying | Outcome::Unknown)
        })
        .map(|(key, _)| key)
        .take(3)
        .collect();
    if !unsettled.is_empty() {
        bail!(
            "delivery `{}` has records that may have reached the receiver and are not settled (first: {}); the \
             promotion must know what was billed: run `tally deliver --until-caught-up {}` (and `tally deliver resolve` \
             for those waiting as unknown), then promote",
            file.display(),
            unsettled.iter().map(|key| format!("{key:?}")).collect::<Vec<_>>().join(", "),
            file.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(customer: &str) -> Value {
        json!({"customer": customer, "metric": "calls", "period": "2026-11"})
    }

    fn period(kind: &str, value: i64, version: i64) -> Value {
        json!({"type": kind, "customer": "x", "value": value, "version": version})
    }

    fn record(offset: u64, customer: &str, value: Value, id: &str) -> Record {
        Record {
            partition: 0,
            offset,
            key: key(customer),
            value,
            idempotency_key: Some(id.to_string()),
        }
    }

    fn all_delivered() -> Delivered {
        Delivered {
            positions: Positions::from([(0, u64::MAX)]),
            entries: HashMap::new(),
            dead_letters: HashSet::new(),
        }
    }

    #[test]
    fn a_changed_period_gets_one_adjustment_from_the_billed_value_and_an_unchanged_one_nothing() {
        let old = vec![
            record(0, "acme", period("final", 5120, 1), "v1/acme/1"),
            record(1, "globex", period("final", 7, 1), "v1/globex/1"),
            record(2, "globex", period("adjustment", 9, 2), "v1/globex/2"),
            record(3, "initech", period("final", 3, 1), "v1/initech/1"),
        ];
        let new = vec![
            record(0, "acme", period("final", 310, 1), "v2/acme/1"),
            record(1, "globex", period("final", 9, 1), "v2/globex/1"),
            record(2, "umbrella", period("final", 4, 1), "v2/umbrella/1"),
        ];
        let switch = plan_switch(
            ("v1", "v2"),
            None,
            &old,
            &all_delivered(),
            &new,
            Positions::from([(0, 3)]),
        );
        assert_eq!(switch.corrections.len(), 2, "{switch:#?}");
        let acme = &switch.corrections[0];
        assert_eq!(acme.key, key("acme"));
        assert_eq!(acme.idempotency_key, "v2/acme/1/promoted-from-v1");
        assert_eq!(
            (
                &acme.value["type"],
                &acme.value["value"],
                &acme.value["previous"],
                &acme.value["delta"],
                &acme.value["version"]
            ),
            (&json!("adjustment"), &json!(310), &json!(5120), &json!(-4810), &json!(2))
        );
        assert_eq!(
            switch.corrections[1].idempotency_key, "v2/umbrella/1",
            "never billed: as it is"
        );
        // acme: billed 1, corrected to 2, v2's next is 2: +1; globex: equal
        // at billed version 2, v2's next is 2: +1.
        assert_eq!(
            switch.shifts,
            BTreeMap::from([(key("acme").to_string(), 1), (key("globex").to_string(), 1)])
        );
    }

    #[test]
    fn only_what_the_receiver_applied_counts_as_billed() {
        let old = vec![
            record(0, "acme", period("final", 5, 1), "v1/acme/1"),
            record(1, "globex", period("final", 6, 1), "v1/globex/1"),
            record(2, "initech", period("final", 7, 1), "v1/initech/1"),
        ];
        let delivered = Delivered {
            positions: Positions::from([(0, 2)]),
            entries: HashMap::new(),
            dead_letters: HashSet::from(["v1/globex/1".to_string()]),
        };
        let new = vec![
            record(0, "acme", period("final", 5, 1), "v2/acme/1"),
            record(1, "globex", period("final", 6, 1), "v2/globex/1"),
            record(2, "initech", period("final", 7, 1), "v2/initech/1"),
        ];
        let switch = plan_switch(("v1", "v2"), None, &old, &delivered, &new, Positions::new());
        let sent: Vec<&str> =
            switch.corrections.iter().map(|c| c.idempotency_key.as_str()).collect();
        assert_eq!(
            sent,
            ["v2/globex/1", "v2/initech/1"],
            "dead-lettered and unread: sent as they are"
        );
    }

    #[test]
    fn a_second_promotion_starts_from_what_the_first_delivered() {
        let first = Switch {
            from: "v1".into(),
            to: "v2".into(),
            positions: Positions::from([(0, 1)]),
            shifts: BTreeMap::from([(key("acme").to_string(), 1)]),
            corrections: vec![Correction {
                key: key("acme"),
                value: period("adjustment", 310, 2),
                idempotency_key: "v2/acme/1/promoted-from-v1".into(),
            }],
            done: true,
        };
        // v2 went on after the switch: its ADJUSTMENT version 2 was
        // delivered as version 3.
        let old = vec![
            record(0, "acme", period("final", 310, 1), "v2/acme/1"),
            record(1, "acme", period("adjustment", 320, 2), "v2/acme/2"),
        ];
        let new = vec![record(0, "acme", period("final", 330, 1), "v3/acme/1")];
        let switch =
            plan_switch(("v2", "v3"), Some(&first), &old, &all_delivered(), &new, Positions::new());
        let acme = &switch.corrections[0];
        assert_eq!((&acme.value["previous"], &acme.value["version"]), (&json!(320), &json!(4)));
        assert_eq!(switch.shifts[&key("acme").to_string()], 3);
    }

    #[test]
    fn shifted_lines_carry_the_receivers_version() {
        let switch = Switch {
            from: "v1".into(),
            to: "v2".into(),
            positions: Positions::new(),
            shifts: BTreeMap::from([(key("acme").to_string(), 2)]),
            corrections: vec![Correction {
                key: key("acme"),
                value: period("adjustment", 1, 3),
                idempotency_key: "k".into(),
            }],
            done: false,
        };
        let mut inner = Corrections::new(&switch);
        let mut shifted = Shifted { inner: &mut inner, shifts: &switch.shifts };
        shifted.start(&Positions::new()).unwrap();
        let lines = shifted.read(10).unwrap();
        let Payload::Json(bytes) = &lines[0].payload else { panic!("a JSON line") };
        let line: Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(line["value"]["version"], 5);
        assert!(shifted.caught_up());
    }
}
