//! Telling the user how far profiling and the trial got: a [`Progress`] trait they report
//! to, a no-op ([`NoProgress`]) for tests, and for people [`ProgressBars`] on standard
//! error: indicatif bars with an ETA on a terminal, and where standard error is not one
//! (a batch log) a plain line per running phase at a fixed interval ([`progress_line`]).

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::exec::format_duration;
use crate::log::{self, Level};

/// How often a plain progress line is written when no interval is given (`pipette
/// profile`); pipette-run's `--progress-interval` has the same default.
pub const LINE_INTERVAL: Duration = Duration::from_secs(30);

/// The stages of profiling, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Listing every node's GPUs (or CPUs): nodes done.
    Inventory,
    /// Copying the probe to the nodes and starting torchrun: nodes done.
    Launch,
    /// Bandwidth of GPU pairs inside nodes: tournament rounds done.
    GpuPairs,
    /// Bandwidth of node pairs: tournament rounds done.
    NodePairs,
    /// Matrix-multiply throughput on every GPU.
    Compute,
    /// The trial run of the user's script: iterations done.
    Trial,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Inventory => "inventory",
            Phase::Launch => "starting probe",
            Phase::GpuPairs => "GPU pairs",
            Phase::NodePairs => "node pairs",
            Phase::Compute => "compute",
            Phase::Trial => "trial run",
        }
    }
}

/// Receives the profiler's progress. Called from several threads.
pub trait Progress: Sync {
    /// `phase` begins with `total` steps.
    fn start(&self, phase: Phase, total: u64);
    /// `done` of the phase's steps are done.
    fn update(&self, phase: Phase, done: u64);
    /// The phase is over.
    fn finish(&self, phase: Phase);
    /// A note for the user (a cached profile was used, a topology could not be read, ...).
    fn note(&self, text: &str);
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _: Phase, _: u64) {}
    fn update(&self, _: Phase, _: u64) {}
    fn finish(&self, _: Phase) {}
    fn note(&self, _: &str) {}
}

/// One indicatif bar per phase on standard error when it is a terminal and the caller
/// asked for them (not in `--json` mode; notes neither); else, every interval, a plain
/// line per running phase, as training's progress lines come in a batch log whatever
/// `--json` says.
pub struct ProgressBars {
    multi: MultiProgress,
    bars: Mutex<HashMap<Phase, ProgressBar>>,
    visible: bool,
    /// The phases running, for the plain lines; `None` on a terminal or when unwanted.
    lines: Option<ProgressLines>,
}

impl ProgressBars {
    /// Bars on standard error when `wanted` and standard error is a terminal; plain lines
    /// every `interval` when it is not (none when `interval` is zero).
    pub fn new(wanted: bool, interval: Duration) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let visible = wanted && terminal;
        let target = if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        ProgressBars {
            multi: MultiProgress::with_draw_target(target),
            bars: Mutex::new(HashMap::new()),
            visible,
            lines: (!terminal && !interval.is_zero()).then(|| ProgressLines::spawn(interval)),
        }
    }

    /// Whether bars are drawn.
    pub fn is_visible(&self) -> bool {
        self.visible
    }

    fn style() -> ProgressStyle {
        ProgressStyle::with_template("{prefix:>15} [{bar:30}] {pos}/{len} {elapsed} ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ")
    }
}

impl Progress for ProgressBars {
    fn start(&self, phase: Phase, total: u64) {
        if let Some(lines) = &self.lines {
            lines.start(phase, total);
        }
        let bar = self.multi.add(ProgressBar::new(total));
        bar.set_style(Self::style());
        bar.set_prefix(phase.label());
        bar.enable_steady_tick(Duration::from_millis(200));
        let mut bars = self.bars.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = bars.insert(phase, bar) {
            old.finish_and_clear();
        }
    }

    fn update(&self, phase: Phase, done: u64) {
        if let Some(lines) = &self.lines {
            lines.update(phase, done);
        }
        let bars = self.bars.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bar) = bars.get(&phase) {
            bar.set_position(done);
        }
    }

    fn finish(&self, phase: Phase) {
        if let Some(lines) = &self.lines {
            lines.finish(phase);
        }
        let bars = self.bars.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bar) = bars.get(&phase) {
            bar.finish();
        }
    }

    fn note(&self, text: &str) {
        if self.visible {
            let _ = self.multi.println(text);
        }
    }
}

