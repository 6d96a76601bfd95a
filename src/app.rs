//! The orchestrator: runs the stages in order for each command and turns the outcome
//! into an exit code. The only module that reads the outside world (environment,
//! files) and writes to the terminal.

use std::ffi::OsString;
use std::path::Path;

use clap::Parser;

use crate::cli::{
    DiscoveryOptions, EstimateArgs, ModelOptions, NodeRange, NprocPerNode, PipetteCli,
    PipetteCommand, PlanningOptions, RunCli, TorchrunOptions,
};
use crate::cluster::profile::{DeviceSelection, NodeSelection};
use crate::cluster::{self, ClusterProfile, ClusterSpec, Environment, Node, NodeSource, Slots};
use crate::config::{self, Settings};
use crate::error::Error;
use crate::exec::{self, SrunOptions, SshOptions, Transport};
use crate::launch;
use crate::model::memory::estimate_memory;
use crate::model::time::{self, TimeEstimate, TimeModel, TimeOptions, TimeRequest};
use crate::model::{params, Calibration, ParallelConfig, Placement};
use crate::plan::{self, Plan, PlanOptions};
use crate::profile::{self, ProfileOptions, ProgressBars};
use crate::render;
use crate::report::dry_run::{
    DryRunReport, HostLine, ModelSection, NodesSection, ProfileSummary, ScriptSection,
};
use crate::report::estimate::{EstimateReport, ModelTime, ParamsSection};
use crate::report::plan::plan_to_human;
use crate::supervise;
use crate::trial;

/// What a dry run did, when it had no profile to plan with.
const NO_PROFILE_YET: &str = "No cluster profile to plan with: give --cluster FILE (`pipette profile --out FILE` measures the allocated nodes).";

/// What a dry run did, when it planned.
const PLANNED_NOT_LAUNCHED: &str =
    "Dry run: planned and rendered; nothing was launched (launching lands in a later version).";

/// Runs `pipette-run` with these arguments; returns the process exit code.
pub fn pipette_run_main(args: impl IntoIterator<Item = OsString>) -> i32 {
    let cli = match RunCli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return clap_exit(e),
    };
    let env = current_environment();
    if !cli.pipette.dry_run {
        return match launch_and_supervise(&cli, &env) {
            Ok(code) => code,
            Err(e) => finish("pipette-run", Err(e)),
        };
    }
    finish("pipette-run", run(&cli, &env))
}

/// Runs `pipette` with these arguments; returns the process exit code.
pub fn pipette_main(args: impl IntoIterator<Item = OsString>) -> i32 {
    let cli = match PipetteCli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return clap_exit(e),
    };
    finish("pipette", pipette(&cli.command, &current_environment()))
}

fn run(cli: &RunCli, env: &Environment) -> Result<(), Error> {
    let mut run = gather_inputs(cli, env, false)?;
    plan_and_render(cli, env, &mut run)?;
    if cli.pipette.json {
        println!("{}", to_json(&run.report)?);
    } else {
        print!("{}", run.report.to_human());
        if let Some(plan) = &run.plan {
            println!();
            print!(
                "{}",
                plan_to_human(plan, run.runner_up.as_ref().map(|(c, t)| (c, t)))
            );
        }
        if let Some(launch) = &run.report.launch {
            println!("\nCommands, one per node, exactly as they would run:");
            for line in launch.command_lines() {
                println!("  {line}");
            }
        }
        if let Some(dir) = &run.report.run_dir {
            println!("\nRun directory: {dir}");
        }
        if let Some(plan) = run
            .plan
            .as_ref()
            .filter(|_| !cli.trial.no_trial && cli.planning.calibration.is_none())
        {
            let options = plan_options(&cli.planning, &run.settings, cli.pipette.seed)?;
            let template = job_template(cli, env, &run, options)?;
            let (_, lines, notes) =
                trial::trial_commands(&template, plan, cli.trial.trial_iters, &[])
                    .map_err(launch_error)?;
            print_trial_commands(&lines, &notes);
        }
    }
    Ok(())
}

