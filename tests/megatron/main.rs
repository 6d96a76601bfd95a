//! Megatron's memory and parameter counts, against Megatron's own figures.
//!
//! One test binary for the room (each module was a test file of its own); run one
//! module with `cargo test --test megatron MODULE::`.

#[path = "../common/mod.rs"]
mod common;

mod megatron_memory;
mod megatron_memory_moe;
mod megatron_params;
