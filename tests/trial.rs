//! The trial run end to end on CPUs with PyTorch's real torchrun: two "nodes" (`node-a`,
//! `node-b`, one CPU process each, run here through the local transport) run
//! `examples/train_gpt.py` for a few iterations under the plan; the sitecustomize hook
//! reports every rank's peak RSS, Megatron's iteration lines give the time.
//!
//! - `pipette calibrate` records each rank's peak memory and the iteration time, and the
//!   calibration fitted on two micro-batch sizes predicts the peak of a third trial, run
//!   independently, within 10 % (the default calibration is far off: it assumes 1.5 GiB
//!   of CUDA context and NCCL buffers that a CPU process does not have);
//! - a script that fails in the trial gives exit code 72, names the rank, launches
//!   nothing and leaves no process; a script that raises shows its exception and
//!   traceback in the error, its logs are kept per node in the run directory, and a
//!   "CUDA out of memory" printed in passing does not make another error an OOM; a
//!   script that hangs hits `--trial-timeout`.
//!
//! Needs the venv of `scripts/setup-megatron-venv` (PyTorch with torchrun);
//! `PIPETTE_MEGATRON_PYTHON` picks another python. Fails, never skips, without it.

mod common;

use std::path::Path;
use std::process::Command;

use common::{assert_no_process_left, repo, two_local_cpu_nodes};
use serde_json::Value;

/// A model whose activations are a sizeable share of a rank's RSS: at micro-batch 8 about
/// 0.8 of 1.6 GB (sequence 1024; the toy's attention keeps the 4 heads' 1024² scores).
const SIZED_MODEL: &[&str] = &[
    "--num-layers",
    "4",
    "--hidden-size",
    "256",
    "--num-attention-heads",
    "4",
    "--seq-length",
    "1024",
    "--vocab-size",
    "256",
    "--global-batch-size",
    "16",
];

const TINY_MODEL: &[&str] = &[
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--seq-length",
    "32",
    "--vocab-size",
    "256",
    "--global-batch-size",
    "4",
];

