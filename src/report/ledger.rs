//! The closing summary of a launch and its goodput ledger: where the wall time went
//! (profiling, planning, trial, start-up, training, checkpoint saving, failure detection,
//! teardown, restart, recomputed iterations, other), the share that trained, and the
//! iteration time measured against the estimate with tokens/s per GPU and MFU. Written to
//! the run directory as `ledger.json` ([`SCHEMA`]) and in `summary.txt`.
//!
//! The parts add up to the wall time exactly: each is a whole number of milliseconds cut
//! from an interval measured inside the wall time, and `other` is what they leave.

use std::time::Duration;

use serde::Serialize;

use crate::supervise::{reporter, AttemptSummary, Outcome};

use super::{compress_hosts, wrap, WIDTH};

/// `ledger.json`'s schema name and version; the version changes with any field.
pub const SCHEMA: &str = "pipette-ledger/1";

/// What the ledger is made from besides the supervisor's attempts.
#[derive(Debug, Clone, Default)]
pub struct LedgerInputs {
    /// From pipette-run's start to the ledger.
    pub wall: Duration,
    /// Discovering the nodes and profiling them (or reading `--cluster`), reading the
    /// inputs.
    pub profiling: Duration,
    /// Planning before the trial and after it.
    pub planning: Duration,
    /// The trial run with its re-plans; `None` when none ran.
    pub trial: Option<Duration>,
    /// Preparing the launch (checking torchrun, rendering, the run directory's files):
    /// counted in start-up.
    pub preparation: Duration,
    /// The work of one iteration, for throughput; `None` when planning is off.
    pub work: Option<Work>,
}

/// The work of one iteration.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Work {
    /// Global batch × sequence length.
    pub tokens: f64,
    /// Model FLOPs (as Megatron reports them), all GPUs together.
    pub flops: f64,
    /// The GPUs' peak FLOP/s each at the training precision, when known.
    pub peak_flops_per_gpu: Option<f64>,
}

/// One part of the wall time.
#[derive(Debug, Clone, Serialize)]
pub struct LedgerPart {
    /// `profiling`, `planning`, `trial`, `start-up`, `training`, `checkpoint saving`,
    /// `failure detection`, `teardown`, `restart`, `recomputed iterations`, `other`.
    pub part: &'static str,
    pub seconds: f64,
    /// False where the job's output could not tell it (checkpoint saving without a line
    /// saying a checkpoint was saved): its time is then inside `training`.
    pub measured: bool,
    #[serde(skip)]
    ms: u64,
}

/// The iteration time measured against the estimate, and what it means for throughput.
#[derive(Debug, Clone, Serialize)]
pub struct IterationFigures {
    /// Averaged over the attempts by the iterations each ran.
    pub measured_ms: f64,
    pub estimated_ms: Option<f64>,
    pub tokens_per_s_per_gpu: Option<f64>,
    /// Model FLOPs utilisation: model FLOPs per second over the GPUs' peak, a fraction.
    pub mfu: Option<f64>,
}

/// The goodput ledger of one launch.
#[derive(Debug, Clone, Serialize)]
pub struct Ledger {
    pub schema: &'static str,
    pub wall_s: f64,
    /// They add up to `wall_s` (to the millisecond).
    pub parts: Vec<LedgerPart>,
    /// Training over the wall time.
    pub effective_training_ratio: f64,
    /// `null` when no attempt reported its iteration time.
    pub iteration: Option<IterationFigures>,
    /// Every attempt's hosts, in Slurm's hostlist form.
    pub hosts: Vec<String>,
}

