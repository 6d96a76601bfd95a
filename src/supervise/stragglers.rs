//! Stragglers: a node that keeps the whole synchronous job at its pace. This module owns
//! reading the training script's straggler report, judging it (which node, how much
//! slower, for how long), costing the choices it leaves with the model
//! ([`crate::replan::straggler`] plans and times them; [`weigh`] scales them to the job's
//! measured pace) and the decision whether to act ([`decide`]), all pure; the driver
//! ([`super::driver`]) gathers the facts from the job's output, records the verdict and
//! carries an action out through the normal re-plan path.
//!
//! # What is read
//!
//! Megatron's `--log-straggler` (its `StragglerDetector`, megatron/core/utils.py) makes
//! rank 0 print, every log interval, one line
//! `[date] | MnRtt/Rnk: 3453.08ms/8 | MxRtt/Rnk: 3468.20ms/0 | ... | MnEtpt/Rnk: 296.02TF/0 |
//! MxEtpt/Rnk: 297.32TF/8`, and with `--straggler-minmax-count N` (1 < N < world size) two
//! more, `^^^^ Bottom N Ranks with lowest  Etpt(TF): 296.02/0, ...,` and
//! `^^^^ Top    N Ranks with highest Etpt(TF): ...,`. `Etpt` is a rank's estimated
//! throughput over the interval (TFLOP/s): every rank does the same work, so a lower one
//! means a slower rank. A window is one interval's lines; the ranks it names are all that is
//! known of it (two with the default count: the slowest and the fastest).
//!
//! # When a node is a straggler
//!
//! A node's throughput in a window is its slowest named rank's (a node with a throttled GPU
//! is as slow as that GPU). The slowest node is a straggler in the window when it is below
//! `threshold` × the median of the other named nodes (the median, not the mean, so one fast
//! outlier does not make the rest look slow). It is reported after `windows` consecutive
//! windows naming the same node, with its slowdown (the median over those windows of the
//! others' median ÷ its own): a single slow window (a checkpoint save, a garbage collection,
//! a noisy neighbour) never is. A reported node that the job went on with has recovered
//! when it has not been the straggler for as many consecutive windows; that is said once.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::cluster::profile::median;
use crate::cluster::ClusterProfile;
use crate::launch::CheckpointState;
use crate::replan::failure::Replanned;
use crate::replan::straggler::{choices, RunningPlan};

/// What pipette-run does about stragglers (`--stragglers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StragglerMode {
    /// Nothing is read.
    Off,
    /// Detected stragglers and the costed choices are reported; the job goes on as it is.
    #[default]
    Report,
    /// ... and the best choice is taken when its gain beats the cost of a restart.
    Act,
}

/// How stragglers are found and when they are acted on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StragglerOptions {
    pub mode: StragglerMode,
    /// A node below this share of the others' median throughput is slow.
    pub threshold: f64,
    /// For this many consecutive windows (log intervals).
    pub windows: u32,
    /// At most one action per cooldown.
    pub cooldown: Duration,
}

impl Default for StragglerOptions {
    fn default() -> Self {
        StragglerOptions {
            mode: StragglerMode::Report,
            threshold: 0.7,
            windows: 3,
            cooldown: Duration::from_secs(30 * 60),
        }
    }
}

/// A line of the straggler report.
#[derive(Debug, Clone, PartialEq)]
pub enum ReportLine {
    /// The summary line (`MnEtpt/Rnk`, `MxEtpt/Rnk`): a new window, with the slowest and
    /// the fastest rank's throughput.
    Summary(Vec<(u64, f64)>),
    /// A `Bottom N` or `Top N` line: more ranks of the current window.
    Ranks(Vec<(u64, f64)>),
}

/// Reads a line of Megatron's straggler report (see the module doc); `None` for any other.
pub fn parse_line(line: &str) -> Option<ReportLine> {
    if line.contains("MnEtpt/Rnk:") {
        let field = |name: &str| -> Option<(u64, f64)> {
            let rest = line[line.find(name)? + name.len()..].trim_start();
            let value = rest.split(['|', ' ']).next()?;
            let (tf, rank) = value.split_once("TF/")?;
            Some((rank.trim().parse().ok()?, finite(tf)?))
        };
        let ranks: Vec<(u64, f64)> = [field("MnEtpt/Rnk:"), field("MxEtpt/Rnk:")]
            .into_iter()
            .flatten()
            .collect();
        return (!ranks.is_empty()).then_some(ReportLine::Summary(ranks));
    }
    if line.contains("^^^^") && line.contains("Etpt(TF):") {
        let list = &line[line.find("Etpt(TF):")? + "Etpt(TF):".len()..];
        let ranks: Vec<(u64, f64)> = list
            .split(',')
            .filter_map(|item| {
                let (tf, rank) = item.trim().split_once('/')?;
                Some((rank.trim().parse().ok()?, finite(tf)?))
            })
            .collect();
        return (!ranks.is_empty()).then_some(ReportLine::Ranks(ranks));
    }
    None
}

fn finite(text: &str) -> Option<f64> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
}

/// A node found slow for the configured windows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Straggler {
    pub host: String,
    pub node_rank: u64,
    /// How many times slower than the others' median (2.0: half speed).
    pub slowdown: f64,
    /// Consecutive windows it was slow in.
    pub windows: u32,
    /// Its ranks named slow in the last window.
    pub ranks: Vec<u64>,
}

/// The slowest node of one window when it is below `threshold` × the others' median:
/// its index in `nodes` and its slowdown. `nodes[i]`: node i's throughput (its slowest named
/// rank), `None` when the window names none of its ranks.
pub fn slow_node(nodes: &[Option<f64>], threshold: f64) -> Option<(usize, f64)> {
    let named: Vec<(usize, f64)> = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.map(|v| (i, v)))
        .collect();
    let (slowest, value) = named.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1))?;
    let others: Vec<f64> = named
        .iter()
        .filter(|(i, _)| *i != slowest)
        .map(|(_, v)| *v)
        .collect();
    if others.is_empty() {
        return None;
    }
    let reference = median(&others);
    (reference > 0.0 && value < threshold * reference)
        .then(|| (slowest, reference / value.max(f64::MIN_POSITIVE)))
}

