//! pipette-run's own options. None of them shares a name with a torchrun option (a
//! unit test checks), so a job script's torchrun options always mean what they meant.

use std::path::PathBuf;

use clap::Args;

use super::values::{at_least, not_a_special_file, positive, whole, whole_usize};
use crate::plan::{MappingMode, MemoryHeadroom};

/// How results are shown.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Pipette options")]
pub struct OutputOptions {
    /// Show what would run (nodes, model, settings, plan, commands) and launch nothing
    #[arg(long = "dry-run")]
    pub dry_run: bool,

    /// Print the result as JSON on stdout (for tools); messages still go to stderr. When
    /// launching: the outcome and the trial report once the job ends, with the nodes'
    /// output on stderr
    #[arg(long)]
    pub json: bool,

    /// Seed of every randomised search, so the same inputs give the same plan
    #[arg(long, env = "PIPETTE_SEED", default_value_t = 0, allow_negative_numbers = true, value_parser = whole::<u64>)]
    pub seed: u64,
}

/// How much of its own pipette-run says while it launches.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Pipette options")]
pub struct LogOptions {
    /// Say more (DEBUG lines too): the whole plan report at launch (why it wins term by
    /// term, the top configurations, the mapping), as the dry run shows it
    #[arg(short = 'v', long, conflicts_with = "quiet")]
    pub verbose: bool,

    /// Say less (warnings and errors only): no plan report and no progress lines
    /// (failures, re-plans and the closing summary stay). PIPETTE_LOG sets levels per
    /// target as RUST_LOG does: `warn,progress=info`, `plan=debug`
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// Where the nodes come from. Discovery order: Slurm, PBS, --hostfile, --hosts, this
/// machine; --include/--exclude then filter whatever was found.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Node options")]
pub struct DiscoveryOptions {
    /// A cluster profile (pipette JSON, original Pipette bandwidth file, or mpiGraph
    /// output) with the GPUs and measured link bandwidths. Without an allocation, its
    /// nodes are the nodes
    #[arg(long, env = "PIPETTE_CLUSTER", value_name = "FILE")]
    pub cluster: Option<PathBuf>,

    /// DeepSpeed-style hostfile (`host slots=N` per line, # comments) or one host per
    /// line. Slurm and PBS allocations take precedence
    #[arg(long, env = "PIPETTE_HOSTFILE", value_name = "FILE")]
    pub hostfile: Option<PathBuf>,

    /// Comma-separated hosts (Slurm hostlist syntax accepted: gpu[01-04])
    #[arg(long, env = "PIPETTE_HOSTS", value_name = "LIST")]
    pub hosts: Option<String>,

    /// Use only these hosts or slots, DeepSpeed syntax: host1:0,1@host2
    #[arg(long, value_name = "FILTER")]
    pub include: Option<String>,

    /// Leave out these hosts or slots, DeepSpeed syntax: host1:0,1@host2
    #[arg(long, value_name = "FILTER")]
    pub exclude: Option<String>,
}

/// Profiling the nodes, when no --cluster file is given.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Node options")]
pub struct ProfilingOptions {
    /// Measure the nodes again even when a cached profile of the same nodes and GPUs is
    /// fresh (profiles are cached under ~/.cache/pipette-run/profiles for a week)
    #[arg(long, env = "PIPETTE_REPROFILE")]
    pub reprofile: bool,
}

/// What is trained, when the script's arguments do not say it all.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Model options")]
pub struct ModelOptions {
    /// A model preset (see `pipette presets`); Megatron arguments after SCRIPT override
    /// its values
    #[arg(long = "model", env = "PIPETTE_MODEL", value_name = "PRESET")]
    pub preset: Option<String>,

