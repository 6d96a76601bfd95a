//! The agent transport: a node reached through the copy of pipette-run that runs there
//! (one copy per node under `srun --ntasks-per-node=1`, one per Kubernetes pod).
//!
//! Every copy serves commands ([`CommandServer`]); the leader reaches a node's copy as it
//! reaches a node over ssh: [`super::Transport::Agent`] starts a small local process, the
//! *relay* (pipette-run itself, run as `pipette-run --pipette-agent-relay HOST`), which
//! connects to that node's server over an authenticated channel ([`wire`]), hands it the
//! [`NodeCommand`] as data (JSON: program, arguments, environment, directory, standard
//! input; never shell text), writes the command's output as its own and exits with the
//! command's status. So [`super::RunningCommand`] watches, signals and tears down an
//! agent's command exactly as it does an ssh one:
//!
//! - the relay's standard input is held open while the command should run; when it closes
//!   (teardown, or the leader dying), the relay tells the server to stop the command;
//! - the server runs the command under the same wrapper as ssh ([`super::transport`]),
//!   whose standard input it holds: when the connection drops (relay killed, leader host
//!   lost) or the agent itself dies, the wrapper's watchdog sends TERM to the command's
//!   process group, waits the grace period and sends KILL. Nothing outlives its order.
//!
//! - a node that vanishes without closing its connections (powered off, cut off) is noticed
//!   by silence: a running command's agent speaks at least every [`HEARTBEAT`], and the
//!   relay gives it up after [`SILENCE`] (as ssh's `ServerAliveInterval` does).
//!
//! A relay that cannot reach its agent, or loses it, exits with 255 after a line starting
//! [`RELAY_SAYS`], which [`super::RunningCommand::into_output`] reports as an unreachable
//! node (as ssh's own 255).

mod refusals;
mod relay;
mod serve;
pub mod wire;

use serde::{Deserialize, Serialize};

pub use refusals::{Handshakes, Refusals};
pub use relay::{is_timeout, relay_main, RELAY_FLAG};
#[cfg(test)]
pub(crate) use serve::collecting;
pub use serve::{CommandServer, Log};
pub use wire::{JobSecret, Purpose};

use super::NodeCommand;

/// The job's shared secret: the text of this variable...
pub const SECRET_VARIABLE: &str = "PIPETTE_JOB_SECRET";
/// ...or the content of the file it names (readable by its owner only). Neither reaches a
/// command pipette-run starts (the relay gets the secret on its standard input).
pub const SECRET_FILE_VARIABLE: &str = "PIPETTE_JOB_SECRET_FILE";

/// What the relay's own error lines start with.
pub const RELAY_SAYS: &str = "pipette-run agent relay: ";

/// How the leader reaches every node's copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentOptions {
    /// The relay program: this pipette-run binary.
    pub relay: std::path::PathBuf,
    /// Every node's host name (as the plan names it) and the address of its command server.
    pub nodes: Vec<AgentNode>,
    pub secret: JobSecret,
}

/// One node's copy of pipette-run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentNode {
    pub host: String,
    /// `IP:PORT` of its command server.
    pub addr: String,
}

impl AgentOptions {
    pub fn addr_of(&self, host: &str) -> Option<&str> {
        self.nodes
            .iter()
            .find(|n| super::same_host(&n.host, host))
            .map(|n| n.addr.as_str())
    }
}

/// What the relay reads from its standard input (one JSON line) before it connects.
#[derive(Debug, Serialize, Deserialize)]
struct RelayOrder {
    host: String,
    addr: String,
    grace_ms: u64,
    secret: String,
    command: NodeCommand,
}

/// The messages of a command connection.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum CommandMessage {
    /// Leader → agent: run this, and stop it within `grace_ms` when told.
    Run {
        host: String,
        grace_ms: u64,
        command: NodeCommand,
    },
    /// Leader → agent: stop the command (TERM, grace, KILL).
    Stop,
    /// Agent → leader: a line the command wrote (hex, with its line end).
    Output { stderr: bool, line: String },
    /// Agent → leader: the command ended with this code (128 + N for signal N).
    Exit { code: i32 },
    /// Agent → leader: the command still runs (every [`HEARTBEAT`]).
    Alive,
}

/// How often a side that may have nothing else to say shows it is alive (an agent to the
/// relay while its command runs, the leader to its agents).
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a side waits without a word before it takes the other for lost (a node that
/// vanished without closing its connections: powered off, cut off the network). Six
/// heartbeats, so a busy machine is not mistaken for a dead one.
pub const SILENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// The relay's order for `command` on `host` (served at `addr`): the line its standard
/// input starts with.
pub(super) fn relay_order(
    options: &AgentOptions,
    host: &str,
    addr: &str,
    command: &NodeCommand,
    grace: std::time::Duration,
) -> Vec<u8> {
    let order = RelayOrder {
        host: host.to_owned(),
        addr: addr.to_owned(),
        grace_ms: grace.as_millis() as u64,
        secret: options.secret.to_hex(),
        command: command.clone(),
    };
    let mut line = serde_json::to_vec(&order).expect("an order serialises");
    line.push(b'\n');
    line
}
