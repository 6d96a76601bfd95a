//! `events.jsonl` in the run directory: one JSON object per line for every launch, failure,
//! stall, straggler, teardown, health check, re-plan, signal and the exit, so tools (and people after
//! the fact) can follow what the supervisor did without parsing logs.
//!
//! Every line starts with `time` (UTC, RFC 3339 with milliseconds), `unix_ms`, `elapsed_s`
//! (since the supervisor started) and `event` (the [`Event`] variant's name in snake case),
//! then the variant's fields as [`Event`] documents them, and ends with `schema`
//! ([`SCHEMA`]), which changes whenever a field is renamed, removed or changes meaning; a
//! field or a value added keeps it (readers pass over what they do not know). Durations are
//! in seconds with millisecond precision (fields named `..._s`).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Serialize, Serializer};
use serde_json::Value;

use super::health::Health;
use super::NodeFailure;
use crate::launch::{NodeStop, Resume};
use crate::model::parallel::ParallelConfig;

/// The version of the events' schema, written as `schema` on every line.
pub const SCHEMA: u32 = 4;

/// One thing the supervisor did or saw.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// An attempt starts: torchrun on every node.
    Launch {
        attempt: u32,
        /// The attempt's directory (its files and `logs/`).
        dir: String,
        /// In node-rank order.
        nodes: Vec<NodeRef>,
        /// The plan's tp, pp, dp, micro_batch, vpp, ...; null when planning is off.
        config: Option<ParallelConfig>,
        /// Workers across the nodes.
        world_size: u64,
        /// `local`, `ssh` or `srun`.
        transport: String,
        resume: Option<Resume>,
        /// Relaunches: from the failure's detection.
        #[serde(rename = "since_failure_s", serialize_with = "seconds_or_null")]
        since_failure: Option<Duration>,
    },
    /// The first iteration line of an attempt.
    Progress { attempt: u32, first_iteration: u64 },
    /// A node's torchrun failed (one event per node seen failing in the same poll).
    NodeFailed {
        /// `host`, `node_rank`, `reason` (`exited`, `signal`, `start_failed`,
        /// `connection_lost`), `status`, `exit_code`, `worker_rank`, `detail`.
        #[serde(flatten)]
        failure: NodeFailure,
        attempt: u32,
    },
    /// No progress for the stall (or start-up) timeout.
    Stalled {
        attempt: u32,
        #[serde(rename = "silent_s", serialize_with = "seconds")]
        silent: Duration,
        last_iteration: Option<u64>,
    },
    /// A stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) arrived.
    Signal {
        /// `SIGINT`, `SIGTERM`, `SIGHUP`, `SIGQUIT`.
        signal: String,
        count: usize,
    },
    /// An act signal (SIGUSR1, SIGUSR2) arrived and was passed on to the training script's
    /// workers on every node; the job goes on.
    SignalPassed {
        /// 0: during the trial run, before attempt 1.
        attempt: u32,
        signal: String,
        /// How many worker processes it reached, all nodes together.
        workers: usize,
    },
    /// A node stayed slower than the others for the configured windows of the straggler
    /// report, and what the supervisor made of it.
    Straggler {
        attempt: u32,
        /// `host`, `node_rank`, `slowdown` (2.0: half speed), `windows`, `ranks`.
        #[serde(flatten)]
        straggler: super::stragglers::Straggler,
        /// `detected` (see [`Event::StragglerRecovered`]).
        state: super::stragglers::StragglerState,
        /// The iteration it was found at.
        iteration: Option<u64>,
        /// The time per iteration now, ms.
        measured_ms: Option<f64>,
        /// `keep`, `remap` and `leave_out` with their predicted ms per iteration (null
        /// when not possible) and what they are.
        choices: Vec<super::stragglers::Costed>,
        remaining_iterations: u64,
        /// `teardown_s`, `startup_s`, `lost_iterations`.
        restart: Option<super::stragglers::RestartCost>,
        /// `action` (`keep`, `remap`, `leave_out`), `gain_s`, `cost_s`, `why`.
        verdict: super::stragglers::Verdict,
        /// `report` or `act`.
        mode: super::stragglers::StragglerMode,
    },
    /// A straggler found before, with which the job went on, kept up with the others again
    /// for the configured windows: a `straggler` event too, its `state` `recovered`.
    #[serde(rename = "straggler")]
    StragglerRecovered {
        attempt: u32,
        /// `host`, `node_rank`, `windows` (how long it has kept up).
        #[serde(flatten)]
        recovery: super::stragglers::Recovery,
        /// `recovered`.
        state: super::stragglers::StragglerState,
        /// The iteration it was found recovered at.
        iteration: Option<u64>,
        /// The time per iteration now, ms.
        measured_ms: Option<f64>,
    },
    /// Every node of an attempt was stopped.
    Teardown {
        attempt: u32,
        /// In node-rank order.
        nodes: Vec<StopRecord>,
        /// Processes killed after their launcher was gone.
        swept: usize,
        #[serde(rename = "took_s", serialize_with = "seconds")]
        took: Duration,
        /// `[first, last]` iteration the attempt reported, or null.
        iterations: Option<(u64, u64)>,
    },
    /// The health checks after a failure (`host`, `healthy`, `detail` per node).
    Health { nodes: Vec<Health> },
    /// The job is re-planned on the survivors.
    Replan {
        /// The next attempt.
        attempt: u32,
        left_out: Vec<String>,
        /// The nodes the next attempt runs on, in node-rank order: survivors and spares
        /// swapped in.
        nodes: Vec<String>,
        /// The hot spares among `nodes` (never launched before; they take failed or
        /// straggling nodes' places).
        spares_in: Vec<String>,
        /// The plans before and after; null when planning is off (the same script and
        /// arguments run on the survivors' world).
        from: Option<ParallelConfig>,
        to: Option<ParallelConfig>,
        /// `[before, after]`: workers across the nodes.
        world_sizes: (u64, u64),
        kept_tp_pp: bool,
        /// Whether the ranks sit on other GPUs than before (a node order or a
        /// `CUDA_VISIBLE_DEVICES` that differs); false when planning is off.
        mapping_changed: bool,
        resharded: bool,
        resume: Option<Resume>,
        notes: Vec<String>,
    },
    /// No plan could be made for the survivors.
    ReplanRefused {
        reason: String,
        left_out: Vec<String>,
        survivors: Vec<String>,
    },
    /// pipette-run ends.
    Exit {
        code: i32,
        reason: String,
        attempts: usize,
        replans: u32,
        /// From each failure's detection to the relaunch.
        #[serde(rename = "relaunch_after_s", serialize_with = "seconds_each")]
        relaunch_after: Vec<Duration>,
    },
}

