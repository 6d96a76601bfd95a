//! A run's configuration, resolved once: `pipette-run`'s command line and environment
//! become one [`RunConfig`] as soon as they are parsed, and the rest of the orchestrator
//! reads that (or the resolved piece it needs), never the clap types of [`crate::cli`].
//!
//! Resolving does no I/O and cannot fail: files the options name (the cluster profile,
//! `--calibration`, `--templates`) are read where they always were, so their errors still
//! come after discovery's and the settings', in the same order as before.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::options::Stragglers;
use super::ResolveError;
use crate::cli::{
    AccessOptions, DiscoveryOptions, ModelOptions, NodeOptions, PlanningOptions, RunCli,
};
use crate::cluster::allocation::NodeRange;
use crate::cluster::{AllocationRequest, ClusterSpec, DiscoveryRequest, Environment, NodeSource};
use crate::config::Settings;
use crate::exec::{SshOptions, Transport};
use crate::launch;
use crate::log;
use crate::model::time::TimeOptions;
use crate::model::Calibration;
use crate::plan::PlanOptions;
use crate::render;
use crate::supervise;
use crate::trial::choice::TopK;

/// Everything `pipette-run` (and `pipette calibrate`) was asked to do.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// How results are shown.
    pub output: OutputMode,
    /// The user's script, how torchrun runs it, and its arguments.
    pub script: render::ScriptInvocation,
    /// Where the nodes come from.
    pub discovery: DiscoveryInputs,
    /// `--nnodes` and `--nproc-per-node`, for [`crate::cluster::allocate`].
    pub allocation: AllocationRequest,
    /// The preset and pins the settings are read with (besides the script's arguments).
    pub settings: SettingsInputs,
    /// `--reprofile`: measure the nodes even when a cached profile is fresh.
    pub reprofile: bool,
    pub planning: PlanningConfig,
    pub trial: TrialConfig,
    pub launch: LaunchConfig,
    pub supervise: supervise::SuperviseOptions,
    /// The environment every node gets: [`render::forwarded_env`]'s until
    /// [`RunConfig::resolve_node_env`] adds the env files and `--env`.
    pub node_env: BTreeMap<String, String>,
    /// `--env` and `--env-file`.
    pub env_request: super::node_env::EnvRequest,
}

/// How results are shown.
#[derive(Debug, Clone, Copy)]
pub struct OutputMode {
    /// `--dry-run`: plan and render, launch nothing.
    pub dry_run: bool,
    /// `--json`: one JSON value on stdout, everything else on stderr.
    pub json: bool,
}

/// Which of our lines are shown ([`log::Filter`]): `-q` warnings and errors, `-v` DEBUG
/// too (the whole plan report), else INFO; `PIPETTE_LOG` on top (see [`crate::log`]).
pub fn log_filter(
    options: &crate::cli::LogOptions,
    env: &Environment,
) -> Result<log::Filter, ResolveError> {
    let level = match (options.quiet, options.verbose) {
        (true, _) => log::Level::Warn,
        (false, true) => log::Level::Debug,
        (false, false) => log::Level::Info,
    };
    let flags_chose = options.quiet || options.verbose;
    match env.get("PIPETTE_LOG") {
        None => Ok(log::Filter::new(level)),
        Some(spec) => log::Filter::parse(spec, level, flags_chose).map_err(|e| {
            ResolveError::Usage(format!(
                "PIPETTE_LOG={spec}: {e} (write LEVEL or TARGET=LEVEL, comma separated: \
                 error, warn, info, debug, trace or off; e.g. `warn,progress=info`)"
            ))
        }),
    }
}

/// What node discovery reads.
#[derive(Debug, Clone)]
pub struct DiscoveryInputs {
    pub request: DiscoveryRequest,
    /// `--cluster`: the cluster profile file (read when the run's inputs are gathered).
    pub cluster_file: Option<PathBuf>,
    /// The environment (Slurm and PBS variables).
    pub environment: Environment,
    /// The nodes of the copies of pipette-run that joined this one, their leader.
    pub copies: Option<ClusterSpec>,
}

/// What the model and training settings are read with, besides Megatron arguments.
#[derive(Debug, Clone)]
pub struct SettingsInputs {
    /// `--model`.
    pub preset: Option<String>,
    /// `--pin`, parsed when the settings are read.
    pub pin: Option<String>,
}

