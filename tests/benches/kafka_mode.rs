//! Kafka-mode throughput of the billing job on the local broker, against the
//! ceiling of this machine: a plain rdkafka consume→produce pipe that does no
//! processing. Each round runs three contenders back to back over the same
//! input topic (8 partitions), each from the beginning with its own group,
//! output topics and state:
//!
//! 1. `pipe`: an in-process `read_committed` consumer copying every record's
//!    key and payload to an output topic through an idempotent producer;
//! 2. `at-least-once`: the `tally` binary, `guarantee = "at_least_once"`;
//! 3. `exactly-once`: the `tally` binary, transactions every 100 ms;
//! 4. and 5. the same two with `emit = { totals = "latest_per_key" }`: each commit writes
//!    each billing key's latest total, not every update.
//!
//! Two rates per Tally run: events per wall-clock second around the child
//! process (process start, plugin compile and group join included) and the
//! rate the job reports itself: its Kafka session, from creating its clients
//! (and joining the group) to closing them after its last commit, as the
//! pipe's clock covers creating its clients to its last delivery. Each round
//! prints its ratios; the end prints the medians.
//!
//! Each contender's CPU time is measured too, split into the client (this
//! process for the pipe, the `tally` child for Tally) and the broker (its
//! JVM, from /proc): the CPU each event costs, and the rate that cost
//! allows at best on this machine's cores, show how far a ratio can go
//! before the cores, not the code, are the limit.
//!
//! `cargo bench -p tally-tests --bench kafka_mode` (scripts/bench-kafka starts
//! the broker and builds `tally` first); TALLY_BENCH_EVENTS and
//! TALLY_BENCH_ROUNDS change the size. TALLY_BENCH_BASELINE=<path of
//! another `tally` binary> runs every Tally contender with that build too,
//! right beside this one (which goes first alternates by round), and
//! prints the medians of the per-round ratios this/baseline: an A/B.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext};
use tally_tests::kafka::{
    KafkaBillingJob, bootstrap, create_topic, delete_topics, produce_usage, unique,
};
use tally_tests::{JobReport, parse_job_report, tally_binary, usage_lines};

#[allow(dead_code)] // the benchmark uses only the billing plugin
mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

/// CPU seconds used so far by this process, by its waited-for children, and
/// by the broker (`None` when its pid file cannot be read).
#[derive(Clone, Copy)]
struct CpuSample {
    own: f64,
    children: f64,
    broker: Option<f64>,
}

/// CPU a contender used: its client and the broker.
#[derive(Clone, Copy, Default)]
struct CpuUse {
    client: f64,
    broker: f64,
}

impl CpuSample {
    fn now() -> CpuSample {
        let rusage = |who| {
            // SAFETY: an all-zero rusage is a valid value of the plain C struct.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: getrusage only writes the struct it is given.
            assert_eq!(unsafe { libc::getrusage(who, &mut usage) }, 0, "getrusage failed");
            let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
            seconds(usage.ru_utime) + seconds(usage.ru_stime)
        };
        CpuSample {
            own: rusage(libc::RUSAGE_SELF),
            children: rusage(libc::RUSAGE_CHILDREN),
            broker: broker_cpu_seconds(),
        }
    }

    /// CPU used since `self`, with the client being this process or a child.
    fn since(self, later: CpuSample, client_is_child: bool) -> CpuUse {
        let client =
            if client_is_child { later.children - self.children } else { later.own - self.own };
        CpuUse {
            client,
            broker: later
                .broker
                .zip(self.broker)
                .map_or(f64::NAN, |(after, before)| after - before),
        }
    }
}

/// The broker's CPU seconds, from the pid file `scripts/kafka` keeps.
fn broker_cpu_seconds() -> Option<f64> {
    let home =
        std::env::var("TALLY_KAFKA_HOME").unwrap_or_else(|_| "/var/cache/tally/kafka".into());
    let pid = std::fs::read_to_string(Path::new(&home).join("kafka.pid")).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).ok()?;
    // utime and stime are the 14th and 15th fields, counted from after the command name.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    Some(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// Cores this process may run on.
fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

