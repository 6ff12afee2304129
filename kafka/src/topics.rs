//! Client settings of a Kafka job, and the check (or creation) of its
//! topics before anything runs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{Client, DefaultClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext};

use crate::config::{Guarantee, KafkaConfig, RestoreFetch};
use crate::leader_fetch::FetchSettings;
use crate::{KafkaJobError, SetupError};
use tally_core::settings::JobSettings;

/// How long metadata and admin requests may take.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest a topic just created may take to show every partition with a
/// leader, and longest a client waits for its metadata to learn a
/// partition it does not know yet, before the failure is reported.
const METADATA_WAIT: Duration = Duration::from_secs(15);
/// Pause between two metadata requests while waiting for it.
const METADATA_RETRY: Duration = Duration::from_millis(100);
/// Longest one refresh of a topic's metadata waits for its leaders.
const METADATA_REFRESH_WAIT: Duration = Duration::from_millis(500);

/// librdkafka properties Tally sets itself: the guarantee depends on them,
/// so a job's `client` table may not change them.
pub const OWNED_PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "isolation.level",
    "transactional.id",
    "transaction.timeout.ms",
    "enable.idempotence",
    "enable.partition.eof",
    "partition.assignment.strategy",
    "group.protocol",
    "group.instance.id",
];

/// The compacted topic holding job `job`'s state changes.
pub fn changelog_topic(job: &str) -> String {
    format!("tally-{job}-state-changelog")
}

/// Which of the job's clients a setting is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientRole {
    /// The transactional (or idempotent) producer.
    Producer,
    /// The group consumer and the restore consumer.
    Consumer,
    /// The admin client that checks and creates topics.
    Admin,
}

/// The job's extra librdkafka settings for clients of `role`: unprefixed
/// ones go to every client; `producer.` and `consumer.` ones (Kafka
/// Streams' prefixes) only to the producer or to the consumers, without
/// their prefix, so librdkafka does not warn about a property the other
/// kind of client ignores.
pub fn client_settings(
    kafka: &KafkaConfig,
    role: ClientRole,
) -> impl Iterator<Item = (&str, &str)> {
    kafka.client.iter().filter_map(move |(key, value)| {
        let key = match split_role(key) {
            None => key.as_str(),
            Some((for_role, property)) if for_role == role => property,
            Some(_) => return None,
        };
        Some((key, value.as_str()))
    })
}

/// The role prefix of a `kafka.client` key, and the property it names.
pub fn split_role(key: &str) -> Option<(ClientRole, &str)> {
    if let Some(property) = key.strip_prefix("producer.") {
        Some((ClientRole::Producer, property))
    } else {
        key.strip_prefix("consumer.").map(|property| (ClientRole::Consumer, property))
    }
}

/// The librdkafka property a `kafka.client` key names, without its role prefix.
pub fn property_name(key: &str) -> &str {
    split_role(key).map_or(key, |(_, property)| property)
}

/// Settings a client of `role` starts from: the job's extras for it, then
/// the brokers.
pub fn base_config(kafka: &KafkaConfig, role: ClientRole) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (key, value) in client_settings(kafka, role) {
        config.set(key, value);
    }
    config.set("bootstrap.servers", &kafka.brokers);
    config
}

/// Whether the job sets `property` for clients of `role`.
fn sets(kafka: &KafkaConfig, role: ClientRole, property: &str) -> bool {
    client_settings(kafka, role).any(|(key, _)| key == property)
}

/// The job's group consumer: `read_committed`, offsets committed only by
/// Tally, eager rebalancing (so a revocation always covers every partition
/// and the in-flight transaction can be aborted before any is given up),
/// and static membership under the process's instance id (KIP-345), so a
/// restarted process takes its partitions back at once instead of waiting
/// for its old session to time out.
pub fn consumer_config(job: &JobSettings, kafka: &KafkaConfig, instance: &str) -> ClientConfig {
    let mut config = base_config(kafka, ClientRole::Consumer);
    config
        .set("group.id", kafka.group_id(&job.name))
        .set("group.instance.id", format!("tally-{}-{instance}", job.name))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("partition.assignment.strategy", "range")
        .set("group.protocol", "classic");
    for (key, value) in CONSUMER_DEFAULTS {
        if !sets(kafka, ClientRole::Consumer, key) {
            config.set(*key, *value);
        }
    }
    config
}

