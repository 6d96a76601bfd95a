//! Times the full planner (candidates, memory filter, ranking, rank mapping of the best
//! configurations) on 16, 32 (mixed A100/V100), 64, 1024, 1024 mixed H100/A100, 8192,
//! 16,384 GPUs (Llama-3-405B), 127 of 128 H100 nodes (GPT-3 175B, batch 1536) and 100,000
//! GPUs (12,500 nodes, sampled links) and prints a table; every case plans with the node
//! subset search ([`pipette::plan::plan_subset`]); run by `scripts/bench-plan`. Evaluations
//! are time-model evaluations: one per ranked configuration, and one per state of every
//! mapping search (incremental ones included). Each case runs in a process of its own, so
//! its peak memory (the process's max RSS from getrusage: the cluster, the planner and
//! everything it allocates) is its own.
//!
//! The last column is a digest of the whole plan (its JSON: configuration, mapping,
//! estimate, the mapped top configurations, the statistics): two builds that print the same
//! digest for a case made the same plan, figure for figure, which is how a speed-up shows
//! that it changed nothing.
//!
//! Usage: `cargo run --release --example bench_plan [-- CASES...] [--repeat N] [--threads N]
//! [--budget N] [--top] [--sweep LO]` where a case is its key: 16, 32, 64, 1024, 1024-mix,
//! 8192, 16384, 127, 12500, dsv3-256, dsv3-2048 (`--sweep LO` also plans each node count from LO up separately);
//! `--budget` sets the annealing evaluations per mapped configuration (to see what a budget
//! buys), `--top` lists every mapped configuration's default-order, searched and mapped
//! estimates.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use pipette::cluster::ClusterProfile;
use pipette::config::settings_from_megatron_args;
use pipette::plan::subset::node_order;
use pipette::plan::{plan, plan_subset, PlanOptions};

#[path = "../benches/support/clusters.rs"]
mod clusters;

/// One benchmark case: a cluster, a model and Megatron arguments beyond the preset.
struct Case {
    /// How the command line names the case.
    key: &'static str,
    gpus: usize,
    cluster: &'static str,
    model: &'static str,
    args: &'static [&'static str],
}

const CASES: [Case; 13] = [
    Case {
        key: "16",
        gpus: 16,
        cluster: "a100-2x8.json",
        model: "gpt3-13b",
        args: &[],
    },
    // Mixed GPU kinds: every order of the kinds along the pipeline and a layer split per
    // candidate, plus the best even split for the report (V100s train in fp16).
    Case {
        key: "32",
        gpus: 32,
        cluster: "a100-v100-mixed-4x8.json",
        model: "gpt3-13b",
        args: &["--fp16"],
    },
    Case {
        key: "64",
        gpus: 64,
        cluster: "generated 8x8 A100",
        model: "gpt3-13b",
        args: &[],
    },
    Case {
        key: "1024",
        gpus: 1024,
        cluster: "h100-128x8.json",
        model: "gpt3-175b",
        args: &[],
    },
    // Two GPU kinds, 512 of each: 64 H100 nodes (NDR) and 64 A100 nodes (HDR).
    Case {
        key: "1024-mix",
        gpus: 1024,
        cluster: "generated 64+64x8 H100/A100",
        model: "gpt3-175b",
        args: &[],
    },
    Case {
        key: "8192",
        gpus: 8192,
        cluster: "generated 1024x8 H100",
        model: "gpt3-175b",
        args: &[],
    },
    // Llama 3 405B's own scale (Dubey et al. 2024, Table 4: 16,384 H100 GPUs).
    Case {
        key: "16384",
        gpus: 16384,
        cluster: "generated 2048x8 H100",
        model: "llama3-405b",
        args: &[],
    },
    // A 128-node job after one node failed (issue 32): 127 nodes have no layout for this
    // batch, so the planner chooses a subset and names the rest as spares.
    Case {
        key: "127",
        gpus: 1016,
        cluster: "h100-128x8.json less 1",
        model: "gpt3-175b",
        args: &["--global-batch-size", "1536"],
    },
    // 100,000 GPUs (issue 32): node links sampled (a figure per node and 8 measured pairs
    // from each), as a profile of that many nodes holds them.
    Case {
        key: "12500",
        gpus: 100_000,
        cluster: "generated 12500x8 H100 s",
        model: "llama3-405b",
        args: &["--global-batch-size", "16384"],
    },
    // Long contexts (issue 30): 16 trays of one GB200 NVL72 rack (64 GPUs, one NVLink
    // domain), context parallelism chosen by the model.
    Case {
        key: "gb200-128k",
        gpus: 64,
        cluster: "gb200-nvl72-4racks.json, 16 trays",
        model: "llama3-70b",
        args: &[
            "--seq-length",
            "131072",
            "--max-position-embeddings",
            "131072",
            "--global-batch-size",
            "64",
        ],
    },
    Case {
        key: "gb200-1m",
        gpus: 64,
        cluster: "gb200-nvl72-4racks.json, 16 trays",
        model: "llama3-8b",
        args: &[
            "--seq-length",
            "1048576",
            "--max-position-embeddings",
            "1048576",
            "--global-batch-size",
            "16",
        ],
    },
    // DeepSeek-V3 (issue 29): 61 layers of which 58 MoE with 256 experts, MLA and one MTP
    // layer; the planner chooses ep and etp beside the rest. 32 and 256 H100 nodes of 8.
    Case {
        key: "dsv3-256",
        gpus: 256,
        cluster: "generated 32x8 H100",
        model: "deepseek-v3",
        args: &[],
    },
    Case {
        key: "dsv3-2048",
        gpus: 2048,
        cluster: "generated 256x8 H100",
        model: "deepseek-v3",
        args: &[],
    },
];

