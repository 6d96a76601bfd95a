//! What ranks the candidates: the objective's cost of a placement, each stage's memory
//! need, a stable order of configurations and a seed per mapped configuration.

use std::cmp::Ordering;

use rayon::prelude::*;

use crate::config::{Recompute, RecomputeMethod, Settings};
use crate::model::calibration::Calibration;
use crate::model::memory::estimate_memory;
use crate::model::parallel::{Device, ParallelConfig};
use crate::model::time::{compat::pipette_compat_ms, ClusterFabric, ConfigCosts, TimeModel};

/// A stable order of configurations, independent of how the space was enumerated.
pub(super) fn config_key(c: &ParallelConfig) -> impl Ord + '_ {
    let recompute = match &c.recompute {
        Recompute::None => (0, 0, 0),
        Recompute::Selective => (1, 0, 0),
        Recompute::Full { method, num_layers } => (
            2,
            match method {
                RecomputeMethod::Uniform => 0,
                RecomputeMethod::Block => 1,
            },
            *num_layers,
        ),
    };
    (
        c.tp,
        c.pp,
        c.dp,
        c.micro_batch,
        c.vpp.unwrap_or(1),
        recompute,
        c.sequence_parallel,
        c.distributed_optimizer,
        &c.layers_per_stage,
        (c.ep, c.etp),
    )
}

/// Orders (cost, configuration) pairs: lower cost first, then the stable key.
pub(super) fn by_cost(a: (f64, &ParallelConfig), b: (f64, &ParallelConfig)) -> Ordering {
    a.0.total_cmp(&b.0)
        .then_with(|| config_key(a.1).cmp(&config_key(b.1)))
}

/// The best `k` of the items `0..n` with their values, in the order `order` gives
/// (values first, lower first, then a tie-break; equal items keep their index order): what
/// evaluating every item and sorting them would keep, evaluating fewer. `bound(i)` must be
/// a lower bound of `value(i)` (`bound(i) ≤ value(i)`, as [`ConfigCosts::lower_bound_ms`] is).
///
/// Items are evaluated in the order of their bounds, a chunk at a time in parallel. Once
/// the next bound is above the k-th best value found, every item left has a value above it
/// too (its bound is at least as high, its value higher still) and would sort after the
/// k-th: none of them is evaluated. A bound equal to the k-th value is evaluated (it may
/// tie and win on the tie-break). The chunking changes the work, never the result.
pub(super) fn best(
    n: usize,
    k: usize,
    bound: impl Fn(usize) -> f64 + Sync,
    value: impl Fn(usize) -> f64 + Sync,
    order: impl Fn((usize, f64), (usize, f64)) -> Ordering,
) -> Vec<(usize, f64)> {
    let k = k.max(1);
    // A NaN bound bounds nothing: such an item goes first and is evaluated.
    let bounds: Vec<f64> = (0..n)
        .into_par_iter()
        .map(|i| match bound(i) {
            b if b.is_nan() => f64::NEG_INFINITY,
            b => b,
        })
        .collect();
    let mut queue: Vec<usize> = (0..n).collect();
    queue.sort_by(|&a, &b| bounds[a].total_cmp(&bounds[b]).then(a.cmp(&b)));
    // Enough per chunk to keep every thread busy and to fill the k best at once.
    let chunk = k.max(8 * rayon::current_num_threads());
    let mut kept: Vec<(usize, f64)> = Vec::with_capacity(k + chunk);
    let mut next = 0;
    while next < n {
        let end = (next + chunk).min(n);
        let take = match kept.get(k - 1) {
            Some(&(_, kth)) => queue[next..end]
                .iter()
                .take_while(|&&i| bounds[i].total_cmp(&kth).is_le())
                .count(),
            None => end - next,
        };
        if take == 0 {
            break;
        }
        let values: Vec<(usize, f64)> = queue[next..next + take]
            .par_iter()
            .map(|&i| (i, value(i)))
            .collect();
        kept.extend(values);
        kept.sort_by(|&a, &b| order(a, b).then(a.0.cmp(&b.0)));
        kept.truncate(k);
        next += take;
    }
    kept
}

