//! One connection to a partition leader that fetches a topic's records
//! for a restore: Kafka's own Fetch request (`read_committed`,
//! [`crate::fetch_wire`]), each answer read whole into one buffer whose
//! record batches the restore walks in place ([`crate::record_batch`]).
//!
//! librdkafka's consumer hands every record over as a queued operation of
//! its own (an allocation, a lock and reference counts on each): about
//! half a microsecond of CPU per record, more than the rest of a restore
//! together. Reading a partition to an end known up front needs none of
//! its machinery (groups, queues, offset stores), so a restore fetches
//! for itself where it can: plaintext listeners, the changelog as Tally
//! writes it (see `docs/kafka-mode.md`, "Restoring state").

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::fetch_wire::{self, FETCH_VERSIONS, FetchAnswer, FetchRequest};

/// A response may exceed the fetch's byte limit by one record batch
/// (KIP-74); one larger than the limit plus this is refused.
const RESPONSE_SLACK: usize = 16 << 20;
/// Most bytes of an answer to ApiVersions (Kafka's is under 1 KiB).
const API_VERSIONS_MAX: usize = 1 << 20;

/// How fetches are sized and how long a broker may wait to fill one.
#[derive(Debug, Clone)]
pub struct FetchSettings {
    /// `fetch.wait.max.ms`.
    pub max_wait: Duration,
    /// `fetch.max.bytes`: a response's limit.
    pub max_bytes: i32,
    /// `max.partition.fetch.bytes`: one partition's limit in a response.
    pub partition_max_bytes: i32,
    /// `client.id`, for the broker's logs and quotas.
    pub client_id: String,
}

/// Why a leader connection failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaderError {
    /// The connection failed or was closed: connect again (the leader may
    /// have moved).
    #[error("the connection to broker {broker} failed: {source}")]
    Io {
        /// The broker's address.
        broker: String,
        /// Why.
        source: std::io::Error,
    },
    /// The broker answered something this reader does not speak: read
    /// with librdkafka instead.
    #[error("broker {broker} {why}")]
    Unsupported {
        /// The broker's address.
        broker: String,
        /// What it answered.
        why: String,
    },
}

impl LeaderError {
    /// Whether connecting again may help (otherwise, read another way).
    pub fn is_retriable(&self) -> bool {
        matches!(self, LeaderError::Io { .. })
    }
}

/// A Fetch answer's bytes, received whole; [`Answer::read`] reads it in
/// place. Hand it back with [`LeaderConnection::reuse`] so the next answer
/// is received into the same buffer.
pub struct Answer {
    /// The answer as received: its size, the correlation id, the body.
    bytes: Vec<u8>,
    version: i16,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("bytes", &self.bytes.len())
            .field("version", &self.version)
            .finish()
    }
}

/// Where an answer's body starts: after its size and correlation id.
const BODY_AT: usize = 8;

impl Answer {
    /// The answer's partitions, their record batches slices of it.
    pub fn read(&self) -> Result<FetchAnswer<'_>, fetch_wire::Malformed> {
        fetch_wire::fetch_answer(&self.bytes[BODY_AT..], self.version)
    }
}

/// A connection to one broker, fetching one topic's partitions.
pub struct LeaderConnection {
    stream: TcpStream,
    broker: String,
    fetch_version: i16,
    next_correlation: i32,
    /// The correlation id of the request sent and not yet answered.
    in_flight: Option<i32>,
    /// The answer being read: its size, then its bytes.
    incoming: Vec<u8>,
    /// Bytes of `incoming` read so far.
    received: usize,
    /// Bytes of `incoming` already counted as progress.
    counted: usize,
    outgoing: Vec<u8>,
    largest_response: usize,
}

