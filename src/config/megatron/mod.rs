//! Megatron's arguments: reads the arguments after SCRIPT into [`Settings`].
//!
//! Files, one job each: [`options`] is the one table of Megatron's options (shared with
//! the rewriting in `render::megatron`), [`argparse`] groups words as argparse does,
//! `read` reads them into what they say, `derive` applies Megatron's defaults and
//! derivations, `pins` reads `--pin` into constraints, [`typos`] finds near misses of the
//! options pipette reads.
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
//! Mixture of experts (`--num-experts`, `--moe-*`, `--moe-layer-freq` lists), multi-latent
//! attention, multi-token prediction, QK norms, `--recompute-modules` and the user's uneven
//! stages are read into typed settings, and all of them plan: the planner chooses the
//! expert layout (`ep`, `etp`) with the rest. Options that change the model in ways the cost
//! models do not cover (context parallelism, hybrid Mamba stacks, latent MoE, ...) give
//! [`ArgsError::Unmodelled`]: `pipette-run` then launches the script with planning off, as
//! torchrun would ([`crate::config::planning_off`]), rather than plan it wrongly.

pub mod argparse;
mod derive;
mod layer_freq;
pub mod options;
mod pins;
mod read;
pub mod typos;

pub use pins::{expert_pins_of_args, parse_pins, Pin};

use super::{presets, ModelSpec, Settings};
use derive::{model_spec, training_settings};
use pins::constraints;
use read::{merge, read_args, vocabulary, Vocabulary};

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
    /// An option the planner does not model yet: `pipette-run` launches such a script
    /// with planning off ([`crate::config::planning_off`]); planning commands stop here.
    #[error("{option} is not modelled by the planner yet ({what}): pipette-run launches the script with planning off; to plan, drop it")]
    Unmodelled { option: String, what: &'static str },
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

/// The options that make the arguments after SCRIPT Megatron's: the model's shape, which
/// Megatron requires and no other launcher's script is likely to spell this way.
/// pipette-run plans only when one of them is given (or `--model`); see
/// [`model_arguments_given`].
pub const MODEL_ARGUMENTS: &[&str] = &["--num-layers", "--hidden-size", "--num-attention-heads"];

/// Whether the arguments give one of [`MODEL_ARGUMENTS`] (dashed, as Megatron spells
/// them; `--opt value` or `--opt=value`; before any `--`).
pub fn model_arguments_given(args: &[String]) -> bool {
    argparse::arg_words(args).iter().any(|word| {
        word.written_name(args)
            .is_some_and(|name| MODEL_ARGUMENTS.contains(&format!("--{name}").as_str()))
    })
}

pub(super) fn contradiction(message: String) -> ArgsError {
    ArgsError::Contradiction(message)
}

/// Reads Megatron arguments (everything after SCRIPT) into [`Settings`].
///
/// With `preset`, the preset's arguments are the defaults and the user's override them.
/// `pins` (from `--pin`, see [`parse_pins`]) become [`Settings::constraints`].
pub fn settings_from_megatron_args(
    args: &[String],
    preset: Option<&str>,
    pins: &[Pin],
) -> Result<Settings, ArgsError> {
    read_settings(args, preset, pins)
}

/// The model the arguments describe: what parameter counting needs.
pub fn model_from_megatron_args(
    args: &[String],
    preset: Option<&str>,
) -> Result<ModelSpec, ArgsError> {
    read_settings(args, preset, &[]).map(|s| s.model)
}

/// Everything the arguments say.
fn read_settings(
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
    if let Some((option, what)) = raw.unmodelled.first() {
        return Err(ArgsError::Unmodelled {
            option: option.clone(),
            what,
        });
    }
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

#[cfg(test)]
mod tests;
