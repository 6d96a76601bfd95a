//! The model and training settings of a run, read from the user's own Megatron
//! arguments (everything after SCRIPT) or from a preset (`--model NAME`).
//!
//! Owns: the Megatron argument vocabulary we understand, Megatron's defaults and
//! derivations (ffn size, kv channels, vocabulary padding), the presets, and which
//! parallel settings the user pinned; whether the script is Megatron's at all
//! ([`planning_off`]); what a DeepSpeed config the arguments name says about batch sizes
//! ([`deepspeed`]). Must not touch the cluster or plan anything.

pub mod deepspeed;
pub mod megatron;
pub mod moe;
pub mod presets;

pub use megatron::{settings_from_megatron_args, ArgsError};
pub use moe::{Dispatcher, DropPolicy, LoadBalancing, MlaSpec, MoeSpec, RecomputeModule};

/// Why pipette-run does not plan a script, in one line; `None` when it plans: `--model`
/// is given, or the arguments after SCRIPT give one of Megatron's model arguments
/// ([`megatron::MODEL_ARGUMENTS`]). Without either, the script is not one pipette-run
/// understands (an FSDP, DeepSpeed, Lightning or plain DDP script): it is launched as
/// torchrun would launch it, its arguments untouched.
pub fn planning_off(script_args: &[String], preset: Option<&str>) -> Option<String> {
    if preset.is_some() || megatron::model_arguments_given(script_args) {
        // A Megatron run the planner cannot model is launched as torchrun would launch it;
        // any other error in the arguments is the planned path's to report.
        return match settings_from_megatron_args(script_args, preset, &[]) {
            Err(ArgsError::Unmodelled { option, what }) => Some(format!(
                "planning is off: {option} ({what}) is not modelled by the planner yet, so the script runs as torchrun would run it, on the nodes found, its arguments untouched"
            )),
            _ => None,
        };
    }
    Some(format!(
        "planning is off: no --model and none of Megatron's model arguments ({}) after SCRIPT, so the script runs as torchrun would run it, on the nodes found, its arguments untouched",
        megatron::MODEL_ARGUMENTS.join(", ")
    ))
}

use serde::{Deserialize, Serialize};

/// Everything the planner needs to know about what is trained and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub model: ModelSpec,
    pub training: TrainingSettings,
    /// Parallel settings the user fixed; the planner searches only the rest.
    pub constraints: Constraints,
}

