//! The plan for the survivors of a failure.
//!
//! The rule (see DESIGN.md, "Re-planning and checkpoints"):
//!
//! 1. The global batch is the user's and stays; only how it is split changes (fewer
//!    data-parallel ranks, more gradient accumulation). A `dp` the user pinned is released:
//!    fewer nodes cannot keep it.
//! 2. When a checkpoint exists, prefer a plan that keeps tensor and pipeline parallelism as
//!    they were (and the virtual stages, the distributed optimizer and an even layer
//!    split): every rank's model shard is then the same, so the checkpoint loads without
//!    resharding, in any checkpoint format.
//! 3. When no such plan exists on the survivors (tp × pp no longer divides their GPUs, or
//!    nothing fits in memory), change tp/pp only when the checkpoint format can be
//!    resharded: Megatron's `torch_dist` (the default), `torch_dcp` and `fsdp_dtensor`
//!    reshard model weights across tp/pp, but with the distributed optimizer its state
//!    reshards across tp/pp only when saved with `--dist-ckpt-optim-fully-reshardable`.
//!    The legacy `torch` format never reshards. Say so either way. A tp, pp or vpp the
//!    user pinned is released then, when no plan on the survivors can keep it.
//! 4. With no checkpoint yet (or no `--save`), any plan will do: the job starts again.
//!
//! Spares and subsets (issue 32): when the failed plan left hot spares ([`Plan::spares`])
//! and there are as many as failed nodes, the plan stays — the same tp, pp, dp, micro-batch
//! and layer split, every setting pinned — and the best-measured spares take the failed
//! nodes' places, the rank mapping searched again for their links. It is costed beside the
//! plan over every remaining node (survivors and spares; a subset of them when that is
//! faster or the only plan, [`plan_subset`]) and the faster per iteration runs, the swap on
//! a tie. The decision and its costed alternatives are the first notes (`recovery: ...`,
//! `not chosen: ...`), which the supervisor writes to the log and to the replan event.
//!
//! Plans with the same planner options (and seed) as the first launch. Pure: the checkpoint
//! is read by the supervisor's driver ([`crate::launch::read_checkpoint`]) and passed in.

use crate::cluster::profile::{DeviceSelection, NodeSelection};
use crate::cluster::ClusterProfile;
use crate::config::Settings;

pub use crate::config::CheckpointFormat;
use crate::exec::same_host;
use crate::launch::CheckpointState;
use crate::model::parallel::ParallelConfig;
use crate::plan::subset::{node_order, on_profile};
use crate::plan::{plan, plan_subset, Plan, PlanError, PlanOptions};

/// How a failure is recovered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Recovery {
    /// Spares take the failed nodes' places: the same tp, pp, dp and layer split, the rank
    /// mapping redone for the new nodes' links; the checkpoint loads as it is.
    Spare,
    /// A plan over the remaining nodes (a subset of them when that is faster or the only
    /// plan) that keeps tp × pp: only dp changes, the checkpoint loads as it is.
    Subset,
    /// tp or pp changes and the checkpoint is resharded on load.
    Reshard,
    /// No checkpoint yet: planned afresh, training starts again.
    Fresh,
}

impl Recovery {
    pub fn as_str(self) -> &'static str {
        match self {
            Recovery::Spare => "spare",
            Recovery::Subset => "subset",
            Recovery::Reshard => "reshard",
            Recovery::Fresh => "fresh",
        }
    }
}

/// One way out of a failure, costed by the time model.
#[derive(Debug, Clone, PartialEq)]
pub struct Alternative {
    pub recovery: Recovery,
    /// Nodes it runs on.
    pub nodes: usize,
    pub config: ParallelConfig,
    pub iteration_ms: f64,
}

