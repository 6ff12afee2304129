//! Kafka mode's section of a job file, `[kafka]`, and its checks.

use std::path::PathBuf;

use serde::Deserialize;

use tally_core::settings::{InvalidJob, JobSettings};

/// Which guarantee a Kafka job gives.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Guarantee {
    /// Outputs, changelog and input offsets commit in one Kafka transaction.
    #[default]
    ExactlyOnce,
    /// Outputs and changelog are flushed, then offsets committed: after a
    /// crash some records are processed again.
    AtLeastOnce,
}

/// How a Kafka job's restore reads its changelog (`docs/kafka-mode.md`,
/// "Restoring state").
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RestoreFetch {
    /// Reads through librdkafka's restore consumer (`read_committed`):
    /// the Kafka client does what invariant 2 rests on, with leader epochs
    /// (KIP-320), TLS, SASL and every compression codec.
    #[default]
    Consumer,
    /// Opt-in, 1.2-1.5x faster at millions of keys: fetches from the
    /// partitions' leaders itself and reads the record batches in place,
    /// without leader epochs, on plaintext listeners only. What it cannot
    /// read is read by the consumer: TLS or SASL listeners, a compressed
    /// changelog, a broker without Fetch versions 4 to 10.
    Leaders,
}

/// Transaction timeout of a Kafka job when it does not set one: how long a
/// crashed or paused instance's open transaction can hold back readers.
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 10_000;

/// Kafka mode's brokers, topics and state.
///
/// ```toml
/// [kafka]
/// brokers = "127.0.0.1:9092"
/// inputs = ["usage"]
/// outputs = { totals = "billing-totals" }
/// dead_letter_topic = "billing-dead-letters"
/// state_dir = "state"
/// ```
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap servers (`host:port,...`).
    pub brokers: String,
    /// Consumer group; `tally-<job name>` when not set. Every process of the
    /// job uses the same group and shares the partitions.
    #[serde(default)]
    pub group: Option<String>,
    /// Input topics. They must have the same number of partitions: partition
    /// `p` of every input feeds the same state (like Kafka Streams' tasks).
    pub inputs: Vec<String>,
    /// Topic of each output: `output name -> topic`.
    pub outputs: std::collections::BTreeMap<String, String>,
    /// Topic of rejected and trapping records.
    pub dead_letter_topic: String,
    /// Directory of this process's local state (RocksDB), its lock and its
    /// instance id.
    pub state_dir: PathBuf,
    /// `exactly_once` (default) or `at_least_once`.
    #[serde(default)]
    pub guarantee: Guarantee,
    /// Create missing input, output and dead-letter topics (with as many
    /// partitions as the inputs, or `create_partitions` when no input exists).
    #[serde(default)]
    pub create_topics: bool,
    /// Partitions of topics created when no input topic exists yet.
    #[serde(default = "default_create_partitions")]
    pub create_partitions: u32,
    /// Kafka transaction timeout, in milliseconds.
    #[serde(default = "default_transaction_timeout_ms")]
    pub transaction_timeout_ms: u64,
    /// Also commit as soon as the job has read all its input holds (each
    /// partition at its end) and no commit is in flight, not only every
    /// `commit_interval_ms`: output comes promptly while the input is
    /// quiet, and the interval bounds the wait under load. More
    /// transactions while the input is slow. Off by default.
    #[serde(default)]
    pub commit_when_caught_up: bool,
    /// How long a state restore may go without a changelog record or a
    /// partition's end arriving before it fails (and the session retries),
    /// in milliseconds. A restore that makes progress never fails.
    #[serde(default = "default_restore_stall_ms")]
    pub restore_stall_ms: u64,
    /// Bytes of changelog keys and values a restore writes between two
    /// checkpoints (each records how far it got, once what it claims is
    /// in RocksDB's files): about this much is read again when a restore
    /// is interrupted.
    #[serde(default = "default_restore_checkpoint_bytes")]
    pub restore_checkpoint_bytes: u64,
    /// How a restore reads the changelog: `consumer` (default) or `leaders`
    /// (opt-in, faster; see [`RestoreFetch`]).
    #[serde(default)]
    pub restore_fetch: RestoreFetch,
    /// Extra librdkafka properties for every client of the job (for example
    /// `"session.timeout.ms" = "6000"`); a `producer.` or `consumer.` prefix
    /// gives one to the producer or to the consumers only.
    #[serde(default)]
    pub client: std::collections::BTreeMap<String, String>,
}

