//! What happens after an attempt ends: who is to blame, who is left out, who survives, the
//! exit code, and whether to stop or re-plan. Pure: the driver ([`super::driver`]) gathers
//! the facts (how the attempt ended, the teardown, the health checks, the checkpoint) and
//! carries the [`Decision`] out.
//!
//! A node is left out only on evidence against it (see the [module doc](super)):
//!
//! 1. the nodes whose failure was seen first, the most severe kind only ([`blamed`]),
//!    unless the failure is the job's own ([`job_cause`]: a full disk, an unwritable path,
//!    the master port in use, a passed-on signal the script does not handle) or repeats one
//!    of the attempt before at the same iteration or with the same error ([`FailureMark`]):
//!    then the job stops with the worker's exit code, nobody left out, no re-plan spent;
//! 2. after a stall, every node where a process of the job was found stopped (SIGSTOP, a
//!    debugger), and every node whose torchrun did not stop within the grace period after
//!    TERM unless none did (on a loaded machine every node can be slower than the grace
//!    period; that alone blames none: see [`suspects`]). A failure with a culprit does not
//!    count the slow ones either;
//! 3. every node that failed its health check;
//! 4. a straggler the supervisor chose to leave out ([`Ending::Straggler`]; no health check
//!    follows: the job did not fail).

use std::time::Duration;

use super::signals::signal_name;
use super::stragglers::Costed;
use super::{FailureReason, NodeFailure};
use crate::exec::format_duration;
use crate::exit::{self, ExitCode};
use crate::launch::{CheckpointState, Resume};

/// How an attempt ended, as the watcher saw it.
#[derive(Debug, Clone)]
pub enum Ending {
    /// Every node's torchrun exited 0.
    Finished,
    /// Failures seen in the same poll (the first to be seen).
    Failed(Vec<NodeFailure>),
    /// No progress for this long.
    Stalled(Duration),
    /// SIGINT or SIGTERM (its number): the user's stop.
    Signal(i32),
    /// The supervisor stopped a running job to move work off a straggler
    /// ([`super::stragglers`]).
    Straggler(Box<StragglerAct>),
}

/// What the supervisor does about a straggler: re-map around it (on the cluster with its
/// GPUs at their measured speed), leave it out, or swap it for a hot spare.
#[derive(Debug, Clone)]
pub struct StragglerAct {
    pub host: String,
    pub slowdown: f64,
    pub choice: super::stragglers::Choice,
    /// The profile the re-plan runs on: the straggler's GPUs slowed, for a re-map.
    pub profile: Option<crate::cluster::ClusterProfile>,
    /// The choices as they were costed (for the summary).
    pub choices: Vec<super::stragglers::Costed>,
}

impl Ending {
    /// A failure of the job (which health-checks the nodes and may re-plan), not a finish
    /// or the user's stop.
    pub fn is_failure(&self) -> bool {
        matches!(self, Ending::Failed(_) | Ending::Stalled(_))
    }
}

/// What the driver knows when the attempt is over.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The attempt's hosts, in node-rank order.
    pub hosts: &'a [String],
    pub ending: &'a Ending,
    /// Nodes whose torchrun did not stop within the grace period after TERM.
    pub unresponsive: &'a [String],
    /// Nodes that failed their health check.
    pub unhealthy: &'a [String],
    /// Nodes where a process of the job was found stopped after a stall (evidence against
    /// the node: SIGSTOP, a debugger, a frozen device driver).
    pub stopped: &'a [String],
    /// The last iteration the attempt reported.
    pub iteration: Option<u64>,
    /// The failure that ended the attempt before, if one did ([`mark`]).
    pub previous: Option<&'a FailureMark>,
    /// The end of every node's log after a failure: the node seen failing first is often a
    /// peer of the one whose error caused it (a full disk on rank 0's node shows first as
    /// its peers' broken connections).
    pub logs: &'a [String],
    /// A signal that arrived after a failure had ended the attempt.
    pub signal_after: Option<i32>,
    /// Re-plans done so far, and the limit.
    pub replans: u32,
    pub max_replans: u32,
    /// The user's `--save` directory.
    pub save: Option<&'a str>,
    /// What the save directory holds, once read (`None`: not read yet).
    pub checkpoint: Option<CheckpointState>,
}

/// What to do after an attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// How the attempt ended, in words (for the summary).
    pub end: String,
    pub left_out: Vec<String>,
    pub survivors: Vec<String>,
    /// pipette-run's exit code when the job stops now, or later because the re-plan fails.
    pub exit_code: i32,
    pub next: Next,
}

/// The step after the decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    Stop(Stop),
    /// Read the checkpoint in `save` on `host` (a survivor) and decide again with it.
    ReadCheckpoint {
        host: String,
        save: String,
    },
    /// Re-plan on the survivors and relaunch, resuming from `resume` when it is set.
    Replan {
        checkpoint: CheckpointState,
        resume: Option<Resume>,
    },
}

