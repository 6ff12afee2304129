//! Billing periods end to end, in local mode: generated input across time
//! zones (DST starts and ends, a 30-minute DST, a skipped midnight,
//! quarter- and half-hour offsets), month and year edges, retries before
//! and after their period closed, conflicting retries, late, too-old,
//! future and malformed events, a partition that goes idle and must close
//! its months, and one empty from the start that receives records later.
//! Run with batches of 1 and of 10,000, and killed at random moments;
//! every FINAL, ADJUSTMENT and dead letter is compared with the model in
//! `tally_tests::periods`, which knows nothing of the code under test.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tally_tests::periods::{
    Expected, PLUGIN_CONFIG, PeriodId, PeriodInput, PeriodLine, expect, generate, rfc3339,
    time_zones_table,
};
use tally_tests::*;

use crate::plugins::{BILLING_PERIODS, BILLING_PERIODS_PYTHON};

pub(crate) const PARTITIONS: usize = 5;

/// Writes the input files (partition 4 empty) and the job file.
pub(crate) fn write_job(dir: &Path, input: &PeriodInput, settings: &str) -> PathBuf {
    write_job_of(BILLING_PERIODS, dir, input, settings)
}

/// [`write_job`] with the period plugin at `plugin`.
fn write_job_of(plugin: &str, dir: &Path, input: &PeriodInput, settings: &str) -> PathBuf {
    let mut inputs = Vec::new();
    for partition in 0..PARTITIONS {
        let path = dir.join(format!("usage-{partition}.ndjson"));
        let mut text = String::new();
        for line in input.partitions[partition].iter() {
            text.push_str(&line.line);
            text.push('\n');
        }
        std::fs::write(&path, text).unwrap();
        inputs.push(format!("{:?}", path.display().to_string()));
    }
    let job = format!(
        "name = \"billing\"\nplugin = {plugin:?}\noutputs = [\"periods\"]\n{settings}\n\
         [local]\ninputs = [{}]\noutput_dir = \"out\"\nstate_dir = \"state\"\n\
         [periods]\ntime_zones = {}\n[plugin_config]\n{PLUGIN_CONFIG}\n",
        inputs.join(", "),
        time_zones_table()
    );
    let path = dir.join("billing.toml");
    std::fs::write(&path, job).unwrap();
    path
}

/// Partition 4 receives its lines.
pub(crate) fn append_later(dir: &Path, input: &PeriodInput) {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join(format!("usage-{}.ndjson", PARTITIONS - 1)))
        .unwrap();
    for line in &input.later {
        writeln!(file, "{}", line.line).unwrap();
    }
}

/// The two runs' input, as the model reads it.
pub(crate) fn runs(input: &PeriodInput) -> Vec<Vec<(usize, u64, &PeriodLine)>> {
    let second =
        input.later.iter().enumerate().map(|(o, l)| (PARTITIONS - 1, o as u64, l)).collect();
    vec![first_run(input), second]
}

/// The first run's input (partition, offset, line): every partition's lines.
pub(crate) fn first_run(input: &PeriodInput) -> Vec<(usize, u64, &PeriodLine)> {
    input
        .partitions
        .iter()
        .enumerate()
        .flat_map(|(p, lines)| lines.iter().enumerate().map(move |(o, l)| (p, o as u64, l)))
        .collect()
}

pub(crate) fn run_to_end(job: &Path) {
    let output = Command::new(tally_binary()).arg("run").arg(job).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// One FINAL or ADJUSTMENT as read from the output.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) value: Value,
    pub(crate) idempotency_key: String,
}

pub(crate) fn read_records_at(path: &Path) -> Vec<Record> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| {
            let line: Value = serde_json::from_str(line).unwrap();
            Record {
                value: line["value"].clone(),
                idempotency_key: line["idempotency_key"].as_str().unwrap().to_string(),
            }
        })
        .collect()
}

fn seconds(text: &str) -> i64 {
    let t = tally_tests::periods::utc(&text[..19]);
    assert!(text.ends_with('Z') && text.len() == 20, "a period bound is a UTC second: {text}");
    t
}

