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

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::model::parallel::{Device, Placement};
use crate::model::time::{ClusterFabric, ConfigCosts, Fabric};

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

/// The shape of the mapping space of one cluster: its nodes, their GPU count and which
/// nodes gain nothing from reordering their GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingSpace {
    nodes: usize,
    gpus_per_node: usize,
    /// Per profile node: every GPU pair equally fast and every GPU equally fast.
    symmetric: Vec<bool>,
    /// Runs of node ranks `start..end` inside which nodes may trade places, in order,
    /// covering every node rank.
    groups: Vec<(usize, usize)>,
}

impl MappingSpace {
    /// The space of `fabric`'s cluster. `hosts` names the nodes in errors.
    pub fn new(fabric: &ClusterFabric, hosts: &[&str]) -> Result<Self, MappingError> {
        let nodes = fabric.node_count();
        if nodes == 0 {
            return Err(MappingError::NoNodes);
        }
        let g = fabric.gpus_on(0);
        let host = |n: usize| {
            hosts
                .get(n)
                .map_or_else(|| format!("node #{n}"), |h| h.to_string())
        };
        if let Some(n) = (0..nodes).find(|&n| fabric.gpus_on(n) != g) {
            return Err(MappingError::MixedGpuCounts {
                host: host(n),
                gpus: fabric.gpus_on(n),
                first_host: host(0),
                first_gpus: g,
            });
        }
        let symmetric = (0..nodes)
            .map(|n| node_is_symmetric(fabric, n, g))
            .collect();
        Ok(MappingSpace {
            nodes,
            gpus_per_node: g,
            symmetric,
            groups: vec![(0, nodes)],
        })
    }

    /// A space of `nodes` nodes of `gpus_per_node` GPUs, `symmetric[n]` telling whether
    /// node `n`'s GPU order is irrelevant.
    pub fn from_parts(nodes: usize, gpus_per_node: usize, symmetric: Vec<bool>) -> Self {
        assert_eq!(symmetric.len(), nodes, "one symmetry flag per node");
        MappingSpace {
            nodes,
            gpus_per_node,
            symmetric,
            groups: vec![(0, nodes)],
        }
    }

    /// The same space with node swaps confined to consecutive runs of node ranks of these
    /// sizes (they must add up to the nodes); see the module doc.
    pub fn with_node_groups(mut self, sizes: &[usize]) -> Self {
        assert_eq!(
            sizes.iter().sum::<usize>(),
            self.nodes,
            "node groups cover every node"
        );
        let mut start = 0;
        self.groups = sizes
            .iter()
            .filter(|&&n| n > 0)
            .map(|&n| {
                start += n;
                (start - n, start)
            })
            .collect();
        self
    }

    /// The runs of node ranks inside which nodes may trade places.
    pub fn node_groups(&self) -> &[(usize, usize)] {
        &self.groups
    }

    /// The group (`start..end`) holding node rank `slot`.
    fn group_of(&self, slot: usize) -> (usize, usize) {
        *self
            .groups
            .iter()
            .find(|(start, end)| (*start..*end).contains(&slot))
            .expect("groups cover every node rank")
    }

    pub fn nodes(&self) -> usize {
        self.nodes
    }

    pub fn gpus_per_node(&self) -> usize {
        self.gpus_per_node
    }

    /// GPUs in the cluster.
    pub fn world_size(&self) -> usize {
        self.nodes * self.gpus_per_node
    }

    /// Whether reordering node `node`'s GPUs can change any cost.
    pub fn gpu_order_matters(&self, node: usize) -> bool {
        self.gpus_per_node > 1 && !self.symmetric[node]
    }

    /// States an exhaustive search visits: node orders × (GPU orders of every node whose
    /// order matters, when `gpu_orders`). `None` beyond `u64`.
    pub fn states(&self, gpu_orders: bool) -> Option<u64> {
        let mut total = 1u64;
        for (start, end) in &self.groups {
            total = total.checked_mul(factorial((end - start) as u64)?)?;
        }
        if gpu_orders {
            let per_node = factorial(self.gpus_per_node as u64)?;
            for node in 0..self.nodes {
                if self.gpu_order_matters(node) {
                    total = total.checked_mul(per_node)?;
                }
            }
        }
        Some(total)
    }
}

fn factorial(n: u64) -> Option<u64> {
    (1..=n).try_fold(1u64, |acc, k| acc.checked_mul(k))
}

/// Every GPU pair of the node equally fast, every GPU equally fast.
fn node_is_symmetric(fabric: &ClusterFabric, node: usize, g: usize) -> bool {
    let device = |gpu| Device { node, gpu };
    let speed = fabric.ms_per_gflop(device(0));
    if (1..g).any(|i| fabric.ms_per_gflop(device(i)).to_bits() != speed.to_bits()) {
        return false;
    }
    if g < 2 {
        return true;
    }
    let link = fabric.gb_per_s(device(0), device(1));
    (0..g).all(|i| {
        (0..g).all(|j| i == j || fabric.gb_per_s(device(i), device(j)).to_bits() == link.to_bits())
    })
}

/// A cost function over placements that a search can evaluate state after state.
///
/// The search calls [`Objective::reset`] once, then for every move changes `devices` at
/// some ranks and calls [`Objective::update`] with them; to undo the move it restores
/// `devices` and calls [`Objective::revert`]. An update not reverted is kept.
pub trait Objective {
    /// Evaluates `devices` from scratch.
    fn reset(&mut self, devices: &[Device]) -> f64;
    /// `devices` changed at `ranks` since the last reset, kept update or revert: the new
    /// value.
    fn update(&mut self, devices: &[Device], ranks: &[usize]) -> f64;
    /// [`Objective::update`] for a change that kept every rank on its node (GPUs swapped
    /// inside a node), which an objective may exploit.
    fn update_within_nodes(&mut self, devices: &[Device], ranks: &[usize]) -> f64 {
        self.update(devices, ranks)
    }
    /// A hint that node ranks `a` and `b` (blocks of `gpus_per_node` ranks) may be swapped
    /// next: an objective may start fetching what that evaluation will read.
    fn prepare_node_swap(&self, _devices: &[Device], _gpus_per_node: usize, _a: usize, _b: usize) {}
    /// Undoes the last update.
    fn revert(&mut self);
}

/// Any cost function, re-evaluated from scratch on every update.
pub struct FullObjective<E> {
    eval: E,
    value: f64,
    saved: f64,
}

impl<E: FnMut(&[Device]) -> f64> FullObjective<E> {
    pub fn new(eval: E) -> Self {
        FullObjective {
            eval,
            value: f64::NAN,
            saved: f64::NAN,
        }
    }
}

impl<E: FnMut(&[Device]) -> f64> Objective for FullObjective<E> {
    fn reset(&mut self, devices: &[Device]) -> f64 {
        self.value = (self.eval)(devices);
        self.value
    }

    fn update(&mut self, devices: &[Device], _ranks: &[usize]) -> f64 {
        self.saved = self.value;
        self.value = (self.eval)(devices);
        self.value
    }

    fn revert(&mut self) {
        self.value = self.saved;
    }
}

