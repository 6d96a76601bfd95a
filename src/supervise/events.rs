//! `events.jsonl` in the run directory: one JSON object per line for every launch, failure,
//! stall, teardown, health check, re-plan, signal and the exit, so tools (and people after
//! the fact) can follow what the supervisor did without parsing logs.
//!
//! Every object has `time` (UTC, RFC 3339 with milliseconds), `unix_ms`, `elapsed_s`
//! (since the supervisor started) and `event`; the other fields depend on the event:
//!
//! | event | fields |
//! |---|---|
//! | `launch` | `attempt`, `dir`, `nodes` (`host`, `node_rank`, in node-rank order), `config` (the plan's tp, pp, dp, micro_batch, vpp, ...), `transport`, `resume` (`{dir, iteration}` or null), `since_failure_s` (relaunches: from the failure's detection) |
//! | `progress` | `attempt`, `first_iteration`: the first iteration line of an attempt |
//! | `node_failed` | `attempt`, `host`, `node_rank`, `reason` (`exited`, `signal`, `start_failed`, `connection_lost`), `status`, `exit_code`, `worker_rank`, `detail` |
//! | `stalled` | `attempt`, `silent_s`, `last_iteration` |
//! | `signal` | `signal` (`SIGINT`, `SIGTERM`), `count` |
//! | `teardown` | `attempt`, `nodes` (`host`, `node_rank`, `status`, `was_running`, `took_s`, `stopped_in_grace`, `error`), `swept` (processes killed after their launcher was gone), `took_s`, `iterations` (`[first, last]` or null) |
//! | `health` | `nodes` (`host`, `healthy`, `detail`) |
//! | `replan` | `attempt` (the next one), `left_out`, `nodes` (the survivors), `from`, `to` (configurations), `kept_tp_pp`, `resharded`, `resume`, `notes` |
//! | `replan_refused` | `reason`, `left_out`, `survivors` |
//! | `exit` | `code`, `reason`, `attempts`, `replans`, `relaunch_after_s` |

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

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

    /// Appends one event: `fields` (an object) with `time`, `unix_ms`, `elapsed_s` and
    /// `event` put first. A failed write is reported once on stderr and never stops the job.
    pub fn record(&self, event: &str, fields: Value) {
        let now = SystemTime::now();
        let unix_ms = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut object = Map::new();
        object.insert("time".into(), json!(rfc3339_millis(unix_ms)));
        object.insert("unix_ms".into(), json!(unix_ms));
        object.insert(
            "elapsed_s".into(),
            json!(round3(self.start.elapsed().as_secs_f64())),
        );
        object.insert("event".into(), json!(event));
        if let Value::Object(fields) = fields {
            object.extend(fields);
        }
        let line = Value::Object(object).to_string();
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = writeln!(file, "{line}").and_then(|()| file.flush()) {
            eprintln!(
                "pipette-run: warning: cannot write {}: {e}",
                self.path.display()
            );
        }
    }
}

/// Seconds with millisecond precision, for JSON.
pub fn round3(seconds: f64) -> f64 {
    (seconds * 1000.0).round() / 1000.0
}

/// `2026-11-22T04:09:15.123Z`.
pub fn rfc3339_millis(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        unix_ms % 1000
    )
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
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
mod tests {
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
        log.record("launch", json!({"attempt": 1}));
        log.record("exit", json!({"code": 0}));
        let events = read_events(log.path()).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["event"], "launch");
        assert_eq!(events[0]["attempt"], 1);
        assert!(events[1]["unix_ms"].as_u64().unwrap() >= events[0]["unix_ms"].as_u64().unwrap());
    }
}
