//! A `tally serve` host for tests: a real child process with a host file,
//! two tenants, and an admin client per tenant.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tally_host::client::{AdminClient, ClientError};

use crate::tally_binary;

/// Tenant `acme`'s token.
pub const ACME: &str = "acme-token-0123456789";
/// Tenant `globex`'s token (globex may have at most 3 jobs).
pub const GLOBEX: &str = "globex-token-9876543210";
/// The token that may read `/metrics`.
pub const METRICS: &str = "metrics-token-5555555555";

/// A running `tally serve`, killed when dropped.
pub struct ServeHost {
    /// Where the host file, data directory and tenants' inputs are.
    pub dir: PathBuf,
    /// `http://127.0.0.1:<port>`.
    pub server: String,
    child: Option<Child>,
}

impl ServeHost {
    /// Writes a host file in `dir` (uploads up to `max_upload_bytes`) and starts the host.
    pub fn start(dir: &Path, max_upload_bytes: u64) -> ServeHost {
        ServeHost::start_with(dir, &format!("max_upload_bytes = {max_upload_bytes}"), "", "")
    }

    /// Like [`ServeHost::start`], with `host` lines added to the host file's
    /// top level (the test broker unless they set `kafka_brokers`) and
    /// `acme`, `globex` lines to those tenants' sections (globex may have 3
    /// jobs unless its lines set `max_jobs`).
    pub fn start_with(dir: &Path, host: &str, acme: &str, globex: &str) -> ServeHost {
        let port = free_port();
        for tenant in ["acme", "globex"] {
            std::fs::create_dir_all(dir.join("inputs").join(tenant)).unwrap();
        }
        // The host's lines may name other brokers.
        let brokers = if host.contains("kafka_brokers") {
            String::new()
        } else {
            format!("kafka_brokers = {:?}\n", crate::kafka::bootstrap())
        };
        let config = format!(
            "listen = \"127.0.0.1:{port}\"\ndata_dir = \"data\"\nmetrics_token = {METRICS:?}\n\
             {brokers}{host}\n\
             [tenants.acme]\ntoken = {ACME:?}\ninput_dir = \"inputs/acme\"\n{acme}\n\
             [tenants.globex]\ntoken = {GLOBEX:?}\ninput_dir = \"inputs/globex\"\n{globex_jobs}{globex}\n",
            globex_jobs = if globex.contains("max_jobs") { "" } else { "max_jobs = 3\n" },
        );
        std::fs::write(dir.join("host.toml"), config).unwrap();
        let mut host = ServeHost {
            dir: dir.to_path_buf(),
            server: format!("http://127.0.0.1:{port}"),
            child: None,
        };
        host.launch();
        host
    }