/// The planner's options as far as the command line sets them.
#[derive(Debug, Clone)]
pub struct PlanningConfig {
    /// Seed, mapping mode, budget, top-k and headroom; the time options and calibration
    /// are filled in by [`PlanningConfig::plan_options`].
    pub base: PlanOptions,
    /// `--calibration`, read when the plan options are made.
    pub calibration: Option<PathBuf>,
}

/// The trial run before the launch.
#[derive(Debug, Clone)]
pub struct TrialConfig {
    /// Whether the launch runs a trial: not with `--no-trial`, nor with `--calibration`.
    pub before_launch: bool,
    pub iters: u64,
    pub timeout: Duration,
    /// `--trial-micro-batches`: the sizes of the first round (default: the plan's).
    pub micro_batches: Option<Vec<u64>>,
    /// `--trial-top-k`: the candidates of the measured choice.
    pub top_k: TopK,
}

/// What the launch renders with and how it reaches the nodes.
#[derive(Debug, Clone)]
pub struct LaunchConfig {
    /// `--run-dir`, relative to the working directory.
    pub run_dir: Option<PathBuf>,
    /// `--templates`, read when the job template is made.
    pub templates: Option<PathBuf>,
    /// The torchrun executable on the nodes.
    pub torchrun: String,
    /// The user's torchrun options that are handed on to torchrun.
    pub torchrun_passthrough: Vec<String>,
    pub master_addr: Option<String>,
    pub master_port: u16,
    /// `--rdzv-id`, when the user set one.
    pub rdzv_id: Option<String>,
    pub access: NodeAccess,
}

/// How to reach the nodes, as the command line said.
#[derive(Debug, Clone, Default)]
pub struct NodeAccess {
    /// `--launcher`: local, ssh or srun.
    pub launcher: Option<launch::Launcher>,
    /// `--ssh-config`.
    pub ssh_config: Option<PathBuf>,
    /// The leader of one copy per node reaches every node through its copy.
    pub agents: Option<Transport>,
    /// `--ssh-args`, after `--ssh-config`'s `-F`.
    pub ssh_args: Vec<String>,
    /// `--srun-args`.
    pub srun_args: Vec<String>,
}

impl RunConfig {
    /// Resolves `pipette-run`'s command line, with the environment it runs in.
    pub fn resolve(cli: &RunCli, env: Environment) -> RunConfig {
        let t = &cli.torchrun;
        let s = &cli.supervise;
        let endpoint = rendezvous_endpoint(&t.rdzv_endpoint);
        let settings = SettingsInputs::new(&cli.model);
        let planned =
            crate::config::planning_off(cli.script_args(), settings.preset.as_deref()).is_none();
        // Planned: silence before the first iteration fails the job after --startup-timeout,
        // else --stall-timeout. With planning off only --startup-timeout as given does:
        // torchrun never gives up on a quiet script, and a script that is not Megatron's
        // prints no iteration lines by which progress could be told.
        let startup_timeout = match planned {
            true => Some(s.startup_timeout.unwrap_or(s.stall_timeout)),
            false => s.startup_timeout,
        };
        RunConfig {
            output: OutputMode {
                dry_run: cli.pipette.dry_run,
                json: cli.pipette.json,
            },
            script: render::ScriptInvocation {
                program: cli.script().to_string(),
                module: t.module,
                no_python: t.no_python,
                run_path: t.run_path,
                args: cli.script_args().to_vec(),
            },
            allocation: AllocationRequest {
                nnodes: t.nnodes,
                nproc_per_node: t.nproc_per_node,
            },
            settings,
            reprofile: cli.profiling.reprofile,
            planning: PlanningConfig::new(&cli.planning, cli.pipette.seed).with_min_nodes(t.nnodes),
            trial: TrialConfig {
                before_launch: !cli.trial.no_trial && cli.planning.calibration.is_none(),
                iters: cli.trial.trial_iters,
                timeout: cli.trial.trial_timeout,
                micro_batches: cli.trial.trial_micro_batches.clone(),
                top_k: cli
                    .trial
                    .trial_top_k
                    .map_or(TopK::Ties, |k| TopK::Count(k as usize)),
            },
            launch: LaunchConfig {
                run_dir: cli.launch.run_dir.clone(),
                templates: cli.launch.templates.clone(),
                torchrun: s.access.torchrun.clone(),
                torchrun_passthrough: t.passthrough_args(),
                master_addr: endpoint.0.or_else(|| t.master_addr.clone()),
                master_port: endpoint.1.unwrap_or(t.master_port),
                rdzv_id: (t.rdzv_id != "none").then(|| t.rdzv_id.clone()),
                access: NodeAccess::new(&s.access, &cli.nodes),
            },
            supervise: supervise::SuperviseOptions {
                grace: s.grace,
                stall_timeout: (!s.stall_timeout.is_zero()).then_some(s.stall_timeout),
                startup_timeout: startup_timeout.filter(|d| !d.is_zero()),
                max_replans: s.max_replans,
                health_timeout: s.health_timeout,
                progress_interval: match cli.log.quiet {
                    true => Duration::ZERO,
                    false => s.progress_interval,
                },
                // With --json, stdout carries the one result object and nothing else.
                echo: if cli.pipette.json {
                    supervise::Echo::Stderr
                } else {
                    supervise::Echo::Streams
                },
                stragglers: supervise::stragglers::StragglerOptions {
                    mode: match s.stragglers {
                        Stragglers::Off => supervise::stragglers::StragglerMode::Off,
                        Stragglers::Report => supervise::stragglers::StragglerMode::Report,
                        Stragglers::Act => supervise::stragglers::StragglerMode::Act,
                    },
                    threshold: s.straggler_threshold,
                    windows: s.straggler_windows,
                    cooldown: s.straggler_cooldown,
                },
                ..supervise::SuperviseOptions::default()
            },
            node_env: forwarded_env(&env),
            env_request: super::node_env::EnvRequest::new(&cli.nodes),
            discovery: DiscoveryInputs::new(&cli.discovery, env),
        }
    }
}

