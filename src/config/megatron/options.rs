//! The one table of Megatron's options that pipette knows: for each, its name, whether it
//! takes a value, what reading the user's arguments makes of it ([`Read`]) and what
//! rewriting them for a plan does with it ([`Rewrite`]). Reading ([`super::read`]) and
//! rewriting (`render::megatron`) both look options up here and nowhere else.
//!
//! Spellings: Megatron spells its options with dashes only. Reading takes the dashed
//! spelling alone ([`find`]): `--num_layers` belongs to the user's script, and only earns
//! a hint when `--num-layers` is missing. Rewriting takes either spelling
//! ([`find_any_spelling`]), so that no stale `--micro_batch_size` outlives the plan, and
//! so that DeepSpeed's `--deepspeed_config` is recognised. Aliases (an older name, a
//! DeepSpeed predecessor) are rows of their own with the same meaning.
//!
//! An option missing from the table is the script's own: read by neither side, kept by
//! rewriting byte for byte, and (argparse-like) never given a value word of its own.

/// How argparse reads an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    /// `--opt`, no value.
    Flag,
    /// `--opt VALUE` or `--opt=VALUE`.
    Value,
    /// `--opt V1 V2 ...` (argparse's `nargs='+'` / `'*'`): every word up to the next option.
    Values,
}

/// What reading the user's arguments makes of an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// A model, training or parallel setting, read into the field named.
    Setting(Field),
    /// Changes the model or the parallel layout beyond what the parameter, memory and time
    /// models know: the planner cannot plan such a run (pipette-run launches it with
    /// planning off), unless it has the value that leaves it off (`neutral`).
    Unsupported {
        what: &'static str,
        neutral: Option<u64>,
    },
    /// No longer accepted by Megatron itself (arguments.py 573–587); what to use instead.
    Removed(&'static str),
    /// Not read: only rewriting acts on it.
    Ignored,
}

/// The settings reading fills in, one per option (aliases share one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    NumLayers,
    HiddenSize,
    FfnHiddenSize,
    NumAttentionHeads,
    GroupQueryAttention,
    NumQueryGroups,
    KvChannels,
    SeqLength,
    MaxPositionEmbeddings,
    VocabSize,
    TokenizerType,
    TokenizerModel,
    MakeVocabSizeDivisibleBy,
    Swiglu,
    Untie,
    Normalization,
    DisableBiasLinear,
    AddQkvBias,
    PositionEmbeddingType,
    UseRotaryPositionEmbeddings,
    NoPositionEmbedding,
    GlobalBatchSize,
    MicroBatchSize,
    Bf16,
    Fp16,
    RecomputeActivations,
    RecomputeGranularity,
    RecomputeMethod,
    RecomputeNumLayers,
    SequenceParallel,
    UseDistributedOptimizer,
    Save,
    Load,
    SaveInterval,
    CkptFormat,
    DistCkptOptimFullyReshardable,
    TrainIters,
    TensorParallel,
    PipelineParallel,
    LayersPerVirtualStage,
    VirtualStagesPerRank,
    NoOverlapP2p,
    OverlapGradReduce,
    OverlapParamGather,
    GradReduceInBf16,
    TpCommOverlap,
    NumExperts,
    MoeRouterTopk,
    MoeFfnHiddenSize,
    MoeSharedExpertIntermediateSize,
    MoeSharedExpertOverlap,
    MoeLayerFreq,
    ExpertModelParallel,
    ExpertTensorParallel,
    MoeGroupedGemm,
    MoeTokenDispatcherType,
    MoeRouterLoadBalancingType,
    MoeExpertCapacityFactor,
    MoePadExpertInputToCapacity,
    MoeTokenDropPolicy,
    MoeRouterEnableExpertBias,
    MoeRouterScoreFunction,
    NoBiasDropoutFusion,
    NoBiasGeluFusion,
    MultiLatentAttention,
    QLoraRank,
    KvLoraRank,
    QkHeadDim,
    QkPosEmbHeadDim,
    VHeadDim,
    MtpNumLayers,
    QkLayernorm,
    RecomputeModules,
    DecoderFirstPipelineNumLayers,
    DecoderLastPipelineNumLayers,
    Fp8Format,
    Fp8Recipe,
    Fp8ParamGather,
    Fp4Format,
    Fp4Recipe,
    Fp4ParamGather,
    FirstLastLayersBf16,
    Bf16LayersAtStart,
    Bf16LayersAtEnd,
    ContextParallel,
    CpCommType,
    HierarchicalContextParallelSizes,
}