/// The architecture of a dense GPT- or Llama-style transformer, as Megatron builds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// The preset's name, when the model came from `--model`.
    pub preset: Option<String>,
    pub num_layers: u64,
    pub hidden_size: u64,
    pub ffn_hidden_size: u64,
    pub num_attention_heads: u64,
    /// Key/value heads: equal to the attention heads unless grouped-query attention is on.
    pub num_query_groups: u64,
    /// Width of one attention head (`hidden / heads` unless `--kv-channels` says otherwise).
    pub kv_channels: u64,
    pub seq_length: u64,
    pub max_position_embeddings: u64,
    /// The tokenizer's vocabulary before Megatron pads it.
    pub vocab_size: u64,
    /// Megatron pads the vocabulary to a multiple of this times the tensor-parallel size.
    pub make_vocab_size_divisible_by: u64,
    pub swiglu: bool,
    pub untie_embeddings_and_output_weights: bool,
    pub normalization: Normalization,
    /// Biases on the linear layers (`--disable-bias-linear` turns them off).
    pub add_bias_linear: bool,
    /// Bias on the QKV projection (follows `add_bias_linear` unless `--add-qkv-bias`).
    pub add_qkv_bias: bool,
    pub position_embedding: PositionEmbedding,
    /// Routed experts (`--num-experts`); `None` for a dense model.
    #[serde(default)]
    pub moe: Option<MoeSpec>,
    /// Multi-latent attention (`--multi-latent-attention`); `None` for standard attention.
    #[serde(default)]
    pub mla: Option<MlaSpec>,
    /// Multi-token prediction layers after the decoder (`--mtp-num-layers`), on the last
    /// pipeline stage.
    #[serde(default)]
    pub mtp_layers: u64,
    /// `--qk-layernorm`: a norm over each query and key head (Qwen3, OLMo 2).
    #[serde(default)]
    pub qk_layernorm: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Normalization {
    LayerNorm,
    RMSNorm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PositionEmbedding {
    /// Learned absolute positions (`learned_absolute`): a `max_positions × hidden` table.
    LearnedAbsolute,
    Rope,
    None,
}

/// How the run trains: batch sizes, precision, memory-saving options, checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingSettings {
    pub global_batch_size: u64,
    /// The user's micro-batch; a hint unless pinned.
    pub micro_batch_size: u64,
    pub precision: Precision,
    pub recompute: Recompute,
    pub sequence_parallel: bool,
    pub distributed_optimizer: bool,
    pub train_iters: Option<u64>,
    pub save: Option<String>,
    pub load: Option<String>,
    pub save_interval: Option<u64>,
    /// `--ckpt-format` and `--dist-ckpt-optim-fully-reshardable`: whether a re-plan may
    /// reshard the checkpoints. Read with the arguments, never shown (the arguments say it).
    #[serde(skip)]
    pub checkpoint: CheckpointFormat,
    /// The parallel sizes the user wrote (hints unless pinned).
    pub tensor_parallel: u64,
    pub pipeline_parallel: u64,
    pub virtual_pipeline: Option<u64>,
    /// `--overlap-grad-reduce`: the gradient reduce overlaps the backward pass.
    #[serde(default)]
    pub overlap_grad_reduce: bool,
    /// `--overlap-param-gather`: the distributed optimizer's all-gather overlaps the forward.
    #[serde(default)]
    pub overlap_param_gather: bool,
    /// `--grad-reduce-in-bf16`: gradients are reduced in bf16 rather than fp32.
    #[serde(default)]
    pub grad_reduce_in_bf16: bool,
    /// `--tp-comm-overlap`: tensor-parallel collectives overlap the GEMMs (Transformer Engine).
    #[serde(default)]
    pub tp_comm_overlap: bool,
    /// `--recompute-modules`: what selective recomputation recomputes (Megatron's default
    /// is the core attention alone).
    #[serde(default = "default_recompute_modules")]
    pub recompute_modules: Vec<RecomputeModule>,
    /// `--expert-model-parallel-size` as written (a hint unless pinned).
    #[serde(default = "one")]
    pub expert_parallel: u64,
    /// `--expert-tensor-parallel-size` as written; `None` follows the tensor-parallel size.
    #[serde(default)]
    pub expert_tensor_parallel: Option<u64>,
    /// `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers` as
    /// written (hints: the plan writes its own split).
    #[serde(default)]
    pub first_stage_layers: Option<u64>,
    #[serde(default)]
    pub last_stage_layers: Option<u64>,
    /// `--fp8-format` / `--fp4-format` and their recipes: the linear layers' GEMMs run in
    /// FP8 or FP4 (Transformer Engine). The planner never changes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_precision: Option<LowPrecision>,
    /// `--context-parallel-size` as written (a hint unless pinned).
    #[serde(default = "one")]
    pub context_parallel: u64,
    /// `--cp-comm-type`: how context-parallel ranks exchange keys and values. The user's
    /// choice; the planner never changes it.
    #[serde(default)]
    pub cp_comm_type: CpCommType,
    /// `--hierarchical-context-parallel-sizes` (the a2a and p2p levels of `a2a+p2p`,
    /// innermost first); their product is the context-parallel size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hierarchical_context_parallel: Option<Vec<u64>>,
}

/// `--cp-comm-type` (Megatron's arguments.py; Transformer Engine's attention implements
/// each): `p2p` passes key/value chunks around a ring, overlapped with the attention of
/// the chunk in hand; `a2a` (Ulysses) trades the sequence split for a head split with two
/// all-to-alls; `allgather` gathers the whole keys and values first; `a2a+p2p` runs a2a
/// inside the first level of `--hierarchical-context-parallel-sizes` and p2p across.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CpCommType {
    #[default]
    #[serde(rename = "p2p")]
    P2p,
    #[serde(rename = "a2a")]
    A2a,
    #[serde(rename = "allgather")]
    Allgather,
    #[serde(rename = "a2a+p2p")]
    A2aP2p,
}

impl CpCommType {
    pub const ALL: [CpCommType; 4] = [
        CpCommType::P2p,
        CpCommType::A2a,
        CpCommType::Allgather,
        CpCommType::A2aP2p,
    ];

    /// The spelling Megatron takes.
    pub fn megatron_name(self) -> &'static str {
        match self {
            CpCommType::P2p => "p2p",
            CpCommType::A2a => "a2a",
            CpCommType::Allgather => "allgather",
            CpCommType::A2aP2p => "a2a+p2p",
        }
    }

    pub fn from_megatron_name(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.megatron_name() == word)
    }
}

