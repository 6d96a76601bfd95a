//! Exact parameter counts of a Megatron GPT model.
//!
//! Counts Megatron-core's `GPTModel` as its local layer spec (and the Transformer-Engine
//! spec, which has the same parameters) builds it, tensor by tensor:
//!
//! | tensor | shape | when |
//! |---|---|---|
//! | `embedding.word_embeddings.weight` | padded vocab × h | always (first stage) |
//! | `embedding.position_embeddings.weight` | max positions × h | learned absolute positions |
//! | `input_layernorm.{weight,bias}` | h (+ h) | per layer; bias with LayerNorm only |
//! | `self_attention.linear_qkv.{weight,bias}` | (q + 2 kv) × h (+ q + 2 kv) | per layer; bias with linear or QKV bias |
//! | `self_attention.linear_proj.{weight,bias}` | h × q (+ h) | per layer; bias with linear bias |
//! | `pre_mlp_layernorm.{weight,bias}` | h (+ h) | per layer |
//! | `mlp.linear_fc1.{weight,bias}` | g·ffn × h (+ g·ffn) | per layer; g = 2 with SwiGLU |
//! | `mlp.linear_fc2.{weight,bias}` | h × ffn (+ h) | per layer |
//! | `decoder.final_layernorm.{weight,bias}` | h (+ h) | last stage |
//! | `output_layer.weight` | padded vocab × h | untied embeddings (and a tied copy on the last stage when pp > 1) |
//!
//! with q = heads × kv channels and kv = query groups × kv channels. The output layer has
//! no bias.
//!
//! Beyond the dense layer (megatron-core 0.19.2, local spec, as `scripts/megatron_reference.py`
//! lists the tensors):
//! - `--qk-layernorm`: `q_layernorm` and `k_layernorm` over one head (kv channels);
//! - multi-latent attention replaces `linear_qkv` with `linear_q_proj` (h → heads·(qk+rope))
//!   or `linear_q_down_proj` (h → q-lora) and `linear_q_up_proj` (q-lora → heads·(qk+rope)),
//!   `linear_kv_down_proj` (h → kv-lora + rope) and `linear_kv_up_proj` (kv-lora →
//!   heads·(qk+v)), none with a bias; with `--qk-layernorm` a norm over the q-lora and the
//!   kv-lora latents; `linear_proj` takes heads·v;
//! - an MoE layer's MLP is `router` (E × h, + E bias with linear biases), E experts
//!   each a `linear_fc1`/`linear_fc2` of the expert width (with biases when linear biases
//!   are on), and `shared_experts` (no biases; Megatron refuses them);
//! - each multi-token-prediction layer holds `enorm`, `hnorm`, `eh_proj` (2h → h, no bias),
//!   one transformer layer (MoE when the decoder's last layer is) and a `final_layernorm`;
//!   all on the last pipeline stage, sharing the embedding and output layer.
//!
//! Active parameters count top-k of the E routed experts in every MoE layer, decoder and
//! multi-token prediction alike. Megatron's own `theoretical_memory_usage` leaves the linear biases and the
//! learned position embeddings out; these counts do not.
//!
//! Totals count every parameter of the whole model once, whatever the tensor-parallel size;
//! tp enters only through the padded vocabulary. `tests/megatron/megatron_params.rs` checks them
//! against the model Megatron itself builds. Arithmetic saturates at `u64::MAX` instead of
//! overflowing, so absurd inputs can never panic here (the argument reader rejects them).

use serde::{Deserialize, Serialize};

use crate::config::{ModelSpec, Normalization, PositionEmbedding};

/// The vocabulary Megatron builds: the tokenizer's size rounded up to a multiple of
/// `make_vocab_size_divisible_by × tp` (megatron/core/tokenizers/utils/build_tokenizer.py,
/// `vocab_size_with_padding`). A tp of 0 is read as 1.
pub fn padded_vocab_size(spec: &ModelSpec, tp: u64) -> u64 {
    let multiple = spec
        .make_vocab_size_divisible_by
        .max(1)
        .saturating_mul(tp.max(1));
    spec.vocab_size.div_ceil(multiple).saturating_mul(multiple)
}

/// All parameters of the model for the given tensor-parallel size, each counted once.
pub fn total_parameters(spec: &ModelSpec, tp: u64) -> u64 {
    ParameterBreakdown::new(spec, tp).total()
}

