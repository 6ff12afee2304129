//! The PostgreSQL target: records upserted into the operator's table in
//! batches, each batch in one database transaction that also moves the
//! delivery's position (`tally_delivery_positions`), so each record is
//! applied exactly once without relying on keys: a batch whose COMMIT's
//! answer was lost is found committed, or not, by reading the position
//! back. The schema is in `docs/delivery.md`.

use std::str::FromStr as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use postgres::error::SqlState;
use postgres::{Client, NoTls};

use crate::dead_letters::{DeadLetter, DeadLetters};
use crate::deliverer::{DeliverError, RunOptions, RunSummary};
use crate::ledger::Ledger;
use crate::record::OutputRecord;
use crate::settings::{Body, PostgresSettings};
use crate::source::LocalOutput;

/// The table of delivery positions, one row per delivery.
pub const POSITIONS_TABLE: &str = "tally_delivery_positions";
/// How often the output is looked at when there is nothing to deliver.
const POLL: Duration = Duration::from_millis(100);
/// The longest wait before connecting again.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A failed database call: worth retrying on a new connection, a batch
/// holding a record the table refuses, or a setup that cannot work.
enum DbFailure {
    Retry(String),
    RecordRefused(String),
    Fatal(String),
}

impl From<postgres::Error> for DbFailure {
    fn from(err: postgres::Error) -> DbFailure {
        let Some(db) = err.as_db_error() else {
            return DbFailure::Retry(err.to_string());
        };
        let code = db.code().code();
        let message = format!("{} ({code})", db.message());
        match &code[..2] {
            // Data exceptions and integrity violations: a record's.
            "22" | "23" => DbFailure::RecordRefused(message),
            // Syntax, names, permissions; authorization; no such database.
            "42" | "28" | "3D" => DbFailure::Fatal(message),
            _ if *db.code() == SqlState::READ_ONLY_SQL_TRANSACTION => DbFailure::Fatal(message),
            // Shutdowns, lost connections, serialization, resources.
            _ => DbFailure::Retry(message),
        }
    }
}

/// A connection to the target database.
struct Target {
    client: Client,
    /// The table, quoted.
    table: String,
    /// The table as the settings name it (its row in the positions).
    table_name: String,
    delivery: String,
}