/// Partitions of the input and of every output topic.
const PARTITIONS: i32 = 8;
/// Longest a single contender may take before the benchmark gives up.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Counts the pipe producer's deliveries and failures.
#[derive(Default)]
struct DeliveryCounter {
    delivered: AtomicU64,
    failed: AtomicU64,
}

impl ClientContext for DeliveryCounter {}
impl ProducerContext for DeliveryCounter {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.delivered.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// Copies all of `input` to a fresh output topic, record by record, and
/// returns the time from creating the clients to the producer's flush, and
/// the CPU used meanwhile.
fn run_pipe(input: &str, events: usize) -> (Duration, CpuUse) {
    let output = unique("bench-pipe-out");
    create_topic(&output, PARTITIONS);
    let cpu = CpuSample::now();
    let started = Instant::now();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("bench-pipe"))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        // The consumer settings Tally uses (librdkafka's defaults starve a
        // fast consumer); a ceiling should be the best a plain pipe can do.
        .set("fetch.queue.backoff.ms", "10")
        .set("queued.min.messages", "20000")
        .create()
        .expect("creating the pipe's consumer");
    let producer: ThreadedProducer<DeliveryCounter> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create_with_context(DeliveryCounter::default())
        .expect("creating the pipe's producer");
    consumer.subscribe(&[input]).expect("subscribing the pipe to the input");

    let mut at_end = [false; PARTITIONS as usize];
    let mut copied = 0usize;
    while !at_end.iter().all(|&done| done) {
        assert!(
            started.elapsed() < RUN_TIMEOUT,
            "the pipe did not reach the end of {input} ({copied} records copied)"
        );
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(partition))) => at_end[partition as usize] = true,
            Some(Err(err)) => panic!("the pipe failed to consume {input}: {err}"),
            Some(Ok(message)) => {
                let mut record = BaseRecord::to(&output).partition(message.partition());
                if let Some(key) = message.key() {
                    record = record.key(key);
                }
                if let Some(payload) = message.payload() {
                    record = record.payload(payload);
                }
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                            record = back;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err((err, _)) => panic!("the pipe failed to produce to {output}: {err}"),
                    }
                }
                copied += 1;
            }
        }
    }
    producer.flush(Duration::from_secs(60)).expect("flushing the pipe's producer");
    let elapsed = started.elapsed();
    let cpu = cpu.since(CpuSample::now(), false);
    consumer.commit_consumer_state(CommitMode::Sync).expect("committing the pipe's offsets");

    let counter = producer.context();
    let (delivered, failed) =
        (counter.delivered.load(Ordering::Relaxed), counter.failed.load(Ordering::Relaxed));
    assert_eq!(copied, events, "the pipe consumed {copied} records of {events}");
    assert_eq!(
        (delivered, failed),
        (events as u64, 0),
        "the pipe's producer delivered {delivered} and failed {failed} of {events}"
    );
    delete_topics(&[&output]);
    (elapsed, cpu)
}

/// One Tally configuration the benchmark runs.
struct Contender {
    label: &'static str,
    guarantee: &'static str,
    emit: &'static str,
}

/// The Tally runs of each round: both guarantees, writing every update and
/// writing each key's latest total per commit.
const CONTENDERS: [Contender; 4] = [
    Contender { label: "at-least-once", guarantee: "at_least_once", emit: "every_update" },
    Contender { label: "exactly-once", guarantee: "exactly_once", emit: "every_update" },
    Contender { label: "alos latest", guarantee: "at_least_once", emit: "latest_per_key" },
    Contender { label: "eos latest", guarantee: "exactly_once", emit: "latest_per_key" },
];

