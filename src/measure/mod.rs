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
//!    inside each node and of every node pair, and matrix-multiply throughput;
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
//!   peak; `measured_tflops` holds its bf16 figure;
//! - links are gloo point-to-point transfers (TCP, loopback between processes of one
//!   machine), measured exactly as NCCL ones are on GPUs;
//! - each rank gets `CPUs / stand-ins on the machine` threads.
//!
//! Owns: node inventory, the probe and its template, the profile cache, progress bars.
//! Must not know how profiles are planned with.

pub mod cache;
pub mod inventory;
pub mod probe;
pub mod progress;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::cluster::profile::{
    round_figure, Dtype, GpuInventory, GpuSpec, LinkMatrix, MeasuredTflops, NodeProfile,
    PeakTflops, Provenance, Source,
};
use crate::cluster::{ClusterProfile, ClusterSpec, ProfileError};
use crate::exec::{format_duration, is_local_host, ExecError, Status, Transport};

pub use cache::ProfileCache;
pub use inventory::{NodeDevices, NodeInventory};
pub use probe::{Backend, ProbeReport, ProbeSettings};
pub use progress::{NoProgress, Phase, Progress, ProgressBars};

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
    /// The probe's full report; `None` when the profile came from the cache.
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
    let key = cache::key_of(&plan.canonical(&inventory, backend));

    if let Some(cache) = options.cache.as_ref() {
        if !options.reprofile {
            match cache.lookup(&key, SystemTime::now()) {
                cache::Lookup::Fresh { profile, path, age } => {
                    if let Some(profile) = in_spec_order(profile, spec) {
                        note(format!(
                            "using the profile measured {} ago for these nodes: {} \
                             (--reprofile measures again)",
                            format_duration(Duration::from_secs(age.as_secs())),
                            path.display()
                        ));
                        for part in profile.slow_parts() {
                            note(part.to_string());
                        }
                        return Ok(ProfileRun {
                            profile,
                            inventory,
                            report: None,
                            cache_file: Some(path),
                            notes,
                        });
                    }
                }
                cache::Lookup::Stale { path, age } => note(format!(
                    "the cached profile {} is {} old (older than {}): measuring again",
                    path.display(),
                    format_duration(Duration::from_secs(age.as_secs())),
                    format_duration(cache.ttl)
                )),
                cache::Lookup::Unreadable { path, reason } => note(format!(
                    "ignoring the unreadable cached profile {}: {reason}",
                    path.display()
                )),
                cache::Lookup::Missing => {}
            }
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
    };
    let report = probe::run_probe(&request, progress)?;
    let today = utc_date(SystemTime::now());
    let mut profile = assemble(spec, &inventory, &plan, &report, &settings, &today)?;
    // A slow figure is kept (it is what the node did) and said so, in the file and here.
    for part in profile.mark_slow() {
        note(part.to_string());
    }
    profile
        .validate("the measured profile")
        .map_err(ProfileRunError::Invalid)?;

    let mut cache_file = None;
    if let Some(cache) = options.cache.as_ref() {
        match cache.store(&key, &profile) {
            Ok(path) => cache_file = Some(path),
            Err(e) => note(format!("warning: {e}")),
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

/// How many processes each node runs, and what the CPU stand-ins get.
struct NodePlan {
    nproc: Vec<u32>,
    /// Per node: the processes sharing its machine (all of them with the local transport).
    machine_procs: Vec<u32>,
}

impl NodePlan {
    fn new(spec: &ClusterSpec, options: &ProfileOptions, inventory: &[NodeInventory]) -> Self {
        let nproc: Vec<u32> = spec
            .nodes
            .iter()
            .zip(inventory)
            .map(|(node, inv)| match &inv.devices {
                NodeDevices::Gpus { gpus, .. } => {
                    let n = gpus.len() as u32;
                    options.nproc_per_node.map_or(n, |cap| cap.clamp(1, n))
                }
                NodeDevices::Cpus { .. } => options
                    .nproc_per_node
                    .or(node.slots.count())
                    .unwrap_or(1)
                    .max(1),
            })
            .collect();
        let total: u32 = nproc.iter().sum();
        // Several nodes may be one machine: forced local, or loopback names over ssh.
        let machine_procs = spec
            .nodes
            .iter()
            .zip(&nproc)
            .map(|(node, n)| {
                if options.transport == Transport::Local || is_local_host(&node.host) {
                    let local: u32 = spec
                        .nodes
                        .iter()
                        .zip(&nproc)
                        .filter(|(m, _)| {
                            options.transport == Transport::Local || is_local_host(&m.host)
                        })
                        .map(|(_, n)| *n)
                        .sum();
                    local.max(1).min(total)
                } else {
                    *n
                }
            })
            .collect();
        NodePlan {
            nproc,
            machine_procs,
        }
    }

    /// What identifies these nodes for the cache: hosts (sorted), what each offers, how
    /// many processes run there.
    fn canonical(&self, inventory: &[NodeInventory], backend: Backend) -> String {
        let mut lines: Vec<String> = inventory
            .iter()
            .zip(&self.nproc)
            .map(|(inv, n)| match &inv.devices {
                NodeDevices::Gpus { gpus, .. } => format!(
                    "{}\tgpu\t{n}\t{}",
                    inv.host,
                    gpus.iter()
                        .take(*n as usize)
                        .map(|g| format!(
                            "{}|{}|{}|{}",
                            g.index,
                            g.name,
                            g.memory_bytes,
                            g.pci_bus_id.as_deref().unwrap_or("")
                        ))
                        .collect::<Vec<_>>()
                        .join(";")
                ),
                NodeDevices::Cpus {
                    memory_bytes,
                    cpus,
                    model,
                } => format!("{}\tcpu\t{n}\t{memory_bytes}|{cpus}|{model}", inv.host),
            })
            .collect();
        lines.sort();
        format!(
            "pipette-profile/1 {}\n{}\n",
            backend.as_str(),
            lines.join("\n")
        )
    }

    fn probe_nodes(
        &self,
        spec: &ClusterSpec,
        options: &ProfileOptions,
        inventory: &[NodeInventory],
        backend: Backend,
    ) -> Vec<probe::ProbeNode> {
        let gloo_ifname_given = options.env.iter().any(|(k, _)| k == "GLOO_SOCKET_IFNAME")
            || std::env::var_os("GLOO_SOCKET_IFNAME").is_some();
        spec.nodes
            .iter()
            .zip(inventory)
            .enumerate()
            .map(|(i, (node, inv))| {
                let mut env = options.env.clone();
                let mut threads = None;
                match &inv.devices {
                    NodeDevices::Gpus { gpus, .. } => {
                        let visible: Vec<String> = gpus
                            .iter()
                            .take(self.nproc[i] as usize)
                            .map(|g| g.index.to_string())
                            .collect();
                        env.push(("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()));
                        env.push(("CUDA_VISIBLE_DEVICES".into(), visible.join(",")));
                    }
                    NodeDevices::Cpus { cpus, .. } => {
                        threads = Some((cpus / self.machine_procs[i].max(1)).max(1));
                    }
                }
                // Every rank of a local run is on this machine: loopback is the network.
                if backend == Backend::Gloo
                    && options.transport == Transport::Local
                    && !gloo_ifname_given
                {
                    env.push(("GLOO_SOCKET_IFNAME".into(), "lo".into()));
                }
                probe::ProbeNode {
                    host: node.host.clone(),
                    nproc: self.nproc[i],
                    env,
                    threads,
                }
            })
            .collect()
    }
}

/// The profile from the inventory and the probe's report.
fn assemble(
    spec: &ClusterSpec,
    inventory: &[NodeInventory],
    plan: &NodePlan,
    report: &ProbeReport,
    settings: &ProbeSettings,
    today: &str,
) -> Result<ClusterProfile, ProfileRunError> {
    let bad = |detail: String| ProfileRunError::BadResult { detail };
    let expected: u32 = plan.nproc.iter().sum();
    if report.world_size != expected as usize || report.ranks.len() != report.world_size {
        return Err(bad(format!(
            "{} ranks reported, {} started",
            report.ranks.len(),
            expected
        )));
    }
    // rank → (node, local rank)
    let mut place = vec![(usize::MAX, usize::MAX); report.world_size];
    for r in &report.ranks {
        if r.rank >= place.len()
            || r.node >= spec.nodes.len()
            || r.local_rank >= plan.nproc[r.node] as usize
        {
            return Err(bad(format!(
                "rank {} on node {} local rank {} is outside the launch",
                r.rank, r.node, r.local_rank
            )));
        }
        place[r.rank] = (r.node, r.local_rank);
    }
    let size = settings.reported_size();
    let mib = |b: u64| {
        if b >= 1 << 20 {
            format!("{} MiB", b >> 20)
        } else {
            format!("{} KiB", b >> 10)
        }
    };
    let sizes: Vec<String> = settings.sizes.iter().map(|s| mib(*s)).collect();
    let link_note = format!(
        "point-to-point, one direction: median of {} repeats at {} ({} backend; sizes tried: {})",
        report.repeats,
        mib(size),
        report.backend,
        sizes.join(", ")
    );
    let measured = |note: String| {
        Provenance::new(Source::Measured)
            .with_date(today)
            .with_tool(probe::TOOL)
            .with_note(note)
    };

    let n = spec.nodes.len();
    let mut node_cells = vec![0.0; n * n];
    let mut gpu_cells: Vec<Vec<f64>> = plan
        .nproc
        .iter()
        .map(|p| vec![0.0; (*p as usize).pow(2)])
        .collect();
    for rec in report.links.iter().filter(|r| r.size == size) {
        let (Some(&(sn, sl)), Some(&(dn, dl))) = (place.get(rec.src), place.get(rec.dst)) else {
            return Err(bad(format!("a link names rank {} or {}", rec.src, rec.dst)));
        };
        match rec.kind.as_str() {
            "intra" if sn == dn => {
                let p = plan.nproc[sn] as usize;
                gpu_cells[sn][sl * p + dl] = rec.gb_per_s;
            }
            "inter" if sn != dn => node_cells[sn * n + dn] = rec.gb_per_s,
            other => {
                return Err(bad(format!(
                    "a {other:?} link from rank {} to rank {}",
                    rec.src, rec.dst
                )))
            }
        }
    }
    let missing = |cells: &[f64], size: usize| {
        (0..size * size).find(|k| k / size != k % size && cells[*k] <= 0.0)
    };
    if let Some(k) = missing(&node_cells, n) {
        return Err(bad(format!(
            "no figure from {} to {}",
            spec.nodes[k / n].host,
            spec.nodes[k % n].host
        )));
    }

    // Compute figures by rank and dtype.
    let mut compute: BTreeMap<(usize, &str), f64> = BTreeMap::new();
    for c in &report.compute {
        compute.insert((c.rank, c.dtype.as_str()), round_figure(c.tflops));
    }
    let rank_of = |node: usize, local: usize| place.iter().position(|p| *p == (node, local));

    let mut nodes = Vec::with_capacity(n);
    for (i, (node, inv)) in spec.nodes.iter().zip(inventory).enumerate() {
        let p = plan.nproc[i] as usize;
        if let Some(k) = missing(&gpu_cells[i], p) {
            return Err(bad(format!(
                "no figure from GPU {} to GPU {} of {}",
                k / p,
                k % p,
                node.host
            )));
        }
        let mut gpus = Vec::with_capacity(p);
        for local in 0..p {
            let rank = rank_of(i, local)
                .ok_or_else(|| bad(format!("no rank for local rank {local} of {}", node.host)))?;
            let tflops = |dtype: &str| compute.get(&(rank, dtype)).copied();
            gpus.push(match &inv.devices {
                NodeDevices::Gpus { gpus: records, .. } => {
                    let record = &records[local];
                    gpu_spec(record, tflops("bf16"), tflops("fp16"), today)
                }
                NodeDevices::Cpus {
                    memory_bytes,
                    model,
                    ..
                } => cpu_spec(
                    local as u32,
                    memory_bytes / u64::from(plan.machine_procs[i].max(1)),
                    model,
                    tflops("fp32"),
                    tflops("bf16"),
                    today,
                )
                .ok_or_else(|| bad(format!("no compute figure for rank {rank}")))?,
            });
        }
        let links = LinkMatrix::from_rows(
            &gpu_cells[i]
                .chunks(p.max(1))
                .map(<[f64]>::to_vec)
                .collect::<Vec<_>>(),
            if p > 1 {
                measured(link_note.clone())
            } else {
                measured("one GPU: no pairs inside the node".into())
            },
        )
        .ok_or_else(|| bad(format!("the GPU matrix of {} is not square", node.host)))?;
        nodes.push(NodeProfile {
            host: node.host.clone(),
            gpus: GpuInventory::Known { gpus, links },
        });
    }
    let node_links = LinkMatrix::from_rows(
        &node_cells
            .chunks(n)
            .map(<[f64]>::to_vec)
            .collect::<Vec<_>>(),
        if n > 1 {
            measured(format!("{link_note}; between the first GPU of each node"))
        } else {
            measured("one node: no node pairs".into())
        },
    )
    .ok_or_else(|| bad("the node matrix is not square".into()))?;
    let kind = match inventory.first().map(|i| &i.devices) {
        Some(NodeDevices::Cpus { .. }) => "CPU processes standing in for GPUs, ",
        _ => "",
    };
    Ok(ClusterProfile {
        note: Some(format!(
            "measured by {} on {today}: {n} node(s), {} rank(s), {kind}torch {}, {:.0} s",
            probe::TOOL,
            report.world_size,
            report.torch,
            report.elapsed_s
        )),
        nodes,
        node_links,
    })
}

fn gpu_spec(
    record: &inventory::GpuRecord,
    bf16: Option<f64>,
    fp16: Option<f64>,
    today: &str,
) -> GpuSpec {
    let measured = match (bf16, fp16) {
        (Some(t), _) => Some((Dtype::Bf16, t)),
        (None, Some(t)) => Some((Dtype::Fp16, t)),
        (None, None) => None,
    };
    let measured_tflops = measured.map(|(dtype, tflops)| MeasuredTflops {
        dtype,
        tflops,
        provenance: Provenance::new(Source::Measured)
            .with_date(today)
            .with_tool(probe::TOOL)
            .with_note("median matmul throughput, all GPUs busy at once"),
    });
    let (peak_tflops, provenance) = match inventory::peak_for(&record.name) {
        Some(peak) => (
            peak,
            Provenance::new(Source::Datasheet)
                .with_date(today)
                .with_tool("nvidia-smi")
                .with_note("peak: NVIDIA datasheet, dense"),
        ),
        None => {
            let t = measured.map_or(1.0, |(_, t)| t);
            (
                PeakTflops {
                    bf16: bf16.map(|_| t),
                    fp16: t,
                },
                Provenance::new(Source::Estimated)
                    .with_date(today)
                    .with_tool("nvidia-smi")
                    .with_note(
                        "model not in pipette-run's datasheet table: peak set to the measured \
                         matmul throughput",
                    ),
            )
        }
    };
    GpuSpec {
        index: record.index,
        name: record.name.clone(),
        memory_bytes: record.memory_bytes,
        peak_tflops,
        measured_tflops,
        provenance,
    }
}

fn cpu_spec(
    index: u32,
    memory_bytes: u64,
    model: &str,
    fp32: Option<f64>,
    bf16: Option<f64>,
    today: &str,
) -> Option<GpuSpec> {
    let best = fp32.into_iter().chain(bf16).reduce(f64::max)?;
    let measured_tflops = bf16.map(|tflops| MeasuredTflops {
        dtype: Dtype::Bf16,
        tflops,
        provenance: Provenance::new(Source::Measured)
            .with_date(today)
            .with_tool(probe::TOOL)
            .with_note("bf16 matmul on the CPU, all stand-ins busy at once"),
    });
    Some(GpuSpec {
        index,
        name: "cpu".into(),
        memory_bytes: memory_bytes.max(1),
        peak_tflops: PeakTflops {
            bf16: Some(best),
            fp16: best,
        },
        measured_tflops,
        provenance: Provenance::new(Source::Measured)
            .with_date(today)
            .with_tool(probe::TOOL)
            .with_note(format!(
                "CPU process standing in for a GPU on {model}: memory = its share of RAM, \
                 peak = best attained matmul (fp32 {:.4}, bf16 {:.4} TFLOPS)",
                fp32.unwrap_or(0.0),
                bf16.unwrap_or(0.0)
            )),
    })
}

/// `profile` with its nodes (and node matrix) in the order of `spec`, or `None` when the
/// hosts differ.
fn in_spec_order(profile: ClusterProfile, spec: &ClusterSpec) -> Option<ClusterProfile> {
    if profile.nodes.len() != spec.nodes.len() {
        return None;
    }
    let order: Vec<usize> = spec
        .nodes
        .iter()
        .map(|n| profile.nodes.iter().position(|p| p.host == n.host))
        .collect::<Option<_>>()?;
    let rows: Vec<Vec<f64>> = order
        .iter()
        .map(|&i| {
            order
                .iter()
                .map(|&j| profile.node_links.get(i, j))
                .collect()
        })
        .collect();
    let node_links = LinkMatrix::from_rows(&rows, profile.node_links.provenance.clone())?;
    let nodes = order.iter().map(|&i| profile.nodes[i].clone()).collect();
    Some(ClusterProfile {
        note: profile.note,
        nodes,
        node_links,
    })
}

/// `YYYY-MM-DD` of `time` in UTC (days since the epoch to a civil date, after Howard
/// Hinnant's `civil_from_days`).
pub fn utc_date(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Node, NodeSource, Slots};

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
            note: None,
            nodes: ["a", "b", "c"]
                .iter()
                .map(|h| NodeProfile {
                    host: (*h).into(),
                    gpus: GpuInventory::Unknown,
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
            canonical.starts_with("pipette-profile/1 gloo\nnode-a\tcpu\t2\t"),
            "{canonical}"
        );
        // The same nodes listed in another order share the cache entry.
        let mut reversed = inv.clone();
        reversed.reverse();
        assert_eq!(plan.canonical(&reversed, Backend::Gloo), canonical);
    }

    #[test]
    fn mixed_clusters_are_refused() {
        let gpu = NodeInventory {
            host: "g".into(),
            devices: NodeDevices::Gpus {
                gpus: vec![],
                topology: None,
            },
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
        assert_eq!(spec.measured_tflops.unwrap().dtype, Dtype::Fp16);
    }
}
