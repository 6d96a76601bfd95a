//! A `pipette-run` job prepared as values: each step of the launch sequence takes what the
//! last one returned and returns the next, so no step patches a value an earlier one
//! built, and the front ([`crate::app`]) only calls them in order and shows the results.
//!
//! - [`gather`]: the nodes, their allocation, the cluster profile (read, or measured), the
//!   settings ([`Inputs`]);
//! - [`decide`]: the plan against the user's own configuration ([`Decided`]); once per
//!   calibration: before the trial, and again with the trial's fitted one;
//! - [`spec`]: what every attempt shares ([`launch::JobSpec`]), built once, after the
//!   inputs it needs exist (a preview's has no run id from the start);
//! - [`trial`]: the trial rounds and the re-plan they give ([`Trialled`]);
//! - [`first_attempt`]: attempt 1, rendered and written, with the planning inputs in its
//!   [`launch::Layout::Planned`];
//! - [`unplanned`]: with planning off, the world torchrun would run;
//! - [`estimate`]: `pipette estimate`'s one configuration, checked and costed.
//!
//! Prints nothing: what it has to tell as it goes (profiling, the trial's rounds) it
//! tells as [`Event`]s to the front, which shows them.

pub mod decided;
pub mod estimate;
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
    claim_run_dir, first_attempt, installed_torchrun_spelling, preview, preview_world, spec,
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Mutex;

    use clap::Parser;

    use super::*;
    use crate::cli::resolved::RunConfig;
    use crate::cli::RunCli;
    use crate::cluster::Environment;
    use crate::report::dry_run::PLANNED_NOT_LAUNCHED;

    /// A dry run's steps on a cluster file and a toy model: each takes the last one's
    /// value, nothing is patched afterwards, and the report is built from the values.
    #[test]
    fn a_dry_run_is_a_sequence_of_values_and_its_report_is_built_from_them() {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("run");
        let cluster = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/clusters/a100-2x8.json");
        let (cluster, run) = (cluster.display().to_string(), run_dir.display().to_string());
        let words = [
            "pipette-run",
            "--dry-run",
            "--cluster",
            &cluster,
            "--run-dir",
            &run,
            "train.py",
            "--num-layers",
            "2",
            "--hidden-size",
            "64",
            "--num-attention-heads",
            "4",
            "--seq-length",
            "32",
            "--max-position-embeddings",
            "32",
            "--vocab-size",
            "256",
            "--micro-batch-size",
            "1",
            "--global-batch-size",
            "16",
        ];
        let cli = RunCli::try_parse_from(words).expect("a valid command line");
        let config = RunConfig::resolve(&cli, Environment::new());
        let told = Mutex::new(Vec::new());
        let tell = |event: Event<'_>| told.lock().unwrap().push(format!("{event:?}"));

        let inputs = gather(&config, false, &tell).unwrap();
        let profile = inputs.profile.as_ref().expect("the cluster file, narrowed");
        let options = config.planning.plan_options(&inputs.settings).unwrap();
        let decided = decide(&config, &inputs.settings, profile, options, None).unwrap();
        let spec = spec(&config, &inputs.allocation, Purpose::Preview).unwrap();
        assert!(
            spec.run_id.is_empty(),
            "a preview's commands carry no run id"
        );
        assert_eq!(spec.run_dir, run_dir);
        let launch = preview(&spec, &decided, profile).unwrap();
        assert_eq!(launch.nodes.len(), inputs.allocation.hosts.len());
        let previewed = Previewed {
            decided: &decided,
            spec: &spec,
            launch,
        };
        let report = inputs.dry_run_report(&config, Some(previewed));
        assert_eq!(
            report.plan.as_ref().map(|p| &p.config),
            Some(&decided.plan.config)
        );
        assert_eq!(report.run_dir.as_deref(), Some(run.as_str()));
        assert_eq!(report.status, PLANNED_NOT_LAUNCHED);
        assert_eq!(
            report.training, inputs.settings.training,
            "as read, before any pin"
        );
        // The same calibration decides the same: the chosen plan stays ours.
        let again = decided
            .with_calibration(
                &config,
                profile,
                decided.options.calibration.clone(),
                decided.plan.clone(),
            )
            .unwrap();
        assert_eq!(again.plan.config, decided.plan.config);
        assert!(
            told.lock().unwrap().is_empty(),
            "a dry run with a cluster file profiles nothing: {:?}",
            told.lock().unwrap()
        );
    }
}
