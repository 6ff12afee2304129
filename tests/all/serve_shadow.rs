//! A served period job's shadow (`POST /v1/jobs/<job>/shadow`, `tally
//! plugin push --shadow`): a candidate meter runs beside the live version
//! on the same input, through a SIGKILL of the host, into outputs of its
//! own that are never delivered; the job's status shows the running diff,
//! which matches the outputs as the test reads them and a local replay of
//! the same change; the live version's output is what a plain run gives and
//! reaches the receiver once. Another tenant cannot see or touch the
//! shadow, a shadow counts against the tenant's `max_jobs`, and `discard`
//! leaves nothing of it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tally_tests::periods::{PLUGIN_CONFIG, generate, time_zones_table};
use tally_tests::receiver::{Faults, Receiver};
use tally_tests::serve::{ACME, GLOBEX, ServeHost, number, wait_for};
use tally_tests::tally_binary;

use crate::deliver::check_applied_once;
use crate::periods::{append_later, run_to_end, write_job};
use crate::plugins;
use crate::serve::{cli, output_records, plugin};

pub(crate) const PARTITIONS: usize = 5;

/// The last `value` per key of a period output file (a period's FINAL with
/// its ADJUSTMENTs applied), read by the test itself.
pub(crate) fn settled(path: &Path) -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut values = BTreeMap::new();
    for line in text.lines() {
        let line: Value = serde_json::from_str(line).unwrap();
        values.insert(line["key"].to_string(), line["value"]["value"].clone());
    }
    values
}

/// A served period job over the input files `names` (quoted), with `extra`
/// sections (its deliveries) before its `[local]` one, whose partitions
/// are idle after `idle_timeout`.
pub(crate) fn period_job(names: &[String], extra: &str, idle_timeout: &str) -> String {
    format!(
        "name = \"billing\"\noutputs = [\"periods\"]\n{extra}\n[local]\ninputs = [{}]\n\
         [periods]\nidle_timeout = {idle_timeout:?}\ntime_zones = {}\n[plugin_config]\n{PLUGIN_CONFIG}\n",
        names.join(", "),
        time_zones_table()
    )
}

pub(crate) fn max_calls() -> String {
    PLUGIN_CONFIG.replace("calls = \"sum\"", "calls = \"max\"")
}

