//! The mapping space of one cluster ([`MappingSpace`]): nodes, GPUs per node, node groups
//! that confine node swaps, and which nodes gain nothing from reordering their GPUs.

use super::MappingError;
use crate::model::parallel::Device;
use crate::model::time::{ClusterFabric, Fabric};

/// The shape of the mapping space of one cluster: its nodes, their GPU count and which
/// nodes gain nothing from reordering their GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingSpace {
    pub(super) nodes: usize,
    pub(super) gpus_per_node: usize,
    /// Per profile node: every GPU pair equally fast and every GPU equally fast.
    symmetric: Vec<bool>,
    /// Runs of node ranks `start..end` inside which nodes may trade places, in order,
    /// covering every node rank.
    pub(super) groups: Vec<(usize, usize)>,
}

impl MappingSpace {
    /// The space of `fabric`'s cluster. `hosts` names the nodes in errors.
    pub fn new(fabric: &ClusterFabric, hosts: &[&str]) -> Result<Self, MappingError> {
        let nodes = fabric.node_count();
        if nodes == 0 {
            return Err(MappingError::NoNodes);
        }
        let g = fabric.gpus_on(0);
        let host = |n: usize| {
            hosts
                .get(n)
                .map_or_else(|| format!("node #{n}"), |h| h.to_string())
        };
        if let Some(n) = (0..nodes).find(|&n| fabric.gpus_on(n) != g) {
            return Err(MappingError::MixedGpuCounts {
                host: host(n),
                gpus: fabric.gpus_on(n),
                first_host: host(0),
                first_gpus: g,
            });
        }
        let symmetric = (0..nodes)
            .map(|n| node_is_symmetric(fabric, n, g))
            .collect();
        Ok(MappingSpace {
            nodes,
            gpus_per_node: g,
            symmetric,
            groups: vec![(0, nodes)],
        })
    }

    /// A space of `nodes` nodes of `gpus_per_node` GPUs, `symmetric[n]` telling whether
    /// node `n`'s GPU order is irrelevant.
    pub fn from_parts(nodes: usize, gpus_per_node: usize, symmetric: Vec<bool>) -> Self {
        assert_eq!(symmetric.len(), nodes, "one symmetry flag per node");
        MappingSpace {
            nodes,
            gpus_per_node,
            symmetric,
            groups: vec![(0, nodes)],
        }
    }

    /// The same space with node swaps confined to consecutive runs of node ranks of these
    /// sizes (they must add up to the nodes); see the module doc.
    pub fn with_node_groups(mut self, sizes: &[usize]) -> Self {
        assert_eq!(
            sizes.iter().sum::<usize>(),
            self.nodes,
            "node groups cover every node"
        );
        let mut start = 0;
        self.groups = sizes
            .iter()
            .filter(|&&n| n > 0)
            .map(|&n| {
                start += n;
                (start - n, start)
            })
            .collect();
        self
    }

    /// The runs of node ranks inside which nodes may trade places.
    pub fn node_groups(&self) -> &[(usize, usize)] {
        &self.groups
    }

    /// The group (`start..end`) holding node rank `slot`.
    pub(super) fn group_of(&self, slot: usize) -> (usize, usize) {
        *self
            .groups
            .iter()
            .find(|(start, end)| (*start..*end).contains(&slot))
            .expect("groups cover every node rank")
    }

    pub fn nodes(&self) -> usize {
        self.nodes
    }

    pub fn gpus_per_node(&self) -> usize {
        self.gpus_per_node
    }

    /// GPUs in the cluster.
    pub fn world_size(&self) -> usize {
        self.nodes * self.gpus_per_node
    }

    /// Whether reordering node `node`'s GPUs can change any cost.
    pub fn gpu_order_matters(&self, node: usize) -> bool {
        self.gpus_per_node > 1 && !self.symmetric[node]
    }

    /// States an exhaustive search visits: node orders × (GPU orders of every node whose
    /// order matters, when `gpu_orders`). `None` beyond `u64`.
    pub fn states(&self, gpu_orders: bool) -> Option<u64> {
        let mut total = 1u64;
        for (start, end) in &self.groups {
            total = total.checked_mul(factorial((end - start) as u64)?)?;
        }
        if gpu_orders {
            let per_node = factorial(self.gpus_per_node as u64)?;
            for node in 0..self.nodes {
                if self.gpu_order_matters(node) {
                    total = total.checked_mul(per_node)?;
                }
            }
        }
        Some(total)
    }
}

pub(super) fn factorial(n: u64) -> Option<u64> {
    (1..=n).try_fold(1u64, |acc, k| acc.checked_mul(k))
}

/// Every GPU pair of the node equally fast, every GPU equally fast.
fn node_is_symmetric(fabric: &ClusterFabric, node: usize, g: usize) -> bool {
    let device = |gpu| Device { node, gpu };
    let speed = fabric.ms_per_gflop(device(0));
    if (1..g).any(|i| fabric.ms_per_gflop(device(i)).to_bits() != speed.to_bits()) {
        return false;
    }
    if g < 2 {
        return true;
    }
    let link = fabric.gb_per_s(device(0), device(1));
    (0..g).all(|i| {
        (0..g).all(|j| i == j || fabric.gb_per_s(device(i), device(j)).to_bits() == link.to_bits())
    })
}
