//! The delivery loop. The main thread reads the committed output from the
//! ledger's position, skips what the ledger says is settled, and hands
//! each record to one of `max_in_flight` lanes chosen by its key (so the
//! records of one key go in order, one at a time, and different keys in
//! parallel). A lane sends its record until it is delivered, refused for
//! good, or parked as `unknown` once the receiver may have applied it and
//! no longer remembers its key; a parked record holds back the later
//! records of its key until a lookup or an operator settles it. The
//! position moves past every settled record. See `docs/delivery.md`.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::BuildHasher;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::attempts::AttemptWriter;
use crate::dead_letters::{DeadLetter, DeadLetters};
use crate::http::{Attempt, HttpTarget, Lookup};
use crate::ledger::{Entry, Ledger, LedgerError, Mirror, Outcome, Stats};
use crate::record::OutputRecord;
use crate::resolve::{Resolution, Verdict};
use crate::settings::{DeliverSettings, HttpSettings, Target};
use crate::source::{Line, Positions, Source, SourceError};

/// Most records read and not yet settled (in flight, retrying, parked or
/// held behind a parked one).
const MAX_PENDING: usize = 4096;
/// How often the output, the resolutions and the position are looked at
/// when nothing else happens.
const POLL: Duration = Duration::from_millis(100);
/// How often settled entries past their retention are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// How often the main thread takes the lanes' reports while records are
/// in flight.
const REPORT_BATCH: Duration = Duration::from_millis(1);
/// Longest a lane sleeps before it looks at the stop flag again.
const SLEEP_STEP: Duration = Duration::from_millis(50);
/// Delivery latencies kept for the percentiles in the ledger's stats.
const LATENCY_SAMPLES: usize = 1024;
/// Most records a lane claims in one ledger write: before it sends a
/// record the ledger has no entry for, it writes the first attempt of the
/// next ones queued behind it too (each "may be applied" from then on: a
/// little early, which only shortens its re-send window).
const CLAIM_AHEAD: usize = 4;
/// A claim older than this when its record's turn comes (the lane was
/// busy retrying an earlier record) is written anew before the request.
const CLAIM_FRESH_MS: i64 = 100;

/// A delivery that cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum DeliverError {
    /// The committed output cannot be read.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The ledger cannot be read or written.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The dead-letter file cannot be written.
    #[error("cannot write the delivery's dead letters `{}`: {source}", path.display())]
    DeadLetters {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The PostgreSQL target cannot be used as configured.
    #[error("delivery to PostgreSQL: {0}")]
    Postgres(String),
    /// A record would be sent with a key already used for another body.
    #[error(
        "record {key:?} (partition {partition}, offset {offset}) was sent before with another body (SHA-256 {sent}, now {now}); \
         a key is never reused for another body: put `http.body` back as it was, or deliver to a new state_dir"
    )]
    BodyChanged {
        /// The idempotency key.
        key: String,
        /// The record's partition.
        partition: u32,
        /// The record's offset.
        offset: u64,
        /// The digest of the body sent.
        sent: String,
        /// The digest of the body now.
        now: String,
    },
}

/// How a run ends.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Stop once every committed record is settled or parked, rather than
    /// follow the output as the job commits more.
    pub until_caught_up: bool,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Records delivered in this run.
    pub delivered: u64,
    /// Records dead-lettered in this run.
    pub failed: u64,
    /// Records waiting as `unknown` when it ended.
    pub unknown: u64,
    /// The positions when it ended.
    pub positions: Positions,
}

/// What a lane is asked to do.
enum ToLane {
    /// Deliver a record (unless its key is held back), with its ledger
    /// entry if it has one.
    Deliver(OutputRecord, Option<Entry>),
    /// Deliver a record whose first attempt this lane already wrote (a
    /// claim ahead of its send): its entry as written.
    Claimed(OutputRecord, Entry),
    /// A parked record of this key is settled: its key goes on.
    Release(String),
}

