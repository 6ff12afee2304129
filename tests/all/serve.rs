//! `tally serve` as a child process: tenancy, bad requests, automatic
//! rollback of a failing plugin version, and a SIGKILLed host resuming its
//! jobs. (Swaps of a Kafka job under load are in `serve_kafka`.)

use std::time::Duration;

use serde_json::Value;
use tally_tests::serve::{
    ACME, GLOBEX, JsonApi, METRICS, ServeHost, append_lines, local_job, number, wait_for,
};
use tally_tests::{UsageLine, expected_totals, final_totals, read_totals, usage_lines};

use crate::plugins;

pub(crate) fn plugin(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

pub(crate) fn digest_of(path: &str) -> String {
    tally_core::plugin::digest(&plugin(path))
}

/// A served local job's committed output lines at `path`: (idempotency
/// key, the line's key, value) in order.
pub(crate) fn output_records(path: &std::path::Path) -> Vec<(String, String, serde_json::Value)> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|line| {
            let line: serde_json::Value = serde_json::from_str(line).unwrap();
            let key = line["idempotency_key"].as_str().unwrap().to_string();
            (key, line["key"].to_string(), line["value"].clone())
        })
        .collect()
}

/// Writes `lines` as input `file` of `tenant`, in the tenant's input directory.
pub(crate) fn write_input(host: &ServeHost, tenant: &str, file: &str, lines: &[UsageLine]) {
    append_lines(&host.inputs(tenant).join(file), lines);
}

/// The names of the jobs `client`'s tenant sees, as listed.
pub(crate) fn job_names(client: &JsonApi) -> Vec<String> {
    client
        .list()
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|job| job["name"].as_str().unwrap().to_string())
        .collect()
}

/// Waits until the job's committed records reach `records` and nothing is left to read.
pub(crate) fn wait_caught_up(client: &JsonApi, job: &str, records: u64, host: &ServeHost) {
    wait_for(&format!("job `{job}` to commit {records} records"), Duration::from_secs(120), || {
        let status = client.status(job).unwrap();
        assert_ne!(status["state"], "failed", "job `{job}` failed: {status}\n{}", host.log());
        number(&status, "records") >= records && status["lag"].as_u64() == Some(0)
    });
}

/// The final totals of a local job equal the independently computed ones,
/// and every input line contributed exactly one total or dead letter.
pub(crate) fn check_local_totals(
    host: &ServeHost,
    tenant: &str,
    job: &str,
    lines: &[UsageLine],
) -> Vec<tally_tests::TotalLine> {
    let totals = read_totals(&host.output(tenant, job, "totals"));
    assert_eq!(
        final_totals(&totals),
        expected_totals(lines),
        "job `{job}` of `{tenant}` computed wrong totals"
    );
    let dead = tally_tests::read_dead_letters(&host.output(tenant, job, "dead-letters"));
    let good = lines.iter().filter(|line| line.effect.is_some()).count();
    assert_eq!(totals.len(), good, "each good line gives exactly one total");
    assert_eq!(dead.len(), lines.len() - good, "each bad line is dead-lettered exactly once");
    totals
}

pub(crate) fn refused(result: Result<Value, tally_host::client::ClientError>) -> (u16, String) {
    match result {
        Ok(value) => panic!("expected a refusal, got {value}"),
        Err(err) => {
            (err.status().unwrap_or_else(|| panic!("not an HTTP refusal: {err}")), err.to_string())
        }
    }
}

