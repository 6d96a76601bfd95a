//! The per-placement half of the Pipette model: [`ConfigCosts::evaluate`] and the pieces
//! the planner caches for incremental evaluation, allocation-free. The report
//! ([`super::report`]) goes through the same helpers, so its `iteration_ms` is bit for bit
//! what `evaluate` returns.

use crate::model::parallel::Device;

use super::costs::ConfigCosts;
use super::perf::GpuKind;
use super::Fabric;

/// The data-parallel synchronisation of one stage, exposed part only.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageSync {
    pub grad_reduce_ms: f64,
    pub param_gather_ms: f64,
}

/// One stage's data-parallel rings, before overlap.
pub(super) struct StageRings {
    /// Slowest ring link, GB/s, and where: (tp rank, dp index of the sender).
    pub(super) gb_per_s: f64,
    pub(super) tp_rank: usize,
    pub(super) replica: usize,
    /// The stage's slowest GPU, ms per GFLOP.
    pub(super) ms_per_gflop: f64,
}

/// The GPU kinds among `devices`, one bit per [`GpuKind::index`].
#[inline]
pub fn placement_kinds<F: Fabric + ?Sized>(fabric: &F, devices: &[Device]) -> u8 {
    devices
        .iter()
        .fold(0u8, |mask, &d| mask | 1 << fabric.gpu_perf(d).kind.index())
}

/// `a · b`, but 0 when `a` is 0 (so that an infinite time times no work is no time).
#[inline]
pub(super) fn times(a: f64, b: f64) -> f64 {
    if a == 0.0 {
        0.0
    } else {
        a * b
    }
}

/// The slowest link of the ring `group[0] → group[1] → … → group[0]`: (GB/s, sender's
/// position); infinite for a group of one. A hop between nodes attains the node link times
/// the group's share of the NICs at its slower end ([`Fabric::nic_share`]): NCCL runs one
/// ring per channel, each crossing the nodes over its own NIC, so the channels together
/// move the ring's volume that many times faster than one link would.
#[inline]
pub(super) fn ring_bottleneck<F: Fabric + ?Sized>(fabric: &F, group: &[Device]) -> (f64, usize) {
    let n = group.len();
    let mut best = (f64::INFINITY, 0);
    if n < 2 {
        return best;
    }
    for i in 0..n {
        let next = if i + 1 == n { 0 } else { i + 1 };
        let (a, b) = (group[i], group[next]);
        let mut bw = fabric.gb_per_s(a, b);
        if fabric.over_network(a.node, b.node) {
            let on = |node: usize| group.iter().filter(|d| d.node == node).count();
            bw *= fabric
                .nic_share(a.node, on(a.node))
                .min(fabric.nic_share(b.node, on(b.node)));
        }
        if bw < best.0 {
            best = (bw, i);
        }
    }
    best
}

/// The link from `a` to `b` of a data-parallel ring whose tensor-parallel groups have `tp`
/// GPUs: the GPU pair's figure, times the ring's share of the NICs at the slower end when
/// it crosses nodes ([`Fabric::dp_ring_nic_share`]). Depends on the two devices alone, so
/// the mapping's incremental evaluation can cache it per link.
#[inline]
pub fn dp_ring_link<F: Fabric + ?Sized>(fabric: &F, a: Device, b: Device, tp: usize) -> f64 {
    let bw = fabric.gb_per_s(a, b);
    if !fabric.over_network(a.node, b.node) {
        bw
    } else {
        bw * fabric
            .dp_ring_nic_share(a.node, tp)
            .min(fabric.dp_ring_nic_share(b.node, tp))
    }
}

