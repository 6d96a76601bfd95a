//! Launch: from a plan to torchrun running on every node.
//!
//! A [`JobSpec`] holds what every attempt of a job shares (the user's script and
//! arguments, torchrun's options, the environment, the transport, the run directory);
//! [`JobSpec::prepare`] renders one [`Attempt`] for a [`Layout`] — a plan on some nodes
//! with the settings and options it was planned from ([`Planned`]), or, with planning off,
//! the world torchrun would run — (with `--load SAVE` when it resumes, see
//! [`resume_args`]) and writes its files;
//! [`start`] runs its torchrun commands through the exec seam as a [`NodeGroup`] (which
//! stops them all: TERM, grace, KILL, in parallel), with the job's [`JobProcesses`] to pass
//! act signals to its workers and to [`sweep`] what a launcher left behind (torchrun starts
//! its workers in sessions of their own, so a killed or stopped torchrun can leave them
//! running); [`failure`] says what a node's end means; [`read_checkpoint`] says what the
//! user's save directory holds; [`output_lines`] reads what the job prints (Megatron's
//! iteration lines, torchrun's failure report).
//!
//! Every process of a job carries `PIPETTE_RUN_ID` (unique per pipette-run invocation) and
//! `PIPETTE_HOST` in its environment; that is how the sweep finds them, on any transport.
//!
//! Owns spawning and stopping a job's processes; does not watch them (that is
//! [`crate::supervise`]) and does not decide when to re-plan.

pub mod checkpoint;
pub mod failure;
pub mod output_lines;
mod processes;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::cluster::{ClusterProfile, NodeSource};
use crate::config::Settings;
use crate::exec::group::NodeGroup;
use crate::exec::{self, ExecOptions, NodeCommand, OutputSink, SrunOptions, SshOptions, Transport};
use crate::model::parallel::ParallelConfig;
use crate::plan::{Plan, PlanError, PlanOptions};
use crate::render::{self, LaunchSpec, RenderError, ScriptInvocation, Templates};

pub use crate::exec::group::NodeStop;
pub use checkpoint::{read_checkpoint, CheckpointState};
pub use processes::{
    environ_has, signal_workers, stopped_processes, sweep, JobProcesses, SIGNAL_WORKERS_SCRIPT,
    STOPPED_SCRIPT, SWEEP_SCRIPT,
};

/// The variable that marks every process of one pipette-run invocation.
pub const RUN_ID_VAR: &str = "PIPETTE_RUN_ID";

/// What every attempt of a job shares.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// The user's script and arguments, as given.
    pub script: ScriptInvocation,
    /// The torchrun executable on the nodes.
    pub torchrun: String,
    /// How that torchrun spells its options (underscores before PyTorch 2.1's dashes).
    pub torchrun_spelling: render::TorchrunSpelling,
    /// The user's other torchrun options.
    pub torchrun_passthrough: Vec<String>,
    /// The user's `--master-addr`; otherwise the rank-0 host (`127.0.0.1` with the local
    /// transport, where every "node" is this machine).
    pub master_addr: Option<String>,
    pub master_port: u16,
    pub rdzv_id: String,
    /// Environment for every node (see [`render::forwarded_env`]).
    pub env: BTreeMap<String, String>,
    /// The directory the commands run in, on every node.
    pub workdir: PathBuf,
    /// Attempt 1's files go here; attempt N's into `attempt-N/` below it.
    pub run_dir: PathBuf,
    pub templates: Templates,
    pub transport: Transport,
    /// Unique per invocation: the value of [`RUN_ID_VAR`] on every node. Empty for a
    /// preview (`--dry-run`), whose scripts pipette-run never supervises.
    pub run_id: String,
}

/// What one attempt runs on its nodes. Whether a job is planned is told by its layout
/// alone: a planned attempt carries what it was planned from, so a re-plan reads it there
/// and no second value can say otherwise.
#[derive(Debug, Clone)]
pub enum Layout {
    /// A plan on some nodes, with what it was planned from.
    Planned(Box<Planned>),
    /// With planning off: the world torchrun would run.
    World(World),
}

/// A planned attempt: the plan (tp, pp, dp, micro-batch, the rank mapping) on the nodes of
/// `profile`, and the settings and planner's options it was made with (a re-plan after a
/// failure plans again from them).
#[derive(Debug, Clone)]
pub struct Planned {
    /// The settings read from the Megatron arguments (with the pins the plan kept).
    pub settings: Settings,
    pub options: PlanOptions,
    pub plan: Plan,
    /// The nodes of this attempt.
    pub profile: ClusterProfile,
}

