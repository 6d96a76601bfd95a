//! Tests of the mapping searches and the incremental objective.

use super::dispatch::DispatchMemo;
use super::exhaustive::HeapSwaps;
use super::space::factorial;
use super::walker::Move;
use super::*;
use crate::model::time::ClusterFabric;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[test]
fn heap_swaps_visit_every_arrangement_once() {
    for n in 1..=6usize {
        let mut items: Vec<usize> = (0..n).collect();
        let mut seen = std::collections::HashSet::new();
        seen.insert(items.clone());
        let mut heap = HeapSwaps::new(n);
        while let Some((a, b)) = heap.next_swap() {
            items.swap(a, b);
            assert!(seen.insert(items.clone()), "{items:?} twice");
        }
        assert_eq!(seen.len() as u64, factorial(n as u64).unwrap());
        // A second round from where the first ended covers them all again.
        heap.restart();
        let mut again = std::collections::HashSet::new();
        again.insert(items.clone());
        while let Some((a, b)) = heap.next_swap() {
            items.swap(a, b);
            again.insert(items.clone());
        }
        assert_eq!(again, seen);
    }
}

#[test]
fn identity_state_fills_nodes_in_order() {
    let state = MappingState::identity(2, 3);
    assert_eq!(state.gpus_per_node(), 3);
    assert_eq!(
        state.placement(),
        Placement::identity(6, 3),
        "the identity mapping is torchrun's default placement"
    );
}

#[test]
fn devices_follow_node_and_gpu_order() {
    let state = MappingState {
        node_order: vec![1, 0],
        gpu_order: vec![vec![1, 0], vec![0, 1]],
    };
    assert_eq!(
        state.devices(),
        [
            Device { node: 1, gpu: 1 },
            Device { node: 1, gpu: 0 },
            Device { node: 0, gpu: 0 },
            Device { node: 0, gpu: 1 },
        ]
    );
}

/// A toy objective: the sum over ranks of rank × (node · 10 + gpu).
fn toy(devices: &[Device]) -> f64 {
    devices
        .iter()
        .enumerate()
        .map(|(r, d)| r as f64 * (d.node * 10 + d.gpu) as f64)
        .sum()
}

#[test]
fn node_groups_confine_node_swaps_in_every_search() {
    // Node ranks 0–1 and 2–4 are two classes: no search may move a node across.
    let space = MappingSpace::from_parts(5, 2, vec![false; 5]).with_node_groups(&[2, 3]);
    assert_eq!(space.node_groups(), [(0, 2), (2, 5)]);
    assert_eq!(space.states(false), Some(2 * 6));
    assert_eq!(space.states(true), Some(2 * 6 * 32));
    let in_class = |d: &[Device]| {
        d.iter()
            .enumerate()
            .all(|(r, dev)| (r / 2 < 2) == (dev.node < 2))
    };
    let mut seen = std::collections::HashSet::new();
    let result = search_mapping(
        &mut FullObjective::new(|d: &[Device]| {
            assert!(in_class(d), "a node left its class: {d:?}");
            seen.insert(d.to_vec());
            toy(d)
        }),
        &space,
        &MappingSearch::Exhaustive { limit: 1_000 },
    )
    .unwrap();
    assert_eq!(seen.len(), 384, "every state within the classes once");
    let brute = seen.iter().map(|d| toy(d)).fold(f64::INFINITY, f64::min);
    assert_eq!(result.cost_ms, brute);
    for seed in 0..4 {
        let result = search_mapping(
            &mut FullObjective::new(|d: &[Device]| {
                assert!(in_class(d), "a node left its class: {d:?}");
                toy(d)
            }),
            &space,
            &MappingSearch::Anneal {
                budget: 3_000,
                seed,
            },
        )
        .unwrap();
        assert!(in_class(&result.state.devices()));
        assert_eq!(result.cost_ms, brute, "seed {seed}");
    }
    // A class of one node cannot swap: only the other moves.
    let single = MappingSpace::from_parts(3, 1, vec![true; 3]).with_node_groups(&[1, 2]);
    let mut moved = std::collections::HashSet::new();
    search_mapping(
        &mut FullObjective::new(|d: &[Device]| {
            assert_eq!(d[0].node, 0);
            moved.insert(d.to_vec());
            toy(d)
        }),
        &single,
        &MappingSearch::Anneal {
            budget: 200,
            seed: 1,
        },
    )
    .unwrap();
    assert_eq!(moved.len(), 2);
}