    /// Parallel settings the planner must keep, comma-separated: tp, pp, cp, mbs, vpp,
    /// sp, recompute, dist-opt take their value from the Megatron arguments; NAME=VALUE
    /// fixes a value (e.g. tp=4, dp=8); `all` pins everything the arguments give;
    /// `yours` keeps the arguments' configuration unless the plan is faster by more than
    /// the time model's stated error. Without --pin, parallel sizes in the script's
    /// arguments are costed beside the plan and replaced
    #[arg(long, env = "PIPETTE_PIN", value_name = "LIST")]
    pub pin: Option<String>,
}

/// How hard and how the planner searches.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Planning options")]
pub struct PlanningOptions {
    /// How ranks are placed on GPUs: auto (exhaustive when the states are few, else
    /// simulated annealing), anneal, exhaustive, or identity (torchrun's default order)
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = parse_mapping)]
    pub mapping: MappingMode,

    /// Annealing evaluations per mapped configuration (default: 1,000 per GPU, between
    /// 50,000 and 128,000; 20,000 with --time-model pipette-compat); at most 10,000,000
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = super::values::at_most::<{ crate::plan::search::MAX_BUDGET }>)]
    pub budget: Option<u64>,

    /// How many of the best-ranked configurations get a mapping search
    #[arg(long = "top-k", value_name = "K", default_value_t = crate::plan::search::DEFAULT_TOP_K, allow_negative_numbers = true, value_parser = whole_usize)]
    pub top_k: usize,

    /// Keep torchrun's node and GPU order unless the rank mapping makes the iteration at
    /// least this many percent faster (default 1; 0 takes any gain)
    #[arg(long = "mapping-threshold", value_name = "PERCENT", default_value_t = 100.0 * crate::plan::search::DEFAULT_MAPPING_THRESHOLD, value_parser = parse_percent)]
    pub mapping_threshold: f64,

    /// Keep at least N nodes out of the plan as hot spares (the worst measured): a spare
    /// takes a failed node's place without a re-plan. Without it, nodes the fastest plan
    /// does not need are spares too
    #[arg(long, env = "PIPETTE_SPARES", value_name = "N", default_value_t = 0, allow_negative_numbers = true, value_parser = whole_usize)]
    pub spares: usize,

    /// GPU memory to keep free beyond the estimate: a fraction (0.05, the default) or
    /// GiB (4GiB)
    #[arg(long = "memory-headroom", value_name = "AMOUNT", allow_negative_numbers = true, value_parser = parse_headroom)]
    pub memory_headroom: Option<MemoryHeadroom>,

    /// Calibration of the memory and time estimators, as `pipette calibrate --out FILE`
    /// wrote it (or a bare calibration object). pipette-run then runs no trial
    #[arg(long, env = "PIPETTE_CALIBRATION", value_name = "FILE")]
    pub calibration: Option<PathBuf>,
}

/// The trial run: before launching, pipette-run runs the script itself for a few
/// iterations under the chosen plan (no checkpoints saved or loaded, no evaluation),
/// records every rank's peak memory and the time per iteration, fits the estimators to
/// them, re-plans with the fitted calibration, and only then launches.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Trial options")]
pub struct TrialOptions {
    /// Launch without a trial run (the estimators keep their defaults, or --calibration's)
    #[arg(long = "no-trial", env = "PIPETTE_NO_TRIAL")]
    pub no_trial: bool,

    /// Iterations of the trial run; the first is warm-up, the time is the median of the
    /// others
    #[arg(long = "trial-iters", value_name = "N", default_value_t = crate::trial::DEFAULT_ITERS, allow_negative_numbers = true, value_parser = at_least::<2>)]
    pub trial_iters: u64,

    /// Stop the trial run (on every node) and report it after this long
    #[arg(long = "trial-timeout", value_name = "DURATION", default_value = "15min", allow_hyphen_values = true, value_parser = parse_duration)]
    pub trial_timeout: std::time::Duration,

    /// Micro-batch sizes to run the trial at, comma-separated (default: the plan's). With
    /// two or more the fit separates activation memory from fixed overhead; with one it
    /// fits the overhead only (unless the plan has several pipeline stages)
    #[arg(
        long = "trial-micro-batches",
        value_name = "LIST",
        value_delimiter = ',',
        allow_negative_numbers = true,
        value_parser = positive::<u64>
    )]
    pub trial_micro_batches: Option<Vec<u64>>,

    /// After the trial's memory check, trial the K best plans (short runs, the plan's pick
    /// first) and launch the one measured fastest. Default: every plan the time model
    /// cannot tell from the fastest within its stated error, at most 3; 1: the plan's pick
    /// alone
    #[arg(long = "trial-top-k", value_name = "K", allow_negative_numbers = true, value_parser = positive::<u32>)]
    pub trial_top_k: Option<u32>,
}

