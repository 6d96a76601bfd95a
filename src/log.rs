//! pipette's own log lines on standard error: each line stamped with the time of day (UTC)
//! and the program, and, above or below INFO, the level's word, as
//!
//! ```text
//! 17:40:02Z pipette-run: attempt 1: launching torchrun on 2 node(s) (node-a,
//! 17:40:02Z pipette-run:     node-b), tp=1 pp=1 dp=4 micro-batch 2
//! 17:40:09Z pipette-run: warning: cannot write the summary into the run directory: ...
//! ```
//!
//! which keeps the 80 columns of a terminal: a message is broken at [`TEXT_WIDTH`]
//! ([`wrap`]) and every line of it gets the same stamp. The nodes' own lines
//! (`[host rN] ...`) are not ours and are never stamped.
//!
//! Every line has a target (the part of the job it tells about: [`TARGETS`]) and a level;
//! a [`Filter`] keeps the lines people asked for: `-q` keeps warnings and errors, `-v`
//! adds DEBUG, and `PIPETTE_LOG` sets levels as `RUST_LOG` does (`debug`,
//! `warn,progress=info`, `plan=debug`, `progress=off`).
//!
//! A leaf, as `exit` is: it names no stage, so every stage may log.

use std::sync::RwLock;
use std::time::SystemTime;

/// How much a line matters, most first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl Level {
    /// The word after the program (`error: `); none for INFO, the common case, so the
    /// lines people read most keep their width.
    pub fn word(self) -> &'static str {
        match self {
            Level::Error => "error: ",
            Level::Warn => "warning: ",
            Level::Info => "",
            Level::Debug => "debug: ",
            Level::Trace => "trace: ",
        }
    }

    /// A level's name as `PIPETTE_LOG` writes it; `Ok(None)` is `off`.
    fn parse(name: &str) -> Result<Option<Level>, String> {
        Ok(Some(match name.to_ascii_lowercase().as_str() {
            "off" => return Ok(None),
            "error" => Level::Error,
            "warn" | "warning" => Level::Warn,
            "info" => Level::Info,
            "debug" => Level::Debug,
            "trace" => Level::Trace,
            _ => return Err(format!("unknown level \"{name}\"")),
        }))
    }
}

/// The targets our lines have, with what each tells about.
pub const TARGETS: &[(&str, &str)] = &[
    ("profile", "discovering and profiling the nodes"),
    (
        "plan",
        "the plan report, your configuration costed, re-plans after the trial",
    ),
    ("trial", "the trial run and the measured choice"),
    (
        "job",
        "launches, failures, teardowns, re-plans after a failure, the end",
    ),
    (
        "progress",
        "progress lines of profiling, the trial and training",
    ),
    ("pipette", "everything else: errors, warnings, notes"),
];

/// Which lines are shown: a level for every target, and levels for some.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// `None`: nothing.
    default: Option<Level>,
    targets: Vec<(String, Option<Level>)>,
}

impl Filter {
    /// Every target at `level`.
    pub const fn new(level: Level) -> Filter {
        Filter {
            default: Some(level),
            targets: Vec::new(),
        }
    }

    /// `default` (the level `-q`/`-v` chose) with a `PIPETTE_LOG` value on top: comma
    /// separated `LEVEL` or `TARGET=LEVEL`. A bare level applies only when the command
    /// line chose none (`flags_chose`): the command line wins over the environment.
    pub fn parse(spec: &str, default: Level, flags_chose: bool) -> Result<Filter, String> {
        let mut filter = Filter::new(default);
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some((target, level)) => {
                    let target = target.trim();
                    if !TARGETS.iter().any(|(t, _)| *t == target) {
                        let known: Vec<&str> = TARGETS.iter().map(|(t, _)| *t).collect();
                        return Err(format!(
                            "unknown target \"{target}\" (the targets are {})",
                            known.join(", ")
                        ));
                    }
                    filter
                        .targets
                        .push((target.to_string(), Level::parse(level.trim())?));
                }
                None if flags_chose => {
                    Level::parse(part)?;
                }
                None => filter.default = Level::parse(part)?,
            }
        }
        Ok(filter)
    }

    /// Whether a line of `target` at `level` is shown (the last directive for the target
    /// wins).
    pub fn allows(&self, target: &str, level: Level) -> bool {
        let limit = self
            .targets
            .iter()
            .rev()
            .find(|(t, _)| t == target)
            .map_or(self.default, |(_, l)| *l);
        limit.is_some_and(|limit| level <= limit)
    }
}

