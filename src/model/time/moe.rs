//! The mixture-of-experts, multi-latent-attention and multi-token-prediction parts of the
//! Pipette model: what an MoE layer costs beyond (or instead of) a dense one, and the
//! expert-parallel communication the dense model has no term for.
//!
//! Per MoE layer and micro-batch, on one GPU of a stage, with `T` tokens of the micro-batch
//! on the rank (`s·b/cp`, ÷ tp with sequence parallelism, which Megatron requires for MoE
//! with tp > 1), `E` experts, top-`k` routing, expert width `F`, `ep`/`etp` and a load factor
//! `L` for the busiest rank ([`load_factor`]):
//!
//! | term | cost |
//! |---|---|
//! | router | GEMM `T × E × h` (three ways), softmax/top-k kernels over `T × E` fp32 |
//! | permute, unpermute | memory-bound: `T·k·etp` token rows of `h` read and written, each way |
//! | routed experts | `E/ep` GEMMs of `M = T·k·etp·L·ep/E` tokens each (grouped: one kernel) up `h → gates·F/etp`, down `F/etp → h`, at the table's efficiency for that `M`: small `M` (many experts per token, large `ep`) is slow |
//! | expert activation | memory-bound over `M·E/ep × F/etp` |
//! | shared expert | a dense MLP of the shared width, tensor-parallel like the attention |
//! | dispatch, combine | `alltoall`/`flex`: two all-to-alls forward, two backward, `T·k·h·L/ep` bytes between each pair of the ep group; `allgather`: all-gather and reduce-scatter of `T·h` from every member; each one start-up latency, the measured figure of its group but no more than the largest measured group's ([`all_to_all_latency_group`]) |
//!
//! The dense MLP the layer replaces (`ffn_hidden_size`) is taken back out. The all-to-all
//! runs over the links the expert-parallel group really spans: a member sends its
//! intra-node share over NVLink and its inter-node share over its share of the node's NICs,
//! the two at once, the slower governing (`flex`, DeepEP and HybridEP, sends a token once
//! per node that holds one of its experts, not once per expert), the slowest member
//! governing the group, and the
//! slowest group the stage ([`ConfigCosts::stage_dispatch_ms`]). It is priced per stage, so
//! it is added to the iteration as `(m + (pp − 1)/v)` slots of the slowest stage's
//! all-to-all beside the pipeline (erring long when the stage that governs the pipeline is
//! not the one with the slowest all-to-all). The routed experts' gradients are reduced over
//! the expert-data-parallel group (`tp·cp·dp/(ep·etp)` ranks `ep·etp` apart), apart from the
//! dense ones and after them in the overlap window ([`ConfigCosts::stage_expert_sync`]).
//!
//! Multi-latent attention replaces the QKV projection by its down and up projections (the
//! down ones duplicated on every tp rank, Megatron's layout) and the output projection's
//! width by `heads·v_head_dim`; the attention core keeps the dense shape. Each
//! multi-token-prediction layer adds one more decoder layer (MoE like the last one), its
//! `2h → h` projection and another pass through the output layer, on the last stage.
//! Selective recomputation of `moe` redoes the layer's forward with its all-to-alls,
//! `moe_act` the expert activation, `mla_up_proj` MLA's up projections, `shared_experts`
//! the shared expert's forward.

use serde::Serialize;

use crate::config::{
    Dispatcher, LowBits, MlaSpec, ModelSpec, MoeSpec, Recompute, RecomputeModule, TrainingSettings,
};
use crate::model::calibration::Calibration;
use crate::model::parallel::{Device, ParallelConfig};
use crate::model::params::ParameterBreakdown;

use super::costs::{gathered_expert_bytes, ring_sync_bytes, ConfigCosts};
use super::evaluate::{dp_ring_link, times};
use super::ops::{quantised_bytes, KindOps, OpCost, OpShape, StageOps};
use super::perf::{GpuKind, Layout, PerfTable, PerfTables};
use super::Fabric;

/// How much more than the mean the busiest expert-parallel rank receives under dropless
/// routing: the busiest rank computes, and receives, that many times its even share. With a
/// capacity factor the busiest expert is capped at that factor. The figure is a stated
/// allowance, not fitted to a run: the Megatron MoE Model Zoo's Qwen3-235B runs on 256 H100
/// with forced balance against dropless routing at the same layout
/// (yanring/Megatron-MoE-ModelZoo best_practice/qwen3/readme.md @ e8650517, MIT) lose 9-24 %
/// of the whole step's throughput to it, most of which is the experts' share.
pub const DROPLESS_LOAD: f64 = 1.2;

/// The busiest rank's load relative to an even split: the capacity factor when tokens are
/// dropped (padding to capacity computes exactly that), [`DROPLESS_LOAD`] when dropless.
pub fn load_factor(moe: &MoeSpec) -> f64 {
    match moe.capacity_factor {
        Some(c) if c > 0.0 && moe.pad_to_capacity => c,
        Some(c) if c > 0.0 => c.clamp(1.0, DROPLESS_LOAD),
        _ => DROPLESS_LOAD,
    }
}

/// The group size whose measured collective latency an all-to-all over `ep` ranks pays.
///
/// An all-to-all posts its message to every peer at once (NCCL runs `alltoall` as one
/// group of point-to-point sends and receives, one per peer, on parallel channels; DeepEP
/// and HybridEP as one kernel), so its start-up does not grow step by step with the group
/// as a ring's does: [`PerfTable::collective_latency`] extrapolates a ring's `(n − 1)`
/// steps past the largest measured group, which priced an all-to-all over 32 H100 at
/// 4.4 times, over 128 at 18 times its 8-GPU figure. Up to the largest measured group
/// the measured figure stands (it is what an exchange over that many GPUs waits); past
/// it, that figure. DeepEP's published low-latency kernels bear this out: the same 128
/// tokens a rank take 192 µs over 128 ranks and 194 µs over 256 (H800, CX7 400 Gb/s;
/// deepseek-ai/DeepEP docs/legacy.md, MIT), where a ring's start-up would double.
/// An all-to-all waits like an all-gather over the group: the all-gather's figure is
/// taken.
pub(super) fn all_to_all_latency_group(ep: usize, table: &PerfTable) -> usize {
    ep.min(table.largest_measured_group().max(2))
}

/// The first decoder layer of stage `s`: the stages in order, each contiguous (as the
/// memory model and Megatron's plain layout take them).
pub(super) fn stage_start(config: &ParallelConfig, s: usize) -> u64 {
    config.layers_per_stage[..s].iter().sum()
}

/// MoE layers among decoder layers `start .. start + layers`.
fn moe_layers_in(moe: Option<&MoeSpec>, start: u64, layers: u64) -> u64 {
    moe.map_or(0, |m| {
        (start..start + layers)
            .filter(|i| m.is_moe_layer(*i))
            .count() as u64
    })
}

/// Whether the multi-token-prediction layers are MoE layers (they follow the last decoder
/// layer, as Megatron's theoretical memory counts them).
fn mtp_is_moe(model: &ModelSpec) -> bool {
    model
        .moe
        .as_ref()
        .is_some_and(|m| m.is_moe_layer(model.num_layers.saturating_sub(1)))
}

