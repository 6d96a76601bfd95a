//! Published performance figures per GPU kind, shipped as data (`data/perf/*.json`, embedded
//! at build time): matrix-multiply efficiency by shape and layout, HBM bandwidth and the fixed
//! cost of a memory-bound kernel, and collective latencies. Every file names its source and
//! licence next to its figures; nothing here is invented or fitted (fitting is the
//! [`Calibration`](crate::model::Calibration)'s job, as scales on these figures).
//!
//! - **A100**: SimuMax's 183 measured bf16 GEMM efficiencies (A100 PCIe, by shape and layout),
//!   its HBM figure and per-kernel cost, and its collective latencies (Apache-2.0); the
//!   all-reduce latency by group size (2–8 GPUs) from vTrain's NCCL measurements on A100
//!   SXM nodes (MIT).
//! - **H100**: 72 measured bf16 GEMM throughputs from XLA's matmul interpolator table
//!   (sm_90, Apache-2.0), as efficiencies of the 989.4 TFLOPS datasheet peak; HBM 3.35 TB/s
//!   (datasheet); kernel and collective costs carried over from the A100 file.
//! - **V100** and any other GPU: no published shape table is shipped, so the A100's
//!   efficiencies stand in (the estimate's notes say so); HBM 900 GB/s for the V100
//!   (datasheet), the A100's figure otherwise.
//!
//! A shape outside a table is interpolated ([`PerfTable::gemm_efficiency`]: inverse-distance
//! weighting of the four nearest measured shapes of the same layout in log₂(m, n, k) space);
//! the caller records that it happened, and the estimate's notes say so.
//!
//! **Measured tables.** A cluster profile whose sweep ran ([`MeasuredPerf`]: GEMMs at the
//! planned model's shapes, attention, a large copy, collectives) has a table of its own for
//! each kind of GPU it measured, and [`PerfTables::for_cluster`] prefers it to the shipped
//! one: the GEMM and attention efficiencies are the measured throughputs as shares of the
//! GPU's peak (interpolated between measured shapes exactly as the shipped points are),
//! the memory bandwidth is the measured copy's, the all-reduce latency by group size the
//! intercept of the measured times over message size. What the sweep did not measure (the
//! fixed cost of a memory-bound kernel, the other collectives' ratios to the all-reduce)
//! stays the shipped table's. The trial's calibration scales either alike.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use serde::Deserialize;

use crate::cluster::profile::{Dtype, GemmLayout, MeasuredPerf};
use crate::cluster::ClusterProfile;

/// The GPU families with their own figures. The time model precomputes every stage for each
/// kind, so the planner never recomputes per placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuKind {
    A100,
    H100,
    V100,
    /// Anything else: the A100's efficiencies stand in.
    Other,
    /// B100, B200, GB200, B300, GB300: no published Blackwell GEMM table, so the H100's
    /// efficiencies stand in (the estimate's notes say so), with Blackwell's HBM.
    Blackwell,
}

impl GpuKind {
    /// Every kind, in index order.
    pub const ALL: [GpuKind; 5] = [
        GpuKind::A100,
        GpuKind::H100,
        GpuKind::V100,
        GpuKind::Other,
        GpuKind::Blackwell,
    ];

    /// The kind of a GPU by its name as nvidia-smi prints it (`NVIDIA A100-SXM4-80GB`,
    /// `H100 80GB HBM3`, `Tesla V100-SXM2-32GB`). H200 and GH200 count as H100 (same
    /// tensor cores).
    pub fn of(name: &str) -> GpuKind {
        let upper = name.to_ascii_uppercase();
        if ["B100", "B200", "B300"].iter().any(|b| upper.contains(b)) {
            GpuKind::Blackwell
        } else if upper.contains("H100") || upper.contains("H200") || upper.contains("H800") {
            GpuKind::H100
        } else if upper.contains("A100") || upper.contains("A800") {
            GpuKind::A100
        } else if upper.contains("V100") {
            GpuKind::V100
        } else {
            GpuKind::Other
        }
    }

