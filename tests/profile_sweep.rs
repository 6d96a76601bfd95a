//! The profile's performance sweep end to end on CPUs with PyTorch's real torchrun: two
//! "nodes" (`node-a`, `node-b`, one CPU process each, run here through the local
//! transport) measure GEMMs at the shapes of the model being planned, attention, a large
//! copy and collectives; the profile carries them in its `measured_perf` section, a second
//! run reuses the cached profile for the same shapes, another model's shapes re-run only
//! the sweep (the links are cached apart), and the planner prices the plan with the
//! measured table (and says so in the estimate's notes).
//!
//! Needs the venv of `scripts/setup-megatron-venv` (PyTorch with torchrun);
//! `PIPETTE_MEGATRON_PYTHON` picks another python. Fails, never skips, without it.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pipette::cluster::profile::{Dtype, GemmLayout, Source};
use pipette::cluster::ClusterProfile;
use pipette::config::{settings_from_megatron_args, Settings};
use pipette::exec::Transport;
use pipette::measure::{
    run_profile, NoProgress, ProbeSettings, ProfileCache, ProfileOptions, SweepShapes,
};
use pipette::model::time::sweep_shapes;
use pipette::plan::{plan, PlanOptions};

/// A small model, so that its GEMMs take milliseconds on a CPU.
fn settings() -> Settings {
    let args: Vec<String> = [
        "--num-layers",
        "2",
        "--hidden-size",
        "128",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "128",
        "--max-position-embeddings",
        "128",
        "--vocab-size",
        "512",
        "--global-batch-size",
        "8",
        "--micro-batch-size",
        "1",
        "--bf16",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    settings_from_megatron_args(&args, None, &[]).unwrap()
}

fn profile_options(torchrun: &str, cache_dir: PathBuf, shapes: SweepShapes) -> ProfileOptions {
    ProfileOptions {
        transport: Transport::Local,
        nproc_per_node: Some(1),
        torchrun: torchrun.to_owned(),
        probe_timeout: Duration::from_secs(120),
        grace: Duration::from_secs(2),
        probe: Some(ProbeSettings {
            sizes: vec![64 << 10],
            warmup: 1,
            repeats: 1,
            bytes_per_repeat: 1 << 20,
            max_iters: 4,
            compute_n: 128,
            compute_repeats: 1,
        }),
        cache: Some(ProfileCache {
            dir: cache_dir,
            ttl: Duration::from_secs(3600),
        }),
        sweep: Some(shapes),
        ..ProfileOptions::default()
    }
}

#[test]
fn two_local_cpu_nodes_measure_the_models_tables_and_the_plan_uses_them() {
    let torchrun = common::torchrun().to_string_lossy().into_owned();
    let cache = tempfile::tempdir().unwrap();
    let settings = settings();
    let (gemms, attention) = sweep_shapes(&settings.model, &[1, 2], &[1, 2]);
    // QKV, attention output, MLP up and down, logits: three layouts each, per (tp, b).
    assert!(gemms.len() >= 15, "{gemms:?}");
    assert_eq!(
        attention.len(),
        3,
        "4 heads/tp × b: 4, 2 and 8 {attention:?}"
    );
    let shapes = SweepShapes {
        dtype: Dtype::Bf16,
        gemms: gemms.clone(),
        attention: attention.clone(),
    };
    let options = profile_options(&torchrun, cache.path().to_path_buf(), shapes.clone());
    let hosts = ["node-a", "node-b"];

    let start = Instant::now();
    let run = run_profile(&common::host_spec(&hosts), &options, &NoProgress)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("profile with sweep took {:?}", start.elapsed());
    let profile = &run.profile;
    assert!(run.report.is_some(), "measured, not cached");
    profile.validate("swept profile").unwrap();

    // One section: the CPU stand-ins, in bf16, every figure positive and plausible.
    assert_eq!(
        profile.measured_perf.len(),
        1,
        "{:?}",
        profile.measured_perf
    );
    let perf = &profile.measured_perf[0];
    eprintln!("{}", serde_json::to_string_pretty(perf).unwrap());
    assert_eq!(perf.gpu, "cpu");
    assert_eq!(perf.dtype, Dtype::Bf16);
    assert_eq!(perf.provenance.source, Source::Measured);
    assert!(!perf.gemms.is_empty());
    assert!(perf.gemms.len() <= gemms.len());
    for g in &perf.gemms {
        assert!(gemms.contains(&g.shape()), "{g:?} was not asked for");
        // A CPU core attains megaflops to a few teraflops.
        assert!(g.tflops > 1e-6 && g.tflops < 20.0, "{g:?}");
    }
    for layout in [GemmLayout::Fwd, GemmLayout::Dgrad, GemmLayout::Wgrad] {
        assert!(perf.gemms.iter().any(|g| g.layout == layout), "{layout:?}");
    }
    assert!(!perf.attention.is_empty());
    assert!(perf
        .attention
        .iter()
        .all(|a| a.tflops > 1e-6 && a.tflops < 20.0));
    let hbm = perf.hbm_gb_per_s.expect("a copy was measured");
    assert!(hbm > 0.05 && hbm < 2_000.0, "{hbm} GB/s");
    let all_reduces: Vec<_> = perf
        .collectives
        .iter()
        .filter(|c| c.op == "all_reduce" && c.ranks == 2)
        .collect();
    assert!(!all_reduces.is_empty(), "{:?}", perf.collectives);
    assert!(all_reduces.iter().all(|c| c.us > 0.1 && c.us < 5e6));
    assert!(perf
        .collectives
        .iter()
        .any(|c| c.op == "all_gather" && c.ranks == 2));

    // The file reads back with its section.
    let text = profile.to_json_pretty();
    assert!(text.contains("\"measured_perf\""));
    let back = ClusterProfile::from_json_str(&text, "swept.json").unwrap();
    assert_eq!(&back, profile);

    // The same nodes and shapes: the cached profile, sweep and all.
    let again = run_profile(&common::host_spec(&hosts), &options, &NoProgress).unwrap();
    assert!(again.report.is_none(), "the cache was not used");
    assert_eq!(again.cache_file, run.cache_file);
    assert_eq!(again.profile.measured_perf, profile.measured_perf);
    // Another model (other shapes) on the same nodes: the links entry is reused and only
    // the sweep runs, so the probe reports no links and no matmul figures, the links are
    // the first run's, and the new sweep's section is cached apart from the first one.
    let mut fewer = shapes;
    fewer.gemms.truncate(3);
    let other = profile_options(&torchrun, cache.path().to_path_buf(), fewer);
    let second = run_profile(&common::host_spec(&hosts), &other, &NoProgress)
        .unwrap_or_else(|e| panic!("{e}"));
    let report = second.report.as_ref().expect("the sweep was measured");
    assert!(report.links.is_empty(), "links measured again: {report:?}");
    assert!(
        report.compute.is_empty(),
        "matmuls measured again: {report:?}"
    );
    assert!(
        second
            .notes
            .iter()
            .any(|n| n.starts_with("measuring the performance sweep of this model alone")),
        "{:?}",
        second.notes
    );
    assert_eq!(second.profile.node_links, profile.node_links);
    assert_eq!(second.profile.nodes, profile.nodes);
    assert_eq!(second.profile.measured_perf.len(), 1);
    let section = &second.profile.measured_perf[0];
    assert_ne!(section.shape_set, perf.shape_set);
    assert!(section.gemms.len() <= 3, "{section:?}");
    assert_ne!(
        second.cache_file, run.cache_file,
        "another shape set shares the key"
    );
    // Each model's entry is reused as it is, the first one's sweep untouched.
    let first_again = run_profile(&common::host_spec(&hosts), &options, &NoProgress).unwrap();
    assert!(first_again.report.is_none());
    assert_eq!(first_again.profile.measured_perf, profile.measured_perf);
    let second_again = run_profile(&common::host_spec(&hosts), &other, &NoProgress).unwrap();
    assert!(second_again.report.is_none());
    assert_eq!(second_again.profile, second.profile);
    // --reprofile measures everything again, links included.
    let remeasured = run_profile(
        &common::host_spec(&hosts),
        &ProfileOptions {
            reprofile: true,
            ..other.clone()
        },
        &NoProgress,
    )
    .unwrap();
    assert!(!remeasured.report.as_ref().unwrap().links.is_empty());

    // The planner prices with the measured table and says so; without the section the
    // same profile gives another estimate.
    let plan_options = PlanOptions {
        budget: Some(500),
        top_k: 1,
        ..PlanOptions::default()
    };
    let planned = plan(&settings, profile, &plan_options).unwrap_or_else(|e| panic!("{e}"));
    let notes = planned.estimate.time.notes.join("\n");
    assert!(
        notes.contains("other GPU figures measured, not shipped: the profile's sweep on cpu"),
        "{notes}"
    );
    let mut shipped = profile.clone();
    shipped.measured_perf.clear();
    let unswept = plan(&settings, &shipped, &plan_options).unwrap();
    assert!(!unswept
        .estimate
        .time
        .notes
        .iter()
        .any(|n| n.contains("measured, not shipped")));
    assert_ne!(
        planned.estimate.iteration_ms, unswept.estimate.iteration_ms,
        "the measured table changed nothing"
    );
}
