//! Compiling what tenants upload, so that no upload can take the host's
//! CPU, memory or admin API with it (`tally serve`).
//!
//! 1. The bytes are checked before anything is compiled: a component,
//!    importing only interfaces this host links ([`check::check_names`]);
//!    the worker checks every imported function's type before it compiles
//!    ([`check::check_component`]).
//! 2. Compiling runs in a child process (`tally compile-worker`, the host's
//!    own binary) under resource limits: its address space is capped at
//!    `max_compile_memory_bytes`, its CPU at `max_compile_seconds` (and its
//!    wall clock at twice that), at a lower priority than the jobs. Over a
//!    bound, the child dies and the upload is refused, naming the bound.
//! 3. Compiles take turns: one at a time, the tenants with uploads waiting
//!    served round robin, so one tenant's uploads cannot hold another's.
//! 4. What the child writes is cached on disk by digest and engine
//!    configuration ([`PluginRuntime::compatibility_key`]): a restart, a
//!    rollback or a second job with the same plugin loads it without
//!    compiling again.

use std::collections::{HashMap, VecDeque};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{LoadedPlugin, PluginError, PluginRuntime, check, digest};
use crate::sync::lock;

/// The CLI subcommand that runs [`worker_main`].
pub const WORKER_COMMAND: &str = "compile-worker";

/// Exit status of a worker that refused the upload (its reason on stderr).
const REFUSED: i32 = 2;

/// Longest an upload waits for its turn to be compiled, at least.
const MIN_QUEUE_WAIT: Duration = Duration::from_secs(60);
/// Most uploads of one tenant waiting to be compiled at once.
const MAX_WAITING_PER_TENANT: usize = 2;
/// Most bytes of a worker's stderr kept for a message.
const MAX_WORKER_MESSAGE_BYTES: u64 = 16 << 10;

/// Bounds on compiling one upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileLimits {
    /// CPU seconds (all the worker's threads together); the wall clock may
    /// run to twice this.
    pub seconds: u64,
    /// Address space of the worker, in bytes.
    pub memory_bytes: u64,
}

impl CompileLimits {
    /// The longest one compile may take by the wall clock.
    pub fn wall(&self) -> Duration {
        Duration::from_secs(self.seconds.saturating_mul(2).saturating_add(1))
    }

    /// The longest an upload waits for its turn: long enough for the
    /// compiles of the two tenants' uploads ahead of it, at their longest.
    pub fn queue_wait(&self) -> Duration {
        MIN_QUEUE_WAIT.max(self.wall() * 2)
    }

    /// The longest a request that compiles may take: its wait and its compile.
    pub fn longest_request(&self) -> Duration {
        self.queue_wait() + self.wall() + Duration::from_secs(30)
    }
}

/// Why an upload was not compiled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    /// The upload is not a plugin this host runs.
    #[error(transparent)]
    Refused(#[from] PluginError),
    /// The compile worker refused the upload: its reason, as it said it
    /// (a [`PluginError`]'s text, at most `MAX_WORKER_MESSAGE_BYTES`).
    #[error("{0}")]
    RefusedByWorker(String),
    /// Compiling it took longer than the host allows.
    #[error(
        "compiling plugin `{name}` took more than the host's limit of {seconds} s (max_compile_seconds); make the component smaller or simpler"
    )]
    TooSlow {
        /// The plugin (its file or upload name).
        name: String,
        /// The limit, in seconds.
        seconds: u64,
    },
    /// Compiling it needed more memory than the host allows.
    #[error(
        "compiling plugin `{name}` needed more than the host's limit of {bytes} bytes of memory (max_compile_memory_bytes); make the component smaller or simpler"
    )]
    TooLarge {
        /// The plugin (its file or upload name).
        name: String,
        /// The limit, in bytes.
        bytes: u64,
    },
    /// Too many uploads wait to be compiled.
    #[error("{0}")]
    Busy(String),
    /// The host could not run the compiler.
    #[error("the host could not compile plugin `{name}`: {reason}")]
    Host {
        /// The plugin (its file or upload name).
        name: String,
        /// Why.
        reason: String,
    },
}

