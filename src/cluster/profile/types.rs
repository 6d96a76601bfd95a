//! The profile's types: what the program works with ([`ClusterProfile`] and its parts) and,
//! for the parts whose JSON shape differs from their Rust shape, the file's own shape
//! ([`ProfileFile`] and its parts), all read and written by serde derive.
//!
//! The file types describe the `pipette-cluster/1` schema exactly (every object is closed:
//! `deny_unknown_fields`); they can hold what the program's types cannot (a matrix that is
//! not square, `gpu_links` beside `"gpus": "unknown"`), so that the validation pass can
//! name such a problem by its JSON path before the program's types are built.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::{invalid, show_number};
use super::validate::check_gpu;
use super::{ProfileError, MAX_GPUS_PER_NODE, MAX_PLAUSIBLE_GB_PER_S, SIGNIFICANT_DIGITS};

/// The nodes of a cluster, their GPUs, and the attained bandwidth between them.
///
/// A profile read from a file is valid: matrices match the node and GPU counts, every link
/// has a positive, finite bandwidth, host names are unique. A profile built in code can be
/// checked with [`ClusterProfile::validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterProfile {
    /// What the profile models or where it came from, for people.
    pub note: Option<String>,
    /// The nodes, in the order of `node_links`' rows and columns.
    pub nodes: Vec<NodeProfile>,
    /// Attained bandwidth from node to node (row = sender, column = receiver), GB/s: what one
    /// GPU pair (one NIC) attains across the network. The diagonal is unused and kept at 0.
    pub node_links: LinkMatrix,
    /// What the profile's sweep measured, per kind of GPU (empty when no sweep ran: older
    /// profiles, imported ones, profiles written by hand).
    pub measured_perf: Vec<MeasuredPerf>,
}

/// The profile's performance sweep on one kind of GPU (one device name): matrix
/// multiplies at the shapes of the model being planned, attention, memory bandwidth and
/// collectives, as the time model's tables want them. Written under `"measured_perf"`;
/// optional, so profiles without it still read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredPerf {
    /// The device name as the GPUs of the profile carry it (`NVIDIA A100-SXM4-80GB`, `cpu`).
    pub gpu: String,
    /// The dtype the matrix multiplies and attention ran in.
    pub dtype: Dtype,
    /// What the shapes were chosen for (the model's shape list, as the cache key holds it).
    pub shape_set: String,
    /// Matrix multiplies `m × n × k` (2·m·n·k FLOPs) in one of a linear layer's layouts.
    pub gemms: Vec<GemmFigure>,
    /// Fused attention (`scaled_dot_product_attention`, causal).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attention: Vec<AttentionFigure>,
    /// Attained memory bandwidth of a large device-to-device copy (bytes read + written
    /// per second), GB/s.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_figure"
    )]
    pub hbm_gb_per_s: Option<f64>,
    /// Collective times by operation, group size and message size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collectives: Vec<CollectiveFigure>,
    pub provenance: Provenance,
}

/// Which of a linear layer's three GEMMs a figure is (`fwd`: `y = x·Wᵀ`; `dgrad`:
/// `dx = dy·W`; `wgrad`: `dW = dyᵀ·x`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmLayout {
    Fwd,
    Dgrad,
    Wgrad,
}

impl GemmLayout {
    pub fn as_str(self) -> &'static str {
        match self {
            GemmLayout::Fwd => "fwd",
            GemmLayout::Dgrad => "dgrad",
            GemmLayout::Wgrad => "wgrad",
        }
    }
}

/// A GEMM shape of the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmShape {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub layout: GemmLayout,
}

/// One measured GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmFigure {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub layout: GemmLayout,
    #[serde(deserialize_with = "figure")]
    pub tflops: f64,
}

impl GemmFigure {
    pub fn shape(&self) -> GemmShape {
        GemmShape {
            m: self.m,
            n: self.n,
            k: self.k,
            layout: self.layout,
        }
    }
}

/// An attention shape of the sweep: `batch_heads` heads (micro-batch × heads per GPU) of
/// `seq` tokens, `head_dim` wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionShape {
    pub batch_heads: u64,
    pub seq: u64,
    pub head_dim: u64,
}

/// One measured attention forward pass; `tflops` counts the causal half of the scores and
/// context products (2·bh·s²·d FLOPs), as the time model prices it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionFigure {
    pub batch_heads: u64,
    pub seq: u64,
    pub head_dim: u64,
    #[serde(deserialize_with = "figure")]
    pub tflops: f64,
}

/// One collective over `ranks` processes with a message of `bytes` (per rank): the median
/// time, microseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectiveFigure {
    /// `all_reduce` or `all_gather`.
    pub op: String,
    pub ranks: u32,
    pub bytes: u64,
    #[serde(deserialize_with = "figure")]
    pub us: f64,
}

