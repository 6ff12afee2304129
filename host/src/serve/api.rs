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
//! | `POST /v1/jobs/<job>/shadow`            | run a candidate (or replay) beside the job `{"plugin": base64, "from": …}` |
//! | `DELETE /v1/jobs/<job>/shadow`          | discard the job's shadow              |
//! | `POST /v1/jobs/<job>/promote`           | make the job's shadow its live version |
//! | `GET /v1/jobs/<job>/state?key=<key>`    | one committed state value             |
//! | `GET /metrics`                          | Prometheus metrics (`metrics_token`)  |
//! | `GET /healthz`                          | `ok`, no token needed                 |
//!
//! Another tenant's job answers 404, exactly like a job that does not exist.
//!
//! Served by hyper on tokio, hardened against clients that lie or stall:
//! at most [`MAX_CONNECTIONS`] connections ([`MAX_CONNECTIONS_PER_PEER`]
//! from one address), request headers within [`HEADER_TIMEOUT`], the token
//! checked before any body byte is read, a body over `max_upload_bytes`
//! refused from its `Content-Length` or cut off while it is read (never a
//! buffer sized from what the client announces), a body within
//! [`BODY_TIMEOUT`], a whole request within [`REQUEST_TIMEOUT`] (or, when
//! the host's compile limits allow more, their longest), and a panic in one
//! request answered with a 500 instead of taking the API down. At most
//! [`MAX_UPLOADS_IN_FLIGHT`] bodies are read at once, and the work of a
//! request (decoding, compiles, disk, locks) runs on a bounded pool of
//! blocking threads, never on the threads that serve connections. One
//! tenant has at most half of each: [`MAX_WORKING_PER_TENANT`] requests
//! doing work, [`MAX_UPLOADS_PER_TENANT`] bodies being read.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use base64::Engine as _;
use http_body_util::BodyExt as _;
use tokio::sync::Semaphore;

use super::error::ServeError;
use super::wire::{Deleted, DeliveriesRequest, DeployRequest, ResolveRequest, ShadowRequest};
use super::{ApiError, Host};
use tally_core::sync::lock;

/// Most connections open at once; more are closed as they arrive.
pub const MAX_CONNECTIONS: usize = 512;
/// Most connections open at once from one address.
pub const MAX_CONNECTIONS_PER_PEER: usize = 128;
/// Longest a client may take to send a request's headers (each request of
/// a kept-alive connection, and the wait for it).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a client may take to send a request's body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest a request may take in all, its compile (and the wait for its
/// turn at the compiler) included, unless the host's compile limits make
/// that longer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(180);
/// Request bodies read at once; more wait their turn before any of their
/// bytes is read.
pub const MAX_UPLOADS_IN_FLIGHT: usize = 4;
/// Longest a connection stays open.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(600);
/// Largest request head (request line and headers), in bytes.
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// Requests doing work (compiles, disk, locks) at once; more wait.
pub const MAX_WORKING_REQUESTS: usize = 16;
/// One tenant's requests doing work at once: half of
/// [`MAX_WORKING_REQUESTS`], so that no tenant holds every turn; more wait.
pub const MAX_WORKING_PER_TENANT: usize = MAX_WORKING_REQUESTS / 2;
/// One tenant's request bodies read at once: half of
/// [`MAX_UPLOADS_IN_FLIGHT`]; more wait.
pub const MAX_UPLOADS_PER_TENANT: usize = MAX_UPLOADS_IN_FLIGHT / 2;

/// What every handler shares.
#[derive(Clone)]
struct Api {
    host: Arc<Host>,
    /// Turns at doing work on the blocking pool.
    working: Arc<Semaphore>,
    /// Turns at reading a request body.
    uploads: Arc<Semaphore>,
    /// Each tenant's own turns, within the host's.
    tenants: Arc<HashMap<String, Arc<TenantTurns>>>,
}

/// One tenant's share of the API's turns.
struct TenantTurns {
    /// Its requests doing work ([`MAX_WORKING_PER_TENANT`]).
    working: Arc<Semaphore>,
    /// Its bodies being read ([`MAX_UPLOADS_PER_TENANT`]).
    uploads: Semaphore,
}

