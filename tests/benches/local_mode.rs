//! Local-mode throughput of the billing job: the Wasm plugin against the
//! same aggregation compiled natively into the host, run side by side
//! (alternating, same input, same task, same 100 ms commits), with the ratio.
//!
//! `cargo bench -p tally-tests --bench local_mode` (TALLY_BENCH_EVENTS and
//! TALLY_BENCH_ROUNDS change the size; scripts/bench runs it pinned to one core).

use std::path::Path;

use tally_host::config::{JobConfig, Limits, LocalConfig, DEFAULT_BATCH_SIZE};
use tally_host::plugin::PluginRuntime;
use tally_host::task::{LocalTask, RunSummary};
use tally_tests::native::NativeProcessor;
use tally_tests::{expected_totals, final_totals, read_totals, usage_lines, write_partitions};

#[allow(dead_code)] // the benchmark uses only the billing plugin
mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn job(dir: &Path, inputs: Vec<std::path::PathBuf>, run: &str) -> JobConfig {
    JobConfig {
        name: "billing".into(),
        plugin: plugins::USAGE_BILLING.into(),
        outputs: vec!["totals".into()],
        dead_letter_output: "dead-letters".into(),
        commit_interval_ms: 100,
        batch_size: env_or("TALLY_BENCH_BATCH", DEFAULT_BATCH_SIZE),
        limits: Limits::default(),
        local: LocalConfig { inputs, output_dir: dir.join(run).join("out"), state_dir: dir.join(run).join("state") },
    }
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return; // `cargo test --benches` asks benches to list their tests
    }
    let events = env_or("TALLY_BENCH_EVENTS", 1_000_000);
    let rounds = env_or("TALLY_BENCH_ROUNDS", 3);
    let dir = tempfile::tempdir_in(std::env::var("TALLY_BENCH_DIR").unwrap_or_else(|_| std::env::temp_dir().display().to_string()))
        .expect("bench directory");
    let lines = usage_lines(2026, events, 0);
    let (inputs, _) = write_partitions(dir.path(), &lines, 4);
    let expected = expected_totals(&lines);
    let plugin = PluginRuntime::new().unwrap().load_file(Path::new(plugins::USAGE_BILLING)).unwrap();

    println!("local mode, billing job, {events} events in 4 files, 100 ms commits, {rounds} rounds each");
    let (mut wasm, mut native) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for kind in ["wasm", "native"] {
            if std::env::var("TALLY_BENCH_ONLY").is_ok_and(|only| only != kind) {
                continue;
            }
            let config = job(dir.path(), inputs.clone(), &format!("{kind}-{round}"));
            let mut task = match kind {
                "wasm" => LocalTask::open(&config, &plugin).unwrap(),
                _ => LocalTask::open_with(&config, || {
                    Ok(Box::new(NativeProcessor::new(usage_billing::UsageBilling, "usage-billing")))
                })
                .unwrap(),
            };
            let summary: RunSummary = task.run().unwrap();
            assert_eq!(summary.records as usize, events);
            let totals = read_totals(&config.local.output_dir.join("totals.ndjson"));
            assert_eq!(final_totals(&totals), expected, "{kind} computed wrong totals");
            let rate = events as f64 / summary.elapsed.as_secs_f64();
            println!("  round {round} {kind:>6}: {:>10.0} events/s ({:.2?}, {} commits)", rate, summary.elapsed, summary.commits);
            if kind == "wasm" { wasm.push(rate) } else { native.push(rate) }
            drop(task);
            std::fs::remove_dir_all(dir.path().join(format!("{kind}-{round}"))).ok();
        }
    }
    let median = |rates: &mut Vec<f64>| {
        rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
        rates[rates.len() / 2]
    };
    if wasm.is_empty() || native.is_empty() {
        return;
    }
    let (wasm, native) = (median(&mut wasm), median(&mut native));
    println!("median: wasm {wasm:.0} events/s, native {native:.0} events/s, wasm/native = {:.2}", wasm / native);
}