impl LeaderConnection {
    /// Connects to `broker` (`host:port`) within `timeout` and asks which
    /// Fetch versions it serves.
    pub fn connect(
        broker: &str,
        settings: &FetchSettings,
        timeout: Duration,
    ) -> Result<LeaderConnection, LeaderError> {
        let io = |source| LeaderError::Io { broker: broker.to_string(), source };
        // Each address the name resolves to, in turn (a name may resolve
        // to an IPv6 address first and the broker listen on IPv4 only),
        // all within `timeout`.
        let deadline = Instant::now() + timeout;
        let mut failed =
            std::io::Error::new(ErrorKind::NotFound, "the address resolves to nothing");
        let mut connected = None;
        for address in broker.to_socket_addrs().map_err(io)? {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                failed = std::io::Error::new(
                    ErrorKind::TimedOut,
                    format!("no address answered within {timeout:?}"),
                );
                break;
            }
            match TcpStream::connect_timeout(&address, left) {
                Ok(stream) => {
                    connected = Some(stream);
                    break;
                }
                Err(err) => failed = err,
            }
        }
        let stream = connected.ok_or_else(|| io(failed))?;
        stream.set_nodelay(true).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        let largest_response =
            usize::try_from(settings.max_bytes.max(settings.partition_max_bytes)).unwrap_or(0)
                + RESPONSE_SLACK;
        let mut connection = LeaderConnection {
            stream,
            broker: broker.to_string(),
            fetch_version: 0,
            next_correlation: 0,
            in_flight: None,
            incoming: Vec::new(),
            received: 0,
            counted: 0,
            outgoing: Vec::new(),
            largest_response,
        };
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        connection.fetch_version = connection.negotiate(settings, left)?;
        Ok(connection)
    }

    /// The broker's address.
    pub fn broker(&self) -> &str {
        &self.broker
    }

    /// Whether a fetch was sent and not answered yet.
    pub fn is_fetching(&self) -> bool {
        self.in_flight.is_some()
    }

    fn unsupported(&self, why: String) -> LeaderError {
        LeaderError::Unsupported { broker: self.broker.clone(), why }
    }

    fn io(&self, source: std::io::Error) -> LeaderError {
        LeaderError::Io { broker: self.broker.clone(), source }
    }

    /// Asks the broker's API versions; picks the Fetch version to use.
    fn negotiate(
        &mut self,
        settings: &FetchSettings,
        timeout: Duration,
    ) -> Result<i16, LeaderError> {
        let correlation = self.correlation();
        self.outgoing.clear();
        fetch_wire::api_versions_request(&mut self.outgoing, correlation, &settings.client_id);
        self.send()?;
        let deadline = Instant::now() + timeout;
        let answer = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(
                    self.io(std::io::Error::new(ErrorKind::TimedOut, "no answer to ApiVersions"))
                );
            }
            if let Some(answer) = self.receive(left, API_VERSIONS_MAX)? {
                break answer;
            }
        };
        let versions = fetch_wire::fetch_versions(&answer[BODY_AT..])
            .map_err(|err| self.unsupported(format!("answered ApiVersions: {err}")))?;
        let fetch = versions.map_err(|code| {
            self.unsupported(format!("answered ApiVersions with error code {code}"))
        })?;
        let usable = fetch
            .map(|(min, max)| (min.max(*FETCH_VERSIONS.start()), max.min(*FETCH_VERSIONS.end())));
        match usable {
            Some((low, high)) if low <= high => Ok(high),
            _ => Err(self.unsupported(format!(
                "serves Fetch versions {}, none of {}..={} spoken here",
                fetch.map_or("none".to_string(), |(min, max)| format!("{min}..={max}")),
                FETCH_VERSIONS.start(),
                FETCH_VERSIONS.end()
            ))),
        }
    }

    fn correlation(&mut self) -> i32 {
        self.next_correlation = self.next_correlation.wrapping_add(1);
        self.next_correlation
    }

    /// Writes the request in `outgoing`; one is in flight at a time.
    fn send(&mut self) -> Result<(), LeaderError> {
        debug_assert!(self.in_flight.is_none(), "one request at a time");
        self.stream.write_all(&self.outgoing).map_err(|err| self.io(err))?;
        self.in_flight = Some(self.next_correlation);
        Ok(())
    }

    /// Sends a `read_committed` fetch of `topic`'s `partitions`, each from
    /// its offset, in the order given (a broker always returns the first
    /// partition with data, whatever its size: rotate the order so each
    /// gets to be first).
    pub fn send_fetch(
        &mut self,
        topic: &str,
        partitions: &[(i32, i64)],
        settings: &FetchSettings,
    ) -> Result<(), LeaderError> {
        let correlation = self.correlation();
        let fetch = FetchRequest {
            max_wait_ms: i32::try_from(settings.max_wait.as_millis()).unwrap_or(i32::MAX),
            max_bytes: settings.max_bytes,
            partition_max_bytes: settings.partition_max_bytes,
            topic,
            partitions,
        };
        self.outgoing.clear();
        fetch_wire::fetch_request(
            &mut self.outgoing,
            self.fetch_version,
            correlation,
            &settings.client_id,
            &fetch,
        );
        self.send()
    }

    /// The answer to the fetch in flight, if it arrives within `wait`;
    /// `None` otherwise (what arrived of it is kept for the next call).
    pub fn receive_fetch(&mut self, wait: Duration) -> Result<Option<Answer>, LeaderError> {
        Ok(self
            .receive(wait, self.largest_response)?
            .map(|bytes| Answer { bytes, version: self.fetch_version }))
    }

    /// Whether at least `bytes` more of the answer being received came
    /// since this last said so: a large answer on a slow link is progress
    /// before it is whole.
    pub fn partial_progress(&mut self, bytes: usize) -> bool {
        let grown = self.received >= self.counted + bytes;
        if grown {
            self.counted = self.received;
        }
        grown
    }

    /// Takes back an answer's buffer, for the next one (its bytes are
    /// overwritten, not zeroed first).
    pub fn reuse(&mut self, answer: Answer) {
        if self.received == 0 {
            self.incoming = answer.bytes;
        }
    }

    /// Reads the answer to the request in flight within about `wait` (a
    /// broker trickling bytes holds it up to twice that): its size,
    /// at most `largest` bytes (checked before the buffer grows for it),
    /// then its bytes, whose correlation id must be the request's.
    /// Returns all of it, from its size on.
    fn receive(&mut self, wait: Duration, largest: usize) -> Result<Option<Vec<u8>>, LeaderError> {
        let Some(expected) = self.in_flight else {
            return Err(self.unsupported("sent an answer nobody asked for".into()));
        };
        let wait = wait.max(Duration::from_millis(1));
        self.stream.set_read_timeout(Some(wait)).map_err(|err| self.io(err))?;
        let deadline = Instant::now() + wait;
        loop {
            let wanted = if self.received < 4 {
                4
            } else {
                let size = i32::from_be_bytes(self.incoming[..4].try_into().expect("four bytes"));
                match usize::try_from(size) {
                    Ok(size) if (4..=largest).contains(&size) => 4 + size,
                    _ => {
                        return Err(self.unsupported(format!(
                            "sent a response of {size} bytes; one takes 4 to {largest} (a fetch's: fetch.max.bytes plus a batch)"
                        )));
                    }
                }
            };
            if self.received == wanted && wanted > 4 {
                self.incoming.truncate(wanted);
                let answer = std::mem::take(&mut self.incoming);
                self.received = 0;
                self.counted = 0;
                let (correlation, _) = fetch_wire::split_header(&answer[4..])
                    .map_err(|err| self.unsupported(err.to_string()))?;
                if correlation != expected {
                    return Err(self.unsupported(format!(
                        "answered request {correlation} while request {expected} was in flight"
                    )));
                }
                self.in_flight = None;
                return Ok(Some(answer));
            }
            if self.incoming.len() < wanted {
                self.incoming.resize(wanted, 0);
            }
            match self.stream.read(&mut self.incoming[self.received..wanted]) {
                Ok(0) => {
                    return Err(self.io(std::io::Error::new(
                        ErrorKind::UnexpectedEof,
                        "the broker closed the connection",
                    )));
                }
                Ok(read) => {
                    self.received += read;
                    if self.received < wanted && Instant::now() >= deadline {
                        return Ok(None); // what came is kept for the next call
                    }
                }
                Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Ok(None);
                }
                Err(err) if err.kind() == ErrorKind::Interrupted => {}
                Err(err) => return Err(self.io(err)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn settings() -> FetchSettings {
        FetchSettings {
            max_wait: Duration::from_millis(10),
            max_bytes: 1 << 20,
            partition_max_bytes: 1 << 20,
            client_id: "test".into(),
        }
    }

    /// Reads one request frame; returns its correlation id.
    fn read_request(stream: &mut TcpStream) -> i32 {
        let mut size = [0u8; 4];
        stream.read_exact(&mut size).unwrap();
        let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
        stream.read_exact(&mut body).unwrap();
        i32::from_be_bytes(body[4..8].try_into().unwrap()) // after the API key and version
    }

    /// An ApiVersions v0 answer listing Fetch with `versions`.
    fn api_versions(correlation: i32, versions: (i16, i16)) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&correlation.to_be_bytes());
        body.extend_from_slice(&0i16.to_be_bytes()); // no error
        body.extend_from_slice(&1i32.to_be_bytes()); // one API
        for value in [1, versions.0, versions.1] {
            body.extend_from_slice(&value.to_be_bytes());
        }
        let mut frame = (body.len() as i32).to_be_bytes().to_vec();
        frame.extend(body);
        frame
    }

    /// A broker on loopback that answers one connection with `script`.
    fn broker(script: impl FnOnce(TcpStream) + Send + 'static) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || script(listener.accept().unwrap().0));
        address
    }

    /// A broker that serves Fetch 4 to 17, reads the first fetch and
    /// answers it with `script`.
    fn fetch_broker(script: impl FnOnce(TcpStream) + Send + 'static) -> String {
        broker(|mut stream| {
            let correlation = read_request(&mut stream);
            stream.write_all(&api_versions(correlation, (4, 17))).unwrap();
            read_request(&mut stream);
            script(stream)
        })
    }

    #[test]
    fn a_broker_trickling_its_answer_does_not_hold_the_reader_past_its_wait() {
        let address = fetch_broker(|mut stream| {
            stream.write_all(&400i32.to_be_bytes()).unwrap();
            // A byte every 25 ms: ten seconds for the whole answer.
            for _ in 0..400 {
                std::thread::sleep(Duration::from_millis(25));
                if stream.write_all(&[0]).is_err() {
                    return;
                }
            }
        });
        let mut connection =
            LeaderConnection::connect(&address, &settings(), Duration::from_secs(5)).unwrap();
        connection.send_fetch("changelog", &[(0, 0)], &settings()).unwrap();
        let started = Instant::now();
        assert!(
            connection.receive_fetch(Duration::from_millis(100)).unwrap().is_none(),
            "the answer is not whole yet"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "held for {:?}: the restore's stall limit could not act",
            started.elapsed()
        );
        assert!(connection.is_fetching(), "what came is kept for the next call");
    }

    #[test]
    fn a_large_answer_still_arriving_is_progress_a_trickle_is_not() {
        let (sent_half, go_on) = std::sync::mpsc::channel::<()>();
        let address = fetch_broker(move |mut stream| {
            stream.write_all(&(512i32 << 10).to_be_bytes()).unwrap();
            stream.write_all(&[0; 256 << 10]).unwrap();
            let _ = go_on.recv(); // the test has looked: a trickle next
            let _ = stream.write_all(&[0; 100]);
            std::thread::sleep(Duration::from_secs(2));
        });
        let mut connection =
            LeaderConnection::connect(&address, &settings(), Duration::from_secs(5)).unwrap();
        connection.send_fetch("changelog", &[(0, 0)], &settings()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while connection.received < 4 + (256 << 10) {
            assert!(
                connection.receive_fetch(Duration::from_millis(50)).unwrap().is_none(),
                "half an answer is not whole"
            );
            assert!(Instant::now() < deadline, "256 KiB of the answer never came");
        }
        assert!(connection.partial_progress(64 << 10), "256 KiB of an answer are progress");
        sent_half.send(()).unwrap();
        assert!(connection.receive_fetch(Duration::from_millis(200)).unwrap().is_none());
        assert!(!connection.partial_progress(64 << 10), "100 bytes more are not 64 KiB more");
    }

    #[test]
    fn a_broker_without_fetch_4_to_10_is_unsupported_naming_what_it_serves() {
        let address = broker(|mut stream| {
            let correlation = read_request(&mut stream);
            stream.write_all(&api_versions(correlation, (0, 3))).unwrap();
        });
        let Err(err) = LeaderConnection::connect(&address, &settings(), Duration::from_secs(5))
        else {
            panic!("connected")
        };
        assert!(!err.is_retriable());
        assert!(
            err.to_string().contains("serves Fetch versions 0..=3, none of 4..=10 spoken here"),
            "{err}"
        );
    }

    #[test]
    fn an_oversized_answer_is_refused_before_it_is_read_and_a_closed_connection_is_retried() {
        let address = fetch_broker(|mut stream| {
            stream.write_all(&i32::MAX.to_be_bytes()).unwrap();
            std::thread::sleep(Duration::from_secs(1));
        });
        let mut connection =
            LeaderConnection::connect(&address, &settings(), Duration::from_secs(5)).unwrap();
        assert_eq!(
            connection.fetch_version, 10,
            "the highest version spoken here that the broker serves"
        );
        connection.send_fetch("changelog", &[(0, 0)], &settings()).unwrap();
        let err = connection.receive_fetch(Duration::from_secs(5)).expect_err("refused");
        assert!(!err.is_retriable());
        assert!(
            err.to_string()
                .contains("sent a response of 2147483647 bytes; one takes 4 to 17825792"),
            "{err}"
        );

        let address = fetch_broker(drop); // and hang up
        let mut connection =
            LeaderConnection::connect(&address, &settings(), Duration::from_secs(5)).unwrap();
        connection.send_fetch("changelog", &[(0, 0)], &settings()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let err = loop {
            match connection.receive_fetch(Duration::from_millis(100)) {
                Err(err) => break err,
                Ok(_) => assert!(
                    std::time::Instant::now() < deadline,
                    "the closed connection was never noticed"
                ),
            }
        };
        assert!(err.is_retriable(), "{err}");
    }
}
