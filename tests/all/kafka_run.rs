//! Kafka mode end to end against the real broker: a billing job over a
//! partitioned input topic, read back `read_committed` by an independent
//! checker that uses the lineage headers.

use std::process::Command;

use tally_tests::kafka::*;
use tally_tests::*;

use crate::plugins::USAGE_BILLING;

#[test]
fn a_kafka_job_counts_every_event_once_and_labels_every_output() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("run", 4);
    let lines = usage_lines(11, 20_000, 10);
    let placed = produce_usage(&job.input, &lines, job.partitions);
    let job_file = job.write_job_file(dir.path(), USAGE_BILLING, &dir.path().join("state"), "", "");

    let output = Command::new(tally_binary()).args(["run", "--until-caught-up"]).arg(&job_file).output().unwrap();
    assert!(output.status.success(), "tally failed: {}", String::from_utf8_lossy(&output.stderr));

    let totals = read_topic(&job.totals, true);
    let dead = read_topic(&job.dead_letters, true);
    let verdict = check(&job.input, &lines, &placed, &totals, &dead);
    assert_eq!((verdict.missing, verdict.doubled), (0, 0));
    assert_eq!(verdict.totals, expected_totals(&lines));
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
