//! Memory per GPU for every pipeline stage, each term kept apart.
//!
//! [`estimate_memory`] is called by the planner for every candidate configuration, so it is
//! pure, O(pp) and allocates nothing but the result's stage vector. What it models, per GPU
//! of pipeline stage *i* (one tensor-parallel rank; all ranks of a stage hold the same):
//!
//! **Parameters** ([`StageMemory::params`]): the stage's layers as Megatron shards them over
//! tp. Column-parallel tensors (`linear_qkv` and `linear_fc1`, weights and biases) and the
//! row-parallel weights (`linear_proj`, `linear_fc2`) are divided by tp; the row-parallel
//! biases and the norms are replicated on every rank (megatron/core/tensor_parallel/
//! layers.py: `RowParallelLinear` allocates its bias at full output size). The first stage
//! adds the word embedding / tp (vocab-parallel) and the learned position embedding
//! (replicated); the last stage the final norm and the output layer / tp, which with tied
//! embeddings and pp > 1 is the last stage's own copy of the word embedding. Under the
//! interleaved schedule a pipeline rank holds v model chunks; the embedding is in rank 0's
//! first chunk and the output layer in the last rank's last chunk, so per rank the sums
//! are the same.
//!
//! **Weights, gradients, optimizer** (bytes per parameter, Adam; Megatron's table in
//! docs "Distributed Optimizer", d = dp):
//!
//! | precision | weight | gradient | optimizer state | total | distributed optimizer |
//! |---|---|---|---|---|---|
//! | bf16 | 2 | 4 (fp32 grad buffer) | 12 (fp32 master, Adam m, v) | 18 | 6 + 12/d |
//! | fp16 | 2 | 2 (fp16 grad buffer) | 16 (fp32 main grad, master, m, v) | 20 | 4 + 16/d |
//! | fp32 | 4 | 4 | 8 (Adam m, v) | 16 | 8 + 8/d |
//!
//! bf16 accumulates gradients in fp32 (Megatron sets `accumulate_allreduce_grads_in_fp32`
//! for bf16); fp16 keeps them in fp16 unless told otherwise, as the table assumes. The
//! distributed optimizer shards only the optimizer column over dp.
//!
//! **Activations** per transformer layer and micro-batch, after Korthikanti et al. 2022
//! ("Reducing Activation Recomputation in Large Transformer Models", §4 and Table 2),
//! tensor by tensor, with q = heads·kv_channels, kv = query groups·kv_channels, f = ffn,
//! e = 2 bytes per element (4 in fp32 training), a = heads:
//!
//! | kept for the backward pass | bytes | split over tp |
//! |---|---|---|
//! | input norm's input, QKV input | 2·e·sbh | only with sequence parallelism |
//! | Q, K, V | e·sb·(q + 2kv) | yes |
//! | Q and K before the query/key norms (`--qk-layernorm` only) | e·sb·(q + kv) | yes |
//! | attention output (linear_proj's input) | e·sb·q | yes |
//! | attention dropout mask | sbh | only with sequence parallelism |
//! | pre-MLP norm's input, fc1 input | 2·e·sbh | only with sequence parallelism |
//! | fc1 output (2f wide with SwiGLU), activation output | e·sb·f·(g + 1), g = 1 or 2 | yes |
//! | MLP dropout mask | sbh | only with sequence parallelism |
//! | softmax output, its dropout mask and output (unfused attention only) | (2e + 1)·a·s²·b | yes |
//!
//! With q = kv = h, f = 4h, GeLU and e = 2 this is sbh·(10 + 24 + 5as/h): Table 2's
//! sbh(34 + 5as/h) without parallelism, sbh(10 + 24/t + 5as/(ht)) with tensor parallelism,
//! sbh(34/t + 5as/(ht)) with tensor and sequence parallelism. Megatron uses fused (flash)
//! attention by default, which keeps no s² scores, and selective recomputation recomputes
//! exactly them: both drop the score term ([`AttentionKernel`]). Full recomputation keeps
//! each recompute group's input, e·sbh (/t with sequence parallelism), and while it
//! recomputes a group during the backward pass of one micro-batch that group's layers are
//! whole again (their first input is the checkpoint itself, so it is not counted twice):
//! `--recompute-method uniform` groups `--recompute-num-layers` layers, `block` recomputes
//! the first `--recompute-num-layers` layers of each model chunk one by one and stores the
//! rest whole (megatron/core/recompute.py). Dropout masks are counted as Megatron's default
//! dropout of 0.1 makes them; the flash-attention softmax statistics (4·a·s·b bytes) and
//! backward-pass temporaries are left to [`Calibration::activation_factor`].
//!
//! **Micro-batches in flight**: under 1F1B stage i runs min(pp − i − 1, m) warm-up forward
//! passes and one more before its first backward, so it holds min(pp − i, m). Under the
//! interleaved schedule rank i runs 2·(pp − i − 1) + (v − 1)·pp warm-up model-chunk
//! forward passes (megatron/core/pipeline_parallel/schedules.py, `get_pp_rank_microbatches`,
//! with the default micro-batch group of pp), so it holds that plus one model-chunk
//! micro-batch of L_i/v layers each, at most m·v of them. On rank 0 that is
//! (pp·v + pp − 1)·L_0/v = pp·L_0·(1 + (pp − 1)/(pp·v)): the interleaving penalty of
//! Narayanan et al. 2021 that Megatron's estimate applies.
//!
//! **Embedding, output layer and loss**: the first stage keeps the token ids (int64, 8·sb)
//! and the embedding dropout mask (sbh, /t with sequence parallelism) for as many
//! micro-batches as it holds whole-stage micro-batches (Megatron's estimate counts them as
//! pp micro-batches scaled like the layers; under interleaving that is the rank's chunk
//! micro-batches / v). The last stage keeps, for its one micro-batch in flight, the fp32
//! softmax of the cross-entropy loss, 4·sb·V/t (megatron/core/tensor_parallel/
//! cross_entropy.py saves `exp_logits` as float), and the inputs of the final norm and the
//! output layer, 2·e·sbh (/t with sequence parallelism): Megatron's term sbh·4·(1 + V/h)/t.
//!
//! **Overhead**: [`Calibration::overhead_bytes`] (CUDA context, NCCL, workspaces) plus
//! [`Calibration::allocator_slack`] × the activation bytes; activations are first scaled by
//! [`Calibration::activation_factor`]. A dry run fits all three later.
//!
//! The peak is the worst stage. Stages hold any layer counts (`layers_per_stage`), and each
//! stage's `total_bytes` depends only on its own layers and position, so on a cluster that
//! mixes GPUs the planner checks every stage against its own GPUs' memory
//! (`plan::hetero`) rather than the peak against the smallest GPU. `tests/megatron/megatron_memory.rs` checks the formula part against
//! Megatron's own `megatron/training/theoretical_memory_usage.py`, which models the first
//! stage only, leaves linear biases and learned position embeddings out, ignores GQA and
//! SwiGLU's third matrix in its activations, and adds 5 % to its no-sequence-parallel figure.
//! Arithmetic saturates at `u64::MAX`, so absurd inputs never panic.

use serde::{Deserialize, Serialize};

use super::calibration::Calibration;
use super::moe_activations::moe_activations;
use super::parallel::ParallelConfig;
use super::params::ParameterBreakdown;
use crate::config::{LowBits, ModelSpec, Precision, Recompute, RecomputeMethod, TrainingSettings};

