//! The ssh transport against a real `sshd` on loopback: a throwaway server (fresh host key,
//! one authorized throwaway client key, all in a temp dir) on a free port, driven through
//! the system `ssh` client exactly as pipette-run drives it on a cluster.
//!
//! Requires OpenSSH's server at /usr/sbin/sshd (Debian: `apt-get install -y
//! openssh-server`); the test fails, never skips, without it. The profiling test also needs
//! the venv of `scripts/setup-megatron-venv` (PyTorch's torchrun), or
//! `PIPETTE_MEGATRON_PYTHON`.

use std::path::PathBuf;
use std::time::Duration;

mod common;

use pipette::cluster::{ClusterSpec, Node, NodeSource, Slots};
use pipette::exec::{run, ExecError, NodeCommand, SshOptions, Transport};
use pipette::measure::{run_profile, NoProgress, ProbeSettings, ProfileOptions};

use common::{
    assert_remote_exit_code_and_streams, assert_remote_io_intact, assert_teardown_reaches_the_node,
    free_port, venv_python, Sshd,
};

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

#[test]
fn argv_env_cwd_and_stdin_arrive_byte_for_byte() {
    let sshd = Sshd::start();
    let work = sshd.path("a dir with 'quotes' and $x");
    assert_remote_io_intact(&sshd.transport(), "127.0.0.1", &work, &String::new);
}

/// `--env PATH=DIR` with a DIR lacking /usr/bin: the wrapper's own tools (setsid, mktemp,
/// head, cat, sleep) are still found on the node's PATH, and the command on the user's
/// (issue 15: every remote command failed, the wrapper exported PATH before using them).
#[test]
fn a_user_path_without_system_tools_still_runs_the_command() {
    let sshd = Sshd::start();
    let bin = sshd.path("user bin");
    std::fs::create_dir(&bin).unwrap();
    let tool = bin.join("hello");
    common::write_executable(
        &tool,
        "#!/bin/sh\nprintf '%s|' \"$PATH\"; read -r line; echo \"$line\"\n",
    );
    let command = NodeCommand::new("hello")
        .env("PATH", bin.to_str().unwrap())
        .stdin(b"from stdin\n".to_vec());
    let out = run(
        &sshd.transport(),
        "127.0.0.1",
        &command,
        Duration::from_secs(30),
    )
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout_text(), format!("{}|from stdin\n", bin.display()));
    assert_eq!(out.stderr_text(), "");
}

#[test]
fn exit_codes_and_stderr_come_back() {
    let sshd = Sshd::start();
    assert_remote_exit_code_and_streams(&sshd.transport(), "127.0.0.1", &String::new);
}

#[test]
fn teardown_reaches_the_remote_process_tree() {
    let sshd = Sshd::start();
    assert_teardown_reaches_the_node(
        &sshd.transport(),
        "127.0.0.1",
        sshd.dir.path(),
        &String::new,
    );
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
///
/// The sessions stage in a TMPDIR of this test's own: counted in the shared /tmp, the
/// staging directories of any other probe running meanwhile (another test binary, another
/// checkout's tests) made "left behind" fail at random; and a test run with TMPDIR set
/// counted a directory the sessions (which do not inherit it) never used.
#[test]
fn the_probe_runs_over_ssh() {
    let sshd = Sshd::start_with_own_tmpdir();
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
    // The sessions do stage there (else an empty directory would prove nothing).
    let tmp = sshd.tmp();
    let said = run(
        &sshd.transport(),
        "127.0.0.2",
        &NodeCommand::new("sh").args(["-c", "printf %s \"$TMPDIR\""]),
        Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(said.stdout_text(), tmp.display().to_string());
    let run = run_profile(&spec, &options, &NoProgress).unwrap_or_else(|e| panic!("{e}"));
    run.profile.validate("ssh profile").unwrap();
    assert_eq!(run.profile.node_links.size(), 2);
    assert!(run.profile.node_links.get(0, 1) > 0.0 && run.profile.node_links.get(1, 0) > 0.0);
    assert_eq!(run.profile.nodes[1].gpus().unwrap().len(), 1);
    assert_eq!(
        std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("pipette-probe."))
            .collect::<Vec<_>>(),
        Vec::<String>::new(),
        "the probe's directories were left behind in {}",
        tmp.display()
    );
}