impl MeasuredPerf {
    /// The all-reduce latency over `ranks` processes, µs: the intercept of the
    /// least-squares line `time = latency + bytes / bandwidth` through the measured sizes
    /// (as the shipped A100 table derives vTrain's), never below zero; `None` with fewer
    /// than two sizes.
    pub fn all_reduce_latency_us(&self, ranks: u32) -> Option<f64> {
        let points: Vec<(f64, f64)> = self
            .collectives
            .iter()
            .filter(|c| c.op == "all_reduce" && c.ranks == ranks)
            .map(|c| (c.bytes as f64, c.us))
            .collect();
        if points.len() < 2 {
            return None;
        }
        let n = points.len() as f64;
        let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
        let my = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
        if sxx == 0.0 {
            return None;
        }
        let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        Some((my - sxy / sxx * mx).max(0.0))
    }
}

/// A node an allocation may use, for [`ClusterProfile::subset`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSelection<'a> {
    pub host: &'a str,
    pub devices: DeviceSelection,
}

/// Which of a node's GPUs an allocation may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelection {
    All,
    /// The first `n` (`--nproc-per-node n`).
    First(usize),
    /// These device indices (`SLURM_JOB_GPUS`, `--include host:0,1`).
    Indices(Vec<u32>),
}

/// One node: its host name and, when known, its GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeProfile {
    /// The host name the launcher reaches the node by.
    pub host: String,
    pub gpus: GpuInventory,
    /// The NVLink fabric the node's GPUs belong to beyond the node (`nvidia-smi -q`'s
    /// fabric ClusterUUID and CliqueId: an NVL72 rack): nodes with the same id reach each
    /// other's GPUs at their `gpu_links` rates, over no NIC. `None`: the node's NVLink ends
    /// at the node.
    pub nvlink_domain: Option<String>,
}

/// What a profile knows of a node's GPUs.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuInventory {
    /// Nothing: the profile was imported from a network-only measurement (Pipette, mpiGraph).
    /// Profiling or [`ClusterProfile::with_default_gpus`] must fill it in before planning.
    Unknown,
    /// The GPUs and the attained bandwidth between every pair of them (row = sender,
    /// column = receiver, both in the order of `gpus`).
    Known {
        gpus: Vec<GpuSpec>,
        links: LinkMatrix,
    },
}

/// One GPU of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// The device index as nvidia-smi numbers it (PCI bus order), as `CUDA_VISIBLE_DEVICES`
    /// names it with `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
    pub index: u32,
    /// The model, e.g. `A100-SXM4-80GB`.
    pub name: String,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// Dense tensor-core peak from the datasheet.
    pub peak_tflops: PeakTflops,
    /// What a matrix-multiply benchmark attained on this GPU, one figure per dtype
    /// measured (a GPU: its tensor-core dtype; a CPU stand-in: bf16 and fp32), in
    /// [`Dtype`] order. Written as one object when there is one figure (the shape older
    /// profiles have), as a list when there are several.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "one_or_list",
        deserialize_with = "one_or_list_of"
    )]
    pub measured_tflops: Vec<MeasuredTflops>,
    /// Where `name`, `memory_bytes` and `peak_tflops` came from.
    pub provenance: Provenance,
}

impl GpuSpec {
    /// The measured matrix-multiply figure for `dtype`, if one was measured.
    pub fn measured(&self, dtype: Dtype) -> Option<&MeasuredTflops> {
        self.measured_tflops.iter().find(|m| m.dtype == dtype)
    }

    /// The JSON path of measured figure `i` of the GPU at `gpu_path`, as the file holds
    /// it (an object for one figure, a list for several).
    pub(super) fn measured_path(&self, gpu_path: &str, i: usize) -> String {
        if self.measured_tflops.len() == 1 {
            format!("{gpu_path}.measured_tflops")
        } else {
            format!("{gpu_path}.measured_tflops[{i}]")
        }
    }
}

/// Dense (no sparsity) tensor-core peak TFLOPS per training dtype.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeakTflops {
    /// `None`: the GPU has no bf16 tensor cores (V100 and older). Written as `null`.
    #[serde(default, deserialize_with = "optional_figure")]
    pub bf16: Option<f64>,
    #[serde(deserialize_with = "figure")]
    pub fp16: f64,
    /// Dense FP8 tensor-core peak (Hopper and later); `None`: not known or no FP8 tensor
    /// cores. Left out of the file when `None`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_figure"
    )]
    pub fp8: Option<f64>,
    /// Dense FP4 tensor-core peak (Blackwell and later), as `fp8`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_figure"
    )]
    pub fp4: Option<f64>,
}

impl PeakTflops {
    /// The 16-bit peaks alone (no FP8 or FP4 figure).
    pub const fn new(bf16: Option<f64>, fp16: f64) -> Self {
        PeakTflops {
            bf16,
            fp16,
            fp8: None,
            fp4: None,
        }
    }

