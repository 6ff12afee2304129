//! Period plugins (`tally:plugin@0.2.0`): the typed way to write the
//! aggregation of a job that declares `[periods]`.
//!
//! The host owns event time in such a job: it assigns each event to its
//! customer's calendar period, keeps watermarks, closes periods, de-
//! duplicates event ids and writes the FINAL and ADJUSTMENT records (see
//! `docs/periods.md`). A period plugin says only what the host cannot
//! know: what an event says about itself and what it adds to its period
//! ([`Periods::describe`]: its [`Facts`] and their addend), how an addend
//! changes a period's state ([`Periods::add`]; the host hands a batch's
//! addends over in one call, and the SDK folds them, [`add_all`]) and a
//! period's value ([`Periods::value`]). An event is read once, by
//! `describe`: the host keeps its addend and hands that to `add`. Each is
//! a pure function: the plugin has no state of its own, and the host may
//! call it again with the same arguments.
//!
//! ```
//! use serde::Deserialize;
//! use tally_sdk::{EventTime, Facts, Instant, Periods, Reject};
//!
//! #[derive(Deserialize)]
//! struct Call<'a> { id: &'a str, customer: &'a str, ts: &'a str }
//!
//! /// Calls per customer and period.
//! struct CallsPerPeriod;
//!
//! impl Periods for CallsPerPeriod {
//!     type Config = serde_json::Value;
//!     type Event<'a> = Call<'a>;
//!     type Addend = ();
//!     type State = u64;
//!
//!     fn new(_config: serde_json::Value) -> Result<Self, String> {
//!         Ok(CallsPerPeriod)
//!     }
//!     fn describe(&self, call: Call<'_>) -> Result<Facts<()>, Reject> {
//!         Ok(Facts {
//!             id: call.id.to_string(),
//!             time: EventTime::Rfc3339(call.ts.to_string()),
//!             key: vec![("customer".into(), call.customer.to_string())],
//!             customer: call.customer.to_string(),
//!             addend: (),
//!         })
//!     }
//!     fn add(&self, calls: Option<u64>, _time: Instant, _call: ()) -> Result<u64, Reject> {
//!         Ok(calls.unwrap_or(0) + 1)
//!     }
//!     fn value(&self, calls: &u64) -> u64 {
//!         *calls
//!     }
//! }
//!
//! tally_sdk::export_periods!(CallsPerPeriod);
//! ```

use serde::Serialize;
use serde::de::{Deserialize, DeserializeOwned};

use crate::aggregate::Reject;

/// When an event happened, as found in it: the host parses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventTime {
    /// An RFC 3339 instant with its offset (`2026-11-03T10:00:00Z`).
    Rfc3339(String),
    /// Milliseconds since the Unix epoch.
    UnixMillis(i64),
}

/// What an event says about itself: its id, time, aggregation key and the
/// customer whose time zone decides its period; and what it adds to its
/// period (`A`: the plugin's [`Periods::Addend`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts<A> {
    /// The producer's id of the event; a retry carries the same one (at
    /// most 256 bytes).
    pub id: String,
    /// When it happened.
    pub time: EventTime,
    /// The aggregation key's fields, in order (`customer`, `metric`): each
    /// period is one key's, and its records carry these fields.
    pub key: Vec<(String, String)>,
    /// The customer whose time zone decides the event's period.
    pub customer: String,
    /// What the event adds to its period: the host keeps it (as JSON, at
    /// most the job's `limits.max_value_bytes`) and hands it to
    /// [`Periods::add`] in place of the event.
    pub addend: A,
}

/// An instant as the host read an event's time: seconds since the Unix
/// epoch and nanoseconds within the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant {
    /// Seconds since 1970-01-01T00:00:00Z.
    pub seconds: i64,
    /// Nanoseconds within the second (0 to 999,999,999).
    pub nanoseconds: u32,
}

/// The aggregation of a period job.
///
/// Events, the configuration, addends and each period's state travel as
/// JSON: an event that does not decode is dead-lettered with the
/// decoder's reason.
pub trait Periods: Sized + Send + Sync + 'static {
    /// The job file's `[plugin_config]`, decoded from JSON.
    type Config: DeserializeOwned;
    /// An input event, decoded from each record's JSON value (it may
    /// borrow from the record).
    type Event<'a>: Deserialize<'a>;
    /// What an event adds to its period (its quantity, say): made by
    /// [`Periods::describe`], kept by the host as JSON, and folded into
    /// the period's state by [`Periods::add`]. Keep it small: it is all
    /// `add` gets of the event.
    type Addend: Serialize + DeserializeOwned;
    /// A period's state (stored by the host as JSON).
    type State: Serialize + DeserializeOwned;

    /// The plugin configured for the job, or why the configuration is
    /// refused (the job does not start, with this message).
    fn new(config: Self::Config) -> Result<Self, String>;

    /// What `event` says about itself and adds to its period, or why it is
    /// malformed.
    fn describe(&self, event: Self::Event<'_>) -> Result<Facts<Self::Addend>, Reject>;

    /// A period's state after an event's `addend` (the event's time read
    /// by the host as `time`) is added to `state` (`None`: the period's
    /// first event), or why the event is refused (it then counts for
    /// nothing).
    fn add(
        &self,
        state: Option<Self::State>,
        time: Instant,
        addend: Self::Addend,
    ) -> Result<Self::State, Reject>;

    /// The value of a period whose state is `state`: what its FINAL and
    /// ADJUSTMENT records carry.
    fn value(&self, state: &Self::State) -> u64;
}

