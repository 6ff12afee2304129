//! The period billing plugin: usage events metered per customer, metric
//! and calendar period in the customer's time zone. The host owns the
//! periods (see `docs/periods.md`); this plugin says what each event is and
//! how the metric's meter counts it.
//!
//! Events: `{"id": "...", "customer": "...", "metric": "...",
//! "quantity": 12, "ts": "2026-11-03T10:00:00Z"}`. The job's
//! `[plugin_config]` names each metric's meter:
//!
//! ```toml
//! [plugin_config]
//! meters = { calls = "sum", requests = "count", peak_gb = "max", storage_gb = "latest", seats = { unique_count = "user" } }
//! ```
//!
//! - `sum`: the quantities added up (refused past 2^64 − 1);
//! - `count`: the events;
//! - `max`: the largest quantity;
//! - `latest`: the quantity of the event with the greatest event time
//!   (of events with the same time, the one read first);
//! - `unique_count`: how many distinct values the named string field took.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::de::{Error as _, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tally_sdk::{EventTime, Facts, Instant, Periods, Reject};

/// How one metric counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meter {
    /// The quantities added up.
    Sum,
    /// The events.
    Count,
    /// The largest quantity.
    Max,
    /// The quantity of the latest event.
    Latest,
    /// The distinct values of a string field.
    UniqueCount(String),
}

/// A meter as `[plugin_config]` writes it: `"sum"`, `"unique_count:user"`,
/// `{ unique_count = "user" }` or `{ meter = "unique_count", field = "user" }`.
#[derive(Deserialize)]
#[serde(untagged)]
enum MeterSpec {
    Named(String),
    Unique {
        unique_count: String,
    },
    Table {
        meter: String,
        #[serde(default)]
        field: Option<String>,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    meters: BTreeMap<String, MeterSpec>,
}

/// A period's state, tagged by its meter (so a state always values as
/// what it was built by).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Sum of quantities.
    Sum(u64),
    /// Number of events.
    Count(u64),
    /// Largest quantity.
    Max(u64),
    /// The latest event's time and quantity.
    Latest {
        /// Seconds since 1970.
        seconds: i64,
        /// Nanoseconds within the second.
        nanoseconds: u32,
        /// Its quantity.
        value: u64,
    },
    /// The distinct values seen.
    Unique(BTreeSet<String>),
}

/// What an event adds to its period, as its metric's meter reads it: all
/// `add` needs of the event (the host keeps it between the calls).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Addend {
    /// A quantity to add up.
    Sum(u64),
    /// One more event.
    Count,
    /// A quantity that may be the largest.
    Max(u64),
    /// A quantity that may be the latest (by the event's time).
    Latest(u64),
    /// A value of the counted field.
    Unique(String),
}

impl Addend {
    /// The meter that made it, as `[plugin_config]` names it.
    fn meter(&self) -> &'static str {
        match self {
            Addend::Sum(_) => "sum",
            Addend::Count => "count",
            Addend::Max(_) => "max",
            Addend::Latest(_) => "latest",
            Addend::Unique(_) => "unique_count",
        }
    }
}

impl State {
    /// The meter that built it, as `[plugin_config]` names it.
    fn meter(&self) -> &'static str {
        match self {
            State::Sum(_) => "sum",
            State::Count(_) => "count",
            State::Max(_) => "max",
            State::Latest { .. } => "latest",
            State::Unique(_) => "unique_count",
        }
    }
}

/// A usage event, read in one pass: the fields every event has (borrowed
/// where the JSON has no escapes), its quantity as written (judged
/// exactly, and echoed as written when refused), and its other fields as
/// written (a `unique_count` meter reads one). The checks and the reason
/// each refusal gets are `docs/billing.md`'s, the same in every language.
pub struct Usage<'a> {
    id: Cow<'a, str>,
    customer: Cow<'a, str>,
    metric: Cow<'a, str>,
    ts: Cow<'a, str>,
    quantity: Option<&'a RawValue>,
    others: Vec<(Cow<'a, str>, &'a RawValue)>,
}

