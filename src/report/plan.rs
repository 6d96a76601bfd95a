//! How a plan reads to people: the winner, why it wins, the runners-up, the mapping.

use comfy_table::{presets::NOTHING, CellAlignment, ContentArrangement, Table};
use serde::Serialize;

use crate::cluster::ClusterProfile;
use crate::config::{Recompute, Settings};
use crate::model::time::{mfu_peak_tflops, TimeEstimate};
use crate::model::ParallelConfig;
use crate::plan::mapping::SearchMethod;
use crate::plan::{HeterogeneousPlan, Plan};
use crate::supervise::output::ProgressSpec;

use super::estimate::with_stated_error;

const GIB: f64 = (1u64 << 30) as f64;

/// The plan as text. `runner_up` is the estimate of the plan's runner-up
/// ([`Plan::runner_up`]) on the same footing as the winner's (both on their best mapping),
/// when there is one, so the text can say which terms make the difference.
pub fn plan_to_human(plan: &Plan, runner_up: Option<&TimeEstimate>) -> String {
    plan_text(plan, runner_up, "")
}

/// The plan as [`plan_to_human`] writes it, with what its iteration time comes to
/// ([`throughput`]) under the headline: the dry run's and `pipette plan`'s report.
pub fn plan_report(
    plan: &Plan,
    runner_up: Option<&TimeEstimate>,
    settings: &Settings,
    profile: &ClusterProfile,
) -> String {
    plan_text(plan, runner_up, &throughput(plan, settings, profile))
}

