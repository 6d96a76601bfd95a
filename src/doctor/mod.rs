//! `pipette doctor`: whether the nodes are ready to run. The nodes are found as pipette-run
//! finds them (Slurm, PBS, a hostfile, `--hosts`, `--cluster`'s nodes, or this machine) and
//! reached as it reaches them (local, ssh, srun, with `--ssh-args`, `--srun-args` and the
//! environment every node gets); on each, one probe ([`facts::PROBE`], a fixed `sh` script
//! whose every value is an argument, quoted by [`crate::exec`]) reports what a run needs.
//! The probes run in parallel under a time limit, so a node that hangs is reported as not
//! answering and never holds up the others.
//!
//! - `facts`: the probe and what its output says ([`facts::NodeFacts`]);
//! - `checks`: the judgement, a pure function from the facts to findings and an exit code.
//!
//! The report for people is [`crate::report::doctor`]; finding the nodes and printing
//! belong to the command (`app`).

pub mod checks;
pub mod facts;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::exec::group::{End, NodeGroup};
use crate::exec::{self, ExecError, ExecOptions, NodeCommand, Status, Stream, Transport};
use crate::measure::inventory::GPU_QUERY_ARGS;

use facts::{parse_probe_output, NodeFacts, Reach, PROBE, PYTHON_FACTS};

/// At most this many probes run at once (each is a process here, an ssh or srun client).
const PARALLEL: usize = 64;

/// What the probes need.
pub struct Request {
    pub transport: Transport,
    pub torchrun: String,
    /// Where the run directory goes, absolute.
    pub run_dir: PathBuf,
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    /// torchruns of venvs to try on a node whose PATH has no `torchrun` ([`venv_torchruns`]).
    pub venvs: Vec<String>,
}

/// The torchruns of the venvs pipette-run knows of, for a `--torchrun` given as a bare
/// name: the one beside `PIPETTE_MEGATRON_PYTHON`, then the venv `scripts/setup-megatron-venv`
/// makes (`PIPETTE_MEGATRON_VENV`, else `${XDG_CACHE_HOME:-~/.cache}/pipette-run/megatron-venv`).
/// A path given to `--torchrun` is the user's choice: none then.
pub fn venv_torchruns(torchrun: &str, env: &crate::cluster::Environment) -> Vec<String> {
    if torchrun.contains('/') {
        return Vec::new();
    }
    let var = |name: &str| env.get(name).filter(|v| !v.is_empty());
    let beside_python = var("PIPETTE_MEGATRON_PYTHON")
        .and_then(|python| std::path::Path::new(python).parent())
        .map(|bin| bin.join(torchrun));
    let setup = var("PIPETTE_MEGATRON_VENV")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
            Some(cache.join("pipette-run/megatron-venv"))
        })
        .map(|venv| venv.join("bin").join(torchrun));
    let mut found: Vec<String> = Vec::new();
    for path in beside_python.into_iter().chain(setup) {
        let path = path.display().to_string();
        // One word a line: a path with a line end cannot be passed on.
        if !path.contains('\n') && !found.contains(&path) {
            found.push(path);
        }
    }
    found
}

/// Every node's facts, in the order of `hosts`: the probes run [`PARALLEL`] at a time.
pub fn probe_all(request: &Request, hosts: &[String]) -> Vec<NodeFacts> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<NodeFacts>>> = Mutex::new(vec![None; hosts.len()]);
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL.min(hosts.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                // After a stop signal nothing new starts.
                let Some(host) = hosts
                    .get(i)
                    .filter(|_| exec::signals::stop_received().is_none())
                else {
                    break;
                };
                let facts = probe(request, host);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(facts);
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results
        .into_iter()
        .zip(hosts)
        .map(|(facts, host)| {
            facts.unwrap_or_else(|| {
                NodeFacts::unreached(
                    host,
                    Reach::Unreachable {
                        why: "its probe was lost (this is a bug in pipette; please report it)"
                            .into(),
                    },
                )
            })
        })
        .collect()
}

/// The probe's command: `/bin/sh -c PROBE pipette-doctor TORCHRUN RUN_DIR nvidia-smi FACTS
/// VENVS QUERY...`, every value a word of its own.
fn probe_command(request: &Request) -> NodeCommand {
    let mut command = NodeCommand::new("/bin/sh")
        .args(["-c", PROBE, "pipette-doctor"])
        .arg(request.torchrun.clone())
        .arg(request.run_dir.display().to_string())
        .args(["nvidia-smi", PYTHON_FACTS])
        .arg(request.venvs.join("\n"))
        .args(GPU_QUERY_ARGS);
    command.env = request.env.clone();
    command
}

