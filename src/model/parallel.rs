//! The vocabulary of parallelism shared by the cost models and the planner: how a model
//! is split ([`ParallelConfig`]) and where each rank runs ([`Placement`]).

use serde::{Deserialize, Serialize};

use crate::config::{ModelSpec, Recompute};

/// One point of the search space: how the model and the batch are split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParallelConfig {
    /// Tensor-parallel size.
    pub tp: u64,
    /// Pipeline-parallel size (number of stages).
    pub pp: u64,
    /// Data-parallel size.
    pub dp: u64,
    /// Context-parallel size: 1 until context parallelism is planned.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub cp: u64,
    /// Expert-parallel size: the routed experts of a layer are split over this many ranks,
    /// folded out of the attention layout's tp × cp × dp ranks (Megatron's MoE Parallel
    /// Folding); 1 for a dense model.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub ep: u64,
    /// Expert tensor-parallel size: each expert's MLP split over this many ranks.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub etp: u64,
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

/// The first decoder layer of each stage: stages hold consecutive layers, the first from
/// layer 0. With dense and MoE layers mixed (`--moe-layer-freq`: DeepSeek-V3's first three
/// dense) a stage's cost depends on which layers it holds, not only how many: pass these to
/// [`crate::model::params::ParameterBreakdown::stage_from`] and its kin.
pub fn stage_starts(layers_per_stage: &[u64]) -> Vec<u64> {
    layers_per_stage
        .iter()
        .scan(0u64, |start, layers| {
            let first = *start;
            *start = start.saturating_add(*layers);
            Some(first)
        })
        .collect()
}

fn one() -> u64 {
    1
}

// Sizes at 1 are left out of the JSON, so plans of dense models read as before.
fn is_one(n: &u64) -> bool {
    *n == 1
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
            cp: 1,
            ep: 1,
            etp: 1,
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

    /// The sizes as the supervisor's lines write them: `tp=2 pp=4 dp=1 micro-batch 2`,
    /// with `ep=8 etp=1` after dp when experts are split.
    pub fn sizes_text(&self) -> String {
        format!(
            "tp={} pp={} dp={}{}{} micro-batch {}",
            self.tp,
            self.pp,
            self.dp,
            if self.cp > 1 {
                format!(" cp={}", self.cp)
            } else {
                String::new()
            },
            self.expert_text(),
            self.micro_batch
        )
    }

    /// ` ep=8 etp=1` when experts are split over more than one rank, else empty.
    fn expert_text(&self) -> String {
        if self.ep > 1 || self.etp > 1 {
            format!(" ep={} etp={}", self.ep, self.etp)
        } else {
            String::new()
        }
    }

    /// Ranks in the job: tp × cp × dp × pp (experts are folded into them).
    pub fn world_size(&self) -> u64 {
        self.tp * self.cp * self.pp * self.dp
    }

    /// Expert data-parallel size: the ranks holding the same experts, which reduce their
    /// gradients together, world / (pp · ep · etp) (Megatron's parallel_state).
    pub fn expert_dp(&self) -> u64 {
        (self.tp * self.cp * self.dp) / (self.ep * self.etp).max(1)
    }

    /// Megatron's rules for the expert layout (megatron-core 0.19.2), checked before any
    /// cost: `None` when `model` can train under this configuration, else why not, with
    /// the option to change. A dense model needs ep = etp = 1.
    pub fn expert_layout_error(&self, model: &ModelSpec) -> Option<String> {
        let Some(moe) = &model.moe else {
            return (self.ep > 1 || self.etp > 1).then(|| {
                format!(
                    "ep={} etp={} needs a model with experts (Megatron refuses expert parallelism without --num-experts)",
                    self.ep, self.etp
                )
            });
        };
        let (ep, etp) = (self.ep.max(1), self.etp.max(1));
        if moe.num_experts % ep != 0 {
            // arguments.py 1600-1603
            return Some(format!(
                "ep={ep} does not divide the {} experts (Megatron needs --num-experts divisible by --expert-model-parallel-size)",
                moe.num_experts
            ));
        }
        let attention = self.tp * self.cp * self.dp;
        if attention % (ep * etp) != 0 {
            // parallel_state.initialize_model_parallel: world % (etp·ep·pp) == 0, with the
            // expert groups folded out of each stage's tp·cp·dp ranks.
            return Some(format!(
                "ep={ep} × etp={etp} does not divide tp={} × cp={} × dp={} = {attention} (Megatron folds the expert groups out of each pipeline stage's ranks)",
                self.tp, self.cp, self.dp
            ));
        }
        if self.tp > 1 && !self.sequence_parallel {
            // moe_layer.py 629-633: an MoE layer refuses to train at tp > 1 without it.
            return Some(format!(
                "tp={} without sequence parallelism (Megatron's MoE layer refuses to train with tensor parallelism unless --sequence-parallel is on)",
                self.tp
            ));
        }
        None
    }

    /// Micro-batches per iteration and pipeline: global batch / (micro-batch × dp).
    pub fn num_microbatches(&self, global_batch: u64) -> u64 {
        global_batch / (self.micro_batch * self.dp).max(1)
    }

    /// Megatron's rank order is tp-cp-ep-dp-pp (tp fastest): the coordinates of `rank` in
    /// the attention layout (tp-cp-dp-pp; cp is 1 until it is planned).
    pub fn coordinates(&self, rank: u64) -> RankCoordinates {
        let tcp = self.tp * self.cp;
        RankCoordinates {
            tp: rank % self.tp,
            dp: (rank / tcp) % self.dp,
            pp: rank / (tcp * self.dp),
        }
    }

    /// The global rank at these coordinates (inverse of [`ParallelConfig::coordinates`]).
    pub fn rank(&self, at: RankCoordinates) -> u64 {
        at.tp + self.tp * self.cp * (at.dp + self.dp * at.pp)
    }

    /// The coordinates of `rank` in the expert layout, which Megatron's second rank
    /// generator orders etp-ep-edp-pp inside the same pipeline stages: an expert-parallel
    /// group is `ep` ranks `etp` apart, so with etp ≤ tp it stays inside the ranks that a
    /// node's contiguous block holds first.
    pub fn expert_coordinates(&self, rank: u64) -> ExpertCoordinates {
        let (ep, etp) = (self.ep.max(1), self.etp.max(1));
        let in_stage = rank % (self.tp * self.cp * self.dp);
        ExpertCoordinates {
            etp: in_stage % etp,
            ep: (in_stage / etp) % ep,
            edp: in_stage / (etp * ep),
            pp: rank / (self.tp * self.cp * self.dp),
        }
    }
}

