//! `pipette-run`: the dry run (plan and render, launch nothing) and the launch (profile,
//! plan, trial and re-plan, launch, supervise); `pipette calibrate` (the trial alone).

use std::time::{Duration, Instant};

use super::interrupt::{ending_on_signal, stop_requested, Before};
use super::{to_json, write_json};
use crate::cli::resolved::RunConfig;
use crate::cluster::ClusterProfile;
use crate::config::Settings;
use crate::error::Error;
use crate::exec;
use crate::job::{self, Decided, Inputs, Purpose};
use crate::launch::{self, Layout};
use crate::log::{self, Level, TEXT_WIDTH};
use crate::plan::Plan;
use crate::replan::trials::MAX_TRIAL_ROUNDS;
use crate::report::dry_run::NodesSection;
use crate::report::dry_run::{
    commands_to_human, trial_changes_to_human, ShownCommand, WorldDryRun, RENDERED_NOT_LAUNCHED,
};
use crate::report::ledger::{job_summary, Ledger, LedgerInputs, Work};
use crate::report::plan::{describe, plan_report, plan_summary, plan_to_human, YoursReport};
use crate::report::{wrap, TrialFile, WIDTH};
use crate::supervise;
use crate::trial;

/// `pipette-run --dry-run`: the inputs, and with a profile the plan, the user's
/// configuration beside it, the commands and the run directory; the trial's commands.
pub(super) fn dry_run(config: &RunConfig) -> Result<(), Error> {
    let inputs = job::gather(config, false, &tell)?;
    let planned = match &inputs.profile {
        None => None,
        Some(profile) => {
            let options = config.planning.plan_options(&inputs.settings)?;
            let decided = job::decide(config, &inputs.settings, profile, options, None)?;
            // The same spec the launch renders with, so the preview is what would run.
            let spec = job::spec(config, &inputs.allocation, Purpose::Preview)?;
            let launch = job::preview(&spec, &decided, profile)?;
            Some((decided, spec, launch))
        }
    };
    let report = inputs.dry_run_report(
        config,
        planned
            .as_ref()
            .map(|(decided, spec, launch)| job::Previewed {
                decided,
                spec,
                launch: launch.clone(),
            }),
    );
    if config.output.json {
        println!("{}", to_json(&report)?);
        return Ok(());
    }
    print!("{}", report.to_human());
    let Some((decided, spec, _)) = &planned else {
        return Ok(());
    };
    println!();
    let runner_up = decided.runner_up.as_ref().map(|(_, t)| t);
    match &inputs.profile {
        Some(profile) => print!(
            "{}",
            plan_report(&decided.plan, runner_up, &decided.settings, profile)
        ),
        None => print!("{}", plan_to_human(&decided.plan, runner_up)),
    }
    if let Some(yours) = &decided.yours {
        println!("\nYours: the configuration your arguments give, costed alike");
        print!("{}", wrap(&yours.to_human(), WIDTH));
    }
    if let Some(launch) = &report.launch {
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
    println!("\nRun directory: {}", spec.run_dir.display());
    if config.trial.before_launch {
        let (commands, lines, notes) = trial::trial_commands(
            spec,
            &decided.settings,
            &decided.plan,
            config.trial.iters,
            &[],
        )
        .map_err(job::JobError::from)?;
        let launched = report.launch.as_ref().map(|launch| launch.command_lines());
        print_trial_commands(&commands, &lines, &notes, launched.as_deref(), config);
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
        let started = Instant::now();
        let (inputs, profile) = gather_profiled(config)?;
        stage.ledger.profiling = started.elapsed();
        let planning = Instant::now();
        let options = config.planning.plan_options(&inputs.settings)?;
        let decided = job::decide(config, &inputs.settings, &profile, options, None)?;
        stage.ledger.planning = planning.elapsed();
        let preparing = Instant::now();
        let spec = job::spec(config, &inputs.allocation, Purpose::Launch)?;
        stage.ledger.preparation = preparing.elapsed();
        stage.run_dir = Some(spec.run_dir.clone());
        stop_requested()?;
        stage.during = "the trial run";
        let (decided, trial) = if !config.trial.before_launch {
            (decided, None)
        } else {
            let started = Instant::now();
            let trialled = job::trial(
                config,
                &spec,
                &decided,
                &profile,
                MAX_TRIAL_ROUNDS,
                true,
                &tell,
            );
            stage.ledger.trial = Some(started.elapsed());
            let trialled = trialled?;
            stage.during = "the launch's preparation";
            let started = Instant::now();
            let calibration = trialled.report.calibration.clone();
            let decided = decided.with_calibration(config, &profile, calibration, trialled.plan)?;
            stage.ledger.planning += started.elapsed();
            (decided, Some(trialled.report))
        };
        stage.during = "the launch's preparation";
        log_plan(&decided);
        stage.yours = decided.yours.clone();
        let preparing = Instant::now();
        stage.ledger.work = Some(work(&decided.settings, &decided.plan, &profile));
        let first = job::first_attempt(&spec, decided, profile)?;
        if let Some(report) = &trial {
            write_json(
                &spec.run_dir.join("trial.json"),
                &TrialFile::new(report),
                "--run-dir",
            )?;
        }
        stage.ledger.preparation += preparing.elapsed();
        supervise_job(config, &spec, first, trial.as_ref(), &stage.before())
    })
}

