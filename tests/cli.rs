//! The `pipette-run` command line, driven through the real binary: torchrun parity,
//! node discovery from each source, and every class of bad input with its exit code.

use std::path::PathBuf;

use assert_cmd::Command;
use predicates::prelude::*;
use serde_json::Value;

mod common;

use common::TINY_MODEL;

/// `pipette-run` with an empty environment: no Slurm, PBS or PET_ variables leak in
/// from the machine running the tests.
fn pipette_run() -> Command {
    let mut cmd = Command::cargo_bin("pipette-run").expect("binary built");
    cmd.env_clear();
    cmd
}

/// Runs a dry run with `--json` and returns the report.
fn dry_run_json(cmd: &mut Command) -> Value {
    common::json_report(&cmd.output().expect("pipette-run runs"))
}

fn hosts(report: &Value) -> Vec<String> {
    common::report_hosts(report)
}

fn workers(report: &Value) -> Vec<u64> {
    report["nodes"]["hosts"]
        .as_array()
        .expect("hosts array")
        .iter()
        .map(|h| h["workers"].as_u64().expect("worker count"))
        .collect()
}

#[test]
fn script_arguments_are_passed_through_untouched() {
    let script_args = [
        "--nnodes",
        "7",
        "--hosts",
        "x,y",
        "--dry-run",
        "-m",
        "--",
        "--nproc_per_node=9",
        "a b;$(c)",
    ];
    let report = dry_run_json(
        pipette_run()
            .args(["--dry-run", "--json", "--model", "gpt3-1.3b", "train.py"])
            .args(script_args),
    );
    assert_eq!(report["script"]["program"], "train.py");
    assert_eq!(report["script"]["launch"], "python");
    let args: Vec<&str> = report["script"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args, script_args);
    // The script's `--hosts x,y` did not reach discovery.
    assert_eq!(report["nodes"]["source"]["kind"], "local");
    assert_eq!(hosts(&report).len(), 1);
}

/// torchrun's rule, kept: after SCRIPT everything is the script's, pipette-run's own
/// options too; each of them earns a warning before anything runs (a `--dry-run` there
/// would otherwise launch the job without a word).
#[test]
fn pipette_run_options_after_the_script_go_to_it_with_a_warning() {
    let out = pipette_run()
        .args(["--dry-run", "--json", "--model", "gpt3-1.3b", "train.py"])
        .args([
            "--dry-run",
            "--nnodes=2",
            "--seed",
            "7",
            "--dry-run",
            "--",
            "--hosts",
        ])
        .output()
        .unwrap();
    let report = common::json_report(&out);
    assert_eq!(report["script"]["args"][0], "--dry-run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warned = |option: &str| {
        stderr
            .lines()
            .filter(|l| {
                l.contains("warning")
                    && l.contains(&format!("{option} comes after SCRIPT (train.py)"))
            })
            .count()
    };
    assert_eq!(warned("--dry-run"), 1, "{stderr}");
    assert_eq!(warned("--nnodes"), 1, "{stderr}");
    // --seed is Megatron's own option too; after `--` nothing is an option.
    assert_eq!(warned("--seed") + warned("--hosts"), 0, "{stderr}");
    assert!(stderr.contains("write it before train.py"), "{stderr}");
}

/// A Megatron-looking option pipette reads nothing from, one edit from one it reads, is
/// named with the option meant before anything runs; the plan goes on without it.
#[test]
fn a_misspelt_megatron_option_is_named_with_the_one_meant() {
    let out = pipette_run()
        .args(["--dry-run", "--json", "--model", "gpt3-1.3b", "train.py"])
        .args(["--global-batch-sise", "256", "--lr", "1e-4"])
        .output()
        .unwrap();
    let report = common::json_report(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("warning: --global-batch-sise")
                && l.contains("did you mean --global-batch-size?")),
        "{stderr}"
    );
    // The preset's batch, not the 256 the user meant.
    let batch = &report["training"]["global_batch_size"];
    assert!(batch.is_u64() && batch != 256, "{batch}");
    // A script pipette-run does not plan gets no Megatron hints.
    let out = pipette_run()
        .args([
            "--dry-run",
            "--json",
            "train.py",
            "--global-batch-sise",
            "256",
        ])
        .output()
        .unwrap();
    common::json_report(&out);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("did you mean"));
}