/// Memory per GPU of every pipeline stage of one configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryEstimate {
    /// One entry per pipeline stage (pipeline rank), first to last.
    pub stages: Vec<StageMemory>,
    /// The largest `total_bytes` of any stage: what every GPU must have.
    pub peak_bytes: u64,
    /// The stage with the peak (the first one, on a tie).
    pub peak_stage: usize,
}

/// Memory on one GPU of a pipeline stage, by term.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageMemory {
    /// The stage's index (its pipeline rank).
    pub stage: usize,
    /// Transformer layers on the stage, over all its model chunks.
    pub layers: u64,
    /// Model chunks on this pipeline rank: the virtual pipeline size, 1 without interleaving.
    pub model_chunks: u64,
    /// Parameters on one GPU of the stage (after tensor-parallel sharding).
    pub params: u64,
    /// The parameters themselves (2 bytes each in bf16/fp16, 4 in fp32).
    pub weight_bytes: u64,
    /// The gradient buffer.
    pub gradient_bytes: u64,
    /// Master weights and Adam states (divided by dp with the distributed optimizer).
    pub optimizer_bytes: u64,
    /// `weight_bytes + gradient_bytes + optimizer_bytes`.
    pub weights_and_optimizer_bytes: u64,
    /// Micro-batches whose activations the stage holds at its peak; under the interleaved
    /// schedule, model-chunk micro-batches (each of `layers / model_chunks` layers).
    pub in_flight_microbatches: u64,
    /// The formula's activation terms, before calibration.
    pub activations: ActivationBreakdown,
    /// Activations at the stage's peak: the breakdown's sum × the calibration's
    /// activation factor.
    pub activation_bytes: u64,
    /// CUDA context, NCCL and workspace bytes, plus the allocator's slack on activations.
    pub overhead_bytes: u64,
    /// `weights_and_optimizer_bytes + activation_bytes + overhead_bytes`.
    pub total_bytes: u64,
}

/// The activation terms of one stage (see the module doc for each formula).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ActivationBreakdown {
    /// What one transformer layer keeps for one micro-batch without full recomputation.
    pub per_layer_bytes: u64,
    /// What one recompute group keeps for one micro-batch under full recomputation: its
    /// input; 0 otherwise.
    pub checkpoint_bytes: u64,
    /// All the stage's transformer layers over the micro-batches in flight.
    pub layers_bytes: u64,
    /// Full recomputation: the group of layers made whole again while one micro-batch is
    /// recomputed, less its checkpointed input; 0 otherwise.
    pub recompute_bytes: u64,
    /// First stage: token ids and the embedding's dropout mask, for its micro-batches.
    pub embedding_bytes: u64,
    /// Last stage: the loss's fp32 softmax and the inputs of the final norm and the output
    /// layer, for one micro-batch.
    pub output_bytes: u64,
    /// The MoE and MLA layers' tensors beyond a dense layer's (router, dispatcher buffers,
    /// permuted tokens, expert intermediates, MLA latents; [`super::moe_activations`]) and
    /// the multi-token-prediction layers, over the micro-batches in flight, at an even
    /// expert load; 0 for a dense model.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub moe_bytes: u64,
    /// What the busiest expert-parallel rank keeps above an even load (dropless routing):
    /// the allowance a trial's measured peak fits.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub moe_imbalance_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ActivationBreakdown {
    /// The sum of the terms, before calibration.
    pub fn total(&self) -> u64 {
        [
            self.layers_bytes,
            self.recompute_bytes,
            self.embedding_bytes,
            self.output_bytes,
            self.moe_bytes,
            self.moe_imbalance_bytes,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }
}

/// How attention is computed, which decides whether the a·s² scores are kept (memory) and
/// whether they are written to and read from HBM (time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionKernel {
    /// Flash / fused attention (Megatron's default): the scores are never stored.
    #[default]
    Fused,
    /// The unfused softmax path: softmax output, dropout mask and dropout output are kept,
    /// unless selective recomputation recomputes them.
    Unfused,
}

/// Bytes per parameter of the weights, the gradient buffer and the optimizer state
/// (before any distributed-optimizer sharding), for Adam (see the module doc's table).
/// The low-precision weight copies Transformer Engine keeps beside the 16-bit weights of
/// a stage's `layers` transformer layers under `--fp8-format` / `--fp4-format`: each linear
/// layer's weight quantised row-wise and column-wise (the transposed copy the backward
/// GEMMs read), one byte each in FP8, half a byte plus an FP8 scale per 16 in NVFP4. With
/// `--fp8-param-gather` the low-precision weight replaces the 16-bit one, so the copies
/// cost about what the 16-bit weight did: nothing extra (Megatron-LM #2063 reports MXFP8
/// param gather costing more on GB200; not modelled). The output layer stays 16-bit.
fn low_precision_copy_bytes(
    model: &ModelSpec,
    training: &TrainingSettings,
    tp: u64,
    layers: u64,
) -> u64 {
    let Some(low) = training.low_precision.as_ref().filter(|l| !l.param_gather) else {
        return 0;
    };
    let per_byte = match low.bits {
        LowBits::Fp8 => 2.0,
        LowBits::Fp4 => 2.0 * (0.5 + 1.0 / 16.0),
    };
    let l = ParameterBreakdown::new(model, tp).layer;
    let linear = (l.qkv + l.attention_output + l.mlp_up + l.mlp_down) as f64 / tp.max(1) as f64;
    // Far below u64::MAX for any model that fits a GPU; `as` saturates beyond.
    (linear * layers as f64 * per_byte) as u64
}

/// Of a stage's `layers` from global layer `start`, those `--first-last-layers-bf16` keeps
/// in BF16: no low-precision weight copies for them.
fn low_precision_bf16_layers(
    training: &TrainingSettings,
    start: u64,
    layers: u64,
    model: &ModelSpec,
) -> u64 {
    training
        .low_precision
        .as_ref()
        .map_or(0, |l| l.bf16_layers_in(start, layers, model.num_layers))
}

pub fn bytes_per_parameter(precision: Precision) -> (u64, u64, u64) {
    match precision {
        Precision::Bf16 => (2, 4, 12),
        Precision::Fp16 => (2, 2, 16),
        Precision::Fp32 => (4, 4, 8),
    }
}

/// Micro-batches in flight on pipeline stage `stage` of `pp` at the memory peak, with `m`
/// micro-batches per iteration and `v` model chunks per rank (1: plain 1F1B). Under
/// interleaving the count is of model-chunk micro-batches. Megatron's schedules hold
/// `warm-up + 1` of them, at most all there are.
pub fn in_flight_microbatches(pp: u64, stage: u64, m: u64, v: u64) -> u64 {
    let pp = pp.max(1);
    let later = pp.saturating_sub(stage.saturating_add(1));
    if v <= 1 || pp == 1 {
        return later.saturating_add(1).min(m);
    }
    let warmup = later
        .saturating_mul(2)
        .saturating_add((v - 1).saturating_mul(pp));
    warmup.saturating_add(1).min(m.saturating_mul(v))
}

