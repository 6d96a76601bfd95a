//! One command per node, run together: the one handle everything that runs commands on
//! nodes drives (the profile's probe and the trial through [`super::staged`], `pipette
//! doctor`'s probes, the supervised job). Modelled on watchexec's `Job`: start, poll, pass
//! a signal on, stop, sweep; the callers keep only their own loop's decisions.
//!
//! - [`NodeGroup::start`] starts every node's command; one that cannot start is kept as
//!   such and reported by the first [`NodeGroup::poll`];
//! - [`NodeGroup::poll`] reaps what has ended since the last look, each end once, with
//!   its output read to the end ([`NodeEnd`]);
//! - [`NodeGroup::signal_workers`] passes an act signal to what the commands started, on
//!   every node at once, and [`NodeGroup::sweep`] kills what outlived them: both through
//!   the [`Workers`] the launcher names (exec knows nothing of torchrun's workers);
//! - [`NodeGroup::stop`] stops every node that still runs, all at once: TERM, the grace
//!   period, KILL ([`RunningCommand::terminate`]), and, when `kill_now` turns true (a
//!   second Ctrl-C), KILL at once ([`kill_at_once`]: srun is first told to cancel its
//!   job step). Dropping the group kills what still runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::{
    spawn_with, ExecError, ExecOptions, NodeCommand, Output, RunningCommand, Status, Transport,
    TransportKind, REMOTE_TEARDOWN_MARGIN,
};

/// What a group's commands start beyond their own process groups, which only the launcher
/// that wrote the commands can name (torchrun's workers, found by the run's marks in their
/// environment: see `launch::JobProcesses`).
pub trait Workers: Send + Sync {
    /// Passes `signal` to the workers on `host`; returns how many were told.
    fn signal(&self, host: &str, signal: Signal) -> usize;
    /// Kills every process of the run still on `host`; returns how many.
    fn sweep(&self, host: &str) -> usize;
}

/// Commands, one per node, as they run (see the module doc).
pub struct NodeGroup {
    nodes: Vec<Node>,
    grace: Duration,
    workers: Option<Arc<dyn Workers>>,
}

struct Node {
    host: String,
    /// `None` once it has ended (or could not start).
    command: Option<RunningCommand>,
    remote: bool,
    status: Option<Status>,
    /// Why it could not start, until the first poll reports it.
    start_error: Option<ExecError>,
    /// What it wrote, once it has ended and its output was read to the end.
    output: Option<(Vec<u8>, Vec<u8>)>,
    ended: bool,
}

/// How one node's command ended, as [`NodeGroup::poll`] reports it.
#[derive(Debug)]
pub struct NodeEnd {
    /// Its place in the group (for a job: its node rank).
    pub node: usize,
    pub host: String,
    /// Whether it ran elsewhere (ssh, srun, the agent): a launcher ended by a signal there
    /// is reported as exit code 128 + N.
    pub remote: bool,
    pub end: End,
}

/// What ended a node's command.
#[derive(Debug)]
pub enum End {
    /// It could not be started.
    NotStarted(ExecError),
    /// It could not be waited for.
    Lost(ExecError),
    /// It exited: its status, and its output read to the end (or why it could not be:
    /// [`ExecError::Unreachable`] for an `ssh` that never reached its host).
    Exited {
        status: Status,
        output: Result<Output, ExecError>,
    },
}

impl NodeEnd {
    /// Its exit status, when it ran and was waited for.
    pub fn status(&self) -> Option<Status> {
        match &self.end {
            End::Exited { status, .. } => Some(*status),
            End::NotStarted(_) | End::Lost(_) => None,
        }
    }

    /// Whether it ran and exited with code 0.
    pub fn success(&self) -> bool {
        self.status().is_some_and(Status::success)
    }

    /// Its output, when it ran and its output could be read.
    pub fn output(&self) -> Option<&Output> {
        match &self.end {
            End::Exited { output: Ok(o), .. } => Some(o),
            _ => None,
        }
    }
}

