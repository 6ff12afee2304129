//! Helpers shared by Tally's end-to-end tests and benchmarks: usage events
//! with independently known totals, job files, and the `tally` binary.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub mod components;
pub mod kafka;
pub mod native;
pub mod periods;
pub mod receiver;
pub mod serve;

/// The billing key: (customer, metric, period).
pub type BillingKey = (String, String, String);

/// A small deterministic random number generator (SplitMix64), so every
/// test run sees the same events for the same seed.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// One generated input line and what it should do.
#[derive(Debug, Clone)]
pub struct UsageLine {
    /// The NDJSON line.
    pub line: String,
    /// The key and quantity it adds, or `None` if it must be dead-lettered.
    pub effect: Option<(BillingKey, u64)>,
}

/// `count` valid usage lines, one per billing key: customers `c0000000`,
/// `c0000001`, …, each adding `quantity` to `api_calls` in 2026-11. The
/// input of restore tests and benchmarks: one changelog record per line.
pub fn distinct_key_lines(count: usize, quantity: u64) -> Vec<UsageLine> {
    (0..count)
        .map(|index| {
            let customer = format!("c{index:07}");
            let line = format!(r#"{{"customer":"{customer}","metric":"api_calls","quantity":{quantity},"ts":"2026-11-15T12:00:00Z"}}"#);
            UsageLine { line, effect: Some(((customer, "api_calls".to_string(), "2026-11".to_string()), quantity)) }
        })
        .collect()
}

/// Generates `count` usage lines. About `bad_per_mille`/1000 of them are bad
/// in one of the ways the plugin must reject. Timestamps straddle the
/// October/November and November/December month ends, some with UTC
/// offsets that move them across the boundary; the expected period of each
/// is known by construction, not by parsing.
pub fn usage_lines(seed: u64, count: usize, bad_per_mille: u64) -> Vec<UsageLine> {
    const CUSTOMERS: &[&str] =
        &["acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka"];
    const METRICS: &[&str] = &["api_calls", "storage_gb_hours", "egress_mb"];
    // (timestamp, billing period it falls in once converted to UTC)
    const TIMES: &[(&str, &str)] = &[
        ("2026-10-31T23:59:59Z", "2026-10"),
        ("2026-11-01T00:00:00Z", "2026-11"),
        ("2026-11-01T00:30:00+01:00", "2026-10"),
        ("2026-10-31T20:00:00-05:00", "2026-11"),
        ("2026-11-15T12:00:00.250Z", "2026-11"),
        ("2026-11-30T23:59:59Z", "2026-11"),
        ("2026-12-01T00:00:00Z", "2026-12"),
        ("2026-11-30T22:00:00-03:00", "2026-12"),
    ];
    let mut rng = Rng::new(seed);
    (0..count)
        .map(|_| {
            let customer = CUSTOMERS[rng.below(CUSTOMERS.len() as u64) as usize];
            let metric = METRICS[rng.below(METRICS.len() as u64) as usize];
            let (ts, period) = TIMES[rng.below(TIMES.len() as u64) as usize];
            let quantity = rng.below(1000);
            if rng.below(1000) < bad_per_mille {
                let line = match rng.below(6) {
                    0 => format!(r#"{{"customer":"{customer}","metric":"{metric}","quantity":{quantity},"ts":"{ts}""#),
                    1 => format!(r#"{{"metric":"{metric}","quantity":{quantity},"ts":"{ts}"}}"#),
                    2 => format!(r#"{{"customer":"{customer}","metric":"{metric}","quantity":-{},"ts":"{ts}"}}"#, quantity + 1),
                    3 => format!(r#"{{"customer":"{customer}","metric":"{metric}","quantity":{quantity}.5,"ts":"{ts}"}}"#),
                    4 => format!(r#"{{"customer":"{customer}","metric":"{metric}","quantity":{quantity},"ts":"yesterday"}}"#),
                    _ => "not json at all".to_string(),
                };
                UsageLine { line, effect: None }
            } else {
                let line = format!(r#"{{"customer":"{customer}","metric":"{metric}","quantity":{quantity},"ts":"{ts}"}}"#);
                let key = (customer.to_string(), metric.to_string(), period.to_string());
                UsageLine { line, effect: Some((key, quantity)) }
            }
        })
        .collect()
}

/// The number in environment variable `name`, or `default` (the
/// benchmarks' sizes).
pub fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// CPU time (user + system) this process has used so far, from /proc
/// (the benchmarks' clock).
pub fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("reading /proc/self/stat");
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th overall.
    let fields: Vec<&str> =
        stat[stat.rfind(')').expect("stat has a command name") + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0 // USER_HZ is 100 on Linux
}

/// The lines, each with an event id of its own.
pub fn with_event_ids(lines: Vec<UsageLine>) -> Vec<UsageLine> {
    lines
        .into_iter()
        .enumerate()
        .map(|(n, mut line)| {
            line.line = line.line.replacen('{', &format!("{{\"id\":\"evt-{n:09}\","), 1);
            line
        })
        .collect()
}

/// Writes `lines` into `files` NDJSON files, each customer's into one (a
/// period job's partitions are keyed by customer, as Kafka producers key
/// usage); returns the paths.
pub fn write_partitions_by_customer(
    dir: &Path,
    lines: &[UsageLine],
    files: usize,
) -> Vec<std::path::PathBuf> {
    let mut texts = vec![String::new(); files];
    for line in lines {
        let customer =
            line.line.split("\"customer\":\"").nth(1).unwrap().split('"').next().unwrap();
        let file = customer.bytes().map(usize::from).sum::<usize>() % files;
        texts[file].push_str(&line.line);
        texts[file].push('\n');
    }
    texts
        .into_iter()
        .enumerate()
        .map(|(index, text)| {
            let path = dir.join(format!("usage-{index}.ndjson"));
            std::fs::write(&path, text).unwrap();
            path
        })
        .collect()
}

/// Writes `lines` split round-robin into `files` NDJSON files in `dir`;
/// returns the paths and, per file, its lines.
pub fn write_partitions(
    dir: &Path,
    lines: &[UsageLine],
    files: usize,
) -> (Vec<PathBuf>, Vec<Vec<UsageLine>>) {
    let mut partitions: Vec<Vec<UsageLine>> = vec![Vec::new(); files];
    for (index, line) in lines.iter().enumerate() {
        partitions[index % files].push(line.clone());
    }
    let paths = partitions
        .iter()
        .enumerate()
        .map(|(index, lines)| {
            let path = dir.join(format!("usage-{index}.ndjson"));
            let mut text = String::new();
            for line in lines {
                writeln!(text, "{}", line.line).unwrap();
            }
            std::fs::write(&path, text).unwrap();
            path
        })
        .collect();
    (paths, partitions)
}

/// The totals the lines must add up to.
pub fn expected_totals<'a>(
    lines: impl IntoIterator<Item = &'a UsageLine>,
) -> BTreeMap<BillingKey, u64> {
    let mut totals = BTreeMap::new();
    for (key, quantity) in lines.into_iter().filter_map(|line| line.effect.clone()) {
        *totals.entry(key).or_insert(0) += quantity;
    }
    totals
}

/// Writes a local-mode job file for the billing plugin.
pub fn write_billing_job(dir: &Path, plugin: &str, inputs: &[PathBuf], extra: &str) -> PathBuf {
    let inputs: Vec<String> =
        inputs.iter().map(|p| format!("{:?}", p.display().to_string())).collect();
    let job = format!(
        "name = \"billing\"\nplugin = {plugin:?}\noutputs = [\"totals\"]\n{extra}\n[local]\ninputs = [{}]\noutput_dir = \"out\"\nstate_dir = \"state\"\n",
        inputs.join(", ")
    );
    let path = dir.join("billing.toml");
    std::fs::write(&path, job).unwrap();
    path
}

/// The `tally` binary of this build (`cargo build --release` puts it next
/// to the test binaries' `deps/` directory).
pub fn tally_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir =
        exe.parent().and_then(Path::parent).expect("test binaries live in <target>/<profile>/deps");
    let binary = profile_dir.join("tally");
    assert!(
        binary.exists(),
        "`{}` is missing: build it first with `cargo build --release -p tally-host` (scripts/test does)",
        binary.display()
    );
    binary
}

/// Starts `tally run <args> <job_file>`, its log (`RUST_LOG=info`) written
/// to `log_path`.
pub fn spawn_run_logging_to(
    args: &[&str],
    job_file: &Path,
    log_path: &Path,
) -> std::process::Child {
    std::process::Command::new(tally_binary())
        .arg("run")
        .args(args)
        .arg(job_file)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log_path).unwrap())
        .spawn()
        .unwrap()
}

/// Runs `tally run <job>` until a run finishes, SIGKILLing runs at random
/// moments until `kills` have landed: each killed run is let grow
/// `watched` (an output file) first, then killed up to `max_pause_ms`
/// later, so the kills land mid-run and spread over the input (each run
/// resumes where the last committed). Returns the kills that landed.
pub fn run_killing(
    job: &Path,
    cache_dir: &Path,
    watched: &Path,
    kills: u32,
    max_pause_ms: u64,
    rng: &mut Rng,
) -> u32 {
    use std::time::{Duration, Instant};
    let file_len = |path: &Path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut landed = 0;
    for runs in 0.. {
        assert!(runs < 200, "the job never finished");
        let mut child = std::process::Command::new(tally_binary())
            .arg("run")
            .arg(job)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .env("RUST_LOG", "warn")
            .env("TALLY_CACHE_DIR", cache_dir)
            .spawn()
            .unwrap();
        if landed < kills {
            let size_at_start = file_len(watched);
            let deadline = Instant::now() + Duration::from_secs(60);
            // Recovery may first cut the file; wait for it to pass its old size.
            while file_len(watched) <= size_at_start && child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "tally made no progress");
                std::thread::sleep(Duration::from_millis(2));
            }
            std::thread::sleep(Duration::from_millis(rng.below(max_pause_ms)));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                landed += 1;
                continue;
            }
        }
        let status = child.wait().unwrap();
        assert!(status.success(), "the final run failed: {status}");
        break;
    }
    landed
}

