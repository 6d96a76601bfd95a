//! What a node has: its GPUs (from `nvidia-smi`), how they are wired (`nvidia-smi topo -m`),
//! and, for a node without GPUs, its CPUs and memory.
//!
//! The parsers are pure and tested on outputs captured on real machines
//! (`tests/fixtures/nvidia-smi/`, see its README). [`peak_for`] holds the datasheet figures
//! by model; [`estimated_link_gb_per_s`] turns a topology class into the bandwidth the
//! profile carries until the probe measures the link.

use std::time::Duration;

use crate::cluster::profile::{LinkMatrix, PeakTflops, Provenance, Source};
use crate::cluster::Slots;
use crate::exec::{self, ExecError, NodeCommand, Status, Transport};

/// `nvidia-smi` arguments that list the GPUs (what [`parse_gpu_query`] reads).
pub const GPU_QUERY_ARGS: [&str; 2] = [
    "--query-gpu=index,name,memory.total,pci.bus_id",
    "--format=csv,noheader,nounits",
];

/// `nvidia-smi` arguments that print the topology matrix (what [`parse_topology`] reads).
pub const TOPOLOGY_ARGS: [&str; 2] = ["topo", "-m"];

/// One GPU as `nvidia-smi` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRecord {
    pub index: u32,
    pub name: String,
    pub memory_bytes: u64,
    /// `00000000:07:00.0`, when the query listed it.
    pub pci_bus_id: Option<String>,
}

/// A malformed `nvidia-smi` output: which line, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}")]
pub struct ParseError {
    pub what: String,
}

fn parse_error(what: impl Into<String>) -> ParseError {
    ParseError { what: what.into() }
}

/// Reads `nvidia-smi --query-gpu=index,name,memory.total[,pci.bus_id] --format=csv[,noheader][,nounits]`.
///
/// With a header line (`index, name, memory.total [MiB], ...`) columns are found by name,
/// so other column sets and orders read too; without one they are taken in
/// [`GPU_QUERY_ARGS`]'s order. Memory may carry its unit (`32768 MiB`). Blank lines are
/// skipped; GPUs come back in index order.
pub fn parse_gpu_query(text: &str) -> Result<Vec<GpuRecord>, ParseError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(n, l)| (n + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty())
        .peekable();
    let mut columns = [Some(0), Some(1), Some(2), Some(3)];
    if let Some((_, first)) = lines.peek() {
        let names: Vec<String> = split_csv(first)
            .iter()
            .map(|c| {
                c.split(" [")
                    .next()
                    .unwrap_or(c)
                    .trim()
                    .to_ascii_lowercase()
            })
            .collect();
        if names.first().is_some_and(|n| n == "index") {
            let find = |key: &str| names.iter().position(|n| n == key);
            columns = [
                find("index"),
                find("name"),
                find("memory.total"),
                find("pci.bus_id"),
            ];
            for (key, col) in ["name", "memory.total"].iter().zip(&columns[1..3]) {
                if col.is_none() {
                    return Err(parse_error(format!(
                        "the header has no {key} column: {first:?}"
                    )));
                }
            }
            lines.next();
        }
    }
    let mut gpus = Vec::new();
    for (line_no, line) in lines {
        let cells = split_csv(line);
        let cell = |col: Option<usize>| col.and_then(|c| cells.get(c).copied());
        let bad = |what: &str| parse_error(format!("line {line_no}: {what}: {line:?}"));
        let index = cell(columns[0])
            .and_then(|c| c.parse::<u32>().ok())
            .ok_or_else(|| bad("no GPU index"))?;
        let name = cell(columns[1])
            .filter(|c| !c.is_empty())
            .ok_or_else(|| bad("no GPU name"))?;
        let memory_bytes = cell(columns[2])
            .and_then(parse_memory_bytes)
            .ok_or_else(|| bad("no memory size (expected MiB, e.g. 81920)"))?;
        let pci_bus_id = cell(columns[3])
            .filter(|c| !c.is_empty() && !c.starts_with('['))
            .map(str::to_owned);
        gpus.push(GpuRecord {
            index,
            // A node's own text: shown escaped, never as terminal controls.
            name: crate::log::printable(name).into_owned(),
            memory_bytes,
            pci_bus_id,
        });
    }
    gpus.sort_by_key(|g| g.index);
    if let Some(w) = gpus.windows(2).find(|w| w[0].index == w[1].index) {
        return Err(parse_error(format!(
            "GPU index {} is listed twice",
            w[0].index
        )));
    }
    Ok(gpus)
}

fn split_csv(line: &str) -> Vec<&str> {
    line.split(',').map(str::trim).collect()
}

/// `81920`, `81920 MiB`, `80 GiB` → bytes (a bare number is MiB, nvidia-smi's unit).
fn parse_memory_bytes(cell: &str) -> Option<u64> {
    let mut words = cell.split_whitespace();
    let number: u64 = words.next()?.parse().ok()?;
    let scale: u64 = match words.next() {
        None | Some("MiB") => 1 << 20,
        Some("GiB") => 1 << 30,
        Some("KiB") => 1 << 10,
        Some(_) => return None,
    };
    (number > 0).then(|| number.saturating_mul(scale))
}

