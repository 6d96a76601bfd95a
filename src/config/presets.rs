//! Named models for use without a script (`--model NAME`).
//!
//! A preset is a list of Megatron arguments. Read through the same parser as the user's own
//! arguments, its values are the defaults and whatever the user's arguments say overrides
//! them (see [`super::settings_from_megatron_args`]). So a preset means exactly what its
//! arguments mean to Megatron, and `tests/megatron/megatron_params.rs` checks each preset's
//! parameter count against the model Megatron builds from [`Preset::megatron_args`].
//!
//! Sources: GPT-3 from Brown et al. 2020 (Table 2.1: layers, d_model, heads × d_head,
//! batch in tokens; sequence 2048; GPT-2 BPE vocabulary of 50257; LayerNorm, biases,
//! learned positions, tied embeddings, GeLU). Llama 2 from Touvron et al. 2023 and the
//! released configurations (sequence 4096, vocabulary 32000, RMSNorm, SwiGLU, rotary
//! positions, no biases, untied output layer; 70B with 8 key/value groups; 4M-token batches).
//! Llama 3 from Dubey et al. 2024, "The Llama 3 Herd of Models" (Table 3: layers, model
//! dimension, FFN dimension, 8 key/value heads for every size, vocabulary of 128,256 tokens;
//! the same Llama architecture otherwise; sequences of 8,192 tokens; 405B trained with
//! batches of 16M tokens, 2,048 sequences, Table 4). The paper gives no batch for 8B and
//! 70B: they take 405B's. RoPE's base frequency (500,000) changes neither the parameter
//! count nor the time, so the presets leave `--rotary-base` at Megatron's default.
//!
//! Mixtures of experts, shapes from the model's paper or released configuration and the
//! Megatron arguments of NVIDIA's Megatron-MoE Model Zoo (github.com/yanring/Megatron-MoE-ModelZoo,
//! `model_configs/benchmarking/*.yaml`, MIT), which trains each of them with Megatron:
//! - Mixtral 8x7B: Jiang et al. 2024, "Mixtral of Experts" (arXiv 2401.04088, Table 1: 32
//!   layers, dim 4096, 32 heads, 8 key/value heads, hidden 14336, 8 experts, top-2, vocabulary
//!   32000, context 32768). Mixtral 8x22B: mistralai/Mixtral-8x22B-v0.1's config.json (56
//!   layers, hidden 6144, 48 heads, 8 key/value heads, intermediate 16384, 8 experts, top-2,
//!   65536 positions) with the vocabulary of 32000 the base model and the Model Zoo's
//!   Llama 2 tokenizer have (the later instruct release has 32768). Both: SwiGLU experts, RMSNorm, rope, no biases,
//!   untied output layer (Model Zoo's Mixtral yamls). Neither publication gives a training
//!   batch: both take the Megatron-Core MoE README's reference layouts' 256 sequences of
//!   4096 tokens.
//! - Qwen3-30B-A3B and Qwen3-235B-A22B: the Model Zoo's Qwen3 yamls (48 / 94 layers, hidden
//!   2048 / 4096, 32 / 64 heads in 4 key/value groups of width 128 with QK norms, 128
//!   experts of width 768 / 1536, top-8, every layer MoE, no shared expert; the Qwen3
//!   vocabulary of 151936 as `--make-vocab-size-divisible-by 1187`, 40960 positions), which
//!   agree with Qwen's released config.json files. Batch: the Model Zoo's measured
//!   Qwen3-235B-A22B H100 runs take 2048 sequences of 4096 (both presets).
//! - DeepSeek-V3: DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv 2412.19437: 61
//!   layers, hidden 7168, 128 heads, MLA with query rank 1536, key/value rank 512, head
//!   widths 128 + 64 rotary, 256 routed experts of width 2048 plus one shared, top-8, the
//!   first three layers dense with FFN 18432, one multi-token-prediction module, sequences of
//!   4096, batches of 15360 sequences, §4.2), in the Model Zoo's Megatron arguments
//!   (`--moe-layer-freq ([0]*3+[1]*58)`, `--qk-layernorm` for MLA's latent norms,
//!   vocabulary 129280 as `--make-vocab-size-divisible-by 3232`). DeepSeek's aux-loss-free
//!   balancing (`--moe-router-score-function sigmoid --moe-router-enable-expert-bias`) is
//!   left to the user's arguments: it holds a buffer, not parameters, and costs nothing the
//!   models price, and megatron-core builds its buffer on a GPU only, so the CPU check of
//!   the count could not build the preset with it.
//!
//! Every MoE preset routes with the `alltoall` dispatcher (the Megatron-Core MoE README's
//! choice for these layouts; `flex` needs DeepEP); `--moe-grouped-gemm` and the fused
//! kernels are the user's to add. `tests/megatron/megatron_params.rs` checks each count, total and
//! active, against the model megatron-core builds.

