//! Running commands on nodes: the one I/O seam profiling and launching share.
//!
//! A [`NodeCommand`] (program, arguments, environment, working directory, optional bytes
//! for standard input) runs on a host through a [`Transport`]: on this machine
//! ([`Transport::Local`], also how tests run several "nodes" as local processes), through
//! the system `ssh` client, or as a Slurm job step (`srun`). [`run`] runs one to completion
//! under a time limit; [`spawn`] starts a long-running one and hands back a
//! [`RunningCommand`] to watch, signal or tear down.
//!
//! Guarantees:
//! - every argument reaches the node byte for byte: remote commands are built from
//!   [`shell_quote`]d words only, and host names that could pass for options are refused;
//! - nothing is leaked: each command runs in a process group of its own (on the node too,
//!   see [`transport`]), is stopped with TERM, a grace period, then KILL, and is reaped;
//!   what a command leaves running in its group when it exits is killed;
//! - failures are [`ExecError`]s naming the host and what to do; an unreachable node is
//!   [`ExecError::Unreachable`].
//!
//! Owns processes and transports; knows nothing of torchrun, profiles or plans.

pub mod agent;
mod error;
pub mod group;
mod process;
mod quote;
pub mod signals;
pub mod staged;
pub mod transport;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use error::{format_duration, ExecError};
pub use process::{RunningCommand, REMOTE_TEARDOWN_MARGIN};
pub use quote::{
    host_key, host_problem, is_env_name, same_host, shell_join, shell_quote, single_quote,
    single_quote_join, split_words,
};
pub use transport::{is_local_host, Invocation, SrunOptions, SshOptions, Transport, TransportKind};

/// The grace period between TERM and KILL unless [`ExecOptions::grace`] says otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// A command to run on a node. Serialisable: the agent transport sends it as data.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct NodeCommand {
    /// The program, looked up on the node's PATH unless it contains a `/`.
    pub program: String,
    pub args: Vec<String>,
    /// Set on top of the environment the command gets on the node (for ssh: the remote
    /// login environment, not ours).
    pub env: Vec<(String, String)>,
    /// Set like `env`, but never on a command line (a node's `ps` shows every user the
    /// command lines, not the environments): credentials. A remote node's wrapper reads
    /// them from its standard input ([`transport::REMOTE_WRAPPER`]).
    #[serde(default)]
    pub secrets: Vec<(String, String)>,
    /// The working directory on the node (default: the current one here, the login
    /// directory over ssh, srun's default for srun).
    pub cwd: Option<PathBuf>,
    /// Bytes for the command's standard input, which is then closed (local) or ends there
    /// (remote). `None`: standard input is empty.
    pub stdin: Option<Vec<u8>>,
}

impl NodeCommand {
    pub fn new(program: impl Into<String>) -> Self {
        NodeCommand {
            program: program.into(),
            ..NodeCommand::default()
        }
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// A variable whose value is a credential (see [`NodeCommand::secrets`]).
    pub fn secret(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.secrets.push((name.into(), value.into()));
        self
    }

    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(data.into());
        self
    }

