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