/// The parameters of one transformer layer, biases and norms included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerParameters {
    /// `input_layernorm`: weight, and bias with LayerNorm.
    pub input_norm: u64,
    /// `linear_qkv`: the fused query/key/value projection.
    pub qkv: u64,
    /// `linear_proj`: the attention output projection.
    pub attention_output: u64,
    /// `pre_mlp_layernorm`.
    pub pre_mlp_norm: u64,
    /// `linear_fc1`: up projection (gate and up with SwiGLU).
    pub mlp_up: u64,
    /// `linear_fc2`: down projection.
    pub mlp_down: u64,
    /// `q_layernorm` / `k_layernorm` (`--qk-layernorm`), or multi-latent attention's
    /// latent norms.
    #[serde(default)]
    pub qk_norm: u64,
}

impl LayerParameters {
    pub fn total(&self) -> u64 {
        [
            self.input_norm,
            self.qkv,
            self.attention_output,
            self.pre_mlp_norm,
            self.mlp_up,
            self.mlp_down,
            self.qk_norm,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    /// The attention half of the layer: norms, projections (what an MoE layer shares with
    /// a dense one).
    pub fn attention(&self) -> u64 {
        [
            self.input_norm,
            self.qkv,
            self.attention_output,
            self.qk_norm,
            self.pre_mlp_norm,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }
}

/// The MLP of an MoE layer, replacing the dense layer's `mlp_up` / `mlp_down`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoeLayerParameters {
    /// `router`: E × h (+ E bias).
    pub router: u64,
    /// One routed expert's `linear_fc1` + `linear_fc2`.
    pub expert: u64,
    pub num_experts: u64,
    pub router_topk: u64,
    /// `shared_experts`: `linear_fc1` + `linear_fc2`.
    pub shared_experts: u64,
}

impl MoeLayerParameters {
    /// All routed experts of the layer.
    pub fn experts(&self) -> u64 {
        self.expert.saturating_mul(self.num_experts)
    }

    /// The whole MoE MLP.
    pub fn total(&self) -> u64 {
        self.router
            .saturating_add(self.experts())
            .saturating_add(self.shared_experts)
    }

    /// The routed experts a token does not use.
    pub fn inactive(&self) -> u64 {
        self.expert
            .saturating_mul(self.num_experts.saturating_sub(self.router_topk))
    }
}

/// The model's parameters by part, so that per-stage counts can be built from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParameterBreakdown {
    /// The vocabulary after padding for the tensor-parallel size the breakdown was made for.
    pub padded_vocab_size: u64,
    /// `word_embeddings`: padded vocab × hidden.
    pub word_embedding: u64,
    /// `position_embeddings`: max positions × hidden with learned absolute positions, else 0.
    pub position_embedding: u64,
    pub num_layers: u64,
    /// One dense transformer layer (an MoE layer has its attention half and `moe`'s MLP).
    pub layer: LayerParameters,
    /// The MLP of the MoE layers, and which decoder layers are MoE.
    #[serde(default)]
    pub moe: Option<MoeLayerParameters>,
    #[serde(default)]
    pub moe_layers: Vec<bool>,
    /// The multi-token-prediction block, on the last stage.
    #[serde(default)]
    pub mtp: u64,
    /// Routed-expert parameters of the multi-token-prediction block (in `mtp`).
    #[serde(default)]
    pub mtp_experts: u64,
    /// Multi-token-prediction layers that are MoE layers.
    #[serde(default)]
    pub mtp_moe_layers: u64,
    /// `final_layernorm`, on the last stage.
    pub final_norm: u64,
    /// `output_layer`: padded vocab × hidden when the embeddings are untied, else 0 (see
    /// [`ParameterBreakdown::stage`] for the tied copy a last pipeline stage holds).
    pub output_layer: u64,
    /// Whether the output layer reuses the word embeddings.
    pub tied_embeddings: bool,
}

impl ParameterBreakdown {
    pub fn new(spec: &ModelSpec, tp: u64) -> Self {
        let h = spec.hidden_size;
        let vocab = padded_vocab_size(spec, tp);
        let norm = match spec.normalization {
            Normalization::LayerNorm => h.saturating_mul(2),
            Normalization::RMSNorm => h,
        };
        let query = spec.num_attention_heads.saturating_mul(spec.kv_channels);
        let key_value = spec.num_query_groups.saturating_mul(spec.kv_channels);
        let qkv_out = query.saturating_add(key_value.saturating_mul(2));
        let linear = |inputs: u64, outputs: u64, bias: bool| {
            inputs
                .saturating_mul(outputs)
                .saturating_add(if bias { outputs } else { 0 })
        };
        let gates = if spec.swiglu { 2 } else { 1 };
        let qkv_bias = spec.add_bias_linear || spec.add_qkv_bias;
        // A norm over `n` values: weight, and bias with LayerNorm.
        let norm_of = |n: u64| match spec.normalization {
            Normalization::LayerNorm => n.saturating_mul(2),
            Normalization::RMSNorm => n,
        };
        let (qkv, attention_output, qk_norm) = match &spec.mla {
            None => (
                linear(h, qkv_out, qkv_bias),
                linear(query, h, spec.add_bias_linear),
                if spec.qk_layernorm {
                    norm_of(spec.kv_channels).saturating_mul(2)
                } else {
                    0
                },
            ),
            Some(mla) => {
                let heads = spec.num_attention_heads;
                let q_head = mla.qk_head_dim.saturating_add(mla.qk_pos_emb_head_dim);
                let q_out = heads.saturating_mul(q_head);
                let q = match mla.q_lora_rank {
                    None => linear(h, q_out, false),
                    Some(r) => linear(h, r, false).saturating_add(linear(r, q_out, false)),
                };
                let kv_down = linear(
                    h,
                    mla.kv_lora_rank.saturating_add(mla.qk_pos_emb_head_dim),
                    false,
                );
                let kv_up = linear(
                    mla.kv_lora_rank,
                    heads.saturating_mul(mla.qk_head_dim.saturating_add(mla.v_head_dim)),
                    false,
                );
                let norms = if spec.qk_layernorm {
                    norm_of(mla.kv_lora_rank).saturating_add(mla.q_lora_rank.map_or(0, norm_of))
                } else {
                    0
                };
                (
                    q.saturating_add(kv_down).saturating_add(kv_up),
                    linear(
                        heads.saturating_mul(mla.v_head_dim),
                        h,
                        spec.add_bias_linear,
                    ),
                    norms,
                )
            }
        };
        let mlp = |width: u64, bias: bool| {
            linear(h, width.saturating_mul(gates), bias).saturating_add(linear(width, h, bias))
        };
        let layer = LayerParameters {
            input_norm: norm,
            qkv,
            attention_output,
            pre_mlp_norm: norm,
            mlp_up: linear(
                h,
                spec.ffn_hidden_size.saturating_mul(gates),
                spec.add_bias_linear,
            ),
            mlp_down: linear(spec.ffn_hidden_size, h, spec.add_bias_linear),
            qk_norm,
        };
        let moe = spec.moe.as_ref().map(|m| MoeLayerParameters {
            router: linear(h, m.num_experts, spec.add_bias_linear),
            expert: mlp(m.ffn_hidden_size, spec.add_bias_linear),
            num_experts: m.num_experts,
            router_topk: m.router_topk,
            shared_experts: m.shared_expert_ffn.map_or(0, |f| mlp(f, false)),
        });
        let moe_layers = spec.moe.as_ref().map_or(Vec::new(), |m| m.layers.clone());
        // Multi-token prediction follows the decoder's last layer (MoE or dense).
        let mtp_is_moe = moe_layers.last().copied().unwrap_or(false);
        let mtp_layer = match (&moe, mtp_is_moe) {
            (Some(m), true) => layer.attention().saturating_add(m.total()),
            _ => layer.total(),
        };
        let mtp_each = norm
            .saturating_mul(3)
            .saturating_add(linear(h.saturating_mul(2), h, false))
            .saturating_add(mtp_layer);
        let mtp_moe_layers = if mtp_is_moe { spec.mtp_layers } else { 0 };
        let word_embedding = vocab.saturating_mul(h);
        ParameterBreakdown {
            padded_vocab_size: vocab,
            word_embedding,
            position_embedding: match spec.position_embedding {
                PositionEmbedding::LearnedAbsolute => {
                    spec.max_position_embeddings.saturating_mul(h)
                }
                PositionEmbedding::Rope | PositionEmbedding::None => 0,
            },
            num_layers: spec.num_layers,
            layer,
            mtp: mtp_each.saturating_mul(spec.mtp_layers),
            mtp_experts: moe
                .map_or(0, |m| m.experts())
                .saturating_mul(mtp_moe_layers),
            mtp_moe_layers,
            moe,
            moe_layers,
            final_norm: norm,
            output_layer: if spec.untie_embeddings_and_output_weights {
                word_embedding
            } else {
                0
            },
            tied_embeddings: !spec.untie_embeddings_and_output_weights,
        }
    }

