//! Kafka mode end to end against the real broker: a billing job over a
//! partitioned input topic, read back `read_committed` by an independent
//! checker that uses the lineage headers.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use tally_tests::kafka::*;
use tally_tests::*;

use crate::plugins::USAGE_BILLING;

/// Runs `job_file` until caught up; checks that every line counted once and
/// the totals are exact; returns the totals and dead letters read committed.
fn run_until_caught_up_exactly_once(
    job: &KafkaBillingJob,
    job_file: &std::path::Path,
    lines: &[UsageLine],
    placed: &[Placed],
) -> (Vec<OutputRecord>, Vec<OutputRecord>) {
    let output = Command::new(tally_binary())
        .args(["run", "--until-caught-up"])
        .arg(job_file)
        .output()
        .unwrap();
    assert!(output.status.success(), "tally failed: {}", String::from_utf8_lossy(&output.stderr));
    let totals = read_topic(&job.totals, true);
    let dead = read_topic(&job.dead_letters, true);
    let verdict = check(&job.input, lines, placed, &totals, &dead);
    assert_eq!((verdict.missing, verdict.doubled), (0, 0));
    assert_eq!(verdict.totals, expected_totals(lines));
    (totals, dead)
}

#[test]
fn a_kafka_job_counts_every_event_once_and_labels_every_output() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("run", 4);
    let lines = usage_lines(11, 20_000, 10);
    let placed = produce_usage(&job.input, &lines, job.partitions);
    let job_file = job.write_job_file(dir.path(), USAGE_BILLING, &dir.path().join("state"), "", "");

    let (totals, dead) = run_until_caught_up_exactly_once(&job, &job_file, &lines, &placed);
    let rejected = lines.iter().filter(|line| line.effect.is_none()).count();
    assert_eq!(dead.len(), rejected);
    assert!(dead.iter().all(|record| !record.header("tally.reason").is_empty()));
    for record in &totals {
        let (topic, partition, offset) = record.source();
        let key = record.header("tally.idempotency-key");
        assert_eq!(key, format!("{}/{topic}/{partition}/{offset}/0", job.name));
        assert!(record.header("tally.plugin").starts_with("sha256:"));
    }
}

#[test]
fn an_aborted_transaction_is_seen_by_read_uncommitted_readers_only() {
    use std::sync::Arc;
    use std::time::Duration;

    use rdkafka::ClientConfig;
    use rdkafka::consumer::BaseConsumer;
    use rdkafka::producer::Producer;
    use tally_core::limits::Limits;
    use tally_core::state::MemoryStore;
    use tally_core::transaction::{SourcePosition, Transaction};
    use tally_kafka::Guarantee;
    use tally_kafka::committer::{
        Addresses, DeliveryTracker, JobProducer, KafkaCommitter, RecordCollector, TransactionOwner,
    };

    let _serial = serial();
    let job = KafkaBillingJob::create("abort", 1);
    let producer: Arc<JobProducer> = Arc::new(
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("transactional.id", unique("tally-test-abort"))
            .create_with_context(DeliveryTracker::new("unused-changelog".into()))
            .unwrap(),
    );
    let owner = Arc::new(TransactionOwner::new(
        producer.clone(),
        Guarantee::ExactlyOnce,
        Duration::from_secs(30),
    ));
    owner.fence_earlier_producers().unwrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("g"))
        .create()
        .unwrap();
    let store = Arc::new(MemoryStore::default());
    let addresses = Addresses {
        job: job.name.clone(),
        inputs: vec![job.input.clone()],
        outputs: vec![job.totals.clone()],
        dead_letter: job.dead_letters.clone(),
        changelog: "unused-changelog".into(),
        watermarks: None,
    };
    let collector = RecordCollector::new(owner.clone(), addresses);
    let committer = KafkaCommitter::new(owner, collector, store.clone());
    let mut txn = Transaction::new(store, vec!["totals".to_string()].into(), Limits::default());
    txn.plugin_digest = "sha256:test".into();
    let emit = |txn: &mut Transaction, values: &[&str]| {
        txn.begin_batch(
            (0..values.len() as u64).map(|offset| SourcePosition { partition: 0, offset }),
        );
        txn.emit_many(
            "totals",
            values
                .iter()
                .enumerate()
                .map(|(event, value)| (event as u32, None, value.as_bytes().to_vec())),
        )
        .unwrap();
        txn.keep_batch();
    };

    emit(&mut txn, &["aborted-1", "aborted-2", "aborted-3"]);
    committer.collector().send_outputs(&mut txn).unwrap();
    // Flushed, so the records reach the log before the abort marker (an
    // abort drops records still queued in the client).
    producer.flush(Duration::from_secs(30)).unwrap();
    committer.abort().unwrap();
    txn.abort();
    emit(&mut txn, &["committed-1", "committed-2"]);
    let prepared = committer.prepare(&mut txn, &Default::default(), &consumer).unwrap().unwrap();
    committer.commit(prepared, &consumer).unwrap();
    txn.prepared_took_effect();

    let values = |records: Vec<OutputRecord>| -> Vec<String> {
        records.into_iter().map(|record| String::from_utf8(record.value).unwrap()).collect()
    };
    assert_eq!(values(read_topic(&job.totals, true)), ["committed-1", "committed-2"]);
    assert_eq!(
        values(read_topic(&job.totals, false)),
        ["aborted-1", "aborted-2", "aborted-3", "committed-1", "committed-2"]
    );
}