#[test]
fn a_tenant_cannot_see_or_touch_another_tenants_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let host = ServeHost::start(dir.path(), 32 << 20);
    let lines = usage_lines(41, 5_000, 10);
    write_input(&host, "acme", "usage.ndjson", &lines);
    let acme = host.client(ACME);
    acme.deploy(&local_job("billing", &["usage.ndjson"], ""), &plugin(plugins::USAGE_BILLING))
        .unwrap();
    wait_caught_up(&acme, "billing", lines.len() as u64, &host);

    let globex = host.client(GLOBEX);
    assert_eq!(globex.list().unwrap(), serde_json::json!([]), "globex sees none of acme's jobs");
    let key = r#"{"customer":"acme","metric":"api_calls","period":"2026-11"}"#;
    let attempts: Vec<(&str, Result<Value, _>)> = vec![
        ("status", globex.status("billing")),
        ("pause", globex.pause("billing")),
        ("resume", globex.resume("billing")),
        ("state", globex.state_get("billing", key)),
        ("history", globex.history("billing")),
        ("push", globex.push("billing", &plugin(plugins::BILLING_VARIANT))),
        ("rollback", globex.rollback("billing")),
        ("delete", globex.delete("billing")),
    ];
    let missing = refused(JsonApi::new(&host.server, Some(GLOBEX)).status("no-such-job"));
    for (what, result) in attempts {
        let (status, message) = refused(result);
        assert_eq!(status, 404, "{what}: {message}");
        assert_eq!(
            message,
            missing.1.replace("no-such-job", "billing"),
            "{what}: another tenant's job must look like no job at all"
        );
    }
    for (client, why) in [
        (JsonApi::new(&host.server, None), "no token"),
        (host.client("not-a-token-at-all"), "a wrong token"),
    ] {
        for result in [client.list(), client.status("billing"), client.delete("billing")] {
            let (status, message) = refused(result);
            assert_eq!(status, 401, "{why}: {message}");
        }
    }
    let (status, _) = refused(acme.request("GET", "/metrics", None));
    assert_eq!(status, 403, "a tenant's token does not read every tenant's metrics");

    // Acme's job is untouched: still running, still its own plugin, and its state answers.
    let status = acme.status("billing").unwrap();
    assert_eq!(status["state"], "running", "{status}");
    assert_eq!(status["plugin"], digest_of(plugins::USAGE_BILLING));
    let expected = expected_totals(&lines);
    let (customer, metric, period) = expected.keys().next().unwrap().clone();
    let key =
        serde_json::json!({ "customer": customer, "metric": metric, "period": period }).to_string();
    let value = acme.state_get("billing", &key).unwrap();
    assert_eq!(value["value"].as_u64(), Some(expected[&(customer, metric, period)]), "{value}");
    check_local_totals(&host, "acme", "billing", &lines);
}

