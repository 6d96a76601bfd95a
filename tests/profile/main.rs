//! Profiling without a real probe: the inventory parsers, how profiling fails, a slow node.
//!
//! One test binary for the room (each module was a test file of its own); run one
//! module with `cargo test --test profile MODULE::`.

#[path = "../common/mod.rs"]
mod common;

mod profile_errors;
mod profile_inventory;
mod profile_slow;