fn plan_text(plan: &Plan, runner_up: Option<&TimeEstimate>, throughput: &str) -> String {
    let e = &plan.estimate;
    let mut out = headline(plan);
    out.push_str(throughput);
    if let Some(h) = &plan.heterogeneous {
        out.push_str(&stages(h, e.iteration_ms));
    }

    // A simpler tie runs rather than the fastest: it wins on simplicity, not on time.
    let wins_on_time = plan.ties.chosen == 0;
    out.push_str(if wins_on_time {
        "\nWhy it wins: where the time goes\n"
    } else {
        "\nWhy it runs, though #1 is faster: where the time goes\n"
    });
    let t = &e.time;
    let rows = terms(t);
    let other = runner_up.map(terms);
    for (i, (name, ms)) in rows.iter().enumerate() {
        let versus = other
            .as_ref()
            .and_then(|o| o.get(i))
            .map(|o| format!("   runner-up {:>10.1} ms", o.1))
            .unwrap_or_default();
        out.push_str(&format!("  {name:<36}{ms:>10.1} ms{versus}\n"));
    }
    if let Some(text) = runner_up.and_then(|r| runner_up_text(plan, r)) {
        out.push_str(&format!("  {text}\n"));
    }
    out.push_str(&critical_links(t));
    // Which tables priced the plan, when the profile's sweep measured them (the shipped
    // ones otherwise, as the estimate's JSON notes say).
    for note in t
        .notes
        .iter()
        .filter(|n| n.contains("measured, not shipped"))
    {
        out.push_str(&crate::log::wrap(&format!("  Time model: {note}\n"), 80));
    }
    out.push_str(&super::layouts::why_this_layout(plan));

    out.push_str("\nTop configurations (memory and time per iteration)\n");
    let mut table = Table::new();
    table.load_preset(NOTHING);
    let mut header = vec![
        "#",
        "tp",
        "pp",
        "dp",
        "mbs",
        "vpp",
        "recompute",
        "sp",
        "dist-opt",
        // Two-line headers keep the table within 80 columns.
        "peak\nGiB",
        "default\nms",
        "mapped\nms",
    ];
    // With experts, the expert layout after dp.
    let moe = plan.experts.is_some();
    if moe {
        header.splice(4..4, ["ep", "etp"]);
    }
    // On mixed GPUs configurations differ in their split too.
    let mixed = plan.heterogeneous.is_some();
    if mixed {
        header.push("layers");
    }
    table.set_header(header);
    for (i, r) in plan.top.iter().enumerate() {
        let c = &r.config;
        // The configuration that runs, when a tie made it another than the fastest.
        let marker = if i == plan.ties.chosen && i > 0 {
            "*"
        } else {
            ""
        };
        let mut row = vec![
            format!("{}{marker}", i + 1),
            c.tp.to_string(),
            c.pp.to_string(),
            c.dp.to_string(),
            c.micro_batch.to_string(),
            c.vpp.map_or("-".to_string(), |v| v.to_string()),
            recompute(&c.recompute).to_string(),
            yes(c.sequence_parallel).to_string(),
            yes(c.distributed_optimizer).to_string(),
            format!("{:.1}", r.peak_memory_bytes as f64 / GIB),
            format!("{:.1}", r.iteration_ms),
            format!("{:.1}", r.mapped_ms),
        ];
        if moe {
            row.splice(4..4, [c.ep.to_string(), c.etp.to_string()]);
        }
        if mixed {
            row.push(split(c));
        }
        table.add_row(row);
    }
    let right: &[usize] = if moe {
        &[0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 13]
    } else {
        &[0, 1, 2, 3, 4, 5, 9, 10, 11]
    };
    for &i in right {
        if let Some(col) = table.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    push_table(&mut out, &table);
    out.push_str(&ties(plan));
    out.push_str(&recalibrated(plan));
    out.push_str(&format!(
        "  {} configurations Megatron accepts, {} fit in memory, {} mapped; {} time-model evaluations\n",
        plan.stats.candidates, plan.stats.fitting, plan.stats.mapped, plan.stats.evaluations
    ));

    out.push_str("\nMapping (torchrun --node-rank and CUDA_VISIBLE_DEVICES per host)\n");
    let mut table = Table::new();
    table.load_preset(NOTHING);
    table.set_header(vec!["node rank", "host", "CUDA_VISIBLE_DEVICES"]);
    let nodes = plan.mapping.node_order.len();
    // Many nodes: the first few rows, the rest summed up (every row is in plan.json and
    // the launch scripts).
    let shown = if nodes > MAX_MAPPING_ROWS {
        MAPPING_ROWS_SHOWN
    } else {
        nodes
    };
    for (rank, host) in plan.mapping.node_order.iter().enumerate().take(shown) {
        let devices = plan
            .mapping
            .cuda_visible_devices
            .get(host)
            .map(|d| d.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
            .unwrap_or_default();
        table.add_row(vec![rank.to_string(), host.clone(), devices]);
    }
    if let Some(col) = table.column_mut(0) {
        col.set_cell_alignment(CellAlignment::Right);
    }
    push_table(&mut out, &table);
    if shown < nodes {
        let reordered = plan
            .mapping
            .cuda_visible_devices
            .values()
            .filter(|d| d.windows(2).any(|w| w[0] > w[1]))
            .count();
        out.push_str(&format!(
            "  ... node ranks {shown}-{} in plan.json and the launch scripts; {reordered} of {nodes} hosts see their GPUs reordered\n",
            nodes - 1
        ));
    }
    super::wrap(&out, super::WIDTH)
}

/// The first lines of the plan, for the dry run's report and every launch's: the
/// configuration, its split, the estimate with its stated error and peak memory, and the
/// mapping's gain (or that torchrun's order was kept).
fn headline(plan: &Plan) -> String {
    let c = &plan.config;
    let e = &plan.estimate;
    let mut out = format!("Plan: {}\n", describe(c));
    out.push_str(&format!("  layers per stage {}\n", split(c)));
    if let Some(experts) = &plan.experts {
        out.push_str(&format!("  {}\n", experts.line()));
    }
    match &plan.heterogeneous {
        None => out.push_str(&format!(
            "  iteration {} (estimated, {}), peak memory {:.1} GiB of {:.1} GiB usable\n",
            with_stated_error(e.iteration_ms, e.time.model),
            super::micro_batches(e.time.microbatches),
            e.peak_memory_bytes as f64 / GIB,
            e.usable_memory_bytes as f64 / GIB
        )),
        // Each stage has its own GPUs' memory: the stage table says how each fits.
        Some(_) => out.push_str(&format!(
            "  iteration {} (estimated, {}), every stage within its own GPUs' memory (below)\n",
            with_stated_error(e.iteration_ms, e.time.model),
            super::micro_batches(e.time.microbatches),
        )),
    }
    if let Some(b) = &e.in_16_bit {
        out.push_str(&format!(
            "  {}: the same plan in BF16 would take {:.1} ms per iteration ({:.2}x this \
             plan's time) and {:.1} GiB at its peak\n",
            b.low_precision,
            b.iteration_ms,
            b.iteration_ms / e.iteration_ms,
            b.peak_memory_bytes as f64 / GIB
        ));
    }
    let gain_of = |ms: f64| {
        if plan.baseline_mapping_ms > 0.0 {
            (plan.baseline_mapping_ms - ms) / plan.baseline_mapping_ms * 100.0
        } else {
            0.0
        }
    };
    let chosen = plan.top.get(plan.ties.chosen);
    let searched = chosen.map_or(e.iteration_ms, |r| r.searched_ms);
    // The default order's time is the planner's: so is the mapped time it is held against
    // (a trial's calibration prices the estimate again, not the orders; see recalibrated).
    let mapped = chosen.map_or(e.iteration_ms, |r| r.mapped_ms);
    // The order the plan runs when the search moved nothing: torchrun's over the hosts as
    // listed, unless the planner ordered the nodes first (then the table's hosts read
    // permuted, and the sentence must say why).
    let kept = match planners_node_order(plan) {
        None => "torchrun's default order kept".to_string(),
        Some(why) => format!(
            "no GPU moved: node ranks in the planner's order of the nodes ({why}), each node's GPUs in index order"
        ),
    };
    if searched < plan.baseline_mapping_ms && mapped >= plan.baseline_mapping_ms {
        // Hysteresis: the search found a faster order, by less than the threshold.
        out.push_str(&format!(
            "  mapping by {} ({} evaluations): {kept}, {:.1} ms\n  (the best mapping found, {searched:.1} ms, gains {:.2} %, under the {} % --mapping-threshold)\n",
            method(&plan.mapping.method),
            plan.mapping.evaluations,
            plan.baseline_mapping_ms,
            gain_of(searched),
            100.0 * plan.search.mapping_threshold,
        ));
    } else if mapped >= plan.baseline_mapping_ms && planners_node_order(plan).is_some() {
        // Nothing gained: the planner's node order is what runs.
        out.push_str(&format!(
            "  mapping by {} ({} evaluations): {kept}, {:.1} ms\n",
            method(&plan.mapping.method),
            plan.mapping.evaluations,
            plan.baseline_mapping_ms,
        ));
    } else {
        out.push_str(&format!(
            "  mapping by {} ({} evaluations): {:.1} ms on torchrun's default order, {:.1} ms mapped ({:.1} % faster)\n",
            method(&plan.mapping.method),
            plan.mapping.evaluations,
            plan.baseline_mapping_ms,
            mapped,
            gain_of(mapped),
        ));
    }
    out.push_str(&spares(&plan.spares));
    out
}

/// Why the node ranks of a plan that runs its default order do not follow the profile's
/// host order: the planner ordered the nodes before ranking (the GPU kinds in the order the
/// pipeline's stages take them on mixed GPUs, [`crate::plan::hetero`]; the nodes measured
/// slow moved last, [`crate::plan::subset`]). `None` when node rank i is the i-th host the
/// plan uses, as torchrun's hostfile order would have it.
fn planners_node_order(plan: &Plan) -> Option<&'static str> {
    let order = &plan.mapping.state.node_order;
    if order.windows(2).all(|w| w[0] < w[1]) {
        return None;
    }
    Some(if plan.heterogeneous.is_some() {
        "the GPU kinds in the order of the pipeline's stages"
    } else {
        "the nodes measured slower than the median last"
    })
}

/// The nodes the plan leaves out, at most [`SPARES_SHOWN`] of them by name; empty when none.
fn spares(hosts: &[String]) -> String {
    if hosts.is_empty() {
        return String::new();
    }
    let mut names = hosts[..hosts.len().min(SPARES_SHOWN)].join(", ");
    if hosts.len() > SPARES_SHOWN {
        names.push_str(&format!(" and {} more", hosts.len() - SPARES_SHOWN));
    }
    format!(
        "  spares: {} node{} not launched, kept to take a failed node's place: {names}\n",
        hosts.len(),
        if hosts.len() == 1 { "" } else { "s" },
    )
}

/// Spares named in the plan's headline; the JSON has every one.
const SPARES_SHOWN: usize = 8;

/// How the runner-up ([`Plan::runner_up`]) compares, from the same numbers as the table
/// and the ties: `runner-up #2 tp 1 × pp 2 ...: 12.0 ms, 1.1 ms (9.2 %) slower; against
/// the pick: +0.8 ms steady state, ...`. When a tie made a simpler configuration run, the
/// runner-up is #1 and faster, and the text says that it is a tie and why the pick runs.
/// `None` without a runner-up.
fn runner_up_text(plan: &Plan, r: &TimeEstimate) -> Option<String> {
    let position = plan.runner_up()?;
    let config = &plan.top[position].config;
    let t = &plan.estimate.time;
    // The terms that differ most, either way: what the runner-up loses and gains.
    let mut deltas: Vec<(&str, f64)> = terms(t)
        .iter()
        .zip(terms(r))
        .map(|((name, ours), (_, theirs))| (*name, theirs - ours))
        .filter(|(_, d)| d.abs() >= 0.05)
        .collect();
    deltas.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));
    let differences: Vec<String> = deltas
        .iter()
        .take(2)
        .map(|(name, d)| format!("{d:+.1} ms {name}"))
        .collect();
    let delta = r.iteration_ms - t.iteration_ms;
    let share = if t.iteration_ms > 0.0 {
        100.0 * delta.abs() / t.iteration_ms
    } else {
        0.0
    };
    let ties = plan.ties;
    let relation = if delta.abs() < 0.05 {
        "as fast to 0.1 ms".to_string()
    } else if delta >= 0.0 {
        format!("{delta:.1} ms ({share:.1} %) slower")
    } else if measured_choice(plan) {
        // The trial measured the candidates: the measurement, not the model, chose.
        format!(
            "{:.1} ms ({share:.1} %) faster by the model, but the trial measured the pick faster",
            -delta
        )
    } else if position < ties.count && ties.chosen < ties.count {
        format!(
            "{:.1} ms ({share:.1} %) faster, within the model's stated error (± {:.1} %): a tie, and the simpler runs",
            -delta,
            100.0 * ties.window
        )
    } else {
        format!("{:.1} ms ({share:.1} %) faster", -delta)
    };
    Some(format!(
        "runner-up #{} {}{}: {:.1} ms, {relation}; against the pick: {}",
        position + 1,
        describe(config),
        unlike(&plan.config, config),
        r.iteration_ms,
        if differences.is_empty() {
            "the same terms".to_string()
        } else {
            differences.join(", ")
        }
    ))
}