#[test]
fn bad_requests_are_refused_with_a_reason_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let host = ServeHost::start(dir.path(), 600_000);
    let lines = usage_lines(42, 2_000, 0);
    write_input(&host, "acme", "usage.ndjson", &lines);
    let acme = host.client(ACME);
    acme.deploy(&local_job("billing", &["usage.ndjson"], ""), &plugin(plugins::USAGE_BILLING))
        .unwrap();
    wait_caught_up(&acme, "billing", lines.len() as u64, &host);
    let history_before = acme.history("billing").unwrap();
    let data_before = tree(&host.dir.join("data/jobs"));

    let billing = plugin(plugins::USAGE_BILLING);
    let good_job = local_job("other", &["usage.ndjson"], "");
    let cases: Vec<(&str, Result<Value, _>, u16, &str)> = vec![
        ("malformed TOML", acme.deploy("name = \"x\"\noutputs = [", &billing), 400, "not valid TOML"),
        ("unknown field", acme.deploy(&format!("{good_job}colour = \"red\"\n"), &billing), 400, "unknown field `colour`"),
        ("input outside the tenant's directory", acme.deploy(&local_job("other", &["../globex/usage.ndjson"], ""), &billing), 400, "without `..`"),
        ("missing input", acme.deploy(&local_job("other", &["nowhere.ndjson"], ""), &billing), 400, "input `nowhere.ndjson` does not exist"),
        ("host-owned field", acme.deploy(&good_job.replace("[local]", "[local]\nstate_dir = \"/tmp/x\""), &billing), 400, "remove `state_dir`"),
        (
            "another tenant's topic",
            acme.deploy("name = \"k\"\noutputs = [\"totals\"]\n[kafka]\ninputs = [\"globex.usage\"]\noutputs = { totals = \"acme.totals\" }\ndead_letter_topic = \"acme.dead\"\n", &billing),
            400,
            "not one of tenant `acme`'s",
        ),
        (
            "missing topics",
            acme.deploy("name = \"k\"\noutputs = [\"totals\"]\n[kafka]\ninputs = [\"acme.nothing-here\"]\noutputs = { totals = \"acme.nothing-here-totals\" }\ndead_letter_topic = \"acme.nothing-here-dead\"\n", &billing),
            400,
            "do not exist",
        ),
        ("a name Kafka would confuse", acme.deploy(&local_job("my_job", &["usage.ndjson"], ""), &billing), 400, "only letters, digits and `-`"),
        ("not a component", acme.deploy(&good_job, b"\0asm\x01\0\0\0"), 422, "not a component"),
        ("import not allowed", acme.deploy(&good_job, &plugin(plugins::IMPORTS_SOCKETS)), 422, "wasi:sockets"),
        ("wrong WIT version", acme.deploy(&good_job, &plugin(plugins::WRONG_WIT_VERSION)), 422, "0.1.0"),
        ("oversized upload", acme.deploy(&good_job, &vec![0u8; 700_000]), 413, "max_upload_bytes"),
        ("missing token", JsonApi::new(&host.server, None).deploy(&good_job, &billing), 401, "Authorization"),
        ("not JSON", acme.request("POST", "/v1/jobs", Some(("application/json", b"{oops".to_vec()))), 400, "must be JSON"),
        ("existing name", acme.deploy(&local_job("billing", &["usage.ndjson"], ""), &billing), 409, "already exists"),
        ("push of a non-component", acme.push("billing", b"not wasm at all"), 422, "not a WebAssembly file"),
        ("push of a plugin with a forbidden import", acme.push("billing", &plugin(plugins::IMPORTS_SOCKETS)), 422, "wasi:sockets"),
        ("oversized push", acme.push("billing", &vec![0u8; 700_000]), 413, "max_upload_bytes"),
        ("rollback with no earlier version", acme.rollback("billing"), 409, "no earlier version"),
        ("unknown path", acme.request("GET", "/v1/nothing", None), 404, "not part of the admin API"),
    ];
    for (what, result, expected_status, expected_text) in cases {
        let (status, message) = refused(result);
        assert_eq!(status, expected_status, "{what}: {message}");
        assert!(
            message.contains(expected_text),
            "{what}: the message should say {expected_text:?}: {message}"
        );
        assert!(
            !message.contains(&host.dir.display().to_string()),
            "{what}: the host's paths stay the host's: {message}"
        );
    }
    assert_eq!(acme.list().unwrap().as_array().unwrap().len(), 1, "no job was added");

    assert_eq!(acme.history("billing").unwrap(), history_before, "no plugin version was recorded");
    assert_eq!(
        tree(&host.dir.join("data/jobs")),
        data_before,
        "nothing was written to the data directory"
    );
    assert_eq!(acme.status("billing").unwrap()["plugin"], digest_of(plugins::USAGE_BILLING));
    check_local_totals(&host, "acme", "billing", &lines);
    // A tenant's job quota.
    write_input(&host, "globex", "usage.ndjson", &lines[..10]);
    let globex = host.client(GLOBEX);
    for name in ["g1", "g2", "g3"] {
        globex.deploy(&local_job(name, &["usage.ndjson"], ""), &billing).unwrap();
    }
    let (status, message) =
        refused(globex.deploy(&local_job("g4", &["usage.ndjson"], ""), &billing));
    assert_eq!(status, 409, "{message}");
    assert!(message.contains("max_jobs"), "{message}");
    assert_eq!(globex.list().unwrap().as_array().unwrap().len(), 3);
}

/// Every file under `dir` but the job's state and outputs (which a running
/// job writes), with its size.
fn tree(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name =
                path.strip_prefix(dir.ancestors().last().unwrap()).unwrap().display().to_string();
            if path.is_dir() {
                if !matches!(path.file_name().and_then(|n| n.to_str()), Some("state" | "out")) {
                    stack.push(path);
                }
            } else {
                files.push((name, path.metadata().unwrap().len()));
            }
        }
    }
    files.sort();
    files
}

