//! A local run end to end: totals, dead letters, lineage, resume, the lock.

use std::collections::BTreeSet;
use std::process::Command;

use tally_core::lock::DirLock;
use tally_tests::*;

use crate::plugins::USAGE_BILLING;

#[test]
fn a_local_run_produces_the_independently_computed_totals() {
    let dir = tempfile::tempdir().unwrap();
    let lines = usage_lines(7, 20_000, 20);
    let (inputs, partitions) = write_partitions(dir.path(), &lines, 3);
    let job = write_billing_job(dir.path(), USAGE_BILLING, &inputs, "");

    let run = Command::new(tally_binary()).arg("run").arg(&job).output().unwrap();
    assert!(run.status.success(), "tally run failed: {}", String::from_utf8_lossy(&run.stderr));
    let report = String::from_utf8_lossy(&run.stdout);
    let bad = lines.iter().filter(|line| line.effect.is_none()).count();
    assert!(
        report.contains(&format!("20000 records ({} applied, {bad} dead-lettered)", 20_000 - bad)),
        "{report}"
    );

    let totals = read_totals(&dir.path().join("out/totals.ndjson"));
    assert_eq!(final_totals(&totals), expected_totals(&lines));
    assert_eq!(totals.len(), 20_000 - bad, "every accepted event emits one total");

    // Lineage: every accepted line appears once, with a stable idempotency key.
    let sources: BTreeSet<(String, u64)> = totals.iter().map(|t| t.source.clone()).collect();
    assert_eq!(sources.len(), totals.len());
    let first = &totals[0];
    let partition_index = inputs
        .iter()
        .position(|p| p.file_name().unwrap().to_str() == Some(&first.source.0))
        .unwrap();
    assert_eq!(first.idempotency_key, format!("billing/{partition_index}/{}/0", first.source.1));

    // Dead letters: exactly the bad lines, each with a reason.
    let dead = read_dead_letters(&dir.path().join("out/dead-letters.ndjson"));
    let expected_dead: BTreeSet<(String, u64)> = partitions
        .iter()
        .enumerate()
        .flat_map(|(p, lines)| {
            lines
                .iter()
                .enumerate()
                .filter(|(_, l)| l.effect.is_none())
                .map(move |(o, _)| (format!("usage-{p}.ndjson"), o as u64))
        })
        .collect();
    assert_eq!(
        dead.iter().map(|(p, o, _)| (p.clone(), *o)).collect::<BTreeSet<_>>(),
        expected_dead
    );
    assert!(dead.iter().all(|(_, _, reason)| !reason.is_empty()));

    // A second run finds nothing new to do and changes nothing.
    let before = std::fs::read(dir.path().join("out/totals.ndjson")).unwrap();
    let again = Command::new(tally_binary()).arg("run").arg(&job).output().unwrap();
    assert!(again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stdout).contains(": 0 records"),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
    assert_eq!(std::fs::read(dir.path().join("out/totals.ndjson")).unwrap(), before);
}

#[test]
fn each_kind_of_bad_record_is_dead_lettered_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bad.ndjson");
    std::fs::write(
        &input,
        [
            r#"{"customer":"acme","metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}"#,
            r#"{"customer":"acme","metric":"api_calls","quantity":3"#,
            r#"{"metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}"#,
            r#"{"customer":"acme","metric":"api_calls","quantity":-3,"ts":"2026-11-03T10:00:00Z"}"#,
            r#"{"customer":"acme","metric":"api_calls","quantity":2.5,"ts":"2026-11-03T10:00:00Z"}"#,
            r#"{"customer":"acme","metric":"api_calls","quantity":4,"ts":"2026-11-03T10:00:00Z"}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let job = write_billing_job(dir.path(), USAGE_BILLING, &[input], "");
    let run = Command::new(tally_binary()).arg("run").arg(&job).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));

    let dead = read_dead_letters(&dir.path().join("out/dead-letters.ndjson"));
    let reasons: Vec<(u64, &str)> =
        dead.iter().map(|(_, offset, reason)| (*offset, reason.as_str())).collect();
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    assert_eq!(reasons[0], (1, "event is not valid JSON"), "{reasons:?}");
    assert_eq!(reasons[1], (2, "field `customer` is missing"), "{reasons:?}");
    assert_eq!(reasons[2], (3, "quantity must be a non-negative integer, got -3"));
    assert_eq!(reasons[3], (4, "quantity must be a non-negative integer, got 2.5"));
    let totals = read_totals(&dir.path().join("out/totals.ndjson"));
    assert_eq!(totals.iter().map(|t| t.total).collect::<Vec<_>>(), vec![3, 7]);
}

