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
//!    arrangement, so the order is the same on every machine).
//! 4. **Map** the best `top_k` (in parallel, each with a seed derived from the plan's seed
//!    and its rank, so the thread count changes nothing) with [`super::mapping`], node
//!    swaps confined to a GPU class on mixed clusters, and keep the lowest mapped cost
//!    (ties: the better-ranked configuration).
//!
//! On a homogeneous cluster there is one arrangement (the profile's order, every swap
//! allowed) and the plan is what it was before heterogeneous planning, bit for bit.
//!
//! Pure: no I/O, no clock. Timing a plan is left to callers (the benchmark).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::Serialize;

use super::hetero::{class_orders, gpu_classes, Arrangement, GpuClass};
use super::layers::{
    balance_layers, layer_capacity, ordered_by_speed, refine_split, BalancedSplit,
};
use super::mapping::{
    map_config, search_mapping, FullObjective, MappingError, MappingSearch, MappingState,
    PairFabric, SearchMethod,
};
use super::space::{candidates, layer_splits, SpaceOptions};
use crate::cluster::profile::{Dtype, GpuInventory};
use crate::cluster::ClusterProfile;
use crate::config::{ModelSpec, Precision, Recompute, RecomputeMethod, Settings};
use crate::model::calibration::Calibration;
use crate::model::memory::{estimate_memory, MemoryEstimate};
use crate::model::parallel::{Device, ParallelConfig, Placement};
use crate::model::time::{
    compat::pipette_compat_ms, estimate, ClusterFabric, ConfigCosts, Fabric, ThroughputBasis,
    TimeError, TimeEstimate, TimeModel, TimeOptions, TimeRequest,
};

/// Memory kept free on every GPU beyond the estimate's peak.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryHeadroom {
    /// A share of the GPU's memory, in [0, 1).
    Fraction(f64),
    /// A number of bytes.
    Bytes(u64),
}

impl Default for MemoryHeadroom {
    /// 5 % of the GPU's memory: room for what the estimate cannot see (allocator
    /// fragmentation beyond its calibration, the dataloader's pinned buffers, a larger
    /// NCCL pool) without throwing away configurations that fit in practice.
    fn default() -> Self {
        MemoryHeadroom::Fraction(0.05)
    }
}

impl MemoryHeadroom {
    /// The bytes kept free on a GPU of `gpu_bytes`.
    pub fn bytes(self, gpu_bytes: u64) -> u64 {
        match self {
            MemoryHeadroom::Fraction(f) => (gpu_bytes as f64 * f.clamp(0.0, 1.0)) as u64,
            MemoryHeadroom::Bytes(b) => b,
        }
    }
}

/// How the rank mapping of each mapped configuration is searched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MappingMode {
    /// Exhaustive when every state fits in the limit, else annealing.
    #[default]
    Auto,
    Anneal,
    Exhaustive,
    /// torchrun's default order.
    Identity,
}

/// What the planner may choose and how hard it searches.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    /// Memory kept free on every GPU beyond the estimated peak (default 5 %).
    pub headroom: MemoryHeadroom,
    /// The model that ranks and maps: [`TimeModel::Pipette`] (default, evaluated
    /// incrementally) or [`TimeModel::PipetteCompat`] (Pipette's published formula,
    /// re-evaluated in full for every state: its default budget is at most
    /// [`COMPAT_BUDGET`], meant for clusters of a few dozen nodes).
    pub time_model: TimeModel,
    pub time_options: TimeOptions,
    pub calibration: Calibration,
    pub space: SpaceOptions,
    pub mapping: MappingMode,
    /// Evaluations per mapped configuration when annealing; `None`: [`default_budget`].
    pub budget: Option<u64>,
    /// The most states an exhaustive mapping search visits.
    pub exhaustive_limit: u64,
    pub seed: u64,
    /// How many of the best-ranked configurations get a mapping search.
    pub top_k: usize,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            headroom: MemoryHeadroom::default(),
            time_model: TimeModel::Pipette,
            time_options: TimeOptions::default(),
            calibration: Calibration::default(),
            space: SpaceOptions::default(),
            mapping: MappingMode::Auto,
            budget: None,
            exhaustive_limit: DEFAULT_EXHAUSTIVE_LIMIT,
            seed: 0,
            top_k: DEFAULT_TOP_K,
        }
    }
}