fn h100() -> pipette::cluster::profile::GpuSpec {
    clusters::gpu("H100-SXM5-80GB", 989.0)
}

fn a100() -> pipette::cluster::profile::GpuSpec {
    clusters::gpu("A100-SXM4-80GB", 312.0)
}

fn load(case: &Case) -> ClusterProfile {
    match case.key {
        "64" => clusters::generated(8, 8, &a100(), 240.0, 23.5, 64),
        "1024-mix" => clusters::mixed(
            &[
                clusters::NodeKind {
                    nodes: 64,
                    gpu: h100(),
                    intra: 380.0,
                    nic: 46.5,
                },
                clusters::NodeKind {
                    nodes: 64,
                    gpu: a100(),
                    intra: 240.0,
                    nic: 23.5,
                },
            ],
            8,
            1025,
        ),
        "8192" => clusters::generated(1024, 8, &h100(), 380.0, 46.5, 8192),
        "dsv3-256" => clusters::generated(32, 8, &h100(), 380.0, 46.5, 256),
        "dsv3-2048" => clusters::generated(256, 8, &h100(), 380.0, 46.5, 2048),
        "16384" => clusters::generated(2048, 8, &h100(), 380.0, 46.5, 16384),
        "12500" => clusters::sampled(12_500, 8, &h100(), 380.0, 46.5, 8, 12_500),
        "gb200-128k" | "gb200-1m" => {
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("examples/clusters/gb200-nvl72-4racks.json");
            let racks = ClusterProfile::load(&path).unwrap_or_else(|e| panic!("{e}"));
            racks.at_positions(&(0..16).collect::<Vec<_>>())
        }
        "127" => {
            let path =
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/clusters/h100-128x8.json");
            let full = ClusterProfile::load(&path).unwrap_or_else(|e| panic!("{e}"));
            full.at_positions(&(0..127).collect::<Vec<_>>())
        }
        _ => {
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("examples/clusters")
                .join(case.cluster);
            ClusterProfile::load(&path).unwrap_or_else(|e| panic!("{e}"))
        }
    }
}

/// This process so far: peak resident memory, MiB (Linux reports `ru_maxrss` in KiB), and
/// CPU seconds (user + system; on a machine shared with other work they say what the case
/// costs better than the wall time does).
fn usage() -> (f64, f64) {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).map_or(
        (f64::NAN, f64::NAN),
        |u| {
            let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            (
                u.max_rss() as f64 / 1024.0,
                seconds(u.user_time()) + seconds(u.system_time()),
            )
        },
    )
}