    /// With FP8 and FP4 peaks.
    pub const fn with_low_precision(mut self, fp8: Option<f64>, fp4: Option<f64>) -> Self {
        self.fp8 = fp8;
        self.fp4 = fp4;
        self
    }

    /// The peak for `dtype`, or `None` when the GPU has no tensor cores for it (and for
    /// fp32, which the datasheet peaks do not cover).
    pub fn get(&self, dtype: Dtype) -> Option<f64> {
        match dtype {
            Dtype::Bf16 => self.bf16,
            Dtype::Fp16 => Some(self.fp16),
            Dtype::Fp32 => None,
        }
    }
}

/// The training dtypes the planner distinguishes: the 16-bit ones a datasheet gives a
/// tensor-core peak for, and fp32, which only a measurement gives a figure for (a GPU's fp32
/// rate is otherwise derived from its fp16 peak; see the time model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Bf16,
    Fp16,
    Fp32,
}

impl Dtype {
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp32 => "fp32",
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Attained matrix-multiply throughput of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredTflops {
    pub dtype: Dtype,
    #[serde(deserialize_with = "figure")]
    pub tflops: f64,
    pub provenance: Provenance,
}

/// Where a figure came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    pub source: Source,
    /// When it was measured or looked up, `YYYY-MM-DD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
    /// What measured or produced it, e.g. `nccl-tests sendrecv_perf 2.13`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Provenance {
    pub fn new(source: Source) -> Self {
        Provenance {
            source,
            date: None,
            tool: None,
            note: None,
        }
    }

    pub fn with_date(mut self, date: impl Into<String>) -> Self {
        self.date = Some(date.into());
        self
    }

    pub fn with_tool(mut self, tool: impl Into<String>) -> Self {
        self.tool = Some(tool.into());
        self
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }
}

/// The kind of origin a figure has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Measured on these very nodes.
    Measured,
    /// Taken from the vendor's datasheet.
    Datasheet,
    /// Read from another tool's file (Pipette, mpiGraph).
    Imported,
    /// A guess or a default, e.g. a typical attained figure for this hardware.
    Estimated,
}

impl Source {
    pub const ALL: [Source; 4] = [
        Source::Measured,
        Source::Datasheet,
        Source::Imported,
        Source::Estimated,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Measured => "measured",
            Source::Datasheet => "datasheet",
            Source::Imported => "imported",
            Source::Estimated => "estimated",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A square matrix of attained bandwidths in GB/s (10^9 bytes per second), row = sender,
/// column = receiver, with where the figures came from. The diagonal is unused and is 0.
/// Figures are kept to [`SIGNIFICANT_DIGITS`] significant digits.
///
/// Held in full (every cell), or — node links of a large cluster, where every pair would be
/// n² figures to measure, store and read — sampled: a figure per endpoint and the pairs that
/// were measured ([`LinkMatrix::sampled`]). Both answer [`LinkMatrix::get`] for every pair.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkMatrix {
    pub provenance: Provenance,
    /// `node_links` only: the NICs of every node, over which NCCL spreads the channels of a
    /// collective that crosses nodes (each cell is what one GPU pair, one NIC, attains).
    /// `None`: unknown, taken as one.
    pub nics_per_node: Option<u32>,
    /// `node_links` only: what the rails of one node pair attained all busy at once
    /// ([`LinkMatrix::all_rails`]). Boxed: a node's GPU matrix never has it, and the GPU
    /// inventory holds a matrix by value.
    all_rails: Option<Box<AllRails>>,
    size: usize,
    cells: Cells,
}

/// What the rails of one node pair attained together: local rank `i` of one node streaming
/// to local rank `i` of the other for every `i < rails`, all at once (the profile's probe
/// measures the first node pair). Written as `node_links.all_rails`:
/// `{"rails": 8, "gb_per_s": 352.0, "one_rail_gb_per_s": 48.5}`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllRails {
    /// Rank pairs streaming at once: one per NIC (the node's NICs when known, else its
    /// GPUs).
    pub rails: u32,
    /// The sum of their figures, GB/s, in the slower direction.
    pub gb_per_s: f64,
    /// What one pair attained alone between the same two nodes (their `node_links`
    /// figure), GB/s, the slower direction.
    pub one_rail_gb_per_s: f64,
}