/// Consumer settings a job's `client` table may change. librdkafka's
/// defaults stop fetching a partition for a whole second once 100,000 of
/// its records wait in the client; a job loop that keeps up then starves
/// (measured: 100k events/s with the defaults, 210k with a 10 ms backoff).
/// With the short backoff, 20,000 records queued per partition keep the
/// loop fed as well as 1,000,000 did, in a third of the memory (a 1M-event
/// backlog took 470 MB resident with 1,000,000, 170–210 MB with 20,000).
pub const CONSUMER_DEFAULTS: &[(&str, &str)] = &[
    ("auto.offset.reset", "earliest"),
    ("fetch.queue.backoff.ms", "10"),
    ("queued.min.messages", "20000"),
];

/// The consumer that restores changelogs and reads the group's committed
/// offsets; it never joins the group. Its `client.id` is the job's (or
/// `tally-<job>`) with `-restore` added, so a broker quota can pace
/// restores apart from the job's reading of its input.
pub fn restore_config(job: &JobSettings, kafka: &KafkaConfig) -> ClientConfig {
    let mut config = side_consumer_config(job, kafka, "restore");
    read_committed_from_start(&mut config);
    for (key, value) in RESTORE_DEFAULTS {
        if !sets(kafka, ClientRole::Consumer, key) {
            config.set(*key, *value);
        }
    }
    config
}

/// The consumer that reads a period job's shared watermarks; it never
/// joins the group. Its `client.id` is the job's with `-watermarks` added.
pub fn watermark_config(job: &JobSettings, kafka: &KafkaConfig) -> ClientConfig {
    side_consumer_config(job, kafka, "watermarks")
}

/// A consumer beside the group's (it never joins it): the job's consumer
/// settings, its `client.id` (or `tally-<job>`) with `-<suffix>` added so a
/// broker quota can tell it apart, and the group's id for its requests.
/// A consumer that reads what was committed, from the start, to the end
/// it is told of, and never commits offsets itself (a restore, the shared
/// watermarks).
pub(crate) fn read_committed_from_start(config: &mut ClientConfig) {
    config
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
}

fn side_consumer_config(job: &JobSettings, kafka: &KafkaConfig, suffix: &str) -> ClientConfig {
    let mut config = base_config(kafka, ClientRole::Consumer);
    let client_id =
        config.get("client.id").map_or_else(|| format!("tally-{}", job.name), str::to_string);
    config
        .set("client.id", format!("{client_id}-{suffix}"))
        .set("group.id", kafka.group_id(&job.name));
    config
}

/// Fetch settings of the restore consumer, which reads partitions to an
/// end it knows: librdkafka's defaults pause a partition's fetching for a
/// second once 100,000 of its records are queued (a restore ran at 130k
/// records/s with them, the machine mostly idle), and fetch at most 1 MB
/// per partition per request. Here the queue may hold up to 128 MiB
/// (about 1.5 s of a fast restore), a full queue is looked at again after
/// 1 ms, and a fetch at the end waits only 10 ms for more, so the end is
/// seen soon. Fetches stay at 1 MiB per partition: larger ones measured
/// no faster, and a broker's quota throttles a restore only between
/// responses. A job's `client` table may change them.
pub const RESTORE_DEFAULTS: &[(&str, &str)] = &[
    ("fetch.queue.backoff.ms", "1"),
    ("queued.min.messages", "1000000"),
    ("queued.max.messages.kbytes", "131072"),
    ("max.partition.fetch.bytes", "1048576"),
    ("fetch.max.bytes", "67108864"),
    ("fetch.wait.max.ms", "10"),
];

/// Most bytes a restore asks of one fetch answer from a leader, whatever
/// `fetch.max.bytes` says: the answer is held whole in memory.
pub const LEADER_FETCH_MAX_BYTES: i32 = 256 << 20;

