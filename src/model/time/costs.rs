//! The per-configuration half of the Pipette model: [`ConfigCosts::new`] prices everything
//! that does not depend on the placement (FLOPs and per-operation compute per stage and GPU
//! kind, the volume and latency of every collective and message) and checks that the
//! configuration can be costed. The per-placement half is [`super::evaluate`], the full
//! report [`super::report`]; see the module doc of [`super`] for the formulas.

use crate::config::{ModelSpec, Precision, Recompute, RecomputeMethod, TrainingSettings};
use crate::model::calibration::Calibration;
use crate::model::context::{context_split_error, rank_model};
use crate::model::flops::{stage_flops, AttentionMask};
use crate::model::memory::AttentionKernel;
use crate::model::parallel::ParallelConfig;
use crate::model::params::ParameterBreakdown;

use super::cp::{context_exchange, ContextExchange};
use super::moe::{stage_expert_params, stage_start, ExpertCosts, ExpertKindOps, ExpertShape};
use super::ops::{
    fused_softmax_available, gathered_bytes, KindOps, OpCost, OpShape, StageOps, StageShape,
    FALLBACK_SOFTMAX_EXTRA_KERNELS, MEGATRON_LAYER_PASS_OPS,
};
use super::perf::{GpuKind, PerfTables};
use super::{TimeError, TimeOptions};

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
    /// Ranks of one replica in one stage: tp × cp (Megatron's order puts them together,
    /// tp fastest), the group every per-stage term is read from.
    pub(super) tp: usize,
    /// Tensor-parallel size.
    pub(super) tensor: usize,
    /// Context-parallel size.
    pub(super) cp: usize,
    /// The context-parallel exchange ([`super::cp`]); `None` at cp 1.
    pub(super) context: Option<ContextExchange>,
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
    /// Latency of stage `s`'s tp collectives per micro-batch (forward and backward) on
    /// GPU kind `k` at `k · pp + s`, ms.
    pub(super) tp_latency_ms: Vec<f64>,
    /// Share of tp collective time left exposed.
    pub(super) tp_exposed: f64,
    /// The GEMMs of stage `s` on GPU kind `k` (at `k · pp + s`) that `--tp-comm-overlap`
    /// hides the tp collectives behind ([`KindOps::tp_overlap_gemms`]): no more hides
    /// than they last.
    pub(super) tp_overlap_ops: Vec<OpCost>,
    /// Per-operation compute of stage `s` on GPU kind `k` at `k · pp + s`.
    pub(super) ops: Vec<StageOps>,
    /// `ops[i].slot()`, for the evaluation's inner loop.
    pub(super) slot_ops: Vec<OpCost>,
    /// The host's time to issue stage `s`'s forward and backward passes of one
    /// micro-batch, ms: the least a slot can take on any GPU.
    pub(super) host_ms: Vec<f64>,
    /// Latency of one pipeline message per GPU kind, ms.
    pub(super) p2p_latency_ms: [f64; GpuKind::ALL.len()],
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
    /// Bytes the optimizer step moves through HBM on one GPU of stage `s` ([`optimizer_bytes`]).
    pub(super) optimizer_bytes: Vec<f64>,
    /// The optimizer step of stage `s` on GPU kind `k` at `k · pp + s`, ms.
    pub(super) optimizer_ms: Vec<f64>,
    pub(super) distributed_optimizer: bool,
    pub(super) precision: Precision,
    /// Fixed notes on how the inputs were read.
    pub(super) notes: Vec<String>,
    /// Expert parallelism's placement-independent costs ([`super::moe`]); `None` for a
    /// dense model.
    pub(super) expert: Option<ExpertCosts>,
    /// Per GPU kind: the MoE, MLA and MTP operations; empty when the model has none.
    pub(super) expert_ops: Vec<ExpertKindOps>,
    pub(super) has_mla: bool,
    /// The busiest expert-parallel rank's load over an even split (1 for a dense model).
    pub(super) load: f64,
    /// Per GPU kind: the table priced with is another kind's stand-in.
    pub(super) borrowed: [bool; GpuKind::ALL.len()],
    /// Per GPU kind: where a measured table came from, and whether some shape was
    /// interpolated (or lay outside its shapes); `None`: the shipped table.
    pub(super) measured: [Option<(String, bool, bool)>; GpuKind::ALL.len()],
}