    /// Position in [`GpuKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GpuKind::A100 => "A100",
            GpuKind::H100 => "H100",
            GpuKind::V100 => "V100",
            GpuKind::Other => "other GPU",
            GpuKind::Blackwell => "Blackwell",
        }
    }

    /// How many times faster a linear layer's GEMMs run in `bits` than in BF16 on this
    /// kind, at any shape: the ratio of the best-shape FP8 and BF16 matmul throughputs
    /// measured by brute-force shape search (MAMF, "maximum achievable matmul FLOPS",
    /// torch `matmul`, stas00/ml-engineering `compute/accelerator/README.md`, CC-BY-SA-4.0,
    /// as transcribed in the MoE/CP/FP8 development set's `gemm_fp8_vs_bf16_microbenchmarks`):
    /// H100 SXM 1,402.6 / 794.5 = 1.765 (H200 and GH200 count as H100); B200 3,432.5 /
    /// 1,745.0 = 1.967 (GB200 1.984 and B300 1.896 are within 4 %: B200's stands for the
    /// kind). FP4 has no published MAMF: it is taken to reach the share of its datasheet
    /// peak that FP8 reaches, i.e. FP8's ratio times the datasheet FP4/FP8 ratio (2 on
    /// B200). `None`: no tensor cores for it (A100, V100; Megatron's Transformer Engine
    /// refuses FP8 there).
    pub fn low_precision_speedup(self, bits: crate::config::LowBits) -> Option<f64> {
        const H100_FP8: f64 = 1402.6 / 794.5;
        const BLACKWELL_FP8: f64 = 3432.5 / 1745.0;
        const B200_FP4_OVER_FP8: f64 = 9000.0 / 4500.0;
        match (self, bits) {
            (GpuKind::H100, crate::config::LowBits::Fp8) => Some(H100_FP8),
            (GpuKind::Blackwell, crate::config::LowBits::Fp8) => Some(BLACKWELL_FP8),
            (GpuKind::Blackwell, crate::config::LowBits::Fp4) => {
                Some(BLACKWELL_FP8 * B200_FP4_OVER_FP8)
            }
            _ => None,
        }
    }
}

/// Which of a linear layer's three GEMMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// `y = x·Wᵀ` (cuBLAS TN).
    Fwd,
    /// `dx = dy·W` (NN).
    Dgrad,
    /// `dW = dyᵀ·x`, accumulated in fp32 (NT).
    Wgrad,
    /// A table without layouts: its points serve all three.
    Any,
}

/// Collective latencies of one group, microseconds.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct CollectiveLatency {
    pub all_reduce: f64,
    pub all_gather: f64,
    pub reduce_scatter: f64,
    pub p2p: f64,
}

/// One measured GEMM: m × n × k and the attained share of the peak.
#[derive(Debug, Clone, Copy, Deserialize)]
struct Point(u64, u64, u64, Layout, f64);

#[derive(Debug, Deserialize)]
struct PerfFile {
    peak_tflops: f64,
    hbm_gb_per_s: f64,
    hbm_efficiency: f64,
    memory_kernel_us: f64,
    collective_latency_us: CollectiveLatency,
    /// Measured all-reduce latency by group size: (GPUs, µs), ascending.
    #[serde(default)]
    all_reduce_latency_us_by_group: Vec<(usize, f64)>,
    points: Vec<Point>,
}

