//! The period billing plugin in every language gives the Rust build's
//! bytes: generated input across time zones, DST edges, duplicates, late,
//! too-old and future events and idle partitions, plus a partition of the
//! records `docs/billing.md` specifies (every refusal, unicode and escaped
//! `unique_count` values, `latest` ties, values up to 2^64 − 1), through
//! each build in local mode. FINAL and ADJUSTMENT records, dead letters
//! and the committed state (the periods' states, which a hot swap hands
//! from one build to another) must equal the Rust build's byte for byte,
//! the plugin digest aside.

use std::path::Path;
use std::process::Command;

use tally_tests::periods::{PLUGIN_CONFIG, generate, time_zones_table};
use tally_tests::tally_binary;

use crate::plugins::{
    BILLING_PERIODS, BILLING_PERIODS_C, BILLING_PERIODS_GO, BILLING_PERIODS_JS,
    BILLING_PERIODS_PYTHON, BILLING_PERIODS_TS,
};

/// The period billing plugin in each language but Rust, by name.
const PORTS: &[(&str, &str)] = &[
    ("python", BILLING_PERIODS_PYTHON),
    ("js", BILLING_PERIODS_JS),
    ("ts", BILLING_PERIODS_TS),
    ("go", BILLING_PERIODS_GO),
    ("c", BILLING_PERIODS_C),
];