impl AllRails {
    /// The share of `rails` × one rail that the rails attained together, at most 1 (a
    /// shared PCIe switch, a port down or a fabric not rail-optimised make it less; more
    /// than k × one is taken as k × one, a single pair measured low rather than a gain).
    pub fn efficiency(&self) -> f64 {
        let ideal = f64::from(self.rails.max(1)) * self.one_rail_gb_per_s;
        if ideal > 0.0 && self.gb_per_s.is_finite() {
            (self.gb_per_s / ideal).clamp(0.0, 1.0)
        } else {
            1.0
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Cells {
    /// `size * size` figures, row-major.
    Full(Vec<f64>),
    Sampled {
        /// Per endpoint: what its links attain where no pair of it was measured.
        per_endpoint: Vec<f64>,
        /// The measured links `(from, to, GB/s)`, sorted by `(from, to)`, each pair once,
        /// none on the diagonal.
        pairs: Vec<(u32, u32, f64)>,
        /// `pairs[starts[i]..starts[i + 1]]` are the links from endpoint `i`: a lookup
        /// searches a row of a few pairs, not all of them (the planner looks up links
        /// millions of times).
        starts: Vec<u32>,
    },
}

impl LinkMatrix {
    /// The same bandwidth between every pair of distinct endpoints.
    pub fn uniform(size: usize, gb_per_s: f64, provenance: Provenance) -> Self {
        Self::from_cells(size, vec![gb_per_s; size * size], provenance)
    }

    /// A matrix from its rows; `None` unless there are as many columns in every row as
    /// there are rows. The diagonal is set to 0.
    pub fn from_rows(rows: &[Vec<f64>], provenance: Provenance) -> Option<Self> {
        let size = rows.len();
        if rows.iter().any(|row| row.len() != size) {
            return None;
        }
        Some(Self::from_cells(size, rows.concat(), provenance))
    }

    /// `cells` holds `size * size` figures, row-major.
    pub(crate) fn from_cells(size: usize, mut cells: Vec<f64>, provenance: Provenance) -> Self {
        debug_assert_eq!(cells.len(), size * size);
        for cell in &mut cells {
            *cell = round_figure(*cell);
        }
        for i in 0..size {
            cells[i * size + i] = 0.0;
        }
        LinkMatrix {
            provenance,
            nics_per_node: None,
            all_rails: None,
            size,
            cells: Cells::Full(cells),
        }
    }

    /// A matrix measured on a sample of pairs: the link from `a` to `b` attains the figure
    /// measured for it in `pairs` (`(from, to, GB/s)`), else the lesser of `per_endpoint[a]`
    /// and `per_endpoint[b]` — the slower end's NIC bounds a pair. It holds `size` figures
    /// plus the pairs, not `size²`. Pairs on the diagonal are dropped; a pair given twice
    /// keeps its last figure. `None` when a pair names an endpoint past `per_endpoint`.
    pub fn sampled(
        per_endpoint: Vec<f64>,
        pairs: Vec<(usize, usize, f64)>,
        provenance: Provenance,
    ) -> Option<Self> {
        let size = per_endpoint.len();
        if pairs.iter().any(|&(a, b, _)| a >= size || b >= size) {
            return None;
        }
        let mut pairs: Vec<(u32, u32, f64)> = pairs
            .into_iter()
            .filter(|(a, b, _)| a != b)
            .map(|(a, b, v)| (a as u32, b as u32, round_figure(v)))
            .collect();
        // Stable, so that of a repeated pair the last figure comes last and is kept.
        pairs.sort_by_key(|&(a, b, _)| (a, b));
        let mut kept: Vec<(u32, u32, f64)> = Vec::with_capacity(pairs.len());
        for pair in pairs {
            match kept.last_mut() {
                Some(last) if (last.0, last.1) == (pair.0, pair.1) => *last = pair,
                _ => kept.push(pair),
            }
        }
        let mut starts = vec![0u32; size + 1];
        for &(from, _, _) in &kept {
            starts[from as usize + 1] += 1;
        }
        for i in 0..size {
            starts[i + 1] += starts[i];
        }
        Some(LinkMatrix {
            provenance,
            nics_per_node: None,
            all_rails: None,
            size,
            cells: Cells::Sampled {
                per_endpoint: per_endpoint.into_iter().map(round_figure).collect(),
                pairs: kept,
                starts,
            },
        })
    }

    /// The same matrix with `nics_per_node` set (a node-link matrix rebuilt from another
    /// keeps its NICs).
    pub fn with_nics_per_node(mut self, nics_per_node: Option<u32>) -> Self {
        self.nics_per_node = nics_per_node;
        self
    }

    /// The same matrix with `all_rails` set.
    pub fn with_all_rails(mut self, all_rails: Option<AllRails>) -> Self {
        self.set_all_rails(all_rails);
        self
    }

    /// Sets what the rails of one node pair attained busy at once.
    pub fn set_all_rails(&mut self, all_rails: Option<AllRails>) {
        self.all_rails = all_rails.map(Box::new);
    }

    /// `node_links` only: what the rails of one node pair attained all busy at once (see
    /// [`AllRails`]). `None`: not measured, every rail taken to attain a cell's figure.
    pub fn all_rails(&self) -> Option<AllRails> {
        self.all_rails.as_deref().copied()
    }

    /// The number of rows (and columns).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether the matrix was measured on a sample of pairs ([`LinkMatrix::sampled`]).
    pub fn is_sampled(&self) -> bool {
        matches!(self.cells, Cells::Sampled { .. })
    }

    /// How many figures the matrix holds: `size²` in full, `size` plus the measured
    /// pairs when sampled.
    pub fn stored_figures(&self) -> usize {
        match &self.cells {
            Cells::Full(cells) => cells.len(),
            Cells::Sampled {
                per_endpoint,
                pairs,
                ..
            } => per_endpoint.len() + pairs.len(),
        }
    }

    /// A sampled matrix's figure per endpoint (see [`LinkMatrix::sampled`]); `None` in full.
    pub fn per_endpoint(&self) -> Option<&[f64]> {
        match &self.cells {
            Cells::Full(_) => None,
            Cells::Sampled { per_endpoint, .. } => Some(per_endpoint),
        }
    }

    /// Attained bandwidth from `from` to `to`, GB/s (0 when `from == to`).
    ///
    /// # Panics
    /// When either index is not below [`LinkMatrix::size`].
    pub fn get(&self, from: usize, to: usize) -> f64 {
        assert!(
            from < self.size && to < self.size,
            "link ({from}, {to}) outside a {n}x{n} matrix",
            n = self.size
        );
        match &self.cells {
            Cells::Full(cells) => cells[from * self.size + to],
            Cells::Sampled { .. } if from == to => 0.0,
            Cells::Sampled {
                per_endpoint,
                pairs,
                starts,
            } => match pair_position(pairs, starts, from, to) {
                Ok(k) => pairs[k].2,
                Err(_) => per_endpoint[from].min(per_endpoint[to]),
            },
        }
    }

    /// Sets the bandwidth from `from` to `to` (ignored on the diagonal); in a sampled
    /// matrix the pair counts as measured from then on.
    ///
    /// # Panics
    /// When either index is not below [`LinkMatrix::size`].
    pub fn set(&mut self, from: usize, to: usize, gb_per_s: f64) {
        assert!(
            from < self.size && to < self.size,
            "link ({from}, {to}) outside a {n}x{n} matrix",
            n = self.size
        );
        if from == to {
            return;
        }
        let figure = round_figure(gb_per_s);
        match &mut self.cells {
            Cells::Full(cells) => cells[from * self.size + to] = figure,
            Cells::Sampled { pairs, starts, .. } => match pair_position(pairs, starts, from, to) {
                Ok(k) => pairs[k].2 = figure,
                Err(k) => {
                    pairs.insert(k, (from as u32, to as u32, figure));
                    for start in &mut starts[from + 1..] {
                        *start += 1;
                    }
                }
            },
        }
    }

    /// One row: bandwidth from `from` to every endpoint.
    pub fn row(&self, from: usize) -> Vec<f64> {
        match &self.cells {
            Cells::Full(cells) => cells[from * self.size..(from + 1) * self.size].to_vec(),
            Cells::Sampled { .. } => (0..self.size).map(|to| self.get(from, to)).collect(),
        }
    }

    /// Every off-diagonal link given as a figure, as `(from, to, gb_per_s)`, row by row:
    /// all of them in full, the measured pairs when sampled.
    pub fn links(&self) -> Box<dyn Iterator<Item = (usize, usize, f64)> + '_> {
        let n = self.size;
        match &self.cells {
            Cells::Full(cells) => Box::new(
                (0..n * n)
                    .filter(move |k| k / n != k % n)
                    .map(move |k| (k / n, k % n, cells[k])),
            ),
            Cells::Sampled { pairs, .. } => {
                Box::new(pairs.iter().map(|&(a, b, v)| (a as usize, b as usize, v)))
            }
        }
    }

    /// The slowest off-diagonal link, GB/s; `None` for a 1x1 (or empty) matrix.
    pub fn min_link(&self) -> Option<f64> {
        self.extreme(f64::min)
    }

    /// The fastest off-diagonal link, GB/s; `None` for a 1x1 (or empty) matrix.
    pub fn max_link(&self) -> Option<f64> {
        self.extreme(f64::max)
    }

    /// The extreme of the measured links and, when sampled, of what the unmeasured ones
    /// are taken to attain (the lesser endpoint figure of some pair).
    fn extreme(&self, pick: fn(f64, f64) -> f64) -> Option<f64> {
        if self.size < 2 {
            return None;
        }
        let measured = self.links().map(|(_, _, v)| v).reduce(pick);
        match &self.cells {
            Cells::Full(_) => measured,
            Cells::Sampled { per_endpoint, .. } => {
                // The least pair minimum is the least endpoint figure; the greatest is the
                // second greatest (the best pair's slower end).
                let mut sorted = per_endpoint.clone();
                sorted.sort_by(f64::total_cmp);
                let unmeasured = if pick(0.0, 1.0) == 0.0 {
                    sorted[0]
                } else {
                    sorted[sorted.len() - 2]
                };
                Some(measured.map_or(unmeasured, |m| pick(m, unmeasured)))
            }
        }
    }

    /// The links among `order`'s endpoints, in that order: row and column `k` of the result
    /// are `order[k]`'s. A sampled matrix stays sampled, with the pairs between chosen
    /// endpoints.
    pub fn select(&self, order: &[usize]) -> LinkMatrix {
        let matrix = match &self.cells {
            Cells::Full(_) => {
                // This matrix's figures are kept already ([`round_figure`]); rounding them
                // again (a float printed and parsed per cell) made selecting the nodes of
                // a 2,048-node profile cost a second, once per node count the subset
                // search tries.
                let mut cells: Vec<f64> = order
                    .iter()
                    .flat_map(|a| order.iter().map(move |b| self.get(*a, *b)))
                    .collect();
                let size = order.len();
                for i in 0..size {
                    cells[i * size + i] = 0.0;
                }
                LinkMatrix {
                    provenance: self.provenance.clone(),
                    nics_per_node: None,
                    all_rails: None,
                    size,
                    cells: Cells::Full(cells),
                }
            }
            Cells::Sampled {
                per_endpoint,
                pairs,
                ..
            } => {
                let mut position = vec![None; self.size];
                for (k, &i) in order.iter().enumerate() {
                    position[i] = Some(k);
                }
                let pairs = pairs
                    .iter()
                    .filter_map(|&(a, b, v)| {
                        Some((position[a as usize]?, position[b as usize]?, v))
                    })
                    .collect();
                let per_endpoint = order.iter().map(|&i| per_endpoint[i]).collect();
                LinkMatrix::sampled(per_endpoint, pairs, self.provenance.clone())
                    .expect("positions lie in the selection")
            }
        };
        matrix
            .with_nics_per_node(self.nics_per_node)
            .with_all_rails(self.all_rails())
    }
}

/// Where `(from, to)` is in sorted `pairs` (rows beginning at `starts`), or where it would go.
fn pair_position(
    pairs: &[(u32, u32, f64)],
    starts: &[u32],
    from: usize,
    to: usize,
) -> Result<usize, usize> {
    let (begin, end) = (starts[from] as usize, starts[from + 1] as usize);
    pairs[begin..end]
        .binary_search_by_key(&(to as u32), |&(_, b, _)| b)
        .map(|k| begin + k)
        .map_err(|k| begin + k)
}

impl NodeProfile {
    /// The node's GPUs, when known.
    pub fn gpus(&self) -> Option<&[GpuSpec]> {
        match &self.gpus {
            GpuInventory::Known { gpus, .. } => Some(gpus),
            GpuInventory::Unknown => None,
        }
    }

    /// The GPU-pair bandwidths inside the node, when known.
    pub fn gpu_links(&self) -> Option<&LinkMatrix> {
        match &self.gpus {
            GpuInventory::Known { links, .. } => Some(links),
            GpuInventory::Unknown => None,
        }
    }
}

impl ClusterProfile {
    /// Checks what reading a file checks, for a profile built in code. `origin` names the
    /// profile in the message.
    pub fn validate(&self, origin: &str) -> Result<(), ProfileError> {
        super::validate::check(ProfileFile::from(self), origin).map(drop)
    }

    /// Gives every node whose GPUs are unknown `per_node` copies of `gpu` (indices
    /// `0..per_node`) and a uniform `intra_node_gb_per_s` between every GPU pair, marked
    /// `estimated`. Nodes whose GPUs are known are left as they are.
    pub fn with_default_gpus(
        mut self,
        gpu: GpuSpec,
        per_node: usize,
        intra_node_gb_per_s: f64,
    ) -> Result<Self, ProfileError> {
        const ORIGIN: &str = "default GPUs";
        if per_node == 0 || per_node > MAX_GPUS_PER_NODE {
            return Err(invalid(
                ORIGIN,
                "per_node",
                format!("is {per_node} (give between 1 and {MAX_GPUS_PER_NODE} GPUs per node)"),
            ));
        }
        if !(intra_node_gb_per_s.is_finite()
            && intra_node_gb_per_s > 0.0
            && intra_node_gb_per_s <= MAX_PLAUSIBLE_GB_PER_S)
        {
            return Err(invalid(
                ORIGIN,
                "intra_node_gb_per_s",
                format!(
                    "is {} (give the bandwidth one GPU attains to another in the node, GB/s, e.g. 240 for A100 NVLink)",
                    show_number(intra_node_gb_per_s)
                ),
            ));
        }
        check_gpu(ORIGIN, "gpu", &gpu)?;
        let mut gpu = gpu;
        gpu.peak_tflops.fp16 = round_figure(gpu.peak_tflops.fp16);
        gpu.peak_tflops.bf16 = gpu.peak_tflops.bf16.map(round_figure);
        gpu.peak_tflops.fp8 = gpu.peak_tflops.fp8.map(round_figure);
        gpu.peak_tflops.fp4 = gpu.peak_tflops.fp4.map(round_figure);
        for m in &mut gpu.measured_tflops {
            m.tflops = round_figure(m.tflops);
        }
        let provenance = Provenance::new(Source::Estimated).with_note(format!(
            "default: {intra_node_gb_per_s} GB/s between every GPU pair, no measurement"
        ));
        for node in &mut self.nodes {
            if node.gpus == GpuInventory::Unknown {
                let gpus = (0..per_node)
                    .map(|i| GpuSpec {
                        index: i as u32,
                        ..gpu.clone()
                    })
                    .collect();
                let links = LinkMatrix::uniform(per_node, intra_node_gb_per_s, provenance.clone());
                node.gpus = GpuInventory::Known { gpus, links };
            }
        }
        Ok(self)
    }

    /// True when every node's GPUs are known.
    pub fn gpus_known(&self) -> bool {
        self.nodes
            .iter()
            .all(|n| matches!(n.gpus, GpuInventory::Known { .. }))
    }

    /// The number of GPUs in the cluster, when every node's GPUs are known.
    pub fn gpu_count(&self) -> Option<usize> {
        self.nodes
            .iter()
            .map(|n| n.gpus().map(<[GpuSpec]>::len))
            .sum()
    }

    /// The host names, in node order.
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|n| n.host.as_str())
    }