/// How two GPUs are connected, as `nvidia-smi topo -m` names it (best first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkClass {
    /// `NV#`: a bonded set of this many NVLinks.
    NvLink(u32),
    /// At most one PCIe bridge.
    Pix,
    /// Several PCIe bridges, not the host bridge.
    Pxb,
    /// Through a PCIe host bridge (the CPU).
    Phb,
    /// Between host bridges inside one NUMA node.
    Node,
    /// Across the SMP interconnect between NUMA nodes (QPI/UPI); older drivers say `SOC`.
    Sys,
}

impl LinkClass {
    fn parse(cell: &str) -> Option<LinkClass> {
        Some(match cell {
            "PIX" => LinkClass::Pix,
            "PXB" => LinkClass::Pxb,
            "PHB" => LinkClass::Phb,
            "NODE" => LinkClass::Node,
            "SYS" | "SOC" => LinkClass::Sys,
            _ => LinkClass::NvLink(cell.strip_prefix("NV")?.parse().ok().filter(|n| *n > 0)?),
        })
    }

    pub fn as_string(self) -> String {
        match self {
            LinkClass::NvLink(n) => format!("NV{n}"),
            LinkClass::Pix => "PIX".into(),
            LinkClass::Pxb => "PXB".into(),
            LinkClass::Phb => "PHB".into(),
            LinkClass::Node => "NODE".into(),
            LinkClass::Sys => "SYS".into(),
        }
    }
}

/// The GPU part of `nvidia-smi topo -m`: the link class of every GPU pair, by index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    gpus: usize,
    classes: Vec<Option<LinkClass>>,
}

impl Topology {
    /// GPUs in the matrix.
    pub fn gpu_count(&self) -> usize {
        self.gpus
    }

    /// The class of the link between GPU indices `a` and `b` (`None` when `a == b` or out of range).
    pub fn class(&self, a: usize, b: usize) -> Option<LinkClass> {
        if a >= self.gpus || b >= self.gpus {
            return None;
        }
        self.classes[a * self.gpus + b]
    }
}

/// Reads `nvidia-smi topo -m`: the header row of device names, then one row per device.
///
/// Tolerates what real outputs contain: ANSI colour and underline codes (newer drivers on
/// a terminal, or captured through one), tabs or runs of spaces between cells, NIC columns
/// (`NIC0`, `mlx5_0`), the affinity columns, a header with or without its leading tab, and
/// the legend after the matrix.
pub fn parse_topology(text: &str) -> Result<Topology, ParseError> {
    let clean = strip_ansi(text);
    let rows: Vec<Vec<&str>> = clean
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .collect();
    let is_cell = |t: &str| t == "X" || LinkClass::parse(t).is_some();
    let header_at = rows
        .iter()
        .position(|r| {
            r.iter()
                .position(|t| *t == "GPU0")
                .is_some_and(|i| r.get(i + 1).is_none_or(|next| !is_cell(next)))
        })
        .ok_or_else(|| parse_error("no header row naming GPU0 (is this `nvidia-smi topo -m`?)"))?;
    let header = &rows[header_at];
    let devices: Vec<&str> = header
        .iter()
        .copied()
        .take_while(|t| *t != "CPU" && *t != "NUMA")
        .collect();
    let gpus = devices
        .iter()
        .take_while(|t| {
            t.strip_prefix("GPU")
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .count();
    for (i, name) in devices.iter().take(gpus).enumerate() {
        if *name != format!("GPU{i}") {
            return Err(parse_error(format!(
                "header column {} is {name}, expected GPU{i}",
                i + 1
            )));
        }
    }
    let mut classes = vec![None; gpus * gpus];
    for gpu in 0..gpus {
        let label = format!("GPU{gpu}");
        let row = rows[header_at + 1..]
            .iter()
            .find(|r| r.first() == Some(&label.as_str()))
            .ok_or_else(|| parse_error(format!("no row for {label}")))?;
        if row.len() < 1 + gpus {
            return Err(parse_error(format!(
                "the row for {label} has {} cells, expected at least {gpus}",
                row.len() - 1
            )));
        }
        for (other, cell) in row[1..=gpus].iter().enumerate() {
            if other == gpu {
                if *cell != "X" {
                    return Err(parse_error(format!(
                        "{label} to itself is {cell}, expected X"
                    )));
                }
                continue;
            }
            let class = LinkClass::parse(cell).ok_or_else(|| {
                parse_error(format!(
                    "{label} to GPU{other} is {cell:?}, not a link class"
                ))
            })?;
            classes[gpu * gpus + other] = Some(class);
        }
    }
    Ok(Topology { gpus, classes })
}

/// `nvidia-smi` arguments that print every GPU's details, the `Fabric` block among them
/// (what [`parse_fabric`] reads).
pub const QUERY_ALL_ARGS: [&str; 1] = ["-q"];

/// The NVLink domain `nvidia-smi -q` reports for a node: `CLUSTERUUID/CLIQUEID` of the
/// first GPU whose `Fabric` block says `State : Completed` and `Status : Success` with a
/// cluster UUID that is not all zeros (NVML's rule: the status counts only once the state
/// is complete; a zero UUID is what non-MNNVL GPUs such as the H100 report). `None`: no
/// such block (no multi-node NVLink, or its registration failed).
pub fn parse_fabric(text: &str) -> Option<String> {
    let mut in_fabric = false;
    let (mut state, mut status, mut clique, mut cluster) = (None, None, None, None);
    let mut found = None;
    let mut finish = |state: &mut Option<String>,
                      status: &mut Option<String>,
                      clique: &mut Option<String>,
                      cluster: &mut Option<String>| {
        let ok = state.as_deref() == Some("Completed") && status.as_deref() == Some("Success");
        if let (true, Some(c), Some(u)) = (ok, clique.take(), cluster.take()) {
            let zero = u.chars().all(|ch| ch == '0' || ch == '-');
            if !zero && found.is_none() {
                found = Some(format!("{u}/{c}"));
            }
        }
        *state = None;
        *status = None;
        *clique = None;
        *cluster = None;
    };
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed == "Fabric" {
            finish(&mut state, &mut status, &mut clique, &mut cluster);
            in_fabric = true;
            continue;
        }
        if !in_fabric {
            continue;
        }
        let Some((key, value)) = trimmed.split_once(':') else {
            continue;
        };
        let value = Some(value.trim().to_owned());
        match key.trim() {
            "State" => state = value,
            "Status" => status = value,
            "CliqueId" => clique = value,
            "ClusterUUID" => cluster = value,
            _ => {}
        }
    }
    finish(&mut state, &mut status, &mut clique, &mut cluster);
    found
}

/// Removes ANSI escape sequences (`ESC [ ... letter`, and lone `ESC x`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            chars.next();
        }
    }
    out
}