#[test]
fn rewinding_the_groups_offsets_by_hand_makes_the_next_start_refuse() {
    use std::time::{Duration, Instant};

    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("rewind", 2);
    let lines = usage_lines(5, 2_000, 0);
    produce_usage(&job.input, &lines, job.partitions);
    // A short session, so the group empties soon after the job exits (a
    // static member does not leave the group when it closes).
    let job_file = job.write_job_file(
        dir.path(),
        USAGE_BILLING,
        &dir.path().join("state"),
        "",
        "\"session.timeout.ms\" = \"6000\"",
    );
    let first = Command::new(tally_binary())
        .args(["run", "--until-caught-up"])
        .arg(&job_file)
        .output()
        .unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let committed_totals = read_topic(&job.totals, true).len();

    // What an operator would type; it only works once the group is empty.
    let group = format!("tally-{}", job.name);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (reset, said) = kafka_script(&[
            "groups",
            "--group",
            &group,
            "--reset-offsets",
            "--to-earliest",
            "--topic",
            &job.input,
            "--execute",
        ]);
        if reset && !said.contains("Error") {
            break;
        }
        assert!(Instant::now() < deadline, "the group never became empty: {said}");
        std::thread::sleep(Duration::from_secs(1));
    }

    let second = Command::new(tally_binary())
        .args(["run", "--until-caught-up"])
        .arg(&job_file)
        .output()
        .unwrap();
    assert!(!second.status.success(), "a start after a rewind must be refused");
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        said.contains("refuses to start") && said.contains("would count those records twice"),
        "{said}"
    );
    assert!(
        said.contains("replay into a new output version"),
        "the message should point to a replay: {said}"
    );
    assert_eq!(
        read_topic(&job.totals, true).len(),
        committed_totals,
        "a refused start must commit nothing"
    );
}

#[test]
fn a_changelog_started_over_behind_the_state_makes_the_next_start_refuse() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("changelog-lost", 2);
    produce_usage(&job.input, &usage_lines(7, 2_000, 0), job.partitions);
    let job_file = job.write_job_file(dir.path(), USAGE_BILLING, &dir.path().join("state"), "", "");
    let first = Command::new(tally_binary())
        .args(["run", "--until-caught-up"])
        .arg(&job_file)
        .output()
        .unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let committed_totals = read_topic(&job.totals, true).len();

    // An operator "starts the changelog over": its records are gone, while
    // the state directory says it has read them.
    recreate_topic(&format!("tally-{}-state-changelog", job.name), job.partitions);
    produce_usage(&job.input, &usage_lines(8, 500, 0), job.partitions);

    let second = Command::new(tally_binary())
        .args(["run", "--until-caught-up"])
        .arg(&job_file)
        .output()
        .unwrap();
    assert!(!second.status.success(), "a start over a changelog that lost records must be refused");
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(said.contains("lost records since (deleted and recreated, or truncated)"), "{said}");
    assert!(
        said.contains("run the job under a new name"),
        "the message should say how to recover: {said}"
    );
    assert_eq!(
        read_topic(&job.totals, true).len(),
        committed_totals,
        "a refused start must commit nothing"
    );
}

#[test]
fn an_at_least_once_job_counts_every_event_when_nothing_fails() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("alos", 2);
    let lines = usage_lines(13, 5_000, 10);
    let placed = produce_usage(&job.input, &lines, job.partitions);
    let job_file = job.write_job_file_with_kafka(
        dir.path(),
        USAGE_BILLING,
        &dir.path().join("state"),
        "",
        "guarantee = \"at_least_once\"",
        "",
    );
    let output = Command::new(tally_binary())
        .args(["run", "--until-caught-up"])
        .arg(&job_file)
        .output()
        .unwrap();
    assert!(output.status.success(), "tally failed: {}", String::from_utf8_lossy(&output.stderr));
    let verdict = check(
        &job.input,
        &lines,
        &placed,
        &read_topic(&job.totals, true),
        &read_topic(&job.dead_letters, true),
    );
    assert_eq!((verdict.missing, verdict.doubled), (0, 0));
    assert_eq!(verdict.totals, expected_totals(&lines));
}