/// Where a rank sits in the tp × dp × pp grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RankCoordinates {
    pub tp: u64,
    pub dp: u64,
    pub pp: u64,
}

/// Where a rank sits in the expert layout: etp × ep × expert-dp × pp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExpertCoordinates {
    pub etp: u64,
    pub ep: u64,
    pub edp: u64,
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
    fn expert_groups_fold_out_of_each_stage() {
        // 2 stages of tp=2 × dp=4 = 8 ranks; ep=4 etp=1 leaves an expert-dp of 2.
        let c = ParallelConfig {
            ep: 4,
            etp: 1,
            ..ParallelConfig::even(8, 2, 2, 4, 1)
        };
        assert_eq!((c.world_size(), c.expert_dp()), (16, 2));
        let e = |r| {
            let x = c.expert_coordinates(r);
            (x.etp, x.ep, x.edp, x.pp)
        };
        assert_eq!(e(0), (0, 0, 0, 0));
        assert_eq!(e(1), (0, 1, 0, 0));
        assert_eq!(e(3), (0, 3, 0, 0));
        assert_eq!(e(4), (0, 0, 1, 0));
        assert_eq!(e(9), (0, 1, 0, 1));
        // Ranks 0..4 (one expert-parallel group) are contiguous: one node's block.
        let group: Vec<u64> = (0..8)
            .filter(|r| c.expert_coordinates(*r).edp == 0)
            .collect();
        assert_eq!(group, vec![0, 1, 2, 3]);
    }

    #[test]
    fn megatrons_expert_layout_rules() {
        let spec = |experts: Option<u64>| {
            let mut m = crate::config::presets::lookup("gpt3-1.3b")
                .unwrap()
                .model()
                .unwrap();
            m.moe = experts.map(|n| crate::config::MoeSpec {
                num_experts: n,
                router_topk: 2,
                ffn_hidden_size: 64,
                shared_expert_ffn: None,
                shared_expert_overlap: false,
                layers: vec![true; m.num_layers as usize],
                grouped_gemm: false,
                dispatcher: crate::config::Dispatcher::Alltoall,
                load_balancing: crate::config::LoadBalancing::AuxLoss,
                capacity_factor: None,
                pad_to_capacity: false,
                drop_policy: crate::config::DropPolicy::Probs,
                expert_bias: false,
            });
            m
        };
        let with = |tp, dp, ep, etp, sp| ParallelConfig {
            ep,
            etp,
            sequence_parallel: sp,
            ..ParallelConfig::even(24, tp, 1, dp, 1)
        };
        assert_eq!(
            with(1, 8, 8, 1, false).expert_layout_error(&spec(Some(8))),
            None
        );
        // EP larger than DP is fine once folded: tp 2 × dp 4 = 8 = ep 8.
        assert_eq!(
            with(2, 4, 8, 1, true).expert_layout_error(&spec(Some(8))),
            None
        );
        for (c, experts, needle) in [
            (
                with(1, 8, 8, 1, false),
                Some(12),
                "does not divide the 12 experts",
            ),
            (with(2, 2, 4, 2, true), Some(8), "does not divide tp=2"),
            (with(2, 4, 4, 1, false), Some(8), "sequence parallelism"),
            (with(1, 8, 2, 1, false), None, "needs a model with experts"),
        ] {
            let why = c.expert_layout_error(&spec(experts)).expect(needle);
            assert!(why.contains(needle), "{why}");
        }
    }

    #[test]
    fn old_plans_without_expert_sizes_still_read() {
        let mut json = serde_json::to_value(ParallelConfig::even(4, 1, 1, 2, 1)).unwrap();
        for key in ["cp", "ep", "etp"] {
            json.as_object_mut().unwrap().remove(key);
        }
        let c: ParallelConfig = serde_json::from_value(json).unwrap();
        assert_eq!((c.cp, c.ep, c.etp), (1, 1, 1));
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