/// One kind's figures, ready for lookups.
#[derive(Debug)]
pub struct PerfTable {
    pub kind: GpuKind,
    /// The dense peak the efficiencies are shares of.
    pub peak_tflops: f64,
    /// Attained HBM bandwidth, GB/s (bandwidth × efficiency).
    pub hbm_gb_per_s: f64,
    /// Fixed cost of one memory-bound kernel, µs.
    pub memory_kernel_us: f64,
    /// Latency of a collective over 8 GPUs, µs.
    pub collective_latency_us: CollectiveLatency,
    /// Measured all-reduce latency by group size (GPUs, µs), ascending; empty when the
    /// file has none.
    all_reduce_by_group: Vec<(usize, f64)>,
    /// The best efficiency in the table (a measured best-shape throughput maps to it).
    pub best_efficiency: f64,
    /// Measured points: log₂ m, log₂ n, log₂ k, layout, efficiency.
    points: Vec<([f64; 3], Layout, f64)>,
    /// Per dimension, the smallest and largest log₂ in the table.
    range: [(f64, f64); 3],
    /// The table is another kind's stand-in.
    pub borrowed: bool,
    /// Measured attention points: log₂ (heads, sequence, head width), efficiency; empty:
    /// attention is priced as a GEMM of its shape.
    attention: Vec<([f64; 3], f64)>,
    /// Where a measured table came from, for the estimate's notes; `None`: shipped.
    pub measured: Option<String>,
    /// Tells tables apart in the lookup cache (shipped: the kind's index).
    id: u64,
}

/// A looked-up shape: table, m, n, k (as bits), layout.
type ShapeKey = (u64, u64, u64, u64, u8);

/// A multiply-rotate hash of a [`ShapeKey`]'s words (Firefox's `FxHasher` step): the GEMM
/// memo is looked up several hundred times per configuration priced, and std's SipHash cost
/// more than the rest of the look-up. Keys are the planner's own shapes, not input an
/// attacker chooses, so a hash without a secret seed does; only look-ups and inserts, never
/// iteration order, so the plan does not depend on it.
#[derive(Default)]
struct ShapeHasher(u64);

impl Hasher for ShapeHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // The product's high bits are its best mixed; the table indexes by the low ones.
        self.0.rotate_left(26)
    }
}

/// The table of every GPU kind a time estimate uses: the shipped ones, or those a cluster
/// profile's sweep measured where it has them.
#[derive(Debug, Clone)]
pub struct PerfTables {
    tables: [Arc<PerfTable>; 5],
}

impl PerfTables {
    /// The shipped tables (`data/perf`).
    pub fn shipped() -> &'static PerfTables {
        static SHIPPED: OnceLock<PerfTables> = OnceLock::new();
        SHIPPED.get_or_init(|| PerfTables {
            tables: shipped_tables().clone(),
        })
    }

    /// The tables for `cluster` training in `dtype`: for each GPU kind, the profile's
    /// measured table when its sweep measured a GPU of that kind in that dtype (the first
    /// such section), else the shipped one. A measured table's efficiencies are shares of
    /// the GPU's rate in that dtype ([`super::fabric::matmul_peak`]: in fp32, its measured
    /// fp32 figure where it has one).
    pub fn for_cluster(cluster: &ClusterProfile, dtype: Dtype) -> PerfTables {
        let mut tables = shipped_tables().clone();
        for perf in &cluster.measured_perf {
            if perf.dtype != dtype {
                continue;
            }
            let kind = GpuKind::of(&perf.gpu);
            if tables[kind.index()].measured.is_some() {
                continue;
            }
            let peak = cluster
                .nodes
                .iter()
                .filter_map(|n| n.gpus())
                .flatten()
                .find(|g| g.name == perf.gpu)
                .and_then(|g| super::fabric::matmul_peak(g, perf.dtype));
            if let Some(table) = peak.and_then(|p| PerfTable::measured(kind, perf, p)) {
                tables[kind.index()] = Arc::new(table);
            }
        }
        PerfTables { tables }
    }

    /// The table of `kind`.
    pub fn get(&self, kind: GpuKind) -> &PerfTable {
        &self.tables[kind.index()]
    }
}

