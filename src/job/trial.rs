//! The trial before a launch (and `pipette calibrate`): trial rounds at the micro-batches
//! [`next_step`] picks, re-planning with a larger memory estimate after an out-of-memory,
//! the calibration fitted on what was measured and the re-plan it gives; then, for a
//! launch, the measured choice among the plans the model cannot tell apart.
//!
//! [`next_step`] decides what comes next from what was seen; [`TrialRounds`] here does it and
//! keeps what the rounds learnt, so the loop in [`trial()`] only joins the two.

use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::{Decided, Event as Told, JobError, Tell};
use crate::cli::resolved::RunConfig;
use crate::cluster::ClusterProfile;
use crate::config::Settings;
use crate::launch::JobSpec;
use crate::measure::ProgressBars;
use crate::model::calibration::Calibration;
use crate::model::Placement;
use crate::plan::{self, Plan, PlanOptions};
use crate::replan::trials::{self, next_step, Position, Seen, Step};
use crate::supervise::events::{Event, EventLog};
use crate::supervise::reporter::config_changes;
use crate::trial::{self, choice, TrialError, TrialMeasurement, TrialReport, TrialRequest};

/// How long one staging or clean-up command of the trial may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// What the trial found: the plan to launch and the report (measurements and the fitted
/// calibration).
pub struct Trialled {
    pub plan: Plan,
    pub report: TrialReport,
}

/// Runs the trial rounds of the decided plan on `spec` as [`next_step`] decides (trial each
/// `--trial-micro-batches` size, on running out of memory raise the overhead and re-plan,
/// fit the calibration, re-plan, try a changed plan again; at most `rounds` rounds), then,
/// when `choose` and `--trial-top-k` asks for more than the plan's pick, the measured
/// choice among the best plans ([`choice`]), and returns the plan to launch and the
/// report. Every trial shares one staging of the hook. Only executes: every decision is
/// [`next_step`]'s or [`choice`]'s.
pub fn trial(
    config: &RunConfig,
    spec: &JobSpec,
    decided: &Decided,
    profile: &ClusterProfile,
    rounds: usize,
    choose: bool,
    tell: Tell<'_>,
) -> Result<Trialled, JobError> {
    let options = decided.options.clone();
    let progress = ProgressBars::new(!config.output.json, config.supervise.progress_interval);
    let hosts: Vec<String> = profile.nodes.iter().map(|n| n.host.clone()).collect();
    let staging = trial::TrialStaging::new(spec, &hosts, COMMAND_TIMEOUT)?;
    let passed = signals_passed_on(&spec.run_dir, tell);
    // Every trial's request but its plan.
    let base = TrialRequest {
        template: spec,
        settings: &decided.settings,
        plan: &decided.plan,
        iters: config.trial.iters,
        stop_when_stable: false,
        timeout: config.trial.timeout,
        command_timeout: COMMAND_TIMEOUT,
        python: "python3",
        signals: trial::SignalObserver(&passed),
    };
    let mut state = TrialRounds::new(
        &decided.settings,
        profile,
        options,
        decided.plan.clone(),
        tell,
    );
    let policy = trials::Rounds {
        max: rounds,
        first_sizes: config.trial.micro_batches.as_deref(),
    };
    let (mut at, mut seen) = (Position::default(), Seen::Start);
    loop {
        let (step, next) = next_step(&policy, at, seen, state.plan.config.micro_batch);
        at = next;
        seen = match step {
            Step::Trial { micro_batch } => state.trial(micro_batch, &base, &staging, &progress)?,
            Step::RaiseOverhead { by_bytes } => state.raise_overhead(by_bytes)?,
            Step::Fit => state.fit()?,
            Step::OutOfMemory => return Err(state.out_of_memory()),
            Step::Done => break,
        };
    }
    let TrialRounds {
        plan,
        options,
        before,
        mut trials,
        report,
        ..
    } = state;
    let report = report.ok_or_else(|| JobError::Internal("no trial was measured".to_string()))?;
    if !choose {
        return Ok(Trialled { plan, report });
    }
    let run = choice::CandidateTrials {
        trial: TrialRequest {
            plan: &plan,
            ..base
        },
        staging: &staging,
        settings: &decided.settings,
        cluster: profile,
        calibration: &options.calibration,
        time_options: options.time_options,
    };
    let chosen = choice::measured_choice(
        &run,
        &plan,
        config.trial.top_k,
        &mut trials,
        &before,
        &progress,
        &mut |line| tell(Told::Choice(&line)),
    )
    .map_err(|e| match e {
        choice::ChoiceError::Trial(e) => JobError::from(e),
        choice::ChoiceError::Time(e) => JobError::from(e),
    })?;
    let (plan, report) = chosen.unwrap_or((plan, report));
    Ok(Trialled { plan, report })
}

