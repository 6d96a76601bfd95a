//! Uneven layer splits on heterogeneous clusters: per-stage tables, balanced splits of
//! every plain-1F1B shape and their refinement under the full time model.

use std::cell::OnceCell;

use rayon::prelude::*;

use super::options::PlanOptions;
use super::rank::{config_key, cost, stage_needs};
use crate::config::{ModelSpec, Settings};
use crate::model::parallel::{Device, ParallelConfig};
use crate::model::time::{
    placement_kinds, ClusterFabric, ConfigCosts, Fabric, PerfTables, StageSync, TimeModel,
};
use crate::plan::hetero::Arrangement;
use crate::plan::layers::{balance_layers, refine_split, BalancedSplit, SpeedOrder};
use crate::plan::space::layer_splits;

/// A configuration's stages with every possible layer count, for balancing: per count
/// `l` (from 1 to the most one stage can hold), every stage's memory need and the
/// configuration's costs with `l` layers on every stage (of a model of `l × pp` layers, so
/// that the time model accepts the split). A stage's need and slot depend only on its own
/// layer count and position, so these tables answer for any split.
///
/// The costs are built when first asked for: a balancing and its refinement look at a few
/// layer counts around the balanced split, and costing a configuration is most of what
/// balancing the shapes of a large mixed cluster takes. Whether the time model accepts the
/// shape does not depend on the layer count, so the first count's costs, built at once,
/// answer for all of them.
pub(super) struct StageTables<'a> {
    base: ParallelConfig,
    pub(super) most: u64,
    needs: Vec<Vec<u64>>,
    /// `Some` with costs: per count `l` at `l − 1`, the costs once built.
    costs: Option<Vec<OnceCell<ConfigCosts>>>,
    settings: &'a Settings,
    options: &'a PlanOptions,
    /// The cluster's tables the costs are priced with.
    perf: &'a PerfTables,
}

impl<'a> StageTables<'a> {
    /// The tables of `base`'s shape; `with_costs: false` leaves the costs out (memory
    /// only). `None` when the time model refuses the shape.
    pub(super) fn new(
        settings: &'a Settings,
        base: &ParallelConfig,
        options: &'a PlanOptions,
        perf: &'a PerfTables,
        with_costs: bool,
    ) -> Option<Self> {
        let pp = base.pp as usize;
        let most = settings
            .model
            .num_layers
            .checked_sub(base.pp.checked_sub(1)?)?;
        let needs = (1..=most)
            .map(|l| {
                stage_needs(
                    settings,
                    &with_split(base, vec![l; pp]),
                    &options.calibration,
                )
            })
            .collect();
        let mut tables = StageTables {
            base: base.clone(),
            most,
            needs,
            costs: None,
            settings,
            options,
            perf,
        };
        if with_costs && most >= 1 {
            let first = OnceCell::new();
            let _ = first.set(tables.build_costs(1)?);
            let mut costs = vec![first];
            costs.resize_with(most as usize, OnceCell::new);
            tables.costs = Some(costs);
        }
        Some(tables)
    }

    /// The costs with `l` layers on every stage.
    fn build_costs(&self, l: u64) -> Option<ConfigCosts> {
        let pp = self.base.pp as usize;
        let model = ModelSpec {
            num_layers: l * self.base.pp,
            ..self.settings.model.clone()
        };
        ConfigCosts::with_tables(
            &model,
            &self.settings.training,
            &with_split(&self.base, vec![l; pp]),
            &self.options.calibration,
            &self.options.time_options,
            self.perf,
        )
        .ok()
    }

    /// The costs with `l` layers on every stage (`1 ≤ l ≤ most`), built when first asked
    /// for; `None` without costs (or, which the first count's success rules out, when the
    /// time model refuses the count).
    fn costs(&self, l: u64) -> Option<&ConfigCosts> {
        let cell = self.costs.as_ref()?.get(l.checked_sub(1)? as usize)?;
        if cell.get().is_none() {
            let _ = cell.set(self.build_costs(l)?);
        }
        cell.get()
    }