/// Configurations mapped by default.
pub const DEFAULT_TOP_K: usize = 8;

/// States an exhaustive search may visit by default: 8 nodes' orders (8! = 40 320) with
/// room to spare, a few milliseconds with incremental evaluation.
pub const DEFAULT_EXHAUSTIVE_LIMIT: u64 = 50_000;

/// Annealing evaluations per mapped configuration by default: 1 000 per GPU, at least
/// 50 000 and at most 2 000 000. On the example clusters doubling it gains under 0.02 %
/// of iteration time; with the default top-K the whole plan stays within a few seconds
/// on two cores up to 8192 GPUs (see `scripts/bench-plan`).
pub fn default_budget(gpus: usize) -> u64 {
    (gpus as u64).saturating_mul(1_000).clamp(50_000, 2_000_000)
}

/// The most evaluations per mapped configuration by default with the Pipette-compat
/// model, which costs a full evaluation per state.
pub const COMPAT_BUDGET: u64 = 20_000;

/// The plan: the configuration, where each rank runs, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub config: ParallelConfig,
    pub mapping: RankMapping,
    pub estimate: PlanEstimate,
    /// The same configuration on torchrun's default placement, ms per iteration.
    pub baseline_mapping_ms: f64,
    /// `devices[rank]`, positions in the cluster profile.
    pub placement: Placement,
    /// The mapped configurations, best first.
    pub top: Vec<RankedConfig>,
    pub search: SearchSettings,
    pub stats: PlanStats,
    /// On a cluster that mixes kinds of GPU: each stage's GPUs, layers, memory and time,
    /// and the best even split for comparison. Absent on a homogeneous cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heterogeneous: Option<HeterogeneousPlan>,
}

/// The pipeline stages of a plan on a heterogeneous cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeterogeneousPlan {
    /// First to last.
    pub stages: Vec<StagePlan>,
    /// The best plan whose stages hold equal layers (planned with uneven splits off), when
    /// this plan was made with uneven splits allowed and an even split fits.
    pub even_split: Option<EvenSplit>,
}

/// One pipeline stage of a heterogeneous plan (before the rank mapping, which keeps every
/// stage on GPUs of the same kind).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StagePlan {
    pub stage: usize,
    /// The GPU model(s) the stage runs on, `+`-joined when it spans kinds.
    pub gpu: String,
    /// GPUs of the stage: tp × dp.
    pub gpus: u64,
    pub layers: u64,
    /// The most layers this stage's memory holds.
    pub layer_capacity: u64,
    /// The estimated peak per GPU.
    pub peak_memory_bytes: u64,
    /// The stage's smallest GPU memory, and what the plan may use of it.
    pub gpu_memory_bytes: u64,
    pub usable_memory_bytes: u64,
    /// One micro-batch's forward and backward pass on the slowest pipeline, ms.
    pub slot_ms: f64,
}

/// The best even split on the same cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvenSplit {
    pub config: ParallelConfig,
    pub iteration_ms: f64,
    /// Its iteration time over the plan's.
    pub ratio: f64,
}

/// How torchrun realises the placement: node ranks and each node's device order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankMapping {
    /// Host of node rank 0, 1, ... (`--node-rank` of each host).
    pub node_order: Vec<String>,
    /// Per host, the `CUDA_VISIBLE_DEVICES` order (device indices): local rank `l` runs on
    /// the `l`-th.
    pub cuda_visible_devices: BTreeMap<String, Vec<u32>>,
    /// The same as positions in the profile.
    pub state: MappingState,
    #[serde(flatten)]
    pub method: SearchMethod,
    pub evaluations: u64,
}

/// The winner's estimates.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanEstimate {
    pub iteration_ms: f64,
    pub peak_memory_bytes: u64,
    /// The smallest GPU's memory, and what the plan may use of it (less the headroom).
    pub gpu_memory_bytes: u64,
    pub usable_memory_bytes: u64,
    pub time: TimeEstimate,
    pub memory: MemoryEstimate,
}

/// One mapped configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankedConfig {
    pub config: ParallelConfig,
    pub peak_memory_bytes: u64,
    /// On torchrun's default placement.
    pub iteration_ms: f64,
    /// On the best mapping found.
    pub mapped_ms: f64,
    #[serde(flatten)]
    pub method: SearchMethod,
    pub evaluations: u64,
    /// The best mapping found, as ranks' GPUs (the winner's is also `Plan::placement`).
    #[serde(skip)]
    pub placement: Placement,
}

