//! A hostile tenant cannot hurt the host or another tenant (invariant 8
//! of `docs/architecture.md`): misbehaving plugins beside a neighbour's billing job, and
//! a looping plugin stopped by pause, delete and SIGTERM. Each case checks
//! the promise: the host is up and answers, the neighbour's totals are
//! exact, only the culprit is dead-lettered with a reason naming the limit
//! and its value, the bad job's status says what happened, and nothing
//! committed changes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use tally_tests::serve::{ACME, GLOBEX, JsonApi, ServeHost, local_job, number, wait_for};
use tally_tests::usage_lines;

use crate::plugins;
use crate::serve::{check_local_totals, plugin, wait_caught_up, write_input};

/// One line of a hostile job's input: key `k`, and what to do.
fn command(key: &str, action: &str, n: u64) -> String {
    serde_json::json!({ "k": key, "do": action, "n": n }).to_string()
}

fn good(key: &str) -> String {
    command(key, "", 0)
}

/// A hostile job: its input lines, extra job settings, and which lines
/// must be dead-lettered with a reason containing every one of `reason`.
struct Case {
    name: &'static str,
    lines: Vec<String>,
    settings: &'static str,
    culprits: Vec<u64>,
    reason: &'static [&'static str],
}

/// `count` good lines on keys `a`..`e`, with `culprit` (a command) at the given offsets.
fn lines_with(count: u64, culprits: &[u64], culprit: &str) -> Vec<String> {
    (0..count)
        .map(|offset| {
            if culprits.contains(&offset) {
                culprit.to_string()
            } else {
                good(["a", "b", "c", "d", "e"][offset as usize % 5])
            }
        })
        .collect()
}

fn case(
    name: &'static str,
    count: u64,
    culprits: &[u64],
    culprit: String,
    settings: &'static str,
    reason: &'static [&'static str],
) -> Case {
    Case {
        name,
        lines: lines_with(count, culprits, &culprit),
        settings,
        culprits: culprits.to_vec(),
        reason,
    }
}

/// The counts a job's `counts` output must end with: one per good line, per key.
fn expected_counts(case: &Case) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for (offset, line) in case.lines.iter().enumerate() {
        if case.culprits.contains(&(offset as u64)) {
            continue;
        }
        let command: Value = serde_json::from_str(line).unwrap();
        *counts.entry(command["k"].as_str().unwrap().to_string()).or_insert(0) += 1;
    }
    counts
}

/// The `counts` output of `tenant`'s job: (offset, key, count) per line.
fn read_counts(host: &ServeHost, tenant: &str, job: &str) -> Vec<(u64, String, u64)> {
    let text = std::fs::read_to_string(host.output(tenant, job, "counts")).unwrap_or_default();
    text.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            let key = v["key"].as_str().map(str::to_string).unwrap_or_default();
            let count = v["value"]
                .as_u64()
                .unwrap_or_else(|| panic!("`{job}` emitted a count that is not a number: {line}"));
            (v["source"]["offset"].as_u64().unwrap(), key, count)
        })
        .collect()
}

fn counts_job(name: &str, input: &str, settings: &str) -> String {
    format!("name = {name:?}\noutputs = [\"counts\"]\n{settings}\n[local]\ninputs = [{input:?}]\n")
}

