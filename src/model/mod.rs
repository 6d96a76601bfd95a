//! Pure cost models: exact parameter counts, memory per GPU and iteration time.
//!
//! No I/O here: every function takes stage values (settings, a parallel configuration,
//! a cluster profile, a placement) and returns numbers, each term kept visible.

pub mod calibration;
pub mod context;
pub mod flops;
pub mod memory;
pub mod moe_activations;
pub mod moe_validation;
pub mod parallel;
pub mod params;
pub mod time;
pub mod validation;

pub use calibration::Calibration;
pub use memory::{estimate_memory, MemoryEstimate, StageMemory};
pub use parallel::{Device, ParallelConfig, Placement, RankCoordinates};
