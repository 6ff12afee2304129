//! End-to-end latency of the billing job under exactly-once, Tally beside a
//! Kafka Streams 4.4 peer of the same job (`tests/restore-peer`: Processor
//! API, exactly_once_v2, cache off, 100 ms commits), on the same broker in
//! the same run.
//!
//! One producer sends billing events at a steady rate (keyed by customer,
//! 8 partitions) to one input topic; Tally (`tally run`, 100 ms commits)
//! and the peer each read it with their own group and write their own
//! output topic; two `read_committed` readers in this process take each
//! output record as it arrives. Both jobs' outputs name their input record
//! (headers `tally.source.partition` and `tally.source.offset`), so each
//! input event's latency is exact: from just before the producer's `send`
//! to the output record's arrival at its reader, both on this process's
//! monotonic clock. Events sent during the warm-up (process start, group
//! join, first commits) are not counted.
//!
//! `scripts/bench-latency` (it starts the broker and builds `tally` and
//! the peer first). TALLY_BENCH_RATE (events/s, default 1000),
//! TALLY_BENCH_SECONDS (measured, default 30), TALLY_BENCH_WARMUP
//! (seconds, default 15) and TALLY_BENCH_ROUNDS (default 3) change it;
//! TALLY_BENCH_BASELINE=<path of another `tally` binary> races that build
//! too, in the same rounds (an A/B); TALLY_BENCH_CAUGHT_UP=1 races the
//! same build with `commit_when_caught_up = true`; TALLY_BENCH_CLIENT adds lines to
//! Tally's `[kafka.client]`; TALLY_BENCH_KEEP=1 keeps the contenders' logs
//! (with `RUST_LOG=tally_kafka=debug`, each commit's phases).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tally_tests::kafka::{
    KafkaBillingJob, bootstrap, create_topic, delete_topics, delete_topics_starting_with,
};
use tally_tests::tally_binary;

#[allow(dead_code)] // the benchmark uses only the billing plugin
mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

const PARTITIONS: i32 = 8;
const CUSTOMERS: usize = 64;
const METRICS: &[&str] = &["api_calls", "storage_gb_hours", "egress_mb"];

/// An input record: (partition, offset).
type Source = (i32, i64);

/// When each input record was sent, learnt from its delivery report.
#[derive(Default)]
struct SendTimes(Mutex<HashMap<Source, Instant>>);

impl ClientContext for SendTimes {}

impl ProducerContext for SendTimes {
    type DeliveryOpaque = Box<Instant>;

    fn delivery(&self, result: &DeliveryResult<'_>, sent: Box<Instant>) {
        if let Ok(record) = result {
            self.0.lock().unwrap().insert((record.partition(), record.offset()), *sent);
        }
    }
}

