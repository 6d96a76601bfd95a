//! The trial run: the user's own script, a few iterations under a candidate plan, to
//! measure what the estimators can only guess — each rank's peak memory and the time per
//! iteration — and fit their [`Calibration`] to it. (Named *trial*, not "dry run":
//! `--dry-run` means "plan and render, launch nothing".)
//!
//! - [`trial_args`] (pure): the user's arguments for a short, side-effect-free run; the
//!   plan's parallel arguments are then written by the renderer exactly as for the launch
//!   ([`JobSpec::render`]), so the trial runs what the launch will run.
//! - [`run_trial`]: with `templates/trial/sitecustomize.py` staged on every node once for
//!   all the trials of a launch ([`TrialStaging`], [`crate::exec::staged`]), puts its
//!   directory first on `PYTHONPATH` so every
//!   worker reports its peak memory at exit without any change to the script, runs
//!   torchrun on every node, reads the result lines, Megatron's iteration and memory lines
//!   ([`logs`]), and stops every node when one fails, the time limit passes or a stop
//!   signal arrives (the staging is removed whatever ends the trials); USR1/USR2 reach the
//!   script as in the job ([`launch::signal_workers`]).
//! - [`calibrate`] (pure): fits the calibration to the trials ([`fit`]) and reports the
//!   estimates before and after, and their errors.
//! - [`choice`]: the measured choice among the best plans (`--trial-top-k`).
//!
//! Owns the trial's arguments, hook, log reading and fit. Must not plan (the caller
//! re-plans with the fitted calibration, as [`crate::replan::trials`] decides) or launch
//! the job.

pub mod choice;
pub mod fit;
pub mod logs;

use std::sync::{mpsc, Arc};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cluster::ClusterProfile;
use crate::config::Settings;
use crate::exec::signals::ActSignals;
use crate::exec::staged::{self, JobError, StageError, StagedDirs, StagedFile};
use crate::exec::{format_duration, ExecError, ExecOptions, NodeCommand, Stream};
use crate::launch::failure::NodeFailure;
use crate::launch::{self, JobSpec, LaunchError};
use crate::measure::{Phase, Progress};
use crate::model::memory::estimate_memory;
use crate::model::time::{self, ThroughputBasis, TimeError, TimeModel, TimeOptions, TimeRequest};
use crate::model::{Calibration, ParallelConfig, Placement};
use crate::plan::Plan;

pub use fit::{MemoryFit, MemoryFitMethod, MemoryPoint};
pub use logs::{IterationLine, MemoryLine};

/// The hook, embedded.
pub const SITECUSTOMIZE: &str = include_str!("../../templates/trial/sitecustomize.py");
/// What marks the hook's result line.
pub const RESULT_MARK: &str = "PIPETTE-TRIAL-RESULT ";
/// The result format this code reads.
pub const PROTOCOL: u32 = 1;
/// Iterations of a trial unless `--trial-iters` says otherwise.
pub const DEFAULT_ITERS: u64 = 5;
/// The staged directories' name prefix on the nodes.
const STAGING_PREFIX: &str = "pipette-trial";
/// Lines of a failed node's output kept for the report.
const TAIL_LINES: usize = 20;
/// Lines of the failing rank's traceback kept for the report.
const TRACEBACK_LINES: usize = 16;

/// Megatron options the trial decides, each with a value. Left out, for a trial that is
/// quick and has no side effects: `--save`/`--save-interval` (no checkpoint of a
/// throw-away run may overwrite the user's), `--load` (resuming would skip the iterations
/// we measure, and loading takes time that says nothing of an iteration), the length and
/// evaluation of the run (replaced by ours).
const TRIAL_OPTIONS: &[&str] = &[
    "train-iters",
    "train-samples",
    "exit-interval",
    "eval-iters",
    "eval-interval",
    "log-interval",
    "save",
    "save-interval",
    "load",
];

/// The user's arguments for a trial of `iters` iterations of `global_batch` samples:
/// [`TRIAL_OPTIONS`] dropped, then `--train-iters N --exit-interval N --eval-iters 0
/// --eval-interval N --log-interval 1` (before a `--`). `--eval-interval` is given although
/// nothing is evaluated: megatron-core 0.19 has no default for it and divides by it when it
/// counts the samples a run needs. A run measured in samples (`--train-samples`) gets
/// `--train-samples N × global batch` instead: Megatron refuses `--train-iters` next to the
/// sample-based schedule options (`--lr-decay-samples`, `--lr-warmup-samples`, ...).
/// Returns the arguments and a note per dropped option.
pub fn trial_args(args: &[String], iters: u64, global_batch: u64) -> (Vec<String>, Vec<String>) {
    let (mut out, dropped, tail) = launch::drop_options(args, TRIAL_OPTIONS, TRIAL_OPTIONS);
    let by_samples = dropped.iter().any(|(name, _)| name == "train-samples");
    let notes = dropped
        .into_iter()
        .filter(|(name, _)| matches!(name.as_str(), "save" | "save-interval" | "load"))
        .map(|(name, value)| {
            format!(
                "the trial leaves out --{name}{} (no checkpoints in a trial)",
                value.map(|v| format!(" {v}")).unwrap_or_default()
            )
        })
        .collect();
    let iters = iters.max(2);
    let n = iters.to_string();
    let length = if by_samples {
        (
            "--train-samples",
            iters.saturating_mul(global_batch).to_string(),
        )
    } else {
        ("--train-iters", n.clone())
    };
    for (option, value) in [
        (length.0, length.1.as_str()),
        ("--exit-interval", n.as_str()),
        ("--eval-iters", "0"),
        ("--eval-interval", n.as_str()),
        ("--log-interval", "1"),
    ] {
        out.push(option.to_string());
        out.push(value.to_string());
    }
    out.extend(tail.iter().cloned());
    (out, notes)
}

