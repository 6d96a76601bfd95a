//! The site configuration file: defaults for any pipette-run option, so job scripts need
//! not repeat `--cluster`, `--launcher` or timeouts.
//!
//! The file is TOML, one `option = value` per line, keys being pipette-run's long option
//! names (`cluster = "/shared/cluster.json"`, `launcher = "srun"`, `stall-timeout =
//! "1h"`, `no-trial = true`). Its values become the options' defaults, so clap's own order
//! gives the precedence: command line, then environment variable, then the file, then the
//! built-in default. Found at `--config FILE`, else `PIPETTE_CONFIG`, else
//! `$XDG_CONFIG_HOME/pipette/config.toml` (`~/.config/pipette/config.toml`).

use std::path::{Path, PathBuf};

use clap::parser::ValueSource;

/// A site configuration file's values, as option name and value text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteConfig {
    pub path: PathBuf,
    pub values: Vec<SiteValue>,
}

/// One `option = value` of a site configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteValue {
    /// The long option name, as written in the file.
    pub key: String,
    /// The option's clap id (`no_trial` for `no-trial`).
    pub id: String,
    pub value: String,
}

/// Reads a site configuration's text; `path` names it in messages. Every key must be a
/// long option of `command` that takes a value or is a flag.
pub fn parse_site_config(
    text: &str,
    path: &Path,
    command: &clap::Command,
) -> Result<SiteConfig, String> {
    let shown = path.display();
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("{shown}: {}", one_line(&e.to_string())))?;
    let mut values = Vec::new();
    for (key, value) in table {
        let Some(arg) = command
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()) && !a.is_positional())
        else {
            // `max_replans` is an option, spelled as torchrun's aliases are: say how to
            // write it rather than deny it exists.
            let dashed = key.replace('_', "-");
            let known = command
                .get_arguments()
                .any(|a| a.get_long() == Some(dashed.as_str()) && !a.is_positional());
            if known && dashed != key {
                return Err(format!(
                    "{shown}: {key:?} is written {dashed:?} here (keys are long option names \
                     as spelled with dashes on the command line, without the leading --)"
                ));
            }
            return Err(format!(
                "{shown}: {key:?} is not a pipette-run option (keys are long option names \
                 without dashes, e.g. cluster, launcher, stall-timeout)"
            ));
        };
        if key == "config" {
            return Err(format!(
                "{shown}: \"config\" cannot name another file (remove it)"
            ));
        }
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) if is_flag(arg) => b.to_string(),
            other => {
                let kind = match other {
                    toml::Value::Boolean(_) => "true/false but is not a flag",
                    toml::Value::Array(_) => "a list",
                    toml::Value::Table(_) => "a table",
                    _ => "a date",
                };
                return Err(format!(
                    "{shown}: {key} is {kind} (write a string or a number, or true/false \
                     for a flag)"
                ));
            }
        };
        values.push(SiteValue {
            id: arg.get_id().to_string(),
            key,
            value: text,
        });
    }
    Ok(SiteConfig {
        path: path.to_path_buf(),
        values,
    })
}

/// `error` from parsing with the file's values as defaults, naming the file when the bad
/// value is the file's (the command line does not give that option): as a default, it
/// was reported as if the command line had given it.
pub fn blame_the_file(
    error: clap::Error,
    config: &SiteConfig,
    args: &[std::ffi::OsString],
) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        error.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return error;
    }
    let text = |kind| match error.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    let (Some(option), Some(value)) = (
        text(ContextKind::InvalidArg),
        text(ContextKind::InvalidValue),
    ) else {
        return error;
    };
    let Some(from_file) = config.values.iter().find(|v| {
        let long = format!("--{}", v.key);
        v.value == value
            && (option == long || option.starts_with(&format!("{long} ")))
            && !args.iter().any(|a| {
                let a = a.to_string_lossy();
                a == long || a.starts_with(&format!("{long}="))
            })
    }) else {
        return error;
    };
    let detail = error.to_string();
    let detail = detail.lines().next().unwrap_or_default();
    let why = detail.split_once("': ").map_or(detail, |(_, why)| why);
    clap::Error::raw(
        error.kind(),
        format!(
            "{}: {} = {:?}: {} (fix the file, or give --{} on the command line)\n",
            config.path.display(),
            from_file.key,
            from_file.value,
            one_line(why.trim_start_matches("error: ")),
            from_file.key
        ),
    )
}

/// `command` with the file's values as its options' defaults.
pub fn apply(command: clap::Command, config: &SiteConfig) -> clap::Command {
    config.values.iter().fold(command, |command, v| {
        command.mut_arg(&v.id, |arg| arg.default_value(v.value.clone()))
    })
}

/// The site configuration: `--config`/`PIPETTE_CONFIG` as `matches` holds them, else the
/// default path when a file is there. A file that cannot be read or parsed is an error
/// naming it.
pub fn load(matches: &clap::ArgMatches) -> Result<Option<SiteConfig>, String> {
    let env = |name: &str| std::env::var(name).ok();
    match config_path(matches, env, Path::is_file) {
        Some(path) => load_from(&path),
        None => Ok(None),
    }
}

