//! Every node's output as one stream: each line prefixed with `[host rN]` on our stdout or
//! stderr (as the node wrote it), kept whole in `logs/<host>.log` of the attempt's
//! directory, and watched for progress (Megatron's iteration lines) so a job that stops
//! making progress is noticed.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::events::seconds_or_null;
use super::stragglers::{self, ReportLine};
use crate::cluster::profile::median;
use crate::cluster::ClusterProfile;
use crate::config::Settings;
use crate::exec::{OutputSink, Stream};
use crate::launch::output_lines::{is_progress_line, parse_iteration};
use crate::log::{self, Level, TEXT_WIDTH};
use crate::model::{flops, time};
use crate::plan::Plan;

/// Where a node's lines go and what they said about progress. One per attempt; handed to
/// the exec seam as the [`OutputSink`] of every node's command.
pub struct JobOutput {
    start: Instant,
    nodes: BTreeMap<String, NodeOutput>,
    /// Milliseconds after `start` of the last line from any node.
    last_line_ms: AtomicU64,
    /// Milliseconds after `start` of the last line that shows progress (see
    /// [`is_progress_line`]); `u64::MAX` before the first iteration line.
    last_progress_ms: AtomicU64,
    /// The first and the last iteration number seen in an iteration line (0: none yet).
    first_iteration: AtomicU64,
    last_iteration: AtomicU64,
    /// The total the iteration lines give (`--train-iters`; 0: none yet).
    total_iterations: AtomicU64,
    /// When the lines said what, for the ledger.
    clock: Mutex<LineClock>,
    /// Our progress line during training, when asked for.
    progress: Option<ProgressSpec>,
    /// Milliseconds after `start` of our last progress line.
    last_report_ms: AtomicU64,
    echo: Echo,
    /// Straggler report lines not yet taken by the watch (none unless asked for).
    straggler_lines: Option<Mutex<Vec<ReportLine>>>,
    /// The iteration of the last checkpoint saved or loaded (0: none seen).
    checkpoint_iteration: AtomicU64,
    /// The last few times per iteration Megatron reported, ms.
    recent_ms: Mutex<std::collections::VecDeque<f64>>,
    /// The lowest median of [`RECENT`] consecutive reported times so far, ms (0: none).
    best_recent_ms: Mutex<f64>,
}

/// How many reported iteration times [`JobOutput::recent_iteration_ms`] looks at.
const RECENT: usize = 5;

/// What our progress line during training says besides the job's own lines: one line per
/// `interval` at most, at an iteration line, with the iteration, its time against the
/// estimate, tokens/s per GPU, MFU and the time left.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ProgressSpec {
    pub interval: Duration,
    /// The plan's estimated iteration time, ms.
    pub estimated_ms: Option<f64>,
    /// Tokens and model FLOPs of one iteration, all GPUs together.
    pub tokens_per_iteration: Option<f64>,
    pub flops_per_iteration: Option<f64>,
    pub peak_flops_per_gpu: Option<f64>,
    pub world_size: u64,
}

impl ProgressSpec {
    /// The line of a planned attempt: its plan's estimate, the tokens and model FLOPs of
    /// an iteration (as Megatron reports them), and the slowest GPU's peak at the training
    /// precision (on mixed GPUs the job runs at its pace): the rate the time model's GEMM
    /// efficiencies are shares of ([`time::mfu_peak_tflops`]), fp32 included.
    pub fn planned(
        interval: Duration,
        plan: &Plan,
        settings: &Settings,
        profile: &ClusterProfile,
    ) -> ProgressSpec {
        let t = &settings.training;
        let peak = profile
            .nodes
            .iter()
            .filter_map(|n| n.gpus())
            .flatten()
            .map(|g| time::mfu_peak_tflops(g, t.precision))
            .try_fold(f64::INFINITY, |low, p| p.map(|p| low.min(p)))
            .filter(|p| p.is_finite() && *p > 0.0)
            .map(|tflops| tflops * 1e12);
        ProgressSpec {
            interval,
            estimated_ms: Some(plan.estimate.iteration_ms),
            tokens_per_iteration: Some((t.global_batch_size * settings.model.seq_length) as f64),
            flops_per_iteration: Some(flops::megatron_reported_flops(
                &settings.model,
                t.global_batch_size,
                plan.config.tp,
            )),
            peak_flops_per_gpu: peak,
            world_size: plan.config.world_size(),
        }
    }

