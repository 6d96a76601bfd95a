//! Render: from a plan to the files that launch it — the Megatron arguments, one torchrun
//! launch script per node, the DeepSpeed hostfile and `ds_config.json` when the script is
//! DeepSpeed-based, the plan as JSON and a README — as a [`LaunchSpec`].
//!
//! Owns: rewriting the user's Megatron arguments ([`megatron`]), torchrun's command line
//! and option spellings ([`torchrun`]), one-line text for comments ([`shell`]) and the templates
//! ([`templates`]); for a script pipette-run does not plan, the launch of the world torchrun
//! would run, its arguments untouched ([`render_world`]). Pure: [`render`] does no I/O. The one function that touches the disk,
//! [`write_run_dir`], sits apart at the edge; reading a `--templates` directory is
//! [`Templates::from_dir`]. Must not plan, discover or launch anything.
//!
//! The rank mapping is realised with torchrun's static rendezvous: global rank
//! `r = node_rank · nproc + local_rank`, and local rank `i` runs on the `i`-th GPU of the
//! node's `CUDA_VISIBLE_DEVICES` (with `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so indices are
//! nvidia-smi's). So node rank `n` goes to `node_order[n]`, whose launch script exports
//! that host's `cuda_visible_devices` list in order.
//!
//! Nothing a user, a scheduler or a host name supplies is ever read by a shell: every value
//! in a launch script is one quoted word ([`shell::word`]: single-quoted, or bash's `$'…'`
//! with escapes where it holds a control character), and templates receive values already
//! quoted.

pub mod megatron;
mod run_dir;
pub mod shell;
pub mod templates;
pub mod torchrun;
mod world;

use std::collections::{BTreeMap, BTreeSet};

use minijinja::{context, Value};
use serde::{Deserialize, Serialize};

use crate::config::{Precision, Recompute, Settings};

use crate::model::parallel::ParallelConfig;

pub use megatron::{megatron_args, uses_deepspeed, MegatronArgs};
pub use run_dir::{claim_run_dir, default_run_dir, refuse_existing_run_dir, write_run_dir};
pub use templates::Templates;
pub use torchrun::TorchrunSpelling;
pub use world::{render_world, WorldInput};

/// How torchrun runs the user's SCRIPT, as the command line said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptInvocation {
    /// SCRIPT: a Python file, a module name (`module`), or a program (`no_python`).
    pub program: String,
    /// `-m`: SCRIPT is a module.
    pub module: bool,
    /// `--no-python`: SCRIPT is run directly.
    pub no_python: bool,
    /// `--run-path`: SCRIPT is run with `runpy.run_path`.
    pub run_path: bool,
    /// The user's arguments after SCRIPT, as given.
    pub args: Vec<String>,
}

impl ScriptInvocation {
    /// A Python script with its arguments.
    pub fn python(program: impl Into<String>, args: Vec<String>) -> Self {
        ScriptInvocation {
            program: program.into(),
            module: false,
            no_python: false,
            run_path: false,
            args,
        }
    }
}

/// Everything [`render`] needs: the plan, the mapping, and how to launch.
#[derive(Debug, Clone)]
pub struct RenderInput<'a> {
    pub settings: &'a Settings,
    pub script: ScriptInvocation,
    pub config: &'a ParallelConfig,
    /// Node rank → host.
    pub node_order: &'a [String],
    /// Host → the physical GPUs its local ranks run on, local rank order.
    pub cuda_visible_devices: &'a BTreeMap<String, Vec<u32>>,
    pub nproc_per_node: u64,
    /// The rank-0 node's address; default `node_order[0]`.
    pub master_addr: Option<String>,
    /// A port free on the rank-0 node (the caller finds one).
    pub master_port: u16,
    /// The rendezvous id: the scheduler's job id when there is one.
    pub rdzv_id: String,
    /// The torchrun executable (default `torchrun`).
    pub torchrun: String,
    /// The user's other torchrun options ([`crate::cli::torchrun::TorchrunOptions::passthrough_args`]).
    pub torchrun_passthrough: Vec<String>,
    /// How the installed torchrun spells options ([`TorchrunSpelling::from_help`]).
    pub torchrun_spelling: TorchrunSpelling,
    /// Environment to set on every node (the user's NCCL_* and the like, see
    /// [`forwarded_env`]). The mapping's variables win over these.
    pub env: BTreeMap<String, String>,
    /// The working directory the scripts `cd` into.
    pub workdir: String,
    /// Where the files will be written (absolute): DeepSpeed's config path points there.
    pub run_dir: String,
    /// The plan, written as `plan.json` (opaque here, [`PLAN_SCHEMA`] added); `null`
    /// writes the configuration and the mapping instead.
    pub plan_json: serde_json::Value,
}

/// The schema name and version of `plan.json` in a run directory (its `schema` field):
/// the planner's `Plan` as JSON, or, for a script run with planning off, the
/// configuration and the mapping alone.
pub const PLAN_SCHEMA: &str = "pipette-plan/1";

impl<'a> RenderInput<'a> {
    /// An input with the defaults: `torchrun` with dashes on port 29500, rendezvous id
    /// `none`, no pass-through options or environment, working directory `.`, run
    /// directory `pipette-run`, `nproc_per_node` from the first host's GPU list.
    pub fn new(
        settings: &'a Settings,
        script: ScriptInvocation,
        config: &'a ParallelConfig,
        node_order: &'a [String],
        cuda_visible_devices: &'a BTreeMap<String, Vec<u32>>,
    ) -> Self {
        let nproc_per_node = node_order
            .first()
            .and_then(|h| cuda_visible_devices.get(h))
            .map_or(0, |gpus| gpus.len() as u64);
        RenderInput {
            settings,
            script,
            config,
            node_order,
            cuda_visible_devices,
            nproc_per_node,
            master_addr: None,
            master_port: 29500,
            rdzv_id: "none".to_string(),
            torchrun: "torchrun".to_string(),
            torchrun_passthrough: Vec::new(),
            torchrun_spelling: TorchrunSpelling::Dashes,
            env: BTreeMap::new(),
            workdir: ".".to_string(),
            run_dir: "pipette-run".to_string(),
            plan_json: serde_json::Value::Null,
        }
    }
}