/// A [`ClusterFabric`] with the node pairs' bandwidths laid out for the mapping search:
/// both directions of a node pair side by side, so that a pipeline hop (activation one
/// way, gradient back) reads one cache line, not two rows of a matrix that on a large
/// cluster is far bigger than the caches. Returns exactly the fabric's figures.
pub struct PairFabric<'a> {
    inner: &'a ClusterFabric,
    /// `[from lo to hi, from hi to lo]` for every node pair lo < hi, at `hi·(hi−1)/2 + lo`.
    pairs: Vec<[f64; 2]>,
}

impl<'a> PairFabric<'a> {
    pub fn new(inner: &'a ClusterFabric) -> Self {
        let n = inner.node_count();
        let first = |node| Device { node, gpu: 0 };
        let mut pairs = Vec::with_capacity(n * n.saturating_sub(1) / 2);
        for hi in 0..n {
            for lo in 0..hi {
                pairs.push([
                    inner.gb_per_s(first(lo), first(hi)),
                    inner.gb_per_s(first(hi), first(lo)),
                ]);
            }
        }
        PairFabric { inner, pairs }
    }
}

impl Fabric for PairFabric<'_> {
    #[inline]
    fn gb_per_s(&self, from: Device, to: Device) -> f64 {
        if from.node == to.node {
            return self.inner.gb_per_s(from, to);
        }
        let (lo, hi, way) = if from.node < to.node {
            (from.node, to.node, 0)
        } else {
            (to.node, from.node, 1)
        };
        self.pairs[hi * (hi - 1) / 2 + lo][way]
    }

    #[inline]
    fn ms_per_gflop(&self, device: Device) -> f64 {
        self.inner.ms_per_gflop(device)
    }

    #[inline]
    fn gpu_perf(&self, device: Device) -> crate::model::time::GpuPerf {
        self.inner.gpu_perf(device)
    }
}

/// A [`Fabric`] that can be asked to bring a link's figure into the cache ahead of use.
pub trait Links: Fabric {
    /// Starts fetching the bandwidth from `from` to `to` (a hint; may do nothing).
    #[inline]
    fn prefetch(&self, _from: Device, _to: Device) {}
}

impl Links for ClusterFabric {}

impl Links for PairFabric<'_> {
    #[inline]
    fn prefetch(&self, from: Device, to: Device) {
        if from.node == to.node {
            return;
        }
        let (lo, hi) = (from.node.min(to.node), from.node.max(to.node));
        let Some(entry) = self.pairs.get(hi * (hi - 1) / 2 + lo) else {
            return;
        };
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint that never faults and changes no memory; the
        // address is inside `self.pairs` anyway.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>((entry as *const [f64; 2]).cast::<i8>());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = entry;
    }
}

/// The minimum or maximum of some leaves inside [`PipetteObjective::cells`]: a tournament
/// tree (node `i`, root 1, at `base + i`; leaf `j` at `base + size + j`) when there are
/// many leaves, else just the leaves, scanned when the extremum is read (a few compares
/// beat keeping a small tree up to date). Unused leaves hold the identity.
#[derive(Debug, Clone, Copy)]
struct Tree {
    base: usize,
    size: usize,
    min: bool,
    flat: bool,
}

/// Extrema over at most this many leaves are scanned, not kept in a tree.
const FLAT_LEAVES: usize = 32;

impl Tree {
    fn identity(self) -> f64 {
        if self.min {
            f64::INFINITY
        } else {
            f64::NEG_INFINITY
        }
    }

    #[inline]
    fn combine(self, a: f64, b: f64) -> f64 {
        if self.min {
            a.min(b)
        } else {
            a.max(b)
        }
    }

    fn leaves(self) -> std::ops::Range<usize> {
        self.base + self.size..self.base + 2 * self.size
    }
}

/// Generation-stamped set of small integers: O(1) insert and clear.
#[derive(Debug, Clone)]
struct Marks {
    stamp: Vec<u32>,
    list: Vec<usize>,
}

impl Marks {
    fn new(size: usize) -> Self {
        Marks {
            stamp: vec![0; size],
            list: Vec::new(),
        }
    }

    #[inline]
    fn insert(&mut self, i: usize, generation: u32) {
        if self.stamp[i] != generation {
            self.stamp[i] = generation;
            self.list.push(i);
        }
    }

    fn reset(&mut self) {
        self.stamp.fill(0);
        self.list.clear();
    }
}

/// The Pipette time model ([`ConfigCosts::evaluate`]) evaluated incrementally (see the
/// module doc). Updates must keep every tp group on the nodes it was on at the last reset
/// when it was inside one node then (node and GPU swaps of whole-node blocks do).
pub struct PipetteObjective<'a, F: Links + ?Sized> {
    costs: &'a ConfigCosts,
    fabric: &'a F,
    tp: usize,
    dp: usize,
    pp: usize,
    wrap: bool,
    sync: bool,
    /// Every tp group lies inside one node (tp divides the GPUs per node, as the search
    /// space ensures), so the links between two groups on different nodes are all the same
    /// node pair's. Checked by `reset`; moves keep it.
    whole_nodes: bool,
    /// Every placed GPU equally fast: the stages' slowest GPUs never change. Checked by
    /// `reset`; moves only permute the placed GPUs.
    uniform_speed: bool,
    /// Fetch a coming node swap's links ahead ([`Objective::prepare_node_swap`]).
    prefetch: bool,
    /// Every cached figure: slots, hops, wrap hops, then the trees.
    cells: Vec<f64>,
    /// Per tp group (d, s), at `d·pp + s` (a replica's stages side by side, as the
    /// replica's recomputation reads them): its slot.
    slot_at: usize,
    /// Per group (d, s < pp − 1), at `d·pp + s`: the hop to (d, s + 1).
    hop_at: usize,
    /// Per replica: the wrap-around hop.
    wrap_at: usize,
    /// Per replica: its pipeline time (max).
    replicas: Tree,
    /// Per stage: its exposed gradient reduce and parameter gather (max).
    grads: Tree,
    gathers: Tree,
    /// Per stage, per replica d: the slowest ring link from group (d, s) to ((d+1) % dp, s)
    /// (min), and the group's slowest GPU in ms per GFLOP (max).
    rings: Vec<Tree>,
    speeds: Vec<Tree>,
    journal: Vec<(usize, f64)>,
    /// Per group: its stage and replica, and per rank its group (no divisions on the
    /// hot path: a few dozen of them cost as much as the rest of an update).
    stage_of: Vec<u32>,
    replica_of: Vec<u32>,
    group_of: Vec<u32>,
    value: f64,
    saved: f64,
    generation: u32,
    groups: Marks,
    hops: Marks,
    wraps: Marks,
    ring_links: Marks,
    dirty_replicas: Marks,
    dirty_stages: Marks,
}

