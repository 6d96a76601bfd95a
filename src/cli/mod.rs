//! The command lines of `pipette-run` and `pipette`, and nothing else: parsing is kept
//! apart from the stages, which receive plain values.

pub mod env_errors;
pub mod node_env;
pub mod options;
pub mod resolved;
pub mod site;
pub mod torchrun;
pub mod values;

pub use options::{
    AccessOptions, DiscoveryOptions, LaunchOptions, LogOptions, ModelOptions, NodeOptions,
    OutputOptions, PlanningOptions, ProfilingOptions, SuperviseOptions, TrialOptions,
};
pub use resolved::RunConfig;
pub use torchrun::{NodeRange, NprocPerNode, TorchrunOptions};

/// A command line (or a file or variable it names) that cannot be resolved into a
/// [`RunConfig`]: what is wrong and how to fix it. The top-level error keeps its classes
/// (a usage error, or one of pipette-run's own).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Internal(String),
}

use std::path::PathBuf;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::config::{Recompute, RecomputeMethod};
use crate::model::time::TimeModel;
use crate::report::pictures::Picture;

/// Exit codes, shown at the end of every `--help` (from [`crate::exit`]).
pub const EXIT_CODES_HELP: &str = crate::exit::HELP;

/// What `-h` says in place of torchrun's thirty options.
pub const TORCHRUN_OPTIONS_NOTE: &str = "torchrun's own options (--nnodes, --nproc-per-node, --rdzv-*, --max-restarts, -m, --no-python, ... with their PET_* variables) are accepted too, with torchrun's meaning: --help lists them all.";

/// `pipette-run`'s command line as it is parsed: `-h` shows pipette-run's own options
/// and says where torchrun's are, `--help` shows everything.
pub fn run_command() -> clap::Command {
    short_help_without_torchrun(RunCli::command())
}

/// `pipette`'s command line as it is parsed (`pipette calibrate -h` as `pipette-run -h`).
pub fn pipette_command() -> clap::Command {
    PipetteCli::command().mut_subcommand("calibrate", short_help_without_torchrun)
}

/// Parses `pipette-run`'s arguments with [`run_command`], a site configuration's values
/// as the defaults of its options.
pub fn parse_run(
    args: &[std::ffi::OsString],
    site: Option<&site::SiteConfig>,
) -> Result<RunCli, clap::Error> {
    let command = match site {
        Some(site) => site::apply(run_command(), site),
        None => run_command(),
    };
    let matches = command.try_get_matches_from(args).map_err(|e| match site {
        Some(site) => site::blame_the_file(e, site, args),
        None => e,
    })?;
    RunCli::from_arg_matches(&matches)
}

/// `--config`/`PIPETTE_CONFIG` (and `--json`) as far as `args` can be read (a malformed
/// command line is reported by the full parse, with the site configuration applied).
pub fn site_config_matches(args: &[std::ffi::OsString]) -> clap::ArgMatches {
    run_command()
        .ignore_errors(true)
        .disable_help_flag(true)
        .disable_version_flag(true)
        .try_get_matches_from(args)
        .unwrap_or_default()
}

/// Whether `--json` was asked for, as far as [`site_config_matches`] could read `args`:
/// an error found before the full parse is then a JSON object too. A lenient parse stops
/// at a malformed option, so the words before the script (all of them when the parse
/// never reached it) are read for `--json` as well.
pub fn json_requested(matches: &clap::ArgMatches, args: &[std::ffi::OsString]) -> bool {
    let parsed = matches
        .try_get_one::<bool>("json")
        .ok()
        .flatten()
        .copied()
        .unwrap_or(false);
    let script = matches.index_of("command").unwrap_or(args.len());
    parsed
        || args
            .iter()
            .take(script)
            .take_while(|a| *a != "--")
            .any(|a| a == "--json")
}

/// Parses `pipette`'s arguments with [`pipette_command`], a site configuration's values as
/// the defaults of `pipette calibrate`'s options (pipette-run's, as [`parse_run`] does).
pub fn parse_pipette(
    args: &[std::ffi::OsString],
    site: Option<&site::SiteConfig>,
) -> Result<PipetteCli, clap::Error> {
    let command = match site {
        Some(site) => pipette_command().mut_subcommand("calibrate", |c| site::apply(c, site)),
        None => pipette_command(),
    };
    let matches = command.try_get_matches_from(args)?;
    PipetteCli::from_arg_matches(&matches)
}