/// What one trial needs.
#[derive(Debug, Clone)]
pub struct TrialRequest<'a> {
    /// How the job is launched (script, torchrun, environment, transport).
    pub template: &'a JobSpec,
    /// The settings the plan was made with.
    pub settings: &'a Settings,
    /// The plan whose configuration and mapping are tried.
    pub plan: &'a Plan,
    pub iters: u64,
    /// Stop once the median iteration is stable ([`logs::median_is_stable`]) rather than
    /// after `iters`: the short runs of the measured choice ([`choice`]).
    pub stop_when_stable: bool,
    /// For the whole trial.
    pub timeout: Duration,
    /// For staging, the port query and cleanup.
    pub command_timeout: Duration,
    /// A python on node 0, for the free-port query (remote transports).
    pub python: &'a str,
    /// Told of every act signal passed on to the script's workers during the trial.
    pub signals: SignalObserver<'a>,
}

/// What the caller is told when an act signal (USR1, USR2) arrives during a trial and is
/// passed on: the signal and how many worker processes it reached, all nodes together.
/// The trial keeps no event log; the caller records it in its own (data flows one way).
#[derive(Clone, Copy)]
pub struct SignalObserver<'a>(pub &'a (dyn Fn(nix::sys::signal::Signal, usize) + Sync));

impl std::fmt::Debug for SignalObserver<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SignalObserver")
    }
}

/// One rank's report from the hook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankResult {
    pub rank: i64,
    pub local_rank: i64,
    pub host: String,
    pub peak_rss_bytes: u64,
    #[serde(default)]
    pub cuda: Option<CudaPeak>,
}

/// What PyTorch's CUDA allocator saw on a rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CudaPeak {
    pub device: String,
    pub max_reserved_bytes: u64,
    pub max_allocated_bytes: u64,
}

impl RankResult {
    /// The peak the memory model predicts: the CUDA allocator's reserved peak on a GPU,
    /// else (CPU stand-ins) the process's peak RSS.
    pub fn peak_bytes(&self) -> u64 {
        self.cuda
            .as_ref()
            .map_or(self.peak_rss_bytes, |c| c.max_reserved_bytes)
    }
}

/// What one trial measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialMeasurement {
    pub config: ParallelConfig,
    /// Each node's command, as one shell line, in node-rank order.
    pub commands: Vec<String>,
    /// Every rank's report, by rank.
    pub ranks: Vec<RankResult>,
    pub iterations: Vec<IterationLine>,
    pub memory_lines: Vec<MemoryLine>,
    /// The median iteration after the first, ms.
    pub iteration_ms: Option<f64>,
    pub wall_s: f64,
    /// What the trial changed in the user's arguments.
    pub notes: Vec<String>,
    /// The trial was stopped (TERM to its workers) once its median iteration was stable,
    /// before its last iteration.
    #[serde(default)]
    pub stopped_early: bool,
}

/// Why a trial gave no measurement.
#[derive(Debug, thiserror::Error)]
pub enum TrialError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("cannot set up the trial run on {host}: {detail}")]
    Stage { host: String, detail: String },
    #[error("the trial run cannot be rendered: {0}")]
    Launch(#[from] LaunchError),
    #[error(transparent)]
    ScriptFailed(Box<ScriptFailure>),
    #[error("cannot write the trial's logs to {path}: {detail} (choose another --run-dir)")]
    Logs { path: String, detail: String },
    #[error("the trial run did not finish within {} (stopped it on every node; allow more time with --trial-timeout, or lower --trial-iters; the trial ran: {command})\n{}", format_duration(*.limit), indent(.tail))]
    TimedOut {
        limit: Duration,
        tail: String,
        command: String,
    },
    /// Ranks whose peak-memory report (the trial hook's result line) never came; what
    /// pipette-run knows of why.
    #[error("the trial run ended but rank(s) {} of {expected} reported no peak memory: {} (the trial hook, sitecustomize.py on PYTHONPATH, reports at a worker's exit; every node's output is in {logs})", list_ranks(.missing), if *.stopped_early { "pipette-run stopped the run with TERM once its time per iteration was settled, and these ranks ended before their hook reported" } else { "the run ended by itself, and these ranks exited without Python's exit handlers running (os._exit, a signal, or a script that replaced sitecustomize or PYTHONPATH)" })]
    NoResults {
        expected: usize,
        missing: Vec<u64>,
        stopped_early: bool,
        logs: String,
    },
}

