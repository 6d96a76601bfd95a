//! [`DispatchMemo`]: the all-to-all of an expert-parallel group that lies inside one node,
//! remembered per node and set of GPUs, for the incremental objective.
//!
//! Why it is exact: with every member on node `N`, [`ConfigCosts::group_dispatch`] finds a
//! single run of members, so no member sends over the network (`off = 0`) and each has
//! `on_node = ep`; member `i`'s figure is `member_dispatch` of its slowest link to the
//! others (a minimum of `gb_per_s` inside `N`) and its GPU's latency, and the group's
//! `ms` is the largest member's. A minimum and a maximum do not depend on the order of
//! their terms (`f64::min` and the `>` of the search both pass over a NaN whichever comes
//! first), and nothing else is read: the figure is a function of `N` and the set of its
//! GPUs the members hold (plus the fixed costs and fabric), so the remembered figure is
//! the one a new evaluation returns, bit for bit. A node swap moves a group whole to
//! another node's GPUs, which the mapping search visits again and again.

use crate::model::parallel::Device;
use crate::model::time::{ConfigCosts, Fabric};

/// Remembered figures per node (a few sets of GPUs each: the groups one node holds).
const WAYS: usize = 4;

/// Per node, up to [`WAYS`] `(GPU set as a bit mask, ms)` pairs; mask 0 is an empty way (a
/// group has two members at least).
pub(super) struct DispatchMemo {
    ways: Vec<[(u64, f64); WAYS]>,
    /// Per stage rank, the expert-parallel group's members (`members` ranks a group, in
    /// rank order), so that a group's GPUs are read without the layout's arithmetic.
    members: Vec<u32>,
    size: usize,
}

impl DispatchMemo {
    /// A memo for `costs` (empty when it has no expert-parallel groups).
    pub(super) fn new(costs: &ConfigCosts, stage_ranks: usize) -> Self {
        let groups = costs.expert_groups();
        if groups == 0 {
            return DispatchMemo {
                ways: Vec::new(),
                members: Vec::new(),
                size: 0,
            };
        }
        let mut by_group: Vec<Vec<u32>> = vec![Vec::new(); groups];
        for r in 0..stage_ranks {
            by_group[costs.expert_group_of(r)].push(r as u32);
        }
        let size = by_group[0].len();
        debug_assert!(by_group.iter().all(|g| g.len() == size));
        DispatchMemo {
            ways: Vec::new(),
            members: by_group.concat(),
            size,
        }
    }

    /// [`ConfigCosts::group_dispatch`]`(fabric, devices, s, group).ms`, from the memo when
    /// the group lies inside one node whose GPUs number 64 or fewer.
    pub(super) fn ms(
        &mut self,
        costs: &ConfigCosts,
        fabric: &(impl Fabric + ?Sized),
        devices: &[Device],
        s: usize,
        group: usize,
    ) -> f64 {
        let stage = &devices[s * (devices.len() / costs.pp().max(1))..];
        let members = &self.members[group * self.size..(group + 1) * self.size];
        let node = stage[members[0] as usize].node;
        let mut mask = 0u64;
        for &r in members {
            let d = stage[r as usize];
            if d.node != node || d.gpu >= 64 {
                return costs.group_dispatch(fabric, devices, s, group).ms;
            }
            mask |= 1u64 << d.gpu;
        }
        if node >= self.ways.len() {
            self.ways.resize(node + 1, [(0, 0.0); WAYS]);
        }
        let ways = &mut self.ways[node];
        if let Some(&(_, ms)) = ways.iter().find(|w| w.0 == mask) {
            return ms;
        }
        let ms = costs.group_dispatch(fabric, devices, s, group).ms;
        // Replaced by the mask's hash, so that a node's few sets settle in distinct ways.
        let way = (mask.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 62) as usize % WAYS;
        ways[way] = (mask, ms);
        ms
    }
}