/// `pipette calibrate`'s `--config`/`PIPETTE_CONFIG` as far as `args` can be read; `None`
/// for the other subcommands, which take no pipette-run options from a site configuration.
pub fn calibrate_site_config_matches(args: &[std::ffi::OsString]) -> Option<clap::ArgMatches> {
    let lenient = |c: clap::Command| {
        c.ignore_errors(true)
            .disable_help_flag(true)
            .disable_version_flag(true)
    };
    lenient(pipette_command())
        .mut_subcommand("calibrate", lenient)
        .try_get_matches_from(args)
        .ok()?
        .subcommand_matches("calibrate")
        .cloned()
}

/// The options under torchrun's heading hidden from `-h`, and a note saying where they are.
fn short_help_without_torchrun(command: clap::Command) -> clap::Command {
    command
        .mut_args(|arg| match is_torchrun_option(&arg) {
            true => arg.hide_short_help(true),
            false => first_sentence_for_short_help(arg),
        })
        .after_help(format!("{TORCHRUN_OPTIONS_NOTE}\n\n{}", short_exit_codes()))
        .after_long_help(EXIT_CODES_HELP)
}

/// The exit codes as `-h` names them, in one line (`--help` says what each means).
fn short_exit_codes() -> String {
    let codes: Vec<&str> = crate::exit::ROWS.iter().map(|r| r.code).collect();
    format!(
        "Exit codes: {} (--help says what each means)",
        codes.join(", ")
    )
}

/// `-h` says each option's first clause, `--help` all of it and the option's variable: so
/// `-h` stays within a screenful (it was 189 lines).
fn first_sentence_for_short_help(arg: clap::Arg) -> clap::Arg {
    if arg.get_long_help().is_some() {
        return arg;
    }
    let Some(help) = arg.get_help().map(ToString::to_string) else {
        return arg;
    };
    let env = arg
        .get_env()
        .filter(|_| !arg.is_hide_env_set())
        .map(|name| name.to_string_lossy().into_owned());
    let short = first_sentence(&help).unwrap_or(&help).to_owned();
    match env {
        Some(name) => arg
            .help(short)
            .long_help(format!("{help} [env: {name}]"))
            .hide_env(true),
        None if short != help => arg.help(short).long_help(help),
        None => arg,
    }
}

/// What `-h` says of an option whose help says more: its first clause, up to the first
/// `. `, `; ` or `: ` outside parentheses (not the `.` of `e.g.`, `i.e.` or `...`), or up to
/// a parenthesis that ends the clause; once at least [`SHORT_HELP_MIN`] characters are said.
fn first_sentence(text: &str) -> Option<&str> {
    let mut depth = 0usize;
    let mut opened = 0usize;
    let bytes = text.as_bytes();
    for (i, c) in text.char_indices() {
        let next = bytes.get(i + 1).copied();
        let clause_end = |b: Option<u8>| matches!(b, None | Some(b'.' | b';' | b':' | b','));
        let cut = match c {
            '(' => {
                if depth == 0 {
                    opened = i;
                }
                depth += 1;
                None
            }
            ')' => {
                depth = depth.saturating_sub(1);
                // A parenthesis that ends the clause says more of what went before it.
                (depth == 0 && clause_end(next)).then_some(opened)
            }
            '.' => {
                let before = &text[..i];
                (depth == 0
                    && next == Some(b' ')
                    && !(before.ends_with("e.g")
                        || before.ends_with("i.e")
                        || before.ends_with('.')))
                .then_some(i)
            }
            ';' | ':' => (depth == 0 && next == Some(b' ')).then_some(i),
            _ => None,
        };
        if let Some(at) = cut.filter(|at| *at >= SHORT_HELP_MIN) {
            return Some(text[..at].trim_end());
        }
    }
    None
}

/// The fewest characters `-h` says of an option (shorter first clauses run on).
const SHORT_HELP_MIN: usize = 16;

/// Whether `arg` is one of torchrun's options (they carry torchrun's help heading).
pub fn is_torchrun_option(arg: &clap::Arg) -> bool {
    arg.get_help_heading()
        .is_some_and(|h| h.starts_with("torchrun options"))
}

/// Which program a completion script or manual page is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Program {
    #[value(name = "pipette-run")]
    PipetteRun,
    Pipette,
}

impl Program {
    fn command(self) -> clap::Command {
        match self {
            Program::PipetteRun => run_command(),
            Program::Pipette => pipette_command(),
        }
    }
}