/// What rewriting the arguments for a plan does with an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewrite {
    /// Kept where and as the user wrote it.
    Kept,
    /// The plan decides it: removed wherever it appears, in every spelling; the plan's
    /// own value (if any) is written after the user's arguments.
    Planned,
    /// Kept while the plan gives Megatron what it needs for it; dropped with a note when
    /// Megatron would refuse it under the plan.
    Needs(Requirement),
    /// DeepSpeed's switch: the script is DeepSpeed-based.
    DeepSpeed,
    /// DeepSpeed's config file: pointed at the rendered `ds_config.json`.
    DeepSpeedConfig,
    /// Kept; its value is the ZeRO stage of the rendered `ds_config.json`.
    ZeroStage,
}

/// What a plan must have for Megatron to accept a flag of the user's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// The distributed optimizer (or DeepSpeed's ZeRO in its place).
    DistributedOptimizer,
    /// Virtual pipeline stages and the distributed optimizer.
    VirtualStagesAndDistributedOptimizer,
    /// Sequence parallelism at tensor-parallel size > 1.
    SequenceParallelism,
    /// Full recomputation at tensor-parallel size > 1 without sequence parallelism.
    FullRecomputeWithoutSequenceParallelism,
    /// No virtual stages on two pipeline stages or fewer.
    NoVirtualStagesOnTwoStages,
}

/// One Megatron option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MegatronOption {
    /// Megatron's spelling, without the leading `--`.
    pub name: &'static str,
    pub arity: Arity,
    pub read: Read,
    pub rewrite: Rewrite,
}

const fn value(name: &'static str, read: Read) -> MegatronOption {
    option(name, Arity::Value, read)
}

const fn options(name: &'static str, read: Read) -> MegatronOption {
    option(name, Arity::Values, read)
}

const fn flag(name: &'static str, read: Read) -> MegatronOption {
    option(name, Arity::Flag, read)
}

/// An option rewriting keeps; see [`MegatronOption::rewritten`] for the others.
const fn option(name: &'static str, arity: Arity, read: Read) -> MegatronOption {
    MegatronOption {
        name,
        arity,
        read,
        rewrite: Rewrite::Kept,
    }
}

const fn unsupported(what: &'static str, neutral: Option<u64>) -> Read {
    Read::Unsupported { what, neutral }
}

impl MegatronOption {
    const fn rewritten(self, rewrite: Rewrite) -> Self {
        MegatronOption { rewrite, ..self }
    }

    const fn planned(self) -> Self {
        self.rewritten(Rewrite::Planned)
    }
}

