//! [`PipetteObjective`]: the Pipette time model evaluated incrementally, with cached
//! pieces, tournament trees of their extrema and a journal to undo a rejected move.

use super::dispatch::DispatchMemo;
use super::fabric::Links;
use super::objective::Objective;
use crate::model::parallel::Device;
use crate::model::time::{dp_ring_link, ConfigCosts};

/// The minimum or maximum of some leaves inside [`PipetteObjective::cells`]: a tournament
/// tree (node `i`, root 1, at `base + i`; leaf `j` at `base + size + j`) when there are
/// many leaves, else just the leaves and the root (a few compares beat keeping a small tree
/// up to date), which a changed leaf updates at once when it becomes the extremum and by a
/// scan of the leaves only when it was the extremum and no longer is. Unused leaves hold
/// the identity.
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

    #[inline]
    fn contains(&self, i: usize, generation: u32) -> bool {
        self.stamp[i] == generation
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
    /// The stages synchronise over dp × cp ranks (dp > 1 or cp > 1).
    sync: bool,
    /// Context parallelism: a group is tp × cp ranks and its stage's synchronisation also
    /// crosses the group's own context-parallel rings, so a group's ring leaf is the
    /// minimum of its context rings and (dp > 1) its link to the next replica.
    context: bool,
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
    /// Per replica: its slowest slot, and its hops summed in stage order (the two inputs
    /// of its pipeline time that a move changes; each is recomputed only when one of its
    /// terms changed, the maximum only when its old value shrank).
    max_slot_at: usize,
    hop_sum_at: usize,
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
    /// The optimizer step: the same for every permutation of the placed GPUs
    /// ([`ConfigCosts::optimizer_step_ms`]), so fixed at `reset`.
    optimizer: f64,
    /// A mixture-of-experts model: per stage, its all-to-all per micro-batch (cells
    /// `expert_at + s`) and its exposed expert-data-parallel sync (`expert_at + pp + s`),
    /// each from the stage's trees below, so a move recomputes only the expert groups and
    /// ring links its ranks are in, and the figures of their stages.
    experts: bool,
    expert_at: usize,
    /// Ranks per stage (tp × cp × dp), expert-parallel groups per stage (0 at ep 1) and
    /// ranks per stage in an expert-data-parallel ring (0 without one).
    stage_ranks: usize,
    expert_groups: usize,
    expert_ring_ranks: usize,
    /// Ranks between two members of an expert-data-parallel ring (ep × etp).
    expert_stride: usize,
    /// Per stage: every expert-parallel group's collective (max, [`ConfigCosts::group_dispatch`]),
    /// every rank's expert-data-parallel ring link to the next member (min) and every
    /// ranked GPU's ms per GFLOP (max; kept only when speeds differ).
    dispatches: Vec<Tree>,
    expert_rings: Vec<Tree>,
    expert_speeds: Vec<Tree>,
    /// Per rank of a stage: its expert-parallel group.
    expert_group_of: Vec<u32>,
    /// The collectives of expert-parallel groups inside one node, per node and GPU set.
    dispatch_memo: DispatchMemo,
    value: f64,
    saved: f64,
    generation: u32,
    groups: Marks,
    hops: Marks,
    wraps: Marks,
    ring_links: Marks,
    dirty_replicas: Marks,
    /// Replicas whose slowest slot or hop sum must be found again.
    rescan_slots: Marks,
    hop_sums: Marks,
    dirty_stages: Marks,
    /// Stages whose expert terms a move may have changed, and (`s·groups + g`, `s·ranks + r`)
    /// the expert groups and expert-data-parallel ring links it changed.
    expert_stages: Marks,
    dispatch_groups: Marks,
    expert_links: Marks,
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
        let max_slot_at = take(dp);
        let hop_sum_at = take(dp);
        let expert_at = take(2 * pp);
        let stage_ranks = tp * dp;
        let expert_groups = costs.expert_groups();
        let expert_ring_ranks = costs.expert_ring_ranks();
        let mut tree = |leaves: usize, min: bool| {
            // Two leaves at least: with one, the leaf would be the root's own cell.
            let size = leaves.max(2).next_power_of_two();
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
        let per_stage = |n: usize, min: bool, tree: &mut dyn FnMut(usize, bool) -> Tree| {
            if n == 0 {
                Vec::new()
            } else {
                (0..pp).map(|_| tree(n, min)).collect::<Vec<Tree>>()
            }
        };
        let dispatches = per_stage(expert_groups, false, &mut tree);
        let expert_rings = per_stage(expert_ring_ranks, true, &mut tree);
        let expert_speeds = per_stage(expert_ring_ranks, false, &mut tree);
        let mut cells = vec![0.0; next];
        for t in [replicas, grads, gathers]
            .into_iter()
            .chain(rings.iter().copied())
            .chain(speeds.iter().copied())
            .chain(dispatches.iter().copied())
            .chain(expert_rings.iter().copied())
            .chain(expert_speeds.iter().copied())
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
            sync: dp * costs.cp() > 1,
            context: costs.cp() > 1,
            whole_nodes: false,
            uniform_speed: false,
            prefetch: false,
            cells,
            slot_at,
            hop_at,
            wrap_at,
            max_slot_at,
            hop_sum_at,
            replicas,
            grads,
            gathers,
            rings,
            speeds,
            journal: Vec::new(),
            stage_of: (0..groups).map(|gid| (gid / dp) as u32).collect(),
            replica_of: (0..groups).map(|gid| (gid % dp) as u32).collect(),
            group_of: (0..groups * tp).map(|rank| (rank / tp) as u32).collect(),
            optimizer: 0.0,
            experts: costs.has_experts(),
            expert_at,
            stage_ranks,
            expert_groups,
            expert_ring_ranks,
            expert_stride: costs.expert_stride(),
            dispatches,
            expert_rings,
            expert_speeds,
            expert_group_of: (0..stage_ranks)
                .map(|r| costs.expert_group_of(r) as u32)
                .collect(),
            dispatch_memo: DispatchMemo::new(costs, stage_ranks),
            value: f64::NAN,
            saved: f64::NAN,
            generation: 0,
            groups: Marks::new(groups),
            hops: Marks::new(groups),
            wraps: Marks::new(dp),
            ring_links: Marks::new(groups),
            dirty_replicas: Marks::new(dp),
            rescan_slots: Marks::new(dp),
            hop_sums: Marks::new(dp),
            dirty_stages: Marks::new(pp),
            expert_stages: Marks::new(pp),
            dispatch_groups: Marks::new(pp * expert_groups),
            expert_links: Marks::new(pp * expert_ring_ranks),
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

    /// Sets a leaf and the tree nodes above it that change; true when the root changed.
    #[inline]
    fn set_leaf(&mut self, tree: Tree, leaf: usize, value: f64) -> bool {
        let mut i = tree.size + leaf;
        let old = self.cells[tree.base + i];
        if !self.set(tree.base + i, value) {
            return false;
        }
        if tree.flat {
            let root = self.cells[tree.base + 1];
            return if tree.combine(value, root).to_bits() == value.to_bits() {
                self.set(tree.base + 1, value)
            } else if old.to_bits() == root.to_bits() {
                let scanned = self.scan(tree);
                self.set(tree.base + 1, scanned)
            } else {
                false
            };
        }
        while i > 1 {
            i >>= 1;
            let a = self.cells[tree.base + 2 * i];
            let b = self.cells[tree.base + 2 * i + 1];
            if !self.set(tree.base + i, tree.combine(a, b)) {
                return false;
            }
        }
        true
    }

    fn build(&mut self, tree: Tree) {
        if tree.flat {
            self.cells[tree.base + 1] = self.scan(tree);
            return;
        }
        for i in (1..tree.size).rev() {
            let a = self.cells[tree.base + 2 * i];
            let b = self.cells[tree.base + 2 * i + 1];
            self.cells[tree.base + i] = tree.combine(a, b);
        }
    }

    /// The extremum of a flat tree's leaves.
    fn scan(&self, tree: Tree) -> f64 {
        self.cells[tree.leaves()]
            .iter()
            .fold(tree.identity(), |a, &b| tree.combine(a, b))
    }

    #[inline]
    fn root(&self, tree: Tree) -> f64 {
        self.cells[tree.base + 1]
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

    /// The slowest link from group (d, s) to group ((d + 1) % dp, s), tp rank by tp rank
    /// (none at dp 1), and with context parallelism the slowest of the group's own
    /// context-parallel rings.
    fn ring_link(&self, devices: &[Device], gid: usize) -> f64 {
        let here = self.group(devices, gid);
        let context = if self.context {
            self.costs.context_ring_gb_per_s(self.fabric, here)
        } else {
            f64::INFINITY
        };
        if self.dp < 2 {
            return context;
        }
        let d = self.replica_of[gid] as usize;
        let next = gid - d + if d + 1 == self.dp { 0 } else { d + 1 };
        let there = self.group(devices, next);
        let tp = here.len();
        if self.whole_nodes && here[0].node != there[0].node {
            return context.min(dp_ring_link(self.fabric, here[0], there[0], tp));
        }
        here.iter().zip(there).fold(context, |m, (&a, &b)| {
            m.min(dp_ring_link(self.fabric, a, b, tp))
        })
    }

    /// Replica `d`'s slowest slot.
    fn max_slot(&self, d: usize) -> f64 {
        let base = self.slot_at + d * self.pp;
        let mut max_slot = f64::NEG_INFINITY;
        for &slot in &self.cells[base..base + self.pp] {
            if slot > max_slot {
                max_slot = slot;
            }
        }
        max_slot
    }

    /// Replica `d`'s hops summed in stage order.
    fn hop_sum(&self, d: usize) -> f64 {
        let base = self.hop_at + d * self.pp;
        let mut hop_sum = 0.0;
        for &hop in &self.cells[base..base + self.pp - 1] {
            hop_sum += hop;
        }
        hop_sum
    }

    /// Replica `d`'s pipeline time from its cached slowest slot, hop sum and wrap hop.
    fn replica_ms(&self, d: usize) -> f64 {
        let wrap = if self.wrap {
            self.cells[self.wrap_at + d]
        } else {
            0.0
        };
        self.costs.replica_ms_from(
            self.cells[self.max_slot_at + d],
            self.cells[self.hop_sum_at + d],
            wrap,
        )
    }

    fn stage(&mut self, s: usize) {
        let sync =
            self.costs
                .stage_sync_from(s, self.root(self.rings[s]), self.root(self.speeds[s]));
        self.set_leaf(self.grads, s, sync.grad_reduce_ms);
        self.set_leaf(self.gathers, s, sync.param_gather_ms);
    }

    /// Stage `s`'s expert terms from its trees' roots ([`ConfigCosts::stage_dispatch_ms_from`],
    /// [`ConfigCosts::stage_expert_sync_from`], as the full model computes them), into
    /// their cells.
    fn expert_stage(&mut self, devices: &[Device], s: usize) {
        let collective = match self.dispatches.get(s) {
            Some(&tree) => 0.0f64.max(self.root(tree)),
            None => 0.0,
        };
        let dispatch = self
            .costs
            .stage_dispatch_ms_from(self.fabric, devices, s, collective);
        let (reduce, gather) = match (self.expert_rings.get(s), self.expert_speeds.get(s)) {
            (Some(&ring), Some(&speed)) => {
                let speed = if self.uniform_speed {
                    self.fabric.ms_per_gflop(devices[0])
                } else {
                    self.root(speed)
                };
                self.costs.stage_expert_sync_from(s, self.root(ring), speed)
            }
            _ => (0.0, 0.0),
        };
        self.set(self.expert_at + s, dispatch);
        self.set(self.expert_at + self.pp + s, reduce + gather);
    }

    /// Expert-parallel group `g` of stage `s`'s collective
    /// ([`ConfigCosts::group_dispatch`], through the memo of groups inside one node).
    #[inline]
    fn dispatch_ms(&mut self, devices: &[Device], s: usize, g: usize) -> f64 {
        let (costs, fabric) = (self.costs, self.fabric);
        self.dispatch_memo.ms(costs, fabric, devices, s, g)
    }

    /// Fills stage `s`'s expert trees from the ranks (at reset).
    fn build_expert_stage(&mut self, devices: &[Device], s: usize) {
        if let Some(&tree) = self.dispatches.get(s) {
            for g in 0..self.expert_groups {
                self.cells[tree.base + tree.size + g] = self.dispatch_ms(devices, s, g);
            }
            self.build(tree);
        }
        if let (Some(&ring), Some(&speed)) = (self.expert_rings.get(s), self.expert_speeds.get(s)) {
            for r in 0..self.expert_ring_ranks {
                self.cells[ring.base + ring.size + r] =
                    self.costs.expert_ring_link(self.fabric, devices, s, r);
                self.cells[speed.base + speed.size + r] =
                    self.fabric.ms_per_gflop(devices[s * self.stage_ranks + r]);
            }
            self.build(ring);
            self.build(speed);
        }
        self.expert_stage(devices, s);
    }

    /// Marks what the move of `rank` changes in the expert terms.
    #[inline]
    fn expert_rank_moved(&mut self, devices: &[Device], rank: usize, generation: u32) {
        let s = self.stage_of[self.group_of[rank] as usize] as usize;
        let r = rank - s * self.stage_ranks;
        self.expert_stages.insert(s, generation);
        if self.expert_groups > 0 {
            let g = self.expert_group_of[r] as usize;
            self.dispatch_groups
                .insert(s * self.expert_groups + g, generation);
        }
        let n = self.expert_ring_ranks;
        if r < n {
            let stride = self.expert_stride;
            let prev = if r < stride {
                r + n - stride
            } else {
                r - stride
            };
            self.expert_links.insert(s * n + r, generation);
            self.expert_links.insert(s * n + prev, generation);
            if !self.uniform_speed {
                let speed = self.fabric.ms_per_gflop(devices[rank]);
                let tree = self.expert_speeds[s];
                self.set_leaf(tree, r, speed);
            }
        }
    }

    /// The expert terms of the whole placement, as [`ConfigCosts::evaluate`] adds them:
    /// the slowest stage's all-to-all in every slot it is paid in, and the slowest
    /// stage's expert-data-parallel sync.
    fn experts_ms(&self) -> f64 {
        if !self.experts {
            return 0.0;
        }
        let pp = self.pp;
        let cells = &self.cells[self.expert_at..self.expert_at + 2 * pp];
        let dispatch = cells[..pp].iter().fold(0.0f64, |a, &b| a.max(b));
        let sync = cells[pp..].iter().fold(0.0f64, |a, &b| a.max(b));
        self.costs.dispatch_slots() * dispatch + sync
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
        pipeline + grad + gather + self.optimizer + self.experts_ms()
    }

    fn next_generation(&mut self) -> u32 {
        if self.generation == u32::MAX {
            for marks in [
                &mut self.groups,
                &mut self.hops,
                &mut self.wraps,
                &mut self.ring_links,
                &mut self.dirty_replicas,
                &mut self.rescan_slots,
                &mut self.hop_sums,
                &mut self.dirty_stages,
                &mut self.expert_stages,
                &mut self.dispatch_groups,
                &mut self.expert_links,
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
            self.cells[self.max_slot_at + d] = self.max_slot(d);
            self.cells[self.hop_sum_at + d] = self.hop_sum(d);
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
        self.optimizer = self.costs.optimizer_step_ms(self.fabric, devices);
        if self.experts {
            for s in 0..pp {
                self.build_expert_stage(devices, s);
            }
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
            &mut self.rescan_slots.list,
            &mut self.hop_sums.list,
            &mut self.dirty_stages.list,
            &mut self.expert_stages.list,
            &mut self.dispatch_groups.list,
            &mut self.expert_links.list,
        ] {
            list.clear();
        }
        for &rank in ranks {
            self.groups.insert(self.group_of[rank] as usize, generation);
            if self.experts {
                self.expert_rank_moved(devices, rank, generation);
            }
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
            let at = self.slot_at + self.replica_major(gid);
            let old = self.cells[at];
            if self.set(at, slot) {
                self.dirty_replicas.insert(d, generation);
                // The slowest slot, unless a scan is due anyway: a new maximum is taken at
                // once, a shrunk maximum needs a scan, any other change leaves it.
                if !self.rescan_slots.contains(d, generation) {
                    let max = self.cells[self.max_slot_at + d];
                    if slot >= max {
                        self.set(self.max_slot_at + d, slot);
                    } else if old >= max {
                        self.rescan_slots.insert(d, generation);
                    }
                }
            }
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
                    if self.set_leaf(self.speeds[s], d, speed) {
                        self.dirty_stages.insert(s, generation);
                    }
                }
                let base = dp * s;
                let next = base + if d + 1 == dp { 0 } else { d + 1 };
                let prev = base + if d == 0 { dp - 1 } else { d - 1 };
                // The group's own context rings change with any move of its ranks.
                if self.context || near(next) {
                    self.ring_links.insert(gid, generation);
                }
                if near(prev) {
                    self.ring_links.insert(prev, generation);
                }
            }
        }
        self.groups.list = groups;

        let hops = std::mem::take(&mut self.hops.list);
        for &gid in &hops {
            let hop = self.hop(devices, gid, gid + dp);
            if self.set(self.hop_at + self.replica_major(gid), hop) {
                let d = self.replica_of[gid] as usize;
                self.hop_sums.insert(d, generation);
                self.dirty_replicas.insert(d, generation);
            }
        }
        self.hops.list = hops;
        let wraps = std::mem::take(&mut self.wraps.list);
        for &d in &wraps {
            let hop = self.hop(devices, d + dp * (pp - 1), d);
            if self.set(self.wrap_at + d, hop) {
                self.dirty_replicas.insert(d, generation);
            }
        }
        self.wraps.list = wraps;
        let links = std::mem::take(&mut self.ring_links.list);
        for &gid in &links {
            let link = self.ring_link(devices, gid);
            let (s, d) = (self.stage_of[gid] as usize, self.replica_of[gid] as usize);
            if self.set_leaf(self.rings[s], d, link) {
                self.dirty_stages.insert(s, generation);
            }
        }
        self.ring_links.list = links;
        let replicas = std::mem::take(&mut self.dirty_replicas.list);
        for &d in &replicas {
            if self.rescan_slots.contains(d, generation) {
                let max = self.max_slot(d);
                self.set(self.max_slot_at + d, max);
            }
            if self.hop_sums.contains(d, generation) {
                let sum = self.hop_sum(d);
                self.set(self.hop_sum_at + d, sum);
            }
            let ms = self.replica_ms(d);
            self.set_leaf(self.replicas, d, ms);
        }
        self.dirty_replicas.list = replicas;
        let stages = std::mem::take(&mut self.dirty_stages.list);
        for &s in &stages {
            self.stage(s);
        }
        self.dirty_stages.list = stages;
        let groups = std::mem::take(&mut self.dispatch_groups.list);
        for &at in &groups {
            let (s, g) = (at / self.expert_groups, at % self.expert_groups);
            let ms = self.dispatch_ms(devices, s, g);
            self.set_leaf(self.dispatches[s], g, ms);
        }
        self.dispatch_groups.list = groups;
        let links = std::mem::take(&mut self.expert_links.list);
        for &at in &links {
            let n = self.expert_ring_ranks;
            let (s, r) = (at / n, at % n);
            let link = self.costs.expert_ring_link(self.fabric, devices, s, r);
            self.set_leaf(self.expert_rings[s], r, link);
        }
        self.expert_links.list = links;
        let stages = std::mem::take(&mut self.expert_stages.list);
        for &s in &stages {
            self.expert_stage(devices, s);
        }
        self.expert_stages.list = stages;

        self.value = self.total();
        self.value
    }
}