/// `program`'s completion script for `shell`.
pub fn completions(shell: clap_complete::Shell, program: Program) -> Vec<u8> {
    let mut command = program.command();
    let name = command.get_name().to_string();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, name, &mut out);
    out
}

/// `program`'s manual page (roff), with its subcommands' options for `pipette`.
pub fn man_page(program: Program) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    clap_mangen::Man::new(program.command()).render(&mut out)?;
    Ok(out)
}

/// Replace `torchrun` with `pipette-run` in a job script: it discovers the allocated
/// nodes, measures them, plans tensor/pipeline/data parallelism, micro-batch and the
/// placement of every rank on a GPU, then launches torchrun on every node.
///
/// Everything after SCRIPT belongs to the script: pipette-run reads the model and
/// training settings from the Megatron arguments there and rewrites only the parallel
/// ones.
///
/// Any other script (FSDP, DeepSpeed, Lightning, plain DDP: no --model and none of
/// --num-layers, --hidden-size, --num-attention-heads after SCRIPT) is not planned: it
/// runs as torchrun would run it on the nodes found, its arguments untouched, and is
/// supervised the same way (merged logs, failures, teardown, relaunch on the survivors).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "pipette-run",
    version,
    after_help = EXIT_CODES_HELP,
    override_usage = "pipette-run [TORCHRUN OPTIONS] [PIPETTE OPTIONS] SCRIPT [SCRIPT ARGS]...",
    max_term_width = 100
)]
pub struct RunCli {
    #[command(flatten)]
    pub pipette: OutputOptions,

    #[command(flatten)]
    pub log: LogOptions,

    #[command(flatten)]
    pub discovery: DiscoveryOptions,

    #[command(flatten)]
    pub profiling: ProfilingOptions,

    #[command(flatten)]
    pub model: ModelOptions,

    #[command(flatten)]
    pub planning: PlanningOptions,

    #[command(flatten)]
    pub launch: LaunchOptions,

    #[command(flatten)]
    pub supervise: SuperviseOptions,

    #[command(flatten)]
    pub nodes: NodeOptions,

    #[command(flatten)]
    pub trial: TrialOptions,

    #[command(flatten)]
    pub torchrun: TorchrunOptions,

    /// A site configuration file: TOML, `option = value` with pipette-run's long option
    /// names (cluster = "/shared/c.json", launcher = "srun"), the defaults of those options
    /// below the command line and the environment (default:
    /// $XDG_CONFIG_HOME/pipette/config.toml; `pipette config show` shows what it sets)
    #[arg(
        long,
        env = "PIPETTE_CONFIG",
        value_name = "FILE",
        help_heading = "Pipette options"
    )]
    pub config: Option<PathBuf>,

    /// The training script (or module with -m, or program with --no-python), followed
    /// by its own arguments. Nothing after SCRIPT is read as a pipette-run option
    #[arg(
        value_name = "SCRIPT [SCRIPT ARGS]",
        required = true,
        num_args = 1..,
        trailing_var_arg = true
    )]
    pub command: Vec<String>,
}

impl RunCli {
    /// The training script (or module, or program).
    pub fn script(&self) -> &str {
        // `num_args = 1..` with `required = true` guarantees one element.
        self.command.first().map(String::as_str).unwrap_or_default()
    }

    /// The arguments that belong to the script, untouched.
    pub fn script_args(&self) -> &[String] {
        self.command.get(1..).unwrap_or_default()
    }
}

impl RunCli {
    /// What is worth a warning in the words after SCRIPT, before anything runs: pipette-run's
    /// own options written there ([`options_after_script`]), and, when the job is planned,
    /// near misses of the Megatron options pipette reads
    /// ([`crate::config::megatron::typos`]).
    pub fn script_argument_warnings(&self, planned: bool) -> Vec<String> {
        let mut warnings: Vec<String> = options_after_script(self.script_args())
            .into_iter()
            .map(|option| {
                format!(
                    "{option} comes after SCRIPT ({}), so it goes to the script, as torchrun does; for pipette-run, write it before {}",
                    self.script(),
                    self.script()
                )
            })
            .collect();
        if planned {
            warnings.extend(
                crate::config::megatron::typos::near_misses(self.script_args())
                    .iter()
                    .map(|m| m.warning()),
            );
        }
        warnings
    }
}

