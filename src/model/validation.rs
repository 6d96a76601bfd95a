//! The time model checked against measured training runs: vTrain's ground truth (Bang et
//! al., arXiv 2312.12391; `data/vtrain`), 1,549 Megatron-DeepSpeed GPT runs on
//! A100 nodes.
//!
//! Owns: reading those CSV files (from text; the caller reads the file), turning each run
//! into the planner's inputs under stated [`RunAssumptions`], costing every run with a
//! [`TimeModel`] and a [`Calibration`], fitting what the model lets us fit on one set of
//! runs ([`fit_calibration`]), and scoring predictions: the error of every run, Kendall's
//! tau and the regret of the model's pick within each sweep (one model on one GPU count),
//! and the micro-batch pairs whose faster member the model names. Used by
//! `examples/validate_time_model.rs` (the report) and `tests/time_model/time_model_vtrain.rs` (the
//! bounds CI holds the model to). Must not change the time model itself.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cluster::ClusterProfile;
use crate::config::{settings_from_megatron_args, ModelSpec, Precision, TrainingSettings};
use crate::model::calibration::Calibration;
use crate::model::memory::AttentionKernel;
use crate::model::parallel::{ParallelConfig, Placement};
use crate::model::time::{estimate, TimeModel, TimeOptions, TimeRequest};

/// One measured run: a row of `ground_truth_{single,multi}.csv`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MeasuredRun {
    /// The line of the file (1 is the header).
    pub line: usize,
    /// The model's size in billions as the multi-node file names it (absent in the
    /// single-node file).
    pub params_billion: Option<f64>,
    pub gpus: u64,
    pub global_batch: u64,
    pub micro_batch: u64,
    pub hidden: u64,
    pub heads: u64,
    pub layers: u64,
    pub seq_length: u64,
    pub tp: u64,
    pub dp: u64,
    pub pp: u64,
    pub measured_ms: f64,
}

impl MeasuredRun {
    /// The model, as the report names it: the file's size when it has one, else its shape.
    pub fn model_label(&self) -> String {
        match self.params_billion {
            Some(b) => format!("{b}B"),
            None => format!("h{} L{} s{}", self.hidden, self.layers, self.seq_length),
        }
    }

    /// Runs of one sweep train the same model with the same batch on the same GPU count.
    fn sweep_key(&self) -> (u64, u64, u64, u64, u64, u64) {
        (
            self.hidden,
            self.heads,
            self.layers,
            self.seq_length,
            self.global_batch,
            self.gpus,
        )
    }
}

/// The columns of vTrain's files, by the names its header gives them.
const COLUMNS: [&str; 11] = [
    "# GPUs",
    "global batch",
    "micro batch",
    "hidden size",
    "attention heads",
    "# layers",
    "sequence length",
    "tensor parallelism",
    "data parallelism",
    "pipeline parallelism",
    "iteration time (ms)",
];
const PARAMS_COLUMN: &str = "Parameters (billion)";

