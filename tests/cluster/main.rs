//! Cluster profiles: the format, NIC counts and host lists.
//!
//! One test binary for the room (each module was a test file of its own); run one
//! module with `cargo test --test cluster MODULE::`.

#[path = "../common/mod.rs"]
mod common;

mod cluster_nics;
mod cluster_profile;
mod hostlist_props;
