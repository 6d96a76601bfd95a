//! The cluster as the planner needs it ([`ClusterShape`]), and the check that every GPU
//! trains in the run's precision.

use super::error::PlanError;
use crate::cluster::profile::{Dtype, GpuInventory};
use crate::cluster::ClusterProfile;
use crate::config::{Precision, Settings};
use crate::model::parallel::Device;
use crate::model::time::{ClusterFabric, ThroughputBasis, TimeError};

/// The cluster as the planner needs it: nodes, GPUs per node, the smallest GPU memory.
pub(super) struct ClusterShape {
    pub(super) nodes: usize,
    pub(super) gpus_per_node: usize,
    pub(super) gpu_memory_bytes: u64,
    /// Consecutive nodes sharing an NVLink domain in every aligned run of the profile's
    /// order ([`nvlink_run`]); `None` without NVLink domains.
    pub(super) nvlink_nodes: Option<u64>,
}

/// The most consecutive nodes `k` (a divisor of the node count) such that every aligned
/// run of `k` nodes in the profile's order shares one NVLink domain; `None` when no node
/// names a domain. torchrun gives a group of `k` nodes' GPUs consecutive ranks, so groups
/// of up to `k` nodes stay inside a domain.
pub(super) fn nvlink_run(cluster: &ClusterProfile) -> Option<u64> {
    let nodes = &cluster.nodes;
    if nodes.iter().all(|n| n.nvlink_domain.is_none()) {
        return None;
    }
    let n = nodes.len();
    let best = (1..=n)
        .rev()
        .filter(|k| n % k == 0)
        .find(|&k| {
            nodes.chunks(k).all(|run| {
                run[0].nvlink_domain.is_some()
                    && run.iter().all(|x| x.nvlink_domain == run[0].nvlink_domain)
            })
        })
        .unwrap_or(1);
    Some(best as u64)
}

pub(super) fn cluster_shape(cluster: &ClusterProfile) -> Result<ClusterShape, PlanError> {
    let first = cluster.nodes.first().ok_or(PlanError::EmptyCluster)?;
    let mut gpu_memory_bytes = u64::MAX;
    let mut first_gpus = None;
    for node in &cluster.nodes {
        let GpuInventory::Known { gpus, .. } = &node.gpus else {
            return Err(PlanError::UnknownGpus {
                host: node.host.clone(),
            });
        };
        let expected = *first_gpus.get_or_insert(gpus.len());
        if gpus.len() != expected {
            return Err(PlanError::MixedGpuCounts {
                host: node.host.clone(),
                gpus: gpus.len(),
                first_host: first.host.clone(),
                first_gpus: expected,
            });
        }
        for gpu in gpus {
            gpu_memory_bytes = gpu_memory_bytes.min(gpu.memory_bytes);
        }
    }
    Ok(ClusterShape {
        nodes: cluster.nodes.len(),
        gpus_per_node: first_gpus.unwrap_or(0),
        gpu_memory_bytes,
        nvlink_nodes: nvlink_run(cluster),
    })
}

/// Every GPU can train in the run's precision.
pub(super) fn check_dtype(
    cluster: &ClusterProfile,
    fabric: &ClusterFabric,
    settings: &Settings,
) -> Result<(), PlanError> {
    for (n, node) in cluster.nodes.iter().enumerate() {
        for (i, gpu) in node.gpus().unwrap_or_default().iter().enumerate() {
            let device = Device { node: n, gpu: i };
            if fabric.throughput(device).basis == ThroughputBasis::Unsupported {
                let dtype = match settings.training.precision {
                    Precision::Fp16 => Dtype::Fp16,
                    Precision::Bf16 | Precision::Fp32 => Dtype::Bf16,
                };
                return Err(PlanError::Time(TimeError::NoTensorCores {
                    host: node.host.clone(),
                    index: gpu.index,
                    name: gpu.name.clone(),
                    dtype,
                }));
            }
        }
    }
    Ok(())
}