#[test]
fn exhaustive_visits_every_state_and_finds_the_minimum() {
    let space = MappingSpace::from_parts(3, 2, vec![false, true, false]);
    assert_eq!(space.states(true), Some(6 * 2 * 2));
    let mut seen = std::collections::HashSet::new();
    let result = search_mapping(
        &mut FullObjective::new(|d: &[Device]| {
            seen.insert(d.to_vec());
            toy(d)
        }),
        &space,
        &MappingSearch::Exhaustive { limit: 100 },
    )
    .unwrap();
    assert_eq!(result.evaluations, 24);
    assert_eq!(result.method, SearchMethod::Exhaustive { gpu_orders: true });
    assert_eq!(seen.len(), 24, "every state once");
    let brute = seen.iter().map(|d| toy(d)).fold(f64::INFINITY, f64::min);
    assert_eq!(result.cost_ms, brute);
    assert_eq!(
        toy(&result.state.devices()),
        brute,
        "the state is the best one"
    );
}

#[test]
fn exhaustive_falls_back_to_node_orders_then_refuses() {
    let space = MappingSpace::from_parts(3, 3, vec![false; 3]);
    let mut objective = FullObjective::new(toy);
    let result = search_mapping(
        &mut objective,
        &space,
        &MappingSearch::Exhaustive { limit: 10 },
    )
    .unwrap();
    assert_eq!(result.evaluations, 6);
    assert_eq!(
        result.method,
        SearchMethod::Exhaustive { gpu_orders: false }
    );
    assert!(result.state.gpu_order.iter().all(|o| o == &[0, 1, 2]));
    let err = search_mapping(
        &mut objective,
        &space,
        &MappingSearch::Exhaustive { limit: 5 },
    )
    .unwrap_err();
    assert!(err.to_string().contains("6 states"), "{err}");
}

use crate::cluster::profile::{
    GpuInventory, GpuSpec, LinkMatrix, NodeProfile, PeakTflops, Provenance, Source,
};
use crate::cluster::ClusterProfile;
use crate::config::{settings_from_megatron_args, Settings};
use crate::model::calibration::Calibration;
use crate::model::parallel::ParallelConfig;
use crate::model::time::TimeOptions;

/// `nodes` nodes of `g` GPUs: random node links (some at 40–60 %), random GPU-pair
/// links on odd nodes, and a slower GPU here and there.
fn random_cluster(rng: &mut ChaCha8Rng, nodes: usize, g: usize) -> ClusterProfile {
    let p = Provenance::new(Source::Estimated);
    let gpu = |index: usize, tflops: f64| GpuSpec {
        index: index as u32,
        name: "test".into(),
        memory_bytes: 80 << 30,
        peak_tflops: PeakTflops::new(Some(tflops), tflops),
        measured_tflops: Vec::new(),
        provenance: Provenance::new(Source::Datasheet),
    };
    let mut node_links = LinkMatrix::uniform(nodes, 20.0, p.clone());
    for a in 0..nodes {
        for b in 0..nodes {
            let degraded = rng.random::<f64>() < 0.3;
            let bw = 20.0
                * if degraded {
                    rng.random_range(0.4..0.6)
                } else {
                    1.0
                };
            node_links.set(a, b, bw * rng.random_range(0.98..1.02));
        }
    }
    ClusterProfile {
        measured_perf: Vec::new(),
        note: None,
        nodes: (0..nodes)
            .map(|n| {
                let mut links = LinkMatrix::uniform(g, 200.0, p.clone());
                if n % 2 == 1 {
                    for a in 0..g {
                        for b in 0..g {
                            links.set(a, b, rng.random_range(50.0..250.0));
                        }
                    }
                }
                let slow = rng.random::<f64>() < 0.2;
                NodeProfile {
                    host: format!("n{n}"),
                    gpus: GpuInventory::Known {
                        gpus: (0..g)
                            .map(|i| gpu(i, if slow && i == 0 { 150.0 } else { 312.0 }))
                            .collect(),
                        links,
                    },
                    nvlink_domain: None,
                }
            })
            .collect(),
        node_links,
    }
}

