//! How a command reaches a node: run here, through the system `ssh` client, or as a Slurm
//! job step with `srun`. [`Transport::invocation`] turns a [`NodeCommand`] for a host into
//! the local command line that runs it there; [`super::spawn`] runs that command line.
//!
//! # Remote commands and their teardown
//!
//! ssh hands the remote side one string, which the login shell there splits; srun hands
//! over an argument vector. Both run the same small POSIX `sh` wrapper
//! ([`REMOTE_WRAPPER`]) with the command's words as its arguments, every word quoted with
//! [`shell_quote`] for ssh, so nothing a user or a node wrote is interpreted by a shell.
//! The wrapper
//!
//! 1. changes directory;
//! 2. starts the command under `setsid`, so the command and everything it starts form one
//!    process group (and session) whose id is the command's pid; the command's environment
//!    is exported there, in the shell that then becomes the command, so the wrapper's own
//!    tools (`setsid`, `mktemp`, `head`, `cat`, `sleep`) are found on the node's PATH even
//!    when the user's environment sets a PATH without them, and the command on the user's;
//! 3. starts a watchdog that reads the wrapper's standard input until end-of-file and then
//!    sends TERM to that group, waits the grace period and sends KILL;
//! 4. waits for the command, kills what it left behind in its group, and exits with its
//!    status (128 + the signal number when a signal ended it).
//!
//! The local side holds the pipe to `ssh`'s (or `srun`'s) standard input open for as long
//! as the command should run. Closing it, killing `ssh`, our own process dying, or the
//! connection dropping all end the remote standard input, so the remote process tree is torn
//! down whatever way the local side goes: no pid file and no second connection are needed.
//! The price is that a remote command cannot read a stream from us; it can get a fixed
//! block of bytes ([`NodeCommand::stdin`]), which the wrapper reads first (exactly that many
//! bytes, into a deleted temporary file that becomes the command's standard input).
//!
//! One exception: killing `srun` outright (KILL) leaves its job step running, its standard
//! input never closed, so a dropped [`super::RunningCommand`] sends `srun` TERM instead,
//! and `srun` cancels the step, which Slurm kills whole; a kill at once (a second Ctrl-C,
//! see `exec::group::NodeGroup::stop`) does the same before it KILLs `srun`.
//!
//! The login shell on ssh nodes must be POSIX-like (sh, bash, dash, zsh, ksh): it reads the
//! single-quoted words. `setsid`, `mktemp` and `head -c` must exist there (util-linux and
//! coreutils, on every Linux distribution).

use std::path::PathBuf;
use std::time::Duration;

use super::agent::{relay_order, AgentOptions, RELAY_FLAG};
use super::quote::{host_problem, is_env_name, shell_join, shell_quote};
use super::{ExecError, NodeCommand};

/// The POSIX `sh` script that runs a command on a remote node (see the module docs).
///
/// Arguments: grace seconds, stdin byte count (`-1`: none), working directory (empty: the
/// login directory), the number of environment words that follow, those words, then the
/// program and its arguments. An environment word is `NAME=VALUE`, or a bare `NAME` whose
/// value comes first on standard input, before the command's bytes: its length in bytes on
/// a line, then the value (a credential, kept off every command line). Kept on one line, so even a login shell that mishandles
/// newlines inside quotes passes it on intact.
pub const REMOTE_WRAPPER: &str = concat!(
    "g=$1 n=$2 d=$3 e=$4; shift 4; ",
    "if [ -n \"$d\" ]; then cd -- \"$d\" || exit 125; fi; ",
    "exec 4<&0; ",
    "i=0; for w in \"$@\"; do [ \"$i\" -ge \"$e\" ] && break; i=$((i + 1)); case $w in *=*) ;; ",
    "*) read -r l <&4 || exit 125; v=$(head -c \"$l\" <&4; echo x) || exit 125; ",
    "export \"$w=${v%x}\" || exit 125;; esac; done; ",
    "if [ \"$n\" -ge 0 ]; then t=$(mktemp) || exit 125; head -c \"$n\" <&4 >\"$t\" || exit 125; ",
    "exec 3<\"$t\"; rm -f -- \"$t\"; else exec 3</dev/null; fi; ",
    "setsid -- /bin/sh -c 'e=$1; shift; ",
    "while [ \"$e\" -gt 0 ]; do case $1 in *=*) export \"$1\" || exit 125;; esac; shift; e=$((e - 1)); done; ",
    "exec \"$@\"' pipette-env \"$e\" \"$@\" <&3 3<&- 4<&- & p=$!; exec 3<&-; ",
    "setsid -- sh -c 'cat >/dev/null; kill -s TERM -- -\"$1\" 2>/dev/null; sleep \"$2\"; ",
    "kill -s KILL -- -\"$1\" 2>/dev/null' pipette-watch \"$p\" \"$g\" <&4 4<&- >/dev/null 2>&1 & w=$!; ",
    "exec 4<&-; ",
    "trap 'kill -s TERM -- -\"$p\" 2>/dev/null' HUP INT TERM; ",
    "s=0; wait \"$p\" || s=$?; ",
    "while kill -0 \"$p\" 2>/dev/null; do wait \"$p\"; s=$?; done; ",
    "kill -s KILL -- -\"$p\" 2>/dev/null; kill -s KILL -- -\"$w\" 2>/dev/null; exit \"$s\""
);

