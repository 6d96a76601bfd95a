//! Context parallelism's communication inside a stage ([`ContextExchange`]): what a rank
//! sends to the other ranks of its context-parallel group in each layer, and how much of it
//! the attention hides.
//!
//! Per tensor-parallel rank, with `T = s·b/cp` tokens on a rank, key/value width
//! `kv = max(groups/tp, 1)·d`, query width `q = heads/tp·d` and `e` bytes an element
//! (Transformer Engine's `attn_forward_func_with_cp`, megatron-core 0.19.2):
//!
//! | `--cp-comm-type` | forward, per layer | backward, per layer | hidden behind |
//! |---|---|---|---|
//! | `p2p` | cp − 1 ring steps of the K and V chunk in hand, `2·T·kv·e` each | cp − 1 steps of K, V and their gradients, twice that | each step's attention block (the exposed part is what a transfer takes beyond it) |
//! | `allgather` | all-gather of K and V: `(cp − 1)·2·T·kv·e` | reduce-scatter of their gradients, the same | nothing |
//! | `a2a` | all-to-alls of Q, K, V and of the output: `(cp − 1)/cp·T·(2q + 2kv)·e` | the same for the gradients | nothing |
//! | `a2a+p2p` | a2a over the first level of `--hierarchical-context-parallel-sizes`, then p2p over the rest with that level's tokens and heads | likewise | p2p's part as above |
//!
//! A layer's attention block is the rank's attention core of the layer (the cost model's
//! own figure), split into cp equal steps; backward steps take twice the forward's. Every
//! transfer crosses the slowest link of the rings it runs over: the whole group's ring, or
//! under `a2a+p2p` the a2a over each run of `a` consecutive cp ranks (inside a node or an
//! NVLink domain when the levels are laid out so) and the p2p over the rings of ranks `a`
//! apart (Megatron's hierarchical groups: megatron-core `parallel_state`
//! `create_hierarchical_groups`, the first level's ranks consecutive). Recomputed layers
//! (full recomputation, or the core attention under selective recomputation) exchange their
//! forward again.

use crate::config::{CpCommType, Recompute, RecomputeMethod, TrainingSettings};
use crate::model::calibration::Calibration;
use crate::model::parallel::{Device, ParallelConfig};

use super::ops::{KindOps, OpCost, OpShape};
use super::perf::{GpuKind, PerfTables};
use super::Fabric;

/// The exchange of `config` (`None` at cp 1): `shape` is the rank's operations' shape
/// (sequence s/cp, [`crate::model::context::rank_model`]).
pub(super) fn context_exchange(
    shape: &OpShape<'_>,
    config: &ParallelConfig,
    training: &TrainingSettings,
    tables: &PerfTables,
    calibration: &Calibration,
) -> Option<ContextExchange> {
    if config.cp <= 1 {
        return None;
    }
    let model = shape.model;
    let chunks = config.vpp.unwrap_or(1).max(1);
    let stages: Vec<(u64, u64)> = config
        .layers_per_stage
        .iter()
        .map(|&layers| {
            let redone = match &config.recompute {
                Recompute::Full {
                    method: RecomputeMethod::Uniform,
                    ..
                } => layers,
                Recompute::Full {
                    method: RecomputeMethod::Block,
                    num_layers,
                } => num_layers.saturating_mul(chunks).min(layers),
                // The core attention, exchange and all.
                Recompute::Selective => layers,
                Recompute::None => 0,
            };
            (layers, redone)
        })
        .collect();
    let us = calibration.collective_latency_scale / 1e3;
    let cp = config.cp as usize;
    let attention =
        GpuKind::ALL.map(|k| KindOps::new(shape, tables.get(k), calibration).attention());
    let message = GpuKind::ALL.map(|k| tables.get(k).collective_latency(cp).p2p * us);
    let collective = GpuKind::ALL.map(|k| tables.get(k).collective_latency(cp).all_gather * us);
    ContextExchange::new(
        &ExchangeShape {
            cp: config.cp,
            tp: config.tp,
            comm: training.cp_comm_type,
            a2a_level: training
                .hierarchical_context_parallel
                .as_ref()
                .and_then(|l| l.first().copied()),
            seq_length: model.seq_length * config.cp,
            micro_batch: config.micro_batch,
            heads: model.num_attention_heads,
            query_groups: model.num_query_groups,
            head_dim: model.kv_channels,
            act_bytes: shape.act_bytes,
        },
        &stages,
        attention,
        message,
        collective,
    )
}