/// Why the job stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// Every node finished.
    Finished,
    /// The user's SIGINT or SIGTERM (its number).
    Signal(i32),
    /// A signal arrived while a failure was being handled.
    SignalAfterFailure(i32),
    /// torchrun could not be started on any node: not a node's fault.
    NothingStarted { detail: String },
    /// The job failed again after `--max-replans` re-plans.
    ReplanLimit { max: u32 },
    /// No plan for the survivors (the re-plan's error).
    ReplanRefused(String),
    /// The relaunch could not be rendered or written.
    PrepareFailed(String),
    /// The attempt's log directory could not be written (before anything was launched).
    LogsUnwritable { dir: String, error: String },
    /// The failure is the job's own, not a node's ([`job_cause`], or the same failure
    /// again after a re-plan): no node is blamed and no re-plan is spent on it.
    JobFault(String),
    /// `--save` cannot be written, or the checkpoint it holds cannot be resumed from,
    /// found before a launch or a resume (nothing was launched).
    SaveUnusable(String),
}

impl Stop {
    /// The reason, as the summary and the `exit` event give it.
    pub fn reason(&self) -> String {
        match self {
            Stop::Finished => "training finished".to_string(),
            Stop::Signal(s) => format!("stopped by {}; every node was torn down", signal_name(*s)),
            Stop::SignalAfterFailure(s) => {
                format!("stopped by {} after a failure", signal_name(*s))
            }
            Stop::NothingStarted { detail } => {
                format!("torchrun could not be started on any node ({detail})")
            }
            Stop::ReplanLimit { max } => {
                format!("the job failed and the re-plan limit is reached (--max-replans {max})")
            }
            Stop::ReplanRefused(e) => format!("cannot re-plan: {e}"),
            Stop::PrepareFailed(e) => format!("cannot prepare the relaunch: {e}"),
            Stop::LogsUnwritable { dir, error } => {
                format!("cannot write the logs in {dir}: {error} (check the run directory)")
            }
            Stop::JobFault(cause) => {
                format!(
                    "the job's own failure, no node is left out and no re-plan is tried: {cause}"
                )
            }
            Stop::SaveUnusable(why) => format!("nothing was launched: {why}"),
        }
    }
}

/// Decides what follows an attempt (see the module doc).
pub fn decide(facts: &Facts<'_>) -> Decision {
    let (mut end, exit_code) = match facts.ending {
        Ending::Finished => return stop(facts, "finished".into(), 0, Stop::Finished),
        Ending::Signal(s) => {
            let end = format!("stopped by {}", signal_name(*s));
            return stop(facts, end, exit::signal(*s), Stop::Signal(*s));
        }
        Ending::Stalled(silent) => {
            let hung = if facts.unresponsive.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} did not stop within the grace period",
                    facts.unresponsive.join(", ")
                )
            };
            let end = format!("no progress for {}{hung}", format_duration(*silent));
            (end, ExitCode::Stalled.code())
        }
        // Not a failure: if the re-plan then fails, that is ours.
        Ending::Straggler(act) => {
            let what = match act.choice {
                super::stragglers::Choice::LeaveOut => "left out",
                super::stragglers::Choice::SwapSpare => "swapped for a spare",
                super::stragglers::Choice::Remap => "re-mapped around",
                super::stragglers::Choice::Keep => "kept",
            };
            let predicted: Vec<String> = act.choices.iter().map(Costed::short).collect();
            let end = format!(
                "straggler {} ({:.2}× slower than the others) {what}{}",
                act.host,
                act.slowdown,
                if predicted.is_empty() {
                    String::new()
                } else {
                    format!(" (per iteration: {})", predicted.join(", "))
                }
            );
            (end, ExitCode::Internal.code())
        }
        Ending::Failed(failures) => match first_blamed(failures) {
            Some(first) => (first.describe(), first.exit_code),
            None => ("failed".to_string(), ExitCode::Internal.code()),
        },
    };
    let fault = job_fault(facts);
    let mut left_out = match fault {
        Some(_) => Vec::new(),
        None => suspects(facts.ending, facts.unresponsive, facts.stopped, facts.hosts),
    };
    for host in facts.unhealthy {
        if !left_out.contains(host) {
            left_out.push(host.clone());
        }
    }
    let survivors: Vec<String> = facts
        .hosts
        .iter()
        .filter(|h| !left_out.contains(h))
        .cloned()
        .collect();
    let decision = |end: String, exit_code: i32, next: Next| Decision {
        end,
        left_out: left_out.clone(),
        survivors: survivors.clone(),
        exit_code,
        next,
    };

    if let Some(s) = facts.signal_after {
        end.push_str(&format!("; then {}", signal_name(s)));
        let next = Next::Stop(Stop::SignalAfterFailure(s));
        return decision(end, exit::signal(s), next);
    }
    if let Ending::Failed(failures) = facts.ending {
        if !failures.is_empty()
            && failures.len() == facts.hosts.len()
            && failures
                .iter()
                .all(|f| f.reason == FailureReason::StartFailed)
        {
            let detail = failures[0].detail.clone();
            return decision(end, exit_code, Next::Stop(Stop::NothingStarted { detail }));
        }
    }
    if let Some(cause) = fault {
        return decision(end, exit_code, Next::Stop(Stop::JobFault(cause)));
    }
    if facts.replans >= facts.max_replans {
        let max = facts.max_replans;
        return decision(end, exit_code, Next::Stop(Stop::ReplanLimit { max }));
    }
    let checkpoint = match (facts.save, survivors.first(), facts.checkpoint) {
        (Some(_), Some(_), Some(state)) => state,
        (Some(save), Some(host), None) => {
            let (host, save) = (host.clone(), save.to_string());
            return decision(end, exit_code, Next::ReadCheckpoint { host, save });
        }
        // No --save, or no survivor to read it on (the re-plan refuses that case).
        _ => CheckpointState::None,
    };
    let resume = match facts.save {
        Some(dir) if checkpoint.exists() => Some(Resume {
            dir: dir.to_string(),
            iteration: checkpoint.iteration(),
        }),
        _ => None,
    };
    decision(end, exit_code, Next::Replan { checkpoint, resume })
}

