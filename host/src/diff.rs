//! `tally diff`: two versions of a job's output compared key by key.
//!
//! Each version's committed output is read to its end (a local file up to
//! its committed length, a Kafka topic `read_committed`); per key, the
//! last record's value counts — for a period job, the period's FINAL with
//! its ADJUSTMENTs applied (the last one's `value`), for a running total
//! the latest total. Keys are compared as canonical JSON.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;
use serde_json::Value;
use tally_deliver::{Line, Payload, Positions, Source};

/// How long reading a version's output may go without a record before
/// the read gives up (a Kafka topic that never reports its end).
const READ_STALL: Duration = Duration::from_secs(60);

/// Records read per call.
const READ_BATCH: usize = 4096;
/// Lines a [`GrowingOutput`] reads at a time.
const GROWING_READ_BATCH: usize = 256;

/// One version's output: the value per key, and how far it was read.
#[derive(Debug, Default)]
pub struct OutputValues {
    /// The value that counts per key (canonical JSON of the key).
    pub values: BTreeMap<String, Value>,
    /// Records read.
    pub records: u64,
    /// Where each partition's read ended.
    pub positions: Positions,
}

/// One committed output record, as a diff or a promotion reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Its partition (0 for a local output).
    pub partition: u32,
    /// Its offset in the partition.
    pub offset: u64,
    /// Its key (JSON; a Kafka key that is not JSON as a string).
    pub key: Value,
    /// Its value, likewise.
    pub value: Value,
    /// Its idempotency key.
    pub idempotency_key: Option<String>,
}

