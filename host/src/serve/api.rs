//! The admin API over HTTP: JSON in and out, one bearer token per tenant.
//!
//! | method and path                         | what it does                          |
//! |-----------------------------------------|---------------------------------------|
//! | `GET /v1/jobs`                          | the tenant's jobs and their status    |
//! | `POST /v1/jobs`                         | deploy `{"job": toml, "plugin": base64}` |
//! | `GET /v1/jobs/<job>`                    | one job's status                      |
//! | `DELETE /v1/jobs/<job>`                 | stop and delete a job                 |
//! | `POST /v1/jobs/<job>/pause`, `/resume`  | pause or resume a job                 |
//! | `POST /v1/jobs/<job>/plugin`            | push a plugin version (body: the component) |
//! | `GET /v1/jobs/<job>/plugin/history`     | every version pushed                  |
//! | `POST /v1/jobs/<job>/plugin/rollback`   | go back to the previous version       |
//! | `GET /v1/jobs/<job>/state?key=<key>`    | one committed state value             |
//! | `GET /metrics`                          | Prometheus metrics (`metrics_token`)  |
//! | `GET /healthz`                          | `ok`, no token needed                 |
//!
//! Another tenant's job answers 404, exactly like a job that does not exist.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use tiny_http::{Header, Method, Request, Response, Server};

use super::{ApiError, Host};

/// Threads answering requests; pushes compile on them, off the job threads.
const WORKERS: usize = 4;

/// Body of a deploy request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeployRequest {
    /// The job file (TOML).
    pub job: String,
    /// The plugin component, base64-encoded.
    pub plugin: String,
}

/// What a handler answers.
enum Reply {
    Json(u16, serde_json::Value),
    Text(String),
}

/// Serves the admin API on the configured address until `stop` is set,
/// then stops every job (each commits what it processed).
pub fn serve(host: Arc<Host>, stop: Arc<AtomicBool>) -> Result<(), String> {
    let listen = host.config().listen;
    let server = Arc::new(Server::http(listen).map_err(|err| format!("cannot listen on {listen}: {err}; set `listen` in the host file to a free address"))?);
    tracing::info!(%listen, "admin API listening");
    let workers: Vec<_> = (0..WORKERS)
        .map(|index| {
            let (server, host, stop) = (server.clone(), host.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("api-{index}"))
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match server.recv_timeout(Duration::from_millis(200)) {
                            Ok(Some(request)) => handle(&host, request),
                            Ok(None) => {}
                            Err(err) => tracing::warn!(error = %err, "admin API connection failed"),
                        }
                    }
                })
                .expect("spawning an API thread")
        })
        .collect();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::info!("shutting down: stopping every job");
    host.shutdown();
    server.unblock();
    for worker in workers {
        let _ = worker.join();
    }
    Ok(())
}

fn handle(host: &Host, mut request: Request) {
    let method = request.method().clone();
    let url = request.url().to_string();
    let reply = route(host, &mut request).unwrap_or_else(|err| Reply::Json(err.status, serde_json::json!({ "error": err.message })));
    let response = match reply {
        Reply::Json(status, body) => {
            if status >= 400 {
                tracing::info!(%method, %url, status, "request refused");
            }
            Response::from_string(body.to_string()).with_status_code(status).with_header(content_type("application/json"))
        }
        Reply::Text(text) => Response::from_string(text).with_header(content_type("text/plain; version=0.0.4")),
    };
    let unauthorized = response.status_code().0 == 401;
    let response = if unauthorized {
        response.with_header(Header::from_bytes(&b"WWW-Authenticate"[..], &b"Bearer"[..]).expect("a valid header"))
    } else {
        response
    };
    if let Err(err) = request.respond(response) {
        tracing::debug!(error = %err, "client went away before the answer");
    }
}

fn content_type(value: &str) -> Header {
    Header::from_bytes(&b"Content-Type"[..], value.as_bytes()).expect("a valid header")
}

