//! A job's `[periods]` table: the calendar, how long a period waits for
//! late events, how long its event ids are remembered, and each customer's
//! time zone. Every value is checked when the job starts; a refusal names
//! the key, the value and the fix.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Span, SpanRelativeTo};

use super::calendar::{Calendar, Zone};

/// `grace` when the job does not set it (Metronome's).
pub const DEFAULT_GRACE: &str = "24h";
/// `horizon` when the job does not set it (Stripe's limit on late meter
/// events); the de-duplication window follows it.
pub const DEFAULT_HORIZON: &str = "35d";
/// `max_future` when the job does not set it.
pub const DEFAULT_MAX_FUTURE: &str = "5m";
/// `idle_timeout` when the job does not set it.
pub const DEFAULT_IDLE_TIMEOUT: &str = "60s";
/// `max_grace` when the job does not set it: a grace longer than this
/// holds invoices back, and must be asked for.
pub const DEFAULT_MAX_GRACE: &str = "72h";
/// `default_time_zone` when the job does not set it.
pub const DEFAULT_TIME_ZONE: &str = "UTC";
/// The output FINAL and ADJUSTMENT records go to, when the table does not say.
pub const DEFAULT_OUTPUT: &str = "periods";
/// Most customers a job may give a time zone of their own.
pub const MAX_TIME_ZONES: usize = 100_000;

/// The `[periods]` table as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeriodsTable {
    /// The output FINAL and ADJUSTMENT records go to.
    #[serde(default)]
    pub output: Option<String>,
    /// `month` or `day`.
    #[serde(default)]
    pub calendar: Option<String>,
    /// How long after its end a period waits for late events before its
    /// FINAL record.
    #[serde(default)]
    pub grace: Option<String>,
    /// How long after its end a period's state and event ids are kept: a
    /// later event is too old, and a retry within it is still recognised.
    #[serde(default)]
    pub horizon: Option<String>,
    /// How far past its arrival an event's time may lie.
    #[serde(default)]
    pub max_future: Option<String>,
    /// How long a partition read to its end waits before it is idle.
    #[serde(default)]
    pub idle_timeout: Option<String>,
    /// The longest `grace` allowed.
    #[serde(default)]
    pub max_grace: Option<String>,
    /// The zone of a customer `time_zones` does not name.
    #[serde(default)]
    pub default_time_zone: Option<String>,
    /// Each customer's zone.
    #[serde(default)]
    pub time_zones: BTreeMap<String, String>,
    /// The most event ids one partition remembers (no bound if unset).
    #[serde(default)]
    pub max_seen_ids: Option<u64>,
}

/// A `[periods]` value out of range or inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("periods.{key} = {value:?}: {problem}")]
pub struct InvalidPeriods {
    /// The key, e.g. `grace` or `time_zones.acme`.
    pub key: String,
    /// Its value as written.
    pub value: String,
    /// What is wrong, and the fix.
    pub problem: String,
}

/// A job's billing periods, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeriodSettings {
    /// The output FINAL and ADJUSTMENT records go to (one the job declares).
    pub output: String,
    /// How long a period is.
    pub calendar: Calendar,
    /// How long after its end a period waits before its FINAL record.
    pub grace: SignedDuration,
    /// How long after its end a period's state and event ids are kept.
    pub horizon: SignedDuration,
    /// How far past its arrival an event's time may lie.
    pub max_future: SignedDuration,
    /// How long a partition read to its end waits before it is idle.
    pub idle_timeout: SignedDuration,
    /// The zone of a customer not in `time_zones`.
    pub default_time_zone: Zone,
    /// Each named customer's zone.
    pub time_zones: BTreeMap<String, Zone>,
    /// The most event ids one partition remembers: an event with a new id
    /// past it is refused (never counted without its id remembered).
    pub max_seen_ids: u64,
}

impl PeriodSettings {
    /// The zone whose calendar `customer`'s periods follow.
    pub fn zone_of(&self, customer: &str) -> &Zone {
        self.time_zones.get(customer).unwrap_or(&self.default_time_zone)
    }
}

