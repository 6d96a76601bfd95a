//! Unit tests of the time models on small synthetic clusters, every expected figure worked
//! out by hand from the formulas in the module docs.

use super::*;
use crate::cluster::profile::{
    AllRails, GpuInventory, GpuSpec, LinkMatrix, MeasuredTflops, NodeProfile, PeakTflops,
    Provenance, Source,
};
use crate::config::{
    Normalization, PositionEmbedding, Precision, Recompute, RecomputeMethod, TrainingSettings,
};
use crate::model::flops::{stage_flops, AttentionMask};
use crate::model::memory::AttentionKernel;
use crate::model::params::ParameterBreakdown;
use crate::model::time::perf::{self, GpuKind, PerfTable, PerfTables};

fn gpu(name: &str, bf16: Option<f64>, fp16: f64) -> GpuSpec {
    GpuSpec {
        index: 0,
        name: name.into(),
        memory_bytes: 80 << 30,
        peak_tflops: PeakTflops::new(bf16, fp16),
        measured_tflops: Vec::new(),
        provenance: Provenance::new(Source::Datasheet),
    }
}

fn a100() -> GpuSpec {
    gpu("A100-SXM4-80GB", Some(312.0), 312.0)
}

/// `nodes` nodes of `per_node` GPUs, every GPU pair at `intra` GB/s, every node pair at
/// `inter`.
fn cluster(nodes: usize, per_node: usize, intra: f64, inter: f64) -> ClusterProfile {
    let p = Provenance::new(Source::Estimated);
    ClusterProfile {
        measured_perf: Vec::new(),
        note: None,
        nodes: (0..nodes)
            .map(|n| NodeProfile {
                host: format!("n{n}"),
                gpus: GpuInventory::Known {
                    gpus: (0..per_node)
                        .map(|i| GpuSpec {
                            index: i as u32,
                            ..a100()
                        })
                        .collect(),
                    links: LinkMatrix::uniform(per_node, intra, p.clone()),
                },
                nvlink_domain: None,
            })
            .collect(),
        node_links: LinkMatrix::uniform(nodes, inter, p),
    }
}

fn gpt() -> ModelSpec {
    ModelSpec {
        preset: None,
        num_layers: 8,
        hidden_size: 1024,
        ffn_hidden_size: 4096,
        num_attention_heads: 16,
        num_query_groups: 16,
        kv_channels: 64,
        seq_length: 1024,
        max_position_embeddings: 1024,
        vocab_size: 32000,
        make_vocab_size_divisible_by: 128,
        swiglu: false,
        untie_embeddings_and_output_weights: false,
        normalization: Normalization::LayerNorm,
        add_bias_linear: true,
        add_qkv_bias: true,
        position_embedding: PositionEmbedding::LearnedAbsolute,
        moe: None,
        mla: None,
        mtp_layers: 0,
        qk_layernorm: false,
    }
}

fn training(global: u64) -> TrainingSettings {
    TrainingSettings::new(global, Precision::Bf16)
}

struct Case {
    model: ModelSpec,
    training: TrainingSettings,
    config: ParallelConfig,
    cluster: ClusterProfile,
    placement: Placement,
    calibration: Calibration,
    options: TimeOptions,
}

impl Case {
    fn new(cluster: ClusterProfile, config: ParallelConfig, global: u64) -> Self {
        let per_node = cluster.nodes[0].gpus().unwrap().len();
        Case {
            model: gpt(),
            training: training(global),
            placement: Placement::identity(config.world_size() as usize, per_node),
            config,
            cluster,
            // No host floor: these cases check the GPU's side of a slot term by term
            // (`host_floor_bounds_tiny_slots` checks the floor).
            calibration: Calibration {
                host_layer_pass_ms: 0.0,
                ..Calibration::default()
            },
            options: TimeOptions::default(),
        }
    }

