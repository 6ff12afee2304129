//! The billing plugin in each language, side by side in one process: its
//! component's size, compile time, cached-load time (a compiled component
//! read back from disk), instantiate time, and events per CPU second in
//! local mode (100 ms commits) against the Rust build and the native one.
//! Then the period billing plugin in each language, the same way: events
//! (each with an id) per CPU second of a period job, against Rust's.
//!
//! `cargo bench -p tally-tests --bench languages` (TALLY_BENCH_EVENTS and
//! TALLY_BENCH_ROUNDS change the size; scripts/bench runs it).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tally_core::limits::Limits;
use tally_core::plugin::{LoadedPlugin, PluginRuntime};
use tally_core::settings::JobSettings;
use tally_local::{LocalConfig, LocalTask};
use tally_periods::{PeriodSettings, PeriodsTable};
use tally_tests::native::NativeProcessor;
use tally_tests::{
    env_or, expected_totals, final_totals, process_cpu_seconds, read_totals, usage_lines,
    with_event_ids, write_partitions, write_partitions_by_customer,
};

#[allow(dead_code)] // the benchmark uses only the billing plugins
mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

/// Compile, cached-load and instantiate times (ms), and the plugin loaded
/// from the cache.
fn load_times(
    runtime: &PluginRuntime,
    path: &str,
    dir: &Path,
) -> (usize, f64, f64, f64, LoadedPlugin) {
    let bytes = std::fs::read(path).unwrap();
    let started = Instant::now();
    let compiled = runtime.precompile(path, &bytes).unwrap();
    let compile_ms = started.elapsed().as_secs_f64() * 1e3;
    let cached =
        dir.join(format!("{}.cwasm", tally_core::plugin::digest(&bytes).replace(':', "-")));
    std::fs::write(&cached, compiled).unwrap();
    let started = Instant::now();
    let plugin = runtime
        .load_compiled(path, &tally_core::plugin::digest(&bytes), bytes.len(), &cached)
        .unwrap();
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    drop(plugin.instantiate(Limits::default()).unwrap());
    let instantiate_ms = started.elapsed().as_secs_f64() * 1e3;
    (bytes.len(), compile_ms, load_ms, instantiate_ms, plugin)
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let events = env_or("TALLY_BENCH_EVENTS", 200_000);
    let rounds = env_or("TALLY_BENCH_ROUNDS", 3);
    let dir = tempfile::tempdir().unwrap();
    let lines = usage_lines(2026, events, 0);
    let (inputs, _) = write_partitions(dir.path(), &lines, 4);
    let expected = expected_totals(&lines);
    let runtime = PluginRuntime::new().unwrap();

    println!(
        "billing plugin per language: local mode, {events} events in 4 files, 100 ms commits, {rounds} rounds; CPU clock of this process"
    );
    println!(
        "{:<8} {:>10} {:>11} {:>11} {:>14}",
        "plugin", "bytes", "compile ms", "cached ms", "instantiate ms"
    );
    let mut builds = Vec::new();
    let ports = [
        ("rust", plugins::USAGE_BILLING),
        ("c", plugins::USAGE_BILLING_C),
        ("go", plugins::USAGE_BILLING_GO),
        ("js", plugins::USAGE_BILLING_JS),
        ("python", plugins::USAGE_BILLING_PYTHON),
    ];
    for (name, path) in ports {
        let (size, compile, load, instantiate, plugin) = load_times(&runtime, path, dir.path());
        println!("{name:<8} {size:>10} {compile:>11.0} {load:>11.1} {instantiate:>14.2}");
        builds.push((name, Some(plugin)));
    }
    builds.push(("native", None));

    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); builds.len()];
    for round in 0..rounds {
        for (index, (name, plugin)) in builds.iter().enumerate() {
            let run = format!("{name}-{round}");
            let mut settings =
                JobSettings::new("billing", plugins::USAGE_BILLING.into(), vec!["totals".into()]);
            settings.commit_interval_ms = 100;
            let local = LocalConfig {
                inputs: inputs.clone(),
                output_dir: dir.path().join(&run).join("out"),
                state_dir: dir.path().join(&run).join("state"),
                confine_to: None,
                output_suffix: String::new(),
            };
            let mut task = match plugin {
                Some(plugin) => LocalTask::open(&settings, &local, plugin).unwrap(),
                None => LocalTask::open_with(&settings, &local, || {
                    Ok(Box::new(NativeProcessor::new(usage_billing::UsageBilling, "usage-billing")))
                })
                .unwrap(),
            };
            let before = process_cpu_seconds();
            let summary = task.run().unwrap();
            let cpu = process_cpu_seconds() - before;
            assert_eq!(summary.records as usize, events);
            assert_eq!(
                final_totals(&read_totals(&local.output_dir.join("totals.ndjson"))),
                expected,
                "{name} computed wrong totals"
            );
            rates[index].push(events as f64 / cpu.max(1e-3));
            drop(task);
            std::fs::remove_dir_all(dir.path().join(&run)).ok();
        }
    }
    let rust = median(rates[0].clone());
    println!("{:<8} {:>16} {:>10}", "plugin", "events/CPU-s", "/ rust");
    for ((name, _), rates) in builds.iter().zip(rates) {
        let rate = median(rates);
        println!("{name:<8} {rate:>16.0} {:>10.2}", rate / rust);
    }
    period_plugins(&runtime, dir.path(), events, rounds);
}