/// One MoE layer's, one MLA layer's and the MTP block's compute on one GPU kind, as
/// additions to the dense layer [`KindOps`] prices: forward, backward and what selective
/// recomputation redoes, each term kept apart for the report.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ExpertKindOps {
    /// Per MoE layer, (forward, backward).
    pub router: (OpCost, OpCost),
    pub permute: (OpCost, OpCost),
    pub experts: (OpCost, OpCost),
    pub shared: (OpCost, OpCost),
    /// The dense MLP an MoE layer does not run (subtracted).
    pub dense_mlp: (OpCost, OpCost),
    /// Per layer with multi-latent attention: its projections less the dense QKV and output.
    pub mla: (OpCost, OpCost),
    /// The recomputed forward of one MoE layer (`moe`, `moe_act`, `shared_experts`).
    pub moe_recompute: OpCost,
    /// The recomputed MLA up projections of one layer (`mla_up_proj`).
    pub mla_recompute: OpCost,
    /// The multi-token-prediction block on the last stage, (forward, backward).
    pub mtp: (OpCost, OpCost),
}

/// What shapes the MoE and MLA operations beyond [`OpShape`].
pub(super) struct ExpertShape<'a> {
    pub moe: Option<&'a MoeSpec>,
    pub mla: Option<&'a MlaSpec>,
    pub ep: u64,
    pub etp: u64,
    pub cp: u64,
    pub modules: &'a [RecomputeModule],
    pub selective: bool,
}

fn sum(a: (OpCost, OpCost)) -> OpCost {
    OpCost {
        gflop: a.0.gflop + a.1.gflop,
        fixed_ms: a.0.fixed_ms + a.1.fixed_ms,
    }
}

fn plus(a: OpCost, b: OpCost, times: f64) -> OpCost {
    OpCost {
        gflop: a.gflop + b.gflop * times,
        fixed_ms: a.fixed_ms + b.fixed_ms * times,
    }
}

impl ExpertKindOps {
    pub(super) fn new(
        shape: &OpShape<'_>,
        expert: &ExpertShape<'_>,
        table: &PerfTable,
        calibration: &Calibration,
        dense: &KindOps,
    ) -> Self {
        let model = shape.model;
        let mut ops = ExpertKindOps::default();
        let t = shape.tp.max(1) as f64;
        let e = shape.act_bytes;
        let h = model.hidden_size as f64;
        let tokens = model.seq_length as f64 * shape.micro_batch as f64 / expert.cp.max(1) as f64;
        // Megatron requires sequence parallelism for MoE with tp > 1: the MoE layer sees
        // the rank's share of the tokens.
        let rank_tokens = if shape.tp > 1 { tokens / t } else { tokens };
        let speedup = shape
            .low_precision
            .and_then(|bits: LowBits| table.kind.low_precision_speedup(bits))
            .unwrap_or(1.0);
        let gemm = |m: f64, n: f64, k: f64, layout: Layout| -> f64 {
            if m <= 0.0 || n <= 0.0 || k <= 0.0 {
                return 0.0;
            }
            2.0 * m * n * k / 1e9 / table.gemm_efficiency(m, n, k, layout).value
        };
        // A linear layer `input → output` over `m` tokens: (forward, backward) GFLOP at 100 %.
        let linear = |m: f64, input: f64, output: f64| -> (OpCost, OpCost) {
            let fwd = gemm(m, output, input, Layout::Fwd) / speedup;
            let bwd = (gemm(m, input, output, Layout::Dgrad)
                + gemm(output, input, m, Layout::Wgrad))
                / speedup;
            (
                OpCost {
                    gflop: fwd,
                    fixed_ms: 0.0,
                },
                OpCost {
                    gflop: bwd,
                    fixed_ms: 0.0,
                },
            )
        };
        let kernel_ms = table.memory_kernel_us * calibration.kernel_cost_scale / 1e3;
        let memory = |bytes: f64, kernels: f64| OpCost {
            gflop: 0.0,
            fixed_ms: bytes / (table.hbm_gb_per_s * 1e6) + kernels * kernel_ms,
        };
        let twice = |c: OpCost| OpCost {
            gflop: c.gflop * 2.0,
            fixed_ms: c.fixed_ms * 2.0,
        };
        let gates = if model.swiglu { 2.0 } else { 1.0 };
        let modules = |m: RecomputeModule| expert.selective && expert.modules.contains(&m);

        if let Some(moe) = expert.moe {
            let ep = expert.ep.max(1) as f64;
            let etp = expert.etp.max(1) as f64;
            let experts = moe.num_experts.max(1) as f64;
            let k = moe.router_topk.max(1) as f64;
            let f = moe.ffn_hidden_size as f64;
            let load = load_factor(moe);
            // The dense MLP this layer does not run, as [`KindOps`] priced it.
            let dense_f = model.ffn_hidden_size as f64;
            // A tensor-parallel MLP of `width` over the layer's tokens (its activation in
            // `kernels` kernels: the dense one's are already counted with the layer's).
            // FP8/FP4: every GEMM's input is quantised forward and its incoming gradient
            // backward, as [`KindOps`] prices the dense layer's (`quantised_bytes`): the
            // dense MLP's quantisation goes with it, the experts pay theirs over their rows
            // and widths, the shared expert its own. `fwd` and `bwd` count elements.
            let quant_bytes = shape
                .low_precision
                .filter(|&bits| table.kind.low_precision_speedup(bits).is_some())
                .map(quantised_bytes);
            let quantise = |fwd: f64, bwd: f64, kernels: f64| match quant_bytes {
                Some(q) => (
                    memory(fwd * (e + q), kernels),
                    memory(bwd * (e + q), kernels),
                ),
                None => (OpCost::default(), OpCost::default()),
            };
            let mlp = |width: f64, kernels: f64| {
                let (up_f, up_b) = linear(tokens, h, gates * width / t);
                let (down_f, down_b) = linear(tokens, width / t, h);
                let act = memory((gates + 1.0) * tokens * width / t * e, kernels);
                let (qf, qb) = quantise(
                    tokens * (h + width / t),
                    tokens * (gates * width / t + h),
                    2.0,
                );
                (
                    plus(plus(plus(up_f, down_f, 1.0), act, 1.0), qf, 1.0),
                    plus(plus(plus(up_b, down_b, 1.0), twice(act), 1.0), qb, 1.0),
                )
            };
            ops.dense_mlp = mlp(dense_f, 0.0);
            // Router: logits over the experts (fp32 softmax or sigmoid, top-k, scores).
            let (rf, rb) = linear(rank_tokens, h, experts);
            let router_kernels = memory(3.0 * rank_tokens * experts * 4.0, 4.0);
            ops.router = (plus(rf, router_kernels, 1.0), plus(rb, router_kernels, 1.0));
            // Permute and unpermute: the k·etp copies of each token's row, read and
            // written, a kernel each; backward the same.
            let rows = rank_tokens * k * etp * load;
            let permute = memory(2.0 * 2.0 * rows * h * e, 2.0);
            ops.permute = (permute, permute);
            // Routed experts: E/ep GEMMs of the busiest rank's tokens per local expert.
            let local = (experts / ep).max(1.0);
            let per_expert = rows / local;
            let width = f / etp;
            let (ef1, eb1) = linear(per_expert, h, gates * width);
            let (ef2, eb2) = linear(per_expert, width, h);
            let gemm_kernels = if moe.grouped_gemm { 2.0 } else { 2.0 * local };
            let launch = memory(0.0, gemm_kernels);
            let activation = memory((gates + 1.0) * rows * width * e, 1.0);
            let (quant_fwd, quant_bwd) =
                quantise(rows * (h + width), rows * (gates * width + h), gemm_kernels);
            // GEMM work is per expert; the activation, the quantisation and the launches
            // were priced for all rows and all kernels already, so only the GEMMs multiply
            // by the local experts.
            let experts_fwd = OpCost {
                gflop: (ef1.gflop + ef2.gflop) * local,
                fixed_ms: activation.fixed_ms + launch.fixed_ms + quant_fwd.fixed_ms,
            };
            let experts_bwd = OpCost {
                gflop: (eb1.gflop + eb2.gflop) * local,
                fixed_ms: 2.0 * activation.fixed_ms + 2.0 * launch.fixed_ms + quant_bwd.fixed_ms,
            };
            ops.experts = (experts_fwd, experts_bwd);
            // The shared expert: a dense MLP of its width over the layer's tokens.
            if let Some(fs) = moe.shared_expert_ffn.filter(|&w| w > 0) {
                ops.shared = mlp(fs as f64, 1.0);
            }
            if modules(RecomputeModule::Moe) {
                ops.moe_recompute = plus(
                    plus(plus(ops.router.0, ops.permute.0, 1.0), ops.experts.0, 1.0),
                    ops.shared.0,
                    1.0,
                );
            } else {
                if modules(RecomputeModule::MoeAct) {
                    ops.moe_recompute = plus(ops.moe_recompute, activation, 1.0);
                }
                if modules(RecomputeModule::SharedExperts) {
                    ops.moe_recompute = plus(ops.moe_recompute, ops.shared.0, 1.0);
                }
            }
        }

        if let Some(mla) = expert.mla {
            let heads = model.num_attention_heads as f64;
            let qk = (mla.qk_head_dim + mla.qk_pos_emb_head_dim) as f64;
            let v = mla.v_head_dim as f64;
            let rope = mla.qk_pos_emb_head_dim as f64;
            let kv_rank = mla.kv_lora_rank as f64;
            let q = model.num_attention_heads as f64 * model.kv_channels as f64;
            let kv = model.num_query_groups as f64 * model.kv_channels as f64;
            let (qkv_f, qkv_b) = linear(tokens, h, (q + 2.0 * kv) / t);
            let (out_f, out_b) = linear(tokens, q / t, h);
            let dense = (plus(qkv_f, out_f, 1.0), plus(qkv_b, out_b, 1.0));
            // Down projections duplicated on every tp rank over all the tokens; up
            // projections column-parallel.
            let mut fwd = OpCost::default();
            let mut bwd = OpCost::default();
            let mut up_fwd = OpCost::default();
            let mut add = |(f, b): (OpCost, OpCost), up: bool| {
                fwd = plus(fwd, f, 1.0);
                bwd = plus(bwd, b, 1.0);
                if up {
                    up_fwd = plus(up_fwd, f, 1.0);
                }
            };
            match mla.q_lora_rank {
                Some(r) => {
                    let r = r as f64;
                    add(linear(tokens, h, r), false);
                    add(linear(tokens, r, heads * qk / t), true);
                }
                None => add(linear(tokens, h, heads * qk / t), false),
            }
            add(linear(tokens, h, kv_rank + rope), false);
            add(
                linear(tokens, kv_rank, heads * (mla.qk_head_dim as f64 + v) / t),
                true,
            );
            add(linear(tokens, heads * v / t, h), false);
            // The latent norms and the rotary part: read and write the latents.
            let norms = memory(2.0 * 2.0 * tokens * (kv_rank + rope) * e, 2.0);
            fwd = plus(fwd, norms, 1.0);
            bwd = plus(bwd, twice(norms), 1.0);
            ops.mla = (plus(fwd, dense.0, -1.0), plus(bwd, dense.1, -1.0));
            if modules(RecomputeModule::MlaUpProj) {
                ops.mla_recompute = up_fwd;
            }
        }

        if model.mtp_layers > 0 {
            let n = model.mtp_layers as f64;
            let (layer_f, layer_b) = dense.layer();
            let (last_f, last_b) = dense.last();
            let mut f = plus(layer_f, last_f, 1.0);
            let mut b = plus(layer_b, last_b, 1.0);
            if mtp_is_moe(model) {
                for part in [ops.router, ops.permute, ops.experts, ops.shared] {
                    f = plus(f, part.0, 1.0);
                    b = plus(b, part.1, 1.0);
                }
                f = plus(f, ops.dense_mlp.0, -1.0);
                b = plus(b, ops.dense_mlp.1, -1.0);
            }
            f = plus(f, ops.mla.0, 1.0);
            b = plus(b, ops.mla.1, 1.0);
            // eh_proj: the embedding and the hidden state concatenated, 2h → h.
            let (pf, pb) = linear(tokens, 2.0 * h, h / t);
            f = plus(f, pf, 1.0);
            b = plus(b, pb, 1.0);
            ops.mtp = (plus(OpCost::default(), f, n), plus(OpCost::default(), b, n));
        }
        ops
    }