/// Whole milliseconds, rounded down, so that parts of one interval never add up to more
/// than it.
fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl Ledger {
    /// The ledger of a launch whose attempts are `attempts`.
    pub fn new(inputs: &LedgerInputs, attempts: &[AttemptSummary]) -> Ledger {
        let wall = ms(inputs.wall);
        let mut total = Totals::default();
        let mut saving_measured = false;
        for (i, a) in attempts.iter().enumerate() {
            let t = &a.timing;
            let run = ms(t.running);
            let startup = t.output.first_iteration.map_or(run, ms).min(run);
            let last = t
                .output
                .last_iteration
                .map_or(startup, ms)
                .clamp(startup, run);
            let mut training = last - startup;
            let tail = run - last;
            let (detection, mut finishing) = if t.failed { (tail, 0) } else { (0, tail) };
            if let Some(saving) = t.output.checkpoint_saving.map(ms) {
                saving_measured = true;
                let from_training = saving.min(training);
                let from_finishing = (saving - from_training).min(finishing);
                training -= from_training;
                finishing -= from_finishing;
                total.checkpoint += from_training + from_finishing;
            }
            let redone = i
                .checked_sub(1)
                .and_then(|p| recomputed_iterations(&attempts[p], a));
            if let (Some(count), Some(per)) = (redone, t.output.iteration_ms) {
                let recomputed = ((count as f64 * per) as u64).min(training);
                training -= recomputed;
                total.recomputed += recomputed;
            }
            total.startup += startup;
            total.training += training;
            total.detection += detection;
            total.teardown += ms(t.teardown) + finishing;
            total.restart += ms(t.restart);
        }
        let mut parts: Vec<(&'static str, u64, bool)> = vec![
            ("profiling", ms(inputs.profiling), true),
            ("planning", ms(inputs.planning), true),
            ("trial", inputs.trial.map_or(0, ms), true),
            ("start-up", ms(inputs.preparation) + total.startup, true),
            ("training", total.training, true),
            ("checkpoint saving", total.checkpoint, saving_measured),
            ("failure detection", total.detection, true),
            ("teardown", total.teardown, true),
            ("restart", total.restart, true),
            ("recomputed iterations", total.recomputed, true),
        ];
        let counted: u64 = parts.iter().map(|(_, ms, _)| ms).sum();
        // Measured inside the wall time and rounded down, the parts never exceed it; a
        // clock that disagrees would make the wall time their sum rather than lose a part.
        let wall = wall.max(counted);
        parts.push(("other", wall - counted, true));
        Ledger {
            schema: SCHEMA,
            wall_s: wall as f64 / 1000.0,
            effective_training_ratio: if wall > 0 {
                total.training as f64 / wall as f64
            } else {
                0.0
            },
            parts: parts
                .into_iter()
                .map(|(part, ms, measured)| LedgerPart {
                    part,
                    seconds: ms as f64 / 1000.0,
                    measured,
                    ms,
                })
                .collect(),
            iteration: iteration_figures(attempts, inputs.work),
            hosts: attempts.iter().map(|a| compress_hosts(&a.hosts)).collect(),
        }
    }

    /// The parts' sum in milliseconds (the wall time's, by construction).
    pub fn parts_ms(&self) -> u64 {
        self.parts.iter().map(|p| p.ms).sum()
    }

    /// The ledger for people: a row per part, then the ratio and the iteration's figures.
    pub fn to_human(&self) -> String {
        let wall = self.wall_s;
        let mut out = format!("  where the wall time of {} went:\n", seconds(wall));
        for p in &self.parts {
            if !p.measured {
                out.push_str(&format!(
                    "    {:<22} not measured (no save line in the output)\n",
                    p.part
                ));
                continue;
            }
            let share = if wall > 0.0 {
                100.0 * p.seconds / wall
            } else {
                0.0
            };
            out.push_str(&format!(
                "    {:<22}{:>10} {share:>6.1} %\n",
                p.part,
                seconds(p.seconds)
            ));
        }
        out.push_str(&format!(
            "  effective training time: {:.1} % of the wall time\n",
            100.0 * self.effective_training_ratio
        ));
        if let Some(i) = &self.iteration {
            let estimate = match i.estimated_ms {
                Some(e) if e > 0.0 => format!(
                    ", estimated {e:.1} ms ({:.2}× the estimate)",
                    i.measured_ms / e
                ),
                _ => String::new(),
            };
            out.push_str(&format!(
                "  iteration {:.1} ms measured{estimate}\n",
                i.measured_ms
            ));
            if let Some(tokens) = i.tokens_per_s_per_gpu {
                let mfu = match i.mfu {
                    Some(m) => format!(", MFU {:.2} %", 100.0 * m),
                    // See model::time::mfu_peak_tflops: only a datasheet peak bounds it.
                    None => ", no MFU (no datasheet peak at this precision; a measured matmul rate is no bound)".to_string(),
                };
                out.push_str(&format!("  {tokens:.0} tokens/s per GPU{mfu}\n"));
            }
        } else {
            out.push_str("  iteration time not measured (no iteration line reported it)\n");
        }
        out
    }
}

