//! Pictures of a plan, for people who would rather look than read: the rank map over the
//! nodes, the pipeline timeline of one iteration, the node-link heat map with the pipeline
//! cuts, and each stage's memory against the GPU's. Each comes as an SVG file for the run
//! directory and as text that fits 80 columns for `pipette plan --show`.
//!
//! Pure: builds strings from a [`Plan`] and the [`ClusterProfile`] it was made on; every
//! figure drawn is the plan's (the time model's per-stage estimates, the memory model's
//! terms, the profile's attained bandwidths), none invented here. Writing the files is the
//! caller's.

pub mod links;
pub mod memory;
pub mod rank_map;
pub mod svg;
pub mod timeline;

use serde::Serialize;

use crate::cluster::ClusterProfile;
use crate::plan::Plan;

/// One of the pictures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Picture {
    /// A cell per physical GPU, grouped by node, coloured by pipeline stage, tp groups
    /// outlined.
    RankMap,
    /// Forward and backward blocks per micro-batch per stage over one iteration.
    Timeline,
    /// Node pairs coloured by attained bandwidth, slow links marked, pipeline cuts drawn.
    Links,
    /// Each stage's memory by term against the usable memory.
    Memory,
}

impl Picture {
    pub const ALL: [Picture; 4] = [
        Picture::RankMap,
        Picture::Timeline,
        Picture::Links,
        Picture::Memory,
    ];

    /// The name `--show` takes, and the file's stem.
    pub fn name(self) -> &'static str {
        match self {
            Picture::RankMap => "rank-map",
            Picture::Timeline => "timeline",
            Picture::Links => "links",
            Picture::Memory => "memory",
        }
    }

    /// The picture `--show NAME` names.
    pub fn from_name(name: &str) -> Option<Picture> {
        Picture::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The file in the run directory.
    pub fn file_name(self) -> String {
        format!("{}.svg", self.name())
    }

    /// The picture as SVG.
    pub fn svg(self, plan: &Plan, profile: &ClusterProfile) -> String {
        match self {
            Picture::RankMap => rank_map::svg(plan, profile),
            Picture::Timeline => timeline::svg(&plan.config, &plan.estimate.time),
            Picture::Links => links::svg(plan, profile),
            Picture::Memory => memory::svg(plan),
        }
    }

    /// The picture as text for a terminal, 80 columns at most.
    pub fn text(self, plan: &Plan, profile: &ClusterProfile) -> String {
        match self {
            Picture::RankMap => rank_map::text(plan, profile),
            Picture::Timeline => timeline::text(&plan.config, &plan.estimate.time),
            Picture::Links => links::text(plan, profile),
            Picture::Memory => memory::text(plan),
        }
    }
}

/// Every picture as (file name, SVG), for the run directory.
pub fn svg_files(plan: &Plan, profile: &ClusterProfile) -> Vec<(String, String)> {
    Picture::ALL
        .iter()
        .map(|p| (p.file_name(), p.svg(plan, profile)))
        .collect()
}

/// The pipeline stage of each GPU of the profile, `[node][gpu]`, and its rank: `None`
/// where no rank runs.
pub(crate) fn ranks_by_gpu(plan: &Plan, profile: &ClusterProfile) -> Vec<Vec<Option<u64>>> {
    let mut out: Vec<Vec<Option<u64>>> = profile
        .nodes
        .iter()
        .map(|n| vec![None; gpu_count(n)])
        .collect();
    for (rank, d) in plan.placement.devices.iter().enumerate() {
        if let Some(cell) = out.get_mut(d.node).and_then(|g| g.get_mut(d.gpu)) {
            *cell = Some(rank as u64);
        }
    }
    out
}

/// The profile's nodes in the order of their first rank (node rank order), nodes that run
/// no rank last.
pub(crate) fn nodes_in_rank_order(ranks: &[Vec<Option<u64>>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ranks.len()).collect();
    order.sort_by_key(|&n| {
        (
            ranks[n].iter().flatten().min().copied().unwrap_or(u64::MAX),
            n,
        )
    });
    order
}

fn gpu_count(node: &crate::cluster::profile::NodeProfile) -> usize {
    match &node.gpus {
        crate::cluster::profile::GpuInventory::Known { gpus, .. } => gpus.len(),
        crate::cluster::profile::GpuInventory::Unknown => 0,
    }
}

/// `1234.5` → `1.2 s`, `12.3` → `12.3 ms`.
pub(crate) fn ms_text(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.1} ms")
    }
}

/// `line` cut to `width` characters, an ellipsis at the end when cut.
pub(crate) fn fit(line: &str, width: usize) -> String {
    if line.chars().count() <= width {
        return line.to_string();
    }
    let mut cut: String = line.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}
