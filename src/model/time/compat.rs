//! Two comparison models users know, each re-expressed from its published code with its
//! quirks kept, so that one configuration can be costed three ways. Neither is used to
//! plan; both answer "what would Pipette (or AMP) have said about this placement?".
//!
//! # Pipette as published ([`TimeModel::PipetteCompat`])
//!
//! github.com/yimjinkyu1/date2024_pipette, `Megatron-LM-2.5/strategy/merge4/`:
//! `llm_train_strategy_assignment_total_v3.py` computes, for its final variant "our
//! (amp + interleave + splitdp + opt)" (`cost_total_iterl_split_opt`):
//!
//! ```text
//! groups = ⌊m / pp⌋                                   (interleave_group_num = gas // pp)
//! groups ≥ 1:  total = (pp − 1)(f + b) + groups · (pp (f + b) + C_pp) + C_inner + C_inter
//! groups = 0:  total = (m − 1)(f + b) +            pp (f + b) + C_pp  + C_inner + C_inter
//! ```
//!
//! with `f`, `b` the forward and backward time of one micro-batch on a stage (an MLP
//! predictor trained on measured runs) and the communication terms from the simulated
//! annealing objective, `MetaHeuristics.objective` in `mh_simulated_annealing_opt.py`:
//!
//! - `C_pp`: the slowest pipeline's `Σ_hops 2 · msg / bw(stage i → stage i + 1)` with
//!   `msg = b·s·h` bytes of the training dtype (`get_pp_msg_size`). Quirks: the gradient's
//!   reverse link is never read (the forward link is counted twice); the message is not
//!   divided by tp under sequence parallelism; `m` not a multiple of `pp` drops the
//!   remaining micro-batches.
//! - `C_inter = 2 (inter − 1)/inter · msg_dp / min bw` over the ring of the *first stage's*
//!   nodes of each node group, `C_inner = 2 (inner − 1)/inner · msg_dp / intra bw` with the
//!   node's intra-node figure (the diagonal of Pipette's bandwidth file), where
//!   `inner = 8 / tp` (GPUs per node / tp) and `inter = dp / inner` (both integer
//!   divisions; here clamped to `1..=dp`). `msg_dp = (h·V + 16·h²·⌊L/pp⌋) / tp` elements of the
//!   training dtype (`get_dp_msg_size`, GPT: 16 h² per layer, the embedding counted on every
//!   stage, `V` the unpadded vocabulary). No overlap, no stage other than the first.
//!
//! Stand-ins: `f + b` is the Pipette model's slowest stage slot (compute and tp
//! collectives), as the MLP predictor was trained on real runs; the intra-node figure is
//! the node's slowest GPU pair; pipelines are traced per (replica, tp rank) over the real
//! links (Pipette assumed one stage per node).
//!
//! # AMP ([`TimeModel::Amp`])
//!
//! github.com/DachengLi1/AMP, `src/cost_het_cluster.py` (`predict`, `get_cost_e`,
//! `get_cost_c`, `dp_cost`) and `src/pipe.py` (`pipe_cost`):
//!
//! ```text
//! total = (B − 1) · max_s E_s + Σ_s E_s + Σ_boundaries C_j + max_{s,k} DP_{s,k}
//! ```
//!
//! - `E_s`: the stage's layers' profiled forward time × 3 (backward = 2 × forward; no
//!   recomputation). Stand-in for the profile: FLOPs at the *mean* throughput of the placed
//!   GPUs (AMP averages its profiles over the GPU types of the cluster) plus the forward
//!   tp collectives, which a profile would include.
//! - `C_j`: the activation `b·s·h` once per iteration over the slowest tp rank's link
//!   between stages `j` and `j + 1`, averaged over replicas. Quirks: no gradient, paid once
//!   and not per micro-batch; volumes in elements over bandwidths in fp32 elements per
//!   second (`Gb/s / 32`), i.e. 4 bytes per element whatever the dtype.
//! - `DP_{s,k}`: `2 (d − 1)/d · (12·h²·layers + h·V if the stage holds an embedding) / tp`
//!   elements (4 bytes) over one link per ring: AMP's loop over the ring updates its
//!   minimum after the loop, so only the last link, from the last replica back to the
//!   first, counts. No overlap; `V` unpadded.
//!
//! AMP keeps one inter-node and one intra-node figure per node (`cluster_info`); here the
//! link between the two GPUs stands for them.