    /// The progress line at iteration `n` of `total` taking `ms` each, as lines of at
    /// most `width` columns (its parts carried over whole, indented two).
    pub fn lines(&self, n: u64, total: u64, ms: f64, width: usize) -> Vec<String> {
        let mut parts = vec![format!("iteration {n}/{total}")];
        parts.push(match self.estimated_ms.filter(|e| *e > 0.0) {
            Some(e) => format!("{ms:.1} ms (estimate {e:.1} ms, ×{:.2})", ms / e),
            None => format!("{ms:.1} ms"),
        });
        let gpus = self.world_size.max(1) as f64;
        if ms > 0.0 {
            if let Some(tokens) = self.tokens_per_iteration {
                parts.push(format!(
                    "{:.0} tokens/s per GPU",
                    tokens / (ms / 1000.0) / gpus
                ));
            }
            if let (Some(flops), Some(peak)) = (self.flops_per_iteration, self.peak_flops_per_gpu) {
                parts.push(format!(
                    "MFU {:.2} %",
                    100.0 * flops / (ms / 1000.0) / (gpus * peak)
                ));
            }
        }
        let left = (total.saturating_sub(n) as f64 * ms.max(0.0) / 1000.0).round() as u64;
        parts.push(match left {
            0 => "ETA 0 s".to_string(),
            s => format!(
                "ETA {}",
                crate::exec::format_duration(Duration::from_secs(s))
            ),
        });
        let mut lines: Vec<String> = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let piece = if last {
                part.clone()
            } else {
                format!("{part},")
            };
            match lines.last_mut() {
                Some(line) if line.chars().count() + 1 + piece.chars().count() <= width => {
                    line.push(' ');
                    line.push_str(&piece);
                }
                Some(_) => lines.push(format!("  {piece}")),
                None => lines.push(piece),
            }
        }
        lines
    }
}

/// What the job's lines say about where its time went, in milliseconds after the
/// output's start.
#[derive(Debug, Default)]
struct LineClock {
    first_iteration_ms: Option<u64>,
    last_iteration_ms: Option<u64>,
    /// A `saving checkpoint` line not yet followed by its `successfully saved` one.
    save_started_ms: Option<u64>,
    last_save_end_ms: Option<u64>,
    saving_ms: u64,
    saves: u32,
    /// Megatron's `elapsed time per iteration (ms)` after the first iteration line (the
    /// first holds the warm-up): their sum and count; and the first's, for a job that
    /// logged only one.
    reported_ms: f64,
    reported: u32,
    first_reported_ms: Option<f64>,
}

/// What an attempt's output says about its time (see [`JobOutput::timing`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct OutputTiming {
    /// From the output's start to the first and the last iteration line.
    #[serde(rename = "first_iteration_s", serialize_with = "seconds_or_null")]
    pub first_iteration: Option<Duration>,
    #[serde(rename = "last_iteration_s", serialize_with = "seconds_or_null")]
    pub last_iteration: Option<Duration>,
    /// Saving checkpoints, all saves together; `None` when no line said a checkpoint was
    /// saved (then it is not measured: it is in the training time).
    #[serde(rename = "checkpoint_saving_s", serialize_with = "seconds_or_null")]
    pub checkpoint_saving: Option<Duration>,
    /// The time per iteration Megatron reported, averaged (the first iteration line left
    /// out when there are others).
    pub iteration_ms: Option<f64>,
}

/// Where the nodes' lines are shown besides their log files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    /// Nowhere (library callers that only want the logs).
    Off,
    /// On our stdout or stderr, as the node wrote them.
    Streams,
    /// All on our stderr, so that stdout carries nothing but a result for tools (`--json`).
    Stderr,
}

/// Where a job is, for the stall rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No iteration line yet.
    Starting,
    /// Between the first and the last iteration.
    Training,
    /// The last iteration (`iteration N/N`) is done: saving, evaluating, shutting down.
    Finishing,
}

struct NodeOutput {
    prefix: String,
    log: Mutex<Option<File>>,
}

