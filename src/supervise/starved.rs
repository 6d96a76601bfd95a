//! How long the job's processes on this machine waited for a CPU: time the stall rule does
//! not count as silence.
//!
//! On a machine shared with other work (two cores, twenty runnable processes) a healthy job
//! can go a minute without an iteration line because its workers were runnable but not
//! running; a wall-clock stall limit then re-plans a job that was never stuck. A stuck job
//! is different: its workers block (a collective that never completes), which costs no
//! run-queue wait, or spin, and a spinning worker still gets its share of the CPU. So the
//! stall rule measures silence as wall time less the time the job was held up waiting for
//! a CPU: per sample, the longest run-queue wait of any one of the job's threads (the ranks
//! go in lock step, at the pace of the slowest), as the kernel counts it in
//! `/proc/PID/task/TID/schedstat` (its second field, ns).
//!
//! The job's processes are those whose environment holds its run id
//! ([`crate::launch::RUN_ID_VAR`]), as the sweep finds them. Only this machine's are seen
//! (the local transport, and the node pipette-run runs on); a job with none here has its
//! silence in wall time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// How often the process table is read: the stall limits are many seconds, and reading it
/// costs CPU the job may need.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// The time the job's processes on this machine spent waiting for a CPU, summed over
/// samples.
pub struct StarvedClock {
    /// `PIPETTE_RUN_ID=<id>`, as in the processes' environment; `None` for a job without a
    /// run id (nothing is looked for).
    marker: Option<String>,
    /// Whether each process seen so far is one of the job's (its environment is read once).
    is_job: BTreeMap<i32, bool>,
    /// Each of the job's threads' run-queue wait at the last sample, ns.
    waits: BTreeMap<i32, u64>,
    total: Duration,
    last_sample: Option<Instant>,
}

impl StarvedClock {
    /// A clock for the processes of run `run_id` (empty: none).
    pub fn new(run_id: &str) -> StarvedClock {
        StarvedClock {
            marker: (!run_id.is_empty()).then(|| format!("{}={run_id}", crate::launch::RUN_ID_VAR)),
            is_job: BTreeMap::new(),
            waits: BTreeMap::new(),
            total: Duration::ZERO,
            last_sample: None,
        }
    }

    /// How long the job was held up waiting for a CPU since the clock started (read again
    /// at most every [`SAMPLE_EVERY`]).
    pub fn total(&mut self) -> Duration {
        if self
            .last_sample
            .is_none_or(|at| at.elapsed() >= SAMPLE_EVERY)
        {
            self.sample();
        }
        self.total
    }

    /// Reads the job's threads' waits; adds the longest wait since the last sample (never
    /// more than the time between the two: a thread cannot wait longer than that).
    pub fn sample(&mut self) {
        let now = Instant::now();
        let since = self.last_sample.map(|at| now.saturating_duration_since(at));
        self.last_sample = Some(now);
        let Some(marker) = &self.marker else {
            return;
        };
        let waits = job_thread_waits(marker, &mut self.is_job);
        let longest = waits
            .iter()
            .filter_map(|(tid, wait)| Some(wait.saturating_sub(*self.waits.get(tid)?)))
            .max()
            .unwrap_or(0);
        self.waits = waits;
        if let Some(since) = since {
            self.total += Duration::from_nanos(longest).min(since);
        }
    }
}

/// The run-queue wait (ns) of every thread of the processes of this machine whose
/// environment holds `marker`; `is_job` remembers which processes are the job's (and drops
/// those that are gone).
fn job_thread_waits(marker: &str, is_job: &mut BTreeMap<i32, bool>) -> BTreeMap<i32, u64> {
    let me = std::process::id() as i32;
    let pids: BTreeSet<i32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|pid| *pid != me)
        .collect();
    is_job.retain(|pid, _| pids.contains(pid));
    let mut waits = BTreeMap::new();
    for pid in pids {
        let ours = *is_job.entry(pid).or_insert_with(|| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|e| crate::launch::environ_has(&e, marker))
        });
        if !ours {
            continue;
        }
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            if let Some(wait) = std::fs::read_to_string(task.path().join("schedstat"))
                .ok()
                .as_deref()
                .and_then(run_queue_wait)
            {
                waits.insert(tid, wait);
            }
        }
    }
    waits
}

