//! Times the full planner (candidates, memory filter, ranking, rank mapping of the best
//! configurations) on 16, 32 (mixed A100/V100), 64, 1024 and 8192 GPUs and prints a table; run by
//! `scripts/bench-plan`. Evaluations are time-model evaluations: one per ranked
//! configuration, and one per state of every mapping search (incremental ones included).
//!
//! Usage: `cargo run --release --example bench_plan [-- GPUS...] [--repeat N]`

use std::path::PathBuf;
use std::time::Instant;

use pipette::cluster::ClusterProfile;
use pipette::config::settings_from_megatron_args;
use pipette::plan::{plan, PlanOptions};

#[path = "../benches/support/clusters.rs"]
mod clusters;

/// One benchmark case: a cluster, a model and Megatron arguments beyond the preset.
struct Case {
    gpus: usize,
    cluster: &'static str,
    model: &'static str,
    args: &'static [&'static str],
}

const CASES: [Case; 5] = [
    Case {
        gpus: 16,
        cluster: "a100-2x8.json",
        model: "gpt3-13b",
        args: &[],
    },
    // Mixed GPU kinds: every order of the kinds along the pipeline and a layer split per
    // candidate, plus the best even split for the report (V100s train in fp16).
    Case {
        gpus: 32,
        cluster: "a100-v100-mixed-4x8.json",
        model: "gpt3-13b",
        args: &["--fp16"],
    },
    Case {
        gpus: 64,
        cluster: "generated 8x8 A100",
        model: "gpt3-13b",
        args: &[],
    },
    Case {
        gpus: 1024,
        cluster: "h100-128x8.json",
        model: "gpt3-175b",
        args: &[],
    },
    Case {
        gpus: 8192,
        cluster: "generated 1024x8 H100",
        model: "gpt3-175b",
        args: &[],
    },
];

fn load(case: &Case) -> ClusterProfile {
    match case.gpus {
        64 => clusters::generated(
            8,
            8,
            &clusters::gpu("A100-SXM4-80GB", 312.0),
            240.0,
            23.5,
            64,
        ),
        8192 => clusters::generated(
            1024,
            8,
            &clusters::gpu("H100-SXM5-80GB", 989.0),
            380.0,
            46.5,
            8192,
        ),
        _ => {
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("examples/clusters")
                .join(case.cluster);
            ClusterProfile::load(&path).unwrap_or_else(|e| panic!("{e}"))
        }
    }
}

fn main() {
    let mut sizes = Vec::new();
    let mut repeat = 1;
    let mut threads = 0;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--threads" {
            threads = args
                .next()
                .and_then(|n| n.parse().ok())
                .expect("--threads takes a number");
        } else if arg == "--repeat" {
            repeat = args
                .next()
                .and_then(|n| n.parse().ok())
                .expect("--repeat takes a number");
        } else {
            sizes.push(
                arg.parse::<usize>()
                    .expect("GPU counts: 16, 32 (mixed A100/V100), 64, 1024, 8192"),
            );
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool");
    println!(
        "threads: {}, machine: {} logical CPUs",
        pool.current_num_threads(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:>5}  {:<22} {:<9} {:>8} {:>9} {:>7} {:>12} {:>12}  {:<34} {:>10} {:>10}",
        "GPUs",
        "cluster",
        "model",
        "wall s",
        "configs",
        "fit",
        "evaluations",
        "eval/s",
        "plan",
        "ident ms",
        "mapped ms"
    );
    for case in CASES
        .iter()
        .filter(|c| sizes.is_empty() || sizes.contains(&c.gpus))
    {
        let cluster = load(case);
        assert_eq!(cluster.gpu_count(), Some(case.gpus));
        let args: Vec<String> = case.args.iter().map(|a| a.to_string()).collect();
        let settings = settings_from_megatron_args(&args, Some(case.model), &[]).unwrap();
        let options = PlanOptions::default();
        if std::env::var_os("PHASES").is_some() {
            let o = PlanOptions {
                mapping: pipette::plan::MappingMode::Identity,
                ..options.clone()
            };
            let start = Instant::now();
            let r = plan(&settings, &cluster, &o).unwrap();
            eprintln!(
                "ranking only: {:.3} s, {} evals",
                start.elapsed().as_secs_f64(),
                r.stats.evaluations
            );
        }
        for _ in 0..repeat {
            let start = Instant::now();
            let result = pool
                .install(|| plan(&settings, &cluster, &options))
                .unwrap_or_else(|e| panic!("{e}"));
            let wall = start.elapsed().as_secs_f64();
            let c = &result.config;
            let shape = format!(
                "tp{} pp{} dp{} mb{} v{} {}",
                c.tp,
                c.pp,
                c.dp,
                c.micro_batch,
                c.vpp.unwrap_or(1),
                match result.mapping.method {
                    pipette::plan::SearchMethod::Anneal => "anneal",
                    pipette::plan::SearchMethod::Exhaustive { .. } => "exhaustive",
                    pipette::plan::SearchMethod::Identity => "identity",
                }
            );
            println!(
                "{:>5}  {:<22} {:<9} {:>8.3} {:>9} {:>7} {:>12} {:>12.0}  {:<34} {:>10.1} {:>10.1}",
                case.gpus,
                case.cluster,
                case.model,
                wall,
                result.stats.candidates,
                result.stats.fitting,
                result.stats.evaluations,
                result.stats.evaluations as f64 / wall,
                shape,
                result.baseline_mapping_ms,
                result.estimate.iteration_ms,
            );
        }
    }
}
