//! Per-operation compute costs of one pipeline stage and micro-batch on one GPU kind: every
//! linear layer's three GEMMs with Megatron's shapes, the attention core, and the
//! memory-bound kernels, priced with the kind's table ([`super::perf`]: shipped, or measured
//! by the profile's sweep).
//!
//! Shapes, for micro-batch `b`, sequence `s`, tokens `T = s·b`, hidden `h`, ffn `f`, query
//! width `q`, key/value width `kv`, tensor-parallel size `t` and padded vocabulary `V`:
//!
//! | layer | in → out per GPU |
//! |---|---|
//! | QKV (column-parallel) | h → (q + 2·kv)/t |
//! | attention output (row-parallel) | q/t → h |
//! | MLP up (column-parallel; gate and up with SwiGLU) | h → f/t (2·f/t) |
//! | MLP down (row-parallel) | f/t → h |
//! | logits (last stage, vocabulary-parallel) | h → V/t |
//!
//! Each is three GEMMs of `2·T·in·out` FLOPs: forward `T × out × in`, input gradient
//! `T × in × out`, weight gradient `out × in × T` (m × n × k), each at its table efficiency.
//! The attention core (flash attention: scores and context of `b·heads/t` heads, `s × s`
//! by the head width, causal FLOPs) is priced as a GEMM of that shape, backward twice the
//! forward. Memory-bound kernels (norms, bias-dropout-add, the activation, rotary
//! embedding, embedding lookup, cross-entropy) cost bytes ÷ attained HBM bandwidth plus the
//! table's fixed cost per kernel; their backward moves about twice the bytes in as many
//! kernels. With sequence parallelism the norms and dropouts see `T/t` tokens. Unfused
//! attention's scores go through Megatron's fused softmax where its kernel runs, else
//! through PyTorch's fp32 softmax, five kernels each way ([`fused_softmax_available`]).
//!
//! Every figure is independent of the placement, so the time model computes it once per
//! configuration and GPU kind.

use crate::cluster::profile::{AttentionShape, GemmLayout, GemmShape};
use crate::config::{LowBits, ModelSpec, PositionEmbedding};
use crate::model::calibration::Calibration;
use crate::model::context::attention_work_factor;
use crate::model::flops::{AttentionMask, LayerFlops};
use crate::model::memory::AttentionKernel;
use crate::model::params::padded_vocab_size;

use super::perf::{Layout, PerfTable};

/// Compute of one stage for one micro-batch on one GPU: GEMM work in GFLOP at 100 % of the
/// table (FLOPs ÷ efficiency; multiply by the GPU's ms per peak GFLOP) and memory-bound
/// milliseconds (independent of the GPU's FLOPS).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpCost {
    pub gflop: f64,
    pub fixed_ms: f64,
}

impl OpCost {
    fn add(&mut self, other: OpCost, times: f64) {
        self.gflop += other.gflop * times;
        self.fixed_ms += other.fixed_ms * times;
    }

    /// Milliseconds on a GPU that needs `ms_per_peak_gflop` per GFLOP at 100 %.
    #[inline]
    pub fn ms(&self, ms_per_peak_gflop: f64) -> f64 {
        self.gflop * ms_per_peak_gflop + self.fixed_ms
    }
}

/// One stage's forward, backward (recomputation included) and recomputation costs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageOps {
    pub forward: OpCost,
    pub backward: OpCost,
    pub recompute: OpCost,
}

impl StageOps {
    /// Forward and backward: one micro-batch slot's compute.
    pub fn slot(&self) -> OpCost {
        OpCost {
            gflop: self.forward.gflop + self.backward.gflop,
            fixed_ms: self.forward.fixed_ms + self.backward.fixed_ms,
        }
    }
}

/// What one stage holds.
#[derive(Debug, Clone, Copy)]
pub struct StageShape {
    pub layers: u64,
    pub first: bool,
    pub last: bool,
    /// Layers whose whole forward pass is redone in the backward pass.
    pub recomputed_layers: u64,
    /// Only the attention core is redone (selective recomputation).
    pub selective: bool,
    /// Of `layers`, those kept in BF16 under FP8 or FP4 (`--first-last-layers-bf16`,
    /// [`crate::config::LowPrecision::bf16_layers_in`]).
    pub bf16_layers: u64,
}

