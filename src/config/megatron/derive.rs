//! From what the arguments say to [`ModelSpec`] and [`TrainingSettings`]: Megatron's
//! defaults and derivations, and the checks Megatron (or pipette, where it is stricter)
//! makes of them. See the parent module for the rules and their sources.

use super::read::{Granularity, RawArgs, Vocabulary};
use super::{contradiction, ArgsError};
use crate::config::{
    presets, CheckpointFormat, CpCommType, Dispatcher, DropPolicy, LoadBalancing, LowBits,
    LowPrecision, MlaSpec, ModelSpec, MoeSpec, Normalization, PositionEmbedding, Precision,
    Recompute, RecomputeModule, TrainingSettings,
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
    if num_layers > MAX_LAYERS {
        return Err(contradiction(format!(
            "--num-layers {num_layers} is over {MAX_LAYERS} (2^16), a cap no model reaches: check the number"
        )));
    }
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
        moe: moe(raw, num_layers, ffn_hidden_size)?,
        mla: mla(raw)?,
        mtp_layers: raw.mtp_num_layers.unwrap_or(0),
        qk_layernorm: raw.qk_layernorm,
    };
    if !fits_in_u64(&spec) {
        return Err(contradiction(format!(
            "the model is too large to count (--num-layers {num_layers}, --hidden-size {hidden}, vocabulary {vocab_size}): check the sizes"
        )));
    }
    Ok(spec)
}

/// The expert layers, with Megatron's defaults (TransformerConfig: top-2, the allgather
/// dispatcher, aux-loss balancing, dropless, `--moe-ffn-hidden-size` = `--ffn-hidden-size`,
/// arguments.py 1595-1596; every layer MoE).
fn moe(raw: &RawArgs, num_layers: u64, ffn: u64) -> Result<Option<MoeSpec>, ArgsError> {
    let Some(num_experts) = raw.num_experts else {
        if let Some(ep) = raw.expert_parallel.filter(|ep| *ep > 1) {
            return Err(contradiction(format!(
                "--expert-model-parallel-size {ep} needs --num-experts (Megatron refuses expert parallelism without experts: add --num-experts or drop it)"
            )));
        }
        return Ok(None);
    };
    let router_topk = raw.moe_router_topk.unwrap_or(2);
    if router_topk > num_experts {
        return Err(contradiction(format!(
            "--moe-router-topk {router_topk} is more than --num-experts {num_experts} (each token goes to top-k distinct experts: lower the top-k)"
        )));
    }
    let layers = match &raw.moe_layer_freq {
        None => vec![true; num_layers as usize],
        Some(freq) => freq.layers(num_layers).ok_or_else(|| {
            contradiction(format!(
                "--moe-layer-freq gives a pattern that is not one 0 or 1 per layer of --num-layers {num_layers} (Megatron requires the pattern's length to be the number of layers: fix the pattern)"
            ))
        })?,
    };
    if let Some(why) = moe_rule_error(raw) {
        return Err(contradiction(why));
    }
    Ok(Some(MoeSpec {
        num_experts,
        router_topk,
        ffn_hidden_size: raw.moe_ffn_hidden_size.unwrap_or(ffn),
        shared_expert_ffn: raw.moe_shared_expert_intermediate_size,
        shared_expert_overlap: raw.moe_shared_expert_overlap,
        layers,
        grouped_gemm: raw.moe_grouped_gemm,
        dispatcher: raw.moe_dispatcher.unwrap_or(Dispatcher::Allgather),
        load_balancing: raw.moe_load_balancing.unwrap_or(LoadBalancing::AuxLoss),
        capacity_factor: raw.moe_capacity_factor,
        pad_to_capacity: raw.moe_pad_to_capacity,
        drop_policy: raw.moe_drop_policy.unwrap_or(DropPolicy::Probs),
        expert_bias: raw.moe_expert_bias,
    }))
}

