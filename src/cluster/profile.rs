//! The cluster profile file: nodes, their GPUs, the attained bandwidth of every link that
//! matters, and where each figure came from.
//!
//! Owns the `pipette-cluster/1` schema (see `docs/cluster-profile.md`): reading it, with
//! validation whose messages name the file, the JSON path of the bad field and what to do;
//! writing it in a stable, diff-friendly layout; and filling in default GPUs for profiles
//! imported from tools that measured the network only. [`ClusterProfile::load`] recognises
//! the foreign formats too and hands them to [`super::import`].
//!
//! Must not know how figures are measured (that is the profiler's job) nor what a plan does
//! with them. Never panics on input: every problem is a [`ProfileError`].

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::import;

/// The version tag every profile file starts with.
pub const SCHEMA_VERSION: &str = "pipette-cluster/1";

/// No link attains more than this (GB/s); a larger figure is a unit mistake (MB/s read as GB/s).
/// NVLink 5 moves 900 GB/s per direction per GPU, so this leaves room for a decade of growth.
pub const MAX_PLAUSIBLE_GB_PER_S: f64 = 10_000.0;

/// Every working link attains more than this (GB/s, i.e. 1 MB/s); a smaller figure is a
/// unit mistake or a broken link.
pub const MIN_PLAUSIBLE_GB_PER_S: f64 = 0.001;

/// Accepted peak and measured TFLOPS lie between these.
pub const TFLOPS_RANGE: (f64, f64) = (0.001, 100_000.0);

/// Figures are kept to this many significant digits (far below measurement noise), so that
/// they are written in at most that many digits and read back as the very same `f64` by
/// serde_json, which without its `float_roundtrip` feature may misread 17-digit numbers.
pub const SIGNIFICANT_DIGITS: usize = 12;

/// The most GPUs [`ClusterProfile::with_default_gpus`] puts on one node.
pub const MAX_GPUS_PER_NODE: usize = 256;

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
#[derive(Debug, Clone, PartialEq)]
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
    /// What a matrix-multiply benchmark attained on this GPU, when measured.
    pub measured_tflops: Option<MeasuredTflops>,
    /// Where `name`, `memory_bytes` and `peak_tflops` came from.
    pub provenance: Provenance,
}

/// Dense (no sparsity) tensor-core peak TFLOPS per training dtype.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeakTflops {
    /// `None`: the GPU has no bf16 tensor cores (V100 and older).
    pub bf16: Option<f64>,
    pub fp16: f64,
}

impl PeakTflops {
    /// The peak for `dtype`, or `None` when the GPU has no tensor cores for it.
    pub fn get(&self, dtype: Dtype) -> Option<f64> {
        match dtype {
            Dtype::Bf16 => self.bf16,
            Dtype::Fp16 => Some(self.fp16),
        }
    }
}

/// The 16-bit training dtypes the planner distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Bf16,
    Fp16,
}

impl Dtype {
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Attained matrix-multiply throughput of one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredTflops {
    pub dtype: Dtype,
    pub tflops: f64,
    pub provenance: Provenance,
}

/// Where a figure came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    pub source: Source,
    /// When it was measured or looked up, `YYYY-MM-DD`.
    pub date: Option<String>,
    /// What measured or produced it, e.g. `nccl-tests sendrecv_perf 2.13`.
    pub tool: Option<String>,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

    fn parse(text: &str) -> Option<Source> {
        Source::ALL.into_iter().find(|s| s.as_str() == text)
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
#[derive(Debug, Clone, PartialEq)]
pub struct LinkMatrix {
    pub provenance: Provenance,
    size: usize,
    cells: Vec<f64>,
}

impl LinkMatrix {
    /// The same bandwidth between every pair of distinct endpoints.
    pub fn uniform(size: usize, gb_per_s: f64, provenance: Provenance) -> Self {
        let mut cells = vec![round_figure(gb_per_s); size * size];
        for i in 0..size {
            cells[i * size + i] = 0.0;
        }
        LinkMatrix {
            provenance,
            size,
            cells,
        }
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
    pub(super) fn from_cells(size: usize, mut cells: Vec<f64>, provenance: Provenance) -> Self {
        debug_assert_eq!(cells.len(), size * size);
        for cell in &mut cells {
            *cell = round_figure(*cell);
        }
        for i in 0..size {
            cells[i * size + i] = 0.0;
        }
        LinkMatrix {
            provenance,
            size,
            cells,
        }
    }

    /// The number of rows (and columns).
    pub fn size(&self) -> usize {
        self.size
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
        self.cells[from * self.size + to]
    }

    /// Sets the bandwidth from `from` to `to` (ignored on the diagonal).
    ///
    /// # Panics
    /// When either index is not below [`LinkMatrix::size`].
    pub fn set(&mut self, from: usize, to: usize, gb_per_s: f64) {
        assert!(
            from < self.size && to < self.size,
            "link ({from}, {to}) outside a {n}x{n} matrix",
            n = self.size
        );
        if from != to {
            self.cells[from * self.size + to] = round_figure(gb_per_s);
        }
    }

    /// One row: bandwidth from `from` to every endpoint.
    pub fn row(&self, from: usize) -> &[f64] {
        &self.cells[from * self.size..(from + 1) * self.size]
    }

    /// Every off-diagonal link as `(from, to, gb_per_s)`, row by row.
    pub fn links(&self) -> impl Iterator<Item = (usize, usize, f64)> + '_ {
        let n = self.size;
        (0..n * n)
            .filter(move |k| k / n != k % n)
            .map(move |k| (k / n, k % n, self.cells[k]))
    }

    /// The slowest off-diagonal link, GB/s; `None` for a 1x1 (or empty) matrix.
    pub fn min_link(&self) -> Option<f64> {
        self.links().map(|(_, _, v)| v).reduce(f64::min)
    }

    /// The fastest off-diagonal link, GB/s; `None` for a 1x1 (or empty) matrix.
    pub fn max_link(&self) -> Option<f64> {
        self.links().map(|(_, _, v)| v).reduce(f64::max)
    }
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
    /// Reads a profile from JSON text in any format [`ClusterProfile::load`] knows.
    /// `origin` names the text in error messages (usually the file name).
    pub fn from_json_str(text: &str, origin: &str) -> Result<Self, ProfileError> {
        let origin = clean_origin(origin);
        let value: Value = serde_json::from_str(text).map_err(|e| syntax_error(&origin, &e))?;
        Self::from_value(&value, &origin)
    }

    /// Reads a profile file, recognising its format by its content:
    ///
    /// - `{"schema": "pipette-cluster/1", ...}`: this crate's own format;
    /// - `{"gpus": [hosts], "bandwidth": [[GB/s]]}`: the original Pipette bandwidth file
    ///   (cells may be numbers or strings such as `"19.6"`);
    /// - `{"0": {"gpus": ..., "bandwidth": [[MB/s]]}, "1": ...}`: mpiGraph's tables as
    ///   Pipette kept them.
    ///
    /// Imported files know the network only: their nodes' GPUs are [`GpuInventory::Unknown`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ProfileError> {
        let path = path.as_ref();
        let origin = clean_origin(&path.display().to_string());
        let bytes = std::fs::read(path).map_err(|io| ProfileError::Read {
            origin: origin.clone(),
            io,
        })?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| syntax_error(&origin, &e))?;
        Self::from_value(&value, &origin)
    }

    /// Reads a profile from parsed JSON, in any format [`ClusterProfile::load`] knows.
    pub fn from_value(value: &Value, origin: &str) -> Result<Self, ProfileError> {
        let origin = clean_origin(origin);
        let Some(root) = value.as_object() else {
            return Err(ProfileError::UnknownFormat {
                origin,
                found: describe(value),
            });
        };
        match import::detect(root) {
            import::Format::Native => parse_profile(root, &origin),
            import::Format::Pipette => import::pipette_bandwidth(root, &origin),
            import::Format::MpiGraph => import::mpigraph(root, &origin),
            import::Format::Unrecognised => Err(ProfileError::UnknownFormat {
                origin,
                found: describe_keys(root),
            }),
        }
    }