/// `0, 3, 5`, the first [`SHOWN_RANKS`] of them and how many more.
fn list_ranks(ranks: &[u64]) -> String {
    let shown: Vec<String> = ranks.iter().take(SHOWN_RANKS).map(u64::to_string).collect();
    match ranks.len().saturating_sub(SHOWN_RANKS) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

const SHOWN_RANKS: usize = 8;

/// A training script that failed in the trial: where, how, and its own last words.
#[derive(Debug, thiserror::Error)]
#[error("the training script failed in the trial run on {host}{} with exit code {code}{}{}; nothing was launched (fix the script or its arguments; every node's output is in {logs}; the trial ran: {command})\n{}", .rank.map(|r| format!(" (rank {r})")).unwrap_or_default(), if *.out_of_memory { ", out of memory" } else { "" }, .error.as_ref().map(|e| format!(": {e}")).unwrap_or_default(), indent(.tail))]
pub struct ScriptFailure {
    pub host: String,
    pub node_rank: usize,
    /// The global rank torchrun named as the first failure, when it said.
    pub rank: Option<u64>,
    pub code: i32,
    /// The failing rank's error (its traceback's last line), when it was read.
    pub error: Option<String>,
    /// That error is running out of memory ([`logs::ran_out_of_memory`]).
    pub out_of_memory: bool,
    /// The last lines of the failing rank's traceback, else of that node's output.
    pub tail: String,
    /// The directory of the trial's logs, one file per node.
    pub logs: String,
    pub command: String,
}

impl TrialError {
    /// The trial ran out of memory: the configuration does not fit.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, TrialError::ScriptFailed(f) if f.out_of_memory)
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

enum Event {
    Result(String),
    Iteration(IterationLine),
    Memory(MemoryLine),
}

impl Event {
    /// What a line of a trial's output says, if anything.
    fn of(stream: Stream, text: &str) -> Option<Event> {
        if let Some(json) = text.strip_prefix(RESULT_MARK) {
            Some(Event::Result(json.to_owned()))
        } else if stream == Stream::Stdout {
            logs::parse_iteration_line(text)
                .map(Event::Iteration)
                .or_else(|| logs::parse_memory_line(text).map(Event::Memory))
        } else {
            None
        }
    }
}

/// A trial's commands: (host, command) per node, each as one shell line, and what the
/// trial changed in the user's arguments.
pub type TrialCommands = (Vec<(String, NodeCommand)>, Vec<String>, Vec<String>);

/// The trial's commands and notes, without running anything: what `--dry-run` shows.
pub fn trial_commands(
    template: &JobSpec,
    settings: &Settings,
    plan: &Plan,
    iters: u64,
    staging_dirs: &[&str],
) -> Result<TrialCommands, LaunchError> {
    let mut job = template.clone();
    let (args, notes) = trial_args(
        &template.script.args,
        iters,
        settings.training.global_batch_size,
    );
    job.script.args = args;
    let spec = job.render(settings, plan, None, &template.run_dir.join("trial"))?;
    let mut commands = Vec::new();
    let mut lines = Vec::new();
    for (i, node) in spec.nodes.iter().enumerate() {
        let mut command = job.node_command(&spec, i);
        // Not staged yet (`--dry-run`): where it would be.
        let dir = staging_dirs
            .get(i)
            .copied()
            .unwrap_or("/tmp/pipette-trial.XXXXXX");
        let path = match command.env.iter().position(|(k, _)| k == "PYTHONPATH") {
            Some(at) => format!("{dir}:{}", command.env.remove(at).1),
            None => dir.to_string(),
        };
        command.env.push(("PYTHONPATH".into(), path));
        let mut shown = node.clone();
        // The run id differs on every invocation and says nothing to a reader.
        shown.env = command.env.clone();
        shown.env.retain(|(k, _)| k != launch::RUN_ID_VAR);
        // Nor is a credential's value shown (see render::CREDENTIAL_SHOWN).
        for (name, value) in &mut shown.env {
            if crate::render::is_credential_var(name, value) {
                *value = crate::render::CREDENTIAL_SHOWN.to_string();
            }
        }
        lines.push(shown.command_line(&spec.workdir));
        commands.push((node.host.clone(), command));
    }
    Ok((commands, lines, notes))
}

/// The hook staged once on every node, for every trial of a launch (the rounds and the
/// candidates of the measured choice alike); its directories are removed when it is
/// dropped, whatever ended the trials.
pub struct TrialStaging<'a> {
    dirs: StagedDirs<'a>,
}

/// The grace between TERM and KILL for the trial's commands.
const GRACE: Duration = Duration::from_secs(5);

impl<'a> TrialStaging<'a> {
    /// Stages the hook on every one of `hosts` (each at most `command_timeout`).
    pub fn new(
        template: &'a JobSpec,
        hosts: &[String],
        command_timeout: Duration,
    ) -> Result<TrialStaging<'a>, TrialError> {
        let file = StagedFile {
            prefix: STAGING_PREFIX,
            name: "sitecustomize.py",
            contents: SITECUSTOMIZE.as_bytes(),
        };
        let dirs = staged::stage(&template.transport, hosts, &file, command_timeout, GRACE)
            .map_err(stage_error)?;
        Ok(TrialStaging { dirs })
    }

    /// The staged directory of each of `hosts`, in order.
    fn dirs_of(&self, hosts: &[String]) -> Result<Vec<&str>, TrialError> {
        hosts
            .iter()
            .map(|host| {
                self.dirs
                    .iter()
                    .find(|(h, _)| h == host)
                    .map(|(_, d)| d)
                    .ok_or_else(|| TrialError::Stage {
                        host: host.clone(),
                        detail: "the trial's hook was not staged on this node".to_string(),
                    })
            })
            .collect()
    }
}