impl ConfigCosts {
    /// Costs `config` for `model` trained as `training` says (global batch, precision;
    /// micro-batch, recomputation, sequence parallelism and the distributed optimizer come
    /// from `config`), with the shipped tables.
    pub fn new(
        model: &ModelSpec,
        training: &TrainingSettings,
        config: &ParallelConfig,
        calibration: &Calibration,
        options: &TimeOptions,
    ) -> Result<Self, TimeError> {
        Self::with_tables(
            model,
            training,
            config,
            calibration,
            options,
            PerfTables::shipped(),
        )
    }

    /// [`ConfigCosts::new`] with `tables` (a cluster's: [`super::ClusterFabric::tables`]).
    pub fn with_tables(
        model: &ModelSpec,
        training: &TrainingSettings,
        config: &ParallelConfig,
        calibration: &Calibration,
        options: &TimeOptions,
        tables: &PerfTables,
    ) -> Result<Self, TimeError> {
        super::check_calibration(calibration)?;
        check_config(model, training, config)?;
        if let Some(why) = context_split_error(
            model,
            config,
            training.cp_comm_type,
            training.hierarchical_context_parallel.as_deref(),
        ) {
            return Err(TimeError::Config(why));
        }
        // Everything token-wise is that of the rank's s/cp tokens ([`crate::model::context`]).
        let full_model = model;
        let rank = rank_model(model, config.cp);
        let model = &*rank;
        let cp = config.cp.max(1) as usize;
        let tp = config.tp as usize;
        let dp = config.dp as usize;
        let pp = config.pp as usize;
        let vpp = config.vpp.unwrap_or(1) as usize;
        let m = config.num_microbatches(training.global_batch_size);
        let precision = training.precision;
        let act_bytes = dtype_bytes(precision);
        let t = config.tp as f64;
        let reducers = (config.dp * config.cp.max(1)) as f64;
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
            tp: tp * cp,
            tensor: tp,
            cp,
            context: None,
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
            tp_latency_ms: Vec::with_capacity(pp * GpuKind::ALL.len()),
            ops: Vec::with_capacity(pp * GpuKind::ALL.len()),
            slot_ops: Vec::with_capacity(pp * GpuKind::ALL.len()),
            host_ms: Vec::with_capacity(pp),
            p2p_latency_ms: [0.0; GpuKind::ALL.len()],
            tp_overlap_ops: Vec::with_capacity(pp * GpuKind::ALL.len()),
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
            optimizer_bytes: Vec::with_capacity(pp),
            optimizer_ms: Vec::with_capacity(pp * GpuKind::ALL.len()),
            precision,
            notes: Vec::new(),
            borrowed: GpuKind::ALL.map(|k| tables.get(k).borrowed),
            measured: Default::default(),
            expert: ExpertCosts::new(
                model,
                training,
                config,
                calibration,
                tables,
                act_bytes,
                grad_element,
            ),
            expert_ops: Vec::new(),
            has_mla: model.mla.is_some(),
            load: model.moe.as_ref().map_or(1.0, super::moe::load_factor),
        };
        costs.p2p_mb = costs.p2p_bytes / 1e6;

