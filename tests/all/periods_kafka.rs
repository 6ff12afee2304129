//! Billing periods in Kafka mode, against the real broker: the generated
//! input of `tally_tests::periods` on five partitions (partition 4 empty
//! at first) run killed at random moments, then with its state directory
//! wiped and run again over partition 4's records and retries of records
//! it has seen; and with batches of 1 and of 10,000. Every FINAL,
//! ADJUSTMENT and dead letter, read `read_committed`, is compared with the
//! model, which knows nothing of the code under test. Last, two instances
//! of one job: an idle partition closes its month by the watermark the
//! other instance committed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tally_tests::kafka::*;
use tally_tests::periods::{
    Expected, PLUGIN_CONFIG, PeriodInput, PeriodLine, expect, generate, time_zones_table,
};
use tally_tests::*;

use crate::kafka_crash::run_with_kills;
use crate::kafka_restore::run as run_to_end;
use crate::periods::{Record, check_dead_letters, check_facts, counts, first_run};
use crate::plugins::BILLING_PERIODS;

pub(crate) const PARTITIONS: usize = 5;
/// Lines of each of partitions 0 to 2 sent again in the second run.
const RETRIED: usize = 150;

/// The job file of one process of a period job over `job`'s topics (its
/// `totals` topic takes the FINAL and ADJUSTMENT records).
pub(crate) fn write_job_file(
    job: &KafkaBillingJob,
    dir: &Path,
    state: &Path,
    settings: &str,
    periods: &str,
) -> PathBuf {
    let text = format!(
        "name = {name:?}\nplugin = {BILLING_PERIODS:?}\noutputs = [\"periods\"]\n{settings}\n\
         [kafka]\nbrokers = {brokers:?}\ninputs = [{input:?}]\noutputs = {{ periods = {periods_topic:?} }}\n\
         dead_letter_topic = {dead:?}\nstate_dir = {state:?}\n\
         [periods]\nidle_timeout = \"1s\"\n{periods}\n[plugin_config]\n{PLUGIN_CONFIG}\n",
        name = job.name,
        brokers = bootstrap(),
        input = job.input,
        periods_topic = job.totals,
        dead = job.dead_letters,
        state = state.display().to_string(),
    );
    let path = dir.join(format!("{}.toml", state.file_name().unwrap().to_string_lossy()));
    std::fs::write(&path, text).unwrap();
    path
}

/// Produces `lines` (partition, line), keyed by customer.
pub(crate) fn produce(job: &KafkaBillingJob, lines: &[(usize, &PeriodLine)]) {
    let records: Vec<(i32, &str, &str)> = lines
        .iter()
        .map(|(partition, line)| {
            let key = line.facts.as_ref().map_or("", |facts| facts.customer.as_str());
            (*partition as i32, key, line.line.as_str())
        })
        .collect();
    produce_records(&job.input, &records);
}

/// The two runs' input (partition, offset, line), as the model reads it:
/// the first run's every partition; the second, partition 4's lines and the
/// last [`RETRIED`] lines of partitions 0 to 2 sent again.
fn runs(input: &PeriodInput) -> Vec<Vec<(usize, u64, &PeriodLine)>> {
    let first = first_run(input);
    let mut second: Vec<(usize, u64, &PeriodLine)> =
        input.later.iter().enumerate().map(|(o, l)| (PARTITIONS - 1, o as u64, l)).collect();
    for (partition, lines) in input.partitions.iter().enumerate().take(3) {
        let retried = &lines[lines.len() - RETRIED..];
        second.extend(
            retried.iter().enumerate().map(|(n, l)| (partition, (lines.len() + n) as u64, l)),
        );
    }
    vec![first, second]
}