/// Compares the output with the model: one FINAL per closed period with
/// its value, a chain of ADJUSTMENTs settling at its last value, nothing
/// for periods still open, and exactly the dead letters it expects.
/// Returns the FINAL records' texts (for comparing runs).
fn check(dir: &Path, expected: &Expected) -> BTreeSet<String> {
    check_files(
        "billing",
        &dir.join("out/periods.ndjson"),
        &dir.join("out/dead-letters.ndjson"),
        expected,
    )
}

/// [`check`] of job `job`'s output files `periods` and `dead_letters`.
pub(crate) fn check_files(
    job: &str,
    periods: &Path,
    dead_letters: &Path,
    expected: &Expected,
) -> BTreeSet<String> {
    let finals = check_facts(job, &read_records_at(periods), expected);
    let dead = read_dead_letters(dead_letters).into_iter().map(|(file, offset, reason)| {
        let partition: usize =
            file.trim_start_matches("usage-").trim_end_matches(".ndjson").parse().unwrap();
        (partition, offset, reason)
    });
    check_dead_letters(dead, expected);
    finals
}

/// Compares FINAL and ADJUSTMENT records of job `job`, in the order they
/// were written, with the model; returns the FINAL records' texts (with
/// their idempotency keys, the job's name taken off).
pub(crate) fn check_facts(job: &str, records: &[Record], expected: &Expected) -> BTreeSet<String> {
    let mut chains: BTreeMap<PeriodId, Vec<&Record>> = BTreeMap::new();
    let mut keys = BTreeSet::new();
    for record in records {
        assert!(
            keys.insert(record.idempotency_key.clone()),
            "idempotency key {} twice",
            record.idempotency_key
        );
        let v = &record.value;
        let id: PeriodId = (
            seconds(v["end"].as_str().unwrap()),
            v["customer"].as_str().unwrap().to_string(),
            v["metric"].as_str().unwrap().to_string(),
            v["period"].as_str().unwrap().to_string(),
        );
        chains.entry(id).or_default().push(record);
    }
    let tzdata = tally_periods_version();
    let mut finals = BTreeSet::new();
    for (id, chain) in &chains {
        let Some(period) = expected.finals.get(id) else {
            panic!("{id:?} got records but the model never closes it: {chain:?}")
        };
        let first = &chain[0].value;
        assert_eq!(first["type"], "final", "{id:?} starts with its FINAL: {chain:?}");
        assert_eq!(first["version"], 1, "{id:?}");
        assert_eq!(first["value"].as_u64(), Some(period.final_value), "{id:?}'s FINAL value");
        assert_eq!(first["start"].as_str(), Some(rfc3339(period.start, 0).as_str()), "{id:?}");
        assert_eq!(first["time_zone"].as_str(), Some(period.zone), "{id:?}");
        assert_eq!(first["tzdata"].as_str(), Some(tzdata.as_str()));
        assert_eq!(
            chain[0].idempotency_key,
            format!(
                "{job}/customer={}/metric={}/period={}/zone={}/v1",
                id.1,
                id.2,
                id.3,
                period.zone.replace('/', "%2F")
            )
        );
        let key = &chain[0].idempotency_key[job.len()..];
        finals.insert(serde_json::to_string(first).unwrap() + key);
        for (n, pair) in chain.windows(2).enumerate() {
            let (before, after) = (&pair[0].value, &pair[1].value);
            assert_eq!(after["type"], "adjustment", "{id:?}: one FINAL, then ADJUSTMENTs");
            assert_eq!(after["version"].as_u64(), Some(n as u64 + 2), "{id:?}: {chain:?}");
            assert_eq!(after["previous"], before["value"], "{id:?}");
            let delta = after["value"].as_i64().unwrap() - before["value"].as_i64().unwrap();
            assert_eq!(after["delta"].as_i64(), Some(delta), "{id:?}");
            assert_ne!(delta, 0, "{id:?}: an ADJUSTMENT changes the value");
        }
        let last = &chain.last().unwrap().value;
        assert_eq!(last["value"].as_u64(), Some(period.settled_value), "{id:?} settles");
    }
    for id in expected.finals.keys() {
        assert!(chains.contains_key(id), "{id:?} never got its FINAL");
    }
    finals
}

