//! The crash test: `tally run` SIGKILLed at random moments and restarted
//! until it finishes; afterwards every input line has counted exactly once,
//! with the Rust build and with the Python one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tally_core::state::StateStore;
use tally_state_rocks::RocksStore;
use tally_tests::*;

use crate::plugins::{USAGE_BILLING, USAGE_BILLING_PYTHON};

const EVENTS: usize = 200_000;
const FILES: usize = 4;
const KILLS: u32 = 12;

#[test]
fn killed_at_random_moments_a_local_run_still_counts_every_event_exactly_once() {
    // Small batches and frequent commits make each run slow enough for the
    // kills to land mid-run, and put many commit boundaries in their way.
    crash_loop(USAGE_BILLING, EVENTS, "commit_interval_ms = 2\nbatch_size = 16");
}

#[test]
fn killed_at_random_moments_a_python_plugin_still_counts_every_event_exactly_once() {
    // The slowest and largest build (CPython inside): each restart loads
    // it from the compile cache instead of compiling it for seconds.
    crash_loop(USAGE_BILLING_PYTHON, 30_000, "commit_interval_ms = 5\nbatch_size = 32");
}

/// Runs the billing job over `events` generated lines with `plugin`,
/// SIGKILLing `tally run` at random moments [`KILLS`] times and restarting
/// it until it finishes; then checks that every line counted exactly once.
fn crash_loop(plugin: &str, events: usize, settings: &str) {
    let seed =
        std::env::var("TALLY_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
                as u64
        });
    println!("crash test seed: {seed} (set TALLY_CRASH_SEED to replay)");
    let mut rng = Rng::new(seed);

    let dir = tempfile::tempdir().unwrap();
    let lines = usage_lines(seed, events, 10);
    let (inputs, partitions) = write_partitions(dir.path(), &lines, FILES);
    let job = write_billing_job(dir.path(), plugin, &inputs, settings);
    let totals_path = dir.path().join("out/totals.ndjson");

    // The window is short enough that all the kills land before the input
    // runs out even on a fast machine (a run gets through ~150k events/s
    // with the Rust build).
    let kills = run_killing(&job, &dir.path().join("compiled"), &totals_path, KILLS, 60, &mut rng);
    assert!(kills >= 10, "only {kills} kills landed mid-run");

    check_exactly_once(dir.path(), &lines, &partitions);
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn check_exactly_once(dir: &Path, lines: &[UsageLine], partitions: &[Vec<UsageLine>]) {
    let input_at = |source: &(String, u64)| -> &UsageLine {
        let index: usize =
            source.0.trim_start_matches("usage-").trim_end_matches(".ndjson").parse().unwrap();
        &partitions[index][source.1 as usize]
    };
    let totals = read_totals(&dir.join("out/totals.ndjson"));
    let dead = read_dead_letters(&dir.join("out/dead-letters.ndjson"));

    // Replaying the output in order: each line adds exactly its own input
    // line's quantity to its key, and no input line appears twice.
    let mut running: BTreeMap<BillingKey, u64> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for line in &totals {
        assert!(seen.insert(line.source.clone()), "input {:?} contributed twice", line.source);
        let (key, quantity) =
            input_at(&line.source).effect.clone().expect("a bad line must not produce a total");
        assert_eq!(line.key, key, "output at {:?} has the wrong key", line.source);
        let total = running.entry(key).or_insert(0);
        *total += quantity;
        assert_eq!(line.total, *total, "running total broken at {:?}", line.source);
    }
    for (partition, offset, _) in &dead {
        let source = (partition.clone(), *offset);
        assert!(
            seen.insert(source.clone()),
            "input {source:?} was dead-lettered and also counted, or dead-lettered twice"
        );
        assert!(input_at(&source).effect.is_none(), "good input {source:?} was dead-lettered");
    }
    assert_eq!(totals.len() + dead.len(), lines.len(), "processed + dead-lettered = input");
    assert_eq!(final_totals(&totals), expected_totals(lines));

    // The committed state agrees with the output.
    let store = RocksStore::open(&dir.join("state/db")).unwrap();
    let state: BTreeMap<BillingKey, u64> = store
        .scan_state()
        .unwrap()
        .into_iter()
        .map(|(key, value)| {
            let key: serde_json::Value = serde_json::from_slice(&key).unwrap();
            let key = (
                key["customer"].as_str().unwrap().to_string(),
                key["metric"].as_str().unwrap().to_string(),
                key["period"].as_str().unwrap().to_string(),
            );
            (key, serde_json::from_slice(&value).unwrap())
        })
        .collect();
    assert_eq!(state, expected_totals(lines));
}

