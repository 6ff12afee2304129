//! Carrying out a promotion, for `tally promote` and a served job's
//! promotion of its shadow alike: each delivery's switch planned from the
//! versions' committed outputs and its ledger ([`promote::SwitchPlanner`]),
//! written, then the job's live pointer; and, on the deliverer's side, a
//! switch left by a promotion finished before the new version's output is
//! read (see `docs/versions.md`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, bail};
use tally_deliver::ledger::Ledger;
use tally_deliver::settings::Target;
use tally_deliver::{DeliverSettings, RunOptions};

use crate::config::{JobConfig, Mode};
use crate::deliver_kafka::default_ledger_topic;
use crate::delivery::{committed_output, output_source};
use crate::diff::{Record, read_records};
use crate::promote::{self, Corrections, Delivered, Live, Switch, SwitchPlanner, SwitchTooLarge};
use crate::versions::Version;

/// A delivery to switch at a promotion.
pub struct DeliveryToSwitch {
    /// How messages name it (its file, or the served job's output).
    pub name: String,
    /// Its settings.
    pub settings: DeliverSettings,
}

/// What a promotion sends one delivery's receiver first.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SwitchSummary {
    /// The delivery, as [`DeliveryToSwitch::name`] names it.
    pub delivery: String,
    /// The version it delivered before.
    pub from: String,
    /// Correcting ADJUSTMENTs of values already billed.
    pub adjustments: usize,
    /// Records of keys never billed, sent as they are.
    pub never_billed: usize,
    /// Billed periods the new version has not written yet: their first
    /// record adjusts the billed value.
    pub waiting: usize,
}

/// Fills in what a delivery's settings leave to the job, from the job as
/// its file describes it (v1's names): a Kafka job's ledger topic and a
/// PostgreSQL delivery's name are the delivery's, whichever version it
/// reads.
pub fn settle_names(job: &JobConfig, settings: &mut DeliverSettings) {
    if matches!(job.mode, Mode::Kafka(_)) {
        settings
            .ledger_topic
            .get_or_insert_with(|| default_ledger_topic(&job.settings.name, &settings.output));
    }
    let default_name = format!("{}/{}", job.settings.name, settings.output);
    if let Target::Postgres(postgres) = &mut settings.target {
        postgres.delivery.get_or_insert(default_name);
    }
}

