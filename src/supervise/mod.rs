//! Supervise: watch a launched job to its end, and when a node fails or the job hangs,
//! tear it down, leave the bad nodes out, re-plan on the survivors and resume from the last
//! checkpoint, a bounded number of times. The only loop back in the pipeline
//! (`RunningJob ─▶ Outcome`, and on failure back to `Plan`).
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
//!   node for the start-up timeout.
//!
//! # Which nodes are left out
//!
//! Every failure ends the attempt: every node is torn down (TERM, the grace period, KILL;
//! then a sweep for what a launcher left behind, see [`crate::launch`]). Left out of the next
//! attempt are:
//!
//! 1. the node(s) whose failure was seen first (in the same poll), the most severe kind
//!    only: a lost connection over a launcher ended by a signal over a non-zero exit. (When
//!    one node dies, its peers fail moments later with communication errors; those are
//!    consequences, not causes.)
//! 2. every node whose torchrun did not stop within the grace period after TERM: it is
//!    hung or stopped (this is how a stalled node is found: the healthy ones stop at once);
//! 3. every node that fails the health check ([`health`]): unreachable within the health
//!    timeout, or fewer GPUs visible than its profile lists.
//!
//! The rest are the survivors. The job is re-planned on them with the same settings (the
//! global batch is kept) by [`crate::launch::replan()`], which prefers a plan keeping tp × pp
//! so the checkpoint loads without resharding; the relaunch gets `--load SAVE` when the
//! user has `--save` and a checkpoint exists, and goes into `attempt-N/` of the run
//! directory. At most `max_replans` times; then, or when no plan is possible, the exit code
//! is the failing worker's (torchrun's failure report names it; 128 + N when a launcher was
//! ended by signal N, 68 when a node could not be reached, 127 when a command could not
//! start, 124 for a stall, which has no worker exit code).
//!
//! # Signals
//!
//! SIGINT and SIGTERM end the job: every node is torn down (a second signal kills at once)
//! and pipette-run exits with 128 + the signal's number. No re-plan follows.
//!
//! Everything the supervisor does is recorded in `events.jsonl` ([`events`]); each node's
//! output, prefixed, is on our stdout/stderr and in the attempt's `logs/` ([`output`]).

pub mod events;
pub mod health;
pub mod output;
pub mod signals;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use crate::exec::{format_duration, ExecError, Status, TransportKind};
use crate::exit;
use crate::launch::{
    self, checkpoint_format, read_checkpoint, Attempt, CheckpointState, JobTemplate, NodeStop,
    Resume, RunningJob,
};
use crate::model::parallel::ParallelConfig;
use events::{round3, EventLog};
use health::Health;
pub use output::Echo;
use output::{torchrun_root_cause, JobOutput, Phase};
use signals::{signal_name, SignalGuard};

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
    /// Where the nodes' output is shown; pipette-run's own messages go to stderr unless
    /// this is [`Echo::Off`].
    pub echo: Echo,
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
            echo: Echo::Streams,
        }
    }
}

/// Why a node failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// Its torchrun exited with a non-zero code (a worker failed).
    Exited,
    /// Its torchrun was ended by a signal (killed, or the node lost it).
    Signal,
    /// Its command could not be started.
    StartFailed,
    /// The transport's connection to it died.
    ConnectionLost,
}

/// A node's failure, as seen by the supervisor.
#[derive(Debug, Clone, Serialize)]
pub struct NodeFailure {
    pub host: String,
    pub node_rank: u64,
    pub reason: FailureReason,
    /// How its command ended, in words (`exit code 1`, `signal 9 (SIGKILL)`).
    pub status: Option<String>,
    /// The failing worker's exit code (from torchrun's failure report when it has one),
    /// 128 + N for a signal, 68 for an unreachable node, 127 for a command that could not
    /// start.
    pub exit_code: i32,
    /// The global rank of the worker that failed first, when torchrun said.
    pub worker_rank: Option<u64>,
    pub detail: String,
}