/// Every Megatron option pipette reads or rewrites (megatron-core 0.19.2).
pub const OPTIONS: &[MegatronOption] = {
    use Field::*;
    use Read::{Ignored, Removed, Setting};
    use Requirement::*;
    &[
        // The model.
        value("num-layers", Setting(NumLayers)),
        value("hidden-size", Setting(HiddenSize)),
        value("ffn-hidden-size", Setting(FfnHiddenSize)),
        value("num-attention-heads", Setting(NumAttentionHeads)),
        flag("group-query-attention", Setting(GroupQueryAttention)),
        value("num-query-groups", Setting(NumQueryGroups)),
        value("kv-channels", Setting(KvChannels)),
        value("seq-length", Setting(SeqLength)),
        value("max-position-embeddings", Setting(MaxPositionEmbeddings)),
        value("vocab-size", Setting(VocabSize)),
        value("tokenizer-type", Setting(TokenizerType)),
        value("tokenizer-model", Setting(TokenizerModel)),
        value(
            "make-vocab-size-divisible-by",
            Setting(MakeVocabSizeDivisibleBy),
        ),
        flag("swiglu", Setting(Swiglu)),
        flag("untie-embeddings-and-output-weights", Setting(Untie)),
        value("normalization", Setting(Normalization)),
        flag("disable-bias-linear", Setting(DisableBiasLinear)),
        flag("add-qkv-bias", Setting(AddQkvBias)),
        value("position-embedding-type", Setting(PositionEmbeddingType)),
        flag(
            "use-rotary-position-embeddings",
            Setting(UseRotaryPositionEmbeddings),
        ),
        flag("no-position-embedding", Setting(NoPositionEmbedding)),
        // Training.
        value("global-batch-size", Setting(GlobalBatchSize)),
        value("micro-batch-size", Setting(MicroBatchSize)).planned(),
        flag("bf16", Setting(Bf16)),
        flag("fp16", Setting(Fp16)),
        flag("recompute-activations", Setting(RecomputeActivations)).planned(),
        value("recompute-granularity", Setting(RecomputeGranularity)).planned(),
        value("recompute-method", Setting(RecomputeMethod)).planned(),
        value("recompute-num-layers", Setting(RecomputeNumLayers)).planned(),
        flag("sequence-parallel", Setting(SequenceParallel)).planned(),
        flag(
            "use-distributed-optimizer",
            Setting(UseDistributedOptimizer),
        )
        .planned(),
        value("save", Setting(Save)),
        value("load", Setting(Load)),
        value("save-interval", Setting(SaveInterval)),
        value("persistent-save-interval", Setting(SaveInterval)),
        value("ckpt-format", Setting(CkptFormat)),
        flag(
            "dist-ckpt-optim-fully-reshardable",
            Setting(DistCkptOptimFullyReshardable),
        ),
        value("train-iters", Setting(TrainIters)),
        // The parallel layout.
        value("tensor-model-parallel-size", Setting(TensorParallel)).planned(),
        value("pipeline-model-parallel-size", Setting(PipelineParallel)).planned(),
        value(
            "num-layers-per-virtual-pipeline-stage",
            Setting(LayersPerVirtualStage),
        )
        .planned(),
        value(
            "num-virtual-stages-per-pipeline-rank",
            Setting(VirtualStagesPerRank),
        )
        .planned(),
        // Older Megatron and NeMo spell virtual stages this way; never let a stale one
        // through.
        value("virtual-pipeline-model-parallel-size", Ignored).planned(),
        // Overlap and communication.
        flag("no-overlap-p2p-communication", Setting(NoOverlapP2p))
            .rewritten(Rewrite::Needs(NoVirtualStagesOnTwoStages)),
        flag("overlap-grad-reduce", Setting(OverlapGradReduce)),
        flag("overlap-param-gather", Setting(OverlapParamGather))
            .rewritten(Rewrite::Needs(DistributedOptimizer)),
        flag("overlap-param-gather-with-optimizer-step", Ignored)
            .rewritten(Rewrite::Needs(VirtualStagesAndDistributedOptimizer)),
        flag("grad-reduce-in-bf16", Setting(GradReduceInBf16)),
        value("fp8-format", Setting(Fp8Format)),
        value("fp8-recipe", Setting(Fp8Recipe)),
        flag("fp8-param-gather", Setting(Fp8ParamGather)),
        value("fp4-format", Setting(Fp4Format)),
        value("fp4-recipe", Setting(Fp4Recipe)),
        flag("fp4-param-gather", Setting(Fp4ParamGather)),
        // megatron-core's TransformerConfig.first_last_layers_bf16 and its two counts:
        // the model's first and last layers keep BF16 GEMMs under FP8 or FP4.
        flag("first-last-layers-bf16", Setting(FirstLastLayersBf16)),
        value("num-layers-at-start-in-bf16", Setting(Bf16LayersAtStart)),
        value("num-layers-at-end-in-bf16", Setting(Bf16LayersAtEnd)),
        flag("tp-comm-overlap", Setting(TpCommOverlap))
            .rewritten(Rewrite::Needs(SequenceParallelism)),
        flag("distribute-saved-activations", Ignored)
            .rewritten(Rewrite::Needs(FullRecomputeWithoutSequenceParallelism)),
        // DeepSpeed (Megatron-DeepSpeed), and its `deepscale` predecessors.
        flag("deepspeed", Ignored).rewritten(Rewrite::DeepSpeed),
        flag("deepscale", Ignored).rewritten(Rewrite::DeepSpeed),
        value("deepspeed-config", Ignored).rewritten(Rewrite::DeepSpeedConfig),
        value("deepscale-config", Ignored).rewritten(Rewrite::DeepSpeedConfig),
        value("zero-stage", Ignored).rewritten(Rewrite::ZeroStage),
        // Mixture of experts (TransformerConfig's `moe_*` fields, arguments.py _add_moe_args).
        value("num-experts", Setting(NumExperts)),
        value("moe-router-topk", Setting(MoeRouterTopk)),
        value("moe-ffn-hidden-size", Setting(MoeFfnHiddenSize)),
        value(
            "moe-shared-expert-intermediate-size",
            Setting(MoeSharedExpertIntermediateSize),
        ),
        flag("moe-shared-expert-overlap", Setting(MoeSharedExpertOverlap)),
        value("moe-layer-freq", Setting(MoeLayerFreq)),
        value("expert-model-parallel-size", Setting(ExpertModelParallel)).planned(),
        value("expert-tensor-parallel-size", Setting(ExpertTensorParallel)).planned(),
        flag("moe-grouped-gemm", Setting(MoeGroupedGemm)),
        value("moe-token-dispatcher-type", Setting(MoeTokenDispatcherType)),
        options(
            "moe-router-load-balancing-type",
            Setting(MoeRouterLoadBalancingType),
        ),
        value(
            "moe-expert-capacity-factor",
            Setting(MoeExpertCapacityFactor),
        ),
        flag(
            "moe-pad-expert-input-to-capacity",
            Setting(MoePadExpertInputToCapacity),
        ),
        value("moe-token-drop-policy", Setting(MoeTokenDropPolicy)),
        flag(
            "moe-router-enable-expert-bias",
            Setting(MoeRouterEnableExpertBias),
        ),
        value("moe-router-score-function", Setting(MoeRouterScoreFunction)),
        // Read for the MoE layers' bias rules (TEGroupedMLP refuses biases with the
        // bias-dropout fusion, and fuses bias and activation for SwiGLU only).
        flag("no-bias-dropout-fusion", Setting(NoBiasDropoutFusion)),
        flag("no-bias-gelu-fusion", Setting(NoBiasGeluFusion)),
        // Multi-latent attention and multi-token prediction (DeepSeek-V3).
        flag("multi-latent-attention", Setting(MultiLatentAttention)),
        value("q-lora-rank", Setting(QLoraRank)),
        value("kv-lora-rank", Setting(KvLoraRank)),
        value("qk-head-dim", Setting(QkHeadDim)),
        value("qk-pos-emb-head-dim", Setting(QkPosEmbHeadDim)),
        value("v-head-dim", Setting(VHeadDim)),
        value("mtp-num-layers", Setting(MtpNumLayers)),
        flag("qk-layernorm", Setting(QkLayernorm)),
        // Context parallelism: the plan decides the size; how the ranks exchange keys and
        // values stays the user's choice (arguments.py _add_distributed_args).
        value("context-parallel-size", Setting(ContextParallel)).planned(),
        options("cp-comm-type", Setting(CpCommType)),
        options(
            "hierarchical-context-parallel-sizes",
            Setting(HierarchicalContextParallelSizes),
        ),
        // Kept: Megatron reads it only under selective recomputation, whichever the plan picks.
        options("recompute-modules", Setting(RecomputeModules)),
        // Options that change the model or the parallel layout beyond what the parameter,
        // memory and time models know.
        flag("quick-geglu", unsupported("gated GeLU", None)),
        value("hybrid-layer-pattern", unsupported("hybrid models", None)),
        value(
            "experimental-attention-variant",
            unsupported("experimental attention", None),
        ),
        value(
            "heterogeneous-layers-config-path",
            unsupported("heterogeneous layers", None),
        ),
        value("yaml-cfg", unsupported("arguments from a YAML file", None)),
        value(
            "padded-vocab-size",
            unsupported("a vocabulary padded by hand", None),
        ),
        flag(
            "no-pad-vocab-size",
            unsupported("an unpadded vocabulary", None),
        ),
        flag(
            "disable-pad-vocab-size",
            unsupported("an unpadded vocabulary", None),
        ),
        value("moe-latent-size", unsupported("latent MoE", None)),
        flag("moe-use-upcycling", unsupported("upcycled experts", None)),
        // The plan writes its own stage split; the user's is a hint.
        value(
            "decoder-first-pipeline-num-layers",
            Setting(DecoderFirstPipelineNumLayers),
        )
        .planned(),
        value(
            "decoder-last-pipeline-num-layers",
            Setting(DecoderLastPipelineNumLayers),
        )
        .planned(),
        value(
            "pipeline-model-parallel-layout",
            unsupported("a custom pipeline layout", None),
        )
        .planned(),
        flag(
            "account-for-embedding-in-pipeline-split",
            unsupported("uneven pipeline stages", None),
        )
        .planned(),
        flag(
            "account-for-loss-in-pipeline-split",
            unsupported("uneven pipeline stages", None),
        )
        .planned(),
        // Options Megatron itself refuses (arguments.py 573–587).
        value("batch-size", Removed("--micro-batch-size")),
        value(
            "model-parallel-size",
            Removed("--tensor-model-parallel-size"),
        ),
        flag("checkpoint-activations", Removed("--recompute-activations")),
    ]
};

