//! Helpers shared by the end-to-end tests: PyTorch's torchrun from the venv, a throwaway
//! sshd and a throwaway one-node Slurm on loopback, the checks every remote transport
//! must pass, a CPU cluster profile, and the process table.
//!
//! Each test binary uses a different part, so unused helpers are not warnings.
#![allow(dead_code)]

mod job;
#[allow(unused_imports)]
pub use job::*;

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The JSON report a successful `--dry-run --json` printed; a failure shows its stderr.
pub fn json_report(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "pipette-run failed ({:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

/// The standard output of this package's `bin`, run from the repository with nothing in its
/// environment (no site settings, no allocation); fails, showing its output, when it does.
pub fn run_clean<S: AsRef<std::ffi::OsStr>>(bin: &str, args: &[S]) -> String {
    let out = assert_cmd::Command::cargo_bin(bin)
        .unwrap()
        .env_clear()
        .current_dir(repo())
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// What a dry run of Llama 2 13B in BF16 (global batch 512) on `cluster` printed, at a
/// fixed layout placed in torchrun's order (tp 2, pp 4, micro-batch 1: the planner has
/// little to search), its run directory `run_dir`; `json` for the report as JSON, `extra`
/// after the script's arguments.
pub fn pinned_llama2_13b_dry_run(
    cluster: &str,
    run_dir: &Path,
    json: bool,
    extra: &[&str],
) -> String {
    let mut args = vec!["--run-dir", run_dir.to_str().unwrap(), "--dry-run"];
    if json {
        args.push("--json");
    }
    args.extend([
        "--cluster",
        cluster,
        "--model",
        "llama2-13b",
        "--pin",
        "tp=2,pp=4,mbs=1",
        "--mapping",
        "identity",
        "pretrain_gpt.py",
        "--bf16",
        "--global-batch-size",
        "512",
    ]);
    args.extend(extra);
    run_clean("pipette-run", &args)
}

/// The words of `text` (split at whitespace): an argument list written as one line.
pub fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

/// The hosts of a dry-run report, in order.
pub fn report_hosts(report: &serde_json::Value) -> Vec<String> {
    report["nodes"]["hosts"]
        .as_array()
        .expect("hosts array")
        .iter()
        .map(|h| h["host"].as_str().expect("host name").to_string())
        .collect()
}

/// The venv's python: `PIPETTE_MEGATRON_PYTHON`, else what `scripts/setup-megatron-venv`
/// prints (it creates the venv on first use).
pub fn venv_python() -> PathBuf {
    let python = match std::env::var_os("PIPETTE_MEGATRON_PYTHON") {
        Some(python) => PathBuf::from(python),
        None => python_from_setup(),
    };
    assert!(
        python.exists(),
        "the venv's python {} not found: run scripts/setup-megatron-venv (it makes the venv \
         with megatron-core 0.19.2 and PyTorch), or set PIPETTE_MEGATRON_PYTHON",
        python.display()
    );
    python
}

/// The python `scripts/setup-megatron-venv` prints (it creates the venv on first use).
fn python_from_setup() -> PathBuf {
    let script = repo().join("scripts/setup-megatron-venv");
    let out = Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed (it makes the Python 3.12 venv with PyTorch whose torchrun this test \
         runs; or set PIPETTE_MEGATRON_PYTHON):\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// PyTorch's torchrun next to the venv's python.
pub fn torchrun() -> PathBuf {
    let python = venv_python();
    let torchrun = python.with_file_name("torchrun");
    assert!(
        torchrun.is_file(),
        "{} not found next to {}: run scripts/setup-megatron-venv, or set \
         PIPETTE_MEGATRON_PYTHON to a python whose venv has PyTorch",
        torchrun.display(),
        python.display()
    );
    torchrun
}

/// Nodes by host name, as a host list names them (no slot counts).
pub fn host_spec(hosts: &[&str]) -> pipette::cluster::ClusterSpec {
    use pipette::cluster::{ClusterSpec, Node, NodeSource, Slots};
    ClusterSpec {
        nodes: hosts
            .iter()
            .map(|h| Node {
                host: (*h).to_owned(),
                slots: Slots::Unknown,
            })
            .collect(),
        source: NodeSource::Hosts,
        job_id: None,
    }
}

/// The repository root (the tests run the example script from there).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The measured 16-node A100 fabric the project shares (`data/mpigraph/`). Never skipped:
/// without it the importer and the models are untested against real data, so the test
/// fails and says what is missing.
pub fn shared_mpigraph_path() -> PathBuf {
    let path = repo().join("data/mpigraph/mpigraph-16node-a100.json");
    assert!(
        path.is_file(),
        "{} is missing: it is the repository's copy of the measured mpiGraph data (see \
         data/mpigraph/README.md); restore it, this test must not be skipped",
        path.display()
    );
    path
}

/// The path of `examples/clusters/NAME`; a missing file fails the test.
pub fn example_cluster_path(name: &str) -> PathBuf {
    let path = repo().join("examples/clusters").join(name);
    assert!(path.is_file(), "{} is missing", path.display());
    path
}

/// The example cluster `examples/clusters/NAME`, loaded; a missing or invalid file fails
/// the test.
pub fn example_cluster(name: &str) -> pipette::cluster::ClusterProfile {
    pipette::cluster::ClusterProfile::load(example_cluster_path(name))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A command of `bin` set up for a CPU job on loopback: run from the repository, gloo on
/// `lo`, one thread per worker, unbuffered Python, and none of the variables from which
/// discovery or planning would read this machine's allocation or pipette settings.
pub fn cpu_job_command(bin: &str) -> Command {
    let mut command = Command::new(bin);
    command
        .current_dir(repo())
        .env("GLOO_SOCKET_IFNAME", "lo")
        .env("OMP_NUM_THREADS", "1")
        .env("PYTHONUNBUFFERED", "1");
    for var in [
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
        "PBS_NODEFILE",
        "PIPETTE_CLUSTER",
        "PIPETTE_HOSTS",
        "PIPETTE_HOSTFILE",
        "PIPETTE_PIN",
        "PIPETTE_LAUNCHER",
        "PIPETTE_CALIBRATION",
        "PIPETTE_NO_TRIAL",
        "SLURM_JOB_ID",
        "SLURM_JOBID",
    ] {
        command.env_remove(var);
    }
    command
}

/// The Megatron-style arguments of the tiny GPT the end-to-end tests train with
/// examples/train_gpt.py: a global batch of 12, a checkpoint every `save_interval`
/// iterations (with `--save`, which the caller adds), 0.3 s per iteration.
pub fn tiny_gpt_args(train_iters: u64, save_interval: u64) -> Vec<String> {
    [
        "--num-layers",
        "2",
        "--hidden-size",
        "64",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "32",
        "--max-position-embeddings",
        "32",
        "--vocab-size",
        "256",
        "--micro-batch-size",
        "1",
        "--global-batch-size",
        "12",
        "--train-iters",
        &train_iters.to_string(),
        "--save-interval",
        &save_interval.to_string(),
        "--toy-iteration-seconds",
        "0.3",
    ]
    .map(String::from)
    .to_vec()
}

/// A port nobody listens on, for a server a test's job starts later (torchrun's master,
/// the copies' agent port) or for a connection that must be refused: the one place the
/// tests pick ports.
///
/// Not "bind port 0, then release it": that port comes from the kernel's ephemeral range,
/// the same range every outgoing connection takes its local port from (the workers' gloo
/// connections, ssh, the job's health checks), so one of those can hold it by the time
/// torchrun binds it (EADDRINUSE, at random). The ports here lie outside that range, where
/// only a listener that asks for the port by number can take it; a counter keeps the ports
/// of one test process apart, and the start, drawn from the process id, those of test
/// binaries that run at once.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (first, count) = ports_outside_ephemeral_range();
    let start = std::process::id().wrapping_mul(7919) % count;
    for _ in 0..count {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (first + (start + n) % count) as u16;
        // One at a time: each listener is closed before the next binds.
        let any = TcpListener::bind(("0.0.0.0", port)).is_ok();
        let loopback = any && TcpListener::bind(("127.0.0.1", port)).is_ok();
        if loopback {
            return port;
        }
    }
    panic!("no free port in {first}..{}", first + count);
}

/// The larger of the two stretches of ports above 10000 that the kernel never hands out as
/// an ephemeral port (`/proc/sys/net/ipv4/ip_local_port_range`), as (first, how many).
fn ports_outside_ephemeral_range() -> (u32, u32) {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .expect("read /proc/sys/net/ipv4/ip_local_port_range");
    let bounds: Vec<u32> = range
        .split_whitespace()
        .map(|w| w.parse().expect("a port number"))
        .collect();
    let (low, high) = (bounds[0], bounds[1]);
    let below = (10_000, low.saturating_sub(10_000));
    let above = (high + 1, 65_535u32.saturating_sub(high));
    let (first, count) = if below.1 >= above.1 { below } else { above };
    assert!(
        count >= 1000,
        "the ephemeral ports {low}-{high} leave too few others for the tests' servers"
    );
    (first, count)
}

/// A cluster profile of `hosts`, each with `gpus` CPU stand-ins ("GPUs" named `cpu`, as
/// `pipette profile` writes them on a machine without GPUs).
pub fn cpu_profile(hosts: &[&str], gpus: usize) -> String {
    let gpu = |i: usize| {
        serde_json::json!({
            "index": i,
            "name": "cpu",
            "memory_bytes": 8u64 << 30,
            "peak_tflops": {"bf16": 0.5, "fp16": 0.5},
            "provenance": {"source": "measured"},
        })
    };
    let square = |n: usize, v: f64| -> Vec<Vec<f64>> {
        (0..n)
            .map(|i| (0..n).map(|j| if i == j { 0.0 } else { v }).collect())
            .collect()
    };
    let nodes: Vec<_> = hosts
        .iter()
        .map(|h| {
            serde_json::json!({
                "host": h,
                "gpus": (0..gpus).map(gpu).collect::<Vec<_>>(),
                "gpu_links": {"provenance": {"source": "measured"}, "gb_per_s": square(gpus, 5.0)},
            })
        })
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({
        "schema": "pipette-cluster/1",
        "note": "local CPU nodes for tests",
        "nodes": nodes,
        "node_links": {"provenance": {"source": "measured"}, "gb_per_s": square(hosts.len(), 2.0)},
    }))
    .unwrap()
}

/// A process in the process table.
#[derive(Debug, Clone)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub state: char,
    pub cmdline: String,
    pub environ: Vec<String>,
    /// CPU time used so far (user + system), in clock ticks: a process that uses none
    /// over a while is not making progress.
    pub cpu_ticks: u64,
}

/// Every live (not zombie) process, with its command line and (when readable) environment.
pub fn processes() -> Vec<Proc> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let state = fields[0].chars().next().unwrap_or('?');
        if state == 'Z' || state == 'X' {
            continue;
        }
        let ppid = fields[1].parse().unwrap_or(0);
        // utime and stime, fields 14 and 15 of stat(5), counted here from the state (3).
        let cpu_ticks = [11, 12]
            .iter()
            .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
            .sum();
        let cmdline = std::fs::read(entry.path().join("cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        let environ = std::fs::read(entry.path().join("environ"))
            .map(|b| {
                b.split(|c| *c == 0)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        out.push(Proc {
            pid,
            ppid,
            state,
            cmdline,
            environ,
            cpu_ticks,
        });
    }
    out
}

/// Live processes whose command line contains `marker` (never this test process).
pub fn with_marker(marker: &str) -> Vec<Proc> {
    let me = std::process::id() as i32;
    processes()
        .into_iter()
        .filter(|p| p.pid != me && p.cmdline.contains(marker))
        .collect()
}

/// The processes of one "node" of a job: the marker on the command line and
/// `PIPETTE_HOST=host` in the environment (torchrun and its workers), torchrun first.
pub fn node_processes(marker: &str, host: &str) -> Vec<Proc> {
    let want = format!("PIPETTE_HOST={host}");
    let mut procs: Vec<Proc> = with_marker(marker)
        .into_iter()
        .filter(|p| p.environ.iter().any(|e| e == &want))
        .collect();
    // Launchers before their workers, so a kill lands on the parent first.
    procs.sort_by_key(|p| !p.cmdline.contains("torchrun"));
    procs
}

/// Waits until `pred` holds, up to `limit`; returns whether it did. Looks every 50 ms: a
/// look is often a read of the whole process table, which costs the job under test CPU.
pub fn eventually(limit: Duration, mut pred: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if pred() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    pred()
}

/// Asserts that no process of the job (its marker on the command line) is left.
pub fn assert_no_process_left(marker: &str) {
    // Processes that are exiting right now (killed, not yet gone from the table) get a
    // moment; on a busy machine one may take longer than that to be scheduled and go, so
    // what is still there then must at least be on its way out (see `dying`). Anything
    // else was leaked.
    eventually(Duration::from_secs(3), || with_marker(marker).is_empty());
    let left: Vec<Proc> = with_marker(marker)
        .into_iter()
        .filter(|p| !dying(p.pid))
        .collect();
    assert!(
        left.is_empty(),
        "{} process(es) of the job are still running:\n{}",
        left.len(),
        left.iter()
            .map(|p| format!(
                "  {} (ppid {}, state {}) {}",
                p.pid, p.ppid, p.state, p.cmdline
            ))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Whether process `pid` is gone or on its way out: a zombie, exiting (the kernel's
/// `PF_EXITING` flag), or with a KILL pending that it has not been scheduled to act on.
pub fn dying(pid: i32) -> bool {
    const PF_EXITING: u64 = 0x4;
    const KILL_BIT: u64 = 1 << (9 - 1);
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // "pid (comm) state ppid pgrp session tty_nr tpgid flags ...".
    let fields: Vec<&str> = stat
        .rfind(')')
        .map_or("", |i| &stat[i + 2..])
        .split_whitespace()
        .collect();
    let flags: u64 = fields.get(6).and_then(|f| f.parse().ok()).unwrap_or(0);
    if matches!(fields.first(), Some(&"Z") | Some(&"X")) || flags & PF_EXITING != 0 {
        return true;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    status.lines().any(|line| {
        ["SigPnd:", "ShdPnd:"].iter().any(|key| {
            line.strip_prefix(key)
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .is_some_and(|mask| mask & KILL_BIT != 0)
        })
    })
}

/// A small but complete set of Megatron arguments, as a job script would pass them.
pub const TINY_MODEL: &[&str] = &[
    "--num-layers",
    "4",
    "--hidden-size",
    "256",
    "--num-attention-heads",
    "8",
    "--seq-length",
    "512",
    "--max-position-embeddings",
    "512",
    "--vocab-size",
    "1000",
    "--global-batch-size",
    "16",
    "--micro-batch-size",
    "2",
];

/// Whether process `pid` is alive (not a zombie).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .is_some_and(|i| !stat[i + 2..].starts_with('Z'))
    })
}

/// The pid a command wrote (a line) to `path`, waiting up to 10 s for it.
pub fn read_pid(path: &Path) -> i32 {
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(path)
            .is_ok_and(|t| t.ends_with('\n'))),
        "{} was never written",
        path.display()
    );
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Arguments that a shell anywhere on the way would mangle: each must reach the command as
/// it is, byte for byte.
pub const AWKWARD: [&str; 18] = [
    "plain",
    "",
    "two words",
    "it's",
    "'",
    "\"double\"",
    "$HOME",
    "${PATH}",
    "`id`",
    "$(id)",
    "a;b|c&d>e<f",
    "line\nbreak",
    "back\\slash\\",
    "*",
    "~",
    "-n",
    "#not a comment",
    "ünïcødé\ttab\r",
];

/// A remote transport gets a command's argv (every [`AWKWARD`] word), environment,
/// working directory (`work`, a name that needs quoting) and standard input (binary bytes)
/// to the node byte for byte, and its output back. `context`: what to print on failure
/// (the daemons' logs).
pub fn assert_remote_io_intact(
    transport: &pipette::exec::Transport,
    host: &str,
    work: &Path,
    context: &dyn Fn() -> String,
) {
    use pipette::exec::{run, NodeCommand};
    std::fs::create_dir(work).unwrap();
    let command = NodeCommand::new("sh")
        .arg("-c")
        .arg("printf '%s\\0' \"$@\"; printf '%s|%s|' \"$WEIRD\" \"$(pwd)\"; cat")
        .arg("argv0")
        .args(AWKWARD)
        .env("WEIRD", "a b'c\"$x`y`\n;z")
        .cwd(work)
        .stdin(b"binary\0bytes\nand 'quotes'".to_vec());
    let out = run(transport, host, &command, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\n{}", context()));
    assert!(out.status.success(), "{}", out.stderr_text());
    let expected_args: String = AWKWARD.iter().map(|a| format!("{a}\0")).collect();
    assert_eq!(
        out.stdout_text(),
        format!(
            "{expected_args}a b'c\"$x`y`\n;z|{}|binary\0bytes\nand 'quotes'",
            work.display()
        )
    );
    assert_eq!(out.stderr_text(), "");
}

/// A remote command's exit code, standard output and standard error come back as the
/// command gave them, with nothing the transport adds.
pub fn assert_remote_exit_code_and_streams(
    transport: &pipette::exec::Transport,
    host: &str,
    context: &dyn Fn() -> String,
) {
    use pipette::exec::{run, NodeCommand, Status};
    let out = run(
        transport,
        host,
        &NodeCommand::new("sh")
            .arg("-c")
            .arg("echo out; echo err >&2; exit 7"),
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", context()));
    assert_eq!(out.status, Status::Exited(7), "{out:?}");
    assert_eq!(out.stdout_text(), "out\n");
    assert_eq!(out.stderr_text(), "err\n");
    assert_eq!(out.last_line().as_deref(), Some("err"));
}

/// A timeout, and dropping or terminating a running remote command (what happens when
/// pipette-run itself is stopped), end the remote process tree, not just the local client.
/// The command ignores TERM, so only the watchdog's KILL ends it. `dir`: for pid files.
pub fn assert_teardown_reaches_the_node(
    transport: &pipette::exec::Transport,
    host: &str,
    dir: &Path,
    context: &dyn Fn() -> String,
) {
    use pipette::exec::{run_with, spawn_with, ExecError, ExecOptions, NodeCommand, Status};
    let options = ExecOptions {
        grace: Duration::from_secs(1),
        ..ExecOptions::default()
    };
    for how in ["timeout", "drop", "terminate"] {
        let marker = format!("pipette-teardown-{}-{how}", std::process::id());
        let leader = dir.join(format!("{how}.leader"));
        let child = dir.join(format!("{how}.child"));
        let command = NodeCommand::new("sh")
            .arg("-c")
            .arg(format!(
                "trap '' TERM; sleep 1000 & echo $! > '{}'; echo $$ > '{}'; wait; wait",
                child.display(),
                leader.display()
            ))
            .arg(&marker);
        let start = Instant::now();
        match how {
            "timeout" => {
                let err = run_with(transport, host, &command, Duration::from_secs(2), &options)
                    .unwrap_err();
                let ExecError::TimedOut { output, .. } = &err else {
                    panic!("{err}\n{}", context());
                };
                assert_eq!(output.status, Status::Exited(137), "{output:?}");
                assert!(
                    err.to_string()
                        .contains(&format!(" on {host} did not finish within 2 s")),
                    "{err}"
                );
            }
            "drop" => {
                let running = spawn_with(transport, host, &command, &options).unwrap();
                read_pid(&leader);
                drop(running);
            }
            _ => {
                let mut running = spawn_with(transport, host, &command, &options).unwrap();
                read_pid(&leader);
                let status = running.terminate().unwrap();
                assert_eq!(status, Status::Exited(137), "{how}");
            }
        }
        let remote = read_pid(&leader);
        let sleeper = read_pid(&child);
        assert!(
            eventually(Duration::from_secs(10), || !alive(remote)
                && !alive(sleeper)),
            "{how}: remote processes {remote} / {sleeper} survived\n{}",
            context()
        );
        assert_no_process_left(&marker);
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{how}: {:?}",
            start.elapsed()
        );
    }
}

/// A daemon a test started in the foreground, its output in a log file; killed and reaped
/// on drop.
pub struct Daemon {
    child: Child,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `command` with no input and both output streams in `log`.
    pub fn start(command: &mut Command, log: PathBuf) -> Daemon {
        let file = std::fs::File::create(&log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        Daemon { child, log }
    }

    pub fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of its log, for a panic message.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }
}

/// Writes `text` to `path` as an executable script.
///
/// A child shell writes it, not this process. Test binaries run their tests on many threads,
/// and a file this process holds open for writing is inherited, for the instant between fork
/// and exec, by any process another thread is starting; exec'ing the script in that instant
/// fails with ETXTBSY ("Text file busy": CI met it once in copies_slurm under load). A
/// single-threaded child that writes, closes and exits leaves nothing to inherit.
pub fn write_executable(path: &Path, text: &str) {
    let status = Command::new("sh")
        .args([
            "-c",
            "printf '%s' \"$2\" > \"$1\" && chmod 755 \"$1\"",
            "sh",
        ])
        .arg(path)
        .arg(text)
        .status()
        .expect("sh runs");
    assert!(
        status.success(),
        "writing {} failed: {status}",
        path.display()
    );
}

/// The last lines of a log file, headed by its path, for a panic message.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "--- {}:\n{}",
        path.display(),
        lines[lines.len().saturating_sub(40)..].join("\n")
    )
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits up to `limit` for `ready`, giving up early when one of `daemons` exits.
pub fn wait_for_daemons(
    daemons: &mut [&mut Daemon],
    limit: Duration,
    ready: impl FnMut() -> bool,
) -> bool {
    let mut ready = ready;
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if daemons.iter_mut().any(|d| d.has_exited()) {
            return false;
        }
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

pub const SSHD: &str = "/usr/sbin/sshd";

/// A throwaway sshd on 127.0.0.1 and 127.0.0.2 (fresh host key, one authorized throwaway client key,
/// all in a temp dir), killed on drop. Its `ssh_config` makes `hosts` aliases of 127.0.0.1.
pub struct Sshd {
    _daemon: Daemon,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Sshd {
    pub fn start() -> Sshd {
        Sshd::start_with("")
    }

    /// As [`Sshd::start`], but every session's `TMPDIR` is [`Sshd::tmp`], a directory of
    /// this sshd's own: what a test finds there is its own, whatever other tests (or other
    /// test runs on the machine) leave in /tmp.
    pub fn start_with_own_tmpdir() -> Sshd {
        let sshd = Sshd::start_with("SetEnv TMPDIR={dir}/tmp\n");
        std::fs::create_dir(sshd.tmp()).unwrap();
        sshd
    }

    /// The sessions' `TMPDIR` under [`Sshd::start_with_own_tmpdir`].
    pub fn tmp(&self) -> PathBuf {
        self.dir.path().join("tmp")
    }

    /// `extra`: more sshd_config lines, `{dir}` standing for the sshd's directory.
    fn start_with(extra: &str) -> Sshd {
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} not found: the ssh transport tests need OpenSSH's server \
             (run scripts/install-test-deps)"
        );
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for key in ["host_key", "client_key"] {
            let status = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(d.join(key))
                .status()
                .expect("ssh-keygen (openssh-client) must be installed");
            assert!(status.success());
        }
        std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys")).unwrap();
        // sshd refuses to start without its privilege separation directory.
        std::fs::create_dir_all("/run/sshd").unwrap();
        let mut last_error = String::new();
        for _attempt in 0..5 {
            let port = free_port();
            let config = d.join("sshd_config");
            std::fs::write(
                &config,
                format!(
                    "Port {port}\nListenAddress 127.0.0.1\nListenAddress 127.0.0.2\nHostKey {dir}/host_key\n\
                     AuthorizedKeysFile {dir}/authorized_keys\nPidFile {dir}/sshd.pid\n\
                     StrictModes no\nUsePAM no\nPasswordAuthentication no\n\
                     KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
                     PermitRootLogin yes\nMaxStartups 50\nMaxSessions 50\nLogLevel ERROR\n{extra}",
                    dir = d.display(),
                    extra = extra.replace("{dir}", &d.display().to_string()),
                ),
            )
            .unwrap();
            let mut daemon = Daemon::start(
                Command::new(SSHD).args(["-D", "-e", "-f"]).arg(&config),
                d.join("sshd.log"),
            );
            if wait_for_daemons(&mut [&mut daemon], Duration::from_secs(10), || {
                TcpStream::connect(("127.0.0.1", port)).is_ok()
            }) {
                return Sshd {
                    _daemon: daemon,
                    port,
                    dir,
                };
            }
            last_error = daemon.log_tail();
        }
        panic!("sshd did not start: {last_error}");
    }

    /// An ssh client configuration (`ssh -F`) that reaches this sshd under every name in
    /// `hosts`, with the throwaway key and known-hosts file.
    pub fn client_config(&self, hosts: &[&str]) -> PathBuf {
        let d = self.dir.path();
        let path = d.join("ssh_config");
        std::fs::write(
            &path,
            format!(
                "Host {hosts}\n  HostName 127.0.0.1\n  Port {port}\n  \
                 IdentityFile {key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {known}\n  \
                 StrictHostKeyChecking no\n  LogLevel ERROR\n",
                hosts = hosts.join(" "),
                port = self.port,
                key = d.join("client_key").display(),
                known = d.join("known_hosts").display(),
            ),
        )
        .unwrap();
        path
    }
}

/// Debian's Slurm and MUNGE programs the Slurm tests run.
const SLURM_PROGRAMS: [&str; 6] = [
    "/usr/sbin/munged",
    "/usr/sbin/slurmctld",
    "/usr/sbin/slurmd",
    "/usr/bin/srun",
    "/usr/bin/salloc",
    "/usr/bin/sinfo",
];

/// A throwaway one-node Slurm cluster on loopback: its own `munged` (fresh key, socket in
/// a temp dir), `slurmctld` and `slurmd` on free ports, with a `slurm.conf` in that temp
/// dir that clients find through `SLURM_CONF`. The system's `/etc/slurm` and `/etc/munge`
/// are never read or touched. Everything it started is killed on drop.
pub struct Slurm {
    daemons: Vec<Daemon>,
    /// The node's Slurm name (any host name: slurmd runs under it with `-N`, and Slurm
    /// reaches it at 127.0.0.1).
    pub node: &'static str,
    pub conf: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Slurm {
    pub fn start() -> Slurm {
        for program in SLURM_PROGRAMS {
            assert!(
                Path::new(program).exists(),
                "{program} not found: the Slurm tests need Debian's slurmctld, slurmd, \
                 slurm-client and munge (run scripts/install-test-deps)"
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("pipette-slurm.")
            .tempdir()
            .unwrap();
        let d = dir.path().to_path_buf();
        let conf = d.join("slurm.conf");
        let munge = Self::start_munged(&d);
        let mut daemons = vec![munge];
        let mut logs = String::new();
        for _attempt in 0..3 {
            for sub in ["state", "spool"] {
                let _ = std::fs::remove_dir_all(d.join(sub));
                std::fs::create_dir(d.join(sub)).unwrap();
            }
            std::fs::write(d.join("plugstack.conf"), "").unwrap();
            std::fs::write(&conf, slurm_conf(&d, SLURM_NODE, free_port(), free_port())).unwrap();
            let mut ctld = Daemon::start(
                Command::new("/usr/sbin/slurmctld")
                    .arg("-D")
                    .env("SLURM_CONF", &conf),
                d.join("slurmctld.out"),
            );
            let mut slurmd = Daemon::start(
                Command::new("/usr/sbin/slurmd")
                    .args(["-D", "-N", SLURM_NODE])
                    .env("SLURM_CONF", &conf),
                d.join("slurmd.out"),
            );
            let idle = wait_for_daemons(
                &mut [&mut daemons[0], &mut ctld, &mut slurmd],
                Duration::from_secs(30),
                || node_state(&conf).as_deref() == Some("idle"),
            );
            if idle {
                daemons.extend([ctld, slurmd]);
                return Slurm {
                    daemons,
                    node: SLURM_NODE,
                    conf,
                    dir,
                };
            }
            logs = format!(
                "sinfo says {:?}\n{}\n{}\n{}",
                node_state(&conf),
                daemons[0].log_tail(),
                ctld.log_tail(),
                slurmd.log_tail()
            );
            drop((ctld, slurmd));
            kill_slurm_leftovers(&conf);
        }
        panic!("the test Slurm cluster never showed its node idle (three tries):\n{logs}");
    }

    /// munged with a fresh key and its socket in `dir`; waits for the socket.
    pub fn start_munged(dir: &Path) -> Daemon {
        use std::os::unix::fs::OpenOptionsExt;
        let key = dir.join("munge.key");
        let mut bytes = vec![0u8; 128];
        std::io::Read::read_exact(
            &mut std::fs::File::open("/dev/urandom").unwrap(),
            &mut bytes,
        )
        .unwrap();
        std::io::Write::write_all(
            &mut std::fs::OpenOptions::new()
                .create_new(true)
                .write(true)
                .mode(0o600)
                .open(&key)
                .unwrap(),
            &bytes,
        )
        .unwrap();
        let socket = dir.join("munge.sock");
        // --force: munged will not run as root (or with its socket in /tmp) otherwise.
        let mut munged = Daemon::start(
            Command::new("/usr/sbin/munged")
                .args(["--foreground", "--force", "--socket"])
                .arg(&socket)
                .arg("--key-file")
                .arg(&key)
                .arg("--pid-file")
                .arg(dir.join("munged.pid"))
                .arg("--log-file")
                .arg(dir.join("munged.log"))
                .arg("--seed-file")
                .arg(dir.join("munged.seed")),
            dir.join("munged.out"),
        );
        let up = wait_for_daemons(&mut [&mut munged], Duration::from_secs(10), || {
            socket.exists()
        });
        assert!(up, "munged did not start:\n{}", munged.log_tail());
        munged
    }

    /// A client command (`srun`, `salloc`, `sinfo`…) of this cluster, with none of the
    /// Slurm variables of whatever runs the tests.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SLURM_") {
                command.env_remove(name);
            }
        }
        command.env("SLURM_CONF", &self.conf);
        command
    }

    /// A new one-node allocation (`salloc --no-shell`); returns its job id.
    pub fn allocate(&self) -> String {
        let out = self
            .command("/usr/bin/salloc")
            .args([
                "--no-shell",
                "--nodes=1",
                "--immediate=30",
                "--job-name=pipette-test",
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        stderr
            .lines()
            .find_map(|l| l.split("Granted job allocation ").nth(1))
            .map(|id| id.trim().to_owned())
            .unwrap_or_else(|| panic!("salloc failed ({}): {stderr}\n{}", out.status, self.logs()))
    }

    /// An `srun` as a job script inside allocation `job` runs it: the real srun, with this
    /// cluster's `SLURM_CONF` and the `SLURM_JOB_ID` salloc sets.
    pub fn srun_in(&self, job: &str) -> PathBuf {
        let path = self.dir.path().join(format!("srun-in-{job}"));
        write_executable(
            &path,
            &format!(
                "#!/bin/sh\nexport SLURM_CONF='{}' SLURM_JOB_ID='{job}'\nexec /usr/bin/srun \"$@\"\n",
                self.conf.display()
            ),
        );
        path
    }

    /// The daemons' logs, for failure messages.
    pub fn logs(&self) -> String {
        let logs = ["munged.log", "slurmctld.log", "slurmd.log"]
            .map(|name| log_tail(&self.dir.path().join(name)));
        logs.join("\n")
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // The daemons first (slurmd no longer starts steps), then what they left: step
        // daemons and tasks.
        self.daemons.clear();
        kill_slurm_leftovers(&self.conf);
    }
}

const SLURM_NODE: &str = "pipette-node";

/// The test cluster's `KillWait` (Slurm's default, written out): how long slurmd waits
/// between TERM and KILL when a step is cancelled gracefully. Tests that check a step is
/// killed at once (not after TERM and this wait) bound their waits by a part of it.
pub const SLURM_KILL_WAIT: Duration = Duration::from_secs(30);

fn slurm_conf(dir: &Path, node: &str, ctld_port: u16, slurmd_port: u16) -> String {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "{}NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=100 State=UNKNOWN\n\
         PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP\n",
        slurm_conf_head(dir, "127.0.0.1", ctld_port, slurmd_port, "")
    )
}

/// Everything of a test cluster's `slurm.conf` but its nodes and partition: slurmctld at
/// `controller` (an address of this machine), munge's socket and every file in `dir`;
/// `per_node` is added to the names of slurmd's spool directory, pid and log file (`-%n`
/// when several slurmd share `dir`).
pub fn slurm_conf_head(
    dir: &Path,
    controller: &str,
    ctld_port: u16,
    slurmd_port: u16,
    per_node: &str,
) -> String {
    let d = dir.display();
    let kill_wait = SLURM_KILL_WAIT.as_secs();
    format!(
        "ClusterName=pipette-test\n\
         SlurmctldHost=localhost({controller})\n\
         SlurmctldPort={ctld_port}\n\
         SlurmdPort={slurmd_port}\n\
         SlurmUser=root\n\
         SlurmdUser=root\n\
         AuthType=auth/munge\n\
         CredType=cred/munge\n\
         AuthInfo=socket={d}/munge.sock\n\
         StateSaveLocation={d}/state\n\
         SlurmdSpoolDir={d}/spool{per_node}\n\
         SlurmctldPidFile={d}/slurmctld.pid\n\
         SlurmdPidFile={d}/slurmd{per_node}.pid\n\
         SlurmctldLogFile={d}/slurmctld.log\n\
         SlurmdLogFile={d}/slurmd{per_node}.log\n\
         PlugStackConfig={d}/plugstack.conf\n\
         MailProg=/bin/true\n\
         ProctrackType=proctrack/linuxproc\n\
         TaskPlugin=task/none\n\
         JobAcctGatherType=jobacct_gather/none\n\
         AccountingStorageType=accounting_storage/none\n\
         JobCompType=jobcomp/none\n\
         SelectType=select/linear\n\
         SwitchType=switch/none\n\
         MpiDefault=none\n\
         ReturnToService=2\n\
         MessageTimeout=10\n\
         KillWait={kill_wait}\n"
    )
}

/// The node's state as `sinfo` reports it (`idle`, `down*`…), `None` when sinfo fails.
pub fn node_state(conf: &Path) -> Option<String> {
    let out = Command::new("/usr/bin/sinfo")
        .args(["--noheader", "--Node", "--format=%T"])
        .env("SLURM_CONF", conf)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Kills every process started with this cluster's `SLURM_CONF` in its environment: step
/// daemons, srun and the tasks it started.
pub fn kill_slurm_leftovers(conf: &Path) {
    let want = format!("SLURM_CONF={}", conf.display());
    let me = std::process::id() as i32;
    for _round in 0..20 {
        let left: Vec<i32> = processes()
            .into_iter()
            .filter(|p| p.pid != me && p.environ.iter().any(|e| e == &want))
            .map(|p| p.pid)
            .collect();
        if left.is_empty() {
            return;
        }
        for pid in left {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs one of `scripts/*.py` with `python`, feeding it `input` as JSON on stdin, and
/// returns the JSON list it prints: one Python process judges every case of a test file.
/// Panics, with the tail of the script's stderr, when it fails, prints no JSON or runs
/// longer than `limit`.
pub fn run_python_batch(
    python: &Path,
    script_name: &str,
    extra_args: &[&str],
    input: &serde_json::Value,
    limit: Duration,
) -> Vec<serde_json::Value> {
    let script = repo().join("scripts").join(script_name);
    let dir = tempfile::tempdir().expect("temp dir");
    let input_file = dir.path().join("cases.json");
    let output = dir.path().join("out.json");
    let log = dir.path().join("python.log");
    std::fs::write(&input_file, serde_json::to_vec(input).unwrap()).unwrap();
    // Files, not pipes: Megatron prints megabytes of arguments to stderr.
    let mut child = Command::new(python)
        .arg(&script)
        .args(extra_args)
        .stdin(std::fs::File::open(&input_file).unwrap())
        .stdout(std::fs::File::create(&output).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .env("PYTHONUNBUFFERED", "1")
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {}: {e} (run scripts/setup-megatron-venv)",
                python.display()
            )
        });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{script_name} took over {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&output).unwrap_or_default();
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let tail: String = {
        let lines: Vec<&str> = stderr.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    assert!(
        status.success(),
        "{script_name} failed ({status}); is the venv complete? \
         (run scripts/setup-megatron-venv)\n{tail}"
    );
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{script_name} printed no JSON ({e}):\n{stdout}\n{tail}"))
}

/// The time stamp before each line of ours (`17:40:02Z pipette-run: ...`, see
/// `pipette::log`), with the program after it.
const STAMP: &str = r"^([01]\d|2[0-3]):[0-5]\d:[0-5]\dZ (pipette-run|pipette): ";

/// pipette's log with the time stamps of its own lines taken off (`17:40:02Z
/// pipette-run: text` → `pipette-run: text`); the nodes' lines (`[host rN] ...`) and what is
/// not a log line (the summary) pass as they are.
pub fn unstamped_log(log: &str) -> String {
    let stamp = regex::Regex::new(STAMP).unwrap();
    log.lines()
        .map(|line| match stamp.find(line) {
            Some(m) => format!(
                "{}: {}",
                &stamp.captures(line).unwrap()[2],
                &line[m.end()..]
            ),
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `line` is one of ours with a well-formed stamp.
pub fn is_stamped(line: &str) -> bool {
    regex::Regex::new(STAMP).unwrap().is_match(line)
}

/// pipette-run's log as it was before its lines were stamped and wrapped at 80 columns
/// (`pipette::log::wrap`): stamps taken off ([`unstamped_log`]), then a continuation, four
/// columns deeper than the line it continues after `pipette-run: ` and the level's word
/// (`warning: `), joined back to that line with one space. Lines of the nodes
/// (`[host rN] ...`) pass as they are.
pub fn unwrapped_log(log: &str) -> String {
    const PREFIX: &str = "pipette-run: ";
    const WORDS: [&str; 4] = ["error: ", "warning: ", "debug: ", "trace: "];
    let indent = |body: &str| body.len() - body.trim_start_matches(' ').len();
    // A line of ours as its level's word and the text after it.
    let ours = |line: &str| -> Option<(String, String)> {
        let rest = line.strip_prefix(PREFIX)?;
        let word = WORDS.iter().find(|w| rest.starts_with(**w)).copied();
        let word = word.unwrap_or_default();
        Some((word.to_string(), rest[word.len()..].to_string()))
    };
    let mut lines: Vec<String> = Vec::new();
    // The level's word and indent of the line being continued, when the last is ours.
    let mut open: Option<(String, usize)> = None;
    for line in unstamped_log(log).lines() {
        match (ours(line), &open, lines.last_mut()) {
            (Some((word, body)), Some((at, depth)), Some(last))
                if word == *at && indent(&body) == depth + 4 =>
            {
                last.push(' ');
                last.push_str(body.trim_start_matches(' '));
            }
            (mine, _, _) => {
                open = mine.map(|(word, body)| (word, indent(&body)));
                lines.push(line.to_string());
            }
        }
    }
    lines.join("\n")
}

/// A command of `bin` (and its subcommand) on two CPU nodes of this machine, `node-a` and
/// `node-b`, one worker each, described by a cluster file written into `dir`, through the
/// local transport with dp 2 pinned (the toy script trains data-parallel only) and the
/// venv's torchrun: the trial tests' setting.
pub fn two_local_cpu_nodes(bin: &str, subcommand: Option<&str>, dir: &Path) -> Command {
    let mut command = cpu_job_command(bin);
    command.args(subcommand);
    let profile = dir.join("cluster.json");
    std::fs::write(&profile, cpu_profile(&["node-a", "node-b"], 1)).unwrap();
    command
        .arg("--cluster")
        .arg(&profile)
        .args(["--hosts", "node-a,node-b", "--nproc-per-node", "1"])
        .args(["--launcher", "local", "--pin", "tp=1,pp=1,dp=2"])
        .arg("--torchrun")
        .arg(torchrun())
        // The job's master port (torchrun's own variable: `pipette calibrate` has no option).
        .env("PET_MASTER_PORT", free_port().to_string());
    command
}

/// Stops a pipette-run that is still running as a user's Ctrl-C twice would (the second
/// kills at once), and reaps it: what a failed test's guard does so that its job does not
/// run on into the next test.
pub fn interrupt_twice_and_reap(child: &mut Child) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    if child.try_wait().ok().flatten().is_none() {
        let pid = Pid::from_raw(child.id() as i32);
        let _ = kill(pid, Signal::SIGINT);
        let _ = kill(pid, Signal::SIGINT);
        let _ = child.wait();
    }
}