/// The site configuration in `path`.
pub fn load_from(path: &Path) -> Result<Option<SiteConfig>, String> {
    let text = crate::input_file::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the site configuration {}: {e} (fix --config or PIPETTE_CONFIG)",
            path.display()
        )
    })?;
    parse_site_config(&text, path, &crate::cli::run_command()).map(Some)
}

/// Which file is the site configuration: `--config`/`PIPETTE_CONFIG` as parsed in
/// `matches`, else the first of `$XDG_CONFIG_HOME/pipette/config.toml` and
/// `$HOME/.config/pipette/config.toml` that `exists` says is there.
pub fn config_path(
    matches: &clap::ArgMatches,
    env: impl Fn(&str) -> Option<String>,
    exists: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    if let Ok(Some(path)) = matches.try_get_one::<PathBuf>("config") {
        return Some(path.clone());
    }
    let base = env("XDG_CONFIG_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| Path::new(&h).join(".config")))?;
    Some(base.join("pipette/config.toml")).filter(|p| exists(p))
}

fn is_flag(arg: &clap::Arg) -> bool {
    matches!(arg.get_action(), clap::ArgAction::SetTrue)
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `pipette config show`: every pipette-run option that has a value without the command
/// line, with where it comes from (`file`, `environment VAR`, `built-in`), one per line.
pub fn show(command: clap::Command, config: Option<&SiteConfig>) -> Result<String, String> {
    let mut command = match config {
        Some(config) => apply(command, config),
        None => command,
    };
    command.build();
    let matches = command
        .clone()
        .try_get_matches_from(["pipette-run", "SCRIPT"])
        .map_err(|e| one_line(&e.to_string()))?;
    let from_file = |id: &str| config.is_some_and(|c| c.values.iter().any(|v| v.id == id));
    let mut out = String::new();
    if let Some(config) = config {
        out.push_str(&format!("# {}\n", config.path.display()));
    }
    for arg in command.get_arguments().filter(|a| !a.is_positional()) {
        let (Some(long), id) = (arg.get_long(), arg.get_id().as_str()) else {
            continue;
        };
        let Some(source) = matches.value_source(id) else {
            continue;
        };
        let Some(raw) = matches.get_raw(id) else {
            continue;
        };
        let value: Vec<String> = raw.map(|v| v.to_string_lossy().into_owned()).collect();
        let origin = match source {
            ValueSource::EnvVariable => format!(
                "environment {}",
                arg.get_env()
                    .map(|e| e.to_string_lossy())
                    .unwrap_or_default()
            ),
            ValueSource::DefaultValue if from_file(id) => "file".to_string(),
            _ => "built-in".to_string(),
        };
        out.push_str(&format!("{long} = {:?}  # {origin}\n", value.join(",")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::options::Launcher;
    use crate::cli::{run_command, RunCli};
    use clap::FromArgMatches;

    fn config(text: &str) -> Result<SiteConfig, String> {
        parse_site_config(text, Path::new("site.toml"), &run_command())
    }

    #[test]
    fn file_values_sit_between_the_environment_and_built_in_defaults() {
        let site =
            config("launcher = \"ssh\"\nstall-timeout = \"1h\"\nno-trial = true\nseed = 7\n")
                .unwrap();
        let parse = |args: &[&str]| {
            let matches = apply(run_command(), &site)
                .try_get_matches_from(args)
                .unwrap();
            RunCli::from_arg_matches(&matches).unwrap()
        };
        let cli = parse(&["pipette-run", "train.py"]);
        assert_eq!(cli.supervise.access.launcher, Some(Launcher::Ssh));
        assert_eq!(cli.supervise.stall_timeout.as_secs(), 3600);
        assert!(cli.trial.no_trial);
        assert_eq!(cli.pipette.seed, 7);
        let cli = parse(&[
            "pipette-run",
            "--launcher",
            "local",
            "--seed",
            "1",
            "train.py",
        ]);
        assert_eq!(cli.supervise.access.launcher, Some(Launcher::Local));
        assert_eq!(cli.pipette.seed, 1);
    }

    #[test]
    fn bad_files_are_refused_naming_the_file_and_key() {
        let e = config("clusters = \"x\"\n").unwrap_err();
        assert!(
            e.starts_with("site.toml: \"clusters\" is not a pipette-run option"),
            "{e}"
        );
        // N15 (a variant): an option spelled with underscores was "not an option".
        let e = config("max_replans = 2\n").unwrap_err();
        assert!(
            e.starts_with("site.toml: \"max_replans\" is written \"max-replans\" here"),
            "{e}"
        );
        let e = config("dry-run = \"yes\"\nseed = [1]\n").unwrap_err();
        assert!(e.contains("seed is a list"), "{e}");
        let e = config("seed = \n").unwrap_err();
        assert!(e.starts_with("site.toml: "), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn show_says_where_each_value_comes_from() {
        let site = config("launcher = \"srun\"\n").unwrap();
        let shown = show(run_command(), Some(&site)).unwrap();
        assert!(shown.starts_with("# site.toml\n"), "{shown}");
        assert!(shown.contains("launcher = \"srun\"  # file\n"), "{shown}");
        assert!(shown.contains("grace = \"10s\"  # built-in\n"), "{shown}");
    }
}