use super::megatron::ArgsError;
use super::ModelSpec;

/// A named model: its Megatron arguments and where they come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    pub name: &'static str,
    /// One line for `--help` and error messages.
    pub summary: &'static str,
    /// Megatron arguments: the model, the vocabulary, the paper's global batch, bf16.
    pub args: &'static [&'static str],
}

impl Preset {
    /// The preset's arguments, as they would be written after the training script.
    pub fn megatron_args(&self) -> Vec<String> {
        self.args.iter().map(|a| a.to_string()).collect()
    }

    /// The model the preset describes.
    pub fn model(&self) -> Result<ModelSpec, ArgsError> {
        super::settings_from_megatron_args(&[], Some(self.name), &[]).map(|s| s.model)
    }
}

// GPT-3's batch sizes are in tokens: 1M, 2M, 2M and 3.2M tokens of 2048 are 512, 1024,
// 1024 and 1536 sequences. The paper's table gives GPT-3 XL 24 heads of 128 and 13B a
// d_model of 5140; neither fits its own d_model (2048/24, 5140/40 are not whole numbers)
// nor its parameter count, so these keep d_model and the head width of 128: 16 heads for
// 1.3B and d_model 5120 for 13B, as Megatron's GPT-3 examples do.
macro_rules! gpt3 {
    ($layers:literal, $hidden:literal, $heads:literal, $batch:literal) => {
        &[
            "--num-layers",
            $layers,
            "--hidden-size",
            $hidden,
            "--num-attention-heads",
            $heads,
            "--seq-length",
            "2048",
            "--max-position-embeddings",
            "2048",
            "--vocab-size",
            "50257",
            "--micro-batch-size",
            "1",
            "--global-batch-size",
            $batch,
            "--bf16",
        ]
    };
}

// Llama 2 and Llama 3 share the architecture; the sequence, the vocabulary and the batch
// come first, then the model's own shape and any extra arguments (grouped-query attention).
macro_rules! llama {
    ($seq:literal, $vocab:literal, $batch:literal; $layers:literal, $hidden:literal, $heads:literal, $ffn:literal $(, $extra:literal)*) => {
        &[
            "--num-layers",
            $layers,
            "--hidden-size",
            $hidden,
            "--num-attention-heads",
            $heads,
            $($extra,)*
            "--ffn-hidden-size",
            $ffn,
            "--swiglu",
            "--normalization",
            "RMSNorm",
            "--disable-bias-linear",
            "--position-embedding-type",
            "rope",
            "--untie-embeddings-and-output-weights",
            "--seq-length",
            $seq,
            "--max-position-embeddings",
            $seq,
            "--vocab-size",
            $vocab,
            "--micro-batch-size",
            "1",
            "--global-batch-size",
            $batch,
            "--bf16",
        ]
    };
}