/// What runs on every node, and the files of the run directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// The arguments after SCRIPT, as the training script sees them.
    pub megatron_args: Vec<String>,
    /// Node rank order.
    pub nodes: Vec<NodeLaunch>,
    pub master_addr: String,
    pub master_port: u16,
    pub rdzv_id: String,
    pub nproc_per_node: u64,
    pub world_size: u64,
    /// The script is DeepSpeed-based: a hostfile and `ds_config.json` were rendered.
    pub deepspeed: bool,
    /// What was changed in the user's arguments beyond the parallel options.
    pub notes: Vec<String>,
    /// The working directory every script `cd`s into.
    pub workdir: String,
    /// Where the files go (as given in the input).
    pub run_dir: String,
    /// The files of the run directory, paths relative to it.
    pub files: Vec<RunFile>,
}

impl LaunchSpec {
    /// Each node's command as one bash line, in node-rank order (what `--dry-run` shows):
    /// see [`NodeLaunch::command_line`].
    pub fn command_lines(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| n.command_line(&self.workdir))
            .collect()
    }
}

/// One node's launch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLaunch {
    pub host: String,
    pub node_rank: u64,
    /// Global ranks `first_rank .. first_rank + nproc_per_node` run here.
    pub first_rank: u64,
    pub cuda_visible_devices: Vec<u32>,
    /// The environment the script exports, in order.
    pub env: Vec<(String, String)>,
    /// torchrun's exact argv (the executable first).
    pub argv: Vec<String>,
    /// The launch script's path in the run directory.
    pub script_path: String,
    /// The launch script.
    pub script: String,
}

impl NodeLaunch {
    /// The command as one bash line, exactly as the script runs it:
    /// `cd DIR && NAME=VALUE ... torchrun ...`, every word quoted.
    pub fn command_line(&self, workdir: &str) -> String {
        let mut line = format!("cd {} &&", shell::word(workdir));
        for (name, value) in &self.env {
            line.push_str(&format!(" {name}={}", shell::word(value)));
        }
        line.push(' ');
        line.push_str(&shell::words(&self.argv));
        line
    }
}

/// A file of the run directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFile {
    /// Relative to the run directory; one component.
    pub path: String,
    pub contents: String,
    pub executable: bool,
}

/// Why nothing could be rendered or written.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The plan and the mapping disagree with each other or the settings (a bug upstream).
    #[error("the plan cannot be rendered: {0}")]
    Plan(String),
    /// A user argument that cannot mean anything under the plan.
    #[error("{option} {message}")]
    Args { option: String, message: String },
    /// A value no process argument or environment can hold.
    #[error("{what} {value:?} {reason}")]
    Unrepresentable {
        what: String,
        value: String,
        reason: String,
    },
    /// A template failed to parse or render.
    #[error("template {template}{}: {message}", line.map(|l| format!(", line {l}")).unwrap_or_default())]
    Template {
        template: String,
        line: Option<usize>,
        message: String,
    },
    #[error("cannot read templates from {path}: {message} (--templates names a directory of template files)")]
    TemplateDir { path: String, message: String },
    #[error("cannot write the run directory {path}: {message}")]
    RunDir { path: String, message: String },
    /// The file system refused a write (full, read-only, no permission): not the user's
    /// arguments, so not their exit code.
    #[error("cannot write the run directory {path}: {message} (free space, or choose a writable --run-dir)")]
    RunDirWrite { path: String, message: String },
}

impl RenderError {
    /// True for errors that are bugs in pipette-run (an inconsistent plan), false for
    /// errors in what the user gave (arguments, templates, names, the run directory).
    pub fn is_bug(&self) -> bool {
        matches!(self, RenderError::Plan(_))
    }
}

/// Variables forwarded to every node by their prefix: the communication libraries'
/// (NCCL, gloo, UCX, libfabric), CUDA's, PyTorch's, Transformer Engine's, Hugging Face's,
/// Weights & Biases', MLflow's.
pub const FORWARDED_PREFIXES: &[&str] = &[
    "NCCL_",
    "GLOO_",
    "UCX_",
    "FI_",
    "CUDA_",
    "TORCH_",
    "PYTORCH_",
    "NVTE_",
    "HF_",
    "TRANSFORMERS_",
    "WANDB_",
    "MLFLOW_",
];

/// Variables forwarded to every node by name: the venv's or conda's (so the nodes run the
/// same python and torchrun), the thread count and tokenizers' parallelism.
pub const FORWARDED_NAMES: &[&str] = &[
    "PATH",
    "LD_LIBRARY_PATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    "PYTHONPATH",
    "OMP_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
];

/// Credentials by name, beside the shapes [`is_credential`] knows (`*_KEY`, `*_PAT`,
/// `*_PASS`, `*_PWD`, `*TOKEN*`, `*AUTH*`, `*COOKIE*`, `*SECRET*`, `*PASSWORD*`, `*PASSWD*`,
/// `*CREDENTIAL*`): the trackers', hubs' and cloud stores' that training scripts read.
pub const CREDENTIAL_NAMES: &[&str] = &[
    "WANDB_API_KEY",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_CONNECTION_STRING",
];

/// What a launch's description (its scripts, the dry run) holds for a credential's value:
/// the value itself is taken from pipette-run's environment when the node is started, and
/// never written (run directories are often on a shared file system).
pub const CREDENTIAL_SHOWN: &str = "(a credential: not shown)";

