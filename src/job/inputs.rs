//! A run's inputs: the nodes and the allocation, the cluster profile (read, or measured
//! with the cache), the model and training settings, the script.

use std::path::{Path, PathBuf};

use super::{Decided, Event, JobError, Tell};
use crate::cli::resolved::{DiscoveryInputs, RunConfig, SettingsInputs};
use crate::cluster::allocation::NprocPerNode;
use crate::cluster::discover::Discovery;
use crate::cluster::{self, Allocation, AllocationError, AllocationRequest, ClusterProfile};
use crate::config::{self, Settings};
use crate::launch::JobSpec;
use crate::measure::{self, ProfileOptions, ProgressBars};
use crate::model::params;
use crate::render::{LaunchSpec, ScriptInvocation};
use crate::report::dry_run::{
    DryRunReport, ModelSection, ProfileSummary, ScriptSection, NO_PROFILE_YET,
    PLANNED_NOT_LAUNCHED, SCHEMA,
};

/// A run's inputs, as read: nothing planned yet.
pub struct Inputs {
    /// The settings as read from the Megatron arguments (`--pin yours` not applied).
    pub settings: Settings,
    /// The hosts, their workers and GPUs.
    pub allocation: Allocation,
    /// The cluster profile narrowed to the allocation.
    pub profile: Option<ClusterProfile>,
    /// The cluster profile as found (its file, or the measured one), for the dry run's report.
    pub profile_summary: Option<ProfileSummary>,
}

/// Reads every input of a run: the nodes, the cluster profile (--cluster, else, when
/// `measure`, the nodes are profiled as `pipette profile` does, with its cache), the model
/// and training settings, and the script; decides the allocation. Nothing is planned or
/// launched.
pub fn gather(config: &RunConfig, measure: bool, tell: Tell<'_>) -> Result<Inputs, JobError> {
    let found = discover_nodes(&config.discovery)?;
    // Read the settings first: a mistake there is cheaper to report than after profiling.
    let settings = read_settings(&config.settings, &config.script.args)?;
    if measure {
        check_local_torchrun(config, &found.spec)?;
    }
    let profile = match &config.discovery.cluster_file {
        Some(path) => Some((path.clone(), ClusterProfile::load(path)?)),
        None if measure => Some(measure_nodes(config, &found.spec, &settings, tell)?),
        None => None,
    };
    let profile = profile.as_ref().map(|(p, c)| (p.as_path(), c));
    let allocation = allocate(found, profile, config.allocation)?;
    let allocated = match &profile {
        Some((path, full)) => Some(allocation.narrow(path, full).map_err(allocation_error)?),
        None => None,
    };
    Ok(Inputs {
        settings,
        allocation,
        profile: allocated,
        profile_summary: profile.as_ref().map(|(p, c)| profile_summary(p, c)),
    })
}

/// What a dry run decided and rendered, when it had a profile to plan with.
pub struct Previewed<'a> {
    pub decided: &'a Decided,
    /// The spec it rendered with (its run directory holds the files).
    pub spec: &'a JobSpec,
    pub launch: LaunchSpec,
}

impl Inputs {
    /// The dry run's report, built at its end from what it found and, when it planned,
    /// what it decided and rendered.
    pub fn dry_run_report(
        &self,
        config: &RunConfig,
        previewed: Option<Previewed<'_>>,
    ) -> DryRunReport {
        let mut report = DryRunReport {
            schema: SCHEMA,
            cluster_profile: self.profile_summary.clone(),
            nodes: (&self.allocation).into(),
            script: script_section(&config.script),
            model: model_section(&self.settings),
            training: self.settings.training.clone(),
            constraints: self.settings.constraints.clone(),
            torchrun_passthrough: config.launch.torchrun_passthrough.clone(),
            plan: None,
            yours: None,
            launch: None,
            run_dir: None,
            status: NO_PROFILE_YET.to_string(),
        };
        if let Some(Previewed {
            decided,
            spec,
            launch,
        }) = previewed
        {
            report.plan = Some(decided.plan.clone());
            report.yours = decided.yours.clone();
            report.launch = Some(launch);
            report.run_dir = Some(spec.run_dir.display().to_string());
            report.status = PLANNED_NOT_LAUNCHED.to_string();
        }
        report
    }
}

/// When the nodes are run on this machine (the local launcher), torchrun must be there:
/// an executable `--torchrun` path, or a name found on `PATH`. Checked before anything
/// runs, so a missing torchrun is not found only when profiling or the trial fails.
pub fn check_local_torchrun(
    config: &RunConfig,
    spec: &cluster::ClusterSpec,
) -> Result<(), JobError> {
    let transport = config.launch.access.transport(&spec.hosts(), &spec.source);
    if !matches!(transport, crate::exec::Transport::Local) {
        return Ok(());
    }
    let torchrun = &config.launch.torchrun;
    // A name with a `/` is a path (as the shell reads it); `which` checks both.
    if which::which(torchrun).is_ok() {
        return Ok(());
    }
    let where_ = match torchrun.contains('/') {
        true => format!("{torchrun:?} is not an executable file"),
        false => format!("{torchrun:?} is not on PATH"),
    };
    Err(JobError::NoTorchrun(format!(
        "torchrun not found: {where_}, and the nodes run on this machine (activate the \
         environment that has PyTorch, or give --torchrun PATH)"
    )))
}

