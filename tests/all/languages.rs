//! The billing plugin in every language computes the same bytes: one
//! generated input (month edges, time-zone offsets, unicode names, very
//! large quantities, and bad records of every kind `docs/billing.md`
//! names) through each build in local mode; outputs, dead letters and the
//! final state must equal the Rust build's byte for byte, the plugin digest
//! aside.

use std::path::{Path, PathBuf};

use tally_core::plugin::PluginRuntime;
use tally_core::settings::JobSettings;
use tally_local::{LocalConfig, LocalTask};
use tally_tests::{Rng, usage_lines};

use crate::plugins;

/// Records `docs/billing.md` names, one or more of each rule.
fn edge_records() -> Vec<Vec<u8>> {
    let event = |customer: &str, quantity: &str, ts: &str| {
        format!(
            r#"{{"customer":{customer},"metric":"api_calls","quantity":{quantity},"ts":"{ts}"}}"#
        )
        .into_bytes()
    };
    let mut records: Vec<Vec<u8>> = vec![
        // unicode, escapes and quotes in names; a key spelled with an escape
        event(r#""zoë ☃ 𝄞""#, "1", "2026-11-03T10:00:00Z"),
        event(r#""tab\there \"quoted\" back\\slash \u00e9 \ud834\udd1e""#, "2", "2026-11-03T10:00:00Z"),
        br#"{"cust\u006fmer":"escaped-key","metric":"m","quantity":3,"ts":"2026-11-03T10:00:00Z"}"#.to_vec(),
        event(r#""control \u0001 \u001f del \u007f""#, "4", "2026-11-03T10:00:00Z"),
        // offsets across month and year edges, fractions, leap day and second, lowercase t/z
        event(r#""edges""#, "5", "2026-12-31T23:30:00-01:00"),
        event(r#""edges""#, "6", "2027-01-01T00:10:00+00:30"),
        event(r#""edges""#, "7", "2024-02-29T12:00:00.123456789012Z"),
        event(r#""edges""#, "8", "2026-06-30T23:59:60-00:00"),
        event(r#""edges""#, "9", "2026-11-03t10:00:00z"),
        event(r#""edges""#, "10", "0000-01-01T00:00:00+01:00"),
        event(r#""edges""#, "11", "9999-12-31T23:00:00-02:00"),
        // very large quantities, up to the overflow
        event(r#""big""#, "18446744073709551000", "2026-11-03T10:00:00Z"),
        event(r#""big""#, "615", "2026-11-03T10:00:00Z"),
        event(r#""big""#, "1", "2026-11-03T10:00:00Z"),
        event(r#""big2""#, "18446744073709551616", "2026-11-03T10:00:00Z"),
        // quantities that are not non-negative integers
        event(r#""q""#, "-3", "2026-11-03T10:00:00Z"),
        event(r#""q""#, "-0", "2026-11-03T10:00:00Z"),
        event(r#""q""#, "2.5", "2026-11-03T10:00:00Z"),
        event(r#""q""#, "1e3", "2026-11-03T10:00:00Z"),
        event(r#""q""#, "3.0", "2026-11-03T10:00:00Z"),
        event(r#""q""#, "1E400", "2026-11-03T10:00:00Z"),
        event(r#""q""#, r#""5""#, "2026-11-03T10:00:00Z"),
        event(r#""q""#, "null", "2026-11-03T10:00:00Z"),
        // timestamps that are not RFC 3339
        event(r#""t""#, "1", "2026-02-29T00:00:00Z"),
        event(r#""t""#, "1", "2026-11-03 10:00:00Z"),
        event(r#""t""#, "1", "2026-11-03T24:00:00Z"),
        event(r#""t""#, "1", "2026-11-03T10:00:61Z"),
        event(r#""t""#, "1", "2026-11-03T10:00:00"),
        event(r#""t""#, "1", "2026-11-03T10:00:00.Z"),
        event(r#""t""#, "1", "2026-11-03T10:00:00+24:00"),
        event(r#""t""#, "1", "2026-13-03T10:00:00Z"),
        event(r#""t""#, "1", "26-11-03T10:00:00Z"),
        event(r#""t""#, "1", "yesterday"),
        event(r#""t""#, "1", "２026-11-03T10:00:00Z"),
        br#"{"customer":"t","metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z\u0000"}"#.to_vec(),
        // fields missing, twice, or of the wrong type; other fields ignored
        br#"{"metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z"}"#.to_vec(),
        br#"{"customer":"a","metric":"m","quantity":1}"#.to_vec(),
        br#"{"customer":"a","customer":"b","metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z"}"#.to_vec(),
        br#"{"ts":5,"customer":"a","metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z"}"#.to_vec(),
        br#"{"customer":7,"metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z"}"#.to_vec(),
        br#"{"customer":7,"quantity":1,"ts":"2026-11-03T10:00:00Z"}"#.to_vec(),
        br#"{"customer":"a","metric":"m","quantity":"1","ts":"\ud800"}"#.to_vec(),
        br#"{"customer":"a","metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z","note":"\udc00 lone"}"#.to_vec(),
        br#"{"customer":"a","metric":["m"],"quantity":1,"ts":"2026-11-03T10:00:00Z"}"#.to_vec(),
        br#"{"customer":"a","metric":"m","quantity":1,"ts":{"at":"2026-11-03T10:00:00Z"}}"#.to_vec(),
        br#"{"quantity":1,"ts":"2026-11-03T10:00:00Z","extra":[1,{"x":1e999}],"customer":"order","metric":"m"}"#.to_vec(),
        // nesting: 128 levels in an ignored field are read, 129 are not JSON
        format!(r#"{{"customer":"deep","metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z","x":{}{}}}"#, "[".repeat(127), "]".repeat(127)).into_bytes(),
        format!(r#"{{"customer":"deep","metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z","x":{}{}}}"#, "[".repeat(128), "]".repeat(128)).into_bytes(),
        format!(r#"{{"customer":"deep","metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z","x":"{}"}}"#, "[".repeat(300)).into_bytes(),
        format!(r#"{{"customer":"deep","metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z","x":{}1{}}}"#, "[".repeat(50_000), "]".repeat(50_000)).into_bytes(),
        // not an object, not JSON, not UTF-8
        b"[1,2,3]".to_vec(),
        b"\"a string\"".to_vec(),
        b"42".to_vec(),
        b"1e400".to_vec(),
        // around the least number that rounds to infinity as a double, 2^1024 - 2^970
        b"1.7976931348623157e308".to_vec(),
        b"-1.7976931348623159e308".to_vec(),
        b"179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497791.9e-0".to_vec(),
        b"0.179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792000e309".to_vec(),
        b"null".to_vec(),
        b"not json at all".to_vec(),
        br#"{"customer":"a","metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z",}"#.to_vec(),
        br#"{"customer":"a","metric":"m","quantity":01,"ts":"2026-11-03T10:00:00Z"}"#.to_vec(),
        br#"{"customer":"\ud800","metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z"}"#.to_vec(),
        br#"{"customer":"a","metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z"} x"#.to_vec(),
        b"{\"customer\":\"a\xff\",\"metric\":\"m\",\"quantity\":1,\"ts\":\"2026-11-03T10:00:00Z\"}".to_vec(),
        b"{\"customer\":\"\xed\xa0\x80\",\"metric\":\"m\",\"quantity\":1,\"ts\":\"2026-11-03T10:00:00Z\"}".to_vec(),
        b"{\"customer\":\"raw\ttab\",\"metric\":\"m\",\"quantity\":1,\"ts\":\"2026-11-03T10:00:00Z\"}".to_vec(),
    ];
    // Random names from a mixed alphabet, with escapes.
    let mut rng = Rng::new(16);
    let alphabet = ["a", "Z", "é", "☃", "𝄞", "\\\"", "\\\\", "\\n", "\\u00e9", " ", "-"];
    for _ in 0..300 {
        let name: String = (0..1 + rng.below(12))
            .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
            .collect();
        records.push(event(
            &format!("\"{name}\""),
            &rng.below(1 << 40).to_string(),
            "2026-11-30T23:59:59.5-00:01",
        ));
    }
    records
}

/// Writes `records` round-robin into two NDJSON files (the lines must hold
/// no newline).
fn write_inputs(dir: &Path, records: &[Vec<u8>]) -> Vec<PathBuf> {
    let paths: Vec<PathBuf> = (0..2).map(|file| dir.join(format!("usage-{file}.ndjson"))).collect();
    let mut contents = vec![Vec::new(), Vec::new()];
    for (index, record) in records.iter().enumerate() {
        assert!(!record.contains(&b'\n'));
        contents[index % 2].extend_from_slice(record);
        contents[index % 2].push(b'\n');
    }
    for (path, content) in paths.iter().zip(contents) {
        std::fs::write(path, content).unwrap();
    }
    paths
}

/// What a run left: each output file with the plugin digest blanked, and
/// the final state.
#[derive(Debug, PartialEq)]
struct Outcome {
    totals: String,
    dead_letters: String,
    state: Vec<(Vec<u8>, Vec<u8>)>,
}

fn run(plugin: &str, dir: &Path, inputs: &[PathBuf], batch_size: usize) -> Outcome {
    let runtime = PluginRuntime::new().unwrap();
    // Python and JavaScript components take seconds to compile: keep the
    // compiled form beside the built plugins for the next run.
    let cache = Path::new(plugin).parent().unwrap().join("compiled");
    let loaded = runtime.load_file_cached(Path::new(plugin), &cache).unwrap();
    let mut settings = JobSettings::new("billing", plugin.into(), vec!["totals".into()]);
    settings.batch_size = batch_size;
    let local = LocalConfig {
        inputs: inputs.to_vec(),
        output_dir: dir.join("out"),
        state_dir: dir.join("state"),
        confine_to: None,
        output_suffix: String::new(),
    };
    let mut task = LocalTask::open(&settings, &local, &loaded).unwrap();
    let summary = task.run().unwrap();
    assert!(summary.records > 0);
    let digest = &loaded.digest()[..23]; // as lineage writes it: `sha256:` and 16 hex digits
    let read = |name: &str| {
        std::fs::read_to_string(dir.join("out").join(name))
            .unwrap()
            .replace(digest, "sha256:<digest>")
    };
    let state = task.store().scan_state().unwrap();
    Outcome { totals: read("totals.ndjson"), dead_letters: read("dead-letters.ndjson"), state }
}

/// The billing plugin in each language but Rust, by name.
const PORTS: &[(&str, &str)] = &[
    ("js", plugins::USAGE_BILLING_JS),
    ("python", plugins::USAGE_BILLING_PYTHON),
    ("go", plugins::USAGE_BILLING_GO),
    ("c", plugins::USAGE_BILLING_C),
];

#[test]
fn every_languages_billing_plugin_computes_the_rust_ones_bytes() {
    let mut records = edge_records();
    records.extend(usage_lines(2026, 3_000, 40).into_iter().map(|line| line.line.into_bytes()));
    let dir = tempfile::tempdir().unwrap();
    let inputs = write_inputs(dir.path(), &records);
    // The same batches (the order the partitions' records interleave in
    // follows the batches), so every byte can be compared.
    let rust = run(plugins::USAGE_BILLING, &dir.path().join("rust"), &inputs, 256);
    assert!(
        rust.dead_letters.lines().count() > 60 && rust.totals.lines().count() > 2_000,
        "{rust:?}"
    );
    for (language, plugin) in PORTS {
        let port = run(plugin, &dir.path().join(language), &inputs, 256);
        for (what, rust, port) in [
            ("totals", &rust.totals, &port.totals),
            ("dead letters", &rust.dead_letters, &port.dead_letters),
        ] {
            if let Some((line, (r, p))) =
                rust.lines().zip(port.lines()).enumerate().find(|(_, (r, p))| r != p)
            {
                panic!(
                    "{language}: {what} differ first at line {line}:\n   rust: {r}\n {language:>6}: {p}"
                );
            }
            assert_eq!(rust.lines().count(), port.lines().count(), "{language}: {what}");
        }
        assert_eq!(rust.state, port.state, "{language}: the final states differ");
    }
}