/// Reads the job's FINAL and ADJUSTMENT records and dead letters
/// `read_committed` and compares them with the model; returns the FINALs.
fn check_topics(job: &KafkaBillingJob, expected: &Expected) -> BTreeSet<String> {
    let records: Vec<Record> = read_topic(&job.totals, true)
        .iter()
        .map(|record| Record {
            value: serde_json::from_slice(&record.value).unwrap(),
            idempotency_key: record.header("tally.idempotency-key").to_string(),
        })
        .collect();
    // One customer's periods are on one partition: its records keep
    // their order there.
    let finals = check_facts(&job.name, &records, expected);
    let dead = read_topic(&job.dead_letters, true).into_iter().map(|record| {
        let (_, partition, offset) = record.source();
        (partition as usize, offset as u64, record.header("tally.reason").to_string())
    });
    check_dead_letters(dead, expected);
    finals
}

pub(crate) fn input_checked(seed: u64, per_partition: usize) -> (PeriodInput, Expected) {
    let input = generate(seed, per_partition);
    let expected = expect(&runs(&input));
    let kinds = counts(&expected);
    for kind in ["duplicate", "duplicate_conflict", "too_old", "future", "malformed"] {
        assert!(kinds.get(kind).copied().unwrap_or(0) > 0, "no {kind} dead letter: {kinds:?}");
    }
    (input, expected)
}

pub(crate) fn first_run_lines(input: &PeriodInput) -> Vec<(usize, &PeriodLine)> {
    first_run(input).into_iter().map(|(partition, _, line)| (partition, line)).collect()
}

pub(crate) fn second_run_lines(input: &PeriodInput) -> Vec<(usize, &PeriodLine)> {
    runs(input)[1].iter().map(|&(partition, _, line)| (partition, line)).collect()
}

#[test]
fn kafka_periods_match_the_model_through_kills_and_a_wiped_state_directory() {
    let _serial = serial();
    let seed =
        std::env::var("TALLY_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
                as u64
        });
    println!("Kafka periods crash test seed: {seed} (set TALLY_CRASH_SEED to replay)");
    let mut rng = Rng::new(seed);
    let (input, expected) = input_checked(seed, 8000);
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("periods-crash", PARTITIONS as i32);
    let state = dir.path().join("state");
    let job_file = write_job_file(
        &job,
        dir.path(),
        &state,
        "batch_size = 16\ncommit_interval_ms = 20",
        &format!("time_zones = {}", time_zones_table()),
    );
    produce(&job, &first_run_lines(&input));
    run_with_kills(&job, &job_file, dir.path(), 5, &mut rng);

    // A new machine: the periods, watermarks and seen ids come back from
    // the changelog. No FINAL again, no retry applied twice.
    std::fs::remove_dir_all(state.join("db")).unwrap();
    produce(&job, &second_run_lines(&input));
    run_to_end(&job_file);
    check_topics(&job, &expected);
}

#[test]
fn kafka_periods_match_the_model_with_batches_of_one_and_of_ten_thousand() {
    let _serial = serial();
    let seed = 32;
    let (input, expected) = input_checked(seed, 3000);
    let mut finals = Vec::new();
    for settings in ["batch_size = 1\ncommit_interval_ms = 5", "batch_size = 10000"] {
        let dir = tempfile::tempdir().unwrap();
        let job = KafkaBillingJob::create("periods-batch", PARTITIONS as i32);
        let state = dir.path().join("state");
        let periods = format!("time_zones = {}", time_zones_table());
        let job_file = write_job_file(&job, dir.path(), &state, settings, &periods);
        produce(&job, &first_run_lines(&input));
        run_to_end(&job_file);
        produce(&job, &second_run_lines(&input));
        run_to_end(&job_file);
        finals.push(check_topics(&job, &expected));
    }
    assert_eq!(finals[0], finals[1], "FINAL records do not depend on batch size");
}

/// The last `partitions assigned` line of a run's log, and how many it
/// wrote.
fn assignments(log: &Path) -> (usize, String) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> =
        text.lines().filter(|line| line.contains("partitions assigned")).collect();
    (lines.len(), lines.last().map_or_else(String::new, |line| line.to_string()))
}