impl JobOutput {
    /// Output for these `(host, node_rank)` nodes, logs under `log_dir` (created).
    pub fn new(nodes: &[(String, u64)], log_dir: &Path, echo: Echo) -> std::io::Result<JobOutput> {
        std::fs::create_dir_all(log_dir)?;
        let mut map = BTreeMap::new();
        for (host, rank) in nodes {
            let log = File::options()
                .create(true)
                .append(true)
                .open(log_path(log_dir, host))?;
            map.insert(
                host.clone(),
                NodeOutput {
                    prefix: format!("[{host} r{rank}] "),
                    log: Mutex::new(Some(log)),
                },
            );
        }
        Ok(JobOutput {
            start: Instant::now(),
            nodes: map,
            last_line_ms: AtomicU64::new(0),
            last_progress_ms: AtomicU64::new(u64::MAX),
            first_iteration: AtomicU64::new(0),
            last_iteration: AtomicU64::new(0),
            total_iterations: AtomicU64::new(0),
            clock: Mutex::new(LineClock::default()),
            progress: None,
            last_report_ms: AtomicU64::new(0),
            echo,
            straggler_lines: None,
            checkpoint_iteration: AtomicU64::new(0),
            recent_ms: Mutex::new(std::collections::VecDeque::new()),
            best_recent_ms: Mutex::new(0.0),
        })
    }

    /// Keeps the lines of the training script's straggler report for
    /// [`JobOutput::take_straggler_lines`].
    pub fn with_straggler_report(mut self) -> JobOutput {
        self.straggler_lines = Some(Mutex::new(Vec::new()));
        self
    }

    /// The straggler report's lines since the last call, in order.
    pub fn take_straggler_lines(&self) -> Vec<ReportLine> {
        self.straggler_lines.as_ref().map_or_else(Vec::new, |l| {
            std::mem::take(&mut *l.lock().unwrap_or_else(|p| p.into_inner()))
        })
    }

    /// The iteration of the last checkpoint the job said it saved or loaded.
    pub fn checkpoint_iteration(&self) -> Option<u64> {
        Some(self.checkpoint_iteration.load(Ordering::Relaxed)).filter(|i| *i > 0)
    }

    /// The median of the last few times per iteration the job reported, ms: its pace now.
    pub fn recent_iteration_ms(&self) -> Option<f64> {
        let recent = self.recent_ms.lock().unwrap_or_else(|p| p.into_inner());
        (!recent.is_empty()).then(|| median(&recent.iter().copied().collect::<Vec<_>>()))
    }

    /// The job's best pace in this attempt: the lowest median of 5 consecutive reported
    /// iteration times, ms (what it ran at before a node slowed down).
    pub fn best_iteration_ms(&self) -> Option<f64> {
        Some(
            *self
                .best_recent_ms
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
        .filter(|b| *b > 0.0)
    }

    /// The total of iterations the lines give (`--train-iters`).
    pub fn total_iterations(&self) -> Option<u64> {
        Some(self.total_iterations.load(Ordering::Relaxed)).filter(|t| *t > 0)
    }

    /// Shows our progress line during training (see [`ProgressSpec`]).
    pub fn with_progress(mut self, spec: ProgressSpec) -> JobOutput {
        self.progress = Some(spec).filter(|s| !s.interval.is_zero());
        self
    }

    /// Our progress line, when an iteration line comes `interval` after the last one we
    /// printed (or the launch).
    fn report_progress(&self, line: &str, now: u64, (n, total): (u64, u64)) {
        let Some(spec) = &self.progress else {
            return;
        };
        let last = self.last_report_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < spec.interval.as_millis() as u64
            || self
                .last_report_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let Some(ms) = reported_iteration_ms(line).or_else(|| self.timing().iteration_ms) else {
            return;
        };
        if self.echo != Echo::Off {
            let text = spec.lines(n, total, ms, TEXT_WIDTH).join("\n");
            log::log(Level::Info, "progress", &text);
        }
    }

    /// How long since the job last showed progress, and in which [`Phase`] it is: while
    /// training, since the last iteration (or checkpoint or evaluation) line; before the
    /// first iteration line and after the last one (`iteration N/N`), since the last line of
    /// any kind (or the launch).
    pub fn since_progress(&self) -> (Duration, Phase) {
        let now = self.start.elapsed().as_millis() as u64;
        let progress = self.last_progress_ms.load(Ordering::Relaxed);
        let total = self.total_iterations.load(Ordering::Relaxed);
        let phase = if progress == u64::MAX {
            Phase::Starting
        } else if total > 0 && self.last_iteration.load(Ordering::Relaxed) >= total {
            Phase::Finishing
        } else {
            Phase::Training
        };
        let mark = match phase {
            Phase::Training => progress,
            Phase::Starting | Phase::Finishing => self.last_line_ms.load(Ordering::Relaxed),
        };
        (Duration::from_millis(now.saturating_sub(mark)), phase)
    }

    /// The first and last iteration the job reported, when it reported any.
    pub fn iterations(&self) -> Option<(u64, u64)> {
        let first = self.first_iteration.load(Ordering::Relaxed);
        (first > 0).then(|| (first, self.last_iteration.load(Ordering::Relaxed)))
    }

    /// Appends a line of ours (not the node's) to a node's log, e.g. why it was stopped.
    pub fn note(&self, host: &str, text: &str) {
        if let Some(node) = self.nodes.get(host) {
            if let Some(file) = node.log.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                let _ = writeln!(file, "pipette-run: {text}");
            }
        }
    }