    fn request(&self) -> TimeRequest<'_> {
        TimeRequest {
            model: &self.model,
            training: &self.training,
            config: &self.config,
            cluster: &self.cluster,
            placement: &self.placement,
            calibration: &self.calibration,
            options: self.options,
        }
    }

    fn run(&self, model: TimeModel) -> TimeEstimate {
        estimate(&self.request(), model).unwrap()
    }

    fn fast(&self) -> f64 {
        let fabric =
            ClusterFabric::new(&self.cluster, self.training.precision, &self.calibration).unwrap();
        let costs = ConfigCosts::new(
            &self.model,
            &self.training,
            &self.config,
            &self.calibration,
            &self.options,
        )
        .unwrap();
        costs.evaluate(&fabric, &self.placement.devices)
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn terms_add_up(e: &TimeEstimate) {
    let sum = e.steady_ms
        + e.bubble_ms
        + e.pipeline_p2p_ms
        + e.data_parallel_exposed_ms
        + e.param_gather_exposed_ms
        + e.optimizer_ms;
    assert!(close(sum, e.iteration_ms), "{sum} vs {}", e.iteration_ms);
}

/// ms to run `flops` on one A100 at the default efficiency (the nominal rate: the
/// compatibility models' compute and the overlap windows).
fn a100_ms(flops: f64) -> f64 {
    flops / (312.0 * 0.45) / 1e9
}

/// The shipped A100 table's latency of one collective over `t` GPUs, ms: vTrain's measured
/// all-reduce latency for that group size (data/perf/a100.json: 40.0 µs for 2 GPUs, 49.5
/// for 4), the all-gather and reduce-scatter in SimuMax's ratio to the all-reduce at 8
/// GPUs (4.83 and 15.64 to 8.98 µs).
fn latency_ms(share_of_all_reduce: f64, t: f64) -> f64 {
    let all_reduce = match t as u32 {
        2 => 40.0,
        4 => 49.5,
        other => panic!("no latency for {other} GPUs in this test"),
    };
    all_reduce * share_of_all_reduce / 1e3
}
const ALL_REDUCE: f64 = 1.0;
const ALL_GATHER: f64 = 4.83 / 8.98;
const REDUCE_SCATTER: f64 = 15.64 / 8.98;
const P2P_MS: f64 = 0.010;

#[test]
fn one_gpu_is_compute_only() {
    let case = Case::new(
        cluster(1, 1, 240.0, 23.5),
        ParallelConfig::even(8, 1, 1, 1, 2),
        16,
    );
    let e = case.run(TimeModel::Pipette);
    let flops = stage_flops(&case.model, &case.config, 0, AttentionMask::Causal);
    assert_eq!(e.microbatches, 8);
    let stage = &e.stages[0];
    assert!(close(e.iteration_ms, 8.0 * stage.slot_ms + e.optimizer_ms));
    // The optimizer step: bf16 Adam moves 38 bytes a parameter and zeroes its fp32
    // gradient (4), at the A100 table's 1600 GB/s × 0.91.
    let params = ParameterBreakdown::new(&case.model, 1).stage(8, true, true) as f64;
    assert!(close(e.optimizer_ms, params * 42.0 / (1600.0 * 0.91 * 1e6)));
    assert!(close(stage.slot_ms, stage.forward_ms + stage.backward_ms));
    assert_eq!(e.bubble_ms, 0.0);
    assert_eq!(e.pipeline_p2p_ms, 0.0);
    assert_eq!(e.data_parallel_exposed_ms, 0.0);
    // Per-operation costs: never faster than the FLOPs at the A100 table's best measured
    // efficiency (0.7918 of 312 TFLOPS, data/perf/a100.json), and slower than that by the
    // thin GEMMs and the memory-bound kernels.
    let best = flops.forward / (312.0 * 0.7918) / 1e9;
    assert!(stage.forward_ms > best, "{} vs {best}", stage.forward_ms);
    assert!(
        stage.forward_ms < 3.0 * best,
        "{} vs {best}",
        stage.forward_ms
    );
    assert!(stage.backward_ms > 2.0 * best);
    assert_eq!(
        e.stages[0].gpu.as_ref().unwrap().basis,
        ThroughputBasis::Peak
    );
    assert_eq!(e.iteration_ms, case.fast());
    terms_add_up(&e);
}

#[test]
fn pipeline_hop_is_paid_once_per_group_of_pp_microbatches() {
    // Two one-GPU nodes with asymmetric links: activations go 0 → 1 at 20 GB/s,
    // gradients come back 1 → 0 at 10 GB/s.
    let mut c = cluster(2, 1, 240.0, 20.0);
    c.node_links.set(1, 0, 10.0);
    for m in [1u64, 2, 5, 8] {
        let case = Case::new(c.clone(), ParallelConfig::even(8, 1, 2, 1, 1), m);
        let e = case.run(TimeModel::Pipette);
        let msg = 1024.0 * 1024.0 * 2.0; // s·b·h bf16 bytes
        let pass = msg / 20e9 * 1e3 + msg / 10e9 * 1e3 + 2.0 * P2P_MS;
        assert_eq!(e.pipeline.passes, m.div_ceil(2));
        assert!(close(e.pipeline.per_pass_ms, pass));
        assert!(close(e.pipeline_p2p_ms, m.div_ceil(2) as f64 * pass));
        let slot = e.stages.iter().map(|s| s.slot_ms).fold(0.0, f64::max);
        assert_eq!(e.critical_stage, 1, "the last stage has the logits");
        assert!(close(e.steady_ms, m as f64 * slot));
        assert!(close(e.bubble_ms, slot));
        assert_eq!(e.pipeline.hops[0].activation.gb_per_s, 20.0);
        assert_eq!(e.pipeline.hops[0].gradient.gb_per_s, 10.0);
        assert!(!e.pipeline.hops[0].activation.intra_node);
        assert_eq!(e.iteration_ms, case.fast());
        terms_add_up(&e);
    }
}

#[test]
fn tensor_parallel_ring_takes_the_slowest_link() {
    // tp 4 in one node, one GPU pair slowed to 50 GB/s.
    let mut c = cluster(1, 4, 200.0, 23.5);
    if let GpuInventory::Known { links, .. } = &mut c.nodes[0].gpus {
        links.set(2, 3, 50.0);
    }
    let case = Case::new(c, ParallelConfig::even(8, 4, 1, 1, 1), 4);
    let e = case.run(TimeModel::Pipette);
    let stage = &e.stages[0];
    let link = stage.tp_link.as_ref().unwrap();
    assert_eq!((link.from.gpu, link.to.gpu, link.gb_per_s), (2, 3, 50.0));
    // One stage, first and last: 4·8 + 2 half-all-reduce units each way (no SP).
    let message = 1024.0 * 1024.0 * 2.0;
    let units = (4.0 * 8.0 + 2.0) * 2.0;
    // Latency: 2 all-reduces per layer each way, one for the embedding and one for the
    // output layer.
    let expected = units * 0.75 * message / 50e9 * 1e3 + 34.0 * latency_ms(ALL_REDUCE, 4.0);
    assert!(close(stage.tp_comm_ms, expected), "{}", stage.tp_comm_ms);
    assert_eq!(stage.tp_comm_hidden_ms, 0.0);

    // --tp-comm-overlap hides the calibrated share, but no more than the GEMMs it overlaps
    // the collectives with last (`tp_comm_overlap_hides_no_more_than_the_overlapped_gemms_last`).
    let mut overlapped = case;
    overlapped.options.tp_comm_overlap = true;
    let o = overlapped.run(TimeModel::Pipette);
    let fabric = ClusterFabric::new(
        &overlapped.cluster,
        Precision::Bf16,
        &overlapped.calibration,
    )
    .unwrap();
    let gemms = ConfigCosts::new(
        &overlapped.model,
        &overlapped.training,
        &overlapped.config,
        &overlapped.calibration,
        &overlapped.options,
    )
    .unwrap()
    .tp_overlap_ops[GpuKind::A100.index()]
    .ms(fabric
        .gpu_perf(Device { node: 0, gpu: 0 })
        .ms_per_peak_gflop);
    let hidden = (0.5 * expected).min(gemms);
    assert!(close(o.stages[0].tp_comm_ms, expected - hidden));
    assert!(close(o.stages[0].tp_comm_hidden_ms, hidden));
    assert_eq!(o.iteration_ms, overlapped.fast());
}

/// `--tp-comm-overlap` hides the calibrated share of the tp collectives, but no more than
/// the GEMMs Transformer Engine overlaps them with last (every layer's linear layers, here
/// dense): over a slow link the collectives outlast them, and in FP8, whose GEMMs are
/// `low_precision_speedup` times shorter, more of the same collectives stays exposed.
#[test]
fn tp_comm_overlap_hides_no_more_than_the_overlapped_gemms_last() {
    // tp 4 in one node of H100s over 5 GB/s links.
    let mut c = cluster(1, 4, 5.0, 23.5);
    if let GpuInventory::Known { gpus, .. } = &mut c.nodes[0].gpus {
        for g in gpus.iter_mut() {
            g.name = "NVIDIA H100 80GB HBM3".into();
            g.peak_tflops = PeakTflops::new(Some(989.4), 989.4);
        }
    }
    let mut config = ParallelConfig::even(8, 4, 1, 1, 1);
    config.sequence_parallel = true;
    let mut case = Case::new(c, config, 4);
    case.options.tp_comm_overlap = true;
    let fabric = ClusterFabric::new(&case.cluster, Precision::Bf16, &case.calibration).unwrap();
    let ms_per_gflop = fabric
        .gpu_perf(Device { node: 0, gpu: 0 })
        .ms_per_peak_gflop;
    let h100 = GpuKind::H100.index();
    let gemms = |case: &Case| {
        ConfigCosts::new(
            &case.model,
            &case.training,
            &case.config,
            &case.calibration,
            &case.options,
        )
        .unwrap()
        .tp_overlap_ops[h100]
            .ms(ms_per_gflop)
    };
    let bf16_gemms = gemms(&case);
    let bf16 = case.run(TimeModel::Pipette);
    let bf16_fast = case.fast();
    case.training.low_precision = Some(fp8(false, 0));
    let fp8_gemms = gemms(&case);
    let fp8 = case.run(TimeModel::Pipette);
    let speedup = GpuKind::H100
        .low_precision_speedup(crate::config::LowBits::Fp8)
        .unwrap();
    assert!(close(fp8_gemms * speedup, bf16_gemms));
    for (e, gemms, fast) in [
        (&bf16, bf16_gemms, bf16_fast),
        (&fp8, fp8_gemms, case.fast()),
    ] {
        let stage = &e.stages[0];
        let total = stage.tp_comm_ms + stage.tp_comm_hidden_ms;
        // Half the collectives would outlast the GEMMs: those hide, the rest is exposed.
        assert!(0.5 * total > gemms, "{total} {gemms}");
        assert!(close(stage.tp_comm_hidden_ms, gemms));
        assert_eq!(e.iteration_ms, fast);
    }
    assert!(fp8.stages[0].tp_comm_hidden_ms < bf16.stages[0].tp_comm_hidden_ms);
}

#[test]
fn sequence_parallelism_keeps_tp_volume_and_shrinks_pipeline_messages() {
    let mut config = ParallelConfig::even(8, 2, 2, 1, 1);
    let plain = Case::new(cluster(2, 2, 200.0, 20.0), config.clone(), 4).run(TimeModel::Pipette);
    config.sequence_parallel = true;
    let sp = Case::new(cluster(2, 2, 200.0, 20.0), config, 4).run(TimeModel::Pipette);
    assert_eq!(
        sp.pipeline.message_bytes * 2.0,
        plain.pipeline.message_bytes
    );
    // The same volume; the latency of 17 all-gather + reduce-scatter pairs replaces that
    // of 17 all-reduces per stage (4 layers: 8 each way, and the embedding or the logits).
    let pairs = 17.0
        * (latency_ms(ALL_GATHER, 2.0) + latency_ms(REDUCE_SCATTER, 2.0)
            - latency_ms(ALL_REDUCE, 2.0));
    for (a, b) in plain.stages.iter().zip(&sp.stages) {
        assert!(close(b.tp_comm_ms - a.tp_comm_ms, pairs));
    }
}

#[test]
fn tp_inside_a_node_beats_tp_across_nodes() {
    // tp 2 × pp 2 on two nodes of two GPUs: the identity placement keeps each tp pair on a
    // node; the transposed one splits every tp pair over the two nodes.
    let config = ParallelConfig::even(8, 2, 2, 1, 1);
    let mut case = Case::new(cluster(2, 2, 200.0, 20.0), config, 8);
    let inside = case.run(TimeModel::Pipette);
    case.placement.devices = vec![
        Device { node: 0, gpu: 0 },
        Device { node: 1, gpu: 0 },
        Device { node: 0, gpu: 1 },
        Device { node: 1, gpu: 1 },
    ];
    let across = case.run(TimeModel::Pipette);
    assert!(inside.iteration_ms < across.iteration_ms);
    assert!(inside.stages[0].tp_link.as_ref().unwrap().intra_node);
    assert!(!across.stages[0].tp_link.as_ref().unwrap().intra_node);
    assert!(across.pipeline.hops[0].activation.intra_node);
    // The volume takes 10 × as long at 20 GB/s as at 200; the latency (17 all-reduces on
    // the first stage) stays.
    let latency = 17.0 * latency_ms(ALL_REDUCE, 2.0);
    assert!(close(
        (across.stages[0].tp_comm_ms - latency) / (inside.stages[0].tp_comm_ms - latency),
        10.0
    ));
}

#[test]
fn tp_ring_across_nodes_spreads_over_the_nics() {
    // tp 4 over two nodes of two GPUs (pp 1): two ring hops cross the nodes. With the NICs
    // unknown each crossing attains one node link (20 GB/s); with 4 NICs per node the group
    // holds both GPUs of each node, so it gets 4 × 2/2 links' worth: 80 GB/s.
    let config = ParallelConfig::even(8, 4, 1, 1, 1);
    let mut case = Case::new(cluster(2, 2, 200.0, 20.0), config, 4);
    let one = case.run(TimeModel::Pipette);
    case.cluster.node_links.nics_per_node = Some(4);
    let four = case.run(TimeModel::Pipette);
    let latency = 34.0 * latency_ms(ALL_REDUCE, 4.0);
    assert!(close(
        (one.stages[0].tp_comm_ms - latency) / (four.stages[0].tp_comm_ms - latency),
        4.0
    ));
    assert_eq!(four.iteration_ms, case.fast());
    assert_eq!(four.stages[0].tp_link.as_ref().unwrap().gb_per_s, 80.0);
    // One NIC for the two GPUs of a node, both in the group: one link, as when unknown.
    case.cluster.node_links.nics_per_node = Some(1);
    let shared = case.run(TimeModel::Pipette);
    assert!(close(
        (shared.stages[0].tp_comm_ms - latency) / (one.stages[0].tp_comm_ms - latency),
        1.0
    ));
}

#[test]
fn tp_ring_across_nodes_gets_what_the_rails_attained_at_once() {
    // As above, 4 NICs per node: the tp ring's crossings get 4 × 2/2 = 4 links' worth
    // (80 GB/s) while the rails are taken to add up. Measured at once they attained half
    // of 4 × 20 GB/s (a shared PCIe switch): the crossings get 2 links, 40 GB/s, and the
    // transfer takes twice as long. A share under one NIC is left alone, and the rails
    // never bring a crossing below the one link measured alone.
    let config = ParallelConfig::even(8, 4, 1, 1, 1);
    let mut case = Case::new(cluster(2, 2, 200.0, 20.0), config, 4);
    case.cluster.node_links.nics_per_node = Some(4);
    let ideal = case.run(TimeModel::Pipette);
    let rails = |gb_per_s: f64| {
        Some(AllRails {
            rails: 4,
            gb_per_s,
            one_rail_gb_per_s: 20.0,
        })
    };
    case.cluster.node_links.set_all_rails(rails(80.0));
    assert_eq!(
        case.run(TimeModel::Pipette),
        ideal,
        "k rails attained k × one"
    );
    case.cluster.node_links.set_all_rails(rails(40.0));
    let half = case.run(TimeModel::Pipette);
    assert_eq!(half.stages[0].tp_link.as_ref().unwrap().gb_per_s, 40.0);
    let latency = 34.0 * latency_ms(ALL_REDUCE, 4.0);
    assert!(close(
        (half.stages[0].tp_comm_ms - latency) / (ideal.stages[0].tp_comm_ms - latency),
        2.0
    ));
    assert!(half.iteration_ms > ideal.iteration_ms);
    case.cluster.node_links.set_all_rails(rails(8.0));
    let floor = case.run(TimeModel::Pipette);
    assert_eq!(floor.stages[0].tp_link.as_ref().unwrap().gb_per_s, 20.0);
    // One NIC for both GPUs of a node: one link, measured rails or not.
    case.cluster.node_links.nics_per_node = Some(1);
    case.cluster.node_links.set_all_rails(None);
    let one = case.run(TimeModel::Pipette);
    case.cluster.node_links.set_all_rails(rails(40.0));
    assert_eq!(case.run(TimeModel::Pipette), one);
}

#[test]
fn data_parallel_ring_bottleneck_and_overlap() {
    // dp 4 over four one-GPU nodes; node 2 → node 3 degraded to 5 GB/s.
    let mut c = cluster(4, 1, 240.0, 20.0);
    c.node_links.set(2, 3, 5.0);
    let mut case = Case::new(c, ParallelConfig::even(8, 1, 1, 4, 1), 16);
    let e = case.run(TimeModel::Pipette);
    let params = ParameterBreakdown::new(&case.model, 1).stage(8, true, true) as f64;
    let grad_bytes = params * 4.0; // bf16 reduces fp32 gradients
    let reduce = 2.0 * 0.75 * grad_bytes / 5e9 * 1e3;
    let dp = &e.data_parallel;
    assert_eq!(dp.collective, "all-reduce");
    assert_eq!(dp.grad_bytes, grad_bytes);
    assert!(close(dp.reduce_ms, reduce));
    assert_eq!(dp.reduce_overlap_ms, 0.0);
    assert!(close(e.data_parallel_exposed_ms, reduce));
    let link = &dp.bottleneck.as_ref().unwrap().link;
    assert_eq!(
        (link.from.host.as_str(), link.to.host.as_str()),
        ("n2", "n3")
    );
    assert_eq!(e.iteration_ms, case.fast());
    terms_add_up(&e);

    // --overlap-grad-reduce: 0.9 of one backward pass (its FLOPs at the GPU's nominal
    // rate) is credited, never more than the reduce itself.
    case.options.overlap_grad_reduce = true;
    let o = case.run(TimeModel::Pipette);
    let flops = stage_flops(&case.model, &case.config, 0, AttentionMask::Causal);
    let backward = a100_ms(flops.backward + flops.recompute);
    let credit = (0.9 * backward).min(reduce);
    assert!(close(o.data_parallel.reduce_overlap_ms, credit));
    assert!(close(o.data_parallel_exposed_ms, reduce - credit));
    assert!(close(o.overlap_credited_ms, credit));
    assert!(close(e.iteration_ms - o.iteration_ms, credit));
    assert_eq!(o.iteration_ms, case.fast());
}

#[test]
fn data_parallel_ring_across_nodes_spreads_over_the_nics() {
    // tp 2 × dp 4 over two nodes of four GPUs: each node holds two replicas, and the two
    // dp rings (one per tp rank) cross the nodes at once. With 4 NICs per node each ring
    // gets 4 × (4 / 2) / 4 = 2 links' worth: the reduce takes half as long; with one NIC
    // the rings share it (a half each), slower than the one link the model assumes when
    // the NICs are not known.
    let config = ParallelConfig::even(8, 2, 1, 4, 1);
    let mut case = Case::new(cluster(2, 4, 240.0, 20.0), config, 16);
    let unknown = case.run(TimeModel::Pipette).data_parallel;
    case.cluster.node_links.nics_per_node = Some(4);
    let four = case.run(TimeModel::Pipette);
    assert!(close(unknown.reduce_ms / four.data_parallel.reduce_ms, 2.0));
    let link = &four.data_parallel.bottleneck.as_ref().unwrap().link;
    assert_eq!(link.gb_per_s, 40.0, "the ring's attained figure");
    assert_eq!(four.iteration_ms, case.fast());
    case.cluster.node_links.nics_per_node = Some(1);
    let one = case.run(TimeModel::Pipette).data_parallel;
    assert!(close(one.reduce_ms / unknown.reduce_ms, 2.0));
}

#[test]
fn distributed_optimizer_reduce_scatters_then_gathers() {
    let mut config = ParallelConfig::even(8, 1, 1, 2, 1);
    config.distributed_optimizer = true;
    let mut case = Case::new(cluster(2, 1, 240.0, 20.0), config, 8);
    let e = case.run(TimeModel::Pipette);
    let params = ParameterBreakdown::new(&case.model, 1).stage(8, true, true) as f64;
    let dp = &e.data_parallel;
    assert_eq!(dp.collective, "reduce-scatter");
    assert!(close(dp.reduce_ms, 0.5 * params * 4.0 / 20e9 * 1e3));
    assert!(close(dp.param_gather_ms, 0.5 * params * 2.0 / 20e9 * 1e3));
    assert!(close(e.param_gather_exposed_ms, dp.param_gather_ms));
    // The optimizer step runs on each GPU's half of the state (38 bytes a parameter for
    // bf16 Adam), but every GPU zeroes its whole fp32 gradient buffer (4).
    let hbm = 1600.0 * 0.91 * 1e6;
    assert!(close(e.optimizer_ms, params * (38.0 / 2.0 + 4.0) / hbm));
    terms_add_up(&e);

    case.options.overlap_param_gather = true;
    case.options.grad_reduce_in_bf16 = true;
    let o = case.run(TimeModel::Pipette);
    assert!(close(
        o.data_parallel.reduce_ms,
        0.5 * params * 2.0 / 20e9 * 1e3
    ));
    let flops = stage_flops(&case.model, &case.config, 0, AttentionMask::Causal);
    let credit = (0.9 * a100_ms(flops.forward)).min(o.data_parallel.param_gather_ms);
    assert!(close(o.data_parallel.param_gather_overlap_ms, credit));
    assert_eq!(o.iteration_ms, case.fast());
    terms_add_up(&o);
}

#[test]
fn interleaving_shrinks_the_bubble_and_multiplies_the_hops() {
    let mut config = ParallelConfig::even(8, 1, 4, 1, 1);
    let plain_case = Case::new(cluster(4, 1, 240.0, 20.0), config.clone(), 8);
    let plain = plain_case.run(TimeModel::Pipette);
    config.vpp = Some(2);
    let case = Case::new(cluster(4, 1, 240.0, 20.0), config, 8);
    let e = case.run(TimeModel::Pipette);
    let slot = e.stages[e.critical_stage].slot_ms;
    assert!(close(e.bubble_ms, 1.5 * slot));
    assert!(close(plain.bubble_ms, 3.0 * slot));
    // Each pass: the three hops twice, plus the wrap-around hop from stage 3 to 0 once.
    let hop = plain.pipeline.hops[0].ms;
    assert!(close(e.pipeline.per_pass_ms, 2.0 * 3.0 * hop + hop));
    assert_eq!(e.pipeline.hops.len(), 4);
    assert_eq!(e.pipeline.hops[3].from_stage, 3);
    assert_eq!(e.pipeline.hops[3].times, 1);
    assert_eq!(e.iteration_ms, case.fast());
    terms_add_up(&e);
}

#[test]
fn unfused_attention_moves_the_scores_through_hbm() {
    // tp 2, micro-batch 1: per GPU 8 of the 16 heads, 1024 × 1024 scores each.
    let config = ParallelConfig::even(8, 2, 1, 1, 1);
    let mut case = Case::new(cluster(1, 2, 200.0, 20.0), config, 4);
    let fused = case.run(TimeModel::Pipette);
    case.options.attention = AttentionKernel::Unfused;
    let unfused = case.run(TimeModel::Pipette);
    assert_eq!(unfused.iteration_ms, case.fast());
    let (f, u) = (&fused.stages[0], &unfused.stages[0]);
    let a100 = PerfTable::get(GpuKind::A100);
    let scores = 8.0 * 1024.0 * 1024.0 * case.config.micro_batch as f64;
    // 2 bytes per fp16/bf16 score: 9 bytes forward, 11 backward, per layer; the full score
    // matrix's GEMMs on top (flash attention skips the masked half).
    let hbm_ms = |bytes: f64| bytes / (a100.hbm_gb_per_s * 1e6);
    assert!(u.forward_ms - f.forward_ms > 8.0 * hbm_ms(9.0 * scores));
    assert!(u.backward_ms - f.backward_ms > 8.0 * hbm_ms(11.0 * scores));
    assert_eq!(u.tp_comm_ms, f.tp_comm_ms);
}

#[test]
fn recomputation_lengthens_the_backward_pass() {
    let mut config = ParallelConfig::even(8, 2, 1, 1, 1);
    let base = Case::new(cluster(1, 2, 200.0, 20.0), config.clone(), 4).run(TimeModel::Pipette);
    config.recompute = Recompute::Full {
        method: RecomputeMethod::Uniform,
        num_layers: 1,
    };
    let full = Case::new(cluster(1, 2, 200.0, 20.0), config, 4).run(TimeModel::Pipette);
    let (b, f) = (&base.stages[0], &full.stages[0]);
    assert_eq!(b.recompute_ms, 0.0);
    assert!(f.recompute_ms > 0.0);
    assert!(close(f.backward_ms, b.backward_ms + f.recompute_ms));
    assert!(
        f.tp_comm_ms > b.tp_comm_ms,
        "full recompute redoes the collectives"
    );
}

#[test]
fn slowest_gpu_governs_a_mixed_stage_and_measured_figures_win() {
    let mut c = cluster(1, 2, 100.0, 10.0);
    if let GpuInventory::Known { gpus, .. } = &mut c.nodes[0].gpus {
        gpus[1] = GpuSpec {
            index: 1,
            ..gpu("V100-SXM2-32GB", None, 125.0)
        };
    }
    let mut case = Case::new(c, ParallelConfig::even(8, 2, 1, 1, 1), 4);
    case.training.precision = Precision::Fp16;
    let e = case.run(TimeModel::Pipette);
    let g = e.stages[0].gpu.as_ref().unwrap();
    assert_eq!(g.name, "V100-SXM2-32GB");
    assert!(close(g.tflops, 125.0 * 0.45));

    // bf16 cannot run on the V100.
    case.training.precision = Precision::Bf16;
    let err = estimate(&case.request(), TimeModel::Pipette).unwrap_err();
    assert_eq!(
        err.to_string(),
        "n0 GPU 1 (V100-SXM2-32GB) has no bf16 tensor cores (train with --fp16, or leave the node out)"
    );
    // ...but the fast path still answers, with an infinite time.
    let fabric = ClusterFabric::new(&case.cluster, Precision::Bf16, &case.calibration).unwrap();
    let costs = ConfigCosts::new(
        &case.model,
        &case.training,
        &case.config,
        &case.calibration,
        &case.options,
    )
    .unwrap();
    assert_eq!(
        costs.evaluate(&fabric, &case.placement.devices),
        f64::INFINITY
    );

    // A measured figure for the training dtype replaces peak × efficiency.
    if let GpuInventory::Known { gpus, .. } = &mut case.cluster.nodes[0].gpus {
        gpus[1] = GpuSpec { index: 1, ..a100() };
        for g in gpus.iter_mut() {
            g.measured_tflops = vec![crate::cluster::profile::MeasuredTflops {
                dtype: Dtype::Bf16,
                tflops: 250.0,
                provenance: Provenance::new(Source::Measured),
            }];
        }
    }
    let m = case.run(TimeModel::Pipette);
    let g = m.stages[0].gpu.as_ref().unwrap();
    assert_eq!((g.tflops, g.basis), (250.0, ThroughputBasis::Measured));
}

#[test]
fn fp32_runs_at_a_sixteenth_of_the_fp16_peak() {
    let mut case = Case::new(
        cluster(1, 1, 1.0, 1.0),
        ParallelConfig::even(8, 1, 1, 1, 1),
        1,
    );
    case.training.precision = Precision::Fp32;
    let e = case.run(TimeModel::Pipette);
    let g = e.stages[0].gpu.as_ref().unwrap();
    assert_eq!(g.basis, ThroughputBasis::Fp32FromFp16Peak);
    assert!(close(g.tflops, 312.0 / 16.0 * 0.45));
    assert!(e.notes.iter().any(|n| n.contains("fp32")));

    // A datasheet A100 with a measured bf16 figure: that figure is no fp32 rate, so fp32
    // still runs at a sixteenth of the fp16 peak, in the per-operation rate too.
    if let GpuInventory::Known { gpus, .. } = &mut case.cluster.nodes[0].gpus {
        gpus[0].measured_tflops = vec![MeasuredTflops {
            dtype: Dtype::Bf16,
            tflops: 250.0,
            provenance: Provenance::new(Source::Measured),
        }];
    }
    let e = case.run(TimeModel::Pipette);
    let g = e.stages[0].gpu.as_ref().unwrap();
    assert_eq!(g.basis, ThroughputBasis::Fp32FromFp16Peak);
    assert!(close(g.tflops, 312.0 / 16.0 * 0.45));
    let fabric = ClusterFabric::new(&case.cluster, Precision::Fp32, &case.calibration).unwrap();
    let perf = fabric.gpu_perf(Device { node: 0, gpu: 0 });
    assert!(close(perf.ms_per_peak_gflop, 16.0 / 312.0));
}

/// A CPU stand-in as the profile records it: its "peak" is its best attained matmul, and
/// it carries its bf16 and fp32 figures.
fn cpu_stand_in() -> GpuSpec {
    let measured = |dtype, tflops| MeasuredTflops {
        dtype,
        tflops,
        provenance: Provenance::new(Source::Measured),
    };
    GpuSpec {
        measured_tflops: vec![measured(Dtype::Bf16, 0.018), measured(Dtype::Fp32, 0.149)],
        provenance: Provenance::new(Source::Measured),
        ..gpu("cpu", Some(0.149), 0.149)
    }
}

/// Regression: a CPU stand-in trained in fp32 was taken at 1/16 of its "fp16 peak" (its
/// best attained matmul), 16 times too slow (scripts/demo estimated ~2.4 s an iteration
/// that ran in ~0.3 s). Its measured fp32 figure governs, in both the throughput and the
/// per-operation rate; bf16 training keeps its bf16 figure.
#[test]
fn a_cpu_stand_in_trained_in_fp32_runs_at_its_measured_fp32_rate() {
    let mut cluster = cluster(1, 1, 1.0, 1.0);
    if let GpuInventory::Known { gpus, .. } = &mut cluster.nodes[0].gpus {
        gpus[0] = cpu_stand_in();
    }
    let mut case = Case::new(cluster, ParallelConfig::even(8, 1, 1, 1, 1), 1);
    case.training.precision = Precision::Fp32;
    let e = case.run(TimeModel::Pipette);
    let g = e.stages[0].gpu.as_ref().unwrap();
    assert_eq!((g.tflops, g.basis), (0.149, ThroughputBasis::Measured));
    assert!(!e.notes.iter().any(|n| n.contains("1/16")), "{:?}", e.notes);
    let fabric = ClusterFabric::new(&case.cluster, Precision::Fp32, &case.calibration).unwrap();
    let best = fabric.tables().get(GpuKind::Other).best_efficiency;
    let perf = fabric.gpu_perf(Device { node: 0, gpu: 0 });
    assert!(close(perf.ms_per_peak_gflop, best / 0.149));

    case.training.precision = Precision::Bf16;
    let e = case.run(TimeModel::Pipette);
    let g = e.stages[0].gpu.as_ref().unwrap();
    assert_eq!((g.tflops, g.basis), (0.018, ThroughputBasis::Measured));

    // A stand-in from a profile that kept no fp32 figure: its peak is a measured matmul
    // rate (its provenance says so), not a tensor-core peak, and stands as the fp32 rate.
    if let GpuInventory::Known { gpus, .. } = &mut case.cluster.nodes[0].gpus {
        gpus[0].measured_tflops.retain(|m| m.dtype == Dtype::Bf16);
    }
    case.training.precision = Precision::Fp32;
    let e = case.run(TimeModel::Pipette);
    let g = e.stages[0].gpu.as_ref().unwrap();
    assert_eq!((g.tflops, g.basis), (0.149, ThroughputBasis::Measured));
}

/// The MFU shown during training is held against a rate the job cannot beat: a datasheet
/// peak. A CPU stand-in's peak is its measured matmul rate, which a CPU job beat (its
/// summary said "MFU 107.13 %"): it gets no MFU. A GPU whose fp32 matmul was measured is
/// still held against its datasheet's fp32 figure.
#[test]
fn the_mfu_peak_is_a_datasheet_bound_never_a_measured_rate() {
    let cpu = cpu_stand_in();
    assert_eq!(mfu_peak_tflops(&cpu, Precision::Fp32), None);
    assert_eq!(mfu_peak_tflops(&cpu, Precision::Bf16), None);
    let mut a100 = a100();
    assert_eq!(mfu_peak_tflops(&a100, Precision::Bf16), Some(312.0));
    assert_eq!(mfu_peak_tflops(&a100, Precision::Fp32), Some(312.0 / 16.0));
    a100.measured_tflops.push(MeasuredTflops {
        dtype: Dtype::Fp32,
        tflops: 30.0,
        provenance: Provenance::new(Source::Measured),
    });
    assert_eq!(mfu_peak_tflops(&a100, Precision::Fp32), Some(312.0 / 16.0));
    // A GPU with no bf16 tensor cores has no bf16 peak to hold a job against.
    let v100 = gpu("Tesla V100-SXM2-32GB", None, 125.0);
    assert_eq!(mfu_peak_tflops(&v100, Precision::Bf16), None);
}

/// A sweep measured in fp32 governs fp32 training, its efficiencies as shares of the
/// GPU's measured fp32 rate, so the measured GEMM throughputs come back as they were.
#[test]
fn an_fp32_sweep_prices_fp32_gemms_at_their_measured_throughput() {
    use crate::cluster::profile::{GemmFigure, GemmLayout, MeasuredPerf};
    let mut cluster = cluster(1, 1, 1.0, 1.0);
    if let GpuInventory::Known { gpus, .. } = &mut cluster.nodes[0].gpus {
        gpus[0] = cpu_stand_in();
    }
    let gemm = |m, tflops| GemmFigure {
        m,
        n: 512,
        k: 512,
        layout: GemmLayout::Fwd,
        tflops,
    };
    cluster.measured_perf.push(MeasuredPerf {
        gpu: "cpu".into(),
        dtype: Dtype::Fp32,
        shape_set: "test".into(),
        gemms: vec![gemm(512, 0.12), gemm(64, 0.03)],
        attention: Vec::new(),
        hbm_gb_per_s: None,
        collectives: Vec::new(),
        provenance: Provenance::new(Source::Measured),
    });
    let tables = PerfTables::for_cluster(&cluster, Dtype::Fp32);
    let table = tables.get(GpuKind::Other);
    assert!(table.measured.is_some());
    let e = table.gemm_efficiency(64.0, 512.0, 512.0, perf::Layout::Fwd);
    assert!(close(e.value, 0.03 / 0.149));
    let fabric = ClusterFabric::new(&cluster, Precision::Fp32, &Calibration::default()).unwrap();
    assert!(close(
        fabric
            .gpu_perf(Device { node: 0, gpu: 0 })
            .ms_per_peak_gflop,
        1.0 / 0.149
    ));
    // Trained in bf16, the fp32 section does not govern.
    assert!(PerfTables::for_cluster(&cluster, Dtype::Bf16)
        .get(GpuKind::Other)
        .measured
        .is_none());
}

#[test]
fn errors_name_the_problem_on_one_line() {
    let good = Case::new(
        cluster(2, 2, 200.0, 20.0),
        ParallelConfig::even(8, 2, 2, 1, 1),
        4,
    );
    let check = |case: &Case, expected: &str| {
        let err = estimate(&case.request(), TimeModel::Pipette)
            .unwrap_err()
            .to_string();
        assert_eq!(err, expected);
        assert!(!err.contains('\n'));
    };

    let mut case = Case::new(cluster(2, 2, 200.0, 20.0), good.config.clone(), 4);
    case.cluster.nodes[1].gpus = GpuInventory::Unknown;
    check(&case, "node n1 has no GPU inventory (profile the cluster, or fill in default GPUs for an imported profile)");

    let mut case = Case::new(good.cluster.clone(), good.config.clone(), 4);
    case.placement.devices.pop();
    check(
        &case,
        "the placement lists 3 GPUs for 4 ranks (tp × pp × dp)",
    );
    case.placement.devices.push(Device { node: 0, gpu: 1 });
    check(&case, "ranks 1 and 3 are both placed on GPU #1 of n0");
    case.placement.devices[3] = Device { node: 1, gpu: 2 };
    check(&case, "rank 3 is placed on GPU #2 of n1, which has 2 GPUs");
    case.placement.devices[3] = Device { node: 5, gpu: 0 };
    check(
        &case,
        "rank 3 is placed on node #5, but the cluster has 2 nodes",
    );

    let mut case = Case::new(good.cluster.clone(), good.config.clone(), 4);
    case.config.layers_per_stage = vec![8, 0];
    check(
        &case,
        "cannot cost this configuration: pipeline stage 1 has no layers (use fewer stages)",
    );
    case.config.layers_per_stage = vec![4, 3];
    check(
        &case,
        "cannot cost this configuration: the stages hold 7 layers, the model has 8",
    );
    case.config.layers_per_stage = vec![8];
    check(
        &case,
        "cannot cost this configuration: 1 layer counts for 2 pipeline stages",
    );
    let mut case = Case::new(good.cluster.clone(), good.config.clone(), 4);
    case.config.micro_batch = 8;
    check(&case, "cannot cost this configuration: global batch 4 is smaller than micro-batch 8 × dp 1 (no micro-batch per pipeline)");

    let mut case = Case::new(good.cluster.clone(), good.config.clone(), 4);
    case.calibration.compute_efficiency = 0.0;
    check(
        &case,
        "calibration compute_efficiency is 0 (give a fraction in (0, 1])",
    );
    case.calibration.compute_efficiency = 0.5;
    case.calibration.grad_reduce_overlap = 1.5;
    check(
        &case,
        "calibration grad_reduce_overlap is 1.5 (give a fraction in [0, 1])",
    );
}

#[test]
fn time_model_names_round_trip() {
    for m in TimeModel::ALL {
        assert_eq!(m.as_str().parse::<TimeModel>().unwrap(), m);
        assert_eq!(serde_json::to_value(m).unwrap(), m.as_str());
    }
    assert_eq!(TimeModel::default(), TimeModel::Pipette);
    assert!("megatron"
        .parse::<TimeModel>()
        .unwrap_err()
        .contains("pipette-compat"));
}

#[test]
fn estimate_serialises_every_term() {
    let case = Case::new(
        cluster(2, 2, 200.0, 20.0),
        ParallelConfig::even(8, 2, 1, 2, 1),
        4,
    );
    for model in TimeModel::ALL {
        let e = case.run(model);
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["model"], model.as_str());
        for key in [
            "iteration_ms",
            "steady_ms",
            "bubble_ms",
            "pipeline_p2p_ms",
            "data_parallel_exposed_ms",
            "param_gather_exposed_ms",
            "overlap_credited_ms",
            "stages",
            "pipeline",
            "data_parallel",
        ] {
            assert!(json.get(key).is_some(), "{model}: {key} missing");
        }
        assert!(json["iteration_ms"].as_f64().unwrap() > 0.0);
        terms_add_up(&e);
    }
}

