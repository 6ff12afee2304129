//! The two Kafka requests a restore sends and the answers it reads, in
//! Kafka's wire format: ApiVersions v0, and Fetch v4 to v10 (Kafka 4
//! serves 4 and up; from 11 on a broker may answer from a follower, and
//! send a consumer to one; from 12 the format is "flexible", with tagged
//! fields, and from 13 a fetch names topics by id). Up to v10 only a
//! partition's leader answers a consumer's fetch: one that is not says
//! so (error 6), and the restore looks the leader up again.
//!
//! Written out rather than taken from a protocol crate: an answer is
//! read in place, its record batches as slices of the one buffer it was
//! received into, and every count and length in it is checked against
//! the bytes that hold it before anything is sized by it (a generated
//! codec reserves room for however many elements a count claims; a count
//! of two billion partitions would abort the process).

/// API keys.
const FETCH: i16 = 1;
const API_VERSIONS: i16 = 18;

/// Fetch versions written and read here.
pub const FETCH_VERSIONS: std::ops::RangeInclusive<i16> = 4..=10;

/// An answer that does not parse as the request's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("its answer is malformed: {0}")]
pub struct Malformed(pub &'static str);

/// A bounds-checked reader of an answer's bytes.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Malformed> {
        if self.rest.len() < n {
            return Err(Malformed(what));
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(taken)
    }

    fn i16(&mut self) -> Result<i16, Malformed> {
        Ok(i16::from_be_bytes(
            self.take(2, "cut off in a 16-bit field")?.try_into().expect("two bytes"),
        ))
    }

    fn i32(&mut self) -> Result<i32, Malformed> {
        Ok(i32::from_be_bytes(
            self.take(4, "cut off in a 32-bit field")?.try_into().expect("four bytes"),
        ))
    }

    fn i64(&mut self) -> Result<i64, Malformed> {
        Ok(i64::from_be_bytes(
            self.take(8, "cut off in a 64-bit field")?.try_into().expect("eight bytes"),
        ))
    }

    /// A string (its length as i16; -1: null, read as empty).
    fn string(&mut self) -> Result<&'a [u8], Malformed> {
        match self.i16()? {
            -1 => Ok(&[]),
            len if len >= 0 => self.take(len as usize, "a string longer than the answer"),
            _ => Err(Malformed("a negative string length")),
        }
    }

    /// Bytes (their length as i32; -1: null, read as empty).
    fn bytes(&mut self) -> Result<&'a [u8], Malformed> {
        match self.i32()? {
            -1 => Ok(&[]),
            len if len >= 0 => self.take(len as usize, "bytes longer than the answer"),
            _ => Err(Malformed("a negative byte length")),
        }
    }

    /// An array's length (-1: null, read as empty), checked against the
    /// bytes left: each element takes at least `min_size` of them.
    fn array(&mut self, min_size: usize) -> Result<usize, Malformed> {
        match self.i32()? {
            -1 => Ok(0),
            len if len >= 0 && (len as usize).saturating_mul(min_size) <= self.rest.len() => {
                Ok(len as usize)
            }
            _ => Err(Malformed("an array longer than the answer")),
        }
    }
}

/// Appends a request (size, header v1, `body`) to `out`.
fn request(
    out: &mut Vec<u8>,
    api_key: i16,
    version: i16,
    correlation: i32,
    client_id: &str,
    body: impl FnOnce(&mut Vec<u8>),
) {
    let start = out.len();
    out.extend_from_slice(&0i32.to_be_bytes()); // the size, once known
    out.extend_from_slice(&api_key.to_be_bytes());
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&correlation.to_be_bytes());
    put_string(out, client_id);
    body(out);
    let size = (out.len() - start - 4) as i32;
    out[start..start + 4].copy_from_slice(&size.to_be_bytes());
}

fn put_string(out: &mut Vec<u8>, text: &str) {
    let len = text.len().min(i16::MAX as usize);
    out.extend_from_slice(&(len as i16).to_be_bytes());
    out.extend_from_slice(&text.as_bytes()[..len]);
}

/// Appends an ApiVersions v0 request to `out`.
pub fn api_versions_request(out: &mut Vec<u8>, correlation: i32, client_id: &str) {
    request(out, API_VERSIONS, 0, correlation, client_id, |_| {});
}

/// The correlation id an answer (response header v0) begins with, and
/// its body.
pub fn split_header(answer: &[u8]) -> Result<(i32, &[u8]), Malformed> {
    let mut reader = Reader { rest: answer };
    let correlation = reader.i32()?;
    Ok((correlation, reader.rest))
}

