//! The authenticated channel between copies of pipette-run: a TCP connection, a mutual
//! challenge-response over the job's secret, then messages each carrying its own MAC.
//!
//! # Handshake
//!
//! 1. The side that accepted sends a fresh 32-byte nonce `Ns` (from the kernel's random
//!    source).
//! 2. The side that connected answers with its own nonce `Nc` and
//!    `HMAC-SHA256(secret, "pipette/1 client" | purpose | Ns | Nc)`.
//! 3. The accepting side checks it in constant time ([`hmac::Mac::verify_slice`]); on a
//!    mismatch it says so in one line, closes the connection and runs nothing. Else it
//!    proves itself in turn with `HMAC-SHA256(secret, "pipette/1 server" | purpose | Nc | Ns)`,
//!    which the connecting side checks: an agent never obeys a listener that merely
//!    accepted its connection.
//!
//! Both sides then derive a session key `HMAC-SHA256(secret, "pipette/1 session" | Ns | Nc)`
//! and every later message is one line, `MAC JSON`, where the MAC covers the direction, a
//! message counter and the JSON text: a message cannot be forged, altered, replayed or
//! reordered by someone on the network path without the secret. Messages are not
//! encrypted (they carry command lines and training logs, which are not secret on a
//! cluster); the secret itself never crosses the wire.
//!
//! The purpose (`control` or `command`) is bound into every proof, so a handshake seen on
//! one kind of connection cannot be replayed on the other.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The fewest bytes a job secret may have: 16 bytes is 128 bits when they are random,
/// which is what the examples make (`head -c 32 /dev/urandom | base64` gives 44 characters).
pub const MIN_SECRET_BYTES: usize = 16;

/// The most a message line may hold before the peer is authenticated: a handshake line is
/// about 200 bytes, so a stranger cannot make us buffer more than this.
const HANDSHAKE_LINE_LIMIT: u64 = 4096;

/// The most an authenticated message may hold (a command with its standard input).
const MESSAGE_LINE_LIMIT: u64 = 64 << 20;

/// How long one side waits for the other's handshake line.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);

const PROTOCOL: &str = "pipette/1";

/// The job's shared secret. Never printed: its `Debug` shows only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret(Vec<u8>);

impl JobSecret {
    /// The secret's bytes (the text of `PIPETTE_JOB_SECRET`, or a secret file's content
    /// without its line end); refused when shorter than [`MIN_SECRET_BYTES`].
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<JobSecret, String> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the job secret has {} bytes, fewer than {MIN_SECRET_BYTES}",
                bytes.len()
            ));
        }
        Ok(JobSecret(bytes))
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes a key of any length.
        HmacSha256::new_from_slice(&self.0).expect("HMAC accepts every key length")
    }

    /// The secret as hex, for the relay's order (a pipe to our own child, never argv).
    pub(super) fn to_hex(&self) -> String {
        to_hex(&self.0)
    }

    pub(super) fn from_hex(text: &str) -> Result<JobSecret, String> {
        JobSecret::new(from_hex(text).ok_or("the job secret is not hex")?)
    }
}

impl std::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JobSecret({} bytes)", self.0.len())
    }
}

/// What a connection is for; bound into the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// An agent joining its leader, held for the job's whole life.
    Control,
    /// One command the leader has an agent run.
    Command,
}

