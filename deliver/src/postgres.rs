//! The PostgreSQL target: records upserted into the operator's table in
//! batches, each batch in one database transaction that also moves the
//! delivery's positions (`tally_delivery_positions`, one row per output
//! partition), so each record is applied exactly once without relying on
//! keys: a batch whose COMMIT's answer was lost is found committed, or
//! not, by reading the positions back. The schema is in `docs/delivery.md`.

use std::str::FromStr as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use postgres::config::SslMode;
use postgres::error::SqlState;
use postgres::{Client, NoTls};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::dead_letters::{DeadLetter, DeadLetters, malformed_key};
use crate::deliverer::{DeliverError, RunOptions, RunSummary};
use crate::ledger::Ledger;
use crate::record::OutputRecord;
use crate::settings::{Body, PostgresSettings};
use crate::source::{Positions, Source};

/// The table of delivery positions, one row per delivery and output
/// partition.
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
        if let Some(refused) = tls_refusal(&err) {
            return DbFailure::Fatal(format!(
                "TLS to PostgreSQL failed: {refused}; set postgres.ca_file to the certificate (PEM) that signs the server's"
            ));
        }
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

/// The TLS error in `err`'s causes, if a handshake failed: a certificate
/// that does not verify is a setting to fix, not a failure to retry.
fn tls_refusal(err: &postgres::Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(error) = cause {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        if let Some(tls) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls.to_string());
        }
        cause = error.source();
    }
    None
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
        // The operator sees the deliverer in pg_stat_activity.
        config.application_name(&format!("tally deliver {delivery}"));
        let mut client = match config.get_ssl_mode() {
            SslMode::Require => config.connect(tls(settings).map_err(DbFailure::Fatal)?)?,
            _ => config.connect(NoTls)?,
        };
        let table = quoted(&settings.table);
        client.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (
                idempotency_key text PRIMARY KEY,
                record_key jsonb NOT NULL,
                value jsonb NOT NULL,
                output_partition integer NOT NULL,
                output_offset bigint NOT NULL,
                delivered_at timestamptz NOT NULL DEFAULT now());
             CREATE TABLE IF NOT EXISTS {POSITIONS_TABLE} (
                delivery text NOT NULL,
                target_table text NOT NULL,
                output_partition integer NOT NULL,
                output_offset bigint NOT NULL,
                updated_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (delivery, target_table, output_partition));"
        ))?;
        Ok(Target {
            client,
            table,
            table_name: settings.table.clone(),
            delivery: delivery.to_string(),
        })
    }

    /// The committed positions of this delivery.
    fn positions(&mut self) -> Result<Positions, DbFailure> {
        let rows = self.client.query(
            &format!("SELECT output_partition, output_offset FROM {POSITIONS_TABLE} WHERE delivery = $1 AND target_table = $2"),
            &[&self.delivery, &self.table_name],
        )?;
        Ok(rows
            .iter()
            .map(|row| (row.get::<_, i32>(0) as u32, row.get::<_, i64>(1) as u64))
            .collect())
    }

    /// Upserts `records` and moves the positions from `from` to `to`, in
    /// one transaction; `Ok(false)` if the positions were not `from` (an
    /// earlier commit whose answer was lost, or another deliverer).
    fn apply(
        &mut self,
        records: &[OutputRecord],
        from: &Positions,
        to: &Positions,
    ) -> Result<bool, DbFailure> {
        let mut transaction = self.client.transaction()?;
        // Each partition's position moves from `from` to `to` only if it
        // is still `from` (a compare-and-set that locks its row; a
        // partition new to the delivery gets a row only if no one else
        // made it).
        for (&partition, &offset) in to {
            let was = from.get(&partition).copied();
            if was == Some(offset) {
                continue;
            }
            let (partition, offset) = (partition as i32, offset as i64);
            let moved = match was {
                Some(was) => transaction.execute(
                    &format!(
                        "UPDATE {POSITIONS_TABLE} SET output_offset = $4, updated_at = now() \
                         WHERE delivery = $1 AND target_table = $2 AND output_partition = $3 AND output_offset = $5"
                    ),
                    &[&self.delivery, &self.table_name, &partition, &offset, &(was as i64)],
                )?,
                None => transaction.execute(
                    &format!(
                        "INSERT INTO {POSITIONS_TABLE} (delivery, target_table, output_partition, output_offset) \
                         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING"
                    ),
                    &[&self.delivery, &self.table_name, &partition, &offset],
                )?,
            };
            if moved != 1 {
                return Ok(false);
            }
        }
        upsert(&mut transaction, &self.table, records)?;
        transaction.commit()?;
        Ok(true)
    }
}

/// A database failure as the delivery reports it.
fn failed(failure: DbFailure) -> DeliverError {
    match failure {
        DbFailure::Retry(message)
        | DbFailure::RecordRefused(message)
        | DbFailure::Fatal(message) => DeliverError::Postgres(message),
    }
}

/// The positions delivery `delivery` committed in the database: every
/// record before them is applied (or dead-lettered).
pub fn committed_positions(
    settings: &PostgresSettings,
    delivery: &str,
) -> Result<Positions, DeliverError> {
    Target::connect(settings, delivery).and_then(|mut target| target.positions()).map_err(failed)
}