/// Runs one trial (see the module doc), with the hook of `staging`.
pub fn run_trial(
    request: &TrialRequest<'_>,
    staging: &TrialStaging<'_>,
    progress: &dyn Progress,
) -> Result<TrialMeasurement, TrialError> {
    let template = request.template;
    let hosts = request.plan.mapping.node_order.clone();
    let grace = GRACE;
    let port = staged::free_port(
        &template.transport,
        &hosts[0],
        request.python,
        request.command_timeout,
    )
    .map_err(stage_error)?;
    let mut job = template.clone();
    job.master_port = port;
    let dirs = staging.dirs_of(&hosts)?;
    let (commands, lines, notes) =
        trial_commands(&job, request.settings, request.plan, request.iters, &dirs)?;
    let shown = lines.join(" ; ");

    let logs = NodeLogs::create(&template.run_dir, &hosts)?;
    let (tx, rx) = mpsc::channel::<Event>();
    let log_sink = logs.clone();
    let sink = Arc::new(move |host: &str, stream: Stream, line: &[u8]| {
        log_sink.write(host, line);
        if let Some(event) = Event::of(stream, &String::from_utf8_lossy(line)) {
            let _ = tx.send(event);
        }
    });
    let options = ExecOptions {
        grace,
        capture_limit: Some(64 << 10),
        sink: Some(sink),
    };
    let mut results = Vec::new();
    let mut iterations = Vec::new();
    let mut memory_lines = Vec::new();
    let total = request.iters.max(2);
    progress.start(Phase::Trial, total);
    let started = std::time::Instant::now();
    // Act signals that arrive from now on are the trial's to pass on (see exec::signals).
    let mut acts = ActSignals::new();
    let mut stopped_early = false;
    let take = |event: Event,
                results: &mut Vec<String>,
                iterations: &mut Vec<IterationLine>,
                memory_lines: &mut Vec<MemoryLine>| match event {
        Event::Result(json) => results.push(json),
        Event::Iteration(l) => {
            progress.update(Phase::Trial, l.iteration.min(total));
            iterations.push(l);
        }
        Event::Memory(m) => memory_lines.push(m),
    };
    // USR1/USR2 reach the script in the trial as in the job, through the same workers.
    let workers = Arc::new(launch::JobProcesses {
        transport: template.transport.clone(),
        run_id: template.run_id.clone(),
        timeout: request.command_timeout,
    });
    let outcome = staged::run_on_every_node(
        &template.transport,
        &commands,
        &options,
        request.timeout,
        Some(workers),
        |nodes| {
            for signal in acts.take() {
                (request.signals.0)(signal, nodes.signal_workers(signal));
            }
            for event in rx.try_iter() {
                take(event, &mut results, &mut iterations, &mut memory_lines);
            }
            if request.stop_when_stable && !stopped_early && logs::worth_stopping(&iterations) {
                // TERM to the workers, as torchrun stops them: the hook reports each
                // rank's peak on the way out; a script that handles TERM itself runs on
                // to its last iteration, which is as good.
                stopped_early = true;
                nodes.signal_workers(nix::sys::signal::Signal::SIGTERM);
            }
        },
    );
    // What arrived after the last look; and, when the trial was stopped, what the nodes
    // printed on the way out, which may not all have reached the sink.
    for event in rx.try_iter() {
        take(event, &mut results, &mut iterations, &mut memory_lines);
    }
    if let (true, Err(JobError::Failed { outputs, .. })) = (stopped_early, &outcome) {
        for (out, err) in outputs {
            for (stream, bytes) in [(Stream::Stdout, out), (Stream::Stderr, err)] {
                for line in String::from_utf8_lossy(bytes).lines() {
                    if let Some(event) = Event::of(stream, line) {
                        take(event, &mut results, &mut iterations, &mut memory_lines);
                    }
                }
            }
        }
    }
    progress.finish(Phase::Trial);
    let tail_of = |outputs: &[(Vec<u8>, Vec<u8>)], node: usize| {
        outputs
            .get(node)
            .map(|(out, err)| tail(&[out.as_slice(), err.as_slice()]))
            .unwrap_or_default()
    };
    match outcome {
        Ok(_) => {}
        // The end this trial asked for: the workers died of the TERM it sent.
        Err(JobError::Failed { .. }) if stopped_early => {}
        Err(JobError::Exec(e)) => return Err(e.into()),
        Err(JobError::Failed { end, outputs }) => {
            // How the node ended, read as the supervisor reads a job's node.
            let failure = NodeFailure::of(&end);
            let node = end.node;
            let (out, err) = &outputs[node];
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(out),
                String::from_utf8_lossy(err)
            );
            // The failing rank's own error: its traceback in torchrun's report (the
            // hook wrote its error file), else the last exception the node printed.
            let traceback = logs::root_cause_traceback(&text);
            let error = traceback
                .as_ref()
                .and_then(|t| t.last().cloned())
                .or_else(|| logs::last_exception_line(&text));
            let tail = match &traceback {
                Some(t) => t[t.len().saturating_sub(TRACEBACK_LINES)..].join("\n"),
                None => tail_of(&outputs, node),
            };
            return Err(TrialError::ScriptFailed(Box::new(ScriptFailure {
                host: failure.host,
                node_rank: node,
                rank: failure.worker_rank,
                code: failure.exit_code,
                out_of_memory: error.as_deref().is_some_and(logs::ran_out_of_memory),
                error,
                tail,
                logs: logs.dir.display().to_string(),
                command: shown,
            })));
        }
        Err(JobError::TimedOut { limit, outputs }) => {
            return Err(TrialError::TimedOut {
                limit,
                tail: tail_of(&outputs, 0),
                command: shown,
            });
        }
    }
    let mut ranks: Vec<RankResult> = results
        .iter()
        .filter_map(|json| parse_result(json).ok())
        .collect();
    ranks.sort_by_key(|r| r.rank);
    ranks.dedup_by_key(|r| r.rank);
    let expected = request.plan.config.world_size() as usize;
    if ranks.len() < expected {
        let missing = (0..expected as u64)
            .filter(|r| !ranks.iter().any(|got| got.rank == *r as i64))
            .collect();
        return Err(TrialError::NoResults {
            expected,
            missing,
            stopped_early,
            logs: logs.dir.display().to_string(),
        });
    }
    iterations.sort_by_key(|l| l.iteration);
    iterations.dedup_by_key(|l| l.iteration);
    Ok(TrialMeasurement {
        config: request.plan.config.clone(),
        commands: lines,
        ranks,
        iteration_ms: logs::iteration_ms(&iterations),
        iterations,
        memory_lines,
        wall_s: started.elapsed().as_secs_f64(),
        notes,
        stopped_early,
    })
}