fn route(host: &Host, request: &mut Request) -> Result<Reply, ApiError> {
    let url = request.url().to_string();
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = request.method().clone();
    match (&method, segments.as_slice()) {
        (Method::Get, ["healthz"]) => return Ok(Reply::Text("ok\n".into())),
        (Method::Get, ["metrics"]) => {
            let token = bearer(request)?;
            return match &host.config().metrics_token {
                Some(expected) if super::config::same_secret(expected, &token) => Ok(Reply::Text(host.render_metrics())),
                Some(_) => Err(ApiError::new(403, "this token may not read /metrics; use the host's metrics_token")),
                None => Err(ApiError::new(404, "/metrics is off: set metrics_token in the host file to serve it")),
            };
        }
        _ => {}
    }
    let tenant = tenant(host, request)?;
    let ok = |body: serde_json::Value| Ok(Reply::Json(200, body));
    match (method, segments.as_slice()) {
        (Method::Get, ["v1", "jobs"]) => ok(json(&host.list(&tenant))),
        (Method::Post, ["v1", "jobs"]) => {
            let body = read_body(host, request)?;
            let deploy: DeployRequest = serde_json::from_slice(&body).map_err(|err| {
                ApiError::bad_request(format!("the deploy request must be JSON {{\"job\": \"<TOML>\", \"plugin\": \"<base64 component>\"}}: {err}"))
            })?;
            let plugin = base64::engine::general_purpose::STANDARD
                .decode(deploy.plugin.trim())
                .map_err(|err| ApiError::bad_request(format!("`plugin` must be the component's bytes in base64: {err}")))?;
            let status = host.deploy(&tenant, &deploy.job, &plugin)?;
            Ok(Reply::Json(201, json(&status)))
        }
        (Method::Get, ["v1", "jobs", name]) => ok(json(&host.job(&tenant, name)?.status())),
        (Method::Delete, ["v1", "jobs", name]) => {
            host.delete(&tenant, name)?;
            ok(serde_json::json!({ "deleted": name }))
        }
        (Method::Post, ["v1", "jobs", name, "pause"]) => ok(json(&host.set_paused(&tenant, name, true)?)),
        (Method::Post, ["v1", "jobs", name, "resume"]) => ok(json(&host.set_paused(&tenant, name, false)?)),
        (Method::Post, ["v1", "jobs", name, "plugin"]) => {
            host.job(&tenant, name)?;
            let body = read_body(host, request)?;
            Ok(Reply::Json(202, json(&host.push(&tenant, name, &body)?)))
        }
        (Method::Get, ["v1", "jobs", name, "plugin", "history"]) => ok(json(&host.history(&tenant, name)?)),
        (Method::Post, ["v1", "jobs", name, "plugin", "rollback"]) => Ok(Reply::Json(202, json(&host.rollback(&tenant, name)?))),
        (Method::Get, ["v1", "jobs", name, "state"]) => {
            let key = query_param(query, "key").ok_or_else(|| ApiError::bad_request("give the key as ?key=<url-encoded key>"))?;
            ok(json(&host.state_get(&tenant, name, &key)?))
        }
        (_, ["v1", "jobs", ..]) => Err(ApiError::new(405, format!("{} {path} is not part of the admin API; see `tally --help`", request.method()))),
        _ => Err(ApiError::new(404, format!("{path} is not part of the admin API (it lives under /v1/jobs)"))),
    }
}

/// A reply body as JSON (the reply types have string keys and no maps
/// with other keys, so this cannot fail).
fn json<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_else(|err| serde_json::json!({ "error": format!("reply not serializable: {err}") }))
}

/// The bearer token of the request.
fn bearer(request: &Request) -> Result<String, ApiError> {
    let header = request.headers().iter().find(|header| header.field.equiv("Authorization"));
    let Some(header) = header else {
        return Err(ApiError::new(401, "missing `Authorization: Bearer <token>` header; pass --token or set TALLY_TOKEN"));
    };
    match header.value.as_str().strip_prefix("Bearer ") {
        Some(token) => Ok(token.trim().to_string()),
        None => Err(ApiError::new(401, "the Authorization header must be `Bearer <token>`")),
    }
}

/// The tenant whose token the request carries.
fn tenant(host: &Host, request: &Request) -> Result<String, ApiError> {
    let token = bearer(request)?;
    host.config()
        .tenant_of(&token)
        .map(str::to_string)
        .ok_or_else(|| ApiError::new(401, "the token is not recognised; check --token or TALLY_TOKEN"))
}

/// The request body, refused unread if it is larger than the host allows.
fn read_body(host: &Host, request: &mut Request) -> Result<Vec<u8>, ApiError> {
    let limit = host.config().max_upload_bytes;
    let too_large = || ApiError::new(413, format!("the request body is larger than the host's max_upload_bytes ({limit} bytes)"));
    if request.body_length().is_some_and(|length| length as u64 > limit) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    request
        .as_reader()
        .take(limit + 1)
        .read_to_end(&mut body)
        .map_err(|err| ApiError::bad_request(format!("cannot read the request body: {err}")))?;
    if body.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(body)
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key == name).then(|| percent_encoding::percent_decode_str(&value.replace('+', " ")).decode_utf8_lossy().into_owned())
    })
}