impl Target {
    fn connect(settings: &PostgresSettings, delivery: &str) -> Result<Target, DbFailure> {
        let mut config = postgres::Config::from_str(&settings.url)
            .map_err(|err| DbFailure::Fatal(format!("postgres.url does not parse: {err}")))?;
        config.connect_timeout(Duration::from_secs(10));
        if config.get_ssl_mode() == postgres::config::SslMode::Require {
            return Err(DbFailure::Fatal(
                "postgres.url asks for TLS (sslmode=require), which this build does not do yet; connect over loopback or a tunnel with sslmode=disable".into(),
            ));
        }
        let mut client = config.connect(NoTls)?;
        let table = quoted(&settings.table);
        client.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (
                idempotency_key text PRIMARY KEY,
                record_key jsonb NOT NULL,
                value jsonb NOT NULL,
                output_offset bigint NOT NULL,
                delivered_at timestamptz NOT NULL DEFAULT now());
             CREATE TABLE IF NOT EXISTS {POSITIONS_TABLE} (
                delivery text NOT NULL,
                target_table text NOT NULL,
                output_offset bigint NOT NULL,
                updated_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (delivery, target_table));"
        ))?;
        client.execute(
            &format!(
                "INSERT INTO {POSITIONS_TABLE} (delivery, target_table, output_offset) VALUES ($1, $2, 0) ON CONFLICT DO NOTHING"
            ),
            &[&delivery, &settings.table],
        )?;
        Ok(Target {
            client,
            table,
            table_name: settings.table.clone(),
            delivery: delivery.to_string(),
        })
    }

    /// The committed position of this delivery.
    fn position(&mut self) -> Result<u64, DbFailure> {
        let row = self.client.query_one(
            &format!("SELECT output_offset FROM {POSITIONS_TABLE} WHERE delivery = $1 AND target_table = $2"),
            &[&self.delivery, &self.table_name],
        )?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// Upserts `records` and moves the position from `from` to `to`, in
    /// one transaction; `Ok(false)` if the position was not `from` (an
    /// earlier commit whose answer was lost, or another deliverer).
    fn apply(&mut self, records: &[OutputRecord], from: u64, to: u64) -> Result<bool, DbFailure> {
        let mut transaction = self.client.transaction()?;
        let row = transaction.query_one(
            &format!(
                "SELECT output_offset FROM {POSITIONS_TABLE} WHERE delivery = $1 AND target_table = $2 FOR UPDATE"
            ),
            &[&self.delivery, &self.table_name],
        )?;
        if row.get::<_, i64>(0) as u64 != from {
            return Ok(false);
        }
        if !records.is_empty() {
            let mut sql = format!(
                "INSERT INTO {} (idempotency_key, record_key, value, output_offset) VALUES ",
                self.table
            );
            let mut values: Vec<(String, String, i64)> = Vec::with_capacity(records.len());
            for (index, record) in records.iter().enumerate() {
                let base = index * 4;
                if index > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(&format!(
                    "(${}, ${}::text::jsonb, ${}::text::jsonb, ${})",
                    base + 1,
                    base + 2,
                    base + 3,
                    base + 4
                ));
                let key = if record.order_key.is_empty() {
                    "null".to_string()
                } else {
                    record.order_key.clone()
                };
                values.push((
                    key,
                    String::from_utf8_lossy(&record.body).into_owned(),
                    record.offset as i64,
                ));
            }
            sql.push_str(
                " ON CONFLICT (idempotency_key) DO UPDATE SET record_key = EXCLUDED.record_key, \
                 value = EXCLUDED.value, output_offset = EXCLUDED.output_offset, delivered_at = now()",
            );
            let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> =
                Vec::with_capacity(records.len() * 4);
            for (record, (key, value, offset)) in records.iter().zip(&values) {
                params.push(&record.idempotency_key);
                params.push(key);
                params.push(value);
                params.push(offset);
            }
            transaction.execute(&sql, &params)?;
        }
        transaction.execute(
            &format!(
                "UPDATE {POSITIONS_TABLE} SET output_offset = $3, updated_at = now() WHERE delivery = $1 AND target_table = $2"
            ),
            &[&self.delivery, &self.table_name, &(to as i64)],
        )?;
        transaction.commit()?;
        Ok(true)
    }
}

/// `name` or `schema.name` as quoted identifiers (the settings checked
/// each part).
fn quoted(table: &str) -> String {
    table.split('.').map(|part| format!("\"{part}\"")).collect::<Vec<_>>().join(".")
}

/// One committed line, read: a record, or a dead letter's reason.
type Read = (u64, u64, Result<OutputRecord, String>);

/// Delivers `source` into PostgreSQL until stopped, or caught up.
pub fn run(
    settings: &PostgresSettings,
    delivery: &str,
    ledger: &Ledger,
    dead_letters: &DeadLetters,
    mut source: LocalOutput,
    stop: &AtomicBool,
    options: RunOptions,
) -> Result<RunSummary, DeliverError> {
    let mut summary = RunSummary::default();
    let mut target: Option<Target> = None;
    let mut position = 0;
    let mut failures: u32 = 0;
    let mut noted = std::time::Instant::now();
    let mut ledger_position = ledger.position()?;
    let mut committed = 0;
    let fatal = |message: String| DeliverError::Postgres(message);
    loop {
        if stop.load(Ordering::SeqCst) {
            ledger.set_position(position)?;
            summary.position = position;
            return Ok(summary);
        }
        let connected = match target.as_mut() {
            Some(connected) => connected,
            None => match Target::connect(settings, delivery).and_then(|mut connected| {
                position = connected.position()?;
                Ok(connected)
            }) {
                Ok(connected) => target.insert(connected),
                Err(DbFailure::Fatal(message)) => return Err(fatal(message)),
                Err(DbFailure::Retry(reason) | DbFailure::RecordRefused(reason)) => {
                    failures += 1;
                    tracing::warn!(%reason, "cannot reach PostgreSQL; trying again");
                    sleep(backoff(failures), stop);
                    continue;
                }
            },
        };
        // The job's committed length, read again once everything known
        // is delivered.
        if position >= committed {
            committed = source.committed_length()?;
        }
        let mut batch: Vec<Read> = Vec::new();
        let mut cursor = position;
        while cursor < committed && batch.len() < settings.batch_size {
            for line in source.read(cursor, committed, settings.batch_size - batch.len())? {
                let record = match line.bytes {
                    Ok(bytes) => OutputRecord::parse(line.offset, &bytes, Body::Value),
                    Err(length) => {
                        Err(format!("the record is {length} bytes, over the delivery's limit"))
                    }
                };
                batch.push((line.offset, line.next, record));
                cursor = line.next;
            }
        }
        if batch.is_empty() {
            if ledger_position != position {
                ledger.set_position(position)?;
                ledger_position = position;
            }
            if options.until_caught_up && position >= committed {
                summary.position = position;
                return Ok(summary);
            }
            sleep(POLL, stop);
            continue;
        }
        match deliver_batch(connected, &batch, position, cursor, dead_letters) {
            Ok(Some(delivered)) => {
                failures = 0;
                summary.delivered += delivered.0;
                summary.failed += delivered.1;
                position = cursor;
                // The database's position is the truth; the ledger's copy
                // is for `tally deliver status`, written at most each second.
                if noted.elapsed() >= Duration::from_secs(1) {
                    ledger.set_position(position)?;
                    (ledger_position, noted) = (position, std::time::Instant::now());
                }
            }
            // The position moved under us: read it back and go on from it.
            Ok(None) => target = None,
            Err(DbFailure::Fatal(message)) => return Err(fatal(message)),
            Err(DbFailure::Retry(reason) | DbFailure::RecordRefused(reason)) => {
                failures += 1;
                tracing::warn!(%reason, "a batch into PostgreSQL failed; reconnecting to read where it stands");
                target = None;
                sleep(backoff(failures), stop);
            }
        }
    }
}

