//! Profiling the allocated nodes: what GPUs each has, what every link attains, what every
//! GPU computes — written as a [`ClusterProfile`] with every figure marked measured and
//! dated.
//!
//! [`profile_cluster`] takes the nodes discovery found and
//!
//! 1. takes every node's inventory in parallel ([`inventory`]): `nvidia-smi` for GPUs
//!    (restricted to the allocated slots) and `nvidia-smi topo -m` for their wiring; a node
//!    without GPUs offers its CPUs;
//! 2. reuses a cached profile for the same hosts and inventory unless asked not to, or it
//!    is older than the time-to-live ([`cache`]);
//! 3. runs the probe with torchrun on every node ([`probe`]): bandwidth of every GPU pair
//!    inside each node and of every node pair, and matrix-multiply throughput; with
//!    [`ProfileOptions::sweep`], the performance tables of the planned model's shapes
//!    (GEMMs, attention, memory bandwidth, collectives), kept in the profile's
//!    `measured_perf` per kind of GPU, cached apart from the links (keyed by the nodes and
//!    the sweep's shapes): when only the sweep is missing from the cache, the probe
//!    measures the sweep alone;
//! 4. assembles, validates and caches the profile.
//!
//! All node I/O goes through [`crate::exec`], so the same code runs on a cluster (ssh,
//! srun) and in tests (several "nodes" as local processes).
//!
//! # CPU stand-ins
//!
//! A node without GPUs is profiled with processes on its CPUs standing in for GPUs, so the
//! whole path (profile, plan, launch) runs on CPU machines. With `N` stand-ins per node
//! (`--nproc-per-node N`, default the node's slot count, else 1):
//!
//! - each stand-in is a "GPU" named `cpu`, index = its local rank;
//! - its memory is an equal share of the machine's RAM (`MemTotal` divided by the
//!   stand-ins on that machine — with the local transport, every node is this machine);
//! - its peak TFLOPS (bf16 and fp16 alike) is the best matrix-multiply throughput it
//!   attained (fp32 or bf16 on the CPU), marked measured: a CPU has no datasheet tensor
//!   peak; `measured_tflops` holds its bf16 and fp32 figures (fp32 training is timed by
//!   the fp32 one);
//! - links are gloo point-to-point transfers (TCP, loopback between processes of one
//!   machine), measured exactly as NCCL ones are on GPUs;
//! - each rank gets `CPUs / stand-ins on the machine` threads.
//!
//! Owns: node inventory, the probe and its template, the profile cache, progress bars.
//! Must not know how profiles are planned with.

pub mod cache;
pub mod inventory;
pub mod nics;
pub mod probe;
pub mod progress;

mod assemble;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::cluster::{ClusterProfile, ClusterSpec, ProfileError};
use crate::exec::{format_duration, ExecError, Status, Transport};

use assemble::{assemble, NodePlan};
pub use cache::ProfileCache;
pub use inventory::{NodeDevices, NodeInventory};
pub use probe::{Backend, NodePairs, ProbeReport, ProbeSettings, SweepShapes, SweepSpec};
pub use progress::{NoProgress, Phase, Progress, ProgressBars, LINE_INTERVAL};

/// How to profile.
#[derive(Debug, Clone)]
pub struct ProfileOptions {
    /// How the nodes are reached.
    pub transport: Transport,
    /// GPU nodes: use at most this many GPUs of each node. Nodes without GPUs: this many
    /// CPU processes stand in for GPUs (default: the node's slot count, else 1).
    pub nproc_per_node: Option<u32>,
    /// torchrun on the nodes.
    pub torchrun: String,
    /// A python on the nodes, for the free-port query on node 0 (remote transports).
    pub python: String,
    pub nvidia_smi: String,
    /// Where the other nodes reach node 0 (default: its host name; `127.0.0.1` with the
    /// local transport).
    pub master_addr: Option<String>,
    /// Default: a free port found on node 0.
    pub master_port: Option<u16>,
    /// Extra environment for torchrun on every node (`NCCL_SOCKET_IFNAME`, ...).
    pub env: Vec<(String, String)>,
    /// For each inventory, staging and cleanup command.
    pub command_timeout: Duration,
    /// For the whole probe.
    pub probe_timeout: Duration,
    /// Between TERM and KILL when something has to be stopped.
    pub grace: Duration,
    /// What the probe measures (default: [`ProbeSettings::for_backend`]).
    pub probe: Option<ProbeSettings>,
    /// Measure even when a cached profile exists.
    pub reprofile: bool,
    /// Where cached profiles live (`None`: no cache).
    pub cache: Option<ProfileCache>,
    /// The performance sweep's shapes (the model being planned), if one is to run; its
    /// sizes and budget follow the kind of node ([`probe::SweepSpec::for_backend`]).
    pub sweep: Option<SweepShapes>,
}

/// Cached profiles count for a week by default.
pub const DEFAULT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions {
            transport: Transport::Local,
            nproc_per_node: None,
            torchrun: "torchrun".into(),
            python: "python3".into(),
            nvidia_smi: "nvidia-smi".into(),
            master_addr: None,
            master_port: None,
            env: Vec::new(),
            command_timeout: Duration::from_secs(60),
            probe_timeout: Duration::from_secs(30 * 60),
            grace: Duration::from_secs(5),
            probe: None,
            reprofile: false,
            cache: ProfileCache::default_dir().map(|dir| ProfileCache {
                dir,
                ttl: DEFAULT_TTL,
            }),
            sweep: None,
        }
    }
}

