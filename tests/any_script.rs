//! Any torchrun script launches: a script without Megatron's arguments (here
//! `examples/ddp.py`, plain DistributedDataParallel on gloo) runs under pipette-run as
//! torchrun would run it — planning off, said so in one line — on the nodes found, and is
//! supervised as a planned job is: failures end the job with the worker's code and leave
//! nothing running, a killed node is left out and the script runs again on the survivors.
//!
//! Two local "nodes" (`node-a`, `node-b`, both this machine through the local transport,
//! or 127.0.0.1 and 127.0.0.2 through a real sshd), PyTorch's real torchrun from the venv.
//! The plain runs have two CPU workers per node: their ranks are checked against
//! torchrun's rule for `--nnodes 2 --nproc-per-node 2 --node-rank N` with the static
//! rendezvous (rank = N·2 + local rank, world size 4), which one worker per node (torchrun's
//! default) could not tell from a lost `--nproc-per-node`. The failure and re-launch tests
//! are about supervision and run one worker per node (world size 2): each worker costs a
//! PyTorch start-up. Every job's processes carry the test's temp dir on their command line
//! (`--tag`), by which the process table is checked afterwards.
//!
//! They hold on a busy machine: they wait for what the job prints and for pipette-run to
//! exit, never for a fixed time. They run one at a time (two CPU cores cannot hold two
//! such jobs). Needs the venv of `scripts/setup-megatron-venv` (or
//! `PIPETTE_MEGATRON_PYTHON`) and, for the ssh test, OpenSSH's server; fails, never skips,
//! without them.

mod common;

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use common::{
    assert_no_process_left, cpu_job_command, find, node_processes, JobBuilder, Patience,
    RunningJob, Sshd,
};

static SERIAL: Mutex<()> = Mutex::new(());

const LOCAL: [&str; 2] = ["node-a", "node-b"];

/// Starts `pipette-run` with `options` on `examples/ddp.py` with `script_args`, `workers`
/// per node.
fn start(hosts: &[&str], workers: u64, options: &[&str], script_args: &[&str]) -> RunningJob {
    let mut job = JobBuilder::new(env!("CARGO_BIN_EXE_pipette-run"), "pipette-any-script-");
    let tag = job.dir().to_path_buf();
    job.hosts(hosts, workers as usize)
        .launch_basics(&common::torchrun())
        .args(["--grace", "5s", "--health-timeout", "15s"])
        .args(options)
        .arg("examples/ddp.py")
        .arg("--tag")
        .arg(tag)
        .args(script_args);
    job.spawn()
}

/// One `ddp: rank ...` line of the script: (rank, world, local rank, local world, node
/// rank, host).
type RankLine = (u64, u64, u64, u64, u64, String);

fn rank_lines(text: &str) -> Vec<RankLine> {
    let mut lines: Vec<RankLine> = text
        .lines()
        .filter_map(|l| l.split_once("ddp: rank ").map(|(_, rest)| rest))
        .filter(|rest| rest.contains(" world "))
        .map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let n = |i: usize| words[i].parse::<u64>().unwrap();
            // "R world W local_rank L local_world LW node_rank N host H"
            (n(0), n(2), n(4), n(6), n(8), words[10].to_string())
        })
        .collect();
    lines.sort();
    lines
}

/// What torchrun gives `hosts.len()` nodes of `workers` each with the static rendezvous
/// and node ranks in the order of `hosts`.
fn torchrun_ranks(hosts: &[&str], workers: u64) -> Vec<RankLine> {
    let world = hosts.len() as u64 * workers;
    (0..world)
        .map(|rank| {
            let node = rank / workers;
            (
                rank,
                world,
                rank % workers,
                workers,
                node,
                hosts[node as usize].to_string(),
            )
        })
        .collect()
}

/// A plain DDP run on `hosts` through `options`: every rank as torchrun numbers it, the
/// world of four, exit 0, planning off said once, the events of one attempt.
fn assert_plain_ddp_runs(hosts: &[&str], options: &[&str], transport: &str) {
    let mut job = start(hosts, 2, options, &["--steps", "2"]);
    let status = job.wait(Patience::total(Duration::from_secs(300)));
    let (stdout, stderr) = (job.stdout(), job.stderr());
    assert_eq!(status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(rank_lines(&stdout), torchrun_ranks(hosts, 2), "{stdout}");
    assert!(stdout.contains("ddp: step 1 world 4"), "{stdout}");
    let unstamped = common::unstamped_log(&stderr);
    let off: Vec<&str> = unstamped
        .lines()
        .filter(|l| l.starts_with("pipette-run: planning is off"))
        .collect();
    assert_eq!(off.len(), 1, "{stderr}");
    assert!(
        off[0].contains("--num-layers, --hidden-size, --num-attention-heads"),
        "{stderr}"
    );
    let events = job.events();
    let launch = find(&events, "launch");
    assert_eq!(launch.len(), 1, "{events:?}");
    assert_eq!(launch[0]["config"], Value::Null);
    assert_eq!(launch[0]["world_size"], 4);
    assert_eq!(launch[0]["transport"], transport);
    assert_eq!(find(&events, "exit")[0]["code"], 0);
    assert!(job.run_dir().join("world.json").is_file());
    assert_no_process_left(&job.marker());
}

#[test]
fn any_script_plain_ddp_on_two_local_nodes() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    assert_plain_ddp_runs(&LOCAL, &["--launcher", "local"], "local");
}