    /// One MoE layer's net addition to a dense layer, (forward, backward).
    fn moe_layer(&self) -> (OpCost, OpCost) {
        let mut f = OpCost::default();
        let mut b = OpCost::default();
        for part in [self.router, self.permute, self.experts, self.shared] {
            f = plus(f, part.0, 1.0);
            b = plus(b, part.1, 1.0);
        }
        (
            plus(f, self.dense_mlp.0, -1.0),
            plus(b, self.dense_mlp.1, -1.0),
        )
    }

    /// `dense` (the stage priced as dense layers) with `moe_layers` of its `layers` MoE,
    /// every layer MLA when the model has it, and the MTP block on the last stage.
    pub(super) fn stage(
        &self,
        dense: StageOps,
        layers: u64,
        moe_layers: u64,
        last: bool,
        has_mla: bool,
    ) -> StageOps {
        let mut out = dense;
        let (mf, mb) = self.moe_layer();
        let n = moe_layers as f64;
        let mut recompute = plus(OpCost::default(), self.moe_recompute, n);
        out.forward = plus(out.forward, mf, n);
        out.backward = plus(out.backward, mb, n);
        if has_mla {
            let l = layers as f64;
            out.forward = plus(out.forward, self.mla.0, l);
            out.backward = plus(out.backward, self.mla.1, l);
            recompute = plus(recompute, self.mla_recompute, l);
        }
        if last {
            out.forward = plus(out.forward, self.mtp.0, 1.0);
            out.backward = plus(out.backward, self.mtp.1, 1.0);
        }
        out.backward = plus(out.backward, recompute, 1.0);
        out.recompute = plus(out.recompute, recompute, 1.0);
        out
    }
}

