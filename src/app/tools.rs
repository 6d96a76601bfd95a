//! The `pipette` subcommands that run one stage on its own: discover, cluster, model,
//! estimate, plan, profile, presets.

use super::inputs::{
    allocate, allocation_error, discover_nodes, model_section, profile_summary, read_settings,
};
use super::job::{calibrate, runner_up};
use super::to_json;
use crate::cli::node_env::{announced_node_env, EnvRequest};
use crate::cli::resolved::{
    read_calibration, DiscoveryInputs, NodeAccess, PlanningConfig, RunConfig, SettingsInputs,
};
use crate::cli::{EstimateArgs, PipetteCommand};
use crate::cluster::{AllocationRequest, ClusterProfile, Environment};
use crate::config::{self, Settings};
use crate::error::Error;
use crate::log::{self, Level};
use crate::measure::{self, ProfileOptions, ProgressBars};
use crate::model::memory::estimate_memory;
use crate::model::time::{self, TimeModel, TimeOptions, TimeRequest};
use crate::model::{params, Calibration, ParallelConfig, Placement};
use crate::plan;
use crate::report::dry_run::ModelSection;
use crate::report::estimate::{EstimateReport, ModelTime, ParamsSection};
use crate::report::pictures::Picture;
use crate::report::plan::plan_report;

/// Writes generated text (a completion script, a manual page) to stdout as it is.
fn write_stdout(bytes: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // A closed pipe (`pipette man | head`) is the reader's choice, not an error.
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::Usage(format!("cannot write to stdout: {e}")))
        }
        _ => Ok(()),
    }
}

pub(super) fn pipette(command: &PipetteCommand, env: &Environment) -> Result<(), Error> {
    match command {
        PipetteCommand::Completions { shell, program } => {
            write_stdout(&crate::cli::completions(*shell, *program))
        }
        PipetteCommand::Config {
            action: crate::cli::ConfigAction::Show { config },
        } => {
            let matches = crate::cli::run_command()
                .ignore_errors(true)
                .try_get_matches_from(["pipette-run"])
                .unwrap_or_default();
            let site = match config {
                Some(path) => super::site_config_at(path),
                None => super::site_config(&matches),
            }
            .map_err(Error::Usage)?;
            let shown = crate::cli::site::show(crate::cli::run_command(), site.as_ref())
                .map_err(Error::Usage)?;
            print!("{shown}");
            Ok(())
        }
        PipetteCommand::Man { program } => {
            let page = crate::cli::man_page(*program)
                .map_err(|e| Error::Internal(format!("rendering the manual page: {e}")))?;
            write_stdout(&page)
        }
        PipetteCommand::Discover { discovery, output } => {
            let found = discover_nodes(&DiscoveryInputs::new(discovery, env.clone()))?;
            let spec = &found.spec;
            for w in &found.warnings {
                log::warn(&w.to_string());
            }
            if output.json {
                println!("{}", to_json(spec)?);
            } else {
                for node in &spec.nodes {
                    match node.slots.count() {
                        Some(n) => println!("{} slots={n}", node.host),
                        None => println!("{}", node.host),
                    }
                }
            }
            Ok(())
        }
        PipetteCommand::Cluster { file, output } => {
            let profile = ClusterProfile::load(file)?;
            if output.json {
                println!("{}", profile.to_json_pretty());
            } else {
                let s = profile_summary(file, &profile);
                println!(
                    "{}: valid, {} nodes, {} GPUs ({})",
                    s.path,
                    s.nodes,
                    s.gpus,
                    if s.gpu_models.is_empty() {
                        "GPU models unknown".to_string()
                    } else {
                        s.gpu_models.join(", ")
                    }
                );
                if let Some((lo, hi)) = s.node_link_gbps {
                    println!("node-to-node bandwidth {lo:.2}–{hi:.2} GB/s");
                    println!("{}", s.nics_line());
                }
            }
            Ok(())
        }
        PipetteCommand::Model {
            model,
            output,
            megatron_args,
        } => {
            let settings = read_settings(&SettingsInputs::new(model), megatron_args)?;
            let section = model_section(&settings);
            if output.json {
                #[derive(serde::Serialize)]
                struct ModelReport<'a> {
                    model: &'a ModelSection,
                    training: &'a config::TrainingSettings,
                    constraints: &'a config::Constraints,
                }
                let report = ModelReport {
                    model: &section,
                    training: &settings.training,
                    constraints: &settings.constraints,
                };
                println!("{}", to_json(&report)?);
            } else {
                let spec = &section.spec;
                println!(
                    "{}: {} parameters ({})",
                    spec.preset.as_deref().unwrap_or("model"),
                    crate::report::thousands(section.parameters),
                    crate::report::short_count(section.parameters)
                );
            }
            Ok(())
        }
        PipetteCommand::Estimate(args) => {
            let report = estimate(args)?;
            if args.output.json {
                println!("{}", to_json(&report)?);
            } else {
                print!("{}", report.to_human());
            }
            Ok(())
        }
        PipetteCommand::Plan(args) => {
            let found = discover_nodes(&DiscoveryInputs::new(&args.discovery, env.clone()))?;
            let Some(path) = &args.discovery.cluster else {
                return Err(Error::Usage(
                    "pipette plan needs a cluster profile: give --cluster FILE (`pipette profile --out FILE` measures the nodes)"
                        .to_string(),
                ));
            };
            let full = ClusterProfile::load(path)?;
            let settings = read_settings(&SettingsInputs::new(&args.model), &args.megatron_args)?;
            let request = AllocationRequest {
                nnodes: None,
                nproc_per_node: args.nproc_per_node,
            };
            let allocation = allocate(found, Some((path, &full)), request)?;
            for w in &allocation.warnings {
                log::warn(&w.to_string());
            }
            let profile = allocation.narrow(path, &full).map_err(allocation_error)?;
            let options =
                PlanningConfig::new(&args.planning, args.output.seed).plan_options(&settings)?;
            let plan = plan::plan_subset(&settings, &profile, &options)?;
            if let Some(picture) = args.show.as_deref().and_then(Picture::from_name) {
                print!("{}", picture.text(&plan, &profile));
            } else if args.output.json {
                println!("{}", to_json(&plan)?);
            } else {
                let runner_up = runner_up(&plan, &settings, &profile, &options);
                let runner_up = runner_up.as_ref().map(|(_, t)| t);
                print!("{}", plan_report(&plan, runner_up, &settings, &profile));
            }
            Ok(())
        }
        PipetteCommand::Profile(args) => {
            // The probe stops in order on a stop signal, its staging removed (exit 128 + N).
            let _signals = crate::exec::signals::SignalGuard::install();
            let found = discover_nodes(&DiscoveryInputs::new(&args.discovery, env.clone()))?;
            let spec = &found.spec;
            for w in &found.warnings {
                log::warn(&w.to_string());
            }
            let access = NodeAccess::new(&args.access, &args.nodes);
            let env = announced_node_env(env, &EnvRequest::new(&args.nodes))?;
            let options = ProfileOptions {
                transport: access.transport(&spec.hosts(), &spec.source),
                nproc_per_node: args.nproc_per_node,
                torchrun: args.access.torchrun.clone(),
                reprofile: args.profiling.reprofile,
                env: env.into_iter().collect(),
                ..ProfileOptions::default()
            };
            let progress = ProgressBars::new(!args.output.json, measure::LINE_INTERVAL);
            let run = measure::run_profile(spec, &options, &progress)?;
            let text = run.profile.to_json_pretty();
            std::fs::write(&args.out, &text).map_err(|e| {
                Error::Usage(format!(
                    "cannot write {}: {e} (choose another --out)",
                    args.out.display()
                ))
            })?;
            for note in &run.notes {
                log::log(Level::Info, "profile", note);
            }
            if args.output.json {
                println!("{text}");
            } else {
                let s = profile_summary(&args.out, &run.profile);
                println!(
                    "{}: {} nodes, {} GPUs ({}){}",
                    s.path,
                    s.nodes,
                    s.gpus,
                    s.gpu_models.join(", "),
                    s.node_link_gbps
                        .map(|(lo, hi)| format!(", node links {lo:.2}–{hi:.2} GB/s"))
                        .unwrap_or_default()
                );
            }
            Ok(())
        }
        PipetteCommand::Calibrate(args) => {
            {
                let mut config = RunConfig::resolve(&args.run, env.clone());
                // The trial stops in order on a stop signal, as pipette-run's does.
                let _signals =
                    (!config.output.dry_run).then(crate::exec::signals::SignalGuard::install);
                config.resolve_node_env()?;
                calibrate(&config, &args.out)
            }
        }
        // pipette_main runs it: its exit code is its report's, not an error's.
        PipetteCommand::Doctor(_) => Err(Error::Internal(
            "pipette doctor reached the stage tools".to_string(),
        )),
        PipetteCommand::Presets { output } => {
            let names = config::presets::names();
            if output.json {
                println!("{}", to_json(&names)?);
            } else {
                for name in names {
                    println!("{name}");
                }
            }
            Ok(())
        }
    }
}

