//! What `pipette-run --dry-run` shows: every input pipette-run found, before planning.

use std::collections::BTreeMap;

use comfy_table::{presets::NOTHING, CellAlignment, Table};
use serde::Serialize;

use crate::cluster::profile::AllRails;
use crate::cluster::{Allocation, HostAllocation, NodeSource};
use crate::config::deepspeed::{DeepSpeedBatch, DeepSpeedConfig};
use crate::config::{
    Constraints, ModelSpec, Normalization, PositionEmbedding, Precision, Recompute,
    TrainingSettings,
};
use crate::launch::World;
use crate::plan::Plan;
use crate::render::LaunchSpec;

use super::{device_ranges, short_count, thousands};

/// `pipette-run --dry-run --json`'s schema name and version; the version changes with
/// any field.
pub const SCHEMA: &str = "pipette-dry-run/1";

/// What a dry run did, when it had no profile to plan with.
pub const NO_PROFILE_YET: &str = "No cluster profile to plan with: give --cluster FILE (`pipette profile --out FILE` measures the allocated nodes).";

/// What a dry run did, when it planned.
pub const PLANNED_NOT_LAUNCHED: &str =
    "Dry run: planned and rendered; nothing was launched (without --dry-run, pipette-run runs the trial and launches).";

/// What a dry run with planning off did.
pub const RENDERED_NOT_LAUNCHED: &str =
    "Dry run: rendered; nothing was launched (without --dry-run, pipette-run launches these commands and supervises them).";

/// Everything a dry run found, in the order the stages found it.
#[derive(Debug, Clone, Serialize)]
pub struct DryRunReport {
    /// [`SCHEMA`].
    pub schema: &'static str,
    pub nodes: NodesSection,
    /// The cluster profile file, when one was given.
    pub cluster_profile: Option<ProfileSummary>,
    pub script: ScriptSection,
    pub model: ModelSection,
    pub training: TrainingSettings,
    /// Parallel settings the user pinned with `--pin`.
    pub constraints: Constraints,
    /// torchrun options that differ from torchrun's defaults; handed on to torchrun.
    pub torchrun_passthrough: Vec<String>,
    /// The plan; `null` without a cluster profile to plan with.
    pub plan: Option<Plan>,
    /// The configuration the script's arguments give, costed beside the plan; `null`
    /// when they set no parallel setting (or there is no plan).
    pub yours: Option<super::plan::YoursReport>,
    /// What runs on every node, and the files of the run directory.
    pub launch: Option<LaunchSpec>,
    /// Where the launch scripts, plan and summary were written.
    pub run_dir: Option<String>,
    /// What this version did and did not do.
    pub status: String,
}

/// The DeepSpeed config as the launch reports it.
#[derive(Debug, Clone, Serialize)]
pub struct DeepSpeedReport {
    pub config: DeepSpeedConfig,
    /// The batch sizes on the world, as DeepSpeed resolves them; `null` with `"auto"`.
    pub batch: Option<DeepSpeedBatch>,
}

/// What `pipette-run --dry-run --json` prints with planning off.
#[derive(Serialize)]
pub struct WorldDryRun<'a> {
    /// Always `"off"`.
    pub planning: &'static str,
    /// Why, in one line.
    pub why: &'a str,
    pub nodes: NodesSection,
    pub script: ScriptSection,
    pub torchrun_passthrough: &'a [String],
    pub world: &'a World,
    pub deepspeed: Option<&'a DeepSpeedReport>,
    pub launch: &'a LaunchSpec,
    pub run_dir: String,
    pub notes: &'a [String],
    /// [`RENDERED_NOT_LAUNCHED`].
    pub status: &'static str,
}

/// The nodes as the allocation decided them ([`Allocation`]), with the world size.
#[derive(Debug, Clone, Serialize)]
pub struct NodesSection {
    pub source: NodeSource,
    pub job_id: Option<String>,
    pub hosts: Vec<HostAllocation>,
    /// Total workers (GPUs) across nodes, when every node's count is known.
    pub world_size: Option<u64>,
    pub warnings: Vec<String>,
}

