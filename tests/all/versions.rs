//! Output versions in local mode: a period job's history replayed into v2
//! and v3 beside the live version (`tally replay`), compared with it
//! (`tally diff`), and listed (`tally versions`); the live version's
//! outputs stay byte for byte what they were.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use tally_tests::periods::generate;
use tally_tests::tally_binary;

use crate::periods::{run_to_end, write_job};

/// Runs `tally <args>`: its stdout, or the test fails with its stderr.
pub(crate) fn tally(args: &[&str]) -> String {
    let output = Command::new(tally_binary()).args(args).output().unwrap();
    assert!(output.status.success(), "tally {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// Runs `tally <args>`, which must fail: its stderr.
fn tally_refused(args: &[&str]) -> String {
    let output = Command::new(tally_binary()).args(args).output().unwrap();
    assert!(!output.status.success(), "tally {args:?} was accepted");
    String::from_utf8(output.stderr).unwrap()
}

/// The last value per key of an output file, read by the test itself:
/// (key as JSON, the record's `value` field) — a period's FINAL with its
/// ADJUSTMENTs applied.
fn settled(path: &Path) -> BTreeMap<String, Value> {
    last_values(path, |line| line["key"].to_string())
}

/// The last `value` field per record of an output file, keyed by `key_of`
/// (given the whole line).
fn last_values(path: &Path, key_of: impl Fn(&Value) -> String) -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut values = BTreeMap::new();
    for line in text.lines() {
        let line: Value = serde_json::from_str(line).unwrap();
        values.insert(key_of(&line), line["value"]["value"].clone());
    }
    values
}

#[test]
fn a_replay_with_a_meter_defined_anew_diffs_exactly_the_periods_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let input = generate(77, 300);
    let job = write_job(dir.path(), &input, "");
    run_to_end(&job);
    let job = job.to_str().unwrap();
    let live_path = dir.path().join("out/periods.ndjson");
    let live = std::fs::read(&live_path).unwrap();

    // The same logic replayed: every period equal.
    tally(&["replay", job, "--version", "v2", "--from", "earliest"]);
    let v2_path = dir.path().join("out/versions/v2/periods.v2.ndjson");
    let diff: Value = serde_json::from_str(&tally(&["diff", job, "v1", "v2", "--json"])).unwrap();
    let keys = settled(&live_path).len() as u64;
    assert!(keys > 20, "the job closed periods");
    assert_eq!(diff["equal"], keys, "{diff}");
    assert_eq!(diff["changed"], Value::Array(vec![]));
    assert_eq!(diff["only_in_a"], Value::Array(vec![]));
    assert_eq!(diff["only_in_b"], Value::Array(vec![]));
    // Its records are its own: another job name in every idempotency key.
    let v2_text = std::fs::read_to_string(&v2_path).unwrap();
    let v2_line: Value = serde_json::from_str(v2_text.lines().next().unwrap()).unwrap();
    assert!(v2_line["idempotency_key"].as_str().unwrap().starts_with("billing.v2/"), "{v2_line}");

    // `calls` metered as the largest quantity instead of the sum.
    let config = dir.path().join("max-calls.toml");
    std::fs::write(
        &config,
        tally_tests::periods::PLUGIN_CONFIG.replace("calls = \"sum\"", "calls = \"max\""),
    )
    .unwrap();
    tally(&["replay", job, "--version", "v3", "--plugin-config", config.to_str().unwrap()]);
    let diff: Value = serde_json::from_str(&tally(&["diff", job, "v1", "v3", "--json"])).unwrap();
    let (v1, v3) =
        (settled(&live_path), settled(&dir.path().join("out/versions/v3/periods.v3.ndjson")));
    let changed: BTreeMap<String, (Value, Value)> = v1
        .iter()
        .filter(|(key, value)| v3.get(*key) != Some(value))
        .map(|(key, value)| (key.clone(), (value.clone(), v3[key].clone())))
        .collect();
    assert!(!changed.is_empty(), "some period's largest call count differs from its sum");
    for (key, (sum, max)) in &changed {
        assert!(key.contains("\"metric\":\"calls\""), "only calls changed: {key}");
        assert!(max.as_u64().unwrap() < sum.as_u64().unwrap(), "{key}");
    }
    let reported: BTreeMap<String, (Value, Value)> = diff["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["key"].to_string(), (c["a"].clone(), c["b"].clone())))
        .collect();
    assert_eq!(reported, changed);
    for c in diff["changed"].as_array().unwrap() {
        let delta = c["b"].as_i64().unwrap() - c["a"].as_i64().unwrap();
        assert_eq!(c["delta"], delta);
    }
    assert_eq!(diff["equal"], keys - changed.len() as u64);
    let text = tally(&["diff", job, "v1", "v3"]);
    assert!(
        text.ends_with(&format!(
            "output periods: equal {}, changed {}, only in v1 0, only in v3 0\n",
            keys - changed.len() as u64,
            changed.len()
        )),
        "{text}"
    );

    // The live version never changed.
    assert_eq!(std::fs::read(&live_path).unwrap(), live, "a replay touched the live outputs");
    let listed = tally(&["versions", job]);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 3, "{listed}");
    assert!(lines[0].starts_with("v1 (live)  billing  periods:"), "{listed}");
    assert!(lines[1].starts_with("v2  billing.v2"), "{listed}");

    // A replay never runs into the live version, nor from where it cannot start.
    let err = tally_refused(&["replay", job, "--version", "v1"]);
    assert!(err.contains("v1 is the live version"), "{err}");
    let err = tally_refused(&["replay", job, "--version", "v4", "--from", "2026-11-01T00:00:00Z"]);
    assert!(err.contains("a local job's input lines carry no Kafka timestamps"), "{err}");
    let err = tally_refused(&["replay", job, "--version", "v4", "--from", "last tuesday"]);
    assert!(err.contains("is neither `earliest`, an RFC 3339 time"), "{err}");
    let err = tally_refused(&["diff", job, "v1", "v0"]);
    assert!(err.contains("give v1 to v999"), "{err}");
    assert_eq!(std::fs::read(&live_path).unwrap(), live);
}