impl Alternative {
    /// `spare: tp 1 × pp 2 × dp 2 on 4 nodes, 12.3 ms per iteration (45 iterations left: 0.6 s)`.
    fn to_human(&self, left: Option<u64>) -> String {
        let c = &self.config;
        let mut text = format!(
            "{}: tp {} × pp {} × dp {} on {} node(s), {:.1} ms per iteration",
            self.recovery.as_str(),
            c.tp,
            c.pp,
            c.dp,
            self.nodes,
            self.iteration_ms
        );
        if let Some(left) = left {
            text.push_str(&format!(
                " ({left} iterations left: {:.1} s)",
                self.iteration_ms * left as f64 / 1000.0
            ));
        }
        text
    }
}

/// The plan for the survivors and how it relates to the last one.
#[derive(Debug, Clone)]
pub struct Replanned {
    pub plan: Plan,
    /// The remaining nodes' part of the profile (survivors and spares); the plan's
    /// positions are in it and its spares are the nodes it leaves out.
    pub profile: ClusterProfile,
    /// tp and pp are as before: the checkpoint loads as it is.
    pub kept_tp_pp: bool,
    /// tp or pp changed and the checkpoint is resharded on load.
    pub resharded: bool,
    /// What was chosen, and every alternative that could run, costed.
    pub recovery: Recovery,
    pub alternatives: Vec<Alternative>,
    /// What people should know (the decision and its alternatives, why tp/pp changed, why
    /// a pin was released).
    pub notes: Vec<String>,
}

/// Why no plan could be made for the survivors.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplanError {
    #[error("no node is left to run on")]
    NoSurvivors,
    #[error("the cluster profile does not cover the survivors: {0} (a bug in pipette-run; please report it)")]
    Profile(String),
    #[error("no plan keeps tp={tp} pp={pp} on the {nodes} remaining node(s) ({keep}), and {why}")]
    CannotReshard {
        tp: u64,
        pp: u64,
        nodes: usize,
        keep: String,
        why: String,
    },
    #[error("no plan for the {nodes} remaining node(s): {source}")]
    Plan {
        nodes: usize,
        #[source]
        source: PlanError,
    },
}

/// The nodes a failure left and the plan that failed.
#[derive(Debug, Clone, Copy)]
pub struct Failed<'a> {
    /// Launched nodes still up, in any order.
    pub survivors: &'a [String],
    /// The failed plan's hot spares (never launched); a failed one is not among survivors
    /// or spares.
    pub spares: &'a [String],
    pub previous: &'a ParallelConfig,
}

