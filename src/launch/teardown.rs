//! Stopping a job: every node's torchrun torn down at once (TERM, the grace period, KILL,
//! through the exec seam, which also tears remote commands down on the node), a second
//! signal killing at once, and then a sweep for what a launcher left behind; and passing an
//! act signal (USR1, USR2) to the training script's workers while the job goes on
//! ([`signal_workers`]).
//!
//! Why the sweep: torchrun starts each worker in a session of its own, so when torchrun
//! itself is killed (or stopped, and then killed) its workers are outside the process group
//! the seam tears down. Every process of a job carries `PIPETTE_RUN_ID` and `PIPETTE_HOST`
//! in its environment, so the sweep finds them by that, on this machine or on a node.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use super::{RunningJob, RUN_ID_VAR};
use crate::exec::{
    self, ExecError, NodeCommand, Status, Transport, TransportKind, REMOTE_TEARDOWN_MARGIN,
};

/// How one node's torchrun stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeStop {
    pub host: String,
    pub node_rank: u64,
    /// Its status (`None` when it could not be waited for: see `error`).
    pub status: Option<Status>,
    /// From the start of the teardown until it was gone.
    pub took: Duration,
    /// Whether it stopped by itself after TERM, within the grace period, rather than by
    /// the KILL that follows it (see [`killed`]). After a stall, a launcher that did not is
    /// taken for hung (or stopped), and its node is left out of the next attempt.
    pub stopped_in_grace: bool,
    /// Whether it was still running when the teardown began.
    pub was_running: bool,
    pub error: Option<String>,
}

/// Stops every node's command that still runs, all at once, and reaps them: TERM, the
/// grace period the commands were started with, KILL (see
/// [`exec::RunningCommand::terminate`]); `grace` (the same) judges who stopped in time. When
/// `kill_now` turns true (a second Ctrl-C) the local process groups are killed at once
/// (`srun` is first told to cancel its job step, see [`kill_at_once`]). Returns one [`NodeStop`] per node,
/// node-rank order.
pub fn teardown(
    job: &mut RunningJob,
    grace: Duration,
    kill_now: &dyn Fn() -> bool,
) -> Vec<NodeStop> {
    let start = Instant::now();
    let mut stops: Vec<Option<NodeStop>> = Vec::with_capacity(job.nodes.len());
    std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for node in job.nodes.iter_mut() {
            let running = node.is_running();
            let Some(command) = node.command.as_mut().filter(|_| running) else {
                stops.push(Some(NodeStop {
                    host: node.host.clone(),
                    node_rank: node.node_rank,
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
            let rank = node.node_rank;
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
                        && (kind == TransportKind::Local || took < grace + REMOTE_TEARDOWN_MARGIN),
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
                node_rank: 0,
                status: None,
                took: start.elapsed(),
                stopped_in_grace: false,
                was_running: true,
                error: Some("the teardown thread panicked".into()),
            }));
        }
    });
    for (node, stop) in job.nodes.iter_mut().zip(&stops) {
        if let Some(stop) = stop {
            if node.status.is_none() {
                node.status = stop.status;
            }
        }
    }
    stops.into_iter().flatten().collect()
}

/// Whether a command torn down ended by the KILL that follows the grace period (ours, or
/// the remote watchdog's, which the wrapper reports as 128 + 9) rather than by itself.
///
/// Why the status and not the clock: a launcher that exits just before the grace period
/// is over may be reaped just after it when the machine is busy; what tells a hung
/// launcher from a live one is whether it had to be killed. (A remote command that outlived
/// its watchdog's grace period and margin, see [`exec::RunningCommand::terminate`], was not
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
/// step's tasks at once (tens of milliseconds on an idle test cluster); a srun that cannot reach it
/// is killed anyway, and the sweep is left to find the step's processes.
pub const SRUN_CANCEL_WAIT: Duration = Duration::from_secs(5);

/// How a kill at once (a second Ctrl-C) stops a node's local process group: the signal
/// sent first, and whether KILL follows after [`SRUN_CANCEL_WAIT`].
///
/// A killed `ssh` drops its connection, and the remote watchdog tears the command down
/// (see [`exec::transport`]); a local command is its group. So both get KILL. A killed
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

