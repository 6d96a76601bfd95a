//! Heterogeneous clusters: which kinds of GPU the cluster has, and the orders in which the
//! pipeline may cross them.
//!
//! Stock Megatron cannot vary tp or dp per pipeline stage, but it can give stages different
//! layer counts, so on a cluster that mixes GPU generations the planner places each kind of
//! GPU on its own pipeline stages and sizes every stage's share of the layers to its GPUs'
//! speed and memory ([`super::layers`]).
//!
//! - A [`GpuClass`] is a set of nodes whose GPUs are alike: the same model name(s) and
//!   memory, and effective throughputs within [`SAME_SPEED`] of the class's fastest node
//!   (measured figures jitter by a few per cent; a node that is 10 % slower is a class of its
//!   own). Each class is taken at its slowest node and smallest memory. A cluster with one
//!   class is homogeneous and planned exactly as before.
//! - An [`Arrangement`] orders the nodes class by class along the node ranks (and so along
//!   the pipeline, which takes node ranks in order): every permutation of the classes when
//!   there are at most [`MAX_PERMUTED_CLASSES`], else fastest first and slowest first. Within
//!   a class nodes keep the profile's order. Its mapping space lets nodes trade places only
//!   within their class, so every mapping keeps each stage on the GPUs its layers were sized
//!   for (a V100 node never swaps into a stage sized for A100s).
//! - A stage's **speed** is its slowest GPU and its **capacity** the smallest usable memory
//!   (memory less the headroom) of the nodes it touches: whole nodes, because the mapping may
//!   reorder GPUs within a node.
//!
//! The planner requires the same GPU count on every node (node ranks hold equal blocks of
//! ranks); this module relies on it.

use crate::cluster::profile::GpuInventory;
use crate::cluster::ClusterProfile;
use crate::model::parallel::{Device, ParallelConfig};
use crate::model::time::{ClusterFabric, Fabric};

use super::mapping::MappingSpace;
use super::search::{MemoryHeadroom, PlanError};
use crate::config::Precision;
use crate::model::calibration::Calibration;

/// Nodes whose slowest GPUs are within this ratio of the class's fastest node's are one
/// class.
pub const SAME_SPEED: f64 = 1.1;

/// With at most this many classes every order of them along the pipeline is tried (4! =
/// 24); with more, fastest first and slowest first.
pub const MAX_PERMUTED_CLASSES: usize = 4;

/// Nodes whose GPUs are alike.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuClass {
    /// The GPUs' model name(s), `+`-joined when a node mixes models.
    pub name: String,
    /// The smallest GPU memory of the class, bytes.
    pub memory_bytes: u64,
    /// The smallest usable memory (memory less the headroom), bytes.
    pub usable_bytes: u64,
    /// The slowest GPU's ms per GFLOP.
    pub ms_per_gflop: f64,
    /// Profile positions of its nodes, ascending.
    pub nodes: Vec<usize>,
}

/// A node's GPUs.
fn node_gpus(cluster: &ClusterProfile, n: usize) -> &[crate::cluster::profile::GpuSpec] {
    match &cluster.nodes[n].gpus {
        GpuInventory::Known { gpus, .. } => gpus.as_slice(),
        GpuInventory::Unknown => &[],
    }
}

/// A node's smallest GPU memory and smallest usable memory (less the headroom), bytes.
fn node_memory(cluster: &ClusterProfile, headroom: MemoryHeadroom, n: usize) -> (u64, u64) {
    let gpus = node_gpus(cluster, n);
    let memory = gpus.iter().map(|g| g.memory_bytes).min().unwrap_or(0);
    let usable = gpus
        .iter()
        .map(|g| {
            g.memory_bytes
                .saturating_sub(headroom.bytes(g.memory_bytes))
        })
        .min()
        .unwrap_or(0);
    (memory, usable)
}

