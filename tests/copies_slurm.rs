//! One pipette-run per task of a real Slurm step (Debian's slurmctld, slurmd and munge on
//! loopback, see `common::Slurm`): a step with more tasks than nodes — a task per GPU, as
//! NVIDIA's recipes write it — is refused by every task before anything runs, with the
//! srun line to write instead; a one-task step is the single driver it always was.
//!
//! Requires what tests/exec_slurm.rs requires; fails, never skips, without it.

mod common;

use std::process::{Command, Stdio};

use common::{Slurm, TINY_MODEL};

fn srun_pipette(slurm: &Slurm, job: &str, tasks: &str) -> std::process::Output {
    Command::new(slurm.srun_in(job))
        .args(["--nodes=1", tasks])
        .arg(env!("CARGO_BIN_EXE_pipette-run"))
        .args(["--dry-run", "--json", "train.py"])
        .args(TINY_MODEL)
        .env_remove("PIPETTE_JOB_SECRET")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_step_with_a_task_per_gpu_is_refused_before_anything_runs() {
    let slurm = Slurm::start();
    let job = slurm.allocate();
    let out = srun_pipette(&slurm, &job, "--ntasks=2");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // srun exits with the tasks' code: the node list's.
    assert_eq!(out.status.code(), Some(66), "{stderr}\n{}", slurm.logs());
    let refusal = "pipette-run: error: this Slurm step runs 2 tasks on 1 node, but pipette-run \
                   runs once per node and starts the processes of every GPU itself (write the \
                   step as `srun --nodes=1 --ntasks-per-node=1 pipette-run --nproc-per-node=2 ...`)";
    assert_eq!(
        stderr.lines().filter(|l| *l == refusal).count(),
        2,
        "each task says it, in one line:\n{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing was planned");

    // One task: the single driver, as before.
    let out = srun_pipette(&slurm, &job, "--ntasks=1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["nodes"]["source"]["kind"], "slurm");
}