impl TryFrom<PeriodsTable> for PeriodSettings {
    type Error = InvalidPeriods;

    fn try_from(table: PeriodsTable) -> Result<PeriodSettings, InvalidPeriods> {
        let calendar_name = table.calendar.as_deref().unwrap_or("month");
        let calendar = Calendar::named(calendar_name).ok_or_else(|| InvalidPeriods {
            key: "calendar".into(),
            value: calendar_name.into(),
            problem: "the calendars are `month` and `day`".into(),
        })?;
        let grace = duration("grace", table.grace.as_deref(), DEFAULT_GRACE)?;
        let horizon = duration("horizon", table.horizon.as_deref(), DEFAULT_HORIZON)?;
        let max_future = duration("max_future", table.max_future.as_deref(), DEFAULT_MAX_FUTURE)?;
        let idle_timeout =
            duration("idle_timeout", table.idle_timeout.as_deref(), DEFAULT_IDLE_TIMEOUT)?;
        let max_grace = duration("max_grace", table.max_grace.as_deref(), DEFAULT_MAX_GRACE)?;
        let written = |value: &Option<String>, default: &str| {
            value.clone().unwrap_or_else(|| default.to_string())
        };
        if grace > max_grace {
            return Err(InvalidPeriods {
                key: "grace".into(),
                value: written(&table.grace, DEFAULT_GRACE),
                problem: format!(
                    "a grace over {} holds every FINAL back that long; shorten it, or raise periods.max_grace",
                    written(&table.max_grace, DEFAULT_MAX_GRACE)
                ),
            });
        }
        if grace > horizon {
            return Err(InvalidPeriods {
                key: "grace".into(),
                value: written(&table.grace, DEFAULT_GRACE),
                problem: format!(
                    "it ends after periods.horizon ({}), when a period's state is gone; make the horizon at least the grace",
                    written(&table.horizon, DEFAULT_HORIZON)
                ),
            });
        }
        let zone = |key: String, name: &str| {
            Zone::named(name).map_err(|err| InvalidPeriods {
                key,
                value: name.to_string(),
                problem: err.to_string(),
            })
        };
        let default_name = table.default_time_zone.as_deref().unwrap_or(DEFAULT_TIME_ZONE);
        let default_time_zone = zone("default_time_zone".into(), default_name)?;
        if table.time_zones.len() > MAX_TIME_ZONES {
            return Err(InvalidPeriods {
                key: "time_zones".into(),
                value: format!("{} customers", table.time_zones.len()),
                problem: format!(
                    "at most {MAX_TIME_ZONES} customers may have a zone of their own; give the most common zone as periods.default_time_zone"
                ),
            });
        }
        let mut time_zones = BTreeMap::new();
        for (customer, name) in &table.time_zones {
            time_zones.insert(customer.clone(), zone(format!("time_zones.{customer}"), name)?);
        }
        Ok(PeriodSettings {
            output: table.output.unwrap_or_else(|| DEFAULT_OUTPUT.to_string()),
            calendar,
            grace,
            horizon,
            max_future,
            idle_timeout,
            default_time_zone,
            time_zones,
            max_seen_ids: match table.max_seen_ids {
                Some(0) => {
                    return Err(InvalidPeriods {
                        key: "max_seen_ids".into(),
                        value: "0".into(),
                        problem: "a partition that may remember no event id can count none; give a bound above zero, or leave it unset".into(),
                    });
                }
                Some(max) => max,
                None => u64::MAX,
            },
        })
    }
}