/// Costs one configuration: memory always, time when a cluster is given.
pub(super) fn estimate(args: &EstimateArgs) -> Result<EstimateReport, Error> {
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
fn interleaving_fits(v: u64, config: &ParallelConfig, global_batch: u64) -> Result<(), Error> {
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
    Err(Error::Usage(format!(
        "--vpp {v} {problem} (the interleaved schedule's rules: change --vpp, --pp or the batch sizes)"
    )))
}

/// The configuration `pipette estimate` costs: its flags, else the Megatron arguments'.
pub(super) fn estimate_config(
    args: &EstimateArgs,
    settings: &Settings,
    cluster: Option<&ClusterProfile>,
) -> Result<ParallelConfig, Error> {
    let t = &settings.training;
    let layers = settings.model.num_layers;
    let tp = args.tp.unwrap_or(t.tensor_parallel).max(1);
    let pp = args.pp.unwrap_or(t.pipeline_parallel).max(1);
    // pp sizes the stage list: checked before it is built (--pp 4294967295 asked for 34 GB).
    if pp > layers {
        return Err(Error::Usage(format!(
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
                return Err(Error::Usage(format!(
                    "--layers-per-stage {} must give {pp} stage sizes that add up to the model's {layers} layers",
                    split.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
                )));
            }
            config.layers_per_stage = split.clone();
        }
        None if layers % pp != 0 => {
            return Err(Error::Usage(format!(
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
        return Err(Error::Usage(format!(
            "--tp {tp} must divide the {} attention heads and {} query groups",
            model.num_attention_heads, model.num_query_groups
        )));
    }
    if let Some(gpus) = cluster_gpus.filter(|g| config.world_size() > *g) {
        return Err(Error::Usage(format!(
            "tp {tp} × pp {pp} × dp {dp} needs {} GPUs but the cluster has {gpus} (lower --dp)",
            config.world_size()
        )));
    }
    if t.global_batch_size % (config.micro_batch * dp) != 0 {
        return Err(Error::Usage(format!(
            "the global batch {} is not divisible by micro-batch {} × dp {dp} (change --mbs or --dp)",
            t.global_batch_size, config.micro_batch
        )));
    }
    Ok(config)
}