/// Activation bytes one transformer layer keeps for one micro-batch of `micro_batch`
/// sequences, with tensor-parallel size `tp` (see the module doc's table). `kernel` says
/// whether the attention scores are kept; pass [`AttentionKernel::Fused`] for selective
/// recomputation.
pub fn layer_activation_bytes(
    model: &ModelSpec,
    micro_batch: u64,
    tp: u64,
    sequence_parallel: bool,
    precision: Precision,
    kernel: AttentionKernel,
) -> f64 {
    let t = tp.max(1) as f64;
    let t_sp = if sequence_parallel { t } else { 1.0 };
    let e = element_bytes(precision);
    let s = model.seq_length as f64;
    let sb = s * micro_batch as f64;
    let h = model.hidden_size as f64;
    let q = model.num_attention_heads as f64 * model.kv_channels as f64;
    let kv = model.num_query_groups as f64 * model.kv_channels as f64;
    let f = model.ffn_hidden_size as f64;
    let gates = if model.swiglu { 2.0 } else { 1.0 };
    // Two norm inputs, the QKV and fc1 inputs (e bytes each), two dropout masks (1 byte).
    let replicated = (4.0 * e + 2.0) * sb * h;
    // `--qk-layernorm` (Qwen3, OLMo 2): the query and key norms keep their inputs, the
    // un-normed Q and K, beside the normed ones core attention keeps.
    let qk_norm_inputs = if model.qk_layernorm { q + kv } else { 0.0 };
    // Q, K, V and the attention output; fc1's output and the activation's output.
    let sharded = e * sb * (2.0 * q + 2.0 * kv + qk_norm_inputs + (gates + 1.0) * f);
    let scores = match kernel {
        AttentionKernel::Fused => 0.0,
        AttentionKernel::Unfused => (2.0 * e + 1.0) * model.num_attention_heads as f64 * s * sb,
    };
    replicated / t_sp + (sharded + scores) / t
}

/// Memory per GPU of every pipeline stage, with fused attention as Megatron runs it.
///
/// The stages are `config.layers_per_stage` (an empty list is one stage with all layers);
/// its length is the pipeline size. The micro-batches per iteration are
/// `training.global_batch_size / (micro_batch × dp)`, at least 1.
pub fn estimate_memory(
    model: &ModelSpec,
    training: &TrainingSettings,
    config: &ParallelConfig,
    calibration: &Calibration,
) -> MemoryEstimate {
    estimate_memory_with(model, training, config, calibration, AttentionKernel::Fused)
}

/// [`estimate_memory`] with a chosen attention kernel.
pub fn estimate_memory_with(
    model: &ModelSpec,
    training: &TrainingSettings,
    config: &ParallelConfig,
    calibration: &Calibration,
    kernel: AttentionKernel,
) -> MemoryEstimate {
    // Context parallelism: every activation is that of the rank's s/cp tokens (Megatron
    // runs fused attention under cp, so no score matrix is kept); the distributed
    // optimizer shards over dp × cp.
    let model = &*super::context::rank_model(model, config.cp);
    let kernel = if config.cp > 1 {
        AttentionKernel::Fused
    } else {
        kernel
    };
    let all_layers = [model.num_layers];
    let stage_layers: &[u64] = if config.layers_per_stage.is_empty() {
        &all_layers
    } else {
        &config.layers_per_stage
    };
    let pp = stage_layers.len() as u64;
    let tp = config.tp.max(1);
    let dp = config.dp.max(1);
    let b = config.micro_batch;
    let v = match config.vpp {
        Some(v) if v > 1 && pp > 1 => v,
        _ => 1,
    };
    let m = (training.global_batch_size / b.saturating_mul(dp).max(1)).max(1);
    let sequence_parallel = config.sequence_parallel && tp > 1;

    let shard = ShardParameters::new(model, tp, config.ep, config.etp);
    let (weight, gradient, optimizer) = bytes_per_parameter(training.precision);
    let optimizer_shards = if config.distributed_optimizer {
        dp.saturating_mul(config.cp.max(1))
    } else {
        1
    };
    let expert_optimizer_shards = if config.distributed_optimizer {
        config.expert_dp().max(1)
    } else {
        1
    };
    let starts = super::parallel::stage_starts(stage_layers);

    // Per micro-batch terms, in bytes.
    let e = element_bytes(training.precision);
    let t = tp as f64;
    let t_sp = if sequence_parallel { t } else { 1.0 };
    let sb = model.seq_length as f64 * b as f64;
    let sbh = sb * model.hidden_size as f64;
    let whole_kernel = match config.recompute {
        Recompute::Selective => AttentionKernel::Fused,
        Recompute::None | Recompute::Full { .. } => kernel,
    };
    let layer = layer_activation_bytes(
        model,
        b,
        tp,
        sequence_parallel,
        training.precision,
        whole_kernel,
    );
    let extra = moe_activations(model, training, config, e);
    let checkpoint = e * sbh / t_sp;
    let embedding_per_microbatch = 8.0 * sb + sbh / t_sp;
    let output = 4.0 * sb * shard.padded_vocab as f64 / t + 2.0 * e * sbh / t_sp;

    let stages: Vec<StageMemory> = stage_layers
        .iter()
        .enumerate()
        .map(|(i, &layers)| {
            let first = i == 0;
            let last = i as u64 + 1 == pp;
            let parts = shard.stage_parts(starts[i], layers, first, last);
            let params = parts.dense.saturating_add(parts.experts);
            let weight_bytes = params.saturating_mul(weight);
            let gradient_bytes = params.saturating_mul(gradient);
            let optimizer_bytes = saturate(
                (u128::from(parts.dense) * u128::from(optimizer))
                    .div_ceil(u128::from(optimizer_shards))
                    + (u128::from(parts.experts) * u128::from(optimizer))
                        .div_ceil(u128::from(expert_optimizer_shards)),
            );
            let weights_and_optimizer_bytes = weight_bytes
                .saturating_add(gradient_bytes)
                .saturating_add(optimizer_bytes)
                .saturating_add(low_precision_copy_bytes(
                    model,
                    training,
                    tp,
                    layers - low_precision_bf16_layers(training, starts[i], layers, model),
                ));

            let in_flight = in_flight_microbatches(pp, i as u64, m, v);
            let k = in_flight as f64;
            let chunk_layers = layers as f64 / v as f64;
            // (kept per model-chunk micro-batch, the recompute working set)
            let (kept, working, checkpoint_bytes) = match config.recompute {
                Recompute::None | Recompute::Selective => (chunk_layers * layer, 0.0, 0.0),
                Recompute::Full {
                    method: RecomputeMethod::Uniform,
                    num_layers,
                } => {
                    let group = num_layers.max(1) as f64;
                    let groups = (chunk_layers / group).ceil();
                    let rebuilt = group.min(chunk_layers);
                    let working = if rebuilt > 0.0 {
                        rebuilt * layer - checkpoint
                    } else {
                        0.0
                    };
                    (groups * checkpoint, working, checkpoint)
                }
                Recompute::Full {
                    method: RecomputeMethod::Block,
                    num_layers,
                } => {
                    let recomputed = (num_layers as f64).min(chunk_layers);
                    let kept = recomputed * checkpoint + (chunk_layers - recomputed) * layer;
                    let working = if recomputed > 0.0 {
                        layer - checkpoint
                    } else {
                        0.0
                    };
                    (kept, working, checkpoint)
                }
            };
            let embedding = if first {
                k / v as f64 * embedding_per_microbatch
            } else {
                0.0
            };
            // MoE and MLA layers beyond the dense ones, and the MTP layers on the last
            // stage, for the chunk micro-batches in flight (full recomputation keeps only
            // the layers' inputs: `extra` is zero then).
            let moe_layers = model.moe.as_ref().map_or(0, |moe| {
                (starts[i]..starts[i].saturating_add(layers))
                    .filter(|l| moe.is_moe_layer(*l))
                    .count() as u64
            });
            let mtp = if last { model.mtp_layers as f64 } else { 0.0 };
            let mtp_moe = mtp
                * f64::from(u8::from(model.moe.as_ref().is_some_and(|m| {
                    m.is_moe_layer(model.num_layers.saturating_sub(1))
                })));
            let per_chunk = |routed: f64, mla: f64, dense: f64| {
                (moe_layers as f64 + mtp_moe) * routed / v as f64
                    + (chunk_layers + mtp / v as f64) * mla
                    + mtp / v as f64 * dense
            };
            let (moe_bytes, moe_imbalance_bytes) = match config.recompute {
                Recompute::Full { .. } => (0.0, 0.0),
                _ => (
                    k * per_chunk(extra.routed, extra.mla, layer),
                    k * per_chunk(extra.imbalance, 0.0, 0.0),
                ),
            };
            let activations = ActivationBreakdown {
                moe_bytes: to_bytes(moe_bytes.max(0.0)),
                moe_imbalance_bytes: to_bytes(moe_imbalance_bytes),
                per_layer_bytes: to_bytes(layer),
                checkpoint_bytes: to_bytes(checkpoint_bytes),
                layers_bytes: to_bytes(k * kept),
                recompute_bytes: to_bytes(working),
                embedding_bytes: to_bytes(embedding),
                output_bytes: if last { to_bytes(output) } else { 0 },
            };
            let activation_f = activations.total() as f64 * calibration.activation_factor;
            let activation_bytes = to_bytes(activation_f);
            let overhead_bytes = calibration
                .overhead_bytes
                .saturating_add(to_bytes(activation_f * calibration.allocator_slack));
            StageMemory {
                stage: i,
                layers,
                model_chunks: v,
                params,
                weight_bytes,
                gradient_bytes,
                optimizer_bytes,
                weights_and_optimizer_bytes,
                in_flight_microbatches: in_flight,
                activations,
                activation_bytes,
                overhead_bytes,
                total_bytes: weights_and_optimizer_bytes
                    .saturating_add(activation_bytes)
                    .saturating_add(overhead_bytes),
            }
        })
        .collect();

    let (peak_stage, peak_bytes) = stages.iter().enumerate().fold((0, 0), |(at, max), (i, s)| {
        if s.total_bytes > max {
            (i, s.total_bytes)
        } else {
            (at, max)
        }
    });
    MemoryEstimate {
        stages,
        peak_bytes,
        peak_stage,
    }
}

