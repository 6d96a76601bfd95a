//! How argparse splits an argument list into options and their values, and reads a
//! count: the one reader of `--opt value` words in pipette-run, for Megatron's arguments
//! (reading them, [`super::read`]; rewriting them, `render::megatron`, the trial's and the
//! relaunch's [`drop_options`]), a DeepSpeed script's (`config::deepspeed`), torchrun's
//! own (`render::torchrun`) and the options after SCRIPT (`cli`).
//!
//! `--opt value` and `--opt=value`, flags without values, no abbreviations, `--` ends the
//! options; a word is an option's value unless it looks like an option itself (a dash and
//! anything but a number: `--lr -1` is a value). Which options take a value is the
//! caller's table to say ([`words_by`]); for Megatron's arguments ([`arg_words`]) it is
//! [`super::options`]'s, in either spelling, and any other option is taken as a flag, so
//! that the words after it stay words of their own.

use super::options::{find_any_spelling, Arity};

/// One option with the words that are its value, or one other word, as argparse groups
/// them: `args[start..end]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgWord {
    /// The option's name in dashed spelling (`--num_layers` → `num-layers`); `None` for a
    /// word that is not an option (a value of the script's own options, a positional,
    /// `--` and everything after it).
    pub name: Option<String>,
    pub start: usize,
    pub end: usize,
    /// The value after `=` in `--opt=value`.
    pub inline_value: Option<String>,
}

impl ArgWord {
    /// The option's value: after `=`, else the word after it, if argparse took one.
    pub fn value(&self, args: &[String]) -> Option<String> {
        self.inline_value
            .clone()
            .or_else(|| (self.end > self.start + 1).then(|| args[self.start + 1].clone()))
    }

    /// Every value word of an option that takes several (`Arity::Values`); the one value
    /// of any other.
    pub fn values(&self, args: &[String]) -> Vec<String> {
        match &self.inline_value {
            Some(v) => vec![v.clone()],
            None => args[self.start + 1..self.end].to_vec(),
        }
    }

    /// The option's name as written (`num_layers` for `--num_layers=2`).
    pub fn written_name<'a>(&self, args: &'a [String]) -> Option<&'a str> {
        self.name.as_ref()?;
        let body = &args[self.start][2..];
        Some(body.split_once('=').map_or(body, |(name, _)| name))
    }
}

/// Megatron's arguments as argparse groups them.
pub fn arg_words(args: &[String]) -> Vec<ArgWord> {
    words_by(args, megatron_arity)
}

/// How Megatron's parser reads the option `name` (dashed): its table's arity, a flag for
/// an option it does not know.
fn megatron_arity(name: &str) -> Arity {
    find_any_spelling(name).map_or(Arity::Flag, |o| o.arity)
}

/// The arguments as argparse groups them, `arity` telling how each option (by its name
/// with dashes, `num-layers` for `--num_layers`) reads its value.
pub fn words_by(args: &[String], arity: impl Fn(&str) -> Arity) -> Vec<ArgWord> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut options_ended = false;
    while i < args.len() {
        let word = &args[i];
        if word == "--" {
            options_ended = true;
        }
        let body = word
            .strip_prefix("--")
            .filter(|b| !b.is_empty() && !options_ended);
        let Some(body) = body else {
            out.push(ArgWord {
                name: None,
                start: i,
                end: i + 1,
                inline_value: None,
            });
            i += 1;
            continue;
        };
        let (name, inline_value) = match body.split_once('=') {
            Some((name, value)) => (name.replace('_', "-"), Some(value.to_string())),
            None => (body.replace('_', "-"), None),
        };
        let arity = arity(&name);
        let mut end = i + 1;
        if arity != Arity::Flag && inline_value.is_none() {
            while args
                .get(end)
                .is_some_and(|next| next != "--" && !looks_like_option(next))
            {
                end += 1;
                if arity == Arity::Value {
                    break;
                }
            }
        }
        out.push(ArgWord {
            name: Some(name),
            start: i,
            end,
            inline_value,
        });
        i = end;
    }
    out
}

/// An option [`drop_options`] dropped: its name (with dashes) and value.
pub type DroppedOption = (String, Option<String>);

/// Splits Megatron's arguments at a `--` (which ends its options) and drops from the part
/// before it every option named in `names`, in any spelling (`--opt value`, `--opt=value`,
/// underscores for dashes); those in `with_value` take a value, the others of `names` none.
/// Returns the words kept, what was dropped (name with dashes, value) in order, and the
/// part from the `--` on.
pub fn drop_options<'a>(
    args: &'a [String],
    names: &[&str],
    with_value: &[&str],
) -> (Vec<String>, Vec<DroppedOption>, &'a [String]) {
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let (head, tail) = args.split_at(end);
    let arity = |name: &str| {
        if with_value.contains(&name) {
            Arity::Value
        } else if names.contains(&name) {
            Arity::Flag
        } else {
            megatron_arity(name)
        }
    };
    let mut kept = Vec::with_capacity(end);
    let mut dropped = Vec::new();
    for word in words_by(head, arity) {
        match word.name.as_deref() {
            Some(name) if names.contains(&name) => {
                dropped.push((name.to_string(), word.value(head)));
            }
            _ => kept.extend_from_slice(&head[word.start..word.end]),
        }
    }
    (kept, dropped, tail)
}

/// argparse takes the next word as an option's value unless it looks like an option
/// itself (a dash followed by anything but a number).
fn looks_like_option(word: &str) -> bool {
    word.starts_with('-') && word.len() > 1 && word[1..].parse::<f64>().is_err()
}