/// Runs `command` on `host` to its end, stopping it (its whole process tree, on the node
/// too) past the time limit or as soon as a stop signal arrives.
fn run_watched(
    request: &Request,
    host: &str,
    command: &NodeCommand,
    options: &ExecOptions,
) -> Result<exec::Output, ExecError> {
    let commands = [(host.to_string(), command.clone())];
    let mut probe = NodeGroup::start(&request.transport, &commands, options);
    let deadline = Instant::now() + request.timeout;
    loop {
        if let Some(received) = exec::signals::stop_received() {
            probe.stop(&|| false);
            return Err(ExecError::Interrupted {
                signal: received.signal,
            });
        }
        if let Some(end) = probe.poll().pop() {
            return match end.end {
                End::Exited { output, .. } => output,
                End::NotStarted(e) | End::Lost(e) => Err(e),
            };
        }
        if Instant::now() >= deadline {
            let stop = probe.stop(&|| false).pop();
            let (stdout, stderr) = probe.outputs_so_far().pop().unwrap_or_default();
            return Err(ExecError::TimedOut {
                host: host.to_string(),
                command: command.label(),
                limit: request.timeout,
                output: Box::new(exec::Output {
                    status: stop.and_then(|s| s.status).unwrap_or(Status::Exited(-1)),
                    stdout,
                    stderr,
                }),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One node's facts; a node that cannot be reached, or does not answer in time, says so.
fn probe(request: &Request, host: &str) -> NodeFacts {
    // The moment the clock line arrives: the node read its clock between the start and then.
    let clock_seen: Arc<Mutex<Option<SystemTime>>> = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&clock_seen);
    let options = ExecOptions {
        grace: Duration::from_secs(2),
        capture_limit: Some(1 << 20),
        sink: Some(Arc::new(move |_: &str, stream: Stream, line: &[u8]| {
            if stream == Stream::Stdout && line.starts_with(b"clock=") {
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                seen.get_or_insert_with(SystemTime::now);
            }
        })),
    };
    let started = SystemTime::now();
    let output = match run_watched(request, host, &probe_command(request), &options) {
        Ok(output) => output,
        Err(ExecError::TimedOut { limit, .. }) => {
            return NodeFacts::unreached(
                host,
                Reach::TimedOut {
                    seconds: limit.as_secs_f64(),
                },
            )
        }
        Err(e) => return NodeFacts::unreached(host, Reach::Unreachable { why: e.to_string() }),
    };
    let stdout = output.stdout_text();
    let arrived = *clock_seen.lock().unwrap_or_else(|e| e.into_inner());
    let (Some(arrived), true) = (arrived, stdout.lines().any(|l| l.starts_with("clock="))) else {
        return NodeFacts::unreached(
            host,
            Reach::Unreachable {
                why: format!(
                    "the probe ended ({}) without its report: {}",
                    output.status,
                    output.last_line().unwrap_or_else(|| "no output".into())
                ),
            },
        );
    };
    let seconds = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    let (start, end) = (seconds(started), seconds(arrived));
    parse_probe_output(
        host,
        &stdout,
        ((start + end) / 2.0, (end - start).max(0.0) / 2.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn venvs_are_looked_for_where_pipette_run_s_setup_puts_them() {
        let env = |pairs: &[(&str, &str)]| -> crate::cluster::Environment {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            venv_torchruns("torchrun", &env(&[("HOME", "/home/u")])),
            ["/home/u/.cache/pipette-run/megatron-venv/bin/torchrun"]
        );
        assert_eq!(
            venv_torchruns(
                "torchrun",
                &env(&[
                    ("HOME", "/home/u"),
                    ("XDG_CACHE_HOME", "/c"),
                    ("PIPETTE_MEGATRON_PYTHON", "/p/bin/python"),
                ])
            ),
            [
                "/p/bin/torchrun",
                "/c/pipette-run/megatron-venv/bin/torchrun"
            ]
        );
        assert_eq!(
            venv_torchruns("torchrun", &env(&[("PIPETTE_MEGATRON_VENV", "/v")])),
            ["/v/bin/torchrun"]
        );
        // A path to --torchrun is the user's choice; with no home there is nowhere to look.
        assert!(venv_torchruns("/opt/bin/torchrun", &env(&[("HOME", "/h")])).is_empty());
        assert!(venv_torchruns("torchrun", &env(&[])).is_empty());
    }
}