/// The parts of a configuration that shape the operations.
#[derive(Debug, Clone, Copy)]
pub struct OpShape<'a> {
    pub model: &'a ModelSpec,
    pub micro_batch: u64,
    pub tp: u64,
    pub sequence_parallel: bool,
    /// Bytes per activation element.
    pub act_bytes: f64,
    pub attention: AttentionKernel,
    /// Unfused attention runs Megatron's fused softmax kernel
    /// ([`fused_softmax_available`]), not PyTorch's.
    pub fused_softmax: bool,
    /// The transformer layers' linear GEMMs run in FP8 or FP4 (`--fp8-format`,
    /// `--fp4-format`); attention and the output layer stay 16-bit.
    pub low_precision: Option<LowBits>,
    /// Context-parallel size: `model` is one rank's view (sequence s/cp), whose attention
    /// core is cp times smaller than the rank's real share
    /// ([`crate::model::context::attention_work_factor`]).
    pub context_parallel: u64,
}

/// Bytes written per element when Transformer Engine quantises a GEMM operand: the
/// row-wise and the column-wise (transposed, for the other two GEMMs) copies, one byte
/// each in FP8; in NVFP4 half a byte each plus an FP8 scale per 16 elements.
pub(super) fn quantised_bytes(bits: LowBits) -> f64 {
    match bits {
        LowBits::Fp8 => 2.0,
        LowBits::Fp4 => 2.0 * (0.5 + 1.0 / 16.0),
    }
}

/// Bytes per element of what Transformer Engine all-gathers when it quantises a GEMM
/// operand before gathering it: the row-wise copy alone (TE transposes after the gather
/// where it needs the column-wise one), half of [`quantised_bytes`]: one byte in FP8.
pub(super) fn gathered_bytes(bits: LowBits) -> f64 {
    quantised_bytes(bits) / 2.0
}

/// One transformer layer's linear layers on one GPU of a tp group of `t`, as (in, out):
/// QKV, attention output, MLP up (gate and up with SwiGLU), MLP down.
fn layer_linears(model: &ModelSpec, t: f64) -> [(f64, f64); 4] {
    let h = model.hidden_size as f64;
    let f = model.ffn_hidden_size as f64;
    let q = (model.num_attention_heads * model.kv_channels) as f64;
    let kv = (model.num_query_groups * model.kv_channels) as f64;
    let up = if model.swiglu { 2.0 * f / t } else { f / t };
    [(h, (q + 2.0 * kv) / t), (q / t, h), (h, up), (f / t, h)]
}

/// The most GEMM shapes a profile's sweep measures: on a GPU each takes milliseconds, and
/// the probe's time budget stops it anyway.
pub const MAX_SWEEP_GEMMS: usize = 96;

/// The shapes the time model prices `model` with, for a profile's sweep: for every
/// tensor-parallel size in `tps` (those that divide the heads and query groups) and
/// micro-batch in `micro_batches`, the three GEMMs of every linear layer (and the logits')
/// as [`KindOps::new`] prices them, and the attention core. Micro-batch by micro-batch,
/// so that the smallest are kept when there are more than [`MAX_SWEEP_GEMMS`].
pub fn sweep_shapes(
    model: &ModelSpec,
    tps: &[u64],
    micro_batches: &[u64],
) -> (Vec<GemmShape>, Vec<AttentionShape>) {
    let mut gemms: Vec<GemmShape> = Vec::new();
    let mut attention: Vec<AttentionShape> = Vec::new();
    let whole = |x: f64| (x.round() as u64).max(1);
    for &b in micro_batches {
        for &tp in tps.iter().filter(|&&tp| {
            tp >= 1 && model.num_attention_heads % tp == 0 && model.num_query_groups % tp == 0
        }) {
            let t = tp as f64;
            let tokens = model.seq_length * b;
            let mut linears = layer_linears(model, t).to_vec();
            if model.vocab_size > 0 {
                linears.push((
                    model.hidden_size as f64,
                    padded_vocab_size(model, tp) as f64 / t,
                ));
            }
            for (input, output) in linears {
                let (i, o) = (whole(input), whole(output));
                for shape in [
                    GemmShape {
                        m: tokens,
                        n: o,
                        k: i,
                        layout: GemmLayout::Fwd,
                    },
                    GemmShape {
                        m: tokens,
                        n: i,
                        k: o,
                        layout: GemmLayout::Dgrad,
                    },
                    GemmShape {
                        m: o,
                        n: i,
                        k: tokens,
                        layout: GemmLayout::Wgrad,
                    },
                ] {
                    if !gemms.contains(&shape) && gemms.len() < MAX_SWEEP_GEMMS {
                        gemms.push(shape);
                    }
                }
            }
            let heads = AttentionShape {
                batch_heads: b * model.num_attention_heads / tp,
                seq: model.seq_length,
                head_dim: model.kv_channels,
            };
            if !attention.contains(&heads) {
                attention.push(heads);
            }
        }
    }
    (gemms, attention)
}

