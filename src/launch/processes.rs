//! A job's processes beyond its launchers' process groups ([`JobProcesses`]): a sweep for
//! what a launcher left behind once the job's [`NodeGroup`](crate::exec::group::NodeGroup) has stopped it (TERM, the grace
//! period, KILL, a second signal killing at once), and passing an act signal (USR1, USR2)
//! to the training script's workers while the job goes on ([`signal_workers`]).
//!
//! Why the sweep: torchrun starts each worker in a session of its own, so when torchrun
//! itself is killed (or stopped, and then killed) its workers are outside the process group
//! the group tears down. Every process of a job carries `PIPETTE_RUN_ID` and `PIPETTE_HOST`
//! in its environment, so the sweep finds them by that, on this machine or on a node.

use std::collections::BTreeSet;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::RUN_ID_VAR;
use crate::exec::group::Workers;
use crate::exec::{self, ExecError, NodeCommand, Transport};

/// A job's processes on its nodes, as the run's marks find them: what an act signal is
/// for (the workers torchrun started) and what the sweep kills once the job's group is
/// stopped ([`NodeGroup`](crate::exec::group::NodeGroup)'s [`Workers`]). Each command on a node is bounded by `timeout`.
pub struct JobProcesses {
    pub transport: Transport,
    pub run_id: String,
    pub timeout: Duration,
}

impl Workers for JobProcesses {
    fn signal(&self, host: &str, signal: Signal) -> usize {
        signal_workers(&self.transport, host, &self.run_id, signal, self.timeout).unwrap_or(0)
    }

    fn sweep(&self, host: &str) -> usize {
        sweep(&self.transport, host, &self.run_id, self.timeout).unwrap_or(0)
    }
}

/// A POSIX `sh` script for a remote node that runs `$body` (`sh` words, ending in `;`) for
/// each process there whose environment holds both `$1` and `$2` (`NAME=VALUE` words: the
/// run's and the node's marks), with the process id in `$p`, and then prints `$n`, which
/// `$body` counts up. Reads `/proc/PID/environ` with GNU grep's `-z` (NUL-separated lines).
/// What [`count_on_node`] runs on a remote node; its own shell is skipped.
macro_rules! for_each_process_of_the_run {
    ($($body:literal),+) => {
        concat!(
            "n=0; for d in /proc/[0-9]*; do p=${d#/proc/}; [ \"$p\" = \"$$\" ] && continue; ",
            "grep -qzxF -- \"$1\" \"$d/environ\" 2>/dev/null && grep -qzxF -- \"$2\" \"$d/environ\" 2>/dev/null || continue; ",
            $($body),+,
            " done; echo \"$n\""
        )
    };
}

/// The POSIX `sh` sweep run on remote nodes: kills every process of the run on the node
/// (`$1`, `$2`: see [`for_each_process_of_the_run`]) and prints how many it killed.
pub const SWEEP_SCRIPT: &str =
    for_each_process_of_the_run!("kill -s KILL \"$p\" 2>/dev/null && n=$((n + 1));");

/// Kills every process of run `run_id` on `host` that is still there (see the module doc).
/// Returns how many it killed. On the local transport it reads this machine's `/proc`
/// itself; elsewhere it runs [`SWEEP_SCRIPT`] on the node.
pub fn sweep(
    transport: &Transport,
    host: &str,
    run_id: &str,
    timeout: Duration,
) -> Result<usize, ExecError> {
    let on_node = NodeScript {
        name: "pipette-sweep",
        script: SWEEP_SCRIPT,
        then: &[],
    };
    count_on_node(transport, host, run_id, timeout, on_node, sweep_here)
}

/// The POSIX `sh` count run on remote nodes: how many processes of the run on the node
/// (`$1`, `$2`: see [`for_each_process_of_the_run`]) are stopped (state `T` or `t` in
/// `/proc/PID/stat`, after the command name's closing parenthesis).
pub const STOPPED_SCRIPT: &str = for_each_process_of_the_run!(
    "read -r s < \"$d/stat\" 2>/dev/null || continue; s=${s##*) }; ",
    "case \"$s\" in T*|t*) n=$((n + 1));; esac;"
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
    let on_node = NodeScript {
        name: "pipette-stopped",
        script: STOPPED_SCRIPT,
        then: &[],
    };
    count_on_node(transport, host, run_id, timeout, on_node, |run, node| {
        processes_of(run, node)
            .into_iter()
            .filter(|(pid, _)| is_stopped(*pid))
            .count()
    })
}

/// A script that [`count_on_node`] runs on a remote node as `sh -c script name RUN NODE
/// then...` (`RUN`, `NODE`: the two marks, `NAME=VALUE`), printing a count.
struct NodeScript<'a> {
    /// The script's `$0`, naming it in the node's process list.
    name: &'static str,
    script: &'static str,
    /// Its arguments after the two marks.
    then: &'a [&'a str],
}