// Every Llama 3 has 8 key/value groups, the 128k vocabulary, sequences of 8192 and (see the
// module doc) batches of 2048 sequences.
macro_rules! llama3 {
    ($layers:literal, $hidden:literal, $heads:literal, $ffn:literal) => {
        llama!(
            "8192",
            "128256",
            "2048";
            $layers,
            $hidden,
            $heads,
            $ffn,
            "--group-query-attention",
            "--num-query-groups",
            "8"
        )
    };
}

// Mixtral: Llama's architecture with 8 experts of the FFN's width, top-2.
macro_rules! mixtral {
    ($layers:literal, $hidden:literal, $heads:literal, $ffn:literal, $vocab:literal, $positions:literal) => {
        &[
            "--num-layers",
            $layers,
            "--hidden-size",
            $hidden,
            "--num-attention-heads",
            $heads,
            "--group-query-attention",
            "--num-query-groups",
            "8",
            "--ffn-hidden-size",
            $ffn,
            "--swiglu",
            "--normalization",
            "RMSNorm",
            "--disable-bias-linear",
            "--position-embedding-type",
            "rope",
            "--untie-embeddings-and-output-weights",
            "--num-experts",
            "8",
            "--moe-router-topk",
            "2",
            "--moe-token-dispatcher-type",
            "alltoall",
            "--seq-length",
            "4096",
            "--max-position-embeddings",
            $positions,
            "--vocab-size",
            $vocab,
            "--micro-batch-size",
            "1",
            "--global-batch-size",
            "256",
            "--bf16",
        ]
    };
}

// Qwen3's MoE models: 128 experts, top-8, QK norms, heads of 128 in 4 key/value groups.
macro_rules! qwen3_moe {
    ($layers:literal, $hidden:literal, $heads:literal, $ffn:literal, $moe_ffn:literal) => {
        &[
            "--num-layers",
            $layers,
            "--hidden-size",
            $hidden,
            "--num-attention-heads",
            $heads,
            "--group-query-attention",
            "--num-query-groups",
            "4",
            "--kv-channels",
            "128",
            "--qk-layernorm",
            "--ffn-hidden-size",
            $ffn,
            "--swiglu",
            "--normalization",
            "RMSNorm",
            "--disable-bias-linear",
            "--position-embedding-type",
            "rope",
            "--untie-embeddings-and-output-weights",
            "--num-experts",
            "128",
            "--moe-ffn-hidden-size",
            $moe_ffn,
            "--moe-router-topk",
            "8",
            "--moe-token-dispatcher-type",
            "alltoall",
            "--seq-length",
            "4096",
            "--max-position-embeddings",
            "40960",
            "--vocab-size",
            "151936",
            "--make-vocab-size-divisible-by",
            "1187",
            "--micro-batch-size",
            "1",
            "--global-batch-size",
            "2048",
            "--bf16",
        ]
    };
}

