//! The cost function a mapping search evaluates ([`Objective`]), and [`FullObjective`],
//! which re-evaluates any cost function from scratch.

use crate::model::parallel::Device;

/// A cost function over placements that a search can evaluate state after state.
///
/// The search calls [`Objective::reset`] once, then for every move changes `devices` at
/// some ranks and calls [`Objective::update`] with them; to undo the move it restores
/// `devices` and calls [`Objective::revert`]. An update not reverted is kept.
pub trait Objective {
    /// Evaluates `devices` from scratch.
    fn reset(&mut self, devices: &[Device]) -> f64;
    /// `devices` changed at `ranks` since the last reset, kept update or revert: the new
    /// value.
    fn update(&mut self, devices: &[Device], ranks: &[usize]) -> f64;
    /// [`Objective::update`] for a change that kept every rank on its node (GPUs swapped
    /// inside a node), which an objective may exploit.
    fn update_within_nodes(&mut self, devices: &[Device], ranks: &[usize]) -> f64 {
        self.update(devices, ranks)
    }
    /// A hint that node ranks `a` and `b` (blocks of `gpus_per_node` ranks) may be swapped
    /// next: an objective may start fetching what that evaluation will read.
    fn prepare_node_swap(&self, _devices: &[Device], _gpus_per_node: usize, _a: usize, _b: usize) {}
    /// Undoes the last update.
    fn revert(&mut self);
}

/// Any cost function, re-evaluated from scratch on every update.
pub struct FullObjective<E> {
    eval: E,
    value: f64,
    saved: f64,
}

impl<E: FnMut(&[Device]) -> f64> FullObjective<E> {
    pub fn new(eval: E) -> Self {
        FullObjective {
            eval,
            value: f64::NAN,
            saved: f64::NAN,
        }
    }
}

impl<E: FnMut(&[Device]) -> f64> Objective for FullObjective<E> {
    fn reset(&mut self, devices: &[Device]) -> f64 {
        self.value = (self.eval)(devices);
        self.value
    }

    fn update(&mut self, devices: &[Device], _ranks: &[usize]) -> f64 {
        self.saved = self.value;
        self.value = (self.eval)(devices);
        self.value
    }

    fn revert(&mut self) {
        self.value = self.saved;
    }
}