/// Whether a variable's name says it holds a credential (see [`CREDENTIAL_NAMES`]).
pub fn is_credential(name: &str) -> bool {
    let name = name.to_ascii_uppercase();
    ["_KEY", "_PAT", "_PASS", "_PWD"]
        .iter()
        .any(|end| name.ends_with(end))
        || [
            "TOKEN",
            "SECRET",
            "PASSWORD",
            "PASSWD",
            "CREDENTIAL",
            "AUTH",
            "COOKIE",
        ]
        .iter()
        .any(|part| name.contains(part))
        || CREDENTIAL_NAMES.contains(&name.as_str())
}

/// Whether a forwarded variable holds a credential: by its name ([`is_credential`]), by its
/// value (a URL with a password in it, `https://user:pw@host`, as `DATABASE_URL` and
/// `MLFLOW_TRACKING_URI` often carry), or because it is already [`CREDENTIAL_SHOWN`] (a
/// value hidden when the launch was described, to be taken from pipette-run's environment
/// when the node starts).
pub fn is_credential_var(name: &str, value: &str) -> bool {
    is_credential(name) || value == CREDENTIAL_SHOWN || url_with_password(value)
}

/// Whether `value` holds a URL whose user part carries a password (`scheme://user:pw@…`).
fn url_with_password(value: &str) -> bool {
    value.match_indices("://").any(|(at, _)| {
        let rest = &value[at + 3..];
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        authority
            .rsplit_once('@')
            .is_some_and(|(user, _)| user.contains(':'))
    })
}

/// Never forwarded though a prefix matches: each node's own (the mapping sets the devices;
/// Slurm sets them per node).
const NOT_FORWARDED: &[&str] = &["CUDA_VISIBLE_DEVICES"];

/// The variables of `environment` that every node should see ([`FORWARDED_PREFIXES`],
/// [`FORWARDED_NAMES`]; ssh and srun do not carry the launching shell's environment),
/// without what `cargo run` added to them ([`without_cargo_paths`]).
pub fn forwarded_env<I, K, V>(environment: I) -> BTreeMap<String, String>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<String>,
    V: Into<String>,
{
    let all: BTreeMap<String, String> = environment
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    all.iter()
        .filter(|(k, _)| {
            (FORWARDED_PREFIXES.iter().any(|p| k.starts_with(p))
                || FORWARDED_NAMES.contains(&k.as_str()))
                && !NOT_FORWARDED.contains(&k.as_str())
        })
        .filter_map(|(k, v)| Some((k.clone(), without_cargo_paths(k, v, &all)?)))
        .collect()
}

/// `value` of `name` without what cargo put there when pipette-run runs under `cargo run`
/// (`CARGO` is set): the target directory and the toolchain's libraries in
/// `LD_LIBRARY_PATH`. A training job has no use for Rust's libraries, and they would
/// shadow the nodes' own. (`PATH` is the user's: rustup's proxy only repeats an entry of
/// it.) `None` when nothing is left.
fn without_cargo_paths(name: &str, value: &str, env: &BTreeMap<String, String>) -> Option<String> {
    if !env.contains_key("CARGO") || name != "LD_LIBRARY_PATH" {
        return Some(value.to_string());
    }
    let cargos: Vec<String> = [
        env.get("CARGO_TARGET_DIR").cloned(),
        env.get("CARGO_MANIFEST_DIR").map(|d| format!("{d}/target")),
        env.get("RUSTUP_HOME").map(|d| format!("{d}/toolchains")),
        env.get("HOME").map(|d| format!("{d}/.rustup/toolchains")),
    ]
    .into_iter()
    .flatten()
    .collect();
    let kept: Vec<&str> = value
        .split(':')
        .filter(|entry| {
            !(entry.contains("/lib/rustlib/")
                || cargos
                    .iter()
                    .any(|dir| entry == dir || entry.starts_with(&format!("{dir}/"))))
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join(":"))
}

/// The launch of `input`: Megatron arguments, per-node torchrun commands and scripts, and
/// the files of the run directory. Pure.
pub fn render(input: &RenderInput<'_>, templates: &Templates) -> Result<LaunchSpec, RenderError> {
    check_input(input)?;
    let config = input.config;
    let nproc = input.nproc_per_node;
    let nnodes = input.node_order.len();
    let world_size = nnodes as u64 * nproc;
    let deepspeed = uses_deepspeed(&input.script.args);
    let ds_config_path = format!("{}/ds_config.json", input.run_dir.trim_end_matches('/'));
    let megatron = megatron_args(
        input.settings,
        &input.script.args,
        config,
        deepspeed.then_some(ds_config_path.as_str()),
    )?;
    check_words("a Megatron argument", &megatron.args)?;
    let master_addr = input
        .master_addr
        .clone()
        .unwrap_or_else(|| input.node_order[0].clone());

    let common = NodeCommon {
        nnodes,
        nproc_per_node: nproc,
        master_addr: &master_addr,
        master_port: input.master_port,
        rdzv_id: &input.rdzv_id,
        torchrun: &input.torchrun,
        passthrough: &input.torchrun_passthrough,
        spelling: input.torchrun_spelling,
        script: &input.script,
        script_args: &megatron.args,
        workdir: &input.workdir,
        run_dir: &input.run_dir,
    };
    let mut nodes = Vec::new();
    let mut files = Vec::new();
    for (node_rank, host) in input.node_order.iter().enumerate() {
        let gpus = input.cuda_visible_devices[host].clone();
        let env = node_env(host, Some(&gpus), &megatron.env, &input.env);
        let (node, file) = common.node(node_rank, host, gpus, env, templates)?;
        nodes.push(node);
        files.push(file);
    }

    let quoted_args: Vec<String> = option_lines(&megatron.args);
    files.push(RunFile {
        path: "megatron-args.txt".into(),
        contents: templates.render(
            templates::MEGATRON_ARGS,
            context! { arg_lines => quoted_args },
        )?,
        executable: false,
    });
    if deepspeed {
        files.extend(deepspeed_files(input, templates, megatron.zero_stage)?);
    }
    let mut plan_json = match &input.plan_json {
        serde_json::Value::Null => serde_json::json!({
            "config": config,
            "node_order": input.node_order,
            "cuda_visible_devices": input.cuda_visible_devices,
        }),
        plan => plan.clone(),
    };
    if let Some(object) = plan_json.as_object_mut() {
        object.insert("schema".into(), PLAN_SCHEMA.into());
    }
    files.push(RunFile {
        path: "plan.json".into(),
        contents: format!(
            "{}\n",
            serde_json::to_string_pretty(&plan_json)
                .map_err(|e| RenderError::Plan(format!("the plan is not JSON: {e}")))?
        ),
        executable: false,
    });
    let readme = readme(input, &nodes, &megatron, &master_addr, &files, templates)?;
    files.push(RunFile {
        path: "README.md".into(),
        contents: readme,
        executable: false,
    });

    Ok(LaunchSpec {
        megatron_args: megatron.args,
        nodes,
        master_addr,
        master_port: input.master_port,
        rdzv_id: input.rdzv_id.clone(),
        nproc_per_node: nproc,
        world_size,
        deepspeed,
        notes: megatron.notes,
        workdir: input.workdir.clone(),
        run_dir: input.run_dir.clone(),
        files,
    })
}

/// What every node's torchrun command and launch script share.
struct NodeCommon<'a> {
    nnodes: usize,
    nproc_per_node: u64,
    master_addr: &'a str,
    master_port: u16,
    rdzv_id: &'a str,
    torchrun: &'a str,
    passthrough: &'a [String],
    spelling: TorchrunSpelling,
    script: &'a ScriptInvocation,
    /// The arguments after SCRIPT, as the script gets them.
    script_args: &'a [String],
    workdir: &'a str,
    run_dir: &'a str,
}

