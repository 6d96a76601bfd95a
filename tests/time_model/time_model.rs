//! The iteration-time models on the example clusters and on real mpiGraph measurements:
//! monotone in bandwidth, a degraded pipeline link costs exactly what the formula says,
//! tensor parallelism belongs inside a node, the data-parallel ring's bottleneck governs,
//! and the three models agree on obvious orderings.

use crate::common;

use pipette::cluster::profile::{
    GpuInventory, GpuSpec, LinkMatrix, PeakTflops, Provenance, Source,
};
use pipette::cluster::ClusterProfile;
use pipette::config::{
    settings_from_megatron_args, CpCommType, ModelSpec, Precision, TrainingSettings,
};
use pipette::model::parallel::{Device, ParallelConfig, Placement};
use pipette::model::time::{
    estimate, ClusterFabric, ConfigCosts, TimeError, TimeEstimate, TimeModel, TimeOptions,
    TimeRequest,
};
use pipette::model::Calibration;
use proptest::prelude::*;

fn a100() -> GpuSpec {
    GpuSpec {
        index: 0,
        name: "A100-SXM4-80GB".into(),
        memory_bytes: 85_899_345_920,
        peak_tflops: PeakTflops::new(Some(312.0), 312.0),
        measured_tflops: Vec::new(),
        provenance: Provenance::new(Source::Datasheet),
    }
}

/// The 16-node mpiGraph measurement published with Pipette, with 8 default A100s a node.
fn mpigraph() -> ClusterProfile {
    let path = common::shared_mpigraph_path();
    ClusterProfile::load(&path)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_default_gpus(a100(), 8, 240.0)
        .unwrap()
}

fn preset(name: &str) -> (ModelSpec, TrainingSettings) {
    let s = settings_from_megatron_args(&[], Some(name), &[]).unwrap();
    (s.model, s.training)
}

fn with_batch(mut t: TrainingSettings, global: u64) -> TrainingSettings {
    t.global_batch_size = global;
    t
}