/// A stop that blames no one.
fn stop(facts: &Facts<'_>, end: String, exit_code: i32, why: Stop) -> Decision {
    Decision {
        end,
        left_out: Vec::new(),
        survivors: facts.hosts.to_vec(),
        exit_code,
        next: Next::Stop(why),
    }
}

/// The nodes left out before any health check (which skips them): those blamed for a
/// failure; after a stall, which blames no one, those where a process of the job was found
/// stopped, and those that did not stop within the grace period unless none did.
///
/// Why not every node that was slow to stop: after a failure its peers' torchruns shut
/// their workers down, and on a busy node (or one whose CPUs the job itself keeps busy)
/// that can take longer than the grace period; such a node is killed, swept and
/// health-checked like every other, and left out only if the check fails. After a stall,
/// not stopping is a sign of which node stalled (a stopped or hung launcher never reacts to
/// TERM), but only when some nodes did stop: when every node was slower than the grace
/// period, the machine was busy, and that blames none of them.
pub fn suspects(
    ending: &Ending,
    unresponsive: &[String],
    stopped: &[String],
    hosts: &[String],
) -> Vec<String> {
    match ending {
        Ending::Failed(failures) => blamed(failures),
        Ending::Stalled(_) => {
            let every_node = !hosts.is_empty() && hosts.iter().all(|h| unresponsive.contains(h));
            let mut suspects = stopped.to_vec();
            if !every_node {
                for host in unresponsive {
                    if !suspects.contains(host) {
                        suspects.push(host.clone());
                    }
                }
            }
            suspects
        }
        Ending::Straggler(act)
            if matches!(
                act.choice,
                super::stragglers::Choice::LeaveOut | super::stragglers::Choice::SwapSpare
            ) =>
        {
            vec![act.host.clone()]
        }
        Ending::Finished | Ending::Signal(_) | Ending::Straggler(_) => Vec::new(),
    }
}

/// The nodes blamed for a failure: among those seen failing first, the most severe kind (a
/// lost connection over a launcher ended by a signal over a non-zero exit). When one node
/// dies, its peers fail moments later with communication errors: consequences, not causes.
pub fn blamed(failures: &[NodeFailure]) -> Vec<String> {
    let Some(worst) = failures.iter().map(|f| f.reason).max() else {
        return Vec::new();
    };
    failures
        .iter()
        .filter(|f| f.reason == worst)
        .map(|f| f.host.clone())
        .collect()
}

/// What a failure that ended an attempt was: compared with the next one's, to tell a
/// failure that follows the job from one that followed a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureMark {
    /// The last iteration the attempt reported before it failed.
    pub iteration: Option<u64>,
    /// The worker's error line, numbers left out (ranks, addresses and process ids differ
    /// from one attempt to the next); empty when there is none to compare (a stall, a
    /// launcher killed by a signal, whose last line is only whatever it printed last).
    pub error: String,
}

/// The mark of the failure that ended the attempt `facts` describe (`None` when it did not
/// fail, or failed where no node or job is to blame: a connection lost, a command that
/// could not start, both the nodes' and already handled).
pub fn mark(facts: &Facts<'_>) -> Option<FailureMark> {
    let error = match facts.ending {
        Ending::Stalled(_) => String::new(),
        Ending::Failed(failures) => {
            let first = first_blamed(failures)?;
            match first.reason {
                FailureReason::Exited => without_numbers(&first.detail),
                FailureReason::Signal => String::new(),
                FailureReason::StartFailed | FailureReason::ConnectionLost => return None,
            }
        }
        Ending::Finished | Ending::Signal(_) | Ending::Straggler(_) => return None,
    };
    Some(FailureMark {
        iteration: facts.iteration,
        error,
    })
}