impl<'a, F: Links + ?Sized> PipetteObjective<'a, F> {
    /// An objective for `costs` on `fabric`; call [`Objective::reset`] before updates.
    pub fn new(costs: &'a ConfigCosts, fabric: &'a F) -> Self {
        let (tp, dp, pp) = (costs.tp(), costs.dp(), costs.pp());
        let groups = dp * pp;
        let mut next = 0;
        let mut take = |n: usize| {
            let at = next;
            next += n;
            at
        };
        let slot_at = take(groups);
        let hop_at = take(groups);
        let wrap_at = take(dp);
        let mut tree = |leaves: usize, min: bool| {
            let size = leaves.max(1).next_power_of_two();
            Tree {
                base: take(2 * size),
                size,
                min,
                flat: size <= FLAT_LEAVES,
            }
        };
        let replicas = tree(dp, false);
        let grads = tree(pp, false);
        let gathers = tree(pp, false);
        let rings: Vec<Tree> = (0..pp).map(|_| tree(dp, true)).collect();
        let speeds: Vec<Tree> = (0..pp).map(|_| tree(dp, false)).collect();
        let mut cells = vec![0.0; next];
        for t in [replicas, grads, gathers]
            .into_iter()
            .chain(rings.iter().copied())
            .chain(speeds.iter().copied())
        {
            cells[t.base..t.base + 2 * t.size].fill(t.identity());
        }
        PipetteObjective {
            costs,
            fabric,
            tp,
            dp,
            pp,
            wrap: costs.has_wrap_hop(),
            sync: dp > 1,
            whole_nodes: false,
            uniform_speed: false,
            prefetch: false,
            cells,
            slot_at,
            hop_at,
            wrap_at,
            replicas,
            grads,
            gathers,
            rings,
            speeds,
            journal: Vec::new(),
            stage_of: (0..groups).map(|gid| (gid / dp) as u32).collect(),
            replica_of: (0..groups).map(|gid| (gid % dp) as u32).collect(),
            group_of: (0..groups * tp).map(|rank| (rank / tp) as u32).collect(),
            value: f64::NAN,
            saved: f64::NAN,
            generation: 0,
            groups: Marks::new(groups),
            hops: Marks::new(groups),
            wraps: Marks::new(dp),
            ring_links: Marks::new(groups),
            dirty_replicas: Marks::new(dp),
            dirty_stages: Marks::new(pp),
        }
    }

    /// Fetches the links of the next node swap while this one is evaluated (through
    /// [`Links::prefetch`]): worth it when the cluster's node-pair table is much bigger
    /// than the caches (hundreds of nodes), a small cost otherwise.
    pub fn with_prefetch(mut self, prefetch: bool) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// The current value.
    pub fn value(&self) -> f64 {
        self.value
    }

    /// Where group `gid = d + dp·s` (the devices' order) sits in the replica-major tables.
    #[inline]
    fn replica_major(&self, gid: usize) -> usize {
        self.replica_of[gid] as usize * self.pp + self.stage_of[gid] as usize
    }

    #[inline]
    fn group<'d>(&self, devices: &'d [Device], gid: usize) -> &'d [Device] {
        &devices[gid * self.tp..(gid + 1) * self.tp]
    }

    /// Sets a cell, journaling the old value; false when nothing changed.
    #[inline]
    fn set(&mut self, at: usize, value: f64) -> bool {
        let old = self.cells[at];
        if old.to_bits() == value.to_bits() {
            return false;
        }
        self.journal.push((at, old));
        self.cells[at] = value;
        true
    }

    /// Sets a leaf and the tree nodes above it that change.
    #[inline]
    fn set_leaf(&mut self, tree: Tree, leaf: usize, value: f64) {
        let mut i = tree.size + leaf;
        if !self.set(tree.base + i, value) || tree.flat {
            return;
        }
        while i > 1 {
            i >>= 1;
            let a = self.cells[tree.base + 2 * i];
            let b = self.cells[tree.base + 2 * i + 1];
            if !self.set(tree.base + i, tree.combine(a, b)) {
                return;
            }
        }
    }

    fn build(&mut self, tree: Tree) {
        if tree.flat {
            return;
        }
        for i in (1..tree.size).rev() {
            let a = self.cells[tree.base + 2 * i];
            let b = self.cells[tree.base + 2 * i + 1];
            self.cells[tree.base + i] = tree.combine(a, b);
        }
    }

    #[inline]
    fn root(&self, tree: Tree) -> f64 {
        if tree.flat {
            self.cells[tree.leaves()]
                .iter()
                .fold(tree.identity(), |a, &b| tree.combine(a, b))
        } else {
            self.cells[tree.base + 1]
        }
    }

    fn slot(&self, devices: &[Device], gid: usize) -> f64 {
        self.costs.group_slot_ms(
            self.fabric,
            self.group(devices, gid),
            self.stage_of[gid] as usize,
        )
    }

    fn hop(&self, devices: &[Device], from: usize, to: usize) -> f64 {
        let (a, b) = (self.group(devices, from), self.group(devices, to));
        // Every tp rank's pair crosses the same node pair: the first pair says it all.
        if self.whole_nodes && a[0].node != b[0].node {
            return self.costs.hop_ms(self.fabric, &a[..1], &b[..1]);
        }
        self.costs.hop_ms(self.fabric, a, b)
    }

    /// The group's slowest GPU, ms per GFLOP.
    fn speed(&self, devices: &[Device], gid: usize) -> f64 {
        self.group(devices, gid)
            .iter()
            .fold(f64::NEG_INFINITY, |m, &d| {
                m.max(self.fabric.ms_per_gflop(d))
            })
    }

    /// The slowest link from group (d, s) to group ((d + 1) % dp, s), tp rank by tp rank.
    fn ring_link(&self, devices: &[Device], gid: usize) -> f64 {
        let d = self.replica_of[gid] as usize;
        let next = gid - d + if d + 1 == self.dp { 0 } else { d + 1 };
        let here = self.group(devices, gid);
        let there = self.group(devices, next);
        if self.whole_nodes && here[0].node != there[0].node {
            return self.fabric.gb_per_s(here[0], there[0]);
        }
        here.iter().zip(there).fold(f64::INFINITY, |m, (&a, &b)| {
            m.min(self.fabric.gb_per_s(a, b))
        })
    }

    fn replica_ms(&self, d: usize) -> f64 {
        let mut max_slot = f64::NEG_INFINITY;
        let mut hop_sum = 0.0;
        let base = d * self.pp;
        for s in 0..self.pp {
            let slot = self.cells[self.slot_at + base + s];
            if slot > max_slot {
                max_slot = slot;
            }
            if s + 1 < self.pp {
                hop_sum += self.cells[self.hop_at + base + s];
            }
        }
        let wrap = if self.wrap {
            self.cells[self.wrap_at + d]
        } else {
            0.0
        };
        self.costs.replica_ms_from(max_slot, hop_sum, wrap)
    }

    fn stage(&mut self, s: usize) {
        let sync =
            self.costs
                .stage_sync_from(s, self.root(self.rings[s]), self.root(self.speeds[s]));
        self.set_leaf(self.grads, s, sync.grad_reduce_ms);
        self.set_leaf(self.gathers, s, sync.param_gather_ms);
    }

    fn total(&self) -> f64 {
        let pipeline = 0.0f64.max(self.root(self.replicas));
        let (grad, gather) = if self.sync {
            (
                0.0f64.max(self.root(self.grads)),
                0.0f64.max(self.root(self.gathers)),
            )
        } else {
            (0.0, 0.0)
        };
        pipeline + grad + gather
    }

    fn next_generation(&mut self) -> u32 {
        if self.generation == u32::MAX {
            for marks in [
                &mut self.groups,
                &mut self.hops,
                &mut self.wraps,
                &mut self.ring_links,
                &mut self.dirty_replicas,
                &mut self.dirty_stages,
            ] {
                marks.reset();
            }
            self.generation = 0;
        }
        self.generation += 1;
        self.generation
    }
}

