//! Stragglers: a node that keeps the whole synchronous job at its pace. This module owns
//! reading the training script's straggler report, judging it (which node, how much
//! slower, for how long), costing the choices it leaves with the model
//! ([`crate::replan::straggler`] plans and times them; [`weigh`] scales them to the job's
//! measured pace) and the decision whether to act ([`decide`]), all pure; the driver
//! ([`super::driver`]) gathers the facts from the job's output, records the verdict and
//! carries an action out through the normal re-plan path.
//!
//! # What is read
//!
//! Megatron's `--log-straggler` (its `StragglerDetector`, megatron/core/utils.py) makes
//! rank 0 print, every log interval, one line
//! `[date] | MnRtt/Rnk: 3453.08ms/8 | MxRtt/Rnk: 3468.20ms/0 | ... | MnEtpt/Rnk: 296.02TF/0 |
//! MxEtpt/Rnk: 297.32TF/8`, and with `--straggler-minmax-count N` (1 < N < world size) two
//! more, `^^^^ Bottom N Ranks with lowest  Etpt(TF): 296.02/0, ...,` and
//! `^^^^ Top    N Ranks with highest Etpt(TF): ...,`. `Etpt` is a rank's estimated
//! throughput over the interval (TFLOP/s): every rank does the same work, so a lower one
//! means a slower rank. A window is one interval's lines; the ranks it names are all that is
//! known of it (two with the default count: the slowest and the fastest).
//!
//! # When a node is a straggler
//!
//! A node's throughput in a window is its slowest named rank's (a node with a throttled GPU
//! is as slow as that GPU). The slowest node is a straggler in the window when it is below
//! `threshold` × the median of the other named nodes (the median, not the mean, so one fast
//! outlier does not make the rest look slow). It is reported after `windows` consecutive
//! windows naming the same node, with its slowdown (the median over those windows of the
//! others' median ÷ its own): a single slow window (a checkpoint save, a garbage collection,
//! a noisy neighbour) never is. A reported node that the job went on with has recovered
//! when it has not been the straggler for as many consecutive windows; that is said once.
//!
//! This file reads and judges; [`costing`] weighs the choices and decides.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::cluster::profile::median;

mod costing;

#[cfg(test)]
pub(crate) use costing::tests::three_choices;
pub use costing::{
    decide, weigh, ActFacts, Choice, Costed, Found, Progress, RestartCost, Verdict, Weighed,
};

/// What pipette-run does about stragglers (`--stragglers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StragglerMode {
    /// Nothing is read.
    Off,
    /// Detected stragglers and the costed choices are reported; the job goes on as it is.
    #[default]
    Report,
    /// ... and the best choice is taken when its gain beats the cost of a restart.
    Act,
}

/// How stragglers are found and when they are acted on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StragglerOptions {
    pub mode: StragglerMode,
    /// A node below this share of the others' median throughput is slow.
    pub threshold: f64,
    /// For this many consecutive windows (log intervals).
    pub windows: u32,
    /// At most one action per cooldown.
    pub cooldown: Duration,
}

impl Default for StragglerOptions {
    fn default() -> Self {
        StragglerOptions {
            mode: StragglerMode::Report,
            threshold: 0.7,
            windows: 3,
            cooldown: Duration::from_secs(30 * 60),
        }
    }
}

/// A line of the straggler report.
#[derive(Debug, Clone, PartialEq)]
pub enum ReportLine {
    /// The summary line (`MnEtpt/Rnk`, `MxEtpt/Rnk`): a new window, with the slowest and
    /// the fastest rank's throughput.
    Summary(Vec<(u64, f64)>),
    /// A `Bottom N` or `Top N` line: more ranks of the current window.
    Ranks(Vec<(u64, f64)>),
}

/// Reads a line of Megatron's straggler report (see the module doc); `None` for any other.
pub fn parse_line(line: &str) -> Option<ReportLine> {
    if line.contains("MnEtpt/Rnk:") {
        let field = |name: &str| -> Option<(u64, f64)> {
            let rest = line[line.find(name)? + name.len()..].trim_start();
            let value = rest.split(['|', ' ']).next()?;
            let (tf, rank) = value.split_once("TF/")?;
            Some((rank.trim().parse().ok()?, finite(tf)?))
        };
        let ranks: Vec<(u64, f64)> = [field("MnEtpt/Rnk:"), field("MxEtpt/Rnk:")]
            .into_iter()
            .flatten()
            .collect();
        return (!ranks.is_empty()).then_some(ReportLine::Summary(ranks));
    }
    if line.contains("^^^^") && line.contains("Etpt(TF):") {
        let list = &line[line.find("Etpt(TF):")? + "Etpt(TF):".len()..];
        let ranks: Vec<(u64, f64)> = list
            .split(',')
            .filter_map(|item| {
                let (tf, rank) = item.trim().split_once('/')?;
                Some((rank.trim().parse().ok()?, finite(tf)?))
            })
            .collect();
        return (!ranks.is_empty()).then_some(ReportLine::Ranks(ranks));
    }
    None
}

