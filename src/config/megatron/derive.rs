//! From what the arguments say to [`ModelSpec`] and [`TrainingSettings`]: Megatron's
//! defaults and derivations, and the checks Megatron (or pipette, where it is stricter)
//! makes of them. See the parent module for the rules and their sources.

use super::read::{Granularity, RawArgs, Vocabulary};
use super::{contradiction, ArgsError};
use crate::config::{
    presets, LowBits, LowPrecision, ModelSpec, Normalization, PositionEmbedding, Precision,
    Recompute, TrainingSettings,
};

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

pub(super) fn model_spec(
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
                    m.megatron_name()
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
                    m.megatron_name()
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

/// The largest global batch (sequences per step) accepted: larger is a typing mistake, and
/// would only make the planner's search long.
const MAX_GLOBAL_BATCH: u64 = 1 << 24;

pub(super) fn training_settings(
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
    if global_batch_size > MAX_GLOBAL_BATCH {
        return Err(contradiction(format!(
            "--global-batch-size {global_batch_size} is over {MAX_GLOBAL_BATCH} (2^24) sequences, a cap no cluster's step reaches: give the global batch in sequences (e.g. 1024)"
        )));
    }
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
        low_precision: low_precision(raw)?,
    })
}

/// `--fp8-*` / `--fp4-*`, with Megatron's own rules (validate_args: not both formats; a
/// recipe or param gather without its format).
fn low_precision(raw: &RawArgs) -> Result<Option<LowPrecision>, ArgsError> {
    let lone = |option: &str, format: &str| {
        Err(contradiction(format!(
            "{option} is given without {format} (Megatron ignores or refuses it: add {format} \
             or drop {option})"
        )))
    };
    match (&raw.fp8_format, &raw.fp4_format) {
        (Some(_), Some(_)) => Err(contradiction(
            "--fp8-format and --fp4-format are both given (Megatron refuses: choose one)"
                .to_string(),
        )),
        (Some(format), None) => Ok(Some(LowPrecision {
            bits: LowBits::Fp8,
            format: format.clone(),
            recipe: raw.fp8_recipe.clone().unwrap_or_else(|| "delayed".into()),
            param_gather: raw.fp8_param_gather,
        })),
        (None, Some(format)) => Ok(Some(LowPrecision {
            bits: LowBits::Fp4,
            format: format.clone(),
            recipe: raw.fp4_recipe.clone().unwrap_or_else(|| "nvfp4".into()),
            param_gather: raw.fp4_param_gather,
        })),
        (None, None) if raw.fp4_param_gather => lone("--fp4-param-gather", "--fp4-format"),
        (None, None) => Ok(None),
    }
}