    /// The part of the profile an allocation may use: these hosts, in this order, each
    /// with only the listed device indices (`None`: all its GPUs), or its first `n` GPUs
    /// when a count is given. Links keep their measured figures. `None` names the first
    /// host that is missing, or a device index the node does not have.
    pub fn subset(&self, wanted: &[NodeSelection<'_>]) -> Result<ClusterProfile, String> {
        let mut nodes = Vec::with_capacity(wanted.len());
        let mut index = Vec::with_capacity(wanted.len());
        // One lookup table, not a scan per host: allocations may hold thousands of nodes.
        let position = self.node_indices();
        for want in wanted {
            let Some(&i) = position.get(&crate::cluster::host_key(want.host)) else {
                return Err(format!("has no node {:?}", want.host));
            };
            let node = &self.nodes[i];
            let gpus = match (&node.gpus, &want.devices) {
                (GpuInventory::Unknown, _) | (_, DeviceSelection::All) => node.gpus.clone(),
                (GpuInventory::Known { gpus, links }, selection) => {
                    let positions: Vec<usize> = match selection {
                        DeviceSelection::All => (0..gpus.len()).collect(),
                        DeviceSelection::First(n) => (0..(*n).min(gpus.len())).collect(),
                        DeviceSelection::Indices(wanted) => {
                            let mut positions = Vec::with_capacity(wanted.len());
                            for d in wanted {
                                match gpus.iter().position(|g| g.index == *d) {
                                    Some(p) => positions.push(p),
                                    None => {
                                        return Err(format!("node {:?} has no GPU {d}", want.host))
                                    }
                                }
                            }
                            positions
                        }
                    };
                    GpuInventory::Known {
                        gpus: positions.iter().map(|p| gpus[*p].clone()).collect(),
                        links: links.select(&positions),
                    }
                }
            };
            // Named as the allocation names it (`nodeA` may be the file's `NODEA.`), so
            // the stages after this one compare names as they are.
            nodes.push(NodeProfile {
                host: want.host.to_string(),
                gpus,
                nvlink_domain: node.nvlink_domain.clone(),
            });
            index.push(i);
        }
        Ok(ClusterProfile {
            note: self.note.clone(),
            nodes,
            node_links: self.node_links.select(&index),
            measured_perf: self.measured_perf.clone(),
        })
    }

    /// The nodes at `positions`, in that order, with every GPU and the links between them.
    ///
    /// # Panics
    /// When a position is not below the node count.
    pub fn at_positions(&self, positions: &[usize]) -> ClusterProfile {
        ClusterProfile {
            note: self.note.clone(),
            nodes: positions.iter().map(|&n| self.nodes[n].clone()).collect(),
            node_links: self.node_links.select(positions),
            measured_perf: self.measured_perf.clone(),
        }
    }

    /// The position of `host` in `nodes` (and in `node_links`).
    pub fn node_index(&self, host: &str) -> Option<usize> {
        let key = crate::cluster::host_key(host);
        self.nodes
            .iter()
            .position(|n| crate::cluster::host_key(&n.host) == key)
    }

    /// Every node's position by its host name, for looking up many hosts: a lookup per
    /// host by [`Self::node_index`] made 100,000 nodes take minutes.
    /// Keyed by [`crate::cluster::host_key`].
    pub fn node_indices(&self) -> std::collections::HashMap<String, usize> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (crate::cluster::host_key(&n.host), i))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// The file's shape where it differs from the program's.

/// A `pipette-cluster/1` file as written. `schema` is checked before anything else (see
/// [`super::read`]), so that a file of another version is refused as such.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProfileFile {
    pub schema: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub nodes: Vec<NodeFile>,
    pub node_links: LinksFile,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured_perf: Vec<MeasuredPerf>,
}