use crate::config::ModelSpec;
use crate::model::flops::{logits_flops, AttentionMask, LayerFlops};
use crate::model::parallel::Device;

use super::costs::{dtype_bytes, ConfigCosts};
use super::{
    link_ref, ClusterFabric, DataParallelComm, Fabric, HopTime, PipelineComm, RingLink, StageTime,
    TimeEstimate, TimeModel, TimeRequest,
};

/// The numbers of Pipette's published formula for one placement, and where its maxima
/// were found. Allocation-free: [`pipette_compat_ms`] runs it once per evaluation.
struct CompatTerms {
    slot: f64,
    slot_at: (usize, usize),
    msg_gb: f64,
    c_pp: f64,
    pp_at: (usize, usize),
    groups: u64,
    steady_ms: f64,
    bubble_ms: f64,
    p2p_ms: f64,
    inner: usize,
    inter: usize,
    inter_at: usize,
    dp_msg_gb: f64,
    dp_ms: f64,
}

impl CompatTerms {
    fn iteration_ms(&self) -> f64 {
        self.steady_ms + self.bubble_ms + self.p2p_ms + self.dp_ms
    }
}

/// The iteration time by Pipette's published formula (see the module doc), without the
/// report: what [`super::estimate`] with [`TimeModel::PipetteCompat`] returns as
/// `iteration_ms`, for planners that evaluate many placements of one configuration.
/// `devices` must be a valid placement of `costs.world_size()` GPUs of `fabric`.
pub fn pipette_compat_ms(
    costs: &ConfigCosts,
    model: &ModelSpec,
    micro_batch: u64,
    fabric: &ClusterFabric,
    devices: &[Device],
) -> f64 {
    compat_terms(costs, model, micro_batch, fabric, devices).iteration_ms()
}

fn compat_terms(
    costs: &ConfigCosts,
    model: &ModelSpec,
    micro_batch: u64,
    fabric: &ClusterFabric,
    devices: &[Device],
) -> CompatTerms {
    let (tp, dp, pp) = (costs.tp, costs.dp, costs.pp);
    let m = costs.microbatches;

    // f + b: the slowest stage slot of any replica.
    let mut slot = f64::NEG_INFINITY;
    let mut slot_at = (0, 0);
    for d in 0..dp {
        for s in 0..pp {
            let (compute, tp_ms) = costs.slot(fabric, costs.group(devices, d, s), s);
            if compute + tp_ms > slot {
                slot = compute + tp_ms;
                slot_at = (d, s);
            }
        }
    }

    // C_pp: the slowest (replica, tp rank) pipeline, 2 · msg / forward link per hop.
    let bytes = dtype_bytes(costs.precision);
    let msg_gb = (micro_batch * model.seq_length * model.hidden_size) as f64 * bytes / 1e9;
    let mut c_pp = 0.0f64;
    let mut pp_at = (0, 0);
    for d in 0..dp {
        for k in 0..tp {
            let mut c = 0.0;
            for s in 0..pp.saturating_sub(1) {
                c += compat_hop_ms(
                    fabric,
                    msg_gb,
                    costs.group(devices, d, s)[k],
                    costs.group(devices, d, s + 1)[k],
                );
            }
            if c > c_pp {
                c_pp = c;
                pp_at = (d, k);
            }
        }
    }

    let groups = m / pp as u64;
    let (steady_ms, bubble_ms, p2p_ms) = if groups >= 1 {
        (
            groups as f64 * pp as f64 * slot,
            (pp - 1) as f64 * slot,
            groups as f64 * c_pp,
        )
    } else {
        (m as f64 * slot, (pp - 1) as f64 * slot, c_pp)
    };

    // Data parallel: inner ranks per node, inter ring over the first stage's node groups.
    let per_node = fabric.gpus_on(devices[0].node);
    let inner = (per_node / tp).clamp(1, dp);
    let inter = (dp / inner).max(1);
    let layers_per_stage = model.num_layers / pp as u64;
    let h = model.hidden_size as f64;
    let dp_msg_gb =
        (h * model.vocab_size as f64 + layers_per_stage as f64 * 16.0 * h * h) / tp as f64 * bytes
            / 1e9;
    let first_of_group = |j: usize| devices[tp * j * inner];
    let mut inter_latency = 0.0f64;
    let mut inter_at = 0;
    let mut inner_latency = 0.0f64;
    for j in 0..inter {
        let here = first_of_group(j);
        if inter > 1 {
            let latency = 1.0 / fabric.gb_per_s(here, first_of_group((j + 1) % inter));
            if latency > inter_latency {
                inter_latency = latency;
                inter_at = j;
            }
        }
        inner_latency = inner_latency.max(1.0 / fabric.slowest_intra_node(here.node));
    }
    let cost_inter = if inter > 1 {
        2.0 * (inter - 1) as f64 * dp_msg_gb * inter_latency / inter as f64 * 1e3
    } else {
        0.0
    };
    let cost_inner = if inner > 1 {
        2.0 * (inner - 1) as f64 * dp_msg_gb * inner_latency / inner as f64 * 1e3
    } else {
        0.0
    };
    CompatTerms {
        slot,
        slot_at,
        msg_gb,
        c_pp,
        pp_at,
        groups,
        steady_ms,
        bubble_ms,
        p2p_ms,
        inner,
        inter,
        inter_at,
        dp_msg_gb,
        dp_ms: cost_inner + cost_inter,
    }
}