/// The fields every event has, in the order they are checked.
const FIELDS: [&str; 5] = ["id", "customer", "metric", "quantity", "ts"];

/// `quantity`'s place in [`FIELDS`]: the one field an event may leave out
/// (only `sum`, `max` and `latest` meters read it).
const QUANTITY: usize = 3;

/// A field name, borrowed where it has no escapes.
#[derive(Deserialize)]
struct Name<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de> Deserialize<'de> for Usage<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Usage<'de>, D::Error> {
        deserializer.deserialize_any(UsageVisitor)
    }
}

struct UsageVisitor;

/// A string field's text: the text between its quotes where it has no
/// escape, else unescaped into a copy (a lone surrogate or a control
/// character is not JSON).
fn text<'de, E: serde::de::Error>(raw: &'de RawValue, field: &str) -> Result<Cow<'de, str>, E> {
    let written = raw.get();
    match written.strip_prefix('"').and_then(|rest| rest.strip_suffix('"')) {
        Some(plain) if !plain.bytes().any(|b| b == b'\\' || b < 0x20) => Ok(Cow::Borrowed(plain)),
        Some(_) => String::deserialize(raw)
            .map(Cow::Owned)
            .map_err(|_| E::custom("event is not valid JSON")),
        None => Err(E::custom(format_args!("field `{field}` must be a string"))),
    }
}

impl<'de> Visitor<'de> for UsageVisitor {
    type Value = Usage<'de>;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Usage<'de>, M::Error> {
        // Every field is taken as written and judged after the whole object
        // is read, in a fixed order, so the reason does not depend on the
        // order the fields came in.
        let mut seen: [Option<&'de RawValue>; 5] = [None; 5];
        let mut twice = [false; 5];
        let mut others = Vec::new();
        while let Some(Name(name)) = map.next_key()? {
            let value: &'de RawValue = map.next_value()?;
            match FIELDS.iter().position(|field| *field == name) {
                Some(index) => twice[index] |= seen[index].replace(value).is_some(),
                None => others.push((name, value)),
            }
        }
        for (index, field) in FIELDS.iter().enumerate() {
            if twice[index] {
                return Err(M::Error::custom(format_args!("field `{field}` is given twice")));
            }
            if seen[index].is_none() && index != QUANTITY {
                return Err(M::Error::custom(format_args!("field `{field}` is missing")));
            }
        }
        let field = |index: usize| text(seen[index].expect("checked above"), FIELDS[index]);
        Ok(Usage {
            id: field(0)?,
            customer: field(1)?,
            metric: field(2)?,
            ts: field(4)?,
            quantity: seen[QUANTITY],
            others,
        })
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Usage<'de>, E> {
        Err(E::custom("event must be a JSON object"))
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Usage<'de>, E> {
        Err(E::custom("event must be a JSON object"))
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Usage<'de>, E> {
        Err(E::custom("event must be a JSON object"))
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Usage<'de>, E> {
        Err(E::custom("event must be a JSON object"))
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Usage<'de>, E> {
        Err(E::custom("event must be a JSON object"))
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Usage<'de>, E> {
        Err(E::custom("event must be a JSON object"))
    }
    fn visit_seq<S: serde::de::SeqAccess<'de>>(self, mut seq: S) -> Result<Usage<'de>, S::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Err(serde::de::Error::custom("event must be a JSON object"))
    }
}

/// `text` as a JSON string, as a refusal quotes it.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

/// The billing plugin, configured.
pub struct BillingPeriods {
    meters: BTreeMap<String, Meter>,
}