/// Reads one of vTrain's CSV files (a UTF-8 byte-order mark is allowed). `origin` names the
/// file in messages. Every row must have every column as a number, and tp × dp × pp must be
/// the GPU count.
pub fn parse_runs(text: &str, origin: &str) -> Result<Vec<MeasuredRun>, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.lines().enumerate();
    let Some((_, header)) = lines.next() else {
        return Err(format!(
            "{origin}: the file is empty (want vTrain's CSV header)"
        ));
    };
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    let find = |name: &str| names.iter().position(|n| *n == name);
    let mut at = [0usize; COLUMNS.len()];
    for (slot, name) in at.iter_mut().zip(COLUMNS) {
        *slot = find(name)
            .ok_or_else(|| format!("{origin}:1: no column {name:?} (is this vTrain's file?)"))?;
    }
    let params_at = find(PARAMS_COLUMN);
    let mut runs = Vec::new();
    for (index, line) in lines {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let cell = |column: usize, name: &str| -> Result<&str, String> {
            cells
                .get(column)
                .copied()
                .ok_or_else(|| format!("{origin}:{number}: no value for {name:?}"))
        };
        let mut whole = [0u64; COLUMNS.len() - 1];
        for (k, value) in whole.iter_mut().enumerate() {
            let text = cell(at[k], COLUMNS[k])?;
            *value = text.parse().ok().filter(|v| *v > 0).ok_or_else(|| {
                format!(
                    "{origin}:{number}: {:?} is {text:?} (want a positive whole number)",
                    COLUMNS[k]
                )
            })?;
        }
        let time_name = COLUMNS[COLUMNS.len() - 1];
        let time_text = cell(at[COLUMNS.len() - 1], time_name)?;
        let measured_ms = positive(time_text).ok_or_else(|| {
            format!("{origin}:{number}: {time_name:?} is {time_text:?} (want milliseconds > 0)")
        })?;
        let params_billion = match params_at {
            Some(column) => {
                let text = cell(column, PARAMS_COLUMN)?;
                Some(positive(text).ok_or_else(|| {
                    format!("{origin}:{number}: {PARAMS_COLUMN:?} is {text:?} (want a number > 0)")
                })?)
            }
            None => None,
        };
        let [gpus, global_batch, micro_batch, hidden, heads, layers, seq_length, tp, dp, pp] =
            whole;
        if tp * dp * pp != gpus {
            return Err(format!(
                "{origin}:{number}: tp {tp} × dp {dp} × pp {pp} is not the {gpus} GPUs of the run"
            ));
        }
        runs.push(MeasuredRun {
            line: number,
            params_billion,
            gpus,
            global_batch,
            micro_batch,
            hidden,
            heads,
            layers,
            seq_length,
            tp,
            dp,
            pp,
            measured_ms,
        });
    }
    Ok(runs)
}

fn positive(text: &str) -> Option<f64> {
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
}

/// What vTrain's files do not say about a run, and what we take it to be. The defaults are
/// vTrain's own (VIA-Research/vTrain f8dda84, MIT licence): its GPT model has GPT-2's
/// vocabulary of 50,257 tokens (`src/config.py`, `src/model/gpt_model.py`), runs in fp16
/// (`.half()` in `gpt_model.py`; fused Adam, as Megatron-DeepSpeed's mixed precision), and
/// every one of its 1,548 validation configurations sets `use_checkpoint: true`
/// (activation checkpointing of every layer: Megatron's full, uniform recomputation of one
/// layer at a time) and `use_gradient_bucket: false` (no gradient reduce overlapped with
/// the backward pass: [`TimeOptions::default`]). The model is GPT-3's: LayerNorm, biases,
/// learned positions, GeLU, ffn 4h, tied embeddings (Megatron's defaults). Its attention is
/// the unfused path (`src/model/gpt_modeling.py`: `torch.baddbmm` for the scores,
/// `FusedScaleMaskSoftmax`, `torch.nn.Dropout` on the probabilities, `torch.bmm` for the
/// context), as Megatron-DeepSpeed's without `--use-flash-attn`, with which the runs were
/// measured (`data/README.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunAssumptions {
    pub vocab_size: u64,
    /// `--fp16` or `--bf16`.
    pub precision: Precision,
    /// Full recomputation of every layer (`use_checkpoint`).
    pub full_recompute: bool,
    /// How the runs computed attention.
    pub attention: AttentionKernel,
}

impl Default for RunAssumptions {
    fn default() -> Self {
        RunAssumptions {
            vocab_size: 50257,
            precision: Precision::Fp16,
            full_recompute: true,
            attention: AttentionKernel::Unfused,
        }
    }
}

impl RunAssumptions {
    /// The Megatron arguments that describe `run` under these assumptions.
    pub fn megatron_args(&self, run: &MeasuredRun) -> Vec<String> {
        let mut args: Vec<String> = [
            ("--num-layers", run.layers),
            ("--hidden-size", run.hidden),
            ("--num-attention-heads", run.heads),
            ("--seq-length", run.seq_length),
            ("--max-position-embeddings", run.seq_length),
            ("--vocab-size", self.vocab_size),
            ("--micro-batch-size", run.micro_batch),
            ("--global-batch-size", run.global_batch),
            ("--tensor-model-parallel-size", run.tp),
            ("--pipeline-model-parallel-size", run.pp),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_string(), value.to_string()])
        .collect();
        args.push(
            match self.precision {
                Precision::Fp16 => "--fp16",
                Precision::Bf16 => "--bf16",
                Precision::Fp32 => "--fp32",
            }
            .to_string(),
        );
        if self.full_recompute {
            args.extend(
                [
                    "--recompute-granularity",
                    "full",
                    "--recompute-method",
                    "uniform",
                    "--recompute-num-layers",
                    "1",
                ]
                .map(str::to_string),
            );
        }
        args
    }
}