/// Whether the pick is not what the ties alone choose (the simplest of them,
/// [`crate::plan::simpler`]): the trial's measured choice made another run.
fn measured_choice(plan: &Plan) -> bool {
    let count = plan.ties.count.min(plan.top.len());
    let simplest = (0..count).min_by(|&a, &b| {
        crate::plan::simpler(&plan.top[a].config, &plan.top[b].config).then(a.cmp(&b))
    });
    simplest.is_some_and(|s| s != plan.ties.chosen)
}

/// What tells `other` from `pick` when [`describe`] reads them alike (` (full recompute
/// by block of 2 layers; the pick: uniform, 1)`, ` (layers 5,5,6; the pick: 6,5,5)`); empty
/// when the descriptions differ already.
fn unlike(pick: &ParallelConfig, other: &ParallelConfig) -> String {
    if describe(pick) != describe(other) {
        return String::new();
    }
    let full = |r: &Recompute| match r {
        Recompute::Full { method, num_layers } => {
            format!("{} of {num_layers}", method.megatron_name())
        }
        Recompute::Selective => "selective".to_string(),
        Recompute::None => "none".to_string(),
    };
    let mut parts = Vec::new();
    if pick.recompute != other.recompute {
        parts.push(format!(
            "recompute {}; the pick: {}",
            full(&other.recompute),
            full(&pick.recompute)
        ));
    }
    if pick.layers_per_stage != other.layers_per_stage {
        parts.push(format!(
            "layers {}; the pick: {}",
            split(other),
            split(pick)
        ));
    }
    if parts.is_empty() {
        // The same configuration on another order of the GPU kinds or nodes.
        parts.push("the pick's configuration on another placement".to_string());
    }
    format!(" ({})", parts.join(", "))
}

