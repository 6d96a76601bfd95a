//! Watching one attempt: poll every node's torchrun until the job finishes, a node fails,
//! it stalls, or a signal arrives, and say what a failed node's end means
//! ([`NodeFailure`]).

use std::time::{Duration, Instant};

use super::decide::Ending;
use super::events::Event;
use super::output::{JobOutput, Phase};
use super::signals::{signal_name, ActSignals, SignalGuard};
use super::{FailureReason, NodeFailure, SuperviseOptions};
use crate::exec::{ExecError, RunningCommand, Status, TransportKind};
use crate::exit::{self, ExitCode};
use crate::launch::output_lines::torchrun_root_cause;
use crate::launch::RunningJob;

/// What the watch reads of the signals: the stop signals' guard, the act signals not yet
/// passed on, and how to pass one on to the training script.
pub struct WatchSignals<'a> {
    pub guard: Option<&'a SignalGuard>,
    pub acts: &'a mut ActSignals,
    pub pass_on: &'a dyn Fn(nix::sys::signal::Signal),
}

/// Polls `job` until it ends; returns how, and when the end was seen. Every failure,
/// stall, stop signal and the first iteration go to `record`; act signals are passed on as
/// they come; `stragglers` is asked at every poll whether a straggler ends the attempt.
pub fn watch(
    job: &mut RunningJob,
    output: &JobOutput,
    signals: WatchSignals<'_>,
    options: &SuperviseOptions,
    record: &dyn Fn(Event),
    attempt: u32,
    stragglers: &mut dyn FnMut() -> Option<Ending>,
) -> (Ending, Instant) {
    let failed = |failures: Vec<NodeFailure>| {
        let at = Instant::now();
        for failure in &failures {
            record(Event::NodeFailed {
                failure: failure.clone(),
                attempt,
            });
        }
        (Ending::Failed(failures), at)
    };
    let start_failures: Vec<NodeFailure> = job
        .nodes
        .iter()
        .filter_map(|n| {
            let e = n.start_error.as_ref()?;
            let (reason, code) = if e.is_unreachable() {
                (FailureReason::ConnectionLost, ExitCode::Unreachable)
            } else {
                (FailureReason::StartFailed, ExitCode::CannotStart)
            };
            Some(NodeFailure {
                host: n.host.clone(),
                node_rank: n.node_rank,
                reason,
                status: None,
                exit_code: code.code(),
                worker_rank: None,
                detail: e.to_string(),
            })
        })
        .collect();
    if !start_failures.is_empty() {
        return failed(start_failures);
    }
    let mut progress_reported = false;
    loop {
        for signal in signals.acts.take() {
            (signals.pass_on)(signal);
        }
        if let Some(r) = signals.guard.and_then(SignalGuard::received) {
            record(Event::Signal {
                signal: signal_name(r.signal),
                count: r.count,
            });
            return (Ending::Signal(r.signal), Instant::now());
        }
        let failures = poll(job);
        if !failures.is_empty() {
            return failed(failures);
        }
        if job.nodes.iter().all(|n| n.status.is_some()) {
            return (Ending::Finished, Instant::now());
        }
        if !progress_reported {
            if let Some((first, _)) = output.iterations() {
                progress_reported = true;
                record(Event::Progress {
                    attempt,
                    first_iteration: first,
                });
            }
        }
        if let Some(ending) = stragglers() {
            return (ending, Instant::now());
        }
        if let Some(silent) = stalled(output, options) {
            record(Event::Stalled {
                attempt,
                silent,
                last_iteration: output.iterations().map(|(_, l)| l),
            });
            return (Ending::Stalled(silent), Instant::now());
        }
        std::thread::sleep(options.poll);
    }
}

/// Reaps every node's command that has ended; returns the failures among them.
fn poll(job: &mut RunningJob) -> Vec<NodeFailure> {
    let mut failures = Vec::new();
    for node in job.nodes.iter_mut().filter(|n| n.is_running()) {
        let Some(command) = node.command.as_mut() else {
            continue;
        };
        match command.try_status() {
            Ok(None) => {}
            Ok(Some(status)) => {
                // Its output read to the end before its end is recorded: a success would
                // otherwise lose the tail (10 MB written just before the exit was cut). A
                // failure's is read to the end by `classify`, which keeps it.
                if status.success() {
                    command.drain();
                }
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
                    exit_code: ExitCode::Internal.code(),
                    worker_rank: None,
                    detail: e.to_string(),
                });
            }
        }
    }
    failures
}

/// How long the job has made no progress, once that is past its phase's limit.
fn stalled(output: &JobOutput, options: &SuperviseOptions) -> Option<Duration> {
    let (silent, phase) = output.since_progress();
    let limit = match phase {
        Phase::Training => options.stall_timeout,
        Phase::Starting | Phase::Finishing => options.startup_timeout,
    }?;
    (silent >= limit).then_some(silent)
}

/// What a node's ended command says about its failure.
fn classify(host: &str, node_rank: u64, command: RunningCommand, status: Status) -> NodeFailure {
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
            failure.exit_code = ExitCode::Unreachable.code();
            failure.detail = e.to_string();
            return failure;
        }
        Err(e) => {
            failure.detail = e.to_string();
            return failure;
        }
    };
    // The worker's own error (its last Python exception before torchrun's report), not
    // torchrun's banner line, which was always the detail.
    let text = format!("{}\n{}", output.stdout_text(), output.stderr_text());
    failure.detail = crate::trial::logs::last_exception_line(&text)
        .or_else(|| output.last_line())
        .unwrap_or_default();
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
