//! A command running on a node: the local process that runs it (the command itself, or
//! `ssh`/`srun` in front of the remote wrapper), in a process group of its own, with its
//! output read on threads.
//!
//! Teardown is TERM to the group, a grace period, then KILL to the group, and the process
//! is always reaped. A remote command is torn down first by closing the pipe to its
//! standard input (the remote watchdog then does TERM, grace, KILL over there, see
//! [`super::transport`]) and only then locally. When the command exits by itself, what it
//! left running in its group is killed before the command is reaped, so nothing outlives
//! it and the group id cannot be reused meanwhile.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::error::{agent_failure, ssh_failure};
use super::transport::is_srun_task_report;
use super::{
    ExecError, ExecOptions, Invocation, NodeCommand, Output, Status, Stream, TransportKind,
};

/// How long the local side waits, beyond the grace period, for a remote command to be torn
/// down through its closed standard input before it kills `ssh`/`srun` itself.
pub const REMOTE_TEARDOWN_MARGIN: Duration = Duration::from_secs(3);

/// How long to wait, once the process group is gone, for the output readers to make
/// progress: they are waited for as long as they read (a node that wrote 10 MB just before
/// it exited lost the tail when the readers had 2 s in all), and given up after this long
/// without a byte. Only a process that left the group (its own `setsid`) can hold the pipes
/// open; its output is then cut short rather than waited for.
const PIPE_CLOSE_WAIT: Duration = Duration::from_secs(2);

/// The longest line passed on whole: a longer one is cut there and marked (a 300 MB line
/// without a newline was held whole in memory).
pub const MAX_LINE: usize = 1 << 20;

/// A command started with [`super::spawn`]. Dropping it kills the command (and, for remote
/// transports, tears the remote side down: through the watchdog over ssh, by having `srun`
/// cancel its job step).
pub struct RunningCommand {
    host: String,
    label: String,
    kind: TransportKind,
    remote: bool,
    grace: Duration,
    child: Child,
    pgid: Pid,
    stdin: StdinState,
    stdout: Option<Reader>,
    stderr: Option<Reader>,
    status: Option<Status>,
    started: Instant,
}

