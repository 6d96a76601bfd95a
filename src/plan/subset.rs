//! Plans on the nodes that make the fastest job, the rest kept as hot spares.
//!
//! A layout must multiply out to the GPUs it runs on (tp × pp × dp) and dp must divide the
//! global batch, so many node counts have no layout at all (GPT-3 175B with a global batch
//! of 1536 on 127 nodes of 8 GPUs), and fewer nodes can be faster than all of them (a slow
//! NIC on the critical path). [`plan_subset`] therefore plans on a subset when that gives a
//! shorter iteration for the same global batch, or is the only plan:
//!
//! 1. **Order** the nodes best first by the profile ([`node_order`]): a node whose slowest
//!    GPU or whose links are markedly slower than the cluster's median goes to the back,
//!    the worst last; the others keep the profile's order. A subset of `n` nodes is the
//!    first `n`.
//! 2. **Counts** from divisibility, not from trying every count ([`useful_counts`]): for
//!    every shape (tp, pp) the largest count whose dp divides the global batch — more
//!    data-parallel ranks of the same shape only shorten the iteration — both on every
//!    allowed node and on the nodes that are not slow. A shape is ranked only on its count,
//!    so the ranking work is one plan's, spread over the counts.
//! 3. **Rank** each count on its shapes with the default rank order (no mapping search).
//! 4. **Plan** the best count in full (mapping search included), exactly as planning that
//!    count alone would. Fewer nodes win only when they are faster than the most nodes by
//!    more than the mapping threshold (the gain the model cannot tell from its error).
//!
//! The plan's positions are the whole profile's, and [`Plan::spares`] names the nodes it
//! leaves out. `--spares N` keeps at least N out, the worst measured; `--nnodes MIN:MAX`
//! asks that at least MIN be used ([`NodeBounds`]).
//!
//! Pure, like the rest of the planner.

use std::collections::BTreeMap;

use rayon::prelude::*;

use crate::cluster::ClusterProfile;
use crate::config::Settings;
use crate::model::parallel::Device;
use crate::model::time::ClusterFabric;
use crate::plan::search::{plan, MappingMode, Plan, PlanError, PlanOptions};
use crate::plan::space::{divisors, layer_splits};

/// How many of the profile's nodes a plan may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeBounds {
    /// The fewest nodes the plan may use (`--nnodes MIN:MAX`'s MIN; 1 by default).
    pub min_nodes: usize,
    /// The fewest nodes the plan must leave out as hot spares (`--spares`; 0 by default).
    pub spares: usize,
}

impl Default for NodeBounds {
    fn default() -> Self {
        NodeBounds {
            min_nodes: 1,
            spares: 0,
        }
    }
}

/// A node slower than the median by less than this share is as good as any: links and
/// matmul rates jitter by a few percent between measurements, and ordering on that noise
/// would shuffle the node ranks for nothing.
const SLOW_BEYOND: f64 = 0.05;

