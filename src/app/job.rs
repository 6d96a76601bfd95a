//! `pipette-run`: the dry run (plan and render, launch nothing) and the launch (profile,
//! plan, trial and re-plan, launch, supervise); `pipette calibrate` (the trial alone).

use std::time::{Duration, Instant};

use super::decided;
use super::inputs::{gather_inputs, Run, NO_PROFILE_YET};
use super::{local_time, to_json, unix_seconds, write_json};
use crate::cli::resolved::RunConfig;
use crate::cluster::{Allocation, ClusterProfile};
use crate::config::Settings;
use crate::error::Error;
use crate::exec::{self, Transport};
use crate::launch;
use crate::log::{self, Level, TEXT_WIDTH};
use crate::model::time::{self, TimeEstimate, TimeRequest};
use crate::model::ParallelConfig;
use crate::plan::{Plan, PlanOptions};
use crate::render;
use crate::replan::trials::MAX_TRIAL_ROUNDS;
use crate::report::dry_run::{commands_to_human, ShownCommand};
use crate::report::ledger::{job_summary, Ledger, LedgerInputs, Work};
use crate::report::pictures;
use crate::report::plan::{plan_report, plan_summary, plan_to_human, YoursReport};
use crate::report::{wrap, TrialFile, WIDTH};
use crate::supervise;
use crate::trial;

/// What a dry run did, when it planned.
pub(super) const PLANNED_NOT_LAUNCHED: &str =
    "Dry run: planned and rendered; nothing was launched (without --dry-run, pipette-run runs the trial and launches).";

pub(super) fn run(config: &RunConfig) -> Result<(), Error> {
    let mut run = gather_inputs(config, false)?;
    plan_and_render(config, &mut run)?;
    if config.output.json {
        println!("{}", to_json(&run.report)?);
    } else {
        print!("{}", run.report.to_human());
        if let Some(plan) = &run.plan {
            println!();
            let runner_up = run.runner_up.as_ref().map(|(_, t)| t);
            match &run.profile {
                Some(profile) => print!("{}", plan_report(plan, runner_up, &run.settings, profile)),
                None => print!("{}", plan_to_human(plan, runner_up)),
            }
            if let Some(yours) = &run.report.yours {
                println!("\nYours: the configuration your arguments give, costed alike");
                print!("{}", wrap(&yours.to_human(), WIDTH));
            }
        }
        if let Some(launch) = &run.report.launch {
            println!("\nCommands, one per node, exactly as they would run:");
            let lines = launch.command_lines();
            let shown: Vec<ShownCommand<'_>> = launch
                .nodes
                .iter()
                .zip(&lines)
                .map(|(node, line)| ShownCommand {
                    host: &node.host,
                    line,
                    script: std::path::Path::new(&node.script_path)
                        .file_name()
                        .and_then(|f| f.to_str()),
                })
                .collect();
            print!(
                "{}",
                commands_to_human(&shown, &config.discovery.environment)
            );
        }
        if let Some(dir) = &run.report.run_dir {
            println!("\nRun directory: {dir}");
        }
        let trial_runs = config.trial.before_launch;
        if let (Some(plan), Some(template), true) = (&run.plan, &run.template, trial_runs) {
            let (commands, lines, notes) =
                trial::trial_commands(template, &run.settings, plan, config.trial.iters, &[])
                    .map_err(launch_error)?;
            print_trial_commands(&commands, &lines, &notes, config);
        }
    }
    Ok(())
}