fn run(
    model: &ModelSpec,
    training: &TrainingSettings,
    config: &ParallelConfig,
    cluster: &ClusterProfile,
    placement: &Placement,
    time_model: TimeModel,
) -> Result<TimeEstimate, TimeError> {
    estimate(
        &TimeRequest {
            model,
            training,
            config,
            cluster,
            placement,
            calibration: &Calibration::default(),
            options: TimeOptions::default(),
        },
        time_model,
    )
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn check_terms(e: &TimeEstimate) {
    let sum = e.steady_ms
        + e.bubble_ms
        + e.pipeline_p2p_ms
        + e.data_parallel_exposed_ms
        + e.param_gather_exposed_ms
        + e.optimizer_ms;
    assert!(e.iteration_ms.is_finite() && e.iteration_ms > 0.0, "{e:?}");
    assert!(close(sum, e.iteration_ms), "{sum} vs {}", e.iteration_ms);
}

#[test]
fn every_example_cluster_is_costed_three_ways() {
    let (model, training) = preset("gpt3-1.3b");
    let training = with_batch(training, 128);
    for (file, precision) in [
        ("a100-2x8.json", Precision::Bf16),
        ("a100-4x8-degraded.json", Precision::Bf16),
        ("a100-v100-mixed-4x8.json", Precision::Fp16),
        ("h100-a100-mixed-4x8.json", Precision::Bf16),
        ("h100-16x8.json", Precision::Bf16),
        ("h100-128x8.json", Precision::Bf16),
        ("v100-8x8.json", Precision::Fp16),
    ] {
        let cluster = common::example_cluster(file);
        let gpus = cluster.gpu_count().unwrap();
        let training = TrainingSettings {
            precision,
            ..training.clone()
        };
        let dp = gpus as u64 / 16;
        let config = ParallelConfig::even(24, 8, 2, dp, 1);
        let placement = Placement::identity(gpus, 8);
        for m in TimeModel::ALL {
            let e = run(&model, &training, &config, &cluster, &placement, m)
                .unwrap_or_else(|err| panic!("{file} {m}: {err}"));
            assert_eq!(e.model, m);
            check_terms(&e);
            let json = serde_json::to_value(&e).unwrap();
            assert!(json["iteration_ms"].is_f64(), "{file} {m}");
        }
    }
}

/// The single link `node_links[from][to]` of `cluster` set to `gb_per_s`.
fn with_node_link(
    cluster: &ClusterProfile,
    from: usize,
    to: usize,
    gb_per_s: f64,
) -> ClusterProfile {
    let mut c = cluster.clone();
    c.node_links.set(from, to, gb_per_s);
    c
}

#[test]
fn a_degraded_pipeline_link_costs_what_the_formula_says() {
    // tp 8 inside each node, pp 2 across the two nodes: every tp rank's activation crosses
    // n00 → n01 and its gradient n01 → n00.
    let (model, training) = preset("gpt3-1.3b");
    let training = with_batch(training, 64);
    let cluster = common::example_cluster("a100-2x8.json");
    let config = ParallelConfig::even(24, 8, 2, 1, 1);
    let placement = Placement::identity(16, 8);
    let healthy = run(
        &model,
        &training,
        &config,
        &cluster,
        &placement,
        TimeModel::Pipette,
    )
    .unwrap();
    let b = cluster.node_links.get(0, 1);
    let degraded_bw = (b / 3.0 * 1e6).round() / 1e6;
    let degraded = with_node_link(&cluster, 0, 1, degraded_bw);
    let slow = run(
        &model,
        &training,
        &config,
        &degraded,
        &placement,
        TimeModel::Pipette,
    )
    .unwrap();

    // The formula: ⌈m / pp⌉ passes × activation bytes × (1/B' − 1/B).
    let m = 64u64;
    let passes = m.div_ceil(2) as f64;
    let message = 2048.0 * 1.0 * 2048.0 * 2.0; // s · b · h · bf16
    let expected = passes * message * (1.0 / degraded_bw - 1.0 / b) / 1e6;
    let delta = slow.iteration_ms - healthy.iteration_ms;
    assert!(
        close(delta, expected),
        "delta {delta} ms, formula {expected} ms"
    );
    assert_eq!(slow.pipeline.hops[0].activation.gb_per_s, degraded_bw);
    assert_eq!(slow.pipeline.hops[0].activation.from.host, "a100-n00");
    assert_eq!(
        slow.pipeline.hops[0].gradient.gb_per_s,
        cluster.node_links.get(1, 0)
    );
    // Nothing else moved.
    assert_eq!(slow.steady_ms, healthy.steady_ms);
    assert_eq!(slow.bubble_ms, healthy.bubble_ms);

    // Pipette's published formula: ⌊m/pp⌋ × 2 × message / B per hop, forward link only.
    let c0 = run(
        &model,
        &training,
        &config,
        &cluster,
        &placement,
        TimeModel::PipetteCompat,
    )
    .unwrap();
    let c1 = run(
        &model,
        &training,
        &config,
        &degraded,
        &placement,
        TimeModel::PipetteCompat,
    )
    .unwrap();
    let expected = (m / 2) as f64 * 2.0 * message / 1e9 * (1.0 / degraded_bw - 1.0 / b) * 1e3;
    assert!(close(c1.iteration_ms - c0.iteration_ms, expected));

    // AMP: the activation once, as 4-byte elements.
    let a0 = run(
        &model,
        &training,
        &config,
        &cluster,
        &placement,
        TimeModel::Amp,
    )
    .unwrap();
    let a1 = run(
        &model,
        &training,
        &config,
        &degraded,
        &placement,
        TimeModel::Amp,
    )
    .unwrap();
    let expected = 2048.0 * 2048.0 * 4.0 * (1.0 / degraded_bw - 1.0 / b) / 1e6;
    assert!(close(a1.iteration_ms - a0.iteration_ms, expected));
}

#[test]
fn a_degraded_link_on_the_measured_fabric_costs_what_the_formula_says() {
    // One pipeline of 16 stages through the 16 measured nodes (tp 8 inside each).
    let (model, training) = preset("gpt3-6.7b");
    let training = with_batch(training, 48);
    let cluster = mpigraph();
    let config = ParallelConfig::even(32, 8, 16, 1, 1);
    let placement = Placement::identity(128, 8);
    let before = run(
        &model,
        &training,
        &config,
        &cluster,
        &placement,
        TimeModel::Pipette,
    )
    .unwrap();
    let b = cluster.node_links.get(5, 6);
    let degraded_bw = 2.5;
    let after = run(
        &model,
        &training,
        &config,
        &with_node_link(&cluster, 5, 6, degraded_bw),
        &placement,
        TimeModel::Pipette,
    )
    .unwrap();
    let passes = 48u64.div_ceil(16) as f64;
    let message = 2048.0 * 4096.0 * 2.0;
    let expected = passes * message * (1.0 / degraded_bw - 1.0 / b) / 1e6;
    let delta = after.iteration_ms - before.iteration_ms;
    assert!(
        close(delta, expected),
        "delta {delta} ms, formula {expected} ms"
    );
    assert_eq!(after.pipeline.hops[5].activation.gb_per_s, degraded_bw);
    assert_eq!(after.pipeline.hops[5].activation.from.host, "agpu1505");
}

#[test]
fn tensor_parallelism_belongs_inside_a_node_in_all_three_models() {
    let (model, training) = preset("gpt3-1.3b");
    let training = with_batch(training, 64);
    let cluster = common::example_cluster("a100-2x8.json");
    let config = ParallelConfig::even(24, 8, 2, 1, 1);
    let inside = Placement::identity(16, 8);
    // Rank r on node r % 2: every tp group straddles both nodes.
    let across = Placement {
        devices: (0..16)
            .map(|r| Device {
                node: r % 2,
                gpu: r / 2,
            })
            .collect(),
    };
    for m in TimeModel::ALL {
        let a = run(&model, &training, &config, &cluster, &inside, m).unwrap();
        let b = run(&model, &training, &config, &cluster, &across, m).unwrap();
        assert!(
            a.iteration_ms < b.iteration_ms,
            "{m}: {} vs {}",
            a.iteration_ms,
            b.iteration_ms
        );
    }
    let a = run(
        &model,
        &training,
        &config,
        &cluster,
        &inside,
        TimeModel::Pipette,
    )
    .unwrap();
    let b = run(
        &model,
        &training,
        &config,
        &cluster,
        &across,
        TimeModel::Pipette,
    )
    .unwrap();
    assert!(a.stages[0].tp_link.as_ref().unwrap().intra_node);
    assert!(!b.stages[0].tp_link.as_ref().unwrap().intra_node);
}

#[test]
fn the_slowest_link_of_the_data_parallel_ring_governs() {
    // tp 8 in each node, dp 4 over the four nodes of the degraded fabric. In node order the
    // ring crosses a100-n02 → a100-n03, one direction degraded to 13.69 GB/s; ordered
    // n00, n03, n02, n01 it uses only healthy links.
    let (model, training) = preset("gpt3-1.3b");
    let training = with_batch(training, 64);
    let cluster = common::example_cluster("a100-4x8-degraded.json");
    let config = ParallelConfig::even(24, 8, 1, 4, 1);
    let in_order = Placement::identity(32, 8);
    let reordered = Placement {
        devices: [0, 3, 2, 1]
            .into_iter()
            .flat_map(|node| (0..8).map(move |gpu| Device { node, gpu }))
            .collect(),
    };
    let slow = run(
        &model,
        &training,
        &config,
        &cluster,
        &in_order,
        TimeModel::Pipette,
    )
    .unwrap();
    let fast = run(
        &model,
        &training,
        &config,
        &cluster,
        &reordered,
        TimeModel::Pipette,
    )
    .unwrap();
    let link = &slow.data_parallel.bottleneck.as_ref().unwrap().link;
    assert_eq!(
        (
            link.from.host.as_str(),
            link.to.host.as_str(),
            link.gb_per_s
        ),
        ("a100-n02", "a100-n03", cluster.node_links.get(2, 3))
    );
    let l = &cluster.node_links;
    let healthy = l
        .get(0, 3)
        .min(l.get(3, 2))
        .min(l.get(2, 1))
        .min(l.get(1, 0));
    assert_eq!(
        fast.data_parallel
            .bottleneck
            .as_ref()
            .unwrap()
            .link
            .gb_per_s,
        healthy
    );
    // The difference is the all-reduce's: 2 (d − 1)/d × gradient bytes × (1/B − 1/B').
    let grad = slow.data_parallel.grad_bytes;
    let expected = 2.0 * 0.75 * grad * (1.0 / l.get(2, 3) - 1.0 / healthy) / 1e6;
    assert!(close(slow.iteration_ms - fast.iteration_ms, expected));
}

#[test]
fn the_three_models_agree_on_obvious_orderings() {
    let (model, training) = preset("gpt3-1.3b");
    let training = with_batch(training, 64);
    // Perfect links: every GPU pair 300 GB/s, every node pair 50 GB/s.
    let mut perfect = common::example_cluster("h100-16x8.json");
    let n = perfect.nodes.len();
    perfect.node_links = LinkMatrix::uniform(n, 50.0, Provenance::new(Source::Estimated));
    for node in &mut perfect.nodes {
        if let GpuInventory::Known { links, .. } = &mut node.gpus {
            *links = LinkMatrix::uniform(8, 300.0, Provenance::new(Source::Estimated));
        }
    }
    // More GPUs (dp 1 → 2 → 4) with perfect links: faster.
    let mut previous = [f64::INFINITY; 3];
    for dp in [1u64, 2, 4] {
        let config = ParallelConfig::even(24, 8, 2, dp, 1);
        let placement = Placement::identity(16 * dp as usize, 8);
        for (i, m) in TimeModel::ALL.into_iter().enumerate() {
            let e = run(&model, &training, &config, &perfect, &placement, m).unwrap();
            assert!(e.iteration_ms < previous[i], "{m} dp {dp}");
            previous[i] = e.iteration_ms;
        }
    }
    // The same placement on a degraded fabric: never faster.
    let degraded = common::example_cluster("a100-4x8-degraded.json");
    let mut healthy = degraded.clone();
    healthy.node_links = LinkMatrix::uniform(4, 24.0, Provenance::new(Source::Estimated));
    let config = ParallelConfig::even(24, 8, 2, 2, 1);
    let placement = Placement::identity(32, 8);
    for m in TimeModel::ALL {
        let h = run(&model, &training, &config, &healthy, &placement, m).unwrap();
        let d = run(&model, &training, &config, &degraded, &placement, m).unwrap();
        assert!(h.iteration_ms < d.iteration_ms, "{m}");
    }
}

#[test]
fn a_mixed_cluster_is_governed_by_its_slow_gpus() {
    let (model, training) = preset("gpt3-1.3b");
    let cluster = common::example_cluster("a100-v100-mixed-4x8.json");
    let config = ParallelConfig::even(24, 8, 4, 1, 1);
    let placement = Placement::identity(32, 8);
    // bf16 cannot run on the V100 nodes.
    let err = run(
        &model,
        &training,
        &config,
        &cluster,
        &placement,
        TimeModel::Pipette,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("v100-n00 GPU 0 (V100-SXM2-32GB) has no bf16 tensor cores"),
        "{err}"
    );
    let training = TrainingSettings {
        precision: Precision::Fp16,
        ..with_batch(training, 64)
    };
    let e = run(
        &model,
        &training,
        &config,
        &cluster,
        &placement,
        TimeModel::Pipette,
    )
    .unwrap();
    let names: Vec<&str> = e
        .stages
        .iter()
        .map(|s| s.gpu.as_ref().unwrap().name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "A100-SXM4-80GB",
            "A100-SXM4-80GB",
            "V100-SXM2-32GB",
            "V100-SXM2-32GB"
        ]
    );
    assert_eq!(e.critical_stage, 3);
    // The V100's GEMMs take 2.5 × as long (125 against 312 TFLOPS), its memory-bound
    // kernels 1.8 × (900 against 1600 GB/s); the fixed cost per kernel is the same.
    let ratio = e.stages[2].forward_ms / e.stages[0].forward_ms;
    assert!(ratio > 1.5 && ratio < 2.5, "{ratio}");
}