/// One pipeline hop: each tp rank `k` sends the activation `from[k] → to[k]` and receives
/// the gradient back; the slowest pair governs. (ms, position).
#[inline]
pub(super) fn hop<F: Fabric + ?Sized>(
    fabric: &F,
    from: &[Device],
    to: &[Device],
    mb: f64,
    latency_ms: &[f64],
) -> (f64, usize) {
    let mut worst = (f64::NEG_INFINITY, 0);
    for (k, (&a, &b)) in from.iter().zip(to).enumerate() {
        // A message's latency: the slower end's kind.
        let latency = latency_ms[fabric.gpu_perf(a).kind.index()]
            .max(latency_ms[fabric.gpu_perf(b).kind.index()]);
        let ms = mb / fabric.gb_per_s(a, b) + mb / fabric.gb_per_s(b, a) + 2.0 * latency;
        if ms > worst.0 {
            worst = (ms, k);
        }
    }
    worst
}

impl ConfigCosts {
    /// The iteration time in ms of the placement `devices` (`devices[rank]`, a valid
    /// placement of [`ConfigCosts::world_size`] distinct GPUs). Allocation-free; a few
    /// table lookups per rank.
    pub fn evaluate<F: Fabric + ?Sized>(&self, fabric: &F, devices: &[Device]) -> f64 {
        debug_assert_eq!(devices.len(), self.world_size());
        let mut pipeline = 0.0f64;
        for d in 0..self.dp {
            pipeline = pipeline.max(self.replica_ms(fabric, devices, d));
        }
        let mut grad = 0.0f64;
        let mut gather = 0.0f64;
        if self.dp * self.cp > 1 {
            for s in 0..self.pp {
                let sync = self.stage_sync(fabric, devices, s);
                grad = grad.max(sync.grad_reduce_ms);
                gather = gather.max(sync.param_gather_ms);
            }
        }
        // Expert parallelism's all-to-alls and expert-data-parallel reduce ([`super::moe`]);
        // both 0 for a dense model.
        let experts = if self.expert.is_some() {
            self.dispatch_ms(fabric, devices) + self.expert_sync_ms(fabric, devices)
        } else {
            0.0
        };
        pipeline + grad + gather + self.optimizer_step_ms(fabric, devices) + experts
    }

    /// A lower bound of [`Self::evaluate`]`(fabric, devices)` at a fraction of its cost:
    /// the planner ranks thousands of configurations on their default placement and fully
    /// evaluates only those whose bound could still beat the ones it keeps. `kinds` is
    /// [`placement_kinds`]`(fabric, devices)` (the same for every configuration on the same
    /// GPUs, so the caller computes it once).
    ///
    /// Why it is a bound. `evaluate` is `pipeline + grad + gather + optimizer + experts`,
    /// summed in that order, and this is the same sum with
    /// - `pipeline`: the max over the dp replicas of their pipeline time, taken here over
    ///   replica 0 alone (the max of a subset is ≤ the max of all);
    /// - `grad`, `gather`: the exposed dp reduce and gather, each `ms − min(window, ms)`
    ///   ≥ 0, taken as 0;
    /// - `optimizer`: exact (the same function);
    /// - `experts` = `dispatch + expert sync`: the sync (exposed like `grad`, ≥ 0) taken as
    ///   0; the dispatch is `slots × max over stages of f(collective)`, with `collective`
    ///   the max over the stage's expert groups, taken here over group 0 alone, and `f`
    ///   ([`Self::stage_dispatch_ms_from`]: `c·x − min(hidden, c·x / 2)`, c ≥ 0) is
    ///   non-decreasing in `x`.
    ///
    /// Every dropped term is ≥ 0 and every kept one is ≤ its counterpart, and IEEE rounding
    /// is monotone (`a ≤ a'`, `b ≤ b'` ⇒ `fl(a + b) ≤ fl(a' + b')`, the same for `·` by a
    /// factor ≥ 0; `max` and `min` are exact), so the bound is ≤ `evaluate` bit for bit,
    /// not only in exact arithmetic. On a uniform cluster's default placement the replicas
    /// and the expert groups are alike and the bound is close to the evaluation.
    pub fn lower_bound_ms<F: Fabric + ?Sized>(
        &self,
        fabric: &F,
        devices: &[Device],
        kinds: u8,
    ) -> f64 {
        debug_assert_eq!(devices.len(), self.world_size());
        let pipeline = 0.0f64.max(self.replica_ms(fabric, devices, 0));
        let optimizer = (0..self.pp)
            .map(|s| self.stage_optimizer_ms(kinds, s))
            .fold(0.0, f64::max);
        let dispatch = if self.expert.as_ref().is_some_and(|x| x.ep > 1) {
            let worst = (0..self.pp)
                .map(|s| {
                    let group = self.group_dispatch(fabric, devices, s, 0).ms;
                    self.stage_dispatch_ms_from(fabric, devices, s, group)
                })
                .fold(0.0, f64::max);
            self.dispatch_slots() * worst
        } else {
            0.0
        };
        pipeline + 0.0 + 0.0 + optimizer + (dispatch + 0.0)
    }

