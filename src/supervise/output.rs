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

use crate::exec::{OutputSink, Stream};
use crate::launch::output_lines::{is_progress_line, parse_iteration};

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
    echo: Echo,
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
            echo,
        })
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

    fn mark(&self, line: &str) {
        let now = self.start.elapsed().as_millis() as u64;
        self.last_line_ms.fetch_max(now, Ordering::Relaxed);
        if let Some((iteration, total)) = parse_iteration(line) {
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
}