#[test]
fn hostile_plugins_cannot_hurt_the_host_the_neighbour_or_what_was_committed() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = ServeHost::start_with(dir.path(), "", "", "");
    let acme = host.client(ACME);
    let globex = host.client(GLOBEX);

    // The neighbour: another tenant's billing job.
    let billing = usage_lines(51, 40_000, 5);
    write_input(&host, "globex", "usage.ndjson", &billing);
    globex
        .deploy(&local_job("billing", &["usage.ndjson"], ""), &plugin(plugins::USAGE_BILLING))
        .unwrap();

    let every_100th: Vec<u64> = (0..1000).filter(|offset| offset % 100 == 99).collect();
    let cases = vec![
        case(
            "loop",
            41,
            &[20],
            command("a", "loop", 0),
            "[limits]\ncpu_budget_ms = 200",
            &["CPU budget", "limits.cpu_budget_ms = 200"],
        ),
        case(
            "memory-bomb",
            30,
            &[10],
            command("a", "hog", 0),
            "[limits]\nmemory_bytes = 16777216",
            &["memory limit of 16 MiB", "limits.memory_bytes = 16777216"],
        ),
        case("recursion", 30, &[5], command("a", "recurse", 0), "", &["call stack exhausted"]),
        case(
            "emit-flood",
            30,
            &[7],
            command("a", "emit-flood", 0),
            "[limits]\nmax_output_bytes_per_batch = 1048576",
            &["limits.max_output_bytes_per_batch", "1048576"],
        ),
        case(
            "over-limit-event",
            30,
            &[12],
            command("a", "emit", 2_000_000),
            "[limits]\nmax_output_bytes_per_batch = 1048576",
            &["limits.max_output_bytes_per_batch", "1048576"],
        ),
        case(
            "state-flood",
            30,
            &[3],
            command("a", "state-flood", 0),
            "[limits]\nmax_state_bytes_per_batch = 1048576",
            &["limits.max_state_bytes_per_batch", "1048576"],
        ),
        case(
            "delete-flood",
            30,
            &[4],
            command("a", "delete-flood", 0),
            "[limits]\nmax_state_bytes_per_batch = 1048576",
            &["limits.max_state_bytes_per_batch", "1048576"],
        ),
        case(
            "get-many",
            30,
            &[6],
            command("a", "get-amplify", 1_000_000),
            "",
            &["memory limit of 67108864 bytes", "limits.memory_bytes"],
        ),
        case(
            "trap-every-100th",
            1000,
            &every_100th,
            command("a", "panic", 0),
            "",
            &["plugin trapped", "asked to panic on key a"],
        ),
        case("log-flood", 30, &[], String::new(), "", &[]),
        case(
            "near-budget",
            200,
            &[],
            String::new(),
            "batch_size = 20\n[limits]\ncpu_budget_ms = 1000",
            &[],
        ),
    ];
    let mut cases = cases;
    // Lines of their own for the cases that are not "good lines and culprits".
    cases[9].lines[2] = command("c", "log-flood", 5_000);
    for line in &mut cases[10].lines {
        let key: Value = serde_json::from_str(line).unwrap();
        *line = command(key["k"].as_str().unwrap(), "spin", 300_000);
    }
    for case in &cases {
        std::fs::write(
            host.inputs("acme").join(format!("{}.ndjson", case.name)),
            case.lines.join("\n") + "\n",
        )
        .unwrap();
        acme.deploy(
            &counts_job(case.name, &format!("{}.ndjson", case.name), case.settings),
            &plugin(plugins::HOSTILE),
        )
        .unwrap_or_else(|err| panic!("deploying `{}`: {err}", case.name));
    }
    // A raw plugin that writes state and emits, then rejects: the host
    // undoes both, whatever the plugin wrote.
    let rejecting: Vec<String> = (0..8)
        .map(
            |offset| if offset % 2 == 0 { command("w", "write-then-reject", 0) } else { good("w") },
        )
        .collect();
    std::fs::write(host.inputs("acme").join("rejects.ndjson"), rejecting.join("\n") + "\n")
        .unwrap();
    acme.deploy(&counts_job("write-then-reject", "rejects.ndjson", ""), &plugin(plugins::HOSTILE))
        .unwrap();
    // Every event loops: the job's batch is bounded by its budget, not by
    // its size times the budget, and the job is paused, saying why.
    let looping: Vec<String> = (0..300).map(|_| command("z", "loop", 0)).collect();
    std::fs::write(host.inputs("acme").join("all-loop.ndjson"), looping.join("\n") + "\n").unwrap();
    acme.deploy(
        &counts_job("all-loop", "all-loop.ndjson", "[limits]\ncpu_budget_ms = 100"),
        &plugin(plugins::HOSTILE),
    )
    .unwrap();

    // Meanwhile the API answers every request.
    let mut answered = 0;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        assert!(
            Instant::now() < deadline,
            "the hostile jobs did not finish:\n{}\n{}",
            acme.list().unwrap(),
            host.log()
        );
        globex
            .list()
            .unwrap_or_else(|err| panic!("the API stopped answering the neighbour: {err}"));
        let jobs = acme.list().unwrap();
        answered += 2;
        let done = cases
            .iter()
            .map(|case| (case.name, case.lines.len() as u64))
            .chain([("write-then-reject", 8)])
            .all(|(name, lines)| {
                let job = jobs.as_array().unwrap().iter().find(|job| job["name"] == name).unwrap();
                assert_ne!(job["state"], "failed", "`{name}` failed: {job}\n{}", host.log());
                number(job, "records") >= lines && job["lag"].as_u64() == Some(0)
            });
        let paused = jobs
            .as_array()
            .unwrap()
            .iter()
            .any(|job| job["name"] == "all-loop" && job["state"] == "paused");
        if done && paused {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(answered > 2);
    wait_caught_up(&globex, "billing", billing.len() as u64, &host);
    check_local_totals(&host, "globex", "billing", &billing);

    for case in &cases {
        let dead = tally_tests::read_dead_letters(&host.output("acme", case.name, "dead-letters"));
        let offsets: Vec<u64> = dead.iter().map(|(_, offset, _)| *offset).collect();
        assert_eq!(
            offsets, case.culprits,
            "`{}`: only the culprits are dead-lettered: {dead:?}",
            case.name
        );
        for (_, _, reason) in &dead {
            for expected in case.reason {
                assert!(
                    reason.contains(expected),
                    "`{}`: the reason names {expected:?}: {reason}",
                    case.name
                );
            }
        }
        let counts = read_counts(&host, "acme", case.name);
        assert_eq!(
            counts.len() as u64,
            case.lines.len() as u64 - case.culprits.len() as u64,
            "`{}`: one count per good line",
            case.name
        );
        let last: BTreeMap<String, u64> =
            counts.iter().map(|(_, key, count)| (key.clone(), *count)).collect();
        assert_eq!(
            last,
            expected_counts(case),
            "`{}`: every good line counted exactly once",
            case.name
        );
        let status = acme.status(case.name).unwrap();
        assert!(
            number(&status, "traps") >= case.culprits.len() as u64,
            "`{}`: status counts the traps: {status}",
            case.name
        );
        if !case.culprits.is_empty() {
            let failure = status["last_plugin_failure"].as_str().unwrap_or_default();
            assert!(
                case.reason.iter().all(|expected| failure.contains(expected)),
                "`{}`: status says what happened: {status}",
                case.name
            );
        }
    }
    let loop_status = acme.status("loop").unwrap();
    assert!(
        number(&loop_status, "cpu_budget_breaches") >= 2
            && loop_status["cpu_seconds"].as_f64().unwrap() > 0.2,
        "{loop_status}"
    );
    let near = acme.status("near-budget").unwrap();
    assert_eq!(number(&near, "traps"), 0, "a plugin within its budget is never stopped: {near}");
    assert!(near["cpu_seconds"].as_f64().unwrap() > 0.0, "{near}");

    // The forged lines stay inside escaped plugin lines, tagged with the job.
    let log_status = acme.status("log-flood").unwrap();
    assert!(
        number(&log_status, "log_lines_dropped") > 4_000,
        "the log flood was cut to the job's rate: {log_status}"
    );
    let log = host.log();
    assert!(
        !log.lines().any(|line| line.starts_with("2026-12-01T00:00:00.000000Z")),
        "no plugin line forged a host line"
    );
    let plugin_lines: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("tally::plugin") && line.contains("line "))
        .collect();
    assert!(
        !plugin_lines.is_empty() && plugin_lines.len() < 1_000,
        "{} plugin lines of 5,000 logged",
        plugin_lines.len()
    );
    assert!(
        plugin_lines.iter().all(|line| line.contains("acme")
            && line.contains("log-flood")
            && line.contains("\\n2026")),
        "{:?}",
        &plugin_lines[..1]
    );

    // Writes of rejected events were undone.
    let counts = read_counts(&host, "acme", "write-then-reject");
    assert_eq!(
        counts.iter().map(|(_, _, count)| *count).collect::<Vec<_>>(),
        [1, 2, 3, 4],
        "no 999999 of a rejected event: {counts:?}"
    );
    let dead =
        tally_tests::read_dead_letters(&host.output("acme", "write-then-reject", "dead-letters"));
    assert_eq!(
        dead.iter().map(|(_, offset, reason)| (*offset, reason.as_str())).collect::<Vec<_>>(),
        [
            (0, "rejected after writing"),
            (2, "rejected after writing"),
            (4, "rejected after writing"),
            (6, "rejected after writing")
        ]
    );

    // The all-looping job: paused with the reason, having cost a bounded
    // amount of CPU, and with nothing committed.
    let all_loop = acme.status("all-loop").unwrap();
    let error = all_loop["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("failed on 100 events in a row (limits.max_failures_in_a_row = 100)")
            && error.contains("paused"),
        "{all_loop}"
    );
    assert!(
        all_loop["cpu_seconds"].as_f64().unwrap() < 30.0,
        "a batch's CPU is bounded by its budget, not its size times it: {all_loop}"
    );
    assert!(
        read_counts(&host, "acme", "all-loop").is_empty()
            && tally_tests::read_dead_letters(&host.output("acme", "all-loop", "dead-letters"))
                .is_empty()
    );

    assert!(host.is_running(), "the host is up");
    assert!(host.terminate(), "SIGTERM stops the host cleanly:\n{}", host.log());
}

