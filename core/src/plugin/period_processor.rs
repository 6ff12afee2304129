//! The processor of a period job: the host's period rules (the
//! [`PeriodBook`] in the transaction) around a period plugin's instance.
//! A batch is described by the plugin in one call, each partition's events
//! are offered to its rules in offset order (and folded into their
//! periods in one call, or one by one after the plugin refuses one), each
//! refused event is dead-lettered with the reason, and the FINAL and
//! ADJUSTMENT records the events close are emitted, in the batch's order,
//! with an idempotency key made of the fact they state. See `docs/periods.md`.

use std::fmt::Write as _;

use jiff::Timestamp;
use tally_periods::{
    Addition, Aggregation, EventFacts, Folded, Offer, PeriodRecord, Verdict, refusal_of_facts,
    time_zone_database,
};

use super::bindings::periods as wit;
use super::periods::{PeriodInstance, instant, to_wit};
use super::{DescribedEvent as WitFacts, EventTime};
use super::{Event, PluginKind, PluginUsage, ProcessError, Processor, Rejection};
use crate::periods::PeriodBook;
use crate::text::{MAX_REASON_BYTES, sanitize};
use crate::transaction::{DeadLetter, SourcePosition, Transaction};

/// Longest RFC 3339 event time read.
const MAX_TIME_TEXT_BYTES: usize = 64;

/// The [`Processor`] of a period job: the host's period rules around a
/// period plugin's instance. The periods themselves live in the
/// transaction ([`Transaction::periods`]), so a new plugin version takes
/// them over as they are.
pub struct PeriodProcessor {
    instance: PeriodInstance,
    failures_in_a_row: u64,
    /// Plugin failures in the current batch, consecutive or not.
    failures_in_batch: u64,
}

impl PeriodProcessor {
    /// The processor running `instance`.
    pub fn new(instance: PeriodInstance) -> PeriodProcessor {
        PeriodProcessor { instance, failures_in_a_row: 0, failures_in_batch: 0 }
    }

    /// Runs `work` on the transaction's book, which it takes out for the
    /// duration (and puts back whatever happens).
    fn with_book(
        &mut self,
        txn: &mut Transaction,
        events: usize,
        work: impl FnOnce(&mut Self, &mut PeriodBook, &mut Transaction) -> Result<(), ProcessError>,
    ) -> Result<(), ProcessError> {
        let Some(mut book) = txn.periods.take() else {
            return Err(ProcessError::Misconfigured(
                "a period plugin runs only in a job that declares [periods]; add the table (see docs/periods.md)".into(),
            ));
        };
        self.instance.begin(events);
        self.failures_in_batch = 0;
        let result = book
            .load_if_stale(&**txn.store())
            .map_err(ProcessError::Host)
            .and_then(|()| work(self, &mut book, txn));
        self.instance.end();
        if result.is_err() {
            book.mark_stale();
        }
        txn.periods = Some(book);
        result
    }

    /// A plugin failure on one event: counted, and the job stops once the
    /// plugin failed on the job's limit of events in a row, or of one
    /// batch's events (so failures between successes cannot cost each
    /// batch its budget many times over).
    fn failed(&mut self, reason: &str) -> Result<(), ProcessError> {
        self.failures_in_a_row += 1;
        self.failures_in_batch += 1;
        let limit = self.instance.limits().max_failures_in_a_row;
        if self.failures_in_batch >= limit {
            self.failures_in_batch = 0;
            self.failures_in_a_row = 0;
            return Err(ProcessError::FailingInARow(format!(
                "its plugin failed on {limit} events of one batch (limits.max_failures_in_a_row = {limit}), the last with: {}",
                sanitize(reason, MAX_REASON_BYTES)
            )));
        }
        if self.failures_in_a_row >= limit {
            self.failures_in_a_row = 0;
            return Err(ProcessError::FailingInARow(format!(
                "its plugin failed on {limit} events in a row (limits.max_failures_in_a_row = {limit}), the last with: {}",
                sanitize(reason, MAX_REASON_BYTES)
            )));
        }
        Ok(())
    }

