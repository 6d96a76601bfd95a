//! The time model: its terms, and its fit against vTrain's measurements.
//!
//! One test binary for the room (each module was a test file of its own); run one
//! module with `cargo test --test time_model MODULE::`.

#[path = "../common/mod.rs"]
mod common;

mod time_model;
mod time_model_vtrain;