/// The user's own parallel configuration, as the script's Megatron arguments give it,
/// costed with the same model as the plan (on torchrun's default order, as the user's
/// own launch would place it).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Yours {
    /// It runs: its estimated iteration time and peak memory.
    Costed {
        config: ParallelConfig,
        iteration_ms: f64,
        peak_memory_bytes: u64,
    },
    /// Megatron would accept it, but it needs more memory than the GPUs have.
    DoesNotFit {
        config: ParallelConfig,
        reason: String,
    },
    /// Megatron (or this world size) does not accept it.
    Invalid { reason: String },
}

/// What `--pin yours` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PinOutcome {
    /// `--pin yours` was not given.
    NotAsked,
    /// Ours is not faster by more than the model's stated error: yours runs.
    Kept,
    /// Ours is faster by more than the stated error: ours runs.
    Replaced,
    /// Yours cannot run (invalid, or it does not fit): ours runs.
    CannotRun,
}

/// The user's configuration against ours, for the plan report and `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct YoursReport {
    pub yours: Yours,
    /// The best configuration the planner found, free of `--pin yours`, and its estimate
    /// on its best mapping.
    pub ours: ParallelConfig,
    pub ours_ms: f64,
    /// The model's stated error, a fraction (0.043).
    pub stated_error: f64,
    pub pin: PinOutcome,
}

impl YoursReport {
    /// How much faster ours is than yours, a fraction of yours (negative when slower);
    /// `None` when yours was not costed.
    pub fn gain(&self) -> Option<f64> {
        match &self.yours {
            Yours::Costed { iteration_ms, .. } if *iteration_ms > 0.0 => {
                Some((iteration_ms - self.ours_ms) / iteration_ms)
            }
            _ => None,
        }
    }

    /// The lines of the plan report: yours costed beside ours, and what `--pin yours`
    /// decided.
    pub fn to_human(&self) -> String {
        let error = 100.0 * self.stated_error;
        let mut out = String::new();
        match &self.yours {
            Yours::Costed {
                config,
                iteration_ms,
                ..
            } => {
                out.push_str(&format!(
                    "  yours, as your arguments say: {}\n",
                    describe(config)
                ));
                let gain = 100.0 * self.gain().unwrap_or(0.0);
                let how = if *config == self.ours {
                    if gain.abs() < 0.05 {
                        "the same configuration".to_string()
                    } else {
                        format!("the same configuration, mapped: {gain:.1} % faster")
                    }
                } else if gain >= 0.0 {
                    format!("{gain:.1} % faster")
                } else {
                    format!("{:.1} % slower: the simpler of the ties", -gain)
                };
                let within = if gain.abs() <= error && *config != self.ours {
                    format!(", within the model's stated error of ± {error:.1} %")
                } else {
                    String::new()
                };
                out.push_str(&format!(
                    "  yours: {iteration_ms:.1} ms, ours: {:.1} ms ({how}{within})\n",
                    self.ours_ms
                ));
            }
            Yours::DoesNotFit { config, reason } => out.push_str(&format!(
                "  yours, as your arguments say: {}\n  yours does not fit: {reason}\n",
                describe(config)
            )),
            Yours::Invalid { reason } => {
                out.push_str(&format!("  yours is not a valid configuration: {reason}\n"))
            }
        }
        let gain = 100.0 * self.gain().unwrap_or(0.0);
        match self.pin {
            PinOutcome::NotAsked => {}
            PinOutcome::Kept => out.push_str(&format!(
                "  --pin yours: yours runs (ours is faster by {gain:.1} %, not by more than the model's stated error of ± {error:.1} %)\n"
            )),
            PinOutcome::Replaced => out.push_str(&format!(
                "  --pin yours: ours runs (faster by {gain:.1} %, more than the model's stated error of ± {error:.1} %)\n"
            )),
            PinOutcome::CannotRun => {
                out.push_str("  --pin yours: yours cannot run, so ours runs\n")
            }
        }
        out
    }
}

