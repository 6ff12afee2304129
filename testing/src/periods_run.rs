//! A period plugin run through the real host: [`PeriodsRun`] builds the
//! plugin, and each [`PeriodsRun::send`] appends events to a local-mode
//! job's input and runs `tally run` on it, so a test sees the FINAL and
//! ADJUSTMENT records exactly as the host emits them (time zones, DST,
//! grace, versions). The job's state persists from one send to the next: a
//! later send is a later run of the same job, and at the end of each run,
//! every input read to its end, the host closes what the watermark passed.
//!
//! ```no_run
//! use tally_testing::PeriodsRun;
//!
//! let mut run = PeriodsRun::build(
//!     env!("CARGO_MANIFEST_DIR"),
//!     r#"time_zones = { acme = "America/New_York" }"#,
//!     r#"meters = { calls = "sum" }"#,
//! )
//! .unwrap();
//! let sent = run
//!     .send([
//!         r#"{"id":"1","customer":"acme","metric":"calls","quantity":5,"ts":"2026-11-03T10:00:00Z"}"#,
//!         r#"{"id":"2","customer":"acme","metric":"calls","quantity":1,"ts":"2026-12-05T10:00:00Z"}"#,
//!     ])
//!     .unwrap();
//! assert_eq!(sent.records[0].kind, "final");
//! assert_eq!(sent.records[0].value, 5);
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::{DriverError, Rejected};

/// Where the driver finds `tally`: this variable, else `PATH`.
pub const TALLY_BIN: &str = "TALLY_BIN";

/// A period plugin's job, run by the `tally` binary in a directory of its
/// own (removed when the run is dropped).
pub struct PeriodsRun {
    dir: tempfile::TempDir,
    tally: PathBuf,
    records_read: usize,
    dead_letters_read: usize,
}

/// What one [`PeriodsRun::send`] added to the job's outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeriodsSent {
    /// The FINAL and ADJUSTMENT records, in the order the host wrote them.
    pub records: Vec<PeriodRecord>,
    /// The dead letters (offset within all the events sent so far).
    pub dead_letters: Vec<Rejected>,
}

/// One FINAL or ADJUSTMENT record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeriodRecord {
    /// `"final"` or `"adjustment"`.
    pub kind: String,
    /// The customer whose time zone the period is in.
    pub customer: String,
    /// The period's name (`2026-11`).
    pub period: String,
    /// Its first instant (UTC, RFC 3339).
    pub start: String,
    /// Its end (UTC, RFC 3339, exclusive).
    pub end: String,
    /// The period's value.
    pub value: u64,
    /// 1 for the FINAL, then one more per ADJUSTMENT.
    pub version: u64,
    /// An ADJUSTMENT's previous value.
    pub previous: Option<u64>,
    /// An ADJUSTMENT's change (`value - previous`).
    pub delta: Option<i128>,
    /// The whole record, as the host wrote it.
    pub fields: Value,
}

