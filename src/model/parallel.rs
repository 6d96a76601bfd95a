//! The vocabulary of parallelism shared by the cost models and the planner: how a model
//! is split ([`ParallelConfig`]) and where each rank runs ([`Placement`]).

use serde::{Deserialize, Serialize};

use crate::config::Recompute;

/// One point of the search space: how the model and the batch are split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParallelConfig {
    /// Tensor-parallel size.
    pub tp: u64,
    /// Pipeline-parallel size (number of stages).
    pub pp: u64,
    /// Data-parallel size.
    pub dp: u64,
    pub micro_batch: u64,
    /// Virtual stages (model chunks) per pipeline rank for the interleaved schedule;
    /// `None` is the plain 1F1B schedule.
    pub vpp: Option<u64>,
    pub recompute: Recompute,
    pub sequence_parallel: bool,
    pub distributed_optimizer: bool,
    /// Transformer layers on each pipeline stage, first to last; sums to the model's layers.
    pub layers_per_stage: Vec<u64>,
}

impl ParallelConfig {
    /// A configuration with the layers split evenly (the first stages take the remainder
    /// when `layers` is not a multiple of `pp`; planners that need Megatron's even split
    /// check divisibility themselves).
    pub fn even(layers: u64, tp: u64, pp: u64, dp: u64, micro_batch: u64) -> Self {
        let pp_nonzero = pp.max(1);
        let base = layers / pp_nonzero;
        let extra = layers % pp_nonzero;
        ParallelConfig {
            tp,
            pp,
            dp,
            micro_batch,
            vpp: None,
            recompute: Recompute::None,
            sequence_parallel: false,
            distributed_optimizer: false,
            layers_per_stage: (0..pp_nonzero)
                .map(|i| base + u64::from(i < extra))
                .collect(),
        }
    }

    /// What the configuration turns on beyond its sizes, as the reports write it after
    /// them: `, 3 virtual stages, selective recompute, sequence parallel, distributed
    /// optimizer` (empty when nothing is on).
    pub fn options_text(&self) -> String {
        let mut text = String::new();
        if let Some(v) = self.vpp {
            text.push_str(&format!(", {v} virtual stages"));
        }
        match self.recompute {
            Recompute::None => {}
            Recompute::Selective => text.push_str(", selective recompute"),
            Recompute::Full { .. } => text.push_str(", full recompute"),
        }
        if self.sequence_parallel {
            text.push_str(", sequence parallel");
        }
        if self.distributed_optimizer {
            text.push_str(", distributed optimizer");
        }
        text
    }

    /// The sizes as the supervisor's lines write them: `tp=2 pp=4 dp=1 micro-batch 2`.
    pub fn sizes_text(&self) -> String {
        format!(
            "tp={} pp={} dp={} micro-batch {}",
            self.tp, self.pp, self.dp, self.micro_batch
        )
    }

    /// Ranks in the job: tp × pp × dp.
    pub fn world_size(&self) -> u64 {
        self.tp * self.pp * self.dp
    }

    /// Micro-batches per iteration and pipeline: global batch / (micro-batch × dp).
    pub fn num_microbatches(&self, global_batch: u64) -> u64 {
        global_batch / (self.micro_batch * self.dp).max(1)
    }

    /// Megatron's rank order is tp-cp-ep-dp-pp (tp fastest): the coordinates of `rank`.
    pub fn coordinates(&self, rank: u64) -> RankCoordinates {
        RankCoordinates {
            tp: rank % self.tp,
            dp: (rank / self.tp) % self.dp,
            pp: rank / (self.tp * self.dp),
        }
    }

    /// The global rank at these coordinates (inverse of [`ParallelConfig::coordinates`]).
    pub fn rank(&self, at: RankCoordinates) -> u64 {
        at.tp + self.tp * (at.dp + self.dp * at.pp)
    }
}

/// Where a rank sits in the tp × dp × pp grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RankCoordinates {
    pub tp: u64,
    pub dp: u64,
    pub pp: u64,
}

/// A physical GPU: a node of the cluster profile and a GPU of that node (positions in
/// `ClusterProfile::nodes` and in that node's GPU list, not device indices).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Device {
    pub node: usize,
    pub gpu: usize,
}

/// Which GPU runs each global rank: `devices[rank]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub devices: Vec<Device>,
}

impl Placement {
    /// torchrun's default: node `n` takes ranks `n·g .. (n+1)·g` on its GPUs in order,
    /// for `gpus_per_node` GPUs on each of the first nodes.
    pub fn identity(world_size: usize, gpus_per_node: usize) -> Self {
        let g = gpus_per_node.max(1);
        Placement {
            devices: (0..world_size)
                .map(|r| Device {
                    node: r / g,
                    gpu: r % g,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_follow_megatrons_rank_order() {
        let c = ParallelConfig::even(8, 2, 2, 3, 1);
        assert_eq!(c.world_size(), 12);
        // tp fastest, then dp, then pp.
        assert_eq!(
            c.coordinates(0),
            RankCoordinates {
                tp: 0,
                dp: 0,
                pp: 0
            }
        );
        assert_eq!(
            c.coordinates(1),
            RankCoordinates {
                tp: 1,
                dp: 0,
                pp: 0
            }
        );
        assert_eq!(
            c.coordinates(2),
            RankCoordinates {
                tp: 0,
                dp: 1,
                pp: 0
            }
        );
        assert_eq!(
            c.coordinates(6),
            RankCoordinates {
                tp: 0,
                dp: 0,
                pp: 1
            }
        );
        for r in 0..12 {
            assert_eq!(c.rank(c.coordinates(r)), r);
        }
    }

    #[test]
    fn even_split_gives_the_remainder_to_the_first_stages() {
        assert_eq!(
            ParallelConfig::even(10, 1, 4, 1, 1).layers_per_stage,
            [3, 3, 2, 2]
        );
        assert_eq!(ParallelConfig::even(8, 1, 2, 1, 1).layers_per_stage, [4, 4]);
    }

    #[test]
    fn identity_placement_fills_nodes_in_order() {
        let p = Placement::identity(4, 2);
        assert_eq!(p.devices[3], Device { node: 1, gpu: 1 });
    }
}