/// The period billing plugin in each language: events per CPU second of a
/// period job over the same events with ids, each build's FINAL and
/// ADJUSTMENT records checked equal to the Rust build's.
fn period_plugins(runtime: &PluginRuntime, dir: &Path, events: usize, rounds: usize) {
    let lines = with_event_ids(usage_lines(2027, events, 0));
    std::fs::create_dir_all(dir.join("periods-input")).unwrap();
    let inputs = write_partitions_by_customer(&dir.join("periods-input"), &lines, 4);
    let builds = [
        ("rust", plugins::BILLING_PERIODS),
        ("c", plugins::BILLING_PERIODS_C),
        ("go", plugins::BILLING_PERIODS_GO),
        ("js", plugins::BILLING_PERIODS_JS),
        ("ts", plugins::BILLING_PERIODS_TS),
        ("python", plugins::BILLING_PERIODS_PYTHON),
    ];
    let loaded: Vec<LoadedPlugin> =
        builds.iter().map(|(_, path)| runtime.load_file(Path::new(path)).unwrap()).collect();
    println!(
        "period billing plugin per language: local mode, {events} events with ids in 4 files (by customer), 100 ms commits, {rounds} rounds; CPU clock of this process"
    );
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); builds.len()];
    let mut rust_records = None;
    for round in 0..rounds {
        for (index, ((name, path), plugin)) in builds.iter().zip(&loaded).enumerate() {
            let run = dir.join(format!("periods-{name}-{round}"));
            let mut settings = JobSettings::new("billing", (*path).into(), vec!["periods".into()]);
            settings.commit_interval_ms = 100;
            settings.periods =
                Some(Arc::new(PeriodSettings::try_from(PeriodsTable::default()).unwrap()));
            settings.plugin_config = Some(
                r#"{"meters":{"api_calls":"sum","storage_gb_hours":"sum","egress_mb":"sum"}}"#
                    .into(),
            );
            let local = LocalConfig {
                inputs: inputs.clone(),
                output_dir: run.join("out"),
                state_dir: run.join("state"),
                confine_to: None,
                output_suffix: String::new(),
            };
            let mut task = LocalTask::open(&settings, &local, plugin).unwrap();
            let before = process_cpu_seconds();
            let summary = task.run().unwrap();
            let cpu = process_cpu_seconds() - before;
            assert_eq!(summary.records as usize, events);
            assert_eq!(summary.dead_lettered, 0, "{name}: every event counts");
            drop(task);
            // What was billed, each period's last version (transactions
            // follow the clock, so ADJUSTMENTs may split differently).
            let text = std::fs::read_to_string(local.output_dir.join("periods.ndjson")).unwrap();
            let mut settled = std::collections::BTreeMap::new();
            for line in text.lines() {
                let line: serde_json::Value = serde_json::from_str(line).unwrap();
                settled.insert(line["key"].to_string(), line["value"]["value"].clone());
            }
            match &rust_records {
                None => rust_records = Some(settled),
                Some(rust) => assert_eq!(&settled, rust, "{name} billed other values than Rust"),
            }
            rates[index].push(events as f64 / cpu.max(1e-3));
            std::fs::remove_dir_all(&run).ok();
        }
    }
    let rust = median(rates[0].clone());
    println!("{:<8} {:>16} {:>10}", "plugin", "events/CPU-s", "/ rust");
    for ((name, _), rates) in builds.iter().zip(rates) {
        let rate = median(rates);
        println!("{name:<8} {rate:>16.0} {:>10.2}", rate / rust);
    }
}
