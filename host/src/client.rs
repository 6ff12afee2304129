//! A client of `tally serve`'s admin API, for the CLI and for tests. Its
//! answers are the server's own types ([`crate::serve::wire`]).

use std::time::Duration;

use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The admin API's address when none is given.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7070";

/// A failed admin request.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The host answered with an error status; `message` says why.
    #[error("{message} (HTTP {status})")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// What is wrong, and the fix.
        message: String,
    },
    /// The host could not be reached or answered something unreadable.
    #[error(
        "cannot talk to the Tally host at {server}: {reason}; is `tally serve` running there? (--server or TALLY_SERVER)"
    )]
    Unreachable {
        /// The host's address.
        server: String,
        /// Why.
        reason: String,
    },
}

impl ClientError {
    /// The HTTP status of a refusal.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Refused { status, .. } => Some(*status),
            ClientError::Unreachable { .. } => None,
        }
    }
}

/// Talks to one host as one tenant (or as the metrics reader).
pub struct AdminClient {
    server: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl AdminClient {
    /// A client of the host at `server` (`http://host:port`) using `token`.
    pub fn new(server: &str, token: Option<&str>) -> AdminClient {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(200)))
            .build()
            .into();
        AdminClient {
            server: server.trim_end_matches('/').to_string(),
            token: token.map(str::to_string),
            agent,
        }
    }

    /// Sends a request; returns the JSON (or text, as a JSON string) answer.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Value, ClientError> {
        let url = format!("{}{path}", self.server);
        let unreachable =
            |reason: String| ClientError::Unreachable { server: self.server.clone(), reason };
        let mut builder = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(token) = &self.token {
            builder = builder.header("Authorization", format!("Bearer {token}"));
        }
        let (content_type, bytes) = body.unwrap_or(("application/octet-stream", Vec::new()));
        if !bytes.is_empty() {
            // The host refuses a request it would not take (a wrong token, a
            // body over its limit) before the body is sent, instead of
            // cutting the upload off halfway.
            builder = builder.header("Expect", "100-continue");
        }
        let request = builder
            .header("Content-Type", content_type)
            .body(bytes)
            .map_err(|err| unreachable(err.to_string()))?;
        let mut response = self.agent.run(request).map_err(|err| unreachable(err.to_string()))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|err| unreachable(err.to_string()))?;
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status >= 400 {
            let message = value
                .get("error")
                .and_then(Value::as_str)
                .map_or_else(|| value.to_string(), str::to_string);
            return Err(ClientError::Refused { status, message });
        }
        Ok(value)
    }

    /// Sends a request and reads the answer as `T`: one of
    /// [`crate::serve::wire`]'s types, or `serde_json::Value` for the JSON
    /// as it came.
    fn typed<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<T, ClientError> {
        let value = self.request(method, path, body)?;
        serde_json::from_value(value).map_err(|err| ClientError::Unreachable {
            server: self.server.clone(),
            reason: format!("the answer to {method} {path} is not what this client reads ({err}); is the host the same Tally version?"),
        })
    }

    /// The tenant's jobs: [`JobStatus`](crate::serve::wire::JobStatus)s (or the JSON itself, as `serde_json::Value`).
    pub fn list<T: DeserializeOwned>(&self) -> Result<T, ClientError> {
        self.typed("GET", "/v1/jobs", None)
    }

    /// One job's status: [`JobStatus`](crate::serve::wire::JobStatus) (or the JSON itself, as `serde_json::Value`).
    pub fn status<T: DeserializeOwned>(&self, job: &str) -> Result<T, ClientError> {
        self.typed("GET", &format!("/v1/jobs/{job}"), None)
    }

    /// Deploys a job file with its plugin component: [`JobStatus`](crate::serve::wire::JobStatus) (or the JSON itself, as `serde_json::Value`).
    pub fn deploy<T: DeserializeOwned>(
        &self,
        job_toml: &str,
        plugin: &[u8],
    ) -> Result<T, ClientError> {
        let body = serde_json::json!({ "job": job_toml, "plugin": base64::engine::general_purpose::STANDARD.encode(plugin) });
        self.typed("POST", "/v1/jobs", Some(("application/json", body.to_string().into_bytes())))
    }

    /// Pauses a job: [`JobStatus`](crate::serve::wire::JobStatus) (or the JSON itself, as `serde_json::Value`).
    pub fn pause<T: DeserializeOwned>(&self, job: &str) -> Result<T, ClientError> {
        self.typed("POST", &format!("/v1/jobs/{job}/pause"), None)
    }

    /// Resumes a job: [`JobStatus`](crate::serve::wire::JobStatus) (or the JSON itself, as `serde_json::Value`).
    pub fn resume<T: DeserializeOwned>(&self, job: &str) -> Result<T, ClientError> {
        self.typed("POST", &format!("/v1/jobs/{job}/resume"), None)
    }

    /// Deletes a job: [`Deleted`](crate::serve::wire::Deleted) (or the JSON itself, as `serde_json::Value`).
    pub fn delete<T: DeserializeOwned>(&self, job: &str) -> Result<T, ClientError> {
        self.typed("DELETE", &format!("/v1/jobs/{job}"), None)
    }

    /// Pushes a plugin version into a running job: [`PluginVersion`](crate::serve::wire::PluginVersion) (or the JSON itself, as `serde_json::Value`).
    pub fn push<T: DeserializeOwned>(&self, job: &str, plugin: &[u8]) -> Result<T, ClientError> {
        self.typed(
            "POST",
            &format!("/v1/jobs/{job}/plugin"),
            Some(("application/wasm", plugin.to_vec())),
        )
    }

    /// Starts a shadow of a job: the candidate `plugin` (none: the job's
    /// own; with `plugin_config`, a TOML table, and from `from`, if given)
    /// beside the live version;
    /// the job's [`JobStatus`](crate::serve::wire::JobStatus) (or the JSON itself, as `serde_json::Value`).
    pub fn start_shadow<T: DeserializeOwned>(
        &self,
        job: &str,
        plugin: Option<&[u8]>,
        plugin_config: Option<&str>,
        from: Option<&str>,
    ) -> Result<T, ClientError> {
        let plugin = plugin.map(|plugin| base64::engine::general_purpose::STANDARD.encode(plugin));
        let body = serde_json::to_vec(
            &serde_json::json!({ "plugin": plugin, "plugin_config": plugin_config, "from": from }),
        )
        .expect("a JSON object serializes");
        self.typed("POST", &format!("/v1/jobs/{job}/shadow"), Some(("application/json", body)))
    }

    /// Discards a job's shadow: [`Discarded`](crate::serve::wire::Discarded) (or the JSON itself, as `serde_json::Value`).
    pub fn discard_shadow<T: DeserializeOwned>(&self, job: &str) -> Result<T, ClientError> {
        self.typed("DELETE", &format!("/v1/jobs/{job}/shadow"), None)
    }

    /// Promotes a job's shadow to its live version: [`Promoted`](crate::serve::wire::Promoted) (or the JSON itself, as `serde_json::Value`).
    pub fn promote_shadow<T: DeserializeOwned>(&self, job: &str) -> Result<T, ClientError> {
        self.typed("POST", &format!("/v1/jobs/{job}/promote"), None)
    }

    /// Changes a job's deliveries in place to the `[[deliver]]` sections of
    /// `deliver` (TOML): its [`JobStatus`](crate::serve::wire::JobStatus) (or the JSON itself, as `serde_json::Value`).
    pub fn set_deliveries<T: DeserializeOwned>(
        &self,
        job: &str,
        deliver: &str,
    ) -> Result<T, ClientError> {
        let body = serde_json::to_vec(&serde_json::json!({ "deliver": deliver }))
            .expect("a JSON object serializes");
        self.typed("PUT", &format!("/v1/jobs/{job}/deliveries"), Some(("application/json", body)))
    }

    /// Every plugin version pushed to a job: [`PluginVersion`](crate::serve::wire::PluginVersion)s (or the JSON itself, as `serde_json::Value`).
    pub fn history<T: DeserializeOwned>(&self, job: &str) -> Result<T, ClientError> {
        self.typed("GET", &format!("/v1/jobs/{job}/plugin/history"), None)
    }

    /// Goes back to the job's previous plugin version: [`PluginVersion`](crate::serve::wire::PluginVersion) (or the JSON itself, as `serde_json::Value`).
    pub fn rollback<T: DeserializeOwned>(&self, job: &str) -> Result<T, ClientError> {
        self.typed("POST", &format!("/v1/jobs/{job}/plugin/rollback"), None)
    }

    /// One committed state value of a job: [`StateValue`](crate::serve::wire::StateValue) (or the JSON itself, as `serde_json::Value`).
    pub fn state_get<T: DeserializeOwned>(&self, job: &str, key: &str) -> Result<T, ClientError> {
        let key = percent_encoding::utf8_percent_encode(key, percent_encoding::NON_ALPHANUMERIC);
        self.typed("GET", &format!("/v1/jobs/{job}/state?key={key}"), None)
    }

    /// The host's metrics in Prometheus text format.
    pub fn metrics(&self) -> Result<String, ClientError> {
        match self.request("GET", "/metrics", None)? {
            Value::String(text) => Ok(text),
            other => Ok(other.to_string()),
        }
    }
}
