//! Local-mode throughput of the billing job: the Wasm plugin against the
//! same aggregation compiled natively into the host, run side by side
//! (alternating, same input, same task, same 100 ms commits), with the ratio.
//!
//! Two rates per run: events per wall-clock second (what a user sees, fsync
//! waits included) and events per CPU second of this process (steadier on a
//! noisy machine). Medians over the rounds, and the median of each round's
//! own wasm/native ratio (the two runs of a round are back to back, so they
//! share the machine's mood).
//!
//! `cargo bench -p tally-tests --bench local_mode` (TALLY_BENCH_EVENTS and
//! TALLY_BENCH_ROUNDS change the size; scripts/bench runs it pinned to one core).

use std::path::Path;

use tally_core::observe::RunSummary;
use tally_core::plugin::PluginRuntime;
use tally_core::settings::{DEFAULT_BATCH_SIZE, JobSettings};
use tally_local::LocalConfig;
use tally_local::LocalTask;
use tally_tests::native::NativeProcessor;
use tally_tests::{
    env_or, expected_totals, final_totals, process_cpu_seconds, read_totals, usage_lines,
    write_partitions,
};

#[allow(dead_code)] // the benchmark uses only the billing plugin
mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

/// The allocator the `tally` binary uses, so both runs see what users get.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn job(dir: &Path, inputs: Vec<std::path::PathBuf>, run: &str) -> (JobSettings, LocalConfig) {
    let mut settings =
        JobSettings::new("billing", plugins::USAGE_BILLING.into(), vec!["totals".into()]);
    settings.commit_interval_ms = 100;
    settings.batch_size = env_or("TALLY_BENCH_BATCH", DEFAULT_BATCH_SIZE);
    let local = LocalConfig {
        inputs,
        output_dir: dir.join(run).join("out"),
        state_dir: dir.join(run).join("state"),
        confine_to: None,
        output_suffix: String::new(),
    };
    (settings, local)
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return; // `cargo test --benches` asks benches to list their tests
    }
    let events = env_or("TALLY_BENCH_EVENTS", 1_000_000);
    let rounds = env_or("TALLY_BENCH_ROUNDS", 5);
    let dir = tempfile::tempdir_in(
        std::env::var("TALLY_BENCH_DIR")
            .unwrap_or_else(|_| std::env::temp_dir().display().to_string()),
    )
    .expect("bench directory");
    let lines = usage_lines(2026, events, 0);
    let (inputs, _) = write_partitions(dir.path(), &lines, 4);
    let expected = expected_totals(&lines);
    let plugin =
        PluginRuntime::new().unwrap().load_file(Path::new(plugins::USAGE_BILLING)).unwrap();

    println!(
        "local mode, billing job, {events} events in 4 files, 100 ms commits, {rounds} rounds each"
    );
    let (mut wasm, mut native) = (Vec::new(), Vec::new());
    let (mut wasm_cpu, mut native_cpu) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for kind in ["wasm", "native"] {
            if std::env::var("TALLY_BENCH_ONLY").is_ok_and(|only| only != kind) {
                continue;
            }
            let (config, local) = job(dir.path(), inputs.clone(), &format!("{kind}-{round}"));
            let mut task = match kind {
                "wasm" => LocalTask::open(&config, &local, &plugin).unwrap(),
                _ => LocalTask::open_with(&config, &local, || {
                    Ok(Box::new(NativeProcessor::new(usage_billing::UsageBilling, "usage-billing")))
                })
                .unwrap(),
            };
            let cpu_before = process_cpu_seconds();
            let summary: RunSummary = task.run().unwrap();
            let cpu = process_cpu_seconds() - cpu_before;
            assert_eq!(summary.records as usize, events);
            let totals = read_totals(&local.output_dir.join("totals.ndjson"));
            assert_eq!(final_totals(&totals), expected, "{kind} computed wrong totals");
            let rate = events as f64 / summary.elapsed.as_secs_f64();
            let cpu_rate = events as f64 / cpu;
            println!(
                "  round {round} {kind:>6}: {rate:>10.0} events/s wall ({:.2?}, {} commits), {cpu_rate:>10.0} events/CPU-s",
                summary.elapsed, summary.commits
            );
            if kind == "wasm" {
                wasm.push(rate);
                wasm_cpu.push(cpu_rate);
            } else {
                native.push(rate);
                native_cpu.push(cpu_rate);
            }
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
    let mut paired: Vec<f64> = wasm_cpu.iter().zip(&native_cpu).map(|(w, n)| w / n).collect();
    let paired = median(&mut paired);
    let (wasm, native) = (median(&mut wasm), median(&mut native));
    let (wasm_cpu, native_cpu) = (median(&mut wasm_cpu), median(&mut native_cpu));
    println!(
        "median wall: wasm {wasm:.0} events/s, native {native:.0} events/s, wasm/native = {:.2}",
        wasm / native
    );
    println!(
        "median CPU:  wasm {wasm_cpu:.0} events/CPU-s, native {native_cpu:.0} events/CPU-s, wasm/native = {:.2}",
        wasm_cpu / native_cpu
    );
    println!("median of per-round CPU ratios: wasm/native = {paired:.2}");
}
