//! `tally promote`: a version becomes the job's live version, and each
//! delivery of the job switches with it without billing anyone twice (see
//! `docs/versions.md`).
//!
//! Two files carry a promotion, each written whole (a temporary file
//! renamed into place) so a kill leaves the old one or the new one:
//! - the job's **live pointer** (`<state_dir>/live-version.json`): which
//!   version `tally run` runs, and where its outputs stood when it became
//!   live;
//! - per delivery, its **switch**: the corrections the receiver gets
//!   first (one ADJUSTMENT per period whose delivered value the new
//!   version changes; the new version's records of keys never delivered),
//!   where the new version's output is read from after them, how each
//!   billed period's later records are rebased so the receiver's version
//!   numbers go on, and the receiver's view after it (where a next
//!   promotion starts). A promotion writes it as `switch-next.json`; the
//!   deliverer acts on it only once the live pointer names its version,
//!   and renames it `switch.json` when its corrections are settled.
//!
//! The next switches are written before the pointer: a promotion killed
//! halfway has not happened (the deliverer goes on with `switch.json`),
//! and running it again computes the same switches (the same corrections,
//! under the same idempotency keys).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tally_deliver::ledger::{Entry, Outcome};
use tally_deliver::{Line, Payload, Positions, Source, SourceError};

use crate::config::{JobConfig, Mode};
use crate::diff::{Record, counted_value, delta, value_size};
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
    read_written(&live_path(job), "the live pointer")
}

/// What [`write_whole`] wrote at `path` (`what` names it), if anything.
fn read_written<T: serde::de::DeserializeOwned>(
    path: &Path,
    what: &str,
) -> anyhow::Result<Option<T>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
            format!("{what} `{}` is damaged; promote the version again", path.display())
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
    /// This delivery's promotions so far, this one included (in the
    /// corrections' idempotency keys: no key is reused across promotions).
    pub number: u32,
    /// The version delivered before.
    pub from: String,
    /// The version delivered after.
    pub to: String,
    /// Where `to`'s output is read from once the corrections are delivered.
    pub positions: Positions,
    /// Per key already billed (canonical JSON), how `to`'s later records
    /// of it are rebased.
    pub rebase: BTreeMap<String, Rebase>,
    /// The receiver's view once the corrections are delivered: per key,
    /// the last record it has.
    pub billed: BTreeMap<String, Value>,
    /// What the receiver gets first, in order.
    pub corrections: Vec<Correction>,
}

/// How the new version's later records of a billed period reach the
/// receiver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rebase {
    /// Added to each record's `version`.
    pub shift: i64,
    /// For a period the new version had not written at the promotion: the
    /// billed value. Its FINAL goes out as an ADJUSTMENT from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Value>,
}

/// The partition number under which a delivery's ledger keeps its
/// switch's corrections (no output has that many partitions).
pub const CORRECTIONS_PARTITION: u32 = u32::MAX;

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

/// Where a delivery keeps the switch it made last.
pub fn switch_path(delivery_state: &Path) -> PathBuf {
    delivery_state.join("switch.json")
}

/// Where a promotion leaves a delivery's next switch.
pub fn next_switch_path(delivery_state: &Path) -> PathBuf {
    delivery_state.join("switch-next.json")
}

/// The switch a delivery made last, if it made one.
pub fn read_switch(delivery_state: &Path) -> anyhow::Result<Option<Switch>> {
    read_written(&switch_path(delivery_state), "the delivery's switch")
}

/// The switch a promotion left for a delivery, if one did.
pub fn read_next_switch(delivery_state: &Path) -> anyhow::Result<Option<Switch>> {
    read_written(&next_switch_path(delivery_state), "the delivery's next switch")
}

/// The version a delivery reads: its last switch's, or v1.
pub fn reading(delivery_state: &Path) -> anyhow::Result<String> {
    Ok(read_switch(delivery_state)?.map_or_else(|| "v1".to_string(), |switch| switch.to))
}

