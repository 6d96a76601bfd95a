//! Reading what a trial's training script prints: Megatron's iteration line and its memory
//! report line (megatron-core 0.19.2, `megatron/training/training.py` `training_log` and
//! `megatron/training/utils/common_utils.py` `report_memory`), and torchrun's verdict on
//! a worker that ran out of memory.
//!
//! Both lines are matched anywhere in a line, so prefixes that launchers add
//! (`0: ` from `srun --label`, `[default0]:` from torchrun's `--tee`) do not matter.

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::launch::output_lines::parse_iteration;

/// The time in Megatron's iteration line (` [2024-10-24 21:02:23] iteration       20/
/// 40000 | consumed samples: 1280 | elapsed time per iteration (ms): 826.6 | ...`); the
/// iteration and the total are read by the supervisor's parser,
/// [`crate::launch::output_lines::parse_iteration`].
static ELAPSED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"elapsed time per iteration \(ms\):\s*([0-9]+(?:\.[0-9]+)?)")
        .expect("a valid regex")
});

/// `[Rank 0] (after 20 iterations) memory (MB) | allocated: 1550.40 | max allocated:
/// 20561.49 | reserved: 28404.0 | max reserved: 28404.0`.
static MEMORY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: ([0-9.]+) \| max allocated: ([0-9.]+) \| reserved: ([0-9.]+) \| max reserved: ([0-9.]+)",
    )
    .expect("a valid regex")
});

/// One iteration line.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct IterationLine {
    pub iteration: u64,
    pub total: u64,
    pub elapsed_ms: f64,
}

/// One memory report line, in bytes (Megatron prints MiB: `/ (1024 * 1024)`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemoryLine {
    pub rank: u64,
    pub after_iterations: u64,
    pub allocated_bytes: u64,
    pub max_allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub max_reserved_bytes: u64,
}

/// The iteration line in `line`, if it is one that gives the time per iteration.
pub fn parse_iteration_line(line: &str) -> Option<IterationLine> {
    let (iteration, total) = parse_iteration(line)?;
    let elapsed_ms = ELAPSED.captures(line)?[1].parse().ok()?;
    Some(IterationLine {
        iteration,
        total,
        elapsed_ms,
    })
}

/// The memory report in `line`, if it is one.
pub fn parse_memory_line(line: &str) -> Option<MemoryLine> {
    let c = MEMORY.captures(line)?;
    let mib = |i: usize| -> Option<u64> {
        let v: f64 = c[i].parse().ok()?;
        Some((v * (1u64 << 20) as f64).round() as u64)
    };
    Some(MemoryLine {
        rank: c[1].parse().ok()?,
        after_iterations: c[2].parse().ok()?,
        allocated_bytes: mib(3)?,
        max_allocated_bytes: mib(4)?,
        reserved_bytes: mib(5)?,
        max_reserved_bytes: mib(6)?,
    })
}

/// The time per iteration: the median of the iterations after the first (the first pays
/// for warm-up: allocator growth, kernel selection, communicator set-up). `None` without
/// at least two iterations.
pub fn iteration_ms(lines: &[IterationLine]) -> Option<f64> {
    let first = lines.iter().map(|l| l.iteration).min()?;
    let mut times: Vec<f64> = lines
        .iter()
        .filter(|l| l.iteration > first)
        .map(|l| l.elapsed_ms)
        .collect();
    if times.is_empty() {
        return None;
    }
    times.sort_by(f64::total_cmp);
    let n = times.len();
    Some(if n % 2 == 1 {
        times[n / 2]
    } else {
        (times[n / 2 - 1] + times[n / 2]) / 2.0
    })
}

/// Iterations after the warm-up that a stable median needs at least.
pub const STABLE_AFTER: usize = 3;
/// A median is stable when the newest iteration moves it by at most this share.
pub const STABLE_WITHIN: f64 = 0.02;