/// The plan in a few lines, as every launch logs it (the head of the dry run's report):
/// the configuration, the estimate with its stated error, the mapping's gain, why it wins
/// (the runner-up and what it loses), the ties, and the user's configuration costed
/// beside it. Laid out for `width` columns.
pub fn plan_summary(
    plan: &Plan,
    runner_up: Option<&TimeEstimate>,
    yours: Option<&YoursReport>,
    width: usize,
) -> String {
    let mut out = headline(plan);
    let why = if plan.ties.chosen == 0 {
        "why it wins"
    } else {
        "why it runs"
    };
    match runner_up.and_then(|r| runner_up_text(plan, r)) {
        Some(text) => out.push_str(&format!("  {why}: the {text}\n")),
        None => out.push_str(&format!(
            "  why it wins: the only configuration that fits ({} Megatron accepts, {} fit)\n",
            plan.stats.candidates, plan.stats.fitting
        )),
    }
    out.push_str(&ties(plan));
    out.push_str(&recalibrated(plan));
    if let Some(y) = yours {
        out.push_str(&y.to_human());
    }
    super::wrap(&out, width)
}

/// More nodes than this: the mapping table shows [`MAPPING_ROWS_SHOWN`] rows.
const MAX_MAPPING_ROWS: usize = 16;
const MAPPING_ROWS_SHOWN: usize = 8;

