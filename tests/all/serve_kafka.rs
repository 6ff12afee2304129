//! Kafka jobs under `tally serve`: one takes 20 plugin pushes (and one
//! broken version) while input keeps arriving, and totals stay exact with
//! the plugin digest in the output lineage changing only between
//! transactions; another is swapped between the billing plugin's builds in
//! five languages under load; another resumes exactly after its host is
//! SIGKILLed; another's shadow writes topics of its own, compared with the
//! live ones by its running diff.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tally_tests::kafka::{
    KafkaBillingJob, OutputRecord, Placed, assert_exactly_once, check, committed_progress,
    create_topic, delete_topics, group_reader, produce_usage, read_topic, serial, unique,
};
use tally_tests::serve::{ACME, METRICS, ServeHost, number, wait_for};
use tally_tests::{UsageLine, expected_totals, usage_lines};

use crate::plugins;

/// A Kafka billing job file for `tally serve` named `name` over `job`'s
/// topics (no plugin, brokers or state_dir: the host owns them).
fn kafka_job_file(name: &str, job: &KafkaBillingJob) -> String {
    format!(
        "name = {name:?}\noutputs = [\"totals\"]\n[kafka]\ninputs = [{input:?}]\n\
         outputs = {{ totals = {totals:?} }}\ndead_letter_topic = {dead:?}\n",
        input = job.input,
        totals = job.totals,
        dead = job.dead_letters,
    )
}

/// Waits until served job `name` (tenant acme) has committed every one of
/// `lines` from its `partitions` input partitions, then checks, with the
/// independent checker ([`assert_exactly_once`]), that each counted exactly
/// once; returns the totals and dead letters read.
fn committed_exactly_once(
    job: &KafkaBillingJob,
    name: &str,
    partitions: i32,
    lines: &[UsageLine],
    placed: &[Placed],
) -> (Vec<OutputRecord>, Vec<OutputRecord>) {
    let group = group_reader(&format!("tally-acme.{name}"));
    wait_for("the job to commit every record", Duration::from_secs(120), || {
        committed_progress(&group, &job.input, partitions) == lines.len() as i64
    });
    assert_exactly_once(job, lines, placed)
}

fn digest_of(path: &str) -> String {
    tally_core::plugin::digest(&std::fs::read(path).unwrap())
}

/// Produces `lines` in small chunks (from the start again when they run
/// out) until `stop` is set; returns what was produced and where it landed.
fn feed(
    topic: String,
    lines: Vec<UsageLine>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Vec<UsageLine>, Vec<Placed>)> {
    std::thread::spawn(move || {
        let mut placed = Vec::new();
        let mut produced = Vec::new();
        for chunk in lines.chunks(400).cycle() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            placed.extend(produce_usage(&topic, chunk, 4));
            produced.extend_from_slice(chunk);
            std::thread::sleep(Duration::from_millis(40));
        }
        (produced, placed)
    })
}