/// How one node's command stopped in [`NodeGroup::stop`].
#[derive(Debug, Clone, PartialEq)]
pub struct NodeStop {
    pub host: String,
    /// Its place in the group (for a job: its node rank).
    pub node_rank: u64,
    /// Its status (`None` when it could not be waited for: see `error`).
    pub status: Option<Status>,
    /// From the start of the stop until it was gone.
    pub took: Duration,
    /// Whether it stopped by itself after TERM, within the grace period, rather than by
    /// the KILL that follows it (see [`killed`]). After a stall, a launcher that did not is
    /// taken for hung (or stopped), and its node is left out of the next attempt.
    pub stopped_in_grace: bool,
    /// Whether it was still running when the stop began.
    pub was_running: bool,
    pub error: Option<String>,
}

impl NodeGroup {
    /// Starts `commands` (host, command) on their nodes, in order. A command that cannot
    /// start is kept as such (the first [`NodeGroup::poll`] reports it); the others run.
    pub fn start(
        transport: &Transport,
        commands: &[(String, NodeCommand)],
        options: &ExecOptions,
    ) -> NodeGroup {
        NodeGroup::adopt(
            commands
                .iter()
                .map(|(host, command)| {
                    (host.clone(), spawn_with(transport, host, command, options))
                })
                .collect(),
            options.grace,
        )
    }

    /// A group of commands already started (or that could not be), each on its own
    /// transport; `grace` is the one they were started with.
    pub fn adopt(
        started: Vec<(String, Result<RunningCommand, ExecError>)>,
        grace: Duration,
    ) -> NodeGroup {
        let nodes = started
            .into_iter()
            .map(|(host, started)| {
                let remote = started
                    .as_ref()
                    .is_ok_and(|c| c.transport() != TransportKind::Local);
                let (command, start_error) = match started {
                    Ok(command) => (Some(command), None),
                    Err(e) => (None, Some(e)),
                };
                Node {
                    host,
                    command,
                    remote,
                    status: None,
                    start_error,
                    output: None,
                    ended: false,
                }
            })
            .collect();
        NodeGroup {
            nodes,
            grace,
            workers: None,
        }
    }

    /// Passes act signals and sweeps through `workers`.
    pub fn with_workers(mut self, workers: Arc<dyn Workers>) -> NodeGroup {
        self.workers = Some(workers);
        self
    }