/// The option spelled `name` (without `--`) exactly as Megatron spells it.
pub fn find(name: &str) -> Option<&'static MegatronOption> {
    OPTIONS.iter().find(|o| o.name == name)
}

/// The option `name` (without `--`) stands for, with dashes or underscores.
pub fn find_any_spelling(name: &str) -> Option<&'static MegatronOption> {
    find(&name.replace('_', "-"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn names_are_unique_dashed_and_bare() {
        let mut seen = BTreeSet::new();
        for o in OPTIONS {
            assert!(seen.insert(o.name), "--{} twice", o.name);
            assert!(
                !o.name.starts_with('-') && !o.name.contains('_') && !o.name.contains('='),
                "{}",
                o.name
            );
        }
    }

    #[test]
    fn both_spellings_find_an_option_only_the_dashed_one_reads() {
        assert_eq!(find("num-layers").map(|o| o.arity), Some(Arity::Value));
        assert!(find("num_layers").is_none());
        assert_eq!(
            find_any_spelling("micro_batch_size").map(|o| o.rewrite),
            Some(Rewrite::Planned)
        );
        assert_eq!(
            find_any_spelling("deepspeed_config").map(|o| o.rewrite),
            Some(Rewrite::DeepSpeedConfig)
        );
        assert!(find_any_spelling("lr").is_none());
    }
}
