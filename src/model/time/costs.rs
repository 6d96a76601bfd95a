//! The Pipette model in two halves: [`ConfigCosts::new`] (per configuration) and
//! [`ConfigCosts::evaluate`] (per placement, allocation-free). See the module doc of
//! [`super`] for the formulas.
//!
//! `evaluate` and `report` share the helpers below and add the same numbers in the same
//! order, so the report's `iteration_ms` is bit-for-bit what `evaluate` returns.

use crate::cluster::ClusterProfile;
use crate::config::{ModelSpec, Precision, Recompute, RecomputeMethod, TrainingSettings};
use crate::model::calibration::Calibration;
use crate::model::flops::{stage_flops, AttentionMask};
use crate::model::parallel::{Device, ParallelConfig};
use crate::model::params::ParameterBreakdown;

use super::ops::{KindOps, OpCost, OpShape, StageOps, StageShape};
use super::perf::{GpuKind, PerfTable};
use super::{
    gpu_ref, link_ref, ClusterFabric, DataParallelComm, Fabric, HopTime, PipelineComm, RingLink,
    StageTime, TimeError, TimeEstimate, TimeModel, TimeOptions,
};

/// Bytes per element of the training dtype (activations, parameters).
pub(super) fn dtype_bytes(precision: Precision) -> f64 {
    match precision {
        Precision::Bf16 | Precision::Fp16 => 2.0,
        Precision::Fp32 => 4.0,
    }
}

/// Everything about a configuration that does not depend on the placement: FLOPs per GPU
/// and the volume of every collective, per stage and micro-batch. Cluster-independent too:
/// GPU speeds and links come from the [`Fabric`] at evaluation.
#[derive(Debug, Clone)]
pub struct ConfigCosts {
    pub(super) tp: usize,
    pub(super) dp: usize,
    pub(super) pp: usize,
    /// Model chunks per stage (1 without the interleaved schedule).
    pub(super) vpp: usize,
    pub(super) microbatches: u64,
    /// Passes through the pipeline on the critical path: ⌈m / pp⌉.
    pub(super) passes: u64,
    pub(super) layers: Vec<u64>,
    /// Per GPU and micro-batch, GFLOP.
    pub(super) fwd_gflop: Vec<f64>,
    /// Backward compute with recomputation, GFLOP.
    pub(super) bwd_gflop: Vec<f64>,
    pub(super) recompute_gflop: Vec<f64>,
    /// Ring volume of the tp collectives per micro-batch, MB (10^6 bytes): over a link of
    /// B GB/s it takes volume / B milliseconds.
    pub(super) tp_fwd_mb: Vec<f64>,
    pub(super) tp_bwd_mb: Vec<f64>,
    /// Latency of the tp collectives per micro-batch, ms (forward, backward).
    pub(super) tp_fwd_lat_ms: Vec<f64>,
    pub(super) tp_bwd_lat_ms: Vec<f64>,
    /// Share of tp collective time left exposed.
    pub(super) tp_exposed: f64,
    /// Per-operation compute of stage `s` on GPU kind `k` at `k · pp + s`.
    pub(super) ops: Vec<StageOps>,
    /// `ops[i].slot()`, for the evaluation's inner loop.
    pub(super) slot_ops: Vec<OpCost>,
    /// Latency of one pipeline message, ms.
    pub(super) p2p_latency_ms: f64,
    pub(super) p2p_bytes: f64,
    pub(super) p2p_mb: f64,
    pub(super) grad_bytes: Vec<f64>,
    /// Ring volume of the gradient reduce, MB.
    pub(super) dp_reduce_mb: Vec<f64>,
    /// Ring volume of the parameter all-gather (distributed optimizer), MB.
    pub(super) dp_gather_mb: Vec<f64>,
    /// Share of a backward pass credited against the gradient reduce.
    pub(super) grad_overlap: f64,
    /// Share of a forward pass credited against the parameter gather.
    pub(super) gather_overlap: f64,
    pub(super) distributed_optimizer: bool,
    pub(super) precision: Precision,
    /// Fixed notes on how the inputs were read.
    pub(super) notes: Vec<String>,
}

/// The data-parallel synchronisation of one stage, exposed part only.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageSync {
    pub grad_reduce_ms: f64,
    pub param_gather_ms: f64,
}

