//! The srun transport against a real Slurm on loopback: a throwaway one-node cluster
//! (its own munged, slurmctld and slurmd, all in a temp dir, see `common::Slurm`), and the
//! commands run as job steps inside a real allocation through the real `srun`, exactly as
//! pipette-run runs them from a job script.
//!
//! Requires Debian's slurmctld, slurmd, slurm-client and munge (`scripts/install-test-deps`
//! installs them); the tests fail, never skip, without them. Each test has a cluster of its
//! own, so they run in parallel.

use std::time::Duration;

mod common;

use pipette::exec::{run, NodeCommand, SrunOptions, Transport};

use common::{
    assert_remote_exit_code_and_streams, assert_remote_io_intact, assert_teardown_reaches_the_node,
    Slurm, TINY_MODEL,
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