/// One run turned into the time model's inputs.
#[derive(Debug, Clone)]
pub struct PreparedRun {
    pub run: MeasuredRun,
    pub model: ModelSpec,
    pub training: TrainingSettings,
    pub config: ParallelConfig,
    /// torchrun's default placement: ranks fill the cluster's nodes in order.
    pub placement: Placement,
    /// The time options the run's Megatron arguments and the assumptions give.
    pub options: TimeOptions,
}

/// Turns every run into the planner's inputs: the settings its Megatron arguments give, its
/// tp/pp/dp and micro-batch with the layers split evenly, placed in rank order on nodes of
/// `gpus_per_node` GPUs.
pub fn prepare(
    runs: &[MeasuredRun],
    assumptions: &RunAssumptions,
    gpus_per_node: usize,
) -> Result<Vec<PreparedRun>, String> {
    runs.iter()
        .map(|run| {
            let settings = settings_from_megatron_args(&assumptions.megatron_args(run), None, &[])
                .map_err(|e| format!("line {}: {e}", run.line))?;
            if run.layers % run.pp != 0 {
                return Err(format!(
                    "line {}: {} layers do not split evenly over pp {}",
                    run.line, run.layers, run.pp
                ));
            }
            let mut config =
                ParallelConfig::even(run.layers, run.tp, run.pp, run.dp, run.micro_batch);
            config.recompute = settings.training.recompute.clone();
            let options = TimeOptions {
                attention: assumptions.attention,
                ..TimeOptions::from_training(&settings.training)
            };
            Ok(PreparedRun {
                options,
                placement: Placement::identity(run.gpus as usize, gpus_per_node),
                run: run.clone(),
                model: settings.model,
                training: settings.training,
                config,
            })
        })
        .collect()
}

/// What the model predicts for one run, beside what was measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    pub run: MeasuredRun,
    pub predicted_ms: f64,
    /// `predicted / measured − 1`: positive when the model is slow.
    pub error: f64,
    /// Where the predicted time goes.
    pub terms: PredictedTerms,
}

/// The terms of one prediction ([`crate::model::time::TimeEstimate`]'s, in ms), to see which
/// one a bad prediction gets wrong.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PredictedTerms {
    /// Compute of all micro-batch slots and the bubble on the critical stage.
    pub compute_ms: f64,
    /// Exposed tensor-parallel collectives of the same slots.
    pub tp_comm_ms: f64,
    pub pipeline_p2p_ms: f64,
    /// Exposed data-parallel gradient reduce and parameter gather.
    pub data_parallel_ms: f64,
    /// The optimizer step.
    pub optimizer_ms: f64,
}

/// Costs every run with `time_model` on `cluster` under `calibration`.
pub fn predict(
    runs: &[PreparedRun],
    cluster: &ClusterProfile,
    calibration: &Calibration,
    time_model: TimeModel,
) -> Result<Vec<Prediction>, String> {
    runs.iter()
        .map(|p| {
            let estimate = estimate(
                &TimeRequest {
                    model: &p.model,
                    training: &p.training,
                    config: &p.config,
                    cluster,
                    placement: &p.placement,
                    calibration,
                    options: p.options,
                },
                time_model,
            )
            .map_err(|e| format!("line {}: {e}", p.run.line))?;
            let critical = &estimate.stages[estimate.critical_stage];
            let tp_comm_ms = if critical.slot_ms > 0.0 {
                (estimate.steady_ms + estimate.bubble_ms) * critical.tp_comm_ms / critical.slot_ms
            } else {
                0.0
            };
            Ok(Prediction {
                run: p.run.clone(),
                predicted_ms: estimate.iteration_ms,
                error: estimate.iteration_ms / p.run.measured_ms - 1.0,
                terms: PredictedTerms {
                    compute_ms: estimate.steady_ms + estimate.bubble_ms - tp_comm_ms,
                    tp_comm_ms,
                    pipeline_p2p_ms: estimate.pipeline_p2p_ms,
                    data_parallel_ms: estimate.data_parallel_exposed_ms
                        + estimate.param_gather_exposed_ms,
                    optimizer_ms: estimate.optimizer_ms,
                },
            })
        })
        .collect()
}