/// What the datasheet says of a GPU model: dense tensor-core peaks and its links.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelSheet {
    pub model: &'static str,
    pub peak: PeakTflops,
    /// PCIe generation of the GPU's host link (x16).
    pub pcie_gen: u32,
    /// One NVLink's rate in one direction, GB/s (0: no NVLink).
    pub nvlink_gb_per_s: f64,
    /// NVLink generation (0: none, or not recorded for this model).
    pub nvlink_gen: u32,
    /// HBM capacity, GB (10^9 bytes, as datasheets count), when recorded.
    pub hbm_gb: Option<f64>,
    /// HBM bandwidth, GB/s, when recorded.
    pub hbm_gb_per_s: Option<f64>,
    /// Where the figures came from (the models this round added name theirs per figure).
    pub source: &'static str,
}

const fn sheet(
    model: &'static str,
    bf16: Option<f64>,
    fp16: f64,
    pcie_gen: u32,
    nvlink_gb_per_s: f64,
) -> ModelSheet {
    ModelSheet {
        model,
        peak: PeakTflops::new(bf16, fp16),
        pcie_gen,
        nvlink_gb_per_s,
        nvlink_gen: 0,
        hbm_gb: None,
        hbm_gb_per_s: None,
        source: "NVIDIA's datasheet for the model (dense tensor-core figures)",
    }
}

/// A Hopper or Blackwell datasheet: 16-bit, FP8 and FP4 dense peaks (TFLOPS), HBM and
/// NVLink, with their source.
struct Sheet {
    model: &'static str,
    bf16: f64,
    fp8: f64,
    fp4: Option<f64>,
    hbm_gb: f64,
    hbm_tb_per_s: f64,
    nvlink_gen: u32,
    source: &'static str,
}

const fn full_sheet(s: Sheet) -> ModelSheet {
    ModelSheet {
        model: s.model,
        peak: PeakTflops::new(Some(s.bf16), s.bf16).with_low_precision(Some(s.fp8), s.fp4),
        pcie_gen: if s.nvlink_gen >= 5 { 6 } else { 5 },
        // NVLink 4 and 5: 18 links a GPU, 900 and 1,800 GB/s both ways together.
        nvlink_gb_per_s: if s.nvlink_gen >= 5 { 50.0 } else { 25.0 },
        nvlink_gen: s.nvlink_gen,
        hbm_gb: Some(s.hbm_gb),
        hbm_gb_per_s: Some(s.hbm_tb_per_s * 1000.0),
        source: s.source,
    }
}