#[test]
fn a_plugin_that_traps_on_its_first_batch_is_rolled_back_and_nothing_of_it_commits() {
    let dir = tempfile::tempdir().unwrap();
    let host = ServeHost::start(dir.path(), 32 << 20);
    let lines = usage_lines(43, 40_000, 5);
    let (first, rest) = lines.split_at(20_000);
    write_input(&host, "acme", "usage.ndjson", first);
    let acme = host.client(ACME);
    acme.deploy(&local_job("billing", &["usage.ndjson"], ""), &plugin(plugins::USAGE_BILLING))
        .unwrap();
    wait_caught_up(&acme, "billing", first.len() as u64, &host);

    let trap = acme.push("billing", &plugin(plugins::BILLING_TRAP)).unwrap();
    assert_eq!(trap["status"], "pending");
    // Idle, the job takes the version at once; its trial waits for input.
    wait_for("the pushed version to start its trial", Duration::from_secs(30), || {
        acme.status("billing").unwrap()["on_trial"] == trap["digest"]
    });
    write_input(&host, "acme", "usage.ndjson", rest);
    wait_caught_up(&acme, "billing", lines.len() as u64, &host);

    let good = digest_of(plugins::USAGE_BILLING);
    let status = acme.status("billing").unwrap();
    assert_eq!(status["plugin"], good, "the job runs the previous version again: {status}");
    assert_eq!(number(&status, "rollbacks"), 1, "{status}");
    let last_swap = status["last_swap"].as_str().unwrap();
    assert!(
        last_swap.contains("rolled back") && last_swap.contains("period table is empty"),
        "the status says why: {last_swap}"
    );
    let history = acme.history("billing").unwrap();
    let versions = history.as_array().unwrap();
    assert_eq!(versions.len(), 2);
    assert_eq!(
        (versions[0]["status"].as_str(), versions[1]["status"].as_str()),
        (Some("active"), Some("rolled_back")),
        "{history}"
    );
    assert!(versions[1]["reason"].as_str().unwrap().contains("first transaction"), "{history}");
    let metrics = host.client(METRICS).metrics().unwrap();
    let rollbacks = metric(&metrics, "tally_plugin_rollbacks_total", "billing");
    assert_eq!(rollbacks, 1.0, "metrics show the rollback:\n{metrics}");
    assert!(metric(&metrics, "tally_plugin_traps_total", "billing") >= 1.0, "{metrics}");
    assert_eq!(
        metric(&metrics, "tally_records_in_total", "billing"),
        lines.len() as f64,
        "committed records counted once:\n{metrics}"
    );

    // Exactly once: the trapping version's work was aborted and redone.
    let totals = check_local_totals(&host, "acme", "billing", &lines);
    let trap_digest = &trap["digest"].as_str().unwrap()[..23];
    let text = std::fs::read_to_string(host.output("acme", "billing", "totals")).unwrap();
    assert!(!text.contains(trap_digest), "no output of the rolled-back version was committed");
    assert!(totals.len() > first.len());
}

/// The value of `name{..., job="<job>"}` in Prometheus text.
pub(crate) fn metric(text: &str, name: &str, job: &str) -> f64 {
    let label = format!("job=\"{job}\"");
    text.lines()
        .find(|line| line.starts_with(&format!("{name}{{")) && line.contains(&label))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {name} for job {job} in:\n{text}"))
}