/// Why the attempt's failure is the job's own and not a node's, in words, if it is: its
/// cause ([`job_cause`]), or the same failure as the attempt before (a re-plan changed the
/// nodes, not the outcome).
fn job_fault(facts: &Facts<'_>) -> Option<String> {
    if let Ending::Failed(failures) = facts.ending {
        let first = first_blamed(failures)?;
        if let Some(cause) = job_cause(first) {
            return Some(cause);
        }
        // A worker's exception in any node's log (not a node lost or a launcher killed,
        // which are the nodes' own).
        let errors = facts.logs.iter().flat_map(|log| log.lines());
        let errors = errors.filter(|l| l.contains("Error") || l.contains("Exception"));
        if let Some(cause) = errors.filter_map(cause_in).next() {
            if first.reason == FailureReason::Exited {
                return Some(cause);
            }
        }
        if let Some(cause) = same_error_everywhere(failures, facts.hosts) {
            return Some(cause);
        }
    }
    let (now, before) = (mark(facts)?, facts.previous?);
    if now.iteration.is_some() && now.iteration == before.iteration {
        let at = now.iteration.unwrap_or_default();
        return Some(format!(
            "it failed again at iteration {at} after a re-plan; the cause is in the job (its data, its arguments, its code), see the node logs"
        ));
    }
    if !now.error.is_empty() && now.error == before.error {
        return Some(
            "the same error again after a re-plan; the cause is in the job (its data, its arguments, its code), see the node logs"
                .to_string(),
        );
    }
    None
}

/// Every node of several failed at once, each with a worker's error and the same one
/// (numbers aside): nothing points at one node (a missing module, a script that is not
/// there, a bad argument), so none is left out for it. Each was, and the job ended with
/// "no node is left to run on" instead of its cause.
fn same_error_everywhere(failures: &[NodeFailure], hosts: &[String]) -> Option<String> {
    let first = failures.first()?;
    let error = without_numbers(&first.detail);
    let every_node = hosts.len() > 1
        && hosts
            .iter()
            .all(|h| failures.iter().any(|f| crate::exec::same_host(&f.host, h)));
    let alike = failures
        .iter()
        .all(|f| f.reason == FailureReason::Exited && without_numbers(&f.detail) == error);
    (every_node && alike && !error.is_empty()).then(|| {
        format!(
            "every node failed with the same error, so the cause is in the job (its code, its \
             arguments, its data or its environment), not in a node: {}",
            one_line(&first.detail)
        )
    })
}

/// The first failure blamed (the lowest node rank among [`blamed`]).
fn first_blamed(failures: &[NodeFailure]) -> Option<&NodeFailure> {
    let blamed = blamed(failures);
    failures
        .iter()
        .filter(|f| blamed.contains(&f.host))
        .min_by_key(|f| f.node_rank)
}

/// Whether a worker's failure is caused by the job rather than by its node, and what the
/// cause is, from its error line and exit code. Each of these fails the same way on any
/// node, so leaving nodes out for it would only spend the healthy ones: storage that is
/// full (or over quota), a path the job writes that it may not, the master port taken by
/// another job, a signal passed on to the script (SIGUSR1, SIGUSR2) that it does not
/// handle, a checkpoint tracker that cannot be read.
pub fn job_cause(failure: &NodeFailure) -> Option<String> {
    const USR1: i32 = 10;
    const USR2: i32 = 12;
    if failure.reason != FailureReason::Exited {
        return None;
    }
    if let Some(cause) = cause_in(&failure.detail) {
        return Some(cause);
    }
    (failure.worker_rank.is_some()
        && (failure.exit_code == exit::signal(USR1) || failure.exit_code == exit::signal(USR2)))
    .then(|| {
        format!(
            "a worker was ended by {}, which the training script does not handle (handle it, \
             or do not send it)",
            signal_name(failure.exit_code - 128)
        )
    })
}

/// The job's own cause an error line names, if it names one (see [`job_cause`]).
fn cause_in(detail: &str) -> Option<String> {
    let has = |needles: &[&str]| needles.iter().any(|n| detail.contains(n));
    let cause = if has(&[
        "No space left on device",
        "ENOSPC",
        "[Errno 28]",
        "Disk quota exceeded",
        "[Errno 122]",
        "file write failed",
        // torch.save's zip writer when a write came up short (seen on a full tmpfs).
        "inline_container.cc",
    ]) {
        "the storage the job writes to is full (free space on it, or point --save elsewhere)"
    } else if has(&[
        "Read-only file system",
        "[Errno 30]",
        "Permission denied",
        "[Errno 13]",
    ]) {
        "the job may not write where it writes (check --save and the paths in the arguments)"
    } else if has(&["Address already in use", "EADDRINUSE", "[Errno 98]"]) {
        "the master port is in use, by another job perhaps (pick another with --master-port)"
    } else if has(&[
        "Invalid metadata file",
        "latest_checkpointed_iteration",
        "invalid literal for int()",
    ]) {
        "the checkpoint tracker (latest_checkpointed_iteration.txt) cannot be read (fix or remove it)"
    } else {
        return None;
    };
    Some(format!("{cause}: {}", one_line(detail)))
}