/// The POSIX `sh` sweep run on remote nodes: kills every process whose environment holds
/// both `$1` and `$2` (`NAME=VALUE` words) and prints how many it killed. Reads
/// `/proc/PID/environ` with GNU grep's `-z` (NUL-separated lines).
pub const SWEEP_SCRIPT: &str = concat!(
    "n=0; for d in /proc/[0-9]*; do p=${d#/proc/}; [ \"$p\" = \"$$\" ] && continue; ",
    "if grep -qzxF -- \"$1\" \"$d/environ\" 2>/dev/null && grep -qzxF -- \"$2\" \"$d/environ\" 2>/dev/null; ",
    "then kill -s KILL \"$p\" 2>/dev/null && n=$((n + 1)); fi; done; echo \"$n\""
);

/// Kills every process of run `run_id` on `host` that is still there (see the module doc).
/// Returns how many it killed. On the local transport it reads this machine's `/proc`
/// itself; elsewhere it runs [`SWEEP_SCRIPT`] on the node.
pub fn sweep(
    transport: &Transport,
    host: &str,
    run_id: &str,
    timeout: Duration,
) -> Result<usize, ExecError> {
    let run = format!("{RUN_ID_VAR}={run_id}");
    let node = format!("PIPETTE_HOST={host}");
    if *transport == Transport::Local {
        return Ok(sweep_here(&run, &node));
    }
    let command = NodeCommand::new("sh")
        .arg("-c")
        .arg(SWEEP_SCRIPT)
        .arg("pipette-sweep")
        .arg(run)
        .arg(node);
    let output = exec::run(transport, host, &command, timeout)?;
    Ok(output.stdout_text().trim().parse().unwrap_or(0))
}

/// The POSIX `sh` count run on remote nodes: how many processes whose environment holds
/// both `$1` and `$2` (as [`SWEEP_SCRIPT`]) are stopped (state `T` or `t` in
/// `/proc/PID/stat`, after the command name's closing parenthesis).
pub const STOPPED_SCRIPT: &str = concat!(
    "n=0; for d in /proc/[0-9]*; do p=${d#/proc/}; [ \"$p\" = \"$$\" ] && continue; ",
    "if grep -qzxF -- \"$1\" \"$d/environ\" 2>/dev/null && grep -qzxF -- \"$2\" \"$d/environ\" 2>/dev/null; ",
    "then read -r s < \"$d/stat\" 2>/dev/null || continue; s=${s##*) }; ",
    "case \"$s\" in T*|t*) n=$((n + 1));; esac; fi; done; echo \"$n\""
);

/// How many processes of run `run_id` on `host` are stopped (SIGSTOP, a debugger): after a
/// stall, evidence against that node (its peers wait for it), where being slow to stop is
/// none on a busy machine. Read before the teardown, which kills them.
pub fn stopped_processes(
    transport: &Transport,
    host: &str,
    run_id: &str,
    timeout: Duration,
) -> Result<usize, ExecError> {
    let run = format!("{RUN_ID_VAR}={run_id}");
    let node = format!("PIPETTE_HOST={host}");
    if *transport == Transport::Local {
        return Ok(processes_of(&run, &node)
            .into_iter()
            .filter(|(pid, _)| is_stopped(*pid))
            .count());
    }
    let command = NodeCommand::new("sh")
        .arg("-c")
        .arg(STOPPED_SCRIPT)
        .arg("pipette-stopped")
        .arg(run)
        .arg(node);
    let output = exec::run(transport, host, &command, timeout)?;
    Ok(output.stdout_text().trim().parse().unwrap_or(0))
}

/// Whether process `pid` of this machine is stopped (state `T` or `t`).
fn is_stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
    })
}

