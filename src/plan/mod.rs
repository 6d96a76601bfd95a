//! The planner: which parallel configuration, and which GPU runs each rank.
//!
//! Pure: takes settings and a cluster profile, returns a plan. No I/O.

pub mod space;
