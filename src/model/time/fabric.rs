//! The cluster as the time model reads it: the bandwidth between any two GPUs and the
//! throughput of each, in flat tables that one evaluation reads thousands of times.
//!
//! [`Fabric`] is what the fast evaluation ([`super::ConfigCosts::evaluate`]) needs;
//! [`ClusterFabric`] implements it for a [`ClusterProfile`], and tests or the planner may
//! implement it for anything else (a perturbed copy, a synthetic topology).

use serde::Serialize;

use crate::cluster::profile::{Dtype, GpuInventory, GpuSpec, LinkMatrix, Source};
use crate::cluster::ClusterProfile;
use crate::config::Precision;
use crate::model::calibration::Calibration;
use crate::model::parallel::Device;

use super::perf::{GpuKind, PerfTables};
use super::TimeError;

/// fp32 training runs on CUDA cores, not tensor cores (PyTorch leaves TF32 off for matrix
/// multiplies by default): A100 19.5 of 312, H100 67 of 989, V100 15.7 of 125 TFLOPS. The
/// model takes 1/16 of the fp16 tensor peak.
pub const FP32_SHARE_OF_FP16_PEAK: f64 = 1.0 / 16.0;

/// What the fast evaluation asks of a cluster. Both methods must be cheap (a table lookup)
/// and must not allocate.
pub trait Fabric {
    /// Attained bandwidth from `from` to `to`, GB/s: the node's GPU-pair figure when both are
    /// on one node, else the node pair's figure. Positive for distinct devices.
    fn gb_per_s(&self, from: Device, to: Device) -> f64;
    /// Milliseconds per GFLOP on `device` (1 / effective TFLOPS); infinite for a GPU that
    /// cannot run the training dtype.
    fn ms_per_gflop(&self, device: Device) -> f64;
    /// The GPU's kind (which performance table costs its operations) and its matrix-multiply
    /// rate at 100 % table efficiency, for the per-operation costs of the Pipette model.
    fn gpu_perf(&self, device: Device) -> GpuPerf;
    /// How many node links' worth of bandwidth a collective whose group has `members` GPUs
    /// on `node` gets across the network: NCCL spreads a collective's channels over the
    /// node's NICs, and like collectives of the node's other GPUs run at the same time
    /// (tensor-parallel groups tile the nodes), so the group gets its share of the NICs:
    /// `NICs × members / GPUs on the node`. One when the profile does not know the NICs.
    /// A share above one is scaled by what the rails attained busy at once
    /// (`node_links.all_rails`: measured / (rails × one)), never below one.
    fn nic_share(&self, node: usize, members: usize) -> f64;
    /// The NIC share of one data-parallel ring crossing `node` when tensor-parallel groups
    /// of `tp` tile the nodes: the node's GPUs run `tp` such rings at once (one per tp
    /// rank), so each holds `GPUs / tp` of them: [`Fabric::nic_share`] of that many. One
    /// when the profile does not know the NICs.
    fn dp_ring_nic_share(&self, node: usize, tp: usize) -> f64;
    /// Whether traffic between GPUs of nodes `a` and `b` goes through the nodes' NICs:
    /// distinct nodes outside one NVLink domain.
    fn over_network(&self, a: usize, b: usize) -> bool {
        a != b
    }
}

/// What the per-operation costs need of one GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuPerf {
    pub kind: GpuKind,
    /// Milliseconds per GFLOP at the table's 100 % (1 / (peak TFLOPS × `gemm_scale`); with a
    /// measured throughput, that throughput is taken as the table's best shape). Infinite for
    /// a GPU that cannot run the training dtype.
    pub ms_per_peak_gflop: f64,
}

/// Where a GPU's effective throughput came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ThroughputBasis {
    /// A measured matrix-multiply figure for the training dtype (fp32 too, where one was
    /// measured), times the calibration's `measured_compute_efficiency`.
    Measured,
    /// The datasheet peak for the training dtype, times `compute_efficiency`.
    Peak,
    /// fp32 training with no measured fp32 figure: [`FP32_SHARE_OF_FP16_PEAK`] of the
    /// fp16 peak, times `compute_efficiency`.
    Fp32FromFp16Peak,
    /// The GPU has no tensor cores for the training dtype (bf16 on a V100).
    Unsupported,
}

/// The effective throughput the time model uses for one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GpuThroughput {
    /// Effective TFLOPS (0 when unsupported).
    pub tflops: f64,
    pub basis: ThroughputBasis,
}

