//! A period job against a hostile period plugin and bad job files: each
//! misbehaving event costs only itself (dead-lettered with the limit it
//! broke), a period that cannot be valued stops the job before anything
//! more commits, and every refusal at start names what is wrong and the fix.

use std::path::Path;
use std::process::{Command, Output};

use tally_tests::*;

use crate::plugins::{BILLING_PERIODS, PERIODS_HOSTILE, USAGE_BILLING};

/// Runs a one-file local job of `plugin` over `lines`, with `extra` job
/// settings and `sections` after `[local]`.
fn run(dir: &Path, plugin: &str, lines: &[String], extra: &str, sections: &str) -> Output {
    std::fs::write(dir.join("in.ndjson"), lines.join("\n") + "\n").unwrap();
    let job = format!(
        "name = \"hostile\"\nplugin = {plugin:?}\noutputs = [\"periods\"]\n{extra}\n\
         [local]\ninputs = [\"in.ndjson\"]\noutput_dir = \"out\"\nstate_dir = \"state\"\n{sections}\n"
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
    Command::new(tally_binary()).arg("run").arg(dir.join("job.toml")).output().unwrap()
}

fn event(id: &str, what: &str, quantity: u64) -> String {
    format!(r#"{{"id":"{id}","do":"{what}","quantity":{quantity}}}"#)
}

/// A failure in a batch's fold counts once, against its own event: the
/// fold of a batch tried whole is only tentative (here the batch's one
/// addition, beside a duplicate), and the event's own call after it is the
/// one that counts. Counted twice, two failures in a row would stop the job.
#[test]
fn a_plugin_failure_in_a_batch_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        event("a1", "ok", 1),
        event("a2", "ok", 2),
        // One batch: a duplicate, and one event the plugin fails on.
        event("a1", "ok", 1),
        event("b1", "trap-add", 0),
        event("a3", "ok", 4),
        r#"{"id":"a4","do":"ok","quantity":8,"ts":"2026-11-12T12:00:00Z"}"#.to_string(),
    ];
    let output = run(
        dir.path(),
        PERIODS_HOSTILE,
        &lines,
        "batch_size = 2\n[limits]\nmax_failures_in_a_row = 2",
        "[periods]\ncalendar = \"day\"",
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let dead: Vec<String> = read_dead_letters(&dir.path().join("out/dead-letters.ndjson"))
        .into_iter()
        .map(|(_, _, reason)| reason)
        .collect();
    assert_eq!(dead.len(), 2, "{dead:#?}");
    assert!(dead[0].starts_with("duplicate:"), "{dead:#?}");
    assert!(dead[1].contains("add trapped as asked"), "{dead:#?}");
    let finals = std::fs::read_to_string(dir.path().join("out/periods.ndjson")).unwrap();
    assert!(finals.contains(r#""value":7"#), "{finals}");
}

#[test]
fn a_hostile_period_plugin_costs_only_its_own_events() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        event("a1", "ok", 1),
        event("b1", "trap-describe", 0),
        event("a2", "ok", 2),
        event("b2", "loop-describe", 0),
        event("b3", "extra-facts", 0),
        event("b4", "huge-id", 0),
        event("b5", "trap-add", 0),
        event("b6", "loop-add", 0),
        event("b7", "huge-state", 0),
        event("b8", "huge-addend", 0),
        event("a3", "ok", 4),
        // Two days later: the day closes.
        r#"{"id":"a4","do":"ok","quantity":8,"ts":"2026-11-12T12:00:00Z"}"#.to_string(),
    ];
    let output = run(
        dir.path(),
        PERIODS_HOSTILE,
        &lines,
        "batch_size = 100\n[limits]\ncpu_budget_ms = 50",
        "[periods]\ncalendar = \"day\"",
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let finals = std::fs::read_to_string(dir.path().join("out/periods.ndjson")).unwrap();
    let finals: Vec<serde_json::Value> =
        finals.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(finals.len(), 1, "one FINAL: {finals:?}");
    assert_eq!(finals[0]["value"]["period"], "2026-11-10");
    assert_eq!(finals[0]["value"]["value"], 7, "the good events, and only them");
    let dead: Vec<(u64, String)> = read_dead_letters(&dir.path().join("out/dead-letters.ndjson"))
        .into_iter()
        .map(|(_, offset, reason)| (offset, reason))
        .collect();
    let expected: [(u64, &[&str]); 8] = [
        (1, &["malformed: plugin failed describing it", "describe trapped as asked"]),
        (3, &["malformed: plugin failed describing it", "limits.cpu_budget_ms"]),
        (4, &["malformed: plugin failed describing it", "described 2 events"]),
        (5, &["refused: an event id must be 1 to 256 bytes"]),
        (6, &["refused: plugin failed adding it", "add trapped as asked"]),
        (7, &["refused: plugin failed adding it", "limits.cpu_budget_ms"]),
        (8, &["refused: ", "limits.max_value_bytes"]),
        (9, &["malformed: the plugin's addend for it is 8388608 bytes", "limits.max_value_bytes"]),
    ];
    assert_eq!(dead.len(), expected.len(), "{dead:#?}");
    for ((offset, reason), (expected_offset, parts)) in dead.iter().zip(expected) {
        assert_eq!(*offset, expected_offset, "{dead:#?}");
        for part in parts {
            assert!(reason.contains(part), "line {offset}: {reason:?} lacks {part:?}");
        }
    }
}

/// A batch the plugin fails on whole is described event by event, and
/// what those descriptions keep in all is bounded by the plugin's memory
/// (as one call's are): past it, events are refused naming the limit,
/// not held. 40 addends of 512 KiB (each within limits.max_value_bytes)
/// pass a memory limit of 16 MiB.
#[test]
fn descriptions_of_a_batch_described_event_by_event_are_bounded_by_the_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = vec![event("b0", "trap-describe", 0)];
    lines.extend((1..=40).map(|n| event(&format!("a{n}"), "big-addend", 1)));
    lines.push(r#"{"id":"z","do":"ok","quantity":0,"ts":"2026-11-12T12:00:00Z"}"#.to_string());
    let output = run(
        dir.path(),
        PERIODS_HOSTILE,
        &lines,
        "batch_size = 100\n[limits]\nmemory_bytes = 16777216\nmax_value_bytes = 600000\nmax_failures_in_a_row = 3",
        "[periods]\ncalendar = \"day\"",
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let dead: Vec<(u64, String)> = read_dead_letters(&dir.path().join("out/dead-letters.ndjson"))
        .into_iter()
        .map(|(_, offset, reason)| (offset, reason))
        .collect();
    assert!(dead[0].1.contains("describe trapped as asked"), "{:?}", dead[0]);
    let over: Vec<u64> = dead[1..]
        .iter()
        .map(|(offset, reason)| {
            assert!(reason.contains("(limits.memory_bytes)"), "line {offset}: {reason}");
            *offset
        })
        .collect();
    // 16 MiB hold 31 descriptions of 512 KiB and a few bytes: the rest
    // are refused, in order, and the first 31 count.
    assert_eq!(over, (32..=40).collect::<Vec<u64>>(), "{dead:#?}");
    let finals = std::fs::read_to_string(dir.path().join("out/periods.ndjson")).unwrap();
    assert!(finals.contains(r#""value":31"#), "{finals}");
}

#[test]
fn a_period_the_plugin_cannot_value_stops_the_job_before_it_commits() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        event("a1", "trap-value", 1),
        r#"{"id":"a2","do":"ok","quantity":8,"ts":"2026-11-12T12:00:00Z"}"#.to_string(),
    ];
    let output = run(dir.path(), PERIODS_HOSTILE, &lines, "", "[periods]\ncalendar = \"day\"");
    assert!(!output.status.success(), "the job must stop");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("failed computing a period's value"), "{stderr}");
    assert!(stderr.contains("value trapped as asked"), "{stderr}");
    let finals = std::fs::read_to_string(dir.path().join("out/periods.ndjson")).unwrap_or_default();
    assert!(finals.is_empty(), "no FINAL without its value: {finals}");
}

#[test]
fn bad_period_jobs_are_refused_at_start_naming_the_key_the_value_and_the_fix() {
    let line = [
        r#"{"id":"a","customer":"acme","metric":"calls","quantity":1,"ts":"2026-11-01T00:00:00Z"}"#
            .to_string(),
    ];
    let meters = "[plugin_config]\nmeters = { calls = \"sum\" }";
    let cases: [(&str, &str, String, &[&str]); 10] = [
        (USAGE_BILLING, "", "[plugin_config]\nx = 1".to_string(), &["declares no [periods]"]),
        (
            BILLING_PERIODS,
            "",
            format!("[periods]\n{meters}\nsince = 2026-11-01T00:00:00Z"),
            &["[plugin_config] since = 2026-11-01T00:00:00Z", "as a string"],
        ),
        (BILLING_PERIODS, "", meters.to_string(), &["declare [periods]"]),
        (USAGE_BILLING, "", "[periods]".to_string(), &["declares [periods]", "period plugin"]),
        (
            BILLING_PERIODS,
            "",
            format!("[periods]\ntime_zones = {{ acme = \"America/NewYork\" }}\n{meters}"),
            &["periods.time_zones.acme", "America/NewYork"],
        ),
        (
            BILLING_PERIODS,
            "",
            format!("[periods]\ngrace = \"0s\"\n{meters}"),
            &["periods.grace", "longer than zero"],
        ),
        (
            BILLING_PERIODS,
            "",
            format!("[periods]\ngrace = \"100h\"\n{meters}"),
            &["periods.grace", "max_grace"],
        ),
        (
            BILLING_PERIODS,
            "",
            format!("[periods]\ngrace = \"40d\"\nmax_grace = \"50d\"\n{meters}"),
            &["periods.grace", "horizon"],
        ),
        (
            BILLING_PERIODS,
            "",
            "[periods]\n[plugin_config]\nmeters = { calls = \"avg\" }".to_string(),
            &["refused the job's [plugin_config]", "the meters are"],
        ),
        (
            PERIODS_HOSTILE,
            "",
            "[periods]\n[plugin_config]\nrefuse = true".to_string(),
            &["this plugin refuses to run"],
        ),
    ];
    for (plugin, extra, sections, parts) in cases {
        let dir = tempfile::tempdir().unwrap();
        let output = run(dir.path(), plugin, &line, extra, &sections);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{sections}: must be refused");
        for part in parts {
            assert!(stderr.contains(part), "{sections}: {stderr:?} lacks {part:?}");
        }
        assert!(
            !dir.path().join("out/periods.ndjson").exists(),
            "{sections}: refused before anything is written"
        );
    }
}