/// Which of two configurations is simpler, for choosing among those the time model cannot
/// tell apart: fewer pipeline stages, then fewer virtual stages, then a smaller tp, then a
/// larger micro-batch, then less recomputation. Each step away from the simplest is where
/// the model is least sure and errs fast: on vTrain's measured runs its worst misses are
/// deep pipelines at small tp (39.1B, tp 2 pp 8–16: 30–40 % too fast), tiny micro-batches
/// at large tp (3.6B, micro-batch 2 at tp 4–8: 27–33 % too fast) and the many small kernels
/// and collectives of both; a shallower pipeline is also quicker to reshard and to restart.
/// Last, for experts: the smaller expert group (ep × etp: an all-to-all over fewer ranks,
/// sooner inside one node), then the smaller etp. Equal shapes compare equal (the caller then keeps the faster).
pub fn simpler(a: &ParallelConfig, b: &ParallelConfig) -> Ordering {
    let recompute = |c: &ParallelConfig| match c.recompute {
        Recompute::None => 0,
        Recompute::Selective => 1,
        Recompute::Full { .. } => 2,
    };
    let key = |c: &ParallelConfig| {
        (
            c.pp,
            c.vpp.unwrap_or(1),
            c.tp,
            std::cmp::Reverse(c.micro_batch),
            recompute(c),
            c.ep * c.etp,
            c.etp,
        )
    };
    key(a).cmp(&key(b))
}

