//! CPU an idle Kafka job's producer uses: Tally's `JobProducer` (its own
//! delivery-report thread, polling in windows of 10 ms and 50 µs) beside
//! rust-rdkafka's `ThreadedProducer` (polling in steps of 100 ms), each
//! alone in this process for the same wall time, alternated. Nothing
//! listens at their broker address (loopback), so neither has work: what
//! they use is what waiting costs. A delivery thread that spun through the
//! fraction of a millisecond left of each window used 50-100 ms of CPU a
//! second here; waiting uses a few. Clock: this process's CPU time
//! (getrusage), librdkafka's own threads included for both.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::producer::{DefaultProducerContext, ThreadedProducer};
use tally_kafka::committer::{DeliveryTracker, JobProducer};

/// CPU seconds this process has used (every thread).
fn own_cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage only writes the struct it is given.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0, "getrusage failed");
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// CPU milliseconds per wall second while `client` (made by `make`) idles.
fn idle_cpu_ms_per_second<T>(make: impl FnOnce() -> T, wall: Duration) -> f64 {
    let client = make();
    // Past the client's start-up.
    std::thread::sleep(Duration::from_millis(200));
    let before = own_cpu_seconds();
    std::thread::sleep(wall);
    let used = own_cpu_seconds() - before;
    drop(client);
    used * 1000.0 / wall.as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let rounds: usize =
        std::env::var("TALLY_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let wall = Duration::from_secs(2);
    let mut config = ClientConfig::new();
    // Nothing listens there: the producers stay idle (loopback only).
    config.set("bootstrap.servers", "127.0.0.1:1").set("log_level", "0");
    let (mut tally, mut threaded) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        tally.push(idle_cpu_ms_per_second(
            || {
                JobProducer::from_config_and_context(
                    &config,
                    DeliveryTracker::new("changelog".into()),
                )
                .unwrap()
            },
            wall,
        ));
        threaded.push(idle_cpu_ms_per_second(
            || -> ThreadedProducer<DefaultProducerContext> { config.create().unwrap() },
            wall,
        ));
    }
    let (tally, threaded) = (median(tally), median(threaded));
    println!(
        "idle producer, CPU ms per wall second (median of {rounds} rounds of {wall:?}, getrusage of this process):"
    );
    println!("  tally JobProducer (10.05 ms poll windows):      {tally:6.1}");
    println!("  rust-rdkafka ThreadedProducer (100 ms steps):   {threaded:6.1}");
    println!("  ratio tally / threaded:                         {:6.2}", tally / threaded);
}