/// `nodes` copies of the example DGX-A100-like node (8 × A100 at about 240 GB/s), every node
/// pair at the example's 23.5 GB/s (one HDR NIC per GPU).
fn a100_nodes(nodes: usize) -> ClusterProfile {
    let mut c = common::example_cluster("a100-2x8.json");
    let template = c.nodes[0].clone();
    c.nodes = (0..nodes)
        .map(|i| {
            let mut node = template.clone();
            node.host = format!("a100-n{i:02}");
            node
        })
        .collect();
    c.node_links = LinkMatrix::uniform(nodes, 23.5, Provenance::new(Source::Estimated));
    c
}

/// Regression test for the one-efficiency compute model: with every GEMM at one rate and no
/// fixed costs, the micro-batch barely moved the estimate without a pipeline, while the
/// measured runs get much faster with larger micro-batches (thin GEMMs at tp 8, per-kernel
/// and per-collective costs paid per micro-batch). vTrain's ground_truth_multi.csv
/// (data/vtrain, MIT): 3.6B (hidden 3072, 32 heads, 30 layers, seq 2048), 64 A100,
/// tp 8 dp 8 pp 1, global batch 512: micro-batch 2, 4, 8, 16 measured 8880.9, 5618.0,
/// 5178.0, 5017.8 ms.
#[test]
fn the_micro_batch_sweep_at_tp_8_comes_out_in_the_measured_order() {
    let (base, training) = preset("gpt3-1.3b");
    let model = ModelSpec {
        num_layers: 30,
        hidden_size: 3072,
        ffn_hidden_size: 4 * 3072,
        num_attention_heads: 32,
        num_query_groups: 32,
        kv_channels: 96,
        seq_length: 2048,
        max_position_embeddings: 2048,
        ..base
    };
    let training = with_batch(training, 512);
    let cluster = a100_nodes(8);
    let placement = Placement::identity(64, 8);
    let measured = [(2, 8880.9), (4, 5618.0), (8, 5178.0), (16, 5017.8)];
    let predicted: Vec<f64> = measured
        .iter()
        .map(|&(mb, _)| {
            let config = ParallelConfig::even(30, 8, 1, 8, mb);
            let e = run(
                &model,
                &training,
                &config,
                &cluster,
                &placement,
                TimeModel::Pipette,
            )
            .unwrap();
            check_terms(&e);
            e.iteration_ms
        })
        .collect();
    for i in 1..measured.len() {
        assert!(
            predicted[i] < predicted[i - 1],
            "micro-batch {} predicted {:.0} ms, not faster than micro-batch {} at {:.0} ms (measured {} and {} ms)",
            measured[i].0,
            predicted[i],
            measured[i - 1].0,
            predicted[i - 1],
            measured[i].1,
            measured[i - 1].1
        );
    }
    // Not by a rounding error: micro-batch 2 is clearly slower than 16 (measured 1.77 ×).
    let ratio = predicted[0] / predicted[3];
    assert!(ratio > 1.1, "micro-batch 2 / 16 = {ratio:.3}");
}