/// How a restore with the consumer's settings `restore` fetches from the
/// partitions' leaders itself: the same fetch sizes and wait; `None` when
/// the job reads through the consumer only, or its brokers' listeners
/// need TLS or SASL (which only librdkafka speaks here).
pub fn leader_fetch_settings(kafka: &KafkaConfig, restore: &ClientConfig) -> Option<FetchSettings> {
    let plaintext = restore
        .get("security.protocol")
        .is_none_or(|protocol| protocol.eq_ignore_ascii_case("plaintext"));
    if kafka.restore_fetch != RestoreFetch::Leaders || !plaintext {
        return None;
    }
    // librdkafka's own defaults where neither Tally nor the job sets one.
    let number = |key: &str, default: i32| {
        restore
            .get(key)
            .and_then(|value| value.trim().parse().ok())
            .filter(|&value: &i32| value > 0)
            .unwrap_or(default)
    };
    let max_bytes = number("fetch.max.bytes", 52_428_800).min(LEADER_FETCH_MAX_BYTES);
    Some(FetchSettings {
        max_wait: Duration::from_millis(number("fetch.wait.max.ms", 500) as u64),
        max_bytes,
        partition_max_bytes: number("max.partition.fetch.bytes", 1_048_576).min(max_bytes),
        client_id: restore.get("client.id").unwrap_or("tally-restore").to_string(),
    })
}

/// The producer: transactional under `exactly_once` (one transactional id
/// per process, kept in its state directory), idempotent otherwise.
pub fn producer_config(job: &JobSettings, kafka: &KafkaConfig, instance: &str) -> ClientConfig {
    let mut config = base_config(kafka, ClientRole::Producer);
    config.set("enable.idempotence", "true");
    if !sets(kafka, ClientRole::Producer, "linger.ms") {
        config.set("linger.ms", "5");
    }
    if kafka.guarantee == Guarantee::ExactlyOnce {
        config
            .set("transactional.id", format!("tally-{}-{instance}", job.name))
            .set("transaction.timeout.ms", kafka.transaction_timeout_ms.to_string());
    }
    config
}

/// Returns once `client` is connected to a broker it learned from the
/// cluster's metadata, not only to a bootstrap address, or after `budget`.
/// librdkafka drops its bootstrap connections once it learns the brokers,
/// and a transactional producer (or a restore) that looks for a broker in
/// that gap finds none up and looks again only 0.5-1 s later: waiting here
/// first makes every session start, restart and recovery that much
/// shorter. It gives up quietly (on an error or at the end of the budget):
/// the calls that follow wait for the cluster and report its failures.
pub fn connect_to_cluster<C: ClientContext>(client: &Client<C>, budget: Duration) {
    let deadline = Instant::now() + budget;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match answering_broker(client, left) {
            // A bootstrap connection answers as broker -1.
            Some(-1) if !left.is_zero() => std::thread::sleep(Duration::from_millis(5)),
            _ => return,
        }
    }
}

/// Asks for the cluster's brokers and returns the id of the broker that
/// answered (`None` on an error). No topic is named, so none is created.
fn answering_broker<C: ClientContext>(client: &Client<C>, timeout: Duration) -> Option<i32> {
    let mut metadata: *const rdkafka::bindings::rd_kafka_metadata = std::ptr::null();
    // SAFETY: the client pointer is valid while `client` lives, and
    // `metadata` is a place to write to. Not all topics and no topic handle:
    // the request names the topics this client has handles for (none, for a
    // session's new clients), not every topic in the cluster.
    let error = unsafe {
        rdkafka::bindings::rd_kafka_metadata(
            client.native_ptr(),
            0,
            std::ptr::null_mut(),
            &mut metadata,
            super::timeout_ms(timeout),
        )
    };
    if error != rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        || metadata.is_null()
    {
        return None;
    }
    // SAFETY: librdkafka returned valid metadata, ours to destroy once.
    unsafe {
        let broker = (*metadata).orig_broker_id;
        rdkafka::bindings::rd_kafka_metadata_destroy(metadata);
        Some(broker)
    }
}

