//! Watching one attempt: poll every node's torchrun until the job finishes, a node fails,
//! it stalls, or a signal arrives (what a failed node's end means is
//! [`NodeFailure::of`]'s).

use std::time::{Duration, Instant};

use super::decide::Ending;
use super::events::Event;
use super::output::{JobOutput, Phase};
use super::signals::{signal_name, ActSignals, SignalGuard};
use super::starved::StarvedClock;
use super::{NodeFailure, SuperviseOptions};
use crate::exec::group::NodeGroup;

/// What the watch reads of the signals: the stop signals' guard, the act signals not yet
/// passed on, and what to do once one was passed on to the training script's workers
/// (with how many were told).
pub struct WatchSignals<'a> {
    pub guard: Option<&'a SignalGuard>,
    pub acts: &'a mut ActSignals,
    pub passed_on: &'a dyn Fn(nix::sys::signal::Signal, usize),
}

/// Polls `job` until it ends; returns how, and when the end was seen. Every failure,
/// stall, stop signal and the first iteration go to `record`; act signals are passed on as
/// they come; `stragglers` is asked at every poll whether a straggler ends the attempt.
/// The stall rule leaves out the time the job's processes of run `run_id` on this machine
/// waited for a CPU ([`StarvedClock`]).
#[allow(clippy::too_many_arguments)]
pub fn watch(
    job: &mut NodeGroup,
    output: &JobOutput,
    signals: WatchSignals<'_>,
    options: &SuperviseOptions,
    record: &dyn Fn(Event),
    attempt: u32,
    run_id: &str,
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
    // What could not start ends the attempt before anything else is looked at.
    let start_failures = failures_of(job);
    if !start_failures.is_empty() {
        return failed(start_failures);
    }
    let mut progress_reported = false;
    let mut silence = Silence::new(run_id);
    loop {
        for signal in signals.acts.take() {
            (signals.passed_on)(signal, job.signal_workers(signal));
        }
        if let Some(r) = signals.guard.and_then(SignalGuard::received) {
            record(Event::Signal {
                signal: signal_name(r.signal),
                count: r.count,
            });
            return (Ending::Signal(r.signal), Instant::now());
        }
        let failures = failures_of(job);
        if !failures.is_empty() {
            return failed(failures);
        }
        if job.all_ended() {
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
        if let Some(silent) = silence.stalled(output, options) {
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

/// Reaps every node's command that has ended (its output read to the end: a success
/// would otherwise lose its tail); returns the failures among them.
fn failures_of(job: &mut NodeGroup) -> Vec<NodeFailure> {
    job.poll()
        .iter()
        .filter(|end| !end.success())
        .map(NodeFailure::of)
        .collect()
}

/// The stall rule's measure of silence: wall time since the last progress less the time the
/// job waited for a CPU meanwhile.
struct Silence {
    starved: StarvedClock,
    /// The wall silence at the last poll: when it drops, progress came.
    last_silent: Duration,
    /// The starved clock's total at the last progress.
    starved_at_progress: Duration,
}

impl Silence {
    fn new(run_id: &str) -> Silence {
        Silence {
            starved: StarvedClock::new(run_id),
            last_silent: Duration::ZERO,
            starved_at_progress: Duration::ZERO,
        }
    }

    /// How long the job has made no progress (wall time), once that, less the time it
    /// waited for a CPU, is past its phase's limit.
    fn stalled(&mut self, output: &JobOutput, options: &SuperviseOptions) -> Option<Duration> {
        let (silent, phase) = output.since_progress();
        let starved = self.starved.total();
        if silent < self.last_silent {
            self.starved_at_progress = starved;
        }
        self.last_silent = silent;
        // A sample's wait may reach a little before the silence began: never below zero.
        let could_run = silent.saturating_sub(starved.saturating_sub(self.starved_at_progress));
        let limit = match phase {
            Phase::Training => options.stall_timeout,
            Phase::Starting | Phase::Finishing => options.startup_timeout,
        }?;
        (could_run >= limit).then_some(silent)
    }
}