/// FNV-1a over the plan's JSON: a fingerprint of every figure in it (serde_json writes each
/// f64 in its shortest exact form, so the digest moves with any bit of any estimate).
fn digest(plan: &pipette::plan::Plan) -> String {
    let json = serde_json::to_string(plan).expect("a plan serialises");
    let hash = json.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// Plans `case` `repeat` times on `threads` threads (0: all) and prints a row per run.
/// `budget`: annealing evaluations per mapped configuration (`None`: the planner's
/// default); `top`: also list every mapped configuration (to stderr).
fn run_case(
    case: &Case,
    repeat: usize,
    threads: usize,
    budget: Option<u64>,
    top: bool,
    sweep: Option<usize>,
) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool");
    let cluster = load(case);
    assert_eq!(cluster.gpu_count(), Some(case.gpus));
    let args: Vec<String> = case.args.iter().map(|a| a.to_string()).collect();
    let settings = settings_from_megatron_args(&args, Some(case.model), &[]).unwrap();
    let options = PlanOptions {
        budget,
        ..PlanOptions::default()
    };
    if std::env::var_os("PHASES").is_some() {
        let o = PlanOptions {
            mapping: pipette::plan::MappingMode::Identity,
            ..options.clone()
        };
        let start = Instant::now();
        let cpu_before = usage().1;
        let r = plan(&settings, &cluster, &o).unwrap();
        eprintln!(
            "ranking only: {:.3} s wall, {:.3} CPU s, {} evals",
            start.elapsed().as_secs_f64(),
            usage().1 - cpu_before,
            r.stats.evaluations
        );
        let cpu_before = usage().1;
        let r = plan_subset(&settings, &cluster, &o).unwrap();
        eprintln!(
            "subset ranking only: {:.3} CPU s, {} evals",
            usage().1 - cpu_before,
            r.stats.evaluations
        );
    }
    for _ in 0..repeat {
        let cpu_before = usage().1;
        let start = Instant::now();
        let result = pool
            .install(|| plan_subset(&settings, &cluster, &options))
            .unwrap_or_else(|e| panic!("{e}"));
        let wall = start.elapsed().as_secs_f64();
        let (rss_mib, cpu_after) = usage();
        let c = &result.config;
        let cp = |cp: u64| {
            if cp > 1 {
                format!(" cp{cp}")
            } else {
                String::new()
            }
        };
        // The expert layout after dp, for a model with experts.
        let experts = if result.experts.is_some() {
            format!(" ep{} etp{}", c.ep, c.etp)
        } else {
            String::new()
        };
        let shape = format!(
            "tp{}{} pp{} dp{}{experts} mb{} v{} {}",
            c.tp,
            cp(c.cp),
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
        let used = case.gpus
            / cluster
                .nodes
                .first()
                .and_then(|n| n.gpus())
                .map_or(1, |g| g.len().max(1))
            - result.spares.len();
        let shape = format!("{shape} n{used}");
        println!(
            "{:>8}  {:<28} {:<11} {:>8.3} {:>8.3} {:>8.0} {:>9} {:>7} {:>12} {:>12.0}  {:<34} {:>10.1} {:>10.1}  {}",
            case.key,
            case.cluster,
            case.model,
            wall,
            cpu_after - cpu_before,
            rss_mib,
            result.stats.candidates,
            result.stats.fitting,
            result.stats.evaluations,
            result.stats.evaluations as f64 / wall,
            shape,
            result.baseline_mapping_ms,
            result.estimate.iteration_ms,
            digest(&result),
        );
        if top {
            for t in &result.top {
                eprintln!(
                    "  tp{}{} pp{} dp{} ep{} etp{} mb{} v{}: ident {:.1} searched {:.1} mapped {:.1} evals {}",
                    t.config.tp,
                    cp(t.config.cp),
                    t.config.pp,
                    t.config.dp,
                    t.config.ep,
                    t.config.etp,
                    t.config.micro_batch,
                    t.config.vpp.unwrap_or(1),
                    t.iteration_ms,
                    t.searched_ms,
                    t.mapped_ms,
                    t.evaluations
                );
            }
        }
    }
    if let Some(lo) = sweep {
        let chosen = pool
            .install(|| plan_subset(&settings, &cluster, &options))
            .unwrap_or_else(|e| panic!("{e}"));
        sweep_counts(
            &cluster,
            &settings,
            &options,
            lo,
            chosen.estimate.iteration_ms,
        );
    }
}

/// Plans every node count from `lo` to the cluster's separately (each on the best nodes
/// by the profile, as the subset search orders them) and prints the fastest beside the
/// subset search's plan (`chosen_ms`): the subset search must come within 2 % of it.
fn sweep_counts(
    cluster: &ClusterProfile,
    settings: &pipette::config::Settings,
    options: &PlanOptions,
    lo: usize,
    chosen_ms: f64,
) {
    let order: Vec<usize> = node_order(settings, cluster, options)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let start = Instant::now();
    let mut best: Option<(usize, f64)> = None;
    let mut planned = 0;
    for n in lo..=cluster.nodes.len() {
        if let Ok(p) = plan(settings, &cluster.at_positions(&order[..n]), options) {
            planned += 1;
            let ms = p.estimate.iteration_ms;
            if best.is_none_or(|(_, b)| ms < b) {
                best = Some((n, ms));
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    match best {
        Some((n, ms)) => println!(
            "sweep {lo}..={}: {planned} counts plan, fastest {ms:.1} ms on {n} nodes ({wall:.1} s); subset search {chosen_ms:.1} ms = {:+.2} %",
            cluster.nodes.len(),
            (chosen_ms / ms - 1.0) * 100.0
        ),
        None => println!("sweep {lo}..={}: no count plans", cluster.nodes.len()),
    }
}

fn main() {
    let mut keys = Vec::new();
    let mut repeat = 1;
    let mut threads = 0;
    let mut child = false;
    let mut budget = None;
    let mut top = false;
    let mut sweep = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--threads" => {
                threads = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--threads takes a number")
            }
            "--repeat" => {
                repeat = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--repeat takes a number")
            }
            "--budget" => {
                budget = Some(
                    args.next()
                        .and_then(|n| n.parse().ok())
                        .expect("--budget takes a number"),
                )
            }
            "--top" => top = true,
            "--sweep" => {
                sweep = Some(
                    args.next()
                        .and_then(|n| n.parse().ok())
                        .expect("--sweep takes the fewest nodes"),
                )
            }
            // One case in this process: what the parent runs for each case.
            "--one" => child = true,
            key => {
                assert!(
                    CASES.iter().any(|c| c.key == key),
                    "unknown case {key:?} (cases: 16, 32, 64, 1024, 1024-mix, 8192, 16384, 127, 12500, dsv3-256, dsv3-2048)"
                );
                keys.push(key.to_string());
            }
        }
    }
    let selected: Vec<&Case> = CASES
        .iter()
        .filter(|c| keys.is_empty() || keys.iter().any(|k| k == c.key))
        .collect();
    if child {
        for case in selected {
            run_case(case, repeat, threads, budget, top, sweep);
        }
        return;
    }
    println!(
        "threads: {}, machine: {} logical CPUs",
        if threads == 0 {
            rayon::current_num_threads()
        } else {
            threads
        },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:>8}  {:<28} {:<11} {:>8} {:>8} {:>8} {:>9} {:>7} {:>12} {:>12}  {:<34} {:>10} {:>10}  plan digest",
        "case",
        "cluster",
        "model",
        "wall s",
        "CPU s",
        "RSS MiB",
        "configs",
        "fit",
        "evaluations",
        "eval/s",
        "plan",
        "ident ms",
        "mapped ms"
    );
    let exe = std::env::current_exe().expect("the benchmark's own path");
    let mut failed = false;
    for case in selected {
        let status = Command::new(&exe)
            .args(["--one", case.key])
            .args(["--repeat", &repeat.to_string()])
            .args(["--threads", &threads.to_string()])
            .args(
                budget
                    .iter()
                    .flat_map(|b| ["--budget".to_string(), b.to_string()]),
            )
            .args(top.then_some("--top"))
            .args(
                sweep
                    .iter()
                    .flat_map(|lo| ["--sweep".to_string(), lo.to_string()]),
            )
            .status()
            .expect("the benchmark runs itself for each case");
        if !status.success() {
            eprintln!("case {}: {status}", case.key);
            failed = true;
        }
    }
    if failed {
        std::process::exit(1);
    }
}
