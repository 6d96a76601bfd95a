//! The `pipette` tool: each input stage on its own, through the real binary, and the
//! dry run as a user reads it (snapshots).

use assert_cmd::Command;
use predicates::prelude::*;

fn pipette() -> Command {
    let mut cmd = Command::cargo_bin("pipette").expect("binary built");
    cmd.env_clear();
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd
}

fn stdout(cmd: &mut Command) -> String {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn presets_lists_every_required_preset() {
    let out = stdout(pipette().arg("presets"));
    for name in [
        "gpt3-1.3b",
        "gpt3-6.7b",
        "gpt3-13b",
        "gpt3-175b",
        "llama2-7b",
        "llama2-13b",
        "llama2-70b",
    ] {
        assert!(out.lines().any(|l| l == name), "{name} missing from {out}");
    }
}

#[test]
fn model_prints_the_exact_parameter_count() {
    pipette()
        .args(["model", "--model", "llama2-70b"])
        .assert()
        .success()
        .stdout("llama2-70b: 68,976,648,192 parameters (68.98 B)\n");
}

#[test]
fn model_reads_megatron_arguments_after_the_separator() {
    let out = stdout(pipette().args([
        "model",
        "--json",
        "--",
        "--num-layers",
        "2",
        "--hidden-size",
        "128",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "64",
        "--vocab-size",
        "1000",
        "--global-batch-size",
        "8",
        "--swiglu",
    ]));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    // Megatron's SwiGLU default: int((4h · 2/3) / 64) · 64.
    assert_eq!(report["model"]["ffn_hidden_size"], 320);
    assert_eq!(report["model"]["padded_vocab_size"], 1024);
}

#[test]
fn cluster_validates_the_shipped_examples_and_the_measured_mpigraph_file() {
    pipette()
        .args(["cluster", "examples/clusters/v100-8x8.json"])
        .assert()
        .success()
        .stdout(predicate::str::contains("valid, 8 nodes, 64 GPUs"));
    let mpigraph = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/mpigraph/mpigraph-16node-a100.json"
    );
    assert!(
        std::path::Path::new(mpigraph).exists(),
        "{mpigraph} is missing: the measured data is part of the repository (data/mpigraph/README.md)"
    );
    pipette()
        .args(["cluster", mpigraph])
        .assert()
        .success()
        .stdout(predicate::str::contains("16 nodes"))
        .stdout(predicate::str::contains("GPU models unknown"));
}

#[test]
fn cluster_json_round_trips_through_the_schema() {
    let out = stdout(pipette().args(["cluster", "--json", "examples/clusters/a100-2x8.json"]));
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.json");
    std::fs::write(&copy, &out).unwrap();
    let again = stdout(pipette().arg("cluster").arg("--json").arg(&copy));
    assert_eq!(out, again);
}

#[test]
fn discover_shows_the_node_list() {
    pipette()
        .args(["discover", "--hosts", "gpu[08-10]"])
        .assert()
        .success()
        .stdout("gpu08\ngpu09\ngpu10\n");
    pipette()
        .env("SLURM_JOB_NODELIST", "a[1-2]")
        .env("SLURM_GPUS_ON_NODE", "4")
        .args(["discover"])
        .assert()
        .success()
        .stdout("a1 slots=4\na2 slots=4\n");
}

/// What `pipette-run --run-dir DIR ARGS` prints, with DIR and the crate's path masked.
fn dry_run(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::cargo_bin("pipette-run").unwrap();
    cmd.env_clear().current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd.arg("--run-dir").arg(dir.path().join("run"));
    cmd.args(args);
    stdout(&mut cmd)
        .replace(&dir.path().display().to_string(), "[RUN]")
        .replace(env!("CARGO_MANIFEST_DIR"), "[CRATE]")
}

