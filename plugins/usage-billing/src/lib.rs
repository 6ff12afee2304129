//! Usage billing: the running total of metered usage per customer, metric
//! and billing period (the UTC calendar month of the event's timestamp).
//!
//! Input: `{"customer":"acme","metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}`.
//! Every accepted event emits the key's new total to the `totals` output:
//! the record key is the [`BillingKey`], the value the total.
//!
//! The rules, and the reason each refused event gets, are
//! `docs/billing.md`: the JavaScript build (`plugins/usage-billing-js`)
//! follows the same ones, byte for byte.

use std::borrow::Cow;
use std::fmt;

use compact_str::CompactString;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use tally_sdk::{Aggregate, Reject};

/// One metered usage event. Its strings borrow from the record unless they
/// hold escapes: copying them was a tenth of the plugin's time. The
/// quantity is kept as written, so it is judged exactly (and echoed as
/// written when it is refused).
pub struct Usage<'a> {
    customer: Cow<'a, str>,
    metric: Cow<'a, str>,
    quantity: &'a RawValue,
    ts: Cow<'a, str>,
}

/// The four fields, in the order they are checked.
const FIELDS: [&str; 4] = ["customer", "metric", "quantity", "ts"];

impl<'de> Deserialize<'de> for Usage<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UsageVisitor)
    }
}

struct UsageVisitor;

/// A field name, matched without allocating (escaped names unescaped first).
enum Field {
    /// One of [`FIELDS`], by index.
    Known(usize),
    /// Any other field: ignored.
    Other,
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldVisitor;
        impl Visitor<'_> for FieldVisitor {
            type Value = Field;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Field, E> {
                Ok(FIELDS
                    .iter()
                    .position(|field| *field == name)
                    .map_or(Field::Other, Field::Known))
            }
        }
        deserializer.deserialize_identifier(FieldVisitor)
    }
}

impl<'de> Visitor<'de> for UsageVisitor {
    type Value = Usage<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Usage<'de>, M::Error> {
        // Every field is taken as written and judged after the whole object
        // is read, in a fixed order, so the reason does not depend on the
        // order the fields came in.
        let mut seen: [Option<&'de RawValue>; 4] = [None; 4];
        let mut twice = [false; 4];
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Known(index) => {
                    let value = map.next_value::<&'de RawValue>()?;
                    twice[index] |= seen[index].replace(value).is_some();
                }
                Field::Other => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        for (index, field) in FIELDS.iter().enumerate() {
            if twice[index] {
                return Err(de::Error::custom(format_args!("field `{field}` is given twice")));
            }
            if seen[index].is_none() {
                return Err(de::Error::custom(format_args!("field `{field}` is missing")));
            }
        }
        let text = |index: usize| -> Result<Cow<'de, str>, M::Error> {
            let raw: &'de RawValue = seen[index].expect("checked above");
            let written = raw.get();
            match written.strip_prefix('"').and_then(|rest| rest.strip_suffix('"')) {
                // Most strings hold no escape: they are the text between
                // their quotes, read once.
                Some(plain) if !plain.bytes().any(|b| b == b'\\' || b < 0x20) => {
                    Ok(Cow::Borrowed(plain))
                }
                // Escapes are unescaped into a copy; a string that does not
                // unescape (a lone surrogate, a control character) is not JSON.
                Some(_) => String::deserialize(raw)
                    .map(Cow::Owned)
                    .map_err(|_| de::Error::custom("event is not valid JSON")),
                None => Err(de::Error::custom(format_args!(
                    "field `{}` must be a string",
                    FIELDS[index]
                ))),
            }
        };
        let customer = text(0)?;
        let metric = text(1)?;
        let quantity = seen[2].expect("checked above");
        if !quantity.get().starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
            return Err(de::Error::custom("field `quantity` must be a number"));
        }
        Ok(Usage { customer, metric, quantity, ts: text(3)? })
    }

    fn visit_unit<E: de::Error>(self) -> Result<Usage<'de>, E> {
        Err(E::custom("event must be a JSON object"))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Usage<'de>, E> {
        Err(E::custom("event must be a JSON object"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Usage<'de>, E> {
        Err(E::custom("event must be a JSON object"))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Usage<'de>, E> {
        Err(E::custom("event must be a JSON object"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Usage<'de>, E> {
        Err(E::custom("event must be a JSON object"))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Usage<'de>, E> {
        Err(E::custom("event must be a JSON object"))
    }
    fn visit_seq<S: de::SeqAccess<'de>>(self, mut seq: S) -> Result<Usage<'de>, S::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Err(de::Error::custom("event must be a JSON object"))
    }
}

/// What is billed together: one customer, one metric, one month (`2026-11`).
/// Its strings are stored inline up to 24 bytes: every event builds a key
/// to look up, and allocating and freeing three `String`s per event was
/// about 6% of the job loop's time.
#[derive(Serialize, Deserialize, PartialEq, Eq, Hash, Clone, Debug)]
pub struct BillingKey {
    pub customer: CompactString,
    pub metric: CompactString,
    pub period: CompactString,
}

/// The billing aggregation.
#[derive(Default)]
pub struct UsageBilling;

impl Aggregate for UsageBilling {
    type Event<'a> = Usage<'a>;
    type Key = BillingKey;
    type State = u64;
    type Output = u64;
    const OUTPUT: &'static str = "totals";

    fn key(&self, usage: &Usage<'_>) -> Result<BillingKey, Reject> {
        let period = billing_period(&usage.ts).ok_or_else(|| {
            let shown = serde_json::to_string(&usage.ts).expect("a string is JSON");
            Reject(format!(
                "ts must be an RFC 3339 timestamp like 2026-11-03T10:00:00Z, got {shown}"
            ))
        })?;
        Ok(BillingKey {
            customer: CompactString::new(&usage.customer),
            metric: CompactString::new(&usage.metric),
            period,
        })
    }

    fn apply(&self, _key: &BillingKey, total: &u64, usage: Usage<'_>) -> Result<u64, Reject> {
        let text = usage.quantity.get();
        let quantity = Some(text)
            .filter(|text| text.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|text| text.parse::<u64>().ok())
            .ok_or_else(|| {
                Reject(format!("quantity must be a non-negative integer, got {text}"))
            })?;
        total
            .checked_add(quantity)
            .ok_or_else(|| Reject(format!("total would overflow adding {quantity}")))
    }

    fn emit(&self, _key: &BillingKey, total: &u64) -> Option<u64> {
        Some(*total)
    }
}

/// `YYYY-MM` of the UTC month of RFC 3339 timestamp `ts` (the grammar in
/// `docs/billing.md`), or `None` if it is not one. Written digit by digit:
/// this runs for every event, and `format!` cost more than the rest of `key`.
fn billing_period(ts: &str) -> Option<CompactString> {
    let b = ts.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<u32> {
        let part = b.get(range)?;
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let mut rest = &b[19..];
    if let [b'.', fraction @ ..] = rest {
        let digits = fraction.iter().take_while(|d| d.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        rest = &fraction[digits..];
    }
    let offset_minutes: i32 = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let field = |a: u8, b: u8| {
                (a.is_ascii_digit() && b.is_ascii_digit())
                    .then(|| i32::from(a - b'0') * 10 + i32::from(b - b'0'))
            };
            let (hours, minutes) = (field(*h1, *h2)?, field(*m1, *m2)?);
            if hours > 23 || minutes > 59 {
                return None;
            }
            if *sign == b'-' { -(hours * 60 + minutes) } else { hours * 60 + minutes }
        }
        _ => return None,
    };
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let (mut year, mut month) = (year as i32, month);
    let minutes = (hour * 60 + minute) as i32 - offset_minutes;
    if minutes < 0 && day == 1 {
        (year, month) = if month == 1 { (year - 1, 12) } else { (year, month - 1) };
    } else if minutes >= 24 * 60 && day == days_in(year as u32, month) {
        (year, month) = if month == 12 { (year + 1, 1) } else { (year, month + 1) };
    }
    Some(period_text(year, month))
}

/// Days in `month` of `year` (Gregorian, leap years included).
fn days_in(year: u32, month: u32) -> u32 {
    let leap = year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400));
    [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month as usize - 1]
}

