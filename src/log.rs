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
//! Every line has a target (the part of the job it tells about: [`TARGETS`]) and a level.
//! The lines go through `tracing`: an [`EnvFilter`] keeps the lines people asked for (`-q`
//! keeps warnings and errors, `-v` adds DEBUG, and `PIPETTE_LOG` sets levels as `RUST_LOG`
//! does: `debug`, `warn,progress=info`, `plan=debug`, `progress=off`), and [`Lines`] writes
//! them in the format above. The functions here ([`log`], [`log_wrapped`], [`warn`],
//! [`error`], [`enabled`]) are the stages' way in: they name a target and a level at run
//! time, which `tracing`'s macros need at compile time.
//!
//! A leaf, as `exit` is: it names no stage, so every stage may log.

use std::sync::{OnceLock, RwLock};
use std::time::SystemTime;

use tracing::{enabled, event};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::{LookupSpan, Registry};
use tracing_subscriber::{reload, EnvFilter};

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

    /// The level's name in a filter directive; `None` is `off`.
    fn directive(level: Option<Level>) -> &'static str {
        match level {
            None => "off",
            Some(Level::Error) => "error",
            Some(Level::Warn) => "warn",
            Some(Level::Info) => "info",
            Some(Level::Debug) => "debug",
            Some(Level::Trace) => "trace",
        }
    }

    fn of(level: &tracing::Level) -> Level {
        match *level {
            tracing::Level::ERROR => Level::Error,
            tracing::Level::WARN => Level::Warn,
            tracing::Level::INFO => Level::Info,
            tracing::Level::DEBUG => Level::Debug,
            tracing::Level::TRACE => Level::Trace,
        }
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

/// The target of the error that ends a run ([`error`]): not one of [`TARGETS`], so no
/// directive of `PIPETTE_LOG` can hide it.
const END: &str = "end";

/// Which lines are shown: filter directives as `RUST_LOG` writes them, every one checked
/// (a known target, a known level), for an [`EnvFilter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    directives: Vec<String>,
}

impl Filter {
    /// Every target at `level`.
    pub fn new(level: Level) -> Filter {
        Filter {
            directives: vec![Level::directive(Some(level)).to_string()],
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
                    let level = Level::directive(Level::parse(level.trim())?);
                    // The last directive for a target wins, as before.
                    filter
                        .directives
                        .retain(|d| d.split_once('=').is_none_or(|(t, _)| t != target));
                    filter.directives.push(format!("{target}={level}"));
                }
                None if flags_chose => {
                    Level::parse(part)?;
                }
                None => filter.directives[0] = Level::directive(Level::parse(part)?).to_string(),
            }
        }
        Ok(filter)
    }

    /// The filter for `tracing`: these directives, and the run's end always shown.
    fn env_filter(&self) -> EnvFilter {
        let mut directives = self.directives.clone();
        directives.push(format!("{END}=error"));
        EnvFilter::builder().parse_lossy(directives.join(","))
    }
}

/// The program our lines name (`pipette-run` until [`init`] says otherwise).
static PROGRAM: RwLock<&str> = RwLock::new("pipette-run");

type FilterHandle = reload::Handle<EnvFilter, Registry>;

/// The filter of the subscriber [`installed`] sets up, to be replaced by [`init`].
static FILTER: OnceLock<FilterHandle> = OnceLock::new();

/// Our subscriber, as the process's default, installed on first use: INFO of every target
/// in [`Lines`]' format on standard error.
fn installed() -> &'static FilterHandle {
    FILTER.get_or_init(|| {
        let (filter, handle) = reload::Layer::new(Filter::new(Level::Info).env_filter());
        let lines = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .event_format(Lines);
        // Fails only when a default is set already (a test's): its lines go there.
        let _ =
            tracing::subscriber::set_global_default(Registry::default().with(filter).with(lines));
        handle
    })
}

/// Sets the program our lines name and the filter (before it: `pipette-run`, INFO).
pub fn init(program: &'static str, filter: Filter) {
    *PROGRAM.write().unwrap_or_else(|p| p.into_inner()) = program;
    // Fails only when the subscriber is gone, which it never is once global.
    let _ = installed().reload(filter.env_filter());
}

/// `tracing`'s macros at `$level`, with the target as a literal: one call site per target
/// and level.
macro_rules! at_level {
    ($target:expr, $level:expr, $what:ident $($rest:tt)*) => {
        match $level {
            Level::Error => $what!(target: $target, tracing::Level::ERROR $($rest)*),
            Level::Warn => $what!(target: $target, tracing::Level::WARN $($rest)*),
            Level::Info => $what!(target: $target, tracing::Level::INFO $($rest)*),
            Level::Debug => $what!(target: $target, tracing::Level::DEBUG $($rest)*),
            Level::Trace => $what!(target: $target, tracing::Level::TRACE $($rest)*),
        }
    };
}

/// [`at_level`] for a target named at run time (one of [`TARGETS`]; any other is
/// `pipette`'s).
macro_rules! at_target {
    ($target:expr, $level:expr, $what:ident $($rest:tt)*) => {
        match $target {
            "profile" => at_level!("profile", $level, $what $($rest)*),
            "plan" => at_level!("plan", $level, $what $($rest)*),
            "trial" => at_level!("trial", $level, $what $($rest)*),
            "job" => at_level!("job", $level, $what $($rest)*),
            "progress" => at_level!("progress", $level, $what $($rest)*),
            _ => at_level!("pipette", $level, $what $($rest)*),
        }
    };
}