/// What a lane reports.
enum FromLane {
    /// The record at this partition and offset is settled (its entry is
    /// written, or queued with the attempt writer).
    Settled { at: (u32, u64), outcome: Outcome, latency: Option<Duration> },
    /// The record is parked as `unknown`; its key is held back.
    Parked(OutputRecord),
    /// The record came after a parked one of its key: held back.
    Held(OutputRecord),
    /// The delivery cannot go on.
    Fatal(DeliverError),
}

/// Runs the delivery `settings` describes (to HTTP here; to PostgreSQL
/// in [`crate::postgres`]) over `source` until it is stopped (`stop`),
/// or caught up when `options` say so; the ledger's writes go to
/// `mirror` too, when there is one.
pub fn run(
    settings: &DeliverSettings,
    source: &mut dyn Source,
    mirror: Option<Arc<dyn Mirror>>,
    stop: Arc<AtomicBool>,
    options: RunOptions,
) -> Result<RunSummary, DeliverError> {
    std::fs::create_dir_all(&settings.state_dir)
        .map_err(|err| LedgerError::new(&settings.state_dir, err.to_string()))?;
    let ledger_dir = settings.state_dir.join("ledger");
    let ledger = Arc::new(match mirror {
        Some(mirror) => Ledger::open_mirrored(&ledger_dir, mirror)?,
        None => Ledger::open(&ledger_dir)?,
    });
    let dead_letters = Arc::new(DeadLetters::open(&settings.dead_letters).map_err(|source| {
        DeliverError::DeadLetters { path: settings.dead_letters.clone(), source }
    })?);
    let http = match &settings.target {
        Target::Http(http) => http,
        Target::Postgres(postgres) => {
            let delivery = postgres.delivery.clone().unwrap_or_else(|| settings.output.clone());
            return crate::postgres::run(
                postgres,
                &delivery,
                &ledger,
                &dead_letters,
                source,
                &stop,
                options,
            );
        }
    };
    let target = Arc::new(HttpTarget::new(http.clone()));
    let attempts = Arc::new(AttemptWriter::start(ledger.clone()));
    let lane_count = http.max_in_flight;
    let (report, reports) = mpsc::channel();
    let mut lanes = Vec::with_capacity(lane_count);
    let mut workers: Vec<JoinHandle<()>> = Vec::with_capacity(lane_count);
    // The lanes' own stop: set when the main loop ends, however it ends.
    // The caller's `stop` is only read: a caller that runs a delivery again
    // (a served job's, after a failure) must not find it set by this run.
    let lanes_stop = Arc::new(AtomicBool::new(false));
    for _ in 0..lane_count {
        let (to_lane, from_main) = mpsc::channel();
        let lane = Lane {
            http: http.clone(),
            target: target.clone(),
            ledger: ledger.clone(),
            attempts: attempts.clone(),
            dead_letters: dead_letters.clone(),
            stop: lanes_stop.clone(),
            report: report.clone(),
            held_back: std::collections::HashSet::new(),
            jitter: RandomState::new(),
        };
        workers.push(std::thread::spawn(move || lane.run(from_main)));
        lanes.push(to_lane);
    }
    drop(report);
    let mut main = Main {
        ledger: ledger.clone(),
        dead_letters,
        lanes,
        lane_of: RandomState::new(),
        body: http.body,
        lookup: http.lookup_url.is_some(),
        pending: BTreeMap::new(),
        parked: HashMap::new(),
        held: HashMap::new(),
        latencies: VecDeque::new(),
        summary: RunSummary::default(),
        attempts: attempts.clone(),
        ledger_retention: settings.ledger_retention,
    };
    let resolutions = crate::resolve::Inbox::new(&settings.state_dir);
    let result = main.run(source, &reports, &resolutions, &stop, options);
    // The lanes finish the request in hand and stop.
    lanes_stop.store(true, Ordering::SeqCst);
    drop(main.lanes);
    for worker in workers {
        let _ = worker.join();
    }
    while let Ok(report) = reports.try_recv() {
        if let FromLane::Settled { outcome, .. } = report {
            main.summary.count(outcome);
        }
    }
    attempts.flush()?;
    let mut summary = result?;
    summary.delivered = main.summary.delivered;
    summary.failed = main.summary.failed;
    ledger.sync()?;
    Ok(summary)
}

