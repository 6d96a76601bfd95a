//! The planner's one entry point, [`plan`]: settings and a cluster profile in, the fastest
//! configuration that fits and its rank mapping out.
//!
//! 1. **Candidates**: every configuration Megatron accepts for this model on the profile's
//!    nodes × GPUs per node ([`super::space::candidates`]), pinned settings respected.
//! 2. **Memory**: drop every configuration whose worst stage needs more than the smallest
//!    GPU's memory less the headroom ([`MemoryHeadroom`], default 5 %). When none is left:
//!    [`PlanError::NothingFits`], with the smallest need and what would make it fit.
//! 3. **Rank** the rest by the time model on torchrun's default placement (in parallel;
//!    ties broken by a stable key of the configuration, so the order is the same on every
//!    machine).
//! 4. **Map** the best `top_k` (in parallel, each with a seed derived from the plan's seed
//!    and its rank, so the thread count changes nothing) with [`super::mapping`], and keep
//!    the lowest mapped cost (ties: the better-ranked configuration).
//!
//! Pure: no I/O, no clock. Timing a plan is left to callers (the benchmark).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::Serialize;

use super::mapping::{
    map_config, search_mapping, FullObjective, MappingError, MappingSearch, MappingSpace,
    MappingState, PairFabric, SearchMethod,
};
use super::space::{candidates, SpaceOptions};
use crate::cluster::profile::{Dtype, GpuInventory};
use crate::cluster::ClusterProfile;
use crate::config::{Precision, Recompute, RecomputeMethod, Settings};
use crate::model::calibration::Calibration;
use crate::model::memory::{estimate_memory, MemoryEstimate};
use crate::model::parallel::{Device, ParallelConfig, Placement};
use crate::model::time::{
    compat::pipette_compat_ms, estimate, ClusterFabric, ConfigCosts, ThroughputBasis, TimeError,
    TimeEstimate, TimeModel, TimeOptions, TimeRequest,
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
    /// Configurations Megatron accepts with the pinned settings.
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
    #[error("no configuration fits in GPU memory: the smallest needs {} per GPU ({}), the GPUs have {} of which {} usable after the headroom; {}", gib(*smallest_peak_bytes), describe(config_of_smallest), gib(*gpu_memory_bytes), gib(*usable_memory_bytes), suggestions.join("; "))]
    NothingFits {
        smallest_peak_bytes: u64,
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
    let fabric = ClusterFabric::new(cluster, settings.training.precision, &options.calibration)?;
    check_dtype(cluster, &fabric, settings)?;
    let hosts: Vec<&str> = cluster.hosts().collect();
    let space = MappingSpace::new(&fabric, &hosts)?;
    let gpus = shape.nodes * shape.gpus_per_node;

    // 1. Candidates.
    let all = candidates(
        settings,
        shape.nodes as u64,
        shape.gpus_per_node as u64,
        &options.space,
    );
    if all.is_empty() {
        return Err(no_candidates(settings, &shape));
    }

    // 2. Memory.
    let usable = shape
        .gpu_memory_bytes
        .saturating_sub(options.headroom.bytes(shape.gpu_memory_bytes));
    let peaks: Vec<u64> = all
        .par_iter()
        .map(|c| peak_bytes(settings, c, &options.calibration))
        .collect();
    let fitting: Vec<usize> = (0..all.len()).filter(|&i| peaks[i] <= usable).collect();
    if fitting.is_empty() {
        return Err(nothing_fits(
            settings, &shape, options, &all, &peaks, usable,
        ));
    }

    // 3. Rank on the identity placement.
    let identity = Placement::identity(gpus, shape.gpus_per_node).devices;
    let ranked: Vec<Result<(usize, f64, ConfigCosts), TimeError>> = fitting
        .par_iter()
        .map(|&i| {
            let costs = ConfigCosts::new(
                &settings.model,
                &settings.training,
                &all[i],
                &options.calibration,
                &options.time_options,
            )?;
            let ms = cost(
                settings,
                options.time_model,
                &costs,
                &all[i],
                &fabric,
                &identity,
            );
            Ok((i, ms, costs))
        })
        .collect();
    let mut ranked = ranked.into_iter().collect::<Result<Vec<_>, _>>()?;
    ranked.sort_by(|a, b| by_cost((a.1, &all[a.0]), (b.1, &all[b.0])));
    let ranking_evaluations = ranked.len() as u64;
    ranked.truncate(options.top_k.max(1));

    // 4. Map the best.
    let pairs = PairFabric::new(&fabric);
    let budget = options.budget.unwrap_or_else(|| match options.time_model {
        TimeModel::PipetteCompat => default_budget(gpus).min(COMPAT_BUDGET),
        _ => default_budget(gpus),
    });
    let mapped: Vec<Result<_, MappingError>> = ranked
        .par_iter()
        .enumerate()
        .map(|(k, (i, _, costs))| {
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
            match options.time_model {
                TimeModel::PipetteCompat => {
                    let model = &settings.model;
                    let micro = all[*i].micro_batch;
                    let mut objective = FullObjective::new(|d: &[Device]| {
                        pipette_compat_ms(costs, model, micro, &fabric, d)
                    });
                    search_mapping(&mut objective, &space, &search)
                }
                _ => map_config(costs, &pairs, &space, &search),
            }
        })
        .collect();
    let mapped = mapped.into_iter().collect::<Result<Vec<_>, _>>()?;

    let mut top: Vec<(RankedConfig, MappingState, u64)> = ranked
        .iter()
        .zip(mapped)
        .map(|((i, identity_ms, _), result)| {
            (
                RankedConfig {
                    config: all[*i].clone(),
                    peak_memory_bytes: peaks[*i],
                    iteration_ms: *identity_ms,
                    mapped_ms: result.cost_ms,
                    method: result.method,
                    evaluations: result.evaluations,
                    placement: result.state.placement(),
                },
                result.state,
                result.evaluations,
            )
        })
        .collect();
    let mapping_evaluations: u64 = top.iter().map(|t| t.2).sum();
    // Stable: equal costs keep the ranking's order.
    top.sort_by(|a, b| a.0.mapped_ms.total_cmp(&b.0.mapped_ms));
    let (best, state, _) = top[0].clone();

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
            candidates: all.len(),
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
    })
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
    let fits = |s: &Settings, nodes: usize| {
        smallest_peak(s, nodes, g, options).is_some_and(|p| p <= usable)
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
    let more = (1..=10)
        .map(|k| shape.nodes << k)
        .find(|&nodes| fits(settings, nodes));
    match more {
        Some(nodes) => suggestions.push(format!(
            "about {} GPUs ({nodes} nodes of {g}) would fit",
            nodes * g
        )),
        None => suggestions.push(format!(
            "no number of these GPUs up to {} would fit: use GPUs with at least {} of memory, a shorter sequence or a smaller model",
            (shape.nodes << 10) * g,
            gib(smallest.saturating_add(options.headroom.bytes(shape.gpu_memory_bytes)))
        )),
    }
    PlanError::NothingFits {
        smallest_peak_bytes: smallest,
        gpu_memory_bytes: shape.gpu_memory_bytes,
        usable_memory_bytes: usable,
        config_of_smallest: Box::new(all[at].clone()),
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