    /// The optimizer step after the data-parallel synchronisation: the slowest stage's,
    /// every stage costed on the placement's slowest-memory GPU kind. Taking the kind from
    /// the whole placement, not the stage's own GPUs, keeps the term the same for every
    /// permutation of the placed GPUs, so the mapping adds it as a constant; it errs long
    /// only on a mix of GPU kinds, by a term of a few percent.
    #[inline]
    pub fn optimizer_step_ms<F: Fabric + ?Sized>(&self, fabric: &F, devices: &[Device]) -> f64 {
        let kinds = placement_kinds(fabric, devices);
        (0..self.pp)
            .map(|s| self.stage_optimizer_ms(kinds, s))
            .fold(0.0, f64::max)
    }

    /// Stage `s`'s optimizer step on the slowest-memory kind in `kinds` (a mask from
    /// [`placement_kinds`]).
    #[inline]
    pub fn stage_optimizer_ms(&self, kinds: u8, s: usize) -> f64 {
        let mut ms = 0.0f64;
        for k in 0..GpuKind::ALL.len() {
            if kinds & (1 << k) != 0 {
                ms = ms.max(self.optimizer_ms[k * self.pp + s]);
            }
        }
        ms
    }

    /// The pipeline time of data-parallel replica `d` (steady + bubble + p2p), reading only
    /// that replica's ranks.
    #[inline]
    pub fn replica_ms<F: Fabric + ?Sized>(&self, fabric: &F, devices: &[Device], d: usize) -> f64 {
        let (slot, _, p2p) = self.replica(fabric, devices, d);
        let (steady, bubble, p2p) = self.pipeline_terms(slot, p2p);
        steady + bubble + p2p
    }

    /// The exposed data-parallel synchronisation of stage `s`, reading only that stage's
    /// ranks. Zero without data parallelism.
    #[inline]
    pub fn stage_sync<F: Fabric + ?Sized>(
        &self,
        fabric: &F,
        devices: &[Device],
        s: usize,
    ) -> StageSync {
        if self.dp * self.cp < 2 {
            return StageSync {
                grad_reduce_ms: 0.0,
                param_gather_ms: 0.0,
            };
        }
        let rings = self.stage_rings(fabric, devices, s);
        self.stage_sync_from(s, rings.gb_per_s, rings.ms_per_gflop)
    }

    // Pieces of `evaluate` for incremental (delta) evaluation. With `group(d, s)` the tp
    // ranks `tp·(d + dp·s) .. tp·(d + dp·s + 1)`:
    //
    //   replica_ms(d) = replica_ms_from(max_s group_slot_ms(group(d, s), s),
    //                                   Σ_{s < pp−1} hop_ms(group(d, s), group(d, s + 1)),
    //                                   hop_ms(group(d, pp − 1), group(d, 0)))
    //   stage_sync(s) = stage_sync_from(s, min over d, k of the ring link
    //                                   group(d, s)[k] → group((d + 1) % dp, s)[k] (dp > 1)
    //                                   and of context_ring_gb_per_s(group(d, s)),
    //                                   max over the stage's GPUs of ms_per_gflop)
    //
    // with the hop sum taken in stage order, bit for bit what `evaluate` computes (`replica`
    // and `stage_sync` go through the same functions). The planner caches each piece.