/// One stage's data-parallel rings, before overlap.
struct StageRings {
    /// Slowest ring link, GB/s, and where: (tp rank, dp index of the sender).
    gb_per_s: f64,
    tp_rank: usize,
    replica: usize,
    /// The stage's slowest GPU, ms per GFLOP.
    ms_per_gflop: f64,
}

/// `a · b`, but 0 when `a` is 0 (so that an infinite time times no work is no time).
#[inline]
fn times(a: f64, b: f64) -> f64 {
    if a == 0.0 {
        0.0
    } else {
        a * b
    }
}

/// The slowest link of the ring `group[0] → group[1] → … → group[0]`: (GB/s, sender's
/// position); infinite for a group of one.
#[inline]
fn ring_bottleneck<F: Fabric + ?Sized>(fabric: &F, group: &[Device]) -> (f64, usize) {
    let n = group.len();
    let mut best = (f64::INFINITY, 0);
    if n < 2 {
        return best;
    }
    for i in 0..n {
        let next = if i + 1 == n { 0 } else { i + 1 };
        let bw = fabric.gb_per_s(group[i], group[next]);
        if bw < best.0 {
            best = (bw, i);
        }
    }
    best
}

/// One pipeline hop: each tp rank `k` sends the activation `from[k] → to[k]` and receives
/// the gradient back; the slowest pair governs. (ms, position).
#[inline]
fn hop<F: Fabric + ?Sized>(
    fabric: &F,
    from: &[Device],
    to: &[Device],
    mb: f64,
    latency_ms: f64,
) -> (f64, usize) {
    let mut worst = (f64::NEG_INFINITY, 0);
    for (k, (&a, &b)) in from.iter().zip(to).enumerate() {
        let ms = mb / fabric.gb_per_s(a, b) + mb / fabric.gb_per_s(b, a) + 2.0 * latency_ms;
        if ms > worst.0 {
            worst = (ms, k);
        }
    }
    worst
}