/// The stages of a plan on mixed GPUs, and how the split compares with an even one.
fn stages(h: &HeterogeneousPlan, iteration_ms: f64) -> String {
    let mut out =
        String::from("\nStages on mixed GPUs (layers by speed, within each stage's own memory)\n");
    let mut table = Table::new();
    table.load_preset(NOTHING);
    table.set_header(vec![
        "stage",
        "GPU",
        "GPUs",
        "layers",
        "fit up to",
        "peak GiB",
        "usable GiB",
        "slot ms",
    ]);
    for s in &h.stages {
        table.add_row(vec![
            s.stage.to_string(),
            s.gpu.clone(),
            s.gpus.to_string(),
            s.layers.to_string(),
            s.layer_capacity.to_string(),
            format!("{:.1}", s.peak_memory_bytes as f64 / GIB),
            format!("{:.1}", s.usable_memory_bytes as f64 / GIB),
            format!("{:.1}", s.slot_ms),
        ]);
    }
    for i in [0, 2, 3, 4, 5, 6, 7] {
        if let Some(col) = table.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    push_table(&mut out, &table);
    match &h.even_split {
        Some(even) => out.push_str(&format!(
            "  the best even split ({}, layers {}) takes {:.1} ms: this split is {:.2}× as fast ({:+.1} ms)\n",
            describe(&even.config),
            split(&even.config),
            even.iteration_ms,
            even.ratio,
            iteration_ms - even.iteration_ms
        )),
        None => out.push_str("  no even split of the layers fits (or uneven splits were off)\n"),
    }
    out
}

/// `5,5,15,15`
fn split(c: &ParallelConfig) -> String {
    c.layers_per_stage
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The ties, said out loud: which configurations the model cannot tell from the fastest,
/// and which of them runs. Empty without ties.
fn ties(plan: &Plan) -> String {
    let t = plan.ties;
    if t.count < 2 {
        return String::new();
    }
    let which = if t.chosen == 0 {
        "#1, the fastest, is also the simplest".to_string()
    } else {
        format!("#{} runs", t.chosen + 1)
    };
    // One line, which [`super::wrap`] breaks to the width.
    format!(
        "  #1-#{} are ties: within the model's stated error (± {:.1} %) of the fastest; the simplest wins (fewest pipeline stages, then virtual stages, smallest tp, largest micro-batch): {which}\n",
        t.count,
        100.0 * t.window,
    )
}

/// When the pick's estimate is no longer its figure in the ranking (a trial's calibration
/// priced it again, the ranking was not redone): says so, so that the table, the ties and
/// the estimate are not read as contradicting each other. Empty otherwise.
fn recalibrated(plan: &Plan) -> String {
    let Some(ranked) = plan.top.get(plan.ties.chosen) else {
        return String::new();
    };
    let now = plan.estimate.iteration_ms;
    if (now - ranked.mapped_ms).abs() <= 0.0005 * ranked.mapped_ms.max(1.0) {
        return String::new();
    }
    format!(
        "  the ranking and the ties are the planner's figures ({:.1} ms for the pick); the estimate above, {now:.1} ms, is under the calibration the trial fitted\n",
        ranked.mapped_ms
    )
}

/// The slow links and the GPU on the critical path, each with what its term costs the
/// iteration: the slowest pipeline hop that crosses nodes, the data-parallel ring's
/// bottleneck, the critical stage's tensor-parallel ring when it leaves its node, the
/// expert all-to-all when it crosses nodes, and the GPU that sets the slowest stage's pace.
/// Every figure is the time model's; empty when nothing of the plan leaves a node. One
/// paragraph, so a large plan's report stays a screenful.
fn critical_links(t: &TimeEstimate) -> String {
    let mut parts = Vec::new();
    let low = |h: &crate::model::time::HopTime| h.activation.gb_per_s.min(h.gradient.gb_per_s);
    let slowest_hop = t
        .pipeline
        .hops
        .iter()
        .filter(|h| !h.activation.intra_node || !h.gradient.intra_node)
        .min_by(|a, b| low(a).total_cmp(&low(b)));
    if let Some(h) = slowest_hop {
        let link = if h.activation.gb_per_s <= h.gradient.gb_per_s {
            &h.activation
        } else {
            &h.gradient
        };
        parts.push(format!(
            "the pipeline hop stage {} -> {} ({} -> {}) runs over a {:.1} GB/s link \
             (the pipeline's sends: {:.1} ms)",
            h.from_stage,
            h.to_stage,
            link.from.host,
            link.to.host,
            link.gb_per_s,
            t.pipeline_p2p_ms
        ));
    }
    let dp = &t.data_parallel;
    if let Some(ring) = dp.bottleneck.as_ref().filter(|r| !r.link.intra_node) {
        parts.push(format!(
            "the data-parallel {} runs at {:.1} GB/s on {} -> {} ({:.1} ms exposed)",
            dp.collective,
            ring.link.gb_per_s,
            ring.link.from.host,
            ring.link.to.host,
            dp.reduce_exposed_ms + dp.param_gather_exposed_ms
        ));
    }
    let stage = t.stages.get(t.critical_stage);
    if let Some((s, link)) = stage.and_then(|s| Some((s, s.tp_link.as_ref()?))) {
        if !link.intra_node {
            parts.push(format!(
                "stage {}'s tensor-parallel ring leaves its node at {:.1} GB/s ({} -> {}, \
                 {:.1} ms a micro-batch)",
                s.stage, link.gb_per_s, link.from.host, link.to.host, s.tp_comm_ms
            ));
        }
    }
    if let Some(e) = t.expert.as_ref().filter(|e| e.dispatch.crosses_nodes) {
        parts.push(format!(
            "the expert all-to-all crosses nodes at {:.1} GB/s ({:.1} ms)",
            e.dispatch.inter_gb_per_s, t.expert_parallel_ms
        ));
    }
    if parts.is_empty() {
        return String::new();
    }
    if let Some((s, gpu)) = stage.and_then(|s| Some((s, s.gpu.as_ref()?))) {
        parts.push(format!(
            "stage {} sets the pace ({:.1} ms a slot) on {} GPU {} ({})",
            s.stage, s.slot_ms, gpu.device.host, gpu.device.index, gpu.name
        ));
    }
    format!("  On the critical path: {}.\n", parts.join("; "))
}

/// What the plan's iteration time comes to: tokens per second (all GPUs and per GPU),
/// MFU against the sum of the plan's GPUs' datasheet peaks (none where a GPU has no
/// datasheet peak, as a CPU stand-in; see [`mfu_peak_tflops`]), GPU-hours per billion
/// tokens, and the whole run's when `--train-iters` gives its length. Tokens and FLOPs
/// per iteration are the launch's progress lines' ([`ProgressSpec::planned`]), so the dry
/// run and the run count alike.
fn throughput(plan: &Plan, settings: &Settings, profile: &ClusterProfile) -> String {
    let spec = ProgressSpec::planned(std::time::Duration::ZERO, plan, settings, profile);
    let seconds = plan.estimate.iteration_ms / 1000.0;
    let (Some(tokens), true) = (spec.tokens_per_iteration, seconds > 0.0) else {
        return String::new();
    };
    let gpus = plan.config.world_size().max(1) as f64;
    let per_s = tokens / seconds;
    let mut out = format!(
        "  that is {} tokens/s ({} per GPU)",
        super::thousands(per_s.round() as u64),
        super::thousands((per_s / gpus).round() as u64)
    );
    // Each rank's GPU's peak: on mixed GPUs the bound is their sum, not the slowest's.
    let peaks: Option<Vec<f64>> = plan
        .placement
        .devices
        .iter()
        .map(|d| {
            let gpu = profile.nodes.get(d.node)?.gpus()?.get(d.gpu)?;
            mfu_peak_tflops(gpu, settings.training.precision)
        })
        .collect();
    match (spec.flops_per_iteration, peaks) {
        (Some(flops), Some(peaks)) if !peaks.is_empty() && peaks.iter().all(|p| *p > 0.0) => {
            let total: f64 = peaks.iter().sum();
            let (low, high) = peaks
                .iter()
                .fold((f64::INFINITY, 0.0_f64), |(l, h), p| (l.min(*p), h.max(*p)));
            let each = if high - low < 0.5 {
                format!("{high:.0} TFLOP/s each")
            } else {
                format!("{low:.0}-{high:.0} TFLOP/s, {:.0} TFLOP/s in all", total)
            };
            out.push_str(&format!(
                ", MFU {:.1} % of the GPUs' datasheet peak ({each})",
                100.0 * flops / seconds / (total * 1e12)
            ));
        }
        _ => out.push_str(", no MFU (a GPU of the plan has no datasheet peak)"),
    }
    out.push_str(&format!(
        "; {:.1} GPU-hours per billion tokens",
        gpus * 1e9 / per_s / 3600.0
    ));
    if let Some(iters) = settings.training.train_iters {
        let hours = iters as f64 * seconds / 3600.0;
        out.push_str(&format!(
            "; --train-iters {iters}: {hours:.1} hours, {:.0} GPU-hours",
            hours * gpus
        ));
    }
    out.push('\n');
    super::wrap(&out, super::WIDTH)
}

/// The time terms in the order they add up to the iteration; a model with routed experts
/// adds the all-to-all and the experts' own gradient sync (two rows a dense plan does not
/// show).
fn terms(t: &TimeEstimate) -> Vec<(&'static str, f64)> {
    let mut rows = vec![
        ("steady state (m × slowest stage)", t.steady_ms),
        ("pipeline fill and drain", t.bubble_ms),
        ("pipeline sends on the critical path", t.pipeline_p2p_ms),
        ("data-parallel reduce (exposed)", t.data_parallel_exposed_ms),
        ("parameter all-gather (exposed)", t.param_gather_exposed_ms),
        ("optimizer step", t.optimizer_ms),
    ];
    if t.expert.is_some() {
        rows.push(("expert dispatch and combine", t.expert_parallel_ms));
        rows.push((
            "expert-data-parallel sync (exposed)",
            t.expert_dp_exposed_ms,
        ));
    }
    rows
}

/// `tp 2 × pp 4 × dp 4, micro-batch 1, selective recompute, ...`; with experts split,
/// `tp 2 × pp 4 × dp 4 (experts: ep 8 × etp 1), micro-batch 1, ...`.
pub fn describe(c: &ParallelConfig) -> String {
    let experts = if c.ep > 1 || c.etp > 1 {
        format!(" (experts: ep {} × etp {})", c.ep, c.etp)
    } else {
        String::new()
    };
    shape_text(c, &experts)
}

/// `c`'s tp × pp × dp, context parallelism, micro-batch and options, with `experts` (the
/// expert layout's words, or nothing where the caller names it already) after the sizes.
pub fn shape_text(c: &ParallelConfig, experts: &str) -> String {
    format!(
        "tp {} × pp {} × dp {}{}{experts}, micro-batch {}{}",
        c.tp,
        c.pp,
        c.dp,
        context_text(c),
        c.micro_batch,
        c.options_text()
    )
}

/// ` × cp 8` with context parallelism, else empty.
pub fn context_text(c: &ParallelConfig) -> String {
    if c.cp > 1 {
        format!(" × cp {}", c.cp)
    } else {
        String::new()
    }
}

fn recompute(r: &Recompute) -> &'static str {
    match r {
        Recompute::None => "none",
        Recompute::Selective => "selective",
        Recompute::Full { .. } => "full",
    }
}

fn method(m: &SearchMethod) -> &'static str {
    match m {
        SearchMethod::Identity => "torchrun's default order",
        SearchMethod::Anneal => "simulated annealing",
        SearchMethod::Exhaustive { gpu_orders: true } => "exhaustive search (nodes and GPUs)",
        SearchMethod::Exhaustive { gpu_orders: false } => "exhaustive search (node orders)",
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "-"
    }
}

