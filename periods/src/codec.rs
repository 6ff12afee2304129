//! The stable encoding of a partition's period state, as the host commits
//! it (in its state store and changelog) and restores it. Keys sort in
//! the order the rules need them; every length is bounded by the bytes
//! that hold it, so a damaged entry is an error, never a panic.
//!
//! | key | value |
//! |---|---|
//! | `w` | the watermark: seconds (i64), nanoseconds (i32) |
//! | `i` | the effective watermark idleness closed through, the same way |
//! | `f` | the latest period end whose state and ids may be forgotten, the same way |
//! | `p` end key-fields label | start, version (u32), value (u64), zone, the aggregation's state |
//! | `e` end chunk | event ids of the periods that end then, each with its payload's digest (8 bytes) |
//!
//! Integers are big-endian; an instant's seconds have their sign bit
//! flipped in keys so that periods and ids sort by end; strings
//! carry a u16 length (key fields, labels and event ids) and the
//! aggregation's state runs to the value's end.
//!
//! Event ids are stored by the transaction that remembered them, not one
//! entry each: each transaction appends chunks (numbered from 0, each at
//! most [`SEEN_CHUNK_BYTES`]) for every period end it remembered ids under,
//! and a purge deletes all of an end's chunks. An entry per id cost a
//! memtable insert and a changelog record per event; such entries (key
//! `s` and the id; value the expiry in whole seconds, rounded up, and the
//! digest) are still read, and rewritten as chunks by the next commit.
//!
//! Until 2026-12, `e` entries were keyed by the ids' expiry (their period's
//! end plus the horizon) instead of the end: such an entry is read as ids
//! of a period ending then, so its ids are kept one horizon longer than
//! they need be, never shorter. Likewise a first-format id's expiry.

use jiff::Timestamp;
use sha2::{Digest, Sha256};

use crate::rules::{AggregationKey, PayloadDigest, PeriodState};

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
    ForgottenThrough(Timestamp),
    Period((Timestamp, AggregationKey, String), PeriodState),
    /// Chunk `chunk` of the ids of the periods that end at `period_end`.
    SeenIds {
        period_end: Timestamp,
        chunk: u64,
        ids: Vec<(String, PayloadDigest)>,
    },
    /// One id in the first format: an entry of its own.
    SeenId {
        id: String,
        period_end: Timestamp,
        digest: PayloadDigest,
    },
}

/// A chunk of seen ids is cut once it holds this many bytes (well under a
/// Kafka record's limit).
pub const SEEN_CHUNK_BYTES: usize = 32 * 1024;

const WATERMARK: u8 = b'w';
const IDLE_THROUGH: u8 = b'i';
const FORGOTTEN_THROUGH: u8 = b'f';
const PERIOD: u8 = b'p';
const SEEN_IDS: u8 = b'e';
const SEEN_ID: u8 = b's';