/// Kernels PyTorch's softmax path runs beyond the fused kernel it replaces, each way
/// (to fp32, scale, mask, softmax, back: five instead of one).
pub const FALLBACK_SOFTMAX_EXTRA_KERNELS: f64 = 4.0;

/// The operations the host issues in one forward pass of a Megatron GPT layer (unfused
/// attention, tensor parallel, Megatron's fusions on), which the calibration's
/// `host_layer_pass_ms` pays for: input norm, QKV GEMM, scores (baddbmm), fused softmax,
/// attention dropout, context (bmm), the permute's copy, projection GEMM, its all-reduce,
/// bias-dropout-add, second norm, MLP up GEMM, bias-GeLU, MLP down GEMM, its all-reduce,
/// bias-dropout-add, and the two buffer allocations Megatron makes for the scores and the
/// context (counted from `megatron/model/transformer.py` `ParallelTransformerLayer`). An
/// extra operation costs the host a share of a layer pass.
pub const MEGATRON_LAYER_PASS_OPS: f64 = 18.0;

/// Whether Megatron's fused causal scale-mask-softmax kernel runs for unfused attention at
/// this micro-batch and tensor-parallel size. Megatron checks, per call,
/// `16 < sk <= 4096`, `sq % 4 == 0`, `sk % 4 == 0` and that the `b · heads/t` score
/// matrices are a multiple of 4 (the kernel's batches per block for `sk > 128`; 8 at or
/// below 128 keys) and otherwise falls back to PyTorch's softmax in fp32
/// (Megatron-LM `megatron/core/fusions/fused_softmax.py` `FusedScaleMaskSoftmax.
/// is_kernel_available` and `forward_torch_softmax`, and the legacy
/// `megatron/model/fused_softmax.py`; fp32 because query-key layer scaling, on by default
/// before Megatron core, turns `attention_softmax_in_fp32` on). So micro-batch 1 with two
/// heads per GPU (16 heads at tp 8) runs the slow path: vTrain's one-node A100 runs show it
/// (data/vtrain/ground_truth_single.csv: at tp 8 a micro-batch of 1 costs more
/// per layer than one of 2).
pub fn fused_softmax_available(model: &ModelSpec, micro_batch: u64, tp: u64) -> bool {
    let s = model.seq_length;
    let batches = micro_batch * (model.num_attention_heads / tp.max(1));
    let per_block = if s <= 128 { 8 } else { 4 };
    16 < s && s <= 4096 && s % 4 == 0 && batches % per_block == 0
}

/// Costs of one transformer layer and the stage extras on one GPU kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct KindOps {
    layer_fwd: OpCost,
    layer_bwd: OpCost,
    /// One layer with 16-bit GEMMs, (forward, backward), where the layers run in FP8 or
    /// FP4 and some stay in BF16 ([`Self::with_bf16_layers`]).
    layer_bf16: Option<(OpCost, OpCost)>,
    attention_fwd: OpCost,
    first_fwd: OpCost,
    first_bwd: OpCost,
    last_fwd: OpCost,
    last_bwd: OpCost,
    /// One layer's linear GEMMs, forward and backward, at 100 % of the table: the
    /// attention's (QKV and output projection) and the MLP's (up and down), at the
    /// low-precision rate where the layers run in FP8 or FP4.
    attention_linears_gflop: f64,
    mlp_linears_gflop: f64,
    /// The low-precision GEMMs' speed-up over 16 bits (1 without).
    low_speedup: f64,
    /// Some GEMM shape was not in the table.
    pub interpolated: bool,
    pub extrapolated: bool,
}

