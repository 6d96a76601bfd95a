//! `pipette estimate`'s costing: one parallel configuration (its flags, else the Megatron
//! arguments'), checked as Megatron would, costed for memory always and for time when a
//! cluster is given.

use super::inputs::read_settings;
use super::JobError;
use crate::cli::resolved::{read_calibration, SettingsInputs};
use crate::cli::EstimateArgs;
use crate::cluster::ClusterProfile;
use crate::config::Settings;
use crate::model::memory::estimate_memory;
use crate::model::time::{self, TimeModel, TimeOptions, TimeRequest};
use crate::model::{params, Calibration, ParallelConfig, Placement};
use crate::report::estimate::{EstimateReport, ModelTime, ParamsSection};

/// Costs one configuration: memory always, time when a cluster is given.
pub fn estimate(args: &EstimateArgs) -> Result<EstimateReport, JobError> {
    let settings = read_settings(&SettingsInputs::new(&args.model), &args.megatron_args)?;
    let cluster = match &args.cluster {
        Some(path) => Some(ClusterProfile::load(path)?),
        None => None,
    };
    let config = estimate_config(args, &settings, cluster.as_ref())?;
    let model = &settings.model;
    let training = &settings.training;
    let calibration = match &args.calibration {
        Some(path) => read_calibration(path)?,
        None => Calibration::default(),
    };
    let memory = estimate_memory(model, training, &config, &calibration);
    let breakdown = params::ParameterBreakdown::new(model, config.tp);
    // Each stage's own layers: dense and MoE layers may be mixed.
    let per_stage = crate::plan::layers::stage_parameters(&breakdown, &config.layers_per_stage);
    let mut report = EstimateReport {
        params: ParamsSection {
            total: breakdown.total(),
            per_stage,
        },
        memory,
        gpu_memory_bytes: None,
        time: None,
        time_models: Vec::new(),
        config,
    };
    if let Some(cluster) = &cluster {
        report.gpu_memory_bytes = cluster
            .nodes
            .iter()
            .filter_map(|n| n.gpus())
            .flatten()
            .map(|g| g.memory_bytes)
            .min();
        let gpus_per_node = cluster.nodes[0].gpus().map_or(0, <[_]>::len);
        let placement = Placement::identity(report.config.world_size() as usize, gpus_per_node);
        let request = TimeRequest {
            model,
            training,
            config: &report.config,
            cluster,
            placement: &placement,
            calibration: &calibration,
            options: TimeOptions::from_training(training),
        };
        for time_model in TimeModel::ALL {
            let estimate = time::estimate(&request, time_model)?;
            report.time_models.push(ModelTime {
                model: time_model,
                iteration_ms: estimate.iteration_ms,
            });
            if time_model == args.time_model {
                report.time = Some(estimate);
            }
        }
    }
    Ok(report)
}

/// Megatron's rules for `v` virtual stages per pipeline rank, as the planner applies them
/// (`plan::space`): a pipeline above 2 stages, every stage's layers a multiple of `v`, and
/// the micro-batches per step a multiple of pp. `--vpp` was taken unchecked.
fn interleaving_fits(v: u64, config: &ParallelConfig, global_batch: u64) -> Result<(), JobError> {
    let pp = config.pp;
    let microbatches = global_batch / (config.micro_batch * config.dp).max(1);
    let problem = if pp <= 2 {
        format!("needs --pp above 2, got {pp}")
    } else if let Some(layers) = config.layers_per_stage.iter().find(|l| *l % v != 0) {
        format!("does not divide the layers of a stage ({layers})")
    } else if microbatches % pp != 0 {
        format!("needs the micro-batches per step ({microbatches}) a multiple of pp {pp}")
    } else {
        return Ok(());
    };
    Err(JobError::Usage(format!(
        "--vpp {v} {problem} (the interleaved schedule's rules: change --vpp, --pp or the batch sizes)"
    )))
}

/// The configuration `pipette estimate` costs: its flags, else the Megatron arguments'.
fn estimate_config(
    args: &EstimateArgs,
    settings: &Settings,
    cluster: Option<&ClusterProfile>,
) -> Result<ParallelConfig, JobError> {
    let t = &settings.training;
    let layers = settings.model.num_layers;
    let tp = args.tp.unwrap_or(t.tensor_parallel).max(1);
    let pp = args.pp.unwrap_or(t.pipeline_parallel).max(1);
    // pp sizes the stage list: checked before it is built (--pp 4294967295 asked for 34 GB).
    if pp > layers {
        return Err(JobError::Usage(format!(
            "--pp {pp} is more than the model's {layers} layers (each pipeline stage needs a layer: give at most {layers})"
        )));
    }
    let cluster_gpus = cluster
        .and_then(ClusterProfile::gpu_count)
        .map(|g| g as u64);
    let dp = match (args.dp, cluster_gpus) {
        (Some(dp), _) => dp.max(1),
        (None, Some(gpus)) if gpus >= tp * pp => gpus / (tp * pp),
        _ => 1,
    };
    let mut config = ParallelConfig::even(
        layers,
        tp,
        pp,
        dp,
        args.mbs.unwrap_or(t.micro_batch_size).max(1),
    );
    config.vpp = args.vpp.or(t.virtual_pipeline).filter(|v| *v > 1);
    config.recompute = args
        .recompute
        .clone()
        .unwrap_or_else(|| t.recompute.clone());
    config.sequence_parallel = (args.sequence_parallel || t.sequence_parallel) && tp > 1;
    config.distributed_optimizer = args.distributed_optimizer || t.distributed_optimizer;
    match &args.layers_per_stage {
        Some(split) => {
            if split.len() as u64 != pp || split.iter().sum::<u64>() != layers {
                return Err(JobError::Usage(format!(
                    "--layers-per-stage {} must give {pp} stage sizes that add up to the model's {layers} layers",
                    split.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
                )));
            }
            config.layers_per_stage = split.clone();
        }
        None if layers % pp != 0 => {
            return Err(JobError::Usage(format!(
                "--pp {pp} does not divide the model's {layers} layers (choose another --pp, or give --layers-per-stage)"
            )));
        }
        None => {}
    }
    if let Some(v) = config.vpp {
        interleaving_fits(v, &config, t.global_batch_size)?;
    }
    let model = &settings.model;
    if model.num_attention_heads % tp != 0 || model.num_query_groups % tp != 0 {
        return Err(JobError::Usage(format!(
            "--tp {tp} must divide the {} attention heads and {} query groups",
            model.num_attention_heads, model.num_query_groups
        )));
    }
    if let Some(gpus) = cluster_gpus.filter(|g| config.world_size() > *g) {
        return Err(JobError::Usage(format!(
            "tp {tp} × pp {pp} × dp {dp} needs {} GPUs but the cluster has {gpus} (lower --dp)",
            config.world_size()
        )));
    }
    if t.global_batch_size % (config.micro_batch * dp) != 0 {
        return Err(JobError::Usage(format!(
            "the global batch {} is not divisible by micro-batch {} × dp {dp} (change --mbs or --dp)",
            t.global_batch_size, config.micro_batch
        )));
    }
    Ok(config)
}