/// Where the launch files go.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Launch options")]
pub struct LaunchOptions {
    /// Directory for this launch's scripts, plan and summary (default:
    /// ./pipette-runs/<local date-time>-<job id or pid>); must not exist yet (a dry run
    /// writes one too: launch with another, or remove it)
    #[arg(long = "run-dir", value_name = "DIR")]
    pub run_dir: Option<PathBuf>,

    /// Directory of templates overriding the built-in ones by file name (launch.sh.j2,
    /// megatron-args.txt.j2, hostfile.j2, ds_config.json.j2, README.md.j2)
    #[arg(long, value_name = "DIR")]
    pub templates: Option<PathBuf>,
}

fn parse_mapping(text: &str) -> Result<MappingMode, String> {
    match text {
        "auto" => Ok(MappingMode::Auto),
        "anneal" => Ok(MappingMode::Anneal),
        "exhaustive" => Ok(MappingMode::Exhaustive),
        "identity" => Ok(MappingMode::Identity),
        _ => Err(format!(
            "{text:?} is not a mapping mode (auto, anneal, exhaustive or identity)"
        )),
    }
}

fn parse_headroom(text: &str) -> Result<MemoryHeadroom, String> {
    if let Some(gib) = text.strip_suffix("GiB") {
        return match gib.trim().parse::<f64>() {
            Ok(g) if g.is_finite() && g >= 0.0 => {
                Ok(MemoryHeadroom::Bytes((g * (1u64 << 30) as f64) as u64))
            }
            _ => Err(format!("{text:?} is not an amount of GiB (e.g. 4GiB)")),
        };
    }
    match text.parse::<f64>() {
        Ok(f) if (0.0..1.0).contains(&f) => Ok(MemoryHeadroom::Fraction(f)),
        _ => Err(format!(
            "{text:?} is not a headroom (a fraction from 0 up to, not including, 1 such as 0.05, or GiB such as 4GiB)"
        )),
    }
}

/// How the job is launched on the nodes and supervised while it runs.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Supervision options")]
pub struct SuperviseOptions {
    #[command(flatten)]
    pub access: AccessOptions,

    /// Between TERM and KILL when the job's nodes are stopped: after a failure, or when
    /// pipette-run gets INT (Ctrl-C), TERM, HUP or QUIT (a second one kills at once; USR1
    /// and USR2 are passed on to the script and stop nothing). After a stall, a node whose
    /// torchrun does not stop within it is treated as hung and left out of a re-plan. The
    /// profile's probe and the trial stop their nodes within 5 s whatever this says
    #[arg(long, value_name = "DURATION", default_value = "10s", allow_hyphen_values = true, value_parser = parse_duration)]
    pub grace: std::time::Duration,

    /// A job that makes no progress this long is a failure: no Megatron iteration (or
    /// checkpoint or evaluation) line once iterations have begun. `0` never gives up. Make
    /// it longer than --log-interval iterations take. Time the job's processes on this
    /// machine spend waiting for a CPU is not counted: a starved job is slow, not stuck
    #[arg(long = "stall-timeout", env = "PIPETTE_STALL_TIMEOUT", value_name = "DURATION", default_value = "30min", allow_hyphen_values = true, value_parser = parse_duration)]
    pub stall_timeout: std::time::Duration,

    /// Before the first iteration line (and after the last), no output at all from any
    /// node this long is a failure (default: --stall-timeout; `0` never gives up). With
    /// planning off (a script that is not Megatron's), only when given
    #[arg(long = "startup-timeout", value_name = "DURATION", allow_hyphen_values = true, value_parser = parse_duration)]
    pub startup_timeout: Option<std::time::Duration>,

