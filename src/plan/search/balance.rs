//! Uneven layer splits on heterogeneous clusters: per-stage tables, balanced splits of
//! every plain-1F1B shape and their refinement under the full time model.

use rayon::prelude::*;

use super::options::PlanOptions;
use super::rank::{config_key, cost, stage_needs};
use crate::config::{ModelSpec, Settings};
use crate::model::parallel::{Device, ParallelConfig};
use crate::model::time::{ClusterFabric, ConfigCosts, Fabric};
use crate::plan::hetero::Arrangement;
use crate::plan::layers::{balance_layers, ordered_by_speed, refine_split, BalancedSplit};
use crate::plan::space::layer_splits;

/// A configuration's stages with every possible layer count, for balancing: per count
/// `l` (from 1 to the most one stage can hold), every stage's memory need and the
/// configuration's costs with `l` layers on every stage (of a model of `l × pp` layers, so
/// that the time model accepts the split). A stage's need and slot depend only on its own
/// layer count and position, so these tables answer for any split.
pub(super) struct StageTables {
    base: ParallelConfig,
    pub(super) most: u64,
    needs: Vec<Vec<u64>>,
    costs: Vec<ConfigCosts>,
}

impl StageTables {
    /// The tables of `base`'s shape; `with_costs: false` leaves the costs out (memory
    /// only). `None` when the time model refuses the shape.
    pub(super) fn new(
        settings: &Settings,
        base: &ParallelConfig,
        options: &PlanOptions,
        with_costs: bool,
    ) -> Option<Self> {
        let pp = base.pp as usize;
        let most = settings
            .model
            .num_layers
            .checked_sub(base.pp.checked_sub(1)?)?;
        let mut needs = Vec::with_capacity(most as usize);
        let mut costs = Vec::with_capacity(most as usize);
        for l in 1..=most {
            let config = with_split(base, vec![l; pp]);
            needs.push(stage_needs(settings, &config, &options.calibration));
            if with_costs {
                let model = ModelSpec {
                    num_layers: l * base.pp,
                    ..settings.model.clone()
                };
                costs.push(
                    ConfigCosts::new(
                        &model,
                        &settings.training,
                        &config,
                        &options.calibration,
                        &options.time_options,
                    )
                    .ok()?,
                );
            }
        }
        Some(StageTables {
            base: base.clone(),
            most,
            needs,
            costs,
        })
    }

    /// Whether `l` layers on stage `s` fit in `usable[s]`.
    pub(super) fn fits(&self, usable: &[u64], s: usize, l: u64) -> bool {
        l >= 1 && l <= self.most && self.needs[l as usize - 1][s] <= usable[s]
    }

    /// Stage `s`'s slot with `l` layers on `devices` of `fabric`: its slowest replica.
    fn slot_ms(&self, fabric: &ClusterFabric, devices: &[Device], s: usize, l: u64) -> f64 {
        if l < 1 || l > self.most || self.costs.is_empty() {
            return f64::INFINITY;
        }
        let costs = &self.costs[l as usize - 1];
        let tp = costs.tp();
        (0..costs.dp())
            .map(|d| {
                let at = tp * (d + costs.dp() * s);
                costs.group_slot_ms(fabric, &devices[at..at + tp], s)
            })
            .fold(0.0, f64::max)
    }
}

/// `base` with `split` layers per stage.
pub(super) fn with_split(base: &ParallelConfig, split: Vec<u64>) -> ParallelConfig {
    ParallelConfig {
        layers_per_stage: split,
        ..base.clone()
    }
}

/// Per stage of `config` on `arrangement`: its usable memory.
pub(super) fn stage_usables(arrangement: &Arrangement, config: &ParallelConfig) -> Vec<u64> {
    (0..config.pp as usize)
        .map(|s| arrangement.stage_usable(config, s))
        .collect()
}

