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
/// where the JSON has no escapes), its quantity as written, and its other
/// fields as written (a `unique_count` meter reads one).
pub struct Usage<'a> {
    id: Cow<'a, str>,
    customer: Cow<'a, str>,
    metric: Cow<'a, str>,
    ts: Cow<'a, str>,
    quantity: Option<&'a RawValue>,
    others: Vec<(Cow<'a, str>, &'a RawValue)>,
}

/// A field name, borrowed where it has no escapes.
#[derive(Deserialize)]
struct Name<'a>(#[serde(borrow)] Cow<'a, str>);

/// A string field's value, borrowed where it has no escapes.
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

const USAGE_FIELDS: &str = r#"{"id", "customer", "metric", "quantity", "ts"}"#;

impl<'de: 'a, 'a> Deserialize<'de> for Usage<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Usage<'a>, D::Error> {
        deserializer.deserialize_map(UsageVisitor(std::marker::PhantomData))
    }
}

struct UsageVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for UsageVisitor<'a> {
    type Value = Usage<'a>;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(formatter, "a usage event {USAGE_FIELDS}")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Usage<'a>, M::Error> {
        let (mut id, mut customer, mut metric, mut ts, mut quantity) =
            (None, None, None, None, None);
        let mut others = Vec::new();
        while let Some(Name(name)) = map.next_key()? {
            let slot = match &*name {
                "id" => &mut id,
                "customer" => &mut customer,
                "metric" => &mut metric,
                "ts" => &mut ts,
                "quantity" => {
                    if quantity.is_some() {
                        return Err(M::Error::duplicate_field("quantity"));
                    }
                    quantity = Some(map.next_value()?);
                    continue;
                }
                _ => {
                    others.push((name, map.next_value()?));
                    continue;
                }
            };
            if slot.is_some() {
                return Err(M::Error::duplicate_field(field_name(&name)));
            }
            let Text(text) = map.next_value()?;
            *slot = Some(text);
        }
        let missing = |field: &'static str| {
            M::Error::custom(format!("a usage event is {USAGE_FIELDS}: missing field `{field}`"))
        };
        Ok(Usage {
            id: id.ok_or_else(|| missing("id"))?,
            customer: customer.ok_or_else(|| missing("customer"))?,
            metric: metric.ok_or_else(|| missing("metric"))?,
            ts: ts.ok_or_else(|| missing("ts"))?,
            quantity,
            others,
        })
    }
}

/// `name` as one of the fields every event has.
fn field_name(name: &str) -> &'static str {
    ["id", "customer", "metric", "ts"].into_iter().find(|known| *known == name).unwrap_or("?")
}

/// The billing plugin, configured.
pub struct BillingPeriods {
    meters: BTreeMap<String, Meter>,
}

impl BillingPeriods {
    fn meter(&self, metric: &str) -> Result<&Meter, Reject> {
        self.meters.get(metric).ok_or_else(|| {
            Reject::new(format!(
                "metric {metric:?} has no meter; name it in the job's [plugin_config] meters (it has: {})",
                self.meters.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })
    }
}

/// A quantity exactly as written: a non-negative integer up to 2^64 − 1.
fn quantity(raw: Option<&RawValue>) -> Result<u64, Reject> {
    let raw = raw.ok_or_else(|| Reject::new("quantity is missing"))?;
    let text = raw.get();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Reject::new(format!("quantity must be a non-negative integer, got {text}")));
    }
    text.parse::<u64>().map_err(|_| {
        Reject::new(format!("quantity {text} is over the largest meterable, 2^64 - 1"))
    })
}

/// The named string field of the event, for `unique_count` (of a field
/// written twice, the last).
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
        Reject::new(format!("field {name:?} (counted by unique_count) is missing"))
    })?;
    match serde_json::from_str(raw.get()) {
        Ok(serde_json::Value::String(value)) => Ok(value),
        Ok(other) => Err(Reject::new(format!(
            "field {name:?} must be a string for its unique_count meter, got {other}"
        ))),
        Err(err) => Err(Reject::new(format!("field {name:?} does not read: {err}"))),
    }
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
        let bad = |text: &str| tally_sdk::periods::describe(&plugin, text.as_bytes()).unwrap_err();
        assert!(
            bad(r#"{"id":"x","customer":"a","metric":"calls","quantity":-3,"ts":"t"}"#)
                .contains("non-negative integer, got -3")
        );
        assert!(
            bad(r#"{"id":"x","customer":"a","metric":"calls","quantity":1.5,"ts":"t"}"#)
                .contains("got 1.5")
        );
        assert!(
            bad(r#"{"id":"x","customer":"a","metric":"disk","quantity":1,"ts":"t"}"#)
                .contains("metric \"disk\" has no meter")
        );
        assert!(
            bad(r#"{"customer":"a","metric":"calls","quantity":1,"ts":"t"}"#)
                .contains("missing field `id`")
        );
        assert!(
            bad(r#"{"id":"x","customer":"a","metric":"seats","ts":"t","user":3}"#)
                .contains("must be a string")
        );
        assert!(
            bad(r#"{"id":"x","customer":"a","id":"y","metric":"calls","quantity":1,"ts":"t"}"#)
                .contains("duplicate field `id`")
        );
        assert!(
            bad(r#"{"id":7,"customer":"a","metric":"calls","quantity":1,"ts":"t"}"#)
                .contains("invalid type: integer `7`")
        );
        assert!(bad("[1]").contains(r#"expected a usage event {"id", "#));
        assert!(
            bad(r#"{"id":"x","customer":"a","metric":"seats","ts":"t"}"#)
                .contains(r#"field "user" (counted by unique_count) is missing"#)
        );
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