/// Launches the job and supervises it to the end (re-planning after node failures):
/// discover, profile the nodes (or read --cluster), plan, run the trial and re-plan with
/// the fitted calibration (unless --no-trial or --calibration), render attempt 1 into the
/// run directory, then hand over to [`supervise::supervise`]. Returns pipette-run's exit
/// code: 0, the failing worker's, or 128 + a signal (also when one stops profiling or the
/// trial, see [`ending_on_signal`]); errors before anything runs are the usual [`Error`]s.
pub(super) fn launch_and_supervise(config: &RunConfig) -> Result<i32, Error> {
    ending_on_signal(config, |stage| {
        let mut job = prepare_job(config)?;
        (
            stage.ledger.profiling,
            stage.ledger.planning,
            stage.ledger.preparation,
        ) = job.took;
        stage.run_dir = Some(job.template.run_dir.clone());
        stop_requested()?;
        stage.during = "the trial run";
        let trial = if !config.trial.before_launch {
            None
        } else {
            let started = Instant::now();
            let trial = super::trial_rounds::trial_and_replan(config, &job, MAX_TRIAL_ROUNDS, true);
            stage.ledger.trial = Some(started.elapsed());
            let (plan, report) = trial?;
            job.plan = plan;
            job.options.calibration = report.calibration.clone();
            Some(report)
        };
        stage.during = "the launch's preparation";
        let options = job.options.clone();
        let started = Instant::now();
        let (plan, settings, yours) = decided_plan(config, &job, job.plan.clone(), &options)?;
        stage.yours = yours;
        stage.ledger.planning += started.elapsed();
        let preparing = Instant::now();
        stage.ledger.work = Some(work(&settings, &plan, &job.profile));
        let Job {
            template, profile, ..
        } = job;
        let layout = launch::Layout::Planned(Box::new(launch::Planned {
            settings,
            options,
            plan,
            profile,
        }));
        let first = template.prepare(1, layout, None).map_err(launch_error)?;
        if let Some(planned) = first.layout.planned() {
            write_pictures(&first.dir, &planned.plan, &planned.profile)?;
        }
        if let Some(report) = &trial {
            write_json(
                &template.run_dir.join("trial.json"),
                &TrialFile::new(report),
                "--run-dir",
            )?;
        }
        stage.ledger.preparation += preparing.elapsed();
        supervise_job(config, &template, first, trial.as_ref(), &stage.before())
    })
}

/// The work of one iteration of `plan`, for the ledger's throughput (what the progress
/// line counts).
fn work(settings: &Settings, plan: &Plan, profile: &ClusterProfile) -> Work {
    let spec = supervise::output::ProgressSpec::planned(Duration::ZERO, plan, settings, profile);
    Work {
        tokens: spec.tokens_per_iteration.unwrap_or(0.0),
        flops: spec.flops_per_iteration.unwrap_or(0.0),
        peak_flops_per_gpu: spec.peak_flops_per_gpu,
    }
}

/// What a launch was doing, for a stop signal's record, and how long each step took, for
/// the ledger.
pub(super) struct Stage {
    /// `profiling the nodes`, `the trial run`.
    pub(super) during: &'static str,
    /// The run directory, once known.
    pub(super) run_dir: Option<std::path::PathBuf>,
    /// When pipette-run started on the launch.
    pub(super) start: Instant,
    /// The steps before the supervisor's, timed so far (`wall` is set at the end).
    pub(super) ledger: LedgerInputs,
    /// The user's configuration costed beside the plan, for `--json`.
    pub(super) yours: Option<YoursReport>,
}

/// What the supervisor's caller knew before the launch, for the end of the job.
pub(super) struct Before<'a> {
    /// The ledger's inputs, `wall` up to the launch.
    pub(super) ledger: LedgerInputs,
    pub(super) yours: Option<&'a YoursReport>,
}

impl Stage {
    /// What is known so far, with the wall time so far.
    pub(super) fn before(&self) -> Before<'_> {
        Before {
            ledger: LedgerInputs {
                wall: self.start.elapsed(),
                ..self.ledger.clone()
            },
            yours: self.yours.as_ref(),
        }
    }
}