/// Whether the time per iteration ([`iteration_ms`]) is settled: at least [`STABLE_AFTER`]
/// iterations after the first, and the newest moved the median by at most
/// [`STABLE_WITHIN`]. Lines of the same iteration (from several ranks) count once.
pub fn median_is_stable(lines: &[IterationLine]) -> bool {
    let mut by_iteration = std::collections::BTreeMap::new();
    for l in lines {
        by_iteration.entry(l.iteration).or_insert(*l);
    }
    let lines: Vec<IterationLine> = by_iteration.into_values().collect();
    if lines.len() < STABLE_AFTER + 1 {
        return false;
    }
    match (
        iteration_ms(&lines),
        iteration_ms(&lines[..lines.len() - 1]),
    ) {
        (Some(now), Some(before)) if before > 0.0 => {
            ((now - before) / before).abs() <= STABLE_WITHIN
        }
        _ => false,
    }
}

/// Whether to stop the trial now (TERM to its workers): its time per iteration is settled
/// ([`median_is_stable`]) and it has iterations left to save. A run that has reached its
/// last iteration is ending by itself: a TERM then only races its ranks' exit, and a rank
/// stopped in its teardown lost its peak-memory report (a trial candidate that had run
/// every iteration came back without rank 0's peak).
pub fn worth_stopping(lines: &[IterationLine]) -> bool {
    let finished = lines.iter().any(|l| l.total > 0 && l.iteration >= l.total);
    !finished && median_is_stable(lines)
}

/// Whether the failing rank's error — its traceback's last line, `Type: message` — is
/// running out of memory: PyTorch's CUDA allocator (`torch.OutOfMemoryError: CUDA out of
/// memory`), Python's `MemoryError`, or a CPU allocation that failed
/// (`DefaultCPUAllocator: can't allocate memory`). Only that line is judged: a script
/// may print "CUDA out of memory" anywhere (a log line, a retry it survived) and then
/// fail of something else.
pub fn ran_out_of_memory(error: &str) -> bool {
    let error = error.trim();
    let kind = error.split(':').next().unwrap_or_default().trim();
    kind.ends_with("OutOfMemoryError")
        || kind.ends_with("MemoryError") && !kind.contains(' ')
        || error.contains("CUDA out of memory")
        || error.contains("can't allocate memory")
}

/// The failing rank's Python traceback as torchrun's failure report shows it: the
/// `traceback :` field of its "Root Cause (first observed failure)" block, which holds the
/// worker's error file (`TORCHELASTIC_ERROR_FILE`: written by torch's `@record`, or by the
/// trial's hook). `None` when the report has no traceback (no error file: torchrun then
/// points to its documentation instead, or the worker died of a signal).
pub fn root_cause_traceback(output: &str) -> Option<Vec<String>> {
    let start = output.rfind("Root Cause (first observed failure)")?;
    let mut lines = output[start..].lines();
    let first = lines.find_map(|l| {
        l.trim_start()
            .strip_prefix("traceback")
            .and_then(|r| r.trim_start().strip_prefix(':'))
    })?;
    let first = first.trim();
    if !first.starts_with("Traceback") {
        return None;
    }
    let mut traceback = vec![first.to_string()];
    // torchrun indents the traceback's other lines by two; its border ends the block.
    for line in lines {
        if line.starts_with("====") || line.starts_with("----") {
            break;
        }
        traceback.push(line.strip_prefix("  ").unwrap_or(line).to_string());
    }
    while traceback.last().is_some_and(|l| l.trim().is_empty()) {
        traceback.pop();
    }
    Some(traceback)
}

// Read by the failure's one classification too (launch::failure), so it lives there.
pub use crate::launch::output_lines::last_exception_line;

#[cfg(test)]
mod tests {
    use super::*;

