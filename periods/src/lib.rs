//! Billing periods, owned by the host: which calendar period of a
//! customer's time zone an event falls in ([`calendar`]), a job's
//! `[periods]` table ([`settings`]), and the rules that decide, record by
//! record, what an event does to its period. Pure logic: no store, no
//! Kafka client, no Wasm engine, so the host and every SDK's test driver
//! apply the very same rules. See `docs/periods.md`.
#![warn(missing_docs)]

pub mod calendar;
pub mod codec;
pub mod rules;
pub mod settings;

pub use calendar::{Calendar, OutOfRange, Period, UnknownZone, Zone, time_zone_database};
pub use rules::{
    Addition, Aggregation, AggregationKey, EventFacts, Folded, Offer, Offered, PartitionPeriods,
    PeriodCounts, PeriodRecord, Verdict, refusal_of_facts, refused_by_rule,
};
pub use settings::{InvalidPeriods, PeriodSettings, PeriodsTable};
