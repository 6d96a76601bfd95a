//! Rank mapping: which host gets which node rank, and which physical GPU each local rank
//! uses, so that slow links carry the least critical traffic.
//!
//! Megatron orders ranks tp-cp-ep-dp-pp (tp fastest) and torchrun's static rendezvous makes
//! `rank = node_rank · nproc + local_rank`, so every node holds a contiguous block of `g`
//! ranks (`g` GPUs per node). A mapping is therefore a [`MappingState`]: the node that gets
//! each node rank, and per node rank the GPU each local rank sees (the order of
//! `CUDA_VISIBLE_DEVICES`). Only nodes with equally many GPUs are interchangeable; this
//! module requires every node to have the same count ([`MappingError::MixedGpuCounts`]).
//!
//! # Searches ([`MappingSearch`])
//!
//! - **Annealing**: moves swap two node ranks (the nodes trade places and each keeps its
//!   own GPU order), or swap two local ranks' GPUs inside one node (half and half; with
//!   two or three nodes, whose orders are few, uniformly over the distinct swaps). The
//!   temperature falls geometrically with the number of evaluations (not wall time), from
//!   a start measured on a short random walk (a typical uphill step is accepted with
//!   probability 1/e); the budget is cut into up to eight rounds, each after the first
//!   resuming from the best state seen. Last, nodes and GPUs of the best state are put
//!   back in index order wherever that costs nothing (moves that change nothing drift
//!   freely), so a plan moves only what pays. A seeded portable generator (ChaCha8) makes
//!   the result the same on every machine and thread count.
//! - **Exhaustive**: every node order × every GPU order of every node, visited in an order
//!   where consecutive states differ by one swap (Heap's algorithm per component, combined
//!   like an odometer), so each state costs one incremental evaluation. When the product
//!   exceeds the limit but the node orders alone do not, only node orders are enumerated
//!   with each node's GPUs in index order ([`SearchMethod::Exhaustive`] says which).
//! - **Auto**: exhaustive when every state fits in the limit, else annealing.
//!
//! **Node groups** ([`MappingSpace::with_node_groups`]): on a heterogeneous cluster the
//! planner fixes which class of GPU holds which pipeline stages (a stage's layer count is
//! sized to its GPUs' memory), so node swaps are confined to runs of node ranks whose nodes
//! are of one class: annealing proposes only those, exhaustive search enumerates the orders
//! of each run. With one group (the default) every node swap is allowed, as before.
//!
//! Symmetry is used where it is cheap and exact: a node whose GPU pairs all attain the same
//! bandwidth and whose GPUs are equally fast gains nothing from reordering its GPUs (links
//! to other nodes are node-pair figures), so no GPU move is proposed or enumerated there.
//!
//! # Objective
//!
//! The objective is the full time model. [`PipetteObjective`] evaluates the Pipette model
//! incrementally: it caches every tp group's slot, every pipeline hop, every data-parallel
//! ring link between two groups, each replica's pipeline time and each stage's
//! synchronisation, with the maxima (and the rings' minima) in tournament trees (scanned
//! lists when short). A swap touches the ranks of at most two nodes, so only their groups,
//! the hops and ring links next to them, their replicas and stages, and O(log) tree nodes
//! are recomputed; a swap of GPUs inside a node leaves its links to other nodes as they
//! were; a rejected move is undone from a journal. The pieces are [`ConfigCosts`]' own
//! (`group_slot_ms`, `hop_ms`, `replica_ms_from`, `stage_sync_from`) added up in the same
//! order, so the incremental value equals [`ConfigCosts::evaluate`] (the tests check it
//! after random move sequences). [`FullObjective`] re-evaluates any cost function from
//! scratch (the Pipette-compat formula, tests). Every evaluated state counts as one
//! evaluation, incremental or not.
//!
//! On large clusters the node-pair bandwidths dominate memory traffic: [`PairFabric`]
//! keeps both directions of a pair in one cache line, and from [`PREFETCH_NODES`] nodes on
//! the annealer draws each move one step ahead and prefetches its links ([`Links`]).

mod anneal;
mod dispatch;
mod exhaustive;
mod fabric;
mod incremental;
mod objective;
mod space;
mod walker;

use serde::{Deserialize, Serialize};

use crate::model::parallel::{Device, Placement};
use crate::model::time::ConfigCosts;
use anneal::anneal;
use exhaustive::exhaustive;
pub use fabric::{Links, PairFabric, PREFETCH_NODES};
pub use incremental::PipetteObjective;
pub use objective::{FullObjective, Objective};
pub use space::MappingSpace;
use walker::Walker;

/// Which node each node rank runs on, and which GPU each local rank uses.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MappingState {
    /// Node rank → position of the node in the cluster profile.
    pub node_order: Vec<usize>,
    /// Per node rank: local rank → position of the GPU in that node's list.
    pub gpu_order: Vec<Vec<usize>>,
}

impl MappingState {
    /// torchrun's default: node rank `n` on profile node `n`, local rank `l` on GPU `l`.
    pub fn identity(nodes: usize, gpus_per_node: usize) -> Self {
        MappingState {
            node_order: (0..nodes).collect(),
            gpu_order: vec![(0..gpus_per_node).collect(); nodes],
        }
    }