/// Plans `settings` again after a failure of `failed.previous` (see the module doc for
/// the rule): with enough spares, the spares take the failed nodes' places; else, or when
/// that is slower, a plan over the remaining nodes that keeps tp × pp, subsets included;
/// a resharding plan only when the checkpoint format allows it.
pub fn replan(
    settings: &Settings,
    profile: &ClusterProfile,
    failed: Failed<'_>,
    options: &PlanOptions,
    checkpoint: CheckpointState,
    format: &CheckpointFormat,
) -> Result<Replanned, ReplanError> {
    let Failed {
        survivors,
        previous,
        ..
    } = failed;
    let profile = remaining(profile, &failed)?;
    let nodes = profile.nodes.len();
    let mut notes = Vec::new();
    let mut free = settings.clone();
    if let Some(dp) = free.constraints.data_parallel.take() {
        notes.push(format!(
            "released the pinned dp={dp}: fewer nodes cannot keep it"
        ));
    }
    // Spares are whatever the new plan leaves out; none must be kept any more.
    let mut options = options.clone();
    options.nodes.spares = 0;
    let options = &options;
    let left = iterations_left(settings, checkpoint);
    let swap = swap_in_spares(settings, &profile, survivors, previous, options);

    if !checkpoint.exists() {
        let plan = plan_subset(&free, &profile, options)
            .map_err(|source| ReplanError::Plan { nodes, source })?;
        notes.push("no checkpoint saved yet: planned afresh, training starts again".into());
        let fresh = alternative(Recovery::Fresh, &plan);
        let mut alternatives = vec![fresh.clone()];
        alternatives.extend(
            swap.as_ref()
                .ok()
                .map(|(p, _)| alternative(Recovery::Spare, p)),
        );
        return Ok(choose(
            profile,
            previous,
            (plan, fresh),
            swap.ok(),
            alternatives,
            notes,
            left,
        ));
    }

    let mut keep = free.clone();
    keep.constraints.tensor_parallel = Some(previous.tp);
    keep.constraints.pipeline_parallel = Some(previous.pp);
    keep.constraints.virtual_pipeline = Some(previous.vpp.unwrap_or(1));
    keep.constraints.distributed_optimizer = Some(previous.distributed_optimizer);
    let mut keep_options = options.clone();
    if even(previous) {
        keep_options.space.uneven_layers = false;
    }
    let kept = plan_subset(&keep, &profile, &keep_options);
    let keep_error = match kept {
        Ok(plan) if plan.config.layers_per_stage == previous.layers_per_stage => {
            let subset = alternative(Recovery::Subset, &plan);
            let mut alternatives = vec![subset.clone()];
            alternatives.extend(
                swap.as_ref()
                    .ok()
                    .map(|(p, _)| alternative(Recovery::Spare, p)),
            );
            return Ok(choose(
                profile,
                previous,
                (plan, subset),
                swap.ok(),
                alternatives,
                notes,
                left,
            ));
        }
        Ok(_) => "the layer split would change".to_string(),
        Err(e) => e.to_string(),
    };
    if let Ok(swapped) = swap {
        let spare = alternative(Recovery::Spare, &swapped.0);
        notes.push(format!("no plan without spares keeps tp×pp ({keep_error})"));
        return Ok(take_spare(profile, swapped, vec![spare], notes, left));
    }
    if let Err(why) = format.reshards_tp_pp(previous.distributed_optimizer) {
        return Err(ReplanError::CannotReshard {
            tp: previous.tp,
            pp: previous.pp,
            nodes,
            keep: keep_error,
            why,
        });
    }
    // A tp, pp or vpp the user pinned that the survivors cannot hold is released, as dp is:
    // the checkpoint reshards, so the job can go on with another layout.
    let plan = match plan_subset(&free, &profile, options) {
        Ok(plan) => plan,
        Err(pinned_error) => {
            let pins = &mut free.constraints;
            let released: Vec<String> = [
                ("tp", pins.tensor_parallel.take()),
                ("pp", pins.pipeline_parallel.take()),
                ("vpp", pins.virtual_pipeline.take()),
            ]
            .into_iter()
            .filter_map(|(name, pin)| pin.map(|value| format!("{name}={value}")))
            .collect();
            if released.is_empty() {
                return Err(ReplanError::Plan {
                    nodes,
                    source: pinned_error,
                });
            }
            notes.push(format!(
                "released the pinned {}: the {nodes} remaining node(s) cannot keep it",
                released.join(", ")
            ));
            plan_subset(&free, &profile, options)
                .map_err(|source| ReplanError::Plan { nodes, source })?
        }
    };
    notes.push(format!(
        "tp×pp changes from {}×{} to {}×{} ({keep_error} with the old layout); the {} checkpoint is resharded when it loads",
        previous.tp, previous.pp, plan.config.tp, plan.config.pp, format.format
    ));
    let kept_tp_pp = plan.config.tp == previous.tp && plan.config.pp == previous.pp;
    let recovery = if kept_tp_pp {
        Recovery::Subset
    } else {
        Recovery::Reshard
    };
    let chosen = alternative(recovery, &plan);
    notes.push(format!("recovery: {}", chosen.to_human(left)));
    Ok(Replanned {
        plan,
        profile,
        kept_tp_pp,
        resharded: !kept_tp_pp,
        recovery,
        alternatives: vec![chosen],
        notes,
    })
}