    /// What the lines said about the attempt's time so far.
    pub fn timing(&self) -> OutputTiming {
        let clock = self.clock.lock().unwrap_or_else(|p| p.into_inner());
        let ms = |m: Option<u64>| m.map(Duration::from_millis);
        OutputTiming {
            first_iteration: ms(clock.first_iteration_ms),
            last_iteration: ms(clock.last_iteration_ms),
            checkpoint_saving: (clock.saves > 0).then(|| Duration::from_millis(clock.saving_ms)),
            iteration_ms: if clock.reported > 0 {
                Some(clock.reported_ms / f64::from(clock.reported))
            } else {
                clock.first_reported_ms
            },
        }
    }

    /// Reads the times a line tells: an iteration line's, a checkpoint save's start and
    /// end. A save is timed from its `saving checkpoint` line, else (a script that prints
    /// only the end) from the iteration line before it, which Megatron prints before
    /// saving; each save once, however many ranks say it.
    fn clock_line(&self, line: &str, now: u64, iteration: bool) {
        let lower = line.to_ascii_lowercase();
        let saving = lower.contains("saving checkpoint");
        let saved = lower.contains("successfully saved checkpoint");
        if !iteration && !saving && !saved {
            return;
        }
        let mut clock = self.clock.lock().unwrap_or_else(|p| p.into_inner());
        if iteration {
            clock.first_iteration_ms.get_or_insert(now);
            clock.last_iteration_ms = Some(now);
            if let Some(ms) = reported_iteration_ms(line) {
                let mut recent = self.recent_ms.lock().unwrap_or_else(|p| p.into_inner());
                if recent.len() == RECENT {
                    recent.pop_front();
                }
                recent.push_back(ms);
                if recent.len() == RECENT {
                    let now = median(&recent.iter().copied().collect::<Vec<_>>());
                    let mut best = self
                        .best_recent_ms
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    if *best == 0.0 || now < *best {
                        *best = now;
                    }
                }
                if clock.first_reported_ms.is_none() {
                    clock.first_reported_ms = Some(ms);
                } else {
                    clock.reported_ms += ms;
                    clock.reported += 1;
                }
            }
        } else if saving {
            clock.save_started_ms.get_or_insert(now);
        } else {
            let start = clock.save_started_ms.take().or_else(|| {
                // Only an iteration line after the last save starts a new one.
                clock
                    .last_iteration_ms
                    .filter(|at| clock.last_save_end_ms.is_none_or(|end| *at > end))
            });
            if let Some(start) = start {
                clock.saving_ms += now.saturating_sub(start);
                clock.saves += 1;
                clock.last_save_end_ms = Some(now);
            }
        }
    }