/// What the planner needs of one node: its GPUs' names, smallest memory and usable memory,
/// and its slowest GPU's ms per GFLOP.
fn node_summary(
    cluster: &ClusterProfile,
    fabric: &ClusterFabric,
    headroom: MemoryHeadroom,
    n: usize,
) -> (String, u64, u64, f64) {
    let gpus = node_gpus(cluster, n);
    let mut names: Vec<&str> = gpus.iter().map(|g| g.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let (memory, usable) = node_memory(cluster, headroom, n);
    let slowest = (0..gpus.len())
        .map(|gpu| fabric.ms_per_gflop(Device { node: n, gpu }))
        .fold(0.0, f64::max);
    (names.join("+"), memory, usable, slowest)
}

/// The cluster's classes of nodes, fastest first (then larger memory, then name).
pub fn gpu_classes(
    cluster: &ClusterProfile,
    fabric: &ClusterFabric,
    headroom: MemoryHeadroom,
) -> Vec<GpuClass> {
    let mut nodes: Vec<(usize, (String, u64, u64, f64))> = (0..cluster.nodes.len())
        .map(|n| (n, node_summary(cluster, fabric, headroom, n)))
        .collect();
    // By kind, then fastest first, so that a class is a run of this list.
    nodes.sort_by(|(a, x), (b, y)| {
        (&x.0, x.1)
            .cmp(&(&y.0, y.1))
            .then(x.3.total_cmp(&y.3))
            .then(a.cmp(b))
    });
    let mut classes: Vec<(f64, GpuClass)> = Vec::new();
    for (n, (name, memory, usable, speed)) in nodes {
        match classes.last_mut() {
            Some((fastest, class))
                if class.name == name
                    && class.memory_bytes == memory
                    && speed <= *fastest * SAME_SPEED =>
            {
                class.usable_bytes = class.usable_bytes.min(usable);
                class.ms_per_gflop = class.ms_per_gflop.max(speed);
                class.nodes.push(n);
            }
            _ => classes.push((
                speed,
                GpuClass {
                    name,
                    memory_bytes: memory,
                    usable_bytes: usable,
                    ms_per_gflop: speed,
                    nodes: vec![n],
                },
            )),
        }
    }
    let mut classes: Vec<GpuClass> = classes.into_iter().map(|(_, c)| c).collect();
    for class in &mut classes {
        class.nodes.sort_unstable();
    }
    classes.sort_by(|a, b| {
        a.ms_per_gflop
            .total_cmp(&b.ms_per_gflop)
            .then(b.memory_bytes.cmp(&a.memory_bytes))
            .then(a.name.cmp(&b.name))
            .then(a.nodes.cmp(&b.nodes))
    });
    classes
}

/// The orders of `classes` classes along the pipeline (see the module doc), the fastest
/// first order first.
pub fn class_orders(classes: usize) -> Vec<Vec<usize>> {
    if classes > MAX_PERMUTED_CLASSES {
        let fastest: Vec<usize> = (0..classes).collect();
        let slowest = fastest.iter().rev().copied().collect();
        return vec![fastest, slowest];
    }
    let mut out = Vec::new();
    let mut order: Vec<usize> = (0..classes).collect();
    permutations(&mut order, 0, &mut out);
    out.sort();
    out
}

fn permutations(items: &mut Vec<usize>, k: usize, out: &mut Vec<Vec<usize>>) {
    if k + 1 >= items.len() {
        out.push(items.clone());
        return;
    }
    for i in k..items.len() {
        items.swap(k, i);
        permutations(items, k + 1, out);
        items.swap(k, i);
    }
}

/// One order of the nodes along the node ranks, with the cluster seen in that order.
#[derive(Debug, Clone)]
pub struct Arrangement {
    /// Node rank → profile position of the node (before any mapping).
    pub order: Vec<usize>,
    /// Node rank → its class (index into the classes).
    pub class_of: Vec<usize>,
    /// Node rank → the node's usable memory (its smallest GPU's, less the headroom).
    pub usable: Vec<u64>,
    /// Node rank → the node's smallest GPU memory.
    pub memory: Vec<u64>,
    /// The cluster with its nodes in `order` (node `i` of this fabric is node rank `i`).
    pub fabric: ClusterFabric,
    /// The mapping space over `fabric`, node swaps confined to classes.
    pub space: MappingSpace,
    /// GPUs per node.
    pub gpus_per_node: usize,
}

impl Arrangement {
    /// The nodes class by class in `class_order`; `fabric` and `hosts` are the profile's.
    /// With one class the order is the profile's and the fabric a copy of `fabric`.
    pub fn new(
        cluster: &ClusterProfile,
        fabric: &ClusterFabric,
        classes: &[GpuClass],
        class_order: &[usize],
        headroom: MemoryHeadroom,
        precision: Precision,
        calibration: &Calibration,
    ) -> Result<Self, PlanError> {
        let order: Vec<usize> = class_order
            .iter()
            .flat_map(|&c| classes[c].nodes.iter().copied())
            .collect();
        let class_of: Vec<usize> = class_order
            .iter()
            .flat_map(|&c| std::iter::repeat_n(c, classes[c].nodes.len()))
            .collect();
        let identity = order.iter().enumerate().all(|(i, &n)| i == n);
        let fabric = if identity {
            fabric.clone()
        } else {
            let hosts: Vec<_> = order
                .iter()
                .map(|&n| crate::cluster::profile::NodeSelection {
                    host: cluster.nodes[n].host.as_str(),
                    devices: crate::cluster::profile::DeviceSelection::All,
                })
                .collect();
            let permuted = cluster
                .subset(&hosts)
                .expect("every host of the profile is in it");
            ClusterFabric::new(&permuted, precision, calibration)?
        };
        let hosts: Vec<&str> = order
            .iter()
            .map(|&n| cluster.nodes[n].host.as_str())
            .collect();
        let sizes: Vec<usize> = class_order
            .iter()
            .map(|&c| classes[c].nodes.len())
            .collect();
        let space = MappingSpace::new(&fabric, &hosts)?.with_node_groups(&sizes);
        let (memory, usable) = order
            .iter()
            .map(|&n| node_memory(cluster, headroom, n))
            .unzip();
        Ok(Arrangement {
            gpus_per_node: space.gpus_per_node(),
            order,
            class_of,
            usable,
            memory,
            fabric,
            space,
        })
    }

    /// The node ranks stage `s` of `config` occupies (its ranks `tp·dp·s .. tp·dp·(s+1)`).
    pub fn stage_nodes(&self, config: &ParallelConfig, s: usize) -> std::ops::Range<usize> {
        let g = self.gpus_per_node.max(1);
        let per_stage = (config.tp * config.dp) as usize;
        let first = per_stage * s / g;
        let last = (per_stage * (s + 1)).saturating_sub(1) / g;
        first..last + 1
    }

    /// Stage `s`'s usable memory: the smallest of the nodes it touches.
    pub fn stage_usable(&self, config: &ParallelConfig, s: usize) -> u64 {
        self.stage_nodes(config, s)
            .map(|n| self.usable[n])
            .min()
            .unwrap_or(0)
    }

    /// Stage `s`'s GPU memory: the smallest of the nodes it touches.
    pub fn stage_memory(&self, config: &ParallelConfig, s: usize) -> u64 {
        self.stage_nodes(config, s)
            .map(|n| self.memory[n])
            .min()
            .unwrap_or(0)
    }

    /// The classes stage `s` runs on, in node-rank order, without repeats.
    pub fn stage_classes(&self, config: &ParallelConfig, s: usize) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        for n in self.stage_nodes(config, s) {
            if !out.contains(&self.class_of[n]) {
                out.push(self.class_of[n]);
            }
        }
        out
    }

    /// The GPU model(s) stage `s` runs on, `+`-joined when it spans classes.
    pub fn stage_gpu(&self, config: &ParallelConfig, s: usize, classes: &[GpuClass]) -> String {
        self.stage_classes(config, s)
            .iter()
            .map(|&k| classes[k].name.as_str())
            .collect::<Vec<_>>()
            .join("+")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::profile::Dtype;
    use crate::cluster::profile::{
        GpuSpec, LinkMatrix, MeasuredTflops, NodeProfile, PeakTflops, Provenance, Source,
    };

    /// Nodes of 2 GPUs: (name, memory GiB, measured bf16 TFLOPS).
    fn cluster(nodes: &[(&str, u64, f64)]) -> ClusterProfile {
        let p = Provenance::new(Source::Estimated);
        ClusterProfile {
            measured_perf: Vec::new(),
            note: None,
            nodes: nodes
                .iter()
                .enumerate()
                .map(|(n, &(name, gib, tflops))| NodeProfile {
                    host: format!("n{n}"),
                    gpus: GpuInventory::Known {
                        gpus: (0..2)
                            .map(|i| GpuSpec {
                                index: i,
                                name: name.into(),
                                memory_bytes: gib << 30,
                                peak_tflops: PeakTflops::new(Some(312.0), 312.0),
                                measured_tflops: vec![MeasuredTflops {
                                    dtype: Dtype::Bf16,
                                    tflops,
                                    provenance: p.clone(),
                                }],
                                provenance: p.clone(),
                            })
                            .collect(),
                        links: LinkMatrix::uniform(2, 200.0, p.clone()),
                    },
                    nvlink_domain: None,
                })
                .collect(),
            node_links: LinkMatrix::uniform(nodes.len(), 20.0, p),
        }
    }

    fn classes(nodes: &[(&str, u64, f64)]) -> Vec<GpuClass> {
        let c = cluster(nodes);
        let fabric = ClusterFabric::new(&c, Precision::Bf16, &Calibration::default()).unwrap();
        gpu_classes(&c, &fabric, MemoryHeadroom::default())
    }

    #[test]
    fn jitter_is_one_class_and_a_slow_node_or_other_memory_is_another() {
        // Measured figures a few per cent apart: one class, homogeneous.
        let same = classes(&[
            ("A100", 80, 250.0),
            ("A100", 80, 246.0),
            ("A100", 80, 252.0),
        ]);
        assert_eq!(same.len(), 1);
        assert_eq!(same[0].nodes, [0, 1, 2]);
        // A node 20 % slower, and a node with less memory: three classes, fastest first.
        let mixed = classes(&[
            ("A100", 80, 250.0),
            ("A100", 40, 250.0),
            ("A100", 80, 200.0),
            ("A100", 80, 249.0),
        ]);
        let summary: Vec<(u64, Vec<usize>)> = mixed
            .iter()
            .map(|c| (c.memory_bytes >> 30, c.nodes.clone()))
            .collect();
        // (The 40 GB node is fastest: its class is not held back by the 249-TFLOPS node.)
        assert_eq!(summary, [(40, vec![1]), (80, vec![0, 3]), (80, vec![2])]);
        assert_eq!(mixed[1].usable_bytes, (80u64 << 30) - (80u64 << 30) / 20);
    }

    #[test]
    fn orders_are_every_permutation_of_few_classes_else_the_two_extremes() {
        assert_eq!(class_orders(2), [vec![0, 1], vec![1, 0]]);
        let four = class_orders(4);
        assert_eq!(four.len(), 24);
        assert_eq!(four[0], [0, 1, 2, 3], "fastest first comes first");
        assert_eq!(class_orders(5), [vec![0, 1, 2, 3, 4], vec![4, 3, 2, 1, 0]]);
    }

    #[test]
    fn an_arrangement_puts_classes_in_order_and_stages_take_their_nodes() {
        let c = cluster(&[
            ("V100", 32, 100.0),
            ("A100", 80, 250.0),
            ("V100", 32, 100.0),
        ]);
        let fabric = ClusterFabric::new(&c, Precision::Bf16, &Calibration::default()).unwrap();
        let classes = gpu_classes(&c, &fabric, MemoryHeadroom::Bytes(0));
        let a = Arrangement::new(
            &c,
            &fabric,
            &classes,
            &[1, 0],
            MemoryHeadroom::Bytes(0),
            Precision::Bf16,
            &Calibration::default(),
        )
        .unwrap();
        assert_eq!(a.order, [0, 2, 1], "the V100s first, then the A100");
        assert_eq!(a.space.node_groups(), [(0, 2), (2, 3)]);
        // Stages of 3 GPUs over nodes of 2: stage 1 spans a V100 and the A100 node.
        let config = ParallelConfig::even(6, 1, 2, 3, 1);
        assert_eq!(a.stage_nodes(&config, 0), 0..2);
        assert_eq!(a.stage_nodes(&config, 1), 1..3);
        assert_eq!(a.stage_usable(&config, 1), 32 << 30);
        assert_eq!(a.stage_gpu(&config, 1, &classes), "V100+A100");
        // The arranged fabric is the profile's with the nodes in that order.
        let d = |node, gpu| Device { node, gpu };
        assert_eq!(a.fabric.ms_per_gflop(d(2, 0)), fabric.ms_per_gflop(d(1, 0)));
    }
}