impl RunSummary {
    fn count(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Delivered => self.delivered += 1,
            Outcome::Failed => self.failed += 1,
            _ => {}
        }
    }
}

/// The main thread's side of a run.
struct Main {
    ledger: Arc<Ledger>,
    dead_letters: Arc<DeadLetters>,
    lanes: Vec<Sender<ToLane>>,
    lane_of: RandomState,
    body: crate::settings::Body,
    /// Whether a lookup URL is configured (then a parked record goes back
    /// to its lane, which looks it up).
    lookup: bool,
    /// Records read and not settled, by partition and offset: their
    /// idempotency keys.
    pending: BTreeMap<(u32, u64), String>,
    /// Keys held back, each by its parked record.
    parked: HashMap<String, OutputRecord>,
    /// Records waiting behind a parked one of their key, in order.
    held: HashMap<String, VecDeque<OutputRecord>>,
    latencies: VecDeque<u64>,
    summary: RunSummary,
    /// The writer of the lanes' entries (deliveries among them).
    attempts: Arc<AttemptWriter>,
    /// How long a settled record's entry stays once the position passed it.
    ledger_retention: Duration,
}

impl Main {
    fn run(
        &mut self,
        source: &mut dyn Source,
        reports: &Receiver<FromLane>,
        resolutions: &crate::resolve::Inbox,
        stop: &AtomicBool,
        options: RunOptions,
    ) -> Result<RunSummary, DeliverError> {
        let mut written = self.ledger.positions()?;
        source.start(&written)?;
        // Per partition, the offset just past the last record read.
        let mut read_to = written.clone();
        let mut last_stats = Instant::now();
        let mut looked: Option<Instant> = None;
        let mut position_written = Instant::now();
        let mut last_prune: Option<Instant> = None;
        loop {
            // The operators' verdicts, each poll.
            if looked.is_none_or(|at| at.elapsed() >= POLL) {
                for (path, resolution) in resolutions.waiting()? {
                    self.resolve(resolution)?;
                    resolutions.done(&path);
                }
                looked = Some(Instant::now());
            }
            while self.pending.len() < MAX_PENDING {
                let lines = source.read(MAX_PENDING - self.pending.len())?;
                if lines.is_empty() {
                    break;
                }
                for line in lines {
                    read_to.insert(line.partition, line.next);
                    self.read(line)?;
                }
            }
            // Reports until the next poll, or until there is room to read
            // more of what is committed.
            // While records are in flight, reports are taken in batches
            // every millisecond rather than each waking this thread: a
            // wake-up per record cost more than the ledger on two cores.
            let deadline = Instant::now() + POLL;
            loop {
                let wait = deadline.saturating_duration_since(Instant::now());
                if wait.is_zero() {
                    break;
                }
                if self.pending.is_empty() {
                    match reports.recv_timeout(wait) {
                        Ok(report) => self.on_report(report)?,
                        Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                    }
                } else {
                    std::thread::sleep(REPORT_BATCH.min(wait));
                }
                while let Ok(report) = reports.try_recv() {
                    self.on_report(report)?;
                }
                if self.pending.len() <= MAX_PENDING / 2
                    && (!source.caught_up() || self.pending.is_empty())
                {
                    break;
                }
            }
            let positions = self.positions(&read_to);
            let idle = source.caught_up() && self.pending.is_empty();
            // Synced at most each poll while busy (a lost position only
            // means settled records are read again and skipped).
            if positions != written && (idle || position_written.elapsed() >= POLL) {
                // Deliveries are in the ledger before the position passes them.
                self.attempts.flush()?;
                self.ledger.set_positions(&positions)?;
                written = positions.clone();
                position_written = Instant::now();
            }
            if last_stats.elapsed() >= Duration::from_secs(1) {
                self.write_stats()?;
                last_stats = Instant::now();
            }
            // Only below the durable position: those records are never read again.
            if last_prune.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
                let retention =
                    i64::try_from(self.ledger_retention.as_millis()).unwrap_or(i64::MAX);
                let pruned = self.ledger.prune(&written, now_ms().saturating_sub(retention))?;
                if pruned > 0 {
                    tracing::info!(
                        entries = pruned,
                        "pruned settled records' ledger entries past ledger_retention"
                    );
                }
                last_prune = Some(Instant::now());
            }
            let waiting_only = self.pending.len()
                == self.parked.len() + self.held.values().map(VecDeque::len).sum::<usize>();
            if stop.load(Ordering::SeqCst)
                || (options.until_caught_up && source.caught_up() && waiting_only)
            {
                if positions != written {
                    self.attempts.flush()?;
                    self.ledger.set_positions(&positions)?;
                }
                self.write_stats()?;
                self.summary.positions = positions;
                self.summary.unknown = self.parked.len() as u64;
                return Ok(self.summary.clone());
            }
        }
    }

    /// Per partition, the offset of its first record not settled (or
    /// just past the last one read).
    fn positions(&self, read_to: &Positions) -> Positions {
        read_to
            .iter()
            .map(|(&partition, &next)| {
                let first_pending = self
                    .pending
                    .range((partition, 0)..=(partition, u64::MAX))
                    .next()
                    .map(|(&(_, offset), _)| offset);
                (partition, first_pending.unwrap_or(next))
            })
            .collect()
    }

    /// One committed record: skipped if settled, held back behind its
    /// key's parked record, or handed to its lane.
    fn read(&mut self, line: Line) -> Result<(), DeliverError> {
        let Line { partition, offset, .. } = line;
        let record = match OutputRecord::read(partition, offset, &line.payload, self.body) {
            Ok(record) => record,
            Err(reason) => {
                let letter = DeadLetter {
                    idempotency_key: crate::dead_letters::malformed_key(partition, offset),
                    partition,
                    offset,
                    reason: format!("malformed: {reason}"),
                    status: None,
                    attempts: 0,
                    body: None,
                };
                self.dead_letters.write(&letter).map_err(|source| DeliverError::DeadLetters {
                    path: self.dead_letters.path().to_path_buf(),
                    source,
                })?;
                return Ok(());
            }
        };
        let entry = self.ledger.entry(&record.idempotency_key)?;
        if let Some(entry) = &entry {
            let now = body_digest(&record.body);
            if entry.body_sha256 != now {
                return Err(DeliverError::BodyChanged {
                    key: record.idempotency_key,
                    partition,
                    offset,
                    sent: entry.body_sha256.clone(),
                    now,
                });
            }
            match entry.outcome {
                Outcome::Delivered | Outcome::Failed => return Ok(()),
                _ => {}
            }
        }
        self.pending.insert((partition, offset), record.idempotency_key.clone());
        if let Some(held) = self.held.get_mut(&record.order_key) {
            held.push_back(record);
        } else if self.parked.contains_key(&record.order_key) {
            self.held.entry(record.order_key.clone()).or_default().push_back(record);
        } else if entry.as_ref().is_some_and(|entry| entry.outcome == Outcome::Unknown)
            && !self.lookup
        {
            // Parked before: not re-sent until an operator says so.
            self.parked.insert(record.order_key.clone(), record);
        } else {
            self.dispatch(record, entry);
        }
        Ok(())
    }

    /// Hands `record` (with what the ledger knows of it) to its lane.
    fn dispatch(&self, record: OutputRecord, entry: Option<Entry>) {
        let lane = self.lane(&record.order_key);
        // A lane only goes away when the run ends.
        let _ = self.lanes[lane].send(ToLane::Deliver(record, entry));
    }

    fn lane(&self, order_key: &str) -> usize {
        (self.lane_of.hash_one(order_key) % self.lanes.len() as u64) as usize
    }

    fn on_report(&mut self, report: FromLane) -> Result<(), DeliverError> {
        match report {
            FromLane::Settled { at, outcome, latency } => {
                self.pending.remove(&at);
                self.summary.count(outcome);
                if let Some(latency) = latency {
                    if self.latencies.len() == LATENCY_SAMPLES {
                        self.latencies.pop_front();
                    }
                    self.latencies.push_back(latency.as_millis() as u64);
                }
            }
            FromLane::Parked(record) => {
                self.parked.insert(record.order_key.clone(), record);
            }
            FromLane::Held(record) => {
                self.held.entry(record.order_key.clone()).or_default().push_back(record);
            }
            FromLane::Fatal(err) => return Err(err),
        }
        Ok(())
    }

    /// An operator's verdict on a record waiting as `unknown`.
    fn resolve(&mut self, resolution: Resolution) -> Result<(), DeliverError> {
        let settled = crate::resolve::apply(&self.ledger, &resolution)?;
        let Some(outcome) = settled else { return Ok(()) };
        let parked = self
            .parked
            .iter()
            .find(|(_, record)| record.idempotency_key == resolution.key)
            .map(|(order_key, _)| order_key.clone());
        let Some(order_key) = parked else { return Ok(()) };
        let record = self.parked.remove(&order_key).expect("found above");
        let lane = self.lane(&order_key);
        let _ = self.lanes[lane].send(ToLane::Release(order_key.clone()));
        match resolution.verdict {
            Verdict::Applied => {
                self.pending.remove(&(record.partition, record.offset));
                self.summary.count(outcome);
            }
            Verdict::NotApplied => self.dispatch(record, None),
        }
        for record in self.held.remove(&order_key).unwrap_or_default() {
            self.dispatch(record, None);
        }
        Ok(())
    }

    fn write_stats(&self) -> Result<(), DeliverError> {
        let mut sorted: Vec<u64> = self.latencies.iter().copied().collect();
        sorted.sort_unstable();
        let at = |quantile: f64| {
            if sorted.is_empty() {
                0
            } else {
                sorted[((sorted.len() - 1) as f64 * quantile).round() as usize]
            }
        };
        let stats = Stats {
            at_ms: now_ms(),
            latency_p50_ms: at(0.5),
            latency_p99_ms: at(0.99),
            pending: self.pending.len() as u64,
        };
        Ok(self.ledger.put_stats(&stats)?)
    }
}

