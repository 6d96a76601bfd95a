//! Pure cost models: exact parameter counts, memory per GPU and iteration time.
//!
//! No I/O here: every function takes stage values (settings, a parallel configuration,
//! a cluster profile, a placement) and returns numbers, each term kept visible.

pub mod parallel;
pub mod params;

pub use parallel::{Device, ParallelConfig, Placement, RankCoordinates};