    /// One micro-batch slot of stage `s` run by the tp group `group` (its `tp` devices in
    /// tp-rank order): compute on the group's slowest GPU plus the exposed tp collectives.
    #[inline]
    pub fn group_slot_ms<F: Fabric + ?Sized>(&self, fabric: &F, group: &[Device], s: usize) -> f64 {
        let (compute, tp) = self.slot(fabric, group, s);
        compute + tp
    }

    /// One pipeline hop between two tp groups: activation forward and gradient back, the
    /// slowest tp rank's pair governing.
    #[inline]
    pub fn hop_ms<F: Fabric + ?Sized>(&self, fabric: &F, from: &[Device], to: &[Device]) -> f64 {
        hop(fabric, from, to, self.p2p_mb, &self.p2p_latency_ms).0
    }

    /// The slowest link of the context-parallel rings of the tp × cp group `group` (as
    /// [`Self::group_slot_ms`] takes it), GB/s: the stage's dp × cp synchronisation crosses
    /// it as well as the data-parallel rings ([`Self::stage_sync_from`]'s ring figure is the
    /// minimum of both over the stage). Infinite at cp 1.
    #[inline]
    pub fn context_ring_gb_per_s<F: Fabric + ?Sized>(&self, fabric: &F, group: &[Device]) -> f64 {
        match &self.context {
            Some(context) => context.ring_gb_per_s(fabric, group),
            None => f64::INFINITY,
        }
    }

    /// A replica's pipeline time from its slowest slot, the sum of its hops in stage order
    /// and its wrap-around hop (ignored unless [`ConfigCosts::has_wrap_hop`]).
    #[inline]
    pub fn replica_ms_from(&self, max_slot: f64, hop_sum: f64, wrap_hop: f64) -> f64 {
        let pass = self.pass_from(hop_sum, wrap_hop);
        let (steady, bubble, p2p) = self.pipeline_terms(max_slot, pass);
        steady + bubble + p2p
    }

    /// Stage `s`'s exposed synchronisation from its slowest dp-ring link (GB/s) and its
    /// slowest GPU (ms per GFLOP). Zero without data parallelism.
    #[inline]
    pub fn stage_sync_from(&self, s: usize, ring_gb_per_s: f64, ms_per_gflop: f64) -> StageSync {
        if self.dp * self.cp < 2 {
            return StageSync {
                grad_reduce_ms: 0.0,
                param_gather_ms: 0.0,
            };
        }
        let rings = StageRings {
            gb_per_s: ring_gb_per_s,
            tp_rank: 0,
            replica: 0,
            ms_per_gflop,
        };
        let (_, _, grad_reduce_ms) = self.reduce_terms(s, &rings);
        let (_, _, param_gather_ms) = self.gather_terms(s, &rings);
        StageSync {
            grad_reduce_ms,
            param_gather_ms,
        }
    }

    /// One pass through the pipeline from the sum of the hops and the wrap-around hop.
    #[inline]
    pub(super) fn pass_from(&self, hop_sum: f64, wrap_hop: f64) -> f64 {
        if self.has_wrap_hop() {
            self.vpp as f64 * hop_sum + (self.vpp - 1) as f64 * wrap_hop
        } else {
            hop_sum
        }
    }