/// The topics of a job, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicLayout {
    /// Partitions of every input topic (and of the changelog topic).
    pub partitions: i32,
    /// The changelog topic.
    pub changelog: String,
    /// A period job's watermark topic (see `watermarks`).
    pub watermarks: Option<String>,
}

/// Checks that the job's topics exist (creating what the job allows) and
/// that the inputs and the changelog agree on their partition count.
pub fn prepare(job: &JobSettings, kafka: &KafkaConfig) -> Result<TopicLayout, KafkaJobError> {
    let admin: AdminClient<DefaultClientContext> =
        base_config(kafka, ClientRole::Admin).create().map_err(|err| KafkaJobError::Setup {
            job: job.name.clone(),
            source: SetupError::Client(err),
        })?;
    let layout = prepare_with(&admin, job, kafka);
    // rust-rdkafka's drop joins the client's polling thread, which wakes
    // every 100 ms: the job need not wait for it, nothing is left to do.
    let _ = std::thread::Builder::new().name("tally-admin-close".into()).spawn(move || drop(admin));
    layout
}

fn prepare_with(
    admin: &AdminClient<DefaultClientContext>,
    job: &JobSettings,
    kafka: &KafkaConfig,
) -> Result<TopicLayout, KafkaJobError> {
    let setup = |source: SetupError| KafkaJobError::Setup { job: job.name.clone(), source };
    let existing = topic_partitions(admin)
        .map_err(|source| setup(SetupError::Metadata { brokers: kafka.brokers.clone(), source }))?;

    let input_counts: Vec<(&str, i32)> = kafka
        .inputs
        .iter()
        .filter_map(|topic| existing.get(topic).map(|&count| (topic.as_str(), count)))
        .collect();
    if let Some(pair) = input_counts.windows(2).find(|pair| pair[0].1 != pair[1].1) {
        return Err(setup(SetupError::InputsDiffer {
            first: pair[0].0.to_string(),
            first_partitions: pair[0].1,
            second: pair[1].0.to_string(),
            second_partitions: pair[1].1,
        }));
    }
    let partitions =
        input_counts.first().map_or(kafka.create_partitions as i32, |&(_, count)| count);

    let mut user_topics: Vec<&str> = kafka.inputs.iter().map(String::as_str).collect();
    user_topics.extend(kafka.outputs.values().map(String::as_str));
    user_topics.push(&kafka.dead_letter_topic);
    let missing: Vec<&str> =
        user_topics.iter().copied().filter(|topic| !existing.contains_key(*topic)).collect();
    if !missing.is_empty() && !kafka.create_topics {
        return Err(setup(SetupError::TopicsMissing {
            missing: missing.iter().map(|topic| topic.to_string()).collect(),
            partitions,
        }));
    }

    let changelog = changelog_topic(&job.name);
    match existing.get(&changelog) {
        Some(&count) if count != partitions => {
            return Err(setup(SetupError::ChangelogPartitions {
                changelog: changelog.clone(),
                count,
                partitions,
            }));
        }
        _ => {}
    }
    let mut to_create: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|topic| NewTopic::new(topic, partitions, TopicReplication::Fixed(-1)))
        .collect();
    if !existing.contains_key(&changelog) {
        to_create.push(
            NewTopic::new(&changelog, partitions, TopicReplication::Fixed(-1))
                .set("cleanup.policy", "compact"),
        );
    }
    let watermarks = job.periods.is_some().then(|| crate::watermarks::watermark_topic(&job.name));
    if let Some(topic) = &watermarks
        && !existing.contains_key(topic)
    {
        to_create.push(
            NewTopic::new(topic, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact"),
        );
    }
    if !to_create.is_empty() {
        let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
        let results = futures_executor::block_on(admin.create_topics(&to_create, &options))
            .map_err(|err| setup(SetupError::CreateTopics(err)))?;
        let mut created = Vec::new();
        for result in results {
            match result {
                Ok(topic) => {
                    tracing::info!(job = %job.name, %topic, partitions, "created topic");
                    created.push(topic);
                }
                // Another process of the job created it first (moments ago,
                // perhaps: it is waited for too).
                Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => created.push(topic),
                Err((topic, code)) => return Err(setup(SetupError::CreateTopic { topic, code })),
            }
        }
        // A topic is usable once its partitions have leaders: a client
        // that asks about it earlier can cache it without them and fail
        // on it until its next metadata refresh (minutes). The topics
        // exist now, so asking about them creates nothing.
        let deadline = Instant::now() + METADATA_WAIT;
        for topic in &created {
            if !wait_for_leaders(admin.inner(), topic, deadline) {
                tracing::warn!(job = %job.name, %topic, wait_s = METADATA_WAIT.as_secs(), "created topic has partitions without a leader yet; starting anyway");
            }
        }
    }
    Ok(TopicLayout { partitions, changelog, watermarks })
}