    /// The command line, shortened for messages: `` `python3 probe.py --sizes …` ``.
    pub fn label(&self) -> String {
        let line = shell_join(std::iter::once(&self.program).chain(&self.args));
        const MAX: usize = 72;
        if line.chars().count() <= MAX {
            format!("`{line}`")
        } else {
            let cut: String = line.chars().take(MAX - 1).collect();
            format!("`{cut}…`")
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// It exited with this code. A remote command ended by a signal exits with 128 + the
    /// signal number (as the wrapper's shell reports it).
    Exited(i32),
    /// The local process was ended by this signal.
    Signaled(i32),
}

impl Status {
    pub fn success(self) -> bool {
        self == Status::Exited(0)
    }

    /// The exit code, if it exited.
    pub fn code(self) -> Option<i32> {
        match self {
            Status::Exited(code) => Some(code),
            Status::Signaled(_) => None,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::Exited(code) => write!(f, "exit code {code}"),
            Status::Signaled(signal) => match nix::sys::signal::Signal::try_from(*signal) {
                Ok(s) => write!(f, "signal {signal} ({s})"),
                Err(_) => write!(f, "signal {signal}"),
            },
        }
    }
}

/// What a finished command wrote, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub status: Status,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Output {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// The last non-blank line of standard error (or of standard output when standard error
    /// is empty), for one-line messages.
    pub fn last_line(&self) -> Option<String> {
        [&self.stderr, &self.stdout].into_iter().find_map(|bytes| {
            String::from_utf8_lossy(bytes)
                .lines()
                .rev()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .map(str::to_owned)
        })
    }
}

/// Which output stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Receives a running command's output line by line, as it comes (on the reader threads),
/// without the line end. For prefixed logs and progress.
pub trait OutputSink: Send + Sync {
    fn line(&self, host: &str, stream: Stream, line: &[u8]);

    /// The line as the command wrote it: with its line end (`\n`, `\r\n`), or none for
    /// the last bytes before the stream ended. A sink that passes output on byte for byte
    /// (the agent transport) takes this; the default strips the end and calls
    /// [`OutputSink::line`].
    fn raw_line(&self, host: &str, stream: Stream, raw: &[u8]) {
        let text = raw.strip_suffix(b"\n").unwrap_or(raw);
        self.line(host, stream, text.strip_suffix(b"\r").unwrap_or(text));
    }
}

impl<F: Fn(&str, Stream, &[u8]) + Send + Sync> OutputSink for F {
    fn line(&self, host: &str, stream: Stream, line: &[u8]) {
        self(host, stream, line)
    }
}

/// How commands are run and torn down.
#[derive(Clone)]
pub struct ExecOptions {
    /// Between TERM and KILL, here and (through the watchdog) on the node.
    pub grace: Duration,
    /// Keep only the last this many bytes of each stream (`None`: keep everything).
    pub capture_limit: Option<usize>,
    /// Also hand every line to this sink.
    pub sink: Option<Arc<dyn OutputSink>>,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            grace: DEFAULT_GRACE,
            capture_limit: None,
            sink: None,
        }
    }
}

impl std::fmt::Debug for ExecOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecOptions")
            .field("grace", &self.grace)
            .field("capture_limit", &self.capture_limit)
            .field("sink", &self.sink.as_ref().map(|_| "…"))
            .finish()
    }
}

/// Runs `command` on `host` to completion, stopping it (its whole process tree, on the node
/// too) when it runs past `timeout`.
pub fn run(
    transport: &Transport,
    host: &str,
    command: &NodeCommand,
    timeout: Duration,
) -> Result<Output, ExecError> {
    run_with(transport, host, command, timeout, &ExecOptions::default())
}

/// [`run`] with explicit options.
pub fn run_with(
    transport: &Transport,
    host: &str,
    command: &NodeCommand,
    timeout: Duration,
    options: &ExecOptions,
) -> Result<Output, ExecError> {
    let mut running = spawn_with(transport, host, command, options)?;
    let deadline = Instant::now() + timeout;
    if running.wait_until(Some(deadline))?.is_none() {
        let status = running.terminate()?;
        let output = running.collect(status);
        return Err(ExecError::TimedOut {
            host: host.to_owned(),
            command: command.label(),
            limit: timeout,
            output: Box::new(output),
        });
    }
    running.into_output()
}

/// Starts `command` on `host` and returns at once.
pub fn spawn(
    transport: &Transport,
    host: &str,
    command: &NodeCommand,
) -> Result<RunningCommand, ExecError> {
    spawn_with(transport, host, command, &ExecOptions::default())
}