fn shipped_tables() -> &'static [Arc<PerfTable>; 5] {
    static TABLES: OnceLock<[Arc<PerfTable>; 5]> = OnceLock::new();
    TABLES.get_or_init(|| {
        let a100 = parse(A100_JSON);
        let h100 = parse(H100_JSON);
        [
            Arc::new(PerfTable::new(GpuKind::A100, &a100, None, false)),
            Arc::new(PerfTable::new(GpuKind::H100, &h100, None, false)),
            Arc::new(PerfTable::new(
                GpuKind::V100,
                &a100,
                Some((V100_PEAK_TFLOPS, V100_HBM_GB_PER_S)),
                true,
            )),
            Arc::new(PerfTable::new(GpuKind::Other, &a100, None, true)),
            Arc::new(PerfTable::new(
                GpuKind::Blackwell,
                &h100,
                Some((B200_PEAK_TFLOPS, B200_HBM_GB_PER_S)),
                true,
            )),
        ]
    })
}

/// A GEMM's efficiency and whether the shape was measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Efficiency {
    pub value: f64,
    /// The shape lies between measured ones (not one of them).
    pub interpolated: bool,
    /// Some dimension lies outside the measured range (the nearest shapes govern).
    pub extrapolated: bool,
}

const A100_JSON: &str = include_str!("../../../data/perf/a100.json");
const H100_JSON: &str = include_str!("../../../data/perf/h100.json");

/// B200 HBM3e: 8 TB/s (DGX B200, NVIDIA DGX BasePOD reference architecture; see
/// `measure::inventory`'s B200 sheet).
const B200_HBM_GB_PER_S: f64 = 8000.0;
/// B200 dense BF16 tensor peak: 2,250 TFLOPS (HGX B200 datasheet, dense).
const B200_PEAK_TFLOPS: f64 = 2250.0;
/// V100 HBM2: 900 GB/s (NVIDIA V100 datasheet).
const V100_HBM_GB_PER_S: f64 = 900.0;
/// V100 dense fp16 tensor peak: 125 TFLOPS (NVIDIA V100 SXM2 datasheet).
const V100_PEAK_TFLOPS: f64 = 125.0;

