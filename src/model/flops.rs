//! Floating-point operations of a dense Megatron GPT model, per layer and per pipeline
//! stage, for one micro-batch.
//!
//! Counts the matrix multiplies only (norms, softmax, activations and the embedding lookup
//! are bandwidth-bound and left to the efficiency factor), with a multiply-add as 2 FLOPs.
//! For micro-batch `b`, sequence `s`, hidden `h`, ffn size `f`, query width
//! `q = heads × kv_channels` and key/value width `kv = query_groups × kv_channels`, one
//! layer's forward pass costs
//!
//! | part | FLOPs |
//! |---|---|
//! | QKV projection | 2·b·s·h·(q + 2·kv) |
//! | scores `QKᵀ` and context `softmax·V` | 2·2·b·s²·q, halved under a causal mask |
//! | attention output projection | 2·b·s·q·h |
//! | MLP | 2·b·s·h·f·(2, or 3 with SwiGLU) |
//!
//! and the output layer (last stage) 2·b·s·h·V with the padded vocabulary `V`. The backward
//! pass costs twice the forward (a data gradient and a weight gradient per multiply);
//! recomputation adds forward work to the backward pass.
//!
//! **Causal halving.** A causal mask makes half of the score matrix dead, and flash
//! attention (Megatron's default through Transformer Engine) skips the dead blocks, so
//! [`AttentionMask::Causal`] halves the score term. Megatron-core 0.19.2's reported-TFLOPs
//! formula (`num_floating_point_operations` in megatron/training/training.py) halves it too
//! (its comment: "causal mask -> /2"); older Megatron releases and the Narayanan et al.
//! 2021 closed form `24·b·s·h² + 4·b·s²·h` per layer do not. [`AttentionMask::Full`] gives
//! the unhalved count. [`megatron_reported_flops`] reproduces 0.19.2's figure for dense
//! models and is tested against it.
//!
//! All counts are `f64`: a whole iteration of a large model exceeds 2^53 FLOPs, and the
//! time model divides them anyway.

use serde::Serialize;

use crate::config::{ModelSpec, Recompute};

use super::parallel::ParallelConfig;
use super::params::padded_vocab_size;

/// How the attention score and context multiplies are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionMask {
    /// Causal (GPT): half the score matrix is masked and skipped.
    Causal,
    /// Every query attends to every key.
    Full,
}

/// Forward FLOPs of one transformer layer for one micro-batch, all tensor-parallel ranks
/// together.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LayerFlops {
    /// Fused query/key/value projection: 2·b·s·h·(q + 2·kv).
    pub qkv: f64,
    /// `QKᵀ` and `softmax(QKᵀ)·V`: 2·2·b·s²·q, halved when causal.
    pub attention_core: f64,
    /// Attention output projection: 2·b·s·q·h.
    pub attention_output: f64,
    /// Up (gate and up with SwiGLU) and down projections: 2·b·s·h·f·(2 or 3).
    pub mlp: f64,
}

impl LayerFlops {
    pub fn new(spec: &ModelSpec, micro_batch: u64, mask: AttentionMask) -> Self {
        let b = micro_batch as f64;
        let s = spec.seq_length as f64;
        let h = spec.hidden_size as f64;
        let f = spec.ffn_hidden_size as f64;
        let q = spec.num_attention_heads as f64 * spec.kv_channels as f64;
        let kv = spec.num_query_groups as f64 * spec.kv_channels as f64;
        let matrices = if spec.swiglu { 3.0 } else { 2.0 };
        let core = 2.0 * 2.0 * b * s * s * q;
        LayerFlops {
            qkv: 2.0 * b * s * h * (q + 2.0 * kv),
            attention_core: match mask {
                AttentionMask::Causal => core / 2.0,
                AttentionMask::Full => core,
            },
            attention_output: 2.0 * b * s * q * h,
            mlp: 2.0 * b * s * h * f * matrices,
        }
    }

    /// The whole layer's forward FLOPs.
    pub fn total(&self) -> f64 {
        self.qkv + self.attention_core + self.attention_output + self.mlp
    }
}

/// Forward FLOPs of the output layer (logits) for one micro-batch: 2·b·s·h·V, with the
/// vocabulary padded for tensor-parallel size `tp`.
pub fn logits_flops(spec: &ModelSpec, micro_batch: u64, tp: u64) -> f64 {
    2.0 * micro_batch as f64
        * spec.seq_length as f64
        * spec.hidden_size as f64
        * padded_vocab_size(spec, tp) as f64
}