/// One lane: its records, one at a time, in order.
struct Lane {
    http: HttpSettings,
    target: Arc<HttpTarget>,
    ledger: Arc<Ledger>,
    attempts: Arc<AttemptWriter>,
    dead_letters: Arc<DeadLetters>,
    stop: Arc<AtomicBool>,
    report: Sender<FromLane>,
    /// Keys whose parked record holds back their later records.
    held_back: std::collections::HashSet<String>,
    jitter: RandomState,
}

/// How one record's delivery ended in a lane.
enum Ended {
    /// Settled (a delivery, with its latency).
    Settled(Outcome, Option<Duration>),
    Parked,
    Stopped,
}

impl Lane {
    fn run(mut self, inbox: Receiver<ToLane>) {
        // Messages taken from the inbox ahead of their turn (to claim).
        let mut ahead: VecDeque<ToLane> = VecDeque::new();
        loop {
            let message = match ahead.pop_front() {
                Some(message) => message,
                None => match inbox.recv() {
                    Ok(message) => message,
                    Err(_) => return,
                },
            };
            let (record, mut known, mut claimed) = match message {
                ToLane::Release(order_key) => {
                    self.held_back.remove(&order_key);
                    continue;
                }
                ToLane::Deliver(record, known) => (record, known, false),
                ToLane::Claimed(record, entry) => (record, Some(entry), true),
            };
            if self.held_back.contains(&record.order_key) {
                let _ = self.report.send(FromLane::Held(record));
                continue;
            }
            if known.is_none() {
                // Its first attempt, and those of the next ones the ledger
                // does not know, in one write.
                let entry = first_attempt(&record);
                let mut claims = vec![(record.idempotency_key.clone(), entry.clone())];
                self.claim_ahead(&inbox, &mut ahead, &mut claims);
                // (A failed write ends the lane: the claims go with it.)
                if let Err(err) = self.attempts.write_many(&claims) {
                    let _ = self.report.send(FromLane::Fatal(err.into()));
                    return;
                }
                (known, claimed) = (Some(entry), true);
            }
            let report = match self.deliver(&record, known, claimed) {
                Ok(Ended::Settled(outcome, latency)) => {
                    FromLane::Settled { at: (record.partition, record.offset), outcome, latency }
                }
                Ok(Ended::Parked) => {
                    self.held_back.insert(record.order_key.clone());
                    FromLane::Parked(record)
                }
                Ok(Ended::Stopped) => return,
                Err(err) => FromLane::Fatal(err),
            };
            if self.report.send(report).is_err() {
                return;
            }
        }
    }

