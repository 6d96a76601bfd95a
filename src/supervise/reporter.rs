//! The supervisor's lines for people (our log lines, target `job`, see [`crate::log`]),
//! rendered from the same [`Event`]s that go to `events.jsonl` and from the [`Stop`] that
//! ends the job, each at its level ([`event_level`]: what went wrong is a warning). Nothing
//! is printed when the nodes' output is not shown ([`Echo::Off`]).

use std::time::Duration;

use super::decide::{Ending, Stop};
use super::events::Event;
use super::output::Echo;
use crate::config::Recompute;
use crate::exec::format_duration;
use crate::launch::Resume;
use crate::log::{self, Level};
use crate::model::parallel::ParallelConfig;

/// Prints the supervisor's lines.
#[derive(Debug, Clone, Copy)]
pub struct Reporter {
    echo: Echo,
    /// The grace period, named when a signal starts a teardown.
    grace: Duration,
}

impl Reporter {
    pub fn new(echo: Echo, grace: Duration) -> Reporter {
        Reporter { echo, grace }
    }

    /// The lines for an event, printed.
    pub fn event(&self, event: &Event) {
        self.print(event_level(event), self.event_lines(event));
    }

    /// The line that starts the teardown after failures (their own lines came with their
    /// events).
    pub fn teardown_begins(&self, ending: &Ending) {
        if let Ending::Failed(_) = ending {
            self.print(Level::Warn, vec!["tearing the job down".to_string()]);
        }
    }

    /// The last line before the exit, when the stop has one.
    pub fn stopping(&self, stop: &Stop) {
        let level = match stop {
            Stop::Finished => Level::Info,
            _ => Level::Warn,
        };
        self.print(level, stop_line(stop).into_iter().collect());
    }

    /// Prints `lines` as ours (target `job`), each broken to fit 80 columns.
    fn print(&self, level: Level, lines: Vec<String>) {
        if self.echo != Echo::Off && !lines.is_empty() {
            log::log_wrapped(level, "job", &lines.join("\n"));
        }
    }