struct Logger {
    program: &'static str,
    filter: Filter,
}

static LOGGER: RwLock<Logger> = RwLock::new(Logger {
    program: "pipette-run",
    filter: Filter::new(Level::Info),
});

/// Sets the program our lines name and the filter (before it: `pipette-run`, INFO).
pub fn init(program: &'static str, filter: Filter) {
    let mut logger = LOGGER.write().unwrap_or_else(|p| p.into_inner());
    *logger = Logger { program, filter };
}

/// Whether a line of `target` at `level` would be shown.
pub fn enabled(target: &str, level: Level) -> bool {
    let logger = LOGGER.read().unwrap_or_else(|p| p.into_inner());
    logger.filter.allows(target, level)
}

/// Prints `text` (one line or several, as they are: see [`log_wrapped`]) as ours, when
/// the filter lets it through. All lines of one message go out together.
pub fn log(level: Level, target: &str, text: &str) {
    if enabled(target, level) {
        emit(level, text);
    }
}

fn emit(level: Level, text: &str) {
    let program = LOGGER.read().unwrap_or_else(|p| p.into_inner()).program;
    let out = lines(&stamp(SystemTime::now()), program, level, text).concat();
    eprint!("{out}");
}

/// [`log`] with every line broken to fit 80 columns after the stamp and the level's word.
pub fn log_wrapped(level: Level, target: &str, text: &str) {
    log(level, target, &wrap(text, TEXT_WIDTH - level.word().len()));
}

/// The error that ends a run: one line, never wrapped (every error reads as one line),
/// and shown whatever the filter says, since it says why the run failed.
pub fn error(text: &str) {
    emit(Level::Error, text);
}

/// A warning (target `pipette`), as one line.
pub fn warn(text: &str) {
    log(Level::Warn, "pipette", text);
}

/// `text`'s lines, each as printed: stamp, program, the level's word, the line (made
/// [`printable`]: a message may quote anything the user or a node gave).
pub fn lines(stamp: &str, program: &str, level: Level, text: &str) -> Vec<String> {
    text.lines()
        .map(|line| format!("{stamp} {program}: {}{}\n", level.word(), printable(line)))
        .collect()
}

/// `text` with every control character but the tab, and every Unicode format character,
/// escaped (`\u{1b}`, `\u{202e}`): what reaches a terminal or a file cannot move the cursor,
/// recolour, reorder or hide what follows.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let hidden = |c: char| (c.is_control() && c != '\t') || is_format_char(c);
    if !text.chars().any(hidden) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hidden(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Whether `c` is a Unicode format character (general category Cf): the bidirectional
/// controls, zero-width joiners and spaces, the byte-order mark and their kin. They print
/// as nothing, so a name holding one reads as another.
pub fn is_format_char(c: char) -> bool {
    matches!(c as u32,
        0xAD | 0x600..=0x605 | 0x61C | 0x6DD | 0x70F | 0x890..=0x891 | 0x8E2 | 0x180E
        | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064 | 0x2066..=0x206F | 0xFEFF
        | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD | 0x13430..=0x1343F | 0x1BCA0..=0x1BCA3
        | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F)
}

/// `HH:MM:SSZ` of `time` (UTC).
pub fn stamp(time: SystemTime) -> String {
    let at = jiff::Timestamp::try_from(time).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    at.strftime("%H:%M:%SZ").to_string()
}

/// The columns of a stamp and the space after it.
pub const STAMP_WIDTH: usize = "00:00:00Z ".len();

/// The room for text on a line of ours, for 80 columns: after the stamp and
/// `pipette-run: ` (`pipette: ` is shorter).
pub const TEXT_WIDTH: usize = 80 - STAMP_WIDTH - "pipette-run: ".len();

/// `text` with every line longer than `width` columns broken at spaces, the continuation
/// indented four columns deeper than the line (a word longer than the room stays whole).
pub fn wrap(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        if body.chars().count() <= width {
            out.push_str(line);
            continue;
        }
        let indent = body.len() - body.trim_start_matches(' ').len();
        let first = " ".repeat(indent);
        let next = " ".repeat((indent + 4).min(width / 2));
        let words = body.trim_start_matches(' ').split(' ');
        out.push_str(&fill(words, width, &first, &next, 0).join("\n"));
        out.push_str(end);
    }
    out
}

