//! One copy of pipette-run per node, as one job: the leader gathers the other copies
//! ([`Fleet::gather`]), and each of them follows it ([`follow`]).
//!
//! Every copy runs a command server ([`exec::agent::CommandServer`]). The agents connect
//! to the leader's control port, authenticate (the job secret, see [`exec::agent::wire`])
//! and join with their node rank, their node's name and their command server's address.
//! Once every node rank has joined, the leader has the job's nodes ([`Fleet::spec`]) and a
//! transport that reaches each of them through its own copy ([`Fleet::transport`]): the
//! leader then discovers, profiles, trials, plans, launches and supervises exactly as a
//! single driver does, and at the end tells every agent the job's exit code
//! ([`Fleet::end`]), with which they exit.
//!
//! The control connection is the agents' lifeline: when it drops without an end (the
//! leader died, or its node did), or the leader says nothing for [`SILENCE`] (it speaks
//! every [`HEARTBEAT`]), an agent stops every command it runs (TERM, the grace period, KILL)
//! and exits with [`LOST_LEADER`]. When an agent dies, its commands are torn
//! down by the wrapper's watchdog on its node, and the leader sees that node's commands
//! fail as an unreachable node, which the supervisor re-plans around as it does for ssh.
//!
//! Owns the join and the end; knows nothing of plans.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cluster::copies::{Copies, Pattern};
use crate::cluster::{ClusterSpec, Node, NodeSource, Slots};
use crate::exec::agent::wire::{self, Channel, HandshakeError, Sender};
use crate::exec::agent::{
    AgentNode, AgentOptions, CommandServer, Handshakes, JobSecret, Purpose, Refusals, HEARTBEAT,
    SILENCE,
};
use crate::exec::Transport;
use crate::exit::ExitCode;

/// An agent's exit code when it lost its leader (the leader or its node died).
pub const LOST_LEADER: ExitCode = ExitCode::Unreachable;

/// Where notes for the user go (one line each, without a prefix): the command server's
/// [`Log`](crate::exec::agent::Log), so one sink serves both.
pub use crate::exec::agent::Log;

/// How the copies find and trust each other.
#[derive(Debug, Clone)]
pub struct PeerOptions {
    pub secret: JobSecret,
    /// The leader's control port.
    pub port: u16,
    /// How long the leader waits for every agent, and an agent tries to reach the leader.
    pub join_timeout: Duration,
    /// How often a copy still waiting says so ([`WAITING_NOTE`]).
    pub waiting_note: Duration,
    /// The relay program (this binary), for [`Fleet::transport`].
    pub relay: PathBuf,
}

/// torchrun's default rendezvous join timeout (600 s, `join_timeout` in
/// torch.distributed.elastic's rendezvous), so the copies wait for each other as long as
/// torchrun's agents would.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(600);

/// How often a copy that waits (the leader for its agents, an agent for its leader) says
/// whom it awaits and how long it will still wait: a missing copy was a silent 600 s wait.
pub const WAITING_NOTE: Duration = Duration::from_secs(20);

/// Why the copies could not become one job.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("cannot listen on {addr} for the other copies of pipette-run: {error} (choose another port with PIPETTE_AGENT_PORT)")]
    Listen { addr: String, error: std::io::Error },
    #[error("cannot resolve the leader's address {host:?}: {detail} (check --master-addr / PET_MASTER_ADDR)")]
    Resolve { host: String, detail: String },
    #[error(
        "only {joined} of the {count} copies of pipette-run joined within {} (missing node ranks: {missing}; check that those nodes started pipette-run, with the same PIPETTE_JOB_SECRET and the same control port {port} (PIPETTE_AGENT_PORT, else the master port + 1), that they reach this node on that port, and their logs)",
        crate::exec::format_duration(*.waited)
    )]
    Incomplete {
        joined: u32,
        count: u32,
        missing: String,
        waited: Duration,
        port: u16,
    },
    #[error("cannot reach the leader at {addr} within {}: {detail} (check that node rank 0 runs pipette-run, that --master-addr / PET_MASTER_ADDR names it, and that every copy has the same control port, PIPETTE_AGENT_PORT, else the master port + 1)", crate::exec::format_duration(*.waited))]
    NoLeader {
        addr: String,
        waited: Duration,
        detail: String,
    },
    #[error("the leader at {addr} did not accept this copy: {reason}")]
    Refused { addr: String, reason: String },
    #[error("cannot serve commands on {ip}: {error}")]
    Serve { ip: IpAddr, error: std::io::Error },
}