/// The world of an unplanned attempt: hosts in node-rank order, the same number of
/// workers on each (torchrun's `--nproc-per-node`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct World {
    pub hosts: Vec<String>,
    pub nproc_per_node: u64,
    /// Why the job is not planned, in one line (written into `world.json` by the
    /// renderer; the dry run's report says it once, beside the world).
    #[serde(skip)]
    pub why: String,
}

impl World {
    pub fn world_size(&self) -> u64 {
        self.hosts.len() as u64 * self.nproc_per_node
    }

    /// The same world on `survivors` (their order kept): what a relaunch after a failure
    /// runs, a smaller world with the same workers per node.
    pub fn on(&self, survivors: &[String]) -> World {
        World {
            hosts: survivors.to_vec(),
            nproc_per_node: self.nproc_per_node,
            why: self.why.clone(),
        }
    }
}

impl Layout {
    /// The plan's configuration; `None` for an unplanned world.
    pub fn config(&self) -> Option<&ParallelConfig> {
        match self {
            Layout::Planned(planned) => Some(&planned.plan.config),
            Layout::World(_) => None,
        }
    }

    /// The nodes' profile, when the attempt was planned on one.
    pub fn profile(&self) -> Option<&ClusterProfile> {
        match self {
            Layout::Planned(planned) => Some(&planned.profile),
            Layout::World(_) => None,
        }
    }

    /// The plan and what it was planned from; `None` for an unplanned world.
    pub fn planned(&self) -> Option<&Planned> {
        match self {
            Layout::Planned(planned) => Some(planned),
            Layout::World(_) => None,
        }
    }
}

/// One launch of the job: a layout on some nodes, rendered and written to its directory.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// 1 for the first launch.
    pub number: u32,
    pub dir: PathBuf,
    pub layout: Layout,
    pub spec: LaunchSpec,
    /// Where this attempt resumes from (relaunches of a job with `--save`).
    pub resume: Option<Resume>,
}

/// The checkpoint an attempt resumes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resume {
    /// The user's `--save` directory, given to the script as `--load`.
    pub dir: String,
    /// The iteration of the last checkpoint there, when it could be read.
    pub iteration: Option<u64>,
}

/// Why an attempt could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error(
        "the plan cannot be written as JSON: {0} (this is a bug in pipette-run; please report it)"
    )]
    PlanJson(String),
}

impl JobSpec {
    /// Attempt `number`'s directory.
    pub fn attempt_dir(&self, number: u32) -> PathBuf {
        if number <= 1 {
            self.run_dir.clone()
        } else {
            self.run_dir.join(format!("attempt-{number}"))
        }
    }

    /// Renders attempt `number` of `layout` and writes its files.
    pub fn prepare(
        &self,
        number: u32,
        layout: Layout,
        resume: Option<Resume>,
    ) -> Result<Attempt, LaunchError> {
        let dir = self.attempt_dir(number);
        let spec = match &layout {
            Layout::Planned(planned) => {
                self.render(&planned.settings, &planned.plan, resume.as_ref(), &dir)?
            }
            Layout::World(world) => self.render_world(world, &dir)?,
        };
        render::write_run_dir(&spec, &dir)?;
        Ok(Attempt {
            number,
            dir,
            layout,
            spec,
            resume,
        })
    }

    /// The launch of `world`, planning off (pure: nothing is written): the script and its
    /// arguments as given.
    pub fn render_world(&self, world: &World, dir: &Path) -> Result<LaunchSpec, LaunchError> {
        let input = render::WorldInput {
            script: self.script.clone(),
            node_order: &world.hosts,
            nproc_per_node: world.nproc_per_node,
            master_addr: self.master_addr_for_launch(),
            master_port: self.master_port,
            rdzv_id: self.rdzv_id.clone(),
            torchrun: self.torchrun.clone(),
            torchrun_passthrough: self.torchrun_passthrough.clone(),
            torchrun_spelling: self.torchrun_spelling,
            env: self.env_for_launch(),
            workdir: self.workdir.display().to_string(),
            run_dir: dir.display().to_string(),
            planning_off: world.why.clone(),
        };
        Ok(render::render_world(&input, &self.templates)?)
    }