#[test]
fn imported_profiles_need_gpus_first() {
    let path = common::shared_mpigraph_path();
    let raw = ClusterProfile::load(&path).unwrap();
    let (model, training) = preset("gpt3-1.3b");
    let config = ParallelConfig::even(24, 1, 1, 1, 1);
    let err = run(
        &model,
        &training,
        &config,
        &raw,
        &Placement::identity(1, 1),
        TimeModel::Pipette,
    )
    .unwrap_err();
    assert!(
        matches!(err, TimeError::UnknownGpus { ref host } if host == "agpu1475"),
        "{err}"
    );
}

// Monotone in bandwidth: raising any one link never raises any model's estimate, and the
// fast path agrees with the report.

#[derive(Debug, Clone)]
struct Setup {
    nodes: usize,
    per_node: usize,
    node_links: Vec<f64>,
    gpu_links: Vec<f64>,
    tp: u64,
    pp: u64,
    dp: u64,
    vpp: bool,
    sp: bool,
    dist: bool,
    overlap: bool,
    order: Vec<usize>,
}

impl Setup {
    fn cluster(&self) -> ClusterProfile {
        let p = Provenance::new(Source::Estimated);
        let rows = |cells: &[f64], n: usize| -> Vec<Vec<f64>> {
            (0..n).map(|i| cells[i * n..(i + 1) * n].to_vec()).collect()
        };
        let mut c = common::example_cluster("a100-2x8.json");
        let template = c.nodes[0].clone();
        c.nodes = (0..self.nodes)
            .map(|i| {
                let mut node = template.clone();
                node.host = format!("n{i}");
                let GpuInventory::Known { gpus, .. } = &template.gpus else {
                    unreachable!()
                };
                let pp2 = self.per_node * self.per_node;
                node.gpus = GpuInventory::Known {
                    gpus: gpus[..self.per_node].to_vec(),
                    links: LinkMatrix::from_rows(
                        &rows(&self.gpu_links[i * pp2..(i + 1) * pp2], self.per_node),
                        p.clone(),
                    )
                    .unwrap(),
                };
                node
            })
            .collect();
        c.node_links = LinkMatrix::from_rows(&rows(&self.node_links, self.nodes), p).unwrap();
        c
    }

