//! The planner: which parallel configuration, and which GPU runs each rank.
//!
//! Pure: takes settings and a cluster profile, returns a plan. No I/O, no clock; every
//! random choice comes from an explicit seed.
//!
//! - [`space`]: every configuration Megatron accepts, pinned settings respected;
//! - [`search`]: [`plan`] filters them by memory, ranks them with the time model and maps
//!   the best;
//! - [`mapping`]: which host gets which node rank and which GPU each local rank uses
//!   (annealing, exhaustive search, incremental evaluation of the time model).

pub mod mapping;
pub mod search;
pub mod space;

pub use mapping::{MappingSearch, MappingState, SearchMethod};
pub use search::{
    default_budget, plan, MappingMode, MemoryHeadroom, Plan, PlanError, PlanEstimate, PlanOptions,
    PlanStats, RankMapping, RankedConfig, SearchSettings, COMPAT_BUDGET, DEFAULT_EXHAUSTIVE_LIMIT,
    DEFAULT_TOP_K,
};