impl NodeCommon<'_> {
    /// Node `node_rank`'s launch (on `host`, its local ranks on `gpus`, with `env`) and
    /// its launch script.
    fn node(
        &self,
        node_rank: usize,
        host: &str,
        gpus: Vec<u32>,
        env: Vec<(String, String)>,
        templates: &Templates,
    ) -> Result<(NodeLaunch, RunFile), RenderError> {
        let nproc = self.nproc_per_node;
        let at = torchrun::NodeCoordinates {
            nnodes: self.nnodes,
            nproc_per_node: nproc,
            node_rank,
            master_addr: self.master_addr,
            master_port: self.master_port,
            rdzv_id: self.rdzv_id,
        };
        let argv = torchrun::argv(
            self.torchrun,
            &at,
            self.passthrough,
            self.spelling,
            self.script,
            self.script_args,
        );
        let env: Vec<(String, String)> = env
            .into_iter()
            .map(|(name, value)| match is_credential_var(&name, &value) {
                true => (name, CREDENTIAL_SHOWN.to_string()),
                false => (name, value),
            })
            .collect();
        let first_rank = node_rank as u64 * nproc;
        let script_path = format!("launch-{node_rank}-{}.sh", file_name_part(host));
        let quoted: Vec<String> = argv.iter().map(|w| shell::word(w)).collect();
        let context = context! {
            node_rank,
            nnodes => self.nnodes,
            nproc_per_node => nproc,
            world_size => self.nnodes as u64 * nproc,
            first_rank,
            last_rank => first_rank + nproc - 1,
            host => shell::word(host),
            host_comment => shell::one_line(host),
            workdir => shell::word(self.workdir),
            run_dir => shell::word(self.run_dir),
            env => env.iter().map(|(name, value)| context! {
                name => name.clone(),
                value => if is_credential_var(name, value) {
                    // Read where the script runs; never written into it.
                    format!("\"${{{name}:?{name} is a credential this script does not hold: set it}}\"")
                } else {
                    shell::word(value)
                },
            }).collect::<Vec<_>>(),
            argv => quoted,
            command => command_lines(&argv, self.script_args.len()).join(" \\\n    "),
        };
        let script = templates.render(templates::LAUNCH, context)?;
        let file = RunFile {
            path: script_path.clone(),
            contents: script.clone(),
            executable: true,
        };
        let node = NodeLaunch {
            host: host.to_string(),
            node_rank: node_rank as u64,
            first_rank,
            cuda_visible_devices: gpus,
            env,
            argv,
            script_path,
            script,
        };
        Ok((node, file))
    }
}

