//! Delivery throughput, side by side in one process (alternating rounds,
//! the same records, wall clock, medians): `tally deliver`'s two targets
//! against a bare client doing the same work with no ledger and no
//! position.
//!
//! - HTTP: the records of a local job (the running-totals billing job, one
//!   record per event, each of its own key, as a period job's FINALs are)
//!   `POST`ed to a loopback receiver
//!   (`tally_tests::receiver`, keep-alive) with `max_in_flight` = 16,
//!   against the same HTTP client (`HttpTarget`) on 16 threads sending the
//!   same bodies and keys from memory.
//! - PostgreSQL: the same records upserted in transactions of 500 with the
//!   position (`tally deliver`), against a bare client inserting the same
//!   rows in transactions of 500.
//!
//! `cargo bench -p tally-tests --bench deliver` (`scripts/bench-deliver`
//! starts the database; TALLY_BENCH_RECORDS and TALLY_BENCH_ROUNDS change
//! the size; TALLY_BENCH_ONLY=http or =postgres runs one target).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use tally_core::plugin::PluginRuntime;
use tally_core::settings::JobSettings;
use tally_deliver::http::{Attempt, HttpTarget};
use tally_deliver::record::OutputRecord;
use tally_deliver::settings::{Body, DeliverSettings, HttpSettings, PostgresSettings, Target};
use tally_deliver::{LocalOutput, RunOptions};
use tally_local::{LocalConfig, LocalTask};
use tally_tests::receiver::{Faults, Receiver};
use tally_tests::{distinct_key_lines, env_or, process_cpu_seconds, write_partitions};

#[allow(dead_code)] // the benchmark uses one of the plugins
mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

/// The allocator the `tally` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const IN_FLIGHT: usize = 16;
const BATCH: usize = 500;

/// One record as the bare clients send it.
struct Record {
    key: String,
    order_key: String,
    body: String,
}

/// Runs the billing job over `events` events, each of its own billing key:
/// its output file and store.
fn job_output(dir: &Path, events: usize) -> (PathBuf, PathBuf) {
    let lines = distinct_key_lines(events, 7);
    let (inputs, _) = write_partitions(dir, &lines, 4);
    let plugin =
        PluginRuntime::new().unwrap().load_file(Path::new(plugins::USAGE_BILLING)).unwrap();
    let settings =
        JobSettings::new("billing", plugins::USAGE_BILLING.into(), vec!["totals".into()]);
    let local = LocalConfig {
        inputs,
        output_dir: dir.join("out"),
        state_dir: dir.join("state"),
        confine_to: None,
        output_suffix: String::new(),
    };
    let summary = LocalTask::open(&settings, &local, &plugin).unwrap().run().unwrap();
    assert_eq!(summary.records as usize, events);
    (dir.join("out/totals.ndjson"), dir.join("state/db"))
}

fn records(output: &Path) -> Vec<Record> {
    std::fs::read_to_string(output)
        .unwrap()
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            Record {
                key: value["idempotency_key"].as_str().unwrap().to_string(),
                order_key: value["key"].to_string(),
                body: value["value"].to_string(),
            }
        })
        .collect()
}

fn http_settings(url: String) -> HttpSettings {
    HttpSettings {
        url,
        idempotency_header: "Idempotency-Key".into(),
        timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
        max_in_flight: IN_FLIGHT,
        key_retention: Duration::from_secs(24 * 3600),
        lookup_url: None,
        body: Body::Value,
        retry_initial: Duration::from_millis(200),
        retry_max: Duration::from_secs(30),
        secret: None,
    }
}

/// `tally deliver` over the job's output, to `target`: its records/s.
fn tally(
    dir: &Path,
    run: &str,
    output: &Path,
    store: &Path,
    target: Target,
    expected: usize,
) -> f64 {
    let state_dir = dir.join(run);
    let settings = DeliverSettings {
        job: PathBuf::from("billing.toml"),
        output: "totals".into(),
        dead_letters: state_dir.join("dead-letters.ndjson"),
        state_dir: state_dir.clone(),
        ledger_topic: None,
        ledger_retention: std::time::Duration::from_secs(24 * 3600),
        target,
    };
    let mut source = LocalOutput::new(
        output.to_path_buf(),
        store.to_path_buf(),
        state_dir.join("job-view"),
        "totals".into(),
    );
    let started = Instant::now();
    let summary = tally_deliver::run(
        &settings,
        &mut source,
        None,
        Arc::new(AtomicBool::new(false)),
        RunOptions { until_caught_up: true },
    )
    .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(summary.delivered as usize, expected, "{run}");
    expected as f64 / elapsed.as_secs_f64()
}

/// A bare HTTP client: the same client (`HttpTarget`: the same agent,
/// timeouts and headers) on 16 threads, each a share of the keys, sending
/// from memory with no ledger, no position and no ordering: its records/s.
fn bare_http(url: &str, records: &[Record]) -> f64 {
    let target = HttpTarget::new(http_settings(url.to_string()));
    let records: Vec<OutputRecord> = records
        .iter()
        .enumerate()
        .map(|(offset, record)| OutputRecord {
            partition: 0,
            offset: offset as u64,
            idempotency_key: record.key.clone(),
            order_key: record.order_key.clone(),
            body: record.body.clone().into_bytes(),
        })
        .collect();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for lane in 0..IN_FLIGHT {
            let (target, records) = (&target, &records);
            scope.spawn(move || {
                for record in records.iter().skip(lane).step_by(IN_FLIGHT) {
                    assert_eq!(target.send(record), Attempt::Delivered);
                }
            });
        }
    });
    records.len() as f64 / started.elapsed().as_secs_f64()
}

