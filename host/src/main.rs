//! The `tally` command line.

mod admin_cli;
mod deliver_cli;
mod scaffold;
mod versions_cli;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use tally_core::hot_swap::PluginSlot;
use tally_core::plugin::{
    JobContext, PERIODS_WIT_VERSION, PluginRuntime, WIT_PACKAGE, WIT_VERSION,
};
use tally_core::state::StateStore;
use tally_host::config::{DEFAULT_BATCH_SIZE, JobConfig, JobSettings, LocalConfig, Mode};
use tally_host::run_metrics::RunMetrics;
use tally_kafka::{KafkaJob, KafkaRunOptions, Seeded, StartAt};
use tally_local::LocalTask;
use tally_state_rocks::RocksStore;

/// mimalloc instead of glibc's malloc: the job loop allocates and frees
/// millions of small buffers a second, and glibc spent ~15% of the billing
/// job's CPU consolidating them. The `override` feature makes C and C++
/// code use it as well: librdkafka allocates every record it sends and every
/// record it fetches on one thread and frees it on another, which cost a
/// Kafka job ~15% more CPU under glibc (trimmed and refaulted heap pages).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Tally: exactly-once stream aggregation with WebAssembly plugins.
#[derive(Parser)]
#[command(name = "tally", version, about)]
struct Cli {
    /// Log as JSON lines instead of text (logs go to stderr; filter with RUST_LOG).
    #[arg(long, global = true)]
    log_json: bool,
    /// Admin commands: the `tally serve` host to talk to.
    #[arg(long, global = true, env = "TALLY_SERVER", default_value = tally_host::client::DEFAULT_SERVER)]
    server: String,
    /// Admin commands: your tenant's bearer token.
    #[arg(long, global = true, env = "TALLY_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a job exactly once: over NDJSON files (local mode) or Kafka topics (a job file with `[kafka]`).
    ///
    /// Example:
    ///   tally run --plugin usage_billing.wasm --output totals \
    ///     --input usage-0.ndjson --input usage-1.ndjson --output-dir out --state-dir state
    ///   tally run billing.toml
    ///   tally run --until-caught-up billing-kafka.toml
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
    /// Build and inspect plugins; push, list and roll back a served job's versions.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Read a job's committed state.
    #[command(subcommand)]
    State(StateCommand),
    /// Run many tenants' jobs in one host, managed over an admin API.
    ///
    /// Example: tally serve host.toml
    Serve {
        /// The host file (TOML): listen address, data directory, tenants.
        config: PathBuf,
    },
    /// Deliver a job's committed outputs to a billing HTTP API, effectively once.
    ///
    /// Example:
    ///   tally deliver deliver.toml
    ///   tally deliver --until-caught-up deliver.toml
    ///   tally deliver status deliver.toml
    ///   tally deliver unknown deliver.toml
    ///   tally deliver resolve deliver.toml <key> --applied
    #[command(verbatim_doc_comment)]
    Deliver(deliver_cli::DeliverArgs),
    /// Manage your jobs on a `tally serve` host.
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// Run a job's history again into a version of its own (`<output>.vN`), beside the live one.
    ///
    /// Example: tally replay billing.toml --version v2 --from earliest --plugin fixed.wasm
    #[command(verbatim_doc_comment)]
    Replay(versions_cli::ReplayArgs),
    /// Compare two versions of a job's output, key by key.
    ///
    /// Example: tally diff billing.toml v1 v2 [--json]
    #[command(verbatim_doc_comment)]
    Diff(versions_cli::DiffArgs),
    /// List a job's versions and how far each output is committed.
    ///
    /// Example: tally versions billing.toml
    #[command(verbatim_doc_comment)]
    Versions(versions_cli::VersionsArgs),
    /// Make a version the live one; each delivery named switches with it,
    /// correcting what it billed instead of billing it again.
    ///
    /// Example: tally promote billing.toml --version v2 --deliver deliver.toml
    #[command(verbatim_doc_comment)]
    Promote(versions_cli::PromoteArgs),
    /// (Internal) compiles one upload for `tally serve`, in a process of
    /// its own under the host's compile limits.
    #[command(hide = true)]
    CompileWorker {
        /// The plugin's name in messages.
        name: String,
        /// The component to compile.
        input: PathBuf,
        /// Where to write its compiled form.
        output: PathBuf,
    },
}