#[test]
fn twenty_plugin_swaps_under_load_keep_totals_exact_and_change_the_digest_only_between_transactions()
 {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let host = ServeHost::start(dir.path(), 32 << 20);
    // A tenant's topics carry its name: `acme.*`.
    let job = KafkaBillingJob::create("acme.swaps", 4);
    let name = unique("swaps");
    let changelog = format!("tally-acme.{name}-state-changelog");
    let acme = host.client(ACME);
    acme.deploy(&kafka_job_file(&name, &job), &std::fs::read(plugins::USAGE_BILLING).unwrap())
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let feeder = feed(job.input.clone(), usage_lines(51, 40_000, 3), stop.clone());
    let builds = [
        (plugins::BILLING_VARIANT, digest_of(plugins::BILLING_VARIANT)),
        (plugins::USAGE_BILLING, digest_of(plugins::USAGE_BILLING)),
    ];
    let trap = digest_of(plugins::BILLING_TRAP);
    for push in 0..20 {
        if push == 10 {
            acme.push(&name, &std::fs::read(plugins::BILLING_TRAP).unwrap()).unwrap();
            wait_for("the broken version to be rolled back", Duration::from_secs(60), || {
                number(&acme.status(&name).unwrap(), "rollbacks") == 1
            });
        }
        let (path, digest) = &builds[push % 2];
        push_until_active(&host, &name, path, digest, Duration::from_secs(60));
    }
    stop.store(true, Ordering::Relaxed);
    let (lines, placed) = feeder.join().unwrap();
    assert!(lines.len() >= 4_000, "input kept arriving during the swaps ({} records)", lines.len());
    let (totals, dead_letters) = committed_exactly_once(&job, &name, 4, &lines, &placed);

    let digest_of_transaction =
        digests_by_transaction(&changelog, totals.iter().chain(&dead_letters));
    let digests_seen: BTreeSet<&String> = digest_of_transaction.values().collect();
    assert!(
        !digests_seen.contains(&trap),
        "nothing the rolled-back version produced was committed"
    );
    assert_eq!(digests_seen.len(), 2, "both builds produced committed output: {digests_seen:?}");
    let changes: usize = (0..4)
        .map(|partition| {
            let in_order: Vec<&String> = digest_of_transaction
                .range((partition, 0)..(partition + 1, 0))
                .map(|(_, digest)| digest)
                .collect();
            in_order.windows(2).filter(|pair| pair[0] != pair[1]).count()
        })
        .sum();
    assert!(
        changes >= 20,
        "the digest changed {changes} times over the partitions; every swap should show"
    );
    println!(
        "{} records, {} transactions with output, {changes} digest changes over 4 partitions",
        lines.len(),
        digest_of_transaction.len()
    );

    let status = acme.status(&name).unwrap();
    assert_eq!(number(&status, "rollbacks"), 1, "{status}");
    let history = acme.history(&name).unwrap();
    let statuses: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|version| version["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses.len(), 22);
    assert_eq!(
        statuses.iter().filter(|status| **status == "rolled_back").count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(statuses.last(), Some(&"active"));
    let metrics = host.client(METRICS).metrics().unwrap();
    assert!(
        metrics.contains(&format!("tally_plugin_swaps_total{{tenant=\"acme\",job=\"{name}\"}} 20")),
        "{metrics}"
    );
    drop(host);
    delete_topics(&[&changelog]);
}

/// Pushes the build at `path` to acme's job `name` and waits until it is
/// the active version (its trial passed); fails if the job fails, or with
/// the job's status and the host's log after `timeout`.
fn push_until_active(host: &ServeHost, name: &str, path: &str, digest: &str, timeout: Duration) {
    let acme = host.client(ACME);
    acme.push(name, &std::fs::read(path).unwrap()).unwrap();
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let status = acme.status(name).unwrap();
        assert_ne!(status["state"], "failed", "{status}\n{}", host.log());
        if status["plugin"] == digest && status["pending_plugin"].is_null() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{path} did not become active in {timeout:?}: {status}\n{}",
            host.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The plugin digest of each committed transaction with output, by
/// (partition, the next offset it committed); fails if one mixes two. The
/// digest changes only at transaction boundaries: every transaction writes
/// the next input offset it includes into the changelog, so the committed
/// transactions split each partition's offsets into ranges, and each
/// range's outputs must carry one digest.
fn digests_by_transaction<'a>(
    changelog: &str,
    outputs: impl Iterator<Item = &'a tally_tests::kafka::OutputRecord>,
) -> BTreeMap<(i32, i64), String> {
    let mut boundaries: BTreeMap<i32, BTreeSet<i64>> = BTreeMap::new();
    for record in read_topic(changelog, true) {
        if record.key.as_deref().is_some_and(|key| key.first() == Some(&b'o')) {
            let next: i64 = std::str::from_utf8(&record.value).unwrap().parse().unwrap();
            boundaries.entry(record.partition).or_default().insert(next);
        }
    }
    let mut digest_of_transaction: BTreeMap<(i32, i64), String> = BTreeMap::new();
    for record in outputs {
        let (_, partition, offset) = record.source();
        let digest = record.header("tally.plugin").to_string();
        // The transaction holding `offset` ends at the first boundary above it.
        let end = *boundaries[&partition]
            .range(offset + 1..)
            .next()
            .expect("every committed output lies below a boundary");
        let seen = digest_of_transaction.entry((partition, end)).or_insert_with(|| digest.clone());
        assert_eq!(
            *seen, digest,
            "partition {partition}: the transaction ending at offset {end} mixes two plugin versions"
        );
    }
    digest_of_transaction
}

#[test]
fn hot_swaps_between_languages_under_load_keep_totals_exact() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // The Python build takes about 12 CPU seconds to compile; the suite's
    // other tests share the two cores, so the compile gets room to spare.
    let host = ServeHost::start_with(
        dir.path(),
        "max_upload_bytes = 33554432\nmax_compile_seconds = 120",
        "",
        "",
    );
    let job = KafkaBillingJob::create("acme.languages", 4);
    let name = unique("languages");
    let changelog = format!("tally-acme.{name}-state-changelog");
    let acme = host.client(ACME);
    acme.deploy(&kafka_job_file(&name, &job), &std::fs::read(plugins::USAGE_BILLING).unwrap())
        .unwrap();

    // The same logic in five languages, each taking over the state the
    // one before it left: Rust -> Python -> Go -> C -> JavaScript -> Rust.
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = feed(job.input.clone(), usage_lines(53, 40_000, 3), stop.clone());
    let builds = [
        plugins::USAGE_BILLING_PYTHON,
        plugins::USAGE_BILLING_GO,
        plugins::USAGE_BILLING_C,
        plugins::USAGE_BILLING_JS,
        plugins::USAGE_BILLING,
    ];
    for path in builds {
        push_until_active(&host, &name, path, &digest_of(path), Duration::from_secs(180));
        // Let the new build commit some input before the next swap.
        std::thread::sleep(Duration::from_millis(1_500));
    }
    stop.store(true, Ordering::Relaxed);
    let (lines, placed) = feeder.join().unwrap();
    let (totals, dead_letters) = committed_exactly_once(&job, &name, 4, &lines, &placed);
    let digests_seen: BTreeSet<String> =
        digests_by_transaction(&changelog, totals.iter().chain(&dead_letters))
            .into_values()
            .collect();
    let every_build: BTreeSet<String> = builds.iter().map(|path| digest_of(path)).collect();
    assert_eq!(digests_seen, every_build, "each language's build committed output");
    assert_eq!(number(&acme.status(&name).unwrap(), "rollbacks"), 0);
    drop(host);
    delete_topics(&[&changelog]);
}

#[test]
fn a_killed_host_resumes_its_kafka_job_exactly() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut host = ServeHost::start(dir.path(), 32 << 20);
    let job = KafkaBillingJob::create("acme.restart", 4);
    let name = unique("restart");
    let changelog = format!("tally-acme.{name}-state-changelog");
    let acme = host.client(ACME);
    acme.deploy(&kafka_job_file(&name, &job), &std::fs::read(plugins::USAGE_BILLING).unwrap())
        .unwrap();
    let lines = usage_lines(52, 60_000, 3);
    let (first, rest) = lines.split_at(30_000);
    let mut placed = produce_usage(&job.input, first, 4);
    let group = group_reader(&format!("tally-acme.{name}"));
    wait_for("the job to commit part of its input", Duration::from_secs(60), || {
        committed_progress(&group, &job.input, 4) > 0
    });
    host.kill();
    placed.extend(produce_usage(&job.input, rest, 4));
    host.launch();
    wait_for("the resumed job to commit every record", Duration::from_secs(120), || {
        committed_progress(&group, &job.input, 4) == lines.len() as i64
    });
    let verdict = check(
        &job.input,
        &lines,
        &placed,
        &read_topic(&job.totals, true),
        &read_topic(&job.dead_letters, true),
    );
    assert_eq!(
        (verdict.missing, verdict.doubled),
        (0, 0),
        "every input record counts exactly once across the kill"
    );
    assert_eq!(verdict.totals, expected_totals(&lines));
    assert!(host.terminate(), "SIGTERM stops the host cleanly:\n{}", host.log());
    delete_topics(&[&changelog]);
}