/// One configuration's context-parallel exchange, per stage and GPU kind.
#[derive(Debug, Clone)]
pub(super) struct ContextExchange {
    cp: usize,
    tensor: usize,
    /// Context-parallel ranks in one a2a group: `a2a+p2p`'s first level, else the whole
    /// group (the p2p ring then runs over ranks this far apart).
    a2a_ranks: usize,
    /// Forward exchanges per micro-batch of each stage: its layers and the recomputed ones.
    forward_layers: Vec<f64>,
    /// Backward exchanges per micro-batch of each stage: its layers.
    backward_layers: Vec<f64>,
    /// p2p ring steps per layer and the MB one forward step moves.
    ring_steps: f64,
    ring_step_mb: f64,
    /// MB a layer's blocking collectives move forward (the backward moves the same).
    blocking_mb: f64,
    /// Blocking collectives per layer and direction (their latencies).
    blocking_ops: f64,
    /// One layer's attention core forward on each GPU kind (the rank's whole share).
    attention: [OpCost; GpuKind::ALL.len()],
    /// Latency of one p2p message and of one collective over the group, per GPU kind, ms.
    message_latency_ms: [f64; GpuKind::ALL.len()],
    collective_latency_ms: [f64; GpuKind::ALL.len()],
}

/// What the exchange depends on apart from the stages.
pub(super) struct ExchangeShape {
    pub cp: u64,
    pub tp: u64,
    pub comm: CpCommType,
    /// The a2a level of `a2a+p2p` (`--hierarchical-context-parallel-sizes`' first).
    pub a2a_level: Option<u64>,
    pub seq_length: u64,
    pub micro_batch: u64,
    pub heads: u64,
    pub query_groups: u64,
    pub head_dim: u64,
    pub act_bytes: f64,
}

impl ContextExchange {
    /// `None` without context parallelism. `stages` holds each stage's (layers, forward
    /// exchanges redone by recomputation); `attention` and the latencies are per GPU kind.
    pub(super) fn new(
        shape: &ExchangeShape,
        stages: &[(u64, u64)],
        attention: [OpCost; GpuKind::ALL.len()],
        message_latency_ms: [f64; GpuKind::ALL.len()],
        collective_latency_ms: [f64; GpuKind::ALL.len()],
    ) -> Option<Self> {
        let cp = shape.cp;
        if cp <= 1 {
            return None;
        }
        let t = shape.tp.max(1);
        let tokens = (shape.seq_length * shape.micro_batch) as f64 / cp as f64;
        let d = shape.head_dim as f64;
        let kv = (shape.query_groups / t).max(1) as f64 * d;
        let q = (shape.heads / t).max(1) as f64 * d;
        let e = shape.act_bytes;
        let cpf = cp as f64;
        let (mut ring_steps, mut ring_step_mb, mut blocking_mb, mut blocking_ops) =
            (0.0, 0.0, 0.0, 0.0);
        let mut a2a_ranks = cp as usize;
        match shape.comm {
            CpCommType::P2p => {
                ring_steps = cpf - 1.0;
                ring_step_mb = 2.0 * tokens * kv * e / 1e6;
            }
            CpCommType::Allgather => {
                blocking_mb = (cpf - 1.0) * 2.0 * tokens * kv * e / 1e6;
                blocking_ops = 1.0;
            }
            CpCommType::A2a => {
                blocking_mb = (cpf - 1.0) / cpf * tokens * (2.0 * q + 2.0 * kv) * e / 1e6;
                blocking_ops = 2.0;
            }
            CpCommType::A2aP2p => {
                let level = shape.a2a_level.unwrap_or(1).clamp(1, cp);
                a2a_ranks = level as usize;
                let a = level as f64;
                let p = cpf / a;
                blocking_mb = (a - 1.0) / a * tokens * (2.0 * q + 2.0 * kv) * e / 1e6;
                blocking_ops = if a > 1.0 { 2.0 } else { 0.0 };
                // After the a2a a rank holds a·T tokens of 1/a of the heads.
                ring_steps = p - 1.0;
                ring_step_mb = 2.0 * tokens * kv * e / 1e6;
            }
        }
        Some(ContextExchange {
            cp: cp as usize,
            tensor: t as usize,
            a2a_ranks,
            forward_layers: stages.iter().map(|&(l, r)| (l + r) as f64).collect(),
            backward_layers: stages.iter().map(|&(l, _)| l as f64).collect(),
            ring_steps,
            ring_step_mb,
            blocking_mb,
            blocking_ops,
            attention,
            message_latency_ms,
            collective_latency_ms,
        })
    }

