//! Staged jobs: a file copied into a fresh temporary directory on every node, then one
//! long-running command per node, watched together — how the link probe and the trial
//! run their Python through torchrun on every node.
//!
//! - [`stage`] makes the directory with `mktemp -d` on each node and writes the file from
//!   the command's standard input; the directory's prefix and the file's name travel as
//!   positional arguments of a fixed `sh -c` script, so nothing is ever quoted into a
//!   shell. The [`StagedDirs`] it returns removes the directories when dropped, whatever
//!   happened, and only directories whose name carries the prefix.
//! - [`free_port`] finds a port nobody listens on at a node (for torchrun's master).
//! - [`run_on_every_node`] starts every node's command, calls back while they run, stops
//!   every node as soon as one fails, the time limit passes or a stop signal arrives (TERM,
//!   grace, KILL, all nodes in parallel; see [`super::signals`]), and hands back every
//!   node's output. Act signals are the caller's to pass on, from `tick`.
//!
//! Knows nothing of torchrun or of what the staged file does.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::group::{End, NodeEnd, NodeGroup, Workers};
use super::{
    format_duration, run, run_with, signals, ExecError, ExecOptions, NodeCommand, Output, Transport,
};

/// One file to put on every node.
#[derive(Debug, Clone, Copy)]
pub struct StagedFile<'a> {
    /// The directory's name starts with this (`pipette-probe` → `pipette-probe.XXXXXX`).
    pub prefix: &'a str,
    /// The file's name in the directory.
    pub name: &'a str,
    pub contents: &'a [u8],
}

/// Why a node could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("{detail}")]
    Node { host: String, detail: String },
}

/// The staged directories, one per node in order, removed on drop.
#[derive(Debug)]
pub struct StagedDirs<'a> {
    transport: &'a Transport,
    timeout: Duration,
    prefix: String,
    dirs: Vec<(String, String)>,
}

impl StagedDirs<'_> {
    /// Node `i`'s directory.
    pub fn dir(&self, i: usize) -> &str {
        &self.dirs[i].1
    }

    /// `(host, directory)` of every node, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.dirs.iter().map(|(h, d)| (h.as_str(), d.as_str()))
    }
}

impl Drop for StagedDirs<'_> {
    fn drop(&mut self) {
        for (host, dir) in &self.dirs {
            if is_staging_dir(dir, &self.prefix) {
                let command = NodeCommand::new("rm").args(["-rf", "--", dir]);
                let _ = run(self.transport, host, &command, self.timeout);
            }
        }
    }
}

/// Makes a temporary directory holding `file` on every host; `timeout` and `grace` bound
/// each staging (and cleanup) command.
pub fn stage<'a>(
    transport: &'a Transport,
    hosts: &[String],
    file: &StagedFile<'_>,
    timeout: Duration,
    grace: Duration,
) -> Result<StagedDirs<'a>, StageError> {
    let mut staged = StagedDirs {
        transport,
        timeout,
        prefix: file.prefix.to_owned(),
        dirs: Vec::new(),
    };
    // A fixed script: prefix and name are its arguments, the bytes come on standard input.
    let script =
        "d=$(mktemp -d \"${TMPDIR:-/tmp}/$1.XXXXXX\") && cat > \"$d/$2\" && printf '%s\\n' \"$d\"";
    for host in hosts {
        let command = NodeCommand::new("sh")
            .args(["-c", script, "sh", file.prefix, file.name])
            .stdin(file.contents.to_vec());
        let output = run_with(
            transport,
            host,
            &command,
            timeout,
            &ExecOptions {
                grace,
                ..ExecOptions::default()
            },
        )?;
        let dir = output.stdout_text().trim().to_owned();
        if !output.status.success() || !is_staging_dir(&dir, file.prefix) {
            return Err(StageError::Node {
                host: host.clone(),
                detail: format!(
                    "{}: {}",
                    output.status,
                    output.last_line().unwrap_or_else(|| "no output".into())
                ),
            });
        }
        staged.dirs.push((host.clone(), dir));
    }
    Ok(staged)
}

/// Only directories [`stage`] made are ever removed.
pub fn is_staging_dir(dir: &str, prefix: &str) -> bool {
    dir.starts_with('/')
        && !dir.contains('\n')
        && std::path::Path::new(dir)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{prefix}.")))
}

/// A port nobody listens on at `host` (found here for the local transport, else asked of
/// `python` there), outside the kernel's ephemeral range ([`outside_ephemeral`]): a port in
/// that range can be taken by any outgoing connection (the job's own, ssh, a health check)
/// between our look and torchrun's bind, which on a busy machine happens (EADDRINUSE);
/// outside it only a listener that asks for the number can. Another may still take it
/// first; that fails loudly, and the supervisor names it as the job's own cause.
pub fn free_port(
    transport: &Transport,
    host: &str,
    python: &str,
    timeout: Duration,
) -> Result<u16, StageError> {
    let node = |detail: String| StageError::Node {
        host: host.to_owned(),
        detail,
    };
    if *transport == Transport::Local {
        return free_port_here().map_err(|e| node(format!("cannot find a free port: {e}")));
    }
    let command = NodeCommand::new(python).args(["-c", FREE_PORT_PY]);
    let output = run(transport, host, &command, timeout)?;
    output
        .stdout_text()
        .trim()
        .parse()
        .ok()
        .filter(|_| output.status.success())
        .ok_or_else(|| {
            node(format!(
                "cannot find a free port with {python} ({}): {} (give --master-port, or the \
                 python to use)",
                output.status,
                output.last_line().unwrap_or_default()
            ))
        })
}