/// Why profiling failed. [`ProfileRunError::is_unreachable`] picks out the failures that
/// mean a node could not be reached (exit code 68).
#[derive(Debug, thiserror::Error)]
pub enum ProfileRunError {
    #[error("there are no nodes to profile (check the node list)")]
    NoNodes,
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("cannot take the inventory of {host}: {detail}")]
    Inventory { host: String, detail: String },
    #[error("some nodes have GPUs ({}) and some have none ({}); pipette-run profiles clusters of one kind (leave the CPU nodes out with --exclude)", .gpu_hosts.join(", "), .cpu_hosts.join(", "))]
    MixedNodes {
        gpu_hosts: Vec<String>,
        cpu_hosts: Vec<String>,
    },
    #[error("cannot set up the probe on {host}: {detail}")]
    Stage { host: String, detail: String },
    #[error("the probe failed on {host} (torchrun: {status}): {detail} (check that PyTorch is installed there and that every node reaches the master node)")]
    ProbeFailed {
        host: String,
        status: Status,
        detail: String,
        /// The tail of torchrun's standard error there.
        output: String,
    },
    #[error("the probe did not finish within {} on {} (stopped it on every node; a node may be hung or unreachable from the others, or allow more time)", format_duration(*.limit), .hosts.join(", "))]
    ProbeTimedOut { limit: Duration, hosts: Vec<String> },
    #[error("the probe finished on {host} without printing its result (this is a bug in pipette-run; please report it)")]
    NoResult { host: String },
    #[error("the probe's result is malformed: {detail} (this is a bug in pipette-run; please report it)")]
    BadResult { detail: String },
    #[error("the measured profile is not valid: {0} (a link may have attained nothing; profile again with --reprofile)")]
    Invalid(ProfileError),
}

impl ProfileRunError {
    /// Whether a node could not be reached.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, ProfileRunError::Exec(e) if e.is_unreachable())
    }
}

impl From<inventory::InventoryError> for ProfileRunError {
    fn from(e: inventory::InventoryError) -> Self {
        match e {
            inventory::InventoryError::Exec(e) => ProfileRunError::Exec(e),
            inventory::InventoryError::Node { host, detail } => {
                ProfileRunError::Inventory { host, detail }
            }
        }
    }
}

/// A profile and how it was obtained.
#[derive(Debug, Clone)]
pub struct ProfileRun {
    pub profile: ClusterProfile,
    pub inventory: Vec<NodeInventory>,
    /// The probe's full report (no links and no matmul figures when it measured the sweep
    /// alone, the links being cached); `None` when the profile came from the cache.
    pub report: Option<ProbeReport>,
    /// The cache file read or written, if any.
    pub cache_file: Option<PathBuf>,
    /// Notes for the user (also sent to the progress reporter).
    pub notes: Vec<String>,
}

/// Profiles the nodes of `spec` (see the module docs).
pub fn profile_cluster(
    spec: &ClusterSpec,
    options: &ProfileOptions,
    progress: &dyn Progress,
) -> Result<ClusterProfile, ProfileRunError> {
    run_profile(spec, options, progress).map(|run| run.profile)
}