/// pipette-run's (and torchrun's) long options written in `script_args` before any `--`,
/// as written (`--dry-run`, `--nnodes=2`), each once. torchrun's rule is kept: everything
/// after SCRIPT is the script's. Megatron's own options of the same name (`--seed`,
/// `--log-interval`) are the script's indeed, and left out; so are `--help` and
/// `--version`, which most scripts have.
pub fn options_after_script(script_args: &[String]) -> Vec<String> {
    let command = run_command();
    let ours = |name: &str| {
        command.get_arguments().any(|a| {
            a.get_long() == Some(name) || a.get_all_aliases().is_some_and(|al| al.contains(&name))
        })
    };
    let mut found: Vec<String> = Vec::new();
    for word in crate::config::megatron::argparse::arg_words(script_args) {
        let Some(name) = word.written_name(script_args) else {
            continue;
        };
        let theirs = crate::config::megatron::typos::megatron_knows(name)
            || ["help", "version"].contains(&name);
        if !theirs && ours(name) && !found.iter().any(|f| f == name) {
            found.push(name.to_owned());
        }
    }
    found.into_iter().map(|name| format!("--{name}")).collect()
}

/// `--show`'s values: the pictures' names, each read into its picture.
fn picture_parser() -> impl clap::builder::TypedValueParser<Value = Picture> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Picture::ALL.map(Picture::name))
        .try_map(|name: String| Picture::from_name(&name).ok_or("not a picture's name"))
}

/// Plan LLM training on a cluster without launching it: inspect nodes, cluster files
/// and model settings. `pipette-run` is the launcher.
#[derive(Debug, Clone, Parser)]
#[command(name = "pipette", version, after_help = EXIT_CODES_HELP, max_term_width = 100)]
pub struct PipetteCli {
    #[command(subcommand)]
    pub command: PipetteCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum PipetteCommand {
    /// Show the nodes pipette-run would use here (Slurm, PBS, --hostfile, --hosts, or
    /// this machine), after --include/--exclude
    Discover {
        #[command(flatten)]
        discovery: DiscoveryOptions,
        #[command(flatten)]
        output: OutputOptions,
    },
    /// Read and validate a cluster profile file (pipette's schema, the original
    /// Pipette bandwidth file, or mpiGraph's output) and summarise it
    Cluster {
        /// The file to read
        #[arg(value_name = "FILE")]
        file: std::path::PathBuf,
        #[command(flatten)]
        output: OutputOptions,
    },
    /// Show the model and training settings read from Megatron arguments or a preset,
    /// with the exact parameter count: `pipette model --model llama2-7b -- --seq-length 2048`
    Model {
        #[command(flatten)]
        model: ModelOptions,
        #[command(flatten)]
        output: OutputOptions,
        /// Megatron arguments, as they would follow SCRIPT
        #[arg(last = true, value_name = "MEGATRON ARGS")]
        megatron_args: Vec<String>,
    },
    /// Cost one parallel configuration: memory per GPU for every pipeline stage, and the
    /// iteration time term by term on a cluster (three ways: pipette, pipette-compat, amp).
    /// Values not given come from the Megatron arguments:
    /// `pipette estimate --cluster c.json --tp 2 --pp 4 --mbs 1 --model llama2-13b`
    Estimate(Box<EstimateArgs>),
    /// Plan without launching: the fastest configuration that fits, and the GPU each rank
    /// runs on, for the nodes found (or a cluster file's): `pipette plan --cluster c.json
    /// --model llama2-13b -- --global-batch-size 512 --bf16`
    Plan(Box<PlanArgs>),
    /// Measure the allocated nodes: GPUs (nvidia-smi), the bandwidth every GPU pair and
    /// node pair attains (a torchrun probe: NCCL on GPUs, gloo on CPUs) and matmul
    /// throughput; write the cluster profile. Without GPUs, N CPU processes per node stand
    /// in for GPUs. Cached per node set for a week
    Profile(Box<ProfileArgs>),
    /// Run the trial alone: profile the nodes (or read --cluster), plan, run the script for
    /// a few iterations under the plan on every node, fit the estimators' calibration to the
    /// measured peak memory and iteration time, and write it with the full report to
    /// --out (read it back with --calibration FILE):
    /// `pipette calibrate --cluster c.json --out cal.json train.py --num-layers 2 ...`
    #[command(
        override_usage = "pipette calibrate --out FILE [TORCHRUN OPTIONS] [PIPETTE OPTIONS] SCRIPT [SCRIPT ARGS]...",
        disable_version_flag = true
    )]
    Calibrate(Box<CalibrateArgs>),
    /// List the model presets usable with --model
    Presets {
        #[command(flatten)]
        output: OutputOptions,
    },
    /// Print a shell completion script: `pipette completions bash >
    /// ~/.local/share/bash-completion/completions/pipette-run` (and `--program pipette`
    /// for this tool)
    Completions {
        /// The shell
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
        /// The program to complete
        #[arg(long, value_name = "PROGRAM", default_value = "pipette-run")]
        program: Program,
    },
    /// Show the site configuration: each pipette-run option that has a value without the
    /// command line, and where it comes from (file, environment variable, built-in)
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
    /// Check that the nodes are ready to run, before a job does: for every node pipette-run
    /// would use (found as it finds them, reached as it reaches them, with the environment
    /// it gives them), whether it answers, torchrun and the python, PyTorch and
    /// megatron-core it runs, nvidia-smi and the GPUs (or "none (CPU node)"), the NCCL_*
    /// variables set there, its clock against this machine's, and the free space where the
    /// run directory goes. Prints a table and, for each problem, a line saying what to
    /// fix; exits 68 when a node cannot be reached, 71 when one lacks torchrun, 73 for any
    /// other problem, 0 when warnings are all there is:
    /// `pipette doctor --hostfile hosts --ssh-config ~/.ssh/cluster`
    ///
    /// Every node gets one probe (a fixed sh script, every value passed to it as an
    /// argument) through the transport a launch would use, all nodes at once, each under
    /// --timeout: a node that hangs is reported as not answering and holds up no other.
    ///
    /// STATUS is the worst found on a node: ok; warning (a run would go, but read the
    /// line about it); problem (a run would fail: no PyTorch, a broken python or driver,
    /// GPU and CPU nodes mixed, less than 1 GiB free); no torchrun; unreachable; no answer.
    /// Nodes alike share a row. SKEW is the node's clock minus this machine's, at the
    /// midpoint of the probe's round trip; FREE is the space where the run directory
    /// (--run-dir) goes. --json prints the same as one object for tools.
    ///
    /// Examples: `pipette doctor` inside a Slurm job (over srun); `pipette doctor --hosts
    /// gpu[01-04] --ssh-args "-p 2222"`; `pipette doctor --cluster c.json --env
    /// NCCL_IB_HCA=mlx5_0` (the environment the launch would give)
    Doctor(Box<DoctorArgs>),
    /// Print the manual page (roff): `pipette man | man -l -`, or
    /// `pipette man > ~/.local/share/man/man1/pipette-run.1`
    Man {
        /// The program whose page is printed
        #[arg(long, value_name = "PROGRAM", default_value = "pipette-run")]
        program: Program,
    },
}