    // Real lines, from a Megatron-LM training log pasted in a public GitHub issue (an MoE
    // experiment, October 2024):
    const ISSUE_MEMORY: &str = "[Rank 0] (after 20 iterations) memory (MB) | allocated: 1550.404296875 | max allocated: 20561.49462890625 | reserved: 28404.0 | max reserved: 28404.0";
    const ISSUE_ITERATION: &str = " [2024-10-24 21:02:23] iteration       20/   40000 | consumed samples:         1280 | elapsed time per iteration (ms): 826.6 | throughput per GPU (TFLOP/s/GPU): 23.5 | learning rate: 1.200000E-05 | global batch size:    64 | lm loss: 1.145711E+01 | loss scale: 1.0 | grad norm: 2.456 | num zeros: 57219176.0 | params norm: 315.023 | number of skipped iterations:   0 | number of nan iterations:   0 |";
    // From another public issue's log, run under `srun --label` (the `2: ` prefix) with
    // Megatron-DeepSpeed, whose line has no date.
    const LABELLED_MEMORY: &str = "2: [Rank 2] (after 1 iterations) memory (MB) | allocated: 7063.22802734375 | max allocated: 23105.095703125 | reserved: 35048.0 | max reserved: 35048.0";
    const UNDATED_ITERATION: &str = " iteration        2/   23841 | consumed samples:         2048 | elapsed time per iteration (ms): 428149.6 | mfu: 61.2272 |";
    // What megatron-core 0.19.2's training_log prints (format strings in training.py,
    // lines 2844-2852: the date now has microseconds), and examples/train_gpt.py.
    const CORE_0_19_ITERATION: &str = " [2026-11-22 05:34:39.123456] iteration        3/       5 | consumed samples:           24 | elapsed time per iteration (ms): 1234.5 | learning rate: 1.000000E-03 | global batch size:     8 | lm loss: 5.412300E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |";

    #[test]
    fn reads_megatron_iteration_lines() {
        assert_eq!(
            parse_iteration_line(ISSUE_ITERATION),
            Some(IterationLine {
                iteration: 20,
                total: 40000,
                elapsed_ms: 826.6
            })
        );
        assert_eq!(
            parse_iteration_line(UNDATED_ITERATION).map(|l| (l.iteration, l.elapsed_ms)),
            Some((2, 428149.6))
        );
        assert_eq!(
            parse_iteration_line(CORE_0_19_ITERATION).map(|l| (l.iteration, l.total, l.elapsed_ms)),
            Some((3, 5, 1234.5))
        );
        assert_eq!(parse_iteration_line(ISSUE_MEMORY), None);
        assert_eq!(
            parse_iteration_line("resuming training at iteration 5"),
            None
        );
    }

    #[test]
    fn reads_megatron_memory_lines() {
        let m = parse_memory_line(ISSUE_MEMORY).unwrap();
        assert_eq!((m.rank, m.after_iterations), (0, 20));
        assert_eq!(m.max_reserved_bytes, 28404 << 20);
        assert_eq!(m.reserved_bytes, 28404 << 20);
        assert_eq!(
            m.max_allocated_bytes,
            (20561.49462890625f64 * 1048576.0).round() as u64
        );
        let m = parse_memory_line(LABELLED_MEMORY).unwrap();
        assert_eq!((m.rank, m.after_iterations), (2, 1));
        assert_eq!(m.max_reserved_bytes, 35048 << 20);
        assert_eq!(parse_memory_line(ISSUE_ITERATION), None);
    }

    #[test]
    fn iteration_time_is_the_median_after_warm_up() {
        let line = |iteration, elapsed_ms| IterationLine {
            iteration,
            total: 5,
            elapsed_ms,
        };
        let lines = [
            line(1, 9000.0),
            line(2, 100.0),
            line(3, 130.0),
            line(4, 110.0),
            line(5, 500.0),
        ];
        assert_eq!(iteration_ms(&lines), Some(120.0));
        assert_eq!(iteration_ms(&lines[..4]), Some(110.0));
        assert_eq!(iteration_ms(&lines[..1]), None);
        assert_eq!(iteration_ms(&[]), None);
    }