/// Launches the job and supervises it to the end (re-planning after node failures):
/// discover, profile the nodes (or read --cluster), plan, run the trial and re-plan with
/// the fitted calibration (unless --no-trial or --calibration), render attempt 1 into the
/// run directory, then hand over to [`supervise::supervise`]. Returns pipette-run's exit
/// code: 0, the failing worker's, or 128 + a signal; errors before anything runs are the
/// usual [`Error`]s.
fn launch_and_supervise(cli: &RunCli, env: &Environment) -> Result<i32, Error> {
    let mut job = prepare_job(cli, env)?;
    let trial = if cli.trial.no_trial || cli.planning.calibration.is_some() {
        None
    } else {
        let (plan, report) = trial_and_replan(cli, &job, MAX_TRIAL_ROUNDS)?;
        job.plan = plan;
        job.template.plan_options.calibration = report.calibration.clone();
        Some(report)
    };
    let Job {
        template,
        profile,
        plan,
        ..
    } = job;
    let run_dir = template.run_dir.clone();
    let first = template
        .prepare(1, profile, plan, None)
        .map_err(launch_error)?;
    if let Some(report) = &trial {
        write_json(&run_dir.join("trial.json"), report, "--run-dir")?;
    }
    let events = supervise::events::EventLog::create(&run_dir).map_err(|e| {
        Error::Usage(format!(
            "cannot write {}: {e} (choose another --run-dir)",
            run_dir.join("events.jsonl").display()
        ))
    })?;
    for note in &first.spec.notes {
        eprintln!("pipette-run: {note}");
    }
    eprintln!(
        "pipette-run: run directory {} (launch scripts, plan, trial.json, logs/, events.jsonl)",
        run_dir.display()
    );
    let s = &cli.supervise;
    let options = supervise::SuperviseOptions {
        grace: s.grace,
        stall_timeout: (!s.stall_timeout.is_zero()).then_some(s.stall_timeout),
        startup_timeout: Some(s.startup_timeout.unwrap_or(s.stall_timeout))
            .filter(|d| !d.is_zero()),
        max_replans: s.max_replans,
        health_timeout: s.health_timeout,
        // With --json, stdout carries the one result object and nothing else.
        echo: if cli.pipette.json {
            supervise::Echo::Stderr
        } else {
            supervise::Echo::Streams
        },
        ..supervise::SuperviseOptions::default()
    };
    let outcome = supervise::supervise(&template, first, &options, &events);
    let summary = outcome.summary();
    eprint!("{summary}");
    if let Err(e) = std::fs::write(run_dir.join("summary.txt"), &summary) {
        eprintln!("pipette-run: warning: cannot write the summary into the run directory: {e}");
    }
    if cli.pipette.json {
        let result = LaunchResult {
            run_dir: run_dir.display().to_string(),
            outcome: &outcome,
            trial: trial.as_ref(),
        };
        println!("{}", to_json(&result)?);
    }
    Ok(outcome.exit_code)
}

/// What `pipette-run --json` prints on stdout when the job ends (the nodes' output goes
/// to stderr then).
#[derive(serde::Serialize)]
struct LaunchResult<'a> {
    run_dir: String,
    outcome: &'a supervise::Outcome,
    /// The trial run's measurements and fitted calibration, when one ran.
    trial: Option<&'a trial::TrialReport>,
}

/// A job ready to try or launch: its inputs, the nodes' profile, the first plan and what
/// every attempt shares.
struct Job {
    run: Run,
    profile: ClusterProfile,
    plan: Plan,
    template: launch::JobTemplate,
}

/// Discovers and profiles (or reads --cluster), plans, and builds the job template.
fn prepare_job(cli: &RunCli, env: &Environment) -> Result<Job, Error> {
    let run = gather_inputs(cli, env, true)?;
    let Some(profile) = run.profile.clone() else {
        return Err(Error::Internal(
            "no profile after profiling the nodes".to_string(),
        ));
    };
    let options = plan_options(&cli.planning, &run.settings, cli.pipette.seed)?;
    let plan = plan::plan(&run.settings, &profile, &options)?;
    let template = job_template(cli, env, &run, options)?;
    Ok(Job {
        run,
        profile,
        plan,
        template,
    })
}

/// What every attempt of the job shares, from the command line.
fn job_template(
    cli: &RunCli,
    env: &Environment,
    run: &Run,
    options: PlanOptions,
) -> Result<launch::JobTemplate, Error> {
    let workdir = std::env::current_dir()
        .map_err(|e| Error::Internal(format!("cannot read the working directory: {e}")))?;
    let rdzv_id = rendezvous_id(&cli.torchrun, run.report.nodes.job_id.as_deref());
    let run_dir = match &cli.launch.run_dir {
        Some(dir) => workdir.join(dir),
        None => render::default_run_dir(&workdir, &rdzv_id, unix_seconds()),
    };
    let templates = match &cli.launch.templates {
        Some(dir) => render::Templates::from_dir(dir)?,
        None => render::Templates::embedded(),
    };
    let hosts: Vec<String> = run
        .report
        .nodes
        .hosts
        .iter()
        .map(|h| h.host.clone())
        .collect();
    let mut ssh = SshOptions::default();
    if let Some(config) = &cli.supervise.ssh_config {
        ssh.extra_args = vec!["-F".to_string(), config.display().to_string()];
    }
    let transport = launch::choose_transport(
        cli.supervise.launcher.as_deref(),
        &hosts,
        &run.report.nodes.source,
        ssh,
    );
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    Ok(launch::JobTemplate {
        settings: run.settings.clone(),
        script: script_invocation(cli),
        torchrun: cli.supervise.torchrun.clone(),
        torchrun_spelling: installed_torchrun_spelling(&cli.supervise.torchrun),
        torchrun_passthrough: cli.torchrun.passthrough_args(),
        master_addr: explicit_master_addr(&cli.torchrun),
        master_port: cli.torchrun.master_port,
        rdzv_id,
        env: render::forwarded_env(env.iter().map(|(k, v)| (k.clone(), v.clone()))),
        workdir,
        run_dir,
        templates,
        plan_options: options,
        transport,
        run_id: format!("{}-{nanos}", std::process::id()),
    })
}

/// At most this many rounds of trial, fit and re-plan.
const MAX_TRIAL_ROUNDS: usize = 2;

