//! The top-level error and the exit codes users and job scripts can rely on.
//!
//! Every stage has its own error type; this module only gathers them and says which
//! exit code each class of failure gets. The codes themselves, with their meanings, are in
//! [`crate::exit`].

use crate::cluster::{DiscoveryError, ProfileError};
use crate::config::deepspeed::DeepSpeedError;
use crate::config::ArgsError;
use crate::measure::ProfileRunError;
use crate::model::time::TimeError;
use crate::peers::PeerError;
use crate::plan::PlanError;
use crate::render::RenderError;
use crate::trial::TrialError;

pub use crate::exit::ExitCode;

/// Everything that can stop pipette-run before it launches anything.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    ModelArgs(#[from] ArgsError),
    /// A DeepSpeed config the script's arguments name cannot work on the world found.
    #[error(transparent)]
    DeepSpeed(#[from] DeepSpeedError),
    #[error(transparent)]
    NodeList(#[from] DiscoveryError),
    #[error(transparent)]
    ClusterFile(#[from] ProfileError),
    /// The cluster cannot run the configuration as described (no GPU inventory, no
    /// tensor cores for the dtype, ...).
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
    /// The copies of pipette-run (one per node) could not become one job.
    #[error(transparent)]
    Peers(#[from] PeerError),
    /// The cluster file and the allocation disagree.
    #[error("{0}")]
    ClusterMismatch(String),
    /// torchrun cannot be found where the nodes run locally (see [`ExitCode::NoTorchrun`]).
    #[error("{0}")]
    NoTorchrun(String),
    #[error("internal error: {0} (this is a bug in pipette-run; please report it)")]
    Internal(String),
    /// A stop signal arrived between two stages (see [`crate::exec::signals`]).
    #[error("stopped by {} (nothing was left running)", crate::exec::signals::signal_name(*.0))]
    Interrupted(i32),
}

impl From<crate::cli::ResolveError> for Error {
    fn from(e: crate::cli::ResolveError) -> Error {
        match e {
            crate::cli::ResolveError::Usage(message) => Error::Usage(message),
            crate::cli::ResolveError::Internal(message) => Error::Internal(message),
        }
    }
}

/// The job stage's errors are the top-level error's kinds, one to one.
impl From<crate::job::JobError> for Error {
    fn from(e: crate::job::JobError) -> Error {
        use crate::job::JobError as J;
        match e {
            J::Usage(m) => Error::Usage(m),
            J::ModelArgs(e) => Error::ModelArgs(e),
            J::DeepSpeed(e) => Error::DeepSpeed(e),
            J::NodeList(e) => Error::NodeList(e),
            J::ClusterFile(e) => Error::ClusterFile(e),
            J::Time(e) => Error::Time(e),
            J::Plan(e) => Error::Plan(e),
            J::Render(e) => Error::Render(e),
            J::Profile(e) => Error::Profile(e),
            J::Trial(e) => Error::Trial(e),
            J::ClusterMismatch(m) => Error::ClusterMismatch(m),
            J::NoTorchrun(m) => Error::NoTorchrun(m),
            J::Internal(m) => Error::Internal(m),
        }
    }
}

impl Error {
    /// The stop signal that ended the run, when one did: while profiling, in the trial, or
    /// between two stages.
    pub fn interrupted_by(&self) -> Option<i32> {
        match self {
            Error::Interrupted(signal) => Some(*signal),
            Error::Profile(ProfileRunError::Exec(e)) | Error::Trial(TrialError::Exec(e)) => {
                e.interrupted_by()
            }
            _ => None,
        }
    }

    /// The process's exit code: [`Error::exit_code`]'s, or 128 + N after signal N.
    pub fn process_exit_code(&self) -> i32 {
        match self.interrupted_by() {
            Some(signal) => crate::exit::signal(signal),
            None => self.exit_code().code(),
        }
    }

    /// The code of the error's kind ([`Error::process_exit_code`] is what the process
    /// returns: a run a signal stopped exits with 128 + N, which no [`ExitCode`] names).
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Error::Usage(_) => ExitCode::Usage,
            Error::ModelArgs(_) | Error::DeepSpeed(_) => ExitCode::ModelArgs,
            Error::NodeList(_) => ExitCode::NodeList,
            Error::ClusterFile(_) | Error::ClusterMismatch(_) | Error::Time(_) => {
                ExitCode::ClusterFile
            }
            Error::Plan(e) => match e {
                PlanError::NothingFits { .. } => ExitCode::NothingFits,
                PlanError::NoCandidates { .. } => ExitCode::ModelArgs,
                PlanError::UnsupportedTimeModel(_) | PlanError::TooFewNodes { .. } => {
                    ExitCode::Usage
                }
                PlanError::EmptyCluster
                | PlanError::UnknownGpus { .. }
                | PlanError::MixedGpuCounts { .. }
                | PlanError::Time(_)
                | PlanError::Mapping(_) => ExitCode::ClusterFile,
            },
            Error::Render(e) if e.is_bug() => ExitCode::Internal,
            Error::Render(RenderError::Args { .. } | RenderError::Unrepresentable { .. }) => {
                ExitCode::ModelArgs
            }
            Error::Render(RenderError::RunDirWrite { .. }) => ExitCode::CannotWrite,
            Error::Render(_) => ExitCode::Usage,
            Error::Profile(e) => match e {
                ProfileRunError::NoNodes | ProfileRunError::MixedNodes { .. } => ExitCode::NodeList,
                ProfileRunError::Invalid(_) => ExitCode::ClusterFile,
                ProfileRunError::NoResult { .. } | ProfileRunError::BadResult { .. } => {
                    ExitCode::Internal
                }
                // A node that cannot be reached, inventoried or run the probe.
                _ => ExitCode::Unreachable,
            },
            Error::Trial(e) => match e {
                TrialError::ScriptFailed(_)
                | TrialError::TimedOut { .. }
                | TrialError::NoResults { .. } => ExitCode::TrialFailed,
                TrialError::Launch(crate::launch::LaunchError::Render(e)) if !e.is_bug() => {
                    ExitCode::ModelArgs
                }
                TrialError::Launch(_) => ExitCode::Internal,
                TrialError::Exec(_) | TrialError::Stage { .. } => ExitCode::Unreachable,
                // An unwritable run directory, as for its other files.
                TrialError::Logs { .. } => ExitCode::Usage,
            },
            Error::Peers(e) => match e {
                PeerError::Listen { .. } | PeerError::Resolve { .. } | PeerError::Serve { .. } => {
                    ExitCode::Usage
                }
                PeerError::Refused { .. } => ExitCode::Usage,
                PeerError::Incomplete { .. } => ExitCode::NodeList,
                PeerError::NoLeader { .. } => ExitCode::Unreachable,
            },
            Error::NoTorchrun(_) => ExitCode::NoTorchrun,
            Error::Internal(_) | Error::Interrupted(_) => ExitCode::Internal,
        }
    }
}