/// Megatron's rules on the MoE options among themselves and with linear biases, which it
/// applies before the first step (megatron-core 0.19.2): TransformerConfig's
/// `__post_init__` (transformer_config.py 1644-1690, 2283-2292), SharedExpertMLP
/// (moe/shared_experts.py 124) and TEGroupedMLP (moe/experts.py 204-206, 827-848). The
/// layout rules (ep, etp, sequence parallelism) are the planner's ([`crate::plan::experts`]).
fn moe_rule_error(raw: &RawArgs) -> Option<String> {
    let bias = !raw.disable_bias_linear;
    let dispatcher = raw.moe_dispatcher.unwrap_or(Dispatcher::Allgather);
    let balancing = raw.moe_load_balancing.unwrap_or(LoadBalancing::AuxLoss);
    let shared = raw.moe_shared_expert_intermediate_size.is_some();
    if shared && raw.moe_shared_expert_overlap && dispatcher == Dispatcher::Allgather {
        return Some("--moe-shared-expert-overlap needs --moe-token-dispatcher-type alltoall or flex, the dispatcher is allgather (Megatron refuses it: change the dispatcher or drop the overlap)".to_string());
    }
    if raw.moe_capacity_factor.is_some()
        && (balancing == LoadBalancing::Sinkhorn || raw.moe_sinkhorn_listed)
    {
        return Some("--moe-expert-capacity-factor with sinkhorn load balancing (Megatron drops tokens only under aux_loss, seq_aux_loss, global_aux_loss or none: change --moe-router-load-balancing-type or drop the capacity factor)".to_string());
    }
    if raw.moe_pad_to_capacity && raw.moe_capacity_factor.is_none() {
        return Some("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor (Megatron refuses to pad to a capacity it does not have: add the factor or drop the padding)".to_string());
    }
    let score = raw.moe_score_function.as_deref().unwrap_or("softmax");
    if raw.moe_expert_bias && !matches!(score, "sigmoid" | "sqrtsoftplus") {
        return Some(format!("--moe-router-enable-expert-bias with the {score} score function (Megatron's aux-loss-free expert bias needs --moe-router-score-function sigmoid or sqrtsoftplus: add one, or drop the expert bias)"));
    }
    if bias && shared {
        return Some("--moe-shared-expert-intermediate-size with linear biases (Megatron's shared experts have no bias: add --disable-bias-linear)".to_string());
    }
    if bias && raw.moe_grouped_gemm && !raw.no_bias_dropout_fusion {
        return Some("--moe-grouped-gemm with linear biases and the bias-dropout fusion (Megatron's grouped experts refuse the fusion with biases: add --disable-bias-linear or --no-bias-dropout-fusion)".to_string());
    }
    if bias && raw.moe_grouped_gemm && !raw.swiglu && !raw.no_bias_gelu_fusion {
        return Some("--moe-grouped-gemm with linear biases, GeLU and the bias-GeLU fusion (Megatron's grouped experts fuse bias and activation for SwiGLU only: add --swiglu, --disable-bias-linear or --no-bias-gelu-fusion)".to_string());
    }
    None
}

/// Multi-latent attention with Megatron's defaults (arguments.py `_add_mla_args`).
fn mla(raw: &RawArgs) -> Result<Option<MlaSpec>, ArgsError> {
    if !raw.multi_latent_attention {
        return Ok(None);
    }
    if raw.group_query_attention {
        return Err(contradiction(
            "--multi-latent-attention and --group-query-attention are both given (Megatron refuses grouped-query with multi-latent attention: drop one)".to_string(),
        ));
    }
    if raw.qk_layernorm && raw.q_lora_rank.is_none() {
        // MLASelfAttention (megatron-core 0.19.2) refuses a query norm it would not use.
        return Err(contradiction(
            "--qk-layernorm with --multi-latent-attention needs --q-lora-rank (Megatron refuses a query norm without the query's low-rank latent: add --q-lora-rank or drop --qk-layernorm)".to_string(),
        ));
    }
    Ok(Some(MlaSpec {
        q_lora_rank: raw.q_lora_rank,
        kv_lora_rank: raw.kv_lora_rank.unwrap_or(32),
        qk_head_dim: raw.qk_head_dim.unwrap_or(128),
        qk_pos_emb_head_dim: raw.qk_pos_emb_head_dim.unwrap_or(64),
        v_head_dim: raw.v_head_dim.unwrap_or(128),
    }))
}