    /// The profile as `pipette-cluster/1` JSON: two-space indents, one matrix row per line,
    /// small objects on one line; ends with a newline. Reading it back gives an equal profile.
    pub fn to_json_pretty(&self) -> String {
        let mut out = String::new();
        self.to_doc().write_pretty(&mut out, 0, 0);
        out.push('\n');
        out
    }

    /// Checks what reading a file checks, for a profile built in code. `origin` names the
    /// profile in the message.
    pub fn validate(&self, origin: &str) -> Result<(), ProfileError> {
        let origin = clean_origin(origin);
        let origin = origin.as_str();
        if self.nodes.is_empty() {
            return Err(invalid(
                origin,
                "nodes",
                "is empty (list at least one node)".into(),
            ));
        }
        let hosts: Vec<String> = self.nodes.iter().map(|n| n.host.clone()).collect();
        check_hosts(origin, &hosts, |i| format!("nodes[{i}].host"))?;

        for (n, node) in self.nodes.iter().enumerate() {
            let GpuInventory::Known { gpus, links } = &node.gpus else {
                continue;
            };
            let gpus_path = format!("nodes[{n}].gpus");
            if gpus.is_empty() {
                return Err(invalid(
                    origin,
                    &gpus_path,
                    "is empty (list the node's GPUs, or write \"unknown\" to have them profiled)"
                        .into(),
                ));
            }
            for (j, gpu) in gpus.iter().enumerate() {
                if let Some(first) = gpus[..j].iter().position(|g| g.index == gpu.index) {
                    return Err(invalid(
                        origin,
                        &format!("{gpus_path}[{j}].index"),
                        format!(
                            "repeats index {}, already at {gpus_path}[{first}] (list each GPU once)",
                            gpu.index
                        ),
                    ));
                }
                validate_gpu(origin, &format!("{gpus_path}[{j}]"), gpu)?;
            }
            let links_path = format!("nodes[{n}].gpu_links");
            if links.size() != gpus.len() {
                return Err(ProfileError::MatrixShape {
                    origin: origin.into(),
                    path: format!("{links_path}.gb_per_s"),
                    problem: format!(
                        "has {} but the node has {} (one row and one column per GPU, in the order of {gpus_path})",
                        count(links.size(), "row"),
                        count(gpus.len(), "GPU")
                    ),
                });
            }
            validate_provenance(
                origin,
                &format!("{links_path}.provenance"),
                &links.provenance,
            )?;
            let labels: Vec<String> = gpus
                .iter()
                .map(|g| format!("GPU {} of {}", g.index, quote(&node.host)))
                .collect();
            check_matrix(origin, &format!("{links_path}.gb_per_s"), links, &labels)?;
        }

        if self.node_links.size() != self.nodes.len() {
            return Err(ProfileError::MatrixShape {
                origin: origin.into(),
                path: "node_links.gb_per_s".into(),
                problem: format!(
                    "has {} but {} (one row and one column per node, in the order of nodes)",
                    count(self.node_links.size(), "row"),
                    there_are(self.nodes.len(), "node")
                ),
            });
        }
        validate_provenance(origin, "node_links.provenance", &self.node_links.provenance)?;
        let labels: Vec<String> = hosts.iter().map(|h| quote(h)).collect();
        check_matrix(origin, "node_links.gb_per_s", &self.node_links, &labels)
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
        validate_gpu(ORIGIN, "gpu", &gpu)?;
        let mut gpu = gpu;
        gpu.peak_tflops.fp16 = round_figure(gpu.peak_tflops.fp16);
        gpu.peak_tflops.bf16 = gpu.peak_tflops.bf16.map(round_figure);
        if let Some(m) = &mut gpu.measured_tflops {
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
        for want in wanted {
            let Some(i) = self.node_index(want.host) else {
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
                    let cells = positions
                        .iter()
                        .flat_map(|a| positions.iter().map(move |b| links.get(*a, *b)))
                        .collect();
                    GpuInventory::Known {
                        gpus: positions.iter().map(|p| gpus[*p].clone()).collect(),
                        links: LinkMatrix::from_cells(
                            positions.len(),
                            cells,
                            links.provenance.clone(),
                        ),
                    }
                }
            };
            nodes.push(NodeProfile {
                host: node.host.clone(),
                gpus,
            });
            index.push(i);
        }
        let cells = index
            .iter()
            .flat_map(|a| index.iter().map(move |b| self.node_links.get(*a, *b)))
            .collect();
        Ok(ClusterProfile {
            note: self.note.clone(),
            nodes,
            node_links: LinkMatrix::from_cells(
                index.len(),
                cells,
                self.node_links.provenance.clone(),
            ),
        })
    }

    /// The position of `host` in `nodes` (and in `node_links`).
    pub fn node_index(&self, host: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.host == host)
    }

    fn to_doc(&self) -> Doc {
        let mut fields = vec![("schema", Doc::Str(SCHEMA_VERSION.into()))];
        if let Some(note) = &self.note {
            fields.push(("note", Doc::Str(note.clone())));
        }
        fields.push((
            "nodes",
            Doc::List(self.nodes.iter().map(NodeProfile::to_doc).collect()),
        ));
        fields.push(("node_links", self.node_links.to_doc()));
        Doc::Obj(fields)
    }
}

impl Serialize for ClusterProfile {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_doc().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ClusterProfile {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        ClusterProfile::from_value(&value, "cluster profile").map_err(serde::de::Error::custom)
    }
}

/// Why a cluster profile could not be read. Every message is one line: the file, the JSON
/// path of the field, what is wrong, and in parentheses what to do.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("{origin}: cannot read the cluster profile: {io} (check the path, and that the file exists and is readable)")]
    Read { origin: String, io: std::io::Error },

    #[error("{origin}:{line}:{column}: not valid JSON: {message} ({hint})")]
    Syntax {
        origin: String,
        line: usize,
        column: usize,
        message: String,
        hint: &'static str,
    },

    #[error("{origin}: not a cluster profile: the top level is {found} (expected an object with \"schema\": \"{v}\", a Pipette bandwidth file {{\"gpus\": [hosts], \"bandwidth\": [[GB/s]]}} or Pipette's mpiGraph tables {{\"0\": ..., \"1\": ...}}; see docs/cluster-profile.md)", v = SCHEMA_VERSION)]
    UnknownFormat { origin: String, found: String },

    #[error("{origin}: schema is {found}, but this pipette-run reads \"{v}\" (write the file in that version, or use the pipette-run that wrote it)", v = SCHEMA_VERSION)]
    UnknownSchema { origin: String, found: String },

    #[error("{origin}: {path} is missing ({hint})")]
    MissingField {
        origin: String,
        path: String,
        hint: String,
    },

    #[error("{origin}: {path} is {found} (expected {expected})")]
    WrongType {
        origin: String,
        path: String,
        found: String,
        expected: String,
    },

    #[error(
        "{origin}: {path} is not a field of {owner} (its fields are {allowed}; check the spelling)"
    )]
    UnknownField {
        origin: String,
        path: String,
        owner: &'static str,
        allowed: String,
    },

    #[error("{origin}: {path} {problem}")]
    MatrixShape {
        origin: String,
        path: String,
        problem: String,
    },

    #[error("{origin}: {path} is {found}, not a finite number (write the bandwidth in {unit}, e.g. {example})")]
    NotANumber {
        origin: String,
        path: String,
        found: String,
        unit: &'static str,
        example: &'static str,
    },

    #[error("{origin}: {path} is {} {unit}, a negative bandwidth (correct the figure, or measure the link again)", show_number(*.value))]
    NegativeBandwidth {
        origin: String,
        path: String,
        value: f64,
        unit: &'static str,
    },

    #[error("{origin}: {path} is 0: no bandwidth from {from} to {to} (was the link measured? measure it again, or leave one of the two out)")]
    ZeroBandwidth {
        origin: String,
        path: String,
        from: String,
        to: String,
    },

    #[error("{origin}: {path} is {} {unit}, beyond what any link attains (figures from {min} to {max} {unit} are accepted; check the unit: Pipette bandwidth files hold GB/s, mpiGraph tables MB/s)", show_number(*.value))]
    ImplausibleBandwidth {
        origin: String,
        path: String,
        value: f64,
        unit: &'static str,
        min: f64,
        max: f64,
    },

    #[error("{origin}: {path} repeats host {host}, already at {first} (list each node once)")]
    DuplicateHost {
        origin: String,
        path: String,
        host: String,
        first: String,
    },

    #[error(
        "{origin}: {path} is 0 bytes (give the GPU's memory in bytes, e.g. 85899345920 for 80 GiB)"
    )]
    ZeroMemory { origin: String, path: String },

    #[error("{origin}: {path} {problem}")]
    InvalidValue {
        origin: String,
        path: String,
        problem: String,
    },
}

