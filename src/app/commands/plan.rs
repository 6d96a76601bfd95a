//! `pipette plan`: the plan for the nodes found (or a cluster file's), with the parallel
//! configuration, the rank mapping and why it wins, or one of its pictures.

use crate::app::to_json;
use crate::cli::resolved::{DiscoveryInputs, PlanningConfig, SettingsInputs};
use crate::cli::PlanArgs;
use crate::cluster::{AllocationRequest, ClusterProfile, Environment};
use crate::error::Error;
use crate::job::inputs::{allocate, allocation_error, discover_nodes, read_settings};
use crate::job::runner_up;
use crate::log;
use crate::plan;
use crate::report::plan::plan_report;

pub(super) fn run(args: &PlanArgs, env: &Environment) -> Result<(), Error> {
    let found = discover_nodes(&DiscoveryInputs::new(&args.discovery, env.clone()))?;
    let Some(path) = &args.discovery.cluster else {
        return Err(Error::Usage(
            "pipette plan needs a cluster profile: give --cluster FILE (`pipette profile --out FILE` measures the nodes)"
                .to_string(),
        ));
    };
    let full = ClusterProfile::load(path)?;
    let settings = read_settings(&SettingsInputs::new(&args.model), &args.megatron_args)?;
    let request = AllocationRequest {
        nnodes: None,
        nproc_per_node: args.nproc_per_node,
    };
    let allocation = allocate(found, Some((path, &full)), request)?;
    for w in &allocation.warnings {
        log::warn(&w.to_string());
    }
    let profile = allocation.narrow(path, &full).map_err(allocation_error)?;
    let options = PlanningConfig::new(&args.planning, args.output.seed).plan_options(&settings)?;
    let plan = plan::plan_subset(&settings, &profile, &options)?;
    if let Some(picture) = args.show {
        print!("{}", picture.text(&plan, &profile));
    } else if args.output.json {
        println!("{}", to_json(&plan)?);
    } else {
        let runner_up = runner_up(&plan, &settings, &profile, &options);
        let runner_up = runner_up.as_ref().map(|(_, t)| t);
        print!("{}", plan_report(&plan, runner_up, &settings, &profile));
    }
    Ok(())
}
