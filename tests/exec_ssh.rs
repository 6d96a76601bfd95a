//! The ssh transport against a real `sshd` on loopback: a throwaway server (fresh host key,
//! one authorized throwaway client key, all in a temp dir) on a free port, driven through
//! the system `ssh` client exactly as pipette-run drives it on a cluster.
//!
//! Requires OpenSSH's server at /usr/sbin/sshd (Debian: `apt-get install -y
//! openssh-server`); the test fails, never skips, without it. The profiling test also needs
//! the venv of `scripts/setup-megatron-venv` (PyTorch's torchrun), or
//! `PIPETTE_MEGATRON_PYTHON`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;

use pipette::cluster::{ClusterSpec, Node, NodeSource, Slots};
use pipette::exec::{
    run, run_with, spawn_with, ExecError, ExecOptions, NodeCommand, SshOptions, Status, Transport,
};
use pipette::profile::{run_profile, NoProgress, ProbeSettings, ProfileOptions};

use common::{eventually, free_port, venv_python, Sshd};

/// How these tests reach the throwaway sshd: its key and known-hosts file, no user config.
trait SshdClient {
    fn transport(&self) -> Transport;
    fn options(&self) -> SshOptions;
    fn path(&self, name: &str) -> PathBuf;
}

impl SshdClient for Sshd {
    fn transport(&self) -> Transport {
        Transport::Ssh(self.options())
    }

    fn options(&self) -> SshOptions {
        let d = self.dir.path();
        SshOptions {
            port: Some(self.port),
            identity: Some(d.join("client_key")),
            extra_args: vec![
                "-F".into(),
                "/dev/null".into(),
                "-o".into(),
                format!("UserKnownHostsFile={}", d.join("known_hosts").display()),
                "-o".into(),
                "StrictHostKeyChecking=no".into(),
                "-o".into(),
                "LogLevel=ERROR".into(),
            ],
            ..SshOptions::default()
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .is_some_and(|i| !stat[i + 2..].starts_with('Z'))
    })
}

fn read_pid(path: &Path) -> i32 {
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(path)
            .is_ok_and(|t| t.ends_with('\n'))),
        "{} was never written",
        path.display()
    );
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

const AWKWARD: [&str; 18] = [
    "plain",
    "",
    "two words",
    "it's",
    "'",
    "\"double\"",
    "$HOME",
    "${PATH}",
    "`id`",
    "$(id)",
    "a;b|c&d>e<f",
    "line\nbreak",
    "back\\slash\\",
    "*",
    "~",
    "-n",
    "#not a comment",
    "ünïcødé\ttab\r",
];

#[test]
fn argv_env_cwd_and_stdin_arrive_byte_for_byte() {
    let sshd = Sshd::start();
    let work = sshd.path("a dir with 'quotes' and $x");
    std::fs::create_dir(&work).unwrap();
    let command = NodeCommand::new("sh")
        .arg("-c")
        .arg("printf '%s\\0' \"$@\"; printf '%s|%s|' \"$WEIRD\" \"$(pwd)\"; cat")
        .arg("argv0")
        .args(AWKWARD)
        .env("WEIRD", "a b'c\"$x`y`\n;z")
        .cwd(&work)
        .stdin(b"binary\0bytes\nand 'quotes'".to_vec());
    let out = run(
        &sshd.transport(),
        "127.0.0.1",
        &command,
        Duration::from_secs(30),
    )
    .unwrap();
    assert!(out.status.success(), "{}", out.stderr_text());
    let expected_args: String = AWKWARD.iter().map(|a| format!("{a}\0")).collect();
    assert_eq!(
        out.stdout_text(),
        format!(
            "{expected_args}a b'c\"$x`y`\n;z|{}|binary\0bytes\nand 'quotes'",
            work.display()
        )
    );
    assert_eq!(out.stderr_text(), "");
}