/// What the trial rounds have learnt so far, and the plan they stand at.
struct TrialRounds<'a> {
    settings: &'a Settings,
    profile: &'a ClusterProfile,
    /// The planner's options; the calibration changes as the rounds learn.
    options: PlanOptions,
    /// The calibration before any round, which every fit starts from.
    before: Calibration,
    plan: Plan,
    trials: Vec<(TrialMeasurement, Placement)>,
    report: Option<TrialReport>,
    /// The last round's out-of-memory, until a re-plan answers it.
    out_of_memory: Option<TrialError>,
    tell: Tell<'a>,
}

impl<'a> TrialRounds<'a> {
    fn new(
        settings: &'a Settings,
        profile: &'a ClusterProfile,
        options: PlanOptions,
        plan: Plan,
        tell: Tell<'a>,
    ) -> Self {
        TrialRounds {
            settings,
            profile,
            before: options.calibration.clone(),
            options,
            plan,
            trials: Vec::new(),
            report: None,
            out_of_memory: None,
            tell,
        }
    }

    /// One trial of the current plan at `micro_batch`.
    fn trial(
        &mut self,
        micro_batch: u64,
        base: &TrialRequest<'_>,
        staging: &trial::TrialStaging,
        progress: &ProgressBars,
    ) -> Result<Seen, JobError> {
        let mut tried = self.plan.clone();
        tried.config.micro_batch = micro_batch;
        let batch = micro_batch * tried.config.dp;
        let global_batch = self.settings.training.global_batch_size;
        if micro_batch == 0 || global_batch % batch != 0 {
            return Err(JobError::Usage(format!(
                "--trial-micro-batches {micro_batch}: the global batch {global_batch} is not a \
                 multiple of micro-batch {micro_batch} × dp {} (choose sizes that divide it)",
                tried.config.dp
            )));
        }
        (self.tell)(Told::TrialRound {
            config: &tried.config,
            micro_batch,
            iters: base.iters,
        });
        let request = TrialRequest {
            plan: &tried,
            ..base.clone()
        };
        match trial::run_trial(&request, staging, progress) {
            Ok(measured) => {
                self.trials.push((measured, tried.placement.clone()));
                Ok(Seen::Measured)
            }
            Err(e) if e.is_out_of_memory() => {
                self.out_of_memory = Some(e);
                Ok(Seen::OutOfMemory {
                    peak_bytes: tried.estimate.peak_memory_bytes,
                    usable_bytes: tried.estimate.usable_memory_bytes,
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The plan re-made with `by_bytes` more memory overhead, after an out-of-memory.
    fn raise_overhead(&mut self, by_bytes: u64) -> Result<Seen, JobError> {
        self.options.calibration.overhead_bytes += by_bytes;
        if let Some(e) = self.out_of_memory.take() {
            (self.tell)(Told::OutOfMemory(&e));
        }
        self.plan = plan::plan_subset(self.settings, self.profile, &self.options)?;
        Ok(Seen::Replanned)
    }

    /// The calibration fitted on every round so far, and the plan re-made with it.
    fn fit(&mut self) -> Result<Seen, JobError> {
        let fitted = trial::calibrate(
            self.settings,
            self.profile,
            &self.trials,
            &self.before,
            self.options.time_options,
        )?;
        self.options.calibration = fitted.calibration.clone();
        (self.tell)(Told::Fitted(&fitted));
        self.report = Some(fitted);
        let replanned = plan::plan_subset(self.settings, self.profile, &self.options)?;
        let changes = config_changes(&self.plan.config, &replanned.config);
        let changed = !changes.is_empty();
        if changed {
            (self.tell)(Told::Replanned {
                changes: &changes,
                now: &replanned.config,
            });
        }
        self.plan = replanned;
        Ok(Seen::Fitted { changed })
    }

    /// The error when even the smallest micro-batch ran out of memory.
    fn out_of_memory(&mut self) -> JobError {
        match self.out_of_memory.take() {
            Some(e) => e.into(),
            None => JobError::Internal("the trial ran out of memory".to_string()),
        }
    }
}

/// What to do with USR1/USR2 passed on to the training script during the trial: note it in
/// the run's event log, as the supervisor does (attempt 0: the trial), and tell it. The log
/// is opened at the first signal, so a trial without one leaves no event log behind.
fn signals_passed_on<'a>(
    run_dir: &'a std::path::Path,
    tell: Tell<'a>,
) -> impl Fn(Signal, usize) + Sync + 'a {
    let events: OnceLock<Option<EventLog>> = OnceLock::new();
    move |signal: Signal, workers: usize| {
        let log = events.get_or_init(|| EventLog::create(run_dir).ok());
        if let Some(log) = log {
            log.write(&Event::SignalPassed {
                attempt: 0,
                signal: signal.to_string(),
                workers,
            });
        }
        tell(Told::SignalPassed { signal, workers });
    }
}
