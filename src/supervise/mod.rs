//! Supervise: watch a launched job to its end, and when a node fails or the job hangs,
//! tear it down, leave the bad nodes out, re-plan on the survivors and resume from the last
//! checkpoint, a bounded number of times: the pipeline's loop back after a failure
//! (`NodeGroup ─▶ Outcome`, and on failure back to `Plan`; the other loop back, the trial
//! rounds, comes before the launch, and [`crate::replan`] decides both).
//!
//! # What is a failure
//!
//! - a node's torchrun exits non-zero or is ended by a signal (a node's torchrun that exits
//!   0 while others still run is fine: the job goes on);
//! - its transport dies (ssh reports the connection lost) or its command cannot be started;
//! - the job makes no progress: once Megatron's iteration lines have begun, no iteration
//!   line (nor a line about checkpoints or evaluation, which may take longer than a few
//!   iterations) for the stall timeout; before the first one, and after the last
//!   (`iteration N/N`: the final save and the shutdown), no line of output at all from any
//!   node for the start-up timeout. Time the job's processes on this machine spent waiting
//!   for a CPU is not counted (`starved.rs`): a starved job is slow, not stuck.
//!
//! # Which nodes are left out
//!
//! Every failure ends the attempt: every node is torn down (TERM, the grace period, KILL;
//! then a sweep for what a launcher left behind, see [`crate::launch`]). A node is left out
//! of the next attempt only on evidence against it:
//!
//! 1. the node(s) whose failure was seen first (in the same poll), the most severe kind
//!    only: a lost connection over a launcher ended by a signal over a non-zero exit. (When
//!    one node dies, its peers fail moments later with communication errors; those are
//!    consequences, not causes.)
//! 2. after a stall, every node where a process of the job was found stopped (looked for
//!    before the teardown), and every node whose torchrun did not stop within the grace
//!    period after TERM, unless none did: on a busy machine every node can be slower than
//!    the grace period, which alone blames none. After a failure with a culprit, a peer
//!    slow to stop is only killed and health-checked;
//! 3. every node that fails the health check ([`health`]): unreachable within the health
//!    timeout, or fewer GPUs visible than its profile lists.
//!
//! A failure that is the job's own stops the job instead, with the worker's exit code and
//! one line naming the cause, nobody left out and no re-plan spent: a full disk, a path it
//! may not write, the master port in use, a passed-on signal the script does not handle, an
//! unreadable checkpoint tracker (read in the failure's error line or any node's log), or
//! the same failure as the attempt before, at the same iteration or with the same error
//! ([`decide::job_cause`], [`decide::FailureMark`]). Before a launch or a resume, `--save` is
//! checked writable and its tracker naming a checkpoint that is there ([`save_check`]).
//!
//! The rest are the survivors. The job is re-planned on them with the same settings (the
//! global batch is kept) by [`crate::replan::failure::replan()`], which prefers a plan keeping tp × pp
//! so the checkpoint loads without resharding; the relaunch gets `--load SAVE` when the
//! user has `--save` and a checkpoint exists, and goes into `attempt-N/` of the run
//! directory. At most `max_replans` times; then, or when no plan is possible, the exit code
//! is the failing worker's (torchrun's failure report names it; 128 + N when a launcher was
//! ended by signal N, 68 when a node could not be reached, 127 when a command could not
//! start, 124 for a stall, which has no worker exit code).
//!
//! With planning off (a script that is not Megatron's, [`crate::launch::Layout::World`]),
//! the survivors run the same script and arguments again, a smaller world of the same
//! workers per node, started afresh (nothing is resumed), within the same `max_replans`;
//! the `replan` event then has null plans and the world sizes before and after.
//!
//! # Signals
//!
//! SIGINT, SIGTERM, SIGHUP and SIGQUIT end the job: every node is torn down (a second signal
//! kills at once) and pipette-run exits with 128 + the signal's number. No re-plan follows.
//! SIGUSR1 and SIGUSR2 are passed on to the training script's workers on every node
//! ([`crate::launch::signal_workers`]) and the job goes on (see [`signals`]).
//!
//! # The parts
//!
//! - [`stragglers`]: a node that keeps the job at its pace, read from the training script's
//!   straggler report; whether re-mapping around it or leaving it out beats a restart;
//! - [`decide`]: what follows an attempt (blame, survivors, exit code, stop or re-plan), a
//!   pure function of what the driver saw;
//! - [`crate::replan::failure`]: which plan the survivors get (the checkpoint policy),
//!   pure as well; the re-plan policy's owner is [`crate::replan`];
//! - the driver runs the attempts: launch, watch, teardown, sweep and health checks, the
//!   checkpoint read, the re-plan, the next attempt;
//! - [`events`]: everything the supervisor does, as typed [`events::Event`]s written to
//!   `events.jsonl`; [`reporter`] renders the same events as lines for people on stderr;
//! - each node's output, prefixed, is on our stdout/stderr and in the attempt's `logs/`
//!   ([`output`]).
//!
//! Exit codes are named in [`crate::exit`].

pub mod decide;
mod driver;
pub mod events;
pub mod health;
pub mod output;
pub mod reporter;
pub mod save_check;
pub use crate::exec::signals;
mod starved;
pub mod stragglers;
mod watch;

use std::time::Duration;