#[test]
fn a_second_run_on_a_held_state_directory_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let lines = usage_lines(1, 100, 0);
    let (inputs, _) = write_partitions(dir.path(), &lines, 1);
    let job = write_billing_job(dir.path(), USAGE_BILLING, &inputs, "");
    let _held = DirLock::acquire(&dir.path().join("state")).unwrap();

    let run = Command::new(tally_binary()).arg("run").arg(&job).output().unwrap();
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("is in use by another tally process"), "{stderr}");
    assert!(!dir.path().join("out").exists(), "a refused run must not create outputs");
}

#[test]
fn a_job_file_with_an_unknown_field_is_refused_with_the_field_named() {
    let dir = tempfile::tempdir().unwrap();
    let (inputs, _) = write_partitions(dir.path(), &usage_lines(1, 10, 0), 1);
    let job = write_billing_job(dir.path(), USAGE_BILLING, &inputs, "commit_intervall_ms = 5");
    let run = Command::new(tally_binary()).arg("run").arg(&job).output().unwrap();
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("unknown field `commit_intervall_ms`"), "{stderr}");
    assert!(!dir.path().join("state").exists() && !dir.path().join("out").exists());
}

#[test]
fn a_missing_input_is_named_and_nothing_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let job =
        write_billing_job(dir.path(), USAGE_BILLING, &[dir.path().join("usage-9.ndjson")], "");
    let run = Command::new(tally_binary()).arg("run").arg(&job).output().unwrap();
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("cannot read input") && stderr.contains("usage-9.ndjson"), "{stderr}");
    assert!(!dir.path().join("state").exists() && !dir.path().join("out").exists());
}