    /// GPUs per node (0 without nodes).
    pub fn gpus_per_node(&self) -> usize {
        self.gpu_order.first().map_or(0, Vec::len)
    }

    /// `devices[rank]`: rank `r` is local rank `r % g` of node rank `r / g`.
    pub fn devices(&self) -> Vec<Device> {
        self.node_order
            .iter()
            .zip(&self.gpu_order)
            .flat_map(|(&node, gpus)| gpus.iter().map(move |&gpu| Device { node, gpu }))
            .collect()
    }

    /// The placement this mapping realises.
    pub fn placement(&self) -> Placement {
        Placement {
            devices: self.devices(),
        }
    }
}

/// How to search the mappings of one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum MappingSearch {
    /// torchrun's default order, evaluated once.
    Identity,
    /// Simulated annealing with at most `budget` evaluations.
    Anneal { budget: u64, seed: u64 },
    /// Every state when there are at most `limit`; else every node order with GPUs in
    /// index order when those are at most `limit`; else an error.
    Exhaustive { limit: u64 },
    /// Exhaustive when every state fits in `limit`, else annealing.
    Auto { limit: u64, budget: u64, seed: u64 },
}

/// What a search did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum SearchMethod {
    Identity,
    Anneal,
    /// `gpu_orders`: whether GPU orders were enumerated too (false: node orders only, each
    /// node's GPUs in index order, or no node had GPU orders worth enumerating).
    Exhaustive {
        gpu_orders: bool,
    },
}

/// The best mapping a search found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MappingResult {
    pub state: MappingState,
    /// Its cost by the objective, ms.
    pub cost_ms: f64,
    /// The identity mapping's cost, ms.
    pub identity_ms: f64,
    /// States evaluated (full or incremental), the identity included.
    pub evaluations: u64,
    pub method: SearchMethod,
}

/// Why a configuration could not be mapped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    #[error("the cluster has no nodes (list at least one)")]
    NoNodes,
    #[error("{host} has {gpus} GPUs but {first_host} has {first_gpus} (rank mapping needs the same GPU count on every node; leave the odd nodes out or give --nproc-per-node)")]
    MixedGpuCounts {
        host: String,
        gpus: usize,
        first_host: String,
        first_gpus: usize,
    },
    #[error(
        "the configuration has {ranks} ranks but the cluster {gpus} GPUs (plan for every GPU)"
    )]
    WorldSize { ranks: usize, gpus: usize },
    #[error("exhaustive mapping would visit {states} states, more than the limit of {limit} (raise the limit, or anneal)")]
    TooManyStates { states: String, limit: u64 },
}

/// Searches the mappings of `costs`' configuration on `fabric` (a
/// [`ClusterFabric`](crate::model::time::ClusterFabric), or a [`PairFabric`] of it on large
/// clusters) with the Pipette model.
pub fn map_config<F: Links + ?Sized>(
    costs: &ConfigCosts,
    fabric: &F,
    space: &MappingSpace,
    search: &MappingSearch,
) -> Result<MappingResult, MappingError> {
    if costs.world_size() != space.world_size() {
        return Err(MappingError::WorldSize {
            ranks: costs.world_size(),
            gpus: space.world_size(),
        });
    }
    let mut objective =
        PipetteObjective::new(costs, fabric).with_prefetch(space.nodes() >= PREFETCH_NODES);
    search_mapping(&mut objective, space, search)
}

/// Searches the mappings of `space` for the lowest value of `objective` (see the module
/// doc for the methods).
pub fn search_mapping<O: Objective>(
    objective: &mut O,
    space: &MappingSpace,
    search: &MappingSearch,
) -> Result<MappingResult, MappingError> {
    if space.nodes == 0 {
        return Err(MappingError::NoNodes);
    }
    let walker = Walker::new(space);
    match *search {
        MappingSearch::Identity => {
            let mut walker = walker;
            let cost = objective.reset(&walker.devices);
            Ok(walker.finish(cost, cost, 1, SearchMethod::Identity))
        }
        MappingSearch::Anneal { budget, seed } => {
            Ok(anneal(objective, space, walker, budget, seed))
        }
        MappingSearch::Exhaustive { limit } => {
            let gpu_orders = match (space.states(true), space.states(false)) {
                (Some(all), _) if all <= limit => true,
                (_, Some(nodes)) if nodes <= limit => false,
                (_, nodes) => {
                    return Err(MappingError::TooManyStates {
                        states: nodes.map_or_else(
                            || format!("{}! (more than 2^64)", space.nodes),
                            |n| n.to_string(),
                        ),
                        limit,
                    })
                }
            };
            Ok(exhaustive(objective, space, walker, gpu_orders))
        }
        MappingSearch::Auto {
            limit,
            budget,
            seed,
        } => {
            if space.states(true).is_some_and(|n| n <= limit) {
                Ok(exhaustive(objective, space, walker, true))
            } else {
                Ok(anneal(objective, space, walker, budget, seed))
            }
        }
    }
}

#[cfg(test)]
mod tests;
