//! A `pipette-run` job prepared as values: each step of the launch sequence takes what the
//! last one returned and returns the next, so no step patches a value an earlier one
//! built, and the front ([`crate::app`]) only calls them in order and shows the results.
//!
//! - [`gather`]: the nodes, their allocation, the cluster profile (read, or measured), the
//!   settings ([`Inputs`]);
//! - [`decide`]: the plan against the user's own configuration ([`Decided`]); once per
//!   calibration: before the trial, and again with the trial's fitted one;
//! - [`spec`]: what every attempt shares ([`launch::JobTemplate`]), built once, after the
//!   inputs it needs exist (a preview's has no run id from the start);
//! - [`trial`]: the trial rounds and the re-plan they give ([`Trialled`]);
//! - [`first_attempt`]: attempt 1, rendered and written, with the planning inputs in its
//!   [`launch::Layout::Planned`];
//! - [`unplanned`]: with planning off, the world torchrun would run.
//!
//! Prints nothing: what it has to tell as it goes (profiling, the trial's rounds) it
//! tells as [`Event`]s to the front, which shows them.

pub mod decided;
pub mod inputs;
mod spec;
mod trial;
pub mod unplanned;

use crate::cli::ResolveError;
use crate::cluster::{DiscoveryError, ProfileError};
use crate::config::deepspeed::DeepSpeedError;
use crate::config::ArgsError;
use crate::launch;
use crate::measure::ProfileRunError;
use crate::model::time::TimeError;
use crate::model::ParallelConfig;
use crate::plan::PlanError;
use crate::render::RenderError;
use crate::trial::{TrialError, TrialReport};

pub use decided::{decide, runner_up, Decided};
pub use inputs::{gather, Inputs, Previewed};
pub use spec::{
    first_attempt, installed_torchrun_spelling, local_time, preview, preview_world, spec,
    write_pictures, Purpose,
};
pub use trial::{trial, Trialled};

/// What the stage tells as it goes, for the front to show.
#[derive(Debug)]
pub enum Event<'a> {
    /// No `--cluster`: the nodes found are being profiled.
    Profiling { nodes: usize },
    /// A line of the profile run's (the cache it used, say).
    ProfileNote(&'a str),
    /// A trial round starts: the plan's configuration at `micro_batch`.
    TrialRound {
        config: &'a ParallelConfig,
        micro_batch: u64,
        iters: u64,
    },
    /// The trial ran out of memory: the plan is made again with a larger memory estimate.
    OutOfMemory(&'a TrialError),
    /// The calibration fitted on the rounds so far.
    Fitted(&'a TrialReport),
    /// The plan made again with the fitted calibration differs from the last: how.
    Replanned {
        changes: &'a [String],
        now: &'a ParallelConfig,
    },
    /// A line of the measured choice among the plans the model cannot tell apart.
    Choice(&'a str),
    /// USR1 or USR2 was passed on to the training script during the trial (it goes on).
    SignalPassed {
        signal: nix::sys::signal::Signal,
        workers: usize,
    },
}

/// Where the stage tells its [`Event`]s.
pub type Tell<'a> = &'a (dyn Fn(Event<'_>) + Sync);

/// Why a job could not be prepared; each kind maps onto the top-level error's (and so onto
/// its exit code) one to one.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    ModelArgs(#[from] ArgsError),
    #[error(transparent)]
    DeepSpeed(#[from] DeepSpeedError),
    #[error(transparent)]
    NodeList(#[from] DiscoveryError),
    #[error(transparent)]
    ClusterFile(#[from] ProfileError),
    #[error(transparent)]
    Time(#[from] TimeError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error(transparent)]
    Profile(#[from] ProfileRunError),
    #[error(transparent)]
    Trial(#[from] TrialError),
    /// The cluster file and the allocation disagree.
    #[error("{0}")]
    ClusterMismatch(String),
    /// torchrun cannot be found where the nodes run locally.
    #[error("{0}")]
    NoTorchrun(String),
    /// A bug: the message, without the top-level error's request to report it.
    #[error("{0}")]
    Internal(String),
}

impl From<ResolveError> for JobError {
    fn from(e: ResolveError) -> JobError {
        match e {
            ResolveError::Usage(message) => JobError::Usage(message),
            ResolveError::Internal(message) => JobError::Internal(message),
        }
    }
}

impl From<launch::LaunchError> for JobError {
    fn from(e: launch::LaunchError) -> JobError {
        match e {
            launch::LaunchError::Plan(e) => JobError::Plan(e),
            launch::LaunchError::Render(e) => JobError::Render(e),
            launch::LaunchError::PlanJson(e) => JobError::Internal(e),
        }
    }
}
