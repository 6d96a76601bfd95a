//! pipette-run's own options. None of them shares a name with a torchrun option (a
//! unit test checks), so a job script's torchrun options always mean what they meant.

use std::path::PathBuf;

use clap::Args;

/// How results are shown.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Pipette options")]
pub struct OutputOptions {
    /// Show what would run (nodes, model, settings, plan, commands) and launch nothing
    #[arg(long = "dry-run")]
    pub dry_run: bool,

    /// Print the result as JSON on stdout (for tools); messages still go to stderr
    #[arg(long)]
    pub json: bool,

    /// Seed of every randomised search, so the same inputs give the same plan
    #[arg(long, env = "PIPETTE_SEED", default_value_t = 0)]
    pub seed: u64,
}

/// Where the nodes come from. Discovery order: Slurm, PBS, --hostfile, --hosts, this
/// machine; --include/--exclude then filter whatever was found.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Node options")]
pub struct DiscoveryOptions {
    /// A cluster profile (pipette JSON, original Pipette bandwidth file, or mpiGraph
    /// output) with the GPUs and measured link bandwidths. Without an allocation, its
    /// nodes are the nodes
    #[arg(long, env = "PIPETTE_CLUSTER", value_name = "FILE")]
    pub cluster: Option<PathBuf>,

    /// DeepSpeed-style hostfile (`host slots=N` per line, # comments) or one host per
    /// line. Slurm and PBS allocations take precedence
    #[arg(long, env = "PIPETTE_HOSTFILE", value_name = "FILE")]
    pub hostfile: Option<PathBuf>,

    /// Comma-separated hosts (Slurm hostlist syntax accepted: gpu[01-04])
    #[arg(long, env = "PIPETTE_HOSTS", value_name = "LIST")]
    pub hosts: Option<String>,

    /// Use only these hosts or slots, DeepSpeed syntax: host1:0,1@host2
    #[arg(long, value_name = "FILTER")]
    pub include: Option<String>,

    /// Leave out these hosts or slots, DeepSpeed syntax: host1:0,1@host2
    #[arg(long, value_name = "FILTER")]
    pub exclude: Option<String>,
}

/// What is trained, when the script's arguments do not say it all.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Model options")]
pub struct ModelOptions {
    /// A model preset (see `pipette presets`); Megatron arguments after SCRIPT override
    /// its values
    #[arg(long = "model", env = "PIPETTE_MODEL", value_name = "PRESET")]
    pub preset: Option<String>,

    /// Parallel settings the planner must keep, comma-separated: tp, pp, mbs, vpp, sp,
    /// recompute, dist-opt take their value from the Megatron arguments; NAME=VALUE
    /// fixes a value (e.g. tp=4, dp=8); `all` pins everything the arguments give.
    /// Without --pin, parallel sizes in the script's arguments are only replaced
    #[arg(long, env = "PIPETTE_PIN", value_name = "LIST")]
    pub pin: Option<String>,
}