/// A phase under way, for its plain line.
#[derive(Debug, Clone, Copy)]
struct Running {
    phase: Phase,
    total: u64,
    done: u64,
    started: Instant,
}

/// The plain lines' side of [`ProgressBars`]: the running phases, and a thread that writes
/// their lines every interval until it is dropped.
struct ProgressLines {
    running: Arc<Mutex<Vec<Running>>>,
    stop: Option<mpsc::Sender<()>>,
    ticker: Option<JoinHandle<()>>,
}

impl ProgressLines {
    fn spawn(interval: Duration) -> ProgressLines {
        let running: Arc<Mutex<Vec<Running>>> = Arc::default();
        let (stop, stopped) = mpsc::channel::<()>();
        let shown = Arc::clone(&running);
        let ticker = std::thread::spawn(move || {
            // A fixed interval, whether the phases moved or not: a silent phase is news too.
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                let now = Instant::now();
                let phases = shown.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let text: Vec<String> = phases
                    .iter()
                    .map(|r| progress_line(r.phase, r.done, r.total, now - r.started))
                    .collect();
                if !text.is_empty() {
                    log::log_wrapped(Level::Info, "progress", &text.join("\n"));
                }
            }
        });
        ProgressLines {
            running,
            stop: Some(stop),
            ticker: Some(ticker),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Vec<Running>) -> T) -> T {
        f(&mut self.running.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn start(&self, phase: Phase, total: u64) {
        self.with(|running| {
            running.retain(|r| r.phase != phase);
            running.push(Running {
                phase,
                total,
                done: 0,
                started: Instant::now(),
            });
        });
    }

    fn update(&self, phase: Phase, done: u64) {
        self.with(|running| {
            if let Some(r) = running.iter_mut().find(|r| r.phase == phase) {
                r.done = done;
            }
        });
    }

    fn finish(&self, phase: Phase) {
        self.with(|running| running.retain(|r| r.phase != phase));
    }
}

impl Drop for ProgressLines {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(ticker) = self.ticker.take() {
            let _ = ticker.join();
        }
    }
}

/// A phase's plain progress line: `node pairs 3/7, 12 s elapsed, ETA 16 s` (the ETA from
/// the pace so far; unknown before the first step is done).
pub fn progress_line(phase: Phase, done: u64, total: u64, elapsed: Duration) -> String {
    let whole = |d: Duration| format_duration(Duration::from_secs(d.as_secs()));
    let eta = match done {
        0 => "ETA unknown".to_string(),
        _ if done >= total => "ETA 0 s".to_string(),
        _ => {
            let left = elapsed.mul_f64((total - done) as f64 / done as f64);
            format!("ETA {}", whole(left))
        }
    };
    format!(
        "{} {done}/{total}, {} elapsed, {eta}",
        phase.label(),
        whole(elapsed)
    )
}

/// Records every call, for tests.
#[derive(Debug, Default)]
pub struct RecordedProgress {
    pub events: Mutex<Vec<String>>,
}

impl Progress for RecordedProgress {
    fn start(&self, phase: Phase, total: u64) {
        self.push(format!("start {} {total}", phase.label()));
    }
    fn update(&self, phase: Phase, done: u64) {
        self.push(format!("update {} {done}", phase.label()));
    }
    fn finish(&self, phase: Phase) {
        self.push(format!("finish {}", phase.label()));
    }
    fn note(&self, text: &str) {
        self.push(format!("note {text}"));
    }
}

impl RecordedProgress {
    fn push(&self, event: String) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
    }

    /// The recorded events.
    pub fn events(&self) -> Vec<String> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_line_says_the_phase_how_far_how_long_and_how_long_left() {
        let s = Duration::from_secs;
        assert_eq!(
            progress_line(Phase::NodePairs, 3, 7, s(12)),
            "node pairs 3/7, 12 s elapsed, ETA 16 s"
        );
        assert_eq!(
            progress_line(Phase::Trial, 0, 5, Duration::from_millis(61_400)),
            "trial run 0/5, 1 min 1 s elapsed, ETA unknown"
        );
        assert_eq!(
            progress_line(Phase::Compute, 4, 4, s(3)),
            "compute 4/4, 3 s elapsed, ETA 0 s"
        );
    }
}
