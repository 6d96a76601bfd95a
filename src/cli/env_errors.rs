//! Errors in option values that came from environment variables, told as such.
//!
//! clap reports a bad `PET_NNODES=abc` as an invalid value for `--nnodes`, an option the
//! user never typed, and an empty `PIPETTE_CLUSTER=` as "a value is required for
//! --cluster". [`blame_environment`] finds the variable behind such an error and says
//! what is wrong with it instead.

use std::ffi::{OsStr, OsString};

use clap::error::{ContextKind, ContextValue, ErrorKind};

use crate::config::megatron::argparse::words_by;
use crate::config::megatron::options::Arity;

/// When `error` is about an option's value that came from its environment variable (the
/// option is not on the command line `args` and `lookup` finds the variable set), the
/// one-line message naming the variable; else `None` (clap's own message is right).
pub fn blame_environment(
    error: &clap::Error,
    command: &clap::Command,
    args: &[OsString],
    lookup: impl Fn(&OsStr) -> Option<OsString>,
) -> Option<String> {
    let kind = error.kind();
    if !matches!(kind, ErrorKind::InvalidValue | ErrorKind::ValueValidation) {
        return None;
    }
    let Some(ContextValue::String(shown)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    let long = shown
        .strip_prefix("--")?
        .split([' ', '='])
        .next()
        .filter(|l| !l.is_empty())?;
    let arg = find_long(command, long)?;
    let variable = arg.get_env()?;
    let names: Vec<&str> = std::iter::once(long)
        .chain(arg.get_all_aliases().unwrap_or_default())
        .collect();
    if on_command_line(command, args, &names, arg.get_short()) {
        return None;
    }
    let value = lookup(variable)?;
    let variable = variable.to_string_lossy();
    let value = value.to_string_lossy();
    let problem = match kind {
        _ if value.trim().is_empty() => "is set but empty".to_string(),
        ErrorKind::InvalidValue => match error.get(ContextKind::ValidValue) {
            Some(ContextValue::Strings(valid)) => format!("is not one of {}", valid.join(", ")),
            _ => "is not a valid value".to_string(),
        },
        _ => match std::error::Error::source(error) {
            Some(reason) => format!("is not valid: {reason}"),
            None => "is not a valid value".to_string(),
        },
    };
    Some(format!(
        "environment variable {variable}={value:?} {problem} (it stands for --{long}: fix or unset {variable})"
    ))
}

/// The argument with this long name, in `command` or any of its subcommands.
fn find_long<'a>(command: &'a clap::Command, long: &str) -> Option<&'a clap::Arg> {
    command
        .get_arguments()
        .find(|a| {
            a.get_long() == Some(long)
                || a.get_all_aliases()
                    .is_some_and(|aliases| aliases.contains(&long))
        })
        .or_else(|| {
            command
                .get_subcommands()
                .find_map(|sub| find_long(sub, long))
        })
}

/// Whether the option appears among `args` before `--` (as `--name`, `--name=...`, or its
/// short form), the words read by [`words_by`] (the one reader of argument lists) with
/// `command`'s options' arities. A script argument of the same spelling
/// after SCRIPT may count too: the message is then clap's own, which is still right about
/// the value.
fn on_command_line(
    command: &clap::Command,
    args: &[OsString],
    names: &[&str],
    short: Option<char>,
) -> bool {
    let args: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let options_end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let arity = |name: &str| match find_long(command, name) {
        Some(arg) if arg.get_action().takes_values() => Arity::Value,
        _ => Arity::Flag,
    };
    let named = |name: &str| names.iter().any(|n| n.replace('_', "-") == name);
    words_by(&args[..options_end], arity)
        .iter()
        .any(|word| match &word.name {
            Some(name) => named(name),
            None => short.is_some_and(|s| {
                args[word.start]
                    .strip_prefix('-')
                    .is_some_and(|rest| !rest.starts_with('-') && rest.starts_with(s))
            }),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::RunCli;
    use clap::{CommandFactory, Parser};

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn typed_options_are_found_in_every_spelling() {
        let command = RunCli::command();
        let names = ["nproc-per-node", "nproc_per_node"];
        for typed in [
            &["pipette-run", "--nproc-per-node", "x"][..],
            &["pipette-run", "--nproc_per_node=x"],
        ] {
            assert!(
                on_command_line(&command, &os(typed), &names, None),
                "{typed:?}"
            );
        }
        assert!(!on_command_line(
            &command,
            &os(&["pipette-run", "--", "--nproc-per-node"]),
            &names,
            None
        ));
        assert!(on_command_line(
            &command,
            &os(&["pipette-run", "-rx"]),
            &["redirects"],
            Some('r')
        ));
        assert_eq!(
            find_long(&command, "nproc_per_node").and_then(|a| a.get_env()),
            Some(OsStr::new("PET_NPROC_PER_NODE"))
        );
    }

    /// A bad value typed on the command line keeps clap's message, which names the flag.
    #[test]
    fn typed_values_keep_clap_s_message() {
        let args = os(&["pipette-run", "--nnodes", "abc", "train.py"]);
        let err = RunCli::try_parse_from(&args).unwrap_err();
        let lookup = |_: &OsStr| Some(OsString::from("abc"));
        assert_eq!(
            blame_environment(&err, &RunCli::command(), &args, lookup),
            None
        );
    }
}