#[derive(Subcommand)]
enum JobsCommand {
    /// List your jobs.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one job's status.
    Status {
        job: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Replay a job's input into a version of its own beside the live one
    /// (its shadow): the job's plugin or another, from a start.
    ///
    /// Example: tally jobs replay billing --plugin-config fixed.toml --from 2026-11-01T00:00:00Z
    #[command(verbatim_doc_comment)]
    Replay {
        job: String,
        /// The plugin it runs (default: the job's own).
        #[arg(long)]
        plugin: Option<PathBuf>,
        /// A TOML file whose table it gets instead of the job's `[plugin_config]`.
        #[arg(long)]
        plugin_config: Option<PathBuf>,
        /// Where it starts: `earliest`, or for a Kafka job an RFC 3339
        /// time or offsets (`0:1200,1:980`).
        #[arg(long, default_value = "earliest")]
        from: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Deploy a job file with its plugin.
    ///
    /// Example: tally jobs deploy billing.toml --plugin usage_billing.wasm
    Deploy {
        /// The job file; its `plugin` (if any) is uploaded unless --plugin is given.
        file: PathBuf,
        /// The plugin component to upload.
        #[arg(long)]
        plugin: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Pause a job (it commits what it processed first).
    Pause { job: String },
    /// Resume a paused job.
    Resume { job: String },
    /// Stop a job and delete its state, outputs and plugin versions.
    Delete { job: String },
    /// Change a running job's deliveries in place: `file` holds its new
    /// `[[deliver]]` sections (an output delivered before goes on from its
    /// ledger; an empty file stops every delivery).
    Deliveries {
        job: String,
        /// A TOML file of `[[deliver]]` sections.
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct RunArgs {
    /// A job file (TOML); the other flags then must not be given.
    job: Option<PathBuf>,
    /// The plugin component.
    #[arg(long, conflicts_with = "job")]
    plugin: Option<PathBuf>,
    /// An NDJSON input file (one partition); repeat for more.
    #[arg(long = "input", conflicts_with = "job")]
    inputs: Vec<PathBuf>,
    /// An output the plugin emits to; repeat for more.
    #[arg(long = "output", conflicts_with = "job")]
    outputs: Vec<String>,
    /// Directory of the output files.
    #[arg(long, conflicts_with = "job")]
    output_dir: Option<PathBuf>,
    /// Directory of the job's state.
    #[arg(long, conflicts_with = "job")]
    state_dir: Option<PathBuf>,
    /// Job name (prefixes idempotency keys).
    #[arg(long, default_value = "job", conflicts_with = "job")]
    name: String,
    /// Commit interval in milliseconds.
    #[arg(long, default_value_t = 100, conflicts_with = "job")]
    commit_interval_ms: u64,
    /// Most events per plugin call.
    #[arg(long, default_value_t = DEFAULT_BATCH_SIZE, conflicts_with = "job")]
    batch_size: usize,
    /// Kafka jobs: stop (after committing) once every assigned partition
    /// has been read to its end, instead of running until stopped.
    #[arg(long)]
    until_caught_up: bool,
    /// Serve the job's metrics (Prometheus text, as `tally serve` has them,
    /// a Kafka job's restore progress among them) at
    /// `http://ADDRESS/metrics`, e.g. 127.0.0.1:9464 (port 0: a free one,
    /// printed at the start).
    #[arg(long, value_name = "ADDRESS")]
    metrics: Option<String>,
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Write a new plugin (a per-key counter with a test) to start from.
    ///
    /// Example: tally plugin new my-plugin --lang python
    New {
        /// The directory to create (its name is the package name).
        dir: PathBuf,
        /// The plugin's language.
        #[arg(long, value_enum)]
        lang: scaffold::Lang,
        /// A period plugin (`tally:plugin@0.2.0`) for a job with `[periods]`:
        /// each customer's usage summed per calendar period.
        #[arg(long)]
        periods: bool,
    },
    /// Build a plugin into a component: a Rust crate (Cargo.toml), a JavaScript package (package.json), a Python project (pyproject.toml), a Go module (go.mod) or C sources (*.c).
    ///
    /// Example: tally plugin build plugins/usage-billing --out usage_billing.wasm
    Build {
        /// The plugin's directory.
        dir: PathBuf,
        /// Where to write the component (default: printed at the end).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Show a plugin's contract version, imports, exports and size, and whether this host runs it.
    ///
    /// Example: tally plugin inspect usage_billing.wasm
    Inspect {
        /// The component file.
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Push a new plugin version into a running job; it is swapped in at
    /// the next transaction boundary, and rolled back if it fails there.
    /// With --shadow, run it beside the live version instead, on the same
    /// input, into a version of its own that is never delivered.
    ///
    /// Example: tally plugin push billing usage_billing.wasm
    Push {
        job: String,
        file: PathBuf,
        /// Run the plugin as the job's shadow: its outputs are compared
        /// with the live ones (`tally jobs status`), never delivered.
        #[arg(long)]
        shadow: bool,
        /// With --shadow: a TOML file whose table the shadow's period
        /// plugin gets instead of the job's `[plugin_config]`.
        #[arg(long, requires = "shadow")]
        plugin_config: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Stop a job's shadow and delete its state and outputs.
    ///
    /// Example: tally plugin discard billing
    Discard {
        job: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Make a job's shadow its live version: its plugin becomes the job's,
    /// and each delivery switches to its outputs without billing anyone
    /// twice (one correcting ADJUSTMENT per period whose billed value it
    /// changes).
    ///
    /// Example: tally plugin promote billing
    Promote {
        job: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List every plugin version pushed to a job.
    History {
        job: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Go back to the version that ran before the active one.
    Rollback {
        job: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum StateCommand {
    /// List every committed key and value of a local job.
    ///
    /// Example: tally state list --state-dir state
    List {
        /// The job's state directory.
        #[arg(long)]
        state_dir: PathBuf,
        /// Print one JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Read one committed value of a job on a `tally serve` host.
    ///
    /// Example: tally state get billing '{"customer":"acme","metric":"api_calls","period":"2026-11"}'
    Get {
        job: String,
        /// The key, byte for byte as the plugin stores it (the Rust SDK stores JSON).
        key: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::CompileWorker { name, input, output } = &cli.command {
        // Its stderr is its answer: no log lines there.
        return tally_core::plugin::compiler::worker_main(name, input, output);
    }
    init_logging(cli.log_json);
    let admin = Admin { server: cli.server, token: cli.token };
    match run(cli.command, &admin) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", error_chain(&err));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once: Tally's errors already name
/// their cause in their message, added context does not.
fn error_chain(err: &anyhow::Error) -> String {
    let mut message = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !message.contains(&cause) {
            message.push_str(": ");
            message.push_str(&cause);
        }
    }
    message
}

fn init_logging(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Colours only for a person at a terminal: a log file or a collector
    // gets plain `key=value` fields.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn run(command: Command, admin: &Admin) -> anyhow::Result<()> {
    match command {
        // The handlers go in first: a SIGTERM while the plugin compiles or
        // the job opens stops the run cleanly instead of killing it.
        Command::Run(args) => run_job(args, stop_on_signals()?),
        Command::Plugin(PluginCommand::New { dir, lang, periods }) => {
            scaffold::new_plugin(&dir, lang, periods)
        }
        Command::Plugin(PluginCommand::Build { dir, out }) => build_plugin(&dir, out.as_deref()),
        Command::Plugin(PluginCommand::Inspect { file, json }) => inspect_plugin(&file, json),
        Command::State(StateCommand::List { state_dir, json }) => list_state(&state_dir, json),
        Command::Serve { config } => serve(&config, stop_on_signals()?),
        Command::Deliver(args) => deliver_cli::deliver(args, stop_on_signals),
        Command::Jobs(command) => admin_cli::jobs(admin, command),
        Command::Replay(args) => versions_cli::replay(args, &stop_on_signals()?),
        Command::Diff(args) => versions_cli::diff(args),
        Command::Versions(args) => versions_cli::versions(args),
        Command::Promote(args) => versions_cli::promote(args),
        Command::Plugin(PluginCommand::Push { job, file, shadow: false, json, .. }) => {
            admin_cli::push(admin, &job, &file, json)
        }
        Command::Plugin(PluginCommand::Push { job, file, shadow: true, plugin_config, json }) => {
            admin_cli::start_shadow(
                admin,
                &job,
                (Some(&file), plugin_config.as_deref()),
                None,
                json,
            )
        }
        Command::Plugin(PluginCommand::Discard { job, json }) => {
            admin_cli::discard(admin, &job, json)
        }
        Command::Plugin(PluginCommand::Promote { job, json }) => {
            admin_cli::promote(admin, &job, json)
        }
        Command::Plugin(PluginCommand::History { job, json }) => {
            admin_cli::history(admin, &job, json)
        }
        Command::Plugin(PluginCommand::Rollback { job, json }) => {
            admin_cli::rollback(admin, &job, json)
        }
        Command::State(StateCommand::Get { job, key, json }) => {
            admin_cli::state_get(admin, &job, &key, json)
        }
        // Handled in `main`, before logging starts.
        Command::CompileWorker { .. } => bail!("the compile worker runs before any other command"),
    }
}

/// Where admin commands go, and as whom.
pub(crate) struct Admin {
    pub(crate) server: String,
    pub(crate) token: Option<String>,
}

fn serve(config: &Path, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let config = tally_host::serve::config::HostConfig::from_file(config)?;
    let worker =
        std::env::current_exe().context("finding the `tally` binary, which compiles uploads")?;
    let host = tally_host::serve::Host::open(config, worker)?;
    tally_host::serve::api::serve(host, stop)?;
    println!("stopped: every job committed what it had processed");
    Ok(())
}

pub(crate) use JobsCommand as AdminJobsCommand;

fn run_job(args: RunArgs, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let job = match args.job {
        // The live version: v1, or the one a promotion made live.
        Some(path) => {
            let job = JobConfig::from_file(&path)?;
            tally_host::promote::live_version(&job)?.of(&job)
        }
        None => {
            let missing = |flag: &str| {
                anyhow::anyhow!("give a job file, or --{flag} (see `tally run --help`)")
            };
            let mut settings = JobSettings::new(
                &args.name,
                args.plugin.ok_or_else(|| missing("plugin"))?,
                args.outputs,
            );
            settings.commit_interval_ms = args.commit_interval_ms;
            settings.batch_size = args.batch_size;
            let job = JobConfig {
                settings,
                mode: Mode::Local(LocalConfig {
                    inputs: args.inputs,
                    output_dir: args.output_dir.ok_or_else(|| missing("output-dir"))?,
                    state_dir: args.state_dir.ok_or_else(|| missing("state-dir"))?,
                    confine_to: None,
                    output_suffix: String::new(),
                }),
            };
            job.validate()?;
            job
        }
    };
    run_config(&job, args.metrics.as_deref(), args.until_caught_up, None, &stop)
}

/// Runs `job`: a local job to the end of its inputs, a Kafka job until
/// stopped (or caught up), serving its metrics at `metrics` if given.
pub(crate) fn run_config(
    job: &JobConfig,
    metrics: Option<&str>,
    until_caught_up: bool,
    start: Option<&StartAt>,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let runtime = PluginRuntime::new()?;
    let plugin = match compile_cache_dir() {
        Some(cache) => runtime.load_file_cached(&job.settings.plugin, &cache)?,
        None => runtime.load_file(&job.settings.plugin)?,
    };
    let kafka = matches!(job.mode, Mode::Kafka(_));
    let metrics =
        metrics.map(|listen| RunMetrics::serve(listen, &job.settings.name, kafka)).transpose()?;
    if let Some(metrics) = &metrics {
        metrics.started(plugin.digest());
        eprintln!("metrics: http://{}/metrics", metrics.address());
    }
    let context = metrics.as_ref().map_or_else(
        || JobContext::new(&job.settings.name),
        |metrics| metrics.context(&job.settings.name),
    );
    // No new plugin versions come to a job `tally run` runs: the slot stays empty.
    let observer = metrics.as_ref().map(RunMetrics::observer);
    let local = match &job.mode {
        Mode::Kafka(kafka) => {
            let mut kafka_job = KafkaJob::open_in(&job.settings, kafka, &plugin, context)?;
            if let Some(metrics) = &metrics {
                kafka_job.report_restores_to(metrics.restore_progress());
            }
            if let Some(observer) = observer {
                kafka_job.attach(PluginSlot::new(), job.settings.hot_swap, observer);
            }
            if let Some(start) = start {
                match kafka_job.seed_start(start)? {
                    Seeded::Now(offsets) => {
                        eprintln!("start committed: {}", describe_offsets(&offsets))
                    }
                    Seeded::Before(offsets) => eprintln!(
                        "start committed before, nothing processed since: {}",
                        describe_offsets(&offsets)
                    ),
                }
            }
            return run_kafka_job(&job.settings, kafka_job, until_caught_up, stop);
        }
        Mode::Local(local) => local,
    };
    if until_caught_up {
        bail!(
            "--until-caught-up is for Kafka jobs; a local job always stops at the end of its inputs"
        );
    }
    let job = &job.settings;
    let mut task = LocalTask::open_in(job, local, &plugin, context)?;
    if let Some(observer) = observer {
        task.attach(PluginSlot::new(), job.hot_swap, observer);
    }
    let summary = task.run_until(stop)?;
    if summary.stopped_early {
        println!(
            "stopped on request; everything processed so far is committed, and the next run resumes there"
        );
    }
    println!("{}", summary.describe(&job.name));
    for output in job.outputs.iter().chain([&job.dead_letter_output]) {
        if let Some(path) = task.output_path(output) {
            println!("  {output}: {}", path.display());
        }
    }
    if let Some(partitions) = task.period_status() {
        print_period_status(&partitions, |partition| {
            task.partition_name(partition).unwrap_or_default()
        });
    }
    Ok(())
}

/// What a period job's rules did in this run, and where each partition's
/// watermark stands.
fn print_period_status(
    partitions: &[tally_core::periods::PartitionStatus],
    name_of: impl Fn(u32) -> String,
) {
    let mut total = tally_periods::PeriodCounts::default();
    for partition in partitions {
        let counts = partition.counts;
        total.finals += counts.finals;
        total.adjustments += counts.adjustments;
        total.duplicates += counts.duplicates;
        total.conflicts += counts.conflicts;
        total.future += counts.future;
        total.too_old += counts.too_old;
    }
    println!(
        "  period rules: {} FINAL, {} ADJUSTMENT; dead letters: {} duplicate, {} duplicate_conflict, {} future, {} too_old",
        total.finals,
        total.adjustments,
        total.duplicates,
        total.conflicts,
        total.future,
        total.too_old
    );
    let shown =
        |at: Option<jiff::Timestamp>| at.map_or_else(|| "none".to_string(), |at| at.to_string());
    for partition in partitions {
        let name = name_of(partition.partition);
        println!(
            "  partition {name}: watermark {} (effective {}), {} open periods, {} seen ids",
            shown(partition.watermark),
            shown(partition.effective_watermark),
            partition.open_periods,
            partition.seen_ids
        );
    }
}

/// Where `tally run` keeps compiled plugins: `$TALLY_CACHE_DIR`, else the
/// user's cache directory (`$XDG_CACHE_HOME/tally/compiled`, or
/// `~/.cache/tally/compiled`); none when `TALLY_CACHE_DIR` is empty.
fn compile_cache_dir() -> Option<PathBuf> {
    match std::env::var_os("TALLY_CACHE_DIR") {
        Some(dir) if dir.is_empty() => None,
        Some(dir) => Some(PathBuf::from(dir)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .filter(|dir| !dir.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|home| !home.is_empty())
                    .map(|home| PathBuf::from(home).join(".cache"))
            })
            .map(|cache| cache.join("tally").join("compiled")),
    }
}

/// SIGINT or SIGTERM: finish the current batch, commit, and exit cleanly.
/// A second one exits at once (recovery drops what was not committed).
fn stop_on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(signal, 130, stop.clone())
            .context("installing the signal handler")?;
        signal_hook::flag::register(signal, stop.clone())
            .context("installing the signal handler")?;
    }
    Ok(stop)
}

/// `usage:0@1200 usage:1@980`: where each input partition starts.
fn describe_offsets(offsets: &std::collections::BTreeMap<(String, i32), i64>) -> String {
    let each =
        offsets.iter().map(|((topic, partition), next)| format!("{topic}:{partition}@{next}"));
    each.collect::<Vec<_>>().join(" ")
}

fn run_kafka_job(
    job: &JobSettings,
    mut kafka_job: KafkaJob,
    until_caught_up: bool,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let summary = kafka_job.run_until(stop, KafkaRunOptions { until_caught_up })?;
    println!("{}", summary.describe(&job.name));
    if summary.stopped_early {
        println!(
            "stopped on request; whatever was not committed is processed again by the next run"
        );
    }
    if let Some(partitions) = kafka_job.period_status() {
        print_period_status(&partitions, |partition| partition.to_string());
    }
    Ok(())
}

fn build_plugin(dir: &Path, out: Option<&Path>) -> anyhow::Result<()> {
    let target_dir = tally_plugin_build::default_target_dir(dir);
    let built = tally_plugin_build::build(dir, &target_dir)?;
    let path = match out {
        Some(out) => {
            if let Some(parent) = out.parent().filter(|parent| !parent.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating `{}`", parent.display()))?;
            }
            std::fs::copy(&built.component, out)
                .with_context(|| format!("copying the component to `{}`", out.display()))?;
            out.to_path_buf()
        }
        None => built.component,
    };
    // Through the compile cache `tally run` reads: the first run of a
    // Python or JavaScript build then starts without compiling it again.
    let runtime = PluginRuntime::new()?;
    let plugin = match compile_cache_dir() {
        Some(cache) => runtime.load_file_cached(&path, &cache)?,
        None => runtime.load_file(&path)?,
    };
    println!(
        "built `{}`: {} ({} bytes, {})",
        built.package,
        path.display(),
        plugin.size(),
        plugin.digest()
    );
    println!("imports: {}", plugin.info().imports.join(", "));
    Ok(())
}

fn inspect_plugin(file: &Path, json: bool) -> anyhow::Result<()> {
    let inspection = PluginRuntime::new()?.inspect(file)?;
    let tally_versions: Vec<&str> = inspection
        .info
        .imports
        .iter()
        .chain(&inspection.info.exports)
        .filter_map(|name| {
            name.strip_prefix(WIT_PACKAGE)?.split_once('@').map(|(_, version)| version)
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let verdict = match &inspection.verdict {
        Ok(kind) => format!("runs on this host, as {}", kind.describe()),
        Err(err) => format!("refused: {err}"),
    };
    if json {
        let value = serde_json::json!({
            "file": inspection.name,
            "size": inspection.size,
            "digest": inspection.digest,
            "wit_versions": tally_versions,
            "imports": inspection.info.imports,
            "exports": inspection.info.exports,
            "runs_on_this_host": inspection.verdict.is_ok(),
            "verdict": verdict,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        println!("file:     {}", inspection.name);
        println!("size:     {} bytes", inspection.size);
        println!("digest:   {}", inspection.digest);
        println!(
            "contract: {WIT_PACKAGE}@{} (this host: {WIT_PACKAGE}@{WIT_VERSION} and @{PERIODS_WIT_VERSION})",
            tally_versions.join(", ")
        );
        println!("imports:  {}", list_or_none(&inspection.info.imports));
        println!("exports:  {}", list_or_none(&inspection.info.exports));
        println!("verdict:  {verdict}");
    }
    if inspection.verdict.is_err() {
        bail!("plugin `{}` would be refused", inspection.name);
    }
    Ok(())
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() { "(none)".to_string() } else { items.join(", ") }
}

fn list_state(state_dir: &Path, json: bool) -> anyhow::Result<()> {
    let db = state_dir.join("db");
    if !db.exists() {
        bail!(
            "`{}` holds no Tally state (no `db` inside); pass the --state-dir of a job that has run",
            state_dir.display()
        );
    }
    // RocksDB admits one process at a time: take the job's lock, so a
    // running job is reported rather than raced.
    let _lock = tally_core::lock::DirLock::acquire(state_dir)?;
    let store = RocksStore::open(&db)?;
    // A Kafka job's state is kept per input partition: each key starts
    // with its partition number (4 bytes, big-endian).
    let per_partition = state_dir.join("instance-id").exists();
    let mut out = std::io::stdout().lock();
    for (key, value) in store.scan_state()? {
        let (partition, key) = match tally_kafka::keys::split_namespaced(&key) {
            Some((partition, rest)) if per_partition => (Some(partition), rest),
            _ => (None, &key[..]),
        };
        if json {
            let mut entry =
                serde_json::json!({ "key": json_or_text(key), "value": json_or_text(&value) });
            if let Some(partition) = partition {
                entry["partition"] = partition.into();
            }
            writeln!(out, "{entry}")
        } else {
            let prefix = partition.map(|partition| format!("{partition}\t")).unwrap_or_default();
            writeln!(
                out,
                "{prefix}{}\t{}",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(&value)
            )
        }
        .or_else(ignore_closed_pipe)?;
    }
    Ok(())
}

/// A reader that stopped reading (`| head`) ends the listing quietly.
fn ignore_closed_pipe(err: std::io::Error) -> std::io::Result<()> {
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    Err(err)
}

/// Bytes as JSON when they are JSON (as the Rust SDK stores them), else as a string.
fn json_or_text(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned()))
}