impl PerfTable {
    /// The shipped table for `kind` (parsed once).
    pub fn get(kind: GpuKind) -> &'static PerfTable {
        &shipped_tables()[kind.index()]
    }

    /// The table `perf` measured on a GPU of `kind` whose peak in `perf.dtype` is `peak`
    /// TFLOPS: efficiencies are the measured throughputs' shares of it. `None` without a
    /// measured GEMM (nothing to price matrix multiplies with).
    pub fn measured(kind: GpuKind, perf: &MeasuredPerf, peak: f64) -> Option<PerfTable> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(GpuKind::ALL.len() as u64);
        if perf.gemms.is_empty() || !(peak.is_finite() && peak > 0.0) {
            return None;
        }
        let shipped = PerfTable::get(kind);
        let log2 = |x: u64| (x.max(1) as f64).log2();
        let points: Vec<([f64; 3], Layout, f64)> = perf
            .gemms
            .iter()
            .map(|g| {
                let layout = match g.layout {
                    GemmLayout::Fwd => Layout::Fwd,
                    GemmLayout::Dgrad => Layout::Dgrad,
                    GemmLayout::Wgrad => Layout::Wgrad,
                };
                ([log2(g.m), log2(g.n), log2(g.k)], layout, g.tflops / peak)
            })
            .collect();
        let attention = perf
            .attention
            .iter()
            .map(|a| {
                (
                    [log2(a.batch_heads), log2(a.seq), log2(a.head_dim)],
                    a.tflops / peak,
                )
            })
            .collect();
        let mut by_group: Vec<(usize, f64)> = perf
            .collectives
            .iter()
            .map(|c| c.ranks)
            .filter(|&r| r >= 2)
            .collect::<std::collections::BTreeSet<u32>>()
            .into_iter()
            .filter_map(|r| Some((r as usize, perf.all_reduce_latency_us(r)?)))
            .collect();
        by_group.sort_by_key(|e| e.0);
        let source = format!(
            "the profile's sweep on {} ({} GEMM shape(s), {} attention shape(s){}{}; measured{}{})",
            perf.gpu,
            points.len(),
            perf.attention.len(),
            if perf.hbm_gb_per_s.is_some() {
                ", memory bandwidth"
            } else {
                ""
            },
            if by_group.is_empty() {
                ""
            } else {
                ", all-reduce latency"
            },
            perf.provenance
                .tool
                .as_deref()
                .map_or(String::new(), |t| format!(" by {t}")),
            perf.provenance
                .date
                .as_deref()
                .map_or(String::new(), |d| format!(" on {d}"))
        );
        let mut table = PerfTable {
            kind,
            peak_tflops: peak,
            hbm_gb_per_s: perf.hbm_gb_per_s.unwrap_or(shipped.hbm_gb_per_s),
            memory_kernel_us: shipped.memory_kernel_us,
            collective_latency_us: shipped.collective_latency_us,
            all_reduce_by_group: if by_group.is_empty() {
                shipped.all_reduce_by_group.clone()
            } else {
                by_group
            },
            best_efficiency: points.iter().map(|p| p.2).fold(0.0, f64::max),
            range: ranges(&points),
            points,
            borrowed: false,
            attention,
            measured: Some(source),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        };
        // A group measured at 8 sets the 8-GPU figure the other collectives scale by.
        if let Some(&(_, eight)) = table.all_reduce_by_group.iter().find(|e| e.0 == 8) {
            let l = table.collective_latency_us;
            table.collective_latency_us = CollectiveLatency {
                all_reduce: eight,
                all_gather: eight * l.all_gather / l.all_reduce,
                reduce_scatter: eight * l.reduce_scatter / l.all_reduce,
                p2p: l.p2p,
            };
        }
        Some(table)
    }

    /// The efficiency of the attention core of `heads` heads of `s` tokens, `d` wide: from
    /// the measured attention points when the table has them, else as the GEMM
    /// `heads·s × s × d` (how the shipped tables price it).
    pub fn attention_efficiency(&self, heads: f64, s: f64, d: f64) -> Efficiency {
        if self.attention.is_empty() {
            return self.gemm_efficiency(heads * s, s, d, Layout::Fwd);
        }
        let x = [heads.max(1.0).log2(), s.max(1.0).log2(), d.max(1.0).log2()];
        nearest_mean(self.attention.iter().map(|(p, e)| (*p, *e)), x, None)
    }

    fn new(kind: GpuKind, file: &PerfFile, own: Option<(f64, f64)>, borrowed: bool) -> Self {
        let (peak, hbm) = own.unwrap_or((file.peak_tflops, file.hbm_gb_per_s));
        let points: Vec<([f64; 3], Layout, f64)> = file
            .points
            .iter()
            .map(|p| {
                (
                    [
                        (p.0 as f64).log2(),
                        (p.1 as f64).log2(),
                        (p.2 as f64).log2(),
                    ],
                    p.3,
                    p.4,
                )
            })
            .collect();
        let range = ranges(&points);
        PerfTable {
            kind,
            peak_tflops: peak,
            hbm_gb_per_s: hbm * file.hbm_efficiency,
            memory_kernel_us: file.memory_kernel_us,
            collective_latency_us: file.collective_latency_us,
            all_reduce_by_group: file.all_reduce_latency_us_by_group.clone(),
            best_efficiency: points.iter().map(|p| p.2).fold(0.0, f64::max),
            points,
            range,
            borrowed,
            attention: Vec::new(),
            measured: None,
            id: kind.index() as u64,
        }
    }

    /// The largest group whose collective latency the table measured, GPUs (8 when the
    /// file has no by-group table: its figures are for 8 GPUs).
    pub fn largest_measured_group(&self) -> usize {
        self.all_reduce_by_group.last().map_or(8, |e| e.0)
    }

    /// The latencies of collectives over a group of `n` GPUs, µs (0 for one GPU). The
    /// all-reduce's is the measured figure for that group size; beyond the largest measured
    /// group (a ring across nodes) it grows with the ring's steps, `(n − 1)/(N − 1)` of the
    /// largest one's; a file without the table scales its 8-GPU figure the same way. The
    /// all-gather and reduce-scatter keep their ratio to the all-reduce at 8 GPUs;
    /// point-to-point is the file's.
    pub fn collective_latency(&self, n: usize) -> CollectiveLatency {
        let l = self.collective_latency_us;
        if n < 2 {
            return CollectiveLatency {
                all_reduce: 0.0,
                all_gather: 0.0,
                reduce_scatter: 0.0,
                p2p: l.p2p,
            };
        }
        let steps = |from: (usize, f64)| from.1 * (n - 1) as f64 / (from.0 - 1) as f64;
        let all_reduce = match self.all_reduce_by_group.iter().find(|e| e.0 == n) {
            Some(e) => e.1,
            None => match self.all_reduce_by_group.last() {
                Some(&largest) if n > largest.0 => steps(largest),
                // Between measured sizes: the next larger one's figure, scaled down.
                _ => match self.all_reduce_by_group.iter().find(|e| e.0 > n) {
                    Some(&above) => steps(above),
                    None => steps((8, l.all_reduce)),
                },
            },
        };
        CollectiveLatency {
            all_reduce,
            all_gather: all_reduce * l.all_gather / l.all_reduce,
            reduce_scatter: all_reduce * l.reduce_scatter / l.all_reduce,
            p2p: l.p2p,
        }
    }

    /// The efficiency of an `m × n × k` GEMM (FLOPs 2·m·n·k) in `layout`: the measured
    /// figure for a measured shape, else the inverse-square-distance mean of the four
    /// nearest measured shapes of that layout in log₂ space.
    pub fn gemm_efficiency(&self, m: f64, n: f64, k: f64, layout: Layout) -> Efficiency {
        // The planner prices thousands of configurations that share a few hundred GEMM
        // shapes: each thread remembers the shapes it has looked up (the same value either
        // way, so the plan does not depend on the threads).
        thread_local! {
            static SEEN: RefCell<HashMap<ShapeKey, Efficiency, BuildHasherDefault<ShapeHasher>>> =
                RefCell::new(HashMap::default());
        }
        let key = (self.id, m.to_bits(), n.to_bits(), k.to_bits(), layout as u8);
        if let Some(e) = SEEN.with(|seen| seen.borrow().get(&key).copied()) {
            return e;
        }
        let e = self.interpolate(m, n, k, layout);
        SEEN.with(|seen| {
            let mut seen = seen.borrow_mut();
            if seen.len() >= 1 << 16 {
                seen.clear();
            }
            seen.insert(key, e);
        });
        e
    }

    fn interpolate(&self, m: f64, n: f64, k: f64, layout: Layout) -> Efficiency {
        let x = [m.max(1.0).log2(), n.max(1.0).log2(), k.max(1.0).log2()];
        let points = self
            .points
            .iter()
            .filter(|(_, l, _)| *l == layout || *l == Layout::Any)
            .map(|(p, _, e)| (*p, *e));
        nearest_mean(points, x, Some(&self.range))
    }
}