/// One line of the `totals` output, as the tests read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TotalLine {
    /// The billing key.
    pub key: BillingKey,
    /// The running total after this update.
    pub total: u64,
    /// Source partition (file name) and offset (line number).
    pub source: (String, u64),
    /// The idempotency key.
    pub idempotency_key: String,
}

/// Reads the `totals` output file.
pub fn read_totals(path: &Path) -> Vec<TotalLine> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("bad output line {line:?}: {e}"));
            let key = &v["key"];
            TotalLine {
                key: (
                    key["customer"].as_str().unwrap().to_string(),
                    key["metric"].as_str().unwrap().to_string(),
                    key["period"].as_str().unwrap().to_string(),
                ),
                total: v["value"].as_u64().unwrap(),
                source: (
                    v["source"]["partition"].as_str().unwrap().to_string(),
                    v["source"]["offset"].as_u64().unwrap(),
                ),
                idempotency_key: v["idempotency_key"].as_str().unwrap().to_string(),
            }
        })
        .collect()
}

/// Reads the dead-letter output: (source partition, offset, reason).
pub fn read_dead_letters(path: &Path) -> Vec<(String, u64, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            (
                v["source"]["partition"].as_str().unwrap().to_string(),
                v["source"]["offset"].as_u64().unwrap(),
                v["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The last total per key in the output, which must equal the expected totals.
pub fn final_totals(lines: &[TotalLine]) -> BTreeMap<BillingKey, u64> {
    lines.iter().map(|line| (line.key.clone(), line.total)).collect()
}

/// What the `tally` binary printed about its run.
pub struct JobReport {
    pub records: u64,
    pub applied: u64,
    pub outputs: u64,
    pub commits: u64,
    pub rate: f64,
}

/// Parses `job `name`: N records (A applied, D dead-lettered), O outputs, C
/// commits in S.SSs (R records/s)`.
pub fn parse_job_report(stdout: &str) -> Option<JobReport> {
    let line =
        stdout.lines().find(|line| line.starts_with("job `") && line.contains(" records/s)"))?;
    let after_name = &line[line.find("`: ")? + 3..];
    let number_before = |word: &str| -> Option<f64> {
        let end = after_name.find(word)?;
        let start = after_name[..end]
            .rfind(|c: char| !(c.is_ascii_digit() || c == '.'))
            .map_or(0, |i| i + 1);
        after_name[start..end].parse().ok()
    };
    Some(JobReport {
        records: number_before(" records (")? as u64,
        applied: number_before(" applied")? as u64,
        outputs: number_before(" outputs")? as u64,
        commits: number_before(" commits")? as u64,
        rate: number_before(" records/s)")?,
    })
}