/// The first 8 bytes of `payload`'s SHA-256.
pub(crate) fn payload_digest(payload: &[u8]) -> PayloadDigest {
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

pub(crate) fn forgotten_through(at: Timestamp) -> Entry {
    (vec![FORGOTTEN_THROUGH], instant(at).to_vec())
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

/// The key of chunk `chunk` of the ids of the periods that end at `period_end`.
pub(crate) fn seen_ids_key(period_end: Timestamp, chunk: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + 12 + 8);
    key.push(SEEN_IDS);
    key.extend_from_slice(&ordered_instant(period_end));
    key.extend_from_slice(&chunk.to_be_bytes());
    key
}

/// `ids` (each with its payload's digest), all of periods that end at `period_end`, as
/// chunks numbered from `first_chunk`.
pub(crate) fn seen_ids<'a>(
    period_end: Timestamp,
    first_chunk: u64,
    ids: impl IntoIterator<Item = (&'a str, PayloadDigest)>,
) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut value = Vec::new();
    for (id, digest) in ids {
        text(&mut value, id);
        value.extend_from_slice(&digest);
        if value.len() >= SEEN_CHUNK_BYTES {
            let chunk = first_chunk + entries.len() as u64;
            entries.push((seen_ids_key(period_end, chunk), std::mem::take(&mut value)));
        }
    }
    if !value.is_empty() {
        let chunk = first_chunk + entries.len() as u64;
        entries.push((seen_ids_key(period_end, chunk), value));
    }
    entries
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
        Some(&FORGOTTEN_THROUGH) if key.len() == 1 => Ok(Stored::ForgottenThrough(
            value_reader
                .instant()
                .ok_or_else(|| damaged("the end periods are forgotten through"))?,
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
        Some(&SEEN_IDS) => {
            let mut key_reader = Reader { bytes: &key[1..] };
            let period_end = key_reader.ordered_instant().ok_or_else(|| damaged("a period end"))?;
            let chunk = u64::from_be_bytes(key_reader.array().ok_or_else(|| damaged("a chunk"))?);
            // One chunk has one key: another spelling of it (an instant's
            // seconds and nanoseconds of opposite signs) would never be
            // deleted.
            if seen_ids_key(period_end, chunk) != key {
                return Err(damaged("a chunk of seen ids' key"));
            }
            let ids = value_reader.seen_ids().ok_or_else(|| damaged("a chunk of seen ids"))?;
            Ok(Stored::SeenIds { period_end, chunk, ids })
        }
        Some(&SEEN_ID) => {
            let id = std::str::from_utf8(&key[1..]).map_err(|_| damaged("an event id"))?;
            // Only ids the rules took were stored: 1 to MAX_EVENT_ID_BYTES.
            if id.is_empty() || id.len() > crate::rules::MAX_EVENT_ID_BYTES {
                return Err(damaged("an event id"));
            }
            let seconds = value_reader.array().map(i64::from_be_bytes);
            let period_end = seconds.and_then(|seconds| Timestamp::from_second(seconds).ok());
            let digest = value_reader.array();
            match (period_end, digest, value_reader.bytes.is_empty()) {
                (Some(period_end), Some(digest), true) => {
                    Ok(Stored::SeenId { id: id.to_string(), period_end, digest })
                }
                _ => Err(damaged("a seen event id")),
            }
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

    fn seen_ids(&mut self) -> Option<Vec<(String, PayloadDigest)>> {
        let mut ids = Vec::new();
        while !self.bytes.is_empty() {
            let id = self.text()?;
            ids.push((id, self.array()?));
        }
        (!ids.is_empty()).then_some(ids)
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
        let (key, value) = forgotten_through(at);
        assert!(matches!(decode(&key, &value), Ok(Stored::ForgottenThrough(read)) if read == at));

        // A seen id costs its length, its bytes and its digest.
        let chunks = seen_ids(at, 3, [("evt-1", [7; 8]), ("é", [1; 8])]);
        let [(key, value)] = chunks.as_slice() else { panic!("one chunk: {chunks:?}") };
        assert_eq!(value.len(), (2 + 5 + 8) + (2 + 2 + 8));
        let Ok(Stored::SeenIds { period_end, chunk, ids }) = decode(key, value) else {
            panic!("a chunk of seen ids")
        };
        assert_eq!((period_end, chunk), (at, 3));
        assert_eq!(ids, vec![("evt-1".to_string(), [7; 8]), ("é".to_string(), [1; 8])]);
    }

    #[test]
    fn a_seen_id_in_the_first_format_still_reads() {
        let mut value = 1_796_965_200_i64.to_be_bytes().to_vec();
        value.extend_from_slice(&[7; 8]);
        let Ok(Stored::SeenId { id, period_end, digest }) = decode(b"sevt-1", &value) else {
            panic!("a seen id")
        };
        assert_eq!((id.as_str(), period_end.as_second(), digest), ("evt-1", 1_796_965_200, [7; 8]));
        assert!(decode(b"sevt-1", &value[..15]).is_err());
    }

    #[test]
    fn a_chunk_key_spelt_another_way_is_damaged() {
        // 5 s and -1 ns is 4.999999999 s, whose own key differs.
        let mut key = vec![SEEN_IDS];
        key.extend_from_slice(&(5_i64.to_be_bytes()));
        key[1] ^= 0x80;
        key.extend_from_slice(&(-1_i32).to_be_bytes());
        key.extend_from_slice(&0_u64.to_be_bytes());
        let (_, value) = &seen_ids(Timestamp::UNIX_EPOCH, 0, [("a", [0; 8])])[0];
        assert!(decode(&key, value).is_err());
    }

    #[test]
    fn seen_ids_are_cut_into_chunks_numbered_in_order() {
        let at: Timestamp = "2027-01-05T05:00:00Z".parse().unwrap();
        let names: Vec<String> = (0..5_000).map(|n| format!("event-{n:06}")).collect();
        let chunks = seen_ids(at, 7, names.iter().map(|id| (id.as_str(), [0; 8])));
        // 5,000 ids of 2 + 12 + 8 bytes: 110,000 bytes, four chunks.
        assert_eq!(chunks.len(), 110_000_usize.div_ceil(SEEN_CHUNK_BYTES));
        let mut read = Vec::new();
        for (number, (key, value)) in chunks.iter().enumerate() {
            assert!(value.len() < SEEN_CHUNK_BYTES + 2 + 256 + 8, "a chunk is cut near the limit");
            let Ok(Stored::SeenIds { period_end, chunk, ids }) = decode(key, value) else {
                panic!("chunk {number}")
            };
            assert_eq!((period_end, chunk), (at, 7 + number as u64));
            read.extend(ids.into_iter().map(|(id, _)| id));
        }
        assert_eq!(read, names, "every id, in order");
        assert!(chunks.windows(2).all(|pair| pair[0].0 < pair[1].0), "keys sort by chunk");
        let before: Timestamp = "1969-01-05T05:00:00Z".parse().unwrap();
        assert!(seen_ids_key(before, u64::MAX) < seen_ids_key(at, 0), "and by end first");
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
            kind in prop::sample::select(vec![b'w', b'i', b'f', b'p', b'e', b's', b'x']),
        ) {
            let mut key = key;
            key.insert(0, kind);
            let _ = decode(&key, &value);
            let _ = decode(&key[..1], &value);
        }
    }
}