/// The control connection's messages.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Control {
    /// Agent → leader.
    Join {
        rank: u32,
        host: String,
        command_port: u16,
    },
    /// Leader → agent: joined; `leader` is the leader's node.
    Welcome { leader: String },
    /// Leader → agent: not joined.
    Refused { reason: String },
    /// Leader → agent: the job is over; exit with `code`.
    End { code: i32 },
    /// Leader → agent: still here (every [`HEARTBEAT`]).
    Alive,
}

/// A copy of pipette-run that joined: one node of the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub rank: u32,
    /// The node's name as the plan and the other nodes use it.
    pub host: String,
    /// `HOST:PORT` of its command server.
    pub addr: String,
}

/// The leader's view of the job's copies, in node-rank order (the leader first).
pub struct Fleet {
    members: Vec<Member>,
    pattern: Pattern,
    controls: Vec<Sender>,
    server: CommandServer,
    options: PeerOptions,
    /// Stops the heartbeat thread (dropped or sent to).
    heartbeat: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
    /// Set once the job ends: agents leaving then is expected, not news.
    ending: Arc<AtomicBool>,
}

impl Fleet {
    /// Listens on the leader's control port, serves this node's commands, and waits until
    /// every node rank has joined (or the join timeout passes). Connections without the
    /// job's secret, and ranks that are out of range or taken, are refused and logged.
    pub fn gather(copies: &Copies, options: &PeerOptions, log: &Log) -> Result<Fleet, PeerError> {
        let leader_ip = resolve(&copies.leader)?;
        let listener = listen(leader_ip, options.port, log)?;
        let host = copies.name.clone().unwrap_or_else(|| copies.leader.clone());
        let own_ip = copies
            .name
            .as_deref()
            .and_then(|n| resolve(n).ok())
            .unwrap_or(leader_ip);
        let server = serve(own_ip, &options.secret, log)?;
        let mut members = vec![Member {
            rank: 0,
            host: host.clone(),
            addr: join_addr(&host, server.addr().port()),
        }];
        let mut controls = Vec::new();
        let ending = Arc::new(AtomicBool::new(false));
        log(&format!(
            "leading {} copies of pipette-run ({}); waiting for node ranks 1-{} on {}",
            copies.count,
            copies.pattern.describe(),
            copies.count - 1,
            listener
                .local_addr()
                .map_or(String::new(), |a| a.to_string()),
        ));
        let (tx, rx) = mpsc::channel();
        let secret = options.secret.clone();
        listener
            .set_nonblocking(true)
            .map_err(|error| PeerError::Listen {
                addr: format!("{leader_ip}:{}", options.port),
                error,
            })?;
        let mut waiting = Waiting::new(options);
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        // Handshakes under way and refusals logged, both bounded: a flood of connections
        // started one thread and logged one line each, without limit.
        let handshakes = Handshakes::default();
        let refusals = Refusals::new(
            "a copy of pipette-run connecting",
            "it runs nothing",
            Arc::clone(log),
        );
        let acceptor = {
            let refusals = Arc::clone(&refusals);
            std::thread::spawn(move || {
                while stop_rx.try_recv().is_err() {
                    match listener.accept() {
                        Ok((stream, peer)) => {
                            let Some((stream, slot)) = handshakes.admit(stream, peer, &refusals)
                            else {
                                continue;
                            };
                            let (secret, tx, refusals) =
                                (secret.clone(), tx.clone(), Arc::clone(&refusals));
                            std::thread::spawn(move || {
                                let _ = stream.set_nonblocking(false);
                                let accepted = wire::accept(stream, &secret, Purpose::Control);
                                drop(slot);
                                match accepted {
                                    Ok(channel) => {
                                        let _ = tx.send((peer, channel));
                                    }
                                    Err(e) => refusals.refused(peer, &e.to_string()),
                                }
                            });
                        }
                        Err(_) => {
                            refusals.tick();
                            std::thread::sleep(Duration::from_millis(25));
                        }
                    }
                }
            })
        };
        while members.len() < copies.count as usize {
            let now = Instant::now();
            let going_on = waiting.goes_on(now, |waited, left| {
                log(&format!(
                    "still waiting for node ranks {} ({} of {} copies joined) after {waited}; giving up in {left}",
                    missing_ranks(&members, copies.count),
                    members.len(),
                    copies.count,
                ))
            });
            if !going_on {
                break;
            }
            let wait = waiting.next().saturating_duration_since(now);
            let (peer, mut channel) = match rx.recv_timeout(wait) {
                Ok(joining) => joining,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            let _ = channel.set_read_timeout(Some(wire::HANDSHAKE_TIMEOUT));
            let joined = match channel.recv::<Control>() {
                Ok(Some(Control::Join {
                    rank,
                    host,
                    command_port,
                })) => (rank, host, command_port),
                _ => continue,
            };
            let (rank, name, port) = joined;
            let refusal = if rank == 0 || rank >= copies.count {
                Some(format!("node rank {rank} is not in 1-{}", copies.count - 1))
            } else if let Some(problem) = crate::cluster::host_name_problem(&name) {
                // It becomes a node of the plan: the node lists' rule holds for it too.
                Some(format!(
                    "its node name \"{}\" {problem}",
                    crate::cluster::shown_host(&name)
                ))
            } else if members.iter().any(|m| m.rank == rank) {
                Some(format!("node rank {rank} has joined already"))
            } else if members.iter().any(|m| m.host == name) {
                Some(format!("node {name} has joined already"))
            } else {
                None
            };
            let sender = channel.sender();
            if let Some(reason) = refusal {
                log(&format!("refused the copy at {peer}: {reason}"));
                let _ = sender.send(&Control::Refused { reason });
                sender.finish();
                continue;
            }
            if sender
                .send(&Control::Welcome {
                    leader: host.clone(),
                })
                .is_err()
            {
                continue;
            }
            let _ = channel.set_read_timeout(None);
            log(&format!("node rank {rank} ({name}) joined"));
            members.push(Member {
                rank,
                addr: join_addr(&name, port),
                host: name.clone(),
            });
            controls.push(sender);
            // The lifeline: an agent that goes away before the end is noted (the
            // supervisor finds out through its commands).
            let (log, ending) = (Arc::clone(log), Arc::clone(&ending));
            std::thread::spawn(move || {
                while let Ok(Some(_)) = channel.recv::<Control>() {}
                if !ending.load(Ordering::SeqCst) {
                    log(&format!("the copy of node rank {rank} ({name}) is gone"));
                }
            });
        }
        let _ = stop_tx.send(());
        let _ = acceptor.join();
        refusals.flush();
        if members.len() < copies.count as usize {
            for sender in &controls {
                let _ = sender.send(&Control::End {
                    code: ExitCode::NodeList.code(),
                });
                sender.finish();
            }
            return Err(PeerError::Incomplete {
                joined: members.len() as u32,
                count: copies.count,
                missing: missing_ranks(&members, copies.count),
                waited: options.join_timeout,
                port: options.port,
            });
        }
        members.sort_by_key(|m| m.rank);
        // The agents take a leader silent for SILENCE for lost: speak up regularly.
        let (beat_tx, beat_rx) = mpsc::channel::<()>();
        let beating = controls.clone();
        let beat = std::thread::spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = beat_rx.recv_timeout(HEARTBEAT) {
                for sender in &beating {
                    let _ = sender.send(&Control::Alive);
                }
            }
        });
        Ok(Fleet {
            members,
            pattern: copies.pattern.clone(),
            controls,
            server,
            options: options.clone(),
            heartbeat: Some((beat_tx, beat)),
            ending,
        })
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The job's nodes, in node-rank order.
    pub fn spec(&self) -> ClusterSpec {
        let job_id = match &self.pattern {
            Pattern::SlurmStep { job_id } => job_id.clone(),
            Pattern::Pods => None,
        };
        ClusterSpec {
            nodes: self
                .members
                .iter()
                .map(|m| Node {
                    host: m.host.clone(),
                    slots: Slots::Unknown,
                })
                .collect(),
            source: NodeSource::Copies {
                pattern: self.pattern.describe().to_string(),
            },
            job_id,
        }
    }

