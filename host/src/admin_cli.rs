//! The admin commands of the `tally` CLI: tables for people, `--json` for
//! scripts, over [`tally_host::client::AdminClient`] and the API's own
//! types (`tally_host::serve::wire`).

use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;
use tally_host::client::AdminClient;
use tally_host::serve::wire::{Deleted, JobStatus, PluginVersion, StateValue};

use crate::{Admin, AdminJobsCommand as JobsCommand};

fn client(admin: &Admin) -> AdminClient {
    AdminClient::new(&admin.server, admin.token.as_deref())
}

/// `tally jobs ...`
pub fn jobs(admin: &Admin, command: JobsCommand) -> anyhow::Result<()> {
    let client = client(admin);
    match command {
        JobsCommand::List { json } => {
            let jobs: Vec<JobStatus> = client.list()?;
            if json {
                return print_json(&jobs);
            }
            let rows: Vec<Vec<String>> = jobs
                .iter()
                .map(|job| {
                    vec![
                        job.name.clone(),
                        wire_name(&job.mode),
                        wire_name(&job.state),
                        short_digest(&job.plugin),
                        job.records.to_string(),
                        format!("{}/s", decimal(job.throughput)),
                        lag(job),
                    ]
                })
                .collect();
            print_table(&["JOB", "MODE", "STATE", "PLUGIN", "RECORDS", "THROUGHPUT", "LAG"], &rows);
            Ok(())
        }
        JobsCommand::Status { job, json } => print_status(&client.status(&job)?, json),
        JobsCommand::Replay { job, plugin, plugin_config, from, json } => start_shadow(
            admin,
            &job,
            (plugin.as_deref(), plugin_config.as_deref()),
            Some(&from),
            json,
        ),
        JobsCommand::Deploy { file, plugin, json } => {
            let (job_text, plugin_path) = deploy_parts(&file, plugin.as_deref())?;
            let bytes = std::fs::read(&plugin_path)
                .with_context(|| format!("cannot read plugin `{}`", plugin_path.display()))?;
            print_status(&client.deploy(&job_text, &bytes)?, json)
        }
        JobsCommand::Pause { job } => {
            client.pause::<JobStatus>(&job)?;
            println!("job `{job}` paused; everything it processed is committed");
            Ok(())
        }
        JobsCommand::Resume { job } => {
            client.resume::<JobStatus>(&job)?;
            println!("job `{job}` resumed");
            Ok(())
        }
        JobsCommand::Deliveries { job, file, json } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read `{}`", file.display()))?;
            print_status(&client.set_deliveries(&job, &text)?, json)
        }
        JobsCommand::Delete { job } => {
            client.delete::<Deleted>(&job)?;
            println!(
                "job `{job}` deleted (a Kafka job's topics and consumer group stay on the brokers)"
            );
            Ok(())
        }
    }
}

/// The job file without its `plugin` line, and the plugin to upload.
fn deploy_parts(
    file: &Path,
    plugin: Option<&Path>,
) -> anyhow::Result<(String, std::path::PathBuf)> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read job file `{}`", file.display()))?;
    let mut table: toml::Table = toml::from_str(&text)
        .with_context(|| format!("job file `{}` is not valid TOML", file.display()))?;
    let named = table.remove("plugin");
    let plugin = match (plugin, named) {
        (Some(plugin), _) => plugin.to_path_buf(),
        (None, Some(toml::Value::String(named))) => {
            file.parent().unwrap_or(Path::new(".")).join(named)
        }
        (None, _) => anyhow::bail!(
            "give the plugin with --plugin <file> (or as `plugin = \"...\"` in the job file)"
        ),
    };
    Ok((toml::to_string(&table)?, plugin))
}

/// `tally plugin push`
pub fn push(admin: &Admin, job: &str, file: &Path, json: bool) -> anyhow::Result<()> {
    let bytes =
        std::fs::read(file).with_context(|| format!("cannot read plugin `{}`", file.display()))?;
    let version: PluginVersion = client(admin).push(job, &bytes)?;
    if json {
        return print_json(&version);
    }
    println!(
        "pushed {} to `{job}`: it is swapped in at the next commit, and rolled back if it fails there",
        version.digest
    );
    println!("see how it went with `tally jobs status {job}` or `tally plugin history {job}`");
    Ok(())
}