#[test]
fn any_script_plain_ddp_over_ssh() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let sshd = Sshd::start();
    let hosts = ["127.0.0.1", "127.0.0.2"];
    let config = sshd.client_config(&hosts);
    let config = config.display().to_string();
    assert_plain_ddp_runs(
        &hosts,
        &["--launcher", "ssh", "--ssh-config", &config],
        "ssh",
    );
    drop(sshd);
}

#[test]
fn any_script_rank_raising_fails_the_job_with_its_exception() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // One worker per node: worker rank 1 is node-b's (node rank 1, the `[node-b r1]` prefix).
    let mut job = start(
        &LOCAL,
        1,
        &["--launcher", "local", "--max-replans", "0"],
        &["--steps", "3", "--fail-rank", "1"],
    );
    let status = job.wait(Patience::total(Duration::from_secs(300)));
    let stderr = job.stderr();
    // Python's exit code for an uncaught exception, through torchrun.
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.starts_with("[node-b r1]")
            && l.contains("RuntimeError: rank 1 fails on purpose after step 0")),
        "{stderr}"
    );
    let events = job.events();
    let failed = find(&events, "node_failed");
    assert_eq!(failed[0]["host"], "node-b", "{failed:?}");
    assert_eq!(failed[0]["worker_rank"], 1, "{failed:?}");
    assert!(find(&events, "replan").is_empty());
    assert_eq!(find(&events, "exit")[0]["code"], 1);
    assert!(
        common::unwrapped_log(&stderr)
            .contains("node-b (node rank 1): torchrun exited with exit code 1"),
        "{stderr}"
    );
    assert_no_process_left(&job.marker());
}

#[test]
fn any_script_node_killed_relaunches_on_the_survivor() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut job = start(
        &LOCAL,
        1,
        &["--launcher", "local", "--max-replans", "1"],
        &["--steps", "12", "--step-seconds", "0.5"],
    );
    job.wait_for_output(
        "ddp: step 2 world 2",
        Patience::total(Duration::from_secs(240)),
    );
    let procs = node_processes(&job.marker(), "node-b");
    assert!(
        procs.len() >= 2,
        "node-b should run torchrun and its worker: {procs:?}"
    );
    for p in &procs {
        kill(Pid::from_raw(p.pid), Signal::SIGKILL).unwrap();
    }
    let status = job.wait(Patience::total(Duration::from_secs(300)));
    let (stdout, stderr) = (job.stdout(), job.stderr());
    assert_eq!(status.code(), Some(0), "{stdout}\n{stderr}");
    let events = job.events();
    let failed = find(&events, "node_failed");
    assert_eq!(failed[0]["host"], "node-b", "{failed:?}");
    assert_eq!(failed[0]["reason"], "signal", "{failed:?}");
    let replan = find(&events, "replan");
    assert_eq!(replan.len(), 1, "{events:?}");
    assert_eq!(replan[0]["left_out"], serde_json::json!(["node-b"]));
    assert_eq!(replan[0]["nodes"], serde_json::json!(["node-a"]));
    assert_eq!(replan[0]["from"], Value::Null);
    assert_eq!(replan[0]["to"], Value::Null);
    assert_eq!(replan[0]["world_sizes"], serde_json::json!([2, 1]));
    let launch = find(&events, "launch");
    assert_eq!(launch.len(), 2, "{events:?}");
    assert_eq!(launch[1]["world_size"], 1);
    assert_eq!(launch[1]["nodes"][0]["host"], "node-a");
    // The same script and arguments on the survivor's world, to the end.
    let attempt_2 = job.attempt_logs(2);
    assert_eq!(
        rank_lines(&attempt_2),
        torchrun_ranks(&["node-a"], 1),
        "{attempt_2}"
    );
    assert!(attempt_2.contains("ddp: step 11 world 1"), "{attempt_2}");
    assert!(
        common::unwrapped_log(&stderr).contains(
            "pipette-run: warning: relaunched: 1 node(s) left (left out node-b); world size 2 → 1"
        ),
        "{stderr}"
    );
    assert_eq!(find(&events, "exit")[0]["code"], 0);
    assert_no_process_left(&job.marker());
}

// ---- without launching anything ---------------------------------------------------------

fn pipette_run_in(dir: &Path) -> std::process::Command {
    let mut command = cpu_job_command(env!("CARGO_BIN_EXE_pipette-run"));
    command.current_dir(dir);
    command
}