    /// The user's `--master-addr`, else `127.0.0.1` with the local transport (where every
    /// "node" is this machine), else the rank-0 host (`None`).
    fn master_addr_for_launch(&self) -> Option<String> {
        self.master_addr
            .clone()
            .or_else(|| (self.transport == Transport::Local).then(|| "127.0.0.1".to_string()))
    }

    /// The environment of every node: the forwarded variables and the run id.
    fn env_for_launch(&self) -> BTreeMap<String, String> {
        let mut env = self.env.clone();
        if !self.run_id.is_empty() {
            env.insert(RUN_ID_VAR.to_string(), self.run_id.clone());
        }
        env
    }

    /// The launch of `plan`, made with `settings` (pure: nothing is written).
    pub fn render(
        &self,
        settings: &Settings,
        plan: &Plan,
        resume: Option<&Resume>,
        dir: &Path,
    ) -> Result<LaunchSpec, LaunchError> {
        let mut script = self.script.clone();
        let mut notes = Vec::new();
        if let Some(resume) = resume {
            let (args, dropped) = resume_args(&script.args, &resume.dir);
            script.args = args;
            notes = dropped;
        }
        let mut input = render::RenderInput::new(
            settings,
            script,
            &plan.config,
            &plan.mapping.node_order,
            &plan.mapping.cuda_visible_devices,
        );
        input.master_addr = self.master_addr_for_launch();
        input.master_port = self.master_port;
        input.rdzv_id = self.rdzv_id.clone();
        input.torchrun = self.torchrun.clone();
        input.torchrun_spelling = self.torchrun_spelling;
        input.torchrun_passthrough = self.torchrun_passthrough.clone();
        input.env = self.env_for_launch();
        input.workdir = self.workdir.display().to_string();
        input.run_dir = dir.display().to_string();
        input.plan_json =
            serde_json::to_value(plan).map_err(|e| LaunchError::PlanJson(e.to_string()))?;
        let mut spec = render::render(&input, &self.templates)?;
        spec.notes.extend(notes);
        Ok(spec)
    }

    /// The command that runs node `index` of `spec` (its torchrun, environment and working
    /// directory).
    pub fn node_command(&self, spec: &LaunchSpec, index: usize) -> NodeCommand {
        let node = &spec.nodes[index];
        let mut command = NodeCommand::new(node.argv[0].clone())
            .args(node.argv[1..].iter().cloned())
            .cwd(&self.workdir);
        // A credential's value is not in the spec (it is written and shown): it is taken
        // here, at launch, from pipette-run's own environment, and kept off the nodes'
        // command lines (a secret, not an environment word).
        for (name, value) in &node.env {
            match render::is_credential_var(name, value) {
                true => command
                    .secrets
                    .extend(self.env.get(name).map(|v| (name.clone(), v.clone()))),
                false => command.env.push((name.clone(), value.clone())),
            }
        }
        command
    }
}

/// How the nodes are reached, as `--launcher` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// Every node is this machine: run the commands here.
    Local,
    Ssh,
    Srun,
}

/// How to reach the nodes: as asked (`--launcher`), else locally when every node is this
/// machine (or no allocation was found), with srun inside a Slurm allocation, else ssh.
pub fn choose_transport(
    asked: Option<Launcher>,
    hosts: &[String],
    source: &NodeSource,
    ssh: SshOptions,
) -> Transport {
    match asked {
        Some(Launcher::Local) => Transport::Local,
        Some(Launcher::Srun) => Transport::Srun(SrunOptions::default()),
        Some(Launcher::Ssh) => Transport::Ssh(ssh),
        None if *source == NodeSource::Local || hosts.iter().all(|h| exec::is_local_host(h)) => {
            Transport::Local
        }
        None if matches!(source, NodeSource::Slurm { .. }) => {
            Transport::Srun(SrunOptions::default())
        }
        None => Transport::Ssh(ssh),
    }
}

/// Megatron options a relaunch must not keep: they would keep it from resuming the
/// checkpoint of this very run (`--finetune` starts again at iteration 0, the others load
/// only part of it or an older one). Flags, except `ckpt-step` (with a value).
const NOT_ON_RESUME: &[&str] = &["finetune", "no-load-optim", "no-load-rng", "ckpt-step"];