/// Reads `source` to the end of what is committed, handing each record to
/// `visit` in order within each partition; returns where each partition's
/// read ended. An error of `visit` ends the read with it.
pub fn read_records(
    source: &mut dyn Source,
    mut visit: impl FnMut(Record) -> anyhow::Result<()>,
) -> anyhow::Result<Positions> {
    let mut positions = Positions::new();
    source.start(&Positions::new())?;
    let mut last_record = Instant::now();
    loop {
        let lines = source.read(READ_BATCH)?;
        if lines.is_empty() {
            if source.caught_up() {
                return Ok(positions);
            }
            if last_record.elapsed() > READ_STALL {
                bail!("the output stopped before its end ({READ_STALL:?} without a record)");
            }
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        last_record = Instant::now();
        for line in &lines {
            positions.insert(line.partition, line.next);
            visit(record_of(line)?)?;
        }
    }
}

/// One output line as a [`Record`]: its key, value and idempotency key.
fn record_of(line: &Line) -> anyhow::Result<Record> {
    let (key, value, idempotency_key) = match &line.payload {
        Payload::Json(bytes) => {
            let mut record: Value = serde_json::from_slice(bytes).map_err(|err| {
                anyhow::anyhow!(
                    "the output line at partition {} offset {} is not JSON: {err}",
                    line.partition,
                    line.offset
                )
            })?;
            let idempotency_key = record["idempotency_key"].as_str().map(str::to_string);
            (record["key"].take(), record["value"].take(), idempotency_key)
        }
        Payload::Kafka(record) => {
            (json_or_text(&record.key), json_or_text(&record.value), record.idempotency_key.clone())
        }
        Payload::TooLong(bytes) => bail!(
            "the output record at partition {} offset {} has {bytes} bytes, more than a diff reads",
            line.partition,
            line.offset
        ),
    };
    Ok(Record { partition: line.partition, offset: line.offset, key, value, idempotency_key })
}

/// One version's output read as it grows: each call reads what was
/// committed since the last one (a served shadow's running diff).
pub struct GrowingOutput {
    source: Box<dyn Source>,
    started: bool,
    /// What was read so far.
    pub values: OutputValues,
    /// About how many bytes its keys and values take.
    pub held_bytes: u64,
}

impl GrowingOutput {
    /// Reads `source` from its start, once [`GrowingOutput::read_more`] is called.
    pub fn new(source: Box<dyn Source>) -> GrowingOutput {
        GrowingOutput { source, started: false, values: OutputValues::default(), held_bytes: 0 }
    }

    /// Reads up to `most` more records of what is committed now, and
    /// stops early once it holds more than `max_held_bytes`; `true` once
    /// it read all of it.
    pub fn read_more(&mut self, most: usize, max_held_bytes: u64) -> anyhow::Result<bool> {
        if !self.started {
            self.source.start(&Positions::new())?;
            self.started = true;
        }
        let mut read = 0;
        while read < most && self.held_bytes <= max_held_bytes {
            // Few lines at a time: each may be as large as a value may be.
            let lines = self.source.read(GROWING_READ_BATCH.min(most - read))?;
            if lines.is_empty() {
                return Ok(self.source.caught_up());
            }
            read += lines.len();
            for line in &lines {
                if self.held_bytes > max_held_bytes {
                    // Over its budget: the caller stops comparing this
                    // output, so the rest goes unread.
                    break;
                }
                let record = record_of(line)?;
                self.values.positions.insert(line.partition, line.next);
                self.values.records += 1;
                let key = record.key.to_string();
                let value = counted_value(record.value);
                let key_bytes = key.len();
                self.held_bytes += (key_bytes + value_size(&value)) as u64;
                if let Some(old) = self.values.values.insert(key, value) {
                    self.held_bytes -= (key_bytes + value_size(&old)) as u64;
                }
            }
        }
        Ok(false)
    }
}

/// Reads `source` to the end of what is committed.
pub fn read_values(source: &mut dyn Source) -> anyhow::Result<OutputValues> {
    let (mut values, mut records) = (BTreeMap::new(), 0);
    let positions = read_records(source, |record| {
        records += 1;
        values.insert(record.key.to_string(), counted_value(record.value));
        Ok(())
    })?;
    Ok(OutputValues { values, records, positions })
}

/// About how many bytes `value` takes in memory.
pub fn value_size(value: &Value) -> usize {
    const NODE: usize = std::mem::size_of::<Value>();
    NODE + match value {
        Value::String(text) => text.len(),
        Value::Array(items) => items.iter().map(value_size).sum(),
        Value::Object(fields) => {
            fields.iter().map(|(name, field)| name.len() + NODE + value_size(field)).sum()
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
    }
}

/// A Kafka key or value as JSON when it is JSON, else as a string.
fn json_or_text(bytes: &Option<Vec<u8>>) -> Value {
    match bytes {
        None => Value::Null,
        Some(bytes) => serde_json::from_slice(bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned())),
    }
}

/// What a record's value counts as: a FINAL's or ADJUSTMENT's `value`,
/// anything else whole.
pub fn counted_value(value: Value) -> Value {
    let is_period_record =
        matches!(value.get("type").and_then(Value::as_str), Some("final") | Some("adjustment"));
    match value {
        Value::Object(mut fields) if is_period_record && fields.contains_key("value") => {
            fields.remove("value").unwrap_or(Value::Null)
        }
        other => other,
    }
}

/// A key whose value differs between the versions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Changed {
    /// The key (JSON).
    pub key: Value,
    /// Its value in the first version.
    pub a: Value,
    /// Its value in the second.
    pub b: Value,
    /// `b - a`, when both are numbers.
    pub delta: Option<Value>,
}

/// A key only one version has.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OnlyIn {
    /// The key (JSON).
    pub key: Value,
    /// Its value.
    pub value: Value,
}

/// One side of a diff: the version and how much of its output was read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Side {
    /// The version (`v1`).
    pub version: String,
    /// Records read.
    pub records: u64,
    /// Keys with a value.
    pub keys: u64,
    /// Where each partition's read ended.
    pub positions: Positions,
}

/// Two versions' outputs compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diff {
    /// The job's output compared.
    pub output: String,
    /// The first version.
    pub a: Side,
    /// The second.
    pub b: Side,
    /// Keys with the same value in both.
    pub equal: u64,
    /// Keys whose values differ.
    pub changed: Vec<Changed>,
    /// Keys only the first has.
    pub only_in_a: Vec<OnlyIn>,
    /// Keys only the second has.
    pub only_in_b: Vec<OnlyIn>,
}