/// Blackwell B200 and GB200 (dense; NVIDIA quotes sparse figures, twice these).
const GB200: Sheet = Sheet {
    model: "GB200",
    bf16: 2500.0,
    fp8: 5000.0,
    fp4: Some(10000.0),
    hbm_gb: 186.0,
    hbm_tb_per_s: 8.0,
    nvlink_gen: 5,
    source: "peaks: the GB200 (1,200 W) dense column of NVIDIA's Blackwell datasheet as \
             tabulated at glennklockwood.com/garden/processors/B200 (BF16 2,500, FP8 5,000, \
             FP4 10,000 TFLOPS); HBM: NVIDIA GB200 NVL72 specifications, 13.4 TB HBM3e and \
             576 TB/s per 72 GPUs (186 GB, 8 TB/s each); NVLink 5, 1.8 TB/s per GPU",
};
const B200: Sheet = Sheet {
    model: "B200",
    bf16: 2250.0,
    fp8: 4500.0,
    fp4: Some(9000.0),
    hbm_gb: 180.0,
    hbm_tb_per_s: 8.0,
    nvlink_gen: 5,
    source: "peaks: the HGX B200 (1,000 W) dense column of NVIDIA's Blackwell datasheet as \
             tabulated at glennklockwood.com/garden/processors/B200 (BF16 2,250, FP8 4,500, \
             FP4 9,000 TFLOPS; HGX B200: FP8 72 PFLOPS sparse per 8 GPUs); HBM: DGX B200 \
             1,440 GB per 8 GPUs (NVIDIA DGX BasePOD reference architecture, \"1.4TB\"), 8 TB/s \
             (ibid.); NVLink 5, 1.8 TB/s per GPU",
};
const B300: Sheet = Sheet {
    model: "B300",
    bf16: 2250.0,
    fp8: 4500.0,
    fp4: Some(13125.0),
    hbm_gb: 288.0,
    hbm_tb_per_s: 8.0,
    nvlink_gen: 5,
    source: "peaks: the HGX B300 dense column (BF16 2,250, FP8 4,500, FP4 13,125 TFLOPS) and \
             288 GB HBM3e at 8 TB/s, glennklockwood.com/garden/processors/B300 (from \
             NVIDIA's HGX B300 datasheet: FP8 72 PFLOPS and BF16 36 PFLOPS sparse per 8 GPUs); \
             NVLink 5, 1.8 TB/s per GPU",
};
const GB300: Sheet = Sheet {
    model: "GB300",
    // Not quoted per GPU; every Blackwell row above has FP8 = 2 x BF16.
    bf16: 2500.0,
    fp8: 5000.0,
    fp4: Some(15278.0),
    hbm_gb: 288.0,
    hbm_tb_per_s: 8.0,
    nvlink_gen: 5,
    source: "NVIDIA GB300 NVL72 as tabulated at glennklockwood.com/garden/processors/B300: \
             360 PF dense FP8 per 72 GPUs (5,000 each), 1.1 EF dense FP4 per 72 GPUs \
             (15,278 each, from the rounded rack figure), 288 GB HBM3e at 8 TB/s; BF16 derived as FP8 / 2 (the \
             ratio of every Blackwell datasheet row; no per-GPU BF16 figure was found); \
             NVLink 5, 1.8 TB/s per GPU",
};
const H200: Sheet = Sheet {
    model: "H200",
    bf16: 989.0,
    fp8: 1979.0,
    fp4: None,
    hbm_gb: 141.0,
    hbm_tb_per_s: 4.8,
    nvlink_gen: 4,
    source: "NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 and FP8 3,958 TFLOPS \
             with sparsity (half dense), 141 GB HBM3e, 4.8 TB/s; NVLink 4, 900 GB/s",
};
const H100_SXM: Sheet = Sheet {
    model: "H100 SXM",
    bf16: 989.0,
    fp8: 1979.0,
    fp4: None,
    hbm_gb: 80.0,
    hbm_tb_per_s: 3.35,
    nvlink_gen: 4,
    source: "NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16 1,979 and FP8 3,958 TFLOPS \
             with sparsity (half dense), 80 GB HBM3, 3.35 TB/s; NVLink 4, 900 GB/s",
};

/// Dense (no 2:4 sparsity) tensor-core TFLOPS from NVIDIA's datasheets, matched by the
/// name `nvidia-smi` prints. Consumer cards: the FP32-accumulate figure, which is what
/// training uses. An NVLink moves 25 GB/s per direction on V100 (NVLink 2), A100 (NVLink 3)
/// and H100/H200 (NVLink 4), 50 GB/s on Blackwell (NVLink 5). Hopper and Blackwell entries
/// carry FP8 (and Blackwell FP4) peaks, HBM and NVLink generation, each with its source
/// ([`ModelSheet::source`]).
///
/// Each entry: the tokens that must all appear in the name (after upper-casing and
/// splitting at blanks, `-` and `_`), checked in this order, so that more specific entries
/// (H100 PCIe) come before general ones (H100).
pub const DATASHEETS: &[(&[&str], ModelSheet)] = &[
    (&["GB300"], full_sheet(GB300)),
    (&["B300"], full_sheet(B300)),
    (&["GB200"], full_sheet(GB200)),
    (&["B200"], full_sheet(B200)),
    (&["B100"], sheet("B100", Some(1750.0), 1750.0, 5, 50.0)),
    (&["GH200"], sheet("GH200", Some(989.0), 989.0, 5, 25.0)),
    (&["H200"], full_sheet(H200)),
    (
        &["H100", "PCIE"],
        sheet("H100 PCIe", Some(756.0), 756.0, 5, 25.0),
    ),
    (
        &["H100", "NVL"],
        sheet("H100 NVL", Some(835.0), 835.0, 5, 25.0),
    ),
    (&["H100"], full_sheet(H100_SXM)),
    (&["H800"], sheet("H800", Some(989.0), 989.0, 5, 25.0)),
    (&["H20"], sheet("H20", Some(148.0), 148.0, 5, 25.0)),
    (&["A100"], sheet("A100", Some(312.0), 312.0, 4, 25.0)),
    (&["A800"], sheet("A800", Some(312.0), 312.0, 4, 25.0)),
    (&["A30"], sheet("A30", Some(165.0), 165.0, 4, 25.0)),
    (&["A40"], sheet("A40", Some(149.7), 149.7, 4, 25.0)),
    (&["A10"], sheet("A10", Some(125.0), 125.0, 4, 0.0)),
    (&["L40S"], sheet("L40S", Some(362.05), 362.05, 4, 0.0)),
    (&["L40"], sheet("L40", Some(181.05), 181.05, 4, 0.0)),
    (&["L4"], sheet("L4", Some(121.0), 121.0, 4, 0.0)),
    (&["A6000"], sheet("RTX A6000", Some(154.8), 154.8, 4, 14.0)),
    (
        &["4090"],
        sheet("GeForce RTX 4090", Some(165.2), 165.2, 4, 0.0),
    ),
    (
        &["3090"],
        sheet("GeForce RTX 3090", Some(71.0), 71.0, 4, 14.0),
    ),
    (&["V100S"], sheet("V100S", None, 130.0, 3, 25.0)),
    (&["V100", "PCIE"], sheet("V100 PCIe", None, 112.0, 3, 25.0)),
    (&["V100"], sheet("V100 SXM2", None, 125.0, 3, 25.0)),
    (&["T4"], sheet("T4", None, 65.0, 3, 0.0)),
];

