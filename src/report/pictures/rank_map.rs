//! The rank map: a cell per physical GPU, grouped by node (nodes in node-rank order, each
//! node's GPUs in local-rank order, so a tensor-parallel group sits side by side),
//! coloured by pipeline stage, tp groups outlined.

use crate::cluster::profile::GpuInventory;
use crate::cluster::ClusterProfile;
use crate::plan::Plan;
use crate::report::device_ranges;
use crate::report::plan::describe;

use super::svg::{category_colour, Anchor, Svg};
use super::{fit, nodes_in_rank_order, ranks_by_gpu};

/// One node as the map draws it.
struct NodeRow {
    host: String,
    /// (rank, physical device index), in local-rank order; GPUs that run no rank last.
    cells: Vec<(Option<u64>, u32)>,
}

fn rows(plan: &Plan, profile: &ClusterProfile) -> Vec<NodeRow> {
    let ranks = ranks_by_gpu(plan, profile);
    nodes_in_rank_order(&ranks)
        .into_iter()
        .map(|n| {
            let node = &profile.nodes[n];
            let indices: Vec<u32> = match &node.gpus {
                GpuInventory::Known { gpus, .. } => gpus.iter().map(|g| g.index).collect(),
                GpuInventory::Unknown => Vec::new(),
            };
            let mut cells: Vec<(Option<u64>, u32)> = ranks[n]
                .iter()
                .zip(&indices)
                .map(|(r, i)| (*r, *i))
                .collect();
            cells.sort_by_key(|(r, i)| (r.unwrap_or(u64::MAX), *i));
            NodeRow {
                host: node.host.clone(),
                cells,
            }
        })
        .collect()
}

/// The stage (pipeline rank) and tensor-parallel group of `rank`.
fn stage_and_group(plan: &Plan, rank: u64) -> (u64, u64) {
    let c = &plan.config;
    let at = c.coordinates(rank);
    (at.pp, rank / c.tp.max(1))
}

pub fn svg(plan: &Plan, profile: &ClusterProfile) -> String {
    let rows = rows(plan, profile);
    let c = &plan.config;
    let world: usize = rows.iter().map(|r| r.cells.len()).sum();
    let per_node = rows.iter().map(|r| r.cells.len()).max().unwrap_or(0).max(1);
    let cell = if world <= 64 {
        40.0
    } else if world <= 256 {
        28.0
    } else {
        14.0
    };
    let gap = 2.0;
    let block_w = per_node as f64 * (cell + gap) + 16.0;
    let block_h = cell + 30.0;
    let columns = ((1180.0 / block_w).floor() as usize).clamp(1, rows.len().max(1));
    let lines = rows.len().div_ceil(columns);
    let top = 78.0;
    let width = (columns as f64 * block_w + 20.0).max(560.0);
    let height = top + lines as f64 * block_h + 16.0;
    let mut svg = Svg::new(width, height);
    svg.title(&format!(
        "Rank map: {} — {} GPUs on {} nodes",
        describe(c),
        world,
        rows.len()
    ));
    // Legend: one swatch per stage (numbered), and what an outline means.
    let pp = c.pp.max(1) as usize;
    let swatch = if pp <= 16 { 22.0 } else { 12.0 };
    let mut x = 10.0;
    svg.text(x, 50.0, 11.0, Anchor::Start, "legend", "stage");
    x += 38.0;
    for s in 0..pp {
        svg.rect(
            x,
            38.0,
            swatch,
            16.0,
            "legend-stage",
            &category_colour(s, pp),
            &format!("pipeline stage {s}"),
        );
        if swatch >= 20.0 {
            svg.text(
                x + swatch / 2.0,
                50.0,
                10.0,
                Anchor::Middle,
                "legend",
                &s.to_string(),
            );
        }
        x += swatch + 2.0;
    }
    if c.tp > 1 {
        x += 12.0;
        svg.outline(x, 38.0, 30.0, 16.0, "legend-tp", "#111", 2.0);
        svg.text(
            x + 36.0,
            50.0,
            11.0,
            Anchor::Start,
            "legend",
            &format!("a tensor-parallel group ({} GPUs)", c.tp),
        );
    }
    svg.note(
        68.0,
        "nodes in node-rank order, GPUs in local-rank order; the number is the rank",
    );

    for (i, row) in rows.iter().enumerate() {
        let bx = 10.0 + (i % columns) as f64 * block_w;
        let by = top + (i / columns) as f64 * block_h;
        svg.rect(
            bx,
            by,
            block_w - 8.0,
            block_h - 6.0,
            "node",
            "#f3f3f3",
            &row.host,
        );
        svg.text(
            bx + 4.0,
            by + 13.0,
            11.0,
            Anchor::Start,
            "host",
            &format!("{i}: {}", row.host),
        );
        let cy = by + 18.0;
        // tp groups: runs of cells of one group, outlined after the cells.
        let mut groups: Vec<(u64, usize, usize)> = Vec::new();
        for (j, (rank, device)) in row.cells.iter().enumerate() {
            let cx = bx + 4.0 + j as f64 * (cell + gap);
            match rank {
                Some(r) => {
                    let (stage, group) = stage_and_group(plan, *r);
                    let at = c.coordinates(*r);
                    svg.rect(
                        cx,
                        cy,
                        cell,
                        cell,
                        "gpu",
                        &category_colour(stage as usize, pp),
                        &format!(
                            "rank {r}: stage {stage}, tp {}, dp {} — {} GPU {device}",
                            at.tp, at.dp, row.host
                        ),
                    );
                    if cell >= 28.0 {
                        svg.text(
                            cx + cell / 2.0,
                            cy + cell / 2.0 + 4.0,
                            if r >= &1000 { 9.0 } else { 11.0 },
                            Anchor::Middle,
                            "rank",
                            &r.to_string(),
                        );
                    }
                    match groups.last_mut() {
                        Some((g, _, end)) if *g == group && *end + 1 == j => *end = j,
                        _ => groups.push((group, j, j)),
                    }
                }
                None => svg.rect(
                    cx,
                    cy,
                    cell,
                    cell,
                    "gpu-idle",
                    "#dddddd",
                    &format!("{} GPU {device}: no rank", row.host),
                ),
            }
        }
        if c.tp > 1 {
            for (_, start, end) in groups {
                svg.outline(
                    bx + 4.0 + start as f64 * (cell + gap) - 1.0,
                    cy - 1.0,
                    (end - start + 1) as f64 * (cell + gap) - gap + 2.0,
                    cell + 2.0,
                    "tp-group",
                    "#111",
                    2.0,
                );
            }
        }
    }
    svg.finish()
}

