//! The admin commands of the `tally` CLI: tables for people, `--json` for
//! scripts, over [`tally_host::client::AdminClient`].

use std::path::Path;

use anyhow::Context;
use serde_json::Value;
use tally_host::client::AdminClient;

use crate::{Admin, AdminJobsCommand as JobsCommand};

fn client(admin: &Admin) -> AdminClient {
    AdminClient::new(&admin.server, admin.token.as_deref())
}

/// `tally jobs ...`
pub fn jobs(admin: &Admin, command: JobsCommand) -> anyhow::Result<()> {
    let client = client(admin);
    match command {
        JobsCommand::List { json } => {
            let jobs = client.list()?;
            if json {
                return print_json(&jobs);
            }
            let rows: Vec<Vec<String>> = as_array(&jobs)
                .iter()
                .map(|job| {
                    vec![
                        text(&job["name"]),
                        text(&job["mode"]),
                        text(&job["state"]),
                        short_digest(&text(&job["plugin"])),
                        text(&job["records"]),
                        format!("{}/s", text(&job["throughput"])),
                        lag(job),
                    ]
                })
                .collect();
            print_table(&["JOB", "MODE", "STATE", "PLUGIN", "RECORDS", "THROUGHPUT", "LAG"], &rows);
            Ok(())
        }
        JobsCommand::Status { job, json } => print_status(&client.status(&job)?, json),
        JobsCommand::Deploy { file, plugin, json } => {
            let (job_text, plugin_path) = deploy_parts(&file, plugin.as_deref())?;
            let bytes = std::fs::read(&plugin_path).with_context(|| format!("cannot read plugin `{}`", plugin_path.display()))?;
            print_status(&client.deploy(&job_text, &bytes)?, json)
        }
        JobsCommand::Pause { job } => {
            client.pause(&job)?;
            println!("job `{job}` paused; everything it processed is committed");
            Ok(())
        }
        JobsCommand::Resume { job } => {
            client.resume(&job)?;
            println!("job `{job}` resumed");
            Ok(())
        }
        JobsCommand::Delete { job } => {
            client.delete(&job)?;
            println!("job `{job}` deleted (a Kafka job's topics and consumer group stay on the brokers)");
            Ok(())
        }
    }
}

/// The job file without its `plugin` line, and the plugin to upload.
fn deploy_parts(file: &Path, plugin: Option<&Path>) -> anyhow::Result<(String, std::path::PathBuf)> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read job file `{}`", file.display()))?;
    let mut table: toml::Table = toml::from_str(&text).with_context(|| format!("job file `{}` is not valid TOML", file.display()))?;
    let named = table.remove("plugin");
    let plugin = match (plugin, named) {
        (Some(plugin), _) => plugin.to_path_buf(),
        (None, Some(toml::Value::String(named))) => file.parent().unwrap_or(Path::new(".")).join(named),
        (None, _) => anyhow::bail!("give the plugin with --plugin <file> (or as `plugin = \"...\"` in the job file)"),
    };
    Ok((toml::to_string(&table)?, plugin))
}

/// `tally plugin push`
pub fn push(admin: &Admin, job: &str, file: &Path, json: bool) -> anyhow::Result<()> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read plugin `{}`", file.display()))?;
    let version = client(admin).push(job, &bytes)?;
    if json {
        return print_json(&version);
    }
    println!("pushed {} to `{job}`: it is swapped in at the next commit, and rolled back if it fails there", text(&version["digest"]));
    println!("see how it went with `tally jobs status {job}` or `tally plugin history {job}`");
    Ok(())
}

/// `tally plugin history`
pub fn history(admin: &Admin, job: &str, json: bool) -> anyhow::Result<()> {
    let versions = client(admin).history(job)?;
    if json {
        return print_json(&versions);
    }
    let rows: Vec<Vec<String>> = as_array(&versions)
        .iter()
        .map(|version| {
            vec![text(&version["digest"]), text(&version["size"]), text(&version["pushed_at"]), text(&version["status"]), text(&version["reason"])]
        })
        .collect();
    print_table(&["DIGEST", "BYTES", "PUSHED (UNIX S)", "STATUS", "REASON"], &rows);
    Ok(())
}

/// `tally plugin rollback`
pub fn rollback(admin: &Admin, job: &str, json: bool) -> anyhow::Result<()> {
    let version = client(admin).rollback(job)?;
    if json {
        return print_json(&version);
    }
    println!("pushed the previous version {} to `{job}`: it is swapped in at the next commit", text(&version["digest"]));
    Ok(())
}

/// `tally state get`
pub fn state_get(admin: &Admin, job: &str, key: &str, json: bool) -> anyhow::Result<()> {
    let value = client(admin).state_get(job, key)?;
    if json {
        return print_json(&value);
    }
    println!("{}", text(&value["value"]));
    Ok(())
}

fn print_status(status: &Value, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(status);
    }
    let fields = [
        "name", "mode", "state", "plugin", "pending_plugin", "on_trial", "records", "throughput", "commits", "rollbacks", "cpu_seconds",
        "traps", "cpu_budget_breaches", "log_lines_dropped", "demoted", "last_plugin_failure", "last_swap", "last_error",
    ];
    for field in fields {
        let value = &status[field];
        if !value.is_null() {
            println!("{:<15} {}", format!("{field}:"), text(value));
        }
    }
    println!("{:<15} {}", "lag:", lag(status));
    Ok(())
}

fn lag(status: &Value) -> String {
    match &status["lag"] {
        Value::Null => "-".into(),
        lag => format!("{} {}", text(lag), text(&status["lag_unit"])),
    }
}

fn print_json(value: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn as_array(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
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
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
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