#[test]
fn a_kafka_job_replays_into_topics_of_its_own_and_diffs_them() {
    use crate::periods_kafka::{PARTITIONS, first_run_lines, produce, write_job_file};
    use tally_tests::kafka::{KafkaBillingJob, delete_topics, serial};

    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let input = generate(78, 200);
    let job = KafkaBillingJob::create("versions", PARTITIONS as i32);
    let state = dir.path().join("state");
    let periods = format!("time_zones = {}", tally_tests::periods::time_zones_table());
    let job_file = write_job_file(&job, dir.path(), &state, "", &periods);
    produce(&job, &first_run_lines(&input));
    crate::kafka_restore::run(&job_file);
    let job_path = job_file.to_str().unwrap();
    let before: Value =
        serde_json::from_str(&tally(&["diff", job_path, "v1", "v1", "--json"])).unwrap();

    let config = dir.path().join("max-calls.toml");
    std::fs::write(
        &config,
        tally_tests::periods::PLUGIN_CONFIG.replace("calls = \"sum\"", "calls = \"max\""),
    )
    .unwrap();
    let replayed = Command::new(tally_binary())
        .args(["replay", job_path, "--version", "v2", "--plugin-config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let name = format!("{}.v2", job.name);
    let cleanup = [
        format!("{}.v2", job.totals),
        format!("{}.v2", job.dead_letters),
        format!("tally-{name}-state-changelog"),
        format!("tally-{name}-watermarks"),
    ];
    let delete = || delete_topics(&cleanup.iter().map(String::as_str).collect::<Vec<_>>());
    if !replayed.status.success() {
        delete();
        panic!("tally replay: {}", String::from_utf8_lossy(&replayed.stderr));
    }
    let diff: Value =
        serde_json::from_str(&tally(&["diff", job_path, "v1", "v2", "--json"])).unwrap();
    let after: Value =
        serde_json::from_str(&tally(&["diff", job_path, "v1", "v1", "--json"])).unwrap();
    delete();

    let keys = before["equal"].as_u64().unwrap();
    assert!(keys > 20, "the job closed periods: {before}");
    assert_eq!(after, before, "the live version's output changed");
    let changed = diff["changed"].as_array().unwrap();
    assert!(!changed.is_empty(), "{diff}");
    for c in changed {
        assert_eq!(c["key"]["metric"], "calls", "only calls changed: {c}");
        assert!(c["b"].as_u64().unwrap() < c["a"].as_u64().unwrap(), "{c}");
    }
    assert_eq!(diff["equal"].as_u64().unwrap() + changed.len() as u64, keys);
    assert_eq!(diff["only_in_a"], Value::Array(vec![]));
    assert_eq!(diff["only_in_b"], Value::Array(vec![]));
}

#[test]
fn a_kafka_replay_starts_at_a_time_or_at_offsets_and_only_when_the_version_first_runs() {
    use tally_tests::kafka::{KafkaBillingJob, delete_topics, produce_usage, read_topic, serial};

    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("versions-from", 2);
    let state = dir.path().join("state");
    let job_file = job.write_job_file(dir.path(), crate::plugins::USAGE_BILLING, &state, "", "");
    let job_path = job_file.to_str().unwrap();
    let before = produce_usage(&job.input, &tally_tests::usage_lines(51, 40, 0), 2);
    // Kafka timestamps are in milliseconds: the start falls between the two halves.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let start = jiff::Timestamp::now().to_string();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let after = produce_usage(&job.input, &tally_tests::usage_lines(52, 30, 0), 2);

    let topics = |version: &str| {
        let name = format!("{}.{version}", job.name);
        [
            format!("{}.{version}", job.totals),
            format!("{}.{version}", job.dead_letters),
            format!("tally-{name}-state-changelog"),
        ]
    };
    let replay = |version: &str, from: &str| {
        Command::new(tally_binary())
            .args(["replay", job_path, "--version", version, "--from", from])
            .output()
            .unwrap()
    };
    let sources = |version: &str| -> Vec<(i32, i64)> {
        let mut sources: Vec<(i32, i64)> = read_topic(&topics(version)[0], true)
            .iter()
            .map(|record| {
                let (_, partition, offset) = record.source();
                (partition, offset)
            })
            .collect();
        sources.sort();
        sources
    };
    let at_time = replay("v2", &start);
    // Offsets: partition 0 from its fifth record, partition 1 (not named) from its start.
    let at_offsets = replay("v3", "0:4");
    let again = replay("v2", &start);
    // On a new machine (v3's state gone), the replay goes on from what the
    // start committed: restored, not read again from the partitions' start.
    std::fs::remove_dir_all(state.join("versions").join("v3")).unwrap();
    let resumed = replay("v3", "earliest");
    let replayed = (sources("v2"), sources("v3"));
    for version in ["v2", "v3"] {
        let topics = topics(version);
        delete_topics(&topics.iter().map(String::as_str).collect::<Vec<_>>());
    }
    for (what, output) in [
        ("--from <time>", &at_time),
        ("--from <offsets>", &at_offsets),
        ("resumed on a new machine", &resumed),
    ] {
        assert!(output.status.success(), "{what}: {}", String::from_utf8_lossy(&output.stderr));
    }

    let mut expected: Vec<(i32, i64)> =
        after.iter().map(|placed| (placed.partition, placed.offset)).collect();
    expected.sort();
    assert_eq!(replayed.0, expected, "from the time: each record produced after it, once");
    let mut expected: Vec<(i32, i64)> = before
        .iter()
        .chain(&after)
        .filter(|placed| placed.partition == 1 || placed.offset >= 4)
        .map(|placed| (placed.partition, placed.offset))
        .collect();
    expected.sort();
    assert_eq!(
        replayed.1, expected,
        "from the offsets: partition 0 from offset 4, partition 1 whole, once through a move to a new machine"
    );

    let err = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success() && err.contains("has already started"), "{err}");
    let err = tally_refused(&["replay", job_path, "--version", "v4", "--from", "0:100000"]);
    assert!(err.contains("is outside its records"), "{err}");
    let err = tally_refused(&["replay", job_path, "--version", "v4", "--from", "7:0"]);
    assert!(err.contains("which has 2 partitions"), "{err}");
}

/// Per period, the records a receiver applied: see [`billed`].
pub(crate) type Billed = BTreeMap<String, Vec<(String, Value)>>;

/// What a receiver applied, per period (`customer/metric/period`): the
/// bodies in the order it applied them, each with its idempotency key.
pub(crate) fn billed(
    receiver: &tally_tests::receiver::Receiver,
) -> BTreeMap<String, Vec<(String, Value)>> {
    receiver.seen(|seen| {
        let mut applied: Vec<(&String, &(Vec<u8>, u64))> = seen.applied.iter().collect();
        applied.sort_by_key(|(_, (_, order))| *order);
        let mut periods: BTreeMap<String, Vec<(String, Value)>> = BTreeMap::new();
        for (key, (body, _)) in applied {
            let value: Value = serde_json::from_slice(body).unwrap();
            periods.entry(period_of(&value)).or_default().push((key.clone(), value));
        }
        periods
    })
}

/// Per period, the last value a receiver applied.
pub(crate) fn billed_values(
    periods: &BTreeMap<String, Vec<(String, Value)>>,
) -> BTreeMap<String, Value> {
    periods
        .iter()
        .map(|(period, bodies)| (period.clone(), bodies.last().unwrap().1["value"].clone()))
        .collect()
}

/// A period's name, as [`billed`] and [`settled_periods`] key them.
fn period_of(value: &Value) -> String {
    format!("{}/{}/{}", value["customer"], value["metric"], value["period"])
}

/// The settled value per period of a local output file, keyed as [`billed`] keys them.
pub(crate) fn settled_periods(path: &Path) -> BTreeMap<String, Value> {
    last_values(path, |line| period_of(&line["value"]))
}

/// `held` (what the receiver holds) equals `expected`; else the test fails
/// listing the periods that differ.
fn assert_holds(held: &BTreeMap<String, Value>, expected: &BTreeMap<String, Value>, what: &str) {
    let differ: Vec<String> = held
        .keys()
        .chain(expected.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|period| held.get(*period) != expected.get(*period))
        .take(10)
        .map(|period| {
            format!("{period}: held {:?}, expected {:?}", held.get(period), expected.get(period))
        })
        .collect();
    assert!(differ.is_empty(), "{what}: {differ:#?}");
}

/// What the receiver applied between `before` and `after`: for each
/// period in `changed`, one ADJUSTMENT from the value billed to `now`'s,
/// the billed version + 1, under an idempotency key with `key` (prefix,
/// suffix); nothing for the other periods.
pub(crate) fn assert_corrected_once(
    (before, after): (&Billed, &Billed),
    changed: &[&String],
    now: &BTreeMap<String, Value>,
    (prefix, suffix): (&str, &str),
) {
    for (period, bodies) in after {
        let new = &bodies[before[period].len()..];
        if !changed.contains(&period) {
            assert!(new.is_empty(), "{period}: unchanged, yet billed again: {new:?}");
            continue;
        }
        assert_eq!(new.len(), 1, "{period}: one correction: {new:?}");
        let (key, correction) = &new[0];
        let billed_before = &before[period].last().unwrap().1;
        assert!(key.starts_with(prefix) && key.ends_with(suffix), "{key}");
        assert_eq!(correction["type"], "adjustment");
        assert_eq!(correction["previous"], billed_before["value"], "{period}");
        assert_eq!(correction["value"], now[period], "{period}");
        assert_eq!(correction["version"], billed_before["version"].as_i64().unwrap() + 1);
    }
}

/// Each period's records, as the receiver applied them, are one chain:
/// versions 1, 2, 3… and each ADJUSTMENT's `previous` the value before it.
pub(crate) fn chain_holds(periods: &BTreeMap<String, Vec<(String, Value)>>) {
    for (period, bodies) in periods {
        for (number, (key, body)) in bodies.iter().enumerate() {
            assert_eq!(
                body["version"],
                number as i64 + 1,
                "{period}: {key} breaks the version chain"
            );
            if number > 0 {
                assert_eq!(body["type"], "adjustment", "{period}: {key} is a second FINAL");
                assert_eq!(body["previous"], bodies[number - 1].1["value"], "{period}: {key}");
            }
        }
    }
}

#[test]
fn a_promotion_corrects_each_changed_period_once_through_kills_and_bills_nothing_twice() {
    use crate::deliver::{deliver_to_the_end, deliver_with_kills, write_delivery_file};
    use crate::periods::append_later;
    use tally_tests::receiver::{Faults, Receiver};

    let dir = tempfile::tempdir().unwrap();
    let input = generate(78, 300);
    let job_path = write_job(dir.path(), &input, "");
    run_to_end(&job_path);
    let job = job_path.to_str().unwrap();
    let receiver = Receiver::start(Faults {
        error_500: 100,
        latency: std::time::Duration::from_millis(50),
        ..Faults::default()
    });
    let http = format!(
        "[http]\nurl = {:?}\nmax_in_flight = 1\nretry_initial = \"20ms\"\nretry_max = \"100ms\"",
        receiver.url()
    );
    let delivery =
        write_delivery_file(dir.path(), "deliver.toml", &job_path, "deliver-state", &http);
    let delivery_path = delivery.to_str().unwrap();
    deliver_to_the_end(&delivery);
    let v1_path = dir.path().join("out/periods.ndjson");
    let before = billed(&receiver);
    assert_eq!(billed_values(&before), settled_periods(&v1_path), "v1 billed whole");

    // v2 meters calls as their largest quantity.
    let config = dir.path().join("max-calls.toml");
    std::fs::write(
        &config,
        tally_tests::periods::PLUGIN_CONFIG.replace("calls = \"sum\"", "calls = \"max\""),
    )
    .unwrap();
    tally(&["replay", job, "--version", "v2", "--plugin-config", config.to_str().unwrap()]);
    let v2_path = dir.path().join("out/versions/v2/periods.v2.ndjson");
    let v2 = settled_periods(&v2_path);
    let changed: Vec<&String> = v2
        .iter()
        .filter(|(period, value)| before[*period].last().unwrap().1["value"] != **value)
        .map(|(p, _)| p)
        .collect();
    assert!(
        changed.len() > 3 && changed.len() < v2.len(),
        "{} of {} periods change",
        changed.len(),
        v2.len()
    );

    let err = tally_refused(&["promote", job, "--version", "v3"]);
    assert!(err.contains("v3 of job `billing` has no state"), "{err}");
    // A promotion killed before its live pointer was written has not
    // happened: the delivery goes on with v1 and sends nothing new.
    let said = tally(&["promote", job, "--version", "v2", "--deliver", delivery_path]);
    assert!(said.contains(&format!("{} correcting records", changed.len())), "{said}");
    let pointer = dir.path().join("state/live-version.json");
    std::fs::remove_file(&pointer).unwrap();
    let posts_before = receiver.seen(|seen| seen.posts);
    deliver_to_the_end(&delivery);
    assert_eq!(
        receiver.seen(|seen| seen.posts),
        posts_before,
        "a promotion that did not happen was acted on"
    );
    let said = tally(&["promote", job, "--version", "v2", "--deliver", delivery_path]);
    assert!(said.contains(&format!("{} correcting records", changed.len())), "{said}");
    let err = tally_refused(&["promote", job, "--version", "v2"]);
    assert!(err.contains("v2 is already the live version"), "{err}");
    let err = tally_refused(&["replay", job, "--version", "v2"]);
    assert!(err.contains("v2 is the live version (promoted)"), "{err}");
    assert!(tally(&["versions", job]).contains("v2 (live)"));

    // The switch delivered through kills: one ADJUSTMENT per changed
    // period, from the value billed, under a key of its own; nothing else.
    let posts = |receiver: &Receiver| receiver.seen(|seen| seen.applied.len() as u64);
    let kills = deliver_with_kills(&delivery, 3, 40, &mut || posts(&receiver), &mut |_, _, _| {});
    assert!(kills >= 1, "no kill landed during the switch");
    let after = billed(&receiver);
    assert_corrected_once((&before, &after), &changed, &v2, ("billing.v2/", "/promotion-1"));
    assert_eq!(billed_values(&after), v2, "the receiver holds v2's values");

    // v2 goes on as the live version: its later records reach the receiver
    // with versions that continue the receiver's.
    let v1_then = std::fs::read(&v1_path).unwrap();
    append_later(dir.path(), &input);
    run_to_end(&job_path);
    deliver_to_the_end(&delivery);
    assert_eq!(std::fs::read(&v1_path).unwrap(), v1_then, "v1 ran after its promotion");
    let last = billed(&receiver);
    assert_holds(
        &billed_values(&last),
        &settled_periods(&v2_path),
        "the receiver holds v2's values",
    );
    assert!(
        last.values().map(Vec::len).sum::<usize>() > after.values().map(Vec::len).sum::<usize>(),
        "v2 went on"
    );
    chain_holds(&last);

    // A second promotion, to v3 (the meters as v1 had them): from what the
    // receiver holds, each period v3 changes corrected once more, the rest
    // (corrected by the first promotion or not) left alone.
    tally(&["replay", job, "--version", "v3"]);
    let v3 = settled_periods(&dir.path().join("out/versions/v3/periods.v3.ndjson"));
    let holds = billed_values(&last);
    let changing: Vec<&String> = v3
        .iter()
        .filter(|(period, value)| holds.get(*period) != Some(*value))
        .map(|(p, _)| p)
        .collect();
    assert!(!changing.is_empty(), "v3 changes what v2 billed");
    tally(&["promote", job, "--version", "v3", "--deliver", delivery_path]);
    deliver_to_the_end(&delivery);
    let third = billed(&receiver);
    // A period v3 has not written yet keeps what was billed, until it does.
    let mut expected = holds.clone();
    expected.extend(v3.clone());
    assert_holds(&billed_values(&third), &expected, "the receiver holds v3's values");
    for (period, bodies) in &third {
        let new = &bodies[last.get(period).map_or(0, Vec::len)..];
        let expected = usize::from(changing.contains(&period));
        assert_eq!(new.len(), expected, "{period}: {new:?}");
        if let Some((key, _)) = new.first() {
            assert!(key.starts_with("billing.v3/") && key.ends_with("/promotion-2"), "{key}");
        }
    }
    chain_holds(&third);
    receiver.seen(|seen| {
        for (key, requests) in &seen.requests {
            assert!(
                requests.iter().all(|body| *body == requests[0]),
                "{key} was sent with two bodies"
            );
        }
    });
}
