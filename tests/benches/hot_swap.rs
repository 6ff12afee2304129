//! Hot-swap benchmark: a billing job gets input continuously (100 ms
//! commits) while its plugin is pushed 10 times, alternating two builds.
//! Reports the time from a push to the first transaction committed by the
//! new version, and the longest commit-to-commit gap around a swap next to
//! the normal gaps. Runs a local job (following a growing file) and, when
//! the broker of `scripts/kafka` is up, a Kafka job.
//!
//! `cargo bench -p tally-tests --bench hot_swap` (scripts/bench-swap).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use tally_core::hot_swap::{PluginSlot, SwapPolicy};
use tally_core::limits::Limits;
use tally_core::observe::{CommitReport, JobObserver};
use tally_core::plugin::{LoadedPlugin, PluginRuntime};
use tally_core::settings::JobSettings;
use tally_kafka::KafkaConfig;
use tally_kafka::{KafkaJob, KafkaRunOptions};
use tally_local::LocalConfig;
use tally_local::LocalTask;
use tally_tests::kafka::{KafkaBillingJob, bootstrap, partition_of};
use tally_tests::usage_lines;

#[allow(dead_code)] // the benchmark uses only the two billing builds
mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const INTERVAL: Duration = Duration::from_millis(100);
const PUSHES: usize = 10;

/// Every commit: when it finished and which version made it.
#[derive(Default)]
struct Commits(Mutex<Vec<(Instant, String)>>);

impl JobObserver for Commits {
    fn committed(&self, commit: &CommitReport) {
        self.0.lock().unwrap().push((commit.at, commit.plugin_digest.clone()));
    }
}

