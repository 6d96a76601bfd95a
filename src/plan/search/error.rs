//! Why no plan came out ([`PlanError`]), and the explanations of what would make a
//! configuration fit.

use rayon::prelude::*;

use super::balance::balanced_configs;
use super::cluster::ClusterShape;
use super::options::PlanOptions;
use super::rank::{config_key, peak_bytes, stage_needs};
use crate::config::{Recompute, RecomputeMethod, Settings};
use crate::model::parallel::{ParallelConfig, Placement};
use crate::model::time::{TimeError, TimeModel};
use crate::plan::hetero::{Arrangement, GpuClass};
use crate::plan::mapping::MappingError;
use crate::plan::space::candidates;

/// Why no plan came out.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("the cluster profile lists no nodes (profile the allocated nodes, or give a cluster file with at least one)")]
    EmptyCluster,
    #[error("node {host} has no GPU inventory (run `pipette profile` on the nodes, or fill in default GPUs for an imported bandwidth file)")]
    UnknownGpus { host: String },
    #[error("{host} has {gpus} GPUs but {first_host} has {first_gpus} (the planner needs the same GPU count on every node; leave the odd nodes out)")]
    MixedGpuCounts {
        host: String,
        gpus: usize,
        first_host: String,
        first_gpus: usize,
    },
    #[error("no parallel configuration of this model suits {nodes} node(s) × {gpus_per_node} GPUs{pins} (tp must divide the GPUs per node, the heads and the query groups; pp at most the {layers} layers; the global batch {global_batch} must divide by dp × micro-batch{interleaving})")]
    NoCandidates {
        nodes: usize,
        gpus_per_node: usize,
        layers: u64,
        global_batch: u64,
        /// ", with the pinned settings" when some are pinned.
        pins: &'static str,
        /// The interleaved schedule's own rules when its virtual stages are pinned (they
        /// are what usually rules every configuration out); empty otherwise.
        interleaving: String,
    },
    #[error("no configuration fits in GPU memory: the smallest needs {} per GPU ({}){}, the GPUs have {} of which {} usable after the headroom; {}", gib(*smallest_peak_bytes), describe(config_of_smallest), on_stage, gib(*gpu_memory_bytes), gib(*usable_memory_bytes), suggestions.join("; "))]
    NothingFits {
        smallest_peak_bytes: u64,
        /// On a heterogeneous cluster, the stage that overflows least and its GPUs
        /// (" on its stage 2 of 4 (V100-SXM2-32GB)"); empty otherwise.
        on_stage: String,
        gpu_memory_bytes: u64,
        usable_memory_bytes: u64,
        config_of_smallest: Box<ParallelConfig>,
        /// What would make a configuration fit, most practical first.
        suggestions: Vec<String>,
    },
    #[error("the planner ranks with the pipette or pipette-compat model, not {0} (use {0} to compare a plan, not to make one)")]
    UnsupportedTimeModel(TimeModel),
    #[error(transparent)]
    Time(#[from] TimeError),
    #[error(transparent)]
    Mapping(#[from] MappingError),
    #[error("keeping {spares} spare node(s) leaves {left} of the {nodes} node(s), fewer than the {min_nodes} the job needs (ask for fewer --spares, or lower --nnodes MIN)")]
    TooFewNodes {
        nodes: usize,
        spares: usize,
        left: usize,
        min_nodes: usize,
    },
}

/// Bytes as GiB for messages.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// A configuration in a few words for messages.
fn describe(c: &ParallelConfig) -> String {
    let recompute = match &c.recompute {
        Recompute::None => "no recomputation".to_string(),
        Recompute::Selective => "selective recomputation".to_string(),
        Recompute::Full { .. } => "full recomputation".to_string(),
    };
    let mut text = format!(
        "tp={} pp={} dp={}, micro-batch {}, {recompute}",
        c.tp, c.pp, c.dp, c.micro_batch
    );
    if let Some(v) = c.vpp {
        text.push_str(&format!(", {v} virtual stages"));
    }
    if c.sequence_parallel {
        text.push_str(", sequence parallel");
    }
    if c.distributed_optimizer {
        text.push_str(", distributed optimizer");
    }
    text
}

pub(super) fn no_candidates(settings: &Settings, shape: &ClusterShape) -> PlanError {
    let c = &settings.constraints;
    let pinned = c.tensor_parallel.is_some()
        || c.pipeline_parallel.is_some()
        || c.data_parallel.is_some()
        || c.micro_batch_size.is_some()
        || c.virtual_pipeline.is_some()
        || c.sequence_parallel.is_some()
        || c.recompute.is_some()
        || c.distributed_optimizer.is_some();
    PlanError::NoCandidates {
        nodes: shape.nodes,
        gpus_per_node: shape.gpus_per_node,
        layers: settings.model.num_layers,
        global_batch: settings.training.global_batch_size,
        pins: if pinned {
            ", with the pinned settings"
        } else {
            ""
        },
        interleaving: c
            .virtual_pipeline
            .map(|v| {
                format!(
                    "; the pinned vpp={v} needs pp above 2 with a multiple of {v} layers per \
                     stage, and the micro-batches per step a multiple of pp"
                )
            })
            .unwrap_or_default(),
    }
}

/// The smallest peak of any candidate for these settings on `nodes` × `g` GPUs.
fn smallest_peak(
    settings: &Settings,
    nodes: usize,
    g: usize,
    options: &PlanOptions,
) -> Option<u64> {
    candidates(settings, nodes as u64, g as u64, &options.space)
        .par_iter()
        .map(|c| peak_bytes(settings, c, &options.calibration))
        .min()
}

/// The error when nothing fits, with what would make something fit.
pub(super) fn nothing_fits(
    settings: &Settings,
    shape: &ClusterShape,
    options: &PlanOptions,
    all: &[ParallelConfig],
    peaks: &[u64],
    usable: u64,
) -> PlanError {
    let (at, &smallest) = peaks
        .iter()
        .enumerate()
        .min_by(|a, b| {
            a.1.cmp(b.1)
                .then_with(|| config_key(&all[a.0]).cmp(&config_key(&all[b.0])))
        })
        .expect("called with candidates");
    let g = shape.gpus_per_node;
    let shortfall = Shortfall {
        need: smallest,
        on_stage: String::new(),
        gpu_memory_bytes: shape.gpu_memory_bytes,
        usable_memory_bytes: usable,
        config: all[at].clone(),
    };
    let fits_here =
        |s: &Settings| smallest_peak(s, shape.nodes, g, options).is_some_and(|p| p <= usable);
    explain_shortfall(
        settings,
        shape,
        options,
        shortfall,
        &fits_here,
        (shape.gpu_memory_bytes, usable, ""),
    )
}

/// The candidates of a plan: configurations, the (configuration, arrangement) pairs
/// considered, and every configuration's memory need per stage.
#[derive(Clone, Copy)]
pub(super) struct Candidates<'a> {
    pub(super) configs: &'a [ParallelConfig],
    pub(super) pairs: &'a [(usize, usize)],
    pub(super) needs: &'a [Vec<u64>],
}