/// The trial's output kept per node under the run directory (`trial-logs/N/` for the
/// run's N-th trial), one file per node as its lines arrive, both streams together as a
/// terminal shows them: `node-<node rank>-<host>.log`.
#[derive(Clone)]
struct NodeLogs {
    dir: std::path::PathBuf,
    files: Arc<std::collections::HashMap<String, std::sync::Mutex<std::fs::File>>>,
}

impl NodeLogs {
    fn create(run_dir: &std::path::Path, hosts: &[String]) -> Result<NodeLogs, TrialError> {
        let fail = |path: &std::path::Path, e: std::io::Error| TrialError::Logs {
            path: path.display().to_string(),
            detail: e.to_string(),
        };
        let root = run_dir.join("trial-logs");
        std::fs::create_dir_all(&root).map_err(|e| fail(&root, e))?;
        // The first number not taken: each trial of a run keeps its own logs.
        let mut n = 1;
        let dir = loop {
            let dir = root.join(n.to_string());
            match std::fs::create_dir(&dir) {
                Ok(()) => break dir,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 10_000 => n += 1,
                Err(e) => return Err(fail(&dir, e)),
            }
        };
        let mut files = std::collections::HashMap::new();
        for (rank, host) in hosts.iter().enumerate() {
            if files.contains_key(host) {
                continue; // one file per host name: its lines cannot be told apart
            }
            let safe = crate::render::file_name_part(host);
            let path = dir.join(format!("node-{rank}-{safe}.log"));
            let file = std::fs::File::create(&path).map_err(|e| fail(&path, e))?;
            files.insert(host.clone(), std::sync::Mutex::new(file));
        }
        Ok(NodeLogs {
            dir,
            files: Arc::new(files),
        })
    }

    /// Appends `line` to `host`'s file; a failed write loses the line, never the trial.
    fn write(&self, host: &str, line: &[u8]) {
        use std::io::Write;
        if let Some(file) = self.files.get(host) {
            if let Ok(mut f) = file.lock() {
                let _ = f.write_all(line).and_then(|()| f.write_all(b"\n"));
            }
        }
    }
}

fn stage_error(e: StageError) -> TrialError {
    match e {
        StageError::Exec(e) => e.into(),
        StageError::Node { host, detail } => TrialError::Stage { host, detail },
    }
}

/// The last lines of a node's standard output and then of its standard error (the
/// script's last words, then torchrun's failure report), [`TAIL_LINES`] at most of each,
/// without the hook's result lines.
fn tail(streams: &[&[u8]]) -> String {
    let text: Vec<String> = streams
        .iter()
        .flat_map(|s| {
            let lines: Vec<String> = String::from_utf8_lossy(s)
                .lines()
                .filter(|l| !l.starts_with(RESULT_MARK) && !l.trim().is_empty())
                .map(str::to_owned)
                .collect();
            lines[lines.len().saturating_sub(TAIL_LINES)..].to_vec()
        })
        .collect();
    text.join("\n")
}

/// Reads a result line's JSON.
pub fn parse_result(json: &str) -> Result<RankResult, String> {
    #[derive(Deserialize)]
    struct Line {
        protocol: u32,
        #[serde(flatten)]
        result: RankResult,
    }
    let line: Line = serde_json::from_str(json).map_err(|e| e.to_string())?;
    if line.protocol != PROTOCOL {
        return Err(format!(
            "protocol {} (this pipette-run reads {PROTOCOL})",
            line.protocol
        ));
    }
    Ok(line.result)
}