/// Per dimension, the smallest and largest log₂ among `points`.
fn ranges(points: &[([f64; 3], Layout, f64)]) -> [(f64, f64); 3] {
    let mut range = [(f64::INFINITY, f64::NEG_INFINITY); 3];
    for (x, _, _) in points {
        for d in 0..3 {
            range[d].0 = range[d].0.min(x[d]);
            range[d].1 = range[d].1.max(x[d]);
        }
    }
    range
}

/// The value at `x` among `points` (log₂ coordinates, value): a point's own value when `x`
/// is one, else the inverse-square-distance mean of the four nearest. `range` (when given)
/// tells whether `x` lies outside the points; without it, `x` outside every point's
/// coordinates counts as outside.
fn nearest_mean(
    points: impl Iterator<Item = ([f64; 3], f64)>,
    x: [f64; 3],
    range: Option<&[(f64, f64); 3]>,
) -> Efficiency {
    let mut nearest = [(f64::INFINITY, 0.0f64); 4];
    let mut own_range = [(f64::INFINITY, f64::NEG_INFINITY); 3];
    for (p, e) in points {
        for d in 0..3 {
            own_range[d].0 = own_range[d].0.min(p[d]);
            own_range[d].1 = own_range[d].1.max(p[d]);
        }
        let d2 = (0..3).map(|d| (p[d] - x[d]).powi(2)).sum::<f64>();
        if d2 < nearest[3].0 {
            nearest[3] = (d2, e);
            nearest.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
    }
    let range = range.unwrap_or(&own_range);
    let extrapolated = (0..3).any(|d| x[d] < range[d].0 || x[d] > range[d].1);
    if nearest[0].0 == 0.0 {
        return Efficiency {
            value: nearest[0].1,
            interpolated: false,
            extrapolated: false,
        };
    }
    let (mut sum, mut weight) = (0.0, 0.0);
    for (d2, e) in nearest.iter().filter(|n| n.0.is_finite()) {
        sum += e / d2;
        weight += 1.0 / d2;
    }
    Efficiency {
        value: sum / weight,
        interpolated: true,
        extrapolated,
    }
}

fn parse(text: &str) -> PerfFile {
    // The files are part of the build; `tests` below parse every one of them.
    serde_json::from_str(text).expect("data/perf tables are valid (checked by the tests)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_by_name() {
        assert_eq!(GpuKind::of("NVIDIA A100-SXM4-80GB"), GpuKind::A100);
        assert_eq!(GpuKind::of("NVIDIA H100 80GB HBM3"), GpuKind::H100);
        assert_eq!(GpuKind::of("Tesla V100-SXM2-32GB"), GpuKind::V100);
        assert_eq!(GpuKind::of("NVIDIA L40S"), GpuKind::Other);
    }

    #[test]
    fn measured_shapes_read_back_and_others_lie_between() {
        let a100 = PerfTable::get(GpuKind::A100);
        // SimuMax a100_pcie.json: "b=1, m=4096, k=4096, n=4096, layout=TN" 0.721422...
        let e = a100.gemm_efficiency(4096.0, 4096.0, 4096.0, Layout::Fwd);
        assert_eq!(e.value, 0.7214);
        assert!(!e.interpolated);
        let thin = a100.gemm_efficiency(4096.0, 384.0, 3072.0, Layout::Fwd);
        assert!(thin.interpolated && thin.extrapolated);
        let all: Vec<f64> = a100.points.iter().map(|p| p.2).collect();
        let lo = all.iter().copied().fold(1.0, f64::min);
        assert!(thin.value >= lo && thin.value <= a100.best_efficiency);
        // XLA sm_90: b=1 m=n=k=4096, 783328793548203 FLOPS of 989.4 TFLOPS.
        let h100 = PerfTable::get(GpuKind::H100);
        let e = h100.gemm_efficiency(4096.0, 4096.0, 4096.0, Layout::Wgrad);
        assert_eq!(e.value, 0.7917);
        assert!(PerfTable::get(GpuKind::V100).borrowed);
    }

    #[test]
    fn collective_latency_by_group_size() {
        let a100 = PerfTable::get(GpuKind::A100);
        // vTrain's measured 2- and 8-GPU all-reduces (data/perf/a100.json).
        assert_eq!(a100.collective_latency(2).all_reduce, 40.0);
        assert_eq!(a100.collective_latency(8).all_reduce, 83.3);
        assert_eq!(a100.collective_latency(1).all_reduce, 0.0);
        // A ring of 16 has 15 steps to the 8-ring's 7.
        let sixteen = a100.collective_latency(16);
        assert!((sixteen.all_reduce - 83.3 * 15.0 / 7.0).abs() < 1e-9);
        let eight = a100.collective_latency_us;
        let ratio = eight.reduce_scatter / eight.all_reduce;
        assert!((sixteen.reduce_scatter / sixteen.all_reduce - ratio).abs() < 1e-12);
        assert_eq!(PerfTable::get(GpuKind::V100).peak_tflops, 125.0);
    }

    #[test]
    fn a_profiles_measured_table_replaces_the_shipped_one_of_its_kind_only() {
        use crate::cluster::profile::tests::{swept, two_nodes};
        let mut cluster = two_nodes();
        cluster.measured_perf.push(swept("A100-SXM4-80GB"));
        let tables = PerfTables::for_cluster(&cluster, Dtype::Bf16);
        let a100 = tables.get(GpuKind::A100);
        let source = a100
            .measured
            .as_deref()
            .expect("the A100's table is measured");
        assert!(
            source.starts_with("the profile's sweep on A100-SXM4-80GB (3 GEMM shape(s)"),
            "{source}"
        );
        // A measured shape reads back as its share of the 312 TFLOPS peak; another
        // lies between the measured ones.
        let e = a100.gemm_efficiency(128.0, 256.0, 128.0, Layout::Dgrad);
        assert_eq!(e.value, 140.0 / 312.0);
        assert!(!e.interpolated);
        let between = a100.gemm_efficiency(256.0, 256.0, 128.0, Layout::Wgrad);
        assert!(between.interpolated);
        assert_eq!(
            between.value,
            200.0 / 312.0,
            "one wgrad point governs alone"
        );
        assert_eq!(a100.best_efficiency, 200.0 / 312.0);
        assert_eq!(a100.hbm_gb_per_s, 1500.0);
        // Attention by its own points, not as a GEMM.
        let att = a100.attention_efficiency(8.0, 1024.0, 128.0);
        assert_eq!(att.value, 100.0 / 312.0);
        // The all-reduce's latency at 2 GPUs is the intercept; beyond, the ring's steps.
        assert!((a100.collective_latency(2).all_reduce - 20.0).abs() < 1e-9);
        assert!((a100.collective_latency(4).all_reduce - 60.0).abs() < 1e-9);
        // The fixed cost per kernel was not measured: the shipped one stays.
        let shipped = PerfTable::get(GpuKind::A100);
        assert_eq!(a100.memory_kernel_us, shipped.memory_kernel_us);
        // Other kinds, and another dtype, keep the shipped tables.
        assert!(tables.get(GpuKind::H100).measured.is_none());
        let fp16 = PerfTables::for_cluster(&cluster, Dtype::Fp16);
        assert!(fp16.get(GpuKind::A100).measured.is_none());
        assert!(PerfTables::for_cluster(&cluster, Dtype::Fp32)
            .get(GpuKind::A100)
            .measured
            .is_none());
        // A section for a GPU the profile does not have has no peak to measure against.
        let mut stray = two_nodes();
        stray.measured_perf.push(swept("NVIDIA A100-PCIE-40GB"));
        assert!(PerfTables::for_cluster(&stray, Dtype::Bf16)
            .get(GpuKind::A100)
            .measured
            .is_none());
        // The shipped table's lookups are not mixed up with the measured one's.
        let shipped_e = shipped.gemm_efficiency(128.0, 256.0, 128.0, Layout::Dgrad);
        assert_ne!(shipped_e.value, e.value);
    }

    #[test]
    fn shipped_attention_is_priced_as_its_gemm() {
        let a100 = PerfTable::get(GpuKind::A100);
        assert_eq!(
            a100.attention_efficiency(32.0, 2048.0, 128.0),
            a100.gemm_efficiency(32.0 * 2048.0, 2048.0, 128.0, Layout::Fwd)
        );
    }
}
