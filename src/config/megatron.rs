//! Megatron's argument vocabulary: reads the arguments after SCRIPT into [`Settings`].
//!
//! The arguments are read the way Megatron's argparse parser reads them
//! (megatron-core 0.19.2, `megatron/training/arguments.py`): `--opt value` and
//! `--opt=value`, flags without values, the last occurrence wins, no abbreviations, `--`
//! ends the options. Megatron spells its options with dashes only; anything this module
//! does not know (including `--num_layers`) belongs to the user's script and is left alone.
//!
//! Megatron's defaults and derivations, as `validate_args` applies them:
//! - `--ffn-hidden-size`: 4·h, or with `--swiglu` `int((4·h·2/3)/64)·64` (arguments.py 1280–1289);
//! - `--kv-channels`: h / heads, which must divide (1291–1293);
//! - query groups: `--num-query-groups` (default 1) only with `--group-query-attention`, else
//!   one group per head (argument_utils.py 330–333, TransformerConfig);
//! - `--max-position-embeddings` must be at least `--seq-length` for every position
//!   embedding type (1313–1316);
//! - `--recompute-activations` means selective recomputation (589–590); selective takes no
//!   method (1385–1387) and no layer count, full needs both (TransformerConfig 1724–1754);
//! - `--use-rotary-position-embeddings` means rope (1571–1572);
//! - `--disable-bias-linear` turns linear biases off, and linear biases imply a QKV bias
//!   (1553–1555);
//! - `--fp16` and `--bf16` exclude each other (1172–1182); fp32 otherwise;
//! - virtual stages from `--num-layers-per-virtual-pipeline-stage` or
//!   `--num-virtual-stages-per-pipeline-rank`, one of them at most, and 1 means none
//!   (893–946); layers divisible by the pipeline size (947–965);
//! - `--save` needs `--save-interval` (1321–1323);
//! - the vocabulary: `--tokenizer-type GPT2BPETokenizer` has 50257 tokens whatever
//!   `--vocab-size` says; NullTokenizer has exactly `--vocab-size` tokens (0.19.2 no longer
//!   adds an end-of-document token: core/tokenizers/text/libraries/null_tokenizer.py).
//!
//! Where Megatron has no default but pipette can still plan, we choose one and say so:
//! - `--max-position-embeddings` (required by Megatron) defaults to `--seq-length`;
//! - `--micro-batch-size` (required by Megatron) defaults to 1: the planner chooses it;
//! - `--global-batch-size` defaults in Megatron to micro-batch × data-parallel size, and the
//!   data-parallel size is what we plan; so without it the global batch is micro-batch × the
//!   pinned `dp`, and without a pinned `dp` an error asks for one of the two;
//! - tokenizers whose size lives in a file (SentencePiece, Llama 2, HuggingFace, ...) take
//!   `--vocab-size` as the user's statement of that size, or the preset's, or a few
//!   well-known HuggingFace names;
//! - `--sequence-parallel` is kept as the user wrote it, although Megatron turns it off at
//!   tensor-parallel size 1: it says what to do once the planner picks tp > 1.
//!
//! Where we are stricter than Megatron, because the arguments cannot mean what they say:
//! query groups that do not divide the heads (Megatron builds such a model and fails in
//! its first forward pass), and `--recompute-method` / `--recompute-num-layers` without
//! `--recompute-granularity full` (Megatron ignores them silently).
//!
//! Options that change the model in ways the cost models do not cover yet (mixture of
//! experts, multi-latent attention, QK norms, uneven pipelines, context parallelism, ...)
//! are refused with an error rather than planned wrongly.

use std::fmt;

use super::{
    presets, Constraints, ModelSpec, Normalization, PositionEmbedding, Precision, Recompute,
    RecomputeMethod, Settings, TrainingSettings,
};

/// Why the Megatron arguments (or a preset, or `--pin`) do not describe a run we can plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    /// A value the model needs is in neither the arguments nor the preset.
    #[error("missing {option} in the Megatron arguments ({hint})")]
    Missing { option: &'static str, hint: String },
    #[error("{option} expects a value (write `{option} VALUE` or `{option}=VALUE`)")]
    MissingValue { option: String },
    #[error("{option} expects {expected}, got {value:?}")]
    InvalidValue {
        option: String,
        value: String,
        expected: String,
    },
    #[error("{option} takes no value, got `{option}={value}` (drop `={value}`)")]
    FlagWithValue { option: String, value: String },
    /// Arguments that contradict each other or Megatron's rules; the message names the
    /// options and values and says what to do.
    #[error("{0}")]
    Contradiction(String),
    #[error(
        "{option} is not supported by pipette-run yet ({what}); drop it, or launch with torchrun"
    )]
    Unsupported { option: String, what: &'static str },
    #[error("unknown model preset {name:?} (known presets: {known})")]
    UnknownPreset { name: String, known: String },
    #[error("cannot tell the vocabulary size of --tokenizer-type {tokenizer} from the arguments (add --vocab-size N with the tokenizer's size, e.g. 32000 for Llama 2, or use --model PRESET)")]
    UnknownVocabulary { tokenizer: String },
    #[error("bad --pin {pin:?}: {reason}")]
    BadPin { pin: String, reason: String },
    #[error("--pin {key} takes its value from {option}, which the Megatron arguments do not give (write --pin {key}=VALUE, or add {option})")]
    PinWithoutValue {
        key: &'static str,
        option: &'static str,
    },
}

fn contradiction(message: String) -> ArgsError {
    ArgsError::Contradiction(message)
}

// ---------------------------------------------------------------------------------------
// Pins

/// A parallel setting the user fixed with `--pin`; the planner searches only the rest.
///
/// `--pin LIST` is comma separated; each item is `tp`, `pp`, `dp`, `mbs`, `vpp`, `sp`,
/// `recompute`, `dist-opt` or `all`, optionally `=VALUE`. Without a value the value is the
/// one in the Megatron arguments. `dp` always needs a value (the arguments do not say it).
/// `all` pins everything the arguments say (tp, pp, mbs, vpp, sp, recompute, dist-opt),
/// with Megatron's defaults for what they leave out; items after it override it.
///
/// Values: sizes are positive integers (`vpp=1` pins "no interleaving"); `sp` and
/// `dist-opt` take true/false (also yes/no, on/off, 1/0); `recompute` takes `none`,
/// `selective`, `full` (method and layer count from the arguments, else uniform over 1
/// layer), `full:uniform:N` or `full:block:N`. A bare `full` is kept as
/// `Recompute::Full` with `num_layers: 0` until the arguments fill it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    TensorParallel(Option<u64>),
    PipelineParallel(Option<u64>),
    DataParallel(u64),
    MicroBatch(Option<u64>),
    VirtualPipeline(Option<u64>),
    SequenceParallel(Option<bool>),
    Recompute(Option<Recompute>),
    DistributedOptimizer(Option<bool>),
    All,
}

impl Pin {
    /// The key as written in `--pin`.
    pub fn key(&self) -> &'static str {
        match self {
            Pin::TensorParallel(_) => "tp",
            Pin::PipelineParallel(_) => "pp",
            Pin::DataParallel(_) => "dp",
            Pin::MicroBatch(_) => "mbs",
            Pin::VirtualPipeline(_) => "vpp",
            Pin::SequenceParallel(_) => "sp",
            Pin::Recompute(_) => "recompute",
            Pin::DistributedOptimizer(_) => "dist-opt",
            Pin::All => "all",
        }
    }
}

impl fmt::Display for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())?;
        match self {
            Pin::TensorParallel(Some(n))
            | Pin::PipelineParallel(Some(n))
            | Pin::DataParallel(n)
            | Pin::MicroBatch(Some(n))
            | Pin::VirtualPipeline(Some(n)) => write!(f, "={n}"),
            Pin::SequenceParallel(Some(b)) | Pin::DistributedOptimizer(Some(b)) => {
                write!(f, "={b}")
            }
            Pin::Recompute(Some(r)) => match r {
                Recompute::None => f.write_str("=none"),
                Recompute::Selective => f.write_str("=selective"),
                // `full` with method and layers left to the arguments (see parse_pins).
                Recompute::Full { num_layers: 0, .. } => f.write_str("=full"),
                Recompute::Full { method, num_layers } => {
                    let method = match method {
                        RecomputeMethod::Uniform => "uniform",
                        RecomputeMethod::Block => "block",
                    };
                    write!(f, "=full:{method}:{num_layers}")
                }
            },
            _ => Ok(()),
        }
    }
}

const PIN_KEYS: &str = "tp, pp, dp, mbs, vpp, sp, recompute, dist-opt, all";