#[derive(Debug, Clone, Copy)]
struct NodeSlots {
    /// Index of the node's first GPU in the per-device tables.
    device_base: usize,
    /// Index of the node's GPU link matrix in `gpu_links`.
    link_base: usize,
    gpus: usize,
}

/// A [`ClusterProfile`] flattened for the time model: every bandwidth and every GPU's
/// effective throughput for one training dtype and calibration.
#[derive(Debug, Clone)]
pub struct ClusterFabric {
    node_count: usize,
    /// Node to node, GB/s.
    node_links: LinkMatrix,
    slots: Vec<NodeSlots>,
    /// Each node's GPU × GPU matrix, row-major, one after another.
    gpu_links: Vec<f64>,
    /// Per device: 1 / effective TFLOPS.
    ms_per_gflop: Vec<f64>,
    throughput: Vec<GpuThroughput>,
    perf: Vec<GpuPerf>,
    /// Per node: its slowest GPU pair (infinite for a one-GPU node).
    slowest_intra: Vec<f64>,
    /// NICs per node (`node_links.nics_per_node`), if the profile knows them.
    nics_per_node: Option<f64>,
    /// The share of k × one NIC that k NICs attained busy at once
    /// (`node_links.all_rails`, [`crate::cluster::profile::AllRails::efficiency`]); 1 when
    /// not measured.
    rail_efficiency: f64,
    /// Per node: its NVLink domain as an index (`None`: its NVLink ends at the node).
    domain: Vec<Option<u32>>,
    /// The tables of every GPU kind: the profile's measured ones where it has them.
    tables: PerfTables,
}

impl ClusterFabric {
    /// Flattens `cluster` for training in `precision`. Fails when a node's GPUs are unknown
    /// (imported profiles: fill them in first) or a calibration factor is out of range.
    pub fn new(
        cluster: &ClusterProfile,
        precision: Precision,
        calibration: &Calibration,
    ) -> Result<Self, TimeError> {
        super::check_calibration(calibration)?;
        let node_count = cluster.nodes.len();
        // Not flattened: a sampled matrix holds a figure per node, not one per node pair.
        let node_links = cluster.node_links.clone();
        let mut slots = Vec::with_capacity(node_count);
        let mut gpu_links = Vec::new();
        let mut ms_per_gflop = Vec::new();
        let mut throughput = Vec::new();
        let mut perf = Vec::new();
        let mut slowest_intra = Vec::with_capacity(node_count);
        let tables = PerfTables::for_cluster(cluster, training_dtype(precision));
        for node in &cluster.nodes {
            let GpuInventory::Known { gpus, links } = &node.gpus else {
                return Err(TimeError::UnknownGpus {
                    host: node.host.clone(),
                });
            };
            slots.push(NodeSlots {
                device_base: throughput.len(),
                link_base: gpu_links.len(),
                gpus: gpus.len(),
            });
            for from in 0..gpus.len() {
                gpu_links.extend(links.row(from));
            }
            slowest_intra.push(links.min_link().unwrap_or(f64::INFINITY));
            for gpu in gpus {
                let t = effective_throughput(gpu, precision, calibration);
                ms_per_gflop.push(if t.tflops > 0.0 {
                    1.0 / t.tflops
                } else {
                    f64::INFINITY
                });
                throughput.push(t);
                perf.push(gpu_perf(gpu, t, precision, calibration, &tables));
            }
        }
        Ok(ClusterFabric {
            node_count,
            node_links,
            slots,
            gpu_links,
            ms_per_gflop,
            throughput,
            perf,
            slowest_intra,
            nics_per_node: cluster.node_links.nics_per_node.map(f64::from),
            rail_efficiency: cluster
                .node_links
                .all_rails()
                .map_or(1.0, |rails| rails.efficiency()),
            domain: domain_indices(cluster),
            tables,
        })
    }

    /// The tables every GPU kind is priced with ([`PerfTables::for_cluster`]).
    pub fn tables(&self) -> &PerfTables {
        &self.tables
    }

    /// Nodes in the cluster.
    pub fn node_count(&self) -> usize {
        self.node_count
    }

    /// GPUs on `node` (0 for a node outside the cluster).
    pub fn gpus_on(&self, node: usize) -> usize {
        self.slots.get(node).map_or(0, |s| s.gpus)
    }

    /// GPUs in the cluster.
    pub fn gpu_count(&self) -> usize {
        self.throughput.len()
    }

    /// A dense index of `device` in `0..gpu_count()`, or `None` outside the cluster.
    pub fn device_index(&self, device: Device) -> Option<usize> {
        let slot = self.slots.get(device.node)?;
        (device.gpu < slot.gpus).then_some(slot.device_base + device.gpu)
    }

