//! Local-mode throughput of billing periods against running totals, side
//! by side (alternating, same input, same 100 ms commits, one process):
//! the period billing plugin (`plugins/billing-periods`: event time,
//! periods, de-duplication by event id, all host-side) and the running
//! totals plugin (`plugins/usage-billing`), both as Wasm. Events per wall
//! second and per CPU second of this process, medians over the rounds and
//! the median of each round's own ratio. Then the seen-id store's size on
//! disk: the periods run's RocksDB, compacted, per event id it remembers.
//!
//! `cargo bench -p tally-tests --bench periods` (TALLY_BENCH_EVENTS and
//! TALLY_BENCH_ROUNDS change the size; scripts/bench runs it pinned;
//! TALLY_BENCH_ONLY=periods or =totals runs one side alone, for a
//! profiler).

use std::path::Path;
use std::sync::Arc;

use tally_core::observe::RunSummary;
use tally_core::plugin::PluginRuntime;
use tally_core::settings::{DEFAULT_BATCH_SIZE, JobSettings};
use tally_local::{LocalConfig, LocalTask};
use tally_periods::{PeriodSettings, PeriodsTable};
use tally_tests::{
    env_or, expected_totals, process_cpu_seconds, usage_lines, with_event_ids,
    write_partitions_by_customer,
};

#[allow(dead_code)] // the benchmark uses two of the plugins
mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

/// The allocator the `tally` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn job(dir: &Path, inputs: Vec<std::path::PathBuf>, run: &str) -> (JobSettings, LocalConfig) {
    let periods = run.starts_with("periods");
    let (plugin, output) = if periods {
        (plugins::BILLING_PERIODS, "periods")
    } else {
        (plugins::USAGE_BILLING, "totals")
    };
    let mut settings = JobSettings::new("billing", plugin.into(), vec![output.into()]);
    settings.commit_interval_ms = 100;
    settings.batch_size = env_or("TALLY_BENCH_BATCH", DEFAULT_BATCH_SIZE);
    if periods {
        let table = PeriodsTable::default();
        settings.periods = Some(Arc::new(PeriodSettings::try_from(table).unwrap()));
        settings.plugin_config = Some(
            r#"{"meters":{"api_calls":"sum","storage_gb_hours":"sum","egress_mb":"sum"}}"#.into(),
        );
    }
    let local = LocalConfig {
        inputs,
        output_dir: dir.join(run).join("out"),
        state_dir: dir.join(run).join("state"),
        confine_to: None,
        output_suffix: String::new(),
    };
    (settings, local)
}