/// Under `cargo run` (CARGO set), cargo's LD_LIBRARY_PATH entries (the target directory,
/// the toolchain's libraries) never reach the nodes; what is forwarded from here is shown
/// by name in the dry run (its values are in the launch scripts), and no line of the dry
/// run is wider than 100 columns.
#[test]
fn the_dry_run_names_forwarded_variables_and_forwards_nothing_of_cargos() {
    let dir = tempfile::tempdir().unwrap();
    let toolchain = "/root/.rustup/toolchains/stable-x86_64-unknown-linux-gnu";
    let long_path = format!(
        "/opt/{}/bin:/usr/bin:/bin",
        "a-long-venv-directory".repeat(6)
    );
    let out = pipette_run()
        .env("CARGO", "/root/.cargo/bin/cargo")
        .env("CARGO_MANIFEST_DIR", "/src/pipette")
        .env("HOME", "/root")
        .env(
            "LD_LIBRARY_PATH",
            format!("/src/pipette/target/debug/deps:{toolchain}/lib:/opt/cuda/lib64"),
        )
        .env("PATH", &long_path)
        .env("NCCL_DEBUG", "INFO")
        .arg("--cluster")
        .arg(common::example_cluster_path("a100-2x8.json"))
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .args([
            "--dry-run",
            "--model",
            "gpt3-1.3b",
            "--nproc-per-node",
            "8",
            "train.py",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = String::from_utf8(out.stdout).unwrap();
    let wide: Vec<&str> = shown.lines().filter(|l| l.chars().count() > 100).collect();
    assert!(wide.is_empty(), "{wide:#?}");
    assert!(
        shown.contains(r#"PATH="$PATH""#) && !shown.contains(&long_path),
        "{shown}"
    );
    assert!(shown.contains("shown by name"), "{shown}");
    let script = std::fs::read_to_string(dir.path().join("run/launch-0-a100-n00.sh")).unwrap();
    assert!(script.contains(&long_path), "{script}");
    assert!(
        script.contains("LD_LIBRARY_PATH='/opt/cuda/lib64'"),
        "{script}"
    );
    for text in [&shown, &script] {
        assert!(!text.contains("target/debug") && !text.contains(toolchain));
    }
}

#[test]
fn pet_environment_variables_set_torchrun_options() {
    let report = dry_run_json(
        pipette_run()
            .env("PET_NPROC_PER_NODE", "4")
            .env("PET_NNODES", "2")
            .env("PET_MAX_RESTARTS", "3")
            .env("PET_MODULE", "1")
            .env("PET_RDZV_CONF", "timeout=30")
            .args(["--dry-run", "--json", "--hosts", "n1,n2", "pkg.train"])
            .args(TINY_MODEL),
    );
    assert_eq!(workers(&report), vec![4, 4]);
    assert_eq!(report["nodes"]["world_size"], 8);
    assert_eq!(report["script"]["launch"], "module");
    let passthrough = report["torchrun_passthrough"].as_array().unwrap();
    assert!(passthrough.contains(&Value::from("--max-restarts=3")));
    assert!(passthrough.contains(&Value::from("--module")));
}

#[test]
fn command_line_beats_pet_variables() {
    let report = dry_run_json(
        pipette_run()
            .env("PET_NPROC_PER_NODE", "4")
            .args(["--nproc-per-node", "2", "--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    assert_eq!(workers(&report), vec![2]);
}

#[test]
fn underscore_spellings_are_accepted() {
    let report = dry_run_json(
        pipette_run()
            .args([
                "--nproc_per_node=2",
                "--max_restarts",
                "1",
                "--master_port",
                "29600",
                "--rdzv_backend",
                "static",
                "--rdzv_id=job7",
                "--monitor_interval",
                "0.5",
                "--start_method",
                "fork",
                "--no_python",
                "--log_dir",
                "/tmp/logs",
                "--local_ranks_filter",
                "0",
                "--node_rank",
                "0",
                "--master_addr",
                "127.0.0.1",
                "--local_addr",
                "127.0.0.1",
                "--signals_to_handle",
                "SIGTERM,SIGUSR1",
                "--dry-run",
                "--json",
                "./train.sh",
            ])
            .args(TINY_MODEL),
    );
    assert_eq!(workers(&report), vec![2]);
    assert_eq!(report["script"]["launch"], "no-python");
    let passthrough: Vec<&str> = report["torchrun_passthrough"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for expected in [
        "--max-restarts=1",
        "--monitor-interval=0.5",
        "--start-method=fork",
        "--log-dir=/tmp/logs",
        "--local-ranks-filter=0",
        "--signals-to-handle=SIGTERM,SIGUSR1",
        "--no-python",
    ] {
        assert!(
            passthrough.contains(&expected),
            "{expected} in {passthrough:?}"
        );
    }
}

#[test]
fn every_torchrun_option_is_accepted() {
    // Each option of current torchrun, in both spellings where it has two.
    let options: &[&[&str]] = &[
        &["--nnodes", "1"],
        &["--nnodes", "1:4"],
        &["--nproc-per-node", "gpu"],
        &["--nproc_per_node", "auto"],
        &["--rdzv-backend", "c10d"],
        &["--rdzv-endpoint", "host:29400"],
        &["--rdzv_endpoint", "host:29400"],
        &["--rdzv-id", "42"],
        &["--rdzv-conf", "timeout=60"],
        &["--rdzv_conf", "timeout=60"],
        &["--standalone"],
        &["--max-restarts", "2"],
        &["--monitor-interval", "1"],
        &["--start-method", "forkserver"],
        &["--event-log-handler", "console"],
        &["--event_log_handler", "console"],
        &["--role", "trainer"],
        &["-m"],
        &["--module"],
        &["--no-python"],
        &["--run-path"],
        &["--run_path"],
        &["--log-dir", "logs"],
        &["-r", "3"],
        &["--redirects", "0:1,1:2"],
        &["-t", "3"],
        &["--tee", "1"],
        &["--local-ranks-filter", "0,1"],
        &["--node-rank", "0"],
        &["--master-addr", "10.0.0.1"],
        &["--master-port", "29501"],
        &["--local-addr", "10.0.0.2"],
        &["--logs-specs", "custom"],
        &["--logs_specs", "custom"],
        &["--numa-binding", "node"],
        &["--numa_binding", "socket"],
        &["--signals-to-handle", "SIGTERM"],
        &["--shutdown-timeout", "30"],
        &["--shutdown_timeout", "30"],
        &["--virtual-local-rank"],
        &["--virtual_local_rank"],
        &["--duplicate-stdout-filters", "loss"],
        &["--duplicate_stderr_filters", "error"],
    ];
    for option in options {
        pipette_run()
            .args(*option)
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL)
            .assert()
            .success();
    }
}

#[test]
fn malformed_torchrun_values_exit_2_like_torchrun() {
    for bad in [
        &["--nnodes", "0"][..],
        &["--nnodes", "4:2"],
        &["--nnodes", "a:b"],
        &["--nproc-per-node", "many"],
        &["--start-method", "thread"],
        &["--redirects", "7"],
        &["--master-port", "70000"],
        &["--local-ranks-filter", "0,x"],
        &["--signals-to-handle", "SIGNOPE"],
    ] {
        pipette_run()
            .args(bad)
            .args(["--dry-run", "train.py"])
            .args(TINY_MODEL)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(bad[0]));
    }
}

#[test]
fn unknown_option_before_the_script_is_an_error_not_the_script() {
    pipette_run()
        .args(["--no-such-option", "train.py"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--no-such-option"));
}

#[test]
fn nnodes_must_match_the_nodes_found() {
    pipette_run()
        .args(["--nnodes", "3", "--hosts", "a,b", "--dry-run", "train.py"])
        .args(TINY_MODEL)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "--nnodes 3 but 2 nodes were found (a,b)",
        ));
    pipette_run()
        .args(["--nnodes", "1:2", "--hosts", "a,b", "--dry-run", "train.py"])
        .args(TINY_MODEL)
        .assert()
        .success();
}

#[test]
fn slurm_allocation_is_discovered() {
    let report = dry_run_json(
        pipette_run()
            .env("SLURM_JOB_NODELIST", "gpu[009-010,002],gpu-b[1-2]")
            .env("SLURM_NNODES", "5")
            .env("SLURM_GPUS_ON_NODE", "8")
            .env("SLURM_JOB_ID", "4242")
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    assert_eq!(
        hosts(&report),
        ["gpu009", "gpu010", "gpu002", "gpu-b1", "gpu-b2"]
    );
    assert_eq!(workers(&report), vec![8; 5]);
    assert_eq!(report["nodes"]["job_id"], "4242");
    assert_eq!(report["nodes"]["source"]["kind"], "slurm");
    assert_eq!(report["nodes"]["world_size"], 40);
}

#[test]
fn slurm_job_gpus_restrict_the_devices() {
    let report = dry_run_json(
        pipette_run()
            .env("SLURM_NODELIST", "node[1-2]")
            .env("SLURM_JOB_GPUS", "0,1,4,5")
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    assert_eq!(hosts(&report), ["node1", "node2"]);
    assert_eq!(workers(&report), vec![4, 4]);
    assert_eq!(
        report["nodes"]["hosts"][0]["devices"],
        serde_json::json!([0, 1, 4, 5])
    );
}

#[test]
fn pbs_nodefile_is_deduplicated_in_first_seen_order() {
    let dir = tempfile::tempdir().unwrap();
    let nodefile = dir.path().join("nodes");
    std::fs::write(&nodefile, "c2\nc2\nc1\nc2\nc1\nc3\n").unwrap();
    let report = dry_run_json(
        pipette_run()
            .env("PBS_NODEFILE", &nodefile)
            .env("PBS_JOBID", "99.pbs")
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    assert_eq!(hosts(&report), ["c2", "c1", "c3"]);
    assert_eq!(workers(&report), vec![3, 2, 1]);
    assert_eq!(report["nodes"]["source"]["kind"], "pbs");
}

#[test]
fn deepspeed_hostfile_with_include_filter() {
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("hostfile");
    std::fs::write(
        &hostfile,
        "# two DGX boxes and a spare\nworker-0 slots=8\nworker-1 slots=8  # rack B\n\nworker-2 slots=4\n",
    )
    .unwrap();
    let report = dry_run_json(
        pipette_run()
            .arg("--hostfile")
            .arg(&hostfile)
            .args(["--include", "worker-0:0,1,2,3@worker-2"])
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    assert_eq!(hosts(&report), ["worker-0", "worker-2"]);
    assert_eq!(workers(&report), vec![4, 4]);
    assert_eq!(report["nodes"]["source"]["kind"], "hostfile");
}

#[test]
fn plain_hostfile_with_exclude_filter() {
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("hosts.txt");
    std::fs::write(&hostfile, "a\nb\nc\n").unwrap();
    let report = dry_run_json(
        pipette_run()
            .arg("--hostfile")
            .arg(&hostfile)
            .args(["--exclude", "b", "--nproc-per-node", "2"])
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    assert_eq!(hosts(&report), ["a", "c"]);
}

#[test]
fn hosts_option_and_local_fallback() {
    let report = dry_run_json(
        pipette_run()
            .args(["--hosts", "n[1-3]", "--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    assert_eq!(hosts(&report), ["n1", "n2", "n3"]);
    assert_eq!(report["nodes"]["source"]["kind"], "hosts");

    let report = dry_run_json(
        pipette_run()
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    assert_eq!(report["nodes"]["source"]["kind"], "local");
    assert_eq!(workers(&report), vec![1]);
}

#[test]
fn cluster_file_names_the_nodes_without_an_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let report = dry_run_json(
        pipette_run()
            .arg("--cluster")
            .arg(common::example_cluster_path("a100-2x8.json"))
            .arg("--run-dir")
            .arg(dir.path().join("run"))
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    assert_eq!(report["nodes"]["source"]["kind"], "cluster_file");
    assert_eq!(workers(&report), vec![8, 8]);
    assert_eq!(report["nodes"]["world_size"], 16);
    assert_eq!(report["cluster_profile"]["gpus"], 16);
}

#[test]
fn slurm_takes_precedence_over_hostfile_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("hostfile");
    std::fs::write(&hostfile, "other slots=8\n").unwrap();
    let report = dry_run_json(
        pipette_run()
            .env("SLURM_JOB_NODELIST", "gpu1")
            .arg("--hostfile")
            .arg(&hostfile)
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    assert_eq!(hosts(&report), ["gpu1"]);
    let warnings = report["nodes"]["warnings"].to_string();
    assert!(warnings.contains("hostfile"), "{warnings}");
}

#[test]
fn presets_and_megatron_arguments_give_the_model() {
    let report = dry_run_json(pipette_run().args([
        "--dry-run",
        "--json",
        "--model",
        "llama2-7b",
        "pretrain_gpt.py",
        "--global-batch-size",
        "512",
        "--micro-batch-size",
        "1",
        "--bf16",
        "--use-distributed-optimizer",
        "--tensor-model-parallel-size",
        "2",
    ]));
    assert_eq!(report["model"]["preset"], "llama2-7b");
    assert_eq!(report["model"]["num_layers"], 32);
    assert_eq!(report["model"]["parameters"], 6_738_415_616_u64);
    assert_eq!(report["training"]["global_batch_size"], 512);
    assert_eq!(report["training"]["precision"], "bf16");
    assert_eq!(report["training"]["distributed_optimizer"], true);
    // Written but not pinned: a hint, not a constraint.
    assert_eq!(report["training"]["tensor_parallel"], 2);
    assert_eq!(report["constraints"]["tensor_parallel"], Value::Null);
    assert!(report["plan"].is_null());
}

#[test]
fn pinned_settings_become_constraints() {
    let report = dry_run_json(
        pipette_run()
            .args(["--pin", "tp,dp=2", "--dry-run", "--json", "train.py"])
            .args(TINY_MODEL)
            .args(["--tensor-model-parallel-size", "2"]),
    );
    assert_eq!(report["constraints"]["tensor_parallel"], 2);
    assert_eq!(report["constraints"]["data_parallel"], 2);
    assert_eq!(report["constraints"]["pipeline_parallel"], Value::Null);
}

/// A pinned interleaved schedule that no configuration allows is refused with the
/// schedule's own rules: before, the message listed only tp, pp and the batch, none of
/// which the user had got wrong.
#[test]
fn an_impossible_pinned_interleaving_names_its_rules() {
    pipette_run()
        .arg("--cluster")
        .arg(common::example_cluster_path("a100-2x8.json"))
        .args(["--pin", "vpp=2", "--dry-run", "train.py"])
        .args(TINY_MODEL)
        .assert()
        .code(65)
        .stderr(predicate::str::contains(
            "with the pinned settings (tp must divide the GPUs per node",
        ))
        .stderr(predicate::str::contains(
            "the pinned vpp=2 needs pp above 2 with a multiple of 2 layers per stage, and \
             the micro-batches per step a multiple of pp)",
        ));
}

/// The dry run shows the master address the launch would use: the rank-0 host; 127.0.0.1
/// when every "node" is this machine (`--launcher local`); the user's, even 127.0.0.1.
#[test]
fn dry_run_shows_the_master_address_the_launch_uses() {
    let master_addr = |extra: &[&str], env: Option<(&str, &str)>| {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = pipette_run();
        cmd.arg("--cluster")
            .arg(common::example_cluster_path("a100-2x8.json"))
            .arg("--run-dir")
            .arg(dir.path().join("run"))
            .args(extra)
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let report = dry_run_json(&mut cmd);
        let rank0 = report["plan"]["mapping"]["node_order"][0].clone();
        (report["launch"]["master_addr"].clone(), rank0)
    };
    let (addr, rank0) = master_addr(&[], None);
    assert!(addr.as_str().unwrap().starts_with("a100-n0"), "{addr}");
    assert_eq!(addr, rank0);
    assert_eq!(master_addr(&["--launcher", "local"], None).0, "127.0.0.1");
    assert_eq!(
        master_addr(&["--master-addr", "127.0.0.1"], None).0,
        "127.0.0.1"
    );
    assert_eq!(
        master_addr(&[], Some(("PET_MASTER_ADDR", "10.1.2.3"))).0,
        "10.1.2.3"
    );
}

#[test]
fn human_dry_run_without_a_profile_says_how_to_get_one() {
    pipette_run()
        .args(["--dry-run", "--hosts", "a,b", "--nproc-per-node", "8"])
        .args([
            "--model",
            "gpt3-13b",
            "pretrain_gpt.py",
            "--global-batch-size",
            "64",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("Nodes: 2 from --hosts"))
        .stdout(predicate::str::contains("world size 16"))
        .stdout(predicate::str::contains("gpt3-13b"))
        .stdout(predicate::str::contains("No cluster profile to plan with"))
        .stdout(predicate::str::contains("pipette profile"));
}

#[test]
fn without_a_cluster_file_launching_profiles_the_nodes_first() {
    // A torchrun that fails at once: the profile's probe cannot run, and nothing is
    // launched. (A missing one is refused before profiling: tests/defects.rs.)
    pipette_run()
        .args(["--torchrun", "/bin/false"])
        .args(["train.py"])
        .args(TINY_MODEL)
        .assert()
        .code(68)
        .stderr(predicate::str::contains("no --cluster given: profiling"));
}

// ---- bad input: one class each, with its exit code ------------------------------------

fn assert_fails(cmd: &mut Command, code: i32, message: &str) {
    let out = cmd.output().expect("pipette-run runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert!(stderr.contains(message), "{message:?} not in: {stderr}");
    assert!(
        stderr.lines().filter(|l| !l.trim().is_empty()).count() <= 2,
        "a bad-input error is one line: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn malformed_slurm_hostlist_exits_66() {
    assert_fails(
        pipette_run()
            .env("SLURM_JOB_NODELIST", "gpu[001-004")
            .args(["--dry-run", "train.py"])
            .args(TINY_MODEL),
        66,
        "SLURM_JOB_NODELIST",
    );
}

#[test]
fn malformed_hostfile_names_the_line_and_exits_66() {
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("hostfile");
    std::fs::write(&hostfile, "a slots=8\nb slots=eight\n").unwrap();
    assert_fails(
        pipette_run()
            .arg("--hostfile")
            .arg(&hostfile)
            .args(["--dry-run", "train.py"])
            .args(TINY_MODEL),
        66,
        "line 2",
    );
}

#[test]
fn duplicate_hosts_exit_66() {
    assert_fails(
        pipette_run()
            .args(["--hosts", "a,b,a", "--dry-run", "train.py"])
            .args(TINY_MODEL),
        66,
        "\"a\"",
    );
}

#[test]
fn include_naming_an_unknown_host_exits_66() {
    assert_fails(
        pipette_run()
            .args(["--hosts", "a,b", "--include", "c", "--dry-run", "train.py"])
            .args(TINY_MODEL),
        66,
        "\"c\"",
    );
}

#[test]
fn missing_hostfile_exits_66() {
    assert_fails(
        pipette_run()
            .args([
                "--hostfile",
                "/nonexistent/hostfile",
                "--dry-run",
                "train.py",
            ])
            .args(TINY_MODEL),
        66,
        "/nonexistent/hostfile",
    );
}

fn write_cluster(dir: &tempfile::TempDir, json: &str) -> PathBuf {
    let path = dir.path().join("cluster.json");
    std::fs::write(&path, json).unwrap();
    path
}

#[test]
fn cluster_matrix_of_the_wrong_size_exits_67() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_cluster(
        &dir,
        r#"{"gpus": ["a", "b", "c"], "bandwidth": [[0, 10], [10, 0]]}"#,
    );
    assert_fails(
        pipette_run()
            .arg("--cluster")
            .arg(&path)
            .args(["--dry-run", "train.py"])
            .args(TINY_MODEL),
        67,
        "cluster.json",
    );
}

#[test]
fn negative_bandwidth_exits_67() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_cluster(
        &dir,
        r#"{"gpus": ["a", "b"], "bandwidth": [["0", "-5"], ["10", "0"]]}"#,
    );
    assert_fails(
        pipette_run()
            .arg("--cluster")
            .arg(&path)
            .args(["--dry-run", "train.py"])
            .args(TINY_MODEL),
        67,
        "bandwidth",
    );
}

#[test]
fn cluster_file_missing_an_allocated_host_exits_67() {
    assert_fails(
        pipette_run()
            .args(["--hosts", "nowhere1"])
            .arg("--cluster")
            .arg(common::example_cluster_path("a100-2x8.json"))
            .args(["--dry-run", "train.py"])
            .args(TINY_MODEL),
        67,
        "nowhere1",
    );
}

#[test]
fn heads_not_divisible_by_query_groups_exits_65() {
    assert_fails(
        pipette_run()
            .args(["--dry-run", "train.py"])
            .args(TINY_MODEL)
            .args(["--group-query-attention", "--num-query-groups", "3"]),
        65,
        "--num-query-groups",
    );
}

#[test]
fn sequence_longer_than_positions_exits_65() {
    assert_fails(
        pipette_run()
            .args(["--dry-run", "--model", "gpt3-1.3b", "train.py"])
            .args(["--seq-length", "4096", "--max-position-embeddings", "2048"]),
        65,
        "--seq-length",
    );
}

#[test]
fn missing_model_arguments_suggest_a_preset_and_exit_65() {
    // One of Megatron's model arguments makes the script Megatron's: the rest must follow.
    // (Without any, planning is off and the script runs as torchrun would: see
    // tests/any_script.rs.)
    assert_fails(
        pipette_run().args(["--dry-run", "train.py", "--num-layers", "4", "--lr", "1e-4"]),
        65,
        "--model",
    );
}

#[test]
fn unknown_preset_exits_65() {
    assert_fails(
        pipette_run().args(["--dry-run", "--model", "gpt5", "train.py"]),
        65,
        "llama2-7b",
    );
}

#[test]
fn help_teaches_torchrun_options_and_exit_codes() {
    pipette_run()
        .arg("--help")
        .assert()
        .success()
        .stdout(predicate::str::contains("--nproc-per-node"))
        .stdout(predicate::str::contains("--dry-run"))
        .stdout(predicate::str::contains("Exit codes:"))
        .stdout(predicate::str::contains("66"));
}

#[test]
fn an_old_torchrun_gets_underscore_spellings() {
    let dir = tempfile::tempdir().unwrap();
    // A stand-in for torchrun 1.x, whose --help lists only underscore spellings.
    let fake = dir.path().join("torchrun");
    common::write_executable(&fake, "#!/bin/sh\necho 'usage: torchrun [--nnodes NNODES] [--nproc_per_node NPROC_PER_NODE] [--node_rank NODE_RANK]'\n");
    let report = dry_run_json(
        pipette_run()
            .env("PATH", format!("{}:/usr/bin:/bin", dir.path().display()))
            .arg("--cluster")
            .arg(common::example_cluster_path("a100-2x8.json"))
            .arg("--run-dir")
            .arg(dir.path().join("run"))
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    let argv = report["launch"]["nodes"][0]["argv"].to_string();
    assert!(argv.contains("--nproc_per_node="), "{argv}");
    assert!(!argv.contains("--nproc-per-node="), "{argv}");
}