/// The inputs with the nodes profiled (or --cluster read), and the profile they give.
fn gather_profiled(config: &RunConfig) -> Result<(Inputs, ClusterProfile), Error> {
    let inputs = job::gather(config, true, &tell)?;
    match inputs.profile.clone() {
        Some(profile) => Ok((inputs, profile)),
        None => Err(Error::Internal(
            "no profile after profiling the nodes".to_string(),
        )),
    }
}

/// The job stage's [`job::Event`]s, as log lines.
fn tell(event: job::Event<'_>) {
    use job::Event as E;
    match event {
        E::Profiling { nodes } => log::log(
            Level::Info,
            "profile",
            &format!("no --cluster given: profiling the {nodes} node(s) found"),
        ),
        E::ProfileNote(note) => log::log(Level::Info, "profile", note),
        E::TrialRound {
            config: c,
            micro_batch,
            iters,
        } => log::log(
            Level::Info,
            "trial",
            &format!(
                "trial run: tp {} pp {} dp {} micro-batch {micro_batch}, {iters} iterations",
                c.tp, c.pp, c.dp
            ),
        ),
        E::OutOfMemory(e) => log::log(
            Level::Warn,
            "trial",
            &format!(
                "the trial ran out of memory ({e}); re-planning with a larger memory estimate"
            ),
        ),
        E::Fitted(report) => log::log(Level::Info, "trial", &report.to_human()),
        E::Replanned { changes, now } => log::log_wrapped(
            Level::Info,
            "plan",
            &format!(
                "re-planned with the calibrated estimates: {} (now {})",
                changes.join(", "),
                describe(now)
            ),
        ),
        E::Choice(line) => log::log(Level::Info, "trial", line),
        E::SignalPassed { signal, workers } => log::log_wrapped(
            Level::Warn,
            "trial",
            &format!(
                "{signal} received: passed on to the training script in the trial \
                 ({workers} worker process(es)); the trial goes on"
            ),
        ),
    }
}