/// The run-queue wait of a `schedstat` line (`on-CPU ns`, `waiting ns`, `timeslices`).
fn run_queue_wait(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::process::{Child, Command};

    use super::*;

    #[test]
    fn the_wait_is_the_second_field_of_schedstat() {
        assert_eq!(run_queue_wait("1200 3400 5\n"), Some(3400));
        assert_eq!(run_queue_wait("1200"), None);
        assert_eq!(run_queue_wait(""), None);
    }

    /// The first CPU this process may run on.
    fn first_allowed_cpu() -> String {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .expect("Cpus_allowed_list in /proc/self/status");
        list.trim()
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .to_string()
    }

    /// A busy process of run `run_id`, pinned to one CPU.
    fn busy_process_of_run(run_id: &str) -> Child {
        Command::new("taskset")
            .args([
                "-c",
                &first_allowed_cpu(),
                "sh",
                "-c",
                "while :; do :; done",
            ])
            .env(crate::launch::RUN_ID_VAR, run_id)
            .spawn()
            .expect("start sh under taskset (util-linux)")
    }

    /// Two busy processes of the job on one CPU: each runs half the time and waits the
    /// other half, which the clock counts; a process of another run is not the job's.
    #[test]
    fn two_busy_workers_on_one_cpu_wait_for_it() {
        let run_id = format!("starved-test-{}", std::process::id());
        let mut busy: Vec<Child> = (0..2).map(|_| busy_process_of_run(&run_id)).collect();
        let mut clock = StarvedClock::new(&run_id);
        let mut other = StarvedClock::new(&format!("{run_id}-other"));
        clock.sample();
        other.sample();
        // Until the two have been seen waiting: a busy machine may run them late.
        let started = Instant::now();
        while clock.total < Duration::from_millis(200)
            && started.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(300));
            clock.sample();
            other.sample();
        }
        for child in &mut busy {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(
            clock.total >= Duration::from_millis(200),
            "two busy processes on one CPU waited only {:?}",
            clock.total
        );
        assert_eq!(
            other.total,
            Duration::ZERO,
            "another run's clock counted them"
        );
        assert!(clock.total <= started.elapsed() + Duration::from_millis(300));
    }

    /// A job whose processes sleep (a collective that never completes) waits for nothing:
    /// its silence is all counted.
    #[test]
    fn a_blocked_worker_waits_for_no_cpu() {
        let run_id = format!("blocked-test-{}", std::process::id());
        let mut sleeper = Command::new("sleep")
            .arg("30")
            .env(crate::launch::RUN_ID_VAR, &run_id)
            .spawn()
            .expect("start sleep");
        // Asleep before the clock starts: on a busy machine its start-up may wait for a CPU.
        let stat = format!("/proc/{}/stat", sleeper.id());
        let started = Instant::now();
        while !std::fs::read_to_string(&stat).is_ok_and(|s| s.contains("(sleep) S")) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "sleep never slept"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut clock = StarvedClock::new(&run_id);
        clock.sample();
        assert!(!clock.waits.is_empty(), "the sleeping process was found");
        std::thread::sleep(Duration::from_millis(600));
        clock.sample();
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        assert!(
            clock.total < Duration::from_millis(50),
            "a sleeping process waited {:?} for a CPU",
            clock.total
        );
    }

    #[test]
    fn a_job_without_a_run_id_has_no_processes() {
        let mut clock = StarvedClock::new("");
        clock.sample();
        clock.sample();
        assert_eq!(clock.total(), Duration::ZERO);
        assert!(clock.waits.is_empty());
    }
}