    /// What each event says about itself and adds, read and bounded (or
    /// why it is malformed); a batch the plugin fails on is described
    /// event by event, so that only the culprit is refused. Each
    /// description is bounded as it comes: what a batch's one-by-one
    /// descriptions keep in all is bounded by the plugin's memory, as the
    /// batch's one call is.
    fn describe(&mut self, events: &[wit::Event]) -> Result<Vec<Read>, ProcessError> {
        let limits = *self.instance.limits();
        match self.instance.describe(events) {
            Ok(described) => {
                return Ok(described
                    .into_iter()
                    .map(|facts| read(facts, limits.max_value_bytes))
                    .collect());
            }
            // Counted once for the batch, then each event described alone.
            Err(ProcessError::Plugin(reason)) if events.len() > 1 => self.failed(&reason)?,
            Err(ProcessError::Plugin(reason)) => {
                self.failed(&reason)?;
                return Ok(vec![Err(format!("malformed: plugin failed describing it: {reason}"))]);
            }
            Err(other) => return Err(other),
        }
        let mut described = Vec::with_capacity(events.len());
        let mut held: u64 = 0;
        for event in events {
            let one = match self.instance.describe(std::slice::from_ref(event)) {
                Ok(mut one) => read(
                    one.pop().unwrap_or_else(|| Err("plugin described nothing".into())),
                    limits.max_value_bytes,
                ),
                Err(ProcessError::Plugin(reason)) => {
                    self.failed(&reason)?;
                    Err(format!("malformed: plugin failed describing it: {reason}"))
                }
                Err(other) => return Err(other),
            };
            let one = one.and_then(|(facts, addend)| {
                let key: usize = facts.key.iter().map(|(name, value)| name.len() + value.len()).sum();
                let size = (facts.id.len() + facts.customer.len() + key + addend.len()) as u64;
                if held + size > limits.memory_bytes {
                    return Err(format!(
                        "malformed: its batch, described event by event after the plugin failed on it whole, was described in more than {} bytes (limits.memory_bytes); describe events in fewer bytes or raise the limit",
                        limits.memory_bytes
                    ));
                }
                held += size;
                Ok((facts, addend))
            });
            described.push(one);
        }
        Ok(described)
    }

    fn process_in(
        &mut self,
        book: &mut PeriodBook,
        events: &[Event],
        txn: &mut Transaction,
    ) -> Result<(), ProcessError> {
        // Each partition's events side by side, in offset order, so that
        // the calls for a partition name its events in one slice.
        let mut order: Vec<usize> = (0..events.len()).collect();
        order.sort_by_key(|&index| events[index].partition);
        let carried: Vec<wit::Event> = order.iter().map(|&index| to_wit(&events[index])).collect();
        let described = self.describe(&carried)?;
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(events.len());
        outcomes.resize_with(events.len(), || Outcome::Malformed(String::new()));
        let mut described = described.into_iter();
        let mut start = 0;
        while start < order.len() {
            let partition = events[order[start]].partition;
            let end = start
                + order[start..]
                    .iter()
                    .take_while(|&&index| events[index].partition == partition)
                    .count();
            let run = &order[start..end];
            // The events it offers to the rules, and what each adds.
            let mut facts = Vec::with_capacity(run.len());
            let mut addends = Vec::with_capacity(run.len());
            for (&index, read) in run.iter().zip(described.by_ref()) {
                match read {
                    Ok((read, addend)) => {
                        facts.push((index, read));
                        addends.push(addend);
                    }
                    Err(reason) => outcomes[index] = Outcome::Malformed(reason),
                }
            }
            let offers: Vec<Offer<'_>> = facts
                .iter()
                .map(|(index, facts)| {
                    let event = &events[*index];
                    let arrival = event
                        .timestamp_ms
                        .and_then(|ms| Timestamp::from_millisecond(ms).ok())
                        .unwrap_or_else(Timestamp::now);
                    Offer { facts, payload: &event.value, arrival }
                })
                .collect();
            if offers.is_empty() {
                start = end;
                continue;
            }
            let last_offset = events[order[end - 1]].offset;
            let mut calls = Calls { processor: self, addends: &addends };
            let mut records = Vec::new();
            let offered = book.partition(partition, last_offset).offer_all(
                &offers,
                &mut calls,
                &mut records,
            )?;
            let mut records = records.into_iter();
            for ((index, _), offered) in facts.iter().zip(offered) {
                let closed = records.by_ref().take(offered.records).collect();
                outcomes[*index] = Outcome::Offered(offered.verdict, closed);
            }
            start = end;
        }
        for (event, outcome) in events.iter().zip(outcomes) {
            let source = SourcePosition { partition: event.partition, offset: event.offset };
            match outcome {
                Outcome::Malformed(reason) => dead_letter(txn, source, event, reason),
                Outcome::Offered(verdict, mut closed) => {
                    if let Verdict::DeadLetter(reason) = verdict {
                        let by_rule = tally_periods::refused_by_rule(&reason);
                        let dead = DeadLetter {
                            source,
                            reason: sanitize(&reason, MAX_REASON_BYTES),
                            record: event.value.clone(),
                        };
                        if by_rule {
                            txn.push_rule_dead_letter(dead);
                        } else {
                            txn.push_dead_letter(dead);
                        }
                    }
                    emit(txn, book.output(), &mut closed, source);
                }
            }
        }
        txn.put_host_state(book.take_changes());
        Ok(())
    }
}

