//! Planning: the search, the mapping of ranks onto GPUs, mixed GPUs and the plan's command line.
//!
//! One test binary for the room (each module was a test file of its own); run one
//! module with `cargo test --test plan MODULE::`.

#[path = "../common/mod.rs"]
mod common;

mod plan_cli;
mod plan_hetero;
mod plan_mapping;
mod plan_search;