/// The expert-parallel costs of a configuration that do not depend on the placement.
#[derive(Debug, Clone)]
pub(super) struct ExpertCosts {
    pub dispatcher: Dispatcher,
    pub ep: usize,
    pub etp: usize,
    /// Expert-data-parallel size: tp·cp·dp / (ep·etp).
    pub edp: usize,
    /// Routed experts on one rank.
    pub experts_per_rank: f64,
    /// Tokens one local expert computes per micro-batch on the busiest rank.
    pub tokens_per_expert: f64,
    /// Bytes between one pair of the expert-parallel group in one collective, MB.
    pub pair_mb: f64,
    /// One copy of the rank's tokens (`T·h` at the busiest rank's load), MB, and the
    /// experts per token: what node-deduplicating dispatchers (`flex`) send per node.
    pub token_mb: f64,
    pub topk: f64,
    /// Dispatch/combine collectives per micro-batch of stage `s` (forward, backward and the
    /// recomputed forward).
    pub collectives: Vec<f64>,
    /// Latency of one collective over the ep group per GPU kind, ms.
    pub latency_ms: [f64; GpuKind::ALL.len()],
    /// Routed-expert gradient bytes of one GPU of stage `s`.
    pub grad_bytes: Vec<f64>,
    /// Ring volume of the expert-data-parallel reduce and (distributed optimizer)
    /// parameter gather of stage `s`, MB.
    pub reduce_mb: Vec<f64>,
    pub gather_mb: Vec<f64>,
    /// MoE decoder layers of stage `s` (the MTP block's are priced with it).
    pub moe_layers: Vec<u64>,
    /// `--moe-shared-expert-overlap`: the shared expert's forward runs beside the dispatch.
    pub shared_overlap: bool,
}

impl ExpertCosts {
    /// The placement-independent expert-parallel costs, `None` for a dense model.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        model: &ModelSpec,
        training: &TrainingSettings,
        config: &ParallelConfig,
        calibration: &Calibration,
        tables: &PerfTables,
        act_bytes: f64,
        grad_element: f64,
    ) -> Option<Self> {
        let moe = model.moe.as_ref()?;
        let pp = config.pp as usize;
        let ep = config.ep.max(1);
        let etp = config.etp.max(1);
        let t = config.tp.max(1) as f64;
        let tokens = model.seq_length as f64 * config.micro_batch as f64 / config.cp.max(1) as f64;
        let rank_tokens = if config.tp > 1 { tokens / t } else { tokens };
        let load = load_factor(moe);
        let k = moe.router_topk.max(1) as f64;
        let h = model.hidden_size as f64;
        let pair_bytes = match moe.dispatcher {
            Dispatcher::Alltoall | Dispatcher::Flex => {
                rank_tokens * k * h * act_bytes * load / ep as f64
            }
            Dispatcher::Allgather => rank_tokens * h * act_bytes,
        };
        let recompute_moe = config.recompute == Recompute::Selective
            && training.recompute_modules.contains(&RecomputeModule::Moe);
        let params = ParameterBreakdown::new(model, config.tp);
        let edp = (config
            .tp
            .saturating_mul(config.cp.max(1))
            .saturating_mul(config.dp)
            / ep.saturating_mul(etp))
        .max(1);
        let mut out = ExpertCosts {
            dispatcher: moe.dispatcher,
            ep: ep as usize,
            etp: etp as usize,
            edp: edp as usize,
            experts_per_rank: moe.num_experts as f64 / ep as f64,
            tokens_per_expert: rank_tokens * k * etp as f64 * load * ep as f64
                / moe.num_experts.max(1) as f64,
            pair_mb: pair_bytes / 1e6,
            token_mb: rank_tokens * h * act_bytes * load / 1e6,
            topk: k,
            collectives: Vec::with_capacity(pp),
            latency_ms: [0.0; GpuKind::ALL.len()],
            grad_bytes: Vec::with_capacity(pp),
            reduce_mb: Vec::with_capacity(pp),
            gather_mb: Vec::with_capacity(pp),
            moe_layers: Vec::with_capacity(pp),
            shared_overlap: moe.shared_expert_overlap,
        };
        for s in 0..pp {
            let layers = config.layers_per_stage[s];
            let decoder = moe_layers_in(Some(moe), stage_start(config, s), layers);
            out.moe_layers.push(decoder);
            let mut n = decoder;
            if s + 1 == pp && mtp_is_moe(model) {
                n += model.mtp_layers;
            }
            let per_layer = if recompute_moe { 6.0 } else { 4.0 };
            out.collectives
                .push(if ep > 1 { per_layer * n as f64 } else { 0.0 });
            let experts = params.experts_in(stage_start(config, s), layers) as f64
                + if s + 1 == pp {
                    params.mtp_experts as f64
                } else {
                    0.0
                };
            let per_gpu = experts / (ep * etp) as f64;
            let grad = per_gpu * grad_element;
            out.grad_bytes.push(grad);
            let (reduce, gather) = ring_sync_bytes(
                edp as usize,
                per_gpu,
                grad,
                gathered_expert_bytes(training, act_bytes),
                config.distributed_optimizer,
            );
            out.reduce_mb.push(reduce / 1e6);
            out.gather_mb.push(gather / 1e6);
        }
        for kind in GpuKind::ALL {
            let table = tables.get(kind);
            let latency = table.collective_latency(all_to_all_latency_group(ep as usize, table));
            out.latency_ms[kind.index()] =
                latency.all_gather * calibration.collective_latency_scale / 1e3;
        }
        Some(out)
    }
}

impl ExpertCosts {
    /// One member `a`'s dispatch (or combine): `on_node` members of its group on its node
    /// (itself included) at `intra` GB/s at worst, `off` members across the network at
    /// `inter` GB/s at worst, the two at once, the slower governing.
    #[inline]
    fn member_dispatch(
        &self,
        fabric: &(impl Fabric + ?Sized),
        a: Device,
        on_node: usize,
        off: usize,
        intra: f64,
        inter: f64,
    ) -> DispatchLink {
        let intra_ms = self.pair_mb * (on_node - 1) as f64 / intra;
        let mut inter_mb = self.pair_mb * off as f64;
        if self.dispatcher == Dispatcher::Flex && off > 0 {
            // DeepEP / HybridEP send a token once to each node that holds one of its
            // experts and forward it over NVLink there: with the group's experts spread
            // evenly over `n` nodes and uniform routing, a token reaches
            // (n − 1)(1 − miss) other nodes on average ([`node_miss`]).
            let n = self.ep as f64 / on_node as f64;
            let remote =
                (n - 1.0) * (1.0 - node_miss(self.experts_per_rank * self.ep as f64, n, self.topk));
            inter_mb = inter_mb.min(self.token_mb * remote);
        }
        let inter_ms = if off > 0 { inter_mb / inter } else { 0.0 };
        let intra_ms = if on_node > 1 { intra_ms } else { 0.0 };
        let latency = self.latency_ms[fabric.gpu_perf(a).kind.index()];
        DispatchLink {
            ms: intra_ms.max(inter_ms) + latency,
            crosses_nodes: off > 0,
            on_node,
            intra_gb_per_s: if on_node > 1 { intra } else { 0.0 },
            inter_gb_per_s: if off > 0 { inter } else { 0.0 },
        }
    }
}

/// The probability that a node holding `experts / n` of `experts` routed experts receives
/// none of a token's `k`: the router picks `k` distinct experts (top-k of the scores), so
/// it is `C(E − E/n, k) / C(E, k)` (uniform routing), not `(1 − 1/n)^k`, which draws them
/// with replacement (Qwen3-235B's 128 experts on 4 nodes, top 8: 9.3 %, not 10.0 %).
fn node_miss(experts: f64, n: f64, k: f64) -> f64 {
    let elsewhere = experts - experts / n;
    (0..k.round() as usize)
        .map(|i| ((elsewhere - i as f64) / (experts - i as f64)).max(0.0))
        .product()
}