/// Whether `topic`'s metadata, asked of the cluster (not the client's
/// cache) until `deadline`, shows it with partitions that all have a
/// leader. The topic must exist, or `client` be a consumer: a producer's
/// metadata request may have the broker create a topic it asks about.
fn wait_for_leaders<C: ClientContext>(client: &Client<C>, topic: &str, deadline: Instant) -> bool {
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).max(METADATA_RETRY);
        if topic_metadata(client, topic, left).is_some_and(|(leaders, count)| leaders == count) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(METADATA_RETRY);
    }
}

/// `topic`'s partitions with a leader and its partition count, asked of
/// the cluster within `timeout`; `None` if the answer did not come or
/// does not show the topic (yet).
fn topic_metadata<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> Option<(usize, usize)> {
    let metadata = client.fetch_metadata(Some(topic), timeout).ok()?;
    let found = metadata.topics().iter().find(|found| found.name() == topic)?;
    if found.error().is_some() || found.partitions().is_empty() {
        return None;
    }
    let partitions = found.partitions();
    let leaders = partitions
        .iter()
        .filter(|partition| partition.error().is_none() && partition.leader() >= 0)
        .count();
    Some((leaders, partitions.len()))
}

/// The low and high watermarks of `topic`'s partition `partition`, asked of
/// its leader through `consumer`. A partition the consumer's cached
/// metadata does not know (a topic just created, a leader just moved) is
/// asked again after fresh metadata, every [`METADATA_RETRY`] for up to
/// [`METADATA_WAIT`]: the cache alone would fail every session until its
/// next refresh, minutes later. A partition the fresh metadata shows the
/// topic does not have fails at once. (A consumer: its metadata requests
/// never have the broker create a topic.)
pub(crate) fn watermarks<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Result<(i64, i64), rdkafka::error::KafkaError> {
    let client = consumer.client();
    let deadline = Instant::now() + METADATA_WAIT;
    loop {
        match client.fetch_watermarks(topic, partition, ADMIN_TIMEOUT) {
            Err(err) if stale_metadata(&err) && Instant::now() < deadline => {
                tracing::debug!(%topic, partition, error = %err, "partition unknown to the cached metadata; asking again");
                std::thread::sleep(METADATA_RETRY);
                if let Some((_, count)) = topic_metadata(client, topic, METADATA_REFRESH_WAIT)
                    && partition as usize >= count
                {
                    return Err(err);
                }
            }
            answer => return answer,
        }
    }
}

/// Whether `err` says the client's metadata does not know a partition's
/// leader (yet): the topic was just created, or its leader just moved.
/// Asking the cluster for fresh metadata and trying again fixes it.
fn stale_metadata(err: &rdkafka::error::KafkaError) -> bool {
    matches!(
        err.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::LeaderNotAvailable
                | RDKafkaErrorCode::NotLeaderForPartition
        )
    )
}

/// Partition counts of every topic the cluster has.
fn topic_partitions(
    admin: &AdminClient<DefaultClientContext>,
) -> Result<BTreeMap<String, i32>, rdkafka::error::KafkaError> {
    let metadata = admin.inner().fetch_metadata(None, ADMIN_TIMEOUT)?;
    Ok(metadata
        .topics()
        .iter()
        .filter(|topic| topic.error().is_none())
        .map(|topic| (topic.name().to_string(), topic.partitions().len() as i32))
        .collect())
}
