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
            let output = LocalOutput::new(
                local.output_dir.join(format!("{}.ndjson", settings.output)),
                local.state_dir.join("db"),
                settings.state_dir.join("job-view"),
                settings.output.clone(),
            );
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
            let consumer = tally_kafka::base_config(kafka, tally_kafka::ClientRole::Consumer);
            let output = KafkaOutput::new(consumer, topic, &format!("{ledger_topic}-reader"))?;
            let producer = tally_kafka::base_config(kafka, tally_kafka::ClientRole::Producer);
            let mirror = KafkaLedgerMirror::open(&producer, &ledger_topic)
                .with_context(|| format!("opening the delivery ledger's topic `{ledger_topic}`"))?;
            Ok((Box::new(output), Some(Arc::new(mirror))))
        }
    }
}
