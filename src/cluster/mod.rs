//! The nodes a job runs on: which hosts were allocated ([`ClusterSpec`], found by
//! [`discover`]) and what their GPUs and links can do ([`ClusterProfile`], read from a
//! cluster profile file), and what a job may use of them ([`Allocation`]: hosts, workers
//! and GPUs, decided once by [`allocate`]).
//!
//! Owns: Slurm hostlists, PBS node files, DeepSpeed hostfiles and `--include/--exclude`
//! filters, and the cluster profile file formats. Must not know about models or plans.

pub mod allocation;
pub mod copies;
pub mod discover;
pub mod hostfile;
pub mod hostlist;
pub mod import;
pub mod profile;

pub use allocation::{allocate, Allocation, AllocationError, AllocationRequest, HostAllocation};
pub use discover::{discover, DiscoveryError, DiscoveryRequest, Environment};
pub use profile::{ClusterProfile, ProfileError};

use serde::{Deserialize, Serialize};

/// The longest host name accepted, in bytes: a DNS name has at most 253 characters
/// (RFC 1035 §2.3.4, less the final dot), so anything longer is not a name a launcher can
/// reach. Capping it also keeps every message and table that shows a name short.
pub const MAX_HOST_NAME: usize = 253;

/// The most nodes any node list may hold (the hostlist expansion cap): no cluster has this
/// many, so a longer list is a mistake (a typo in a range, a file of something else).
pub const MAX_NODES: usize = hostlist::MAX_HOSTS;

/// The most GPU slots one node may claim (hostfile `slots=`, PBS lines per host,
/// `--nproc-per-node`): no machine has that many accelerators, so more is a mistake.
pub const MAX_SLOTS: u32 = 1024;

/// Why `host` is not a host name, or `None` when it is one: longer than
/// [`MAX_HOST_NAME`], or refused by [`crate::exec::host_problem`] (empty, starting with
/// `-`, which ssh and srun would read as an option, or holding a blank or a control
/// character, which would reach a terminal raw: an escape sequence in a node list must never
/// be printed as it is). The one rule for every node list, checked where the list is read
/// so that a bad name is a node-list error, not an unreachable node; the cluster profile
/// reader applies it too.
///
/// A name with a character outside ASCII is refused (`ｎｏｄｅ１`, fullwidth, looks like
/// `node1` and is another name; DNS and `/etc/hosts` names are ASCII, an internationalised
/// one is written in its `xn--` form).
///
/// Two spellings that name one node as two are refused too: a name with an empty part
/// between dots (`x..` was a node beside `x`), and one of digits and dots that is not an
/// IPv4 address as written (`127.000.000.001` and `127.1` were nodes beside `127.0.0.1`;
/// the resolver reads them as that address, and a leading zero as octal).
pub fn host_name_problem(host: &str) -> Option<String> {
    let name = host.strip_suffix('.').unwrap_or(host);
    if host.len() > MAX_HOST_NAME {
        Some(format!(
            "is {} bytes long, more than the {MAX_HOST_NAME} a DNS name may have",
            host.len()
        ))
    } else if let Some(problem) = crate::exec::host_problem(host) {
        Some(problem.to_string())
    } else if let Some(c) = host.chars().find(|c| !c.is_ascii()) {
        Some(not_ascii(host, c))
    } else if name.is_empty() || name.starts_with('.') || name.ends_with('.') || name.contains("..")
    {
        Some("has an empty part between dots (write each dot between two names)".to_string())
    } else if name.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && name.parse::<std::net::Ipv4Addr>().is_err()
    {
        Some(
            "is digits and dots but not an IPv4 address as written (four numbers 0-255 \
             without leading zeros: resolvers read 127.1 as 127.0.0.1 and 010 as 8)"
                .to_string(),
        )
    } else {
        None
    }
}

/// Why `host`, holding `first`, the first of its characters outside ASCII, is refused, and
/// what to write instead: the ASCII it looks like when every such character is a
/// fullwidth form of one (`ｎｏｄｅ１`, typed with a CJK input method, is `node1`).
fn not_ascii(host: &str, first: char) -> String {
    let looks_like: Option<String> = host
        .chars()
        .map(|c| match c {
            '\u{FF01}'..='\u{FF5E}' => char::from_u32(c as u32 - 0xFEE0),
            _ => c.is_ascii().then_some(c),
        })
        .collect();
    let instead = match looks_like {
        Some(name) if host_name_problem(&name).is_none() => {
            format!("it is written in fullwidth characters: write {name}")
        }
        _ => "write its ASCII name, an internationalised name in its xn-- form".to_string(),
    };
    format!(
        "contains '{}' (U+{:04X}), which is not ASCII: a host name is ASCII letters, \
         digits, '-', '.' and '_' ({instead})",
        first.escape_default(),
        first as u32,
    )
}