fn default_recompute_modules() -> Vec<RecomputeModule> {
    vec![RecomputeModule::CoreAttn]
}

fn one() -> u64 {
    1
}

/// Low-precision GEMMs, as Megatron's `--fp8-*` / `--fp4-*` options say them (names as in
/// megatron-core's `TransformerConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LowPrecision {
    pub bits: LowBits,
    /// `--fp8-format` (`e4m3`, `hybrid`) or `--fp4-format` (`e2m1`).
    pub format: String,
    /// `--fp8-recipe` (`delayed`, the default, `tensorwise`, `blockwise`, `mxfp8`,
    /// `custom`) or `--fp4-recipe` (`nvfp4`, the default, `custom`).
    pub recipe: String,
    /// `--fp8-param-gather` / `--fp4-param-gather`: the weights are kept (and all-gathered)
    /// in the low precision only, so no second copy beside the 16-bit one.
    pub param_gather: bool,
    /// `--first-last-layers-bf16` with `--num-layers-at-start-in-bf16` and
    /// `--num-layers-at-end-in-bf16` (1 each by default): the model's first and last
    /// transformer layers keep their GEMMs, and their weights, in BF16 (megatron-core
    /// `fp8_utils.is_first_last_bf16_layer`, counting global layer numbers). 0 and 0
    /// without the flag.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bf16_layers_at_start: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bf16_layers_at_end: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl LowPrecision {
    /// How many of the `layers` consecutive transformer layers from global layer `start`,
    /// of a model of `total`, stay in BF16 ([`Self::bf16_layers_at_start`]): a pipeline
    /// stage's share of the first and last layers. Megatron counts the layers globally, so
    /// with virtual stages the first layers are still on the first stage and the last on
    /// the last.
    pub fn bf16_layers_in(&self, start: u64, layers: u64, total: u64) -> u64 {
        let end = start.saturating_add(layers).min(total);
        let head = self.bf16_layers_at_start.min(end).saturating_sub(start);
        // The tail starts after the head, so a layer in both is counted once.
        let tail_from = total
            .saturating_sub(self.bf16_layers_at_end)
            .max(self.bf16_layers_at_start)
            .max(start);
        (head + end.saturating_sub(tail_from)).min(layers)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LowBits {
    Fp8,
    Fp4,
}

impl LowBits {
    pub fn as_str(self) -> &'static str {
        match self {
            LowBits::Fp8 => "fp8",
            LowBits::Fp4 => "fp4",
        }
    }
}

impl TrainingSettings {
    /// A run with Megatron's defaults for everything but the global batch and precision:
    /// micro-batch 1, no recomputation, no sequence parallelism, no distributed optimizer,
    /// no overlap, no checkpoints, tp = pp = 1.
    pub fn new(global_batch_size: u64, precision: Precision) -> Self {
        TrainingSettings {
            global_batch_size,
            micro_batch_size: 1,
            precision,
            recompute: Recompute::None,
            sequence_parallel: false,
            distributed_optimizer: false,
            train_iters: None,
            save: None,
            load: None,
            save_interval: None,
            checkpoint: CheckpointFormat::default(),
            tensor_parallel: 1,
            pipeline_parallel: 1,
            virtual_pipeline: None,
            overlap_grad_reduce: false,
            overlap_param_gather: false,
            grad_reduce_in_bf16: false,
            tp_comm_overlap: false,
            recompute_modules: default_recompute_modules(),
            expert_parallel: 1,
            expert_tensor_parallel: None,
            first_stage_layers: None,
            last_stage_layers: None,
            low_precision: None,
            context_parallel: 1,
            cp_comm_type: CpCommType::P2p,
            hierarchical_context_parallel: None,
        }
    }
}

/// How the user's checkpoints are written: `--ckpt-format` and whether the distributed
/// optimizer's state is saved fully reshardable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointFormat {
    /// `torch_dist` unless the arguments say otherwise (Megatron's default).
    pub format: String,
    /// `--dist-ckpt-optim-fully-reshardable`.
    pub optimizer_fully_reshardable: bool,
}

impl Default for CheckpointFormat {
    /// Megatron's default: `torch_dist`, the optimizer's state reshardable across dp only.
    fn default() -> Self {
        CheckpointFormat {
            format: "torch_dist".to_string(),
            optimizer_fully_reshardable: false,
        }
    }
}

