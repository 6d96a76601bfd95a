//! Activations of mixture-of-experts and multi-latent-attention layers beyond a dense
//! layer's ([`super::memory::layer_activation_bytes`]), tensor by tensor, as the Megatron
//! MoE Model Zoo's per-tensor estimator counts them (`misc/tools/deepseek_mem_estimate.py`,
//! MIT) and megatron-core keeps them.
//!
//! Per MoE layer and micro-batch on one GPU, with `T` tokens of the micro-batch (`s·b/cp`),
//! `T_r = T/tp` on the rank (Megatron requires sequence parallelism for MoE with tp > 1),
//! `R = T_r·k·etp` routed rows (top-`k`, gathered over the expert-tensor group), `E`
//! experts, expert width `F` (÷ etp), shared width `F_s`, g = 2 with SwiGLU, e bytes per
//! element:
//!
//! | kept for the backward pass | bytes | dropped by `--recompute-modules` |
//! |---|---|---|
//! | router logits / probabilities (fp32) and the permutation's row map (int64) | 12·T_r·E | `moe` |
//! | dispatcher buffer: the tokens received by the all-to-all (the permutation's input) | e·R·h | `moe` |
//! | permuted tokens (the experts' fc1 input) | e·R·h | `moe` |
//! | experts' fc1 output, activation output | e·R·(g + 1)·F/etp | `moe`; `moe_act` the activation output |
//! | the combine all-to-all's input (fc2 output) | e·R·h | `moe` |
//! | shared expert's fc1 output and activation output | e·T·(g + 1)·F_s/tp | `moe`, `shared_experts` |
//! | less the dense MLP's fc1 and activation outputs the layer does not have | −e·T·(g + 1)·f/tp | |
//!
//! The routed terms are the busiest rank's: dropless routing sends it more than the mean,
//! [`super::time::load_factor`] times it; the part above the mean is kept apart
//! ([`MoeActivations::imbalance`]) as the allowance the trial can fit.
//!
//! Per layer with multi-latent attention (the latents on every tp rank, as Megatron
//! duplicates the down projections; the heads split over tp): the compressed query and its
//! norm, e·T·2·q_lora; the compressed key/value with the rotary part and its norm,
//! e·T·(2·kv_lora + rope); Q and K of `heads·(qk + rope)` and V of `heads·v`, ÷ tp, in place
//! of the dense Q, K and V (`mla_up_proj` recomputes Q, K and V from the latents and keeps
//! only those).

use crate::config::{ModelSpec, Recompute, RecomputeModule, TrainingSettings};
use crate::model::parallel::ParallelConfig;
use crate::model::time::load_factor;

/// The extra activation bytes of one layer and micro-batch on one GPU (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MoeActivations {
    /// Per MoE layer, beyond the dense layer's, at an even load.
    pub routed: f64,
    /// Per MoE layer: what the busiest rank keeps above an even load.
    pub imbalance: f64,
    /// Per layer with multi-latent attention, beyond the dense attention's.
    pub mla: f64,
}