impl RunConfig {
    /// Why the job is not planned, when it is not (see [`crate::config::planning_off`]).
    pub fn planning_off(&self) -> Option<String> {
        crate::config::planning_off(&self.script.args, self.settings.preset.as_deref())
    }

    /// Fills in `node_env` (see [`super::node_env`]): reads the env files, and says on
    /// stderr which it read.
    pub fn resolve_node_env(&mut self) -> Result<(), ResolveError> {
        self.node_env =
            super::node_env::announced_node_env(&self.discovery.environment, &self.env_request)?;
        Ok(())
    }

    /// The configuration of the leader of one copy per node: the nodes are the copies'
    /// (`spec`), reached through them (`transport`); torchrun's master is the plan's first
    /// node (the leader's address names only where the copies meet), and a `--local-addr`
    /// names only the leader's node, so no node's torchrun gets it.
    pub fn lead(&mut self, spec: ClusterSpec, transport: Transport) {
        self.discovery.copies = Some(spec);
        self.launch.access.agents = Some(transport);
        self.launch.master_addr = None;
        self.launch
            .torchrun_passthrough
            .retain(|a| !a.starts_with("--local-addr="));
    }
}

impl DiscoveryInputs {
    pub fn new(options: &DiscoveryOptions, environment: Environment) -> Self {
        DiscoveryInputs {
            request: DiscoveryRequest {
                hostfile: options.hostfile.clone(),
                hosts: options.hosts.clone(),
                include: options.include.clone(),
                exclude: options.exclude.clone(),
                cluster_file: options.cluster.is_some(),
            },
            cluster_file: options.cluster.clone(),
            environment,
            copies: None,
        }
    }
}

impl SettingsInputs {
    pub fn new(options: &ModelOptions) -> Self {
        SettingsInputs {
            preset: options.preset.clone(),
            pin: options.pin.clone(),
        }
    }
}

impl PlanningConfig {
    pub fn new(planning: &PlanningOptions, seed: u64) -> Self {
        let mut base = PlanOptions {
            seed,
            mapping: planning.mapping,
            budget: planning.budget,
            top_k: planning.top_k.max(1),
            mapping_threshold: planning.mapping_threshold / 100.0,
            ..PlanOptions::default()
        };
        base.nodes.spares = planning.spares;
        if let Some(headroom) = planning.memory_headroom {
            base.headroom = headroom;
        }
        PlanningConfig {
            base,
            calibration: planning.calibration.clone(),
        }
    }