/// The Fetch versions an ApiVersions v0 answer's `body` lists, or its
/// error code.
pub fn fetch_versions(body: &[u8]) -> Result<Result<Option<(i16, i16)>, i16>, Malformed> {
    let mut reader = Reader { rest: body };
    let error = reader.i16()?;
    if error != 0 {
        return Ok(Err(error));
    }
    let mut fetch = None;
    for _ in 0..reader.array(6)? {
        let (key, min, max) = (reader.i16()?, reader.i16()?, reader.i16()?);
        if key == FETCH {
            fetch = Some((min, max));
        }
    }
    Ok(Ok(fetch))
}

/// What a fetch asks for.
pub struct FetchRequest<'r> {
    /// Longest the broker waits for `min_bytes` (1) to arrive.
    pub max_wait_ms: i32,
    /// Most bytes in the answer.
    pub max_bytes: i32,
    /// Most bytes of one partition in the answer.
    pub partition_max_bytes: i32,
    /// The topic.
    pub topic: &'r str,
    /// Partitions and the offset to fetch each from, in order.
    pub partitions: &'r [(i32, i64)],
}

/// Appends a `read_committed` Fetch request (`version` in
/// [`FETCH_VERSIONS`]), outside any fetch session, to `out`.
pub fn fetch_request(
    out: &mut Vec<u8>,
    version: i16,
    correlation: i32,
    client_id: &str,
    fetch: &FetchRequest<'_>,
) {
    debug_assert!(FETCH_VERSIONS.contains(&version));
    request(out, FETCH, version, correlation, client_id, |out| {
        out.extend_from_slice(&(-1i32).to_be_bytes()); // replica id: a consumer
        out.extend_from_slice(&fetch.max_wait_ms.to_be_bytes());
        out.extend_from_slice(&1i32.to_be_bytes()); // min bytes
        out.extend_from_slice(&fetch.max_bytes.to_be_bytes());
        out.push(1); // isolation level: read_committed
        if version >= 7 {
            out.extend_from_slice(&0i32.to_be_bytes()); // session id: none
            out.extend_from_slice(&(-1i32).to_be_bytes()); // session epoch: a full fetch, no session (KIP-227)
        }
        out.extend_from_slice(&1i32.to_be_bytes()); // one topic
        put_string(out, fetch.topic);
        out.extend_from_slice(&(fetch.partitions.len() as i32).to_be_bytes());
        for &(partition, offset) in fetch.partitions {
            out.extend_from_slice(&partition.to_be_bytes());
            if version >= 9 {
                out.extend_from_slice(&(-1i32).to_be_bytes()); // current leader epoch: unknown
            }
            out.extend_from_slice(&offset.to_be_bytes());
            if version >= 5 {
                out.extend_from_slice(&(-1i64).to_be_bytes()); // log start offset: a consumer's
            }
            out.extend_from_slice(&fetch.partition_max_bytes.to_be_bytes());
        }
        if version >= 7 {
            out.extend_from_slice(&0i32.to_be_bytes()); // no forgotten topics
        }
    });
}

/// A Fetch answer, read in place.
#[derive(Debug)]
pub struct FetchAnswer<'a> {
    /// The answer's own error code (v7 and up; 0 before).
    pub error_code: i16,
    /// Each partition's part, in the order given.
    pub partitions: Vec<PartitionAnswer<'a>>,
}

/// One partition's part of a Fetch answer.
#[derive(Debug)]
pub struct PartitionAnswer<'a> {
    /// Its topic.
    pub topic: &'a [u8],
    /// The partition.
    pub partition: i32,
    /// Kafka's error code for it.
    pub error_code: i16,
    /// Aborted transactions in what it holds: (producer id, first offset).
    pub aborted: Vec<(i64, i64)>,
    /// Its record batches (the last one may be cut off).
    pub records: &'a [u8],
}

