//! The command server every copy of pipette-run runs: it accepts authenticated command
//! connections (see [`super::wire`]) and runs each command here, under the remote wrapper
//! whose standard input it holds (see [`super`] for why that tears everything down whatever
//! way we go), streaming its output back and reporting its exit code.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::refusals::{Handshakes, Refusals, Slot};
use super::wire::{self, Purpose, Sender};
use super::{CommandMessage, JobSecret, HEARTBEAT};
use crate::exec::transport::wrapped_here;
use crate::exec::{
    ExecOptions, NodeCommand, OutputSink, RunningCommand, Status, Stream, TransportKind,
};

/// Where the server's notes go (a connection refused, a command that could not start).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// A [`Log`] that gathers its lines, for tests.
#[cfg(test)]
pub(crate) fn collecting() -> (Log, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    let log: Log = Arc::new(move |line: &str| sink.lock().unwrap().push(line.to_string()));
    (log, lines)
}

/// How often the accept loop and the command watchers look at the stop flag.
const POLL: Duration = Duration::from_millis(25);

/// A running command server; [`CommandServer::shutdown`] (or dropping it) stops every
/// command it runs and waits for them.
pub struct CommandServer {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    workers: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl CommandServer {
    /// Listens on `ip` only (a port the system chooses) for the job whose secret is `secret`.
    pub fn start(ip: IpAddr, secret: JobSecret, log: Log) -> std::io::Result<CommandServer> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let workers = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let (stopping, workers) = (Arc::clone(&stopping), Arc::clone(&workers));
            std::thread::spawn(move || accept_loop(listener, secret, log, stopping, workers))
        };
        Ok(CommandServer {
            addr,
            stopping,
            accept: Some(accept),
            workers,
        })
    }

    /// The address the leader connects to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening, stops every command still running (TERM, the grace period it was
    /// given, KILL) and waits for them.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|p| p.into_inner()));
        for worker in workers {
            let _ = worker.join();
        }
    }
}

impl Drop for CommandServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(
    listener: TcpListener,
    secret: JobSecret,
    log: Log,
    stopping: Arc<AtomicBool>,
    workers: Arc<Mutex<Vec<JoinHandle<()>>>>,
) {
    let handshakes = Handshakes::default();
    let refusals = Refusals::new("a command connection", "nothing was run", Arc::clone(&log));
    while !stopping.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let Some((stream, slot)) = handshakes.admit(stream, peer, &refusals) else {
                    continue;
                };
                let (secret, log, stopping, refusals) = (
                    secret.clone(),
                    Arc::clone(&log),
                    Arc::clone(&stopping),
                    Arc::clone(&refusals),
                );
                let worker = std::thread::spawn(move || {
                    serve(stream, peer, slot, &secret, &refusals, &log, &stopping)
                });
                let mut workers = workers.lock().unwrap_or_else(|p| p.into_inner());
                workers.retain(|w| !w.is_finished());
                workers.push(worker);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                refusals.tick();
                std::thread::sleep(POLL)
            }
            Err(e) => {
                log(&format!("accepting a command connection failed: {e}"));
                std::thread::sleep(POLL);
            }
        }
    }
}

/// One command connection: authenticate, take the order, run it to its end or until told
/// to stop (or the connection drops, or the server stops), report the exit code.
fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    handshake: Slot,
    secret: &JobSecret,
    refusals: &Refusals,
    log: &Log,
    stopping: &AtomicBool,
) {
    let _ = stream.set_nonblocking(false);
    let accepted = wire::accept(stream, secret, Purpose::Command);
    drop(handshake);
    let mut channel = match accepted {
        Ok(channel) => channel,
        Err(e) => return refusals.refused(peer, &e.to_string()),
    };
    let (host, grace, command) = match channel.recv::<CommandMessage>() {
        Ok(Some(CommandMessage::Run {
            host,
            grace_ms,
            command,
        })) => (host, Duration::from_millis(grace_ms), command),
        _ => return,
    };
    let sender = channel.sender();
    // The leader's stop, or the connection dropping: either way the command must go.
    let (stop_tx, stop_rx) = mpsc::channel();
    std::thread::spawn(move || loop {
        match channel.recv::<CommandMessage>() {
            Ok(Some(CommandMessage::Stop)) | Ok(None) | Err(_) => {
                let _ = stop_tx.send(());
                return;
            }
            Ok(Some(_)) => {}
        }
    });
    let code = run(&host, &command, grace, &sender, &stop_rx, stopping).unwrap_or_else(|e| {
        send_line(&sender, Stream::Stderr, e.as_bytes());
        log(&e);
        125
    });
    let _ = sender.send(&CommandMessage::Exit { code });
    sender.finish();
}

/// Runs `command` here until it ends or a stop comes; returns its exit code as the remote
/// wrapper reports it (128 + N for signal N).
fn run(
    host: &str,
    command: &NodeCommand,
    grace: Duration,
    sender: &Sender,
    stop: &mpsc::Receiver<()>,
    stopping: &AtomicBool,
) -> Result<i32, String> {
    let lines = sender.clone();
    let options = ExecOptions {
        grace,
        // Every line is sent as it comes; what is kept here only bounds memory.
        capture_limit: Some(4096),
        sink: Some(Arc::new(Relayed(lines))),
    };
    let invocation = wrapped_here(host, command, grace).map_err(|e| e.to_string())?;
    let mut running =
        RunningCommand::start(TransportKind::Local, host, command, invocation, &options)
            .map_err(|e| e.to_string())?;
    let mut last_word = Instant::now();
    let status = loop {
        if last_word.elapsed() >= HEARTBEAT {
            let _ = sender.send(&CommandMessage::Alive);
            last_word = Instant::now();
        }
        let deadline = Instant::now() + POLL * 2;
        if let Some(status) = running
            .wait_until(Some(deadline))
            .map_err(|e| e.to_string())?
        {
            break status;
        }
        let stop_now = !matches!(stop.try_recv(), Err(mpsc::TryRecvError::Empty));
        if stop_now || stopping.load(Ordering::SeqCst) {
            break running.terminate().map_err(|e| e.to_string())?;
        }
    };
    // Wait for the output readers, so every line goes out before the exit code.
    running.collect(status);
    Ok(match status {
        Status::Exited(code) => code,
        Status::Signaled(signal) => 128 + signal,
    })
}

/// Sends each line on as the command wrote it, line end included.
struct Relayed(Sender);

impl OutputSink for Relayed {
    fn line(&self, _: &str, stream: Stream, line: &[u8]) {
        let mut raw = line.to_vec();
        raw.push(b'\n');
        send_line(&self.0, stream, &raw);
    }

    fn raw_line(&self, _: &str, stream: Stream, raw: &[u8]) {
        send_line(&self.0, stream, raw);
    }
}

fn send_line(sender: &Sender, stream: Stream, line: &[u8]) {
    let _ = sender.send(&CommandMessage::Output {
        stderr: stream == Stream::Stderr,
        line: wire::to_hex(line),
    });
}