impl Api {
    fn new(host: Arc<Host>) -> Api {
        Api {
            working: Arc::new(Semaphore::new(MAX_WORKING_REQUESTS)),
            uploads: Arc::new(Semaphore::new(MAX_UPLOADS_IN_FLIGHT)),
            tenants: Arc::new(
                host.config()
                    .tenants
                    .keys()
                    .map(|tenant| {
                        let turns = TenantTurns {
                            working: Arc::new(Semaphore::new(MAX_WORKING_PER_TENANT)),
                            uploads: Semaphore::new(MAX_UPLOADS_PER_TENANT),
                        };
                        (tenant.clone(), Arc::new(turns))
                    })
                    .collect(),
            ),
            host,
        }
    }

    /// Runs `work` on the blocking pool, within the bound on working
    /// requests (and on the tenant's, for a tenant's request); a panic in
    /// it is a 500, not a dead worker. The turns go with the work: a
    /// request the client or the time limit gave up on keeps them until its
    /// work ends.
    async fn run<T: Send + 'static>(
        &self,
        tenant: Option<&TenantTurns>,
        work: impl FnOnce(&Arc<Host>) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let tenant_permit = match tenant {
            Some(turns) => Some(
                turns
                    .working
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| ApiError::new(503, "the host is shutting down"))?,
            ),
            None => None,
        };
        let permit = self
            .working
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::new(503, "the host is shutting down"))?;
        let host = self.host.clone();
        let work = move || {
            let _turns = (tenant_permit, permit);
            work(&host)
        };
        match tokio::task::spawn_blocking(work).await {
            Ok(result) => result,
            Err(err) if err.is_panic() => {
                tracing::error!("an admin request panicked; the API goes on");
                Err(ApiError::internal(
                    "the host failed on this request (a bug: it was logged); nothing else is affected",
                ))
            }
            Err(_) => Err(ApiError::new(503, "the host is shutting down")),
        }
    }
}

/// Serves the admin API on the configured address until `stop` is set,
/// then stops every job (each commits what it processed).
pub fn serve(host: Arc<Host>, stop: Arc<AtomicBool>) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(MAX_WORKING_REQUESTS + 4)
        .thread_name("tally-api")
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    let listen = host.config().listen;
    let result = runtime.block_on(accept_until_stopped(host.clone(), listen, stop));
    tracing::info!("shutting down: stopping every job");
    host.shutdown();
    runtime.shutdown_timeout(Duration::from_secs(5));
    result
}

/// Open connections, in all and per address.
#[derive(Default)]
struct Connections {
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One open connection's place; freed when dropped.
struct ConnectionSlot {
    connections: Arc<Connections>,
    peer: IpAddr,
}

impl Connections {
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<ConnectionSlot> {
        let mut open = lock(&self.open);
        let total: usize = open.values().sum();
        let from_peer = open.get(&peer).copied().unwrap_or(0);
        if total >= MAX_CONNECTIONS || from_peer >= MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        *open.entry(peer).or_default() += 1;
        Some(ConnectionSlot { connections: self.clone(), peer })
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut open = lock(&self.connections.open);
        if let Some(count) = open.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

async fn accept_until_stopped(
    host: Arc<Host>,
    listen: SocketAddr,
    stop: Arc<AtomicBool>,
) -> Result<(), ServeError> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| ServeError::Listen { addr: listen, source })?;
    tracing::info!(%listen, "admin API listening");
    let app = router(Api::new(host));
    let connections = Arc::new(Connections::default());
    let mut check_stop = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors, say: wait a little, go on.
                        tracing::warn!(error = %err, "cannot accept an admin connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(slot) = connections.admit(peer.ip()) else {
                    tracing::warn!(%peer, "too many admin connections; closing a new one");
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let service = hyper_util::service::TowerToHyperService::new(app.clone());
                tokio::spawn(async move {
                    let _slot = slot;
                    let mut http = hyper::server::conn::http1::Builder::new();
                    http.timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .max_buf_size(MAX_HEAD_BYTES)
                        .keep_alive(true);
                    let connection = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                    match tokio::time::timeout(CONNECTION_LIFETIME, connection).await {
                        Ok(Err(err)) => tracing::debug!(%peer, error = %err, "admin connection ended"),
                        Ok(Ok(())) => {}
                        Err(_) => tracing::debug!(%peer, "admin connection open too long; closed"),
                    }
                });
            }
            _ = check_stop.tick() => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
        }
    }
}