/// The user's arguments for a relaunch that resumes from `save`: every `--load` replaced
/// by one `--load SAVE` (before a `--`, which ends Megatron's options), and `--finetune`,
/// `--no-load-optim`, `--no-load-rng` and `--ckpt-step N` dropped. Returns the arguments
/// and a note per change.
pub fn resume_args(args: &[String], save: &str) -> (Vec<String>, Vec<String>) {
    let mut names = vec!["load"];
    names.extend(NOT_ON_RESUME);
    let (mut out, dropped, tail) = drop_options(args, &names, &["load", "ckpt-step"]);
    let mut notes = Vec::new();
    let mut old_load = None;
    for (name, value) in dropped {
        if name == "load" {
            old_load = value;
        } else {
            notes.push(format!(
                "dropped --{name}{} to resume this run's checkpoint",
                value.map(|v| format!(" {v}")).unwrap_or_default()
            ));
        }
    }
    match old_load {
        Some(old) if old != save => notes.push(format!(
            "--load {old} replaced by --load {save} (the --save directory) to resume"
        )),
        Some(_) => {}
        None => notes.push(format!(
            "added --load {save} (the --save directory) to resume"
        )),
    }
    out.push("--load".to_string());
    out.push(save.to_string());
    out.extend(tail.iter().cloned());
    (out, notes)
}

// The arguments' one reader decides which word is an option's value.
pub use crate::config::megatron::argparse::{drop_options, DroppedOption};

/// Starts every node's torchrun of `attempt` (node-rank order) as one group, with the
/// job's processes for act signals and the sweep (each such command bounded by
/// `command_timeout`). A node whose command cannot be started is reported by the group's
/// first poll; the others run.
pub fn start(
    template: &JobSpec,
    attempt: &Attempt,
    sink: Arc<dyn OutputSink>,
    grace: Duration,
    command_timeout: Duration,
) -> NodeGroup {
    let options = ExecOptions {
        grace,
        // Enough of the end to read torchrun's failure report.
        capture_limit: Some(64 << 10),
        sink: Some(sink),
    };
    let commands: Vec<(String, NodeCommand)> = attempt
        .spec
        .nodes
        .iter()
        .enumerate()
        .map(|(index, node)| {
            (
                node.host.clone(),
                template.node_command(&attempt.spec, index),
            )
        })
        .collect();
    NodeGroup::start(&template.transport, &commands, &options).with_workers(Arc::new(
        JobProcesses {
            transport: template.transport.clone(),
            run_id: template.run_id.clone(),
            timeout: command_timeout,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn resuming_loads_the_save_directory() {
        let (args, notes) =
            resume_args(&words("--num-layers 2 --save /ck --save-interval 5"), "/ck");
        assert_eq!(
            args,
            words("--num-layers 2 --save /ck --save-interval 5 --load /ck")
        );
        assert_eq!(notes, ["added --load /ck (the --save directory) to resume"]);

        let (args, notes) = resume_args(
            &words("--load /pretrained --finetune --save /ck --no-load-optim --ckpt-step 7 -- extra --load x"),
            "/ck",
        );
        assert_eq!(args, words("--save /ck --load /ck -- extra --load x"));
        assert_eq!(notes.len(), 4, "{notes:?}");
        assert!(notes
            .iter()
            .any(|n| n.contains("--load /pretrained replaced")));

        let (args, notes) = resume_args(&words("--load=/ck --save /ck"), "/ck");
        assert_eq!(args, words("--save /ck --load /ck"));
        assert!(notes.is_empty());
    }

    #[test]
    fn transport_follows_the_nodes() {
        let hosts = |h: &[&str]| h.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let ssh = SshOptions::default();
        assert_eq!(
            choose_transport(
                None,
                &hosts(&["localhost"]),
                &NodeSource::Hosts,
                ssh.clone()
            ),
            Transport::Local
        );
        assert_eq!(
            choose_transport(
                Some(Launcher::Local),
                &hosts(&["gpu1", "gpu2"]),
                &NodeSource::Hosts,
                ssh.clone()
            ),
            Transport::Local
        );
        assert!(matches!(
            choose_transport(
                None,
                &hosts(&["gpu1", "gpu2"]),
                &NodeSource::Hosts,
                ssh.clone()
            ),
            Transport::Ssh(_)
        ));
        let slurm = NodeSource::Slurm {
            variable: "SLURM_JOB_NODELIST".into(),
        };
        assert!(matches!(
            choose_transport(None, &hosts(&["gpu1", "gpu2"]), &slurm, ssh),
            Transport::Srun(_)
        ));
    }
}