/// [`profile_cluster`], with the inventory, the probe's report and where the cache is.
pub fn run_profile(
    spec: &ClusterSpec,
    options: &ProfileOptions,
    progress: &dyn Progress,
) -> Result<ProfileRun, ProfileRunError> {
    if spec.nodes.is_empty() {
        return Err(ProfileRunError::NoNodes);
    }
    let mut notes = Vec::new();
    let mut note = |text: String| {
        progress.note(&text);
        notes.push(text);
    };

    let inventory = take_all_inventories(spec, options, progress)?;
    for w in inventory.iter().flat_map(|i| &i.warnings) {
        note(w.clone());
    }
    let backend = backend_of(&inventory)?;
    let plan = NodePlan::new(spec, options, &inventory);
    // Taken from this inventory each time, cached profile or not: the NICs and
    // NCCL_IB_HCA may differ from when the links were measured.
    let nics = nics_per_node(&inventory, &plan, options);
    let sweep = options
        .sweep
        .clone()
        .map(|shapes| SweepSpec::for_backend(shapes, backend));
    // Links and matmul figures are cached by the nodes alone; a sweep by the nodes and
    // its shapes, so that another model on the same nodes measures only its own sweep.
    let canonical = plan.canonical(&inventory, backend);
    let links_key = cache::key_of(&canonical);
    let sweep_key = sweep
        .as_ref()
        .map(|s| cache::key_of(&format!("{canonical}sweep {}\n", s.to_json())));

    // The links entry, when fresh and a sweep is still to be measured on it.
    let mut cached_links: Option<ClusterProfile> = None;
    if let Some(cache) = options.cache.as_ref().filter(|_| !options.reprofile) {
        if let Some((links, links_path, links_age)) =
            fresh_entry(cache, &links_key, spec, &mut note)
        {
            let links = with_nics(links, nics);
            let Some(sweep_key) = &sweep_key else {
                return Ok(reused(
                    links, inventory, links_path, links_age, notes, progress,
                ));
            };
            if let Some((swept, path, age)) = fresh_entry(cache, sweep_key, spec, &mut note) {
                // The links entry governs: it may have been measured again since.
                let mut profile = links;
                profile.measured_perf = swept.measured_perf.clone();
                if profile != swept {
                    if let Err(e) = cache.store(sweep_key, &profile) {
                        note(format!("warning: {e}"));
                    }
                }
                let age = age.max(links_age);
                return Ok(reused(profile, inventory, path, age, notes, progress));
            }
            note(format!(
                "measuring the performance sweep of this model alone: the links and matmul \
                 figures measured {} ago for these nodes are reused: {} (--reprofile \
                 measures everything again)",
                format_duration(Duration::from_secs(links_age.as_secs())),
                links_path.display()
            ));
            cached_links = Some(links);
        }
    }

    let settings = options
        .probe
        .clone()
        .unwrap_or_else(|| ProbeSettings::for_backend(backend));
    let request = probe::ProbeRequest {
        transport: &options.transport,
        nodes: plan.probe_nodes(spec, options, &inventory, backend),
        backend,
        settings: settings.clone(),
        torchrun: &options.torchrun,
        python: &options.python,
        master_addr: options.master_addr.clone().unwrap_or_else(|| {
            if options.transport == Transport::Local {
                "127.0.0.1".into()
            } else {
                spec.nodes[0].host.clone()
            }
        }),
        master_port: options.master_port,
        timeout: options.probe_timeout,
        command_timeout: options.command_timeout,
        grace: options.grace,
        sweep: sweep.clone(),
        sweep_only: cached_links.is_some(),
        // One rail per NIC; unknown NICs: as many rails as the nodes have ranks.
        rails: nics,
    };
    let report = probe::run_probe(&request, progress)?;
    let today = utc_date(SystemTime::now());
    let measured_links = cached_links.is_none();
    let mut profile = match cached_links {
        Some(profile) => profile,
        None => with_nics(
            assemble(spec, &inventory, &plan, &report, &settings, &today)?,
            nics,
        ),
    };
    profile.measured_perf = assemble::measured_perf(&profile, &report, sweep.as_ref(), &today)?;
    for record in report.sweep.iter().filter(|r| r.skipped > 0) {
        note(format!(
            "the performance sweep on {} left {} shape(s) out after its {} s budget",
            record.name,
            record.skipped,
            sweep.as_ref().map_or(0, |s| s.budget_s)
        ));
    }
    // A slow figure is kept (it is what the node did) and said so, in the file and here
    // (cached links were marked when they were measured).
    let slow = if measured_links {
        profile.mark_slow()
    } else {
        profile.slow_parts()
    };
    for part in slow {
        note(part.to_string());
    }
    profile
        .validate("the measured profile")
        .map_err(ProfileRunError::Invalid)?;

    let mut cache_file = None;
    if let Some(cache) = options.cache.as_ref() {
        let mut store = |key: &str, profile: &ClusterProfile| match cache.store(key, profile) {
            Ok(path) => cache_file = Some(path),
            Err(e) => note(format!("warning: {e}")),
        };
        if measured_links {
            let mut links = profile.clone();
            links.measured_perf.clear();
            store(&links_key, &links);
        }
        if let Some(sweep_key) = &sweep_key {
            store(sweep_key, &profile);
        }
    }
    Ok(ProfileRun {
        profile,
        inventory,
        report: Some(report),
        cache_file,
        notes,
    })
}

/// The cached profile under `key` when it is fresh and holds these nodes (in `spec`'s
/// order), with its file and age; a stale or unreadable entry is noted.
fn fresh_entry(
    cache: &ProfileCache,
    key: &str,
    spec: &ClusterSpec,
    note: &mut impl FnMut(String),
) -> Option<(ClusterProfile, PathBuf, Duration)> {
    match cache.lookup(key, SystemTime::now()) {
        cache::Lookup::Fresh { profile, path, age } => {
            in_spec_order(*profile, spec).map(|profile| (profile, path, age))
        }
        cache::Lookup::Stale { path, age } => {
            note(format!(
                "the cached profile {} is {} old (older than {}): measuring again",
                path.display(),
                format_duration(Duration::from_secs(age.as_secs())),
                format_duration(cache.ttl)
            ));
            None
        }
        cache::Lookup::Unreadable { path, reason } => {
            note(format!(
                "ignoring the unreadable cached profile {}: {reason}",
                path.display()
            ));
            None
        }
        cache::Lookup::Missing => None,
    }
}

/// A cached profile taken as it is: said so, with its slow parts.
fn reused(
    profile: ClusterProfile,
    inventory: Vec<NodeInventory>,
    path: PathBuf,
    age: Duration,
    mut notes: Vec<String>,
    progress: &dyn Progress,
) -> ProfileRun {
    let mut note = |text: String| {
        progress.note(&text);
        notes.push(text);
    };
    note(format!(
        "using the profile measured {} ago for these nodes: {} (--reprofile measures again)",
        format_duration(Duration::from_secs(age.as_secs())),
        path.display()
    ));
    for part in profile.slow_parts() {
        note(part.to_string());
    }
    ProfileRun {
        profile,
        inventory,
        report: None,
        cache_file: Some(path),
        notes,
    }
}

fn take_all_inventories(
    spec: &ClusterSpec,
    options: &ProfileOptions,
    progress: &dyn Progress,
) -> Result<Vec<NodeInventory>, ProfileRunError> {
    let request = inventory::InventoryRequest {
        transport: &options.transport,
        nvidia_smi: &options.nvidia_smi,
        timeout: options.command_timeout,
    };
    progress.start(Phase::Inventory, spec.nodes.len() as u64);
    let done = std::sync::atomic::AtomicU64::new(0);
    let results: Vec<Result<NodeInventory, inventory::InventoryError>> =
        std::thread::scope(|scope| {
            let handles: Vec<_> = spec
                .nodes
                .iter()
                .map(|node| {
                    let (request, done) = (&request, &done);
                    scope.spawn(move || {
                        let result = inventory::take_inventory(request, &node.host, &node.slots);
                        let n = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        progress.update(Phase::Inventory, n);
                        result
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(inventory::InventoryError::Node {
                            host: String::new(),
                            detail: "the inventory thread panicked".into(),
                        })
                    })
                })
                .collect()
        });
    progress.finish(Phase::Inventory);
    results
        .into_iter()
        .map(|r| r.map_err(ProfileRunError::from))
        .collect()
}