fn router(api: Api) -> Router {
    let timeout = REQUEST_TIMEOUT.max(api.host.longest_request());
    Router::new()
        .route("/healthz", get(|| async { text("ok\n") }))
        .route("/metrics", get(metrics))
        .route("/v1/jobs", get(list).post(deploy))
        .route("/v1/jobs/{job}", get(status).delete(delete))
        .route("/v1/jobs/{job}/pause", post(pause))
        .route("/v1/jobs/{job}/resume", post(resume))
        .route("/v1/jobs/{job}/plugin", post(push))
        .route("/v1/jobs/{job}/plugin/history", get(history))
        .route("/v1/jobs/{job}/plugin/rollback", post(rollback))
        .route("/v1/jobs/{job}/shadow", post(start_shadow).delete(discard_shadow))
        .route("/v1/jobs/{job}/promote", post(promote_shadow))
        .route("/v1/jobs/{job}/state", get(state))
        .route("/v1/jobs/{job}/deliveries", put(set_deliveries))
        .route("/v1/jobs/{job}/deliveries/{output}/unknown", get(unknown))
        .route("/v1/jobs/{job}/deliveries/{output}/resolve", post(resolve))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(api)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn(move |request, next| within(timeout, request, next)))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_panic: Box<dyn std::any::Any + Send>| {
            tracing::error!("an admin request panicked; the API goes on");
            ApiError::internal("the host failed on this request (a bug: it was logged); nothing else is affected").into_response()
        }))
}

/// Runs `request` for at most `limit`; past it the client is answered 503
/// with the limit named (the work it started runs to its end, as a request
/// the client gave up on would).
async fn within(
    limit: Duration,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(
                limit_seconds = limit.as_secs(),
                "an admin request ran past its time limit"
            );
            ApiError::new(
                503,
                format!(
                    "the request took longer than the host's limit of {} s for one request; it may still finish on the host: check with `tally jobs status` before trying again",
                    limit.as_secs()
                ),
            )
            .into_response()
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_client_error() {
            tracing::info!(status = self.status, "admin request refused");
        }
        let mut response = (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::json!({ "error": self.message }).to_string(),
        )
            .into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    let body = serde_json::to_string(value).unwrap_or_else(|err| {
        serde_json::json!({ "error": format!("reply not serializable: {err}") }).to_string()
    });
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn text(body: impl Into<String>) -> Response {
    ([(header::CONTENT_TYPE, crate::metrics::PROMETHEUS_TEXT)], body.into()).into_response()
}

/// The tenant whose bearer token a request carries: checked from the
/// headers alone, before any of the body is read; with its share of the
/// API's turns.
struct Tenant(String, Arc<TenantTurns>);

impl FromRequestParts<Api> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Tenant, ApiError> {
        let token = bearer(&parts.headers)?;
        let tenant = api.host.config().tenant_of(&token).ok_or_else(|| {
            ApiError::new(401, "the token is not recognised; check --token or TALLY_TOKEN")
        })?;
        let turns = api.tenants.get(tenant).ok_or_else(|| ApiError::new(401, "unknown tenant"))?;
        Ok(Tenant(tenant.to_string(), turns.clone()))
    }
}

/// The bearer token of a request.
fn bearer(headers: &HeaderMap) -> Result<String, ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::new(
            401,
            "missing `Authorization: Bearer <token>` header; pass --token or set TALLY_TOKEN",
        ));
    };
    match value.to_str().ok().and_then(|value| value.strip_prefix("Bearer ")) {
        Some(token) => Ok(token.trim().to_string()),
        None => Err(ApiError::new(401, "the Authorization header must be `Bearer <token>`")),
    }
}

/// A request's `plugin` field: the component's bytes in base64.
fn decode_plugin(text: &str) -> Result<Vec<u8>, ApiError> {
    base64::engine::general_purpose::STANDARD.decode(text.trim()).map_err(|err| {
        ApiError::bad_request(format!("`plugin` must be the component's bytes in base64: {err}"))
    })
}

/// The body of a request to `tenant`'s job `job`: the job must be the
/// tenant's before any of its body is read.
async fn read_owned_body(
    api: &Api,
    (tenant, turns): (&str, &TenantTurns),
    job: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let (owner, job) = (tenant.to_string(), job.to_string());
    api.run(Some(turns), move |host| host.job(&owner, &job).map(drop)).await?;
    read_body(api, turns, headers, body).await
}

