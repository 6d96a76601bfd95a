//! The srun transport against a real Slurm on loopback: a throwaway one-node cluster
//! (its own munged, slurmctld and slurmd, all in a temp dir, see `common::Slurm`), and the
//! commands run as job steps inside a real allocation through the real `srun`, exactly as
//! pipette-run runs them from a job script.
//!
//! Requires Debian's slurmctld, slurmd, slurm-client and munge (`scripts/install-test-deps`
//! installs them); the tests fail, never skip, without them. Each test has a cluster of its
//! own, so they run in parallel.

use std::time::{Duration, Instant};

mod common;

use pipette::exec::group::NodeGroup;
use pipette::exec::{run, spawn_with, ExecOptions, NodeCommand, SrunOptions, Transport};
use pipette::launch::{sweep, RUN_ID_VAR};

use common::{
    alive, assert_no_process_left, assert_remote_exit_code_and_streams, assert_remote_io_intact,
    assert_teardown_reaches_the_node, eventually, read_pid, with_marker, Slurm, SLURM_KILL_WAIT,
    TINY_MODEL,
};

/// The srun transport as a job script inside allocation `job` gets it.
fn transport(slurm: &Slurm, job: &str) -> Transport {
    Transport::Srun(SrunOptions {
        program: slurm.srun_in(job),
        ..SrunOptions::default()
    })
}

#[test]
fn argv_env_cwd_and_stdin_arrive_byte_for_byte() {
    let slurm = Slurm::start();
    let job = slurm.allocate();
    let work = slurm.dir.path().join("a dir with 'quotes' and $x");
    assert_remote_io_intact(&transport(&slurm, &job), slurm.node, &work, &|| {
        slurm.logs()
    });
}

#[test]
fn exit_codes_and_stderr_come_back() {
    let slurm = Slurm::start();
    let job = slurm.allocate();
    assert_remote_exit_code_and_streams(&transport(&slurm, &job), slurm.node, &|| slurm.logs());
}

/// Killing `srun` does not end its job step: this checks that every way of stopping a
/// command ends the step's whole process tree.
#[test]
fn teardown_reaches_the_steps_process_tree() {
    let slurm = Slurm::start();
    let job = slurm.allocate();
    assert_teardown_reaches_the_node(
        &transport(&slurm, &job),
        slurm.node,
        slurm.dir.path(),
        &|| slurm.logs(),
    );
}

