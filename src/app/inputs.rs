//! A run's inputs: the nodes, the cluster profile (read, or measured with the cache), the
//! model and training settings, the script; and the planner's options from the command line.

use super::*;

/// What a dry run did, when it had no profile to plan with.
pub(super) const NO_PROFILE_YET: &str = "No cluster profile to plan with: give --cluster FILE (`pipette profile --out FILE` measures the allocated nodes).";

/// A run's inputs and what the planner and renderer made of them.
pub(super) struct Run {
    pub(super) report: DryRunReport,
    pub(super) settings: Settings,
    /// The cluster profile narrowed to the allocated nodes and GPUs.
    pub(super) profile: Option<ClusterProfile>,
    pub(super) plan: Option<Plan>,
    pub(super) runner_up: Option<(ParallelConfig, TimeEstimate)>,
    /// What the launch would render with (set with the plan).
    pub(super) template: Option<launch::JobTemplate>,
}

/// Reads every input of a run: the nodes, the cluster profile (--cluster, else, when
/// `measure`, the nodes are profiled as `pipette profile` does, with its cache), the model
/// and training settings, and the script. Nothing is planned or launched.
pub(super) fn gather_inputs(cli: &RunCli, env: &Environment, measure: bool) -> Result<Run, Error> {
    let (spec, warnings) = discover_nodes(&cli.discovery, env)?;
    // Read the settings first: a mistake there is cheaper to report than after profiling.
    let settings = read_settings(&cli.model, cli.script_args())?;
    let profile = match &cli.discovery.cluster {
        Some(path) => Some((path.clone(), ClusterProfile::load(path)?)),
        None if measure => Some(measure_nodes(cli, env, &spec)?),
        None => None,
    };
    let profile = profile.as_ref().map(|(p, c)| (p.as_path(), c));
    let nodes = nodes_section(
        spec,
        warnings,
        profile,
        cli.torchrun.nnodes,
        cli.torchrun.nproc_per_node,
    )?;
    let allocated = match &profile {
        Some((path, full)) => Some(allocated_part(path, full, &nodes)?),
        None => None,
    };
    let report = DryRunReport {
        cluster_profile: profile.as_ref().map(|(p, c)| profile_summary(p, c)),
        nodes,
        script: script_section(cli),
        model: model_section(&settings),
        training: settings.training.clone(),
        constraints: settings.constraints.clone(),
        torchrun_passthrough: cli.torchrun.passthrough_args(),
        plan: None,
        launch: None,
        run_dir: None,
        status: NO_PROFILE_YET.to_string(),
    };
    Ok(Run {
        report,
        settings,
        profile: allocated,
        plan: None,
        runner_up: None,
        template: None,
    })
}

/// Profiles the discovered nodes (or reuses the cached profile of the same nodes); returns
/// the cache file's path (or a description) and the profile.
pub(super) fn measure_nodes(
    cli: &RunCli,
    env: &Environment,
    spec: &ClusterSpec,
) -> Result<(std::path::PathBuf, ClusterProfile), Error> {
    let options = ProfileOptions {
        transport: node_transport(
            cli.supervise.launcher.as_deref(),
            cli.supervise.ssh_config.as_deref(),
            &spec.hosts(),
            &spec.source,
        ),
        nproc_per_node: match cli.torchrun.nproc_per_node {
            Some(NprocPerNode::Count(n)) => Some(n),
            _ => None,
        },
        torchrun: cli.supervise.torchrun.clone(),
        env: render::forwarded_env(env.iter().map(|(k, v)| (k.clone(), v.clone())))
            .into_iter()
            .collect(),
        reprofile: cli.profiling.reprofile,
        ..ProfileOptions::default()
    };
    eprintln!(
        "pipette-run: no --cluster given: profiling the {} node(s) found",
        spec.nodes.len()
    );
    let progress = ProgressBars::new(!cli.pipette.json);
    let run = profile::run_profile(spec, &options, &progress)?;
    for note in &run.notes {
        eprintln!("pipette-run: {note}");
    }
    let path = run
        .cache_file
        .clone()
        .unwrap_or_else(|| "the measured profile".into());
    Ok((path, run.profile))
}