/// The datasheet of the model `nvidia-smi` calls `name`, if the table knows it.
pub fn datasheet_for(name: &str) -> Option<&'static ModelSheet> {
    let upper = name.to_ascii_uppercase();
    let tokens: Vec<&str> = upper
        .split(|c: char| c.is_whitespace() || c == '-' || c == '_')
        .filter(|t| !t.is_empty())
        .collect();
    DATASHEETS
        .iter()
        .find(|(need, _)| need.iter().all(|n| tokens.contains(n)))
        .map(|(_, s)| s)
}

/// The datasheet peak of the model `nvidia-smi` calls `name`, if the table knows it.
pub fn peak_for(name: &str) -> Option<PeakTflops> {
    datasheet_for(name).map(|s| s.peak)
}

/// PCIe x16 line rate in one direction, GB/s, by generation.
fn pcie_x16_gb_per_s(gen: u32) -> f64 {
    match gen {
        0..=3 => 15.75,
        4 => 31.5,
        _ => 63.0,
    }
}

/// Share of the datasheet rate a point-to-point copy attains, by link class. NVLink: about
/// 80 % (A100's 300 GB/s gives ~240). PCIe falls off with every bridge on the way and most
/// across the CPU sockets. Rough figures, marked `estimated`, used only until measured.
pub fn attained_share(class: LinkClass) -> f64 {
    match class {
        LinkClass::NvLink(_) => 0.8,
        LinkClass::Pix => 0.8,
        LinkClass::Pxb => 0.75,
        LinkClass::Phb => 0.7,
        LinkClass::Node => 0.6,
        LinkClass::Sys => 0.4,
    }
}

/// The bandwidth a link of `class` between two GPUs described by `sheet` typically attains
/// in one direction, GB/s.
pub fn estimated_link_gb_per_s(class: LinkClass, sheet: Option<&ModelSheet>) -> f64 {
    let (pcie_gen, nvlink) = sheet.map_or((4, 25.0), |s| (s.pcie_gen, s.nvlink_gb_per_s));
    let rate = match class {
        LinkClass::NvLink(links) => f64::from(links) * if nvlink > 0.0 { nvlink } else { 25.0 },
        _ => pcie_x16_gb_per_s(pcie_gen),
    };
    rate * attained_share(class)
}

/// What a node offers to the probe.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeDevices {
    /// The GPUs the job may use, in index order, and how they are wired.
    Gpus {
        gpus: Vec<GpuRecord>,
        topology: Option<Topology>,
    },
    /// No GPUs: processes on the CPUs stand in for them.
    Cpus {
        /// `MemTotal` of `/proc/meminfo`, bytes.
        memory_bytes: u64,
        /// Logical CPUs.
        cpus: u32,
        model: String,
    },
}

/// One node's inventory.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInventory {
    pub host: String,
    pub devices: NodeDevices,
    /// The node's RDMA ports (`/sys/class/infiniband`, see [`super::nics`]); empty on CPU
    /// nodes and where none are listed.
    pub rdma_ports: Vec<super::nics::RdmaPort>,
    /// The node's NVLink domain ([`parse_fabric`]); `None` on CPU nodes and where the
    /// NVLink ends at the node.
    pub nvlink_domain: Option<String>,
    /// Things worth telling the user (a topology that could not be read, ...).
    pub warnings: Vec<String>,
}

