//! The planner: which parallel configuration, and which GPU runs each rank.
//!
//! Pure: takes settings and a cluster profile, returns a plan. No I/O, no clock; every
//! random choice comes from an explicit seed.
//!
//! - [`space`]: every configuration Megatron accepts, pinned settings respected, with
//!   [`experts`]' expert layouts for a mixture-of-experts model;
//! - [`search`]: [`plan`] filters them by memory, ranks them with the time model and maps
//!   the best;
//! - [`hetero`]: on clusters that mix kinds of GPU, the orders of the kinds along the
//!   pipeline; [`layers`]: each stage's share of the layers by its speed and memory;
//! - [`subset`]: [`plan_subset`] plans on the nodes that make the fastest job and names the
//!   rest as hot spares;
//! - [`mapping`]: which host gets which node rank and which GPU each local rank uses
//!   (annealing, exhaustive search, incremental evaluation of the time model).

pub mod experts;
pub mod hetero;
pub mod layers;
pub mod mapping;
pub mod search;
pub mod space;
pub mod subset;

pub use mapping::{MappingSearch, MappingState, SearchMethod};
pub use search::{
    default_budget, plan, simpler, EvenSplit, ExpertLayouts, HeterogeneousPlan, LayoutBest,
    MappingMode, MemoryHeadroom, Plan, PlanError, PlanEstimate, PlanOptions, PlanStats,
    RankMapping, RankedConfig, SearchSettings, StagePlan, Ties, COMPAT_BUDGET,
    DEFAULT_EXHAUSTIVE_LIMIT, DEFAULT_MAPPING_THRESHOLD, DEFAULT_TOP_K,
};
pub use subset::{plan_subset, NodeBounds};