/// `text` on one line, at most 200 characters (an error line can be long).
fn one_line(text: &str) -> String {
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

/// `text` with every run of digits as `#`: two attempts' errors compared without their
/// ranks, addresses, ports and process ids.
fn without_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_number = false;
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('#');
            }
            in_number = true;
        } else {
            out.push(c);
            in_number = false;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervise::stragglers::three_choices;
    use crate::supervise::stragglers::Choice;

    const SIGINT: i32 = 2;

    fn failure(host: &str, rank: u64, reason: FailureReason, exit_code: i32) -> NodeFailure {
        NodeFailure {
            host: host.into(),
            node_rank: rank,
            reason,
            status: None,
            exit_code,
            worker_rank: None,
            detail: "a detail".into(),
        }
    }

    #[test]
    fn the_most_severe_first_failure_is_blamed() {
        let f = [
            failure("a", 0, FailureReason::Exited, 1),
            failure("b", 1, FailureReason::Signal, 1),
            failure("c", 2, FailureReason::Exited, 1),
        ];
        assert_eq!(blamed(&f), ["b"]);
        let f = [
            failure("a", 0, FailureReason::Exited, 1),
            failure("c", 2, FailureReason::Exited, 1),
        ];
        assert_eq!(blamed(&f), ["a", "c"]);
        assert!(blamed(&[]).is_empty());
    }

    /// One row of the table: the facts that differ from a plain first failure of three
    /// nodes (`a`, `b`, `c`; no re-plan yet, at most 3; no `--save`), and what must follow.
    struct Case {
        name: &'static str,
        ending: Ending,
        unresponsive: &'static [&'static str],
        unhealthy: &'static [&'static str],
        signal_after: Option<i32>,
        replans: u32,
        save: Option<&'static str>,
        checkpoint: Option<CheckpointState>,
        stopped: &'static [&'static str],
        iteration: Option<u64>,
        /// The attempt before failed at this iteration with this error line.
        previous: Option<(Option<u64>, &'static str)>,
        /// One node's log tail.
        logs: Option<&'static str>,
        // Expected (when `fault` is set, `next` is a job fault whose cause contains it):
        fault: &'static str,
        exit_code: i32,
        left_out: &'static [&'static str],
        next: Next,
        end: &'static str,
    }

    const BASE: Case = Case {
        name: "",
        ending: Ending::Finished,
        unresponsive: &[],
        unhealthy: &[],
        signal_after: None,
        replans: 0,
        save: None,
        checkpoint: None,
        stopped: &[],
        iteration: None,
        previous: None,
        logs: None,
        fault: "",
        exit_code: 0,
        left_out: &[],
        next: Next::Stop(Stop::Finished),
        end: "",
    };

    fn worker_exit() -> Ending {
        worker_error(3, "a detail")
    }

    /// Worker rank 5 on `b` exited with `code` after printing `error`.
    fn worker_error(code: i32, error: &str) -> Ending {
        let mut f = failure("b", 1, FailureReason::Exited, code);
        f.status = Some("exit code 1".into());
        f.worker_rank = Some(5);
        f.detail = error.into();
        Ending::Failed(vec![f])
    }

    const WORKER_EXIT_END: &str =
        "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 3)";

    fn straggler(choice: Choice) -> StragglerAct {
        StragglerAct {
            host: "b".into(),
            slowdown: 2.0,
            choice,
            profile: None,
            choices: three_choices(Some(300.0), None, Some(200.0)),
        }
    }

    fn replan(checkpoint: CheckpointState, resume: Option<(&str, Option<u64>)>) -> Next {
        Next::Replan {
            checkpoint,
            resume: resume.map(|(dir, iteration)| Resume {
                dir: dir.into(),
                iteration,
            }),
        }
    }

    fn cases() -> Vec<Case> {
        let fresh = replan(CheckpointState::None, None);
        vec![
            Case {
                name: "clean finish",
                end: "finished",
                ..BASE
            },
            Case {
                name: "worker non-zero exit",
                ending: worker_exit(),
                exit_code: 3,
                left_out: &["b"],
                next: fresh.clone(),
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 3)",
                ..BASE
            },
            Case {
                name: "every node failing with the same error blames the job (N6, a variant)",
                ending: Ending::Failed(
                    ["a", "b", "c"]
                        .iter()
                        .zip(0..)
                        .map(|(h, rank)| {
                            let mut f = failure(h, rank, FailureReason::Exited, 1);
                            f.detail = format!("[rank{rank}]: ModuleNotFoundError: No module named 'megatron'");
                            f
                        })
                        .collect(),
                ),
                fault: "every node failed with the same error",
                exit_code: 1,
                left_out: &[],
                end: "a (node rank 0): torchrun exited with an error",
                ..BASE
            },
            Case {
                name: "every node failing with different errors blames them all",
                ending: Ending::Failed(vec![
                    failure("a", 0, FailureReason::Exited, 1),
                    failure("b", 1, FailureReason::Exited, 1),
                    {
                        let mut f = failure("c", 2, FailureReason::Exited, 1);
                        f.detail = "RuntimeError: CUDA error: an illegal memory access".into();
                        f
                    },
                ]),
                exit_code: 1,
                left_out: &["a", "b", "c"],
                next: fresh.clone(),
                end: "a (node rank 0): torchrun exited with an error",
                ..BASE
            },
            Case {
                name: "signal death blames the killed node, not its peers",
                ending: Ending::Failed(vec![
                    failure("a", 0, FailureReason::Exited, 1),
                    failure("c", 2, FailureReason::Signal, 137),
                ]),
                exit_code: 137,
                left_out: &["c"],
                next: fresh.clone(),
                end: "c (node rank 2): torchrun was ended by a signal",
                ..BASE
            },
            Case {
                name: "lost connection",
                ending: Ending::Failed(vec![
                    failure("b", 1, FailureReason::Signal, 143),
                    failure("a", 0, FailureReason::ConnectionLost, 68),
                ]),
                exit_code: ExitCode::Unreachable.code(),
                left_out: &["a"],
                next: fresh.clone(),
                end: "a (node rank 0): connection lost: a detail",
                ..BASE
            },
            Case {
                name: "stall leaves out the node that did not stop",
                ending: Ending::Stalled(Duration::from_secs(3)),
                unresponsive: &["c"],
                exit_code: 124,
                left_out: &["c"],
                next: fresh.clone(),
                end: "no progress for 3 s; c did not stop within the grace period",
                ..BASE
            },
            Case {
                name: "after a failure with a culprit, a peer slow to stop is not left out",
                ending: worker_exit(),
                unresponsive: &["a", "c"],
                exit_code: 3,
                left_out: &["b"],
                next: fresh.clone(),
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 3)",
                ..BASE
            },
            Case {
                name: "health-check failure leaves that node out too",
                ending: worker_exit(),
                unhealthy: &["a"],
                exit_code: 3,
                left_out: &["b", "a"],
                next: fresh.clone(),
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 3)",
                ..BASE
            },
            Case {
                name: "Ctrl-C once",
                ending: Ending::Signal(SIGINT),
                exit_code: 130,
                next: Next::Stop(Stop::Signal(SIGINT)),
                end: "stopped by SIGINT",
                ..BASE
            },
            Case {
                name: "Ctrl-C twice: killed at once, no one is blamed",
                ending: Ending::Signal(SIGINT),
                unresponsive: &["a", "b", "c"],
                exit_code: 130,
                next: Next::Stop(Stop::Signal(SIGINT)),
                end: "stopped by SIGINT",
                ..BASE
            },
            Case {
                name: "Ctrl-C while a failure is handled",
                ending: worker_exit(),
                signal_after: Some(SIGINT),
                exit_code: 130,
                left_out: &["b"],
                next: Next::Stop(Stop::SignalAfterFailure(SIGINT)),
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 3); then SIGINT",
                ..BASE
            },
            Case {
                name: "max re-plans reached",
                ending: worker_exit(),
                replans: 3,
                exit_code: 3,
                left_out: &["b"],
                next: Next::Stop(Stop::ReplanLimit { max: 3 }),
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 3)",
                ..BASE
            },
            Case {
                name: "all nodes failed to start",
                ending: Ending::Failed(vec![
                    failure("a", 0, FailureReason::StartFailed, 127),
                    failure("b", 1, FailureReason::StartFailed, 127),
                    failure("c", 2, FailureReason::StartFailed, 127),
                ]),
                exit_code: 127,
                left_out: &["a", "b", "c"],
                next: Next::Stop(Stop::NothingStarted {
                    detail: "a detail".into(),
                }),
                end: "a (node rank 0): could not start: a detail",
                ..BASE
            },
            Case {
                name: "one node failed to start: re-planned without it",
                ending: Ending::Failed(vec![failure("c", 2, FailureReason::StartFailed, 127)]),
                exit_code: 127,
                left_out: &["c"],
                next: fresh.clone(),
                end: "c (node rank 2): could not start: a detail",
                ..BASE
            },
            Case {
                name: "with --save, the checkpoint is read on a survivor first",
                ending: worker_exit(),
                save: Some("/ck"),
                exit_code: 3,
                left_out: &["b"],
                next: Next::ReadCheckpoint {
                    host: "a".into(),
                    save: "/ck".into(),
                },
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 3)",
                ..BASE
            },
            Case {
                name: "no checkpoint to resume from: starts again",
                ending: worker_exit(),
                save: Some("/ck"),
                checkpoint: Some(CheckpointState::None),
                exit_code: 3,
                left_out: &["b"],
                next: fresh.clone(),
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 3)",
                ..BASE
            },
            Case {
                name: "a checkpoint to resume from",
                ending: worker_exit(),
                save: Some("/ck"),
                checkpoint: Some(CheckpointState::At(8)),
                exit_code: 3,
                left_out: &["b"],
                next: replan(CheckpointState::At(8), Some(("/ck", Some(8)))),
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 3)",
                ..BASE
            },
            Case {
                name: "a checkpoint whose iteration cannot be read",
                ending: worker_exit(),
                save: Some("/ck"),
                checkpoint: Some(CheckpointState::Unknown),
                exit_code: 3,
                left_out: &["b"],
                next: replan(CheckpointState::Unknown, Some(("/ck", None))),
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 3)",
                ..BASE
            },
            Case {
                name: "a straggler left out: re-planned without it, resumed, no health check",
                ending: Ending::Straggler(Box::new(straggler(Choice::LeaveOut))),
                save: Some("/ck"),
                checkpoint: Some(CheckpointState::At(8)),
                exit_code: ExitCode::Internal.code(),
                left_out: &["b"],
                next: replan(CheckpointState::At(8), Some(("/ck", Some(8)))),
                end: "straggler b (2.00× slower than the others) left out (per iteration: keep 300.0 ms, re-map not possible, leave out 200.0 ms)",
                ..BASE
            },
            Case {
                name: "a straggler swapped for a spare: left out like a failed node",
                ending: Ending::Straggler(Box::new(straggler(Choice::SwapSpare))),
                save: Some("/ck"),
                checkpoint: Some(CheckpointState::At(8)),
                exit_code: ExitCode::Internal.code(),
                left_out: &["b"],
                next: replan(CheckpointState::At(8), Some(("/ck", Some(8)))),
                end: "straggler b (2.00× slower than the others) swapped for a spare (per iteration: keep 300.0 ms, re-map not possible, leave out 200.0 ms)",
                ..BASE
            },
            Case {
                name: "a straggler re-mapped around: every node stays",
                ending: Ending::Straggler(Box::new(straggler(Choice::Remap))),
                save: Some("/ck"),
                checkpoint: Some(CheckpointState::At(8)),
                exit_code: ExitCode::Internal.code(),
                next: replan(CheckpointState::At(8), Some(("/ck", Some(8)))),
                end: "straggler b (2.00× slower than the others) re-mapped around (per iteration: keep 300.0 ms, re-map not possible, leave out 200.0 ms)",
                ..BASE
            },
            Case {
                name: "no survivor: nothing to read, the re-plan refuses",
                ending: Ending::Stalled(Duration::from_secs(90)),
                unresponsive: &["a", "b"],
                unhealthy: &["c"],
                save: Some("/ck"),
                exit_code: 124,
                left_out: &["a", "b", "c"],
                next: fresh.clone(),
                end: "no progress for 1 min 30 s; a, b did not stop within the grace period",
                ..BASE
            },
            Case {
                name: "N7: every node slower than the grace period after a stall blames none",
                ending: Ending::Stalled(Duration::from_secs(3)),
                unresponsive: &["a", "b", "c"],
                exit_code: 124,
                next: fresh.clone(),
                end: "no progress for 3 s; a, b, c did not stop within the grace period",
                ..BASE
            },
            Case {
                name: "N7: after a stall, the node with a stopped process is left out alone",
                ending: Ending::Stalled(Duration::from_secs(3)),
                unresponsive: &["a", "b", "c"],
                stopped: &["b"],
                exit_code: 124,
                left_out: &["b"],
                next: fresh.clone(),
                end: "no progress for 3 s; a, b, c did not stop within the grace period",
                ..BASE
            },
            Case {
                name: "N7: a stopped process and a node that did not stop while others did",
                ending: Ending::Stalled(Duration::from_secs(3)),
                unresponsive: &["c"],
                stopped: &["b"],
                exit_code: 124,
                left_out: &["b", "c"],
                next: fresh.clone(),
                end: "no progress for 3 s; c did not stop within the grace period",
                ..BASE
            },
            Case {
                name: "N6: a full disk is the job's: stop with the worker's code, nobody out",
                ending: worker_error(1, "OSError: [Errno 28] No space left on device"),
                save: Some("/ck"),
                exit_code: 1,
                fault: "the storage the job writes to is full",
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 1)",
                ..BASE
            },
            Case {
                name: "N6: torch.save's failed write on a full disk",
                ending: worker_error(1, "RuntimeError: [enforce fail at inline_container.cc:671] . unexpected pos 576 vs 534"),
                exit_code: 1,
                fault: "is full",
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 1)",
                ..BASE
            },
            Case {
                name: "N6: a full disk found in a log when a peer's broken connection was seen first",
                ending: worker_error(1, "RuntimeError: Connection closed by peer [127.0.0.1]:4242"),
                logs: Some("[node-a r0] iteration 4\n[node-a r0] RuntimeError: [enforce fail at inline_container.cc:671] . unexpected pos 576 vs 534\n"),
                exit_code: 1,
                fault: "elsewhere): [node-a r0] RuntimeError: [enforce fail",
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 1)",
                ..BASE
            },
            Case {
                name: "N6: an unwritable path",
                ending: worker_error(1, "PermissionError: [Errno 13] Permission denied: '/ck/iter_0000004'"),
                exit_code: 1,
                fault: "may not write where it writes",
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 1)",
                ..BASE
            },
            Case {
                name: "N6: the master port in use",
                ending: worker_error(1, "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"),
                exit_code: 1,
                fault: "the master port is in use",
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 1)",
                ..BASE
            },
            Case {
                name: "N6: a corrupt checkpoint tracker",
                ending: worker_error(1, "ValueError: invalid literal for int() with base 10: 'garbage'"),
                exit_code: 1,
                fault: "cannot be read",
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 1)",
                ..BASE
            },
            Case {
                name: "N6: a passed-on SIGUSR1 the script does not handle",
                ending: worker_error(138, "a detail"),
                exit_code: 138,
                fault: "ended by SIGUSR1",
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 138)",
                ..BASE
            },
            Case {
                name: "N6: the job's own cause stops even with re-plans left, an unhealthy node still out",
                ending: worker_error(1, "OSError: [Errno 28] No space left on device"),
                unhealthy: &["a"],
                replans: 3,
                exit_code: 1,
                left_out: &["a"],
                fault: "is full",
                end: "b (node rank 1): torchrun exited with exit code 1 (worker rank 5 exited with 1)",
                ..BASE
            },
            Case {
                name: "N6: failing again at the same iteration after a re-plan stops",
                ending: worker_exit(),
                replans: 1,
                iteration: Some(7),
                previous: Some((Some(7), "RuntimeError: something else")),
                exit_code: 3,
                fault: "failed again at iteration 7",
                end: WORKER_EXIT_END,
                ..BASE
            },
            Case {
                name: "N6: the same error (numbers aside) after a re-plan stops",
                ending: worker_error(3, "RuntimeError: NaN in rank 4's loss at step 12"),
                replans: 1,
                iteration: Some(13),
                previous: Some((Some(9), "RuntimeError: NaN in rank 1's loss at step 8")),
                exit_code: 3,
                fault: "the same error again",
                end: WORKER_EXIT_END,
                ..BASE
            },
            Case {
                name: "N6: a stall again at the same iteration stops, nobody out",
                ending: Ending::Stalled(Duration::from_secs(3)),
                unresponsive: &["c"],
                replans: 1,
                iteration: Some(6),
                previous: Some((Some(6), "")),
                exit_code: 124,
                fault: "failed again at iteration 6",
                end: "no progress for 3 s; c did not stop within the grace period",
                ..BASE
            },
            Case {
                name: "a different failure after a re-plan is re-planned again",
                ending: worker_exit(),
                replans: 1,
                iteration: Some(13),
                previous: Some((Some(6), "RuntimeError: something else")),
                exit_code: 3,
                left_out: &["b"],
                next: fresh.clone(),
                end: WORKER_EXIT_END,
                ..BASE
            },
            Case {
                name: "a killed launcher again, at another iteration: its last line is no error",
                ending: Ending::Failed(vec![failure("c", 2, FailureReason::Signal, 137)]),
                replans: 1,
                iteration: Some(13),
                previous: Some((Some(6), "")),
                exit_code: 137,
                left_out: &["c"],
                next: fresh.clone(),
                end: "c (node rank 2): torchrun was ended by a signal",
                ..BASE
            },
        ]
    }

    #[test]
    fn decisions_follow_the_table() {
        let hosts: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        for case in cases() {
            let owned = |hosts: &[&str]| hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>();
            let (unresponsive, unhealthy) = (owned(case.unresponsive), owned(case.unhealthy));
            let stopped = owned(case.stopped);
            let previous = case.previous.map(|(iteration, error)| FailureMark {
                iteration,
                error: without_numbers(error),
            });
            let logs: Vec<String> = case.logs.map(String::from).into_iter().collect();
            let decision = decide(&Facts {
                hosts: &hosts,
                ending: &case.ending,
                unresponsive: &unresponsive,
                unhealthy: &unhealthy,
                stopped: &stopped,
                iteration: case.iteration,
                previous: previous.as_ref(),
                logs: &logs,
                signal_after: case.signal_after,
                replans: case.replans,
                max_replans: 3,
                save: case.save,
                checkpoint: case.checkpoint,
            });
            let name = case.name;
            assert_eq!(decision.exit_code, case.exit_code, "{name}");
            assert_eq!(decision.left_out, case.left_out, "{name}");
            let survivors: Vec<&String> = hosts
                .iter()
                .filter(|h| !case.left_out.contains(&h.as_str()))
                .collect();
            assert_eq!(
                decision.survivors.iter().collect::<Vec<_>>(),
                survivors,
                "{name}"
            );
            match (&decision.next, case.fault) {
                (_, "") => assert_eq!(decision.next, case.next, "{name}"),
                (Next::Stop(Stop::JobFault(cause)), fault) => {
                    assert!(cause.contains(fault), "{name}: {cause}")
                }
                (next, _) => panic!("{name}: a job fault expected, not {next:?}"),
            }
            assert_eq!(decision.end, case.end, "{name}");
        }
    }

    #[test]
    fn stop_reasons_read_as_before() {
        assert_eq!(
            Stop::Signal(SIGINT).reason(),
            "stopped by SIGINT; every node was torn down"
        );
        assert_eq!(
            Stop::ReplanLimit { max: 2 }.reason(),
            "the job failed and the re-plan limit is reached (--max-replans 2)"
        );
        assert_eq!(
            Stop::NothingStarted {
                detail: "no torchrun".into()
            }
            .reason(),
            "torchrun could not be started on any node (no torchrun)"
        );
    }
}