/// What [`fit_calibration`] changed, for the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fit {
    pub calibration: Calibration,
    /// Each fitted field and its value.
    pub fitted: Vec<(String, f64)>,
    /// Runs the fit saw.
    pub runs: usize,
    /// Root mean square of `ln(predicted / measured)` over those runs after the fit.
    pub rms_log_error: f64,
}

/// The fit hook: the calibration that makes the model best match `runs`, starting from
/// `base`, by least squares on `ln(predicted / measured)`. For the Pipette model: the scales
/// on its shipped tables' fixed costs (`kernel_cost_scale`, `collective_latency_scale`; the
/// GEMM efficiencies stay as measured, see below), by coordinate descent, a golden-section search over each one's logarithm in
/// [0.05, 100], four rounds; for the compatibility models `compute_efficiency` in
/// [0.05, 1].
pub fn fit_calibration(
    runs: &[PreparedRun],
    cluster: &ClusterProfile,
    base: &Calibration,
    time_model: TimeModel,
) -> Result<Fit, String> {
    // The Pipette model prices compute per operation from the shipped tables: what it
    // exposes for fitting is a scale on the fixed cost per memory-bound kernel and on the
    // collective latencies. Not `gemm_scale`: the tables' GEMM efficiencies are measured
    // per shape, and the one-node runs this is fitted on (hidden 1024 and 2048, sequence
    // 1024) hold no GEMM of the shapes that dominate large models, so a scale fitted there
    // is the small shapes' fixed costs in disguise and biases every large run (on vTrain's
    // multi-node runs it made the median error 19.3 % instead of 10.0 %). The
    // compatibility models read `compute_efficiency`.
    let fields: &[&str] = if time_model == TimeModel::Pipette {
        // The host floor first: it explains what the fixed costs would otherwise absorb.
        &[
            "host_layer_pass_ms",
            "kernel_cost_scale",
            "collective_latency_scale",
        ]
    } else {
        &["compute_efficiency"]
    };
    let set = |c: &mut Calibration, field: &str, value: f64| match field {
        "kernel_cost_scale" => c.kernel_cost_scale = value,
        "collective_latency_scale" => c.collective_latency_scale = value,
        "host_layer_pass_ms" => c.host_layer_pass_ms = value,
        _ => c.compute_efficiency = value,
    };
    let get = |c: &Calibration, field: &str| match field {
        "kernel_cost_scale" => c.kernel_cost_scale,
        "collective_latency_scale" => c.collective_latency_scale,
        "host_layer_pass_ms" => c.host_layer_pass_ms,
        _ => c.compute_efficiency,
    };
    let mut fitted = base.clone();
    let mut fitted_cost = rms_log_error(&predict(runs, cluster, &fitted, time_model)?);
    // Coordinate descent: a golden-section search over each field's logarithm in turn,
    // a few rounds (the scales interact: fixed costs against GEMM rate); a step is kept only
    // when it lowers the error, so the fit never ends worse than where it started.
    let rounds = if fields.len() > 1 { 4 } else { 1 };
    for _ in 0..rounds {
        for &field in fields {
            let (low, high) = match field {
                "compute_efficiency" => (0.05, 1.0),
                // Milliseconds: from a few launches to a slow interpreter's layer.
                "host_layer_pass_ms" => (0.005, 5.0),
                _ => (0.05, 100.0),
            };
            let cost = |value: f64| -> Result<f64, String> {
                let mut calibration = fitted.clone();
                set(&mut calibration, field, value);
                let predictions = predict(runs, cluster, &calibration, time_model)?;
                Ok(rms_log_error(&predictions))
            };
            let best = golden_section(cost, low, high, 30)?;
            let best_cost = cost(best)?;
            if best_cost < fitted_cost {
                set(&mut fitted, field, best);
                fitted_cost = best_cost;
            }
        }
    }
    Ok(Fit {
        fitted: fields
            .iter()
            .map(|&f| (f.to_string(), get(&fitted, f)))
            .collect(),
        calibration: fitted,
        runs: runs.len(),
        rms_log_error: fitted_cost,
    })
}

