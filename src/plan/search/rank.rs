//! What ranks the candidates: the objective's cost of a placement, each stage's memory
//! need, a stable order of configurations and a seed per mapped configuration.

use std::cmp::Ordering;

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
