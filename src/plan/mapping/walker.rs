//! The search state both searches walk: the current mapping, its devices, the moves
//! that swap node ranks or GPUs, and the best state seen.

use super::objective::Objective;
use super::space::MappingSpace;
use super::{MappingResult, MappingState, SearchMethod};
use crate::model::parallel::Device;

/// A move: swap two node ranks, or two local ranks' GPUs of one node rank.
#[derive(Debug, Clone, Copy)]
pub(super) enum Move {
    Nodes(usize, usize),
    Gpus { slot: usize, a: usize, b: usize },
}

/// The current state, its devices, and the best state seen.
pub(super) struct Walker {
    g: usize,
    pub(super) state: MappingState,
    pub(super) devices: Vec<Device>,
    /// Profile node → its node rank.
    pub(super) slot_of: Vec<usize>,
    best: MappingState,
    /// The current state is the best seen, and `best` has not been written yet.
    pub(super) at_best: bool,
    changed: Vec<usize>,
}

impl Walker {
    pub(super) fn new(space: &MappingSpace) -> Self {
        let state = MappingState::identity(space.nodes, space.gpus_per_node);
        Walker {
            g: space.gpus_per_node,
            devices: state.devices(),
            slot_of: (0..space.nodes).collect(),
            best: state.clone(),
            state,
            at_best: true,
            changed: Vec::with_capacity(2 * space.gpus_per_node),
        }
    }

    /// Applies `m` (its own inverse) to the state and the devices; `changed` lists the
    /// ranks it touched.
    pub(super) fn apply(&mut self, m: Move) {
        let g = self.g;
        self.changed.clear();
        match m {
            Move::Nodes(a, b) => {
                self.state.node_order.swap(a, b);
                self.state.gpu_order.swap(a, b);
                self.slot_of[self.state.node_order[a]] = a;
                self.slot_of[self.state.node_order[b]] = b;
                let (lo, hi) = (a.min(b), a.max(b));
                let (left, right) = self.devices.split_at_mut(hi * g);
                left[lo * g..(lo + 1) * g].swap_with_slice(&mut right[..g]);
                self.changed.extend(lo * g..(lo + 1) * g);
                self.changed.extend(hi * g..(hi + 1) * g);
            }
            Move::Gpus { slot, a, b } => {
                self.state.gpu_order[slot].swap(a, b);
                self.devices.swap(slot * g + a, slot * g + b);
                self.changed.push(slot * g + a);
                self.changed.push(slot * g + b);
            }
        }
    }

    /// Tells the objective that `m` may come next.
    #[inline]
    pub(super) fn prepare<O: Objective>(&self, objective: &O, m: Move) {
        if let Move::Nodes(a, b) = m {
            objective.prepare_node_swap(&self.devices, self.g, a, b);
        }
    }

    /// Applies `m` and evaluates the new state.
    #[inline]
    pub(super) fn step<O: Objective>(&mut self, objective: &mut O, m: Move) -> f64 {
        self.apply(m);
        match m {
            Move::Nodes(..) => objective.update(&self.devices, &self.changed),
            Move::Gpus { .. } => objective.update_within_nodes(&self.devices, &self.changed),
        }
    }

    /// Before leaving a state that is the best seen, keep a copy of it.
    #[inline]
    pub(super) fn keep_best(&mut self) {
        if self.at_best {
            self.best.clone_from(&self.state);
            self.at_best = false;
        }
    }

    /// Makes the best state seen the current one.
    pub(super) fn restore_best(&mut self) {
        self.keep_best();
        self.state.clone_from(&self.best);
        self.devices = self.state.devices();
        for (slot, &node) in self.state.node_order.iter().enumerate() {
            self.slot_of[node] = slot;
        }
    }

    pub(super) fn finish(
        &mut self,
        cost_ms: f64,
        identity_ms: f64,
        evaluations: u64,
        method: SearchMethod,
    ) -> MappingResult {
        self.keep_best();
        MappingResult {
            state: std::mem::replace(&mut self.best, MappingState::identity(0, 0)),
            cost_ms,
            identity_ms,
            evaluations,
            method,
        }
    }
}
