//! The `pipette` subcommands, one file each: every one runs a stage on its own (discover,
//! cluster, model, estimate, plan, profile, presets), the trial alone (calibrate), or
//! prints what the command line generates (completions, man, config show); doctor
//! checks the nodes.

mod calibrate;
mod cluster;
mod config;
mod discover;
pub(super) mod doctor;
mod estimate;
mod generated;
mod model;
mod plan;
mod presets;
mod profile;

use crate::cli::{ConfigAction, PipetteCommand};
use crate::cluster::Environment;
use crate::error::Error;

/// Runs one `pipette` subcommand (doctor aside: its exit code is its report's).
pub(super) fn pipette(command: &PipetteCommand, env: &Environment) -> Result<(), Error> {
    match command {
        PipetteCommand::Completions { shell, program } => generated::completions(*shell, *program),
        PipetteCommand::Man { program } => generated::man(*program),
        PipetteCommand::Config {
            action: ConfigAction::Show { config },
        } => config::show(config.as_deref()),
        PipetteCommand::Discover { discovery, output } => discover::run(discovery, output, env),
        PipetteCommand::Cluster { file, output } => cluster::run(file, output),
        PipetteCommand::Model {
            model,
            output,
            megatron_args,
        } => model::run(model, output, megatron_args),
        PipetteCommand::Estimate(args) => estimate::run(args),
        PipetteCommand::Plan(args) => plan::run(args, env),
        PipetteCommand::Profile(args) => profile::run(args, env),
        PipetteCommand::Calibrate(args) => calibrate::run(args, env),
        PipetteCommand::Presets { output } => presets::run(output),
        // pipette_main runs it: its exit code is its report's, not an error's.
        PipetteCommand::Doctor(_) => Err(Error::Internal(
            "pipette doctor reached the stage tools".to_string(),
        )),
    }
}