    /// A transport that reaches every node through its own copy.
    pub fn transport(&self) -> Transport {
        Transport::Agent(AgentOptions {
            relay: self.options.relay.clone(),
            nodes: self
                .members
                .iter()
                .map(|m| AgentNode {
                    host: m.host.clone(),
                    addr: m.addr.clone(),
                })
                .collect(),
            secret: self.options.secret.clone(),
        })
    }

    /// Tells every agent the job's exit code, and stops this node's command server.
    pub fn end(mut self, code: i32) {
        self.ending.store(true, Ordering::SeqCst);
        if let Some((stop, beat)) = self.heartbeat.take() {
            drop(stop);
            let _ = beat.join();
        }
        for sender in &self.controls {
            let _ = sender.send(&Control::End { code });
            sender.finish();
        }
        self.server.shutdown();
    }
}

/// An agent's life: join the leader, run its orders until it ends the job (returns the
/// job's exit code) or is lost (stops every command, returns [`LOST_LEADER`]).
pub fn follow(copies: &Copies, options: &PeerOptions, log: &Log) -> Result<i32, PeerError> {
    let leader_ip = resolve(&copies.leader)?;
    let leader = SocketAddr::new(leader_ip, options.port);
    let mut channel = reach(leader, options, log)?;
    let own_ip = match copies.name.as_deref().map(resolve) {
        Some(Ok(ip)) => ip,
        _ => channel
            .local_addr()
            .map(|a| a.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
    };
    let host = copies.name.clone().unwrap_or_else(|| own_ip.to_string());
    let server = serve(own_ip, &options.secret, log)?;
    let sender = channel.sender();
    let join = Control::Join {
        rank: copies.rank,
        host: host.clone(),
        command_port: server.addr().port(),
    };
    let lost = |detail: String| PeerError::NoLeader {
        addr: leader.to_string(),
        waited: options.join_timeout,
        detail,
    };
    sender.send(&join).map_err(|e| lost(e.to_string()))?;
    // The leader answers a join at once; a leader that says nothing is as good as lost.
    let _ = channel.set_read_timeout(Some(wire::HANDSHAKE_TIMEOUT));
    match channel.recv::<Control>() {
        Ok(Some(Control::Welcome { leader: name })) => log(&format!(
            "node rank {} ({host}) follows the leader on {name} ({leader}): it plans, this node runs its orders",
            copies.rank
        )),
        Ok(Some(Control::Refused { reason })) => {
            return Err(PeerError::Refused {
                addr: leader.to_string(),
                reason,
            })
        }
        Ok(_) => return Err(lost("the leader closed the connection".to_string())),
        Err(e) => return Err(lost(HandshakeError::Io(e).to_string())),
    }
    // The leader speaks at least every HEARTBEAT: silence means its node is gone.
    let _ = channel.set_read_timeout(Some(SILENCE));
    loop {
        match channel.recv::<Control>() {
            Ok(Some(Control::End { code })) => {
                server.shutdown();
                log(&format!("the leader ended the job with exit code {code}"));
                return Ok(code);
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                log(&format!(
                    "lost the leader at {leader}: stopping this node's commands"
                ));
                server.shutdown();
                return Ok(LOST_LEADER.code());
            }
        }
    }
}

/// Connects and authenticates to the leader, retrying until the join timeout (the leader
/// may start after us). A refusal (wrong secret) is final. Says every
/// [`PeerOptions::waiting_note`] that it is still waiting, why, and for how long yet: a
/// missing leader was a silent 600 s wait.
fn reach(leader: SocketAddr, options: &PeerOptions, log: &Log) -> Result<Channel, PeerError> {
    let mut waiting = Waiting::new(options);
    let mut last = String::from("no attempt");
    while waiting.goes_on(Instant::now(), |waited, left| {
        log(&format!(
            "still waiting for the leader (node rank 0) at {leader} after {waited} (last try: {last}); giving up in {left}",
        ))
    }) {
        match TcpStream::connect_timeout(&leader, Duration::from_secs(5)) {
            Ok(stream) => match wire::connect(stream, &options.secret, Purpose::Control) {
                Ok(channel) => return Ok(channel),
                Err(HandshakeError::Refused(reason)) => {
                    return Err(PeerError::Refused {
                        addr: leader.to_string(),
                        reason,
                    })
                }
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        let left = waiting.deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(left.min(Duration::from_millis(200)));
    }
    Err(PeerError::NoLeader {
        addr: leader.to_string(),
        waited: options.join_timeout,
        detail: last,
    })
}

/// A wait bounded by the join timeout that says every [`PeerOptions::waiting_note`] that it
/// goes on, and for how long yet: the leader's for its copies and each copy's for the
/// leader (a missing leader was a silent 600 s wait).
struct Waiting {
    started: Instant,
    deadline: Instant,
    every: Duration,
    next_note: Instant,
}

impl Waiting {
    fn new(options: &PeerOptions) -> Waiting {
        let started = Instant::now();
        Waiting {
            started,
            deadline: started + options.join_timeout,
            every: options.waiting_note,
            next_note: started + options.waiting_note,
        }
    }

    /// `false` once the join timeout has passed at `now`. Before that, when a note is due,
    /// `note` gets how long the wait has lasted and how long it will yet ("40 s"), for its
    /// line.
    fn goes_on(&mut self, now: Instant, note: impl FnOnce(&str, &str)) -> bool {
        if now >= self.deadline {
            return false;
        }
        if now >= self.next_note {
            note(
                &crate::exec::format_duration(secs(now - self.started)),
                &crate::exec::format_duration(secs(self.deadline - now)),
            );
            self.next_note += self.every;
        }
        true
    }

    /// When the next note or the end is due.
    fn next(&self) -> Instant {
        self.deadline.min(self.next_note)
    }
}

/// The node ranks that have not joined, for messages: "2, 3".
fn missing_ranks(members: &[Member], count: u32) -> String {
    (1..count)
        .filter(|r| !members.iter().any(|m| m.rank == *r))
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `d` rounded to a tenth of a second, so waiting notes read "40 s", not "40.003 s".
fn secs(d: Duration) -> Duration {
    Duration::from_millis((d.as_millis() as u64 + 50) / 100 * 100)
}

fn resolve(host: &str) -> Result<IpAddr, PeerError> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ip);
    }
    let fail = |detail: String| PeerError::Resolve {
        host: host.to_string(),
        detail,
    };
    (host, 0)
        .to_socket_addrs()
        .map_err(|e| fail(e.to_string()))?
        .map(|a| a.ip())
        .find(IpAddr::is_ipv4)
        .ok_or_else(|| fail("no IPv4 address".to_string()))
}

/// Binds the control port on the leader's address, which is what the agents connect to;
/// where that address is not this machine's own (a Kubernetes service address, say), on
/// every address, with a note.
fn listen(ip: IpAddr, port: u16, log: &Log) -> Result<TcpListener, PeerError> {
    match TcpListener::bind((ip, port)) {
        Ok(listener) => Ok(listener),
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
            log(&format!(
                "{ip} is not an address of this machine: listening for the other copies on every address, port {port}"
            ));
            TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).map_err(|error| PeerError::Listen {
                addr: format!("0.0.0.0:{port}"),
                error,
            })
        }
        Err(error) => Err(PeerError::Listen {
            addr: format!("{ip}:{port}"),
            error,
        }),
    }
}