    /// Turns the records queued behind the current one (up to
    /// [`CLAIM_AHEAD`] in all, taken from the inbox; none of a key held
    /// back) that the ledger has no entry for into claimed deliveries,
    /// their first attempts added to `claims` (written by the caller).
    fn claim_ahead(
        &self,
        inbox: &Receiver<ToLane>,
        ahead: &mut VecDeque<ToLane>,
        claims: &mut Vec<(String, Entry)>,
    ) {
        while ahead.len() < CLAIM_AHEAD - 1 {
            match inbox.try_recv() {
                Ok(message) => ahead.push_back(message),
                Err(_) => break,
            }
        }
        for message in ahead.iter_mut() {
            if let ToLane::Deliver(next, None) = message
                && !self.held_back.contains(&next.order_key)
            {
                let entry = first_attempt(next);
                claims.push((next.idempotency_key.clone(), entry.clone()));
                *message = ToLane::Claimed(std::mem::take(next), entry);
            }
        }
    }

    /// Sends `record` until it settles, parks, or the run stops; `known`
    /// is its ledger entry, if it has one (`claimed`: its first attempt,
    /// already written).
    fn deliver(
        &self,
        record: &OutputRecord,
        known: Option<Entry>,
        mut claimed: bool,
    ) -> Result<Ended, DeliverError> {
        let key = &record.idempotency_key;
        let digest = body_digest(&record.body);
        let mut entry =
            known.unwrap_or_else(|| Entry::unsent(record.partition, record.offset, digest.clone()));
        if entry.body_sha256 != digest {
            return Err(DeliverError::BodyChanged {
                key: key.clone(),
                partition: record.partition,
                offset: record.offset,
                sent: entry.body_sha256,
                now: digest,
            });
        }
        // The lane knows a record it claimed was not sent yet: a claim that
        // has aged is renewed at the send, so the retention counts from it.
        if claimed && now_ms() - entry.first_attempt_ms > CLAIM_FRESH_MS {
            entry = Entry::unsent(record.partition, record.offset, digest.clone());
            claimed = false;
        }
        let started = Instant::now();
        let mut failures_here: u32 = 0;
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(Ended::Stopped);
            }
            // An operator's verdict may have changed the entry meanwhile.
            if failures_here > 0
                && let Some(current) = self.ledger.entry(key)?
            {
                if current.outcome == Outcome::Delivered {
                    return Ok(Ended::Settled(Outcome::Delivered, None));
                }
                entry = current;
            }
            let retention_ms = self.http.key_retention.as_millis() as i64;
            if let Some(since) = entry.maybe_applied_since_ms
                && now_ms() - since >= retention_ms
            {
                // The receiver may have applied it and no longer remembers
                // the key: never re-sent blindly.
                match self.target.lookup(key) {
                    None => {
                        entry.outcome = Outcome::Unknown;
                        self.ledger.put(key, &entry)?;
                        return Ok(Ended::Parked);
                    }
                    Some(Lookup::Applied) => {
                        entry.outcome = Outcome::Delivered;
                        entry.last_error = None;
                        self.ledger.put(key, &entry)?;
                        return Ok(Ended::Settled(Outcome::Delivered, None));
                    }
                    Some(Lookup::NeverApplied) => {
                        entry.maybe_applied_since_ms = None;
                        entry.outcome = Outcome::Retrying;
                        self.ledger.put(key, &entry)?;
                    }
                    Some(Lookup::Unknown(reason)) => {
                        entry.outcome = Outcome::Unknown;
                        entry.last_error = Some(reason);
                        self.ledger.put(key, &entry)?;
                        failures_here += 1;
                        if !self.sleep(self.backoff(failures_here, None)) {
                            return Ok(Ended::Stopped);
                        }
                        continue;
                    }
                }
            }
            // Written before the request: a crash during it leaves the
            // record as possibly applied, its retention running. (Its
            // delivery is written by the main thread, with others.)
            let since_before = entry.maybe_applied_since_ms;
            if std::mem::take(&mut claimed) {
                entry.last_attempt_ms = now_ms();
            } else {
                entry.attempting(now_ms());
                self.attempts.write_many(&[(key.clone(), entry.clone())])?;
            }
            match self.target.send(record) {
                Attempt::Delivered => {
                    entry.outcome = Outcome::Delivered;
                    entry.last_error = None;
                    // Written by the attempt writer with the next batch;
                    // the position waits for it.
                    self.attempts.submit(&[(key.clone(), entry)]);
                    return Ok(Ended::Settled(Outcome::Delivered, Some(started.elapsed())));
                }
                Attempt::Refused { status, answer } => {
                    let letter = DeadLetter {
                        idempotency_key: key.clone(),
                        partition: record.partition,
                        offset: record.offset,
                        reason: format!("the receiver refused it with {status}: {answer}"),
                        status: Some(status),
                        attempts: entry.attempts,
                        body: RawValue::from_string(
                            String::from_utf8_lossy(&record.body).into_owned(),
                        )
                        .ok(),
                    };
                    self.dead_letters.write(&letter).map_err(|source| {
                        DeliverError::DeadLetters {
                            path: self.dead_letters.path().to_path_buf(),
                            source,
                        }
                    })?;
                    entry.outcome = Outcome::Failed;
                    entry.last_error = Some(format!("refused with {status}"));
                    self.ledger.put(key, &entry)?;
                    return Ok(Ended::Settled(Outcome::Failed, None));
                }
                Attempt::Retry { reason, maybe_applied, retry_after } => {
                    if !maybe_applied {
                        entry.maybe_applied_since_ms = since_before;
                    }
                    tracing::debug!(key = %key, %reason, "delivery attempt failed; retrying");
                    entry.outcome = Outcome::Retrying;
                    entry.last_error = Some(reason);
                    self.ledger.put(key, &entry)?;
                    failures_here += 1;
                    if !self.sleep(self.backoff(failures_here, retry_after)) {
                        return Ok(Ended::Stopped);
                    }
                }
            }
        }
    }

    /// The wait before retry `failures`: the receiver's `Retry-After` if it
    /// gave one (up to the key retention), else an exponential backoff with
    /// jitter (between half and all of `retry_initial` · 2^(failures-1),
    /// at most `retry_max`).
    fn backoff(&self, failures: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait.min(self.http.key_retention);
        }
        let doubled =
            self.http.retry_initial.saturating_mul(1u32 << failures.saturating_sub(1).min(20));
        let ceiling = doubled.min(self.http.retry_max);
        let fraction = (self.jitter.hash_one((failures, Instant::now())) % 1000) as u32;
        ceiling / 2 + ceiling / 2 * fraction / 1000
    }

    /// Sleeps `wait`, unless the run stops first (then false).
    fn sleep(&self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if self.stop.load(Ordering::SeqCst) {
                return false;
            }
            std::thread::sleep(SLEEP_STEP.min(until.saturating_duration_since(Instant::now())));
        }
        !self.stop.load(Ordering::SeqCst)
    }
}

/// The entry of `record`'s first request, about to go out.
fn first_attempt(record: &OutputRecord) -> Entry {
    let mut entry = Entry::unsent(record.partition, record.offset, body_digest(&record.body));
    entry.attempting(now_ms());
    entry
}

/// SHA-256 of a body, in hex.
fn body_digest(body: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(body);
    let mut text = String::with_capacity(64);
    for byte in digest {
        text.push(HEX[(byte >> 4) as usize] as char);
        text.push(HEX[(byte & 15) as usize] as char);
    }
    text
}

/// Now, in Unix milliseconds.
pub(crate) fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}