/// The local sweep: a few rounds, so that a process started while the first round ran is
/// caught by the next.
fn sweep_here(run: &str, node: &str) -> usize {
    let mut killed = BTreeSet::new();
    for _round in 0..5 {
        let mut found = false;
        for (pid, _) in processes_of(run, node) {
            if !killed.contains(&pid) && kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                killed.insert(pid);
                found = true;
            }
        }
        if !found {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    killed.len()
}

/// Every process on this machine (but this one) whose environment holds both `run` and
/// `node` (`NAME=VALUE`), with its environment.
fn processes_of(run: &str, node: &str) -> Vec<(i32, Vec<u8>)> {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            (pid != me && environ_has(&environ, run) && environ_has(&environ, node))
                .then_some((pid, environ))
        })
        .collect()
}

/// Whether a `/proc/PID/environ` holds exactly `want` (`NAME=VALUE`).
fn environ_has(environ: &[u8], want: &str) -> bool {
    environ.split(|b| *b == 0).any(|v| v == want.as_bytes())
}

/// Whether a `/proc/PID/environ` sets the variable `name`, whatever its value.
fn environ_sets(environ: &[u8], name: &str) -> bool {
    environ.split(|b| *b == 0).any(|v| {
        v.strip_prefix(name.as_bytes())
            .is_some_and(|rest| rest.starts_with(b"="))
    })
}

/// The variable torchrun sets for every worker it starts (and that torchrun itself, started
/// by us, does not have): what tells a worker from its launcher and from what it starts
/// in turn (data loader processes inherit it from their worker).
const WORKER_VAR: &str = "TORCHELASTIC_RUN_ID";

/// The POSIX `sh` script that passes signal `$1` to the workers of run `$2` on node `$3`
/// (`NAME=VALUE` words) on a remote node, and prints how many it told: the processes of
/// the run with [`WORKER_VAR`] whose parent lacks it (see [`signal_workers`]).
pub const SIGNAL_WORKERS_SCRIPT: &str = concat!(
    "n=0; for d in /proc/[0-9]*; do p=${d#/proc/}; [ \"$p\" = \"$$\" ] && continue; ",
    "grep -qzxF -- \"$2\" \"$d/environ\" 2>/dev/null && grep -qzxF -- \"$3\" \"$d/environ\" 2>/dev/null ",
    "&& grep -qz '^TORCHELASTIC_RUN_ID=' \"$d/environ\" 2>/dev/null || continue; ",
    "q=$(sed -n 's/^PPid:[[:space:]]*//p' \"$d/status\" 2>/dev/null); ",
    "grep -qz '^TORCHELASTIC_RUN_ID=' \"/proc/$q/environ\" 2>/dev/null && continue; ",
    "kill -s \"$1\" \"$p\" 2>/dev/null && n=$((n + 1)); done; echo \"$n\""
);