/// Decodes the configuration and makes the plugin.
pub fn configure<P: Periods>(config: &str) -> Result<P, String> {
    let config = serde_json::from_str(config)
        .map_err(|err| format!("[plugin_config] does not fit this plugin: {err}"))?;
    P::new(config)
}

/// What `value` (one record's bytes) says about itself, with its addend
/// encoded as the host keeps it. A record that does not decode is refused
/// in the words every SDK uses (`event is not UTF-8`, `event is not valid
/// JSON`, or the event type's own message without serde_json's position;
/// see `docs/billing.md`).
pub fn describe<P: Periods>(plugin: &P, value: &[u8]) -> Result<Facts<Vec<u8>>, String> {
    let event: P::Event<'_> = crate::aggregate::decode_event(value)?;
    let facts = plugin.describe(event).map_err(|reject| reject.0)?;
    let addend = serde_json::to_vec(&facts.addend)
        .map_err(|err| format!("its addend does not encode: {err}"))?;
    let Facts { id, time, key, customer, addend: _ } = facts;
    Ok(Facts { id, time, key, customer, addend })
}

/// One event to fold into a period: the index of the period's state in
/// the call, the event's time as the host read it, and its addend as
/// [`describe`] encoded it.
#[derive(Debug, Clone, Copy)]
pub struct Addition<'a> {
    /// Index of the period's state.
    pub period: usize,
    /// The event's time.
    pub time: Instant,
    /// The event's addend (its JSON).
    pub addend: &'a [u8],
}

/// Folds `additions`, in order, into `states` (`None`: a period without an
/// event yet): each period's state after the fold, in order; or the first
/// addition refused (its index) and why. Each state is decoded once and
/// encoded once, however many events it takes.
pub fn add_all<P: Periods>(
    plugin: &P,
    states: &[Option<Vec<u8>>],
    additions: &[Addition<'_>],
) -> Result<Vec<Vec<u8>>, (usize, String)> {
    let mut decoded: Vec<Option<P::State>> = Vec::with_capacity(states.len());
    for state in states {
        decoded.push(match state {
            Some(bytes) => Some(
                serde_json::from_slice(bytes)
                    .map_err(|err| (0, format!("a period's state does not decode: {err}")))?,
            ),
            None => None,
        });
    }
    for (index, addition) in additions.iter().enumerate() {
        let count = decoded.len();
        let Some(slot) = decoded.get_mut(addition.period) else {
            return Err((
                index,
                format!("the addition names period {}, of {count}", addition.period),
            ));
        };
        let addend: P::Addend = serde_json::from_slice(addition.addend).map_err(|err| {
            (index, format!("the event's addend is not the JSON this plugin makes: {err}"))
        })?;
        let next =
            plugin.add(slot.take(), addition.time, addend).map_err(|reject| (index, reject.0))?;
        *slot = Some(next);
    }
    decoded
        .into_iter()
        .enumerate()
        .map(|(period, state)| match state {
            Some(state) => Ok(serde_json::to_vec(&state).expect("a period's state serializes")),
            None => Err((0, format!("period {period} has neither a state nor an addition"))),
        })
        .collect()
}

/// The state after the encoded `addend` (of an event at `time`) is added
/// to `state`: a fold of one addition.
pub fn add<P: Periods>(
    plugin: &P,
    state: Option<&[u8]>,
    time: Instant,
    addend: &[u8],
) -> Result<Vec<u8>, String> {
    let states = [state.map(<[u8]>::to_vec)];
    let addition = Addition { period: 0, time, addend };
    let mut folded = add_all(plugin, &states, &[addition]).map_err(|(_, reason)| reason)?;
    Ok(folded.pop().unwrap_or_default())
}

/// The value of the period whose state is `state`.
pub fn value<P: Periods>(plugin: &P, state: &[u8]) -> u64 {
    let state: P::State = serde_json::from_slice(state)
        .unwrap_or_else(|err| panic!("a period's state does not decode: {err}"));
    plugin.value(&state)
}