/// A job whose plugin loops on every event, with a long budget: a batch
/// would hold it for many seconds without the host stopping it mid-call.
fn deploy_looping(host: &ServeHost, client: &JsonApi, name: &str) {
    let lines: Vec<String> = (0..50).map(|_| command("z", "loop", 0)).collect();
    std::fs::write(host.inputs("acme").join(format!("{name}.ndjson")), lines.join("\n") + "\n")
        .unwrap();
    let settings = "[limits]\ncpu_budget_ms = 10000\nmax_failures_in_a_row = 1000";
    client
        .deploy(&counts_job(name, &format!("{name}.ndjson"), settings), &plugin(plugins::HOSTILE))
        .unwrap();
    wait_for(&format!("`{name}` to be inside its looping plugin"), Duration::from_secs(60), || {
        client.status(name).unwrap()["cpu_seconds"].as_f64().unwrap_or(0.0) > 0.3
    });
}

#[test]
fn a_looping_plugin_is_stopped_by_pause_delete_and_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = ServeHost::start_with(dir.path(), "", "", "");
    let acme = host.client(ACME);
    deploy_looping(&host, &acme, "spinner");

    // Pause takes effect inside the call: the job stops burning CPU.
    let asked = Instant::now();
    acme.pause("spinner").unwrap();
    wait_for("the looping job to pause", Duration::from_secs(5), || {
        acme.status("spinner").unwrap()["state"] == "paused"
    });
    let paused_after = asked.elapsed();
    let cpu = acme.status("spinner").unwrap()["cpu_seconds"].as_f64().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let later = acme.status("spinner").unwrap()["cpu_seconds"].as_f64().unwrap();
    assert!(
        later - cpu < 0.05,
        "a paused job uses no CPU ({cpu} s, then {later} s; paused after {paused_after:?})"
    );

    // Resumed, it loops again; a delete stops it mid-call and answers.
    acme.resume("spinner").unwrap();
    wait_for("the job to loop again", Duration::from_secs(30), || {
        acme.status("spinner").unwrap()["cpu_seconds"].as_f64().unwrap() > later + 0.3
    });
    acme.delete("spinner")
        .unwrap_or_else(|err| panic!("the delete of a looping job answers at once: {err}"));
    assert!(acme.list().unwrap().as_array().unwrap().is_empty());
    assert!(!host.dir.join("data/jobs/acme/spinner").exists(), "its files are gone");

    // SIGTERM stops the host, looping job and all.
    deploy_looping(&host, &acme, "spinner-2");
    assert!(
        host.terminate_within(Duration::from_secs(10)),
        "SIGTERM stops a host whose plugin loops:\n{}",
        host.log()
    );
}