/// Python's `int()` on what argparse hands it: optional surrounding whitespace, an optional
/// `+`, digits with single underscores between them. Negative numbers and overflow are None.
pub fn parse_count(text: &str) -> Option<u64> {
    let t = text.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t.is_empty() || t.starts_with('_') || t.ends_with('_') || t.contains("__") {
        return None;
    }
    if !t.chars().all(|c| c.is_ascii_digit() || c == '_') {
        return None;
    }
    t.replace('_', "").parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    fn groups(text: &str) -> Vec<(Option<String>, usize, usize)> {
        arg_words(&w(text))
            .into_iter()
            .map(|a| (a.name, a.start, a.end))
            .collect()
    }

    #[test]
    fn options_take_values_by_the_table_in_either_spelling() {
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            groups("--num_layers 2 --swiglu x --lr 1 --zero-stage=3 -- --seq-length 4"),
            vec![
                (some("num-layers"), 0, 2),
                (some("swiglu"), 2, 3),
                (None, 3, 4),
                (some("lr"), 4, 5),
                (None, 5, 6),
                (some("zero-stage"), 6, 7),
                (None, 7, 8),
                (None, 8, 9),
                (None, 9, 10),
            ]
        );
        // A negative number is a value; an option is not.
        assert_eq!(groups("--seq-length -5").len(), 1);
        assert_eq!(groups("--seq-length --swiglu").len(), 2);
        // nargs='+': every word up to the next option.
        assert_eq!(
            groups("--recompute-modules moe_act layernorm --swiglu"),
            vec![
                (Some("recompute-modules".into()), 0, 3),
                (Some("swiglu".into()), 3, 4)
            ]
        );
    }

    #[test]
    fn values_and_written_names() {
        let args = w("--num_layers=2 --hidden-size 8 --swiglu");
        let words = arg_words(&args);
        assert_eq!(words[0].value(&args).as_deref(), Some("2"));
        assert_eq!(words[0].written_name(&args), Some("num_layers"));
        assert_eq!(words[1].value(&args).as_deref(), Some("8"));
        assert_eq!(words[2].value(&args), None);
    }

    /// The decisions every caller shares, whatever its table: `--opt=value`, a flag before
    /// another option, `--` ending the options, a negative number as a value.
    #[test]
    fn any_table_reads_the_edge_cases_alike() {
        let table = |name: &str| match name {
            "port" | "config" => Arity::Value,
            "hosts" => Arity::Values,
            _ => Arity::Flag,
        };
        let read = |text: &str| -> Vec<(Option<String>, usize, usize, Option<String>)> {
            let args = w(text);
            words_by(&args, table)
                .into_iter()
                .map(|a| (a.name.clone(), a.start, a.end, a.value(&args)))
                .collect()
        };
        let some = |s: &str| Some(s.to_string());
        // `--opt=value` keeps its value, even one that looks like an option.
        assert_eq!(
            read("--config=--x --port=1"),
            [
                (some("config"), 0, 1, some("--x")),
                (some("port"), 1, 2, some("1")),
            ]
        );
        // A flag takes nothing; an option with a value does not take the next option.
        assert_eq!(
            read("--verbose --port --config c"),
            [
                (some("verbose"), 0, 1, None),
                (some("port"), 1, 2, None),
                (some("config"), 2, 4, some("c")),
            ]
        );
        // A negative number is a value; a single-dash word is not.
        assert_eq!(read("--port -1")[0], (some("port"), 0, 2, some("-1")));
        assert_eq!(read("--port -x").len(), 2);
        // `--` ends the options, and is no option's value.
        assert_eq!(
            read("--port -- --config c"),
            [
                (some("port"), 0, 1, None),
                (None, 1, 2, None),
                (None, 2, 3, None),
                (None, 3, 4, None),
            ]
        );
        // Several values up to the next option; underscores read as dashes.
        assert_eq!(
            read("--hosts a b --config_x y"),
            [
                (some("hosts"), 0, 3, some("a")),
                (some("config-x"), 3, 4, None),
                (None, 4, 5, None),
            ]
        );
    }

    #[test]
    fn dropped_options_leave_the_rest_as_written() {
        let args = w("--load a --finetune --lr=-1 --ckpt_step -3 --seq-length 8 -- --load b");
        let (kept, dropped, tail) = drop_options(
            &args,
            &["load", "finetune", "ckpt-step"],
            &["load", "ckpt-step"],
        );
        assert_eq!(kept, w("--lr=-1 --seq-length 8"));
        assert_eq!(
            dropped,
            [
                ("load".to_string(), Some("a".to_string())),
                ("finetune".to_string(), None),
                ("ckpt-step".to_string(), Some("-3".to_string())),
            ]
        );
        assert_eq!(tail, w("-- --load b"));
        // An option named with a value, followed by another option, drops alone.
        let args = w("--load --save s");
        let (kept, dropped, _) = drop_options(&args, &["load"], &["load"]);
        assert_eq!(kept, w("--save s"));
        assert_eq!(dropped, [("load".to_string(), None)]);
    }

    #[test]
    fn counts_read_as_python_int_does() {
        assert_eq!(parse_count(" +1_000 "), Some(1000));
        assert_eq!(parse_count("-1"), None);
        assert_eq!(parse_count("1__0"), None);
        assert_eq!(parse_count("18446744073709551616"), None);
    }
}