/// What `describe` said of one event, read and bounded: its facts and
/// addend, or why it is malformed (the dead letter's reason).
type Read = Result<(EventFacts, Vec<u8>), String>;

/// `described` read ([`facts_of`]) and bounded as the rules bound facts
/// ([`refusal_of_facts`]): an oversized description is dropped here, not
/// held until the rules refuse it.
fn read(described: Result<WitFacts, String>, max_addend: u32) -> Read {
    let (facts, addend) = described
        .map_err(|why| format!("malformed: {why}"))
        .and_then(|facts| facts_of(facts, max_addend))?;
    match refusal_of_facts(&facts) {
        Some(reason) => Err(reason),
        None => Ok((facts, addend)),
    }
}

/// What became of one event of a batch.
enum Outcome {
    /// The plugin could not describe it: a dead letter, with why.
    Malformed(String),
    /// The rules' verdict, and the records it closed.
    Offered(Verdict, Vec<PeriodRecord>),
}

impl Processor for PeriodProcessor {
    fn process(
        &mut self,
        events: &[Event],
        txn: &mut Transaction,
    ) -> Result<Vec<Rejection>, ProcessError> {
        self.with_book(txn, events.len(), |processor, book, txn| {
            processor.process_in(book, events, txn)
        })?;
        // Refusals are the rules' dead letters, already in the transaction.
        Ok(Vec::new())
    }

    fn digest(&self) -> &str {
        self.instance.digest()
    }

    fn usage(&self) -> PluginUsage {
        self.instance.usage()
    }

    fn kind(&self) -> PluginKind {
        PluginKind::Periods
    }

    fn transaction_dropped(&mut self) {
        self.failures_in_a_row = 0;
        self.failures_in_batch = 0;
    }

    fn end_transaction(&mut self, txn: &mut Transaction) -> Result<(), ProcessError> {
        self.with_book(txn, 1, |processor, book, txn| {
            let mut records = Vec::new();
            for partition in book.partitions() {
                let offset = book.last_offset(partition);
                let mut calls = Calls { processor: &mut *processor, addends: &[] };
                book.partition(partition, offset).end_transaction(&mut calls, &mut records)?;
                let source = SourcePosition { partition, offset };
                emit(txn, book.output(), &mut records, source);
            }
            txn.put_host_state(book.take_changes());
            Ok(())
        })
    }

    fn close_idle(&mut self, txn: &mut Transaction, idle: &[u32]) -> Result<(), ProcessError> {
        self.with_book(txn, 1, |processor, book, txn| {
            let mut records = Vec::new();
            for &partition in idle {
                let offset = book.last_offset(partition);
                // The lowest watermark among the job's other partitions
                // that have one: what every one of them has reached.
                let Some((periods, Some(adopted))) = book.idle_partition(partition) else {
                    continue;
                };
                let mut calls = Calls { processor: &mut *processor, addends: &[] };
                periods.close_idle(adopted, &mut calls, &mut records)?;
                emit(txn, book.output(), &mut records, SourcePosition { partition, offset });
            }
            txn.put_host_state(book.take_changes());
            Ok(())
        })
    }
}

/// The plugin's `add` and `value`, as the period rules call them, for the
/// events of one partition's run of a batch (none when closing without
/// events).
struct Calls<'p> {
    processor: &'p mut PeriodProcessor,
    /// What each event offered to the rules adds to its period (as
    /// `describe` said), in the order of the offers.
    addends: &'p [Vec<u8>],
}

