//! `tally deliver`: a job's committed outputs to a billing HTTP API,
//! effectively once, or into PostgreSQL exactly once (the `tally-deliver` crate), and the operator's view
//! of it: `status`, the records waiting as `unknown`, and `resolve`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use tally_deliver::ledger::Ledger;
use tally_deliver::resolve::{Inbox, Resolution, Verdict};
use tally_deliver::settings::Target;
use tally_deliver::{DeliverSettings, Positions, RunOptions};
use tally_host::config::{JobConfig, Mode};
use tally_host::deliver_kafka::default_ledger_topic;
use tally_host::delivery::committed_output;
use tally_host::promote::{self, Corrections, Rebased, Switch};
use tally_host::versions::Version;

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
            // The ledger's topic is the delivery's, whichever version it reads.
            if matches!(job.mode, Mode::Kafka(_)) {
                settings.ledger_topic.get_or_insert_with(|| {
                    default_ledger_topic(&job.settings.name, &settings.output)
                });
            }
            let stop = stop()?;
            let options = RunOptions { until_caught_up: args.until_caught_up };
            let Some(switch) = switched(&file, &job, &mut settings, &stop)? else {
                return Ok(());
            };
            let live = match &switch {
                Some(switch) => Version::parse(&switch.to)?.of(&job),
                None => job.clone(),
            };
            let (mut source, mirror) = committed_output(&live, &mut settings)?;
            let summary = match &switch {
                Some(switch) if !switch.rebase.is_empty() => {
                    let mut rebased = Rebased { inner: source.as_mut(), rebase: &switch.rebase };
                    tally_deliver::run(&settings, &mut rebased, mirror, stop, options)?
                }
                _ => tally_deliver::run(&settings, source.as_mut(), mirror, stop, options)?,
            };
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

/// The switch this delivery reads under: `Ok(Some(None))` for a delivery
/// of v1 never switched, `Ok(Some(Some(switch)))` after a promotion,
/// `Ok(None)` when stopped while finishing a switch. A switch a promotion
/// left for the live version is finished first: its corrections delivered
/// (through the delivery's own ledger, as partition
/// [`promote::CORRECTIONS_PARTITION`]) until each is settled, then the
/// positions moved to where the new version's output starts, then it
/// becomes the delivery's switch. A switch left by a promotion that did
/// not happen (its version is not live) waits.
fn switched(
    file: &Path,
    job: &JobConfig,
    settings: &mut DeliverSettings,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Option<Option<Switch>>> {
    let live = promote::live_version(job)?.to_string();
    let current = promote::read_switch(&settings.state_dir)?;
    let reading = current.as_ref().map_or("v1", |switch| switch.to.as_str()).to_string();
    if reading == live {
        return Ok(Some(current));
    }
    let next = promote::read_next_switch(&settings.state_dir)?;
    let Some(switch) = next.filter(|next| next.to == live && next.from == reading) else {
        bail!(
            "job `{}` was promoted to {live}, and this delivery reads {reading} with no switch to {live}: run `tally promote {} --version {live} --deliver {}` with the deliverer stopped",
            job.settings.name,
            settings.job.display(),
            file.display()
        );
    };
    if matches!(settings.target, Target::Postgres(_)) {
        bail!("this build switches HTTP deliveries only");
    }
    // The corrections' entries are mirrored as the delivery's others are.
    let (_, mirror) = committed_output(&Version::parse(&switch.from)?.of(job), settings)?;
    let mut corrections = Corrections::new(&switch);
    let summary = tally_deliver::run(
        settings,
        &mut corrections,
        mirror.clone(),
        stop.clone(),
        RunOptions { until_caught_up: true },
    )?;
    if summary.unknown > 0 {
        bail!(
            "{} corrections of the switch to {live} wait as unknown: settle them (`tally deliver unknown {}`, then `tally deliver resolve`), then run again",
            summary.unknown,
            file.display()
        );
    }
    // A run caught up has every correction settled; one stopped by a signal not.
    let settled = summary.positions.get(&promote::CORRECTIONS_PARTITION).copied().unwrap_or(0);
    if settled < switch.corrections.len() as u64 {
        println!(
            "stopped while sending the corrections of the switch to {live}; the next run goes on"
        );
        return Ok(None);
    }
    let ledger_dir = settings.state_dir.join("ledger");
    let ledger = match mirror {
        Some(mirror) => Ledger::open_mirrored(&ledger_dir, mirror)?,
        None => Ledger::open(&ledger_dir)?,
    };
    ledger.set_positions(&switch.positions)?;
    ledger.sync()?;
    ledger.mirror_flush()?;
    drop(ledger);
    promote::finish_switch(&settings.state_dir)?;
    println!(
        "switched to {live}: {} corrections delivered, dead-lettered {}; now delivering {live}'s output",
        summary.delivered, summary.failed
    );
    Ok(Some(Some(switch)))
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