#[test]
fn pipette_compat_follows_the_published_formula() {
    // 4 nodes × 2 GPUs, tp 1, pp 2, dp 4: Pipette's inner dp = 2 / 1 = 2, inter = 4 / 2 = 2.
    let mut c = cluster(4, 2, 100.0, 20.0);
    c.node_links.set(0, 2, 8.0);
    // Stage 0 of replicas 0..4 on nodes 0, 0, 1, 1; stage 1 on nodes 2, 2, 3, 3.
    let mut case = Case::new(c, ParallelConfig::even(8, 1, 2, 4, 1), 20);
    let e = case.run(TimeModel::PipetteCompat);
    let p = case.run(TimeModel::Pipette);
    let m = 5u64;
    assert_eq!(e.microbatches, m);
    let slot = p.stages.iter().map(|s| s.slot_ms).fold(0.0, f64::max);
    // ⌊5/2⌋ = 2 groups: (pp − 1)(f + b) + 2 (pp (f + b) + C_pp); the fifth micro-batch is
    // dropped (quirk).
    let msg_gb = 1024.0 * 1024.0 * 2.0 / 1e9;
    let c_pp = 2.0 * msg_gb / 8.0 * 1e3; // replicas 0 and 1 hop 0 → 2 at 8 GB/s
    assert!(close(e.pipeline.per_pass_ms, c_pp));
    assert!(close(e.bubble_ms, slot));
    assert!(close(e.steady_ms, 2.0 * 2.0 * slot));
    assert!(close(e.pipeline_p2p_ms, 2.0 * c_pp));
    let h = 1024.0;
    let dp_msg = (h * 32000.0 + 4.0 * 16.0 * h * h) * 2.0 / 1e9;
    let inner = 2.0 * 1.0 * dp_msg / 100.0 / 2.0 * 1e3;
    let inter = 2.0 * 1.0 * dp_msg / 20.0 / 2.0 * 1e3; // ring of nodes 0 and 1
    assert!(close(e.data_parallel_exposed_ms, inner + inter));
    assert!(close(
        e.iteration_ms,
        slot + 2.0 * (2.0 * slot + c_pp) + inner + inter
    ));
    assert!(e.notes.iter().any(|n| n.contains("dropped")));
    terms_add_up(&e);

    // Fewer micro-batches than stages: (m − 1)(f + b) + pp (f + b) + C_pp.
    case.training.global_batch_size = 4;
    let one = case.run(TimeModel::PipetteCompat);
    assert!(close(one.iteration_ms, 2.0 * slot + c_pp + inner + inter));
}