/// The billing job with 100 ms commits, reading and writing per `mode`.
fn job_config() -> JobSettings {
    let mut settings =
        JobSettings::new("billing", plugins::USAGE_BILLING.into(), vec!["totals".into()]);
    settings.commit_interval_ms = INTERVAL.as_millis() as u64;
    settings
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let runtime = PluginRuntime::new().unwrap();
    let first = runtime.load_file(plugins::USAGE_BILLING.as_ref()).unwrap();
    let dir = tempfile::tempdir().unwrap();

    // Local: 2,000 lines appended every 10 ms (200k events/s) to a followed file.
    let input = dir.path().join("usage.ndjson");
    std::fs::write(&input, "").unwrap();
    let config = job_config();
    let local_config = LocalConfig {
        inputs: vec![input.clone()],
        output_dir: dir.path().join("out"),
        state_dir: dir.path().join("state"),
        confine_to: None,
        output_suffix: String::new(),
    };
    let feed = move |stop: &AtomicBool, lines: &[tally_tests::UsageLine]| {
        let mut file = std::fs::OpenOptions::new().append(true).open(&input).unwrap();
        for chunk in lines.chunks(2_000).cycle() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let text: String = chunk.iter().map(|line| format!("{}\n", line.line)).collect();
            file.write_all(text.as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let local = config.clone();
    let plugin = first.clone();
    measure("local job", &runtime, feed, move |slot, commits, stop| {
        let mut task = LocalTask::open(&local, &local_config, &plugin).unwrap();
        task.attach(slot, SwapPolicy::default(), commits);
        task.run_following(stop).unwrap().records
    });

    if std::net::TcpStream::connect(bootstrap()).is_err() {
        println!(
            "Kafka job: skipped, no broker at {} (start one with scripts/kafka start)",
            bootstrap()
        );
        return;
    }
    // Kafka: 500 records produced every 20 ms (up to 25k events/s) over 4 partitions.
    let topics = KafkaBillingJob::create("bench-swap", 4);
    let mut config = job_config();
    let kafka = KafkaConfig {
        brokers: bootstrap(),
        group: None,
        inputs: vec![topics.input.clone()],
        outputs: [("totals".to_string(), topics.totals.clone())].into(),
        dead_letter_topic: topics.dead_letters.clone(),
        state_dir: dir.path().join("kafka-state"),
        guarantee: Default::default(),
        create_topics: false,
        create_partitions: 4,
        transaction_timeout_ms: 10_000,
        commit_when_caught_up: false,
        restore_stall_ms: tally_kafka::DEFAULT_RESTORE_STALL_MS,
        restore_checkpoint_bytes: tally_kafka::DEFAULT_RESTORE_CHECKPOINT_BYTES,
        restore_fetch: Default::default(),
        client: Default::default(),
    };
    config.name = topics.name.clone();
    let input_topic = topics.input.clone();
    let feed = move |stop: &AtomicBool, lines: &[tally_tests::UsageLine]| {
        // One producer for the whole run: a steady stream, not a flush per chunk.
        let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("linger.ms", "5")
            .create()
            .unwrap();
        for chunk in lines.chunks(500).cycle() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            for line in chunk {
                let record = BaseRecord::<(), str>::to(&input_topic)
                    .partition(partition_of(line, 4))
                    .payload(line.line.as_str());
                if producer.send(record).is_err() {
                    std::thread::sleep(Duration::from_millis(5)); // queue full: this record is skipped
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        producer.flush(Duration::from_secs(30)).unwrap();
    };
    measure("Kafka job (exactly once)", &runtime, feed, move |slot, commits, stop| {
        let mut job = KafkaJob::open(&config, &kafka, &first).unwrap();
        job.attach(slot, SwapPolicy::default(), commits);
        job.run_until(stop, KafkaRunOptions::default()).unwrap().records
    });
    drop(topics);
    let _ = std::fs::remove_dir_all(dir.path());
}

/// Runs `job` (on its own thread: plugin instances stay on the thread that
/// made them) while `feed` adds input, pushes the two builds in turn, and
/// prints the figures.
fn measure(
    what: &str,
    runtime: &PluginRuntime,
    feed: impl FnOnce(&AtomicBool, &[tally_tests::UsageLine]) + Send + 'static,
    job: impl FnOnce(Arc<PluginSlot>, Arc<dyn JobObserver>, &AtomicBool) -> u64 + Send + 'static,
) {
    let slot = PluginSlot::new();
    let commits = Arc::new(Commits::default());
    let stop_feed = Arc::new(AtomicBool::new(false));
    let stop_job = Arc::new(AtomicBool::new(false));
    let feeder = {
        let stop = stop_feed.clone();
        std::thread::spawn(move || feed(&stop, &usage_lines(7, 200_000, 0)))
    };
    let runner = {
        let (slot, commits, stop) = (slot.clone(), commits.clone(), stop_job.clone());
        std::thread::spawn(move || job(slot, commits, &stop))
    };
    wait_for_commits(&commits, 10);

    let builds = [plugins::BILLING_VARIANT, plugins::USAGE_BILLING];
    let (mut compile, mut instantiate, mut to_commit, mut windows) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for push in 0..PUSHES {
        let started = Instant::now();
        let plugin: LoadedPlugin = runtime.load_file(builds[push % 2].as_ref()).unwrap();
        compile.push(started.elapsed());
        // What the job thread pays at the boundary: a fresh instance.
        let started = Instant::now();
        drop(plugin.instantiate(Limits::default()).unwrap());
        instantiate.push(started.elapsed());
        let pushed_at = Instant::now();
        slot.push(plugin.clone());
        let committed_at = loop {
            let found = commits
                .0
                .lock()
                .unwrap()
                .iter()
                .find(|(at, digest)| *at > pushed_at && digest == plugin.digest())
                .map(|(at, _)| *at);
            if let Some(at) = found {
                break at;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        to_commit.push(committed_at - pushed_at);
        windows.push((pushed_at, committed_at));
        std::thread::sleep(Duration::from_millis(700));
    }
    stop_job.store(true, Ordering::Relaxed);
    let records = runner.join().unwrap();
    stop_feed.store(true, Ordering::Relaxed);
    feeder.join().unwrap();

    let commits = commits.0.lock().unwrap();
    let (mut normal, mut around_swap) = (Vec::new(), Vec::new());
    for pair in commits.windows(2) {
        let (start, end) = (pair[0].0, pair[1].0);
        // A gap touching a swap window: from the push to the new version's first commit.
        if windows.iter().any(|&(pushed, committed)| end > pushed && start < committed) {
            around_swap.push(end - start);
        } else {
            normal.push(end - start);
        }
    }
    let median = |values: &[Duration]| {
        let mut sorted = values.to_vec();
        sorted.sort();
        sorted[sorted.len() / 2]
    };
    let max = |values: &[Duration]| values.iter().copied().max().unwrap();
    let (normal_max, swap_max) = (max(&normal), max(&around_swap));
    println!(
        "{what}: {records} events in {} commits, {PUSHES} pushes, {INTERVAL:?} commit interval",
        commits.len()
    );
    println!(
        "  compile + check (off the processing path): median {:.1?}, max {:.1?}",
        median(&compile),
        max(&compile)
    );
    println!(
        "  instantiate (on the job thread):           median {:.1?}, max {:.1?}",
        median(&instantiate),
        max(&instantiate)
    );
    println!(
        "  push -> first commit by the new version:   median {:.1?}, max {:.1?}",
        median(&to_commit),
        max(&to_commit)
    );
    println!(
        "  commit-to-commit gap, normal:              median {:.1?}, max {normal_max:.1?}",
        median(&normal)
    );
    println!(
        "  commit-to-commit gap, around a swap:       median {:.1?}, max {swap_max:.1?}",
        median(&around_swap)
    );
    println!(
        "  longest gap around a swap = {:.2} commit intervals (target: at most 2); {:.2}x the longest normal gap",
        swap_max.as_secs_f64() / INTERVAL.as_secs_f64(),
        swap_max.as_secs_f64() / normal_max.as_secs_f64()
    );
}

fn wait_for_commits(commits: &Commits, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while commits.0.lock().unwrap().len() < count {
        assert!(Instant::now() < deadline, "the job did not commit {count} times within 2 minutes");
        std::thread::sleep(Duration::from_millis(10));
    }
}