/// The environment of one node's script: the mapping's variables (when the job has a
/// mapping), those the script requires, then the forwarded ones (less any the first two
/// set), then the host.
fn node_env(
    host: &str,
    gpus: Option<&[u32]>,
    required: &[(String, String)],
    forwarded: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut env = Vec::new();
    if let Some(gpus) = gpus {
        let devices = gpus
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        env.push(("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string()));
        env.push(("CUDA_VISIBLE_DEVICES".to_string(), devices));
    }
    env.extend(required.iter().cloned());
    let ours: BTreeSet<String> = env
        .iter()
        .map(|(k, _)| k.clone())
        .chain(["PIPETTE_HOST".to_string()])
        .collect();
    env.extend(
        forwarded
            .iter()
            .filter(|(k, _)| !ours.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    // Which host the script was written for, for logs and for checking the mapping.
    env.push(("PIPETTE_HOST".to_string(), host.to_string()));
    env
}

/// The hostfile and `ds_config.json` of a DeepSpeed-based script.
fn deepspeed_files(
    input: &RenderInput<'_>,
    templates: &Templates,
    zero_stage: u64,
) -> Result<Vec<RunFile>, RenderError> {
    let config = input.config;
    for host in input.node_order {
        if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '#' || c == '=') {
            return Err(RenderError::Unrepresentable {
                what: "host".into(),
                value: host.clone(),
                reason: "cannot be written to a DeepSpeed hostfile (no spaces, `#` or `=`)".into(),
            });
        }
    }
    let nodes: Vec<Value> = input
        .node_order
        .iter()
        .map(|host| context! { host => host.clone(), slots => input.nproc_per_node })
        .collect();
    let hostfile = templates.render(templates::HOSTFILE, context! { nodes })?;
    let global = input.settings.training.global_batch_size;
    let precision = input.settings.training.precision;
    let ds_config = templates.render(
        templates::DS_CONFIG,
        context! {
            train_batch_size => global,
            micro_batch_size => config.micro_batch,
            gradient_accumulation_steps => global / (config.micro_batch * config.dp),
            zero_stage,
            bf16 => precision == Precision::Bf16,
            fp16 => precision == Precision::Fp16,
        },
    )?;
    Ok(vec![
        RunFile {
            path: "hostfile".into(),
            contents: hostfile,
            executable: false,
        },
        RunFile {
            path: "ds_config.json".into(),
            contents: ds_config,
            executable: false,
        },
    ])
}

fn readme(
    input: &RenderInput<'_>,
    nodes: &[NodeLaunch],
    megatron: &MegatronArgs,
    master_addr: &str,
    files: &[RunFile],
    templates: &Templates,
) -> Result<String, RenderError> {
    let config = input.config;
    let cell = |text: &str| shell::one_line(text).replace('|', "\\|");
    let recompute = match &config.recompute {
        Recompute::None => "none".to_string(),
        Recompute::Selective => "selective".to_string(),
        Recompute::Full { method, num_layers } => {
            format!("full ({}, {num_layers} layers)", method.megatron_name())
        }
    };
    let layers = config
        .layers_per_stage
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let global = input.settings.training.global_batch_size;
    let plan = context! {
        tp => config.tp,
        pp => config.pp,
        dp => config.dp,
        vpp => config.vpp.filter(|v| *v > 1).map_or("none".to_string(), |v| v.to_string()),
        micro_batch => config.micro_batch,
        num_microbatches => config.num_microbatches(global),
        global_batch => global,
        layers_per_stage => layers,
        recompute,
        sequence_parallel => yes_no(config.tp > 1 && config.sequence_parallel),
        distributed_optimizer => yes_no(config.distributed_optimizer),
    };
    let node_rows: Vec<Value> = nodes
        .iter()
        .map(|n| {
            context! {
                node_rank => n.node_rank,
                host => cell(&n.host),
                first_rank => n.first_rank,
                last_rank => n.first_rank + input.nproc_per_node - 1,
                cuda_visible_devices => n.cuda_visible_devices.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
                script => n.script_path.clone(),
            }
        })
        .collect();
    let mut file_rows: Vec<Value> = files
        .iter()
        .map(|f| {
            let what = match f.path.as_str() {
                "megatron-args.txt" => {
                    "the Megatron arguments as shell words, an option and its values per line"
                        .to_string()
                }
                "hostfile" => "DeepSpeed hostfile".to_string(),
                "ds_config.json" => {
                    "DeepSpeed configuration (batch sizes and ZeRO stage of the plan)".to_string()
                }
                "plan.json" => "the plan".to_string(),
                path => match nodes.iter().find(|n| n.script_path == path) {
                    Some(n) => format!(
                        "launch script of node rank {} ({})",
                        n.node_rank,
                        cell(&n.host)
                    ),
                    None => String::new(),
                },
            };
            context! { path => f.path.clone(), what }
        })
        .collect();
    file_rows.extend(PICTURES.iter().map(|&(path, what)| context! { path, what }));
    file_rows.push(context! { path => "README.md", what => "this summary" });
    let later_rows: Vec<Value> = WRITTEN_BY_THE_RUN
        .iter()
        .map(|&(path, what)| context! { path, what })
        .collect();
    templates.render(
        templates::README,
        context! {
            plan,
            nodes => node_rows,
            nproc_per_node => input.nproc_per_node,
            master => cell(&format!("{master_addr}:{}", input.master_port)),
            rdzv_id => cell(&input.rdzv_id),
            megatron_command => option_lines(&megatron.args).join(" \\\n  "),
            notes => megatron.notes.clone(),
            files => file_rows,
            later_files => later_rows,
        },
    )
}

/// The plan's pictures, which the caller writes beside the rendered files (report's
/// `pictures::svg_files`; tests/pictures.rs checks the two lists agree).
pub const PICTURES: [(&str, &str); 4] = [
    ("rank-map.svg", "the rank map: which GPU of which node each rank runs on, coloured by pipeline stage; tensor-parallel groups outlined, context- and expert-parallel groups as bars under the GPUs"),
    ("timeline.svg", "one iteration as the time model estimates it: forward and backward blocks per stage and micro-batch, the pipeline's idle bubbles and the exposed data-parallel communication"),
    ("links.svg", "the attained bandwidth of every node pair (row sends, column receives), slow links marked ✕, where each pipeline stage begins and the pipeline hops on the critical path"),
    ("memory.svg", "each pipeline stage's estimated memory per GPU by term (weights, gradients and optimizer; activations; overhead) against the usable and the GPU's memory"),
];

/// Files a launch adds to the run directory once it runs (a dry run writes none of them).
pub const WRITTEN_BY_THE_RUN: [(&str, &str); 7] = [
    ("trial.json", "the trial: each candidate configuration run for a few iterations (its iteration time and peak memory), the calibration fitted from them, and which configuration was launched and why (absent with --no-trial or --calibration)"),
    ("trial-logs/N/", "the output of trial N, a file per node"),
    ("logs/", "the job's output, a file per node"),
    ("events.jsonl", "the supervisor's events as they happen, a JSON object per line (progress, stragglers, stops and relaunches)"),
    ("attempt-N/", "after a relaunch: attempt N's launch scripts and logs"),
    ("summary.txt", "what the run did and how long it took, as printed at its end"),
    ("ledger.json", "where the run's wall time went (profiling, planning, trial, start-up, training, checkpoints, failures, restarts), the share spent training and the measured iteration, for tools"),
];

fn yes_no(on: bool) -> &'static str {
    if on {
        "yes"
    } else {
        "no"
    }
}

/// Shell-quoted words, one line per option with the values that follow it (a word that
/// starts with `-` starts a line). Layout only: the words are the same.
fn option_lines(words: &[String]) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in words {
        match lines.last_mut() {
            Some(line) if !word.starts_with('-') => {
                line.push(' ');
                line.push_str(&shell::word(word));
            }
            _ => lines.push(shell::word(word)),
        }
    }
    lines
}

/// torchrun's argv as lines: the executable, one line per torchrun option, SCRIPT (after
/// `-m` or `--no-python` on the same line), then the script's arguments — the last
/// `script_args` words of `argv` — an option and its values per line.
fn command_lines(argv: &[String], script_args: usize) -> Vec<String> {
    const BEFORE_SCRIPT: &[&str] = &[
        "-m",
        "--no-python",
        "--no_python",
        "--run-path",
        "--run_path",
    ];
    let program = argv.len() - script_args - 1;
    let mut lines: Vec<String> = argv[..program].iter().map(|w| shell::word(w)).collect();
    match lines.last_mut() {
        Some(last) if program > 1 && BEFORE_SCRIPT.contains(&argv[program - 1].as_str()) => {
            last.push(' ');
            last.push_str(&shell::word(&argv[program]));
        }
        _ => lines.push(shell::word(&argv[program])),
    }
    lines.extend(option_lines(&argv[program + 1..]));
    lines
}

/// The mapping covers the plan's world exactly, and every value can be an argv word.
fn check_input(input: &RenderInput<'_>) -> Result<(), RenderError> {
    let plan = |m: String| Err(RenderError::Plan(m));
    let nproc = input.nproc_per_node;
    check_nodes(input.node_order, nproc)?;
    for host in input.node_order {
        match input.cuda_visible_devices.get(host) {
            None => return plan(format!("host {host:?} has no CUDA_VISIBLE_DEVICES list")),
            Some(gpus) if gpus.len() as u64 != nproc => {
                return plan(format!(
                    "host {host:?} has {} GPUs in its CUDA_VISIBLE_DEVICES list, not {nproc}",
                    gpus.len()
                ))
            }
            Some(gpus) => {
                if gpus.iter().collect::<BTreeSet<_>>().len() != gpus.len() {
                    return plan(format!("host {host:?} lists a GPU twice: {gpus:?}"));
                }
            }
        }
    }
    let world = input.node_order.len() as u64 * nproc;
    if world != input.config.world_size() {
        return plan(format!(
            "{} nodes × {nproc} workers = {world} ranks, but tp {} × pp {} × dp {} = {}",
            input.node_order.len(),
            input.config.tp,
            input.config.pp,
            input.config.dp,
            input.config.world_size()
        ));
    }
    check_values(&LaunchValues {
        node_order: input.node_order,
        script: &input.script,
        torchrun: &input.torchrun,
        torchrun_passthrough: &input.torchrun_passthrough,
        rdzv_id: &input.rdzv_id,
        workdir: &input.workdir,
        run_dir: &input.run_dir,
        master_addr: input.master_addr.as_deref(),
        env: &input.env,
    })
}

/// At least one node and one worker per node, each host once.
fn check_nodes(node_order: &[String], nproc: u64) -> Result<(), RenderError> {
    if node_order.is_empty() || nproc == 0 {
        return Err(RenderError::Plan(format!(
            "no workers: {} nodes × {nproc} per node",
            node_order.len()
        )));
    }
    let mut seen = BTreeSet::new();
    for host in node_order {
        if !seen.insert(host) {
            return Err(RenderError::Plan(format!(
                "host {host:?} has two node ranks"
            )));
        }
    }
    Ok(())
}

/// The values of a launch that become argv words, file contents or variables.
struct LaunchValues<'a> {
    node_order: &'a [String],
    script: &'a ScriptInvocation,
    torchrun: &'a str,
    torchrun_passthrough: &'a [String],
    rdzv_id: &'a str,
    workdir: &'a str,
    run_dir: &'a str,
    master_addr: Option<&'a str>,
    env: &'a BTreeMap<String, String>,
}