#[test]
fn amp_follows_its_published_formula() {
    // 2 nodes × 2 GPUs, tp 1, pp 2, dp 2: stage 0 on node 0, stage 1 on node 1.
    let mut c = cluster(2, 2, 100.0, 20.0);
    c.node_links.set(0, 1, 10.0);
    let case = Case::new(c, ParallelConfig::even(8, 1, 2, 2, 1), 8);
    let e = case.run(TimeModel::Amp);
    let b = 4.0; // micro-batches
    let layer = crate::model::flops::LayerFlops::new(&case.model, 1, AttentionMask::Causal);
    let logits = crate::model::flops::logits_flops(&case.model, 1, 1);
    let len0 = 3.0 * a100_ms(4.0 * layer.total());
    let len1 = 3.0 * a100_ms(4.0 * layer.total() + logits);
    assert!(close(e.stages[0].slot_ms, len0));
    assert!(close(e.stages[1].slot_ms, len1));
    // The activation once, as 4-byte elements, over 0 → 1.
    let c01 = 1024.0 * 1024.0 * 4.0 / 10e9 * 1e3;
    assert!(close(e.pipeline_p2p_ms, c01));
    // dp ring: only the link from replica 1 back to replica 0, here inside a node.
    let h = 1024.0;
    let elements = 12.0 * h * h * 4.0 + h * 32000.0;
    let dp = 2.0 * 0.5 * elements * 4.0 / 100e9 * 1e3;
    assert!(close(e.data_parallel_exposed_ms, dp));
    assert!(close(
        e.iteration_ms,
        (b - 1.0) * len1 + len0 + len1 + c01 + dp
    ));
    terms_add_up(&e);
}