/// Appends `table` indented by one column, its cells wrapped so that it fits
/// [`super::WIDTH`] columns.
fn push_table(out: &mut String, table: &Table) {
    let mut table = table.clone();
    fit_table(&mut table);
    for line in table.lines() {
        out.push(' ');
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

/// Lays `table` out to fit [`super::WIDTH`] columns once indented by one: its cells wrap
/// (headers first) where the columns would not fit side by side.
pub(super) fn fit_table(table: &mut Table) {
    let room = super::WIDTH - 1;
    // Two spaces between columns while they fit, else one; then wrap what still does not.
    let natural: usize = table
        .column_max_content_widths()
        .iter()
        .map(|w| usize::from(*w) + 2)
        .sum();
    if natural > room {
        for column in table.column_iter_mut() {
            column.set_padding((1, 0));
        }
    }
    table
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_width(room as u16);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-3 1.3B at batch 64 planned on the shipped a100-2x8 cluster, top 3 kept.
    fn gpt3_1_3b_on_a100_2x8() -> Plan {
        use crate::config::settings_from_megatron_args;
        use crate::plan::{plan, PlanOptions};
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/clusters/a100-2x8.json");
        let cluster = ClusterProfile::load(&file).unwrap();
        let args: Vec<String> = ["--bf16", "--global-batch-size", "64"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let settings = settings_from_megatron_args(&args, Some("gpt3-1.3b"), &[]).unwrap();
        let options = PlanOptions {
            budget: Some(2_000),
            top_k: 3,
            ..PlanOptions::default()
        };
        plan(&settings, &cluster, &options).unwrap()
    }

    /// Issue 34: after a trial's calibration priced the pick again, the mapping line held
    /// the planner's default-order time against the calibrated estimate ("1840.9 ms on
    /// torchrun's default order, 1354.5 ms mapped (26.4 % faster)" for 2 GPUs of one
    /// node). Both sides are the planner's figures; the calibrated estimate is said apart.
    #[test]
    fn the_mapping_gain_is_the_planners_even_after_a_calibration() {
        let mut p = gpt3_1_3b_on_a100_2x8();
        let before = headline(&p);
        p.estimate.iteration_ms *= 0.7;
        let after = headline(&p);
        let mapping = |text: &str| {
            text.lines()
                .filter(|l| l.contains("mapping"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(mapping(&before), mapping(&after), "{before}\n{after}");
        assert!(recalibrated(&p).contains("under the calibration the trial fitted"));
    }

    /// Found in review: after a measured choice the "why it runs" paragraph named, as the
    /// runner-up "0.0 ms faster", a configuration that reads as the pick (full recompute by
    /// another method) and called the choice a tie the simpler won. It now says what tells
    /// them apart and that the trial chose.
    #[test]
    fn a_runner_up_that_reads_as_the_pick_is_told_apart() {
        use crate::config::RecomputeMethod;
        let mut p = gpt3_1_3b_on_a100_2x8();
        let with = |method, num_layers| ParallelConfig {
            recompute: Recompute::Full { method, num_layers },
            ..p.config.clone()
        };
        // #1 full recompute by block of 2, #2 (the pick, measured faster) uniform of 1.
        p.top[0].config = with(RecomputeMethod::Block, 2);
        p.top[1].config = with(RecomputeMethod::Uniform, 1);
        p.config = p.top[1].config.clone();
        p.ties = crate::plan::Ties {
            count: 2,
            chosen: 1,
            ..p.ties
        };
        let mut runner_up = p.estimate.time.clone();
        let text = plan_summary(&p, Some(&runner_up), None, 400);
        assert!(text.contains("why it runs: the runner-up #1"), "{text}");
        assert!(
            text.contains("(recompute block of 2; the pick: uniform of 1)"),
            "{text}"
        );
        assert!(text.contains("as fast to 0.1 ms"), "{text}");
        assert!(!text.contains("0.0 ms (0.0 %)"), "{text}");
        runner_up.iteration_ms -= 10.0;
        let text = plan_summary(&p, Some(&runner_up), None, 400);
        assert!(
            text.contains("faster by the model, but the trial measured the pick faster"),
            "{text}"
        );
        assert!(!text.contains("the simpler runs"), "{text}");
    }

    /// The planner put the node with slow GPUs last (node ranks n1, n2, n3, n0) and no
    /// mapping gained enough to move a GPU: the report said "torchrun's default order
    /// kept" above a table whose hosts read permuted. It now says which order runs and
    /// why, searched or not.
    #[test]
    fn the_order_that_runs_is_named_when_the_planner_ordered_the_nodes() {
        use crate::plan::subset::tests::{cluster, settings};
        use crate::plan::{plan_subset, MappingMode, PlanOptions};
        // n0 is 7 % slower: one class of GPU, but a node the subset search puts last.
        let profile = cluster(&[290.0, 312.0, 312.0, 312.0], 8, &[]);
        let settings = settings(8, 64);
        for (mapping, threshold) in [(MappingMode::Identity, 0.01), (MappingMode::Auto, 0.99)] {
            let options = PlanOptions {
                budget: Some(500),
                top_k: 2,
                mapping,
                mapping_threshold: threshold,
                ..PlanOptions::default()
            };
            let p = plan_subset(&settings, &profile, &options).unwrap();
            assert_eq!(
                p.mapping.node_order,
                ["n1", "n2", "n3", "n0"],
                "{mapping:?}"
            );
            let text = headline(&p);
            assert!(!text.contains("default order kept"), "{mapping:?}: {text}");
            assert!(
                text.contains("no GPU moved: node ranks in the planner's order of the nodes (the nodes measured slower than the median last)"),
                "{mapping:?}: {text}"
            );
        }
        // Nodes in the profile's order: the sentence is what it was.
        let even = cluster(&[312.0; 2], 8, &[]);
        let options = PlanOptions {
            budget: Some(500),
            top_k: 2,
            mapping_threshold: 0.99,
            ..PlanOptions::default()
        };
        let p = plan_subset(&settings, &even, &options).unwrap();
        assert_eq!(p.mapping.node_order, ["n0", "n1"]);
        assert_eq!(planners_node_order(&p), None);
    }
}