impl<F: Links + ?Sized> Objective for PipetteObjective<'_, F> {
    fn reset(&mut self, devices: &[Device]) -> f64 {
        assert_eq!(
            devices.len(),
            self.costs.world_size(),
            "one device per rank"
        );
        let (dp, pp) = (self.dp, self.pp);
        self.whole_nodes = devices
            .chunks(self.tp)
            .all(|group| group.iter().all(|d| d.node == group[0].node));
        let speed = self.fabric.ms_per_gflop(devices[0]);
        self.uniform_speed = devices
            .iter()
            .all(|&d| self.fabric.ms_per_gflop(d).to_bits() == speed.to_bits());
        for gid in 0..dp * pp {
            let at = self.replica_major(gid);
            self.cells[self.slot_at + at] = self.slot(devices, gid);
            if gid / dp + 1 < pp {
                self.cells[self.hop_at + at] = self.hop(devices, gid, gid + dp);
            }
            if self.sync {
                let (s, d) = (gid / dp, gid % dp);
                let (ring, speed) = (self.rings[s], self.speeds[s]);
                self.cells[ring.base + ring.size + d] = self.ring_link(devices, gid);
                self.cells[speed.base + speed.size + d] = self.speed(devices, gid);
            }
        }
        if self.wrap {
            for d in 0..dp {
                self.cells[self.wrap_at + d] = self.hop(devices, d + dp * (pp - 1), d);
            }
        }
        for d in 0..dp {
            let leaf = self.replicas.base + self.replicas.size + d;
            self.cells[leaf] = self.replica_ms(d);
        }
        self.build(self.replicas);
        if self.sync {
            for s in 0..pp {
                self.build(self.rings[s]);
                self.build(self.speeds[s]);
                let sync = self.costs.stage_sync_from(
                    s,
                    self.root(self.rings[s]),
                    self.root(self.speeds[s]),
                );
                self.cells[self.grads.base + self.grads.size + s] = sync.grad_reduce_ms;
                self.cells[self.gathers.base + self.gathers.size + s] = sync.param_gather_ms;
            }
            self.build(self.grads);
            self.build(self.gathers);
        }
        self.journal.clear();
        self.value = self.total();
        self.saved = self.value;
        self.value
    }

    fn update(&mut self, devices: &[Device], ranks: &[usize]) -> f64 {
        self.changed(devices, ranks, false)
    }

    fn update_within_nodes(&mut self, devices: &[Device], ranks: &[usize]) -> f64 {
        self.changed(devices, ranks, true)
    }

    fn prepare_node_swap(&self, devices: &[Device], g: usize, a: usize, b: usize) {
        if !(self.prefetch && self.whole_nodes) {
            return;
        }
        let (dp, pp, tp) = (self.dp, self.pp, self.tp);
        for (slot, incoming) in [(a, devices[b * g]), (b, devices[a * g])] {
            for rank in (slot * g..(slot + 1) * g).step_by(tp) {
                let gid = self.group_of[rank] as usize;
                let (s, d) = (self.stage_of[gid] as usize, self.replica_of[gid] as usize);
                let fetch = |other: usize| self.fabric.prefetch(incoming, devices[other * tp]);
                if s > 0 {
                    fetch(gid - dp);
                }
                if s + 1 < pp {
                    fetch(gid + dp);
                }
                if self.sync {
                    fetch(gid - d + if d + 1 == dp { 0 } else { d + 1 });
                    fetch(gid - d + if d == 0 { dp - 1 } else { d - 1 });
                }
            }
        }
    }

    fn revert(&mut self) {
        for &(at, old) in self.journal.iter().rev() {
            self.cells[at] = old;
        }
        self.journal.clear();
        self.value = self.saved;
    }
}

impl<F: Links + ?Sized> PipetteObjective<'_, F> {
    /// The update: recomputes what the changed ranks' groups touch. With `within_nodes`
    /// and every tp group inside one node, a link from a changed group to a group on
    /// another node is that node pair's figure, which the change left as it was: only
    /// links to groups on the same node are recomputed.
    fn changed(&mut self, devices: &[Device], ranks: &[usize], within_nodes: bool) -> f64 {
        self.journal.clear();
        self.saved = self.value;
        let generation = self.next_generation();
        let (dp, pp) = (self.dp, self.pp);
        for list in [
            &mut self.groups.list,
            &mut self.hops.list,
            &mut self.wraps.list,
            &mut self.ring_links.list,
            &mut self.dirty_replicas.list,
            &mut self.dirty_stages.list,
        ] {
            list.clear();
        }
        for &rank in ranks {
            self.groups.insert(self.group_of[rank] as usize, generation);
        }
        let groups = std::mem::take(&mut self.groups.list);
        let skip_remote = within_nodes && self.whole_nodes;
        for &gid in &groups {
            let (s, d) = (self.stage_of[gid] as usize, self.replica_of[gid] as usize);
            debug_assert!(
                !self.whole_nodes || {
                    let group = self.group(devices, gid);
                    group.iter().all(|x| x.node == group[0].node)
                },
                "a move split a tp group over nodes"
            );
            let slot = self.slot(devices, gid);
            self.set(self.slot_at + self.replica_major(gid), slot);
            self.dirty_replicas.insert(d, generation);
            let tp = self.tp;
            let node = devices[gid * tp].node;
            // Whether the link between this group and group `other` may have changed.
            let near = |other: usize| !skip_remote || devices[other * tp].node == node;
            if s > 0 && near(gid - dp) {
                self.hops.insert(gid - dp, generation);
            }
            if s + 1 < pp && near(gid + dp) {
                self.hops.insert(gid, generation);
            }
            if self.wrap && ((s == 0 && near(d + dp * (pp - 1))) || (s + 1 == pp && near(d))) {
                self.wraps.insert(d, generation);
            }
            if self.sync {
                if !self.uniform_speed {
                    let speed = self.speed(devices, gid);
                    self.set_leaf(self.speeds[s], d, speed);
                    self.dirty_stages.insert(s, generation);
                }
                let base = dp * s;
                let next = base + if d + 1 == dp { 0 } else { d + 1 };
                let prev = base + if d == 0 { dp - 1 } else { d - 1 };
                if near(next) {
                    self.ring_links.insert(gid, generation);
                    self.dirty_stages.insert(s, generation);
                }
                if near(prev) {
                    self.ring_links.insert(prev, generation);
                    self.dirty_stages.insert(s, generation);
                }
            }
        }
        self.groups.list = groups;

        let hops = std::mem::take(&mut self.hops.list);
        for &gid in &hops {
            let hop = self.hop(devices, gid, gid + dp);
            self.set(self.hop_at + self.replica_major(gid), hop);
        }
        self.hops.list = hops;
        let wraps = std::mem::take(&mut self.wraps.list);
        for &d in &wraps {
            let hop = self.hop(devices, d + dp * (pp - 1), d);
            self.set(self.wrap_at + d, hop);
        }
        self.wraps.list = wraps;
        let links = std::mem::take(&mut self.ring_links.list);
        for &gid in &links {
            let link = self.ring_link(devices, gid);
            let (s, d) = (self.stage_of[gid] as usize, self.replica_of[gid] as usize);
            self.set_leaf(self.rings[s], d, link);
        }
        self.ring_links.list = links;
        let replicas = std::mem::take(&mut self.dirty_replicas.list);
        for &d in &replicas {
            let ms = self.replica_ms(d);
            self.set_leaf(self.replicas, d, ms);
        }
        self.dirty_replicas.list = replicas;
        let stages = std::mem::take(&mut self.dirty_stages.list);
        for &s in &stages {
            self.stage(s);
        }
        self.dirty_stages.list = stages;

        self.value = self.total();
        self.value
    }
}