    /// The host process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the host process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| child.try_wait().unwrap().is_none())
    }

    /// `host:port` of the admin API.
    pub fn address(&self) -> &str {
        self.server.trim_start_matches("http://")
    }

    /// Starts the host process (again) and waits until it answers.
    pub fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("serve.log"))
            .unwrap();
        let child = Command::new(tally_binary())
            .arg("serve")
            .arg(self.dir.join("host.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting tally serve");
        self.child = Some(child);
        let anonymous = JsonApi::new(&self.server, None);
        wait_for("the host to answer", Duration::from_secs(60), || {
            anonymous.request("GET", "/healthz", None).is_ok()
        });
    }

    /// A client with `token`.
    pub fn client(&self, token: &str) -> JsonApi {
        JsonApi::new(&self.server, Some(token))
    }

    /// The directory of a tenant's local inputs.
    pub fn inputs(&self, tenant: &str) -> PathBuf {
        self.dir.join("inputs").join(tenant)
    }

    /// The output file `name` of `tenant`'s local job `job`.
    pub fn output(&self, tenant: &str, job: &str, name: &str) -> PathBuf {
        self.dir.join("data/jobs").join(tenant).join(job).join("out").join(format!("{name}.ndjson"))
    }

    /// The host's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// Kills the host with SIGKILL: no chance to commit or clean up.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Sends SIGTERM and waits for a clean exit; returns whether it exited 0.
    pub fn terminate(&mut self) -> bool {
        self.terminate_within(Duration::from_secs(60))
    }

    /// Sends SIGTERM and waits up to `limit` for a clean exit (then kills
    /// it); returns whether it exited 0 in time.
    pub fn terminate_within(&mut self, limit: Duration) -> bool {
        let Some(mut child) = self.child.take() else { return false };
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.success();
            }
            if Instant::now() > deadline {
                child.kill().unwrap();
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ServeHost {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port nobody listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Polls `done` every 50 ms until it holds; panics naming `what` after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A local billing job file for `tally serve` over `inputs` (names inside
/// the tenant's input directory).
pub fn local_job(name: &str, inputs: &[&str], extra: &str) -> String {
    let inputs: Vec<String> = inputs.iter().map(|input| format!("{input:?}")).collect();
    format!(
        "name = {name:?}\noutputs = [\"totals\"]\n{extra}\n[local]\ninputs = [{}]\n",
        inputs.join(", ")
    )
}

/// A field of a status as a number (0 when absent).
pub fn number(status: &Value, field: &str) -> u64 {
    status[field].as_u64().unwrap_or(0)
}

/// Appends `lines` to the file at `path`.
pub fn append_lines(path: &Path, lines: &[crate::UsageLine]) {
    use std::io::Write;
    let mut text = String::new();
    for line in lines {
        text.push_str(&line.line);
        text.push('\n');
    }
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

/// The admin API as any HTTP client sees it: JSON. The end-to-end tests
/// check the wire format with it (the client's answers as they came, as
/// `serde_json::Value`), not the Rust types the CLI reads them into.
pub struct JsonApi {
    client: AdminClient,
}

impl JsonApi {
    /// A client of the host at `server` using `token`.
    pub fn new(server: &str, token: Option<&str>) -> JsonApi {
        JsonApi { client: AdminClient::new(server, token) }
    }

    /// Sends a request; the JSON (or text, as a JSON string) answer.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Value, ClientError> {
        self.client.request(method, path, body)
    }

    /// `GET /v1/jobs`
    pub fn list(&self) -> Result<Value, ClientError> {
        self.client.list()
    }

    /// `GET /v1/jobs/<job>`
    pub fn status(&self, job: &str) -> Result<Value, ClientError> {
        self.client.status(job)
    }

    /// `POST /v1/jobs`
    pub fn deploy(&self, job_toml: &str, plugin: &[u8]) -> Result<Value, ClientError> {
        self.client.deploy(job_toml, plugin)
    }

    /// `POST /v1/jobs/<job>/pause`
    pub fn pause(&self, job: &str) -> Result<Value, ClientError> {
        self.client.pause(job)
    }

    /// `POST /v1/jobs/<job>/resume`
    pub fn resume(&self, job: &str) -> Result<Value, ClientError> {
        self.client.resume(job)
    }

    /// `DELETE /v1/jobs/<job>`
    pub fn delete(&self, job: &str) -> Result<Value, ClientError> {
        self.client.delete(job)
    }

    /// `POST /v1/jobs/<job>/plugin`
    pub fn push(&self, job: &str, plugin: &[u8]) -> Result<Value, ClientError> {
        self.client.push(job, plugin)
    }

    /// `GET /v1/jobs/<job>/plugin/history`
    pub fn history(&self, job: &str) -> Result<Value, ClientError> {
        self.client.history(job)
    }

    /// `POST /v1/jobs/<job>/plugin/rollback`
    pub fn rollback(&self, job: &str) -> Result<Value, ClientError> {
        self.client.rollback(job)
    }

    /// `PUT /v1/jobs/<job>/deliveries`
    pub fn set_deliveries(&self, job: &str, deliver: &str) -> Result<Value, ClientError> {
        self.client.set_deliveries(job, deliver)
    }

    /// `GET /v1/jobs/<job>/state?key=<key>`
    pub fn state_get(&self, job: &str, key: &str) -> Result<Value, ClientError> {
        self.client.state_get(job, key)
    }

    /// `GET /metrics`
    pub fn metrics(&self) -> Result<String, ClientError> {
        self.client.metrics()
    }
}