fn calibrate(dir: &Path, name: &str, micro_batches: &str) -> Value {
    let out = dir.join(name);
    let output = two_local_cpu_nodes(env!("CARGO_BIN_EXE_pipette"), Some("calibrate"), dir)
        .arg("--out")
        .arg(&out)
        .args(["--trial-iters", "3", "--trial-micro-batches", micro_batches])
        .arg("examples/train_gpt.py")
        .args(SIZED_MODEL)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "pipette calibrate failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

#[test]
fn calibrated_memory_estimate_predicts_an_independent_trial_within_10_percent() {
    let dir = tempfile::tempdir().unwrap();
    // Fitted on micro-batches 2 and 8 ...
    let fitted = calibrate(dir.path(), "fit.json", "2,8");
    assert_eq!(fitted["schema"], "pipette-trial/1");
    let trials = fitted["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2);
    for t in trials {
        let m = &t["measurement"];
        let ranks = m["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 2, "every rank reports: {m}");
        for r in ranks {
            let rss = r["peak_rss_bytes"].as_u64().unwrap();
            assert!(rss > 200 << 20, "a torch process has a few hundred MB: {r}");
            assert!(r["cuda"].is_null());
        }
        let ms = m["iteration_ms"].as_f64().unwrap();
        assert!(ms > 0.0, "{m}");
        assert_eq!(m["iterations"].as_array().unwrap().len(), 3);
        eprintln!(
            "micro-batch {}: peak RSS {:?} MiB, {ms:.1} ms per iteration",
            m["config"]["micro_batch"],
            ranks
                .iter()
                .map(|r| r["peak_rss_bytes"].as_u64().unwrap() >> 20)
                .collect::<Vec<_>>()
        );
    }
    assert_eq!(fitted["memory_fit"]["method"], "least-squares");
    let calibration = dir.path().join("fit.json");

    // ... checked against micro-batch 4, measured by a trial of its own.
    let check = calibrate(dir.path(), "check.json", "4");
    let peak = &check["trials"][0]["peak"];
    let measured = peak["measured"].as_f64().unwrap();
    let default_error = peak["error_before_pct"].as_f64().unwrap();

    let estimate = Command::new(env!("CARGO_BIN_EXE_pipette"))
        .current_dir(repo())
        .env_remove("PIPETTE_CLUSTER")
        .args([
            "estimate", "--tp", "1", "--pp", "1", "--dp", "2", "--mbs", "4",
        ])
        .arg("--calibration")
        .arg(&calibration)
        .arg("--json")
        .arg("--")
        .args(SIZED_MODEL)
        .output()
        .unwrap();
    assert!(estimate.status.success(), "{estimate:?}");
    let estimate: Value = serde_json::from_slice(&estimate.stdout).unwrap();
    let calibrated = estimate["memory"]["peak_bytes"].as_f64().unwrap();
    let calibrated_error = (calibrated - measured) / measured * 100.0;
    eprintln!(
        "micro-batch 4: measured {:.0} MiB; default estimate {default_error:+.1} %, calibrated (fitted on 2 and 8) {calibrated_error:+.1} %",
        measured / (1u64 << 20) as f64
    );
    assert!(
        calibrated_error.abs() <= 10.0,
        "calibrated estimate {calibrated_error:+.1} % off"
    );
    assert!(
        default_error.abs() > 20.0,
        "the default calibration was expected to be far off on a CPU: {default_error:+.1} %"
    );
}

#[test]
fn a_script_failing_in_the_trial_is_reported_and_nothing_is_launched() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker").display().to_string();
    let run_dir = dir.path().join("run");
    let output = two_local_cpu_nodes(env!("CARGO_BIN_EXE_pipette-run"), None, dir.path())
        .arg("--run-dir")
        .arg(&run_dir)
        .arg("examples/train_gpt.py")
        .args(TINY_MODEL)
        .args(["--train-iters", "50", "--toy-fail-at-iteration", "1"])
        .args(["--data-path", &marker])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(72), "{stderr}");
    assert!(stderr.contains("failed in the trial run"), "{stderr}");
    assert!(stderr.contains("rank 0"), "{stderr}");
    assert!(stderr.contains("exit code 3"), "{stderr}");
    assert!(
        stderr.contains("failing at iteration 1 as asked"),
        "{stderr}"
    );
    assert!(
        stderr.contains("'--train-iters' '5'"),
        "the trial command: {stderr}"
    );
    assert!(!run_dir.join("events.jsonl").exists(), "nothing launched");
    assert_no_process_left(&marker);
}

/// A script that prints `said` on every rank and then, on rank 1 only, raises `error`
/// (Python source); rank 0 ends well.
fn failing_script(dir: &Path, said: &str, error: &str) -> String {
    let path = dir.join("fails.py");
    std::fs::write(
        &path,
        format!(
            "import os\nprint({said:?}, flush=True)\nif os.environ.get('RANK') == '1':\n    raise {error}\n"
        ),
    )
    .unwrap();
    path.display().to_string()
}

/// Runs pipette-run on `script` (two nodes, the tiny model's arguments); returns its exit
/// code and standard error.
fn run_failing(dir: &Path, script: &str, run_dir: &Path) -> (Option<i32>, String) {
    let output = two_local_cpu_nodes(env!("CARGO_BIN_EXE_pipette-run"), None, dir)
        .arg("--run-dir")
        .arg(run_dir)
        .arg(script)
        .args(TINY_MODEL)
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_script_raising_in_the_trial_shows_its_error_and_keeps_the_logs() {
    let dir = tempfile::tempdir().unwrap();
    let script = failing_script(
        dir.path(),
        "loading the data set",
        "ValueError('warm-up of 10 iterations is longer than the run')",
    );
    let run_dir = dir.path().join("run");
    let (code, stderr) = run_failing(dir.path(), &script, &run_dir);
    assert_eq!(code, Some(72), "{stderr}");
    // The failing rank, its exception and where its traceback was raised.
    assert!(stderr.contains("(rank 1)"), "{stderr}");
    assert!(
        stderr.contains("ValueError: warm-up of 10 iterations is longer than the run"),
        "{stderr}"
    );
    assert!(stderr.contains("fails.py\", line 4"), "{stderr}");
    assert!(!stderr.contains("out of memory"), "{stderr}");
    // Every node's output, kept in the run directory, named in the error.
    let logs = run_dir.join("trial-logs/1");
    assert!(
        stderr.contains(&logs.display().to_string()),
        "the error names {}:\n{stderr}",
        logs.display()
    );
    let read = |name: &str| std::fs::read_to_string(logs.join(name)).unwrap_or_default();
    let (a, b) = (read("node-0-node-a.log"), read("node-1-node-b.log"));
    assert!(a.contains("loading the data set"), "node-a's log:\n{a}");
    assert!(b.contains("loading the data set"), "node-b's log:\n{b}");
    assert!(
        b.contains("ValueError: warm-up of 10 iterations"),
        "node-b's log:\n{b}"
    );
    assert!(!run_dir.join("events.jsonl").exists(), "nothing launched");
}

#[test]
fn out_of_memory_said_in_passing_is_not_taken_for_the_failure() {
    let dir = tempfile::tempdir().unwrap();
    let script = failing_script(
        dir.path(),
        "note: last week's run hit CUDA out of memory at micro-batch 64; retrying smaller",
        "KeyError('tokenizer_type')",
    );
    let run_dir = dir.path().join("run");
    let (code, stderr) = run_failing(dir.path(), &script, &run_dir);
    // The script's own error ends the run: not an OOM, so no re-plan and no "nothing fits".
    assert_eq!(code, Some(72), "{stderr}");
    assert!(stderr.contains("KeyError: 'tokenizer_type'"), "{stderr}");
    assert!(!stderr.contains("ran out of memory"), "{stderr}");
    assert!(!stderr.contains(", out of memory"), "{stderr}");
    assert!(!stderr.contains("re-planning"), "{stderr}");
}

#[test]
fn a_hanging_script_hits_the_trial_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker").display().to_string();
    // Each iteration hangs this long: a run that waited for the script instead of its
    // trial timeout would take at least this.
    let hang_seconds = 600;
    let started = std::time::Instant::now();
    let output = two_local_cpu_nodes(env!("CARGO_BIN_EXE_pipette-run"), None, dir.path())
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .args(["--trial-timeout", "8s", "--grace", "2s"])
        .arg("examples/train_gpt.py")
        .args(TINY_MODEL)
        .args(["--toy-iteration-seconds", &hang_seconds.to_string()])
        .args(["--data-path", &marker])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(72), "{stderr}");
    assert!(stderr.contains("did not finish within 8 s"), "{stderr}");
    let took = started.elapsed().as_secs();
    assert!(
        took < hang_seconds / 2,
        "the trial took {took} s: it waited for the script, not for its timeout"
    );
    assert_no_process_left(&marker);
}