/// Parameters on one GPU, by part, for one tensor-parallel size.
struct ShardParameters {
    padded_vocab: u64,
    layer: u64,
    embedding: u64,
    final_norm: u64,
    /// The output layer's shard on the last stage, when it is not also the first stage.
    output: u64,
    /// The same when the last stage is also the first (tied embeddings share the weight).
    output_on_first: u64,
    /// An MoE layer's parameters on one rank apart from its routed experts (attention,
    /// shared experts over tp; norms and router replicated), and its routed experts over
    /// ep × etp, which the expert-data-parallel group shards the optimizer over.
    moe_layer: u64,
    experts_layer: u64,
    moe_layers: Vec<bool>,
    /// The multi-token-prediction block on the last stage: its dense part and its experts.
    mtp: u64,
    mtp_experts: u64,
}

/// A stage's parameters on one rank: those the data-parallel group shards the distributed
/// optimizer over, and the routed experts, which the expert-data-parallel group shards.
struct StageParameters {
    dense: u64,
    experts: u64,
}

impl ShardParameters {
    /// At tensor-parallel size `tp`, the routed experts split over `ep` × `etp` ranks.
    fn new(model: &ModelSpec, tp: u64, ep: u64, etp: u64) -> Self {
        let all = ParameterBreakdown::new(model, tp);
        let h = model.hidden_size;
        // Replicated on every tensor-parallel rank: the two norms and the biases of the
        // row-parallel linear_proj and linear_fc2.
        let row_biases = if model.add_bias_linear {
            h.saturating_mul(2)
        } else {
            0
        };
        let replicated = all
            .layer
            .input_norm
            .saturating_add(all.layer.pre_mlp_norm)
            .saturating_add(row_biases);
        let sharded = all.layer.total().saturating_sub(replicated);
        let word = all.word_embedding.div_ceil(tp);
        let untied = all.output_layer.div_ceil(tp);
        // Multi-latent attention's down projections are duplicated on every tp rank
        // (MLASelfAttention builds them with parallel_mode "duplicated").
        let mla_down = model.mla.as_ref().map_or(0, |mla| {
            let h = model.hidden_size;
            h.saturating_mul(mla.q_lora_rank.unwrap_or(0))
                .saturating_add(
                    h.saturating_mul(mla.kv_lora_rank.saturating_add(mla.qk_pos_emb_head_dim)),
                )
        });
        let attention_replicated = all
            .layer
            .input_norm
            .saturating_add(all.layer.pre_mlp_norm)
            .saturating_add(all.layer.qk_norm)
            .saturating_add(mla_down)
            .saturating_add(if model.add_bias_linear { h } else { 0 });
        let attention_sharded = all.layer.attention().saturating_sub(attention_replicated);
        let attention = attention_sharded
            .div_ceil(tp)
            .saturating_add(attention_replicated);
        let experts_split = ep.max(1).saturating_mul(etp.max(1));
        let (moe_layer, experts_layer) = match &all.moe {
            Some(m) => (
                attention
                    .saturating_add(m.router)
                    .saturating_add(m.shared_experts.div_ceil(tp)),
                m.experts().div_ceil(experts_split),
            ),
            None => (0, 0),
        };
        let dense_layer = sharded.div_ceil(tp).saturating_add(replicated);
        let mtp_layers = model.mtp_layers;
        let mtp_moe = all.mtp_moe_layers;
        let mtp_extra = all
            .layer
            .input_norm
            .saturating_mul(3)
            .saturating_add(h.saturating_mul(h).saturating_mul(2).div_ceil(tp));
        let mtp = mtp_extra.saturating_mul(mtp_layers).saturating_add(
            moe_layer
                .saturating_mul(mtp_moe)
                .saturating_add(dense_layer.saturating_mul(mtp_layers.saturating_sub(mtp_moe))),
        );
        ShardParameters {
            padded_vocab: all.padded_vocab_size,
            layer: dense_layer,
            embedding: word.saturating_add(all.position_embedding),
            final_norm: all.final_norm,
            output: if all.tied_embeddings { word } else { untied },
            output_on_first: if all.tied_embeddings { 0 } else { untied },
            moe_layer,
            experts_layer,
            moe_layers: all.moe_layers.clone(),
            mtp,
            mtp_experts: experts_layer.saturating_mul(mtp_moe),
        }
    }