#[test]
fn dry_run_as_a_user_reads_it() {
    let shown = dry_run(&[
        "--rdzv-id",
        "job-42",
        "--dry-run",
        "--cluster",
        "examples/clusters/a100-4x8-degraded.json",
        "--model",
        "llama2-7b",
        "--pin",
        "sp",
        "--max-restarts",
        "2",
        "pretrain_gpt.py",
        "--bf16",
        "--global-batch-size",
        "256",
        "--micro-batch-size",
        "1",
        "--use-distributed-optimizer",
        "--sequence-parallel",
        "--save",
        "/ckpt",
        "--save-interval",
        "500",
    ]);
    insta::assert_snapshot!(shown);
}

#[test]
fn dry_run_on_mixed_gpus_as_a_user_reads_it() {
    // A100 and V100 nodes: the stages, the even-split comparison and the uneven layout in
    // the Megatron arguments.
    let shown = dry_run(&[
        "--rdzv-id",
        "job-43",
        "--dry-run",
        "--cluster",
        "examples/clusters/a100-v100-mixed-4x8.json",
        "--model",
        "gpt3-13b",
        "pretrain_gpt.py",
        "--fp16",
        "--global-batch-size",
        "64",
    ]);
    assert!(
        shown.contains("--pipeline-model-parallel-layout"),
        "{shown}"
    );
    insta::assert_snapshot!(shown);
}

#[test]
fn dry_run_on_128_nodes_fits_a_screenful_of_lines() {
    // 1,024 GPUs: the hosts as hostlist runs, the mapping's first rows, node 0's command
    // wrapped and the others' in the run directory's scripts; tables within 80 columns.
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut cmd = Command::cargo_bin("pipette-run").unwrap();
    cmd.env_clear().current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd.arg("--run-dir").arg(&run).args([
        "--dry-run",
        "--cluster",
        "examples/clusters/h100-128x8.json",
        "--model",
        "llama2-70b",
        "pretrain_gpt.py",
        "--bf16",
        "--global-batch-size",
        "1024",
    ]);
    let shown = stdout(&mut cmd);
    let lines: Vec<&str> = shown.lines().collect();
    // 120 until the plan report gained its throughput line (tokens/s, MFU, GPU-hours) and
    // its critical-path paragraph (issue 34); the bound is that the output does not grow
    // with the nodes, not a screen's height.
    assert!(lines.len() <= 130, "{} lines:\n{shown}", lines.len());
    let mut in_command = false;
    for line in &lines {
        let columns = line.chars().count();
        assert!(columns <= 100, "a line of {columns} columns:\n{line}");
        // Outside the wrapped commands (whose words stay whole) everything fits 80.
        if !in_command {
            assert!(columns <= 80, "a line of {columns} columns:\n{line}");
        }
        in_command = line.ends_with(" \\");
    }
    assert!(shown.contains("h100-n[000-127] (128)"), "{shown}");
    assert!(shown.contains("'--node-rank=0'"), "{shown}");
    assert!(
        !shown.contains("'--node-rank=1'"),
        "only node 0's command:\n{shown}"
    );
    let scripts = std::fs::read_dir(&run)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("launch-")
        })
        .count();
    assert_eq!(scripts, 128, "every node's command is in the run directory");
    for picture in ["rank-map", "timeline", "links", "memory"] {
        assert!(
            run.join(format!("{picture}.svg")).is_file(),
            "{picture}.svg"
        );
    }
}

#[test]
fn plan_shows_each_picture_as_text_within_80_columns() {
    for picture in ["rank-map", "timeline", "links", "memory"] {
        let shown = stdout(pipette().args([
            "plan",
            "--cluster",
            "examples/clusters/a100-4x8-degraded.json",
            "--model",
            "gpt3-1.3b",
            "--pin",
            "pp",
            "--show",
            picture,
            "--",
            "--pipeline-model-parallel-size",
            "2",
            "--global-batch-size",
            "64",
            "--bf16",
        ]));
        assert!(shown.lines().count() >= 4, "{picture}:\n{shown}");
        assert!(
            shown.lines().all(|l| l.chars().count() <= 80),
            "{picture}:\n{shown}"
        );
        assert!(!shown.contains("Top configurations"), "{picture}:\n{shown}");
    }
}
