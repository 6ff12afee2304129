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

pub(crate) fn log_tail(dir: &std::path::Path, run: u32) -> String {
    let log = std::fs::read_to_string(dir.join(format!("run-{run}.log"))).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Runs the job of `job_file` to its end, SIGKILLing `kills` runs at random
/// moments after each has committed something (or, with all the input
/// committed, after five quiet seconds); returns how many runs it took.
pub(crate) fn run_with_kills(
    job: &KafkaBillingJob,
    job_file: &std::path::Path,
    dir: &std::path::Path,
    kills: u32,
    rng: &mut Rng,
) -> u32 {
    let group = group_reader(&format!("tally-{}", job.name));
    let mut killed = 0;
    let mut runs = 0;
    loop {
        runs += 1;
        assert!(runs < 100, "the job never finished");
        // A run to be killed does not stop when caught up: a job that
        // outran its observer (a loaded machine slows the committed-offset
        // queries) could otherwise finish before its kills landed. Only the
        // last run stops at the end of the input.
        let to_kill = killed < kills;
        let args: &[&str] = if to_kill { &["run"] } else { &["run", "--until-caught-up"] };
        let mut child = Command::new(tally_binary())
            .args(args)
            .arg(job_file)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("run-{runs}.log"))).unwrap())
            .env("RUST_LOG", "info")
            .spawn()
            .unwrap();
        if to_kill {
            // Wait until this run has committed something (or, once all the
            // input is committed, has run quietly a while), then kill it a
            // random moment later: mid-transaction, mid-commit, or between.
            let at_start = committed_progress(&group, &job.input, job.partitions);
            let started = Instant::now();
            while committed_progress(&group, &job.input, job.partitions) <= at_start
                && child.try_wait().unwrap().is_none()
                && started.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(rng.below(80)));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                killed += 1;
                continue;
            }
            // Without --until-caught-up, a run ends on its own only by failing.
            let status = child.wait().unwrap();
            panic!("a run failed: {status}: {}", log_tail(dir, runs));
        }
        let status = child.wait().unwrap();
        assert!(status.success(), "the final run failed: {status}: {}", log_tail(dir, runs));
        break;
    }
    assert!(killed >= kills, "only {killed} kills landed mid-run");
    runs
}