/// The minimum of `cost` over `[low, high]`, searched over the logarithm by golden section
/// (`steps` steps narrow the bracket by 0.618^steps of its width).
fn golden_section(
    cost: impl Fn(f64) -> Result<f64, String>,
    low: f64,
    high: f64,
    steps: usize,
) -> Result<f64, String> {
    let (mut low, mut high) = (low.ln(), high.ln());
    let ratio = (5f64.sqrt() - 1.0) / 2.0;
    let mut a = high - ratio * (high - low);
    let mut b = low + ratio * (high - low);
    let (mut cost_a, mut cost_b) = (cost(a.exp())?, cost(b.exp())?);
    for _ in 0..steps {
        if cost_a <= cost_b {
            high = b;
            b = a;
            cost_b = cost_a;
            a = high - ratio * (high - low);
            cost_a = cost(a.exp())?;
        } else {
            low = a;
            a = b;
            cost_a = cost_b;
            b = low + ratio * (high - low);
            cost_b = cost(b.exp())?;
        }
    }
    Ok(((low + high) / 2.0).exp())
}

/// Root mean square of `ln(predicted / measured)`: the quantity [`fit_calibration`]
/// minimises (0 for no predictions).
pub fn rms_log_error(predictions: &[Prediction]) -> f64 {
    if predictions.is_empty() {
        return 0.0;
    }
    let sum: f64 = predictions
        .iter()
        .map(|p| (p.predicted_ms / p.run.measured_ms).ln().powi(2))
        .sum();
    (sum / predictions.len() as f64).sqrt()
}

/// Kendall's tau-b between two equally long lists: 1 when they rank every pair alike, −1
/// when they rank every pair oppositely; ties count for neither. `None` with fewer than two
/// items or when one list is all ties.
pub fn kendall_tau(xs: &[f64], ys: &[f64]) -> Option<f64> {
    let n = xs.len().min(ys.len());
    let (mut concordant, mut discordant, mut tied_x, mut tied_y) = (0i64, 0i64, 0i64, 0i64);
    for i in 0..n {
        for j in i + 1..n {
            let dx = xs[i].partial_cmp(&xs[j])?;
            let dy = ys[i].partial_cmp(&ys[j])?;
            use std::cmp::Ordering::Equal;
            match (dx, dy) {
                (Equal, Equal) => {}
                (Equal, _) => tied_x += 1,
                (_, Equal) => tied_y += 1,
                _ if dx == dy => concordant += 1,
                _ => discordant += 1,
            }
        }
    }
    let denominator =
        (((concordant + discordant + tied_x) * (concordant + discordant + tied_y)) as f64).sqrt();
    (denominator > 0.0).then(|| (concordant - discordant) as f64 / denominator)
}

/// How much slower the configuration the model ranks fastest ran than the fastest one
/// measured: `measured(pick) / min(measured) − 1` (0 when the model picks the best). `None`
/// for an empty list. Ties in the prediction go to the first.
pub fn pick_regret(predicted: &[f64], measured: &[f64]) -> Option<f64> {
    let pick = predicted
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.total_cmp(b.1))?
        .0;
    let best = measured.iter().copied().min_by(f64::total_cmp)?;
    Some(measured[pick] / best - 1.0)
}

/// One sweep: one model with one batch on one GPU count, several configurations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepScore {
    pub model: String,
    pub gpus: u64,
    pub global_batch: u64,
    pub runs: usize,
    /// Kendall's tau-b between predicted and measured times (`None` below two runs).
    pub kendall_tau: Option<f64>,
    /// See [`pick_regret`].
    pub pick_regret: f64,
    /// The model's pick and the measured best, as `tp/pp/dp/mb`.
    pub pick: String,
    pub best: String,
}

fn shape(run: &MeasuredRun) -> String {
    format!(
        "tp{} pp{} dp{} mb{}",
        run.tp, run.pp, run.dp, run.micro_batch
    )
}