/// `--recompute-modules` under TransformerConfig's rules (transformer_config.py 1763-1817):
/// `core_attn` alone by default; `moe_act` only with grouped GEMMs, `mla_up_proj` only with
/// multi-latent attention, `shared_experts` not with the shared-expert overlap.
fn recompute_modules(raw: &RawArgs, model: &ModelSpec) -> Result<Vec<RecomputeModule>, ArgsError> {
    let Some(modules) = raw.recompute_modules.clone() else {
        return Ok(vec![RecomputeModule::CoreAttn]);
    };
    let moe = model.moe.as_ref();
    for m in &modules {
        let refused = match m {
            RecomputeModule::MoeAct => {
                (!moe.is_some_and(|m| m.grouped_gemm)).then_some("moe_act needs --moe-grouped-gemm")
            }
            RecomputeModule::MlaUpProj => model
                .mla
                .is_none()
                .then_some("mla_up_proj needs --multi-latent-attention"),
            RecomputeModule::SharedExperts => moe
                .is_some_and(|m| m.shared_expert_ffn.is_some() && m.shared_expert_overlap)
                .then_some("shared_experts cannot be recomputed with --moe-shared-expert-overlap"),
            _ => None,
        };
        if let Some(why) = refused {
            return Err(contradiction(format!(
                "--recompute-modules {}: {why} (Megatron refuses it: drop the module or add what it needs)",
                m.megatron_name()
            )));
        }
    }
    Ok(modules)
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
    let uneven = raw.first_stage_layers.is_some() || raw.last_stage_layers.is_some();
    if uneven {
        return uneven_virtual_pipeline(raw, num_layers, pp);
    }
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

/// The most transformer layers accepted: per-stage and per-layer lists are sized by it, so
/// a typing mistake must not reach them.
const MAX_LAYERS: u64 = 1 << 16;

/// Virtual stages with `--decoder-first/last-pipeline-num-layers`: Megatron then needs
/// `--num-virtual-stages-per-pipeline-rank` for interleaving (arguments.py 921-923) and
/// checks no divisibility itself; we check that the named stages leave layers for the rest.
fn uneven_virtual_pipeline(
    raw: &RawArgs,
    num_layers: u64,
    pp: u64,
) -> Result<Option<u64>, ArgsError> {
    if let Some(l) = raw.layers_per_virtual_stage {
        return Err(contradiction(format!(
            "--num-layers-per-virtual-pipeline-stage {l} cannot be used with --decoder-first/last-pipeline-num-layers (Megatron refuses it: use --num-virtual-stages-per-pipeline-rank)"
        )));
    }
    let named = raw
        .first_stage_layers
        .unwrap_or(0)
        .saturating_add(raw.last_stage_layers.unwrap_or(0));
    let named_stages =
        u64::from(raw.first_stage_layers.is_some()) + u64::from(raw.last_stage_layers.is_some());
    if named > num_layers || (named_stages >= pp && named != num_layers) {
        return Err(contradiction(format!(
            "--decoder-first/last-pipeline-num-layers name {named} layers of --num-layers {num_layers} on {named_stages} of --pipeline-model-parallel-size {pp} stages: the stages must hold exactly the layers"
        )));
    }
    Ok(raw.virtual_stages_per_rank.filter(|v| *v > 1))
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
    context_parallel_rules(raw)?;
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
        checkpoint: CheckpointFormat {
            format: raw
                .ckpt_format
                .clone()
                .unwrap_or_else(|| CheckpointFormat::default().format),
            optimizer_fully_reshardable: raw.dist_ckpt_optim_fully_reshardable,
        },
        tensor_parallel,
        pipeline_parallel,
        virtual_pipeline: virtual_pipeline(raw, model.num_layers, pipeline_parallel)?,
        overlap_grad_reduce: raw.overlap_grad_reduce,
        overlap_param_gather: raw.overlap_param_gather,
        grad_reduce_in_bf16: raw.grad_reduce_in_bf16,
        tp_comm_overlap: raw.tp_comm_overlap,
        recompute_modules: recompute_modules(raw, model)?,
        expert_parallel: raw.expert_parallel.unwrap_or(1),
        expert_tensor_parallel: raw.expert_tensor_parallel,
        first_stage_layers: raw.first_stage_layers,
        last_stage_layers: raw.last_stage_layers,
        low_precision: low_precision(raw)?,
        context_parallel: raw.context_parallel.unwrap_or(1),
        cp_comm_type: raw.cp_comm_type.unwrap_or_default(),
        hierarchical_context_parallel: raw.hierarchical_context_parallel.clone(),
    })
}