    /// The exposed exchange of stage `s` for one micro-batch (forward and backward), ms,
    /// run by `group` (a replica's ranks of the stage, tp fastest then cp) with `slowest`
    /// its slowest GPU.
    pub(super) fn exposed_ms<F: Fabric + ?Sized>(
        &self,
        fabric: &F,
        group: &[Device],
        slowest: Device,
        s: usize,
    ) -> f64 {
        let perf = fabric.gpu_perf(slowest);
        let k = perf.kind.index();
        let (mut forward, mut backward) = (0.0, 0.0);
        if self.ring_steps > 0.0 {
            // The p2p ring: the whole group, or a2a+p2p's rings of ranks a2a_ranks apart.
            let (len, stride) = if self.a2a_ranks < self.cp {
                (self.cp / self.a2a_ranks, self.a2a_ranks)
            } else {
                (self.cp, 1)
            };
            let bw = self.rings_gb_per_s(fabric, group, len, stride);
            let step = self.attention[k].ms(perf.ms_per_peak_gflop) / (self.ring_steps + 1.0);
            let latency = self.message_latency_ms[k];
            let send = self.ring_step_mb / bw + latency;
            forward += self.ring_steps * (send - step).max(0.0);
            backward +=
                self.ring_steps * (2.0 * self.ring_step_mb / bw + latency - 2.0 * step).max(0.0);
        }
        if self.blocking_ops > 0.0 {
            let bw = self.rings_gb_per_s(fabric, group, self.a2a_ranks, 1);
            let ms = self.blocking_mb / bw + self.blocking_ops * self.collective_latency_ms[k];
            forward += ms;
            backward += ms;
        }
        self.forward_layers[s] * forward + self.backward_layers[s] * backward
    }

    /// The slowest link of the group's context-parallel rings (one per tp rank: the ranks
    /// `tp` apart), GB/s; a hop between nodes gets the ring's share of the NICs.
    pub(super) fn ring_gb_per_s<F: Fabric + ?Sized>(&self, fabric: &F, group: &[Device]) -> f64 {
        self.rings_gb_per_s(fabric, group, self.cp, 1)
    }

    /// The slowest link of the rings of `len` context-parallel ranks `stride` apart (per
    /// tp rank, every such ring of the group), GB/s; a hop between nodes gets the ring's
    /// share of the NICs.
    fn rings_gb_per_s<F: Fabric + ?Sized>(
        &self,
        fabric: &F,
        group: &[Device],
        len: usize,
        stride: usize,
    ) -> f64 {
        let (t, cp) = (self.tensor, self.cp);
        let (len, stride) = (len.max(1), stride.max(1));
        let mut best = f64::INFINITY;
        // A ring starts at every cp rank whose position in its run of `stride·len` ranks is
        // below `stride`.
        for base in (0..cp).filter(|c| (c / stride) % len == 0) {
            let member = |k: usize, j: usize| group.get(k + t * (base + stride * (j % len)));
            // The ring's members per node, counted once per ring (sorted node indices, a
            // node's count by two binary searches): counting them again for every hop made
            // a ring cost len² look-ups, which on 100,000 GPUs with cp 64 was most of the
            // planner's time.
            let mut nodes: Vec<usize> = Vec::with_capacity(len);
            let mut last_nodes: Vec<usize> = Vec::with_capacity(len);
            // A hop over the network costs what its two nodes and their member counts say,
            // whichever GPUs it joins: the rings of the other tp ranks, on the same nodes,
            // reuse the figure of the hop at the same place in the ring.
            let mut over: Vec<Option<(usize, usize, f64)>> = vec![None; len];
            for k in 0..t.min(group.len()) {
                std::mem::swap(&mut nodes, &mut last_nodes);
                nodes.clear();
                nodes.extend((0..len).filter_map(|i| member(k, i).map(|d| d.node)));
                nodes.sort_unstable();
                let same_nodes = k > 0 && nodes == last_nodes;
                let on = |node: usize| {
                    nodes.partition_point(|&n| n <= node) - nodes.partition_point(|&n| n < node)
                };
                for (j, hop) in over.iter_mut().enumerate() {
                    let (Some(&a), Some(&b)) = (member(k, j), member(k, j + 1)) else {
                        continue;
                    };
                    if a == b {
                        continue;
                    }
                    if !fabric.over_network(a.node, b.node) {
                        best = best.min(fabric.gb_per_s(a, b));
                        continue;
                    }
                    let bw = match *hop {
                        Some((x, y, bw)) if same_nodes && (x, y) == (a.node, b.node) => bw,
                        _ => {
                            let bw = fabric.gb_per_s(a, b)
                                * fabric
                                    .nic_share(a.node, on(a.node))
                                    .min(fabric.nic_share(b.node, on(b.node)));
                            *hop = Some((a.node, b.node, bw));
                            bw
                        }
                    };
                    best = best.min(bw);
                }
            }
        }
        best
    }
}
