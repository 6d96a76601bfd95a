//! Rank mapping against ground truth:
//!
//! - on 100 seeded random clusters of 4 and 8 nodes with degraded links, annealing with a
//!   modest budget reaches the exhaustive optimum (within 0.1 %) in at least 95 cases;
//! - side by side with the original Pipette on its own input format: for an 8-node
//!   bandwidth file cut from the real mpiGraph measurement Pipette published, and for every
//!   (pp, tp, mbs) of a small model, our search run with Pipette's published cost formula
//!   (the Pipette-compat model) finds a node order no worse than the exhaustive optimum
//!   over node orders, which is what Pipette's annealer (moving whole servers) can reach;
//! - placements are permutations: every GPU runs exactly one rank.

use crate::common;

use pipette::cluster::profile::{
    GpuInventory, GpuSpec, LinkMatrix, NodeProfile, PeakTflops, Provenance, Source,
};
use pipette::cluster::ClusterProfile;
use pipette::config::{settings_from_megatron_args, Settings};
use pipette::model::parallel::{Device, ParallelConfig, Placement};
use pipette::model::time::compat::pipette_compat_ms;
use pipette::model::time::{
    estimate, ClusterFabric, ConfigCosts, TimeModel, TimeOptions, TimeRequest,
};
use pipette::model::Calibration;
use pipette::plan::mapping::{
    map_config, search_mapping, FullObjective, MappingSearch, MappingSpace, MappingState,
};
use proptest::prelude::*;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn a100(index: u32) -> GpuSpec {
    GpuSpec {
        index,
        name: "A100-SXM4-80GB".into(),
        memory_bytes: 80 << 30,
        peak_tflops: PeakTflops::new(Some(312.0), 312.0),
        measured_tflops: Vec::new(),
        provenance: Provenance::new(Source::Datasheet),
    }
}

/// A small GPT: `layers` layers of hidden 1536 with 12 heads (tp may be 1, 2, 3, 4, 6, 12).
fn settings(layers: u64, global_batch: u64) -> Settings {
    let args: Vec<String> = [
        "--num-layers",
        &layers.to_string(),
        "--hidden-size",
        "1536",
        "--num-attention-heads",
        "12",
        "--seq-length",
        "2048",
        "--max-position-embeddings",
        "2048",
        "--vocab-size",
        "50257",
        "--global-batch-size",
        &global_batch.to_string(),
        "--bf16",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    settings_from_megatron_args(&args, None, &[]).unwrap()
}

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n % d == 0).collect()
}

/// `nodes` nodes of `g` A100s: node links about 23.5 GB/s with ±2 % jitter and a quarter
/// of the directed pairs degraded to 40–60 %; on nodes listed in `degraded_nodes`, GPU
/// pairs at 240 GB/s with a third of them degraded to 40–60 %, elsewhere uniform.
fn random_cluster(
    rng: &mut ChaCha8Rng,
    nodes: usize,
    g: usize,
    degraded_nodes: &[usize],
) -> ClusterProfile {
    let p = Provenance::new(Source::Estimated);
    let mut node_links = LinkMatrix::uniform(nodes, 23.5, p.clone());
    for a in 0..nodes {
        for b in 0..nodes {
            let share = if rng.random::<f64>() < 0.25 {
                rng.random_range(0.4..0.6)
            } else {
                rng.random_range(0.98..1.02)
            };
            node_links.set(a, b, 23.5 * share);
        }
    }
    let nodes = (0..nodes)
        .map(|n| {
            let mut links = LinkMatrix::uniform(g, 240.0, p.clone());
            if degraded_nodes.contains(&n) {
                for a in 0..g {
                    for b in 0..g {
                        if rng.random::<f64>() < 1.0 / 3.0 {
                            links.set(a, b, 240.0 * rng.random_range(0.4..0.6));
                        }
                    }
                }
            }
            NodeProfile {
                host: format!("n{n}"),
                gpus: GpuInventory::Known {
                    gpus: (0..g).map(|i| a100(i as u32)).collect(),
                    links,
                },
                nvlink_domain: None,
            }
        })
        .collect();
    ClusterProfile {
        measured_perf: Vec::new(),
        note: None,
        nodes,
        node_links,
    }
}