/// A node of an attempt.
#[derive(Debug, Clone, Serialize)]
pub struct NodeRef {
    pub host: String,
    pub node_rank: u64,
}

/// How one node's torchrun stopped in a teardown.
#[derive(Debug, Clone, Serialize)]
pub struct StopRecord {
    pub host: String,
    pub node_rank: u64,
    /// `exit code 0`, `signal 15 (SIGTERM)`, or null when it could not be waited for.
    pub status: Option<String>,
    pub was_running: bool,
    #[serde(rename = "took_s", serialize_with = "seconds")]
    pub took: Duration,
    pub stopped_in_grace: bool,
    pub error: Option<String>,
}

impl From<&NodeStop> for StopRecord {
    fn from(stop: &NodeStop) -> Self {
        StopRecord {
            host: stop.host.clone(),
            node_rank: stop.node_rank,
            status: stop.status.map(|s| s.to_string()),
            was_running: stop.was_running,
            took: stop.took,
            stopped_in_grace: stop.stopped_in_grace,
            error: stop.error.clone(),
        }
    }
}

pub(crate) fn seconds<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(round3(d.as_secs_f64()))
}

pub(crate) fn seconds_or_null<S: Serializer>(
    d: &Option<Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    d.map(|d| round3(d.as_secs_f64())).serialize(s)
}

fn seconds_each<S: Serializer>(d: &[Duration], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(d.iter().map(|d| round3(d.as_secs_f64())))
}

/// One line of the log: the common fields first, the event's own, the schema last.
#[derive(Serialize)]
struct Line<'a> {
    time: String,
    unix_ms: u64,
    elapsed_s: f64,
    #[serde(flatten)]
    event: &'a Event,
    schema: u32,
}

/// The event log of one run.
pub struct EventLog {
    path: PathBuf,
    file: Mutex<File>,
    start: Instant,
}