    fn config(&self) -> ParallelConfig {
        let mut config = ParallelConfig::even(8 * self.pp, self.tp, self.pp, self.dp, 1);
        config.vpp = (self.vpp && self.pp > 1).then_some(2);
        config.sequence_parallel = self.sp;
        config.distributed_optimizer = self.dist;
        config
    }

    fn placement(&self) -> Placement {
        let all: Vec<Device> = (0..self.nodes)
            .flat_map(|node| (0..self.per_node).map(move |gpu| Device { node, gpu }))
            .collect();
        let world = (self.tp * self.pp * self.dp) as usize;
        Placement {
            devices: self.order[..world].iter().map(|&i| all[i]).collect(),
        }
    }
}

fn setup() -> impl Strategy<Value = Setup> {
    (1usize..=4, 1usize..=4)
        .prop_flat_map(|(nodes, per_node)| {
            let gpus = nodes * per_node;
            let dims = (1u64..=4, 1u64..=4, 1u64..=4)
                .prop_filter("fits the cluster", move |(t, p, d)| {
                    (t * p * d) as usize <= gpus
                });
            (
                Just(nodes),
                Just(per_node),
                prop::collection::vec(5.0f64..60.0, nodes * nodes),
                prop::collection::vec(20.0f64..400.0, nodes * per_node * per_node),
                dims,
                any::<(bool, bool, bool, bool)>(),
                Just((0..gpus).collect::<Vec<_>>()).prop_shuffle(),
            )
        })
        .prop_map(
            |(
                nodes,
                per_node,
                node_links,
                gpu_links,
                (tp, pp, dp),
                (vpp, sp, dist, overlap),
                order,
            )| {
                Setup {
                    nodes,
                    per_node,
                    node_links,
                    gpu_links,
                    tp,
                    pp,
                    dp,
                    vpp,
                    sp,
                    dist,
                    overlap,
                    order,
                }
            },
        )
}