use serde::Serialize;

use crate::launch::{Attempt, JobSpec, Resume};
use crate::model::parallel::ParallelConfig;
use events::EventLog;
pub use output::Echo;

/// How the job is watched and when it is given up.
#[derive(Debug, Clone)]
pub struct SuperviseOptions {
    /// Between TERM and KILL when a node is torn down.
    pub grace: Duration,
    /// No progress for this long, once iterations have begun, is a failure (`None`: never).
    pub stall_timeout: Option<Duration>,
    /// No output at all for this long before the first iteration line (or after the last)
    /// is a failure (`None`: never). Start-up (imports, dataset indices, NCCL set-up) and
    /// the final save can be long.
    pub startup_timeout: Option<Duration>,
    /// How many times the job may be re-planned and relaunched after failures.
    pub max_replans: u32,
    /// How long a node has to answer its health check (and the sweep).
    pub health_timeout: Duration,
    /// How often the nodes' commands are polled.
    pub poll: Duration,
    /// Our progress line during training at most this often (zero: none).
    pub progress_interval: Duration,
    /// Where the nodes' output is shown; pipette-run's own messages go to stderr unless
    /// this is [`Echo::Off`].
    pub echo: Echo,
    /// Finding slow nodes during training, and acting on them ([`stragglers`]).
    pub stragglers: stragglers::StragglerOptions,
}

impl Default for SuperviseOptions {
    fn default() -> Self {
        SuperviseOptions {
            grace: Duration::from_secs(10),
            stall_timeout: Some(Duration::from_secs(30 * 60)),
            startup_timeout: Some(Duration::from_secs(30 * 60)),
            max_replans: 3,
            health_timeout: Duration::from_secs(20),
            poll: Duration::from_millis(50),
            progress_interval: Duration::from_secs(30),
            echo: Echo::Streams,
            stragglers: stragglers::StragglerOptions::default(),
        }
    }
}

// A node's failure is classified where its end is read, for the trial too.
pub use crate::launch::failure::{FailureReason, NodeFailure};

/// One attempt, for the summary.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptSummary {
    pub number: u32,
    pub hosts: Vec<String>,
    /// The plan's configuration; null when planning is off.
    pub config: Option<ParallelConfig>,
    pub world_size: u64,
    pub resume: Option<Resume>,
    /// The first and last iteration the job reported.
    pub iterations: Option<(u64, u64)>,
    /// How it ended, in words.
    pub end: String,
    /// Nodes left out after it.
    pub left_out: Vec<String>,
    /// What the re-plan after it decided, in words.
    pub replan: Option<String>,
    /// The plan's estimated iteration time, ms; null when planning is off.
    pub estimated_ms: Option<f64>,
    /// Where its time went.
    pub timing: AttemptTiming,
}

/// Where an attempt's time went, as the supervisor measured it (the ledger's source).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct AttemptTiming {
    /// From the launch to the end the watch saw: the training finished, a failure was
    /// detected, a stop arrived.
    #[serde(rename = "running_s", serialize_with = "events::seconds")]
    pub running: Duration,
    /// What the job's lines said within it.
    #[serde(flatten)]
    pub output: output::OutputTiming,
    /// From that end through the teardown, the sweep and the health checks.
    #[serde(rename = "teardown_s", serialize_with = "events::seconds")]
    pub teardown: Duration,
    /// After the teardown: reading the checkpoint, re-planning and preparing the next
    /// attempt (zero for the last).
    #[serde(rename = "restart_s", serialize_with = "events::seconds")]
    pub restart: Duration,
    /// Whether it ended in a failure (its time after the last iteration line is then
    /// the failure's detection).
    pub failed: bool,
}

/// How the whole job ended.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// pipette-run's exit code: 0, the failing worker's, or 128 + a signal.
    pub exit_code: i32,
    pub reason: String,
    pub attempts: Vec<AttemptSummary>,
    pub replans: u32,
    /// From each failure's detection to the relaunch.
    pub relaunch_after: Vec<Duration>,
}

/// The end of a job that a stop signal ended before anything was launched (while the nodes
/// were profiled, or in the trial run, which then left nothing behind): the signal and the
/// exit are recorded in `events` as a launched job's are. `during`: what it stopped
/// (`profiling`, `the trial run`).
pub fn interrupted(events: &EventLog, signal: i32, count: usize, during: &str) -> Outcome {
    let outcome = Outcome {
        exit_code: crate::exit::signal(signal),
        reason: format!(
            "stopped by {} during {during}; nothing was launched or left running",
            signals::signal_name(signal)
        ),
        attempts: Vec::new(),
        replans: 0,
        relaunch_after: Vec::new(),
    };
    events.write(&events::Event::Signal {
        signal: signals::signal_name(signal),
        count,
    });
    events.write(&events::Event::Exit {
        code: outcome.exit_code,
        reason: outcome.reason.clone(),
        attempts: 0,
        replans: 0,
        relaunch_after: Vec::new(),
    });
    outcome
}

/// Runs `first` and supervises it (and every relaunch) to the end. `events` is the run's
/// event log.
pub fn supervise(
    template: &JobSpec,
    first: Attempt,
    options: &SuperviseOptions,
    events: &EventLog,
) -> Outcome {
    driver::run(template, first, options, events)
}