    /// The effective throughput of `device`.
    ///
    /// # Panics
    /// When the device is outside the cluster.
    pub fn throughput(&self, device: Device) -> GpuThroughput {
        self.throughput[self.slots[device.node].device_base + device.gpu]
    }

    /// Whether the node links were measured on a sample of pairs (see
    /// [`LinkMatrix::sampled`]): a figure per node, not per pair.
    pub fn node_links_sampled(&self) -> bool {
        self.node_links.is_sampled()
    }

    /// The slowest GPU pair inside `node`, GB/s (infinite for a one-GPU node).
    pub fn slowest_intra_node(&self, node: usize) -> f64 {
        self.slowest_intra[node]
    }
}

impl Fabric for ClusterFabric {
    #[inline]
    fn gb_per_s(&self, from: Device, to: Device) -> f64 {
        if from.node == to.node {
            let slot = self.slots[from.node];
            self.gpu_links[slot.link_base + from.gpu * slot.gpus + to.gpu]
        } else if !self.over_network(from.node, to.node) {
            // One NVLink domain: the GPUs reach each other at the nodes' GPU-pair rates,
            // the slower node's slowest pair bounding.
            let rate = self.slowest_intra[from.node].min(self.slowest_intra[to.node]);
            if rate.is_finite() {
                rate
            } else {
                self.node_links.get(from.node, to.node)
            }
        } else {
            self.node_links.get(from.node, to.node)
        }
    }

    #[inline]
    fn over_network(&self, a: usize, b: usize) -> bool {
        a != b && (self.domain[a].is_none() || self.domain[a] != self.domain[b])
    }

    #[inline]
    fn ms_per_gflop(&self, device: Device) -> f64 {
        self.ms_per_gflop[self.slots[device.node].device_base + device.gpu]
    }

    #[inline]
    fn gpu_perf(&self, device: Device) -> GpuPerf {
        self.perf[self.slots[device.node].device_base + device.gpu]
    }

    #[inline]
    fn nic_share(&self, node: usize, members: usize) -> f64 {
        match self.nics_per_node {
            Some(nics) => {
                let share = nics * members as f64 / self.slots[node].gpus.max(1) as f64;
                // More than one NIC's worth: what the rails attained busy at once bounds it
                // (a shared PCIe switch, a port down), never below the one NIC that the
                // node-link figure itself measured.
                if share > 1.0 {
                    (share * self.rail_efficiency).max(1.0)
                } else {
                    share
                }
            }
            None => 1.0,
        }
    }

    #[inline]
    fn dp_ring_nic_share(&self, node: usize, tp: usize) -> f64 {
        let members = (self.slots[node].gpus / tp.max(1)).max(1);
        self.nic_share(node, members)
    }
}

/// Each node's NVLink domain as an index into the distinct ids, in node order.
fn domain_indices(cluster: &ClusterProfile) -> Vec<Option<u32>> {
    let mut ids: Vec<&str> = Vec::new();
    cluster
        .nodes
        .iter()
        .map(|n| {
            let id = n.nvlink_domain.as_deref()?;
            let at = ids.iter().position(|x| *x == id).unwrap_or_else(|| {
                ids.push(id);
                ids.len() - 1
            });
            Some(at as u32)
        })
        .collect()
}

/// The per-operation rate of one GPU: its datasheet peak for the training dtype (fp32: the
/// CUDA-core share of the fp16 peak) times the calibration's `gemm_scale`, or a measured
/// best-shape throughput (fp32 too) mapped onto the table's best efficiency. With a
/// measured table the efficiencies are shares of the peak the table was measured against,
/// so that peak is the rate: the sweep's own throughputs govern.
fn gpu_perf(
    gpu: &GpuSpec,
    t: GpuThroughput,
    precision: Precision,
    calibration: &Calibration,
    tables: &PerfTables,
) -> GpuPerf {
    let kind = GpuKind::of(&gpu.name);
    let table = tables.get(kind);
    let peak = match t.basis {
        ThroughputBasis::Unsupported => 0.0,
        _ if table.measured.is_some() => table.peak_tflops * calibration.gemm_scale,
        ThroughputBasis::Measured => t.tflops / table.best_efficiency * calibration.gemm_scale,
        ThroughputBasis::Fp32FromFp16Peak | ThroughputBasis::Peak => {
            matmul_peak(gpu, training_dtype(precision)).unwrap_or(0.0) * calibration.gemm_scale
        }
    };
    GpuPerf {
        kind,
        ms_per_peak_gflop: if peak > 0.0 {
            1.0 / peak
        } else {
            f64::INFINITY
        },
    }
}