/// Reads the body of a Fetch answer of `version`.
pub fn fetch_answer(body: &[u8], version: i16) -> Result<FetchAnswer<'_>, Malformed> {
    let mut reader = Reader { rest: body };
    // The throttle time: a broker that throttles a client for a quota
    // also stops reading its connection for that long (KIP-219), so the
    // next fetch waits for it without being told.
    reader.i32()?;
    let mut error_code = 0;
    if version >= 7 {
        error_code = reader.i16()?;
        reader.i32()?; // session id
    }
    let mut partitions = Vec::new();
    // A topic is at least its name's length and its partition count.
    for _ in 0..reader.array(6)? {
        let topic = reader.string()?;
        // A partition's part is at least 4 + 2 + 8 + 8 + 4 + 4 bytes.
        for _ in 0..reader.array(30)? {
            let partition = reader.i32()?;
            let error_code = reader.i16()?;
            reader.i64()?; // high watermark
            reader.i64()?; // last stable offset
            if version >= 5 {
                reader.i64()?; // log start offset
            }
            let count = reader.array(16)?;
            let mut aborted = Vec::with_capacity(count);
            for _ in 0..count {
                aborted.push((reader.i64()?, reader.i64()?));
            }
            let records = reader.bytes()?;
            partitions.push(PartitionAnswer { topic, partition, error_code, aborted, records });
        }
    }
    Ok(FetchAnswer { error_code, partitions })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One partition's part: partition, error, last stable offset,
    /// aborted transactions, records.
    type Part = (i32, i16, i64, Vec<(i64, i64)>, Vec<u8>);

    /// A Fetch answer of `version` for one topic.
    fn answer(version: i16, topic: &str, partitions: &[Part]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&7i32.to_be_bytes()); // throttle
        if version >= 7 {
            out.extend_from_slice(&0i16.to_be_bytes());
            out.extend_from_slice(&0i32.to_be_bytes());
        }
        out.extend_from_slice(&1i32.to_be_bytes());
        put_string(&mut out, topic);
        out.extend_from_slice(&(partitions.len() as i32).to_be_bytes());
        for (partition, error, lso, aborted, records) in partitions {
            out.extend_from_slice(&partition.to_be_bytes());
            out.extend_from_slice(&error.to_be_bytes());
            out.extend_from_slice(&1000i64.to_be_bytes());
            out.extend_from_slice(&lso.to_be_bytes());
            if version >= 5 {
                out.extend_from_slice(&0i64.to_be_bytes());
            }
            out.extend_from_slice(&(aborted.len() as i32).to_be_bytes());
            for (producer, first) in aborted {
                out.extend_from_slice(&producer.to_be_bytes());
                out.extend_from_slice(&first.to_be_bytes());
            }
            out.extend_from_slice(&(records.len() as i32).to_be_bytes());
            out.extend_from_slice(records);
        }
        out
    }

    #[test]
    fn fetch_answers_of_every_version_read_in_place() {
        for version in FETCH_VERSIONS {
            let bytes = answer(
                version,
                "changelog",
                &[
                    (0, 0, 500, vec![(9, 40), (3, 10)], b"batches".to_vec()),
                    (3, 6, -1, vec![], vec![]),
                ],
            );
            let read = fetch_answer(&bytes, version).unwrap();
            assert_eq!(read.partitions.len(), 2, "v{version}");
            let first = &read.partitions[0];
            assert_eq!((first.topic, first.partition, first.error_code), (&b"changelog"[..], 0, 0));
            assert_eq!(first.aborted, vec![(9, 40), (3, 10)]);
            assert_eq!(first.records, b"batches");
            assert_eq!((read.partitions[1].partition, read.partitions[1].error_code), (3, 6));
        }
    }

    #[test]
    fn counts_and_lengths_past_the_answer_are_malformed_before_anything_is_sized_by_them() {
        let version = 10;
        let bytes = answer(version, "t", &[(0, 0, 5, vec![(1, 2)], b"records".to_vec())]);
        // Every cut is malformed, never a panic.
        for cut in 0..bytes.len() {
            assert!(fetch_answer(&bytes[..cut], version).is_err(), "cut at {cut}");
        }
        // Counts of two billion elements, in each array.
        let topics_at = 4 + 2 + 4;
        let partitions_at = topics_at + 4 + 2 + 1;
        let aborted_at = partitions_at + 4 + 4 + 2 + 8 + 8 + 8;
        for at in [topics_at, partitions_at, aborted_at] {
            let mut huge = bytes.clone();
            huge[at..at + 4].copy_from_slice(&i32::MAX.to_be_bytes());
            assert_eq!(
                fetch_answer(&huge, version).unwrap_err(),
                Malformed("an array longer than the answer"),
                "count at {at}"
            );
        }
        let mut many_versions = 0i16.to_be_bytes().to_vec();
        many_versions.extend_from_slice(&i32::MAX.to_be_bytes());
        assert!(fetch_versions(&many_versions).is_err());
    }

    #[test]
    fn requests_are_framed_with_their_size_and_header() {
        let mut out = Vec::new();
        let partitions = [(2, 77)];
        let fetch = FetchRequest {
            max_wait_ms: 10,
            max_bytes: 1 << 20,
            partition_max_bytes: 1 << 16,
            topic: "changelog",
            partitions: &partitions,
        };
        fetch_request(&mut out, 10, 5, "tally", &fetch);
        let size = i32::from_be_bytes(out[..4].try_into().unwrap()) as usize;
        assert_eq!(size, out.len() - 4);
        assert_eq!(
            &out[4..12],
            &[0, 1, 0, 10, 0, 0, 0, 5],
            "API key 1 (Fetch), v10, correlation 5"
        );
        // The fixed fields of a v4 request: 4 + 4 + 4 + 4 + 1 after the header.
        let mut v4 = Vec::new();
        fetch_request(&mut v4, 4, 5, "tally", &fetch);
        let header = 4 + 2 + 2 + 4 + 2 + "tally".len();
        let topic = 4 + 2 + "changelog".len() + 4 + (4 + 8 + 4);
        assert_eq!(v4.len(), header + 17 + topic);
    }
}
