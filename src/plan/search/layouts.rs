//! The best configuration of every expert layout (ep × etp) that fits, beside the pick:
//! what the plan report holds the pick against to say, term by term, why its expert layout
//! wins (issue 29). The ranking keeps the best `top_k` overall, which on a mixture of
//! experts are often all of the pick's layout; here each other layout gets its own best,
//! found from the same bounds and values over that layout's configurations alone.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::Serialize;

use super::options::PlanOptions;
use crate::cluster::ClusterProfile;
use crate::config::Settings;
use crate::model::memory::estimate_memory;
use crate::model::parallel::{Device, ParallelConfig};
use crate::model::time::{ClusterFabric, ConfigCosts, TimeError, TimeEstimate};

/// The pick and the best of each other expert layout, all on the footing the ranking
/// compared them on: torchrun's default order of the plan's nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExpertLayouts {
    /// The configuration that runs, on the default order (its mapping is not counted, so
    /// that every difference is the layout's).
    pub pick: LayoutBest,
    /// The fastest configuration of every other (ep, etp) that fits, fastest first.
    pub others: Vec<LayoutBest>,
}

/// One layout's best configuration, its memory and its time model report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayoutBest {
    pub config: ParallelConfig,
    /// The estimated peak per GPU, and the weights, gradients and optimizer state of the
    /// stage with that peak.
    pub peak_memory_bytes: u64,
    pub weights_and_optimizer_bytes: u64,
    /// Every term, on torchrun's default order.
    pub time: TimeEstimate,
}

/// The best item of every layout of the items `0..n` (`layout(i)`), in `order` (values
/// first, lower first, then a tie-break): for a layout with an item among `ranked` (the
/// ranking's best `top_k`, in `order`), its first one there (a better one of the same
/// layout would rank before it); for the others, each layout's items in the order of their
/// bounds (`bound(i) ≤ value(i)`, a NaN bound bounding nothing, as in the ranking's `best`), evaluated
/// one by one until the next bound is above the best value found: what evaluating every
/// item would keep, with the fewest evaluations. Layouts run in parallel. One item per
/// layout, in `order`.
pub(super) fn best_per_layout(
    n: usize,
    layout: impl Fn(usize) -> (u64, u64),
    ranked: &[(usize, f64)],
    bound: impl Fn(usize) -> f64 + Sync,
    value: impl Fn(usize) -> f64 + Sync,
    order: impl Fn((usize, f64), (usize, f64)) -> Ordering + Sync,
) -> Vec<(usize, f64)> {
    let mut groups: BTreeMap<(u64, u64), Vec<usize>> = BTreeMap::new();
    for i in 0..n {
        groups.entry(layout(i)).or_default().push(i);
    }
    let mut out: Vec<(usize, f64)> = Vec::with_capacity(groups.len());
    let mut unranked: Vec<Vec<usize>> = Vec::new();
    for (key, items) in groups {
        match ranked.iter().find(|(i, _)| layout(*i) == key) {
            Some(&first) => out.push(first),
            None => unranked.push(items),
        }
    }
    let bound = |i: usize| match bound(i) {
        b if b.is_nan() => f64::NEG_INFINITY,
        b => b,
    };
    let found: Vec<Option<(usize, f64)>> = unranked
        .into_par_iter()
        .map(|mut items| {
            let bounds: Vec<f64> = items.iter().map(|&i| bound(i)).collect();
            let mut by_bound: Vec<usize> = (0..items.len()).collect();
            by_bound.sort_by(|&a, &b| bounds[a].total_cmp(&bounds[b]).then(a.cmp(&b)));
            let mut kept: Option<(usize, f64)> = None;
            for j in by_bound {
                // A bound equal to the best value may tie and win on the tie-break.
                if kept.is_some_and(|(_, v)| bounds[j].total_cmp(&v).is_gt()) {
                    break;
                }
                let item = (items[j], value(items[j]));
                if kept.is_none_or(|k| order(item, k).then(item.0.cmp(&k.0)).is_lt()) {
                    kept = Some(item);
                }
            }
            items.clear();
            kept
        })
        .collect();
    out.extend(found.into_iter().flatten());
    out.sort_by(|&a, &b| order(a, b).then(a.0.cmp(&b.0)));
    out
}

/// `config` on `devices` (profile positions): its memory and the time model's report.
pub(super) fn layout_best(
    settings: &Settings,
    options: &PlanOptions,
    config: &ParallelConfig,
    fabric: &ClusterFabric,
    cluster: &ClusterProfile,
    devices: &[Device],
) -> Result<LayoutBest, TimeError> {
    let costs = ConfigCosts::with_tables(
        &settings.model,
        &settings.training,
        config,
        &options.calibration,
        &options.time_options,
        fabric.tables(),
    )?;
    let memory = estimate_memory(
        &settings.model,
        &settings.training,
        config,
        &options.calibration,
    );
    Ok(LayoutBest {
        config: config.clone(),
        peak_memory_bytes: memory.peak_bytes,
        weights_and_optimizer_bytes: memory
            .stages
            .get(memory.peak_stage)
            .map_or(0, |s| s.weights_and_optimizer_bytes),
        time: costs.report(fabric, cluster, devices),
    })
}

#[cfg(test)]
mod tests {
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::super::rank::best;
    use super::*;

    /// Each layout's best is what sorting all of its items by value keeps first, ties
    /// included, whether or not the ranking's top k held one of that layout.
    #[test]
    fn each_layouts_best_is_its_first_in_a_full_sort() {
        let mut rng = ChaCha8Rng::seed_from_u64(29);
        for round in 0..100 {
            let n = rng.random_range(1..200);
            let values: Vec<f64> = (0..n).map(|_| rng.random_range(0..30) as f64).collect();
            let bounds: Vec<f64> = values
                .iter()
                .map(|v| v - 5.0 * rng.random::<f64>())
                .collect();
            let layouts: Vec<(u64, u64)> = (0..n)
                .map(|_| (1 << rng.random_range(0..4), 1 + rng.random_range(0..2)))
                .collect();
            let order =
                |(i, a): (usize, f64), (j, b): (usize, f64)| a.total_cmp(&b).then(i.cmp(&j));
            let k = rng.random_range(1..6);
            let ranked = best(n, k, |i| bounds[i], |i| values[i], order);
            let got = best_per_layout(
                n,
                |i| layouts[i],
                &ranked,
                |i| bounds[i],
                |i| values[i],
                order,
            );
            let mut all: Vec<(usize, f64)> = values.iter().copied().enumerate().collect();
            all.sort_by(|&a, &b| order(a, b));
            let mut want: Vec<(usize, f64)> = Vec::new();
            for item in all {
                if !want.iter().any(|(i, _)| layouts[*i] == layouts[item.0]) {
                    want.push(item);
                }
            }
            assert_eq!(got, want, "round {round}: n {n}, k {k}");
        }
    }
}