    /// `--nnodes MIN:MAX`: the plan uses at least MIN nodes, the nodes above its need are
    /// spares. A single count (`--nnodes N`) only checks the nodes found, as before.
    pub fn with_min_nodes(mut self, nnodes: Option<NodeRange>) -> Self {
        if let Some(range) = nnodes.filter(|r| r.min < r.max) {
            self.base.nodes.min_nodes = range.min as usize;
        }
        self
    }

    /// The planner's options for these settings: the time options from the Megatron
    /// arguments, the calibration from `--calibration` (read now).
    pub fn plan_options(&self, settings: &Settings) -> Result<PlanOptions, ResolveError> {
        let mut options = PlanOptions {
            time_options: TimeOptions::from_training(&settings.training),
            ..self.base.clone()
        };
        if let Some(path) = &self.calibration {
            options.calibration = read_calibration(path)?;
        }
        Ok(options)
    }
}

impl NodeAccess {
    /// `--launcher`, `--ssh-config`, `--ssh-args` and `--srun-args` as given.
    pub fn new(access: &AccessOptions, nodes: &NodeOptions) -> NodeAccess {
        NodeAccess {
            launcher: access.launcher.map(launch::Launcher::from),
            ssh_config: access.ssh_config.clone(),
            agents: None,
            ssh_args: nodes.ssh_args.clone().unwrap_or_default().0,
            srun_args: nodes.srun_args.clone().unwrap_or_default().0,
        }
    }

    /// How to reach these nodes, for profiling and for the launch alike: `--launcher` as
    /// asked, else [`launch::choose_transport`]'s rule; ssh with `--ssh-config` and
    /// `--ssh-args` when given, srun with `--srun-args`.
    pub fn transport(&self, hosts: &[String], source: &NodeSource) -> Transport {
        if let Some(agents) = &self.agents {
            return agents.clone();
        }
        let mut ssh = SshOptions::default();
        if let Some(config) = &self.ssh_config {
            ssh.extra_args = vec!["-F".to_string(), config.display().to_string()];
        }
        ssh.extra_args.extend(self.ssh_args.iter().cloned());
        match launch::choose_transport(self.launcher, hosts, source, ssh) {
            Transport::Srun(mut srun) => {
                srun.extra_args.extend(self.srun_args.iter().cloned());
                Transport::Srun(srun)
            }
            other => other,
        }
    }
}

/// torchrun's `--rdzv-endpoint HOST[:PORT]` (`[V6]:PORT` too): the rank-0 node's address
/// and port, which win over `--master-addr`/`--master-port` as they do in torchrun.
/// Empty: neither.
pub fn rendezvous_endpoint(endpoint: &str) -> (Option<String>, Option<u16>) {
    let endpoint = endpoint.trim();
    if endpoint.is_empty() {
        return (None, None);
    }
    let (host, port) = match endpoint.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && (!host.contains(':') || host.ends_with(']')) => {
            (host, port.parse().ok())
        }
        _ => (endpoint, None),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (Some(host.to_string()), port)
}

/// The part of the environment every node gets.
pub fn forwarded_env(env: &Environment) -> BTreeMap<String, String> {
    render::forwarded_env(env.iter().map(|(k, v)| (k.clone(), v.clone())))
}