/// Runs of consecutive members on one node that [`ConfigCosts::group_dispatch`] keeps on
/// the stack (a group of 64 nodes' worth); more go link by link.
const MAX_RUNS: usize = 64;

/// Routed-expert parameters of one GPU of stage `s` (they leave the dense data-parallel
/// reduce for the expert-data-parallel one).
pub(super) fn stage_expert_params(
    params: &ParameterBreakdown,
    config: &ParallelConfig,
    s: usize,
) -> f64 {
    let last = s + 1 == config.pp as usize;
    let experts = params.experts_in(stage_start(config, s), config.layers_per_stage[s]) as f64
        + if last { params.mtp_experts as f64 } else { 0.0 };
    experts / config.tp.max(1) as f64
}

/// The all-to-all of one expert-parallel group: (ms, whether it crosses nodes, the slowest
/// member's position in the stage).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DispatchLink {
    /// Milliseconds of one dispatch or combine collective.
    pub ms: f64,
    /// Some member sends over the network.
    pub crosses_nodes: bool,
    /// Members of the slowest member's group on its node.
    pub on_node: usize,
    /// The slowest member's NVLink and network figures, GB/s (0 where unused).
    pub intra_gb_per_s: f64,
    pub inter_gb_per_s: f64,
}

/// No all-to-all: the starting point of the slowest member's search.
const NO_DISPATCH: DispatchLink = DispatchLink {
    ms: 0.0,
    crosses_nodes: false,
    on_node: 0,
    intra_gb_per_s: 0.0,
    inter_gb_per_s: 0.0,
};

impl ConfigCosts {
    /// Whether the model has routed experts (and so expert terms in [`Self::evaluate`]).
    pub fn has_experts(&self) -> bool {
        self.expert.is_some()
    }

    /// Ranks of one pipeline stage.
    fn stage_ranks(&self, devices: &[Device]) -> usize {
        devices.len() / self.pp.max(1)
    }

    /// One dispatch (or combine) collective of stage `s`'s slowest expert-parallel group:
    /// each member sends its share to every other member, its intra-node share over
    /// NVLink and its inter-node share over the network at once, the slower governing.
    pub(super) fn stage_dispatch(
        &self,
        fabric: &(impl Fabric + ?Sized),
        devices: &[Device],
        s: usize,
    ) -> DispatchLink {
        let mut worst = NO_DISPATCH;
        for group in 0..self.expert_groups() {
            let link = self.group_dispatch(fabric, devices, s, group);
            if link.ms > worst.ms {
                worst = link;
            }
        }
        worst
    }

    /// Expert-parallel groups in one stage (0 without expert parallelism): group
    /// `g·etp + e` holds the stage's ranks `e + etp·(j + ep·g)`, `j < ep`.
    pub fn expert_groups(&self) -> usize {
        match &self.expert {
            Some(x) if x.ep > 1 => self.world_size() / self.pp.max(1) / (x.ep * x.etp) * x.etp,
            _ => 0,
        }
    }

    /// The expert-parallel group (as [`Self::expert_groups`] numbers them) of the rank at
    /// `rank` within its stage.
    pub fn expert_group_of(&self, rank: usize) -> usize {
        match &self.expert {
            Some(x) => rank / (x.ep * x.etp) * x.etp + rank % x.etp,
            None => 0,
        }
    }

    /// One dispatch (or combine) collective of expert-parallel group `group` of stage `s`:
    /// its slowest member's (see [`Self::stage_dispatch`], the slowest of these). Reads only
    /// the group's ranks, so the mapping's incremental evaluation caches it per group.
    ///
    /// The members come in runs of consecutive ranks on one node. A link to another node
    /// is that node pair's figure for every GPU of the two ([`Fabric::gb_per_s`]), so each
    /// run looks up one link per other run, and only links inside a node are taken GPU by
    /// GPU: `runs² + Σ members on a node²` look-ups instead of `ep²`, the same figures
    /// (minima of equal values), bit for bit what [`Self::pairwise_group_dispatch`] gives.
    pub fn group_dispatch(
        &self,
        fabric: &(impl Fabric + ?Sized),
        devices: &[Device],
        s: usize,
        group: usize,
    ) -> DispatchLink {
        let Some(x) = self.expert.as_ref().filter(|x| x.ep > 1) else {
            return NO_DISPATCH;
        };
        let block = self.stage_ranks(devices);
        let stage = &devices[block * s..block * (s + 1)];
        let (ep, etp) = (x.ep, x.etp);
        let (g, e) = (group / etp, group % etp);
        let member = |j: usize| stage[e + etp * (j + ep * g)];
        // Runs of consecutive members on one node: [start, end).
        let mut runs = [(0usize, 0usize); MAX_RUNS];
        let mut count = 0;
        let mut start = 0;
        for j in 1..=ep {
            if j == ep || member(j).node != member(start).node {
                if count == MAX_RUNS {
                    return self.pairwise_group_dispatch(fabric, devices, s, group);
                }
                runs[count] = (start, j);
                count += 1;
                start = j;
            }
        }
        let runs = &runs[..count];
        let mut worst = NO_DISPATCH;
        // The runs on this run's node (itself included), in run order: the members' loop
        // below visits these alone, in the order a scan of every run would, so the minima
        // and counts are the same, step for step.
        let mut same = [0u8; MAX_RUNS];
        for &(from, to) in runs {
            let first = member(from);
            let node = first.node;
            // The members on other nodes, one look-up per run.
            let (mut off, mut near) = (0usize, 0usize);
            let (mut inter, mut near_gb_per_s) = (f64::INFINITY, f64::INFINITY);
            let mut same_count = 0;
            for (k, &(other_from, other_to)) in runs.iter().enumerate() {
                let other = member(other_from);
                if other.node == node {
                    same[same_count] = k as u8;
                    same_count += 1;
                    continue;
                }
                let bw = fabric.gb_per_s(first, other);
                if fabric.over_network(node, other.node) {
                    off += other_to - other_from;
                    inter = inter.min(bw * fabric.nic_share(node, 1));
                } else {
                    near += other_to - other_from;
                    near_gb_per_s = near_gb_per_s.min(bw);
                }
            }
            for i in from..to {
                let a = member(i);
                let (mut on_node, mut intra) = (1 + near, near_gb_per_s);
                for &k in &same[..same_count] {
                    let (other_from, other_to) = runs[k as usize];
                    for j in (other_from..other_to).filter(|&j| j != i) {
                        on_node += 1;
                        intra = intra.min(fabric.gb_per_s(a, member(j)));
                    }
                }
                let link = x.member_dispatch(fabric, a, on_node, off, intra, inter);
                if link.ms > worst.ms {
                    worst = link;
                }
            }
        }
        worst
    }

