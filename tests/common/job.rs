//! The one harness for a pipette-run under test: [`JobBuilder`] sets up the command (a CPU
//! job on loopback, its files in a temp dir of its own), [`RunningJob`] is the handle to the
//! running job: its output, events and checkpoints, waits bounded by a [`Watchdog`], and a
//! guard that leaves nothing running when a test fails.
//!
//! The temp dir's path is the job's marker: every process of the job names it on its
//! command line (the script's arguments) or in its environment (the run directory), and
//! that is how the process table is searched.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use super::{cpu_job_command, cpu_profile, free_port, processes, Proc};

/// How long a wait may last: the job may show nothing new for `quiet`, and the wait ends
/// after `hard` whatever the job does (a job stuck printing the same thing forever must
/// still end the test).
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    pub quiet: Duration,
    pub hard: Duration,
}

impl Patience {
    /// A job that is slow (a busy machine, a silent profile or trial) keeps adding to its
    /// output or CPU time; a hung one does not. Fails after `quiet` without news, or ten
    /// minutes in all.
    pub fn quiet(quiet: Duration) -> Patience {
        Patience {
            quiet,
            hard: Duration::from_secs(10 * 60),
        }
    }

    /// At most `limit` in all (and without news for as long).
    pub fn total(limit: Duration) -> Patience {
        Patience {
            quiet: limit,
            hard: limit,
        }
    }
}

/// Tells a hung job from a slow one. A fixed limit on a whole job measures the machine: on
/// a busy one the profile and the trial alone can take minutes. So a wait fails when the
/// job shows nothing new for its quiet limit, and only past the hard limit otherwise.
pub struct Watchdog {
    patience: Patience,
    started: Instant,
    last_change: Instant,
    last_activity: u64,
    last_look: Option<Instant>,
}

/// How often a wait looks whether what it waits for has come.
const POLL: Duration = Duration::from_millis(50);

/// How often the watchdog looks at the job's activity: reading the whole process table
/// costs CPU that the job under test needs, and a quiet limit is many seconds.
const LOOK_EVERY: Duration = Duration::from_millis(500);

impl Watchdog {
    pub fn new(patience: Patience) -> Self {
        let now = Instant::now();
        Watchdog {
            patience,
            started: now,
            last_change: now,
            last_activity: 0,
            last_look: None,
        }
    }

    /// Why the wait is over given the job's `activity` (asked for at most every
    /// [`LOOK_EVERY`]), or `None` to keep waiting.
    pub fn expired(&mut self, activity: impl FnOnce() -> u64) -> Option<String> {
        if self.last_look.is_none_or(|at| at.elapsed() >= LOOK_EVERY) {
            self.last_look = Some(Instant::now());
            let activity = activity();
            if activity != self.last_activity {
                self.last_activity = activity;
                self.last_change = Instant::now();
            }
        }
        if self.last_change.elapsed() > self.patience.quiet {
            Some(format!("nothing new for {:?}", self.patience.quiet))
        } else if self.started.elapsed() > self.patience.hard {
            Some(format!("still going after {:?}", self.patience.hard))
        } else {
            None
        }
    }
}

/// A pipette-run under test, being set up: [`crate::common::cpu_job_command`] run from the
/// repository, standard input closed, standard output and error into files of its temp dir.
pub struct JobBuilder {
    dir: Arc<tempfile::TempDir>,
    outputs: Outputs,
    command: Command,
    context: Option<fn() -> String>,
}

/// The names of a job's standard output and error files in its dir.
#[derive(Debug, Clone)]
struct Outputs {
    stdout: String,
    stderr: String,
}

impl JobBuilder {
    /// `pipette-run` (`bin`: `env!("CARGO_BIN_EXE_pipette-run")`) in a new temp dir whose
    /// name starts with `prefix`; its output goes to `stdout` and `stderr` there.
    pub fn new(bin: &str, prefix: &str) -> JobBuilder {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        JobBuilder::in_dir(bin, &Arc::new(dir), "")
    }

    /// Another `pipette-run` in `dir` (one of several copies that make one job, sharing
    /// their marker); its output goes to `stdout{suffix}` and `stderr{suffix}` there.
    pub fn in_dir(bin: &str, dir: &Arc<tempfile::TempDir>, suffix: &str) -> JobBuilder {
        JobBuilder {
            dir: Arc::clone(dir),
            outputs: Outputs {
                stdout: format!("stdout{suffix}"),
                stderr: format!("stderr{suffix}"),
            },
            command: cpu_job_command(bin),
            context: None,
        }
    }