/// The request body, refused unread when its announced length is over
/// the host's `max_upload_bytes`, and cut off once it grows past it;
/// within [`BODY_TIMEOUT`], once it is the tenant's turn
/// ([`MAX_UPLOADS_PER_TENANT`]) and the host's ([`MAX_UPLOADS_IN_FLIGHT`]).
async fn read_body(
    api: &Api,
    turns: &TenantTurns,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let limit = api.host.config().max_upload_bytes;
    let too_large = || {
        ApiError::new(
            413,
            format!("the request body is larger than the host's max_upload_bytes ({limit} bytes)"),
        )
    };
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if announced.is_some_and(|length| length > limit) {
        return Err(too_large());
    }
    let shutting_down = |_| ApiError::new(503, "the host is shutting down");
    let _tenant_turn = turns.uploads.acquire().await.map_err(shutting_down)?;
    let _turn = api.uploads.acquire().await.map_err(shutting_down)?;
    let limited = http_body_util::Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX));
    match tokio::time::timeout(BODY_TIMEOUT, limited.collect()).await {
        Err(_) => Err(ApiError::new(
            408,
            format!("the request body did not arrive within {} s", BODY_TIMEOUT.as_secs()),
        )),
        Ok(Err(err)) if err.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(too_large())
        }
        Ok(Err(err)) => Err(ApiError::bad_request(format!("cannot read the request body: {err}"))),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

async fn metrics(State(api): State<Api>, headers: HeaderMap) -> Result<Response, ApiError> {
    let token = bearer(&headers)?;
    match &api.host.config().metrics_token {
        Some(expected) if super::config::same_secret(expected, &token) => {
            Ok(text(api.run(None, |host| Ok(host.render_metrics())).await?))
        }
        Some(_) => Err(ApiError::new(
            403,
            "this token may not read /metrics; use the host's metrics_token",
        )),
        None => Err(ApiError::new(
            404,
            "/metrics is off: set metrics_token in the host file to serve it",
        )),
    }
}

async fn list(State(api): State<Api>, Tenant(tenant, turns): Tenant) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &api.run(Some(&turns), move |host| Ok(host.list(&tenant))).await?))
}

async fn deploy(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(&api, &turns, &headers, body).await?;
    let status = api
        .run(Some(&turns), move |host| {
            let deploy: DeployRequest = serde_json::from_slice(&body).map_err(|err| {
                ApiError::bad_request(format!("the deploy request must be JSON {{\"job\": \"<TOML>\", \"plugin\": \"<base64 component>\"}}: {err}"))
            })?;
            drop(body);
            let plugin = decode_plugin(&deploy.plugin)?;
            host.deploy(&tenant, &deploy.job, &plugin)
        })
        .await?;
    Ok(json(StatusCode::CREATED, &status))
}

/// `PUT /v1/jobs/{job}/deliveries`: `{"deliver": "<TOML [[deliver]] sections>"}`.
async fn set_deliveries(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path(job): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(&api, &turns, &headers, body).await?;
    let status = api
        .run(Some(&turns), move |host| {
            let request: DeliveriesRequest = serde_json::from_slice(&body).map_err(|err| {
                ApiError::bad_request(format!(
                    "the request must be JSON {{\"deliver\": \"<TOML [[deliver]] sections>\"}}: {err}"
                ))
            })?;
            host.set_deliveries(&tenant, &job, &request.deliver)
        })
        .await?;
    Ok(json(StatusCode::OK, &status))
}

async fn status(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path(job): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(
        StatusCode::OK,
        &api.run(Some(&turns), move |host| Ok(host.job(&tenant, &job)?.status())).await?,
    ))
}

async fn delete(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path(job): Path<String>,
) -> Result<Response, ApiError> {
    let deleted = job.clone();
    api.run(Some(&turns), move |host| host.delete(&tenant, &job)).await?;
    Ok(json(StatusCode::OK, &Deleted { deleted }))
}

async fn pause(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path(job): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(
        StatusCode::OK,
        &api.run(Some(&turns), move |host| host.set_paused(&tenant, &job, true)).await?,
    ))
}

async fn resume(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path(job): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(
        StatusCode::OK,
        &api.run(Some(&turns), move |host| host.set_paused(&tenant, &job, false)).await?,
    ))
}