/// FLOPs of one pipeline stage for one micro-batch, all its tensor-parallel ranks together
/// (divide by tp for one GPU).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StageFlops {
    /// Forward pass: the stage's layers, plus the logits on the last stage.
    pub forward: f64,
    /// Backward pass: twice the forward.
    pub backward: f64,
    /// Forward work redone during the backward pass by activation recomputation.
    pub recompute: f64,
    /// Layers whose whole forward pass is redone (full recomputation); their tensor-parallel
    /// collectives are redone too.
    pub recomputed_layers: u64,
}

impl StageFlops {
    /// Everything the stage computes for one micro-batch.
    pub fn total(&self) -> f64 {
        self.forward + self.backward + self.recompute
    }
}

/// The FLOPs of pipeline stage `stage` of `config` (0-based) for one micro-batch.
///
/// Recomputation: selective recomputes the core attention (Megatron's default
/// `--recompute-modules core_attn`) of every layer; full `uniform` recomputes every layer
/// (it checkpoints chunks of `num_layers`); full `block` recomputes the first `num_layers`
/// layers of each model chunk, i.e. `num_layers × vpp` of the stage at most. A stage
/// outside the configuration has no layers.
pub fn stage_flops(
    spec: &ModelSpec,
    config: &ParallelConfig,
    stage: usize,
    mask: AttentionMask,
) -> StageFlops {
    let layers = config.layers_per_stage.get(stage).copied().unwrap_or(0);
    let last = stage + 1 == config.layers_per_stage.len();
    let layer = LayerFlops::new(spec, config.micro_batch, mask);
    let mut forward = layer.total() * layers as f64;
    if last {
        forward += logits_flops(spec, config.micro_batch, config.tp);
    }
    // MoE layers: the routed top-k experts, the shared expert and the router in place of
    // the dense MLP (Megatron's num_floating_point_operations counts them so).
    if let Some(moe) = &spec.moe {
        let start: u64 = config.layers_per_stage.iter().take(stage).sum();
        let moe_layers = (start..start + layers)
            .filter(|i| moe.is_moe_layer(*i))
            .count() as f64;
        let tokens = config.micro_batch as f64 * spec.seq_length as f64;
        let h = spec.hidden_size as f64;
        let matrices = if spec.swiglu { 3.0 } else { 2.0 };
        let widths = moe.router_topk as f64 * moe.ffn_hidden_size as f64
            + moe.shared_expert_ffn.unwrap_or(0) as f64;
        let moe_mlp = 2.0 * tokens * h * (widths * matrices + moe.num_experts as f64);
        forward += moe_layers * (moe_mlp - layer.mlp);
    }
    let chunks = config.vpp.unwrap_or(1).max(1);
    let (recompute, recomputed_layers) = match &config.recompute {
        Recompute::None => (0.0, 0),
        Recompute::Selective => (layer.attention_core * layers as f64, 0),
        Recompute::Full { method, num_layers } => {
            let n = match method {
                crate::config::RecomputeMethod::Uniform => layers,
                crate::config::RecomputeMethod::Block => {
                    num_layers.saturating_mul(chunks).min(layers)
                }
            };
            (layer.total() * n as f64, n)
        }
    };
    StageFlops {
        forward,
        backward: 2.0 * forward,
        recompute,
        recomputed_layers,
    }
}

