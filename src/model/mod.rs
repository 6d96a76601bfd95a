//! Pure cost models: parameter counts (memory and time come with the cost-model issue).
//!
//! No I/O here: every function takes stage values and returns numbers.

pub mod params;