    fn mark(&self, line: &str) {
        let now = self.start.elapsed().as_millis() as u64;
        if let Some(lines) = &self.straggler_lines {
            if let Some(report) = stragglers::parse_line(line) {
                lines.lock().unwrap_or_else(|p| p.into_inner()).push(report);
            }
        }
        if let Some(at) = checkpoint_line_iteration(line) {
            self.checkpoint_iteration.store(at, Ordering::Relaxed);
        }
        self.last_line_ms.fetch_max(now, Ordering::Relaxed);
        let parsed = parse_iteration(line);
        self.clock_line(line, now, parsed.is_some());
        if let Some(at) = parsed {
            self.report_progress(line, now, at);
        }
        if let Some((iteration, total)) = parsed {
            self.total_iterations.store(total, Ordering::Relaxed);
            let _ = self.first_iteration.compare_exchange(
                0,
                iteration,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            self.last_iteration.fetch_max(iteration, Ordering::Relaxed);
            self.last_progress_ms.store(now, Ordering::Relaxed);
        } else if self.last_progress_ms.load(Ordering::Relaxed) != u64::MAX
            && is_progress_line(line)
        {
            self.last_progress_ms.store(now, Ordering::Relaxed);
        }
    }
}

impl OutputSink for JobOutput {
    fn line(&self, host: &str, stream: Stream, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        self.mark(&text);
        let Some(node) = self.nodes.get(host) else {
            return;
        };
        if let Some(file) = node.log.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            let _ = file.write_all(line).and_then(|()| file.write_all(b"\n"));
        }
        if self.echo != Echo::Off {
            let mut buffer = Vec::with_capacity(node.prefix.len() + line.len() + 1);
            buffer.extend_from_slice(node.prefix.as_bytes());
            buffer.extend_from_slice(line);
            buffer.push(b'\n');
            // One write per line under the lock, so lines of different nodes never mix.
            // A closed terminal is not a reason to stop the job.
            let _ = match (stream, self.echo) {
                (Stream::Stdout, Echo::Streams) => std::io::stdout().lock().write_all(&buffer),
                _ => std::io::stderr().lock().write_all(&buffer),
            };
        }
    }
}

/// Megatron's `elapsed time per iteration (ms): 312.4` in an iteration line.
fn reported_iteration_ms(line: &str) -> Option<f64> {
    let rest = &line[line.find("elapsed time per iteration (ms):")? + 32..];
    let value = rest
        .trim_start()
        .split(|c: char| c == '|' || c.is_whitespace())
        .next()?;
    value
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
}