/// The FLOPs Megatron-core 0.19.2 reports for one iteration of `batch` samples of a dense
/// GPT model (`num_floating_point_operations` in megatron/training/training.py): three times
/// the forward pass of every layer and the logits, the score term halved for the causal
/// mask, recomputation not counted (it is model FLOPs, not hardware FLOPs).
pub fn megatron_reported_flops(spec: &ModelSpec, batch: u64, tp: u64) -> f64 {
    let layer = LayerFlops::new(spec, batch, AttentionMask::Causal);
    3.0 * (layer.total() * spec.num_layers as f64 + logits_flops(spec, batch, tp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Normalization, PositionEmbedding, RecomputeMethod};

    fn gpt(layers: u64, h: u64, heads: u64, s: u64, vocab: u64) -> ModelSpec {
        ModelSpec {
            preset: None,
            num_layers: layers,
            hidden_size: h,
            ffn_hidden_size: 4 * h,
            num_attention_heads: heads,
            num_query_groups: heads,
            kv_channels: h / heads,
            seq_length: s,
            max_position_embeddings: s,
            vocab_size: vocab,
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

    #[test]
    fn mha_gelu_layer_is_the_closed_form() {
        // Narayanan et al. 2021: 24·b·s·h² + 4·b·s²·h per layer forward without causal
        // halving; Megatron 0.19.2 halves the s² term.
        let spec = gpt(24, 1024, 16, 2048, 50257);
        let (b, s, h) = (8.0, 2048.0, 1024.0);
        let full = LayerFlops::new(&spec, 8, AttentionMask::Full);
        assert_eq!(full.total(), 24.0 * b * s * h * h + 4.0 * b * s * s * h);
        let causal = LayerFlops::new(&spec, 8, AttentionMask::Causal);
        assert_eq!(causal.total(), 24.0 * b * s * h * h + 2.0 * b * s * s * h);
    }

    #[test]
    fn agrees_with_megatron_num_floating_point_operations() {
        // Values printed by megatron-core 0.19.2's `num_floating_point_operations(args, batch)`
        // (megatron/training/training.py), run in scripts/setup-megatron-venv's venv:
        //  - GPT, MHA + GeLU: 24 layers, h 1024, 16 heads, s 2048, padded vocab 51200, batch 8;
        //  - Llama-style GQA + SwiGLU: 32 layers, h 4096, ffn 14336, 32 heads, 8 groups,
        //    kv channels 128, s 4096, padded vocab 128256, batch 4.
        let spec = gpt(24, 1024, 16, 2048, 50257);
        assert_eq!(padded_vocab_size(&spec, 1), 50304);
        // 51200 is the vocabulary padded for tp 8 (multiple of 128 × 8).
        assert_eq!(padded_vocab_size(&spec, 8), 51200);
        assert_eq!(megatron_reported_flops(&spec, 8, 8), 39_788_577_030_144.0);

        let llama = ModelSpec {
            num_layers: 32,
            hidden_size: 4096,
            ffn_hidden_size: 14336,
            num_attention_heads: 32,
            num_query_groups: 8,
            kv_channels: 128,
            seq_length: 4096,
            max_position_embeddings: 4096,
            vocab_size: 128256,
            make_vocab_size_divisible_by: 1,
            swiglu: true,
            ..spec
        };
        assert_eq!(padded_vocab_size(&llama, 1), 128256);
        assert_eq!(megatron_reported_flops(&llama, 4, 1), 790_514_500_632_576.0);
    }

    #[test]
    fn gqa_and_swiglu_change_the_right_terms() {
        let mha = gpt(2, 4096, 32, 4096, 32000);
        let gqa = ModelSpec {
            num_query_groups: 8,
            ..mha.clone()
        };
        let a = LayerFlops::new(&mha, 1, AttentionMask::Causal);
        let g = LayerFlops::new(&gqa, 1, AttentionMask::Causal);
        let (s, h) = (4096.0, 4096.0);
        assert_eq!(a.qkv, 2.0 * s * h * 3.0 * h);
        assert_eq!(g.qkv, 2.0 * s * h * (h + 2.0 * h / 4.0));
        assert_eq!(a.attention_core, g.attention_core);
        let swiglu = ModelSpec {
            swiglu: true,
            ..mha
        };
        let w = LayerFlops::new(&swiglu, 1, AttentionMask::Causal);
        assert_eq!(w.mlp, a.mlp * 1.5);
    }

    #[test]
    fn stages_split_the_model_and_the_last_adds_logits() {
        let spec = gpt(8, 256, 4, 128, 1000);
        let mut config = ParallelConfig::even(8, 1, 2, 1, 2);
        let first = stage_flops(&spec, &config, 0, AttentionMask::Causal);
        let last = stage_flops(&spec, &config, 1, AttentionMask::Causal);
        let logits = logits_flops(&spec, 2, 1);
        assert_eq!(last.forward - first.forward, logits);
        assert_eq!(first.backward, 2.0 * first.forward);
        assert_eq!(first.recompute, 0.0);
        // The stages add up to what Megatron reports, with b = 2.
        let whole = (first.forward + last.forward) * 3.0;
        assert_eq!(whole, megatron_reported_flops(&spec, 2, 1));

        let layer = LayerFlops::new(&spec, 2, AttentionMask::Causal);
        config.recompute = Recompute::Selective;
        let sel = stage_flops(&spec, &config, 0, AttentionMask::Causal);
        assert_eq!(sel.recompute, 4.0 * layer.attention_core);
        assert_eq!(sel.recomputed_layers, 0);
        config.recompute = Recompute::Full {
            method: RecomputeMethod::Uniform,
            num_layers: 1,
        };
        let full = stage_flops(&spec, &config, 0, AttentionMask::Causal);
        assert_eq!(full.recompute, first.forward);
        assert_eq!(full.recomputed_layers, 4);
        config.recompute = Recompute::Full {
            method: RecomputeMethod::Block,
            num_layers: 1,
        };
        config.vpp = Some(2);
        let block = stage_flops(&spec, &config, 1, AttentionMask::Causal);
        assert_eq!(block.recompute, 2.0 * layer.total());
        assert_eq!(block.total(), 3.0 * last.forward + 2.0 * layer.total());
        // Outside the configuration: nothing.
        assert_eq!(
            stage_flops(&spec, &config, 7, AttentionMask::Causal).forward,
            0.0
        );
    }
}
