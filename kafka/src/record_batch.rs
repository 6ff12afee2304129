//! Kafka record batches (message format v2) as a fetch response carries
//! them, read in place: a record's key and value are slices of the
//! response, and nothing is allocated per record. With
//! [`ReadCommitted`], only what a `read_committed` consumer would be
//! handed: no control batch, no batch of an aborted transaction.
//!
//! A restore reads what Tally's own producer wrote, so this reads what it
//! writes: uncompressed v2 batches. A compressed batch or an older message
//! format is [`BatchError::Unsupported`], for the caller to read through
//! librdkafka instead; a batch whose CRC or lengths do not add up is
//! [`BatchError::Corrupt`]. The layout is Kafka's
//! (`DefaultRecordBatch` in the Java client).

use std::collections::HashSet;

/// Bytes before a batch's records: base offset (8), length (4), leader
/// epoch (4), magic (1), CRC (4), attributes (2), last offset delta (4),
/// two timestamps (16), producer id (8), producer epoch (2), base
/// sequence (4), record count (4).
const HEADER_LEN: usize = 61;
/// The base offset and the length field, which counts the bytes after it.
const LOG_OVERHEAD: usize = 12;
const MAGIC_AT: usize = 16;
const CRC_AT: usize = 17;
/// The CRC covers everything from the attributes on.
const ATTRIBUTES_AT: usize = 21;
const LAST_OFFSET_DELTA_AT: usize = 23;
const PRODUCER_ID_AT: usize = 43;
const RECORD_COUNT_AT: usize = 57;

const COMPRESSION_MASK: u16 = 0x07;
const TRANSACTIONAL: u16 = 0x10;
const CONTROL: u16 = 0x20;
/// A control record's type: the transaction was aborted.
const CONTROL_ABORT: i16 = 0;

/// Why a fetch response's records could not be read here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// Well-formed, but not what this reader reads (librdkafka does).
    #[error("the batch at offset {offset} is {what}")]
    Unsupported {
        /// The batch's base offset.
        offset: i64,
        /// What it is (a compression codec, a message format).
        what: String,
    },
    /// Lengths or a checksum that do not add up.
    #[error("the batch at offset {offset} is corrupt: {why}")]
    Corrupt {
        /// The batch's base offset.
        offset: i64,
        /// What does not add up.
        why: &'static str,
    },
}

fn be_i16(bytes: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([bytes[at], bytes[at + 1]])
}

fn be_i32(bytes: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(bytes[at..at + 4].try_into().expect("four bytes"))
}

fn be_i64(bytes: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(bytes[at..at + 8].try_into().expect("eight bytes"))
}

/// The complete batches of a fetch response's records, in order. A broker
/// may end a response inside a batch (it cuts at its size limit): the
/// part is not a batch, and iteration ends before it.
pub struct Batches<'r> {
    rest: &'r [u8],
}

impl<'r> Batches<'r> {
    /// The batches in `records`.
    pub fn new(records: &'r [u8]) -> Batches<'r> {
        Batches { rest: records }
    }
}

impl<'r> Iterator for Batches<'r> {
    type Item = Result<Batch<'r>, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.len() < LOG_OVERHEAD {
            return None;
        }
        let offset = be_i64(self.rest, 0);
        let length = be_i32(self.rest, 8);
        let corrupt = |why| Some(Err(BatchError::Corrupt { offset, why }));
        // A v0/v1 message set starts with the same offset and length, and
        // its magic byte sits where a batch's does.
        if length < (MAGIC_AT + 1 - LOG_OVERHEAD) as i32 {
            self.rest = &[];
            return corrupt("its length is shorter than a header");
        }
        let total = LOG_OVERHEAD + length as usize;
        if self.rest.len() < total {
            return None; // cut off by the response's size limit
        }
        let (bytes, rest) = self.rest.split_at(total);
        self.rest = rest;
        let magic = bytes[MAGIC_AT];
        if magic != 2 {
            self.rest = &[];
            return Some(Err(BatchError::Unsupported {
                offset,
                what: format!("in message format v{magic} (Kafka before 0.11)"),
            }));
        }
        if bytes.len() < HEADER_LEN {
            self.rest = &[];
            return corrupt("its length is shorter than a header");
        }
        let crc = u32::from_be_bytes(bytes[CRC_AT..CRC_AT + 4].try_into().expect("four bytes"));
        if crc32c::crc32c(&bytes[ATTRIBUTES_AT..]) != crc {
            self.rest = &[];
            return corrupt("its CRC does not match its bytes");
        }
        let last_offset_delta = be_i32(bytes, LAST_OFFSET_DELTA_AT);
        let count = be_i32(bytes, RECORD_COUNT_AT);
        if last_offset_delta < 0 || count < 0 {
            self.rest = &[];
            return corrupt("a negative record count or offset delta");
        }
        Some(Ok(Batch {
            bytes,
            base_offset: offset,
            last_offset: offset.saturating_add(last_offset_delta as i64),
            count: count as u32,
        }))
    }
}