/// Sends `total` events at `rate` per second from now; its context learns
/// when each was sent and where it landed.
fn produce_steadily(topic: &str, rate: f64, total: usize) -> ThreadedProducer<SendTimes> {
    let producer: ThreadedProducer<SendTimes> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("linger.ms", "0")
        .set("enable.idempotence", "true")
        .create_with_context(SendTimes::default())
        .expect("creating the benchmark's producer");
    let start = Instant::now();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for index in 0..total {
        let due = start + Duration::from_secs_f64(index as f64 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let customer = (rng % CUSTOMERS as u64) as usize;
        let metric = METRICS[(rng >> 8) as usize % METRICS.len()];
        let quantity = 1 + (rng >> 16) % 1000;
        let key = format!("cust-{customer:02}");
        let value = format!(
            r#"{{"customer":"{key}","metric":"{metric}","quantity":{quantity},"ts":"2026-11-{:02}T12:00:00Z"}}"#,
            1 + (rng >> 32) % 30
        );
        let partition = (customer % PARTITIONS as usize) as i32;
        // A send retried while the queue is full keeps its first send time.
        let mut record = BaseRecord::with_opaque_to(topic, Box::new(Instant::now()))
            .key(key.as_bytes())
            .payload(value.as_bytes())
            .partition(partition);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((err, back)) => {
                    eprintln!("producing: {err}; retrying");
                    record = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
    producer
}

/// Reads `topic` `read_committed` from its beginning until `stop`, noting
/// when each record arrived and which input record it came from.
fn read_arrivals(
    topic: String,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(Source, Instant)>> {
    std::thread::spawn(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("group.id", format!("{topic}-latency-reader"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "10")
            .create()
            .expect("creating a reader");
        let mut assignment = TopicPartitionList::new();
        for partition in 0..PARTITIONS {
            assignment.add_partition_offset(&topic, partition, Offset::Beginning).unwrap();
        }
        consumer.assign(&assignment).unwrap();
        let mut arrivals = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let Some(message) = consumer.poll(Duration::from_millis(50)) else { continue };
            let arrived = Instant::now();
            let message = match message {
                Ok(message) => message,
                Err(err) => {
                    eprintln!("reading {topic}: {err}");
                    continue;
                }
            };
            let header = |name: &str| -> Option<i64> {
                let headers = message.headers()?;
                let header = headers.iter().find(|header| header.key == name)?;
                std::str::from_utf8(header.value?).ok()?.parse().ok()
            };
            match (header("tally.source.partition"), header("tally.source.offset")) {
                (Some(partition), Some(offset)) => {
                    arrivals.push(((partition as i32, offset), arrived))
                }
                _ => panic!("an output record of {topic} does not name its input record"),
            }
        }
        arrivals
    })
}

/// Latency percentiles of one contender in one round, in milliseconds.
#[derive(Clone, Copy, Debug, Default)]
struct Latencies {
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

impl Latencies {
    fn of(mut millis: Vec<f64>) -> Latencies {
        millis.sort_by(f64::total_cmp);
        let at =
            |q: f64| millis[((millis.len() as f64 * q).ceil() as usize).clamp(1, millis.len()) - 1];
        Latencies { p50: at(0.50), p90: at(0.90), p99: at(0.99), p999: at(0.999), max: at(1.0) }
    }

    fn row(&self, label: &str) -> String {
        format!(
            "{label:<14} p50 {:>7.1}  p90 {:>7.1}  p99 {:>7.1}  p99.9 {:>7.1}  max {:>7.1}",
            self.p50, self.p90, self.p99, self.p999, self.max
        )
    }
}

/// The latencies of the events sent in the measured window, from what a
/// reader saw; panics if one of them never arrived.
fn latencies(
    label: &str,
    sent: &HashMap<Source, Instant>,
    measured_from: Instant,
    arrivals: &[(Source, Instant)],
) -> Latencies {
    let mut first: HashMap<Source, Instant> = HashMap::with_capacity(arrivals.len());
    for &(source, at) in arrivals {
        first.entry(source).or_insert(at);
    }
    let mut millis = Vec::new();
    let mut missing = 0;
    for (source, &at) in sent {
        if at < measured_from {
            continue;
        }
        match first.get(source) {
            Some(arrived) => millis.push(arrived.saturating_duration_since(at).as_secs_f64() * 1e3),
            None => missing += 1,
        }
    }
    assert_eq!(missing, 0, "{label}: {missing} measured events never reached its output");
    assert!(!millis.is_empty(), "{label}: nothing was measured");
    Latencies::of(millis)
}

fn env_number(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().map_or(default, |value| {
        value.parse().unwrap_or_else(|_| panic!("{name} must be a number, not {value:?}"))
    })
}

fn spawn_logged(command: &mut Command, log: &Path) -> Child {
    let file = std::fs::File::create(log).unwrap();
    command
        .stdout(Stdio::from(file.try_clone().unwrap()))
        .stderr(Stdio::from(file))
        .spawn()
        .unwrap_or_else(|err| panic!("starting {command:?}: {err}"))
}

/// A Tally build in the race: its label and binary.
struct TallyBuild {
    label: String,
    binary: PathBuf,
    /// Lines of its job file's `[kafka]` section.
    kafka: &'static str,
}

/// One round: every Tally build and the peer on a fresh input topic; their
/// latencies in that order (the peer's last).
fn round(
    dir: &Path,
    builds: &[TallyBuild],
    peer_script: &Path,
    rate: f64,
    warmup: f64,
    seconds: f64,
) -> Vec<Latencies> {
    let first = KafkaBillingJob::create("bench-latency", PARTITIONS);
    // TALLY_BENCH_CLIENT: lines for Tally's `[kafka.client]`, to try a setting.
    let client = std::env::var("TALLY_BENCH_CLIENT").unwrap_or_default();
    let jobs: Vec<KafkaBillingJob> = (1..builds.len())
        .map(|index| {
            KafkaBillingJob::on_input(format!("{}-{index}", first.name), &first.input, PARTITIONS)
        })
        .collect();
    let jobs: Vec<&KafkaBillingJob> = std::iter::once(&first).chain(&jobs).collect();
    let peer_output = format!("{}-peer-totals", first.name);
    let peer_app = format!("{}-peer", first.name);
    create_topic(&peer_output, PARTITIONS);
    let total = (rate * (warmup + seconds)) as usize;

    let stop_reading = Arc::new(AtomicBool::new(false));
    let mut readers: Vec<_> =
        jobs.iter().map(|job| read_arrivals(job.totals.clone(), stop_reading.clone())).collect();
    readers.push(read_arrivals(peer_output.clone(), stop_reading.clone()));
    let mut tallies: Vec<Child> = jobs
        .iter()
        .zip(builds)
        .map(|(job, build)| {
            let state = dir.join(format!("{}-state", job.name));
            let job_file = job.write_job_file_with_kafka(
                dir,
                plugins::USAGE_BILLING,
                &state,
                "commit_interval_ms = 100",
                build.kafka,
                &client,
            );
            spawn_logged(
                Command::new(&build.binary).arg("run").arg(&job_file),
                &dir.join(format!("{}-tally.log", job.name)),
            )
        })
        .collect();
    let mut peer = spawn_logged(
        Command::new(peer_script).args([
            "process",
            "--bootstrap",
            &bootstrap(),
            "--input",
            &first.input,
            "--output",
            &peer_output,
            "--app-id",
            &peer_app,
            "--state-dir",
            &dir.join(format!("{}-peer-state", first.name)).display().to_string(),
            "--expect",
            &total.to_string(),
            "--lineage",
            "true",
            "--timeout-s",
            &((warmup + seconds) as u64 + 120).to_string(),
        ]),
        &dir.join(format!("{}-peer.log", first.name)),
    );

    let started = Instant::now();
    let measured_from = started + Duration::from_secs_f64(warmup);
    let producer = produce_steadily(&first.input, rate, total);
    producer.flush(Duration::from_secs(30)).unwrap();

    // The peer stops once it processed everything; Tally is given 3 s more
    // (every contender's latency is checked for every event below).
    let peer_status = wait_exit(&mut peer, Duration::from_secs(120));
    assert!(peer_status.success(), "the Kafka Streams peer failed; see {}", dir.display());
    std::thread::sleep(Duration::from_secs(3));
    stop_reading.store(true, Ordering::Relaxed);
    let arrivals: Vec<_> = readers.into_iter().map(|reader| reader.join().unwrap()).collect();
    for tally in &mut tallies {
        // SAFETY: kill only sends a signal to the child's pid.
        unsafe { libc::kill(tally.id() as i32, libc::SIGTERM) };
    }
    for tally in &mut tallies {
        let status = wait_exit(tally, Duration::from_secs(60));
        assert!(status.success(), "`tally run` failed; see {}", dir.display());
    }

    let sent = std::mem::take(&mut *producer.context().0.lock().unwrap());
    assert_eq!(sent.len(), total, "every event is delivered to the input topic");
    let labels = builds.iter().map(|build| build.label.as_str()).chain(["kafka streams"]);
    let result = labels
        .zip(&arrivals)
        .map(|(label, arrivals)| latencies(label, &sent, measured_from, arrivals))
        .collect();
    delete_topics(&[&peer_output]);
    delete_topics_starting_with(&format!("{peer_app}-"));
    result
}

fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("a contender did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return; // `cargo test --benches` asks benches to list their tests
    }
    let rate = env_number("TALLY_BENCH_RATE", 1000.0);
    let seconds = env_number("TALLY_BENCH_SECONDS", 30.0);
    let warmup = env_number("TALLY_BENCH_WARMUP", 15.0);
    let rounds = env_number("TALLY_BENCH_ROUNDS", 3.0) as usize;
    let peer_script: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("restore-peer/run");
    let dir = tempfile::tempdir().unwrap();
    // TALLY_BENCH_KEEP=1 keeps the contenders' logs and state for a look.
    let dir_path = if std::env::var_os("TALLY_BENCH_KEEP").is_some() {
        let kept = dir.keep();
        eprintln!("keeping logs and state in {}", kept.display());
        kept
    } else {
        dir.path().to_path_buf()
    };
    println!(
        "end-to-end latency, exactly-once, 100 ms commits: {rate} events/s over {PARTITIONS} partitions, \
         {seconds} s measured after {warmup} s of warm-up, {rounds} round(s); milliseconds, monotonic clock"
    );
    let mut builds = vec![TallyBuild { label: "tally".into(), binary: tally_binary(), kafka: "" }];
    // TALLY_BENCH_CAUGHT_UP=1: the same build with `commit_when_caught_up`, in the same rounds.
    if std::env::var_os("TALLY_BENCH_CAUGHT_UP").is_some() {
        builds.push(TallyBuild {
            label: "tally, commit when caught up".into(),
            binary: tally_binary(),
            kafka: "commit_when_caught_up = true",
        });
    }
    // TALLY_BENCH_BASELINE: another `tally` binary, raced in the same rounds (A/B).
    if let Some(baseline) = std::env::var_os("TALLY_BENCH_BASELINE") {
        builds.push(TallyBuild {
            label: "tally baseline".into(),
            binary: baseline.into(),
            kafka: "",
        });
    }
    let labels: Vec<&str> =
        builds.iter().map(|build| build.label.as_str()).chain(["kafka streams"]).collect();
    let mut results: Vec<Vec<Latencies>> = Vec::new();
    for round_number in 1..=rounds {
        let latencies = round(&dir_path, &builds, &peer_script, rate, warmup, seconds);
        println!("round {round_number}");
        for (label, latencies) in labels.iter().zip(&latencies) {
            println!("  {}", latencies.row(label));
        }
        let peer = latencies.last().unwrap();
        println!("  p99 tally / kafka streams: {:.2}", latencies[0].p99 / peer.p99);
        results.push(latencies);
    }
    println!("medians over {rounds} round(s)");
    for (index, label) in labels.iter().enumerate() {
        let med = |pick: fn(&Latencies) -> f64| median(results.iter().map(|r| pick(&r[index])));
        let summary = Latencies {
            p50: med(|l| l.p50),
            p90: med(|l| l.p90),
            p99: med(|l| l.p99),
            p999: med(|l| l.p999),
            max: med(|l| l.max),
        };
        println!("  {}", summary.row(label));
    }
    for (index, label) in labels.iter().enumerate().take(labels.len() - 1) {
        println!(
            "  p99 {label} / kafka streams: {:.2} (median of per-round ratios)",
            median(results.iter().map(|r| r[index].p99 / r.last().unwrap().p99))
        );
    }
}