#[test]
fn report_and_fast_path_agree_bit_for_bit() {
    let shapes = [
        (2, 2, 2, None, false, false),
        (2, 1, 4, Some(2), true, false),
        (1, 4, 2, Some(2), false, true),
        (4, 2, 1, None, true, true),
        (1, 8, 1, Some(4), false, false),
    ];
    for (tp, pp, dp, vpp, sp, dist) in shapes {
        let mut c = cluster(4, 2, 150.0, 20.0);
        c.node_links.set(1, 2, 7.5);
        c.node_links.set(3, 0, 12.0);
        let mut config = ParallelConfig::even(8, tp, pp, dp, 1);
        config.vpp = vpp;
        config.sequence_parallel = sp;
        config.distributed_optimizer = dist;
        let mut case = Case::new(c, config, 16);
        case.options.overlap_grad_reduce = sp;
        case.options.overlap_param_gather = dist;
        // Reverse the placement so links are uneven.
        case.placement.devices.reverse();
        let e = case.run(TimeModel::Pipette);
        assert_eq!(e.iteration_ms, case.fast(), "tp {tp} pp {pp} dp {dp}");
        terms_add_up(&e);
    }
}

#[test]
fn stages_of_different_speed_and_layers_are_costed_each_and_the_slowest_governs() {
    // Three one-GPU nodes: a V100 between two A100s, fp16. Each stage's slot is its own
    // layers (and logits on the last) on its own GPU; the longest slot sets the steady
    // state and the bubble.
    let mut c = cluster(3, 1, 240.0, 20.0);
    if let GpuInventory::Known { gpus, .. } = &mut c.nodes[1].gpus {
        gpus[0] = gpu("V100-SXM2-32GB", None, 125.0);
    }
    let mut config = ParallelConfig::even(8, 1, 3, 1, 1);
    // (The logits weigh about 2.6 layers here.)
    for (layers, critical) in [([3, 2, 3], 2), ([2, 4, 2], 1), ([5, 1, 2], 0)] {
        config.layers_per_stage = layers.to_vec();
        let mut case = Case::new(c.clone(), config.clone(), 6);
        case.training.precision = Precision::Fp16;
        let e = case.run(TimeModel::Pipette);
        for (s, stage) in e.stages.iter().enumerate() {
            assert_eq!(stage.layers, layers[s]);
            assert!(
                close(stage.slot_ms, stage.forward_ms + stage.backward_ms),
                "{layers:?}"
            );
        }
        // The V100 (125 TFLOPS, 900 GB/s) is slower per layer than the A100 of stage 0 (312
        // TFLOPS, 1600 GB/s): its GEMMs take 2.5 × as long, its memory-bound kernels 1.8 ×,
        // the fixed cost per kernel is the same (stage 0 adds only the embedding lookup).
        let per_layer = |s: usize| e.stages[s].slot_ms / layers[s] as f64;
        assert!(per_layer(1) > 1.5 * per_layer(0), "{layers:?}");
        assert!(per_layer(1) < 2.5 * per_layer(0), "{layers:?}");
        let slowest = e.stages.iter().map(|s| s.slot_ms).fold(0.0, f64::max);
        assert_eq!(e.critical_stage, critical, "{layers:?}");
        assert!(close(e.steady_ms, 6.0 * slowest));
        assert!(close(e.bubble_ms, 2.0 * slowest));
        assert_eq!(e.iteration_ms, case.fast());
        terms_add_up(&e);
    }
}