/// A straggler reported before that kept up with the others again for the configured
/// windows (the job went on with it: an action ends the attempt).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recovery {
    pub host: String,
    pub node_rank: u64,
    /// Consecutive windows it was not the straggler in.
    pub windows: u32,
}

/// Whether a `straggler` event tells of a straggler found or of one that recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StragglerState {
    Detected,
    Recovered,
}

/// Reads the report's lines window by window and says when a node has been slow for the
/// configured windows (once per run of slow windows), and when a node it reported has not
/// been the straggler for as many windows since (its recovery). A window that names none
/// of its ranks counts for its recovery: the report names the slowest rank, so its ranks
/// were no slower, and the window was judged without finding it slow.
#[derive(Debug, Clone)]
pub struct Detector {
    /// Hosts in node-rank order (`hosts[n]` has node rank n); rank r runs on node
    /// r / `nproc`.
    hosts: Vec<String>,
    nproc: u64,
    threshold: f64,
    windows: u32,
    /// The window being read: throughput by rank.
    current: Option<BTreeMap<u64, f64>>,
    /// The node slow in the last windows, and its slowdown in each.
    streak: Option<(usize, Vec<f64>, Vec<u64>)>,
    reported: bool,
    /// The node reported last, and the windows since in which it was not the straggler.
    recovering: Option<(usize, u32)>,
    /// A recovery found and not yet taken ([`Detector::take_recovery`]).
    recovered: Option<Recovery>,
}

impl Detector {
    pub fn new(hosts: Vec<String>, nproc: u64, options: &StragglerOptions) -> Detector {
        Detector {
            hosts,
            nproc: nproc.max(1),
            threshold: options.threshold,
            windows: options.windows.max(1),
            current: None,
            streak: None,
            reported: false,
            recovering: None,
            recovered: None,
        }
    }

    /// The recovery the last line found, if any (apart from [`Detector::line`]'s answer: the
    /// window in which one node recovers may be the one that finds another slow).
    pub fn take_recovery(&mut self) -> Option<Recovery> {
        self.recovered.take()
    }

    /// Counts a window for the recovery of the node reported last; `slow`: the window's
    /// straggler, if any.
    fn watch_recovery(&mut self, slow: Option<usize>) {
        let Some((node, normal)) = self.recovering.as_mut() else {
            return;
        };
        if slow == Some(*node) {
            *normal = 0;
            return;
        }
        *normal += 1;
        if *normal >= self.windows {
            self.recovered = Some(Recovery {
                host: self.hosts[*node].clone(),
                node_rank: *node as u64,
                windows: *normal,
            });
            self.recovering = None;
        }
    }

    /// Takes one line of the report; returns a straggler when the window this line closes
    /// makes one (a window is judged when the next begins, once all its lines are in).
    pub fn line(&mut self, line: ReportLine) -> Option<Straggler> {
        match line {
            ReportLine::Ranks(ranks) => {
                if let Some(window) = self.current.as_mut() {
                    window.extend(ranks);
                }
                None
            }
            ReportLine::Summary(ranks) => {
                let closed = self.current.replace(ranks.into_iter().collect());
                closed.and_then(|window| self.judge(&window))
            }
        }
    }

    fn judge(&mut self, window: &BTreeMap<u64, f64>) -> Option<Straggler> {
        let mut nodes: Vec<Option<f64>> = vec![None; self.hosts.len()];
        for (rank, tf) in window {
            let Some(node) = nodes.get_mut((rank / self.nproc) as usize) else {
                continue;
            };
            *node = Some(node.map_or(*tf, |v: f64| v.min(*tf)));
        }
        let slow = slow_node(&nodes, self.threshold);
        self.watch_recovery(slow.map(|(node, _)| node));
        let Some((node, slowdown)) = slow else {
            self.streak = None;
            self.reported = false;
            return None;
        };
        let ranks: Vec<u64> = window
            .keys()
            .copied()
            .filter(|r| (r / self.nproc) as usize == node)
            .collect();
        match self.streak.as_mut() {
            Some((n, slowdowns, last)) if *n == node => {
                slowdowns.push(slowdown);
                *last = ranks;
            }
            _ => {
                self.streak = Some((node, vec![slowdown], ranks));
                self.reported = false;
            }
        }
        let (node, slowdowns, ranks) = self.streak.as_ref()?;
        if self.reported || (slowdowns.len() as u32) < self.windows {
            return None;
        }
        self.reported = true;
        self.recovering = Some((*node, 0));
        let recent = &slowdowns[slowdowns.len() - self.windows as usize..];
        Some(Straggler {
            host: self.hosts[*node].clone(),
            node_rank: *node as u64,
            slowdown: median(recent),
            windows: slowdowns.len() as u32,
            ranks: ranks.clone(),
        })
    }
}

/// A way to go on with a straggler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Choice {
    /// Keep the plan: the job goes on at the straggler's pace.
    Keep,
    /// Plan again on every node with the straggler at its measured speed (it takes the
    /// ranks where it hurts least: a lighter pipeline stage, another node order).
    Remap,
    /// Leave it out and plan again on the rest.
    LeaveOut,
}

impl Choice {
    /// In words, as the lines and the summary say it.
    pub fn name(self) -> &'static str {
        match self {
            Choice::Keep => "keep",
            Choice::Remap => "re-map",
            Choice::LeaveOut => "leave out",
        }
    }
}

/// A choice with the iteration time predicted for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Costed {
    pub choice: Choice,
    /// Predicted time per iteration, ms; `None` when the choice is not possible.
    pub predicted_ms: Option<f64>,
    /// What it is (the plan), or why it is not possible.
    pub detail: String,
}

impl Costed {
    /// `keep 473.0 ms`, `re-map not possible`.
    pub fn short(&self) -> String {
        let ms = self
            .predicted_ms
            .map_or("not possible".to_string(), |ms| format!("{ms:.1} ms"));
        format!("{} {ms}", self.choice.name())
    }
}