#[test]
fn a_job_over_two_input_topics_counts_each_record_once_and_stops_when_both_are_read() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("two-inputs", 3);
    let second = format!("{}-more", job.input);
    create_topic(&second, job.partitions);
    let lines = usage_lines(17, 12_000, 10);
    let (first_lines, second_lines) = lines.split_at(lines.len() / 2);
    let mut produced: Vec<(String, i32, i64)> = Vec::new();
    for (topic, part) in [(&job.input, first_lines), (&second, second_lines)] {
        let placed = produce_usage(topic, part, job.partitions);
        produced
            .extend(placed.iter().map(|placed| (topic.clone(), placed.partition, placed.offset)));
    }
    let job_file = job.write_job_file(dir.path(), USAGE_BILLING, &dir.path().join("state"), "", "");
    let text = std::fs::read_to_string(&job_file).unwrap();
    let text = text.replace(
        &format!("inputs = [{:?}]", job.input),
        &format!("inputs = [{:?}, {second:?}]", job.input),
    );
    std::fs::write(&job_file, text).unwrap();

    // --until-caught-up ends only once every partition of both topics has
    // reported its end.
    let output = Command::new(tally_binary())
        .args(["run", "--until-caught-up"])
        .arg(&job_file)
        .output()
        .unwrap();
    delete_topics(&[&second]);
    assert!(output.status.success(), "tally failed: {}", String::from_utf8_lossy(&output.stderr));

    let totals = read_topic(&job.totals, true);
    let dead = read_topic(&job.dead_letters, true);
    let mut contributions: HashMap<(String, i32, i64), u32> = HashMap::new();
    for record in totals.iter().chain(&dead) {
        *contributions.entry(record.source()).or_default() += 1;
    }
    let missing = produced.iter().filter(|source| !contributions.contains_key(*source)).count();
    let doubled = contributions.values().filter(|&&count| count > 1).count();
    assert_eq!(
        (missing, doubled, contributions.len()),
        (0, 0, produced.len()),
        "each input record of both topics contributes once"
    );
    // A key's totals share an output partition, in the order they were made.
    let mut last_totals = std::collections::BTreeMap::new();
    for record in &totals {
        last_totals
            .insert(billing_key(record), serde_json::from_slice::<u64>(&record.value).unwrap());
    }
    assert_eq!(last_totals, expected_totals(&lines));
}

#[test]
fn kafka_records_over_the_record_limit_are_dead_lettered_and_the_rest_count_once() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("long", 2);
    // Every 25th record padded past the job's limit of 200 bytes (still
    // under the 1 KiB its dead letter keeps, where a cut once panicked).
    let mut lines = usage_lines(23, 2_000, 0);
    for line in lines.iter_mut().step_by(25) {
        line.line = line.line.replacen('{', &format!("{{\"pad\":\"{}\",", "p".repeat(300)), 1);
        line.effect = None;
    }
    let placed = produce_usage(&job.input, &lines, job.partitions);
    let job_file = job.write_job_file(
        dir.path(),
        USAGE_BILLING,
        &dir.path().join("state"),
        "[limits]\nmax_record_bytes = 200",
        "",
    );
    let (_, dead) = run_until_caught_up_exactly_once(&job, &job_file, &lines, &placed);
    assert_eq!(dead.len(), 80);
    assert!(
        dead.iter().all(|record| record
            .header("tally.reason")
            .contains("over the job's limit of 200 bytes (limits.max_record_bytes)")),
        "{:?}",
        dead[0].header("tally.reason")
    );
}