/// Reads the value of pipette's `--pin` option (e.g. `tp,pp=2,dp=8`).
pub fn parse_pins(text: &str) -> Result<Vec<Pin>, ArgsError> {
    let bad = |item: &str, reason: String| ArgsError::BadPin {
        pin: item.to_string(),
        reason,
    };
    let mut pins: Vec<Pin> = Vec::new();
    for item in text.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(bad(
                text,
                format!("empty item (write a comma-separated list of {PIN_KEYS})"),
            ));
        }
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (item, None),
        };
        let size = |v: &str| {
            parse_count(v)
                .filter(|n| *n > 0)
                .ok_or_else(|| bad(item, format!("{key} takes a positive integer, got {v:?}")))
        };
        let boolean = |v: &str| {
            parse_bool(v).ok_or_else(|| bad(item, format!("{key} takes true or false, got {v:?}")))
        };
        let pin = match key {
            "tp" => Pin::TensorParallel(value.map(size).transpose()?),
            "pp" => Pin::PipelineParallel(value.map(size).transpose()?),
            "mbs" => Pin::MicroBatch(value.map(size).transpose()?),
            "vpp" => Pin::VirtualPipeline(value.map(size).transpose()?),
            "dp" => match value {
                Some(v) => Pin::DataParallel(size(v)?),
                None => {
                    return Err(bad(
                        item,
                        "dp needs a value (the Megatron arguments do not say it): write dp=N"
                            .into(),
                    ))
                }
            },
            "sp" => Pin::SequenceParallel(value.map(boolean).transpose()?),
            "dist-opt" => Pin::DistributedOptimizer(value.map(boolean).transpose()?),
            "recompute" => Pin::Recompute(
                value
                    .map(|v| parse_recompute_pin(v).map_err(|reason| bad(item, reason)))
                    .transpose()?,
            ),
            "all" => match value {
                None => Pin::All,
                Some(_) => {
                    return Err(bad(
                        item,
                        "all takes no value (it pins what the Megatron arguments say)".into(),
                    ))
                }
            },
            other => {
                return Err(bad(
                    item,
                    format!("unknown key {other:?} (known: {PIN_KEYS})"),
                ))
            }
        };
        if pins.iter().any(|p| p.key() == pin.key()) {
            return Err(bad(text, format!("{} is pinned twice", pin.key())));
        }
        pins.push(pin);
    }
    Ok(pins)
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Some(true),
        "false" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// `none`, `selective`, `full`, `full:uniform:N`, `full:block:N`. `full` alone is
/// returned with 0 layers, meaning "take method and layers from the arguments".
fn parse_recompute_pin(v: &str) -> Result<Recompute, String> {
    let usage = "recompute takes none, selective, full, full:uniform:N or full:block:N";
    let parts: Vec<&str> = v.split(':').collect();
    match parts.as_slice() {
        ["none"] => Ok(Recompute::None),
        ["selective"] => Ok(Recompute::Selective),
        ["full"] => Ok(Recompute::Full {
            method: RecomputeMethod::Uniform,
            num_layers: 0,
        }),
        ["full", method, n] => {
            let method = match *method {
                "uniform" => RecomputeMethod::Uniform,
                "block" => RecomputeMethod::Block,
                _ => return Err(format!("{usage}, got {v:?}")),
            };
            match parse_count(n) {
                Some(num_layers) if num_layers > 0 => Ok(Recompute::Full { method, num_layers }),
                _ => Err(format!("{usage} with N a positive integer, got {v:?}")),
            }
        }
        _ => Err(format!("{usage}, got {v:?}")),
    }
}

// ---------------------------------------------------------------------------------------
// The option table

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opt {
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
    /// An option we refuse: what it does, and the value that leaves it off (if any).
    Unsupported {
        what: &'static str,
        neutral: Option<u64>,
    },
    /// An option Megatron itself no longer accepts, and what to use instead.
    Removed(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Flag,
    Value,
}

const fn unsupported(what: &'static str, neutral: Option<u64>) -> Opt {
    Opt::Unsupported { what, neutral }
}

/// Megatron's options that pipette reads, by their name without the leading dashes.
const OPTIONS: &[(&str, Kind, Opt)] = &[
    ("num-layers", Kind::Value, Opt::NumLayers),
    ("hidden-size", Kind::Value, Opt::HiddenSize),
    ("ffn-hidden-size", Kind::Value, Opt::FfnHiddenSize),
    ("num-attention-heads", Kind::Value, Opt::NumAttentionHeads),
    (
        "group-query-attention",
        Kind::Flag,
        Opt::GroupQueryAttention,
    ),
    ("num-query-groups", Kind::Value, Opt::NumQueryGroups),
    ("kv-channels", Kind::Value, Opt::KvChannels),
    ("seq-length", Kind::Value, Opt::SeqLength),
    (
        "max-position-embeddings",
        Kind::Value,
        Opt::MaxPositionEmbeddings,
    ),
    ("vocab-size", Kind::Value, Opt::VocabSize),
    ("tokenizer-type", Kind::Value, Opt::TokenizerType),
    ("tokenizer-model", Kind::Value, Opt::TokenizerModel),
    (
        "make-vocab-size-divisible-by",
        Kind::Value,
        Opt::MakeVocabSizeDivisibleBy,
    ),
    ("swiglu", Kind::Flag, Opt::Swiglu),
    (
        "untie-embeddings-and-output-weights",
        Kind::Flag,
        Opt::Untie,
    ),
    ("normalization", Kind::Value, Opt::Normalization),
    ("disable-bias-linear", Kind::Flag, Opt::DisableBiasLinear),
    ("add-qkv-bias", Kind::Flag, Opt::AddQkvBias),
    (
        "position-embedding-type",
        Kind::Value,
        Opt::PositionEmbeddingType,
    ),
    (
        "use-rotary-position-embeddings",
        Kind::Flag,
        Opt::UseRotaryPositionEmbeddings,
    ),
    (
        "no-position-embedding",
        Kind::Flag,
        Opt::NoPositionEmbedding,
    ),
    ("global-batch-size", Kind::Value, Opt::GlobalBatchSize),
    ("micro-batch-size", Kind::Value, Opt::MicroBatchSize),
    ("bf16", Kind::Flag, Opt::Bf16),
    ("fp16", Kind::Flag, Opt::Fp16),
    (
        "recompute-activations",
        Kind::Flag,
        Opt::RecomputeActivations,
    ),
    (
        "recompute-granularity",
        Kind::Value,
        Opt::RecomputeGranularity,
    ),
    ("recompute-method", Kind::Value, Opt::RecomputeMethod),
    ("recompute-num-layers", Kind::Value, Opt::RecomputeNumLayers),
    ("sequence-parallel", Kind::Flag, Opt::SequenceParallel),
    (
        "use-distributed-optimizer",
        Kind::Flag,
        Opt::UseDistributedOptimizer,
    ),
    ("save", Kind::Value, Opt::Save),
    ("load", Kind::Value, Opt::Load),
    ("save-interval", Kind::Value, Opt::SaveInterval),
    ("persistent-save-interval", Kind::Value, Opt::SaveInterval),
    ("train-iters", Kind::Value, Opt::TrainIters),
    (
        "tensor-model-parallel-size",
        Kind::Value,
        Opt::TensorParallel,
    ),
    (
        "pipeline-model-parallel-size",
        Kind::Value,
        Opt::PipelineParallel,
    ),
    (
        "num-layers-per-virtual-pipeline-stage",
        Kind::Value,
        Opt::LayersPerVirtualStage,
    ),
    (
        "num-virtual-stages-per-pipeline-rank",
        Kind::Value,
        Opt::VirtualStagesPerRank,
    ),
    (
        "no-overlap-p2p-communication",
        Kind::Flag,
        Opt::NoOverlapP2p,
    ),
    ("overlap-grad-reduce", Kind::Flag, Opt::OverlapGradReduce),
    ("overlap-param-gather", Kind::Flag, Opt::OverlapParamGather),
    ("grad-reduce-in-bf16", Kind::Flag, Opt::GradReduceInBf16),
    ("tp-comm-overlap", Kind::Flag, Opt::TpCommOverlap),
    // Megatron options that change the model or the parallel layout beyond what the
    // parameter, memory and time models know.
    (
        "num-experts",
        Kind::Value,
        unsupported("mixture of experts", Some(0)),
    ),
    (
        "expert-model-parallel-size",
        Kind::Value,
        unsupported("expert parallelism", Some(1)),
    ),
    (
        "context-parallel-size",
        Kind::Value,
        unsupported("context parallelism", Some(1)),
    ),
    (
        "mtp-num-layers",
        Kind::Value,
        unsupported("multi-token prediction", Some(0)),
    ),
    (
        "multi-latent-attention",
        Kind::Flag,
        unsupported("multi-latent attention", None),
    ),
    (
        "qk-layernorm",
        Kind::Flag,
        unsupported("query/key layer norms", None),
    ),
    ("quick-geglu", Kind::Flag, unsupported("gated GeLU", None)),
    (
        "hybrid-layer-pattern",
        Kind::Value,
        unsupported("hybrid models", None),
    ),
    (
        "experimental-attention-variant",
        Kind::Value,
        unsupported("experimental attention", None),
    ),
    (
        "heterogeneous-layers-config-path",
        Kind::Value,
        unsupported("heterogeneous layers", None),
    ),
    (
        "yaml-cfg",
        Kind::Value,
        unsupported("arguments from a YAML file", None),
    ),
    (
        "padded-vocab-size",
        Kind::Value,
        unsupported("a vocabulary padded by hand", None),
    ),
    (
        "no-pad-vocab-size",
        Kind::Flag,
        unsupported("an unpadded vocabulary", None),
    ),
    (
        "disable-pad-vocab-size",
        Kind::Flag,
        unsupported("an unpadded vocabulary", None),
    ),
    (
        "decoder-first-pipeline-num-layers",
        Kind::Value,
        unsupported("uneven pipeline stages", None),
    ),
    (
        "decoder-last-pipeline-num-layers",
        Kind::Value,
        unsupported("uneven pipeline stages", None),
    ),
    (
        "pipeline-model-parallel-layout",
        Kind::Value,
        unsupported("a custom pipeline layout", None),
    ),
    (
        "account-for-embedding-in-pipeline-split",
        Kind::Flag,
        unsupported("uneven pipeline stages", None),
    ),
    (
        "account-for-loss-in-pipeline-split",
        Kind::Flag,
        unsupported("uneven pipeline stages", None),
    ),
    // Options Megatron itself refuses (arguments.py 573–587).
    (
        "batch-size",
        Kind::Value,
        Opt::Removed("--micro-batch-size"),
    ),
    (
        "model-parallel-size",
        Kind::Value,
        Opt::Removed("--tensor-model-parallel-size"),
    ),
    (
        "checkpoint-activations",
        Kind::Flag,
        Opt::Removed("--recompute-activations"),
    ),
];

fn lookup_option(name: &str) -> Option<(Kind, Opt)> {
    OPTIONS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, kind, opt)| (*kind, *opt))
}