/// The NICs per node the profile records (see [`nics`]): `NCCL_IB_HCA` from the
/// probe's environment, else this process's (the workers inherit it).
fn nics_per_node(
    inventory: &[NodeInventory],
    plan: &NodePlan,
    options: &ProfileOptions,
) -> Option<u32> {
    let hca = options
        .env
        .iter()
        .find(|(k, _)| k == "NCCL_IB_HCA")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var("NCCL_IB_HCA").ok())
        .filter(|v| !v.trim().is_empty());
    let per_node: Vec<Option<u32>> = inventory
        .iter()
        .zip(&plan.nproc)
        .map(|(node, gpus)| nics::nccl_nics(&node.rdma_ports, hca.as_deref(), *gpus as usize))
        .collect();
    nics::cluster_nics(&per_node)
}

fn with_nics(mut profile: ClusterProfile, nics: Option<u32>) -> ClusterProfile {
    profile.node_links = profile.node_links.with_nics_per_node(nics);
    profile
}

fn backend_of(inventory: &[NodeInventory]) -> Result<Backend, ProfileRunError> {
    let (gpu, cpu): (Vec<&NodeInventory>, Vec<&NodeInventory>) = inventory
        .iter()
        .partition(|i| matches!(i.devices, NodeDevices::Gpus { .. }));
    match (gpu.is_empty(), cpu.is_empty()) {
        (false, true) => Ok(Backend::Nccl),
        (true, _) => Ok(Backend::Gloo),
        (false, false) => Err(ProfileRunError::MixedNodes {
            gpu_hosts: gpu.iter().map(|i| i.host.clone()).collect(),
            cpu_hosts: cpu.iter().map(|i| i.host.clone()).collect(),
        }),
    }
}

/// `profile` with its nodes (and node matrix) in the order of `spec`, or `None` when the
/// hosts differ.
fn in_spec_order(profile: ClusterProfile, spec: &ClusterSpec) -> Option<ClusterProfile> {
    if profile.nodes.len() != spec.nodes.len() {
        return None;
    }
    let position: std::collections::HashMap<&str, usize> = profile
        .hosts()
        .enumerate()
        .map(|(i, host)| (host, i))
        .collect();
    let order: Vec<usize> = spec
        .nodes
        .iter()
        .map(|n| position.get(n.host.as_str()).copied())
        .collect::<Option<_>>()?;
    let node_links = profile.node_links.select(&order);
    let nodes = order.iter().map(|&i| profile.nodes[i].clone()).collect();
    Some(ClusterProfile {
        note: profile.note,
        measured_perf: profile.measured_perf,
        nodes,
        node_links,
    })
}

/// `YYYY-MM-DD` of `time` in UTC (the epoch's date for a time before it).
pub fn utc_date(time: SystemTime) -> String {
    let at = jiff::Timestamp::try_from(time).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    at.strftime("%Y-%m-%d").to_string()
}

#[cfg(test)]
mod tests {
    use super::assemble::{gpu_spec, NodePlan};
    use super::*;
    use crate::cluster::profile::{
        Dtype, GpuInventory, LinkMatrix, NodeProfile, Provenance, Source,
    };
    use crate::cluster::{Node, NodeSource, Slots};
    use probe::SweepSpec;

