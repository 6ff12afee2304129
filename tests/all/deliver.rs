//! Delivery to a billing HTTP API, effectively once: a period job's FINAL
//! and ADJUSTMENT records delivered by `tally deliver` to a real HTTP
//! receiver on loopback (`tally_tests::receiver`) that fails on purpose,
//! with the deliverer SIGKILLed again and again; and a record whose
//! outcome stays unknown past the receiver's key retention, parked, then
//! settled by a lookup or by an operator.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tally_tests::periods::generate;
use tally_tests::receiver::{Faults, Receiver};
use tally_tests::{Rng, tally_binary};

use crate::periods::{append_later, run_to_end, write_job};

/// Runs a period job over generated input (both of its runs) and returns
/// its output lines: (idempotency key, the line's key, value) in order.
fn period_job(dir: &Path, per_partition: usize) -> (PathBuf, Vec<(String, String, Value)>) {
    let input = generate(41, per_partition);
    let job = write_job(dir, &input, "");
    run_to_end(&job);
    append_later(dir, &input);
    run_to_end(&job);
    let text = std::fs::read_to_string(dir.join("out/periods.ndjson")).unwrap();
    let records = text
        .lines()
        .map(|line| {
            let line: Value = serde_json::from_str(line).unwrap();
            let key = line["idempotency_key"].as_str().unwrap().to_string();
            (key, line["key"].to_string(), line["value"].clone())
        })
        .collect();
    (job, records)
}

fn write_delivery(dir: &Path, job: &Path, http: &str) -> PathBuf {
    write_delivery_file(dir, "deliver.toml", job, "deliver-state", &format!("[http]\n{http}"))
}

/// Writes delivery file `name` in `dir`: job `job`'s `periods` output, its
/// state in `state_dir`, to `target` (an `[http]` or `[postgres]` table).
pub(crate) fn write_delivery_file(
    dir: &Path,
    name: &str,
    job: &Path,
    state_dir: &str,
    target: &str,
) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "job = {:?}\noutput = \"periods\"\nstate_dir = {state_dir:?}\n{target}\n",
            job.display().to_string()
        ),
    )
    .unwrap();
    path
}

