//! Helpers for tests against the real Kafka broker that `scripts/kafka`
//! runs (`scripts/test` starts it): topics, producing usage, reading
//! outputs with headers, and the independent exactly-once checker.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

use crate::{BillingKey, UsageLine};

/// The broker the tests use: `TALLY_KAFKA_BOOTSTRAP`, else `scripts/kafka`'s default.
pub fn bootstrap() -> String {
    std::env::var("TALLY_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_string())
}

/// The test broker's SASL_PLAINTEXT listener (mechanism PLAIN, user
/// `tally`, password [`SASL_PASSWORD`]; `scripts/kafka`).
pub fn sasl_bootstrap() -> String {
    format!(
        "127.0.0.1:{}",
        std::env::var("TALLY_KAFKA_SASL_PORT").unwrap_or_else(|_| "9094".into())
    )
}

/// The test broker's SASL password for user `tally`: a test credential.
pub const SASL_PASSWORD: &str = "tally-sasl-secret";

/// Kafka tests share one broker and two cores: they run one at a time, and
/// so do the heaviest other tests (a kill loop over an interpreted plugin,
/// a swap through every language, the delivery kill loops), whose CPU
/// would otherwise starve a Kafka kill loop's observer until the job
/// outran its kills.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A name no earlier run used, so reruns never see old topics or groups.
pub fn unique(prefix: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{}", std::process::id(), nanos % 1_000_000_000_000)
}

/// Creates `topic` with `partitions` partitions.
pub fn create_topic(topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = client_config().create().unwrap();
    try_create_topic(&admin, topic, partitions)
        .unwrap_or_else(|code| panic!("creating {topic}: {code}"));
}

/// Grows `topic` to `total` partitions, as an operator does with
/// `kafka-topics.sh --alter`.
pub fn add_partitions(topic: &str, total: usize) {
    let admin: AdminClient<DefaultClientContext> = client_config().create().unwrap();
    let grown = rdkafka::admin::NewPartitions::new(topic, total);
    let results =
        futures_executor::block_on(admin.create_partitions(&[grown], &AdminOptions::new()))
            .unwrap();
    for result in results {
        result.unwrap_or_else(|(_, code)| panic!("adding partitions to {topic}: {code}"));
    }
}

/// Asks `admin` to create `topic`; the broker's refusal, if it refuses.
fn try_create_topic(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    partitions: i32,
) -> Result<(), RDKafkaErrorCode> {
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let results =
        futures_executor::block_on(admin.create_topics(&[new], &AdminOptions::new())).unwrap();
    results.into_iter().try_for_each(|result| result.map(drop).map_err(|(_, code)| code))
}

fn client_config() -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap());
    config
}

/// Where a produced record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Placed {
    pub partition: i32,
    pub offset: i64,
}

/// Where each produced line landed, or why it did not. (It must not panic:
/// it runs inside librdkafka, also while a failed test unwinds.)
struct PlacementTracker(Mutex<Vec<Result<Placed, String>>>);
impl ClientContext for PlacementTracker {}
impl ProducerContext for PlacementTracker {
    type DeliveryOpaque = usize;
    fn delivery(&self, result: &DeliveryResult<'_>, index: usize) {
        self.0.lock().unwrap()[index] = match result {
            Ok(record) => Ok(Placed { partition: record.partition(), offset: record.offset() }),
            Err((err, _)) => Err(err.to_string()),
        };
    }
}

