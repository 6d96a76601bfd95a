//! Simulated annealing over mappings within a budget of evaluations: an opening walk to
//! set the temperature, geometric cooling, rounds resuming from the best state.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::objective::Objective;
use super::space::MappingSpace;
use super::walker::{Move, Walker};
use super::{MappingResult, SearchMethod};

/// Share of the budget spent on the opening random walk that measures the landscape.
const WALK_SHARE: u64 = 20;
/// The most evaluations the opening walk takes.
const WALK_MAX: u64 = 500;
/// Final temperature over initial temperature.
const COOLING: f64 = 1e-3;
/// Rounds of annealing: the temperature falls on, but each round after the first starts
/// from the best state seen. On the exhaustive checks of `tests/plan/plan_mapping.rs` and on
/// 64 to 1024 GPUs this found better mappings than one walk with the same budget.
const ROUNDS: u64 = 8;
/// The fewest evaluations a round gets (small budgets run fewer rounds).
const ROUND_MIN: u64 = 500;

/// Simulated annealing within `budget` evaluations (see the module doc).
pub(super) fn anneal<O: Objective>(
    objective: &mut O,
    space: &MappingSpace,
    mut walker: Walker,
    budget: u64,
    seed: u64,
) -> MappingResult {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let identity = objective.reset(&walker.devices);
    let mut evaluations = 1u64;
    let n = space.nodes;
    let g = space.gpus_per_node;
    let movable: Vec<usize> = (0..n).filter(|&p| space.gpu_order_matters(p)).collect();
    // Node ranks that have another in their group to trade places with.
    let swappable: Vec<usize> = space
        .groups
        .iter()
        .filter(|(start, end)| end - start >= 2)
        .flat_map(|&(start, end)| start..end)
        .collect();
    let node_swaps: usize = space
        .groups
        .iter()
        .map(|(start, end)| (end - start) * (end - start).saturating_sub(1) / 2)
        .sum();
    let node_moves = swappable.len() >= 2;
    if (!node_moves && movable.is_empty()) || budget <= 1 {
        return walker.finish(identity, identity, evaluations, SearchMethod::Anneal);
    }
    // Half the moves swap nodes (the slow links are between nodes), half swap GPUs. With
    // two or three nodes there are only 2 or 6 node orders: moves are then drawn uniformly
    // from the distinct swaps, a tenth of them at least swapping nodes.
    let node_share = match (node_moves, movable.is_empty()) {
        (true, true) => 1.0,
        (false, _) => 0.0,
        (true, false) if swappable.len() < 4 => {
            let node_swaps = node_swaps as f64;
            let gpu_swaps = (movable.len() * g * (g - 1) / 2) as f64;
            (node_swaps / (node_swaps + gpu_swaps)).clamp(0.1, 0.5)
        }
        (true, false) => 0.5,
    };
    let propose = |rng: &mut ChaCha8Rng, slot_of: &[usize]| -> Move {
        if rng.random::<f64>() < node_share {
            // With one group this draws exactly what an unconstrained walk draws.
            let a = swappable[rng.random_range(0..swappable.len())];
            let (start, end) = space.group_of(a);
            let k = end - start;
            let b = start + (a - start + rng.random_range(1..k)) % k;
            Move::Nodes(a, b)
        } else {
            let node = movable[rng.random_range(0..movable.len())];
            let a = rng.random_range(0..g);
            let b = (a + rng.random_range(1..g)) % g;
            Move::Gpus {
                slot: slot_of[node],
                a,
                b,
            }
        }
    };

    let mut current = identity;
    let mut best = identity;
    // The opening walk accepts every move and measures the typical uphill step.
    let walk = (budget / WALK_SHARE).clamp(1, WALK_MAX);
    let mut uphill = 0.0;
    let mut uphill_moves = 0u32;
    let mut steps = 0u64;
    let mut next = propose(&mut rng, &walker.slot_of);
    while steps < walk && evaluations < budget {
        let m = next;
        next = propose(&mut rng, &walker.slot_of);
        walker.prepare(objective, next);
        walker.keep_best();
        let cost = walker.step(objective, m);
        evaluations += 1;
        steps += 1;
        if cost > current {
            uphill += cost - current;
            uphill_moves += 1;
        }
        current = cost;
        if cost < best {
            best = cost;
            walker.at_best = true;
        }
    }
    // A typical uphill step is accepted with probability 1/e at the start of a round.
    let start = if uphill_moves > 0 {
        uphill / f64::from(uphill_moves)
    } else {
        best.abs() * 1e-9
    };
    // The tidy-up at the end gets its evaluations first.
    let tidy = ((n * (g + 1) + 1) as u64).min(budget / 10);
    let end = budget - tidy;
    // One geometric cooling over the whole budget; at the start of each round the walk
    // returns to the best state seen.
    let rounds = (end.saturating_sub(evaluations) / ROUND_MIN).clamp(1, ROUNDS);
    let factor = COOLING.powf(1.0 / end.saturating_sub(evaluations).max(1) as f64);
    let mut temperature = start;
    for round in 0..rounds {
        if evaluations >= end {
            break;
        }
        if round > 0 {
            walker.restore_best();
            current = objective.reset(&walker.devices);
            evaluations += 1;
        }
        let stop = evaluations + (end - evaluations) / (rounds - round);
        while evaluations < stop {
            let m = next;
            next = propose(&mut rng, &walker.slot_of);
            walker.prepare(objective, next);
            // The copy of the best state is taken only when a move may leave it.
            walker.keep_best();
            let cost = walker.step(objective, m);
            evaluations += 1;
            let delta = cost - current;
            let accept = delta <= 0.0 || rng.random::<f64>() < (-delta / temperature).exp();
            if accept {
                current = cost;
                if cost < best {
                    best = cost;
                    walker.at_best = true;
                }
            } else {
                walker.apply(m);
                objective.revert();
            }
            temperature *= factor;
        }
    }

    // Tidy up: from the best state, put nodes and GPUs back in index order wherever that
    // costs nothing, so that the plan moves only what pays (annealing drifts freely over
    // moves that change nothing).
    if evaluations < budget && !walker.at_best {
        walker.restore_best();
        current = objective.reset(&walker.devices);
        evaluations += 1;
    }
    // Keeps a tidying move unless it costs more.
    let mut try_move = |walker: &mut Walker, objective: &mut O, m: Move, evaluations: &mut u64| {
        let cost = walker.step(objective, m);
        *evaluations += 1;
        if cost <= current {
            current = cost;
            if cost < best {
                best = cost;
            }
            walker.at_best = true;
        } else {
            walker.apply(m);
            objective.revert();
        }
    };
    for position in 0..n {
        let node = walker.state.node_order[position];
        if node != position && evaluations < budget {
            let there = walker.slot_of[position];
            try_move(
                &mut walker,
                objective,
                Move::Nodes(position, there),
                &mut evaluations,
            );
        }
    }
    for slot in 0..n {
        for local in 0..g {
            let gpu = walker.state.gpu_order[slot][local];
            if gpu != local && evaluations < budget {
                let there = walker.state.gpu_order[slot]
                    .iter()
                    .position(|&x| x == local)
                    .expect("a permutation");
                try_move(
                    &mut walker,
                    objective,
                    Move::Gpus {
                        slot,
                        a: local,
                        b: there,
                    },
                    &mut evaluations,
                );
            }
        }
    }
    walker.finish(best, identity, evaluations, SearchMethod::Anneal)
}