/// `pipette config`'s actions.
#[derive(Debug, Clone, Subcommand)]
pub enum ConfigAction {
    /// Every pipette-run option with a value, and where it comes from: the site
    /// configuration file, an environment variable, or the built-in default
    Show {
        /// The site configuration file (default: $XDG_CONFIG_HOME/pipette/config.toml)
        #[arg(long, env = "PIPETTE_CONFIG", value_name = "FILE")]
        config: Option<PathBuf>,
    },
}

/// `pipette estimate`'s options.
#[derive(Debug, Clone, Args)]
pub struct EstimateArgs {
    /// Cluster profile to cost the time on; without it only memory is estimated
    #[arg(long, env = "PIPETTE_CLUSTER", value_name = "FILE")]
    pub cluster: Option<PathBuf>,
    /// Tensor-parallel size (default: the Megatron arguments', else 1)
    #[arg(long, value_name = "T", allow_negative_numbers = true, value_parser = values::positive::<u64>)]
    pub tp: Option<u64>,
    /// Pipeline-parallel size (default: the Megatron arguments', else 1)
    #[arg(long, value_name = "P", allow_negative_numbers = true, value_parser = values::positive::<u64>)]
    pub pp: Option<u64>,
    /// Data-parallel size (default: the cluster's GPUs / (tp × pp), or 1 without a cluster)
    #[arg(long, value_name = "D", allow_negative_numbers = true, value_parser = values::positive::<u64>)]
    pub dp: Option<u64>,
    /// Micro-batch size (default: the Megatron arguments', else 1)
    #[arg(long, value_name = "B", allow_negative_numbers = true, value_parser = values::positive::<u64>)]
    pub mbs: Option<u64>,
    /// Virtual stages per pipeline rank (interleaved schedule)
    #[arg(long, value_name = "V", allow_negative_numbers = true, value_parser = values::positive::<u64>)]
    pub vpp: Option<u64>,
    /// Activation recomputation: none, selective, or full (uniform, one layer per group)
    #[arg(long, value_name = "MODE", value_parser = parse_recompute)]
    pub recompute: Option<Recompute>,
    /// Sequence parallelism (with tp > 1)
    #[arg(long = "sequence-parallel")]
    pub sequence_parallel: bool,
    /// The distributed optimizer (optimizer state sharded over dp)
    #[arg(long = "distributed-optimizer")]
    pub distributed_optimizer: bool,
    /// Transformer layers per pipeline stage, comma-separated, for an uneven split
    #[arg(long = "layers-per-stage", value_name = "LIST", value_delimiter = ',')]
    pub layers_per_stage: Option<Vec<u64>>,
    /// The time model whose full report is shown; the others are shown beside it
    #[arg(long = "time-model", value_name = "MODEL", default_value = "pipette")]
    pub time_model: TimeModel,
    /// Calibration of the estimators (`pipette calibrate --out FILE`)
    #[arg(long, env = "PIPETTE_CALIBRATION", value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelOptions,
    #[command(flatten)]
    pub output: OutputOptions,
    /// Megatron arguments, as they would follow SCRIPT
    #[arg(last = true, value_name = "MEGATRON ARGS")]
    pub megatron_args: Vec<String>,
}

