//! What `pipette estimate` shows: one configuration's parameters, memory per stage and
//! iteration time, each term visible.

use comfy_table::{presets::NOTHING, CellAlignment, Table};
use serde::Serialize;

use crate::model::memory::MemoryEstimate;
use crate::model::time::{TimeEstimate, TimeModel};
use crate::model::ParallelConfig;

use super::thousands;

const GIB: f64 = (1u64 << 30) as f64;

#[derive(Debug, Clone, Serialize)]
pub struct EstimateReport {
    pub config: ParallelConfig,
    pub params: ParamsSection,
    pub memory: MemoryEstimate,
    /// The GPU memory the peak must fit in, when a cluster was given.
    pub gpu_memory_bytes: Option<u64>,
    /// The chosen time model's full report; `null` without a cluster.
    pub time: Option<TimeEstimate>,
    /// Every time model's iteration time, for comparison.
    pub time_models: Vec<ModelTime>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ParamsSection {
    /// The whole model, each parameter once.
    pub total: u64,
    /// Each pipeline stage, over its tensor-parallel ranks together.
    pub per_stage: Vec<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelTime {
    pub model: TimeModel,
    pub iteration_ms: f64,
}

impl EstimateReport {
    pub fn to_human(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "tp {} × pp {} × dp {}{} = {} GPUs, micro-batch {}{}{}{}{}\n",
            c.tp,
            c.pp,
            c.dp,
            super::plan::context_text(c),
            c.world_size(),
            c.micro_batch,
            c.vpp
                .map(|v| format!(", {v} virtual stages"))
                .unwrap_or_default(),
            match c.recompute {
                crate::config::Recompute::None => "",
                crate::config::Recompute::Selective => ", selective recompute",
                crate::config::Recompute::Full { .. } => ", full recompute",
            },
            if c.sequence_parallel {
                ", sequence parallel"
            } else {
                ""
            },
            if c.distributed_optimizer {
                ", distributed optimizer"
            } else {
                ""
            },
        );
        out.push_str(&format!(
            "parameters: {} in all\n\nMemory per GPU (GiB)\n",
            thousands(self.params.total)
        ));
        let mut table = Table::new();
        table.load_preset(NOTHING);
        table.set_header(vec![
            "stage",
            "layers",
            "params/GPU",
            "weights+optim",
            "activations",
            "in flight",
            "overhead",
            "total",
        ]);
        for s in &self.memory.stages {
            table.add_row(vec![
                s.stage.to_string(),
                s.layers.to_string(),
                thousands(s.params),
                gib(s.weights_and_optimizer_bytes),
                gib(s.activation_bytes),
                s.in_flight_microbatches.to_string(),
                gib(s.overhead_bytes),
                gib(s.total_bytes),
            ]);
        }
        for i in 0..8 {
            if let Some(col) = table.column_mut(i) {
                col.set_cell_alignment(CellAlignment::Right);
            }
        }
        for line in table.lines() {
            out.push(' ');
            out.push_str(line.trim_end());
            out.push('\n');
        }
        let fits = match self.gpu_memory_bytes {
            Some(gpu) if self.memory.peak_bytes > gpu => {
                format!(" — does NOT fit in {} GiB", gib(gpu))
            }
            Some(gpu) => format!(" — fits in {} GiB", gib(gpu)),
            None => String::new(),
        };
        out.push_str(&format!(
            "  peak {} GiB on stage {}{fits}\n",
            gib(self.memory.peak_bytes),
            self.memory.peak_stage
        ));
        match &self.time {
            None => out.push_str("\nIteration time: give --cluster FILE to estimate it\n"),
            Some(t) => {
                out.push_str(&format!(
                    "\nIteration time ({}): {}, {}\n",
                    t.model,
                    with_stated_error(t.iteration_ms, t.model),
                    super::micro_batches(t.microbatches)
                ));
                if t.model.stated_error().is_some() {
                    out.push_str(
                        "  ± the model's median error on 109 measured multi-node A100 runs\n",
                    );
                }
                for (name, ms) in [
                    ("steady state (m × slowest stage)", t.steady_ms),
                    ("pipeline fill and drain", t.bubble_ms),
                    ("pipeline sends on the critical path", t.pipeline_p2p_ms),
                    (
                        "data-parallel gradient reduce (exposed)",
                        t.data_parallel_exposed_ms,
                    ),
                    ("parameter all-gather (exposed)", t.param_gather_exposed_ms),
                    ("optimizer step", t.optimizer_ms),
                    ("hidden by overlap", t.overlap_credited_ms),
                ] {
                    out.push_str(&format!("  {name:<42}{ms:>10.1} ms\n"));
                }
                out.push_str(&format!("  critical stage {}\n", t.critical_stage));
                if self.time_models.len() > 1 {
                    let others: Vec<String> = self
                        .time_models
                        .iter()
                        .map(|m| format!("{} {:.1} ms", m.model, m.iteration_ms))
                        .collect();
                    out.push_str(&format!("  by model: {}\n", others.join(", ")));
                }
            }
        }
        out
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / GIB)
}

/// `412.0 ms ± 4.3 %`: an estimate with its model's stated error
/// ([`TimeModel::stated_error`]); just `412.0 ms` for a model without one.
pub fn with_stated_error(ms: f64, model: TimeModel) -> String {
    match model.stated_error() {
        Some(error) => format!("{ms:.1} ms ± {:.1} %", 100.0 * error),
        None => format!("{ms:.1} ms"),
    }
}
