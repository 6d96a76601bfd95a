//! `pipette-run` for a script it does not plan (no `--model`, none of Megatron's model
//! arguments: see [`crate::config::planning_off`]): discovery, then exactly what torchrun
//! would run on the nodes found — the world of nodes × `--nproc-per-node`, node ranks in
//! the allocation's order, the script's arguments untouched — launched and supervised by
//! the same path as a planned job ([`super::job::supervise_job`]); after a node failure the
//! same script runs again on the survivors, up to `--max-replans` times. A DeepSpeed config
//! the arguments name is read and its batch arithmetic checked on the world first.

use serde::Serialize;

use super::inputs::{allocate, discover_nodes, script_section};
use super::job::{ending_on_signal, job_template, launch_error, supervise_job};
use super::to_json;
use crate::cli::resolved::RunConfig;
use crate::cluster::allocation::NprocPerNode;
use crate::cluster::{Allocation, ClusterProfile, Slots};
use crate::config::deepspeed::{self, DeepSpeedBatch, DeepSpeedConfig, DeepSpeedError};
use crate::error::Error;
use crate::launch::{Layout, World};
use crate::measure::inventory::{take_inventory, InventoryRequest, NodeDevices};
use crate::render::{self, LaunchSpec};
use crate::report::dry_run::{NodesSection, ScriptSection};

/// What a dry run with planning off did.
const RENDERED_NOT_LAUNCHED: &str =
    "Dry run: rendered; nothing was launched (without --dry-run, pipette-run launches these commands and supervises them).";

/// An unplanned job, ready to render: its nodes, its world and what the DeepSpeed config
/// (if any) says.
struct Prepared {
    allocation: Allocation,
    world: World,
    deepspeed: Option<DeepSpeedReport>,
    /// Lines for people: why planning is off, the DeepSpeed config, what was not checked.
    notes: Vec<String>,
}

/// The DeepSpeed config as the launch reports it.
#[derive(Debug, Clone, Serialize)]
struct DeepSpeedReport {
    config: DeepSpeedConfig,
    /// The batch sizes on the world, as DeepSpeed resolves them; `null` with `"auto"`.
    batch: Option<DeepSpeedBatch>,
}

/// What `pipette-run --dry-run --json` prints with planning off.
#[derive(Serialize)]
struct WorldDryRun<'a> {
    /// Always `"off"`.
    planning: &'static str,
    /// Why, in one line.
    why: &'a str,
    nodes: NodesSection,
    script: ScriptSection,
    torchrun_passthrough: &'a [String],
    world: &'a World,
    deepspeed: Option<&'a DeepSpeedReport>,
    launch: &'a LaunchSpec,
    run_dir: String,
    notes: &'a [String],
    status: &'static str,
}

/// `pipette-run --dry-run` with planning off: the nodes, the world, the commands.
pub(super) fn run(config: &RunConfig, why: &str) -> Result<(), Error> {
    let prepared = prepare(config, why)?;
    let mut template = job_template(config, &prepared.allocation)?;
    // A preview: no run id in the commands (see launch::JobTemplate::run_id).
    template.run_id.clear();
    let run_dir = template.run_dir.clone();
    let written = template
        .render_world(&prepared.world, &run_dir)
        .map_err(launch_error)
        .and_then(|spec| Ok(render::write_run_dir(&spec, &run_dir).map(|()| spec)?));
    // The directory is this run's own (just claimed): nothing partial stays behind.
    let spec = written.inspect_err(|_| {
        let _ = std::fs::remove_dir_all(&run_dir);
    })?;
    if config.output.json {
        let report = WorldDryRun {
            planning: "off",
            why,
            nodes: (&prepared.allocation).into(),
            script: script_section(&config.script),
            torchrun_passthrough: &config.launch.torchrun_passthrough,
            world: &prepared.world,
            deepspeed: prepared.deepspeed.as_ref(),
            launch: &spec,
            run_dir: run_dir.display().to_string(),
            notes: &prepared.notes,
            status: RENDERED_NOT_LAUNCHED,
        };
        println!("{}", to_json(&report)?);
        return Ok(());
    }
    let mut out = String::new();
    NodesSection::from(&prepared.allocation).write_human(&mut out);
    print!("{out}");
    println!();
    for note in &prepared.notes {
        println!("{note}");
    }
    println!("\nCommands, one per node, exactly as they would run:");
    for line in spec.command_lines() {
        println!("  {line}");
    }
    println!("\nRun directory: {}", run_dir.display());
    println!("\n{RENDERED_NOT_LAUNCHED}");
    Ok(())
}

