//! `tally replay`, `tally diff` and `tally versions`: a job's history run
//! again into a version of its own, two versions' outputs compared, and
//! the versions a job has (see `docs/versions.md`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, bail};
use clap::Args;
use tally_core::lock::DirLock;
use tally_deliver::DeliverSettings;
use tally_host::config::{JobConfig, Mode, plugin_config_json};
use tally_host::delivery::output_source;
use tally_host::diff::{compare, read_values};
use tally_host::promote;
use tally_host::promotion::{self, DeliveryToSwitch};
use tally_host::replay_start;
use tally_host::versions::Version;

/// `tally replay`'s arguments.
#[derive(Args)]
pub struct ReplayArgs {
    /// The job file (TOML).
    job: PathBuf,
    /// The version to replay into: v2 or later (v1 is the live one).
    #[arg(long)]
    version: String,
    /// Where the replay starts: `earliest` (every input from its start),
    /// an RFC 3339 time or offsets (`0:1200,1:980`); the last two for
    /// Kafka inputs, when the version first runs.
    #[arg(long, default_value = "earliest")]
    from: String,
    /// The plugin the version runs (default: the job's own).
    #[arg(long)]
    plugin: Option<PathBuf>,
    /// A TOML file whose table the version's period plugin gets instead of
    /// the job's `[plugin_config]` (a meter defined anew, say).
    #[arg(long)]
    plugin_config: Option<PathBuf>,
}

/// `tally diff`'s arguments.
#[derive(Args)]
pub struct DiffArgs {
    /// The job file (TOML).
    job: PathBuf,
    /// The first version (`v1`).
    a: String,
    /// The second version (`v2`).
    b: String,
    /// The output compared (default: the job's first).
    #[arg(long)]
    output: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `tally versions`' arguments.
#[derive(Args)]
pub struct VersionsArgs {
    /// The job file (TOML).
    job: PathBuf,
    /// Print JSON lines instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `tally replay`: the job's logic from `--from` into the version's
/// own state and outputs, beside the live version, to the end of what its
/// inputs hold now.
pub fn replay(args: ReplayArgs, stop: &Arc<AtomicBool>) -> anyhow::Result<()> {
    let job = JobConfig::from_file(&args.job)?;
    let version = Version::parse(&args.version)?;
    if version == Version::LIVE {
        bail!(
            "v1 is the live version: a replay into it would process its history twice; replay into --version v2 or later"
        );
    }
    if version == promote::live_version(&job)? {
        bail!(
            "{version} is the live version (promoted): a replay into it would process its history twice; replay into another version"
        );
    }
    let mut replayed = version.of(&job);
    if let Some(plugin) = args.plugin {
        replayed.settings.plugin = plugin;
    }
    if let Some(path) = &args.plugin_config {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --plugin-config `{}`", path.display()))?;
        let table: toml::Table = toml::from_str(&text)
            .with_context(|| format!("--plugin-config `{}` is not TOML", path.display()))?;
        replayed.settings.plugin_config = Some(plugin_config_json(&table)?);
        replayed.validate()?;
    }
    let start = match &replayed.mode {
        Mode::Kafka(kafka) => replay_start::parse(&args.from, &kafka.inputs)?,
        Mode::Local(_) if args.from == "earliest" => None,
        Mode::Local(_) => {
            // A start that is not even well formed says so first (one
            // input stands in for the files: only the form is checked).
            replay_start::parse(&args.from, &["input".to_string()])?;
            bail!(
                "--from {:?}: a local job's input lines carry no Kafka timestamps or offsets to start at; replay it from \
             earliest (a period job's rules place each event by its own time either way)",
                args.from
            )
        }
    };
    eprintln!("replaying job `{}` from {} into {version}", job.settings.name, args.from);
    let kafka = matches!(replayed.mode, Mode::Kafka(_));
    crate::run_config(&replayed, None, kafka, start.as_ref(), stop)
}

/// Runs `tally diff`.
pub fn diff(args: DiffArgs) -> anyhow::Result<()> {
    let job = JobConfig::from_file(&args.job)?;
    let (a, b) = (Version::parse(&args.a)?, Version::parse(&args.b)?);
    let output = args.output.unwrap_or_else(|| job.settings.outputs[0].clone());
    let read = |version: Version| -> anyhow::Result<_> {
        let config = version.of(&job);
        let view =
            tempfile::tempdir().context("creating a directory for a view of the job's state")?;
        let reader = format!("tally-diff-{}-{}", config.settings.name, std::process::id());
        let mut source = output_source(&config, &output, view.path(), &reader)?;
        read_values(source.as_mut())
            .with_context(|| format!("reading {version} of output {output:?}"))
    };
    let diff = compare(&output, (&a.to_string(), read(a)?), (&b.to_string(), read(b)?));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&diff)?);
    } else {
        print!("{}", diff.render());
    }
    Ok(())
}