#[test]
fn a_slow_restore_that_keeps_making_progress_outlasts_its_stall_limit_in_one_session_and_shows_its_progress_in_the_log_and_metrics()
 {
    const KEYS: usize = 300_000;
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("slow-restore", 4);
    let mut lines = distinct_key_lines(KEYS, 1);
    let mut placed = produce_usage(&job.input, &lines, job.partitions);
    // Small fetches (one record batch of the changelog, about 1 MB, per
    // response), so a slow broker hands the restore its records a bit at a
    // time; a stall limit of four seconds (a broker that runs 1.4 % of the
    // time, below, now and then answers nothing for two: its own timers
    // and collector come first).
    let client = "\"consumer.max.partition.fetch.bytes\" = \"65536\"\n\"consumer.fetch.max.bytes\" = \"1000000\"";
    let state = dir.path().join("state");
    let job_file = job.write_job_file_with_kafka(
        dir.path(),
        USAGE_BILLING,
        &state,
        "",
        "restore_stall_ms = 4000",
        client,
    );
    let run = || {
        let output = Command::new(tally_binary())
            .args(["run", "--until-caught-up"])
            .arg(&job_file)
            .env("RUST_LOG", "info")
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{log}");
        log
    };
    run();

    // The state is lost, and the broker is overloaded: it stalls for 0.7 s
    // at a time, shorter than the stall limit, and runs 10 ms between, so
    // the restore of about 20 MB takes seconds, each step well within the
    // limit.
    std::fs::remove_dir_all(state.join("db")).unwrap();
    let again = distinct_key_lines(1_000, 2);
    placed.extend(produce_usage(&job.input, &again, job.partitions));
    lines.extend(again);
    let mut stutter =
        Some(BrokerStutter::start(Duration::from_millis(700), Duration::from_millis(10)));
    let log_path = dir.path().join("restore.log");
    let mut child = spawn_run_logging_to(
        &["--until-caught-up", "--metrics", "127.0.0.1:0"],
        &job_file,
        &log_path,
    );
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    // Scraped while it runs: the restore's figures, as `tally serve` has them.
    let mut scrapes_while_restoring = Vec::new();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        // The broker stutters for the restore only: left stuttering (it
        // runs 1.4 % of the time), the job's first transaction after it
        // can time out on a loaded machine, and a new session restores
        // again (seen once in a full run).
        if stutter.is_some() && read_log().contains("state restored and checked") {
            stutter = None;
        }
        let address = read_log().lines().find_map(|line| {
            line.strip_prefix("metrics: http://")
                .and_then(|rest| rest.strip_suffix("/metrics"))
                .map(str::to_string)
        });
        if let Some(metrics) = address.and_then(|address| scrape(&address)) {
            let restoring = metric(&metrics, "tally_restoring");
            if restoring == Some(1.0) {
                scrapes_while_restoring.push((
                    metric(&metrics, "tally_restore_records_done"),
                    metric(&metrics, "tally_restore_records_to_go"),
                ));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(stutter);
    let log = read_log();
    assert!(status.success(), "{status}:\n{log}");
    assert!(
        scrapes_while_restoring.len() >= 3,
        "the metrics said `restoring` for a restore of seconds: {scrapes_while_restoring:?}\n{log}"
    );
    assert!(
        scrapes_while_restoring
            .iter()
            .any(|&(done, to_go)| done.unwrap_or(0.0) > 0.0 && to_go.unwrap_or(0.0) > 0.0),
        "records done and to go while it restores: {scrapes_while_restoring:?}"
    );

    let restored: Vec<&str> =
        log.lines().filter(|line| line.contains("restored state from the changelog")).collect();
    assert_eq!(restored.len(), 1, "one restore, in one session:\n{log}");
    println!("{}", restored[0]);
    assert!(!log.contains("Kafka session failed"), "the restore must not fail:\n{log}");
    let field = |line: &str, name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|word| {
                word.strip_prefix(&format!("{name}=")).and_then(|value| value.parse().ok())
            })
            .unwrap()
    };
    assert!(field(restored[0], "records") >= KEYS as u64, "{}", restored[0]);
    assert!(
        field(restored[0], "took_ms") > 4_000,
        "the restore outlasts its 4 s stall limit: {}",
        restored[0]
    );
    let progress: Vec<&str> =
        log.lines().filter(|line| line.contains("records restored, at most")).collect();
    assert!(!progress.is_empty(), "a restore of seconds logs its progress:\n{log}");
    assert!(
        progress.iter().all(|line| line.contains("to go") && line.contains("records/s")),
        "{progress:?}"
    );
    assert!(
        progress.iter().any(|line| line.contains("s left")),
        "once a rate is known, the time left is estimated: {progress:?}"
    );

    // The restored state is what the new events added to.
    let verdict = check(
        &job.input,
        &lines,
        &placed,
        &read_topic(&job.totals, true),
        &read_topic(&job.dead_letters, true),
    );
    assert_eq!((verdict.missing, verdict.doubled), (0, 0));
    assert_eq!(verdict.totals, expected_totals(&lines));
}

/// `GET /metrics` at `address`, if it answers.
fn scrape(address: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.starts_with("HTTP/1.1 200").then_some(answer)
}