/// What a node's python runs to find a port as [`free_port_here`] does.
const FREE_PORT_PY: &str = "import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(('', p)); return s.getsockname()[1]
    except OSError:
        return None
    finally:
        s.close()
try:
    lo, hi = map(int, open('/proc/sys/net/ipv4/ip_local_port_range').read().split())
except (OSError, ValueError):
    lo, hi = 65536, 65535
below, above = (10000, max(lo - 10000, 0)), (hi + 1, max(65535 - hi, 0))
first, n = below if below[1] >= above[1] else above
start = random.randrange(n) if n else 0
port = next((p for p in (first + (start + i) % n for i in range(n)) if free(p)), None)
print(port or free(0))";

/// The larger stretch of ports from 10000 up that the kernel never hands out as an
/// ephemeral port, as (first, how many), from `/proc/sys/net/ipv4/ip_local_port_range`'s
/// text (`None` when it cannot be read or leaves none).
pub fn outside_ephemeral(range: &str) -> Option<(u32, u32)> {
    let mut words = range.split_whitespace().map(|w| w.parse::<u32>().ok());
    let (low, high) = (words.next()??, words.next()??);
    if low > high || high > 65_535 {
        return None;
    }
    let below = (10_000, low.saturating_sub(10_000));
    let above = (high + 1, 65_535 - high);
    let best = if below.1 >= above.1 { below } else { above };
    (best.1 > 0).then_some(best)
}