/// `words` laid into lines of `width` columns at most, `reserve` of them kept free at the
/// end of every line but the last; the first line starts with `first`, the others with
/// `next`. A word longer than the room gets a line of its own.
pub fn fill<'a>(
    words: impl IntoIterator<Item = &'a str>,
    width: usize,
    first: &str,
    next: &str,
    reserve: usize,
) -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = first.to_string();
    let mut fresh = true;
    for word in words {
        if !fresh && current.chars().count() + 1 + word.chars().count() + reserve > width {
            lines.push(std::mem::replace(&mut current, next.to_string()));
            fresh = true;
        }
        if !fresh {
            current.push(' ');
        }
        current.push_str(word);
        fresh = false;
    }
    lines.push(current);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn long_lines_wrap_under_their_indent() {
        let text = "  one two three four five\nshort\n";
        assert_eq!(
            wrap(text, 12),
            "  one two\n      three\n      four\n      five\nshort\n"
        );
        assert_eq!(
            wrap("unbreakable-word-here x", 5),
            "unbreakable-word-here\n  x"
        );
    }

    #[test]
    fn every_line_carries_the_stamp_the_program_and_the_level() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(20_000 * 86_400 + 63_722);
        assert_eq!(stamp(at), "17:42:02Z");
        assert_eq!(
            lines(&stamp(at), "pipette-run", Level::Warn, "a\n  b"),
            [
                "17:42:02Z pipette-run: warning: a\n",
                "17:42:02Z pipette-run: warning:   b\n"
            ]
        );
        assert_eq!(
            lines("17:42:02Z", "pipette", Level::Info, "plain"),
            ["17:42:02Z pipette: plain\n"]
        );
        // A wrapped line of ours fits 80 columns with its stamp and its level's word.
        for level in [Level::Warn, Level::Info] {
            let long = wrap(&"word ".repeat(40), TEXT_WIDTH - level.word().len());
            for line in lines("17:42:02Z", "pipette-run", level, &long) {
                assert!(line.trim_end().chars().count() <= 80, "{line}");
            }
        }
    }

    #[test]
    fn the_filter_reads_levels_and_targets_as_rust_log_does() {
        let info = Filter::new(Level::Info);
        assert!(info.allows("plan", Level::Info) && !info.allows("plan", Level::Debug));
        let f = Filter::parse("warn, plan=debug,progress=off", Level::Info, false).unwrap();
        assert!(f.allows("plan", Level::Debug));
        assert!(!f.allows("job", Level::Info) && f.allows("job", Level::Warn));
        assert!(!f.allows("progress", Level::Error));
        // -q or -v chose the level: a bare level in the environment does not move it.
        let q = Filter::parse("debug,trial=info", Level::Warn, true).unwrap();
        assert!(!q.allows("plan", Level::Info) && q.allows("trial", Level::Info));
        assert_eq!(
            Filter::parse("loud", Level::Info, false),
            Err("unknown level \"loud\"".to_string())
        );
        let bad = Filter::parse("planner=debug", Level::Info, false).unwrap_err();
        assert!(
            bad.contains("\"planner\"") && bad.contains("plan, trial"),
            "{bad}"
        );
        assert_eq!(
            Filter::parse("", Level::Info, false).unwrap(),
            Filter::new(Level::Info)
        );
    }
}