#[test]
fn any_script_deepspeed_batch_that_cannot_hold_is_refused_before_launch() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ds.json"),
        r#"{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2}}"#,
    )
    .unwrap();
    let out = pipette_run_in(dir.path())
        .args(["--hosts", "node-a,node-b", "--launcher", "local"])
        .args(["--nproc-per-node", "2", "--run-dir", "run"])
        .args(["train.py", "--deepspeed_config", "ds.json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{stderr}");
    assert!(stderr.lines().all(common::is_stamped), "{stderr}");
    let unstamped = common::unstamped_log(&stderr);
    let lines: Vec<&str> = unstamped.lines().collect();
    assert_eq!(
        lines,
        ["pipette-run: error: the DeepSpeed config ds.json cannot hold on the 4 rank(s) found: train_batch_size 16 != train_micro_batch_size_per_gpu 3 × gradient_accumulation_steps 2 × world size 4 (DeepSpeed refuses it; change the config, or run on a world size it divides into)"],
        "{stderr}"
    );
    // Nothing was launched: no run directory, no events.
    assert!(!dir.path().join("run").exists());
}

#[test]
fn any_script_dry_run_shows_nodes_commands_and_planning_off() {
    let dir = tempfile::tempdir().unwrap();
    // DeepSpeed derives the accumulation: 16 // 2 // 4 = 2, and 2 × 2 × 4 = 16 holds.
    std::fs::write(
        dir.path().join("ds.json"),
        r#"{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}"#,
    )
    .unwrap();
    let args = [
        "--hosts",
        "node-a,node-b",
        "--launcher",
        "local",
        "--nproc-per-node",
        "2",
        "--master-port",
        "29411",
        "--rdzv-id",
        "job7",
        "--run-dir",
        "run",
        "--dry-run",
        "train.py",
        "--deepspeed",
        "ds.json",
        "--lr",
        "it's",
    ];
    let out = pipette_run_in(dir.path()).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "Nodes: 2 from --hosts",
        "  world size 4",
        "planning is off: no --model and none of Megatron's model arguments (--num-layers, --hidden-size, --num-attention-heads) after SCRIPT",
        "DeepSpeed config ds.json: train_batch_size 16 = micro-batch 2 per rank × 2 accumulation step(s) × 4 rank(s) (DeepSpeed derives gradient_accumulation_steps = 16 // 2 // 4); ZeRO stage 3",
        "'--nnodes=2' '--nproc-per-node=2' '--node-rank=1' '--rdzv-backend=static' '--rdzv-id=job7' '--master-addr=127.0.0.1' '--master-port=29411' 'train.py' '--deepspeed' 'ds.json' '--lr' 'it'\\''s'",
        "Dry run: rendered; nothing was launched",
    ] {
        assert!(stdout.contains(expected), "{expected:?} not in:\n{stdout}");
    }
    assert!(dir.path().join("run/launch-1-node-b.sh").is_file());
    // A run directory holds one launch: the second dry run writes its own.
    std::fs::remove_dir_all(dir.path().join("run")).unwrap();
    let out = pipette_run_in(dir.path())
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["planning"], "off");
    assert!(report["why"].as_str().unwrap().contains("--num-layers"));
    assert_eq!(
        report["world"]["hosts"],
        serde_json::json!(["node-a", "node-b"])
    );
    assert_eq!(report["nodes"]["world_size"], 4);
    assert_eq!(
        report["deepspeed"]["batch"]["gradient_accumulation_steps"],
        2
    );
    assert_eq!(report["deepspeed"]["config"]["zero_stage"], 3);
    let nodes = report["launch"]["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[1]["first_rank"], 2);
    let argv: Vec<&str> = nodes[0]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(
        argv[argv.len() - 5..],
        ["train.py", "--deepspeed", "ds.json", "--lr", "it's"]
    );
    assert!(dir.path().join("run/world.json").is_file());
}

#[test]
fn any_script_nproc_per_node_cpu_is_counted_on_each_node_as_torchrun_counts() {
    let dir = tempfile::tempdir().unwrap();
    // torchrun's `cpu` is os.cpu_count(): the logical CPUs /proc/cpuinfo lists.
    let cpus = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count() as u64;
    let out = pipette_run_in(dir.path())
        .args(["--hosts", "node-a,node-b", "--launcher", "local"])
        .args(["--nproc-per-node", "cpu", "--run-dir", "run"])
        .args(["--json", "--dry-run", "train.py"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["world"]["nproc_per_node"], cpus, "{report}");
    assert_eq!(report["nodes"]["world_size"], 2 * cpus, "{report}");
    let argv = report["launch"]["nodes"][1]["argv"].as_array().unwrap();
    assert!(
        argv.contains(&Value::from(format!("--nproc-per-node={cpus}"))),
        "{argv:?}"
    );
}
