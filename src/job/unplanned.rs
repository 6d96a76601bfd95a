//! `pipette-run` for a script it does not plan (no `--model`, none of Megatron's model
//! arguments: see [`crate::config::planning_off`]): discovery, then exactly what torchrun
//! would run on the nodes found — the world of nodes × `--nproc-per-node`, node ranks in
//! the allocation's order, the script's arguments untouched (the front launches and
//! supervises it as a planned job; after a node failure the same script runs again on the
//! survivors, up to `--max-replans` times). A DeepSpeed config the arguments name is read
//! and its batch arithmetic checked on the world first.

use super::inputs::{allocate, check_local_torchrun, discover_nodes};
use super::JobError;
use crate::cli::resolved::RunConfig;
use crate::cluster::allocation::NprocPerNode;
use crate::cluster::{Allocation, ClusterProfile, Slots};
use crate::config::deepspeed::{self, DeepSpeedConfig, DeepSpeedError};
use crate::launch::World;
use crate::measure::inventory::{take_inventory, InventoryRequest, NodeDevices};
use crate::report::dry_run::DeepSpeedReport;

/// An unplanned job, ready to render: its nodes, its world and what the DeepSpeed config
/// (if any) says.
pub struct Prepared {
    pub allocation: Allocation,
    pub world: World,
    pub deepspeed: Option<DeepSpeedReport>,
    /// Lines for people: why planning is off, the DeepSpeed config, what was not checked.
    pub notes: Vec<String>,
}

/// Discovers the nodes (a `--cluster` file only names them when no allocation is found),
/// decides the world and checks the DeepSpeed config on it.
pub fn prepare(config: &RunConfig, why: &str) -> Result<Prepared, JobError> {
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
        check_local_torchrun(config, &spec)?;
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
fn count_workers(config: &RunConfig, allocation: &mut Allocation) -> Result<(), JobError> {
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
            .map_err(|e| JobError::Profile(e.into()))?;
        let count = match (asked, &inventory.devices) {
            (NprocPerNode::Gpu | NprocPerNode::Auto, NodeDevices::Gpus { gpus, .. }) => {
                gpus.len() as u32
            }
            (NprocPerNode::Cpu | NprocPerNode::Auto, NodeDevices::Cpus { cpus, .. }) => *cpus,
            _ => {
                return Err(JobError::Usage(format!(
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
fn world_of(allocation: &Allocation, why: &str) -> Result<World, JobError> {
    let mut counts = allocation.hosts.iter().map(|h| (h, h.workers));
    let Some((first, Some(nproc))) = counts.next() else {
        return Err(match allocation.hosts.first() {
            None => JobError::Internal("no node was allocated".to_string()),
            Some(h) => JobError::Usage(format!(
                "cannot tell how many workers to start on {} (give --nproc-per-node N: with planning off, pipette-run needs the count to lay out the world)",
                h.host
            )),
        });
    };
    if let Some((other, count)) = counts.find(|(_, n)| *n != Some(nproc)) {
        return Err(JobError::Usage(format!(
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
fn read_deepspeed(path: &str, world: u64) -> Result<Result<DeepSpeedReport, String>, JobError> {
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