    #[test]
    fn dates_are_civil_utc() {
        let at = |s: u64| utc_date(SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01");
        assert_eq!(at(951_782_400), "2000-02-29");
        assert_eq!(at(1_717_113_600), "2024-05-31");
        assert_eq!(at(1_735_689_599), "2024-12-31");
        assert_eq!(at(4_107_542_400), "2100-03-01");
    }

    fn spec(hosts: &[&str]) -> ClusterSpec {
        ClusterSpec {
            nodes: hosts
                .iter()
                .map(|h| Node {
                    host: (*h).into(),
                    slots: Slots::Unknown,
                })
                .collect(),
            source: NodeSource::Hosts,
            job_id: None,
        }
    }

    #[test]
    fn cached_profiles_follow_the_spec_order() {
        let m = LinkMatrix::from_rows(
            &[
                vec![0.0, 1.0, 2.0],
                vec![3.0, 0.0, 4.0],
                vec![5.0, 6.0, 0.0],
            ],
            Provenance::new(Source::Measured),
        )
        .unwrap();
        let profile = ClusterProfile {
            measured_perf: Vec::new(),
            note: None,
            nodes: ["a", "b", "c"]
                .iter()
                .map(|h| NodeProfile {
                    host: (*h).into(),
                    gpus: GpuInventory::Unknown,
                    nvlink_domain: None,
                })
                .collect(),
            node_links: m,
        };
        let again = in_spec_order(profile.clone(), &spec(&["c", "a", "b"])).unwrap();
        assert_eq!(again.nodes[0].host, "c");
        assert_eq!(again.node_links.get(0, 1), 5.0, "c to a");
        assert_eq!(again.node_links.get(1, 0), 2.0, "a to c");
        assert_eq!(again.node_links.get(2, 1), 3.0, "b to a");
        assert!(in_spec_order(profile, &spec(&["a", "b", "x"])).is_none());
    }

    fn cpu_node(host: &str) -> NodeInventory {
        NodeInventory {
            host: host.into(),
            devices: NodeDevices::Cpus {
                memory_bytes: 24 << 30,
                cpus: 4,
                model: "Xeon".into(),
            },
            rdma_ports: vec![],
            nvlink_domain: None,
            warnings: vec![],
        }
    }

    #[test]
    fn local_cpu_stand_ins_share_one_machine() {
        let spec = spec(&["node-a", "node-b", "node-c"]);
        let options = ProfileOptions {
            nproc_per_node: Some(2),
            cache: None,
            ..ProfileOptions::default()
        };
        let inv: Vec<_> = spec.nodes.iter().map(|n| cpu_node(&n.host)).collect();
        let plan = NodePlan::new(&spec, &options, &inv);
        assert_eq!(plan.nproc, [2, 2, 2]);
        assert_eq!(plan.machine_procs, [6, 6, 6]);
        let nodes = plan.probe_nodes(&spec, &options, &inv, Backend::Gloo);
        assert_eq!(nodes[0].threads, Some(1));
        let canonical = plan.canonical(&inv, Backend::Gloo);
        assert!(
            canonical.starts_with("pipette-profile/3 gloo\nnode-a\tcpu\t2\t"),
            "{canonical}"
        );
        // The same nodes listed in another order share the cache entry.
        let mut reversed = inv.clone();
        reversed.reverse();
        assert_eq!(plan.canonical(&reversed, Backend::Gloo), canonical);
    }

    /// What the probe reports on `n` one-rank CPU nodes for `pairs` (both directions),
    /// node `slow`'s links at 0.4 GB/s, the others at 2.
    fn ring_report(n: usize, pairs: &[(usize, usize)], slow: usize) -> ProbeReport {
        let size = ProbeSettings::cpu().reported_size();
        let ranks: Vec<serde_json::Value> = (0..n)
            .map(|r| {
                serde_json::json!({"rank": r, "node": r, "local_rank": 0, "hostname": format!("n{r}"),
                                   "device": "cpu", "name": "cpu"})
            })
            .collect();
        let links: Vec<serde_json::Value> = pairs
            .iter()
            .flat_map(|&(a, b)| [(a, b), (b, a)])
            .map(|(src, dst)| {
                let gb_per_s = if src == slow || dst == slow { 0.4 } else { 2.0 };
                serde_json::json!({"kind": "inter", "src": src, "dst": dst, "size": size,
                                   "iters": 1, "gb_per_s": gb_per_s})
            })
            .collect();
        let compute: Vec<serde_json::Value> = (0..n)
            .map(|r| serde_json::json!({"rank": r, "dtype": "fp32", "n": 64, "tflops": 0.01}))
            .collect();
        let report = serde_json::json!({"protocol": probe::PROTOCOL, "backend": "gloo",
            "torch": "2.5", "world_size": n, "sizes": [size], "warmup": 1, "repeats": 3,
            "ranks": ranks, "links": links, "compute": compute, "elapsed_s": 1.0});
        probe::parse_report(&report.to_string()).unwrap()
    }

    /// Defect 5 (issue 15): a 10,000-node profile measured and kept every node pair. Above
    /// `ALL_NODE_PAIRS_UP_TO` nodes the probe measures a ring sample, and the profile holds
    /// a figure per node plus the measured pairs, in which a slow node still shows.
    #[test]
    fn defect_05_many_nodes_are_profiled_on_a_linear_sample_of_pairs() {
        assert_eq!(
            NodePairs::for_nodes(probe::ALL_NODE_PAIRS_UP_TO),
            NodePairs::All
        );
        assert_eq!(NodePairs::All.pairs(32).len(), 32 * 31 / 2);
        let big = NodePairs::for_nodes(10_000);
        assert_eq!(
            big,
            NodePairs::Ring {
                strides: vec![1, 2, 5_000]
            }
        );
        assert_eq!(
            big.pairs(10_000).len(),
            25_000,
            "linear: 2.5 pairs per node"
        );

        let n = 40;
        let hosts: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
        let spec = spec(&hosts.iter().map(String::as_str).collect::<Vec<_>>());
        let options = ProfileOptions {
            nproc_per_node: Some(1),
            cache: None,
            ..ProfileOptions::default()
        };
        let inv: Vec<_> = hosts.iter().map(|h| cpu_node(h)).collect();
        let plan = NodePlan::new(&spec, &options, &inv);
        let pairs = NodePairs::for_nodes(n).pairs(n);
        assert_eq!(pairs.len(), 100);
        let settings = ProbeSettings::cpu();
        let report = ring_report(n, &pairs, 5);
        let profile = assemble(&spec, &inv, &plan, &report, &settings, "2026-11-24").unwrap();
        let links = &profile.node_links;
        assert!(links.is_sampled());
        assert_eq!(links.stored_figures(), n + 200);
        assert_eq!(links.get(5, 6), 0.4, "measured");
        assert_eq!(
            links.get(5, 30),
            0.4,
            "not measured: the slow node's figure"
        );
        assert_eq!(links.get(30, 5), 0.4);
        assert_eq!(links.get(10, 33), 2.0, "not measured, two healthy nodes");
        assert_eq!(
            links.per_endpoint().unwrap()[6],
            2.0,
            "one slow partner of six"
        );
        profile.validate("the measured profile").unwrap();
        let slow = profile.slow_parts();
        assert!(!slow.is_empty());
        assert!(slow.iter().all(|p| p.finding.contains("n5")), "{slow:?}");
        assert!(slow[0].path.starts_with("node_links.pairs["), "{slow:?}");
        // It reads back, and a cached profile follows another order of the same hosts.
        let again = ClusterProfile::from_json_str(&profile.to_json_pretty(), "p.json").unwrap();
        assert_eq!(again, profile);
        let mut reversed = hosts.clone();
        reversed.reverse();
        let turned = in_spec_order(
            profile.clone(),
            &super::tests::spec(&reversed.iter().map(String::as_str).collect::<Vec<_>>()),
        )
        .unwrap();
        assert_eq!(turned.node_links.get(n - 1 - 5, 0), 0.4);
        assert_eq!(turned.node_links.stored_figures(), n + 200);

        // Every sampled pair must have been measured, both ways.
        let mut short = ring_report(n, &pairs, 5);
        short.links.retain(|l| (l.src, l.dst) != (7, 8));
        let err = assemble(&spec, &inv, &plan, &short, &settings, "2026-11-24").unwrap_err();
        assert!(err.to_string().contains("no figure from n7 to n8"), "{err}");
    }

    /// A report as the probe prints it on two CPU nodes of four ranks (node-major ranks):
    /// every GPU pair, the node pair between ranks 0 and 4 (2.2 GB/s out, 2.0 back), and
    /// the rails phase, ranks 0..3 to 4..7 and back all at once, as `rails` lists them
    /// (sender, receiver, GB/s).
    fn rails_report(rails: &[(usize, usize, f64)]) -> String {
        let size = ProbeSettings::cpu().reported_size();
        let ranks: Vec<serde_json::Value> = (0..8)
            .map(|r| {
                serde_json::json!({"rank": r, "node": r / 4, "local_rank": r % 4,
                    "hostname": "ci", "pid": 4100 + r, "device": "cpu", "name": "cpu",
                    "cpu_model": "Xeon", "host_memory_bytes": 25_769_803_776u64, "cpus": 2,
                    "threads": 1})
            })
            .collect();
        let link = |kind: &str, src: usize, dst: usize, gb_per_s: f64| {
            serde_json::json!({"kind": kind, "src": src, "dst": dst, "size": size, "iters": 4,
                "gb_per_s": gb_per_s, "samples_s": [0.0091, 0.0087, 0.0089]})
        };
        let mut links: Vec<serde_json::Value> = (0..8)
            .flat_map(|a| (0..8).map(move |b| (a, b)))
            .filter(|(a, b)| a != b && a / 4 == b / 4)
            .map(|(a, b)| link("intra", a, b, 3.1))
            .collect();
        links.push(link("inter", 0, 4, 2.2));
        links.push(link("inter", 4, 0, 2.0));
        links.extend(rails.iter().map(|&(a, b, v)| link("rails", a, b, v)));
        let compute: Vec<serde_json::Value> = (0..8)
            .map(|r| {
                serde_json::json!({"rank": r, "dtype": "fp32", "n": 256, "tflops": 0.012,
                                        "samples_s": [0.003]})
            })
            .collect();
        serde_json::json!({"protocol": 2, "backend": "gloo", "torch": "2.9.1+cpu",
            "world_size": 8, "sizes": [65_536, size], "warmup": 1, "repeats": 3,
            "ranks": ranks, "links": links, "compute": compute, "sweep": [],
            "collectives": [], "collectives_skipped": 0, "elapsed_s": 14.2})
        .to_string()
    }

    /// Issue 30: the rails of the first node pair, busy at once, become
    /// `node_links.all_rails`: the sum of the rails' figures in the slower direction beside
    /// the node pair's own figure in its slower direction; written, read back, valid.
    #[test]
    fn the_rails_busy_at_once_become_all_rails() {
        let spec = spec(&["node-a", "node-b"]);
        let options = ProfileOptions {
            nproc_per_node: Some(4),
            cache: None,
            ..ProfileOptions::default()
        };
        let inv = vec![cpu_node("node-a"), cpu_node("node-b")];
        let plan = NodePlan::new(&spec, &options, &inv);
        let settings = ProbeSettings::cpu();
        // Out: 2 + 2 + 1 + 1 = 6 GB/s; back: 4 × 1.25 = 5 GB/s, the slower.
        let out = [(0, 4, 2.0), (1, 5, 2.0), (2, 6, 1.0), (3, 7, 1.0)];
        let back = [(4, 0, 1.25), (5, 1, 1.25), (6, 2, 1.25), (7, 3, 1.25)];
        let every: Vec<_> = out.iter().chain(&back).copied().collect();
        let report = probe::parse_report(&rails_report(&every)).unwrap();
        assert_eq!(report.links.iter().filter(|l| l.kind == "rails").count(), 8);
        let profile = assemble(&spec, &inv, &plan, &report, &settings, "2026-11-28").unwrap();
        let rails = profile.node_links.all_rails().expect("measured");
        assert_eq!(
            (rails.rails, rails.gb_per_s, rails.one_rail_gb_per_s),
            (4, 5.0, 2.0)
        );
        assert_eq!(rails.efficiency(), 5.0 / 8.0);
        assert_eq!(
            profile.node_links.get(0, 1),
            2.2,
            "the node pair is one rail"
        );
        let note = profile.node_links.provenance.note.as_deref().unwrap();
        assert!(
            note.contains("all_rails: 4 rank pairs of node-a and node-b"),
            "{note}"
        );
        profile.validate("the measured profile").unwrap();
        let json = profile.to_json_pretty();
        assert!(
            json.contains(
                r#""all_rails": {"rails": 4, "gb_per_s": 5.0, "one_rail_gb_per_s": 2.0}"#
            ),
            "{json}"
        );
        let again = ClusterProfile::from_json_str(&json, "p.json").unwrap();
        assert_eq!(again, profile);

        // Without the rails phase (one rail, an older report): no all_rails, as before.
        let none = probe::parse_report(&rails_report(&[])).unwrap();
        let profile = assemble(&spec, &inv, &plan, &none, &settings, "2026-11-28").unwrap();
        assert_eq!(profile.node_links.all_rails(), None);
        assert!(!profile.to_json_pretty().contains("all_rails"));

        // A rail measured one way only, or twice, is a bad report, not a figure.
        let err = |rails: &[(usize, usize, f64)]| {
            let report = probe::parse_report(&rails_report(rails)).unwrap();
            assemble(&spec, &inv, &plan, &report, &settings, "2026-11-28")
                .unwrap_err()
                .to_string()
        };
        let one_way = err(&every[..7]);
        assert!(
            one_way.contains("4 rail(s) from node 0 to node 1 but 3 back"),
            "{one_way}"
        );
        let twice: Vec<_> = every.iter().chain(&out[..1]).copied().collect();
        assert!(err(&twice).contains("rank 0 sent twice"), "{}", err(&twice));
    }

    /// Regression: a CPU stand-in's fp32 matmul figure was kept only in a note (its peak
    /// is the best of fp32 and bf16), so fp32 training was priced at 1/16 of it. Each
    /// dtype's figure is recorded, written as a list, and reads back.
    #[test]
    fn cpu_stand_ins_keep_their_fp32_and_bf16_figures() {
        let spec = spec(&["n0"]);
        let options = ProfileOptions {
            nproc_per_node: Some(1),
            cache: None,
            ..ProfileOptions::default()
        };
        let inv = vec![cpu_node("n0")];
        let plan = NodePlan::new(&spec, &options, &inv);
        let mut report = ring_report(1, &[], 0);
        report.compute = vec![
            probe::ComputeRecord {
                rank: 0,
                dtype: "fp32".into(),
                n: 512,
                tflops: 0.149,
            },
            probe::ComputeRecord {
                rank: 0,
                dtype: "bf16".into(),
                n: 512,
                tflops: 0.018,
            },
        ];
        let settings = ProbeSettings::cpu();
        let profile = assemble(&spec, &inv, &plan, &report, &settings, "2026-11-24").unwrap();
        let gpu = &profile.nodes[0].gpus().unwrap()[0];
        assert_eq!(gpu.measured(Dtype::Fp32).map(|m| m.tflops), Some(0.149));
        assert_eq!(gpu.measured(Dtype::Bf16).map(|m| m.tflops), Some(0.018));
        assert_eq!(gpu.peak_tflops.fp16, 0.149, "the best attained figure");
        profile.validate("the measured profile").unwrap();
        let json = profile.to_json_pretty();
        assert!(json.contains("\"measured_tflops\": ["), "{json}");
        let again = ClusterProfile::from_json_str(&json, "p.json").unwrap();
        assert_eq!(again, profile);
    }

    /// Issue 30: the links entry's key holds each node's NVLink domain, so a node that
    /// joined or left one is measured again; a node without one keeps its old key.
    #[test]
    fn the_cache_key_holds_the_nvlink_domain() {
        let spec = spec(&["tray-0", "tray-1"]);
        let options = ProfileOptions {
            cache: None,
            ..ProfileOptions::default()
        };
        let node = |host: &str, domain: Option<&str>| NodeInventory {
            host: host.into(),
            devices: NodeDevices::Gpus {
                gpus: vec![inventory::GpuRecord {
                    index: 0,
                    name: "NVIDIA GB200".into(),
                    memory_bytes: 186_000_000_000,
                    pci_bus_id: None,
                }],
                topology: None,
            },
            rdma_ports: vec![],
            nvlink_domain: domain.map(String::from),
            warnings: vec![],
        };
        let key = |a: Option<&str>, b: Option<&str>| {
            let inv = [node("tray-0", a), node("tray-1", b)];
            let plan = NodePlan::new(&spec, &options, &inv);
            cache::key_of(&plan.canonical(&inv, Backend::Nccl))
        };
        let rack = key(Some("rack-0"), Some("rack-0"));
        assert_ne!(rack, key(Some("rack-0"), Some("rack-1")));
        assert_ne!(rack, key(None, None));
        assert_eq!(rack, key(Some("rack-0"), Some("rack-0")));
        let inv = [node("tray-0", None)];
        let plan = NodePlan::new(&spec, &options, &inv);
        assert!(!plan.canonical(&inv, Backend::Nccl).contains("nvlink"));
    }

    #[test]
    fn mixed_clusters_are_refused() {
        let gpu = NodeInventory {
            host: "g".into(),
            devices: NodeDevices::Gpus {
                gpus: vec![],
                topology: None,
            },
            rdma_ports: vec![],
            nvlink_domain: None,
            warnings: vec![],
        };
        let err = backend_of(&[gpu, cpu_node("c")]).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("some nodes have GPUs (g) and some have none (c)"));
        assert_eq!(backend_of(&[cpu_node("c")]).unwrap(), Backend::Gloo);
    }