/// Python's `int()` on what argparse hands it: optional surrounding whitespace, an optional
/// `+`, digits with single underscores between them. Negative numbers and overflow are None.
fn parse_count(text: &str) -> Option<u64> {
    let t = text.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t.is_empty() || t.starts_with('_') || t.ends_with('_') || t.contains("__") {
        return None;
    }
    if !t.chars().all(|c| c.is_ascii_digit() || c == '_') {
        return None;
    }
    t.replace('_', "").parse().ok()
}

/// argparse takes the next word as an option's value unless it looks like an option
/// itself (a dash followed by anything but a number).
fn looks_like_option(word: &str) -> bool {
    word.starts_with('-') && word.len() > 1 && word[1..].parse::<f64>().is_err()
}

// ---------------------------------------------------------------------------------------
// Reading the arguments

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Granularity {
    Full,
    Selective,
}

/// What the arguments say before defaults and derivations: `None` / `false` = not given.
#[derive(Debug, Clone, Default)]
struct RawArgs {
    num_layers: Option<u64>,
    hidden_size: Option<u64>,
    ffn_hidden_size: Option<u64>,
    num_attention_heads: Option<u64>,
    group_query_attention: bool,
    num_query_groups: Option<u64>,
    kv_channels: Option<u64>,
    seq_length: Option<u64>,
    max_position_embeddings: Option<u64>,
    vocab_size: Option<u64>,
    tokenizer_type: Option<String>,
    tokenizer_model: Option<String>,
    make_vocab_size_divisible_by: Option<u64>,
    swiglu: bool,
    untie: bool,
    normalization: Option<Normalization>,
    disable_bias_linear: bool,
    add_qkv_bias: bool,
    position_embedding_type: Option<PositionEmbedding>,
    use_rotary_position_embeddings: bool,
    no_position_embedding: bool,
    global_batch_size: Option<u64>,
    micro_batch_size: Option<u64>,
    bf16: bool,
    fp16: bool,
    recompute_activations: bool,
    recompute_granularity: Option<Granularity>,
    recompute_method: Option<RecomputeMethod>,
    recompute_num_layers: Option<u64>,
    sequence_parallel: bool,
    use_distributed_optimizer: bool,
    save: Option<String>,
    load: Option<String>,
    save_interval: Option<u64>,
    train_iters: Option<u64>,
    tensor_parallel: Option<u64>,
    pipeline_parallel: Option<u64>,
    layers_per_virtual_stage: Option<u64>,
    virtual_stages_per_rank: Option<u64>,
    no_overlap_p2p: bool,
    overlap_grad_reduce: bool,
    overlap_param_gather: bool,
    grad_reduce_in_bf16: bool,
    tp_comm_overlap: bool,
    /// Megatron options written with underscores (`--num_layers`): not Megatron's, but
    /// worth a hint when the dashed one is missing.
    underscored: Vec<String>,
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

fn read_args(args: &[String]) -> Result<RawArgs, ArgsError> {
    let mut raw = RawArgs::default();
    let mut words = args.iter();
    while let Some(word) = words.next() {
        if word == "--" {
            break; // argparse: everything after is positional
        }
        let Some(body) = word.strip_prefix("--") else {
            continue; // a value of the user's own options, or a positional
        };
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        let Some((kind, opt)) = lookup_option(name) else {
            let dashed = name.replace('_', "-");
            if dashed != name && lookup_option(&dashed).is_some() {
                raw.underscored.push(format!("--{name}"));
            }
            continue;
        };
        let option = format!("--{name}");
        match kind {
            Kind::Flag => {
                if let Some(value) = inline {
                    return Err(ArgsError::FlagWithValue {
                        option,
                        value: value.to_string(),
                    });
                }
                set_flag(&mut raw, opt, &option)?;
            }
            Kind::Value => {
                let value = match inline {
                    Some(value) => value.to_string(),
                    None => match words.clone().next() {
                        Some(next) if !looks_like_option(next) => {
                            words.next();
                            next.clone()
                        }
                        _ => return Err(ArgsError::MissingValue { option }),
                    },
                };
                set_value(&mut raw, opt, &option, &value)?;
            }
        }
    }
    Ok(raw)
}

fn set_flag(raw: &mut RawArgs, opt: Opt, option: &str) -> Result<(), ArgsError> {
    match opt {
        Opt::GroupQueryAttention => raw.group_query_attention = true,
        Opt::Swiglu => raw.swiglu = true,
        Opt::Untie => raw.untie = true,
        Opt::DisableBiasLinear => raw.disable_bias_linear = true,
        Opt::AddQkvBias => raw.add_qkv_bias = true,
        Opt::UseRotaryPositionEmbeddings => raw.use_rotary_position_embeddings = true,
        Opt::NoPositionEmbedding => raw.no_position_embedding = true,
        Opt::Bf16 => raw.bf16 = true,
        Opt::Fp16 => raw.fp16 = true,
        Opt::RecomputeActivations => raw.recompute_activations = true,
        Opt::SequenceParallel => raw.sequence_parallel = true,
        Opt::UseDistributedOptimizer => raw.use_distributed_optimizer = true,
        Opt::NoOverlapP2p => raw.no_overlap_p2p = true,
        Opt::OverlapGradReduce => raw.overlap_grad_reduce = true,
        Opt::OverlapParamGather => raw.overlap_param_gather = true,
        Opt::GradReduceInBf16 => raw.grad_reduce_in_bf16 = true,
        Opt::TpCommOverlap => raw.tp_comm_overlap = true,
        Opt::Unsupported { what, .. } => {
            return Err(ArgsError::Unsupported {
                option: option.to_string(),
                what,
            })
        }
        Opt::Removed(instead) => {
            return Err(contradiction(format!(
                "{option} is no longer a Megatron option (use {instead})"
            )))
        }
        _ => {}
    }
    Ok(())
}

fn set_value(raw: &mut RawArgs, opt: Opt, option: &str, value: &str) -> Result<(), ArgsError> {
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
    match opt {
        Opt::NumLayers => raw.num_layers = Some(positive()?),
        Opt::HiddenSize => raw.hidden_size = Some(positive()?),
        Opt::FfnHiddenSize => raw.ffn_hidden_size = Some(positive()?),
        Opt::NumAttentionHeads => raw.num_attention_heads = Some(positive()?),
        Opt::NumQueryGroups => raw.num_query_groups = Some(positive()?),
        Opt::KvChannels => raw.kv_channels = Some(positive()?),
        Opt::SeqLength => raw.seq_length = Some(positive()?),
        Opt::MaxPositionEmbeddings => raw.max_position_embeddings = Some(positive()?),
        Opt::VocabSize => raw.vocab_size = Some(positive()?),
        Opt::TokenizerType => raw.tokenizer_type = Some(choice(TOKENIZERS)?),
        Opt::TokenizerModel => raw.tokenizer_model = Some(value.to_string()),
        Opt::MakeVocabSizeDivisibleBy => raw.make_vocab_size_divisible_by = Some(positive()?),
        Opt::Normalization => {
            raw.normalization = Some(match choice(&["LayerNorm", "RMSNorm"])?.as_str() {
                "RMSNorm" => Normalization::RMSNorm,
                _ => Normalization::LayerNorm,
            })
        }
        Opt::PositionEmbeddingType => {
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
                    return Err(ArgsError::Unsupported {
                        option: format!("{option} relative"),
                        what: "relative position buckets",
                    })
                }
            })
        }
        Opt::GlobalBatchSize => raw.global_batch_size = Some(positive()?),
        Opt::MicroBatchSize => raw.micro_batch_size = Some(positive()?),
        Opt::RecomputeGranularity => {
            raw.recompute_granularity = Some(match choice(&["full", "selective"])?.as_str() {
                "full" => Granularity::Full,
                _ => Granularity::Selective,
            })
        }
        Opt::RecomputeMethod => {
            raw.recompute_method = Some(match choice(&["uniform", "block"])?.as_str() {
                "block" => RecomputeMethod::Block,
                _ => RecomputeMethod::Uniform,
            })
        }
        Opt::RecomputeNumLayers => raw.recompute_num_layers = Some(positive()?),
        Opt::Save => raw.save = Some(value.to_string()),
        Opt::Load => raw.load = Some(value.to_string()),
        Opt::SaveInterval => raw.save_interval = Some(positive()?),
        Opt::TrainIters => raw.train_iters = Some(positive()?),
        Opt::TensorParallel => raw.tensor_parallel = Some(positive()?),
        Opt::PipelineParallel => raw.pipeline_parallel = Some(positive()?),
        Opt::LayersPerVirtualStage => raw.layers_per_virtual_stage = Some(positive()?),
        Opt::VirtualStagesPerRank => raw.virtual_stages_per_rank = Some(positive()?),
        Opt::Unsupported { what, neutral } => {
            let off = neutral.is_some() && parse_count(value) == neutral;
            if !off {
                return Err(ArgsError::Unsupported {
                    option: format!("{option} {value}"),
                    what,
                });
            }
        }
        Opt::Removed(instead) => {
            return Err(contradiction(format!(
                "{option} is no longer a Megatron option (use {instead})"
            )))
        }
        _ => {}
    }
    Ok(())
}