impl CompileError {
    /// Whether the upload itself is at fault (a 4xx), rather than the host.
    pub fn is_the_uploads_fault(&self) -> bool {
        matches!(
            self,
            CompileError::Refused(_)
                | CompileError::RefusedByWorker(_)
                | CompileError::TooSlow { .. }
                | CompileError::TooLarge { .. }
        )
    }
}

/// Compiles uploads in bounded child processes, in turn, into a cache.
pub struct Compiler {
    worker: PathBuf,
    cache_dir: PathBuf,
    limits: CompileLimits,
    queue: CompileQueue,
}

impl Compiler {
    /// A compiler running `worker` (the `tally` binary) within `limits`,
    /// caching into `cache_dir`.
    pub fn new(worker: PathBuf, cache_dir: PathBuf, limits: CompileLimits) -> Compiler {
        Compiler { worker, cache_dir, limits, queue: CompileQueue::default() }
    }

    /// Where the compiled form of `digest` is kept for `runtime`'s engine.
    pub fn cached_path(&self, runtime: &PluginRuntime, digest: &str) -> PathBuf {
        runtime.cache_entry(&self.cache_dir, digest)
    }

    /// `bytes` as a loaded plugin: from the cache when it holds them,
    /// else checked, compiled in a worker (after `tenant`'s turn comes)
    /// and cached.
    pub fn load(
        &self,
        runtime: &PluginRuntime,
        tenant: &str,
        name: &str,
        bytes: &[u8],
    ) -> Result<LoadedPlugin, CompileError> {
        let digest = digest(bytes);
        let cached = self.cached_path(runtime, &digest);
        if let Some(plugin) = runtime.load_cache_entry(name, &digest, bytes.len(), &cached) {
            return Ok(plugin);
        }
        // Names only here, for the cost of reading two sections: the
        // types are checked by the worker, within its memory and CPU bounds.
        check::check_names(name, bytes)?;
        let _turn = self.queue.wait_turn(tenant, self.limits.queue_wait())?;
        if !cached.exists() {
            self.compile_in_worker(name, bytes, &cached)?;
        }
        runtime.load_compiled(name, &digest, bytes.len(), &cached).map_err(|err| {
            tracing::error!(path = %cached.display(), error = %err, "a plugin just compiled cannot be loaded");
            CompileError::Host { name: name.to_string(), reason: "its compiled form cannot be loaded (the host's log says why)".into() }
        })
    }

    /// Forgets the compiled form of `digest` (its version was removed).
    pub fn remove(&self, runtime: &PluginRuntime, digest: &str) {
        let _ = std::fs::remove_file(self.cached_path(runtime, digest));
    }