    /// Whether `l` layers on stage `s` fit in `usable[s]`.
    pub(super) fn fits(&self, usable: &[u64], s: usize, l: u64) -> bool {
        l >= 1 && l <= self.most && self.needs[l as usize - 1][s] <= usable[s]
    }
}

/// The time model's figures of stage `s` with `l` layers on one placement.
struct StagePieces {
    /// Per replica `d`: the slot of its tp group of stage `s`.
    slots: Vec<f64>,
    /// The stage's exposed data-parallel synchronisation.
    sync: StageSync,
    /// Its optimizer step on the placement's slowest-memory GPU kind.
    optimizer_ms: f64,
}

/// The time model's value of every split of one [`StageTables`] shape on one placement,
/// from pieces memoised by stage and layer count.
///
/// A stage's slot and data-parallel synchronisation depend only on its own layer count and
/// position (the pipeline sends not at all), so every split a balancing and its refinement
/// try is the same few hundred pieces added up anew: the pieces are [`ConfigCosts`]' own
/// (`group_slot_ms`, `hop_ms`, `stage_sync`, `replica_ms_from`) taken from the tables'
/// costs and combined in [`ConfigCosts::evaluate`]'s order, so a split's value is bit for
/// bit what `ConfigCosts::new` of that split and `evaluate` give (a test checks it), without
/// costing the configuration again or walking every rank.
struct SplitCosts<'a> {
    tables: &'a StageTables<'a>,
    /// The costs with one layer a stage: what every count shares (shape, schedule).
    first: &'a ConfigCosts,
    fabric: &'a ClusterFabric,
    devices: &'a [Device],
    /// The GPU kinds placed ([`placement_kinds`]).
    kinds: u8,
    /// Per replica: its pipeline hops summed in stage order, and its wrap-around hop.
    hop_sums: Vec<f64>,
    wraps: Vec<f64>,
    /// Stage `s` with `l` layers at `s · most + l − 1`, filled when first asked for.
    pieces: Vec<OnceCell<StagePieces>>,
}

impl<'a> SplitCosts<'a> {
    /// `None` when the tables hold no costs.
    fn new(
        tables: &'a StageTables<'a>,
        fabric: &'a ClusterFabric,
        devices: &'a [Device],
    ) -> Option<Self> {
        let costs = tables.costs(1)?;
        let (tp, dp, pp) = (costs.tp(), costs.dp(), costs.pp());
        let group = |d: usize, s: usize| {
            let at = tp * (d + dp * s);
            &devices[at..at + tp]
        };
        let mut hop_sums = Vec::with_capacity(dp);
        let mut wraps = Vec::with_capacity(dp);
        for d in 0..dp {
            let mut sum = 0.0;
            for s in 0..pp.saturating_sub(1) {
                sum += costs.hop_ms(fabric, group(d, s), group(d, s + 1));
            }
            hop_sums.push(sum);
            wraps.push(if costs.has_wrap_hop() {
                costs.hop_ms(fabric, group(d, pp - 1), group(d, 0))
            } else {
                0.0
            });
        }
        Some(SplitCosts {
            tables,
            first: costs,
            fabric,
            devices,
            kinds: placement_kinds(fabric, devices),
            hop_sums,
            wraps,
            pieces: (0..pp * tables.most as usize)
                .map(|_| OnceCell::new())
                .collect(),
        })
    }

