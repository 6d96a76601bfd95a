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

/// `1 node`, `4 nodes`.
fn nodes_text(n: usize) -> String {
    format!("{n} node{}", if n == 1 { "" } else { "s" })
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

#[cfg(test)]
mod tests {
    //! Every picture stays bounded in size on a cluster of any size: a 10,000-node,
    //! 80,000-GPU plan draws aggregated pictures of a few thousand elements, where a cell
    //! per node pair would be 10^8 of them and a cell per GPU 80,000.

    use super::*;
    use crate::cluster::profile::{LinkMatrix, Provenance, Source};
    use crate::config::settings_from_megatron_args;
    use crate::model::parallel::Placement;
    use crate::plan::{plan, PlanOptions};

    /// A plan made on the 2-node example, then stretched over `nodes` copies of its nodes
    /// (8 GPUs each, dp grown to fill them, torchrun's placement): the pictures read only
    /// the configuration, the placement and the critical hops, so this is the plan a
    /// `nodes`-node search would draw without the search's time.
    fn stretched(nodes: usize, links: impl Fn(usize) -> LinkMatrix) -> (Plan, ClusterProfile) {
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/clusters/a100-2x8.json");
        let small = ClusterProfile::load(&file).unwrap();
        let args: Vec<String> = [
            "--bf16",
            "--global-batch-size",
            "64",
            "--tensor-model-parallel-size",
            "2",
            "--pipeline-model-parallel-size",
            "4",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut settings = settings_from_megatron_args(&args, Some("gpt3-1.3b"), &[]).unwrap();
        settings.constraints.tensor_parallel = Some(2);
        settings.constraints.pipeline_parallel = Some(4);
        let options = PlanOptions {
            budget: Some(2_000),
            top_k: 1,
            ..PlanOptions::default()
        };
        let mut plan = plan(&settings, &small, &options).unwrap();
        let world = nodes * 8;
        plan.config.dp = world as u64 / (plan.config.tp * plan.config.pp);
        plan.placement = Placement::identity(world, 8);
        let profile = ClusterProfile {
            note: None,
            nodes: (0..nodes)
                .map(|i| {
                    let mut node = small.nodes[0].clone();
                    node.host = format!("n{i:05}");
                    node
                })
                .collect(),
            node_links: links(nodes),
            measured_perf: Vec::new(),
        };
        (plan, profile)
    }

    /// Ring-sampled links like a 10,000-node probe measures, node 77's links slow.
    fn ring(n: usize) -> LinkMatrix {
        let figure = |a: usize, b: usize| if a == 77 || b == 77 { 1.0 } else { 20.0 };
        let pairs = (0..n)
            .flat_map(|a| {
                let b = (a + 1) % n;
                [(a, b, figure(a, b)), (b, a, figure(a, b))]
            })
            .collect();
        let mut per_node = vec![20.0; n];
        per_node[77] = 1.0;
        LinkMatrix::sampled(per_node, pairs, Provenance::new(Source::Measured)).unwrap()
    }

    /// SVG elements drawn.
    fn elements(svg: &str) -> usize {
        svg.matches("<rect").count() + svg.matches("<text").count() + svg.matches("<line").count()
    }

    /// Nodes sharing an NVLink domain are named in the link map, text and SVG alike, by
    /// node rank; a cluster without domains draws no such line.
    #[test]
    fn the_link_map_names_the_nvlink_domains() {
        let uniform = |n| LinkMatrix::uniform(n, 20.0, Provenance::new(Source::Estimated));
        let (plan, mut profile) = stretched(4, uniform);
        let plain = (
            Picture::Links.text(&plan, &profile),
            Picture::Links.svg(&plan, &profile),
        );
        assert!(!plain.0.contains("NVLink") && !plain.1.contains("NVLink"));
        for (i, node) in profile.nodes.iter_mut().enumerate() {
            node.nvlink_domain = Some(format!("nvl72-{}", i / 2));
        }
        let text = Picture::Links.text(&plan, &profile);
        let svg = Picture::Links.svg(&plan, &profile);
        for shown in [&text, &svg] {
            assert!(shown.contains("NVLink domains"), "{shown}");
            assert!(
                shown.contains("nvl72-0 node ranks 0–1, nvl72-1 node ranks 2–3"),
                "{shown}"
            );
        }
        for line in text.lines() {
            assert!(line.chars().count() <= 80, "{line}");
        }
    }

    #[test]
    fn a_10k_node_80k_gpu_plan_draws_bounded_aggregated_pictures() {
        let (plan, profile) = stretched(10_000, ring);
        assert_eq!(plan.config.world_size(), 80_000);
        for picture in [Picture::RankMap, Picture::Links] {
            let svg = picture.svg(&plan, &profile);
            assert!(
                svg.len() < 1_000_000,
                "{picture:?}: {} bytes of SVG",
                svg.len()
            );
            assert!(
                elements(&svg) < 6_000,
                "{picture:?}: {} elements",
                elements(&svg)
            );
            assert!(svg.contains("aggregated: "), "{picture:?} says so");
            let text = picture.text(&plan, &profile);
            assert!(text.contains("aggregated: "), "{picture:?}:\n{text}");
            assert!(text.lines().count() <= 80, "{picture:?}:\n{text}");
            for line in text.lines() {
                assert!(line.chars().count() <= 80, "{picture:?}: {line}");
            }
        }
        let links = Picture::Links.svg(&plan, &profile);
        // 64 groups of 157 nodes (the last of 109): a cell per group pair, diagonal
        // included (every group holds links of its own).
        assert_eq!(links.matches(r#"class="link""#).count(), 64 * 64);
        assert!(links.contains("10000 nodes in 64 groups of ≤ 157 consecutive"));
        let map = Picture::RankMap.svg(&plan, &profile);
        // 256 bars of ≤ 40 nodes, each split by the stages of its GPUs.
        assert_eq!(map.matches(r#"class="node-group""#).count(), 250);
        assert!(map.contains("80000 GPUs on 10000 nodes, a bar per ≤ 40 consecutive nodes"));
    }

    #[test]
    fn an_aggregated_link_map_keeps_a_slow_node_visible() {
        let (plan, profile) = stretched(10_000, ring);
        let text = Picture::Links.text(&plan, &profile);
        // 32 groups of 313: node 77 is in the first, whose row and column are slow.
        assert!(
            text.contains("10000 nodes in 32 groups of ≤ 313 consecutive"),
            "{text}"
        );
        assert!(
            text.contains("63 slow group pair(s), slowest first:"),
            "{text}"
        );
        assert!(
            text.contains("n00000…n00312 → n00000…n00312: 1.0 GB/s"),
            "{text}"
        );
        let matrix: Vec<&str> = text
            .lines()
            .filter(|l| {
                let mut words = l.split_whitespace();
                words.next().is_some_and(|w| w.parse::<usize>().is_ok())
                    && words.all(|w| w.chars().all(|c| "!|·0123456789".contains(c)))
            })
            .collect();
        assert_eq!(matrix.len(), 32, "{text}");
        assert!(matrix[0].matches('!').count() == 32, "{}", matrix[0]);
        assert!(matrix[1].matches('!').count() == 1, "{}", matrix[1]);
    }

    #[test]
    fn an_aggregated_link_map_of_a_full_matrix_shows_each_groups_slowest_link() {
        // 130 nodes, past the per-pair limit: 44 groups of 3, the last of one node alone
        // (no link of its own, its diagonal cell blank).
        let n = 130;
        let full = |n: usize| {
            let mut m = LinkMatrix::uniform(n, 25.0, Provenance::new(Source::Measured));
            m.set(5, 100, 2.0);
            m
        };
        let (plan, profile) = stretched(n, full);
        let svg = Picture::Links.svg(&plan, &profile);
        assert!(svg.contains("130 nodes in 44 groups of ≤ 3 consecutive"));
        assert!(svg.contains("1: n00003…n00005</text>"));
        assert!(svg.contains("n00003…n00005 → n00099…n00101: slowest link 2.0 GB/s"));
        assert!(svg.contains("n00099…n00101 → n00003…n00005: slowest link 25.0 GB/s"));
        assert_eq!(svg.matches(r#"class="link""#).count(), 44 * 44 - 1);
        assert_eq!(
            svg.matches(r#"class="slow""#).count(),
            2,
            "one ✕, two strokes"
        );
    }

    #[test]
    fn up_to_the_limits_every_node_pair_and_every_gpu_is_drawn() {
        let (plan, profile) = stretched(links::MAX_NODES, |n| {
            LinkMatrix::uniform(n, 25.0, Provenance::new(Source::Measured))
        });
        assert!(plan.config.world_size() as usize <= rank_map::MAX_GPUS);
        let svg = Picture::Links.svg(&plan, &profile);
        assert_eq!(svg.matches(r#"class="link""#).count(), 128 * 127);
        let map = Picture::RankMap.svg(&plan, &profile);
        assert_eq!(map.matches(r#"class="gpu""#).count(), 1024);
        for picture in [Picture::RankMap, Picture::Links] {
            assert!(!picture.svg(&plan, &profile).contains("aggregated"));
            assert!(!picture.text(&plan, &profile).contains("aggregated"));
        }
    }
}