/// The offset after the last whole batch of `records` (where the next
/// fetch starts), from the batch headers alone; `None` if not one batch
/// is whole. The batches are checked when they are read.
pub fn next_offset_after(records: &[u8]) -> Option<i64> {
    let mut rest = records;
    let mut next = None;
    while rest.len() >= HEADER_LEN {
        let Ok(length) = usize::try_from(be_i32(rest, 8)) else { break };
        let total = LOG_OVERHEAD + length;
        if total < HEADER_LEN || total > rest.len() || rest[MAGIC_AT] != 2 {
            break;
        }
        let last =
            be_i64(rest, 0).saturating_add(i64::from(be_i32(rest, LAST_OFFSET_DELTA_AT).max(0)));
        next = Some(last.saturating_add(1));
        rest = &rest[total..];
    }
    next
}

/// One record batch.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'r> {
    bytes: &'r [u8],
    base_offset: i64,
    last_offset: i64,
    count: u32,
}

/// A record of a batch: its offset, key and value (`None`: null).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'r> {
    /// Its offset in the partition.
    pub offset: i64,
    /// Its key.
    pub key: Option<&'r [u8]>,
    /// Its value (`None`: a tombstone).
    pub value: Option<&'r [u8]>,
}

impl<'r> Batch<'r> {
    /// Its last offset: the next fetch starts after it, whatever it held.
    pub fn last_offset(&self) -> i64 {
        self.last_offset
    }

    fn attributes(&self) -> u16 {
        be_i16(self.bytes, ATTRIBUTES_AT) as u16
    }

    fn producer_id(&self) -> i64 {
        be_i64(self.bytes, PRODUCER_ID_AT)
    }

    fn is_transactional(&self) -> bool {
        self.attributes() & TRANSACTIONAL != 0
    }

    fn is_control(&self) -> bool {
        self.attributes() & CONTROL != 0
    }

    /// Whether it is a transaction's abort marker.
    fn is_abort_marker(&self) -> Result<bool, BatchError> {
        if !self.is_control() {
            return Ok(false);
        }
        // One record, whose key is a version (i16) and a type (i16). The
        // log cleaner may keep a marker's batch with its record removed
        // (the last batch of a producer): it marks nothing any more.
        match self.records()?.next() {
            None => Ok(false),
            Some(Ok(Record { key: Some(key), .. })) if key.len() >= 4 => {
                Ok(be_i16(key, 2) == CONTROL_ABORT)
            }
            Some(Err(err)) => Err(err),
            Some(Ok(_)) => Err(BatchError::Corrupt {
                offset: self.base_offset,
                why: "a control record without a type",
            }),
        }
    }

    /// Its records, in offset order; a compressed batch is unsupported.
    pub fn records(&self) -> Result<Records<'r>, BatchError> {
        let codec = self.attributes() & COMPRESSION_MASK;
        if codec != 0 {
            let name = match codec {
                1 => "gzip",
                2 => "snappy",
                3 => "lz4",
                4 => "zstd",
                _ => "an unknown codec",
            };
            return Err(BatchError::Unsupported {
                offset: self.base_offset,
                what: format!("compressed ({name})"),
            });
        }
        let last_delta = self.last_offset - self.base_offset;
        Ok(Records {
            rest: &self.bytes[HEADER_LEN..],
            left: self.count,
            base_offset: self.base_offset,
            last_delta,
        })
    }
}