/// Whether a line of `target` at `level` would be shown.
pub fn enabled(target: &str, level: Level) -> bool {
    installed();
    at_target!(target, level, enabled)
}

/// Prints `text` (one line or several, as they are: see [`log_wrapped`]) as ours, when
/// the filter lets it through. All lines of one message go out together.
pub fn log(level: Level, target: &str, text: &str) {
    installed();
    at_target!(target, level, event, wrap = false, "{text}");
}

/// [`log`] with every line broken to fit 80 columns after the stamp and the level's word.
pub fn log_wrapped(level: Level, target: &str, text: &str) {
    installed();
    at_target!(target, level, event, wrap = true, "{text}");
}

/// The error that ends a run: one line, never wrapped (every error reads as one line),
/// and shown whatever the filter says, since it says why the run failed.
pub fn error(text: &str) {
    installed();
    tracing::event!(target: END, tracing::Level::ERROR, wrap = false, "{text}");
}

/// A warning (target `pipette`), as one line.
pub fn warn(text: &str) {
    log(Level::Warn, "pipette", text);
}

/// Our lines' format (see the module's doc): a `tracing` event's message, broken to fit
/// 80 columns when its `wrap` field says so, each line stamped.
pub struct Lines;

impl<S, N> FormatEvent<S, N> for Lines
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _context: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut message = Message::default();
        event.record(&mut message);
        let level = Level::of(event.metadata().level());
        let text = match message.wrap {
            true => wrap(&message.text, TEXT_WIDTH - level.word().len()),
            false => message.text,
        };
        let program = *PROGRAM.read().unwrap_or_else(|p| p.into_inner());
        for line in lines(&stamp(SystemTime::now()), program, level, &text) {
            writer.write_str(&line)?;
        }
        Ok(())
    }
}

/// An event's fields as [`Lines`] reads them.
#[derive(Default)]
struct Message {
    text: String,
    wrap: bool,
}

impl tracing::field::Visit for Message {
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        if field.name() == "wrap" {
            self.wrap = value;
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.text = value.to_string();
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        // The message is `format_args!`, whose Debug is its text.
        if field.name() == "message" {
            self.text = format!("{value:?}");
        }
    }
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

    /// Whether `filter` shows a line of `target` at `level`, asked of a subscriber of
    /// this thread alone.
    fn allows(filter: &Filter, target: &str, level: Level) -> bool {
        let subscriber = Registry::default().with(filter.env_filter());
        tracing::subscriber::with_default(subscriber, || at_target!(target, level, enabled))
    }

    #[test]
    fn the_filter_reads_levels_and_targets_as_rust_log_does() {
        let info = Filter::new(Level::Info);
        assert!(allows(&info, "plan", Level::Info) && !allows(&info, "plan", Level::Debug));
        let f = Filter::parse("warn, plan=debug,progress=off", Level::Info, false).unwrap();
        assert!(allows(&f, "plan", Level::Debug));
        assert!(!allows(&f, "job", Level::Info) && allows(&f, "job", Level::Warn));
        assert!(!allows(&f, "progress", Level::Error));
        // The last directive for a target wins.
        let twice = Filter::parse("plan=off,plan=debug", Level::Info, false).unwrap();
        assert!(allows(&twice, "plan", Level::Debug));
        // -q or -v chose the level: a bare level in the environment does not move it.
        let q = Filter::parse("debug,trial=info", Level::Warn, true).unwrap();
        assert!(!allows(&q, "plan", Level::Info) && allows(&q, "trial", Level::Info));
        // The error that ends a run is shown whatever the filter says.
        let off = Filter::parse("off", Level::Info, false).unwrap();
        assert!(!allows(&off, "pipette", Level::Error));
        let subscriber = Registry::default().with(off.env_filter());
        assert!(tracing::subscriber::with_default(subscriber, || {
            tracing::enabled!(target: END, tracing::Level::ERROR)
        }));
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

    /// A message through `tracing` comes out as [`lines`] writes it, wrapped when asked.
    #[test]
    fn events_are_written_in_our_format() {
        let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let sink = std::sync::Arc::clone(&out);
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || Sink(std::sync::Arc::clone(&sink)))
            .event_format(Lines);
        let filter = Filter::new(Level::Info).env_filter();
        let subscriber = Registry::default().with(filter).with(layer);
        let long = "word ".repeat(30);
        tracing::subscriber::with_default(subscriber, || {
            log(Level::Warn, "job", "a\n  b\u{1b}");
            log(Level::Debug, "plan", "hidden");
            log_wrapped(Level::Info, "trial", long.trim_end());
        });
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let body = |line: &str| line.split_once(' ').unwrap().1.to_string();
        // The program is whichever [`init`] named last in this process.
        assert!(body(lines[0]).ends_with(": warning: a"), "{text}");
        assert!(body(lines[1]).ends_with(": warning:   b\\u{1b}"), "{text}");
        assert_eq!(lines.len(), 5, "two lines, then 30 words in three: {text}");
        for line in &lines {
            assert_eq!(line[..STAMP_WIDTH], lines[0][..STAMP_WIDTH], "{text}");
            assert!(line.chars().count() <= 80, "{line}");
        }
        assert!(
            lines[3].contains("pipette-run:     word ") || lines[3].contains("pipette:     word "),
            "{text}"
        );
        assert!(!text.contains("hidden"), "{text}");
    }

    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