fn finite(text: &str) -> Option<f64> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
}

/// A node found slow for the configured windows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Straggler {
    pub host: String,
    pub node_rank: u64,
    /// How many times slower than the others' median (2.0: half speed).
    pub slowdown: f64,
    /// Consecutive windows it was slow in.
    pub windows: u32,
    /// Its ranks named slow in the last window.
    pub ranks: Vec<u64>,
}

/// The slowest node of one window when it is below `threshold` × the others' median:
/// its index in `nodes` and its slowdown. `nodes[i]`: node i's throughput (its slowest named
/// rank), `None` when the window names none of its ranks.
pub fn slow_node(nodes: &[Option<f64>], threshold: f64) -> Option<(usize, f64)> {
    let named: Vec<(usize, f64)> = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.map(|v| (i, v)))
        .collect();
    let (slowest, value) = named.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1))?;
    let others: Vec<f64> = named
        .iter()
        .filter(|(i, _)| *i != slowest)
        .map(|(_, v)| *v)
        .collect();
    if others.is_empty() {
        return None;
    }
    let reference = median(&others);
    (reference > 0.0 && value < threshold * reference)
        .then(|| (slowest, reference / value.max(f64::MIN_POSITIVE)))
}

/// A straggler reported before that kept up with the others again for the configured
/// windows (the job went on with it: an action ends the attempt).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recovery {
    pub host: String,
    pub node_rank: u64,
    /// Consecutive windows it was not the straggler in.
    pub windows: u32,
}

/// Whether a `straggler` event tells of a straggler found or of one that recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StragglerState {
    Detected,
    Recovered,
}

/// Reads the report's lines window by window and says when a node has been slow for the
/// configured windows (once per run of slow windows), and when a node it reported has not
/// been the straggler for as many windows since (its recovery). A window that names none
/// of its ranks counts for its recovery: the report names the slowest rank, so its ranks
/// were no slower, and the window was judged without finding it slow.
#[derive(Debug, Clone)]
pub struct Detector {
    /// Hosts in node-rank order (`hosts[n]` has node rank n); rank r runs on node
    /// r / `nproc`.
    hosts: Vec<String>,
    nproc: u64,
    threshold: f64,
    windows: u32,
    /// The window being read: throughput by rank.
    current: Option<BTreeMap<u64, f64>>,
    /// The node slow in the last windows, and its slowdown in each.
    streak: Option<(usize, Vec<f64>, Vec<u64>)>,
    reported: bool,
    /// The node reported last, and the windows since in which it was not the straggler.
    recovering: Option<(usize, u32)>,
    /// A recovery found and not yet taken ([`Detector::take_recovery`]).
    recovered: Option<Recovery>,
}

impl Detector {
    pub fn new(hosts: Vec<String>, nproc: u64, options: &StragglerOptions) -> Detector {
        Detector {
            hosts,
            nproc: nproc.max(1),
            threshold: options.threshold,
            windows: options.windows.max(1),
            current: None,
            streak: None,
            reported: false,
            recovering: None,
            recovered: None,
        }
    }

    /// The recovery the last line found, if any (apart from [`Detector::line`]'s answer: the
    /// window in which one node recovers may be the one that finds another slow).
    pub fn take_recovery(&mut self) -> Option<Recovery> {
        self.recovered.take()
    }

    /// Counts a window for the recovery of the node reported last; `slow`: the window's
    /// straggler, if any.
    fn watch_recovery(&mut self, slow: Option<usize>) {
        let Some((node, normal)) = self.recovering.as_mut() else {
            return;
        };
        if slow == Some(*node) {
            *normal = 0;
            return;
        }
        *normal += 1;
        if *normal >= self.windows {
            self.recovered = Some(Recovery {
                host: self.hosts[*node].clone(),
                node_rank: *node as u64,
                windows: *normal,
            });
            self.recovering = None;
        }
    }

