//! The planner's one entry point, [`plan`]: settings and a cluster profile in, the fastest
//! configuration that fits and its rank mapping out.
//!
//! 1. **Candidates**: every configuration Megatron accepts for this model on the profile's
//!    nodes × GPUs per node ([`super::space::candidates`]), pinned settings respected. The
//!    planner needs the same GPU count on every node ([`PlanError::MixedGpuCounts`]).
//!    On a cluster that mixes kinds of GPU ([`super::hetero`]), every candidate is taken
//!    on every order of the GPU classes along the pipeline (an [`Arrangement`]), and each
//!    plain-1F1B shape also gets its layers balanced over that arrangement's stages by
//!    speed within each stage's memory ([`super::layers`]; `SpaceOptions::uneven_layers`
//!    off leaves only even splits, which is how the report's even-split comparison is
//!    planned).
//! 2. **Memory**: drop every configuration one of whose stages needs more than its own
//!    GPUs' memory less the headroom ([`MemoryHeadroom`], default 5 %); on a homogeneous
//!    cluster that is the worst stage against the smallest GPU. When none is left:
//!    [`PlanError::NothingFits`], with the smallest need (per stage on mixed GPUs) and what
//!    would make it fit.
//! 3. **Rank** the rest by the time model on torchrun's default placement of their
//!    arrangement (in parallel; ties broken by a stable key of the configuration, then the
//!    arrangement, so the order is the same on every machine). Only the best `top_k` are
//!    needed: configurations are evaluated in the order of a cheap lower bound of their
//!    time ([`ConfigCosts::lower_bound_ms`]), and those whose bound passes the `top_k`-th
//!    best found are never evaluated in full ([`rank::best`]); the best `top_k` and their
//!    order are those of evaluating every one.
//! 4. **Map** the best `top_k` (in parallel, each with a seed derived from the plan's seed
//!    and its rank, so the thread count changes nothing) with [`super::mapping`], node
//!    swaps confined to a GPU class on mixed clusters; a mapping that gains less than
//!    `mapping_threshold` (1 %) over the default order is dropped for the default order.
//! 5. **Choose**: every mapped configuration within the time model's stated error of the
//!    fastest is a tie ([`Ties`]), and the simplest of them runs ([`simpler`]: fewer
//!    pipeline stages, then fewer virtual stages, smaller tp, larger micro-batch).
//!
//! On a homogeneous cluster there is one arrangement (the profile's order, every swap
//! allowed) and the plan is what it was before heterogeneous planning, bit for bit.
//!
//! Pure: no I/O, no clock. Timing a plan is left to callers (the benchmark).

mod balance;
mod cluster;
mod error;
mod layouts;
mod options;
mod rank;
mod report;

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::cluster::ClusterProfile;
use crate::config::Settings;
use crate::model::memory::estimate_memory;
use crate::model::parallel::{Device, Placement};
use crate::model::time::{
    compat::pipette_compat_ms, estimate, placement_kinds, ClusterFabric, ConfigCosts, TimeError,
    TimeModel, TimeRequest,
};
use crate::plan::experts::ExpertPlan;
use crate::plan::hetero::{class_orders, gpu_classes, Arrangement};
use crate::plan::mapping::{
    map_config, search_mapping, FullObjective, MappingError, MappingSearch, MappingState,
    PairFabric,
};
use crate::plan::space::{candidates, SpaceOptions};
use balance::balanced_configs;
use cluster::{check_dtype, cluster_shape};
pub use error::PlanError;
use error::{no_candidates, nothing_fits, nothing_fits_per_stage, Candidates};
use layouts::{best_per_layout, layout_best};
pub use layouts::{ExpertLayouts, LayoutBest};
pub use options::{
    default_budget, MappingMode, MemoryHeadroom, PlanOptions, COMPAT_BUDGET,
    DEFAULT_EXHAUSTIVE_LIMIT, DEFAULT_MAPPING_THRESHOLD, DEFAULT_TOP_K, MAX_BUDGET,
};
use rank::{best, by_cost, cost, stage_needs};
pub use rank::{derive_seed, simpler};
use report::{even_split, stage_plans};
pub use report::{
    rank_mapping, EvenSplit, HeterogeneousPlan, Plan, PlanEstimate, PlanStats, RankMapping,
    RankedConfig, SearchSettings, SixteenBitEstimate, StagePlan, Ties,
};

