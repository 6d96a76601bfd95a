//! The measured choice end to end on CPUs with PyTorch's real torchrun: two "nodes"
//! (`node-a`, `node-b`, one CPU process each, through the local transport) and
//! `examples/train_gpt.py`. With `--trial-top-k 3` pipette-run trials the plan's three best
//! configurations after the trial rounds and launches the one measured fastest.
//!
//! On CPU stand-ins the measured times need not follow the model (that is the point of
//! measuring): the test holds pipette-run to what it measured — three candidates, each
//! with its predicted and measured time in trial.json, each measured by a trial of its
//! own (stopped once its median was stable), and the launched plan (plan.json in the run directory) the argmin of those
//! measured times — never to which configuration wins.
//!
//! Needs the venv of `scripts/setup-megatron-venv` (PyTorch with torchrun);
//! `PIPETTE_MEGATRON_PYTHON` picks another python. Fails, never skips, without it.

mod common;

use std::path::Path;
use std::process::Command;

use common::{assert_no_process_left, two_local_cpu_nodes};
use serde_json::Value;

/// The longest trial: the rounds' trial runs them all, a candidate's stops once its
/// median is stable (after 4: the warm-up and three steady ones).
const TRIAL_ITERS: usize = 8;

/// pipette-run on the two CPU nodes, dp 2 pinned (the toy script trains data-parallel
/// only), the tiny GPT of the end-to-end tests; `extra` pipette options.
fn pipette_run(dir: &Path, extra: &[&str]) -> (Command, String) {
    let marker = dir.join("marker").display().to_string();
    let mut command = two_local_cpu_nodes(env!("CARGO_BIN_EXE_pipette-run"), None, dir);
    command
        .arg("--json")
        .arg("--run-dir")
        .arg(dir.join("run"))
        .args(["--trial-iters", &TRIAL_ITERS.to_string()])
        .args(extra)
        .arg("examples/train_gpt.py")
        // 3 iterations, no checkpoint (no --save); a second per iteration, so a trial that
        // is stopped once its median is stable stops well before its last iteration.
        .args(common::tiny_gpt_args(3, 1000))
        .args(["--toy-iteration-seconds", "1"])
        .args(["--data-path", &marker]);
    (command, marker)
}

#[test]
fn top_k_trials_each_candidate_and_launches_the_measured_fastest() {
    let dir = tempfile::tempdir().unwrap();
    let (mut command, marker) = pipette_run(dir.path(), &["--trial-top-k", "3"]);
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    let run_dir = dir.path().join("run");
    let trial: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("trial.json")).unwrap())
            .unwrap();
    let choice = &trial["choice"];
    let candidates = choice["candidates"].as_array().expect("a measured choice");
    assert_eq!(candidates.len(), 3, "three candidates trialled: {choice}");
    assert_eq!(choice["asked"], "--trial-top-k 3");
    // The plan's pick first, then the others by predicted time.
    assert_eq!(candidates[0]["planned"], true, "{choice}");
    let trials = trial["trials"].as_array().unwrap();
    let mut measured = Vec::new();
    let mut trial_of = Vec::new();
    for c in candidates {
        let predicted = c["predicted_ms"].as_f64().expect("a predicted time");
        let ms = c["measured_ms"].as_f64().expect("a measured time");
        assert!(predicted > 0.0 && ms > 0.0, "{c}");
        // Each candidate's time is its own trial's, of its own configuration.
        let t = c["trial"].as_u64().expect("its trial") as usize;
        let m = &trials[t]["measurement"];
        assert_eq!(m["config"], c["config"], "{c}");
        assert_eq!(m["iteration_ms"].as_f64(), Some(ms), "{c}");
        measured.push(ms);
        trial_of.push(t);
    }
    // A candidate's own trial is short: stopped once its median was stable.
    let stopped: Vec<usize> = trial_of
        .iter()
        .copied()
        .filter(|&t| trials[t]["measurement"]["stopped_early"] == true)
        .collect();
    assert!(
        !stopped.is_empty(),
        "a candidate's trial stops early: {trial}"
    );
    for t in stopped {
        let iterations = trials[t]["measurement"]["iterations"].as_array().unwrap();
        assert!(
            iterations.len() < TRIAL_ITERS,
            "stopped before its last iteration: {}",
            trials[t]
        );
    }
    trial_of.sort_unstable();
    trial_of.dedup();
    assert_eq!(trial_of.len(), 3, "one trial per candidate: {choice}");
    let configs: Vec<&Value> = candidates.iter().map(|c| &c["config"]).collect();
    assert!(
        configs[0] != configs[1] && configs[1] != configs[2] && configs[0] != configs[2],
        "three different configurations: {choice}"
    );

    // The launched one is the argmin of the measured times, and it is what ran.
    let argmin = (0..measured.len())
        .min_by(|&a, &b| measured[a].total_cmp(&measured[b]))
        .unwrap();
    assert_eq!(choice["launched"].as_u64(), Some(argmin as u64), "{choice}");
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["config"], candidates[argmin]["config"], "{plan}");
    assert!(
        choice["why"]
            .as_str()
            .unwrap()
            .contains("measured fastest of 3"),
        "{choice}"
    );

    // Progress per candidate, and the choice said out loud.
    for i in 1..=3 {
        assert!(stderr.contains(&format!("candidate {i}/3")), "{stderr}");
    }
    assert!(
        stderr.contains("measured choice among 3 candidates"),
        "{stderr}"
    );
    assert!(stderr.contains("LAUNCHED"), "{stderr}");
    let result: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["outcome"]["exit_code"], 0, "{result}");
    // The launch's result holds trial.json's report, less its schema name.
    let mut written = trial.clone();
    let schema = written.as_object_mut().unwrap().remove("schema");
    assert_eq!(schema, Some(Value::from("pipette-trial/1")));
    assert_eq!(&result["trial"], &written);
    eprintln!(
        "measured {measured:?} ms; launched #{}",
        candidates[argmin]["rank"]
    );
    assert_no_process_left(&marker);
}
