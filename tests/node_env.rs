//! What reaches the nodes besides the command (issue 15), for real: pipette-run runs a small
//! script under PyTorch's torchrun on one node reached through a throwaway sshd on loopback,
//! or as a job step of a throwaway Slurm, and the script writes the environment it got.
//!
//! - over ssh: a variable from `--env NAME=VALUE`, one from `--env NAME` (this process's
//!   value), one from `--env-file` and one forwarded by default arrive byte for byte —
//!   quotes, blanks, `$(...)` and backticks included — and a variable outside the forwarded
//!   set does not; `--ssh-args` reaches ssh (its `-o Port=` is the only way to the sshd);
//! - over srun: `--srun-args "--export=ALL,NAME=VALUE"` reaches srun (the step gets it).
//!
//! Needs the venv of `scripts/setup-megatron-venv` (or `PIPETTE_MEGATRON_PYTHON`), OpenSSH's
//! server, Debian's Slurm and munge; fails, never skips, without them.

mod common;

use std::path::Path;
use std::process::Stdio;

use common::{assert_no_process_left, cpu_job_command, torchrun, Slurm, Sshd};
use serde_json::Value;

/// The script: writes the variables named after the output file, as JSON.
const SCRIPT: &str = r#"
import json, os, sys
with open(sys.argv[1], "w") as f:
    json.dump({n: os.environ.get(n) for n in sys.argv[2:]}, f)
"#;

/// A value a shell anywhere on the way would mangle.
const AWKWARD: &str = "a \"b\" 'c' $(touch /tmp/pipette-pwned) `id` ${HOME} \\ ; * end";