/// The partition a customer's usage goes to: usage is keyed by customer, so
/// one customer's totals live in one partition's state.
pub fn partition_of(line: &UsageLine, partitions: i32) -> i32 {
    let customer = line
        .line
        .split("\"customer\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or("");
    (customer.bytes().fold(7u32, |hash, byte| hash.wrapping_mul(31).wrapping_add(byte as u32))
        % partitions as u32) as i32
}

/// Produces `lines` to `topic` (keyed by customer, to the partition
/// [`partition_of`] says) and returns where each landed.
pub fn produce_usage(topic: &str, lines: &[UsageLine], partitions: i32) -> Vec<Placed> {
    let records: Vec<(i32, &str, &str)> = lines
        .iter()
        .map(|line| {
            let key = line
                .line
                .split("\"customer\":\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("");
            (partition_of(line, partitions), key, line.line.as_str())
        })
        .collect();
    produce_records(topic, &records)
}

/// Produces `records` (partition, key, payload) to `topic`, in order, and
/// returns where each landed.
pub fn produce_records(topic: &str, records: &[(i32, &str, &str)]) -> Vec<Placed> {
    let tracker =
        PlacementTracker(Mutex::new(vec![Err("not delivered".to_string()); records.len()]));
    let producer: ThreadedProducer<PlacementTracker> = client_config()
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create_with_context(tracker)
        .unwrap();
    for (index, &(partition, key, payload)) in records.iter().enumerate() {
        let mut record =
            BaseRecord::with_opaque_to(topic, index).partition(partition).key(key).payload(payload);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((
                    KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    back,
                )) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((err, _)) => panic!("producing to {topic} failed: {err}"),
            }
        }
    }
    let flushed = producer.flush(Duration::from_secs(60));
    let placed = std::mem::take(&mut *producer.context().0.lock().unwrap());
    if let Err(err) = flushed {
        panic!("producing to {topic} did not finish within 60 s: {err}");
    }
    placed
        .into_iter()
        .map(|placed| placed.unwrap_or_else(|err| panic!("producing failed: {err}")))
        .collect()
}

/// One record of an output topic, with its headers.
#[derive(Debug, Clone)]
pub struct OutputRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: BTreeMap<String, String>,
}

impl OutputRecord {
    /// A header's value; panics naming it when missing.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("record has no `{name}` header: {:?}", self.headers))
    }

    /// The input record it came from: (topic, partition, offset).
    pub fn source(&self) -> (String, i32, i64) {
        (
            self.header("tally.source.topic").to_string(),
            self.header("tally.source.partition").parse().unwrap(),
            self.header("tally.source.offset").parse().unwrap(),
        )
    }
}

