//! The stable encoding of a partition's period state, as the host commits
//! it (in its state store and changelog) and restores it. Keys sort in
//! the order the rules need them; every length is bounded by the bytes
//! that hold it, so a damaged entry is an error, never a panic.
//!
//! | key | value |
//! |---|---|
//! | `w` | the watermark: seconds (i64), nanoseconds (i32) |
//! | `i` | the effective watermark idleness closed through, the same way |
//! | `p` end key-fields label | start, version (u32), value (u64), zone, the aggregation's state |
//! | `s` event id | expiry in whole seconds, rounded up (i64); the payload's digest (8 bytes) |
//!
//! Integers are big-endian; an end's seconds have their sign bit flipped
//! so that periods sort by end; strings carry a u16 length (key fields and
//! labels) and the aggregation's state runs to the value's end.

use jiff::Timestamp;
use sha2::{Digest, Sha256};

use crate::rules::{AggregationKey, PeriodState, SeenId};

/// One stored entry: key and value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// An entry that does not decode: the state is damaged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a stored period entry (key {key:02x?}) is damaged: {what}; restore the job's state from its changelog"
)]
pub struct Damaged {
    /// The entry's key.
    pub key: Vec<u8>,
    /// What does not decode.
    pub what: &'static str,
}

/// A decoded entry.
pub(crate) enum Stored {
    Watermark(Timestamp),
    IdleThrough(Timestamp),
    Period((Timestamp, AggregationKey, String), PeriodState),
    Seen(String, SeenId),
}

const WATERMARK: u8 = b'w';
const IDLE_THROUGH: u8 = b'i';
const PERIOD: u8 = b'p';
const SEEN: u8 = b's';

/// The first 8 bytes of `payload`'s SHA-256.
pub(crate) fn payload_digest(payload: &[u8]) -> [u8; 8] {
    let hash = Sha256::digest(payload);
    let mut digest = [0; 8];
    digest.copy_from_slice(&hash[..8]);
    digest
}

pub(crate) fn watermark(at: Timestamp) -> Entry {
    (vec![WATERMARK], instant(at).to_vec())
}

pub(crate) fn idle_through(at: Timestamp) -> Entry {
    (vec![IDLE_THROUGH], instant(at).to_vec())
}

pub(crate) fn period_key(id: &(Timestamp, AggregationKey, String)) -> Vec<u8> {
    let (end, fields, label) = id;
    let mut key = vec![PERIOD];
    key.extend_from_slice(&ordered_instant(*end));
    key.extend_from_slice(&(fields.len() as u16).to_be_bytes());
    for (name, value) in fields {
        text(&mut key, name);
        text(&mut key, value);
    }
    text(&mut key, label);
    key
}

pub(crate) fn period(id: &(Timestamp, AggregationKey, String), period: &PeriodState) -> Entry {
    let mut value = instant(period.start).to_vec();
    value.extend_from_slice(&period.version.to_be_bytes());
    value.extend_from_slice(&period.value.to_be_bytes());
    text(&mut value, &period.time_zone);
    value.extend_from_slice(&period.state);
    (period_key(id), value)
}

pub(crate) fn seen_key(id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + id.len());
    key.push(SEEN);
    key.extend_from_slice(id.as_bytes());
    key
}

pub(crate) fn seen(id: &str, seen: &SeenId) -> Entry {
    let seconds = seen.expires.as_second() + i64::from(seen.expires.subsec_nanosecond() > 0);
    let mut value = seconds.to_be_bytes().to_vec();
    value.extend_from_slice(&seen.digest);
    (seen_key(id), value)
}

/// Decodes one entry.
pub(crate) fn decode(key: &[u8], value: &[u8]) -> Result<Stored, Damaged> {
    let damaged = |what| Damaged { key: key.to_vec(), what };
    let mut value_reader = Reader { bytes: value };
    match key.first() {
        Some(&WATERMARK) if key.len() == 1 => {
            Ok(Stored::Watermark(value_reader.instant().ok_or_else(|| damaged("a watermark"))?))
        }
        Some(&IDLE_THROUGH) if key.len() == 1 => Ok(Stored::IdleThrough(
            value_reader.instant().ok_or_else(|| damaged("an idle watermark"))?,
        )),
        Some(&PERIOD) => {
            let mut key_reader = Reader { bytes: &key[1..] };
            let id = key_reader.period_id().ok_or_else(|| damaged("a period's key"))?;
            if !key_reader.bytes.is_empty() {
                return Err(damaged("a period's key"));
            }
            let period = value_reader.period().ok_or_else(|| damaged("a period"))?;
            Ok(Stored::Period(id, period))
        }
        Some(&SEEN) => {
            let id = std::str::from_utf8(&key[1..]).map_err(|_| damaged("an event id"))?;
            let seen = value_reader.seen().ok_or_else(|| damaged("a seen event id"))?;
            Ok(Stored::Seen(id.to_string(), seen))
        }
        _ => Err(damaged("an unknown kind of entry")),
    }
}

fn instant(at: Timestamp) -> [u8; 12] {
    let mut bytes = [0; 12];
    bytes[..8].copy_from_slice(&at.as_second().to_be_bytes());
    bytes[8..].copy_from_slice(&at.subsec_nanosecond().to_be_bytes());
    bytes
}