    #[inline]
    pub(super) fn group<'a>(&self, devices: &'a [Device], d: usize, s: usize) -> &'a [Device] {
        let base = self.tp * (d + self.dp * s);
        &devices[base..base + self.tp]
    }

    /// Stage `s` of replica `d` for one micro-batch: (compute ms, tp exposed ms).
    #[inline]
    pub(super) fn slot<F: Fabric + ?Sized>(
        &self,
        fabric: &F,
        group: &[Device],
        s: usize,
    ) -> (f64, f64) {
        let (compute, slowest) = self.slowest_compute(fabric, group, s);
        let tp = self.tp_ms(fabric, group, s);
        let mut comm = tp - self.tp_hidden_ms(fabric, group[slowest], tp, s);
        if let Some(context) = &self.context {
            comm += context.exposed_ms(fabric, group, group[slowest], s);
        }
        (compute, comm)
    }

    /// Of stage `s`'s tp collectives (`tp_ms` per micro-batch), what `--tp-comm-overlap`
    /// hides on `device`, the group's slowest GPU: the calibrated share, but no more than
    /// the GEMMs it overlaps them with last there ([`ConfigCosts::tp_overlap_ops`]).
    #[inline]
    pub(super) fn tp_hidden_ms<F: Fabric + ?Sized>(
        &self,
        fabric: &F,
        device: Device,
        tp_ms: f64,
        s: usize,
    ) -> f64 {
        if self.tp_exposed >= 1.0 {
            return 0.0;
        }
        let perf = fabric.gpu_perf(device);
        let gemms = self.tp_overlap_ops[perf.kind.index() * self.pp + s].ms(perf.ms_per_peak_gflop);
        (tp_ms * (1.0 - self.tp_exposed)).min(gemms)
    }

    /// Stage `s`'s exposed context-parallel exchange for one micro-batch ([`super::cp`]);
    /// zero at cp 1.
    #[inline]
    pub(super) fn cp_ms<F: Fabric + ?Sized>(&self, fabric: &F, group: &[Device], s: usize) -> f64 {
        match &self.context {
            Some(context) => {
                let (_, slowest) = self.slowest_compute(fabric, group, s);
                context.exposed_ms(fabric, group, group[slowest], s)
            }
            None => 0.0,
        }
    }

    /// Stage `s`'s compute for one micro-batch on the slowest GPU of `group`: (ms, position).
    #[inline]
    pub(super) fn slowest_compute<F: Fabric + ?Sized>(
        &self,
        fabric: &F,
        group: &[Device],
        s: usize,
    ) -> (f64, usize) {
        let mut worst = (f64::NEG_INFINITY, 0);
        for (i, &d) in group.iter().enumerate() {
            let perf = fabric.gpu_perf(d);
            let ms = self.slot_ops[perf.kind.index() * self.pp + s]
                .ms(perf.ms_per_peak_gflop)
                .max(self.host_ms[s]);
            if ms > worst.0 {
                worst = (ms, i);
            }
        }
        worst
    }

    /// Stage `s`'s tensor-parallel collectives for one micro-batch, before overlap.
    #[inline]
    pub(super) fn tp_ms<F: Fabric + ?Sized>(&self, fabric: &F, group: &[Device], s: usize) -> f64 {
        if self.tensor > 1 {
            // Each tp group of the stage's tp × cp ranks runs its own ring.
            let bw = group
                .chunks(self.tensor)
                .map(|tp_group| ring_bottleneck(fabric, tp_group).0)
                .fold(f64::INFINITY, f64::min);
            // A collective waits for its slowest member: the group's largest latency.
            let latency = group
                .iter()
                .map(|&d| self.tp_latency_ms[fabric.gpu_perf(d).kind.index() * self.pp + s])
                .fold(0.0, f64::max);
            (self.tp_fwd_mb[s] + self.tp_bwd_mb[s]) / bw + latency
        } else {
            0.0
        }
    }

    /// Replica `d`: (max slot, its stage, one pass through the pipeline).
    #[inline]
    pub(super) fn replica<F: Fabric + ?Sized>(
        &self,
        fabric: &F,
        devices: &[Device],
        d: usize,
    ) -> (f64, usize, f64) {
        let mut slot = f64::NEG_INFINITY;
        let mut critical = 0;
        let mut pass = 0.0;
        for s in 0..self.pp {
            let group = self.group(devices, d, s);
            let (compute, tp) = self.slot(fabric, group, s);
            let t = compute + tp;
            if t > slot {
                slot = t;
                critical = s;
            }
            if s + 1 < self.pp {
                pass += hop(
                    fabric,
                    group,
                    self.group(devices, d, s + 1),
                    self.p2p_mb,
                    &self.p2p_latency_ms,
                )
                .0;
            }
        }
        if self.has_wrap_hop() {
            let wrap = hop(
                fabric,
                self.group(devices, d, self.pp - 1),
                self.group(devices, d, 0),
                self.p2p_mb,
                &self.p2p_latency_ms,
            )
            .0;
            pass = self.pass_from(pass, wrap);
        }
        (slot, critical, pass)
    }

    /// (steady, bubble, p2p) of a replica with this slot and pass time.
    #[inline]
    pub(super) fn pipeline_terms(&self, slot: f64, pass: f64) -> (f64, f64, f64) {
        let steady = self.microbatches as f64 * slot;
        let bubble = times((self.pp - 1) as f64 / self.vpp as f64, slot);
        (steady, bubble, self.passes as f64 * pass)
    }

    /// Stage `s`'s dp rings: the ring of tp rank `k` runs through replicas 0, 1, …, dp − 1.
    #[inline]
    pub(super) fn stage_rings<F: Fabric + ?Sized>(
        &self,
        fabric: &F,
        devices: &[Device],
        s: usize,
    ) -> StageRings {
        let mut rings = StageRings {
            gb_per_s: f64::INFINITY,
            tp_rank: 0,
            replica: 0,
            ms_per_gflop: f64::NEG_INFINITY,
        };
        let block = &devices[self.tp * self.dp * s..self.tp * self.dp * (s + 1)];
        if let Some(context) = &self.context {
            // The reduce over dp × cp also crosses each replica's context-parallel rings.
            for d in 0..self.dp {
                let here = &block[self.tp * d..self.tp * (d + 1)];
                rings.gb_per_s = rings.gb_per_s.min(context.ring_gb_per_s(fabric, here));
                for &x in here {
                    rings.ms_per_gflop = rings.ms_per_gflop.max(fabric.ms_per_gflop(x));
                }
            }
            if self.dp < 2 {
                return rings;
            }
        }
        for d in 0..self.dp {
            let next = if d + 1 == self.dp { 0 } else { d + 1 };
            let here = &block[self.tp * d..self.tp * (d + 1)];
            let there = &block[self.tp * next..self.tp * (next + 1)];
            for k in 0..self.tp {
                let bw = dp_ring_link(fabric, here[k], there[k], self.tp);
                if bw < rings.gb_per_s {
                    rings.gb_per_s = bw;
                    rings.tp_rank = k;
                    rings.replica = d;
                }
                rings.ms_per_gflop = rings.ms_per_gflop.max(fabric.ms_per_gflop(here[k]));
            }
        }
        rings
    }

    /// Gradient reduce of stage `s`: (communication, credited overlap, exposed).
    #[inline]
    pub(super) fn reduce_terms(&self, s: usize, rings: &StageRings) -> (f64, f64, f64) {
        let ms = self.dp_reduce_mb[s] / rings.gb_per_s;
        let window = times(self.grad_overlap, self.bwd_gflop[s] * rings.ms_per_gflop);
        let credit = window.min(ms);
        (ms, credit, ms - credit)
    }

    /// Parameter all-gather of stage `s`: (communication, credited overlap, exposed).
    #[inline]
    pub(super) fn gather_terms(&self, s: usize, rings: &StageRings) -> (f64, f64, f64) {
        let ms = self.dp_gather_mb[s] / rings.gb_per_s;
        let window = times(self.gather_overlap, self.fwd_gflop[s] * rings.ms_per_gflop);
        let credit = window.min(ms);
        (ms, credit, ms - credit)
    }
}