impl NodeFailure {
    fn describe(&self) -> String {
        let what = match self.reason {
            FailureReason::Exited => format!(
                "torchrun exited with {}{}",
                self.status.as_deref().unwrap_or("an error"),
                self.worker_rank
                    .map(|r| format!(" (worker rank {r} exited with {})", self.exit_code))
                    .unwrap_or_default()
            ),
            FailureReason::Signal => format!(
                "torchrun was ended by {}",
                self.status.as_deref().unwrap_or("a signal")
            ),
            FailureReason::StartFailed => format!("could not start: {}", self.detail),
            FailureReason::ConnectionLost => format!("connection lost: {}", self.detail),
        };
        format!("{} (node rank {}): {what}", self.host, self.node_rank)
    }
}

/// One attempt, for the summary.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptSummary {
    pub number: u32,
    pub hosts: Vec<String>,
    pub config: ParallelConfig,
    pub resume: Option<Resume>,
    /// The first and last iteration the job reported.
    pub iterations: Option<(u64, u64)>,
    /// How it ended, in words.
    pub end: String,
    /// Nodes left out after it.
    pub left_out: Vec<String>,
    /// What the re-plan after it decided, in words.
    pub replan: Option<String>,
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

impl Outcome {
    /// A few lines for people: every attempt, every re-plan, the exit.
    pub fn summary(&self) -> String {
        let mut text = String::from("pipette-run: summary\n");
        for a in &self.attempts {
            let c = &a.config;
            text.push_str(&format!(
                "  attempt {}: {} node(s) ({}), tp={} pp={} dp={} micro-batch {}{}{}: {}\n",
                a.number,
                a.hosts.len(),
                a.hosts.join(", "),
                c.tp,
                c.pp,
                c.dp,
                c.micro_batch,
                a.resume
                    .as_ref()
                    .map(|r| format!(
                        ", resumed from {}{}",
                        r.dir,
                        r.iteration
                            .map(|i| format!(" at iteration {i}"))
                            .unwrap_or_default()
                    ))
                    .unwrap_or_default(),
                a.iterations
                    .map(|(f, l)| format!(", iterations {f}–{l}"))
                    .unwrap_or_else(|| ", no iteration reported".to_string()),
                a.end
            ));
            if !a.left_out.is_empty() {
                text.push_str(&format!("    left out: {}\n", a.left_out.join(", ")));
            }
            if let Some(replan) = &a.replan {
                text.push_str(&format!("    re-plan: {replan}\n"));
            }
        }
        let relaunch = if self.relaunch_after.is_empty() {
            String::new()
        } else {
            format!(
                "; failure to relaunch: {}",
                self.relaunch_after
                    .iter()
                    .map(|d| format!("{:.2} s", d.as_secs_f64()))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        text.push_str(&format!(
            "  exit code {}: {}; {} re-plan(s){relaunch}\n",
            self.exit_code, self.reason, self.replans
        ));
        text
    }
}

/// How one attempt ended.
enum AttemptEnd {
    Finished,
    /// Failures seen in the same poll (the first to be seen).
    Failed(Vec<NodeFailure>, Instant),
    Stalled(Duration, Instant),
    Signal(i32),
}

/// Runs `first` and supervises it (and every relaunch) to the end. `events` is the run's
/// event log.
pub fn supervise(
    template: &JobTemplate,
    first: Attempt,
    options: &SuperviseOptions,
    events: &EventLog,
) -> Outcome {
    let signals = SignalGuard::install().ok();
    let signal_count = || signals.as_ref().map_or(0, SignalGuard::count);
    let say = |text: String| {
        if options.echo != Echo::Off {
            eprintln!("pipette-run: {text}");
        }
    };
    let mut attempt = first;
    let mut outcome = Outcome {
        exit_code: 0,
        reason: String::new(),
        attempts: Vec::new(),
        replans: 0,
        relaunch_after: Vec::new(),
    };
    let mut failed_at: Option<Instant> = None;
    let finish = |mut outcome: Outcome, code: i32, reason: String| {
        outcome.exit_code = code;
        outcome.reason = reason;
        events.record(
            "exit",
            json!({
                "code": code,
                "reason": outcome.reason,
                "attempts": outcome.attempts.len(),
                "replans": outcome.replans,
                "relaunch_after_s": outcome.relaunch_after.iter().map(|d| round3(d.as_secs_f64())).collect::<Vec<_>>(),
            }),
        );
        outcome
    };

    loop {
        let hosts: Vec<(String, u64)> = attempt
            .spec
            .nodes
            .iter()
            .map(|n| (n.host.clone(), n.node_rank))
            .collect();
        let output = match JobOutput::new(&hosts, &attempt.dir.join("logs"), options.echo) {
            Ok(output) => Arc::new(output),
            Err(e) => {
                let reason = format!(
                    "cannot write the logs in {}: {e} (check the run directory)",
                    attempt.dir.join("logs").display()
                );
                return finish(outcome, exit::ExitCode::Usage.code(), reason);
            }
        };
        let since_failure = failed_at.take().map(|t| t.elapsed());
        if let Some(d) = since_failure {
            outcome.relaunch_after.push(d);
        }
        let c = &attempt.plan.config;
        say(format!(
            "attempt {}: launching torchrun on {} node(s) ({}), tp={} pp={} dp={} micro-batch {}{}",
            attempt.number,
            hosts.len(),
            hosts
                .iter()
                .map(|(h, _)| h.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            c.tp,
            c.pp,
            c.dp,
            c.micro_batch,
            since_failure
                .map(|d| format!(", {:.2} s after the failure", d.as_secs_f64()))
                .unwrap_or_default()
        ));
        events.record(
            "launch",
            json!({
                "attempt": attempt.number,
                "dir": attempt.dir.display().to_string(),
                "nodes": hosts.iter().map(|(h, r)| json!({"host": h, "node_rank": r})).collect::<Vec<_>>(),
                "config": attempt.plan.config,
                "transport": template.transport.kind().as_str(),
                "resume": attempt.resume,
                "since_failure_s": since_failure.map(|d| round3(d.as_secs_f64())),
            }),
        );
        let mut job = launch::start(template, &attempt, output.clone(), options.grace);
        let end = watch(
            &mut job,
            &output,
            signals.as_ref(),
            options,
            events,
            attempt.number,
        );

        // Whatever the end, nothing of this attempt may outlive it.
        let signals_before = signal_count();
        match &end {
            AttemptEnd::Failed(failures, _) => {
                for f in failures {
                    say(f.describe());
                }
                say("tearing the job down".to_string());
            }
            AttemptEnd::Stalled(silent, _) => say(format!(
                "no progress for {}: tearing the job down",
                format_duration(*silent)
            )),
            AttemptEnd::Signal(s) => say(format!(
                "{} received: stopping every node (TERM, {} grace, then KILL; signal again to kill at once)",
                signal_name(*s),
                format_duration(options.grace)
            )),
            AttemptEnd::Finished => {}
        }
        let teardown_start = Instant::now();
        let stops = launch::teardown(&mut job, options.grace, &|| signal_count() > signals_before);
        for stop in stops.iter().filter(|s| s.was_running) {
            output.note(
                &stop.host,
                &format!(
                    "stopped ({}) after {}",
                    stop.status
                        .map_or("unknown status".to_string(), |s| s.to_string()),
                    format_duration(stop.took)
                ),
            );
        }
        let unresponsive: Vec<String> = stops
            .iter()
            .filter(|s| s.was_running && !s.stopped_in_grace)
            .map(|s| s.host.clone())
            .collect();
        let failures = match &end {
            AttemptEnd::Failed(f, _) => f.clone(),
            _ => Vec::new(),
        };
        let blamed = blamed(&failures);
        let mut left_out: Vec<String> = blamed.clone();
        for host in &unresponsive {
            if !left_out.contains(host) {
                left_out.push(host.clone());
            }
        }
        let check_health = matches!(end, AttemptEnd::Failed(..) | AttemptEnd::Stalled(..));
        let (swept, health) = sweep_and_check(
            template,
            &attempt,
            &hosts,
            if check_health { &left_out } else { &[] },
            check_health,
            options,
        );
        events.record(
            "teardown",
            json!({
                "attempt": attempt.number,
                "nodes": stops.iter().map(stop_json).collect::<Vec<_>>(),
                "swept": swept,
                "took_s": round3(teardown_start.elapsed().as_secs_f64()),
                "iterations": output.iterations(),
            }),
        );
        if !health.is_empty() {
            events.record("health", json!({ "nodes": health }));
        }
        for h in health.iter().filter(|h| !h.healthy) {
            say(format!("{} failed its health check: {}", h.host, h.detail));
            if !left_out.contains(&h.host) {
                left_out.push(h.host.clone());
            }
        }
        let mut summary = AttemptSummary {
            number: attempt.number,
            hosts: hosts.iter().map(|(h, _)| h.clone()).collect(),
            config: attempt.plan.config.clone(),
            resume: attempt.resume.clone(),
            iterations: output.iterations(),
            end: String::new(),
            left_out: Vec::new(),
            replan: None,
        };

        let (failure_code, detected_at) = match end {
            AttemptEnd::Finished => {
                summary.end = "finished".to_string();
                outcome.attempts.push(summary);
                say("training finished on every node".to_string());
                return finish(outcome, 0, "training finished".to_string());
            }
            AttemptEnd::Signal(s) => {
                summary.end = format!("stopped by {}", signal_name(s));
                outcome.attempts.push(summary);
                return finish(
                    outcome,
                    exit::signal(s),
                    format!("stopped by {}; every node was torn down", signal_name(s)),
                );
            }
            AttemptEnd::Stalled(silent, at) => {
                summary.end = format!(
                    "no progress for {}{}",
                    format_duration(silent),
                    if unresponsive.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; {} did not stop within the grace period",
                            unresponsive.join(", ")
                        )
                    }
                );
                // A hang has no worker exit code: report it as torchrun's timeout would.
                (exit::ExitCode::Stalled.code(), at)
            }
            AttemptEnd::Failed(failures, at) => {
                let first = failures
                    .iter()
                    .filter(|f| blamed.contains(&f.host))
                    .min_by_key(|f| f.node_rank)
                    .unwrap_or(&failures[0]);
                summary.end = first.describe();
                (first.exit_code, at)
            }
        };
        summary.left_out = left_out.clone();

        if let Some(r) = signals.as_ref().and_then(SignalGuard::received) {
            summary
                .end
                .push_str(&format!("; then {}", signal_name(r.signal)));
            outcome.attempts.push(summary);
            return finish(
                outcome,
                exit::signal(r.signal),
                format!("stopped by {} after a failure", signal_name(r.signal)),
            );
        }
        if !failures.is_empty()
            && failures.len() == hosts.len()
            && failures
                .iter()
                .all(|f| f.reason == FailureReason::StartFailed)
        {
            // Not a node's fault: the launcher itself is missing or broken everywhere.
            outcome.attempts.push(summary);
            let reason = format!(
                "torchrun could not be started on any node ({})",
                failures[0].detail
            );
            say(reason.clone());
            return finish(outcome, failure_code, reason);
        }
        if outcome.replans >= options.max_replans {
            outcome.attempts.push(summary);
            let reason = format!(
                "the job failed and the re-plan limit is reached (--max-replans {})",
                options.max_replans
            );
            say(reason.clone());
            return finish(outcome, failure_code, reason);
        }

        let survivors: Vec<String> = hosts
            .iter()
            .map(|(h, _)| h.clone())
            .filter(|h| !left_out.contains(h))
            .collect();
        let save = template.settings.training.save.clone();
        let checkpoint = match (&save, survivors.first()) {
            (Some(save), Some(host)) => read_checkpoint(
                &template.transport,
                host,
                &template.workdir,
                save,
                options.health_timeout,
            ),
            _ => CheckpointState::None,
        };
        let format = checkpoint_format(&template.script.args);
        let replanned = launch::replan(
            &template.settings,
            &attempt.profile,
            &survivors,
            &attempt.plan.config,
            &template.plan_options,
            checkpoint,
            &format,
        );
        let replanned = match replanned {
            Ok(r) => r,
            Err(e) => {
                events.record(
                    "replan_refused",
                    json!({"reason": e.to_string(), "left_out": left_out, "survivors": survivors}),
                );
                let reason = format!("cannot re-plan: {e}");
                summary.replan = Some(reason.clone());
                outcome.attempts.push(summary);
                say(reason.clone());
                return finish(outcome, failure_code, reason);
            }
        };
        let resume = match (&save, checkpoint.exists()) {
            (Some(dir), true) => Some(Resume {
                dir: dir.clone(),
                iteration: checkpoint.iteration(),
            }),
            _ => None,
        };
        let next = template.prepare(
            attempt.number + 1,
            replanned.profile.clone(),
            replanned.plan.clone(),
            resume.clone(),
        );
        let next = match next {
            Ok(next) => next,
            Err(e) => {
                let reason = format!("cannot prepare the relaunch: {e}");
                summary.replan = Some(reason.clone());
                outcome.attempts.push(summary);
                say(reason.clone());
                return finish(outcome, failure_code, reason);
            }
        };
        let from = &attempt.plan.config;
        let to = &next.plan.config;
        let decision = format!(
            "{} node(s) left{}; tp={} pp={} dp={} → tp={} pp={} dp={} micro-batch {}{}{}",
            survivors.len(),
            if left_out.is_empty() {
                " (none left out)".to_string()
            } else {
                format!(" (left out {})", left_out.join(", "))
            },
            from.tp,
            from.pp,
            from.dp,
            to.tp,
            to.pp,
            to.dp,
            to.micro_batch,
            if replanned.kept_tp_pp {
                ", tp × pp kept: the checkpoint loads as it is".to_string()
            } else {
                String::new()
            },
            match &resume {
                Some(r) => format!(
                    "; resuming from {}{}",
                    r.dir,
                    r.iteration
                        .map(|i| format!(" (iteration {i})"))
                        .unwrap_or_default()
                ),
                None => "; no checkpoint to resume: starting again".to_string(),
            }
        );
        say(format!("re-planned: {decision}"));
        for note in replanned.notes.iter().chain(&next.spec.notes) {
            say(format!("  {note}"));
        }
        events.record(
            "replan",
            json!({
                "attempt": next.number,
                "left_out": left_out,
                "nodes": survivors,
                "from": from,
                "to": to,
                "kept_tp_pp": replanned.kept_tp_pp,
                "resharded": replanned.resharded,
                "resume": resume,
                "notes": replanned.notes.iter().chain(&next.spec.notes).collect::<Vec<_>>(),
            }),
        );
        summary.replan = Some(decision);
        outcome.attempts.push(summary);
        outcome.replans += 1;
        failed_at = Some(detected_at);
        attempt = next;
    }
}

/// Polls the job until it finishes, a node fails, it stalls, or a signal arrives.
fn watch(
    job: &mut RunningJob,
    output: &JobOutput,
    signals: Option<&SignalGuard>,
    options: &SuperviseOptions,
    events: &EventLog,
    attempt: u32,
) -> AttemptEnd {
    let start_failures: Vec<NodeFailure> = job
        .nodes
        .iter()
        .filter_map(|n| {
            let e = n.start_error.as_ref()?;
            Some(NodeFailure {
                host: n.host.clone(),
                node_rank: n.node_rank,
                reason: if e.is_unreachable() {
                    FailureReason::ConnectionLost
                } else {
                    FailureReason::StartFailed
                },
                status: None,
                exit_code: if e.is_unreachable() {
                    exit::ExitCode::Unreachable.code()
                } else {
                    exit::ExitCode::CannotStart.code()
                },
                worker_rank: None,
                detail: e.to_string(),
            })
        })
        .collect();
    if !start_failures.is_empty() {
        record_failures(events, attempt, &start_failures);
        return AttemptEnd::Failed(start_failures, Instant::now());
    }
    let mut progress_reported = false;
    loop {
        if let Some(r) = signals.and_then(SignalGuard::received) {
            events.record(
                "signal",
                json!({"signal": signal_name(r.signal), "count": r.count}),
            );
            return AttemptEnd::Signal(r.signal);
        }
        let mut failures = Vec::new();
        for node in job.nodes.iter_mut().filter(|n| n.is_running()) {
            let Some(command) = node.command.as_mut() else {
                continue;
            };
            match command.try_status() {
                Ok(None) => {}
                Ok(Some(status)) => {
                    node.status = Some(status);
                    if !status.success() {
                        if let Some(command) = node.command.take() {
                            failures.push(classify(&node.host, node.node_rank, command, status));
                        }
                    }
                }
                Err(e) => {
                    node.status = Some(Status::Exited(-1));
                    failures.push(NodeFailure {
                        host: node.host.clone(),
                        node_rank: node.node_rank,
                        reason: FailureReason::Exited,
                        status: None,
                        exit_code: exit::ExitCode::Internal.code(),
                        worker_rank: None,
                        detail: e.to_string(),
                    });
                }
            }
        }
        if !failures.is_empty() {
            let at = Instant::now();
            record_failures(events, attempt, &failures);
            return AttemptEnd::Failed(failures, at);
        }
        if job.nodes.iter().all(|n| n.status.is_some()) {
            return AttemptEnd::Finished;
        }
        if !progress_reported {
            if let Some((first, _)) = output.iterations() {
                progress_reported = true;
                events.record(
                    "progress",
                    json!({"attempt": attempt, "first_iteration": first}),
                );
            }
        }
        let (silent, phase) = output.since_progress();
        let limit = match phase {
            Phase::Training => options.stall_timeout,
            Phase::Starting | Phase::Finishing => options.startup_timeout,
        };
        if let Some(limit) = limit {
            if silent >= limit {
                events.record(
                    "stalled",
                    json!({
                        "attempt": attempt,
                        "silent_s": round3(silent.as_secs_f64()),
                        "last_iteration": output.iterations().map(|(_, l)| l),
                    }),
                );
                return AttemptEnd::Stalled(silent, Instant::now());
            }
        }
        std::thread::sleep(options.poll);
    }
}

fn record_failures(events: &EventLog, attempt: u32, failures: &[NodeFailure]) {
    for f in failures {
        let mut value = serde_json::to_value(f).unwrap_or_else(|_| json!({}));
        if let Some(object) = value.as_object_mut() {
            object.insert("attempt".into(), json!(attempt));
        }
        events.record("node_failed", value);
    }
}

/// What a node's ended command says about its failure.
fn classify(
    host: &str,
    node_rank: u64,
    command: crate::exec::RunningCommand,
    status: Status,
) -> NodeFailure {
    let remote = command.transport() != TransportKind::Local;
    let mut failure = NodeFailure {
        host: host.to_string(),
        node_rank,
        reason: FailureReason::Exited,
        status: Some(status.to_string()),
        exit_code: status.code().unwrap_or(1),
        worker_rank: None,
        detail: String::new(),
    };
    let output = match command.into_output() {
        Ok(output) => output,
        Err(e @ ExecError::Unreachable { .. }) => {
            failure.reason = FailureReason::ConnectionLost;
            failure.exit_code = exit::ExitCode::Unreachable.code();
            failure.detail = e.to_string();
            return failure;
        }
        Err(e) => {
            failure.detail = e.to_string();
            return failure;
        }
    };
    failure.detail = output.last_line().unwrap_or_default();
    match status {
        Status::Signaled(signal) => {
            failure.reason = FailureReason::Signal;
            failure.exit_code = exit::signal(signal);
        }
        // The remote wrapper reports a launcher ended by a signal as 128 + N.
        Status::Exited(code) if remote && exit::is_signal(code) => {
            failure.reason = FailureReason::Signal;
            failure.exit_code = code;
        }
        Status::Exited(code) => {
            let text = format!("{}{}", output.stderr_text(), output.stdout_text());
            match torchrun_root_cause(&text) {
                Some((rank, worker_code)) => {
                    failure.worker_rank = rank;
                    failure.exit_code = worker_code;
                }
                None => failure.exit_code = code,
            }
        }
    }
    failure
}

/// The nodes blamed for a failure: among those seen failing first, the most severe kind.
fn blamed(failures: &[NodeFailure]) -> Vec<String> {
    let Some(worst) = failures.iter().map(|f| f.reason).max() else {
        return Vec::new();
    };
    failures
        .iter()
        .filter(|f| f.reason == worst)
        .map(|f| f.host.clone())
        .collect()
}

/// Sweeps every node of the attempt and, when asked, health-checks those not already left
/// out, all in parallel. Returns the number of processes swept and the health results.
fn sweep_and_check(
    template: &JobTemplate,
    attempt: &Attempt,
    hosts: &[(String, u64)],
    left_out: &[String],
    check: bool,
    options: &SuperviseOptions,
) -> (usize, Vec<Health>) {
    let results: Vec<(usize, Option<Health>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = hosts
            .iter()
            .map(|(host, _)| {
                scope.spawn(move || {
                    let swept = launch::sweep(
                        &template.transport,
                        host,
                        &template.run_id,
                        options.health_timeout,
                    )
                    .unwrap_or(0);
                    let health = (check && !left_out.contains(host)).then(|| {
                        health::check(
                            &template.transport,
                            host,
                            health::expected_gpus(&attempt.profile, host),
                            options.health_timeout,
                        )
                    });
                    (swept, health)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or((0, None)))
            .collect()
    });
    let swept = results.iter().map(|(n, _)| n).sum();
    (swept, results.into_iter().filter_map(|(_, h)| h).collect())
}

fn stop_json(stop: &NodeStop) -> serde_json::Value {
    json!({
        "host": stop.host,
        "node_rank": stop.node_rank,
        "status": stop.status.map(|s| s.to_string()),
        "was_running": stop.was_running,
        "took_s": round3(stop.took.as_secs_f64()),
        "stopped_in_grace": stop.stopped_in_grace,
        "error": stop.error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(host: &str, reason: FailureReason) -> NodeFailure {
        NodeFailure {
            host: host.into(),
            node_rank: 0,
            reason,
            status: None,
            exit_code: 1,
            worker_rank: None,
            detail: String::new(),
        }
    }

    #[test]
    fn the_most_severe_first_failure_is_blamed() {
        let f = [
            failure("a", FailureReason::Exited),
            failure("b", FailureReason::Signal),
            failure("c", FailureReason::Exited),
        ];
        assert_eq!(blamed(&f), ["b"]);
        let f = [
            failure("a", FailureReason::Exited),
            failure("c", FailureReason::Exited),
        ];
        assert_eq!(blamed(&f), ["a", "c"]);
        assert!(blamed(&[]).is_empty());
    }
}