fn all_models(setup: &Setup, cluster: &ClusterProfile) -> Vec<f64> {
    let model = ModelSpec {
        num_layers: 8 * setup.pp,
        hidden_size: 512,
        ffn_hidden_size: 2048,
        num_attention_heads: 8,
        num_query_groups: 8,
        kv_channels: 64,
        seq_length: 512,
        max_position_embeddings: 512,
        ..preset("gpt3-1.3b").0
    };
    let training = with_batch(preset("gpt3-1.3b").1, 8 * setup.dp);
    let config = setup.config();
    let placement = setup.placement();
    let options = TimeOptions {
        overlap_grad_reduce: setup.overlap,
        overlap_param_gather: setup.overlap,
        ..TimeOptions::default()
    };
    let calibration = Calibration::default();
    let request = TimeRequest {
        model: &model,
        training: &training,
        config: &config,
        cluster,
        placement: &placement,
        calibration: &calibration,
        options,
    };
    let fabric = ClusterFabric::new(cluster, training.precision, &calibration).unwrap();
    let costs = ConfigCosts::new(&model, &training, &config, &calibration, &options).unwrap();
    let fast = costs.evaluate(&fabric, &placement.devices);
    let mut out: Vec<f64> = TimeModel::ALL
        .into_iter()
        .map(|m| estimate(&request, m).unwrap().iteration_ms)
        .collect();
    assert_eq!(fast, out[0], "fast path and report disagree");
    out.push(fast);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn raising_any_link_never_raises_an_estimate(
        setup in setup(),
        pick in any::<prop::sample::Index>(),
        factor in 1.0f64..8.0,
    ) {
        let before = all_models(&setup, &setup.cluster());
        let mut raised = setup.clone();
        let node_cells = raised.node_links.len();
        let i = pick.index(node_cells + raised.gpu_links.len());
        if i < node_cells {
            raised.node_links[i] *= factor;
        } else {
            raised.gpu_links[i - node_cells] *= factor;
        }
        let after = all_models(&raised, &raised.cluster());
        for (k, (b, a)) in before.iter().zip(&after).enumerate() {
            prop_assert!(a <= b, "model {k}: {b} ms before, {a} ms after raising link {i} by {factor}");
        }
    }
}

