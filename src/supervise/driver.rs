//! The driver: runs attempts one after another. Each is launched, watched
//! ([`super::watch`]; a straggler the [`Detector`] finds is weighed by
//! [`stragglers::weigh`]), torn down, swept and health-checked; [`decide`] says what follows;
//! the driver reads the checkpoint when asked, re-plans ([`crate::replan::failure`]), prepares the
//! next attempt, and records every step as an [`Event`] that the [`Reporter`] also shows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::decide::{self, decide, Decision, Ending, Facts, FailureMark, Next, Stop, StragglerAct};
use super::events::{Event, EventLog, NodeRef, StopRecord};
use super::health::{self, Health};
use super::output::{JobOutput, ProgressSpec};
use super::reporter::{relaunch_text, replan_text, Reporter};
use super::save_check;
use super::signals::{ActSignals, SignalGuard};
use super::stragglers::{
    self, Choice, Detector, Found, Progress, Straggler, StragglerMode, StragglerState,
};
use super::watch::{watch, WatchSignals};
use super::{AttemptSummary, AttemptTiming, Outcome, SuperviseOptions};
use crate::exec::format_duration;
use crate::exec::group::NodeGroup;
use crate::exit::ExitCode;
use crate::launch::{
    self, read_checkpoint, Attempt, CheckpointState, JobSpec, Layout, Planned, Resume,
};
use crate::replan::failure::{replan, swap_for_spares, Failed, ReplanError};
use crate::replan::straggler::RunningPlan;

/// What the driver shares across attempts.
struct Driver<'a> {
    template: &'a JobSpec,
    options: &'a SuperviseOptions,
    events: &'a EventLog,
    reporter: Reporter,
    signals: Option<SignalGuard>,
    /// The teardown answers a second stop signal itself (it kills at once).
    _stopping: super::signals::Stopping,
    /// Act signals not yet passed on to the training script (see [`ActSignals`]).
    acts: std::cell::RefCell<ActSignals>,
    /// When the last straggler action was taken (for the cooldown).
    straggler_acted: std::cell::Cell<Option<Instant>>,
    /// The failure that ended the attempt before (a repeat is the job's, not a node's).
    last_failure: std::cell::RefCell<Option<FailureMark>>,
}

/// How an attempt ended, once its job has stopped: what [`Driver::hand_over`] decides on.
struct Ended<'a> {
    /// The attempt's hosts, in node-rank order.
    hosts: &'a [String],
    ending: Ending,
    /// Nodes whose torchrun outlived the grace period, nodes that failed their health
    /// check, and (after a stall) nodes with a stopped process ([`Driver::stop_and_check`]).
    unresponsive: Vec<String>,
    unhealthy: Vec<String>,
    frozen: Vec<String>,
    /// After a failure, the end of every node's log ([`log_tail`]).
    log_tails: Vec<String>,
    timing: AttemptTiming,
    /// When the ending was seen, and when the job had stopped.
    detected_at: Instant,
    stopped: Instant,
}

