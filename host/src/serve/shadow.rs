//! A served job's shadow: a candidate plugin run on the job's input beside
//! the live version, into a version of its own ([`Version`]: its state,
//! outputs, consumer group and topics) that is never delivered, with a
//! running diff of its outputs against the live ones. It stops when it is
//! discarded, or by its own failures, and never touches the live version
//! (see `docs/versions.md`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tally_core::sync::lock;

use super::runner::JobRuntime;
use super::wire::{ChangedKey, RunningDiff, ShadowStatus};
use crate::config::JobConfig;
use crate::delivery::output_source;
use crate::diff::{GrowingOutput, delta, value_size};
use crate::versions::Version;

/// How often the running diff reads what both versions committed since.
pub const DIFF_EVERY: Duration = Duration::from_secs(2);
/// Records of each side one check reads at most: a long backlog is read
/// over several checks.
const RECORDS_PER_CHECK: usize = 100_000;
/// Keys a running diff holds in all (both versions, every output): an
/// output whose keys take it past this stops being compared, and says so.
pub const MAX_DIFF_KEYS: usize = 2_000_000;
/// Bytes of keys and values a running diff holds in all (about; both
/// versions, every output): past them, likewise.
pub const MAX_DIFF_BYTES: u64 = 512 << 20;
/// Changed keys a status lists.
pub const DIFF_EXAMPLES: usize = 20;
/// Largest value an example shows whole (about, in bytes); a larger one
/// is shown by its size.
const EXAMPLE_VALUE_BYTES: usize = 1024;

/// A candidate running beside a served job.
pub struct Shadow {
    version: Version,
    runtime: Arc<JobRuntime>,
    thread: Mutex<Option<JoinHandle<()>>>,
    differ: Mutex<Option<JoinHandle<()>>>,
    diffs: Arc<Mutex<Vec<RunningDiff>>>,
    ended: Arc<AtomicBool>,
}

impl Shadow {
    /// Starts `runtime` (the candidate, as `version` of the job whose live
    /// version runs `live`) and the running diff of their outputs.
    pub fn start(version: Version, runtime: Arc<JobRuntime>, live: JobConfig) -> Arc<Shadow> {
        let thread = runtime.spawn();
        let diffs = Arc::new(Mutex::new(Vec::new()));
        let ended = Arc::new(AtomicBool::new(false));
        let differ = {
            let (diffs, ended) = (diffs.clone(), ended.clone());
            let differ = Differ {
                live,
                shadow: runtime.config.clone(),
                views: runtime.dir.path().join("diff-views"),
                redact: {
                    let runtime = runtime.clone();
                    Box::new(move |message: &str| runtime.redact(message))
                },
            };
            std::thread::Builder::new()
                .name(format!("shadow-diff-{}", runtime.config.settings.name))
                .spawn(move || differ.run(&diffs, &ended))
                .map_err(
                    |err| tracing::error!(error = %err, "cannot start a shadow's running diff"),
                )
                .ok()
        };
        Arc::new(Shadow {
            version,
            runtime,
            thread: Mutex::new(Some(thread)),
            differ: Mutex::new(differ),
            diffs,
            ended,
        })
    }

    /// The version it writes.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The candidate's job runtime.
    pub fn runtime(&self) -> &Arc<JobRuntime> {
        &self.runtime
    }

    /// Its status, with the last running diff.
    pub fn status(&self) -> ShadowStatus {
        let status = self.runtime.status();
        ShadowStatus {
            version: self.version.to_string(),
            plugin: status.plugin,
            state: status.state,
            records: status.records,
            lag: status.lag,
            last_error: status.last_error,
            cpu_seconds: status.cpu_seconds,
            traps: status.traps,
            diff: lock(&self.diffs).clone(),
        }
    }

    /// Makes the candidate commit what it processed and stop, and the
    /// running diff end.
    pub fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
        self.runtime.end();
        if let Some(differ) = lock(&self.differ).as_ref() {
            differ.thread().unpark();
        }
    }

    /// Waits for its threads to end (after [`Shadow::end`]).
    pub fn join(&self) {
        let thread = lock(&self.thread).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        let differ = lock(&self.differ).take();
        if let Some(differ) = differ {
            let _ = differ.join();
        }
    }
}

/// The running diff: both versions' outputs read as they grow.
struct Differ {
    live: JobConfig,
    shadow: JobConfig,
    /// Where the views of local stores are kept.
    views: PathBuf,
    /// Takes the host's paths out of an error the tenant sees.
    redact: Box<dyn Fn(&str) -> String + Send>,
}

/// One output's two sides, once opened.
struct Sides {
    live: GrowingOutput,
    shadow: GrowingOutput,
    /// The last comparison, kept while neither side reads anything new.
    last: Option<RunningDiff>,
}