/// The records of an uncompressed batch.
pub struct Records<'r> {
    rest: &'r [u8],
    left: u32,
    base_offset: i64,
    /// The batch's last offset delta: no record's lies past it.
    last_delta: i64,
}

impl<'r> Records<'r> {
    fn corrupt(&mut self, why: &'static str) -> Option<Result<Record<'r>, BatchError>> {
        self.left = 0;
        Some(Err(BatchError::Corrupt { offset: self.base_offset, why }))
    }
}

impl<'r> Iterator for Records<'r> {
    type Item = Result<Record<'r>, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let Some(length) = read_varint(&mut self.rest) else {
            return self.corrupt("a record's length is cut off");
        };
        let Some(body) = usize::try_from(length).ok().filter(|&length| length <= self.rest.len())
        else {
            return self.corrupt("a record is longer than its batch");
        };
        let (mut body, rest) = self.rest.split_at(body);
        self.rest = rest;
        // attributes (unused), timestamp delta (unused), offset delta, key, value; headers are ignored.
        let fields = (|| {
            let (_, rest) = body.split_first()?;
            body = rest;
            read_varint(&mut body)?;
            let offset_delta = read_varint(&mut body)?;
            let key = read_bytes(&mut body)?;
            let value = read_bytes(&mut body)?;
            Some((offset_delta, key, value))
        })();
        let Some((offset_delta, key, value)) = fields else {
            return self.corrupt("a record's fields run past its length");
        };
        if !(0..=self.last_delta).contains(&offset_delta) {
            return self.corrupt("a record's offset lies outside its batch");
        }
        Some(Ok(Record { offset: self.base_offset.saturating_add(offset_delta), key, value }))
    }
}