/// Makes a delivery's next switch its current one (once its corrections
/// are settled).
pub fn finish_switch(delivery_state: &Path) -> anyhow::Result<()> {
    let (next, current) = (next_switch_path(delivery_state), switch_path(delivery_state));
    std::fs::rename(&next, &current)
        .with_context(|| format!("renaming `{}` to `{}`", next.display(), current.display()))?;
    if let Ok(dir) = std::fs::File::open(delivery_state) {
        let _ = dir.sync_all();
    }
    Ok(())
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

/// The `version` of a period record (FINAL or ADJUSTMENT), if it is one.
fn period_version(value: &Value) -> Option<i64> {
    let kind = value.get("type").and_then(Value::as_str)?;
    matches!(kind, "final" | "adjustment").then(|| value.get("version")?.as_i64())?
}

/// Keys a switch's planning holds at most (the receiver's view, the new
/// version's last record of each, the corrections): a promotion past it is
/// refused, and says so.
pub const MAX_SWITCH_KEYS: usize = 2_000_000;
/// Bytes of records a switch's planning holds at most (about).
pub const MAX_SWITCH_BYTES: usize = 512 << 20;

/// A switch too large to plan within its limits ([`MAX_SWITCH_KEYS`] and
/// [`MAX_SWITCH_BYTES`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "the switch from {from} to {to} would hold more than {max_keys} keys or {max_bytes} bytes of records (MAX_SWITCH_KEYS, MAX_SWITCH_BYTES): this output has too many keys to promote in one step"
)]
pub struct SwitchTooLarge {
    from: String,
    to: String,
    max_keys: usize,
    max_bytes: usize,
}

/// Plans a delivery's switch from version `from` to version `to` from the
/// records of both, read one at a time, `from`'s first: it holds one record
/// per key and the corrections, never an output whole.
pub struct SwitchPlanner<'a> {
    from: String,
    to: String,
    earlier: Option<&'a Switch>,
    delivered: &'a Delivered,
    /// The receiver's view, key by key: its last record.
    billed: BTreeMap<String, Value>,
    /// `to`'s records of keys never billed, each with its place in `to`'s
    /// output: they go out as they are.
    never_billed: Vec<(usize, Correction)>,
    /// `to`'s last record of each billed key, with its place.
    last_billed: HashMap<String, (usize, Record)>,
    /// `to`'s records seen so far.
    read: usize,
    /// Bytes held (about).
    bytes: usize,
    /// The most keys and bytes it may hold.
    limits: (usize, usize),
}