    /// [`Self::group_dispatch`] link by link (every member to every other): what a group of
    /// more than [`MAX_RUNS`] runs takes, and the reference the fast path is tested against.
    pub fn pairwise_group_dispatch(
        &self,
        fabric: &(impl Fabric + ?Sized),
        devices: &[Device],
        s: usize,
        group: usize,
    ) -> DispatchLink {
        let mut worst = NO_DISPATCH;
        let Some(x) = self.expert.as_ref().filter(|x| x.ep > 1) else {
            return worst;
        };
        let block = self.stage_ranks(devices);
        let stage = &devices[block * s..block * (s + 1)];
        let (ep, etp) = (x.ep, x.etp);
        let (g, e) = (group / etp, group % etp);
        let member = |j: usize| stage[e + etp * (j + ep * g)];
        for i in 0..ep {
            let a = member(i);
            let (mut on_node, mut intra, mut inter) = (1usize, f64::INFINITY, f64::INFINITY);
            let mut off = 0usize;
            for j in 0..ep {
                if j == i {
                    continue;
                }
                let b = member(j);
                if fabric.over_network(a.node, b.node) {
                    off += 1;
                    inter = inter.min(fabric.gb_per_s(a, b) * fabric.nic_share(a.node, 1));
                } else {
                    on_node += 1;
                    intra = intra.min(fabric.gb_per_s(a, b));
                }
            }
            let link = x.member_dispatch(fabric, a, on_node, off, intra, inter);
            if link.ms > worst.ms {
                worst = link;
            }
        }
        worst
    }

    /// Stage `s`'s dispatch and combine collectives for one micro-batch, ms, less what the
    /// shared expert hides when it overlaps them.
    pub fn stage_dispatch_ms(
        &self,
        fabric: &(impl Fabric + ?Sized),
        devices: &[Device],
        s: usize,
    ) -> f64 {
        let Some(x) = &self.expert else { return 0.0 };
        if x.ep < 2 || x.collectives[s] == 0.0 {
            return 0.0;
        }
        self.stage_dispatch_ms_from(
            fabric,
            devices,
            s,
            self.stage_dispatch(fabric, devices, s).ms,
        )
    }

    /// [`Self::stage_dispatch_ms`] from the stage's slowest collective (the largest
    /// [`Self::group_dispatch`] of its groups, ms).
    pub fn stage_dispatch_ms_from(
        &self,
        fabric: &(impl Fabric + ?Sized),
        devices: &[Device],
        s: usize,
        collective_ms: f64,
    ) -> f64 {
        let Some(x) = &self.expert else { return 0.0 };
        if x.ep < 2 || x.collectives[s] == 0.0 {
            return 0.0;
        }
        let ms = x.collectives[s] * collective_ms;
        if !x.shared_overlap {
            return ms;
        }
        // `--moe-shared-expert-overlap`: the shared expert's forward runs beside the forward
        // dispatch and combine (half the collectives without recomputation).
        let block = self.stage_ranks(devices);
        let perf = fabric.gpu_perf(devices[block * s]);
        let hidden = self.expert_ops.get(perf.kind.index()).map_or(0.0, |ops| {
            x.moe_layers[s] as f64 * ops.shared.0.ms(perf.ms_per_peak_gflop)
        });
        ms - hidden.min(ms / 2.0)
    }

    /// The all-to-all term of the iteration: `(m + (pp − 1)/v)` micro-batch slots of the
    /// slowest stage's dispatch and combine.
    pub fn dispatch_ms(&self, fabric: &(impl Fabric + ?Sized), devices: &[Device]) -> f64 {
        if self.expert.as_ref().is_none_or(|x| x.ep < 2) {
            return 0.0;
        }
        let worst = (0..self.pp)
            .map(|s| self.stage_dispatch_ms(fabric, devices, s))
            .fold(0.0, f64::max);
        self.dispatch_slots() * worst
    }

    /// Slots the all-to-all is paid in: the steady state's and the bubble's.
    pub fn dispatch_slots(&self) -> f64 {
        self.microbatches as f64 + (self.pp - 1) as f64 / self.vpp as f64
    }

    /// Stage `s`'s expert-data-parallel synchronisation, exposed part: the routed experts'
    /// gradient reduce (and the distributed optimizer's parameter gather) over rings of the
    /// `edp` ranks `ep·etp` apart, in the overlap window the dense reduce leaves.
    pub fn stage_expert_sync(
        &self,
        fabric: &(impl Fabric + ?Sized),
        devices: &[Device],
        s: usize,
    ) -> (f64, f64) {
        if self.expert_ring_ranks() == 0 {
            return (0.0, 0.0);
        }
        let block = self.stage_ranks(devices);
        let stage = &devices[block * s..block * (s + 1)];
        let mut bw = f64::INFINITY;
        let mut ms_per_gflop = f64::NEG_INFINITY;
        for (rank, &device) in stage.iter().enumerate().take(self.expert_ring_ranks()) {
            bw = bw.min(self.expert_ring_link(fabric, devices, s, rank));
            ms_per_gflop = ms_per_gflop.max(fabric.ms_per_gflop(device));
        }
        self.stage_expert_sync_from(s, bw, ms_per_gflop)
    }

    /// The expert-data-parallel ring link from the stage's rank `rank` to the next member
    /// of its ring (`ep·etp` ranks on, wrapping), GB/s; infinite without expert-data
    /// parallelism. Reads the two ranks only.
    pub fn expert_ring_link(
        &self,
        fabric: &(impl Fabric + ?Sized),
        devices: &[Device],
        s: usize,
        rank: usize,
    ) -> f64 {
        let Some(x) = self.expert.as_ref().filter(|x| x.edp > 1) else {
            return f64::INFINITY;
        };
        let block = self.stage_ranks(devices);
        let stride = x.ep * x.etp;
        let next = if rank + stride >= stride * x.edp {
            rank % stride
        } else {
            rank + stride
        };
        let (a, b) = (devices[block * s + rank], devices[block * s + next]);
        dp_ring_link(fabric, a, b, stride.min(self.tp.max(1) * stride))
    }

    /// Ranks between two members of an expert-data-parallel ring: ep × etp (1 for a dense
    /// model).
    pub fn expert_stride(&self) -> usize {
        self.expert.as_ref().map_or(1, |x| x.ep * x.etp)
    }

    /// The ranks of a stage that are in an expert-data-parallel ring (0 without one).
    pub fn expert_ring_ranks(&self) -> usize {
        match &self.expert {
            Some(x) if x.edp > 1 => x.ep * x.etp * x.edp,
            _ => 0,
        }
    }

    /// [`Self::stage_expert_sync`] from the slowest ring link of the stage (GB/s) and its
    /// slowest GPU (ms per GFLOP).
    pub fn stage_expert_sync_from(&self, s: usize, bw: f64, ms_per_gflop: f64) -> (f64, f64) {
        let Some(x) = self.expert.as_ref().filter(|x| x.edp > 1) else {
            return (0.0, 0.0);
        };
        let reduce = x.reduce_mb[s] / bw;
        let gather = x.gather_mb[s] / bw;
        // The window the dense reduce leaves unused.
        let dense_reduce = if self.dp > 1 {
            self.dp_reduce_mb[s] / bw
        } else {
            0.0
        };
        let dense_gather = if self.dp > 1 {
            self.dp_gather_mb[s] / bw
        } else {
            0.0
        };
        let grad_window = times(self.grad_overlap, self.bwd_gflop[s] * ms_per_gflop);
        let gather_window = times(self.gather_overlap, self.fwd_gflop[s] * ms_per_gflop);
        let left = |window: f64, used: f64| (window - used).max(0.0);
        (
            (reduce - left(grad_window, dense_reduce)).max(0.0),
            (gather - left(gather_window, dense_gather)).max(0.0),
        )
    }