impl Calls<'_> {
    /// The index of the addend of the event the rules' addition names.
    fn addend(&self, addition: &Addition) -> Result<usize, ProcessError> {
        if addition.event < self.addends.len() {
            Ok(addition.event)
        } else {
            Err(ProcessError::Misconfigured("an addition names no event of the batch".into()))
        }
    }

    /// One event added alone: the plugin's refusals, failures and an
    /// oversized state are the event's dead letter.
    fn add_one(
        &mut self,
        states: Vec<Option<Vec<u8>>>,
        addition: &Addition,
    ) -> Result<Folded, ProcessError> {
        let addend = &self.addends[self.addend(addition)?];
        let one = wit::Addition { period: 0, time: instant(addition.time), addend: 0 };
        let limit = self.processor.instance.limits().max_value_bytes;
        let refused = |reason| Ok(Folded::Refused { addition: 0, reason });
        match self.processor.instance.add(&states, std::slice::from_ref(addend), &[one]) {
            Ok(Ok(mut folded)) if folded.len() == 1 => {
                let state = folded.pop().unwrap_or_default();
                if state.len() > limit as usize {
                    // Not counted as the plugin's failure: a period can
                    // outgrow the limit on honest input (a large
                    // unique_count).
                    return refused(format!(
                        "the period's state would be {} bytes with it, over the job's limit of {limit} bytes (limits.max_value_bytes); raise the limit",
                        state.len()
                    ));
                }
                self.processor.failures_in_a_row = 0;
                Ok(Folded::States(vec![state]))
            }
            Ok(Ok(folded)) => {
                let reason = format!("it gave {} states for one period", folded.len());
                self.processor.failed(&reason)?;
                refused(format!("plugin failed adding it: {reason}"))
            }
            Ok(Err(refusal)) => {
                self.processor.failures_in_a_row = 0;
                refused(sanitize(&refusal.reason, MAX_REASON_BYTES))
            }
            Err(ProcessError::Plugin(reason)) => {
                self.processor.failed(&reason)?;
                refused(format!("plugin failed adding it: {reason}"))
            }
            Err(other) => Err(other),
        }
    }
}

impl Aggregation for Calls<'_> {
    type Error = ProcessError;

    fn add(
        &mut self,
        states: &[Option<&[u8]>],
        additions: &[Addition],
        tentative: bool,
    ) -> Result<Folded, ProcessError> {
        let states: Vec<Option<Vec<u8>>> =
            states.iter().map(|state| state.map(<[u8]>::to_vec)).collect();
        match additions {
            [] => {
                return Ok(Folded::States(
                    states.into_iter().map(Option::unwrap_or_default).collect(),
                ));
            }
            // One event's own call: its refusals and failures are its own.
            [addition] if !tentative => return self.add_one(states, addition),
            _ => {}
        }
        // Only the stretch of the run the additions name goes over (the
        // events since the last fold, in order): a run folded at many
        // closes is not copied whole each time.
        let mut named = Vec::with_capacity(additions.len());
        for addition in additions {
            named.push(self.addend(addition)?);
        }
        let first = named.iter().copied().min().unwrap_or(0);
        let last = named.iter().copied().max().unwrap_or(0);
        let folding: Vec<wit::Addition> = additions
            .iter()
            .zip(&named)
            .map(|(addition, position)| wit::Addition {
                period: addition.period as u32,
                time: instant(addition.time),
                addend: (position - first) as u32,
            })
            .collect();
        // A fold (tentative): anything but every state, each within the
        // limit, sends the rules back to the events one by one, where each
        // refusal or failure is its own event's (and counted once, there).
        let limit = self.processor.instance.limits().max_value_bytes as usize;
        let one_by_one = Folded::Refused { addition: 0, reason: String::new() };
        match self.processor.instance.add(&states, &self.addends[first..=last], &folding) {
            Ok(Ok(folded))
                if folded.len() == states.len()
                    && folded.iter().all(|state| state.len() <= limit) =>
            {
                self.processor.failures_in_a_row = 0;
                Ok(Folded::States(folded))
            }
            Ok(_) | Err(ProcessError::Plugin(_)) => Ok(one_by_one),
            Err(other) => Err(other),
        }
    }

    fn value(&mut self, state: &[u8]) -> Result<u64, ProcessError> {
        self.processor.instance.value(state).map_err(|err| match err {
            // A period the plugin cannot value cannot close: the job stops
            // rather than skip a FINAL.
            ProcessError::Plugin(reason) => ProcessError::FailingInARow(format!(
                "its plugin failed computing a period's value, so the period cannot close: {reason}"
            )),
            other => other,
        })
    }
}

