//! Subsets and spares end to end (issue 32), with PyTorch's real torchrun on CPU.
//!
//! Local "nodes" (`node-a`, `node-b`, ..., all run here through the local transport) of one
//! CPU process each train `examples/train_gpt.py` (the tiny GPT of tests/replan.rs, a
//! checkpoint every [`SAVE_INTERVAL`] iterations, tp = pp = 1 pinned). One node is killed
//! (SIGKILL to its whole process tree) after the first checkpoint; pipette-run must recover
//! the way the decision says, resume from the last checkpoint (first iteration = last
//! saved + 1), finish with exit code 0 and leave no process of the job behind:
//!
//! - four nodes and a global batch of 8, which three data-parallel ranks cannot split: the
//!   job goes on on a subset of two, the third survivor a spare;
//! - five nodes with `--spares 1`: the plan runs on four, the fifth is the spare, and it
//!   takes the killed node's place with the layout unchanged;
//! - `--nnodes 3:4` on four nodes: the plan uses all four, and losing one keeps the job at
//!   the three the range still allows.
//!
//! What they check is what happened (events, plan files, the nodes' logs), never how fast;
//! the time from the kill to the first resumed iteration is printed. The jobs use their
//! own directories and ports, so the tests run at once (as few iterations as prove the
//! point: the kill lands between the first checkpoint and the end). Needs the venv of
//! `scripts/setup-megatron-venv` (or `PIPETTE_MEGATRON_PYTHON`); fails, never skips,
//! without it.

mod common;

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use common::{
    assert_no_process_left, find, names, node_processes, unix_ms, JobBuilder, Patience, RunningJob,
};

const SAVE_INTERVAL: u64 = 2;
const TRAIN_ITERS: u64 = 5;

/// A job that shows nothing new (output, events, CPU time) for this long is hung.
fn patience() -> Patience {
    Patience::quiet(Duration::from_secs(180))
}

/// pipette-run on `hosts` (one worker each) training the tiny GPT with `batch` as its
/// global batch, with `extra` pipette options.
fn start(hosts: &[&str], batch: u64, extra: &[&str]) -> RunningJob {
    let mut job = JobBuilder::new(env!("CARGO_BIN_EXE_pipette-run"), "pipette-elastic-");
    let save = job.dir().join("save");
    let mut script = common::tiny_gpt_args(TRAIN_ITERS, SAVE_INTERVAL);
    let at = script
        .iter()
        .position(|a| a == "--global-batch-size")
        .unwrap();
    script[at + 1] = batch.to_string();
    job.args(["--no-trial", "--launcher", "local"])
        .cpu_cluster(hosts, 1)
        .hosts(hosts, 1)
        .args(["--pin", "tp=1,pp=1"])
        .launch_basics(&common::torchrun())
        .args(["--health-timeout", "15s", "--grace", "2s"])
        // No --stall-timeout: the kill is seen as a failure at once, and a start-up on a
        // busy machine can take minutes (a hung job fails the test by its patience).
        .args(["--max-replans", "1"])
        .args(extra)
        .arg("examples/train_gpt.py")
        .args(script)
        .arg("--save")
        .arg(save);
    job.spawn()
}

/// SIGKILL to every process of `host` (torchrun first); the last checkpoint's iteration
/// then, and when (unix ms).
fn kill_node(job: &RunningJob, host: &str) -> (u64, u64) {
    let procs = node_processes(&job.marker(), host);
    assert!(
        procs.len() >= 2,
        "{host} runs torchrun and a worker: {procs:?}"
    );
    for p in &procs {
        kill(Pid::from_raw(p.pid), Signal::SIGKILL).unwrap();
    }
    let killed_ms = unix_ms();
    (job.saved().expect("a checkpoint was saved"), killed_ms)
}

fn hosts_of(launch: &Value) -> Vec<String> {
    let nodes = launch["nodes"].as_array().unwrap();
    nodes
        .iter()
        .map(|n| n["host"].as_str().unwrap().to_string())
        .collect()
}