/// `pipette calibrate`'s options: pipette-run's, and where the calibration goes.
#[derive(Debug, Clone, Args)]
pub struct CalibrateArgs {
    /// Where to write the trial report with the fitted calibration (JSON)
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// The run to calibrate, exactly as pipette-run takes it
    #[command(flatten)]
    pub run: RunCli,
}

/// `pipette plan`'s options.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub discovery: DiscoveryOptions,
    #[command(flatten)]
    pub model: ModelOptions,
    #[command(flatten)]
    pub planning: PlanningOptions,
    #[command(flatten)]
    pub output: OutputOptions,
    /// GPUs per node to plan for (default: every GPU of the profile)
    #[arg(
        long = "nproc-per-node",
        alias = "nproc_per_node",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub nproc_per_node: Option<NprocPerNode>,
    /// Show a picture of the plan instead of its report, as text: the rank map over the
    /// nodes, the pipeline timeline of one iteration, the node-link heat map, or memory per
    /// stage (a launch's run directory holds them as SVG files)
    #[arg(long, value_name = "PICTURE", value_parser = picture_parser(), conflicts_with = "json")]
    pub show: Option<Picture>,
    /// Megatron arguments, as they would follow SCRIPT
    #[arg(last = true, value_name = "MEGATRON ARGS")]
    pub megatron_args: Vec<String>,
}

/// `pipette profile`'s options.
#[derive(Debug, Clone, Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub discovery: DiscoveryOptions,
    /// GPUs to measure per node (without GPUs: CPU processes standing in for them)
    #[arg(long = "nproc-per-node", alias = "nproc_per_node", value_name = "N", allow_negative_numbers = true, value_parser = nproc_count)]
    pub nproc_per_node: Option<u32>,
    #[command(flatten)]
    pub access: AccessOptions,
    #[command(flatten)]
    pub profiling: ProfilingOptions,
    /// Where to write the profile
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    #[command(flatten)]
    pub output: OutputOptions,
    #[command(flatten)]
    pub nodes: NodeOptions,
}

/// `pipette doctor`'s options: pipette-run's for finding and reaching the nodes.
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub discovery: DiscoveryOptions,
    #[command(flatten)]
    pub access: AccessOptions,
    /// Where the run directory would go (its free space is checked on every node; default:
    /// ./pipette-runs)
    #[arg(long = "run-dir", value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Less free space than this where the run directory goes is a warning (less than
    /// 1 GiB, or than this if smaller, a problem): room for logs, and for checkpoints when
    /// they go beside it
    #[arg(long = "min-free", value_name = "SIZE", default_value = "10GiB", allow_hyphen_values = true, value_parser = values::bytes)]
    pub min_free: u64,
    /// How long each node has to answer; one that does not is reported as not answering
    #[arg(long, value_name = "DURATION", default_value = "60s", allow_hyphen_values = true, value_parser = options::parse_duration)]
    pub timeout: std::time::Duration,
    /// Print the facts and findings as one JSON object (schema "pipette-doctor", version 1)
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub nodes: NodeOptions,
}