    /// Takes one line of the report; returns a straggler when the window this line closes
    /// makes one (a window is judged when the next begins, once all its lines are in).
    pub fn line(&mut self, line: ReportLine) -> Option<Straggler> {
        match line {
            ReportLine::Ranks(ranks) => {
                if let Some(window) = self.current.as_mut() {
                    window.extend(ranks);
                }
                None
            }
            ReportLine::Summary(ranks) => {
                let closed = self.current.replace(ranks.into_iter().collect());
                closed.and_then(|window| self.judge(&window))
            }
        }
    }

    fn judge(&mut self, window: &BTreeMap<u64, f64>) -> Option<Straggler> {
        let mut nodes: Vec<Option<f64>> = vec![None; self.hosts.len()];
        for (rank, tf) in window {
            let Some(node) = nodes.get_mut((rank / self.nproc) as usize) else {
                continue;
            };
            *node = Some(node.map_or(*tf, |v: f64| v.min(*tf)));
        }
        let slow = slow_node(&nodes, self.threshold);
        self.watch_recovery(slow.map(|(node, _)| node));
        let Some((node, slowdown)) = slow else {
            self.streak = None;
            self.reported = false;
            return None;
        };
        let ranks: Vec<u64> = window
            .keys()
            .copied()
            .filter(|r| (r / self.nproc) as usize == node)
            .collect();
        match self.streak.as_mut() {
            Some((n, slowdowns, last)) if *n == node => {
                slowdowns.push(slowdown);
                *last = ranks;
            }
            _ => {
                self.streak = Some((node, vec![slowdown], ranks));
                self.reported = false;
            }
        }
        let (node, slowdowns, ranks) = self.streak.as_ref()?;
        if self.reported || (slowdowns.len() as u32) < self.windows {
            return None;
        }
        self.reported = true;
        self.recovering = Some((*node, 0));
        let recent = &slowdowns[slowdowns.len() - self.windows as usize..];
        Some(Straggler {
            host: self.hosts[*node].clone(),
            node_rank: *node as u64,
            slowdown: median(recent),
            windows: slowdowns.len() as u32,
            ranks: ranks.clone(),
        })
    }
}