/// Makes `to` the live version of `job` (as its file describes it) and
/// gives each of `deliveries` its next switch, from the version it reads:
/// the switches first, each whole, then the live pointer (unless `to` is
/// live already), so a promotion cut short has not happened and running it
/// again plans the same switches. Nothing of the job may run meanwhile:
/// neither version, nor a deliverer. Refuses a PostgreSQL delivery, a
/// delivery that reads `to` already, and records in doubt.
pub fn promote(
    job: &JobConfig,
    to: Version,
    deliveries: Vec<DeliveryToSwitch>,
) -> anyhow::Result<Vec<SwitchSummary>> {
    let live = promote::live_version(job)?;
    let to_job = to.of(job);
    let view = tempfile::tempdir().context("creating a directory for views of the job's state")?;
    let reader = format!("tally-promote-{}-{}", job.settings.name, std::process::id());
    // Each output is read one record at a time into `take`: a promotion
    // holds what the switch needs, not the outputs.
    let read = |config: &JobConfig,
                output: &str,
                view: &Path,
                take: &mut dyn FnMut(Record) -> Result<(), SwitchTooLarge>| {
        let mut source =
            output_source(config, output, view, &format!("{reader}-{}", config.settings.name))?;
        read_records(source.as_mut(), |record| Ok(take(record)?))
            .with_context(|| format!("reading output {output:?} of {}", config.settings.name))
    };

    let mut switches = Vec::new();
    for (index, DeliveryToSwitch { name, mut settings }) in deliveries.into_iter().enumerate() {
        let reading = Version::parse(&promote::reading(&settings.state_dir)?)?;
        if reading == to {
            bail!("delivery {name} already reads {to}");
        }
        // A switch the live version's promotion left unfinished decides
        // what the receiver has: planning past it would send its records
        // again, or skip others.
        let unfinished = promote::read_next_switch(&settings.state_dir)?
            .filter(|next| next.to == live.to_string() && next.from == reading.to_string());
        if let Some(next) = unfinished {
            bail!(
                "delivery {name} has not finished its switch to {} yet (its corrections are not all delivered): let it catch up (`tally deliver --until-caught-up`), then promote",
                next.to
            );
        }
        settle_names(job, &mut settings);
        let from_job = reading.of(job);
        let (_, mirror) = committed_output(&from_job, &mut settings)?;
        let ledger_dir = settings.state_dir.join("ledger");
        let ledger = match mirror {
            Some(mirror) => Ledger::open_mirrored(&ledger_dir, mirror),
            None => Ledger::open(&ledger_dir),
        }
        .with_context(|| format!("opening delivery {name}'s ledger: stop its deliverer first"))?;
        let dead_letters = dead_letter_keys(&settings.dead_letters)?;
        let delivered = match &settings.target {
            // The database's positions are the truth: every record before
            // them is applied (or dead-lettered), none after.
            Target::Postgres(postgres) => Delivered {
                positions: tally_deliver::postgres::committed_positions(
                    postgres,
                    &postgres_delivery(&settings),
                )?,
                entries: HashMap::new(),
                dead_letters,
            },
            Target::Http(_) => Delivered {
                positions: ledger.positions()?,
                entries: ledger.entries()?.into_iter().collect(),
                dead_letters,
            },
        };
        promote::check_settled(&delivered, &name)?;
        let earlier = promote::read_switch(&settings.state_dir)?;
        let (from_name, to_name) = (reading.to_string(), to.to_string());
        let mut planner = SwitchPlanner::new((&from_name, &to_name), earlier.as_ref(), &delivered);
        let output = &settings.output;
        read(&from_job, output, &view.path().join(format!("old-{index}")), &mut |record| {
            planner.old(record)
        })
        .with_context(|| format!("planning delivery {name}'s switch"))?;
        let positions =
            read(&to_job, output, &view.path().join(format!("new-{index}")), &mut |record| {
                planner.new_record(record)
            })
            .with_context(|| format!("planning delivery {name}'s switch"))?;
        let switch = planner.finish(positions);
        // Held until the pointer is written: no deliverer starts meanwhile.
        switches.push((name, settings, switch, ledger));
    }
    for (_, settings, switch, _) in &switches {
        promote::write_whole(&promote::next_switch_path(&settings.state_dir), switch)?;
    }
    if to != live {
        let mut outputs = BTreeMap::new();
        for (index, output) in to_job.settings.outputs.iter().enumerate() {
            let positions =
                read(&to_job, output, &view.path().join(format!("end-{index}")), &mut |_| Ok(()))?;
            outputs.insert(output.clone(), positions);
        }
        let pointer = Live {
            version: to.to_string(),
            from: live.to_string(),
            promoted_at: jiff::Timestamp::now().to_string(),
            outputs,
        };
        promote::write_whole(&promote::live_path(job), &pointer)?;
    }
    Ok(switches
        .iter()
        .map(|(name, _, switch, _)| {
            let marker = format!("/promotion-{}", switch.number);
            let adjustments = switch
                .corrections
                .iter()
                .filter(|correction| correction.idempotency_key.ends_with(&marker))
                .count();
            SwitchSummary {
                delivery: name.clone(),
                from: switch.from.clone(),
                adjustments,
                never_billed: switch.corrections.len() - adjustments,
                waiting: switch.rebase.values().filter(|rebase| rebase.previous.is_some()).count(),
            }
        })
        .collect())
}

/// The idempotency keys in a delivery's dead-letter file (none if it has
/// none yet).
fn dead_letter_keys(path: &Path) -> anyhow::Result<HashSet<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(HashSet::new()),
        Err(err) => return Err(err).with_context(|| format!("reading `{}`", path.display())),
    };
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|line| line["idempotency_key"].as_str().map(str::to_string))
        .collect())
}

/// What a delivery reads, once a switch a promotion left is finished.
pub enum Reading {
    /// v1's output: it was never switched.
    Unswitched,
    /// The output of the switch's version, rebased as the switch says.
    Switched(Switch),
    /// Stopped while sending a switch's corrections: the next run goes on.
    Interrupted,
}