#[test]
fn a_kafka_job_whose_plugin_loops_is_paused_and_deleted_mid_call() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let host = ServeHost::start(dir.path(), 32 << 20);
    let job = KafkaBillingJob::create("acme.spin", 1);
    let looping: Vec<UsageLine> = (0..50)
        .map(|_| UsageLine { line: r#"{"k":"z","do":"loop"}"#.to_string(), effect: None })
        .collect();
    produce_usage(&job.input, &looping, 1);
    let file = format!(
        "name = \"spinner\"\noutputs = [\"counts\"]\n[limits]\ncpu_budget_ms = 10000\nmax_failures_in_a_row = 1000\n\
         [kafka]\ninputs = [{:?}]\noutputs = {{ counts = {:?} }}\ndead_letter_topic = {:?}\n",
        job.input, job.totals, job.dead_letters
    );
    let acme = host.client(ACME);
    acme.deploy(&file, &std::fs::read(plugins::HOSTILE).unwrap()).unwrap();
    wait_for("the Kafka job to be inside its looping plugin", Duration::from_secs(120), || {
        acme.status("spinner").unwrap()["cpu_seconds"].as_f64().unwrap_or(0.0) > 0.3
    });
    acme.pause("spinner").unwrap();
    wait_for("the looping Kafka job to pause", Duration::from_secs(10), || {
        acme.status("spinner").unwrap()["state"] == "paused"
    });
    let cpu = acme.status("spinner").unwrap()["cpu_seconds"].as_f64().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        acme.status("spinner").unwrap()["cpu_seconds"].as_f64().unwrap() - cpu < 0.05,
        "a paused Kafka job uses no CPU"
    );
    assert!(
        read_topic(&job.totals, true).is_empty() && read_topic(&job.dead_letters, true).is_empty(),
        "nothing was committed"
    );
    acme.resume("spinner").unwrap();
    wait_for("the job to loop again", Duration::from_secs(60), || {
        acme.status("spinner").unwrap()["cpu_seconds"].as_f64().unwrap() > cpu + 0.3
    });
    acme.delete("spinner").unwrap_or_else(|err| {
        panic!("the delete of a looping Kafka job answers: {err}\n{}", host.log())
    });
    assert!(acme.list().unwrap().as_array().unwrap().is_empty());
}

