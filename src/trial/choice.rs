//! The measured choice: after the trial rounds (the memory check, the fit and the re-plan),
//! trial the best few of the plan's ranked configurations and launch the one measured
//! fastest (`--trial-top-k`).
//!
//! - [`select`] (pure): which of [`Plan::top`] to trial — the plan's own pick first, then
//!   the fastest others; by default the configurations the model cannot separate from the
//!   fastest within its stated error (the plan's [`Ties`]), at most [`MAX_TIES`];
//!   `--trial-top-k K` asks for K (1: the pick alone, no choice).
//! - [`candidate_plan`] (pure): one of them as a [`Plan`] to trial or launch, on the
//!   mapping the planner found for it.
//! - [`trial_candidates`]: one short trial of each, all with the one [`TrialStaging`]; a
//!   trial already measured in the rounds (same configuration, same mapping) is not run
//!   again; a candidate whose trial fails (out of memory, a failing script, the time limit)
//!   is left out and said so.
//! - [`choose`] (pure): the measured fastest, and why; without any measured time, the
//!   plan's pick (the simplest of the ties).
//! - [`measured_choice`]: all of it after the trial rounds, the calibration fitted again to
//!   every measured trial, the candidates' included.
//!
//! Owns which candidates, their trials and the choice. Must not plan: the ranked list is
//! the plan's, as the planner made it.

use serde::{Deserialize, Serialize};

use super::{
    calibrate, run_trial, TrialError, TrialMeasurement, TrialReport, TrialRequest, TrialStaging,
};
use crate::cluster::ClusterProfile;
use crate::config::Settings;
use crate::launch::LaunchError;
use crate::measure::Progress;
use crate::model::memory::estimate_memory;
use crate::model::time::{self, TimeError, TimeOptions, TimeRequest};
use crate::model::{Calibration, ParallelConfig, Placement};
use crate::plan::search::rank_mapping;
use crate::plan::{MappingState, Plan, PlanEstimate, Ties};

/// By default the measured choice trials at most this many ties.
pub const MAX_TIES: usize = 3;

/// How many candidates the measured choice trials (`--trial-top-k`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TopK {
    /// The plan's ties (within the model's stated error of the fastest), at most
    /// [`MAX_TIES`].
    #[default]
    Ties,
    /// The plan's pick and the fastest others, this many in all; 1 is the pick alone.
    Count(usize),
}

impl TopK {
    /// What was asked, for the report.
    pub fn asked(self, window: f64) -> String {
        match self {
            TopK::Ties => format!(
                "the ties: within the model's stated error (± {:.1} %) of the fastest, at most {MAX_TIES}",
                100.0 * window
            ),
            TopK::Count(k) => format!("--trial-top-k {k}"),
        }
    }
}

/// The candidates to trial, as positions in the plan's ranked list of `ranked`
/// configurations ([`Plan::top`], with its `ties`): the plan's pick first (so one candidate
/// is the plan as it was), then the others fastest first. Fewer than asked when the plan
/// ranked fewer.
pub fn select(ranked: usize, ties: Ties, top_k: TopK) -> Vec<usize> {
    if ranked == 0 {
        return Vec::new();
    }
    let (pool, k) = match top_k {
        TopK::Ties => (ties.count, MAX_TIES),
        TopK::Count(k) => (ranked, k.max(1)),
    };
    let pool = pool.min(ranked);
    let pick = if ties.chosen < ranked { ties.chosen } else { 0 };
    let mut positions = vec![pick];
    positions.extend((0..pool).filter(|&i| i != pick).take(k - 1));
    positions
}