/// Megatron's rules for the context-parallel options (arguments.py validate_args):
/// `a2a+p2p` needs `--hierarchical-context-parallel-sizes`, whose product is then the
/// context-parallel size.
fn context_parallel_rules(raw: &RawArgs) -> Result<(), ArgsError> {
    let comm = raw.cp_comm_type.unwrap_or_default();
    match &raw.hierarchical_context_parallel {
        None if comm == CpCommType::A2aP2p => Err(contradiction(
            "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A P (Megatron refuses it without: give the a2a and p2p sizes, whose product is the context-parallel size)".to_string(),
        )),
        Some(sizes) => {
            let product = sizes.iter().try_fold(1u64, |p, s| p.checked_mul(*s));
            match (product, raw.context_parallel) {
                (None, _) => Err(contradiction(format!(
                    "--hierarchical-context-parallel-sizes {sizes:?} multiply past any GPU count: check them"
                ))),
                (Some(p), Some(cp)) if p != cp => Err(contradiction(format!(
                    "--hierarchical-context-parallel-sizes multiply to {p}, --context-parallel-size is {cp} (Megatron requires them equal: fix one)"
                ))),
                _ => Ok(()),
            }
        }
        None => Ok(()),
    }
}

/// `--fp8-*` / `--fp4-*`, with Megatron's own rules (validate_args: not both formats; a
/// recipe or param gather without its format; TransformerConfig: first and last layers in
/// BF16 not under delayed scaling).
fn low_precision(raw: &RawArgs) -> Result<Option<LowPrecision>, ArgsError> {
    let low = low_precision_format(raw)?;
    let (start, end) = if raw.first_last_layers_bf16 {
        (
            raw.bf16_layers_at_start.unwrap_or(1),
            raw.bf16_layers_at_end.unwrap_or(1),
        )
    } else {
        (0, 0)
    };
    match low {
        Some(low) if low.bits == LowBits::Fp8 && low.recipe == "delayed" && start + end > 0 => {
            Err(contradiction(
                "--first-last-layers-bf16 is given with the delayed FP8 recipe (Megatron refuses:                  'Delayed scaling does not support first / last layer in BF16'; add --fp8-recipe                  tensorwise, blockwise or mxfp8, or drop --first-last-layers-bf16)"
                    .to_string(),
            ))
        }
        Some(low) => Ok(Some(LowPrecision {
            bf16_layers_at_start: start,
            bf16_layers_at_end: end,
            ..low
        })),
        None => Ok(None),
    }
}

/// The format, recipe and parameter gather of `--fp8-*` / `--fp4-*`.
fn low_precision_format(raw: &RawArgs) -> Result<Option<LowPrecision>, ArgsError> {
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
            bf16_layers_at_start: 0,
            bf16_layers_at_end: 0,
        })),
        (None, Some(format)) => Ok(Some(LowPrecision {
            bits: LowBits::Fp4,
            format: format.clone(),
            recipe: raw.fp4_recipe.clone().unwrap_or_else(|| "nvfp4".into()),
            param_gather: raw.fp4_param_gather,
            bf16_layers_at_start: 0,
            bf16_layers_at_end: 0,
        })),
        (None, None) if raw.fp4_param_gather => lone("--fp4-param-gather", "--fp4-format"),
        (None, None) => Ok(None),
    }
}