impl KindOps {
    /// The per-layer and per-stage costs of `shape` on the GPU kind of `table`.
    pub fn new(shape: &OpShape<'_>, table: &PerfTable, calibration: &Calibration) -> Self {
        let model = shape.model;
        let t = shape.tp as f64;
        let tokens = (model.seq_length * shape.micro_batch) as f64;
        let h = model.hidden_size as f64;
        let f = model.ffn_hidden_size as f64;
        let q = (model.num_attention_heads * model.kv_channels) as f64;
        let kv = (model.num_query_groups * model.kv_channels) as f64;
        let e = shape.act_bytes;
        let sp_tokens = if shape.sequence_parallel && shape.tp > 1 {
            tokens / t
        } else {
            tokens
        };
        let mut ops = KindOps::default();
        let mut flags = (false, false);
        let mut gemm = |m: f64, n: f64, k: f64, layout: Layout| -> f64 {
            let eff = table.gemm_efficiency(m, n, k, layout);
            flags.0 |= eff.interpolated;
            flags.1 |= eff.extrapolated;
            2.0 * m * n * k / 1e9 / eff.value
        };
        // A linear layer `in → out` over the tokens: (forward, backward) work.
        let mut linear = |input: f64, output: f64| -> (f64, f64) {
            let fwd = gemm(tokens, output, input, Layout::Fwd);
            let bwd = gemm(tokens, input, output, Layout::Dgrad)
                + gemm(output, input, tokens, Layout::Wgrad);
            (fwd, bwd)
        };
        // FP8/FP4: the linear GEMMs at the kind's low-precision rate for their shape (its
        // 16-bit efficiency there times the speed-up, [`super::perf::GpuKind::low_precision_speedup`]);
        // a kind without such tensor cores keeps its 16-bit rate.
        let low = shape
            .low_precision
            .and_then(|bits| Some((bits, table.kind.low_precision_speedup(bits)?)));
        let speedup = low.map_or(1.0, |(_, x)| x);
        ops.low_speedup = speedup;
        for (i, (input, output)) in layer_linears(model, t).into_iter().enumerate() {
            let (fwd, bwd) = linear(input, output);
            ops.layer_fwd.gflop += fwd / speedup;
            ops.layer_bwd.gflop += bwd / speedup;
            if i < 2 {
                ops.attention_linears_gflop += (fwd + bwd) / speedup;
            } else {
                ops.mlp_linears_gflop += (fwd + bwd) / speedup;
            }
        }
        let logits = if shape.model.vocab_size > 0 {
            let v = padded_vocab_size(model, shape.tp) as f64 / t;
            linear(h, v)
        } else {
            (0.0, 0.0)
        };
        // Attention core: b·heads/t heads of s × s by the head width, at the efficiency of
        // that GEMM, the heads folded into m. Flash attention skips the masked half; the
        // unfused path computes every score (batched GEMMs), then masks.
        let heads = (shape.micro_batch * model.num_attention_heads) as f64 / t;
        let s = model.seq_length as f64;
        let mask = match shape.attention {
            AttentionKernel::Fused => AttentionMask::Causal,
            AttentionKernel::Unfused => AttentionMask::Full,
        };
        let core_gflop = LayerFlops::new(model, shape.micro_batch, mask).attention_core / t / 1e9
            * attention_work_factor(shape.context_parallel);
        let core_eff = table.attention_efficiency(heads, s, model.kv_channels as f64);
        flags.0 |= core_eff.interpolated;
        flags.1 |= core_eff.extrapolated;
        ops.attention_fwd.gflop = core_gflop / core_eff.value;
        ops.layer_fwd.gflop += ops.attention_fwd.gflop;
        ops.layer_bwd.gflop += 2.0 * ops.attention_fwd.gflop;

        // Memory-bound kernels: (bytes, kernels) forward; backward twice the bytes, as many
        // kernels.
        let kernel_ms = table.memory_kernel_us * calibration.kernel_cost_scale / 1e3;
        let memory = |bytes: f64, kernels: f64| OpCost {
            gflop: 0.0,
            fixed_ms: bytes / (table.hbm_gb_per_s * 1e6) + kernels * kernel_ms,
        };
        let act = if model.swiglu { 3.0 } else { 2.0 } * tokens * f / t * e;
        let mut layer_bytes = 2.0 * 2.0 * sp_tokens * h * e // two norms: read, write
            + 2.0 * (3.0 * sp_tokens * h * e + sp_tokens * h) // two bias-dropout-adds + mask
            + act;
        let mut layer_kernels = 5.0;
        if model.position_embedding == PositionEmbedding::Rope {
            layer_bytes += 2.0 * tokens * (q + kv) / t * e;
            layer_kernels += 1.0;
        }
        if model.qk_layernorm {
            // The query and key norms over each head: read and write Q and K, a kernel each.
            layer_bytes += 2.0 * tokens * (q + kv) / t * e;
            layer_kernels += 2.0;
        }
        // Quantising each linear layer's input (forward) and incoming gradient (backward):
        // read the 16-bit tensor, write its low-precision copies, one kernel each. Weights
        // are quantised once per step, not per micro-batch, and left out.
        let (mut quant_fwd, mut quant_bwd) = (OpCost::default(), OpCost::default());
        if let Some((bits, _)) = low {
            let q = quantised_bytes(bits);
            for (input, output) in layer_linears(model, t) {
                quant_fwd.add(memory(tokens * input * (e + q), 1.0), 1.0);
                quant_bwd.add(memory(tokens * output * (e + q), 1.0), 1.0);
            }
        }
        ops.layer_fwd.add(quant_fwd, 1.0);
        ops.layer_bwd.add(quant_bwd, 1.0);
        let layer_mem = memory(layer_bytes, layer_kernels);
        ops.layer_fwd.add(layer_mem, 1.0);
        ops.layer_bwd
            .add(memory(2.0 * layer_bytes, layer_kernels), 1.0);
        if shape.attention == AttentionKernel::Unfused {
            // The b·heads/t·s² scores pass through HBM: forward, the fused scale-mask-softmax
            // reads and writes them, the attention dropout reads them and writes its output
            // and a one-byte mask (2e + 2e + 1 bytes per score); backward, the dropout's
            // gradient reads the incoming gradient and the mask and writes, the softmax's
            // reads the gradient and its output and writes (2e + 1 + 3e). Two kernels each
            // way; the attention core is redone with the forward in recomputation.
            let scores = heads * s * s;
            let (mut fwd_bytes, mut fwd_kernels) = (4.0 * e + 1.0, 2.0);
            let (mut bwd_bytes, mut bwd_kernels) = (5.0 * e + 1.0, 2.0);
            if !shape.fused_softmax {
                // PyTorch's softmax instead of the fused kernel (see
                // [`fused_softmax_available`]): in fp32, five kernels each way in place of
                // one. Forward: to fp32 (e in, 4 out), scale (4, 4), mask (4, 4), softmax
                // (4, 4), back to e (4, e): 28 + 2e bytes per score instead of 2e; backward
                // the same chain with the softmax's gradient reading its output too:
                // 36 + 2e instead of 3e.
                fwd_bytes += 28.0;
                fwd_kernels += FALLBACK_SOFTMAX_EXTRA_KERNELS;
                bwd_bytes += 36.0 - e;
                bwd_kernels += FALLBACK_SOFTMAX_EXTRA_KERNELS;
            }
            let unfused_fwd = memory(scores * fwd_bytes, fwd_kernels);
            ops.attention_fwd.add(unfused_fwd, 1.0);
            ops.layer_fwd.add(unfused_fwd, 1.0);
            ops.layer_bwd
                .add(memory(scores * bwd_bytes, bwd_kernels), 1.0);
        }

        // First stage: embedding lookup (and positions); last: final norm, logits and the
        // vocabulary-parallel cross-entropy over T × V/t logits (max, exp-sum, loss; fp32
        // softmax kept for the backward pass).
        let embed = memory(2.0 * tokens * h * e, 2.0);
        ops.first_fwd.add(embed, 1.0);
        ops.first_bwd.add(embed, 1.0);
        let v = padded_vocab_size(model, shape.tp) as f64 / t;
        ops.last_fwd.gflop = logits.0;
        ops.last_bwd.gflop = logits.1;
        ops.last_fwd.add(
            memory(2.0 * sp_tokens * h * e + tokens * v * (3.0 * e + 4.0), 5.0),
            1.0,
        );
        ops.last_bwd.add(
            memory(4.0 * sp_tokens * h * e + tokens * v * (4.0 + e), 3.0),
            1.0,
        );
        ops.interpolated = flags.0;
        ops.extrapolated = flags.1;
        ops
    }