/// One hop of Pipette's pipeline cost: the message twice over the forward link, ms.
fn compat_hop_ms(fabric: &ClusterFabric, msg_gb: f64, a: Device, b: Device) -> f64 {
    2.0 * (msg_gb / fabric.gb_per_s(a, b)) * 1e3
}

/// Pipette's published formula (see the module doc).
pub(super) fn pipette_compat(
    costs: &ConfigCosts,
    request: &TimeRequest<'_>,
    fabric: &ClusterFabric,
    devices: &[Device],
) -> TimeEstimate {
    let model = request.model;
    let cluster = request.cluster;
    let (tp, pp) = (costs.tp, costs.pp);
    let m = costs.microbatches;
    let terms = compat_terms(costs, model, config_micro(request), fabric, devices);
    let iteration_ms = terms.iteration_ms();
    let CompatTerms {
        slot,
        slot_at,
        msg_gb,
        c_pp,
        pp_at,
        groups,
        steady_ms,
        bubble_ms,
        p2p_ms,
        inner,
        inter,
        inter_at,
        dp_msg_gb,
        dp_ms,
    } = terms;
    let first_of_group = |j: usize| devices[tp * j * inner];
    let hop_ms = |a: Device, b: Device| compat_hop_ms(fabric, msg_gb, a, b);

    let stages: Vec<StageTime> = (0..pp)
        .map(|s| costs.stage_report(fabric, cluster, devices, slot_at.0, s))
        .collect();
    let hops = (0..pp.saturating_sub(1))
        .map(|s| {
            let a = costs.group(devices, pp_at.0, s)[pp_at.1];
            let b = costs.group(devices, pp_at.0, s + 1)[pp_at.1];
            let forward = link_ref(cluster, fabric, a, b);
            HopTime {
                from_stage: s,
                to_stage: s + 1,
                gradient: forward.clone(),
                activation: forward,
                ms: hop_ms(a, b),
                times: 1,
            }
        })
        .collect();
    let bottleneck = (inter > 1).then(|| RingLink {
        stage: 0,
        tp_rank: 0,
        link: link_ref(
            cluster,
            fabric,
            first_of_group(inter_at),
            first_of_group((inter_at + 1) % inter),
        ),
    });
    let notes = vec![
        "Pipette's published formula (date2024_pipette, strategy/merge4/llm_train_strategy_assignment_total_v3.py, cost_total_iterl_split_opt; communication from mh_simulated_annealing_opt.py, MetaHeuristics.objective)".to_string(),
        format!("f + b = {slot:.3} ms: the Pipette model's slowest stage slot (stage {}, replica {}) stands in for Pipette's MLP predictor", slot_at.1, slot_at.0),
        format!("pipeline cost paid ⌊m/pp⌋ = ⌊{m}/{pp}⌋ = {groups} time(s){}", if groups >= 1 && m % pp as u64 != 0 { "; the remaining micro-batches are dropped (quirk)" } else { "" }),
        "each hop costs 2 × message / the forward link's bandwidth (the gradient's reverse link is not read); message b·s·h in the training dtype, not divided by tp under sequence parallelism".to_string(),
        format!("data parallel split as Pipette's: inner = {inner} rank(s) per node over the node's slowest GPU pair, inter = {inter} over the ring of first-stage nodes; gradients (h·V + 16·h²·⌊L/pp⌋)/tp in the training dtype with V unpadded; no overlap"),
    ];
    TimeEstimate {
        model: TimeModel::PipetteCompat,
        iteration_ms,
        steady_ms,
        bubble_ms,
        pipeline_p2p_ms: p2p_ms,
        data_parallel_exposed_ms: dp_ms,
        param_gather_exposed_ms: 0.0,
        optimizer_ms: 0.0,
        overlap_credited_ms: 0.0,
        microbatches: m,
        critical_stage: slot_at.1,
        stages,
        pipeline: PipelineComm {
            replica: pp_at.0,
            message_bytes: msg_gb * 1e9,
            passes: groups.max(1),
            per_pass_ms: c_pp,
            hops,
        },
        data_parallel: DataParallelComm {
            collective: "all-reduce",
            stage: 0,
            grad_bytes: dp_msg_gb * 1e9,
            reduce_ms: dp_ms,
            reduce_overlap_ms: 0.0,
            reduce_exposed_ms: dp_ms,
            param_gather_ms: 0.0,
            param_gather_overlap_ms: 0.0,
            param_gather_exposed_ms: 0.0,
            bottleneck,
        },
        expert_parallel_ms: 0.0,
        expert_dp_exposed_ms: 0.0,
        expert: None,
        notes,
    }
}

