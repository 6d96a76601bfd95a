//! The rendered files for the example clusters, as a user finds them in the run directory.
//!
//! Hosts come from `examples/clusters/*.json`; plans and mappings are written by hand
//! (permuted node and GPU orders, so the snapshots show the mapping being realised).

use std::collections::BTreeMap;

use pipette::config::{settings_from_megatron_args, Recompute};
use pipette::model::parallel::ParallelConfig;
use pipette::render::{
    forwarded_env, render, LaunchSpec, RenderInput, ScriptInvocation, Templates, TorchrunSpelling,
};

fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

fn hosts(cluster: &str) -> Vec<String> {
    let path = format!(
        "{}/examples/clusters/{cluster}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["host"].as_str().unwrap().to_string())
        .collect()
}

/// Every file of the run directory, one after the other.
fn files(spec: &LaunchSpec) -> String {
    let mut out = String::new();
    for file in &spec.files {
        let mode = if file.executable { " (executable)" } else { "" };
        out.push_str(&format!("==> {}{mode} <==\n{}\n", file.path, file.contents));
    }
    out
}

#[test]
fn llama2_7b_on_a100_2x8() {
    let h = hosts("a100-2x8");
    let user = words(
        "--bf16 --global-batch-size 256 --micro-batch-size 1 --use-distributed-optimizer \
         --save /ckpt --save-interval 500 --data-path /data/my-corpus_text_document",
    );
    let settings = settings_from_megatron_args(&user, Some("llama2-7b"), &[]).unwrap();
    let mut config = ParallelConfig::even(32, 4, 2, 2, 2);
    config.sequence_parallel = true;
    config.distributed_optimizer = true;
    // The second node takes node rank 0; GPUs paired across the NVSwitch halves.
    let node_order = vec![h[1].clone(), h[0].clone()];
    let cvd = BTreeMap::from([
        (h[0].clone(), vec![0, 1, 2, 3, 4, 5, 6, 7]),
        (h[1].clone(), vec![4, 5, 6, 7, 0, 1, 2, 3]),
    ]);
    let mut input = RenderInput::new(
        &settings,
        ScriptInvocation::python("pretrain_gpt.py", user),
        &config,
        &node_order,
        &cvd,
    );
    input.master_port = 29511;
    input.rdzv_id = "4242".into();
    input.workdir = "/home/user/Megatron-LM".into();
    input.run_dir = "/home/user/Megatron-LM/pipette-runs/1700000000-4242".into();
    input.torchrun_passthrough = words("--max-restarts=1 --tee=3 --nnodes=2");
    input.env = forwarded_env([
        ("NCCL_IB_HCA", "mlx5_0,mlx5_1"),
        ("NCCL_DEBUG", "WARN"),
        ("HOME", "/home/user"),
    ]);
    let spec = render(&input, &Templates::embedded()).unwrap();
    insta::assert_snapshot!(files(&spec));
}

#[test]
fn gpt3_13b_uneven_interleaved_on_a100_4x8_degraded_with_an_old_torchrun() {
    let h = hosts("a100-4x8-degraded");
    let user = words("--fp16 --global-batch-size 512 --train-iters 2000 --lr 1e-4");
    let settings = settings_from_megatron_args(&user, Some("gpt3-13b"), &[]).unwrap();
    let mut config = ParallelConfig::even(40, 4, 4, 2, 1);
    config.vpp = Some(2);
    config.layers_per_stage = vec![9, 10, 11, 10];
    config.recompute = Recompute::Selective;
    let node_order = vec![h[2].clone(), h[0].clone(), h[3].clone(), h[1].clone()];
    let cvd: BTreeMap<String, Vec<u32>> = node_order
        .iter()
        .enumerate()
        .map(|(i, host)| {
            (
                host.clone(),
                (0..8).map(|g| (g + 2 * i as u32) % 8).collect(),
            )
        })
        .collect();
    let mut input = RenderInput::new(
        &settings,
        ScriptInvocation::python("pretrain_gpt.py", user),
        &config,
        &node_order,
        &cvd,
    );
    input.torchrun_spelling = TorchrunSpelling::Underscores;
    input.torchrun = "/opt/conda/bin/torchrun".into();
    input.rdzv_id = "slurm-981".into();
    input.workdir = "/scratch/run".into();
    input.run_dir = "/scratch/run/pipette-runs/1700000000-slurm-981".into();
    input.plan_json =
        serde_json::json!({"config": config, "note": "hand-written for the snapshot"});
    let spec = render(&input, &Templates::embedded()).unwrap();
    insta::assert_snapshot!(files(&spec));
}

#[test]
fn megatron_deepspeed_gpt3_1_3b_on_v100_8x8() {
    let h = hosts("v100-8x8");
    let user = words(
        "--fp16 --global-batch-size 512 --deepspeed --deepspeed_config ds_config.json \
         --zero-stage 1 --deepspeed-activation-checkpointing",
    );
    let settings = settings_from_megatron_args(&user, Some("gpt3-1.3b"), &[]).unwrap();
    let config = ParallelConfig::even(24, 2, 2, 8, 2);
    let node_order: Vec<String> = h[4..8].to_vec();
    let cvd: BTreeMap<String, Vec<u32>> = node_order
        .iter()
        .map(|host| (host.clone(), (0..8).collect()))
        .collect();
    let mut input = RenderInput::new(
        &settings,
        ScriptInvocation::python("pretrain_gpt.py", user),
        &config,
        &node_order,
        &cvd,
    );
    input.rdzv_id = "none".into();
    input.workdir = "/work/Megatron-DeepSpeed".into();
    input.run_dir = "/work/Megatron-DeepSpeed/pipette-runs/1700000000-none".into();
    let spec = render(&input, &Templates::embedded()).unwrap();
    assert!(spec.deepspeed);
    insta::assert_snapshot!(files(&spec));
}