    /// The job's temp dir (the marker), for files the command names.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The command, for anything the helpers below do not set.
    pub fn command(&mut self) -> &mut Command {
        &mut self.command
    }

    pub fn arg(&mut self, arg: impl AsRef<std::ffi::OsStr>) -> &mut Self {
        self.command.arg(arg);
        self
    }

    pub fn args<S: AsRef<std::ffi::OsStr>>(
        &mut self,
        args: impl IntoIterator<Item = S>,
    ) -> &mut Self {
        self.command.args(args);
        self
    }

    /// `--hosts` and `--nproc-per-node`.
    pub fn hosts(&mut self, hosts: &[&str], nproc_per_node: usize) -> &mut Self {
        self.args(["--hosts", &hosts.join(",")])
            .args(["--nproc-per-node", &nproc_per_node.to_string()])
    }

    /// `--cluster` with a profile of `hosts`, `gpus` CPU stand-ins each, written to the dir.
    pub fn cpu_cluster(&mut self, hosts: &[&str], gpus: usize) -> &mut Self {
        let profile = self.dir().join("cluster.json");
        std::fs::write(&profile, cpu_profile(hosts, gpus)).unwrap();
        self.arg("--cluster").arg(profile)
    }

    /// `--run-dir` (the dir's `run`), `--torchrun` (the venv's: [`super::torchrun`]) and a
    /// `--master-port` of its own ([`free_port`]): what every launch here passes.
    pub fn launch_basics(&mut self, torchrun: &Path) -> &mut Self {
        let run = self.dir().join("run");
        self.arg("--run-dir")
            .arg(run)
            .arg("--torchrun")
            .arg(torchrun)
            .args(["--master-port", &free_port().to_string()])
    }

    /// What a failure message adds after the job's output (e.g. which Megatron ran).
    pub fn failure_context(&mut self, context: fn() -> String) -> &mut Self {
        self.context = Some(context);
        self
    }

    /// Starts it.
    pub fn spawn(mut self) -> RunningJob {
        let d = self.dir.path();
        self.command
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(d.join(&self.outputs.stdout)).unwrap())
            .stderr(std::fs::File::create(d.join(&self.outputs.stderr)).unwrap());
        let child = self.command.spawn().expect("start pipette-run");
        RunningJob {
            dir: self.dir,
            outputs: self.outputs,
            child: Some(child),
            context: self.context,
            started: Instant::now(),
        }
    }
}

/// A running (or finished) pipette-run under test. Dropping it stops the job as a user's
/// Ctrl-C twice would and kills whatever of it is left, so that a failed test does not
/// leave its job running into the next one.
pub struct RunningJob {
    dir: Arc<tempfile::TempDir>,
    outputs: Outputs,
    child: Option<Child>,
    context: Option<fn() -> String>,
    pub started: Instant,
}

impl RunningJob {
    /// The temp dir's path, on the command line or in the environment of every process of
    /// the job.
    pub fn marker(&self) -> String {
        self.dir.path().display().to_string()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn run_dir(&self) -> PathBuf {
        self.path("run")
    }

    /// A file of the dir, empty when it is not there (yet).
    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    pub fn stdout(&self) -> String {
        self.read(&self.outputs.stdout)
    }

    pub fn stderr(&self) -> String {
        self.read(&self.outputs.stderr)
    }

    /// pipette-run's exit status, `None` while it runs.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().unwrap().try_wait().unwrap()
    }