pub(crate) fn deliver(args: &[&str], file: &Path) -> std::process::Output {
    Command::new(tally_binary())
        .arg("deliver")
        .args(args)
        .arg(file)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

pub(crate) fn deliver_to_the_end(file: &Path) -> String {
    let output = deliver(&["--until-caught-up"], file);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

fn delivery_status(file: &Path) -> Value {
    let output = deliver(&["status", "--json"], file);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn dead_letter_keys(dir: &Path) -> Vec<String> {
    let text =
        std::fs::read_to_string(dir.join("deliver-state/dead-letters.ndjson")).unwrap_or_default();
    text.lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["idempotency_key"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// How far a delivery got: a count of what its target holds or was sent.
pub(crate) type Progress<'a> = dyn FnMut() -> u64 + 'a;

/// Runs `tally deliver --until-caught-up file` again and again, each run
/// SIGKILLed once `progress` (a count of what the target holds or was
/// sent) moved and then a random pause of up to `pause_ms` passed, until
/// `kills` kills landed; then one last run to its end. `after_progress`
/// runs once progress is seen in each run to be killed, with the kills so
/// far (a database restart, say). Returns the kills that landed.
pub(crate) fn deliver_with_kills(
    file: &Path,
    kills: u32,
    pause_ms: u64,
    progress: &mut Progress<'_>,
    after_progress: &mut dyn FnMut(u32, &mut std::process::Child, &mut Progress<'_>),
) -> u32 {
    let mut rng = Rng::new(9);
    let mut landed = 0;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        assert!(Instant::now() < deadline, "the delivery never finished ({landed} kills)");
        let mut child = Command::new(tally_binary())
            .args(["deliver", "--until-caught-up"])
            .arg(file)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        if landed < kills {
            let before = progress();
            while progress() == before && child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "the delivery made no progress");
                std::thread::sleep(Duration::from_millis(2));
            }
            after_progress(landed, &mut child, progress);
            std::thread::sleep(Duration::from_millis(rng.below(pause_ms)));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                landed += 1;
                continue;
            }
        }
        assert!(child.wait().unwrap().success(), "the last delivery failed");
        return landed;
    }
}

/// Checks what `receiver` saw of `records` (idempotency key, the line's
/// key, value): each applied once, except `refused`, every request for a
/// record with the same body (its value), the records of one key applied
/// in the job's order; and that enough needed a retry for the faults to
/// have bitten.
pub(crate) fn check_applied_once(
    receiver: &Receiver,
    records: &[(String, String, Value)],
    refused: Option<&str>,
    retried_at_least: usize,
) {
    let mut order_of_group: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    receiver.seen(|seen| {
        assert_eq!(seen.without_key, 0);
        for (key, group, value) in records {
            // Every request for a record carried the same bytes: its value
            // as the job wrote it.
            let requests = &seen.requests[key];
            let body = requests[0].clone();
            assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), *value, "{key}");
            assert!(
                requests.iter().all(|sent| *sent == body),
                "{key}: a request carried another body"
            );
            if Some(key.as_str()) == refused {
                assert!(!seen.applied.contains_key(key));
                continue;
            }
            let (applied, order) = &seen.applied[key];
            assert_eq!(*applied, body, "{key}");
            order_of_group.entry(group.clone()).or_default().push(*order);
        }
        let expected = records.len() - usize::from(refused.is_some());
        assert_eq!(seen.applied.len(), expected, "a key the job never wrote was applied");
        let retried = seen.requests.values().filter(|requests| requests.len() > 1).count();
        assert!(
            retried >= retried_at_least,
            "only {retried} records needed a retry: the faults did not bite"
        );
    });
    // Records of one key (a period's FINAL, then its ADJUSTMENTs) were
    // applied in the order the job wrote them.
    for (group, orders) in order_of_group {
        assert!(
            orders.windows(2).all(|pair| pair[0] < pair[1]),
            "{group}: applied out of order: {orders:?}"
        );
    }
}

#[test]
fn killed_again_and_again_a_delivery_applies_every_record_once_in_order() {
    // A kill loop: it must not starve a Kafka kill loop's observer.
    let _serial = tally_tests::kafka::serial();
    let dir = tempfile::tempdir().unwrap();
    let (job, records) = period_job(dir.path(), 1500);
    let adjustments = records.iter().filter(|(_, _, value)| value["type"] == "adjustment").count();
    assert!(
        records.len() >= 200 && adjustments >= 5,
        "{} records, {adjustments} adjustments",
        records.len()
    );
    let refused = records[records.len() / 3].0.clone();
    let receiver = Receiver::start(Faults {
        error_500: 150,
        too_many: 60,
        drop_after_apply: 120,
        slow: 40,
        slow_answer: Duration::from_millis(1500),
        latency: Duration::from_millis(20),
        refuse: BTreeSet::from([refused.clone()]),
        never_answer: BTreeSet::new(),
    });
    let file = write_delivery(
        dir.path(),
        &job,
        &format!(
            "url = {:?}\ntimeout = \"1s\"\nmax_in_flight = 2\nretry_initial = \"20ms\"\nretry_max = \"200ms\"",
            receiver.url()
        ),
    );
    let kills = deliver_with_kills(
        &file,
        24,
        120,
        &mut || receiver.seen(|seen| seen.posts),
        &mut |_, _, _| {},
    );
    eprintln!("{kills} kills, {} records, {:?}", records.len(), receiver.seen(|seen| seen.posts));
    assert!(kills >= 20, "only {kills} kills landed mid-delivery");
    check_applied_once(&receiver, &records, Some(&refused), 20);
    assert_eq!(dead_letter_keys(dir.path()), vec![refused]);
    let status = delivery_status(&file);
    assert_eq!(status["delivered"], records.len() as u64 - 1, "{status}");
    assert_eq!(status["failed"], 1, "{status}");
    assert_eq!(status["unknown"], 0, "{status}");
    assert_eq!(status["retrying"], 0, "{status}");
    let committed = std::fs::metadata(dir.path().join("out/periods.ndjson")).unwrap().len();
    assert_eq!(status["positions"]["0"], committed, "{status}");
}

