//! `pipette plan` through the real binary: the JSON contract, the human plan for the
//! example clusters (snapshots), reproducibility, and "nothing fits".

use assert_cmd::Command;
use predicates::prelude::*;
use serde_json::Value;

fn pipette() -> Command {
    let mut cmd = Command::cargo_bin("pipette").expect("binary built");
    cmd.env_clear().current_dir(env!("CARGO_MANIFEST_DIR"));
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
fn plan_json_has_the_documented_keys() {
    let v: Value = serde_json::from_str(&stdout(pipette().args([
        "plan",
        "--json",
        "--cluster",
        "examples/clusters/a100-4x8-degraded.json",
        "--model",
        "llama2-13b",
        "--",
        "--global-batch-size",
        "128",
        "--bf16",
    ])))
    .unwrap();
    for key in [
        "tp",
        "pp",
        "dp",
        "micro_batch",
        "vpp",
        "recompute",
        "sequence_parallel",
        "distributed_optimizer",
        "layers_per_stage",
    ] {
        assert!(v["config"].get(key).is_some(), "config.{key} missing");
    }
    let order = v["mapping"]["node_order"].as_array().unwrap();
    assert_eq!(order.len(), 4);
    for host in order {
        let devices = &v["mapping"]["cuda_visible_devices"][host.as_str().unwrap()];
        let mut d: Vec<u64> = devices
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        d.sort();
        assert_eq!(d, (0..8).collect::<Vec<_>>(), "each GPU once on {host}");
    }
    assert!(v["estimate"]["iteration_ms"].as_f64().unwrap() > 0.0);
    assert!(v["estimate"]["peak_memory_bytes"].as_u64().unwrap() > 0);
    let baseline = v["baseline_mapping_ms"].as_f64().unwrap();
    assert!(v["estimate"]["iteration_ms"].as_f64().unwrap() <= baseline + 1e-9);
}

#[test]
fn same_seed_same_plan() {
    let run = |seed: &str| {
        stdout(pipette().args([
            "plan",
            "--json",
            "--seed",
            seed,
            "--cluster",
            "examples/clusters/a100-4x8-degraded.json",
            "--model",
            "gpt3-6.7b",
            "--",
            "--global-batch-size",
            "64",
            "--bf16",
        ]))
    };
    assert_eq!(run("7"), run("7"));
}

#[test]
fn nothing_fits_exits_69_and_says_what_would() {
    pipette()
        .args([
            "plan",
            "--cluster",
            "examples/clusters/v100-8x8.json",
            "--nproc-per-node",
            "1",
            "--hosts",
            "v100-n00",
            "--model",
            "gpt3-175b",
            "--",
            "--global-batch-size",
            "8",
            "--fp16",
        ])
        .assert()
        .code(69)
        .stderr(predicate::str::contains(
            "no configuration fits in GPU memory",
        ))
        .stderr(predicate::str::contains("GPUs"));
}

#[test]
fn plan_needs_a_cluster_profile() {
    pipette()
        .args(["plan", "--model", "gpt3-1.3b"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("pipette profile"));
}

fn snapshot(name: &str, cluster: &str, model: &str, extra: &[&str]) {
    let out = stdout(
        pipette()
            .args(["plan", "--cluster", cluster, "--model", model, "--"])
            .args(extra),
    );
    insta::assert_snapshot!(name, out);
}

#[test]
fn plan_for_the_example_clusters() {
    snapshot(
        "a100_2x8_gpt3_13b",
        "examples/clusters/a100-2x8.json",
        "gpt3-13b",
        &["--global-batch-size", "64", "--bf16"],
    );
    snapshot(
        "a100_4x8_degraded_llama2_13b",
        "examples/clusters/a100-4x8-degraded.json",
        "llama2-13b",
        &["--global-batch-size", "128", "--bf16"],
    );
    snapshot(
        "v100_8x8_gpt3_6_7b_fp16",
        "examples/clusters/v100-8x8.json",
        "gpt3-6.7b",
        &["--global-batch-size", "128", "--fp16"],
    );
    snapshot(
        "h100_16x8_llama2_70b",
        "examples/clusters/h100-16x8.json",
        "llama2-70b",
        &["--global-batch-size", "512", "--bf16"],
    );
    // Mixed GPUs: layers by speed, the stage table and the even-split comparison.
    snapshot(
        "a100_v100_mixed_4x8_gpt3_13b_fp16",
        "examples/clusters/a100-v100-mixed-4x8.json",
        "gpt3-13b",
        &["--global-batch-size", "64", "--fp16"],
    );
}
