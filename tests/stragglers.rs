//! Stragglers end to end, with PyTorch's real torchrun on CPU: three local "nodes"
//! (`node-a`, `node-b`, `node-c`, one worker each) train `examples/train_gpt.py` with
//! Megatron's `--log-straggler` report, which the script prints from every rank's compute
//! time gathered each log interval, as Megatron does from CUDA events.
//!
//! The slowdown is a stand-in for a throttled GPU: the script multiplies its own compute
//! time when a per-node trigger file appears (`--toy-slow-file`, `{host}` replaced by the
//! node's name). On this machine (two cores shared with other jobs) a competing busy loop
//! or a CPU quota would slow every node at random, not one node on purpose. Each
//! micro-batch's compute lasts a fixed time (`--toy-micro-batch-seconds`, like a GPU
//! kernel's), so the iteration times are steady and the test costs little CPU.
//!
//! The slowed node runs at 0.4 of its speed (factor 2.5), not 0.5: with data parallelism
//! only (the toy splits nothing else), leaving one of three nodes out makes each of the
//! other two do 3/2 of the work, so a node at exactly half speed would cost 2× and the
//! re-plan would bring 1.5×: exactly half the loss back, with nothing to spare for noise.
//! At 2.5× the re-plan must win back (2.5 − 1.5) / (2.5 − 1) = 2/3 of it.
//!
//! pipette-run acts only when the time saved over the remaining iterations beats the
//! restart's measured cost, mostly the start-up to the first iteration (importing torch on
//! three workers at once: 20 s on a quiet machine, over a minute on a busy one). So that
//! the verdict never hangs on this machine's load, the job is a chunk of a long run, as
//! pre-empted jobs are: `--train-iters 100000` (what the gain is reckoned over) and
//! Megatron's `--exit-interval N`, which ends this chunk at iteration N, saved.
//!
//! `cargo test --test stragglers`. Needs the venv of `scripts/setup-megatron-venv` (or
//! `PIPETTE_MEGATRON_PYTHON`); fails, never skips, without it.

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{assert_no_process_left, cpu_job_command, cpu_profile, torchrun};
use pipette::supervise::events::read_events;
use serde_json::Value;

/// Two cores cannot hold two such jobs: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const HOSTS: [&str; 3] = ["node-a", "node-b", "node-c"];

/// Starts pipette-run with `--stragglers act` on the three nodes for a chunk of
/// `iterations` iterations of a long run, its files in `dir`.
fn start(dir: &Path, iterations: u64) -> Child {
    start_in_mode(dir, iterations, "act")
}