impl Purpose {
    fn as_str(self) -> &'static str {
        match self {
            Purpose::Control => "control",
            Purpose::Command => "command",
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Challenge {
    protocol: String,
    nonce: String,
}

#[derive(Serialize, Deserialize)]
struct Answer {
    purpose: Purpose,
    nonce: String,
    proof: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Verdict {
    Accepted { proof: String },
    Refused { reason: String },
}

/// Why a connection was not established.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("{}", io_text(.0))]
    Io(#[from] std::io::Error),
    /// The peer does not hold the job's secret (or speaks another protocol).
    #[error("{0}")]
    Refused(String),
}

/// A handshake's I/O error as people read it: a read that timed out is "Resource
/// temporarily unavailable (os error 11)" to the system, a silent peer to us.
fn io_text(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
            "the peer sent nothing within {} s (the handshake's limit)",
            HANDSHAKE_TIMEOUT.as_secs()
        ),
        _ => e.to_string(),
    }
}

/// One end of an authenticated connection: send with [`Channel::sender`] (from any thread),
/// receive with [`Channel::recv`] (from one).
pub struct Channel {
    reader: BufReader<TcpStream>,
    key: Vec<u8>,
    inbound: u8,
    received: u64,
    sender: Sender,
}

/// The sending half of a [`Channel`]; clones share the connection and the counter.
#[derive(Clone)]
pub struct Sender {
    inner: Arc<Mutex<SendState>>,
}

struct SendState {
    stream: TcpStream,
    key: Vec<u8>,
    outbound: u8,
    sent: u64,
}

/// Accepting side of the handshake: challenges the peer, checks its proof and purpose, and
/// proves itself. A peer without the secret gets one line saying it was refused.
pub fn accept(
    stream: TcpStream,
    secret: &JobSecret,
    want: Purpose,
) -> Result<Channel, HandshakeError> {
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let server_nonce = nonce()?;
    write_json(
        &mut writer,
        &Challenge {
            protocol: PROTOCOL.to_string(),
            nonce: to_hex(&server_nonce),
        },
    )?;
    let answer: Answer = read_json(&mut reader, HANDSHAKE_LINE_LIMIT)?;
    let refuse = |writer: &mut TcpStream, reason: &str| {
        let _ = write_json(
            writer,
            &Verdict::Refused {
                reason: reason.to_string(),
            },
        );
        HandshakeError::Refused(reason.to_string())
    };
    let Some(client_nonce) = from_hex(&answer.nonce).filter(|n| n.len() == 32) else {
        return Err(refuse(&mut writer, "malformed handshake"));
    };
    let proof = from_hex(&answer.proof).unwrap_or_default();
    let mut mac = secret.mac();
    mac.update(&transcript(
        "client",
        answer.purpose,
        &server_nonce,
        &client_nonce,
    ));
    if mac.verify_slice(&proof).is_err() {
        return Err(refuse(&mut writer, "wrong job secret"));
    }
    if answer.purpose != want {
        return Err(refuse(&mut writer, "unexpected connection purpose"));
    }
    let proof = sign(
        secret,
        &transcript("server", want, &client_nonce, &server_nonce),
    );
    write_json(
        &mut writer,
        &Verdict::Accepted {
            proof: to_hex(&proof),
        },
    )?;
    reader.get_ref().set_read_timeout(None)?;
    let key = session_key(secret, &server_nonce, &client_nonce);
    Ok(Channel::new(reader, writer, key, b's'))
}

/// Connecting side of the handshake: answers the challenge and checks that the peer holds
/// the secret too.
pub fn connect(
    stream: TcpStream,
    secret: &JobSecret,
    purpose: Purpose,
) -> Result<Channel, HandshakeError> {
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let challenge: Challenge = read_json(&mut reader, HANDSHAKE_LINE_LIMIT)?;
    let server_nonce = from_hex(&challenge.nonce).filter(|n| n.len() == 32);
    let Some(server_nonce) = server_nonce.filter(|_| challenge.protocol == PROTOCOL) else {
        return Err(HandshakeError::Refused(format!(
            "the peer does not speak {PROTOCOL}"
        )));
    };
    let client_nonce = nonce()?;
    let proof = sign(
        secret,
        &transcript("client", purpose, &server_nonce, &client_nonce),
    );
    write_json(
        &mut writer,
        &Answer {
            purpose,
            nonce: to_hex(&client_nonce),
            proof: to_hex(&proof),
        },
    )?;
    match read_json::<Verdict>(&mut reader, HANDSHAKE_LINE_LIMIT)? {
        Verdict::Refused { reason } => Err(HandshakeError::Refused(format!("refused: {reason}"))),
        Verdict::Accepted { proof } => {
            let mut mac = secret.mac();
            mac.update(&transcript("server", purpose, &client_nonce, &server_nonce));
            if mac
                .verify_slice(&from_hex(&proof).unwrap_or_default())
                .is_err()
            {
                return Err(HandshakeError::Refused(
                    "the peer does not hold the job secret".to_string(),
                ));
            }
            reader.get_ref().set_read_timeout(None)?;
            let key = session_key(secret, &server_nonce, &client_nonce);
            Ok(Channel::new(reader, writer, key, b'c'))
        }
    }
}

impl Channel {
    fn new(reader: BufReader<TcpStream>, stream: TcpStream, key: Vec<u8>, me: u8) -> Channel {
        let other = if me == b'c' { b's' } else { b'c' };
        Channel {
            reader,
            key: key.clone(),
            inbound: other,
            received: 0,
            sender: Sender {
                inner: Arc::new(Mutex::new(SendState {
                    stream,
                    key,
                    outbound: me,
                    sent: 0,
                })),
            },
        }
    }

    pub fn sender(&self) -> Sender {
        self.sender.clone()
    }