/// Reads a zigzag varint (Kafka's `varint` and `varlong`), at most ten bytes.
fn read_varint(bytes: &mut &[u8]) -> Option<i64> {
    let mut value: u64 = 0;
    for (n, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * n);
        if byte & 0x80 == 0 {
            *bytes = &bytes[n + 1..];
            return Some((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    None
}

/// Reads a varint length and that many bytes; a length of -1 is null.
fn read_bytes<'r>(bytes: &mut &'r [u8]) -> Option<Option<&'r [u8]>> {
    let length = read_varint(bytes)?;
    if length == -1 {
        return Some(None);
    }
    let length = usize::try_from(length).ok().filter(|&length| length <= bytes.len())?;
    let (value, rest) = bytes.split_at(length);
    *bytes = rest;
    Some(Some(value))
}

/// What a `read_committed` consumer skips in one partition's part of a
/// fetch response, given the aborted transactions the broker listed for
/// it (producer id, first offset): control batches, and the batches of a
/// transaction from its listed first offset up to its abort marker. The
/// Java client's rule (`CompletedFetch`).
pub struct ReadCommitted {
    /// Listed aborted transactions not reached yet, the latest first.
    pending: Vec<(i64, i64)>,
    /// Producers whose transaction is aborted at the current batch.
    aborted: HashSet<i64>,
}

impl ReadCommitted {
    /// The filter for a partition the broker listed `aborted` for, as
    /// (producer id, first offset) pairs in any order.
    pub fn new(aborted: impl IntoIterator<Item = (i64, i64)>) -> ReadCommitted {
        let mut pending: Vec<(i64, i64)> =
            aborted.into_iter().map(|(producer, first)| (first, producer)).collect();
        pending.sort_unstable_by(|a, b| b.cmp(a));
        ReadCommitted { pending, aborted: HashSet::new() }
    }

    /// Whether `batch`'s records are for the reader (batches come in offset order).
    pub fn keeps(&mut self, batch: &Batch<'_>) -> Result<bool, BatchError> {
        while let Some(&(first, producer)) = self.pending.last() {
            if first > batch.last_offset {
                break;
            }
            self.pending.pop();
            self.aborted.insert(producer);
        }
        if batch.is_abort_marker()? {
            let producer = batch.producer_id();
            self.aborted.remove(&producer);
            return Ok(false);
        }
        if batch.is_control() {
            return Ok(false); // a commit marker
        }
        Ok(!(batch.is_transactional() && self.aborted.contains(&batch.producer_id())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_varint(out: &mut Vec<u8>, value: i64) {
        let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
        loop {
            let byte = (zigzag & 0x7f) as u8;
            zigzag >>= 7;
            if zigzag == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn put_bytes(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
        match bytes {
            None => put_varint(out, -1),
            Some(bytes) => {
                put_varint(out, bytes.len() as i64);
                out.extend_from_slice(bytes);
            }
        }
    }

    /// How a test batch is made.
    #[derive(Clone, Copy, Default)]
    struct Kind {
        producer: i64,
        transactional: bool,
        /// `Some(true)`: an abort marker; `Some(false)`: a commit marker.
        control: Option<bool>,
        /// A control batch whose record the log cleaner removed.
        cleaned: bool,
        codec: u16,
    }

    /// A test record: offset delta, key, value.
    type Written<'a> = (i64, Option<&'a [u8]>, Option<&'a [u8]>);
    /// A record read: offset, key, value.
    type Read = (i64, Vec<u8>, Option<Vec<u8>>);

    /// A v2 batch at `base` of `records`, with a header on each record
    /// (which readers skip).
    fn batch(base: i64, kind: Kind, records: &[Written<'_>]) -> Vec<u8> {
        let mut body = Vec::new();
        let control_key;
        let records: Vec<Written<'_>> = match kind.control {
            Some(_) if kind.cleaned => Vec::new(),
            Some(abort) => {
                control_key = [0u8, 0, 0, if abort { 0 } else { 1 }];
                vec![(0, Some(&control_key[..]), Some(&[0u8, 0, 0, 0, 0, 0][..]))]
            }
            None => records.to_vec(),
        };
        for (delta, key, value) in &records {
            let mut record = vec![0u8]; // attributes
            put_varint(&mut record, 7); // timestamp delta
            put_varint(&mut record, *delta);
            put_bytes(&mut record, *key);
            put_bytes(&mut record, *value);
            put_varint(&mut record, 1); // one header
            put_bytes(&mut record, Some(b"h"));
            put_bytes(&mut record, Some(b"header value"));
            put_varint(&mut body, record.len() as i64);
            body.extend_from_slice(&record);
        }
        let last_delta = records.iter().map(|record| record.0).max().unwrap_or(0);
        let mut attributes = kind.codec;
        if kind.transactional || kind.control.is_some() {
            attributes |= TRANSACTIONAL;
        }
        if kind.control.is_some() {
            attributes |= CONTROL;
        }
        let mut after_crc = Vec::new();
        after_crc.extend_from_slice(&attributes.to_be_bytes());
        after_crc.extend_from_slice(&(last_delta as i32).to_be_bytes());
        after_crc.extend_from_slice(&0i64.to_be_bytes()); // base timestamp
        after_crc.extend_from_slice(&0i64.to_be_bytes()); // max timestamp
        after_crc.extend_from_slice(&kind.producer.to_be_bytes());
        after_crc.extend_from_slice(&0i16.to_be_bytes()); // producer epoch
        after_crc.extend_from_slice(&0i32.to_be_bytes()); // base sequence
        after_crc.extend_from_slice(&(records.len() as i32).to_be_bytes());
        after_crc.extend_from_slice(&body);
        let mut out = Vec::new();
        out.extend_from_slice(&base.to_be_bytes());
        out.extend_from_slice(&((4 + 1 + 4 + after_crc.len()) as i32).to_be_bytes());
        out.extend_from_slice(&0i32.to_be_bytes()); // leader epoch
        out.push(2);
        out.extend_from_slice(&crc32c::crc32c(&after_crc).to_be_bytes());
        out.extend_from_slice(&after_crc);
        out
    }

    /// What a read_committed reader gets from `records`: (offset, key, value).
    fn read(records: &[u8], aborted: &[(i64, i64)]) -> Result<Vec<Read>, BatchError> {
        let mut filter = ReadCommitted::new(aborted.iter().copied());
        let mut out = Vec::new();
        for batch in Batches::new(records) {
            let batch = batch?;
            if filter.keeps(&batch)? {
                for record in batch.records()? {
                    let record = record?;
                    out.push((
                        record.offset,
                        record.key.unwrap_or_default().to_vec(),
                        record.value.map(<[u8]>::to_vec),
                    ));
                }
            }
        }
        Ok(out)
    }

    #[test]
    fn records_are_read_in_place_with_their_offsets_keys_values_and_tombstones() {
        let mut records = batch(
            100,
            Kind::default(),
            &[(0, Some(b"a"), Some(b"1")), (1, Some(b"b"), None), (3, None, Some(b""))],
        );
        records.extend(batch(104, Kind::default(), &[(0, Some(b"c"), Some(&[7u8; 300]))]));
        let read = read(&records, &[]).unwrap();
        assert_eq!(
            read,
            vec![
                (100, b"a".to_vec(), Some(b"1".to_vec())),
                (101, b"b".to_vec(), None),
                (103, Vec::new(), Some(Vec::new())),
                (104, b"c".to_vec(), Some(vec![7; 300]))
            ]
        );
        let last: Vec<i64> =
            Batches::new(&records).map(|batch| batch.unwrap().last_offset()).collect();
        assert_eq!(last, vec![103, 104], "a batch's last offset is where the next fetch starts");
    }

    #[test]
    fn a_batch_cut_off_by_the_response_limit_ends_the_batches() {
        let mut records = batch(0, Kind::default(), &[(0, Some(b"a"), Some(b"1"))]);
        let whole = records.len();
        records.extend(batch(1, Kind::default(), &[(0, Some(b"b"), Some(b"2"))]));
        for cut in whole..records.len() {
            let batches: Vec<_> = Batches::new(&records[..cut]).collect();
            assert_eq!(batches.len(), 1, "cut at {cut}");
            assert_eq!(
                next_offset_after(&records[..cut]),
                Some(1),
                "the next fetch starts after the whole batch (cut at {cut})"
            );
        }
        assert_eq!(next_offset_after(&records), Some(2));
        assert_eq!(next_offset_after(&records[..whole - 1]), None, "no whole batch");
    }

    #[test]
    fn aborted_transactions_and_markers_are_skipped_as_a_read_committed_consumer_does() {
        let (p1, p2) = (
            Kind { producer: 1, transactional: true, ..Kind::default() },
            Kind { producer: 2, transactional: true, ..Kind::default() },
        );
        let abort = |producer| Kind { producer, control: Some(true), ..Kind::default() };
        let commit = |producer| Kind { producer, control: Some(false), ..Kind::default() };
        let mut records = Vec::new();
        records.extend(batch(0, p1, &[(0, Some(b"p1-aborted"), Some(b"x"))]));
        records.extend(batch(1, p2, &[(0, Some(b"p2-committed"), Some(b"y"))]));
        records.extend(batch(2, p1, &[(0, Some(b"p1-aborted-too"), Some(b"x"))]));
        records.extend(batch(3, abort(1), &[]));
        records.extend(batch(4, commit(2), &[]));
        records.extend(batch(5, p1, &[(0, Some(b"p1-committed"), Some(b"z"))]));
        records.extend(batch(6, commit(1), &[]));
        records.extend(batch(7, Kind::default(), &[(0, Some(b"plain"), Some(b"w"))]));
        let keys = |read: Vec<Read>| {
            read.into_iter()
                .map(|(offset, key, _)| (offset, String::from_utf8(key).unwrap()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keys(read(&records, &[(1, 0)]).unwrap()),
            vec![(1, "p2-committed".into()), (5, "p1-committed".into()), (7, "plain".into())],
            "p1's transaction from offset 0 to its abort marker is skipped; its next one is not"
        );
        assert_eq!(
            keys(read(&records, &[]).unwrap()).len(),
            5,
            "without the abort listed, only markers are skipped"
        );
    }

    #[test]
    fn a_marker_the_log_cleaner_emptied_is_skipped_and_marks_nothing() {
        let p1 = Kind { producer: 1, transactional: true, ..Kind::default() };
        let emptied = Kind { producer: 1, control: Some(true), cleaned: true, ..Kind::default() };
        let mut records = batch(10, emptied, &[]);
        records.extend(batch(11, p1, &[(0, Some(b"committed"), Some(b"v"))]));
        records.extend(batch(
            12,
            Kind { producer: 1, control: Some(false), ..Kind::default() },
            &[],
        ));
        let read = read(&records, &[]).unwrap();
        assert_eq!(read, vec![(11, b"committed".to_vec(), Some(b"v".to_vec()))]);
    }

    #[test]
    fn a_record_whose_offset_lies_outside_its_batch_is_corrupt() {
        let records = batch(
            100,
            Kind::default(),
            &[(0, Some(b"a"), Some(b"1")), (-1, Some(b"b"), Some(b"2"))],
        );
        assert_eq!(
            read(&records, &[]),
            Err(BatchError::Corrupt {
                offset: 100,
                why: "a record's offset lies outside its batch"
            })
        );
        let mut records = batch(
            i64::MAX - 1,
            Kind::default(),
            &[(0, Some(b"a"), Some(b"1")), (1, Some(b"b"), Some(b"2"))],
        );
        // The header's last offset delta says 0; the second record says 1.
        records[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4]
            .copy_from_slice(&0i32.to_be_bytes());
        let crc = crc32c::crc32c(&records[ATTRIBUTES_AT..]);
        records[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(
            read(&records, &[]),
            Err(BatchError::Corrupt {
                offset: i64::MAX - 1,
                why: "a record's offset lies outside its batch"
            })
        );
    }

    #[test]
    fn compressed_batches_and_old_formats_are_unsupported_and_bad_bytes_corrupt() {
        let gzip = batch(5, Kind { codec: 1, ..Kind::default() }, &[(0, Some(b"k"), Some(b"v"))]);
        fn batch_of(bytes: &[u8]) -> Result<Batch<'_>, BatchError> {
            Batches::new(bytes).next().unwrap()
        }
        assert_eq!(
            batch_of(&gzip).unwrap().records().err(),
            Some(BatchError::Unsupported { offset: 5, what: "compressed (gzip)".into() })
        );
        let mut old = batch(5, Kind::default(), &[(0, Some(b"k"), Some(b"v"))]);
        old[MAGIC_AT] = 1;
        assert!(matches!(batch_of(&old), Err(BatchError::Unsupported { offset: 5, .. })));
        let mut flipped = batch(5, Kind::default(), &[(0, Some(b"k"), Some(b"v"))]);
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(
            batch_of(&flipped).err(),
            Some(BatchError::Corrupt { offset: 5, why: "its CRC does not match its bytes" })
        );
    }

    /// Re-signs a batch whose bytes a test changed after its CRC.
    fn resign(batch: &mut [u8]) {
        let crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
        batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    }

    #[test]
    fn hostile_lengths_are_corrupt_never_a_panic_or_a_read_past_the_batch() {
        let good = batch(
            0,
            Kind::default(),
            &[(0, Some(b"key"), Some(b"value")), (1, Some(b"k2"), Some(b"v2"))],
        );
        // Every byte of the records, set to every interesting value, re-signed.
        for at in HEADER_LEN..good.len() {
            for value in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[at] = value;
                resign(&mut bad);
                let _ = read(&bad, &[]);
            }
        }
        // A record count far above what the batch holds.
        let mut many = good.clone();
        many[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&i32::MAX.to_be_bytes());
        resign(&mut many);
        assert!(matches!(read(&many, &[]), Err(BatchError::Corrupt { .. })));
        // A batch length below a header's.
        let mut short = good.clone();
        short[8..12].copy_from_slice(&1i32.to_be_bytes());
        assert!(matches!(read(&short, &[]), Err(BatchError::Corrupt { .. })));
    }

    #[test]
    fn varints_read_as_kafka_writes_them() {
        for value in [
            0i64,
            1,
            -1,
            63,
            -64,
            64,
            300,
            -300,
            i32::MAX as i64,
            i32::MIN as i64,
            i64::MAX,
            i64::MIN,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            let mut bytes = &out[..];
            assert_eq!(read_varint(&mut bytes), Some(value));
            assert!(bytes.is_empty());
        }
        assert_eq!(read_varint(&mut &[0x80u8; 11][..]), None, "more than ten bytes is no varint");
    }
}
