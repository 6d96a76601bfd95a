//! Link lookups for the incremental objective: [`Links`] (prefetching a move's links) and
//! [`PairFabric`], both directions of a node pair in one cache line.

use crate::model::parallel::Device;
use crate::model::time::{ClusterFabric, Fabric};

/// A [`ClusterFabric`] with the node pairs' bandwidths laid out for the mapping search:
/// both directions of a node pair side by side, so that a pipeline hop (activation one
/// way, gradient back) reads one cache line, not two rows of a matrix that on a large
/// cluster is far bigger than the caches. Returns exactly the fabric's figures.
pub struct PairFabric<'a> {
    inner: &'a ClusterFabric,
    /// `[from lo to hi, from hi to lo]` for every node pair lo < hi, at `hi·(hi−1)/2 + lo`.
    pairs: Vec<[f64; 2]>,
}

impl<'a> PairFabric<'a> {
    pub fn new(inner: &'a ClusterFabric) -> Self {
        // A sampled profile's links are a figure per node plus a few pairs: a table of
        // every pair would be the n² the sample avoids (10,000 nodes: 800 MB).
        if inner.node_links_sampled() {
            return PairFabric {
                inner,
                pairs: Vec::new(),
            };
        }
        let n = inner.node_count();
        let first = |node| Device { node, gpu: 0 };
        let mut pairs = Vec::with_capacity(n * n.saturating_sub(1) / 2);
        for hi in 0..n {
            for lo in 0..hi {
                pairs.push([
                    inner.gb_per_s(first(lo), first(hi)),
                    inner.gb_per_s(first(hi), first(lo)),
                ]);
            }
        }
        PairFabric { inner, pairs }
    }
}

impl Fabric for PairFabric<'_> {
    #[inline]
    fn gb_per_s(&self, from: Device, to: Device) -> f64 {
        if from.node == to.node || self.pairs.is_empty() {
            return self.inner.gb_per_s(from, to);
        }
        let (lo, hi, way) = if from.node < to.node {
            (from.node, to.node, 0)
        } else {
            (to.node, from.node, 1)
        };
        self.pairs[hi * (hi - 1) / 2 + lo][way]
    }

    #[inline]
    fn ms_per_gflop(&self, device: Device) -> f64 {
        self.inner.ms_per_gflop(device)
    }

    #[inline]
    fn gpu_perf(&self, device: Device) -> crate::model::time::GpuPerf {
        self.inner.gpu_perf(device)
    }

    #[inline]
    fn nic_share(&self, node: usize, members: usize) -> f64 {
        self.inner.nic_share(node, members)
    }

    #[inline]
    fn dp_ring_nic_share(&self, node: usize, tp: usize) -> f64 {
        self.inner.dp_ring_nic_share(node, tp)
    }

    #[inline]
    fn over_network(&self, a: usize, b: usize) -> bool {
        self.inner.over_network(a, b)
    }
}

/// A [`Fabric`] that can be asked to bring a link's figure into the cache ahead of use.
pub trait Links: Fabric {
    /// Starts fetching the bandwidth from `from` to `to` (a hint; may do nothing).
    #[inline]
    fn prefetch(&self, _from: Device, _to: Device) {}
}

impl Links for ClusterFabric {}

impl Links for PairFabric<'_> {
    #[inline]
    fn prefetch(&self, from: Device, to: Device) {
        if from.node == to.node {
            return;
        }
        let (lo, hi) = (from.node.min(to.node), from.node.max(to.node));
        let Some(entry) = self.pairs.get(hi * (hi - 1) / 2 + lo) else {
            return;
        };
        // A plain read the optimiser must keep (`black_box`): the out-of-order core issues
        // it at once and runs on without waiting for it, so the link's cache line is on its
        // way before the move that needs it, as a prefetch instruction would have it, with
        // no `unsafe` and on every architecture.
        std::hint::black_box(entry[0]);
    }
}

/// From this many nodes on, the node-pair table (16 bytes a pair: 2 MB at 512 nodes)
/// outgrows a core's L2 cache and node swaps fetch their links ahead (below it the
/// prefetches cost more than they save).
pub const PREFETCH_NODES: usize = 512;