/// Plans `settings` on `cluster` (see the module doc).
pub fn plan(
    settings: &Settings,
    cluster: &ClusterProfile,
    options: &PlanOptions,
) -> Result<Plan, PlanError> {
    if options.time_model == TimeModel::Amp {
        return Err(PlanError::UnsupportedTimeModel(TimeModel::Amp));
    }
    let shape = cluster_shape(cluster)?;
    let precision = settings.training.precision;
    let fabric = ClusterFabric::new(cluster, precision, &options.calibration)?;
    check_dtype(cluster, &fabric, settings)?;
    let classes = gpu_classes(cluster, &fabric, options.headroom);
    let heterogeneous = classes.len() > 1;
    // One arrangement (the profile's order, every node swap allowed) on a homogeneous
    // cluster: the plan is then exactly what it was before heterogeneous planning.
    let orders = if heterogeneous {
        class_orders(classes.len())
    } else {
        vec![(0..classes.len()).collect()]
    };
    let arrangements = orders
        .iter()
        .map(|order| {
            Arrangement::new(
                cluster,
                &fabric,
                &classes,
                order,
                options.headroom,
                precision,
                &options.calibration,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let gpus = shape.nodes * shape.gpus_per_node;
    let identity = Placement::identity(gpus, shape.gpus_per_node).devices;

    // 1. Candidates: every configuration on every arrangement, and on a heterogeneous
    //    cluster each configuration's layers balanced over each arrangement's stages.
    // Groups may span the nodes of an NVLink domain; the Pipette-compat model has no
    // context parallelism.
    let space = SpaceOptions {
        nvlink_nodes: shape.nvlink_nodes,
        context_parallel_from: if options.time_model == TimeModel::Pipette {
            options.space.context_parallel_from
        } else {
            u64::MAX
        },
        ..options.space.clone()
    };
    let all = candidates(
        settings,
        shape.nodes as u64,
        shape.gpus_per_node as u64,
        &space,
    );
    if all.is_empty() {
        return Err(no_candidates(settings, &shape));
    }
    let mut configs = all;
    let mut pairs: Vec<(usize, usize)> = (0..configs.len())
        .flat_map(|c| (0..arrangements.len()).map(move |a| (c, a)))
        .collect();
    if heterogeneous && options.space.uneven_layers {
        // Balanced splits are never among the candidates' own (even, first/last) splits,
        // but two arrangements may balance a shape alike: one configuration, two pairs.
        let known = configs.len();
        for (config, a) in balanced_configs(settings, &configs, &arrangements, &identity, options) {
            let at = match configs[known..].iter().position(|c| *c == config) {
                Some(at) => known + at,
                None => {
                    configs.push(config);
                    configs.len() - 1
                }
            };
            pairs.push((at, a));
        }
    }

    // 2. Memory: every stage against its own GPUs.
    let needs: Vec<Vec<u64>> = configs
        .par_iter()
        .map(|c| stage_needs(settings, c, &options.calibration))
        .collect();
    let peaks: Vec<u64> = needs
        .iter()
        .map(|n| n.iter().copied().max().unwrap_or(0))
        .collect();
    let fits = |(c, a): (usize, usize)| {
        needs[c]
            .iter()
            .enumerate()
            .all(|(s, &need)| need <= arrangements[a].stage_usable(&configs[c], s))
    };
    let fitting: Vec<usize> = (0..pairs.len()).filter(|&p| fits(pairs[p])).collect();
    let usable = shape
        .gpu_memory_bytes
        .saturating_sub(options.headroom.bytes(shape.gpu_memory_bytes));
    if fitting.is_empty() {
        if heterogeneous {
            return Err(nothing_fits_per_stage(
                settings,
                &shape,
                options,
                Candidates {
                    configs: &configs,
                    pairs: &pairs,
                    needs: &needs,
                },
                &arrangements,
                &classes,
            ));
        }
        return Err(nothing_fits(
            settings, &shape, options, &configs, &peaks, usable,
        ));
    }

    // 3. Rank on each arrangement's torchrun default placement: the best `top_k`, in
    //    the order a full ranking gives them ([`rank::best`]).
    let costs: Vec<Result<ConfigCosts, TimeError>> = fitting
        .par_iter()
        .map(|&p| {
            let (c, a) = pairs[p];
            ConfigCosts::with_tables(
                &settings.model,
                &settings.training,
                &configs[c],
                &options.calibration,
                &options.time_options,
                arrangements[a].fabric.tables(),
            )
        })
        .collect();
    let costs = costs.into_iter().collect::<Result<Vec<_>, _>>()?;
    let kinds: Vec<u8> = arrangements
        .iter()
        .map(|a| placement_kinds(&a.fabric, &identity))
        .collect();
    let top_k = options.top_k.max(1);
    let bound = |i: usize| match options.time_model {
        // The bound is the Pipette model's; the compat formula is ranked in full.
        TimeModel::Pipette => {
            let a = pairs[fitting[i]].1;
            costs[i].lower_bound_ms(&arrangements[a].fabric, &identity, kinds[a])
        }
        _ => f64::NEG_INFINITY,
    };
    let value = |i: usize| {
        let (c, a) = pairs[fitting[i]];
        cost(
            settings,
            options.time_model,
            &costs[i],
            &configs[c],
            &arrangements[a].fabric,
            &identity,
        )
    };
    let order = |(i, ms): (usize, f64), (j, other): (usize, f64)| {
        let (p, q) = (fitting[i], fitting[j]);
        by_cost((ms, &configs[pairs[p].0]), (other, &configs[pairs[q].0]))
            .then_with(|| pairs[p].1.cmp(&pairs[q].1))
    };
    // With experts, the best of every expert layout too, for the report's comparison
    // (the Pipette model's: the compat models have no expert terms). That pass reads the
    // ranking's bounds and values again: each is computed once.
    let layouts_too = options.expert_layouts
        && settings.model.moe.is_some()
        && options.time_model == TimeModel::Pipette;
    let (kept, layout_items) = if layouts_too {
        let bounds: Vec<f64> = (0..fitting.len()).into_par_iter().map(bound).collect();
        let values: Vec<OnceLock<f64>> = (0..fitting.len()).map(|_| OnceLock::new()).collect();
        let bound = |i: usize| bounds[i];
        let value = |i: usize| *values[i].get_or_init(|| value(i));
        let kept = best(fitting.len(), top_k, bound, value, order);
        let layout = |i: usize| {
            let c = &configs[pairs[fitting[i]].0];
            (c.ep, c.etp)
        };
        let layouts = best_per_layout(fitting.len(), layout, &kept, bound, value, order);
        (kept, layouts)
    } else {
        (best(fitting.len(), top_k, bound, value, order), Vec::new())
    };
    // Every fitting configuration is ranked, by its full evaluation or by a bound that
    // puts it behind the best `top_k`: one evaluation each, as the statistics count them.
    let ranking_evaluations = fitting.len() as u64;
    let mut costs: Vec<Option<ConfigCosts>> = costs.into_iter().map(Some).collect();
    let ranked: Vec<(usize, f64, ConfigCosts)> = kept
        .into_iter()
        .map(|(i, ms)| (fitting[i], ms, costs[i].take().expect("each kept once")))
        .collect();

    // 4. Map the best, node swaps confined to each arrangement's classes.
    let pair_fabrics: Vec<PairFabric> = arrangements
        .iter()
        .map(|a| PairFabric::new(&a.fabric))
        .collect();
    let budget = options.budget.unwrap_or_else(|| match options.time_model {
        TimeModel::PipetteCompat => default_budget(gpus).min(COMPAT_BUDGET),
        _ => default_budget(gpus),
    });
    let mapped: Vec<Result<_, MappingError>> = ranked
        .par_iter()
        .enumerate()
        .map(|(k, (p, identity_ms, costs))| {
            let (c, a) = pairs[*p];
            let arrangement = &arrangements[a];
            let seed = derive_seed(options.seed, k);
            let search = match options.mapping {
                MappingMode::Auto => MappingSearch::Auto {
                    limit: options.exhaustive_limit,
                    budget,
                    seed,
                },
                MappingMode::Anneal => MappingSearch::Anneal { budget, seed },
                MappingMode::Exhaustive => MappingSearch::Exhaustive {
                    limit: options.exhaustive_limit,
                },
                MappingMode::Identity => MappingSearch::Identity,
            };
            let mut result = match options.time_model {
                TimeModel::PipetteCompat => {
                    let model = &settings.model;
                    let micro = configs[c].micro_batch;
                    let fabric = &arrangement.fabric;
                    let mut objective = FullObjective::new(|d: &[Device]| {
                        pipette_compat_ms(costs, model, micro, fabric, d)
                    });
                    search_mapping(&mut objective, &arrangement.space, &search)
                }
                // Context parallelism: incremental like the rest (groups of tp × cp ranks),
                // at the budget the full evaluation had, so the searches and plans are
                // what they were.
                _ if configs[c].cp > 1 => {
                    let search = match search {
                        MappingSearch::Auto {
                            limit,
                            budget,
                            seed,
                        } => MappingSearch::Auto {
                            limit,
                            budget: budget.min(COMPAT_BUDGET),
                            seed,
                        },
                        MappingSearch::Anneal { budget, seed } => MappingSearch::Anneal {
                            budget: budget.min(COMPAT_BUDGET),
                            seed,
                        },
                        other => other,
                    };
                    map_config(costs, &pair_fabrics[a], &arrangement.space, &search)
                }
                _ => map_config(costs, &pair_fabrics[a], &arrangement.space, &search),
            }?;
            // Hysteresis: a mapping that gains less than the threshold over the
            // arrangement's default order (torchrun's on a homogeneous cluster) is not worth
            // a permuted launch; keep the default order and its cost.
            let searched_ms = result.cost_ms;
            if searched_ms > identity_ms * (1.0 - options.mapping_threshold) {
                result.state =
                    MappingState::identity(arrangement.space.nodes(), result.state.gpus_per_node());
                result.cost_ms = *identity_ms;
            }
            // Back to the profile's node positions.
            for n in &mut result.state.node_order {
                *n = arrangement.order[*n];
            }
            Ok((result, searched_ms))
        })
        .collect();
    let mapped = mapped.into_iter().collect::<Result<Vec<_>, _>>()?;

    let mut top: Vec<(RankedConfig, MappingState, u64, usize)> = ranked
        .iter()
        .zip(mapped)
        .map(|((p, identity_ms, _), (result, searched_ms))| {
            let (c, a) = pairs[*p];
            (
                RankedConfig {
                    config: configs[c].clone(),
                    peak_memory_bytes: peaks[c],
                    iteration_ms: *identity_ms,
                    mapped_ms: result.cost_ms,
                    searched_ms,
                    method: result.method,
                    evaluations: result.evaluations,
                    placement: result.state.placement(),
                },
                result.state,
                result.evaluations,
                a,
            )
        })
        .collect();
    let mapping_evaluations: u64 = top.iter().map(|t| t.2).sum();
    // Stable: equal costs keep the ranking's order.
    top.sort_by(|a, b| a.0.mapped_ms.total_cmp(&b.0.mapped_ms));
    // Ties: every mapped configuration within the model's stated error of the fastest;
    // the simplest of them runs (the faster on equal shapes).
    let window = options.time_model.stated_error().unwrap_or(0.0);
    let fastest = top[0].0.mapped_ms;
    let count = top
        .iter()
        .take_while(|t| t.0.mapped_ms <= fastest * (1.0 + window))
        .count()
        .max(1);
    let chosen = (0..count)
        .min_by(|&a, &b| simpler(&top[a].0.config, &top[b].0.config).then(a.cmp(&b)))
        .unwrap_or(0);
    let ties = Ties {
        window,
        count,
        chosen,
    };
    let (best, state, _, arrangement) = top[chosen].clone();

    let placement = state.placement();
    let request = TimeRequest {
        model: &settings.model,
        training: &settings.training,
        config: &best.config,
        cluster,
        placement: &placement,
        calibration: &options.calibration,
        options: options.time_options,
    };
    let time = estimate(&request, options.time_model)?;
    let memory = estimate_memory(
        &settings.model,
        &settings.training,
        &best.config,
        &options.calibration,
    );
    let heterogeneous = heterogeneous.then(|| HeterogeneousPlan {
        stages: stage_plans(
            settings,
            options,
            &best.config,
            &arrangements[arrangement],
            &classes,
            &memory,
            &time,
        ),
        even_split: even_split(settings, cluster, options, time.iteration_ms),
    });
    let in_16_bit = match &settings.training.low_precision {
        None => None,
        Some(low) => {
            let training = crate::config::TrainingSettings {
                low_precision: None,
                ..settings.training.clone()
            };
            let request = TimeRequest {
                training: &training,
                ..request
            };
            let memory = estimate_memory(
                &settings.model,
                &training,
                &best.config,
                &options.calibration,
            );
            Some(SixteenBitEstimate {
                low_precision: format!(
                    "{} {}, {} recipe",
                    low.bits.as_str().to_uppercase(),
                    low.format,
                    low.recipe
                ),
                iteration_ms: estimate(&request, options.time_model)?.iteration_ms,
                peak_memory_bytes: memory.peak_bytes,
            })
        }
    };
    let mapping = rank_mapping(cluster, &state, best.method, best.evaluations);
    let experts = ExpertPlan::new(&settings.model, &best.config, &placement);
    // The pick and the best of every other expert layout on the default order of their
    // arrangements, in the profile's positions.
    let expert_layouts = if layout_items.is_empty() {
        None
    } else {
        let default_devices = |a: usize| -> Vec<Device> {
            identity
                .iter()
                .map(|d| Device {
                    node: arrangements[a].order[d.node],
                    gpu: d.gpu,
                })
                .collect()
        };
        let pick_layout = (best.config.ep, best.config.etp);
        let pick = layout_best(
            settings,
            options,
            &best.config,
            &fabric,
            cluster,
            &default_devices(arrangement),
        )?;
        let others = layout_items
            .par_iter()
            .map(|&(i, _)| pairs[fitting[i]])
            .filter(|&(c, _)| (configs[c].ep, configs[c].etp) != pick_layout)
            .map(|(c, a)| {
                layout_best(
                    settings,
                    options,
                    &configs[c],
                    &fabric,
                    cluster,
                    &default_devices(a),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Some(ExpertLayouts { pick, others })
    };
    Ok(Plan {
        config: best.config.clone(),
        spares: Vec::new(),
        mapping,
        estimate: PlanEstimate {
            iteration_ms: time.iteration_ms,
            peak_memory_bytes: memory.peak_bytes,
            gpu_memory_bytes: shape.gpu_memory_bytes,
            usable_memory_bytes: usable,
            time,
            memory,
            in_16_bit,
        },
        baseline_mapping_ms: best.iteration_ms,
        placement,
        stats: PlanStats {
            candidates: pairs.len(),
            fitting: fitting.len(),
            mapped: top.len(),
            ranking_evaluations,
            mapping_evaluations,
            evaluations: ranking_evaluations + mapping_evaluations,
        },
        top: top.into_iter().map(|t| t.0).collect(),
        ties,
        search: SearchSettings {
            time_model: options.time_model,
            mapping: options.mapping,
            budget,
            exhaustive_limit: options.exhaustive_limit,
            seed: options.seed,
            top_k: options.top_k.max(1),
            headroom: options.headroom,
            mapping_threshold: options.mapping_threshold,
        },
        heterogeneous,
        experts,
        expert_layouts,
    })
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    use super::*;
    use crate::model::parallel::ParallelConfig;

    #[test]
    fn derived_seeds_differ_and_repeat() {
        assert_eq!(derive_seed(1, 0), derive_seed(1, 0));
        assert_ne!(derive_seed(1, 0), derive_seed(1, 1));
        assert_ne!(derive_seed(1, 0), derive_seed(2, 0));
    }

    /// The budget grows with the GPUs up to 128 of them, then stays: larger clusters would
    /// otherwise spend seconds annealing for hundredths of a percent (see
    /// [`default_budget`]).
    #[test]
    fn the_default_budget_is_capped() {
        assert_eq!(default_budget(16), 50_000);
        assert_eq!(default_budget(64), 64_000);
        assert_eq!(default_budget(128), 128_000);
        assert_eq!(default_budget(1024), 128_000);
        assert_eq!(default_budget(16_384), 128_000);
        assert_eq!(default_budget(usize::MAX), 128_000);
    }

    #[test]
    fn headroom_in_bytes() {
        assert_eq!(MemoryHeadroom::Fraction(0.05).bytes(100), 5);
        assert_eq!(MemoryHeadroom::Bytes(7).bytes(100), 7);
        assert_eq!(MemoryHeadroom::default(), MemoryHeadroom::Fraction(0.05));
    }

    #[test]
    fn ties_break_on_the_configuration() {
        let a = ParallelConfig::even(8, 1, 2, 1, 1);
        let b = ParallelConfig::even(8, 2, 1, 1, 1);
        assert_eq!(by_cost((1.0, &a), (1.0, &b)), Ordering::Less);
        assert_eq!(by_cost((2.0, &a), (1.0, &b)), Ordering::Greater);
    }
}