/// `tally plugin push --shadow` and `tally jobs replay`: a shadow of the
/// job, running `plugin` (none: the job's own) from `from`.
pub fn start_shadow(
    admin: &Admin,
    job: &str,
    (plugin, plugin_config): (Option<&Path>, Option<&Path>),
    from: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let bytes = plugin
        .map(|file| {
            std::fs::read(file).with_context(|| format!("cannot read plugin `{}`", file.display()))
        })
        .transpose()?;
    let plugin_config = plugin_config
        .map(|path| {
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --plugin-config `{}`", path.display()))
        })
        .transpose()?;
    let status: JobStatus =
        client(admin).start_shadow(job, bytes.as_deref(), plugin_config.as_deref(), from)?;
    if json {
        return print_json(&status);
    }
    let version = status.shadow.as_ref().map_or("?", |shadow| shadow.version.as_str());
    println!(
        "started a shadow of `{job}` as {version}: it runs the job's input from {} into outputs of its own, never delivered",
        from.unwrap_or("the start")
    );
    println!(
        "see its running diff with `tally jobs status {job}`; make it live with `tally plugin promote {job}`, or stop it with `tally plugin discard {job}`"
    );
    Ok(())
}

/// `tally plugin discard`
pub fn discard(admin: &Admin, job: &str, json: bool) -> anyhow::Result<()> {
    let discarded: tally_host::serve::wire::Discarded = client(admin).discard_shadow(job)?;
    if json {
        return print_json(&discarded);
    }
    println!(
        "discarded the shadow of `{job}` ({}): its state and outputs are gone",
        discarded.discarded
    );
    Ok(())
}

/// `tally plugin promote`
pub fn promote(admin: &Admin, job: &str, json: bool) -> anyhow::Result<()> {
    let promoted: tally_host::serve::wire::Promoted = client(admin).promote_shadow(job)?;
    if json {
        return print_json(&promoted);
    }
    println!(
        "promoted the shadow of `{job}`: {} is live (was {}); its plugin is the job's",
        promoted.version, promoted.from
    );
    for delivery in &promoted.deliveries {
        println!(
            "delivery {} ({} to {}): {} correcting records for values already billed, {} records never billed, {} billed periods {} has not written yet (their first record adjusts the billed value); sent first",
            delivery.delivery,
            delivery.from,
            promoted.version,
            delivery.adjustments,
            delivery.never_billed,
            delivery.waiting,
            promoted.version
        );
    }
    Ok(())
}

/// `tally plugin history`
pub fn history(admin: &Admin, job: &str, json: bool) -> anyhow::Result<()> {
    let versions: Vec<PluginVersion> = client(admin).history(job)?;
    if json {
        return print_json(&versions);
    }
    let rows: Vec<Vec<String>> = versions
        .iter()
        .map(|version| {
            let reason = version.reason.clone().unwrap_or_default();
            vec![
                version.digest.clone(),
                version.size.to_string(),
                version.pushed_at.to_string(),
                wire_name(&version.status),
                reason,
            ]
        })
        .collect();
    print_table(&["DIGEST", "BYTES", "PUSHED (UNIX S)", "STATUS", "REASON"], &rows);
    Ok(())
}

/// `tally plugin rollback`
pub fn rollback(admin: &Admin, job: &str, json: bool) -> anyhow::Result<()> {
    let version: PluginVersion = client(admin).rollback(job)?;
    if json {
        return print_json(&version);
    }
    println!(
        "pushed the previous version {} to `{job}`: it is swapped in at the next commit",
        version.digest
    );
    Ok(())
}

/// `tally state get`
pub fn state_get(admin: &Admin, job: &str, key: &str, json: bool) -> anyhow::Result<()> {
    let value: StateValue = client(admin).state_get(job, key)?;
    if json {
        return print_json(&value);
    }
    // The plugin's own value: text as it is, other JSON as JSON.
    match &value.value {
        Value::String(text) => println!("{text}"),
        other => println!("{other}"),
    }
    Ok(())
}