    /// The stage holding decoder layers `start .. start + layers`.
    fn stage_parts(&self, start: u64, layers: u64, first: bool, last: bool) -> StageParameters {
        // Only layers the pattern lists can be MoE (a dense model lists none), so a
        // stage's range is walked no further than the pattern.
        let end = start
            .saturating_add(layers)
            .min(self.moe_layers.len() as u64);
        let moe = (start.min(end)..end)
            .filter(|i| self.moe_layers[*i as usize])
            .count() as u64;
        let mut dense = self
            .stage(layers - moe, first, last)
            .saturating_add(self.moe_layer.saturating_mul(moe));
        let mut experts = self.experts_layer.saturating_mul(moe);
        if last {
            dense = dense.saturating_add(self.mtp);
            experts = experts.saturating_add(self.mtp_experts);
        }
        StageParameters { dense, experts }
    }

    fn stage(&self, layers: u64, first: bool, last: bool) -> u64 {
        let mut n = self.layer.saturating_mul(layers);
        if first {
            n = n.saturating_add(self.embedding);
        }
        if last {
            let output = if first {
                self.output_on_first
            } else {
                self.output
            };
            n = n.saturating_add(self.final_norm).saturating_add(output);
        }
        n
    }
}

/// Bytes of one activation element: 2 in bf16 / fp16 training, 4 in fp32.
fn element_bytes(precision: Precision) -> f64 {
    match precision {
        Precision::Bf16 | Precision::Fp16 => 2.0,
        Precision::Fp32 => 4.0,
    }
}

/// Rounds to whole bytes; `as` saturates at the ends of u64 (NaN cannot arise from the
/// finite, non-negative products above, but would read as "too much").
fn to_bytes(x: f64) -> u64 {
    if x.is_nan() {
        u64::MAX
    } else {
        x.round() as u64
    }
}