/// [`spawn`] with explicit options.
pub fn spawn_with(
    transport: &Transport,
    host: &str,
    command: &NodeCommand,
    options: &ExecOptions,
) -> Result<RunningCommand, ExecError> {
    let invocation = transport.invocation(host, command, options.grace)?;
    RunningCommand::start(transport.kind(), host, command, invocation, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> NodeCommand {
        NodeCommand::new("sh").arg("-c").arg(script)
    }

    #[test]
    fn runs_locally_with_env_cwd_and_stdin() {
        let dir = std::env::temp_dir();
        let out = run(
            &Transport::Local,
            "node-a",
            &sh("printf '%s|%s|' \"$GREETING\" \"$(pwd)\"; cat")
                .env("GREETING", "hello world")
                .cwd(&dir)
                .stdin(b"from stdin".to_vec()),
            Duration::from_secs(10),
        )
        .unwrap();
        assert!(out.status.success());
        let dir = dir.canonicalize().unwrap();
        assert_eq!(
            out.stdout_text(),
            format!("hello world|{}|from stdin", dir.display())
        );
    }

    #[test]
    fn exit_codes_and_signals_are_reported() {
        let out = run(
            &Transport::Local,
            "h",
            &sh("echo oops >&2; exit 3"),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(out.status, Status::Exited(3));
        assert_eq!(out.last_line().as_deref(), Some("oops"));
        let out = run(
            &Transport::Local,
            "h",
            &sh("kill -s KILL $$"),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(out.status, Status::Signaled(9));
        assert_eq!(out.status.to_string(), "signal 9 (SIGKILL)");
    }

    #[test]
    fn a_missing_program_says_so() {
        let err = run(
            &Transport::Local,
            "node-a",
            &NodeCommand::new("/nonexistent/pipette-probe"),
            Duration::from_secs(5),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("cannot start /nonexistent/pipette-probe for node-a: "),
            "{text}"
        );
        assert!(
            text.ends_with("(check the program's path, or install it on this machine)"),
            "{text}"
        );
    }

    #[test]
    fn timeout_stops_the_command_and_keeps_its_output() {
        let options = ExecOptions {
            grace: Duration::from_millis(300),
            ..ExecOptions::default()
        };
        let start = Instant::now();
        let err = run_with(
            &Transport::Local,
            "node-a",
            &sh("echo started; exec sleep 30"),
            Duration::from_millis(500),
            &options,
        )
        .unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        let ExecError::TimedOut { output, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(output.stdout_text(), "started\n");
        assert_eq!(output.status, Status::Signaled(15));
        assert!(
            err.to_string().starts_with(
                "`sh -c 'echo started; exec sleep 30'` on node-a did not finish within 500 ms"
            ),
            "{err}"
        );
    }

    #[test]
    fn lines_reach_the_sink_as_they_come() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen2 = Arc::clone(&seen);
        let options = ExecOptions {
            sink: Some(Arc::new(move |host: &str, stream: Stream, line: &[u8]| {
                seen2.lock().unwrap().push(format!(
                    "{host} {stream:?} {}",
                    String::from_utf8_lossy(line)
                ));
            })),
            capture_limit: Some(4),
            ..ExecOptions::default()
        };
        let out = run_with(
            &Transport::Local,
            "n1",
            &sh("echo one; echo two >&2; printf 'three\\r\\n'"),
            Duration::from_secs(10),
            &options,
        )
        .unwrap();
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        assert_eq!(seen, ["n1 Stderr two", "n1 Stdout one", "n1 Stdout three"]);
        assert_eq!(out.stdout, b"ee\r\n", "only the last 4 bytes are kept");
    }

    #[test]
    fn labels_are_short_and_quoted() {
        assert_eq!(sh("echo hi").label(), "`sh -c 'echo hi'`");
        let long = NodeCommand::new("python3").args((0..40).map(|i| format!("arg{i}")));
        let label = long.label();
        assert!(
            label.ends_with("…`") && label.chars().count() <= 74,
            "{label}"
        );
    }
}