/// Delivers one batch (from `from` to `to`): whole, or, when the table
/// refuses one of its records, record by record with the refused ones
/// dead-lettered. The records delivered and dead-lettered, or `None` when
/// the position was not `from`.
fn deliver_batch(
    target: &mut Target,
    batch: &[Read],
    from: u64,
    to: u64,
    dead_letters: &DeadLetters,
) -> Result<Option<(u64, u64)>, DbFailure> {
    let records: Vec<OutputRecord> =
        batch.iter().filter_map(|(_, _, record)| record.as_ref().ok().cloned()).collect();
    let malformed = batch.iter().filter(|(_, _, record)| record.is_err()).count() as u64;
    if malformed == 0 {
        match target.apply(&records, from, to) {
            Ok(true) => return Ok(Some((records.len() as u64, 0))),
            Ok(false) => return Ok(None),
            Err(DbFailure::RecordRefused(_)) => {}
            Err(other) => return Err(other),
        }
    }
    // One record (or dead letter) per transaction, each moving the
    // position past itself.
    let (mut delivered, mut failed) = (0, 0);
    let mut at = from;
    for (offset, next, record) in batch {
        let refusal = match record {
            Ok(record) => match target.apply(std::slice::from_ref(record), at, *next) {
                Ok(true) => {
                    delivered += 1;
                    at = *next;
                    continue;
                }
                Ok(false) => return Ok(None),
                Err(DbFailure::RecordRefused(reason)) => {
                    (record.idempotency_key.clone(), format!("the table refused it: {reason}"))
                }
                Err(other) => return Err(other),
            },
            Err(reason) => (format!("offset/{offset}"), format!("malformed: {reason}")),
        };
        let letter = DeadLetter {
            idempotency_key: refusal.0,
            offset: *offset,
            reason: refusal.1,
            status: None,
            attempts: 1,
            body: None,
        };
        dead_letters
            .write(&letter)
            .map_err(|err| DbFailure::Fatal(format!("cannot write a dead letter: {err}")))?;
        if !target.apply(&[], at, *next)? {
            return Ok(None);
        }
        failed += 1;
        at = *next;
    }
    Ok(Some((delivered, failed)))
}

fn backoff(failures: u32) -> Duration {
    (Duration::from_millis(100) * (1u32 << failures.min(6))).min(MAX_BACKOFF)
}

fn sleep(wait: Duration, stop: &AtomicBool) {
    let until = std::time::Instant::now() + wait;
    while std::time::Instant::now() < until && !stop.load(Ordering::SeqCst) {
        std::thread::sleep(
            Duration::from_millis(20)
                .min(until.saturating_duration_since(std::time::Instant::now())),
        );
    }
}