/// `plan.top[position]` as a plan on the mapping the planner found for it, estimated with
/// `calibration`; the plan itself when `position` is its pick. Its [`Ties::chosen`] names
/// it (the one the plan runs); the ranked list and the search stay the plan's. On a
/// cluster that mixes kinds of GPU the per-stage view is left out (it is the planner's to
/// make), except for the plan's own pick.
pub fn candidate_plan(
    plan: &Plan,
    position: usize,
    settings: &Settings,
    cluster: &ClusterProfile,
    calibration: &Calibration,
    options: TimeOptions,
) -> Result<Plan, TimeError> {
    let Some(ranked) = plan.top.get(position) else {
        return Ok(plan.clone());
    };
    if position == plan.ties.chosen {
        return Ok(plan.clone());
    }
    let state = mapping_state(&ranked.placement, plan.mapping.state.gpus_per_node());
    let request = TimeRequest {
        model: &settings.model,
        training: &settings.training,
        config: &ranked.config,
        cluster,
        placement: &ranked.placement,
        calibration,
        options,
    };
    let time = time::estimate(&request, plan.search.time_model)?;
    let memory = estimate_memory(
        &settings.model,
        &settings.training,
        &ranked.config,
        calibration,
    );
    Ok(Plan {
        config: ranked.config.clone(),
        spares: plan.spares.clone(),
        mapping: rank_mapping(cluster, &state, ranked.method, ranked.evaluations),
        estimate: PlanEstimate {
            iteration_ms: time.iteration_ms,
            peak_memory_bytes: memory.peak_bytes,
            gpu_memory_bytes: plan.estimate.gpu_memory_bytes,
            usable_memory_bytes: plan.estimate.usable_memory_bytes,
            time,
            memory,
            // Not costed again for a runner-up the trial picked: the plan report then
            // leaves the 16-bit comparison out.
            in_16_bit: None,
        },
        baseline_mapping_ms: ranked.iteration_ms,
        placement: ranked.placement.clone(),
        experts: crate::plan::experts::ExpertPlan::new(
            &settings.model,
            &ranked.config,
            &ranked.placement,
        ),
        top: plan.top.clone(),
        ties: Ties {
            chosen: position,
            ..plan.ties
        },
        search: plan.search.clone(),
        stats: plan.stats,
        heterogeneous: None,
        // Held against the plan's own pick, not this one: left out, as the 16-bit figure.
        expert_layouts: None,
    })
}

/// The mapping a placement realises: node rank `n` holds ranks `n·g .. (n+1)·g` (torchrun's
/// static rendezvous), so its node and its GPUs' order are those ranks' devices.
fn mapping_state(placement: &Placement, gpus_per_node: usize) -> MappingState {
    let g = gpus_per_node.max(1);
    let (node_order, gpu_order) = placement
        .devices
        .chunks(g)
        .map(|ranks| (ranks[0].node, ranks.iter().map(|d| d.gpu).collect()))
        .unzip();
    MappingState {
        node_order,
        gpu_order,
    }
}

/// One candidate of the measured choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// Its place in the plan's ranking by predicted time (1: the fastest).
    pub rank: usize,
    pub config: ParallelConfig,
    /// The time model's estimate that ranked it, on its mapping, ms.
    pub predicted_ms: f64,
    /// Within the model's stated error of the fastest: the model cannot tell it apart.
    pub tie: bool,
    /// The plan's own pick (the simplest of the ties).
    pub planned: bool,
    /// The median iteration its trial measured, ms.
    pub measured_ms: Option<f64>,
    /// Its trial, a position in the report's `trials`, when one measured it.
    pub trial: Option<usize>,
    /// Why it has no measured time, when it has none.
    pub failure: Option<String>,
}

/// The measured choice among the best plans: what was trialled and which was launched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredChoice {
    /// What was asked: `--trial-top-k K`, or the default (the ties).
    pub asked: String,
    /// In the order they were trialled: the plan's pick first.
    pub candidates: Vec<Candidate>,
    /// The one launched, a position in `candidates`.
    pub launched: usize,
    /// Why that one.
    pub why: String,
    pub notes: Vec<String>,
}