        // The operations' shapes, priced per GPU kind below ([`Self::price_ops`]).
        let shape = OpShape {
            model,
            micro_batch: config.micro_batch,
            tp: config.tp,
            sequence_parallel: config.sequence_parallel,
            act_bytes,
            // Context parallelism runs Transformer Engine's fused attention.
            attention: if cp > 1 {
                AttentionKernel::Fused
            } else {
                options.attention
            },
            context_parallel: config.cp,
            fused_softmax: fused_softmax_available(model, config.micro_batch, config.tp),
            low_precision: training.low_precision.as_ref().map(|l| l.bits),
        };
        let slow_softmax = shape.attention == AttentionKernel::Unfused && !shape.fused_softmax;
        // Per stage: (all-reduce pairs, single collectives) of the tp latencies.
        let mut tp_pairs: Vec<(f64, f64)> = Vec::with_capacity(pp);
        for s in 0..pp {
            let first = s == 0;
            let last = s + 1 == pp;
            // A context-parallel rank does 1/cp of the whole sequence's work (balanced chunks).
            let flops = stage_flops(full_model, config, s, AttentionMask::Causal);
            let tc = t * cp as f64;
            costs.fwd_gflop.push(flops.forward / tc / 1e9);
            costs
                .bwd_gflop
                .push((flops.backward + flops.recompute) / tc / 1e9);
            costs.recompute_gflop.push(flops.recompute / tc / 1e9);
            // Forward, backward (twice the forward's kernels) and the recomputed forwards;
            // PyTorch's softmax path issues more operations each way.
            let layers = config.layers_per_stage[s] as f64;
            let recomputed = flops.recomputed_layers as f64;
            let mut host_passes = 3.0 * layers + recomputed;
            if slow_softmax {
                host_passes += (2.0 * layers + recomputed) * FALLBACK_SOFTMAX_EXTRA_KERNELS
                    / MEGATRON_LAYER_PASS_OPS;
            }
            costs
                .host_ms
                .push(host_passes * calibration.host_layer_pass_ms);

            // Tensor-parallel collectives in units of (t − 1)/t · message: per layer 4 each
            // way (2 all-reduces, or 2 all-gathers + 2 reduce-scatters with SP); the
            // vocabulary-parallel embedding all-reduces its output forward (SP: a
            // reduce-scatter forward, an all-gather backward); the output layer all-reduces
            // its input gradient backward (SP: an all-gather forward, a reduce-scatter
            // backward); full recomputation redoes the forward collectives.
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
            // FP8/FP4 with sequence parallelism: Transformer Engine quantises a
            // column-parallel layer's input before all-gathering it forward and a
            // row-parallel layer's output gradient before gathering it backward
            // (`module/layernorm_linear.py` and `module/linear.py`:
            // `gather_along_first_dim(.., quantizer=..)`; `module/base.py`
            // `grad_output_preprocess`), so those all-gathers carry the low-precision copy;
            // the reduce-scatters carry the GEMMs' 16-bit outputs. An MoE layer's MLP
            // gather is the token dispatcher's, before quantisation, and the layers kept
            // in BF16 gather at 16 bits: only their attention's, and the dense MLP's, shrink.
            if let Some(low) = training.low_precision.as_ref().filter(|_| sp) {
                let stage_layers = config.layers_per_stage[s];
                let low_layers = stage_layers
                    - low.bf16_layers_in(stage_start(config, s), stage_layers, model.num_layers);
                let moe_layers = costs
                    .expert
                    .as_ref()
                    .map_or(0, |x| x.moe_layers[s])
                    .min(low_layers);
                let gathers = (2 * low_layers - moe_layers) as f64;
                let saved = (1.0 - gathered_bytes(low.bits) / act_bytes).max(0.0) * gathers;
                fwd_units -= saved;
                bwd_units -= saved * (1.0 + recomputed / layers.max(1.0));
            }
            let (tp_fwd, tp_bwd) = if tp > 1 {
                (fwd_units * half_mb, bwd_units * half_mb)
            } else {
                (0.0, 0.0)
            };
            costs.tp_fwd_mb.push(tp_fwd);
            costs.tp_bwd_mb.push(tp_bwd);
            // Latencies, per GPU kind: two all-reduces (or AG + RS pairs) per layer each
            // way, the recomputed layers' forward ones again, and one for the embedding
            // (forward) and the output layer (backward).
            if tp > 1 {
                let pairs = 4.0 * layers + 2.0 * flops.recomputed_layers as f64;
                // The embedding's (forward; with SP backward too) and the output layer's
                // (backward; with SP forward too).
                let edges = f64::from(u8::from(first)) + f64::from(u8::from(last));
                let singles = edges * if sp { 2.0 } else { 1.0 };
                tp_pairs.push((pairs, singles));
            } else {
                tp_pairs.push((0.0, 0.0));
            }

            // The stage's own layers (dense and MoE ones differ); routed experts reduce over
            // the expert-data-parallel group instead ([`super::moe`]).
            let stage_params = params.stage_from(
                stage_start(config, s),
                config.layers_per_stage[s],
                first,
                last,
            ) as f64
                / t
                - stage_expert_params(&params, config, s);
            let grad_bytes = stage_params * grad_element;
            costs.grad_bytes.push(grad_bytes);
            // Gradients are reduced over dp × cp (Megatron's data-parallel group with
            // context parallelism), where the distributed optimizer shards too.
            let (reduce, gather) = ring_sync_bytes(
                dp * cp,
                stage_params,
                grad_bytes,
                gathered_param_bytes(training, &params, config, s, stage_params, act_bytes),
                config.distributed_optimizer,
            );
            costs.dp_reduce_mb.push(reduce / 1e6);
            costs.dp_gather_mb.push(gather / 1e6);
            let mut step_bytes = optimizer_bytes(
                stage_params,
                precision,
                grad_element,
                if config.distributed_optimizer {
                    reducers
                } else {
                    1.0
                },
            );
            if let Some(x) = &costs.expert {
                // The routed experts' state, sharded over the expert-data-parallel group.
                step_bytes += optimizer_bytes(
                    x.grad_bytes[s] / grad_element,
                    precision,
                    grad_element,
                    if config.distributed_optimizer {
                        x.edp as f64
                    } else {
                        1.0
                    },
                );
            }
            costs.optimizer_bytes.push(step_bytes);
        }
        for kind in GpuKind::ALL {
            let hbm_gb_per_s = tables.get(kind).hbm_gb_per_s;
            for s in 0..pp {
                costs
                    .optimizer_ms
                    .push(costs.optimizer_bytes[s] / (hbm_gb_per_s * 1e6));
            }
        }