impl BillingPeriods {
    fn meter(&self, metric: &str) -> Result<&Meter, Reject> {
        self.meters.get(metric).ok_or_else(|| {
            Reject::new(format!(
                "metric {} has no meter; name it in the job's [plugin_config] meters (it has: {})",
                quoted(metric),
                self.meters.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })
    }
}

/// A quantity exactly as written: a non-negative integer up to 2^64 − 1.
fn quantity(raw: Option<&RawValue>) -> Result<u64, Reject> {
    let raw = raw.ok_or_else(|| Reject::new("field `quantity` is missing"))?;
    let text = raw.get();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Reject::new(format!("quantity must be a non-negative integer, got {text}")));
    }
    text.parse::<u64>().map_err(|_| {
        Reject::new(format!("quantity {text} is over the largest meterable, 2^64 - 1"))
    })
}

/// The named string field of the event, for `unique_count` (of a field
/// other than the five every event has written twice, the last).
fn field(usage: &Usage<'_>, name: &str) -> Result<String, Reject> {
    let raw = match name {
        "id" => return Ok(usage.id.to_string()),
        "customer" => return Ok(usage.customer.to_string()),
        "metric" => return Ok(usage.metric.to_string()),
        "ts" => return Ok(usage.ts.to_string()),
        "quantity" => usage.quantity,
        _ => usage.others.iter().rev().find(|(other, _)| other == name).map(|(_, raw)| *raw),
    };
    let raw = raw.ok_or_else(|| {
        Reject::new(format!("field {} (counted by unique_count) is missing", quoted(name)))
    })?;
    if !raw.get().starts_with('"') {
        return Err(Reject::new(format!(
            "field {} must be a string for its unique_count meter, got {}",
            quoted(name),
            raw.get()
        )));
    }
    String::deserialize(raw).map_err(|_| Reject::new("event is not valid JSON"))
}

impl Periods for BillingPeriods {
    type Config = serde_json::Value;
    type Event<'a> = Usage<'a>;
    type Addend = Addend;
    type State = State;

    fn new(config: serde_json::Value) -> Result<BillingPeriods, String> {
        let config: Config = serde_json::from_value(config).map_err(|err| {
            format!(
                "write meters = {{ calls = \"sum\", seats = {{ unique_count = \"user\" }} }}: {err}"
            )
        })?;
        if config.meters.is_empty() {
            return Err("meters is empty: name at least one metric's meter".into());
        }
        let mut meters = BTreeMap::new();
        for (metric, spec) in config.meters {
            let (name, field) = match spec {
                MeterSpec::Named(name) => match name.split_once(':') {
                    Some((name, field)) => (name.to_string(), Some(field.to_string())),
                    None => (name, None),
                },
                MeterSpec::Unique { unique_count } => ("unique_count".into(), Some(unique_count)),
                MeterSpec::Table { meter, field } => (meter, field),
            };
            let meter = match (name.as_str(), field) {
                ("sum", None) => Meter::Sum,
                ("count", None) => Meter::Count,
                ("max", None) => Meter::Max,
                ("latest", None) => Meter::Latest,
                ("unique_count", Some(field)) if !field.is_empty() => Meter::UniqueCount(field),
                ("unique_count", _) => {
                    return Err(format!(
                        "meters.{metric}: unique_count counts the values of a field; name it: {{ unique_count = \"user\" }}"
                    ));
                }
                (other, _) => {
                    return Err(format!(
                        "meters.{metric} = {other:?}: the meters are \"sum\", \"count\", \"max\", \"latest\" and {{ unique_count = \"<field>\" }}"
                    ));
                }
            };
            meters.insert(metric, meter);
        }
        Ok(BillingPeriods { meters })
    }

    fn describe(&self, usage: Usage<'_>) -> Result<Facts<Addend>, Reject> {
        let addend = match self.meter(&usage.metric)? {
            Meter::Sum => Addend::Sum(quantity(usage.quantity)?),
            Meter::Count => Addend::Count,
            Meter::Max => Addend::Max(quantity(usage.quantity)?),
            Meter::Latest => Addend::Latest(quantity(usage.quantity)?),
            Meter::UniqueCount(name) => Addend::Unique(field(&usage, name)?),
        };
        let customer = usage.customer.into_owned();
        Ok(Facts {
            id: usage.id.into_owned(),
            time: EventTime::Rfc3339(usage.ts.into_owned()),
            key: vec![
                ("customer".into(), customer.clone()),
                ("metric".into(), usage.metric.into_owned()),
            ],
            customer,
            addend,
        })
    }