/// Runs `launch` (which says in its [`Stage`] what it is doing); when a stop signal ends it
/// before the supervisor takes over (profiling, planning, the trial: each stops what it ran
/// and removes its staging), records the signal and the exit in the run directory's
/// `events.jsonl` and `summary.txt` as the supervisor would, prints the summary, and
/// returns 128 + the signal's number.
pub(super) fn ending_on_signal(
    config: &RunConfig,
    launch: impl FnOnce(&mut Stage) -> Result<i32, Error>,
) -> Result<i32, Error> {
    let mut stage = Stage {
        during: "profiling the nodes",
        run_dir: None,
        start: Instant::now(),
        ledger: LedgerInputs::default(),
        yours: None,
    };
    let error = match launch(&mut stage) {
        Ok(code) => return Ok(code),
        Err(e) => e,
    };
    let Some(signal) = error.interrupted_by() else {
        return Err(error);
    };
    let ledger = LedgerInputs {
        wall: stage.start.elapsed(),
        ..stage.ledger.clone()
    };
    let run_dir = match stage.run_dir {
        Some(dir) => dir,
        None => {
            let workdir = std::env::current_dir()
                .map_err(|e| Error::Internal(format!("cannot read the working directory: {e}")))?;
            match &config.launch.run_dir {
                Some(dir) => render::claim_run_dir(&workdir.join(dir), false)?,
                None => {
                    let id = std::process::id().to_string();
                    render::claim_run_dir(
                        &render::default_run_dir(&workdir, &id, local_time()),
                        true,
                    )?
                }
            }
        }
    };
    let events = supervise::events::EventLog::create(&run_dir).map_err(|e| {
        Error::Usage(format!(
            "cannot write {}: {e} (choose another --run-dir)",
            run_dir.join("events.jsonl").display()
        ))
    })?;
    let count = supervise::signals::stop_received().map_or(1, |r| r.count);
    let outcome = supervise::interrupted(&events, signal, count, stage.during);
    log::log(
        Level::Warn,
        "job",
        &format!(
            "{} received during {}: stopped it (nothing is left running); run directory {} (events.jsonl, summary.txt)",
            supervise::signals::signal_name(signal),
            stage.during,
            run_dir.display()
        ),
    );
    let before = Before {
        ledger,
        yours: stage.yours.as_ref(),
    };
    finish_outcome(config, &run_dir, &outcome, None, &before)
}

/// `Err(Error::Interrupted)` once a stop signal has arrived: checked between the stages
/// that do not watch for one themselves.
pub(super) fn stop_requested() -> Result<(), Error> {
    match supervise::signals::stop_received() {
        Some(r) => Err(Error::Interrupted(r.signal)),
        None => Ok(()),
    }
}

/// Supervises `first` (and every relaunch) to the end, planned or not: the event log, the
/// notes and the run directory's line, then [`supervise::supervise`], the summary (on
/// stderr and in the run directory) and, with `--json`, the result on stdout. Returns
/// pipette-run's exit code.
pub(super) fn supervise_job(
    config: &RunConfig,
    template: &launch::JobTemplate,
    first: launch::Attempt,
    trial: Option<&trial::TrialReport>,
    before: &Before<'_>,
) -> Result<i32, Error> {
    let start = Instant::now();
    let run_dir = template.run_dir.clone();
    let events = supervise::events::EventLog::create(&run_dir).map_err(|e| {
        Error::Usage(format!(
            "cannot write {}: {e} (choose another --run-dir)",
            run_dir.join("events.jsonl").display()
        ))
    })?;
    for note in &first.spec.notes {
        log::log_wrapped(Level::Info, "job", note);
    }
    let files = match first.layout {
        launch::Layout::Planned(_) => "launch scripts, plan, trial.json, logs/, events.jsonl",
        launch::Layout::World(_) => "launch scripts, world.json, logs/, events.jsonl",
    };
    let line = format!("run directory {} ({files})", run_dir.display());
    log::log_wrapped(Level::Info, "job", &line);
    stop_requested()?;
    let outcome = supervise::supervise(template, first, &config.supervise, &events);
    let before = Before {
        ledger: LedgerInputs {
            wall: before.ledger.wall + start.elapsed(),
            ..before.ledger.clone()
        },
        yours: before.yours,
    };
    finish_outcome(config, &run_dir, &outcome, trial, &before)
}

/// The end of a job: the summary (on stderr and in the run directory) and, with `--json`,
/// the result on stdout. Returns pipette-run's exit code.
fn finish_outcome(
    config: &RunConfig,
    run_dir: &std::path::Path,
    outcome: &supervise::Outcome,
    trial: Option<&trial::TrialReport>,
    before: &Before<'_>,
) -> Result<i32, Error> {
    let ledger = Ledger::new(&before.ledger, &outcome.attempts);
    let summary = job_summary(outcome, Some(&ledger));
    eprint!("{summary}");
    if let Err(e) = std::fs::write(run_dir.join("summary.txt"), &summary) {
        log::warn(&format!(
            "cannot write the summary into the run directory: {e}"
        ));
    }
    if let Err(e) = write_json(&run_dir.join("ledger.json"), &ledger, "--run-dir") {
        log::warn(&e.to_string());
    }
    if config.output.json {
        let result = LaunchResult {
            schema: LAUNCH_SCHEMA,
            run_dir: run_dir.display().to_string(),
            outcome,
            trial,
            yours: before.yours,
            ledger: &ledger,
        };
        println!("{}", to_json(&result)?);
    }
    Ok(outcome.exit_code)
}

