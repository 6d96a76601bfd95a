//! What a launched job prints, read: Megatron's iteration lines (progress, and the
//! iteration and total that the supervisor watches and the trial times) and torchrun's
//! failure report (which worker failed first, with which code). Pure parsers of text;
//! the launch stage owns them because it owns what it started, so the trial and the
//! supervisor, both later stages, read the job's output through them.

use std::sync::LazyLock;

use regex::Regex;

use crate::exit;

/// Megatron's iteration line, ` [date] iteration        5/      20 | consumed samples: ...`:
/// the iteration and the total.
pub fn parse_iteration(line: &str) -> Option<(u64, u64)> {
    let mut rest = line;
    while let Some(at) = rest.find("iteration") {
        let after = &rest[at + "iteration".len()..];
        rest = after;
        let trimmed = after.trim_start_matches(' ');
        if trimmed.len() == after.len() {
            continue;
        }
        let digits = trimmed.len()
            - trimmed
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .len();
        if digits == 0 {
            continue;
        }
        let Ok(iteration) = trimmed[..digits].parse::<u64>() else {
            continue;
        };
        let Some(total_part) = trimmed[digits..].strip_prefix('/') else {
            continue;
        };
        let total_part = total_part.trim_start_matches(' ');
        let total_digits = total_part.len()
            - total_part
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .len();
        if total_digits == 0 {
            continue;
        }
        if !total_part[total_digits..].trim_start().starts_with('|') {
            continue;
        }
        let Ok(total) = total_part[..total_digits].parse::<u64>() else {
            continue;
        };
        return Some((iteration, total));
    }
    None
}

/// Lines that show progress between iteration lines: saving or loading a checkpoint and
/// evaluation, which can take longer than a few iterations.
pub fn is_progress_line(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    ["checkpoint", "evaluat", "validation"]
        .iter()
        .any(|word| lower.contains(word))
}

/// What torchrun's failure report (its "Root Cause (first observed failure)" block) says
/// about the worker that failed first: its global rank and exit code. A worker ended by a
/// signal is reported as `-N`; it becomes `128 + N`, as a shell would say.
pub fn torchrun_root_cause(output: &str) -> Option<(Option<u64>, i32)> {
    let start = output.rfind("Root Cause (first observed failure)")?;
    let block = &output[start..];
    let mut rank = None;
    for line in block.lines().take(12) {
        let line = line.trim();
        if let Some(value) = field(line, "rank") {
            rank = value
                .split_whitespace()
                .next()
                .and_then(|r| r.parse::<u64>().ok());
        }
        if let Some(value) = field(line, "exitcode") {
            let code = value.split_whitespace().next()?.parse::<i32>().ok()?;
            let code = if code < 0 { exit::signal(-code) } else { code };
            return Some((rank, code));
        }
    }
    None
}

/// `name   : value` → `value`.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(name)?;
    let rest = rest.trim_start().strip_prefix(':')?;
    Some(rest.trim())
}

/// The last line of `output` that reads as a Python exception (`ValueError: ...`,
/// `torch.OutOfMemoryError: ...`, `KeyboardInterrupt`) before torchrun's own report: the
/// failing worker's error when torchrun's report carries no traceback.
pub fn last_exception_line(output: &str) -> Option<String> {
    let end = output
        .find("torch.distributed.elastic.multiprocessing.errors.ChildFailedError")
        .unwrap_or(output.len());
    output[..end]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| EXCEPTION.is_match(l))
        .map(str::to_string)
}

/// `ValueError: text`, `torch.OutOfMemoryError: text`, `MemoryError`, `KeyboardInterrupt`.
static EXCEPTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Interrupt)(?::\s.*)?$")
        .expect("a valid regex")
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_iteration_lines_are_read() {
        let line = " [2024-05-01 10:00:00] iteration        5/      20 | consumed samples:           60 | elapsed time per iteration (ms): 312.4 | lm loss: 5.4E+00 |";
        assert_eq!(parse_iteration(line), Some((5, 20)));
        assert_eq!(
            parse_iteration(" iteration     1200/  500000 | consumed samples: 1"),
            Some((1200, 500000))
        );
        assert_eq!(parse_iteration("resuming training at iteration 7"), None);
        assert_eq!(parse_iteration("setting iteration to 5/7 now"), None);
        assert_eq!(parse_iteration("no iterations here"), None);
    }

    #[test]
    fn torchrun_failure_report_names_the_worker_and_its_code() {
        let report = "\
Failures:
[1]:
  time      : 2026-11-22_04:09:15
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 5899)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_04:09:15
  host      : localhost
  rank      : 3 (local_rank: 1)
  exitcode  : 7 (pid: 5901)
  error_file: <N/A>
";
        assert_eq!(torchrun_root_cause(report), Some((Some(3), 7)));
        let killed = "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 1)\n";
        assert_eq!(torchrun_root_cause(killed), Some((Some(1), 137)));
        assert_eq!(torchrun_root_cause("Traceback ..."), None);
    }
}
