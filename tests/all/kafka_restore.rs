//! Restores against the real broker, on changelogs made hard on purpose:
//! aborted transactions interleaved with committed ones and with plain
//! records, a compressed changelog, a broker restart in the middle. Each
//! ends with the independent checker: every total adds exactly its own
//! event to what the restored state held.

use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tally_tests::kafka::*;
use tally_tests::*;

use crate::plugins::USAGE_BILLING;

const PARTITIONS: i32 = 4;

/// One event per customer, quantities 1 to 7 (neighbours differ).
fn varied_lines(count: usize) -> Vec<UsageLine> {
    (0..count)
        .map(|index| {
            let customer = format!("c{index:07}");
            let quantity = index as u64 % 7 + 1;
            let line = format!(r#"{{"customer":"{customer}","metric":"api_calls","quantity":{quantity},"ts":"2026-11-15T12:00:00Z"}}"#);
            UsageLine { line, effect: Some(((customer, "api_calls".to_string(), "2026-11".to_string()), quantity)) }
        })
        .collect()
}

/// Checks the job's outputs: every event counted once, each total adding
/// exactly its event to what its key held (a restore that lost or changed
/// a key shows here).
fn assert_counted_once(job: &KafkaBillingJob, lines: &[UsageLine], placed: &[Placed]) {
    let verdict = check(
        &job.input,
        lines,
        placed,
        &read_topic(&job.totals, true),
        &read_topic(&job.dead_letters, true),
    );
    assert_eq!((verdict.missing, verdict.doubled), (0, 0));
    assert_eq!(verdict.totals, expected_totals(lines));
}

/// Runs `tally run --until-caught-up` on `job_file`; returns its log.
pub(crate) fn run(job_file: &std::path::Path) -> String {
    let output = Command::new(tally_binary())
        .args(["run", "--until-caught-up"])
        .arg(job_file)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "tally failed: {}", &log[log.len().saturating_sub(4000)..]);
    log
}

/// The records and bytes a run's restores applied, from their log lines.
fn restored(log: &str) -> (u64, u64) {
    let field = |line: &str, name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|word| {
                word.strip_prefix(&format!("{name}=")).and_then(|value| value.parse().ok())
            })
            .unwrap()
    };
    let lines: Vec<&str> =
        log.lines().filter(|line| line.contains("restored state from the changelog")).collect();
    assert!(!lines.is_empty(), "the run restored nothing:\n{log}");
    lines.iter().fold((0, 0), |(records, bytes), line| {
        (records + field(line, "records"), bytes + field(line, "bytes"))
    })
}

/// A producer with transactional id `id`, its transactions initialised.
fn transactional(id: &str) -> BaseProducer {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", unique(id))
        .set("linger.ms", "5")
        .create()
        .unwrap();
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    producer
}