impl ConfigCosts {
    /// Costs `config` for `model` trained as `training` says (global batch, precision;
    /// micro-batch, recomputation, sequence parallelism and the distributed optimizer come
    /// from `config`).
    pub fn new(
        model: &ModelSpec,
        training: &TrainingSettings,
        config: &ParallelConfig,
        calibration: &Calibration,
        options: &TimeOptions,
    ) -> Result<Self, TimeError> {
        super::check_calibration(calibration)?;
        check_config(model, training, config)?;
        let tp = config.tp as usize;
        let dp = config.dp as usize;
        let pp = config.pp as usize;
        let vpp = config.vpp.unwrap_or(1) as usize;
        let m = config.num_microbatches(training.global_batch_size);
        let precision = training.precision;
        let act_bytes = dtype_bytes(precision);
        let t = config.tp as f64;
        let d = config.dp as f64;
        let sp = config.sequence_parallel && tp > 1;

        // One all-reduce message: the full activation s·b·h. A ring all-gather or
        // reduce-scatter moves (t − 1)/t of it over every link, an all-reduce twice that.
        let message = model.seq_length as f64
            * config.micro_batch as f64
            * model.hidden_size as f64
            * act_bytes;
        let half_mb = (t - 1.0) / t * message / 1e6;

        let params = ParameterBreakdown::new(model, config.tp);
        let grad_element = match precision {
            Precision::Bf16 if !options.grad_reduce_in_bf16 => 4.0,
            Precision::Bf16 | Precision::Fp16 => 2.0,
            Precision::Fp32 => 4.0,
        };

        let mut costs = ConfigCosts {
            tp,
            dp,
            pp,
            vpp,
            microbatches: m,
            passes: m.div_ceil(config.pp),
            layers: config.layers_per_stage.clone(),
            fwd_gflop: Vec::with_capacity(pp),
            bwd_gflop: Vec::with_capacity(pp),
            recompute_gflop: Vec::with_capacity(pp),
            tp_fwd_mb: Vec::with_capacity(pp),
            tp_bwd_mb: Vec::with_capacity(pp),
            tp_fwd_lat_ms: Vec::with_capacity(pp),
            tp_bwd_lat_ms: Vec::with_capacity(pp),
            ops: Vec::with_capacity(pp * GpuKind::ALL.len()),
            slot_ops: Vec::with_capacity(pp * GpuKind::ALL.len()),
            p2p_latency_ms: PerfTable::get(GpuKind::A100).collective_latency_us.p2p
                * calibration.collective_latency_scale
                / 1e3,
            tp_exposed: if options.tp_comm_overlap {
                1.0 - calibration.tp_comm_overlap
            } else {
                1.0
            },
            p2p_bytes: if sp { message / t } else { message },
            p2p_mb: 0.0,
            grad_bytes: Vec::with_capacity(pp),
            dp_reduce_mb: Vec::with_capacity(pp),
            dp_gather_mb: Vec::with_capacity(pp),
            grad_overlap: if options.overlap_grad_reduce {
                calibration.grad_reduce_overlap
            } else {
                0.0
            },
            gather_overlap: if options.overlap_param_gather && config.distributed_optimizer {
                calibration.param_gather_overlap
            } else {
                0.0
            },
            distributed_optimizer: config.distributed_optimizer,
            precision,
            notes: Vec::new(),
        };
        costs.p2p_mb = costs.p2p_bytes / 1e6;

        // Collective latencies: the table's figure for a group of 8, scaled by the ring's
        // steps (t − 1 of 7), and by the calibration.
        let latency = PerfTable::get(GpuKind::A100).collective_latency_us;
        let steps = (t - 1.0) / 7.0 * calibration.collective_latency_scale / 1e3;
        let (ar_ms, ag_ms, rs_ms) = (
            latency.all_reduce * steps,
            latency.all_gather * steps,
            latency.reduce_scatter * steps,
        );
        // A pair of SP collectives (all-gather + reduce-scatter) replaces an all-reduce.
        let pair_ms = if sp { ag_ms + rs_ms } else { ar_ms };
        let single_ms = if sp { (ag_ms + rs_ms) / 2.0 } else { ar_ms };

        for s in 0..pp {
            let first = s == 0;
            let last = s + 1 == pp;
            let flops = stage_flops(model, config, s, AttentionMask::Causal);
            costs.fwd_gflop.push(flops.forward / t / 1e9);
            costs
                .bwd_gflop
                .push((flops.backward + flops.recompute) / t / 1e9);
            costs.recompute_gflop.push(flops.recompute / t / 1e9);

            // Tensor-parallel collectives in units of (t − 1)/t · message: per layer 4 each
            // way (2 all-reduces, or 2 all-gathers + 2 reduce-scatters with SP); the
            // vocabulary-parallel embedding all-reduces its output forward (SP: a
            // reduce-scatter forward, an all-gather backward); the output layer all-reduces
            // its input gradient backward (SP: an all-gather forward, a reduce-scatter
            // backward); full recomputation redoes the forward collectives.
            let layers = config.layers_per_stage[s] as f64;
            let mut fwd_units = 4.0 * layers;
            let mut bwd_units = 4.0 * layers + 4.0 * flops.recomputed_layers as f64;
            if first {
                if sp {
                    fwd_units += 1.0;
                    bwd_units += 1.0;
                } else {
                    fwd_units += 2.0;
                }
            }
            if last {
                if sp {
                    fwd_units += 1.0;
                    bwd_units += 1.0;
                } else {
                    bwd_units += 2.0;
                }
            }
            let (tp_fwd, tp_bwd) = if tp > 1 {
                (fwd_units * half_mb, bwd_units * half_mb)
            } else {
                (0.0, 0.0)
            };
            costs.tp_fwd_mb.push(tp_fwd);
            costs.tp_bwd_mb.push(tp_bwd);
            // Latencies: two all-reduces (or AG + RS pairs) per layer each way, the
            // recomputed layers' forward ones again, and one for the embedding (forward)
            // and the output layer (backward).
            let edge = |on: bool| if on { single_ms } else { 0.0 };
            costs.tp_fwd_lat_ms.push(if tp > 1 {
                2.0 * layers * pair_ms + edge(first) + edge(last && sp)
            } else {
                0.0
            });
            costs.tp_bwd_lat_ms.push(if tp > 1 {
                2.0 * (layers + flops.recomputed_layers as f64) * pair_ms
                    + edge(last)
                    + edge(first && sp)
            } else {
                0.0
            });

            let stage_params = params.stage(config.layers_per_stage[s], first, last) as f64 / t;
            let grad_bytes = stage_params * grad_element;
            costs.grad_bytes.push(grad_bytes);
            let ring = (d - 1.0) / d;
            let (reduce, gather) = if dp < 2 {
                (0.0, 0.0)
            } else if config.distributed_optimizer {
                (ring * grad_bytes, ring * stage_params * act_bytes)
            } else {
                (2.0 * ring * grad_bytes, 0.0)
            };
            costs.dp_reduce_mb.push(reduce / 1e6);
            costs.dp_gather_mb.push(gather / 1e6);
        }

        costs.price_ops(model, config, calibration, act_bytes);
        if precision == Precision::Fp32 {
            costs.notes.push(
                "fp32 training: GPUs taken at 1/16 of their fp16 tensor peak (CUDA cores)".into(),
            );
        }
        if precision == Precision::Bf16 && grad_element == 4.0 && dp > 1 {
            costs
                .notes
                .push("bf16 gradients reduced in fp32 (Megatron's default)".into());
        }
        Ok(costs)
    }