#[test]
fn plugin_build_turns_a_crate_into_a_component_that_runs() {
    let dir = tempfile::tempdir().unwrap();
    let crate_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/usage-billing");
    let out = dir.path().join("plugins/billing.wasm");
    let build = Command::new(tally_binary())
        .args(["plugin", "build", crate_dir, "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(build.status.success(), "{}", String::from_utf8_lossy(&build.stderr));
    assert!(String::from_utf8_lossy(&build.stdout).contains("built `usage-billing`"));

    let (inputs, _) = write_partitions(dir.path(), &usage_lines(5, 1_000, 0), 2);
    let job = write_billing_job(dir.path(), out.to_str().unwrap(), &inputs, "");
    let run = Command::new(tally_binary()).arg("run").arg(&job).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let totals = read_totals(&dir.path().join("out/totals.ndjson"));
    assert_eq!(final_totals(&totals), expected_totals(&usage_lines(5, 1_000, 0)));

    let not_a_crate =
        Command::new(tally_binary()).args(["plugin", "build"]).arg(dir.path()).output().unwrap();
    assert!(!not_a_crate.status.success());
    let stderr = String::from_utf8_lossy(&not_a_crate.stderr);
    assert!(stderr.contains("holds no plugin to build: a Rust plugin has a Cargo.toml, a JavaScript one a package.json, a Python one a pyproject.toml, a Go one a go.mod, a C one .c files"), "{stderr}");
}

#[test]
fn re_running_the_same_input_gives_the_same_output_records() {
    // Invariant 4: no clock, randomness or batch timing reaches a record, so
    // every output line (idempotency key included) is the same on every run.
    // Only how lines of different partitions interleave may differ; each
    // customer's events sit in one partition (as Kafka's key partitioning
    // would put them), so a key's running totals do not depend on it.
    let lines = usage_lines(21, 30_000, 10);
    let partition_of = |line: &str| {
        let event: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
        event["customer"].as_str().map_or(0, |customer| customer.len() % 3)
    };
    let sorted_lines = |bytes: Vec<u8>| {
        let mut lines: Vec<String> =
            String::from_utf8(bytes).unwrap().lines().map(str::to_string).collect();
        lines.sort();
        lines
    };
    let outputs: Vec<(Vec<String>, Vec<String>)> = ["5", "100"]
        .iter()
        .map(|interval| {
            let dir = tempfile::tempdir().unwrap();
            let inputs: Vec<std::path::PathBuf> =
                (0..3).map(|p| dir.path().join(format!("usage-{p}.ndjson"))).collect();
            let mut texts = vec![String::new(); 3];
            for line in &lines {
                texts[partition_of(&line.line)].push_str(&format!("{}\n", line.line));
            }
            for (path, text) in inputs.iter().zip(&texts) {
                std::fs::write(path, text).unwrap();
            }
            let extra = format!(
                "commit_interval_ms = {interval}\nbatch_size = {}",
                if *interval == "5" { 7 } else { 1024 }
            );
            let job = write_billing_job(dir.path(), USAGE_BILLING, &inputs, &extra);
            let run = Command::new(tally_binary()).arg("run").arg(&job).output().unwrap();
            assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
            let read = |name: &str| {
                sorted_lines(std::fs::read(dir.path().join("out").join(name)).unwrap())
            };
            (read("totals.ndjson"), read("dead-letters.ndjson"))
        })
        .collect();
    assert!(!outputs[0].0.is_empty() && !outputs[0].1.is_empty());
    assert!(outputs[0] == outputs[1], "different batching changed output records");
}

#[test]
fn reordered_inputs_are_refused_against_committed_state() {
    let dir = tempfile::tempdir().unwrap();
    let (inputs, _) = write_partitions(dir.path(), &usage_lines(4, 1_000, 0), 2);
    let job = write_billing_job(dir.path(), USAGE_BILLING, &inputs, "");
    assert!(Command::new(tally_binary()).arg("run").arg(&job).output().unwrap().status.success());
    let before = std::fs::read(dir.path().join("out/totals.ndjson")).unwrap();

    let swapped =
        write_billing_job(dir.path(), USAGE_BILLING, &[inputs[1].clone(), inputs[0].clone()], "");
    let run = Command::new(tally_binary()).arg("run").arg(&swapped).output().unwrap();
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("input 0 was `usage-0.ndjson` when this state was committed, but the job now names `usage-1.ndjson`"), "{stderr}");
    assert_eq!(std::fs::read(dir.path().join("out/totals.ndjson")).unwrap(), before);
}

#[test]
fn an_input_replaced_by_another_file_of_the_same_layout_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (inputs, _) = write_partitions(dir.path(), &usage_lines(5, 1_000, 0), 1);
    let job = write_billing_job(dir.path(), USAGE_BILLING, &inputs, "");
    assert!(Command::new(tally_binary()).arg("run").arg(&job).output().unwrap().status.success());
    let before = std::fs::read(dir.path().join("out/totals.ndjson")).unwrap();

    // A new file under the old name (a rotation, say): its last committed
    // line has another quantity of the same width, so every newline sits
    // where it was, and more lines follow.
    let text = std::fs::read_to_string(&inputs[0]).unwrap();
    let (head, last) = text.trim_end_matches('\n').rsplit_once('\n').unwrap();
    let digit = last.find("\"quantity\":").unwrap() + "\"quantity\":".len();
    let changed = (last.as_bytes()[digit] - b'0' + 1) % 10;
    let last = format!("{}{changed}{}", &last[..digit], &last[digit + 1..]);
    let more: String =
        usage_lines(6, 10, 0).iter().map(|line| format!("{}\n", line.line)).collect();
    std::fs::write(&inputs[0], format!("{head}\n{last}\n{more}")).unwrap();

    let run = Command::new(tally_binary()).arg("run").arg(&job).output().unwrap();
    assert!(!run.status.success(), "a replaced input must not be read on from the old position");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("the last one processed and committed, now reads differently"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(dir.path().join("out/totals.ndjson")).unwrap(), before);
}