async fn push(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path(job): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_owned_body(&api, (&tenant, &turns), &job, &headers, body).await?;
    let pushed = api.run(Some(&turns), move |host| host.push(&tenant, &job, &body)).await?;
    Ok(json(if pushed.accepted { StatusCode::ACCEPTED } else { StatusCode::OK }, &pushed.version))
}

/// `POST /v1/jobs/{job}/shadow`: `{"plugin": "<base64>", "plugin_config": "<TOML>"}`.
async fn start_shadow(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path(job): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_owned_body(&api, (&tenant, &turns), &job, &headers, body).await?;
    let status = api
        .run(Some(&turns), move |host| {
            let request: ShadowRequest = serde_json::from_slice(&body).map_err(|err| {
                ApiError::bad_request(format!("the shadow request must be JSON {{\"plugin\": \"<base64 component, optional>\", \"plugin_config\": \"<TOML table, optional>\", \"from\": \"<earliest, a time or offsets, optional>\"}}: {err}"))
            })?;
            drop(body);
            let plugin = request.plugin.as_deref().map(decode_plugin).transpose()?;
            host.start_shadow(
                &tenant,
                &job,
                plugin.as_deref(),
                request.plugin_config.as_deref(),
                request.from.as_deref(),
            )
        })
        .await?;
    Ok(json(StatusCode::ACCEPTED, &status))
}

async fn discard_shadow(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path(job): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(
        StatusCode::OK,
        &api.run(Some(&turns), move |host| host.discard_shadow(&tenant, &job)).await?,
    ))
}

async fn promote_shadow(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path(job): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(
        StatusCode::OK,
        &api.run(Some(&turns), move |host| host.promote_shadow(&tenant, &job)).await?,
    ))
}

async fn history(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path(job): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &api.run(Some(&turns), move |host| host.history(&tenant, &job)).await?))
}

async fn rollback(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path(job): Path<String>,
) -> Result<Response, ApiError> {
    let pushed = api.run(Some(&turns), move |host| host.rollback(&tenant, &job)).await?;
    Ok(json(if pushed.accepted { StatusCode::ACCEPTED } else { StatusCode::OK }, &pushed.version))
}

async fn state(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path(job): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let key = query
        .as_deref()
        .and_then(|query| query_param(query, "key"))
        .ok_or_else(|| ApiError::bad_request("give the key as ?key=<url-encoded key>"))?;
    Ok(json(
        StatusCode::OK,
        &api.run(Some(&turns), move |host| host.state_get(&tenant, &job, &key)).await?,
    ))
}