/// Launches the world on the nodes found and supervises it to the end (relaunching on the
/// survivors after a node failure); returns pipette-run's exit code, the job's.
pub(super) fn launch_and_supervise(config: &RunConfig, why: &str) -> Result<i32, Error> {
    ending_on_signal(config, |stage| {
        stage.during = "the launch's preparation";
        let prepared = prepare(config, why)?;
        for note in &prepared.notes {
            crate::log::log(crate::log::Level::Info, "job", note);
        }
        let template = job_template(config, &prepared.allocation)?;
        stage.run_dir = Some(template.run_dir.clone());
        let first = template
            .prepare(1, Layout::World(prepared.world), None)
            .map_err(launch_error)?;
        // Silence fails the job only when --startup-timeout says how long: torchrun never
        // gives up on a quiet script, and a script that is not Megatron's prints no iteration
        // lines by which progress could be told.
        let mut config = config.clone();
        config.supervise.startup_timeout = config.startup_timeout_given;
        supervise_job(&config, &template, first, None, &stage.before())
    })
}

/// Discovers the nodes (a `--cluster` file only names them when no allocation is found),
/// decides the world and checks the DeepSpeed config on it.
fn prepare(config: &RunConfig, why: &str) -> Result<Prepared, Error> {
    let found = discover_nodes(&config.discovery)?;
    // Checked once the inputs are: their mistakes are the ones to report first.
    let spec = found.spec.clone();
    let profile = match &config.discovery.cluster_file {
        Some(path) => Some((path.clone(), ClusterProfile::load(path)?)),
        None => None,
    };
    let profile = profile.as_ref().map(|(p, c)| (p.as_path(), c));
    let mut allocation = allocate(found, profile, config.allocation)?;
    count_workers(config, &mut allocation)?;
    let world = world_of(&allocation, why)?;
    let mut notes = vec![why.to_string()];
    if let Some(pin) = &config.settings.pin {
        notes.push(format!(
            "--pin {pin} is ignored: with planning off there is no plan to pin"
        ));
    }
    let deepspeed = match deepspeed::config_path(&config.script.args) {
        None => None,
        Some(path) => match read_deepspeed(&path, world.world_size())? {
            Ok(report) => {
                notes.push(report.config.describe(report.batch.as_ref()));
                Some(report)
            }
            Err(unchecked) => {
                notes.push(unchecked);
                None
            }
        },
    };
    if !config.output.dry_run {
        super::inputs::check_local_torchrun(config, &spec)?;
    }
    Ok(Prepared {
        allocation,
        world,
        deepspeed,
        notes,
    })
}

/// `--nproc-per-node gpu`, `auto` or `cpu` where discovery could not tell the count: each
/// node is asked, and counted as torchrun counts there — its GPUs (`gpu`; `auto` on a node
/// that has any), else its logical CPUs (`cpu`; `auto` on a node without GPUs).
fn count_workers(config: &RunConfig, allocation: &mut Allocation) -> Result<(), Error> {
    let asked = match config.allocation.nproc_per_node {
        Some(asked @ (NprocPerNode::Gpu | NprocPerNode::Auto | NprocPerNode::Cpu)) => asked,
        _ => return Ok(()),
    };
    let transport = config
        .launch
        .access
        .transport(&allocation.host_names(), &allocation.source);
    let request = InventoryRequest {
        transport: &transport,
        nvidia_smi: "nvidia-smi",
        timeout: config.supervise.health_timeout,
    };
    for host in allocation.hosts.iter_mut().filter(|h| h.workers.is_none()) {
        let inventory = take_inventory(&request, &host.host, &Slots::Unknown)
            .map_err(|e| Error::Profile(e.into()))?;
        let count = match (asked, &inventory.devices) {
            (NprocPerNode::Gpu | NprocPerNode::Auto, NodeDevices::Gpus { gpus, .. }) => {
                gpus.len() as u32
            }
            (NprocPerNode::Cpu | NprocPerNode::Auto, NodeDevices::Cpus { cpus, .. }) => *cpus,
            _ => {
                return Err(Error::Usage(format!(
                    "--nproc-per-node {asked}: {} has {} (give --nproc-per-node N)",
                    host.host,
                    match inventory.devices {
                        NodeDevices::Gpus { .. } => "GPUs, whose CPUs pipette-run does not count",
                        NodeDevices::Cpus { .. } => "no GPU",
                    }
                )))
            }
        };
        host.workers = Some(count);
    }
    Ok(())
}