/// What a restart costs, as measured on this job.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RestartCost {
    /// Tearing the nodes down (a past teardown of this job, else the grace period).
    #[serde(rename = "teardown_s", serialize_with = "super::events::seconds")]
    pub teardown: Duration,
    /// From the launch to the first iteration: starting torchrun, loading the checkpoint.
    #[serde(rename = "startup_s", serialize_with = "super::events::seconds")]
    pub startup: Duration,
    /// Iterations done since the last checkpoint: done again after the restart.
    pub lost_iterations: u64,
}

/// What the decision is made from.
#[derive(Debug, Clone, PartialEq)]
pub struct ActFacts<'a> {
    pub mode: StragglerMode,
    /// The time per iteration now (the straggler's pace), ms.
    pub measured_ms: f64,
    pub choices: &'a [Costed],
    pub remaining_iterations: u64,
    pub restart: RestartCost,
    /// The iteration of the last checkpoint this attempt can resume from.
    pub checkpoint: Option<u64>,
    /// Since the last straggler action, and the cooldown.
    pub since_last_action: Option<Duration>,
    pub cooldown: Duration,
    /// Re-plans left under `--max-replans` (an action is one).
    pub replans_left: u32,
}

/// The decision: the action (`Keep`: none) and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub action: Choice,
    /// The best other choice's predicted gain over the remaining iterations, and the
    /// restart's cost, seconds.
    pub gain_s: f64,
    pub cost_s: f64,
    pub why: String,
}

impl RestartCost {
    /// In seconds, at `ms` per iteration for the lost ones.
    pub fn seconds(&self, ms: f64) -> f64 {
        self.teardown.as_secs_f64()
            + self.startup.as_secs_f64()
            + self.lost_iterations as f64 * ms / 1000.0
    }
}

/// Whether to act on a straggler, and how (see the module doc): the choice that saves the
/// most time over the remaining iterations, when that beats the restart's cost, in `act`
/// mode, with a checkpoint to resume from, a re-plan left under `--max-replans`, and not
/// within the cooldown of the last action.
pub fn decide(facts: &ActFacts<'_>) -> Verdict {
    let measured = facts.measured_ms;
    let cost_s = facts.restart.seconds(measured);
    let best = facts
        .choices
        .iter()
        .filter(|c| c.choice != Choice::Keep)
        .filter_map(|c| c.predicted_ms.map(|ms| (c.choice, ms)))
        .map(|(choice, ms)| {
            let gain = (measured - ms) * facts.remaining_iterations as f64 / 1000.0;
            (choice, gain)
        })
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let gain_s = best.map_or(0.0, |(_, g)| g).max(0.0);
    let keep = |why: String| Verdict {
        action: Choice::Keep,
        gain_s,
        cost_s,
        why,
    };
    let Some((choice, gain)) = best else {
        return keep("no other choice is possible".into());
    };
    if gain <= cost_s {
        return keep(format!(
            "the best choice would save {gain_s:.1} s over the remaining {} iterations, less than a restart costs ({cost_s:.1} s)",
            facts.remaining_iterations
        ));
    }
    if facts.mode != StragglerMode::Act {
        return keep("reported only (--stragglers act would act)".into());
    }
    if facts.checkpoint.is_none() {
        return keep("no checkpoint to resume from yet".into());
    }
    if facts.replans_left == 0 {
        return keep("no re-plan left (--max-replans)".into());
    }
    if let Some(since) = facts.since_last_action.filter(|s| *s < facts.cooldown) {
        return keep(format!(
            "within the cooldown: the last action was {} ago (--straggler-cooldown {})",
            crate::exec::format_duration(since),
            crate::exec::format_duration(facts.cooldown)
        ));
    }
    Verdict {
        action: choice,
        gain_s,
        cost_s,
        why: format!(
            "saves {gain:.1} s over the remaining {} iterations, more than a restart costs ({cost_s:.1} s)",
            facts.remaining_iterations
        ),
    }
}

/// Where the job stands when a straggler is found, as its output tells it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Progress {
    /// The last iteration logged.
    pub iteration: Option<u64>,
    /// The iterations the run is to train (`--train-iters`).
    pub total: Option<u64>,
    /// The iteration of the last checkpoint this attempt can resume from.
    pub checkpoint: Option<u64>,
    /// The time per iteration now (the straggler's pace), ms.
    pub recent_ms: Option<f64>,
    /// The best time per iteration of the attempt (its pace before the straggler), ms.
    pub best_ms: Option<f64>,
    /// From the launch to the first iteration: what a relaunch takes to start again.
    pub startup: Duration,
}

/// Everything a straggler's choices are costed and decided from.
#[derive(Debug, Clone, Copy)]
pub struct Found<'a> {
    pub straggler: &'a Straggler,
    /// `None` when planning is off: there is nothing to re-plan, only to keep.
    pub running: Option<RunningPlan<'a>>,
    pub progress: Progress,
    /// What a restart's teardown takes (a past one of this job, else the grace period).
    pub teardown: Duration,
    pub options: &'a StragglerOptions,
    /// Since the last straggler action, if any.
    pub since_last_action: Option<Duration>,
    /// Re-plans left under `--max-replans`.
    pub replans_left: u32,
}

/// The choices a straggler leaves, costed, and what to do.
#[derive(Debug, Clone)]
pub struct Weighed {
    /// Keep, re-map and leave out (keep alone with planning off).
    pub choices: Vec<Costed>,
    pub remaining_iterations: u64,
    pub restart: RestartCost,
    pub verdict: Verdict,
    /// The cluster with the straggler's GPUs slowed, which a re-map plans on; `None` when
    /// no re-map is possible.
    pub remap_profile: Option<ClusterProfile>,
}