/// `pipette-run --json`'s result's schema name and version; the version changes with
/// any field.
pub(super) const LAUNCH_SCHEMA: &str = "pipette-launch/1";

/// What `pipette-run --json` prints on stdout when the job ends (the nodes' output goes
/// to stderr then).
#[derive(serde::Serialize)]
pub(super) struct LaunchResult<'a> {
    /// [`LAUNCH_SCHEMA`].
    pub(super) schema: &'static str,
    pub(super) run_dir: String,
    pub(super) outcome: &'a supervise::Outcome,
    /// The trial run's measurements and fitted calibration, when one ran.
    pub(super) trial: Option<&'a trial::TrialReport>,
    /// The configuration the script's arguments give, costed beside the plan; null when
    /// they set none (or planning is off).
    pub(super) yours: Option<&'a YoursReport>,
    /// Where the wall time went (as `ledger.json`).
    pub(super) ledger: &'a Ledger,
}

/// A job ready to try or launch: its inputs, the nodes' profile, the first plan and what
/// every attempt shares.
pub(super) struct Job {
    pub(super) run: Run,
    pub(super) profile: ClusterProfile,
    pub(super) plan: Plan,
    pub(super) template: launch::JobTemplate,
    /// The planner's options the job was planned with (the trial's calibration replaces
    /// theirs before the launch).
    pub(super) options: PlanOptions,
    /// The settings as read, before `--pin yours` (`run.settings` has the user's
    /// configuration pinned when it kept it).
    pub(super) free: Settings,
    /// How long profiling (with reading the inputs), planning and preparing the job's
    /// template took.
    pub(super) took: (Duration, Duration, Duration),
}

/// Discovers and profiles (or reads --cluster), plans, and builds the job template.
pub(super) fn prepare_job(config: &RunConfig) -> Result<Job, Error> {
    let started = Instant::now();
    let run = gather_inputs(config, true)?;
    let profiling = started.elapsed();
    let Some(profile) = run.profile.clone() else {
        return Err(Error::Internal(
            "no profile after profiling the nodes".to_string(),
        ));
    };
    let mut run = run;
    let options = config.planning.plan_options(&run.settings)?;
    let free = run.settings.clone();
    let decision = decided::decide(
        &free,
        &config.script.args,
        &profile,
        &options,
        decided::pin_yours(config.settings.pin.as_deref())?,
        None,
    )?;
    run.settings = decision.settings;
    let planning = started.elapsed() - profiling;
    let preparing = Instant::now();
    let template = job_template(config, &run.allocation)?;
    let preparation = preparing.elapsed();
    Ok(Job {
        run,
        profile,
        plan: decision.plan,
        template,
        options,
        free,
        took: (profiling, planning, preparation),
    })
}

/// The plan report every launch logs (see [`plan_summary`]), with the user's
/// configuration costed under the final calibration (and `--pin yours` decided again
/// with it): returns the plan to launch, the settings it was made with, and the report.
fn decided_plan(
    config: &RunConfig,
    job: &Job,
    plan: Plan,
    options: &PlanOptions,
) -> Result<(Plan, Settings, Option<YoursReport>), Error> {
    // The plan is ours, free of `--pin yours`, unless that pin kept the user's.
    let free_plan = (job.run.settings == job.free).then_some(plan);
    let decision = decided::decide(
        &job.free,
        &config.script.args,
        &job.profile,
        options,
        decided::pin_yours(config.settings.pin.as_deref())?,
        free_plan,
    )?;
    let runner_up = runner_up(&decision.plan, &decision.settings, &job.profile, options);
    let runner_up = runner_up.as_ref().map(|(_, t)| t);
    let yours = decision.yours.as_ref();
    if log::enabled("plan", Level::Debug) {
        // The dry run's report as it is (its tables take the whole 80 columns), the
        // user's configuration after it, as the summary is printed.
        log::log(Level::Debug, "plan", "the plan");
        eprint!(
            "{}{}",
            plan_to_human(&decision.plan, runner_up),
            wrap(&yours.map(YoursReport::to_human).unwrap_or_default(), WIDTH)
        );
    } else {
        let report = plan_summary(&decision.plan, runner_up, yours, TEXT_WIDTH);
        log::log(Level::Info, "plan", &report);
    }
    Ok((decision.plan, decision.settings, decision.yours))
}