/// From this many nodes on, the node-pair table (16 bytes a pair: 2 MB at 512 nodes)
/// outgrows a core's L2 cache and node swaps fetch their links ahead (below it the
/// prefetches cost more than they save).
pub const PREFETCH_NODES: usize = 512;

/// Searches the mappings of `costs`' configuration on `fabric` (a [`ClusterFabric`], or a
/// [`PairFabric`] of it on large clusters) with the Pipette model.
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

/// A move: swap two node ranks, or two local ranks' GPUs of one node rank.
#[derive(Debug, Clone, Copy)]
enum Move {
    Nodes(usize, usize),
    Gpus { slot: usize, a: usize, b: usize },
}

/// The current state, its devices, and the best state seen.
struct Walker {
    g: usize,
    state: MappingState,
    devices: Vec<Device>,
    /// Profile node → its node rank.
    slot_of: Vec<usize>,
    best: MappingState,
    /// The current state is the best seen, and `best` has not been written yet.
    at_best: bool,
    changed: Vec<usize>,
}

impl Walker {
    fn new(space: &MappingSpace) -> Self {
        let state = MappingState::identity(space.nodes, space.gpus_per_node);
        Walker {
            g: space.gpus_per_node,
            devices: state.devices(),
            slot_of: (0..space.nodes).collect(),
            best: state.clone(),
            state,
            at_best: true,
            changed: Vec::with_capacity(2 * space.gpus_per_node),
        }
    }

    /// Applies `m` (its own inverse) to the state and the devices; `changed` lists the
    /// ranks it touched.
    fn apply(&mut self, m: Move) {
        let g = self.g;
        self.changed.clear();
        match m {
            Move::Nodes(a, b) => {
                self.state.node_order.swap(a, b);
                self.state.gpu_order.swap(a, b);
                self.slot_of[self.state.node_order[a]] = a;
                self.slot_of[self.state.node_order[b]] = b;
                let (lo, hi) = (a.min(b), a.max(b));
                let (left, right) = self.devices.split_at_mut(hi * g);
                left[lo * g..(lo + 1) * g].swap_with_slice(&mut right[..g]);
                self.changed.extend(lo * g..(lo + 1) * g);
                self.changed.extend(hi * g..(hi + 1) * g);
            }
            Move::Gpus { slot, a, b } => {
                self.state.gpu_order[slot].swap(a, b);
                self.devices.swap(slot * g + a, slot * g + b);
                self.changed.push(slot * g + a);
                self.changed.push(slot * g + b);
            }
        }
    }

    /// Tells the objective that `m` may come next.
    #[inline]
    fn prepare<O: Objective>(&self, objective: &O, m: Move) {
        if let Move::Nodes(a, b) = m {
            objective.prepare_node_swap(&self.devices, self.g, a, b);
        }
    }

    /// Applies `m` and evaluates the new state.
    #[inline]
    fn step<O: Objective>(&mut self, objective: &mut O, m: Move) -> f64 {
        self.apply(m);
        match m {
            Move::Nodes(..) => objective.update(&self.devices, &self.changed),
            Move::Gpus { .. } => objective.update_within_nodes(&self.devices, &self.changed),
        }
    }

    /// Before leaving a state that is the best seen, keep a copy of it.
    #[inline]
    fn keep_best(&mut self) {
        if self.at_best {
            self.best.clone_from(&self.state);
            self.at_best = false;
        }
    }

    /// Makes the best state seen the current one.
    fn restore_best(&mut self) {
        self.keep_best();
        self.state.clone_from(&self.best);
        self.devices = self.state.devices();
        for (slot, &node) in self.state.node_order.iter().enumerate() {
            self.slot_of[node] = slot;
        }
    }

    fn finish(
        &mut self,
        cost_ms: f64,
        identity_ms: f64,
        evaluations: u64,
        method: SearchMethod,
    ) -> MappingResult {
        self.keep_best();
        MappingResult {
            state: std::mem::replace(&mut self.best, MappingState::identity(0, 0)),
            cost_ms,
            identity_ms,
            evaluations,
            method,
        }
    }
}

/// Swaps of Heap's algorithm: from any arrangement of `n` items, `n! − 1` swaps visit
/// every arrangement once; `restart` begins another round from where the last ended.
#[derive(Debug, Clone)]
struct HeapSwaps {
    c: Vec<usize>,
    i: usize,
}

impl HeapSwaps {
    fn new(n: usize) -> Self {
        HeapSwaps {
            c: vec![0; n],
            i: 1,
        }
    }

    fn next_swap(&mut self) -> Option<(usize, usize)> {
        while self.i < self.c.len() {
            let i = self.i;
            if self.c[i] < i {
                let swap = if i % 2 == 0 { (0, i) } else { (self.c[i], i) };
                self.c[i] += 1;
                self.i = 1;
                return Some(swap);
            }
            self.c[i] = 0;
            self.i += 1;
        }
        None
    }

    fn restart(&mut self) {
        self.c.fill(0);
        self.i = 1;
    }
}

/// Every node order (slowest) × every GPU order of each node whose order matters (when
/// `gpu_orders`), one swap between consecutive states.
fn exhaustive<O: Objective>(
    objective: &mut O,
    space: &MappingSpace,
    mut walker: Walker,
    gpu_orders: bool,
) -> MappingResult {
    // Components, fastest first: a profile node's GPU order (the node carries it when it
    // changes rank), then the node order.
    let mut components: Vec<(Option<usize>, HeapSwaps)> = Vec::new();
    if gpu_orders {
        for node in (0..space.nodes).filter(|&n| space.gpu_order_matters(n)) {
            components.push((Some(node), HeapSwaps::new(space.gpus_per_node)));
        }
    }
    let gpu_components = components.len();
    for &(start, end) in &space.groups {
        components.push((None, HeapSwaps::new(end - start)));
    }
    // The node rank each node component's swaps are counted from.
    let starts: Vec<usize> = space.groups.iter().map(|g| g.0).collect();
    let enumerated_gpus = gpu_components > 0;

    let identity = objective.reset(&walker.devices);
    let mut best = identity;
    let mut evaluations = 1u64;
    'states: loop {
        let mut step = None;
        for (c, (node, heap)) in components.iter_mut().enumerate() {
            if let Some((a, b)) = heap.next_swap() {
                step = Some(match *node {
                    Some(node) => Move::Gpus {
                        slot: walker.slot_of[node],
                        a,
                        b,
                    },
                    None => {
                        let start = starts[c - gpu_components];
                        Move::Nodes(start + a, start + b)
                    }
                });
                break;
            }
            heap.restart();
        }
        let Some(m) = step else {
            break 'states;
        };
        walker.keep_best();
        let cost = walker.step(objective, m);
        evaluations += 1;
        if cost < best {
            best = cost;
            walker.at_best = true;
        }
    }
    walker.finish(
        best,
        identity,
        evaluations,
        SearchMethod::Exhaustive {
            gpu_orders: enumerated_gpus,
        },
    )
}

