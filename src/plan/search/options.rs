//! What the planner may choose and how hard it searches ([`PlanOptions`]), and the
//! defaults of its budgets.

use serde::Serialize;

use crate::model::calibration::Calibration;
use crate::model::time::{TimeModel, TimeOptions};
use crate::plan::space::SpaceOptions;
use crate::plan::subset::NodeBounds;

/// Memory kept free on every GPU beyond the estimate's peak.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryHeadroom {
    /// A share of the GPU's memory, in [0, 1).
    Fraction(f64),
    /// A number of bytes.
    Bytes(u64),
}

impl Default for MemoryHeadroom {
    /// 5 % of the GPU's memory: room for what the estimate cannot see (allocator
    /// fragmentation beyond its calibration, the dataloader's pinned buffers, a larger
    /// NCCL pool) without throwing away configurations that fit in practice.
    fn default() -> Self {
        MemoryHeadroom::Fraction(0.05)
    }
}

impl MemoryHeadroom {
    /// The bytes kept free on a GPU of `gpu_bytes`.
    pub fn bytes(self, gpu_bytes: u64) -> u64 {
        match self {
            MemoryHeadroom::Fraction(f) => (gpu_bytes as f64 * f.clamp(0.0, 1.0)) as u64,
            MemoryHeadroom::Bytes(b) => b,
        }
    }
}

/// How the rank mapping of each mapped configuration is searched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MappingMode {
    /// Exhaustive when every state fits in the limit, else annealing.
    #[default]
    Auto,
    Anneal,
    Exhaustive,
    /// torchrun's default order.
    Identity,
}

/// What the planner may choose and how hard it searches.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    /// Memory kept free on every GPU beyond the estimated peak (default 5 %).
    pub headroom: MemoryHeadroom,
    /// The model that ranks and maps: [`TimeModel::Pipette`] (default, evaluated
    /// incrementally) or [`TimeModel::PipetteCompat`] (Pipette's published formula,
    /// re-evaluated in full for every state: its default budget is at most
    /// [`COMPAT_BUDGET`], meant for clusters of a few dozen nodes).
    pub time_model: TimeModel,
    pub time_options: TimeOptions,
    pub calibration: Calibration,
    pub space: SpaceOptions,
    pub mapping: MappingMode,
    /// Evaluations per mapped configuration when annealing; `None`: [`default_budget`].
    pub budget: Option<u64>,
    /// The most states an exhaustive mapping search visits.
    pub exhaustive_limit: u64,
    pub seed: u64,
    /// How many of the best-ranked configurations get a mapping search.
    pub top_k: usize,
    /// A mapping must make the iteration at least this share faster than torchrun's node
    /// and GPU order to replace it (default [`DEFAULT_MAPPING_THRESHOLD`]); below it the
    /// job keeps the order a user expects (rank 0 on the first host) for a gain the model
    /// cannot tell from its error.
    pub mapping_threshold: f64,
    /// How many of the profile's nodes a plan may use: read by
    /// [`crate::plan::plan_subset`], not by [`super::plan`], which uses every node.
    pub nodes: NodeBounds,
    /// With experts, also find the best configuration of every other expert layout for the
    /// report's comparison ([`super::Plan::expert_layouts`]); off for the node-count
    /// search's quick plans, which no report shows.
    pub expert_layouts: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            headroom: MemoryHeadroom::default(),
            time_model: TimeModel::Pipette,
            time_options: TimeOptions::default(),
            calibration: Calibration::default(),
            space: SpaceOptions::default(),
            mapping: MappingMode::Auto,
            budget: None,
            exhaustive_limit: DEFAULT_EXHAUSTIVE_LIMIT,
            seed: 0,
            top_k: DEFAULT_TOP_K,
            mapping_threshold: DEFAULT_MAPPING_THRESHOLD,
            nodes: NodeBounds::default(),
            expert_layouts: true,
        }
    }
}

/// A mapping replaces torchrun's order when it gains at least 1 % by default (issue 14:
/// permuting nodes and GPUs for a 0.0–0.1 % modelled gain moves the master off the batch
/// host for nothing).
pub const DEFAULT_MAPPING_THRESHOLD: f64 = 0.01;

/// Configurations mapped by default.
pub const DEFAULT_TOP_K: usize = 8;

/// States an exhaustive search may visit by default: 8 nodes' orders (8! = 40 320) with
/// room to spare, a few milliseconds with incremental evaluation.
pub const DEFAULT_EXHAUSTIVE_LIMIT: u64 = 50_000;

/// Annealing evaluations per mapped configuration by default: 1 000 per GPU, at least
/// [`BUDGET_MIN`] and at most [`BUDGET_MAX`].
///
/// The cap is what keeps planning fast on large clusters: the default top-K are mapped
/// with 8 × the budget evaluations, and beyond about a hundred thousand per configuration
/// the annealing finds almost nothing more. On the benchmark's clusters (`scripts/bench-plan`,
/// measured at 2 000 000 against 128 000 evaluations) the chosen plan's mapped estimate
/// was 0.02 % slower at 1 024 mixed H100/A100 GPUs, about 0.2 % at 8 192 H100s and 0.09 %
/// at 16 384 H100s, with the same configuration chosen, and the same plan at 1 024 H100s
/// (no mapping gains the 1 % threshold there): each far inside the time model's stated
/// error and the mapping threshold.
pub fn default_budget(gpus: usize) -> u64 {
    (gpus as u64)
        .saturating_mul(1_000)
        .clamp(BUDGET_MIN, BUDGET_MAX)
}

/// The most annealing evaluations per mapped configuration `--budget` takes: 78 times the
/// default's largest. An unbounded budget let a typing mistake run for days.
pub const MAX_BUDGET: u64 = 10_000_000;

/// The fewest annealing evaluations per mapped configuration by default.
pub const BUDGET_MIN: u64 = 50_000;

/// The most annealing evaluations per mapped configuration by default (128 GPUs' worth).
pub const BUDGET_MAX: u64 = 128_000;

/// The most evaluations per mapped configuration by default with the Pipette-compat
/// model, which costs a full evaluation per state.
pub const COMPAT_BUDGET: u64 = 20_000;
