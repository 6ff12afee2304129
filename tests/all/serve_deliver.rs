//! A served job's `[[deliver]]` section: its committed output delivered to
//! a real HTTP receiver on loopback (`tally_tests::receiver`, failing on
//! purpose) beside the job, through a SIGKILL of the host; the status and
//! `/metrics` show it; a tenant reaches only the URLs the operator allows
//! it, and never sets the secret header.

use std::time::Duration;

use serde_json::Value;
use tally_tests::receiver::{Faults, Receiver};
use tally_tests::serve::{ACME, METRICS, ServeHost, local_job, number, wait_for};
use tally_tests::{expected_totals, final_totals, read_totals, usage_lines};

use crate::deliver::check_applied_once;
use crate::plugins;
use crate::serve::{output_records, plugin, wait_caught_up, write_input};

/// A served local job's committed `totals` lines: (idempotency key, the
/// line's key, value) in order.
fn committed_records(host: &ServeHost, job: &str) -> Vec<(String, String, Value)> {
    output_records(&host.output("acme", job, "totals"))
}

/// Waits until the job's delivery of `totals` has delivered `records`.
fn wait_delivered(host: &ServeHost, job: &str, records: u64) -> Value {
    let acme = host.client(ACME);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let last = acme.status(job).unwrap()["deliveries"][0].clone();
        if last["delivered"].as_u64() == Some(records) && last["retrying"].as_u64() == Some(0) {
            return last;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {records} records delivered: {last}\n{}",
            host.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_served_job_delivers_its_output_once_through_a_host_kill() {
    let receiver = Receiver::start(Faults {
        error_500: 100,
        too_many: 50,
        drop_after_apply: 100,
        ..Faults::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let acme_lines = format!("[tenants.acme.deliver]\nurls = [{:?}]\n", receiver.url());
    let mut host = ServeHost::start_with(dir.path(), "", &acme_lines, "");
    let lines = usage_lines(51, 1_500, 0);
    let (first, rest) = lines.split_at(900);
    let (second, third) = rest.split_at(500);
    write_input(&host, "acme", "usage.ndjson", first);
    let delivery = format!(
        "[[deliver]]\noutput = \"totals\"\n[deliver.http]\nurl = {:?}\ntimeout = \"2s\"\nretry_initial = \"50ms\"\nretry_max = \"200ms\"\n",
        receiver.url()
    );
    let acme = host.client(ACME);
    acme.deploy(
        &local_job("billing", &["usage.ndjson"], &delivery),
        &plugin(plugins::USAGE_BILLING),
    )
    .unwrap();
    wait_caught_up(&acme, "billing", first.len() as u64, &host);
    let delivered_first = committed_records(&host, "billing").len() as u64;
    wait_delivered(&host, "billing", delivered_first);

    // Killed once the second part is being delivered.
    write_input(&host, "acme", "usage.ndjson", second);
    wait_for("the second part to be delivered in part", Duration::from_secs(120), || {
        number(&acme.status("billing").unwrap()["deliveries"][0], "delivered") > delivered_first
    });
    host.kill();
    write_input(&host, "acme", "usage.ndjson", third);
    host.launch();
    let acme = host.client(ACME);
    wait_caught_up(&acme, "billing", third.len() as u64, &host);
    let totals = read_totals(&host.output("acme", "billing", "totals"));
    assert_eq!(final_totals(&totals), expected_totals(&lines));
    let records = committed_records(&host, "billing");
    let status = wait_delivered(&host, "billing", records.len() as u64);
    assert_eq!(status["output"], "totals");
    assert_eq!(status["target"], "http");
    assert_eq!(status["state"], "running", "{status}");
    assert_eq!(status["unknown"], 0, "{status}");
    assert_eq!(status["failed"], 0, "{status}");
    check_applied_once(&receiver, &records, None, 10);

    let metrics = host.client(METRICS).metrics().unwrap();
    let delivered = format!(
        "tally_delivery_records{{tenant=\"acme\",job=\"billing\",output=\"totals\",state=\"delivered\"}} {}",
        records.len()
    );
    assert!(metrics.contains(&delivered), "/metrics lacks `{delivered}`:\n{metrics}");
    assert!(
        metrics.contains(
            "tally_delivery_running{tenant=\"acme\",job=\"billing\",output=\"totals\"} 1"
        )
    );

    // Nothing waits as unknown; a resolve of a key that does not wait is refused.
    let unknown = acme.request("GET", "/v1/jobs/billing/deliveries/totals/unknown", None).unwrap();
    assert_eq!(unknown, serde_json::json!([]));
    let body = serde_json::json!({"key": records[0].0, "applied": false}).to_string();
    let refused = acme
        .request(
            "POST",
            "/v1/jobs/billing/deliveries/totals/resolve",
            Some(("application/json", body.into_bytes())),
        )
        .unwrap_err()
        .to_string();
    assert!(refused.contains("waits as unknown"), "{refused}");

    // A deleted job's delivery stops with it; its files go too.
    acme.delete("billing").unwrap();
    let posts = receiver.seen(|seen| seen.posts);
    write_input(&host, "acme", "usage.ndjson", &usage_lines(52, 50, 0));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(receiver.seen(|seen| seen.posts), posts, "a deleted job's delivery kept sending");
    assert!(!host.dir.join("data/jobs/acme/billing").exists());
    let metrics = host.client(METRICS).metrics().unwrap();
    assert!(!metrics.contains("job=\"billing\",output=\"totals\""), "{metrics}");
}

#[test]
fn a_tenant_delivers_only_where_the_operator_allows_it() {
    let receiver = Receiver::start(Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let acme_lines = format!("[tenants.acme.deliver]\nurls = [{:?}]\n", receiver.url());
    let host = ServeHost::start_with(dir.path(), "", &acme_lines, "");
    write_input(&host, "acme", "usage.ndjson", &usage_lines(53, 10, 0));
    let acme = host.client(ACME);
    let billing = plugin(plugins::USAGE_BILLING);
    let job = |deliver: &str| local_job("billing", &["usage.ndjson"], deliver);
    let http =
        |url: &str| format!("[[deliver]]\noutput = \"totals\"\n[deliver.http]\nurl = {url:?}\n");
    let admin = format!("{}/v1/jobs", host.server);
    let sideways = receiver.url().replace("/usage", "/usage/../admin");
    let cases: Vec<(&str, String, &str)> = vec![
        ("the host's own admin API", http(&admin), "is not under a URL tenant `acme` may deliver to"),
        ("a path that climbs out", http(&sideways), "is not under a URL tenant `acme` may deliver to"),
        ("another port", http(&receiver.url().replace(&receiver.address, "127.0.0.1:1")), "deliver.urls"),
        (
            "a lookup elsewhere",
            format!("{}lookup_url = {:?}\n", http(&receiver.url()), format!("{admin}/{{key}}")),
            "http.lookup_url",
        ),
        (
            "a secret file of the host's",
            format!("{}secret_file = \"/etc/shadow\"\n", http(&receiver.url())),
            "remove `secret_file`",
        ),
        ("a database of its own", "[[deliver]]\noutput = \"totals\"\n[deliver.postgres]\ntable = \"t\"\nurl = \"postgres://x@127.0.0.1/db\"\n".into(), "remove `url`"),
        ("no database from the operator", "[[deliver]]\noutput = \"totals\"\n[deliver.postgres]\ntable = \"t\"\n".into(), "no deliver.postgres_url"),
        ("an output the job does not have", "[[deliver]]\noutput = \"nope\"\n[deliver.http]\nurl = \"x\"\n".into(), "must be one of the job's outputs"),
        ("too many requests in flight", format!("{}max_in_flight = 200\n", http(&receiver.url())), "max_in_flight may be at most 32"),
        ("a request that may hang for ten years", format!("{}timeout = \"3650d\"\n", http(&receiver.url())), "http.timeout may be at most 60s on this host"),
        ("a connection that may hang for an hour", format!("{}connect_timeout = \"1h\"\n", http(&receiver.url())), "http.connect_timeout may be at most 60s"),
    ];
    for (what, deliver, expected) in cases {
        let err = acme.deploy(&job(&deliver), &billing).unwrap_err().to_string();
        assert!(err.contains(expected), "{what}: {err}");
    }
    assert_eq!(acme.list().unwrap(), serde_json::json!([]), "a refused deploy deployed nothing");
    assert_eq!(receiver.seen(|seen| seen.posts), 0);
}

#[test]
fn a_served_job_delivers_into_the_tenants_database_once() {
    let table = format!("served_totals_{}", std::process::id());
    let mut database = crate::deliver::database();
    database.batch_execute(&format!("DROP TABLE IF EXISTS {table}")).unwrap();
    database
        .execute("DELETE FROM tally_delivery_positions WHERE delivery = 'acme.billing/totals'", &[])
        .ok();
    let dir = tempfile::tempdir().unwrap();
    let acme_lines =
        format!("[tenants.acme.deliver]\npostgres_url = {:?}\n", crate::deliver::postgres_url());
    let host = ServeHost::start_with(dir.path(), "", &acme_lines, "");
    let lines = usage_lines(54, 700, 0);
    write_input(&host, "acme", "usage.ndjson", &lines);
    let delivery =
        format!("[[deliver]]\noutput = \"totals\"\n[deliver.postgres]\ntable = {table:?}\n");
    let acme = host.client(ACME);
    acme.deploy(
        &local_job("billing", &["usage.ndjson"], &delivery),
        &plugin(plugins::USAGE_BILLING),
    )
    .unwrap();
    wait_caught_up(&acme, "billing", lines.len() as u64, &host);
    let records = committed_records(&host, "billing");
    // A PostgreSQL delivery's rows are counted in the database; its status
    // has the position, which reaches the committed output's end.
    let end = std::fs::metadata(host.output("acme", "billing", "totals")).unwrap().len();
    wait_for("the delivery's position to reach the output's end", Duration::from_secs(120), || {
        let status = acme.status("billing").unwrap()["deliveries"][0].clone();
        assert_eq!(status["target"], "postgres");
        status["positions"]["0"].as_u64() == Some(end)
    });
    let row = database
        .query_one(&format!("SELECT count(*), count(DISTINCT idempotency_key) FROM {table}"), &[])
        .unwrap();
    let (rows, keys): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!((rows, keys), (records.len() as i64, records.len() as i64));
    let position: i64 = database
        .query_one(
            "SELECT max(output_offset) FROM tally_delivery_positions WHERE delivery = 'acme.billing/totals'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(position > 0, "the delivery's position is in the tenant's database");
    database.batch_execute(&format!("DROP TABLE {table}")).unwrap();
}

#[test]
fn a_served_kafka_job_delivers_its_topic_with_its_ledger_mirrored() {
    use tally_tests::kafka::{
        KafkaBillingJob, committed_progress, delete_topics, group_reader, produce_usage,
        read_topic, serial, unique,
    };
    let _serial = serial();
    let receiver = Receiver::start(Faults { error_500: 100, ..Faults::default() });
    let dir = tempfile::tempdir().unwrap();
    let acme_lines = format!("[tenants.acme.deliver]\nurls = [{:?}]\n", receiver.url());
    let host = ServeHost::start_with(dir.path(), "", &acme_lines, "");
    let job = KafkaBillingJob::create("acme.deliver", 2);
    let name = unique("deliver");
    let job_file = format!(
        "name = {name:?}\noutputs = [\"totals\"]\n[[deliver]]\noutput = \"totals\"\n[deliver.http]\n\
         url = {url:?}\nretry_initial = \"50ms\"\nretry_max = \"200ms\"\n\
         [kafka]\ninputs = [{input:?}]\noutputs = {{ totals = {totals:?} }}\ndead_letter_topic = {dead:?}\n",
        url = receiver.url(),
        input = job.input,
        totals = job.totals,
        dead = job.dead_letters,
    );
    let acme = host.client(ACME);
    acme.deploy(&job_file, &plugin(plugins::USAGE_BILLING)).unwrap();
    let lines = usage_lines(58, 1_000, 0);
    produce_usage(&job.input, &lines, 2);
    let group = group_reader(&format!("tally-acme.{name}"));
    wait_for("the job to commit every record", Duration::from_secs(120), || {
        committed_progress(&group, &job.input, 2) == lines.len() as i64
    });
    let records: Vec<(String, String, Value)> = read_topic(&job.totals, true)
        .iter()
        .map(|record| {
            let key: Value = serde_json::from_slice(record.key.as_deref().unwrap()).unwrap();
            let value = serde_json::from_slice(&record.value).unwrap();
            (record.header("tally.idempotency-key").to_string(), key.to_string(), value)
        })
        .collect();
    let ledger_topic = format!("tally-acme.{name}.totals.delivery-ledger");
    let status = wait_delivered(&host, &name, records.len() as u64);
    let positions = status["positions"].as_object().unwrap().len();
    acme.delete(&name).unwrap();
    let mirrored = read_topic(&ledger_topic, false).len();
    delete_topics(&[&ledger_topic, &format!("tally-acme.{name}-state-changelog")]);
    assert_eq!(positions, 2, "a position per output partition: {status}");
    check_applied_once(&receiver, &records, None, 5);
    assert!(mirrored >= records.len(), "every entry is mirrored: {mirrored} records");
}

#[test]
fn a_served_jobs_delivery_changes_in_place_and_goes_on_from_its_ledger() {
    use tally_tests::serve::GLOBEX;

    let (first_receiver, second_receiver) =
        (Receiver::start(Faults::default()), Receiver::start(Faults::default()));
    let dir = tempfile::tempdir().unwrap();
    let acme_lines = format!(
        "[tenants.acme.deliver]\nurls = [{:?}, {:?}]\npostgres_url = \"postgres://acme@127.0.0.1:1/acme\"\n",
        first_receiver.url(),
        second_receiver.url()
    );
    let mut host = ServeHost::start_with(dir.path(), "", &acme_lines, "");
    let lines = usage_lines(59, 900, 0);
    let (first, rest) = lines.split_at(300);
    let (second, third) = rest.split_at(300);
    write_input(&host, "acme", "usage.ndjson", first);
    let http = |url: &str, extra: &str| {
        format!("[[deliver]]\noutput = \"totals\"\n[deliver.http]\nurl = {url:?}\n{extra}")
    };
    let acme = host.client(ACME);
    acme.deploy(
        &local_job("billing", &["usage.ndjson"], &http(&first_receiver.url(), "")),
        &plugin(plugins::USAGE_BILLING),
    )
    .unwrap();
    wait_caught_up(&acme, "billing", first.len() as u64, &host);
    let before = committed_records(&host, "billing").len();
    wait_delivered(&host, "billing", before as u64);

    // Refused, each naming what to do, and nothing changes.
    let body_changed = http(&second_receiver.url(), "body = \"record\"\n");
    let postgres = "[[deliver]]\noutput = \"totals\"\n[deliver.postgres]\ntable = \"t\"\n";
    let elsewhere = http("http://127.0.0.1:1/usage", "");
    let header_changed = http(&second_receiver.url(), "idempotency_header = \"X-Key\"\n");
    let huge = format!("{}# {}\n", http(&second_receiver.url(), ""), "x".repeat(70_000));
    let cases: [(&str, &str, &str); 7] = [
        ("another body", &body_changed, "its HTTP body would change"),
        ("another idempotency header", &header_changed, "its idempotency header would change"),
        ("more than a job file may hold", &huge, "at most 65536 (MAX_JOB_FILE_BYTES)"),
        ("another kind of target", postgres, "between HTTP and PostgreSQL"),
        ("a URL the operator does not allow", &elsewhere, "deliver.urls"),
        (
            "a change to the job itself",
            "batch_size = 10\n",
            "only `[[deliver]]` sections change in place",
        ),
        ("not TOML", "[[deliver", "must be TOML"),
    ];
    for (what, deliver, expected) in cases {
        let err = acme.set_deliveries("billing", deliver).unwrap_err().to_string();
        assert!(err.contains(expected), "{what}: {err}");
    }
    let err = host
        .client(GLOBEX)
        .set_deliveries("billing", &http(&second_receiver.url(), ""))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no job named `billing`"), "another tenant's job: {err}");

    // The second receiver from here on: only what the first never got.
    let changed = acme.set_deliveries("billing", &http(&second_receiver.url(), "")).unwrap();
    assert_eq!(changed["deliveries"][0]["output"], "totals", "{changed}");
    write_input(&host, "acme", "usage.ndjson", second);
    wait_caught_up(&acme, "billing", second.len() as u64, &host);
    let after_second = committed_records(&host, "billing").len();
    wait_delivered(&host, "billing", after_second as u64);

    // It survives a host restart: the job file kept the change.
    host.kill();
    write_input(&host, "acme", "usage.ndjson", third);
    host.launch();
    let acme = host.client(ACME);
    wait_caught_up(&acme, "billing", third.len() as u64, &host);
    let records = committed_records(&host, "billing");
    wait_delivered(&host, "billing", records.len() as u64);
    check_applied_once(&first_receiver, &records[..before], None, 0);
    check_applied_once(&second_receiver, &records[before..], None, 0);

    // No deliveries: the job runs on and sends nothing; the state goes.
    acme.set_deliveries("billing", "").unwrap();
    let posts = second_receiver.seen(|seen| seen.posts);
    write_input(&host, "acme", "usage.ndjson", &usage_lines(60, 50, 0));
    wait_for("the job to commit the new customers' totals", Duration::from_secs(120), || {
        committed_records(&host, "billing").len() > records.len()
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(second_receiver.seen(|seen| seen.posts), posts, "a removed delivery kept sending");
    let status = acme.status("billing").unwrap();
    assert!(status["deliveries"].as_array().is_none_or(Vec::is_empty), "{status}");
    assert!(!host.dir.join("data/jobs/acme/billing/deliver/output-totals").exists());
}