impl ProfileError {
    /// The file (or other origin) the error is about.
    pub fn origin(&self) -> &str {
        match self {
            ProfileError::Read { origin, .. }
            | ProfileError::Syntax { origin, .. }
            | ProfileError::UnknownFormat { origin, .. }
            | ProfileError::UnknownSchema { origin, .. }
            | ProfileError::MissingField { origin, .. }
            | ProfileError::WrongType { origin, .. }
            | ProfileError::UnknownField { origin, .. }
            | ProfileError::MatrixShape { origin, .. }
            | ProfileError::NotANumber { origin, .. }
            | ProfileError::NegativeBandwidth { origin, .. }
            | ProfileError::ZeroBandwidth { origin, .. }
            | ProfileError::ImplausibleBandwidth { origin, .. }
            | ProfileError::DuplicateHost { origin, .. }
            | ProfileError::ZeroMemory { origin, .. }
            | ProfileError::InvalidValue { origin, .. } => origin,
        }
    }

    /// The JSON path of the field at fault, when the error is about one field.
    pub fn path(&self) -> Option<&str> {
        match self {
            ProfileError::Read { .. }
            | ProfileError::Syntax { .. }
            | ProfileError::UnknownFormat { .. } => None,
            ProfileError::UnknownSchema { .. } => Some("schema"),
            ProfileError::MissingField { path, .. }
            | ProfileError::WrongType { path, .. }
            | ProfileError::UnknownField { path, .. }
            | ProfileError::MatrixShape { path, .. }
            | ProfileError::NotANumber { path, .. }
            | ProfileError::NegativeBandwidth { path, .. }
            | ProfileError::ZeroBandwidth { path, .. }
            | ProfileError::ImplausibleBandwidth { path, .. }
            | ProfileError::DuplicateHost { path, .. }
            | ProfileError::ZeroMemory { path, .. }
            | ProfileError::InvalidValue { path, .. } => Some(path),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Reading the pipette-cluster/1 schema.

fn parse_profile(root: &Map<String, Value>, origin: &str) -> Result<ClusterProfile, ProfileError> {
    match root.get("schema") {
        None => {
            return Err(missing(
                origin,
                "schema",
                format!("add \"schema\": \"{SCHEMA_VERSION}\" as the first field"),
            ))
        }
        Some(Value::String(s)) if s == SCHEMA_VERSION => {}
        Some(Value::String(s)) => {
            return Err(ProfileError::UnknownSchema {
                origin: origin.into(),
                found: quote(s),
            })
        }
        Some(other) => {
            return Err(wrong_type(
                origin,
                "schema",
                other,
                &format!("the string \"{SCHEMA_VERSION}\""),
            ))
        }
    }
    only_fields(
        origin,
        "",
        root,
        "a cluster profile",
        &["schema", "note", "nodes", "node_links"],
    )?;
    let note = optional_string(origin, "note", root.get("note"))?;
    let nodes_value = required(
        origin,
        "",
        root,
        "nodes",
        "list the nodes, e.g. \"nodes\": [{\"host\": \"node1\", \"gpus\": \"unknown\"}]",
    )?;
    let nodes = as_array(origin, "nodes", nodes_value, "a list of nodes")?
        .iter()
        .enumerate()
        .map(|(i, v)| parse_node(origin, &index_path("nodes", i), v))
        .collect::<Result<Vec<_>, _>>()?;
    if nodes.is_empty() {
        return Err(invalid(
            origin,
            "nodes",
            "is empty (list at least one node)".into(),
        ));
    }
    let links_value = required(
        origin,
        "",
        root,
        "node_links",
        "give the node-pair bandwidths: {\"provenance\": {...}, \"gb_per_s\": [[...]]}",
    )?;
    let shape = MatrixShape {
        size: nodes.len(),
        count: there_are(nodes.len(), "node"),
        per: "node",
        order: "nodes".into(),
    };
    let node_links = parse_link_matrix(origin, "node_links", links_value, &shape)?;
    let profile = ClusterProfile {
        note,
        nodes,
        node_links,
    };
    profile.validate(origin)?;
    Ok(profile)
}

fn parse_node(origin: &str, path: &str, value: &Value) -> Result<NodeProfile, ProfileError> {
    let obj = as_object(
        origin,
        path,
        value,
        "a node: {\"host\": ..., \"gpus\": ...}",
    )?;
    only_fields(origin, path, obj, "a node", &["host", "gpus", "gpu_links"])?;
    let host = required(origin, path, obj, "host", "give the node's host name")?;
    let host = as_string(origin, &field_path(path, "host"), host, "a host name")?.to_string();
    let gpus_path = field_path(path, "gpus");
    let gpus = required(
        origin,
        path,
        obj,
        "gpus",
        "list the node's GPUs, or write \"gpus\": \"unknown\" to have them profiled",
    )?;
    let links_path = field_path(path, "gpu_links");
    let gpus = match gpus {
        Value::String(s) if s == "unknown" => {
            if obj.contains_key("gpu_links") {
                return Err(invalid(
                    origin,
                    &links_path,
                    format!(
                        "is given but {gpus_path} is \"unknown\" (list the GPUs, or remove gpu_links)"
                    ),
                ));
            }
            GpuInventory::Unknown
        }
        Value::Array(items) => {
            let gpus = items
                .iter()
                .enumerate()
                .map(|(j, v)| parse_gpu(origin, &index_path(&gpus_path, j), v))
                .collect::<Result<Vec<_>, _>>()?;
            if gpus.is_empty() {
                return Err(invalid(
                    origin,
                    &gpus_path,
                    "is empty (list the node's GPUs, or write \"unknown\" to have them profiled)"
                        .into(),
                ));
            }
            let links = required(
                origin,
                path,
                obj,
                "gpu_links",
                "give the GPU-pair bandwidths in GB/s: {\"provenance\": {...}, \"gb_per_s\": [[...]]}, one row per GPU",
            )?;
            let shape = MatrixShape {
                size: gpus.len(),
                count: format!("the node has {}", count(gpus.len(), "GPU")),
                per: "GPU",
                order: gpus_path.clone(),
            };
            let links = parse_link_matrix(origin, &links_path, links, &shape)?;
            GpuInventory::Known { gpus, links }
        }
        other => {
            return Err(wrong_type(
                origin,
                &gpus_path,
                other,
                "a list of GPUs, or \"unknown\"",
            ))
        }
    };
    Ok(NodeProfile { host, gpus })
}

fn parse_gpu(origin: &str, path: &str, value: &Value) -> Result<GpuSpec, ProfileError> {
    let obj = as_object(
        origin,
        path,
        value,
        "a GPU: {\"index\": 0, \"name\": ..., ...}",
    )?;
    only_fields(
        origin,
        path,
        obj,
        "a GPU",
        &[
            "index",
            "name",
            "memory_bytes",
            "peak_tflops",
            "measured_tflops",
            "provenance",
        ],
    )?;
    let index = required(
        origin,
        path,
        obj,
        "index",
        "give the GPU's device index as nvidia-smi numbers it",
    )?;
    let index_at = field_path(path, "index");
    let index = index
        .as_u64()
        .and_then(|i| u32::try_from(i).ok())
        .ok_or_else(|| wrong_type(origin, &index_at, index, "a device index such as 0"))?;
    let name = required(
        origin,
        path,
        obj,
        "name",
        "give the GPU model, e.g. \"A100-SXM4-80GB\"",
    )?;
    let name = as_string(origin, &field_path(path, "name"), name, "the GPU model")?.to_string();
    let memory = required(
        origin,
        path,
        obj,
        "memory_bytes",
        "give the GPU's memory in bytes, e.g. 85899345920 for 80 GiB",
    )?;
    let memory_at = field_path(path, "memory_bytes");
    let memory_bytes = memory.as_u64().ok_or_else(|| {
        wrong_type(
            origin,
            &memory_at,
            memory,
            "a whole number of bytes, e.g. 85899345920 for 80 GiB",
        )
    })?;
    let peak = required(
        origin,
        path,
        obj,
        "peak_tflops",
        "give the datasheet's dense tensor TFLOPS, e.g. {\"bf16\": 312.0, \"fp16\": 312.0}",
    )?;
    let peak_tflops = parse_peak(origin, &field_path(path, "peak_tflops"), peak)?;
    let measured_tflops = match optional(obj, "measured_tflops") {
        None => None,
        Some(v) => Some(parse_measured(
            origin,
            &field_path(path, "measured_tflops"),
            v,
        )?),
    };
    let provenance = required(
        origin,
        path,
        obj,
        "provenance",
        "say where the GPU's figures came from, e.g. {\"source\": \"datasheet\"}",
    )?;
    let provenance = parse_provenance(origin, &field_path(path, "provenance"), provenance)?;
    Ok(GpuSpec {
        index,
        name,
        memory_bytes,
        peak_tflops,
        measured_tflops,
        provenance,
    })
}

fn parse_peak(origin: &str, path: &str, value: &Value) -> Result<PeakTflops, ProfileError> {
    let obj = as_object(
        origin,
        path,
        value,
        "dense TFLOPS per dtype, e.g. {\"bf16\": 312.0, \"fp16\": 312.0}",
    )?;
    only_fields(origin, path, obj, "peak_tflops", &["bf16", "fp16"])?;
    let bf16 = match optional(obj, "bf16") {
        None => None,
        Some(v) => Some(number(
            origin,
            &field_path(path, "bf16"),
            v,
            "TFLOPS, or null when the GPU has no bf16 tensor cores",
        )?),
    };
    let fp16 = required(
        origin,
        path,
        obj,
        "fp16",
        "give the datasheet's dense fp16 tensor TFLOPS",
    )?;
    let fp16 = number(origin, &field_path(path, "fp16"), fp16, "TFLOPS")?;
    Ok(PeakTflops { bf16, fp16 })
}

fn parse_measured(origin: &str, path: &str, value: &Value) -> Result<MeasuredTflops, ProfileError> {
    let obj = as_object(
        origin,
        path,
        value,
        "{\"dtype\": \"bf16\", \"tflops\": ..., \"provenance\": {...}}",
    )?;
    only_fields(
        origin,
        path,
        obj,
        "measured_tflops",
        &["dtype", "tflops", "provenance"],
    )?;
    let dtype_value = required(
        origin,
        path,
        obj,
        "dtype",
        "say which dtype was measured: \"bf16\" or \"fp16\"",
    )?;
    let dtype_at = field_path(path, "dtype");
    let dtype = match dtype_value.as_str() {
        Some("bf16") => Dtype::Bf16,
        Some("fp16") => Dtype::Fp16,
        _ => {
            return Err(wrong_type(
                origin,
                &dtype_at,
                dtype_value,
                "\"bf16\" or \"fp16\"",
            ))
        }
    };
    let tflops = required(origin, path, obj, "tflops", "give the attained TFLOPS")?;
    let tflops = number(origin, &field_path(path, "tflops"), tflops, "TFLOPS")?;
    let provenance = required(
        origin,
        path,
        obj,
        "provenance",
        "say how it was measured, e.g. {\"source\": \"measured\", \"date\": \"2024-05-31\"}",
    )?;
    let provenance = parse_provenance(origin, &field_path(path, "provenance"), provenance)?;
    Ok(MeasuredTflops {
        dtype,
        tflops,
        provenance,
    })
}

fn parse_provenance(origin: &str, path: &str, value: &Value) -> Result<Provenance, ProfileError> {
    let obj = as_object(
        origin,
        path,
        value,
        "where the figures came from, e.g. {\"source\": \"measured\", \"date\": \"2024-05-31\"}",
    )?;
    only_fields(
        origin,
        path,
        obj,
        "provenance",
        &["source", "date", "tool", "note"],
    )?;
    let source_value = required(
        origin,
        path,
        obj,
        "source",
        "say where the figures came from: measured, datasheet, imported or estimated",
    )?;
    let source_at = field_path(path, "source");
    let source = match source_value {
        Value::String(s) => Source::parse(s).ok_or_else(|| {
            invalid(
                origin,
                &source_at,
                format!(
                    "is {} (write one of \"measured\", \"datasheet\", \"imported\", \"estimated\")",
                    quote(s)
                ),
            )
        })?,
        other => {
            return Err(wrong_type(
                origin,
                &source_at,
                other,
                "one of \"measured\", \"datasheet\", \"imported\", \"estimated\"",
            ))
        }
    };
    let provenance = Provenance {
        source,
        date: optional_string(origin, &field_path(path, "date"), obj.get("date"))?,
        tool: optional_string(origin, &field_path(path, "tool"), obj.get("tool"))?,
        note: optional_string(origin, &field_path(path, "note"), obj.get("note"))?,
    };
    validate_provenance(origin, path, &provenance)?;
    Ok(provenance)
}

fn parse_link_matrix(
    origin: &str,
    path: &str,
    value: &Value,
    shape: &MatrixShape,
) -> Result<LinkMatrix, ProfileError> {
    let obj = as_object(
        origin,
        path,
        value,
        "{\"provenance\": {...}, \"gb_per_s\": [[...]]}",
    )?;
    only_fields(
        origin,
        path,
        obj,
        "a link matrix",
        &["provenance", "gb_per_s"],
    )?;
    let provenance = required(
        origin,
        path,
        obj,
        "provenance",
        "say where the bandwidths came from, e.g. {\"source\": \"measured\", \"tool\": \"nccl-tests\"}",
    )?;
    let provenance = parse_provenance(origin, &field_path(path, "provenance"), provenance)?;
    let cells = required(
        origin,
        path,
        obj,
        "gb_per_s",
        "give the bandwidths in GB/s, one row per sender, one column per receiver",
    )?;
    let cells = read_matrix(
        origin,
        &field_path(path, "gb_per_s"),
        cells,
        shape,
        Cells::Numbers,
    )?;
    Ok(LinkMatrix::from_cells(shape.size, cells, provenance))
}

// ---------------------------------------------------------------------------------------
// Checks shared by the schema reader, `validate` and the importers.

fn validate_gpu(origin: &str, path: &str, gpu: &GpuSpec) -> Result<(), ProfileError> {
    if gpu.name.trim().is_empty() {
        return Err(invalid(
            origin,
            &field_path(path, "name"),
            "is empty (give the GPU model, e.g. \"A100-SXM4-80GB\")".into(),
        ));
    }
    if gpu.memory_bytes == 0 {
        return Err(ProfileError::ZeroMemory {
            origin: origin.into(),
            path: field_path(path, "memory_bytes"),
        });
    }
    let peak = field_path(path, "peak_tflops");
    check_tflops(origin, &field_path(&peak, "fp16"), gpu.peak_tflops.fp16)?;
    if let Some(bf16) = gpu.peak_tflops.bf16 {
        check_tflops(origin, &field_path(&peak, "bf16"), bf16)?;
    }
    if let Some(measured) = &gpu.measured_tflops {
        let at = field_path(path, "measured_tflops");
        check_tflops(origin, &field_path(&at, "tflops"), measured.tflops)?;
        validate_provenance(origin, &field_path(&at, "provenance"), &measured.provenance)?;
    }
    validate_provenance(origin, &field_path(path, "provenance"), &gpu.provenance)
}

fn check_tflops(origin: &str, path: &str, tflops: f64) -> Result<(), ProfileError> {
    let (low, high) = TFLOPS_RANGE;
    if (low..=high).contains(&tflops) {
        Ok(())
    } else {
        Err(invalid(
            origin,
            path,
            format!(
                "is {} (give a TFLOPS figure from {low} to {high}, e.g. 312.0 for an A100 in bf16)",
                show_number(tflops)
            ),
        ))
    }
}

/// `x` kept to [`SIGNIFICANT_DIGITS`] significant digits (see there why).
pub(super) fn round_figure(x: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    format!("{x:.prec$e}", prec = SIGNIFICANT_DIGITS - 1)
        .parse()
        .unwrap_or(x)
}

fn validate_provenance(
    origin: &str,
    path: &str,
    provenance: &Provenance,
) -> Result<(), ProfileError> {
    match &provenance.date {
        Some(date) if !is_iso_date(date) => Err(invalid(
            origin,
            &field_path(path, "date"),
            format!(
                "is {}, not a date (write YYYY-MM-DD, e.g. \"2024-05-31\")",
                quote(date)
            ),
        )),
        _ => Ok(()),
    }
}

/// `YYYY-MM-DD` with a real month and day (leap years included).
fn is_iso_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return false;
    }
    let digits = |range: std::ops::Range<usize>| -> Option<u32> {
        let part = &text[range];
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    };
    let (Some(year), Some(month), Some(day)) = (digits(0..4), digits(5..7), digits(8..10)) else {
        return false;
    };
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

/// Host names must be non-empty, free of blanks and control characters, and unique.
pub(super) fn check_hosts(
    origin: &str,
    hosts: &[String],
    path_of: impl Fn(usize) -> String,
) -> Result<(), ProfileError> {
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, host) in hosts.iter().enumerate() {
        if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid(
                origin,
                &path_of(i),
                format!(
                    "is {}, not a host name (write the name the launcher reaches the node by, without blanks)",
                    quote(host)
                ),
            ));
        }
        if let Some(&first) = seen.get(host.as_str()) {
            return Err(ProfileError::DuplicateHost {
                origin: origin.into(),
                path: path_of(i),
                host: quote(host),
                first: path_of(first),
            });
        }
        seen.insert(host, i);
    }
    Ok(())
}

