//! The launch scripts realise the chosen rank mapping exactly.
//!
//! For several placements (global rank → host, physical GPU), including permuted node
//! orders, permuted GPU orders and GPU subsets, the test derives what render takes (node
//! order and each host's CUDA_VISIBLE_DEVICES), renders, writes the run directory, and runs
//! every launch script under bash with torchrun replaced by a program that records its argv
//! and environment. From what the scripts actually hand torchrun — `--nnodes`,
//! `--nproc-per-node`, `--node-rank`, `CUDA_VISIBLE_DEVICES`, `PIPETTE_HOST` — it computes
//! the mapping as torchrun and CUDA realise it (rank r = node_rank · G + local rank, local
//! rank i on the i-th visible GPU) and compares it with the placement.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use pipette::config::settings_from_megatron_args;
use pipette::exec::shell_quote;
use pipette::model::parallel::ParallelConfig;
use pipette::render::{
    render, write_run_dir, RenderInput, ScriptInvocation, Templates, TorchrunSpelling,
};

const ARGS: &str = "--num-layers 8 --hidden-size 64 --num-attention-heads 8 --seq-length 32 \
                    --max-position-embeddings 32 --vocab-size 100 --global-batch-size 96";

/// A torchrun stand-in that writes its argv and the variables that matter, NUL-separated.
fn fake_torchrun(dir: &Path) -> String {
    let path = dir.join("fake-torchrun");
    let argv = shell_quote(&dir.join("argv").display().to_string());
    let env = shell_quote(&dir.join("env").display().to_string());
    common::write_executable(&path, &format!(
            "#!/usr/bin/env bash\nprintf '%s\\0' \"$@\" > {argv}\n\
             printf '%s\\0' \"$CUDA_VISIBLE_DEVICES\" \"$CUDA_DEVICE_ORDER\" \"$PIPETTE_HOST\" > {env}\n"
        ));
    path.display().to_string()
}

fn nul_separated(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let mut fields: Vec<String> = text.split('\0').map(str::to_string).collect();
    assert_eq!(fields.pop().as_deref(), Some(""), "NUL-terminated");
    fields
}

/// The value of `--name=VALUE` in `argv`, in either spelling.
fn option(argv: &[String], name: &str) -> u64 {
    let dashed = format!("--{name}=");
    let underscored = format!("--{}=", name.replace('-', "_"));
    argv.iter()
        .find_map(|a| {
            a.strip_prefix(&dashed)
                .or_else(|| a.strip_prefix(&underscored))
        })
        .unwrap_or_else(|| panic!("no --{name} in {argv:?}"))
        .parse()
        .unwrap()
}