/// Balanced splits (see [`crate::plan::layers`]) of every configuration shape among `configs`
/// that runs the plain 1F1B schedule on more than one stage, on every arrangement, less
/// those the candidates already hold (the even and first/last splits of the same shape).
///
/// The interleaved schedule is left to even splits: our memory and time models split a
/// rank's layers evenly over its model chunks, and a layout that gives every chunk of a
/// fast rank more layers than a slow one's gains nothing the 1F1B split does not.
pub(super) fn balanced_configs(
    settings: &Settings,
    configs: &[ParallelConfig],
    arrangements: &[Arrangement],
    identity: &[Device],
    options: &PlanOptions,
) -> Vec<(ParallelConfig, usize)> {
    let mut bases: Vec<ParallelConfig> = configs
        .iter()
        .filter(|c| c.vpp.is_none() && c.pp > 1)
        .map(|c| with_split(c, Vec::new()))
        .collect();
    bases.sort_by(|a, b| config_key(a).cmp(&config_key(b)));
    bases.dedup();
    let layers = settings.model.num_layers;
    bases
        .par_iter()
        .flat_map_iter(|base| {
            let mut out: Vec<(ParallelConfig, usize)> = Vec::new();
            let Some(tables) = StageTables::new(settings, base, options, true) else {
                return out;
            };
            let known = layer_splits(layers, base.pp, true);
            for (a, arrangement) in arrangements.iter().enumerate() {
                let usable = stage_usables(arrangement, base);
                let split = balance_layers(
                    layers,
                    base.pp as usize,
                    |s, l| tables.slot_ms(&arrangement.fabric, identity, s, l),
                    |s, l| tables.fits(&usable, s, l),
                );
                let Some(split) = split else {
                    continue;
                };
                let split = refine_balanced(
                    settings,
                    &tables,
                    split,
                    &usable,
                    arrangement,
                    identity,
                    options,
                );
                let config = with_split(base, split);
                if !known.contains(&config.layers_per_stage) {
                    out.push((config, a));
                }
            }
            out
        })
        .collect()
}

/// A balanced split on `arrangement` improved by moving single layers under the full
/// time model (see [`crate::plan::layers::refine_split`]), kept ordered by stage speed.
fn refine_balanced(
    settings: &Settings,
    tables: &StageTables,
    split: BalancedSplit,
    usable: &[u64],
    arrangement: &Arrangement,
    identity: &[Device],
    options: &PlanOptions,
) -> Vec<u64> {
    let config = &tables.base;
    let pp = config.pp as usize;
    let per_stage = (config.tp * config.dp) as usize;
    // Stages ranked by their slowest GPU (higher is faster).
    let speed: Vec<f64> = (0..pp)
        .map(|s| {
            identity[per_stage * s..per_stage * (s + 1)]
                .iter()
                .map(|&d| Fabric::ms_per_gflop(&arrangement.fabric, d))
                .fold(0.0, f64::max)
        })
        .collect();
    let speed_rank: Vec<u64> = speed
        .iter()
        .map(|x| speed.iter().filter(|y| *y > x).count() as u64)
        .collect();
    let cost_of = |split: &[u64]| -> Option<f64> {
        if split
            .iter()
            .enumerate()
            .any(|(s, &l)| !tables.fits(usable, s, l))
        {
            return None;
        }
        let candidate = with_split(config, split.to_vec());
        let costs = ConfigCosts::new(
            &settings.model,
            &settings.training,
            &candidate,
            &options.calibration,
            &options.time_options,
        )
        .ok()?;
        Some(cost(
            settings,
            options.time_model,
            &costs,
            &candidate,
            &arrangement.fabric,
            identity,
        ))
    };
    let Some(current) = cost_of(&split.layers) else {
        return split.layers;
    };
    refine_split(
        split.layers,
        current,
        pp,
        |layers| ordered_by_speed(layers, &split.capacity, &speed_rank, usable),
        cost_of,
    )
    .0
}