/// The one to launch, a position in `candidates`, and why: the fastest measured (the
/// earlier on equal times: the plan's pick first); without any measured time, the plan's
/// pick.
pub fn choose(candidates: &[Candidate]) -> (usize, String) {
    let pick = candidates.iter().position(|c| c.planned).unwrap_or(0);
    let measured: Vec<(usize, f64)> = candidates
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.measured_ms.map(|ms| (i, ms)))
        .collect();
    let Some(&(best, best_ms)) = measured.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
        return (
            pick,
            "no candidate's iteration time was measured: the plan's pick runs (the simplest of the ties)"
                .to_string(),
        );
    };
    if measured.len() == 1 {
        return (
            best,
            format!("the only candidate with a measured time ({best_ms:.1} ms)"),
        );
    }
    let next = measured
        .iter()
        .filter(|(i, _)| *i != best)
        .map(|&(_, ms)| ms)
        .min_by(f64::total_cmp)
        .unwrap_or(best_ms);
    let mut why = format!(
        "measured fastest of {}: {best_ms:.1} ms, {:.1} % faster than the next ({next:.1} ms)",
        measured.len(),
        (next - best_ms) / next * 100.0
    );
    if best != pick {
        if let Some(ms) = candidates[pick].measured_ms {
            why.push_str(&format!(
                "; the model's pick (#{}) measured {ms:.1} ms",
                candidates[pick].rank
            ));
        }
    } else {
        why.push_str("; it is also the model's pick");
    }
    (best, why)
}