    /// What people read for an event (most events have no line of their own).
    pub fn event_lines(&self, event: &Event) -> Vec<String> {
        match event {
            Event::Launch {
                attempt,
                nodes,
                config,
                world_size,
                since_failure,
                ..
            } => vec![format!(
                "attempt {attempt}: launching torchrun on {} node(s) ({}), {}{}",
                nodes.len(),
                nodes
                    .iter()
                    .map(|n| n.host.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                layout_text(config.as_ref(), *world_size),
                since_failure
                    .map(|d| format!(", {:.2} s after the failure", d.as_secs_f64()))
                    .unwrap_or_default()
            )],
            Event::NodeFailed { failure, .. } => vec![failure.describe()],
            Event::Stalled { silent, .. } => vec![format!(
                "no progress for {}: tearing the job down",
                format_duration(*silent)
            )],
            Event::Signal { signal, .. } => vec![format!(
                "{signal} received: stopping every node (TERM, {} grace, then KILL; signal again to kill at once)",
                format_duration(self.grace)
            )],
            Event::SignalPassed {
                signal, workers, ..
            } => vec![format!(
                "{signal} received: passed on to the training script ({workers} worker process(es)); the job goes on"
            )],
            Event::Health { nodes } => nodes
                .iter()
                .filter(|h| !h.healthy)
                .map(|h| format!("{} failed its health check: {}", h.host, h.detail))
                .collect(),
            Event::Replan {
                left_out,
                nodes,
                spares_in,
                from,
                to,
                world_sizes,
                kept_tp_pp,
                mapping_changed,
                resume,
                notes,
                ..
            } => std::iter::once(match (from, to) {
                (Some(from), Some(to)) => format!(
                    "re-planned: {}",
                    replan_text(
                        (nodes.len(), left_out, spares_in),
                        (from, to),
                        *mapping_changed,
                        *kept_tp_pp,
                        resume.as_ref()
                    )
                ),
                _ => format!(
                    "relaunched: {}",
                    relaunch_text(nodes.len(), left_out, *world_sizes)
                ),
            })
            .chain(notes.iter().map(|n| format!("  {n}")))
            .collect(),
            Event::Straggler { .. } | Event::StragglerRecovered { .. } => {
                super::stragglers::event_lines(event)
            }
            Event::Progress { .. }
            | Event::Teardown { .. }
            | Event::ReplanRefused { .. }
            | Event::Exit { .. } => Vec::new(),
        }
    }
}

/// How much an event's lines matter: what went wrong (and the re-plan that follows) stays
/// under `-q`; a launch is INFO.
pub fn event_level(event: &Event) -> Level {
    match event {
        Event::Launch { .. }
        | Event::Progress { .. }
        | Event::StragglerRecovered { .. }
        | Event::Exit { .. } => Level::Info,
        Event::NodeFailed { .. }
        | Event::Stalled { .. }
        | Event::Signal { .. }
        | Event::SignalPassed { .. }
        | Event::Health { .. }
        | Event::Replan { .. }
        | Event::ReplanRefused { .. }
        | Event::Teardown { .. }
        | Event::Straggler { .. } => Level::Warn,
    }
}

/// The last line for a stop (the user's stops and an unwritable log directory have none:
/// the summary says it).
pub fn stop_line(stop: &Stop) -> Option<String> {
    match stop {
        Stop::Finished => Some("training finished on every node".to_string()),
        Stop::Signal(_) | Stop::SignalAfterFailure(_) | Stop::LogsUnwritable { .. } => None,
        Stop::NothingStarted { .. }
        | Stop::ReplanLimit { .. }
        | Stop::ReplanRefused(_)
        | Stop::PrepareFailed(_)
        | Stop::JobFault(_)
        | Stop::SaveUnusable(_) => Some(stop.reason()),
    }
}

/// What an attempt runs, in words: the plan's sizes, or the world when planning is off.
pub fn layout_text(config: Option<&ParallelConfig>, world_size: u64) -> String {
    match config {
        Some(c) => c.sizes_text(),
        None => format!("world size {world_size} (planning off)"),
    }
}

/// An unplanned job's relaunch on the survivors, in words: for the `relaunched:` line and
/// the summary.
pub fn relaunch_text(survivors: usize, left_out: &[String], world_sizes: (u64, u64)) -> String {
    format!(
        "{survivors} node(s) left{}; world size {} → {}, the same script and arguments (planning off); starting again",
        left_out_text(left_out, &[]),
        world_sizes.0,
        world_sizes.1
    )
}

/// ` (left out node-b; spare node-e swapped in)`: who is gone and which spares took
/// their places.
fn left_out_text(left_out: &[String], spares_in: &[String]) -> String {
    let mut parts = vec![if left_out.is_empty() {
        "none left out".to_string()
    } else {
        format!("left out {}", left_out.join(", "))
    }];
    if !spares_in.is_empty() {
        parts.push(format!("spare {} swapped in", spares_in.join(", ")));
    }
    format!(" ({})", parts.join("; "))
}

/// What a re-plan decided, in words: for the `re-planned:` line and the summary. Says
/// exactly what changed: the GPUs, each configuration field that differs, or that the
/// configuration stayed the same (`mapping_changed`: whether the ranks sit elsewhere).
pub fn replan_text(
    (nodes, left_out, spares_in): (usize, &[String], &[String]),
    (from, to): (&ParallelConfig, &ParallelConfig),
    mapping_changed: bool,
    kept_tp_pp: bool,
    resume: Option<&Resume>,
) -> String {
    let mut changes = config_changes(from, to);
    let (before, after) = (from.world_size(), to.world_size());
    if before != after {
        changes.insert(0, format!("{before} → {after} GPUs"));
    }
    let what = if config_changes(from, to).is_empty() {
        let same = if mapping_changed {
            "same configuration, new mapping"
        } else {
            "same configuration and mapping"
        };
        match changes.first() {
            Some(gpus) => format!("{gpus}, {same}"),
            None => same.to_string(),
        }
    } else {
        changes.join(", ")
    };
    format!(
        "{nodes} node(s) left{}; {what}{}{}",
        left_out_text(left_out, spares_in),
        if kept_tp_pp {
            "; tp × pp kept: the checkpoint loads as it is"
        } else {
            ""
        },
        match resume {
            Some(r) => format!(
                "; resuming from {}{}",
                r.dir,
                r.iteration
                    .map(|i| format!(" (iteration {i})"))
                    .unwrap_or_default()
            ),
            None => "; no checkpoint to resume: starting again".to_string(),
        }
    )
}

/// Every field of the configuration that differs between `from` and `to`, as
/// `dp 3 → 2`, in the order the plan report names them; empty when they are the same.
pub fn config_changes(from: &ParallelConfig, to: &ParallelConfig) -> Vec<String> {
    let mut out = Vec::new();
    let mut field = |name: &str, a: String, b: String| {
        if a != b {
            out.push(format!("{name} {a} → {b}"));
        }
    };
    field("tp", from.tp.to_string(), to.tp.to_string());
    field("pp", from.pp.to_string(), to.pp.to_string());
    field("dp", from.dp.to_string(), to.dp.to_string());
    field(
        "micro-batch",
        from.micro_batch.to_string(),
        to.micro_batch.to_string(),
    );
    let vpp = |c: &ParallelConfig| c.vpp.map_or("none".to_string(), |v| v.to_string());
    field("virtual stages", vpp(from), vpp(to));
    let recompute = |c: &ParallelConfig| {
        match c.recompute {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full { .. } => "full",
        }
        .to_string()
    };
    field("recompute", recompute(from), recompute(to));
    let on = |b: bool| if b { "on" } else { "off" }.to_string();
    field(
        "sequence parallel",
        on(from.sequence_parallel),
        on(to.sequence_parallel),
    );
    field(
        "distributed optimizer",
        on(from.distributed_optimizer),
        on(to.distributed_optimizer),
    );
    let split = |c: &ParallelConfig| {
        c.layers_per_stage
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    // The split follows pp; said only when it changes by itself.
    if from.pp == to.pp {
        field("layers per stage", split(from), split(to));
    }
    if from.recompute != to.recompute && recompute(from) == recompute(to) {
        out.push("recompute's method or layers changed".to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::supervise::health::Health;

    fn reporter() -> Reporter {
        Reporter::new(Echo::Streams, Duration::from_secs(3))
    }

    #[test]
    fn a_straggler_warns_and_its_recovery_informs() {
        let [found, recovered] = crate::supervise::events::tests::straggler_events();
        assert_eq!(event_level(&found), Level::Warn);
        let lines = reporter().event_lines(&found);
        assert!(
            lines[0].starts_with("straggler: b (node rank 1) runs at 50 %"),
            "{lines:?}"
        );
        assert_eq!(event_level(&recovered), Level::Info);
        assert_eq!(
            reporter().event_lines(&recovered),
            ["straggler recovered: b (node rank 1) has kept up with the others for 3 windows at iteration 230, 1000.0 ms per iteration"]
        );
    }

    #[test]
    fn a_signal_names_the_grace_period() {
        let lines = reporter().event_lines(&Event::Signal {
            signal: "SIGINT".into(),
            count: 1,
        });
        assert_eq!(
            lines,
            ["SIGINT received: stopping every node (TERM, 3 s grace, then KILL; signal again to kill at once)"]
        );
    }

    #[test]
    fn only_unhealthy_nodes_are_named() {
        let health = |host: &str, healthy| Health {
            host: host.into(),
            healthy,
            detail: "no answer within 20 s".into(),
        };
        let lines = reporter().event_lines(&Event::Health {
            nodes: vec![health("a", true), health("b", false)],
        });
        assert_eq!(lines, ["b failed its health check: no answer within 20 s"]);
    }

    #[test]
    fn a_replan_says_what_changed_and_where_it_resumes() {
        let from = ParallelConfig::even(4, 2, 1, 3, 1);
        let to = ParallelConfig::even(4, 2, 1, 2, 1);
        let event = Event::Replan {
            attempt: 2,
            left_out: vec!["node-b".into()],
            nodes: vec!["node-a".into(), "node-c".into()],
            spares_in: Vec::new(),
            from: Some(from.clone()),
            to: Some(to.clone()),
            world_sizes: (6, 4),
            kept_tp_pp: true,
            mapping_changed: true,
            resharded: false,
            resume: Some(Resume {
                dir: "ck".into(),
                iteration: Some(8),
            }),
            notes: vec!["a note".into()],
        };
        assert_eq!(
            reporter().event_lines(&event),
            [
                "re-planned: 2 node(s) left (left out node-b); 6 → 4 GPUs, dp 3 → 2; tp × pp kept: the checkpoint loads as it is; resuming from ck (iteration 8)".to_string(),
                "  a note".to_string(),
            ]
        );
        assert!(replan_text((2, &[], &[]), (&from, &to), true, false, None)
            .ends_with("dp 3 → 2; no checkpoint to resume: starting again"));
        // A spare that took the failed node's place is named.
        let spares_in = ["node-e".to_string()];
        assert_eq!(
            replan_text((3, &["node-b".into()], &spares_in), (&from, &from), true, true, None),
            "3 node(s) left (left out node-b; spare node-e swapped in); same configuration, new mapping; tp × pp kept: the checkpoint loads as it is; no checkpoint to resume: starting again"
        );
    }

    #[test]
    fn a_replan_never_shows_the_same_configuration_twice() {
        let from = ParallelConfig::even(4, 1, 1, 4, 1);
        let mut to = from.clone();
        assert_eq!(
            replan_text((4, &[], &[]), (&from, &to), true, false, None),
            "4 node(s) left (none left out); same configuration, new mapping; no checkpoint to resume: starting again"
        );
        to.micro_batch = 2;
        to.vpp = Some(2);
        to.recompute = Recompute::Selective;
        assert_eq!(
            config_changes(&from, &to),
            [
                "micro-batch 1 → 2",
                "virtual stages none → 2",
                "recompute none → selective"
            ]
        );
        let mut fewer = ParallelConfig::even(4, 1, 2, 2, 1);
        fewer.layers_per_stage = vec![1, 3];
        assert_eq!(
            config_changes(&ParallelConfig::even(4, 1, 2, 2, 1), &fewer),
            ["layers per stage 2,2 → 1,3"]
        );
    }

    #[test]
    fn the_users_stop_has_no_last_line() {
        assert_eq!(stop_line(&Stop::Signal(2)), None);
        assert_eq!(
            stop_line(&Stop::Finished).as_deref(),
            Some("training finished on every node")
        );
        assert_eq!(
            stop_line(&Stop::ReplanRefused("no node is left to run on".into())).as_deref(),
            Some("cannot re-plan: no node is left to run on")
        );
    }
}
