//! `pipette doctor` for real (issue 15 item 7): on this machine (the local transport), over
//! a throwaway sshd on loopback and on a throwaway Slurm, each time with a node deliberately
//! broken — no torchrun on its PATH, not reachable, or hung — reported as such, with the
//! documented exit code (68 unreachable, 71 no torchrun).
//!
//! Needs the venv of `scripts/setup-megatron-venv` (or `PIPETTE_MEGATRON_PYTHON`), OpenSSH's
//! server, Debian's Slurm and munge; fails, never skips, without them.

mod common;

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{assert_no_process_left, cpu_job_command, venv_python, Slurm, Sshd};
use serde_json::Value;

/// A `PATH` with the venv's bin directory first, as a user who activated it has.
fn venv_path() -> String {
    let bin = venv_bin();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn venv_bin() -> PathBuf {
    venv_python()
        .parent()
        .expect("the venv's bin directory")
        .to_path_buf()
}

/// Runs `pipette doctor ARGS` with `path` as its PATH.
fn doctor(args: &[&str], path: &str) -> Output {
    doctor_command(args, path).output().unwrap()
}

/// `pipette doctor ARGS` with `path` as its PATH, to run.
fn doctor_command(args: &[&str], path: &str) -> std::process::Command {
    // This machine's free disk is not the test's to judge (others fill it).
    let mut command = cpu_job_command(env!("CARGO_BIN_EXE_pipette"));
    command
        .args(["doctor", "--min-free", "0"])
        .args(args)
        .env("PATH", path)
        .env_remove("PIPETTE_TORCHRUN")
        .env_remove("PIPETTE_SSH_CONFIG")
        .stdin(Stdio::null());
    command
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n{}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The table row (the line after a host list on a line of its own, or the line itself) of
/// `host`.
fn row<'a>(stdout: &'a str, host: &str) -> &'a str {
    let lines: Vec<&str> = stdout.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.split_whitespace().next() == Some(host))
        .unwrap_or_else(|| panic!("no row for {host}:\n{stdout}"));
    match lines[at].trim() == host {
        true => lines[at + 1],
        false => lines[at],
    }
}

