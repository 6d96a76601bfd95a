//! Costing a straggler's choices (keep going at its pace, re-map around it, leave its node
//! out, swap it for a hot spare when the plan has one) and deciding whether to act: [`weigh`] scales the model's times for each
//! ([`crate::replan::straggler`] plans them) to the job's measured pace, [`decide`] weighs
//! the gain against a restart's cost. Both pure: the driver gathers the facts and acts.

use std::time::Duration;

use serde::Serialize;

use crate::cluster::ClusterProfile;
use crate::launch::CheckpointState;
use crate::replan::failure::Replanned;
use crate::replan::straggler::{choices, RunningPlan};

use super::{Straggler, StragglerMode, StragglerOptions};

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
    /// Keep the plan and put one of its hot spares in the straggler's place (only when the
    /// plan has spares).
    SwapSpare,
}

impl Choice {
    /// In words, as the lines and the summary say it.
    pub fn name(self) -> &'static str {
        match self {
            Choice::Keep => "keep",
            Choice::Remap => "re-map",
            Choice::LeaveOut => "leave out",
            Choice::SwapSpare => "swap for spare",
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
    #[serde(
        rename = "teardown_s",
        serialize_with = "crate::supervise::events::seconds"
    )]
    pub teardown: Duration,
    /// From the launch to the first iteration: starting torchrun, loading the checkpoint.
    #[serde(
        rename = "startup_s",
        serialize_with = "crate::supervise::events::seconds"
    )]
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
/// most time over the remaining iterations (a spare swap over an equal one: it keeps the
/// layout), when that beats the restart's cost, in `act`
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
    /// Keep, re-map, leave out and, with spares, swap for a spare (keep alone with
    /// planning off).
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

/// Keep, re-map, leave out and swap for a spare (with spares) as the model times them,
/// scaled to the job's measured pace; and the slowed cluster a re-map plans on.
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
    // The spare runs at the healthy nodes' pace; last, so that it wins a tie (max_by).
    let swap = model
        .swap
        .as_ref()
        .map(|swap| costed(Choice::SwapSpare, healthy_scale, swap));
    let mut choices = vec![keep, remap, leave_out];
    choices.extend(swap);
    (choices, model.remap.ok().map(|(_, r)| r.profile))
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
        use crate::replan::failure::CheckpointFormat;

        /// A job planned on `nodes` nodes of `gpus` A100s each (tp and pp pinned).
        struct Job {
            settings: Settings,
            options: PlanOptions,
            profile: ClusterProfile,
            plan: Plan,
            hosts: Vec<String>,
        }

        fn job(nodes: usize, gpus: u32, tp: u64, pp: u64, vocab: u64) -> Job {
            job_with_spares(nodes, gpus, tp, pp, vocab, 0)
        }

        /// [`job`], planned with `spares` hot spares (`--spares`): the attempt runs on the
        /// plan's nodes.
        fn job_with_spares(
            nodes: usize,
            gpus: u32,
            tp: u64,
            pp: u64,
            vocab: u64,
            spares: usize,
        ) -> Job {
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
                        nvlink_domain: None,
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
            let mut options = PlanOptions::default();
            options.nodes.spares = spares;
            let plan = if spares == 0 {
                crate::plan::plan(&settings, &profile, &options).unwrap()
            } else {
                crate::plan::plan_subset(&settings, &profile, &options).unwrap()
            };
            let hosts = plan.mapping.node_order.clone();
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

        /// Data parallel over four of five nodes of two GPUs (tp=2 pp=1 dp=4), n4 a spare.
        fn data_parallel_with_spare() -> Job {
            let job = job_with_spares(5, 2, 2, 1, 32_000, 1);
            assert_eq!(job.plan.config.dp, 4);
            assert_eq!(job.plan.spares, ["n4"]);
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
            let format = CheckpointFormat::default();
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

        /// The fourth choice: with a spare, a straggler in a data-parallel job is
        /// swapped for it (the plan kept, the job back at its pace), which beats leaving it
        /// out (fewer replicas); without spares the choice is not offered.
        #[test]
        fn a_spare_takes_a_stragglers_place() {
            let swap = Case {
                name: "swap: a spare runs the straggler's ranks",
                job: data_parallel_with_spare,
                action: Choice::SwapSpare,
                ..SEVERE
            };
            let swapped = weighed(&swap);
            assert_eq!(swapped.verdict.action, Choice::SwapSpare, "{swapped:?}");
            let choices: Vec<Choice> = swapped.choices.iter().map(|c| c.choice).collect();
            assert_eq!(
                choices,
                [
                    Choice::Keep,
                    Choice::Remap,
                    Choice::LeaveOut,
                    Choice::SwapSpare
                ]
            );
            let ms = predicted(&swapped, Choice::SwapSpare).unwrap();
            assert!((900.0..1100.0).contains(&ms), "{swapped:?}");
            assert!(ms < predicted(&swapped, Choice::LeaveOut).unwrap());
            let detail = &swapped.choices[3].detail;
            assert!(
                detail.contains("dp=4") && detail.ends_with("on n0, n2, n3, n4"),
                "{detail}"
            );
            // Reported, not acted on, outside act mode; never offered without a spare.
            let report = weighed(&Case {
                mode: StragglerMode::Report,
                ..swap
            });
            assert_eq!(report.verdict.action, Choice::Keep);
            assert!(report.verdict.why.contains("reported only"), "{report:?}");
            let plain = weighed(&SEVERE);
            assert!(plain.choices.iter().all(|c| c.choice != Choice::SwapSpare));
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