pub use crate::exec::{host_key, same_host};

/// `host` as a message may show it: control characters escaped, and at most 64
/// characters (a name that is refused may be of any length).
pub fn shown_host(host: &str) -> String {
    const SHOWN: usize = 64;
    let mut out: String = host
        .chars()
        .take(SHOWN)
        .flat_map(char::escape_default)
        .collect();
    if host.chars().nth(SHOWN).is_some() {
        out.push_str("...");
    }
    out
}

/// The allocated nodes, in the order the allocation (or the user) listed them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSpec {
    pub nodes: Vec<Node>,
    /// Where the node list came from.
    pub source: NodeSource,
    /// The scheduler's job id (Slurm's `SLURM_JOB_ID`, PBS's `PBS_JOBID`), used as the
    /// rendezvous id.
    pub job_id: Option<String>,
}

impl ClusterSpec {
    /// The hosts, in order.
    pub fn hosts(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.host.clone()).collect()
    }

    /// The nodes as profiling should see them: a PBS node file's line counts are CPU
    /// cores as often as GPUs (one line per node is common), so they do not limit which
    /// GPUs are measured; [`allocate`] compares them with the GPUs found.
    pub fn for_profiling(&self) -> ClusterSpec {
        let mut spec = self.clone();
        if matches!(spec.source, NodeSource::Pbs { .. }) {
            for node in &mut spec.nodes {
                node.slots = Slots::Unknown;
            }
        }
        spec
    }
}

/// One allocated host and the accelerator slots we may use on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub host: String,
    pub slots: Slots,
}

/// How many GPUs (or process slots) a node offers, as far as discovery can tell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Slots {
    /// Nothing said how many; `--nproc-per-node` or profiling decides.
    Unknown,
    /// A count, e.g. a hostfile's `slots=8`, PBS lines per host, `SLURM_GPUS_ON_NODE`.
    Count(u32),
    /// Exactly these device indices, e.g. `SLURM_JOB_GPUS=0,1,4,5` or `--include host:0,1`.
    Devices(Vec<u32>),
}

impl Slots {
    /// The number of slots, when known.
    pub fn count(&self) -> Option<u32> {
        match self {
            Slots::Unknown => None,
            Slots::Count(n) => Some(*n),
            Slots::Devices(d) => Some(d.len() as u32),
        }
    }
}

/// Where a [`ClusterSpec`] came from, in discovery's order of precedence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NodeSource {
    /// `SLURM_JOB_NODELIST` (or `SLURM_NODELIST`).
    Slurm { variable: String },
    /// The file named by `PBS_NODEFILE`.
    Pbs { path: String },
    /// `--hostfile FILE`.
    Hostfile { path: String },
    /// `--hosts a,b,c`.
    Hosts,
    /// No allocation found: this machine alone.
    Local,
    /// No allocation found, and `--cluster FILE` named the nodes (planning offline).
    ClusterFile { path: String },
    /// One copy of pipette-run per node, which joined the leader (see [`copies`]).
    Copies { pattern: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_name_outside_ascii_is_refused_with_what_to_write() {
        let fullwidth = host_name_problem("\u{ff4e}\u{ff4f}\u{ff44}\u{ff45}\u{ff11}").unwrap();
        assert_eq!(
            fullwidth,
            "contains '\\u{ff4e}' (U+FF4E), which is not ASCII: a host name is ASCII letters, \
             digits, '-', '.' and '_' (it is written in fullwidth characters: write node1)"
        );
        // Fullwidth among ASCII, with a fullwidth dot: the name it looks like.
        assert!(host_name_problem("gpu\u{ff0e}rack2")
            .unwrap()
            .ends_with("write gpu.rack2)"));
        let other = host_name_problem("n\u{f6}de1").unwrap();
        assert!(other.starts_with("contains '\\u{f6}' (U+00F6)"), "{other}");
        assert!(
            other.ends_with("an internationalised name in its xn-- form)"),
            "{other}"
        );
        // A fullwidth '-' first would make it no host name at all: no ASCII name offered.
        assert!(host_name_problem("\u{ff0d}node")
            .unwrap()
            .ends_with("in its xn-- form)"));
        for name in [
            "node1",
            "gpu-01.rack_2",
            "xn--nde1-lua",
            "10.0.0.1",
            "fe80::1",
        ] {
            assert_eq!(host_name_problem(name), None, "{name}");
        }
    }
}