/// The output partition of every row (a local output has one).
const PARTITION: i32 = 0;

/// A bare PostgreSQL client: the same rows, in transactions of 500, with
/// no position: its records/s.
fn bare_postgres(url: &str, table: &str, records: &[Record]) -> f64 {
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (idempotency_key text PRIMARY KEY, record_key jsonb NOT NULL, value jsonb NOT NULL, \
             output_partition integer NOT NULL, output_offset bigint NOT NULL, delivered_at timestamptz NOT NULL DEFAULT now())"
        ))
        .unwrap();
    let started = Instant::now();
    for (chunk_index, chunk) in records.chunks(BATCH).enumerate() {
        let mut sql = format!(
            "INSERT INTO {table} (idempotency_key, record_key, value, output_partition, output_offset) VALUES "
        );
        let offsets: Vec<i64> =
            (0..chunk.len()).map(|i| (chunk_index * BATCH + i) as i64).collect();
        let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = Vec::new();
        for (index, record) in chunk.iter().enumerate() {
            let base = index * 5;
            if index > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!(
                "(${}, ${}::text::jsonb, ${}::text::jsonb, ${}, ${})",
                base + 1,
                base + 2,
                base + 3,
                base + 4,
                base + 5
            ));
            params.extend([
                &record.key as &(dyn postgres::types::ToSql + Sync),
                &record.order_key,
                &record.body,
                &PARTITION,
                &offsets[index],
            ]);
        }
        sql.push_str(" ON CONFLICT (idempotency_key) DO UPDATE SET value = EXCLUDED.value");
        let mut transaction = client.transaction().unwrap();
        transaction.execute(&sql, &params).unwrap();
        transaction.commit().unwrap();
    }
    records.len() as f64 / started.elapsed().as_secs_f64()
}

fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
    rates[rates.len() / 2]
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let events = env_or("TALLY_BENCH_RECORDS", 20_000);
    let rounds = env_or("TALLY_BENCH_ROUNDS", 3);
    let only = std::env::var("TALLY_BENCH_ONLY").ok();
    let postgres_url = std::env::var("TALLY_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://tally:tally@127.0.0.1:55432/tally".into());
    let dir = tempfile::tempdir().unwrap();
    let (output, store) = job_output(dir.path(), events);
    let records = records(&output);
    println!(
        "{} records of the billing job, {rounds} rounds, wall clock, medians: tally deliver vs a bare client (no ledger, no position)",
        records.len()
    );
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let (mut http, mut http_bare, mut pg, mut pg_bare) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        if only.as_deref().is_none_or(|only| only == "http") {
            let receiver = Receiver::start(Faults::default());
            let cpu = process_cpu_seconds();
            let rate = tally(
                dir.path(),
                &format!("http-{round}"),
                &output,
                &store,
                Target::Http(http_settings(receiver.url())),
                records.len(),
            );
            let tally_cpu = process_cpu_seconds() - cpu;
            let receiver = Receiver::start(Faults::default());
            let cpu = process_cpu_seconds();
            let bare = bare_http(&receiver.url(), &records);
            let bare_cpu = process_cpu_seconds() - cpu;
            let per = |seconds: f64| seconds * 1e6 / records.len() as f64;
            println!(
                "  round {round} http:     tally {rate:>8.0} records/s, bare {bare:>8.0} records/s, ratio {:.2}; CPU per record (client and receiver): tally {:.1} µs, bare {:.1} µs",
                rate / bare,
                per(tally_cpu),
                per(bare_cpu)
            );
            http.push(rate);
            http_bare.push(bare);
        }
        if only.as_deref().is_none_or(|only| only == "postgres") {
            let table = format!("bench_deliver_{nanos}_{round}");
            let target = Target::Postgres(PostgresSettings {
                url: postgres_url.clone(),
                table: table.clone(),
                delivery: Some(table.clone()),
                batch_size: BATCH,
                ca_file: None,
            });
            let rate =
                tally(dir.path(), &format!("pg-{round}"), &output, &store, target, records.len());
            let bare = bare_postgres(&postgres_url, &format!("{table}_bare"), &records);
            println!(
                "  round {round} postgres: tally {rate:>8.0} records/s, bare {bare:>8.0} records/s, ratio {:.2}",
                rate / bare
            );
            let mut client = postgres::Client::connect(&postgres_url, postgres::NoTls).unwrap();
            client.batch_execute(&format!("DROP TABLE {table}; DROP TABLE {table}_bare")).unwrap();
            pg.push(rate);
            pg_bare.push(bare);
        }
    }
    if !http.is_empty() {
        let (rate, bare) = (median(http), median(http_bare));
        println!(
            "median http:     tally {rate:.0} records/s, bare {bare:.0} records/s, tally/bare = {:.2}",
            rate / bare
        );
    }
    if !pg.is_empty() {
        let (rate, bare) = (median(pg), median(pg_bare));
        println!(
            "median postgres: tally {rate:.0} records/s, bare {bare:.0} records/s, tally/bare = {:.2}",
            rate / bare
        );
    }
}