/// Every preset, in the order `--help` lists them.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "gpt3-1.3b",
        summary: "GPT-3 XL: 24 layers, hidden 2048, 16 heads, seq 2048, batch 512",
        args: gpt3!("24", "2048", "16", "512"),
    },
    Preset {
        name: "gpt3-6.7b",
        summary: "GPT-3 6.7B: 32 layers, hidden 4096, 32 heads, seq 2048, batch 1024",
        args: gpt3!("32", "4096", "32", "1024"),
    },
    Preset {
        name: "gpt3-13b",
        summary: "GPT-3 13B: 40 layers, hidden 5120, 40 heads, seq 2048, batch 1024",
        args: gpt3!("40", "5120", "40", "1024"),
    },
    Preset {
        name: "gpt3-175b",
        summary: "GPT-3 175B: 96 layers, hidden 12288, 96 heads, seq 2048, batch 1536",
        args: gpt3!("96", "12288", "96", "1536"),
    },
    Preset {
        name: "llama2-7b",
        summary: "Llama 2 7B: 32 layers, hidden 4096, 32 heads, ffn 11008, seq 4096, batch 1024",
        args: llama!("4096", "32000", "1024"; "32", "4096", "32", "11008"),
    },
    Preset {
        name: "llama2-13b",
        summary: "Llama 2 13B: 40 layers, hidden 5120, 40 heads, ffn 13824, seq 4096, batch 1024",
        args: llama!("4096", "32000", "1024"; "40", "5120", "40", "13824"),
    },
    Preset {
        name: "llama2-70b",
        summary: "Llama 2 70B: 80 layers, hidden 8192, 64 heads in 8 groups, ffn 28672, seq 4096, batch 1024",
        args: llama!(
            "4096",
            "32000",
            "1024";
            "80",
            "8192",
            "64",
            "28672",
            "--group-query-attention",
            "--num-query-groups",
            "8"
        ),
    },
    Preset {
        name: "llama3-8b",
        summary: "Llama 3 8B: 32 layers, hidden 4096, 32 heads in 8 groups, ffn 14336, vocab 128256, seq 8192, batch 2048",
        args: llama3!("32", "4096", "32", "14336"),
    },
    Preset {
        name: "llama3-70b",
        summary: "Llama 3 70B: 80 layers, hidden 8192, 64 heads in 8 groups, ffn 28672, vocab 128256, seq 8192, batch 2048",
        args: llama3!("80", "8192", "64", "28672"),
    },
    Preset {
        name: "llama3-405b",
        summary: "Llama 3 405B: 126 layers, hidden 16384, 128 heads in 8 groups, ffn 53248, vocab 128256, seq 8192, batch 2048",
        args: llama3!("126", "16384", "128", "53248"),
    },
    Preset {
        name: "mixtral-8x7b",
        summary: "Mixtral 8x7B: 32 layers, hidden 4096, 32 heads in 8 groups, 8 experts of 14336, top-2, seq 4096, batch 256",
        args: mixtral!("32", "4096", "32", "14336", "32000", "32768"),
    },
    Preset {
        name: "mixtral-8x22b",
        summary: "Mixtral 8x22B: 56 layers, hidden 6144, 48 heads in 8 groups, 8 experts of 16384, top-2, seq 4096, batch 256",
        args: mixtral!("56", "6144", "48", "16384", "32000", "65536"),
    },
    Preset {
        name: "qwen3-30b-a3b",
        summary: "Qwen3-30B-A3B: 48 layers, hidden 2048, 32 heads in 4 groups, 128 experts of 768, top-8, seq 4096, batch 2048",
        args: qwen3_moe!("48", "2048", "32", "6144", "768"),
    },
    Preset {
        name: "qwen3-235b-a22b",
        summary: "Qwen3-235B-A22B: 94 layers, hidden 4096, 64 heads in 4 groups, 128 experts of 1536, top-8, seq 4096, batch 2048",
        args: qwen3_moe!("94", "4096", "64", "12288", "1536"),
    },
    Preset {
        name: "deepseek-v3",
        summary: "DeepSeek-V3: 61 layers (3 dense), hidden 7168, 128 heads, MLA, 256 experts of 2048 + 1 shared, top-8, 1 MTP layer, seq 4096, batch 15360",
        args: &[
            "--num-layers",
            "61",
            "--hidden-size",
            "7168",
            "--ffn-hidden-size",
            "18432",
            "--num-attention-heads",
            "128",
            "--kv-channels",
            "128",
            "--multi-latent-attention",
            "--q-lora-rank",
            "1536",
            "--kv-lora-rank",
            "512",
            "--qk-head-dim",
            "128",
            "--qk-pos-emb-head-dim",
            "64",
            "--v-head-dim",
            "128",
            "--qk-layernorm",
            "--swiglu",
            "--normalization",
            "RMSNorm",
            "--disable-bias-linear",
            "--position-embedding-type",
            "rope",
            "--untie-embeddings-and-output-weights",
            "--num-experts",
            "256",
            "--moe-layer-freq",
            "([0]*3+[1]*58)",
            "--moe-ffn-hidden-size",
            "2048",
            "--moe-shared-expert-intermediate-size",
            "2048",
            "--moe-router-topk",
            "8",
            "--moe-router-load-balancing-type",
            "seq_aux_loss",
            "--moe-token-dispatcher-type",
            "alltoall",
            "--mtp-num-layers",
            "1",
            "--seq-length",
            "4096",
            "--max-position-embeddings",
            "4096",
            "--vocab-size",
            "129280",
            "--make-vocab-size-divisible-by",
            "3232",
            "--micro-batch-size",
            "1",
            "--global-batch-size",
            "15360",
            "--bf16",
        ],
    },
];