#[test]
fn an_output_the_job_does_not_declare_stops_the_job_instead_of_dead_lettering_everything() {
    let dir = tempfile::tempdir().unwrap();
    let (inputs, _) = write_partitions(dir.path(), &usage_lines(8, 500, 0), 1);
    let job =
        write_billing_job(dir.path(), USAGE_BILLING, &inputs, "").to_string_lossy().into_owned();
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace(r#"outputs = ["totals"]"#, r#"outputs = ["total"]"#);
    std::fs::write(&job, text).unwrap();

    let run = Command::new(tally_binary()).arg("run").arg(&job).output().unwrap();
    assert!(!run.status.success(), "a misconfigured job must not finish");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains(
            "plugin emitted to output `totals`, which the job does not declare (declared: total)"
        ),
        "{stderr}"
    );
    assert!(
        read_dead_letters(&dir.path().join("out/dead-letters.ndjson")).is_empty(),
        "nothing may be dead-lettered"
    );
    assert_eq!(std::fs::metadata(dir.path().join("out/total.ndjson")).unwrap().len(), 0);
}

#[test]
fn a_local_run_writing_latest_totals_writes_each_keys_running_total_once_per_commit() {
    let dir = tempfile::tempdir().unwrap();
    let lines = usage_lines(17, 20_000, 20);
    // One input file: each line's running total is known independently.
    let (inputs, _) = write_partitions(dir.path(), &lines, 1);
    let job = write_billing_job(
        dir.path(),
        USAGE_BILLING,
        &inputs,
        "emit = { totals = \"latest_per_key\" }",
    );
    let run = Command::new(tally_binary()).arg("run").arg(&job).output().unwrap();
    assert!(run.status.success(), "tally run failed: {}", String::from_utf8_lossy(&run.stderr));
    let commits = parse_job_report(&String::from_utf8_lossy(&run.stdout)).unwrap().commits as usize;

    let mut running = std::collections::BTreeMap::new();
    let total_after: Vec<Option<u64>> = lines
        .iter()
        .map(|line| {
            line.effect.as_ref().map(|(key, quantity)| {
                let total = running.entry(key.clone()).or_insert(0);
                *total += quantity;
                *total
            })
        })
        .collect();
    let totals = read_totals(&dir.path().join("out/totals.ndjson"));
    for line in &totals {
        assert_eq!(
            Some(line.total),
            total_after[line.source.1 as usize],
            "the total from line {} is not its running total",
            line.source.1
        );
    }
    assert_eq!(final_totals(&totals), expected_totals(&lines));
    let keys = expected_totals(&lines).len();
    assert!(
        totals.len() <= keys * commits,
        "{} totals over {commits} commits of {keys} keys",
        totals.len()
    );
    let sources: BTreeSet<&(String, u64)> = totals.iter().map(|t| &t.source).collect();
    assert_eq!(sources.len(), totals.len(), "no input line writes two totals");
}

#[test]
fn a_plugin_is_compiled_once_and_a_damaged_cache_entry_is_compiled_again() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let lines = usage_lines(11, 500, 0);
    let (inputs, _) = write_partitions(dir.path(), &lines, 2);
    let run = |round: &str| {
        let out = dir.path().join(round);
        std::fs::create_dir_all(&out).unwrap();
        let job = write_billing_job(&out, USAGE_BILLING, &inputs, "");
        let run = Command::new(tally_binary())
            .arg("run")
            .arg(&job)
            .env("TALLY_CACHE_DIR", &cache)
            .output()
            .unwrap();
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        assert_eq!(
            final_totals(&read_totals(&out.join("out/totals.ndjson"))),
            expected_totals(&lines),
            "round {round}"
        );
        String::from_utf8_lossy(&run.stderr).into_owned()
    };
    let entries = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&cache).unwrap().map(|entry| entry.unwrap().path()).collect()
    };
    run("first");
    let cached = entries();
    assert!(
        cached.len() == 1 && cached[0].extension().is_some_and(|ext| ext == "cwasm"),
        "one compiled plugin, no leftovers: {cached:?}"
    );
    let compiled = std::fs::read(&cached[0]).unwrap();
    assert!(!run("second").contains("compiling it again"));
    std::fs::write(&cached[0], b"not compiled code").unwrap();
    assert!(run("third").contains("cannot be loaded; compiling it again"));
    assert_eq!(
        std::fs::read(&cached[0]).unwrap().len(),
        compiled.len(),
        "the entry is written again, whole"
    );
}