/// Profiles the discovered nodes (or reuses the cached profile of the same nodes), the
/// performance sweep at the shapes of the model in `settings` included; returns the cache
/// file's path (or a description) and the profile.
pub fn measure_nodes(
    config: &RunConfig,
    spec: &cluster::ClusterSpec,
    settings: &Settings,
    tell: Tell<'_>,
) -> Result<(PathBuf, ClusterProfile), JobError> {
    let options = ProfileOptions {
        transport: config.launch.access.transport(&spec.hosts(), &spec.source),
        nproc_per_node: match config.allocation.nproc_per_node {
            Some(NprocPerNode::Count(n)) => Some(n),
            _ => None,
        },
        torchrun: config.launch.torchrun.clone(),
        env: config.node_env.clone().into_iter().collect(),
        reprofile: config.reprofile,
        sweep: sweep_shapes(settings, config.allocation.nproc_per_node),
        ..ProfileOptions::default()
    };
    tell(Event::Profiling {
        nodes: spec.nodes.len(),
    });
    let progress = ProgressBars::new(!config.output.json, config.supervise.progress_interval);
    let run = measure::run_profile(&spec.for_profiling(), &options, &progress)?;
    for note in &run.notes {
        tell(Event::ProfileNote(note));
    }
    let path = run
        .cache_file
        .clone()
        .unwrap_or_else(|| "the measured profile".into());
    Ok((path, run.profile))
}

/// The sweep's shapes for the model in `settings`: tensor-parallel sizes 1, 2, 4, 8 (up to
/// the processes per node when given), micro-batches 1, 2 and 4; none for fp32 training
/// (no tensor-core table to measure).
fn sweep_shapes(
    settings: &Settings,
    nproc_per_node: Option<NprocPerNode>,
) -> Option<measure::SweepShapes> {
    let dtype = crate::model::time::tensor_dtype(settings.training.precision)?;
    let most = match nproc_per_node {
        Some(NprocPerNode::Count(n)) => u64::from(n).clamp(1, 8),
        _ => 8,
    };
    let tps: Vec<u64> = [1, 2, 4, 8].into_iter().filter(|t| *t <= most).collect();
    let (gemms, attention) = crate::model::time::sweep_shapes(&settings.model, &tps, &[1, 2, 4]);
    Some(measure::SweepShapes {
        dtype,
        gemms,
        attention,
    })
}

/// The hosts, their workers and GPUs ([`cluster::allocate`]), its errors as pipette's.
pub fn allocate(
    found: Discovery,
    profile: Option<(&Path, &ClusterProfile)>,
    request: AllocationRequest,
) -> Result<Allocation, JobError> {
    cluster::allocate(found, profile, request).map_err(allocation_error)
}

/// A profile that lacks part of the allocation is a cluster mismatch; a worker or node
/// count that disagrees with the nodes is a usage error.
pub fn allocation_error(e: AllocationError) -> JobError {
    match e {
        AllocationError::NotInProfile { .. } => JobError::ClusterMismatch(e.to_string()),
        AllocationError::NodeCount { .. } | AllocationError::TooFewSlots { .. } => {
            JobError::Usage(e.to_string())
        }
        AllocationError::Filter(e) => JobError::NodeList(e.into()),
    }
}

/// The nodes discovery finds, with its warnings.
pub fn discover_nodes(inputs: &DiscoveryInputs) -> Result<Discovery, JobError> {
    if let Some(spec) = &inputs.copies {
        return Ok(Discovery {
            spec: spec.clone(),
            warnings: Vec::new(),
            deferred_filter: None,
        });
    }
    Ok(cluster::discover(
        &inputs.request,
        &inputs.environment,
        &local_hostname(),
    )?)
}

/// This machine's name, for a run without an allocation.
fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}

pub fn read_settings(
    options: &SettingsInputs,
    megatron_args: &[String],
) -> Result<Settings, JobError> {
    let pins = match &options.pin {
        Some(text) => config::megatron::parse_pins(text)?,
        None => Vec::new(),
    };
    Ok(config::settings_from_megatron_args(
        megatron_args,
        options.preset.as_deref(),
        &pins,
    )?)
}

pub fn profile_summary(path: &Path, profile: &ClusterProfile) -> ProfileSummary {
    let mut gpu_models: Vec<String> = Vec::new();
    for gpu in profile.nodes.iter().filter_map(|n| n.gpus()).flatten() {
        if !gpu_models.contains(&gpu.name) {
            gpu_models.push(gpu.name.clone());
        }
    }
    let links = &profile.node_links;
    let node_link_gbps = links.min_link().zip(links.max_link());
    ProfileSummary {
        path: path.display().to_string(),
        nodes: profile.nodes.len(),
        gpus: profile.gpu_count().unwrap_or(0),
        gpu_models,
        node_link_gbps,
        nics_per_node: links.nics_per_node,
        all_rails: links.all_rails(),
    }
}

pub fn model_section(settings: &Settings) -> ModelSection {
    ModelSection {
        spec: settings.model.clone(),
        parameters: params::total_parameters(&settings.model, 1),
        padded_vocab_size: params::padded_vocab_size(&settings.model, 1),
    }
}

pub fn script_section(script: &ScriptInvocation) -> ScriptSection {
    // torchrun's own precedence: --run-path over --no-python; -m is independent.
    let launch = if script.run_path {
        "run-path"
    } else if script.no_python {
        "no-python"
    } else if script.module {
        "module"
    } else {
        "python"
    };
    ScriptSection {
        program: script.program.clone(),
        launch,
        args: script.args.clone(),
    }
}