/// Runs the trial of the job's plan (at each `--trial-micro-batches` size), fits the
/// calibration and re-plans with it. When the re-plan picks another configuration, or the
/// trial ran out of memory, the new plan is tried too (at most [`MAX_TRIAL_ROUNDS`]
/// rounds, `rounds` here). Returns the plan to launch and the report.
fn trial_and_replan(
    cli: &RunCli,
    job: &Job,
    rounds: usize,
) -> Result<(Plan, trial::TrialReport), Error> {
    let settings = &job.run.settings;
    let mut options = job.template.plan_options.clone();
    let before = options.calibration.clone();
    let progress = ProgressBars::new(!cli.pipette.json);
    let mut plan = job.plan.clone();
    let mut trials: Vec<(trial::TrialMeasurement, Placement)> = Vec::new();
    let mut report = None;
    for round in 0..rounds {
        let sizes = match (&cli.trial.trial_micro_batches, round) {
            (Some(list), 0) => list.clone(),
            _ => vec![plan.config.micro_batch],
        };
        let mut out_of_memory = None;
        for mbs in sizes {
            let mut tried = plan.clone();
            tried.config.micro_batch = mbs;
            let batch = mbs * tried.config.dp;
            if mbs == 0 || settings.training.global_batch_size % batch != 0 {
                return Err(Error::Usage(format!(
                    "--trial-micro-batches {mbs}: the global batch {} is not a multiple of micro-batch {mbs} × dp {} (choose sizes that divide it)",
                    settings.training.global_batch_size, tried.config.dp
                )));
            }
            eprintln!(
                "pipette-run: trial run: tp {} pp {} dp {} micro-batch {}, {} iterations",
                tried.config.tp, tried.config.pp, tried.config.dp, mbs, cli.trial.trial_iters
            );
            let request = trial::TrialRequest {
                template: &job.template,
                plan: &tried,
                iters: cli.trial.trial_iters,
                timeout: cli.trial.trial_timeout,
                command_timeout: std::time::Duration::from_secs(60),
                python: "python3",
            };
            match trial::run_trial(&request, &progress) {
                Ok(m) => trials.push((m, tried.placement.clone())),
                Err(e) if e.is_out_of_memory() && round + 1 < rounds => {
                    out_of_memory = Some((tried, e));
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if let Some((tried, e)) = out_of_memory {
            // The estimate was too low: raise the overhead until that configuration no
            // longer fits, and plan again.
            let peak = tried.estimate.peak_memory_bytes;
            let usable = tried.estimate.usable_memory_bytes;
            options.calibration.overhead_bytes += usable.saturating_sub(peak) + (1 << 20);
            eprintln!("pipette-run: the trial ran out of memory ({e}); re-planning with a larger memory estimate");
            plan = plan::plan(settings, &job.profile, &options)?;
            continue;
        }
        let fitted = trial::calibrate(
            settings,
            &job.profile,
            &trials,
            &before,
            options.time_options,
        )?;
        options.calibration = fitted.calibration.clone();
        eprint!("{}", indent_lines(&fitted.to_human(), "pipette-run: "));
        report = Some(fitted);
        let replanned = plan::plan(settings, &job.profile, &options)?;
        let changed = replanned.config != plan.config;
        if changed {
            eprintln!(
                "pipette-run: re-planned with the calibrated estimates: tp {} pp {} dp {} micro-batch {} (was tp {} pp {} dp {} micro-batch {})",
                replanned.config.tp,
                replanned.config.pp,
                replanned.config.dp,
                replanned.config.micro_batch,
                plan.config.tp,
                plan.config.pp,
                plan.config.dp,
                plan.config.micro_batch
            );
        }
        plan = replanned;
        if !changed || round + 1 == rounds {
            break;
        }
    }
    let report = report.ok_or_else(|| Error::Internal("no trial was measured".to_string()))?;
    Ok((plan, report))
}

fn indent_lines(text: &str, prefix: &str) -> String {
    text.lines().map(|l| format!("{prefix}{l}\n")).collect()
}

/// `pipette calibrate`: the trial alone, its report written to `--out`.
fn calibrate(args: &crate::cli::CalibrateArgs, env: &Environment) -> Result<(), Error> {
    let cli = &args.run;
    let job = prepare_job(cli, env)?;
    if cli.pipette.dry_run {
        let (_, lines, notes) =
            trial::trial_commands(&job.template, &job.plan, cli.trial.trial_iters, &[])
                .map_err(launch_error)?;
        print_trial_commands(&lines, &notes);
        return Ok(());
    }
    // One round: the trial of the plan as asked, fitted; the re-plan is only reported.
    let (_, report) = trial_and_replan(cli, &job, 1)?;
    write_json(&args.out, &report, "--out")?;
    if cli.pipette.json {
        println!("{}", to_json(&report)?);
    } else {
        print!("{}", report.to_human());
        println!("written to {}", args.out.display());
    }
    Ok(())
}

fn print_trial_commands(lines: &[String], notes: &[String]) {
    println!("\nTrial run, one command per node (unless --no-trial or --calibration):");
    for line in lines {
        println!("  {line}");
    }
    for note in notes {
        println!("  note: {note}");
    }
}

fn launch_error(e: launch::LaunchError) -> Error {
    match e {
        launch::LaunchError::Plan(e) => Error::Plan(e),
        launch::LaunchError::Render(e) => Error::Render(e),
        launch::LaunchError::PlanJson(e) => Error::Internal(e),
    }
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T, option: &str) -> Result<(), Error> {
    std::fs::write(path, format!("{}\n", to_json(value)?)).map_err(|e| {
        Error::Usage(format!(
            "cannot write {}: {e} (choose another {option})",
            path.display()
        ))
    })
}

/// A calibration file: `pipette calibrate`'s report (its `calibration`), or a bare
/// calibration object.
fn read_calibration(path: &Path) -> Result<Calibration, Error> {
    let bad = |detail: String| {
        Error::Usage(format!(
            "--calibration {}: {detail} (give a file `pipette calibrate --out FILE` wrote)",
            path.display()
        ))
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let object = value.get("calibration").cloned().unwrap_or(value);
    serde_json::from_value(object).map_err(|e| bad(e.to_string()))
}

/// A run's inputs and what the planner and renderer made of them.
struct Run {
    report: DryRunReport,
    settings: Settings,
    /// The cluster profile narrowed to the allocated nodes and GPUs.
    profile: Option<ClusterProfile>,
    plan: Option<Plan>,
    runner_up: Option<(ParallelConfig, TimeEstimate)>,
}

/// Plans on the profile (when there is one), renders the launch, writes the run directory.
fn plan_and_render(cli: &RunCli, env: &Environment, run: &mut Run) -> Result<(), Error> {
    let Some(profile) = &run.profile else {
        run.report.status = NO_PROFILE_YET.to_string();
        return Ok(());
    };
    let options = plan_options(&cli.planning, &run.settings, cli.pipette.seed)?;
    let plan = plan::plan(&run.settings, profile, &options)?;
    run.runner_up = runner_up(&plan, &run.settings, profile, &options);
    // The same template the launch renders with, so the preview is what would run.
    let mut template = job_template(cli, env, run, options)?;
    template.run_id.clear();
    let run_dir = template.run_dir.clone();
    let launch = template
        .render(&plan, None, &run_dir)
        .map_err(launch_error)?;
    render::write_run_dir(&launch, &run_dir)?;
    run.report.run_dir = Some(run_dir.display().to_string());
    run.report.launch = Some(launch);
    run.report.plan = Some(
        serde_json::to_value(&plan)
            .map_err(|e| Error::Internal(format!("writing the plan: {e}")))?,
    );
    run.report.status = PLANNED_NOT_LAUNCHED.to_string();
    run.plan = Some(plan);
    Ok(())
}

/// How to reach the nodes: as asked, else locally when every node is this machine,
/// with srun inside a Slurm allocation, else over ssh.
fn transport_for(asked: Option<&str>, spec: &ClusterSpec) -> Transport {
    match asked {
        Some("local") => Transport::Local,
        Some("srun") => Transport::Srun(SrunOptions::default()),
        Some(_) => Transport::Ssh(SshOptions::default()),
        None if spec.nodes.iter().all(|n| exec::is_local_host(&n.host))
            || spec.source == NodeSource::Local =>
        {
            Transport::Local
        }
        None if matches!(spec.source, NodeSource::Slurm { .. }) => {
            Transport::Srun(SrunOptions::default())
        }
        None => Transport::Ssh(SshOptions::default()),
    }
}

/// The planner's options from the command line; the time options from the Megatron
/// arguments.
fn plan_options(
    planning: &PlanningOptions,
    settings: &Settings,
    seed: u64,
) -> Result<PlanOptions, Error> {
    let mut options = PlanOptions {
        seed,
        mapping: planning.mapping,
        budget: planning.budget,
        top_k: planning.top_k.max(1),
        time_options: TimeOptions::from_training(&settings.training),
        ..PlanOptions::default()
    };
    if let Some(headroom) = planning.memory_headroom {
        options.headroom = headroom;
    }
    if let Some(path) = &planning.calibration {
        options.calibration = read_calibration(path)?;
    }
    Ok(options)
}

/// The second-best configuration on its own best mapping, so the report can say what
/// makes the winner win.
fn runner_up(
    plan: &Plan,
    settings: &Settings,
    profile: &ClusterProfile,
    options: &PlanOptions,
) -> Option<(ParallelConfig, TimeEstimate)> {
    let second = plan.top.get(1)?;
    let request = TimeRequest {
        model: &settings.model,
        training: &settings.training,
        config: &second.config,
        cluster: profile,
        placement: &second.placement,
        calibration: &options.calibration,
        options: options.time_options,
    };
    let estimate = time::estimate(&request, TimeModel::Pipette).ok()?;
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
        std::time::Duration::from_secs(30),
    ) {
        Ok(out) if out.status.success() => render::TorchrunSpelling::from_help(&out.stdout_text()),
        _ => render::TorchrunSpelling::Dashes,
    }
}

/// torchrun's `--rdzv-id` when the user set one, else the scheduler's job id, else one
/// made from the time (the static rendezvous only needs it to be the same on all nodes).
fn rendezvous_id(torchrun: &TorchrunOptions, job_id: Option<&str>) -> String {
    if torchrun.rdzv_id != "none" {
        return torchrun.rdzv_id.clone();
    }
    job_id
        .map(str::to_string)
        .unwrap_or_else(|| format!("pipette-{}", unix_seconds()))
}

/// The user's `--master-addr`, unless it is torchrun's default (then the host with node
/// rank 0 is the master).
fn explicit_master_addr(torchrun: &TorchrunOptions) -> Option<String> {
    torchrun.master_addr.clone()
}

fn script_invocation(cli: &RunCli) -> render::ScriptInvocation {
    render::ScriptInvocation {
        program: cli.script().to_string(),
        module: cli.torchrun.module,
        no_python: cli.torchrun.no_python,
        run_path: cli.torchrun.run_path,
        args: cli.script_args().to_vec(),
    }
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn pipette(command: &PipetteCommand, env: &Environment) -> Result<(), Error> {
    match command {
        PipetteCommand::Discover { discovery, output } => {
            let (spec, warnings) = discover_nodes(discovery, env)?;
            for w in &warnings {
                eprintln!("pipette: warning: {w}");
            }
            if output.json {
                println!("{}", to_json(&spec)?);
            } else {
                for node in &spec.nodes {
                    match node.slots.count() {
                        Some(n) => println!("{} slots={n}", node.host),
                        None => println!("{}", node.host),
                    }
                }
            }
            Ok(())
        }
        PipetteCommand::Cluster { file, output } => {
            let profile = ClusterProfile::load(file)?;
            if output.json {
                println!("{}", profile.to_json_pretty());
            } else {
                let s = profile_summary(file, &profile);
                println!(
                    "{}: valid, {} nodes, {} GPUs ({})",
                    s.path,
                    s.nodes,
                    s.gpus,
                    if s.gpu_models.is_empty() {
                        "GPU models unknown".to_string()
                    } else {
                        s.gpu_models.join(", ")
                    }
                );
                if let Some((lo, hi)) = s.node_link_gbps {
                    println!("node-to-node bandwidth {lo:.2}–{hi:.2} GB/s");
                }
            }
            Ok(())
        }
        PipetteCommand::Model {
            model,
            output,
            megatron_args,
        } => {
            let settings = read_settings(model, megatron_args)?;
            let section = model_section(&settings);
            if output.json {
                #[derive(serde::Serialize)]
                struct ModelReport<'a> {
                    model: &'a ModelSection,
                    training: &'a config::TrainingSettings,
                    constraints: &'a config::Constraints,
                }
                let report = ModelReport {
                    model: &section,
                    training: &settings.training,
                    constraints: &settings.constraints,
                };
                println!("{}", to_json(&report)?);
            } else {
                let spec = &section.spec;
                println!(
                    "{}: {} parameters ({})",
                    spec.preset.as_deref().unwrap_or("model"),
                    crate::report::thousands(section.parameters),
                    crate::report::short_count(section.parameters)
                );
            }
            Ok(())
        }
        PipetteCommand::Estimate(args) => {
            let report = estimate(args)?;
            if args.output.json {
                println!("{}", to_json(&report)?);
            } else {
                print!("{}", report.to_human());
            }
            Ok(())
        }
        PipetteCommand::Plan(args) => {
            let (spec, warnings) = discover_nodes(&args.discovery, env)?;
            let Some(path) = &args.discovery.cluster else {
                return Err(Error::Usage(
                    "pipette plan needs a cluster profile: give --cluster FILE (`pipette profile --out FILE` measures the nodes)"
                        .to_string(),
                ));
            };
            let full = ClusterProfile::load(path)?;
            let settings = read_settings(&args.model, &args.megatron_args)?;
            let nodes = nodes_section(
                spec,
                warnings,
                Some((path, &full)),
                None,
                args.nproc_per_node,
            )?;
            for w in &nodes.warnings {
                eprintln!("pipette: warning: {w}");
            }
            let profile = allocated_part(path, &full, &nodes)?;
            let options = plan_options(&args.planning, &settings, args.output.seed)?;
            let plan = plan::plan(&settings, &profile, &options)?;
            if args.output.json {
                println!("{}", to_json(&plan)?);
            } else {
                let runner_up = runner_up(&plan, &settings, &profile, &options);
                print!(
                    "{}",
                    plan_to_human(&plan, runner_up.as_ref().map(|(c, t)| (c, t)))
                );
            }
            Ok(())
        }
        PipetteCommand::Profile(args) => {
            let (spec, warnings) = discover_nodes(&args.discovery, env)?;
            for w in &warnings {
                eprintln!("pipette: warning: {w}");
            }
            let options = ProfileOptions {
                transport: transport_for(args.launcher.as_deref(), &spec),
                nproc_per_node: args.nproc_per_node,
                torchrun: args.torchrun.clone(),
                reprofile: args.profiling.reprofile,
                env: render::forwarded_env(env.iter().map(|(k, v)| (k.clone(), v.clone())))
                    .into_iter()
                    .collect(),
                ..ProfileOptions::default()
            };
            let progress = ProgressBars::new(!args.output.json);
            let run = profile::run_profile(&spec, &options, &progress)?;
            let text = run.profile.to_json_pretty();
            std::fs::write(&args.out, &text).map_err(|e| {
                Error::Usage(format!(
                    "cannot write {}: {e} (choose another --out)",
                    args.out.display()
                ))
            })?;
            for note in &run.notes {
                eprintln!("pipette: {note}");
            }
            if args.output.json {
                println!("{text}");
            } else {
                let s = profile_summary(&args.out, &run.profile);
                println!(
                    "{}: {} nodes, {} GPUs ({}){}",
                    s.path,
                    s.nodes,
                    s.gpus,
                    s.gpu_models.join(", "),
                    s.node_link_gbps
                        .map(|(lo, hi)| format!(", node links {lo:.2}–{hi:.2} GB/s"))
                        .unwrap_or_default()
                );
            }
            Ok(())
        }
        PipetteCommand::Calibrate(args) => calibrate(args, env),
        PipetteCommand::Presets { output } => {
            let names = config::presets::names();
            if output.json {
                println!("{}", to_json(&names)?);
            } else {
                for name in names {
                    println!("{name}");
                }
            }
            Ok(())
        }
    }
}

/// Costs one configuration: memory always, time when a cluster is given.
fn estimate(args: &EstimateArgs) -> Result<EstimateReport, Error> {
    let settings = read_settings(&args.model, &args.megatron_args)?;
    let cluster = match &args.cluster {
        Some(path) => Some(ClusterProfile::load(path)?),
        None => None,
    };
    let config = estimate_config(args, &settings, cluster.as_ref())?;
    let model = &settings.model;
    let training = &settings.training;
    let calibration = match &args.calibration {
        Some(path) => read_calibration(path)?,
        None => Calibration::default(),
    };
    let memory = estimate_memory(model, training, &config, &calibration);
    let breakdown = params::ParameterBreakdown::new(model, config.tp);
    let last = config.layers_per_stage.len().saturating_sub(1);
    let per_stage = config
        .layers_per_stage
        .iter()
        .enumerate()
        .map(|(i, layers)| breakdown.stage(*layers, i == 0, i == last))
        .collect();
    let mut report = EstimateReport {
        params: ParamsSection {
            total: breakdown.total(),
            per_stage,
        },
        memory,
        gpu_memory_bytes: None,
        time: None,
        time_models: Vec::new(),
        config,
    };
    if let Some(cluster) = &cluster {
        report.gpu_memory_bytes = cluster
            .nodes
            .iter()
            .filter_map(|n| n.gpus())
            .flatten()
            .map(|g| g.memory_bytes)
            .min();
        let gpus_per_node = cluster.nodes[0].gpus().map_or(0, <[_]>::len);
        let placement = Placement::identity(report.config.world_size() as usize, gpus_per_node);
        let request = TimeRequest {
            model,
            training,
            config: &report.config,
            cluster,
            placement: &placement,
            calibration: &calibration,
            options: TimeOptions::from_training(training),
        };
        for time_model in TimeModel::ALL {
            let estimate = time::estimate(&request, time_model)?;
            report.time_models.push(ModelTime {
                model: time_model,
                iteration_ms: estimate.iteration_ms,
            });
            if time_model == args.time_model {
                report.time = Some(estimate);
            }
        }
    }
    Ok(report)
}

/// The configuration `pipette estimate` costs: its flags, else the Megatron arguments'.
fn estimate_config(
    args: &EstimateArgs,
    settings: &Settings,
    cluster: Option<&ClusterProfile>,
) -> Result<ParallelConfig, Error> {
    let t = &settings.training;
    let layers = settings.model.num_layers;
    let tp = args.tp.unwrap_or(t.tensor_parallel).max(1);
    let pp = args.pp.unwrap_or(t.pipeline_parallel).max(1);
    let cluster_gpus = cluster
        .and_then(ClusterProfile::gpu_count)
        .map(|g| g as u64);
    let dp = match (args.dp, cluster_gpus) {
        (Some(dp), _) => dp.max(1),
        (None, Some(gpus)) if gpus >= tp * pp => gpus / (tp * pp),
        _ => 1,
    };
    let mut config = ParallelConfig::even(
        layers,
        tp,
        pp,
        dp,
        args.mbs.unwrap_or(t.micro_batch_size).max(1),
    );
    config.vpp = args.vpp.or(t.virtual_pipeline).filter(|v| *v > 1);
    config.recompute = args
        .recompute
        .clone()
        .unwrap_or_else(|| t.recompute.clone());
    config.sequence_parallel = (args.sequence_parallel || t.sequence_parallel) && tp > 1;
    config.distributed_optimizer = args.distributed_optimizer || t.distributed_optimizer;
    match &args.layers_per_stage {
        Some(split) => {
            if split.len() as u64 != pp || split.iter().sum::<u64>() != layers {
                return Err(Error::Usage(format!(
                    "--layers-per-stage {} must give {pp} stage sizes that add up to the model's {layers} layers",
                    split.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
                )));
            }
            config.layers_per_stage = split.clone();
        }
        None if layers % pp != 0 => {
            return Err(Error::Usage(format!(
                "--pp {pp} does not divide the model's {layers} layers (choose another --pp, or give --layers-per-stage)"
            )));
        }
        None => {}
    }
    let model = &settings.model;
    if model.num_attention_heads % tp != 0 || model.num_query_groups % tp != 0 {
        return Err(Error::Usage(format!(
            "--tp {tp} must divide the {} attention heads and {} query groups",
            model.num_attention_heads, model.num_query_groups
        )));
    }
    if let Some(gpus) = cluster_gpus.filter(|g| config.world_size() > *g) {
        return Err(Error::Usage(format!(
            "tp {tp} × pp {pp} × dp {dp} needs {} GPUs but the cluster has {gpus} (lower --dp)",
            config.world_size()
        )));
    }
    if t.global_batch_size % (config.micro_batch * dp) != 0 {
        return Err(Error::Usage(format!(
            "the global batch {} is not divisible by micro-batch {} × dp {dp} (change --mbs or --dp)",
            t.global_batch_size, config.micro_batch
        )));
    }
    Ok(config)
}

/// Reads every input of a run: the nodes, the cluster profile (--cluster, else, when
/// `measure`, the nodes are profiled as `pipette profile` does, with its cache), the model
/// and training settings, and the script. Nothing is planned or launched.
fn gather_inputs(cli: &RunCli, env: &Environment, measure: bool) -> Result<Run, Error> {
    let (spec, warnings) = discover_nodes(&cli.discovery, env)?;
    // Read the settings first: a mistake there is cheaper to report than after profiling.
    let settings = read_settings(&cli.model, cli.script_args())?;
    let profile = match &cli.discovery.cluster {
        Some(path) => Some((path.clone(), ClusterProfile::load(path)?)),
        None if measure => Some(measure_nodes(cli, env, &spec)?),
        None => None,
    };
    let profile = profile.as_ref().map(|(p, c)| (p.as_path(), c));
    let nodes = nodes_section(
        spec,
        warnings,
        profile,
        cli.torchrun.nnodes,
        cli.torchrun.nproc_per_node,
    )?;
    let allocated = match &profile {
        Some((path, full)) => Some(allocated_part(path, full, &nodes)?),
        None => None,
    };
    let report = DryRunReport {
        cluster_profile: profile.as_ref().map(|(p, c)| profile_summary(p, c)),
        nodes,
        script: script_section(cli),
        model: model_section(&settings),
        training: settings.training.clone(),
        constraints: settings.constraints.clone(),
        torchrun_passthrough: cli.torchrun.passthrough_args(),
        plan: None,
        launch: None,
        run_dir: None,
        status: NO_PROFILE_YET.to_string(),
    };
    Ok(Run {
        report,
        settings,
        profile: allocated,
        plan: None,
        runner_up: None,
    })
}

/// Profiles the discovered nodes (or reuses the cached profile of the same nodes); returns
/// the cache file's path (or a description) and the profile.
fn measure_nodes(
    cli: &RunCli,
    env: &Environment,
    spec: &ClusterSpec,
) -> Result<(std::path::PathBuf, ClusterProfile), Error> {
    let options = ProfileOptions {
        transport: transport_for(cli.supervise.launcher.as_deref(), spec),
        nproc_per_node: match cli.torchrun.nproc_per_node {
            Some(NprocPerNode::Count(n)) => Some(n),
            _ => None,
        },
        torchrun: cli.supervise.torchrun.clone(),
        env: render::forwarded_env(env.iter().map(|(k, v)| (k.clone(), v.clone())))
            .into_iter()
            .collect(),
        reprofile: cli.profiling.reprofile,
        ..ProfileOptions::default()
    };
    eprintln!(
        "pipette-run: no --cluster given: profiling the {} node(s) found",
        spec.nodes.len()
    );
    let progress = ProgressBars::new(!cli.pipette.json);
    let run = profile::run_profile(spec, &options, &progress)?;
    for note in &run.notes {
        eprintln!("pipette-run: {note}");
    }
    let path = run
        .cache_file
        .clone()
        .unwrap_or_else(|| "the measured profile".into());
    Ok((path, run.profile))
}

/// The profile narrowed to the hosts found and the GPUs each may use.
fn allocated_part(
    path: &Path,
    profile: &ClusterProfile,
    nodes: &NodesSection,
) -> Result<ClusterProfile, Error> {
    let selections: Vec<NodeSelection<'_>> = nodes
        .hosts
        .iter()
        .map(|h| NodeSelection {
            host: &h.host,
            devices: match (&h.devices, h.workers) {
                (Some(d), _) => DeviceSelection::Indices(d.clone()),
                (None, Some(n)) => DeviceSelection::First(n as usize),
                (None, None) => DeviceSelection::All,
            },
        })
        .collect();
    profile.subset(&selections).map_err(|problem| {
        Error::ClusterMismatch(format!(
            "{}: {problem}, which the allocation includes (profile the allocated nodes again, or pass a cluster file that covers them)",
            path.display()
        ))
    })
}

fn discover_nodes(
    options: &DiscoveryOptions,
    env: &Environment,
) -> Result<(ClusterSpec, Vec<String>), Error> {
    let request = cluster::DiscoveryRequest {
        hostfile: options.hostfile.clone(),
        hosts: options.hosts.clone(),
        include: options.include.clone(),
        exclude: options.exclude.clone(),
    };
    let found = cluster::discover(&request, env, &local_hostname())?;
    Ok((found.spec, found.warnings))
}

fn read_settings(options: &ModelOptions, megatron_args: &[String]) -> Result<Settings, Error> {
    let pins = match &options.pin {
        Some(text) => config::megatron::parse_pins(text)?,
        None => Vec::new(),
    };
    Ok(config::settings_from_megatron_args(
        megatron_args,
        options.preset.as_deref(),
        &pins,
    )?)
}

/// Decides the hosts and how many workers each runs: discovery's nodes (or the cluster
/// file's, when there is no allocation), `--nproc-per-node`, and `--nnodes` checked
/// against what was found.
fn nodes_section(
    mut spec: ClusterSpec,
    warnings: Vec<String>,
    profile: Option<(&Path, &ClusterProfile)>,
    nnodes: Option<NodeRange>,
    nproc_per_node: Option<NprocPerNode>,
) -> Result<NodesSection, Error> {
    if let Some((path, profile)) = profile {
        let profiled = profile_hosts(profile);
        if spec.source == NodeSource::Local {
            spec.nodes = profiled
                .iter()
                .map(|(host, gpus)| Node {
                    host: host.clone(),
                    slots: gpus.map_or(Slots::Unknown, Slots::Count),
                })
                .collect();
            spec.source = NodeSource::ClusterFile {
                path: path.display().to_string(),
            };
        } else if let Some(missing) = spec
            .nodes
            .iter()
            .find(|n| !profiled.iter().any(|(h, _)| h == &n.host))
        {
            return Err(Error::ClusterMismatch(format!(
                "{}: has no node {:?}, which the allocation includes (profile the allocated nodes again, or pass a cluster file that covers them)",
                path.display(),
                missing.host
            )));
        }
    }
    if let Some(range) = nnodes {
        check_node_count(range, &spec)?;
    }
    let gpu_model = |host: &str| {
        profile.and_then(|(_, p)| {
            p.nodes
                .iter()
                .find(|n| n.host == host)
                .and_then(|n| n.gpus()?.first().map(|g| g.name.clone()))
        })
    };
    let mut hosts = Vec::with_capacity(spec.nodes.len());
    for node in &spec.nodes {
        let known = node.slots.count().or_else(|| {
            profile.and_then(|(_, p)| {
                profile_hosts(p)
                    .into_iter()
                    .find(|(h, _)| h == &node.host)
                    .and_then(|(_, g)| g)
            })
        });
        let workers = match nproc_per_node {
            Some(NprocPerNode::Count(n)) => {
                if let Some(have) = known.filter(|have| n > *have) {
                    return Err(Error::Usage(format!(
                        "--nproc-per-node {n} but node {} has only {have} GPU slots (lower --nproc-per-node, or leave it out to use every GPU found)",
                        node.host
                    )));
                }
                Some(n)
            }
            None => Some(known.unwrap_or(1)),
            Some(NprocPerNode::Gpu | NprocPerNode::Auto) => known,
            Some(NprocPerNode::Cpu | NprocPerNode::Xpu) => None,
        };
        hosts.push(HostLine {
            host: node.host.clone(),
            workers,
            devices: match &node.slots {
                Slots::Devices(d) => Some(d.clone()),
                _ => None,
            },
            gpu: gpu_model(&node.host),
        });
    }
    let world_size = hosts
        .iter()
        .map(|h| h.workers.map(u64::from))
        .sum::<Option<u64>>();
    Ok(NodesSection {
        source: spec.source,
        job_id: spec.job_id,
        hosts,
        world_size,
        warnings,
    })
}

fn check_node_count(range: NodeRange, spec: &ClusterSpec) -> Result<(), Error> {
    let found = spec.nodes.len();
    if range.contains(found) {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "--nnodes {range} but {found} node{} found ({}) (pipette-run uses the nodes it discovers: drop --nnodes, or fix the node list)",
        if found == 1 { " was" } else { "s were" },
        spec.nodes
            .iter()
            .map(|n| n.host.as_str())
            .collect::<Vec<_>>()
            .join(",")
    )))
}

/// Each profiled host and its GPU count (`None` when the file has no inventory).
fn profile_hosts(profile: &ClusterProfile) -> Vec<(String, Option<u32>)> {
    profile
        .nodes
        .iter()
        .map(|n| (n.host.clone(), n.gpus().map(|g| g.len() as u32)))
        .collect()
}

fn profile_summary(path: &Path, profile: &ClusterProfile) -> ProfileSummary {
    let mut gpu_models: Vec<String> = Vec::new();
    for gpu in profile.nodes.iter().filter_map(|n| n.gpus()).flatten() {
        if !gpu_models.contains(&gpu.name) {
            gpu_models.push(gpu.name.clone());
        }
    }
    let links = &profile.node_links;
    let node_link_gbps = links.min_link().zip(links.max_link());
    ProfileSummary {
        path: path.display().to_string(),
        nodes: profile.nodes.len(),
        gpus: profile.gpu_count().unwrap_or(0),
        gpu_models,
        node_link_gbps,
    }
}

fn model_section(settings: &Settings) -> ModelSection {
    ModelSection {
        spec: settings.model.clone(),
        parameters: params::total_parameters(&settings.model, 1),
        padded_vocab_size: params::padded_vocab_size(&settings.model, 1),
    }
}

fn script_section(cli: &RunCli) -> ScriptSection {
    let t = &cli.torchrun;
    // torchrun's own precedence: --run-path over --no-python; -m is independent.
    let launch = if t.run_path {
        "run-path"
    } else if t.no_python {
        "no-python"
    } else if t.module {
        "module"
    } else {
        "python"
    };
    ScriptSection {
        program: cli.script().to_string(),
        launch,
        args: cli.script_args().to_vec(),
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, Error> {
    serde_json::to_string_pretty(value).map_err(|e| Error::Internal(format!("writing JSON: {e}")))
}

/// The environment as discovery sees it. Non-UTF-8 variables are left out: none of
/// the variables discovery reads can legitimately hold them.
fn current_environment() -> Environment {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// This machine's name, for a run without an allocation.
fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}

/// Prints an error the way every pipette error reads, and returns its exit code.
fn finish(program: &str, result: Result<(), Error>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{program}: error: {e}");
            e.exit_code().code()
        }
    }
}

/// Prints clap's message (help, version, or a usage error) and returns its exit code:
/// 0 for help and version, 2 for a malformed command line, as torchrun does.
fn clap_exit(e: clap::Error) -> i32 {
    let _ = e.print();
    e.exit_code()
}