/// Reads all of `topic` to its end, `read_committed` or not.
pub fn read_topic(topic: &str, read_committed: bool) -> Vec<OutputRecord> {
    let consumer: BaseConsumer = client_config()
        .set("group.id", unique("tally-test-reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", if read_committed { "read_committed" } else { "read_uncommitted" })
        .create()
        .unwrap();
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    let partitions = metadata.topics()[0].partitions().len() as i32;
    let mut assignment = TopicPartitionList::new();
    for partition in 0..partitions {
        assignment.add_partition_offset(topic, partition, Offset::Beginning).unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut unfinished: std::collections::BTreeSet<i32> = (0..partitions).collect();
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !unfinished.is_empty() {
        assert!(Instant::now() < deadline, "reading {topic} did not reach its end");
        match consumer.poll(Duration::from_millis(500)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                unfinished.remove(&partition);
            }
            // A connection lost (a broker a test restarted closing it):
            // librdkafka connects again and goes on where it was.
            Some(Err(KafkaError::MessageConsumption(
                RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown,
            ))) => {}
            Some(Err(err)) => panic!("reading {topic}: {err}"),
            Some(Ok(record)) => {
                let headers = record
                    .headers()
                    .map(|headers| {
                        headers
                            .iter()
                            .map(|h| {
                                (
                                    h.key.to_string(),
                                    String::from_utf8_lossy(h.value.unwrap_or_default())
                                        .into_owned(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                records.push(OutputRecord {
                    partition: record.partition(),
                    offset: record.offset(),
                    key: record.key().map(<[u8]>::to_vec),
                    value: record.payload().unwrap_or_default().to_vec(),
                    headers,
                });
            }
        }
    }
    records.sort_by_key(|record| (record.partition, record.offset));
    records
}

/// The billing key of a `totals` record (its key is the JSON billing key).
pub fn billing_key(record: &OutputRecord) -> BillingKey {
    let key: serde_json::Value =
        serde_json::from_slice(record.key.as_deref().expect("totals records have keys")).unwrap();
    (
        key["customer"].as_str().unwrap().to_string(),
        key["metric"].as_str().unwrap().to_string(),
        key["period"].as_str().unwrap().to_string(),
    )
}

/// What the independent checker found.
#[derive(Debug)]
pub struct Verdict {
    /// Input records that contributed to no output.
    pub missing: usize,
    /// Input records that contributed more than once.
    pub doubled: usize,
    /// Final totals, per key (the last total of each key).
    pub totals: BTreeMap<BillingKey, u64>,
}

/// Checks `totals` and `dead_letters` (read `read_committed`, in offset
/// order) against what was produced: every input offset contributed
/// exactly once (by the lineage headers); replayed in order, each total adds
/// exactly its own input's quantity to its key; the final totals are
/// returned for comparison.
pub fn check(
    input_topic: &str,
    lines: &[UsageLine],
    placed: &[Placed],
    totals: &[OutputRecord],
    dead_letters: &[OutputRecord],
) -> Verdict {
    let line_at: HashMap<Placed, &UsageLine> = placed.iter().copied().zip(lines).collect();
    let mut contributions: HashMap<Placed, u32> = HashMap::new();
    let mut final_totals: BTreeMap<BillingKey, u64> = BTreeMap::new();
    for record in totals {
        let (topic, partition, offset) = record.source();
        assert_eq!(topic, input_topic);
        let source = Placed { partition, offset };
        *contributions.entry(source).or_default() += 1;
        let total: u64 = serde_json::from_slice(&record.value).unwrap();
        let key = billing_key(record);
        let line = line_at
            .get(&source)
            .unwrap_or_else(|| panic!("output names input {source:?}, which was never produced"));
        let (expected_key, quantity) =
            line.effect.clone().unwrap_or_else(|| panic!("bad input {source:?} produced a total"));
        assert_eq!(key, expected_key, "output from {source:?} has the wrong key");
        let running = final_totals.entry(key).or_insert(0);
        if contributions[&source] == 1 {
            assert_eq!(
                total,
                *running + quantity,
                "the total from {source:?} does not add exactly its quantity"
            );
        }
        *running = total;
    }
    for record in dead_letters {
        let (_, partition, offset) = record.source();
        *contributions.entry(Placed { partition, offset }).or_default() += 1;
    }
    let mut missing = 0;
    let mut doubled = 0;
    assert_eq!(lines.len(), placed.len());
    for placed in placed {
        match contributions.get(placed).copied().unwrap_or(0) {
            0 => missing += 1,
            1 => {}
            _ => doubled += 1,
        }
    }
    Verdict { missing, doubled, totals: final_totals }
}

/// Reads `job`'s totals and dead letters `read_committed` and asserts,
/// with [`check`], that each of `lines` (produced at `placed`) counted
/// exactly once and the totals are theirs; returns what it read.
pub fn assert_exactly_once(
    job: &KafkaBillingJob,
    lines: &[UsageLine],
    placed: &[Placed],
) -> (Vec<OutputRecord>, Vec<OutputRecord>) {
    let totals = read_topic(&job.totals, true);
    let dead_letters = read_topic(&job.dead_letters, true);
    let verdict = check(&job.input, lines, placed, &totals, &dead_letters);
    assert_eq!(
        (verdict.missing, verdict.doubled),
        (0, 0),
        "every input record counts exactly once"
    );
    assert_eq!(verdict.totals, crate::expected_totals(lines));
    (totals, dead_letters)
}

/// Checks the `totals` of a job that writes each key's latest total per
/// commit (`emit = { totals = "latest_per_key" }`), read `read_committed` in offset
/// order: each record's total is its key's running total right after its
/// source input (the input replayed in partition order), no input offset
/// shows up twice, and each key's records follow its input in order. Returns
/// the last total of each key.
pub fn check_latest(
    input_topic: &str,
    lines: &[UsageLine],
    placed: &[Placed],
    totals: &[OutputRecord],
) -> BTreeMap<BillingKey, u64> {
    let mut in_order: Vec<(Placed, &UsageLine)> = placed.iter().copied().zip(lines).collect();
    in_order.sort_by_key(|(placed, _)| (placed.partition, placed.offset));
    let mut running: HashMap<BillingKey, u64> = HashMap::new();
    let mut total_after: HashMap<Placed, (BillingKey, u64)> = HashMap::new();
    for (placed, line) in in_order {
        if let Some((key, quantity)) = &line.effect {
            let total = running.entry(key.clone()).or_insert(0);
            *total += quantity;
            total_after.insert(placed, (key.clone(), *total));
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut last: BTreeMap<BillingKey, (Placed, u64)> = BTreeMap::new();
    for record in totals {
        let (topic, partition, offset) = record.source();
        assert_eq!(topic, input_topic);
        let source = Placed { partition, offset };
        assert!(seen.insert(source), "input {source:?} shows up in two committed totals");
        let (expected_key, expected_total) = total_after
            .get(&source)
            .unwrap_or_else(|| panic!("output names input {source:?}, which produced no total"));
        let key = billing_key(record);
        let total: u64 = serde_json::from_slice(&record.value).unwrap();
        assert_eq!(&key, expected_key, "output from {source:?} has the wrong key");
        assert_eq!(
            total, *expected_total,
            "the total from {source:?} is not its key's running total after it"
        );
        if let Some((before, _)) = last.get(&key) {
            assert!(
                before.offset < offset,
                "{key:?}: the total from {source:?} follows the one from {before:?}"
            );
        }
        last.insert(key, (source, total));
    }
    last.into_iter().map(|(key, (_, total))| (key, total)).collect()
}

/// Deletes topics (best effort: a test's cleanup must not fail it).
pub fn delete_topics(topics: &[&str]) {
    let Ok(admin) = client_config().create::<AdminClient<DefaultClientContext>>() else { return };
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let _ = futures_executor::block_on(admin.delete_topics(topics, &options));
}

/// Deletes every topic whose name starts with `prefix` (a Kafka Streams
/// peer's internal topics).
pub fn delete_topics_starting_with(prefix: &str) {
    let Ok(consumer) = client_config().create::<BaseConsumer>() else { return };
    let Ok(metadata) = consumer.fetch_metadata(None, Duration::from_secs(10)) else { return };
    let names: Vec<String> = metadata
        .topics()
        .iter()
        .map(|topic| topic.name().to_string())
        .filter(|name| name.starts_with(prefix))
        .collect();
    delete_topics(&names.iter().map(String::as_str).collect::<Vec<_>>());
}

/// Deletes `topic` and creates it again, empty, with `partitions`
/// partitions: what an operator does who "starts a topic over". Deletion
/// finishes in the background, so creating is retried until it succeeds.
pub fn recreate_topic(topic: &str, partitions: i32) {
    delete_topics(&[topic]);
    let admin: AdminClient<DefaultClientContext> = client_config().create().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(code) = try_create_topic(&admin, topic, partitions) {
        assert!(Instant::now() < deadline, "recreating {topic}: {code}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A Kafka billing job's topics and files. Its topics (the changelog too)
/// are deleted when it is dropped: every partition left behind makes the
/// broker's recovery after a crash slower (thousands of them took it past
/// 90 s).
pub struct KafkaBillingJob {
    pub name: String,
    pub input: String,
    pub totals: String,
    pub dead_letters: String,
    pub partitions: i32,
    /// Whether the input topic is this job's to delete (a benchmark's
    /// jobs share one input).
    pub owns_input: bool,
}

impl Drop for KafkaBillingJob {
    fn drop(&mut self) {
        let changelog = format!("tally-{}-state-changelog", self.name);
        let watermarks = format!("tally-{}-watermarks", self.name);
        delete_topics(&[&self.totals, &self.dead_letters, &changelog, &watermarks]);
        if self.owns_input {
            delete_topics(&[&self.input]);
        }
    }
}

impl KafkaBillingJob {
    /// Fresh topics for a billing job over `partitions` input partitions.
    pub fn create(prefix: &str, partitions: i32) -> KafkaBillingJob {
        let name = unique(prefix);
        let job = KafkaBillingJob {
            input: format!("{name}-usage"),
            totals: format!("{name}-totals"),
            dead_letters: format!("{name}-dead-letters"),
            name,
            partitions,
            owns_input: true,
        };
        create_topic(&job.input, partitions);
        create_topic(&job.totals, partitions);
        create_topic(&job.dead_letters, 1);
        job
    }

    /// A job named `name` reading the existing topic `input` (shared with
    /// other jobs, so not its to delete), with fresh output and
    /// dead-letter topics.
    pub fn on_input(name: String, input: &str, partitions: i32) -> KafkaBillingJob {
        let job = KafkaBillingJob {
            input: input.to_string(),
            totals: format!("{name}-totals"),
            dead_letters: format!("{name}-dead-letters"),
            name,
            partitions,
            owns_input: false,
        };
        create_topic(&job.totals, partitions);
        create_topic(&job.dead_letters, 1);
        job
    }

    /// Writes the job file for one process of the job, with its own state
    /// directory `state_dir`; `extra` goes at the top level, `client` into
    /// `[kafka.client]`.
    pub fn write_job_file(
        &self,
        dir: &Path,
        plugin: &str,
        state_dir: &Path,
        extra: &str,
        client: &str,
    ) -> PathBuf {
        self.write_job_file_with_kafka(dir, plugin, state_dir, extra, "", client)
    }

    /// Like [`KafkaBillingJob::write_job_file`], with `kafka` lines added to
    /// the `[kafka]` section (for example `guarantee = "at_least_once"`).
    pub fn write_job_file_with_kafka(
        &self,
        dir: &Path,
        plugin: &str,
        state_dir: &Path,
        extra: &str,
        kafka: &str,
        client: &str,
    ) -> PathBuf {
        let text = format!(
            "name = {name:?}\nplugin = {plugin:?}\noutputs = [\"totals\"]\n{extra}\n\
             [kafka]\nbrokers = {brokers:?}\ninputs = [{input:?}]\noutputs = {{ totals = {totals:?} }}\n\
             dead_letter_topic = {dead:?}\nstate_dir = {state:?}\n{kafka}\n[kafka.client]\n{client}\n",
            name = self.name,
            brokers = bootstrap(),
            input = self.input,
            totals = self.totals,
            dead = self.dead_letters,
            state = state_dir.display().to_string(),
        );
        let path = dir.join(format!("{}.toml", state_dir.file_name().unwrap().to_string_lossy()));
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// Runs `scripts/kafka <args>` (the broker script); returns whether it
/// succeeded, and its output.
pub fn kafka_script(args: &[&str]) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka");
    let output =
        std::process::Command::new(script).args(args).output().expect("running scripts/kafka");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// A consumer in group `group` that only reads its committed offsets.
pub fn group_reader(group: &str) -> BaseConsumer {
    // read_uncommitted: see committed offsets at once, without waiting for
    // an open transaction's offsets to settle.
    client_config()
        .set("group.id", group)
        .set("isolation.level", "read_uncommitted")
        .create()
        .unwrap()
}

/// Sum of the group's committed offsets over `topic`'s first `partitions`
/// partitions: how many records the job has committed (for a topic written
/// without transactions, offsets count records). 0 while the broker is down.
pub fn committed_progress(group: &BaseConsumer, topic: &str, partitions: i32) -> i64 {
    let mut wanted = TopicPartitionList::new();
    for partition in 0..partitions {
        wanted.add_partition(topic, partition);
    }
    match group.committed_offsets(wanted, Duration::from_secs(5)) {
        Ok(committed) => committed
            .elements()
            .iter()
            .map(|element| if let Offset::Offset(offset) = element.offset() { offset } else { 0 })
            .sum(),
        Err(_) => 0,
    }
}

/// Input that keeps arriving while a test does things to the job: `lines`
/// produced in `chunks` chunks, `pause` apart, on a thread.
pub struct InputFeed {
    thread: std::thread::JoinHandle<Vec<Placed>>,
    held: std::sync::Arc<(Mutex<bool>, std::sync::Condvar)>,
    producing: std::sync::Arc<Mutex<()>>,
}

impl InputFeed {
    /// Starts producing.
    pub fn start(
        topic: &str,
        lines: Vec<UsageLine>,
        partitions: i32,
        chunks: usize,
        pause: Duration,
    ) -> InputFeed {
        let topic = topic.to_string();
        let held = std::sync::Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let producing = std::sync::Arc::new(Mutex::new(()));
        let (thread_held, thread_producing) = (held.clone(), producing.clone());
        let thread = std::thread::spawn(move || {
            let chunk_size = lines.len().div_ceil(chunks.max(1));
            let mut placed = Vec::with_capacity(lines.len());
            for chunk in lines.chunks(chunk_size) {
                let (flag, wake) = &*thread_held;
                drop(wake.wait_while(flag.lock().unwrap(), |held| *held).unwrap());
                let _producing = thread_producing.lock().unwrap();
                placed.extend(produce_usage(&topic, chunk, partitions));
                drop(_producing);
                std::thread::sleep(pause);
            }
            placed
        });
        InputFeed { thread, held, producing }
    }

    /// Stops producing after the chunk in flight is acknowledged (so a test
    /// can take the broker away without failing its own producer).
    pub fn hold(&self) {
        *self.held.0.lock().unwrap() = true;
        drop(self.producing.lock().unwrap());
    }

    /// Goes on producing.
    pub fn resume(&self) {
        *self.held.0.lock().unwrap() = false;
        self.held.1.notify_all();
    }

    /// Waits for the last chunk; returns where each line landed.
    pub fn finish(self) -> Vec<Placed> {
        self.thread.join().unwrap()
    }
}

/// A broker that keeps stopping, as an overloaded one does: its process
/// is paused (SIGSTOP) for `paused`, then runs for `running`, over and
/// over, until this is dropped (it runs on after). A slow cluster, made on
/// purpose.
pub struct BrokerStutter {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BrokerStutter {
    /// Starts pausing the broker `scripts/kafka` runs.
    pub fn start(paused: Duration, running: Duration) -> BrokerStutter {
        let (ok, said) = kafka_script(&["status"]);
        assert!(ok, "the broker is not running: {said}");
        let pid: libc::pid_t = said
            .split("(pid ")
            .nth(1)
            .and_then(|rest| rest.split(')').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no pid in `scripts/kafka status`: {said}"));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // SAFETY: signals a process; no memory is involved.
                    unsafe { libc::kill(pid, libc::SIGSTOP) };
                    std::thread::sleep(paused);
                    // SAFETY: as above.
                    unsafe { libc::kill(pid, libc::SIGCONT) };
                    std::thread::sleep(running);
                }
            }
        });
        BrokerStutter { stop, thread: Some(thread) }
    }
}

impl Drop for BrokerStutter {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join(); // its last step lets the broker run
        }
    }
}

/// A broker quota on the fetches of clients with id `client_id` (Kafka's
/// `consumer_byte_rate`: the broker delays its answers to keep them to
/// that rate), lifted when dropped. It paces a restore for a test without
/// touching the job.
pub struct FetchQuota {
    client_id: String,
}

impl FetchQuota {
    /// Limits `client_id`'s fetches to `bytes_per_second`.
    pub fn set(client_id: &str, bytes_per_second: u64) -> FetchQuota {
        let rate = format!("consumer_byte_rate={bytes_per_second}");
        let (ok, text) = kafka_script(&[
            "configs",
            "--alter",
            "--add-config",
            &rate,
            "--entity-type",
            "clients",
            "--entity-name",
            client_id,
        ]);
        assert!(ok, "setting a fetch quota on `{client_id}` failed: {text}");
        FetchQuota { client_id: client_id.to_string() }
    }
}

impl Drop for FetchQuota {
    fn drop(&mut self) {
        let _ = kafka_script(&[
            "configs",
            "--alter",
            "--delete-config",
            "consumer_byte_rate",
            "--entity-type",
            "clients",
            "--entity-name",
            &self.client_id,
        ]);
    }
}