/// The name the wrapper runs under (`$0`), so `ps` on a node shows what it is.
const WRAPPER_NAME: &str = "pipette-exec";

/// How commands reach the nodes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Transport {
    /// On this machine, whatever the host is called. Tests use it to run several "nodes"
    /// as local processes; a single-machine run uses it for `localhost`.
    #[default]
    Local,
    /// Through the system `ssh` client.
    Ssh(SshOptions),
    /// As a one-task Slurm job step on the host, inside the current allocation.
    Srun(SrunOptions),
    /// Through the copy of pipette-run that runs on the host (see [`super::agent`]).
    Agent(AgentOptions),
}

/// Options of the `ssh` client. Host keys and agents come from the user's ssh configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshOptions {
    /// The client, `ssh` on PATH by default.
    pub program: PathBuf,
    /// `ConnectTimeout`, rounded up to whole seconds.
    pub connect_timeout: Duration,
    /// `ServerAliveInterval`, rounded up to whole seconds: a dead connection is noticed
    /// after about three of these.
    pub server_alive_interval: Duration,
    pub port: Option<u16>,
    pub user: Option<String>,
    /// A private key file (`-i`).
    pub identity: Option<PathBuf>,
    /// More client arguments, placed before the host, e.g. `["-o", "UserKnownHostsFile=x"]`.
    pub extra_args: Vec<String>,
}

impl Default for SshOptions {
    fn default() -> Self {
        SshOptions {
            program: PathBuf::from("ssh"),
            connect_timeout: Duration::from_secs(10),
            server_alive_interval: Duration::from_secs(15),
            port: None,
            user: None,
            identity: None,
            extra_args: Vec::new(),
        }
    }
}

/// Options of `srun`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrunOptions {
    /// `srun` on PATH by default.
    pub program: PathBuf,
    /// More srun arguments, placed before the command.
    pub extra_args: Vec<String>,
}

impl Default for SrunOptions {
    fn default() -> Self {
        SrunOptions {
            program: PathBuf::from("srun"),
            extra_args: Vec::new(),
        }
    }
}

/// Which transport a [`Transport`] is, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    Local,
    Ssh,
    Srun,
    Agent,
}

impl TransportKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Local => "local",
            TransportKind::Ssh => "ssh",
            TransportKind::Srun => "srun",
            TransportKind::Agent => "agent",
        }
    }
}

/// A local command line: what [`super::spawn`] starts to run a [`NodeCommand`] on a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub program: String,
    pub args: Vec<String>,
    /// Set on the local process (the local transport only; remote ones pass the
    /// environment through the wrapper).
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// Whether the command runs under [`REMOTE_WRAPPER`], whose standard input must stay
    /// open while the command should run.
    pub remote: bool,
    /// What the local process reads first on its standard input, instead of
    /// [`NodeCommand::stdin`] (which these bytes carry on): the agent relay's order.
    pub stdin: Option<Vec<u8>>,
}

impl Invocation {
    /// The command line as a shell would read it (for logs and `--dry-run`).
    pub fn to_shell(&self) -> String {
        let mut line = String::new();
        if !self.env.is_empty() {
            line.push_str("env ");
            for (name, value) in &self.env {
                // Names are checked (letters, digits, _), so only values need quoting.
                line.push_str(&format!("{name}={} ", shell_quote(value)));
            }
        }
        line.push_str(&shell_join(
            std::iter::once(&self.program).chain(&self.args),
        ));
        match &self.cwd {
            Some(dir) => format!("cd {} && {line}", shell_quote(&dir.to_string_lossy())),
            None => line,
        }
    }
}

impl Transport {
    pub fn kind(&self) -> TransportKind {
        match self {
            Transport::Local => TransportKind::Local,
            Transport::Ssh(_) => TransportKind::Ssh,
            Transport::Srun(_) => TransportKind::Srun,
            Transport::Agent(_) => TransportKind::Agent,
        }
    }