impl EventLog {
    /// Creates (or appends to) `events.jsonl` in `run_dir`.
    pub fn create(run_dir: &Path) -> std::io::Result<EventLog> {
        std::fs::create_dir_all(run_dir)?;
        let path = run_dir.join("events.jsonl");
        let file = File::options().create(true).append(true).open(&path)?;
        Ok(EventLog {
            path,
            file: Mutex::new(file),
            start: Instant::now(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one event. A failed write is reported once on stderr and never stops the job.
    pub fn write(&self, event: &Event) {
        let now = SystemTime::now();
        let unix_ms = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let line = Line {
            time: rfc3339_millis(unix_ms),
            unix_ms,
            elapsed_s: round3(self.start.elapsed().as_secs_f64()),
            event,
            schema: SCHEMA,
        };
        let line = match serde_json::to_string(&line) {
            Ok(line) => line,
            // Every field is a plain value; this cannot fail, but a log line is never worth
            // stopping a job for.
            Err(e) => format!("{{\"event\":\"unwritable\",\"error\":{:?}}}", e.to_string()),
        };
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = writeln!(file, "{line}").and_then(|()| file.flush()) {
            crate::log::warn(&format!("cannot write {}: {e}", self.path.display()));
        }
    }
}

/// Seconds with millisecond precision, for JSON.
pub fn round3(seconds: f64) -> f64 {
    (seconds * 1000.0).round() / 1000.0
}

/// `2026-11-22T04:09:15.123Z`.
pub fn rfc3339_millis(unix_ms: u64) -> String {
    let at = i64::try_from(unix_ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(jiff::Timestamp::MAX);
    format!("{at:.3}")
}

/// Reads an `events.jsonl` back (for tests and tools).
pub fn read_events(path: &Path) -> std::io::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn times_are_utc_rfc3339() {
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_millis(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(
            rfc3339_millis(1_795_320_555_001),
            "2026-11-22T04:09:15.001Z"
        );
    }

    #[test]
    fn events_are_one_object_per_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::create(dir.path()).unwrap();
        log.write(&Event::Progress {
            attempt: 1,
            first_iteration: 1,
        });
        log.write(&Event::Exit {
            code: 0,
            reason: "training finished".into(),
            attempts: 1,
            replans: 0,
            relaunch_after: vec![Duration::from_micros(1_234_567)],
        });
        let events = read_events(log.path()).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["event"], "progress");
        assert_eq!(events[0]["attempt"], 1);
        assert!(events[1]["unix_ms"].as_u64().unwrap() >= events[0]["unix_ms"].as_u64().unwrap());
        assert_eq!(events[1]["relaunch_after_s"], serde_json::json!([1.235]));
        assert!(events.iter().all(|e| e["schema"] == SCHEMA));
    }

    /// A straggler found at iteration 200 (kept), then recovered at 230.
    pub(crate) fn straggler_events() -> [Event; 2] {
        use crate::supervise::stragglers::{
            three_choices, Choice, Recovery, Straggler, StragglerMode, StragglerState, Verdict,
        };
        let found = Event::Straggler {
            attempt: 1,
            straggler: Straggler {
                host: "b".into(),
                node_rank: 1,
                slowdown: 2.0,
                windows: 3,
                ranks: vec![2, 3],
            },
            state: StragglerState::Detected,
            iteration: Some(200),
            measured_ms: Some(2000.0),
            choices: three_choices(Some(2000.0), None, Some(1500.0)),
            remaining_iterations: 100,
            restart: None,
            verdict: Verdict {
                action: Choice::Keep,
                gain_s: 50.0,
                cost_s: 0.0,
                why: "reported only (--stragglers act would act)".into(),
            },
            mode: StragglerMode::Report,
        };
        let recovered = Event::StragglerRecovered {
            attempt: 1,
            recovery: Recovery {
                host: "b".into(),
                node_rank: 1,
                windows: 3,
            },
            state: StragglerState::Recovered,
            iteration: Some(230),
            measured_ms: Some(1000.0),
        };
        [found, recovered]
    }

    #[test]
    fn a_straggler_event_says_whether_it_was_found_or_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::create(dir.path()).unwrap();
        for event in straggler_events() {
            log.write(&event);
        }
        let events = read_events(log.path()).unwrap();
        assert!(events.iter().all(|e| e["event"] == "straggler"));
        assert!(events
            .iter()
            .all(|e| e["host"] == "b" && e["node_rank"] == 1));
        assert_eq!(events[0]["state"], "detected");
        assert_eq!(events[0]["verdict"]["action"], "keep");
        assert_eq!(events[1]["state"], "recovered");
        assert_eq!(events[1]["windows"], 3);
        assert_eq!(events[1]["iteration"], 230);
        assert_eq!(events[1]["measured_ms"], 1000.0);
        assert_eq!(events[1].get("verdict"), None);
    }

    #[test]
    fn the_common_fields_come_first_and_the_schema_last() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::create(dir.path()).unwrap();
        log.write(&Event::Signal {
            signal: "SIGINT".into(),
            count: 2,
        });
        let text = std::fs::read_to_string(log.path()).unwrap();
        let keys: Vec<&str> = text
            .trim()
            .trim_matches(|c| c == '{' || c == '}')
            .split(',')
            .filter_map(|kv| kv.split(':').next())
            .map(|k| k.trim_matches('"'))
            .collect();
        assert_eq!(
            keys,
            [
                "time",
                "unix_ms",
                "elapsed_s",
                "event",
                "signal",
                "count",
                "schema"
            ]
        );
    }

    #[test]
    fn a_node_failure_keeps_its_fields_beside_the_attempt() {
        let failure = NodeFailure {
            host: "node-b".into(),
            node_rank: 1,
            reason: super::super::FailureReason::Signal,
            status: Some("signal 9 (SIGKILL)".into()),
            exit_code: 137,
            worker_rank: None,
            detail: String::new(),
        };
        let value = serde_json::to_value(Event::NodeFailed {
            failure,
            attempt: 2,
        })
        .unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "event": "node_failed", "attempt": 2, "host": "node-b", "node_rank": 1,
                "reason": "signal", "status": "signal 9 (SIGKILL)", "exit_code": 137,
                "worker_rank": null, "detail": "",
            })
        );
    }
}
