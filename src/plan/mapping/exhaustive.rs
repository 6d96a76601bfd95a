//! Exhaustive mapping search: every node order × every GPU order, one swap between
//! consecutive states (Heap's algorithm per component, combined like an odometer).

use super::objective::Objective;
use super::space::MappingSpace;
use super::walker::{Move, Walker};
use super::{MappingResult, SearchMethod};

/// Swaps of Heap's algorithm: from any arrangement of `n` items, `n! − 1` swaps visit
/// every arrangement once; `restart` begins another round from where the last ended.
#[derive(Debug, Clone)]
pub(super) struct HeapSwaps {
    c: Vec<usize>,
    i: usize,
}

impl HeapSwaps {
    pub(super) fn new(n: usize) -> Self {
        HeapSwaps {
            c: vec![0; n],
            i: 1,
        }
    }

    pub(super) fn next_swap(&mut self) -> Option<(usize, usize)> {
        while self.i < self.c.len() {
            let i = self.i;
            if self.c[i] < i {
                let swap = if i % 2 == 0 { (0, i) } else { (self.c[i], i) };
                self.c[i] += 1;
                self.i = 1;
                return Some(swap);
            }
            self.c[i] = 0;
            self.i += 1;
        }
        None
    }

    pub(super) fn restart(&mut self) {
        self.c.fill(0);
        self.i = 1;
    }
}

/// Every node order (slowest) × every GPU order of each node whose order matters (when
/// `gpu_orders`), one swap between consecutive states.
pub(super) fn exhaustive<O: Objective>(
    objective: &mut O,
    space: &MappingSpace,
    mut walker: Walker,
    gpu_orders: bool,
) -> MappingResult {
    // Components, fastest first: a profile node's GPU order (the node carries it when it
    // changes rank), then the node order.
    let mut components: Vec<(Option<usize>, HeapSwaps)> = Vec::new();
    if gpu_orders {
        for node in (0..space.nodes).filter(|&n| space.gpu_order_matters(n)) {
            components.push((Some(node), HeapSwaps::new(space.gpus_per_node)));
        }
    }
    let gpu_components = components.len();
    for &(start, end) in &space.groups {
        components.push((None, HeapSwaps::new(end - start)));
    }
    // The node rank each node component's swaps are counted from.
    let starts: Vec<usize> = space.groups.iter().map(|g| g.0).collect();
    let enumerated_gpus = gpu_components > 0;

    let identity = objective.reset(&walker.devices);
    let mut best = identity;
    let mut evaluations = 1u64;
    'states: loop {
        let mut step = None;
        for (c, (node, heap)) in components.iter_mut().enumerate() {
            if let Some((a, b)) = heap.next_swap() {
                step = Some(match *node {
                    Some(node) => Move::Gpus {
                        slot: walker.slot_of[node],
                        a,
                        b,
                    },
                    None => {
                        let start = starts[c - gpu_components];
                        Move::Nodes(start + a, start + b)
                    }
                });
                break;
            }
            heap.restart();
        }
        let Some(m) = step else {
            break 'states;
        };
        walker.keep_best();
        let cost = walker.step(objective, m);
        evaluations += 1;
        if cost < best {
            best = cost;
            walker.at_best = true;
        }
    }
    walker.finish(
        best,
        identity,
        evaluations,
        SearchMethod::Exhaustive {
            gpu_orders: enumerated_gpus,
        },
    )
}