/// Scores every sweep of `predictions` (groups of runs with the same model, batch and GPU
/// count), in the order of that key.
pub fn sweeps(predictions: &[Prediction]) -> Vec<SweepScore> {
    let mut groups: BTreeMap<_, Vec<&Prediction>> = BTreeMap::new();
    for p in predictions {
        groups.entry(p.run.sweep_key()).or_default().push(p);
    }
    groups
        .into_values()
        .map(|group| {
            let predicted: Vec<f64> = group.iter().map(|p| p.predicted_ms).collect();
            let measured: Vec<f64> = group.iter().map(|p| p.run.measured_ms).collect();
            let at_min = |values: &[f64]| {
                values
                    .iter()
                    .enumerate()
                    .min_by(|a, b| a.1.total_cmp(b.1))
                    .map_or(0, |(i, _)| i)
            };
            SweepScore {
                model: group[0].run.model_label(),
                gpus: group[0].run.gpus,
                global_batch: group[0].run.global_batch,
                runs: group.len(),
                kendall_tau: kendall_tau(&predicted, &measured),
                pick_regret: pick_regret(&predicted, &measured).unwrap_or(0.0),
                pick: shape(&group[at_min(&predicted)].run),
                best: shape(&group[at_min(&measured)].run),
            }
        })
        .collect()
}

/// Pairs of runs that differ only in the micro-batch (same model, batch, GPUs, tp and pp):
/// how many there are, in how many the model names the faster member, and in how many it
/// predicts the same time for both (within one part in 10^9; counted as not named).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MicroBatchPairs {
    pub pairs: usize,
    pub named: usize,
    pub tied: usize,
}

/// Every pair of runs in `predictions` at fixed (model, batch, GPUs, tp, pp) with different
/// micro-batches; a pair whose measured times are equal is left out.
pub fn micro_batch_pairs(predictions: &[Prediction]) -> MicroBatchPairs {
    let mut groups: BTreeMap<_, Vec<&Prediction>> = BTreeMap::new();
    for p in predictions {
        groups
            .entry((p.run.sweep_key(), p.run.tp, p.run.pp))
            .or_default()
            .push(p);
    }
    let mut counts = MicroBatchPairs {
        pairs: 0,
        named: 0,
        tied: 0,
    };
    for group in groups.values() {
        for (i, a) in group.iter().enumerate() {
            for b in &group[i + 1..] {
                if a.run.micro_batch == b.run.micro_batch || a.run.measured_ms == b.run.measured_ms
                {
                    continue;
                }
                counts.pairs += 1;
                let gap = (a.predicted_ms - b.predicted_ms).abs();
                if gap <= 1e-9 * a.predicted_ms.abs().max(b.predicted_ms.abs()) {
                    counts.tied += 1;
                } else if (a.run.measured_ms < b.run.measured_ms)
                    == (a.predicted_ms < b.predicted_ms)
                {
                    counts.named += 1;
                }
            }
        }
    }
    counts
}

/// Everything the harness reports about one set of predictions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Score {
    pub runs: usize,
    /// Median and largest `|predicted / measured − 1|`.
    pub median_abs_error: f64,
    pub max_abs_error: f64,
    /// Mean of `predicted / measured − 1` (the model's bias: positive when slow).
    pub mean_error: f64,
    pub sweeps: Vec<SweepScore>,
    /// The lowest and highest tau over the sweeps with at least two runs.
    pub tau_min: Option<f64>,
    pub tau_max: Option<f64>,
    /// The largest pick regret over the sweeps.
    pub worst_pick_regret: f64,
    pub micro_batch_pairs: MicroBatchPairs,
}

