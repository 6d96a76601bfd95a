//! Assembling the profile: how many processes each node runs and what a CPU stand-in
//! gets ([`NodePlan`]), and the [`ClusterProfile`] built from the inventory and the
//! probe's report.

use std::collections::BTreeMap;

use crate::cluster::profile::{
    median, round_figure, AllRails, AttentionFigure, CollectiveFigure, Dtype, GemmFigure,
    GpuInventory, GpuSpec, LinkMatrix, MeasuredPerf, MeasuredTflops, NodeProfile, PeakTflops,
    Provenance, Source,
};
use crate::cluster::{ClusterProfile, ClusterSpec};
use crate::exec::{is_local_host, Transport};

use super::{
    cache, inventory, probe, Backend, NodeDevices, NodeInventory, ProbeReport, ProbeSettings,
    ProfileOptions, ProfileRunError, SweepSpec,
};

/// How many processes each node runs, and what the CPU stand-ins get.
pub(super) struct NodePlan {
    pub(super) nproc: Vec<u32>,
    /// Per node: the processes sharing its machine (all of them with the local transport).
    pub(super) machine_procs: Vec<u32>,
}

impl NodePlan {
    pub(super) fn new(
        spec: &ClusterSpec,
        options: &ProfileOptions,
        inventory: &[NodeInventory],
    ) -> Self {
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
    /// many processes run there. The leading version changes whenever what a profile
    /// records changes, so older entries are measured again rather than misread (2: CPU
    /// stand-ins keep their fp32 matmul figure, without which fp32 training was priced at
    /// a sixteenth of it; 3: `node_links.all_rails`, without which a collective over
    /// several NICs is taken to attain every NIC's figure).
    pub(super) fn canonical(&self, inventory: &[NodeInventory], backend: Backend) -> String {
        let mut lines: Vec<String> = inventory
            .iter()
            .zip(&self.nproc)
            .map(|(inv, n)| match &inv.devices {
                NodeDevices::Gpus { gpus, .. } => format!(
                    "{}\tgpu\t{n}\t{}{}",
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
                        .join(";"),
                    // A node that joined or left an NVLink domain (a rack recabled, a
                    // tray moved) is measured again; nodes without one keep their key.
                    inv.nvlink_domain
                        .as_deref()
                        .map(|d| format!("\tnvlink {d}"))
                        .unwrap_or_default()
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
            "pipette-profile/3 {}\n{}\n",
            backend.as_str(),
            lines.join("\n")
        )
    }

    pub(super) fn probe_nodes(
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
pub(super) fn assemble(
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
    // Measured node links by (sender, receiver): the pairs the probe chose, not n².
    let mut node_figures: BTreeMap<(usize, usize), f64> = BTreeMap::new();
    // The rails phase's records, (sender's node, receiver's node, sender rank, GB/s).
    let mut rail_figures: Vec<RailFigure> = Vec::new();
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
            "inter" if sn != dn => {
                node_figures.insert((sn, dn), rec.gb_per_s);
            }
            "rails" if sn != dn => rail_figures.push(RailFigure {
                from: sn,
                to: dn,
                rank: rec.src,
                gb_per_s: rec.gb_per_s,
            }),
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
    let node_pairs = probe::NodePairs::for_nodes(n);
    let figure = |a: usize, b: usize| match node_figures.get(&(a, b)) {
        Some(&v) if v > 0.0 => Ok(v),
        _ => Err(bad(format!(
            "no figure from {} to {}",
            spec.nodes[a].host, spec.nodes[b].host
        ))),
    };
    for (a, b) in node_pairs.pairs(n) {
        figure(a, b)?;
        figure(b, a)?;
    }

    let all_rails = all_rails(&rail_figures, &node_figures).map_err(bad)?;
    let rails_note = all_rails.map_or(String::new(), |(rails, a, b)| {
        format!(
            "; all_rails: {} rank pairs of {} and {} streaming at once (local rank i to local \
             rank i), summed, the slower direction",
            rails.rails, spec.nodes[a].host, spec.nodes[b].host
        )
    });

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
            nvlink_domain: inv.nvlink_domain.clone(),
        });
    }
    let node_links = match node_pairs {
        probe::NodePairs::All => {
            let mut cells = vec![0.0; n * n];
            for (&(a, b), &v) in &node_figures {
                cells[a * n + b] = v;
            }
            LinkMatrix::from_rows(
                &cells.chunks(n).map(<[f64]>::to_vec).collect::<Vec<_>>(),
                if n > 1 {
                    measured(format!(
                        "{link_note}; between the first GPU of each node{rails_note}"
                    ))
                } else {
                    measured("one node: no node pairs".into())
                },
            )
            .ok_or_else(|| bad("the node matrix is not square".into()))?
        }
        probe::NodePairs::Ring { strides } => sampled_node_links(
            n,
            &node_figures,
            measured(format!(
                "{link_note}; between the first GPU of each node, each node with the nodes \
                 {} places after it around the ring of nodes; a pair not measured is taken \
                 to attain the lesser of its nodes' figures (the median of each node's \
                 measured links){rails_note}",
                strides
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        )
        .ok_or_else(|| bad("a node link names a node outside the launch".into()))?,
    };
    let node_links = node_links.with_all_rails(all_rails.map(|(rails, _, _)| rails));
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
        measured_perf: Vec::new(),
    })
}

/// One rail's figure from the probe's rails phase.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct RailFigure {
    /// The sender's node and the receiver's.
    pub(super) from: usize,
    pub(super) to: usize,
    /// The sending rank: each rail once per direction.
    pub(super) rank: usize,
    pub(super) gb_per_s: f64,
}

/// What the rails attained together ([`AllRails`]) and between which two nodes: the sum
/// of the rails' figures in each direction, the slower one, beside that node pair's own
/// one-rail figure (its slower direction). `None` when the rails were not measured (one
/// node, fewer than two rails, a report without them); an error when the records do not
/// make one node pair with every rail in both directions.
pub(super) fn all_rails(
    rails: &[RailFigure],
    node_figures: &BTreeMap<(usize, usize), f64>,
) -> Result<Option<(AllRails, usize, usize)>, String> {
    let Some(first) = rails.first() else {
        return Ok(None);
    };
    let (a, b) = (first.from.min(first.to), first.from.max(first.to));
    let mut senders: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
    let mut sums = [0.0f64; 2];
    for rail in rails {
        let direction = match (rail.from, rail.to) {
            (f, t) if (f, t) == (a, b) => 0,
            (f, t) if (f, t) == (b, a) => 1,
            (f, t) => {
                return Err(format!(
                    "rails were measured between nodes {a} and {b} and between nodes {f} \
                     and {t}: one node pair is expected"
                ))
            }
        };
        if senders[direction].contains(&rail.rank) {
            return Err(format!("rank {} sent twice in the rails phase", rail.rank));
        }
        if !(rail.gb_per_s.is_finite() && rail.gb_per_s > 0.0) {
            return Err(format!(
                "rank {} attained {} GB/s in the rails phase",
                rail.rank, rail.gb_per_s
            ));
        }
        senders[direction].push(rail.rank);
        sums[direction] += rail.gb_per_s;
    }
    if senders[0].len() != senders[1].len() {
        return Err(format!(
            "{} rail(s) from node {a} to node {b} but {} back: each rail is measured both ways",
            senders[0].len(),
            senders[1].len()
        ));
    }
    let one = |from: usize, to: usize| {
        node_figures
            .get(&(from, to))
            .copied()
            .filter(|v| *v > 0.0)
            .ok_or_else(|| {
                format!(
                    "the rails of nodes {a} and {b} have no one-rail figure from {from} to {to}"
                )
            })
    };
    let one_rail = one(a, b)?.min(one(b, a)?);
    let rails = AllRails {
        rails: senders[0].len() as u32,
        gb_per_s: round_figure(sums[0].min(sums[1])),
        one_rail_gb_per_s: round_figure(one_rail),
    };
    Ok(Some((rails, a, b)))
}

/// Node links from a sample of measured pairs: each node's figure is the median of its
/// measured links, sent and received, so that a slow node or NIC (slow in all of them)
/// makes its unmeasured pairs slow too, and one slow partner does not.
fn sampled_node_links(
    n: usize,
    figures: &BTreeMap<(usize, usize), f64>,
    provenance: Provenance,
) -> Option<LinkMatrix> {
    let mut by_node: Vec<Vec<f64>> = vec![Vec::new(); n];
    for (&(a, b), &v) in figures {
        by_node.get_mut(a)?.push(v);
        by_node.get_mut(b)?.push(v);
    }
    let per_node = by_node.iter().map(|v| median(v)).collect();
    let pairs = figures.iter().map(|(&(a, b), &v)| (a, b, v)).collect();
    LinkMatrix::sampled(per_node, pairs, provenance)
}

/// The sweep's section of the profile: one [`MeasuredPerf`] per device name that the
/// report measured, named as the profile names that rank's GPU, with every collective.
pub(super) fn measured_perf(
    profile: &ClusterProfile,
    report: &ProbeReport,
    sweep: Option<&SweepSpec>,
    today: &str,
) -> Result<Vec<MeasuredPerf>, ProfileRunError> {
    let Some(sweep) = sweep else {
        return Ok(Vec::new());
    };
    let bad = |detail: String| ProfileRunError::BadResult { detail };
    let rank_info = |rank: usize| report.ranks.iter().find(|r| r.rank == rank);
    let collectives: Vec<CollectiveFigure> = report
        .collectives
        .iter()
        .map(|c| CollectiveFigure {
            op: c.op.clone(),
            ranks: c.ranks,
            bytes: c.bytes,
            us: round_figure(c.us),
        })
        .collect();
    let shape_set = cache::key_of(&sweep.to_json());
    let mut out: Vec<MeasuredPerf> = Vec::new();
    for record in &report.sweep {
        let info = rank_info(record.rank)
            .ok_or_else(|| bad(format!("the sweep names rank {}", record.rank)))?;
        let gpu = profile
            .nodes
            .get(info.node)
            .and_then(|n| n.gpus())
            .and_then(|g| g.get(info.local_rank))
            .ok_or_else(|| {
                bad(format!(
                    "the sweep's rank {} is not a GPU of the profile",
                    record.rank
                ))
            })?;
        let dtype = match record.dtype.as_str() {
            "bf16" => Dtype::Bf16,
            "fp16" => Dtype::Fp16,
            "fp32" => Dtype::Fp32,
            other => return Err(bad(format!("the sweep ran in {other:?}"))),
        };
        if out.iter().any(|p| p.gpu == gpu.name && p.dtype == dtype) {
            continue;
        }
        let gemms: Vec<GemmFigure> = record
            .gemms
            .iter()
            .map(|g| GemmFigure {
                tflops: round_figure(g.tflops),
                ..*g
            })
            .collect();
        let attention: Vec<AttentionFigure> = record
            .attention
            .iter()
            .map(|a| AttentionFigure {
                tflops: round_figure(a.tflops),
                ..*a
            })
            .collect();
        let skipped = record.skipped + report.collectives_skipped;
        out.push(MeasuredPerf {
            gpu: gpu.name.clone(),
            dtype,
            shape_set: shape_set.clone(),
            gemms,
            attention,
            hbm_gb_per_s: record.hbm_gb_per_s.map(round_figure),
            collectives: collectives.clone(),
            provenance: Provenance::new(Source::Measured)
                .with_date(today)
                .with_tool(probe::TOOL)
                .with_note(format!(
                    "median of {} on rank {} alone ({} backend); copy of {} MiB counted as \
                     read + write; collectives timed on rank 0{}",
                    sweep.repeats,
                    record.rank,
                    report.backend,
                    sweep.hbm_bytes >> 20,
                    if skipped > 0 {
                        format!(
                            "; {skipped} shape(s) left out past the {} s budget",
                            sweep.budget_s
                        )
                    } else {
                        String::new()
                    }
                )),
        });
    }
    Ok(out)
}

pub(super) fn gpu_spec(
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
    let measured_tflops: Vec<MeasuredTflops> = measured
        .into_iter()
        .map(|(dtype, tflops)| MeasuredTflops {
            dtype,
            tflops,
            provenance: Provenance::new(Source::Measured)
                .with_date(today)
                .with_tool(probe::TOOL)
                .with_note("median matmul throughput, all GPUs busy at once"),
        })
        .collect();
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
                PeakTflops::new(bf16.map(|_| t), t),
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
    // Each dtype's own figure: fp32 training is timed by the fp32 one (a CPU has no
    // tensor-core peak that fp32 would be a share of), 16-bit training by the bf16 one.
    let measured_tflops = [(Dtype::Bf16, bf16), (Dtype::Fp32, fp32)]
        .into_iter()
        .filter_map(|(dtype, tflops)| {
            Some(MeasuredTflops {
                dtype,
                tflops: tflops?,
                provenance: Provenance::new(Source::Measured)
                    .with_date(today)
                    .with_tool(probe::TOOL)
                    .with_note(format!(
                        "{dtype} matmul on the CPU, all stand-ins busy at once"
                    )),
            })
        })
        .collect();
    Some(GpuSpec {
        index,
        name: "cpu".into(),
        memory_bytes: memory_bytes.max(1),
        peak_tflops: PeakTflops::new(Some(best), best),
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