/// A random configuration Megatron accepts for `world` ranks, tp inside a node.
fn random_config(rng: &mut ChaCha8Rng, world: usize, g: usize) -> (Settings, ParallelConfig) {
    let layers = 24;
    let tps: Vec<usize> = divisors(g).into_iter().filter(|t| 12 % t == 0).collect();
    let tp = tps[rng.random_range(0..tps.len())];
    let pps: Vec<usize> = divisors(world / tp)
        .into_iter()
        .filter(|p| layers % p == 0)
        .collect();
    let pp = pps[rng.random_range(0..pps.len())];
    let dp = world / tp / pp;
    let micro_batch = rng.random_range(1..=2u64);
    let microbatches = [4u64, 8, 16][rng.random_range(0..3)];
    let settings = settings(layers as u64, dp as u64 * micro_batch * microbatches);
    let mut config =
        ParallelConfig::even(layers as u64, tp as u64, pp as u64, dp as u64, micro_batch);
    config.distributed_optimizer = dp > 1 && rng.random::<f64>() < 0.5;
    config.sequence_parallel = tp > 1 && rng.random::<f64>() < 0.5;
    if pp > 2 && microbatches % pp as u64 == 0 && rng.random::<f64>() < 0.3 {
        config.vpp = Some(2);
    }
    (settings, config)
}

/// The acceptance check: annealing reaches the exhaustive optimum (within 0.1 %)
/// in at least 95 of 100 seeded cases. Half the clusters have 4 nodes (2–4 GPUs, some
/// nodes with degraded GPU pairs, so GPU orders are searched too: up to 4! × 6⁴ states),
/// half 8 nodes (2 or 4 GPUs on uniform NVSwitch-like links: 8! = 40 320 node orders).
#[test]
fn annealing_reaches_the_exhaustive_optimum() {
    const BUDGET: u64 = 5_000;
    let calibration = Calibration::default();
    let mut hits = 0;
    let mut report = Vec::new();
    for case in 0..100u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0000 + case);
        let (nodes, g, degraded): (usize, usize, Vec<usize>) = if case % 2 == 0 {
            let g = rng.random_range(2..=4usize);
            // Keep the exhaustive search small: at most two nodes with degraded GPU pairs.
            let count = if g == 4 { 2 } else { 4 };
            let degraded = (0..4)
                .filter(|_| rng.random::<f64>() < 0.5)
                .take(count)
                .collect();
            (4, g, degraded)
        } else {
            (8, [2, 4][rng.random_range(0..2)], Vec::new())
        };
        let cluster = random_cluster(&mut rng, nodes, g, &degraded);
        let (settings, config) = random_config(&mut rng, nodes * g, g);
        let fabric =
            ClusterFabric::new(&cluster, settings.training.precision, &calibration).unwrap();
        let costs = ConfigCosts::new(
            &settings.model,
            &settings.training,
            &config,
            &calibration,
            &TimeOptions::default(),
        )
        .unwrap();
        let hosts: Vec<&str> = cluster.hosts().collect();
        let space = MappingSpace::new(&fabric, &hosts).unwrap();
        let exhaustive = map_config(
            &costs,
            &fabric,
            &space,
            &MappingSearch::Exhaustive { limit: 1_000_000 },
        )
        .unwrap();
        assert_eq!(Some(exhaustive.evaluations), space.states(true));
        let annealed = map_config(
            &costs,
            &fabric,
            &space,
            &MappingSearch::Anneal {
                budget: BUDGET,
                seed: case,
            },
        )
        .unwrap();
        assert!(annealed.evaluations <= BUDGET);
        // Both results are what the full model says of their states.
        for result in [&exhaustive, &annealed] {
            let full = costs.evaluate(&fabric, &result.state.devices());
            assert!((full - result.cost_ms).abs() <= 1e-9 * full, "case {case}");
        }
        assert!(
            annealed.cost_ms >= exhaustive.cost_ms * (1.0 - 1e-12),
            "case {case}: annealing beat the exhaustive optimum"
        );
        let gap = annealed.cost_ms / exhaustive.cost_ms - 1.0;
        if gap <= 1e-3 {
            hits += 1;
        } else {
            report.push(format!(
                "case {case}: {nodes}x{g} tp{} pp{} dp{}, {} states, annealing {:.6} ms vs optimum {:.6} ms (+{:.3} %)",
                config.tp,
                config.pp,
                config.dp,
                exhaustive.evaluations,
                annealed.cost_ms,
                exhaustive.cost_ms,
                gap * 100.0
            ));
        }
    }
    println!("annealing ({BUDGET} evaluations) reached the exhaustive optimum within 0.1 % in {hits} of 100 cases");
    for line in &report {
        println!("  missed {line}");
    }
    assert!(hits >= 95, "only {hits} of 100 cases hit the optimum");
}

