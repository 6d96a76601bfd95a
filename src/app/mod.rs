//! The orchestrator: runs the stages in order for each command and turns the outcome
//! into an exit code. The only module that reads the outside world (environment,
//! files) and writes to the terminal.
//!
//! The command line and environment are resolved once into a
//! [`RunConfig`](crate::cli::RunConfig) that the rest of the orchestrator reads (no clap
//! types below the entry points).
//!
//! - `run`: `pipette-run` — the dry run, and the launch (profile, plan, trial, launch,
//!   supervise), planned or not, as a straight sequence of the [`crate::job`] stage's
//!   steps; `pipette calibrate` (the trial alone);
//! - `interrupt`: a stop signal before the supervisor takes over, recorded as it would;
//! - `copies`: one pipette-run per node — the leader's run over the copies' nodes, or an
//!   agent's life;
//! - `commands`: the `pipette` subcommands, one file each (`doctor` among them).

mod commands;
mod copies;
mod interrupt;
mod run;

use std::ffi::OsString;
use std::path::Path;

use crate::cluster::Environment;
use crate::error::Error;
use crate::log;
use crate::render;

use crate::cli::resolved::{self, RunConfig};

pub use crate::job::installed_torchrun_spelling;

/// Runs `pipette-run` with these arguments; returns the process exit code.
pub fn pipette_run_main(args: impl IntoIterator<Item = OsString>) -> i32 {
    let args: Vec<OsString> = args.into_iter().collect();
    // The leader runs this binary as the relay of the agent transport (see exec::agent).
    if args
        .get(1)
        .is_some_and(|a| a == crate::exec::agent::RELAY_FLAG)
    {
        return crate::exec::agent::relay_main();
    }
    log::init("pipette-run", log::Filter::new(log::Level::Info));
    // Read as far as the command line can be: `--config`, and `--json`, so that an error
    // found before the full parse is still one JSON object on stdout for a tool (after
    // it, the parsed `--json` decides).
    let early = crate::cli::site_config_matches(&args);
    let early_finish = |result| finish_as(crate::cli::json_requested(&early, &args), result);
    let site = match crate::cli::site::load(&early) {
        Ok(site) => site,
        Err(message) => return early_finish(Err(Error::Usage(message))),
    };
    let cli = match crate::cli::parse_run(&args, site.as_ref()) {
        Ok(cli) => cli,
        Err(e) => {
            let command = crate::cli::run_command();
            return match blame_environment(&e, &command, &args) {
                Some(e) => early_finish(Err(e)),
                None => clap_exit(e, crate::cli::json_requested(&early, &args)),
            };
        }
    };
    let finish = |result| finish_as(cli.pipette.json, result);
    let env = current_environment();
    match resolved::log_filter(&cli.log, &env) {
        Ok(filter) => log::init("pipette-run", filter),
        Err(e) => return finish(Err(e.into())),
    }
    let mut config = RunConfig::resolve(&cli, env);
    // Before anything runs: a misspelt or misplaced option is cheap to fix now.
    for warning in cli.script_argument_warnings(config.planning_off().is_none()) {
        log::warn(&warning);
    }
    if let Err(e) = config.resolve_node_env() {
        return finish(Err(e.into()));
    }
    match copies::detect(&config, cli.torchrun.local_addr.as_deref()) {
        Err(e) => finish(Err(e)),
        Ok(Some(found)) => copies::run_copy(config, found, drive),
        Ok(None) => drive(&config),
    }
}

/// The single driver's run (also the leader's, of one copy per node). A launch has the
/// signal handlers in place from here to the end (see [`crate::exec::signals`]); a dry run
/// runs nothing on the nodes, so a signal ends it at once, as it always did.
fn drive(config: &RunConfig) -> i32 {
    let finish = |result| finish_as(config.output.json, result);
    let _signals = (!config.output.dry_run).then(crate::exec::signals::SignalGuard::install);
    // An existing --run-dir is refused before anything runs (profiling, the trial).
    if let Some(dir) = &config.launch.run_dir {
        if let Err(e) = render::refuse_existing_run_dir(dir) {
            return finish(Err(e.into()));
        }
    }
    if let Some(why) = config.planning_off() {
        return match config.output.dry_run {
            true => finish(run::dry_run_unplanned(config, &why)),
            false => match run::launch_unplanned(config, &why) {
                Ok(code) => code,
                Err(e) => finish(Err(e)),
            },
        };
    }
    if !config.output.dry_run {
        return match run::launch_and_supervise(config) {
            Ok(code) => code,
            Err(e) => finish(Err(e)),
        };
    }
    finish(run::dry_run(config))
}