#[test]
fn a_served_kafka_job_rebuilding_its_state_says_restoring_with_its_progress_in_status_and_metrics()
{
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut host = ServeHost::start(dir.path(), 32 << 20);
    let job = KafkaBillingJob::create("acme.restoring", 4);
    let name = unique("restoring");
    let changelog = format!("tally-acme.{name}-state-changelog");
    let acme = host.client(ACME);
    acme.deploy(&kafka_job_file(&name, &job), &std::fs::read(plugins::USAGE_BILLING).unwrap())
        .unwrap();
    let lines = tally_tests::distinct_key_lines(300_000, 1);
    let placed = produce_usage(&job.input, &lines, 4);
    let group = group_reader(&format!("tally-acme.{name}"));
    wait_for("the job to commit its input", Duration::from_secs(120), || {
        committed_progress(&group, &job.input, 4) == lines.len() as i64
    });
    assert!(host.terminate(), "SIGTERM stops the host cleanly:\n{}", host.log());

    // The job's RocksDB is lost, and the broker is overloaded (it stalls
    // for 0.6 s at a time), so rebuilding about 20 MB of state, a few MB
    // per fetch, takes seconds.
    std::fs::remove_dir_all(dir.path().join("data/jobs/acme").join(&name).join("state/db"))
        .unwrap();
    let stutter = tally_tests::kafka::BrokerStutter::start(
        Duration::from_millis(600),
        Duration::from_millis(40),
    );
    host.launch();
    let restore = |status: &serde_json::Value| status["restore"].clone();
    let mut first = serde_json::Value::Null;
    wait_for("the job to report its restore", Duration::from_secs(60), || {
        let status = acme.status(&name).unwrap();
        first = restore(&status);
        status["state"] == "restoring" && number(&first, "records_done") > 0
    });
    assert!(number(&first, "records_to_go") > 0, "{first}");
    assert!(first["records_per_second"].as_f64().unwrap() > 0.0, "{first}");
    assert!(first["seconds_left"].as_f64().unwrap() > 0.0, "{first}");
    let metrics = host.client(METRICS).metrics().unwrap();
    let gauge = |family: &str| -> f64 {
        let line = metrics
            .lines()
            .find(|line| line.starts_with(family) && line.contains(&name))
            .unwrap_or_else(|| panic!("no {family} for the job:\n{metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(gauge("tally_restoring{"), 1.0);
    assert!(
        gauge("tally_restore_records_done{") > 0.0 && gauge("tally_restore_records_to_go{") > 0.0
    );
    let mut later = serde_json::Value::Null;
    wait_for("the restore to go on", Duration::from_secs(60), || {
        later = restore(&acme.status(&name).unwrap());
        later.is_null() || number(&later, "records_done") > number(&first, "records_done")
    });
    if !later.is_null() {
        assert!(
            number(&later, "records_to_go") < number(&first, "records_to_go"),
            "{first} then {later}"
        );
    }
    drop(stutter);
    wait_for("the job to run again", Duration::from_secs(60), || {
        let status = acme.status(&name).unwrap();
        status["state"] == "running" && status["restore"].is_null()
    });
    assert!(host.log().contains("restored state from the changelog"), "{}", host.log());
    // Nothing was counted again: the restored state holds every total.
    let verdict = check(
        &job.input,
        &lines,
        &placed,
        &read_topic(&job.totals, true),
        &read_topic(&job.dead_letters, true),
    );
    assert_eq!((verdict.missing, verdict.doubled), (0, 0));
    assert!(host.terminate(), "SIGTERM stops the host cleanly:\n{}", host.log());
    delete_topics(&[&changelog]);
}

#[test]
fn a_host_runs_its_jobs_on_a_sasl_listener_with_its_own_client_settings() {
    let _serial = serial();
    let host_lines = |password: &str| {
        format!(
            "kafka_brokers = {:?}\n[kafka.client]\n\"security.protocol\" = \"SASL_PLAINTEXT\"\n\
             \"sasl.mechanism\" = \"PLAIN\"\n\"sasl.username\" = \"tally\"\n\"sasl.password\" = {password:?}\n",
            tally_tests::kafka::sasl_bootstrap()
        )
    };
    let job = KafkaBillingJob::create("acme.sasl", 2);
    let name = unique("sasl");
    let billing = std::fs::read(plugins::USAGE_BILLING).unwrap();

    // Wrong credentials: the deploy is refused, naming the settings to check
    // (librdkafka reports a failed authentication to requests only as a
    // transport failure).
    let wrong = tempfile::tempdir().unwrap();
    let host = ServeHost::start_with(wrong.path(), &host_lines("not-the-password"), "", "");
    let err = host.client(ACME).deploy(&kafka_job_file(&name, &job), &billing).unwrap_err();
    let err = err.to_string();
    assert!(
        err.contains("(HTTP 400)") && err.contains("kafka.client's security settings"),
        "{err}"
    );
    drop(host);

    // The operator's settings reach every client of the job: it counts
    // each record once over the secured listener.
    let dir = tempfile::tempdir().unwrap();
    let host =
        ServeHost::start_with(dir.path(), &host_lines(tally_tests::kafka::SASL_PASSWORD), "", "");
    let acme = host.client(ACME);
    acme.deploy(&kafka_job_file(&name, &job), &billing).unwrap();
    let lines = usage_lines(57, 3_000, 3);
    let placed = produce_usage(&job.input, &lines, 2);
    committed_exactly_once(&job, &name, 2, &lines, &placed);
    acme.delete(&name).unwrap();
    delete_topics(&[&format!("tally-acme.{name}-state-changelog")]);
}

#[test]
fn a_kafka_jobs_shadow_writes_topics_of_its_own_that_its_running_diff_compares() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let host = ServeHost::start(dir.path(), 32 << 20);
    let acme = host.client(ACME);
    let (job, name, lines, placed) = deployed_and_committed(&host, "shadow", 53, 4_000);

    // Another build of the same plugin: other bytes, the same totals.
    let body = serde_json::json!({
        "plugin": base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            std::fs::read(plugins::BILLING_VARIANT).unwrap(),
        ),
    })
    .to_string();
    let start = || {
        acme.request(
            "POST",
            &format!("/v1/jobs/{name}/shadow"),
            Some(("application/json", body.clone().into_bytes())),
        )
    };
    // This host creates no tenant's topics: the start names those the
    // operator creates first, and nothing starts.
    let refused = start().unwrap_err();
    assert_eq!(refused.status(), Some(400), "{refused}");
    assert!(refused.to_string().contains("kafka_create_topics"), "{refused}");
    assert!(refused.to_string().contains(&format!("{}.v2", job.totals)), "{refused}");
    assert!(acme.status(&name).unwrap().get("shadow").is_none());
    // Refused, the start took no number: the next is v2 still.
    create_topic(&format!("{}.v2", job.totals), 2);
    create_topic(&format!("{}.v2", job.dead_letters), 2);
    let started = start().unwrap();
    assert_eq!(started["shadow"]["version"], "v2", "{started}");

    // Its outputs are topics of its own, each input record counted once.
    let shadow_totals = format!("{}.v2", job.totals);
    let live = read_topic(&job.totals, true);
    wait_for("the shadow to write a total per record", Duration::from_secs(120), || {
        read_topic(&shadow_totals, true).len() == live.len()
    });
    let verdict = check(
        &job.input,
        &lines,
        &placed,
        &read_topic(&shadow_totals, true),
        &read_topic(&format!("{}.v2", job.dead_letters), true),
    );
    assert_eq!((verdict.missing, verdict.doubled), (0, 0));
    assert_eq!(verdict.totals, expected_totals(&lines));
    assert_eq!(read_topic(&job.totals, true).len(), live.len(), "the shadow wrote the live topic");

    // The running diff read both topics: every key equal.
    let keys = expected_totals(&lines).len() as u64;
    let mut diff = serde_json::Value::Null;
    wait_for("the running diff to read both topics", Duration::from_secs(60), || {
        diff = acme.status(&name).unwrap()["shadow"]["diff"][0].clone();
        diff["caught_up"] == true && diff["shadow_records"].as_u64() == Some(live.len() as u64)
    });
    assert_eq!(diff["live_records"], live.len() as u64, "{diff}");
    assert_eq!(diff["equal"], keys, "{diff}");
    assert_eq!(
        (diff["changed"].as_u64(), diff["only_live"].as_u64()),
        (Some(0), Some(0)),
        "{diff}"
    );
    assert_eq!(diff["only_shadow"], 0, "{diff}");

    let discarded = acme.request("DELETE", &format!("/v1/jobs/{name}/shadow"), None).unwrap();
    assert_eq!(discarded["discarded"], "v2");
    assert_eq!(acme.status(&name).unwrap()["state"], "running");
    delete_topics(&[
        &format!("tally-acme.{name}-state-changelog"),
        &format!("tally-acme.{name}.v2-state-changelog"),
        &shadow_totals,
        &format!("{}.v2", job.dead_letters),
    ]);
}

#[test]
fn a_kafka_jobs_replay_through_the_api_starts_at_the_offsets_it_is_given() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let host = ServeHost::start(dir.path(), 32 << 20);
    let acme = host.client(ACME);
    let (job, name, lines, placed) = deployed_and_committed(&host, "replay", 59, 2_000);
    create_topic(&format!("{}.v2", job.totals), 2);
    create_topic(&format!("{}.v2", job.dead_letters), 2);

    // A start that is not one is refused, naming the forms it takes.
    let body = serde_json::json!({"from": "yesterday"}).to_string().into_bytes();
    let err = acme
        .request("POST", &format!("/v1/jobs/{name}/shadow"), Some(("application/json", body)))
        .unwrap_err();
    assert_eq!(err.status(), Some(400), "{err}");
    assert!(err.to_string().contains("RFC 3339"), "{err}");
    assert!(acme.status(&name).unwrap().get("shadow").is_none());

    // The job's own plugin replayed from the middle of each partition.
    let start: Vec<i64> = (0..2)
        .map(|partition| placed.iter().filter(|at| at.partition == partition).count() as i64 / 2)
        .collect();
    let from = format!("0:{},1:{}", start[0], start[1]);
    let (ok, out) = crate::serve::cli(&host, ACME, &["jobs", "replay", &name, "--from", &from]);
    assert!(ok, "{out}");
    assert!(out.contains(&format!("started a shadow of `{name}` as v2")), "{out}");
    let replayed: Vec<UsageLine> = lines
        .iter()
        .zip(&placed)
        .filter(|(_, at)| at.offset >= start[at.partition as usize])
        .map(|(line, _)| line.clone())
        .collect();
    let outputs = |topic: &str| read_topic(&format!("{topic}.v2"), true).len();
    wait_for("the replay to reach the input's end", Duration::from_secs(120), || {
        outputs(&job.totals) + outputs(&job.dead_letters) == replayed.len()
    });
    let verdict = check(
        &job.input,
        &lines,
        &placed,
        &read_topic(&format!("{}.v2", job.totals), true),
        &read_topic(&format!("{}.v2", job.dead_letters), true),
    );
    assert_eq!(verdict.doubled, 0);
    assert_eq!(verdict.missing, lines.len() - replayed.len(), "nothing before the start counted");
    assert_eq!(verdict.totals, expected_totals(&replayed));
    delete_topics(&[
        &job.input,
        &job.totals,
        &job.dead_letters,
        &format!("{}.v2", job.totals),
        &format!("{}.v2", job.dead_letters),
    ]);
}

#[test]
fn a_promoted_kafka_shadow_goes_on_in_its_own_topics_and_group() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut host = ServeHost::start(dir.path(), 32 << 20);
    let acme = host.client(ACME);
    let (job, name, lines, placed) = deployed_and_committed(&host, "promote", 61, 2_000);
    let (v2_totals, v2_dead) = (format!("{}.v2", job.totals), format!("{}.v2", job.dead_letters));
    create_topic(&v2_totals, 2);
    create_topic(&v2_dead, 2);
    // Another build of the same plugin: the same totals.
    let body = serde_json::json!({
        "plugin": base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            std::fs::read(plugins::BILLING_VARIANT).unwrap(),
        ),
    })
    .to_string();
    acme.request(
        "POST",
        &format!("/v1/jobs/{name}/shadow"),
        Some(("application/json", body.into_bytes())),
    )
    .unwrap();
    let live_outputs = read_topic(&job.totals, true).len();
    wait_for("the shadow to catch up", Duration::from_secs(120), || {
        read_topic(&v2_totals, true).len() == live_outputs
    });
    let promoted = acme.request("POST", &format!("/v1/jobs/{name}/promote"), None).unwrap();
    assert_eq!((&promoted["version"], &promoted["from"]), (&"v2".into(), &"v1".into()));

    // v2 goes on from its own group's offsets, through a host kill, in
    // its own topics; v1's topic gets nothing more.
    let more = usage_lines(62, 1_000, 0);
    let placed_more = produce_usage(&job.input, &more, 2);
    host.kill();
    host.launch();
    let acme = host.client(ACME);
    assert_eq!(acme.status(&name).unwrap()["output_version"], "v2");
    let all: Vec<UsageLine> = lines.iter().chain(&more).cloned().collect();
    let all_placed: Vec<Placed> = placed.iter().chain(&placed_more).copied().collect();
    let v2_group = group_reader(&format!("tally-acme.{name}.v2"));
    wait_for("v2 to commit every record", Duration::from_secs(120), || {
        committed_progress(&v2_group, &job.input, 2) == all.len() as i64
    });
    let verdict = check(
        &job.input,
        &all,
        &all_placed,
        &read_topic(&v2_totals, true),
        &read_topic(&v2_dead, true),
    );
    assert_eq!((verdict.missing, verdict.doubled), (0, 0));
    assert_eq!(verdict.totals, expected_totals(&all));
    assert_eq!(read_topic(&job.totals, true).len(), live_outputs, "v1 ran after its promotion");
    delete_topics(&[
        &format!("tally-acme.{name}-state-changelog"),
        &format!("tally-acme.{name}.v2-state-changelog"),
        &v2_totals,
        &v2_dead,
    ]);
}

/// Acme's served Kafka billing job (`usage-billing`, 2 input partitions)
/// named after `what`, deployed, with `count` lines of `seed` produced and
/// committed: the job, its name, the lines and where they landed.
fn deployed_and_committed(
    host: &ServeHost,
    what: &str,
    seed: u64,
    count: usize,
) -> (KafkaBillingJob, String, Vec<UsageLine>, Vec<Placed>) {
    let job = KafkaBillingJob::create(&format!("acme.{what}"), 2);
    let name = unique(what);
    host.client(ACME)
        .deploy(&kafka_job_file(&name, &job), &std::fs::read(plugins::USAGE_BILLING).unwrap())
        .unwrap();
    let lines = usage_lines(seed, count, 0);
    let placed = produce_usage(&job.input, &lines, 2);
    let group = group_reader(&format!("tally-acme.{name}"));
    wait_for("the job to commit every record", Duration::from_secs(120), || {
        committed_progress(&group, &job.input, 2) == lines.len() as i64
    });
    (job, name, lines, placed)
}