/// Runs `tally versions`: each version with state on disk, where its
/// outputs go and how far each is committed.
pub fn versions(args: VersionsArgs) -> anyhow::Result<()> {
    let job = JobConfig::from_file(&args.job)?;
    let versions = Version::on_disk(&job);
    let live = promote::live_version(&job)?;
    if versions.is_empty() && !args.json {
        println!("job `{}` has not run yet: no version has state", job.settings.name);
    }
    for version in versions {
        let config = version.of(&job);
        let mut outputs = serde_json::Map::new();
        for output in &config.settings.outputs {
            let view = tempfile::tempdir()?;
            let reader = format!("tally-versions-{}-{}", config.settings.name, std::process::id());
            let mut source = output_source(&config, output, view.path(), &reader)?;
            let values = read_values(source.as_mut())?;
            outputs.insert(
                output.clone(),
                serde_json::json!({"records": values.records, "keys": values.values.len(), "positions": values.positions}),
            );
        }
        let line = serde_json::json!({
            "version": version.to_string(),
            "name": config.settings.name,
            "live": version == live,
            "outputs": outputs,
        });
        if args.json {
            println!("{line}");
        } else {
            let shown: Vec<String> = outputs
                .iter()
                .map(|(name, output)| {
                    format!("{name}: {} records, {} keys", output["records"], output["keys"])
                })
                .collect();
            let marker = if version == live { " (live)" } else { "" };
            println!("{version}{marker}  {}  {}", config.settings.name, shown.join("; "));
        }
    }
    Ok(())
}

/// `tally promote`'s arguments.
#[derive(Args)]
pub struct PromoteArgs {
    /// The job file (TOML).
    job: PathBuf,
    /// The version that becomes live (`v2`).
    #[arg(long)]
    version: String,
    /// A delivery file of the job's output (repeat for each delivery): it
    /// switches with the promotion.
    #[arg(long = "deliver")]
    deliveries: Vec<PathBuf>,
}

/// Runs `tally promote`: the version becomes live, and each delivery named
/// gets its next switch, from the version it reads (see
/// `tally_host::promotion`). Neither version may run meanwhile, nor the
/// deliveries. Promoting the live version again switches the deliveries
/// named that still read an older one.
pub fn promote(args: PromoteArgs) -> anyhow::Result<()> {
    let job = JobConfig::from_file(&args.job)?;
    let name = &job.settings.name;
    let to = Version::parse(&args.version)?;
    let live = promote::live_version(&job)?;
    if to == live && args.deliveries.is_empty() {
        bail!(
            "{to} is already the live version of job `{name}`; name a delivery that still reads an older version with --deliver to switch it"
        );
    }
    if !Version::on_disk(&job).contains(&to) {
        bail!(
            "{to} of job `{name}` has no state: replay into it first (`tally replay {} --version {to}`)",
            args.job.display()
        );
    }
    // Each delivery: the version it reads now, checked before anything is read.
    let mut deliveries = Vec::new();
    let mut versions = vec![live, to];
    for file in &args.deliveries {
        let settings = DeliverSettings::from_file(file)?;
        if settings.job.canonicalize().ok() != args.job.canonicalize().ok() {
            bail!(
                "delivery `{}` delivers job `{}`, not `{}`",
                file.display(),
                settings.job.display(),
                args.job.display()
            );
        }
        versions.push(Version::parse(&promote::reading(&settings.state_dir)?)?);
        deliveries.push(DeliveryToSwitch { name: format!("`{}`", file.display()), settings });
    }
    // No version read runs meanwhile: their outputs stand still.
    versions.sort();
    versions.dedup();
    let mut locks = Vec::new();
    for version in versions {
        let lock = DirLock::acquire(state_dir(&version.of(&job))).with_context(|| {
            format!(
                "{version} of job `{name}` is running: stop it (or its replay) before the promotion"
            )
        })?;
        locks.push(lock);
    }
    let summaries = promotion::promote(&job, to, deliveries)?;
    if to != live {
        println!(
            "job `{name}`: {to} is live (was {live}); `tally run {}` runs it",
            args.job.display()
        );
    }
    for summary in &summaries {
        println!(
            "delivery {} ({} to {to}): {} correcting records for values already billed, {} records never billed, \
             {} billed periods {to} has not written yet (their first record will adjust the billed value); \
             `tally deliver {}` sends them first",
            summary.delivery,
            summary.from,
            summary.adjustments,
            summary.never_billed,
            summary.waiting,
            summary.delivery.trim_matches('`'),
        );
    }
    Ok(())
}

/// Where `job` keeps its state.
fn state_dir(job: &JobConfig) -> &std::path::Path {
    match &job.mode {
        Mode::Local(local) => &local.state_dir,
        Mode::Kafka(kafka) => &kafka.state_dir,
    }
}