/// Share of the budget spent on the opening random walk that measures the landscape.
const WALK_SHARE: u64 = 20;
/// The most evaluations the opening walk takes.
const WALK_MAX: u64 = 500;
/// Final temperature over initial temperature.
const COOLING: f64 = 1e-3;
/// Rounds of annealing: the temperature falls on, but each round after the first starts
/// from the best state seen. On the exhaustive checks of `tests/plan_mapping.rs` and on
/// 64 to 1024 GPUs this found better mappings than one walk with the same budget.
const ROUNDS: u64 = 8;
/// The fewest evaluations a round gets (small budgets run fewer rounds).
const ROUND_MIN: u64 = 500;

/// Simulated annealing within `budget` evaluations (see the module doc).
fn anneal<O: Objective>(
    objective: &mut O,
    space: &MappingSpace,
    mut walker: Walker,
    budget: u64,
    seed: u64,
) -> MappingResult {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let identity = objective.reset(&walker.devices);
    let mut evaluations = 1u64;
    let n = space.nodes;
    let g = space.gpus_per_node;
    let movable: Vec<usize> = (0..n).filter(|&p| space.gpu_order_matters(p)).collect();
    // Node ranks that have another in their group to trade places with.
    let swappable: Vec<usize> = space
        .groups
        .iter()
        .filter(|(start, end)| end - start >= 2)
        .flat_map(|&(start, end)| start..end)
        .collect();
    let node_swaps: usize = space
        .groups
        .iter()
        .map(|(start, end)| (end - start) * (end - start).saturating_sub(1) / 2)
        .sum();
    let node_moves = swappable.len() >= 2;
    if (!node_moves && movable.is_empty()) || budget <= 1 {
        return walker.finish(identity, identity, evaluations, SearchMethod::Anneal);
    }
    // Half the moves swap nodes (the slow links are between nodes), half swap GPUs. With
    // two or three nodes there are only 2 or 6 node orders: moves are then drawn uniformly
    // from the distinct swaps, a tenth of them at least swapping nodes.
    let node_share = match (node_moves, movable.is_empty()) {
        (true, true) => 1.0,
        (false, _) => 0.0,
        (true, false) if swappable.len() < 4 => {
            let node_swaps = node_swaps as f64;
            let gpu_swaps = (movable.len() * g * (g - 1) / 2) as f64;
            (node_swaps / (node_swaps + gpu_swaps)).clamp(0.1, 0.5)
        }
        (true, false) => 0.5,
    };
    let propose = |rng: &mut ChaCha8Rng, slot_of: &[usize]| -> Move {
        if rng.random::<f64>() < node_share {
            // With one group this draws exactly what an unconstrained walk draws.
            let a = swappable[rng.random_range(0..swappable.len())];
            let (start, end) = space.group_of(a);
            let k = end - start;
            let b = start + (a - start + rng.random_range(1..k)) % k;
            Move::Nodes(a, b)
        } else {
            let node = movable[rng.random_range(0..movable.len())];
            let a = rng.random_range(0..g);
            let b = (a + rng.random_range(1..g)) % g;
            Move::Gpus {
                slot: slot_of[node],
                a,
                b,
            }
        }
    };

    let mut current = identity;
    let mut best = identity;
    // The opening walk accepts every move and measures the typical uphill step.
    let walk = (budget / WALK_SHARE).clamp(1, WALK_MAX);
    let mut uphill = 0.0;
    let mut uphill_moves = 0u32;
    let mut steps = 0u64;
    let mut next = propose(&mut rng, &walker.slot_of);
    while steps < walk && evaluations < budget {
        let m = next;
        next = propose(&mut rng, &walker.slot_of);
        walker.prepare(objective, next);
        walker.keep_best();
        let cost = walker.step(objective, m);
        evaluations += 1;
        steps += 1;
        if cost > current {
            uphill += cost - current;
            uphill_moves += 1;
        }
        current = cost;
        if cost < best {
            best = cost;
            walker.at_best = true;
        }
    }
    // A typical uphill step is accepted with probability 1/e at the start of a round.
    let start = if uphill_moves > 0 {
        uphill / f64::from(uphill_moves)
    } else {
        best.abs() * 1e-9
    };
    // The tidy-up at the end gets its evaluations first.
    let tidy = ((n * (g + 1) + 1) as u64).min(budget / 10);
    let end = budget - tidy;
    // One geometric cooling over the whole budget; at the start of each round the walk
    // returns to the best state seen.
    let rounds = (end.saturating_sub(evaluations) / ROUND_MIN).clamp(1, ROUNDS);
    let factor = COOLING.powf(1.0 / end.saturating_sub(evaluations).max(1) as f64);
    let mut temperature = start;
    for round in 0..rounds {
        if evaluations >= end {
            break;
        }
        if round > 0 {
            walker.restore_best();
            current = objective.reset(&walker.devices);
            evaluations += 1;
        }
        let stop = evaluations + (end - evaluations) / (rounds - round);
        while evaluations < stop {
            let m = next;
            next = propose(&mut rng, &walker.slot_of);
            walker.prepare(objective, next);
            // The copy of the best state is taken only when a move may leave it.
            walker.keep_best();
            let cost = walker.step(objective, m);
            evaluations += 1;
            let delta = cost - current;
            let accept = delta <= 0.0 || rng.random::<f64>() < (-delta / temperature).exp();
            if accept {
                current = cost;
                if cost < best {
                    best = cost;
                    walker.at_best = true;
                }
            } else {
                walker.apply(m);
                objective.revert();
            }
            temperature *= factor;
        }
    }

    // Tidy up: from the best state, put nodes and GPUs back in index order wherever that
    // costs nothing, so that the plan moves only what pays (annealing drifts freely over
    // moves that change nothing).
    if evaluations < budget && !walker.at_best {
        walker.restore_best();
        current = objective.reset(&walker.devices);
        evaluations += 1;
    }
    // Keeps a tidying move unless it costs more.
    let mut try_move = |walker: &mut Walker, objective: &mut O, m: Move, evaluations: &mut u64| {
        let cost = walker.step(objective, m);
        *evaluations += 1;
        if cost <= current {
            current = cost;
            if cost < best {
                best = cost;
            }
            walker.at_best = true;
        } else {
            walker.apply(m);
            objective.revert();
        }
    };
    for position in 0..n {
        let node = walker.state.node_order[position];
        if node != position && evaluations < budget {
            let there = walker.slot_of[position];
            try_move(
                &mut walker,
                objective,
                Move::Nodes(position, there),
                &mut evaluations,
            );
        }
    }
    for slot in 0..n {
        for local in 0..g {
            let gpu = walker.state.gpu_order[slot][local];
            if gpu != local && evaluations < budget {
                let there = walker.state.gpu_order[slot]
                    .iter()
                    .position(|&x| x == local)
                    .expect("a permutation");
                try_move(
                    &mut walker,
                    objective,
                    Move::Gpus {
                        slot,
                        a: local,
                        b: there,
                    },
                    &mut evaluations,
                );
            }
        }
    }
    walker.finish(best, identity, evaluations, SearchMethod::Anneal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_swaps_visit_every_arrangement_once() {
        for n in 1..=6usize {
            let mut items: Vec<usize> = (0..n).collect();
            let mut seen = std::collections::HashSet::new();
            seen.insert(items.clone());
            let mut heap = HeapSwaps::new(n);
            while let Some((a, b)) = heap.next_swap() {
                items.swap(a, b);
                assert!(seen.insert(items.clone()), "{items:?} twice");
            }
            assert_eq!(seen.len() as u64, factorial(n as u64).unwrap());
            // A second round from where the first ended covers them all again.
            heap.restart();
            let mut again = std::collections::HashSet::new();
            again.insert(items.clone());
            while let Some((a, b)) = heap.next_swap() {
                items.swap(a, b);
                again.insert(items.clone());
            }
            assert_eq!(again, seen);
        }
    }

    #[test]
    fn identity_state_fills_nodes_in_order() {
        let state = MappingState::identity(2, 3);
        assert_eq!(state.gpus_per_node(), 3);
        assert_eq!(
            state.placement(),
            Placement::identity(6, 3),
            "the identity mapping is torchrun's default placement"
        );
    }

    #[test]
    fn devices_follow_node_and_gpu_order() {
        let state = MappingState {
            node_order: vec![1, 0],
            gpu_order: vec![vec![1, 0], vec![0, 1]],
        };
        assert_eq!(
            state.devices(),
            [
                Device { node: 1, gpu: 1 },
                Device { node: 1, gpu: 0 },
                Device { node: 0, gpu: 0 },
                Device { node: 0, gpu: 1 },
            ]
        );
    }

    /// A toy objective: the sum over ranks of rank × (node · 10 + gpu).
    fn toy(devices: &[Device]) -> f64 {
        devices
            .iter()
            .enumerate()
            .map(|(r, d)| r as f64 * (d.node * 10 + d.gpu) as f64)
            .sum()
    }

    #[test]
    fn node_groups_confine_node_swaps_in_every_search() {
        // Node ranks 0–1 and 2–4 are two classes: no search may move a node across.
        let space = MappingSpace::from_parts(5, 2, vec![false; 5]).with_node_groups(&[2, 3]);
        assert_eq!(space.node_groups(), [(0, 2), (2, 5)]);
        assert_eq!(space.states(false), Some(2 * 6));
        assert_eq!(space.states(true), Some(2 * 6 * 32));
        let in_class = |d: &[Device]| {
            d.iter()
                .enumerate()
                .all(|(r, dev)| (r / 2 < 2) == (dev.node < 2))
        };
        let mut seen = std::collections::HashSet::new();
        let result = search_mapping(
            &mut FullObjective::new(|d: &[Device]| {
                assert!(in_class(d), "a node left its class: {d:?}");
                seen.insert(d.to_vec());
                toy(d)
            }),
            &space,
            &MappingSearch::Exhaustive { limit: 1_000 },
        )
        .unwrap();
        assert_eq!(seen.len(), 384, "every state within the classes once");
        let brute = seen.iter().map(|d| toy(d)).fold(f64::INFINITY, f64::min);
        assert_eq!(result.cost_ms, brute);
        for seed in 0..4 {
            let result = search_mapping(
                &mut FullObjective::new(|d: &[Device]| {
                    assert!(in_class(d), "a node left its class: {d:?}");
                    toy(d)
                }),
                &space,
                &MappingSearch::Anneal {
                    budget: 3_000,
                    seed,
                },
            )
            .unwrap();
            assert!(in_class(&result.state.devices()));
            assert_eq!(result.cost_ms, brute, "seed {seed}");
        }
        // A class of one node cannot swap: only the other moves.
        let single = MappingSpace::from_parts(3, 1, vec![true; 3]).with_node_groups(&[1, 2]);
        let mut moved = std::collections::HashSet::new();
        search_mapping(
            &mut FullObjective::new(|d: &[Device]| {
                assert_eq!(d[0].node, 0);
                moved.insert(d.to_vec());
                toy(d)
            }),
            &single,
            &MappingSearch::Anneal {
                budget: 200,
                seed: 1,
            },
        )
        .unwrap();
        assert_eq!(moved.len(), 2);
    }

    #[test]
    fn exhaustive_visits_every_state_and_finds_the_minimum() {
        let space = MappingSpace::from_parts(3, 2, vec![false, true, false]);
        assert_eq!(space.states(true), Some(6 * 2 * 2));
        let mut seen = std::collections::HashSet::new();
        let result = search_mapping(
            &mut FullObjective::new(|d: &[Device]| {
                seen.insert(d.to_vec());
                toy(d)
            }),
            &space,
            &MappingSearch::Exhaustive { limit: 100 },
        )
        .unwrap();
        assert_eq!(result.evaluations, 24);
        assert_eq!(result.method, SearchMethod::Exhaustive { gpu_orders: true });
        assert_eq!(seen.len(), 24, "every state once");
        let brute = seen.iter().map(|d| toy(d)).fold(f64::INFINITY, f64::min);
        assert_eq!(result.cost_ms, brute);
        assert_eq!(
            toy(&result.state.devices()),
            brute,
            "the state is the best one"
        );
    }

    #[test]
    fn exhaustive_falls_back_to_node_orders_then_refuses() {
        let space = MappingSpace::from_parts(3, 3, vec![false; 3]);
        let mut objective = FullObjective::new(toy);
        let result = search_mapping(
            &mut objective,
            &space,
            &MappingSearch::Exhaustive { limit: 10 },
        )
        .unwrap();
        assert_eq!(result.evaluations, 6);
        assert_eq!(
            result.method,
            SearchMethod::Exhaustive { gpu_orders: false }
        );
        assert!(result.state.gpu_order.iter().all(|o| o == &[0, 1, 2]));
        let err = search_mapping(
            &mut objective,
            &space,
            &MappingSearch::Exhaustive { limit: 5 },
        )
        .unwrap_err();
        assert!(err.to_string().contains("6 states"), "{err}");
    }

    use crate::cluster::profile::{
        GpuInventory, GpuSpec, LinkMatrix, NodeProfile, PeakTflops, Provenance, Source,
    };
    use crate::cluster::ClusterProfile;
    use crate::config::{settings_from_megatron_args, Settings};
    use crate::model::calibration::Calibration;
    use crate::model::parallel::ParallelConfig;
    use crate::model::time::TimeOptions;

    /// `nodes` nodes of `g` GPUs: random node links (some at 40–60 %), random GPU-pair
    /// links on odd nodes, and a slower GPU here and there.
    fn random_cluster(rng: &mut ChaCha8Rng, nodes: usize, g: usize) -> ClusterProfile {
        let p = Provenance::new(Source::Estimated);
        let gpu = |index: usize, tflops: f64| GpuSpec {
            index: index as u32,
            name: "test".into(),
            memory_bytes: 80 << 30,
            peak_tflops: PeakTflops {
                bf16: Some(tflops),
                fp16: tflops,
            },
            measured_tflops: None,
            provenance: Provenance::new(Source::Datasheet),
        };
        let mut node_links = LinkMatrix::uniform(nodes, 20.0, p.clone());
        for a in 0..nodes {
            for b in 0..nodes {
                let degraded = rng.random::<f64>() < 0.3;
                let bw = 20.0
                    * if degraded {
                        rng.random_range(0.4..0.6)
                    } else {
                        1.0
                    };
                node_links.set(a, b, bw * rng.random_range(0.98..1.02));
            }
        }
        ClusterProfile {
            note: None,
            nodes: (0..nodes)
                .map(|n| {
                    let mut links = LinkMatrix::uniform(g, 200.0, p.clone());
                    if n % 2 == 1 {
                        for a in 0..g {
                            for b in 0..g {
                                links.set(a, b, rng.random_range(50.0..250.0));
                            }
                        }
                    }
                    let slow = rng.random::<f64>() < 0.2;
                    NodeProfile {
                        host: format!("n{n}"),
                        gpus: GpuInventory::Known {
                            gpus: (0..g)
                                .map(|i| gpu(i, if slow && i == 0 { 150.0 } else { 312.0 }))
                                .collect(),
                            links,
                        },
                    }
                })
                .collect(),
            node_links,
        }
    }

    fn settings(layers: u64, global: u64) -> Settings {
        let args: Vec<String> = [
            "--num-layers",
            &layers.to_string(),
            "--hidden-size",
            "1024",
            "--num-attention-heads",
            "16",
            "--seq-length",
            "1024",
            "--max-position-embeddings",
            "1024",
            "--vocab-size",
            "32000",
            "--global-batch-size",
            &global.to_string(),
            "--bf16",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        settings_from_megatron_args(&args, None, &[]).unwrap()
    }

    fn divisors(n: usize) -> Vec<usize> {
        (1..=n).filter(|d| n % d == 0).collect()
    }

    #[test]
    fn incremental_evaluation_equals_the_full_model() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut checked = 0;
        for case in 0..40 {
            let nodes = rng.random_range(2..=6);
            let g = [1, 2, 4][rng.random_range(0..3)];
            let cluster = random_cluster(&mut rng, nodes, g);
            let world = nodes * g;
            let tps = divisors(g);
            let tp = tps[rng.random_range(0..tps.len())];
            let pps: Vec<usize> = divisors(world / tp)
                .into_iter()
                .filter(|&p| p <= 8)
                .collect();
            let pp = pps[rng.random_range(0..pps.len())];
            let dp = world / tp / pp;
            let settings = settings(8, (dp * 4) as u64);
            let mut config = ParallelConfig::even(8, tp as u64, pp as u64, dp as u64, 1);
            if pp > 2 && 8 % pp == 0 && rng.random::<f64>() < 0.5 {
                config.vpp = Some((8 / pp as u64).min(2));
            }
            config.distributed_optimizer = dp > 1 && rng.random::<f64>() < 0.5;
            config.sequence_parallel = tp > 1 && rng.random::<f64>() < 0.5;
            let options = TimeOptions {
                overlap_grad_reduce: rng.random::<f64>() < 0.5,
                overlap_param_gather: rng.random::<f64>() < 0.5,
                ..TimeOptions::default()
            };
            let calibration = Calibration::default();
            let fabric =
                ClusterFabric::new(&cluster, settings.training.precision, &calibration).unwrap();
            let costs = ConfigCosts::new(
                &settings.model,
                &settings.training,
                &config,
                &calibration,
                &options,
            )
            .unwrap();
            let hosts: Vec<&str> = cluster.hosts().collect();
            let space = MappingSpace::new(&fabric, &hosts).unwrap();
            let mut walker = Walker::new(&space);
            let mut objective = PipetteObjective::new(&costs, &fabric);
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
            let first = objective.reset(&walker.devices);
            assert!(close(first, costs.evaluate(&fabric, &walker.devices)));
            for _ in 0..200 {
                let m = if g > 1 && rng.random::<f64>() < 0.4 {
                    let a = rng.random_range(0..g);
                    Move::Gpus {
                        slot: rng.random_range(0..nodes),
                        a,
                        b: (a + rng.random_range(1..g)) % g,
                    }
                } else {
                    let a = rng.random_range(0..nodes);
                    Move::Nodes(a, (a + rng.random_range(1..nodes)) % nodes)
                };
                let before = objective.value();
                let value = walker.step(&mut objective, m);
                let full = costs.evaluate(&fabric, &walker.devices);
                assert!(close(value, full), "case {case}: {value} vs {full}");
                assert_eq!(walker.state.devices(), walker.devices);
                if rng.random::<f64>() < 0.5 {
                    walker.apply(m);
                    objective.revert();
                    assert_eq!(objective.value(), before);
                    let again = objective.update(&walker.devices, &[]);
                    assert_eq!(again, before, "case {case}: revert restores every cell");
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 40 * 200);
    }

    #[test]
    fn annealing_moves_only_what_pays() {
        // Only which node runs rank 0 matters: node 2 is best there.
        let space = MappingSpace::from_parts(4, 3, vec![false; 4]);
        let mut objective =
            FullObjective::new(|d: &[Device]| if d[0].node == 2 { 1.0 } else { 2.0 });
        let search = MappingSearch::Anneal {
            budget: 2_000,
            seed: 3,
        };
        let result = search_mapping(&mut objective, &space, &search).unwrap();
        assert_eq!(result.cost_ms, 1.0);
        assert_eq!(result.state.node_order, [2, 1, 0, 3]);
        assert!(result.state.gpu_order.iter().all(|o| o == &[0, 1, 2]));
        // A flat landscape keeps torchrun's order.
        let mut flat = FullObjective::new(|_: &[Device]| 1.0);
        let result = search_mapping(&mut flat, &space, &search).unwrap();
        assert_eq!(result.state, MappingState::identity(4, 3));
    }

    #[test]
    fn annealing_counts_its_budget_and_keeps_the_best() {
        let space = MappingSpace::from_parts(4, 2, vec![false; 4]);
        let mut objective = FullObjective::new(toy);
        let search = MappingSearch::Anneal {
            budget: 300,
            seed: 7,
        };
        let result = search_mapping(&mut objective, &space, &search).unwrap();
        assert!(result.evaluations <= 300, "{}", result.evaluations);
        assert_eq!(toy(&result.state.devices()), result.cost_ms);
        assert!(result.cost_ms <= result.identity_ms);
        let again = search_mapping(&mut objective, &space, &search).unwrap();
        assert_eq!(again, result, "same seed, same result");
    }
}