/// Runs pipette-run on one node with `options`, the script asked for `names`; returns what
/// the script saw.
fn run_job(dir: &Path, options: &[String], names: &[&str], env: &[(&str, &str)]) -> Value {
    let script = dir.join("env_report.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let out = dir.join("env.json");
    let mut command = cpu_job_command(env!("CARGO_BIN_EXE_pipette-run"));
    command
        .args(["--nproc-per-node", "1", "--max-replans", "0"])
        .arg("--run-dir")
        .arg(dir.join("run"))
        .arg("--torchrun")
        .arg(torchrun())
        .args(["--master-port", &common::free_port().to_string()])
        .args(options)
        .arg(&script)
        .arg(&out)
        .args(names)
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    let output = command.output().unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert_no_process_left(&dir.display().to_string());
    serde_json::from_str(&std::fs::read_to_string(&out).unwrap_or_else(|e| panic!("{e}: {text}")))
        .unwrap()
}

#[test]
fn env_options_env_files_and_ssh_args_reach_the_node_over_ssh() {
    let sshd = Sshd::start();
    let dir = tempfile::Builder::new()
        .prefix("pipette-node-env-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    // The fixture's client configuration, but with a port nobody listens on: only
    // `--ssh-args "-o Port=N"` reaches the sshd.
    let config = std::fs::read_to_string(sshd.client_config(&["127.0.0.1"])).unwrap();
    let config = config.replace(&format!("Port {}", sshd.port), "Port 9");
    let config_file = d.join("ssh_config");
    std::fs::write(&config_file, config).unwrap();
    let env_file = d.join("site env");
    std::fs::write(
        &env_file,
        format!("# site settings\nPIPETTE_T_FILE={AWKWARD}\n\nPIPETTE_T_BOTH=file\n"),
    )
    .unwrap();
    let options: Vec<String> = [
        "--hosts",
        "127.0.0.1",
        "--launcher",
        "ssh",
        "--ssh-config",
        &config_file.display().to_string(),
        "--ssh-args",
        &format!("-o 'Port={}'", sshd.port),
        "--env-file",
        &env_file.display().to_string(),
        "--env",
        &format!("PIPETTE_T_SET={AWKWARD}"),
        "--env",
        "PIPETTE_T_COPY",
        "--env",
        "PIPETTE_T_BOTH=option",
    ]
    .map(String::from)
    .to_vec();
    let names = [
        "PIPETTE_T_SET",
        "PIPETTE_T_COPY",
        "PIPETTE_T_FILE",
        "PIPETTE_T_BOTH",
        "HF_HOME",
        "PIPETTE_T_NOT_FORWARDED",
    ];
    let seen = run_job(
        d,
        &options,
        &names,
        &[
            ("PIPETTE_T_COPY", "copied 'as is' $HOME"),
            ("HF_HOME", "/data/hf cache"),
            ("PIPETTE_T_NOT_FORWARDED", "x"),
        ],
    );
    assert_eq!(seen["PIPETTE_T_SET"], AWKWARD, "{seen}");
    assert_eq!(seen["PIPETTE_T_COPY"], "copied 'as is' $HOME", "{seen}");
    assert_eq!(seen["PIPETTE_T_FILE"], AWKWARD, "{seen}");
    assert_eq!(seen["PIPETTE_T_BOTH"], "option", "--env wins: {seen}");
    assert_eq!(
        seen["HF_HOME"], "/data/hf cache",
        "forwarded by default: {seen}"
    );
    assert_eq!(seen["PIPETTE_T_NOT_FORWARDED"], Value::Null, "{seen}");
    assert!(
        !Path::new("/tmp/pipette-pwned").exists(),
        "a shell ran a value"
    );
    drop(sshd);
}

#[test]
fn srun_args_reach_srun() {
    let slurm = Slurm::start();
    let job = slurm.allocate();
    let dir = tempfile::Builder::new()
        .prefix("pipette-srun-args-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    // `srun` as a job script inside the allocation runs it.
    let bin = d.join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(slurm.srun_in(&job), bin.join("srun")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let options: Vec<String> = [
        "--hosts",
        slurm.node,
        "--launcher",
        "srun",
        "--master-addr",
        "127.0.0.1",
        "--srun-args",
        "--export=ALL,PIPETTE_T_SRUN=from-srun-args --job-name='pipette srun-args'",
    ]
    .map(String::from)
    .to_vec();
    let seen = run_job(
        d,
        &options,
        &["PIPETTE_T_SRUN", "SLURM_JOB_ID", "SLURM_STEP_ID"],
        &[("PATH", path.as_str())],
    );
    assert_eq!(seen["PIPETTE_T_SRUN"], "from-srun-args", "{seen}");
    assert_eq!(
        seen["SLURM_JOB_ID"],
        job.as_str(),
        "ran as a step of the job: {seen}"
    );
}

/// N8: forwarded credentials (`HF_TOKEN`, `WANDB_API_KEY`, `--env NAME=VALUE`) were printed
/// by the dry run and written into `launch-*.sh`, mode 0755 in a 0755 run directory, and
/// `PIPETTE_JOB_SECRET` reached every worker. Now the worker gets each credential's value
/// from pipette-run's environment at launch, no file of the run directory and no line of
/// the dry run holds it, the run directory and its scripts are the owner's alone, and the
/// job secret (and its file variable) stay out of the worker's environment.
#[test]
fn n8_credentials_reach_the_worker_and_no_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("pipette-n8-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    const TOKEN: &str = "hf_n8_never_written_0xC0FFEE";
    const PASSWORD: &str = "n8-password-never-written";
    // Kept-back shapes of the same class: a password inside a URL, whatever the variable's
    // name, and a personal access token named `*_PAT`.
    const URL_PASSWORD: &str = "n8-url-password";
    let url = format!("postgresql://trainer:{URL_PASSWORD}@db.example/runs");
    const PAT: &str = "ghp_n8_personal_access_token";
    let options: Vec<String> = [
        "--env",
        &format!("MY_DB_PASSWORD={PASSWORD}"),
        "--env",
        &format!("RESULTS_DB={url}"),
        "--env",
        &format!("GH_PAT={PAT}"),
    ]
    .map(String::from)
    .to_vec();
    let names = [
        "HF_TOKEN",
        "MY_DB_PASSWORD",
        "RESULTS_DB",
        "GH_PAT",
        "PIPETTE_JOB_SECRET",
        "PIPETTE_JOB_SECRET_FILE",
    ];
    let env = [
        ("HF_TOKEN", TOKEN),
        ("PIPETTE_JOB_SECRET", "n8-job-secret"),
        ("PIPETTE_JOB_SECRET_FILE", "/nonexistent/n8-secret"),
    ];
    let seen = run_job(d, &options, &names, &env);
    assert_eq!(seen["HF_TOKEN"], TOKEN, "{seen}");
    assert_eq!(seen["MY_DB_PASSWORD"], PASSWORD, "{seen}");
    assert_eq!(seen["RESULTS_DB"], url.as_str(), "{seen}");
    assert_eq!(seen["GH_PAT"], PAT, "{seen}");
    assert_eq!(seen["PIPETTE_JOB_SECRET"], Value::Null, "{seen}");
    assert_eq!(seen["PIPETTE_JOB_SECRET_FILE"], Value::Null, "{seen}");

    let run = d.join("run");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&run), 0o700);
    let mut scripts = 0;
    let mut stack = vec![run.clone()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let bytes = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).to_string();
            assert!(!bytes.contains(TOKEN), "{} holds HF_TOKEN", path.display());
            for secret in [PASSWORD, URL_PASSWORD, PAT] {
                assert!(!bytes.contains(secret), "{} holds {secret}", path.display());
            }
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if name.starts_with("launch-") && name.ends_with(".sh") {
                scripts += 1;
                assert_eq!(mode(&path), 0o700, "{name}");
                assert!(bytes.contains("export HF_TOKEN=\"${HF_TOKEN:?"), "{bytes}");
            }
        }
    }
    assert!(scripts > 0, "no launch script in {}", run.display());

    // The dry run names the credentials and shows neither value.
    let mut dry = cpu_job_command(env!("CARGO_BIN_EXE_pipette-run"));
    dry.args(["--nproc-per-node", "1", "--dry-run"])
        .arg("--run-dir")
        .arg(d.join("dry"))
        .args(&options)
        .arg(d.join("env_report.py"))
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    let out = dry.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("HF_TOKEN"), "{text}");
    for secret in [TOKEN, PASSWORD, URL_PASSWORD, PAT] {
        assert!(
            !text.contains(secret),
            "the dry run shows {secret}:\n{text}"
        );
    }
}