#[test]
fn an_unknown_outcome_past_the_key_retention_is_parked_not_resent_until_settled() {
    let dir = tempfile::tempdir().unwrap();
    let (job, records) = period_job(dir.path(), 150);
    let forgotten = records[0].0.clone();
    let receiver = Receiver::start(Faults {
        never_answer: BTreeSet::from([forgotten.clone()]),
        ..Faults::default()
    });
    let http = format!(
        "url = {:?}\ntimeout = \"500ms\"\nkey_retention = \"2s\"\nretry_initial = \"100ms\"\nretry_max = \"300ms\"",
        receiver.url()
    );
    let file = write_delivery(dir.path(), &job, &http);
    let summary = deliver_to_the_end(&file);
    assert!(summary.contains("waiting as unknown 1"), "{summary}");
    let sent = receiver.seen(|seen| seen.requests[&forgotten].len());
    assert!(sent >= 2, "it was retried within the retention: {sent} requests");
    // Not re-sent by a later run either.
    deliver_to_the_end(&file);
    assert_eq!(receiver.seen(|seen| seen.requests[&forgotten].len()), sent);
    let status = delivery_status(&file);
    assert_eq!(status["unknown"], 1, "{status}");
    assert_eq!(status["delivered"], records.len() as u64 - 1, "{status}");
    // Its key is never sent with another body.
    let changed = write_delivery(dir.path(), &job, &format!("{http}\nbody = \"record\""));
    let refused = deliver(&["--until-caught-up"], &changed);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("another body"), "{stderr}");
    let file = write_delivery(dir.path(), &job, &http);
    let listed = deliver(&["unknown"], &file);
    assert!(String::from_utf8_lossy(&listed.stdout).contains(&forgotten));
    // The records of its key wait behind it; the operator checks the
    // receiver and settles it.
    let resolve = Command::new(tally_binary())
        .args(["deliver", "resolve"])
        .arg(&file)
        .args([&forgotten, "--applied"])
        .output()
        .unwrap();
    assert!(resolve.status.success(), "{}", String::from_utf8_lossy(&resolve.stderr));
    deliver_to_the_end(&file);
    assert_eq!(receiver.seen(|seen| seen.requests[&forgotten].len()), sent);
    let status = delivery_status(&file);
    assert_eq!(
        (status["unknown"].as_u64(), status["delivered"].as_u64()),
        (Some(0), Some(records.len() as u64))
    );

    // With a lookup URL, the receiver is asked instead: it applied it.
    let again = tempfile::tempdir().unwrap();
    let (job, _) = period_job(again.path(), 150);
    let file = write_delivery(
        again.path(),
        &job,
        &format!("{http}\nlookup_url = \"http://{}/usage/{{key}}\"", receiver.address),
    );
    let before = receiver.seen(|seen| seen.requests[&forgotten].len());
    let summary = deliver_to_the_end(&file);
    assert!(summary.contains("waiting as unknown 0"), "{summary}");
    receiver.seen(|seen| {
        assert!(seen.lookups[&forgotten] >= 1);
        // The same keys again: the receiver had applied them all already.
        assert_eq!(seen.applied.len(), records.len());
        assert!(seen.requests[&forgotten].len() > before);
    });
    assert_eq!(delivery_status(&file)["delivered"], records.len() as u64);
}