/// Runs `pipette` with these arguments; returns the process exit code.
pub fn pipette_main(args: impl IntoIterator<Item = OsString>) -> i32 {
    let args: Vec<OsString> = args.into_iter().collect();
    log::init("pipette", log::Filter::new(log::Level::Info));
    // `pipette calibrate` runs the trial of a pipette-run job: the site configuration
    // gives its options' defaults as it does pipette-run's.
    let site = match crate::cli::calibrate_site_config_matches(&args)
        .map(|m| crate::cli::site::load(&m))
    {
        Some(Err(message)) => return finish(Err(Error::Usage(message))),
        Some(Ok(site)) => site,
        None => None,
    };
    let cli = match crate::cli::parse_pipette(&args, site.as_ref()) {
        Ok(cli) => cli,
        Err(e) => {
            return match blame_environment(&e, &crate::cli::pipette_command(), &args) {
                Some(e) => finish(Err(e)),
                None => clap_exit(e, false),
            }
        }
    };
    let env = current_environment();
    let options = match &cli.command {
        crate::cli::PipetteCommand::Calibrate(args) => args.run.log.clone(),
        _ => crate::cli::LogOptions::default(),
    };
    match resolved::log_filter(&options, &env) {
        Ok(filter) => log::init("pipette", filter),
        Err(e) => return finish(Err(e.into())),
    }
    match &cli.command {
        // The one subcommand whose exit code is not an error's: it reports every problem.
        crate::cli::PipetteCommand::Doctor(args) => commands::doctor::main(args, &env),
        command => finish(commands::pipette(command, &env)),
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, Error> {
    serde_json::to_string_pretty(value).map_err(|e| Error::Internal(format!("writing JSON: {e}")))
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T, option: &str) -> Result<(), Error> {
    std::fs::write(path, format!("{}\n", to_json(value)?)).map_err(|e| {
        Error::Usage(format!(
            "cannot write {}: {e} (choose another {option})",
            path.display()
        ))
    })
}

/// The environment as discovery sees it. Non-UTF-8 variables are left out: none of
/// the variables discovery reads can legitimately hold them.
fn current_environment() -> Environment {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// [`finish`], or under `--json` (`json`) [`finish_json`].
fn finish_as(json: bool, result: Result<(), Error>) -> i32 {
    match result {
        Err(e) if json => finish_json(e),
        result => finish(result),
    }
}

/// Prints an error the way every pipette error reads, and returns its exit code.
fn finish(result: Result<(), Error>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            log::error(&e.to_string());
            e.process_exit_code()
        }
    }
}

/// `--json`'s error: the usual message on stderr, and on stdout, where a tool reads the
/// result, a JSON object ([`ERROR_SCHEMA`]) with the message and the exit code.
fn finish_json(e: Error) -> i32 {
    let message = e.to_string();
    let code = finish(Err(e));
    print_json_error(&message, code);
    code
}

/// The error object ([`ERROR_SCHEMA`]) on stdout, as one line written at once: when
/// several copies share one stdout (`srun --ntasks=2`, where each refuses to run), a
/// pretty-printed object went out a line at a time and the copies' lines interleaved
/// into text no JSON reader accepts.
fn print_json_error(message: &str, exit_code: i32) {
    use std::io::Write;
    let object = serde_json::json!({
        "schema": ERROR_SCHEMA,
        "error": message,
        "exit_code": exit_code,
    });
    let line = format!("{object}\n");
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
}

/// The schema name and version of `--json`'s error object.
const ERROR_SCHEMA: &str = "pipette-error/1";

/// A bad value clap refused that came from an environment variable, told as the
/// variable's (a usage error).
fn blame_environment(e: &clap::Error, command: &clap::Command, args: &[OsString]) -> Option<Error> {
    let lookup = |name: &std::ffi::OsStr| std::env::var_os(name);
    crate::cli::env_errors::blame_environment(e, command, args, lookup).map(Error::Usage)
}

/// Prints clap's message (help, version, or a usage error) and returns its exit code:
/// 0 for help and version, 2 for a malformed command line, as torchrun does. A malformed
/// one under `--json` (`json`) is also the error object on stdout.
fn clap_exit(e: clap::Error, json: bool) -> i32 {
    let _ = e.print();
    let code = e.exit_code();
    if json && code != 0 {
        let text = e.render().to_string();
        let first = text.lines().next().unwrap_or_default();
        print_json_error(first.strip_prefix("error: ").unwrap_or(first), code);
    }
    code
}
