//! Hot-swap benchmark: a local billing job follows an input that grows
//! continuously (100 ms commits) while its plugin is pushed 10 times,
//! alternating two builds. Reports the time from a push to the first
//! transaction committed by the new version, and the longest
//! commit-to-commit gap around a swap next to the normal gap.
//!
//! `cargo bench -p tally-tests --bench hot_swap` (scripts/bench-swap).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tally_host::config::{JobConfig, Limits, LocalConfig, DEFAULT_BATCH_SIZE};
use tally_host::hot_swap::{CommitReport, JobObserver, PluginSlot, SwapPolicy};
use tally_host::plugin::PluginRuntime;
use tally_host::task::LocalTask;
use tally_tests::usage_lines;

#[allow(dead_code)] // the benchmark uses only the two billing builds
mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const INTERVAL: Duration = Duration::from_millis(100);
const PUSHES: usize = 10;

/// Every commit: when it finished and which version made it.
#[derive(Default)]
struct Commits(Mutex<Vec<(Instant, String)>>);

impl JobObserver for Commits {
    fn committed(&self, commit: &CommitReport) {
        self.0.lock().unwrap().push((commit.at, commit.plugin_digest.clone()));
    }
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("usage.ndjson");
    std::fs::write(&input, "").unwrap();
    let config = JobConfig {
        name: "billing".into(),
        plugin: plugins::USAGE_BILLING.into(),
        outputs: vec!["totals".into()],
        dead_letter_output: "dead-letters".into(),
        commit_interval_ms: INTERVAL.as_millis() as u64,
        batch_size: DEFAULT_BATCH_SIZE,
        limits: Limits::default(),
        local: Some(LocalConfig { inputs: vec![input.clone()], output_dir: dir.path().join("out"), state_dir: dir.path().join("state") }),
        kafka: None,
        hot_swap: SwapPolicy::default(),
    };
    let runtime = PluginRuntime::new().unwrap();
    let first = runtime.load_file(plugins::USAGE_BILLING.as_ref()).unwrap();
    let slot = PluginSlot::new();
    let commits = Arc::new(Commits::default());

    // Input: 2,000 lines every 10 ms (200k events/s), appended whole.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, input) = (stop.clone(), input.clone());
        std::thread::spawn(move || {
            let lines = usage_lines(7, 200_000, 0);
            let mut file = std::fs::OpenOptions::new().append(true).open(&input).unwrap();
            for chunk in lines.chunks(2_000).cycle() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let text: String = chunk.iter().map(|line| format!("{}\n", line.line)).collect();
                file.write_all(text.as_bytes()).unwrap();
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let job_stop = Arc::new(AtomicBool::new(false));
    let job = {
        let (job_stop, slot, commits) = (job_stop.clone(), slot.clone(), commits.clone());
        // A task stays on the thread that opened it (plugin instances are not Send).
        std::thread::spawn(move || {
            let mut task = LocalTask::open(&config, &first).unwrap();
            task.attach(slot, SwapPolicy::default(), commits);
            task.run_following(&job_stop).unwrap()
        })
    };
    std::thread::sleep(Duration::from_secs(2));

    let builds = [plugins::BILLING_VARIANT, plugins::USAGE_BILLING];
    let (mut compile, mut to_commit, mut windows) = (Vec::new(), Vec::new(), Vec::new());
    for push in 0..PUSHES {
        let started = Instant::now();
        let plugin = runtime.load_file(builds[push % 2].as_ref()).unwrap();
        compile.push(started.elapsed());
        let pushed_at = Instant::now();
        slot.push(plugin.clone());
        let committed_at = loop {
            let found = commits.0.lock().unwrap().iter().find(|(at, digest)| *at > pushed_at && digest == plugin.digest()).map(|(at, _)| *at);
            if let Some(at) = found {
                break at;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        to_commit.push(committed_at - pushed_at);
        windows.push((pushed_at, committed_at));
        std::thread::sleep(Duration::from_millis(700));
    }
    job_stop.store(true, Ordering::Relaxed);
    let summary = job.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();

    let commits = commits.0.lock().unwrap();
    let mut normal = Vec::new();
    let mut around_swap = Vec::new();
    for pair in commits.windows(2) {
        let (start, end) = (pair[0].0, pair[1].0);
        let gap = end - start;
        // A gap touching a swap window: from the push to the new version's first commit.
        if windows.iter().any(|&(pushed, committed)| end > pushed && start < committed) {
            around_swap.push(gap);
        } else {
            normal.push(gap);
        }
    }
    let median = |values: &mut Vec<Duration>| {
        values.sort();
        values[values.len() / 2]
    };
    let max = |values: &[Duration]| values.iter().copied().max().unwrap();
    let normal_max = max(&normal);
    let swap_max = max(&around_swap);
    println!("hot swap, local billing job, {} events in {} commits, {PUSHES} pushes, {INTERVAL:?} commits", summary.records, summary.commits);
    println!("  compile + check (off the processing path): median {:.1?}, max {:.1?}", median(&mut compile), max(&compile));
    println!("  push -> first commit by the new version:   median {:.1?}, max {:.1?}", median(&mut to_commit.clone()), max(&to_commit));
    println!("  commit-to-commit gap, normal:              median {:.1?}, max {normal_max:.1?}", median(&mut normal));
    println!("  commit-to-commit gap, around a swap:       median {:.1?}, max {swap_max:.1?}", median(&mut around_swap));
    println!(
        "  longest gap around a swap = {:.2} commit intervals (target: at most 2); {:.2}x the longest normal gap",
        swap_max.as_secs_f64() / INTERVAL.as_secs_f64(),
        swap_max.as_secs_f64() / normal_max.as_secs_f64()
    );
}