    fn compile_in_worker(
        &self,
        name: &str,
        bytes: &[u8],
        output: &Path,
    ) -> Result<(), CompileError> {
        let host_error = |reason: String| CompileError::Host { name: name.to_string(), reason };
        std::fs::create_dir_all(&self.cache_dir).map_err(|err| {
            host_error(format!("cannot create `{}`: {err}", self.cache_dir.display()))
        })?;
        let input = tempfile::Builder::new()
            .prefix("upload-")
            .suffix(".wasm")
            .tempfile_in(&self.cache_dir)
            .map_err(|err| host_error(format!("cannot write the upload for its compile: {err}")))?;
        std::fs::write(input.path(), bytes)
            .map_err(|err| host_error(format!("cannot write the upload for its compile: {err}")))?;
        let started = Instant::now();
        let limits = self.limits;
        let mut command = Command::new(&self.worker);
        command.arg(WORKER_COMMAND).arg(name).arg(input.path()).arg(output);
        command.env_clear().stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        if let Some(perfmap) = std::env::var_os("TALLY_PLUGIN_PERFMAP") {
            // Part of the engine's configuration: the compiled form must match.
            command.env("TALLY_PLUGIN_PERFMAP", perfmap);
        }
        restrict(&mut command, limits);
        let mut child = command.spawn().map_err(|err| {
            host_error(format!("cannot start `{}`: {err}", self.worker.display()))
        })?;
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let reader = std::thread::spawn(move || {
            let mut message = String::new();
            let _ = (&mut stderr).take(MAX_WORKER_MESSAGE_BYTES).read_to_string(&mut message);
            let _ = std::io::copy(&mut stderr, &mut std::io::sink());
            message
        });
        let wall = limits.wall();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if started.elapsed() > wall => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(err) => return Err(host_error(format!("cannot wait for the compiler: {err}"))),
            }
        };
        let message = reader.join().unwrap_or_default();
        let message = message.trim();
        tracing::info!(plugin = %name, took_ms = started.elapsed().as_millis() as u64, status = ?status, "compiled an upload in a worker");
        match status {
            Some(status) if status.success() && output.exists() => Ok(()),
            Some(status) if status.code() == Some(REFUSED) => Err(CompileError::RefusedByWorker(
                message.strip_prefix("error: ").unwrap_or(message).to_string(),
            )),
            None => Err(CompileError::TooSlow { name: name.to_string(), seconds: limits.seconds }),
            Some(status)
                if killed_by(&status, libc::SIGXCPU) || killed_by(&status, libc::SIGKILL) =>
            {
                Err(CompileError::TooSlow { name: name.to_string(), seconds: limits.seconds })
            }
            Some(status)
                if message.contains("memory allocation")
                    || message.contains("out of memory")
                    || killed_by(&status, libc::SIGABRT)
                    || killed_by(&status, libc::SIGSEGV) =>
            {
                Err(CompileError::TooLarge { name: name.to_string(), bytes: limits.memory_bytes })
            }
            Some(status) => {
                Err(host_error(format!("the compiler exited with {status}: {message}")))
            }
        }
    }
}

fn killed_by(status: &ExitStatus, signal: i32) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(signal)
}

/// Puts the worker under `limits`: its own process group, a capped
/// address space and CPU time, no core dumps, few files, a low priority.
fn restrict(command: &mut Command, limits: CompileLimits) {
    use std::os::unix::process::CommandExt;
    let cpu = limits.seconds;
    let memory = limits.memory_bytes;
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (setrlimit, setpriority), touching
    // no memory of the parent's but its own copied stack.
    unsafe {
        command.pre_exec(move || {
            let set = |resource, soft: u64, hard: u64| {
                let limit =
                    libc::rlimit { rlim_cur: soft as libc::rlim_t, rlim_max: hard as libc::rlim_t };
                if libc::setrlimit(resource, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            };
            set(libc::RLIMIT_AS, memory, memory)?;
            set(libc::RLIMIT_CPU, cpu, cpu + 1)?;
            set(libc::RLIMIT_CORE, 0, 0)?;
            set(libc::RLIMIT_NOFILE, 64, 64)?;
            // Below the jobs: a compile takes what they leave.
            libc::setpriority(libc::PRIO_PROCESS, 0, 10);
            Ok(())
        });
    }
    command.process_group(0);
}

/// The compile worker: compiles the component at `input` (named `name` in
/// messages) and writes its compiled form to `output`. Exits 0 when it did,
/// [`REFUSED`] with the reason on stderr when the upload is not a plugin
/// this host runs.
pub fn worker_main(name: &str, input: &Path, output: &Path) -> std::process::ExitCode {
    let refuse = |message: String| {
        eprintln!("error: {message}");
        std::process::ExitCode::from(REFUSED as u8)
    };
    let bytes = match std::fs::read(input) {
        Ok(bytes) => bytes,
        Err(err) => return refuse(format!("cannot read `{}`: {err}", input.display())),
    };
    let runtime = match PluginRuntime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("{err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let compiled = match runtime.precompile(name, &bytes) {
        Ok(compiled) => compiled,
        Err(err) => return refuse(err.to_string()),
    };
    match crate::files::write_atomically(output, &compiled) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("cannot write `{}`: {err}", output.display());
            std::process::ExitCode::FAILURE
        }
    }
}