/// Every off-diagonal cell of `matrix` must be a plausible positive bandwidth.
fn check_matrix(
    origin: &str,
    path: &str,
    matrix: &LinkMatrix,
    labels: &[String],
) -> Result<(), ProfileError> {
    for (from, to, value) in matrix.links() {
        check_bandwidth(
            origin,
            &format!("{path}[{from}][{to}]"),
            value,
            Unit::GbPerS,
            &labels[from],
            &labels[to],
        )?;
    }
    Ok(())
}

/// The unit a file's bandwidths are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unit {
    GbPerS,
    MbPerS,
}

impl Unit {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Unit::GbPerS => "GB/s",
            Unit::MbPerS => "MB/s",
        }
    }

    fn example(self) -> &'static str {
        match self {
            Unit::GbPerS => "19.6",
            Unit::MbPerS => "19600",
        }
    }

    /// The plausible range in this unit.
    fn range(self) -> (f64, f64) {
        let scale = match self {
            Unit::GbPerS => 1.0,
            Unit::MbPerS => 1000.0,
        };
        (
            MIN_PLAUSIBLE_GB_PER_S * scale,
            MAX_PLAUSIBLE_GB_PER_S * scale,
        )
    }
}

/// One link's bandwidth must be finite, positive and plausible.
pub(super) fn check_bandwidth(
    origin: &str,
    path: &str,
    value: f64,
    unit: Unit,
    from: &str,
    to: &str,
) -> Result<(), ProfileError> {
    if !value.is_finite() {
        Err(ProfileError::NotANumber {
            origin: origin.into(),
            path: path.into(),
            found: show_number(value),
            unit: unit.as_str(),
            example: unit.example(),
        })
    } else if value < 0.0 {
        Err(ProfileError::NegativeBandwidth {
            origin: origin.into(),
            path: path.into(),
            value,
            unit: unit.as_str(),
        })
    } else if value == 0.0 {
        Err(ProfileError::ZeroBandwidth {
            origin: origin.into(),
            path: path.into(),
            from: from.into(),
            to: to.into(),
        })
    } else if !(unit.range().0..=unit.range().1).contains(&value) {
        Err(ProfileError::ImplausibleBandwidth {
            origin: origin.into(),
            path: path.into(),
            value,
            unit: unit.as_str(),
            min: unit.range().0,
            max: unit.range().1,
        })
    } else {
        Ok(())
    }
}

