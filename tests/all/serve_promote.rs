//! A served period job's shadow promoted (`POST /v1/jobs/<job>/promote`,
//! `tally plugin promote`) while the job delivers to the test receiver,
//! with the host SIGKILLed during the promotion and again while the
//! corrections go out: every period is billed once, each period the
//! shadow changes gets one correcting ADJUSTMENT from the billed value,
//! the others nothing; the shadow's version goes on as the live one, with
//! its meters, and the old version never runs again. Another tenant can
//! neither promote the job nor see it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use tally_tests::periods::generate;
use tally_tests::receiver::{Faults, Receiver};
use tally_tests::serve::{ACME, GLOBEX, JsonApi, ServeHost, wait_for};

use crate::periods::{append_later, run_to_end, write_job};
use crate::plugins;
use crate::serve::{cli, output_records, plugin};
use crate::serve_shadow::{PARTITIONS, base64_of, max_calls, period_job, settled, wait_settled};
use crate::versions::{
    assert_corrected_once, billed, billed_values, chain_holds, settled_periods, tally,
};

/// The references, by the plain CLI: the live version's outputs (`v1`),
/// and the history replayed with `calls` metered as the largest quantity
/// (`v2`, with `config`).
struct Reference {
    dir: tempfile::TempDir,
    job: std::path::PathBuf,
    config: std::path::PathBuf,
    v1: std::path::PathBuf,
    v2: std::path::PathBuf,
}

impl Reference {
    fn of(input: &tally_tests::periods::PeriodInput) -> Reference {
        let dir = tempfile::tempdir().unwrap();
        let job = write_job(dir.path(), input, "");
        run_to_end(&job);
        let config = dir.path().join("max-calls.toml");
        std::fs::write(&config, max_calls()).unwrap();
        let (job_arg, config_arg) = (job.to_str().unwrap(), config.to_str().unwrap());
        tally(&["replay", job_arg, "--version", "v2", "--plugin-config", config_arg]);
        let v1 = dir.path().join("out/periods.ndjson");
        let v2 = dir.path().join("out/versions/v2/periods.v2.ndjson");
        assert_eq!(
            settled_periods(&v1).keys().collect::<Vec<_>>(),
            settled_periods(&v2).keys().collect::<Vec<_>>(),
            "both versions close the same periods"
        );
        Reference { dir, job, config, v1, v2 }
    }
}

/// Writes `input` as acme's input files; their names, quoted.
fn write_inputs(host: &ServeHost, input: &tally_tests::periods::PeriodInput) -> Vec<String> {
    let mut names = Vec::new();
    for partition in 0..PARTITIONS {
        let name = format!("usage-{partition}.ndjson");
        let text: String =
            input.partitions[partition].iter().map(|line| format!("{}\n", line.line)).collect();
        std::fs::write(host.inputs("acme").join(&name), text).unwrap();
        names.push(format!("{name:?}"));
    }
    names
}

/// The periods whose value in `now` differs from the last one billed
/// (some, not all: the test would prove little otherwise).
fn changed_periods<'a>(
    before: &crate::versions::Billed,
    now: &'a BTreeMap<String, Value>,
) -> Vec<&'a String> {
    let changed: Vec<&String> = now
        .iter()
        .filter(|(period, value)| before[*period].last().unwrap().1["value"] != **value)
        .map(|(period, _)| period)
        .collect();
    assert!(changed.len() > 3 && changed.len() < now.len(), "{} of {}", changed.len(), now.len());
    changed
}

/// Starts a shadow of acme's job `billing` running `component` (with
/// `plugin_config`, if given).
fn start_shadow(acme: &JsonApi, component: &[u8], plugin_config: Option<String>) {
    let body = serde_json::json!({"plugin": base64_of(component), "plugin_config": plugin_config});
    acme.request(
        "POST",
        "/v1/jobs/billing/shadow",
        Some(("application/json", body.to_string().into_bytes())),
    )
    .unwrap();
}