/// What every attempt of the job shares: the run's configuration and the allocation (its
/// hosts and node source choose the transport, its job id the rendezvous id).
pub(super) fn job_template(
    config: &RunConfig,
    allocation: &Allocation,
) -> Result<launch::JobTemplate, Error> {
    let launch = &config.launch;
    let workdir = std::env::current_dir()
        .map_err(|e| Error::Internal(format!("cannot read the working directory: {e}")))?;
    let rdzv_id = rendezvous_id(launch.rdzv_id.as_deref(), allocation.job_id.as_deref());
    // Claimed (made, atomically) here, so no other launch can write into it.
    let run_dir = match &launch.run_dir {
        Some(dir) => render::claim_run_dir(&workdir.join(dir), false)?,
        None => {
            let id = match &allocation.job_id {
                Some(job) => job.clone(),
                None => std::process::id().to_string(),
            };
            render::claim_run_dir(&render::default_run_dir(&workdir, &id, local_time()), true)?
        }
    };
    let templates = match &launch.templates {
        Some(dir) => render::Templates::from_dir(dir)?,
        None => render::Templates::embedded(),
    };
    let transport = launch
        .access
        .transport(&allocation.host_names(), &allocation.source);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    Ok(launch::JobTemplate {
        script: config.script.clone(),
        torchrun: launch.torchrun.clone(),
        torchrun_spelling: installed_torchrun_spelling(&launch.torchrun),
        torchrun_passthrough: launch.torchrun_passthrough.clone(),
        master_addr: launch.master_addr.clone(),
        master_port: launch.master_port,
        rdzv_id,
        env: config.node_env.clone(),
        workdir,
        run_dir,
        templates,
        transport,
        run_id: format!("{}-{nanos}", std::process::id()),
    })
}

/// `pipette calibrate`: the trial alone, its report written to `--out`.
pub(super) fn calibrate(config: &RunConfig, out: &std::path::Path) -> Result<(), Error> {
    let job = prepare_job(config)?;
    if config.output.dry_run {
        let (commands, lines, notes) = trial::trial_commands(
            &job.template,
            &job.run.settings,
            &job.plan,
            config.trial.iters,
            &[],
        )
        .map_err(launch_error)?;
        print_trial_commands(&commands, &lines, &notes, config);
        return Ok(());
    }
    // One round: the trial of the plan as asked, fitted; the re-plan is only reported.
    let (_, report) = super::trial_rounds::trial_and_replan(config, &job, 1, false)?;
    write_json(out, &TrialFile::new(&report), "--out")?;
    if config.output.json {
        println!("{}", to_json(&TrialFile::new(&report))?);
    } else {
        print!("{}", report.to_human());
        println!("written to {}", out.display());
    }
    Ok(())
}

pub(super) fn print_trial_commands(
    commands: &[(String, exec::NodeCommand)],
    lines: &[String],
    notes: &[String],
    config: &RunConfig,
) {
    println!("\nTrial run, one command per node (unless --no-trial or --calibration):");
    let shown: Vec<ShownCommand<'_>> = commands
        .iter()
        .zip(lines)
        .map(|((host, _), line)| ShownCommand {
            host,
            line,
            script: None,
        })
        .collect();
    print!(
        "{}",
        commands_to_human(&shown, &config.discovery.environment)
    );
    for note in notes {
        print!("{}", wrap(&format!("  note: {note}\n"), WIDTH));
    }
}

pub(super) fn launch_error(e: launch::LaunchError) -> Error {
    match e {
        launch::LaunchError::Plan(e) => Error::Plan(e),
        launch::LaunchError::Render(e) => Error::Render(e),
        launch::LaunchError::PlanJson(e) => Error::Internal(e),
    }
}