/// What a matrix must look like, in words for the messages.
pub(super) struct MatrixShape {
    /// Rows and columns expected.
    pub size: usize,
    /// Why that many, e.g. "there are 4 nodes", "the node has 8 GPUs".
    pub count: String,
    /// One row per what: "node", "GPU", "host".
    pub per: &'static str,
    /// The JSON path of the list the rows follow.
    pub order: String,
}

/// Which cell values a format allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cells {
    /// JSON numbers only (our schema); the diagonal may also be null.
    Numbers,
    /// Numbers or strings holding numbers (Pipette, mpiGraph); the diagonal is not read.
    NumbersOrStrings(Unit),
}

/// Reads a square matrix of `shape.size` rows, row-major, with the diagonal set to 0. Checks
/// shape and cell types; bandwidth values are checked by the caller.
pub(super) fn read_matrix(
    origin: &str,
    path: &str,
    value: &Value,
    shape: &MatrixShape,
    cells: Cells,
) -> Result<Vec<f64>, ProfileError> {
    let per = shape.per;
    let rows = as_array(
        origin,
        path,
        value,
        &format!("a square matrix, one row per {per} (a list of lists)"),
    )?;
    if rows.len() != shape.size {
        return Err(ProfileError::MatrixShape {
            origin: origin.into(),
            path: path.into(),
            problem: format!(
                "has {} but {} (one row per {per}, in the order of {})",
                count(rows.len(), "row"),
                shape.count,
                shape.order
            ),
        });
    }
    let mut out = Vec::with_capacity(shape.size * shape.size);
    for (i, row) in rows.iter().enumerate() {
        let row_path = index_path(path, i);
        let row = as_array(
            origin,
            &row_path,
            row,
            &format!("a row of bandwidths, one per {per}"),
        )?;
        if row.len() != shape.size {
            return Err(ProfileError::MatrixShape {
                origin: origin.into(),
                path: row_path,
                problem: format!(
                    "has {} but {} (one column per {per}, in the order of {})",
                    count(row.len(), "column"),
                    shape.count,
                    shape.order
                ),
            });
        }
        for (j, cell) in row.iter().enumerate() {
            let cell_path = || index_path(&row_path, j);
            let value = if i == j {
                if cells == Cells::Numbers && !(cell.is_number() || cell.is_null()) {
                    return Err(wrong_type(
                        origin,
                        &cell_path(),
                        cell,
                        "a number (the diagonal is not used; write 0)",
                    ));
                }
                0.0
            } else {
                read_cell(origin, &cell_path(), cell, cells)?
            };
            out.push(value);
        }
    }
    Ok(out)
}