    /// The local command line that runs `command` on `host`. `grace` is how long the remote
    /// watchdog waits between TERM and KILL when the command is torn down.
    pub fn invocation(
        &self,
        host: &str,
        command: &NodeCommand,
        grace: Duration,
    ) -> Result<Invocation, ExecError> {
        check_command(host, command)?;
        match self {
            Transport::Local => Ok(Invocation {
                program: command.program.clone(),
                args: command.args.clone(),
                env: command
                    .env
                    .iter()
                    .chain(&command.secrets)
                    .cloned()
                    .collect(),
                cwd: command.cwd.clone(),
                remote: false,
                stdin: None,
            }),
            Transport::Ssh(ssh) => {
                check_host(host)?;
                let mut args: Vec<String> = vec![
                    "-T".into(),
                    "-o".into(),
                    "BatchMode=yes".into(),
                    "-o".into(),
                    format!("ConnectTimeout={}", whole_seconds(ssh.connect_timeout)),
                    "-o".into(),
                    format!(
                        "ServerAliveInterval={}",
                        whole_seconds(ssh.server_alive_interval)
                    ),
                ];
                if let Some(port) = ssh.port {
                    args.extend(["-p".into(), port.to_string()]);
                }
                if let Some(user) = &ssh.user {
                    args.extend(["-l".into(), user.clone()]);
                }
                if let Some(key) = &ssh.identity {
                    args.extend(["-i".into(), key.to_string_lossy().into_owned()]);
                }
                args.extend(ssh.extra_args.iter().cloned());
                args.push("--".into());
                args.push(host.to_owned());
                args.push(format!(
                    "exec {}",
                    shell_join(wrapper_words(command, grace))
                ));
                Ok(Invocation {
                    program: ssh.program.to_string_lossy().into_owned(),
                    args,
                    env: Vec::new(),
                    cwd: None,
                    remote: true,
                    stdin: wrapper_stdin(command),
                })
            }
            Transport::Srun(srun) => {
                check_host(host)?;
                let mut args: Vec<String> = vec![
                    "--nodes=1".into(),
                    "--ntasks=1".into(),
                    "--overlap".into(),
                    "-w".into(),
                    host.to_owned(),
                ];
                args.extend(srun.extra_args.iter().cloned());
                args.extend(wrapper_words(command, grace));
                Ok(Invocation {
                    program: srun.program.to_string_lossy().into_owned(),
                    args,
                    env: Vec::new(),
                    cwd: None,
                    remote: true,
                    stdin: wrapper_stdin(command),
                })
            }
            Transport::Agent(agent) => {
                let addr = agent.addr_of(host).ok_or_else(|| ExecError::BadHost {
                    host: host.to_owned(),
                    problem: "is not the node of any copy of pipette-run in this job",
                })?;
                Ok(Invocation {
                    program: agent.relay.to_string_lossy().into_owned(),
                    args: vec![RELAY_FLAG.to_owned(), host.to_owned()],
                    env: Vec::new(),
                    cwd: None,
                    remote: true,
                    stdin: Some(relay_order(agent, host, addr, command, grace)),
                })
            }
        }
    }
}

/// The command line that runs `command` on this machine under [`REMOTE_WRAPPER`], as an
/// agent does for its leader: the caller holds the wrapper's standard input, and when it
/// closes (the caller is done with the command, or died) the watchdog tears the command
/// down.
pub(super) fn wrapped_here(
    host: &str,
    command: &NodeCommand,
    grace: Duration,
) -> Result<Invocation, ExecError> {
    check_command(host, command)?;
    let mut words = wrapper_words(command, grace);
    let program = words.remove(0);
    Ok(Invocation {
        program,
        args: words,
        env: Vec::new(),
        cwd: None,
        remote: true,
        stdin: wrapper_stdin(command),
    })
}

/// `/bin/sh -c WRAPPER pipette-exec GRACE NSTDIN CWD NENV K=V... PROGRAM ARGS...`
fn wrapper_words(command: &NodeCommand, grace: Duration) -> Vec<String> {
    let mut words = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        REMOTE_WRAPPER.to_owned(),
        WRAPPER_NAME.to_owned(),
        whole_seconds(grace).max(1).to_string(),
        command
            .stdin
            .as_ref()
            .map_or("-1".to_owned(), |data| data.len().to_string()),
        command
            .cwd
            .as_ref()
            .map_or(String::new(), |d| d.to_string_lossy().into_owned()),
        (command.env.len() + command.secrets.len()).to_string(),
    ];
    words.extend(command.env.iter().map(|(k, v)| format!("{k}={v}")));
    words.extend(command.secrets.iter().map(|(k, _)| k.clone()));
    words.push(command.program.clone());
    words.extend(command.args.iter().cloned());
    words
}

