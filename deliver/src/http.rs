//! The HTTP target: each record `POST`ed with its idempotency key in a
//! header, on keep-alive connections (ureq, rustls with the system's
//! roots); each answer classified as delivered, refused for good, or to
//! be retried, and whether the request may have been applied.

use std::io::Read as _;
use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use ureq::Agent;
use ureq::tls::{RootCerts, TlsConfig};

use crate::record::OutputRecord;
use crate::settings::HttpSettings;

/// Most bytes of a refusal's answer kept in the dead letter.
pub const MAX_ANSWER_BYTES: u64 = 1024;
/// Most bytes of any other answer read (so its connection can be reused).
const MAX_DRAINED_BYTES: u64 = 64 << 10;

/// Everything but RFC 3986's unreserved characters is percent-encoded in
/// a lookup URL's key.
const KEY_IN_URL: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// What one request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// A 2xx answer: the receiver applied it (or had already).
    Delivered,
    /// A 4xx answer that retrying cannot change: a dead letter.
    Refused {
        /// The status.
        status: u16,
        /// The first KiB of the answer.
        answer: String,
    },
    /// Try again later.
    Retry {
        /// What happened.
        reason: String,
        /// Whether the receiver may have applied the request (anything but
        /// a connection that never opened).
        maybe_applied: bool,
        /// The receiver's `Retry-After`, if it gave one.
        retry_after: Option<Duration>,
    },
}

/// What a lookup by key said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// 200: the receiver applied it.
    Applied,
    /// 404: the receiver never applied it.
    NeverApplied,
    /// Anything else: ask again later.
    Unknown(String),
}

/// The HTTP target of a delivery.
pub struct HttpTarget {
    agent: Agent,
    settings: HttpSettings,
}

impl HttpTarget {
    /// A target with keep-alive connections for `settings.max_in_flight`
    /// requests at once.
    pub fn new(settings: HttpSettings) -> HttpTarget {
        let tls = TlsConfig::builder().root_certs(RootCerts::PlatformVerifier).build();
        let agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            // Each step bounded on its own: a global deadline costs a
            // socket-timeout syscall per read and write (4x fewer
            // requests a second on loopback, scripts/bench-deliver).
            .timeout_connect(Some(settings.connect_timeout))
            .timeout_send_request(Some(settings.timeout))
            .timeout_send_body(Some(settings.timeout))
            .timeout_recv_response(Some(settings.timeout))
            .timeout_recv_body(Some(settings.timeout))
            .max_idle_connections_per_host(settings.max_in_flight)
            .max_idle_connections(settings.max_in_flight)
            .tls_config(tls)
            .max_redirects(0)
            .user_agent(concat!("tally-deliver/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        HttpTarget { agent, settings }
    }

    /// `POST`s `record` once.
    pub fn send(&self, record: &OutputRecord) -> Attempt {
        let mut request = self
            .agent
            .post(&self.settings.url)
            .header(self.settings.idempotency_header.as_str(), record.idempotency_key.as_str())
            .content_type("application/json");
        if let Some((name, value)) = &self.settings.secret {
            request = request.header(name.as_str(), value.as_str());
        }
        let mut response = match request.send(&record.body[..]) {
            Ok(response) => response,
            Err(err) => return failed(&err),
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok())
            .and_then(parse_retry_after);
        let mut answer = Vec::new();
        let limit = if (400..500).contains(&status) { MAX_ANSWER_BYTES } else { MAX_DRAINED_BYTES };
        let read = response.body_mut().as_reader().take(limit).read_to_end(&mut answer);
        match status {
            200..=299 => Attempt::Delivered,
            // Timeout, conflict (the same key in flight), too early, too
            // many requests: the receiver asks to try again.
            408 | 409 | 425 | 429 => Attempt::Retry {
                reason: format!("the receiver answered {status}"),
                maybe_applied: true,
                retry_after,
            },
            400..=499 => {
                Attempt::Refused { status, answer: String::from_utf8_lossy(&answer).into_owned() }
            }
            _ => Attempt::Retry {
                reason: match read {
                    Ok(_) => format!("the receiver answered {status}"),
                    Err(err) => format!("the receiver answered {status}, then: {err}"),
                },
                maybe_applied: true,
                retry_after,
            },
        }
    }

    /// Asks the receiver whether it applied `key` (`lookup_url`), if one
    /// is configured.
    pub fn lookup(&self, key: &str) -> Option<Lookup> {
        let template = self.settings.lookup_url.as_ref()?;
        let url = template.replace("{key}", &utf8_percent_encode(key, KEY_IN_URL).to_string());
        let mut request = self.agent.get(&url);
        if let Some((name, value)) = &self.settings.secret {
            request = request.header(name.as_str(), value.as_str());
        }
        Some(match request.call() {
            Ok(mut response) => {
                let _ = response
                    .body_mut()
                    .as_reader()
                    .take(MAX_DRAINED_BYTES)
                    .read_to_end(&mut Vec::new());
                match response.status().as_u16() {
                    200 => Lookup::Applied,
                    404 => Lookup::NeverApplied,
                    status => Lookup::Unknown(format!("the lookup answered {status}")),
                }
            }
            Err(err) => Lookup::Unknown(format!("the lookup failed: {err}")),
        })
    }
}

/// A request that got no answer: whether it may have reached the receiver.
fn failed(err: &ureq::Error) -> Attempt {
    use ureq::Timeout;
    let never_sent = matches!(
        err,
        ureq::Error::ConnectionFailed
            | ureq::Error::HostNotFound
            | ureq::Error::Timeout(Timeout::Resolve | Timeout::Connect)
    ) || matches!(err, ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused);
    Attempt::Retry {
        reason: format!("no answer: {err}"),
        maybe_applied: !never_sent,
        retry_after: None,
    }
}

/// A `Retry-After` value: seconds, or an HTTP date.
fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = jiff::fmt::rfc2822::parse(value).ok()?.timestamp();
    let wait = at.duration_since(jiff::Timestamp::now());
    Some(Duration::try_from(wait).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        assert_eq!(parse_retry_after(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO));
        let later = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(120);
        let date = jiff::fmt::rfc2822::to_string(&later.to_zoned(jiff::tz::TimeZone::UTC)).unwrap();
        let wait = parse_retry_after(&date).unwrap();
        assert!(wait > Duration::from_secs(100) && wait <= Duration::from_secs(120), "{wait:?}");
        assert_eq!(parse_retry_after("soon"), None);
    }

    #[test]
    fn a_key_in_a_lookup_url_is_percent_encoded() {
        let key = "billing/customer=acme/zone=America%2FNew_York/v1";
        assert_eq!(
            utf8_percent_encode(key, KEY_IN_URL).to_string(),
            "billing%2Fcustomer%3Dacme%2Fzone%3DAmerica%252FNew_York%2Fv1"
        );
    }
}