/// Runs the billing job over `input` with the `tally` binary until it has
/// caught up; returns the wall time around the process, its own report and
/// the CPU it and the broker used.
fn run_tally(
    dir: &Path,
    input: &str,
    contender: &Contender,
    events: usize,
    binary: &Path,
) -> (Duration, JobReport, CpuUse) {
    let name = unique(&format!("bench-{}", contender.label.replace(' ', "-")));
    let job = KafkaBillingJob::on_input(name, input, PARTITIONS);
    let state_dir = dir.join(&job.name);
    let job_file = job.write_job_file_with_kafka(
        dir,
        plugins::USAGE_BILLING,
        &state_dir,
        &format!("commit_interval_ms = 100\nemit = {{ totals = {:?} }}", contender.emit),
        &format!("guarantee = {:?}", contender.guarantee),
        "",
    );

    let label = contender.label;
    let cpu = CpuSample::now();
    let started = Instant::now();
    let output = Command::new(binary)
        .args(["run", "--until-caught-up"])
        .arg(&job_file)
        .output()
        .unwrap_or_else(|err| panic!("starting `tally run` for {label}: {err}"));
    let elapsed = started.elapsed();
    let cpu = cpu.since(CpuSample::now(), true);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "`tally run` ({label}) failed with {}:\n{stdout}{stderr}",
        output.status
    );
    let report = parse_job_report(&stdout).unwrap_or_else(|| {
        panic!("`tally run` ({label}) printed no summary line I can read:\n{stdout}")
    });
    let events = events as u64;
    let outputs_expected = if contender.emit == "every_update" {
        report.outputs == events
    } else {
        report.outputs <= events
    };
    assert!(
        report.records == events && report.applied == events && outputs_expected,
        "`tally run` ({label}) processed {} records ({} applied, {} outputs), expected {events} records and applied \
         and, writing {}, that many outputs at most:\n{stdout}",
        report.records,
        report.applied,
        report.outputs,
        contender.emit
    );
    std::fs::remove_dir_all(&state_dir).ok();
    (elapsed, report, cpu)
}

fn median(rates: &[f64]) -> f64 {
    let mut sorted = rates.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    sorted[sorted.len() / 2]
}

/// One Tally run's rates, in events per second.
#[derive(Clone, Copy)]
struct TallyRates {
    wall: f64,
    job: f64,
    cpu: CpuUse,
}

/// Rates of one round, in events per second.
struct Round {
    pipe: f64,
    pipe_cpu: CpuUse,
    /// In the order of [`CONTENDERS`].
    tally: Vec<TallyRates>,
    /// The same with TALLY_BENCH_BASELINE's build (empty without one).
    baseline: Vec<TallyRates>,
}