/// Sends `records` (partition, key, value) and waits for them to land.
fn send_all(producer: &BaseProducer, topic: &str, records: &[(i32, Vec<u8>, Vec<u8>)]) {
    for (partition, key, value) in records {
        let mut record = BaseRecord::<[u8], [u8]>::to(topic)
            .partition(*partition)
            .key(&key[..])
            .payload(&value[..]);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

#[test]
fn a_restore_applies_only_committed_changelog_records_whether_it_fetches_from_the_leaders_or_through_the_consumer()
 {
    const KEYS: usize = 3_000;
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("restore-aborts", PARTITIONS);
    let state = dir.path().join("state");
    // Two job files over one state directory: one instance of the group,
    // whichever way it restores.
    let files = |name: &str, kafka: &str| {
        let files = dir.path().join(name);
        std::fs::create_dir_all(&files).unwrap();
        job.write_job_file_with_kafka(&files, USAGE_BILLING, &state, "", kafka, "")
    };
    let (leaders, consumer) = (
        files("leaders", "restore_fetch = \"leaders\""),
        files("consumer", "restore_fetch = \"consumer\""),
    );
    let mut lines = varied_lines(KEYS);
    let mut placed = produce_usage(&job.input, &lines, PARTITIONS);
    run(&leaders);

    // Write into the changelog what a zombie would, and abort it: each
    // state key with another key's total, and an included offset far
    // ahead. Around it, other producers' committed transactions and plain
    // records repeat committed records as they are (harmless if applied
    // again), so aborted batches, markers and committed batches interleave.
    let changelog = format!("tally-{}-state-changelog", job.name);
    let committed: Vec<(i32, Vec<u8>, Vec<u8>)> = read_topic(&changelog, true)
        .into_iter()
        .map(|record| (record.partition, record.key.unwrap_or_default(), record.value))
        .collect();
    let states = |partition: i32| {
        committed.iter().filter(move |(p, key, _)| *p == partition && key.first() == Some(&b's'))
    };
    let mut bogus = Vec::new();
    for partition in 0..PARTITIONS {
        let records: Vec<&(i32, Vec<u8>, Vec<u8>)> = states(partition).collect();
        for (n, (_, key, value)) in records.iter().enumerate() {
            let other = records
                .iter()
                .cycle()
                .skip(n + 1)
                .take(records.len())
                .map(|(_, _, value)| value)
                .find(|other| *other != value);
            bogus.push((partition, key.clone(), other.expect("another total").clone()));
        }
        let offset_key = committed
            .iter()
            .find(|(p, key, _)| *p == partition && key.first() == Some(&b'o'))
            .expect("an included offset");
        bogus.push((partition, offset_key.1.clone(), b"99999999".to_vec()));
    }
    let repeats: Vec<(i32, Vec<u8>, Vec<u8>)> =
        (0..PARTITIONS).flat_map(|partition| states(partition).take(50).cloned()).collect();
    let zombie = transactional("tally-test-zombie");
    let other = transactional("tally-test-other");
    let plain: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    zombie.begin_transaction().unwrap();
    send_all(&zombie, &changelog, &bogus);
    other.begin_transaction().unwrap();
    send_all(&other, &changelog, &repeats);
    other.commit_transaction(Duration::from_secs(30)).unwrap();
    send_all(&zombie, &changelog, &bogus[..bogus.len() / 2]);
    zombie.abort_transaction(Duration::from_secs(30)).unwrap();
    send_all(&plain, &changelog, &repeats);
    zombie.begin_transaction().unwrap();
    send_all(&zombie, &changelog, &bogus[bogus.len() / 2..]);
    zombie.abort_transaction(Duration::from_secs(30)).unwrap();

    // Both ways apply the same records from the same changelog.
    std::fs::remove_dir_all(state.join("db")).unwrap();
    let from_leaders = run(&leaders);
    std::fs::remove_dir_all(state.join("db")).unwrap();
    let through_consumer = run(&consumer);
    assert!(
        !from_leaders.contains("through librdkafka's consumer"),
        "the leaders' fetch read it all:\n{from_leaders}"
    );
    let applied = restored(&from_leaders);
    assert_eq!(
        applied,
        restored(&through_consumer),
        "the leaders' fetch applies what a read_committed consumer hands over"
    );
    assert_eq!(
        applied.0,
        (committed.len() + 2 * repeats.len()) as u64,
        "the committed records, and the repeats twice"
    );

    // Every key counts on from its committed total, never the zombie's.
    let again = distinct_key_lines(KEYS, 1);
    placed.extend(produce_usage(&job.input, &again, PARTITIONS));
    lines.extend(again);
    std::fs::remove_dir_all(state.join("db")).unwrap();
    run(&leaders);
    assert_counted_once(&job, &lines, &placed);
}

#[test]
fn a_compressed_changelog_is_restored_through_the_consumer_and_counts_exactly_once() {
    const KEYS: usize = 5_000;
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("restore-gzip", PARTITIONS);
    let state = dir.path().join("state");
    // The leaders' fetch finds the compressed batches and hands over.
    let job_file = job.write_job_file_with_kafka(
        dir.path(),
        USAGE_BILLING,
        &state,
        "",
        "restore_fetch = \"leaders\"",
        "\"producer.compression.type\" = \"gzip\"",
    );
    let mut lines = varied_lines(KEYS);
    let mut placed = produce_usage(&job.input, &lines, PARTITIONS);
    run(&job_file);

    std::fs::remove_dir_all(state.join("db")).unwrap();
    let again = distinct_key_lines(KEYS, 1);
    placed.extend(produce_usage(&job.input, &again, PARTITIONS));
    lines.extend(again);
    let log = run(&job_file);
    assert!(
        log.contains("the batch at offset") && log.contains("is compressed (gzip)"),
        "the fallback names its reason:\n{log}"
    );
    assert!(log.contains("through librdkafka's consumer"), "{log}");
    assert!(restored(&log).0 >= KEYS as u64);
    assert_counted_once(&job, &lines, &placed);
}

#[test]
fn a_restore_from_the_leaders_rides_out_a_broker_restart_and_counts_exactly_once() {
    const KEYS: usize = 300_000;
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("restore-broker", PARTITIONS);
    let state = dir.path().join("state");
    // Small fetches and a broker quota make the restore last 20-30 s; the
    // stall limit outlasts the broker's restart.
    let client = "\"consumer.max.partition.fetch.bytes\" = \"65536\"\n\"consumer.fetch.max.bytes\" = \"1000000\"";
    let job_file = job.write_job_file_with_kafka(
        dir.path(),
        USAGE_BILLING,
        &state,
        "",
        "restore_stall_ms = 240000\nrestore_fetch = \"leaders\"",
        client,
    );
    let mut lines = distinct_key_lines(KEYS, 1);
    let mut placed = produce_usage(&job.input, &lines, PARTITIONS);
    run(&job_file);

    std::fs::remove_dir_all(state.join("db")).unwrap();
    let again = distinct_key_lines(KEYS / 10, 2);
    placed.extend(produce_usage(&job.input, &again, PARTITIONS));
    lines.extend(again);
    // The quota is kept in the cluster's metadata, so it still paces the
    // restore after the broker's restart. (A stuttering broker paced it
    // too little: on a quiet machine the restore was done 2 s in, before
    // the broker went down.)
    let changelog = format!("tally-{}-state-changelog", job.name);
    let quota = FetchQuota::set(
        &format!("tally-{}-restore", job.name),
        (topic_bytes(&changelog) / 36).max(1024),
    );
    let log_path = dir.path().join("restore.log");
    let mut child = spawn_run_logging_to(&["--until-caught-up"], &job_file, &log_path);
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    // Killed as soon as records arrive from the leader (the restore says so
    // once per connection): killed earlier, the restore may not have
    // connected to it yet, and only waits for the broker to come back;
    // the progress line (every 2 s) came too late to rely on.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !log().contains("records arriving from the leader") {
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "the restore never read from the leader:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        !log().contains("restored state from the changelog"),
        "the restore ended before the broker went down; make it longer:\n{}",
        log()
    );
    let (killed, said) = kafka_script(&["kill"]);
    assert!(killed, "{said}");
    std::thread::sleep(Duration::from_secs(1));
    let (started, said) = kafka_script(&["start"]);
    assert!(started, "{said}");

    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the job did not finish after the broker came back:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(quota);
    let log = log();
    assert!(status.success(), "{status}:\n{log}");
    assert!(
        log.contains("fetching from the changelog's leaders failed, connecting again"),
        "the restore lost its leader mid-way:\n{log}"
    );
    assert!(
        !log.contains("through librdkafka's consumer"),
        "a broker restart is no reason to read another way:\n{log}"
    );
    assert!(restored(&log).0 >= KEYS as u64);
    assert_counted_once(&job, &lines, &placed);
}

/// Lines of `count` new customers (named `prefix` and a number) whose
/// records land on input partition `partition` of `partitions`.
fn lines_on(partition: i32, partitions: i32, prefix: &str, count: usize) -> Vec<UsageLine> {
    (0..)
        .map(|index| {
            let customer = format!("{prefix}{index:07}");
            let line = format!(r#"{{"customer":"{customer}","metric":"api_calls","quantity":3,"ts":"2026-11-15T12:00:00Z"}}"#);
            UsageLine { line, effect: Some(((customer, "api_calls".to_string(), "2026-11".to_string()), 3)) }
        })
        .filter(|line| partition_of(line, partitions) == partition)
        .take(count)
        .collect()
}

/// Bytes a fetch of the whole of `topic` carries, near enough to pace it
/// with a quota: keys and values, and a record's framing.
fn topic_bytes(topic: &str) -> u64 {
    read_topic(topic, true)
        .iter()
        .map(|record| (record.key.as_ref().map_or(0, Vec::len) + record.value.len() + 16) as u64)
        .sum()
}

/// The `took_ms` of every restore a run's log reports.
fn restore_took_ms(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|line| line.contains("restored state from the changelog"))
        .filter_map(|line| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix("took_ms=").and_then(|value| value.parse().ok()))
        })
        .collect()
}