    /// The largest exposed expert-data-parallel synchronisation of any stage (reduce plus
    /// gather), ms.
    pub fn expert_sync_ms(&self, fabric: &(impl Fabric + ?Sized), devices: &[Device]) -> f64 {
        if self.expert.as_ref().is_none_or(|x| x.edp < 2) {
            return 0.0;
        }
        (0..self.pp)
            .map(|s| {
                let (r, g) = self.stage_expert_sync(fabric, devices, s);
                r + g
            })
            .fold(0.0, f64::max)
    }
}

/// The expert-parallel part of an estimate, for the report: every MoE, MLA and MTP term of
/// the critical stage per micro-batch, and the all-to-all with the links it runs over.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExpertTime {
    /// `--moe-token-dispatcher-type`.
    pub dispatcher: &'static str,
    pub ep: u64,
    pub etp: u64,
    pub expert_dp: u64,
    pub experts_per_rank: f64,
    /// Tokens each local expert computes per micro-batch on the busiest rank (the GEMMs' m).
    pub tokens_per_expert: f64,
    /// The busiest rank's load over an even split ([`load_factor`]).
    pub load_factor: f64,
    /// Compute of the critical stage per micro-batch (forward + backward), ms.
    pub router_ms: f64,
    pub permute_ms: f64,
    pub experts_ms: f64,
    pub shared_expert_ms: f64,
    /// The dense MLP the MoE layers do not run (already left out of the compute), ms.
    pub dense_mlp_replaced_ms: f64,
    /// Multi-latent attention's projections beyond the dense QKV and output ones, ms.
    pub mla_ms: f64,
    /// The multi-token-prediction block on the last stage, ms.
    pub mtp_ms: f64,
    /// Dispatch/combine collectives per micro-batch of the slowest stage.
    pub collectives_per_microbatch: f64,
    /// One collective of the slowest expert-parallel group.
    pub dispatch: DispatchLink,
    /// The slowest stage's dispatch and combine per micro-batch, ms.
    pub dispatch_per_microbatch_ms: f64,
    /// In the iteration: `(m + (pp − 1)/v)` × the above.
    pub dispatch_ms: f64,
    /// The routed experts' gradient reduce and parameter gather over expert-DP, exposed.
    pub expert_dp_exposed_ms: f64,
}