/// The iteration of Megatron's `successfully saved checkpoint from iteration N to ...` and
/// `successfully loaded checkpoint from ... at iteration N` lines.
fn checkpoint_line_iteration(line: &str) -> Option<u64> {
    let rest = if let Some(at) = line.find("successfully saved checkpoint from iteration") {
        &line[at + "successfully saved checkpoint from iteration".len()..]
    } else {
        let at = line.find("successfully loaded checkpoint")?;
        let rest = &line[at..];
        &rest[rest.find("at iteration")? + "at iteration".len()..]
    };
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// `DIR/<host>.log`, the host made safe as a file name.
pub fn log_path(dir: &Path, host: &str) -> PathBuf {
    let name: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("{}.log", name.trim_start_matches('.')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_prefixed_logged_and_tracked() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = vec![("node-a".to_string(), 0), ("node/b".to_string(), 1)];
        let output = JobOutput::new(&nodes, dir.path(), Echo::Off).unwrap();
        assert_eq!(output.iterations(), None);
        assert_eq!(output.since_progress().1, Phase::Starting);
        output.line("node-a", Stream::Stdout, b"hello");
        output.line(
            "node/b",
            Stream::Stderr,
            b" iteration        3/      9 | lm loss: 1 |",
        );
        output.line(
            "node/b",
            Stream::Stdout,
            b" iteration        4/      9 | lm loss: 1 |",
        );
        output.note("node-a", "stopped");
        assert_eq!(output.iterations(), Some((3, 4)));
        assert!(output.since_progress().0 < Duration::from_secs(5));
        assert_eq!(output.since_progress().1, Phase::Training);
        output.line(
            "node/b",
            Stream::Stdout,
            b" iteration        9/      9 | lm loss: 1 |",
        );
        assert_eq!(output.since_progress().1, Phase::Finishing);
        let a = std::fs::read_to_string(dir.path().join("node-a.log")).unwrap();
        assert_eq!(a, "hello\npipette-run: stopped\n");
        let b = std::fs::read_to_string(dir.path().join("node_b.log")).unwrap();
        assert_eq!(b.lines().count(), 3);
    }

    #[test]
    fn a_progress_line_measures_against_the_estimate() {
        let spec = ProgressSpec {
            interval: Duration::from_secs(30),
            estimated_ms: Some(200.0),
            tokens_per_iteration: Some(1024.0 * 4096.0),
            flops_per_iteration: Some(8.0e15),
            peak_flops_per_gpu: Some(1.0e15),
            world_size: 16,
        };
        assert_eq!(
            spec.lines(100, 1100, 250.0, TEXT_WIDTH),
            [
                "iteration 100/1100, 250.0 ms (estimate 200.0 ms, ×1.25),",
                "  1048576 tokens/s per GPU, MFU 200.00 %, ETA 4 min 10 s",
            ]
        );
        let plain = ProgressSpec {
            world_size: 4,
            ..ProgressSpec::default()
        };
        assert_eq!(
            plain.lines(3, 3, 10.0, TEXT_WIDTH),
            ["iteration 3/3, 10.0 ms, ETA 0 s"]
        );
    }

    #[test]
    fn the_lines_time_iterations_and_checkpoint_saves() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = vec![("a".to_string(), 0), ("b".to_string(), 1)];
        let output = JobOutput::new(&nodes, dir.path(), Echo::Off).unwrap();
        assert_eq!(output.timing(), OutputTiming::default());
        let iteration = |n: u64, ms: f64| {
            format!(" iteration {n:8}/      9 | elapsed time per iteration (ms): {ms:.1} | x |")
        };
        output.line("a", Stream::Stdout, iteration(1, 900.0).as_bytes());
        output.line("a", Stream::Stdout, iteration(2, 300.0).as_bytes());
        std::thread::sleep(Duration::from_millis(30));
        // The toy script's save: only its end is said, by one rank.
        output.line(
            "a",
            Stream::Stdout,
            b"  successfully saved checkpoint from iteration 2",
        );
        // A second rank saying it again is the same save.
        output.line(
            "b",
            Stream::Stdout,
            b"  successfully saved checkpoint from iteration 2",
        );
        output.line("a", Stream::Stdout, iteration(3, 500.0).as_bytes());
        // Megatron's: its start is said too.
        output.line(
            "a",
            Stream::Stdout,
            b"saving checkpoint at iteration 3 to ck",
        );
        std::thread::sleep(Duration::from_millis(20));
        output.line(
            "a",
            Stream::Stdout,
            b"  successfully saved checkpoint from iteration 3",
        );
        let t = output.timing();
        assert_eq!(t.iteration_ms, Some(400.0));
        let saving = t.checkpoint_saving.unwrap();
        assert!(saving >= Duration::from_millis(50), "{saving:?}");
        assert!(t.first_iteration.unwrap() <= t.last_iteration.unwrap());
        assert!(t.last_iteration.unwrap() + Duration::from_millis(20) <= output.start.elapsed());
    }

    #[test]
    fn the_lines_give_the_checkpoint_the_pace_and_the_straggler_report() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = vec![("a".to_string(), 0)];
        let output = JobOutput::new(&nodes, dir.path(), Echo::Off)
            .unwrap()
            .with_straggler_report();
        assert_eq!(output.checkpoint_iteration(), None);
        assert_eq!(output.recent_iteration_ms(), None);
        output.line(
            "a",
            Stream::Stdout,
            b"  successfully loaded checkpoint from /ck [ t 1/1, p 1/1 ] at iteration 8",
        );
        assert_eq!(output.checkpoint_iteration(), Some(8));
        let iteration = |n: u64, ms: f64| {
            format!(" iteration {n:8}/     90 | elapsed time per iteration (ms): {ms:.1} | x |")
        };
        // Steady at 100 ms (one outlier), then slowed to 250 ms.
        for (n, ms) in [100.0, 100.0, 900.0, 100.0, 100.0, 250.0, 250.0, 250.0]
            .iter()
            .enumerate()
        {
            output.line("a", Stream::Stdout, iteration(9 + n as u64, *ms).as_bytes());
        }
        assert_eq!(output.best_iteration_ms(), Some(100.0));
        assert_eq!(output.recent_iteration_ms(), Some(250.0));
        assert_eq!(output.total_iterations(), Some(90));
        output.line(
            "a",
            Stream::Stdout,
            b"  successfully saved checkpoint from iteration      16 to /ck",
        );
        assert_eq!(output.checkpoint_iteration(), Some(16));
        output.line(
            "a",
            Stream::Stdout,
            b"[x] | MnRtt/Rnk: 1.00ms/0 | MxRtt/Rnk: 2.00ms/1 | MnEtpt/Rnk: 1.00TF/1 | MxEtpt/Rnk: 2.00TF/0",
        );
        assert_eq!(
            output.take_straggler_lines(),
            [ReportLine::Summary(vec![(1, 1.0), (0, 2.0)])]
        );
        assert!(output.take_straggler_lines().is_empty());
    }
}