/// AMP's cost model (see the module doc).
pub(super) fn amp(
    costs: &ConfigCosts,
    request: &TimeRequest<'_>,
    fabric: &ClusterFabric,
    devices: &[Device],
) -> TimeEstimate {
    let model = request.model;
    let cluster = request.cluster;
    let (tp, dp, pp) = (costs.tp, costs.dp, costs.pp);
    let micro = config_micro(request);
    let b_count = costs.microbatches;

    // AMP averages its per-GPU-type profiles: the mean ms per GFLOP of the placed GPUs.
    let mean_ms_per_gflop =
        devices.iter().map(|&d| fabric.ms_per_gflop(d)).sum::<f64>() / devices.len() as f64;
    let layer_gflop =
        LayerFlops::new(model, micro, AttentionMask::Causal).total() / tp as f64 / 1e9;
    let logits_gflop = logits_flops(model, micro, tp as u64) / tp as f64 / 1e9;

    let mut stage_rows = Vec::with_capacity(pp);
    let mut lens = Vec::with_capacity(pp);
    for s in 0..pp {
        let layers = costs.layers[s];
        let mut gflop = layer_gflop * layers as f64;
        if s + 1 == pp {
            gflop += logits_gflop;
        }
        let forward_ms = gflop * mean_ms_per_gflop;
        // The forward tp collectives a profile would have timed, averaged over replicas.
        let tp_forward_ms = if tp > 1 {
            (0..dp)
                .map(|d| {
                    let group = costs.group(devices, d, s);
                    costs.tp_fwd_mb[s] * costs.tp_exposed / ring_min(fabric, group)
                })
                .sum::<f64>()
                / dp as f64
        } else {
            0.0
        };
        let len = 3.0 * (forward_ms + tp_forward_ms);
        lens.push(len);
        stage_rows.push(StageTime {
            stage: s,
            layers,
            forward_ms,
            backward_ms: 2.0 * forward_ms,
            recompute_ms: 0.0,
            tp_comm_ms: 3.0 * tp_forward_ms,
            tp_comm_hidden_ms: 0.0,
            cp_comm_ms: 0.0,
            tp_link: None,
            gpu: None,
            host_ms: 0.0,
            slot_ms: len,
        });
    }
    let (critical_stage, max_len) =
        lens.iter()
            .copied()
            .enumerate()
            .fold((0, f64::NEG_INFINITY), |best, (s, l)| {
                if l > best.1 {
                    (s, l)
                } else {
                    best
                }
            });
    let sum_len: f64 = lens.iter().sum();

    // Boundaries: the activation once, 4 bytes per element, slowest tp rank, mean over dp.
    let volume_mb = (micro * model.seq_length * model.hidden_size) as f64 * 4.0 / 1e6;
    let mut hops = Vec::with_capacity(pp.saturating_sub(1));
    let mut sum_c = 0.0;
    for s in 0..pp.saturating_sub(1) {
        let mut total = 0.0;
        let mut link0 = (devices[0], devices[0]);
        for d in 0..dp {
            let here = costs.group(devices, d, s);
            let there = costs.group(devices, d, s + 1);
            let (k, bw) = (0..tp)
                .map(|k| (k, fabric.gb_per_s(here[k], there[k])))
                .fold(
                    (0, f64::INFINITY),
                    |best, x| if x.1 < best.1 { x } else { best },
                );
            total += volume_mb / bw;
            if d == 0 {
                link0 = (here[k], there[k]);
            }
        }
        let c = total / dp as f64;
        sum_c += c;
        hops.push(HopTime {
            from_stage: s,
            to_stage: s + 1,
            activation: link_ref(cluster, fabric, link0.0, link0.1),
            gradient: link_ref(cluster, fabric, link0.1, link0.0),
            ms: c,
            times: 1,
        });
    }

    // Data parallel: the wrap-around link of each (stage, tp rank) ring only.
    let h = model.hidden_size as f64;
    let mut dp_ms = 0.0f64;
    let mut dp_at = None;
    let mut dp_elements = 0.0;
    if dp > 1 {
        for s in 0..pp {
            let embedding = s == 0 || s + 1 == pp;
            let elements = (12.0 * h * h * costs.layers[s] as f64
                + if embedding {
                    h * model.vocab_size as f64
                } else {
                    0.0
                })
                / tp as f64;
            let last = costs.group(devices, dp - 1, s);
            let first = costs.group(devices, 0, s);
            for k in 0..tp {
                let bw = fabric.gb_per_s(last[k], first[k]);
                let ms = 2.0 * (dp - 1) as f64 / dp as f64 * elements * 4.0 / 1e6 / bw;
                if ms > dp_ms {
                    dp_ms = ms;
                    dp_at = Some((s, k, last[k], first[k]));
                    dp_elements = elements;
                }
            }
        }
    }

    let steady_ms = b_count as f64 * max_len;
    let bubble_ms = sum_len - max_len;
    let notes = vec![
        "AMP's cost model (github.com/DachengLi1/AMP, src/cost_het_cluster.py: predict, get_cost_e, get_cost_c, dp_cost; src/pipe.py: pipe_cost)".to_string(),
        "stage time: forward × 3 (no recomputation); the profile is stood in for by FLOPs at the mean throughput of the placed GPUs plus the forward tp collectives".to_string(),
        "pipeline: (B − 1) × slowest stage + every stage once + each boundary's activation once per iteration (no gradient), slowest tp rank's link, mean over replicas; 4 bytes per element".to_string(),
        "data parallel: 2(d − 1)/d × (12·h²·layers + h·V on embedding stages)/tp elements × 4 bytes over the ring's last link only (AMP's loop keeps only the last link); no overlap".to_string(),
        "AMP's per-node inter- and intra-node figures are read as the link between the two GPUs".to_string(),
    ];
    TimeEstimate {
        model: TimeModel::Amp,
        iteration_ms: (b_count as f64 - 1.0) * max_len + sum_c + sum_len + dp_ms,
        steady_ms,
        bubble_ms,
        pipeline_p2p_ms: sum_c,
        data_parallel_exposed_ms: dp_ms,
        param_gather_exposed_ms: 0.0,
        optimizer_ms: 0.0,
        overlap_credited_ms: 0.0,
        microbatches: b_count,
        critical_stage,
        stages: stage_rows,
        pipeline: PipelineComm {
            replica: 0,
            message_bytes: volume_mb * 1e6,
            passes: 1,
            per_pass_ms: sum_c,
            hops,
        },
        data_parallel: DataParallelComm {
            collective: "all-reduce",
            stage: dp_at.map_or(0, |x| x.0),
            grad_bytes: dp_elements * 4.0,
            reduce_ms: dp_ms,
            reduce_overlap_ms: 0.0,
            reduce_exposed_ms: dp_ms,
            param_gather_ms: 0.0,
            param_gather_overlap_ms: 0.0,
            param_gather_exposed_ms: 0.0,
            bottleneck: dp_at.map(|(stage, tp_rank, a, b)| RingLink {
                stage,
                tp_rank,
                link: link_ref(cluster, fabric, a, b),
            }),
        },
        expert_parallel_ms: 0.0,
        expert_dp_exposed_ms: 0.0,
        expert: None,
        notes,
    }
}

fn config_micro(request: &TimeRequest<'_>) -> u64 {
    request.config.micro_batch
}

/// The slowest link of a ring in group order, GB/s.
fn ring_min<F: Fabric + ?Sized>(fabric: &F, group: &[Device]) -> f64 {
    (0..group.len())
        .map(|i| fabric.gb_per_s(group[i], group[(i + 1) % group.len()]))
        .fold(f64::INFINITY, f64::min)
}