/// The lines people read for a [`super::events::Event::Straggler`] or
/// [`super::events::Event::StragglerRecovered`] (none for another event).
pub fn event_lines(event: &super::events::Event) -> Vec<String> {
    // ` at iteration 230, 1000.0 ms per iteration`
    let when = |iteration: &Option<u64>, measured_ms: &Option<f64>| {
        let at = iteration.map(|i| format!(" at iteration {i}"));
        let ms = measured_ms.map(|ms| format!(", {ms:.1} ms per iteration"));
        format!("{}{}", at.unwrap_or_default(), ms.unwrap_or_default())
    };
    let (s, iteration, measured_ms, choices, verdict) = match event {
        super::events::Event::Straggler {
            straggler,
            iteration,
            measured_ms,
            choices,
            verdict,
            ..
        } => (straggler, iteration, measured_ms, choices, verdict),
        super::events::Event::StragglerRecovered {
            recovery: r,
            iteration,
            measured_ms,
            ..
        } => {
            return vec![format!(
            "straggler recovered: {} (node rank {}) has kept up with the others for {} windows{}",
            r.host,
            r.node_rank,
            r.windows,
            when(iteration, measured_ms)
        )]
        }
        _ => return Vec::new(),
    };
    let mut lines = vec![format!(
        "straggler: {} (node rank {}) runs at {:.0} % of the others' speed ({:.2}× slower) for {} windows{}",
        s.host,
        s.node_rank,
        100.0 / s.slowdown,
        s.slowdown,
        s.windows,
        when(iteration, measured_ms)
    )];
    for c in choices {
        lines.push(format!("  {} ({})", c.short(), c.detail));
    }
    let action = match verdict.action {
        Choice::Keep => "keeping the plan".to_string(),
        Choice::Remap => format!("re-mapping around {}", s.host),
        Choice::LeaveOut => format!("leaving {} out", s.host),
        Choice::SwapSpare => format!("swapping {} for a spare", s.host),
    };
    lines.push(format!("  {action}: {}", verdict.why));
    lines
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn megatron_report_lines_are_read() {
        // As megatron/core/README_STRAGGLER.md shows it, after a logger prefix.
        let line = " 0: INFO:megatron.core.utils:[2024-03-14 23:07:56] | MnRtt/Rnk: 3453.08ms/8 | MxRtt/Rnk: 3468.20ms/0 | MnPwr/Rnk: 601796W/8 | MxPwr/Rnk: 683801W/18 | MnTmp/Rnk: 52C/0 | MxTmp/Rnk: 65C/21 | MnUtl/Rnk: 97%/8 | MxUtl/Rnk: 100%/6 | MnClk/Rnk: 1950MHz/28 | MxClk/Rnk: 1980MHz/0 | MnDRtt/Rnk: 14.27ms/23 | MxDRtt/Rnk: 34.65ms/3 | MnEtpt/Rnk: 296.02TF/0 | MxEtpt/Rnk: 297.32TF/8";
        assert_eq!(
            parse_line(line),
            Some(ReportLine::Summary(vec![(0, 296.02), (8, 297.32)]))
        );
        assert_eq!(
            parse_line("^^^^ Bottom 2 Ranks with lowest  Etpt(TF): 296.02/0, 296.50/3,"),
            Some(ReportLine::Ranks(vec![(0, 296.02), (3, 296.5)]))
        );
        assert_eq!(
            parse_line("^^^^ Top    2 Ranks with highest Etpt(TF): 0.000466/1, 0.000802/2,"),
            Some(ReportLine::Ranks(vec![(1, 0.000466), (2, 0.000802)]))
        );
        assert_eq!(parse_line(" iteration 5/20 | lm loss: 1 |"), None);
        assert_eq!(parse_line("MnEtpt/Rnk: nan TF/x"), None);
    }

    fn options(windows: u32) -> StragglerOptions {
        StragglerOptions {
            windows,
            ..StragglerOptions::default()
        }
    }

    /// Feeds windows of throughput by rank (3 nodes × 2 ranks) and returns what was found
    /// after each.
    fn feed(windows: &[[f64; 6]], k: u32) -> Vec<Option<Straggler>> {
        let found = feed_recovering(windows, k);
        found.into_iter().map(|(straggler, _)| straggler).collect()
    }

    /// [`feed`], with the recovery found after each window too.
    fn feed_recovering(windows: &[[f64; 6]], k: u32) -> Vec<(Option<Straggler>, Option<Recovery>)> {
        let hosts = ["a", "b", "c"].map(String::from).to_vec();
        let mut detector = Detector::new(hosts, 2, &options(k));
        let mut found = Vec::new();
        for w in windows {
            let mut order: Vec<(u64, f64)> =
                w.iter().enumerate().map(|(r, v)| (r as u64, *v)).collect();
            order.sort_by(|a, b| a.1.total_cmp(&b.1));
            let summary = vec![order[0], order[5]];
            assert_eq!(detector.line(ReportLine::Ranks(vec![])), None);
            let straggler = detector.line(ReportLine::Summary(summary));
            found.push((straggler, detector.take_recovery()));
            detector.line(ReportLine::Ranks(order[..3].to_vec()));
            detector.line(ReportLine::Ranks(order[3..].to_vec()));
        }
        // The last window is judged when the next begins.
        let straggler = detector.line(ReportLine::Summary(vec![(0, 1.0)]));
        found.push((straggler, detector.take_recovery()));
        found.remove(0);
        found
    }

    /// The windows after which a recovery was found, and each recovery.
    fn recoveries(windows: &[[f64; 6]], k: u32) -> Vec<(usize, Recovery)> {
        let found = feed_recovering(windows, k).into_iter().enumerate();
        found.filter_map(|(i, (_, r))| Some((i, r?))).collect()
    }

    #[test]
    fn a_reported_node_that_keeps_up_for_k_windows_recovers_once() {
        const EVEN: [f64; 6] = [100.0, 98.0, 101.0, 99.0, 100.0, 102.0];
        const SLOW_B: [f64; 6] = [100.0, 98.0, 50.0, 99.0, 100.0, 102.0];
        const SLOW_C: [f64; 6] = [100.0, 98.0, 101.0, 99.0, 100.0, 30.0];
        let b = |windows| Recovery {
            host: "b".into(),
            node_rank: 1,
            windows,
        };
        // Found after window 3, up to speed in windows 4, 5 and 6: recovered after the
        // third, once.
        let windows = [EVEN, SLOW_B, SLOW_B, SLOW_B, EVEN, EVEN, EVEN, EVEN, EVEN];
        assert_eq!(recoveries(&windows, 3), [(6, b(3))]);
        // A slow window restarts the count; one never reported never recovers.
        let windows = [SLOW_B, SLOW_B, SLOW_B, EVEN, EVEN, SLOW_B, EVEN, EVEN];
        assert_eq!(recoveries(&windows, 3), []);
        assert_eq!(recoveries(&[SLOW_B, SLOW_B, EVEN, EVEN, EVEN, EVEN], 3), []);
        // Slow again after it recovered: found again.
        let windows = [
            SLOW_B, SLOW_B, SLOW_B, EVEN, EVEN, EVEN, SLOW_B, SLOW_B, SLOW_B,
        ];
        let found = feed_recovering(&windows, 3);
        let hits: Vec<usize> = (0..found.len()).filter(|i| found[*i].0.is_some()).collect();
        assert_eq!(hits, [2, 8]);
        assert_eq!(found[5].1, Some(b(3)));
        // The slowness moves from b to c: c is found in the very window b recovers in.
        let windows = [SLOW_B, SLOW_B, SLOW_B, SLOW_C, SLOW_C, SLOW_C];
        let found = feed_recovering(&windows, 3);
        assert_eq!(found[5].0.as_ref().map(|s| s.host.as_str()), Some("c"));
        assert_eq!(found[5].1, Some(b(3)));
        // k = 1: one window up to speed is enough.
        assert_eq!(recoveries(&[SLOW_B, EVEN], 1), [(1, b(1))]);
    }

    #[test]
    fn a_node_slow_for_k_windows_is_found_once() {
        let even = [100.0, 98.0, 101.0, 99.0, 100.0, 102.0];
        let slow = [100.0, 98.0, 50.0, 99.0, 100.0, 102.0];
        let found = feed(&[even, slow, slow, slow, slow, even, slow], 3);
        let hits: Vec<usize> = found
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.as_ref().map(|_| i))
            .collect();
        assert_eq!(hits, [3], "{found:?}");
        let s = found[3].clone().unwrap();
        assert_eq!((s.host.as_str(), s.node_rank, s.windows), ("b", 1, 3));
        assert_eq!(s.ranks, [2, 3]);
        assert!((s.slowdown - 100.0 / 50.0).abs() < 0.05, "{}", s.slowdown);
    }

    #[test]
    fn noise_alone_never_makes_a_straggler() {
        // ±25 % jitter on every rank, a single deep dip, a dip that moves from node to
        // node, and two slow windows broken by a normal one: none is k=3 windows of the
        // same node below 0.7 × the others' median.
        let table: [[f64; 6]; 10] = [
            [100.0, 75.0, 125.0, 90.0, 110.0, 80.0],
            [80.0, 120.0, 100.0, 76.0, 124.0, 100.0],
            [100.0, 100.0, 30.0, 100.0, 100.0, 100.0],
            [60.0, 100.0, 100.0, 100.0, 100.0, 100.0],
            [100.0, 100.0, 60.0, 100.0, 100.0, 100.0],
            [100.0, 100.0, 100.0, 100.0, 60.0, 100.0],
            [100.0, 100.0, 60.0, 100.0, 100.0, 100.0],
            [100.0, 100.0, 60.0, 100.0, 100.0, 100.0],
            [100.0, 100.0, 75.0, 100.0, 100.0, 100.0],
            [100.0, 100.0, 60.0, 100.0, 100.0, 100.0],
        ];
        assert!(feed(&table, 3).iter().all(Option::is_none));
        // k = 1 finds the single dip: the windows are what filters noise.
        assert!(feed(&table[2..3], 1)[0].is_some());
    }

    #[test]
    fn the_slowest_node_is_judged_against_the_median_of_the_others() {
        assert_eq!(
            slow_node(&[Some(1.0), Some(0.5), Some(1.0)], 0.7),
            Some((1, 2.0))
        );
        // One fast outlier does not make the rest slow.
        assert_eq!(
            slow_node(&[Some(1.0), Some(1.0), Some(3.0), Some(0.95)], 0.7),
            None
        );
        assert_eq!(slow_node(&[Some(1.0), None, None], 0.7), None);
        assert_eq!(
            slow_node(&[Some(0.6), None, Some(1.0)], 0.7),
            Some((0, 1.0 / 0.6))
        );
    }

    #[test]
    fn a_node_exactly_at_the_threshold_is_not_slow() {
        // Slow means below threshold × the others' median, strictly.
        assert_eq!(slow_node(&[Some(0.7), Some(1.0), Some(1.0)], 0.7), None);
        let (node, slowdown) = slow_node(&[Some(0.69), Some(1.0), Some(1.0)], 0.7).unwrap();
        assert_eq!(node, 0);
        assert!((slowdown - 1.0 / 0.69).abs() < 1e-12);
    }
}
