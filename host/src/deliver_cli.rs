//! `tally deliver`: a job's committed outputs to a billing HTTP API,
//! effectively once, or into PostgreSQL exactly once (the `tally-deliver` crate), and the operator's view
//! of it: `status`, the records waiting as `unknown`, and `resolve`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use clap::{Args, Subcommand};
use tally_deliver::resolve::{Inbox, Resolution, Verdict};
use tally_deliver::{DeliverSettings, Positions, RunOptions};
use tally_host::config::JobConfig;
use tally_host::promotion::{self, Reading};

/// `tally deliver`'s arguments.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct DeliverArgs {
    /// The delivery file (TOML): the job, its output, the target.
    #[arg(required = true)]
    file: Option<PathBuf>,
    /// Stop once every committed record is delivered, dead-lettered or
    /// waiting as `unknown`, instead of following the job's output.
    #[arg(long)]
    until_caught_up: bool,
    #[command(subcommand)]
    command: Option<DeliverCommand>,
}

#[derive(Subcommand)]
enum DeliverCommand {
    /// Records delivered, retrying, unknown and failed; the oldest one not settled; latencies.
    Status {
        /// The delivery file.
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the records waiting as `unknown` for an operator.
    Unknown {
        /// The delivery file.
        file: PathBuf,
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Settle a record waiting as `unknown`, after checking the receiver.
    ///
    /// Example: tally deliver resolve deliver.toml 'billing/customer=acme/…/v1' --applied
    #[command(verbatim_doc_comment)]
    Resolve {
        /// The delivery file.
        file: PathBuf,
        /// The record's idempotency key (see `tally deliver unknown`).
        key: String,
        /// The receiver applied it: it counts as delivered.
        #[arg(long, conflicts_with = "not_applied", required_unless_present = "not_applied")]
        applied: bool,
        /// The receiver never applied it: send it again.
        #[arg(long)]
        not_applied: bool,
    },
}

/// Runs `tally deliver …`.
pub fn deliver(
    args: DeliverArgs,
    stop: impl FnOnce() -> anyhow::Result<Arc<AtomicBool>>,
) -> anyhow::Result<()> {
    match args.command {
        Some(DeliverCommand::Status { file, json }) => status(&file, json),
        Some(DeliverCommand::Unknown { file, json }) => unknown(&file, json),
        Some(DeliverCommand::Resolve { file, key, applied, not_applied: _ }) => {
            let settings = DeliverSettings::from_file(&file)?;
            let verdict = if applied { Verdict::Applied } else { Verdict::NotApplied };
            let path =
                Inbox::new(&settings.state_dir).put(&Resolution { key: key.clone(), verdict })?;
            println!(
                "{key}: {} — queued in {}; the deliverer applies it within a second, or when it next starts",
                if applied { "applied" } else { "not applied, to be sent again" },
                path.display()
            );
            Ok(())
        }
        None => {
            let file = args.file.context("give the delivery file")?;
            let mut settings = DeliverSettings::from_file(&file)?;
            let job = JobConfig::from_file(&settings.job).with_context(|| {
                format!("reading the job of this delivery, `{}`", settings.job.display())
            })?;
            let stop = stop()?;
            let options = RunOptions { until_caught_up: args.until_caught_up };
            let name = format!("`{}`", file.display());
            let reading = promotion::finish_switch(&name, &job, &mut settings, &stop)?;
            if let Reading::Interrupted = reading {
                println!("stopped while sending the corrections of a switch; the next run goes on");
                return Ok(());
            }
            let (mut source, mirror) = promotion::live_output(&job, &mut settings, &reading)?;
            let summary = tally_deliver::run(&settings, source.as_mut(), mirror, stop, options)?;
            println!(
                "delivered {}, dead-lettered {}, waiting as unknown {}; positions {}",
                summary.delivered,
                summary.failed,
                summary.unknown,
                show_positions(&summary.positions)
            );
            Ok(())
        }
    }
}

/// Positions as `partition:offset`, in partition order.
fn show_positions(positions: &Positions) -> String {
    if positions.is_empty() {
        return "-".into();
    }
    let shown: Vec<String> =
        positions.iter().map(|(partition, offset)| format!("{partition}:{offset}")).collect();
    shown.join(" ")
}

fn status(file: &Path, json: bool) -> anyhow::Result<()> {
    let settings = DeliverSettings::from_file(file)?;
    let (status, _) = tally_deliver::status::status(&settings.state_dir)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(());
    }
    println!("positions  {}", show_positions(&status.positions));
    println!("delivered  {}", status.delivered);
    println!("retrying   {}", status.retrying);
    println!("unknown    {}", status.unknown);
    println!("failed     {} (dead letters: {})", status.failed, settings.dead_letters.display());
    match status.oldest_unsettled_age_s {
        Some(age) => println!("oldest not settled  {age} s"),
        None => println!("oldest not settled  -"),
    }
    if let Some(stats) = &status.stats {
        println!(
            "latency    p50 {} ms, p99 {} ms (first request to delivery)",
            stats.latency_p50_ms, stats.latency_p99_ms
        );
    }
    Ok(())
}

fn unknown(file: &Path, json: bool) -> anyhow::Result<()> {
    let settings = DeliverSettings::from_file(file)?;
    let (_, unknown) = tally_deliver::status::status(&settings.state_dir)?;
    for record in &unknown {
        if json {
            println!("{}", serde_json::to_string(record)?);
        } else {
            let first = jiff::Timestamp::from_millisecond(record.entry.first_attempt_ms)
                .map(|at| at.to_string())
                .unwrap_or_default();
            println!(
                "{}  partition {} offset {}  {} attempts since {first}  last: {}",
                record.key,
                record.entry.partition,
                record.entry.offset,
                record.entry.attempts,
                record.entry.last_error.as_deref().unwrap_or("-")
            );
        }
    }
    if unknown.is_empty() && !json {
        println!("no record waits as unknown");
    }
    Ok(())
}