#[test]
fn host_floor_bounds_tiny_slots() {
    // 8 layers, no recomputation: a slot issues 8 forward and 8 backward passes (a backward
    // counting two), 24 layer passes at 10 ms: far more than the GPU needs.
    let mut case = Case::new(
        cluster(1, 1, 240.0, 23.5),
        ParallelConfig::even(8, 1, 1, 1, 1),
        4,
    );
    case.calibration.host_layer_pass_ms = 10.0;
    let e = case.run(TimeModel::Pipette);
    let stage = &e.stages[0];
    assert!(close(stage.host_ms, 240.0));
    assert!(stage.forward_ms + stage.backward_ms < stage.host_ms);
    assert!(close(stage.slot_ms, 240.0));
    assert!(close(e.iteration_ms, 4.0 * 240.0 + e.optimizer_ms));
    assert_eq!(e.iteration_ms, case.fast());
    terms_add_up(&e);
    // A GPU busier than the host is not held back.
    case.calibration.host_layer_pass_ms = 1e-6;
    let e = case.run(TimeModel::Pipette);
    let stage = &e.stages[0];
    assert!(close(stage.slot_ms, stage.forward_ms + stage.backward_ms));
    // A negative floor is refused.
    case.calibration.host_layer_pass_ms = -1.0;
    assert!(matches!(
        estimate(&case.request(), TimeModel::Pipette),
        Err(TimeError::Calibration {
            field: "host_layer_pass_ms",
            ..
        })
    ));
}