fn saturate(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Normalization, PositionEmbedding};
    use proptest::prelude::*;

    /// GPT-3 175B as Megatron's preset has it (MHA, GeLU, f = 4h).
    fn gpt3_175b() -> ModelSpec {
        ModelSpec {
            preset: None,
            num_layers: 96,
            hidden_size: 12288,
            ffn_hidden_size: 4 * 12288,
            num_attention_heads: 96,
            num_query_groups: 96,
            kv_channels: 128,
            seq_length: 2048,
            max_position_embeddings: 2048,
            vocab_size: 50257,
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

    fn llama_like() -> ModelSpec {
        ModelSpec {
            num_layers: 32,
            hidden_size: 4096,
            ffn_hidden_size: 11008,
            num_attention_heads: 32,
            num_query_groups: 8,
            kv_channels: 128,
            seq_length: 4096,
            max_position_embeddings: 4096,
            vocab_size: 32000,
            swiglu: true,
            untie_embeddings_and_output_weights: true,
            normalization: Normalization::RMSNorm,
            add_bias_linear: false,
            add_qkv_bias: false,
            position_embedding: PositionEmbedding::Rope,
            ..gpt3_175b()
        }
    }

    fn training(global_batch: u64) -> TrainingSettings {
        TrainingSettings::new(global_batch, Precision::Bf16)
    }

    fn no_calibration() -> Calibration {
        Calibration {
            activation_factor: 1.0,
            overhead_bytes: 0,
            allocator_slack: 0.0,
            ..Calibration::default()
        }
    }

    fn estimate(model: &ModelSpec, global: u64, config: &ParallelConfig) -> MemoryEstimate {
        estimate_memory(model, &training(global), config, &no_calibration())
    }

    /// Context parallelism: a rank keeps its s/cp tokens' activations (Megatron's 2·cp
    /// chunks) and the distributed optimizer shards over dp × cp; weights stay whole.
    #[test]
    fn context_parallelism_divides_activations_and_shards_the_optimizer_over_dp_times_cp() {
        let mut model = llama_like();
        model.seq_length = 32_768;
        let mut plain = ParallelConfig::even(model.num_layers, 2, 1, 2, 1);
        plain.distributed_optimizer = true;
        plain.sequence_parallel = true;
        let mut cp = plain.clone();
        cp.cp = 4;
        let (a, b) = (estimate(&model, 8, &plain), estimate(&model, 8, &cp));
        let (a, b) = (&a.stages[0], &b.stages[0]);
        assert_eq!(a.weight_bytes, b.weight_bytes);
        assert_eq!(a.gradient_bytes, b.gradient_bytes);
        let per_layer = |s: &StageMemory| s.activations.per_layer_bytes as f64;
        assert!((per_layer(a) / per_layer(b) - 4.0).abs() < 1e-6);
        assert_eq!(a.optimizer_bytes.div_ceil(4), b.optimizer_bytes);
        // A million tokens neither overflows nor panics.
        model.seq_length = 1 << 20;
        cp.cp = 64;
        assert!(estimate(&model, 8, &cp).peak_bytes > 0);
    }

    #[test]
    fn fp8_weight_copies_cost_two_bytes_per_linear_weight_unless_gathered_in_fp8() {
        use crate::config::LowPrecision;
        let model = llama_like();
        let config = ParallelConfig::even(model.num_layers, 2, 2, 1, 1);
        let base = estimate_memory(&model, &training(8), &config, &no_calibration());
        let fp8 = |param_gather| {
            let mut t = training(8);
            t.low_precision = Some(LowPrecision {
                bits: LowBits::Fp8,
                format: "hybrid".into(),
                recipe: "delayed".into(),
                param_gather,
                bf16_layers_at_start: 0,
                bf16_layers_at_end: 0,
            });
            estimate_memory(&model, &t, &config, &no_calibration())
        };
        let l = ParameterBreakdown::new(&model, 2).layer;
        let linear = (l.qkv + l.attention_output + l.mlp_up + l.mlp_down) / 2;
        for (b, f) in base.stages.iter().zip(&fp8(false).stages) {
            assert_eq!(
                f.weights_and_optimizer_bytes - b.weights_and_optimizer_bytes,
                2 * linear * 16,
                "16 layers a stage, an FP8 and a transposed copy of each linear weight"
            );
            assert_eq!(f.activation_bytes, b.activation_bytes);
        }
        assert_eq!(fp8(true).stages, base.stages, "--fp8-param-gather");
        // --first-last-layers-bf16 keeping 2 layers at the start and 1 at the end: no
        // copies of those, the first stage's and the last stage's own.
        let mut t = training(8);
        t.low_precision = Some(LowPrecision {
            bits: LowBits::Fp8,
            format: "e4m3".into(),
            recipe: "mxfp8".into(),
            param_gather: false,
            bf16_layers_at_start: 2,
            bf16_layers_at_end: 1,
        });
        let ends = estimate_memory(&model, &t, &config, &no_calibration());
        for (stage, (b, e)) in base.stages.iter().zip(&ends.stages).enumerate() {
            let fp8_layers = [14, 15][stage];
            assert_eq!(
                e.weights_and_optimizer_bytes - b.weights_and_optimizer_bytes,
                2 * linear * fp8_layers
            );
        }
    }

    #[test]
    fn layer_activations_reduce_to_korthikanti_table_2() {
        let model = gpt3_175b();
        let (s, b, h, a) = (2048.0, 1.0, 12288.0, 96.0);
        let sbh = s * b * h;
        let scores = 5.0 * a * s / h;
        let bf16 = Precision::Bf16;
        let layer = |t, sp, kernel| layer_activation_bytes(&model, 1, t, sp, bf16, kernel);
        let close = |x: f64, y: f64| assert!((x - y).abs() <= 1e-9 * y, "{x} != {y}");
        // No parallelism: sbh(34 + 5as/h).
        close(
            layer(1, false, AttentionKernel::Unfused),
            sbh * (34.0 + scores),
        );
        // Tensor parallelism: sbh(10 + 24/t + 5as/(ht)).
        close(
            layer(8, false, AttentionKernel::Unfused),
            sbh * (10.0 + 24.0 / 8.0 + scores / 8.0),
        );
        // Tensor + sequence parallelism: sbh(34/t + 5as/(ht)).
        close(
            layer(8, true, AttentionKernel::Unfused),
            sbh * (34.0 / 8.0 + scores / 8.0),
        );
        // Selective recomputation (or flash attention): 34·sbh/t.
        close(layer(8, true, AttentionKernel::Fused), sbh * 34.0 / 8.0);
        close(layer(8, false, AttentionKernel::Fused), sbh * (10.0 + 3.0));
    }

    #[test]
    fn qk_layernorm_keeps_q_and_k_before_their_norms() {
        let plain = gpt3_175b();
        let normed = ModelSpec {
            qk_layernorm: true,
            ..gpt3_175b()
        };
        let layer = |m: &ModelSpec, t| {
            layer_activation_bytes(m, 2, t, true, Precision::Bf16, AttentionKernel::Fused)
        };
        // e·sb·(q + kv)/t more: 2 bytes × 2048 × 2 tokens × (12288 + 12288) / 8.
        for t in [1, 8] {
            let extra = 2.0 * 2048.0 * 2.0 * (12288.0 + 12288.0) / t as f64;
            let got = layer(&normed, t) - layer(&plain, t);
            assert!((got - extra).abs() <= 1e-9 * extra, "{got} != {extra}");
        }
    }

    #[test]
    fn full_recompute_keeps_each_layers_input() {
        // Table 2's "full activation recomputation": 2sbh per layer (/t with SP).
        let model = gpt3_175b();
        let sbh = 2048 * 12288;
        for (sp, t_sp) in [(false, 1), (true, 8)] {
            let mut config = ParallelConfig::even(96, 8, 8, 1, 1);
            config.sequence_parallel = sp;
            config.recompute = Recompute::Full {
                method: RecomputeMethod::Uniform,
                num_layers: 1,
            };
            let stage = &estimate(&model, 64, &config).stages[3];
            assert_eq!(stage.in_flight_microbatches, 5);
            assert_eq!(stage.activations.checkpoint_bytes, 2 * sbh / t_sp);
            assert_eq!(stage.activations.layers_bytes, 5 * 12 * 2 * sbh / t_sp);
            assert_eq!(
                stage.activations.recompute_bytes,
                stage.activations.per_layer_bytes - 2 * sbh / t_sp
            );
        }
    }

    #[test]
    fn recompute_methods_group_and_skip_layers() {
        let model = gpt3_175b();
        let mut config = ParallelConfig::even(96, 8, 4, 1, 1);
        config.sequence_parallel = true;
        let layers = |c: &ParallelConfig| estimate(&model, 64, c).stages[0].activations;
        let whole = layers(&config);
        let per = whole.per_layer_bytes;
        config.recompute = Recompute::Full {
            method: RecomputeMethod::Uniform,
            num_layers: 5,
        };
        let uniform = layers(&config);
        let input = uniform.checkpoint_bytes;
        // 24 layers in groups of 5: 5 checkpoints per micro-batch, 4 micro-batches.
        assert_eq!(uniform.layers_bytes, 4 * 5 * input);
        assert_eq!(uniform.recompute_bytes, 5 * per - input);
        config.recompute = Recompute::Full {
            method: RecomputeMethod::Block,
            num_layers: 10,
        };
        let block = layers(&config);
        assert_eq!(block.layers_bytes, 4 * (10 * input + 14 * per));
        assert_eq!(block.recompute_bytes, per - input);
        config.recompute = Recompute::Full {
            method: RecomputeMethod::Block,
            num_layers: 0,
        };
        assert_eq!(layers(&config).layers_bytes, whole.layers_bytes);
        assert_eq!(layers(&config).recompute_bytes, 0);
    }

    #[test]
    fn one_f_one_b_holds_pp_minus_i_microbatches() {
        assert_eq!(in_flight_microbatches(4, 0, 8, 1), 4);
        assert_eq!(in_flight_microbatches(4, 3, 8, 1), 1);
        assert_eq!(in_flight_microbatches(4, 0, 2, 1), 2);
        assert_eq!(in_flight_microbatches(1, 0, 8, 1), 1);
        let model = gpt3_175b();
        let config = ParallelConfig::even(96, 8, 8, 1, 1);
        let e = estimate(&model, 64, &config);
        let counts: Vec<u64> = e.stages.iter().map(|s| s.in_flight_microbatches).collect();
        assert_eq!(counts, [8, 7, 6, 5, 4, 3, 2, 1]);
    }

    #[test]
    fn interleaving_reproduces_the_first_stage_penalty() {
        // Rank 0 holds (pp·v + pp − 1) chunk micro-batches of L/(pp·v) layers:
        // pp · (L/pp) · (1 + (pp − 1)/(pp·v)).
        for (pp, v) in [(2u64, 2u64), (4, 2), (8, 3), (16, 6)] {
            let k = in_flight_microbatches(pp, 0, 1000, v);
            let layer_microbatches = k as f64 / v as f64;
            let penalty = 1.0 + (pp - 1) as f64 / (pp * v) as f64;
            assert!((layer_microbatches - pp as f64 * penalty).abs() < 1e-12);
            // The last rank: (v − 1)·pp warm-up chunk micro-batches and one more.
            assert_eq!(
                in_flight_microbatches(pp, pp - 1, 1000, v),
                (v - 1) * pp + 1
            );
        }
        // Capped by the m·v chunk micro-batches there are.
        assert_eq!(in_flight_microbatches(8, 0, 2, 4), 8);
        let model = gpt3_175b();
        let mut config = ParallelConfig::even(96, 8, 8, 1, 1);
        config.sequence_parallel = true;
        let plain = estimate(&model, 64, &config).stages[0]
            .activations
            .layers_bytes;
        config.vpp = Some(4);
        let interleaved = estimate(&model, 64, &config).stages[0]
            .activations
            .layers_bytes;
        let ratio = interleaved as f64 / plain as f64;
        assert!((ratio - (1.0 + 7.0 / 32.0)).abs() < 1e-9, "{ratio}");
    }

    #[test]
    fn bytes_per_parameter_follow_megatrons_table() {
        let model = llama_like();
        let mut config = ParallelConfig::even(32, 2, 2, 8, 1);
        for (precision, plain, distributed) in [
            (Precision::Bf16, 18.0, 6.0 + 12.0 / 8.0),
            (Precision::Fp16, 20.0, 4.0 + 16.0 / 8.0),
            (Precision::Fp32, 16.0, 8.0 + 8.0 / 8.0),
        ] {
            let mut t = training(64);
            t.precision = precision;
            for (dist, want) in [(false, plain), (true, distributed)] {
                config.distributed_optimizer = dist;
                let e = estimate_memory(&model, &t, &config, &no_calibration());
                for s in &e.stages {
                    let per = s.weights_and_optimizer_bytes as f64 / s.params as f64;
                    assert!((per - want).abs() < 1e-6, "{precision:?} {dist}: {per}");
                }
            }
        }
    }

    #[test]
    fn stages_hold_their_share_of_the_parameters() {
        // Per GPU × tp, less the replicated parts counted tp − 1 extra times, is the
        // stage's whole count.
        for model in [gpt3_175b(), llama_like()] {
            let tp = 8;
            let config = ParallelConfig::even(model.num_layers, tp, 4, 1, 1);
            let e = estimate(&model, 64, &config);
            let all = ParameterBreakdown::new(&model, tp);
            let h = model.hidden_size;
            let norms = all.layer.input_norm + all.layer.pre_mlp_norm;
            let row_biases = if model.add_bias_linear { 2 * h } else { 0 };
            let layers = model.num_layers / 4;
            for (i, s) in e.stages.iter().enumerate() {
                let (first, last) = (i == 0, i == 3);
                let mut replicated = layers * (norms + row_biases);
                if first {
                    replicated += all.position_embedding;
                }
                if last {
                    replicated += all.final_norm;
                }
                assert_eq!(
                    s.params * tp - (tp - 1) * replicated,
                    all.stage(layers, first, last),
                    "stage {i}"
                );
            }
            // Tied embeddings: the last stage holds a copy of the word embedding.
            if !model.untie_embeddings_and_output_weights {
                assert!(e.stages[3].params >= e.stages[1].params + all.word_embedding / tp);
            }
        }
    }

    #[test]
    fn one_stage_holds_everything_once() {
        for model in [gpt3_175b(), llama_like()] {
            let config = ParallelConfig::even(model.num_layers, 1, 1, 1, 1);
            let e = estimate(&model, 8, &config);
            assert_eq!(
                e.stages[0].params,
                ParameterBreakdown::new(&model, 1).total()
            );
            assert!(e.stages[0].activations.embedding_bytes > 0);
            assert!(e.stages[0].activations.output_bytes > 0);
        }
    }

    #[test]
    fn output_layer_term_is_megatrons() {
        // sbh·4·(1 + V/h)/t with sequence parallelism.
        let model = gpt3_175b();
        let mut config = ParallelConfig::even(96, 8, 1, 1, 2);
        config.sequence_parallel = true;
        let e = estimate(&model, 64, &config);
        let (s, b, h, v) = (2048u64, 2u64, 12288u64, 51200u64);
        assert_eq!(
            e.stages[0].activations.output_bytes,
            s * b * h * 4 * (h + v) / h / 8
        );
    }

    #[test]
    fn calibration_scales_activations_and_adds_overhead() {
        let model = llama_like();
        let config = ParallelConfig::even(32, 2, 2, 1, 1);
        let plain = estimate(&model, 8, &config);
        let c = Calibration {
            activation_factor: 1.5,
            overhead_bytes: 1000,
            allocator_slack: 0.1,
            ..Calibration::default()
        };
        let e = estimate_memory(&model, &training(8), &config, &c);
        for (p, s) in plain.stages.iter().zip(&e.stages) {
            let act = (p.activation_bytes as f64 * 1.5).round() as u64;
            assert_eq!(s.activation_bytes, act);
            let slack = (p.activation_bytes as f64 * 1.5 * 0.1).round() as u64;
            assert_eq!(s.overhead_bytes, 1000 + slack);
            assert_eq!(
                s.total_bytes,
                s.weights_and_optimizer_bytes + s.activation_bytes + s.overhead_bytes
            );
        }
    }

    #[test]
    fn json_has_the_contracted_fields() {
        let model = llama_like();
        let config = ParallelConfig::even(32, 2, 2, 1, 1);
        let json = serde_json::to_value(estimate(&model, 8, &config)).unwrap();
        assert!(json["peak_bytes"].is_u64());
        for stage in json["stages"].as_array().unwrap() {
            for key in [
                "params",
                "weights_and_optimizer_bytes",
                "activation_bytes",
                "overhead_bytes",
                "total_bytes",
            ] {
                assert!(stage[key].is_u64(), "{key}");
            }
        }
    }

    #[test]
    fn empty_stage_list_is_one_stage_and_zero_microbatch_is_no_activation() {
        let model = llama_like();
        let mut config = ParallelConfig::even(32, 1, 1, 1, 0);
        config.layers_per_stage.clear();
        let e = estimate(&model, 8, &config);
        assert_eq!(e.stages.len(), 1);
        assert_eq!(e.stages[0].layers, 32);
        assert_eq!(e.stages[0].activation_bytes, 0);
    }

    // Property tests over small models and configurations.

    fn small_model() -> impl Strategy<Value = ModelSpec> {
        (
            1u64..=16, // layers
            1u64..=4,  // heads / 8 → heads
            1u64..=8,  // kv_channels / 8
            0u64..=3,  // log2 of heads per group
            any::<bool>(),
            any::<bool>(),
            1u64..=8, // seq / 64
            1000u64..70_000,
        )
            .prop_map(
                |(layers, heads8, kv8, group_log, swiglu, untie, seq64, vocab)| {
                    let heads = heads8 * 8;
                    let kv_channels = kv8 * 8;
                    let h = heads * kv_channels;
                    ModelSpec {
                        preset: None,
                        num_layers: layers,
                        hidden_size: h,
                        ffn_hidden_size: if swiglu { 8 * h / 3 / 8 * 8 } else { 4 * h },
                        num_attention_heads: heads,
                        num_query_groups: heads >> group_log,
                        kv_channels,
                        seq_length: seq64 * 64,
                        max_position_embeddings: seq64 * 64,
                        vocab_size: vocab,
                        make_vocab_size_divisible_by: 128,
                        swiglu,
                        untie_embeddings_and_output_weights: untie,
                        normalization: if swiglu {
                            Normalization::RMSNorm
                        } else {
                            Normalization::LayerNorm
                        },
                        add_bias_linear: !swiglu,
                        add_qkv_bias: !swiglu,
                        position_embedding: if swiglu {
                            PositionEmbedding::Rope
                        } else {
                            PositionEmbedding::LearnedAbsolute
                        },
                        moe: None,
                        mla: None,
                        mtp_layers: 0,
                        qk_layernorm: false,
                    }
                },
            )
    }

    fn recompute() -> impl Strategy<Value = Recompute> {
        prop_oneof![
            Just(Recompute::None),
            Just(Recompute::Selective),
            (1u64..=4).prop_map(|n| Recompute::Full {
                method: RecomputeMethod::Uniform,
                num_layers: n
            }),
            (0u64..=4).prop_map(|n| Recompute::Full {
                method: RecomputeMethod::Block,
                num_layers: n
            }),
        ]
    }

    fn precision() -> impl Strategy<Value = Precision> {
        prop_oneof![
            Just(Precision::Bf16),
            Just(Precision::Fp16),
            Just(Precision::Fp32)
        ]
    }

    /// A configuration of `model` (pp dividing its layers), and a global batch.
    fn setting() -> impl Strategy<Value = (ModelSpec, ParallelConfig, TrainingSettings)> {
        (
            small_model(),
            0u32..=3, // log2 tp
            1u64..=8, // pp (reduced to a divisor of the layers)
            1u64..=8, // dp
            1u64..=4, // micro-batch
            1u64..=16,
            recompute(),
            any::<bool>(),
            any::<bool>(),
            precision(),
        )
            .prop_map(
                |(model, tp_log, pp, dp, b, m, recompute, sp, dist, precision)| {
                    let mut pp = pp.min(model.num_layers);
                    while model.num_layers % pp != 0 {
                        pp -= 1;
                    }
                    let mut config = ParallelConfig::even(model.num_layers, 1 << tp_log, pp, dp, b);
                    config.recompute = recompute;
                    config.sequence_parallel = sp;
                    config.distributed_optimizer = dist;
                    let mut t = training(b * dp * m);
                    t.precision = precision;
                    (model, config, t)
                },
            )
    }

    fn totals(e: &MemoryEstimate) -> Vec<u64> {
        e.stages.iter().map(|s| s.total_bytes).collect()
    }

    proptest! {
        #[test]
        fn memory_grows_with_the_micro_batch(
            (model, config, t) in setting(),
            b2 in 1u64..=4,
        ) {
            // Both micro-batches divide the global batch, as Megatron requires.
            let (b1, b2) = (config.micro_batch.min(b2), config.micro_batch.max(b2));
            let global = b1 * b2 * config.dp * 4;
            let t = TrainingSettings { global_batch_size: global, ..t };
            let c = Calibration::default();
            let small = estimate_memory(&model, &t, &ParallelConfig { micro_batch: b1, ..config.clone() }, &c);
            let large = estimate_memory(&model, &t, &ParallelConfig { micro_batch: b2, ..config }, &c);
            for (s, l) in small.stages.iter().zip(&large.stages) {
                prop_assert!(s.activation_bytes <= l.activation_bytes);
                prop_assert!(s.total_bytes <= l.total_bytes);
            }
            prop_assert!(small.peak_bytes <= large.peak_bytes);
        }

        #[test]
        fn memory_grows_with_the_layers_of_a_stage(
            (model, config, t) in setting(),
            stage in 0usize..8,
            more in 1u64..=4,
        ) {
            let stage = stage % config.layers_per_stage.len();
            let mut bigger = config.clone();
            bigger.layers_per_stage[stage] += more;
            let c = Calibration::default();
            let a = estimate_memory(&model, &t, &config, &c);
            let b = estimate_memory(&model, &t, &bigger, &c);
            prop_assert!(a.stages[stage].params < b.stages[stage].params);
            prop_assert!(a.stages[stage].activation_bytes <= b.stages[stage].activation_bytes);
            prop_assert!(a.stages[stage].total_bytes < b.stages[stage].total_bytes);
        }

        #[test]
        fn memory_falls_with_tensor_parallelism((model, config, t) in setting()) {
            let c = Calibration::default();
            let narrow = estimate_memory(&model, &t, &config, &c);
            let wide = estimate_memory(&model, &t, &ParallelConfig { tp: config.tp * 2, ..config.clone() }, &c);
            for (n, w) in narrow.stages.iter().zip(&wide.stages) {
                prop_assert!(w.params <= n.params);
                prop_assert!(w.weights_and_optimizer_bytes <= n.weights_and_optimizer_bytes);
                prop_assert!(w.activation_bytes <= n.activation_bytes);
                prop_assert!(w.total_bytes <= n.total_bytes);
            }
        }

        #[test]
        fn memory_falls_with_recomputation(
            (model, config, t) in setting(),
            n in 0u64..=6,
            uniform in any::<bool>(),
            kernel in prop_oneof![Just(AttentionKernel::Fused), Just(AttentionKernel::Unfused)],
        ) {
            let c = Calibration::default();
            let with = |recompute| {
                let config = ParallelConfig { recompute, ..config.clone() };
                estimate_memory_with(&model, &t, &config, &c, kernel)
            };
            let none = with(Recompute::None);
            let selective = with(Recompute::Selective);
            let method = if uniform { RecomputeMethod::Uniform } else { RecomputeMethod::Block };
            let full = with(Recompute::Full { method, num_layers: n });
            for i in 0..none.stages.len() {
                let (a, b, c) = (&none.stages[i], &selective.stages[i], &full.stages[i]);
                prop_assert!(b.activation_bytes <= a.activation_bytes);
                // Full recomputation rebuilds one group whole, scores and all, so with
                // unfused attention it can exceed selective on a one-layer stage; it never
                // exceeds keeping everything. (A few bytes: separately rounded terms.)
                prop_assert!(c.activation_bytes <= a.activation_bytes + 4, "{} > {}", c.activation_bytes, a.activation_bytes);
                if kernel == AttentionKernel::Fused {
                    prop_assert!(c.activation_bytes <= b.activation_bytes + 4, "{} > {}", c.activation_bytes, b.activation_bytes);
                }
                prop_assert_eq!(a.weights_and_optimizer_bytes, c.weights_and_optimizer_bytes);
            }
            if kernel == AttentionKernel::Unfused && config.micro_batch > 0 {
                prop_assert!(selective.peak_bytes < none.peak_bytes);
            }
        }

        #[test]
        fn distributed_optimizer_divides_the_optimizer_state_by_dp((model, config, t) in setting()) {
            let c = Calibration::default();
            let plain = estimate_memory(&model, &t, &ParallelConfig { distributed_optimizer: false, ..config.clone() }, &c);
            let dist = estimate_memory(&model, &t, &ParallelConfig { distributed_optimizer: true, ..config.clone() }, &c);
            for (p, d) in plain.stages.iter().zip(&dist.stages) {
                prop_assert_eq!(p.weight_bytes, d.weight_bytes);
                prop_assert_eq!(p.gradient_bytes, d.gradient_bytes);
                prop_assert_eq!(d.optimizer_bytes, p.optimizer_bytes.div_ceil(config.dp));
                prop_assert_eq!(p.activation_bytes, d.activation_bytes);
            }
        }

        #[test]
        fn peak_is_the_worst_stage((model, config, t) in setting(), vpp in 1u64..=4) {
            let config = ParallelConfig { vpp: Some(vpp), ..config };
            let e = estimate_memory(&model, &t, &config, &Calibration::default());
            let totals = totals(&e);
            prop_assert_eq!(e.peak_bytes, *totals.iter().max().unwrap());
            prop_assert_eq!(totals[e.peak_stage], e.peak_bytes);
            prop_assert_eq!(e.stages.len(), config.layers_per_stage.len());
        }

        #[test]
        fn extreme_inputs_saturate_without_panicking(
            big in prop_oneof![Just(u64::MAX), Just(u64::MAX / 3), Just(1u64 << 40), Just(0u64)],
            which in 0usize..8,
            recompute in recompute(),
            vpp in prop_oneof![Just(None), Just(Some(0u64)), Just(Some(u64::MAX))],
        ) {
            let mut model = llama_like();
            let mut config = ParallelConfig::even(32, 2, 4, 2, 1);
            config.recompute = recompute;
            config.vpp = vpp;
            let mut t = training(64);
            match which {
                0 => model.hidden_size = big,
                1 => model.seq_length = big,
                2 => model.vocab_size = big,
                3 => config.micro_batch = big,
                4 => config.tp = big,
                5 => config.dp = big,
                6 => config.layers_per_stage[0] = big,
                _ => t.global_batch_size = big,
            }
            let e = estimate_memory(&model, &t, &config, &Calibration::default());
            prop_assert_eq!(e.stages.len(), 4);
            prop_assert!(e.peak_bytes >= e.stages[3].weights_and_optimizer_bytes);
        }
    }
}