/// The rules' form of what `describe` said and the event's addend (at
/// most `max_addend` bytes), or why it is malformed.
fn facts_of(facts: WitFacts, max_addend: u32) -> Result<(EventFacts, Vec<u8>), String> {
    if facts.addend.len() > max_addend as usize {
        return Err(format!(
            "malformed: the plugin's addend for it is {} bytes, over the job's limit of {max_addend} bytes (limits.max_value_bytes); raise the limit",
            facts.addend.len()
        ));
    }
    let time = match facts.time {
        EventTime::Rfc3339(text) => {
            if text.len() > MAX_TIME_TEXT_BYTES {
                return Err(format!(
                    "malformed: event time of {} bytes is no RFC 3339 instant (at most {MAX_TIME_TEXT_BYTES})",
                    text.len()
                ));
            }
            text.parse::<Timestamp>().map_err(|err| {
                format!(
                    "malformed: event time {:?} is not an RFC 3339 instant with an offset ({err})",
                    sanitize(&text, MAX_TIME_TEXT_BYTES)
                )
            })?
        }
        EventTime::UnixMillis(millis) => Timestamp::from_millisecond(millis).map_err(|_| {
            format!("malformed: event time {millis} ms since 1970 is outside years -9999 to 9999")
        })?,
    };
    let read = EventFacts { id: facts.id, time, key: facts.key, customer: facts.customer };
    Ok((read, facts.addend))
}

fn dead_letter(txn: &mut Transaction, source: SourcePosition, event: &Event, reason: String) {
    let reason = sanitize(&reason, MAX_REASON_BYTES);
    txn.push_dead_letter(DeadLetter { source, reason, record: event.value.clone() });
}

/// Emits `records` (drained) to output index `output`, caused at `source`.
fn emit(
    txn: &mut Transaction,
    output: usize,
    records: &mut Vec<PeriodRecord>,
    source: SourcePosition,
) {
    for record in records.drain(..) {
        let (key, value, fact) = format_record(&record);
        txn.emit_fact(output, key, value, source, fact);
    }
}

/// A period record's key (`{"customer":..,"metric":..,"period":..}`: the
/// aggregation key's fields, then the period), its value (the JSON of
/// `docs/periods.md`) and its fact
/// (`<field>=<value>/…/period=<label>/zone=<zone>/v<version>`, each part
/// percent-encoded), from which the idempotency key is made.
pub fn format_record(record: &PeriodRecord) -> (Vec<u8>, Vec<u8>, String) {
    let mut key = String::from("{");
    push_key_and_period(&mut key, record);
    key.push('}');

    let mut value = String::from("{\"type\":");
    value.push_str(if record.is_final() { "\"final\"," } else { "\"adjustment\"," });
    push_key_and_period(&mut value, record);
    value.push_str(",\"time_zone\":");
    push_json_string(&mut value, &record.time_zone);
    let _ = write!(
        value,
        ",\"start\":\"{}\",\"end\":\"{}\",\"value\":{}",
        record.period.start, record.period.end, record.value
    );
    if let Some(previous) = record.previous {
        let _ = write!(value, ",\"previous\":{previous},\"delta\":{}", record.delta());
    }
    let _ = write!(value, ",\"version\":{},\"tzdata\":", record.version);
    push_json_string(&mut value, time_zone_database());
    value.push('}');

    let mut fact = String::new();
    for (name, field) in &record.key {
        push_percent_encoded(&mut fact, name);
        fact.push('=');
        push_percent_encoded(&mut fact, field);
        fact.push('/');
    }
    fact.push_str("period=");
    push_percent_encoded(&mut fact, &record.period.label);
    // The zone too: a customer given another zone has other periods of
    // the same label, and each is a fact of its own.
    fact.push_str("/zone=");
    push_percent_encoded(&mut fact, &record.time_zone);
    let _ = write!(fact, "/v{}", record.version);
    (key.into_bytes(), value.into_bytes(), fact)
}

