//! The plan as the planner hands it out ([`Plan`] and the views inside it), and how the
//! winner's stages, even-split comparison and host/device mapping are put together.

use std::collections::BTreeMap;

use serde::Serialize;

use super::balance::{stage_usables, with_split, StageTables};
use super::options::{MappingMode, MemoryHeadroom, PlanOptions};
use super::plan;
use crate::cluster::ClusterProfile;
use crate::config::Settings;
use crate::model::memory::MemoryEstimate;
use crate::model::parallel::{ParallelConfig, Placement};
use crate::model::time::{TimeEstimate, TimeModel};
use crate::plan::hetero::{Arrangement, GpuClass};
use crate::plan::layers::layer_capacity;
use crate::plan::mapping::{MappingState, SearchMethod};

/// The plan: the configuration, where each rank runs, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub config: ParallelConfig,
    /// The profile's nodes the plan leaves out, host names (`[]` when none): hot spares,
    /// not launched, ready to take a failed node's place ([`crate::plan::subset`]).
    pub spares: Vec<String>,
    pub mapping: RankMapping,
    pub estimate: PlanEstimate,
    /// The same configuration on torchrun's default placement, ms per iteration.
    pub baseline_mapping_ms: f64,
    /// `devices[rank]`, positions in the cluster profile.
    pub placement: Placement,
    /// The mapped configurations, fastest first.
    pub top: Vec<RankedConfig>,
    /// Which of `top` are ties with the fastest, and which of them the plan runs.
    pub ties: Ties,
    pub search: SearchSettings,
    pub stats: PlanStats,
    /// On a cluster that mixes kinds of GPU: each stage's GPUs, layers, memory and time,
    /// and the best even split for comparison. Absent on a homogeneous cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heterogeneous: Option<HeterogeneousPlan>,
    /// A mixture-of-experts model's layout: dispatcher, experts per rank, tokens per
    /// expert, where the all-to-all runs. Absent for a dense model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<crate::plan::experts::ExpertPlan>,
    /// A mixture-of-experts model's pick and the best configuration of every other expert
    /// layout (ep × etp) that fits, each with every term of its estimate on torchrun's
    /// default order: why the pick's layout wins. Absent for a dense model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_layouts: Option<super::ExpertLayouts>,
}

impl Plan {
    /// The runner-up, a position in [`Plan::top`]: the fastest configuration other than the
    /// one that runs. The one definition every report uses; where a tie made a simpler
    /// configuration run ([`Ties::chosen`] > 0), it is the fastest (#1), faster than the
    /// pick.
    pub fn runner_up(&self) -> Option<usize> {
        (0..self.top.len()).find(|&i| i != self.ties.chosen)
    }
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
    /// Under `--fp8-format` / `--fp4-format`: what the same plan (configuration and
    /// placement) would take in 16-bit, so a user sees what the low precision buys. The
    /// planner never changes the precision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_16_bit: Option<SixteenBitEstimate>,
}

/// The plan's estimate without the low precision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SixteenBitEstimate {
    /// The plan's low precision, e.g. `fp8 hybrid, delayed scaling`.
    pub low_precision: String,
    pub iteration_ms: f64,
    pub peak_memory_bytes: u64,
}

/// One mapped configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankedConfig {
    pub config: ParallelConfig,
    pub peak_memory_bytes: u64,
    /// On torchrun's default placement.
    pub iteration_ms: f64,
    /// On the mapping the plan runs: the best found when it beats torchrun's order by the
    /// mapping threshold, else torchrun's order (`iteration_ms`).
    pub mapped_ms: f64,
    /// On the best mapping the search found.
    pub searched_ms: f64,
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
    /// See [`super::PlanOptions::mapping_threshold`].
    pub mapping_threshold: f64,
}

/// The mapped configurations the model cannot tell apart from the fastest.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ties {
    /// The model's stated error the ties are judged by (0 for a model without one).
    pub window: f64,
    /// How many of [`Plan::top`], from the first, lie within `window` of the fastest
    /// (at least 1: the fastest itself).
    pub count: usize,
    /// The one the plan runs, a position in [`Plan::top`]: the simplest of the ties
    /// ([`super::simpler`]).
    pub chosen: usize,
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

/// The stages of the winning `config` on its `arrangement`.
pub(super) fn stage_plans(
    settings: &Settings,
    options: &PlanOptions,
    config: &ParallelConfig,
    arrangement: &Arrangement,
    classes: &[GpuClass],
    memory: &MemoryEstimate,
    time: &TimeEstimate,
) -> Vec<StagePlan> {
    let usable = stage_usables(arrangement, config);
    let tables = StageTables::new(
        settings,
        &with_split(config, Vec::new()),
        options,
        arrangement.fabric.tables(),
        false,
    );
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
pub(super) fn even_split(
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

/// Host names and device indices of a mapping (also how the trial launches another of the
/// ranked configurations on its own mapping).
pub fn rank_mapping(
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