    /// The same, with one layer's cost at 16 bits beside the low-precision one, for the
    /// layers `--first-last-layers-bf16` keeps in BF16.
    pub fn with_bf16_layers(
        self,
        shape: &OpShape<'_>,
        table: &PerfTable,
        calibration: &Calibration,
    ) -> Self {
        let sixteen = OpShape {
            low_precision: None,
            ..*shape
        };
        KindOps {
            layer_bf16: Some(KindOps::new(&sixteen, table, calibration).layer()),
            ..self
        }
    }

    /// One transformer layer, (forward, backward).
    pub(super) fn layer(&self) -> (OpCost, OpCost) {
        (self.layer_fwd, self.layer_bwd)
    }

    /// The last stage's final norm, logits and loss, (forward, backward).
    pub(super) fn last(&self) -> (OpCost, OpCost) {
        (self.last_fwd, self.last_bwd)
    }

    /// One layer's attention core forward (with unfused attention, its score kernels).
    pub fn attention(&self) -> OpCost {
        self.attention_fwd
    }

    /// The GEMMs that `--tp-comm-overlap` hides stage `stage`'s tensor-parallel
    /// collectives behind, per micro-batch, at 100 % of the table. Transformer Engine's
    /// userbuffers overlap each collective with its own layer's GEMM (the all-gather of a
    /// column-parallel layer's input with its forward GEMM, the reduce-scatter of a
    /// row-parallel layer's output with its forward GEMM, and backward the gathered output
    /// gradient with the dgrad GEMM, the input re-gather and the dgrad reduce-scatter with
    /// the dgrad and wgrad GEMMs: `transformer_engine/pytorch/module/base.py`
    /// `initialize_ub`, its `ub_overlap_ag`, `ub_overlap_rs` and `ub_bulk_*` layers), so no
    /// more of them hides than those GEMMs last: every layer's attention linears and the
    /// dense layers' MLP ones. An MoE layer's experts are grouped GEMMs without userbuffers,
    /// and recomputed forwards are left out: the cap errs towards exposure. In FP8 or FP4
    /// the GEMMs are shorter, so less hides; the layers kept in BF16 count at 16 bits.
    pub fn tp_overlap_gemms(&self, stage: &StageShape, moe_layers: u64) -> OpCost {
        let layers = stage.layers as f64;
        if layers == 0.0 {
            return OpCost::default();
        }
        let bf16 = stage.bf16_layers.min(stage.layers) as f64;
        // Each layer at its own precision: the BF16 ones `low_speedup` times longer.
        let precision = (layers - bf16 + bf16 * self.low_speedup) / layers;
        let dense = stage.layers.saturating_sub(moe_layers) as f64;
        OpCost {
            gflop: (layers * self.attention_linears_gflop + dense * self.mlp_linears_gflop)
                * precision,
            fixed_ms: 0.0,
        }
    }