impl ConfigCosts {
    /// The report's expert part (`None` for a dense model without MLA or MTP).
    pub(super) fn expert_report(
        &self,
        fabric: &(impl Fabric + ?Sized),
        devices: &[Device],
        critical: usize,
        critical_gpu: Device,
    ) -> Option<ExpertTime> {
        let x = self.expert.as_ref();
        if x.is_none() && self.expert_ops.is_empty() {
            return None;
        }
        let perf = fabric.gpu_perf(critical_gpu);
        let ops = self.expert_ops.get(perf.kind.index())?;
        let at = |c: OpCost| c.ms(perf.ms_per_peak_gflop);
        let moe = x.map_or(0, |x| x.moe_layers[critical]) as f64;
        let layers = self.layers[critical] as f64;
        let last = critical + 1 == self.pp;
        let worst = (0..self.pp)
            .max_by(|&a, &b| {
                self.stage_dispatch_ms(fabric, devices, a)
                    .total_cmp(&self.stage_dispatch_ms(fabric, devices, b))
            })
            .unwrap_or(0);
        let dispatch = self.stage_dispatch(fabric, devices, worst);
        let per_microbatch = self.stage_dispatch_ms(fabric, devices, worst);
        Some(ExpertTime {
            dispatcher: x.map_or("none", |x| x.dispatcher.megatron_name()),
            ep: x.map_or(1, |x| x.ep as u64),
            etp: x.map_or(1, |x| x.etp as u64),
            expert_dp: x.map_or(1, |x| x.edp as u64),
            experts_per_rank: x.map_or(0.0, |x| x.experts_per_rank),
            tokens_per_expert: x.map_or(0.0, |x| x.tokens_per_expert),
            load_factor: self.load,
            router_ms: moe * at(sum(ops.router)),
            permute_ms: moe * at(sum(ops.permute)),
            experts_ms: moe * at(sum(ops.experts)),
            shared_expert_ms: moe * at(sum(ops.shared)),
            dense_mlp_replaced_ms: moe * at(sum(ops.dense_mlp)),
            mla_ms: if self.has_mla {
                layers * at(sum(ops.mla))
            } else {
                0.0
            },
            mtp_ms: if last { at(sum(ops.mtp)) } else { 0.0 },
            collectives_per_microbatch: x.map_or(0.0, |x| x.collectives[worst]),
            dispatch,
            dispatch_per_microbatch_ms: per_microbatch,
            dispatch_ms: self.dispatch_ms(fabric, devices),
            expert_dp_exposed_ms: self.expert_sync_ms(fabric, devices),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::cluster::ClusterProfile;
    use crate::config::megatron::model_from_megatron_args;
    use crate::config::{Precision, TrainingSettings};
    use crate::model::calibration::Calibration;
    use crate::model::parallel::{ParallelConfig, Placement};
    use crate::model::time::{estimate, TimeEstimate, TimeModel, TimeOptions, TimeRequest};

    fn model(moe: bool) -> crate::config::ModelSpec {
        let mut args = "--num-layers 4 --hidden-size 1024 --ffn-hidden-size 4096 \
                        --num-attention-heads 16 --seq-length 2048 \
                        --max-position-embeddings 2048 --vocab-size 32000 --swiglu \
                        --micro-batch-size 1 --global-batch-size 64 --bf16"
            .to_string();
        if moe {
            args.push_str(
                " --num-experts 16 --moe-router-topk 2 --moe-ffn-hidden-size 1024 \
                 --moe-token-dispatcher-type alltoall",
            );
        }
        let words: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        model_from_megatron_args(&words, None).unwrap()
    }

    /// tp 1, pp 1, dp 16 on two 8-GPU H100 nodes, experts over `ep` ranks.
    fn run(model: &crate::config::ModelSpec, ep: u64) -> TimeEstimate {
        let cluster = ClusterProfile::from_json_str(
            include_str!("../../../examples/clusters/h100-16x8.json"),
            "h100-16x8.json",
        )
        .unwrap();
        let training = TrainingSettings::new(64, Precision::Bf16);
        let mut config = ParallelConfig::even(model.num_layers, 1, 1, 16, 1);
        config.ep = ep;
        estimate(
            &TimeRequest {
                model,
                training: &training,
                config: &config,
                cluster: &cluster,
                placement: &Placement::identity(16, 8),
                calibration: &Calibration::default(),
                options: TimeOptions::default(),
            },
            TimeModel::Pipette,
        )
        .unwrap()
    }

    /// FP8 quantises every GEMM operand where the GEMM runs: an MoE layer takes the dense
    /// MLP's quantisation back out with its GEMMs and pays the experts' over their rows
    /// (tokens × top-k × the dropless load) and widths, one kernel per grouped GEMM.
    #[test]
    fn fp8_experts_pay_their_own_quantisation_and_not_the_dense_mlps() {
        use super::super::ops::{KindOps, OpShape};
        use super::super::perf::{GpuKind, PerfTable};
        use super::{ExpertKindOps, ExpertShape, DROPLESS_LOAD};
        use crate::config::LowBits;
        use crate::model::memory::AttentionKernel;
        let mut moe = model(true);
        if let Some(m) = moe.moe.as_mut() {
            m.grouped_gemm = true;
        }
        let table = PerfTable::get(GpuKind::H100);
        let calibration = Calibration::default();
        let expert = ExpertShape {
            moe: moe.moe.as_ref(),
            mla: None,
            ep: 8,
            etp: 1,
            cp: 1,
            modules: &[],
            selective: false,
        };
        let ops = |low_precision| {
            let shape = OpShape {
                model: &moe,
                micro_batch: 1,
                tp: 1,
                sequence_parallel: false,
                act_bytes: 2.0,
                attention: AttentionKernel::Fused,
                fused_softmax: true,
                low_precision,
                context_parallel: 1,
            };
            let dense = KindOps::new(&shape, table, &calibration);
            ExpertKindOps::new(&shape, &expert, table, &calibration, &dense)
        };
        let (bf16, fp8) = (ops(None), ops(Some(LowBits::Fp8)));
        // Read 2 bytes, write the row-wise and column-wise FP8 copies: 4 bytes an element.
        let hbm = table.hbm_gb_per_s * 1e6;
        let kernel = table.memory_kernel_us / 1e3;
        let quant = |elements: f64| elements * 4.0 / hbm + 2.0 * kernel;
        let (tokens, h) = (2048.0, 1024.0);
        let rows = tokens * 2.0 * DROPLESS_LOAD;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9 * b.abs().max(1e-9);
        // Experts of width 1024 (SwiGLU: 2048 up): inputs h and 1024 forward, gradients
        // 2048 and h backward.
        let experts = |o: &ExpertKindOps| (o.experts.0.fixed_ms, o.experts.1.fixed_ms);
        assert!(close(
            experts(&fp8).0 - experts(&bf16).0,
            quant(rows * (h + 1024.0))
        ));
        assert!(close(
            experts(&fp8).1 - experts(&bf16).1,
            quant(rows * (2048.0 + h))
        ));
        // The dense MLP (4096 wide) the layer does not run, its quantisation with it.
        assert!(close(
            fp8.dense_mlp.0.fixed_ms - bf16.dense_mlp.0.fixed_ms,
            quant(tokens * (h + 4096.0))
        ));
        assert!(close(
            fp8.dense_mlp.1.fixed_ms - bf16.dense_mlp.1.fixed_ms,
            quant(tokens * (8192.0 + h))
        ));
    }

    #[test]
    fn an_expert_group_across_nodes_pays_the_network_for_its_all_to_all() {
        let moe = model(true);
        let inside = run(&moe, 8);
        let across = run(&moe, 16);
        let (a, b) = (inside.expert.unwrap(), across.expert.unwrap());
        assert!(
            !a.dispatch.crosses_nodes && b.dispatch.crosses_nodes,
            "{a:?} {b:?}"
        );
        assert!(b.dispatch.ms > 2.0 * a.dispatch.ms, "{a:?} {b:?}");
        // Four all-to-alls per MoE layer and micro-batch, over every slot.
        assert_eq!(a.collectives_per_microbatch, 16.0);
        assert!((a.dispatch_ms - 4.0 * a.dispatch_per_microbatch_ms).abs() < 1e-9);
        // Twice the experts per rank: each computes half the tokens per expert.
        assert!((a.experts_per_rank - 2.0 * b.experts_per_rank).abs() < 1e-12);
        assert!((b.tokens_per_expert - 2.0 * a.tokens_per_expert).abs() < 1e-9);
        // The report names the all-to-all and where it runs.
        assert!(
            across
                .notes
                .iter()
                .any(|n| n.contains("alltoall dispatch and combine") && n.contains("across nodes")),
            "{:?}",
            across.notes
        );
        // The terms add up to the iteration.
        let sum = across.steady_ms
            + across.bubble_ms
            + across.pipeline_p2p_ms
            + across.data_parallel_exposed_ms
            + across.param_gather_exposed_ms
            + across.optimizer_ms
            + across.expert_parallel_ms
            + across.expert_dp_exposed_ms;
        assert!((sum - across.iteration_ms).abs() < 1e-6 * across.iteration_ms);
    }

    /// An all-to-all posts every peer's message at once: its start-up is the measured
    /// figure of its group up to the largest measured one (8 H100), and that figure past
    /// it, not a ring's `ep − 1` steps (an EP 32 all-to-all had paid 4.4 times the 8-GPU
    /// figure, EP 128 18 times).
    #[test]
    fn an_all_to_all_waits_one_exchange_not_a_ring_of_its_group() {
        use super::super::perf::{GpuKind, PerfTable, PerfTables};
        use super::{all_to_all_latency_group, ExpertCosts};
        let h100 = PerfTable::get(GpuKind::H100);
        assert_eq!(h100.largest_measured_group(), 8);
        for (ep, group) in [(2, 2), (4, 4), (8, 8), (16, 8), (32, 8), (128, 8)] {
            assert_eq!(all_to_all_latency_group(ep, h100), group, "ep {ep}");
        }
        let moe = model(true);
        let training = TrainingSettings::new(64, Precision::Bf16);
        let latency = |ep: u64| {
            let mut config = ParallelConfig::even(moe.num_layers, 1, 1, 16, 1);
            config.ep = ep;
            let costs = ExpertCosts::new(
                &moe,
                &training,
                &config,
                &Calibration::default(),
                PerfTables::shipped(),
                2.0,
                4.0,
            )
            .unwrap();
            costs.latency_ms[GpuKind::H100.index()]
        };
        let eight = h100.collective_latency(8).all_gather / 1e3;
        assert!(eight > 0.0);
        assert_eq!(latency(8), eight);
        assert_eq!(latency(16), eight);
        assert_eq!(latency(4), h100.collective_latency(4).all_gather / 1e3);
    }

    /// A token's top-k experts are distinct: the chance a node of the group holds none of
    /// them is the hypergeometric one (drawing without replacement).
    #[test]
    fn a_node_misses_a_token_s_distinct_experts_as_drawn_without_replacement() {
        use super::node_miss;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        // 128 experts on 4 nodes, top 8: C(96, 8) / C(128, 8).
        let exact: f64 = (0..8)
            .map(|i| (96.0 - i as f64) / (128.0 - i as f64))
            .product();
        assert!(close(node_miss(128.0, 4.0, 8.0), exact));
        assert!(
            exact < 0.75f64.powi(8) && (exact - 0.0927).abs() < 1e-4,
            "{exact}"
        );
        // One expert per node and top 1: the token lands elsewhere with (n − 1)/n.
        assert!(close(node_miss(8.0, 8.0, 1.0), 7.0 / 8.0));
        // More experts per token than the other nodes hold: every node gets one.
        assert_eq!(node_miss(8.0, 2.0, 5.0), 0.0);
    }

    #[test]
    fn a_dense_model_has_no_expert_terms_and_ep_one_no_all_to_all() {
        let dense = run(&model(false), 1);
        assert!(dense.expert.is_none());
        assert_eq!(dense.expert_parallel_ms + dense.expert_dp_exposed_ms, 0.0);
        let local = run(&model(true), 1).expert.unwrap();
        assert_eq!(local.dispatch_ms, 0.0);
        assert!(local.experts_ms > 0.0 && local.router_ms > 0.0 && local.permute_ms > 0.0);
    }
}