/// Client settings that make the group throw out a member whose poll
/// thread is away for 6 s (the broker's shortest session), and changelog
/// batches and fetches small enough (16 and 64 KiB) that a fetch quota
/// paces a restore evenly: a broker holds back its answers after a large
/// one for longer than the restore's stall limit.
const PACED_RESTORE_CLIENT: &str = "\"consumer.session.timeout.ms\" = \"6000\"\n\
     \"consumer.heartbeat.interval.ms\" = \"1000\"\n\
     \"consumer.max.poll.interval.ms\" = \"6000\"\n\
     \"consumer.max.partition.fetch.bytes\" = \"65536\"\n\
     \"producer.batch.size\" = \"16384\"\n";

#[test]
fn a_restore_far_longer_than_max_poll_interval_ms_keeps_the_process_in_the_group() {
    const KEYS: usize = 20_000;
    const MAX_POLL_INTERVAL_MS: u64 = 6_000;
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("restore-poll", 1);
    let state = dir.path().join("state");
    let job_file = job.write_job_file(dir.path(), USAGE_BILLING, &state, "", PACED_RESTORE_CLIENT);
    let mut lines = varied_lines(KEYS);
    let mut placed = produce_usage(&job.input, &lines, 1);
    run(&job_file);

    // The broker paces the restore to 20-30 s, several times the poll
    // interval; the job's own clients are not paced.
    let changelog = format!("tally-{}-state-changelog", job.name);
    let quota = FetchQuota::set(
        &format!("tally-{}-restore", job.name),
        (topic_bytes(&changelog) / 36).max(1024),
    );
    std::fs::remove_dir_all(state.join("db")).unwrap();
    let again = lines_on(0, 1, "again", 500);
    placed.extend(produce_usage(&job.input, &again, 1));
    lines.extend(again);
    let log = run(&job_file);
    drop(quota);

    let took = restore_took_ms(&log);
    assert!(
        took.iter().sum::<u64>() > 3 * MAX_POLL_INTERVAL_MS,
        "the quota should have made the restore last over three poll intervals (took {took:?} ms): the test proves nothing"
    );
    assert_eq!(
        log.matches("partitions assigned").count(),
        1,
        "one assignment: the process kept its place in the group through the restore\n{log}"
    );
    assert!(!log.contains("max.poll.interval.ms"), "{log}");
    assert_counted_once(&job, &lines, &placed);
}