/// A node as written: its GPUs and their links side by side.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NodeFile {
    pub host: String,
    pub gpus: GpusFile,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_links: Option<LinksFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain: Option<String>,
}

/// `"gpus"`: a list, or the string `"unknown"`.
#[derive(Debug, Clone)]
pub(crate) enum GpusFile {
    Unknown,
    List(Vec<GpuSpec>),
}

/// A link matrix as written: in full, `gb_per_s` (cells are numbers, and the unused
/// diagonal may be null); or sampled (`node_links` only, see [`LinkMatrix::sampled`]),
/// `node_gb_per_s` (one figure per node) and `pairs` (`[from, to, GB/s]` measured).
/// Validation says when neither or both are given.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LinksFile {
    pub provenance: Provenance,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nics_per_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_rails: Option<AllRails>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gb_per_s: Option<Vec<Vec<Option<f64>>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_gb_per_s: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairs: Option<Vec<(usize, usize, f64)>>,
}

impl Serialize for GpusFile {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            GpusFile::Unknown => serializer.serialize_str("unknown"),
            GpusFile::List(gpus) => gpus.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for GpusFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Gpus;
        impl<'de> serde::de::Visitor<'de> for Gpus {
            type Value = GpusFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of GPUs, or \"unknown\"")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<GpusFile, E> {
                if text == "unknown" {
                    Ok(GpusFile::Unknown)
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Str(text), &self))
                }
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<GpusFile, A::Error> {
                let mut gpus = Vec::new();
                while let Some(gpu) = seq.next_element()? {
                    gpus.push(gpu);
                }
                Ok(GpusFile::List(gpus))
            }
        }
        deserializer.deserialize_any(Gpus)
    }
}