/// What the wrapper reads first on its standard input: each secret's length on a line and
/// its value, then the command's own bytes (`None` when there is no secret: the command's
/// bytes alone, which [`super::RunningCommand`] writes).
fn wrapper_stdin(command: &NodeCommand) -> Option<Vec<u8>> {
    if command.secrets.is_empty() {
        return None;
    }
    let mut data = Vec::new();
    for (_, value) in &command.secrets {
        data.extend(format!("{}\n", value.len()).bytes());
        data.extend(value.as_bytes());
    }
    data.extend(command.stdin.iter().flatten());
    Some(data)
}

/// Whether `line` is srun's own report of how its task ended (`srun: error: gpu07: task 0:
/// Exited with exit code 1`, `…: task 0: Killed`), which restates the exit status.
pub(super) fn is_srun_task_report(line: &[u8]) -> bool {
    let Some(rest) = line.strip_prefix(b"srun: error: ") else {
        return false;
    };
    let rest = String::from_utf8_lossy(rest);
    rest.split_once(": task 0: ")
        .is_some_and(|(node, _)| !node.is_empty() && !node.contains(char::is_whitespace))
}

fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn check_host(host: &str) -> Result<(), ExecError> {
    match host_problem(host) {
        Some(problem) => Err(ExecError::BadHost {
            host: host.to_owned(),
            problem,
        }),
        None => Ok(()),
    }
}

fn check_command(host: &str, command: &NodeCommand) -> Result<(), ExecError> {
    let bad = |detail: String| {
        Err(ExecError::BadCommand {
            host: host.to_owned(),
            detail,
        })
    };
    if command.program.is_empty() {
        return bad("the program name is empty".into());
    }
    for text in std::iter::once(&command.program).chain(&command.args) {
        if text.contains('\0') {
            return bad(format!("{} contains a NUL byte", shell_quote(text)));
        }
    }
    for (name, value) in command.env.iter().chain(&command.secrets) {
        if !is_env_name(name) {
            return bad(format!(
                "{name:?} is not an environment variable name (use letters, digits and _)"
            ));
        }
        if value.contains('\0') {
            return bad(format!("the value of {name} contains a NUL byte"));
        }
    }
    Ok(())
}