impl NodeInventory {
    /// Datasheet-based estimates of the bandwidth between this node's GPUs, from the
    /// topology classes (`NV#`, `PIX`, ... see [`estimated_link_gb_per_s`]), marked
    /// `estimated`: what a profile can carry before the probe measured the links. `None`
    /// for CPU nodes and when the topology is unknown or lacks one of the GPUs.
    pub fn estimated_gpu_links(&self) -> Option<LinkMatrix> {
        let NodeDevices::Gpus {
            gpus,
            topology: Some(topology),
        } = &self.devices
        else {
            return None;
        };
        let sheet = gpus.first().and_then(|g| datasheet_for(&g.name));
        let mut rows = vec![vec![0.0; gpus.len()]; gpus.len()];
        let mut classes: Vec<String> = Vec::new();
        for (i, a) in gpus.iter().enumerate() {
            for (j, b) in gpus.iter().enumerate() {
                if i == j {
                    continue;
                }
                let class = topology.class(a.index as usize, b.index as usize)?;
                rows[i][j] = estimated_link_gb_per_s(class, sheet);
                let name = class.as_string();
                if !classes.contains(&name) {
                    classes.push(name);
                }
            }
        }
        let note = format!(
            "from `nvidia-smi topo -m` ({}): datasheet link rate x typical attained share; \
             not measured",
            classes.join(", ")
        );
        LinkMatrix::from_rows(&rows, Provenance::new(Source::Estimated).with_note(note))
    }
}

/// Why a node's inventory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("{host}: {detail}")]
    Node { host: String, detail: String },
}

/// How to ask a node.
#[derive(Debug, Clone)]
pub struct InventoryRequest<'a> {
    pub transport: &'a Transport,
    pub nvidia_smi: &'a str,
    pub timeout: Duration,
}