    #[test]
    fn a_median_is_stable_after_a_few_steady_iterations() {
        let lines = |ms: &[f64]| -> Vec<IterationLine> {
            ms.iter()
                .enumerate()
                .map(|(i, &elapsed_ms)| IterationLine {
                    iteration: i as u64 + 1,
                    total: 10,
                    elapsed_ms,
                })
                .collect()
        };
        // Warm-up and two more: too few.
        assert!(!median_is_stable(&lines(&[900.0, 100.0, 100.0])));
        // Three after the warm-up, the newest changing nothing.
        assert!(median_is_stable(&lines(&[900.0, 100.0, 101.0, 100.5])));
        // The newest moves the median by 5 %: not yet.
        assert!(!median_is_stable(&lines(&[900.0, 100.0, 110.0, 100.0])));
        // A line per rank counts once.
        let mut twice = lines(&[900.0, 100.0, 110.0]);
        twice.extend(lines(&[900.0, 100.0, 110.0]));
        assert!(!median_is_stable(&twice));
    }

    /// The trial race: the median settled on the last iteration; stopping then would only
    /// race the ranks' own exit (and their peak-memory reports).
    #[test]
    fn a_trial_on_its_last_iteration_is_not_stopped() {
        let lines = |ms: &[f64], total| -> Vec<IterationLine> {
            ms.iter()
                .enumerate()
                .map(|(i, &elapsed_ms)| IterationLine {
                    iteration: i as u64 + 1,
                    total,
                    elapsed_ms,
                })
                .collect()
        };
        let steady = [900.0, 100.0, 101.0, 100.5];
        assert!(worth_stopping(&lines(&steady, 10)));
        assert!(!worth_stopping(&lines(&steady, 4)));
        assert!(!worth_stopping(&lines(&[900.0, 100.0, 110.0, 100.0], 10)));
    }

    #[test]
    fn out_of_memory_is_recognised() {
        assert!(ran_out_of_memory(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
        ));
        assert!(ran_out_of_memory("MemoryError"));
        assert!(ran_out_of_memory("RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes."));
        assert!(!ran_out_of_memory("RuntimeError: Connection refused"));
        // Only the error itself counts, not what the message talks about elsewhere.
        assert!(!ran_out_of_memory("ValueError: bad warm-up"));
        assert!(!ran_out_of_memory(
            "AssertionError: expected no MemoryError here"
        ));
    }

    // torchrun 2.x's failure report for a worker whose error file was written (format
    // strings in torch/distributed/elastic/multiprocessing/errors/__init__.py).
    const REPORT: &str = "\
[rank1]: log: CUDA out of memory once, retried with a smaller bucket
Traceback (most recent call last):
  File \"/w/train.py\", line 9, in <module>
ValueError: warm-up longer than the run
E1124 11:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1)
Traceback (most recent call last):
  File \"/venv/bin/torchrun\", line 8, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-24_11:00:00
  host      : node-b
  rank      : 1 (local_rank: 0)
  exitcode  : 1 (pid: 42)
  error_file: /tmp/torchelastic_x/none_y/attempt_0/0/error.json
  traceback : Traceback (most recent call last):
    File \"/w/train.py\", line 9, in <module>
      raise ValueError(\"warm-up longer than the run\")
  ValueError: warm-up longer than the run
  
============================================================
";

    #[test]
    fn the_failing_ranks_traceback_is_read_from_torchruns_report() {
        let tb = root_cause_traceback(REPORT).unwrap();
        assert_eq!(tb.first().unwrap(), "Traceback (most recent call last):");
        assert_eq!(
            tb.last().unwrap(),
            "ValueError: warm-up longer than the run"
        );
        assert_eq!(tb.len(), 4, "{tb:?}");
        assert!(!ran_out_of_memory(tb.last().unwrap()));
        // Without an error file torchrun points to its documentation: no traceback.
        let bare = REPORT.replace(
            &REPORT[REPORT.find("  traceback :").unwrap()..REPORT.rfind("====").unwrap()],
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n",
        );
        assert_eq!(root_cause_traceback(&bare), None);
        // Then the last exception line before torchrun's report stands in.
        assert_eq!(
            last_exception_line(&bare).as_deref(),
            Some("ValueError: warm-up longer than the run")
        );
        let oom = REPORT.replace(
            "  ValueError: warm-up longer than the run\n  \n",
            "  torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
        );
        assert!(ran_out_of_memory(
            root_cause_traceback(&oom).unwrap().last().unwrap()
        ));
    }
}