/// Compares dead letters (partition, offset, reason) with the model's, by
/// line and kind: each once.
pub(crate) fn check_dead_letters(
    dead_letters: impl IntoIterator<Item = (usize, u64, String)>,
    expected: &Expected,
) {
    let mut dead = BTreeMap::new();
    for (partition, offset, reason) in dead_letters {
        let kind = reason.split(':').next().unwrap().to_string();
        assert!(
            dead.insert((partition, offset), kind).is_none(),
            "line {offset} of partition {partition} dead-lettered twice"
        );
    }
    assert_eq!(dead, expected.dead_letters, "the dead letters, by line and kind");
}

/// The release of the tz database the host builds in, which every record
/// must carry.
fn tally_periods_version() -> String {
    tally_periods::time_zone_database().to_string()
}

pub(crate) fn counts(expected: &Expected) -> BTreeMap<&str, usize> {
    let mut counts = BTreeMap::new();
    for kind in expected.dead_letters.values() {
        *counts.entry(kind.as_str()).or_default() += 1;
    }
    counts
}

/// Runs the job over the generated input in two runs (partition 4's lines
/// arrive for the second), and checks it against the model.
fn run_and_check(settings: &str, seed: u64) -> BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let input = generate(seed, 6000);
    let expected = expect(&runs(&input));
    // The input exercises what it claims to.
    let kinds = counts(&expected);
    for kind in ["duplicate", "duplicate_conflict", "too_old", "future", "malformed"] {
        assert!(kinds.get(kind).copied().unwrap_or(0) > 0, "no {kind} dead letter: {kinds:?}");
    }
    let adjusted = expected.finals.values().filter(|p| p.final_value != p.settled_value).count();
    assert!(adjusted > 0, "no period is adjusted");
    let job = write_job(dir.path(), &input, settings);
    run_to_end(&job);
    append_later(dir.path(), &input);
    run_to_end(&job);
    check(dir.path(), &expected)
}