fn read_cell(origin: &str, path: &str, cell: &Value, cells: Cells) -> Result<f64, ProfileError> {
    match (cell, cells) {
        (Value::Number(n), _) => Ok(n.as_f64().unwrap_or(f64::NAN)),
        (Value::String(s), Cells::NumbersOrStrings(unit)) => match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(ProfileError::NotANumber {
                origin: origin.into(),
                path: path.into(),
                found: quote(s),
                unit: unit.as_str(),
                example: unit.example(),
            }),
        },
        (Value::String(_), Cells::Numbers) => Err(wrong_type(
            origin,
            path,
            cell,
            "a number in GB/s, without quotes",
        )),
        (_, Cells::Numbers) => Err(wrong_type(origin, path, cell, "a number in GB/s")),
        (_, Cells::NumbersOrStrings(unit)) => Err(wrong_type(
            origin,
            path,
            cell,
            &format!("a number in {}", unit.as_str()),
        )),
    }
}

// ---------------------------------------------------------------------------------------
// Small JSON helpers that keep the paths and the wording of messages in one place.

/// `parent.key`, or `parent["key"]` when the key is not a plain name (mpiGraph's "0").
pub(super) fn field_path(parent: &str, key: &str) -> String {
    let plain = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    match (parent.is_empty(), plain) {
        (true, true) => key.to_string(),
        (false, true) => format!("{parent}.{key}"),
        (_, false) => format!("{parent}[{}]", quote(key)),
    }
}

pub(super) fn index_path(parent: &str, index: usize) -> String {
    format!("{parent}[{index}]")
}

fn shown(path: &str) -> String {
    if path.is_empty() {
        "the top level".into()
    } else {
        path.into()
    }
}

/// A string as a JSON literal on one line, shortened when long.
pub(super) fn quote(text: &str) -> String {
    const MAX_CHARS: usize = 60;
    let mut out = String::from("\"");
    for (k, c) in text.chars().enumerate() {
        if k == MAX_CHARS {
            out.push('…');
            break;
        }
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What a JSON value is, for "is X (expected Y)" messages.
pub(super) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("{b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {}", quote(s)),
        Value::Array(items) if items.is_empty() => "an empty list".into(),
        Value::Array(items) => format!("a list of {}", count(items.len(), "item")),
        Value::Object(map) => describe_keys(map),
    }
}

fn describe_keys(map: &Map<String, Value>) -> String {
    if map.is_empty() {
        return "an empty object".into();
    }
    let mut keys: Vec<String> = map.keys().take(5).map(|k| quote(k)).collect();
    if map.len() > 5 {
        keys.push("…".into());
    }
    format!("an object with fields {}", keys.join(", "))
}

/// A number for a message: `-3`, `19635.4`, `1e-200` (never hundreds of zeros).
pub(super) fn show_number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || (1e-4..1e15).contains(&x.abs()) {
        x.to_string()
    } else {
        format!("{x:e}")
    }
}

/// "1 row", "8 rows".
pub(super) fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// "there is 1 node", "there are 4 nodes".
fn there_are(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("there is 1 {noun}")
    } else {
        format!("there are {n} {noun}s")
    }
}

/// The origin without control characters, so that every message stays on one line.
fn clean_origin(origin: &str) -> String {
    origin
        .chars()
        .map(|c| {
            if c.is_control() || c == '\u{2028}' || c == '\u{2029}' {
                '?'
            } else {
                c
            }
        })
        .collect()
}

fn syntax_error(origin: &str, error: &serde_json::Error) -> ProfileError {
    let text = error.to_string();
    // serde_json ends its messages with " at line L column C"; we put those first.
    let message = match text.rfind(" at line ") {
        Some(at) => text[..at].to_string(),
        None => text,
    };
    let hint = if error.classify() == serde_json::error::Category::Eof {
        "the file is empty or cut short"
    } else {
        "fix the JSON at that line and column"
    };
    ProfileError::Syntax {
        origin: origin.into(),
        line: error.line(),
        column: error.column(),
        message,
        hint,
    }
}

pub(super) fn invalid(origin: &str, path: &str, problem: String) -> ProfileError {
    ProfileError::InvalidValue {
        origin: origin.into(),
        path: shown(path),
        problem,
    }
}

pub(super) fn missing(origin: &str, path: &str, hint: String) -> ProfileError {
    ProfileError::MissingField {
        origin: origin.into(),
        path: shown(path),
        hint,
    }
}

pub(super) fn wrong_type(origin: &str, path: &str, found: &Value, expected: &str) -> ProfileError {
    ProfileError::WrongType {
        origin: origin.into(),
        path: shown(path),
        found: describe(found),
        expected: expected.into(),
    }
}

/// `obj[key]`, or a "missing" error whose hint says what to write. Null counts as missing.
pub(super) fn required<'v>(
    origin: &str,
    parent: &str,
    obj: &'v Map<String, Value>,
    key: &str,
    hint: &str,
) -> Result<&'v Value, ProfileError> {
    optional(obj, key).ok_or_else(|| missing(origin, &field_path(parent, key), hint.into()))
}

/// `obj[key]` unless absent or null.
pub(super) fn optional<'v>(obj: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn optional_string(
    origin: &str,
    path: &str,
    value: Option<&Value>,
) -> Result<Option<String>, ProfileError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(wrong_type(origin, path, other, "a string")),
    }
}

pub(super) fn as_object<'v>(
    origin: &str,
    path: &str,
    value: &'v Value,
    expected: &str,
) -> Result<&'v Map<String, Value>, ProfileError> {
    value
        .as_object()
        .ok_or_else(|| wrong_type(origin, path, value, expected))
}

pub(super) fn as_array<'v>(
    origin: &str,
    path: &str,
    value: &'v Value,
    expected: &str,
) -> Result<&'v Vec<Value>, ProfileError> {
    value
        .as_array()
        .ok_or_else(|| wrong_type(origin, path, value, expected))
}

pub(super) fn as_string<'v>(
    origin: &str,
    path: &str,
    value: &'v Value,
    expected: &str,
) -> Result<&'v str, ProfileError> {
    value
        .as_str()
        .ok_or_else(|| wrong_type(origin, path, value, &format!("{expected} (a string)")))
}

/// A JSON number, kept to [`SIGNIFICANT_DIGITS`].
fn number(origin: &str, path: &str, value: &Value, expected: &str) -> Result<f64, ProfileError> {
    match value {
        Value::Number(n) => Ok(round_figure(n.as_f64().unwrap_or(f64::NAN))),
        Value::String(_) => Err(wrong_type(
            origin,
            path,
            value,
            &format!("a number of {expected}, without quotes"),
        )),
        _ => Err(wrong_type(
            origin,
            path,
            value,
            &format!("a number of {expected}"),
        )),
    }
}

/// Rejects fields `owner` does not have: a misspelt field would otherwise be ignored.
fn only_fields(
    origin: &str,
    path: &str,
    obj: &Map<String, Value>,
    owner: &'static str,
    allowed: &[&str],
) -> Result<(), ProfileError> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        None => Ok(()),
        Some(key) => Err(ProfileError::UnknownField {
            origin: origin.into(),
            path: field_path(path, key),
            owner,
            allowed: allowed.join(", "),
        }),
    }
}