/// Moves delivery `delivery` to another output (a promotion's switch), in
/// one transaction: `records` (the switch's corrections) upserted, and the
/// delivery's positions replaced by `positions`, where the other output is
/// read from. It may run again after a lost answer: its records are upserted
/// by idempotency key, and the positions are set, not moved.
pub fn switch(
    settings: &PostgresSettings,
    delivery: &str,
    records: &[OutputRecord],
    positions: &Positions,
) -> Result<(), DeliverError> {
    let mut target = Target::connect(settings, delivery).map_err(failed)?;
    let (delivery, table, table_name) =
        (target.delivery.clone(), target.table.clone(), target.table_name.clone());
    let db = |err: postgres::Error| failed(err.into());
    let mut transaction = target.client.transaction().map_err(db)?;
    transaction
        .execute(
            &format!("DELETE FROM {POSITIONS_TABLE} WHERE delivery = $1 AND target_table = $2"),
            &[&delivery, &table_name],
        )
        .map_err(db)?;
    for (&partition, &offset) in positions {
        transaction
            .execute(
                &format!(
                    "INSERT INTO {POSITIONS_TABLE} (delivery, target_table, output_partition, output_offset) \
                     VALUES ($1, $2, $3, $4)"
                ),
                &[&delivery, &table_name, &(partition as i32), &(offset as i64)],
            )
            .map_err(db)?;
    }
    // Within PostgreSQL's 65,535 parameters a statement.
    for chunk in records.chunks(1_000) {
        upsert(&mut transaction, &table, chunk).map_err(db)?;
    }
    transaction.commit().map_err(db)
}

/// Upserts `records` into `table` (quoted) by idempotency key.
fn upsert(
    transaction: &mut postgres::Transaction<'_>,
    table: &str,
    records: &[OutputRecord],
) -> Result<(), postgres::Error> {
    if records.is_empty() {
        return Ok(());
    }
    let mut sql = format!(
        "INSERT INTO {} (idempotency_key, record_key, value, output_partition, output_offset) VALUES ",
        table
    );
    let mut values: Vec<(String, String, i32, i64)> = Vec::with_capacity(records.len());
    for (index, record) in records.iter().enumerate() {
        let base = index * 5;
        if index > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&format!(
            "(${}, ${}::text::jsonb, ${}::text::jsonb, ${}, ${})",
            base + 1,
            base + 2,
            base + 3,
            base + 4,
            base + 5
        ));
        let key =
            if record.order_key.is_empty() { "null".to_string() } else { record.order_key.clone() };
        values.push((
            key,
            String::from_utf8_lossy(&record.body).into_owned(),
            record.partition as i32,
            record.offset as i64,
        ));
    }
    sql.push_str(
        " ON CONFLICT (idempotency_key) DO UPDATE SET record_key = EXCLUDED.record_key, \
             value = EXCLUDED.value, output_partition = EXCLUDED.output_partition, \
             output_offset = EXCLUDED.output_offset, delivered_at = now()",
    );
    let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> =
        Vec::with_capacity(records.len() * 5);
    for (record, (key, value, partition, offset)) in records.iter().zip(&values) {
        params.push(&record.idempotency_key);
        params.push(key);
        params.push(value);
        params.push(partition);
        params.push(offset);
    }
    transaction.execute(&sql, &params)?;
    Ok(())
}