#[test]
fn a_first_request_cut_by_a_kill_is_not_resent_after_the_key_retention() {
    let dir = tempfile::tempdir().unwrap();
    let (job, records) = period_job(dir.path(), 150);
    let cut = records[3].0.clone();
    let receiver = Receiver::start(Faults {
        never_answer: BTreeSet::from([cut.clone()]),
        ..Faults::default()
    });
    // A timeout longer than the test: the deliverer is killed while the
    // record's first request waits for its answer.
    let http = format!(
        "url = {:?}\ntimeout = \"600s\"\nkey_retention = \"2s\"\nmax_in_flight = 4",
        receiver.url()
    );
    let file = write_delivery(dir.path(), &job, &http);
    let mut child = Command::new(tally_binary())
        .args(["deliver", "--until-caught-up"])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while receiver.seen(|seen| seen.requests.get(&cut).map_or(0, Vec::len)) == 0 {
        assert!(Instant::now() < deadline, "the record was never sent");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL, the request in flight
    child.wait().unwrap();
    let sent_before: BTreeSet<String> =
        receiver.seen(|seen| seen.requests.keys().cloned().collect());
    // Back after the receiver forgot the key: the record may have been
    // applied (it was), so it waits as unknown; it is not sent again.
    std::thread::sleep(Duration::from_millis(2500));
    deliver_to_the_end(&file);
    assert_eq!(receiver.seen(|seen| seen.requests[&cut].len()), 1);
    let listed = deliver(&["unknown", "--json"], &file);
    let unknown: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap()["key"].as_str().unwrap().into())
        .collect();
    assert!(unknown.contains(&cut), "{unknown:?}");
    // Besides it, records whose first attempt was written before the kill
    // and whose delivery was not (answered in the last millisecond, in
    // flight, or claimed by a lane: up to 4 per lane) wait too: the
    // deliverer cannot know whether they were applied. None is sent again.
    eprintln!("{} of {} records wait as unknown", unknown.len(), records.len());
    let never_sent = unknown.iter().filter(|key| !sent_before.contains(*key)).count();
    assert!(never_sent <= 4 * 4, "{never_sent} records never sent wait as unknown");
    receiver.seen(|seen| {
        for (key, requests) in &seen.requests {
            assert_eq!(requests.len(), 1, "{key} was sent again");
        }
    });
    // The rest is delivered, or waits behind a record of its key.
    let status = delivery_status(&file);
    assert_eq!(status["unknown"], unknown.len() as u64, "{status}");
    let waiting = status["stats"]["pending"].as_u64().unwrap();
    assert_eq!(status["delivered"].as_u64().unwrap() + waiting, records.len() as u64, "{status}");
    assert!(status["delivered"].as_u64().unwrap() >= (records.len() / 2) as u64, "{status}");
}

#[test]
fn a_bad_delivery_file_is_refused_saying_how_to_fix_it() {
    let dir = tempfile::tempdir().unwrap();
    let (job, records) = period_job(dir.path(), 150);
    let receiver = Receiver::start(Faults::default());
    let url = format!("url = {:?}", receiver.url());
    let wrong_output = write_delivery(dir.path(), &job, &url);
    let text = std::fs::read_to_string(&wrong_output).unwrap().replace("\"periods\"", "\"totals\"");
    std::fs::write(&wrong_output, text).unwrap();
    let refused = deliver(&["--until-caught-up"], &wrong_output);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no output \"totals\"") && stderr.contains("periods"), "{stderr}");

    let bad = write_delivery(dir.path(), &job, &format!("{url}\nmax_in_flight = 0"));
    let refused = deliver(&["--until-caught-up"], &bad);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("http.max_in_flight") && stderr.contains("1 to 256"), "{stderr}");

    // A finished delivery run again sends nothing.
    let file = write_delivery(dir.path(), &job, &url);
    deliver_to_the_end(&file);
    let posts = receiver.seen(|seen| seen.posts);
    assert_eq!(posts, records.len() as u64);
    deliver_to_the_end(&file);
    assert_eq!(receiver.seen(|seen| seen.posts), posts, "a settled record was sent again");
}

/// The test database (`scripts/postgres`, started by `scripts/test`).
pub(crate) fn postgres_url() -> String {
    std::env::var("TALLY_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://tally:tally@127.0.0.1:55432/tally".into())
}