impl CheckpointFormat {
    /// Whether a checkpoint saved with (`distributed_optimizer`) or without the distributed
    /// optimizer loads under another tp/pp; `Err` says why not.
    pub fn reshards_tp_pp(&self, distributed_optimizer: bool) -> Result<(), String> {
        if !matches!(
            self.format.as_str(),
            "torch_dist" | "torch_dcp" | "fsdp_dtensor"
        ) {
            return Err(format!(
                "checkpoints in the {} format cannot be resharded to another tp/pp (use --ckpt-format torch_dist)",
                self.format
            ));
        }
        if distributed_optimizer && !self.optimizer_fully_reshardable {
            return Err(format!(
                "the distributed optimizer's state in {} checkpoints reshards only across dp unless saved with --dist-ckpt-optim-fully-reshardable",
                self.format
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Bf16,
    Fp16,
    Fp32,
}

/// Activation recomputation, as Megatron's `--recompute-*` options say it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "granularity", rename_all = "snake_case")]
pub enum Recompute {
    None,
    Selective,
    Full {
        method: RecomputeMethod,
        num_layers: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecomputeMethod {
    Uniform,
    Block,
}

impl RecomputeMethod {
    /// The word Megatron's `--recompute-method` takes (and `--pin recompute=full:WORD:N`).
    pub fn megatron_name(self) -> &'static str {
        match self {
            RecomputeMethod::Uniform => "uniform",
            RecomputeMethod::Block => "block",
        }
    }

    /// The method `--recompute-method WORD` names, if any.
    pub fn from_megatron_name(word: &str) -> Option<Self> {
        [RecomputeMethod::Uniform, RecomputeMethod::Block]
            .into_iter()
            .find(|m| m.megatron_name() == word)
    }
}

/// Parallel settings fixed by the user (`--pin`); `None` means "the planner chooses".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Constraints {
    pub tensor_parallel: Option<u64>,
    pub pipeline_parallel: Option<u64>,
    pub data_parallel: Option<u64>,
    pub micro_batch_size: Option<u64>,
    pub virtual_pipeline: Option<u64>,
    pub sequence_parallel: Option<bool>,
    pub recompute: Option<Recompute>,
    pub distributed_optimizer: Option<bool>,
    #[serde(default)]
    pub context_parallel: Option<u64>,
    /// `--pin ep=N`: the expert-parallel size (mixture-of-experts models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_parallel: Option<u64>,
    /// `--pin etp=N`: the expert tensor-parallel size (mixture-of-experts models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_tensor_parallel: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn planning_is_off_without_model_or_megatron_model_arguments() {
        for plain in [
            "",
            "--lr 0.1 --epochs 3",
            "--deepspeed_config ds.json --micro-batch-size 4 --seq-length 512",
            // Underscores are not Megatron's spelling: the script's own options.
            "--num_layers 4 --hidden_size 64",
            // After `--`, nothing is an option.
            "--lr 1 -- --num-layers 4",
        ] {
            let why = planning_off(&words(plain), None);
            let why = why.unwrap_or_else(|| panic!("{plain:?} should not be planned"));
            assert!(
                why.contains("--num-layers, --hidden-size, --num-attention-heads"),
                "{why}"
            );
        }
        for megatron in [
            "--num-layers 4",
            "--hidden-size=64 --lr 1",
            "--x --num-attention-heads 8",
        ] {
            assert_eq!(planning_off(&words(megatron), None), None, "{megatron}");
        }
        assert_eq!(planning_off(&words("--lr 1"), Some("gpt3-1.3b")), None);
    }

    #[test]
    fn planning_is_off_for_a_megatron_run_the_planner_cannot_model() {
        let base = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --vocab-size 100 --global-batch-size 8";
        let why = planning_off(&words(&format!("{base} --hybrid-layer-pattern M*M*")), None)
            .expect("a hybrid stack is not planned");
        assert!(
            why.contains("--hybrid-layer-pattern M*M* (hybrid models)"),
            "{why}"
        );
        assert!(!why.contains("launch with torchrun"), "{why}");
        assert_eq!(why.lines().count(), 1);
        // Arguments with a mistake are the planned path's to report, not a reason to skip it.
        assert_eq!(
            planning_off(&words(&format!("{base} --fp16 --bf16")), None),
            None
        );
        assert_eq!(planning_off(&words(base), None), None);
    }
}