/// A seed per mapped configuration, from the plan's seed and the configuration's rank
/// (SplitMix64's finaliser, so neighbouring ranks get unrelated streams).
pub fn derive_seed(seed: u64, index: usize) -> u64 {
    let mut z = seed.wrapping_add((index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The objective's value of `devices` for this configuration.
pub(super) fn cost(
    settings: &Settings,
    time_model: TimeModel,
    costs: &ConfigCosts,
    config: &ParallelConfig,
    fabric: &ClusterFabric,
    devices: &[Device],
) -> f64 {
    match time_model {
        TimeModel::PipetteCompat => {
            pipette_compat_ms(costs, &settings.model, config.micro_batch, fabric, devices)
        }
        _ => costs.evaluate(fabric, devices),
    }
}

pub(super) fn peak_bytes(
    settings: &Settings,
    config: &ParallelConfig,
    calibration: &Calibration,
) -> u64 {
    estimate_memory(&settings.model, &settings.training, config, calibration).peak_bytes
}

/// Every stage's memory need per GPU, first to last.
pub(super) fn stage_needs(
    settings: &Settings,
    config: &ParallelConfig,
    calibration: &Calibration,
) -> Vec<u64> {
    estimate_memory(&settings.model, &settings.training, config, calibration)
        .stages
        .iter()
        .map(|s| s.total_bytes)
        .collect()
}

#[cfg(test)]
mod tests {
    use rand::seq::SliceRandom;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::config::settings_from_megatron_args;
    use crate::model::parallel::Placement;
    use crate::model::time::{placement_kinds, ClusterFabric, TimeOptions};
    use crate::plan::space::{candidates, SpaceOptions};
    use crate::plan::subset::tests::cluster;

    fn preset(model: &str, args: &[&str]) -> Settings {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        settings_from_megatron_args(&args, Some(model), &[]).unwrap()
    }

    /// The bound is below the full evaluation for every configuration tried, on the
    /// default order and on shuffled ones, on nodes of three speeds and a node with slow
    /// links (so that replicas and expert groups differ and the bound's subsets miss): a
    /// mixture of experts (DeepSeek-V3: all-to-all, expert-DP, MLA, MTP), a dense model
    /// with long sequences (context parallelism) and one with the interleaved schedule.
    #[test]
    fn the_lower_bound_never_exceeds_the_evaluation() {
        let cases = [
            preset("deepseek-v3", &[]),
            preset(
                "llama3-8b",
                &[
                    "--seq-length",
                    "65536",
                    "--max-position-embeddings",
                    "65536",
                ],
            ),
            preset("gpt3-13b", &[]),
        ];
        let profile = cluster(&[312.0, 150.0, 312.0, 989.0], 8, &[1]);
        let calibration = Calibration::default();
        let mut rng = ChaCha8Rng::seed_from_u64(29);
        let mut checked = 0;
        let mut tight = 0;
        for settings in &cases {
            let fabric =
                ClusterFabric::new(&profile, settings.training.precision, &calibration).unwrap();
            let space = SpaceOptions {
                context_parallel_from: 1,
                ..SpaceOptions::default()
            };
            let all = candidates(settings, 4, 8, &space);
            assert!(all.len() > 40, "{} candidates", all.len());
            let mut devices = Placement::identity(32, 8).devices;
            let kinds = placement_kinds(&fabric, &devices);
            // Every few so that each model's share runs in well under a second.
            for config in all.iter().step_by(all.len() / 120 + 1) {
                let costs = ConfigCosts::new(
                    &settings.model,
                    &settings.training,
                    config,
                    &calibration,
                    &TimeOptions::default(),
                )
                .unwrap();
                for shuffle in 0..4 {
                    if shuffle > 0 {
                        devices.shuffle(&mut rng);
                    }
                    let bound = costs.lower_bound_ms(&fabric, &devices, kinds);
                    assert!(bound > 0.0, "{config:?}: bound {bound}");
                    let ms = costs.evaluate(&fabric, &devices);
                    assert!(bound <= ms, "{config:?}: bound {bound} > {ms} ms");
                    if bound >= 0.5 * ms {
                        tight += 1;
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked > 600, "{checked} evaluations checked");
        // A bound of 0 would pass the above and prune nothing: most are within 2× even on
        // this uneven cluster.
        assert!(tight * 2 > checked, "{tight} of {checked} within 2×");
    }

    /// [`best`] keeps what sorting every value keeps, in the same order, ties included,
    /// for bounds from exact to loose and any k; and it skips items once bounds pass.
    #[test]
    fn best_keeps_what_a_full_sort_keeps() {
        let mut rng = ChaCha8Rng::seed_from_u64(28);
        let mut skipped_somewhere = false;
        for round in 0..200 {
            let n = rng.random_range(1..300);
            // Few distinct values, so ties are common.
            let values: Vec<f64> = (0..n).map(|_| rng.random_range(0..40) as f64).collect();
            let slack = [0.0, 1.0, 10.0, 50.0][round % 4];
            let bounds: Vec<f64> = values
                .iter()
                .map(|v| v - slack * rng.random::<f64>())
                .collect();
            // A tie-break that is not the index, as the configurations' key.
            let key: Vec<u32> = (0..n).map(|_| rng.random_range(0..5)).collect();
            let order = |(i, a): (usize, f64), (j, b): (usize, f64)| {
                a.total_cmp(&b).then(key[i].cmp(&key[j]))
            };
            let k = rng.random_range(1..12);
            let evaluated = std::sync::atomic::AtomicUsize::new(0);
            let kept = best(
                n,
                k,
                |i| bounds[i],
                |i| {
                    evaluated.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    values[i]
                },
                order,
            );
            let mut all: Vec<(usize, f64)> = values.iter().copied().enumerate().collect();
            all.sort_by(|&a, &b| order(a, b));
            all.truncate(k);
            assert_eq!(kept, all, "round {round}: n {n}, k {k}");
            skipped_somewhere |= evaluated.into_inner() < n;
        }
        assert!(skipped_somewhere, "the bounds never pruned an item");
    }
}