/// The spare swap alone: the failed plan kept, every setting pinned, the best-measured of
/// `failed.spares` taking the places of the nodes missing from `failed.survivors`, the
/// rank mapping searched again. What a straggler's "swap for a spare" runs (the straggler
/// is then the node missing). `Err` says why it cannot run (no spare, too few).
pub fn swap_for_spares(
    settings: &Settings,
    profile: &ClusterProfile,
    failed: Failed<'_>,
    options: &PlanOptions,
    checkpoint: CheckpointState,
) -> Result<Replanned, String> {
    if failed.spares.is_empty() {
        return Err("the plan has no spare".into());
    }
    let profile = remaining(profile, &failed).map_err(|e| e.to_string())?;
    let mut options = options.clone();
    options.nodes.spares = 0;
    let swapped = swap_in_spares(
        settings,
        &profile,
        failed.survivors,
        failed.previous,
        &options,
    )?;
    let spare = alternative(Recovery::Spare, &swapped.0);
    let left = iterations_left(settings, checkpoint);
    Ok(take_spare(profile, swapped, vec![spare], Vec::new(), left))
}

/// The part of `profile` a failure leaves: its survivors and its spares.
fn remaining(profile: &ClusterProfile, failed: &Failed<'_>) -> Result<ClusterProfile, ReplanError> {
    let alive = |host: &str| failed.survivors.iter().any(|s| same_host(s, host));
    let spare = |host: &str| failed.spares.iter().any(|s| same_host(s, host)) && !alive(host);
    if !profile.nodes.iter().any(|n| alive(&n.host)) {
        return Err(ReplanError::NoSurvivors);
    }
    let selections: Vec<NodeSelection<'_>> = profile
        .nodes
        .iter()
        .filter(|n| alive(&n.host) || spare(&n.host))
        .map(|n| NodeSelection {
            host: &n.host,
            devices: DeviceSelection::All,
        })
        .collect();
    profile.subset(&selections).map_err(ReplanError::Profile)
}

/// Iterations left to train after resuming from `checkpoint` (`None`: no `--train-iters`).
fn iterations_left(settings: &Settings, checkpoint: CheckpointState) -> Option<u64> {
    settings
        .training
        .train_iters
        .map(|total| total.saturating_sub(checkpoint.iteration().unwrap_or(0)))
}

fn even(config: &ParallelConfig) -> bool {
    config
        .layers_per_stage
        .iter()
        .all(|l| Some(l) == config.layers_per_stage.first())
}

fn alternative(recovery: Recovery, plan: &Plan) -> Alternative {
    Alternative {
        recovery,
        nodes: plan.mapping.node_order.len(),
        config: plan.config.clone(),
        iteration_ms: plan.estimate.iteration_ms,
    }
}

/// The failed plan on the survivors and as many of `profile`'s other nodes (the spares)
/// as the failed nodes were, the best measured first: every setting of `previous` pinned,
/// dp included, the rank mapping searched again. `Err` says why it cannot run.
fn swap_in_spares(
    settings: &Settings,
    profile: &ClusterProfile,
    survivors: &[String],
    previous: &ParallelConfig,
    options: &PlanOptions,
) -> Result<(Plan, usize), String> {
    let per_node = profile
        .nodes
        .first()
        .and_then(|n| n.gpus())
        .map_or(0, <[_]>::len) as u64;
    let world = previous.tp * previous.pp * previous.dp;
    if per_node == 0 || world % per_node != 0 {
        return Err("the failed plan's world is not whole nodes".into());
    }
    let wanted = (world / per_node) as usize;
    let order = node_order(settings, profile, options).map_err(|e| e.to_string())?;
    let (mut used, mut rest): (Vec<usize>, Vec<usize>) = order
        .iter()
        .map(|(n, _)| *n)
        .partition(|&n| survivors.contains(&profile.nodes[n].host));
    if used.len() >= wanted {
        return Err("no node failed that a spare could replace".into());
    }
    let needed = wanted - used.len();
    if rest.len() < needed {
        return Err(format!(
            "{needed} node(s) failed and {} spare(s) are left",
            rest.len()
        ));
    }
    used.extend(rest.drain(..needed));
    used.sort_unstable();
    let mut pinned = settings.clone();
    let c = &mut pinned.constraints;
    c.tensor_parallel = Some(previous.tp);
    c.pipeline_parallel = Some(previous.pp);
    c.data_parallel = Some(previous.dp);
    c.micro_batch_size = Some(previous.micro_batch);
    c.virtual_pipeline = Some(previous.vpp.unwrap_or(1));
    c.recompute = Some(previous.recompute.clone());
    c.sequence_parallel = Some(previous.sequence_parallel);
    c.distributed_optimizer = Some(previous.distributed_optimizer);
    let mut pinned_options = options.clone();
    pinned_options.space.uneven_layers = !even(previous);
    let plan =
        plan(&pinned, &profile.at_positions(&used), &pinned_options).map_err(|e| e.to_string())?;
    if plan.config.layers_per_stage != previous.layers_per_stage {
        return Err("the layer split would change".into());
    }
    let order: Vec<usize> = used.iter().chain(&rest).copied().collect();
    Ok((on_profile(plan, profile, &order, wanted), needed))
}