#[test]
fn periods_match_the_model_with_batches_of_one_and_of_ten_thousand() {
    let seed = 31;
    let one = run_and_check("batch_size = 1\ncommit_interval_ms = 5", seed);
    let many = run_and_check("batch_size = 10000\ncommit_interval_ms = 60000", seed);
    assert_eq!(one, many, "FINAL records do not depend on batch size or commit interval");
    // The idle partition (hooli's, partition 3) closed its March by the
    // others' watermarks, and wayne's February (partition 4, empty at
    // first) closed when it went idle too.
    assert!(one.iter().any(|f| f.contains(r#""customer":"hooli""#) && f.contains("2026-03")));
    assert!(one.iter().any(|f| f.contains(r#""customer":"wayne""#) && f.contains("2026-02")));
}

#[test]
fn killed_at_random_moments_a_period_job_emits_every_final_once() {
    kill_and_check(BILLING_PERIODS, 8000);
}

/// The same with the Python build of the plugin (another language's SDK,
/// an interpreter, the slowest build): nothing of exactly-once may rest
/// on the plugin's language.
#[test]
fn killed_at_random_moments_a_python_period_plugin_emits_every_final_once() {
    let _serial = tally_tests::kafka::serial();
    kill_and_check(BILLING_PERIODS_PYTHON, 3000);
}

/// Runs the job with `plugin` over generated input of `per_partition`
/// lines, killed (SIGKILL) at random moments, then to its end, and checks
/// it against the model.
fn kill_and_check(plugin: &str, per_partition: usize) {
    let seed =
        std::env::var("TALLY_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
                as u64
        });
    println!("periods crash test seed: {seed} (set TALLY_CRASH_SEED to replay)");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let input = generate(seed, per_partition);
    let expected = expect(&runs(&input));
    let job = write_job_of(plugin, dir.path(), &input, "batch_size = 16\ncommit_interval_ms = 2");
    let dead_path = dir.path().join("out/dead-letters.ndjson");
    let kills = run_killing(&job, &dir.path().join("compiled"), &dead_path, 10, 30, &mut rng);
    assert!(kills >= 5, "only {kills} kills landed mid-run");
    append_later(dir.path(), &input);
    run_to_end(&job);
    check(dir.path(), &expected);
}

/// A period job served by `tally serve`, following its inputs: each
/// partition read to its end goes idle after `idle_timeout`, with no end of
/// input to wait for, and partition 4's lines appended later close its
/// February the same way. A tenant's `max_seen_ids` caps the job's.
#[test]
fn a_served_period_job_closes_idle_partitions_of_followed_inputs() {
    use tally_tests::serve::{ACME, ServeHost, wait_for};
    let dir = tempfile::tempdir().unwrap();
    let host = ServeHost::start_with(dir.path(), "", "max_seen_ids = 1000000", "");
    let input = generate(33, 2000);
    let expected = expect(&runs(&input));
    write_job(&host.inputs("acme"), &input, "");
    let inputs: Vec<String> =
        (0..PARTITIONS).map(|partition| format!("\"usage-{partition}.ndjson\"")).collect();
    let job = |periods: &str| {
        format!(
            "name = \"billing\"\noutputs = [\"periods\"]\n[local]\ninputs = [{}]\n\
             [periods]\nidle_timeout = \"1s\"\ntime_zones = {}\n{periods}\n[plugin_config]\n{PLUGIN_CONFIG}\n",
            inputs.join(", "),
            time_zones_table()
        )
    };
    let acme = host.client(ACME);
    let plugin = std::fs::read(BILLING_PERIODS).unwrap();
    let refusal = acme.deploy(&job("max_seen_ids = 2000000"), &plugin).unwrap_err().to_string();
    assert!(
        refusal.contains("periods.max_seen_ids may be at most 1000000")
            && refusal.contains("max_seen_ids"),
        "{refusal}"
    );
    acme.deploy(&job(""), &plugin).unwrap();

    let periods = host.output("acme", "billing", "periods");
    let dead_letters = host.output("acme", "billing", "dead-letters");
    // The first run's FINALs: what the model closes without partition 4.
    let first = expect(&runs(&input)[..1]);
    let finals_written = |path: &Path| {
        read_records_at(path).iter().filter(|record| record.value["type"] == "final").count()
    };
    wait_for("the first FINALs", Duration::from_secs(120), || {
        finals_written(&periods) >= first.finals.len()
    });
    append_later(&host.inputs("acme"), &input);
    wait_for("wayne's February", Duration::from_secs(120), || {
        finals_written(&periods) >= expected.finals.len()
    });
    // Idle a while longer: nothing more closes, nothing twice.
    std::thread::sleep(Duration::from_secs(3));
    check_files("acme.billing", &periods, &dead_letters, &expected);

    // Its status and metrics say what the rules did, per partition.
    let status = acme.status("billing").unwrap();
    let partitions = status["periods"].as_array().unwrap_or_else(|| panic!("{status}"));
    assert_eq!(partitions.len(), PARTITIONS, "{status}");
    let sum = |field: &str| partitions.iter().map(|p| p[field].as_u64().unwrap()).sum::<u64>();
    let kinds = counts(&expected);
    let kind = |name: &str| kinds.get(name).copied().unwrap_or(0) as u64;
    assert_eq!(sum("finals"), expected.finals.len() as u64, "{status}");
    assert_eq!(sum("duplicates"), kind("duplicate"), "{status}");
    assert_eq!(sum("conflicts"), kind("duplicate_conflict"), "{status}");
    assert_eq!(sum("future"), kind("future"), "{status}");
    assert_eq!(sum("too_old"), kind("too_old"), "{status}");
    assert_eq!(partitions[3]["idle"], true, "hooli's partition closed by idleness: {status}");
    assert!(sum("seen_ids") > 0 && sum("open_periods") > 0, "{status}");
    let metrics = tally_tests::serve::JsonApi::new(&host.server, Some(tally_tests::serve::METRICS))
        .metrics()
        .unwrap();
    let finals_line = format!(
        "tally_period_records{{tenant=\"acme\",job=\"billing\",partition=\"3\",kind=\"final\"}} {}",
        partitions[3]["finals"]
    );
    assert!(metrics.contains(&finals_line), "{finals_line} missing from\n{metrics}");
    assert!(metrics.contains("tally_period_seen_ids{"), "{metrics}");
}