    /// Both outputs, for a failure message.
    pub fn output(&self) -> String {
        format!("stdout:\n{}\nstderr:\n{}", self.stdout(), self.stderr())
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid()), signal).unwrap();
    }

    /// The events pipette-run wrote so far (none when it wrote no file).
    pub fn events(&self) -> Vec<Value> {
        pipette::supervise::events::read_events(&self.run_dir().join("events.jsonl"))
            .unwrap_or_default()
    }

    /// The last checkpoint's iteration, from the tracker file of `--save` (the dir's `save`).
    pub fn saved(&self) -> Option<u64> {
        self.read("save/latest_checkpointed_iteration.txt")
            .trim()
            .parse()
            .ok()
    }

    /// Everything the nodes of attempt `n` wrote (its `logs/`; attempt 1's are the run
    /// directory's own).
    pub fn attempt_logs(&self, n: u32) -> String {
        let mut dir = self.run_dir();
        if n > 1 {
            dir = dir.join(format!("attempt-{n}"));
        }
        let mut text = String::new();
        for entry in std::fs::read_dir(dir.join("logs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
        text
    }

    /// Every process of the job: its marker on the command line or in the environment
    /// (Megatron's checkpoint writer names it only in its environment).
    pub fn processes(&self) -> Vec<Proc> {
        job_processes(&self.marker())
    }

    /// How far the job has got: the bytes of its output and events, and the CPU time of
    /// its processes. A job that is slow keeps adding to it; a hung one does not.
    pub fn activity(&self) -> u64 {
        let written: u64 = [
            self.outputs.stdout.as_str(),
            self.outputs.stderr.as_str(),
            "run/events.jsonl",
        ]
        .iter()
        .map(|name| std::fs::metadata(self.path(name)).map_or(0, |m| m.len()))
        .sum();
        let cpu: u64 = self.processes().iter().map(|p| p.cpu_ticks).sum();
        written + cpu
    }

    /// `what` went wrong, with the tail of the job's output and the builder's context.
    pub fn failure(&self, what: &str) -> String {
        format!(
            "{what}{}:\nstdout:\n{}\nstderr:\n{}",
            self.context
                .map(|c| format!(" ({})", c()))
                .unwrap_or_default(),
            tail(&self.stdout(), 40),
            tail(&self.stderr(), 60)
        )
    }

    /// Waits until `done` holds; fails when pipette-run exits first or `patience` runs out.
    pub fn wait_until(&mut self, what: &str, patience: Patience, done: impl Fn(&Self) -> bool) {
        let mut watchdog = Watchdog::new(patience);
        while !done(self) {
            if let Ok(Some(status)) = self.child.as_mut().unwrap().try_wait() {
                panic!(
                    "{}",
                    self.failure(&format!("pipette-run exited ({status}) before {what}"))
                );
            }
            if let Some(why) = watchdog.expired(|| self.activity()) {
                panic!("{}", self.failure(&format!("no {what}: {why}")));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until the job's standard output holds `needle`.
    pub fn wait_for_output(&mut self, needle: &str, patience: Patience) {
        self.wait_until(&format!("{needle:?}"), patience, |job| {
            job.stdout().contains(needle)
        });
    }

    /// Waits until the job has printed (Megatron's line for) iteration `n`.
    pub fn wait_for_iteration(&mut self, n: u64, patience: Patience) {
        let needle = iteration_line(n);
        self.wait_until(&format!("iteration {n}"), patience, |job| {
            job.stdout().contains(&needle)
        });
    }

    /// Waits for pipette-run to exit; stops it (and fails) when `patience` runs out.
    pub fn wait(&mut self, patience: Patience) -> ExitStatus {
        let mut watchdog = Watchdog::new(patience);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                return status;
            }
            if let Some(why) = watchdog.expired(|| self.activity()) {
                let child = self.child.as_mut().unwrap();
                let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
                let _ = child.wait();
                panic!(
                    "{}",
                    self.failure(&format!("pipette-run did not finish: {why}"))
                );
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for RunningJob {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            super::interrupt_twice_and_reap(&mut child);
        }
        for p in self.processes() {
            let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
        }
    }
}

/// Every process (not this one) that names `marker` on its command line or in its
/// environment.
pub fn job_processes(marker: &str) -> Vec<Proc> {
    let me = std::process::id() as i32;
    processes()
        .into_iter()
        .filter(|p| {
            p.pid != me
                && (p.cmdline.contains(marker) || p.environ.iter().any(|e| e.contains(marker)))
        })
        .collect()
}

/// Megatron's iteration line for `n` (` iteration        5/      20 |`), as the toy
/// script prints it too.
pub fn iteration_line(n: u64) -> String {
    format!(" iteration {n:8}/")
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The events named `name`.
pub fn find<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

/// Now, in milliseconds since the Unix epoch (as the events' `unix_ms`).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The events' names, in order.
pub fn names(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["event"].as_str().unwrap_or("?"))
        .collect()
}