/// Does something to the processes of run `run_id` on `host` and returns how many it did
/// it to: on the local transport `here(run, node)` reads this machine's `/proc` itself
/// (`run`, `node`: the marks every process of the run on that node carries, `NAME=VALUE`);
/// elsewhere `on_node` runs there, bounded by `timeout`. A node that prints no count
/// counts 0.
fn count_on_node(
    transport: &Transport,
    host: &str,
    run_id: &str,
    timeout: Duration,
    on_node: NodeScript<'_>,
    here: impl FnOnce(&str, &str) -> usize,
) -> Result<usize, ExecError> {
    let run = format!("{RUN_ID_VAR}={run_id}");
    let node = format!("PIPETTE_HOST={host}");
    if *transport == Transport::Local {
        return Ok(here(&run, &node));
    }
    let command = NodeCommand::new("sh")
        .arg("-c")
        .arg(on_node.script)
        .arg(on_node.name)
        .arg(run)
        .arg(node)
        .args(on_node.then.iter().copied());
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
pub fn environ_has(environ: &[u8], want: &str) -> bool {
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

/// The POSIX `sh` script that passes signal `$3` to the workers of the run on the node
/// (`$1`, `$2`: see [`for_each_process_of_the_run`]) on a remote node, and prints how many
/// it told: the processes of the run with [`WORKER_VAR`] whose parent lacks it (see
/// [`signal_workers`]).
pub const SIGNAL_WORKERS_SCRIPT: &str = for_each_process_of_the_run!(
    "grep -qz '^TORCHELASTIC_RUN_ID=' \"$d/environ\" 2>/dev/null || continue; ",
    "q=$(sed -n 's/^PPid:[[:space:]]*//p' \"$d/status\" 2>/dev/null); ",
    "grep -qz '^TORCHELASTIC_RUN_ID=' \"/proc/$q/environ\" 2>/dev/null && continue; ",
    "kill -s \"$3\" \"$p\" 2>/dev/null && n=$((n + 1));"
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
    let parent_is_worker = |pid: i32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let parent = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|p| p.trim().parse::<i32>().ok());
        parent.is_some_and(|p| {
            std::fs::read(format!("/proc/{p}/environ")).is_ok_and(|e| environ_sets(&e, WORKER_VAR))
        })
    };
    let on_node = NodeScript {
        name: "pipette-signal",
        script: SIGNAL_WORKERS_SCRIPT,
        then: &[signal.as_str().trim_start_matches("SIG")],
    };
    count_on_node(transport, host, run_id, timeout, on_node, |run, node| {
        processes_of(run, node)
            .into_iter()
            .filter(|(pid, environ)| environ_sets(environ, WORKER_VAR) && !parent_is_worker(*pid))
            .filter(|(pid, _)| kill(Pid::from_raw(*pid), signal).is_ok())
            .count()
    })
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::exec::group::NodeGroup;
    use crate::exec::{spawn, Transport};

    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rfind(')')
                .is_some_and(|i| !stat[i + 2..].starts_with('Z'))
        })
    }

    /// What a remote node runs for run `run_id`'s processes on `node`, run on this machine:
    /// what it prints.
    fn run_here(script: &str, run_id: &str, node: &str, then: &[&str]) -> String {
        let out = std::process::Command::new("sh")
            .args(["-c", script, "pipette-test"])
            .arg(format!("{RUN_ID_VAR}={run_id}"))
            .arg(format!("PIPETTE_HOST={node}"))
            .args(then)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
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
        let remote = || run_here(STOPPED_SCRIPT, &run_id, "node-x", &[]);
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
        let mut job =
            NodeGroup::adopt(vec![("node-x".into(), Ok(running))], Duration::from_secs(2));
        let stops = job.stop(&|| false);
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
        // What a remote node runs spares another node's processes too.
        assert_eq!(run_here(SWEEP_SCRIPT, &run_id, "node-y", &[]), "0");
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
        // What a remote node runs tells the same one.
        assert_eq!(
            run_here(SIGNAL_WORKERS_SCRIPT, &run_id, "node-y", &["USR1"]),
            "0"
        );
        assert_eq!(
            run_here(SIGNAL_WORKERS_SCRIPT, &run_id, "node-x", &["USR1"]),
            "1"
        );
        while std::fs::read_to_string(&got).unwrap() != "worker\nworker\n" {
            assert!(Instant::now() < end, "the worker never got the second USR1");
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut job =
            NodeGroup::adopt(vec![("node-x".into(), Ok(running))], Duration::from_secs(2));
        job.stop(&|| false);
        sweep(&Transport::Local, "node-x", &run_id, Duration::from_secs(5)).unwrap();
    }
}