    /// Stage `s`'s pieces with `l` layers (`1 ≤ l ≤ most`).
    fn pieces(&self, s: usize, l: u64) -> &StagePieces {
        self.pieces[s * self.tables.most as usize + l as usize - 1].get_or_init(|| {
            let Some(costs) = self.tables.costs(l) else {
                // Not reached (the first count's costs vouch for every count): a count
                // the time model refused would be one no split may take.
                return StagePieces {
                    slots: vec![f64::INFINITY; self.hop_sums.len()],
                    sync: StageSync {
                        grad_reduce_ms: f64::INFINITY,
                        param_gather_ms: f64::INFINITY,
                    },
                    optimizer_ms: f64::INFINITY,
                };
            };
            let tp = costs.tp();
            let slots = (0..costs.dp())
                .map(|d| {
                    let at = tp * (d + costs.dp() * s);
                    costs.group_slot_ms(self.fabric, &self.devices[at..at + tp], s)
                })
                .collect();
            StagePieces {
                slots,
                sync: costs.stage_sync(self.fabric, self.devices, s),
                optimizer_ms: costs.stage_optimizer_ms(self.kinds, s),
            }
        })
    }

    /// Stage `s`'s slot with `l` layers: its slowest replica's (infinite beyond the
    /// tables).
    fn slot_ms(&self, s: usize, l: u64) -> f64 {
        if l < 1 || l > self.tables.most {
            return f64::INFINITY;
        }
        self.pieces(s, l).slots.iter().copied().fold(0.0, f64::max)
    }