/// Lists `host`'s GPUs (restricted to `slots`: the listed device indices, or the first
/// `n`), or its CPUs when it has none.
pub fn take_inventory(
    request: &InventoryRequest<'_>,
    host: &str,
    slots: &Slots,
) -> Result<NodeInventory, InventoryError> {
    let node_error = |detail: String| InventoryError::Node {
        host: host.to_owned(),
        detail,
    };
    let query = NodeCommand::new(request.nvidia_smi).args(GPU_QUERY_ARGS);
    let output = match exec::run(request.transport, host, &query, request.timeout) {
        Ok(output) => Some(output),
        Err(ExecError::Start { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            None
        }
        Err(e) => return Err(e.into()),
    };
    let gpus = match output {
        // Not installed there (the wrapper reports 127 for a missing program).
        None => None,
        Some(o) if o.status == Status::Exited(127) => None,
        // "No devices were found" is nvidia-smi's exit 6.
        Some(o) if o.status == Status::Exited(6) => None,
        Some(o) if !o.status.success() => {
            return Err(node_error(format!(
                "{} failed ({}): {} (check the NVIDIA driver there; a node whose GPUs cannot \
                 be listed cannot be profiled)",
                request.nvidia_smi,
                o.status,
                o.last_line().unwrap_or_default()
            )))
        }
        Some(o) => {
            let gpus = parse_gpu_query(&o.stdout_text())
                .map_err(|e| node_error(format!("cannot read nvidia-smi's GPU list: {e}")))?;
            (!gpus.is_empty()).then_some(gpus)
        }
    };
    let Some(gpus) = gpus else {
        return cpu_inventory(request, host);
    };
    let gpus = select_slots(gpus, slots).map_err(node_error)?;
    let mut warnings = Vec::new();
    let topo = NodeCommand::new(request.nvidia_smi).args(TOPOLOGY_ARGS);
    let topology = match exec::run(request.transport, host, &topo, request.timeout) {
        Ok(o) if o.status.success() => match parse_topology(&o.stdout_text()) {
            Ok(t) => Some(t),
            Err(e) => {
                warnings.push(format!("{host}: cannot read `nvidia-smi topo -m`: {e}"));
                None
            }
        },
        Ok(o) => {
            warnings.push(format!(
                "{host}: `nvidia-smi topo -m` failed ({}): {}",
                o.status,
                o.last_line().unwrap_or_default()
            ));
            None
        }
        Err(e) => return Err(e.into()),
    };
    let rdma_ports = rdma_ports(request, host, &mut warnings)?;
    // A failing `-q` only leaves the domain unknown: the node's NVLink ends at the node.
    let query = NodeCommand::new(request.nvidia_smi).args(QUERY_ALL_ARGS);
    let nvlink_domain = match exec::run(request.transport, host, &query, request.timeout) {
        Ok(o) if o.status.success() => parse_fabric(&o.stdout_text()),
        Ok(_) => None,
        Err(e) => return Err(e.into()),
    };
    Ok(NodeInventory {
        host: host.to_owned(),
        devices: NodeDevices::Gpus { gpus, topology },
        rdma_ports,
        nvlink_domain,
        warnings,
    })
}

/// The node's RDMA ports ([`super::nics::LISTING_SCRIPT`]); a listing that cannot be read
/// is a warning and no ports (the profile then keeps node links' one-NIC meaning).
fn rdma_ports(
    request: &InventoryRequest<'_>,
    host: &str,
    warnings: &mut Vec<String>,
) -> Result<Vec<super::nics::RdmaPort>, InventoryError> {
    let listing = NodeCommand::new("sh").args(["-c", super::nics::LISTING_SCRIPT, "sh", "/sys"]);
    match exec::run(request.transport, host, &listing, request.timeout) {
        Ok(o) if o.status.success() => match super::nics::parse_ports(&o.stdout_text()) {
            Ok(ports) => Ok(ports),
            Err(e) => {
                warnings.push(format!("{host}: cannot read /sys/class/infiniband: {e}"));
                Ok(Vec::new())
            }
        },
        Ok(o) => {
            warnings.push(format!(
                "{host}: listing /sys/class/infiniband failed ({}): {}",
                o.status,
                o.last_line().unwrap_or_default()
            ));
            Ok(Vec::new())
        }
        Err(e) => Err(e.into()),
    }
}

fn select_slots(gpus: Vec<GpuRecord>, slots: &Slots) -> Result<Vec<GpuRecord>, String> {
    match slots {
        Slots::Unknown => Ok(gpus),
        Slots::Count(n) => {
            let n = *n as usize;
            if n > gpus.len() {
                return Err(format!(
                    "the allocation gives {n} GPU slots but nvidia-smi lists {} GPUs (check the \
                     node list's slot count)",
                    gpus.len()
                ));
            }
            Ok(gpus.into_iter().take(n).collect())
        }
        Slots::Devices(devices) => devices
            .iter()
            .map(|d| {
                gpus.iter().find(|g| g.index == *d).cloned().ok_or_else(|| {
                    format!(
                        "GPU {d} is allocated but nvidia-smi does not list it (it lists {}; \
                         check --include or SLURM_JOB_GPUS)",
                        gpus.iter()
                            .map(|g| g.index.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
            })
            .collect(),
    }
}

fn cpu_inventory(
    request: &InventoryRequest<'_>,
    host: &str,
) -> Result<NodeInventory, InventoryError> {
    let command = NodeCommand::new("cat").args(["/proc/meminfo", "/proc/cpuinfo"]);
    let output = exec::run(request.transport, host, &command, request.timeout)?;
    let text = output.stdout_text();
    let parsed = parse_cpu_info(&text).filter(|_| output.status.success());
    let Some((memory_bytes, cpus, model)) = parsed else {
        return Err(InventoryError::Node {
            host: host.to_owned(),
            detail: format!(
                "no GPUs, and /proc/meminfo and /proc/cpuinfo could not be read ({}: {}); \
                 pipette-run profiles Linux nodes only",
                output.status,
                output.last_line().unwrap_or_default()
            ),
        });
    };
    Ok(NodeInventory {
        host: host.to_owned(),
        devices: NodeDevices::Cpus {
            memory_bytes,
            cpus,
            model,
        },
        rdma_ports: Vec::new(),
        nvlink_domain: None,
        warnings: Vec::new(),
    })
}

/// `MemTotal` (bytes), the number of `processor` entries and the first `model name` of
/// `/proc/meminfo` followed by `/proc/cpuinfo`.
pub fn parse_cpu_info(text: &str) -> Option<(u64, u32, String)> {
    let mut memory = None;
    let mut cpus = 0u32;
    let mut model = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "MemTotal" => {
                let kib: u64 = value.split_whitespace().next()?.parse().ok()?;
                memory = Some(kib * 1024);
            }
            "processor" => cpus += 1,
            "model name" if model.is_none() => model = Some(value.trim().to_owned()),
            _ => {}
        }
    }
    Some((
        memory.filter(|m| *m > 0)?,
        cpus.max(1),
        model.unwrap_or_else(|| "unknown CPU".into()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_without_header_in_our_column_order() {
        let gpus = parse_gpu_query(
            "0, NVIDIA A100-SXM4-80GB, 81920, 00000000:07:00.0\n\n1, NVIDIA A100-SXM4-80GB, 81920, 00000000:0F:00.0\n",
        )
        .unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[1].index, 1);
        assert_eq!(gpus[0].memory_bytes, 81920 << 20);
        assert_eq!(gpus[0].pci_bus_id.as_deref(), Some("00000000:07:00.0"));
    }

    #[test]
    fn query_errors_name_the_line() {
        let err = parse_gpu_query("0, A100, 81920, x\nzero, A100, 1, x\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 2: no GPU index: \"zero, A100, 1, x\""
        );
        let err = parse_gpu_query("0, A100, [N/A], x\n").unwrap_err();
        assert!(err.to_string().contains("no memory size"), "{err}");
        let err = parse_gpu_query("0, A, 1\n0, A, 1\n").unwrap_err();
        assert!(err.to_string().contains("listed twice"), "{err}");
    }

    #[test]
    fn models_match_specific_entries_first() {
        let peak = |n: &str| peak_for(n).map(|p| (p.bf16, p.fp16));
        assert_eq!(peak("NVIDIA A100-SXM4-80GB"), Some((Some(312.0), 312.0)));
        assert_eq!(peak("NVIDIA A100 80GB PCIe"), Some((Some(312.0), 312.0)));
        assert_eq!(peak("NVIDIA H100 80GB HBM3"), Some((Some(989.0), 989.0)));
        assert_eq!(peak("NVIDIA H100 PCIe"), Some((Some(756.0), 756.0)));
        assert_eq!(peak("NVIDIA H100 NVL"), Some((Some(835.0), 835.0)));
        assert_eq!(peak("NVIDIA H200"), Some((Some(989.0), 989.0)));
        assert_eq!(peak("Tesla V100-SXM2-32GB"), Some((None, 125.0)));
        assert_eq!(peak("Tesla V100-PCIE-16GB"), Some((None, 112.0)));
        assert_eq!(peak("Tesla V100S-PCIE-32GB"), Some((None, 130.0)));
        assert_eq!(peak("NVIDIA A10"), Some((Some(125.0), 125.0)));
        assert_eq!(peak("NVIDIA L40S"), Some((Some(362.05), 362.05)));
        assert_eq!(peak("NVIDIA L4"), Some((Some(121.0), 121.0)));
        assert_eq!(peak("Tesla T4"), Some((None, 65.0)));
        assert_eq!(peak("NVIDIA A10G"), None, "not on a public datasheet");
        assert_eq!(peak("cpu"), None);
    }

    #[test]
    fn hopper_and_blackwell_sheets_carry_low_precision_hbm_and_nvlink() {
        let sheet = |n: &str| datasheet_for(n).unwrap();
        let row = |n: &str| {
            let s = sheet(n);
            (
                s.model,
                s.peak.bf16,
                s.peak.fp8,
                s.peak.fp4,
                s.hbm_gb,
                s.nvlink_gen,
            )
        };
        assert_eq!(
            row("NVIDIA H100 80GB HBM3"),
            ("H100 SXM", Some(989.0), Some(1979.0), None, Some(80.0), 4)
        );
        assert_eq!(
            row("NVIDIA H200"),
            ("H200", Some(989.0), Some(1979.0), None, Some(141.0), 4)
        );
        assert_eq!(
            row("NVIDIA B200"),
            (
                "B200",
                Some(2250.0),
                Some(4500.0),
                Some(9000.0),
                Some(180.0),
                5
            )
        );
        assert_eq!(row("NVIDIA GB200").0, "GB200");
        assert_eq!(row("NVIDIA B300 SXM6 AC").0, "B300");
        assert_eq!(
            row("NVIDIA GB300"),
            (
                "GB300",
                Some(2500.0),
                Some(5000.0),
                Some(15278.0),
                Some(288.0),
                5
            )
        );
        assert_eq!(sheet("NVIDIA GB200").hbm_gb_per_s, Some(8000.0));
        assert_eq!(sheet("NVIDIA GB200").nvlink_gb_per_s, 50.0);
        for (_, s) in DATASHEETS.iter().filter(|(_, s)| s.nvlink_gen > 0) {
            assert!(s.source.contains("NVLink"), "{}: {}", s.model, s.source);
            assert!(
                s.peak.fp8.is_some() && s.hbm_gb_per_s.is_some(),
                "{}",
                s.model
            );
        }
        assert_eq!(sheet("NVIDIA A100-SXM4-80GB").peak.fp8, None);
    }

    #[test]
    fn link_estimates_follow_the_class() {
        let a100 = datasheet_for("NVIDIA A100-SXM4-80GB");
        assert_eq!(estimated_link_gb_per_s(LinkClass::NvLink(12), a100), 240.0);
        let v100 = datasheet_for("Tesla V100-SXM2-32GB");
        assert_eq!(estimated_link_gb_per_s(LinkClass::NvLink(2), v100), 40.0);
        assert_eq!(estimated_link_gb_per_s(LinkClass::Sys, v100), 15.75 * 0.4);
        assert!(
            estimated_link_gb_per_s(LinkClass::Pix, a100)
                > estimated_link_gb_per_s(LinkClass::Node, a100)
        );
    }

    #[test]
    fn topology_errors_say_what_is_missing() {
        assert!(parse_topology("hello\n")
            .unwrap_err()
            .to_string()
            .contains("no header row"));
        let err = parse_topology("\tGPU0\tGPU1\nGPU0\t X \tNV4\n").unwrap_err();
        assert_eq!(err.to_string(), "no row for GPU1");
        let err = parse_topology("\tGPU0\tGPU1\nGPU0\t X \tFAST\nGPU1\tNV4\t X \n").unwrap_err();
        assert!(err.to_string().contains("\"FAST\""), "{err}");
        let one = parse_topology("\tGPU0\tCPU Affinity\nGPU0\t X \t0-7\n").unwrap();
        assert_eq!(one.gpu_count(), 1);
        assert_eq!(one.class(0, 0), None);
    }

    #[test]
    fn cpu_info_reads_memory_and_cores() {
        let text = "MemTotal:       24684084 kB\nMemFree: 1 kB\nprocessor\t: 0\nmodel name\t: Intel(R) Xeon(R)\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R)\n";
        assert_eq!(
            parse_cpu_info(text),
            Some((24684084 * 1024, 2, "Intel(R) Xeon(R)".into()))
        );
        assert_eq!(parse_cpu_info("nothing"), None);
    }
}