    /// Word and position embeddings: what the first stage holds besides its layers.
    pub fn embedding(&self) -> u64 {
        self.word_embedding.saturating_add(self.position_embedding)
    }

    /// Decoder layer `i` (from 0): its attention half, and a dense or an MoE MLP.
    pub fn layer_total(&self, i: u64) -> u64 {
        match (&self.moe, self.is_moe_layer(i)) {
            (Some(m), true) => self.layer.attention().saturating_add(m.total()),
            _ => self.layer.total(),
        }
    }

    /// Whether decoder layer `i` (from 0) is an MoE layer.
    pub fn is_moe_layer(&self, i: u64) -> bool {
        self.moe_layers.get(i as usize).copied().unwrap_or(false)
    }

    /// The routed-expert parameters of decoder layers `start .. start + layers` (each whole:
    /// expert parallelism divides them).
    pub fn experts_in(&self, start: u64, layers: u64) -> u64 {
        let Some(m) = &self.moe else { return 0 };
        let end = start
            .saturating_add(layers)
            .min(self.moe_layers.len() as u64);
        let moe = (start.min(end)..end)
            .filter(|i| self.is_moe_layer(*i))
            .count() as u64;
        m.experts().saturating_mul(moe)
    }

    /// All transformer layers.
    pub fn layers(&self) -> u64 {
        if self.moe.is_none() {
            return self.layer.total().saturating_mul(self.num_layers);
        }
        (0..self.num_layers)
            .map(|i| self.layer_total(i))
            .fold(0, u64::saturating_add)
    }