async fn unknown(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path((job, output)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let records =
        api.run(Some(&turns), move |host| host.delivery_unknown(&tenant, &job, &output)).await?;
    Ok(json(StatusCode::OK, &records))
}

async fn resolve(
    State(api): State<Api>,
    Tenant(tenant, turns): Tenant,
    Path((job, output)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(&api, &turns, &headers, body).await?;
    // A key and a flag: decoded here, so kept small.
    const MAX_RESOLVE_BYTES: usize = 16 << 10;
    if body.len() > MAX_RESOLVE_BYTES {
        return Err(ApiError::new(
            413,
            format!(
                "the request has {} bytes; a resolve request (a key and a flag) may have at most {MAX_RESOLVE_BYTES}",
                body.len()
            ),
        ));
    }
    let request: ResolveRequest = serde_json::from_slice(&body).map_err(|err| {
        ApiError::bad_request(format!(
            "the request must be JSON {{\"key\": \"<idempotency key>\", \"applied\": true|false}} (applied: the receiver applied it; false: send it again): {err}"
        ))
    })?;
    let resolved = api
        .run(Some(&turns), move |host| {
            host.delivery_resolve(&tenant, &job, &output, request.key, request.applied)
        })
        .await?;
    Ok(json(StatusCode::ACCEPTED, &resolved))
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::new(
        404,
        format!("{} is not part of the admin API (it lives under /v1/jobs)", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        405,
        format!("{method} {} is not part of the admin API; see `tally --help`", uri.path()),
    )
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key == name).then(|| {
            percent_encoding::percent_decode_str(&value.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_decoded() {
        assert_eq!(query_param("key=%7B%22a%22%3A1%7D&x=2", "key").as_deref(), Some("{\"a\":1}"));
        assert_eq!(query_param("x=2", "key"), None);
    }

    /// A request past its time limit is answered 503 with the limit named;
    /// one within it, as its handler answers.
    #[test]
    fn a_request_past_its_time_limit_is_told_the_limit() {
        use tower::ServiceExt as _;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let app = Router::new()
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "late"
                }),
            )
            .route("/quick", get(|| async { "done" }))
            .layer(axum::middleware::from_fn(|request, next| {
                within(Duration::from_secs(1), request, next)
            }));
        let answer = |path: &str| {
            let request = axum::http::Request::get(path).body(Body::empty()).unwrap();
            runtime.block_on(async {
                let response = app.clone().oneshot(request).await.unwrap();
                let status = response.status();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (status, String::from_utf8(body.to_vec()).unwrap())
            })
        };
        let (status, body) = answer("/slow");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("the host's limit of 1 s for one request"), "{body}");
        assert_eq!(answer("/quick"), (StatusCode::OK, "done".to_string()));
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;
        use tower::ServiceExt as _;

        const TOKEN: &str = "acme-token-0123456789";

        fn api(dir: &std::path::Path) -> Router {
            let text = format!(
                "data_dir = {:?}\nmetrics_token = \"metrics-token-0123456789\"\nmax_upload_bytes = 4096\n[tenants.acme]\ntoken = {TOKEN:?}\n",
                dir.display()
            );
            let config: crate::serve::config::HostConfig = toml::from_str(&text).unwrap();
            let host = Host::open(config, "/nonexistent/tally".into()).unwrap();
            router(Api::new(host))
        }

        fn request() -> impl Strategy<Value = (String, String, Vec<(String, String)>, Vec<u8>)> {
            let segment = prop::sample::select(vec![
                "v1",
                "jobs",
                "billing",
                "plugin",
                "history",
                "rollback",
                "state",
                "pause",
                "resume",
                "metrics",
                "healthz",
                "..",
                "%2e%2e",
                "%00",
                "a%2Fb",
                "x".repeat(300).leak(),
                "\u{1F600}",
                "",
            ]);
            let path = prop::collection::vec(segment, 0..6).prop_flat_map(|segments| {
                let path = format!("/{}", segments.join("/"));
                prop_oneof![
                    Just(path.clone()),
                    "[a-z=&%0-9]{0,20}".prop_map(move |query| format!("{path}?{query}"))
                ]
            });
            let method = prop::sample::select(vec![
                "GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS",
            ])
            .prop_map(str::to_string);
            let header = prop_oneof![
                Just(("authorization".to_string(), format!("Bearer {TOKEN}"))),
                Just(("authorization".to_string(), "Bearer metrics-token-0123456789".to_string())),
                "[ -~]{0,40}".prop_map(|value| ("authorization".to_string(), value)),
                "[0-9]{0,25}".prop_map(|value| ("content-length".to_string(), value)),
                Just(("content-type".to_string(), "application/json".to_string())),
                Just(("expect".to_string(), "100-continue".to_string())),
            ];
            let body = prop_oneof![
                prop::collection::vec(any::<u8>(), 0..64),
                Just(br#"{"job": "name = \"x\"\noutputs = [\"t\"]\n[local]\ninputs = [\"a\"]", "plugin": "AGFzbQ0AAQA="}"#.to_vec()),
                Just(br#"{"job": 1, "plugin": []}"#.to_vec()),
                Just(vec![b'{'; 8000]),
            ];
            (method, path, prop::collection::vec(header, 0..4), body)
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

            /// No request, however malformed, is a server error or a panic:
            /// each gets a refusal or an answer.
            #[test]
            fn any_request_gets_an_answer_and_never_a_server_error((method, path, headers, body) in request()) {
                let dir = tempfile::tempdir().unwrap();
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                let app = api(dir.path());
                let mut builder = axum::http::Request::builder().method(method.as_str()).uri(path.as_str());
                for (name, value) in &headers {
                    builder = builder.header(name.as_str(), value.as_str());
                }
                // A request the HTTP layer itself would refuse never reaches the router.
                let Ok(request) = builder.body(Body::from(body)) else { return Ok(()) };
                let response = runtime.block_on(app.oneshot(request)).unwrap();
                prop_assert!(!response.status().is_server_error() || response.status() == StatusCode::SERVICE_UNAVAILABLE,
                    "{method} {path} {headers:?}: {}", response.status());
            }
        }
    }
}