/// `client + broker = total µs/event (best rate the cores allow)`.
fn cpu_line(cpu: CpuUse, events: usize) -> String {
    let per_event = |seconds: f64| seconds / events as f64 * 1e6;
    let total = per_event(cpu.client + cpu.broker);
    format!(
        "CPU {:.2} client + {:.2} broker = {total:.2} µs/event (at most {:.0} events/s on {} cores)",
        per_event(cpu.client),
        per_event(cpu.broker),
        cores() / total * 1e6,
        cores()
    )
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return; // `cargo test --benches` asks benches to list their tests
    }
    let events = env_or("TALLY_BENCH_EVENTS", 1_000_000);
    let rounds = env_or("TALLY_BENCH_ROUNDS", 5).max(1);
    let dir = tempfile::tempdir_in(
        std::env::var("TALLY_BENCH_DIR")
            .unwrap_or_else(|_| std::env::temp_dir().display().to_string()),
    )
    .expect("creating the bench directory");

    let input = unique("bench-usage");
    create_topic(&input, PARTITIONS);
    let lines = usage_lines(2026, events, 0);
    let producing = Instant::now();
    produce_usage(&input, &lines, PARTITIONS);
    drop(lines);
    println!(
        "kafka mode on {}, billing job, {events} events in {PARTITIONS} partitions (produced in {:.1?}), 100 ms commits, {rounds} rounds",
        bootstrap(),
        producing.elapsed()
    );
    println!("rates in events/s; Tally: wall around the process / the job's own report");
    println!(
        "`latest`: emit = {{ totals = \"latest_per_key\" }} (each key's last total per commit); the others write every update"
    );

    let this_build = tally_binary();
    let baseline: Option<PathBuf> = std::env::var_os("TALLY_BENCH_BASELINE").map(Into::into);
    let mut results = Vec::new();
    for round in 0..rounds {
        let (pipe, pipe_cpu) = run_pipe(&input, events);
        let pipe = events as f64 / pipe.as_secs_f64();
        println!(
            "round {round}  pipe          {pipe:>9.0}                        {}",
            cpu_line(pipe_cpu, events)
        );
        let (mut tally, mut base) = (Vec::new(), Vec::new());
        for contender in &CONTENDERS {
            let mut builds = vec![(&this_build, "")];
            if let Some(baseline) = &baseline {
                builds.push((baseline, " (base)"));
                if round % 2 == 1 {
                    builds.reverse();
                }
            }
            for (binary, suffix) in builds {
                let (wall, report, cpu) = run_tally(dir.path(), &input, contender, events, binary);
                let wall = events as f64 / wall.as_secs_f64();
                println!(
                    "round {round}  {:<13} {wall:>9.0} / {:>9.0}  ({:.2} / {:.2} of pipe, {} commits, {} outputs)  {}",
                    format!("{}{suffix}", contender.label),
                    report.rate,
                    wall / pipe,
                    report.rate / pipe,
                    report.commits,
                    report.outputs,
                    cpu_line(cpu, events)
                );
                let rates = TallyRates { wall, job: report.rate, cpu };
                if suffix.is_empty() { tally.push(rates) } else { base.push(rates) }
            }
        }
        for (eos, alos) in [(1, 0), (3, 2)] {
            println!(
                "round {round}  {}/{} {:.2} / {:.2}",
                CONTENDERS[eos].label,
                CONTENDERS[alos].label,
                tally[eos].wall / tally[alos].wall,
                tally[eos].job / tally[alos].job
            );
        }
        results.push(Round { pipe, pipe_cpu, tally, baseline: base });
    }

    let of = |field: &dyn Fn(&Round) -> f64| median(&results.iter().map(field).collect::<Vec<_>>());
    let pipe = of(&|r| r.pipe);
    println!(
        "median   pipe          {pipe:>9.0}                        {}",
        cpu_line(median_cpu(results.iter().map(|r| r.pipe_cpu)), events)
    );
    for (index, contender) in CONTENDERS.iter().enumerate() {
        let (wall, job) = (of(&|r| r.tally[index].wall), of(&|r| r.tally[index].job));
        println!(
            "median   {:<13} {wall:>9.0} / {job:>9.0}  ({:.2} / {:.2} of pipe, medians of per-round ratios)  {}",
            contender.label,
            of(&|r| r.tally[index].wall / r.pipe),
            of(&|r| r.tally[index].job / r.pipe),
            cpu_line(median_cpu(results.iter().map(|r| r.tally[index].cpu)), events)
        );
    }
    for (eos, alos) in [(1, 0), (3, 2)] {
        println!(
            "median   {}/{} {:.2} / {:.2} (of per-round ratios)",
            CONTENDERS[eos].label,
            CONTENDERS[alos].label,
            of(&|r| r.tally[eos].wall / r.tally[alos].wall),
            of(&|r| r.tally[eos].job / r.tally[alos].job)
        );
    }
    let total = |cpu: CpuUse| cpu.client + cpu.broker;
    let pipe_cpu = total(median_cpu(results.iter().map(|r| r.pipe_cpu)));
    for index in [1, 3] {
        let eos_cpu = total(median_cpu(results.iter().map(|r| r.tally[index].cpu)));
        println!(
            "CPU per event, {}/pipe: {:.2}x; with every core busy, it could reach at most {:.2} of the pipe's measured rate",
            CONTENDERS[index].label,
            eos_cpu / pipe_cpu,
            cores() / (eos_cpu / events as f64) / pipe
        );
    }
    if baseline.is_some() {
        for (index, contender) in CONTENDERS.iter().enumerate() {
            println!(
                "A/B      {:<13} this/baseline {:.3} wall / {:.3} job (medians of per-round ratios)",
                contender.label,
                of(&|r| r.tally[index].wall / r.baseline[index].wall),
                of(&|r| r.tally[index].job / r.baseline[index].job)
            );
        }
    }
    println!("targets: exactly-once >= 0.80 of pipe, and >= 0.90 of at-least-once");
    // Every run leaves a million records otherwise: the broker's disk fills.
    delete_topics(&[&input]);
}

/// Medians of the client and the broker CPU, taken apart.
fn median_cpu(uses: impl Iterator<Item = CpuUse>) -> CpuUse {
    let uses: Vec<CpuUse> = uses.collect();
    CpuUse {
        client: median(&uses.iter().map(|cpu| cpu.client).collect::<Vec<_>>()),
        broker: median(&uses.iter().map(|cpu| cpu.broker).collect::<Vec<_>>()),
    }
}
