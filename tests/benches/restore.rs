//! State restore, side by side: how fast a Kafka-mode job that lost its
//! local state rebuilds it from its changelog, against a Kafka Streams 4.4
//! peer of the same job (`tests/restore-peer`) and two ceilings on the same
//! records. For each size (distinct billing keys, one event each, 4
//! partitions, so one changelog record per key), after one untimed run of
//! each job has written its changelog, every round runs, back to back:
//!
//! 1. `tally`: `tally run --until-caught-up` on a wiped state directory; its
//!    restore-only time, records, bytes and CPU from its own log line
//!    ("restored state from the changelog": `took_ms`, `cpu_ms`), reading
//!    through librdkafka's restore consumer (the default);
//!    `tally leaders`: the same with `restore_fetch = "leaders"` (opt-in:
//!    the restore fetches from the partitions' leaders itself);
//! 2. `kafka streams`: the peer (Processor API, exactly_once_v2, cache off,
//!    restore settings at their defaults) on a wiped state directory; from
//!    its first `onRestoreStart` to its last `onRestoreEnd`, with the JVM's
//!    process CPU time between them;
//! 3. `bare read`: this process reading Tally's changelog to its end with
//!    librdkafka's batch API and the restore consumer's fetch settings,
//!    doing nothing with the records;
//! 4. `bare write`: this process writing the same records (read into
//!    memory first) into a fresh RocksDB, one write batch of 10,000 per
//!    write with the write-ahead log off, then one flush (RocksDB's
//!    memtable path, the one Kafka Streams restores through);
//! 5. `bare load`: the same records from memory through Tally's own bulk
//!    load (`tally_state_rocks`: chunks sorted into SST files and ingested)
//!    into a fresh store, to its finish: the ceiling of Tally's write path.
//!
//! Wall time is the monotonic clock; CPU is each process's own (every
//! thread). Medians of the rounds; ratios per size at the end.
//!
//! `scripts/bench-restore` starts the broker and builds `tally` and the
//! peer first. TALLY_BENCH_RESTORE_KEYS (comma-separated, default
//! `200000,1000000,3000000`) and TALLY_BENCH_ROUNDS (default 3) change it;
//! TALLY_BENCH_PERF=<file> records each `tally` restore with `perf record`
//! into that file (the last one stays).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tally_tests::kafka::{
    KafkaBillingJob, bootstrap, delete_topics, delete_topics_starting_with, produce_usage,
};
use tally_tests::{distinct_key_lines, tally_binary};

#[allow(dead_code)] // the benchmark uses only the billing plugin
mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

const PARTITIONS: i32 = 4;
/// Records per write batch of the bare RocksDB write (and most per read).
const BATCH: usize = 10_000;

/// One contender's restore in one round.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    seconds: f64,
    records: u64,
    bytes: u64,
    cpu_seconds: f64,
}

/// CPU seconds this process has used (every thread).
fn own_cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage only writes the struct it is given.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0, "getrusage failed");
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// A `key=value` number of a log line (`took_ms=1234`).
fn field(line: &str, name: &str) -> Option<u64> {
    let prefix = format!("{name}=");
    line.split_whitespace().find_map(|word| word.strip_prefix(prefix.as_str())?.parse().ok())
}

/// Runs `tally run --until-caught-up` on `job_file`, its log in `log`;
/// under `perf record` into `profile` if given.
fn run_tally(job_file: &Path, log: &Path, profile: Option<&Path>) {
    let mut command = match profile {
        Some(profile) => {
            let mut perf = Command::new("perf");
            perf.args(["record", "-q", "-F", "1999", "-o"])
                .arg(profile)
                .arg("--")
                .arg(tally_binary());
            perf
        }
        None => Command::new(tally_binary()),
    };
    let status = command
        .args(["run", "--until-caught-up"])
        .arg(job_file)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .env("RUST_LOG", "info")
        .status()
        .unwrap();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        status.success(),
        "tally failed: {status}\n{}",
        &text[text.len().saturating_sub(3000)..]
    );
}

/// Tally's restore, from its log, after wiping its RocksDB (the state
/// directory keeps its instance id: the same group member comes back);
/// under `perf record` if `profiled` and TALLY_BENCH_PERF names a file.
fn tally_restore(job_file: &Path, state: &Path, log: &Path, profiled: bool) -> Sample {
    std::fs::remove_dir_all(state.join("db")).unwrap();
    let profile = std::env::var_os("TALLY_BENCH_PERF").filter(|_| profiled).map(PathBuf::from);
    run_tally(job_file, log, profile.as_deref());
    let text = std::fs::read_to_string(log).unwrap();
    let mut sample = Sample::default();
    for line in text.lines().filter(|line| line.contains("restored state from the changelog")) {
        sample.records += field(line, "records").unwrap();
        sample.bytes += field(line, "bytes").unwrap();
        sample.seconds += field(line, "took_ms").unwrap() as f64 / 1e3;
        sample.cpu_seconds += field(line, "cpu_ms").unwrap() as f64 / 1e3;
    }
    assert!(sample.records > 0, "tally restored nothing:\n{text}");
    sample
}