/// A stage as one character: `0`–`9`, then `a`–`z`, then `+`.
fn stage_char(stage: u64) -> char {
    char::from_digit(stage as u32, 36)
        .filter(|_| stage < 36)
        .unwrap_or('+')
}

pub fn text(plan: &Plan, profile: &ClusterProfile) -> String {
    let rows = rows(plan, profile);
    let c = &plan.config;
    let world: usize = rows.iter().map(|r| r.cells.len()).sum();
    let mut out = format!(
        "Rank map: tp {} × pp {} × dp {}, {world} GPUs on {} nodes\n",
        c.tp,
        c.pp,
        c.dp,
        rows.len()
    );
    out.push_str(
        "  a node's GPUs in local-rank order, each shown by its pipeline stage; [..] is a\n  tp group, . a GPU without a rank; then the node's ranks, CUDA_VISIBLE_DEVICES\n",
    );
    let per_node = rows.iter().map(|r| r.cells.len()).max().unwrap_or(0);
    // Spaces between GPUs while the line has room for them.
    let spaced = per_node <= 12;
    for (i, row) in rows.iter().enumerate() {
        let mut map = String::new();
        let mut open: Option<u64> = None;
        for (j, (rank, _)) in row.cells.iter().enumerate() {
            let group = rank.map(|r| stage_and_group(plan, r).1);
            if c.tp > 1 && group != open {
                if open.is_some() {
                    map.push(']');
                }
                if group.is_some() {
                    map.push('[');
                }
            } else if spaced && j > 0 {
                map.push(' ');
            }
            open = group;
            map.push(rank.map_or('.', |r| stage_char(stage_and_group(plan, r).0)));
        }
        if c.tp > 1 && open.is_some() {
            map.push(']');
        }
        let ranks: Vec<u64> = row.cells.iter().filter_map(|(r, _)| *r).collect();
        let first_last = match (ranks.iter().min(), ranks.iter().max()) {
            (Some(a), Some(b)) if a == b => format!("r{a}"),
            (Some(a), Some(b)) => format!("r{a}-{b}"),
            _ => "-".to_string(),
        };
        let devices: Vec<u32> = row
            .cells
            .iter()
            .filter(|(r, _)| r.is_some())
            .map(|(_, d)| *d)
            .collect();
        let host: String = row.host.chars().take(14).collect();
        let line = format!(
            "{i:>4} {host:<14} {map} {first_last} gpus {}",
            device_ranges(&devices)
        );
        out.push_str(&fit(&line, 80));
        out.push('\n');
    }
    out
}