/// The search as it was run, to reproduce it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchSettings {
    pub time_model: TimeModel,
    pub mapping: MappingMode,
    pub budget: u64,
    pub exhaustive_limit: u64,
    pub seed: u64,
    pub top_k: usize,
    pub headroom: MemoryHeadroom,
}

/// How much the planner looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PlanStats {
    /// Configurations Megatron accepts with the pinned settings (on mixed GPUs: per order
    /// of the GPU kinds along the pipeline, balanced splits included).
    pub candidates: usize,
    /// Those that fit in memory.
    pub fitting: usize,
    /// Those that got a mapping search.
    pub mapped: usize,
    /// Time-model evaluations: one per fitting configuration to rank, and every state of
    /// every mapping search (incremental ones included).
    pub ranking_evaluations: u64,
    pub mapping_evaluations: u64,
    pub evaluations: u64,
}

/// Why no plan came out.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("the cluster profile lists no nodes (profile the allocated nodes, or give a cluster file with at least one)")]
    EmptyCluster,
    #[error("node {host} has no GPU inventory (run `pipette profile` on the nodes, or fill in default GPUs for an imported bandwidth file)")]
    UnknownGpus { host: String },
    #[error("{host} has {gpus} GPUs but {first_host} has {first_gpus} (the planner needs the same GPU count on every node; leave the odd nodes out)")]
    MixedGpuCounts {
        host: String,
        gpus: usize,
        first_host: String,
        first_gpus: usize,
    },
    #[error("no parallel configuration of this model suits {nodes} node(s) × {gpus_per_node} GPUs{pins} (tp must divide the GPUs per node, the heads and the query groups; pp at most the {layers} layers; the global batch {global_batch} must divide by dp × micro-batch)")]
    NoCandidates {
        nodes: usize,
        gpus_per_node: usize,
        layers: u64,
        global_batch: u64,
        /// ", with the pinned settings" when some are pinned.
        pins: &'static str,
    },
    #[error("no configuration fits in GPU memory: the smallest needs {} per GPU ({}){}, the GPUs have {} of which {} usable after the headroom; {}", gib(*smallest_peak_bytes), describe(config_of_smallest), on_stage, gib(*gpu_memory_bytes), gib(*usable_memory_bytes), suggestions.join("; "))]
    NothingFits {
        smallest_peak_bytes: u64,
        /// On a heterogeneous cluster, the stage that overflows least and its GPUs
        /// (" on its stage 2 of 4 (V100-SXM2-32GB)"); empty otherwise.
        on_stage: String,
        gpu_memory_bytes: u64,
        usable_memory_bytes: u64,
        config_of_smallest: Box<ParallelConfig>,
        /// What would make a configuration fit, most practical first.
        suggestions: Vec<String>,
    },
    #[error("the planner ranks with the pipette or pipette-compat model, not {0} (use {0} to compare a plan, not to make one)")]
    UnsupportedTimeModel(TimeModel),
    #[error(transparent)]
    Time(#[from] TimeError),
    #[error(transparent)]
    Mapping(#[from] MappingError),
}

/// Bytes as GiB for messages.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// A configuration in a few words for messages.
fn describe(c: &ParallelConfig) -> String {
    let recompute = match &c.recompute {
        Recompute::None => "no recomputation".to_string(),
        Recompute::Selective => "selective recomputation".to_string(),
        Recompute::Full { .. } => "full recomputation".to_string(),
    };
    let mut text = format!(
        "tp={} pp={} dp={}, micro-batch {}, {recompute}",
        c.tp, c.pp, c.dp, c.micro_batch
    );
    if let Some(v) = c.vpp {
        text.push_str(&format!(", {v} virtual stages"));
    }
    if c.sequence_parallel {
        text.push_str(", sequence parallel");
    }
    if c.distributed_optimizer {
        text.push_str(", distributed optimizer");
    }
    text
}

/// A stable order of configurations, independent of how the space was enumerated.
fn config_key(c: &ParallelConfig) -> impl Ord + '_ {
    let recompute = match &c.recompute {
        Recompute::None => (0, 0, 0),
        Recompute::Selective => (1, 0, 0),
        Recompute::Full { method, num_layers } => (
            2,
            match method {
                RecomputeMethod::Uniform => 0,
                RecomputeMethod::Block => 1,
            },
            *num_layers,
        ),
    };
    (
        c.tp,
        c.pp,
        c.dp,
        c.micro_batch,
        c.vpp.unwrap_or(1),
        recompute,
        c.sequence_parallel,
        c.distributed_optimizer,
        &c.layers_per_stage,
    )
}