    fn add(&self, state: Option<State>, time: Instant, addend: Addend) -> Result<State, Reject> {
        let next = match (addend, state) {
            (Addend::Sum(quantity), None) => State::Sum(quantity),
            (Addend::Sum(quantity), Some(State::Sum(sum))) => {
                State::Sum(sum.checked_add(quantity).ok_or_else(|| {
                    Reject::new("the period's sum would pass 2^64 - 1, the largest meterable")
                })?)
            }
            (Addend::Count, None) => State::Count(1),
            (Addend::Count, Some(State::Count(count))) => State::Count(count.saturating_add(1)),
            (Addend::Max(quantity), None) => State::Max(quantity),
            (Addend::Max(quantity), Some(State::Max(max))) => State::Max(max.max(quantity)),
            (Addend::Latest(value), None) => {
                State::Latest { seconds: time.seconds, nanoseconds: time.nanoseconds, value }
            }
            (Addend::Latest(quantity), Some(State::Latest { seconds, nanoseconds, value })) => {
                // Ties go to the event read first.
                if (time.seconds, time.nanoseconds) > (seconds, nanoseconds) {
                    State::Latest {
                        seconds: time.seconds,
                        nanoseconds: time.nanoseconds,
                        value: quantity,
                    }
                } else {
                    State::Latest { seconds, nanoseconds, value }
                }
            }
            (Addend::Unique(value), None) => State::Unique(BTreeSet::from([value])),
            (Addend::Unique(value), Some(State::Unique(mut seen))) => {
                seen.insert(value);
                State::Unique(seen)
            }
            (addend, Some(state)) => {
                return Err(Reject::new(format!(
                    "the event's metric is metered by {} but its period was opened by {}: a metric's meter changed while its period was open; keep a metric's meter for its periods",
                    addend.meter(),
                    state.meter()
                )));
            }
        };
        Ok(next)
    }

    fn value(&self, state: &State) -> u64 {
        match state {
            State::Sum(value) | State::Count(value) | State::Max(value) => *value,
            State::Latest { value, .. } => *value,
            State::Unique(seen) => seen.len() as u64,
        }
    }
}