impl From<&LinkMatrix> for LinksFile {
    fn from(matrix: &LinkMatrix) -> Self {
        let (gb_per_s, node_gb_per_s, pairs) = match &matrix.cells {
            Cells::Full(cells) => (
                Some(
                    cells
                        .chunks(matrix.size.max(1))
                        .take(matrix.size)
                        .map(|row| row.iter().map(|&x| Some(x)).collect())
                        .collect(),
                ),
                None,
                None,
            ),
            Cells::Sampled {
                per_endpoint,
                pairs,
                ..
            } => (
                None,
                Some(per_endpoint.clone()),
                Some(
                    pairs
                        .iter()
                        .map(|&(a, b, v)| (a as usize, b as usize, v))
                        .collect(),
                ),
            ),
        };
        LinksFile {
            provenance: matrix.provenance.clone(),
            nics_per_node: matrix.nics_per_node,
            all_rails: matrix.all_rails(),
            gb_per_s,
            node_gb_per_s,
            pairs,
        }
    }
}

impl From<&ClusterProfile> for ProfileFile {
    fn from(profile: &ClusterProfile) -> Self {
        ProfileFile {
            schema: super::SCHEMA_VERSION.into(),
            note: profile.note.clone(),
            nodes: profile
                .nodes
                .iter()
                .map(|node| match &node.gpus {
                    GpuInventory::Unknown => NodeFile {
                        host: node.host.clone(),
                        gpus: GpusFile::Unknown,
                        gpu_links: None,
                        nvlink_domain: node.nvlink_domain.clone(),
                    },
                    GpuInventory::Known { gpus, links } => NodeFile {
                        host: node.host.clone(),
                        gpus: GpusFile::List(gpus.clone()),
                        gpu_links: Some(links.into()),
                        nvlink_domain: node.nvlink_domain.clone(),
                    },
                })
                .collect(),
            node_links: (&profile.node_links).into(),
            measured_perf: profile.measured_perf.clone(),
        }
    }
}

/// `x` kept to [`SIGNIFICANT_DIGITS`] significant digits (see there why).
pub fn round_figure(x: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    format!("{x:.prec$e}", prec = SIGNIFICANT_DIGITS - 1)
        .parse()
        .unwrap_or(x)
}

/// Reads a figure as [`round_figure`] keeps it.
fn figure<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    f64::deserialize(deserializer).map(round_figure)
}

/// `measured_tflops` as written: one object for one figure, else a list.
fn one_or_list<S: Serializer>(
    figures: &[MeasuredTflops],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match figures {
        [one] => one.serialize(serializer),
        many => many.serialize(serializer),
    }
}

/// `measured_tflops` as read: one object (older profiles) or a list.
fn one_or_list_of<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<MeasuredTflops>, D::Error> {
    struct OneOrList;
    impl<'de> serde::de::Visitor<'de> for OneOrList {
        type Value = Vec<MeasuredTflops>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a measured figure or a list of them")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            MeasuredTflops::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                .map(|one| vec![one])
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            Vec::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
        }
    }
    deserializer.deserialize_any(OneOrList)
}

fn optional_figure<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<f64>, D::Error> {
    Option::<f64>::deserialize(deserializer).map(|x| x.map(round_figure))
}