#[test]
fn exit_codes_and_stderr_come_back() {
    let sshd = Sshd::start();
    let out = run(
        &sshd.transport(),
        "127.0.0.1",
        &NodeCommand::new("sh")
            .arg("-c")
            .arg("echo out; echo err >&2; exit 7"),
        Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(out.status, Status::Exited(7));
    assert_eq!(out.stdout_text(), "out\n");
    assert_eq!(out.stderr_text(), "err\n");
}

/// A timeout, and dropping a running command (what happens when pipette-run itself is
/// stopped), must end the remote process tree, not just the local `ssh`.
#[test]
fn teardown_reaches_the_remote_process_tree() {
    let sshd = Sshd::start();
    let options = ExecOptions {
        grace: Duration::from_secs(1),
        ..ExecOptions::default()
    };
    for how in ["timeout", "drop", "terminate"] {
        let leader = sshd.path(&format!("{how}.leader"));
        let child = sshd.path(&format!("{how}.child"));
        // The remote command ignores TERM, so only the watchdog's KILL ends it.
        let command = NodeCommand::new("sh").arg("-c").arg(format!(
            "trap '' TERM; sleep 1000 & echo $! > '{}'; echo $$ > '{}'; wait; wait",
            child.display(),
            leader.display()
        ));
        let start = Instant::now();
        match how {
            "timeout" => {
                let err = run_with(
                    &sshd.transport(),
                    "127.0.0.1",
                    &command,
                    Duration::from_secs(2),
                    &options,
                )
                .unwrap_err();
                let ExecError::TimedOut { output, .. } = &err else {
                    panic!("{err}");
                };
                assert_eq!(output.status, Status::Exited(137), "{output:?}");
                assert!(
                    err.to_string()
                        .contains(" on 127.0.0.1 did not finish within 2 s"),
                    "{err}"
                );
            }
            "drop" => {
                let running =
                    spawn_with(&sshd.transport(), "127.0.0.1", &command, &options).unwrap();
                read_pid(&leader);
                drop(running);
            }
            _ => {
                let mut running =
                    spawn_with(&sshd.transport(), "127.0.0.1", &command, &options).unwrap();
                read_pid(&leader);
                let status = running.terminate().unwrap();
                assert_eq!(status, Status::Exited(137), "{how}");
            }
        }
        let remote = read_pid(&leader);
        let sleeper = read_pid(&child);
        assert!(
            eventually(Duration::from_secs(5), || !alive(remote) && !alive(sleeper)),
            "{how}: remote processes {remote} / {sleeper} survived"
        );
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{how}: {:?}",
            start.elapsed()
        );
    }
}

#[test]
fn a_node_without_sshd_is_unreachable() {
    let sshd = Sshd::start();
    let mut options = sshd.options();
    options.port = Some(free_port());
    let err = run(
        &Transport::Ssh(options),
        "127.0.0.1",
        &NodeCommand::new("true"),
        Duration::from_secs(30),
    )
    .unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    assert_eq!(
        err.to_string(),
        "ssh to 127.0.0.1 failed: Connection refused (check that sshd runs there and the host name resolves)"
    );
}

#[test]
fn option_like_host_names_never_reach_ssh() {
    let sshd = Sshd::start();
    let marker = sshd.path("pwned");
    let host = format!("-oProxyCommand=touch {}", marker.display());
    let err = run(
        &sshd.transport(),
        &host,
        &NodeCommand::new("true"),
        Duration::from_secs(10),
    )
    .unwrap_err();
    assert!(matches!(err, ExecError::BadHost { .. }), "{err}");
    assert!(!marker.exists());
}

/// The whole profiling path over ssh: two "nodes" (127.0.0.1 and 127.0.0.2, both this
/// machine's sshd) get the probe staged through ssh (bytes on standard input), node 0's
/// python finds the port, torchrun runs under the remote wrapper, and the staging
/// directories are removed through ssh afterwards.
#[test]
fn the_probe_runs_over_ssh() {
    let sshd = Sshd::start();
    let python = venv_python();
    let torchrun = python.with_file_name("torchrun");
    assert!(torchrun.is_file(), "{} not found", torchrun.display());
    let spec = ClusterSpec {
        nodes: ["127.0.0.1", "127.0.0.2"]
            .iter()
            .map(|h| Node {
                host: (*h).to_owned(),
                slots: Slots::Count(1),
            })
            .collect(),
        source: NodeSource::Hosts,
        job_id: None,
    };
    let options = ProfileOptions {
        transport: sshd.transport(),
        torchrun: torchrun.to_string_lossy().into_owned(),
        python: python.to_string_lossy().into_owned(),
        master_addr: Some("127.0.0.1".into()),
        env: vec![("GLOO_SOCKET_IFNAME".into(), "lo".into())],
        probe_timeout: Duration::from_secs(120),
        grace: Duration::from_secs(2),
        probe: Some(ProbeSettings {
            sizes: vec![1 << 20],
            warmup: 1,
            repeats: 3,
            bytes_per_repeat: 4 << 20,
            max_iters: 8,
            compute_n: 256,
            compute_repeats: 3,
        }),
        cache: None,
        ..ProfileOptions::default()
    };
    let before = staging_dirs();
    let run = run_profile(&spec, &options, &NoProgress).unwrap_or_else(|e| panic!("{e}"));
    run.profile.validate("ssh profile").unwrap();
    assert_eq!(run.profile.node_links.size(), 2);
    assert!(run.profile.node_links.get(0, 1) > 0.0 && run.profile.node_links.get(1, 0) > 0.0);
    assert_eq!(run.profile.nodes[1].gpus().unwrap().len(), 1);
    assert_eq!(
        staging_dirs(),
        before,
        "the probe's directories were left behind"
    );
}

fn staging_dirs() -> Vec<String> {
    let tmp = std::env::var_os("TMPDIR").map_or(PathBuf::from("/tmp"), PathBuf::from);
    let mut dirs: Vec<String> = std::fs::read_dir(tmp)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("pipette-probe."))
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}
