//! Rendering a plan into Megatron's arguments and launch scripts.
//!
//! One test binary for the room (each module was a test file of its own); run one
//! module with `cargo test --test render MODULE::`.

#[path = "../common/mod.rs"]
mod common;

mod render_mapping;
mod render_megatron;
mod render_quoting;
mod render_snapshots;