#[test]
fn a_killed_host_resumes_every_job_where_it_committed() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = ServeHost::start(dir.path(), 32 << 20);
    let acme_lines = usage_lines(44, 300_000, 2);
    let globex_lines = usage_lines(45, 300_000, 2);
    // Two thirds of each input now, the rest once the host is killed: the
    // kill lands before the jobs can have read everything, however fast.
    let held_back = 200_000;
    let write_parts = |host: &ServeHost, acme: &[UsageLine], globex: &[UsageLine]| {
        for index in 0..2 {
            let part = |lines: &[UsageLine]| {
                lines.iter().skip(index).step_by(2).cloned().collect::<Vec<_>>()
            };
            write_input(host, "acme", &format!("usage-{index}.ndjson"), &part(acme));
            write_input(host, "globex", &format!("usage-{index}.ndjson"), &part(globex));
        }
    };
    write_parts(&host, &acme_lines[..held_back], &globex_lines[..held_back]);
    let inputs = ["usage-0.ndjson", "usage-1.ndjson"];
    let (acme, globex) = (host.client(ACME), host.client(GLOBEX));
    acme.deploy(
        &local_job("billing", &inputs, "commit_interval_ms = 20"),
        &plugin(plugins::USAGE_BILLING),
    )
    .unwrap();
    acme.deploy(&local_job("paused", &inputs, ""), &plugin(plugins::USAGE_BILLING)).unwrap();
    acme.pause("paused").unwrap();
    globex
        .deploy(
            &local_job("billing", &inputs, "commit_interval_ms = 20"),
            &plugin(plugins::BILLING_VARIANT),
        )
        .unwrap();
    wait_for("both jobs to have committed something", Duration::from_secs(60), || {
        number(&acme.status("billing").unwrap(), "commits") > 2
            && number(&globex.status("billing").unwrap(), "commits") > 2
    });
    let before = number(&acme.status("billing").unwrap(), "records");
    host.kill();
    assert!(
        before < acme_lines.len() as u64,
        "the kill must land mid-run (committed {before} of {})",
        acme_lines.len()
    );
    write_parts(&host, &acme_lines[held_back..], &globex_lines[held_back..]);

    host.launch();
    let (acme, globex) = (host.client(ACME), host.client(GLOBEX));
    assert_eq!(job_names(&acme), ["billing", "paused"]);
    assert_eq!(
        acme.status("paused").unwrap()["state"],
        "paused",
        "a paused job stays paused across a restart"
    );
    assert_eq!(
        globex.status("billing").unwrap()["plugin"],
        digest_of(plugins::BILLING_VARIANT),
        "each job keeps its plugin version"
    );
    // After the restart, the status counts only what the new host committed.
    wait_for("both jobs to read their inputs to the end", Duration::from_secs(120), || {
        [&acme, &globex].iter().all(|client| {
            let status = client.status("billing").unwrap();
            status["lag"].as_u64() == Some(0) && number(&status, "commits") > 0
        })
    });
    check_local_totals(&host, "acme", "billing", &acme_lines);
    check_local_totals(&host, "globex", "billing", &globex_lines);

    acme.resume("paused").unwrap();
    wait_caught_up(&acme, "paused", acme_lines.len() as u64, &host);
    check_local_totals(&host, "acme", "paused", &acme_lines);
    assert!(host.terminate(), "SIGTERM stops the host cleanly:\n{}", host.log());
}

#[test]
fn a_job_that_cannot_be_resumed_is_listed_as_broken_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = ServeHost::start(dir.path(), 32 << 20);
    let lines = usage_lines(47, 2_000, 0);
    write_input(&host, "acme", "usage.ndjson", &lines);
    let acme = host.client(ACME);
    for name in ["billing", "doomed"] {
        acme.deploy(&local_job(name, &["usage.ndjson"], ""), &plugin(plugins::USAGE_BILLING))
            .unwrap();
    }
    assert!(host.terminate(), "SIGTERM stops the host cleanly:\n{}", host.log());
    // Someone removes a job's plugin file while the host is down.
    let plugins_dir = dir.path().join("data/jobs/acme/doomed/plugins");
    for entry in std::fs::read_dir(&plugins_dir).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }

    host.launch();
    let acme = host.client(ACME);
    let listed = acme.list().unwrap();
    let jobs = listed.as_array().unwrap();
    let states: Vec<(&str, &str)> = jobs
        .iter()
        .map(|job| (job["name"].as_str().unwrap(), job["state"].as_str().unwrap()))
        .collect();
    assert!(states.contains(&("doomed", "broken")), "{listed}");
    assert!(!states.contains(&("billing", "broken")), "{listed}");
    let doomed = jobs.iter().find(|job| job["name"] == "doomed").unwrap();
    assert!(
        doomed["last_error"].as_str().unwrap().contains("plugin"),
        "the reason names what is wrong: {doomed}"
    );
    assert_eq!(acme.status("doomed").err().and_then(|err| err.status()), Some(409));
    assert!(
        host.client(GLOBEX).list().unwrap().as_array().unwrap().is_empty(),
        "another tenant does not see it"
    );

    acme.delete("doomed").unwrap();
    assert_eq!(job_names(&acme), ["billing"]);
    assert!(host.terminate(), "SIGTERM stops the host cleanly:\n{}", host.log());
}