/// Starts the job, kills `victim` at the iteration after the first checkpoint, and checks
/// what every case shares once pipette-run has exited: exit 0 after one re-plan that left
/// `victim` out, tp × pp and the global batch kept, the second attempt resumed at the
/// iteration after the last checkpoint and trained to the end, no process left. Returns
/// the replan event and the two launches' hosts.
fn kill_and_resume(hosts: &[&str], batch: u64, extra: &[&str], victim: &str) -> Recovered {
    let started = Instant::now();
    let mut job = start(hosts, batch, extra);
    job.wait_for_iteration(SAVE_INTERVAL + 1, patience());
    let (saved, killed_ms) = kill_node(&job, victim);
    let status = job.wait(patience());
    let events = job.events();
    let names = names(&events);
    assert_eq!(status.code(), Some(0), "{}\n{names:?}", job.stderr());
    let launches = find(&events, "launch");
    let replans = find(&events, "replan");
    assert_eq!((launches.len(), replans.len()), (2, 1), "{names:?}");
    let replan = replans[0].clone();
    assert_eq!(replan["left_out"], json!([victim]), "{replan}");
    assert_eq!(replan["kept_tp_pp"], true, "{replan}");
    assert_eq!(replan["resume"]["iteration"], saved, "{replan}");
    let second = hosts_of(launches[1]);
    assert_eq!(
        replan["nodes"],
        json!(second),
        "the replan names where it runs"
    );
    assert!(!second.iter().any(|h| h == victim), "{second:?}");

    // Resumed from the last checkpoint, with the same global batch, to the end.
    let resumed = find(&events, "progress")
        .into_iter()
        .find(|p| p["attempt"] == 2)
        .expect("attempt 2 reported progress");
    assert_eq!(resumed["first_iteration"], saved + 1, "{resumed}");
    let logs = job.attempt_logs(2);
    let resuming = format!("resuming training at iteration {}", saved + 1);
    assert!(logs.contains(&resuming), "{logs}");
    assert!(logs.contains(&format!("global batch {batch},")), "{logs}");
    assert_eq!(job.saved(), Some(TRAIN_ITERS));
    assert_no_process_left(&job.marker());
    // Where the time from the kill to the first resumed iteration went (printed, never
    // asserted: it measures the machine).
    let at = |name: &str, n: usize| find(&events, name)[n]["unix_ms"].as_u64().unwrap();
    let (detected, replanned) = (at("node_failed", 0), at("replan", 0));
    let (relaunched, resumed_ms) = (at("launch", 1), resumed["unix_ms"].as_u64().unwrap());
    eprintln!(
        "{victim} killed at iteration {} (saved {saved}) → first resumed iteration: {} ms \
         (detected {} ms, teardown + health + re-plan {} ms, relaunch {} ms, start-up to the \
         first iteration {} ms); whole test {:.1} s",
        SAVE_INTERVAL + 1,
        resumed_ms.saturating_sub(killed_ms),
        detected.saturating_sub(killed_ms),
        replanned.saturating_sub(detected),
        relaunched.saturating_sub(replanned),
        resumed_ms.saturating_sub(relaunched),
        started.elapsed().as_secs_f64()
    );
    let plan: Value = serde_json::from_str(&job.read("run/plan.json")).expect("run/plan.json");
    Recovered {
        replan,
        first: hosts_of(launches[0]),
        second,
        spares: plan["spares"].clone(),
    }
}

/// What a case's recovery did.
struct Recovered {
    replan: Value,
    /// The hosts of the first and second launch, in node-rank order.
    first: Vec<String>,
    second: Vec<String>,
    /// The first plan's spares (`plan.json`).
    spares: Value,
}

impl Recovered {
    /// The decision, from the re-plan's notes (`recovery: subset: ...`).
    fn recovery(&self) -> String {
        let notes = self.replan["notes"].as_array().unwrap();
        let note = notes
            .iter()
            .filter_map(Value::as_str)
            .find_map(|n| n.strip_prefix("recovery: "));
        let note = note.unwrap_or_else(|| panic!("no recovery note: {}", self.replan));
        note.split(':').next().unwrap().to_string()
    }

    fn dp(&self) -> (u64, u64) {
        let dp = |c: &Value| c["dp"].as_u64().unwrap();
        (dp(&self.replan["from"]), dp(&self.replan["to"]))
    }
}

#[test]
fn elastic_a_batch_three_cannot_split_resumes_on_a_subset() {
    let hosts = ["node-a", "node-b", "node-c", "node-d"];
    let r = kill_and_resume(&hosts, 8, &[], "node-b");
    assert_eq!(r.first, hosts, "the first plan uses every node");
    assert_eq!(r.spares, json!([]));
    assert_eq!(r.recovery(), "subset", "{}", r.replan);
    assert_eq!(r.dp(), (4, 2), "{}", r.replan);
    assert_eq!(r.second.len(), 2, "{:?}", r.second);
    assert_eq!(r.replan["spares_in"], json!([]), "{}", r.replan);
}

#[test]
fn elastic_b_the_spare_takes_the_failed_nodes_place() {
    let hosts = ["node-a", "node-b", "node-c", "node-d", "node-e"];
    let r = kill_and_resume(&hosts, 12, &["--spares", "1"], "node-b");
    assert_eq!(r.spares, json!(["node-e"]), "the fifth node is the spare");
    assert_eq!(r.first, hosts[..4]);
    assert_eq!(r.recovery(), "spare", "{}", r.replan);
    assert_eq!(r.replan["spares_in"], json!(["node-e"]), "{}", r.replan);
    assert_eq!(r.replan["from"], r.replan["to"], "the same layout");
    let mut second = r.second.clone();
    second.sort();
    assert_eq!(second, ["node-a", "node-c", "node-d", "node-e"]);
}

#[test]
fn elastic_c_nnodes_min_max_keeps_at_least_min_nodes() {
    let hosts = ["node-a", "node-b", "node-c", "node-d"];
    let r = kill_and_resume(&hosts, 12, &["--nnodes", "3:4"], "node-b");
    assert_eq!(r.first, hosts, "all four: the fastest within 3..4");
    assert_eq!(r.recovery(), "subset", "{}", r.replan);
    assert_eq!(r.dp(), (4, 3), "{}", r.replan);
    let mut second = r.second.clone();
    second.sort();
    assert_eq!(second, ["node-a", "node-c", "node-d"]);
}
