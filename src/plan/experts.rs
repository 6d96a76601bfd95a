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
//! Choices, not rules: `etp` is 1 (the Model Zoo's and DeepSeek-V3's recipes) or tp
//! (Megatron's default; Grok-1's and Llama-4's published layouts): sizes between them and
//! above tp appear in no published layout, and each would multiply the configurations the
//! time model ranks (on 2,048 GPUs the ranking is most of the planner's time). A dense
//! model has the one layout ep = etp = 1.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::config::{Dispatcher, ModelSpec, Settings};
use crate::model::parallel::Placement;
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
        let etps: &[u64] = if tp > 1 { &[1, tp] } else { &[1] };
        for &etp in etps {
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

/// What a plan's expert layout means, for the plan report and the dry run: the dispatcher,
/// the experts on each rank, the tokens each expert computes, and where the dispatch's
/// all-to-all runs under the plan's rank mapping.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExpertPlan {
    /// `--moe-token-dispatcher-type`.
    pub dispatcher: Dispatcher,
    /// Routed experts per MoE layer, and the experts each token goes to.
    pub experts: u64,
    pub router_topk: u64,
    pub ep: u64,
    pub etp: u64,
    /// The ranks holding the same experts (their gradients are reduced together):
    /// tp × cp × dp / (ep × etp).
    pub expert_dp: u64,
    /// Experts on each expert-parallel rank: experts / ep.
    pub experts_per_rank: u64,
    /// Tokens each expert computes per micro-batch on average (the rows of its GEMMs):
    /// the expert group's ep × etp ranks hold micro-batch × sequence / (tp × cp) tokens
    /// each (sequence parallel), each sent to top-k of the experts. The busiest expert of
    /// dropless routing gets more.
    pub tokens_per_expert: f64,
    /// Ranks in one expert-parallel group: those the dispatch's all-to-all (or all-gather)
    /// spans, `ep` of them, `etp` apart.
    pub group_ranks: u64,
    /// The most nodes one expert-parallel group spans under the plan's mapping: 1 is
    /// inside a node, over NVLink; more is over the NICs.
    pub group_nodes: u64,
}

impl ExpertPlan {
    /// The expert layout of `config` placed as `placement`; `None` for a dense model.
    pub fn new(model: &ModelSpec, config: &ParallelConfig, placement: &Placement) -> Option<Self> {
        let moe = model.moe.as_ref()?;
        let (ep, etp) = (config.ep.max(1), config.etp.max(1));
        let tokens_per_rank =
            (config.micro_batch * model.seq_length) as f64 / (config.tp * config.cp).max(1) as f64;
        let tokens_per_expert =
            (ep * etp) as f64 * tokens_per_rank * moe.router_topk as f64 / moe.num_experts as f64;
        Some(ExpertPlan {
            dispatcher: moe.dispatcher,
            experts: moe.num_experts,
            router_topk: moe.router_topk,
            ep,
            etp,
            expert_dp: config.expert_dp(),
            experts_per_rank: moe.num_experts / ep,
            tokens_per_expert,
            group_ranks: ep,
            group_nodes: expert_group_nodes(config, placement),
        })
    }

    /// One line: `experts: ep=8 etp=1, 32 of 256 per rank, about 1024 tokens each per
    /// micro-batch (top-8); alltoall dispatch inside one node (NVLink)`.
    pub fn line(&self) -> String {
        let span = if self.group_ranks <= 1 {
            "no dispatch collective (ep=1: every rank holds every expert)".to_string()
        } else if self.group_nodes <= 1 {
            format!(
                "{} dispatch over {} ranks inside one node (NVLink)",
                self.dispatcher.megatron_name(),
                self.group_ranks
            )
        } else {
            format!(
                "{} dispatch over {} ranks across {} nodes (NICs)",
                self.dispatcher.megatron_name(),
                self.group_ranks,
                self.group_nodes
            )
        };
        format!(
            "experts: ep={} etp={} (expert-dp {}), {} of {} per rank, about {:.0} tokens each per micro-batch (top-{}); {span}",
            self.ep,
            self.etp,
            self.expert_dp,
            self.experts_per_rank,
            self.experts,
            self.tokens_per_expert,
            self.router_topk
        )
    }
}

/// The most nodes any one expert-parallel group spans: its ranks share every expert
/// coordinate but `ep` ([`ParallelConfig::expert_coordinates`]).
pub fn expert_group_nodes(config: &ParallelConfig, placement: &Placement) -> u64 {
    let mut groups: BTreeMap<(u64, u64, u64), BTreeSet<usize>> = BTreeMap::new();
    for (rank, device) in placement.devices.iter().enumerate() {
        let at = config.expert_coordinates(rank as u64);
        groups
            .entry((at.etp, at.edp, at.pp))
            .or_default()
            .insert(device.node);
    }
    groups.values().map(|n| n.len() as u64).max().unwrap_or(0)
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
        // etp is 1 or tp; experts of width 100 at tp 8: etp 8 does not divide 100.
        assert!(expert_layouts(&s, 8, 1, 1)
            .iter()
            .all(|l| [1, 8].contains(&l.1)));
        let mut odd = settings("", "");
        odd.model.moe.as_mut().unwrap().ffn_hidden_size = 100;
        assert!(expert_layouts(&odd, 8, 1, 1).iter().all(|l| l.1 == 1));
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