enum StdinState {
    Closed,
    /// Held, never read: dropping it closes the pipe.
    Open(#[allow(dead_code)] ChildStdin),
    /// A thread writing [`NodeCommand::stdin`]; it hands the pipe back when done (remote
    /// transports keep it open).
    Writing(JoinHandle<Option<ChildStdin>>),
}

struct Reader {
    captured: Arc<Mutex<Vec<u8>>>,
    done: mpsc::Receiver<()>,
    limit: Option<usize>,
    /// Bytes read so far: whether the reader still makes progress.
    read: Arc<std::sync::atomic::AtomicU64>,
}

impl RunningCommand {
    pub(super) fn start(
        kind: TransportKind,
        host: &str,
        command: &NodeCommand,
        invocation: Invocation,
        options: &ExecOptions,
    ) -> Result<Self, ExecError> {
        let mut process = Command::new(&invocation.program);
        process
            .args(&invocation.args)
            .env_remove(super::agent::SECRET_VARIABLE)
            .env_remove(super::agent::SECRET_FILE_VARIABLE)
            .envs(invocation.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(dir) = &invocation.cwd {
            process.current_dir(dir);
        }
        let wants_stdin = invocation.remote || command.stdin.is_some();
        process.stdin(if wants_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = process.spawn().map_err(|source| ExecError::Start {
            host: host.to_owned(),
            program: invocation.program.clone(),
            hint: start_hint(kind, &source),
            source,
        })?;
        let pgid = Pid::from_raw(child.id() as i32);
        let first = invocation.stdin.as_ref().or(command.stdin.as_ref());
        let stdin = match (child.stdin.take(), first) {
            (Some(pipe), Some(data)) => {
                let data = data.clone();
                let keep = invocation.remote;
                StdinState::Writing(std::thread::spawn(move || {
                    let mut pipe = pipe;
                    // A command that exits without reading is not an error here.
                    let _ = pipe.write_all(&data).and_then(|()| pipe.flush());
                    keep.then_some(pipe)
                }))
            }
            (Some(pipe), None) => StdinState::Open(pipe),
            (None, _) => StdinState::Closed,
        };
        let stdout = child
            .stdout
            .take()
            .map(|pipe| Reader::start(pipe, host, Stream::Stdout, options, None));
        // srun adds a line of its own when the task fails ("srun: error: gpu07: task 0:
        // Exited with exit code 1"), after the command's last words: it would be the line
        // error messages quote, and says nothing the status does not.
        let skip: Option<fn(&[u8]) -> bool> =
            (kind == TransportKind::Srun).then_some(is_srun_task_report);
        let stderr = child
            .stderr
            .take()
            .map(|pipe| Reader::start(pipe, host, Stream::Stderr, options, skip));
        Ok(RunningCommand {
            host: host.to_owned(),
            label: command.label(),
            kind,
            remote: invocation.remote,
            grace: options.grace,
            child,
            pgid,
            stdin,
            stdout,
            stderr,
            status: None,
            started: Instant::now(),
        })
    }

    /// The host the command runs on.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The pid of the local process (the command, or `ssh`/`srun`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The local process group, which the local process leads.
    pub fn pgid(&self) -> i32 {
        self.pgid.as_raw()
    }

    pub fn transport(&self) -> TransportKind {
        self.kind
    }

    /// How long ago the command was started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The exit status if the command has finished, without blocking.
    pub fn try_status(&mut self) -> Result<Option<Status>, ExecError> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(pid), flags) {
            Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => Ok(None),
            Ok(_) => {
                // Exited, not yet reaped: the group id is still ours, so kill what the
                // command left behind in it, then reap.
                let _ = killpg(self.pgid, Signal::SIGKILL);
                let status = self.child.wait().map_err(|e| self.lost(e.to_string()))?;
                let status = match (status.code(), status.signal()) {
                    (Some(code), _) => Status::Exited(code),
                    (None, Some(signal)) => Status::Signaled(signal),
                    (None, None) => Status::Exited(-1),
                };
                self.status = Some(status);
                self.close_stdin();
                Ok(Some(status))
            }
            Err(e) => Err(self.lost(e.desc().to_owned())),
        }
    }