/// Turns at compiling: one compile at a time, the tenants with uploads
/// waiting served round robin.
#[derive(Default)]
struct CompileQueue {
    state: Mutex<QueueState>,
    changed: Condvar,
}

#[derive(Default)]
struct QueueState {
    busy: bool,
    next_ticket: u64,
    /// Tickets waiting, per tenant, oldest first.
    waiting: HashMap<String, VecDeque<u64>>,
    /// Tenants with tickets waiting, in the order they are served.
    order: VecDeque<String>,
    /// The ticket whose turn it is, handed over by the one that finished.
    granted: Option<u64>,
}

/// A turn at compiling; the next one starts when it is dropped.
struct Turn<'a> {
    queue: &'a CompileQueue,
}

impl CompileQueue {
    fn wait_turn(&self, tenant: &str, longest: Duration) -> Result<Turn<'_>, CompileError> {
        let mut state = lock(&self.state);
        let waiting = state.waiting.get(tenant).map_or(0, VecDeque::len);
        if waiting >= MAX_WAITING_PER_TENANT {
            return Err(CompileError::Busy(format!(
                "tenant `{tenant}` already has {waiting} uploads waiting to be compiled (at most {MAX_WAITING_PER_TENANT}); try again once they are done"
            )));
        }
        if !state.busy && state.order.is_empty() {
            state.busy = true;
            return Ok(Turn { queue: self });
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        let queue = state.waiting.entry(tenant.to_string()).or_default();
        queue.push_back(ticket);
        if queue.len() == 1 {
            state.order.push_back(tenant.to_string());
        }
        let deadline = Instant::now() + longest;
        loop {
            if state.granted == Some(ticket) {
                state.granted = None;
                return Ok(Turn { queue: self });
            }
            let now = Instant::now();
            if now >= deadline {
                // Leave the line, so that nothing waits for this ticket.
                if let Some(queue) = state.waiting.get_mut(tenant) {
                    queue.retain(|waiting| *waiting != ticket);
                    if queue.is_empty() {
                        state.waiting.remove(tenant);
                        state.order.retain(|name| name != tenant);
                    }
                }
                return Err(CompileError::Busy(format!(
                    "the host's compiler stayed busy with other uploads for {} s; try again",
                    longest.as_secs()
                )));
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .map_or_else(|poisoned| poisoned.into_inner().0, |(state, _)| state);
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.queue.state);
        // The next tenant in line gets the turn with its oldest upload.
        let next = state.order.pop_front().and_then(|tenant| {
            let queue = state.waiting.get_mut(&tenant)?;
            let ticket = queue.pop_front()?;
            if queue.is_empty() {
                state.waiting.remove(&tenant);
            } else {
                state.order.push_back(tenant);
            }
            Some(ticket)
        });
        match next {
            Some(ticket) => state.granted = Some(ticket),
            None => state.busy = false,
        }
        self.queue.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_take_turns_at_compiling() {
        let queue = std::sync::Arc::new(CompileQueue::default());
        let first = queue.wait_turn("a", Duration::from_secs(60)).unwrap();
        let served = std::sync::Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for tenant in ["a", "a", "b"] {
            let (queue, served) = (queue.clone(), served.clone());
            waiters.push(std::thread::spawn(move || {
                let _turn = queue.wait_turn(tenant, Duration::from_secs(60)).unwrap();
                lock(&served).push(tenant);
                std::thread::sleep(Duration::from_millis(20));
            }));
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            matches!(queue.wait_turn("a", Duration::from_secs(60)), Err(CompileError::Busy(message)) if message.contains("2 uploads waiting"))
        );
        drop(first);
        for waiter in waiters {
            waiter.join().unwrap();
        }
        assert_eq!(*lock(&served), ["a", "b", "a"], "b's upload does not wait behind all of a's");
    }
}