impl<'a> SwitchPlanner<'a> {
    /// A planner. `earlier`: the switch that made `from` the delivered
    /// version, if one did (the receiver's view then, and how `from`'s
    /// later records were rebased; `from`'s records before its positions
    /// never reached the receiver). `delivered`: what the ledger says of
    /// `from`'s records.
    pub fn new(
        (from, to): (&str, &str),
        earlier: Option<&'a Switch>,
        delivered: &'a Delivered,
    ) -> SwitchPlanner<'a> {
        let billed = earlier.map(|earlier| earlier.billed.clone()).unwrap_or_default();
        let bytes = billed.iter().map(|(key, value)| key.len() + value_size(value)).sum();
        SwitchPlanner {
            from: from.to_string(),
            to: to.to_string(),
            earlier,
            delivered,
            billed,
            never_billed: Vec::new(),
            last_billed: HashMap::new(),
            read: 0,
            bytes,
            limits: (MAX_SWITCH_KEYS, MAX_SWITCH_BYTES),
        }
    }

    /// The same planner, holding at most `max_keys` keys and `max_bytes`
    /// bytes.
    pub fn with_limits(self, max_keys: usize, max_bytes: usize) -> SwitchPlanner<'a> {
        SwitchPlanner { limits: (max_keys, max_bytes), ..self }
    }

    /// Takes `from`'s next record (in output order).
    pub fn old(&mut self, record: Record) -> Result<(), SwitchTooLarge> {
        let (rebase, start) = match self.earlier {
            Some(earlier) => {
                (earlier.rebase.get(&record.key.to_string()), Some(&earlier.positions))
            }
            None => (None, None),
        };
        let before = start
            .and_then(|start| start.get(&record.partition))
            .is_some_and(|start| record.offset < *start);
        if before || !self.delivered.applied(&record) {
            return Ok(());
        }
        let key = record.key.to_string();
        let mut value = record.value;
        if let Some(rebase) = rebase {
            rebase.apply(&mut value);
        }
        let (key_bytes, value_bytes) = (key.len(), value_size(&value));
        self.bytes += value_bytes;
        match self.billed.insert(key, value) {
            Some(replaced) => self.bytes -= value_size(&replaced),
            None => self.bytes += key_bytes,
        }
        self.check()
    }

    /// Takes `to`'s next record (in output order), once `from`'s are all
    /// taken.
    pub fn new_record(&mut self, record: Record) -> Result<(), SwitchTooLarge> {
        let index = self.read;
        self.read += 1;
        let key = record.key.to_string();
        if self.billed.contains_key(&key) {
            let (key_bytes, value_bytes) = (key.len(), value_size(&record.value));
            self.bytes += value_bytes;
            match self.last_billed.insert(key, (index, record)) {
                Some((_, replaced)) => self.bytes -= value_size(&replaced.value),
                None => self.bytes += key_bytes,
            }
        } else {
            // Never billed: the receiver gets the new version's records of it.
            self.bytes += value_size(&record.key) + value_size(&record.value);
            self.never_billed.push((
                index,
                Correction {
                    key: record.key,
                    value: record.value,
                    idempotency_key: record.idempotency_key.unwrap_or_default(),
                },
            ));
        }
        self.check()
    }

    fn check(&self) -> Result<(), SwitchTooLarge> {
        let keys = self.billed.len() + self.last_billed.len() + self.never_billed.len();
        let (max_keys, max_bytes) = self.limits;
        if keys > max_keys || self.bytes > max_bytes {
            return Err(SwitchTooLarge {
                from: self.from.clone(),
                to: self.to.clone(),
                max_keys,
                max_bytes,
            });
        }
        Ok(())
    }

    /// The switch, with `to`'s output read from `positions` after it.
    pub fn finish(self, positions: Positions) -> Switch {
        let number = self.earlier.map_or(1, |earlier| earlier.number + 1);
        let billed = self.billed;
        let mut after = billed.clone();
        let mut corrections = self.never_billed;
        for (_, correction) in &corrections {
            after.insert(correction.key.to_string(), correction.value.clone());
        }
        let mut rebase = BTreeMap::new();
        let written: HashSet<String> = self.last_billed.keys().cloned().collect();
        let mut last_billed: Vec<(String, (usize, Record))> =
            self.last_billed.into_iter().collect();
        last_billed.sort_by_key(|(_, (index, _))| *index);
        for (key, (index, record)) in last_billed {
            let billed = &billed[&key];
            let idempotency_key = record.idempotency_key.clone().unwrap_or_default();
            let same = counted_value(billed.clone()) == counted_value(record.value.clone());
            match (period_version(billed), period_version(&record.value)) {
                (Some(billed_version), Some(new_version)) => {
                    let next = if same { billed_version } else { billed_version + 1 };
                    if next != new_version {
                        rebase.insert(
                            key.clone(),
                            Rebase { shift: next - new_version, previous: None },
                        );
                    }
                    if !same {
                        let mut adjustment = record.value;
                        let previous = billed.get("value").cloned().unwrap_or(Value::Null);
                        adjust(&mut adjustment, previous, next);
                        after.insert(key, adjustment.clone());
                        corrections.push((
                            index,
                            Correction {
                                key: record.key,
                                value: adjustment,
                                idempotency_key: format!("{idempotency_key}/promotion-{number}"),
                            },
                        ));
                    }
                }
                // Not a period record (a running total): the latest one, whole.
                _ if !same => {
                    after.insert(key, record.value.clone());
                    corrections.push((
                        index,
                        Correction { key: record.key, value: record.value, idempotency_key },
                    ));
                }
                _ => {}
            }
        }
        // Periods billed that the new version had not written yet: its FINAL,
        // when it comes, goes out as an ADJUSTMENT from the billed value.
        for (key, value) in &billed {
            if written.contains(key) {
                continue;
            }
            if let Some(billed_version) = period_version(value) {
                let previous = value.get("value").cloned().unwrap_or(Value::Null);
                rebase.insert(
                    key.clone(),
                    Rebase { shift: billed_version, previous: Some(previous) },
                );
            }
        }
        // The corrections go out in the new version's output order.
        corrections.sort_by_key(|(index, _)| *index);
        Switch {
            number,
            from: self.from,
            to: self.to,
            positions,
            rebase,
            billed: after,
            corrections: corrections.into_iter().map(|(_, correction)| correction).collect(),
        }
    }
}

/// Makes period record `value` an ADJUSTMENT from `previous` at `version`.
fn adjust(value: &mut Value, previous: Value, version: i64) {
    let now = value.get("value").cloned().unwrap_or(Value::Null);
    value["type"] = "adjustment".into();
    value["delta"] = delta(&previous, &now).unwrap_or(Value::Null);
    value["previous"] = previous;
    value["version"] = version.into();
}