/// Partitions of topics a job creates when no input topic exists yet and
/// it does not say.
pub const DEFAULT_CREATE_PARTITIONS: u32 = 1;

fn default_create_partitions() -> u32 {
    DEFAULT_CREATE_PARTITIONS
}
fn default_transaction_timeout_ms() -> u64 {
    DEFAULT_TRANSACTION_TIMEOUT_MS
}

/// How long a restore may stall when the job does not say.
pub const DEFAULT_RESTORE_STALL_MS: u64 = 30_000;

/// Bounds of `kafka.restore_stall_ms`: one second to one hour.
pub const RESTORE_STALL_MS_RANGE: std::ops::RangeInclusive<u64> = 1_000..=3_600_000;

/// The default of `kafka.restore_stall_ms`.
pub fn default_restore_stall_ms() -> u64 {
    DEFAULT_RESTORE_STALL_MS
}

/// Bytes restored between checkpoints when the job does not say (a
/// restore's memory is bounded by its chunks, not by this).
pub const DEFAULT_RESTORE_CHECKPOINT_BYTES: u64 = 64 << 20;

/// Bounds of `kafka.restore_checkpoint_bytes`: 64 KiB to 256 MiB.
pub const RESTORE_CHECKPOINT_BYTES_RANGE: std::ops::RangeInclusive<u64> = (64 << 10)..=(256 << 20);

/// The default of `kafka.restore_checkpoint_bytes`.
pub fn default_restore_checkpoint_bytes() -> u64 {
    DEFAULT_RESTORE_CHECKPOINT_BYTES
}

/// Checks `[kafka.client]` settings (a job file's, or a `tally serve`
/// host file's): none may set what the guarantee depends on, and each
/// names a property; the message says which and why.
pub fn check_client_settings(
    client: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    use super::topics::{OWNED_PROPERTIES, property_name as property};
    if let Some(key) = client.keys().find(|key| OWNED_PROPERTIES.contains(&property(key))) {
        return Err(format!(
            "kafka.client may not set `{key}`: Tally sets it itself, and the guarantee depends on it"
        ));
    }
    if let Some(key) = client.keys().find(|key| property(key).is_empty()) {
        return Err(format!(
            "kafka.client key `{key}` names no property: write `{key}<property>`, e.g. `{key}linger.ms`"
        ));
    }
    Ok(())
}

impl KafkaConfig {
    /// The consumer group of job `job`.
    pub fn group_id(&self, job: &str) -> String {
        self.group.clone().unwrap_or_else(|| format!("tally-{job}"))
    }

    /// The topic of output `name`, if the job maps it.
    pub fn output_topic(&self, name: &str) -> Option<&str> {
        self.outputs.get(name).map(String::as_str)
    }