/// Passes `signal` (an act signal: USR1, USR2) to the training script's processes of run
/// `run_id` on `host`: every worker torchrun started there, and nothing else. Returns how
/// many it told.
///
/// Why not through torchrun: torchrun does not pass USR1/USR2 on. Unhandled, either ends
/// torchrun at once and orphans its workers; named in `--signals-to-handle`, torchrun
/// treats it as a death signal and stops the workers with it. What a job wants from
/// `--signal=USR1@120` is the script's own handler to run and the job to go on, so the
/// signal goes to each worker process, as torchrun itself addresses its workers, but not
/// to the worker's whole process group: data loader processes in that group would die of a
/// signal they do not handle.
pub fn signal_workers(
    transport: &Transport,
    host: &str,
    run_id: &str,
    signal: Signal,
    timeout: Duration,
) -> Result<usize, ExecError> {
    let run = format!("{RUN_ID_VAR}={run_id}");
    let node = format!("PIPETTE_HOST={host}");
    if *transport == Transport::Local {
        let parent_is_worker = |pid: i32| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let parent = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))
                .and_then(|p| p.trim().parse::<i32>().ok());
            parent.is_some_and(|p| {
                std::fs::read(format!("/proc/{p}/environ"))
                    .is_ok_and(|e| environ_sets(&e, WORKER_VAR))
            })
        };
        let told = processes_of(&run, &node)
            .into_iter()
            .filter(|(pid, environ)| environ_sets(environ, WORKER_VAR) && !parent_is_worker(*pid))
            .filter(|(pid, _)| kill(Pid::from_raw(*pid), signal).is_ok())
            .count();
        return Ok(told);
    }
    let command = NodeCommand::new("sh")
        .arg("-c")
        .arg(SIGNAL_WORKERS_SCRIPT)
        .arg("pipette-signal")
        .arg(signal.as_str().trim_start_matches("SIG"))
        .arg(run)
        .arg(node);
    let output = exec::run(transport, host, &command, timeout)?;
    Ok(output.stdout_text().trim().parse().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{spawn, spawn_with, ExecOptions, Transport};
    use crate::launch::RunningNode;

    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rfind(')')
                .is_some_and(|i| !stat[i + 2..].starts_with('Z'))
        })
    }

    #[test]
    fn a_stopped_process_of_the_run_is_found_on_its_node_only() {
        let run_id = format!("stopped-test-{}", std::process::id());
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .env(RUN_ID_VAR, &run_id)
            .env("PIPETTE_HOST", "node-x")
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        let count = |host: &str| {
            stopped_processes(&Transport::Local, host, &run_id, Duration::from_secs(5)).unwrap()
        };
        // What the remote nodes run, run here.
        let remote = || {
            let out = std::process::Command::new("sh")
                .args(["-c", STOPPED_SCRIPT, "pipette-stopped"])
                .arg(format!("{RUN_ID_VAR}={run_id}"))
                .arg("PIPETTE_HOST=node-x")
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        // The environment is readable once the child has exec'd.
        let end = Instant::now() + Duration::from_secs(10);
        while processes_of(&format!("{RUN_ID_VAR}={run_id}"), "PIPETTE_HOST=node-x").is_empty() {
            assert!(Instant::now() < end, "sleep never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(count("node-x"), 0, "running, not stopped");
        assert_eq!(remote(), "0");
        kill(pid, Signal::SIGSTOP).unwrap();
        while !is_stopped(pid.as_raw()) {
            assert!(Instant::now() < end, "SIGSTOP did not stop it");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(count("node-x"), 1);
        assert_eq!(remote(), "1");
        assert_eq!(count("node-y"), 0, "another node's");
        kill(pid, Signal::SIGKILL).unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn the_sweep_finds_processes_outside_the_group_by_their_environment() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let run_id = format!("sweep-test-{}", std::process::id());
        // A launcher that starts a worker in a session of its own, as torchrun does, and
        // is then killed: the worker outlives the group.
        let command = NodeCommand::new("sh")
            .arg("-c")
            .arg("setsid sleep 60 & echo $! > \"$1\"; wait")
            .arg("launcher")
            .arg(pidfile.display().to_string())
            .env(RUN_ID_VAR, &run_id)
            .env("PIPETTE_HOST", "node-x");
        let running = spawn(&Transport::Local, "node-x", &command).unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&pidfile).is_ok_and(|t| t.ends_with('\n')) {
            assert!(Instant::now() < end, "the worker never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        let worker: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Until `setsid` has made the worker a session leader, it is still in the group.
        let in_own_session = || {
            std::fs::read_to_string(format!("/proc/{worker}/stat")).is_ok_and(|stat| {
                let after = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
                after.split(' ').nth(3) == Some(worker.to_string().as_str())
            })
        };
        while !in_own_session() {
            assert!(Instant::now() < end, "the worker never left the group");
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut job = RunningJob {
            nodes: vec![RunningNode {
                host: "node-x".into(),
                node_rank: 0,
                command: Some(running),
                status: None,
                start_error: None,
            }],
        };
        let stops = teardown(&mut job, Duration::from_secs(2), &|| false);
        assert_eq!(stops.len(), 1);
        assert!(stops[0].stopped_in_grace, "{stops:?}");
        assert!(
            alive(worker),
            "the worker left the group, so teardown misses it"
        );
        // Another node's processes on the same machine are not touched.
        assert_eq!(
            sweep(&Transport::Local, "node-y", &run_id, Duration::from_secs(5)).unwrap(),
            0
        );
        assert!(alive(worker));
        assert_eq!(
            sweep(&Transport::Local, "node-x", &run_id, Duration::from_secs(5)).unwrap(),
            1
        );
        let end = Instant::now() + Duration::from_secs(5);
        while alive(worker) {
            assert!(Instant::now() < end, "the sweep did not kill {worker}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

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
        let mut job = RunningJob {
            nodes: vec![RunningNode {
                host: "n".into(),
                node_rank: 0,
                command: Some(running),
                status: None,
                start_error: None,
            }],
        };
        let stops = teardown(&mut job, grace, &|| false);
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
        let mut job = RunningJob {
            nodes: nodes
                .iter()
                .enumerate()
                .map(|(rank, (host, transport))| RunningNode {
                    host: (*host).into(),
                    node_rank: rank as u64,
                    command: Some(spawn_with(transport, host, &sleeper, &options).unwrap()),
                    status: None,
                    start_error: None,
                })
                .collect(),
        };
        std::thread::sleep(Duration::from_millis(200));
        let stops = teardown(&mut job, grace, &|| true);
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

    /// A launcher (no `TORCHELASTIC_RUN_ID`), its worker (with it) and the worker's own child
    /// (a data loader: it inherits it), each recording the USR1 it gets.
    #[test]
    fn act_signals_reach_the_workers_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        let run_id = format!("signal-test-{}", std::process::id());
        let loop_on = |name: &str| {
            format!("trap 'echo {name} >> {d}/got' USR1; echo $$ > {d}/{name}.pid; while :; do sleep 0.05; done")
        };
        let worker = format!("sh -c \"$1\" child & {}", loop_on("worker"));
        let launcher = format!(
            "TORCHELASTIC_RUN_ID=x sh -c \"$1\" worker \"$2\" & {}",
            loop_on("launcher")
        );
        let command = NodeCommand::new("sh")
            .args(["-c", &launcher, "launcher", &worker, &loop_on("child")])
            .env(RUN_ID_VAR, &run_id)
            .env("PIPETTE_HOST", "node-x");
        let running = spawn(&Transport::Local, "node-x", &command).unwrap();
        let end = Instant::now() + Duration::from_secs(20);
        for name in ["launcher", "worker", "child"] {
            let pid = dir.path().join(format!("{name}.pid"));
            while !std::fs::read_to_string(&pid).is_ok_and(|t| t.ends_with('\n')) {
                assert!(Instant::now() < end, "{name} never started");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let tell = |host: &str| {
            signal_workers(
                &Transport::Local,
                host,
                &run_id,
                Signal::SIGUSR1,
                Duration::from_secs(5),
            )
            .unwrap()
        };
        assert_eq!(tell("node-x"), 1);
        let got = dir.path().join("got");
        while !got.exists() {
            assert!(Instant::now() < end, "the worker never got USR1");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Another node's workers on the same machine are not told.
        assert_eq!(tell("node-y"), 0);
        // Only the worker was signalled (`tell` counts every process it signalled).
        assert_eq!(std::fs::read_to_string(&got).unwrap(), "worker\n");
        let mut job = RunningJob {
            nodes: vec![RunningNode {
                host: "node-x".into(),
                node_rank: 0,
                command: Some(running),
                status: None,
                start_error: None,
            }],
        };
        teardown(&mut job, Duration::from_secs(2), &|| false);
        sweep(&Transport::Local, "node-x", &run_id, Duration::from_secs(5)).unwrap();
    }

    #[test]
    fn a_second_signal_kills_at_once() {
        let command = NodeCommand::new("sh")
            .arg("-c")
            .arg("trap '' TERM; sleep 60 & wait; wait");
        let running = spawn(&Transport::Local, "n", &command).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let mut job = RunningJob {
            nodes: vec![RunningNode {
                host: "n".into(),
                node_rank: 0,
                command: Some(running),
                status: None,
                start_error: None,
            }],
        };
        let start = Instant::now();
        let stops = teardown(&mut job, Duration::from_secs(30), &|| {
            start.elapsed() > Duration::from_millis(200)
        });
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(stops[0].status, Some(Status::Signaled(9)));
    }
}
