//! The search space: every parallel configuration Megatron accepts for this model, this
//! batch and this many GPUs, with the user's pinned settings respected.
//!
//! Megatron's rules applied here (megatron-core 0.19.2):
//! - tp divides the attention heads and the query groups (TransformerConfig), and we keep
//!   a tensor-parallel group inside one node (its collectives need the fast links);
//! - tp × pp divides the world size; dp is the quotient;
//! - the global batch divides by micro-batch × dp (arguments.py, the microbatch calculator);
//! - layers split evenly over pp, or unevenly through `--decoder-first-pipeline-num-layers`
//!   / `--decoder-last-pipeline-num-layers` with the middle stages equal (arguments.py);
//! - the interleaved schedule needs pp > 2 (without p2p overlap), layers per stage divisible
//!   by the virtual stages, an even split, and a micro-batch count divisible by pp
//!   (core/pipeline_parallel/schedules.py: `microbatch_group_size_per_vp_stage` = pp);
//! - sequence parallelism only with tp > 1; the distributed optimizer only matters with dp > 1;
//! - context parallelism: 2·cp divides the sequence, each rank's s/cp tokens divide by tp
//!   with sequence parallelism, a2a's head split ([`crate::model::context::context_split_error`]);
//!   tp × cp × dp × pp is the world (EP folds out of tp × cp × dp);
//! - `--first-last-layers-bf16`: each of its two layer counts at most layers / pp
//!   (TransformerConfig's check).
//!
//! Where the groups may run: a tensor-parallel group inside one node, or inside one NVLink
//! domain ([`SpaceOptions::nvlink_nodes`]) when the cluster has them; a stage's tp × cp
//! ranks likewise inside one domain on such a cluster, never across two. On a cluster without
//! NVLink domains a context-parallel group may span nodes over the network (its ring exchange
//! overlaps the attention; Llama 3 trained CP 16 so). The group covers whole nodes or
//! divides one, so that torchrun's contiguous blocks keep it aligned.
//! - a mixture-of-experts model: every expert layout folded out of tp × cp × dp and Megatron's
//!   MoE rules ([`super::experts`]), as one more step after the rest.
//!
//! Splits by GPU speed on mixed clusters (any layer count per stage, rendered as
//! `--pipeline-model-parallel-layout` when first/last counts cannot say it) are added by
//! the planner ([`super::layers`]), not here: they depend on where each stage runs.

use crate::config::{ModelSpec, Recompute, RecomputeMethod, Settings};
use crate::model::context::context_split_error;
use crate::model::ParallelConfig;
use crate::plan::experts::{expert_layouts, moe_rule_error};

/// Bounds of the search that are choices, not rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceOptions {
    /// The largest micro-batch tried.
    pub max_micro_batch: u64,
    /// The most virtual stages per pipeline rank tried.
    pub max_virtual_stages: u64,
    /// Whether uneven splits are tried: first/last stages here, and on mixed GPUs the
    /// planner's splits by stage speed and memory. Off: even splits only (what the plan
    /// report compares a mixed-GPU plan with).
    pub uneven_layers: bool,
    /// Only these `(tp, pp)` shapes (`None`: every shape): the subset search
    /// ([`super::subset`]) ranks each shape on the one node count it is best at.
    pub shapes: Option<Vec<(u64, u64)>>,
    /// Context parallelism is searched from this sequence length on (a pinned cp is
    /// always taken): below it no published recipe uses it, and every cp multiplies the
    /// candidates.
    pub context_parallel_from: u64,
    /// Consecutive nodes of the profile's order that share one NVLink domain in every
    /// aligned run (the planner fills it from the cluster); `None`: no NVLink domains.
    pub nvlink_nodes: Option<u64>,
}

/// The shortest sequence for which context parallelism is searched by default: 8K tokens,
/// the shortest at which NVIDIA's recipes use it (Llama 3.1 405B, CP 2).
pub const CONTEXT_PARALLEL_FROM: u64 = 8192;

impl Default for SpaceOptions {
    fn default() -> Self {
        SpaceOptions {
            max_micro_batch: 16,
            max_virtual_stages: 8,
            uneven_layers: true,
            shapes: None,
            context_parallel_from: CONTEXT_PARALLEL_FROM,
            nvlink_nodes: None,
        }
    }
}

