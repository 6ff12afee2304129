//! One connection to a partition leader that fetches a topic's records
//! for a restore: Kafka's own Fetch request, `read_committed`, each
//! response read whole into one buffer whose record batches the restore
//! walks in place ([`crate::record_batch`]).
//!
//! librdkafka's consumer hands every record over as a queued operation of
//! its own (an allocation, a lock and reference counts on each): about
//! half a microsecond of CPU per record, more than the rest of a restore
//! together. Reading a partition to an end known up front needs none of
//! its machinery (groups, queues, offset stores), so a restore fetches
//! for itself where it can: plaintext listeners, the changelog as Tally
//! writes it (see `docs/kafka-mode.md`, "Restore").
//!
//! The messages are encoded and decoded by the `kafka-protocol` crate:
//! ApiVersions first, then Fetch at the highest version from 4 (the
//! oldest Kafka 4 serves) to 12 (from 13 on, a fetch names topics by id)
//! that the broker serves.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, FetchRequest, FetchResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};

/// Fetch versions spoken here: Kafka 4 serves 4 and up; 13 and up name
/// topics by id.
const FETCH_VERSIONS: std::ops::RangeInclusive<i16> = 4..=12;
/// The ApiVersions version asked with: every broker serves it.
const API_VERSIONS_VERSION: i16 = 0;
/// `isolation_level` of a `read_committed` fetch.
const READ_COMMITTED: i8 = 1;
/// A fetch outside any fetch session (KIP-227): session 0, epoch -1.
const NO_SESSION_EPOCH: i32 = -1;
/// A response may exceed the fetch's byte limit by one record batch
/// (KIP-74); one larger than the limit plus this is refused.
const RESPONSE_SLACK: usize = 16 << 20;

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

/// A connection to one broker, fetching one topic's partitions.
pub struct LeaderConnection {
    stream: TcpStream,
    broker: String,
    fetch_version: i16,
    next_correlation: i32,
    /// The correlation id of the fetch sent and not yet answered.
    in_flight: Option<i32>,
    /// The response being read: its size, then its bytes.
    incoming: BytesMut,
    /// Bytes of `incoming` read so far.
    received: usize,
    outgoing: BytesMut,
    largest_response: usize,
}