#[test]
fn megatron_softmax_runs_fused_only_on_multiples_of_four_score_matrices() {
    use super::ops::fused_softmax_available;
    // 16 heads of 1024 tokens: tp 8 leaves 2 heads per GPU.
    let model = gpt();
    assert!(!fused_softmax_available(&model, 1, 8));
    assert!(fused_softmax_available(&model, 2, 8));
    assert!(fused_softmax_available(&model, 1, 4));
    assert!(!fused_softmax_available(&model, 3, 8));
    let long = ModelSpec {
        seq_length: 8192,
        max_position_embeddings: 8192,
        ..gpt()
    };
    assert!(!fused_softmax_available(&long, 4, 1), "over 4096 keys");
}

/// A layer shape of `model` at micro-batch `micro_batch` and tp `tp`: 16-bit activations,
/// fused attention with Megatron's softmax, no sequence parallelism, 16-bit GEMMs (a test
/// sets what it varies).
fn op_shape(model: &ModelSpec, micro_batch: u64, tp: u64) -> super::ops::OpShape<'_> {
    super::ops::OpShape {
        model,
        micro_batch,
        tp,
        sequence_parallel: false,
        act_bytes: 2.0,
        attention: AttentionKernel::Fused,
        fused_softmax: true,
        low_precision: None,
        context_parallel: 1,
    }
}

/// The operations of one layer of a middle stage (no embedding, no output layer, nothing
/// recomputed) of `shape`, priced on `table` at the default calibration.
fn one_middle_layer(shape: &super::ops::OpShape<'_>, table: &PerfTable) -> super::ops::StageOps {
    let stage = super::ops::StageShape {
        layers: 1,
        first: false,
        last: false,
        recomputed_layers: 0,
        selective: false,
        bf16_layers: 0,
    };
    super::ops::KindOps::new(shape, table, &Calibration::default()).stage(&stage)
}

#[test]
fn pytorch_softmax_costs_bytes_kernels_and_host_time() {
    use super::ops::{FALLBACK_SOFTMAX_EXTRA_KERNELS, MEGATRON_LAYER_PASS_OPS};
    let model = gpt();
    let table = PerfTable::get(GpuKind::A100);
    let calibration = Calibration::default();
    let unfused = |fused_softmax| super::ops::OpShape {
        attention: AttentionKernel::Unfused,
        fused_softmax,
        ..op_shape(&model, 1, 8)
    };
    let fused = one_middle_layer(&unfused(true), table);
    let torch = one_middle_layer(&unfused(false), table);
    // 2 heads of 1024 × 1024 scores; 28 more bytes per score forward, 34 more backward
    // (36 + 2e instead of 3e at e = 2), four more kernels each way.
    let scores = 2.0 * 1024.0 * 1024.0;
    let kernel_ms = table.memory_kernel_us * calibration.kernel_cost_scale / 1e3;
    let hbm = table.hbm_gb_per_s * 1e6;
    assert_eq!(torch.forward.gflop, fused.forward.gflop);
    assert!(close(
        torch.forward.fixed_ms - fused.forward.fixed_ms,
        scores * 28.0 / hbm + FALLBACK_SOFTMAX_EXTRA_KERNELS * kernel_ms
    ));
    assert!(close(
        torch.backward.fixed_ms - fused.backward.fixed_ms,
        scores * 34.0 / hbm + FALLBACK_SOFTMAX_EXTRA_KERNELS * kernel_ms
    ));

    // The host issues the extra operations too: at micro-batch 1 and tp 8 (two heads per
    // GPU) a layer's forward and backward add 4 + 4 operations to its 3 passes of 18.
    let mut case = Case::new(
        cluster(1, 8, 240.0, 23.5),
        ParallelConfig::even(8, 8, 1, 1, 1),
        4,
    );
    case.options.attention = AttentionKernel::Unfused;
    case.calibration.host_layer_pass_ms = 1.0;
    let slow = case.run(TimeModel::Pipette);
    let extra = 2.0 * FALLBACK_SOFTMAX_EXTRA_KERNELS / MEGATRON_LAYER_PASS_OPS;
    assert!(close(slow.stages[0].host_ms, 8.0 * (3.0 + extra)));
    assert!(slow
        .notes
        .iter()
        .any(|n| n.contains("PyTorch's fp32 softmax")));
    case.config = ParallelConfig::even(8, 8, 1, 1, 2);
    let fast = case.run(TimeModel::Pipette);
    assert!(close(fast.stages[0].host_ms, 8.0 * 3.0));
    assert!(!fast.notes.iter().any(|n| n.contains("softmax")));
}

#[test]
fn fp8_runs_the_linear_gemms_at_the_kinds_fp8_rate_and_pays_for_quantising() {
    use crate::config::LowBits;
    let model = gpt();
    let shape = |low_precision| super::ops::OpShape {
        sequence_parallel: true,
        low_precision,
        ..op_shape(&model, 1, 2)
    };
    let h100 = PerfTable::get(GpuKind::H100);
    let bf16 = one_middle_layer(&shape(None), h100);
    let fp8 = one_middle_layer(&shape(Some(LowBits::Fp8)), h100);
    // The attention core stays: only the linear share of the work shrinks, by 1.765.
    let linear_gflop = |o: &super::ops::StageOps| o.forward.gflop;
    let speedup = GpuKind::H100.low_precision_speedup(LowBits::Fp8).unwrap();
    assert!((speedup - 1402.6 / 794.5).abs() < 1e-12);
    assert!(linear_gflop(&fp8) < linear_gflop(&bf16));
    assert!(
        linear_gflop(&fp8) > linear_gflop(&bf16) / speedup,
        "attention stays bf16"
    );
    assert!(
        fp8.forward.fixed_ms > bf16.forward.fixed_ms,
        "quantisation kernels"
    );
    assert!(fp8.backward.fixed_ms > bf16.backward.fixed_ms);
    // No FP8 tensor cores on an A100: the same work as in BF16, nothing to quantise.
    let a100 = PerfTable::get(GpuKind::A100);
    assert_eq!(
        one_middle_layer(&shape(Some(LowBits::Fp8)), a100),
        one_middle_layer(&shape(None), a100)
    );
    // Blackwell: close to 2x, and FP4 twice that again.
    let b = GpuKind::of("NVIDIA B200");
    assert_eq!(b, GpuKind::Blackwell);
    let fp4 = b.low_precision_speedup(LowBits::Fp4).unwrap();
    assert!((fp4 / b.low_precision_speedup(LowBits::Fp8).unwrap() - 2.0).abs() < 1e-12);
}

#[test]
fn layers_kept_in_bf16_cost_a_bf16_layer_each_and_the_rest_stay_fp8() {
    use super::ops::{KindOps, StageShape};
    use crate::config::LowBits;
    let model = gpt();
    let shape = |low_precision| super::ops::OpShape {
        sequence_parallel: true,
        low_precision,
        ..op_shape(&model, 1, 2)
    };
    let h100 = PerfTable::get(GpuKind::H100);
    let calibration = Calibration::default();
    let stage = |layers, bf16_layers, recomputed_layers| StageShape {
        layers,
        first: false,
        last: false,
        recomputed_layers,
        selective: false,
        bf16_layers,
    };
    let fp8 = KindOps::new(&shape(Some(LowBits::Fp8)), h100, &calibration);
    let bf16 = KindOps::new(&shape(None), h100, &calibration);
    let mixed = fp8.with_bf16_layers(&shape(Some(LowBits::Fp8)), h100, &calibration);
    // Without BF16 layers in the stage nothing changes.
    assert_eq!(mixed.stage(&stage(4, 0, 0)), fp8.stage(&stage(4, 0, 0)));
    // One of four layers in BF16, all four recomputed: three FP8 layers and one BF16 layer,
    // forward, backward and recomputation alike.
    let got = mixed.stage(&stage(4, 1, 4));
    let (three, one) = (fp8.stage(&stage(3, 0, 3)), bf16.stage(&stage(1, 0, 1)));
    for (got, want) in [
        (got.forward, [three.forward, one.forward]),
        (got.backward, [three.backward, one.backward]),
        (got.recompute, [three.recompute, one.recompute]),
    ] {
        assert!(close(got.gflop, want[0].gflop + want[1].gflop));
        assert!(close(got.fixed_ms, want[0].fixed_ms + want[1].fixed_ms));
    }
    assert!(got.forward.gflop > fp8.stage(&stage(4, 0, 4)).forward.gflop);
    // More BF16 layers than the stage holds: the stage is all BF16, no more.
    assert_eq!(mixed.stage(&stage(2, 9, 0)), bf16.stage(&stage(2, 0, 0)));
}