/// Costs the choices a straggler leaves and decides among them ([`decide`]): the model
/// plans and times each ([`crate::replan::straggler::choices`]), and its times are scaled to
/// what the job measured. Pure: the model runs here, nothing is read or launched.
pub fn weigh(found: &Found<'_>) -> Weighed {
    let progress = &found.progress;
    let remaining = progress
        .total
        .zip(progress.iteration)
        .map_or(0, |(total, at)| total.saturating_sub(at));
    let restart = RestartCost {
        teardown: found.teardown,
        startup: progress.startup,
        lost_iterations: progress
            .iteration
            .zip(progress.checkpoint)
            .map_or(0, |(at, saved)| at.saturating_sub(saved)),
    };
    let (choices, remap_profile) = match &found.running {
        Some(running) => cost(running, found.straggler, progress),
        None => (
            vec![Costed {
                choice: Choice::Keep,
                predicted_ms: progress.recent_ms,
                detail: "planning is off: nothing to re-plan".into(),
            }],
            None,
        ),
    };
    let verdict = decide(&ActFacts {
        mode: found.options.mode,
        measured_ms: progress.recent_ms.unwrap_or(0.0),
        choices: &choices,
        remaining_iterations: remaining,
        restart,
        checkpoint: progress.checkpoint,
        since_last_action: found.since_last_action,
        cooldown: found.options.cooldown,
        replans_left: found.replans_left,
    });
    Weighed {
        choices,
        remaining_iterations: remaining,
        restart,
        verdict,
        remap_profile,
    }
}