/// The last 64 KiB of a node's log (empty when it cannot be read): where its workers'
/// last errors are.
fn log_tail(path: &std::path::Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL: u64 = 64 * 1024;
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let mut bytes = Vec::new();
    if file
        .seek(SeekFrom::Start(len.saturating_sub(TAIL)))
        .is_err()
        || file.take(TAIL).read_to_end(&mut bytes).is_err()
    {
        return String::new();
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// What the teardown and the checks found against the nodes.
struct Checked {
    /// Nodes whose torchrun outlived the grace period.
    unresponsive: Vec<String>,
    /// Nodes that failed their health check.
    unhealthy: Vec<String>,
    /// Nodes with a stopped process of the job (looked for after a stall only).
    stopped: Vec<String>,
}

/// An attempt's straggler detection, and what acting on a straggler would cost.
struct StragglerWatch {
    detector: Detector,
    /// How long a restart's teardown takes, as this job measured it.
    teardown: Duration,
    replans_left: u32,
}

/// How an attempt handed over.
enum Handover {
    /// The next attempt, and when the failure that led to it was seen.
    Relaunch(Box<Attempt>, Instant),
    /// The job ends with this code.
    Stop(Stop, i32),
}

/// Runs `first` and every relaunch to the end (see [`super::supervise`]).
pub fn run(
    template: &JobSpec,
    first: Attempt,
    options: &SuperviseOptions,
    events: &EventLog,
) -> Outcome {
    let driver = Driver {
        template,
        options,
        events,
        reporter: Reporter::new(options.echo, options.grace),
        signals: SignalGuard::install().ok(),
        _stopping: super::signals::Stopping::new(),
        acts: std::cell::RefCell::new(ActSignals::new()),
        straggler_acted: std::cell::Cell::new(None),
        last_failure: std::cell::RefCell::new(None),
    };
    let mut outcome = Outcome {
        exit_code: 0,
        reason: String::new(),
        attempts: Vec::new(),
        replans: 0,
        relaunch_after: Vec::new(),
    };
    let mut attempt = first;
    let mut failed_at: Option<Instant> = None;
    loop {
        match driver.attempt(&attempt, failed_at.take(), &mut outcome) {
            Handover::Relaunch(next, detected_at) => {
                outcome.replans += 1;
                failed_at = Some(detected_at);
                attempt = *next;
            }
            Handover::Stop(stop, code) => return driver.finish(outcome, &stop, code),
        }
    }
}

impl Driver<'_> {
    /// Why the attempt must not be launched, when its `--save` cannot be written or the
    /// checkpoint it resumes from cannot be read ([`save_check`]), checked on its first node.
    fn save_unusable(&self, attempt: &Attempt) -> Option<(Stop, i32)> {
        let training = &attempt.layout.planned()?.settings.training;
        let save = training.save.as_deref()?;
        let host = &attempt.spec.nodes.first()?.host;
        let same = |a: &str, b: &str| a.trim_end_matches('/') == b.trim_end_matches('/');
        let resumes =
            attempt.resume.is_some() || training.load.as_deref().is_some_and(|l| same(l, save));
        let template = self.template;
        let state = save_check::check(
            &template.transport,
            host,
            &template.workdir,
            save,
            self.options.health_timeout,
        );
        let (why, code) = save_check::refusal(save, &state, resumes)?;
        Some((Stop::SaveUnusable(why), code))
    }

    /// Records `event` in the log and shows its lines.
    fn emit(&self, event: Event) {
        self.events.write(&event);
        self.reporter.event(&event);
    }

    fn signal_count(&self) -> usize {
        self.signals.as_ref().map_or(0, SignalGuard::count)
    }

    fn finish(&self, mut outcome: Outcome, stop: &Stop, code: i32) -> Outcome {
        self.reporter.stopping(stop);
        outcome.exit_code = code;
        outcome.reason = stop.reason();
        self.emit(Event::Exit {
            code,
            reason: outcome.reason.clone(),
            attempts: outcome.attempts.len(),
            replans: outcome.replans,
            relaunch_after: outcome.relaunch_after.clone(),
        });
        outcome
    }

    /// Runs one attempt to its end and decides what follows; its summary goes to `outcome`.
    fn attempt(
        &self,
        attempt: &Attempt,
        failed_at: Option<Instant>,
        outcome: &mut Outcome,
    ) -> Handover {
        let (template, options) = (self.template, self.options);
        let nodes: Vec<(String, u64)> = attempt
            .spec
            .nodes
            .iter()
            .map(|n| (n.host.clone(), n.node_rank))
            .collect();
        let hosts: Vec<String> = nodes.iter().map(|(h, _)| h.clone()).collect();
        if let Some((stop, code)) = self.save_unusable(attempt) {
            return Handover::Stop(stop, code);
        }
        let logs = attempt.dir.join("logs");
        let watch_stragglers = options.stragglers.mode != StragglerMode::Off;
        let output = match JobOutput::new(&nodes, &logs, options.echo) {
            Ok(output) if watch_stragglers => Arc::new(
                output
                    .with_progress(self.progress_spec(attempt))
                    .with_straggler_report(),
            ),
            Ok(output) => Arc::new(output.with_progress(self.progress_spec(attempt))),
            Err(e) => {
                let dir = logs.display().to_string();
                let stop = Stop::LogsUnwritable {
                    dir,
                    error: e.to_string(),
                };
                return Handover::Stop(stop, ExitCode::Usage.code());
            }
        };
        let since_failure = failed_at.map(|t| t.elapsed());
        outcome.relaunch_after.extend(since_failure);
        self.emit(Event::Launch {
            attempt: attempt.number,
            dir: attempt.dir.display().to_string(),
            nodes: nodes
                .iter()
                .map(|(host, node_rank)| NodeRef {
                    host: host.clone(),
                    node_rank: *node_rank,
                })
                .collect(),
            config: attempt.layout.config().cloned(),
            world_size: attempt.spec.world_size,
            transport: template.transport.kind().as_str().to_string(),
            resume: attempt.resume.clone(),
            since_failure,
        });
        let launched = Instant::now();
        let mut job = launch::start(
            template,
            attempt,
            output.clone(),
            options.grace,
            options.health_timeout,
        );
        let record = |event: Event| self.emit(event);
        let passed_on = |signal: nix::sys::signal::Signal, workers| {
            self.emit(Event::SignalPassed {
                attempt: attempt.number,
                signal: signal.to_string(),
                workers,
            });
        };
        let mut acts = self.acts.borrow_mut();
        let signals = WatchSignals {
            guard: self.signals.as_ref(),
            acts: &mut acts,
            passed_on: &passed_on,
        };
        let mut straggler_watch = watch_stragglers.then(|| StragglerWatch {
            detector: {
                // Rank r runs on node rank r / nproc (static rendezvous): hosts by node rank.
                let mut by_rank = nodes.clone();
                by_rank.sort_by_key(|(_, rank)| *rank);
                Detector::new(
                    by_rank.into_iter().map(|(host, _)| host).collect(),
                    attempt.spec.nproc_per_node,
                    &options.stragglers,
                )
            },
            // A restart's teardown as this job measured it (the last one, with its
            // re-plan), else the grace period, the longest a teardown takes.
            teardown: outcome
                .attempts
                .last()
                .map_or(options.grace, |a| a.timing.teardown + a.timing.restart),
            replans_left: options.max_replans.saturating_sub(outcome.replans),
        });
        let mut stragglers = || self.next_straggler(straggler_watch.as_mut()?, attempt, &output);
        let (ending, detected_at) = watch(
            &mut job,
            &output,
            signals,
            options,
            &record,
            attempt.number,
            &template.run_id,
            &mut stragglers,
        );
        drop(acts);
        let Checked {
            unresponsive,
            unhealthy,
            stopped: frozen,
        } = self.stop_and_check(attempt, &hosts, &mut job, &output, &ending);
        let stopped = Instant::now();
        let timing = AttemptTiming {
            running: detected_at.saturating_duration_since(launched),
            output: output.timing(),
            teardown: stopped.saturating_duration_since(detected_at),
            restart: Duration::ZERO,
            failed: ending.is_failure(),
        };
        let ended = Ended {
            hosts: &hosts,
            unresponsive,
            unhealthy,
            frozen,
            log_tails: match &ending {
                Ending::Failed(_) => hosts
                    .iter()
                    .map(|host| log_tail(&super::output::log_path(&logs, host)))
                    .collect(),
                _ => Vec::new(),
            },
            ending,
            timing,
            detected_at,
            stopped,
        };
        self.hand_over(attempt, &output, ended, outcome)
    }

    /// What follows an attempt that has stopped, as [`decide`] rules: the checkpoint read
    /// when the decision needs it, then the job stopped, or re-planned on the survivors and
    /// relaunched. The attempt's summary goes to `outcome`.
    fn hand_over(
        &self,
        attempt: &Attempt,
        output: &JobOutput,
        ended: Ended<'_>,
        outcome: &mut Outcome,
    ) -> Handover {
        let (template, options) = (self.template, self.options);
        let previous = self.last_failure.borrow().clone();
        let mut facts = Facts {
            hosts: ended.hosts,
            ending: &ended.ending,
            unresponsive: &ended.unresponsive,
            unhealthy: &ended.unhealthy,
            stopped: &ended.frozen,
            iteration: output.iterations().map(|(_, last)| last),
            previous: previous.as_ref(),
            logs: &ended.log_tails,
            signal_after: self
                .signals
                .as_ref()
                .and_then(SignalGuard::received)
                .map(|r| r.signal),
            replans: outcome.replans,
            max_replans: options.max_replans,
            // An unplanned job resumes nothing: no checkpoint it writes is ours to read.
            save: attempt
                .layout
                .planned()
                .and_then(|p| p.settings.training.save.as_deref()),
            checkpoint: None,
        };
        let summary = |decision: &Decision| AttemptSummary {
            number: attempt.number,
            hosts: ended.hosts.to_vec(),
            config: attempt.layout.config().cloned(),
            world_size: attempt.spec.world_size,
            resume: attempt.resume.clone(),
            iterations: output.iterations(),
            end: decision.end.clone(),
            left_out: decision.left_out.clone(),
            replan: None,
            estimated_ms: attempt
                .layout
                .planned()
                .map(|p| p.plan.estimate.iteration_ms),
            timing: ended.timing,
        };
        if let Some(mark) = decide::mark(&facts) {
            *self.last_failure.borrow_mut() = Some(mark);
        }
        loop {
            let decision = decide(&facts);
            match decision.next.clone() {
                Next::ReadCheckpoint { host, save } => {
                    let (transport, workdir) = (&template.transport, &template.workdir);
                    let timeout = options.health_timeout;
                    let state = read_checkpoint(transport, &host, workdir, &save, timeout);
                    facts.checkpoint = Some(state);
                }
                Next::Stop(stop) => {
                    outcome.attempts.push(summary(&decision));
                    return Handover::Stop(stop, decision.exit_code);
                }
                Next::Replan { checkpoint, resume } => {
                    let mut summary = summary(&decision);
                    let code = decision.exit_code;
                    let relaunched =
                        self.relaunch(attempt, &ended.ending, decision, checkpoint, resume);
                    summary.timing.restart = ended.stopped.elapsed();
                    let handover = match relaunched {
                        Ok((next, replan)) => {
                            summary.replan = Some(replan);
                            Handover::Relaunch(Box::new(next), ended.detected_at)
                        }
                        Err(stop) => {
                            summary.replan = Some(stop.reason());
                            Handover::Stop(stop, code)
                        }
                    };
                    outcome.attempts.push(summary);
                    return handover;
                }
            }
        }
    }

    /// Reads the straggler lines that came in since the last call: records recoveries, and
    /// returns the ending when a straggler is found that [`Self::straggler`] decides to act
    /// on.
    fn next_straggler(
        &self,
        watch: &mut StragglerWatch,
        attempt: &Attempt,
        output: &JobOutput,
    ) -> Option<Ending> {
        let found: Vec<Straggler> = output
            .take_straggler_lines()
            .into_iter()
            .filter_map(|line| {
                let found = watch.detector.line(line);
                if let Some(recovery) = watch.detector.take_recovery() {
                    self.emit(Event::StragglerRecovered {
                        attempt: attempt.number,
                        recovery,
                        state: StragglerState::Recovered,
                        iteration: output.iterations().map(|(_, last)| last),
                        measured_ms: output.recent_iteration_ms(),
                    });
                }
                found
            })
            .collect();
        found.into_iter().find_map(|s| {
            self.straggler(attempt, output, &s, watch.teardown, watch.replans_left)
                .map(|act| Ending::Straggler(Box::new(act)))
        })
    }

    /// A straggler was found: has its choices costed and decided ([`stragglers::weigh`]),
    /// records the verdict. Returns the action when the decision is to act.
    fn straggler(
        &self,
        attempt: &Attempt,
        output: &JobOutput,
        straggler: &Straggler,
        teardown: Duration,
        replans_left: u32,
    ) -> Option<StragglerAct> {
        let options = &self.options.stragglers;
        let hosts: Vec<String> = attempt.spec.nodes.iter().map(|n| n.host.clone()).collect();
        let planned = attempt.layout.planned();
        let running = planned.map(|planned| RunningPlan {
            settings: &planned.settings,
            options: &planned.options,
            plan: &planned.plan,
            profile: &planned.profile,
            hosts: &hosts,
            format: &planned.settings.training.checkpoint,
        });
        let progress = Progress {
            iteration: output.iterations().map(|(_, last)| last),
            total: output.total_iterations(),
            // An unplanned job resumes nothing: no checkpoint it writes is ours to read.
            checkpoint: output
                .checkpoint_iteration()
                .filter(|_| planned.is_some_and(|p| p.settings.training.save.is_some())),
            recent_ms: output.recent_iteration_ms(),
            best_ms: output.best_iteration_ms(),
            startup: output.timing().first_iteration.unwrap_or_default(),
        };
        let weighed = stragglers::weigh(&Found {
            straggler,
            running,
            progress,
            teardown,
            options,
            since_last_action: self.straggler_acted.get().map(|t| t.elapsed()),
            replans_left,
        });
        let action = weighed.verdict.action;
        self.emit(Event::Straggler {
            attempt: attempt.number,
            straggler: straggler.clone(),
            state: StragglerState::Detected,
            iteration: progress.iteration,
            measured_ms: progress.recent_ms,
            choices: weighed.choices.clone(),
            remaining_iterations: weighed.remaining_iterations,
            restart: Some(weighed.restart),
            verdict: weighed.verdict,
            mode: options.mode,
        });
        if action == Choice::Keep {
            return None;
        }
        self.straggler_acted.set(Some(Instant::now()));
        Some(StragglerAct {
            host: straggler.host.clone(),
            slowdown: straggler.slowdown,
            choice: action,
            profile: weighed.remap_profile.filter(|_| action == Choice::Remap),
            choices: weighed.choices,
        })
    }

    /// What the attempt's progress line says besides the job's lines.
    fn progress_spec(&self, attempt: &Attempt) -> ProgressSpec {
        let interval = self.options.progress_interval;
        let world_size = attempt.spec.world_size;
        match attempt.layout.planned() {
            Some(p) => ProgressSpec::planned(interval, &p.plan, &p.settings, &p.profile),
            None => ProgressSpec {
                interval,
                world_size,
                ..ProgressSpec::default()
            },
        }
    }

    /// Tears the attempt down (nothing of it may outlive it), sweeps its nodes and, after a
    /// failure, health-checks those not already suspected. After a stall, first finds the
    /// nodes where a process of the job is stopped (the teardown kills it).
    fn stop_and_check(
        &self,
        attempt: &Attempt,
        hosts: &[String],
        job: &mut NodeGroup,
        output: &JobOutput,
        ending: &Ending,
    ) -> Checked {
        let stopped = match ending {
            Ending::Stalled(_) => self.stopped_nodes(hosts),
            _ => Vec::new(),
        };
        self.reporter.teardown_begins(ending);
        let signals_before = self.signal_count();
        let teardown_start = Instant::now();
        let stops = job.stop(&|| self.signal_count() > signals_before);
        for stop in stops.iter().filter(|s| s.was_running) {
            let status = stop
                .status
                .map_or("unknown status".to_string(), |s| s.to_string());
            let note = format!("stopped ({status}) after {}", format_duration(stop.took));
            output.note(&stop.host, &note);
        }
        let unresponsive: Vec<String> = stops
            .iter()
            .filter(|s| s.was_running && !s.stopped_in_grace)
            .map(|s| s.host.clone())
            .collect();
        let suspects = decide::suspects(ending, &unresponsive, &stopped, hosts);
        let swept = job.sweep().iter().sum();
        let health = self.check_health(attempt, hosts, &suspects, ending.is_failure());
        self.emit(Event::Teardown {
            attempt: attempt.number,
            nodes: stops.iter().map(StopRecord::from).collect(),
            swept,
            took: teardown_start.elapsed(),
            iterations: output.iterations(),
        });
        let unhealthy: Vec<String> = health
            .iter()
            .filter(|h| !h.healthy)
            .map(|h| h.host.clone())
            .collect();
        if !health.is_empty() {
            self.emit(Event::Health { nodes: health });
        }
        Checked {
            unresponsive,
            unhealthy,
            stopped,
        }
    }

    /// The nodes where a process of the job is stopped, all asked at once (a node that
    /// does not answer is no evidence: its health check judges it).
    fn stopped_nodes(&self, hosts: &[String]) -> Vec<String> {
        let (template, timeout) = (self.template, self.options.health_timeout);
        std::thread::scope(|scope| {
            let handles: Vec<_> = hosts
                .iter()
                .map(|host| {
                    scope.spawn(move || {
                        launch::stopped_processes(
                            &template.transport,
                            host,
                            &template.run_id,
                            timeout,
                        )
                        .is_ok_and(|n| n > 0)
                    })
                })
                .collect();
            hosts
                .iter()
                .zip(handles)
                .filter_map(|(host, h)| h.join().unwrap_or(false).then(|| host.clone()))
                .collect()
        })
    }

    /// Re-plans on the decision's survivors (or, with planning off, takes the same world on
    /// them) and prepares the next attempt. Returns it with what changed in words, or why
    /// the job stops.
    fn relaunch(
        &self,
        attempt: &Attempt,
        ending: &Ending,
        decision: Decision,
        checkpoint: CheckpointState,
        resume: Option<Resume>,
    ) -> Result<(Attempt, String), Stop> {
        let template = self.template;
        let (left_out, survivors) = (decision.left_out, decision.survivors);
        let refuse = |reason: String, left_out: Vec<String>, survivors: Vec<String>| {
            self.emit(Event::ReplanRefused {
                reason: reason.clone(),
                left_out,
                survivors,
            });
            Stop::ReplanRefused(reason)
        };
        let (layout, kept_tp_pp, resharded, notes) = match &attempt.layout {
            Layout::World(world) => {
                if survivors.is_empty() {
                    let reason = ReplanError::NoSurvivors.to_string();
                    return Err(refuse(reason, left_out, survivors));
                }
                (
                    Layout::World(world.on(&survivors)),
                    false,
                    false,
                    Vec::new(),
                )
            }
            Layout::Planned(planned) => {
                // A re-map around a straggler plans on the cluster with its GPUs slowed.
                let profile = match ending {
                    Ending::Straggler(act) => act.profile.as_ref().unwrap_or(&planned.profile),
                    _ => &planned.profile,
                };
                let failed = Failed {
                    survivors: &survivors,
                    spares: &planned.plan.spares,
                    previous: &planned.plan.config,
                };
                let replanned = match ending {
                    // What was costed and chosen: the plan kept, a spare in its place.
                    Ending::Straggler(act) if act.choice == Choice::SwapSpare => swap_for_spares(
                        &planned.settings,
                        profile,
                        failed,
                        &planned.options,
                        checkpoint,
                    ),
                    _ => replan(
                        &planned.settings,
                        profile,
                        failed,
                        &planned.options,
                        checkpoint,
                        &planned.settings.training.checkpoint,
                    )
                    .map_err(|e| e.to_string()),
                };
                match replanned {
                    Ok(r) => (
                        Layout::Planned(Box::new(Planned {
                            settings: planned.settings.clone(),
                            options: planned.options.clone(),
                            plan: r.plan,
                            profile: r.profile,
                        })),
                        r.kept_tp_pp,
                        r.resharded,
                        r.notes,
                    ),
                    Err(e) => return Err(refuse(e, left_out, survivors)),
                }
            }
        };
        let next = template
            .prepare(attempt.number + 1, layout, resume.clone())
            .map_err(|e| Stop::PrepareFailed(e.to_string()))?;
        let (from, to) = (attempt.layout.config(), next.layout.config());
        let world_sizes = (attempt.spec.world_size, next.spec.world_size);
        let mapping_changed = match (attempt.layout.planned(), next.layout.planned()) {
            (Some(a), Some(b)) => {
                a.plan.mapping.node_order != b.plan.mapping.node_order
                    || a.plan.mapping.cuda_visible_devices != b.plan.mapping.cuda_visible_devices
            }
            _ => false,
        };
        // The nodes the next attempt runs on: survivors, and spares that took a failed
        // node's place (a survivor a subset leaves out is not among them).
        let nodes: Vec<String> = next.spec.nodes.iter().map(|n| n.host.clone()).collect();
        let spares_in: Vec<String> = nodes
            .iter()
            .filter(|h| !survivors.contains(h))
            .cloned()
            .collect();
        let text = match (from, to) {
            (Some(from), Some(to)) => replan_text(
                (nodes.len(), &left_out, &spares_in),
                (from, to),
                mapping_changed,
                kept_tp_pp,
                resume.as_ref(),
            ),
            _ => relaunch_text(nodes.len(), &left_out, world_sizes),
        };
        self.emit(Event::Replan {
            attempt: next.number,
            left_out,
            nodes,
            spares_in,
            from: from.cloned(),
            to: to.cloned(),
            world_sizes,
            kept_tp_pp,
            mapping_changed,
            resharded,
            resume,
            notes: notes.iter().chain(&next.spec.notes).cloned().collect(),
        });
        Ok((next, text))
    }

    /// When asked, health-checks every node of the attempt not already left out, all in
    /// parallel.
    fn check_health(
        &self,
        attempt: &Attempt,
        hosts: &[String],
        left_out: &[String],
        check: bool,
    ) -> Vec<Health> {
        let (template, timeout): (&JobSpec, Duration) =
            (self.template, self.options.health_timeout);
        if !check {
            return Vec::new();
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = hosts
                .iter()
                .filter(|host| !left_out.contains(host))
                .map(|host| {
                    scope.spawn(move || {
                        let gpus = attempt
                            .layout
                            .profile()
                            .and_then(|p| health::expected_gpus(p, host));
                        health::check(&template.transport, host, gpus, timeout)
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        })
    }
}