/// Resident memory of process `pid`, in bytes.
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap();
    kib << 10
}

#[test]
fn a_record_over_the_limit_in_a_followed_input_is_dead_lettered_and_not_held() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = ServeHost::start_with(dir.path(), "", "", "");
    let acme = host.client(ACME);
    let input = host.inputs("acme").join("long.ndjson");
    std::fs::write(&input, format!("{}\n{}\n", good("a"), good("b"))).unwrap();
    acme.deploy(&counts_job("long-lines", "long.ndjson", ""), &plugin(plugins::HOSTILE)).unwrap();
    wait_for("the first lines to commit", Duration::from_secs(60), || {
        number(&acme.status("long-lines").unwrap(), "records") >= 2
    });
    let before = resident_bytes(host.pid().unwrap());
    // 200 MB of one line, still being written: read past, not held, not read again.
    let mut file = std::fs::OpenOptions::new().append(true).open(&input).unwrap();
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..200 {
        std::io::Write::write_all(&mut file, &chunk).unwrap();
    }
    std::thread::sleep(Duration::from_secs(2));
    let status = acme.status("long-lines").unwrap();
    assert_eq!(
        (status["state"].as_str(), number(&status, "records")),
        (Some("running"), 2),
        "{status}"
    );
    let during = resident_bytes(host.pid().unwrap());
    assert!(
        during < before + (64 << 20),
        "the host holds no copy of the long line: {before} bytes resident before, {during} during"
    );
    std::io::Write::write_all(&mut file, format!("\n{}\n", good("a")).as_bytes()).unwrap();
    wait_for("the rest to commit", Duration::from_secs(60), || {
        number(&acme.status("long-lines").unwrap(), "records") >= 4
    });
    let dead = tally_tests::read_dead_letters(&host.output("acme", "long-lines", "dead-letters"));
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].1, 2);
    assert!(
        dead[0].2.contains("209715200 bytes")
            && dead[0].2.contains("limits.max_record_bytes")
            && dead[0].2.contains("1048576"),
        "{dead:?}"
    );
    let counts = read_counts(&host, "acme", "long-lines");
    assert_eq!(
        counts
            .iter()
            .map(|(offset, key, count)| (*offset, key.as_str(), *count))
            .collect::<Vec<_>>(),
        [(0, "a", 1), (1, "b", 1), (3, "a", 2)]
    );
    assert!(host.terminate());
}