        // Collective latencies by GPU kind and tp group size, scaled by the calibration.
        for kind in GpuKind::ALL {
            let latency = tables.get(kind).collective_latency(tp);
            let us = calibration.collective_latency_scale / 1e3;
            let (ar, ag, rs) = (
                latency.all_reduce * us,
                latency.all_gather * us,
                latency.reduce_scatter * us,
            );
            // A pair of SP collectives (all-gather + reduce-scatter) replaces an all-reduce.
            let pair = if sp { ag + rs } else { ar };
            let single = if sp { (ag + rs) / 2.0 } else { ar };
            costs.tp_latency_ms.extend(
                tp_pairs
                    .iter()
                    .map(|&(pairs, singles)| pairs * pair + singles * single),
            );
            costs.p2p_latency_ms[kind.index()] = latency.p2p * us;
        }
        costs.price_ops(&shape, config, training, calibration, tables);
        costs.context = context_exchange(&shape, config, training, tables, calibration);
        if slow_softmax {
            costs.notes.push(format!(
                "unfused attention at micro-batch {} with {} heads per GPU: Megatron's fused \
                 softmax needs a multiple of 4 score matrices per GPU and at most 4096 keys, so \
                 PyTorch's fp32 softmax is costed",
                config.micro_batch,
                model.num_attention_heads / config.tp.max(1)
            ));
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
        shape: &OpShape<'_>,
        config: &ParallelConfig,
        training: &TrainingSettings,
        calibration: &Calibration,
        tables: &PerfTables,
    ) {
        let chunks = config.vpp.unwrap_or(1).max(1);
        let model = shape.model;
        let expert_shape = ExpertShape {
            moe: model.moe.as_ref(),
            mla: model.mla.as_ref(),
            ep: config.ep,
            etp: config.etp,
            cp: config.cp,
            modules: &training.recompute_modules,
            selective: config.recompute == Recompute::Selective,
        };
        let beyond_dense = model.moe.is_some() || model.mla.is_some() || model.mtp_layers > 0;
        // Layers kept in BF16 under FP8 or FP4: their GEMMs at 16 bits (an MoE layer's
        // expert GEMMs are left at the low-precision rate: not modelled).
        let low = training
            .low_precision
            .as_ref()
            .filter(|_| shape.low_precision.is_some());
        let keeps_bf16_layers =
            low.is_some_and(|l| l.bf16_layers_at_start + l.bf16_layers_at_end > 0);
        let starts = crate::model::parallel::stage_starts(&self.layers);
        for kind in GpuKind::ALL {
            let table = tables.get(kind);
            let mut kind_ops = KindOps::new(shape, table, calibration);
            if keeps_bf16_layers {
                kind_ops = kind_ops.with_bf16_layers(shape, table, calibration);
            }
            let expert_ops = beyond_dense
                .then(|| ExpertKindOps::new(shape, &expert_shape, table, calibration, &kind_ops));
            for (s, &start) in starts.iter().enumerate() {
                let layers = self.layers[s];
                let recomputed_layers = match &config.recompute {
                    Recompute::Full { method, num_layers } => match method {
                        RecomputeMethod::Uniform => layers,
                        RecomputeMethod::Block => num_layers.saturating_mul(chunks).min(layers),
                    },
                    _ => 0,
                };
                let stage_shape = StageShape {
                    layers,
                    first: s == 0,
                    last: s + 1 == self.pp,
                    recomputed_layers,
                    selective: config.recompute == Recompute::Selective,
                    bf16_layers: low
                        .map_or(0, |l| l.bf16_layers_in(start, layers, model.num_layers)),
                };
                let mut stage = kind_ops.stage(&stage_shape);
                let moe_layers = self.expert.as_ref().map_or(0, |x| x.moe_layers[s]);
                if let Some(extra) = &expert_ops {
                    stage = extra.stage(stage, layers, moe_layers, s + 1 == self.pp, self.has_mla);
                }
                self.tp_overlap_ops
                    .push(kind_ops.tp_overlap_gemms(&stage_shape, moe_layers));
                self.ops.push(stage);
                self.slot_ops.push(stage.slot());
            }
            if let Some(extra) = expert_ops {
                self.expert_ops.push(extra);
            }
            if let Some(source) = &table.measured {
                self.measured[kind.index()] =
                    Some((source.clone(), kind_ops.interpolated, kind_ops.extrapolated));
            } else if kind == GpuKind::A100 && kind_ops.extrapolated {
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

    /// Tensor-parallel size.
    pub fn tp(&self) -> usize {
        self.tp
    }

    /// Context-parallel size (the groups [`Self::tp`] counts are tp × cp ranks).
    pub fn cp(&self) -> usize {
        self.cp
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
}

/// Bytes each rank sends in a data-parallel ring of `ranks` for `params` parameters (their
/// gradients `grad_bytes`): the gradient reduce and, with the distributed optimizer, the
/// parameter all-gather (`param_bytes` per parameter: [`gathered_param_bytes`]); (0, 0)
/// without a second rank. Serves the dense data-parallel group and the experts'
/// expert-data-parallel one.
pub(super) fn ring_sync_bytes(
    ranks: usize,
    params: f64,
    grad_bytes: f64,
    param_bytes: f64,
    distributed_optimizer: bool,
) -> (f64, f64) {
    if ranks < 2 {
        return (0.0, 0.0);
    }
    let d = ranks as f64;
    let ring = (d - 1.0) / d;
    if distributed_optimizer {
        (ring * grad_bytes, ring * params * param_bytes)
    } else {
        (2.0 * ring * grad_bytes, 0.0)
    }
}

/// Bytes per parameter the distributed optimizer all-gathers for stage `s`, whose GPUs
/// hold `stage_params` parameters besides the routed experts. With `--fp8-param-gather`
/// (`--fp4-param-gather`) the transformer layers' weights are kept in the low precision
/// and gathered so (Megatron's help: "perform the param all-gather in fp8"), one byte each
/// in FP8; the embedding, the output layer and the layers kept in BF16 gather at
/// `act_bytes`. The layers' norms, a few thousand parameters beside millions, count
/// with their linear layers.
pub(super) fn gathered_param_bytes(
    training: &TrainingSettings,
    params: &ParameterBreakdown,
    config: &ParallelConfig,
    s: usize,
    stage_params: f64,
    act_bytes: f64,
) -> f64 {
    let Some(low) = training.low_precision.as_ref().filter(|l| l.param_gather) else {
        return act_bytes;
    };
    if stage_params <= 0.0 {
        return act_bytes;
    }
    let start = stage_start(config, s);
    let layers = config.layers_per_stage[s];
    let total = params.num_layers;
    let low_params: f64 = (start..start + layers)
        .filter(|&i| low.bf16_layers_in(i, 1, total) == 0)
        .map(|i| (params.layer_total(i) - params.experts_in(i, 1)) as f64)
        .sum::<f64>()
        / config.tp.max(1) as f64;
    let low_params = low_params.min(stage_params);
    (low_params * gathered_bytes(low.bits) + (stage_params - low_params) * act_bytes) / stage_params
}

/// The bytes per parameter the expert-data-parallel group all-gathers: the routed
/// experts' weights are transformer-layer weights, gathered in the low precision with
/// `--fp8-param-gather` ([`gathered_param_bytes`]).
pub(super) fn gathered_expert_bytes(training: &TrainingSettings, act_bytes: f64) -> f64 {
    match training.low_precision.as_ref().filter(|l| l.param_gather) {
        Some(low) => gathered_bytes(low.bits),
        None => act_bytes,
    }
}

/// Bytes one GPU moves through HBM in the optimizer step for `params` parameters (its
/// share of the stage's tp slice), Megatron's mixed-precision Adam: the fused Adam update
/// reads the fp32 main parameter, its gradient and both moments and writes the parameter
/// and the moments back (7 × 4 bytes); the gradient norm for clipping reads the gradients
/// (4); fp16 unscales the gradients and checks them for overflow (read and write, 8);
/// mixed precision copies the updated main parameters into the model's (4 + 2). With the
/// distributed optimizer all of that runs on the GPU's 1/dp shard (`shards`); every GPU
/// still zeroes its whole gradient buffer for the next iteration (`grad_element` bytes a
/// parameter). The multi-tensor kernels that do it are few and long, so their launch
/// costs are left out.
pub(super) fn optimizer_bytes(
    params: f64,
    precision: Precision,
    grad_element: f64,
    shards: f64,
) -> f64 {
    let per_param = match precision {
        Precision::Fp16 => 28.0 + 4.0 + 8.0 + 6.0,
        Precision::Bf16 => 28.0 + 4.0 + 6.0,
        Precision::Fp32 => 28.0 + 4.0,
    };
    params * per_param / shards + params * grad_element
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