/// Parses `key`'s duration (`48h`, `35d`, `5m`, `90s`, or ISO 8601 such as
/// `PT48H`; a day is 24 hours), or `default`; it must be positive.
fn duration(
    key: &str,
    value: Option<&str>,
    default: &str,
) -> Result<SignedDuration, InvalidPeriods> {
    let text = value.unwrap_or(default);
    let invalid =
        |problem: String| InvalidPeriods { key: key.to_string(), value: text.to_string(), problem };
    let span: Span = text.parse().map_err(|_| {
        invalid("write a duration such as \"48h\", \"35d\", \"5m\" or \"90s\"".into())
    })?;
    let length = span.to_duration(SpanRelativeTo::days_are_24_hours()).map_err(|_| {
        invalid("months and years have no fixed length; give days instead (\"35d\")".into())
    })?;
    if length <= SignedDuration::ZERO {
        return Err(invalid("it must be longer than zero".into()));
    }
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(toml_lines: &str) -> Result<PeriodSettings, InvalidPeriods> {
        let table: PeriodsTable = serde_json::from_str(toml_lines).unwrap();
        PeriodSettings::try_from(table)
    }

    fn hours(hours: i64) -> SignedDuration {
        SignedDuration::from_hours(hours)
    }

    #[test]
    fn an_empty_table_gets_the_documented_defaults() {
        let defaults = settings("{}").unwrap();
        assert_eq!(defaults.calendar, Calendar::Month);
        assert_eq!(defaults.grace, hours(24));
        assert_eq!(defaults.horizon, hours(35 * 24));
        assert_eq!(defaults.max_future, SignedDuration::from_mins(5));
        assert_eq!(defaults.idle_timeout, SignedDuration::from_secs(60));
        assert_eq!(defaults.default_time_zone.name(), "UTC");
        assert_eq!(defaults.zone_of("anyone").name(), "UTC");
    }

    #[test]
    fn customers_get_their_zone_and_others_the_default() {
        let periods = settings(
            r#"{"calendar": "day", "grace": "48h", "horizon": "PT840H",
                "default_time_zone": "Europe/Paris",
                "time_zones": {"acme": "America/New_York", "globex": "Australia/Lord_Howe"}}"#,
        )
        .unwrap();
        assert_eq!(periods.calendar, Calendar::Day);
        assert_eq!(periods.grace, hours(48));
        assert_eq!(periods.horizon, hours(840));
        assert_eq!(periods.zone_of("acme").name(), "America/New_York");
        assert_eq!(periods.zone_of("globex").name(), "Australia/Lord_Howe");
        assert_eq!(periods.zone_of("initech").name(), "Europe/Paris");
    }

    #[test]
    fn every_refusal_names_the_key_the_value_and_the_fix() {
        let refusals = [
            (r#"{"calendar": "week"}"#, "periods.calendar = \"week\": the calendars are"),
            (r#"{"grace": "0s"}"#, "periods.grace = \"0s\": it must be longer than zero"),
            (r#"{"grace": "-5h"}"#, "periods.grace = \"-5h\": it must be longer than zero"),
            (r#"{"horizon": "soon"}"#, "periods.horizon = \"soon\": write a duration"),
            (
                r#"{"horizon": "1mo"}"#,
                "periods.horizon = \"1mo\": months and years have no fixed length",
            ),
            (r#"{"grace": "96h"}"#, "periods.grace = \"96h\": a grace over 72h"),
            (
                r#"{"grace": "30d", "max_grace": "40d", "horizon": "20d"}"#,
                "periods.grace = \"30d\": it ends after periods.horizon (20d)",
            ),
            (
                r#"{"default_time_zone": "EST5"}"#,
                "periods.default_time_zone = \"EST5\": `EST5` is not a time zone",
            ),
            (
                r#"{"time_zones": {"acme": "america/new_york"}}"#,
                "periods.time_zones.acme = \"america/new_york\": time zone `america/new_york` is spelled `America/New_York`",
            ),
        ];
        for (table, expected) in refusals {
            let refusal = settings(table).unwrap_err().to_string();
            assert!(refusal.starts_with(expected), "{table}: {refusal}");
        }
        // Raised explicitly, a long grace is allowed.
        assert_eq!(settings(r#"{"grace": "96h", "max_grace": "5d"}"#).unwrap().grace, hours(96));
    }
}
