//! Profiling end to end on CPUs with PyTorch's real torchrun: three "nodes" (`node-a`,
//! `node-b`, `node-c`, all run here through the local transport, master 127.0.0.1) of two
//! CPU processes each profile each other with gloo. The profile must be complete (3×3 node
//! matrix, 2×2 GPU matrices, compute figures, the first node pair's rails busy at once),
//! measured and dated, valid, readable back, cached (a second run in another host order
//! reuses it), and accepted by the planner.
//!
//! Needs the venv of `scripts/setup-megatron-venv` (PyTorch with torchrun);
//! `PIPETTE_MEGATRON_PYTHON` picks another python. Fails, never skips, without it.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use pipette::cluster::profile::{Dtype, Source};
use pipette::cluster::ClusterProfile;
use pipette::config::settings_from_megatron_args;
use pipette::exec::Transport;
use pipette::measure::progress::RecordedProgress;
use pipette::measure::{
    run_profile, utc_date, NoProgress, ProbeSettings, ProfileCache, ProfileOptions,
};
use pipette::plan::{plan, PlanOptions};

/// The venv's python: `PIPETTE_MEGATRON_PYTHON`, else what `scripts/setup-megatron-venv`
/// prints (it creates the venv on first use).
fn venv_python() -> PathBuf {
    if let Some(python) = std::env::var_os("PIPETTE_MEGATRON_PYTHON") {
        return PathBuf::from(python);
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/setup-megatron-venv");
    let out = Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed (it makes the Python 3.12 venv with PyTorch whose torchrun this test \
         runs; or set PIPETTE_MEGATRON_PYTHON):\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn torchrun() -> String {
    let python = venv_python();
    let torchrun = python.with_file_name("torchrun");
    assert!(
        torchrun.is_file(),
        "{} not found next to {}: run scripts/setup-megatron-venv, or set \
         PIPETTE_MEGATRON_PYTHON to a python whose venv has PyTorch",
        torchrun.display(),
        python.display()
    );
    torchrun.to_string_lossy().into_owned()
}

fn options(torchrun: &str, cache_dir: PathBuf) -> ProfileOptions {
    ProfileOptions {
        transport: Transport::Local,
        nproc_per_node: Some(2),
        torchrun: torchrun.to_owned(),
        probe_timeout: Duration::from_secs(120),
        grace: Duration::from_secs(2),
        // Small messages and matrices: six processes share this machine's cores.
        probe: Some(ProbeSettings {
            sizes: vec![64 << 10, 1 << 20],
            warmup: 1,
            repeats: 3,
            bytes_per_repeat: 4 << 20,
            max_iters: 16,
            compute_n: 256,
            compute_repeats: 3,
        }),
        cache: Some(ProfileCache {
            dir: cache_dir,
            ttl: Duration::from_secs(3600),
        }),
        ..ProfileOptions::default()
    }
}

#[test]
fn three_local_nodes_profile_each_other_with_gloo() {
    let torchrun = torchrun();
    let cache = tempfile::tempdir().unwrap();
    let options = options(&torchrun, cache.path().to_path_buf());
    let hosts = ["node-a", "node-b", "node-c"];
    let progress = RecordedProgress::default();

    let start = Instant::now();
    let run = run_profile(&common::host_spec(&hosts), &options, &progress)
        .unwrap_or_else(|e| panic!("{e}"));
    let took = start.elapsed();
    let profile = &run.profile;
    profile.validate("cpu profile").unwrap();
    let report = run.report.as_ref().expect("measured, not cached");
    eprintln!(
        "probe took {took:?} ({:.1} s inside torchrun)",
        report.elapsed_s
    );
    eprintln!("{}", profile.to_json_pretty());

    // Nodes in the given order, 3×3 node matrix, all measured today by the probe.
    let today = utc_date(std::time::SystemTime::now());
    assert_eq!(
        profile
            .nodes
            .iter()
            .map(|n| n.host.as_str())
            .collect::<Vec<_>>(),
        hosts
    );
    let links = &profile.node_links;
    assert_eq!(links.size(), 3);
    assert!(links.links().all(|(_, _, v)| v > 0.0));
    assert_eq!(links.provenance.source, Source::Measured);
    assert_eq!(links.provenance.date.as_deref(), Some(today.as_str()));
    assert!(links
        .provenance
        .tool
        .as_deref()
        .unwrap()
        .starts_with("pipette-run probe v"));

    // The rails of the first node pair, both ranks of node-a streaming to node-b's at once
    // (no RDMA ports here: as many rails as ranks), beside that pair's one-rail figure.
    let rails = links.all_rails().expect("the rails phase ran");
    assert_eq!(rails.rails, 2);
    assert!(rails.gb_per_s > 0.0);
    assert_eq!(
        rails.one_rail_gb_per_s,
        links.get(0, 1).min(links.get(1, 0))
    );
    assert!(
        links
            .provenance
            .note
            .as_deref()
            .unwrap()
            .contains("all_rails: 2 rank pairs of node-a and node-b"),
        "{:?}",
        links.provenance.note
    );
    eprintln!(
        "all rails: {} GB/s over {} rails, {:.0} % of {} × {} GB/s",
        rails.gb_per_s,
        rails.rails,
        100.0 * rails.efficiency(),
        rails.rails,
        rails.one_rail_gb_per_s
    );

    for node in &profile.nodes {
        let gpus = node.gpus().expect("known GPUs");
        assert_eq!(gpus.len(), 2, "{}", node.host);
        assert_eq!(gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 1]);
        for gpu in gpus {
            assert_eq!(gpu.name, "cpu");
            assert!(gpu.memory_bytes > 0);
            assert_eq!(gpu.provenance.source, Source::Measured);
            assert!(gpu.peak_tflops.bf16.unwrap() > 0.0);
            let measured = gpu.measured(Dtype::Bf16).expect("compute figure");
            assert_eq!(measured.dtype, Dtype::Bf16);
            assert!(measured.tflops > 0.0);
        }
        let gpu_links = node.gpu_links().unwrap();
        assert_eq!(gpu_links.size(), 2);
        assert!(gpu_links.get(0, 1) > 0.0 && gpu_links.get(1, 0) > 0.0);
        assert_eq!(gpu_links.provenance.source, Source::Measured);
    }
    // The figures a user would want to see, in the test log.
    let intra: Vec<f64> = profile
        .nodes
        .iter()
        .flat_map(|n| {
            n.gpu_links()
                .unwrap()
                .links()
                .map(|(_, _, v)| v)
                .collect::<Vec<_>>()
        })
        .collect();
    let tflops: Vec<f64> = profile
        .nodes
        .iter()
        .flat_map(|n| n.gpus().unwrap().iter().map(|g| g.peak_tflops.fp16))
        .collect();
    eprintln!(
        "node links {:.3}–{:.3} GB/s, GPU links {:.3}–{:.3} GB/s, compute {:.4}–{:.4} TFLOPS",
        links.min_link().unwrap(),
        links.max_link().unwrap(),
        intra.iter().copied().fold(f64::INFINITY, f64::min),
        intra.iter().copied().fold(0.0, f64::max),
        tflops.iter().copied().fold(f64::INFINITY, f64::min),
        tflops.iter().copied().fold(0.0, f64::max),
    );

    // Progress went through every phase.
    let events = progress.events();
    for phase in [
        "inventory",
        "starting probe",
        "GPU pairs",
        "node pairs",
        "compute",
    ] {
        assert!(
            events.iter().any(|e| e == &format!("finish {phase}")),
            "{phase} never finished: {events:?}"
        );
    }

    // Written (with node_links.all_rails) and read back unchanged.
    let text = profile.to_json_pretty();
    assert!(text.contains("\"all_rails\": {\"rails\": 2, "), "{text}");
    assert_eq!(
        &ClusterProfile::from_json_str(&text, "p.json").unwrap(),
        profile
    );
    let cached = run.cache_file.expect("cached");
    assert!(cached.starts_with(cache.path()));

    // The same nodes in another order: the cache answers, in the new order.
    let reordered = ["node-c", "node-a", "node-b"];
    let again = run_profile(&common::host_spec(&reordered), &options, &NoProgress).unwrap();
    assert!(again.report.is_none(), "expected the cached profile");
    assert!(
        again.notes[0].starts_with("using the profile measured"),
        "{:?}",
        again.notes
    );
    assert_eq!(again.profile.nodes[0].host, "node-c");
    assert_eq!(
        again.profile.node_links.get(0, 1),
        profile.node_links.get(2, 0),
        "node-c to node-a"
    );
    assert_eq!(again.profile.node_links.all_rails(), Some(rails));

    // The planner accepts the profile: a small model on six CPU "GPUs".
    let args: Vec<String> = [
        "--num-layers",
        "4",
        "--hidden-size",
        "256",
        "--num-attention-heads",
        "8",
        "--seq-length",
        "256",
        "--max-position-embeddings",
        "256",
        "--vocab-size",
        "1024",
        "--global-batch-size",
        "12",
        "--micro-batch-size",
        "1",
        "--bf16",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let settings = settings_from_megatron_args(&args, None, &[]).unwrap();
    let planned = plan(
        &settings,
        profile,
        &PlanOptions {
            budget: Some(2_000),
            top_k: 2,
            ..PlanOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("the planner refused the measured profile: {e}"));
    assert_eq!(planned.config.world_size(), 6);
}

/// One node with one stand-in: nothing to pair, still a complete profile.
#[test]
fn a_single_process_profiles_alone() {
    let torchrun = torchrun();
    let cache = tempfile::tempdir().unwrap();
    let mut options = options(&torchrun, cache.path().to_path_buf());
    options.nproc_per_node = None;
    options.cache = None;
    let run = run_profile(&common::host_spec(&["localhost"]), &options, &NoProgress)
        .unwrap_or_else(|e| panic!("{e}"));
    run.profile.validate("one node").unwrap();
    assert_eq!(run.profile.node_links.size(), 1);
    let gpus = run.profile.nodes[0].gpus().unwrap();
    assert_eq!(gpus.len(), 1, "one stand-in by default");
    assert!(!gpus[0].measured_tflops.is_empty());
    assert!(run.cache_file.is_none());
}