/// An 8-node Pipette bandwidth file (`{"gpus": [hosts], "bandwidth": [[GB/s as strings]]}`,
/// the diagonal holding the intra-node figure, as Pipette's `round_robin_test.py` writes
/// it) cut from the real mpiGraph measurement in `data/mpigraph`, with the links of
/// `degrade` (sender, receiver) pairs cut to half.
fn pipette_file(degrade: &[(usize, usize)]) -> String {
    let path = common::shared_mpigraph_path();
    let measured = ClusterProfile::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let hosts: Vec<String> = measured.hosts().take(8).map(str::to_string).collect();
    let rows: Vec<Vec<String>> = (0..8)
        .map(|a| {
            (0..8)
                .map(|b| {
                    if a == b {
                        "240.0".to_string()
                    } else {
                        let half = if degrade.contains(&(a, b)) { 0.5 } else { 1.0 };
                        format!("{:.4}", measured.node_links.get(a, b) * half)
                    }
                })
                .collect()
        })
        .collect();
    serde_json::json!({"gpus": hosts, "bandwidth": rows}).to_string()
}

/// Every node order of `nodes` nodes (identity GPU order), by plain recursion.
fn node_orders(nodes: usize) -> Vec<Vec<usize>> {
    fn extend(prefix: &mut Vec<usize>, left: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if left.is_empty() {
            out.push(prefix.clone());
            return;
        }
        for i in 0..left.len() {
            let n = left.remove(i);
            prefix.push(n);
            extend(prefix, left, out);
            prefix.pop();
            left.insert(i, n);
        }
    }
    let mut out = Vec::new();
    extend(&mut Vec::new(), &mut (0..nodes).collect(), &mut out);
    out
}

/// Side by side with the original Pipette: its annealer moves whole servers under its
/// published formula, so the best it can reach is the exhaustive optimum over node orders.
/// Our search optimises the Pipette model, not that formula, so for this comparison it runs
/// with the formula as its objective (a [`FullObjective`] over `pipette_compat_ms`, checked
/// here against the report `estimate(.., PipetteCompat)` gives). By default (8 nodes of
/// interchangeable GPUs: the automatic mode enumerates the 8! node orders) its result must
/// cost no more than that optimum; annealing alone with 5 000 evaluations (1/8 of the
/// states) must come within 0.1 % of it (the formula's landscape is a near-degenerate
/// asymmetric travelling-salesman path for pp = 8: many orders within 0.05 %), and how
/// often it matches exactly is printed. The mapping found for our own model is costed
/// under the formula too (printed, not asserted: the objectives differ).
#[test]
fn side_by_side_with_pipette_on_its_own_input() {
    let calibration = Calibration::default();
    let settings = settings(24, 256);
    let orders = node_orders(8);
    assert_eq!(orders.len(), 40_320);
    let mut combos = 0;
    let mut annealing_exact = 0;
    for (variant, degrade) in [
        ("measured", vec![]),
        ("degraded", vec![(0, 3), (3, 0), (2, 5), (6, 1), (4, 7)]),
    ] {
        let text = pipette_file(&degrade);
        let cluster = ClusterProfile::from_json_str(&text, "pipette-8node.json")
            .unwrap_or_else(|e| panic!("{e}"))
            .with_default_gpus(a100(0), 8, 240.0)
            .unwrap();
        let fabric =
            ClusterFabric::new(&cluster, settings.training.precision, &calibration).unwrap();
        let hosts: Vec<&str> = cluster.hosts().collect();
        let space = MappingSpace::new(&fabric, &hosts).unwrap();
        assert_eq!(
            space.states(true),
            Some(40_320),
            "GPU orders are irrelevant here"
        );
        println!("{variant} links: pp tp mbs | optimum over node orders | ours with the compat objective: automatic, annealing | ours with the pipette objective, costed by compat");
        for pp in [2usize, 4, 8] {
            for tp in [1usize, 2, 4] {
                for micro_batch in [1u64, 2] {
                    let dp = 64 / pp / tp;
                    let config =
                        ParallelConfig::even(24, tp as u64, pp as u64, dp as u64, micro_batch);
                    let costs = ConfigCosts::new(
                        &settings.model,
                        &settings.training,
                        &config,
                        &calibration,
                        &TimeOptions::default(),
                    )
                    .unwrap();
                    let compat = |devices: &[Device]| {
                        pipette_compat_ms(&costs, &settings.model, micro_batch, &fabric, devices)
                    };
                    let optimum = orders
                        .iter()
                        .map(|order| {
                            let state = MappingState {
                                node_order: order.clone(),
                                gpu_order: vec![(0..8).collect(); 8],
                            };
                            compat(&state.devices())
                        })
                        .fold(f64::INFINITY, f64::min);

                    let auto = search_mapping(
                        &mut FullObjective::new(compat),
                        &space,
                        &MappingSearch::Auto {
                            limit: 50_000,
                            budget: 5_000,
                            seed: 1,
                        },
                    )
                    .unwrap();
                    let annealed = search_mapping(
                        &mut FullObjective::new(compat),
                        &space,
                        &MappingSearch::Anneal {
                            budget: 5_000,
                            seed: 1,
                        },
                    )
                    .unwrap();
                    assert!(
                        auto.cost_ms <= optimum * (1.0 + 1e-9),
                        "{variant} pp{pp} tp{tp} mbs{micro_batch}: the automatic search found {} ms, the optimum is {optimum} ms",
                        auto.cost_ms
                    );
                    assert!(
                        annealed.cost_ms <= optimum * (1.0 + 1e-3),
                        "{variant} pp{pp} tp{tp} mbs{micro_batch}: annealing found {} ms, the optimum is {optimum} ms",
                        annealed.cost_ms
                    );
                    combos += 1;
                    if annealed.cost_ms <= optimum * (1.0 + 1e-9) {
                        annealing_exact += 1;
                    }
                    // The formula behind the objective is the report's.
                    let placement = auto.state.placement();
                    let report = estimate(
                        &TimeRequest {
                            model: &settings.model,
                            training: &settings.training,
                            config: &config,
                            cluster: &cluster,
                            placement: &placement,
                            calibration: &calibration,
                            options: TimeOptions::default(),
                        },
                        TimeModel::PipetteCompat,
                    )
                    .unwrap();
                    assert_eq!(report.iteration_ms, auto.cost_ms);

                    let ours = map_config(
                        &costs,
                        &fabric,
                        &space,
                        &MappingSearch::Exhaustive { limit: 50_000 },
                    )
                    .unwrap();
                    let ours_compat = compat(&ours.state.devices());
                    println!(
                        "  {pp:>2} {tp:>2} {micro_batch:>3} | {optimum:>12.3} | {:>12.3} {:>12.3} | {ours_compat:>12.3} (+{:.3} %)",
                        auto.cost_ms,
                        annealed.cost_ms,
                        (ours_compat / optimum - 1.0) * 100.0
                    );
                }
            }
        }
    }
    println!("the automatic search (exhaustive over the 8! node orders) matched the optimum in all {combos} cases; annealing with 5 000 evaluations matched it exactly in {annealing_exact} and came within 0.1 % in all");
}