/// The configuration that comes closest to fitting, and where it does not.
struct Shortfall {
    /// The memory need of its stage that overflows least, per GPU.
    need: u64,
    on_stage: String,
    gpu_memory_bytes: u64,
    usable_memory_bytes: u64,
    config: ParallelConfig,
}

/// The error when nothing fits on a heterogeneous cluster: the configuration and
/// arrangement whose worst stage overflows its own GPUs' memory by the smallest share.
pub(super) fn nothing_fits_per_stage(
    settings: &Settings,
    shape: &ClusterShape,
    options: &PlanOptions,
    considered: Candidates<'_>,
    arrangements: &[Arrangement],
    classes: &[GpuClass],
) -> PlanError {
    let Candidates {
        configs,
        pairs,
        needs,
    } = considered;
    // Per pair: (need / usable of its worst stage, that stage).
    let worst = |&(c, a): &(usize, usize)| {
        (0..needs[c].len())
            .map(|s| {
                let usable = arrangements[a].stage_usable(&configs[c], s).max(1);
                (needs[c][s] as f64 / usable as f64, s)
            })
            .max_by(|x, y| x.0.total_cmp(&y.0))
            .unwrap_or((f64::INFINITY, 0))
    };
    let (c, a, s) = pairs
        .iter()
        .map(|p| (worst(p), p))
        .min_by(|(x, p), (y, q)| {
            x.0.total_cmp(&y.0)
                .then_with(|| config_key(&configs[p.0]).cmp(&config_key(&configs[q.0])))
                .then_with(|| p.1.cmp(&q.1))
        })
        .map(|((_, s), &(c, a))| (c, a, s))
        .expect("called with candidates");
    let arrangement = &arrangements[a];
    let config = &configs[c];
    let gpu = arrangement.stage_gpu(config, s, classes);
    let shortfall = Shortfall {
        need: needs[c][s],
        on_stage: format!(" on its stage {} of {} ({gpu})", s + 1, config.pp),
        gpu_memory_bytes: arrangement.stage_memory(config, s),
        usable_memory_bytes: arrangement.stage_usable(config, s),
        config: config.clone(),
    };
    let fits_here = |s: &Settings| {
        let all = candidates(
            s,
            shape.nodes as u64,
            shape.gpus_per_node as u64,
            &options.space,
        );
        let identity =
            Placement::identity(shape.nodes * shape.gpus_per_node, shape.gpus_per_node).devices;
        all.par_iter().any(|c| {
            let needs = stage_needs(s, c, &options.calibration);
            arrangements.iter().any(|a| {
                needs
                    .iter()
                    .enumerate()
                    .all(|(s, &need)| need <= a.stage_usable(c, s))
            })
        }) || (options.space.uneven_layers
            && !balanced_configs(s, &all, arrangements, &identity, options).is_empty())
    };
    // More GPUs: of the kind with the most memory.
    let largest = classes
        .iter()
        .max_by_key(|k| (k.usable_bytes, std::cmp::Reverse(k.nodes[0])))
        .expect("a heterogeneous cluster has classes");
    explain_shortfall(
        settings,
        shape,
        options,
        shortfall,
        &fits_here,
        (largest.memory_bytes, largest.usable_bytes, &largest.name),
    )
}