impl Rebase {
    /// Rebases one of the new version's records of the key.
    pub fn apply(&self, value: &mut Value) {
        let Some(version) = period_version(value) else { return };
        let is_final = value.get("type").and_then(Value::as_str) == Some("final");
        match &self.previous {
            Some(previous) if is_final => adjust(value, previous.clone(), version + self.shift),
            _ => value["version"] = (version + self.shift).into(),
        }
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

impl Corrections {
    /// Its records, as a target reads them (each record's body its value).
    pub fn records(&self) -> anyhow::Result<Vec<tally_deliver::record::OutputRecord>> {
        self.lines
            .iter()
            .enumerate()
            .map(|(offset, line)| {
                tally_deliver::record::OutputRecord::read(
                    CORRECTIONS_PARTITION,
                    offset as u64,
                    &Payload::Json(line.clone()),
                    tally_deliver::settings::Body::Value,
                )
                .map_err(|reason| anyhow::anyhow!("correction {offset} of the switch: {reason}"))
            })
            .collect()
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

/// The new version's output after a switch, its records of billed
/// periods rebased where the switch says (the receiver's numbering goes on).
pub struct Rebased {
    /// The output.
    pub inner: Box<dyn Source>,
    /// Per key (canonical JSON), the rebase.
    pub rebase: BTreeMap<String, Rebase>,
}

impl Source for Rebased {
    fn start(&mut self, positions: &Positions) -> Result<(), SourceError> {
        self.inner.start(positions)
    }

    fn read(&mut self, max: usize) -> Result<Vec<Line>, SourceError> {
        let mut lines = self.inner.read(max)?;
        if self.rebase.is_empty() {
            return Ok(lines);
        }
        for line in &mut lines {
            match &mut line.payload {
                Payload::Json(bytes) => {
                    let Ok(mut record) = serde_json::from_slice::<Value>(bytes) else { continue };
                    let Some(rebase) = self.rebase.get(&record["key"].to_string()) else {
                        continue;
                    };
                    rebase.apply(&mut record["value"]);
                    *bytes = serde_json::to_vec(&record).expect("JSON serializes");
                }
                Payload::Kafka(record) => {
                    let key = record
                        .key
                        .as_deref()
                        .and_then(|key| serde_json::from_slice::<Value>(key).ok());
                    let Some(rebase) = key.and_then(|key| self.rebase.get(&key.to_string())) else {
                        continue;
                    };
                    let Some(mut value) = record
                        .value
                        .as_deref()
                        .and_then(|value| serde_json::from_slice::<Value>(value).ok())
                    else {
                        continue;
                    };
                    rebase.apply(&mut value);
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
pub fn check_settled(delivered: &Delivered, name: &str) -> anyhow::Result<()> {
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
            "delivery {name} has records that may have reached the receiver and are not settled (first: {}); the \
             promotion must know what was billed: let the delivery catch up (`tally deliver --until-caught-up`) and \
             settle those waiting as unknown (`tally deliver resolve`; for a served job \
             `POST /v1/jobs/<job>/deliveries/<output>/resolve`), then promote",
            unsettled.iter().map(|key| format!("{key:?}")).collect::<Vec<_>>().join(", "),
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

    /// [`SwitchPlanner`] over records in memory: `old` are `from`'s records in
    /// output order, `new` `to`'s up to `positions`.
    fn plan_switch(
        from_to: (&str, &str),
        earlier: Option<&Switch>,
        old: &[Record],
        delivered: &Delivered,
        new: &[Record],
        positions: Positions,
    ) -> Result<Switch, SwitchTooLarge> {
        let mut planner = SwitchPlanner::new(from_to, earlier, delivered);
        for record in old {
            planner.old(record.clone())?;
        }
        for record in new {
            planner.new_record(record.clone())?;
        }
        Ok(planner.finish(positions))
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
        )
        .unwrap();
        assert_eq!(switch.corrections.len(), 2, "{switch:#?}");
        let acme = &switch.corrections[0];
        assert_eq!(acme.key, key("acme"));
        assert_eq!(acme.idempotency_key, "v2/acme/1/promotion-1");
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
        // at billed version 2, v2's next is 2: +1; initech: billed, not in
        // v2 yet: its FINAL will be an ADJUSTMENT from 3 at version 2.
        let shift = |shift| Rebase { shift, previous: None };
        assert_eq!(
            switch.rebase,
            BTreeMap::from([
                (key("acme").to_string(), shift(1)),
                (key("globex").to_string(), shift(1)),
                (key("initech").to_string(), Rebase { shift: 1, previous: Some(json!(3)) }),
            ])
        );
        let mut later = period("final", 5, 1);
        switch.rebase[&key("initech").to_string()].apply(&mut later);
        assert_eq!(
            (&later["type"], &later["previous"], &later["delta"], &later["version"]),
            (&json!("adjustment"), &json!(3), &json!(2), &json!(2))
        );
        assert_eq!(switch.billed[&key("acme").to_string()]["value"], 310);
        assert_eq!(switch.billed[&key("initech").to_string()]["value"], 3);
        assert_eq!(switch.billed.len(), 4, "every key the receiver has");
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
        let switch =
            plan_switch(("v1", "v2"), None, &old, &delivered, &new, Positions::new()).unwrap();
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
        // v1 billed acme (5120) and globex (7); v2 corrected acme to 310 and
        // kept globex.
        let v1 = vec![
            record(0, "acme", period("final", 5120, 1), "v1/acme/1"),
            record(1, "globex", period("final", 7, 1), "v1/globex/1"),
        ];
        let v2_then = vec![
            record(0, "acme", period("final", 310, 1), "v2/acme/1"),
            record(1, "globex", period("final", 7, 1), "v2/globex/1"),
        ];
        let positions = Positions::from([(0, 2)]);
        let first =
            plan_switch(("v1", "v2"), None, &v1, &all_delivered(), &v2_then, positions.clone())
                .unwrap();
        // v2 went on after the switch: its ADJUSTMENT version 2 of acme was
        // delivered as version 3.
        let mut v2 = v2_then.clone();
        v2.push(record(2, "acme", period("adjustment", 320, 2), "v2/acme/2"));
        let v3 = vec![
            record(0, "acme", period("final", 330, 1), "v3/acme/1"),
            record(1, "globex", period("final", 7, 1), "v3/globex/1"),
        ];
        let second =
            plan_switch(("v2", "v3"), Some(&first), &v2, &all_delivered(), &v3, Positions::new())
                .unwrap();
        assert_eq!(second.number, 2);
        assert_eq!(second.corrections.len(), 1, "globex is billed, unchanged: {second:#?}");
        let acme = &second.corrections[0];
        assert_eq!(acme.idempotency_key, "v3/acme/1/promotion-2");
        assert_eq!((&acme.value["previous"], &acme.value["version"]), (&json!(320), &json!(4)));
        assert_eq!(second.rebase[&key("acme").to_string()].shift, 3);
    }

    #[test]
    fn rebased_lines_carry_the_receivers_version() {
        let switch = Switch {
            number: 1,
            from: "v1".into(),
            to: "v2".into(),
            positions: Positions::new(),
            rebase: BTreeMap::from([(
                key("acme").to_string(),
                Rebase { shift: 2, previous: None },
            )]),
            billed: BTreeMap::new(),
            corrections: vec![Correction {
                key: key("acme"),
                value: period("adjustment", 1, 3),
                idempotency_key: "k".into(),
            }],
        };
        let inner = Corrections::new(&switch);
        let mut rebased = Rebased { inner: Box::new(inner), rebase: switch.rebase.clone() };
        rebased.start(&Positions::new()).unwrap();
        let lines = rebased.read(10).unwrap();
        let Payload::Json(bytes) = &lines[0].payload else { panic!("a JSON line") };
        let line: Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(line["value"]["version"], 5);
        assert!(rebased.caught_up());
    }

    #[test]
    fn a_switch_holds_one_record_per_billed_key_and_refuses_past_its_limits() {
        let delivered = all_delivered();
        // Many updates of one billed key hold one record, and its bytes once.
        let mut planner =
            SwitchPlanner::new(("v1", "v2"), None, &delivered).with_limits(3, 1 << 20);
        for offset in 0..100_000 {
            planner.old(record(offset, "acme", period("final", 1, 1), "v1/acme/1")).unwrap();
        }
        for offset in 0..100_000 {
            planner.new_record(record(offset, "acme", period("final", 2, 1), "v2/acme/1")).unwrap();
        }
        let switch = planner.finish(Positions::new());
        assert_eq!(switch.corrections.len(), 1, "one ADJUSTMENT, from the last record");
        // Past the keys it may hold, the planner says which limit.
        let mut planner =
            SwitchPlanner::new(("v1", "v2"), None, &delivered).with_limits(3, 1 << 20);
        for (offset, customer) in ["a", "b", "c"].into_iter().enumerate() {
            planner
                .new_record(record(offset as u64, customer, period("final", 1, 1), "k"))
                .unwrap();
        }
        let refused = planner.new_record(record(3, "d", period("final", 1, 1), "k")).unwrap_err();
        assert!(refused.to_string().contains("more than 3 keys"), "{refused}");
        // And past the bytes.
        let mut planner = SwitchPlanner::new(("v1", "v2"), None, &delivered).with_limits(10, 200);
        let refused = planner
            .old(record(0, "acme", json!({"value": "x".repeat(300)}), "v1/acme/1"))
            .unwrap_err();
        assert!(refused.to_string().contains("200 bytes"), "{refused}");
    }
}