    /// Parameters a token goes through: the total less the routed experts beyond top-k in
    /// every MoE layer (decoder and multi-token prediction).
    pub fn active(&self) -> u64 {
        let Some(m) = &self.moe else {
            return self.total();
        };
        let moe = self.moe_layers.iter().filter(|x| **x).count() as u64 + self.mtp_moe_layers;
        self.total()
            .saturating_sub(m.inactive().saturating_mul(moe))
    }

    /// The whole model, each parameter once (a tied output layer is the word embedding).
    pub fn total(&self) -> u64 {
        [
            self.embedding(),
            self.layers(),
            self.final_norm,
            self.output_layer,
            self.mtp,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    /// Parameters held by one pipeline stage with `layers` transformer layers, over all its
    /// tensor-parallel ranks together. The first stage holds the embeddings; the last the
    /// final norm and the output layer. With tied embeddings a last stage that is not also
    /// the first keeps its own copy of the word embeddings as the output weight (Megatron
    /// allocates it and all-reduces its gradient with the first stage).
    ///
    /// The stage's layers are taken as the first ones; with dense and MoE layers mixed
    /// use [`ParameterBreakdown::stage_from`].
    pub fn stage(&self, layers: u64, first: bool, last: bool) -> u64 {
        self.stage_from(0, layers, first, last)
    }

    /// [`ParameterBreakdown::stage`] for the stage holding decoder layers
    /// `start .. start + layers`; the last stage also holds the multi-token prediction.
    pub fn stage_from(&self, start: u64, layers: u64, first: bool, last: bool) -> u64 {
        let mut n = if self.moe.is_none() {
            self.layer.total().saturating_mul(layers)
        } else {
            (start..start.saturating_add(layers))
                .map(|i| self.layer_total(i))
                .fold(0, u64::saturating_add)
        };
        if first {
            n = n.saturating_add(self.embedding());
        }
        if last {
            let output = if !self.tied_embeddings {
                self.output_layer
            } else if first {
                0
            } else {
                self.word_embedding
            };
            n = n
                .saturating_add(self.final_norm)
                .saturating_add(output)
                .saturating_add(self.mtp);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Megatron's small test model: 2 layers, h 64, 4 heads, vocab 1000, GPT defaults.
    fn tiny() -> ModelSpec {
        ModelSpec {
            preset: None,
            num_layers: 2,
            hidden_size: 64,
            ffn_hidden_size: 256,
            num_attention_heads: 4,
            num_query_groups: 4,
            kv_channels: 16,
            seq_length: 128,
            max_position_embeddings: 128,
            vocab_size: 1000,
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
    fn vocabulary_pads_to_a_multiple_of_divisor_times_tp() {
        let mut spec = tiny();
        assert_eq!(padded_vocab_size(&spec, 1), 1024);
        assert_eq!(padded_vocab_size(&spec, 8), 1024);
        assert_eq!(padded_vocab_size(&spec, 16), 2048);
        spec.vocab_size = 50257;
        assert_eq!(padded_vocab_size(&spec, 1), 50304);
        assert_eq!(padded_vocab_size(&spec, 2), 50432);
        assert_eq!(padded_vocab_size(&spec, 8), 51200);
        spec.vocab_size = 32000;
        assert_eq!(padded_vocab_size(&spec, 1), 32000);
        assert_eq!(padded_vocab_size(&spec, 8), 32768);
        spec.make_vocab_size_divisible_by = 1;
        assert_eq!(padded_vocab_size(&spec, 1), 32000);
        assert_eq!(padded_vocab_size(&spec, 0), 32000);
    }

    #[test]
    fn tiny_gpt_matches_the_tensors_megatron_builds() {
        // Megatron 0.19.2 builds 173824 parameters for these arguments (the tensors of the
        // module doc: 1024·64 + 128·64 + 2·(128 + 192·64+192 + 64·64+64 + 128 + 256·64+256
        // + 64·256+64) + 128).
        let spec = tiny();
        let b = ParameterBreakdown::new(&spec, 1);
        assert_eq!(b.word_embedding, 1024 * 64);
        assert_eq!(b.position_embedding, 128 * 64);
        assert_eq!(b.layer.qkv, 192 * 64 + 192);
        assert_eq!(b.layer.attention_output, 64 * 64 + 64);
        assert_eq!(b.layer.mlp_up, 256 * 64 + 256);
        assert_eq!(b.layer.mlp_down, 64 * 256 + 64);
        assert_eq!(b.layer.input_norm, 128);
        assert_eq!(b.final_norm, 128);
        assert_eq!(b.output_layer, 0);
        assert_eq!(total_parameters(&spec, 1), 173_824);
    }

    #[test]
    fn llama_style_layer_has_no_biases_and_gated_mlp() {
        // GQA 4 heads / 2 groups, SwiGLU (ffn 128), RMSNorm, no biases, rope, untied:
        // Megatron builds 427072 parameters for 8 layers at tp 2.
        let spec = ModelSpec {
            num_layers: 8,
            ffn_hidden_size: 128,
            num_query_groups: 2,
            swiglu: true,
            untie_embeddings_and_output_weights: true,
            normalization: Normalization::RMSNorm,
            add_bias_linear: false,
            add_qkv_bias: false,
            position_embedding: PositionEmbedding::Rope,
            ..tiny()
        };
        let b = ParameterBreakdown::new(&spec, 2);
        assert_eq!(b.layer.qkv, (64 + 2 * 32) * 64);
        assert_eq!(b.layer.mlp_up, 256 * 64);
        assert_eq!(b.layer.input_norm, 64);
        assert_eq!(b.position_embedding, 0);
        assert_eq!(b.output_layer, 1024 * 64);
        assert_eq!(b.total(), 427_072);
    }

    #[test]
    fn qkv_bias_alone_adds_only_the_qkv_bias() {
        let no_bias = ModelSpec {
            add_bias_linear: false,
            add_qkv_bias: false,
            ..tiny()
        };
        let qkv_bias = ModelSpec {
            add_qkv_bias: true,
            ..no_bias.clone()
        };
        let diff = total_parameters(&qkv_bias, 1) - total_parameters(&no_bias, 1);
        assert_eq!(diff, 2 * 192);
    }

    #[test]
    fn stages_add_up_to_the_total() {
        for untie in [false, true] {
            let spec = ModelSpec {
                untie_embeddings_and_output_weights: untie,
                num_layers: 6,
                ..tiny()
            };
            let b = ParameterBreakdown::new(&spec, 1);
            assert_eq!(b.stage(6, true, true), b.total());
            let split =
                b.stage(2, true, false) + b.stage(2, false, false) + b.stage(2, false, true);
            // A tied model's last stage holds a copy of the word embeddings.
            let copy = if untie { 0 } else { b.word_embedding };
            assert_eq!(split, b.total() + copy);
        }
    }

    #[test]
    fn absurd_sizes_saturate_instead_of_panicking() {
        let spec = ModelSpec {
            hidden_size: u64::MAX / 3,
            vocab_size: u64::MAX - 5,
            num_layers: u64::MAX,
            ..tiny()
        };
        assert_eq!(total_parameters(&spec, u64::MAX), u64::MAX);
        assert_eq!(padded_vocab_size(&spec, u64::MAX), u64::MAX);
    }
}