/// Plans on the profile (when there is one), renders the launch, writes the run directory.
pub(super) fn plan_and_render(config: &RunConfig, run: &mut Run) -> Result<(), Error> {
    let Some(profile) = &run.profile else {
        run.report.status = NO_PROFILE_YET.to_string();
        return Ok(());
    };
    let options = config.planning.plan_options(&run.settings)?;
    let decision = decided::decide(
        &run.settings,
        &config.script.args,
        profile,
        &options,
        decided::pin_yours(config.settings.pin.as_deref())?,
        None,
    )?;
    let plan = decision.plan;
    run.settings = decision.settings;
    run.report.yours = decision.yours;
    run.runner_up = runner_up(&plan, &run.settings, profile, &options);
    // The same template the launch renders with, so the preview is what would run.
    let mut template = job_template(config, &run.allocation)?;
    template.run_id.clear();
    let run_dir = template.run_dir.clone();
    let written = template
        .render(&run.settings, &plan, None, &run_dir)
        .map_err(launch_error)
        .and_then(|launch| {
            render::write_run_dir(&launch, &run_dir)?;
            write_pictures(&run_dir, &plan, profile)?;
            Ok(launch)
        });
    // The directory is this run's own (just claimed): nothing partial stays behind.
    let launch = written.inspect_err(|_| {
        let _ = std::fs::remove_dir_all(&run_dir);
    })?;
    run.report.run_dir = Some(run_dir.display().to_string());
    run.report.launch = Some(launch);
    run.report.plan = Some(
        serde_json::to_value(&plan)
            .map_err(|e| Error::Internal(format!("writing the plan: {e}")))?,
    );
    run.report.status = PLANNED_NOT_LAUNCHED.to_string();
    run.plan = Some(plan);
    run.template = Some(template);
    Ok(())
}

/// The plan's pictures ([`pictures::Picture`]) as SVG files beside its other files in the
/// run directory.
fn write_pictures(
    dir: &std::path::Path,
    plan: &Plan,
    profile: &ClusterProfile,
) -> Result<(), Error> {
    for (name, svg) in pictures::svg_files(plan, profile) {
        let path = dir.join(name);
        std::fs::write(&path, svg).map_err(|e| {
            Error::Usage(format!(
                "cannot write {}: {e} (choose another --run-dir)",
                path.display()
            ))
        })?;
    }
    Ok(())
}

/// The runner-up ([`Plan::runner_up`]) estimated on its own best mapping, so the report
/// can say what tells the winner from it.
pub(super) fn runner_up(
    plan: &Plan,
    settings: &Settings,
    profile: &ClusterProfile,
    options: &PlanOptions,
) -> Option<(ParallelConfig, TimeEstimate)> {
    let second = &plan.top[plan.runner_up()?];
    let request = TimeRequest {
        model: &settings.model,
        training: &settings.training,
        config: &second.config,
        cluster: profile,
        placement: &second.placement,
        calibration: &options.calibration,
        options: options.time_options,
    };
    // The plan's own time model, as the winner's estimate and the table were made with.
    let estimate = time::estimate(&request, plan.search.time_model).ok()?;
    Some((second.config.clone(), estimate))
}

/// How the torchrun installed here spells its options: old releases know only
/// `--nproc_per_node`. Dashes when it cannot be asked (not installed here, say): every
/// current torchrun accepts them.
pub fn installed_torchrun_spelling(torchrun: &str) -> render::TorchrunSpelling {
    let help = exec::NodeCommand::new(torchrun).arg("--help");
    match exec::run(
        &Transport::Local,
        "localhost",
        &help,
        Duration::from_secs(30),
    ) {
        Ok(out) if out.status.success() => render::TorchrunSpelling::from_help(&out.stdout_text()),
        _ => render::TorchrunSpelling::Dashes,
    }
}

/// torchrun's `--rdzv-id` when the user set one, else the scheduler's job id, else one
/// made from the time (the static rendezvous only needs it to be the same on all nodes).
pub(super) fn rendezvous_id(asked: Option<&str>, job_id: Option<&str>) -> String {
    asked
        .or(job_id)
        .map(str::to_string)
        .unwrap_or_else(|| format!("pipette-{}", unix_seconds()))
}