    /// A stage's forward, backward and recomputation on this kind.
    pub fn stage(&self, stage: &StageShape) -> StageOps {
        let layers = stage.layers as f64;
        // The layers kept in BF16 (none unless priced by `with_bf16_layers`) and the rest.
        let (bf16, (bf16_fwd, bf16_bwd)) = match self.layer_bf16 {
            Some(cost) => (stage.bf16_layers.min(stage.layers), cost),
            None => (0, (OpCost::default(), OpCost::default())),
        };
        let low = (stage.layers - bf16) as f64;
        let mut forward = OpCost::default();
        forward.add(self.layer_fwd, low);
        forward.add(bf16_fwd, bf16 as f64);
        let mut backward = OpCost::default();
        backward.add(self.layer_bwd, low);
        backward.add(bf16_bwd, bf16 as f64);
        if stage.first {
            forward.add(self.first_fwd, 1.0);
            backward.add(self.first_bwd, 1.0);
        }
        if stage.last {
            forward.add(self.last_fwd, 1.0);
            backward.add(self.last_bwd, 1.0);
        }
        let mut recompute = OpCost::default();
        // Recomputed layers are counted from the stage's first (Megatron's uniform and block
        // methods both start there): the first stage's BF16 layers come first.
        let recomputed_bf16 = bf16.min(stage.recomputed_layers);
        recompute.add(
            self.layer_fwd,
            (stage.recomputed_layers - recomputed_bf16) as f64,
        );
        recompute.add(bf16_fwd, recomputed_bf16 as f64);
        if stage.selective && stage.recomputed_layers == 0 {
            recompute.add(self.attention_fwd, layers);
        }
        backward.add(recompute, 1.0);
        StageOps {
            forward,
            backward,
            recompute,
        }
    }
}