impl Differ {
    fn run(&self, diffs: &Mutex<Vec<RunningDiff>>, ended: &AtomicBool) {
        let outputs = self.live.settings.outputs.clone();
        let mut sides: Vec<Option<Sides>> = outputs.iter().map(|_| None).collect();
        let mut stopped: Vec<Option<RunningDiff>> = outputs.iter().map(|_| None).collect();
        while !ended.load(Ordering::SeqCst) {
            let mut now = Vec::with_capacity(outputs.len());
            for (index, output) in outputs.iter().enumerate() {
                if ended.load(Ordering::SeqCst) {
                    return;
                }
                if let Some(last) = &stopped[index] {
                    now.push(last.clone());
                    continue;
                }
                // What the other outputs' sides hold counts against this one's budget.
                let others: u64 = sides
                    .iter()
                    .enumerate()
                    .filter(|(other, _)| *other != index)
                    .flat_map(|(_, sides)| sides.iter())
                    .map(|sides| sides.live.held_bytes + sides.shadow.held_bytes)
                    .sum();
                let budget = MAX_DIFF_BYTES.saturating_sub(others);
                let diff = match self.check(index, output, &mut sides[index], budget) {
                    Ok(diff) => diff,
                    Err(err) => {
                        // Read again from the start at the next check.
                        sides[index] = None;
                        RunningDiff {
                            error: Some((self.redact)(&format!("{err:#}"))),
                            ..empty_diff(output)
                        }
                    }
                };
                let (keys, bytes) = sides.iter().flatten().fold((0, 0), |(keys, bytes), sides| {
                    (
                        keys + sides.live.values.values.len() + sides.shadow.values.values.len(),
                        bytes + sides.live.held_bytes + sides.shadow.held_bytes,
                    )
                });
                if (keys > MAX_DIFF_KEYS || bytes > MAX_DIFF_BYTES) && sides[index].is_some() {
                    let stop = RunningDiff {
                        error: Some(format!(
                            "the running diff stopped: its outputs hold more than {MAX_DIFF_KEYS} keys or {MAX_DIFF_BYTES} bytes (MAX_DIFF_KEYS, MAX_DIFF_BYTES; both versions together)"
                        )),
                        ..diff
                    };
                    sides[index] = None;
                    stopped[index] = Some(stop.clone());
                    now.push(stop);
                } else {
                    now.push(diff);
                }
            }
            *lock(diffs) = now;
            std::thread::park_timeout(DIFF_EVERY);
        }
    }

    /// Reads what both sides of `output` committed since the last check,
    /// and compares them.
    fn check(
        &self,
        index: usize,
        output: &str,
        sides: &mut Option<Sides>,
        budget: u64,
    ) -> anyhow::Result<RunningDiff> {
        if sides.is_none() {
            let open = |config: &JobConfig, side: &str| -> anyhow::Result<GrowingOutput> {
                let view = self.views.join(format!("{side}-{index}"));
                let reader = format!("{}-diff-{side}-{index}", self.shadow.settings.name);
                Ok(GrowingOutput::new(output_source(config, output, &view, &reader)?))
            };
            *sides = Some(Sides {
                live: open(&self.live, "live")?,
                shadow: open(&self.shadow, "shadow")?,
                last: None,
            });
        }
        let sides = sides.as_mut().expect("opened above");
        let read_before = (sides.live.values.records, sides.shadow.values.records);
        // Each side stops reading once both hold more than the budget.
        let live_done = sides
            .live
            .read_more(RECORDS_PER_CHECK, budget.saturating_sub(sides.shadow.held_bytes))?;
        let shadow_done = sides
            .shadow
            .read_more(RECORDS_PER_CHECK, budget.saturating_sub(sides.live.held_bytes))?;
        let read_now = (sides.live.values.records, sides.shadow.values.records);
        if let Some(last) = &sides.last
            && read_now == read_before
            && last.caught_up == (live_done && shadow_done)
        {
            // Nothing new: the same comparison, checked now.
            return Ok(RunningDiff { checked_at: unix_seconds(), ..last.clone() });
        }
        let (live, shadow) = (&sides.live.values, &sides.shadow.values);
        let mut diff = RunningDiff {
            caught_up: live_done && shadow_done,
            live_records: live.records,
            shadow_records: shadow.records,
            live_positions: live.positions.clone(),
            shadow_positions: shadow.positions.clone(),
            ..empty_diff(output)
        };
        for (key, live_value) in &live.values {
            match shadow.values.get(key) {
                Some(shadow_value) if shadow_value == live_value => diff.equal += 1,
                Some(shadow_value) => {
                    diff.changed += 1;
                    if diff.examples.len() < DIFF_EXAMPLES {
                        diff.examples.push(ChangedKey {
                            key: shown(
                                serde_json::from_str(key).unwrap_or(serde_json::Value::Null),
                            ),
                            live: shown(live_value.clone()),
                            shadow: shown(shadow_value.clone()),
                            delta: delta(live_value, shadow_value),
                        });
                    }
                }
                None => diff.only_live += 1,
            }
        }
        diff.only_shadow =
            shadow.values.keys().filter(|key| !live.values.contains_key(*key)).count() as u64;
        sides.last = Some(diff.clone());
        Ok(diff)
    }
}

/// `value` as an example shows it: whole, or past
/// [`EXAMPLE_VALUE_BYTES`] by its size.
fn shown(value: serde_json::Value) -> serde_json::Value {
    let size = value_size(&value);
    if size > EXAMPLE_VALUE_BYTES {
        serde_json::Value::String(format!("<a value of about {size} bytes>"))
    } else {
        value
    }
}

fn empty_diff(output: &str) -> RunningDiff {
    RunningDiff {
        output: output.to_string(),
        checked_at: unix_seconds(),
        caught_up: false,
        live_records: 0,
        shadow_records: 0,
        live_positions: Default::default(),
        shadow_positions: Default::default(),
        equal: 0,
        changed: 0,
        only_live: 0,
        only_shadow: 0,
        examples: Vec::new(),
        error: None,
    }
}

/// Seconds since the Unix epoch, now.
fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}