tally_sdk::export_periods!(BillingPeriods);

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin() -> BillingPeriods {
        BillingPeriods::new(serde_json::json!({"meters": {
            "calls": "sum", "requests": "count", "peak": "max", "gb": "latest",
            "seats": {"unique_count": "user"}
        }}))
        .unwrap()
    }

    fn usage(text: &str) -> Usage<'_> {
        serde_json::from_str(text).unwrap()
    }

    fn at(seconds: i64) -> Instant {
        Instant { seconds, nanoseconds: 0 }
    }

    fn addend(plugin: &BillingPeriods, text: &str) -> Addend {
        plugin.describe(usage(text)).unwrap().addend
    }

    fn fold(plugin: &BillingPeriods, events: &[(&str, i64)]) -> u64 {
        let mut state = None;
        for (event, seconds) in events {
            state = Some(plugin.add(state, at(*seconds), addend(plugin, event)).unwrap());
        }
        plugin.value(&state.unwrap())
    }

    #[test]
    fn each_meter_counts_as_documented() {
        let plugin = plugin();
        let event = |metric: &str, quantity: &str, user: &str| {
            format!(
                r#"{{"id":"x","customer":"acme","metric":"{metric}","quantity":{quantity},"ts":"2026-11-01T00:00:00Z","user":"{user}"}}"#
            )
        };
        let e = |m, q| event(m, q, "u");
        assert_eq!(fold(&plugin, &[(&e("calls", "2"), 1), (&e("calls", "3"), 2)]), 5);
        assert_eq!(fold(&plugin, &[(&e("requests", "2"), 1), (&e("requests", "9"), 2)]), 2);
        assert_eq!(fold(&plugin, &[(&e("peak", "7"), 1), (&e("peak", "3"), 2)]), 7);
        // Latest by event time; a tie keeps the first read.
        assert_eq!(fold(&plugin, &[(&e("gb", "7"), 5), (&e("gb", "3"), 2)]), 7);
        assert_eq!(fold(&plugin, &[(&e("gb", "7"), 5), (&e("gb", "3"), 5)]), 7);
        assert_eq!(fold(&plugin, &[(&e("gb", "7"), 5), (&e("gb", "3"), 6)]), 3);
        let seats = [
            (event("seats", "1", "Zoë"), 1),
            (event("seats", "1", "Zo\\u00eb"), 2),
            (event("seats", "1", "zoe"), 3),
        ];
        let seats: Vec<(&str, i64)> = seats.iter().map(|(e, t)| (e.as_str(), *t)).collect();
        assert_eq!(fold(&plugin, &seats), 2, "an escaped string is the same string");
        let twice =
            r#"{"id":"x","customer":"acme","metric":"seats","user":"a","ts":"t","user":"b"}"#;
        let state = plugin.add(None, at(1), addend(&plugin, twice)).unwrap();
        assert_eq!(state, State::Unique(BTreeSet::from(["b".to_string()])), "the last one written");
        let max = e("calls", "18446744073709551615");
        assert_eq!(fold(&plugin, &[(&max, 1)]), u64::MAX);
        let err = plugin
            .add(Some(State::Sum(u64::MAX)), at(1), addend(&plugin, &e("calls", "1")))
            .unwrap_err();
        assert!(err.0.contains("2^64 - 1"), "{err}");
        let err = plugin.add(Some(State::Count(3)), at(1), Addend::Sum(1)).unwrap_err();
        assert!(
            err.0.starts_with(
                "the event's metric is metered by sum but its period was opened by count"
            ),
            "{err}"
        );
    }

    #[test]
    fn malformed_events_and_configs_say_what_is_wrong() {
        let plugin = plugin();
        // Each reason exactly as docs/billing.md writes it (every SDK's
        // build gives these words).
        let cases: [(&[u8], &str); 21] = [
            (b"{\"id\":\"x\xff\"}", "event is not UTF-8"),
            (b"{\"id\":\"x\",}", "event is not valid JSON"),
            (b"{\"id\":\"x\"} {}", "event is not valid JSON"),
            (b"[1]", "event must be a JSON object"),
            (b"\"text\"", "event must be a JSON object"),
            (br#"{"id":"x","customer":"a","id":"y","metric":"calls","quantity":1,"ts":"t"}"#, "field `id` is given twice"),
            (br#"{"customer":"a","metric":"calls","quantity":1,"ts":"t","customer":"b"}"#, "field `id` is missing"),
            (br#"{"id":"x","customer":"a","metric":"calls","quantity":1,"quantity":2,"ts":"t"}"#, "field `quantity` is given twice"),
            (br#"{"id":"x","customer":"a","metric":"calls","quantity":1}"#, "field `ts` is missing"),
            (br#"{"id":7,"customer":"a","metric":"calls","quantity":1,"ts":"t"}"#, "field `id` must be a string"),
            (br#"{"id":"x","customer":"a","metric":"calls","quantity":1,"ts":5}"#, "field `ts` must be a string"),
            (br#"{"id":"x","customer":"\ud800","metric":"calls","quantity":1,"ts":"t"}"#, "event is not valid JSON"),
            (br#"{"id":"x","customer":"a","metric":"disk\n","quantity":1,"ts":"t"}"#, "metric \"disk\\n\" has no meter; name it in the job's [plugin_config] meters (it has: calls, gb, peak, requests, seats)"),
            (br#"{"id":"x","customer":"a","metric":"calls","ts":"t"}"#, "field `quantity` is missing"),
            (br#"{"id":"x","customer":"a","metric":"calls","quantity":-3,"ts":"t"}"#, "quantity must be a non-negative integer, got -3"),
            (br#"{"id":"x","customer":"a","metric":"peak","quantity":1.5e0,"ts":"t"}"#, "quantity must be a non-negative integer, got 1.5e0"),
            (br#"{"id":"x","customer":"a","metric":"gb","quantity":"5","ts":"t"}"#, "quantity must be a non-negative integer, got \"5\""),
            (br#"{"id":"x","customer":"a","metric":"calls","quantity":18446744073709551616,"ts":"t"}"#, "quantity 18446744073709551616 is over the largest meterable, 2^64 - 1"),
            (br#"{"id":"x","customer":"a","metric":"seats","ts":"t"}"#, "field \"user\" (counted by unique_count) is missing"),
            (br#"{"id":"x","customer":"a","metric":"seats","ts":"t","user":[ 3 ]}"#, "field \"user\" must be a string for its unique_count meter, got [ 3 ]"),
            (br#"{"id":"x","customer":"a","metric":"seats","ts":"t","user":"\udc00"}"#, "event is not valid JSON"),
        ];
        for (event, reason) in cases {
            let got = tally_sdk::periods::describe(&plugin, event).unwrap_err();
            assert_eq!(got, reason, "{}", String::from_utf8_lossy(event));
        }
        // A count meter reads no quantity; other fields may hold what they like.
        let fine =
            br#"{"id":"x","customer":"a","metric":"requests","ts":"t","note":"\ud800","q":{}}"#;
        assert!(tally_sdk::periods::describe(&plugin, fine).is_ok());
        let facts =
            plugin.describe(usage(r#"{"id":"x","customer":"a","metric":"requests","ts":"t"}"#));
        assert_eq!(facts.unwrap().key[1], ("metric".to_string(), "requests".to_string()));
        let err = BillingPeriods::new(serde_json::json!({"meters": {"calls": "avg"}})).err();
        assert!(err.unwrap().contains("the meters are"));
        let err =
            BillingPeriods::new(serde_json::json!({"meters": {"seats": "unique_count"}})).err();
        assert!(err.unwrap().contains("name it"));
        let forms = serde_json::json!({"meters": {
            "a": "unique_count:user", "b": {"meter": "unique_count", "field": "user"},
            "c": {"meter": "sum"}
        }});
        let plugin = BillingPeriods::new(forms).unwrap();
        assert_eq!(plugin.meters["a"], Meter::UniqueCount("user".into()));
        assert_eq!(plugin.meters["b"], Meter::UniqueCount("user".into()));
        assert_eq!(plugin.meters["c"], Meter::Sum);
        assert!(BillingPeriods::new(serde_json::json!({"meters": {}})).is_err());
    }

    #[test]
    fn an_event_goes_from_describe_to_add_as_its_addend_only() {
        let plugin = plugin();
        let event = r#"{"id":"x","customer":"acme","metric":"seats","ts":"2026-11-01T00:00:00Z","user":"Zo\u00eb \"the\" one"}"#;
        let facts = tally_sdk::periods::describe(&plugin, event.as_bytes()).unwrap();
        assert_eq!(
            String::from_utf8(facts.addend.clone()).unwrap(),
            r#"{"unique":"Zoë \"the\" one"}"#
        );
        let state = tally_sdk::periods::add(&plugin, None, at(1), &facts.addend).unwrap();
        assert_eq!(tally_sdk::periods::value(&plugin, &state), 1);
        let calls = r#"{"id":"y","customer":"acme","metric":"calls","quantity":18446744073709551615,"ts":"t"}"#;
        let facts = tally_sdk::periods::describe(&plugin, calls.as_bytes()).unwrap();
        assert_eq!(facts.addend, br#"{"sum":18446744073709551615}"#.to_vec());
        let err = tally_sdk::periods::add(&plugin, None, at(1), b"{\"sum\":-1}").unwrap_err();
        assert!(err.starts_with("the event's addend is not the JSON this plugin makes"), "{err}");
    }
}