/// Renders the placement, runs every script, and returns rank → (host, GPU) as the scripts
/// realise it.
fn realised_mapping(
    placement: &[(String, u32)],
    gpus_per_node: usize,
    spelling: TorchrunSpelling,
) -> Vec<(String, u32)> {
    let world = placement.len();
    // What render takes: node rank → host, host → GPUs in local-rank order.
    let node_order: Vec<String> = placement
        .chunks(gpus_per_node)
        .map(|c| c[0].0.clone())
        .collect();
    let cvd: BTreeMap<String, Vec<u32>> = placement
        .chunks(gpus_per_node)
        .map(|c| (c[0].0.clone(), c.iter().map(|(_, g)| *g).collect()))
        .collect();
    let settings = settings_from_megatron_args(&common::words(ARGS), None, &[]).unwrap();
    let config = ParallelConfig::even(8, 1, 1, world as u64, 1);

    let dir = tempfile::tempdir().unwrap();
    let mut input = RenderInput::new(
        &settings,
        ScriptInvocation::python("train.py", common::words(ARGS)),
        &config,
        &node_order,
        &cvd,
    );
    input.torchrun = fake_torchrun(dir.path());
    input.torchrun_spelling = spelling;
    input.workdir = dir.path().display().to_string();
    let run_dir = dir.path().join("run");
    input.run_dir = run_dir.display().to_string();
    let spec = render(&input, &Templates::embedded()).unwrap();
    write_run_dir(&spec, &run_dir).unwrap();

    let mut realised: BTreeMap<u64, (String, u32)> = BTreeMap::new();
    let mut scripts: Vec<_> = std::fs::read_dir(&run_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sh"))
        .collect();
    scripts.sort();
    assert_eq!(scripts.len(), node_order.len());
    for script in scripts {
        let status = Command::new("bash").arg(&script).status().unwrap();
        assert!(status.success(), "{}", script.display());
        let argv = nul_separated(&dir.path().join("argv"));
        let env = nul_separated(&dir.path().join("env"));
        let (visible, order, host) = (&env[0], &env[1], &env[2]);
        assert_eq!(order, "PCI_BUS_ID");
        assert_eq!(option(&argv, "nnodes"), node_order.len() as u64);
        let nproc = option(&argv, "nproc-per-node");
        let node_rank = option(&argv, "node-rank");
        let gpus: Vec<u32> = visible.split(',').map(|g| g.parse().unwrap()).collect();
        assert_eq!(gpus.len() as u64, nproc);
        for local_rank in 0..nproc {
            let rank = node_rank * nproc + local_rank;
            let previous = realised.insert(rank, (host.clone(), gpus[local_rank as usize]));
            assert!(previous.is_none(), "rank {rank} started twice");
        }
    }
    assert_eq!(realised.len(), world, "every rank started once");
    realised.into_values().collect()
}

/// A small deterministic permutation (a seeded linear congruential shuffle).
fn shuffled<T>(mut items: Vec<T>, seed: u64) -> Vec<T> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    for i in (1..items.len()).rev() {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        items.swap(i, (state >> 33) as usize % (i + 1));
    }
    items
}

/// Ranks in node blocks: `hosts[n]` holds ranks n·G.. on `gpus[n]` in order.
fn placement(hosts: &[&str], gpus: &[Vec<u32>]) -> Vec<(String, u32)> {
    hosts
        .iter()
        .zip(gpus)
        .flat_map(|(h, g)| g.iter().map(move |gpu| (h.to_string(), *gpu)))
        .collect()
}

#[test]
fn identity_mapping() {
    let p = placement(
        &["a100-n00", "a100-n01"],
        &[(0..8).collect(), (0..8).collect()],
    );
    assert_eq!(realised_mapping(&p, 8, TorchrunSpelling::Dashes), p);
}

#[test]
fn reversed_nodes_and_permuted_gpus() {
    let p = placement(
        &["a100-n01", "a100-n00"],
        &[vec![7, 6, 5, 4, 3, 2, 1, 0], vec![0, 2, 4, 6, 1, 3, 5, 7]],
    );
    assert_eq!(realised_mapping(&p, 8, TorchrunSpelling::Dashes), p);
}

#[test]
fn shuffled_nodes_and_gpus_in_both_torchrun_spellings() {
    for seed in 0..3 {
        let hosts = shuffled(vec!["n00", "n01", "n02", "n03"], seed);
        let gpus: Vec<Vec<u32>> = (0..4)
            .map(|n| shuffled((0..8).collect(), seed * 10 + n))
            .collect();
        let p = placement(&hosts, &gpus);
        assert_eq!(realised_mapping(&p, 8, TorchrunSpelling::Dashes), p);
        assert_eq!(realised_mapping(&p, 8, TorchrunSpelling::Underscores), p);
    }
}

#[test]
fn gpu_subsets_of_an_allocation() {
    // Slurm gave each node some of its GPUs (SLURM_JOB_GPUS=0,1,4,5 and the like).
    let p = placement(
        &["gpu-b2", "gpu-a1", "gpu-c3"],
        &[vec![5, 4, 1, 0], vec![0, 1, 4, 5], vec![6, 2, 7, 3]],
    );
    assert_eq!(realised_mapping(&p, 4, TorchrunSpelling::Dashes), p);
}

#[test]
fn one_node() {
    let p = placement(&["localhost"], &[vec![1, 0]]);
    assert_eq!(realised_mapping(&p, 2, TorchrunSpelling::Dashes), p);
}