/// Whether `host` names this machine: `localhost`, a loopback address, or this machine's
/// host name (with or without its domain). Callers may run such hosts with
/// [`Transport::Local`] instead of ssh.
pub fn is_local_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost")
        || host.starts_with("127.")
        || host == "::1"
        || host == "[::1]"
    {
        return true;
    }
    let Ok(name) = nix::unistd::gethostname() else {
        return false;
    };
    let name = name.to_string_lossy();
    let short = |h: &str| h.split('.').next().unwrap_or(h).to_ascii_lowercase();
    host.eq_ignore_ascii_case(&name)
        || (!host.contains('.') && short(&name) == host.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd() -> NodeCommand {
        NodeCommand::new("python3")
            .arg("probe.py")
            .arg("a b")
            .env("CUDA_VISIBLE_DEVICES", "0,1")
    }

    #[test]
    fn n8_a_secret_reaches_the_command_by_its_standard_input_never_its_command_line() {
        use std::io::{Read, Write};
        let value = "s3cr 'et\nwith a trailing newline\n";
        let command = NodeCommand::new("sh")
            .arg("-c")
            .arg("printf '%s|%s|%s' \"$A\" \"$HF_TOKEN\" \"$(cat)\"")
            .env("A", "1")
            .secret("HF_TOKEN", value)
            .stdin("in");
        let grace = Duration::from_secs(5);
        for transport in [
            Transport::Ssh(SshOptions::default()),
            Transport::Srun(SrunOptions::default()),
        ] {
            let inv = transport.invocation("gpu07", &command, grace).unwrap();
            assert!(inv.args.iter().all(|a| !a.contains("s3cr")), "{inv:?}");
            assert!(inv.env.is_empty());
        }
        let local = Transport::Local.invocation("h", &command, grace).unwrap();
        assert!(local.args.iter().all(|a| !a.contains("s3cr")), "{local:?}");
        // The wrapper itself, run here as an agent runs it.
        let inv = wrapped_here("h", &command, grace).unwrap();
        assert!(inv.args.iter().all(|a| !a.contains("s3cr")), "{inv:?}");
        let mut child = std::process::Command::new(&inv.program)
            .args(&inv.args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(inv.stdin.as_deref().unwrap()).unwrap();
        stdin.flush().unwrap();
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        drop(stdin);
        assert!(child.wait().unwrap().success());
        assert_eq!(out, format!("1|{value}|in"));
    }

    #[test]
    fn local_runs_the_command_itself() {
        let inv = Transport::Local
            .invocation("node-a", &cmd(), Duration::from_secs(5))
            .unwrap();
        assert_eq!(inv.program, "python3");
        assert_eq!(inv.args, ["probe.py", "a b"]);
        assert!(!inv.remote);
        assert_eq!(
            inv.to_shell(),
            "env CUDA_VISIBLE_DEVICES=0,1 python3 probe.py 'a b'"
        );
    }

    #[test]
    fn ssh_passes_one_quoted_string_after_the_host() {
        let ssh = SshOptions {
            port: Some(2222),
            user: Some("me".into()),
            identity: Some("/k/id".into()),
            extra_args: vec!["-o".into(), "StrictHostKeyChecking=no".into()],
            connect_timeout: Duration::from_millis(2500),
            ..SshOptions::default()
        };
        let inv = Transport::Ssh(ssh)
            .invocation("gpu07", &cmd(), Duration::from_secs(5))
            .unwrap();
        assert_eq!(inv.program, "ssh");
        let n = inv.args.len();
        assert_eq!(
            &inv.args[..n - 1],
            [
                "-T",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=3",
                "-o",
                "ServerAliveInterval=15",
                "-p",
                "2222",
                "-l",
                "me",
                "-i",
                "/k/id",
                "-o",
                "StrictHostKeyChecking=no",
                "--",
                "gpu07"
            ]
        );
        let remote = &inv.args[n - 1];
        assert!(remote.starts_with("exec /bin/sh -c '"), "{remote}");
        assert!(
            remote.ends_with(
                " pipette-exec 5 -1 '' 1 'CUDA_VISIBLE_DEVICES=0,1' python3 probe.py 'a b'"
            ),
            "{remote}"
        );
        assert!(inv.remote);
    }

    #[test]
    fn srun_builds_a_one_task_step() {
        let inv = Transport::Srun(SrunOptions::default())
            .invocation(
                "gpu07",
                &cmd().stdin(b"xyz".to_vec()),
                Duration::from_secs(3),
            )
            .unwrap();
        assert_eq!(inv.program, "srun");
        assert_eq!(
            inv.args[..7],
            [
                "--nodes=1",
                "--ntasks=1",
                "--overlap",
                "-w",
                "gpu07",
                "/bin/sh",
                "-c"
            ]
        );
        assert_eq!(
            inv.args[8..],
            [
                "pipette-exec",
                "3",
                "3",
                "",
                "1",
                "CUDA_VISIBLE_DEVICES=0,1",
                "python3",
                "probe.py",
                "a b"
            ]
        );
    }

    #[test]
    fn srun_task_reports_are_told_from_the_commands_own_lines() {
        for line in [
            "srun: error: gpu07: task 0: Exited with exit code 7\n",
            "srun: error: pipette-node: task 0: Killed\n",
            "srun: error: n1: task 0: Segmentation fault (core dumped)",
        ] {
            assert!(is_srun_task_report(line.as_bytes()), "{line}");
        }
        for line in [
            "err\n",
            "srun: error: Unable to create step for job 1: Requested node configuration is not available\n",
            "srun: Force Terminated StepId=1.3\n",
            "my error: gpu07: task 0: Exited with exit code 7\n",
        ] {
            assert!(!is_srun_task_report(line.as_bytes()), "{line}");
        }
    }

    #[test]
    fn option_like_hosts_and_bad_env_names_are_refused() {
        let ssh = Transport::Ssh(SshOptions::default());
        let err = ssh
            .invocation(
                "-oProxyCommand=touch /tmp/x",
                &cmd(),
                Duration::from_secs(1),
            )
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("host name \"-oProxyCommand=touch /tmp/x\" starts with '-'"),
            "{err}"
        );
        let err = Transport::Local
            .invocation("h", &cmd().env("A-B", "1"), Duration::from_secs(1))
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("\"A-B\" is not an environment variable name"),
            "{err}"
        );
    }

    #[test]
    fn loopback_names_are_local() {
        assert!(is_local_host("localhost"));
        assert!(is_local_host("127.0.0.1"));
        assert!(is_local_host("::1"));
        assert!(!is_local_host("gpu07.example.org"));
        let me = nix::unistd::gethostname().unwrap();
        assert!(is_local_host(&me.to_string_lossy()));
    }
}