/// `58.9 s`, `12 min 03 s`.
fn seconds(s: f64) -> String {
    if s < 600.0 {
        format!("{s:.1} s")
    } else {
        let whole = s.round() as u64;
        if whole < 3600 {
            format!("{} min {:02} s", whole / 60, whole % 60)
        } else {
            format!("{} h {:02} min", whole / 3600, whole % 3600 / 60)
        }
    }
}

#[derive(Default)]
struct Totals {
    startup: u64,
    training: u64,
    checkpoint: u64,
    detection: u64,
    teardown: u64,
    restart: u64,
    recomputed: u64,
}

/// Iterations `next` ran again: those `previous` reported after the checkpoint `next`
/// resumed from (all of them when it started afresh).
fn recomputed_iterations(previous: &AttemptSummary, next: &AttemptSummary) -> Option<u64> {
    let (_, last) = previous.iterations?;
    let resumed_at = next.resume.as_ref().and_then(|r| r.iteration).unwrap_or(0);
    (last > resumed_at).then(|| last - resumed_at)
}

/// The measured iteration time (averaged over the attempts by the iterations each
/// reported) against the estimate, tokens/s per GPU and MFU.
fn iteration_figures(attempts: &[AttemptSummary], work: Option<Work>) -> Option<IterationFigures> {
    let mut weight = 0.0;
    let (mut measured, mut estimated, mut tokens, mut mfu) = (0.0, 0.0, 0.0, 0.0);
    let mut all_estimated = true;
    for a in attempts {
        let (Some(ms), Some((first, last))) = (a.timing.output.iteration_ms, a.iterations) else {
            continue;
        };
        if ms <= 0.0 {
            continue;
        }
        let w = (last - first + 1) as f64;
        weight += w;
        measured += w * ms;
        match a.estimated_ms {
            Some(e) => estimated += w * e,
            None => all_estimated = false,
        }
        if let Some(work) = work {
            let gpus = a.world_size.max(1) as f64;
            tokens += w * work.tokens / (ms / 1000.0) / gpus;
            if let Some(peak) = work.peak_flops_per_gpu.filter(|p| *p > 0.0) {
                mfu += w * work.flops / (ms / 1000.0) / (gpus * peak);
            }
        }
    }
    if weight == 0.0 {
        return None;
    }
    let has_peak = work.is_some_and(|w| w.peak_flops_per_gpu.is_some_and(|p| p > 0.0));
    Some(IterationFigures {
        measured_ms: measured / weight,
        estimated_ms: all_estimated.then_some(estimated / weight),
        tokens_per_s_per_gpu: work.map(|_| tokens / weight),
        mfu: has_peak.then_some(mfu / weight),
    })
}

