//! A billing receiver for the delivery tests: a real HTTP/1.1 server on
//! loopback (keep-alive, requests parsed by `httparse`) that applies each
//! idempotency key once, counts every request with its body, and fails on
//! purpose as its [`Faults`] say: 500s, 429 with `Retry-After`, the
//! connection dropped after it applied the request, an answer slower than
//! the client's timeout, a terminal 400, and keys whose every request is
//! applied and never answered. `GET <path>/<key>` looks a key up: 200
//! applied, 404 never applied.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most bytes of a request this receiver reads.
const MAX_REQUEST_BYTES: usize = 1 << 20;

/// How the receiver misbehaves.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Per mille of first requests for a key answered 500 (not applied).
    pub error_500: u64,
    /// Per mille answered 429 with `Retry-After: 1` (not applied).
    pub too_many: u64,
    /// Per mille applied, then the connection dropped without an answer.
    pub drop_after_apply: u64,
    /// Per mille applied, then answered after this long (beyond the
    /// client's timeout).
    pub slow: u64,
    /// How long a slow answer takes.
    pub slow_answer: Duration,
    /// How long every answer takes.
    pub latency: Duration,
    /// Keys answered 400 on every request.
    pub refuse: BTreeSet<String>,
    /// Keys applied and never answered, on every request.
    pub never_answer: BTreeSet<String>,
}

/// What the receiver saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Applied keys: their body and the order in which they were applied.
    pub applied: BTreeMap<String, (Vec<u8>, u64)>,
    /// Every `POST` for each key, its body.
    pub requests: BTreeMap<String, Vec<Vec<u8>>>,
    /// Every `POST`, in all.
    pub posts: u64,
    /// Every lookup, by key.
    pub lookups: BTreeMap<String, u64>,
    /// `POST`s without an idempotency key.
    pub without_key: u64,
}

/// A running receiver; it stops when dropped.
pub struct Receiver {
    /// Its address, `127.0.0.1:<port>`.
    pub address: String,
    seen: Arc<Mutex<Seen>>,
    stopping: Arc<AtomicBool>,
}

impl Receiver {
    /// Starts a receiver that misbehaves as `faults` say.
    pub fn start(faults: Faults) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stopping = Arc::new(AtomicBool::new(false));
        let faults = Arc::new(faults);
        let (shared, stop) = (seen.clone(), stopping.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (seen, faults) = (shared.clone(), faults.clone());
                std::thread::spawn(move || serve(stream, &seen, &faults));
            }
        });
        Receiver { address, seen, stopping }
    }

    /// `http://127.0.0.1:<port>/usage`.
    pub fn url(&self) -> String {
        format!("http://{}/usage", self.address)
    }

    /// What it saw so far.
    pub fn seen<T>(&self, read: impl FnOnce(&Seen) -> T) -> T {
        read(&self.seen.lock().unwrap())
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.address);
    }
}

/// A stable per-mille draw for a key.
fn per_mille(key: &str, salt: u64) -> u64 {
    let mut hash: u64 = 0xcbf29ce484222325 ^ salt;
    for byte in key.bytes() {
        hash = (hash ^ byte as u64).wrapping_mul(0x100000001b3);
    }
    hash % 1000
}

/// Serves one connection's requests until it closes or a fault drops it.
fn serve(mut stream: TcpStream, seen: &Mutex<Seen>, faults: &Faults) {
    let mut buffer = Vec::new();
    loop {
        let Some((method, path, key, body)) = read_request(&mut stream, &mut buffer) else {
            return;
        };
        std::thread::sleep(faults.latency);
        if method == "GET" {
            let key = percent_encoding::percent_decode_str(path.rsplit('/').next().unwrap_or(""))
                .decode_utf8_lossy()
                .into_owned();
            let applied = {
                let mut seen = seen.lock().unwrap();
                *seen.lookups.entry(key.clone()).or_default() += 1;
                seen.applied.contains_key(&key)
            };
            if !answer(&mut stream, if applied { 200 } else { 404 }, &[]) {
                return;
            }
            continue;
        }
        let Some(key) = key else {
            seen.lock().unwrap().without_key += 1;
            if !answer(&mut stream, 400, &[]) {
                return;
            }
            continue;
        };
        let first = {
            let mut seen = seen.lock().unwrap();
            seen.posts += 1;
            let requests = seen.requests.entry(key.clone()).or_default();
            requests.push(body.clone());
            requests.len() == 1
        };
        if faults.refuse.contains(&key) {
            if !answer(&mut stream, 400, &[]) {
                return;
            }
            continue;
        }
        let draw = per_mille(&key, 7);
        let mut bands = [faults.error_500, faults.too_many, faults.drop_after_apply, faults.slow]
            .into_iter()
            .scan(0, |sum, band| {
                *sum += band;
                Some(*sum)
            });
        let fault = if first { bands.position(|upper| draw < upper) } else { None };
        match fault {
            Some(0) => {
                if !answer(&mut stream, 500, &[]) {
                    return;
                }
                continue;
            }
            Some(1) => {
                if !answer(&mut stream, 429, &[("Retry-After", "1")]) {
                    return;
                }
                continue;
            }
            _ => {}
        }
        apply(seen, &key, &body);
        if fault == Some(2) || faults.never_answer.contains(&key) {
            return; // dropped after applying
        }
        if fault == Some(3) {
            std::thread::sleep(faults.slow_answer);
        }
        if !answer(&mut stream, 200, &[]) {
            return;
        }
    }
}

/// Applies `key` once.
fn apply(seen: &Mutex<Seen>, key: &str, body: &[u8]) {
    let mut seen = seen.lock().unwrap();
    let order = seen.applied.len() as u64;
    seen.applied.entry(key.to_string()).or_insert_with(|| (body.to_vec(), order));
}

/// Reads one request: method, path, idempotency key, body.
fn read_request(
    stream: &mut TcpStream,
    buffer: &mut Vec<u8>,
) -> Option<(String, String, Option<String>, Vec<u8>)> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut request = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(head)) = request.parse(buffer) {
            let method = request.method?.to_string();
            let path = request.path?.to_string();
            let header = |name: &str| {
                request
                    .headers
                    .iter()
                    .find(|header| header.name.eq_ignore_ascii_case(name))
                    .map(|header| String::from_utf8_lossy(header.value).into_owned())
            };
            let key = header("Idempotency-Key");
            let length: usize =
                header("Content-Length").and_then(|value| value.trim().parse().ok()).unwrap_or(0);
            if length > MAX_REQUEST_BYTES {
                return None;
            }
            while buffer.len() < head + length {
                if !fill(stream, buffer) {
                    return None;
                }
            }
            let body = buffer[head..head + length].to_vec();
            buffer.drain(..head + length);
            return Some((method, path, key, body));
        }
        if buffer.len() > MAX_REQUEST_BYTES || !fill(stream, buffer) {
            return None;
        }
    }
}

fn fill(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> bool {
    let mut chunk = [0; 16 << 10];
    match stream.read(&mut chunk) {
        Ok(0) | Err(_) => false,
        Ok(read) => {
            buffer.extend_from_slice(&chunk[..read]);
            true
        }
    }
}

/// Answers with `status` and an empty body; false when the client is gone.
fn answer(stream: &mut TcpStream, status: u16, headers: &[(&str, &str)]) -> bool {
    let mut head = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).is_ok()
}
