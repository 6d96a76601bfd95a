//! The expert layouts of a mixture-of-experts model: for one attention layout (tp, cp, dp
//! on each pipeline stage), every expert-parallel size `ep` and expert tensor-parallel size
//! `etp` Megatron accepts, pins respected.
//!
//! Megatron's MoE Parallel Folding (megatron-core 0.19.2, `parallel_state`): the expert
//! layers are laid out over the same ranks as attention, `etp × ep × expert-dp = tp × cp ×
//! dp` on every pipeline stage, ranks ordered etp-ep-edp-pp. The rules, all checked here
//! before any cost ([`moe_rule_error`]):
//! - `ep` divides `--num-experts` (arguments.py 1600-1603);
//! - `etp × ep` divides `tp × cp × dp` (initialize_model_parallel: the world divisible by
//!   `etp × ep × pp`, the expert groups folded out of each stage's ranks);
//! - tp > 1 needs sequence parallelism (moe_layer.py 629-633: the MoE layer refuses to
//!   train without it);
//! - linear biases only at etp = 1 (TransformerConfig: "Bias in Moe is only supported when
//!   ETP==1");
//! - `etp` divides `--moe-ffn-hidden-size` (each expert's MLP is split in whole columns);
//! - a shared expert overlapped with the dispatch needs the alltoall or flex dispatcher
//!   (TransformerConfig), which the arguments fix, not the plan: read-time, not here.
//!
//! Choices, not rules: `etp` is a divisor of `tp` (1, the published recipes' choice, up to
//! tp, Megatron's default): a larger etp splits small experts further than attention and
//! no published layout uses one. A dense model has the one layout ep = etp = 1.

use crate::config::{ModelSpec, Settings};
use crate::model::ParallelConfig;
use crate::plan::space::divisors;

/// Every `(ep, etp)` for the attention layout `tp × cp × dp`, ascending by ep then etp.
pub(crate) fn expert_layouts(settings: &Settings, tp: u64, cp: u64, dp: u64) -> Vec<(u64, u64)> {
    let model = &settings.model;
    let pinned = &settings.constraints;
    let Some(moe) = &model.moe else {
        return vec![(1, 1)];
    };
    let attention = tp.saturating_mul(cp).saturating_mul(dp);
    let mut out = Vec::new();
    for ep in divisors(moe.num_experts, attention) {
        if attention % ep != 0 || pinned.expert_parallel.is_some_and(|p| p != ep) {
            continue;
        }
        for etp in divisors(tp, tp) {
            if (attention / ep) % etp != 0
                || pinned.expert_tensor_parallel.is_some_and(|p| p != etp)
                || expert_split_error(model, etp).is_some()
            {
                continue;
            }
            out.push((ep, etp));
        }
    }
    out
}

/// Why Megatron refuses `config` for `model`'s experts, or `None`: the folding rules of
/// [`ParallelConfig::expert_layout_error`] and the per-expert split rules above.
pub fn moe_rule_error(model: &ModelSpec, config: &ParallelConfig) -> Option<String> {
    config
        .expert_layout_error(model)
        .or_else(|| expert_split_error(model, config.etp))
}

/// The rules on splitting one expert's MLP over `etp` ranks.
fn expert_split_error(model: &ModelSpec, etp: u64) -> Option<String> {
    let moe = model.moe.as_ref()?;
    if etp <= 1 {
        return None;
    }
    if model.add_bias_linear {
        return Some(format!(
            "etp={etp} with linear biases (Megatron supports expert biases only at --expert-tensor-parallel-size 1)"
        ));
    }
    (moe.ffn_hidden_size % etp != 0).then(|| {
        format!(
            "etp={etp} does not divide --moe-ffn-hidden-size {}",
            moe.ffn_hidden_size
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::megatron::parse_pins;
    use crate::config::settings_from_megatron_args;

    const SMALL: &str = "--num-layers 4 --hidden-size 256 --num-attention-heads 8 \
                         --seq-length 512 --vocab-size 1000 --global-batch-size 64 \
                         --disable-bias-linear --num-experts 8 --moe-ffn-hidden-size 96";

    fn settings(extra: &str, pins: &str) -> Settings {
        let args: Vec<String> = format!("{SMALL} {extra}")
            .split_whitespace()
            .map(String::from)
            .collect();
        let pins = if pins.is_empty() {
            Vec::new()
        } else {
            parse_pins(pins).unwrap()
        };
        settings_from_megatron_args(&args, None, &pins).unwrap()
    }

    #[test]
    fn layouts_fold_out_of_the_attention_ranks() {
        let s = settings("", "");
        // tp 2 × dp 4 = 8 ranks per stage; 8 experts.
        let all = expert_layouts(&s, 2, 1, 4);
        assert_eq!(
            all,
            [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2), (8, 1)]
        );
        for (ep, etp) in all {
            let mut c = ParallelConfig::even(4, 2, 1, 4, 1);
            c.sequence_parallel = true;
            (c.ep, c.etp) = (ep, etp);
            assert_eq!(moe_rule_error(&s.model, &c), None, "ep={ep} etp={etp}");
            assert_eq!(c.expert_dp() * ep * etp, 8);
        }
        // A dense model: one layout.
        let mut dense = s.clone();
        dense.model.moe = None;
        assert_eq!(expert_layouts(&dense, 2, 1, 4), [(1, 1)]);
    }

    #[test]
    fn pins_and_megatrons_rules_narrow_the_layouts() {
        let s = settings("", "ep=4,etp=1");
        assert_eq!(expert_layouts(&s, 2, 1, 4), [(4, 1)]);
        // Biases: etp 1 only.
        let mut biased = settings("", "");
        biased.model.add_bias_linear = true;
        assert!(expert_layouts(&biased, 4, 1, 2).iter().all(|l| l.1 == 1));
        // 96 is not divisible by 64... but etp ≤ tp ≤ 8 always divides 96 here; 3 experts
        // of width 100 at tp 8: etp 8 does not divide 100.
        let mut odd = settings("", "");
        odd.model.moe.as_mut().unwrap().ffn_hidden_size = 100;
        assert_eq!(
            expert_layouts(&odd, 8, 1, 1)
                .iter()
                .map(|l| l.1)
                .max(),
            Some(4)
        );
        // tp > 1 without sequence parallelism is refused before costing.
        let mut c = ParallelConfig::even(4, 2, 1, 4, 1);
        (c.ep, c.etp) = (2, 1);
        assert!(moe_rule_error(&s.model, &c)
            .unwrap()
            .contains("sequence parallel"));
        // Pinning ep on a dense model or one that does not divide the experts is an error.
        let args: Vec<String> = SMALL.split_whitespace().map(String::from).collect();
        let bad = settings_from_megatron_args(&args, None, &parse_pins("ep=3").unwrap());
        assert!(bad.unwrap_err().to_string().contains("ep=3"));
    }
}