impl PeriodsRun {
    /// Builds the plugin crate at `crate_dir` and sets up its job, whose
    /// `[periods]` and `[plugin_config]` tables are the TOML texts given.
    pub fn build(
        crate_dir: impl AsRef<Path>,
        periods: &str,
        plugin_config: &str,
    ) -> Result<PeriodsRun, DriverError> {
        let tally = find_tally()?;
        let dir = tempfile::tempdir()
            .map_err(|err| DriverError::Run(format!("a temporary directory: {err}")))?;
        let crate_dir = crate_dir.as_ref();
        let target_dir = tally_plugin_build::default_target_dir(crate_dir);
        let component = tally_plugin_build::build_crate(crate_dir, &target_dir)?.component;
        std::fs::copy(&component, dir.path().join("plugin.wasm"))
            .map_err(|err| DriverError::Run(format!("copying {}: {err}", component.display())))?;
        let job = format!(
            "name = \"test\"\nplugin = \"plugin.wasm\"\noutputs = [\"periods\"]\n\
             [local]\ninputs = [\"events.ndjson\"]\noutput_dir = \"out\"\nstate_dir = \"state\"\n\
             [periods]\n{periods}\n[plugin_config]\n{plugin_config}\n"
        );
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text)
                .map_err(|err| DriverError::Run(format!("writing {name}: {err}")))
        };
        write("job.toml", &job)?;
        write("events.ndjson", "")?;
        Ok(PeriodsRun { dir, tally, records_read: 0, dead_letters_read: 0 })
    }

    /// Appends `lines` (NDJSON events) to the job's input, runs the job to
    /// the end of it, and returns what this run added to its outputs.
    pub fn send<I: AsRef<str>>(
        &mut self,
        lines: impl IntoIterator<Item = I>,
    ) -> Result<PeriodsSent, DriverError> {
        let events = self.dir.path().join("events.ndjson");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&events)
            .map_err(|err| DriverError::Run(format!("opening events.ndjson: {err}")))?;
        for line in lines {
            let line = line.as_ref();
            if line.contains('\n') {
                return Err(DriverError::Run(format!("an event is one line: {line:?}")));
            }
            writeln!(file, "{line}")
                .map_err(|err| DriverError::Run(format!("writing events.ndjson: {err}")))?;
        }
        drop(file);
        let output = Command::new(&self.tally)
            .args(["run", "job.toml"])
            .current_dir(self.dir.path())
            .output()
            .map_err(|err| DriverError::Run(format!("running {}: {err}", self.tally.display())))?;
        if !output.status.success() {
            return Err(DriverError::Run(format!(
                "`tally run` failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        let records =
            new_lines(&self.dir.path().join("out/periods.ndjson"), &mut self.records_read)?
                .iter()
                .map(period_record)
                .collect::<Result<_, _>>()?;
        let dead_letters = new_lines(
            &self.dir.path().join("out/dead-letters.ndjson"),
            &mut self.dead_letters_read,
        )?
        .iter()
        .map(|line| {
            Ok(Rejected {
                offset: line["source"]["offset"].as_u64().ok_or_else(|| unexpected(line))?,
                reason: line["reason"].as_str().ok_or_else(|| unexpected(line))?.to_string(),
            })
        })
        .collect::<Result<_, DriverError>>()?;
        Ok(PeriodsSent { records, dead_letters })
    }

    /// The directory the job runs in (its `job.toml`, `events.ndjson`,
    /// `out/` and `state/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// `$TALLY_BIN`, else `tally` on `PATH`.
fn find_tally() -> Result<PathBuf, DriverError> {
    if let Some(tally) = std::env::var_os(TALLY_BIN) {
        return Ok(PathBuf::from(tally));
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("tally"))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            DriverError::Run(format!(
                "no `tally` binary: set {TALLY_BIN} to one, or put it on PATH \
                 (`cargo install --path host` in the Tally source tree)"
            ))
        })
}

/// The lines of the NDJSON file at `path` past the first `*read`, as JSON.
fn new_lines(path: &Path, read: &mut usize) -> Result<Vec<Value>, DriverError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(err) => return Err(DriverError::Run(format!("reading {}: {err}", path.display()))),
    };
    let lines: Vec<Value> = text
        .lines()
        .skip(*read)
        .map(|line| {
            serde_json::from_str(line).map_err(|err| {
                DriverError::Run(format!("{} holds a line that is not JSON: {err}", path.display()))
            })
        })
        .collect::<Result<_, _>>()?;
    *read += lines.len();
    Ok(lines)
}

/// A line of `periods.ndjson` as a [`PeriodRecord`].
fn period_record(line: &Value) -> Result<PeriodRecord, DriverError> {
    let fields = &line["value"];
    let text =
        |name: &str| fields[name].as_str().map(str::to_string).ok_or_else(|| unexpected(line));
    let number = |name: &str| fields[name].as_u64().ok_or_else(|| unexpected(line));
    let value = number("value")?;
    let previous = match fields["type"] == "adjustment" {
        true => Some(number("previous")?),
        false => None,
    };
    Ok(PeriodRecord {
        kind: text("type")?,
        customer: text("customer")?,
        period: text("period")?,
        start: text("start")?,
        end: text("end")?,
        value,
        version: number("version")?,
        previous,
        // What the host writes as `delta` (which may pass i64's range).
        delta: previous.map(|previous| i128::from(value) - i128::from(previous)),
        fields: fields.clone(),
    })
}

fn unexpected(line: &Value) -> DriverError {
    DriverError::Run(format!("the host wrote a record the driver does not know: {line}"))
}
