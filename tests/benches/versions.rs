//! Output versions, measured (issue 34), wall clock, medians over rounds:
//!
//! 1. `tally replay` of a period job from earliest into v2 beside `tally
//!    run` of the live version, the same input (the `tally` binary, one
//!    process at a time, alternating): events per second of each.
//! 2. A served period job (`tally serve`, two cores) taking in the same
//!    input alone, then again (a new job, the same input) with a shadow of
//!    the same plugin started beside it: the live job's events per second
//!    in both (target: with a shadow ≥ 0.9× alone), and the shadow's, from
//!    the input's start.
//!
//! `cargo bench -p tally-tests --bench versions` (`scripts/bench-versions`);
//! TALLY_BENCH_EVENTS (default 300000) and TALLY_BENCH_ROUNDS (default 3)
//! change the size.

use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;
use tally_tests::serve::{ACME, JsonApi, ServeHost};
use tally_tests::{
    env_or, tally_binary, usage_lines, with_event_ids, write_partitions_by_customer,
};

#[allow(dead_code)] // the benchmark uses one of the plugins
mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

const METERS: &str =
    r#"meters = { api_calls = "sum", storage_gb_hours = "sum", egress_mb = "sum" }"#;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

fn tally(args: &[&str]) -> Duration {
    let started = Instant::now();
    let output = Command::new(tally_binary()).args(args).output().unwrap();
    assert!(output.status.success(), "tally {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    started.elapsed()
}

/// Waits until `records_of(status)` reaches `events` with no lag left;
/// the time it took from `started`.
fn caught_up(
    api: &JsonApi,
    job: &str,
    events: u64,
    started: Instant,
    records_of: impl Fn(&Value) -> &Value,
) -> Duration {
    loop {
        let status = api.status(job).unwrap();
        let part = records_of(&status);
        assert_ne!(part["state"], "failed", "{status}");
        if part["records"].as_u64().unwrap_or(0) >= events && part["lag"].as_u64() == Some(0) {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(900), "{job} never caught up: {status}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let events = env_or("TALLY_BENCH_EVENTS", 300_000);
    let rounds = env_or("TALLY_BENCH_ROUNDS", 3);
    let dir = tempfile::tempdir().unwrap();
    let lines = with_event_ids(usage_lines(2026, events, 0));

    // 1. The CLI: a run of the live version, then a replay into v2.
    let cli = dir.path().join("cli");
    std::fs::create_dir_all(&cli).unwrap();
    let inputs = write_partitions_by_customer(&cli, &lines, 4);
    let quoted: Vec<String> =
        inputs.iter().map(|path| format!("{:?}", path.display().to_string())).collect();
    println!(
        "{events} events with ids in 4 files, a period job (three sum meters), {rounds} rounds"
    );
    let (mut live, mut replay) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let run = cli.join(format!("round-{round}"));
        std::fs::create_dir_all(&run).unwrap();
        let job = run.join("billing.toml");
        std::fs::write(
            &job,
            format!(
                "name = \"billing\"\nplugin = {:?}\noutputs = [\"periods\"]\n[local]\ninputs = [{}]\n\
                 output_dir = {:?}\nstate_dir = {:?}\n[periods]\n[plugin_config]\n{METERS}\n",
                plugins::BILLING_PERIODS,
                quoted.join(", "),
                run.join("out").display().to_string(),
                run.join("state").display().to_string(),
            ),
        )
        .unwrap();
        let job = job.to_str().unwrap();
        let run_time = tally(&["run", job]);
        let replay_time = tally(&["replay", job, "--version", "v2", "--from", "earliest"]);
        let (a, b) =
            (events as f64 / run_time.as_secs_f64(), events as f64 / replay_time.as_secs_f64());
        println!(
            "  round {round} CLI: run {a:>9.0} events/s, replay into v2 {b:>9.0} events/s ({:.2}x)",
            b / a
        );
        live.push(a);
        replay.push(b);
        std::fs::remove_dir_all(&run).ok();
    }
    let paired = median(replay.iter().zip(&live).map(|(r, l)| r / l).collect());
    let (live, replay) = (median(live), median(replay));
    println!(
        "median CLI: run {live:.0} events/s, replay {replay:.0} events/s, replay/run = {:.2} (median of per-round ratios {paired:.2})",
        replay / live
    );

    // 2. A served job alone, then with a shadow beside it.
    let host = ServeHost::start_with(
        dir.path(),
        "",
        "max_jobs = 10\nmax_total_memory_bytes = 8589934592\n",
        "",
    );
    let inputs = write_partitions_by_customer(&host.inputs("acme"), &lines, 4);
    let names: Vec<String> = inputs
        .iter()
        .map(|path| format!("{:?}", path.file_name().unwrap().to_string_lossy()))
        .collect();
    let component = std::fs::read(plugins::BILLING_PERIODS).unwrap();
    let shadow_body = serde_json::json!({
        "plugin": base64::engine::general_purpose::STANDARD.encode(&component),
    })
    .to_string();
    let acme = host.client(ACME);
    // The first deploy compiles the plugin; the rounds find it compiled.
    let warm_up = format!(
        "name = \"warm-up\"\noutputs = [\"periods\"]\n[local]\ninputs = [{}]\n[periods]\n[plugin_config]\n{METERS}\n",
        names[0]
    );
    acme.deploy(&warm_up, &component).unwrap();
    acme.delete("warm-up").unwrap();
    let (mut alone, mut beside, mut shadow_rates) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        for shadowed in [false, true] {
            let name = format!("{}-{round}", if shadowed { "shadowed" } else { "alone" });
            let job = format!(
                "name = {name:?}\noutputs = [\"periods\"]\n[local]\ninputs = [{}]\n[periods]\n[plugin_config]\n{METERS}\n",
                names.join(", ")
            );
            let started = Instant::now();
            acme.deploy(&job, &component).unwrap();
            if shadowed {
                acme.request(
                    "POST",
                    &format!("/v1/jobs/{name}/shadow"),
                    Some(("application/json", shadow_body.clone().into_bytes())),
                )
                .unwrap();
            }
            let took = caught_up(&acme, &name, events as u64, started, |status| status);
            let rate = events as f64 / took.as_secs_f64();
            if shadowed {
                let shadow_took =
                    caught_up(&acme, &name, events as u64, started, |status| &status["shadow"]);
                let shadow_rate = events as f64 / shadow_took.as_secs_f64();
                println!(
                    "  round {round} served: live with a shadow {rate:>9.0} events/s, the shadow {shadow_rate:>9.0} events/s"
                );
                beside.push(rate);
                shadow_rates.push(shadow_rate);
            } else {
                println!("  round {round} served: live alone       {rate:>9.0} events/s");
                alone.push(rate);
            }
            acme.delete(&name).unwrap();
        }
    }
    let paired = median(beside.iter().zip(&alone).map(|(b, a)| b / a).collect());
    let (alone, beside, shadow) = (median(alone), median(beside), median(shadow_rates));
    println!(
        "median served: live alone {alone:.0} events/s, live with a shadow {beside:.0} events/s ({:.2}x; median of per-round ratios {paired:.2}; target >= 0.9), the shadow {shadow:.0} events/s ({:.2}x of live alone)",
        beside / alone,
        shadow / alone
    );
}