    /// The next message; `Ok(None)` when the peer closed the connection cleanly. A message
    /// whose MAC does not check is an error (the connection is then useless).
    pub fn recv<T: DeserializeOwned>(&mut self) -> std::io::Result<Option<T>> {
        let Some(line) = read_line(&mut self.reader, MESSAGE_LINE_LIMIT)? else {
            return Ok(None);
        };
        let text = std::str::from_utf8(&line).map_err(|_| invalid("a message is not UTF-8"))?;
        let (mac, json) = text
            .split_once(' ')
            .ok_or_else(|| invalid("a message has no MAC"))?;
        let mut check = HmacSha256::new_from_slice(&self.key).expect("any key length");
        check.update(&frame_header(self.inbound, self.received));
        check.update(json.as_bytes());
        check
            .verify_slice(&from_hex(mac).unwrap_or_default())
            .map_err(|_| invalid("a message failed its integrity check"))?;
        self.received += 1;
        serde_json::from_str(json)
            .map(Some)
            .map_err(|e| invalid(&format!("a message does not parse: {e}")))
    }

    /// Limits how long [`Channel::recv`] blocks (`None`: forever).
    pub fn set_read_timeout(&self, limit: Option<Duration>) -> std::io::Result<()> {
        self.reader.get_ref().set_read_timeout(limit)
    }

    /// The address of this end of the connection.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.reader.get_ref().local_addr()
    }

    /// The address of the other end.
    pub fn peer_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.reader.get_ref().peer_addr()
    }
}

impl Sender {
    /// Sends one message. Writes give up after a while, so a peer that stopped reading
    /// cannot block us for ever.
    pub fn send<T: Serialize>(&self, message: &T) -> std::io::Result<()> {
        let json = serde_json::to_string(message).map_err(|e| invalid(&e.to_string()))?;
        let mut state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut mac = HmacSha256::new_from_slice(&state.key).expect("any key length");
        mac.update(&frame_header(state.outbound, state.sent));
        mac.update(json.as_bytes());
        let line = format!("{} {json}\n", to_hex(&mac.finalize().into_bytes()));
        state.sent += 1;
        state
            .stream
            .set_write_timeout(Some(Duration::from_secs(60)))?;
        state.stream.write_all(line.as_bytes())
    }

    /// Ends our direction of the connection after what was sent (the peer's `recv` then
    /// ends cleanly).
    pub fn finish(&self) {
        let state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let _ = state.stream.shutdown(std::net::Shutdown::Write);
    }

    /// Closes both directions of the connection, which wakes a peer blocked in `recv`.
    pub fn shutdown(&self) {
        let state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let _ = state.stream.shutdown(std::net::Shutdown::Both);
    }
}

fn frame_header(direction: u8, counter: u64) -> Vec<u8> {
    let mut header = vec![direction];
    header.extend_from_slice(&counter.to_be_bytes());
    header
}

fn transcript(side: &str, purpose: Purpose, first: &[u8], second: &[u8]) -> Vec<u8> {
    let mut data = format!("{PROTOCOL} {side} {} ", purpose.as_str()).into_bytes();
    data.extend_from_slice(first);
    data.extend_from_slice(second);
    data
}

fn sign(secret: &JobSecret, data: &[u8]) -> Vec<u8> {
    let mut mac = secret.mac();
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn session_key(secret: &JobSecret, server_nonce: &[u8], client_nonce: &[u8]) -> Vec<u8> {
    let mut data = format!("{PROTOCOL} session ").into_bytes();
    data.extend_from_slice(server_nonce);
    data.extend_from_slice(client_nonce);
    sign(secret, &data)
}

/// 32 bytes from the kernel's random source.
fn nonce() -> std::io::Result<[u8; 32]> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn write_json<T: Serialize>(stream: &mut TcpStream, value: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_string(value).map_err(|e| invalid(&e.to_string()))?;
    line.push('\n');
    stream.write_all(line.as_bytes())
}

fn read_json<T: DeserializeOwned>(
    reader: &mut BufReader<TcpStream>,
    limit: u64,
) -> std::io::Result<T> {
    let line = read_line(reader, limit)?.ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the peer closed the connection during the handshake",
        )
    })?;
    serde_json::from_slice(&line).map_err(|_| invalid("the peer does not speak pipette's protocol"))
}

/// One line without its end; `None` at a clean end of stream. A line longer than `limit`
/// is an error.
pub(super) fn read_line(reader: &mut impl BufRead, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let n = reader
        .by_ref()
        .take(limit + 1)
        .read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(if n as u64 > limit {
            invalid("a message is too long")
        } else {
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the connection ended mid-message",
            )
        });
    }
    line.pop();
    Ok(Some(line))
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