    /// Every stage's per-operation compute on every GPU kind ([`super::ops`]).
    fn price_ops(
        &mut self,
        model: &ModelSpec,
        config: &ParallelConfig,
        calibration: &Calibration,
        act_bytes: f64,
    ) {
        let shape = OpShape {
            model,
            micro_batch: config.micro_batch,
            tp: config.tp,
            sequence_parallel: config.sequence_parallel,
            act_bytes,
        };
        let chunks = config.vpp.unwrap_or(1).max(1);
        for kind in GpuKind::ALL {
            let kind_ops = KindOps::new(&shape, kind, calibration);
            for s in 0..self.pp {
                let layers = self.layers[s];
                let recomputed_layers = match &config.recompute {
                    Recompute::Full { method, num_layers } => match method {
                        RecomputeMethod::Uniform => layers,
                        RecomputeMethod::Block => num_layers.saturating_mul(chunks).min(layers),
                    },
                    _ => 0,
                };
                let stage = kind_ops.stage(&StageShape {
                    layers,
                    first: s == 0,
                    last: s + 1 == self.pp,
                    recomputed_layers,
                    selective: config.recompute == Recompute::Selective,
                });
                self.ops.push(stage);
                self.slot_ops.push(stage.slot());
            }
            if kind == GpuKind::A100 && kind_ops.extrapolated {
                self.notes.push("some GEMM shapes lie outside the measured tables (data/perf): their efficiencies are interpolated from the nearest measured shapes".into());
            }
        }
    }

    /// Ranks: tp × dp × pp.
    pub fn world_size(&self) -> usize {
        self.tp * self.dp * self.pp
    }

    /// Micro-batches per pipeline and iteration.
    pub fn microbatches(&self) -> u64 {
        self.microbatches
    }

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
        if self.dp > 1 {
            for s in 0..self.pp {
                let sync = self.stage_sync(fabric, devices, s);
                grad = grad.max(sync.grad_reduce_ms);
                gather = gather.max(sync.param_gather_ms);
            }
        }
        pipeline + grad + gather
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
        if self.dp < 2 {
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
    //                                   group(d, s)[k] → group((d + 1) % dp, s)[k],
    //                                   max over the stage's GPUs of ms_per_gflop)
    //
    // with the hop sum taken in stage order, bit for bit what `evaluate` computes (`replica`
    // and `stage_sync` go through the same functions). The planner caches each piece.

    /// Tensor-parallel size.
    pub fn tp(&self) -> usize {
        self.tp
    }

    /// Data-parallel size.
    pub fn dp(&self) -> usize {
        self.dp
    }

    /// Pipeline-parallel size.
    pub fn pp(&self) -> usize {
        self.pp
    }

    /// Model chunks per pipeline rank (1 without the interleaved schedule).
    pub fn vpp(&self) -> usize {
        self.vpp
    }

    /// Whether one pass through the pipeline includes the wrap-around hop from the last
    /// stage to the first (the interleaved schedule with pp > 1).
    pub fn has_wrap_hop(&self) -> bool {
        self.vpp > 1 && self.pp > 1
    }

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
        hop(fabric, from, to, self.p2p_mb, self.p2p_latency_ms).0
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
        if self.dp < 2 {
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
    fn pass_from(&self, hop_sum: f64, wrap_hop: f64) -> f64 {
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
        let (compute, _) = self.slowest_compute(fabric, group, s);
        (compute, self.tp_ms(fabric, group, s) * self.tp_exposed)
    }

    /// Stage `s`'s compute for one micro-batch on the slowest GPU of `group`: (ms, position).
    #[inline]
    fn slowest_compute<F: Fabric + ?Sized>(
        &self,
        fabric: &F,
        group: &[Device],
        s: usize,
    ) -> (f64, usize) {
        let mut worst = (f64::NEG_INFINITY, 0);
        for (i, &d) in group.iter().enumerate() {
            let perf = fabric.gpu_perf(d);
            let ms = self.slot_ops[perf.kind.index() * self.pp + s].ms(perf.ms_per_peak_gflop);
            if ms > worst.0 {
                worst = (ms, i);
            }
        }
        worst
    }

    /// Stage `s`'s tensor-parallel collectives for one micro-batch, before overlap.
    #[inline]
    fn tp_ms<F: Fabric + ?Sized>(&self, fabric: &F, group: &[Device], s: usize) -> f64 {
        if self.tp > 1 {
            let (bw, _) = ring_bottleneck(fabric, group);
            (self.tp_fwd_mb[s] + self.tp_bwd_mb[s]) / bw
                + self.tp_fwd_lat_ms[s]
                + self.tp_bwd_lat_ms[s]
        } else {
            0.0
        }
    }

    /// Replica `d`: (max slot, its stage, one pass through the pipeline).
    #[inline]
    fn replica<F: Fabric + ?Sized>(
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
                    self.p2p_latency_ms,
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
                self.p2p_latency_ms,
            )
            .0;
            pass = self.pass_from(pass, wrap);
        }
        (slot, critical, pass)
    }