#[test]
fn local_node_is_ready_and_without_torchrun_on_its_path_is_not() {
    let out = doctor(&["--hosts", "localhost"], &venv_path());
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let local = row(&stdout, "localhost");
    assert!(local.contains(" ok "), "{local}");
    assert!(local.contains("0.19.2"), "megatron-core's version: {local}");
    assert!(local.ends_with("none (CPU node)"), "{local}");
    assert!(
        stdout.ends_with("1 node checked over local: no problem, no warning\n"),
        "{stdout}"
    );
    for line in stdout.lines().take_while(|l| !l.is_empty()) {
        assert!(line.chars().count() <= 80, "{line:?}");
    }
    let venv = venv_bin().display().to_string();
    assert!(
        stdout.contains(&format!("\npython on localhost: {venv}/")),
        "which python the versions are of: {stdout}"
    );

    // The same node, its environment without the venv: reported, exit 71.
    let out = doctor(
        &["--hosts", "localhost", "--env", "PATH=/usr/bin:/bin"],
        &venv_path(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(71), "{}", text(&out));
    assert!(
        row(&stdout, "localhost").contains("no torchrun"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "problem: localhost: torchrun not found: \"torchrun\" is not on its PATH (/usr/bin:/bin)\n  fix: activate the environment"
        ),
        "{stdout}"
    );
    // The venv found all the same (where scripts/setup-megatron-venv puts it, or beside
    // PIPETTE_MEGATRON_PYTHON): its python checked, and named with the fix.
    assert!(
        stdout.contains(&format!("or give --torchrun {venv}/torchrun\n")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("\npython on localhost: {venv}/")),
        "{stdout}"
    );
    assert!(
        row(&stdout, "localhost").contains("0.19.2"),
        "the venv's megatron-core: {stdout}"
    );
}

/// A PATH with nothing on it (no dirname, df, date): the probe still ends, and says so.
#[test]
fn an_empty_path_is_reported_not_hung_on() {
    // No venv where pipette-run looks for one either: nothing at all to run there (a
    // venv's python importing PyTorch may take longer than the short time limit here).
    let out = doctor_command(
        &[
            "--hosts",
            "localhost",
            "--env",
            "PATH=/nonexistent",
            "--run-dir",
            "/nonexistent/a/b/",
            "--timeout",
            "20s",
        ],
        &venv_path(),
    )
    .env_remove("PIPETTE_MEGATRON_PYTHON")
    .env("PIPETTE_MEGATRON_VENV", "/nonexistent-venv")
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(71), "{}", text(&out));
    assert!(
        stdout.contains("torchrun not found: \"torchrun\" is not on its PATH (/nonexistent)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("warning: localhost: free space where the run directory goes is unknown"),
        "{stdout}"
    );
}

/// Without an allocation, a cluster file's nodes are the nodes, as for pipette-run.
#[test]
fn a_cluster_file_s_nodes_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.json");
    std::fs::write(&cluster, common::cpu_profile(&["n1", "n2", "n3"], 1)).unwrap();
    let cluster = cluster.display().to_string();
    let out = doctor(
        &[
            "--cluster",
            &cluster,
            "--launcher",
            "local",
            "--exclude",
            "n2",
        ],
        &venv_path(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(row(&stdout, "n[1,3]").contains(" ok "), "{stdout}");
    assert!(
        stdout.contains("2 nodes checked over local: no problem"),
        "{stdout}"
    );
}

#[test]
fn json_names_its_schema_and_carries_every_fact() {
    let out = doctor(
        &[
            "--hosts",
            "localhost",
            "--json",
            "--env",
            "NCCL_DEBUG=INFO",
            "--run-dir",
            "/nonexistent/runs",
        ],
        &venv_path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    assert_eq!(report["schema"], "pipette-doctor");
    assert_eq!(report["version"], 1);
    assert_eq!(report["transport"], "local");
    assert_eq!(report["exit_code"], 0);
    let node = &report["nodes"][0];
    assert_eq!(node["host"], "localhost");
    assert_eq!(node["reach"]["state"], "reached");
    assert_eq!(
        node["torchrun"]["path"],
        venv_bin().join("torchrun").display().to_string()
    );
    assert_eq!(node["python"]["megatron_core"], "0.19.2");
    assert!(node["python"]["torch"].is_string(), "{node}");
    assert_eq!(node["gpus"]["state"], "no_nvidia_smi");
    assert_eq!(
        node["nccl"]["NCCL_DEBUG"], "INFO",
        "--env reaches the probe"
    );
    // The run directory does not exist: its nearest existing directory is measured.
    assert_eq!(node["disk"]["dir"], "/");
    assert!(node["disk"]["free_bytes"].as_u64().unwrap() > 0);
    let skew = node["clock"]["seconds"].as_f64().unwrap();
    assert!(skew.abs() < 1.0, "this machine against itself: {skew}");
}

/// A torchrun in a fresh directory whose python never answers; returns the directory and
/// the torchrun.
fn hanging_torchrun() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("pipette-doctor-hang-")
        .tempdir()
        .unwrap();
    let python = dir.path().join("python");
    let torchrun = dir.path().join("torchrun");
    common::write_executable(&python, "#!/bin/sh\nwhile :; do sleep 1; done\n");
    common::write_executable(&torchrun, &format!("#!{}\n", python.display()));
    (dir, torchrun)
}

#[test]
fn a_hung_node_is_reported_without_waiting_for_it() {
    let (dir, torchrun) = hanging_torchrun();
    let path = venv_path();
    let start = Instant::now();
    let out = doctor(
        &[
            "--hosts",
            "localhost",
            "--timeout",
            "3s",
            "--torchrun",
            &torchrun.display().to_string(),
        ],
        &path,
    );
    let took = start.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(68), "{}", text(&out));
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(row(&stdout, "localhost").contains("no answer"), "{stdout}");
    assert!(
        stdout.contains(
            "problem: localhost: did not answer within 3 s (hung, or very slow)\n  fix: check the node"
        ),
        "{stdout}"
    );
    assert_no_process_left(&dir.path().display().to_string());
}

/// A stop signal ends the probes in order: exit 130, nothing left running.
#[test]
fn ctrl_c_stops_every_probe() {
    let (dir, torchrun) = hanging_torchrun();
    let marker = dir.path().display().to_string();
    let child = cpu_job_command(env!("CARGO_BIN_EXE_pipette"))
        .args([
            "doctor",
            "--hosts",
            "localhost,127.0.0.1",
            "--timeout",
            "60s",
        ])
        .arg("--torchrun")
        .arg(&torchrun)
        .env("PATH", venv_path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let both_hung = common::eventually(Duration::from_secs(20), || {
        common::with_marker(&marker).len() >= 2
    });
    assert!(both_hung, "the probes never reached the python");
    let sent = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "{:?}",
        sent.elapsed()
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stopped by SIGINT"),
        "{}",
        text(&out)
    );
    assert_no_process_left(&marker);
}

/// A client key whose logins run a forced command that takes the venv's bin directory out
/// of every command: the node it reaches has no torchrun on its PATH. Returns the key.
fn key_without_the_venv(sshd: &Sshd) -> PathBuf {
    let d = sshd.dir.path();
    let key = d.join("no_venv_key");
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(status.success());
    let forced = d.join("without-venv.sh");
    common::write_executable(
        &forced,
        &format!(
            "#!/bin/sh\nexec sh -c \"$(printf '%s' \"$SSH_ORIGINAL_COMMAND\" | sed 's|{}|/nonexistent-venv/bin|g')\"\n",
            venv_bin().display()
        ),
    );
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let mut keys = std::fs::read_to_string(d.join("authorized_keys")).unwrap();
    keys.push_str(&format!("command=\"{}\" {public}", forced.display()));
    std::fs::write(d.join("authorized_keys"), keys).unwrap();
    key
}

#[test]
fn over_ssh_a_node_without_torchrun_and_one_down_are_reported() {
    let sshd = Sshd::start();
    let key = key_without_the_venv(&sshd);
    let d = sshd.dir.path();
    // `good` is the sshd; `novenv` the same sshd through the key whose logins lack the
    // venv; `down` a port nobody listens on.
    let mut config = std::fs::read_to_string(sshd.client_config(&["good"])).unwrap();
    config.push_str(&format!(
        "Host novenv\n  HostName 127.0.0.2\n  Port {}\n  IdentityFile {}\n  IdentitiesOnly yes\n  \
         UserKnownHostsFile {}\n  StrictHostKeyChecking no\n  LogLevel ERROR\n\
         Host down\n  HostName 127.0.0.1\n  Port 9\n  LogLevel ERROR\n",
        sshd.port,
        key.display(),
        d.join("known_hosts").display()
    ));
    let config_file = d.join("doctor_ssh_config");
    std::fs::write(&config_file, config).unwrap();
    let config_file = config_file.display().to_string();
    let ssh = ["--launcher", "ssh", "--ssh-config", config_file.as_str()];

    let out = doctor(
        &[&ssh[..], &["--hosts", "good,novenv"]].concat(),
        &venv_path(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(71), "{}", text(&out));
    assert!(row(&stdout, "good").contains(" ok "), "{stdout}");
    assert!(row(&stdout, "novenv").contains("no torchrun"), "{stdout}");
    assert!(
        stdout.contains("problem: novenv: torchrun not found: \"torchrun\" is not on its PATH (/nonexistent-venv/bin:"),
        "{stdout}"
    );
    assert!(
        stdout.contains("2 nodes checked over ssh: 1 problem"),
        "{stdout}"
    );

    let out = doctor(
        &[&ssh[..], &["--hosts", "good,novenv,down"]].concat(),
        &venv_path(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(68),
        "unreachable first: {}",
        text(&out)
    );
    assert!(row(&stdout, "good").contains(" ok "), "{stdout}");
    assert!(row(&stdout, "novenv").contains("no torchrun"), "{stdout}");
    assert!(row(&stdout, "down").contains("unreachable"), "{stdout}");
    assert!(
        stdout.contains("problem: down: not reached: ssh to down failed: Connection refused"),
        "{stdout}"
    );
    assert!(
        stdout.contains("fix: check that `ssh HOST true` works"),
        "{stdout}"
    );
}

#[test]
fn on_slurm_the_node_is_probed_as_a_job_step() {
    let slurm = Slurm::start();
    let job = slurm.allocate();
    let dir = tempfile::Builder::new()
        .prefix("pipette-doctor-slurm-")
        .tempdir()
        .unwrap();
    // `srun` as a job script inside the allocation runs it.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(slurm.srun_in(&job), bin.join("srun")).unwrap();
    let path = format!("{}:{}", bin.display(), venv_path());
    let srun = ["--hosts", slurm.node, "--launcher", "srun"];

    let out = doctor(
        &[&srun[..], &["--env", "NCCL_SOCKET_IFNAME=lo"]].concat(),
        &path,
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out),
        slurm.logs()
    );
    assert!(row(&stdout, slurm.node).contains(" ok "), "{stdout}");
    assert!(
        stdout.contains(&format!("NCCL_* on {}: NCCL_SOCKET_IFNAME=lo", slurm.node)),
        "{stdout}"
    );
    assert!(stdout.contains("checked over srun"), "{stdout}");

    // The step's environment without the venv.
    let out = doctor(
        &[&srun[..], &["--env", "PATH=/usr/bin:/bin"]].concat(),
        &path,
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(71), "{}", text(&out));
    assert!(row(&stdout, slurm.node).contains("no torchrun"), "{stdout}");
}