/// `pipette profile --nproc-per-node`: a count, capped as pipette-run's is.
fn nproc_count(text: &str) -> Result<u32, String> {
    match text.parse::<NprocPerNode>()? {
        NprocPerNode::Count(n) => Ok(n),
        _ => Err(format!(
            "{text:?} is not a worker count here (give a number from 1 to {})",
            crate::cluster::MAX_SLOTS
        )),
    }
}

fn parse_recompute(text: &str) -> Result<Recompute, String> {
    match text {
        "none" => Ok(Recompute::None),
        "selective" => Ok(Recompute::Selective),
        "full" => Ok(Recompute::Full {
            method: RecomputeMethod::Uniform,
            num_layers: 1,
        }),
        _ => Err(format!(
            "{text:?} is not a recomputation mode (none, selective or full)"
        )),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn short_help_takes_the_first_clause() {
        let cases = [
            (
                "Print the result as JSON on stdout (for tools); messages go to stderr. When",
                Some("Print the result as JSON on stdout"),
            ),
            ("Show what would run (nodes, plan) and launch nothing", None),
            (
                "Annealing evaluations per mapped configuration (default: 1,000 per GPU)",
                Some("Annealing evaluations per mapped configuration"),
            ),
            (
                "Pick a value, e.g. tp. Then more",
                Some("Pick a value, e.g. tp"),
            ),
            ("... for this many reports", None),
            ("Short: then more", None),
        ];
        for (text, want) in cases {
            assert_eq!(first_sentence(text), want, "{text}");
        }
    }

    use super::*;
    use clap::CommandFactory;

    /// Every long option of torchrun in PyTorch's `torch/distributed/run.py` (2.9), with
    /// the spellings it accepts, plus `--shutdown-timeout`, `--virtual-local-rank` and
    /// the duplicate filters of later releases.
    const TORCHRUN_LONG: &[&str] = &[
        "nnodes",
        "nproc-per-node",
        "nproc_per_node",
        "rdzv-backend",
        "rdzv_backend",
        "rdzv-endpoint",
        "rdzv_endpoint",
        "rdzv-id",
        "rdzv_id",
        "rdzv-conf",
        "rdzv_conf",
        "standalone",
        "max-restarts",
        "max_restarts",
        "monitor-interval",
        "monitor_interval",
        "start-method",
        "start_method",
        "event-log-handler",
        "event_log_handler",
        "role",
        "module",
        "no-python",
        "no_python",
        "run-path",
        "run_path",
        "log-dir",
        "log_dir",
        "redirects",
        "tee",
        "local-ranks-filter",
        "local_ranks_filter",
        "node-rank",
        "node_rank",
        "master-addr",
        "master_addr",
        "master-port",
        "master_port",
        "local-addr",
        "local_addr",
        "logs-specs",
        "logs_specs",
        "numa-binding",
        "numa_binding",
        "signals-to-handle",
        "signals_to_handle",
        "shutdown-timeout",
        "shutdown_timeout",
        "virtual-local-rank",
        "virtual_local_rank",
        "duplicate-stdout-filters",
        "duplicate_stdout_filters",
        "duplicate-stderr-filters",
        "duplicate_stderr_filters",
    ];

    fn long_names(arg: &clap::Arg) -> Vec<String> {
        let mut names: Vec<String> = arg.get_long().into_iter().map(String::from).collect();
        names.extend(
            arg.get_all_aliases()
                .unwrap_or_default()
                .into_iter()
                .map(String::from),
        );
        names
    }

    fn is_torchrun(arg: &clap::Arg) -> bool {
        is_torchrun_option(arg)
    }

    #[test]
    fn torchrun_options_are_exactly_torchruns() {
        let cmd = RunCli::command();
        let mut ours: Vec<String> = cmd
            .get_arguments()
            .filter(|a| is_torchrun(a))
            .flat_map(long_names)
            .collect();
        let mut theirs: Vec<String> = TORCHRUN_LONG.iter().map(|s| s.to_string()).collect();
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn pipette_options_never_collide_with_torchruns() {
        let cmd = RunCli::command();
        for arg in cmd.get_arguments().filter(|a| !is_torchrun(a)) {
            for name in long_names(arg) {
                assert!(
                    !TORCHRUN_LONG.contains(&name.as_str()),
                    "--{name} is a torchrun option"
                );
                // argparse accepts unambiguous prefixes: ours must not be one of theirs.
                assert!(
                    !TORCHRUN_LONG.iter().any(|t| t.starts_with(name.as_str())),
                    "--{name} is a prefix of a torchrun option"
                );
            }
            if let Some(short) = arg.get_short() {
                assert!(!['m', 'r', 't'].contains(&short), "-{short} is torchrun's");
            }
        }
    }

    #[test]
    fn cli_definition_is_consistent() {
        RunCli::command().debug_assert();
        PipetteCli::command().debug_assert();
        run_command().debug_assert();
        pipette_command().debug_assert();
    }

    fn rendered(command: clap::Command, flag: &str) -> String {
        match command.try_get_matches_from(["pipette-run", flag]) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{flag} prints help"),
        }
    }

    /// `-h` was 244 lines, most of them torchrun's thirty options.
    #[test]
    fn short_help_shows_pipette_options_and_says_where_torchrun_s_are() {
        let short = rendered(run_command(), "-h");
        let long = rendered(run_command(), "--help");
        assert!(
            short.contains("--dry-run") && short.contains("--cluster"),
            "{short}"
        );
        assert!(!short.contains("--rdzv-backend"), "{short}");
        assert!(short.contains("--help lists them all"), "{short}");
        assert!(short.contains("Exit codes:"), "{short}");
        assert!(long.contains("--rdzv-backend") && long.contains("--dry-run"));
        assert!(!long.contains("--help lists them all"));
        assert!(short.lines().count() * 2 < long.lines().count());
    }

    /// `pipette profile` and `pipette doctor` reach the nodes as pipette-run does: the same
    /// launcher, ssh configuration, torchrun, environment and transport arguments.
    #[test]
    fn profile_and_doctor_take_pipette_run_s_node_options() {
        let node_options = [
            "--launcher",
            "ssh",
            "--ssh-config",
            "cfg",
            "--torchrun",
            "/opt/tr",
            "--env",
            "A=1",
            "--env-file",
            "e",
            "--ssh-args",
            "-p 2222",
            "--srun-args",
            "--mpi=pmix",
        ];
        let parse = |head: &[&str]| {
            let args: Vec<std::ffi::OsString> = ["pipette"]
                .iter()
                .chain(head)
                .chain(&node_options)
                .map(Into::into)
                .collect();
            parse_pipette(&args, None).map(|cli| cli.command)
        };
        let (access, nodes) = match parse(&["profile", "--out", "p.json"]) {
            Ok(PipetteCommand::Profile(args)) => (args.access, args.nodes),
            other => panic!("{other:?}"),
        };
        let (d_access, d_nodes) = match parse(&["doctor"]) {
            Ok(PipetteCommand::Doctor(args)) => (args.access, args.nodes),
            other => panic!("{other:?}"),
        };
        for (access, nodes) in [(access, nodes), (d_access, d_nodes)] {
            assert_eq!(access.launcher, Some(options::Launcher::Ssh));
            assert_eq!(access.ssh_config, Some(PathBuf::from("cfg")));
            assert_eq!(access.torchrun, "/opt/tr");
            assert_eq!(nodes.env, [("A".to_string(), Some("1".to_string()))]);
            assert_eq!(nodes.env_file, Some(PathBuf::from("e")));
            assert_eq!(nodes.ssh_args.unwrap().0, ["-p", "2222"]);
            assert_eq!(nodes.srun_args.unwrap().0, ["--mpi=pmix"]);
        }
    }

    #[test]
    fn completions_and_manual_pages_cover_both_programs() {
        use clap_complete::Shell;
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = String::from_utf8(completions(shell, Program::PipetteRun)).unwrap();
            assert!(script.contains("pipette-run"), "{shell}");
            assert!(
                script.contains("dry-run") && script.contains("nproc-per-node"),
                "{shell}"
            );
            let script = String::from_utf8(completions(shell, Program::Pipette)).unwrap();
            assert!(
                script.contains("calibrate") && script.contains("completions"),
                "{shell}"
            );
        }
        let page = String::from_utf8(man_page(Program::PipetteRun).unwrap()).unwrap();
        assert!(page.starts_with(".ie"), "{}", &page[..40]);
        assert!(page.contains(".TH pipette-run"), "{page}");
        assert!(page.contains("dry\\-run"), "{page}");
        let page = String::from_utf8(man_page(Program::Pipette).unwrap()).unwrap();
        assert!(page.contains(".TH pipette") && page.contains("calibrate"));
    }
}
