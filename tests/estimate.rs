//! `pipette estimate`: one configuration costed through the real binary.

use assert_cmd::Command;
use predicates::prelude::*;
use serde_json::Value;

fn pipette() -> Command {
    let mut cmd = Command::cargo_bin("pipette").expect("binary built");
    cmd.env_clear().current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd
}

fn json(cmd: &mut Command) -> Value {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

const DEGRADED: &str = "examples/clusters/a100-4x8-degraded.json";

#[test]
fn json_has_the_documented_shape() {
    let v = json(pipette().args([
        "estimate",
        "--json",
        "--cluster",
        DEGRADED,
        "--tp",
        "2",
        "--pp",
        "4",
        "--mbs",
        "1",
        "--model",
        "llama2-13b",
        "--",
        "--global-batch-size",
        "128",
        "--bf16",
    ]));
    assert_eq!(v["params"]["total"], 13_015_864_320_u64);
    let per_stage = v["params"]["per_stage"].as_array().unwrap();
    assert_eq!(per_stage.len(), 4);
    let stages = v["memory"]["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 4);
    for s in stages {
        for key in [
            "params",
            "weights_and_optimizer_bytes",
            "activation_bytes",
            "overhead_bytes",
            "total_bytes",
        ] {
            assert!(s[key].is_u64(), "{key} in {s}");
        }
        let sum = s["weights_and_optimizer_bytes"].as_u64().unwrap()
            + s["activation_bytes"].as_u64().unwrap()
            + s["overhead_bytes"].as_u64().unwrap();
        assert_eq!(sum, s["total_bytes"].as_u64().unwrap());
    }
    let peak = stages
        .iter()
        .map(|s| s["total_bytes"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(v["memory"]["peak_bytes"].as_u64().unwrap(), peak);
    assert!(v["time"]["iteration_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(v["config"]["dp"], 4, "dp fills the 32 GPUs by default");
    let models: Vec<&str> = v["time_models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["model"].as_str().unwrap())
        .collect();
    assert_eq!(models, ["pipette", "pipette-compat", "amp"]);
}

#[test]
fn without_a_cluster_dp_is_one_and_time_is_null() {
    let v = json(pipette().args(["estimate", "--json", "--tp", "2", "--model", "gpt3-1.3b"]));
    assert_eq!(v["config"]["dp"], 1);
    assert!(v["time"].is_null());
    assert!(v["memory"]["peak_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn megatron_arguments_give_the_configuration_flags_override_it() {
    let args = [
        "--tensor-model-parallel-size",
        "4",
        "--pipeline-model-parallel-size",
        "2",
        "--micro-batch-size",
        "2",
        "--global-batch-size",
        "64",
        "--recompute-activations",
    ];
    let v = json(
        pipette()
            .args(["estimate", "--json", "--model", "gpt3-6.7b", "--"])
            .args(args),
    );
    assert_eq!(v["config"]["tp"], 4);
    assert_eq!(v["config"]["pp"], 2);
    assert_eq!(v["config"]["micro_batch"], 2);
    assert_eq!(v["config"]["recompute"]["granularity"], "selective");
    let v = json(
        pipette()
            .args([
                "estimate",
                "--json",
                "--model",
                "gpt3-6.7b",
                "--tp",
                "2",
                "--recompute",
                "full",
                "--",
            ])
            .args(args),
    );
    assert_eq!(v["config"]["tp"], 2);
    assert_eq!(v["config"]["recompute"]["granularity"], "full");
}

#[test]
fn recomputation_lowers_memory_and_raises_time() {
    let run = |mode: &str| {
        json(pipette().args([
            "estimate",
            "--json",
            "--cluster",
            DEGRADED,
            "--tp",
            "4",
            "--pp",
            "2",
            "--model",
            "llama2-13b",
            "--recompute",
            mode,
            "--",
            "--global-batch-size",
            "64",
            "--bf16",
        ]))
    };
    let none = run("none");
    let full = run("full");
    let peak = |v: &Value| v["memory"]["peak_bytes"].as_u64().unwrap();
    let ms = |v: &Value| v["time"]["iteration_ms"].as_f64().unwrap();
    assert!(peak(&full) < peak(&none));
    assert!(ms(&full) > ms(&none));
}

#[test]
fn impossible_configurations_are_usage_errors() {
    for (args, message) in [
        (&["--tp", "3"][..], "--tp 3 must divide"),
        (&["--pp", "5"], "--pp 5 does not divide"),
        (&["--pp", "2", "--layers-per-stage", "10,10"], "add up to"),
        (&["--dp", "64"], "needs 64 GPUs"),
        (&["--mbs", "3"], "not divisible by micro-batch 3"),
    ] {
        pipette()
            .args(["estimate", "--cluster", DEGRADED, "--model", "llama2-7b"])
            .args(args)
            .args(["--", "--global-batch-size", "32"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(message));
    }
}

#[test]
fn uneven_stages_are_costed_as_given() {
    let v = json(pipette().args([
        "estimate",
        "--json",
        "--pp",
        "4",
        "--layers-per-stage",
        "7,9,9,7",
        "--model",
        "llama2-7b",
    ]));
    let layers: Vec<u64> = v["memory"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["layers"].as_u64().unwrap())
        .collect();
    assert_eq!(layers, [7, 9, 9, 7]);
}

#[test]
fn a_profile_without_gpus_cannot_be_timed_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pipette-bw.json");
    std::fs::write(
        &path,
        r#"{"gpus": ["a", "b"], "bandwidth": [[0, "19.5"], ["18.2", 0]]}"#,
    )
    .unwrap();
    pipette()
        .args(["estimate", "--model", "gpt3-1.3b", "--cluster"])
        .arg(&path)
        .assert()
        .code(67)
        .stderr(predicate::str::contains("no GPU inventory"));
}

#[test]
fn estimate_as_a_user_reads_it() {
    let out = pipette()
        .args([
            "estimate",
            "--cluster",
            DEGRADED,
            "--tp",
            "2",
            "--pp",
            "4",
            "--model",
            "llama2-13b",
            "--sequence-parallel",
            "--distributed-optimizer",
            "--",
            "--global-batch-size",
            "128",
            "--bf16",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    insta::assert_snapshot!(String::from_utf8(out.stdout).unwrap());
}

#[test]
fn megatron_overlap_options_hide_data_parallel_communication() {
    let run = |extra: &[&str]| {
        json(
            pipette()
                .args([
                    "estimate",
                    "--json",
                    "--cluster",
                    DEGRADED,
                    "--tp",
                    "1",
                    "--pp",
                    "1",
                    "--model",
                    "gpt3-1.3b",
                    "--distributed-optimizer",
                    "--",
                    "--global-batch-size",
                    "64",
                    "--bf16",
                ])
                .args(extra),
        )
    };
    let plain = run(&[]);
    let overlapped = run(&["--overlap-grad-reduce", "--overlap-param-gather"]);
    let exposed = |v: &Value| {
        v["time"]["data_parallel_exposed_ms"].as_f64().unwrap()
            + v["time"]["param_gather_exposed_ms"].as_f64().unwrap()
    };
    assert!(exposed(&plain) > 0.0);
    assert!(exposed(&overlapped) < exposed(&plain));
    assert!(overlapped["time"]["overlap_credited_ms"].as_f64().unwrap() > 0.0);
}