/// TLS for `sslmode=require`: the server's certificate verified against
/// `ca_file`, or the system's roots.
fn tls(settings: &PostgresSettings) -> Result<MakeRustlsConnect, String> {
    // ring, as the HTTP target's TLS (ureq) uses: the only provider in
    // the tree (aws-lc-rs would add a C build). rustls deprecates it for
    // lacking post-quantum key exchange.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("TLS to PostgreSQL: {err}"))?;
    let config = match &settings.ca_file {
        Some(path) => {
            let unreadable = |err: &dyn std::fmt::Display| {
                format!(
                    "postgres.ca_file `{}` cannot be read as PEM certificates: {err}",
                    path.display()
                )
            };
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(path).map_err(|err| unreadable(&err))? {
                roots.add(cert.map_err(|err| unreadable(&err))?).map_err(|err| unreadable(&err))?;
            }
            if roots.is_empty() {
                return Err(unreadable(&"it holds no certificate"));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => {
            use rustls_platform_verifier::BuilderVerifierExt as _;
            builder
                .with_platform_verifier()
                .map_err(|err| format!("TLS to PostgreSQL: the system's roots: {err}"))?
                .with_no_client_auth()
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

/// `name` or `schema.name` as quoted identifiers (the settings checked
/// each part).
fn quoted(table: &str) -> String {
    table.split('.').map(|part| format!("\"{part}\"")).collect::<Vec<_>>().join(".")
}

/// One committed record, read: its partition, offset and next offset,
/// and the record or a dead letter's reason.
type Read = (u32, u64, u64, Result<OutputRecord, String>);

/// Delivers `source` into PostgreSQL until stopped, or caught up.
pub fn run(
    settings: &PostgresSettings,
    delivery: &str,
    ledger: &Ledger,
    dead_letters: &DeadLetters,
    source: &mut dyn Source,
    stop: &AtomicBool,
    options: RunOptions,
) -> Result<RunSummary, DeliverError> {
    let mut summary = RunSummary::default();
    let mut target: Option<Target> = None;
    let mut positions = Positions::new();
    let mut failures: u32 = 0;
    let mut noted = std::time::Instant::now();
    let mut ledger_positions = ledger.positions()?;
    let fatal = |message: String| DeliverError::Postgres(message);
    loop {
        if stop.load(Ordering::SeqCst) {
            ledger.set_positions(&positions)?;
            summary.positions = positions;
            return Ok(summary);
        }
        let connected = match target.as_mut() {
            Some(connected) => connected,
            // The database's positions are the truth: the source reads on
            // from them after every (re)connection.
            None => match Target::connect(settings, delivery).and_then(|mut connected| {
                positions = connected.positions()?;
                Ok(connected)
            }) {
                Ok(connected) => {
                    source.start(&positions)?;
                    target.insert(connected)
                }
                Err(DbFailure::Fatal(message)) => return Err(fatal(message)),
                Err(DbFailure::Retry(reason) | DbFailure::RecordRefused(reason)) => {
                    failures += 1;
                    tracing::warn!(%reason, "cannot reach PostgreSQL; trying again");
                    sleep(backoff(failures), stop);
                    continue;
                }
            },
        };
        let mut batch: Vec<Read> = Vec::new();
        let mut to = positions.clone();
        while batch.len() < settings.batch_size {
            let lines = source.read(settings.batch_size - batch.len())?;
            if lines.is_empty() {
                break;
            }
            for line in lines {
                let record =
                    OutputRecord::read(line.partition, line.offset, &line.payload, Body::Value);
                to.insert(line.partition, line.next);
                batch.push((line.partition, line.offset, line.next, record));
            }
        }
        if batch.is_empty() {
            if ledger_positions != positions {
                ledger.set_positions(&positions)?;
                ledger_positions = positions.clone();
            }
            if options.until_caught_up && source.caught_up() {
                summary.positions = positions;
                return Ok(summary);
            }
            sleep(POLL, stop);
            continue;
        }
        match deliver_batch(connected, &batch, &positions, &to, dead_letters) {
            Ok(Some(delivered)) => {
                failures = 0;
                summary.delivered += delivered.0;
                summary.failed += delivered.1;
                positions = to;
                // The database's positions are the truth; the ledger's
                // copy is for `tally deliver status`, written at most each
                // second.
                if noted.elapsed() >= Duration::from_secs(1) {
                    ledger.set_positions(&positions)?;
                    (ledger_positions, noted) = (positions.clone(), std::time::Instant::now());
                }
            }
            // The positions moved under us: read them back and go on.
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

/// Delivers one batch (moving the positions from `from` to `to`): whole,
/// or, when the table refuses one of its records, record by record with
/// the refused ones dead-lettered. The records delivered and
/// dead-lettered, or `None` when the positions were not `from`.
fn deliver_batch(
    target: &mut Target,
    batch: &[Read],
    from: &Positions,
    to: &Positions,
    dead_letters: &DeadLetters,
) -> Result<Option<(u64, u64)>, DbFailure> {
    let records: Vec<OutputRecord> =
        batch.iter().filter_map(|(_, _, _, record)| record.as_ref().ok().cloned()).collect();
    let malformed = batch.iter().filter(|(_, _, _, record)| record.is_err()).count() as u64;
    if malformed == 0 {
        match target.apply(&records, from, to) {
            Ok(true) => return Ok(Some((records.len() as u64, 0))),
            Ok(false) => return Ok(None),
            Err(DbFailure::RecordRefused(_)) => {}
            Err(other) => return Err(other),
        }
    }
    // One record (or dead letter) per transaction, each moving its
    // partition's position past itself.
    let (mut delivered, mut failed) = (0, 0);
    let mut at = from.clone();
    for (partition, offset, next, record) in batch {
        let mut past = at.clone();
        past.insert(*partition, *next);
        let refusal = match record {
            Ok(record) => match target.apply(std::slice::from_ref(record), &at, &past) {
                Ok(true) => {
                    delivered += 1;
                    at = past;
                    continue;
                }
                Ok(false) => return Ok(None),
                Err(DbFailure::RecordRefused(reason)) => {
                    (record.idempotency_key.clone(), format!("the table refused it: {reason}"))
                }
                Err(other) => return Err(other),
            },
            Err(reason) => (malformed_key(*partition, *offset), format!("malformed: {reason}")),
        };
        let letter = DeadLetter {
            idempotency_key: refusal.0,
            partition: *partition,
            offset: *offset,
            reason: refusal.1,
            status: None,
            attempts: 1,
            body: None,
        };
        dead_letters
            .write(&letter)
            .map_err(|err| DbFailure::Fatal(format!("cannot write a dead letter: {err}")))?;
        if !target.apply(&[], &at, &past)? {
            return Ok(None);
        }
        failed += 1;
        at = past;
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