impl LeaderConnection {
    /// Connects to `broker` (`host:port`) within `timeout` and asks which
    /// Fetch versions it serves.
    pub fn connect(broker: &str, settings: &FetchSettings, timeout: Duration) -> Result<LeaderConnection, LeaderError> {
        let io = |source| LeaderError::Io { broker: broker.to_string(), source };
        let address = broker
            .to_socket_addrs()
            .map_err(io)?
            .next()
            .ok_or_else(|| io(std::io::Error::new(ErrorKind::NotFound, "the address resolves to nothing")))?;
        let stream = TcpStream::connect_timeout(&address, timeout).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        let largest_response = usize::try_from(settings.max_bytes.max(settings.partition_max_bytes)).unwrap_or(0) + RESPONSE_SLACK;
        let mut connection = LeaderConnection {
            stream,
            broker: broker.to_string(),
            fetch_version: 0,
            next_correlation: 0,
            in_flight: None,
            incoming: BytesMut::new(),
            received: 0,
            outgoing: BytesMut::new(),
            largest_response,
        };
        connection.fetch_version = connection.negotiate(settings, timeout)?;
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
    fn negotiate(&mut self, settings: &FetchSettings, timeout: Duration) -> Result<i16, LeaderError> {
        let header_version = ApiVersionsRequest::header_version(API_VERSIONS_VERSION);
        self.send(ApiKey::ApiVersions, API_VERSIONS_VERSION, header_version, &ApiVersionsRequest::default(), &settings.client_id)?;
        let deadline = std::time::Instant::now() + timeout;
        let mut body = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(self.io(std::io::Error::new(ErrorKind::TimedOut, "no answer to ApiVersions")));
            }
            if let Some(body) = self.receive_frame(left)? {
                break body;
            }
        };
        self.check_header(&mut body, ApiVersionsResponse::header_version(API_VERSIONS_VERSION))?;
        let versions = ApiVersionsResponse::decode(&mut body, API_VERSIONS_VERSION)
            .map_err(|err| self.unsupported(format!("sent an ApiVersions answer that does not decode: {err}")))?;
        if versions.error_code != 0 {
            return Err(self.unsupported(format!("answered ApiVersions with error code {}", versions.error_code)));
        }
        let fetch = versions.api_keys.iter().find(|api| api.api_key == ApiKey::Fetch as i16);
        let usable = fetch.map(|api| (api.min_version.max(*FETCH_VERSIONS.start()), api.max_version.min(*FETCH_VERSIONS.end())));
        match usable {
            Some((low, high)) if low <= high => Ok(high),
            _ => Err(self.unsupported(format!(
                "serves Fetch versions {}, none of {}..={} spoken here",
                fetch.map_or("none".to_string(), |api| format!("{}..={}", api.min_version, api.max_version)),
                FETCH_VERSIONS.start(),
                FETCH_VERSIONS.end()
            ))),
        }
    }

    /// Sends one request: size, header, body.
    fn send(&mut self, key: ApiKey, version: i16, header_version: i16, request: &impl Encodable, client_id: &str) -> Result<(), LeaderError> {
        self.next_correlation = self.next_correlation.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.next_correlation)
            .with_client_id(Some(StrBytes::from_string(client_id.to_string())));
        self.outgoing.clear();
        self.outgoing.put_i32(0);
        let encoded = header.encode(&mut self.outgoing, header_version).and_then(|()| request.encode(&mut self.outgoing, version));
        encoded.map_err(|err| self.unsupported(format!("cannot be sent a request of {key:?} v{version}: {err}")))?;
        let size = (self.outgoing.len() - 4) as i32;
        self.outgoing[..4].copy_from_slice(&size.to_be_bytes());
        self.stream.write_all(&self.outgoing).map_err(|err| self.io(err))?;
        self.in_flight = Some(self.next_correlation);
        Ok(())
    }

    /// Sends a `read_committed` fetch of `topic`'s `partitions`, each from
    /// its offset, in the order given (a broker always returns the first
    /// partition with data, whatever its size: rotate the order so each
    /// gets to be first). One fetch is in flight at a time.
    pub fn send_fetch(&mut self, topic: &str, partitions: &[(i32, i64)], settings: &FetchSettings) -> Result<(), LeaderError> {
        debug_assert!(self.in_flight.is_none(), "one fetch at a time");
        let partitions = partitions
            .iter()
            .map(|&(partition, offset)| {
                FetchPartition::default()
                    .with_partition(partition)
                    .with_current_leader_epoch(-1)
                    .with_fetch_offset(offset)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(settings.partition_max_bytes)
            })
            .collect();
        let topic = FetchTopic::default().with_topic(TopicName(StrBytes::from_string(topic.to_string()))).with_partitions(partitions);
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(i32::try_from(settings.max_wait.as_millis()).unwrap_or(i32::MAX))
            .with_min_bytes(1)
            .with_max_bytes(settings.max_bytes)
            .with_isolation_level(READ_COMMITTED)
            .with_session_id(0)
            .with_session_epoch(NO_SESSION_EPOCH)
            .with_topics(vec![topic]);
        let version = self.fetch_version;
        self.send(ApiKey::Fetch, version, FetchRequest::header_version(version), &request, &settings.client_id)
    }

    /// The answer to the fetch in flight, if it arrives within `wait`;
    /// `None` otherwise (what arrived of it is kept for the next call).
    pub fn receive_fetch(&mut self, wait: Duration) -> Result<Option<FetchResponse>, LeaderError> {
        let Some(mut body) = self.receive_frame(wait)? else { return Ok(None) };
        let version = self.fetch_version;
        self.check_header(&mut body, FetchResponse::header_version(version))?;
        let response =
            FetchResponse::decode(&mut body, version).map_err(|err| self.unsupported(format!("sent a Fetch answer that does not decode: {err}")))?;
        Ok(Some(response))
    }

    /// Checks the response header's correlation id against the request in flight.
    fn check_header(&mut self, body: &mut Bytes, header_version: i16) -> Result<(), LeaderError> {
        let header =
            ResponseHeader::decode(body, header_version).map_err(|err| self.unsupported(format!("sent a header that does not decode: {err}")))?;
        let expected = self.in_flight.take();
        if Some(header.correlation_id) != expected {
            return Err(self.unsupported(format!("answered request {} while request {expected:?} was in flight", header.correlation_id)));
        }
        Ok(())
    }

    /// Reads one response frame within `wait`: its size (bounded before
    /// anything is allocated for it), then its bytes.
    fn receive_frame(&mut self, wait: Duration) -> Result<Option<Bytes>, LeaderError> {
        if self.in_flight.is_none() {
            return Err(self.unsupported("sent an answer nobody asked for".into()));
        }
        self.stream.set_read_timeout(Some(wait.max(Duration::from_millis(1)))).map_err(|err| self.io(err))?;
        loop {
            let wanted = if self.received < 4 {
                4
            } else {
                let size = (&self.incoming[..4]).get_i32();
                match usize::try_from(size) {
                    Ok(size) if (4..=self.largest_response).contains(&size) => 4 + size,
                    _ => {
                        return Err(self.unsupported(format!(
                            "sent a response of {size} bytes; a fetch takes 4 to {} (fetch.max.bytes plus a batch)",
                            self.largest_response
                        )));
                    }
                }
            };
            if self.received == wanted && wanted > 4 {
                let mut frame = self.incoming.split_to(wanted).freeze();
                frame.advance(4);
                self.received = 0;
                return Ok(Some(frame));
            }
            if self.incoming.len() < wanted {
                self.incoming.resize(wanted, 0);
            }
            match self.stream.read(&mut self.incoming[self.received..wanted]) {
                Ok(0) => return Err(self.io(std::io::Error::new(ErrorKind::UnexpectedEof, "the broker closed the connection"))),
                Ok(read) => self.received += read,
                Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Ok(None),
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
        FetchSettings { max_wait: Duration::from_millis(10), max_bytes: 1 << 20, partition_max_bytes: 1 << 20, client_id: "test".into() }
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
        for value in [ApiKey::Fetch as i16, versions.0, versions.1] {
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

    #[test]
    fn a_broker_without_fetch_4_to_12_is_unsupported_naming_what_it_serves() {
        let address = broker(|mut stream| {
            let correlation = read_request(&mut stream);
            stream.write_all(&api_versions(correlation, (0, 3))).unwrap();
        });
        let Err(err) = LeaderConnection::connect(&address, &settings(), Duration::from_secs(5)) else { panic!("connected") };
        assert!(!err.is_retriable());
        assert!(err.to_string().contains("serves Fetch versions 0..=3, none of 4..=12 spoken here"), "{err}");
    }

    #[test]
    fn an_oversized_answer_is_refused_before_it_is_read_and_a_closed_connection_is_retried() {
        let address = broker(|mut stream| {
            let correlation = read_request(&mut stream);
            stream.write_all(&api_versions(correlation, (4, 17))).unwrap();
            read_request(&mut stream);
            stream.write_all(&i32::MAX.to_be_bytes()).unwrap();
            std::thread::sleep(Duration::from_secs(1));
        });
        let mut connection = LeaderConnection::connect(&address, &settings(), Duration::from_secs(5)).unwrap();
        assert_eq!(connection.fetch_version, 12, "the highest version spoken here that the broker serves");
        connection.send_fetch("changelog", &[(0, 0)], &settings()).unwrap();
        let err = connection.receive_fetch(Duration::from_secs(5)).expect_err("refused");
        assert!(!err.is_retriable());
        assert!(err.to_string().contains("sent a response of 2147483647 bytes; a fetch takes 4 to 17825792"), "{err}");

        let address = broker(|mut stream| {
            let correlation = read_request(&mut stream);
            stream.write_all(&api_versions(correlation, (4, 17))).unwrap();
            read_request(&mut stream); // and hang up
        });
        let mut connection = LeaderConnection::connect(&address, &settings(), Duration::from_secs(5)).unwrap();
        connection.send_fetch("changelog", &[(0, 0)], &settings()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let err = loop {
            match connection.receive_fetch(Duration::from_millis(100)) {
                Err(err) => break err,
                Ok(_) => assert!(std::time::Instant::now() < deadline, "the closed connection was never noticed"),
            }
        };
        assert!(err.is_retriable(), "{err}");
    }
}