fn ordered_instant(at: Timestamp) -> [u8; 12] {
    let mut bytes = instant(at);
    bytes[0] ^= 0x80;
    bytes
}

fn text(out: &mut Vec<u8>, text: &str) {
    // Key fields, labels and zone names are far shorter: the rules refuse
    // an aggregation key over MAX_KEY_BYTES before anything is stored.
    let length = u16::try_from(text.len()).expect("a stored text is under 64 KiB");
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// Reads what the functions above wrote; `None` when the bytes run out or
/// do not decode.
struct Reader<'b> {
    bytes: &'b [u8],
}

impl<'b> Reader<'b> {
    fn take(&mut self, count: usize) -> Option<&'b [u8]> {
        if self.bytes.len() < count {
            return None;
        }
        let (taken, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Some(taken)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn instant(&mut self) -> Option<Timestamp> {
        let seconds = i64::from_be_bytes(self.array()?);
        let nanos = i32::from_be_bytes(self.array()?);
        Timestamp::new(seconds, nanos).ok()
    }

    fn ordered_instant(&mut self) -> Option<Timestamp> {
        let mut seconds: [u8; 8] = self.array()?;
        seconds[0] ^= 0x80;
        let nanos = i32::from_be_bytes(self.array()?);
        Timestamp::new(i64::from_be_bytes(seconds), nanos).ok()
    }

    fn text(&mut self) -> Option<String> {
        let length = u16::from_be_bytes(self.array()?);
        let bytes = self.take(usize::from(length))?;
        String::from_utf8(bytes.to_vec()).ok()
    }

    fn period_id(&mut self) -> Option<(Timestamp, AggregationKey, String)> {
        let end = self.ordered_instant()?;
        let count = u16::from_be_bytes(self.array()?);
        let mut fields = Vec::new();
        for _ in 0..count {
            let name = self.text()?;
            fields.push((name, self.text()?));
        }
        Some((end, fields, self.text()?))
    }

    fn period(&mut self) -> Option<PeriodState> {
        let start = self.instant()?;
        let version = u32::from_be_bytes(self.array()?);
        let value = u64::from_be_bytes(self.array()?);
        let time_zone = self.text()?;
        let state = std::mem::take(&mut self.bytes).to_vec();
        Some(PeriodState { start, time_zone, state, version, value })
    }

    fn seen(&mut self) -> Option<SeenId> {
        let seconds = i64::from_be_bytes(self.array()?);
        let digest = self.array()?;
        if !self.bytes.is_empty() {
            return None;
        }
        Some(SeenId { expires: Timestamp::from_second(seconds).ok()?, digest })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_kind_of_entry_reads_back_as_written() {
        let end: Timestamp = "2026-12-01T05:00:00Z".parse().unwrap();
        let id = (end, vec![("customer".to_string(), "acmé".to_string())], "2026-11".to_string());
        let held = PeriodState {
            start: "2026-11-01T04:00:00Z".parse().unwrap(),
            time_zone: "America/New_York".into(),
            state: b"\x00\x01state".to_vec(),
            version: 3,
            value: u64::MAX,
        };
        let (key, value) = period(&id, &held);
        let Ok(Stored::Period(read_id, read)) = decode(&key, &value) else { panic!("a period") };
        assert_eq!((read_id, read), (id, held));

        let at: Timestamp = "2026-11-01T04:00:00.5Z".parse().unwrap();
        let (key, value) = watermark(at);
        assert!(matches!(decode(&key, &value), Ok(Stored::Watermark(read)) if read == at));
        let (key, value) = idle_through(at);
        assert!(matches!(decode(&key, &value), Ok(Stored::IdleThrough(read)) if read == at));

        // Expiry rounds up to whole seconds; a seen id is 16 bytes of value.
        let (key, value) = seen("evt-1", &SeenId { expires: at, digest: [7; 8] });
        assert_eq!(value.len(), 16);
        let Ok(Stored::Seen(read_id, read)) = decode(&key, &value) else { panic!("a seen id") };
        assert_eq!(read_id, "evt-1");
        assert_eq!(read.expires, "2026-11-01T04:00:01Z".parse().unwrap());
        assert_eq!(read.digest, [7; 8]);
    }

    #[test]
    fn periods_sort_by_end_before_and_after_1970() {
        let key = |at: &str| period_key(&(at.parse().unwrap(), vec![], String::new()));
        assert!(key("1969-12-01T00:00:00Z") < key("1970-01-01T00:00:00Z"));
        assert!(key("1970-01-01T00:00:00Z") < key("2026-12-01T00:00:00Z"));
    }

    proptest! {
        /// Any bytes at all: an entry or `Damaged`, never a panic.
        #[test]
        fn damaged_entries_are_errors_never_panics(
            key in prop::collection::vec(any::<u8>(), 0..64),
            value in prop::collection::vec(any::<u8>(), 0..64),
            kind in prop::sample::select(vec![b'w', b'i', b'p', b's', b'x']),
        ) {
            let mut key = key;
            key.insert(0, kind);
            let _ = decode(&key, &value);
            let _ = decode(&key[..1], &value);
        }
    }
}
