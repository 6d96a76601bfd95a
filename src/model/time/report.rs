//! The full report of one placement under the Pipette model ([`ConfigCosts::report`]):
//! every term of the estimate and the GPUs and links behind it.

use crate::cluster::ClusterProfile;
use crate::model::parallel::Device;

use super::costs::ConfigCosts;
use super::evaluate::{hop, ring_bottleneck};
use super::perf::GpuKind;
use super::{
    gpu_ref, link_ref, ClusterFabric, DataParallelComm, Fabric, HopTime, LinkRef, PipelineComm,
    RingLink, StageTime, ThroughputBasis, TimeEstimate, TimeModel,
};

impl ConfigCosts {
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

        let stages: Vec<StageTime> = (0..self.pp)
            .map(|s| self.stage_report(fabric, cluster, devices, replica, s))
            .collect();
        let pipeline_comm = self.pipeline_report(fabric, cluster, devices, replica, pass);
        let data_parallel = self.data_parallel_report(fabric, cluster, devices);

        let optimizer_ms = self.optimizer_step_ms(fabric, devices);
        // The critical stage's slowest GPU prices the MoE terms ([`super::moe`]).
        let critical_group = self.group(devices, replica, critical_stage);
        let critical_gpu = critical_group[self
            .slowest_compute(fabric, critical_group, critical_stage)
            .1];
        let expert = self.expert_report(fabric, devices, critical_stage, critical_gpu);
        let (dispatch_ms, expert_dp_exposed_ms) = if self.expert.is_some() {
            (
                self.dispatch_ms(fabric, devices),
                self.expert_sync_ms(fabric, devices),
            )
        } else {
            (0.0, 0.0)
        };
        let iteration_ms = pipeline
            + data_parallel.reduce_exposed_ms
            + data_parallel.param_gather_exposed_ms
            + optimizer_ms
            + (dispatch_ms + expert_dp_exposed_ms);
        let mut notes = self.notes.clone();
        if let Some(x) = &expert {
            notes.push(format!(
                "experts: {} routed per rank over ep {} × etp {} (expert-dp {}), {:.0} tokens per expert and micro-batch at {:.2}× the mean load; per micro-batch on stage {critical_stage}: router {:.2} ms, permute/unpermute {:.2} ms, expert GEMMs {:.2} ms, shared expert {:.2} ms, MLA {:.2} ms, MTP {:.2} ms (the dense MLP's {:.2} ms left out)",
                x.experts_per_rank, x.ep, x.etp, x.expert_dp, x.tokens_per_expert, x.load_factor,
                x.router_ms, x.permute_ms, x.experts_ms, x.shared_expert_ms, x.mla_ms, x.mtp_ms,
                x.dense_mlp_replaced_ms,
            ));
            if x.ep > 1 {
                notes.push(format!(
                    "{} dispatch and combine: {} collectives per micro-batch of {:.3} ms each ({}), {:.1} ms per micro-batch, {:.1} ms in the iteration; expert-data-parallel reduce {:.1} ms exposed",
                    x.dispatcher,
                    x.collectives_per_microbatch,
                    x.dispatch.ms,
                    if x.dispatch.crosses_nodes {
                        format!(
                            "across nodes: {} of the group on a node, {:.0} GB/s over the network",
                            x.dispatch.on_node, x.dispatch.inter_gb_per_s
                        )
                    } else {
                        format!("inside a node over {:.0} GB/s", x.dispatch.intra_gb_per_s)
                    },
                    x.dispatch_per_microbatch_ms,
                    x.dispatch_ms,
                    x.expert_dp_exposed_ms,
                ));
            }
        }
        // Only where no fp32 figure was measured (a CPU stand-in's is).
        if devices
            .iter()
            .any(|d| fabric.throughput(*d).basis == ThroughputBasis::Fp32FromFp16Peak)
        {
            notes.push(
                "fp32 training: GPUs taken at 1/16 of their fp16 tensor peak (CUDA cores)".into(),
            );
        }
        let mut seen: Vec<GpuKind> = Vec::new();
        for d in devices {
            let kind = fabric.gpu_perf(*d).kind;
            if seen.contains(&kind) {
                continue;
            }
            seen.push(kind);
            if let Some((source, interpolated, extrapolated)) = &self.measured[kind.index()] {
                notes.push(format!(
                    "{} figures measured, not shipped: {source}{}",
                    kind.as_str(),
                    match (interpolated, extrapolated) {
                        (_, true) => "; some shapes lie outside the measured ones: the nearest measured shapes govern them",
                        (true, false) => "; shapes between the measured ones are interpolated (inverse-distance, log2 of the shape) as in the shipped tables",
                        (false, false) => "",
                    }
                ));
            } else if self.borrowed[kind.index()] {
                notes.push(format!(
                    "no published GEMM table for the {}: the A100's measured efficiencies (data/perf/a100.json) stand in, at its own peak and memory bandwidth",
                    kind.as_str()
                ));
            }
        }
        if self.cp > 1 {
            notes.push(format!(
                "context parallelism over {} ranks: {} ms of the key/value exchange per micro-batch left exposed on stage {critical_stage} (a p2p ring hides each step behind the attention it overlaps; allgather and a2a block)",
                self.cp,
                show(stages[critical_stage].cp_comm_ms)
            ));
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
            optimizer_ms,
            overlap_credited_ms: data_parallel.reduce_overlap_ms
                + data_parallel.param_gather_overlap_ms,
            microbatches: self.microbatches,
            critical_stage,
            stages,
            pipeline: pipeline_comm,
            data_parallel,
            expert_parallel_ms: dispatch_ms,
            expert_dp_exposed_ms,
            expert,
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
        let (_, comm_ms) = self.slot(fabric, group, s);
        let cp_comm_ms = self.cp_ms(fabric, group, s);
        let tp_comm_ms = comm_ms - cp_comm_ms;
        let tp_group = &group[..self.tensor.min(group.len())];
        let tp_link = (self.tensor > 1).then(|| {
            // The ring's attained bandwidth there: across nodes, the node link times the
            // group's share of the NICs.
            let (gb_per_s, i) = ring_bottleneck(fabric, tp_group);
            LinkRef {
                gb_per_s,
                ..link_ref(
                    cluster,
                    fabric,
                    tp_group[i],
                    tp_group[(i + 1) % tp_group.len()],
                )
            }
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
            cp_comm_ms,
            tp_link,
            gpu: Some(gpu_ref(cluster, fabric, group[slowest])),
            host_ms: self.host_ms[s],
            slot_ms: compute + comm_ms,
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
            let (ms, k) = hop(fabric, from, to, self.p2p_mb, &self.p2p_latency_ms);
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
        if self.dp * self.cp < 2 {
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
            // The ring's attained bandwidth there: across nodes, the node link times the
            // ring's share of the NICs.
            link: LinkRef {
                gb_per_s: rings.gb_per_s,
                ..link_ref(cluster, fabric, from, to)
            },
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