/// Waits until `read` of the host's files equals `expected`.
pub(crate) fn wait_settled(
    host: &ServeHost,
    what: &str,
    path: &Path,
    expected: &BTreeMap<String, Value>,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let found = settled(path);
        if &found == expected {
            return;
        }
        if std::time::Instant::now() > deadline {
            let differ: Vec<&String> = expected
                .keys()
                .chain(found.keys())
                .filter(|key| found.get(*key) != expected.get(*key))
                .take(5)
                .collect();
            panic!(
                "{what} did not settle on the reference: {} keys against {}, e.g. {differ:?}\n{}",
                found.len(),
                expected.len(),
                host.log()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_shadow_runs_beside_a_served_job_through_a_kill_and_its_diff_is_exact() {
    let receiver = Receiver::start(Faults { error_500: 50, ..Faults::default() });
    let dir = tempfile::tempdir().unwrap();
    let acme_lines = format!("[tenants.acme.deliver]\nurls = [{:?}]\n", receiver.url());
    let mut host = ServeHost::start_with(dir.path(), "", &acme_lines, "max_jobs = 1\n");
    let input = generate(91, 20_000);

    // The reference, run by the plain CLI: the live version's outputs, then
    // the same history replayed with `calls` metered as the largest quantity.
    let reference = tempfile::tempdir().unwrap();
    let job = write_job(reference.path(), &input, "");
    run_to_end(&job);
    let first_run = settled(&reference.path().join("out/periods.ndjson"));
    append_later(reference.path(), &input);
    run_to_end(&job);
    let config = reference.path().join("max-calls.toml");
    std::fs::write(&config, max_calls()).unwrap();
    let replayed = Command::new(tally_binary())
        .args(["replay", job.to_str().unwrap(), "--version", "v2", "--plugin-config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(replayed.status.success(), "{}", String::from_utf8_lossy(&replayed.stderr));
    let live_expected = settled(&reference.path().join("out/periods.ndjson"));
    let shadow_expected = settled(&reference.path().join("out/versions/v2/periods.v2.ndjson"));
    let changed: Vec<&String> = live_expected
        .iter()
        .filter(|(key, value)| shadow_expected.get(*key).is_some_and(|shadow| shadow != *value))
        .map(|(key, _)| key)
        .collect();
    assert!(!changed.is_empty(), "some period's largest call count differs from its sum");

    // The served job: the same inputs, delivered to the receiver.
    let inputs = host.inputs("acme");
    let mut names = Vec::new();
    for partition in 0..PARTITIONS {
        let name = format!("usage-{partition}.ndjson");
        let mut text = String::new();
        for line in &input.partitions[partition] {
            text.push_str(&line.line);
            text.push('\n');
        }
        std::fs::write(inputs.join(&name), text).unwrap();
        names.push(format!("{name:?}"));
    }
    let delivery = format!(
        "[[deliver]]\noutput = \"periods\"\n[deliver.http]\nurl = {:?}\nretry_initial = \"20ms\"\nretry_max = \"100ms\"\n",
        receiver.url()
    );
    let job_file = period_job(&names, &delivery, "1s");
    let acme = host.client(ACME);
    let component = plugin(plugins::BILLING_PERIODS);
    acme.deploy(&job_file, &component).unwrap();
    let live_path = host.output("acme", "billing", "periods");
    // Read to its end and idle, the job closes what a run to the end does.
    wait_settled(&host, "the live version's first part", &live_path, &first_run);

    // More input, then the candidate: the same plugin with `calls` metered
    // anew, reading the same files from their start while the live version
    // takes in the new lines.
    append_later(&inputs, &input);
    let started = acme
        .request(
            "POST",
            "/v1/jobs/billing/shadow",
            Some((
                "application/json",
                serde_json::json!({
                    "plugin": base64_of(&component),
                    "plugin_config": max_calls(),
                })
                .to_string()
                .into_bytes(),
            )),
        )
        .unwrap();
    assert_eq!(started["shadow"]["version"], "v2", "{started}");
    // One shadow at a time.
    let again = acme
        .request(
            "POST",
            "/v1/jobs/billing/shadow",
            Some((
                "application/json",
                serde_json::json!({"plugin": base64_of(&component)}).to_string().into_bytes(),
            )),
        )
        .unwrap_err();
    assert_eq!(again.status(), Some(409), "{again}");
    assert!(again.to_string().contains("discard it first"), "{again}");

    // The host killed while the shadow runs.
    wait_for("the shadow to commit", Duration::from_secs(120), || {
        number(&acme.status("billing").unwrap()["shadow"], "records") > 0
    });
    host.kill();
    host.launch();
    let acme = host.client(ACME);
    let shadow_path = host.dir.join("data/jobs/acme/billing/out/versions/v2/periods.v2.ndjson");
    wait_settled(&host, "the live version", &live_path, &live_expected);
    wait_settled(&host, "the shadow", &shadow_path, &shadow_expected);

    // The running diff matches the outputs as the test reads them.
    let (live, shadow) = (settled(&live_path), settled(&shadow_path));
    let mut diff = Value::Null;
    wait_for("the running diff to read both outputs", Duration::from_secs(60), || {
        let status = acme.status("billing").unwrap();
        diff = status["shadow"]["diff"][0].clone();
        diff["caught_up"] == true
            && diff["live_records"].as_u64() == Some(output_records(&live_path).len() as u64)
            && diff["shadow_records"].as_u64() == Some(output_records(&shadow_path).len() as u64)
    });
    assert_eq!(diff["output"], "periods");
    // A period only one version closed (the replay's partitions were
    // idle at other moments) is "only" in it.
    let only_live = live.keys().filter(|key| !shadow.contains_key(*key)).count();
    let only_shadow = shadow.keys().filter(|key| !live.contains_key(*key)).count();
    assert_eq!(diff["changed"], changed.len() as u64, "{diff}");
    assert_eq!(diff["equal"], (live.len() - changed.len() - only_live) as u64, "{diff}");
    assert_eq!(diff["only_live"], only_live as u64, "{diff}");
    assert_eq!(diff["only_shadow"], only_shadow as u64, "{diff}");
    for example in diff["examples"].as_array().unwrap() {
        let key = example["key"].to_string();
        assert!(key.contains("\"metric\":\"calls\""), "only calls changed: {key}");
        assert_eq!(example["live"], live[&key], "{key}");
        assert_eq!(example["shadow"], shadow[&key], "{key}");
        let delta = shadow[&key].as_i64().unwrap() - live[&key].as_i64().unwrap();
        assert_eq!(example["delta"], delta, "{key}");
    }
    assert_eq!(diff["examples"].as_array().unwrap().len(), changed.len().min(20));
    let status = acme.status("billing").unwrap();
    assert_eq!(status["shadow"]["state"], "running", "{status}");

    // The live version is delivered once; the shadow never.
    let live_records = output_records(&live_path);
    wait_for("the live version's records to be delivered", Duration::from_secs(120), || {
        let delivery = &acme.status("billing").unwrap()["deliveries"][0];
        delivery["delivered"].as_u64() == Some(live_records.len() as u64)
    });
    check_applied_once(&receiver, &live_records, None, 1);
    receiver.seen(|seen| {
        assert!(
            seen.requests.keys().all(|key| !key.starts_with("billing.v2/")),
            "a shadow's record was delivered"
        );
    });

    // Another tenant neither sees nor touches it; a shadow counts as a job.
    let globex = host.client(GLOBEX);
    let err = globex.request("DELETE", "/v1/jobs/billing/shadow", None).unwrap_err();
    assert_eq!(err.status(), Some(404), "{err}");
    let globex_job = period_job(&names, "", "1s");
    for partition in 0..PARTITIONS {
        let name = format!("usage-{partition}.ndjson");
        std::fs::copy(inputs.join(&name), host.inputs("globex").join(&name)).unwrap();
    }
    globex.deploy(&globex_job, &component).unwrap();
    let body = serde_json::json!({"plugin": base64_of(&component)}).to_string().into_bytes();
    let err = globex
        .request("POST", "/v1/jobs/billing/shadow", Some(("application/json", body)))
        .unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");
    assert!(err.to_string().contains("max_jobs"), "{err}");

    // Discarded: nothing of it is left, and the live version goes on.
    let discarded = acme.request("DELETE", "/v1/jobs/billing/shadow", None).unwrap();
    assert_eq!(discarded["discarded"], "v2", "{discarded}");
    assert!(!shadow_path.exists());
    assert!(!host.dir.join("data/jobs/acme/billing/state/versions/v2").exists());
    assert!(!host.dir.join("data/jobs/acme/billing/shadow").exists());
    let status = acme.status("billing").unwrap();
    assert!(status.get("shadow").is_none(), "{status}");
    assert_eq!(status["state"], "running", "{status}");
    let err = acme.request("DELETE", "/v1/jobs/billing/shadow", None).unwrap_err();
    assert_eq!(err.status(), Some(404), "{err}");
    assert_eq!(settled(&live_path), live_expected);
}

#[test]
fn the_cli_starts_and_discards_a_shadow_and_one_that_cannot_run_leaves_the_live_version_alone() {
    let dir = tempfile::tempdir().unwrap();
    let host = ServeHost::start_with(dir.path(), "", "", "");
    let input = generate(92, 200);
    let inputs = host.inputs("acme");
    let mut names = Vec::new();
    for partition in 0..PARTITIONS {
        let name = format!("usage-{partition}.ndjson");
        let text: String =
            input.partitions[partition].iter().map(|line| format!("{}\n", line.line)).collect();
        std::fs::write(inputs.join(&name), text).unwrap();
        names.push(format!("{name:?}"));
    }
    // No partition idles within the test: at lag 0 the live output is whole.
    let job_file = period_job(&names, "", "1h");
    let acme = host.client(ACME);
    acme.deploy(&job_file, &plugin(plugins::BILLING_PERIODS)).unwrap();
    wait_for("the live version to take in its input", Duration::from_secs(120), || {
        acme.status("billing").unwrap()["lag"].as_u64() == Some(0)
    });
    let live_path = host.output("acme", "billing", "periods");
    let before = std::fs::read(&live_path).unwrap();

    // A plugin config the period plugin refuses, and a plugin of the
    // wrong contract: refused at once, or the shadow stops by itself.
    let attempts = [
        serde_json::json!({"plugin": base64_of(&plugin(plugins::BILLING_PERIODS)), "plugin_config": "meters = 7"}),
        serde_json::json!({"plugin": base64_of(&plugin(plugins::USAGE_BILLING))}),
        serde_json::json!({"plugin": "not base64!"}),
        serde_json::json!({"plugin": base64_of(b"\0asm not a component")}),
    ];
    // The CLI: a shadow started from a file and a table, shown, discarded.
    let config = dir.path().join("max-calls.toml");
    std::fs::write(&config, max_calls()).unwrap();
    let (ok, out) = cli(
        &host,
        ACME,
        &[
            "plugin",
            "push",
            "billing",
            plugins::BILLING_PERIODS,
            "--shadow",
            "--plugin-config",
            config.to_str().unwrap(),
        ],
    );
    assert!(ok, "{out}");
    assert!(out.contains("started a shadow of `billing` as v2"), "{out}");
    wait_for("the CLI's shadow to compare its output", Duration::from_secs(60), || {
        let (ok, out) = cli(&host, ACME, &["jobs", "status", "billing"]);
        assert!(ok, "{out}");
        out.contains("shadow v2 (running)") && out.contains("changed {\"customer\"")
    });
    let (ok, out) = cli(&host, ACME, &["plugin", "discard", "billing"]);
    assert!(ok && out.contains("discarded the shadow of `billing` (v2)"), "{out}");
    let (ok, out) = cli(&host, ACME, &["plugin", "discard", "billing"]);
    assert!(!ok && out.contains("has no shadow"), "{out}");
    // A number is never taken again: not after a discard, nor by the job
    // deployed again under its name.
    let push = ["plugin", "push", "billing", plugins::BILLING_PERIODS, "--shadow", "--json"];
    let version_of = |out: &str| -> Value {
        serde_json::from_str::<Value>(out).unwrap()["shadow"]["version"].clone()
    };
    let (ok, out) = cli(&host, ACME, &push);
    assert!(ok && version_of(&out) == "v3", "{out}");
    acme.delete("billing").unwrap();
    acme.deploy(&job_file, &plugin(plugins::BILLING_PERIODS)).unwrap();
    let (ok, out) = cli(&host, ACME, &push);
    assert!(ok && version_of(&out) == "v4", "{out}");
    acme.request("DELETE", "/v1/jobs/billing/shadow", None).unwrap();
    wait_for("the job deployed again to take in its input", Duration::from_secs(120), || {
        acme.status("billing").unwrap()["lag"].as_u64() == Some(0)
    });

    for attempt in attempts {
        let body = attempt.to_string().into_bytes();
        match acme.request("POST", "/v1/jobs/billing/shadow", Some(("application/json", body))) {
            Err(err) => {
                let status = err.status().unwrap_or(0);
                assert!((400..500).contains(&status), "{err}");
            }
            Ok(_) => {
                wait_for("the shadow to stop", Duration::from_secs(60), || {
                    let shadow = acme.status("billing").unwrap()["shadow"].clone();
                    (shadow["state"] == "failed" || shadow["state"] == "paused")
                        && shadow["last_error"].is_string()
                });
                acme.request("DELETE", "/v1/jobs/billing/shadow", None).unwrap();
            }
        }
        let status = acme.status("billing").unwrap();
        assert_eq!(status["state"], "running", "{status}");
        assert_eq!(std::fs::read(&live_path).unwrap(), before, "a shadow touched the live output");
    }
}

pub(crate) fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