/// srun runs the step inside the allocation it was given: the command sees its job id.
#[test]
fn the_step_runs_in_the_allocation() {
    let slurm = Slurm::start();
    let job = slurm.allocate();
    let out = run(
        &transport(&slurm, &job),
        slurm.node,
        &NodeCommand::new("sh")
            .arg("-c")
            .arg("echo \"$SLURM_JOB_ID $SLURMD_NODENAME\""),
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", slurm.logs()));
    assert_eq!(out.stdout_text(), format!("{job} {}\n", slurm.node));
}

/// `pipette-run` started inside an allocation (by `salloc`, as from a job script) reads
/// the node list and job id Slurm sets, and picks srun to reach the nodes.
#[test]
fn a_dry_run_inside_an_allocation_finds_its_nodes() {
    let slurm = Slurm::start();
    // Nothing of the test's own environment: only what salloc sets reaches pipette-run.
    let out = std::process::Command::new("/usr/bin/salloc")
        .env_clear()
        .env("SLURM_CONF", &slurm.conf)
        .args(["--nodes=1", "--immediate=30", "--quiet"])
        .arg(env!("CARGO_BIN_EXE_pipette-run"))
        .args(["--dry-run", "--json", "train.py"])
        .args(TINY_MODEL)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "salloc pipette-run failed ({}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        slurm.logs()
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let nodes = &report["nodes"];
    assert_eq!(nodes["source"]["kind"], "slurm", "{nodes}");
    assert_eq!(nodes["hosts"][0]["host"], slurm.node, "{nodes}");
    assert_eq!(nodes["hosts"].as_array().map(Vec::len), Some(1), "{nodes}");
    assert!(
        nodes["job_id"].as_str().is_some_and(|id| !id.is_empty()),
        "{nodes}"
    );
}

/// Stopping a job run through srun, as the supervisor does after a signal: `NodeGroup::stop`
/// (gracefully, or killing at once as after a second Ctrl-C), then `sweep`. Nothing of the
/// job may be left on the node either way: not the launcher (which ignores TERM), not its
/// worker in a session of its own (as torchrun starts them), and the kill-at-once path
/// must stay quick although Slurm's `KillWait` (30 s by default) is long.
fn assert_job_stops_through_srun(kill_now: bool) {
    let slurm = Slurm::start();
    let job = slurm.allocate();
    let transport = transport(&slurm, &job);
    let how = if kill_now { "kill-now" } else { "graceful" };
    let marker = format!("pipette-srun-{how}-{}", std::process::id());
    let dir = slurm.dir.path();
    // `sleep` under a name holding the marker, so the worker shows up in the process table.
    let sleeper = dir.join(format!("{marker}-sleep"));
    std::os::unix::fs::symlink("/bin/sleep", &sleeper).unwrap();
    let (leader, worker) = (dir.join("leader"), dir.join("worker"));
    let run_id = format!("srun-stop-{how}-{}", std::process::id());
    // A launcher that ignores TERM and starts a worker in a session of its own: torchrun's
    // shape (and a hung one).
    let command = NodeCommand::new("sh")
        .arg("-c")
        .arg(
            "trap '' TERM; setsid \"$1\" 1000 & echo $! > \"$3\"; \"$1\" 1000 & echo $$ > \"$2\"; \
             wait; wait",
        )
        .arg(&marker)
        .arg(sleeper.display().to_string())
        .arg(leader.display().to_string())
        .arg(worker.display().to_string())
        .env(RUN_ID_VAR, &run_id)
        .env("PIPETTE_HOST", slurm.node);
    let grace = Duration::from_secs(2);
    let options = ExecOptions {
        grace,
        ..ExecOptions::default()
    };
    let running = spawn_with(&transport, slurm.node, &command, &options)
        .unwrap_or_else(|e| panic!("{e}\n{}", slurm.logs()));
    let (leader, worker) = (read_pid(&leader), read_pid(&worker));
    assert!(
        eventually(Duration::from_secs(5), || alive(leader) && alive(worker)),
        "the job never ran\n{}",
        slurm.logs()
    );
    let mut running_job = NodeGroup::adopt(vec![(slurm.node.to_owned(), Ok(running))], grace);
    let start = Instant::now();
    let stops = running_job.stop(&|| kill_now);
    let torn_down = start.elapsed();
    let left_after_teardown = with_marker(&marker).len();
    // Killing at once must end the job step itself, not leave it all to the sweep: srun
    // is told to cancel the step (a KILLed srun leaves it running for good).
    // Within half of KillWait: a step cancelled gracefully (TERM, KillWait, KILL) would
    // keep the launcher, which ignores TERM, for all of KillWait; how much sooner a killed
    // step goes depends only on how busy the machine is.
    let killed_within = SLURM_KILL_WAIT / 2;
    let step_gone = !kill_now || eventually(killed_within, || !alive(leader) && !alive(worker));
    let step_gone_in = start.elapsed();
    let swept = sweep(&transport, slurm.node, &run_id, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}\n{}", slurm.logs()));
    let swept_in = start.elapsed();
    eprintln!(
        "{how}: teardown {torn_down:?} ({left_after_teardown} marked process(es) left, \
         step gone: {step_gone} after {step_gone_in:?}), sweep killed {swept}, done after \
         {swept_in:?}; {stops:?}"
    );
    assert!(
        step_gone,
        "{how}: launcher {leader} / worker {worker} outlived the teardown by {killed_within:?}\n{}",
        slurm.logs()
    );
    assert!(
        eventually(Duration::from_secs(5), || !alive(leader) && !alive(worker)),
        "{how}: launcher {leader} / worker {worker} survived the teardown and the sweep\n{}",
        slurm.logs()
    );
    assert_no_process_left(&marker);
    // The graceful path waits out our grace period, never Slurm's KillWait on top.
    let limit = if kill_now {
        killed_within
    } else {
        grace + killed_within
    };
    assert!(
        start.elapsed() < limit,
        "{how}: the job took {:?} to stop",
        start.elapsed()
    );
    drop(slurm);
}

#[test]
fn a_second_signal_leaves_nothing_of_the_step_behind() {
    assert_job_stops_through_srun(true);
}

#[test]
fn a_graceful_stop_leaves_nothing_of_the_step_behind() {
    assert_job_stops_through_srun(false);
}
