//! The Kafka crash loop: `tally run` SIGKILLed at random moments while it
//! works through a partitioned topic, restarted each time; an independent
//! checker reading the outputs `read_committed` finds every input offset
//! counted exactly once.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tally_tests::kafka::*;
use tally_tests::*;

use crate::plugins::USAGE_BILLING;

const EVENTS: usize = 200_000;
const PARTITIONS: i32 = 4;
const KILLS: u32 = 20;

fn log_tail(dir: &std::path::Path, run: u32) -> String {
    let log = std::fs::read_to_string(dir.join(format!("run-{run}.log"))).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Runs the job of `job_file` to its end, SIGKILLing `kills` runs at random
/// moments after each has committed something; returns how many runs it took.
fn run_with_kills(job: &KafkaBillingJob, job_file: &std::path::Path, dir: &std::path::Path, kills: u32, rng: &mut Rng) -> u32 {
    let group = group_reader(&format!("tally-{}", job.name));
    let mut killed = 0;
    let mut runs = 0;
    loop {
        runs += 1;
        assert!(runs < 100, "the job never finished");
        let mut child = Command::new(tally_binary())
            .args(["run", "--until-caught-up"])
            .arg(job_file)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("run-{runs}.log"))).unwrap())
            .env("RUST_LOG", "info")
            .spawn()
            .unwrap();
        if killed < kills {
            // Wait until this run has committed something, then kill it a
            // random moment later: mid-transaction, mid-commit, or between.
            let at_start = committed_progress(&group, &job.input, job.partitions);
            let deadline = Instant::now() + Duration::from_secs(60);
            while committed_progress(&group, &job.input, job.partitions) <= at_start && child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "tally made no progress: {}", log_tail(dir, runs));
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(rng.below(80)));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                killed += 1;
                continue;
            }
        }
        let status = child.wait().unwrap();
        assert!(status.success(), "the final run failed: {status}: {}", log_tail(dir, runs));
        break;
    }
    assert!(killed >= kills, "only {killed} kills landed mid-run");
    runs
}

fn seed() -> u64 {
    let seed = std::env::var("TALLY_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("Kafka crash test seed: {seed} (set TALLY_CRASH_SEED to replay)");
    seed
}

#[test]
fn killed_at_random_moments_a_kafka_job_still_counts_every_event_exactly_once() {
    let _serial = serial();
    let seed = seed();
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("crash", PARTITIONS);
    let lines = usage_lines(seed, EVENTS, 10);
    let placed = produce_usage(&job.input, &lines, job.partitions);
    // Small batches and frequent commits: many transaction boundaries for
    // the kills to land between (and inside).
    let job_file =
        job.write_job_file(dir.path(), USAGE_BILLING, &dir.path().join("state"), "commit_interval_ms = 5\nbatch_size = 8", "");
    let runs = run_with_kills(&job, &job_file, dir.path(), KILLS, &mut rng);

    let totals = read_topic(&job.totals, true);
    let dead = read_topic(&job.dead_letters, true);
    let verdict = check(&job.input, &lines, &placed, &totals, &dead);
    assert_eq!((verdict.missing, verdict.doubled), (0, 0), "every input offset must contribute exactly once");
    assert_eq!(verdict.totals, expected_totals(&lines));
    // The aborted transactions of the killed runs did reach the topic: a
    // read_uncommitted reader sees more than the committed outputs.
    let uncommitted = read_topic(&job.totals, false);
    assert!(uncommitted.len() > totals.len(), "the kills should have left aborted records behind");
    println!("{KILLS} kills over {runs} runs; {} committed totals, {} records in the log", totals.len(), uncommitted.len());
}

#[test]
fn killed_at_random_moments_a_job_writing_latest_totals_still_counts_every_event_once() {
    let _serial = serial();
    let seed = seed();
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("crash-latest", PARTITIONS);
    let lines = usage_lines(seed, EVENTS / 2, 10);
    let placed = produce_usage(&job.input, &lines, job.partitions);
    let job_file = job.write_job_file(
        dir.path(),
        USAGE_BILLING,
        &dir.path().join("state"),
        "emit = { totals = \"latest_per_key\" }\ncommit_interval_ms = 20\nbatch_size = 8",
        "",
    );
    let runs = run_with_kills(&job, &job_file, dir.path(), KILLS / 4, &mut rng);

    let totals = read_topic(&job.totals, true);
    assert_eq!(check_latest(&job.input, &lines, &placed, &totals), expected_totals(&lines));
    let applied = lines.iter().filter(|line| line.effect.is_some()).count();
    // A commit holds many batches of 8 events, over at most 72 keys.
    assert!(totals.len() * 2 < applied, "{} totals for {applied} applied events: updates were not folded per key", totals.len());
    // Dead letters are never folded: each rejected input exactly once.
    let dead: Vec<(String, i32, i64)> = read_topic(&job.dead_letters, true).iter().map(OutputRecord::source).collect();
    let distinct: std::collections::BTreeSet<&(String, i32, i64)> = dead.iter().collect();
    assert_eq!((dead.len(), distinct.len()), (lines.len() - applied, lines.len() - applied));
    println!("{} kills over {runs} runs; {} committed totals for {applied} applied events", KILLS / 4, totals.len());
}