/// The world torchrun would run: the allocation's hosts in order, each with the same
/// number of workers (one `--nproc-per-node` for every node, as torchrun takes it).
fn world_of(allocation: &Allocation, why: &str) -> Result<World, Error> {
    let mut counts = allocation.hosts.iter().map(|h| (h, h.workers));
    let Some((first, Some(nproc))) = counts.next() else {
        return Err(match allocation.hosts.first() {
            None => Error::Internal("no node was allocated".to_string()),
            Some(h) => Error::Usage(format!(
                "cannot tell how many workers to start on {} (give --nproc-per-node N: with planning off, pipette-run needs the count to lay out the world)",
                h.host
            )),
        });
    };
    if let Some((other, count)) = counts.find(|(_, n)| *n != Some(nproc)) {
        return Err(Error::Usage(format!(
            "{} would run {nproc} worker(s) but {} {} (give --nproc-per-node N: torchrun starts the same number on every node)",
            first.host,
            other.host,
            count.map_or("an unknown number".to_string(), |n| n.to_string())
        )));
    }
    Ok(World {
        hosts: allocation.host_names(),
        nproc_per_node: u64::from(nproc),
        why: why.to_string(),
    })
}

/// Reads the DeepSpeed config at `path` (relative to the working directory, where the
/// script runs) and checks its batch arithmetic on `world` ranks. A file that cannot be
/// read or parsed here is not an error (the nodes may see another file, and DeepSpeed
/// reports its own errors): `Ok(Err(note))` says it was not checked. Batch sizes that
/// DeepSpeed would refuse are an error, before anything is launched.
fn read_deepspeed(path: &str, world: u64) -> Result<Result<DeepSpeedReport, String>, Error> {
    let text = match crate::input_file::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            return Ok(Err(format!(
            "cannot read the DeepSpeed config {path} here ({e}): its batch sizes are not checked"
        )))
        }
    };
    let config = match DeepSpeedConfig::from_json(path, &text) {
        Ok(config) => config,
        Err(e @ DeepSpeedError::Invalid { .. }) => {
            return Ok(Err(format!("{e}: its batch sizes are not checked")))
        }
        Err(e) => return Err(e.into()),
    };
    let batch = config.batch_on(world)?;
    Ok(Ok(DeepSpeedReport { config, batch }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{HostAllocation, NodeSource};

    fn allocation(workers: &[Option<u32>]) -> Allocation {
        Allocation {
            source: NodeSource::Hosts,
            job_id: None,
            hosts: workers
                .iter()
                .enumerate()
                .map(|(i, w)| HostAllocation {
                    host: format!("n{i}"),
                    workers: *w,
                    devices: None,
                    gpu: None,
                })
                .collect(),
            warnings: Vec::new(),
        }
    }

    #[test]
    fn the_world_is_every_node_with_the_same_workers() {
        let world = world_of(&allocation(&[Some(2), Some(2)]), "planning is off").unwrap();
        assert_eq!(world.hosts, ["n0", "n1"]);
        assert_eq!(world.world_size(), 4);
        let e = world_of(&allocation(&[Some(2), Some(4)]), "planning is off").unwrap_err();
        assert!(
            e.to_string().contains("n0 would run 2 worker(s) but n1 4"),
            "{e}"
        );
        let e = world_of(&allocation(&[None]), "planning is off").unwrap_err();
        assert!(e.to_string().contains("give --nproc-per-node N"), "{e}");
    }
}