/// [`start`] with `--stragglers mode`.
fn start_in_mode(dir: &Path, iterations: u64, mode: &str) -> Child {
    let profile = dir.join("cluster.json");
    std::fs::write(&profile, cpu_profile(&HOSTS, 1)).unwrap();
    let mut command = cpu_job_command(env!("CARGO_BIN_EXE_pipette-run"));
    command
        .arg("--no-trial")
        .arg("--cluster")
        .arg(&profile)
        .args(["--hosts", &HOSTS.join(","), "--nproc-per-node", "1"])
        .args(["--launcher", "local", "--pin", "tp=1,pp=1,mbs=1"])
        .arg("--run-dir")
        .arg(dir.join("run"))
        .arg("--torchrun")
        .arg(torchrun())
        .args(["--master-port", &common::free_port().to_string()])
        .args(["--grace", "2s", "--health-timeout", "15s"])
        .args(["--stragglers", mode, "--straggler-windows", "3"])
        .arg("examples/train_gpt.py")
        .args([
            "--num-layers",
            "1",
            "--hidden-size",
            "32",
            "--num-attention-heads",
            "2",
            "--seq-length",
            "16",
            "--max-position-embeddings",
            "16",
            "--vocab-size",
            "128",
            "--micro-batch-size",
            "1",
            "--global-batch-size",
            "12",
            "--train-iters",
            "100000",
            "--exit-interval",
            &iterations.to_string(),
            "--save-interval",
            "10",
            "--log-interval",
            "2",
            "--log-straggler",
            "--straggler-minmax-count",
            "2",
            "--toy-micro-batch-seconds",
            "0.1",
            "--toy-slow-factor",
            "2.5",
        ])
        .arg("--toy-slow-file")
        .arg(dir.join("slow-{host}"))
        .arg("--save")
        .arg(dir.join("save"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap());
    command.spawn().expect("start pipette-run")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits until `done` while `child` (pipette-run, its files in `dir`) runs; `what` names
/// what is waited for.
fn wait_for(child: &mut Child, dir: &Path, what: &str, done: &dyn Fn() -> bool) {
    let limit = Instant::now() + Duration::from_secs(240);
    while !done() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "pipette-run exited before {what}:\n{}",
            read(&dir.join("stderr"))
        );
        assert!(Instant::now() < limit, "no {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the job's output shows iteration `n`.
fn wait_for_iteration(child: &mut Child, dir: &Path, n: u64) {
    let needle = format!(" iteration {n:8}/");
    let stdout = dir.join("stdout");
    let what = format!("iteration {n}");
    wait_for(child, dir, &what, &|| read(&stdout).contains(&needle));
}

/// Waits for `child` to exit within `limit`; kills it (and fails) after.
fn finish(child: &mut Child, dir: &Path, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "pipette-run did not finish in {limit:?}:\n{}",
                read(&dir.join("stderr"))
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `(iteration, ms)` of every iteration line in the logs of `attempt` (1: the run
/// directory's own).
fn iteration_times(run: &Path, attempt: u32) -> Vec<(u64, f64)> {
    let dir = match attempt {
        1 => run.join("logs"),
        n => run.join(format!("attempt-{n}/logs")),
    };
    let mut times = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        for line in read(&entry.path()).lines() {
            let Some((n, _)) = pipette::launch::output_lines::parse_iteration(line) else {
                continue;
            };
            let Some(rest) = line.split("elapsed time per iteration (ms):").nth(1) else {
                continue;
            };
            let ms: f64 = rest.split('|').next().unwrap().trim().parse().unwrap();
            times.push((n, ms));
        }
    }
    times.sort_by_key(|(n, _)| *n);
    times
}

fn median(mut values: Vec<f64>) -> f64 {
    assert!(!values.is_empty());
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn stragglers(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["event"] == "straggler")
        .collect()
}

#[test]
fn a_slowed_node_is_found_left_out_and_the_pace_recovers() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::Builder::new()
        .prefix("pipette-straggler-")
        .tempdir()
        .unwrap();
    // Found by iteration 26 at the latest (see below), resumed from the checkpoint at 20:
    // the pace after the restart is the median of some twenty iterations.
    let (slow_at, iterations) = (16u64, 48u64);
    let mut child = start(dir.path(), iterations);
    // Slow node-b from iteration `slow_at` on.
    wait_for_iteration(&mut child, dir.path(), slow_at);
    std::fs::write(dir.path().join("slow-node-b"), "").unwrap();
    let status = finish(&mut child, dir.path(), Duration::from_secs(400));
    let stderr = read(&dir.path().join("stderr"));
    assert!(status.success(), "{status}:\n{stderr}");
    let run = dir.path().join("run");
    let events = read_events(&run.join("events.jsonl")).unwrap();

    // Found within the configured windows (3 reports of 2 iterations, judged when the next
    // begins, plus the iteration in flight when the file appeared), with its slowdown.
    let found = stragglers(&events);
    assert_eq!(found.len(), 1, "{found:#?}\n{stderr}");
    let s = found[0];
    assert_eq!(s["host"], "node-b", "{s:#}");
    let at = s["iteration"].as_u64().unwrap();
    assert!(
        at > slow_at && at <= slow_at + 2 * 4 + 2,
        "found at {at}: {s:#}"
    );
    let slowdown = s["slowdown"].as_f64().unwrap();
    assert!((1.8..3.5).contains(&slowdown), "slowdown {slowdown}: {s:#}");
    // Three costed choices, the action and why.
    let choices: Vec<&str> = s["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["choice"].as_str().unwrap())
        .collect();
    assert_eq!(choices, ["keep", "remap", "leave_out"], "{s:#}");
    assert_eq!(s["verdict"]["action"], "leave_out", "{s:#}");
    assert!(
        s["verdict"]["gain_s"].as_f64() > s["verdict"]["cost_s"].as_f64(),
        "{s:#}"
    );
    assert!(stderr.contains("straggler: node-b"), "{stderr}");
    assert!(stderr.contains("leaving node-b out"), "{stderr}");

    // Through the normal re-plan: node-b left out, resumed from the checkpoint.
    let replan = events
        .iter()
        .find(|e| e["event"] == "replan")
        .expect("a replan");
    assert_eq!(
        replan["left_out"],
        serde_json::json!(["node-b"]),
        "{replan:#}"
    );
    assert!(
        replan["resume"]["iteration"].as_u64().is_some(),
        "{replan:#}"
    );
    let exit = events.last().unwrap();
    assert_eq!(exit["event"], "exit");
    assert_eq!(exit["code"], 0);

    // The pace: before the slowdown, slowed, and after the restart (first iterations of
    // each stretch left out: warm-up, and the iteration in flight when the file came).
    let first = iteration_times(&run, 1);
    let second = iteration_times(&run, 2);
    let window = |times: &[(u64, f64)], from: u64, to: u64| -> f64 {
        median(
            times
                .iter()
                .filter(|(n, _)| (from..to).contains(n))
                .map(|(_, ms)| *ms)
                .collect(),
        )
    };
    let before = window(&first, 6, slow_at);
    let slowed = window(&first, slow_at + 2, at + 1);
    let resumed = second.first().unwrap().0;
    let after = window(&second, resumed + 3, iterations + 1);
    println!("ms per iteration: before {before:.1}, slowed {slowed:.1}, after {after:.1}");
    assert!(slowed > before * 1.5, "before {before}, slowed {slowed}");
    assert!(
        slowed - after >= 0.5 * (slowed - before),
        "recovered {:.1} of the {:.1} ms the slowdown cost (before {before:.1}, slowed {slowed:.1}, after {after:.1})",
        slowed - after,
        slowed - before
    );
    assert_no_process_left(&dir.path().display().to_string());
}

#[test]
fn without_a_slowdown_nothing_is_done() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::Builder::new()
        .prefix("pipette-straggler-")
        .tempdir()
        .unwrap();
    let mut child = start(dir.path(), 64);
    let status = finish(&mut child, dir.path(), Duration::from_secs(300));
    let stderr = read(&dir.path().join("stderr"));
    assert!(status.success(), "{status}:\n{stderr}");
    let run = dir.path().join("run");
    let events = read_events(&run.join("events.jsonl")).unwrap();
    assert!(stragglers(&events).is_empty(), "{stderr}");
    assert!(!events.iter().any(|e| e["event"] == "replan"), "{stderr}");
    // The report was there to be read: 32 windows over 64 iterations.
    let logs = read(&dir.path().join("stdout"));
    assert!(logs.matches("MnEtpt/Rnk:").count() >= 30, "{logs}");
    assert_eq!(iteration_times(&run, 1).last().map(|(n, _)| *n), Some(64));
    assert_no_process_left(&dir.path().display().to_string());
}

#[test]
fn a_reported_straggler_that_keeps_up_again_is_said_to_recover() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::Builder::new()
        .prefix("pipette-straggler-")
        .tempdir()
        .unwrap();
    // Reported by iteration 20, recovered by 30 (windows of two iterations, see below),
    // with ten to spare for a test that sees the report late.
    let (slow_at, iterations) = (10u64, 40u64);
    let mut child = start_in_mode(dir.path(), iterations, "report");
    let run = dir.path().join("run");
    wait_for_iteration(&mut child, dir.path(), slow_at);
    // Slowed until it is reported, then back to its speed.
    let slow_file = dir.path().join("slow-node-b");
    std::fs::write(&slow_file, "").unwrap();
    wait_for(&mut child, dir.path(), "a straggler event", &|| {
        let events = read_events(&run.join("events.jsonl")).unwrap_or_default();
        !stragglers(&events).is_empty()
    });
    std::fs::remove_file(&slow_file).unwrap();
    let status = finish(&mut child, dir.path(), Duration::from_secs(300));
    let stderr = read(&dir.path().join("stderr"));
    assert!(status.success(), "{status}:\n{stderr}");
    let events = read_events(&run.join("events.jsonl")).unwrap();

    let found = stragglers(&events);
    assert_eq!(found.len(), 2, "{found:#?}\n{stderr}");
    let (detected, recovered) = (found[0], found[1]);
    assert_eq!(detected["state"], "detected", "{detected:#}");
    assert_eq!(detected["verdict"]["action"], "keep", "{detected:#}");
    assert_eq!(recovered["state"], "recovered", "{recovered:#}");
    assert_eq!(recovered["host"], "node-b", "{recovered:#}");
    assert_eq!(recovered["windows"], 3, "{recovered:#}");
    let (at, back) = (
        detected["iteration"].as_u64().unwrap(),
        recovered["iteration"].as_u64().unwrap(),
    );
    // Three windows of two iterations, judged when the next begins, plus the iteration in
    // flight when the file went.
    assert!(back > at && back <= at + 2 * 4 + 2, "{found:#?}");
    assert!(!events.iter().any(|e| e["event"] == "replan"), "{stderr}");
    // The detection warns; the recovery is an INFO line.
    let line = |text: &str| stderr.lines().find(|l| l.contains(text)).unwrap_or("");
    assert!(line("straggler: node-b").contains("warning: "), "{stderr}");
    let back_line = line("straggler recovered: node-b (node rank 1) has kept up");
    assert!(
        !back_line.is_empty() && !back_line.contains("warning"),
        "{stderr}"
    );
    assert_no_process_left(&dir.path().display().to_string());
}