/// `"<field>":"<value>",…,"period":"<label>"`: what a record's key and
/// value both start with.
fn push_key_and_period(out: &mut String, record: &PeriodRecord) {
    for (name, value) in &record.key {
        push_json_string(out, name);
        out.push(':');
        push_json_string(out, value);
        out.push(',');
    }
    out.push_str("\"period\":");
    push_json_string(out, &record.period.label);
}

fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Every byte but unreserved ones (RFC 3986: letters, digits, `-._~`) as
/// `%XX`: a fact is safe in a header and splits at `/` and `=` only.
fn push_percent_encoded(out: &mut String, text: &str) {
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_periods::{Calendar, Zone};

    fn record(version: u32, previous: Option<u64>) -> PeriodRecord {
        let zone = Zone::named("America/New_York").unwrap();
        let at: Timestamp = "2026-11-15T12:00:00Z".parse().unwrap();
        PeriodRecord {
            key: vec![
                ("customer".into(), "acme \"east\"/1".into()),
                ("metric".into(), "calls".into()),
            ],
            period: Calendar::Month.period_of(at, &zone).unwrap(),
            time_zone: "America/New_York".into(),
            value: 5127,
            version,
            previous,
        }
    }

    #[test]
    fn a_final_and_an_adjustment_read_as_the_docs_say() {
        let tzdata = time_zone_database();
        let (key, value, fact) = format_record(&record(1, None));
        assert_eq!(
            String::from_utf8(key).unwrap(),
            r#"{"customer":"acme \"east\"/1","metric":"calls","period":"2026-11"}"#
        );
        assert_eq!(
            String::from_utf8(value).unwrap(),
            format!(
                r#"{{"type":"final","customer":"acme \"east\"/1","metric":"calls","period":"2026-11","time_zone":"America/New_York","start":"2026-11-01T04:00:00Z","end":"2026-12-01T05:00:00Z","value":5127,"version":1,"tzdata":"{tzdata}"}}"#
            )
        );
        assert_eq!(
            fact,
            "customer=acme%20%22east%22%2F1/metric=calls/period=2026-11/zone=America%2FNew_York/v1"
        );
        let (_, value, fact) = format_record(&record(2, Some(5120)));
        assert!(
            String::from_utf8(value)
                .unwrap()
                .contains(r#""value":5127,"previous":5120,"delta":7,"version":2,"#)
        );
        assert!(fact.ends_with("/period=2026-11/zone=America%2FNew_York/v2"), "{fact}");
    }

    #[test]
    fn event_times_are_read_in_both_forms_and_refused_with_the_reason() {
        let facts = |time| WitFacts {
            id: "e1".into(),
            time,
            key: vec![("customer".into(), "acme".into())],
            customer: "acme".into(),
            addend: b"7".to_vec(),
        };
        let read = |time| facts_of(facts(time), 1024);
        let (read_facts, addend) =
            read(EventTime::Rfc3339("2026-11-01T00:30:00-04:00".into())).unwrap();
        assert_eq!(read_facts.time, "2026-11-01T04:30:00Z".parse::<Timestamp>().unwrap());
        assert_eq!(addend, b"7");
        let (read_facts, _) = read(EventTime::UnixMillis(1_000)).unwrap();
        assert_eq!(read_facts.time, Timestamp::from_second(1).unwrap());
        let err = read(EventTime::Rfc3339("2026-11-01 00:30".into())).unwrap_err();
        assert!(err.starts_with("malformed: event time \"2026-11-01 00:30\""), "{err}");
        let err = read(EventTime::UnixMillis(i64::MAX)).unwrap_err();
        assert!(err.contains("outside years"), "{err}");
    }

    #[test]
    fn an_addend_over_the_state_limit_is_refused_naming_the_limit() {
        let facts = WitFacts {
            id: "e1".into(),
            time: EventTime::UnixMillis(1_000),
            key: vec![("customer".into(), "acme".into())],
            customer: "acme".into(),
            addend: vec![b'7'; 1025],
        };
        let err = facts_of(facts.clone(), 1024).unwrap_err();
        assert_eq!(
            err,
            "malformed: the plugin's addend for it is 1025 bytes, over the job's limit of 1024 bytes (limits.max_value_bytes); raise the limit"
        );
        assert!(facts_of(facts, 1025).is_ok(), "the limit itself is allowed");
    }
}