/// The switch delivery `name` of `job` (as its file describes it) reads
/// under. A switch a promotion left for the live version is finished
/// first: its corrections delivered (through the delivery's own ledger, as
/// partition [`promote::CORRECTIONS_PARTITION`]) until each is settled,
/// then the positions moved to where the new version's output starts, then
/// it becomes the delivery's switch. A switch left by a promotion that did
/// not happen (its version is not live) waits. `settings` gets the names
/// [`settle_names`] fills in.
pub fn finish_switch(
    name: &str,
    job: &JobConfig,
    settings: &mut DeliverSettings,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Reading> {
    settle_names(job, settings);
    let live = promote::live_version(job)?.to_string();
    let current = promote::read_switch(&settings.state_dir)?;
    let reading = current.as_ref().map_or("v1", |switch| switch.to.as_str()).to_string();
    if reading == live {
        return Ok(current.map_or(Reading::Unswitched, Reading::Switched));
    }
    let next = promote::read_next_switch(&settings.state_dir)?;
    let Some(switch) = next.filter(|next| next.to == live && next.from == reading) else {
        bail!(
            "job `{}` was promoted to {live}, and delivery {name} reads {reading} with no switch to {live}: promote {live} again naming this delivery, with its deliverer stopped",
            job.settings.name,
        );
    };
    // The corrections' entries are mirrored as the delivery's others are.
    let (_, mirror) = committed_output(&Version::parse(&switch.from)?.of(job), settings)?;
    let mut corrections = Corrections::new(&switch);
    if let Target::Postgres(postgres) = &settings.target {
        // The corrections and the new positions in one transaction.
        let records = corrections.records()?;
        tally_deliver::postgres::switch(
            postgres,
            &postgres_delivery(settings),
            &records,
            &switch.positions,
        )?;
        finish_positions(settings, mirror, &switch)?;
        tracing::info!(delivery = %name, %live, corrections = records.len(), "switched: the corrections are in the database; now delivering the live version's output");
        return Ok(Reading::Switched(switch));
    }
    let summary = tally_deliver::run(
        settings,
        &mut corrections,
        mirror.clone(),
        stop.clone(),
        RunOptions { until_caught_up: true },
    )?;
    if summary.unknown > 0 {
        bail!(
            "{} corrections of the switch to {live} wait as unknown: settle them (list them, check the receiver, resolve each), then the delivery goes on",
            summary.unknown,
        );
    }
    // A run caught up has every correction settled; one stopped not.
    let settled = summary.positions.get(&promote::CORRECTIONS_PARTITION).copied().unwrap_or(0);
    if settled < switch.corrections.len() as u64 {
        tracing::info!(delivery = %name, %live, "stopped while sending the corrections of a switch; the next run goes on");
        return Ok(Reading::Interrupted);
    }
    finish_positions(settings, mirror, &switch)?;
    tracing::info!(
        delivery = %name,
        %live,
        delivered = summary.delivered,
        dead_lettered = summary.failed,
        "switched: the corrections are delivered; now delivering the live version's output"
    );
    Ok(Reading::Switched(switch))
}

/// Moves the delivery's ledger to where `switch`'s version is read from,
/// then makes the switch its current one.
fn finish_positions(
    settings: &DeliverSettings,
    mirror: crate::delivery::MaybeMirror,
    switch: &Switch,
) -> anyhow::Result<()> {
    let ledger_dir = settings.state_dir.join("ledger");
    let ledger = match mirror {
        Some(mirror) => Ledger::open_mirrored(&ledger_dir, mirror)?,
        None => Ledger::open(&ledger_dir)?,
    };
    ledger.set_positions(&switch.positions)?;
    ledger.sync()?;
    ledger.mirror_flush()?;
    drop(ledger);
    promote::finish_switch(&settings.state_dir)
}

/// The name a PostgreSQL delivery's positions are kept under.
fn postgres_delivery(settings: &DeliverSettings) -> String {
    match &settings.target {
        Target::Postgres(postgres) => {
            postgres.delivery.clone().unwrap_or_else(|| settings.output.clone())
        }
        Target::Http(_) => settings.output.clone(),
    }
}

/// The live output a delivery reads after [`finish_switch`]: the switch's
/// version's (or v1's), its records of billed periods rebased as the
/// switch says; with its ledger's mirror.
pub fn live_output(
    job: &JobConfig,
    settings: &mut DeliverSettings,
    reading: &Reading,
) -> anyhow::Result<(Box<dyn tally_deliver::Source>, crate::delivery::MaybeMirror)> {
    let live = match reading {
        Reading::Switched(switch) => Version::parse(&switch.to)?.of(job),
        _ => job.clone(),
    };
    let (source, mirror) = committed_output(&live, settings)?;
    let source: Box<dyn tally_deliver::Source> = match reading {
        Reading::Switched(switch) if !switch.rebase.is_empty() => {
            Box::new(promote::Rebased { inner: source, rebase: switch.rebase.clone() })
        }
        _ => source,
    };
    Ok((source, mirror))
}
