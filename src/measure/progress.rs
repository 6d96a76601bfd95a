//! Telling the user how far profiling got: a [`Progress`] trait the profiler reports to,
//! a no-op ([`NoProgress`]) for tests and `--json`, and indicatif bars ([`ProgressBars`])
//! on standard error for people.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

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

/// One indicatif bar per phase on standard error; hidden (notes too) unless standard error
/// is a terminal and the caller asked for them (not in `--json` mode).
pub struct ProgressBars {
    multi: MultiProgress,
    bars: Mutex<HashMap<Phase, ProgressBar>>,
    visible: bool,
}

impl ProgressBars {
    /// Bars on standard error when `wanted` and standard error is a terminal.
    pub fn new(wanted: bool) -> Self {
        let visible = wanted && std::io::stderr().is_terminal();
        let target = if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        ProgressBars {
            multi: MultiProgress::with_draw_target(target),
            bars: Mutex::new(HashMap::new()),
            visible,
        }
    }

    /// Whether anything is drawn.
    pub fn is_visible(&self) -> bool {
        self.visible
    }

    fn style() -> ProgressStyle {
        ProgressStyle::with_template("{prefix:>15} [{bar:30}] {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ")
    }
}

impl Progress for ProgressBars {
    fn start(&self, phase: Phase, total: u64) {
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
        let bars = self.bars.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bar) = bars.get(&phase) {
            bar.set_position(done);
        }
    }

    fn finish(&self, phase: Phase) {
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