/// A free port on this machine outside the ephemeral range (any free port when there is
/// none), free on every address and on the loopback. Successive calls start further on, so
/// that two in one process do not hand out the same port before either is bound.
fn free_port_here() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range");
    if let Some((first, count)) = range.ok().as_deref().and_then(outside_ephemeral) {
        let start = std::process::id().wrapping_mul(7919) % count;
        for _ in 0..count {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let port = (first + (start + n) % count) as u16;
            // One at a time: each listener is closed before the next binds.
            if TcpListener::bind(("0.0.0.0", port)).is_ok()
                && TcpListener::bind(("127.0.0.1", port)).is_ok()
            {
                return Ok(port);
            }
        }
    }
    TcpListener::bind(("0.0.0.0", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
}

/// How a job of one command per node ended badly.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// A node's command ended unsuccessfully ([`NodeEnd::node`]); every node was stopped.
    #[error("{} exited with {}", .end.host, ended_with(.end))]
    Failed {
        end: Box<NodeEnd>,
        /// Every node's output (standard output, standard error) when it was stopped.
        outputs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// The limit passed; every node was stopped.
    #[error("did not finish within {}", format_duration(*.limit))]
    TimedOut {
        limit: Duration,
        outputs: Vec<(Vec<u8>, Vec<u8>)>,
    },
}

fn ended_with(end: &NodeEnd) -> String {
    match (&end.end, end.status()) {
        (_, Some(status)) => status.to_string(),
        (End::NotStarted(e) | End::Lost(e), None) => e.to_string(),
        (End::Exited { .. }, None) => "an unknown status".into(),
    }
}

/// Runs `commands` (host, command), one per node, as a [`NodeGroup`] until all succeed
/// (their outputs, in order), one fails, `timeout` passes, or a stop signal arrives
/// ([`ExecError::Interrupted`]; nothing is started after one). `tick` is called with the
/// group about every 50 ms while they run (to pass act signals on, to read progress), and
/// once more at the end.
pub fn run_on_every_node(
    transport: &Transport,
    commands: &[(String, NodeCommand)],
    options: &ExecOptions,
    timeout: Duration,
    workers: Option<Arc<dyn Workers>>,
    mut tick: impl FnMut(&NodeGroup),
) -> Result<Vec<Output>, JobError> {
    let interrupted = |signal: i32| JobError::Exec(ExecError::Interrupted { signal });
    // Stopping the nodes takes at most the grace period: a second signal waits for it.
    let _stopping = signals::Stopping::new();
    if let Some(r) = signals::stop_received() {
        return Err(interrupted(r.signal));
    }
    let mut group = NodeGroup::start(transport, commands, options);
    if let Some(workers) = workers {
        group = group.with_workers(workers);
    }
    let mut outputs: Vec<Option<Output>> = vec![None; commands.len()];
    let deadline = Instant::now() + timeout;
    loop {
        tick(&group);
        if let Some(r) = signals::stop_received() {
            group.stop(&|| false);
            return Err(interrupted(r.signal));
        }
        for end in group.poll() {
            match end.end {
                End::NotStarted(e) | End::Lost(e) => {
                    group.stop(&|| false);
                    return Err(e.into());
                }
                End::Exited {
                    status,
                    output: Ok(output),
                } if status.success() => outputs[end.node] = Some(output),
                End::Exited { .. } => {
                    group.stop(&|| false);
                    return Err(JobError::Failed {
                        outputs: group.outputs_so_far(),
                        end: Box::new(end),
                    });
                }
            }
        }
        if group.all_ended() {
            break;
        }
        if Instant::now() >= deadline {
            group.stop(&|| false);
            return Err(JobError::TimedOut {
                limit: timeout,
                outputs: group.outputs_so_far(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    tick(&group);
    Ok(outputs.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Status;

    #[test]
    fn ports_are_chosen_outside_the_ephemeral_range() {
        assert_eq!(outside_ephemeral("32768\t60999\n"), Some((10_000, 22_768)));
        assert_eq!(outside_ephemeral("10000 60000"), Some((60_001, 5_535)));
        assert_eq!(outside_ephemeral("1024 65535"), None);
        assert_eq!(outside_ephemeral("garbage"), None);
        assert_eq!(outside_ephemeral("60000 40000"), None);
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
        let (first, count) = outside_ephemeral(&range).expect("this machine's range leaves room");
        let timeout = Duration::from_secs(30);
        let here = free_port(&Transport::Local, "localhost", "python3", timeout).unwrap();
        let again = free_port(&Transport::Local, "localhost", "python3", timeout).unwrap();
        assert_ne!(here, again, "two calls hand out two ports");
        for port in [here, again] {
            assert!((first..first + count).contains(&u32::from(port)), "{port}");
        }
        // What a node's python runs, run here.
        let out = std::process::Command::new("python3")
            .args(["-c", FREE_PORT_PY])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let port: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!((first..first + count).contains(&port), "{port}");
    }

    #[test]
    fn only_our_directories_are_removed() {
        assert!(is_staging_dir("/tmp/pipette-probe.x1Y2z3", "pipette-probe"));
        assert!(!is_staging_dir(
            "/tmp/pipette-probe.x1Y2z3",
            "pipette-trial"
        ));
        assert!(!is_staging_dir("/", "pipette-probe"));
        assert!(!is_staging_dir("/home/user", "pipette-probe"));
        assert!(!is_staging_dir("tmp/pipette-probe.x", "pipette-probe"));
        assert!(!is_staging_dir("", "pipette-probe"));
    }

    #[test]
    fn stages_runs_and_cleans_up() {
        let t = Transport::Local;
        let hosts = vec!["a".to_owned(), "b".to_owned()];
        let file = StagedFile {
            prefix: "pipette-test",
            name: "it's here.txt",
            contents: b"hello $HOME `x`",
        };
        let dirs = stage(
            &t,
            &hosts,
            &file,
            Duration::from_secs(10),
            DEFAULT_GRACE_TEST,
        )
        .unwrap();
        let commands: Vec<(String, NodeCommand)> = dirs
            .iter()
            .map(|(h, d)| {
                (
                    h.to_owned(),
                    NodeCommand::new("cat").arg(format!("{d}/it's here.txt")),
                )
            })
            .collect();
        let mut ticks = 0;
        let out = run_on_every_node(
            &t,
            &commands,
            &ExecOptions::default(),
            Duration::from_secs(10),
            None,
            |_| ticks += 1,
        )
        .unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].stdout_text(), "hello $HOME `x`");
        assert!(ticks >= 2);
        let first = dirs.dir(0).to_owned();
        assert!(std::path::Path::new(&first).is_dir());
        drop(dirs);
        assert!(!std::path::Path::new(&first).exists());
    }

    #[test]
    fn a_failure_stops_every_node() {
        let t = Transport::Local;
        let commands = vec![
            ("a".to_owned(), NodeCommand::new("sleep").arg("30")),
            (
                "b".to_owned(),
                NodeCommand::new("sh").args(["-c", "echo bye; exit 7"]),
            ),
        ];
        let started = Instant::now();
        let err = run_on_every_node(
            &t,
            &commands,
            &ExecOptions {
                grace: Duration::from_secs(1),
                ..ExecOptions::default()
            },
            Duration::from_secs(20),
            None,
            |_| {},
        )
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        match err {
            JobError::Failed { end, outputs } => {
                assert_eq!(end.node, 1);
                assert_eq!(end.status(), Some(Status::Exited(7)));
                assert_eq!(outputs[1].0, b"bye\n");
            }
            other => panic!("{other:?}"),
        }
        let err = run_on_every_node(
            &t,
            &commands[..1],
            &ExecOptions {
                grace: Duration::from_secs(1),
                ..ExecOptions::default()
            },
            Duration::from_millis(300),
            None,
            |_| {},
        )
        .unwrap_err();
        assert!(matches!(err, JobError::TimedOut { .. }), "{err:?}");
    }

    const DEFAULT_GRACE_TEST: Duration = Duration::from_secs(1);
}
