//! Keyed aggregations: the typed way to write a plugin.

use std::fmt;
use std::hash::Hash;
use std::ops::Range;

use rustc_hash::FxHashMap;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::types::{Event, Host, OutputRecord, Plugin, Rejection};

/// Why an event is refused. The reason reaches the dead-letter output as is,
/// so say what is wrong and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject(pub String);

impl Reject {
    /// A rejection with the given reason.
    pub fn new(reason: impl Into<String>) -> Self {
        Reject(reason.into())
    }
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A keyed aggregation: each event is mapped to a key, folded into that
/// key's state, and the new state may be emitted.
///
/// `apply` is pure: it gets the current state and returns the next one, so a
/// rejected event cannot leave a half-applied change behind. A key that has
/// never been written starts from `State::default()`.
pub trait Aggregate {
    /// The input event, decoded from each record's JSON value. It may
    /// borrow from the record (`&'a str`, or `Cow<'a, str>` with
    /// `#[serde(borrow)]`), which saves copying its strings; an owned type
    /// ignores the lifetime: `type Event<'a> = Click;`.
    type Event<'a>: Deserialize<'a>;
    /// The state key (stored as JSON).
    type Key: Serialize + Eq + Hash;
    /// The state per key (stored as JSON).
    type State: Serialize + DeserializeOwned + Default;
    /// What [`Aggregate::emit`] produces (emitted as JSON).
    type Output: Serialize;
    /// The output that emitted records go to; the job must declare it.
    const OUTPUT: &'static str;