/// The Kafka Streams peer, run by its script.
struct Peer {
    script: PathBuf,
    input: String,
    output: String,
    app_id: String,
    state: PathBuf,
}

impl Peer {
    fn run(&self, command: &str, extra: &[&str]) -> serde_json::Value {
        let output = Command::new(&self.script)
            .arg(command)
            .args([
                "--bootstrap",
                &bootstrap(),
                "--input",
                &self.input,
                "--output",
                &self.output,
                "--app-id",
                &self.app_id,
            ])
            .arg("--state-dir")
            .arg(&self.state)
            .args(extra)
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "the Kafka Streams peer failed `{command}`: {}\n{stdout}",
            output.status
        );
        let line = stdout
            .lines()
            .rev()
            .find(|line| line.starts_with('{'))
            .unwrap_or_else(|| panic!("no JSON from the peer: {stdout}"));
        serde_json::from_str(line).unwrap()
    }

    fn restore(&self) -> Sample {
        let _ = std::fs::remove_dir_all(&self.state);
        let report = self.run("restore", &[]);
        let number = |name: &str| {
            report[name].as_f64().unwrap_or_else(|| panic!("peer report lacks {name}: {report}"))
        };
        Sample {
            seconds: number("restore_ms") / 1e3,
            records: number("records") as u64,
            bytes: report["changelog_bytes"].as_f64().unwrap_or(0.0) as u64,
            cpu_seconds: number("cpu_s"),
        }
    }
}

/// Changelog records held in one buffer: key, then value.
#[derive(Default)]
struct Records {
    data: Vec<u8>,
    /// Key and value lengths (`None`: a tombstone).
    lengths: Vec<(u32, Option<u32>)>,
}

impl Records {
    /// Each record's key and value (`None`: a tombstone), in order.
    fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> + '_ {
        let mut at = 0;
        self.lengths.iter().map(move |&(key_len, value_len)| {
            let key = &self.data[at..at + key_len as usize];
            at += key_len as usize;
            let value = value_len.map(|len| &self.data[at..at + len as usize]);
            at += value_len.unwrap_or(0) as usize;
            (key, value)
        })
    }
}

/// A consumer of `topic` as Tally's restore consumer is: `read_committed`,
/// the restore fetch settings, an event at each end; connected.
fn changelog_reader(topic: &str) -> BaseConsumer {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap())
        .set("group.id", format!("{topic}-bare-read"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    for (key, value) in tally_kafka::RESTORE_DEFAULTS {
        config.set(*key, *value);
    }
    let consumer: BaseConsumer = config.create().unwrap();
    consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    consumer
}

/// Asks each partition's end first, as Tally's restore does, then assigns
/// them all from their beginning.
fn assign_to_end(consumer: &BaseConsumer, topic: &str) {
    let mut assignment = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        consumer.fetch_watermarks(topic, partition, Duration::from_secs(10)).unwrap();
        assignment.add_partition_offset(topic, partition, Offset::Beginning).unwrap();
    }
    consumer.assign(&assignment).unwrap();
}