/// The profile narrowed to the hosts found and the GPUs each may use.
pub(super) fn allocated_part(
    path: &Path,
    profile: &ClusterProfile,
    nodes: &NodesSection,
) -> Result<ClusterProfile, Error> {
    let selections: Vec<NodeSelection<'_>> = nodes
        .hosts
        .iter()
        .map(|h| NodeSelection {
            host: &h.host,
            devices: match (&h.devices, h.workers) {
                (Some(d), _) => DeviceSelection::Indices(d.clone()),
                (None, Some(n)) => DeviceSelection::First(n as usize),
                (None, None) => DeviceSelection::All,
            },
        })
        .collect();
    profile.subset(&selections).map_err(|problem| {
        Error::ClusterMismatch(format!(
            "{}: {problem}, which the allocation includes (profile the allocated nodes again, or pass a cluster file that covers them)",
            path.display()
        ))
    })
}

pub(super) fn discover_nodes(
    options: &DiscoveryOptions,
    env: &Environment,
) -> Result<(ClusterSpec, Vec<String>), Error> {
    let request = cluster::DiscoveryRequest {
        hostfile: options.hostfile.clone(),
        hosts: options.hosts.clone(),
        include: options.include.clone(),
        exclude: options.exclude.clone(),
    };
    let found = cluster::discover(&request, env, &local_hostname())?;
    Ok((found.spec, found.warnings))
}

pub(super) fn read_settings(
    options: &ModelOptions,
    megatron_args: &[String],
) -> Result<Settings, Error> {
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

/// Decides the hosts and how many workers each runs: discovery's nodes (or the cluster
/// file's, when there is no allocation), `--nproc-per-node`, and `--nnodes` checked
/// against what was found.
pub(super) fn nodes_section(
    mut spec: ClusterSpec,
    warnings: Vec<String>,
    profile: Option<(&Path, &ClusterProfile)>,
    nnodes: Option<NodeRange>,
    nproc_per_node: Option<NprocPerNode>,
) -> Result<NodesSection, Error> {
    if let Some((path, profile)) = profile {
        let profiled = profile_hosts(profile);
        if spec.source == NodeSource::Local {
            spec.nodes = profiled
                .iter()
                .map(|(host, gpus)| Node {
                    host: host.clone(),
                    slots: gpus.map_or(Slots::Unknown, Slots::Count),
                })
                .collect();
            spec.source = NodeSource::ClusterFile {
                path: path.display().to_string(),
            };
        } else if let Some(missing) = spec
            .nodes
            .iter()
            .find(|n| !profiled.iter().any(|(h, _)| h == &n.host))
        {
            return Err(Error::ClusterMismatch(format!(
                "{}: has no node {:?}, which the allocation includes (profile the allocated nodes again, or pass a cluster file that covers them)",
                path.display(),
                missing.host
            )));
        }
    }
    if let Some(range) = nnodes {
        check_node_count(range, &spec)?;
    }
    let gpu_model = |host: &str| {
        profile.and_then(|(_, p)| {
            p.nodes
                .iter()
                .find(|n| n.host == host)
                .and_then(|n| n.gpus()?.first().map(|g| g.name.clone()))
        })
    };
    let mut hosts = Vec::with_capacity(spec.nodes.len());
    for node in &spec.nodes {
        let known = node.slots.count().or_else(|| {
            profile.and_then(|(_, p)| {
                profile_hosts(p)
                    .into_iter()
                    .find(|(h, _)| h == &node.host)
                    .and_then(|(_, g)| g)
            })
        });
        let workers = match nproc_per_node {
            Some(NprocPerNode::Count(n)) => {
                if let Some(have) = known.filter(|have| n > *have) {
                    return Err(Error::Usage(format!(
                        "--nproc-per-node {n} but node {} has only {have} GPU slots (lower --nproc-per-node, or leave it out to use every GPU found)",
                        node.host
                    )));
                }
                Some(n)
            }
            None => Some(known.unwrap_or(1)),
            Some(NprocPerNode::Gpu | NprocPerNode::Auto) => known,
            Some(NprocPerNode::Cpu | NprocPerNode::Xpu) => None,
        };
        hosts.push(HostLine {
            host: node.host.clone(),
            workers,
            devices: match &node.slots {
                Slots::Devices(d) => Some(d.clone()),
                _ => None,
            },
            gpu: gpu_model(&node.host),
        });
    }
    let world_size = hosts
        .iter()
        .map(|h| h.workers.map(u64::from))
        .sum::<Option<u64>>();
    Ok(NodesSection {
        source: spec.source,
        job_id: spec.job_id,
        hosts,
        world_size,
        warnings,
    })
}

pub(super) fn check_node_count(range: NodeRange, spec: &ClusterSpec) -> Result<(), Error> {
    let found = spec.nodes.len();
    if range.contains(found) {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "--nnodes {range} but {found} node{} found ({}) (pipette-run uses the nodes it discovers: drop --nnodes, or fix the node list)",
        if found == 1 { " was" } else { "s were" },
        spec.nodes
            .iter()
            .map(|n| n.host.as_str())
            .collect::<Vec<_>>()
            .join(",")
    )))
}