/// A random small cluster for the property test: `nodes` × `g`, odd nodes with uneven
/// GPU pairs.
fn small_cluster(nodes: usize, g: usize, seed: u64) -> ClusterProfile {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let degraded: Vec<usize> = (0..nodes).filter(|n| n % 2 == 1).collect();
    random_cluster(&mut rng, nodes, g, &degraded)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the search, every GPU of the cluster runs exactly one rank, and the
    /// mapping's devices are the placement's.
    #[test]
    fn placements_are_permutations(
        nodes in 1usize..=5,
        g in 1usize..=4,
        seed in any::<u64>(),
        budget in 1u64..400,
        mode in 0u8..3,
    ) {
        let cluster = small_cluster(nodes, g, seed);
        let calibration = Calibration::default();
        let world = nodes * g;
        let settings = settings(24, 96);
        let tp = if g % 2 == 0 { 2 } else { 1 };
        let pp = if (world / tp) % 2 == 0 { 2 } else { 1 };
        let dp = world / tp / pp;
        let mut settings = settings;
        settings.training.global_batch_size = 4 * dp as u64;
        let config = ParallelConfig::even(24, tp as u64, pp as u64, dp as u64, 1);
        let fabric = ClusterFabric::new(&cluster, settings.training.precision, &calibration).unwrap();
        let costs = ConfigCosts::new(&settings.model, &settings.training, &config, &calibration, &TimeOptions::default()).unwrap();
        let hosts: Vec<&str> = cluster.hosts().collect();
        let space = MappingSpace::new(&fabric, &hosts).unwrap();
        let search = match mode {
            0 => MappingSearch::Anneal { budget, seed },
            1 => MappingSearch::Auto { limit: 2_000, budget, seed },
            _ => MappingSearch::Identity,
        };
        let result = map_config(&costs, &fabric, &space, &search).unwrap();
        let placement: Placement = result.state.placement();
        prop_assert_eq!(placement.devices.len(), world);
        let mut seen = vec![false; world];
        for d in &placement.devices {
            prop_assert!(d.node < nodes && d.gpu < g);
            let i = d.node * g + d.gpu;
            prop_assert!(!seen[i], "GPU {:?} runs two ranks", d);
            seen[i] = true;
        }
        let mut nodes_seen = result.state.node_order.clone();
        nodes_seen.sort_unstable();
        prop_assert_eq!(nodes_seen, (0..nodes).collect::<Vec<_>>());
        prop_assert!(result.cost_ms <= result.identity_ms);
        let full = costs.evaluate(&fabric, &placement.devices);
        prop_assert!((full - result.cost_ms).abs() <= 1e-9 * full);
    }
}