/// Records of the spec in `docs/billing.md`, one or more per rule; all in
/// March 2026, in the zones of `acme` (New York) and of a customer with
/// no zone of its own (UTC).
fn spec_records() -> Vec<Vec<u8>> {
    let mut n = 0;
    let mut event = |customer: &str, metric: &str, rest: &str| {
        n += 1;
        format!(r#"{{"id":"spec-{n}","customer":{customer},"metric":{metric}{rest}}}"#).into_bytes()
    };
    let ts = r#","ts":"2026-03-10T12:00:00Z""#;
    let mut records = vec![
        // not UTF-8, not JSON, not an object
        b"{\"id\":\"bad-utf8\",\"customer\":\"\xff\",\"metric\":\"calls\",\"quantity\":1}".to_vec(),
        br#"{"id":"x","customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z"} x"#.to_vec(),
        br#"{"id":"x","customer":"acme""#.to_vec(),
        br#"{"id":"x","customer":"acme","metric":"calls","quantity":007,"ts":"2026-03-10T12:00:00Z"}"#.to_vec(),
        br#"[1,2]"#.to_vec(),
        br#""acme""#.to_vec(),
        br#"17"#.to_vec(),
        br#"null"#.to_vec(),
        // fields twice, missing, of the wrong type, with lone surrogates
        br#"{"id":"t1","id":"t2","customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z"}"#.to_vec(),
        br#"{"id":"t3","customer":"acme","metric":"calls","quantity":1,"quantity":2,"ts":"2026-03-10T12:00:00Z"}"#.to_vec(),
        br#"{"id":"t4","customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z","t\u0073":"2026-03-10T12:00:00Z"}"#.to_vec(),
        br#"{"customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z"}"#.to_vec(),
        br#"{"id":"m1","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z"}"#.to_vec(),
        br#"{"id":"m2","customer":"acme","quantity":1,"ts":"2026-03-10T12:00:00Z"}"#.to_vec(),
        br#"{"id":"m3","customer":"acme","metric":"calls","quantity":1}"#.to_vec(),
        br#"{"ts":5,"metric":"calls","quantity":1}"#.to_vec(),
        br#"{"id":5,"customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z"}"#.to_vec(),
        br#"{"id":"w1","customer":null,"metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z"}"#.to_vec(),
        br#"{"id":"w2","customer":"acme","metric":["calls"],"quantity":1,"ts":"2026-03-10T12:00:00Z"}"#.to_vec(),
        br#"{"id":"w3","customer":"acme","metric":"calls","quantity":1,"ts":{"at":1}}"#.to_vec(),
        br#"{"id":"w4","customer":"acme","metric":"calls","quantity":1,"ts":1773144000000}"#.to_vec(),
        br#"{"id":"\ud800","customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z"}"#.to_vec(),
        br#"{"id":"s1","customer":"a\udc00","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z"}"#.to_vec(),
        br#"{"id":"s2","customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z","note":"\udc00 kept"}"#.to_vec(),
        br#"{"id":"s3","customer":"acme","metric":"seats","ts":"2026-03-10T12:00:00Z","user":"\ud834"}"#.to_vec(),
        br#"{"id":"s4","customer":"acme","metric":"seats","ts":"2026-03-10T12:00:00Z","user":"\ud834\udd1e"}"#.to_vec(),
        // field names spelt with escapes are the same fields
        br#"{"\u0069d":"e1","cust\u006fmer":"acme","metric":"calls","quantity":4,"ts":"2026-03-10T12:00:00Z"}"#.to_vec(),
        // ignored fields of any kind, nested deep (128 levels read, 129 are not JSON)
        br#"{"id":"i1","customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z","x":[1e999,{"y":-0.5e-400},true,null]}"#.to_vec(),
        format!(r#"{{"id":"d1","customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z","x":{}{}}}"#, "[".repeat(127), "]".repeat(127)).into_bytes(),
        format!(r#"{{"id":"d2","customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z","x":{}{}}}"#, "[".repeat(128), "]".repeat(128)).into_bytes(),
        // ids and customers at and past the host's bounds
        format!(r#"{{"id":"{}","customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z"}}"#, "i".repeat(256)).into_bytes(),
        format!(r#"{{"id":"{}","customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z"}}"#, "i".repeat(257)).into_bytes(),
        // times the host refuses
        br#"{"id":"h1","customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10 12:00:00Z"}"#.to_vec(),
        br#"{"id":"h2","customer":"acme","metric":"calls","quantity":1,"ts":"yesterday"}"#.to_vec(),
    ];
    for (customer, metric, rest) in [
        // metrics without a meter, named with unicode and escapes
        (r#""acme""#, r#""bogus""#, format!(r#","quantity":1{ts}"#)),
        (r#""acme""#, r#""zoë \"q\" \\ \t \u0001 ☃""#, format!(r#","quantity":1{ts}"#)),
        // quantities: missing, signed, fractional, exponent, strings, too big
        (r#""acme""#, r#""calls""#, ts.to_string()),
        (r#""acme""#, r#""peak_gb""#, ts.to_string()),
        (r#""acme""#, r#""storage_gb""#, ts.to_string()),
        (r#""acme""#, r#""calls""#, format!(r#","quantity":-1{ts}"#)),
        (r#""acme""#, r#""calls""#, format!(r#","quantity":-0{ts}"#)),
        (r#""acme""#, r#""calls""#, format!(r#","quantity":1.0{ts}"#)),
        (r#""acme""#, r#""calls""#, format!(r#","quantity":1e3{ts}"#)),
        (r#""acme""#, r#""calls""#, format!(r#","quantity":1E+2{ts}"#)),
        (r#""acme""#, r#""calls""#, format!(r#","quantity":"5"{ts}"#)),
        (r#""acme""#, r#""calls""#, format!(r#","quantity":null{ts}"#)),
        (r#""acme""#, r#""calls""#, format!(r#","quantity":[ 1 , 2 ]{ts}"#)),
        (r#""acme""#, r#""calls""#, format!(r#","quantity":18446744073709551616{ts}"#)),
        (r#""acme""#, r#""calls""#, format!(r#","quantity":99999999999999999999999{ts}"#)),
        // counts read no quantity
        (r#""acme""#, r#""requests""#, ts.to_string()),
        (r#""acme""#, r#""requests""#, format!(r#","quantity":"many"{ts}"#)),
        (r#""acme""#, r#""requests""#, format!(r#","quantity":-2.5{ts}"#)),
        // values up to 2^64 − 1, and a sum past it
        ("\"big\"", r#""peak_gb""#, format!(r#","quantity":18446744073709551615{ts}"#)),
        ("\"big\"", r#""calls""#, format!(r#","quantity":18446744073709551615{ts}"#)),
        ("\"big\"", r#""calls""#, format!(r#","quantity":0{ts}"#)),
        ("\"big\"", r#""calls""#, format!(r#","quantity":1{ts}"#)),
        ("\"big\"", r#""storage_gb""#, format!(r#","quantity":18446744073709551615{ts}"#)),
        // latest: ties at one instant written with other offsets; the first read wins
        (r#""acme""#, r#""storage_gb""#, r#","quantity":7,"ts":"2026-03-10T12:00:00Z""#.into()),
        (
            r#""acme""#,
            r#""storage_gb""#,
            r#","quantity":3,"ts":"2026-03-10T07:00:00-05:00""#.into(),
        ),
        (
            r#""acme""#,
            r#""storage_gb""#,
            r#","quantity":9,"ts":"2026-03-10T11:59:59.999999999Z""#.into(),
        ),
        (
            r#""acme""#,
            r#""storage_gb""#,
            r#","quantity":2,"ts":"2026-03-10T12:00:00.000000001Z""#.into(),
        ),
        // unique_count: missing, not a string, unicode and escaped values
        (r#""acme""#, r#""seats""#, ts.to_string()),
        (r#""acme""#, r#""seats""#, format!(r#","user":7{ts}"#)),
        (r#""acme""#, r#""seats""#, format!(r#","user":{{"name" : "x"}}{ts}"#)),
        (r#""acme""#, r#""seats""#, format!(r#","user":"é"{ts}"#)),
        (r#""acme""#, r#""seats""#, format!(r#","user":"\u00e9"{ts}"#)),
        (r#""acme""#, r#""seats""#, format!(r#","user":"e\u0301"{ts}"#)),
        (r#""acme""#, r#""seats""#, format!(r#","user":"𝄞 \"\\ \n \u0000 \u001f \u007f"{ts}"#)),
        (r#""acme""#, r#""seats""#, format!(r#","user":"\ud834\udd1e"{ts}"#)),
        (r#""acme""#, r#""seats""#, format!(r#","user":"￿"{ts}"#)),
        (r#""acme""#, r#""seats""#, format!(r#","user":""{ts}"#)),
        (r#""acme""#, r#""seats""#, format!(r#","user":"a","user":"b"{ts}"#)),
        // a customer with no zone of its own, and unicode customers
        (r#""initech""#, r#""calls""#, format!(r#","quantity":5{ts}"#)),
        (r#""zoë ☃""#, r#""calls""#, format!(r#","quantity":5{ts}"#)),
        (r#""tab\there""#, r#""calls""#, format!(r#","quantity":5{ts}"#)),
    ] {
        records.push(event(customer, metric, &rest));
    }
    // a retry, and a conflicting one
    records.push(br#"{"id":"spec-1","customer":"acme","metric":"bogus","quantity":1,"ts":"2026-03-10T12:00:00Z"}"#.to_vec());
    records.push(br#"{"id":"r1","customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z"}"#.to_vec());
    records.push(br#"{"id":"r1","customer":"acme","metric":"calls","quantity":1,"ts":"2026-03-10T12:00:00Z"}"#.to_vec());
    records.push(br#"{"id":"r1","customer":"acme","metric":"calls","quantity":2,"ts":"2026-03-10T12:00:00Z"}"#.to_vec());
    records
}

/// What a run left, the plugin digest blanked.
#[derive(Debug, PartialEq)]
struct Outcome {
    periods: String,
    dead_letters: String,
    state: String,
}

/// Runs the job over the inputs in `dir` with `plugin`, in `dir/<name>`.
fn run(name: &str, plugin: &str, dir: &Path, inputs: &[String]) -> Outcome {
    let job_dir = dir.join(name);
    std::fs::create_dir_all(&job_dir).unwrap();
    let job = format!(
        "name = \"billing\"\nplugin = {plugin:?}\noutputs = [\"periods\"]\nbatch_size = 64\ncommit_interval_ms = 600000\n\
         [local]\ninputs = [{}]\noutput_dir = \"out\"\nstate_dir = \"state\"\n\
         [periods]\ntime_zones = {}\n[plugin_config]\n{PLUGIN_CONFIG}\n",
        inputs.join(", "),
        time_zones_table()
    );
    std::fs::write(job_dir.join("billing.toml"), job).unwrap();
    let output = Command::new(tally_binary())
        .arg("run")
        .arg("billing.toml")
        .current_dir(&job_dir)
        .output()
        .unwrap();
    assert!(output.status.success(), "{name}: {}", String::from_utf8_lossy(&output.stderr));
    let state = Command::new(tally_binary())
        .args(["state", "list", "--json", "--state-dir", "state"])
        .current_dir(&job_dir)
        .output()
        .unwrap();
    assert!(state.status.success(), "{name}: {}", String::from_utf8_lossy(&state.stderr));
    let read = |file: &str| std::fs::read_to_string(job_dir.join("out").join(file)).unwrap();
    Outcome {
        periods: without_digest(&read("periods.ndjson")),
        dead_letters: without_digest(&read("dead-letters.ndjson")),
        state: without_digest(&String::from_utf8(state.stdout).unwrap()),
    }
}

/// `text` with what differs from run to run blanked: each plugin digest
/// (`sha256:` and hex digits) and the wall-clock arrival a `future:` dead
/// letter names (NDJSON lines carry no time: they arrive when read).
fn without_digest(text: &str) -> String {
    let text = blank_after(text, "sha256:", |c| c.is_ascii_hexdigit());
    blank_after(&text, "past its arrival at ", |c| c.is_ascii_digit() || "-:.TZ".contains(c))
}

/// `text` with the run of characters `keep` accepts after each `marker`
/// replaced by `<blanked>`.
fn blank_after(text: &str, marker: &str, keep: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(marker) {
        let after = &rest[at + marker.len()..];
        let run = after.len() - after.trim_start_matches(&keep).len();
        out.push_str(&rest[..at + marker.len()]);
        out.push_str("<blanked>");
        rest = &after[run..];
    }
    out.push_str(rest);
    out
}

/// The first line where two texts differ, for a readable failure.
fn first_difference(what: &str, language: &str, rust: &str, port: &str) -> Option<String> {
    if rust == port {
        return None;
    }
    let (line, (r, p)) = rust
        .lines()
        .chain(std::iter::repeat("<end>"))
        .zip(port.lines().chain(std::iter::repeat("<end>")))
        .enumerate()
        .find(|(_, (r, p))| r != p)?;
    Some(format!(
        "{language}'s {what} differ from Rust's at line {}:\n  rust: {r}\n  {language}: {p}",
        line + 1
    ))
}

#[test]
fn every_languages_period_billing_plugin_gives_the_rust_ones_bytes() {
    let input = generate(0x09e7_10d5, 400);
    let dir = tempfile::tempdir().unwrap();
    let mut inputs = Vec::new();
    let mut write = |name: &str, lines: &mut dyn Iterator<Item = Vec<u8>>| {
        let path = dir.path().join(name);
        let mut text = Vec::new();
        for line in lines {
            assert!(!line.contains(&b'\n'));
            text.extend_from_slice(&line);
            text.push(b'\n');
        }
        std::fs::write(&path, text).unwrap();
        inputs.push(format!("{:?}", path.display().to_string()));
    };
    for (partition, lines) in input.partitions.iter().enumerate() {
        write(
            &format!("usage-{partition}.ndjson"),
            &mut lines.iter().map(|l| l.line.clone().into_bytes()),
        );
    }
    write("spec.ndjson", &mut spec_records().into_iter());

    let rust = run("rust", BILLING_PERIODS, dir.path(), &inputs);
    assert!(rust.periods.lines().count() > 200, "{}", rust.periods);
    for needle in [
        "\"type\":\"final\"",
        "\"type\":\"adjustment\"",
        "duplicate_conflict:",
        "malformed: event is not UTF-8",
        "the period's sum would pass",
    ] {
        assert!(
            rust.periods.contains(needle) || rust.dead_letters.contains(needle),
            "the input must exercise {needle}"
        );
    }
    let mut differences = Vec::new();
    for (language, plugin) in PORTS {
        let port = run(language, plugin, dir.path(), &inputs);
        for (what, rust, port) in [
            ("FINAL and ADJUSTMENT records", &rust.periods, &port.periods),
            ("dead letters", &rust.dead_letters, &port.dead_letters),
            ("committed state", &rust.state, &port.state),
        ] {
            differences.extend(first_difference(what, language, rust, port));
        }
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

/// A served period job, its input arriving while it runs, swaps its plugin
/// from Rust through every other language and back (Rust → Python → JS →
/// TS → Go → C → Rust): each version takes over the periods' states the
/// one before it wrote, so the FINAL and ADJUSTMENT records, the dead
/// letters and the seen ids are exactly the model's, as if one build had
/// run throughout.
#[test]
fn a_served_period_job_swaps_its_plugin_across_every_language_under_load() {
    use std::io::Write as _;
    use std::time::{Duration, Instant};

    use tally_tests::periods::expect;
    use tally_tests::serve::{ACME, ServeHost, wait_for};

    use crate::periods::{PARTITIONS, append_later, check_files, read_records_at, runs};

    /// How many pieces each partition's lines arrive in.
    const SLICES: usize = 120;
    let _serial = tally_tests::kafka::serial();
    let dir = tempfile::tempdir().unwrap();
    // The Python build takes about 12 CPU seconds to compile on an idle
    // core; the suite's other tests share the two cores, so the compile
    // gets room to spare (as in serve_kafka's swap through every language).
    let host = ServeHost::start_with(dir.path(), "max_compile_seconds = 120", "", "");
    let input = generate(37, 3000);
    let expected = expect(&runs(&input));
    let inputs = host.inputs("acme");
    for partition in 0..PARTITIONS {
        std::fs::write(inputs.join(format!("usage-{partition}.ndjson")), "").unwrap();
    }
    // The n-th piece of each partition's first-run lines (partition 4's
    // arrive after every swap, as `later`).
    let append_slice = |slice: usize| {
        for (partition, lines) in input.partitions.iter().enumerate() {
            let (from, to) = (lines.len() * slice / SLICES, lines.len() * (slice + 1) / SLICES);
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(inputs.join(format!("usage-{partition}.ndjson")))
                .unwrap();
            for line in &lines[from..to] {
                writeln!(file, "{}", line.line).unwrap();
            }
        }
    };
    let names: Vec<String> =
        (0..PARTITIONS).map(|partition| format!("\"usage-{partition}.ndjson\"")).collect();
    // Partitions go idle only after the input stops arriving: a piece
    // comes every 200 ms, well inside the idle timeout.
    let job = format!(
        "name = \"billing\"\noutputs = [\"periods\"]\n[local]\ninputs = [{}]\n\
         [periods]\nidle_timeout = \"10s\"\ntime_zones = {}\n[plugin_config]\n{PLUGIN_CONFIG}\n",
        names.join(", "),
        time_zones_table()
    );
    let acme = host.client(ACME);
    append_slice(0);
    acme.deploy(&job, &std::fs::read(BILLING_PERIODS).unwrap()).unwrap();
    let mut next_slice = 1;
    let mut under_load = Vec::new();
    for (language, plugin) in [
        ("python", BILLING_PERIODS_PYTHON),
        ("js", BILLING_PERIODS_JS),
        ("ts", BILLING_PERIODS_TS),
        ("go", BILLING_PERIODS_GO),
        ("c", BILLING_PERIODS_C),
        ("rust", BILLING_PERIODS),
    ] {
        let bytes = std::fs::read(plugin).unwrap();
        let digest = tally_core::plugin::digest(&bytes);
        acme.push("billing", &bytes).unwrap_or_else(|err| panic!("pushing {language}: {err}"));
        let deadline = Instant::now() + Duration::from_secs(180);
        // Input keeps arriving while the version takes over.
        while acme.status("billing").unwrap()["plugin"] != digest.as_str() {
            assert!(Instant::now() < deadline, "{language} never took over: {}", host.log());
            if next_slice < SLICES {
                append_slice(next_slice);
                next_slice += 1;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        under_load.push((language, next_slice < SLICES));
    }
    while next_slice < SLICES {
        append_slice(next_slice);
        next_slice += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("swaps with input still arriving: {under_load:?}");
    assert!(under_load[..3].iter().all(|(_, busy)| *busy), "{under_load:?}");
    let history = acme.history("billing").unwrap();
    let versions = history.as_array().unwrap();
    assert!(
        versions.iter().all(|version| version["status"] != "rolled_back"),
        "every version took over: {history}"
    );

    let periods = host.output("acme", "billing", "periods");
    let dead_letters = host.output("acme", "billing", "dead-letters");
    let first = expect(&runs(&input)[..1]);
    let finals_written = |path: &Path| {
        read_records_at(path).iter().filter(|record| record.value["type"] == "final").count()
    };
    wait_for("the first FINALs", Duration::from_secs(180), || {
        finals_written(&periods) >= first.finals.len()
    });
    append_later(&inputs, &input);
    wait_for("wayne's February", Duration::from_secs(180), || {
        finals_written(&periods) >= expected.finals.len()
    });
    // Idle a while longer: nothing more closes, nothing twice.
    std::thread::sleep(Duration::from_secs(3));
    check_files("acme.billing", &periods, &dead_letters, &expected);
}
