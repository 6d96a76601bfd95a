//! Generated clusters for the planner benchmark (`benches/plan.rs`,
//! `examples/bench_plan.rs`): `nodes` identical nodes with seeded jitter on every link and
//! a few degraded node pairs, as real measurements look.

use pipette::cluster::profile::{
    GpuInventory, GpuSpec, LinkMatrix, NodeProfile, PeakTflops, Provenance, Source,
};
use pipette::cluster::ClusterProfile;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// An 80 GB GPU with the given dense bf16/fp16 peak.
pub fn gpu(name: &str, tflops: f64) -> GpuSpec {
    GpuSpec {
        index: 0,
        name: name.into(),
        memory_bytes: 80 << 30,
        peak_tflops: PeakTflops::new(Some(tflops), tflops),
        measured_tflops: Vec::new(),
        provenance: Provenance::new(Source::Datasheet),
    }
}

/// `nodes` × `per_node` GPUs: GPU pairs at `intra` GB/s and node pairs at `inter`, each
/// link jittered by ±1.5 %, and 2 % of the node pairs (one direction) at 40–60 %.
pub fn generated(
    nodes: usize,
    per_node: usize,
    gpu: &GpuSpec,
    intra: f64,
    inter: f64,
    seed: u64,
) -> ClusterProfile {
    mixed(
        &[NodeKind {
            nodes,
            gpu: gpu.clone(),
            intra,
            nic: inter,
        }],
        per_node,
        seed,
    )
}

/// One kind of node in a [`mixed`] cluster.
pub struct NodeKind {
    pub nodes: usize,
    pub gpu: GpuSpec,
    /// GPU pairs inside a node, GB/s.
    pub intra: f64,
    /// What one NIC of such a node attains, GB/s.
    pub nic: f64,
}

/// The kinds' nodes one after another, `per_node` GPUs each: GPU pairs at their kind's
/// `intra`, a node pair at the slower of the two NICs, each link jittered by ±1.5 %, and 2 %
/// of the node pairs (one direction) at 40–60 %.
pub fn mixed(kinds: &[NodeKind], per_node: usize, seed: u64) -> ClusterProfile {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let provenance = Provenance::new(Source::Estimated).with_note("generated for the benchmark");
    let jitter = |rng: &mut ChaCha8Rng, x: f64| x * rng.random_range(0.985..1.015);
    let kind_of: Vec<&NodeKind> = kinds
        .iter()
        .flat_map(|k| std::iter::repeat_n(k, k.nodes))
        .collect();
    let nodes = kind_of.len();
    let mut rows = vec![vec![0.0; nodes]; nodes];
    for (a, row) in rows.iter_mut().enumerate() {
        for (b, cell) in row.iter_mut().enumerate() {
            if a != b {
                let inter = kind_of[a].nic.min(kind_of[b].nic);
                let degraded = rng.random::<f64>() < 0.02;
                let base = if degraded {
                    inter * rng.random_range(0.4..0.6)
                } else {
                    inter
                };
                *cell = jitter(&mut rng, base);
            }
        }
    }
    let node_links = LinkMatrix::from_rows(&rows, provenance.clone()).expect("square");
    let nodes = kind_of
        .iter()
        .enumerate()
        .map(|(n, kind)| {
            let mut gpu_rows = vec![vec![0.0; per_node]; per_node];
            for (a, row) in gpu_rows.iter_mut().enumerate() {
                for (b, cell) in row.iter_mut().enumerate() {
                    if a != b {
                        *cell = jitter(&mut rng, kind.intra);
                    }
                }
            }
            NodeProfile {
                host: format!("node{n:04}"),
                gpus: GpuInventory::Known {
                    gpus: (0..per_node)
                        .map(|i| GpuSpec {
                            index: i as u32,
                            ..kind.gpu.clone()
                        })
                        .collect(),
                    links: LinkMatrix::from_rows(&gpu_rows, provenance.clone()).expect("square"),
                },
                nvlink_domain: None,
            }
        })
        .collect();
    ClusterProfile {
        measured_perf: Vec::new(),
        note: Some("generated for the planner benchmark".into()),
        nodes,
        node_links,
    }
}

/// `nodes` identical nodes whose node links were measured on a sample (what a profile of
/// thousands of nodes holds, [`LinkMatrix::sampled`]): each node's NIC figure jittered by
/// ±1.5 %, 2 % of the nodes at 40–60 % of it, and `pairs_per_node` measured pairs from each
/// node to the next ones. GPU pairs inside a node at `intra`.
#[allow(dead_code)] // used by examples/bench_plan.rs only, not by benches/plan.rs
pub fn sampled(
    nodes: usize,
    per_node: usize,
    gpu: &GpuSpec,
    intra: f64,
    inter: f64,
    pairs_per_node: usize,
    seed: u64,
) -> ClusterProfile {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let provenance = Provenance::new(Source::Estimated).with_note("generated for the benchmark");
    let jitter = |rng: &mut ChaCha8Rng, x: f64| x * rng.random_range(0.985..1.015);
    let per_endpoint: Vec<f64> = (0..nodes)
        .map(|_| {
            let degraded = rng.random::<f64>() < 0.02;
            let base = if degraded {
                inter * rng.random_range(0.4..0.6)
            } else {
                inter
            };
            jitter(&mut rng, base)
        })
        .collect();
    let mut pairs = Vec::with_capacity(nodes * pairs_per_node);
    for a in 0..nodes {
        for k in 1..=pairs_per_node.min(nodes.saturating_sub(1)) {
            let b = (a + k) % nodes;
            let figure = jitter(&mut rng, per_endpoint[a].min(per_endpoint[b]));
            pairs.push((a, b, figure));
        }
    }
    let node_links =
        LinkMatrix::sampled(per_endpoint, pairs, provenance.clone()).expect("pairs inside");
    let gpu_rows: Vec<Vec<f64>> = (0..per_node)
        .map(|a| {
            (0..per_node)
                .map(|b| if a == b { 0.0 } else { intra })
                .collect()
        })
        .collect();
    let gpu_links = LinkMatrix::from_rows(&gpu_rows, provenance).expect("square");
    let nodes = (0..nodes)
        .map(|n| NodeProfile {
            host: format!("node{n:05}"),
            gpus: GpuInventory::Known {
                gpus: (0..per_node)
                    .map(|i| GpuSpec {
                        index: i as u32,
                        ..gpu.clone()
                    })
                    .collect(),
                links: gpu_links.clone(),
            },
            nvlink_domain: None,
        })
        .collect();
    ClusterProfile {
        measured_perf: Vec::new(),
        note: Some("generated for the planner benchmark (sampled node links)".into()),
        nodes,
        node_links,
    }
}