/// Reads `topic` to its end with librdkafka's batch API; keeps the records
/// in `keep` if given. Timed as Tally's restore is: from asking the ends
/// with a connected consumer to the last end.
fn bare_read(topic: &str, mut keep: Option<&mut Records>) -> Sample {
    let consumer = changelog_reader(topic);
    let (started, cpu) = (Instant::now(), own_cpu_seconds());
    assign_to_end(&consumer, topic);
    let mut sample = Sample::default();
    let mut ends = 0;
    let mut batch = vec![std::ptr::null_mut(); BATCH];
    // SAFETY: the consumer outlives the queue reference, released below.
    let queue = unsafe { rd::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
    let deadline = Instant::now() + Duration::from_secs(600);
    while ends < PARTITIONS {
        assert!(Instant::now() < deadline, "the bare read of {topic} did not end");
        // SAFETY: `batch` has room for BATCH pointers and the queue is valid.
        let read = unsafe { rd::rd_kafka_consume_batch_queue(queue, 5, batch.as_mut_ptr(), BATCH) };
        for &message in &batch[..usize::try_from(read).unwrap_or(0)] {
            // SAFETY: librdkafka returned valid messages, each destroyed once below.
            let item = unsafe { &*message };
            match item.err {
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => {
                    sample.records += 1;
                    sample.bytes += (item.key_len + item.len) as u64;
                    if let Some(records) = keep.as_deref_mut() {
                        // SAFETY: librdkafka keeps key_len and len bytes at key and payload.
                        let key = unsafe {
                            std::slice::from_raw_parts(item.key as *const u8, item.key_len)
                        };
                        records.data.extend_from_slice(key);
                        // SAFETY: as for the key, with `len` bytes at `payload`.
                        let value = (!item.payload.is_null()).then(|| unsafe {
                            std::slice::from_raw_parts(item.payload as *const u8, item.len)
                        });
                        if let Some(value) = value {
                            records.data.extend_from_slice(value);
                        }
                        records
                            .lengths
                            .push((key.len() as u32, value.map(|value| value.len() as u32)));
                    }
                }
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF => ends += 1,
                code => panic!(
                    "reading {topic} failed: {:?}",
                    rdkafka::types::RDKafkaErrorCode::from(code)
                ),
            }
            // SAFETY: see above; not used after this.
            unsafe { rd::rd_kafka_message_destroy(message) };
        }
    }
    sample.seconds = started.elapsed().as_secs_f64();
    sample.cpu_seconds = own_cpu_seconds() - cpu;
    // SAFETY: releases the reference taken above, once.
    unsafe { rd::rd_kafka_queue_destroy(queue) };
    sample
}

/// Writes `records` into a fresh RocksDB in `dir`: batches of 10,000, the
/// write-ahead log off, one flush at the end.
fn bare_write(records: &Records, dir: &Path) -> Sample {
    let _ = std::fs::remove_dir_all(dir);
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    let db = rocksdb::DB::open(&options, dir).unwrap();
    let (started, cpu) = (Instant::now(), own_cpu_seconds());
    let mut unlogged = rocksdb::WriteOptions::default();
    unlogged.disable_wal(true);
    let mut sample = Sample::default();
    let mut batch = rocksdb::WriteBatch::default();
    for (key, value) in records.iter() {
        match value {
            Some(value) => batch.put(key, value),
            None => batch.delete(key),
        }
        if batch.len() == BATCH {
            sample.records += batch.len() as u64;
            db.write_opt(std::mem::take(&mut batch), &unlogged).unwrap();
        }
    }
    sample.records += batch.len() as u64;
    db.write_opt(batch, &unlogged).unwrap();
    db.flush().unwrap();
    sample.bytes = records.data.len() as u64;
    sample.seconds = started.elapsed().as_secs_f64();
    sample.cpu_seconds = own_cpu_seconds() - cpu;
    sample
}

/// Loads `records` into a fresh store in `dir` by Tally's bulk load, one
/// checkpoint at the end, to its finish.
fn bare_load(records: &Records, dir: &Path) -> Sample {
    use tally_core::state::StateStore;
    let _ = std::fs::remove_dir_all(dir);
    let store = tally_state_rocks::RocksStore::open(dir).unwrap();
    let (started, cpu) = (Instant::now(), own_cpu_seconds());
    let mut load = store.bulk_load();
    for (key, value) in records.iter() {
        load.state(key, value);
    }
    load.checkpoint(&[(b"bench".to_vec(), b"end".to_vec())]).unwrap();
    load.finish().unwrap();
    let mut sample = Sample {
        records: records.lengths.len() as u64,
        bytes: records.data.len() as u64,
        ..Sample::default()
    };
    sample.seconds = started.elapsed().as_secs_f64();
    sample.cpu_seconds = own_cpu_seconds() - cpu;
    sample
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 { values[middle] } else { (values[middle - 1] + values[middle]) / 2.0 }
}

/// Median figures of one contender.
struct Figures {
    seconds: f64,
    records: u64,
    bytes: u64,
    cpu_seconds: f64,
}

impl Figures {
    fn of(samples: &[Sample]) -> Figures {
        Figures {
            seconds: median(samples.iter().map(|s| s.seconds).collect()),
            records: samples.iter().map(|s| s.records).max().unwrap_or(0),
            bytes: samples.iter().map(|s| s.bytes).max().unwrap_or(0),
            cpu_seconds: median(samples.iter().map(|s| s.cpu_seconds).collect()),
        }
    }

    fn rate(&self) -> f64 {
        self.records as f64 / self.seconds.max(1e-9)
    }
}

fn bench(keys: usize, rounds: usize, dir: &Path, peer_script: &Path) {
    let job = KafkaBillingJob::create("bench-restore", PARTITIONS);
    let producing = Instant::now();
    produce_usage(&job.input, &distinct_key_lines(keys, 1), PARTITIONS);
    // A state directory (and job file) per size: each size is a job of its own.
    let state = dir.join(format!("tally-state-{keys}"));
    let job_file = job.write_job_file(dir, plugins::USAGE_BILLING, &state, "", "");
    // The same job and state directory (one member of the group), fetching
    // from the leaders itself (opt-in).
    let leaders_dir = dir.join(format!("leaders-{keys}"));
    std::fs::create_dir_all(&leaders_dir).unwrap();
    let leaders_job_file = job.write_job_file_with_kafka(
        &leaders_dir,
        plugins::USAGE_BILLING,
        &state,
        "",
        "restore_fetch = \"leaders\"",
        "",
    );
    let building = Instant::now();
    run_tally(&job_file, &dir.join("tally-build.log"), None);
    let tally_built = building.elapsed();
    let peer = Peer {
        script: peer_script.to_path_buf(),
        input: job.input.clone(),
        output: format!("{}-peer-totals", job.name),
        app_id: format!("{}-peer", job.name),
        state: dir.join(format!("peer-state-{keys}")),
    };
    tally_tests::kafka::create_topic(&peer.output, PARTITIONS);
    let building = Instant::now();
    peer.run("process", &["--expect", &keys.to_string()]);
    let peer_built = building.elapsed();
    let changelog = format!("tally-{}-state-changelog", job.name);
    let mut records = Records::default();
    bare_read(&changelog, Some(&mut records));
    println!(
        "\n{keys} distinct keys: produced in {:.1?}; changelogs written by tally in {tally_built:.1?}, by kafka streams in {peer_built:.1?}",
        producing.elapsed() - tally_built - peer_built
    );

    let names = ["tally", "tally leaders", "kafka streams", "bare read", "bare write", "bare load"];
    let mut samples: [Vec<Sample>; 6] = Default::default();
    for round in 1..=rounds {
        let round_samples = [
            tally_restore(&job_file, &state, &dir.join("tally-restore.log"), true),
            tally_restore(&leaders_job_file, &state, &dir.join("tally-leaders-restore.log"), false),
            peer.restore(),
            bare_read(&changelog, None),
            bare_write(&records, &dir.join("bare-rocksdb")),
            bare_load(&records, &dir.join("bare-load")),
        ];
        let line: Vec<String> = names
            .iter()
            .zip(&round_samples)
            .map(|(name, s)| {
                format!("{name} {:.3} s ({:.0} k/s)", s.seconds, s.records as f64 / s.seconds / 1e3)
            })
            .collect();
        println!("  round {round}: {}", line.join(", "));
        for (all, sample) in samples.iter_mut().zip(round_samples) {
            all.push(sample);
        }
    }
    let figures: Vec<Figures> = samples.iter().map(|samples| Figures::of(samples)).collect();
    println!(
        "  median of {rounds} | records | bytes/record | seconds | records/s | MB/s | CPU s | CPU µs/record"
    );
    for (name, f) in names.iter().zip(&figures) {
        let per_record = if f.records == 0 { 0.0 } else { f.bytes as f64 / f.records as f64 };
        println!(
            "  {name:<14} | {} | {per_record:.0} | {:.3} | {:.0} | {:.1} | {:.2} | {:.2}",
            f.records,
            f.seconds,
            f.rate(),
            f.bytes as f64 / f.seconds.max(1e-9) / 1e6,
            f.cpu_seconds,
            f.cpu_seconds / f.records.max(1) as f64 * 1e6
        );
    }
    let (tally, leaders, streams, read, write, load) =
        (&figures[0], &figures[1], &figures[2], &figures[3], &figures[4], &figures[5]);
    println!(
        "  ratios (records/s): tally / kafka streams {:.2}x, tally leaders / tally {:.2}x, tally / bare read {:.2}, tally / bare write {:.2}, \
         tally / bare load {:.2}",
        tally.rate() / streams.rate(),
        leaders.rate() / tally.rate(),
        tally.rate() / read.rate(),
        tally.rate() / write.rate(),
        tally.rate() / load.rate()
    );
    delete_topics_starting_with(&peer.app_id);
    delete_topics(&[&peer.output]);
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return; // `cargo test --benches` asks benches to list their tests
    }
    let sizes: Vec<usize> = std::env::var("TALLY_BENCH_RESTORE_KEYS")
        .unwrap_or_else(|_| "200000,1000000,3000000".into())
        .split(',')
        .map(|size| size.trim().parse().expect("TALLY_BENCH_RESTORE_KEYS holds numbers"))
        .collect();
    let rounds: usize =
        std::env::var("TALLY_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).max(1);
    let peer_script = Path::new(env!("CARGO_MANIFEST_DIR")).join("restore-peer/run");
    let dir = tempfile::tempdir_in(
        std::env::var("TALLY_BENCH_DIR")
            .unwrap_or_else(|_| std::env::temp_dir().display().to_string()),
    )
    .expect("creating the bench directory");
    println!(
        "restore on {}: the billing job, {PARTITIONS} partitions, one event per key; {rounds} rounds; wall: monotonic clock, CPU: each process's own",
        bootstrap()
    );
    for keys in sizes {
        bench(keys, rounds, dir.path(), &peer_script);
    }
}