    /// Blocks until the command exits or `deadline` passes (`None`: the deadline passed).
    pub fn wait_until(&mut self, deadline: Option<Instant>) -> Result<Option<Status>, ExecError> {
        let mut pause = Duration::from_millis(2);
        loop {
            if let Some(status) = self.try_status()? {
                return Ok(Some(status));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let mut sleep = pause;
            if let Some(d) = deadline {
                sleep = sleep.min(d - now);
            }
            std::thread::sleep(sleep);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Blocks until the command exits.
    pub fn wait(&mut self) -> Result<Status, ExecError> {
        match self.wait_until(None)? {
            Some(status) => Ok(status),
            None => Err(self.lost("wait ended without a status".into())),
        }
    }

    /// Sends `signal` to the local process group. For ssh and srun that is the client, not
    /// the remote command: use [`RunningCommand::terminate`] to stop a remote command.
    pub fn signal(&self, signal: Signal) -> Result<(), ExecError> {
        if self.status.is_some() {
            return Ok(());
        }
        match killpg(self.pgid, signal) {
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(e) => Err(self.lost(format!("cannot send {signal}: {}", e.desc()))),
        }
    }

    /// Stops the command and everything it started: for a remote command, close its
    /// standard input and give the remote watchdog the grace period (plus
    /// [`REMOTE_TEARDOWN_MARGIN`]); then TERM the local group, wait the grace period, KILL
    /// it, and reap. Returns the exit status (a signal, usually).
    pub fn terminate(&mut self) -> Result<Status, ExecError> {
        if let Some(status) = self.try_status()? {
            return Ok(status);
        }
        if self.remote && self.close_stdin() {
            let deadline = Instant::now() + self.grace + REMOTE_TEARDOWN_MARGIN;
            if let Some(status) = self.wait_until(Some(deadline))? {
                return Ok(status);
            }
        }
        self.signal(Signal::SIGTERM)?;
        if let Some(status) = self.wait_until(Some(Instant::now() + self.grace))? {
            return Ok(status);
        }
        self.signal(Signal::SIGKILL)?;
        self.wait()
    }

    /// What the command wrote so far (the captured part).
    pub fn output_so_far(&self) -> (Vec<u8>, Vec<u8>) {
        (
            self.stdout
                .as_ref()
                .map(Reader::snapshot)
                .unwrap_or_default(),
            self.stderr
                .as_ref()
                .map(Reader::snapshot)
                .unwrap_or_default(),
        )
    }

    /// Waits for the command to exit (it is not stopped) and returns its output. An `ssh`
    /// that could not reach its host is [`ExecError::Unreachable`].
    pub fn into_output(mut self) -> Result<Output, ExecError> {
        let status = self.wait()?;
        let output = self.collect(status);
        if output.status == Status::Exited(255) {
            let failure = match self.kind {
                TransportKind::Ssh => ssh_failure(&output.stderr, &self.host),
                TransportKind::Agent => agent_failure(&output.stderr),
                _ => None,
            };
            if let Some((detail, hint)) = failure {
                return Err(ExecError::Unreachable {
                    host: self.host.clone(),
                    transport: self.kind,
                    detail,
                    hint,
                });
            }
        }
        Ok(output)
    }

    /// A short description of the command, for messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Once the command has ended: waits until everything it wrote has been read and
    /// passed on (to the sink: the terminal and the node's log), so that the tail is not
    /// lost when its success is recorded. A no-op while it runs.
    pub fn drain(&mut self) {
        if let Some(status) = self.status {
            self.collect(status);
        }
    }

    /// Joins the readers (while they make progress) and takes the captured output.
    pub(super) fn collect(&mut self, status: Status) -> Output {
        let take = |reader: Option<Reader>| reader.map(Reader::finish).unwrap_or_default();
        let stdout = take(self.stdout.take());
        let stderr = take(self.stderr.take());
        Output {
            status,
            stdout,
            stderr,
        }
    }

    /// Closes our end of the command's standard input; false when it cannot be closed
    /// (a writer thread still blocked on it).
    fn close_stdin(&mut self) -> bool {
        match std::mem::replace(&mut self.stdin, StdinState::Closed) {
            StdinState::Closed | StdinState::Open(_) => true,
            StdinState::Writing(handle) if handle.is_finished() => {
                drop(handle.join());
                true
            }
            StdinState::Writing(handle) => {
                self.stdin = StdinState::Writing(handle);
                false
            }
        }
    }

    fn lost(&self, detail: String) -> ExecError {
        ExecError::Lost {
            host: self.host.clone(),
            command: self.label.clone(),
            detail,
        }
    }
}

impl Drop for RunningCommand {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        // Closing stdin starts the remote watchdog; the local group goes at once.
        self.close_stdin();
        if self.kind == TransportKind::Srun {
            // Unlike ssh's connection, a killed srun leaves its job step running (stdin is
            // never closed there). TERM makes srun cancel the step, which Slurm then kills
            // whole; KILL only when srun does not exit in time.
            let _ = killpg(self.pgid, Signal::SIGTERM);
            let deadline = Instant::now() + self.grace + REMOTE_TEARDOWN_MARGIN;
            if let Ok(Some(_)) = self.wait_until(Some(deadline)) {
                return;
            }
        }
        let _ = killpg(self.pgid, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl std::fmt::Debug for RunningCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningCommand")
            .field("host", &self.host)
            .field("command", &self.label)
            .field("transport", &self.kind)
            .field("pid", &self.child.id())
            .field("status", &self.status)
            .finish()
    }
}

impl Reader {
    fn start(
        pipe: impl Read + Send + 'static,
        host: &str,
        stream: Stream,
        options: &ExecOptions,
        skip: Option<fn(&[u8]) -> bool>,
    ) -> Self {
        let captured = Arc::new(Mutex::new(Vec::new()));
        let (done_tx, done) = mpsc::channel();
        let limit = options.capture_limit;
        let sink = options.sink.clone();
        let host = host.to_owned();
        let buffer = Arc::clone(&captured);
        let read = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = Arc::clone(&read);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(pipe);
            let mut line = Vec::new();
            loop {
                line.clear();
                match read_line(&mut reader, &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        counter.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                if skip.is_some_and(|skip| skip(&line)) {
                    continue;
                }
                if let Some(sink) = &sink {
                    sink.raw_line(&host, stream, &line);
                }
                let mut buf = buffer.lock().unwrap_or_else(|p| p.into_inner());
                buf.extend_from_slice(&line);
                if let Some(limit) = limit {
                    if buf.len() > limit.saturating_mul(2).max(4096) {
                        let cut = buf.len() - limit;
                        buf.drain(..cut);
                    }
                }
            }
            let _ = done_tx.send(());
        });
        Reader {
            captured,
            done,
            limit,
            read,
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        let buf = self.captured.lock().unwrap_or_else(|p| p.into_inner());
        tail(&buf, self.limit).to_vec()
    }

    /// Waits for the reader to reach the end of its pipe, as long as it keeps reading.
    fn finish(self) -> Vec<u8> {
        let progress = || self.read.load(std::sync::atomic::Ordering::Relaxed);
        let mut seen = progress();
        while let Err(mpsc::RecvTimeoutError::Timeout) = self.done.recv_timeout(PIPE_CLOSE_WAIT) {
            let now = progress();
            if now == seen {
                break;
            }
            seen = now;
        }
        self.snapshot()
    }
}

/// One line of `reader` into `line` (with its newline), at most [`MAX_LINE`] bytes of it:
/// the rest of a longer line is read and dropped, and the line says so. Returns the bytes
/// read (0 at the end).
fn read_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut n = reader
        .by_ref()
        .take(MAX_LINE as u64)
        .read_until(b'\n', line)?;
    if line.len() < MAX_LINE || line.ends_with(b"\n") {
        return Ok(n);
    }
    let mut dropped = 0usize;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        match buf.iter().position(|b| *b == b'\n') {
            Some(at) => {
                reader.consume(at + 1);
                dropped += at;
                n += at + 1;
                break;
            }
            None => {
                let len = buf.len();
                reader.consume(len);
                dropped += len;
                n += len;
            }
        }
    }
    line.extend_from_slice(
        format!(" [pipette-run: line cut at {MAX_LINE} bytes, {dropped} more dropped]\n")
            .as_bytes(),
    );
    Ok(n)
}

fn tail(buf: &[u8], limit: Option<usize>) -> &[u8] {
    match limit {
        Some(n) if buf.len() > n => &buf[buf.len() - n..],
        _ => buf,
    }
}

fn start_hint(kind: TransportKind, error: &std::io::Error) -> String {
    let missing = error.kind() == std::io::ErrorKind::NotFound;
    match (kind, missing) {
        (TransportKind::Ssh, true) => "install the OpenSSH client (ssh), or put it on PATH".into(),
        (TransportKind::Srun, true) => {
            "srun is Slurm's; run inside a Slurm allocation, or use another transport".into()
        }
        (TransportKind::Agent, true) => {
            "the agent transport runs pipette-run itself as its relay; check that its binary is still there".into()
        }
        (TransportKind::Local, true) => {
            "check the program's path, or install it on this machine".into()
        }
        (_, false) => "check the program's permissions and the machine's process limits".into(),
    }
}