/// The training dtype's tensor-core dtype, `None` for fp32.
pub fn tensor_dtype(precision: Precision) -> Option<Dtype> {
    match precision {
        Precision::Bf16 => Some(Dtype::Bf16),
        Precision::Fp16 => Some(Dtype::Fp16),
        Precision::Fp32 => None,
    }
}

/// The rate a GPU's matrix multiplies in `dtype` are measured against, TFLOPS: the
/// datasheet tensor peak for a 16-bit dtype (`None`: no tensor cores for it); for fp32 a
/// measured fp32 rate where there is one ([`measured_fp32`]), else
/// [`FP32_SHARE_OF_FP16_PEAK`] of the fp16 peak.
pub(super) fn matmul_peak(gpu: &GpuSpec, dtype: Dtype) -> Option<f64> {
    match dtype {
        Dtype::Fp32 => {
            Some(measured_fp32(gpu).unwrap_or(gpu.peak_tflops.fp16 * FP32_SHARE_OF_FP16_PEAK))
        }
        _ => gpu.peak_tflops.get(dtype),
    }
}

/// A measured fp32 matmul rate: the GPU's fp32 figure, or for a device whose peak is
/// itself a measured matmul rate (a CPU stand-in; profiles written before its fp32
/// figure was kept, or by hand) that peak, which no CUDA-core share applies to.
fn measured_fp32(gpu: &GpuSpec) -> Option<f64> {
    gpu.measured(Dtype::Fp32)
        .map(|m| m.tflops)
        .or((gpu.provenance.source == Source::Measured).then_some(gpu.peak_tflops.fp16))
}

/// The peak a job training in `precision` on `gpu` is held against for its MFU, TFLOPS: a
/// rate the job cannot beat, so that MFU never passes 100 %. That is a datasheet figure:
/// the tensor peak in bf16/fp16, the CUDA cores' share of the fp16 peak
/// ([`FP32_SHARE_OF_FP16_PEAK`]) in fp32. `None` where the only rate known is a measured
/// matmul rate (a CPU stand-in, whose profile peak is its measured matmul): the job's own
/// matrix multiplies can run faster than the probe's (another shape, more threads), and a
/// CPU run showed "MFU 107 %" against it.
pub fn mfu_peak_tflops(gpu: &GpuSpec, precision: Precision) -> Option<f64> {
    if gpu.provenance.source == Source::Measured {
        return None;
    }
    match training_dtype(precision) {
        Dtype::Fp32 => Some(gpu.peak_tflops.fp16 * FP32_SHARE_OF_FP16_PEAK),
        dtype => gpu.peak_tflops.get(dtype),
    }
    .filter(|p| *p > 0.0)
}

/// The dtype the matrix multiplies of `precision` training run in.
pub(super) fn training_dtype(precision: Precision) -> Dtype {
    tensor_dtype(precision).unwrap_or(Dtype::Fp32)
}

/// A measured figure for the training dtype governs (fp32 included: a CPU stand-in's
/// measured fp32 matmul, see [`measured_fp32`]); without one, the datasheet peak, and for
/// fp32 the CUDA-core share of the fp16 peak, which is right only for a GPU whose peak is
/// a tensor-core datasheet figure.
fn effective_throughput(
    gpu: &GpuSpec,
    precision: Precision,
    calibration: &Calibration,
) -> GpuThroughput {
    let measured = match tensor_dtype(precision) {
        Some(dtype) => gpu.measured(dtype).map(|m| m.tflops),
        None => measured_fp32(gpu),
    };
    if let Some(tflops) = measured {
        return GpuThroughput {
            tflops: tflops * calibration.measured_compute_efficiency,
            basis: ThroughputBasis::Measured,
        };
    }
    // No measured figure: `matmul_peak` gives the datasheet peak, for fp32 its CUDA-core
    // share.
    let dtype = training_dtype(precision);
    match matmul_peak(gpu, dtype) {
        Some(peak) => GpuThroughput {
            tflops: peak * calibration.compute_efficiency,
            basis: if dtype == Dtype::Fp32 {
                ThroughputBasis::Fp32FromFp16Peak
            } else {
                ThroughputBasis::Peak
            },
        },
        None => GpuThroughput {
            tflops: 0.0,
            basis: ThroughputBasis::Unsupported,
        },
    }
}