#[test]
fn a_launch_trials_then_trains_and_reports_one_json_result() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker").display().to_string();
    let run_dir = dir.path().join("run");
    let output = two_local_cpu_nodes(env!("CARGO_BIN_EXE_pipette-run"), None, dir.path())
        .arg("--json")
        .arg("--run-dir")
        .arg(&run_dir)
        // The trial of the plan's pick alone: the measured choice among the best plans is
        // tests/trial_top_k.rs's to test.
        .args(["--trial-iters", "2", "--trial-top-k", "1"])
        .arg("examples/train_gpt.py")
        .args(TINY_MODEL)
        .args(["--train-iters", "4", "--data-path", &marker])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    // stdout is the one result object; the nodes' lines went to stderr.
    let result: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}):\n{stdout}"));
    assert_eq!(result["outcome"]["exit_code"], 0, "{result}");
    assert_eq!(result["outcome"]["replans"], 0, "{result}");
    assert!(stderr.contains("iteration        4/       4"), "{stderr}");
    // The trial ran first (2 iterations), and its report is in the result and the run dir.
    let trial = &result["trial"];
    assert_eq!(
        trial["trials"][0]["measurement"]["iterations"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "{trial}"
    );
    assert!(trial["calibration"]["overhead_bytes"].as_u64().is_some());
    // trial.json is the same report under its schema name (documented in the README).
    let mut written: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("trial.json")).unwrap())
            .unwrap();
    let schema = written.as_object_mut().unwrap().remove("schema");
    assert_eq!(schema, Some(Value::from("pipette-trial/1")));
    assert_eq!(&written, trial);
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["schema"], "pipette-plan/1", "{plan}");
    assert!(plan["config"]["tp"].as_u64().is_some(), "{plan}");
    assert_eq!(
        result["run_dir"].as_str(),
        Some(run_dir.display().to_string().as_str())
    );
    assert_no_process_left(&marker);
}