    /// Checks the section within job `job`; the message says what to change.
    pub fn validate(&self, job: &JobSettings) -> Result<(), InvalidJob> {
        let kafka = self;
        let invalid = |message: String| Err(InvalidJob { job: job.name.clone(), message });
        if kafka.brokers.trim().is_empty() {
            return invalid("kafka.brokers must name at least one broker (host:port)".into());
        }
        if kafka.inputs.is_empty() {
            return invalid("kafka.inputs must name at least one topic".into());
        }
        for output in &job.outputs {
            if !kafka.outputs.contains_key(output) {
                return invalid(format!(
                    "output `{output}` has no topic: add `{output} = \"<topic>\"` to kafka.outputs"
                ));
            }
        }
        if let Some(extra) = kafka.outputs.keys().find(|name| !job.outputs.contains(name)) {
            return invalid(format!(
                "kafka.outputs maps `{extra}`, which is not in the job's outputs; add it there or remove it"
            ));
        }
        let mut topics: Vec<&str> = kafka.inputs.iter().map(String::as_str).collect();
        topics.extend(kafka.outputs.values().map(String::as_str));
        topics.push(&kafka.dead_letter_topic);
        if let Some(bad) = topics.iter().find(|topic| !valid_topic(topic)) {
            return invalid(format!(
                "{bad:?} is not a valid Kafka topic name (letters, digits, `.`, `_`, `-`; 1 to 249 characters)"
            ));
        }
        let inputs: std::collections::HashSet<&str> =
            kafka.inputs.iter().map(String::as_str).collect();
        if inputs.len() != kafka.inputs.len() {
            return invalid("kafka.inputs names a topic twice".into());
        }
        if let Some(loop_topic) =
            topics[kafka.inputs.len()..].iter().find(|topic| inputs.contains(*topic))
        {
            return invalid(format!(
                "topic `{loop_topic}` is both an input and an output; a job must not read what it writes"
            ));
        }
        if kafka.transaction_timeout_ms < 1_000
            || kafka.transaction_timeout_ms < 2 * job.commit_interval_ms
            || kafka.transaction_timeout_ms > 900_000
        {
            return invalid(
                "kafka.transaction_timeout_ms must be between 1000 and 900000 (the broker's default \
                 transaction.max.timeout.ms), and at least twice commit_interval_ms"
                    .into(),
            );
        }
        for (name, value, range, words) in [
            (
                "restore_stall_ms",
                kafka.restore_stall_ms,
                RESTORE_STALL_MS_RANGE,
                ("one second", "one hour"),
            ),
            (
                "restore_checkpoint_bytes",
                kafka.restore_checkpoint_bytes,
                RESTORE_CHECKPOINT_BYTES_RANGE,
                ("64 KiB", "256 MiB"),
            ),
        ] {
            if !range.contains(&value) {
                return invalid(format!(
                    "kafka.{name} is {value}; it must be between {} ({}) and {} ({})",
                    range.start(),
                    words.0,
                    range.end(),
                    words.1
                ));
            }
        }
        check_client_settings(&kafka.client)
            .map_err(|message| InvalidJob { job: job.name.clone(), message })?;
        if kafka.create_partitions == 0 {
            return invalid("kafka.create_partitions must be at least 1".into());
        }
        Ok(())
    }
}