/// Every value can be an argv word (no NUL), SCRIPT is not read as an option, and every
/// variable name is a shell name.
fn check_values(v: &LaunchValues<'_>) -> Result<(), RenderError> {
    check_words("a host name", v.node_order)?;
    check_words("an argument", &v.script.args)?;
    check_words("a torchrun option", v.torchrun_passthrough)?;
    check_words(
        "a value",
        &[
            v.script.program.clone(),
            v.torchrun.to_string(),
            v.rdzv_id.to_string(),
            v.workdir.to_string(),
            v.run_dir.to_string(),
            v.master_addr.unwrap_or_default().to_string(),
        ],
    )?;
    if v.script.program.starts_with('-') || v.script.program.is_empty() {
        return Err(RenderError::Unrepresentable {
            what: "SCRIPT".into(),
            value: v.script.program.clone(),
            reason: "would be read by torchrun as an option (write ./NAME for a file)".into(),
        });
    }
    for (name, value) in v.env {
        let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(RenderError::Unrepresentable {
                what: "environment variable".into(),
                value: name.clone(),
                reason: "is not a shell variable name (letters, digits and _)".into(),
            });
        }
        check_words(&format!("the value of {name}"), std::slice::from_ref(value))?;
    }
    Ok(())
}

fn check_words(what: &str, words: &[String]) -> Result<(), RenderError> {
    match words.iter().find(|w| w.contains('\0')) {
        Some(word) => Err(RenderError::Unrepresentable {
            what: what.to_string(),
            value: word.clone(),
            reason: "contains a NUL byte, which no process argument or variable can hold".into(),
        }),
        None => Ok(()),
    }
}