/// Why the measured choice stopped.
#[derive(Debug, thiserror::Error)]
pub enum ChoiceError {
    #[error(transparent)]
    Trial(#[from] TrialError),
    #[error(transparent)]
    Time(#[from] TimeError),
}

/// The measured choice after the trial rounds (see the module doc): trials the candidates
/// [`select`] names among `plan`'s ranked configurations, fits the calibration from
/// `before` to every measured trial (the rounds' in `trials`, and the candidates', which
/// are added to it: the time calibration's data points are all of them), and returns the
/// plan to launch — the measured fastest, estimated with the fitted calibration — and the
/// report with the choice in it. `None` when there is no choice to make: the plan's pick
/// alone (`--trial-top-k 1`, or no ties by default).
pub fn measured_choice(
    run: &CandidateTrials<'_>,
    plan: &Plan,
    top_k: TopK,
    trials: &mut Vec<(TrialMeasurement, Placement)>,
    before: &Calibration,
    progress: &dyn Progress,
    say: &mut dyn FnMut(String),
) -> Result<Option<(Plan, TrialReport)>, ChoiceError> {
    let positions = select(plan.top.len(), plan.ties, top_k);
    let asked_more = matches!(top_k, TopK::Count(k) if k > 1);
    if positions.is_empty() || (positions.len() < 2 && !asked_more) {
        return Ok(None);
    }
    let asked = top_k.asked(plan.ties.window);
    if plan.ties.count > 1 {
        say(format!(
            "the time model cannot tell #1-#{} apart (within its stated error, ± {:.1} %)",
            plan.ties.count,
            100.0 * plan.ties.window
        ));
    }
    say(format!(
        "measured choice: trialling {} of the plan's best ({asked})",
        positions.len()
    ));
    let candidates = trial_candidates(run, plan, &positions, trials, progress, say)?;
    let mut notes = Vec::new();
    if let TopK::Count(k) = top_k {
        if plan.top.len() < k {
            notes.push(format!(
                "--trial-top-k {k}: the plan ranked {} configuration(s) (those that fit, at most --top-k {})",
                plan.top.len(),
                plan.search.top_k
            ));
        }
    }
    let mut report = calibrate(run.settings, run.cluster, trials, before, run.time_options)?;
    let (launched, why) = choose(&candidates);
    let position = candidates
        .get(launched)
        .map_or(plan.ties.chosen, |c| c.rank - 1);
    let choice = MeasuredChoice {
        asked,
        candidates,
        launched,
        why,
        notes,
    };
    for line in format!("{}{}", choice.to_human(), report.calibration_line()).lines() {
        say(line.to_string());
    }
    let launched = candidate_plan(
        plan,
        position,
        run.settings,
        run.cluster,
        &report.calibration,
        run.time_options,
    )?;
    report.choice = Some(choice);
    Ok(Some((launched, report)))
}

/// How the candidates' trials run.
pub struct CandidateTrials<'a> {
    /// Each candidate's trial is this one on the candidate's plan, stopped once its median
    /// is stable; `iters` is the most it runs, `timeout` is for each.
    pub trial: TrialRequest<'a>,
    pub staging: &'a TrialStaging<'a>,
    pub settings: &'a Settings,
    pub cluster: &'a ClusterProfile,
    /// What their plans are estimated with (the plan's own).
    pub calibration: &'a Calibration,
    pub time_options: TimeOptions,
}

/// Trials the candidates at `positions` of `plan.top` (see the module doc), adding every
/// new measurement to `trials`; `say` hears each candidate's progress, a line at a time.
/// Only what stops every trial is an error (a stop signal, a node out of reach, the logs);
/// a candidate whose own trial fails is left out, with why.
pub fn trial_candidates(
    run: &CandidateTrials<'_>,
    plan: &Plan,
    positions: &[usize],
    trials: &mut Vec<(TrialMeasurement, Placement)>,
    progress: &dyn Progress,
    say: &mut dyn FnMut(String),
) -> Result<Vec<Candidate>, TrialError> {
    let n = positions.len();
    let mut candidates = Vec::with_capacity(n);
    for (i, &position) in positions.iter().enumerate() {
        let Some(ranked) = plan.top.get(position) else {
            continue;
        };
        let mut candidate = Candidate {
            rank: position + 1,
            config: ranked.config.clone(),
            predicted_ms: ranked.mapped_ms,
            tie: position < plan.ties.count,
            planned: position == plan.ties.chosen,
            measured_ms: None,
            trial: None,
            failure: None,
        };
        let head = format!(
            "candidate {}/{n}: #{} {}, predicted {:.1} ms{}",
            i + 1,
            candidate.rank,
            short(&candidate.config),
            candidate.predicted_ms,
            if candidate.tie { " (a tie)" } else { "" }
        );
        // Measured in the rounds already (with or without an iteration time: a script
        // that prints none would print none again).
        let earlier = trials
            .iter()
            .rposition(|(m, p)| m.config == ranked.config && *p == ranked.placement);
        if let Some(t) = earlier {
            candidate.trial = Some(t);
            candidate.measured_ms = trials[t].0.iteration_ms;
            say(format!(
                "{head}: measured {} in the trial rounds (not run again)",
                ms_text(candidate.measured_ms)
            ));
        } else {
            say(format!(
                "{head}: trial of at most {} iterations (stops once the median is stable)",
                run.trial.iters
            ));
            let tried = candidate_plan(
                plan,
                position,
                run.settings,
                run.cluster,
                run.calibration,
                run.time_options,
            )
            .map_err(|e| TrialError::Launch(LaunchError::Plan(e.into())))?;
            let request = TrialRequest {
                plan: &tried,
                stop_when_stable: true,
                ..run.trial.clone()
            };
            match run_trial(&request, run.staging, progress) {
                Ok(m) => {
                    candidate.measured_ms = m.iteration_ms;
                    candidate.trial = Some(trials.len());
                    say(format!(
                        "candidate {}/{n}: measured {} in {:.1} s ({} iterations{})",
                        i + 1,
                        ms_text(m.iteration_ms),
                        m.wall_s,
                        m.iterations.len(),
                        if m.stopped_early {
                            ", stopped once stable"
                        } else {
                            ""
                        }
                    ));
                    trials.push((m, tried.placement.clone()));
                }
                Err(e) if stops_every_trial(&e) => return Err(e),
                Err(e) => {
                    let why = if e.is_out_of_memory() {
                        "ran out of memory in its trial".to_string()
                    } else {
                        e.to_string().lines().next().unwrap_or_default().to_string()
                    };
                    say(format!("candidate {}/{n}: left out: {why}", i + 1));
                    candidate.failure = Some(why);
                }
            }
        }
        let timed = candidate.measured_ms.is_some();
        let ran = candidate.failure.is_none();
        candidates.push(candidate);
        if ran && !timed {
            // Without Megatron's iteration lines no candidate can be told from another.
            say("the script printed no iteration times (Megatron's iteration lines): the other candidates are not trialled".to_string());
            break;
        }
    }
    Ok(candidates)
}

/// The errors that would stop any other candidate's trial too.
fn stops_every_trial(e: &TrialError) -> bool {
    matches!(
        e,
        TrialError::Exec(_) | TrialError::Stage { .. } | TrialError::Logs { .. }
    )
}

fn ms_text(ms: Option<f64>) -> String {
    ms.map_or("no iteration time".to_string(), |ms| format!("{ms:.1} ms"))
}

/// `tp 2 pp 1 dp 4 micro-batch 2, selective recompute, distributed optimizer`: as the
/// trial's lines say a configuration, with what tells the candidates apart.
pub fn short(c: &ParallelConfig) -> String {
    format!(
        "tp {} pp {} dp {} micro-batch {}{}",
        c.tp,
        c.pp,
        c.dp,
        c.micro_batch,
        c.options_text()
    )
}

impl MeasuredChoice {
    /// A few lines for people: each candidate's predicted and measured time, the one
    /// launched and why.
    pub fn to_human(&self) -> String {
        let mut out = format!(
            "measured choice among {} candidates ({}):\n",
            self.candidates.len(),
            self.asked
        );
        for (i, c) in self.candidates.iter().enumerate() {
            let measured = match (c.measured_ms, &c.failure) {
                (Some(ms), _) => format!(
                    "measured {ms:.1} ms (took {})",
                    super::times_the_estimate(ms, c.predicted_ms)
                ),
                (None, Some(why)) => format!("not measured: {why}"),
                (None, None) => "no iteration time".to_string(),
            };
            let mut tags = Vec::new();
            if c.planned {
                tags.push("the model's pick");
            }
            if c.tie {
                tags.push("a tie");
            }
            if i == self.launched {
                tags.push("LAUNCHED");
            }
            let tags = if tags.is_empty() {
                String::new()
            } else {
                format!(" [{}]", tags.join(", "))
            };
            out.push_str(&format!(
                "  #{} {}: predicted {:.1} ms, {measured}{tags}\n",
                c.rank,
                short(&c.config),
                c.predicted_ms
            ));
        }
        out.push_str(&format!("  launched: {}\n", self.why));
        for note in &self.notes {
            out.push_str(&format!("  note: {note}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::parallel::Device;

    fn ties(count: usize, chosen: usize) -> Ties {
        Ties {
            window: 0.043,
            count,
            chosen,
        }
    }

    #[test]
    fn k_given_takes_the_pick_then_the_fastest_others() {
        assert_eq!(select(5, ties(2, 1), TopK::Count(3)), [1, 0, 2]);
        assert_eq!(select(5, ties(2, 1), TopK::Count(1)), [1], "the pick alone");
        assert_eq!(
            select(5, ties(2, 1), TopK::Count(0)),
            [1],
            "at least the pick"
        );
    }

    #[test]
    fn the_default_takes_the_ties_at_most_three() {
        assert_eq!(select(6, ties(5, 2), TopK::Ties), [2, 0, 1]);
        assert_eq!(select(3, ties(2, 0), TopK::Ties), [0, 1], "only the ties");
        assert_eq!(
            select(3, ties(1, 0), TopK::Ties),
            [0],
            "no tie: the pick alone"
        );
    }

    #[test]
    fn fewer_candidates_than_k() {
        assert_eq!(select(2, ties(1, 0), TopK::Count(5)), [0, 1]);
        assert_eq!(select(1, ties(1, 0), TopK::Count(3)), [0]);
        assert_eq!(select(0, ties(1, 0), TopK::Count(3)), Vec::<usize>::new());
    }

    fn candidate(rank: usize, measured: Option<f64>, planned: bool) -> Candidate {
        Candidate {
            rank,
            config: ParallelConfig::even(2, 1, 1, 2, 1),
            predicted_ms: 100.0,
            tie: true,
            planned,
            measured_ms: measured,
            trial: measured.map(|_| rank),
            failure: None,
        }
    }

    #[test]
    fn the_measured_fastest_is_launched() {
        let c = [
            candidate(2, Some(120.0), true),
            candidate(1, Some(90.0), false),
            candidate(3, None, false),
        ];
        let (i, why) = choose(&c);
        assert_eq!(i, 1);
        assert!(why.contains("measured fastest of 2"), "{why}");
        assert!(why.contains("model's pick (#2) measured 120.0 ms"), "{why}");
        // Equal times: the earlier (the pick).
        let c = [
            candidate(1, Some(90.0), true),
            candidate(2, Some(90.0), false),
        ];
        assert_eq!(choose(&c).0, 0);
        // Nothing measured: the pick.
        let c = [candidate(1, None, false), candidate(2, None, true)];
        let (i, why) = choose(&c);
        assert_eq!(i, 1);
        assert!(why.starts_with("no candidate"), "{why}");
    }

    #[test]
    fn a_candidate_runs_on_the_mapping_the_planner_found_for_it() {
        let gpu = |i: u32| {
            serde_json::json!({"index": i, "name": "cpu", "memory_bytes": 8u64 << 30,
                "peak_tflops": {"bf16": 0.5, "fp16": 0.5}, "provenance": {"source": "measured"}})
        };
        let links = |v: Vec<Vec<f64>>| serde_json::json!({"provenance": {"source": "measured"}, "gb_per_s": v});
        let node = |host: &str| {
            serde_json::json!({"host": host, "gpus": [gpu(0), gpu(1)],
                "gpu_links": links(vec![vec![0.0, 5.0], vec![5.0, 0.0]])})
        };
        let profile = serde_json::json!({"schema": "pipette-cluster/1",
            "nodes": [node("a"), node("b")],
            "node_links": links(vec![vec![0.0, 2.0], vec![1.0, 0.0]])});
        let cluster = ClusterProfile::from_json_str(&profile.to_string(), "test").unwrap();
        let args: Vec<String> = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 \
            --seq-length 32 --vocab-size 256 --global-batch-size 8"
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let settings = crate::config::settings_from_megatron_args(&args, None, &[]).unwrap();
        let options = crate::plan::PlanOptions::default();
        let plan = crate::plan::plan(&settings, &cluster, &options).unwrap();
        assert!(plan.top.len() > 1, "{:?}", plan.top);
        let time = options.time_options;
        let same = |p: usize| {
            candidate_plan(&plan, p, &settings, &cluster, &options.calibration, time).unwrap()
        };
        assert_eq!(same(plan.ties.chosen), plan, "the pick is the plan itself");
        for p in (0..plan.top.len()).filter(|&p| p != plan.ties.chosen) {
            let other = same(p);
            let ranked = &plan.top[p];
            assert_eq!(other.config, ranked.config);
            assert_eq!(other.placement, ranked.placement);
            assert_eq!(other.mapping.state.placement(), ranked.placement);
            let mut hosts = other.mapping.node_order.clone();
            hosts.sort();
            assert_eq!(hosts, ["a", "b"]);
            assert_eq!(other.ties.chosen, p, "it names itself as the one that runs");
            assert_eq!(
                other.estimate.memory.peak_bytes,
                other.estimate.peak_memory_bytes
            );
            let gap = (other.estimate.iteration_ms - ranked.mapped_ms).abs() / ranked.mapped_ms;
            assert!(
                gap < 0.01,
                "{} against {}",
                other.estimate.iteration_ms,
                ranked.mapped_ms
            );
        }
    }

    #[test]
    fn a_placement_gives_back_its_mapping() {
        let devices = [(1, 1), (1, 0), (0, 0), (0, 1)]
            .map(|(node, gpu)| Device { node, gpu })
            .to_vec();
        let state = mapping_state(&Placement { devices }, 2);
        assert_eq!(state.node_order, [1, 0]);
        assert_eq!(state.gpu_order, [vec![1, 0], vec![0, 1]]);
        assert_eq!(state.placement().devices.len(), 4);
    }
}