    /// How many times a failed job is re-planned on the surviving nodes and resumed from
    /// its last checkpoint (with planning off: run again on them, as it was); 0 never
    /// re-plans
    #[arg(
        long = "max-replans",
        env = "PIPETTE_MAX_REPLANS",
        value_name = "N",
        default_value_t = 3,
        allow_negative_numbers = true,
        value_parser = whole::<u32>
    )]
    pub max_replans: u32,

    /// How long a node has to answer its health check after a failure
    #[arg(long = "health-timeout", value_name = "DURATION", default_value = "20s", allow_hyphen_values = true, value_parser = parse_duration)]
    pub health_timeout: std::time::Duration,

    /// During training, a line of ours at most this often: iteration n/N, time per
    /// iteration against the estimate, tokens/s per GPU, MFU, time left. Without a
    /// terminal, profiling and the trial write one this often too (phase, done/total,
    /// elapsed, ETA). `0` shows none
    #[arg(long = "progress-interval", env = "PIPETTE_PROGRESS_INTERVAL", value_name = "DURATION", default_value = "30s", allow_hyphen_values = true, value_parser = parse_duration)]
    pub progress_interval: std::time::Duration,

    /// What to do about a straggler (a node slower than the others, read from the
    /// training script's `--log-straggler` report): off; report it with the choices the
    /// model costs (keep the plan, re-map around it, leave it out); or act: take the best
    /// choice through a re-plan and a resume from the last checkpoint when its gain over the
    /// remaining iterations beats the measured cost of a restart
    #[arg(
        long = "stragglers",
        env = "PIPETTE_STRAGGLERS",
        value_name = "MODE",
        default_value = "report"
    )]
    pub stragglers: Stragglers,

    /// A node is slow below this share of the other nodes' median throughput
    #[arg(long = "straggler-threshold", value_name = "SHARE", default_value_t = 0.7, value_parser = parse_share)]
    pub straggler_threshold: f64,

    /// ... for this many consecutive straggler reports (log intervals)
    #[arg(long = "straggler-windows", value_name = "N", default_value_t = 3, allow_negative_numbers = true, value_parser = positive::<u32>)]
    pub straggler_windows: u32,

    /// At most one straggler action per this long
    #[arg(long = "straggler-cooldown", value_name = "DURATION", default_value = "30min", allow_hyphen_values = true, value_parser = parse_duration)]
    pub straggler_cooldown: std::time::Duration,
}

/// How the nodes are reached and what runs there: pipette-run's, `pipette profile`'s and
/// `pipette doctor`'s alike (under the heading of whichever holds them).
#[derive(Debug, Clone, Args)]
pub struct AccessOptions {
    /// How to reach the nodes: local, ssh or srun (default: local when every node is
    /// this machine, srun inside Slurm, else ssh)
    #[arg(long, env = "PIPETTE_LAUNCHER", value_name = "HOW")]
    pub launcher: Option<Launcher>,

    /// An ssh client configuration file for reaching the nodes (`ssh -F FILE`): user,
    /// port, identity, host aliases
    #[arg(long = "ssh-config", env = "PIPETTE_SSH_CONFIG", value_name = "FILE", value_parser = not_a_special_file)]
    pub ssh_config: Option<PathBuf>,

    /// The torchrun executable on the nodes: a name looked up on each node's PATH, or a
    /// path
    #[arg(
        long = "torchrun",
        env = "PIPETTE_TORCHRUN",
        value_name = "PATH",
        default_value = "torchrun"
    )]
    pub torchrun: String,
}

/// What reaches the nodes besides the command: environment variables, and the options of
/// the transport (ssh, srun) that carries it.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Node environment and transport options")]
pub struct NodeOptions {
    /// A variable for every node's torchrun: NAME=VALUE, or NAME alone for this process's
    /// value. Repeatable; wins over the env files and the forwarded defaults
    #[arg(long = "env", value_name = "NAME[=VALUE]", value_parser = parse_env_assignment)]
    pub env: Vec<(String, Option<String>)>,