/// What a trial measured beside what the estimators say, before and after the fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialReport {
    pub trials: Vec<TrialCheck>,
    /// The calibration the estimates were made with before the trial.
    pub before: Calibration,
    /// The fitted calibration.
    pub calibration: Calibration,
    pub memory_fit: Option<MemoryFit>,
    /// Which efficiency was fitted (`measured_compute_efficiency` or
    /// `compute_efficiency`), when an iteration time was measured.
    pub efficiency_field: Option<String>,
    pub notes: Vec<String>,
    /// The measured choice among the best plans, when more than one was trialled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<choice::MeasuredChoice>,
}

/// One trial's measurement and the estimates of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialCheck {
    pub measurement: TrialMeasurement,
    /// Per rank: its pipeline stage and the peak estimated for it, before and after.
    pub ranks: Vec<RankCheck>,
    /// The largest measured peak, and the estimate of the stage it was on.
    pub peak: Comparison,
    pub iteration_ms: Option<Comparison>,
}

/// One rank's peak against the estimate of its stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankCheck {
    pub rank: i64,
    pub host: String,
    pub stage: usize,
    pub measured_bytes: u64,
    pub estimate_before_bytes: u64,
    pub estimate_after_bytes: u64,
}

/// A measurement, the estimates before and after the fit, and their errors in % of the
/// measurement (positive: the estimate is higher).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub measured: f64,
    pub before: f64,
    pub after: f64,
    pub error_before_pct: f64,
    pub error_after_pct: f64,
}

impl Comparison {
    /// How the measurement compares, as a reader takes it: `1.23× the estimate before
    /// calibration, 1.01× after`.
    pub fn to_human(&self) -> String {
        format!(
            "{} before calibration, {} after",
            times_the_estimate(self.measured, self.before),
            times_the_estimate(self.measured, self.after).trim_end_matches(" the estimate")
        )
    }

    pub fn new(measured: f64, before: f64, after: f64) -> Self {
        let pct = |e: f64| {
            if measured > 0.0 {
                (e - measured) / measured * 100.0
            } else {
                0.0
            }
        };
        Comparison {
            measured,
            before,
            after,
            error_before_pct: pct(before),
            error_after_pct: pct(after),
        }
    }
}

/// A measurement as a multiple of its estimate, `2.03× the estimate`: a deviation said the
/// way it is read (a percentage of the measurement, negative when it took longer, had to
/// be inverted); `no estimate` without a positive one.
pub fn times_the_estimate(measured: f64, estimate: f64) -> String {
    if estimate > 0.0 && measured.is_finite() {
        format!("{:.2}× the estimate", measured / estimate)
    } else {
        "no estimate".to_string()
    }
}

/// The pipeline stage of global rank `rank` (Megatron orders ranks tp, cp, dp, pp: tp
/// fastest, pp slowest, so a stage is a contiguous block of tp · dp ranks).
pub fn stage_of(rank: u64, config: &ParallelConfig) -> usize {
    (rank / (config.tp.max(1) * config.dp.max(1))) as usize
}