/// Orders (cost, configuration) pairs: lower cost first, then the stable key.
fn by_cost(a: (f64, &ParallelConfig), b: (f64, &ParallelConfig)) -> Ordering {
    a.0.total_cmp(&b.0)
        .then_with(|| config_key(a.1).cmp(&config_key(b.1)))
}

/// A seed per mapped configuration, from the plan's seed and the configuration's rank
/// (SplitMix64's finaliser, so neighbouring ranks get unrelated streams).
pub fn derive_seed(seed: u64, index: usize) -> u64 {
    let mut z = seed.wrapping_add((index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The cluster as the planner needs it: nodes, GPUs per node, the smallest GPU memory.
struct ClusterShape {
    nodes: usize,
    gpus_per_node: usize,
    gpu_memory_bytes: u64,
}

fn cluster_shape(cluster: &ClusterProfile) -> Result<ClusterShape, PlanError> {
    let first = cluster.nodes.first().ok_or(PlanError::EmptyCluster)?;
    let mut gpu_memory_bytes = u64::MAX;
    let mut first_gpus = None;
    for node in &cluster.nodes {
        let GpuInventory::Known { gpus, .. } = &node.gpus else {
            return Err(PlanError::UnknownGpus {
                host: node.host.clone(),
            });
        };
        let expected = *first_gpus.get_or_insert(gpus.len());
        if gpus.len() != expected {
            return Err(PlanError::MixedGpuCounts {
                host: node.host.clone(),
                gpus: gpus.len(),
                first_host: first.host.clone(),
                first_gpus: expected,
            });
        }
        for gpu in gpus {
            gpu_memory_bytes = gpu_memory_bytes.min(gpu.memory_bytes);
        }
    }
    Ok(ClusterShape {
        nodes: cluster.nodes.len(),
        gpus_per_node: first_gpus.unwrap_or(0),
        gpu_memory_bytes,
    })
}

/// Every GPU can train in the run's precision.
fn check_dtype(
    cluster: &ClusterProfile,
    fabric: &ClusterFabric,
    settings: &Settings,
) -> Result<(), PlanError> {
    for (n, node) in cluster.nodes.iter().enumerate() {
        for (i, gpu) in node.gpus().unwrap_or_default().iter().enumerate() {
            let device = Device { node: n, gpu: i };
            if fabric.throughput(device).basis == ThroughputBasis::Unsupported {
                let dtype = match settings.training.precision {
                    Precision::Fp16 => Dtype::Fp16,
                    Precision::Bf16 | Precision::Fp32 => Dtype::Bf16,
                };
                return Err(PlanError::Time(TimeError::NoTensorCores {
                    host: node.host.clone(),
                    index: gpu.index,
                    name: gpu.name.clone(),
                    dtype,
                }));
            }
        }
    }
    Ok(())
}

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
    let all = candidates(
        settings,
        shape.nodes as u64,
        shape.gpus_per_node as u64,
        &options.space,
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

    // 3. Rank on each arrangement's torchrun default placement.
    let ranked: Vec<Result<(usize, f64, ConfigCosts), TimeError>> = fitting
        .par_iter()
        .map(|&p| {
            let (c, a) = pairs[p];
            let costs = ConfigCosts::new(
                &settings.model,
                &settings.training,
                &configs[c],
                &options.calibration,
                &options.time_options,
            )?;
            let ms = cost(
                settings,
                options.time_model,
                &costs,
                &configs[c],
                &arrangements[a].fabric,
                &identity,
            );
            Ok((p, ms, costs))
        })
        .collect();
    let mut ranked = ranked.into_iter().collect::<Result<Vec<_>, _>>()?;
    let config_of = |p: usize| &configs[pairs[p].0];
    ranked.sort_by(|a, b| {
        by_cost((a.1, config_of(a.0)), (b.1, config_of(b.0)))
            .then_with(|| pairs[a.0].1.cmp(&pairs[b.0].1))
    });
    let ranking_evaluations = ranked.len() as u64;
    ranked.truncate(options.top_k.max(1));

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
        .map(|(k, (p, _, costs))| {
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
                _ => map_config(costs, &pair_fabrics[a], &arrangement.space, &search),
            }?;
            // Back to the profile's node positions.
            for n in &mut result.state.node_order {
                *n = arrangement.order[*n];
            }
            Ok(result)
        })
        .collect();
    let mapped = mapped.into_iter().collect::<Result<Vec<_>, _>>()?;

    let mut top: Vec<(RankedConfig, MappingState, u64, usize)> = ranked
        .iter()
        .zip(mapped)
        .map(|((p, identity_ms, _), result)| {
            let (c, a) = pairs[*p];
            (
                RankedConfig {
                    config: configs[c].clone(),
                    peak_memory_bytes: peaks[c],
                    iteration_ms: *identity_ms,
                    mapped_ms: result.cost_ms,
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
    let (best, state, _, arrangement) = top[0].clone();

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
    let mapping = rank_mapping(cluster, &state, best.method, best.evaluations);
    Ok(Plan {
        config: best.config.clone(),
        mapping,
        estimate: PlanEstimate {
            iteration_ms: time.iteration_ms,
            peak_memory_bytes: memory.peak_bytes,
            gpu_memory_bytes: shape.gpu_memory_bytes,
            usable_memory_bytes: usable,
            time,
            memory,
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
        search: SearchSettings {
            time_model: options.time_model,
            mapping: options.mapping,
            budget,
            exhaustive_limit: options.exhaustive_limit,
            seed: options.seed,
            top_k: options.top_k.max(1),
            headroom: options.headroom,
        },
        heterogeneous,
    })
}

/// A configuration's stages with every possible layer count, for balancing: per count
/// `l` (from 1 to the most one stage can hold), every stage's memory need and the
/// configuration's costs with `l` layers on every stage (of a model of `l × pp` layers, so
/// that the time model accepts the split). A stage's need and slot depend only on its own
/// layer count and position, so these tables answer for any split.
struct StageTables {
    base: ParallelConfig,
    most: u64,
    needs: Vec<Vec<u64>>,
    costs: Vec<ConfigCosts>,
}

impl StageTables {
    /// The tables of `base`'s shape; `with_costs: false` leaves the costs out (memory
    /// only). `None` when the time model refuses the shape.
    fn new(
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
    fn fits(&self, usable: &[u64], s: usize, l: u64) -> bool {
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
fn with_split(base: &ParallelConfig, split: Vec<u64>) -> ParallelConfig {
    ParallelConfig {
        layers_per_stage: split,
        ..base.clone()
    }
}

/// Per stage of `config` on `arrangement`: its usable memory.
fn stage_usables(arrangement: &Arrangement, config: &ParallelConfig) -> Vec<u64> {
    (0..config.pp as usize)
        .map(|s| arrangement.stage_usable(config, s))
        .collect()
}

/// Balanced splits (see [`super::layers`]) of every configuration shape among `configs`
/// that runs the plain 1F1B schedule on more than one stage, on every arrangement, less
/// those the candidates already hold (the even and first/last splits of the same shape).
///
/// The interleaved schedule is left to even splits: our memory and time models split a
/// rank's layers evenly over its model chunks, and a layout that gives every chunk of a
/// fast rank more layers than a slow one's gains nothing the 1F1B split does not.
fn balanced_configs(
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
/// time model (see [`super::layers::refine_split`]), kept ordered by stage speed.
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

/// The objective's value of `devices` for this configuration.
fn cost(
    settings: &Settings,
    time_model: TimeModel,
    costs: &ConfigCosts,
    config: &ParallelConfig,
    fabric: &ClusterFabric,
    devices: &[Device],
) -> f64 {
    match time_model {
        TimeModel::PipetteCompat => {
            pipette_compat_ms(costs, &settings.model, config.micro_batch, fabric, devices)
        }
        _ => costs.evaluate(fabric, devices),
    }
}

fn peak_bytes(settings: &Settings, config: &ParallelConfig, calibration: &Calibration) -> u64 {
    estimate_memory(&settings.model, &settings.training, config, calibration).peak_bytes
}

/// Every stage's memory need per GPU, first to last.
fn stage_needs(
    settings: &Settings,
    config: &ParallelConfig,
    calibration: &Calibration,
) -> Vec<u64> {
    estimate_memory(&settings.model, &settings.training, config, calibration)
        .stages
        .iter()
        .map(|s| s.total_bytes)
        .collect()
}

/// The stages of the winning `config` on its `arrangement`.
fn stage_plans(
    settings: &Settings,
    options: &PlanOptions,
    config: &ParallelConfig,
    arrangement: &Arrangement,
    classes: &[GpuClass],
    memory: &MemoryEstimate,
    time: &TimeEstimate,
) -> Vec<StagePlan> {
    let usable = stage_usables(arrangement, config);
    let tables = StageTables::new(settings, &with_split(config, Vec::new()), options, false);
    (0..config.pp as usize)
        .map(|s| StagePlan {
            stage: s,
            gpu: arrangement.stage_gpu(config, s, classes),
            gpus: config.tp * config.dp,
            layers: config.layers_per_stage[s],
            layer_capacity: tables.as_ref().map_or(0, |t| {
                layer_capacity(s, t.most, &|s, l| t.fits(&usable, s, l))
            }),
            peak_memory_bytes: memory.stages[s].total_bytes,
            gpu_memory_bytes: arrangement.stage_memory(config, s),
            usable_memory_bytes: usable[s],
            slot_ms: time.stages.get(s).map_or(0.0, |t| t.slot_ms),
        })
        .collect()
}

/// The comparison the report shows for a plan of `iteration_ms`: the same search with
/// even splits only; `None` when uneven splits are off already or no even split fits.
fn even_split(
    settings: &Settings,
    cluster: &ClusterProfile,
    options: &PlanOptions,
    iteration_ms: f64,
) -> Option<EvenSplit> {
    if !options.space.uneven_layers {
        return None;
    }
    let mut even = options.clone();
    even.space.uneven_layers = false;
    let even = plan(settings, cluster, &even).ok()?;
    Some(EvenSplit {
        ratio: even.estimate.iteration_ms / iteration_ms,
        iteration_ms: even.estimate.iteration_ms,
        config: even.config,
    })
}

/// Host names and device indices of a mapping.
fn rank_mapping(
    cluster: &ClusterProfile,
    state: &MappingState,
    method: SearchMethod,
    evaluations: u64,
) -> RankMapping {
    let node_order = state
        .node_order
        .iter()
        .map(|&n| cluster.nodes[n].host.clone())
        .collect();
    let cuda_visible_devices = state
        .node_order
        .iter()
        .zip(&state.gpu_order)
        .map(|(&n, order)| {
            let node = &cluster.nodes[n];
            let gpus = node.gpus().unwrap_or_default();
            let indices = order
                .iter()
                .map(|&g| gpus.get(g).map_or(g as u32, |gpu| gpu.index))
                .collect();
            (node.host.clone(), indices)
        })
        .collect();
    RankMapping {
        node_order,
        cuda_visible_devices,
        state: state.clone(),
        method,
        evaluations,
    }
}

fn no_candidates(settings: &Settings, shape: &ClusterShape) -> PlanError {
    let c = &settings.constraints;
    let pinned = c.tensor_parallel.is_some()
        || c.pipeline_parallel.is_some()
        || c.data_parallel.is_some()
        || c.micro_batch_size.is_some()
        || c.virtual_pipeline.is_some()
        || c.sequence_parallel.is_some()
        || c.recompute.is_some()
        || c.distributed_optimizer.is_some();
    PlanError::NoCandidates {
        nodes: shape.nodes,
        gpus_per_node: shape.gpus_per_node,
        layers: settings.model.num_layers,
        global_batch: settings.training.global_batch_size,
        pins: if pinned {
            ", with the pinned settings"
        } else {
            ""
        },
    }
}

/// The smallest peak of any candidate for these settings on `nodes` × `g` GPUs.
fn smallest_peak(
    settings: &Settings,
    nodes: usize,
    g: usize,
    options: &PlanOptions,
) -> Option<u64> {
    candidates(settings, nodes as u64, g as u64, &options.space)
        .par_iter()
        .map(|c| peak_bytes(settings, c, &options.calibration))
        .min()
}

/// The error when nothing fits, with what would make something fit.
fn nothing_fits(
    settings: &Settings,
    shape: &ClusterShape,
    options: &PlanOptions,
    all: &[ParallelConfig],
    peaks: &[u64],
    usable: u64,
) -> PlanError {
    let (at, &smallest) = peaks
        .iter()
        .enumerate()
        .min_by(|a, b| {
            a.1.cmp(b.1)
                .then_with(|| config_key(&all[a.0]).cmp(&config_key(&all[b.0])))
        })
        .expect("called with candidates");
    let g = shape.gpus_per_node;
    let shortfall = Shortfall {
        need: smallest,
        on_stage: String::new(),
        gpu_memory_bytes: shape.gpu_memory_bytes,
        usable_memory_bytes: usable,
        config: all[at].clone(),
    };
    let fits_here =
        |s: &Settings| smallest_peak(s, shape.nodes, g, options).is_some_and(|p| p <= usable);
    explain_shortfall(
        settings,
        shape,
        options,
        shortfall,
        &fits_here,
        (shape.gpu_memory_bytes, usable, ""),
    )
}

/// The candidates of a plan: configurations, the (configuration, arrangement) pairs
/// considered, and every configuration's memory need per stage.
#[derive(Clone, Copy)]
struct Candidates<'a> {
    configs: &'a [ParallelConfig],
    pairs: &'a [(usize, usize)],
    needs: &'a [Vec<u64>],
}

/// The configuration that comes closest to fitting, and where it does not.
struct Shortfall {
    /// The memory need of its stage that overflows least, per GPU.
    need: u64,
    on_stage: String,
    gpu_memory_bytes: u64,
    usable_memory_bytes: u64,
    config: ParallelConfig,
}

/// The error when nothing fits on a heterogeneous cluster: the configuration and
/// arrangement whose worst stage overflows its own GPUs' memory by the smallest share.
fn nothing_fits_per_stage(
    settings: &Settings,
    shape: &ClusterShape,
    options: &PlanOptions,
    considered: Candidates<'_>,
    arrangements: &[Arrangement],
    classes: &[GpuClass],
) -> PlanError {
    let Candidates {
        configs,
        pairs,
        needs,
    } = considered;
    // Per pair: (need / usable of its worst stage, that stage).
    let worst = |&(c, a): &(usize, usize)| {
        (0..needs[c].len())
            .map(|s| {
                let usable = arrangements[a].stage_usable(&configs[c], s).max(1);
                (needs[c][s] as f64 / usable as f64, s)
            })
            .max_by(|x, y| x.0.total_cmp(&y.0))
            .unwrap_or((f64::INFINITY, 0))
    };
    let (c, a, s) = pairs
        .iter()
        .map(|p| (worst(p), p))
        .min_by(|(x, p), (y, q)| {
            x.0.total_cmp(&y.0)
                .then_with(|| config_key(&configs[p.0]).cmp(&config_key(&configs[q.0])))
                .then_with(|| p.1.cmp(&q.1))
        })
        .map(|((_, s), &(c, a))| (c, a, s))
        .expect("called with candidates");
    let arrangement = &arrangements[a];
    let config = &configs[c];
    let gpu = arrangement.stage_gpu(config, s, classes);
    let shortfall = Shortfall {
        need: needs[c][s],
        on_stage: format!(" on its stage {} of {} ({gpu})", s + 1, config.pp),
        gpu_memory_bytes: arrangement.stage_memory(config, s),
        usable_memory_bytes: arrangement.stage_usable(config, s),
        config: config.clone(),
    };
    let fits_here = |s: &Settings| {
        let all = candidates(
            s,
            shape.nodes as u64,
            shape.gpus_per_node as u64,
            &options.space,
        );
        let identity =
            Placement::identity(shape.nodes * shape.gpus_per_node, shape.gpus_per_node).devices;
        all.par_iter().any(|c| {
            let needs = stage_needs(s, c, &options.calibration);
            arrangements.iter().any(|a| {
                needs
                    .iter()
                    .enumerate()
                    .all(|(s, &need)| need <= a.stage_usable(c, s))
            })
        }) || (options.space.uneven_layers
            && !balanced_configs(s, &all, arrangements, &identity, options).is_empty())
    };
    // More GPUs: of the kind with the most memory.
    let largest = classes
        .iter()
        .max_by_key(|k| (k.usable_bytes, std::cmp::Reverse(k.nodes[0])))
        .expect("a heterogeneous cluster has classes");
    explain_shortfall(
        settings,
        shape,
        options,
        shortfall,
        &fits_here,
        (largest.memory_bytes, largest.usable_bytes, &largest.name),
    )
}

/// [`PlanError::NothingFits`] for `shortfall`, with what would make something fit:
/// unpinning settings (`fits_here` says whether anything fits with other settings on this
/// cluster), or more GPUs like those of `more` (memory, usable memory, and their name
/// when the cluster mixes kinds).
fn explain_shortfall(
    settings: &Settings,
    shape: &ClusterShape,
    options: &PlanOptions,
    shortfall: Shortfall,
    fits_here: &(dyn Fn(&Settings) -> bool + Sync),
    more: (u64, u64, &str),
) -> PlanError {
    let g = shape.gpus_per_node;
    let smallest = shortfall.need;
    let fits = |s: &Settings, nodes: usize| {
        if nodes == shape.nodes {
            fits_here(s)
        } else {
            smallest_peak(s, nodes, g, options).is_some_and(|p| p <= more.1)
        }
    };
    let mut suggestions = Vec::new();
    let pins = &settings.constraints;

    if pins
        .recompute
        .as_ref()
        .is_some_and(|r| !matches!(r, Recompute::Full { .. }))
    {
        let mut s = settings.clone();
        s.constraints.recompute = Some(Recompute::Full {
            method: RecomputeMethod::Uniform,
            num_layers: 1,
        });
        if fits(&s, shape.nodes) {
            suggestions.push("full recomputation would fit (--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 instead of the pinned recomputation)".to_string());
        }
    }
    if pins.micro_batch_size.is_some_and(|m| m > 1) {
        let mut s = settings.clone();
        s.constraints.micro_batch_size = Some(1);
        if fits(&s, shape.nodes) {
            suggestions.push(format!(
                "micro-batch 1 would fit (the pinned micro-batch is {})",
                pins.micro_batch_size.unwrap_or(1)
            ));
        }
    }
    if pins.distributed_optimizer == Some(false) {
        let mut s = settings.clone();
        s.constraints.distributed_optimizer = None;
        if fits(&s, shape.nodes) {
            suggestions.push(
                "the distributed optimizer would fit (--use-distributed-optimizer)".to_string(),
            );
        }
    }
    let sizes_pinned = pins.tensor_parallel.is_some()
        || pins.pipeline_parallel.is_some()
        || pins.data_parallel.is_some()
        || pins.virtual_pipeline.is_some()
        || pins.sequence_parallel.is_some();
    if sizes_pinned {
        let mut s = settings.clone();
        s.constraints.tensor_parallel = None;
        s.constraints.pipeline_parallel = None;
        s.constraints.data_parallel = None;
        s.constraints.virtual_pipeline = None;
        s.constraints.sequence_parallel = None;
        if fits(&s, shape.nodes) {
            suggestions.push("leaving tp, pp, dp, virtual stages and sequence parallelism to the planner would fit (unpin them)".to_string());
        }
    }
    // More nodes of the same kind: doubling until something fits.
    let (more_memory, _, kind) = more;
    let kind = if kind.is_empty() {
        String::new()
    } else {
        format!(" {kind}")
    };
    let enough = (1..=10)
        .map(|k| shape.nodes << k)
        .find(|&nodes| fits(settings, nodes));
    match enough {
        Some(nodes) => suggestions.push(format!(
            "about {} GPUs ({nodes} nodes of {g}{kind}) would fit",
            nodes * g
        )),
        None => suggestions.push(format!(
            "no number of these GPUs up to {} would fit: use GPUs with at least {} of memory, a shorter sequence or a smaller model",
            (shape.nodes << 10) * g,
            gib(smallest.saturating_add(options.headroom.bytes(more_memory)))
        )),
    }
    PlanError::NothingFits {
        smallest_peak_bytes: smallest,
        on_stage: shortfall.on_stage,
        gpu_memory_bytes: shortfall.gpu_memory_bytes,
        usable_memory_bytes: shortfall.usable_memory_bytes,
        config_of_smallest: Box::new(shortfall.config),
        suggestions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_seeds_differ_and_repeat() {
        assert_eq!(derive_seed(1, 0), derive_seed(1, 0));
        assert_ne!(derive_seed(1, 0), derive_seed(1, 1));
        assert_ne!(derive_seed(1, 0), derive_seed(2, 0));
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