/// Runs the `tally` CLI against `host` as `token`; returns (success, stdout + stderr).
pub(crate) fn cli(host: &ServeHost, token: &str, args: &[&str]) -> (bool, String) {
    let output = std::process::Command::new(tally_tests::tally_binary())
        .args(args)
        .env("TALLY_SERVER", &host.server)
        .env("TALLY_TOKEN", token)
        .output()
        .unwrap();
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[test]
fn the_cli_deploys_pauses_resumes_pushes_rolls_back_queries_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let host = ServeHost::start(dir.path(), 32 << 20);
    let lines = usage_lines(46, 30_000, 5);
    let (first, rest) = lines.split_at(10_000);
    write_input(&host, "acme", "usage.ndjson", first);
    let job_file = dir.path().join("billing.toml");
    // The same job file as for `tally run`, plugin line included: the CLI uploads it.
    std::fs::write(
        &job_file,
        format!(
            "plugin = {:?}\n{}",
            plugins::USAGE_BILLING,
            local_job("billing", &["usage.ndjson"], "")
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let (ok, text) = cli(&host, ACME, args);
        assert!(ok, "tally {args:?} failed:\n{text}\n{}", host.log());
        text
    };
    let deployed = run(&["jobs", "deploy", job_file.to_str().unwrap()]);
    assert!(deployed.contains("name:") && deployed.contains("billing"), "{deployed}");
    let acme = host.client(ACME);
    wait_caught_up(&acme, "billing", first.len() as u64, &host);
    let table = run(&["jobs", "list"]);
    assert!(
        table.starts_with("JOB") && table.contains("billing") && table.contains("running"),
        "{table}"
    );
    let listed: Value = serde_json::from_str(&run(&["jobs", "list", "--json"])).unwrap();
    assert_eq!(listed[0]["records"].as_u64(), Some(first.len() as u64), "{listed}");

    // Paused, the job reads nothing more; resumed, it catches up.
    assert!(run(&["jobs", "pause", "billing"]).contains("paused"));
    wait_for("the job to pause", Duration::from_secs(30), || {
        acme.status("billing").unwrap()["state"] == "paused"
    });
    write_input(&host, "acme", "usage.ndjson", rest);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        number(&acme.status("billing").unwrap(), "records"),
        first.len() as u64,
        "a paused job processes nothing"
    );
    run(&["jobs", "resume", "billing"]);
    wait_caught_up(&acme, "billing", lines.len() as u64, &host);

    // Push a second build, then roll back to the first.
    let pushed = run(&["plugin", "push", "billing", plugins::BILLING_VARIANT]);
    assert!(pushed.contains(&digest_of(plugins::BILLING_VARIANT)), "{pushed}");
    let more = usage_lines(47, 2_000, 0);
    write_input(&host, "acme", "usage.ndjson", &more);
    wait_for("the pushed build to become active", Duration::from_secs(30), || {
        acme.status("billing").unwrap()["plugin"] == digest_of(plugins::BILLING_VARIANT)
    });
    run(&["plugin", "rollback", "billing"]);
    let again = usage_lines(48, 2_000, 0);
    write_input(&host, "acme", "usage.ndjson", &again);
    wait_for("the rollback to become active", Duration::from_secs(30), || {
        acme.status("billing").unwrap()["plugin"] == digest_of(plugins::USAGE_BILLING)
    });
    let history = run(&["plugin", "history", "billing"]);
    assert_eq!(history.lines().filter(|line| line.contains("sha256:")).count(), 3, "{history}");
    let all: Vec<UsageLine> = lines.iter().chain(&more).chain(&again).cloned().collect();
    wait_caught_up(&acme, "billing", all.len() as u64, &host);
    check_local_totals(&host, "acme", "billing", &all);

    // An interactive query through the CLI.
    let expected = expected_totals(&all);
    let ((customer, metric, period), total) = expected.iter().next().unwrap();
    let key =
        serde_json::json!({ "customer": customer, "metric": metric, "period": period }).to_string();
    assert_eq!(run(&["state", "get", "billing", &key]).trim(), total.to_string());

    // Errors are said plainly, and delete removes everything.
    let (ok, text) = cli(&host, GLOBEX, &["jobs", "status", "billing"]);
    assert!(!ok && text.contains("no job named `billing`") && text.contains("404"), "{text}");
    let (ok, text) = cli(&host, "wrong-token-0000000000", &["jobs", "list"]);
    assert!(!ok && text.contains("not recognised"), "{text}");
    run(&["jobs", "delete", "billing"]);
    assert_eq!(acme.list().unwrap(), serde_json::json!([]));
    assert!(!host.dir.join("data/jobs/acme/billing").exists(), "the job's files are gone");
    let (ok, text) = cli(&host, ACME, &["jobs", "status", "billing"]);
    assert!(!ok && text.contains("404"), "{text}");
}