/// Fits `before` to `trials` (run on `cluster` with `placement`s, one per trial) and
/// reports the estimates before and after. Pure.
pub fn calibrate(
    settings: &Settings,
    cluster: &ClusterProfile,
    trials: &[(TrialMeasurement, Placement)],
    before: &Calibration,
    options: TimeOptions,
) -> Result<TrialReport, TimeError> {
    let (model, training) = (&settings.model, &settings.training);
    let estimate_time =
        |config: &ParallelConfig, placement: &Placement, calibration: &Calibration| {
            let request = TimeRequest {
                model,
                training,
                config,
                cluster,
                placement,
                calibration,
                options,
            };
            time::estimate(&request, TimeModel::Pipette)
        };
    let mut notes = Vec::new();
    // Memory.
    let mut points = Vec::new();
    for (m, _) in trials {
        let estimate = estimate_memory(model, training, &m.config, before);
        for r in &m.ranks {
            let Some(stage) = estimate
                .stages
                .get(stage_of(r.rank.max(0) as u64, &m.config))
            else {
                continue;
            };
            points.push(MemoryPoint {
                fixed_bytes: stage.weights_and_optimizer_bytes,
                activation_bytes: stage.activations.total(),
                measured_bytes: r.peak_bytes(),
            });
        }
    }
    let memory_fit = fit::fit_memory(&points, before.activation_factor, before.allocator_slack);
    let mut after = before.clone();
    if let Some(f) = &memory_fit {
        after.activation_factor = f.activation_factor;
        after.overhead_bytes = f.overhead_bytes;
        notes.extend(f.notes.iter().cloned());
    }
    // Time: every trial with an iteration time, fitted one efficiency for the mean ratio.
    let mut efficiency_field = None;
    let timed: Vec<(&TrialMeasurement, &Placement, f64)> = trials
        .iter()
        .filter_map(|(m, p)| m.iteration_ms.map(|t| (m, p, t)))
        .collect();
    if !timed.is_empty() {
        let basis_measured = {
            let (m, p, _) = timed[0];
            estimate_time(&m.config, p, before)?.stages.iter().any(|s| {
                s.gpu
                    .as_ref()
                    .is_some_and(|g| g.basis == ThroughputBasis::Measured)
            })
        };
        let set = |c: &mut Calibration, e: f64| {
            if basis_measured {
                c.measured_compute_efficiency = e;
            } else {
                c.compute_efficiency = e;
            }
        };
        // The efficiency that makes the summed modelled time equal the summed measurement.
        let measured_sum: f64 = timed.iter().map(|(_, _, t)| t).sum();
        let (e, clamped) = fit::fit_efficiency(measured_sum, |e| {
            let mut c = after.clone();
            set(&mut c, e);
            timed.iter().try_fold(0.0, |sum, (m, p, _)| {
                let request = TimeRequest {
                    model,
                    training,
                    config: &m.config,
                    cluster,
                    placement: p,
                    calibration: &c,
                    options,
                };
                Ok::<f64, TimeError>(
                    sum + time::estimate(&request, TimeModel::Pipette)?.iteration_ms,
                )
            })
        })?;
        if clamped {
            notes.push(format!(
                "the fitted compute efficiency was clamped to {e} (the time model cannot reach the measured time within {}–{})",
                fit::EFFICIENCY_RANGE.0,
                fit::EFFICIENCY_RANGE.1
            ));
        }
        set(&mut after, e);
        efficiency_field = Some(
            if basis_measured {
                "measured_compute_efficiency"
            } else {
                "compute_efficiency"
            }
            .to_string(),
        );
    } else {
        notes.push(
            "no iteration time was read (no Megatron iteration lines after the first): the time calibration is unchanged"
                .to_string(),
        );
    }
    // Before and after, trial by trial.
    let mut checks = Vec::new();
    for (m, placement) in trials {
        let est_before = estimate_memory(model, training, &m.config, before);
        let est_after = estimate_memory(model, training, &m.config, &after);
        let ranks: Vec<RankCheck> = m
            .ranks
            .iter()
            .map(|r| {
                let stage = stage_of(r.rank.max(0) as u64, &m.config);
                let at = |e: &crate::model::MemoryEstimate| {
                    e.stages.get(stage).map_or(0, |s| s.total_bytes)
                };
                RankCheck {
                    rank: r.rank,
                    host: r.host.clone(),
                    stage,
                    measured_bytes: r.peak_bytes(),
                    estimate_before_bytes: at(&est_before),
                    estimate_after_bytes: at(&est_after),
                }
            })
            .collect();
        let top = ranks.iter().max_by_key(|r| r.measured_bytes).cloned();
        let peak = top.map_or(Comparison::new(0.0, 0.0, 0.0), |r| {
            Comparison::new(
                r.measured_bytes as f64,
                r.estimate_before_bytes as f64,
                r.estimate_after_bytes as f64,
            )
        });
        let iteration_ms = match m.iteration_ms {
            Some(t) => {
                let ms = |c: &Calibration| {
                    estimate_time(&m.config, placement, c).map(|e| e.iteration_ms)
                };
                Some(Comparison::new(t, ms(before)?, ms(&after)?))
            }
            None => None,
        };
        checks.push(TrialCheck {
            measurement: m.clone(),
            ranks,
            peak,
            iteration_ms,
        });
    }
    Ok(TrialReport {
        trials: checks,
        before: before.clone(),
        calibration: after,
        memory_fit,
        efficiency_field,
        notes,
        choice: None,
    })
}

impl TrialReport {
    /// A few lines for people.
    pub fn to_human(&self) -> String {
        let mib = |b: f64| b / (1u64 << 20) as f64;
        let mut out = String::new();
        for (i, t) in self.trials.iter().enumerate() {
            let c = &t.measurement.config;
            out.push_str(&format!(
                "trial {}: tp {} pp {} dp {} micro-batch {}, {} iterations in {:.1} s\n",
                i + 1,
                c.tp,
                c.pp,
                c.dp,
                c.micro_batch,
                t.measurement.iterations.len(),
                t.measurement.wall_s
            ));
            for r in &t.ranks {
                out.push_str(&format!(
                    "  rank {} on {} (stage {}): peak {:.0} MiB, estimated {:.0} MiB before, {:.0} MiB after\n",
                    r.rank,
                    r.host,
                    r.stage,
                    mib(r.measured_bytes as f64),
                    mib(r.estimate_before_bytes as f64),
                    mib(r.estimate_after_bytes as f64)
                ));
            }
            out.push_str(&format!(
                "  peak memory: measured {:.0} MiB, {}\n",
                mib(t.peak.measured),
                t.peak.to_human()
            ));
            if let Some(ms) = &t.iteration_ms {
                out.push_str(&format!(
                    "  iteration: measured {:.1} ms, {}\n",
                    ms.measured,
                    ms.to_human()
                ));
            }
        }
        if let Some(choice) = &self.choice {
            out.push_str(&choice.to_human());
        }
        out.push_str(&self.calibration_line());
        for note in &self.notes {
            out.push_str(&format!("note: {note}\n"));
        }
        out
    }