    /// A file of NAME=VALUE lines for every node (DeepSpeed's .deepspeed_env format; blank
    /// lines and # comments skipped, values taken literally). Default: whichever of
    /// ~/.deepspeed_env, ./.deepspeed_env, ~/.pipette_env, ./.pipette_env exist, later ones
    /// winning
    #[arg(long = "env-file", env = "PIPETTE_ENV_FILE", value_name = "FILE")]
    pub env_file: Option<PathBuf>,

    /// More ssh client options, as words (split as a shell would, never run through one),
    /// placed before the host: "-o ProxyJump=login -p 2222"
    #[arg(long = "ssh-args", env = "PIPETTE_SSH_ARGS", value_name = "ARGS", allow_hyphen_values = true, value_parser = parse_words)]
    pub ssh_args: Option<Words>,

    /// More srun options for every job step, as words (split as a shell would, never run
    /// through one): "--container-image=nvcr.io#nvidia/pytorch:24.05-py3
    /// --container-mounts=/data:/data"
    #[arg(long = "srun-args", env = "PIPETTE_SRUN_ARGS", value_name = "ARGS", allow_hyphen_values = true, value_parser = parse_words)]
    pub srun_args: Option<Words>,
}

/// `NAME=VALUE` or `NAME`, with a valid name.
fn parse_env_assignment(text: &str) -> Result<(String, Option<String>), String> {
    let (name, value) = match text.split_once('=') {
        Some((name, value)) => (name, Some(value.to_string())),
        None => (text, None),
    };
    if !crate::exec::is_env_name(name) {
        return Err(format!(
            "{name:?} is not an environment variable name (letters, digits and _, not starting with a digit)"
        ));
    }
    if value.as_deref().is_some_and(|v| v.contains('\0')) {
        return Err(format!("the value of {name} contains a NUL byte"));
    }
    Ok((name.to_string(), value))
}

/// An option's value split into words (`--ssh-args`, `--srun-args`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Words(pub Vec<String>);

/// Words, split as a POSIX shell would split them (see [`crate::exec::split_words`]).
fn parse_words(text: &str) -> Result<Words, String> {
    crate::exec::split_words(text)
        .map(Words)
        .map_err(|e| format!("{text:?}: {e} (quote as a shell would)"))
}

/// `10`, `10s`, `1.5s`, `500ms`, `5min`, `2h` (a bare number is seconds); see
/// [`super::values::duration`].
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    super::values::duration(text)
}

/// A share in (0, 1).
fn parse_share(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number (give a share, e.g. 0.7)"))?;
    if value > 0.0 && value < 1.0 {
        Ok(value)
    } else {
        Err(format!(
            "{text} is out of range (give a share above 0 and below 1)"
        ))
    }
}

/// A percentage in [0, 100).
fn parse_percent(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .trim_end_matches('%')
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number (give a percentage, e.g. 1)"))?;
    if (0.0..100.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{text} % is out of range (give 0 up to 100)"))
    }
}

/// `--launcher`'s ways to reach the nodes, as the command line spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Launcher {
    Local,
    Ssh,
    Srun,
}

impl From<Launcher> for crate::launch::Launcher {
    fn from(launcher: Launcher) -> Self {
        match launcher {
            Launcher::Local => crate::launch::Launcher::Local,
            Launcher::Ssh => crate::launch::Launcher::Ssh,
            Launcher::Srun => crate::launch::Launcher::Srun,
        }
    }
}

/// `--stragglers`' modes, as the command line spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stragglers {
    Off,
    Report,
    Act,
}

#[cfg(test)]
mod tests {
    use super::{parse_duration, parse_percent};
    use std::time::Duration;

    #[test]
    fn mapping_thresholds_are_percentages() {
        assert_eq!(parse_percent("1"), Ok(1.0));
        assert_eq!(parse_percent("0.5%"), Ok(0.5));
        assert_eq!(parse_percent("0"), Ok(0.0));
        assert!(parse_percent("100").is_err());
        assert!(parse_percent("-1").is_err());
        assert!(parse_percent("one").unwrap_err().contains("percentage"));
    }

    #[test]
    fn durations_take_the_usual_units() {
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30min"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("ten")
            .unwrap_err()
            .contains("not a duration"));
        assert!(parse_duration("5 days").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