#[test]
fn a_partition_restores_while_another_keeps_committing() {
    const PARTITIONS: i32 = 2;
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("restore-beside", PARTITIONS);
    let state = dir.path().join("state");
    let job_file = job.write_job_file(dir.path(), USAGE_BILLING, &state, "", PACED_RESTORE_CLIENT);
    let group = group_reader(&format!("tally-{}", job.name));

    // Both partitions' state, kept aside; then partition 1 alone moves on
    // by 20,000 keys, so that state has all of partition 0's changelog and
    // little of partition 1's.
    let mut lines = lines_on(0, PARTITIONS, "zero", 200);
    lines.extend(lines_on(1, PARTITIONS, "one", 200));
    let mut placed = produce_usage(&job.input, &lines, PARTITIONS);
    run(&job_file);
    let kept = dir.path().join("kept-db");
    std::fs::rename(state.join("db"), &kept).unwrap();
    let long = lines_on(1, PARTITIONS, "long", 20_000);
    placed.extend(produce_usage(&job.input, &long, PARTITIONS));
    lines.extend(long);
    run(&job_file);
    std::fs::remove_dir_all(state.join("db")).unwrap();
    std::fs::rename(&kept, state.join("db")).unwrap();

    // Partition 1's restore is paced to 20-30 s; partition 0 has
    // nothing to restore and new input to run.
    let changelog = format!("tally-{}-state-changelog", job.name);
    let quota = FetchQuota::set(
        &format!("tally-{}-restore", job.name),
        (topic_bytes(&changelog) / 36).max(1024),
    );
    let more = lines_on(0, PARTITIONS, "more", 300);
    let more_placed = produce_usage(&job.input, &more, PARTITIONS);
    let zero_end = more_placed.iter().map(|placed| placed.offset + 1).max().unwrap();
    placed.extend(more_placed);
    lines.extend(more);
    let later = lines_on(1, PARTITIONS, "later", 50);
    placed.extend(produce_usage(&job.input, &later, PARTITIONS));
    lines.extend(later);
    let one_before = committed_offset(&group, &job.input, 1);

    let log_path = dir.path().join("run.log");
    let mut process = std::process::Command::new(tally_binary())
        .args(["run", "--until-caught-up"])
        .arg(&job_file)
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while committed_offset(&group, &job.input, 0) < zero_end {
        assert!(
            process.try_wait().unwrap().is_none(),
            "the job ended before committing partition 0"
        );
        assert!(started.elapsed() < Duration::from_secs(120), "partition 0 was never committed");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Partition 0 is committed; partition 1 is still being restored.
    let log = std::fs::read_to_string(&log_path).unwrap();
    let one_restored = |log: &str| {
        log.lines().any(|line| {
            line.contains("restored state from the changelog") && line.contains("partitions=[1]")
        })
    };
    assert!(
        !one_restored(&log) && process.try_wait().unwrap().is_none(),
        "partition 1's restore should still be under way:\n{log}"
    );
    assert_eq!(committed_offset(&group, &job.input, 1), one_before);

    let status = process.wait().unwrap();
    drop(quota);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(status.success(), "tally failed: {}", &log[log.len().saturating_sub(4000)..]);
    assert!(one_restored(&log), "{log}");
    assert!(
        restore_took_ms(&log).iter().sum::<u64>() > 10_000,
        "the quota should have made partition 1's restore long: the test proves nothing\n{log}"
    );
    assert_counted_once(&job, &lines, &placed);
}

/// The group's committed offset of `topic` partition `partition` (0 if none).
fn committed_offset(group: &rdkafka::consumer::BaseConsumer, topic: &str, partition: i32) -> i64 {
    use rdkafka::consumer::Consumer;
    let mut wanted = rdkafka::TopicPartitionList::new();
    wanted.add_partition(topic, partition);
    match group.committed_offsets(wanted, Duration::from_secs(5)) {
        Ok(committed) => match committed.elements()[0].offset() {
            rdkafka::Offset::Offset(offset) => offset,
            _ => 0,
        },
        Err(_) => 0,
    }
}