    /// The fitted calibration, one line.
    pub fn calibration_line(&self) -> String {
        let mib = |b: f64| b / (1u64 << 20) as f64;
        let c = &self.calibration;
        format!(
            "calibration: activation factor {:.3}, overhead {:.0} MiB, compute efficiency {:.3} (measured TFLOPS) / {:.3} (datasheet)\n",
            c.activation_factor,
            mib(c.overhead_bytes as f64),
            c.measured_compute_efficiency,
            c.compute_efficiency
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    /// A missing peak-memory report names the ranks and what pipette-run did or saw,
    /// never a guess about the user's environment first.
    #[test]
    fn a_missing_report_says_what_pipette_run_knows() {
        let e = TrialError::NoResults {
            expected: 8,
            missing: vec![0],
            stopped_early: true,
            logs: "/r/trial-logs/2".into(),
        };
        let text = e.to_string();
        assert!(text.starts_with("the trial run ended but rank(s) 0 of 8 reported no peak memory: pipette-run stopped the run with TERM"), "{text}");
        assert!(text.contains("/r/trial-logs/2"), "{text}");
        let e = TrialError::NoResults {
            expected: 16,
            missing: (0..10).collect(),
            stopped_early: false,
            logs: "/r".into(),
        };
        let text = e.to_string();
        assert!(
            text.contains("rank(s) 0, 1, 2, 3, 4, 5, 6, 7 and 2 more of 16"),
            "{text}"
        );
        assert!(text.contains("the run ended by itself"), "{text}");
    }

    /// A run that took twice the estimate reads "2.03× the estimate", never "-50.8 %".
    #[test]
    fn deviations_read_as_multiples_of_the_estimate() {
        assert_eq!(times_the_estimate(1015.0, 500.0), "2.03× the estimate");
        assert_eq!(times_the_estimate(450.0, 500.0), "0.90× the estimate");
        assert_eq!(times_the_estimate(450.0, 0.0), "no estimate");
        let c = Comparison::new(1015.0, 500.0, 1000.0);
        assert_eq!(
            c.to_human(),
            "2.03× the estimate before calibration, 1.01× after"
        );
        // The JSON keeps its signed percentages.
        assert!((c.error_before_pct + 50.74).abs() < 0.01);
    }

    #[test]
    fn trial_args_are_short_and_side_effect_free() {
        let (args, notes) = trial_args(
            &w(
                "--num-layers 2 --train-iters 1000 --save /ck --save_interval=50 --load /ck \
                --eval-interval 100 --eval-iters 10 --log-interval 10 --lr 1e-3 -- --extra",
            ),
            5,
            64,
        );
        assert_eq!(
            args,
            w(
                "--num-layers 2 --lr 1e-3 --train-iters 5 --exit-interval 5 --eval-iters 0 \
               --eval-interval 5 --log-interval 1 -- --extra"
            )
        );
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[0].contains("--save /ck"));
        // A trial needs two iterations: the first is warm-up.
        let (args, _) = trial_args(&w("--num-layers 2"), 1, 64);
        assert!(args.windows(2).any(|p| p == ["--train-iters", "2"]));
        // A run measured in samples stays so: Megatron refuses --train-iters beside
        // --lr-decay-samples.
        let (args, _) = trial_args(
            &w("--train-samples 1000000 --lr-decay-samples 900000 --lr-warmup-samples 100"),
            5,
            64,
        );
        assert_eq!(
            args,
            w(
                "--lr-decay-samples 900000 --lr-warmup-samples 100 --train-samples 320 \
               --exit-interval 5 --eval-iters 0 --eval-interval 5 --log-interval 1"
            )
        );
    }

    #[test]
    fn result_lines_are_read() {
        let json = r#"{"protocol":1,"rank":3,"local_rank":1,"host":"n1","pid":9,"peak_rss_bytes":1024,"cuda":null}"#;
        let r = parse_result(json).unwrap();
        assert_eq!((r.rank, r.local_rank, r.peak_bytes()), (3, 1, 1024));
        let json = r#"{"protocol":1,"rank":0,"local_rank":0,"host":"n1","pid":9,"peak_rss_bytes":1024,"cuda":{"device":"H100","max_reserved_bytes":5,"max_allocated_bytes":4}}"#;
        assert_eq!(parse_result(json).unwrap().peak_bytes(), 5);
        assert!(
            parse_result(&json.replace("\"protocol\":1", "\"protocol\":2"))
                .unwrap_err()
                .starts_with("protocol 2")
        );
    }

    #[test]
    fn stages_are_blocks_of_tp_times_dp_ranks() {
        let c = ParallelConfig::even(8, 2, 2, 2, 1);
        assert_eq!(
            (0..8).map(|r| stage_of(r, &c)).collect::<Vec<_>>(),
            [0, 0, 0, 0, 1, 1, 1, 1]
        );
    }

    #[test]
    fn the_hook_speaks_this_protocol() {
        assert!(SITECUSTOMIZE.contains("PROTOCOL = 1"));
        assert!(SITECUSTOMIZE.contains(RESULT_MARK));
    }

    #[test]
    fn a_failure_report_keeps_the_last_lines() {
        let out = (1..=30).map(|i| format!("line {i}\n")).collect::<String>();
        let t = tail(&[out.as_bytes(), b"PIPETTE-TRIAL-RESULT {}\nerr\n"]);
        assert_eq!(t.lines().count(), TAIL_LINES + 1);
        assert!(t.starts_with("line 11\n"));
        assert!(t.ends_with("line 30\nerr"));
    }
}
