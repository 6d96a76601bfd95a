//! What every attempt of a job shares ([`launch::JobSpec`]), built once from the run's
//! configuration and allocation, and what is rendered from it: the dry run's preview and
//! the launch's first attempt.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Decided, JobError};
use crate::cli::resolved::RunConfig;
use crate::cluster::{Allocation, ClusterProfile};
use crate::exec::{self, Transport};
use crate::launch::{self, Attempt, JobSpec, Layout, World};
use crate::plan::Plan;
use crate::render::{self, LaunchSpec};
use crate::report::pictures;

/// What a job's spec is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A dry run's preview: no run id in the commands (see [`JobSpec::run_id`]),
    /// since pipette-run never supervises them.
    Preview,
    /// A launch (or the trial of one).
    Launch,
}

/// What every attempt of the job shares: the run's configuration and the allocation (its
/// hosts and node source choose the transport, its job id the rendezvous id). Claims the
/// run directory.
pub fn spec(
    config: &RunConfig,
    allocation: &Allocation,
    purpose: Purpose,
) -> Result<JobSpec, JobError> {
    let launch = &config.launch;
    let workdir = std::env::current_dir()
        .map_err(|e| JobError::Internal(format!("cannot read the working directory: {e}")))?;
    let rdzv_id = rendezvous_id(launch.rdzv_id.as_deref(), allocation.job_id.as_deref());
    // Claimed (made, atomically) here, so no other launch can write into it.
    let run_dir = claim_run_dir(config, &workdir, allocation.job_id.as_deref())?;
    let templates = match &launch.templates {
        Some(dir) => render::Templates::from_dir(dir)?,
        None => render::Templates::embedded(),
    };
    let transport = launch
        .access
        .transport(&allocation.host_names(), &allocation.source);
    let run_id = match purpose {
        Purpose::Preview => String::new(),
        Purpose::Launch => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            format!("{}-{nanos}", std::process::id())
        }
    };
    Ok(JobSpec {
        script: config.script.clone(),
        torchrun: launch.torchrun.clone(),
        torchrun_spelling: installed_torchrun_spelling(&launch.torchrun),
        torchrun_passthrough: launch.torchrun_passthrough.clone(),
        master_addr: launch.master_addr.clone(),
        master_port: launch.master_port,
        rdzv_id,
        env: config.node_env.clone(),
        workdir,
        run_dir,
        templates,
        transport,
        run_id,
    })
}

/// Attempt 1 of the decided plan on `profile`'s nodes, rendered and written (its pictures
/// beside it); the planning inputs travel in its layout, for the re-plans.
pub fn first_attempt(
    spec: &JobSpec,
    decided: Decided,
    profile: ClusterProfile,
) -> Result<Attempt, JobError> {
    let Decided {
        settings,
        options,
        plan,
        ..
    } = decided;
    let layout = Layout::Planned(Box::new(launch::Planned {
        settings,
        options,
        plan,
        profile,
    }));
    let first = spec.prepare(1, layout, None)?;
    if let Some(planned) = first.layout.planned() {
        write_pictures(&first.dir, &planned.plan, &planned.profile)?;
    }
    Ok(first)
}

/// The dry run's preview of the decided plan: the launch rendered, written into the run
/// directory with the plan's pictures. On failure the directory (this run's own, just
/// claimed) is removed: nothing partial stays behind.
pub fn preview(
    spec: &JobSpec,
    decided: &Decided,
    profile: &ClusterProfile,
) -> Result<LaunchSpec, JobError> {
    let run_dir = &spec.run_dir;
    let written = spec
        .render(&decided.settings, &decided.plan, None, run_dir)
        .map_err(JobError::from)
        .and_then(|launch| {
            render::write_run_dir(&launch, run_dir)?;
            write_pictures(run_dir, &decided.plan, profile)?;
            Ok(launch)
        });
    written.inspect_err(|_| {
        let _ = std::fs::remove_dir_all(run_dir);
    })
}

/// The dry run's preview of an unplanned `world`, written into the run directory (removed
/// again on failure, as [`preview`]'s).
pub fn preview_world(spec: &JobSpec, world: &World) -> Result<LaunchSpec, JobError> {
    let run_dir = &spec.run_dir;
    let written = spec
        .render_world(world, run_dir)
        .map_err(JobError::from)
        .and_then(|launch| Ok(render::write_run_dir(&launch, run_dir).map(|()| launch)?));
    written.inspect_err(|_| {
        let _ = std::fs::remove_dir_all(run_dir);
    })
}

/// The plan's pictures ([`pictures::Picture`]) as SVG files beside its other files in the
/// run directory.
pub fn write_pictures(
    dir: &std::path::Path,
    plan: &Plan,
    profile: &ClusterProfile,
) -> Result<(), JobError> {
    for (name, svg) in pictures::svg_files(plan, profile) {
        let path = dir.join(name);
        std::fs::write(&path, svg).map_err(|e| {
            JobError::Usage(format!(
                "cannot write {}: {e} (choose another --run-dir)",
                path.display()
            ))
        })?;
    }
    Ok(())
}

/// How the torchrun installed here spells its options: old releases know only
/// `--nproc_per_node`. Dashes when it cannot be asked (not installed here, say): every
/// current torchrun accepts them.
pub fn installed_torchrun_spelling(torchrun: &str) -> render::TorchrunSpelling {
    let help = exec::NodeCommand::new(torchrun).arg("--help");
    match exec::run(
        &Transport::Local,
        "localhost",
        &help,
        Duration::from_secs(30),
    ) {
        Ok(out) if out.status.success() => render::TorchrunSpelling::from_help(&out.stdout_text()),
        _ => render::TorchrunSpelling::Dashes,
    }
}

/// The run directory, made (atomically: no other launch can write into it): `--run-dir`
/// under `workdir`, else the default one named for now and `job_id` (this process's id
/// when the scheduler gave none).
pub fn claim_run_dir(
    config: &RunConfig,
    workdir: &Path,
    job_id: Option<&str>,
) -> Result<PathBuf, JobError> {
    Ok(match &config.launch.run_dir {
        Some(dir) => render::claim_run_dir(&workdir.join(dir), false)?,
        None => {
            let id = job_id.map_or_else(|| std::process::id().to_string(), str::to_string);
            render::claim_run_dir(&render::default_run_dir(workdir, &id, local_time()), true)?
        }
    })
}

/// torchrun's `--rdzv-id` when the user set one, else the scheduler's job id, else one
/// made from the time (the static rendezvous only needs it to be the same on all nodes).
fn rendezvous_id(asked: Option<&str>, job_id: Option<&str>) -> String {
    asked
        .or(job_id)
        .map(str::to_string)
        .unwrap_or_else(|| format!("pipette-{}", unix_seconds()))
}

/// Now on the local clock (UTC when the time zone cannot be read), for run directory names.
fn local_time() -> jiff::civil::DateTime {
    jiff::ZonedDateTime::now().datetime()
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