/// A host name as part of a file name (see [`run_dir::file_name_safe`]); `host` when
/// nothing of it is left. The launch scripts' names use it, and the trial's logs.
pub fn file_name_part(host: &str) -> String {
    match run_dir::file_name_safe(host) {
        part if part.is_empty() => "host".to_string(),
        part => part,
    }
}

#[cfg(test)]
mod tests {
    /// N8's kept-back shapes: a password inside a URL, whatever the name; tokens named
    /// `*_PAT`, `*AUTH*`, `*_PASS`; a value already hidden stays hidden. Plain URLs and
    /// ordinary variables are forwarded as they are.
    #[test]
    fn n8_credentials_by_name_and_by_value() {
        use super::{is_credential_var, CREDENTIAL_SHOWN};
        for (name, value) in [
            ("RESULTS_DB", "postgresql://trainer:pw@db.example/runs"),
            ("MLFLOW_TRACKING_URI", "https://u:p@mlflow.example:5000/"),
            ("GH_PAT", "ghp_x"),
            ("AUTH_HEADER", "Bearer x"),
            ("DB_PASS", "x"),
            ("HF_TOKEN", "x"),
            ("ANYTHING", CREDENTIAL_SHOWN),
        ] {
            assert!(is_credential_var(name, value), "{name}={value}");
        }
        for (name, value) in [
            ("MLFLOW_TRACKING_URI", "https://mlflow.example:5000/x?a=b@c"),
            ("NCCL_SOCKET_IFNAME", "eth0"),
            ("DATA", "s3://bucket/path:with@colon"),
            ("OMP_NUM_THREADS", "8"),
        ] {
            assert!(!is_credential_var(name, value), "{name}={value}");
        }
    }
    /// `cargo run` put the target directory and the toolchain's libraries in
    /// LD_LIBRARY_PATH: none of it reaches the nodes; outside cargo the same value passes
    /// untouched, and PATH always does.
    #[test]
    fn what_cargo_run_adds_is_not_forwarded() {
        let tc = "/root/.rustup/toolchains/stable-x86_64-unknown-linux-gnu";
        let ld = format!(
            "/w/target/debug:/w/target/debug/deps:{tc}/lib/rustlib/x86_64-unknown-linux-gnu/lib:{tc}/lib:/opt/cuda/lib64"
        );
        let path = "/root/.cargo/bin:/root/.cargo/bin:/usr/bin";
        let base = [
            ("LD_LIBRARY_PATH", ld.as_str()),
            ("PATH", path),
            ("HOME", "/root"),
            ("CARGO_MANIFEST_DIR", "/w"),
        ];
        let outside = forwarded_env(base);
        assert_eq!(outside["LD_LIBRARY_PATH"], ld);
        assert_eq!(outside["PATH"], path);
        let under_cargo = forwarded_env(
            base.into_iter()
                .chain([("CARGO", "/root/.cargo/bin/cargo")]),
        );
        assert_eq!(under_cargo["LD_LIBRARY_PATH"], "/opt/cuda/lib64");
        assert_eq!(under_cargo["PATH"], path);
        assert!(!under_cargo.contains_key("CARGO") && !under_cargo.contains_key("HOME"));
        // Nothing left: not forwarded at all.
        let only_cargo = forwarded_env([
            ("LD_LIBRARY_PATH", "/w/target/debug"),
            ("CARGO_MANIFEST_DIR", "/w"),
            ("CARGO", "cargo"),
        ]);
        assert!(!only_cargo.contains_key("LD_LIBRARY_PATH"));
    }

    use super::*;
    use crate::config::settings_from_megatron_args;

    fn w(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    const ARGS: &str = "--num-layers 8 --hidden-size 64 --num-attention-heads 8 --seq-length 32 \
                        --max-position-embeddings 32 --vocab-size 100 --global-batch-size 16 --bf16";

    struct Fixture {
        settings: Settings,
        config: ParallelConfig,
        hosts: Vec<String>,
        cvd: BTreeMap<String, Vec<u32>>,
    }

    fn fixture() -> Fixture {
        let settings = settings_from_megatron_args(&w(ARGS), None, &[]).unwrap();
        let config = ParallelConfig::even(8, 2, 2, 2, 1);
        let hosts = vec!["n1".to_string(), "n0".to_string()];
        let cvd = BTreeMap::from([
            ("n0".to_string(), vec![0, 1, 2, 3]),
            ("n1".to_string(), vec![3, 2, 1, 0]),
        ]);
        Fixture {
            settings,
            config,
            hosts,
            cvd,
        }
    }

    #[test]
    fn renders_one_script_per_node_in_node_rank_order() {
        let f = fixture();
        let mut input = RenderInput::new(
            &f.settings,
            ScriptInvocation::python("pretrain_gpt.py", w(ARGS)),
            &f.config,
            &f.hosts,
            &f.cvd,
        );
        input.env = forwarded_env([
            ("NCCL_DEBUG", "INFO"),
            ("HOME", "/root"),
            ("CUDA_VISIBLE_DEVICES", "7"),
        ]);
        let spec = render(&input, &Templates::embedded()).unwrap();
        assert_eq!(spec.world_size, 8);
        assert_eq!(spec.master_addr, "n1");
        assert_eq!(spec.nodes[0].host, "n1");
        assert_eq!(spec.nodes[1].first_rank, 4);
        assert_eq!(
            spec.nodes[0].env,
            vec![
                ("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string()),
                ("CUDA_VISIBLE_DEVICES".to_string(), "3,2,1,0".to_string()),
                ("CUDA_DEVICE_MAX_CONNECTIONS".to_string(), "1".to_string()),
                ("NCCL_DEBUG".to_string(), "INFO".to_string()),
                ("PIPETTE_HOST".to_string(), "n1".to_string()),
            ]
        );
        let script = &spec.nodes[1].script;
        assert!(script.starts_with("#!/usr/bin/env bash\n"), "{script}");
        assert!(script.contains("\nset -euo pipefail\n"), "{script}");
        assert!(
            script.contains("export CUDA_VISIBLE_DEVICES='0,1,2,3'\n"),
            "{script}"
        );
        assert!(script.contains("'--node-rank=1'"), "{script}");
        assert!(script.contains("'--master-addr=n1'"), "{script}");
        let paths: Vec<&str> = spec.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "launch-0-n1.sh",
                "launch-1-n0.sh",
                "megatron-args.txt",
                "plan.json",
                "README.md"
            ]
        );
        let line = spec.nodes[0].command_line("/w");
        assert!(
            line.starts_with(
                "cd '/w' && CUDA_DEVICE_ORDER='PCI_BUS_ID' CUDA_VISIBLE_DEVICES='3,2,1,0'"
            ),
            "{line}"
        );
    }

