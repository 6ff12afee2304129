//! Where a delivery reads a job's committed output from: a local job's
//! output file up to its committed length, or a Kafka job's output topic
//! `read_committed`, with the topic its ledger is mirrored to. Shared by
//! `tally deliver` and a served job's `[[deliver]]` sections.

use std::sync::Arc;

use anyhow::{Context, bail};
use tally_deliver::settings::Target;
use tally_deliver::{DeliverSettings, LocalOutput, Mirror, Source};

use crate::config::{JobConfig, Mode};
use crate::deliver_kafka::{KafkaLedgerMirror, KafkaOutput, default_ledger_topic};

/// A Kafka job's delivery ledger mirror, or none.
pub type MaybeMirror = Option<Arc<dyn Mirror>>;

/// The committed output the delivery reads — a local job's output file
/// and store, or a Kafka job's output topic — and, for a Kafka job, the
/// topic its ledger is mirrored to. A PostgreSQL delivery's name defaults
/// to `<job>/<output>`.
pub fn committed_output(
    job: &JobConfig,
    settings: &mut DeliverSettings,
) -> anyhow::Result<(Box<dyn Source>, MaybeMirror)> {
    let default_name = format!("{}/{}", job.settings.name, settings.output);
    if let Target::Postgres(postgres) = &mut settings.target {
        postgres.delivery.get_or_insert(default_name);
    }
    if !job.settings.outputs.contains(&settings.output) {
        bail!(
            "job `{}` has no output {:?} (its outputs: {}); set `output` to one of them",
            job.settings.name,
            settings.output,
            job.settings.outputs.join(", ")
        );
    }
    match &job.mode {
        Mode::Local(local) => {
            if let Some(topic) = &settings.ledger_topic {
                bail!(
                    "ledger_topic = {topic:?} is for the delivery of a Kafka job; job `{}` runs in local mode: remove it",
                    job.settings.name
                );
            }
            // A view of each version's store of its own (`job-view.v2`).
            let view = settings.state_dir.join(format!("job-view{}", local.output_suffix));
            let output = local_output(local, &settings.output, view);
            Ok((Box::new(output), None))
        }
        Mode::Kafka(kafka) => {
            let topic = kafka.output_topic(&settings.output).with_context(|| {
                format!(
                    "job `{}` names no topic for output {:?}",
                    job.settings.name, settings.output
                )
            })?;
            let ledger_topic = settings
                .ledger_topic
                .get_or_insert_with(|| default_ledger_topic(&job.settings.name, &settings.output))
                .clone();
            let output = kafka_output(kafka, topic, &format!("{ledger_topic}-reader"))?;
            let producer = tally_kafka::base_config(kafka, tally_kafka::ClientRole::Producer);
            let mirror = KafkaLedgerMirror::open(&producer, &ledger_topic)
                .with_context(|| format!("opening the delivery ledger's topic `{ledger_topic}`"))?;
            Ok((Box::new(output), Some(Arc::new(mirror))))
        }
    }
}

/// `job`'s committed output `output`, read from its start: the local
/// output file up to its committed length (through a view of the job's
/// store kept in `view_dir`), or the output topic `read_committed` by a
/// client named `reader`.
pub fn output_source(
    job: &JobConfig,
    output: &str,
    view_dir: &std::path::Path,
    reader: &str,
) -> anyhow::Result<Box<dyn Source>> {
    if !job.settings.outputs.iter().chain([&job.settings.dead_letter_output]).any(|o| o == output) {
        bail!(
            "job `{}` has no output {output:?} (its outputs: {})",
            job.settings.name,
            job.settings.outputs.join(", ")
        );
    }
    Ok(match &job.mode {
        Mode::Local(local) => Box::new(local_output(local, output, view_dir.to_path_buf())),
        Mode::Kafka(kafka) => {
            let topic = match kafka.output_topic(output) {
                Some(topic) => topic,
                None => &kafka.dead_letter_topic,
            };
            Box::new(kafka_output(kafka, topic, reader)?)
        }
    })
}

/// A local job's output file `output`, read up to its committed length.
fn local_output(
    local: &tally_local::LocalConfig,
    output: &str,
    view_dir: std::path::PathBuf,
) -> LocalOutput {
    let file_name = format!("{output}{}", local.output_suffix);
    LocalOutput::new(
        local.output_dir.join(format!("{file_name}.ndjson")),
        local.state_dir.join("db"),
        view_dir,
        file_name,
    )
}

/// A Kafka job's output topic, read `read_committed` by a client named `reader`.
fn kafka_output(
    kafka: &tally_kafka::KafkaConfig,
    topic: &str,
    reader: &str,
) -> Result<KafkaOutput, tally_deliver::SourceError> {
    let consumer = tally_kafka::base_config(kafka, tally_kafka::ClientRole::Consumer);
    KafkaOutput::new(consumer, topic, reader)
}
