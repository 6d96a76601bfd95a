//! The relay: the local process through which the leader runs one command on another node's
//! copy of pipette-run (see [`super`]). It reads its order from standard input, connects,
//! runs the command there, writes the command's output as its own and exits with its code.

use std::io::{BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::wire::{self, read_line, Channel, HandshakeError, Purpose};
use super::{CommandMessage, JobSecret, RelayOrder, RELAY_SAYS, SILENCE};

/// The first argument that makes `pipette-run` a relay.
pub const RELAY_FLAG: &str = "--pipette-agent-relay";

/// How long the relay tries to reach an agent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The exit code of a relay that could not reach or lost its agent (as ssh's).
const UNREACHABLE: i32 = 255;

/// Runs the relay on this process's standard streams; returns its exit code.
pub fn relay_main() -> i32 {
    let mut stdin = BufReader::new(std::io::stdin());
    let order: RelayOrder = match read_line(&mut stdin, 256 << 20)
        .ok()
        .flatten()
        .and_then(|line| serde_json::from_slice(&line).ok())
    {
        Some(order) => order,
        None => {
            eprintln!("{RELAY_SAYS}no order on standard input (this is pipette-run's own helper; do not run it by hand)");
            return 2;
        }
    };
    let secret = match JobSecret::from_hex(&order.secret) {
        Ok(secret) => secret,
        Err(e) => {
            eprintln!("{RELAY_SAYS}{e}");
            return 2;
        }
    };
    let mut channel = match open(&order.addr, &secret) {
        Ok(channel) => channel,
        Err(e) => {
            eprintln!(
                "{RELAY_SAYS}cannot reach the agent of {} at {}: {e}",
                order.host, order.addr
            );
            return UNREACHABLE;
        }
    };
    let sender = channel.sender();
    let run = CommandMessage::Run {
        host: order.host.clone(),
        grace_ms: order.grace_ms,
        command: order.command,
    };
    if let Err(e) = sender.send(&run) {
        eprintln!("{RELAY_SAYS}lost the agent of {}: {e}", order.host);
        return UNREACHABLE;
    }
    // Our standard input ends when the leader wants the command stopped (or is gone).
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut stdin, &mut std::io::sink());
        let _ = sender.send(&CommandMessage::Stop);
    });
    // The agent speaks at least every HEARTBEAT: silence means its node is gone.
    let _ = channel.set_read_timeout(Some(SILENCE));
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    loop {
        match channel.recv::<CommandMessage>() {
            Ok(Some(CommandMessage::Output { stderr, line })) => {
                let bytes = wire::from_hex(&line).unwrap_or_default();
                let stream: &mut dyn Write = if stderr { &mut err } else { &mut out };
                let _ = stream.write_all(&bytes).and_then(|()| stream.flush());
            }
            Ok(Some(CommandMessage::Exit { code })) => return code,
            Ok(Some(_)) => {}
            Ok(None) => {
                eprintln!(
                    "{RELAY_SAYS}lost the agent of {}: it closed the connection before the command ended",
                    order.host
                );
                return UNREACHABLE;
            }
            Err(e) if is_timeout(&e) => {
                eprintln!(
                    "{RELAY_SAYS}lost the agent of {}: nothing heard from it for {}",
                    order.host,
                    crate::exec::format_duration(SILENCE)
                );
                return UNREACHABLE;
            }
            Err(e) => {
                eprintln!("{RELAY_SAYS}lost the agent of {}: {e}", order.host);
                return UNREACHABLE;
            }
        }
    }
}

/// Whether a read ended because its time limit passed.
pub fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Connects to `addr` and authenticates as a command connection.
pub(super) fn open(addr: &str, secret: &JobSecret) -> Result<Channel, String> {
    let target = addr
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or_else(|| format!("{addr} has no address"))?;
    let stream = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT).map_err(|e| e.to_string())?;
    wire::connect(stream, secret, Purpose::Command).map_err(|e| match e {
        HandshakeError::Io(e) => e.to_string(),
        HandshakeError::Refused(why) => why,
    })
}