    /// The key an event belongs to, or why the event is refused.
    fn key(&self, event: &Self::Event<'_>) -> Result<Self::Key, Reject>;

    /// The key's next state after `event`, or why the event is refused.
    fn apply(
        &self,
        key: &Self::Key,
        state: &Self::State,
        event: Self::Event<'_>,
    ) -> Result<Self::State, Reject>;

    /// What to emit after an update; nothing by default.
    fn emit(&self, _key: &Self::Key, _state: &Self::State) -> Option<Self::Output> {
        None
    }
}

impl<A: Aggregate> Plugin for A {
    fn process(&self, events: Vec<Event>, host: &mut dyn Host) -> Vec<Rejection> {
        run_aggregate(self, events, host)
    }
}

/// One key touched by a batch.
struct Slot<S> {
    encoded_key: Vec<u8>,
    state: S,
    dirty: bool,
}

/// Runs one batch of an [`Aggregate`] against `host` with three host calls.
///
/// Panics (a trap, inside a component) if a stored state value does not
/// decode as `A::State`: that is a plugin upgrade that changed its state
/// format, not a bad event.
pub fn run_aggregate<A: Aggregate + ?Sized>(
    agg: &A,
    events: Vec<Event>,
    host: &mut dyn Host,
) -> Vec<Rejection> {
    let mut rejections = Vec::new();
    // Fx: keys are the plugin's own, so no flooding defence is needed, and
    // SipHash costs more than the rest of a billing update.
    let mut slot_of_key: FxHashMap<A::Key, usize> = FxHashMap::default();
    let mut slots: Vec<Slot<A::State>> = Vec::new();
    let mut accepted: Vec<(u32, usize, A::Event<'_>)> = Vec::with_capacity(events.len());

    for (index, event) in events.iter().enumerate() {
        let index = index as u32;
        let decoded = match decode_event::<A::Event<'_>>(&event.value) {
            Ok(decoded) => decoded,
            Err(reason) => {
                rejections.push(Rejection { index, reason });
                continue;
            }
        };
        let key = match agg.key(&decoded) {
            Ok(key) => key,
            Err(reject) => {
                rejections.push(Rejection { index, reason: reject.0 });
                continue;
            }
        };
        let slot = match slot_of_key.get(&key) {
            Some(&slot) => slot,
            None => {
                let encoded_key =
                    serde_json::to_vec(&key).expect("a state key must serialize to JSON");
                slots.push(Slot { encoded_key, state: A::State::default(), dirty: false });
                slot_of_key.insert(key, slots.len() - 1);
                slots.len() - 1
            }
        };
        accepted.push((index, slot, decoded));
    }
    if accepted.is_empty() {
        return rejections;
    }

    let keys: Vec<&[u8]> = slots.iter().map(|slot| slot.encoded_key.as_slice()).collect();
    let stored = host.get_many(&keys);
    for (slot, stored) in slots.iter_mut().zip(stored) {
        if let Some(bytes) = stored {
            slot.state = serde_json::from_slice(&bytes).unwrap_or_else(|err| {
                panic!("stored state does not decode as this plugin's state type ({err}); a plugin upgrade must keep the state format")
            });
        }
    }

    let key_of_slot: Vec<&A::Key> = {
        let mut keys: Vec<Option<&A::Key>> = vec![None; slots.len()];
        for (key, &slot) in &slot_of_key {
            keys[slot] = Some(key);
        }
        keys.into_iter().map(|key| key.expect("every slot has a key")).collect()
    };
    // Output values and new states are written into one buffer each, and
    // handed to the host as slices of it: no allocation per record.
    let mut values = Vec::new();
    let mut emitted: Vec<(u32, usize, Range<usize>)> = Vec::with_capacity(accepted.len());
    for (index, slot_index, event) in accepted {
        let key = key_of_slot[slot_index];
        let slot = &mut slots[slot_index];
        match agg.apply(key, &slot.state, event) {
            Ok(next) => {
                slot.state = next;
                slot.dirty = true;
                if let Some(output) = agg.emit(key, &slot.state) {
                    emitted.push((
                        index,
                        slot_index,
                        append_json(&mut values, &output, "an output"),
                    ));
                }
            }
            Err(reject) => rejections.push(Rejection { index, reason: reject.0 }),
        }
    }

    let mut states = Vec::new();
    let written: Vec<(usize, Range<usize>)> = slots
        .iter()
        .enumerate()
        .filter(|(_, slot)| slot.dirty)
        .map(|(slot_index, slot)| (slot_index, append_json(&mut states, &slot.state, "a state")))
        .collect();
    if !written.is_empty() {
        let entries: Vec<(&[u8], &[u8])> = written
            .into_iter()
            .map(|(slot, range)| (slots[slot].encoded_key.as_slice(), &states[range]))
            .collect();
        host.put_many(&entries);
    }
    if !emitted.is_empty() {
        let records: Vec<OutputRecord<'_>> = emitted
            .into_iter()
            .map(|(event, slot, range)| OutputRecord {
                event,
                key: Some(slots[slot].encoded_key.as_slice()),
                value: &values[range],
            })
            .collect();
        host.emit_many(A::OUTPUT, &records);
    }
    rejections.sort_by_key(|rejection| rejection.index);
    rejections
}

/// Most levels of arrays and objects a record may nest. serde_json skips
/// ignored values of any depth; every SDK refuses deeper records alike, so
/// the work per record stays bounded in each language.
pub const MAX_DEPTH: usize = 128;

/// Whether `text` nests arrays and objects more than [`MAX_DEPTH`] levels
/// deep (strings skipped). A record of fewer than two bytes per level
/// cannot, so the billing job's records are not scanned at all.
fn too_deep(text: &str) -> bool {
    if text.len() <= 2 * MAX_DEPTH {
        return false;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &byte in text.as_bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// A record decoded as an event, or why not in words every SDK uses (see
/// `docs/billing.md`). UTF-8 is checked once for the whole record, not
/// string by string.
pub(crate) fn decode_event<'a, T: Deserialize<'a>>(value: &'a [u8]) -> Result<T, String> {
    match std::str::from_utf8(value) {
        Ok(text) if too_deep(text) => Err("event is not valid JSON".to_string()),
        Ok(text) => serde_json::from_str::<T>(text).map_err(|err| {
            // The event type may refuse a record before the decoder has
            // read it all: a record that is not JSON says so first, as in
            // every other SDK. Only refused records are read again.
            match serde_json::from_str::<serde::de::IgnoredAny>(text) {
                Ok(_) => undecodable_reason(&err),
                Err(_) => "event is not valid JSON".to_string(),
            }
        }),
        Err(_) => Err("event is not UTF-8".to_string()),
    }
}

/// Why a record does not decode, in words every SDK uses (see
/// `docs/billing.md`): not JSON at all, or the event type's own message (a
/// missing field, a wrong type) without serde_json's position, which other
/// languages' decoders do not count the same way.
fn undecodable_reason(err: &serde_json::Error) -> String {
    if err.is_syntax() || err.is_eof() {
        return "event is not valid JSON".to_string();
    }
    let text = err.to_string();
    let position = format!(" at line {} column {}", err.line(), err.column());
    match text.strip_suffix(&position) {
        Some(message) if err.line() > 0 => message.to_string(),
        _ => text,
    }
}

/// Appends `value` to `buffer` as JSON; returns where it landed.
fn append_json(buffer: &mut Vec<u8>, value: &impl Serialize, what: &str) -> Range<usize> {
    let start = buffer.len();
    serde_json::to_writer(&mut *buffer, value)
        .unwrap_or_else(|err| panic!("{what} must serialize to JSON: {err}"));
    start..buffer.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Default)]
    struct MemoryHost {
        state: BTreeMap<Vec<u8>, Vec<u8>>,
        /// (output, event index, value) of each emitted record.
        outputs: Vec<(String, u32, Vec<u8>)>,
        calls: usize,
    }

    impl Host for MemoryHost {
        fn get_many(&mut self, keys: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
            self.calls += 1;
            keys.iter().map(|key| self.state.get(*key).cloned()).collect()
        }
        fn put_many(&mut self, entries: &[(&[u8], &[u8])]) {
            self.calls += 1;
            self.state.extend(entries.iter().map(|(key, value)| (key.to_vec(), value.to_vec())));
        }
        fn delete_many(&mut self, keys: &[&[u8]]) {
            self.calls += 1;
            for key in keys {
                self.state.remove(*key);
            }
        }
        fn emit_many(&mut self, output: &str, records: &[OutputRecord<'_>]) {
            self.calls += 1;
            self.outputs.extend(
                records
                    .iter()
                    .map(|record| (output.to_string(), record.event, record.value.to_vec())),
            );
        }
        fn log(&mut self, _level: crate::Level, _message: &str) {}
    }

    #[derive(Deserialize)]
    struct Add {
        who: String,
        n: i64,
    }

    #[derive(Default)]
    struct Sum;

    impl Aggregate for Sum {
        type Event<'a> = Add;
        type Key = String;
        type State = i64;
        type Output = i64;
        const OUTPUT: &'static str = "sums";

        fn key(&self, event: &Add) -> Result<String, Reject> {
            Ok(event.who.clone())
        }
        fn apply(&self, _key: &String, sum: &i64, event: Add) -> Result<i64, Reject> {
            if event.n < 0 {
                return Err(Reject::new("n must not be negative"));
            }
            Ok(sum + event.n)
        }
        fn emit(&self, _key: &String, sum: &i64) -> Option<i64> {
            Some(*sum)
        }
    }

    fn event(offset: u64, value: &str) -> Event {
        Event {
            partition: 0,
            offset,
            timestamp_ms: None,
            key: None,
            value: value.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_batch_folds_per_key_with_three_host_calls_and_rejects_without_changes() {
        let mut host = MemoryHost::default();
        host.state.insert(b"\"a\"".to_vec(), b"10".to_vec());
        let events = vec![
            event(0, r#"{"who":"a","n":1}"#),
            event(1, r#"{"who":"b","n":2}"#),
            event(2, r#"{"who":"a","n":-5}"#),
            event(3, "not json"),
            event(4, r#"{"who":"a","n":3}"#),
            event(5, r#"{"who":"c"}"#),
        ];
        let rejections = Sum.process(events, &mut host);
        assert_eq!(rejections.iter().map(|r| r.index).collect::<Vec<_>>(), vec![2, 3, 5]);
        assert_eq!(rejections[0].reason, "n must not be negative");
        assert_eq!(rejections[1].reason, "event is not valid JSON");
        assert_eq!(
            rejections[2].reason, "missing field `n`",
            "the event type's words, without serde_json's position"
        );
        assert_eq!(host.calls, 3);
        assert_eq!(host.state[b"\"a\"".as_slice()], b"14");
        assert_eq!(host.state[b"\"b\"".as_slice()], b"2");
        let emitted: Vec<(u32, String)> = host
            .outputs
            .iter()
            .map(|(_, event, value)| (*event, String::from_utf8(value.clone()).unwrap()))
            .collect();
        assert!(host.outputs.iter().all(|(output, _, _)| output == "sums"));
        assert_eq!(emitted, vec![(0, "11".into()), (1, "2".into()), (4, "14".into())]);
    }

    #[test]
    fn records_nested_deeper_than_the_limit_are_not_json_in_every_sdk() {
        let mut host = MemoryHost::default();
        let nested = |levels: usize| {
            format!(r#"{{"who":"a","n":1,"x":{}{}}}"#, "[".repeat(levels), "]".repeat(levels))
        };
        let events = vec![
            event(0, &nested(MAX_DEPTH - 1)),
            event(1, &nested(MAX_DEPTH)),
            event(2, &format!(r#"{{"who":"a","n":1,"x":"{}"}}"#, "[".repeat(300))),
        ];
        let rejections = Sum.process(events, &mut host);
        assert_eq!(rejections.len(), 1, "{rejections:?}");
        assert_eq!(
            (rejections[0].index, rejections[0].reason.as_str()),
            (1, "event is not valid JSON")
        );
    }

    #[test]
    fn a_record_that_is_not_utf8_is_rejected_with_a_reason() {
        let mut host = MemoryHost::default();
        let bad = Event { value: b"{\"who\":\"\xff\",\"n\":1}".to_vec(), ..event(0, "") };
        let rejections = Sum.process(vec![bad, event(1, r#"{"who":"a","n":1}"#)], &mut host);
        assert_eq!(rejections.len(), 1, "{rejections:?}");
        assert_eq!(rejections[0].reason, "event is not UTF-8");
        assert_eq!(host.state[b"\"a\"".as_slice()], b"1");
    }

    #[test]
    fn a_batch_of_only_bad_events_makes_no_host_calls() {
        let mut host = MemoryHost::default();
        let rejections = Sum.process(vec![event(0, "{}")], &mut host);
        assert_eq!(rejections.len(), 1);
        assert_eq!(host.calls, 0);
    }
}