/// Every configuration for `nodes` nodes of `gpus_per_node` GPUs, in a fixed order (so
/// the planner is deterministic).
pub fn candidates(
    settings: &Settings,
    nodes: u64,
    gpus_per_node: u64,
    options: &SpaceOptions,
) -> Vec<ParallelConfig> {
    let model = &settings.model;
    let pinned = &settings.constraints;
    let global_batch = settings.training.global_batch_size;
    let mut out = Vec::new();
    // Discovery caps both factors far below an overflow; a product that overflows anyway
    // has no configuration rather than a wrapped one.
    let Some(world) = nodes.checked_mul(gpus_per_node) else {
        return out;
    };
    if world == 0 || model.num_layers == 0 {
        return out;
    }
    let domain_nodes = options.nvlink_nodes.unwrap_or(1).max(1);
    let fast_gpus = gpus_per_node.saturating_mul(domain_nodes);
    // A group covers whole nodes or divides one.
    let aligned = |n: u64| gpus_per_node % n == 0 || n % gpus_per_node == 0;
    let training = &settings.training;
    let levels = training.hierarchical_context_parallel.as_deref();
    for tp in divisors(fast_gpus.min(world), u64::MAX) {
        if model.num_attention_heads % tp != 0
            || model.num_query_groups % tp != 0
            || pinned.tensor_parallel.is_some_and(|p| p != tp)
            || !aligned(tp)
        {
            continue;
        }
        for cp in context_parallel_sizes(settings, world / tp, options) {
            let block = tp * cp;
            if !aligned(block) || (options.nvlink_nodes.is_some() && block > fast_gpus) {
                continue;
            }
            for pp in divisors(world / block, model.num_layers) {
                let bf16_ends = training
                    .low_precision
                    .as_ref()
                    .map_or(0, |l| l.bf16_layers_at_start.max(l.bf16_layers_at_end));
                if pinned.pipeline_parallel.is_some_and(|p| p != pp)
                    || bf16_ends > model.num_layers / pp
                    || options
                        .shapes
                        .as_ref()
                        .is_some_and(|s| !s.contains(&(tp, pp)))
                {
                    continue;
                }
                let dp = world / (block * pp);
                if pinned.data_parallel.is_some_and(|p| p != dp) || global_batch % dp != 0 {
                    continue;
                }
                // The expert layouts folded out of this stage's tp × cp × dp ranks (one, ep =
                // etp = 1, for a dense model): see [`super::experts`].
                let expert_layouts = expert_layouts(settings, tp, cp, dp);
                for layers in layer_splits(model.num_layers, pp, options.uneven_layers) {
                    let even = layers.iter().all(|l| *l == layers[0]);
                    for micro_batch in divisors(global_batch / dp, options.max_micro_batch) {
                        if pinned.micro_batch_size.is_some_and(|p| p != micro_batch) {
                            continue;
                        }
                        let microbatches = global_batch / (micro_batch * dp);
                        for vpp in virtual_stages(&layers, pp, microbatches, even, options) {
                            if pinned
                                .virtual_pipeline
                                .is_some_and(|p| p != vpp.unwrap_or(1))
                            {
                                continue;
                            }
                            for recompute in recompute_modes(pinned.recompute.as_ref()) {
                                for sequence_parallel in
                                    flag_choices(tp > 1, pinned.sequence_parallel)
                                {
                                    for distributed_optimizer in
                                        flag_choices(dp * cp > 1, pinned.distributed_optimizer)
                                    {
                                        let config = ParallelConfig {
                                            tp,
                                            pp,
                                            dp,
                                            cp,
                                            ep: 1,
                                            etp: 1,
                                            micro_batch,
                                            vpp,
                                            recompute: recompute.clone(),
                                            sequence_parallel,
                                            distributed_optimizer,
                                            layers_per_stage: layers.clone(),
                                        };
                                        if cp > 1
                                            && context_split_error(
                                                model,
                                                &config,
                                                training.cp_comm_type,
                                                levels,
                                            )
                                            .is_some()
                                        {
                                            continue;
                                        }
                                        push_expert_layouts(
                                            &mut out,
                                            config,
                                            &expert_layouts,
                                            model,
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// The context-parallel sizes to try with `ranks` = world / tp: the pinned one, else 1 and,
/// from [`SpaceOptions::context_parallel_from`] tokens on, every divisor of `ranks` whose
/// 2·cp chunks divide the sequence.
fn context_parallel_sizes(settings: &Settings, ranks: u64, options: &SpaceOptions) -> Vec<u64> {
    let s = settings.model.seq_length;
    if let Some(cp) = settings.constraints.context_parallel {
        return if ranks % cp == 0 { vec![cp] } else { vec![] };
    }
    if s < options.context_parallel_from {
        return vec![1];
    }
    divisors(ranks, u64::MAX)
        .into_iter()
        .filter(|&cp| cp == 1 || s % cp.saturating_mul(2) == 0)
        .collect()
}

/// `config` once per expert layout, each that Megatron accepts ([`moe_rule_error`]).
fn push_expert_layouts(
    out: &mut Vec<ParallelConfig>,
    config: ParallelConfig,
    layouts: &[(u64, u64)],
    model: &ModelSpec,
) {
    for &(ep, etp) in layouts {
        let config = ParallelConfig {
            ep,
            etp,
            ..config.clone()
        };
        if moe_rule_error(model, &config).is_none() {
            out.push(config);
        }
    }
}

/// The divisors of `n` up to `at_most`, ascending.
///
/// Trial division stops at `at_most` when that comes before √n, so a huge `n` (a global
/// batch of 2^64 − 1) costs no more than its small divisors: the micro-batch and the
/// pipeline size are bounded long before. `d <= n / d` is `d * d <= n` without overflow.
pub(crate) fn divisors(n: u64, at_most: u64) -> Vec<u64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d: u64 = 1;
    while d <= n / d && d <= at_most {
        if n % d == 0 {
            small.push(d);
            if d != n / d && n / d <= at_most {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// Layer counts per stage: the even split when pp divides the layers, and splits whose
/// first and last stages differ from equal middle stages (what Megatron's
/// `--decoder-first/last-pipeline-num-layers` can say): the middle size is L/pp rounded
/// down or up, the first and last stages share the rest.
pub(crate) fn layer_splits(layers: u64, pp: u64, uneven: bool) -> Vec<Vec<u64>> {
    let mut splits = Vec::new();
    if layers % pp == 0 {
        splits.push(vec![layers / pp; pp as usize]);
    }
    if !uneven || pp == 1 {
        return splits;
    }
    let middles = if pp == 2 {
        vec![0]
    } else {
        vec![layers / pp, layers.div_ceil(pp)]
    };
    for middle in middles {
        let inner = middle * pp.saturating_sub(2);
        if inner >= layers {
            continue;
        }
        let rest = layers - inner;
        // First takes the smaller half: it also holds the embedding.
        let first = rest / 2;
        let last = rest - first;
        for (f, l) in [(first, last), (last, first)] {
            if f == 0 || l == 0 || (pp > 2 && middle == 0) {
                continue;
            }
            let mut split = vec![middle; pp as usize];
            split[0] = f;
            split[pp as usize - 1] = l;
            if !splits.contains(&split) {
                splits.push(split);
            }
        }
    }
    splits
}

fn virtual_stages(
    layers: &[u64],
    pp: u64,
    microbatches: u64,
    even: bool,
    options: &SpaceOptions,
) -> Vec<Option<u64>> {
    let mut out = vec![None];
    if pp <= 2 || !even || microbatches % pp != 0 {
        return out;
    }
    let per_stage = layers[0];
    for v in 2..=options.max_virtual_stages.min(per_stage) {
        if per_stage % v == 0 {
            out.push(Some(v));
        }
    }
    out
}

fn recompute_modes(pinned: Option<&Recompute>) -> Vec<Recompute> {
    match pinned {
        Some(r) => vec![r.clone()],
        None => vec![
            Recompute::None,
            Recompute::Selective,
            Recompute::Full {
                method: RecomputeMethod::Uniform,
                num_layers: 1,
            },
        ],
    }
}

/// `false` and `true` when the option means something, else only `false`; a pinned
/// value wins where it means something.
fn flag_choices(meaningful: bool, pinned: Option<bool>) -> Vec<bool> {
    match (meaningful, pinned) {
        (false, _) => vec![false],
        (true, Some(p)) => vec![p],
        (true, None) => vec![false, true],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::settings_from_megatron_args;

    fn settings(args: &[&str], preset: &str) -> Settings {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        settings_from_megatron_args(&args, Some(preset), &[]).expect("valid settings")
    }

    #[test]
    fn divisors_are_ascending() {
        assert_eq!(divisors(12, u64::MAX), [1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(16, u64::MAX), [1, 2, 4, 8, 16]);
        assert_eq!(divisors(1, u64::MAX), [1]);
        assert_eq!(divisors(12, 4), [1, 2, 3, 4]);
        assert_eq!(divisors(36, 12), [1, 2, 3, 4, 6, 9, 12]);
    }

    /// `d * d` wrapped past 2^64 and the loop never ended; √n trial division of 10^18
    /// took 15 s. Bounded by what is asked for, both are instant.
    #[test]
    fn defect_02_huge_global_batch_neither_hangs_nor_overflows() {
        assert_eq!(divisors(u64::MAX, 16), [1, 3, 5, 15]);
        assert_eq!(
            divisors(1_000_000_000_000_000_000, 16),
            [1, 2, 4, 5, 8, 10, 16]
        );
        // The largest square below 2^64: d reaches 2^32 - 1 and d * d would overflow next.
        let n = (u32::MAX as u64) * (u32::MAX as u64);
        assert_eq!(divisors(n, 4), [1, 3]);
        // The Megatron reader refuses such a batch; the space must still cope with one.
        let mut s = settings(&["--global-batch-size", "64"], "llama2-7b");
        s.training.global_batch_size = u64::MAX;
        let all = candidates(&s, 2, 8, &SpaceOptions::default());
        assert!(all
            .iter()
            .all(|c| c.dp == 1 && [1, 3, 5, 15].contains(&c.micro_batch)));
    }

    #[test]
    fn uneven_splits_keep_equal_middles_and_sum_to_the_layers() {
        for (layers, pp) in [(32, 3), (30, 4), (7, 2), (40, 6), (5, 5)] {
            for split in layer_splits(layers, pp, true) {
                assert_eq!(split.len() as u64, pp);
                assert_eq!(split.iter().sum::<u64>(), layers, "{split:?}");
                assert!(split.iter().all(|l| *l > 0), "{split:?}");
                if pp > 2 {
                    let middle = &split[1..split.len() - 1];
                    assert!(middle.iter().all(|m| *m == middle[0]), "{split:?}");
                }
            }
        }
        assert_eq!(layer_splits(32, 4, false), vec![vec![8; 4]]);
    }

    #[test]
    fn every_candidate_is_one_megatron_accepts() {
        let s = settings(&["--global-batch-size", "64"], "llama2-7b");
        let all = candidates(&s, 2, 8, &SpaceOptions::default());
        assert!(!all.is_empty());
        for c in &all {
            assert_eq!(c.world_size(), 16);
            assert!(8 % c.tp == 0 && 32 % c.tp == 0);
            assert_eq!(c.layers_per_stage.iter().sum::<u64>(), 32);
            assert_eq!(64 % (c.micro_batch * c.dp), 0);
            if let Some(v) = c.vpp {
                assert!(c.pp > 2 && (c.layers_per_stage[0] % v == 0));
                assert_eq!(c.num_microbatches(64) % c.pp, 0);
            }
            assert!(c.tp > 1 || !c.sequence_parallel);
            assert!(c.dp > 1 || !c.distributed_optimizer);
        }
    }

    #[test]
    fn pinned_settings_are_respected() {
        let args: Vec<String> = [
            "--global-batch-size",
            "64",
            "--tensor-model-parallel-size",
            "4",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let pins = crate::config::megatron::parse_pins("tp,dp=2").unwrap();
        let s = settings_from_megatron_args(&args, Some("llama2-7b"), &pins).unwrap();
        let all = candidates(&s, 2, 8, &SpaceOptions::default());
        assert!(!all.is_empty());
        assert!(all.iter().all(|c| c.tp == 4 && c.dp == 2 && c.pp == 2));
    }

    #[test]
    fn layers_kept_in_bf16_must_fit_in_one_stage() {
        // llama2-7b, 32 layers: 5 BF16 layers at the end fit stages of 8 (pp 4), not of 4.
        let low = [
            "--global-batch-size",
            "64",
            "--fp8-format",
            "e4m3",
            "--fp8-recipe",
        ];
        let s = settings(
            &[
                &low[..],
                &[
                    "mxfp8",
                    "--first-last-layers-bf16",
                    "--num-layers-at-end-in-bf16",
                    "5",
                ],
            ]
            .concat(),
            "llama2-7b",
        );
        let pps: std::collections::BTreeSet<u64> = candidates(&s, 4, 8, &SpaceOptions::default())
            .iter()
            .map(|c| c.pp)
            .collect();
        assert_eq!(pps.into_iter().collect::<Vec<_>>(), [1, 2, 4]);
    }

    #[test]
    fn gqa_limits_tensor_parallelism() {
        // llama2-70b has 8 query groups: tp up to 8.
        let s = settings(&["--global-batch-size", "32"], "llama2-70b");
        let all = candidates(&s, 4, 16, &SpaceOptions::default());
        assert!(all.iter().all(|c| c.tp <= 8));
        assert!(all.iter().any(|c| c.tp == 8));
    }
}