/// [`PlanError::NothingFits`] for `shortfall`, with what would make something fit:
/// unpinning settings (`fits_here` says whether anything fits with other settings on this
/// cluster), or more GPUs like those of `more` (memory, usable memory, and their name
/// when the cluster mixes kinds).
fn explain_shortfall(
    settings: &Settings,
    shape: &ClusterShape,
    options: &PlanOptions,
    shortfall: Shortfall,
    fits_here: &(dyn Fn(&Settings) -> bool + Sync),
    more: (u64, u64, &str),
) -> PlanError {
    let g = shape.gpus_per_node;
    let smallest = shortfall.need;
    let fits = |s: &Settings, nodes: usize| {
        if nodes == shape.nodes {
            fits_here(s)
        } else {
            smallest_peak(s, nodes, g, options).is_some_and(|p| p <= more.1)
        }
    };
    let mut suggestions = Vec::new();
    let pins = &settings.constraints;

    if pins
        .recompute
        .as_ref()
        .is_some_and(|r| !matches!(r, Recompute::Full { .. }))
    {
        let mut s = settings.clone();
        s.constraints.recompute = Some(Recompute::Full {
            method: RecomputeMethod::Uniform,
            num_layers: 1,
        });
        if fits(&s, shape.nodes) {
            suggestions.push("full recomputation would fit (--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 instead of the pinned recomputation)".to_string());
        }
    }
    if pins.micro_batch_size.is_some_and(|m| m > 1) {
        let mut s = settings.clone();
        s.constraints.micro_batch_size = Some(1);
        if fits(&s, shape.nodes) {
            suggestions.push(format!(
                "micro-batch 1 would fit (the pinned micro-batch is {})",
                pins.micro_batch_size.unwrap_or(1)
            ));
        }
    }
    if pins.distributed_optimizer == Some(false) {
        let mut s = settings.clone();
        s.constraints.distributed_optimizer = None;
        if fits(&s, shape.nodes) {
            suggestions.push(
                "the distributed optimizer would fit (--use-distributed-optimizer)".to_string(),
            );
        }
    }
    let sizes_pinned = pins.tensor_parallel.is_some()
        || pins.pipeline_parallel.is_some()
        || pins.data_parallel.is_some()
        || pins.virtual_pipeline.is_some()
        || pins.sequence_parallel.is_some();
    if sizes_pinned {
        let mut s = settings.clone();
        s.constraints.tensor_parallel = None;
        s.constraints.pipeline_parallel = None;
        s.constraints.data_parallel = None;
        s.constraints.virtual_pipeline = None;
        s.constraints.sequence_parallel = None;
        if fits(&s, shape.nodes) {
            suggestions.push("leaving tp, pp, dp, virtual stages and sequence parallelism to the planner would fit (unpin them)".to_string());
        }
    }
    // More nodes of the same kind: doubling until something fits.
    let (more_memory, _, kind) = more;
    let kind = if kind.is_empty() {
        String::new()
    } else {
        format!(" {kind}")
    };
    let enough = (1..=10)
        .map(|k| shape.nodes << k)
        .find(|&nodes| fits(settings, nodes));
    match enough {
        Some(nodes) => suggestions.push(format!(
            "about {} GPUs ({nodes} nodes of {g}{kind}) would fit",
            nodes * g
        )),
        None => suggestions.push(format!(
            "no number of these GPUs up to {} would fit: use GPUs with at least {} of memory, a shorter sequence or a smaller model",
            (shape.nodes << 10) * g,
            gib(smallest.saturating_add(options.headroom.bytes(more_memory)))
        )),
    }
    PlanError::NothingFits {
        smallest_peak_bytes: smallest,
        on_stage: shortfall.on_stage,
        gpu_memory_bytes: shortfall.gpu_memory_bytes,
        usable_memory_bytes: shortfall.usable_memory_bytes,
        config_of_smallest: Box::new(shortfall.config),
        suggestions,
    }
}