/// The end of a job for people: every attempt (hosts in hostlist form), every re-plan,
/// the exit, then the ledger when there is one. Fits [`WIDTH`] columns.
pub fn job_summary(outcome: &Outcome, ledger: Option<&Ledger>) -> String {
    let mut text = String::from("pipette-run: summary\n");
    for a in &outcome.attempts {
        text.push_str(&format!(
            "  attempt {}: {} node(s) ({}), {}{}{}: {}\n",
            a.number,
            a.hosts.len(),
            compress_hosts(&a.hosts),
            reporter::layout_text(a.config.as_ref(), a.world_size),
            a.resume
                .as_ref()
                .map(|r| format!(
                    ", resumed from {}{}",
                    r.dir,
                    r.iteration
                        .map(|i| format!(" at iteration {i}"))
                        .unwrap_or_default()
                ))
                .unwrap_or_default(),
            match (a.iterations, &a.config) {
                (Some((f, l)), _) => format!(", iterations {f}–{l}"),
                (None, Some(_)) => ", no iteration reported".to_string(),
                // A script that is not Megatron's has no iteration lines to report.
                (None, None) => String::new(),
            },
            a.end
        ));
        if !a.left_out.is_empty() {
            text.push_str(&format!("    left out: {}\n", compress_hosts(&a.left_out)));
        }
        if let Some(replan) = &a.replan {
            text.push_str(&format!("    re-plan: {replan}\n"));
        }
    }
    let relaunch = if outcome.relaunch_after.is_empty() {
        String::new()
    } else {
        format!(
            "  from each failure to its relaunch: {}\n",
            outcome
                .relaunch_after
                .iter()
                .map(|d| format!("{:.2} s", d.as_secs_f64()))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    text.push_str(&format!(
        "  exit code {}: {}; {} re-plan(s)\n{relaunch}",
        outcome.exit_code, outcome.reason, outcome.replans
    ));
    if let Some(ledger) = ledger {
        text.push_str(&ledger.to_human());
    }
    wrap(&text, WIDTH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::Resume;
    use crate::model::ParallelConfig;
    use crate::supervise::output::OutputTiming;
    use crate::supervise::AttemptTiming;

    fn attempt(
        number: u32,
        timing: AttemptTiming,
        iterations: Option<(u64, u64)>,
        resume: Option<u64>,
    ) -> AttemptSummary {
        AttemptSummary {
            number,
            hosts: vec!["n01".into(), "n02".into(), "n03".into()],
            config: Some(ParallelConfig::even(2, 1, 1, 6, 1)),
            world_size: 6,
            resume: resume.map(|i| Resume {
                dir: "ck".into(),
                iteration: Some(i),
            }),
            iterations,
            end: "finished".into(),
            left_out: Vec::new(),
            replan: None,
            estimated_ms: Some(100.0),
            timing,
        }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// A failed attempt (iterations 1–10, the last line 1.5 s before the failure was
    /// seen) and its relaunch from the checkpoint at iteration 8 (2 iterations redone).
    fn two_attempts() -> Vec<AttemptSummary> {
        let first = AttemptTiming {
            running: secs(10.0),
            output: OutputTiming {
                first_iteration: Some(secs(4.0)),
                last_iteration: Some(secs(8.5)),
                checkpoint_saving: Some(secs(0.5)),
                iteration_ms: Some(200.0),
            },
            teardown: secs(3.25),
            restart: secs(1.0),
            failed: true,
        };
        let second = AttemptTiming {
            running: secs(9.0),
            output: OutputTiming {
                first_iteration: Some(secs(3.0)),
                last_iteration: Some(secs(8.0)),
                checkpoint_saving: None,
                iteration_ms: Some(250.0),
            },
            teardown: secs(0.75),
            restart: Duration::ZERO,
            failed: false,
        };
        vec![
            attempt(1, first, Some((1, 10)), None),
            attempt(2, second, Some((9, 20)), Some(8)),
        ]
    }

    #[test]
    fn the_parts_add_up_to_the_wall_time() {
        let inputs = LedgerInputs {
            wall: secs(30.0),
            profiling: secs(1.234),
            planning: secs(0.5),
            trial: Some(secs(2.0)),
            preparation: secs(0.25),
            work: None,
        };
        let ledger = Ledger::new(&inputs, &two_attempts());
        let part = |name: &str| {
            ledger
                .parts
                .iter()
                .find(|p| p.part == name)
                .unwrap()
                .seconds
        };
        assert_eq!(ledger.parts_ms(), 30_000);
        assert_eq!(part("start-up"), 0.25 + 7.0);
        // 4.5 s less the 0.5 s save, then 5 s less 2 iterations redone at 250 ms.
        assert_eq!(part("training"), 4.0 + 4.5);
        assert_eq!(part("checkpoint saving"), 0.5);
        assert_eq!(part("recomputed iterations"), 0.5);
        assert_eq!(part("failure detection"), 1.5);
        // Both teardowns, and the finished attempt's last second after its last line.
        assert_eq!(part("teardown"), 3.25 + 0.75 + 1.0);
        assert_eq!(part("restart"), 1.0);
        // The attempts' own intervals: 10 + 3.25 + 1 and 9 + 0.75 seconds.
        assert!((part("other") - (30.0 - 1.234 - 0.5 - 2.0 - 0.25 - 24.0)).abs() < 1e-9);
        assert!((ledger.effective_training_ratio - 8.5 / 30.0).abs() < 1e-9);
        assert_eq!(ledger.hosts, ["n[01-03]", "n[01-03]"]);
        let sum: f64 = ledger.parts.iter().map(|p| p.seconds).sum();
        assert!((sum - ledger.wall_s).abs() < 1e-6);
    }

    #[test]
    fn the_parts_add_up_whatever_the_times() {
        // Every rounding and clamp, over many shapes of attempt: the sum is the wall.
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as f64 / (1u64 << 31) as f64
        };
        for _ in 0..500 {
            let mut attempts = two_attempts();
            for a in &mut attempts {
                let t = &mut a.timing;
                t.running = secs(10.0 * next());
                t.output.first_iteration = (next() > 0.2).then(|| secs(12.0 * next()));
                t.output.last_iteration = (next() > 0.2).then(|| secs(12.0 * next()));
                t.output.checkpoint_saving = (next() > 0.5).then(|| secs(5.0 * next()));
                t.output.iteration_ms = Some(1000.0 * next());
                t.teardown = secs(3.0 * next());
                t.restart = secs(next());
                t.failed = next() > 0.5;
            }
            let inputs = LedgerInputs {
                wall: secs(40.0 * next()),
                profiling: secs(next()),
                planning: secs(next()),
                trial: (next() > 0.5).then(|| secs(next())),
                preparation: secs(next()),
                work: None,
            };
            let ledger = Ledger::new(&inputs, &attempts);
            assert_eq!(ledger.parts_ms(), (ledger.wall_s * 1000.0).round() as u64);
            assert!(ledger.wall_s * 1000.0 >= (inputs.wall.as_millis() as f64) - 0.5);
        }
    }

    #[test]
    fn throughput_follows_the_measured_iteration() {
        let work = Work {
            tokens: 12.0 * 32.0,
            flops: 6.0e9,
            peak_flops_per_gpu: Some(0.5e12),
        };
        let f = iteration_figures(&two_attempts(), Some(work)).unwrap();
        // 10 iterations at 200 ms, 12 at 250 ms.
        assert!((f.measured_ms - (10.0 * 200.0 + 12.0 * 250.0) / 22.0).abs() < 1e-9);
        assert_eq!(f.estimated_ms, Some(100.0));
        let tokens = (10.0 * 384.0 / 0.2 / 6.0 + 12.0 * 384.0 / 0.25 / 6.0) / 22.0;
        assert!((f.tokens_per_s_per_gpu.unwrap() - tokens).abs() < 1e-6);
        let mfu = (10.0 * 6.0e9 / 0.2 / 3.0e12 + 12.0 * 6.0e9 / 0.25 / 3.0e12) / 22.0;
        assert!((f.mfu.unwrap() - mfu).abs() < 1e-12);
        assert!(iteration_figures(&[], Some(work)).is_none());
    }

    #[test]
    fn the_summary_fits_80_columns_and_says_what_was_not_measured() {
        let mut attempts = two_attempts();
        attempts[1].timing.output.checkpoint_saving = None;
        attempts[0].timing.output.checkpoint_saving = None;
        let ledger = Ledger::new(
            &LedgerInputs {
                wall: secs(30.0),
                ..LedgerInputs::default()
            },
            &attempts,
        );
        let outcome = Outcome {
            exit_code: 0,
            reason: "training finished".into(),
            attempts,
            replans: 1,
            relaunch_after: vec![secs(4.5)],
        };
        let text = job_summary(&outcome, Some(&ledger));
        assert!(text.lines().all(|l| l.chars().count() <= WIDTH), "{text}");
        assert!(text.contains("3 node(s) (n[01-03])"), "{text}");
        assert!(
            text.contains("checkpoint saving      not measured"),
            "{text}"
        );
    }
}