    #[test]
    fn deepspeed_scripts_get_a_hostfile_and_config() {
        let f = fixture();
        let args = w(&format!("{ARGS} --deepspeed"));
        let mut input = RenderInput::new(
            &f.settings,
            ScriptInvocation::python("pretrain_gpt.py", args),
            &f.config,
            &f.hosts,
            &f.cvd,
        );
        input.run_dir = "/runs/1/".into();
        let spec = render(&input, &Templates::embedded()).unwrap();
        assert!(spec.deepspeed);
        let file = |p: &str| {
            spec.files
                .iter()
                .find(|f| f.path == p)
                .unwrap()
                .contents
                .clone()
        };
        assert!(file("hostfile").ends_with("n1 slots=4\nn0 slots=4\n"));
        let ds: serde_json::Value = serde_json::from_str(&file("ds_config.json")).unwrap();
        assert_eq!(
            ds,
            serde_json::json!({
                "train_batch_size": 16,
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 8,
                "zero_optimization": {"stage": 0},
                "bf16": {"enabled": true},
                "fp16": {"enabled": false},
            })
        );
        assert!(spec
            .megatron_args
            .join(" ")
            .contains("--deepspeed_config /runs/1/ds_config.json"));
        let hosts = vec!["bad host".to_string(), "n0".to_string()];
        let cvd = BTreeMap::from([
            ("n0".to_string(), vec![0, 1, 2, 3]),
            ("bad host".to_string(), vec![0, 1, 2, 3]),
        ]);
        let mut input = input.clone();
        input.node_order = &hosts;
        input.cuda_visible_devices = &cvd;
        assert!(matches!(
            render(&input, &Templates::embedded()),
            Err(RenderError::Unrepresentable { .. })
        ));
    }

    #[test]
    fn mappings_that_do_not_cover_the_world_are_bugs() {
        let f = fixture();
        let script = ScriptInvocation::python("pretrain_gpt.py", w(ARGS));
        let base = RenderInput::new(&f.settings, script, &f.config, &f.hosts, &f.cvd);
        let t = Templates::embedded();
        let mut wrong_nproc = base.clone();
        wrong_nproc.nproc_per_node = 2;
        let one_host = vec!["n0".to_string()];
        let mut too_few = base.clone();
        too_few.node_order = &one_host;
        let twice = vec!["n0".to_string(), "n0".to_string()];
        let mut dup = base.clone();
        dup.node_order = &twice;
        let unknown = vec!["n0".to_string(), "n9".to_string()];
        let mut missing = base.clone();
        missing.node_order = &unknown;
        for input in [wrong_nproc, too_few, dup, missing] {
            let err = render(&input, &t).unwrap_err();
            assert!(err.is_bug(), "{err}");
        }
        let mut nul = base.clone();
        nul.script.args.push("a\0b".into());
        assert!(matches!(
            render(&nul, &t),
            Err(RenderError::Unrepresentable { .. })
        ));
        let mut bad_env = base.clone();
        bad_env.env.insert("A-B".into(), "1".into());
        assert!(matches!(
            render(&bad_env, &t),
            Err(RenderError::Unrepresentable { .. })
        ));
        let mut dash = base;
        dash.script.program = "-c".into();
        assert!(matches!(
            render(&dash, &t),
            Err(RenderError::Unrepresentable { .. })
        ));
    }

    #[test]
    fn host_names_become_safe_file_names() {
        assert_eq!(file_name_part("gpu-01.cluster"), "gpu-01.cluster");
        assert_eq!(file_name_part("a b/c$;\n"), "a_b_c___");
        assert_eq!(file_name_part(".."), "host");
        assert_eq!(file_name_part(""), "host");
    }

    #[test]
    fn forwards_the_documented_variables_only() {
        let env = forwarded_env([
            ("NCCL_IB_HCA", "mlx5"),
            ("PATH", "/bin"),
            ("OMP_NUM_THREADS", "8"),
            ("SLURM_JOB_ID", "1"),
            ("CUDA_VISIBLE_DEVICES", "0"),
            ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
            ("HF_HOME", "/h"),
            ("WANDB_PROJECT", "p"),
            ("VIRTUAL_ENV", "/v"),
            ("HOME", "/root"),
        ]);
        assert_eq!(
            env.keys().collect::<Vec<_>>(),
            [
                "HF_HOME",
                "NCCL_IB_HCA",
                "OMP_NUM_THREADS",
                "PATH",
                "PYTORCH_CUDA_ALLOC_CONF",
                "VIRTUAL_ENV",
                "WANDB_PROJECT"
            ]
        );
    }
}