/// Compares `a` (version `a_name`) with `b`.
pub fn compare(
    output: &str,
    (a_name, a): (&str, OutputValues),
    (b_name, b): (&str, OutputValues),
) -> Diff {
    let side = |name: &str, values: &OutputValues| Side {
        version: name.to_string(),
        records: values.records,
        keys: values.values.len() as u64,
        positions: values.positions.clone(),
    };
    let mut diff = Diff {
        output: output.to_string(),
        a: side(a_name, &a),
        b: side(b_name, &b),
        equal: 0,
        changed: Vec::new(),
        only_in_a: Vec::new(),
        only_in_b: Vec::new(),
    };
    let key_value = |key: &str| serde_json::from_str(key).unwrap_or(Value::Null);
    let mut b_values = b.values;
    for (key, a_value) in a.values {
        match b_values.remove(&key) {
            Some(b_value) if b_value == a_value => diff.equal += 1,
            Some(b_value) => diff.changed.push(Changed {
                key: key_value(&key),
                delta: delta(&a_value, &b_value),
                a: a_value,
                b: b_value,
            }),
            None => diff.only_in_a.push(OnlyIn { key: key_value(&key), value: a_value }),
        }
    }
    for (key, value) in b_values {
        diff.only_in_b.push(OnlyIn { key: key_value(&key), value });
    }
    diff
}

/// `b - a` for two numbers: exact for integers, else as floats.
pub fn delta(a: &Value, b: &Value) -> Option<Value> {
    let integer =
        |value: &Value| value.as_i64().map(i128::from).or_else(|| value.as_u64().map(i128::from));
    if let (Some(a), Some(b)) = (integer(a), integer(b)) {
        let delta = b - a;
        return Some(match i64::try_from(delta) {
            Ok(delta) => Value::from(delta),
            Err(_) => Value::String(delta.to_string()),
        });
    }
    let (a, b) = (a.as_f64()?, b.as_f64()?);
    serde_json::Number::from_f64(b - a).map(Value::Number)
}

