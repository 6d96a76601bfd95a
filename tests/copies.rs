//! One pipette-run per node, as Kubernetes starts them: three copies of the real binary
//! with `PET_NNODES=3`, `PET_NODE_RANK=0..2`, `PET_MASTER_ADDR=127.0.0.1`, each its own
//! node (`--local-addr 127.0.0.N`, one CPU worker), all with the same job secret and the
//! same command line (as one job script would give them). They must make one job: one plan (the leader's),
//! one run directory, one torchrun per node, trained to the end; SIGKILL to the agent of
//! node rank 2 → a re-plan on the two survivors, resumed from the last checkpoint; SIGKILL
//! to the leader → both agents stop their torchrun and exit non-zero, nothing left. A copy
//! with a wrong or missing secret is refused and runs nothing.
//!
//! As in tests/replan.rs: real torchrun on CPU with examples/train_gpt.py, one job at a
//! time, checks on what happened (never how fast, except against the grace period), every
//! process of a job found by its temp dir on the command line. Needs the venv of
//! `scripts/setup-megatron-venv` (or `PIPETTE_MEGATRON_PYTHON`); fails, never skips,
//! without it.

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use common::{
    alive, assert_no_process_left, cpu_profile, eventually, find, free_port, iteration_line, names,
    node_processes, tail, torchrun, JobBuilder, Patience, RunningJob,
};

static SERIAL: Mutex<()> = Mutex::new(());

const HOSTS: [&str; 3] = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];
const SECRET: &str = "copies-test-secret-0123456789";
const SAVE_INTERVAL: u64 = 4;
const TRAIN_ITERS: u64 = 20;
const GRACE_S: u64 = 3;
/// One worker per node: what these tests show (copies making one job, an agent or the
/// leader lost) is about nodes, and every worker costs a PyTorch start-up (2–3 CPU s).
const WORKERS_PER_NODE: usize = 1;

/// Three copies of one job, in their own temp dir (whose path marks every process of the
/// job), each a [`RunningJob`] of the shared harness.
struct Copies {
    dir: Arc<tempfile::TempDir>,
    copies: Vec<Option<RunningJob>>,
    master_port: u16,
    agent_port: u16,
}