#[test]
fn an_idle_partition_closes_its_month_by_the_watermark_another_instance_committed() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("periods-share", 2);
    let files: Vec<PathBuf> = ["one", "two"]
        .iter()
        .map(|name| write_job_file(&job, dir.path(), &dir.path().join(name), "", ""))
        .collect();
    let logs: Vec<PathBuf> =
        ["one", "two"].iter().map(|name| dir.path().join(format!("{name}.log"))).collect();
    let mut children: Vec<_> =
        files.iter().zip(&logs).map(|(file, log)| spawn_run_logging_to(&[], file, log)).collect();
    // Both in the group, one partition each.
    let deadline = Instant::now() + Duration::from_secs(120);
    let one_each = || {
        let [a, b] = [assignments(&logs[0]).1, assignments(&logs[1]).1];
        let one = |line: &str| line.matches(&job.input).count() == 1;
        one(&a) && one(&b) && a.contains(", 0)") != b.contains(", 0)")
    };
    while !one_each() {
        assert!(Instant::now() < deadline, "the instances never shared the partitions");
        for child in &mut children {
            assert!(child.try_wait().unwrap().is_none(), "an instance stopped");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let assigned = [assignments(&logs[0]).0, assignments(&logs[1]).0];

    // Partition 0 stops in September; partition 1 goes on to 15 October.
    let line = |id: &str, customer: &str, ts: &str, quantity: u64| {
        format!(
            r#"{{"id":"{id}","customer":"{customer}","metric":"calls","quantity":{quantity},"ts":"{ts}"}}"#
        )
    };
    let zero = [
        line("a1", "alpha", "2026-09-03T10:00:00Z", 1),
        line("a2", "alpha", "2026-09-10T10:00:00Z", 2),
        line("a3", "alpha", "2026-09-20T10:00:00Z", 3),
    ];
    let one = [
        line("b1", "beta", "2026-09-05T10:00:00Z", 40),
        line("b2", "beta", "2026-10-15T10:00:00Z", 500),
    ];
    let mut records: Vec<(i32, &str, &str)> =
        zero.iter().map(|text| (0, "alpha", text.as_str())).collect();
    records.extend(one.iter().map(|text| (1, "beta", text.as_str())));
    produce_records(&job.input, &records);

    let finals = |records: &[OutputRecord]| -> Vec<(String, u64, i32)> {
        records
            .iter()
            .map(|record| {
                let value: Value = serde_json::from_slice(&record.value).unwrap();
                assert_eq!(value["type"], "final", "{value}");
                assert_eq!(value["period"], "2026-09", "{value}");
                (
                    value["customer"].as_str().unwrap().to_string(),
                    value["value"].as_u64().unwrap(),
                    record.source().1,
                )
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while finals(&read_topic(&job.totals, true)).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "alpha's September never closed:\n{}\n{}",
            std::fs::read_to_string(&logs[0]).unwrap_or_default(),
            std::fs::read_to_string(&logs[1]).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Idle a while longer: nothing more closes, nothing twice.
    std::thread::sleep(Duration::from_secs(3));
    for child in &mut children {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let mut got = finals(&read_topic(&job.totals, true));
    got.sort();
    assert_eq!(got, vec![("alpha".to_string(), 6, 0), ("beta".to_string(), 40, 1)]);
    assert_eq!(
        [assignments(&logs[0]).0, assignments(&logs[1]).0],
        assigned,
        "no rebalance: each instance knew the other's partition only through the broker"
    );
}

#[test]
fn a_period_job_at_least_once_is_refused_naming_why() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("periods-alo", 1);
    let path = write_job_file(&job, dir.path(), &dir.path().join("state"), "", "");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("[periods]", "guarantee = \"at_least_once\"\n[periods]"))
        .unwrap();
    let output = Command::new(tally_binary())
        .args(["run", "--until-caught-up"])
        .arg(&path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        said.contains("[periods] with guarantee = \"at_least_once\"")
            && said.contains("exactly_once"),
        "{said}"
    );
}