#[test]
fn sigterm_commits_what_was_processed_and_a_restart_finishes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let lines = usage_lines(11, 100_000, 10);
    let (inputs, partitions) = write_partitions(dir.path(), &lines, FILES);
    let job = write_billing_job(
        dir.path(),
        USAGE_BILLING,
        &inputs,
        "commit_interval_ms = 2\nbatch_size = 16",
    );
    let totals_path = dir.path().join("out/totals.ndjson");

    let child = Command::new(tally_binary())
        .arg("run")
        .arg(&job)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while file_len(&totals_path) == 0 {
        assert!(Instant::now() < deadline, "tally made no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let stopped = child.wait_with_output().unwrap();
    assert!(stopped.status.success(), "SIGTERM should end the run cleanly: {}", stopped.status);
    let said = String::from_utf8_lossy(&stopped.stdout);
    assert!(said.contains("stopped on request"), "{said}");
    let partial = read_totals(&totals_path).len();
    let good = lines.iter().filter(|line| line.effect.is_some()).count();
    assert!(
        partial > 0 && partial < good,
        "the run should stop midway, it applied {partial} of {good}"
    );

    let rest = Command::new(tally_binary()).arg("run").arg(&job).output().unwrap();
    assert!(rest.status.success());
    let said = String::from_utf8_lossy(&rest.stdout);
    assert!(!said.contains(": 0 records"), "the restart should have had work left: {said}");
    check_exactly_once(dir.path(), &lines, &partitions);
}

#[test]
fn sigterm_before_the_job_opens_stops_it_cleanly_too() {
    let dir = tempfile::tempdir().unwrap();
    let lines = usage_lines(12, 5_000, 10);
    let (inputs, partitions) = write_partitions(dir.path(), &lines, FILES);
    let job = write_billing_job(dir.path(), USAGE_BILLING, &inputs, "");
    // While the plugin compiles (about 100 ms), before the job opens: as
    // soon as the process catches SIGTERM. (A fixed delay raced the start
    // of a 500 MB binary on a loaded machine: a signal before the handler
    // exists is the kernel's to deliver, and kills with 143.)
    let child = Command::new(tally_binary())
        .arg("run")
        .arg(&job)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until_it_catches_sigterm(child.id());
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let stopped = child.wait_with_output().unwrap();
    assert!(
        stopped.status.success(),
        "an early SIGTERM ends the run cleanly, not with 143: {} {}",
        stopped.status,
        String::from_utf8_lossy(&stopped.stderr)
    );
    assert!(String::from_utf8_lossy(&stopped.stdout).contains("stopped on request"));
    let rest = Command::new(tally_binary()).arg("run").arg(&job).output().unwrap();
    assert!(rest.status.success());
    check_exactly_once(dir.path(), &lines, &partitions);
}

/// Waits until process `pid` has a handler for SIGTERM (its `SigCgt` mask
/// in `/proc/<pid>/status` has bit 15), for at most 10 s.
fn wait_until_it_catches_sigterm(pid: u32) {
    const SIGTERM_BIT: u64 = 1 << (15 - 1);
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|line| line.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .unwrap_or(0);
        if caught & SIGTERM_BIT != 0 {
            return;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    panic!("process {pid} installed no SIGTERM handler within 10 s");
}