/// Runs `scripts/postgres command`: what it printed.
fn scripts_postgres(command: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/postgres");
    let output = Command::new(script).arg(command).output().unwrap();
    assert!(
        output.status.success(),
        "scripts/postgres {command}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// A connection to the test database, retried while it restarts.
pub(crate) fn database() -> postgres::Client {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match postgres::Client::connect(&postgres_url(), postgres::NoTls) {
            Ok(client) => return client,
            Err(err) => {
                assert!(
                    Instant::now() < deadline,
                    "no test database at {}: {err} (run scripts/postgres start)",
                    postgres_url()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Watches a table's row count over one connection (a new one after the
/// database restarts).
struct RowCount {
    client: Option<postgres::Client>,
    query: String,
}

impl RowCount {
    fn of(table: &str) -> RowCount {
        RowCount { client: None, query: format!("SELECT count(*) FROM {table}") }
    }

    fn now(&mut self) -> i64 {
        let client = self.client.get_or_insert_with(database);
        match client.query_one(&self.query, &[]) {
            Ok(row) => row.get(0),
            Err(err) => {
                // No table before the deliverer's first connection; a
                // restart closes the connection.
                if err.is_closed() || err.as_db_error().is_none() {
                    self.client = None;
                }
                0
            }
        }
    }
}

#[test]
fn killed_again_and_again_and_across_a_database_restart_postgres_holds_each_record_once() {
    let _serial = tally_tests::kafka::serial();
    let dir = tempfile::tempdir().unwrap();
    let (job, records) = period_job(dir.path(), 1500);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let table = format!("billing_periods_{}_{nanos}", std::process::id());
    let path = dir.path().join("deliver.toml");
    std::fs::write(
        &path,
        format!(
            "job = {:?}\noutput = \"periods\"\nstate_dir = \"deliver-state\"\n[postgres]\nurl = {:?}\ntable = {table:?}\nbatch_size = 1\n",
            job.display().to_string(),
            postgres_url()
        ),
    )
    .unwrap();
    // The operator's own table, whose trigger makes each row take 10 ms
    // (so that the kills land mid-delivery).
    database()
        .batch_execute(&format!(
            "CREATE TABLE {table} (idempotency_key text PRIMARY KEY, record_key jsonb NOT NULL, \
             value jsonb NOT NULL, output_partition integer NOT NULL, output_offset bigint NOT NULL, \
             delivered_at timestamptz NOT NULL DEFAULT now());
             CREATE OR REPLACE FUNCTION tally_test_slow_row() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN PERFORM pg_sleep(0.01); RETURN NEW; END $$;
             CREATE TRIGGER slow BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION tally_test_slow_row();"
        ))
        .unwrap();
    let mut restarted = false;
    let rows = std::cell::RefCell::new(RowCount::of(&table));
    let kills = deliver_with_kills(
        &path,
        24,
        30,
        &mut || rows.borrow_mut().now() as u64,
        &mut |kills, child, progress| {
            if kills == 10 && !restarted {
                // The database goes down under the deliverer, and comes back.
                scripts_postgres("kill");
                std::thread::sleep(Duration::from_millis(300));
                scripts_postgres("start");
                restarted = true;
                let (before, until) = (progress(), Instant::now() + Duration::from_secs(60));
                while progress() == before && child.try_wait().unwrap().is_none() {
                    assert!(
                        Instant::now() < until,
                        "the delivery did not resume after the restart"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        },
    );
    eprintln!("{kills} kills, {} records", records.len());
    assert!(kills >= 20 && restarted, "only {kills} kills landed mid-delivery");

    let mut client = database();
    let rows = client
        .query(&format!("SELECT idempotency_key, record_key::text, value::text FROM {table}"), &[])
        .unwrap();
    let held: BTreeMap<String, (Value, Value)> = rows
        .iter()
        .map(|row| {
            let key: String = row.get(0);
            let parse = |text: String| serde_json::from_str::<Value>(&text).unwrap();
            (key, (parse(row.get(1)), parse(row.get(2))))
        })
        .collect();
    assert_eq!(held.len(), rows.len());
    assert_eq!(held.len(), records.len(), "the table holds other rows than the job's records");
    for (key, group, value) in &records {
        let (record_key, held_value) = &held[key];
        assert_eq!(held_value, value, "{key}");
        assert_eq!(*record_key, serde_json::from_str::<Value>(group).unwrap(), "{key}");
    }
    let committed = std::fs::metadata(dir.path().join("out/periods.ndjson")).unwrap().len() as i64;
    let position: i64 = client
        .query_one("SELECT output_offset FROM tally_delivery_positions WHERE delivery = 'billing/periods' AND target_table = $1 AND output_partition = 0", &[&table])
        .map(|row| row.get(0))
        .unwrap_or(-1);
    assert_eq!(position, committed);
    assert!(dead_letter_keys(dir.path()).is_empty());
    client.batch_execute(&format!("DROP TABLE {table}")).unwrap();
}

#[test]
fn into_postgres_over_tls_the_servers_certificate_is_verified() {
    let _serial = tally_tests::kafka::serial();
    let dir = tempfile::tempdir().unwrap();
    let (job, records) = period_job(dir.path(), 150);
    let ca = scripts_postgres("ca").trim().to_string();
    let table = format!("tls_periods_{}", std::process::id());
    let url = format!("{}?sslmode=require", postgres_url());
    let target = |ca_file: &str| {
        format!("[postgres]\nurl = {url:?}\ntable = {table:?}\nca_file = {ca_file:?}")
    };
    // A certificate that signs nothing of the server's: refused at once,
    // saying what to set.
    let other = dir.path().join("other");
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=other"])
        .arg("-keyout")
        .arg(other.with_extension("key"))
        .arg("-out")
        .arg(other.with_extension("crt"))
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let other_ca = other.with_extension("crt").display().to_string();
    let wrong =
        write_delivery_file(dir.path(), "wrong.toml", &job, "wrong-state", &target(&other_ca));
    let refused = deliver(&["--until-caught-up"], &wrong);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("postgres.ca_file"), "{stderr}");

    // The right one: every record lands, over TLS.
    let file = write_delivery_file(dir.path(), "tls.toml", &job, "tls-state", &target(&ca));
    let log = dir.path().join("deliver.log");
    let mut child = Command::new(tally_binary())
        .arg("deliver")
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut client = database();
    let deadline = Instant::now() + Duration::from_secs(60);
    let count = format!("SELECT count(*) FROM {table}");
    while client.query_one(&count, &[]).map_or(0, |row| row.get::<_, i64>(0)) < records.len() as i64
    {
        assert!(
            Instant::now() < deadline,
            "the records did not land: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let over_tls: Vec<bool> = client
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'tally deliver billing/periods'",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(over_tls, vec![true], "the deliverer's connections");
    client.batch_execute(&format!("DROP TABLE {table}")).unwrap();
}

#[test]
fn settled_entries_are_pruned_past_their_retention_and_still_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (job, records) = period_job(dir.path(), 100);
    let refused = records[3].0.clone();
    let receiver =
        Receiver::start(Faults { refuse: BTreeSet::from([refused.clone()]), ..Faults::default() });
    let file = write_delivery_file(
        dir.path(),
        "deliver.toml",
        &job,
        "deliver-state",
        &format!("ledger_retention = \"1s\"\n[http]\nurl = {:?}", receiver.url()),
    );
    deliver_to_the_end(&file);
    let ledger_entries = || {
        let view = tempfile::tempdir().unwrap();
        let ledger = tally_deliver::ledger::Ledger::view(
            &dir.path().join("deliver-state/ledger"),
            view.path(),
        )
        .unwrap();
        (ledger.entries().unwrap().len(), ledger.pruned().unwrap())
    };
    assert_eq!(ledger_entries().0, records.len(), "every record has its entry at first");
    let posts = receiver.seen(|seen| seen.posts);

    // The next run, past the retention, prunes them: only their counts stay.
    std::thread::sleep(Duration::from_millis(1200));
    deliver_to_the_end(&file);
    let (entries, pruned) = ledger_entries();
    assert_eq!(entries, 0);
    assert_eq!((pruned.delivered, pruned.failed), (records.len() as u64 - 1, 1));
    let status = delivery_status(&file);
    assert_eq!(
        (status["delivered"].as_u64(), status["failed"].as_u64()),
        (Some(records.len() as u64 - 1), Some(1)),
        "{status}"
    );
    assert_eq!(receiver.seen(|seen| seen.posts), posts, "a pruned record was sent again");
    assert_eq!(dead_letter_keys(dir.path()), [refused], "its dead letter stays");
}
