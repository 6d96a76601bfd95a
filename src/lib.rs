//! pipette-run: a drop-in replacement for `torchrun` that plans how to train.
//!
//! Data flows one way through the stages; each stage takes the previous stage's
//! value and returns a new one:
//!
//! ```text
//! Cli ─▶ Settings ─▶ ClusterSpec ─▶ ClusterProfile ─▶ Plan ─▶ Trial ─▶ LaunchSpec ─▶ RunningJob ─▶ Outcome
//!        (config)     (cluster)      (profile)         (plan)  (trial)   (render)     (launch)      (supervise)
//!                                                       ▲        │ calibration                        │
//!                                                       └────────┘                                    │
//!                                                       ▲──────────── re-plan on the survivors ◀──────┘
//! ```
//!
//! - [`cli`] owns the command lines (torchrun's options, pipette's own) and nothing else.
//! - [`config`] turns the user's Megatron arguments (or a preset) into [`config::Settings`].
//! - [`cluster`] discovers the allocated nodes ([`cluster::ClusterSpec`]) and reads and
//!   validates cluster profile files ([`cluster::ClusterProfile`]).
//! - [`measure`] measures the nodes (GPU inventory, link bandwidth, matmul throughput)
//!   into a cluster profile, cached per node set.
//! - [`model`] holds the pure cost models: parameters, memory per stage, iteration time,
//!   and the calibration factors they share.
//! - [`plan`] searches the configurations (mixed GPU kinds included) and the rank mapping.
//! - [`trial`] runs the user's script briefly under a plan and fits the calibration to
//!   what it measured; the orchestrator then re-plans with it (the first loop back).
//! - [`render`] writes a plan as Megatron arguments and per-node launch files.
//! - [`report`] shows stage values to people (tables) and to tools (JSON).
//! - [`launch`] renders each attempt of a plan and runs torchrun on every node through
//!   the [`exec`] seam; [`supervise`] watches the job, tears it down on a failure or a
//!   signal, and loops back to the planner on the surviving nodes.
//! - [`error`] is the one top-level error, which maps every failure to an exit code;
//!   [`exit`] lists every exit code with its meaning (a leaf: it imports no stage).
//!
//! The binaries in `src/bin` only parse arguments, call [`app`], and exit.

pub mod app;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod error;
pub mod exec;
pub mod exit;
pub mod launch;
pub mod measure;
pub mod model;
pub mod plan;
pub mod render;
pub mod report;
pub mod supervise;
pub mod trial;

pub use error::Error;
pub use exit::ExitCode;