fn settings(layers: u64, global: u64) -> Settings {
    settings_with(layers, global, &[])
}

/// A mixture-of-experts version: four experts of width 512, top-2, in every layer.
fn moe_settings(layers: u64, global: u64) -> Settings {
    let moe = [
        "--num-experts",
        "4",
        "--moe-router-topk",
        "2",
        "--moe-ffn-hidden-size",
        "512",
    ];
    settings_with(layers, global, &moe)
}

fn settings_with(layers: u64, global: u64, extra: &[&str]) -> Settings {
    let args: Vec<String> = [
        "--num-layers",
        &layers.to_string(),
        "--hidden-size",
        "1024",
        "--num-attention-heads",
        "16",
        "--seq-length",
        "1024",
        "--max-position-embeddings",
        "1024",
        "--vocab-size",
        "32000",
        "--global-batch-size",
        &global.to_string(),
        "--bf16",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    settings_from_megatron_args(&args, None, &[]).unwrap()
}

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n % d == 0).collect()
}

#[test]
fn incremental_evaluation_equals_the_full_model() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut checked = 0;
    let mut context_cases = 0;
    for case in 0..40 {
        let nodes = rng.random_range(2..=6);
        let g = [1, 2, 4][rng.random_range(0..3)];
        let cluster = random_cluster(&mut rng, nodes, g);
        let world = nodes * g;
        let tps = divisors(g);
        let tp = tps[rng.random_range(0..tps.len())];
        let pps: Vec<usize> = divisors(world / tp)
            .into_iter()
            .filter(|&p| p <= 8)
            .collect();
        let pp = pps[rng.random_range(0..pps.len())];
        // Half the cases with context parallelism (groups of tp × cp ranks, whose own
        // context rings the stage's synchronisation crosses) where the ranks allow.
        let cps: Vec<usize> = divisors(world / tp / pp)
            .into_iter()
            .filter(|&c| (2..=4).contains(&c) && 1024 % (2 * c) == 0)
            .collect();
        let cp = if case % 4 >= 2 && !cps.is_empty() {
            cps[rng.random_range(0..cps.len())]
        } else {
            1
        };
        let dp = world / tp / pp / cp;
        // Every other case a mixture of experts, its all-to-all over ep ranks of each
        // stage's tp × cp × dp and its expert-data-parallel sync priced per stage.
        let experts = case % 2 == 1;
        let settings = if experts {
            moe_settings(8, (dp * 4) as u64)
        } else {
            settings(8, (dp * 4) as u64)
        };
        let mut config = ParallelConfig::even(8, tp as u64, pp as u64, dp as u64, 1);
        config.cp = cp as u64;
        if pp > 2 && 8 % pp == 0 && rng.random::<f64>() < 0.5 {
            config.vpp = Some((8 / pp as u64).min(2));
        }
        config.distributed_optimizer = dp > 1 && rng.random::<f64>() < 0.5;
        config.sequence_parallel = tp > 1 && rng.random::<f64>() < 0.5;
        if experts {
            let eps: Vec<usize> = divisors(tp * cp * dp)
                .into_iter()
                .filter(|e| 4 % e == 0)
                .collect();
            config.ep = eps[rng.random_range(0..eps.len())] as u64;
            // Expert tensor parallelism: groups of ep ranks etp apart.
            let etps: Vec<usize> = divisors(tp)
                .into_iter()
                .filter(|&t| (tp * cp * dp) % (t * config.ep as usize) == 0)
                .collect();
            config.etp = etps[rng.random_range(0..etps.len())] as u64;
            // Megatron: expert parallelism with tp > 1 needs sequence parallelism.
            config.sequence_parallel |= config.ep > 1 && tp > 1;
        }
        let options = TimeOptions {
            overlap_grad_reduce: rng.random::<f64>() < 0.5,
            overlap_param_gather: rng.random::<f64>() < 0.5,
            ..TimeOptions::default()
        };
        let calibration = Calibration::default();
        let fabric =
            ClusterFabric::new(&cluster, settings.training.precision, &calibration).unwrap();
        let costs = ConfigCosts::new(
            &settings.model,
            &settings.training,
            &config,
            &calibration,
            &options,
        )
        .unwrap();
        context_cases += usize::from(cp > 1);
        let hosts: Vec<&str> = cluster.hosts().collect();
        let space = MappingSpace::new(&fabric, &hosts).unwrap();
        let mut walker = Walker::new(&space);
        let mut objective = PipetteObjective::new(&costs, &fabric);
        let stage_ranks = world / pp;
        let mut memo = DispatchMemo::new(&costs, stage_ranks);
        // Bit for bit: the pieces are the model's own, added up in its order.
        let first = objective.reset(&walker.devices);
        assert_eq!(
            first.to_bits(),
            costs.evaluate(&fabric, &walker.devices).to_bits()
        );
        for _ in 0..200 {
            let m = if g > 1 && rng.random::<f64>() < 0.4 {
                let a = rng.random_range(0..g);
                Move::Gpus {
                    slot: rng.random_range(0..nodes),
                    a,
                    b: (a + rng.random_range(1..g)) % g,
                }
            } else {
                let a = rng.random_range(0..nodes);
                Move::Nodes(a, (a + rng.random_range(1..nodes)) % nodes)
            };
            let before = objective.value();
            let value = walker.step(&mut objective, m);
            let full = costs.evaluate(&fabric, &walker.devices);
            assert_eq!(
                value.to_bits(),
                full.to_bits(),
                "case {case}: {value} vs {full} (tp {tp} cp {cp} dp {dp} pp {pp} ep {} etp {})",
                config.ep,
                config.etp
            );
            assert_eq!(walker.state.devices(), walker.devices);
            // The all-to-all looked up per run of a node's members = link by link.
            for s in 0..pp {
                for group in 0..costs.expert_groups() {
                    assert_eq!(
                        costs.group_dispatch(&fabric, &walker.devices, s, group),
                        costs.pairwise_group_dispatch(&fabric, &walker.devices, s, group),
                        "case {case}: stage {s}, expert group {group}"
                    );
                    // A group inside one node: what the memo remembers for its node and
                    // GPUs (from this or an earlier step) = the figure evaluated now.
                    assert_eq!(
                        memo.ms(&costs, &fabric, &walker.devices, s, group)
                            .to_bits(),
                        costs
                            .group_dispatch(&fabric, &walker.devices, s, group)
                            .ms
                            .to_bits(),
                        "case {case}: stage {s}, expert group {group}, from the memo"
                    );
                }
            }
            if rng.random::<f64>() < 0.5 {
                walker.apply(m);
                objective.revert();
                assert_eq!(objective.value(), before);
                let again = objective.update(&walker.devices, &[]);
                assert_eq!(again, before, "case {case}: revert restores every cell");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 40 * 200);
    assert!(context_cases >= 5, "only {context_cases} cases with cp > 1");
}

#[test]
fn annealing_moves_only_what_pays() {
    // Only which node runs rank 0 matters: node 2 is best there.
    let space = MappingSpace::from_parts(4, 3, vec![false; 4]);
    let mut objective = FullObjective::new(|d: &[Device]| if d[0].node == 2 { 1.0 } else { 2.0 });
    let search = MappingSearch::Anneal {
        budget: 2_000,
        seed: 3,
    };
    let result = search_mapping(&mut objective, &space, &search).unwrap();
    assert_eq!(result.cost_ms, 1.0);
    assert_eq!(result.state.node_order, [2, 1, 0, 3]);
    assert!(result.state.gpu_order.iter().all(|o| o == &[0, 1, 2]));
    // A flat landscape keeps torchrun's order.
    let mut flat = FullObjective::new(|_: &[Device]| 1.0);
    let result = search_mapping(&mut flat, &space, &search).unwrap();
    assert_eq!(result.state, MappingState::identity(4, 3));
}

#[test]
fn annealing_counts_its_budget_and_keeps_the_best() {
    let space = MappingSpace::from_parts(4, 2, vec![false; 4]);
    let mut objective = FullObjective::new(toy);
    let search = MappingSearch::Anneal {
        budget: 300,
        seed: 7,
    };
    let result = search_mapping(&mut objective, &space, &search).unwrap();
    assert!(result.evaluations <= 300, "{}", result.evaluations);
    assert_eq!(toy(&result.state.devices()), result.cost_ms);
    assert!(result.cost_ms <= result.identity_ms);
    let again = search_mapping(&mut objective, &space, &search).unwrap();
    assert_eq!(again, result, "same seed, same result");
}