impl From<&Allocation> for NodesSection {
    fn from(allocation: &Allocation) -> Self {
        NodesSection {
            source: allocation.source.clone(),
            job_id: allocation.job_id.clone(),
            hosts: allocation.hosts.clone(),
            world_size: allocation.world_size(),
            warnings: allocation.warnings.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ProfileSummary {
    pub path: String,
    pub nodes: usize,
    pub gpus: usize,
    /// Distinct GPU models, e.g. `["A100-SXM4-80GB"]`.
    pub gpu_models: Vec<String>,
    /// Slowest and fastest attained node-to-node bandwidth, GB/s.
    pub node_link_gbps: Option<(f64, f64)>,
    /// `node_links.nics_per_node` as the file gives it; `null`: not given, so a collective
    /// that crosses nodes is costed over one NIC (one node link's figure).
    pub nics_per_node: Option<u32>,
    /// `node_links.all_rails`: what the rails of one node pair attained busy at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all_rails: Option<AllRails>,
}

impl ProfileSummary {
    /// What the time model takes for the NICs of a node, and whence.
    pub fn nics_line(&self) -> String {
        match self.nics_per_node {
            Some(n) => format!(
                "NICs per node: {n} (node_links.nics_per_node): a collective that crosses nodes \
                 is spread over them{}",
                self.all_rails.map_or(String::new(), |r| format!(
                    "; {} rails busy at once attained {} GB/s, {:.0} % of {} × {} GB/s \
                     (node_links.all_rails): a collective over several NICs gets that share",
                    r.rails,
                    r.gb_per_s,
                    100.0 * r.efficiency(),
                    r.rails,
                    r.one_rail_gb_per_s
                ))
            ),
            None => "NICs per node: not in the cluster file, 1 assumed: a collective that \
                     crosses nodes gets one node link (set node_links.nics_per_node)"
                .to_string(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ScriptSection {
    pub program: String,
    /// `python`, `module` (-m), `no-python` or `run-path`.
    pub launch: &'static str,
    pub args: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelSection {
    #[serde(flatten)]
    pub spec: ModelSpec,
    /// Exact parameter count of Megatron's GPT model (tensor-parallel size 1).
    pub parameters: u64,
    pub padded_vocab_size: u64,
}

/// More hosts than this are shown as hostlist runs rather than one row each.
const MAX_HOST_ROWS: usize = 16;

impl NodesSection {
    /// The nodes as people read them: where they came from, one row per host, the world
    /// size, discovery's warnings.
    pub fn write_human(&self, out: &mut String) {
        let n = self;
        let source = match &n.source {
            NodeSource::Slurm { variable } => format!("Slurm ({variable})"),
            NodeSource::Pbs { path } => format!("PBS ({path})"),
            NodeSource::Hostfile { path } => format!("hostfile {path}"),
            NodeSource::Hosts => "--hosts".to_string(),
            NodeSource::Local => "this machine (no allocation found)".to_string(),
            NodeSource::ClusterFile { path } => format!("cluster file {path}"),
            NodeSource::Copies { pattern } => format!("the copies of pipette-run, {pattern}"),
        };
        let job = n
            .job_id
            .as_ref()
            .map(|id| format!(", job {id}"))
            .unwrap_or_default();
        out.push_str(&format!("Nodes: {} from {source}{job}\n", n.hosts.len()));
        let mut table = Table::new();
        table.load_preset(NOTHING);
        let row = |h: &HostAllocation| {
            [
                h.workers.map_or("?".to_string(), |w| w.to_string()),
                h.devices
                    .as_deref()
                    .map_or("any".to_string(), device_ranges),
                h.gpu.clone().unwrap_or_else(|| "-".to_string()),
            ]
        };
        if n.hosts.len() <= MAX_HOST_ROWS {
            table.set_header(vec!["host", "workers", "devices", "gpu"]);
            for h in &n.hosts {
                let [workers, devices, gpu] = row(h);
                table.add_row(vec![h.host.clone(), workers, devices, gpu]);
            }
        } else {
            // Many nodes: one row per run of hosts alike, in hostlist form.
            table.set_header(vec!["hosts", "workers", "devices", "gpu"]);
            let mut runs: Vec<(Vec<String>, [String; 3])> = Vec::new();
            for h in &n.hosts {
                let cells = row(h);
                match runs.last_mut() {
                    Some((hosts, last)) if *last == cells => hosts.push(h.host.clone()),
                    _ => runs.push((vec![h.host.clone()], cells)),
                }
            }
            for (hosts, [workers, devices, gpu]) in runs {
                let list = super::compress_hosts(&hosts);
                let list = if hosts.len() > 1 {
                    format!("{list} ({})", hosts.len())
                } else {
                    list
                };
                table.add_row(vec![list, workers, devices, gpu]);
            }
        }
        if let Some(col) = table.column_mut(1) {
            col.set_cell_alignment(CellAlignment::Right);
        }
        super::plan::fit_table(&mut table);
        // The preset pads cells with one space; one more indents the table under its title.
        for line in table.lines() {
            out.push(' ');
            out.push_str(line.trim_end());
            out.push('\n');
        }
        match n.world_size {
            Some(w) => out.push_str(&format!("  world size {w}\n")),
            None => out.push_str(
                "  world size unknown (give --nproc-per-node N, or a --cluster file with the GPUs)\n",
            ),
        }
        for w in &n.warnings {
            out.push_str(&format!("  warning: {w}\n"));
        }
    }
}

impl DryRunReport {
    /// The report as people read it.
    pub fn to_human(&self) -> String {
        let mut out = String::new();
        self.write_nodes(&mut out);
        self.write_model(&mut out);
        self.write_training(&mut out);
        self.write_launch(&mut out);
        out.push('\n');
        out.push_str(&self.status);
        out.push('\n');
        super::wrap(&out, super::WIDTH)
    }

    fn write_nodes(&self, out: &mut String) {
        self.nodes.write_human(out);
        if let Some(p) = &self.cluster_profile {
            let links = p
                .node_link_gbps
                .map(|(lo, hi)| format!(", node links {lo:.1}–{hi:.1} GB/s"))
                .unwrap_or_default();
            out.push_str(&format!(
                "Cluster profile: {} ({} nodes, {} GPUs: {}{links})\n",
                p.path,
                p.nodes,
                p.gpus,
                if p.gpu_models.is_empty() {
                    "models unknown".to_string()
                } else {
                    p.gpu_models.join(", ")
                }
            ));
            if p.nodes > 1 {
                out.push_str(&p.nics_line());
                out.push('\n');
            }
        }
    }

    fn write_model(&self, out: &mut String) {
        let m = &self.model;
        let s = &m.spec;
        let name = s
            .preset
            .as_ref()
            .map(|p| format!("{p} — "))
            .unwrap_or_default();
        out.push_str(&format!(
            "\nModel: {name}{} parameters ({})\n",
            thousands(m.parameters),
            short_count(m.parameters)
        ));
        let groups = if s.num_query_groups == s.num_attention_heads {
            String::new()
        } else {
            format!(", {} query groups", s.num_query_groups)
        };
        out.push_str(&format!(
            "  {} layers, hidden {}, ffn {}, {} heads{groups} of {} channels\n",
            s.num_layers, s.hidden_size, s.ffn_hidden_size, s.num_attention_heads, s.kv_channels
        ));
        out.push_str(&format!(
            "  sequence {} (max positions {}), vocabulary {} (padded to {})\n",
            s.seq_length, s.max_position_embeddings, s.vocab_size, m.padded_vocab_size
        ));
        let mut traits = vec![match s.normalization {
            Normalization::LayerNorm => "LayerNorm",
            Normalization::RMSNorm => "RMSNorm",
        }];
        traits.push(if s.swiglu { "SwiGLU" } else { "GeLU" });
        traits.push(match s.position_embedding {
            PositionEmbedding::LearnedAbsolute => "learned positions",
            PositionEmbedding::Rope => "rotary positions",
            PositionEmbedding::None => "no position embedding",
        });
        traits.push(if s.untie_embeddings_and_output_weights {
            "untied embeddings"
        } else {
            "tied embeddings"
        });
        traits.push(if s.add_bias_linear {
            "linear biases"
        } else {
            "no linear biases"
        });
        if s.qk_layernorm {
            traits.push("query/key norms");
        }
        if s.mla.is_some() {
            traits.push("multi-latent attention");
        }
        out.push_str(&format!("  {}\n", traits.join(", ")));
        if let Some(moe) = &s.moe {
            let shared = moe
                .shared_expert_ffn
                .map(|w| format!(" and a shared expert of width {w}"))
                .unwrap_or_default();
            out.push_str(&format!(
                "  mixture of experts: {} routed experts of width {}{shared}, top-{}, in {} of {} layers; {} dispatcher\n",
                moe.num_experts,
                moe.ffn_hidden_size,
                moe.router_topk,
                moe.moe_layers(),
                s.num_layers,
                moe.dispatcher.megatron_name()
            ));
        }
        if s.mtp_layers > 0 {
            out.push_str(&format!(
                "  multi-token prediction: {} layer(s) on the last stage\n",
                s.mtp_layers
            ));
        }
    }

    fn write_training(&self, out: &mut String) {
        let t = &self.training;
        let precision = match t.precision {
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Fp32 => "fp32",
        };
        let recompute = match &t.recompute {
            Recompute::None => "no recomputation".to_string(),
            Recompute::Selective => "selective recomputation".to_string(),
            Recompute::Full { method, num_layers } => {
                format!("full recomputation ({method:?}, {num_layers} layers)").to_lowercase()
            }
        };
        out.push_str(&format!(
            "\nTraining: global batch {}, micro-batch {}, {precision}, {recompute}\n",
            t.global_batch_size, t.micro_batch_size
        ));
        let on_off = |b: bool| if b { "on" } else { "off" };
        let vpp = t
            .virtual_pipeline
            .map(|v| format!(", {v} virtual stages"))
            .unwrap_or_default();
        out.push_str(&format!(
            "  as written: tp {}, pp {}{vpp}, sequence parallel {}, distributed optimizer {}\n",
            t.tensor_parallel,
            t.pipeline_parallel,
            on_off(t.sequence_parallel),
            on_off(t.distributed_optimizer)
        ));
        let mut ckpt = Vec::new();
        if let Some(iters) = t.train_iters {
            ckpt.push(format!("{iters} iterations"));
        }
        if let Some(save) = &t.save {
            let every = t
                .save_interval
                .map(|i| format!(" every {i} iterations"))
                .unwrap_or_default();
            ckpt.push(format!("saves to {save}{every}"));
        }
        if let Some(load) = &t.load {
            ckpt.push(format!("loads from {load}"));
        }
        if !ckpt.is_empty() {
            out.push_str(&format!("  {}\n", ckpt.join(", ")));
        }
        let pinned = pinned_list(&self.constraints);
        if pinned.is_empty() {
            out.push_str(
                "  pinned: nothing (the planner chooses every parallel setting; --pin keeps one)\n",
            );
        } else {
            out.push_str(&format!("  pinned: {}\n", pinned.join(", ")));
        }
    }

    fn write_launch(&self, out: &mut String) {
        let s = &self.script;
        out.push_str(&format!(
            "\nScript: {} ({}), {} arguments passed through\n",
            crate::log::printable(&s.program),
            s.launch,
            s.args.len()
        ));
        if !self.torchrun_passthrough.is_empty() {
            out.push_str(&format!(
                "torchrun options passed on: {}\n",
                self.torchrun_passthrough.join(" ")
            ));
        }
    }
}

/// The pinned settings, as `tp=4`-style words.
fn pinned_list(c: &Constraints) -> Vec<String> {
    let mut out = Vec::new();
    let mut num = |name: &str, v: Option<u64>| {
        if let Some(v) = v {
            out.push(format!("{name}={v}"));
        }
    };
    num("tp", c.tensor_parallel);
    num("pp", c.pipeline_parallel);
    num("dp", c.data_parallel);
    num("mbs", c.micro_batch_size);
    num("vpp", c.virtual_pipeline);
    num("ep", c.expert_parallel);
    num("etp", c.expert_tensor_parallel);
    if let Some(sp) = c.sequence_parallel {
        out.push(format!("sp={sp}"));
    }
    if let Some(r) = &c.recompute {
        let r = match r {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full { .. } => "full",
        };
        out.push(format!("recompute={r}"));
    }
    if let Some(d) = c.distributed_optimizer {
        out.push(format!("dist-opt={d}"));
    }
    out
}

/// One node's command as a dry run shows it.
#[derive(Debug, Clone, Copy)]
pub struct ShownCommand<'a> {
    pub host: &'a str,
    /// The whole command as one shell line.
    pub line: &'a str,
    /// The launch script's file name in the run directory, when it has one.
    pub script: Option<&'a str>,
}

/// Node 0's command wrapped to [`super::WIDTH`] columns (a shell line continued with `\`,
/// still runnable when pasted), then where every other node's command is: its launch
/// script in the run directory, one line per node up to [`MAX_COMMAND_ROWS`] of them,
/// else one line for all. A variable the node gets with the value it has `here` (this
/// process's environment: forwarded, see `render::forwarded_env`) is shown by name,
/// `PATH="$PATH"`, which runs the same when pasted here; the launch scripts hold the values.
pub fn commands_to_human(nodes: &[ShownCommand<'_>], here: &BTreeMap<String, String>) -> String {
    let Some(first) = nodes.first() else {
        return String::new();
    };
    let mut out = format!("  # node rank 0 ({})\n", first.host);
    let mut by_name: Vec<&str> = Vec::new();
    let words: Vec<String> = shell_words(first.line)
        .into_iter()
        .map(|word| match forwarded_as_is(word, here) {
            Some(name) => {
                by_name.push(name);
                format!("{name}=\"${name}\"")
            }
            None => word.to_owned(),
        })
        .collect();
    if !by_name.is_empty() {
        out.push_str(&super::wrap(
            &format!(
                "  # forwarded from this environment, shown by name (the launch scripts hold the values): {}\n",
                by_name.join(", ")
            ),
            super::WIDTH,
        ));
    }
    out.push_str(&wrap_shell(&words.join(" "), super::WIDTH, "  ", "      "));
    let rest = &nodes[1..];
    let same = "the same command with its own --node-rank and CUDA_VISIBLE_DEVICES";
    if rest.len() <= MAX_COMMAND_ROWS {
        for (i, n) in rest.iter().enumerate() {
            let where_ = n
                .script
                .map_or(same.to_string(), |s| format!("{s} in the run directory"));
            out.push_str(&super::wrap(
                &format!("  # node rank {} ({}): {where_}\n", i + 1, n.host),
                super::WIDTH,
            ));
        }
    } else {
        let scripts = match (
            rest.first().and_then(|n| n.script),
            rest.last().and_then(|n| n.script),
        ) {
            (Some(a), Some(b)) => format!(" ({a} to {b} in the run directory)"),
            _ => String::new(),
        };
        out.push_str(&super::wrap(
            &format!(
                "  # node ranks 1-{} run the same command, each with its own --node-rank and CUDA_VISIBLE_DEVICES{scripts}\n",
                rest.len(),
            ),
            super::WIDTH,
        ));
    }
    out
}

/// The trial's commands as the changes they make to the launch's commands shown above
/// (`launched`, node by node): the variables and options added, changed and left out, the
/// same on every node. `None` when the two differ in anything else (another program, other
/// nodes, per-node changes that are not the same): then the trial's commands are shown
/// whole. An option left out that one of `notes` names is not listed again: the note says it
/// and why.
pub fn trial_changes_to_human(
    launched: &[String],
    trial: &[String],
    notes: &[String],
) -> Option<String> {
    if launched.len() != trial.len() || trial.is_empty() {
        return None;
    }
    let mut changes = None;
    for (a, b) in launched.iter().zip(trial) {
        let these = CommandChanges::between(a, b)?;
        match &changes {
            None => changes = Some(these),
            Some(first) if *first == these => {}
            Some(_) => return None,
        }
    }
    let changes = changes?;
    let noted = |name: &str| {
        notes.iter().any(|note| {
            note.match_indices(name)
                .any(|(at, _)| matches!(note[at + name.len()..].chars().next(), None | Some(' ')))
        })
    };
    let words = |items: &[Setting], assigned: bool| -> Vec<String> {
        items
            .iter()
            .flat_map(|(name, values)| match assigned {
                true => vec![format!(
                    "{name}={}",
                    crate::exec::shell_quote(&values.join(" "))
                )],
                false => std::iter::once(name)
                    .chain(values)
                    .map(|w| crate::exec::shell_quote(w))
                    .collect(),
            })
            .collect()
    };
    let left_out: Vec<Setting> = changes
        .left_out
        .into_iter()
        .filter(|(name, _)| !noted(name))
        .collect();
    let on = if trial.len() == 1 {
        "the command above"
    } else {
        "the commands above, on every node"
    };
    let mut out = format!("  {on}, with\n");
    for (what, items) in [
        ("environment added", &changes.env_added),
        ("environment changed", &changes.env_changed),
        ("options added", &changes.added),
        ("options changed to", &changes.changed),
        ("options left out", &left_out),
    ] {
        if items.is_empty() {
            continue;
        }
        let listed = words(items, what.starts_with("environment"));
        let label = format!("{what}:");
        let lines = super::fill(
            std::iter::once(label.as_str()).chain(listed.iter().map(String::as_str)),
            super::WIDTH,
            "    ",
            "        ",
            0,
        );
        out.push_str(&lines.join("\n"));
        out.push('\n');
    }
    Some(out)
}

/// A variable or an option with its values.
type Setting = (String, Vec<String>);

/// What one command changes of another: each list in the order the words come.
#[derive(Debug, PartialEq)]
struct CommandChanges {
    env_added: Vec<Setting>,
    env_changed: Vec<Setting>,
    added: Vec<Setting>,
    changed: Vec<Setting>,
    left_out: Vec<Setting>,
}

/// A command line's words sorted for comparing: `NAME=value` before the program, options
/// (`--name=value`, or `--name` with the words up to the next option), every other word.
#[derive(Default)]
struct CommandWords {
    env: Vec<(String, String)>,
    /// Keyed by how many other words came before, so that torchrun's options and the
    /// script's stay apart.
    options: Vec<((usize, String), Vec<String>)>,
    others: Vec<String>,
}

impl CommandWords {
    fn of(line: &str) -> Option<CommandWords> {
        let mut out = CommandWords::default();
        let mut takes_values = false;
        for word in crate::exec::split_words(line).ok()? {
            let before_program = out.others.last().is_none_or(|w| w == "&&");
            match word.split_once('=') {
                Some((name, value)) if before_program && crate::exec::is_env_name(name) => {
                    out.env.push((name.to_string(), value.to_string()));
                    continue;
                }
                _ => {}
            }
            if word.starts_with("--") && word.len() > 2 {
                let (name, values) = match word.split_once('=') {
                    Some((name, value)) => (name.to_string(), vec![value.to_string()]),
                    None => (word.clone(), Vec::new()),
                };
                takes_values = values.is_empty();
                out.options.push(((out.others.len(), name), values));
            } else if takes_values {
                out.options.last_mut()?.1.push(word);
            } else {
                out.others.push(word);
            }
        }
        Some(out)
    }
}

impl CommandChanges {
    /// `None` when `b` is not `a` with variables and options added, changed or (options
    /// only) left out, or when an option comes twice in either.
    fn between(a: &str, b: &str) -> Option<CommandChanges> {
        let (a, b) = (CommandWords::of(a)?, CommandWords::of(b)?);
        if a.others != b.others || has_repeats(&a.options) || has_repeats(&b.options) {
            return None;
        }
        let (env_added, env_changed, env_left_out) = compare(&a.env, &b.env);
        if !env_left_out.is_empty() {
            return None;
        }
        let (added, changed, left_out) = compare(&a.options, &b.options);
        let named = |items: Vec<((usize, String), Vec<String>)>| -> Vec<Setting> {
            items.into_iter().map(|((_, name), v)| (name, v)).collect()
        };
        let listed = |items: Vec<(String, String)>| -> Vec<Setting> {
            items.into_iter().map(|(name, v)| (name, vec![v])).collect()
        };
        Some(CommandChanges {
            env_added: listed(env_added),
            env_changed: listed(env_changed),
            added: named(added),
            changed: named(changed),
            left_out: named(left_out),
        })
    }
}

fn has_repeats<K: PartialEq, V>(items: &[(K, V)]) -> bool {
    items
        .iter()
        .enumerate()
        .any(|(i, (k, _))| items[..i].iter().any(|(j, _)| j == k))
}

/// What `b` adds to `a`, what it changes (with `b`'s values) and what it leaves out.
#[allow(clippy::type_complexity)]
fn compare<K: PartialEq + Clone, V: PartialEq + Clone>(
    a: &[(K, V)],
    b: &[(K, V)],
) -> (Vec<(K, V)>, Vec<(K, V)>, Vec<(K, V)>) {
    fn find<'a, K: PartialEq, V>(items: &'a [(K, V)], key: &K) -> Option<&'a V> {
        items.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
    let added = b.iter().filter(|(k, _)| find(a, k).is_none()).cloned();
    let changed = b
        .iter()
        .filter(|(k, v)| find(a, k).is_some_and(|before| before != v))
        .cloned();
    let left_out = a.iter().filter(|(k, _)| find(b, k).is_none()).cloned();
    (added.collect(), changed.collect(), left_out.collect())
}

/// The name of `word` when it is `NAME='value'` (as `render` quotes it) with the value
/// `NAME` has `here`.
fn forwarded_as_is<'w>(word: &'w str, here: &BTreeMap<String, String>) -> Option<&'w str> {
    let (name, quoted) = word.split_once('=')?;
    let value = here.get(name)?;
    (crate::exec::is_env_name(name) && quoted == crate::render::shell::word(value)).then_some(name)
}

/// Other nodes listed one per line up to this many.
pub const MAX_COMMAND_ROWS: usize = 7;

/// The words of a shell line as we quote them (`'...'` with `'\''` inside, bare words):
/// split at spaces outside quotes, each word kept as written.
fn shell_words(line: &str) -> Vec<&str> {
    let mut words = Vec::new();
    let mut start = None;
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' if !quoted => escaped = true,
            '\'' => quoted = !quoted,
            ' ' if !quoted => {
                if let Some(s) = start.take() {
                    words.push(&line[s..i]);
                }
                continue;
            }
            _ => {}
        }
        if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        words.push(&line[s..]);
    }
    words
}

/// A shell line broken between words into lines of `width` columns at most (a word longer
/// than the room stays whole), each but the last ending in ` \`.
fn wrap_shell(line: &str, width: usize, first: &str, next: &str) -> String {
    // Room for the ` \` after each line but the last.
    let mut out = super::fill(shell_words(line), width, first, next, 2).join(" \\\n");
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_lines_wrap_between_words_and_stay_runnable() {
        let line = "cd '/w d' && A='x y' torchrun '--nnodes=2' 'it'\\''s' b\\ c";
        assert_eq!(
            shell_words(line),
            [
                "cd",
                "'/w d'",
                "&&",
                "A='x y'",
                "torchrun",
                "'--nnodes=2'",
                "'it'\\''s'",
                "b\\ c"
            ]
        );
        let wrapped = wrap_shell(line, 24, "  ", "    ");
        assert_eq!(
            wrapped,
            "  cd '/w d' && A='x y' \\\n    torchrun \\\n    '--nnodes=2' \\\n    'it'\\''s' b\\ c\n"
        );
        assert!(wrapped.lines().all(|l| l.len() <= 24));
    }

    #[test]
    fn other_nodes_are_named_not_repeated() {
        let cmd = |i: usize| ShownCommand {
            host: if i == 0 { "n0" } else { "nX" },
            line: "torchrun x",
            script: Some("launch.sh"),
        };
        let few: Vec<_> = (0..3).map(cmd).collect();
        let shown = commands_to_human(&few, &BTreeMap::new());
        assert_eq!(shown.lines().count(), 4, "{shown}");
        let many: Vec<_> = (0..100).map(cmd).collect();
        let shown = commands_to_human(&many, &BTreeMap::new());
        assert!(shown.lines().count() <= 5, "{shown}");
        assert!(shown.contains("node ranks 1-99"), "{shown}");
    }

    /// Issue 34: the trial's commands are shown as what they change of the launch's (the
    /// dry run repeated every word of them), and whole where that cannot be said.
    #[test]
    fn the_trial_shows_only_what_it_changes_of_the_launch() {
        let node = |rank: u32, env: &str, args: &str| {
            format!(
                "cd '/w' && CUDA_VISIBLE_DEVICES='0,1' {env}'torchrun' '--nnodes=2' \
                 '--node-rank={rank}' 'pretrain_gpt.py' '--num-layers' '32' {args}"
            )
        };
        let launch = "'--train-iters' '1000' '--save' '/ckpt' '--load' '/ckpt' '--bf16'";
        let trial = "'--bf16' '--train-iters' '5' '--eval-iters' '0'";
        let launched: Vec<String> = (0..2).map(|r| node(r, "", launch)).collect();
        let tried: Vec<String> = (0..2)
            .map(|r| node(r, "PYTHONPATH='/tmp/t x' ", trial))
            .collect();
        let notes = ["the trial leaves out --save /ckpt (no checkpoints in a trial)".to_string()];
        assert_eq!(
            trial_changes_to_human(&launched, &tried, &notes).as_deref(),
            Some(
                "  the commands above, on every node, with\n    \
                 environment added: PYTHONPATH='/tmp/t x'\n    \
                 options added: --eval-iters 0\n    \
                 options changed to: --train-iters 5\n    \
                 options left out: --load /ckpt\n"
            )
        );
        // Another program, a node more, or a change that differs between nodes: whole.
        let other: Vec<String> = tried
            .iter()
            .map(|l| l.replace("pretrain_gpt", "x"))
            .collect();
        assert_eq!(trial_changes_to_human(&launched, &other, &notes), None);
        assert_eq!(trial_changes_to_human(&launched[..1], &tried, &notes), None);
        let uneven = vec![tried[0].clone(), node(1, "", trial)];
        assert_eq!(trial_changes_to_human(&launched, &uneven, &notes), None);
        // A variable the launch has and the trial lacks is not a change it can name.
        let unset: Vec<String> = launched
            .iter()
            .map(|l| l.replace("CUDA_VISIBLE_DEVICES='0,1' ", ""))
            .collect();
        assert_eq!(trial_changes_to_human(&launched, &unset, &notes), None);
    }

    /// Issue 30: the dry run names the all-rails figure where the profile measured it.
    #[test]
    fn the_nics_line_names_what_the_rails_attained_at_once() {
        let mut summary = ProfileSummary {
            path: "c.json".into(),
            nodes: 2,
            gpus: 16,
            gpu_models: vec!["H100".into()],
            node_link_gbps: Some((48.5, 48.5)),
            nics_per_node: Some(8),
            all_rails: None,
        };
        let plain = summary.nics_line();
        assert!(!plain.contains("all_rails"), "{plain}");
        summary.all_rails = Some(AllRails {
            rails: 8,
            gb_per_s: 291.0,
            one_rail_gb_per_s: 48.5,
        });
        assert_eq!(
            summary.nics_line(),
            format!(
                "{plain}; 8 rails busy at once attained 291 GB/s, 75 % of 8 × 48.5 GB/s \
                 (node_links.all_rails): a collective over several NICs gets that share"
            )
        );
    }
}