/// Kendall's tau-a of two equally long lists (1: the same order, −1: reversed).
fn kendall_tau(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len();
    let mut score = 0.0;
    for i in 0..n {
        for j in i + 1..n {
            score += ((a[i] - a[j]) * (b[i] - b[j])).signum();
        }
    }
    score / (n * (n - 1) / 2) as f64
}

/// Issue 30: the Megatron MoE Model Zoo's context-parallel sweep (Qwen3-235B-A22B on 32
/// nodes of 8 H100, tp 4, pp 8, vp 4, global batch 256, sequences of 16K to 128K tokens at
/// cp 1, 2, 4, 8; data/moe/dev.json, MIT), each routing of it ranked as measured
/// (Kendall tau ≥ 0.8) and its fastest named or within 5 %.
///
/// The time model has no expert terms on this branch: the MoE MLP stands in as a dense
/// MLP of the routed experts' active width (top-k × expert ffn = 8 × 1536), whose work
/// per token is the same, and ep is left at 1. What the sweep tests is how the sequence,
/// the attention and the context-parallel exchange scale, which that leaves as they are.
#[test]
fn the_context_parallel_sweep_ranks_as_measured() {
    let text = std::fs::read_to_string(common::repo().join("data/moe/dev.json")).unwrap();
    let dev: serde_json::Value = serde_json::from_str(&text).unwrap();
    let source = dev["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "megatron_moe_modelzoo_qwen3")
        .expect("the Model Zoo source");
    let cluster =
        common::example_cluster("h100-128x8.json").at_positions(&(0..32).collect::<Vec<_>>());
    for routing in ["forced-balance", "dropless"] {
        let rows: Vec<&serde_json::Value> = source["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["routing"] == routing && r["gpu"] == "H100")
            .collect();
        assert_eq!(
            rows.len(),
            4,
            "{routing}: the sweep has 16K, 32K, 64K and 128K"
        );
        let mut measured = Vec::new();
        let mut predicted = Vec::new();
        for row in &rows {
            let seq = row["seq_len"].as_u64().unwrap();
            let cp = row["cp"].as_u64().unwrap();
            let (tp, pp) = (row["tp"].as_u64().unwrap(), row["pp"].as_u64().unwrap());
            let s = seq.to_string();
            let args: Vec<String> = [
                "--num-layers",
                "94",
                "--hidden-size",
                "4096",
                "--ffn-hidden-size",
                "12288",
                "--num-attention-heads",
                "64",
                "--group-query-attention",
                "--num-query-groups",
                "4",
                "--kv-channels",
                "128",
                "--swiglu",
                "--qk-layernorm",
                "--normalization",
                "RMSNorm",
                "--position-embedding-type",
                "rope",
                "--disable-bias-linear",
                "--untie-embeddings-and-output-weights",
                "--vocab-size",
                "151936",
                "--seq-length",
                &s,
                "--max-position-embeddings",
                &s,
                "--global-batch-size",
                "256",
                "--micro-batch-size",
                "1",
                "--bf16",
                "--overlap-grad-reduce",
                "--overlap-param-gather",
            ]
            .iter()
            .map(|a| a.to_string())
            .collect();
            let settings = settings_from_megatron_args(&args, None, &[]).unwrap();
            let dp = 256 / (tp * cp * pp);
            let mut config = ParallelConfig::even(94, tp, pp, dp, 1);
            config.layers_per_stage = vec![11, 12, 12, 12, 12, 12, 12, 11];
            config.cp = cp;
            config.vpp = Some(row["vp"].as_u64().unwrap());
            config.sequence_parallel = true;
            config.distributed_optimizer = true;
            let placement = Placement::identity(256, 8);
            let e = run(
                &settings.model,
                &settings.training,
                &config,
                &cluster,
                &placement,
                TimeModel::Pipette,
            )
            .unwrap_or_else(|e| panic!("{}: {e}", row["id"]));
            let flops = pipette::model::flops::megatron_reported_flops(&settings.model, 256, tp);
            predicted.push(flops / (e.iteration_ms / 1e3) / 256.0 / 1e12);
            measured.push(row["model_tflops_per_gpu"].as_f64().unwrap());
            if cp > 1 {
                assert!(
                    e.stages.iter().all(|st| st.cp_comm_ms >= 0.0),
                    "{}",
                    row["id"]
                );
            }
        }
        let tau = kendall_tau(&measured, &predicted);
        let best_measured = (0..4)
            .max_by(|&a, &b| measured[a].total_cmp(&measured[b]))
            .unwrap();
        let named = (0..4)
            .max_by(|&a, &b| predicted[a].total_cmp(&predicted[b]))
            .unwrap();
        eprintln!(
            "{routing}: measured {measured:?} TFLOP/s, predicted {predicted:.0?}, tau {tau:.2}"
        );
        assert!(tau >= 0.8, "{routing}: Kendall tau {tau:.2} < 0.8");
        assert!(
            measured[named] >= 0.95 * measured[best_measured],
            "{routing}: named {} ({} TFLOP/s), fastest measured {} ({})",
            rows[named]["id"],
            measured[named],
            rows[best_measured]["id"],
            measured[best_measured]
        );
    }
}

/// Context parallelism's exchange (issue 30): on one node's NVLink the p2p ring's
/// key/value steps hide behind the attention they overlap, while allgather's and a2a's
/// collectives block; across nodes the p2p ring costs what it cannot hide.
#[test]
fn the_context_parallel_exchange_hides_behind_attention_where_it_can() {
    let (model, training) = preset("llama3-8b");
    let model = ModelSpec {
        seq_length: 65_536,
        max_position_embeddings: 65_536,
        ..model
    };
    let cluster = common::example_cluster("h100-16x8.json").at_positions(&[0, 1, 2, 3]);
    let placement = Placement::identity(32, 8);
    let mut config = ParallelConfig::even(32, 2, 1, 4, 1);
    config.cp = 4;
    config.sequence_parallel = true;
    let exchange = |config: &ParallelConfig, comm: CpCommType| {
        let training = TrainingSettings {
            cp_comm_type: comm,
            ..with_batch(training.clone(), 16)
        };
        let e = run(
            &model,
            &training,
            config,
            &cluster,
            &placement,
            TimeModel::Pipette,
        )
        .unwrap_or_else(|e| panic!("{comm:?}: {e}"));
        (e.stages[0].cp_comm_ms, e.iteration_ms)
    };
    let (p2p, p2p_ms) = exchange(&config, CpCommType::P2p);
    let (gather, gather_ms) = exchange(&config, CpCommType::Allgather);
    let (a2a, _) = exchange(&config, CpCommType::A2a);
    assert_eq!(p2p, 0.0, "in-node ring steps are hidden");
    assert!(gather > 0.0 && a2a > 0.0, "allgather {gather}, a2a {a2a}");
    assert!(gather_ms > p2p_ms);
    // cp 16 over four nodes: the ring crosses InfiniBand.
    let mut wide = ParallelConfig::even(32, 2, 1, 1, 1);
    wide.cp = 16;
    wide.sequence_parallel = true;
    let (across, _) = exchange(&wide, CpCommType::P2p);
    assert!(across > 0.0, "a ring over the network shows");
    // The Pipette-compat model refuses what it cannot price.
    let err = run(
        &model,
        &with_batch(training, 16),
        &config,
        &cluster,
        &placement,
        TimeModel::PipetteCompat,
    )
    .unwrap_err();
    assert!(err.to_string().contains("context parallelism"), "{err}");
}