    /// The nodes' hosts, in order.
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|n| n.host.as_str())
    }

    /// Whether every node has ended (or never started), as polled so far.
    pub fn all_ended(&self) -> bool {
        self.nodes.iter().all(|n| n.ended)
    }

    /// Every node that has ended since the last poll, each once, node order. Nodes that
    /// could not start come first and alone: the first poll reports only them when there
    /// are any. An ended node's output is read to the end (its tail reaches the sink)
    /// before its end is reported.
    pub fn poll(&mut self) -> Vec<NodeEnd> {
        let not_started: Vec<NodeEnd> = self
            .nodes
            .iter_mut()
            .enumerate()
            .filter_map(|(i, node)| {
                let e = node.start_error.take()?;
                node.ended = true;
                Some(NodeEnd {
                    node: i,
                    host: node.host.clone(),
                    remote: node.remote,
                    end: End::NotStarted(e),
                })
            })
            .collect();
        if !not_started.is_empty() {
            return not_started;
        }
        let mut ends = Vec::new();
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let Some(command) = node.command.as_mut().filter(|_| !node.ended) else {
                continue;
            };
            let end = match command.try_status() {
                Ok(None) => continue,
                Ok(Some(status)) => {
                    node.status = Some(status);
                    let command = node.command.take().expect("a running command");
                    let output = command.into_output();
                    if let Ok(o) = &output {
                        node.output = Some((o.stdout.clone(), o.stderr.clone()));
                    }
                    End::Exited { status, output }
                }
                Err(e) => {
                    node.status = Some(Status::Exited(-1));
                    End::Lost(e)
                }
            };
            node.ended = true;
            ends.push(NodeEnd {
                node: i,
                host: node.host.clone(),
                remote: node.remote,
                end,
            });
        }
        ends
    }

    /// What every node wrote so far (standard output, standard error), node order: the
    /// captured part.
    pub fn outputs_so_far(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.nodes
            .iter()
            .map(|node| match (&node.command, &node.output) {
                (Some(command), _) => command.output_so_far(),
                (None, Some(output)) => output.clone(),
                (None, None) => Default::default(),
            })
            .collect()
    }

    /// Passes `signal` to the workers on every node at once (see [`Workers`]); returns how
    /// many were told (none without workers).
    pub fn signal_workers(&self, signal: Signal) -> usize {
        self.on_every_host(|workers, host| workers.signal(host, signal))
            .iter()
            .sum()
    }

    /// Kills what is left of the run on every node at once (see [`Workers`]); returns how
    /// many processes, per node in order (none without workers).
    pub fn sweep(&self) -> Vec<usize> {
        self.on_every_host(|workers, host| workers.sweep(host))
    }

    /// `each` for every node's host, all at once, with the group's workers.
    fn on_every_host(&self, each: impl Fn(&dyn Workers, &str) -> usize + Sync) -> Vec<usize> {
        let Some(workers) = &self.workers else {
            return vec![0; self.nodes.len()];
        };
        let each = &each;
        std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .hosts()
                .map(|host| scope.spawn(move || each(workers.as_ref(), host)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        })
    }

    /// Stops every node's command that still runs, all at once, and reaps them: TERM, the
    /// grace period the commands were started with, KILL. When `kill_now` turns true (a
    /// second Ctrl-C) the local process groups are killed at once ([`kill_at_once`]).
    /// Returns one [`NodeStop`] per node, in order.
    pub fn stop(&mut self, kill_now: &dyn Fn() -> bool) -> Vec<NodeStop> {
        let start = Instant::now();
        let grace = self.grace;
        let mut stops: Vec<Option<NodeStop>> = Vec::with_capacity(self.nodes.len());
        std::thread::scope(|scope| {
            let mut handles = Vec::new();
            for (rank, node) in self.nodes.iter_mut().enumerate() {
                let rank = rank as u64;
                let running = !node.ended && node.status.is_none();
                let Some(command) = node.command.as_mut().filter(|_| running) else {
                    stops.push(Some(NodeStop {
                        host: node.host.clone(),
                        node_rank: rank,
                        status: node.status,
                        took: Duration::ZERO,
                        stopped_in_grace: true,
                        was_running: false,
                        error: None,
                    }));
                    continue;
                };
                stops.push(None);
                let pgid = command.pgid();
                let kind = command.transport();
                let host = node.host.clone();
                let handle = scope.spawn(move || {
                    let result = command.terminate();
                    let took = start.elapsed();
                    let (status, error) = match result {
                        Ok(status) => (Some(status), None),
                        Err(e) => (None, Some(e.to_string())),
                    };
                    NodeStop {
                        host,
                        node_rank: rank,
                        status,
                        took,
                        stopped_in_grace: status.is_some_and(|s| !killed(s, kind))
                            && (kind == TransportKind::Local
                                || took < grace + REMOTE_TEARDOWN_MARGIN),
                        was_running: true,
                        error,
                    }
                });
                handles.push((stops.len() - 1, pgid, kind, handle));
            }
            let mut killed_at: Option<Instant> = None;
            let mut escalated = false;
            while !handles.iter().all(|(_, _, _, h)| h.is_finished()) {
                let first = killed_at.is_none() && kill_now();
                if first {
                    killed_at = Some(Instant::now());
                }
                let escalate =
                    !escalated && killed_at.is_some_and(|at| at.elapsed() >= SRUN_CANCEL_WAIT);
                escalated |= escalate;
                for (_, pgid, kind, handle) in &handles {
                    let (signal, then_kill) = kill_at_once(*kind);
                    let signal = match (first, escalate && then_kill) {
                        (true, _) => signal,
                        (false, true) => Signal::SIGKILL,
                        (false, false) => continue,
                    };
                    if !handle.is_finished() {
                        // The group's leader is not reaped until its thread returns, so
                        // the group id is still ours.
                        let _ = killpg(Pid::from_raw(*pgid), signal);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            for (index, _, _, handle) in handles {
                stops[index] = Some(handle.join().unwrap_or_else(|_| NodeStop {
                    host: String::new(),
                    node_rank: index as u64,
                    status: None,
                    took: start.elapsed(),
                    stopped_in_grace: false,
                    was_running: true,
                    error: Some("the teardown thread panicked".into()),
                }));
            }
        });
        for (node, stop) in self.nodes.iter_mut().zip(&stops) {
            if let Some(stop) = stop {
                if node.status.is_none() {
                    node.status = stop.status;
                }
            }
        }
        stops.into_iter().flatten().collect()
    }
}

/// Whether a command torn down ended by the KILL that follows the grace period (ours, or
/// the remote watchdog's, which the wrapper reports as 128 + 9) rather than by itself.
///
/// Why the status and not the clock: a launcher that exits just before the grace period
/// is over may be reaped just after it when the machine is busy; what tells a hung
/// launcher from a live one is whether it had to be killed. (A remote command that outlived
/// its watchdog's grace period and margin, see [`RunningCommand::terminate`], was not
/// stopped in time either, whatever ended `ssh` or `srun` here after that.)
fn killed(status: Status, kind: TransportKind) -> bool {
    const KILL: i32 = Signal::SIGKILL as i32;
    match status {
        Status::Signaled(signal) => signal == KILL,
        Status::Exited(code) => kind != TransportKind::Local && code == 128 + KILL,
    }
}

/// How long a `srun` sent TERM by a kill at once has to cancel its job step and exit
/// before it is killed. It needs a round trip to the node's slurmstepd, which kills the
/// step's tasks at once (tens of milliseconds on an idle test cluster); a srun that cannot
/// reach it is killed anyway, and the sweep is left to find the step's processes.
pub const SRUN_CANCEL_WAIT: Duration = Duration::from_secs(5);

/// How a kill at once (a second Ctrl-C) stops a node's local process group: the signal
/// sent first, and whether KILL follows after [`SRUN_CANCEL_WAIT`].
///
/// A killed `ssh` drops its connection, and the remote watchdog tears the command down
/// (see [`super::transport`]); a local command is its group. So both get KILL. A killed
/// `srun`, though, leaves its job step running on the node, whole (Slurm does not close
/// the step's standard input when srun disappears, so the watchdog never fires). TERM is
/// srun's own "kill now": it answers with "forcing job termination" and has slurmstepd
/// send KILL to every task of the step at once (a plain `scancel` of the step would go
/// through TERM, `KillWait`, KILL instead: 30 s by default).
fn kill_at_once(kind: TransportKind) -> (Signal, bool) {
    match kind {
        TransportKind::Srun => (Signal::SIGTERM, true),
        // A killed agent relay drops its connection: the agent then tears the command
        // down, as the ssh watchdog does.
        TransportKind::Local | TransportKind::Ssh | TransportKind::Agent => {
            (Signal::SIGKILL, false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::spawn;

    #[test]
    fn a_launcher_that_ignores_term_is_killed_after_the_grace_period() {
        let grace = Duration::from_millis(500);
        let command = NodeCommand::new("sh")
            .arg("-c")
            .arg("trap '' TERM; sleep 60 & wait; wait");
        let options = ExecOptions {
            grace,
            ..ExecOptions::default()
        };
        let running = spawn_with(&Transport::Local, "n", &command, &options).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let mut job = NodeGroup::adopt(vec![("n".into(), Ok(running))], grace);
        let stops = job.stop(&|| false);
        assert!(!stops[0].stopped_in_grace, "{stops:?}");
        assert!(stops[0].took >= grace);
        assert_eq!(stops[0].status, Some(Status::Signaled(9)));
    }

    /// A stand-in for `srun` (the arguments are ignored): it records the TERM it gets and
    /// exits, or, with `ignore`, ignores it (a srun that cannot reach its node).
    fn fake_srun(dir: &std::path::Path, name: &str, ignore: bool) -> Transport {
        let path = dir.join(name);
        let on_term = if ignore {
            "''".to_string()
        } else {
            format!("'echo TERM > {}.got; exit 143'", path.display())
        };
        // A child shell writes the script: a file this multi-threaded test process held
        // open for writing could be inherited by a process another test is starting, and
        // exec'ing it in that instant fails with ETXTBSY ("Text file busy").
        let script = format!("#!/bin/sh\ntrap {on_term} TERM\nwhile :; do sleep 0.05; done\n");
        let status = std::process::Command::new("sh")
            .args([
                "-c",
                "printf '%s' \"$2\" > \"$1\" && chmod 755 \"$1\"",
                "sh",
            ])
            .arg(&path)
            .arg(script)
            .status()
            .unwrap();
        assert!(status.success());
        Transport::Srun(crate::exec::SrunOptions {
            program: path,
            ..crate::exec::SrunOptions::default()
        })
    }

    #[test]
    fn a_second_signal_has_srun_cancel_its_step_and_kills_the_rest_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let grace = Duration::from_secs(30);
        let options = ExecOptions {
            grace,
            ..ExecOptions::default()
        };
        let sleeper = NodeCommand::new("sh")
            .arg("-c")
            .arg("trap '' TERM; sleep 60 & wait; wait");
        let nodes = [
            ("cancels", fake_srun(dir.path(), "srun-cancels", false)),
            ("hangs", fake_srun(dir.path(), "srun-hangs", true)),
            ("local", Transport::Local),
        ];
        let mut job = NodeGroup::adopt(
            nodes
                .iter()
                .map(|(host, transport)| {
                    let running = spawn_with(transport, host, &sleeper, &options);
                    ((*host).into(), Ok(running.unwrap()))
                })
                .collect(),
            grace,
        );
        std::thread::sleep(Duration::from_millis(200));
        let stops = job.stop(&|| true);
        let [cancels, hangs, local] = &stops[..] else {
            panic!("{stops:?}")
        };
        // srun got TERM (its way to cancel the step) and exited by itself.
        assert_eq!(cancels.status, Some(Status::Exited(143)), "{stops:?}");
        assert!(dir.path().join("srun-cancels.got").exists());
        assert!(cancels.took < Duration::from_secs(2), "{stops:?}");
        // A local command is killed at once, as before.
        assert_eq!(local.status, Some(Status::Signaled(9)), "{stops:?}");
        assert!(local.took < Duration::from_secs(2), "{stops:?}");
        // A srun that does not exit is killed after a bounded wait, not the grace period.
        assert_eq!(hangs.status, Some(Status::Signaled(9)), "{stops:?}");
        assert!(
            hangs.took >= SRUN_CANCEL_WAIT
                && hangs.took < SRUN_CANCEL_WAIT + Duration::from_secs(2),
            "{stops:?}"
        );
    }

    #[test]
    fn a_second_signal_kills_at_once() {
        let command = NodeCommand::new("sh")
            .arg("-c")
            .arg("trap '' TERM; sleep 60 & wait; wait");
        let running = spawn(&Transport::Local, "n", &command).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let mut job = NodeGroup::adopt(vec![("n".into(), Ok(running))], Duration::from_secs(30));
        let start = Instant::now();
        let stops = job.stop(&|| start.elapsed() > Duration::from_millis(200));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(stops[0].status, Some(Status::Signaled(9)));
    }

    #[test]
    fn ends_are_reported_once_with_their_output_and_what_could_not_start() {
        let commands = vec![
            (
                "a".to_owned(),
                NodeCommand::new("sh").args(["-c", "echo done"]),
            ),
            (
                "b".to_owned(),
                NodeCommand::new("/nonexistent/pipette-node"),
            ),
        ];
        let mut group = NodeGroup::start(&Transport::Local, &commands, &ExecOptions::default());
        let first = group.poll();
        assert_eq!(first.len(), 1, "what could not start comes first, alone");
        assert_eq!(first[0].node, 1);
        assert!(matches!(first[0].end, End::NotStarted(_)), "{first:?}");
        let end = Instant::now() + Duration::from_secs(10);
        let mut ends = Vec::new();
        while !group.all_ended() {
            assert!(Instant::now() < end, "the command never ended");
            ends.extend(group.poll());
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(ends.len(), 1, "{ends:?}");
        assert!(ends[0].success());
        assert_eq!(ends[0].output().unwrap().stdout_text(), "done\n");
        assert_eq!(group.outputs_so_far()[0].0, b"done\n");
        assert!(group.poll().is_empty(), "each end once");
        let stops = group.stop(&|| false);
        assert!(stops.iter().all(|s| !s.was_running), "{stops:?}");
    }
}