// ---------------------------------------------------------------------------------------
// Writing: an ordered document tree, so that fields come out in schema order (serde_json's
// own map sorts keys) and matrices come out one row per line.

/// Lines up to this many characters keep a small object or list on one line.
const LINE_WIDTH: usize = 160;

enum Doc {
    Null,
    Int(u64),
    Num(f64),
    Str(String),
    List(Vec<Doc>),
    Obj(Vec<(&'static str, Doc)>),
}

impl Doc {
    fn is_container(&self) -> bool {
        matches!(self, Doc::List(_) | Doc::Obj(_))
    }

    fn has_containers(&self) -> bool {
        match self {
            Doc::List(items) => items.iter().any(Doc::is_container),
            Doc::Obj(fields) => fields.iter().any(|(_, v)| v.is_container()),
            _ => false,
        }
    }

    fn write_inline(&self, out: &mut String) {
        match self {
            Doc::Null => out.push_str("null"),
            Doc::Int(i) => out.push_str(&i.to_string()),
            // serde_json writes the shortest text that reads back as the same f64.
            Doc::Num(x) => {
                out.push_str(&serde_json::to_string(x).unwrap_or_else(|_| "null".into()))
            }
            Doc::Str(s) => {
                out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()))
            }
            Doc::List(items) => {
                out.push('[');
                for (k, item) in items.iter().enumerate() {
                    if k > 0 {
                        out.push_str(", ");
                    }
                    item.write_inline(out);
                }
                out.push(']');
            }
            Doc::Obj(fields) => {
                out.push('{');
                for (k, (key, value)) in fields.iter().enumerate() {
                    if k > 0 {
                        out.push_str(", ");
                    }
                    out.push('"');
                    out.push_str(key);
                    out.push_str("\": ");
                    value.write_inline(out);
                }
                out.push('}');
            }
        }
    }

    /// Containers of scalars (a matrix row, a provenance) always go on one line; other
    /// containers too when they fit in [`LINE_WIDTH`] from `column`; else one member a line.
    fn write_pretty(&self, out: &mut String, indent: usize, column: usize) {
        let mut inline = String::new();
        self.write_inline(&mut inline);
        if !self.has_containers() || column + inline.chars().count() <= LINE_WIDTH {
            out.push_str(&inline);
            return;
        }
        let pad = " ".repeat(indent + 2);
        match self {
            Doc::List(items) => {
                out.push_str("[\n");
                for (k, item) in items.iter().enumerate() {
                    out.push_str(&pad);
                    item.write_pretty(out, indent + 2, indent + 2);
                    out.push_str(if k + 1 < items.len() { ",\n" } else { "\n" });
                }
                out.push_str(&" ".repeat(indent));
                out.push(']');
            }
            Doc::Obj(fields) => {
                out.push_str("{\n");
                for (k, (key, value)) in fields.iter().enumerate() {
                    out.push_str(&pad);
                    out.push('"');
                    out.push_str(key);
                    out.push_str("\": ");
                    value.write_pretty(out, indent + 2, indent + 2 + key.chars().count() + 4);
                    out.push_str(if k + 1 < fields.len() { ",\n" } else { "\n" });
                }
                out.push_str(&" ".repeat(indent));
                out.push('}');
            }
            _ => out.push_str(&inline),
        }
    }
}