impl Diff {
    /// The diff as text: one line per changed or one-sided key, then totals.
    pub fn render(&self) -> String {
        let (a, b) = (&self.a.version, &self.b.version);
        let mut text = String::new();
        for side in [&self.a, &self.b] {
            let positions: Vec<String> =
                side.positions.iter().map(|(p, offset)| format!("{p}:{offset}")).collect();
            text.push_str(&format!(
                "{}: {} records, {} keys, read to {}\n",
                side.version,
                side.records,
                side.keys,
                if positions.is_empty() { "-".to_string() } else { positions.join(" ") }
            ));
        }
        for changed in &self.changed {
            let delta = changed.delta.as_ref().map(|d| format!("  delta {d}")).unwrap_or_default();
            text.push_str(&format!(
                "changed     {}  {a} {}  {b} {}{delta}\n",
                changed.key, changed.a, changed.b
            ));
        }
        for only in &self.only_in_a {
            text.push_str(&format!("only in {a}  {}  {}\n", only.key, only.value));
        }
        for only in &self.only_in_b {
            text.push_str(&format!("only in {b}  {}  {}\n", only.key, only.value));
        }
        text.push_str(&format!(
            "output {}: equal {}, changed {}, only in {a} {}, only in {b} {}\n",
            self.output,
            self.equal,
            self.changed.len(),
            self.only_in_a.len(),
            self.only_in_b.len()
        ));
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn values(pairs: &[(Value, Value)]) -> OutputValues {
        OutputValues {
            values: pairs
                .iter()
                .map(|(key, value)| (key.to_string(), counted_value(value.clone())))
                .collect(),
            records: pairs.len() as u64,
            positions: Positions::new(),
        }
    }

    /// A source whose committed lines grow as the test appends them.
    struct Growing {
        committed: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
        next: usize,
    }

    impl Source for Growing {
        fn start(&mut self, _: &Positions) -> Result<(), tally_deliver::SourceError> {
            self.next = 0;
            Ok(())
        }

        fn read(&mut self, max: usize) -> Result<Vec<Line>, tally_deliver::SourceError> {
            let committed = self.committed.lock().unwrap();
            let lines: Vec<Line> = committed[self.next..]
                .iter()
                .take(max)
                .enumerate()
                .map(|(n, text)| Line {
                    partition: 0,
                    offset: (self.next + n) as u64,
                    next: (self.next + n + 1) as u64,
                    payload: Payload::Json(text.as_bytes().to_vec()),
                })
                .collect();
            self.next += lines.len();
            Ok(lines)
        }

        fn caught_up(&self) -> bool {
            self.next == self.committed.lock().unwrap().len()
        }
    }

    #[test]
    fn a_growing_output_reads_only_what_was_committed_since_and_keeps_the_last_value() {
        let committed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let line =
            |key: &str, value: u64| format!(r#"{{"key":{key:?},"value":{{"total":{value}}}}}"#);
        committed.lock().unwrap().extend([line("a", 1), line("b", 2), line("a", 3)]);
        let mut output =
            GrowingOutput::new(Box::new(Growing { committed: committed.clone(), next: 0 }));
        // At most `most` records a call.
        assert!(!output.read_more(2, u64::MAX).unwrap());
        assert_eq!(output.values.records, 2);
        assert!(output.read_more(10, u64::MAX).unwrap());
        assert_eq!(output.values.records, 3);
        assert_eq!(output.values.values["\"a\""], json!({"total": 3}));
        assert!(output.read_more(10, u64::MAX).unwrap(), "nothing new is still caught up");
        committed.lock().unwrap().push(line("b", 5));
        assert!(output.read_more(10, u64::MAX).unwrap());
        assert_eq!(output.values.records, 4);
        assert_eq!(output.values.values["\"b\""], json!({"total": 5}));
        assert_eq!(output.values.positions[&0], 4);
        // Two keys held, each with its last value: what it holds, not all it read.
        let held: usize = output.values.values.iter().map(|(k, v)| k.len() + value_size(v)).sum();
        assert_eq!(output.held_bytes, held as u64);
        // A line that is not JSON is an error naming where it is.
        committed.lock().unwrap().push("not json".to_string());
        let err = output.read_more(10, u64::MAX).unwrap_err().to_string();
        assert!(err.contains("partition 0 offset 4 is not JSON"), "{err}");
    }

    #[test]
    fn a_growing_output_stops_reading_once_it_holds_more_than_it_may() {
        let committed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let big = "x".repeat(10_000);
        committed.lock().unwrap().extend(
            (0..100).map(|key| format!(r#"{{"key":"k{key}","value":{{"note":{big:?}}}}}"#)),
        );
        let mut output = GrowingOutput::new(Box::new(Growing { committed, next: 0 }));
        assert!(!output.read_more(1_000, 50_000).unwrap(), "not all of it");
        assert!(output.held_bytes > 50_000, "just past what it may hold");
        assert!(output.values.records < 10, "read {} records", output.values.records);
    }

    #[test]
    fn periods_compare_by_their_latest_value_and_totals_whole() {
        let period = |customer: &str| json!({"customer": customer, "period": "2026-11"});
        let a = values(&[
            (period("acme"), json!({"type": "adjustment", "value": 15, "previous": 12})),
            (period("globex"), json!({"type": "final", "value": 7})),
            (period("initech"), json!({"type": "final", "value": 1})),
            (json!("plain"), json!({"total": 3})),
        ]);
        let b = values(&[
            (period("acme"), json!({"type": "final", "value": 15})),
            (period("globex"), json!({"type": "final", "value": 9})),
            (period("umbrella"), json!({"type": "final", "value": 2})),
            (json!("plain"), json!({"total": 4})),
        ]);
        let diff = compare("periods", ("v1", a), ("v2", b));
        assert_eq!(diff.equal, 1, "FINAL 15 equals an ADJUSTMENT to 15");
        assert_eq!(diff.changed.len(), 2);
        let globex = diff.changed.iter().find(|c| c.key == period("globex")).unwrap();
        assert_eq!((&globex.a, &globex.b, &globex.delta), (&json!(7), &json!(9), &Some(json!(2))));
        let plain = diff.changed.iter().find(|c| c.key == json!("plain")).unwrap();
        assert_eq!(plain.delta, None, "objects have no delta");
        assert_eq!(diff.only_in_a, [OnlyIn { key: period("initech"), value: json!(1) }]);
        assert_eq!(diff.only_in_b, [OnlyIn { key: period("umbrella"), value: json!(2) }]);
        assert!(diff.render().ends_with("equal 1, changed 2, only in v1 1, only in v2 1\n"));
    }

    #[test]
    fn deltas_are_exact_for_integers() {
        assert_eq!(
            delta(&json!(u64::MAX), &json!(0)),
            Some(json!((-(u64::MAX as i128)).to_string()))
        );
        assert_eq!(delta(&json!(-5), &json!(3)), Some(json!(8)));
        assert_eq!(delta(&json!(1.5), &json!(2)), Some(json!(0.5)));
        assert_eq!(delta(&json!("a"), &json!(2)), None);
    }
}