#[test]
fn nodes_of_one_nvlink_domain_talk_at_nvlink_rates_over_no_nic() {
    // tp 4 over two nodes of two GPUs: across nodes one link (20 GB/s) unless the nodes
    // share an NVLink domain, where the GPU-pair rate (200) holds and no NIC share applies.
    let config = ParallelConfig::even(8, 4, 1, 1, 1);
    let mut case = Case::new(cluster(2, 2, 200.0, 20.0), config, 4);
    case.cluster.node_links.nics_per_node = Some(4);
    let apart = case.run(TimeModel::Pipette);
    assert_eq!(apart.stages[0].tp_link.as_ref().unwrap().gb_per_s, 80.0);
    for node in &mut case.cluster.nodes {
        node.nvlink_domain = Some("rack-0".into());
    }
    let together = case.run(TimeModel::Pipette);
    assert_eq!(together.stages[0].tp_link.as_ref().unwrap().gb_per_s, 200.0);
    assert!(together.iteration_ms < apart.iteration_ms);
    assert_eq!(together.iteration_ms, case.fast());
    // Another domain: the network again.
    case.cluster.nodes[1].nvlink_domain = Some("rack-1".into());
    assert_eq!(
        case.run(TimeModel::Pipette).iteration_ms,
        apart.iteration_ms
    );
}

#[test]
fn qk_layernorm_reads_and_writes_q_and_k_in_two_more_kernels() {
    let plain = gpt();
    let normed = ModelSpec {
        qk_layernorm: true,
        ..gpt()
    };
    let table = PerfTable::get(GpuKind::A100);
    let calibration = Calibration::default();
    let ops = |model: &ModelSpec| one_middle_layer(&op_shape(model, 2, 4), table);
    let (without, with) = (ops(&plain), ops(&normed));
    // Q and K of 2 × seq tokens, each tp rank's share, read and written once forward (twice
    // backward), and two kernels each way; the GEMMs do not change.
    let tokens = (2 * plain.seq_length) as f64;
    let qk = ((plain.num_attention_heads + plain.num_query_groups) * plain.kv_channels) as f64;
    let bytes = 2.0 * tokens * qk / 4.0 * 2.0;
    let kernel_ms = table.memory_kernel_us * calibration.kernel_cost_scale / 1e3;
    let hbm = table.hbm_gb_per_s * 1e6;
    assert_eq!(with.forward.gflop, without.forward.gflop);
    assert!(close(
        with.forward.fixed_ms - without.forward.fixed_ms,
        bytes / hbm + 2.0 * kernel_ms
    ));
    assert!(close(
        with.backward.fixed_ms - without.backward.fixed_ms,
        2.0 * bytes / hbm + 2.0 * kernel_ms
    ));
}

fn fp8(param_gather: bool, bf16_layers_at_start: u64) -> crate::config::LowPrecision {
    crate::config::LowPrecision {
        bits: crate::config::LowBits::Fp8,
        format: "hybrid".into(),
        recipe: "delayed".into(),
        param_gather,
        bf16_layers_at_start,
        bf16_layers_at_end: 0,
    }
}

#[test]
fn fp8_sequence_parallel_all_gathers_carry_one_byte_an_element() {
    let model = gpt();
    let mut config = ParallelConfig::even(8, 2, 2, 1, 1);
    config.sequence_parallel = true;
    let costs = |low: Option<crate::config::LowPrecision>, config: &ParallelConfig| {
        let mut t = training(4);
        t.low_precision = low;
        let options = TimeOptions::default();
        ConfigCosts::new(&model, &t, config, &Calibration::default(), &options).unwrap()
    };
    let bf16 = costs(None, &config);
    let all_fp8 = costs(Some(fp8(false, 0)), &config);
    let first_bf16 = costs(Some(fp8(false, 1)), &config);
    // One unit: (t − 1)/t of the s·b·h activation in 16 bits. Each of a stage's 4 layers
    // gathers twice each way (its attention's and its MLP's input, or their output
    // gradients), and in FP8 each gather moves half the bytes: 4 units less each way. The
    // first layer, kept in BF16, gathers at 16 bits.
    let unit = 0.5 * 1024.0 * 1024.0 * 2.0 / 1e6;
    for s in 0..2 {
        assert!(close(bf16.tp_fwd_mb[s] - all_fp8.tp_fwd_mb[s], 4.0 * unit));
        assert!(close(bf16.tp_bwd_mb[s] - all_fp8.tp_bwd_mb[s], 4.0 * unit));
    }
    assert!(close(
        bf16.tp_fwd_mb[0] - first_bf16.tp_fwd_mb[0],
        3.0 * unit
    ));
    assert!(close(first_bf16.tp_fwd_mb[1], all_fp8.tp_fwd_mb[1]));
    // Without sequence parallelism the collectives are all-reduces of 16-bit GEMM outputs.
    config.sequence_parallel = false;
    let (a, b) = (costs(None, &config), costs(Some(fp8(false, 0)), &config));
    assert_eq!((a.tp_fwd_mb, a.tp_bwd_mb), (b.tp_fwd_mb, b.tp_bwd_mb));
}

#[test]
fn fp8_param_gather_gathers_the_layers_weights_in_one_byte() {
    let model = gpt();
    let mut config = ParallelConfig::even(8, 1, 1, 2, 1);
    config.distributed_optimizer = true;
    let gather_mb = |low: Option<crate::config::LowPrecision>| {
        let mut t = training(8);
        t.low_precision = low;
        let options = TimeOptions::default();
        ConfigCosts::new(&model, &t, &config, &Calibration::default(), &options)
            .unwrap()
            .dp_gather_mb[0]
    };
    let params = ParameterBreakdown::new(&model, 1);
    let all = params.stage(8, true, true) as f64;
    let layers = 8.0 * params.layer.total() as f64;
    // Half of every parameter each way round a ring of two: 2 bytes in BF16; with
    // --fp8-param-gather the layers' weights in 1 byte, the embedding still in 2.
    assert!(close(gather_mb(None), 0.5 * all * 2.0 / 1e6));
    assert!(close(gather_mb(Some(fp8(false, 0))), 0.5 * all * 2.0 / 1e6));
    let want = 0.5 * (layers + (all - layers) * 2.0) / 1e6;
    assert!(close(gather_mb(Some(fp8(true, 0))), want));
    // A layer kept in BF16 keeps its weights in BF16.
    let one = params.layer.total() as f64;
    assert!(close(gather_mb(Some(fp8(true, 1))), want + 0.5 * one / 1e6));
}

/// `a2a+p2p` runs its a2a over runs of consecutive cp ranks and its p2p ring over ranks
/// that far apart (megatron-core's hierarchical groups), each part on the slowest link it
/// crosses: whichever level stays inside a node pays NVLink, not the network the other
/// level crosses.
#[test]
fn a2a_p2p_prices_each_level_on_the_links_it_crosses() {
    let mut config = ParallelConfig::even(8, 1, 1, 1, 1);
    config.cp = 4;
    let cp_comm = |cluster: ClusterProfile, devices: Option<Vec<Device>>| {
        let mut case = Case::new(cluster, config.clone(), 4);
        case.model.seq_length = 16384;
        case.model.max_position_embeddings = 16384;
        case.training.cp_comm_type = crate::config::CpCommType::A2aP2p;
        case.training.hierarchical_context_parallel = Some(vec![2, 2]);
        if let Some(devices) = devices {
            case.placement.devices = devices;
        }
        let e = case.run(TimeModel::Pipette);
        assert_eq!(e.iteration_ms, case.fast());
        e.stages[0].cp_comm_ms
    };
    let at = |node, gpu| Device { node, gpu };
    // cp ranks 0, 1 on one node and 2, 3 on the other: the a2a pairs talk over NVLink,
    // the p2p rings (0, 2) and (1, 3) cross the network.
    let a2a_inside = cp_comm(cluster(2, 2, 200.0, 20.0), None);
    // 0, 2 on one node and 1, 3 on the other: the other way round.
    let p2p_inside = cp_comm(
        cluster(2, 2, 200.0, 20.0),
        Some(vec![at(0, 0), at(1, 0), at(0, 1), at(1, 1)]),
    );
    // Every link as slow as the network: what both cost priced on the group's slowest link.
    let all_slow = cp_comm(cluster(2, 2, 20.0, 20.0), None);
    // All four on one node: nothing crosses the network.
    let one_node = cp_comm(cluster(1, 4, 200.0, 20.0), None);
    for level_inside in [a2a_inside, p2p_inside] {
        assert!(
            one_node < level_inside && level_inside < all_slow,
            "{one_node} < {level_inside} < {all_slow}"
        );
    }
}
