//! `pipette calibrate`: the trial of a pipette-run job alone, its calibration written out.

use crate::app::run::calibrate;
use crate::cli::resolved::RunConfig;
use crate::cli::CalibrateArgs;
use crate::cluster::Environment;
use crate::error::Error;

pub(super) fn run(args: &CalibrateArgs, env: &Environment) -> Result<(), Error> {
    let mut config = RunConfig::resolve(&args.run, env.clone());
    // The trial stops in order on a stop signal, as pipette-run's does.
    let _signals = (!config.output.dry_run).then(crate::exec::signals::SignalGuard::install);
    config.resolve_node_env()?;
    calibrate(&config, &args.out)
}