fn seed() -> u64 {
    let seed =
        std::env::var("TALLY_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
                as u64
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
    let job_file = job.write_job_file(
        dir.path(),
        USAGE_BILLING,
        &dir.path().join("state"),
        "commit_interval_ms = 5\nbatch_size = 8",
        "",
    );
    let runs = run_with_kills(&job, &job_file, dir.path(), KILLS, &mut rng);

    let totals = read_topic(&job.totals, true);
    let dead = read_topic(&job.dead_letters, true);
    let verdict = check(&job.input, &lines, &placed, &totals, &dead);
    assert_eq!(
        (verdict.missing, verdict.doubled),
        (0, 0),
        "every input offset must contribute exactly once"
    );
    assert_eq!(verdict.totals, expected_totals(&lines));
    // The aborted transactions of the killed runs did reach the topic: a
    // read_uncommitted reader sees more than the committed outputs.
    let uncommitted = read_topic(&job.totals, false);
    assert!(uncommitted.len() > totals.len(), "the kills should have left aborted records behind");
    println!(
        "{KILLS} kills over {runs} runs; {} committed totals, {} records in the log",
        totals.len(),
        uncommitted.len()
    );
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
    assert!(
        totals.len() * 2 < applied,
        "{} totals for {applied} applied events: updates were not folded per key",
        totals.len()
    );
    // Dead letters are never folded: each rejected input exactly once.
    let dead: Vec<(String, i32, i64)> =
        read_topic(&job.dead_letters, true).iter().map(OutputRecord::source).collect();
    let distinct: std::collections::BTreeSet<&(String, i32, i64)> = dead.iter().collect();
    assert_eq!((dead.len(), distinct.len()), (lines.len() - applied, lines.len() - applied));
    println!(
        "{} kills over {runs} runs; {} committed totals for {applied} applied events",
        KILLS / 4,
        totals.len()
    );
}

/// Whether `log` (a `tally run` log file) holds `text` yet.
fn log_has(log: &std::path::Path, text: &str) -> bool {
    std::fs::read_to_string(log).is_ok_and(|log| log.contains(text))
}

/// The offsets left when each restore in `log` began (its start line's `to_go`).
fn restore_starts(log: &std::path::Path) -> Vec<u64> {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    log.lines()
        .filter(|line| line.contains("restoring state from the changelog: (partition, from, end)"))
        .filter_map(|line| line.split("to_go=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect()
}

#[test]
fn killed_while_restoring_a_kafka_job_resumes_from_its_last_checkpoint_and_counts_exactly_once() {
    const KEYS: usize = 300_000;
    const KILLS_WHILE_RESTORING: u32 = 3;
    let _serial = serial();
    let seed = seed();
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let job = KafkaBillingJob::create("restore-crash", PARTITIONS);
    let state = dir.path().join("state");
    // Checkpoints every 256 KiB (about 3,500 records) instead of 64 MiB:
    // many of them within a restore short enough for a test.
    let job_file = job.write_job_file_with_kafka(
        dir.path(),
        USAGE_BILLING,
        &state,
        "",
        "restore_checkpoint_bytes = 262144",
        "",
    );
    // Its RocksDB (the state directory keeps its instance id, so the next
    // run is the same group member and takes its partitions back at once).
    let db = state.join("db");
    let run = |log: &std::path::Path| {
        Command::new(tally_binary())
            .args(["run", "--until-caught-up"])
            .arg(&job_file)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .env("RUST_LOG", "info")
            .spawn()
            .unwrap()
    };

    // One event per key: a changelog of KEYS state records.
    let mut lines = distinct_key_lines(KEYS, 1);
    let mut placed = produce_usage(&job.input, &lines, job.partitions);
    let first = dir.path().join("run-0.log");
    assert!(
        run(&first).wait().unwrap().success(),
        "the first run failed: {}",
        log_tail(dir.path(), 0)
    );

    // A wiped disk: the local state is gone and is rebuilt from the
    // changelog before any of the new events counts.
    std::fs::remove_dir_all(&db).unwrap();
    let again = distinct_key_lines(KEYS / 10, 2);
    placed.extend(produce_usage(&job.input, &again, job.partitions));
    lines.extend(again);

    let mut killed_while_restoring = 0;
    let mut runs = 0;
    let mut starts = Vec::new();
    loop {
        runs += 1;
        assert!(runs < 20, "the job never finished");
        let log = dir.path().join(format!("run-{runs}.log"));
        let mut child = run(&log);
        if killed_while_restoring < KILLS_WHILE_RESTORING {
            // Kill it a random moment after a checkpoint landed, while it
            // still restores.
            let deadline = Instant::now() + Duration::from_secs(60);
            while !log_has(&log, "restore checkpoint")
                && !log_has(&log, "restored state from the changelog")
                && child.try_wait().unwrap().is_none()
            {
                assert!(
                    Instant::now() < deadline,
                    "the restore made no checkpoint: {}",
                    log_tail(dir.path(), runs)
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            std::thread::sleep(Duration::from_millis(rng.below(20)));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                starts.extend(restore_starts(&log));
                if !log_has(&log, "restored state from the changelog") {
                    killed_while_restoring += 1;
                    continue;
                }
                // The restore ended first: wipe the state and try again.
                std::fs::remove_dir_all(&db).unwrap();
                continue;
            }
        }
        let status = child.wait().unwrap();
        assert!(status.success(), "the final run failed: {status}: {}", log_tail(dir.path(), runs));
        starts.extend(restore_starts(&log));
        break;
    }
    assert_eq!(
        killed_while_restoring, KILLS_WHILE_RESTORING,
        "the kills should land while the job restores"
    );
    // Each run after a kill began where the last checkpoint left off.
    assert!(starts.len() > KILLS_WHILE_RESTORING as usize, "every run restores: {starts:?}");
    let resumed = starts.windows(2).filter(|pair| pair[1] < pair[0]).count();
    assert!(
        resumed >= KILLS_WHILE_RESTORING as usize,
        "runs after a kill mid-restore resume from a checkpoint: offsets to go {starts:?}"
    );

    let totals = read_topic(&job.totals, true);
    let dead = read_topic(&job.dead_letters, true);
    // Every total adds exactly its own event to what its key had: a key
    // the restore lost or doubled would break it.
    let verdict = check(&job.input, &lines, &placed, &totals, &dead);
    assert_eq!(
        (verdict.missing, verdict.doubled),
        (0, 0),
        "every input offset must contribute exactly once"
    );
    assert_eq!(verdict.totals, expected_totals(&lines));
    println!(
        "{killed_while_restoring} kills while restoring over {runs} runs; restores began with offsets to go {starts:?}"
    );
}