    /// The iteration time of `split` (every count within the tables), as
    /// [`ConfigCosts::evaluate`] adds it up.
    fn cost(&self, split: &[u64]) -> f64 {
        let costs = self.first;
        let stages: Vec<&StagePieces> = split
            .iter()
            .enumerate()
            .map(|(s, &l)| self.pieces(s, l))
            .collect();
        let mut pipeline = 0.0f64;
        for d in 0..costs.dp() {
            let mut slot = f64::NEG_INFINITY;
            for stage in &stages {
                if stage.slots[d] > slot {
                    slot = stage.slots[d];
                }
            }
            pipeline = pipeline.max(costs.replica_ms_from(slot, self.hop_sums[d], self.wraps[d]));
        }
        let mut grad = 0.0f64;
        let mut gather = 0.0f64;
        if costs.dp() > 1 {
            for stage in &stages {
                grad = grad.max(stage.sync.grad_reduce_ms);
                gather = gather.max(stage.sync.param_gather_ms);
            }
        }
        let optimizer = stages
            .iter()
            .map(|stage| stage.optimizer_ms)
            .fold(0.0, f64::max);
        pipeline + grad + gather + optimizer
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
    // Every arrangement is the same cluster's: one set of tables serves them all.
    let Some(perf) = arrangements.first().map(|a| a.fabric.tables()) else {
        return Vec::new();
    };
    bases
        .par_iter()
        .flat_map_iter(|base| {
            let mut out: Vec<(ParallelConfig, usize)> = Vec::new();
            let Some(tables) = StageTables::new(settings, base, options, perf, true) else {
                return out;
            };
            let known = layer_splits(layers, base.pp, true);
            for (a, arrangement) in arrangements.iter().enumerate() {
                let usable = stage_usables(arrangement, base);
                let Some(split_costs) = SplitCosts::new(&tables, &arrangement.fabric, identity)
                else {
                    continue;
                };
                let split = balance_layers(
                    layers,
                    base.pp as usize,
                    |s, l| split_costs.slot_ms(s, l),
                    |s, l| tables.fits(&usable, s, l),
                );
                let Some(split) = split else {
                    continue;
                };
                let split = refine_balanced(
                    settings,
                    &split_costs,
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
    split_costs: &SplitCosts<'_>,
    split: BalancedSplit,
    usable: &[u64],
    arrangement: &Arrangement,
    identity: &[Device],
    options: &PlanOptions,
) -> Vec<u64> {
    let tables = split_costs.tables;
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
        if options.time_model != TimeModel::PipetteCompat {
            return Some(split_costs.cost(split));
        }
        let candidate = with_split(config, split.to_vec());
        let costs = ConfigCosts::with_tables(
            &settings.model,
            &settings.training,
            &candidate,
            &options.calibration,
            &options.time_options,
            arrangement.fabric.tables(),
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
    let order = SpeedOrder {
        capacity: &split.capacity,
        speed_rank: &speed_rank,
        memory_class: usable,
    };
    refine_split(split.layers, current, pp, &order, cost_of).0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterProfile;
    use crate::config::{settings_from_megatron_args, Recompute, RecomputeMethod};
    use crate::model::parallel::Placement;
    use crate::plan::hetero::{class_orders, gpu_classes};

    /// Every split one or two single-layer moves away from the even one, on every
    /// arrangement of A100 and V100 nodes, for shapes with and without data parallelism,
    /// tensor parallelism, sequence parallelism, recomputation and the distributed
    /// optimizer: the pieces add up to exactly what the time model says of the split.
    #[test]
    fn a_split_costed_from_stage_pieces_is_what_the_time_model_says() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/clusters/a100-v100-mixed-4x8.json");
        let cluster = ClusterProfile::load(&path).unwrap();
        let settings =
            settings_from_megatron_args(&["--fp16".to_string()], Some("gpt3-13b"), &[]).unwrap();
        let options = PlanOptions::default();
        let precision = settings.training.precision;
        let fabric = ClusterFabric::new(&cluster, precision, &options.calibration).unwrap();
        let classes = gpu_classes(&cluster, &fabric, options.headroom);
        assert_eq!(classes.len(), 2, "a mixed cluster");
        let identity = Placement::identity(32, 8).devices;
        let layers = settings.model.num_layers;
        let shape = |tp, pp, dp, mb| ParallelConfig::even(layers, tp, pp, dp, mb);
        let bases = [
            shape(1, 2, 16, 1),
            shape(2, 4, 4, 2),
            ParallelConfig {
                sequence_parallel: true,
                distributed_optimizer: true,
                ..shape(4, 8, 1, 1)
            },
            ParallelConfig {
                recompute: Recompute::Full {
                    method: RecomputeMethod::Block,
                    num_layers: 2,
                },
                distributed_optimizer: true,
                ..shape(2, 4, 4, 1)
            },
            ParallelConfig {
                recompute: Recompute::Selective,
                sequence_parallel: true,
                ..shape(8, 2, 2, 4)
            },
        ];
        let mut checked = 0;
        for order in class_orders(classes.len()) {
            let arrangement = Arrangement::new(
                &cluster,
                &fabric,
                &classes,
                &order,
                options.headroom,
                precision,
                &options.calibration,
            )
            .unwrap();
            for base in &bases {
                let perf = arrangement.fabric.tables();
                let tables = StageTables::new(&settings, base, &options, perf, true).unwrap();
                let pieces = SplitCosts::new(&tables, &arrangement.fabric, &identity).unwrap();
                let pp = base.pp as usize;
                let even = base.layers_per_stage.clone();
                let mut splits = vec![even.clone()];
                for (a, b, c, d) in (0..pp * pp * pp * pp)
                    .map(|i| (i % pp, i / pp % pp, i / pp / pp % pp, i / pp / pp / pp))
                {
                    let mut split = even.clone();
                    split[a] -= 1;
                    split[b] += 1;
                    split[c] -= 1;
                    split[d] += 1;
                    if split.iter().all(|&l| l >= 1) {
                        splits.push(split);
                    }
                }
                for split in splits {
                    let config = with_split(base, split.clone());
                    let costs = ConfigCosts::with_tables(
                        &settings.model,
                        &settings.training,
                        &config,
                        &options.calibration,
                        &options.time_options,
                        perf,
                    )
                    .unwrap();
                    let whole = costs.evaluate(&arrangement.fabric, &identity);
                    assert_eq!(
                        pieces.cost(&split).to_bits(),
                        whole.to_bits(),
                        "{config:?} on order {order:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 1000, "{checked} splits");
    }
}