/// Keep, re-map and leave out as the model times them, scaled to the job's measured pace;
/// and the slowed cluster a re-map plans on.
fn cost(
    running: &RunningPlan<'_>,
    straggler: &Straggler,
    progress: &Progress,
) -> (Vec<Costed>, Option<ClusterProfile>) {
    let state = match progress.checkpoint {
        Some(at) => CheckpointState::At(at),
        None => CheckpointState::None,
    };
    let model = choices(running, &straggler.host, straggler.slowdown, state);
    // The model's times scaled to what the job measured: a plan on the slowed cluster by
    // its pace now, a plan without the straggler by its pace before.
    let ratio = |measured: Option<f64>, model: &Result<f64, String>| match (measured, model) {
        (Some(m), Ok(t)) if *t > 0.0 => m / t,
        _ => 1.0,
    };
    let slowed_scale = ratio(progress.recent_ms, &model.keep_ms);
    let healthy_scale = ratio(progress.best_ms, &model.healthy_ms);
    let keep = Costed {
        choice: Choice::Keep,
        predicted_ms: progress.recent_ms.or(model.keep_ms.as_ref().ok().copied()),
        detail: running.plan.config.sizes_text(),
    };
    let costed = |choice, scale: f64, r: &Result<(f64, Replanned), String>| match r {
        Ok((ms, r)) => Costed {
            choice,
            predicted_ms: Some(ms * scale),
            detail: format!(
                "{} on {}",
                r.plan.config.sizes_text(),
                r.profile
                    .nodes
                    .iter()
                    .map(|n| n.host.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        Err(why) => Costed {
            choice,
            predicted_ms: None,
            detail: why.clone(),
        },
    };
    let remap = costed(Choice::Remap, slowed_scale, &model.remap);
    let leave_out = costed(Choice::LeaveOut, healthy_scale, &model.leave_out);
    (
        vec![keep, remap, leave_out],
        model.remap.ok().map(|(_, r)| r.profile),
    )
}

/// The lines people read for a [`super::events::Event::Straggler`] or
/// [`super::events::Event::StragglerRecovered`] (none for another event).
pub fn event_lines(event: &super::events::Event) -> Vec<String> {
    // ` at iteration 230, 1000.0 ms per iteration`
    let when = |iteration: &Option<u64>, measured_ms: &Option<f64>| {
        let at = iteration.map(|i| format!(" at iteration {i}"));
        let ms = measured_ms.map(|ms| format!(", {ms:.1} ms per iteration"));
        format!("{}{}", at.unwrap_or_default(), ms.unwrap_or_default())
    };
    let (s, iteration, measured_ms, choices, verdict) = match event {
        super::events::Event::Straggler {
            straggler,
            iteration,
            measured_ms,
            choices,
            verdict,
            ..
        } => (straggler, iteration, measured_ms, choices, verdict),
        super::events::Event::StragglerRecovered {
            recovery: r,
            iteration,
            measured_ms,
            ..
        } => {
            return vec![format!(
            "straggler recovered: {} (node rank {}) has kept up with the others for {} windows{}",
            r.host,
            r.node_rank,
            r.windows,
            when(iteration, measured_ms)
        )]
        }
        _ => return Vec::new(),
    };
    let mut lines = vec![format!(
        "straggler: {} (node rank {}) runs at {:.0} % of the others' speed ({:.2}× slower) for {} windows{}",
        s.host,
        s.node_rank,
        100.0 / s.slowdown,
        s.slowdown,
        s.windows,
        when(iteration, measured_ms)
    )];
    for c in choices {
        lines.push(format!("  {} ({})", c.short(), c.detail));
    }
    let action = match verdict.action {
        Choice::Keep => "keeping the plan".to_string(),
        Choice::Remap => format!("re-mapping around {}", s.host),
        Choice::LeaveOut => format!("leaving {} out", s.host),
    };
    lines.push(format!("  {action}: {}", verdict.why));
    lines
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Keep, re-map and leave out at these predicted times, without details.
    pub(crate) fn three_choices(
        keep_ms: Option<f64>,
        remap_ms: Option<f64>,
        leave_out_ms: Option<f64>,
    ) -> Vec<Costed> {
        [
            (Choice::Keep, keep_ms),
            (Choice::Remap, remap_ms),
            (Choice::LeaveOut, leave_out_ms),
        ]
        .into_iter()
        .map(|(choice, predicted_ms)| Costed {
            choice,
            predicted_ms,
            detail: String::new(),
        })
        .collect()
    }

    #[test]
    fn megatron_report_lines_are_read() {
        // As megatron/core/README_STRAGGLER.md shows it, after a logger prefix.
        let line = " 0: INFO:megatron.core.utils:[2024-03-14 23:07:56] | MnRtt/Rnk: 3453.08ms/8 | MxRtt/Rnk: 3468.20ms/0 | MnPwr/Rnk: 601796W/8 | MxPwr/Rnk: 683801W/18 | MnTmp/Rnk: 52C/0 | MxTmp/Rnk: 65C/21 | MnUtl/Rnk: 97%/8 | MxUtl/Rnk: 100%/6 | MnClk/Rnk: 1950MHz/28 | MxClk/Rnk: 1980MHz/0 | MnDRtt/Rnk: 14.27ms/23 | MxDRtt/Rnk: 34.65ms/3 | MnEtpt/Rnk: 296.02TF/0 | MxEtpt/Rnk: 297.32TF/8";
        assert_eq!(
            parse_line(line),
            Some(ReportLine::Summary(vec![(0, 296.02), (8, 297.32)]))
        );
        assert_eq!(
            parse_line("^^^^ Bottom 2 Ranks with lowest  Etpt(TF): 296.02/0, 296.50/3,"),
            Some(ReportLine::Ranks(vec![(0, 296.02), (3, 296.5)]))
        );
        assert_eq!(
            parse_line("^^^^ Top    2 Ranks with highest Etpt(TF): 0.000466/1, 0.000802/2,"),
            Some(ReportLine::Ranks(vec![(1, 0.000466), (2, 0.000802)]))
        );
        assert_eq!(parse_line(" iteration 5/20 | lm loss: 1 |"), None);
        assert_eq!(parse_line("MnEtpt/Rnk: nan TF/x"), None);
    }

    fn options(windows: u32) -> StragglerOptions {
        StragglerOptions {
            windows,
            ..StragglerOptions::default()
        }
    }

    /// Feeds windows of throughput by rank (3 nodes × 2 ranks) and returns what was found
    /// after each.
    fn feed(windows: &[[f64; 6]], k: u32) -> Vec<Option<Straggler>> {
        let found = feed_recovering(windows, k);
        found.into_iter().map(|(straggler, _)| straggler).collect()
    }

    /// [`feed`], with the recovery found after each window too.
    fn feed_recovering(windows: &[[f64; 6]], k: u32) -> Vec<(Option<Straggler>, Option<Recovery>)> {
        let hosts = ["a", "b", "c"].map(String::from).to_vec();
        let mut detector = Detector::new(hosts, 2, &options(k));
        let mut found = Vec::new();
        for w in windows {
            let mut order: Vec<(u64, f64)> =
                w.iter().enumerate().map(|(r, v)| (r as u64, *v)).collect();
            order.sort_by(|a, b| a.1.total_cmp(&b.1));
            let summary = vec![order[0], order[5]];
            assert_eq!(detector.line(ReportLine::Ranks(vec![])), None);
            let straggler = detector.line(ReportLine::Summary(summary));
            found.push((straggler, detector.take_recovery()));
            detector.line(ReportLine::Ranks(order[..3].to_vec()));
            detector.line(ReportLine::Ranks(order[3..].to_vec()));
        }
        // The last window is judged when the next begins.
        let straggler = detector.line(ReportLine::Summary(vec![(0, 1.0)]));
        found.push((straggler, detector.take_recovery()));
        found.remove(0);
        found
    }

    /// The windows after which a recovery was found, and each recovery.
    fn recoveries(windows: &[[f64; 6]], k: u32) -> Vec<(usize, Recovery)> {
        let found = feed_recovering(windows, k).into_iter().enumerate();
        found.filter_map(|(i, (_, r))| Some((i, r?))).collect()
    }

    #[test]
    fn a_reported_node_that_keeps_up_for_k_windows_recovers_once() {
        const EVEN: [f64; 6] = [100.0, 98.0, 101.0, 99.0, 100.0, 102.0];
        const SLOW_B: [f64; 6] = [100.0, 98.0, 50.0, 99.0, 100.0, 102.0];
        const SLOW_C: [f64; 6] = [100.0, 98.0, 101.0, 99.0, 100.0, 30.0];
        let b = |windows| Recovery {
            host: "b".into(),
            node_rank: 1,
            windows,
        };
        // Found after window 3, up to speed in windows 4, 5 and 6: recovered after the
        // third, once.
        let windows = [EVEN, SLOW_B, SLOW_B, SLOW_B, EVEN, EVEN, EVEN, EVEN, EVEN];
        assert_eq!(recoveries(&windows, 3), [(6, b(3))]);
        // A slow window restarts the count; one never reported never recovers.
        let windows = [SLOW_B, SLOW_B, SLOW_B, EVEN, EVEN, SLOW_B, EVEN, EVEN];
        assert_eq!(recoveries(&windows, 3), []);
        assert_eq!(recoveries(&[SLOW_B, SLOW_B, EVEN, EVEN, EVEN, EVEN], 3), []);
        // Slow again after it recovered: found again.
        let windows = [
            SLOW_B, SLOW_B, SLOW_B, EVEN, EVEN, EVEN, SLOW_B, SLOW_B, SLOW_B,
        ];
        let found = feed_recovering(&windows, 3);
        let hits: Vec<usize> = (0..found.len()).filter(|i| found[*i].0.is_some()).collect();
        assert_eq!(hits, [2, 8]);
        assert_eq!(found[5].1, Some(b(3)));
        // The slowness moves from b to c: c is found in the very window b recovers in.
        let windows = [SLOW_B, SLOW_B, SLOW_B, SLOW_C, SLOW_C, SLOW_C];
        let found = feed_recovering(&windows, 3);
        assert_eq!(found[5].0.as_ref().map(|s| s.host.as_str()), Some("c"));
        assert_eq!(found[5].1, Some(b(3)));
        // k = 1: one window up to speed is enough.
        assert_eq!(recoveries(&[SLOW_B, EVEN], 1), [(1, b(1))]);
    }

    #[test]
    fn a_node_slow_for_k_windows_is_found_once() {
        let even = [100.0, 98.0, 101.0, 99.0, 100.0, 102.0];
        let slow = [100.0, 98.0, 50.0, 99.0, 100.0, 102.0];
        let found = feed(&[even, slow, slow, slow, slow, even, slow], 3);
        let hits: Vec<usize> = found
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.as_ref().map(|_| i))
            .collect();
        assert_eq!(hits, [3], "{found:?}");
        let s = found[3].clone().unwrap();
        assert_eq!((s.host.as_str(), s.node_rank, s.windows), ("b", 1, 3));
        assert_eq!(s.ranks, [2, 3]);
        assert!((s.slowdown - 100.0 / 50.0).abs() < 0.05, "{}", s.slowdown);
    }

    #[test]
    fn noise_alone_never_makes_a_straggler() {
        // ±25 % jitter on every rank, a single deep dip, a dip that moves from node to
        // node, and two slow windows broken by a normal one: none is k=3 windows of the
        // same node below 0.7 × the others' median.
        let table: [[f64; 6]; 10] = [
            [100.0, 75.0, 125.0, 90.0, 110.0, 80.0],
            [80.0, 120.0, 100.0, 76.0, 124.0, 100.0],
            [100.0, 100.0, 30.0, 100.0, 100.0, 100.0],
            [60.0, 100.0, 100.0, 100.0, 100.0, 100.0],
            [100.0, 100.0, 60.0, 100.0, 100.0, 100.0],
            [100.0, 100.0, 100.0, 100.0, 60.0, 100.0],
            [100.0, 100.0, 60.0, 100.0, 100.0, 100.0],
            [100.0, 100.0, 60.0, 100.0, 100.0, 100.0],
            [100.0, 100.0, 75.0, 100.0, 100.0, 100.0],
            [100.0, 100.0, 60.0, 100.0, 100.0, 100.0],
        ];
        assert!(feed(&table, 3).iter().all(Option::is_none));
        // k = 1 finds the single dip: the windows are what filters noise.
        assert!(feed(&table[2..3], 1)[0].is_some());
    }

    #[test]
    fn the_slowest_node_is_judged_against_the_median_of_the_others() {
        assert_eq!(
            slow_node(&[Some(1.0), Some(0.5), Some(1.0)], 0.7),
            Some((1, 2.0))
        );
        // One fast outlier does not make the rest slow.
        assert_eq!(
            slow_node(&[Some(1.0), Some(1.0), Some(3.0), Some(0.95)], 0.7),
            None
        );
        assert_eq!(slow_node(&[Some(1.0), None, None], 0.7), None);
        assert_eq!(
            slow_node(&[Some(0.6), None, Some(1.0)], 0.7),
            Some((0, 1.0 / 0.6))
        );
    }

    #[test]
    fn a_node_exactly_at_the_threshold_is_not_slow() {
        // Slow means below threshold × the others' median, strictly.
        assert_eq!(slow_node(&[Some(0.7), Some(1.0), Some(1.0)], 0.7), None);
        let (node, slowdown) = slow_node(&[Some(0.69), Some(1.0), Some(1.0)], 0.7).unwrap();
        assert_eq!(node, 0);
        assert!((slowdown - 1.0 / 0.69).abs() < 1e-12);
    }

    /// One row of the decision table: what differs from a straggler that costs 100 ms of
    /// 300 per iteration, 1000 iterations left, leaving it out predicted at 200 ms, a
    /// restart of 30 s, a checkpoint, act mode, no action before.
    struct Case {
        name: &'static str,
        mode: StragglerMode,
        leave_out_ms: Option<f64>,
        remap_ms: Option<f64>,
        remaining: u64,
        lost: u64,
        checkpoint: Option<u64>,
        since_last_action: Option<Duration>,
        replans_left: u32,
        action: Choice,
        why: &'static str,
    }

    const BASE: Case = Case {
        name: "",
        mode: StragglerMode::Act,
        leave_out_ms: Some(200.0),
        remap_ms: None,
        remaining: 1000,
        lost: 0,
        checkpoint: Some(40),
        since_last_action: None,
        replans_left: 3,
        action: Choice::LeaveOut,
        why: "saves 100.0 s",
    };

    #[test]
    fn decisions_follow_the_table() {
        let cases = [
            Case {
                name: "gain beats the restart",
                ..BASE
            },
            Case {
                name: "re-mapping saves more than leaving out",
                remap_ms: Some(150.0),
                action: Choice::Remap,
                why: "saves 150.0 s",
                ..BASE
            },
            Case {
                name: "gain below the restart cost",
                remaining: 250,
                action: Choice::Keep,
                why: "save 25.0 s over the remaining 250 iterations, less than a restart costs (30.0 s)",
                ..BASE
            },
            Case {
                name: "iterations lost since the checkpoint count in the cost",
                lost: 800,
                action: Choice::Keep,
                why: "less than a restart costs (270.0 s)",
                ..BASE
            },
            Case {
                name: "no checkpoint",
                checkpoint: None,
                action: Choice::Keep,
                why: "no checkpoint to resume from",
                ..BASE
            },
            Case {
                name: "cooldown active",
                since_last_action: Some(Duration::from_secs(60)),
                action: Choice::Keep,
                why: "within the cooldown: the last action was 1 min ago",
                ..BASE
            },
            Case {
                name: "no re-plan left",
                replans_left: 0,
                action: Choice::Keep,
                why: "no re-plan left",
                ..BASE
            },
            Case {
                name: "cooldown over",
                since_last_action: Some(Duration::from_secs(3600)),
                ..BASE
            },
            Case {
                name: "report mode only reports",
                mode: StragglerMode::Report,
                action: Choice::Keep,
                why: "reported only",
                ..BASE
            },
            Case {
                name: "nothing else possible",
                leave_out_ms: None,
                action: Choice::Keep,
                why: "no other choice is possible",
                ..BASE
            },
            Case {
                name: "a choice slower than keeping is never taken",
                leave_out_ms: Some(350.0),
                action: Choice::Keep,
                why: "save 0.0 s",
                ..BASE
            },
        ];
        for case in cases {
            let choices = three_choices(Some(300.0), case.remap_ms, case.leave_out_ms);
            let verdict = decide(&ActFacts {
                mode: case.mode,
                measured_ms: 300.0,
                choices: &choices,
                remaining_iterations: case.remaining,
                restart: RestartCost {
                    teardown: Duration::from_secs(10),
                    startup: Duration::from_secs(20),
                    lost_iterations: case.lost,
                },
                checkpoint: case.checkpoint,
                since_last_action: case.since_last_action,
                cooldown: Duration::from_secs(1800),
                replans_left: case.replans_left,
            });
            assert_eq!(verdict.action, case.action, "{}: {verdict:?}", case.name);
            assert!(
                verdict.why.contains(case.why),
                "{}: {}",
                case.name,
                verdict.why
            );
        }
    }

    mod weighing {
        //! [`weigh`] over a table of jobs, with the real planner and time model: which choice
        //! wins for which straggler.

        use super::*;
        use crate::cluster::profile::tests::a100;
        use crate::cluster::profile::{GpuInventory, LinkMatrix, NodeProfile, Provenance, Source};
        use crate::config::megatron::settings_from_megatron_args;
        use crate::config::Settings;
        use crate::plan::{Plan, PlanOptions};
        use crate::replan::failure::checkpoint_format;

        /// A job planned on `nodes` nodes of `gpus` A100s each (tp and pp pinned).
        struct Job {
            settings: Settings,
            options: PlanOptions,
            profile: ClusterProfile,
            plan: Plan,
            hosts: Vec<String>,
        }

        fn job(nodes: usize, gpus: u32, tp: u64, pp: u64, vocab: u64) -> Job {
            let estimated = || Provenance::new(Source::Estimated);
            let profile = ClusterProfile {
                note: None,
                nodes: (0..nodes)
                    .map(|n| NodeProfile {
                        host: format!("n{n}"),
                        gpus: GpuInventory::Known {
                            gpus: (0..gpus).map(a100).collect(),
                            links: LinkMatrix::uniform(gpus as usize, 240.0, estimated()),
                        },
                    })
                    .collect(),
                node_links: LinkMatrix::uniform(nodes, 25.0, estimated()),
                measured_perf: Vec::new(),
            };
            let args = format!(
                "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 \
                 --max-position-embeddings 1024 --vocab-size {vocab} --global-batch-size 48 --bf16"
            );
            let args: Vec<String> = args.split_whitespace().map(String::from).collect();
            let mut settings = settings_from_megatron_args(&args, None, &[]).unwrap();
            settings.constraints.tensor_parallel = Some(tp);
            settings.constraints.pipeline_parallel = Some(pp);
            let options = PlanOptions::default();
            let plan = crate::plan::plan(&settings, &profile, &options).unwrap();
            let hosts = profile.nodes.iter().map(|n| n.host.clone()).collect();
            Job {
                settings,
                options,
                profile,
                plan,
                hosts,
            }
        }

        /// Two stages on two nodes of four GPUs (tp=2 pp=2 dp=2): with a 128k vocabulary
        /// the last stage, on n1, carries the output layer and is the heavier one.
        fn pipeline() -> Job {
            let job = job(2, 4, 2, 2, 131_072);
            assert_eq!(job.plan.config.layers_per_stage, [2, 2]);
            assert_eq!(job.plan.mapping.node_order, ["n0", "n1"]);
            job
        }

        /// Data parallel over four nodes of two GPUs (tp=2 pp=1 dp=4).
        fn data_parallel() -> Job {
            let job = job(4, 2, 2, 1, 32_000);
            assert_eq!(job.plan.config.dp, 4);
            job
        }

        /// One row: `host` found `slowdown` times slower while the job measured `recent_ms`
        /// per iteration (1000 before), at iteration 150 of `total`, saved at iteration
        /// 100; a restart tears down in 10 s and starts up in 50 s.
        struct Case {
            name: &'static str,
            job: fn() -> Job,
            host: &'static str,
            slowdown: f64,
            recent_ms: f64,
            total: u64,
            checkpoint: Option<u64>,
            mode: StragglerMode,
            since_last_action: Option<Duration>,
            action: Choice,
            why: &'static str,
        }

        const SEVERE: Case = Case {
            name: "",
            job: data_parallel,
            host: "n1",
            slowdown: 3.0,
            recent_ms: 3000.0,
            total: 1150,
            checkpoint: Some(100),
            mode: StragglerMode::Act,
            since_last_action: None,
            action: Choice::LeaveOut,
            why: "more than a restart costs",
        };

        /// The heavier stage's node at half speed.
        const HEAVY_STAGE: Case = Case {
            job: pipeline,
            slowdown: 2.0,
            recent_ms: 1600.0,
            action: Choice::Remap,
            ..SEVERE
        };

        const COOLDOWN: Duration = Duration::from_secs(30 * 60);

        fn weighed(case: &Case) -> Weighed {
            let job = (case.job)();
            let format = checkpoint_format(&[]);
            let straggler = Straggler {
                host: case.host.into(),
                node_rank: case.host[1..].parse().unwrap(),
                slowdown: case.slowdown,
                windows: 3,
                ranks: Vec::new(),
            };
            weigh(&Found {
                straggler: &straggler,
                running: Some(RunningPlan {
                    settings: &job.settings,
                    options: &job.options,
                    plan: &job.plan,
                    profile: &job.profile,
                    hosts: &job.hosts,
                    format: &format,
                }),
                progress: Progress {
                    iteration: Some(150),
                    total: Some(case.total),
                    checkpoint: case.checkpoint,
                    recent_ms: Some(case.recent_ms),
                    best_ms: Some(1000.0),
                    startup: Duration::from_secs(50),
                },
                teardown: Duration::from_secs(10),
                options: &StragglerOptions {
                    mode: case.mode,
                    cooldown: COOLDOWN,
                    ..StragglerOptions::default()
                },
                since_last_action: case.since_last_action,
                replans_left: 3,
            })
        }

        fn predicted(weighed: &Weighed, choice: Choice) -> Option<f64> {
            let costed = weighed.choices.iter().find(|c| c.choice == choice);
            costed.and_then(|c| c.predicted_ms)
        }

        #[test]
        fn the_choice_that_wins_follows_the_table() {
            let cases = [
                Case {
                    name: "keep: the slowdown is small",
                    slowdown: 1.1,
                    recent_ms: 1100.0,
                    action: Choice::Keep,
                    why: "less than a restart costs",
                    ..SEVERE
                },
                Case {
                    name: "keep: few iterations remain",
                    total: 160,
                    action: Choice::Keep,
                    why: "over the remaining 10 iterations, less than a restart costs",
                    ..SEVERE
                },
                Case {
                    name: "leave out: severe, and the other nodes can run the job",
                    ..SEVERE
                },
                Case {
                    name: "re-map: the slow node can take the lighter stage",
                    ..HEAVY_STAGE
                },
                Case {
                    name: "keep: the slow node already has the lighter stage",
                    host: "n0",
                    recent_ms: 1000.0,
                    action: Choice::Keep,
                    why: "save 0.0 s",
                    ..HEAVY_STAGE
                },
                Case {
                    name: "keep: within the cooldown",
                    since_last_action: Some(COOLDOWN - Duration::from_secs(1)),
                    action: Choice::Keep,
                    why: "within the cooldown",
                    ..HEAVY_STAGE
                },
                Case {
                    name: "re-map: the cooldown just over",
                    since_last_action: Some(COOLDOWN),
                    ..HEAVY_STAGE
                },
                Case {
                    name: "keep: no checkpoint to resume from",
                    checkpoint: None,
                    action: Choice::Keep,
                    why: "no checkpoint",
                    ..HEAVY_STAGE
                },
                Case {
                    name: "keep: report mode",
                    mode: StragglerMode::Report,
                    action: Choice::Keep,
                    why: "reported only",
                    ..HEAVY_STAGE
                },
            ];
            for case in cases {
                let weighed = weighed(&case);
                let verdict = &weighed.verdict;
                assert_eq!(verdict.action, case.action, "{}: {weighed:?}", case.name);
                assert!(
                    verdict.why.contains(case.why),
                    "{}: {}",
                    case.name,
                    verdict.why
                );
                let choices: Vec<Choice> = weighed.choices.iter().map(|c| c.choice).collect();
                assert_eq!(choices, [Choice::Keep, Choice::Remap, Choice::LeaveOut]);
                // Keeping costs what the job measures now.
                assert_eq!(predicted(&weighed, Choice::Keep), Some(case.recent_ms));
            }
        }

        #[test]
        fn the_model_is_scaled_to_the_measured_pace() {
            // The slow node moved to the lighter stage: back to about the pace before.
            let heavy = weighed(&HEAVY_STAGE);
            let remap = predicted(&heavy, Choice::Remap).unwrap();
            assert!((900.0..1100.0).contains(&remap), "{heavy:?}");
            // Leaving it out halves the data-parallel ranks: slower than keeping.
            let leave_out = predicted(&heavy, Choice::LeaveOut).unwrap();
            assert!(leave_out > HEAVY_STAGE.recent_ms, "{heavy:?}");
            assert!(heavy.choices[2]
                .detail
                .ends_with("dp=1 micro-batch 6 on n0"));
            // A re-map cannot help a data-parallel job: every replica waits for the slow one.
            let severe = weighed(&SEVERE);
            assert_eq!(predicted(&severe, Choice::Remap), Some(SEVERE.recent_ms));
            let leave_out = predicted(&severe, Choice::LeaveOut).unwrap();
            assert!((1000.0..1500.0).contains(&leave_out), "{severe:?}");
            assert!(severe.choices[2]
                .detail
                .ends_with("dp=3 micro-batch 16 on n0, n2, n3"));
        }

        #[test]
        fn the_restart_counts_the_iterations_since_the_checkpoint() {
            let saved = weighed(&HEAVY_STAGE);
            assert_eq!(saved.remaining_iterations, 1000);
            assert_eq!(saved.restart.lost_iterations, 50);
            // 10 s teardown + 50 s start-up + 50 iterations at 1.6 s.
            assert!((saved.verdict.cost_s - 140.0).abs() < 1e-9, "{saved:?}");
            let unsaved = weighed(&Case {
                checkpoint: None,
                ..HEAVY_STAGE
            });
            assert_eq!(unsaved.restart.lost_iterations, 0);
        }

        #[test]
        fn a_remap_plans_on_the_cluster_with_the_straggler_slowed() {
            let peaks = |profile: &ClusterProfile, node: usize| -> Vec<f64> {
                let gpus = profile.nodes[node].gpus().unwrap();
                gpus.iter().map(|g| g.peak_tflops.fp16).collect()
            };
            let slowed = weighed(&HEAVY_STAGE).remap_profile.unwrap();
            assert_eq!(peaks(&slowed, 0), [312.0; 4]);
            assert_eq!(peaks(&slowed, 1), [156.0; 4]);
        }

        #[test]
        fn with_planning_off_only_keeping_is_costed() {
            let straggler = Straggler {
                host: "n1".into(),
                node_rank: 1,
                slowdown: 2.0,
                windows: 3,
                ranks: Vec::new(),
            };
            let weighed = weigh(&Found {
                straggler: &straggler,
                running: None,
                progress: Progress {
                    iteration: Some(150),
                    total: Some(1150),
                    checkpoint: Some(100),
                    recent_ms: Some(1600.0),
                    best_ms: Some(1000.0),
                    startup: Duration::from_secs(50),
                },
                teardown: Duration::from_secs(10),
                options: &StragglerOptions {
                    mode: StragglerMode::Act,
                    ..StragglerOptions::default()
                },
                since_last_action: None,
                replans_left: 3,
            });
            let keep = Costed {
                choice: Choice::Keep,
                predicted_ms: Some(1600.0),
                detail: "planning is off: nothing to re-plan".into(),
            };
            assert_eq!(weighed.choices, [keep]);
            assert_eq!(weighed.verdict.action, Choice::Keep);
            assert_eq!(weighed.verdict.why, "no other choice is possible");
            assert!(weighed.remap_profile.is_none());
        }
    }
}