/// The extra activations of `model`'s MoE and MLA layers for one micro-batch under
/// `config`; zero for a dense model. Full recomputation keeps only each group's input, so
/// nothing is added then.
pub fn moe_activations(
    model: &ModelSpec,
    training: &TrainingSettings,
    config: &ParallelConfig,
    element_bytes: f64,
) -> MoeActivations {
    let mut out = MoeActivations::default();
    if matches!(config.recompute, Recompute::Full { .. }) {
        return out;
    }
    let selective = config.recompute == Recompute::Selective;
    let drops = |m: RecomputeModule| selective && training.recompute_modules.contains(&m);
    let e = element_bytes;
    let t = config.tp.max(1) as f64;
    let tokens = model.seq_length as f64 * config.micro_batch as f64 / config.cp.max(1) as f64;
    let h = model.hidden_size as f64;
    let gates = if model.swiglu { 2.0 } else { 1.0 };
    if let Some(moe) = &model.moe {
        let rank_tokens = if config.tp > 1 { tokens / t } else { tokens };
        let etp = config.etp.max(1) as f64;
        let k = moe.router_topk.max(1) as f64;
        let rows = rank_tokens * k * etp;
        let width = moe.ffn_hidden_size as f64 / etp;
        let dense_mlp = e * tokens * (gates + 1.0) * model.ffn_hidden_size as f64 / t;
        let shared = moe
            .shared_expert_ffn
            .map_or(0.0, |fs| e * tokens * (gates + 1.0) * fs as f64 / t);
        let (routed, kept_shared) = if drops(RecomputeModule::Moe) {
            (0.0, 0.0)
        } else {
            let act = if drops(RecomputeModule::MoeAct) {
                gates
            } else {
                gates + 1.0
            };
            let routed = 3.0 * e * rows * h + e * rows * act * width;
            let kept_shared = if drops(RecomputeModule::SharedExperts) {
                0.0
            } else {
                shared
            };
            (routed, kept_shared)
        };
        let router = if drops(RecomputeModule::Moe) {
            0.0
        } else {
            12.0 * rank_tokens * moe.num_experts as f64
        };
        out.routed = router + routed + kept_shared - dense_mlp;
        out.imbalance = (load_factor(moe) - 1.0).max(0.0) * routed;
    }
    if let Some(mla) = &model.mla {
        let heads = model.num_attention_heads as f64;
        let rope = mla.qk_pos_emb_head_dim as f64;
        let q_rank = mla.q_lora_rank.unwrap_or(0) as f64;
        let latents = e * tokens * (2.0 * q_rank + 2.0 * mla.kv_lora_rank as f64 + rope);
        let dense_qkv = e
            * tokens
            * (model.num_attention_heads as f64 + 2.0 * model.num_query_groups as f64)
            * model.kv_channels as f64
            / t;
        let mla_qkv =
            e * tokens * heads * (2.0 * (mla.qk_head_dim as f64 + rope) + mla.v_head_dim as f64)
                / t;
        let qkv = if drops(RecomputeModule::MlaUpProj) {
            0.0
        } else {
            mla_qkv
        };
        out.mla = latents + qkv - dense_qkv;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::megatron::model_from_megatron_args;
    use crate::config::Precision;
    use crate::model::calibration::Calibration;
    use crate::model::memory::estimate_memory;

    fn model(extra: &str) -> ModelSpec {
        let args = format!(
            "--num-layers 8 --hidden-size 1024 --ffn-hidden-size 4096 --num-attention-heads 16 \
             --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000 --swiglu \
             --micro-batch-size 1 --global-batch-size 64 --bf16 {extra}"
        );
        let words: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        model_from_megatron_args(&words, None).unwrap()
    }

    fn setting(modules: &[RecomputeModule]) -> (TrainingSettings, ParallelConfig) {
        let mut training = TrainingSettings::new(64, Precision::Bf16);
        let mut config = ParallelConfig::even(8, 2, 2, 4, 1);
        config.sequence_parallel = true;
        config.ep = 4;
        if !modules.is_empty() {
            config.recompute = Recompute::Selective;
            training.recompute = Recompute::Selective;
            training.recompute_modules = modules.to_vec();
        }
        (training, config)
    }

    #[test]
    fn routed_tensors_follow_their_formula_and_the_recompute_modules_that_drop_them() {
        let moe = model("--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1024");
        let (training, config) = setting(&[]);
        let a = moe_activations(&moe, &training, &config, 2.0);
        // T = 2048, T_r = 1024, R = 2048 rows, F = 1024, SwiGLU, e = 2.
        let rows = 2048.0;
        let routed = 3.0 * 2.0 * rows * 1024.0 + 2.0 * rows * 3.0 * 1024.0;
        let router = 12.0 * 1024.0 * 8.0;
        let dense = 2.0 * 2048.0 * 3.0 * 4096.0 / 2.0;
        assert_eq!(a.routed, router + routed - dense);
        assert!((a.imbalance - 0.2 * routed).abs() < 1e-6);
        assert_eq!(a.mla, 0.0);

        let (t, c) = setting(&[RecomputeModule::CoreAttn, RecomputeModule::MoeAct]);
        let act = moe_activations(&moe, &t, &c, 2.0);
        assert_eq!(a.routed - act.routed, 2.0 * rows * 1024.0);
        let (t, c) = setting(&[RecomputeModule::Moe]);
        assert_eq!(moe_activations(&moe, &t, &c, 2.0).routed, -dense);
    }

    #[test]
    fn every_stage_reports_its_moe_layers_and_the_load_allowance() {
        let moe = model(
            "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1024 \
             --moe-layer-freq ([0]*4+[1]*4)",
        );
        let (training, config) = setting(&[]);
        let m = estimate_memory(&moe, &training, &config, &Calibration::default());
        // The first stage holds the four dense layers, the second the four MoE ones.
        assert_eq!(m.stages[0].activations.moe_bytes, 0);
        assert!(m.stages[1].activations.moe_bytes > 0);
        assert!(m.stages[1].activations.moe_imbalance_bytes > 0);
        let dense = estimate_memory(&model(""), &training, &config, &Calibration::default());
        assert_eq!(dense.stages[1].activations.moe_bytes, 0);
        assert!(m.stages[1].activations.total() > dense.stages[1].activations.total());
    }
}