/// Scores `predictions` (see [`Score`]).
pub fn score(predictions: &[Prediction]) -> Score {
    let mut abs: Vec<f64> = predictions.iter().map(|p| p.error.abs()).collect();
    abs.sort_by(f64::total_cmp);
    let median = match abs.len() {
        0 => 0.0,
        n if n % 2 == 1 => abs[n / 2],
        n => (abs[n / 2 - 1] + abs[n / 2]) / 2.0,
    };
    let sweeps = sweeps(predictions);
    let taus = || sweeps.iter().filter_map(|s| s.kendall_tau);
    Score {
        runs: predictions.len(),
        median_abs_error: median,
        max_abs_error: abs.last().copied().unwrap_or(0.0),
        mean_error: if predictions.is_empty() {
            0.0
        } else {
            predictions.iter().map(|p| p.error).sum::<f64>() / predictions.len() as f64
        },
        tau_min: taus().min_by(f64::total_cmp),
        tau_max: taus().max_by(f64::total_cmp),
        worst_pick_regret: sweeps.iter().map(|s| s.pick_regret).fold(0.0, f64::max),
        micro_batch_pairs: micro_batch_pairs(predictions),
        sweeps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tau_is_one_for_the_same_order_and_minus_one_for_the_reverse() {
        let a = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(kendall_tau(&a, &[10.0, 20.0, 30.0, 40.0]), Some(1.0));
        assert_eq!(kendall_tau(&a, &[4.0, 3.0, 2.0, 1.0]), Some(-1.0));
        // One swapped pair of six: (5 − 1) / 6.
        let tau = kendall_tau(&a, &[1.0, 3.0, 2.0, 4.0]).unwrap();
        assert!((tau - 4.0 / 6.0).abs() < 1e-12, "{tau}");
        assert_eq!(kendall_tau(&[1.0], &[1.0]), None);
        assert_eq!(kendall_tau(&[1.0, 1.0], &[1.0, 2.0]), None);
    }

    #[test]
    fn regret_is_how_much_slower_the_pick_ran() {
        // The model picks the second (predicted 1.0), which ran 110 against a best of 100.
        let r = pick_regret(&[2.0, 1.0, 3.0], &[100.0, 110.0, 120.0]).unwrap();
        assert!((r - 0.10).abs() < 1e-12, "{r}");
        assert_eq!(pick_regret(&[1.0, 2.0], &[5.0, 6.0]), Some(0.0));
        assert_eq!(pick_regret(&[], &[]), None);
    }

    fn run(line: usize, micro_batch: u64, tp: u64, measured_ms: f64) -> MeasuredRun {
        MeasuredRun {
            line,
            params_billion: Some(1.0),
            gpus: 16,
            global_batch: 64,
            micro_batch,
            hidden: 1024,
            heads: 16,
            layers: 8,
            seq_length: 1024,
            tp,
            dp: 16 / tp,
            pp: 1,
            measured_ms,
        }
    }

    fn predicted(run: MeasuredRun, predicted_ms: f64) -> Prediction {
        Prediction {
            error: predicted_ms / run.measured_ms - 1.0,
            run,
            predicted_ms,
            terms: PredictedTerms::default(),
        }
    }

    #[test]
    fn pairs_count_only_micro_batches_at_fixed_tp_and_pp() {
        let p = [
            predicted(run(2, 1, 1, 100.0), 90.0),
            predicted(run(3, 2, 1, 80.0), 85.0), // named: faster measured and predicted
            predicted(run(4, 4, 1, 70.0), 95.0), // named against mb 1 (70 < 100, 95 > 90): no
            predicted(run(5, 1, 2, 60.0), 10.0), // another tp: no pair with the others
        ];
        let pairs = micro_batch_pairs(&p);
        // (1,2) named, (1,4) not, (2,4) not.
        assert_eq!(
            pairs,
            MicroBatchPairs {
                pairs: 3,
                named: 1,
                tied: 0
            }
        );
        // Equal predictions name neither member.
        let tied = [
            predicted(run(2, 1, 1, 100.0), 90.0),
            predicted(run(3, 2, 1, 80.0), 90.0),
        ];
        assert_eq!(
            micro_batch_pairs(&tied),
            MicroBatchPairs {
                pairs: 1,
                named: 0,
                tied: 1
            }
        );
        let s = score(&p);
        assert_eq!(s.sweeps.len(), 1);
        assert_eq!(s.sweeps[0].pick, "tp2 pp1 dp8 mb1");
        assert_eq!(s.worst_pick_regret, 0.0);
    }

    #[test]
    fn reads_vtrains_header_with_its_byte_order_mark() {
        let text = "\u{feff}Parameters (billion),# GPUs,global batch,micro batch,hidden size,\
                    attention heads,# layers,sequence length,tensor parallelism,\
                    data parallelism,pipeline parallelism,iteration time (ms)\n\
                    3.6,64,512,8,3072,32,30,2048,1,64,1,3566.5\n";
        let runs = parse_runs(text, "multi.csv").unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].params_billion, Some(3.6));
        assert_eq!((runs[0].tp, runs[0].dp, runs[0].pp), (1, 64, 1));
        assert_eq!(runs[0].measured_ms, 3566.5);
        assert_eq!(runs[0].line, 2);
        let bad = text.replace(",1,64,1,", ",2,64,1,");
        let err = parse_runs(&bad, "multi.csv").unwrap_err();
        assert!(err.starts_with("multi.csv:2:"), "{err}");
        let err = parse_runs("a,b\n", "x.csv").unwrap_err();
        assert!(err.contains("\"# GPUs\""), "{err}");
    }
}
