//! Reading the user's Megatron arguments into what they say ([`RawArgs`]), before any
//! default or derivation: option by option as the [`options`] table says, the preset's
//! under the user's ([`merge`]), and the vocabulary the tokenizer implies ([`vocabulary`]).

use super::argparse::{arg_words, parse_count};
use super::layer_freq::LayerFreq;
use super::options::{self, Arity, Field, Read};
use super::{contradiction, ArgsError};
use crate::config::{
    CpCommType, Dispatcher, DropPolicy, LoadBalancing, Normalization, PositionEmbedding,
    RecomputeMethod, RecomputeModule,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Granularity {
    Full,
    Selective,
}

/// What the arguments say before defaults and derivations: `None` / `false` = not given.
#[derive(Debug, Clone, Default)]
pub(super) struct RawArgs {
    pub(super) num_layers: Option<u64>,
    pub(super) hidden_size: Option<u64>,
    pub(super) ffn_hidden_size: Option<u64>,
    pub(super) num_attention_heads: Option<u64>,
    pub(super) group_query_attention: bool,
    pub(super) num_query_groups: Option<u64>,
    pub(super) kv_channels: Option<u64>,
    pub(super) seq_length: Option<u64>,
    pub(super) max_position_embeddings: Option<u64>,
    pub(super) vocab_size: Option<u64>,
    pub(super) tokenizer_type: Option<String>,
    pub(super) tokenizer_model: Option<String>,
    pub(super) make_vocab_size_divisible_by: Option<u64>,
    pub(super) swiglu: bool,
    pub(super) untie: bool,
    pub(super) normalization: Option<Normalization>,
    pub(super) disable_bias_linear: bool,
    pub(super) add_qkv_bias: bool,
    pub(super) position_embedding_type: Option<PositionEmbedding>,
    pub(super) use_rotary_position_embeddings: bool,
    pub(super) no_position_embedding: bool,
    pub(super) global_batch_size: Option<u64>,
    pub(super) micro_batch_size: Option<u64>,
    pub(super) bf16: bool,
    pub(super) fp16: bool,
    pub(super) recompute_activations: bool,
    pub(super) recompute_granularity: Option<Granularity>,
    pub(super) recompute_method: Option<RecomputeMethod>,
    pub(super) recompute_num_layers: Option<u64>,
    pub(super) sequence_parallel: bool,
    pub(super) use_distributed_optimizer: bool,
    pub(super) save: Option<String>,
    pub(super) load: Option<String>,
    pub(super) save_interval: Option<u64>,
    pub(super) ckpt_format: Option<String>,
    pub(super) dist_ckpt_optim_fully_reshardable: bool,
    pub(super) train_iters: Option<u64>,
    pub(super) tensor_parallel: Option<u64>,
    pub(super) pipeline_parallel: Option<u64>,
    pub(super) layers_per_virtual_stage: Option<u64>,
    pub(super) virtual_stages_per_rank: Option<u64>,
    pub(super) no_overlap_p2p: bool,
    pub(super) overlap_grad_reduce: bool,
    pub(super) overlap_param_gather: bool,
    pub(super) grad_reduce_in_bf16: bool,
    pub(super) tp_comm_overlap: bool,
    pub(super) num_experts: Option<u64>,
    pub(super) moe_router_topk: Option<u64>,
    pub(super) moe_ffn_hidden_size: Option<u64>,
    pub(super) moe_shared_expert_intermediate_size: Option<u64>,
    pub(super) moe_shared_expert_overlap: bool,
    pub(super) moe_layer_freq: Option<LayerFreq>,
    pub(super) expert_parallel: Option<u64>,
    pub(super) expert_tensor_parallel: Option<u64>,
    pub(super) moe_grouped_gemm: bool,
    pub(super) moe_dispatcher: Option<Dispatcher>,
    pub(super) moe_load_balancing: Option<LoadBalancing>,
    pub(super) moe_capacity_factor: Option<f64>,
    pub(super) moe_pad_to_capacity: bool,
    pub(super) moe_drop_policy: Option<DropPolicy>,
    pub(super) moe_expert_bias: bool,
    /// `--moe-router-score-function` (softmax by default).
    pub(super) moe_score_function: Option<String>,
    /// Sinkhorn among the `--moe-router-load-balancing-type` list (not only first).
    pub(super) moe_sinkhorn_listed: bool,
    pub(super) no_bias_dropout_fusion: bool,
    pub(super) no_bias_gelu_fusion: bool,
    pub(super) multi_latent_attention: bool,
    pub(super) q_lora_rank: Option<u64>,
    pub(super) kv_lora_rank: Option<u64>,
    pub(super) qk_head_dim: Option<u64>,
    pub(super) qk_pos_emb_head_dim: Option<u64>,
    pub(super) v_head_dim: Option<u64>,
    pub(super) mtp_num_layers: Option<u64>,
    pub(super) qk_layernorm: bool,
    pub(super) recompute_modules: Option<Vec<RecomputeModule>>,
    pub(super) first_stage_layers: Option<u64>,
    pub(super) last_stage_layers: Option<u64>,
    /// Options the planner does not model (`Read::Unsupported` at a value other than the
    /// neutral one), as written, with what they change: such a run is launched unplanned.
    pub(super) unmodelled: Vec<(String, &'static str)>,
    pub(super) context_parallel: Option<u64>,
    pub(super) cp_comm_type: Option<CpCommType>,
    pub(super) hierarchical_context_parallel: Option<Vec<u64>>,
    pub(super) fp8_format: Option<String>,
    pub(super) fp8_recipe: Option<String>,
    pub(super) fp8_param_gather: bool,
    pub(super) fp4_format: Option<String>,
    pub(super) fp4_recipe: Option<String>,
    pub(super) fp4_param_gather: bool,
    pub(super) first_last_layers_bf16: bool,
    pub(super) bf16_layers_at_start: Option<u64>,
    pub(super) bf16_layers_at_end: Option<u64>,
    /// Megatron options written with underscores (`--num_layers`): not Megatron's, but
    /// worth a hint when the dashed one is missing.
    pub(super) underscored: Vec<String>,
}

const TOKENIZERS: &[&str] = &[
    "BertWordPieceLowerCase",
    "BertWordPieceCase",
    "GPT2BPETokenizer",
    "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer",
    "HuggingFaceTokenizer",
    "Llama2Tokenizer",
    "TikTokenizer",
    "MultimodalTokenizer",
    "NullTokenizer",
    "NullMultimodalTokenizer",
    "SFTTokenizer",
];

/// What the arguments say, option by option; underscore spellings of Megatron's options
/// are left to the script (and remembered for a hint).
pub(super) fn read_args(args: &[String]) -> Result<RawArgs, ArgsError> {
    let mut raw = RawArgs::default();
    for word in arg_words(args) {
        let Some(name) = word.written_name(args) else {
            continue; // a value of the user's own options, a positional, or after `--`
        };
        let option = match options::find(name) {
            Some(option) if option.read != Read::Ignored => option,
            _ => {
                let dashed = name.replace('_', "-");
                if dashed != name && options::find(&dashed).is_some_and(|o| o.read != Read::Ignored)
                {
                    raw.underscored.push(format!("--{name}"));
                }
                continue;
            }
        };
        let spelled = format!("--{name}");
        match option.arity {
            Arity::Flag => {
                if let Some(value) = &word.inline_value {
                    return Err(ArgsError::FlagWithValue {
                        option: spelled,
                        value: value.clone(),
                    });
                }
                set_flag(&mut raw, option.read, &spelled)?;
            }
            Arity::Value => match word.value(args) {
                Some(value) => set_value(&mut raw, option.read, &spelled, &value)?,
                None => return Err(ArgsError::MissingValue { option: spelled }),
            },
            Arity::Values => set_values(&mut raw, option.read, &spelled, &word.values(args))?,
        }
    }
    Ok(raw)
}

fn set_flag(raw: &mut RawArgs, read: Read, option: &str) -> Result<(), ArgsError> {
    let field = match read {
        Read::Setting(field) => field,
        Read::Unsupported { what, .. } => {
            raw.unmodelled.push((option.to_string(), what));
            return Ok(());
        }
        Read::Removed(instead) => return Err(removed(option, instead)),
        Read::Ignored => return Ok(()),
    };
    match field {
        Field::MoeSharedExpertOverlap => raw.moe_shared_expert_overlap = true,
        Field::MoeGroupedGemm => raw.moe_grouped_gemm = true,
        Field::MoePadExpertInputToCapacity => raw.moe_pad_to_capacity = true,
        Field::MoeRouterEnableExpertBias => raw.moe_expert_bias = true,
        Field::NoBiasDropoutFusion => raw.no_bias_dropout_fusion = true,
        Field::NoBiasGeluFusion => raw.no_bias_gelu_fusion = true,
        Field::MultiLatentAttention => raw.multi_latent_attention = true,
        Field::QkLayernorm => raw.qk_layernorm = true,
        Field::GroupQueryAttention => raw.group_query_attention = true,
        Field::Swiglu => raw.swiglu = true,
        Field::Untie => raw.untie = true,
        Field::DisableBiasLinear => raw.disable_bias_linear = true,
        Field::AddQkvBias => raw.add_qkv_bias = true,
        Field::UseRotaryPositionEmbeddings => raw.use_rotary_position_embeddings = true,
        Field::NoPositionEmbedding => raw.no_position_embedding = true,
        Field::Bf16 => raw.bf16 = true,
        Field::Fp16 => raw.fp16 = true,
        Field::RecomputeActivations => raw.recompute_activations = true,
        Field::SequenceParallel => raw.sequence_parallel = true,
        Field::UseDistributedOptimizer => raw.use_distributed_optimizer = true,
        Field::DistCkptOptimFullyReshardable => raw.dist_ckpt_optim_fully_reshardable = true,
        Field::NoOverlapP2p => raw.no_overlap_p2p = true,
        Field::OverlapGradReduce => raw.overlap_grad_reduce = true,
        Field::OverlapParamGather => raw.overlap_param_gather = true,
        Field::GradReduceInBf16 => raw.grad_reduce_in_bf16 = true,
        Field::TpCommOverlap => raw.tp_comm_overlap = true,
        Field::Fp8ParamGather => raw.fp8_param_gather = true,
        Field::Fp4ParamGather => raw.fp4_param_gather = true,
        Field::FirstLastLayersBf16 => raw.first_last_layers_bf16 = true,
        _ => {}
    }
    Ok(())
}

fn removed(option: &str, instead: &str) -> ArgsError {
    contradiction(format!(
        "{option} is no longer a Megatron option (use {instead})"
    ))
}

fn set_value(raw: &mut RawArgs, read: Read, option: &str, value: &str) -> Result<(), ArgsError> {
    let invalid = |expected: &str| ArgsError::InvalidValue {
        option: option.to_string(),
        value: value.to_string(),
        expected: expected.to_string(),
    };
    let positive = || {
        parse_count(value)
            .filter(|n| *n > 0)
            .ok_or_else(|| invalid("a positive integer"))
    };
    let choice = |choices: &[&str]| -> Result<String, ArgsError> {
        if choices.contains(&value) {
            Ok(value.to_string())
        } else {
            Err(invalid(&format!("one of {}", choices.join(", "))))
        }
    };
    let field = match read {
        Read::Setting(field) => field,
        Read::Unsupported { what, neutral } => {
            let off = neutral.is_some() && parse_count(value) == neutral;
            if !off {
                raw.unmodelled.push((format!("{option} {value}"), what));
            }
            return Ok(());
        }
        Read::Removed(instead) => return Err(removed(option, instead)),
        Read::Ignored => return Ok(()),
    };
    match field {
        Field::NumLayers => raw.num_layers = Some(positive()?),
        Field::HiddenSize => raw.hidden_size = Some(positive()?),
        Field::FfnHiddenSize => raw.ffn_hidden_size = Some(positive()?),
        Field::NumAttentionHeads => raw.num_attention_heads = Some(positive()?),
        Field::NumQueryGroups => raw.num_query_groups = Some(positive()?),
        Field::KvChannels => raw.kv_channels = Some(positive()?),
        Field::SeqLength => raw.seq_length = Some(positive()?),
        Field::MaxPositionEmbeddings => raw.max_position_embeddings = Some(positive()?),
        Field::VocabSize => raw.vocab_size = Some(positive()?),
        Field::TokenizerType => raw.tokenizer_type = Some(choice(TOKENIZERS)?),
        Field::TokenizerModel => raw.tokenizer_model = Some(value.to_string()),
        Field::MakeVocabSizeDivisibleBy => raw.make_vocab_size_divisible_by = Some(positive()?),
        Field::Normalization => {
            raw.normalization = Some(match choice(&["LayerNorm", "RMSNorm"])?.as_str() {
                "RMSNorm" => Normalization::RMSNorm,
                _ => Normalization::LayerNorm,
            })
        }
        Field::PositionEmbeddingType => {
            let types = [
                "learned_absolute",
                "rope",
                "yarn",
                "mrope",
                "relative",
                "none",
            ];
            raw.position_embedding_type = Some(match choice(&types)?.as_str() {
                "learned_absolute" => PositionEmbedding::LearnedAbsolute,
                // YaRN and multimodal RoPE are rotary variants: no learned parameters.
                "rope" | "yarn" | "mrope" => PositionEmbedding::Rope,
                "none" => PositionEmbedding::None,
                _ => {
                    raw.unmodelled
                        .push((format!("{option} relative"), "relative position buckets"));
                    return Ok(());
                }
            })
        }
        Field::GlobalBatchSize => raw.global_batch_size = Some(positive()?),
        Field::MicroBatchSize => raw.micro_batch_size = Some(positive()?),
        Field::RecomputeGranularity => {
            raw.recompute_granularity = Some(match choice(&["full", "selective"])?.as_str() {
                "full" => Granularity::Full,
                _ => Granularity::Selective,
            })
        }
        Field::RecomputeMethod => {
            raw.recompute_method =
                RecomputeMethod::from_megatron_name(&choice(&["uniform", "block"])?)
        }
        Field::RecomputeNumLayers => raw.recompute_num_layers = Some(positive()?),
        // The choices of megatron-core's TransformerConfig (fp8, fp8_recipe, fp4, fp4_recipe).
        Field::Fp8Format => raw.fp8_format = Some(choice(&["e4m3", "hybrid"])?),
        Field::Fp8Recipe => {
            raw.fp8_recipe = Some(choice(&[
                "tensorwise",
                "delayed",
                "mxfp8",
                "blockwise",
                "custom",
            ])?)
        }
        Field::Fp4Format => raw.fp4_format = Some(choice(&["e2m1"])?),
        Field::Fp4Recipe => raw.fp4_recipe = Some(choice(&["nvfp4", "custom"])?),
        Field::Bf16LayersAtStart => {
            raw.bf16_layers_at_start =
                Some(parse_count(value).ok_or_else(|| invalid("a count of layers, 0 or more"))?)
        }
        Field::Bf16LayersAtEnd => {
            raw.bf16_layers_at_end =
                Some(parse_count(value).ok_or_else(|| invalid("a count of layers, 0 or more"))?)
        }
        Field::Save => raw.save = Some(value.to_string()),
        Field::Load => raw.load = Some(value.to_string()),
        Field::SaveInterval => raw.save_interval = Some(positive()?),
        Field::CkptFormat => raw.ckpt_format = Some(value.to_string()),
        Field::TrainIters => raw.train_iters = Some(positive()?),
        Field::TensorParallel => raw.tensor_parallel = Some(positive()?),
        Field::PipelineParallel => raw.pipeline_parallel = Some(positive()?),
        Field::LayersPerVirtualStage => raw.layers_per_virtual_stage = Some(positive()?),
        Field::VirtualStagesPerRank => raw.virtual_stages_per_rank = Some(positive()?),
        // Megatron reads `--num-experts 0` as no experts (arguments.py 1593-1594).
        Field::NumExperts => {
            raw.num_experts = parse_count(value)
                .ok_or_else(|| invalid("a whole number of experts"))
                .map(|n| (n > 0).then_some(n))?
        }
        Field::MoeRouterTopk => raw.moe_router_topk = Some(positive()?),
        Field::MoeFfnHiddenSize => raw.moe_ffn_hidden_size = Some(positive()?),
        Field::MoeSharedExpertIntermediateSize => {
            raw.moe_shared_expert_intermediate_size = Some(positive()?)
        }
        Field::MoeLayerFreq => {
            raw.moe_layer_freq = Some(LayerFreq::parse(value).ok_or_else(|| {
                invalid("an integer N (every N-th layer is MoE) or a list such as ([0]*3+[1]*58)")
            })?)
        }
        Field::ExpertModelParallel => raw.expert_parallel = Some(positive()?),
        Field::ExpertTensorParallel => raw.expert_tensor_parallel = Some(positive()?),
        Field::ContextParallel => raw.context_parallel = Some(positive()?),
        Field::MoeTokenDispatcherType => {
            raw.moe_dispatcher = Some(match choice(&["allgather", "alltoall", "flex"])?.as_str() {
                "alltoall" => Dispatcher::Alltoall,
                "flex" => Dispatcher::Flex,
                _ => Dispatcher::Allgather,
            })
        }
        Field::MoeExpertCapacityFactor => {
            raw.moe_capacity_factor = match value.trim().parse::<f64>() {
                Ok(f) if f.is_finite() && f > 0.0 => Some(f),
                _ => return Err(invalid("a positive number")),
            }
        }
        Field::MoeRouterScoreFunction => {
            raw.moe_score_function = Some(choice(&["softmax", "sigmoid", "sqrtsoftplus"])?)
        }
        Field::MoeTokenDropPolicy => {
            raw.moe_drop_policy = Some(match choice(&["probs", "position"])?.as_str() {
                "position" => DropPolicy::Position,
                _ => DropPolicy::Probs,
            })
        }
        Field::QLoraRank => raw.q_lora_rank = Some(positive()?),
        Field::KvLoraRank => raw.kv_lora_rank = Some(positive()?),
        Field::QkHeadDim => raw.qk_head_dim = Some(positive()?),
        Field::QkPosEmbHeadDim => raw.qk_pos_emb_head_dim = Some(positive()?),
        Field::VHeadDim => raw.v_head_dim = Some(positive()?),
        Field::MtpNumLayers => {
            raw.mtp_num_layers = Some(parse_count(value).ok_or_else(|| invalid("a whole number"))?)
        }
        Field::DecoderFirstPipelineNumLayers => raw.first_stage_layers = Some(positive()?),
        Field::DecoderLastPipelineNumLayers => raw.last_stage_layers = Some(positive()?),
        _ => {}
    }
    Ok(())
}

/// An option of several values (argparse's `nargs`).
fn set_values(
    raw: &mut RawArgs,
    read: Read,
    option: &str,
    values: &[String],
) -> Result<(), ArgsError> {
    let invalid = |value: &str, expected: String| ArgsError::InvalidValue {
        option: option.to_string(),
        value: value.to_string(),
        expected,
    };
    match read {
        Read::Setting(Field::RecomputeModules) => {
            let modules = values
                .iter()
                .map(|v| {
                    RecomputeModule::from_megatron_name(v).ok_or_else(|| {
                        let names: Vec<_> = RecomputeModule::ALL
                            .iter()
                            .map(|m| m.megatron_name())
                            .collect();
                        invalid(v, format!("one of {}", names.join(", ")))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            raw.recompute_modules = Some(modules);
        }
        Read::Setting(Field::CpCommType) => {
            let names: Vec<_> = CpCommType::ALL.iter().map(|t| t.megatron_name()).collect();
            let types = values
                .iter()
                .map(|v| {
                    CpCommType::from_megatron_name(v)
                        .ok_or_else(|| invalid(v, format!("one of {}", names.join(", "))))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let Some(&first) = types.first() else {
                return Err(ArgsError::MissingValue {
                    option: option.to_string(),
                });
            };
            // Megatron takes one type per layer too; the time model prices one for all.
            if let Some(other) = types.iter().find(|t| **t != first) {
                return Err(invalid(
                    other.megatron_name(),
                    format!(
                        "the same type for every layer ({} first; per-layer types are not modelled: give one type)",
                        first.megatron_name()
                    ),
                ));
            }
            raw.cp_comm_type = Some(first);
        }
        Read::Setting(Field::HierarchicalContextParallelSizes) => {
            let sizes = values
                .iter()
                .map(|v| {
                    parse_count(v)
                        .filter(|n| *n > 0)
                        .ok_or_else(|| invalid(v, "positive integers".to_string()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if sizes.is_empty() {
                return Err(ArgsError::MissingValue {
                    option: option.to_string(),
                });
            }
            raw.hierarchical_context_parallel = Some(sizes);
        }
        Read::Setting(Field::MoeRouterLoadBalancingType) => {
            // Several types apply one loss each; the first names how tokens are balanced.
            let Some(first) = values.first() else {
                return Err(ArgsError::MissingValue {
                    option: option.to_string(),
                });
            };
            let types = [
                "aux_loss",
                "seq_aux_loss",
                "global_aux_loss",
                "sinkhorn",
                "none",
            ];
            raw.moe_sinkhorn_listed = values.iter().any(|v| v == "sinkhorn");
            raw.moe_load_balancing = Some(match first.as_str() {
                "aux_loss" => LoadBalancing::AuxLoss,
                "seq_aux_loss" => LoadBalancing::SeqAuxLoss,
                "global_aux_loss" => LoadBalancing::GlobalAuxLoss,
                "sinkhorn" => LoadBalancing::Sinkhorn,
                "none" => LoadBalancing::None,
                _ => return Err(invalid(first, format!("one of {}", types.join(", ")))),
            });
        }
        _ => {}
    }
    Ok(())
}

/// The preset's values under the user's: options the user gave win, flags add up, and any
/// precision flag of the user's replaces the preset's precision.
pub(super) fn merge(preset: RawArgs, user: RawArgs) -> RawArgs {
    let (bf16, fp16) = if user.bf16 || user.fp16 {
        (user.bf16, user.fp16)
    } else {
        (preset.bf16, preset.fp16)
    };
    RawArgs {
        num_layers: user.num_layers.or(preset.num_layers),
        hidden_size: user.hidden_size.or(preset.hidden_size),
        ffn_hidden_size: user.ffn_hidden_size.or(preset.ffn_hidden_size),
        num_attention_heads: user.num_attention_heads.or(preset.num_attention_heads),
        group_query_attention: user.group_query_attention || preset.group_query_attention,
        num_query_groups: user.num_query_groups.or(preset.num_query_groups),
        kv_channels: user.kv_channels.or(preset.kv_channels),
        seq_length: user.seq_length.or(preset.seq_length),
        max_position_embeddings: user
            .max_position_embeddings
            .or(preset.max_position_embeddings),
        // The vocabulary is resolved from each side separately (see `vocabulary`).
        vocab_size: user.vocab_size,
        tokenizer_type: user.tokenizer_type,
        tokenizer_model: user.tokenizer_model,
        make_vocab_size_divisible_by: user
            .make_vocab_size_divisible_by
            .or(preset.make_vocab_size_divisible_by),
        swiglu: user.swiglu || preset.swiglu,
        untie: user.untie || preset.untie,
        normalization: user.normalization.or(preset.normalization),
        disable_bias_linear: user.disable_bias_linear || preset.disable_bias_linear,
        add_qkv_bias: user.add_qkv_bias || preset.add_qkv_bias,
        position_embedding_type: user
            .position_embedding_type
            .or(preset.position_embedding_type),
        use_rotary_position_embeddings: user.use_rotary_position_embeddings
            || preset.use_rotary_position_embeddings,
        no_position_embedding: user.no_position_embedding || preset.no_position_embedding,
        global_batch_size: user.global_batch_size.or(preset.global_batch_size),
        micro_batch_size: user.micro_batch_size.or(preset.micro_batch_size),
        bf16,
        fp16,
        recompute_activations: user.recompute_activations || preset.recompute_activations,
        recompute_granularity: user.recompute_granularity.or(preset.recompute_granularity),
        recompute_method: user.recompute_method.or(preset.recompute_method),
        recompute_num_layers: user.recompute_num_layers.or(preset.recompute_num_layers),
        sequence_parallel: user.sequence_parallel || preset.sequence_parallel,
        use_distributed_optimizer: user.use_distributed_optimizer
            || preset.use_distributed_optimizer,
        save: user.save.or(preset.save),
        load: user.load.or(preset.load),
        save_interval: user.save_interval.or(preset.save_interval),
        ckpt_format: user.ckpt_format.or(preset.ckpt_format),
        dist_ckpt_optim_fully_reshardable: user.dist_ckpt_optim_fully_reshardable
            || preset.dist_ckpt_optim_fully_reshardable,
        train_iters: user.train_iters.or(preset.train_iters),
        tensor_parallel: user.tensor_parallel.or(preset.tensor_parallel),
        pipeline_parallel: user.pipeline_parallel.or(preset.pipeline_parallel),
        layers_per_virtual_stage: user
            .layers_per_virtual_stage
            .or(preset.layers_per_virtual_stage),
        virtual_stages_per_rank: user
            .virtual_stages_per_rank
            .or(preset.virtual_stages_per_rank),
        no_overlap_p2p: user.no_overlap_p2p || preset.no_overlap_p2p,
        overlap_grad_reduce: user.overlap_grad_reduce || preset.overlap_grad_reduce,
        overlap_param_gather: user.overlap_param_gather || preset.overlap_param_gather,
        grad_reduce_in_bf16: user.grad_reduce_in_bf16 || preset.grad_reduce_in_bf16,
        tp_comm_overlap: user.tp_comm_overlap || preset.tp_comm_overlap,
        num_experts: user.num_experts.or(preset.num_experts),
        moe_router_topk: user.moe_router_topk.or(preset.moe_router_topk),
        moe_ffn_hidden_size: user.moe_ffn_hidden_size.or(preset.moe_ffn_hidden_size),
        moe_shared_expert_intermediate_size: user
            .moe_shared_expert_intermediate_size
            .or(preset.moe_shared_expert_intermediate_size),
        moe_shared_expert_overlap: user.moe_shared_expert_overlap
            || preset.moe_shared_expert_overlap,
        moe_layer_freq: user.moe_layer_freq.or(preset.moe_layer_freq),
        expert_parallel: user.expert_parallel.or(preset.expert_parallel),
        expert_tensor_parallel: user
            .expert_tensor_parallel
            .or(preset.expert_tensor_parallel),
        moe_grouped_gemm: user.moe_grouped_gemm || preset.moe_grouped_gemm,
        moe_dispatcher: user.moe_dispatcher.or(preset.moe_dispatcher),
        moe_load_balancing: user.moe_load_balancing.or(preset.moe_load_balancing),
        moe_capacity_factor: user.moe_capacity_factor.or(preset.moe_capacity_factor),
        moe_pad_to_capacity: user.moe_pad_to_capacity || preset.moe_pad_to_capacity,
        moe_drop_policy: user.moe_drop_policy.or(preset.moe_drop_policy),
        moe_expert_bias: user.moe_expert_bias || preset.moe_expert_bias,
        moe_score_function: user.moe_score_function.or(preset.moe_score_function),
        // The user's list replaces the preset's whole.
        moe_sinkhorn_listed: if user.moe_load_balancing.is_some() {
            user.moe_sinkhorn_listed
        } else {
            preset.moe_sinkhorn_listed
        },
        no_bias_dropout_fusion: user.no_bias_dropout_fusion || preset.no_bias_dropout_fusion,
        no_bias_gelu_fusion: user.no_bias_gelu_fusion || preset.no_bias_gelu_fusion,
        multi_latent_attention: user.multi_latent_attention || preset.multi_latent_attention,
        q_lora_rank: user.q_lora_rank.or(preset.q_lora_rank),
        kv_lora_rank: user.kv_lora_rank.or(preset.kv_lora_rank),
        qk_head_dim: user.qk_head_dim.or(preset.qk_head_dim),
        qk_pos_emb_head_dim: user.qk_pos_emb_head_dim.or(preset.qk_pos_emb_head_dim),
        v_head_dim: user.v_head_dim.or(preset.v_head_dim),
        mtp_num_layers: user.mtp_num_layers.or(preset.mtp_num_layers),
        qk_layernorm: user.qk_layernorm || preset.qk_layernorm,
        recompute_modules: user.recompute_modules.or(preset.recompute_modules),
        first_stage_layers: user.first_stage_layers.or(preset.first_stage_layers),
        last_stage_layers: user.last_stage_layers.or(preset.last_stage_layers),
        unmodelled: [preset.unmodelled, user.unmodelled].concat(),
        context_parallel: user.context_parallel.or(preset.context_parallel),
        cp_comm_type: user.cp_comm_type.or(preset.cp_comm_type),
        hierarchical_context_parallel: user
            .hierarchical_context_parallel
            .or(preset.hierarchical_context_parallel),
        fp8_format: user.fp8_format.or(preset.fp8_format),
        fp8_recipe: user.fp8_recipe.or(preset.fp8_recipe),
        fp8_param_gather: user.fp8_param_gather || preset.fp8_param_gather,
        fp4_format: user.fp4_format.or(preset.fp4_format),
        fp4_recipe: user.fp4_recipe.or(preset.fp4_recipe),
        fp4_param_gather: user.fp4_param_gather || preset.fp4_param_gather,
        first_last_layers_bf16: user.first_last_layers_bf16 || preset.first_last_layers_bf16,
        bf16_layers_at_start: user.bf16_layers_at_start.or(preset.bf16_layers_at_start),
        bf16_layers_at_end: user.bf16_layers_at_end.or(preset.bf16_layers_at_end),
        underscored: user.underscored,
    }
}

/// What the arguments say about the vocabulary.
pub(super) enum Vocabulary {
    Known(u64),
    /// A tokenizer whose size only its files know.
    Unknown(String),
    NotGiven,
}

/// Sizes of well-known HuggingFace tokenizers (`len(tokenizer)`), by `--tokenizer-model`.
fn known_huggingface_vocabulary(model: &str) -> Option<u64> {
    let name = model.trim_end_matches('/').to_ascii_lowercase();
    let name = name.rsplit('/').next().unwrap_or(&name).to_string();
    if name == "gpt2" {
        Some(50257)
    } else if name.starts_with("llama-2-") {
        Some(32000)
    } else if name.starts_with("meta-llama-3") || name.starts_with("llama-3") {
        Some(128256)
    } else {
        None
    }
}

pub(super) fn vocabulary(raw: &RawArgs) -> Result<Vocabulary, ArgsError> {
    Ok(match raw.tokenizer_type.as_deref() {
        // The GPT-2 BPE files have 50257 tokens; Megatron ignores --vocab-size here.
        Some("GPT2BPETokenizer") => Vocabulary::Known(50257),
        Some(null @ ("NullTokenizer" | "NullMultimodalTokenizer")) => match raw.vocab_size {
            Some(v) => Vocabulary::Known(v),
            None => {
                return Err(ArgsError::Missing {
                    option: "--vocab-size",
                    hint: format!("--tokenizer-type {null} has exactly --vocab-size tokens"),
                })
            }
        },
        Some(tokenizer) => match raw.vocab_size {
            Some(v) => Vocabulary::Known(v),
            None => match (tokenizer, raw.tokenizer_model.as_deref()) {
                ("HuggingFaceTokenizer", Some(model)) => {
                    match known_huggingface_vocabulary(model) {
                        Some(v) => Vocabulary::Known(v),
                        None => Vocabulary::Unknown(format!("{tokenizer} ({model})")),
                    }
                }
                _ => Vocabulary::Unknown(tokenizer.to_string()),
            },
        },
        None => match raw.vocab_size {
            Some(v) => Vocabulary::Known(v),
            None => Vocabulary::NotGiven,
        },
    })
}