fn serve(ip: IpAddr, secret: &JobSecret, log: &Log) -> Result<CommandServer, PeerError> {
    let server_log = Arc::clone(log);
    CommandServer::start(ip, secret.clone(), server_log)
        .map_err(|error| PeerError::Serve { ip, error })
}

fn join_addr(host: &str, port: u16) -> String {
    if host.contains(':') && host.parse::<IpAddr>().is_ok() {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::agent::collecting;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn options(port: u16, join_timeout_ms: u64, waiting_note_ms: u64) -> PeerOptions {
        PeerOptions {
            secret: JobSecret::new(b"n16-test-secret-0123456789".to_vec()).unwrap(),
            port,
            join_timeout: Duration::from_millis(join_timeout_ms),
            waiting_note: Duration::from_millis(waiting_note_ms),
            relay: PathBuf::from("/nonexistent/relay"),
        }
    }

    fn two_pods(rank: u32) -> Copies {
        Copies {
            pattern: Pattern::Pods,
            count: 2,
            rank,
            leader: "127.0.0.1".into(),
            name: Some("127.0.0.1".into()),
        }
    }

    /// N16: an agent whose leader never came waited 600 s without a word.
    #[test]
    fn n16_an_agent_without_its_leader_says_whom_it_awaits_and_how_long_is_left() {
        let port = free_port();
        let (log, lines) = collecting();
        let err = follow(&two_pods(1), &options(port, 1300, 400), &log).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "cannot reach the leader at 127.0.0.1:{port} within 1.3 s: Connection refused"
            )) && text.contains("PIPETTE_AGENT_PORT"),
            "{text}"
        );
        let lines = lines.lock().unwrap();
        assert!(lines.len() >= 2, "{lines:#?}");
        assert!(
            lines[0].starts_with(&format!(
                "still waiting for the leader (node rank 0) at 127.0.0.1:{port} after "
            )) && lines[0].contains("(last try: Connection refused")
                && lines[0].contains("; giving up in "),
            "{lines:#?}"
        );
    }

    /// N16: a leader whose agents never came waited silently too.
    #[test]
    fn n16_a_leader_without_its_agents_says_whom_it_awaits_and_how_long_is_left() {
        let port = free_port();
        let (log, lines) = collecting();
        let err = match Fleet::gather(&two_pods(0), &options(port, 1300, 400), &log) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("nobody joined"),
        };
        assert!(
            err.starts_with(
                "only 1 of the 2 copies of pipette-run joined within 1.3 s (missing node ranks: 1; "
            ) && err.contains(&format!("the same control port {port} (PIPETTE_AGENT_PORT")),
            "{err}"
        );
        let lines = lines.lock().unwrap();
        let notes: Vec<&String> = lines
            .iter()
            .filter(|l| {
                l.starts_with("still waiting for node ranks 1 (1 of 2 copies joined) after ")
            })
            .collect();
        assert!(!notes.is_empty(), "{lines:#?}");
        assert!(notes[0].contains("; giving up in "), "{lines:#?}");
    }

    /// N16: each connection to the control port had its own handshake thread and, once
    /// refused, its own log line, without limit. Now 64 handshakes at most run at once
    /// (those beyond are closed unread) and the refusals are summed up in one line.
    #[test]
    fn n16_a_flood_of_connections_is_bounded_and_summed_up() {
        let port = free_port();
        let (log, lines) = collecting();
        let gathering = std::thread::spawn(move || {
            Fleet::gather(&two_pods(0), &options(port, 4000, 60_000), &log).err()
        });
        // 100 connections that say nothing, held open: 64 hold a handshake each (for
        // its 20 s), the other 36 are refused at once.
        let mut held = Vec::new();
        let started = Instant::now();
        while held.len() < 100 {
            assert!(started.elapsed() < Duration::from_secs(3), "cannot connect");
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(stream) => held.push(stream),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        let err = gathering.join().unwrap().expect("nobody joined");
        assert!(matches!(err, PeerError::Incomplete { .. }), "{err}");
        let lines = lines.lock().unwrap().clone();
        let refused: Vec<&String> = lines.iter().filter(|l| l.starts_with("refused")).collect();
        assert_eq!(refused.len(), 2, "{lines:#?}");
        assert!(
            refused[0].starts_with("refused a copy of pipette-run connecting from 127.0.0.1:")
                && refused[0].ends_with(": too many connections at once (it runs nothing)"),
            "{lines:#?}"
        );
        assert!(
            refused[1].starts_with("refused 35 more connections from 127.0.0.1 in the last "),
            "{lines:#?}"
        );
        drop(held);
    }
}
