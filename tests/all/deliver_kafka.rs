//! Delivery of a Kafka job's committed output, against the real broker: a
//! period job's FINAL and ADJUSTMENT records, read `read_committed` from
//! its output topic, delivered to the failing HTTP receiver with the
//! deliverer SIGKILLed again and again, then by a deliverer on a "new
//! machine" (no state directory) that resumes from the ledger's compacted
//! topic and sends nothing again; and into PostgreSQL, whose positions
//! are kept per output partition.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tally_tests::kafka::*;
use tally_tests::periods::time_zones_table;
use tally_tests::receiver::{Faults, Receiver};

use crate::deliver::{
    check_applied_once, deliver, deliver_to_the_end, deliver_with_kills,
    write_delivery_file as write_delivery,
};
use crate::kafka_restore::run as run_to_end;
use crate::periods_kafka::{
    PARTITIONS, first_run_lines, input_checked, produce, second_run_lines, write_job_file,
};

/// A period job in Kafka mode over generated input (both of its runs);
/// its job file and its output records read `read_committed`: (idempotency
/// key, record key, value), in each partition's order.
fn kafka_period_job(
    dir: &Path,
    per_partition: usize,
) -> (KafkaBillingJob, PathBuf, Vec<(String, String, Value)>) {
    let (input, _) = input_checked(47, per_partition);
    let job = KafkaBillingJob::create("deliver-kafka", PARTITIONS as i32);
    let periods = format!("time_zones = {}", time_zones_table());
    let job_file = write_job_file(&job, dir, &dir.join("state"), "", &periods);
    produce(&job, &first_run_lines(&input));
    run_to_end(&job_file);
    produce(&job, &second_run_lines(&input));
    run_to_end(&job_file);
    let records = read_topic(&job.totals, true)
        .iter()
        .map(|record| {
            let key = record.key.as_deref().map(|key| {
                serde_json::from_slice::<Value>(key).expect("output keys are JSON").to_string()
            });
            (
                record.header("tally.idempotency-key").to_string(),
                key.unwrap_or_default(),
                serde_json::from_slice(&record.value).unwrap(),
            )
        })
        .collect();
    (job, job_file, records)
}

#[test]
fn a_kafka_jobs_records_are_delivered_once_through_kills_and_resumed_on_a_new_machine() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (_job, job_file, records) = kafka_period_job(dir.path(), 600);
    let adjustments = records.iter().filter(|(_, _, value)| value["type"] == "adjustment").count();
    assert!(
        records.len() >= 100 && adjustments >= 3,
        "{} records, {adjustments} adjustments",
        records.len()
    );
    let receiver = Receiver::start(Faults {
        error_500: 100,
        too_many: 60,
        drop_after_apply: 100,
        slow: 30,
        slow_answer: Duration::from_millis(1500),
        latency: Duration::from_millis(20),
        refuse: BTreeSet::new(),
        never_answer: BTreeSet::new(),
    });
    let http = format!(
        "[http]\nurl = {:?}\ntimeout = \"1s\"\nmax_in_flight = 4\nretry_initial = \"20ms\"\nretry_max = \"200ms\"",
        receiver.url()
    );
    let file = write_delivery(dir.path(), "deliver.toml", &job_file, "deliver-state", &http);
    let kills = deliver_with_kills(
        &file,
        8,
        150,
        &mut || receiver.seen(|seen| seen.posts),
        &mut |_, _, _| {},
    );
    assert!(kills >= 6, "only {kills} kills landed mid-delivery");
    check_applied_once(&receiver, &records, None, 10);

    // A new machine: no state directory; the ledger's topic says every
    // record is delivered, so nothing is sent again.
    let posts = receiver.seen(|seen| seen.posts);
    let elsewhere =
        write_delivery(dir.path(), "elsewhere.toml", &job_file, "elsewhere-state", &http);
    let said = deliver_to_the_end(&elsewhere);
    assert!(said.starts_with("delivered 0, dead-lettered 0, waiting as unknown 0"), "{said}");
    assert_eq!(receiver.seen(|seen| seen.posts), posts, "a new machine sent records again");
    let status = deliver(&["status", "--json"], &elsewhere);
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["delivered"], records.len() as u64, "{status}");
    assert_eq!(status["positions"].as_object().unwrap().len(), PARTITIONS, "{status}");
}