pub(super) fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn from_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// N16: a connection that sent nothing was reported as "os error 11".
    #[test]
    fn n16_a_silent_peer_is_named_as_such() {
        let e = HandshakeError::from(std::io::Error::from(std::io::ErrorKind::WouldBlock));
        assert_eq!(
            e.to_string(),
            "the peer sent nothing within 20 s (the handshake's limit)"
        );
        let e = HandshakeError::from(std::io::Error::from_raw_os_error(11));
        assert!(e.to_string().contains("sent nothing"), "{e}");
    }
    use std::net::TcpListener;

    fn secret(text: &str) -> JobSecret {
        JobSecret::new(text.as_bytes()).unwrap()
    }

    /// Runs `accept` on a thread and `connect` here; returns both results.
    fn handshake(
        server: JobSecret,
        client: JobSecret,
        want: Purpose,
        asked: Purpose,
    ) -> (
        Result<Channel, HandshakeError>,
        Result<Channel, HandshakeError>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let accepting = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            accept(stream, &server, want)
        });
        let connected = connect(TcpStream::connect(addr).unwrap(), &client, asked);
        (accepting.join().unwrap(), connected)
    }

    #[test]
    fn the_same_secret_opens_a_channel_both_ways() {
        let s = secret("0123456789abcdef-job");
        let (server, client) = handshake(s.clone(), s, Purpose::Command, Purpose::Command);
        let (mut server, mut client) = (server.unwrap(), client.unwrap());
        client.sender().send(&vec!["hello", "a b\nc"]).unwrap();
        server.sender().send(&42u32).unwrap();
        assert_eq!(
            server.recv::<Vec<String>>().unwrap().unwrap(),
            ["hello", "a b\nc"]
        );
        assert_eq!(client.recv::<u32>().unwrap(), Some(42));
        client.sender().shutdown();
        assert!(server.recv::<u32>().unwrap().is_none());
    }

    #[test]
    fn a_wrong_secret_is_refused_on_both_sides() {
        let (server, client) = handshake(
            secret("0123456789abcdef-job"),
            secret("0123456789abcdef-JOB"),
            Purpose::Control,
            Purpose::Control,
        );
        assert_eq!(server.err().unwrap().to_string(), "wrong job secret");
        assert_eq!(
            client.err().unwrap().to_string(),
            "refused: wrong job secret"
        );
    }

    #[test]
    fn a_proof_for_one_purpose_does_not_open_the_other() {
        let s = secret("0123456789abcdef-job");
        let (server, client) = handshake(s.clone(), s, Purpose::Control, Purpose::Command);
        assert_eq!(
            server.err().unwrap().to_string(),
            "unexpected connection purpose"
        );
        assert!(client.is_err());
    }

    #[test]
    fn an_altered_or_replayed_message_is_rejected() {
        let s = secret("0123456789abcdef-job");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let s2 = s.clone();
        let accepting = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            accept(stream, &s2, Purpose::Command).unwrap()
        });
        let stream = TcpStream::connect(addr).unwrap();
        let mut raw = stream.try_clone().unwrap();
        let _client = connect(stream, &s, Purpose::Command).unwrap();
        let mut server = accepting.join().unwrap();
        // A well-formed line with a MAC made without the session key.
        let mut mac = s.mac();
        mac.update(b"\"stop\"");
        let forged = format!("{} \"stop\"\n", to_hex(&mac.finalize().into_bytes()));
        raw.write_all(forged.as_bytes()).unwrap();
        let err = server.recv::<String>().unwrap_err();
        assert_eq!(err.to_string(), "a message failed its integrity check");
    }

    #[test]
    fn short_secrets_are_refused_and_never_printed() {
        assert!(JobSecret::new(b"short".to_vec()).is_err());
        let s = secret("a-secret-of-24-bytes!!!!");
        assert_eq!(format!("{s:?}"), "JobSecret(24 bytes)");
        assert_eq!(JobSecret::from_hex(&s.to_hex()).unwrap(), s);
    }

    #[test]
    fn long_lines_are_cut_off() {
        let mut input = std::io::Cursor::new(vec![b'x'; 100]);
        let err = read_line(&mut input, 10).unwrap_err();
        assert_eq!(err.to_string(), "a message is too long");
        let mut input = std::io::Cursor::new(b"ab\ncd".to_vec());
        assert_eq!(read_line(&mut input, 10).unwrap().unwrap(), b"ab");
        assert!(read_line(&mut input, 10).is_err(), "cd has no line end");
    }
}