    #[test]
    fn unknown_models_take_the_measured_peak() {
        let record = inventory::GpuRecord {
            index: 3,
            name: "NVIDIA A10G".into(),
            memory_bytes: 23028 << 20,
            pci_bus_id: None,
        };
        let spec = gpu_spec(&record, Some(70.5), None, "2024-05-31");
        assert_eq!(spec.peak_tflops.bf16, Some(70.5));
        assert_eq!(spec.provenance.source, Source::Estimated);
        let known = inventory::GpuRecord {
            name: "Tesla V100-SXM2-32GB".into(),
            ..record
        };
        let spec = gpu_spec(&known, None, Some(101.0), "2024-05-31");
        assert_eq!(spec.peak_tflops.fp16, 125.0);
        assert_eq!(spec.measured_tflops[0].dtype, Dtype::Fp16);
    }

    #[test]
    fn the_sweep_report_becomes_the_profiles_section() {
        use crate::cluster::profile::tests::two_nodes;
        use crate::cluster::profile::{GemmLayout, GemmShape};
        let report = probe::parse_report(
            r#"{"protocol": 2, "backend": "nccl", "torch": "2.9", "world_size": 4,
            "sizes": [1], "warmup": 1, "repeats": 1, "compute": [], "links": [],
            "elapsed_s": 9.0,
            "ranks": [
              {"rank": 0, "node": 0, "local_rank": 0, "hostname": "n0", "device": "cuda", "name": "NVIDIA A100-SXM4-80GB"},
              {"rank": 1, "node": 0, "local_rank": 1, "hostname": "n0", "device": "cuda", "name": "NVIDIA A100-SXM4-80GB"},
              {"rank": 2, "node": 1, "local_rank": 0, "hostname": "n1", "device": "cuda", "name": "NVIDIA A100-SXM4-80GB"},
              {"rank": 3, "node": 1, "local_rank": 1, "hostname": "n1", "device": "cuda", "name": "NVIDIA A100-SXM4-80GB"}],
            "sweep": [{"rank": 2, "name": "NVIDIA A100-SXM4-80GB", "dtype": "bf16",
              "gemms": [{"m": 4096, "n": 1536, "k": 4096, "layout": "fwd", "tflops": 245.33333333333334}],
              "attention": [{"batch_heads": 32, "seq": 2048, "head_dim": 128, "tflops": 180.0}],
              "hbm_gb_per_s": 1650.0, "skipped": 2}],
            "collectives": [{"op": "all_reduce", "ranks": 2, "bytes": 1024, "us": 30.0},
                            {"op": "all_gather", "ranks": 4, "bytes": 1024, "us": 25.0}],
            "collectives_skipped": 1}"#,
        )
        .unwrap();
        let profile = two_nodes();
        let shapes = SweepShapes {
            dtype: Dtype::Bf16,
            gemms: vec![GemmShape {
                m: 4096,
                n: 1536,
                k: 4096,
                layout: GemmLayout::Fwd,
            }],
            attention: vec![],
        };
        let sweep = SweepSpec::for_backend(shapes, Backend::Nccl);
        let perf = assemble::measured_perf(&profile, &report, Some(&sweep), "2026-11-24").unwrap();
        assert_eq!(perf.len(), 1);
        // Named as the profile names rank 2's GPU (node 1, local 0), not as torch does.
        assert_eq!(perf[0].gpu, "A100-SXM4-80GB");
        assert_eq!(perf[0].gemms[0].tflops, 245.333333333);
        assert_eq!(perf[0].attention[0].batch_heads, 32);
        assert_eq!(perf[0].hbm_gb_per_s, Some(1650.0));
        assert_eq!(perf[0].collectives.len(), 2);
        assert_eq!(perf[0].shape_set, cache::key_of(&sweep.to_json()));
        let note = perf[0].provenance.note.as_deref().unwrap();
        assert!(
            note.ends_with("3 shape(s) left out past the 60 s budget"),
            "{note}"
        );
        let mut checked = profile.clone();
        checked.measured_perf = perf;
        checked.validate("swept").unwrap();
        // No sweep asked for: no section, whatever the report holds.
        assert!(
            assemble::measured_perf(&profile, &report, None, "2026-11-24")
                .unwrap()
                .is_empty()
        );
        // A sweep record of a rank outside the profile is the probe's bug.
        let mut stray = report.clone();
        stray.sweep[0].rank = 9;
        assert!(assemble::measured_perf(&profile, &stray, Some(&sweep), "2026-11-24").is_err());
    }

    #[test]
    fn the_sweep_goes_to_the_template_with_the_backends_sizes() {
        use crate::cluster::profile::{AttentionShape, GemmLayout, GemmShape};
        let shapes = SweepShapes {
            dtype: Dtype::Bf16,
            gemms: vec![GemmShape {
                m: 128,
                n: 384,
                k: 128,
                layout: GemmLayout::Wgrad,
            }],
            attention: vec![AttentionShape {
                batch_heads: 4,
                seq: 128,
                head_dim: 32,
            }],
        };
        let cpu = SweepSpec::for_backend(shapes.clone(), Backend::Gloo);
        assert_eq!(cpu.collective_sizes, [1 << 10, 16 << 10, 256 << 10]);
        assert_eq!(cpu.budget_s, 3);
        assert_eq!(
            cpu.to_json(),
            r#"{"attention":[[4,128,32]],"budget_s":3,"collective_sizes":[1024,16384,262144],"dtype":"bf16","gemms":[[128,384,128,"wgrad"]],"hbm_bytes":67108864,"repeats":3}"#
        );
        let gpu = SweepSpec::for_backend(shapes, Backend::Nccl);
        assert_eq!(gpu.collective_sizes.last(), Some(&(64 << 20)));
        assert!(probe::TEMPLATE.contains("\"--sweep\""));
    }
}