/// Each profiled host and its GPU count (`None` when the file has no inventory).
pub(super) fn profile_hosts(profile: &ClusterProfile) -> Vec<(String, Option<u32>)> {
    profile
        .nodes
        .iter()
        .map(|n| (n.host.clone(), n.gpus().map(|g| g.len() as u32)))
        .collect()
}

pub(super) fn profile_summary(path: &Path, profile: &ClusterProfile) -> ProfileSummary {
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
    }
}

pub(super) fn model_section(settings: &Settings) -> ModelSection {
    ModelSection {
        spec: settings.model.clone(),
        parameters: params::total_parameters(&settings.model, 1),
        padded_vocab_size: params::padded_vocab_size(&settings.model, 1),
    }
}

pub(super) fn script_section(cli: &RunCli) -> ScriptSection {
    let t = &cli.torchrun;
    // torchrun's own precedence: --run-path over --no-python; -m is independent.
    let launch = if t.run_path {
        "run-path"
    } else if t.no_python {
        "no-python"
    } else if t.module {
        "module"
    } else {
        "python"
    };
    ScriptSection {
        program: cli.script().to_string(),
        launch,
        args: cli.script_args().to_vec(),
    }
}

/// How to reach these nodes, for profiling and for the launch alike: `--launcher` as
/// asked, else [`launch::choose_transport`]'s rule; ssh with `--ssh-config` when given.
pub(super) fn node_transport(
    launcher: Option<&str>,
    ssh_config: Option<&Path>,
    hosts: &[String],
    source: &NodeSource,
) -> Transport {
    let mut ssh = SshOptions::default();
    if let Some(config) = ssh_config {
        ssh.extra_args = vec!["-F".to_string(), config.display().to_string()];
    }
    launch::choose_transport(launcher, hosts, source, ssh)
}

/// The planner's options from the command line; the time options from the Megatron
/// arguments.
pub(super) fn plan_options(
    planning: &PlanningOptions,
    settings: &Settings,
    seed: u64,
) -> Result<PlanOptions, Error> {
    let mut options = PlanOptions {
        seed,
        mapping: planning.mapping,
        budget: planning.budget,
        top_k: planning.top_k.max(1),
        time_options: TimeOptions::from_training(&settings.training),
        ..PlanOptions::default()
    };
    if let Some(headroom) = planning.memory_headroom {
        options.headroom = headroom;
    }
    if let Some(path) = &planning.calibration {
        options.calibration = read_calibration(path)?;
    }
    Ok(options)
}

/// A calibration file: `pipette calibrate`'s report (its `calibration`), or a bare
/// calibration object.
pub(super) fn read_calibration(path: &Path) -> Result<Calibration, Error> {
    let bad = |detail: String| {
        Error::Usage(format!(
            "--calibration {}: {detail} (give a file `pipette calibrate --out FILE` wrote)",
            path.display()
        ))
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let object = value.get("calibration").cloned().unwrap_or(value);
    serde_json::from_value(object).map_err(|e| bad(e.to_string()))
}
