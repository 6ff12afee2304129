//! Kafka mode under group changes and failures, with input arriving all
//! the while: a paused "zombie" instance, a scale-out and scale-in, and a
//! broker restart. Each ends with the independent checker.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use tally_tests::kafka::*;
use tally_tests::*;

use crate::plugins::USAGE_BILLING;

const PARTITIONS: i32 = 4;
/// The broker's smallest allowed session: a paused or departed instance
/// loses its partitions this long after its last heartbeat.
const CLIENT: &str = "\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"1000\"";

/// One `tally run` process of a job, logging to a file.
struct Instance {
    child: Child,
    log: PathBuf,
}

impl Instance {
    fn start(dir: &Path, job: &KafkaBillingJob, name: &str) -> Instance {
        let job_file = job.write_job_file(dir, USAGE_BILLING, &dir.join(name), "", CLIENT);
        let log = dir.join(format!("{name}.log"));
        let log_file = std::fs::File::create(&log).unwrap();
        let child = Command::new(tally_binary())
            .arg("run")
            .arg(&job_file)
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .env("RUST_LOG", "info")
            .spawn()
            .unwrap();
        Instance { child, log }
    }

    fn signal(&self, signal: &str) {
        assert!(
            Command::new("kill")
                .args([signal, &self.child.id().to_string()])
                .status()
                .unwrap()
                .success()
        );
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn still_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// SIGTERM, then the exit must be clean.
    fn stop(mut self) -> String {
        self.signal("-TERM");
        let status = self.child.wait().unwrap();
        let log = self.log();
        assert!(status.success(), "tally exited with {status}: {}", tail(&log));
        log
    }
}

impl Drop for Instance {
    /// A failing test must not leave a `tally` running.
    fn drop(&mut self) {
        if self.still_running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The records an instance's closing summary line says it committed
/// (`job `name`: N records (...`).
fn summary_records(log: &str) -> u64 {
    let line = log
        .lines()
        .find(|line| line.starts_with("job `") && line.contains(" records ("))
        .unwrap_or_else(|| {
            panic!("the instance printed no summary line: {}", tail(log));
        });
    let after_name = &line[line.find("`: ").expect("a job name") + 3..];
    after_name[..after_name.find(' ').expect("a count")].parse().expect("a record count")
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(25)..].join("\n")
}

/// Waits until `done` holds, failing with `what` after `limit`.
fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Produces `count` events over about `seconds` seconds.
fn continuous_input(
    job: &KafkaBillingJob,
    seed: u64,
    count: usize,
    seconds: usize,
) -> (Vec<UsageLine>, InputFeed) {
    let lines = usage_lines(seed, count, 10);
    let feed = InputFeed::start(
        &job.input,
        lines.clone(),
        job.partitions,
        seconds * 4,
        Duration::from_millis(250),
    );
    (lines, feed)
}

#[test]
fn a_paused_zombie_is_fenced_and_its_work_never_becomes_visible() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("zombie", PARTITIONS);
    let group = group_reader(&format!("tally-{}", job.name));
    let (lines, producing) = continuous_input(&job, 21, 60_000, 30);

    let a = Instance::start(dir.path(), &job, "a");
    wait_for("instance a to commit", Duration::from_secs(60), || {
        committed_progress(&group, &job.input, PARTITIONS) > 0
    });
    a.signal("-STOP");
    let paused_at = committed_progress(&group, &job.input, PARTITIONS);

    // B takes the partitions once A's session expires, after A's open
    // transaction timed out (it restores past it), and goes on.
    let b = Instance::start(dir.path(), &job, "b");
    wait_for("instance b to take over", Duration::from_secs(90), || {
        committed_progress(&group, &job.input, PARTITIONS) > paused_at + 1_000
    });
    a.signal("-CONT");

    let placed = producing.finish();
    wait_for("all input to be committed", Duration::from_secs(120), || {
        committed_progress(&group, &job.input, PARTITIONS) == lines.len() as i64
    });
    let a_log = a.stop();
    b.stop();
    // A found out it had been replaced: its session failed (fenced) or its
    // partitions were taken away, and it rejoined.
    assert!(
        a_log.contains("Kafka session failed") || a_log.matches("partitions revoked").count() > 0,
        "the resumed zombie should have been fenced: {}",
        tail(&a_log)
    );
    assert_exactly_once(&job, &lines, &placed);
}

#[test]
fn partitions_and_their_state_move_when_instances_join_and_leave() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("rebalance", PARTITIONS);
    let group = group_reader(&format!("tally-{}", job.name));
    let (lines, producing) = continuous_input(&job, 22, 60_000, 25);

    let a = Instance::start(dir.path(), &job, "a");
    wait_for("instance a to commit", Duration::from_secs(60), || {
        committed_progress(&group, &job.input, PARTITIONS) > 0
    });
    let mut b = Instance::start(dir.path(), &job, "b");
    // B is given partitions A has worked on; their state reaches it through
    // the changelog.
    wait_for("instance b to restore its share", Duration::from_secs(60), || {
        b.log().lines().any(|line| {
            line.contains("restored state from the changelog") && !line.contains("records=0")
        })
    });
    let at_join = committed_progress(&group, &job.input, PARTITIONS);
    wait_for("both to make progress", Duration::from_secs(60), || {
        committed_progress(&group, &job.input, PARTITIONS) > at_join + 1_000
    });
    let a_log = a.stop();

    let placed = producing.finish();
    wait_for("all input to be committed", Duration::from_secs(120), || {
        committed_progress(&group, &job.input, PARTITIONS) == lines.len() as i64
    });
    assert!(b.still_running());
    let b_log = b.stop();
    let restores =
        b_log.lines().filter(|line| line.contains("restored state from the changelog")).count();
    assert!(
        restores >= 2,
        "b should restore when it joins and again when a leaves: {}",
        tail(&b_log)
    );
    // What a revocation aborted was redone by the new owner; each instance
    // counts only what it committed, so together they count every record once.
    assert_eq!(
        summary_records(&a_log) + summary_records(&b_log),
        lines.len() as u64,
        "records the two instances report"
    );
    assert_exactly_once(&job, &lines, &placed);
}

#[test]
fn the_job_rides_out_a_broker_crash_without_restarting() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("broker", PARTITIONS);
    let group = group_reader(&format!("tally-{}", job.name));
    let (lines, producing) = continuous_input(&job, 23, 60_000, 25);

    let mut instance = Instance::start(dir.path(), &job, "a");
    wait_for("the job to commit", Duration::from_secs(60), || {
        committed_progress(&group, &job.input, PARTITIONS) > 0
    });
    // The test's own input producer waits out the outage (an idempotent
    // producer caught mid-flight by a broker crash can stall); the job
    // must ride it out by itself.
    producing.hold();
    let (killed, said) = kafka_script(&["kill"]);
    assert!(killed, "{said}");
    std::thread::sleep(Duration::from_secs(2));
    let (started, said) = kafka_script(&["start"]);
    assert!(started, "{said}");
    producing.resume();

    let placed = producing.finish();
    wait_for(
        "all input to be committed after the broker restart",
        Duration::from_secs(180),
        || committed_progress(&group, &job.input, PARTITIONS) == lines.len() as i64,
    );
    assert!(instance.still_running(), "the host must recover by itself: {}", tail(&instance.log()));
    instance.stop();
    assert_exactly_once(&job, &lines, &placed);
}