impl Copies {
    fn new() -> Copies {
        let dir = tempfile::Builder::new()
            .prefix("pipette-copies-")
            .tempdir()
            .unwrap();
        std::fs::write(
            dir.path().join("cluster.json"),
            cpu_profile(&HOSTS, WORKERS_PER_NODE),
        )
        .unwrap();
        Copies {
            dir: Arc::new(dir),
            copies: Vec::new(),
            master_port: free_port(),
            agent_port: free_port(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn marker(&self) -> String {
        self.dir.path().display().to_string()
    }

    /// Starts the copy of node rank `rank` with the job's command line plus `extra`
    /// pipette options; `secret`: its `PIPETTE_JOB_SECRET` (`None`: unset).
    fn start(&mut self, rank: usize, extra: &[&str], secret: Option<&str>) {
        let mut copy = JobBuilder::in_dir(
            env!("CARGO_BIN_EXE_pipette-run"),
            &self.dir,
            &format!("-{rank}"),
        );
        copy.command()
            .env("PET_NNODES", "3")
            .env("PET_NODE_RANK", rank.to_string())
            .env("PET_MASTER_ADDR", "127.0.0.1")
            .env("PET_MASTER_PORT", self.master_port.to_string())
            .env("PIPETTE_AGENT_PORT", self.agent_port.to_string())
            .env_remove("PIPETTE_JOB_SECRET")
            .env_remove("PIPETTE_JOB_SECRET_FILE");
        if let Some(secret) = secret {
            copy.command().env("PIPETTE_JOB_SECRET", secret);
        }
        copy.args(["--local-addr", HOSTS[rank]])
            .arg("--cluster")
            .arg(self.path("cluster.json"))
            .args(["--nproc-per-node", &WORKERS_PER_NODE.to_string()])
            .args(["--pin", "tp=1,pp=1"])
            .arg("--run-dir")
            .arg(self.path("run"))
            .arg("--torchrun")
            .arg(torchrun())
            .args(["--grace", &format!("{GRACE_S}s"), "--max-replans", "2"])
            .args(["--health-timeout", "15s", "--stall-timeout", "60s"])
            .args(extra)
            .arg("examples/train_gpt.py")
            .args(common::tiny_gpt_args(TRAIN_ITERS, SAVE_INTERVAL))
            .arg("--save")
            .arg(self.path("save"));
        while self.copies.len() <= rank {
            self.copies.push(None);
        }
        self.copies[rank] = Some(copy.spawn());
    }

    /// All three copies, agents first (the leader may come last: the agents wait for it).
    fn start_all(&mut self, extra: &[&str]) {
        for rank in [2, 1, 0] {
            self.start(rank, extra, Some(SECRET));
        }
    }

    fn copy(&self, rank: usize) -> &RunningJob {
        self.copies[rank].as_ref().unwrap()
    }

    fn pid(&self, rank: usize) -> i32 {
        self.copy(rank).pid()
    }

    fn stdout(&self, rank: usize) -> String {
        self.copy(rank).stdout()
    }

    fn stderr(&self, rank: usize) -> String {
        self.copy(rank).stderr()
    }

    fn all_output(&self) -> String {
        (0..self.copies.len())
            .map(|r| format!("--- copy {r} stderr:\n{}", tail(&self.stderr(r), 30)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn saved(&self) -> Option<u64> {
        self.copy(0).saved()
    }

    /// Waits until the leader's output shows iteration `n`; fails when any copy exits first.
    fn wait_for_iteration(&mut self, n: u64, limit: Duration) {
        let needle = iteration_line(n);
        let end = Instant::now() + limit;
        while !self.stdout(0).contains(&needle) {
            for rank in 0..self.copies.len() {
                if let Some(status) = self.copies[rank].as_mut().unwrap().try_wait() {
                    panic!(
                        "copy {rank} exited ({status}) before iteration {n}:\n{}",
                        self.all_output()
                    );
                }
            }
            assert!(
                Instant::now() < end,
                "no iteration {n} within {limit:?}:\n{}",
                self.all_output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for copy `rank` to exit.
    fn wait(&mut self, rank: usize, limit: Duration) -> ExitStatus {
        self.copies[rank]
            .as_mut()
            .unwrap()
            .wait(Patience::total(limit))
    }

    fn events(&self) -> Vec<Value> {
        self.copy(0).events()
    }
}

/// Processes whose parent is `pid`.
fn children(pid: i32) -> Vec<i32> {
    common::processes()
        .into_iter()
        .filter(|p| p.ppid == pid)
        .map(|p| p.pid)
        .collect()
}

fn run_dirs(dir: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("events.jsonl").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    found
}

#[test]
fn three_pods_dry_run_print_one_plan_and_the_agents_follow_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut job = Copies::new();
    job.start_all(&["--dry-run"]);
    for rank in 0..3 {
        let status = job.wait(rank, Duration::from_secs(120));
        assert_eq!(status.code(), Some(0), "copy {rank}:\n{}", job.all_output());
    }
    let leader = job.stdout(0);
    assert!(leader.contains("127.0.0.3"), "{leader}");
    assert!(
        leader.contains("the copies of pipette-run, one pod per node"),
        "{leader}"
    );
    for rank in [1, 2] {
        assert_eq!(job.stdout(rank), "", "only the leader prints the plan");
        let said = job.stderr(rank);
        assert!(
            said.contains(&format!(
                "pipette-run: node rank {rank} ({}) follows the leader on 127.0.0.1",
                HOSTS[rank]
            )),
            "{said}"
        );
        assert!(
            said.contains("pipette-run: the leader ended the job with exit code 0"),
            "{said}"
        );
    }
    assert_no_process_left(&job.marker());
}

#[test]
fn three_pods_train_one_job_to_the_end() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut job = Copies::new();
    // The trial runs once, from the leader; which of the best plans it measures fastest
    // is tests/trial_top_k.rs's to test, so only the plan's pick is trialled.
    job.start_all(&["--trial-iters", "2", "--trial-top-k", "1"]);
    for rank in 0..3 {
        let status = job.wait(rank, Duration::from_secs(400));
        assert_eq!(status.code(), Some(0), "copy {rank}:\n{}", job.all_output());
    }
    let events = job.events();
    let launches = find(&events, "launch");
    assert_eq!(launches.len(), 1, "{:?}", names(&events));
    assert_eq!(launches[0]["transport"], "agent", "{}", launches[0]);
    assert_eq!(
        launches[0]["nodes"].as_array().unwrap().len(),
        3,
        "{}",
        launches[0]
    );
    assert_eq!(find(&events, "exit")[0]["code"], 0);
    assert_eq!(job.saved(), Some(TRAIN_ITERS), "trained to the end");
    // The trial ran once, from the leader (through the agents on their nodes).
    let leader = job.stderr(0);
    assert!(
        leader.contains("pipette-run: trial run: "),
        "{}",
        tail(&leader, 40)
    );
    assert!(job.path("run/trial.json").exists());
    for rank in [1, 2] {
        assert!(
            !job.stderr(rank).contains("trial run"),
            "{}",
            job.stderr(rank)
        );
    }
    // One run directory: the leader's.
    assert_eq!(run_dirs(job.dir.path()), ["run"]);
    // Each node's torchrun ran on its own node, through its own copy: the workers of node
    // rank 2 reported their host as 127.0.0.3.
    let logs: String = std::fs::read_dir(job.path("run/logs"))
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    assert!(logs.contains("iteration"), "{}", tail(&logs, 20));
    for rank in [1, 2] {
        assert!(
            job.stderr(rank)
                .contains("pipette-run: the leader ended the job with exit code 0"),
            "{}",
            job.stderr(rank)
        );
    }
    assert_no_process_left(&job.marker());
}

/// N8: the copies hold the job secret in their environment; nothing they start does (the
/// wrapper, torchrun, the workers on every node: what the secret guards must not be
/// readable by the code it runs). Looked at while the job runs, in /proc.
fn assert_the_job_secret_reaches_no_worker(job: &Copies) {
    for host in HOSTS {
        let processes = node_processes(&job.marker(), host);
        assert!(
            processes.iter().any(|p| p.cmdline.contains("train_gpt.py")),
            "no worker of {host} found"
        );
        for p in processes {
            assert!(
                !p.environ
                    .iter()
                    .any(|e| e.starts_with("PIPETTE_JOB_SECRET") || e.contains(SECRET)),
                "{host}: pid {} ({}) has the job secret",
                p.pid,
                p.cmdline
            );
        }
    }
}

#[test]
fn sigkill_to_the_agent_of_rank_2_replans_on_the_two_survivors() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut job = Copies::new();
    job.start_all(&["--no-trial"]);
    job.wait_for_iteration(SAVE_INTERVAL + 2, Duration::from_secs(180));
    let last_saved = job.saved().expect("a checkpoint was saved");
    assert_the_job_secret_reaches_no_worker(&job);
    kill(Pid::from_raw(job.pid(2)), Signal::SIGKILL).unwrap();
    let killed = job.wait(2, Duration::from_secs(10));
    assert_eq!(killed.code(), None, "killed by the signal");
    // The dead agent's torchrun goes with it (its wrapper's watchdog).
    assert!(
        eventually(Duration::from_secs(GRACE_S + 30), || node_processes(
            &job.marker(),
            HOSTS[2]
        )
        .is_empty()),
        "node rank 2's torchrun outlived its agent"
    );
    for rank in [0, 1] {
        let status = job.wait(rank, Duration::from_secs(300));
        assert_eq!(status.code(), Some(0), "copy {rank}:\n{}", job.all_output());
    }
    let events = job.events();
    let replans = find(&events, "replan");
    assert_eq!(replans.len(), 1, "{:?}", names(&events));
    assert_eq!(replans[0]["left_out"], serde_json::json!([HOSTS[2]]));
    assert_eq!(replans[0]["nodes"], serde_json::json!([HOSTS[0], HOSTS[1]]));
    assert_eq!(replans[0]["resume"]["iteration"], last_saved);
    let failed = find(&events, "node_failed");
    assert_eq!(failed[0]["host"], HOSTS[2], "{failed:?}");
    assert_eq!(failed[0]["reason"], "connection_lost", "{failed:?}");
    let resumed = find(&events, "progress")
        .into_iter()
        .find(|p| p["attempt"] == 2)
        .expect("attempt 2 reported progress");
    assert_eq!(resumed["first_iteration"], last_saved + 1, "{resumed}");
    assert_eq!(job.saved(), Some(TRAIN_ITERS), "trained to the end");
    assert_no_process_left(&job.marker());
}

#[test]
fn sigkill_to_the_leader_stops_every_agent_and_its_torchrun() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut job = Copies::new();
    job.start_all(&["--no-trial"]);
    job.wait_for_iteration(3, Duration::from_secs(180));
    let marker = job.marker();
    for host in HOSTS {
        assert!(
            node_processes(&marker, host).len() >= 2,
            "{host} runs torchrun and its worker"
        );
    }
    // The leader's relays (its children without the marker) must go too.
    let relays = children(job.pid(0));
    let sent = Instant::now();
    kill(Pid::from_raw(job.pid(0)), Signal::SIGKILL).unwrap();
    for rank in [1, 2] {
        let status = job.wait(rank, Duration::from_secs(60));
        assert_eq!(
            status.code(),
            Some(68),
            "copy {rank} exits non-zero (lost its leader):\n{}",
            job.all_output()
        );
        assert!(
            job.stderr(rank).contains("lost the leader at 127.0.0.1:"),
            "{}",
            job.stderr(rank)
        );
        // An agent exits once its commands are gone.
        assert!(
            node_processes(&marker, HOSTS[rank]).is_empty(),
            "{:?}",
            node_processes(&marker, HOSTS[rank])
        );
    }
    eprintln!(
        "leader killed → both agents exited after {:?}",
        sent.elapsed()
    );
    assert!(
        eventually(Duration::from_secs(GRACE_S + 30), || relays
            .iter()
            .all(|p| !alive(*p))),
        "the leader's relays outlived it"
    );
    assert_no_process_left(&marker);
}

#[test]
fn a_copy_with_a_wrong_or_missing_secret_is_refused_and_runs_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut job = Copies::new();
    job.start(0, &["--no-trial"], Some(SECRET));
    job.start(1, &["--no-trial"], Some("another-jobs-secret-0123456789"));
    let status = job.wait(1, Duration::from_secs(60));
    assert_eq!(status.code(), Some(2), "{}", job.all_output());
    assert!(
        job.stderr(1)
            .contains("did not accept this copy: refused: wrong job secret"),
        "{}",
        job.stderr(1)
    );
    assert!(
        eventually(Duration::from_secs(20), || job
            .stderr(0)
            .contains("refused a copy of pipette-run connecting from 127.0.0.")),
        "{}",
        job.stderr(0)
    );
    assert!(job
        .stderr(0)
        .contains(": wrong job secret (it runs nothing)"));
    // No secret at all: refused before it connects.
    job.start(2, &["--no-trial"], None);
    let status = job.wait(2, Duration::from_secs(60));
    assert_eq!(status.code(), Some(2), "{}", job.all_output());
    assert!(
        job.stderr(2).contains("set PIPETTE_JOB_SECRET"),
        "{}",
        job.stderr(2)
    );
    // The leader is still waiting for its node ranks: nothing was launched anywhere.
    assert!(job.copies[0].as_mut().unwrap().try_wait().is_none());
    assert!(!job.path("run").exists(), "no run directory");
    for host in HOSTS {
        assert!(node_processes(&job.marker(), host).is_empty());
    }
    kill(Pid::from_raw(job.pid(0)), Signal::SIGTERM).unwrap();
    job.wait(0, Duration::from_secs(30));
    assert_no_process_left(&job.marker());
}
