//! `tally replay`, `tally diff` and `tally versions`: a job's history run
//! again into a version of its own, two versions' outputs compared, and
//! the versions a job has (see `docs/versions.md`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, bail};
use clap::Args;
use tally_host::config::{JobConfig, Mode, plugin_config_json};
use tally_host::delivery::output_source;
use tally_host::diff::{compare, read_values};
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
            "live": version == Version::LIVE,
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
            let live = if version == Version::LIVE { " (live)" } else { "" };
            println!("{version}{live}  {}  {}", config.settings.name, shown.join("; "));
        }
    }
    Ok(())
}