/// The preset's values under the user's: options the user gave win, flags add up, and any
/// precision flag of the user's replaces the preset's precision.
fn merge(preset: RawArgs, user: RawArgs) -> RawArgs {
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
        underscored: user.underscored,
    }
}

/// What the arguments say about the vocabulary.
enum Vocabulary {
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

fn vocabulary(raw: &RawArgs) -> Result<Vocabulary, ArgsError> {
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

// ---------------------------------------------------------------------------------------
// From arguments to settings

/// Reads Megatron arguments (everything after SCRIPT) into [`Settings`].
///
/// With `preset`, the preset's arguments are the defaults and the user's override them.
/// `pins` (from `--pin`, see [`parse_pins`]) become [`Settings::constraints`].
pub fn settings_from_megatron_args(
    args: &[String],
    preset: Option<&str>,
    pins: &[Pin],
) -> Result<Settings, ArgsError> {
    let user = read_args(args)?;
    let (raw, vocab) = match preset {
        None => {
            let vocab = vocabulary(&user)?;
            (user, vocab)
        }
        Some(name) => {
            let preset = presets::lookup(name)?;
            let defaults = read_args(&preset.megatron_args())?;
            // The user's vocabulary if their arguments tell it, else the preset's.
            let vocab = match vocabulary(&user) {
                Ok(Vocabulary::Known(v)) => Vocabulary::Known(v),
                _ => vocabulary(&defaults)?,
            };
            (merge(defaults, user), vocab)
        }
    };
    let model = model_spec(&raw, vocab, preset)?;
    let dp_pin = pins.iter().find_map(|p| match p {
        Pin::DataParallel(n) => Some(*n),
        _ => None,
    });
    let training = training_settings(&raw, &model, dp_pin)?;
    let constraints = constraints(&raw, &model, &training, pins)?;
    Ok(Settings {
        model,
        training,
        constraints,
    })
}

fn require(raw: &RawArgs, value: Option<u64>, option: &'static str) -> Result<u64, ArgsError> {
    value.ok_or_else(|| {
        let underscored = format!("--{}", option.trim_start_matches('-').replace('-', "_"));
        let hint = if raw.underscored.contains(&underscored) {
            format!("{underscored} is not Megatron's spelling: Megatron's options use dashes")
        } else {
            format!(
                "add `{option} N`, or name a model with --model PRESET: {}",
                presets::names().join(", ")
            )
        };
        ArgsError::Missing { option, hint }
    })
}

fn model_spec(
    raw: &RawArgs,
    vocab: Vocabulary,
    preset: Option<&str>,
) -> Result<ModelSpec, ArgsError> {
    let num_layers = require(raw, raw.num_layers, "--num-layers")?;
    let hidden = require(raw, raw.hidden_size, "--hidden-size")?;
    let heads = require(raw, raw.num_attention_heads, "--num-attention-heads")?;
    let seq_length = require(raw, raw.seq_length, "--seq-length")?;
    let vocab_size = match vocab {
        Vocabulary::Known(v) => v,
        Vocabulary::Unknown(tokenizer) => return Err(ArgsError::UnknownVocabulary { tokenizer }),
        Vocabulary::NotGiven => require(raw, None, "--vocab-size")?,
    };

    // arguments.py 1280-1289; Python's float arithmetic, mirrored exactly.
    let ffn_hidden_size = match raw.ffn_hidden_size {
        Some(ffn) => ffn,
        None if raw.swiglu => {
            (((4.0 * hidden as f64 * 2.0 / 3.0) / 64.0) as u64).saturating_mul(64)
        }
        None => hidden.saturating_mul(4),
    };
    if ffn_hidden_size == 0 {
        return Err(contradiction(format!(
            "--swiglu with --hidden-size {hidden} gives an MLP width of 0 (Megatron rounds 8h/3 down to a multiple of 64; give --ffn-hidden-size)"
        )));
    }

    let kv_channels = match raw.kv_channels {
        Some(kv) => kv,
        None if hidden % heads == 0 => hidden / heads,
        None => {
            return Err(contradiction(format!(
                "--hidden-size {hidden} is not divisible by --num-attention-heads {heads} (Megatron needs hidden/heads as the head width: change one, or give --kv-channels)"
            )))
        }
    };

    let num_query_groups = if raw.group_query_attention {
        raw.num_query_groups.unwrap_or(1)
    } else {
        heads
    };
    if heads % num_query_groups != 0 {
        return Err(contradiction(format!(
            "--num-attention-heads {heads} is not divisible by --num-query-groups {num_query_groups} (each key/value group serves a whole number of heads: change one of them)"
        )));
    }

    let position_embedding = if raw.use_rotary_position_embeddings {
        PositionEmbedding::Rope
    } else {
        raw.position_embedding_type
            .unwrap_or(PositionEmbedding::LearnedAbsolute)
    };
    if raw.no_position_embedding && position_embedding != PositionEmbedding::Rope {
        return Err(contradiction(
            "--no-position-embedding is refused by Megatron (use --position-embedding-type none)"
                .to_string(),
        ));
    }

    let max_position_embeddings = raw.max_position_embeddings.unwrap_or(seq_length);
    if seq_length > max_position_embeddings {
        return Err(contradiction(format!(
            "--seq-length {seq_length} is longer than --max-position-embeddings {max_position_embeddings} (Megatron requires max positions >= sequence length: raise --max-position-embeddings or shorten --seq-length)"
        )));
    }

    let add_bias_linear = !raw.disable_bias_linear;
    let spec = ModelSpec {
        preset: preset.map(str::to_string),
        num_layers,
        hidden_size: hidden,
        ffn_hidden_size,
        num_attention_heads: heads,
        num_query_groups,
        kv_channels,
        seq_length,
        max_position_embeddings,
        vocab_size,
        make_vocab_size_divisible_by: raw.make_vocab_size_divisible_by.unwrap_or(128),
        swiglu: raw.swiglu,
        untie_embeddings_and_output_weights: raw.untie,
        normalization: raw.normalization.unwrap_or(Normalization::LayerNorm),
        add_bias_linear,
        add_qkv_bias: add_bias_linear || raw.add_qkv_bias,
        position_embedding,
    };
    if !fits_in_u64(&spec) {
        return Err(contradiction(format!(
            "the model is too large to count (--num-layers {num_layers}, --hidden-size {hidden}, vocabulary {vocab_size}): check the sizes"
        )));
    }
    Ok(spec)
}

/// Whether the model's parameter count stays far from u64's limit, with room for padding
/// at any realistic tensor-parallel size. The counts saturate rather than overflow, but a
/// saturated count would be a wrong plan. Estimated in f64, which cannot overflow here.
fn fits_in_u64(spec: &ModelSpec) -> bool {
    let f = |v: u64| v as f64;
    let h = f(spec.hidden_size);
    let q = f(spec.num_attention_heads) * f(spec.kv_channels);
    let kv = f(spec.num_query_groups) * f(spec.kv_channels);
    let ffn = 2.0 * f(spec.ffn_hidden_size);
    let layer = (h + 1.0) * (q + 2.0 * kv) + (q + 1.0) * h + (h + 1.0) * ffn + ffn * h + 8.0 * h;
    let vocab = f(spec.vocab_size) + f(spec.make_vocab_size_divisible_by) * 1024.0;
    let total = layer * f(spec.num_layers)
        + 2.0 * vocab * h
        + f(spec.max_position_embeddings) * h
        + 2.0 * h;
    total < (u64::MAX / 4) as f64
}

fn precision(raw: &RawArgs) -> Result<Precision, ArgsError> {
    match (raw.bf16, raw.fp16) {
        (true, true) => Err(contradiction(
            "--fp16 and --bf16 are both given (Megatron trains in one of them: keep one)"
                .to_string(),
        )),
        (true, false) => Ok(Precision::Bf16),
        (false, true) => Ok(Precision::Fp16),
        (false, false) => Ok(Precision::Fp32),
    }
}

fn recompute(raw: &RawArgs, num_layers: u64) -> Result<Recompute, ArgsError> {
    let granularity = if raw.recompute_activations {
        Some(Granularity::Selective)
    } else {
        raw.recompute_granularity
    };
    let method_name = |m: RecomputeMethod| match m {
        RecomputeMethod::Uniform => "uniform",
        RecomputeMethod::Block => "block",
    };
    let selective_source = if raw.recompute_activations {
        "--recompute-activations (selective recomputation)"
    } else {
        "--recompute-granularity selective"
    };
    match granularity {
        None => {
            if let Some(m) = raw.recompute_method {
                return Err(contradiction(format!(
                    "--recompute-method {} has no effect without --recompute-granularity full (Megatron ignores it: add --recompute-granularity full, or drop it)",
                    method_name(m)
                )));
            }
            if let Some(n) = raw.recompute_num_layers {
                return Err(contradiction(format!(
                    "--recompute-num-layers {n} has no effect without --recompute-granularity full (Megatron ignores it: add --recompute-granularity full and --recompute-method, or drop it)"
                )));
            }
            Ok(Recompute::None)
        }
        Some(Granularity::Selective) => {
            if let Some(m) = raw.recompute_method {
                return Err(contradiction(format!(
                    "--recompute-method {} needs --recompute-granularity full, but {selective_source} is given (Megatron refuses a method with selective recomputation: drop one)",
                    method_name(m)
                )));
            }
            if let Some(n) = raw.recompute_num_layers {
                return Err(contradiction(format!(
                    "--recompute-num-layers {n} needs --recompute-granularity full, but {selective_source} is given (Megatron refuses a layer count with selective recomputation: drop one)"
                )));
            }
            Ok(Recompute::Selective)
        }
        Some(Granularity::Full) => {
            let Some(method) = raw.recompute_method else {
                return Err(contradiction(
                    "--recompute-granularity full needs --recompute-method uniform or block (Megatron refuses full recomputation without one: add it)"
                        .to_string(),
                ));
            };
            let Some(n) = raw.recompute_num_layers else {
                return Err(contradiction(
                    "--recompute-granularity full needs --recompute-num-layers N (Megatron refuses full recomputation without it: add it, e.g. 1)"
                        .to_string(),
                ));
            };
            if n > num_layers {
                return Err(contradiction(format!(
                    "--recompute-num-layers {n} is more than --num-layers {num_layers} (use at most the layers of one pipeline stage)"
                )));
            }
            Ok(Recompute::Full {
                method,
                num_layers: n,
            })
        }
    }
}

/// Virtual pipeline stages per rank as Megatron derives them (arguments.py 893-964):
/// None for no interleaving.
fn virtual_pipeline(raw: &RawArgs, num_layers: u64, pp: u64) -> Result<Option<u64>, ArgsError> {
    let vpp = match (raw.layers_per_virtual_stage, raw.virtual_stages_per_rank) {
        (Some(l), Some(v)) => {
            return Err(contradiction(format!(
                "--num-layers-per-virtual-pipeline-stage {l} and --num-virtual-stages-per-pipeline-rank {v} are both given (Megatron takes one of them: keep one)"
            )))
        }
        (Some(per_stage), None) => {
            if num_layers % pp != 0 {
                return Err(contradiction(format!(
                    "--num-layers {num_layers} is not divisible by --pipeline-model-parallel-size {pp} (each pipeline stage needs the same number of layers)"
                )));
            }
            let per_rank = num_layers / pp;
            if per_rank % per_stage != 0 {
                return Err(contradiction(format!(
                    "--num-layers-per-virtual-pipeline-stage {per_stage} does not divide the {per_rank} layers of each of the {pp} pipeline stages (--num-layers {num_layers}): choose a divisor of {per_rank}"
                )));
            }
            Some(per_rank / per_stage)
        }
        (None, Some(v)) => Some(v),
        (None, None) => None,
    };
    let vpp = vpp.filter(|v| *v > 1);
    match vpp {
        None if num_layers % pp != 0 => Err(contradiction(format!(
            "--num-layers {num_layers} is not divisible by --pipeline-model-parallel-size {pp} (each pipeline stage needs the same number of layers)"
        ))),
        Some(v) if raw.no_overlap_p2p && pp <= 2 => Err(contradiction(format!(
            "{v} virtual pipeline stages need --pipeline-model-parallel-size above 2 with --no-overlap-p2p-communication, got {pp} (Megatron refuses it: raise pp or drop the virtual stages)"
        ))),
        Some(v) if pp <= 1 => Err(contradiction(format!(
            "{v} virtual pipeline stages need --pipeline-model-parallel-size above 1, got {pp} (interleaving needs a pipeline: raise pp or drop the virtual stages)"
        ))),
        Some(v) if (num_layers / pp) % v != 0 => Err(contradiction(format!(
            "--num-virtual-stages-per-pipeline-rank {v} does not divide the {} layers of each pipeline stage (--num-layers {num_layers}, --pipeline-model-parallel-size {pp})",
            num_layers / pp
        ))),
        vpp => Ok(vpp),
    }
}

fn training_settings(
    raw: &RawArgs,
    model: &ModelSpec,
    dp_pin: Option<u64>,
) -> Result<TrainingSettings, ArgsError> {
    let micro_batch_size = raw.micro_batch_size.unwrap_or(1);
    let global_batch_size = match (raw.global_batch_size, dp_pin) {
        (Some(global), _) => global,
        // Megatron's default (arguments.py 684-685), once dp is known.
        (None, Some(dp)) => micro_batch_size.saturating_mul(dp),
        (None, None) => {
            return Err(ArgsError::Missing {
                option: "--global-batch-size",
                hint: "Megatron would use micro-batch × data-parallel size, and pipette-run chooses the data-parallel size: add --global-batch-size N (N = micro-batch × data-parallel size of your current run), or pin it with --pin dp=N".to_string(),
            })
        }
    };
    if global_batch_size % micro_batch_size != 0 {
        return Err(contradiction(format!(
            "--global-batch-size {global_batch_size} is not divisible by --micro-batch-size {micro_batch_size} (the global batch is a whole number of micro-batches: change one of them)"
        )));
    }
    if raw.save.is_some() && raw.save_interval.is_none() {
        return Err(contradiction(
            "--save needs --save-interval N (Megatron refuses --save without it: add it)"
                .to_string(),
        ));
    }
    let tensor_parallel = raw.tensor_parallel.unwrap_or(1);
    let pipeline_parallel = raw.pipeline_parallel.unwrap_or(1);
    Ok(TrainingSettings {
        global_batch_size,
        micro_batch_size,
        precision: precision(raw)?,
        recompute: recompute(raw, model.num_layers)?,
        sequence_parallel: raw.sequence_parallel,
        distributed_optimizer: raw.use_distributed_optimizer,
        train_iters: raw.train_iters,
        save: raw.save.clone(),
        load: raw.load.clone(),
        save_interval: raw.save_interval,
        tensor_parallel,
        pipeline_parallel,
        virtual_pipeline: virtual_pipeline(raw, model.num_layers, pipeline_parallel)?,
        overlap_grad_reduce: raw.overlap_grad_reduce,
        overlap_param_gather: raw.overlap_param_gather,
        grad_reduce_in_bf16: raw.grad_reduce_in_bf16,
        tp_comm_overlap: raw.tp_comm_overlap,
    })
}

fn constraints(
    raw: &RawArgs,
    model: &ModelSpec,
    training: &TrainingSettings,
    pins: &[Pin],
) -> Result<Constraints, ArgsError> {
    let mut c = Constraints::default();
    let given = |value: Option<u64>, key: &'static str, option: &'static str| {
        value.ok_or(ArgsError::PinWithoutValue { key, option })
    };
    let vpp_given = raw.layers_per_virtual_stage.is_some() || raw.virtual_stages_per_rank.is_some();
    let vpp_from_args = || training.virtual_pipeline.unwrap_or(1);
    let recompute_from = |pinned: &Option<Recompute>| match pinned {
        None => training.recompute.clone(),
        // `full` without method and layers: the arguments', else uniform over 1 layer.
        Some(Recompute::Full { num_layers: 0, .. }) => match &training.recompute {
            full @ Recompute::Full { .. } => full.clone(),
            _ => Recompute::Full {
                method: RecomputeMethod::Uniform,
                num_layers: 1,
            },
        },
        Some(r) => r.clone(),
    };
    // `all` first, so that the other items override it wherever they stand.
    if pins.contains(&Pin::All) {
        c.tensor_parallel = Some(training.tensor_parallel);
        c.pipeline_parallel = Some(training.pipeline_parallel);
        c.micro_batch_size = Some(given(raw.micro_batch_size, "all", "--micro-batch-size")?);
        c.virtual_pipeline = Some(vpp_from_args());
        c.sequence_parallel = Some(training.sequence_parallel);
        c.recompute = Some(training.recompute.clone());
        c.distributed_optimizer = Some(training.distributed_optimizer);
    }
    for pin in pins {
        match pin {
            Pin::All => {}
            Pin::TensorParallel(v) => {
                c.tensor_parallel = Some(match v {
                    Some(n) => *n,
                    None => given(raw.tensor_parallel, "tp", "--tensor-model-parallel-size")?,
                })
            }
            Pin::PipelineParallel(v) => {
                c.pipeline_parallel = Some(match v {
                    Some(n) => *n,
                    None => given(
                        raw.pipeline_parallel,
                        "pp",
                        "--pipeline-model-parallel-size",
                    )?,
                })
            }
            Pin::DataParallel(n) => c.data_parallel = Some(*n),
            Pin::MicroBatch(v) => {
                c.micro_batch_size = Some(match v {
                    Some(n) => *n,
                    None => given(raw.micro_batch_size, "mbs", "--micro-batch-size")?,
                })
            }
            Pin::VirtualPipeline(v) => {
                c.virtual_pipeline = Some(match v {
                    Some(n) => *n,
                    None if vpp_given => vpp_from_args(),
                    None => {
                        return Err(ArgsError::PinWithoutValue {
                            key: "vpp",
                            option: "--num-virtual-stages-per-pipeline-rank",
                        })
                    }
                })
            }
            Pin::SequenceParallel(v) => {
                c.sequence_parallel = Some(v.unwrap_or(training.sequence_parallel))
            }
            Pin::Recompute(v) => c.recompute = Some(recompute_from(v)),
            Pin::DistributedOptimizer(v) => {
                c.distributed_optimizer = Some(v.unwrap_or(training.distributed_optimizer))
            }
        }
    }
    check_pins(model, training, &c)?;
    Ok(c)
}

/// Pinned values Megatron would refuse for this model, caught before any planning.
fn check_pins(
    model: &ModelSpec,
    training: &TrainingSettings,
    c: &Constraints,
) -> Result<(), ArgsError> {
    let heads = model.num_attention_heads;
    let groups = model.num_query_groups;
    let layers = model.num_layers;
    let global = training.global_batch_size;
    if let Some(tp) = c.tensor_parallel {
        if heads % tp != 0 {
            return Err(contradiction(format!(
                "pinned tp={tp} does not divide --num-attention-heads {heads} (Megatron splits whole heads across tensor-parallel ranks: pin a divisor of {heads})"
            )));
        }
        if groups % tp != 0 && tp % groups != 0 {
            return Err(contradiction(format!(
                "pinned tp={tp} is neither a multiple nor a divisor of the {groups} query groups (--num-query-groups): pin a divisor of {groups}"
            )));
        }
    }
    if let Some(pp) = c.pipeline_parallel {
        if layers % pp != 0 {
            return Err(contradiction(format!(
                "pinned pp={pp} does not divide --num-layers {layers} (each pipeline stage needs the same number of layers: pin a divisor of {layers})"
            )));
        }
        if let Some(vpp) = c.virtual_pipeline.filter(|v| *v > 1) {
            if (layers / pp) % vpp != 0 {
                return Err(contradiction(format!(
                    "pinned vpp={vpp} does not divide the {} layers of each of the pinned pp={pp} stages (--num-layers {layers})",
                    layers / pp
                )));
            }
        }
    }
    if let Some(mbs) = c.micro_batch_size {
        if global % mbs != 0 {
            return Err(contradiction(format!(
                "pinned mbs={mbs} does not divide --global-batch-size {global} (pin a divisor of {global})"
            )));
        }
    }
    if let Some(dp) = c.data_parallel {
        let step = dp.saturating_mul(c.micro_batch_size.unwrap_or(1));
        if global % step != 0 {
            return Err(contradiction(format!(
                "pinned dp={dp}{} does not divide --global-batch-size {global} (each step takes the same number of micro-batches on every data-parallel rank)",
                c.micro_batch_size
                    .map(|m| format!(" × mbs={m}"))
                    .unwrap_or_default()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    const TINY: &str = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 \
                        --max-position-embeddings 128 --vocab-size 1000 --global-batch-size 8";

    fn settings(extra: &str) -> Result<Settings, ArgsError> {
        settings_from_megatron_args(&args(&format!("{TINY} {extra}")), None, &[])
    }

    fn contradiction_text(extra: &str) -> String {
        match settings(extra) {
            Err(ArgsError::Contradiction(text)) => text,
            other => panic!("expected a contradiction for {extra:?}, got {other:?}"),
        }
    }

    #[test]
    fn reads_a_gpt_model_with_megatron_defaults() {
        let s = settings("").unwrap();
        let m = &s.model;
        assert_eq!(m.preset, None);
        assert_eq!(
            (m.num_layers, m.hidden_size, m.num_attention_heads),
            (2, 64, 4)
        );
        assert_eq!(m.ffn_hidden_size, 256);
        assert_eq!(m.kv_channels, 16);
        assert_eq!(m.num_query_groups, 4);
        assert_eq!(m.make_vocab_size_divisible_by, 128);
        assert_eq!(m.normalization, Normalization::LayerNorm);
        assert_eq!(m.position_embedding, PositionEmbedding::LearnedAbsolute);
        assert!(m.add_bias_linear && m.add_qkv_bias);
        assert!(!m.swiglu && !m.untie_embeddings_and_output_weights);
        let t = &s.training;
        assert_eq!((t.global_batch_size, t.micro_batch_size), (8, 1));
        assert_eq!(t.precision, Precision::Fp32);
        assert_eq!(t.recompute, Recompute::None);
        assert_eq!(
            (t.tensor_parallel, t.pipeline_parallel, t.virtual_pipeline),
            (1, 1, None)
        );
        assert!(!t.sequence_parallel && !t.distributed_optimizer);
        assert_eq!(s.constraints, Constraints::default());
    }

    #[test]
    fn reads_equals_spelling_and_last_occurrence_wins() {
        let s = settings("--hidden-size=128 --num-layers 4 --num-layers=6").unwrap();
        assert_eq!((s.model.hidden_size, s.model.num_layers), (128, 6));
        assert_eq!(s.model.ffn_hidden_size, 512);
    }

    #[test]
    fn leaves_unknown_options_and_their_values_alone() {
        let s = settings(
            "--lr 1.5e-4 --data-path a b c --split 969,30,1 --tokenizer-model /x/y.model \
             --micro-batch-size=2 --eval-iters 10 -x --weird=value",
        )
        .unwrap();
        assert_eq!(s.training.micro_batch_size, 2);
    }

    #[test]
    fn stops_at_double_dash() {
        let s = settings("-- --num-layers 12").unwrap();
        assert_eq!(s.model.num_layers, 2);
    }

    #[test]
    fn underscore_spelling_is_not_megatrons_but_gets_a_hint() {
        let a = args("--num_layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --vocab-size 100 --global-batch-size 1");
        let err = settings_from_megatron_args(&a, None, &[]).unwrap_err();
        let text = err.to_string();
        assert!(matches!(
            err,
            ArgsError::Missing {
                option: "--num-layers",
                ..
            }
        ));
        assert!(
            text.contains("--num_layers is not Megatron's spelling"),
            "{text}"
        );
    }

    #[test]
    fn missing_model_size_suggests_a_preset() {
        let err = settings_from_megatron_args(&args("--hidden-size 64"), None, &[]).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("missing --num-layers"), "{text}");
        assert!(
            text.contains("--model PRESET") && text.contains("llama2-7b"),
            "{text}"
        );
        for (drop, option) in [
            ("--hidden-size 64", "--hidden-size"),
            ("--num-attention-heads 4", "--num-attention-heads"),
            ("--seq-length 128", "--seq-length"),
        ] {
            let a = TINY
                .replace(drop, "")
                .replace("--max-position-embeddings 128", "");
            let err = settings_from_megatron_args(&args(&a), None, &[]).unwrap_err();
            assert!(
                matches!(err, ArgsError::Missing { option: o, .. } if o == option),
                "{err}"
            );
        }
    }

    #[test]
    fn bad_values_are_errors_not_panics() {
        for (extra, option) in [
            ("--num-layers abc", "--num-layers"),
            ("--num-layers=-3", "--num-layers"),
            ("--hidden-size 0", "--hidden-size"),
            ("--hidden-size 1e3", "--hidden-size"),
            (
                "--micro-batch-size 99999999999999999999999",
                "--micro-batch-size",
            ),
            ("--normalization layernorm", "--normalization"),
            (
                "--recompute-granularity everything",
                "--recompute-granularity",
            ),
            ("--tokenizer-type Llama3Tokenizer", "--tokenizer-type"),
        ] {
            match settings(extra) {
                Err(ArgsError::InvalidValue { option: o, .. }) => assert_eq!(o, option, "{extra}"),
                other => panic!("{extra}: {other:?}"),
            }
        }
        assert!(matches!(
            settings("--num-layers"),
            Err(ArgsError::MissingValue { .. })
        ));
        assert!(matches!(
            settings("--num-layers --hidden-size 64"),
            Err(ArgsError::MissingValue { .. })
        ));
        assert!(matches!(
            settings("--bf16=yes"),
            Err(ArgsError::FlagWithValue { .. })
        ));
        // Python's int() accepts these, and so do we.
        let s = settings("--num-layers=+0_4 --global-batch-size 00008").unwrap();
        assert_eq!((s.model.num_layers, s.training.global_batch_size), (4, 8));
    }

    #[test]
    fn derives_ffn_like_megatron() {
        assert_eq!(settings("--swiglu").unwrap().model.ffn_hidden_size, 128);
        let big = "--hidden-size 4096 --num-attention-heads 32 --swiglu";
        assert_eq!(settings(big).unwrap().model.ffn_hidden_size, 10880);
        let s = settings("--hidden-size 5120 --num-attention-heads 40 --swiglu").unwrap();
        assert_eq!(s.model.ffn_hidden_size, 13632);
        assert_eq!(
            settings("--ffn-hidden-size 100")
                .unwrap()
                .model
                .ffn_hidden_size,
            100
        );
        assert!(matches!(
            settings("--hidden-size 16 --num-attention-heads 4 --swiglu"),
            Err(ArgsError::Contradiction(_))
        ));
    }

    #[test]
    fn derives_heads_groups_and_channels() {
        let s = settings("--kv-channels 32").unwrap();
        assert_eq!(s.model.kv_channels, 32);
        // Query groups count only with --group-query-attention, and default to 1 there.
        assert_eq!(
            settings("--num-query-groups 2")
                .unwrap()
                .model
                .num_query_groups,
            4
        );
        let gqa = settings("--group-query-attention --num-query-groups 2").unwrap();
        assert_eq!(gqa.model.num_query_groups, 2);
        assert_eq!(
            settings("--group-query-attention")
                .unwrap()
                .model
                .num_query_groups,
            1
        );
        let text = contradiction_text("--group-query-attention --num-query-groups 3");
        assert!(text.contains("--num-attention-heads 4") && text.contains("--num-query-groups 3"));
        let text = contradiction_text("--num-attention-heads 6");
        assert!(
            text.contains("--hidden-size 64") && text.contains("--kv-channels"),
            "{text}"
        );
        // With --kv-channels the hidden size need not divide.
        assert_eq!(
            settings("--num-attention-heads 6 --kv-channels 16")
                .unwrap()
                .model
                .kv_channels,
            16
        );
    }

    #[test]
    fn positions_biases_and_norms() {
        let s = settings(
            "--position-embedding-type rope --normalization RMSNorm --disable-bias-linear",
        )
        .unwrap();
        assert_eq!(s.model.position_embedding, PositionEmbedding::Rope);
        assert_eq!(s.model.normalization, Normalization::RMSNorm);
        assert!(!s.model.add_bias_linear && !s.model.add_qkv_bias);
        let s = settings("--use-rotary-position-embeddings --disable-bias-linear --add-qkv-bias")
            .unwrap();
        assert_eq!(s.model.position_embedding, PositionEmbedding::Rope);
        assert!(!s.model.add_bias_linear && s.model.add_qkv_bias);
        let s = settings("--position-embedding-type=none").unwrap();
        assert_eq!(s.model.position_embedding, PositionEmbedding::None);
        assert_eq!(
            settings("--position-embedding-type yarn")
                .unwrap()
                .model
                .position_embedding,
            PositionEmbedding::Rope
        );
        assert!(matches!(
            settings("--position-embedding-type relative"),
            Err(ArgsError::Unsupported { .. })
        ));
        assert!(matches!(
            settings("--no-position-embedding"),
            Err(ArgsError::Contradiction(_))
        ));
        assert!(settings("--no-position-embedding --position-embedding-type rope").is_ok());
    }

    #[test]
    fn max_positions_default_to_seq_length_and_must_cover_it() {
        let a = args("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 300 --vocab-size 10 --global-batch-size 1");
        let s = settings_from_megatron_args(&a, None, &[]).unwrap();
        assert_eq!(s.model.max_position_embeddings, 300);
        let text = contradiction_text("--seq-length 256");
        assert!(
            text.contains("--seq-length 256") && text.contains("--max-position-embeddings 128")
        );
        // Megatron checks it for rotary positions too.
        contradiction_text("--seq-length 256 --position-embedding-type rope");
    }

    #[test]
    fn vocabulary_from_tokenizers() {
        let base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --global-batch-size 1";
        let vocab = |extra: &str| {
            settings_from_megatron_args(&args(&format!("{base} {extra}")), None, &[])
                .map(|s| s.model.vocab_size)
        };
        assert_eq!(vocab("--tokenizer-type GPT2BPETokenizer"), Ok(50257));
        assert_eq!(
            vocab("--tokenizer-type GPT2BPETokenizer --vocab-size 7"),
            Ok(50257)
        );
        assert_eq!(
            vocab("--tokenizer-type NullTokenizer --vocab-size 1000"),
            Ok(1000)
        );
        assert!(matches!(
            vocab("--tokenizer-type NullTokenizer"),
            Err(ArgsError::Missing {
                option: "--vocab-size",
                ..
            })
        ));
        assert_eq!(
            vocab("--tokenizer-type Llama2Tokenizer --vocab-size 32000"),
            Ok(32000)
        );
        assert!(matches!(
            vocab("--tokenizer-type Llama2Tokenizer --tokenizer-model /t.model"),
            Err(ArgsError::UnknownVocabulary { .. })
        ));
        assert_eq!(
            vocab(
                "--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Llama-2-7b-hf"
            ),
            Ok(32000)
        );
        assert_eq!(
            vocab("--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B"),
            Ok(128256)
        );
        assert!(matches!(
            vocab(""),
            Err(ArgsError::Missing {
                option: "--vocab-size",
                ..
            })
        ));
        assert_eq!(
            vocab("--vocab-size 5 --make-vocab-size-divisible-by 8"),
            Ok(5)
        );
        // A preset supplies the size a tokenizer file would.
        let s = settings_from_megatron_args(
            &args("--tokenizer-type Llama2Tokenizer --tokenizer-model /t.model"),
            Some("llama2-7b"),
            &[],
        )
        .unwrap();
        assert_eq!(s.model.vocab_size, 32000);
    }

    #[test]
    fn precision_flags() {
        assert_eq!(
            settings("--bf16").unwrap().training.precision,
            Precision::Bf16
        );
        assert_eq!(
            settings("--fp16").unwrap().training.precision,
            Precision::Fp16
        );
        let text = contradiction_text("--fp16 --bf16");
        assert!(text.contains("--fp16") && text.contains("--bf16"));
    }

    #[test]
    fn recomputation_like_megatron() {
        let r = |extra: &str| settings(extra).map(|s| s.training.recompute);
        assert_eq!(r("--recompute-activations"), Ok(Recompute::Selective));
        assert_eq!(
            r("--recompute-granularity selective"),
            Ok(Recompute::Selective)
        );
        assert_eq!(
            r("--recompute-granularity full --recompute-method block --recompute-num-layers 2"),
            Ok(Recompute::Full {
                method: RecomputeMethod::Block,
                num_layers: 2
            })
        );
        // --recompute-activations wins over --recompute-granularity full (arguments.py 589).
        assert_eq!(
            r("--recompute-granularity full --recompute-activations"),
            Ok(Recompute::Selective)
        );
        for bad in [
            "--recompute-method uniform",
            "--recompute-num-layers 1",
            "--recompute-granularity selective --recompute-method uniform",
            "--recompute-activations --recompute-num-layers 1",
            "--recompute-granularity full",
            "--recompute-granularity full --recompute-method uniform",
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 3",
        ] {
            let text = contradiction_text(bad);
            assert!(text.contains("--recompute"), "{bad}: {text}");
        }
    }

    #[test]
    fn batch_sizes() {
        let s = settings("--micro-batch-size 4").unwrap();
        assert_eq!(
            (s.training.global_batch_size, s.training.micro_batch_size),
            (8, 4)
        );
        let text = contradiction_text("--micro-batch-size 3");
        assert!(text.contains("--global-batch-size 8") && text.contains("--micro-batch-size 3"));
        // Without a global batch: Megatron's micro × dp once dp is pinned, else an error.
        let a = args("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --vocab-size 10 --micro-batch-size 2");
        let err = settings_from_megatron_args(&a, None, &[]).unwrap_err();
        assert!(matches!(
            err,
            ArgsError::Missing {
                option: "--global-batch-size",
                ..
            }
        ));
        assert!(err.to_string().contains("--pin dp=N"), "{err}");
        let s = settings_from_megatron_args(&a, None, &[Pin::DataParallel(8)]).unwrap();
        assert_eq!(s.training.global_batch_size, 16);
    }

    #[test]
    fn parallel_hints_and_virtual_stages() {
        let t = |extra: &str| {
            settings(&format!("--num-layers 8 {extra}")).map(|s| {
                (
                    s.training.tensor_parallel,
                    s.training.pipeline_parallel,
                    s.training.virtual_pipeline,
                )
            })
        };
        assert_eq!(
            t("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4"),
            Ok((2, 4, None))
        );
        assert_eq!(
            t("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2"),
            Ok((1, 2, Some(2)))
        );
        assert_eq!(
            t("--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2"),
            Ok((1, 4, Some(2)))
        );
        // One virtual stage per rank is no interleaving.
        assert_eq!(
            t("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 4"),
            Ok((1, 2, None))
        );
        for bad in [
            "--pipeline-model-parallel-size 3",
            "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3",
            "--num-virtual-stages-per-pipeline-rank 2",
            "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --no-overlap-p2p-communication",
            "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --num-layers-per-virtual-pipeline-stage 2",
            "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 3",
        ] {
            assert!(matches!(t(bad), Err(ArgsError::Contradiction(_))), "{bad}");
        }
    }

    #[test]
    fn sequence_parallel_at_tp1_is_kept_as_intent() {
        let s = settings("--sequence-parallel --use-distributed-optimizer").unwrap();
        assert!(s.training.sequence_parallel && s.training.distributed_optimizer);
    }

    #[test]
    fn checkpoints_and_iterations() {
        let s = settings("--save /ck --load /ck --save-interval 100 --train-iters 5000").unwrap();
        assert_eq!(s.training.save.as_deref(), Some("/ck"));
        assert_eq!(s.training.load.as_deref(), Some("/ck"));
        assert_eq!(
            (s.training.save_interval, s.training.train_iters),
            (Some(100), Some(5000))
        );
        assert_eq!(
            settings("--persistent-save-interval 7")
                .unwrap()
                .training
                .save_interval,
            Some(7)
        );
        let text = contradiction_text("--save /ck");
        assert!(text.contains("--save-interval"));
    }

    #[test]
    fn unsupported_and_removed_options() {
        for extra in [
            "--num-experts 8",
            "--context-parallel-size 2",
            "--multi-latent-attention",
            "--qk-layernorm",
            "--padded-vocab-size 1024",
            "--decoder-first-pipeline-num-layers 1",
        ] {
            assert!(
                matches!(settings(extra), Err(ArgsError::Unsupported { .. })),
                "{extra}"
            );
        }
        // Values that leave the feature off are fine.
        assert!(settings(
            "--num-experts 0 --context-parallel-size 1 --expert-model-parallel-size=1"
        )
        .is_ok());
        let text = contradiction_text("--batch-size 4");
        assert!(text.contains("--micro-batch-size"));
        contradiction_text("--checkpoint-activations");
    }

    #[test]
    fn absurd_sizes_are_refused() {
        let text = contradiction_text(
            "--hidden-size 4000000000000 --num-attention-heads 1 --num-layers 100000",
        );
        assert!(text.contains("too large"), "{text}");
    }

    #[test]
    fn preset_values_are_defaults_the_user_overrides() {
        let s = settings_from_megatron_args(&[], Some("llama2-7b"), &[]).unwrap();
        assert_eq!(s.model.preset.as_deref(), Some("llama2-7b"));
        assert_eq!((s.model.num_layers, s.model.seq_length), (32, 4096));
        let a = args(
            "--num-layers 4 --seq-length 2048 --fp16 --micro-batch-size 2 --global-batch-size 64",
        );
        let s = settings_from_megatron_args(&a, Some("llama2-7b"), &[]).unwrap();
        assert_eq!(
            (s.model.num_layers, s.model.seq_length, s.model.hidden_size),
            (4, 2048, 4096)
        );
        assert_eq!(s.training.precision, Precision::Fp16);
        assert_eq!(
            (s.training.micro_batch_size, s.training.global_batch_size),
            (2, 64)
        );
        // Longer sequences than the preset's positions need more positions, as in Megatron.
        let err = settings_from_megatron_args(&args("--seq-length 8192"), Some("llama2-7b"), &[]);
        assert!(matches!(err, Err(ArgsError::Contradiction(_))));
        let a = args("--seq-length 8192 --max-position-embeddings 8192");
        assert!(settings_from_megatron_args(&a, Some("llama2-7b"), &[]).is_ok());
        // The user's vocabulary replaces the preset's.
        let a = args("--tokenizer-type NullTokenizer --vocab-size 1000");
        let s = settings_from_megatron_args(&a, Some("gpt3-1.3b"), &[]).unwrap();
        assert_eq!(s.model.vocab_size, 1000);
        let err = settings_from_megatron_args(&[], Some("gpt-5"), &[]).unwrap_err();
        assert!(matches!(err, ArgsError::UnknownPreset { .. }));
        assert!(err.to_string().contains("gpt3-1.3b"));
    }

    #[test]
    fn parses_pins() {
        assert_eq!(
            parse_pins("tp,pp=2, dp=8 ,mbs=1,vpp,sp=false,recompute=selective,dist-opt=on"),
            Ok(vec![
                Pin::TensorParallel(None),
                Pin::PipelineParallel(Some(2)),
                Pin::DataParallel(8),
                Pin::MicroBatch(Some(1)),
                Pin::VirtualPipeline(None),
                Pin::SequenceParallel(Some(false)),
                Pin::Recompute(Some(Recompute::Selective)),
                Pin::DistributedOptimizer(Some(true)),
            ])
        );
        assert_eq!(
            parse_pins("all,dp=4"),
            Ok(vec![Pin::All, Pin::DataParallel(4)])
        );
        assert_eq!(
            parse_pins("recompute=full:block:2"),
            Ok(vec![Pin::Recompute(Some(Recompute::Full {
                method: RecomputeMethod::Block,
                num_layers: 2
            }))])
        );
        for bad in [
            "",
            "tp,",
            "dp",
            "tp=0",
            "tp=x",
            "zz",
            "tp,tp=2",
            "all=1",
            "sp=maybe",
            "recompute=full:uniform",
            "recompute=full:fast:1",
            "recompute=full:block:0",
        ] {
            assert!(
                matches!(parse_pins(bad), Err(ArgsError::BadPin { .. })),
                "{bad:?}"
            );
        }
        let text = parse_pins("tensor=2").unwrap_err().to_string();
        assert!(text.contains("tp, pp, dp"), "{text}");
        for pin in parse_pins("tp=2,pp,dp=8,recompute=full:uniform:1,sp=true,all,vpp=1").unwrap() {
            assert_eq!(parse_pins(&pin.to_string()), Ok(vec![pin]));
        }
        let full = parse_pins("recompute=full").unwrap();
        assert_eq!(full[0].to_string(), "recompute=full");
    }

    #[test]
    fn pins_take_values_from_the_args() {
        let extra =
            "--num-layers 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 \
                     --micro-batch-size 2 --sequence-parallel --recompute-activations";
        let a = args(&format!("{TINY} {extra}"));
        let c = settings_from_megatron_args(
            &a,
            None,
            &parse_pins("tp,pp,mbs,sp,recompute,dist-opt").unwrap(),
        )
        .unwrap()
        .constraints;
        assert_eq!(c.tensor_parallel, Some(2));
        assert_eq!(c.pipeline_parallel, Some(4));
        assert_eq!(c.micro_batch_size, Some(2));
        assert_eq!(c.sequence_parallel, Some(true));
        assert_eq!(c.recompute, Some(Recompute::Selective));
        assert_eq!(c.distributed_optimizer, Some(false));
        assert_eq!((c.data_parallel, c.virtual_pipeline), (None, None));
        // Explicit values win over the args.
        let c =
            settings_from_megatron_args(&a, None, &parse_pins("tp=4,dp=2,recompute=full").unwrap())
                .unwrap()
                .constraints;
        assert_eq!((c.tensor_parallel, c.data_parallel), (Some(4), Some(2)));
        assert_eq!(
            c.recompute,
            Some(Recompute::Full {
                method: RecomputeMethod::Uniform,
                num_layers: 1
            })
        );
        // `all` pins everything the args say, with Megatron's defaults for the rest.
        let c = settings_from_megatron_args(&a, None, &[Pin::All, Pin::DataParallel(1)])
            .unwrap()
            .constraints;
        assert_eq!(
            c,
            Constraints {
                tensor_parallel: Some(2),
                pipeline_parallel: Some(4),
                data_parallel: Some(1),
                micro_batch_size: Some(2),
                virtual_pipeline: Some(1),
                sequence_parallel: Some(true),
                recompute: Some(Recompute::Selective),
                distributed_optimizer: Some(false),
            }
        );
    }

    #[test]
    fn pins_the_args_do_not_give_are_errors() {
        for (pin, key) in [
            ("tp", "tp"),
            ("pp", "pp"),
            ("mbs", "mbs"),
            ("vpp", "vpp"),
            ("all", "all"),
        ] {
            let err = settings_from_megatron_args(&args(TINY), None, &parse_pins(pin).unwrap())
                .unwrap_err();
            assert!(
                matches!(err, ArgsError::PinWithoutValue { key: k, .. } if k == key),
                "{pin}: {err}"
            );
        }
    }

    #[test]
    fn pinned_values_megatron_would_refuse() {
        let a = args(&format!("{TINY} --num-layers 6"));
        for (pins, what) in [
            ("tp=3", "--num-attention-heads 4"),
            ("pp=4", "--num-layers 6"),
            ("pp=2,vpp=2", "vpp=2"),
            ("mbs=3", "--global-batch-size 8"),
            ("dp=3", "--global-batch-size 8"),
            ("dp=2,mbs=8", "mbs=8"),
        ] {
            match settings_from_megatron_args(&a, None, &parse_pins(pins).unwrap()) {
                Err(ArgsError::Contradiction(text)) => {
                    assert!(text.contains(what), "{pins}: {text}")
                }
                other => panic!("{pins}: {other:?}"),
            }
        }
        let gqa = args(&format!(
            "{TINY} --num-attention-heads 8 --group-query-attention --num-query-groups 2"
        ));
        assert!(settings_from_megatron_args(&gqa, None, &parse_pins("tp=4").unwrap()).is_ok());
        assert!(settings_from_megatron_args(&gqa, None, &parse_pins("tp=8").unwrap()).is_ok());
    }

    #[test]
    fn error_messages_are_one_line() {
        let cases = [
            "--fp16 --bf16",
            "--num-attention-heads 6",
            "--seq-length 999",
            "--micro-batch-size 3",
            "--recompute-granularity full",
            "--num-experts 4",
            "--num-layers x",
        ];
        for extra in cases {
            let text = settings(extra).unwrap_err().to_string();
            assert!(!text.contains('\n') && !text.is_empty(), "{extra}: {text}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_any_words(words in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::sample::select(OPTIONS.iter().map(|(n, _, _)| format!("--{n}")).collect::<Vec<_>>()),
                "[-+=_a-zA-Z0-9]{0,12}",
                proptest::sample::select(vec!["0".to_string(), "1".into(), "18446744073709551615".into(), "--".into(), "-1".into(), "=".into()]),
            ],
            0..24,
        )) {
            let _ = settings_from_megatron_args(&words, None, &[]);
            let _ = settings_from_megatron_args(&words, Some("gpt3-1.3b"), &[Pin::All]);
            let _ = parse_pins(&words.join(","));
        }
    }
}