/// Bytes of the live SST files of the RocksDB at `path`, after a full
/// compaction, and its entries.
fn compacted_size(path: &Path) -> (u64, u64) {
    let options = rocksdb::Options::default();
    let families = rocksdb::DB::list_cf(&options, path).expect("listing the store's families");
    let db =
        rocksdb::DB::open_cf(&options, path, &families).expect("opening the periods run's store");
    let mut entries = 0;
    for family in &families {
        let handle = db.cf_handle(family).unwrap();
        db.compact_range_cf::<&[u8], &[u8]>(&handle, None, None);
        entries += db.iterator_cf(&handle, rocksdb::IteratorMode::Start).count() as u64;
    }
    drop(db);
    let bytes = std::fs::read_dir(path)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| entry.path().extension().is_some_and(|ext| ext == "sst"))
        .map(|entry| entry.metadata().unwrap().len())
        .sum();
    (bytes, entries)
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let events = env_or("TALLY_BENCH_EVENTS", 1_000_000);
    let rounds = env_or("TALLY_BENCH_ROUNDS", 5);
    let dir = tempfile::tempdir_in(
        std::env::var("TALLY_BENCH_DIR")
            .unwrap_or_else(|_| std::env::temp_dir().display().to_string()),
    )
    .expect("bench directory");
    let lines = with_event_ids(usage_lines(2026, events, 0));
    let inputs = write_partitions_by_customer(dir.path(), &lines, 4);
    let october: u64 = expected_totals(&lines)
        .iter()
        .filter(|(key, _)| key.2 == "2026-10")
        .map(|(_, total)| total)
        .sum();
    let runtime = PluginRuntime::new().unwrap();
    let totals_plugin = runtime.load_file(Path::new(plugins::USAGE_BILLING)).unwrap();
    let periods_plugin = runtime.load_file(Path::new(plugins::BILLING_PERIODS)).unwrap();

    println!(
        "local mode, {events} events with ids in 4 files, 100 ms commits, {rounds} rounds: running totals vs periods (Wasm both)"
    );
    let (mut totals, mut periods) = (Vec::new(), Vec::new());
    let (mut totals_cpu, mut periods_cpu) = (Vec::new(), Vec::new());
    let mut store_size = None;
    let only = std::env::var("TALLY_BENCH_ONLY").ok();
    for round in 0..rounds {
        for kind in ["totals", "periods"] {
            if only.as_deref().is_some_and(|only| only != kind) {
                continue;
            }
            let run = format!("{kind}-{round}");
            let (config, local) = job(dir.path(), inputs.clone(), &run);
            let plugin = if kind == "periods" { &periods_plugin } else { &totals_plugin };
            let mut task = LocalTask::open(&config, &local, plugin).unwrap();
            let cpu_before = process_cpu_seconds();
            let summary: RunSummary = task.run().unwrap();
            let cpu = process_cpu_seconds() - cpu_before;
            assert_eq!(summary.records as usize, events);
            assert_eq!(summary.dead_lettered, 0, "{kind}: every event counts");
            drop(task);
            if kind == "periods" {
                // October closed (November and December wait for their
                // grace): its settled values (each key's last version) add
                // up to October's usage.
                let text =
                    std::fs::read_to_string(local.output_dir.join("periods.ndjson")).unwrap();
                let mut settled = std::collections::BTreeMap::new();
                for line in text.lines() {
                    let line: serde_json::Value = serde_json::from_str(line).unwrap();
                    if line["value"]["period"] == "2026-10" {
                        settled.insert(
                            line["key"].to_string(),
                            line["value"]["value"].as_u64().unwrap(),
                        );
                    }
                }
                let finals: u64 = settled.values().sum();
                assert_eq!(finals, october, "the periods job computed October wrongly");
                if store_size.is_none() {
                    store_size = Some(compacted_size(&local.state_dir.join("db")));
                }
            }
            let rate = events as f64 / summary.elapsed.as_secs_f64();
            let cpu_rate = events as f64 / cpu;
            println!(
                "  round {round} {kind:>7}: {rate:>10.0} events/s wall ({:.2?}, {} commits), {cpu_rate:>10.0} events/CPU-s",
                summary.elapsed, summary.commits
            );
            let (wall, per_cpu) = if kind == "periods" {
                (&mut periods, &mut periods_cpu)
            } else {
                (&mut totals, &mut totals_cpu)
            };
            wall.push(rate);
            per_cpu.push(cpu_rate);
            std::fs::remove_dir_all(dir.path().join(&run)).ok();
        }
    }
    if periods.is_empty() || totals.is_empty() {
        return;
    }
    let median = |rates: &mut Vec<f64>| {
        rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
        rates[rates.len() / 2]
    };
    let mut paired: Vec<f64> = periods_cpu.iter().zip(&totals_cpu).map(|(p, t)| p / t).collect();
    let paired = median(&mut paired);
    let (periods, totals) = (median(&mut periods), median(&mut totals));
    let (periods_cpu, totals_cpu) = (median(&mut periods_cpu), median(&mut totals_cpu));
    println!(
        "median wall: periods {periods:.0} events/s, totals {totals:.0} events/s, periods/totals = {:.2}",
        periods / totals
    );
    println!(
        "median CPU:  periods {periods_cpu:.0} events/CPU-s ({:.2} µs/event), totals {totals_cpu:.0} events/CPU-s ({:.2} µs/event), periods/totals = {:.2}",
        1e6 / periods_cpu,
        1e6 / totals_cpu,
        periods_cpu / totals_cpu
    );
    println!("median of per-round CPU ratios: periods/totals = {paired:.2}");
    if let Some((bytes, entries)) = store_size {
        println!(
            "seen-id store: {bytes} bytes of SST files after compaction for {entries} entries ({events} event ids): {:.1} bytes per event id",
            bytes as f64 / events as f64
        );
    }
}