/// Waits until the receiver holds `expected` (per period, its last value).
fn wait_billed(host: &ServeHost, receiver: &Receiver, expected: &BTreeMap<String, Value>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while &billed_values(&billed(receiver)) != expected {
        assert!(
            std::time::Instant::now() < deadline,
            "the receiver never held the expected values\n{}",
            host.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_promoted_shadow_corrects_each_changed_period_once_through_kills() {
    let receiver = Receiver::start(Faults {
        error_500: 50,
        latency: Duration::from_millis(5),
        ..Faults::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let acme_lines = format!("[tenants.acme.deliver]\nurls = [{:?}]\n", receiver.url());
    let mut host = ServeHost::start_with(dir.path(), "", &acme_lines, "");
    let input = generate(93, 2_000);

    let Reference { dir: reference, job, config, v1: v1_reference, v2: v2_reference } =
        Reference::of(&input);
    let job_arg = job.to_str().unwrap();
    let v2 = settled_periods(&v2_reference);

    // The served job, delivered; then its shadow with `calls` as `max`.
    let inputs = host.inputs("acme");
    let names = write_inputs(&host, &input);
    let delivery = format!(
        "[[deliver]]\noutput = \"periods\"\n[deliver.http]\nurl = {:?}\nmax_in_flight = 2\nretry_initial = \"20ms\"\nretry_max = \"100ms\"\n",
        receiver.url()
    );
    let acme = host.client(ACME);
    let component = plugin(plugins::BILLING_PERIODS);
    acme.deploy(&period_job(&names, &delivery, "1s"), &component).unwrap();
    let live_path = host.output("acme", "billing", "periods");
    wait_settled(&host, "the live version", &live_path, &settled(&v1_reference));
    let v1_records = output_records(&live_path).len() as u64;
    wait_for("the live version to be delivered", Duration::from_secs(120), || {
        acme.status("billing").unwrap()["deliveries"][0]["delivered"].as_u64() == Some(v1_records)
    });
    let before = billed(&receiver);
    assert_eq!(billed_values(&before), settled_periods(&v1_reference), "v1 billed whole");
    let changed = changed_periods(&before, &v2);
    start_shadow(&acme, &component, Some(max_calls()));
    let shadow_path = host.dir.join("data/jobs/acme/billing/out/versions/v2/periods.v2.ndjson");
    wait_settled(&host, "the shadow", &shadow_path, &settled(&v2_reference));

    // Another tenant cannot promote it.
    let err = host.client(GLOBEX).request("POST", "/v1/jobs/billing/promote", None).unwrap_err();
    assert_eq!(err.status(), Some(404), "{err}");
    assert_eq!(acme.status("billing").unwrap()["output_version"], "v1");

    // The host killed while it promotes, later each time: after the
    // restart the promotion happened whole or not at all. Once it has
    // not, it is made again, or at last by the CLI without a kill.
    let mut promoted = false;
    for delay in [100, 300, 700, 1500, 3000] {
        // The kill is to fall in the promotion, not in the shadow's start
        // after the last restart (which the promotion would wait out).
        wait_for("the shadow to run", Duration::from_secs(120), || {
            host.client(ACME).status("billing").unwrap()["shadow"]["state"] == "running"
        });
        let promoting = {
            let server = host.server.clone();
            std::thread::spawn(move || {
                JsonApi::new(&server, Some(ACME)).request("POST", "/v1/jobs/billing/promote", None)
            })
        };
        std::thread::sleep(Duration::from_millis(delay));
        host.kill();
        let answered = promoting.join().unwrap();
        host.launch();
        let status = host.client(ACME).status("billing").unwrap();
        let version = status["output_version"].as_str().unwrap_or_default().to_string();
        eprintln!("killed {delay} ms into the promotion: {version} live ({answered:?})");
        match version.as_str() {
            "v1" => assert_eq!(status["shadow"]["version"], "v2", "{status}"),
            "v2" => {
                assert!(status.get("shadow").is_none(), "{status}");
                promoted = true;
                break;
            }
            other => panic!("output_version {other:?}: {status}"),
        }
    }
    let acme = host.client(ACME);
    if !promoted {
        let (ok, out) = cli(&host, ACME, &["plugin", "promote", "billing"]);
        assert!(ok, "{out}");
        assert!(out.contains("v2 is live (was v1)"), "{out}");
        let corrections = format!("{} correcting records for values already billed", changed.len());
        assert!(out.contains(&corrections), "{out}");
    }
    let status = acme.status("billing").unwrap();
    assert_eq!(status["output_version"], "v2", "{status}");
    let err = acme.request("POST", "/v1/jobs/billing/promote", None).unwrap_err();
    assert_eq!(err.status(), Some(404), "no shadow left to promote: {err}");

    // Killed again while the corrections go out.
    let corrections = |receiver: &Receiver| {
        receiver
            .seen(|seen| seen.applied.keys().filter(|key| key.ends_with("/promotion-1")).count())
    };
    wait_for("a correction to reach the receiver", Duration::from_secs(60), || {
        corrections(&receiver) > 0
    });
    host.kill();
    host.launch();
    wait_billed(&host, &receiver, &v2);

    // One ADJUSTMENT per changed period, from the value billed, under a key
    // of its own; nothing for the others.
    let after = billed(&receiver);
    assert_corrected_once((&before, &after), &changed, &v2, ("acme.billing.v2/", "/promotion-1"));
    chain_holds(&after);

    // v2 goes on as the live version, with its own meters, and its later
    // records continue the receiver's versions; v1 never runs again.
    let v1_then = std::fs::read(&live_path).unwrap();
    append_later(&inputs, &input);
    append_later(reference.path(), &input);
    tally(&["replay", job_arg, "--version", "v2", "--plugin-config", config.to_str().unwrap()]);
    wait_billed(&host, &receiver, &settled_periods(&v2_reference));
    let last = billed(&receiver);
    chain_holds(&last);
    assert!(
        last.values().map(Vec::len).sum::<usize>() > after.values().map(Vec::len).sum::<usize>(),
        "v2 went on"
    );
    assert_eq!(std::fs::read(&live_path).unwrap(), v1_then, "v1 ran after its promotion");
    receiver.seen(|seen| {
        for (key, requests) in &seen.requests {
            assert!(requests.iter().all(|body| *body == requests[0]), "{key} sent with two bodies");
        }
    });

    // A new shadow takes the next number and reads all the input at once
    // (so an idle partition closes other periods than it did for v2); its
    // promotion by the CLI corrects exactly the periods whose billed value
    // it changes, and sends nothing else.
    start_shadow(&acme, &component, None);
    let status = acme.status("billing").unwrap();
    assert_eq!(status["shadow"]["version"], "v3", "{status}");
    tally(&["replay", job_arg, "--version", "v3", "--plugin-config", config.to_str().unwrap()]);
    let v3_reference = reference.path().join("out/versions/v3/periods.v3.ndjson");
    let v3_path = host.dir.join("data/jobs/acme/billing/out/versions/v3/periods.v3.ndjson");
    wait_settled(&host, "the second shadow", &v3_path, &settled(&v3_reference));
    let holds = billed_values(&last);
    let v3 = settled_periods(&v3_reference);
    let changing: Vec<&String> = v3
        .iter()
        .filter(|(period, value)| holds.get(*period) != Some(*value))
        .map(|(p, _)| p)
        .collect();
    eprintln!(
        "v3 changes {} billed periods and has not written {}",
        changing.len(),
        holds.keys().filter(|period| !v3.contains_key(*period)).count()
    );
    let (ok, out) = cli(&host, ACME, &["plugin", "promote", "billing", "--json"]);
    assert!(ok, "{out}");
    let promoted: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((&promoted["version"], &promoted["from"]), (&"v3".into(), &"v2".into()), "{out}");
    let switched = &promoted["deliveries"][0];
    assert_eq!(switched["adjustments"], changing.len(), "{out}");
    assert_eq!(switched["never_billed"], 0, "{out}");
    let unwritten = holds.keys().filter(|period| !v3.contains_key(*period)).count();
    assert_eq!(switched["waiting"], unwritten, "{out}");
    let mut expected = holds.clone();
    expected.extend(v3.clone());
    wait_billed(&host, &receiver, &expected);
    let third = billed(&receiver);
    for (period, bodies) in &third {
        let new = &bodies[last[period].len()..];
        assert_eq!(new.len(), usize::from(changing.contains(&period)), "{period}: {new:?}");
        if let Some((key, _)) = new.first() {
            assert!(key.starts_with("acme.billing.v3/") && key.ends_with("/promotion-2"), "{key}");
        }
    }
    chain_holds(&third);
    assert_eq!(acme.status("billing").unwrap()["output_version"], "v3");
    assert!(host.dir.join("data/jobs/acme/billing/state/versions/v2").exists(), "v2's state stays");
    let (ok, out) = cli(&host, ACME, &["plugin", "promote", "billing"]);
    assert!(!ok && out.contains("has no shadow to promote"), "{out}");
    // A promoted job's delivery, once removed, is not added again: it would
    // send v3's records as new ones to a receiver holding v1's and v2's.
    acme.set_deliveries("billing", "").unwrap();
    let err = acme.set_deliveries("billing", &delivery).unwrap_err();
    assert_eq!(err.status(), Some(400), "{err}");
    assert!(err.to_string().contains("runs v3 (promoted)"), "{err}");
}

/// Per period (as [`billed`] names them), the rows of a PostgreSQL
/// delivery's table, in version order: idempotency key and value.
fn rows(database: &mut postgres::Client, table: &str) -> crate::versions::Billed {
    let mut periods = crate::versions::Billed::new();
    for row in
        database.query(&format!("SELECT idempotency_key, value::text FROM {table}"), &[]).unwrap()
    {
        let value: Value = serde_json::from_str(row.get::<_, &str>(1)).unwrap();
        let period = format!("{}/{}/{}", value["customer"], value["metric"], value["period"]);
        periods.entry(period).or_default().push((row.get(0), value));
    }
    for bodies in periods.values_mut() {
        bodies.sort_by_key(|(_, value)| value["version"].as_i64());
    }
    periods
}

#[test]
fn a_promoted_shadow_switches_a_postgres_delivery_with_one_correcting_row_per_changed_period() {
    let table = format!("promoted_periods_{}", std::process::id());
    let mut database = crate::deliver::database();
    database.batch_execute(&format!("DROP TABLE IF EXISTS {table}")).unwrap();
    database
        .execute("DELETE FROM tally_delivery_positions WHERE target_table = $1", &[&table])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let acme_lines =
        format!("[tenants.acme.deliver]\npostgres_url = {:?}\n", crate::deliver::postgres_url());
    let mut host = ServeHost::start_with(dir.path(), "", &acme_lines, "");
    let input = generate(94, 1_000);
    let reference = Reference::of(&input);
    let (v1, v2) = (settled_periods(&reference.v1), settled_periods(&reference.v2));

    let names = write_inputs(&host, &input);
    let delivery =
        format!("[[deliver]]\noutput = \"periods\"\n[deliver.postgres]\ntable = {table:?}\n");
    let acme = host.client(ACME);
    let component = plugin(plugins::BILLING_PERIODS);
    acme.deploy(&period_job(&names, &delivery, "1s"), &component).unwrap();
    let live_path = host.output("acme", "billing", "periods");
    wait_settled(&host, "the live version", &live_path, &settled(&reference.v1));
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while billed_values(&rows(&mut database, &table)) != v1 {
        assert!(std::time::Instant::now() < deadline, "v1 never reached the table\n{}", host.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    let before = rows(&mut database, &table);
    let changed = changed_periods(&before, &v2);
    start_shadow(&acme, &component, Some(max_calls()));
    let shadow_path = host.dir.join("data/jobs/acme/billing/out/versions/v2/periods.v2.ndjson");
    wait_settled(&host, "the shadow", &shadow_path, &settled(&reference.v2));
    let promoted = acme.request("POST", "/v1/jobs/billing/promote", None).unwrap();
    assert_eq!(promoted["deliveries"][0]["adjustments"], changed.len(), "{promoted}");
    // Killed and started again at once: the switch is applied once.
    host.kill();
    host.launch();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while billed_values(&rows(&mut database, &table)) != v2 {
        assert!(std::time::Instant::now() < deadline, "v2 never reached the table\n{}", host.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    let after = rows(&mut database, &table);
    assert_corrected_once((&before, &after), &changed, &v2, ("acme.billing.v2/", "/promotion-1"));
    chain_holds(&after);
    // The delivery reads v2's output from where the switch put it: the
    // positions are v2's, and v2's records already there are not rows.
    let status = host.client(ACME).status("billing").unwrap();
    assert_eq!(status["output_version"], "v2", "{status}");
    let rows_now: i64 =
        database.query_one(&format!("SELECT count(*) FROM {table}"), &[]).unwrap().get(0);
    let expected = before.values().map(Vec::len).sum::<usize>() + changed.len();
    assert_eq!(rows_now as usize, expected);
    database.batch_execute(&format!("DROP TABLE {table}")).unwrap();
}