#[test]
fn a_kafka_jobs_records_go_into_postgres_once_with_a_position_per_partition() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (job, job_file, records) = kafka_period_job(dir.path(), 300);
    let table =
        format!("kafka_periods_{}", job.name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
    let target = format!(
        "[postgres]\nurl = {:?}\ntable = {table:?}\nbatch_size = 7",
        crate::deliver::postgres_url()
    );
    let file = write_delivery(dir.path(), "deliver.toml", &job_file, "deliver-state", &target);
    let said = deliver_to_the_end(&file);
    assert!(said.starts_with(&format!("delivered {}, ", records.len())), "{said}");
    // A second deliverer with a state directory of its own reads the
    // positions from the database: nothing is applied again.
    let again = write_delivery(dir.path(), "again.toml", &job_file, "again-state", &target);
    let said = deliver_to_the_end(&again);
    assert!(said.starts_with("delivered 0, "), "{said}");

    let mut client = crate::deliver::database();
    let rows = client
        .query(&format!("SELECT idempotency_key, value::text, output_partition FROM {table}"), &[])
        .unwrap();
    assert_eq!(rows.len(), records.len());
    let held: std::collections::BTreeMap<String, Value> = rows
        .iter()
        .map(|row| (row.get(0), serde_json::from_str(&row.get::<_, String>(1)).unwrap()))
        .collect();
    for (key, _, value) in &records {
        assert_eq!(held.get(key), Some(value), "{key}");
    }
    let partitions: BTreeSet<i32> = rows.iter().map(|row| row.get(2)).collect();
    assert!(partitions.len() > 1, "the records came from one partition only: {partitions:?}");
    let positions = client
        .query(
            "SELECT output_partition FROM tally_delivery_positions WHERE target_table = $1",
            &[&table],
        )
        .unwrap();
    assert!(positions.len() >= partitions.len(), "{} positions", positions.len());
    client.batch_execute(&format!("DROP TABLE {table}")).unwrap();
}

#[test]
fn a_delivery_reads_partitions_added_to_the_output_while_it_runs() {
    use std::time::Instant;
    use tally_deliver::{Positions, Source};
    use tally_host::deliver_kafka::KafkaOutput;

    let _serial = serial();
    let topic = unique("deliver-grown");
    create_topic(&topic, 1);
    let mut output = KafkaOutput::new(
        rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap()).clone(),
        &topic,
        &unique("deliver-grown-reader"),
    )
    .unwrap();
    // Every record read, by (partition, offset), until the source says it
    // is caught up (or the budget runs out).
    let read_all = |output: &mut KafkaOutput, seen: &mut Vec<(u32, u64)>, want: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while seen.len() < want || !output.caught_up() {
            assert!(Instant::now() < deadline, "read {} of {want} records: {seen:?}", seen.len());
            seen.extend(output.read(100).unwrap().iter().map(|line| (line.partition, line.offset)));
        }
    };
    let first = produce_records(&topic, &[(0, "a", "1"), (0, "b", "2")]);
    output.start(&Positions::new()).unwrap();
    let mut seen = Vec::new();
    read_all(&mut output, &mut seen, first.len());

    add_partitions(&topic, 3);
    let later = produce_records(&topic, &[(1, "c", "3"), (2, "d", "4"), (0, "e", "5")]);
    read_all(&mut output, &mut seen, first.len() + later.len());
    delete_topics(&[&topic]);

    let mut expected: Vec<(u32, u64)> = first
        .iter()
        .chain(&later)
        .map(|placed| (placed.partition as u32, placed.offset as u64))
        .collect();
    expected.sort();
    seen.sort();
    assert_eq!(seen, expected, "every record once, in the partitions added too");
}
