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
//! no bias. Megatron's own `theoretical_memory_usage` leaves the linear biases and the
//! learned position embeddings out; these counts do not.
//!
//! Totals count every parameter of the whole model once, whatever the tensor-parallel size;
//! tp enters only through the padded vocabulary. `tests/megatron_params.rs` checks them
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
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }
}

/// The model's parameters by part, so that per-stage counts can be built from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParameterBreakdown {
    /// The vocabulary after padding for the tensor-parallel size the breakdown was made for.
    pub padded_vocab_size: u64,
    /// `word_embeddings`: padded vocab × hidden.
    pub word_embedding: u64,
    /// `position_embeddings`: max positions × hidden with learned absolute positions, else 0.
    pub position_embedding: u64,
    pub num_layers: u64,
    /// One transformer layer (all layers are alike).
    pub layer: LayerParameters,
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
        let layer = LayerParameters {
            input_norm: norm,
            qkv: linear(h, qkv_out, qkv_bias),
            attention_output: linear(query, h, spec.add_bias_linear),
            pre_mlp_norm: norm,
            mlp_up: linear(
                h,
                spec.ffn_hidden_size.saturating_mul(gates),
                spec.add_bias_linear,
            ),
            mlp_down: linear(spec.ffn_hidden_size, h, spec.add_bias_linear),
        };
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

    /// All transformer layers.
    pub fn layers(&self) -> u64 {
        self.layer.total().saturating_mul(self.num_layers)
    }

    /// The whole model, each parameter once (a tied output layer is the word embedding).
    pub fn total(&self) -> u64 {
        [
            self.embedding(),
            self.layers(),
            self.final_norm,
            self.output_layer,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    /// Parameters held by one pipeline stage with `layers` transformer layers, over all its
    /// tensor-parallel ranks together. The first stage holds the embeddings; the last the
    /// final norm and the output layer. With tied embeddings a last stage that is not also
    /// the first keeps its own copy of the word embeddings as the output weight (Megatron
    /// allocates it and all-reduces its gradient with the first stage).
    pub fn stage(&self, layers: u64, first: bool, last: bool) -> u64 {
        let mut n = self.layer.total().saturating_mul(layers);
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
            n = n.saturating_add(self.final_norm).saturating_add(output);
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
