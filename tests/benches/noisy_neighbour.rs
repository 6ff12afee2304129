//! Noisy-neighbour benchmark: one tenant's billing job under `tally serve`,
//! alone and then beside another tenant's three looping jobs, one memory
//! bomb and one emit flood, in rounds of one run of the host. Each round
//! measures the good job alone, beside the noisy jobs as soon as they
//! burn CPU, and beside them again once the host has demoted them (their
//! calls fail). Reports the good job's rate (committed records per second
//! of wall clock, between 10% and 90% of its input), its ratio to the
//! round's rate alone, and the admin API's latency percentiles while the
//! noisy jobs run (a list request every 20 ms, in every measurement).
//!
//! `cargo bench -p tally-tests --bench noisy_neighbour` (scripts/bench-noisy).
//! Environment: `NOISY_ROUNDS` (default 7), `NOISY_EVENTS` (default
//! 3,000,000), `NOISY_ONLY` (only the noisy jobs whose name starts so).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tally_tests::serve::{ACME, GLOBEX, JsonApi, ServeHost, local_job, number, wait_for};
use tally_tests::usage_lines;

#[allow(dead_code)] // the benchmark uses the billing and hostile plugins only
mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

/// The noisy tenant's jobs: (name, what each of its events does, settings).
const NOISY: &[(&str, &str, &str)] = &[
    ("loop-1", r#"{"k":"z","do":"loop"}"#, "max_failures_in_a_row = 1000"),
    ("loop-2", r#"{"k":"z","do":"loop"}"#, "max_failures_in_a_row = 1000"),
    ("loop-3", r#"{"k":"z","do":"loop"}"#, "max_failures_in_a_row = 1000"),
    ("memory-bomb", r#"{"k":"z","do":"hog"}"#, "max_failures_in_a_row = 1000"),
    ("emit-flood", r#"{"k":"z","do":"emit","n":60000}"#, "max_failures_in_a_row = 1000"),
];

/// CPU time the process `pid` has used (user and system, all threads).
fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command name in parentheses: fields 14 and 15 are utime, stime.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / per_second)
}

/// Deploys the good job over `input` and measures its rate: committed
/// records per second between 10% and 90% of `events`; also returns how
/// many cores the host used meanwhile.
fn good_rate(host: &ServeHost, acme: &JsonApi, name: &str, events: u64) -> (f64, f64) {
    acme.deploy(
        &local_job(name, &["usage.ndjson"], ""),
        &std::fs::read(plugins::USAGE_BILLING).unwrap(),
    )
    .unwrap();
    let (low, high) = (events / 10, events * 9 / 10);
    let mut first: Option<(Instant, u64, Duration)> = None;
    let mut last = None;
    let pid = host.pid().unwrap();
    wait_for(&format!("`{name}` to read its input"), Duration::from_secs(600), || {
        let status = acme.status(name).unwrap();
        assert_ne!(status["state"], "failed", "{status}\n{}", host.log());
        let records = number(&status, "records");
        let now = Instant::now();
        if records >= low && first.is_none() {
            first = Some((now, records, process_cpu(pid)));
        }
        if records >= high && last.is_none() {
            last = Some((now, records, process_cpu(pid)));
        }
        records >= events
    });
    acme.delete(name).unwrap();
    settle();
    let ((started, from, cpu_from), (ended, to, cpu_to)) = (first.unwrap(), last.unwrap());
    let seconds = ended.duration_since(started).as_secs_f64();
    ((to - from) as f64 / seconds, (cpu_to - cpu_from).as_secs_f64() / seconds)
}

/// Runs `measure` while a client asks for the good tenant's jobs every
/// 20 ms; returns what it returned, and each request's latency.
fn with_prober<T>(host: &ServeHost, measure: impl FnOnce() -> T) -> (T, Vec<Duration>) {
    let stop = Arc::new(AtomicBool::new(false));
    let measured = Arc::new(Mutex::new(Vec::new()));
    let prober = {
        let (stop, measured) = (stop.clone(), measured.clone());
        let client = host.client(ACME);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                client.list().unwrap();
                measured.lock().unwrap().push(started.elapsed());
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let result = measure();
    stop.store(true, Ordering::Relaxed);
    prober.join().unwrap();
    let measured = std::mem::take(&mut *measured.lock().unwrap());
    (result, measured)
}

/// Lets the disk catch up between rounds, so that one round's writeback
/// does not land in the next.
fn settle() {
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    std::thread::sleep(Duration::from_secs(1));
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn percentile(sorted: &[Duration], share: f64) -> Duration {
    sorted[((sorted.len() as f64 * share).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let rounds = env_number("NOISY_ROUNDS", 7);
    let events = env_number("NOISY_EVENTS", 3_000_000);
    let dir = tempfile::tempdir().unwrap();
    let host = ServeHost::start_with(dir.path(), "", "", "max_jobs = 16");
    let (acme, globex) = (host.client(ACME), host.client(GLOBEX));

    let lines = usage_lines(2026, events as usize, 0);
    let text: String = lines.iter().map(|line| format!("{}\n", line.line)).collect();
    std::fs::write(host.inputs("acme").join("usage.ndjson"), text).unwrap();
    for (name, line, _) in NOISY {
        let input: String = std::iter::repeat_n(format!("{line}\n"), 2_000_000).collect();
        std::fs::write(host.inputs("globex").join(format!("{name}.ndjson")), input).unwrap();
    }
    let hostile = std::fs::read(plugins::HOSTILE).unwrap();
    let only = std::env::var("NOISY_ONLY").unwrap_or_default();
    let noisy: Vec<_> =
        NOISY.iter().filter(|(name, _, _)| name.starts_with(only.as_str())).collect();
    println!(
        "noisy neighbour: a billing job of {events} events, {rounds} rounds: alone, beside {} just started, and beside them once demoted (wall clock)",
        noisy.iter().map(|(name, _, _)| *name).collect::<Vec<_>>().join(", ")
    );

    let (mut alone, mut fresh, mut steady, mut latencies) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // The same load of admin requests in each: only the noise differs.
        let ((rate, cores), _) =
            with_prober(&host, || good_rate(&host, &acme, &format!("alone-{round}"), events));
        println!(
            "  round {round}: alone        {rate:>9.0} events/s (the host used {cores:.2} cores)"
        );
        alone.push(rate);

        for (name, _, settings) in &noisy {
            let job = format!(
                "name = {name:?}\noutputs = [\"counts\"]\n[limits]\n{settings}\n[local]\ninputs = [\"{name}.ndjson\"]\n"
            );
            globex.deploy(&job, &hostile).unwrap();
        }
        let noisy_jobs = || globex.list().unwrap().as_array().unwrap().clone();
        wait_for("the noisy jobs to burn CPU", Duration::from_secs(60), || {
            noisy_jobs()
                .iter()
                .filter(|job| job["cpu_seconds"].as_f64().unwrap_or(0.0) > 0.05)
                .count()
                >= noisy.len().min(3)
        });
        for (label, rates) in [("just started", &mut fresh), ("demoted", &mut steady)] {
            if label == "demoted" {
                // A job's first calls run at its tenant's full share; once
                // they fail, it is demoted.
                wait_for("the noisy jobs to be demoted", Duration::from_secs(60), || {
                    noisy_jobs().iter().all(|job| job["demoted"] == true)
                });
            }
            let ((rate, cores), measured) = with_prober(&host, || {
                good_rate(&host, &acme, &format!("beside-{round}-{}", rates.len()), events)
            });
            latencies.extend(measured);
            println!(
                "  round {round}: {label:<12} {rate:>9.0} events/s ({:.2} of alone; the host used {cores:.2} cores)",
                rate / alone[round as usize]
            );
            rates.push(rate);
        }
        for job in noisy_jobs() {
            globex.delete(job["name"].as_str().unwrap()).unwrap();
        }
        settle();
    }
    latencies.sort();
    println!("median alone: {:.0} events/s", median(&mut alone.clone()));
    for (label, rates) in
        [("beside the noisy jobs just started", &fresh), ("beside them demoted", &steady)]
    {
        let mut ratios: Vec<f64> =
            alone.iter().zip(rates.iter()).map(|(alone, beside)| beside / alone).collect();
        println!(
            "median {label}: {:.0} events/s, {:.2} of alone (rounds: {})",
            median(&mut rates.clone()),
            median(&mut ratios.clone()),
            ratios.iter().map(|ratio| format!("{ratio:.2}")).collect::<Vec<_>>().join(", ")
        );
        ratios.clear();
    }
    println!(
        "admin API beside the noisy jobs ({} requests, every 20 ms): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.len(),
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().unwrap().as_secs_f64() * 1e3
    );
    let mut host = host;
    assert!(host.terminate(), "the host stops cleanly");
}