/// The value of the one sample of `name` in Prometheus text `metrics`.
fn metric(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|line| line.split(['{', ' ']).next() == Some(name))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

#[test]
fn a_job_that_commits_when_caught_up_commits_each_trickle_long_before_its_interval_and_counts_once()
{
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("caught-up", 4);
    // Two minutes between interval commits: every commit the test waits
    // for below is one the job made because it was caught up.
    let job_file = job.write_job_file_with_kafka(
        dir.path(),
        USAGE_BILLING,
        &dir.path().join("state"),
        "commit_interval_ms = 120000",
        "commit_when_caught_up = true\ntransaction_timeout_ms = 300000",
        "",
    );
    let started = std::time::Instant::now();
    /// Killed when dropped: a failed wait leaves no job running.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let tally = Killed(Command::new(tally_binary()).arg("run").arg(&job_file).spawn().unwrap());
    let lines = usage_lines(23, 3_000, 10);
    let trickles: Vec<&[UsageLine]> = lines.chunks(1_000).collect();
    let mut placed = Vec::new();
    for (number, trickle) in trickles.iter().enumerate() {
        placed.extend(produce_usage(&job.input, trickle, job.partitions));
        if number == trickles.len() - 1 {
            break;
        }
        let so_far = &lines[..placed.len()];
        tally_tests::serve::wait_for(
            "the trickle's events committed, read_committed",
            Duration::from_secs(40),
            || {
                let totals = read_topic(&job.totals, true);
                let dead = read_topic(&job.dead_letters, true);
                check(&job.input, so_far, &placed, &totals, &dead).missing == 0
            },
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "the trickles were committed before the first interval commit could be"
    );
    // Killed with the last trickle perhaps half committed: the next run
    // counts each event once.
    drop(tally);
    run_until_caught_up_exactly_once(&job, &job_file, &lines, &placed);
}

#[test]
fn jobs_on_topics_they_create_start_without_a_failed_session_and_count_once() {
    // A changelog asked about before its partitions had leaders was cached
    // without them, and every session failed on it until the client's next
    // metadata refresh (minutes). Several jobs starting at once, each
    // creating its own topics, make that race likely on a busy broker.
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let input = unique("create-own-usage");
    let partitions = 8;
    create_topic(&input, partitions);
    let lines = usage_lines(29, 4_000, 10);
    let placed = produce_usage(&input, &lines, partitions);
    let jobs: Vec<KafkaBillingJob> = (0..3)
        .map(|number| {
            let name = unique("create-own");
            KafkaBillingJob {
                input: input.clone(),
                totals: format!("{name}-totals"),
                dead_letters: format!("{name}-dead-letters"),
                name,
                partitions,
                // The first job deletes the shared input when dropped.
                owns_input: number == 0,
            }
        })
        .collect();
    /// Killed when dropped: a failed check leaves no job running.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let runs: Vec<(Killed, std::path::PathBuf)> = jobs
        .iter()
        .enumerate()
        .map(|(number, job)| {
            let state = dir.path().join(format!("state-{number}"));
            let file = job.write_job_file_with_kafka(
                dir.path(),
                USAGE_BILLING,
                &state,
                "",
                "create_topics = true",
                "",
            );
            let log = dir.path().join(format!("job-{number}.log"));
            let child = Command::new(tally_binary())
                .args(["run", "--until-caught-up"])
                .arg(file)
                .env("RUST_LOG", "warn")
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            (Killed(child), log)
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    for (job, (mut run, log)) in jobs.iter().zip(runs) {
        let status = loop {
            if let Some(status) = run.0.try_wait().unwrap() {
                break status;
            }
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                std::time::Instant::now() < deadline,
                "{} still runs after 180 s: {log}",
                job.name
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let log = std::fs::read_to_string(&log).unwrap();
        assert!(status.success(), "{} failed: {log}", job.name);
        let metadata_failures: Vec<&str> = log
            .lines()
            .filter(|line| {
                line.contains("session failed") && line.contains("Meta data fetch error")
            })
            .collect();
        assert!(
            metadata_failures.is_empty(),
            "{}'s sessions failed on its new topics' metadata: {metadata_failures:#?}",
            job.name
        );
        let totals = read_topic(&job.totals, true);
        let dead = read_topic(&job.dead_letters, true);
        let verdict = check(&input, &lines, &placed, &totals, &dead);
        assert_eq!((verdict.missing, verdict.doubled), (0, 0), "{}", job.name);
        assert_eq!(verdict.totals, expected_totals(&lines), "{}", job.name);
    }
}