/// Kafka's rule for topic names.
fn valid_topic(topic: &str) -> bool {
    !topic.is_empty()
        && topic.len() <= 249
        && topic != "."
        && topic != ".."
        && topic.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KAFKA_JOB: &str = r#"
        [kafka]
        brokers = "127.0.0.1:9092"
        inputs = ["usage"]
        outputs = { totals = "billing-totals" }
        dead_letter_topic = "billing-dead-letters"
        state_dir = "state"
    "#;

    /// The `[kafka]` section of a job file.
    fn section(text: &str) -> KafkaConfig {
        #[derive(Deserialize)]
        struct File {
            kafka: KafkaConfig,
        }
        toml::from_str::<File>(text).unwrap().kafka
    }

    #[test]
    fn restore_limits_out_of_their_range_are_refused_naming_the_range() {
        let job = JobSettings::new("billing", "billing.wasm".into(), vec!["totals".into()]);
        let refusal = |line: &str| {
            section(&format!("{KAFKA_JOB}\n{line}\n"))
                .validate(&job)
                .err()
                .map(|err| err.to_string())
        };
        assert_eq!(refusal("restore_stall_ms = 1000"), None);
        assert_eq!(refusal("restore_checkpoint_bytes = 268435456"), None);
        let stall = refusal("restore_stall_ms = 999").expect("under a second is refused");
        assert!(stall.contains("kafka.restore_stall_ms is 999; it must be between 1000 (one second) and 3600000 (one hour)"), "{stall}");
        let bytes =
            refusal("restore_checkpoint_bytes = 268435457").expect("over 256 MiB is refused");
        assert!(bytes.contains("kafka.restore_checkpoint_bytes is 268435457; it must be between 65536 (64 KiB) and 268435456 (256 MiB)"), "{bytes}");
    }

    #[test]
    fn prefixed_client_settings_reach_only_their_clients() {
        use crate::topics::{ClientRole, client_settings};
        let text = format!(
            "{KAFKA_JOB}\n[kafka.client]\n\"socket.timeout.ms\" = \"9000\"\n\"producer.linger.ms\" = \"2\"\n\"consumer.session.timeout.ms\" = \"7000\"\n"
        );
        let kafka = section(&text);
        let settings = |role| {
            client_settings(&kafka, role)
                .map(|(key, value)| format!("{key}={value}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(settings(ClientRole::Producer), ["linger.ms=2", "socket.timeout.ms=9000"]);
        assert_eq!(
            settings(ClientRole::Consumer),
            ["session.timeout.ms=7000", "socket.timeout.ms=9000"]
        );
        assert_eq!(settings(ClientRole::Admin), ["socket.timeout.ms=9000"]);
    }

    #[test]
    fn partitions_without_a_committed_offset_start_where_auto_offset_reset_says() {
        // librdkafka starts such a partition itself, from the group
        // consumer's `auto.offset.reset`: Tally's default, or the job's.
        use crate::topics::consumer_config;
        let start = |client: &str| {
            let kafka = section(&format!("{KAFKA_JOB}\n[kafka.client]\n{client}\n"));
            let job = JobSettings::new("billing", "billing.wasm".into(), vec!["totals".into()]);
            let config = consumer_config(&job, &kafka, "0123456789abcdef");
            config.get("auto.offset.reset").map(str::to_string)
        };
        let start = |client: &str| start(client).unwrap_or_default();
        assert_eq!(start(""), "earliest", "Tally's default is the earliest record");
        assert_eq!(start("\"auto.offset.reset\" = \"latest\""), "latest");
        assert_eq!(start("\"auto.offset.reset\" = \"smallest\""), "smallest");
        assert_eq!(
            start(
                "\"auto.offset.reset\" = \"earliest\"\n\"consumer.auto.offset.reset\" = \"largest\""
            ),
            "largest"
        );
        assert_eq!(
            start("\"producer.auto.offset.reset\" = \"latest\""),
            "earliest",
            "a producer setting is not the consumer's"
        );
        assert_eq!(
            start("\"auto.offset.reset\" = \"error\""),
            "error",
            "librdkafka raises the error itself"
        );
    }

    #[test]
    fn restores_read_through_the_consumer_unless_told_to_fetch_from_the_leaders_on_plaintext() {
        use crate::topics::{leader_fetch_settings, restore_config};
        let job = JobSettings::new("billing", "billing.wasm".into(), vec!["totals".into()]);
        let settings = |kafka_lines: &str, client: &str| {
            let kafka = section(&format!("{KAFKA_JOB}\n{kafka_lines}\n[kafka.client]\n{client}\n"));
            leader_fetch_settings(&kafka, &restore_config(&job, &kafka))
        };
        assert!(settings("", "").is_none(), "through the consumer by default");
        let leaders = "restore_fetch = \"leaders\"";
        let default = settings(leaders, "").expect("the leaders when asked");
        let restore_default = |key: &str| {
            crate::RESTORE_DEFAULTS
                .iter()
                .find(|(name, _)| *name == key)
                .unwrap()
                .1
                .parse::<i32>()
                .unwrap()
        };
        assert_eq!(default.partition_max_bytes, restore_default("max.partition.fetch.bytes"));
        assert_eq!(default.max_bytes, restore_default("fetch.max.bytes"));
        assert_eq!(default.max_wait.as_millis() as i32, restore_default("fetch.wait.max.ms"));
        let small =
            settings(leaders, "\"consumer.max.partition.fetch.bytes\" = \"65536\"").unwrap();
        assert_eq!(
            small.partition_max_bytes, 65536,
            "the job's fetch sizes hold for the leaders' fetches too"
        );
        let huge = settings(leaders, "\"consumer.fetch.max.bytes\" = \"2000000000\"\n\"consumer.max.partition.fetch.bytes\" = \"2000000000\"").unwrap();
        assert_eq!(
            (huge.max_bytes, huge.partition_max_bytes),
            (crate::topics::LEADER_FETCH_MAX_BYTES, crate::topics::LEADER_FETCH_MAX_BYTES),
            "an answer is held whole: capped"
        );
        assert!(settings("restore_fetch = \"consumer\"", "").is_none());
        assert!(
            settings(leaders, "\"security.protocol\" = \"SASL_SSL\"").is_none(),
            "only librdkafka speaks TLS and SASL here"
        );
        assert!(settings(leaders, "\"security.protocol\" = \"PLAINTEXT\"").is_some());
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)] // parsed only to be refused
        struct File {
            kafka: KafkaConfig,
        }
        let refused =
            toml::from_str::<File>(&format!("{KAFKA_JOB}\nrestore_fetch = \"sideways\"\n"))
                .unwrap_err()
                .to_string();
        assert!(
            refused.contains("unknown variant `sideways`, expected `consumer` or `leaders`"),
            "{refused}"
        );
    }
}