/// The preset called `name`, if there is one.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The names of all presets.
pub fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.name).collect()
}

/// The preset called `name`, or an error that lists the known names.
pub fn lookup(name: &str) -> Result<&'static Preset, ArgsError> {
    preset(name).ok_or_else(|| ArgsError::UnknownPreset {
        name: name.to_string(),
        known: names().join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Normalization, PositionEmbedding, Precision};
    use crate::model::params::total_parameters;

    #[test]
    fn every_preset_parses_and_names_itself() {
        for p in PRESETS {
            let model = p.model().unwrap_or_else(|e| panic!("{}: {e}", p.name));
            assert_eq!(model.preset.as_deref(), Some(p.name));
            // The same arguments written after a script describe the same model.
            let args = p.megatron_args();
            let mut from_args = crate::config::settings_from_megatron_args(&args, None, &[])
                .unwrap()
                .model;
            from_args.preset = Some(p.name.to_string());
            assert_eq!(from_args, model, "{}", p.name);
        }
    }

    #[test]
    fn names_are_unique_and_include_the_required_ones() {
        let names = names();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
        for want in [
            "gpt3-1.3b",
            "gpt3-6.7b",
            "gpt3-13b",
            "gpt3-175b",
            "llama2-7b",
            "llama2-13b",
            "llama2-70b",
            "llama3-8b",
            "llama3-70b",
            "llama3-405b",
            "mixtral-8x7b",
            "mixtral-8x22b",
            "qwen3-30b-a3b",
            "qwen3-235b-a22b",
            "deepseek-v3",
        ] {
            assert!(preset(want).is_some(), "{want}");
        }
    }

    #[test]
    fn unknown_preset_lists_the_known_ones() {
        let err = lookup("gpt4").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("\"gpt4\""), "{text}");
        assert!(
            text.contains("gpt3-175b") && text.contains("llama2-70b"),
            "{text}"
        );
    }

    #[test]
    fn gpt3_presets_are_gpt3() {
        let m = preset("gpt3-175b").unwrap().model().unwrap();
        assert_eq!(
            (m.num_layers, m.hidden_size, m.num_attention_heads),
            (96, 12288, 96)
        );
        assert_eq!(
            (m.ffn_hidden_size, m.kv_channels, m.num_query_groups),
            (49152, 128, 96)
        );
        assert_eq!(
            (m.seq_length, m.max_position_embeddings, m.vocab_size),
            (2048, 2048, 50257)
        );
        assert_eq!(m.normalization, Normalization::LayerNorm);
        assert_eq!(m.position_embedding, PositionEmbedding::LearnedAbsolute);
        assert!(m.add_bias_linear && m.add_qkv_bias && !m.swiglu);
        assert!(!m.untie_embeddings_and_output_weights);
        let m = preset("gpt3-1.3b").unwrap().model().unwrap();
        assert_eq!(
            (m.hidden_size, m.num_attention_heads, m.kv_channels),
            (2048, 16, 128)
        );
    }

    #[test]
    fn llama2_presets_are_llama2() {
        let m = preset("llama2-7b").unwrap().model().unwrap();
        assert_eq!(
            (m.num_layers, m.hidden_size, m.ffn_hidden_size),
            (32, 4096, 11008)
        );
        assert_eq!(m.num_query_groups, 32);
        assert_eq!(m.normalization, Normalization::RMSNorm);
        assert_eq!(m.position_embedding, PositionEmbedding::Rope);
        assert!(m.swiglu && m.untie_embeddings_and_output_weights);
        assert!(!m.add_bias_linear && !m.add_qkv_bias);
        // The released Llama-2-7B has 6,738,415,616 parameters; Megatron's is the same.
        assert_eq!(total_parameters(&m, 1), 6_738_415_616);
        let m = preset("llama2-13b").unwrap().model().unwrap();
        assert_eq!(m.ffn_hidden_size, 13824);
        assert_eq!(total_parameters(&m, 1), 13_015_864_320);
        let m = preset("llama2-70b").unwrap().model().unwrap();
        assert_eq!((m.num_attention_heads, m.num_query_groups), (64, 8));
        assert_eq!(m.ffn_hidden_size, 28672);
        assert_eq!(total_parameters(&m, 1), 68_976_648_192);
    }

    #[test]
    fn llama3_presets_are_llama3() {
        for (name, layers, hidden, heads, ffn, parameters) in [
            ("llama3-8b", 32, 4096, 32, 14336, 8_030_261_248u64),
            ("llama3-70b", 80, 8192, 64, 28672, 70_553_706_496),
            ("llama3-405b", 126, 16384, 128, 53248, 405_853_388_800),
        ] {
            let m = preset(name).unwrap().model().unwrap();
            assert_eq!(
                (m.num_layers, m.hidden_size, m.num_attention_heads),
                (layers, hidden, heads),
                "{name}"
            );
            assert_eq!((m.ffn_hidden_size, m.num_query_groups), (ffn, 8), "{name}");
            assert_eq!((m.seq_length, m.vocab_size), (8192, 128256), "{name}");
            assert_eq!(m.kv_channels, 128, "{name}");
            assert_eq!(m.normalization, Normalization::RMSNorm);
            assert_eq!(m.position_embedding, PositionEmbedding::Rope);
            assert!(m.swiglu && m.untie_embeddings_and_output_weights);
            assert!(!m.add_bias_linear && !m.add_qkv_bias);
            // Megatron's own count (tests/megatron/megatron_params.rs); 8B and 70B are the released
            // checkpoints' counts too.
            assert_eq!(total_parameters(&m, 1), parameters, "{name}");
        }
    }

    /// Total and active parameters (Megatron's own count: tests/megatron/megatron_params.rs), which
    /// round to the publications' figures: Mixtral 8x7B 46.7B total / 12.9B active, 8x22B
    /// 141B / 39B, Qwen3 30.5B / 3.3B and 235B / 22B. DeepSeek-V3 publishes 671B / 37B
    /// without its multi-token-prediction module, which the preset trains (one layer: 683B
    /// here; the released checkpoint with it holds 685B).
    #[test]
    fn moe_presets_count_their_published_parameters() {
        use crate::model::params::ParameterBreakdown;
        for (name, total, active) in [
            ("mixtral-8x7b", 46_702_792_704u64, 12_879_925_248u64),
            ("mixtral-8x22b", 140_620_634_112, 39_152_031_744),
            ("qwen3-30b-a3b", 30_532_122_624, 3_353_032_704),
            ("qwen3-235b-a22b", 235_093_634_560, 22_190_763_520),
            ("deepseek-v3", 682_636_472_320, 38_240_382_976),
        ] {
            let m = preset(name).unwrap().model().unwrap();
            let b = ParameterBreakdown::new(&m, 1);
            assert_eq!((b.total(), b.active()), (total, active), "{name}");
        }
    }

    #[test]
    fn presets_train_in_bf16_with_the_papers_batch() {
        let s = crate::config::settings_from_megatron_args(&[], Some("gpt3-13b"), &[]).unwrap();
        assert_eq!(s.training.precision, Precision::Bf16);
        assert_eq!(s.training.global_batch_size, 1024);
        assert_eq!(s.training.micro_batch_size, 1);
    }
}