/// Plans `settings` on the best subset of `cluster`'s nodes within `options.nodes` (see
/// the module doc). Where no count but all the nodes is useful and no spare is asked for,
/// this is [`plan`] itself.
pub fn plan_subset(
    settings: &Settings,
    cluster: &ClusterProfile,
    options: &PlanOptions,
) -> Result<Plan, PlanError> {
    let bounds = options.nodes;
    let nodes = cluster.nodes.len();
    let gpus_per_node = match cluster.nodes.first().and_then(|n| n.gpus()) {
        Some(g) => g.len(),
        // The planner says what is wrong with the profile.
        None => return plan(settings, cluster, options),
    };
    let most = nodes.saturating_sub(bounds.spares);
    let fewest = bounds.min_nodes.max(1);
    if most < fewest {
        return Err(PlanError::TooFewNodes {
            nodes,
            spares: bounds.spares,
            left: most,
            min_nodes: fewest,
        });
    }
    let ranked = node_order(settings, cluster, options)?;
    let healthy = ranked
        .iter()
        .filter(|(_, slowness)| *slowness <= 1.0)
        .count();
    let order: Vec<usize> = ranked.iter().map(|(n, _)| *n).collect();
    let counts = useful_counts(
        settings,
        gpus_per_node as u64,
        fewest,
        &[most, healthy.min(most)],
        options.space.uneven_layers,
    );
    if bounds.spares == 0 && counts.keys().all(|&n| n == nodes) {
        return plan(settings, cluster, options);
    }

    // Rank every count on its own shapes, torchrun's order, no mapping search.
    let mut quick = options.clone();
    quick.mapping = MappingMode::Identity;
    quick.top_k = 1;
    quick.expert_layouts = false;
    let ranked_counts: Vec<(usize, Result<f64, PlanError>)> = counts
        .par_iter()
        .map(|(&n, shapes)| {
            let mut only = quick.clone();
            only.space.shapes = Some(shapes.clone());
            let sub = cluster.at_positions(&order[..n]);
            (
                n,
                plan(settings, &sub, &only).map(|p| p.estimate.iteration_ms),
            )
        })
        .collect();
    let mut ranked_ms: BTreeMap<usize, f64> = BTreeMap::new();
    let mut first_error = None;
    for (n, result) in ranked_counts {
        match result {
            Ok(ms) => {
                ranked_ms.insert(n, ms);
            }
            Err(e @ (PlanError::NoCandidates { .. } | PlanError::NothingFits { .. })) => {
                first_error.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    let Some(fastest) = ranked_ms.values().copied().min_by(f64::total_cmp) else {
        // No count plans: the error of the most nodes (the message users know).
        let sub = cluster.at_positions(&order[..most]);
        return match plan(settings, &sub, options) {
            Ok(p) => Ok(on_profile(p, cluster, &order, most)),
            Err(e) => Err(first_error.unwrap_or(e)),
        };
    };
    // The most nodes within the threshold of the fastest: fewer only when clearly faster.
    let chosen = ranked_ms
        .iter()
        .rev()
        .find(|(_, &ms)| ms <= fastest * (1.0 + options.mapping_threshold))
        .map_or(most, |(&n, _)| n);
    let sub = cluster.at_positions(&order[..chosen]);
    let full = plan(settings, &sub, options)?;
    Ok(on_profile(full, cluster, &order, chosen))
}

/// The profile's nodes best first, each with its slowness: 1 for a node within
/// [`SLOW_BEYOND`] of the median on both its slowest GPU's rate and its links' mean, else
/// the larger of median / its figure. Slow nodes go last, the slowest last of all; ties
/// keep the profile's order.
pub fn node_order(
    settings: &Settings,
    cluster: &ClusterProfile,
    options: &PlanOptions,
) -> Result<Vec<(usize, f64)>, PlanError> {
    let nodes = cluster.nodes.len();
    let fabric = ClusterFabric::new(cluster, settings.training.precision, &options.calibration)?;
    let gpu: Vec<f64> = (0..nodes)
        .map(|n| {
            let count = cluster.nodes[n].gpus().map_or(0, <[_]>::len);
            (0..count)
                .map(|g| fabric.throughput(Device { node: n, gpu: g }).tflops)
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    let link = node_link_means(cluster);
    let gpu_median = median(&gpu);
    let link_median = median(&link);
    let slowness = |figure: f64, median: f64| {
        if figure > 0.0 && median > 0.0 && figure.is_finite() {
            median / figure
        } else {
            1.0
        }
    };
    let mut order: Vec<(usize, f64)> = (0..nodes)
        .map(|n| {
            let s = slowness(gpu[n], gpu_median).max(slowness(link[n], link_median));
            (n, if s <= 1.0 + SLOW_BEYOND { 1.0 } else { s })
        })
        .collect();
    order.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    Ok(order)
}

/// Per node, the mean of its links to and from other nodes; on a sampled matrix at most the
/// node's own figure (the pairs not measured take it).
fn node_link_means(cluster: &ClusterProfile) -> Vec<f64> {
    let links = &cluster.node_links;
    let nodes = cluster.nodes.len();
    let mut sum = vec![0.0; nodes];
    let mut count = vec![0usize; nodes];
    for (a, b, gb) in links.links() {
        if a < nodes && b < nodes {
            for n in [a, b] {
                sum[n] += gb;
                count[n] += 1;
            }
        }
    }
    (0..nodes)
        .map(|n| {
            let measured = (count[n] > 0).then(|| sum[n] / count[n] as f64);
            match (measured, links.per_endpoint().and_then(|p| p.get(n))) {
                (Some(m), Some(&own)) => m.min(own),
                (None, Some(&own)) => own,
                (Some(m), None) => m,
                (None, None) => 0.0,
            }
        })
        .collect()
}

fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return 0.0;
    }
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// The node counts worth ranking, each with the shapes (tp, pp) ranked on it: for every
/// shape Megatron accepts (tp dividing the GPUs per node, the heads and the query groups;
/// a layer split for pp; the pins respected), the largest count in `fewest..=limit` whose
/// dp divides the global batch, for each limit in `limits`.
pub fn useful_counts(
    settings: &Settings,
    gpus_per_node: u64,
    fewest: usize,
    limits: &[usize],
    uneven_layers: bool,
) -> BTreeMap<usize, Vec<(u64, u64)>> {
    let model = &settings.model;
    let pins = &settings.constraints;
    let batch = settings.training.global_batch_size;
    let mut counts: BTreeMap<usize, Vec<(u64, u64)>> = BTreeMap::new();
    if gpus_per_node == 0 || batch == 0 {
        return counts;
    }
    // Descending, so that the first that fits is the largest.
    let dps: Vec<u64> = divisors(batch, u64::MAX)
        .into_iter()
        .rev()
        .filter(|dp| pins.data_parallel.is_none_or(|p| p == *dp))
        .collect();
    for tp in divisors(gpus_per_node, u64::MAX) {
        if model.num_attention_heads % tp != 0
            || model.num_query_groups % tp != 0
            || pins.tensor_parallel.is_some_and(|p| p != tp)
        {
            continue;
        }
        for pp in 1..=model.num_layers {
            if pins.pipeline_parallel.is_some_and(|p| p != pp)
                || layer_splits(model.num_layers, pp, uneven_layers).is_empty()
            {
                continue;
            }
            for &limit in limits {
                let found = dps.iter().find_map(|&dp| {
                    let gpus = tp.checked_mul(pp)?.checked_mul(dp)?;
                    let n = usize::try_from(gpus / gpus_per_node).ok()?;
                    (gpus % gpus_per_node == 0 && n <= limit && n >= fewest).then_some(n)
                });
                if let Some(n) = found {
                    let shapes = counts.entry(n).or_default();
                    if !shapes.contains(&(tp, pp)) {
                        shapes.push((tp, pp));
                    }
                }
            }
        }
    }
    counts
}

/// `plan`, made on the first `used` nodes of `order`, in the whole profile's positions,
/// with the other nodes as its spares (in the profile's order).
pub(crate) fn on_profile(
    mut plan: Plan,
    cluster: &ClusterProfile,
    order: &[usize],
    used: usize,
) -> Plan {
    let position = |n: usize| order[n];
    for device in &mut plan.placement.devices {
        device.node = position(device.node);
    }
    for n in &mut plan.mapping.state.node_order {
        *n = position(*n);
    }
    for top in &mut plan.top {
        for device in &mut top.placement.devices {
            device.node = position(device.node);
        }
    }
    let mut spares: Vec<usize> = order[used..].to_vec();
    spares.sort_unstable();
    plan.spares = spares
        .into_iter()
        .map(|n| cluster.nodes[n].host.clone())
        .collect();
    plan
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cluster::profile::{GpuInventory, GpuSpec, LinkMatrix, NodeProfile, PeakTflops};
    use crate::cluster::profile::{Provenance, Source};
    use crate::config::settings_from_megatron_args;

    pub(crate) fn settings(layers: u64, global: u64) -> Settings {
        let args: Vec<String> = format!(
            "--num-layers {layers} --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 \
             --max-position-embeddings 1024 --vocab-size 32000 --global-batch-size {global} --bf16"
        )
        .split_whitespace()
        .map(String::from)
        .collect();
        settings_from_megatron_args(&args, None, &[]).unwrap()
    }

    /// `tflops.len()` nodes `n0, n1, ...` of `per_node` GPUs at their node's rate, every node
    /// pair at 25 GB/s except those of the nodes in `slow_links`, at 2.5 GB/s.
    pub(crate) fn cluster(tflops: &[f64], per_node: usize, slow_links: &[usize]) -> ClusterProfile {
        let p = Provenance::new(Source::Estimated);
        let nodes = tflops.len();
        let rows: Vec<Vec<f64>> = (0..nodes)
            .map(|a| {
                (0..nodes)
                    .map(|b| {
                        if slow_links.contains(&a) || slow_links.contains(&b) {
                            2.5
                        } else {
                            25.0
                        }
                    })
                    .collect()
            })
            .collect();
        ClusterProfile {
            measured_perf: Vec::new(),
            note: None,
            nodes: tflops
                .iter()
                .enumerate()
                .map(|(n, &rate)| NodeProfile {
                    host: format!("n{n}"),
                    gpus: GpuInventory::Known {
                        gpus: (0..per_node)
                            .map(|i| GpuSpec {
                                index: i as u32,
                                name: "A100-SXM4-80GB".into(),
                                memory_bytes: 80 << 30,
                                peak_tflops: PeakTflops {
                                    bf16: Some(rate),
                                    fp16: rate,
                                    fp8: None,
                                    fp4: None,
                                },
                                measured_tflops: Vec::new(),
                                provenance: p.clone(),
                            })
                            .collect(),
                        links: LinkMatrix::uniform(per_node, 200.0, p.clone()),
                    },
                    nvlink_domain: None,
                })
                .collect(),
            node_links: LinkMatrix::from_rows(&rows, p).unwrap(),
        }
    }

    fn even_only() -> PlanOptions {
        let mut options = PlanOptions::default();
        options.space.uneven_layers = false;
        options
    }

    /// The case: 127 nodes of 8 GPUs have no layout for GPT-3 175B at a batch of
    /// 1536; the counts worth planning come from divisibility.
    #[test]
    fn the_useful_counts_come_from_divisibility() {
        let s = crate::config::settings_from_megatron_args(
            &["--global-batch-size".into(), "1536".into()],
            Some("gpt3-175b"),
            &[],
        )
        .unwrap();
        let counts = useful_counts(&s, 8, 1, &[127], true);
        assert!(!counts.contains_key(&127), "{:?}", counts.keys());
        assert!(counts.contains_key(&120), "{:?}", counts.keys());
        // Each shape is ranked on one count only: the ranking is one plan's work, spread
        // over the counts.
        let shapes: usize = counts.values().map(Vec::len).sum();
        let mut distinct: Vec<_> = counts.values().flatten().collect();
        distinct.sort();
        distinct.dedup();
        assert_eq!(shapes, distinct.len());
        // A pinned dp leaves the counts it allows.
        let mut pinned = s.clone();
        pinned.constraints.data_parallel = Some(16);
        let counts = useful_counts(&pinned, 8, 1, &[127], true);
        assert!(counts
            .values()
            .flatten()
            .all(|(tp, pp)| tp * pp * 16 % 8 == 0));
        assert!(counts.keys().all(|&n| n <= 127));
    }

    /// Five nodes of one GPU cannot split a batch of 16 over 8 even layers: four can, and
    /// the fifth is a spare.
    #[test]
    fn a_count_with_no_layout_plans_on_a_subset() {
        let s = settings(8, 16);
        let c = cluster(&[312.0; 5], 1, &[]);
        assert!(matches!(
            plan(&s, &c, &even_only()),
            Err(PlanError::NoCandidates { .. })
        ));
        let p = plan_subset(&s, &c, &even_only()).unwrap();
        assert_eq!(p.config.tp * p.config.pp * p.config.dp, 4);
        assert_eq!(p.spares, ["n4"]);
        assert_eq!(p.mapping.node_order.len(), 4);
        assert!(!p.mapping.node_order.contains(&"n4".to_string()));
    }

    /// The must-show: `--spares 1` on five nodes of which one has slow links names
    /// that node; the plan's positions are the whole profile's.
    #[test]
    fn spares_are_the_worst_measured_nodes() {
        let s = settings(8, 16);
        let c = cluster(&[312.0; 5], 2, &[2]);
        let mut options = PlanOptions::default();
        options.nodes.spares = 1;
        let p = plan_subset(&s, &c, &options).unwrap();
        assert_eq!(p.spares, ["n2"]);
        assert!(p.placement.devices.iter().all(|d| d.node != 2));
        assert!(p.mapping.state.node_order.iter().all(|&n| n != 2 && n < 5));
        // A slow GPU is as bad: half the rate goes out first.
        let c = cluster(&[312.0, 312.0, 312.0, 156.0, 312.0], 2, &[]);
        let p = plan_subset(&s, &c, &options).unwrap();
        assert_eq!(p.spares, ["n3"]);
        // Nodes within a few percent of the median keep the profile's order.
        let order = node_order(&s, &cluster(&[312.0, 300.0, 312.0], 1, &[]), &options).unwrap();
        assert_eq!(order, [(0, 1.0), (1, 1.0), (2, 1.0)]);
    }

    #[test]
    fn every_node_is_used_when_every_count_divides() {
        let s = settings(8, 16);
        let c = cluster(&[312.0; 4], 2, &[]);
        let options = PlanOptions::default();
        let p = plan_subset(&s, &c, &options).unwrap();
        assert_eq!(p, plan(&s, &c, &options).unwrap());
        assert!(p.spares.is_empty());
    }

    #[test]
    fn too_many_spares_is_an_error_naming_them() {
        let s = settings(8, 16);
        let c = cluster(&[312.0; 3], 1, &[]);
        let options = PlanOptions {
            nodes: NodeBounds {
                min_nodes: 3,
                spares: 1,
            },
            ..PlanOptions::default()
        };
        let e = plan_subset(&s, &c, &options).unwrap_err();
        assert!(matches!(e, PlanError::TooFewNodes { left: 2, .. }), "{e}");
        assert!(e.to_string().contains("--spares"), "{e}");
    }
}