impl Serialize for Doc {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self {
            Doc::Null => serializer.serialize_unit(),
            Doc::Int(i) => serializer.serialize_u64(*i),
            Doc::Num(x) => serializer.serialize_f64(*x),
            Doc::Str(s) => serializer.serialize_str(s),
            Doc::List(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Doc::Obj(fields) => {
                let mut map = serializer.serialize_map(Some(fields.len()))?;
                for (key, value) in fields {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }
    }
}

impl NodeProfile {
    fn to_doc(&self) -> Doc {
        let mut fields = vec![("host", Doc::Str(self.host.clone()))];
        match &self.gpus {
            GpuInventory::Unknown => fields.push(("gpus", Doc::Str("unknown".into()))),
            GpuInventory::Known { gpus, links } => {
                fields.push((
                    "gpus",
                    Doc::List(gpus.iter().map(GpuSpec::to_doc).collect()),
                ));
                fields.push(("gpu_links", links.to_doc()));
            }
        }
        Doc::Obj(fields)
    }
}

impl GpuSpec {
    fn to_doc(&self) -> Doc {
        let mut fields = vec![
            ("index", Doc::Int(self.index.into())),
            ("name", Doc::Str(self.name.clone())),
            ("memory_bytes", Doc::Int(self.memory_bytes)),
            (
                "peak_tflops",
                Doc::Obj(vec![
                    ("bf16", self.peak_tflops.bf16.map_or(Doc::Null, Doc::Num)),
                    ("fp16", Doc::Num(self.peak_tflops.fp16)),
                ]),
            ),
        ];
        if let Some(m) = &self.measured_tflops {
            fields.push((
                "measured_tflops",
                Doc::Obj(vec![
                    ("dtype", Doc::Str(m.dtype.as_str().into())),
                    ("tflops", Doc::Num(m.tflops)),
                    ("provenance", m.provenance.to_doc()),
                ]),
            ));
        }
        fields.push(("provenance", self.provenance.to_doc()));
        Doc::Obj(fields)
    }
}

impl Provenance {
    fn to_doc(&self) -> Doc {
        let mut fields = vec![("source", Doc::Str(self.source.as_str().into()))];
        for (key, value) in [
            ("date", &self.date),
            ("tool", &self.tool),
            ("note", &self.note),
        ] {
            if let Some(text) = value {
                fields.push((key, Doc::Str(text.clone())));
            }
        }
        Doc::Obj(fields)
    }
}

impl LinkMatrix {
    fn to_doc(&self) -> Doc {
        let rows = (0..self.size)
            .map(|i| Doc::List(self.row(i).iter().map(|&x| Doc::Num(x)).collect()))
            .collect();
        Doc::Obj(vec![
            ("provenance", self.provenance.to_doc()),
            ("gb_per_s", Doc::List(rows)),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100(index: u32) -> GpuSpec {
        GpuSpec {
            index,
            name: "A100-SXM4-80GB".into(),
            memory_bytes: 85_899_345_920,
            peak_tflops: PeakTflops {
                bf16: Some(312.0),
                fp16: 312.0,
            },
            measured_tflops: None,
            provenance: Provenance::new(Source::Datasheet),
        }
    }

    fn two_nodes() -> ClusterProfile {
        let gpus = GpuInventory::Known {
            gpus: vec![a100(0), a100(1)],
            links: LinkMatrix::uniform(2, 240.0, Provenance::new(Source::Estimated)),
        };
        ClusterProfile {
            note: Some("two nodes".into()),
            nodes: vec![
                NodeProfile {
                    host: "n0".into(),
                    gpus: gpus.clone(),
                },
                NodeProfile {
                    host: "n1".into(),
                    gpus,
                },
            ],
            node_links: LinkMatrix::from_rows(
                &[vec![0.0, 23.5], vec![23.25, 0.0]],
                Provenance::new(Source::Measured)
                    .with_date("2024-05-31")
                    .with_tool("nccl-tests"),
            )
            .unwrap(),
        }
    }

    #[test]
    fn link_matrix_reads_by_sender_then_receiver() {
        let m = LinkMatrix::from_rows(
            &[
                vec![9.0, 1.0, 2.0],
                vec![3.0, 9.0, 4.0],
                vec![5.0, 6.0, 9.0],
            ],
            Provenance::new(Source::Measured),
        )
        .unwrap();
        assert_eq!(m.size(), 3);
        assert_eq!(m.get(0, 1), 1.0);
        assert_eq!(m.get(1, 0), 3.0);
        assert_eq!(m.get(2, 2), 0.0, "the diagonal is set to 0");
        assert_eq!(m.row(1), &[3.0, 0.0, 4.0]);
        assert_eq!(m.min_link(), Some(1.0));
        assert_eq!(m.max_link(), Some(6.0));
        assert_eq!(m.links().count(), 6);
        assert!(
            LinkMatrix::from_rows(&[vec![1.0, 2.0]], Provenance::new(Source::Measured)).is_none()
        );
    }

    #[test]
    fn link_matrix_set_ignores_the_diagonal() {
        let mut m = LinkMatrix::uniform(2, 10.0, Provenance::new(Source::Estimated));
        m.set(0, 1, 12.5);
        m.set(1, 1, 99.0);
        assert_eq!(m.get(0, 1), 12.5);
        assert_eq!(m.get(1, 1), 0.0);
        assert_eq!(
            LinkMatrix::uniform(1, 5.0, Provenance::new(Source::Estimated)).min_link(),
            None
        );
    }

    #[test]
    fn paths_quote_keys_that_are_not_plain_names() {
        assert_eq!(field_path("", "nodes"), "nodes");
        assert_eq!(field_path("nodes[3]", "gpu_links"), "nodes[3].gpu_links");
        assert_eq!(field_path("", "0"), "[\"0\"]");
        assert_eq!(field_path("x", "a b"), "x[\"a b\"]");
        assert_eq!(index_path("nodes", 2), "nodes[2]");
    }

    #[test]
    fn quote_keeps_messages_on_one_line() {
        assert_eq!(quote("a\nb"), "\"a\\u000ab\"");
        assert_eq!(quote("x\u{2028}"), "\"x\\u2028\"");
        assert!(quote(&"h".repeat(100)).ends_with("…\""));
        assert_eq!(clean_origin("a\nb.json"), "a?b.json");
    }

    #[test]
    fn dates_must_be_real() {
        for good in ["2024-05-31", "2024-02-29", "2000-02-29", "1999-12-01"] {
            assert!(is_iso_date(good), "{good}");
        }
        for bad in [
            "2024-5-31",
            "2023-02-29",
            "1900-02-29",
            "2024-13-01",
            "2024-04-31",
            "2024-00-10",
            "yesterday",
            "2024-05-3x",
            "+024-05-31",
        ] {
            assert!(!is_iso_date(bad), "{bad}");
        }
    }

    #[test]
    fn pretty_output_reads_back_equal() {
        let profile = two_nodes();
        let text = profile.to_json_pretty();
        assert!(
            text.starts_with("{\n  \"schema\": \"pipette-cluster/1\",\n"),
            "{text}"
        );
        assert!(text.ends_with("}\n"));
        let again = ClusterProfile::from_json_str(&text, "t.json").unwrap();
        assert_eq!(again, profile);
        // serde goes through the same reader.
        let json = serde_json::to_string(&profile).unwrap();
        let back: ClusterProfile = serde_json::from_str(&json).unwrap();
        assert_eq!(back, profile);
    }

    #[test]
    fn pretty_output_puts_one_matrix_row_on_a_line() {
        let mut profile = two_nodes();
        profile.node_links = LinkMatrix::uniform(12, 23.5, Provenance::new(Source::Estimated));
        profile.nodes = (0..12)
            .map(|i| NodeProfile {
                host: format!("n{i}"),
                gpus: GpuInventory::Unknown,
            })
            .collect();
        let text = profile.to_json_pretty();
        let row_lines = text
            .lines()
            .filter(|l| {
                l.trim_start().starts_with("[0.0, 23.5") || l.trim_start().starts_with("[23.5")
            })
            .count();
        assert_eq!(row_lines, 12, "{text}");
        assert!(
            text.contains("    {\"host\": \"n0\", \"gpus\": \"unknown\"},\n"),
            "{text}"
        );
        assert!(!text.contains("\"bf16\""));
    }

    #[test]
    fn validate_names_the_field() {
        let mut profile = two_nodes();
        if let GpuInventory::Known { gpus, .. } = &mut profile.nodes[1].gpus {
            gpus[1].memory_bytes = 0;
        }
        let err = profile.validate("mem.json").unwrap_err().to_string();
        assert!(
            err.starts_with("mem.json: nodes[1].gpus[1].memory_bytes is 0 bytes"),
            "{err}"
        );

        let mut profile = two_nodes();
        profile.node_links.set(1, 0, f64::NAN);
        let err = profile.validate("nan.json").unwrap_err().to_string();
        assert!(
            err.contains("node_links.gb_per_s[1][0] is NaN, not a finite number"),
            "{err}"
        );
    }

    #[test]
    fn default_gpus_fill_unknown_nodes_only() {
        let mut profile = two_nodes();
        profile.nodes[1].gpus = GpuInventory::Unknown;
        assert!(!profile.gpus_known());
        assert_eq!(profile.gpu_count(), None);
        let filled = profile.with_default_gpus(a100(7), 4, 200.0).unwrap();
        assert!(filled.gpus_known());
        assert_eq!(filled.gpu_count(), Some(6));
        assert_eq!(
            filled.nodes[0].gpus().unwrap().len(),
            2,
            "known nodes are kept"
        );
        let gpus = filled.nodes[1].gpus().unwrap();
        assert_eq!(
            gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        let links = filled.nodes[1].gpu_links().unwrap();
        assert_eq!(links.get(0, 3), 200.0);
        assert_eq!(links.provenance.source, Source::Estimated);
        filled.validate("filled").unwrap();
    }

    #[test]
    fn default_gpus_reject_nonsense() {
        let profile = two_nodes();
        let err = profile
            .clone()
            .with_default_gpus(a100(0), 0, 200.0)
            .unwrap_err();
        assert!(err.to_string().contains("per_node is 0"), "{err}");
        let err = profile
            .clone()
            .with_default_gpus(a100(0), 8, -1.0)
            .unwrap_err();
        assert!(
            err.to_string().contains("intra_node_gb_per_s is -1"),
            "{err}"
        );
        let mut bad = a100(0);
        bad.memory_bytes = 0;
        let err = profile.with_default_gpus(bad, 8, 200.0).unwrap_err();
        assert!(
            err.to_string().contains("gpu.memory_bytes is 0 bytes"),
            "{err}"
        );
    }

    #[test]
    fn syntax_errors_carry_line_and_column() {
        let err = ClusterProfile::from_json_str("{\n  \"schema\": 1,,\n}", "s.json").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("s.json:2:"), "{text}");
        assert!(!text.contains(" at line "), "{text}");
        let err = ClusterProfile::from_json_str("", "e.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("empty or cut short"), "{err}");
    }

    #[test]
    fn figures_read_back_exactly() {
        assert_eq!(round_figure(0.1 + 0.2), 0.3);
        assert_eq!(round_figure(18.908481062499998), 18.9084810625);
        assert!(round_figure(f64::NAN).is_nan());
        for x in [
            18.908481062499998,
            0.1 + 0.2,
            1234.5678901234567,
            0.0012345678901234,
            99999.99999999999,
        ] {
            let q = round_figure(x);
            assert_eq!(round_figure(q), q, "idempotent");
            let text = serde_json::to_string(&q).unwrap();
            assert_eq!(serde_json::from_str::<f64>(&text).unwrap(), q, "{text}");
        }
    }

    #[test]
    fn peak_tflops_by_dtype() {
        let v100 = PeakTflops {
            bf16: None,
            fp16: 125.0,
        };
        assert_eq!(v100.get(Dtype::Fp16), Some(125.0));
        assert_eq!(v100.get(Dtype::Bf16), None);
        assert_eq!(Dtype::Bf16.to_string(), "bf16");
        assert_eq!(Source::parse("imported"), Some(Source::Imported));
        assert_eq!(Source::parse("guess"), None);
    }
}