/// A calibration file: `pipette calibrate`'s report (its `calibration`), or a bare
/// calibration object.
pub fn read_calibration(path: &Path) -> Result<Calibration, ResolveError> {
    let bad = |detail: String| {
        ResolveError::Usage(format!(
            "--calibration {}: {detail} (give a file `pipette calibrate --out FILE` wrote)",
            path.display()
        ))
    };
    let text = crate::input_file::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let object = value.get("calibration").cloned().unwrap_or(value);
    // serde would read `[]` as a struct of defaults.
    if !object.is_object() {
        return Err(bad(
            "is not a JSON object of calibration factors".to_string()
        ));
    }
    let calibration: Calibration =
        serde_json::from_value(object).map_err(|e| bad(e.to_string()))?;
    calibration.check().map_err(bad)?;
    Ok(calibration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::allocation::{NodeRange, NprocPerNode};
    use crate::plan::MemoryHeadroom;
    use clap::Parser;

    fn resolve(args: &[&str]) -> RunConfig {
        let words = std::iter::once("pipette-run").chain(args.iter().copied());
        let cli = RunCli::try_parse_from(words).expect("a valid command line");
        RunConfig::resolve(&cli, Environment::new())
    }

    #[test]
    fn defaults_resolve_as_torchrun_and_pipette_run_document_them() {
        let c = resolve(&["train.py", "--lr", "1"]);
        assert_eq!(c.script.program, "train.py");
        assert_eq!(c.script.args, ["--lr", "1"]);
        assert!(!c.script.module && !c.script.no_python && !c.script.run_path);
        assert!(!c.output.dry_run && !c.output.json);
        assert_eq!(c.allocation, AllocationRequest::default());
        assert_eq!(c.launch.rdzv_id, None);
        assert_eq!(c.launch.master_port, 29500);
        assert!(c.launch.torchrun_passthrough.is_empty());
        assert!(c.trial.before_launch);
        assert_eq!(c.planning.base.top_k, crate::plan::search::DEFAULT_TOP_K);
        let s = &c.supervise;
        assert_eq!(s.stall_timeout, Some(Duration::from_secs(30 * 60)));
        // Planning is off (no model arguments): only --startup-timeout as given limits
        // the silence before the first iteration.
        assert_eq!(s.startup_timeout, None);
        let given = resolve(&["--startup-timeout", "5min", "train.py"]);
        assert_eq!(
            given.supervise.startup_timeout,
            Some(Duration::from_secs(300))
        );
        // Planned, it follows the stall timeout unless given.
        let planned = resolve(&["train.py", "--num-layers", "2"]);
        assert_eq!(planned.supervise.startup_timeout, s.stall_timeout);
        assert!(matches!(s.echo, supervise::Echo::Streams));
    }

    #[test]
    fn the_rendezvous_endpoint_names_the_master() {
        assert_eq!(rendezvous_endpoint(""), (None, None));
        assert_eq!(
            rendezvous_endpoint("n0:29400"),
            (Some("n0".to_string()), Some(29400))
        );
        assert_eq!(rendezvous_endpoint("n0"), (Some("n0".to_string()), None));
        assert_eq!(
            rendezvous_endpoint("[::1]:7"),
            (Some("::1".to_string()), Some(7))
        );
        assert_eq!(
            rendezvous_endpoint("fe80::1"),
            (Some("fe80::1".to_string()), None)
        );
        let c = resolve(&["--rdzv-endpoint", "n3:1234", "--master-addr", "n0", "t.py"]);
        assert_eq!(c.launch.master_addr.as_deref(), Some("n3"));
        assert_eq!(c.launch.master_port, 1234);
        // Planning is off (no model arguments): no --startup-timeout, no limit.
        assert_eq!(c.supervise.startup_timeout, None);
    }

    #[test]
    fn options_resolve_into_their_pieces() {
        let c = resolve(&[
            "--json",
            "--dry-run",
            "--nnodes",
            "1:2",
            "--nproc-per-node",
            "4",
            "--calibration",
            "cal.json",
            "--top-k",
            "0",
            "--memory-headroom",
            "4GiB",
            "--stall-timeout",
            "0",
            "--rdzv-id",
            "job7",
            "--max-restarts",
            "2",
            "-m",
            "pkg.train",
        ]);
        assert!(c.output.dry_run && c.output.json);
        assert!(c.script.module);
        assert_eq!(c.script.program, "pkg.train");
        assert_eq!(
            c.allocation,
            AllocationRequest {
                nnodes: Some(NodeRange { min: 1, max: 2 }),
                nproc_per_node: Some(NprocPerNode::Count(4)),
            }
        );
        // --calibration replaces the trial; it is read only when the plan options are made.
        assert!(!c.trial.before_launch);
        assert_eq!(c.planning.calibration, Some(PathBuf::from("cal.json")));
        assert_eq!(c.planning.base.top_k, 1);
        assert_eq!(c.planning.base.headroom, MemoryHeadroom::Bytes(4 << 30));
        assert_eq!(c.launch.rdzv_id.as_deref(), Some("job7"));
        assert_eq!(
            c.launch.torchrun_passthrough,
            ["--max-restarts=2", "--module"]
        );
        // `0` never gives up, before the first iteration either.
        assert_eq!(c.supervise.stall_timeout, None);
        assert_eq!(c.supervise.startup_timeout, None);
        // stdout carries the one JSON result.
        assert!(matches!(c.supervise.echo, supervise::Echo::Stderr));
    }
}