fn print_status(status: &JobStatus, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(status);
    }
    let fields: [(&str, Option<String>); 20] = [
        ("name", Some(status.name.clone())),
        ("mode", Some(wire_name(&status.mode))),
        ("state", Some(wire_name(&status.state))),
        ("restore", status.restore.map(|restore| restore.to_string())),
        ("version", Some(status.output_version.clone()).filter(|version| !version.is_empty())),
        ("plugin", Some(status.plugin.clone())),
        ("pending_plugin", status.pending_plugin.clone()),
        ("on_trial", status.on_trial.clone()),
        ("records", Some(status.records.to_string())),
        ("throughput", Some(decimal(status.throughput))),
        ("commits", Some(status.commits.to_string())),
        ("rollbacks", Some(status.rollbacks.to_string())),
        ("cpu_seconds", Some(decimal(status.cpu_seconds))),
        ("traps", Some(status.traps.to_string())),
        ("cpu_budget_breaches", Some(status.cpu_budget_breaches.to_string())),
        ("log_lines_dropped", Some(status.log_lines_dropped.to_string())),
        ("demoted", Some(status.demoted.to_string())),
        ("last_plugin_failure", status.last_plugin_failure.clone()),
        ("last_swap", status.last_swap.clone()),
        ("last_error", status.last_error.clone()),
    ];
    for (field, value) in fields {
        if let Some(value) = value {
            println!("{:<15} {value}", format!("{field}:"));
        }
    }
    println!("{:<15} {}", "lag:", lag(status));
    if let Some(partitions) = &status.periods {
        let rows: Vec<Vec<String>> = partitions
            .iter()
            .map(|p| {
                vec![
                    p.partition.to_string(),
                    p.watermark.clone().unwrap_or_else(|| "-".into()),
                    p.effective_watermark.clone().unwrap_or_else(|| "-".into()),
                    p.idle.to_string(),
                    p.open_periods.to_string(),
                    p.seen_ids.to_string(),
                    format!("{}/{}", p.finals, p.adjustments),
                    format!("{}/{}", p.duplicates, p.conflicts),
                    format!("{}/{}", p.future, p.too_old),
                ]
            })
            .collect();
        println!();
        print_table(
            &[
                "PARTITION",
                "WATERMARK",
                "EFFECTIVE",
                "IDLE",
                "OPEN",
                "SEEN IDS",
                "FINAL/ADJ",
                "DUP/CONFLICT",
                "FUTURE/TOO OLD",
            ],
            &rows,
        );
    }
    if let Some(shadow) = &status.shadow {
        println!();
        println!(
            "shadow {} ({}): {}, {} records, plugin {}",
            shadow.version,
            wire_name(&shadow.state),
            shadow.lag.map_or("lag unknown".to_string(), |lag| format!("lag {lag}")),
            shadow.records,
            short_digest(&shadow.plugin)
        );
        if let Some(error) = &shadow.last_error {
            println!("  last error: {error}");
        }
        for diff in &shadow.diff {
            println!(
                "  output {}: equal {}, changed {}, only live {}, only shadow {} (read {} live and {} shadow records{})",
                diff.output,
                diff.equal,
                diff.changed,
                diff.only_live,
                diff.only_shadow,
                diff.live_records,
                diff.shadow_records,
                if diff.caught_up { ", caught up" } else { ", still reading" }
            );
            for changed in &diff.examples {
                let delta = changed
                    .delta
                    .as_ref()
                    .map_or(String::new(), |delta| format!("  delta {delta}"));
                println!(
                    "    changed {}  live {}  shadow {}{delta}",
                    changed.key, changed.live, changed.shadow
                );
            }
            if let Some(error) = &diff.error {
                println!("    {error}");
            }
        }
    }
    Ok(())
}

fn lag(status: &JobStatus) -> String {
    match status.lag {
        None => "-".into(),
        Some(lag) => format!("{lag} {}", wire_name(&status.lag_unit)),
    }
}

/// The name a value goes by in the API (`running`, `kafka`, `rolled_back`).
fn wire_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// A decimal as the API writes it (`0.0`, `12.5`).
fn decimal(value: f64) -> String {
    serde_json::Number::from_f64(value)
        .map_or_else(|| value.to_string(), |number| number.to_string())
}

fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn short_digest(digest: &str) -> String {
    digest.get(..19).unwrap_or(digest).to_string()
}
fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|header| header.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> =
            cells.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.iter().map(|header| header.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
    if rows.is_empty() {
        println!("(none)");
    }
}