/// `planned` (its plan and how it was costed) or the spare swap, whichever runs the
/// remaining iterations faster; the spare swap on a tie (it keeps the layout).
fn choose(
    profile: ClusterProfile,
    previous: &ParallelConfig,
    planned: (Plan, Alternative),
    swap: Option<(Plan, usize)>,
    alternatives: Vec<Alternative>,
    notes: Vec<String>,
    left: Option<u64>,
) -> Replanned {
    let (plan, chosen) = planned;
    match swap {
        Some(swapped) if swapped.0.estimate.iteration_ms <= chosen.iteration_ms => {
            take_spare(profile, swapped, alternatives, notes, left)
        }
        _ => {
            let mut notes = notes;
            notes.push(format!("recovery: {}", chosen.to_human(left)));
            for other in alternatives
                .iter()
                .filter(|a| a.recovery != chosen.recovery)
            {
                notes.push(format!("  not chosen: {}", other.to_human(left)));
            }
            let kept_tp_pp = plan.config.tp == previous.tp && plan.config.pp == previous.pp;
            Replanned {
                plan,
                profile,
                kept_tp_pp,
                resharded: false,
                recovery: chosen.recovery,
                alternatives,
                notes,
            }
        }
    }
}

fn take_spare(
    profile: ClusterProfile,
    (plan, swapped): (Plan, usize),
    alternatives: Vec<Alternative>,
    mut notes: Vec<String>,
    left: Option<u64>,
) -> Replanned {
    let chosen = alternative(Recovery::Spare, &plan);
    notes.push(format!(
        "recovery: {} ({swapped} spare(s) swapped in, the layout kept)",
        chosen.to_human(left)
    ));
    for other in alternatives
        .iter()
        .filter(|a| a.recovery != Recovery::Spare)
    {
        notes.push(format!("  not chosen: {}", other.to_human(left)));
    }
    Replanned {
        plan,
        profile,
        kept_tp_pp: true,
        resharded: false,
        recovery: Recovery::Spare,
        alternatives,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resharding_needs_a_distributed_format_and_a_reshardable_optimizer() {
        let mut config = ParallelConfig::even(4, 2, 2, 2, 1);
        let dist = CheckpointFormat::default();
        assert!(dist.reshards_tp_pp(config.distributed_optimizer).is_ok());
        config.distributed_optimizer = true;
        let why = dist
            .reshards_tp_pp(config.distributed_optimizer)
            .unwrap_err();
        assert!(why.contains("--dist-ckpt-optim-fully-reshardable"), "{why}");
        let fully = CheckpointFormat {
            optimizer_fully_reshardable: true,
            ..CheckpointFormat::default()
        };
        assert!(fully.reshards_tp_pp(config.distributed_optimizer).is_ok());
        let legacy = CheckpointFormat {
            format: "torch".to_string(),
            ..CheckpointFormat::default()
        };
        assert!(legacy
            .reshards_tp_pp(config.distributed_optimizer)
            .unwrap_err()
            .contains("torch format"));
    }

    /// A straggler's "swap for spare": the plan as it was, the straggler's place taken by
    /// the best-measured spare (n4, not n5 with its slow links); nothing without a spare.
    #[test]
    fn a_straggler_is_swapped_for_the_best_spare() {
        use crate::plan::subset::tests::{cluster, settings};
        let s = settings(8, 16);
        let c = cluster(&[312.0; 6], 2, &[5]);
        let mut options = PlanOptions::default();
        options.nodes.spares = 2;
        let running = plan_subset(&s, &c, &options).unwrap();
        assert_eq!(running.spares, ["n4", "n5"]);
        let rest: Vec<String> = ["n0", "n2", "n3"].map(String::from).to_vec();
        let failed = |spares| Failed {
            survivors: &rest,
            spares,
            previous: &running.config,
        };
        let swapped = swap_for_spares(
            &s,
            &c,
            failed(&running.spares),
            &options,
            CheckpointState::At(4),
        )
        .unwrap();
        assert_eq!(swapped.recovery, Recovery::Spare);
        assert_eq!(swapped.plan.config, running.config);
        let mut order = swapped.plan.mapping.node_order.clone();
        order.sort();
        assert_eq!(order, ["n0", "n2", "n3", "n4"]);
        assert_eq!(swapped.plan.spares, ["n5"]);
        assert!(
            swapped.notes[0].starts_with("recovery: spare: "),
            "{:?}",
            swapped.notes
        );
        let none = swap_for_spares(&s, &c, failed(&[]), &options, CheckpointState::At(4));
        assert_eq!(none.unwrap_err(), "the plan has no spare");
    }

    /// The decision over a table of failures: spare, subset, reshard, fresh, give up.
    #[test]
    fn the_recovery_follows_spares_checkpoints_and_formats() {
        use crate::plan::subset::tests::{cluster, settings};
        struct Case {
            name: &'static str,
            nodes: usize,
            per_node: usize,
            layers: u64,
            batch: u64,
            /// tp, pp, dp of the failed plan (micro-batch 1, even layers); for a spare
            /// swap, the plan the planner made on the first tp × pp × dp GPUs' nodes.
            previous: (u64, u64, u64),
            survivors: &'static [&'static str],
            spares: &'static [&'static str],
            checkpoint: CheckpointState,
            format: &'static str,
            /// `--nnodes MIN:MAX`'s MIN (1 when not given).
            min_nodes: usize,
            /// The recovery and the (tp, pp, dp) it runs, or `None`: the job gives up.
            expect: Option<(Recovery, (u64, u64, u64))>,
        }
        /// Three one-GPU nodes at pp 3, one lost: pp 3 cannot be kept on two.
        const PP3_ON_TWO: Case = Case {
            name: "pp 3 on two nodes: resharded (torch_dist)",
            nodes: 3,
            per_node: 1,
            layers: 6,
            batch: 12,
            previous: (1, 3, 1),
            survivors: &["n0", "n1"],
            spares: &[],
            checkpoint: CheckpointState::At(4),
            format: "torch_dist",
            min_nodes: 1,
            expect: Some((Recovery::Reshard, (1, 1, 2))),
        };
        let cases = [
            Case {
                name: "a spare takes the failed node's place, layout kept",
                nodes: 5,
                per_node: 2,
                layers: 8,
                batch: 16,
                previous: (2, 2, 2),
                survivors: &["n0", "n2", "n3"],
                spares: &["n4"],
                checkpoint: CheckpointState::At(4),
                format: "torch_dist",
                min_nodes: 1,
                expect: Some((Recovery::Spare, (2, 2, 2))),
            },
            Case {
                name: "no spare: three cannot split the batch, two keep tp x pp",
                nodes: 4,
                per_node: 1,
                layers: 8,
                batch: 8,
                previous: (1, 1, 4),
                survivors: &["n0", "n1", "n3"],
                spares: &[],
                checkpoint: CheckpointState::At(4),
                format: "torch_dist",
                min_nodes: 1,
                expect: Some((Recovery::Subset, (1, 1, 2))),
            },
            Case {
                name: "two spares for one failure: one swapped in, one left",
                nodes: 5,
                per_node: 1,
                layers: 8,
                batch: 8,
                previous: (1, 1, 2),
                survivors: &["n1"],
                spares: &["n2", "n3"],
                checkpoint: CheckpointState::At(4),
                format: "torch",
                min_nodes: 1,
                expect: Some((Recovery::Spare, (1, 1, 2))),
            },
            Case {
                name: "--nnodes 3:4: three cannot split the batch and two are too few: give up",
                nodes: 4,
                per_node: 1,
                layers: 8,
                batch: 8,
                previous: (1, 1, 4),
                survivors: &["n0", "n1", "n3"],
                spares: &[],
                checkpoint: CheckpointState::At(4),
                format: "torch",
                min_nodes: 3,
                expect: None,
            },
            PP3_ON_TWO,
            Case {
                name: "pp 3 on two nodes, legacy checkpoints: give up",
                format: "torch",
                expect: None,
                ..PP3_ON_TWO
            },
            Case {
                name: "nothing saved: planned afresh",
                checkpoint: CheckpointState::None,
                format: "torch",
                min_nodes: 1,
                expect: Some((Recovery::Fresh, (1, 1, 2))),
                ..PP3_ON_TWO
            },
        ];
        for case in cases {
            let s = settings(case.layers, case.batch);
            let c = cluster(&vec![312.0; case.nodes], case.per_node, &[]);
            let (tp, pp, dp) = case.previous;
            let mut options = PlanOptions::default();
            options.space.uneven_layers = false;
            options.nodes.min_nodes = case.min_nodes;
            let mut previous = ParallelConfig::even(case.layers, tp, pp, dp, 1);
            if case.expect.is_some_and(|(r, _)| r == Recovery::Spare) {
                let mut pinned = s.clone();
                pinned.constraints.tensor_parallel = Some(tp);
                pinned.constraints.pipeline_parallel = Some(pp);
                let used: Vec<usize> = (0..(tp * pp * dp) as usize / case.per_node).collect();
                previous = plan(&pinned, &c.at_positions(&used), &options)
                    .unwrap()
                    .config;
            }
            let survivors: Vec<String> = case.survivors.iter().map(|h| h.to_string()).collect();
            let spares: Vec<String> = case.spares.iter().map(|h| h.to_string()).collect();
            let format = CheckpointFormat {
                format: case.format.to_string(),
                ..CheckpointFormat::default()
            };
            let result = replan(
                &s,
                &c,
                Failed {
                    survivors: &survivors,
                    spares: &spares,
                    previous: &previous,
                },
                &options,
                case.checkpoint,
                &format,
            );
            let Some((recovery, (tp, pp, dp))) = case.expect else {
                assert!(
                    matches!(result, Err(ReplanError::CannotReshard { .. })),
                    "{}: {result:?}",
                    case.name
                );
                continue;
            };
            let r = result.unwrap_or_else(|e| panic!("{}: {e}", case.name));
            assert_eq!(r.recovery, recovery, "{}: {:?}", case.name, r.notes);
            let got = &r.plan.config;
            assert_eq!((got.tp, got.pp, got.dp), (tp, pp, dp), "{}", case.name);
            assert!(
                r.notes.iter().any(|n| n.starts_with("recovery: ")),
                "{}: {:?}",
                case.name,
                r.notes
            );
            // Every host the plan runs on is alive; the rest of the remaining nodes are spares.
            let running = &r.plan.mapping.node_order;
            assert!(
                running
                    .iter()
                    .all(|h| survivors.contains(h) || spares.contains(h)),
                "{}: {running:?}",
                case.name
            );
            assert_eq!(
                running.len() + r.plan.spares.len(),
                survivors.len() + spares.len(),
                "{}",
                case.name
            );
            if recovery == Recovery::Spare {
                assert!(
                    r.alternatives.len() >= 2,
                    "{}: the re-plan is costed beside the swap: {:?}",
                    case.name,
                    r.alternatives
                );
                assert_eq!(r.plan.config, previous, "{}", case.name);
            }
        }
    }
}