/// The plan report every launch logs (see [`plan_summary`]), with the user's
/// configuration costed under the final calibration.
fn log_plan(decided: &Decided) {
    let runner_up = decided.runner_up.as_ref().map(|(_, t)| t);
    let yours = decided.yours.as_ref();
    if log::enabled("plan", Level::Debug) {
        // The dry run's report as it is (its tables take the whole 80 columns), the
        // user's configuration after it, as the summary is printed.
        log::log(Level::Debug, "plan", "the plan");
        eprint!(
            "{}{}",
            plan_to_human(&decided.plan, runner_up),
            wrap(&yours.map(YoursReport::to_human).unwrap_or_default(), WIDTH)
        );
    } else {
        let report = plan_summary(&decided.plan, runner_up, yours, TEXT_WIDTH);
        log::log(Level::Info, "plan", &report);
    }
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

/// Supervises `first` (and every relaunch) to the end, planned or not: the event log, the
/// notes and the run directory's line, then [`supervise::supervise`], the summary (on
/// stderr and in the run directory) and, with `--json`, the result on stdout. Returns
/// pipette-run's exit code.
pub(super) fn supervise_job(
    config: &RunConfig,
    spec: &launch::JobSpec,
    first: launch::Attempt,
    trial: Option<&trial::TrialReport>,
    before: &Before<'_>,
) -> Result<i32, Error> {
    let start = Instant::now();
    let run_dir = spec.run_dir.clone();
    let events = event_log(&run_dir)?;
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
    let outcome = supervise::supervise(spec, first, &config.supervise, &events);
    let before = Before {
        ledger: LedgerInputs {
            wall: before.ledger.wall + start.elapsed(),
            ..before.ledger.clone()
        },
        yours: before.yours,
    };
    finish_outcome(config, &run_dir, &outcome, trial, &before)
}

/// The run directory's `events.jsonl`, begun.
pub(super) fn event_log(run_dir: &std::path::Path) -> Result<supervise::events::EventLog, Error> {
    supervise::events::EventLog::create(run_dir).map_err(|e| {
        Error::Usage(format!(
            "cannot write {}: {e} (choose another --run-dir)",
            run_dir.join("events.jsonl").display()
        ))
    })
}

/// The end of a job: the summary (on stderr and in the run directory) and, with `--json`,
/// the result on stdout. Returns pipette-run's exit code.
pub(super) fn finish_outcome(
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

/// `pipette calibrate`: the trial alone, its report written to `--out`.
pub(super) fn calibrate(config: &RunConfig, out: &std::path::Path) -> Result<(), Error> {
    let (inputs, profile) = gather_profiled(config)?;
    let options = config.planning.plan_options(&inputs.settings)?;
    let decided = job::decide(config, &inputs.settings, &profile, options, None)?;
    let spec = job::spec(config, &inputs.allocation, Purpose::Launch)?;
    if config.output.dry_run {
        let (commands, lines, notes) = trial::trial_commands(
            &spec,
            &decided.settings,
            &decided.plan,
            config.trial.iters,
            &[],
        )
        .map_err(job::JobError::from)?;
        print_trial_commands(&commands, &lines, &notes, None, config);
        return Ok(());
    }
    // One round: the trial of the plan as asked, fitted; the re-plan is only reported.
    let report = job::trial(config, &spec, &decided, &profile, 1, false, &tell)?.report;
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
    launched: Option<&[String]>,
    config: &RunConfig,
) {
    println!("\nTrial run, one command per node (unless --no-trial or --calibration):");
    // After the launch's commands, only what the trial changes of them.
    if let Some(changes) = launched.and_then(|l| trial_changes_to_human(l, lines, notes)) {
        print!("{changes}");
        for note in notes {
            print!("{}", wrap(&format!("  note: {note}\n"), WIDTH));
        }
        return;
    }
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

/// `pipette-run --dry-run` with planning off (`why`): the nodes, the world, the commands.
pub(super) fn dry_run_unplanned(config: &RunConfig, why: &str) -> Result<(), Error> {
    let prepared = job::unplanned::prepare(config, why)?;
    let spec = job::spec(config, &prepared.allocation, Purpose::Preview)?;
    let launch = job::preview_world(&spec, &prepared.world)?;
    let run_dir = &spec.run_dir;
    if config.output.json {
        let report = WorldDryRun {
            planning: "off",
            why,
            nodes: (&prepared.allocation).into(),
            script: job::inputs::script_section(&config.script),
            torchrun_passthrough: &config.launch.torchrun_passthrough,
            world: &prepared.world,
            deepspeed: prepared.deepspeed.as_ref(),
            launch: &launch,
            run_dir: run_dir.display().to_string(),
            notes: &prepared.notes,
            status: RENDERED_NOT_LAUNCHED,
        };
        println!("{}", to_json(&report)?);
        return Ok(());
    }
    let mut out = String::new();
    NodesSection::from(&prepared.allocation).write_human(&mut out);
    print!("{out}");
    println!();
    for note in &prepared.notes {
        println!("{note}");
    }
    println!("\nCommands, one per node, exactly as they would run:");
    for line in launch.command_lines() {
        println!("  {line}");
    }
    println!("\nRun directory: {}", run_dir.display());
    println!("\n{RENDERED_NOT_LAUNCHED}");
    Ok(())
}

/// Launches the world of a job with planning off (`why`) on the nodes found and supervises
/// it to the end (relaunching on the survivors after a node failure); returns
/// pipette-run's exit code, the job's.
pub(super) fn launch_unplanned(config: &RunConfig, why: &str) -> Result<i32, Error> {
    ending_on_signal(config, |stage| {
        stage.during = "the launch's preparation";
        let prepared = job::unplanned::prepare(config, why)?;
        for note in &prepared.notes {
            log::log(Level::Info, "job", note);
        }
        let spec = job::spec(config, &prepared.allocation, Purpose::Launch)?;
        stage.run_dir = Some(spec.run_dir.clone());
        let first = spec
            .prepare(1, Layout::World(prepared.world), None)
            .map_err(job::JobError::from)?;
        // With planning off, only --startup-timeout limits the silence (see RunConfig).
        supervise_job(config, &spec, first, None, &stage.before())
    })
}