    /// (steady, bubble, p2p) of a replica with this slot and pass time.
    #[inline]
    fn pipeline_terms(&self, slot: f64, pass: f64) -> (f64, f64, f64) {
        let steady = self.microbatches as f64 * slot;
        let bubble = times((self.pp - 1) as f64 / self.vpp as f64, slot);
        (steady, bubble, self.passes as f64 * pass)
    }

    /// Stage `s`'s dp rings: the ring of tp rank `k` runs through replicas 0, 1, …, dp − 1.
    #[inline]
    fn stage_rings<F: Fabric + ?Sized>(
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
        for d in 0..self.dp {
            let next = if d + 1 == self.dp { 0 } else { d + 1 };
            let here = &block[self.tp * d..self.tp * (d + 1)];
            let there = &block[self.tp * next..self.tp * (next + 1)];
            for k in 0..self.tp {
                let bw = fabric.gb_per_s(here[k], there[k]);
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
    fn reduce_terms(&self, s: usize, rings: &StageRings) -> (f64, f64, f64) {
        let ms = self.dp_reduce_mb[s] / rings.gb_per_s;
        let window = times(self.grad_overlap, self.bwd_gflop[s] * rings.ms_per_gflop);
        let credit = window.min(ms);
        (ms, credit, ms - credit)
    }

    /// Parameter all-gather of stage `s`: (communication, credited overlap, exposed).
    #[inline]
    fn gather_terms(&self, s: usize, rings: &StageRings) -> (f64, f64, f64) {
        let ms = self.dp_gather_mb[s] / rings.gb_per_s;
        let window = times(self.gather_overlap, self.fwd_gflop[s] * rings.ms_per_gflop);
        let credit = window.min(ms);
        (ms, credit, ms - credit)
    }

    /// The full report of a placement: every term, and the GPUs and links behind them.
    /// `iteration_ms` equals [`ConfigCosts::evaluate`] exactly.
    pub fn report(
        &self,
        fabric: &ClusterFabric,
        cluster: &ClusterProfile,
        devices: &[Device],
    ) -> TimeEstimate {
        // The slowest replica (first on ties, as `evaluate`'s max keeps the first).
        let mut replica = 0;
        let mut pipeline = 0.0f64;
        for d in 0..self.dp {
            let ms = self.replica_ms(fabric, devices, d);
            if ms > pipeline {
                pipeline = ms;
                replica = d;
            }
        }
        let (slot, critical_stage, pass) = self.replica(fabric, devices, replica);
        let (steady_ms, bubble_ms, pipeline_p2p_ms) = self.pipeline_terms(slot, pass);

        let stages = (0..self.pp)
            .map(|s| self.stage_report(fabric, cluster, devices, replica, s))
            .collect();
        let pipeline_comm = self.pipeline_report(fabric, cluster, devices, replica, pass);
        let data_parallel = self.data_parallel_report(fabric, cluster, devices);

        let iteration_ms =
            pipeline + data_parallel.reduce_exposed_ms + data_parallel.param_gather_exposed_ms;
        let mut notes = self.notes.clone();
        let mut borrowed: Vec<GpuKind> = Vec::new();
        for d in devices {
            let kind = fabric.gpu_perf(*d).kind;
            if PerfTable::get(kind).borrowed && !borrowed.contains(&kind) {
                borrowed.push(kind);
                notes.push(format!(
                    "no published GEMM table for the {}: the A100's measured efficiencies (data/perf/a100.json) stand in, at its own peak and memory bandwidth",
                    kind.as_str()
                ));
            }
        }
        notes.push(format!(
            "1F1B critical path: {m} micro-batch slots + {bubble} bubble slots of stage {critical_stage}, and {passes} pass(es) through the pipeline (one per group of {pp} micro-batches)",
            m = self.microbatches,
            bubble = show((self.pp - 1) as f64 / self.vpp as f64),
            passes = self.passes,
            pp = self.pp,
        ));
        TimeEstimate {
            model: TimeModel::Pipette,
            iteration_ms,
            steady_ms,
            bubble_ms,
            pipeline_p2p_ms,
            data_parallel_exposed_ms: data_parallel.reduce_exposed_ms,
            param_gather_exposed_ms: data_parallel.param_gather_exposed_ms,
            overlap_credited_ms: data_parallel.reduce_overlap_ms
                + data_parallel.param_gather_overlap_ms,
            microbatches: self.microbatches,
            critical_stage,
            stages,
            pipeline: pipeline_comm,
            data_parallel,
            notes,
        }
    }

    pub(super) fn stage_report(
        &self,
        fabric: &ClusterFabric,
        cluster: &ClusterProfile,
        devices: &[Device],
        replica: usize,
        s: usize,
    ) -> StageTime {
        let group = self.group(devices, replica, s);
        let (compute, slowest) = self.slowest_compute(fabric, group, s);
        let (_, tp_comm_ms) = self.slot(fabric, group, s);
        let tp_link = (self.tp > 1).then(|| {
            let (_, i) = ring_bottleneck(fabric, group);
            link_ref(cluster, fabric, group[i], group[(i + 1) % group.len()])
        });
        let tp_total = self.tp_ms(fabric, group, s);
        let perf = fabric.gpu_perf(group[slowest]);
        let ops = &self.ops[perf.kind.index() * self.pp + s];
        StageTime {
            stage: s,
            layers: self.layers[s],
            forward_ms: ops.forward.ms(perf.ms_per_peak_gflop),
            backward_ms: ops.backward.ms(perf.ms_per_peak_gflop),
            recompute_ms: ops.recompute.ms(perf.ms_per_peak_gflop),
            tp_comm_ms,
            tp_comm_hidden_ms: tp_total - tp_comm_ms,
            tp_link,
            gpu: Some(gpu_ref(cluster, fabric, group[slowest])),
            slot_ms: compute + tp_comm_ms,
        }
    }

    fn pipeline_report(
        &self,
        fabric: &ClusterFabric,
        cluster: &ClusterProfile,
        devices: &[Device],
        replica: usize,
        per_pass_ms: f64,
    ) -> PipelineComm {
        let mut hops = Vec::new();
        let mut add = |from_stage: usize, to_stage: usize, times: u64| {
            let from = self.group(devices, replica, from_stage);
            let to = self.group(devices, replica, to_stage);
            let (ms, k) = hop(fabric, from, to, self.p2p_mb, self.p2p_latency_ms);
            hops.push(HopTime {
                from_stage,
                to_stage,
                activation: link_ref(cluster, fabric, from[k], to[k]),
                gradient: link_ref(cluster, fabric, to[k], from[k]),
                ms,
                times,
            });
        };
        for s in 0..self.pp.saturating_sub(1) {
            add(s, s + 1, self.vpp as u64);
        }
        if self.vpp > 1 && self.pp > 1 {
            add(self.pp - 1, 0, self.vpp as u64 - 1);
        }
        PipelineComm {
            replica,
            message_bytes: self.p2p_bytes,
            passes: self.passes,
            per_pass_ms,
            hops,
        }
    }

    fn data_parallel_report(
        &self,
        fabric: &ClusterFabric,
        cluster: &ClusterProfile,
        devices: &[Device],
    ) -> DataParallelComm {
        let collective = if self.distributed_optimizer {
            "reduce-scatter"
        } else {
            "all-reduce"
        };
        let mut report = DataParallelComm {
            collective,
            stage: 0,
            grad_bytes: self.grad_bytes[0],
            reduce_ms: 0.0,
            reduce_overlap_ms: 0.0,
            reduce_exposed_ms: 0.0,
            param_gather_ms: 0.0,
            param_gather_overlap_ms: 0.0,
            param_gather_exposed_ms: 0.0,
            bottleneck: None,
        };
        if self.dp < 2 {
            return report;
        }
        // The stage with the most exposed gradient reduce (the most communication when all
        // of it is hidden) is reported; the gather's maximum may come from another stage.
        let mut best: Option<(f64, f64, usize)> = None;
        let mut gather_exposed = 0.0f64;
        let mut gather_at = 0;
        for s in 0..self.pp {
            let rings = self.stage_rings(fabric, devices, s);
            let (ms, _, exposed) = self.reduce_terms(s, &rings);
            if best.is_none_or(|(e, m, _)| exposed > e || (exposed == e && ms > m)) {
                best = Some((exposed, ms, s));
            }
            let (_, _, g) = self.gather_terms(s, &rings);
            if g > gather_exposed {
                gather_exposed = g;
                gather_at = s;
            }
        }
        let (_, _, s) = best.expect("pp is at least 1");
        let rings = self.stage_rings(fabric, devices, s);
        let (reduce_ms, reduce_overlap_ms, reduce_exposed_ms) = self.reduce_terms(s, &rings);
        let gather_rings = self.stage_rings(fabric, devices, gather_at);
        let (param_gather_ms, param_gather_overlap_ms, param_gather_exposed_ms) =
            self.gather_terms(gather_at, &gather_rings);
        let base = self.tp * self.dp * s;
        let next = (rings.replica + 1) % self.dp;
        let from = devices[base + self.tp * rings.replica + rings.tp_rank];
        let to = devices[base + self.tp * next + rings.tp_rank];
        report.stage = s;
        report.grad_bytes = self.grad_bytes[s];
        report.reduce_ms = reduce_ms;
        report.reduce_overlap_ms = reduce_overlap_ms;
        report.reduce_exposed_ms = reduce_exposed_ms;
        report.param_gather_ms = param_gather_ms;
        report.param_gather_overlap_ms = param_gather_overlap_ms;
        report.param_gather_exposed_ms = param_gather_exposed_ms;
        report.bottleneck = Some(RingLink {
            stage: s,
            tp_rank: rings.tp_rank,
            link: link_ref(cluster, fabric, from, to),
        });
        report
    }
}

/// A number for a note: integers without a fraction.
fn show(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

/// The configuration can be costed: sizes positive, layers split over the stages, at least
/// one micro-batch per pipeline.
fn check_config(
    model: &ModelSpec,
    training: &TrainingSettings,
    config: &ParallelConfig,
) -> Result<(), TimeError> {
    let bad = |text: String| Err(TimeError::Config(text));
    for (name, value) in [
        ("tp", config.tp),
        ("pp", config.pp),
        ("dp", config.dp),
        ("micro-batch", config.micro_batch),
    ] {
        if value == 0 {
            return bad(format!("{name} is 0 (give at least 1)"));
        }
    }
    if config.vpp == Some(0) {
        return bad("virtual pipeline size is 0 (give at least 1, or none)".into());
    }
    if config.layers_per_stage.len() as u64 != config.pp {
        return bad(format!(
            "{} layer counts for {} pipeline stages",
            config.layers_per_stage.len(),
            config.pp
        ));
    }
    if let Some(s) = config.layers_per_stage.iter().position(|&l| l == 0) {
        return bad(format!(
            "pipeline stage {s} has no layers (use fewer stages)"
        ));
    }
    let total: u64 = config.layers_per_stage.iter().sum();
    if total != model.num_layers {
        return bad(format!(
            "the stages hold {total} layers, the model has {}",
            model.num_layers
        ));
    }
    if config.num_microbatches(training.global_batch_size) == 0 {
        return bad(format!(
            "global batch {} is smaller than micro-batch {} × dp {} (no micro-batch per pipeline)",
            training.global_batch_size, config.micro_batch, config.dp
        ));
    }
    Ok(())
}