/// `YYYY-MM`, the year clamped to four digits.
fn period_text(year: i32, month: u32) -> CompactString {
    let year = year.clamp(0, 9999) as u32;
    let digit = |value: u32| b'0' + value as u8;
    let text = [
        digit(year / 1000),
        digit(year / 100 % 10),
        digit(year / 10 % 10),
        digit(year % 10),
        b'-',
        digit(month / 10),
        digit(month % 10),
    ];
    CompactString::from_utf8(text).expect("digits and a dash are UTF-8")
}

tally_sdk::export!(UsageBilling);

#[cfg(test)]
mod tests {
    use super::{billing_period, period_text};

    #[test]
    fn periods_are_zero_padded_year_and_month() {
        assert_eq!(period_text(2026, 3), "2026-03");
        assert_eq!(period_text(2026, 12), "2026-12");
        assert_eq!(period_text(987, 1), "0987-01");
        assert_eq!(period_text(-1, 12), "0000-12");
    }

    #[test]
    fn the_period_is_the_utc_month() {
        let period = |ts| billing_period(ts).map(|period| period.to_string());
        assert_eq!(period("2026-11-03T10:00:00Z").as_deref(), Some("2026-11"));
        assert_eq!(period("2026-12-01T00:30:00+01:00").as_deref(), Some("2026-11"));
        assert_eq!(period("2026-11-30T23:30:00-01:00").as_deref(), Some("2026-12"));
        assert_eq!(period("2026-12-31T23:59:60.123456789-00:30").as_deref(), Some("2027-01"));
        assert_eq!(period("2024-02-29t12:00:00z").as_deref(), Some("2024-02"));
        for bad in [
            "2026-02-29T00:00:00Z",
            "2026-11-03 10:00:00Z",
            "2026-11-03T24:00:00Z",
            "2026-11-03T10:00:00",
            "2026-11-03T10:00:00.Z",
            "2026-11-03T10:00:00+24:00",
            "２026-11-03T10:00:00Z",
        ] {
            assert_eq!(period(bad), None, "{bad}");
        }
    }
}
