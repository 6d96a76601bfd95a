//! The rank map: a cell per physical GPU, grouped by node (nodes in node-rank order, each
//! node's GPUs in local-rank order, so a tensor-parallel group sits side by side),
//! coloured by pipeline stage, tp groups outlined. Above [`MAX_GPUS`] GPUs it is aggregated:
//! a bar per group of consecutive nodes, split by pipeline stage in proportion to the GPUs
//! of each, so its size stays bounded whatever the cluster's.

use crate::cluster::profile::GpuInventory;
use crate::cluster::ClusterProfile;
use crate::plan::Plan;
use crate::report::device_ranges;
use crate::report::plan::describe;

use super::svg::{category_colour, text_width, Anchor, Svg};
use super::{fit, nodes_in_rank_order, nodes_text, ranks_by_gpu};

/// Up to this many GPUs the map draws a cell per GPU; above, a bar per group of nodes.
pub const MAX_GPUS: usize = 2048;

/// At most this many bars (groups of nodes) in the SVG of an aggregated map.
pub const SVG_GROUPS: usize = 256;

/// At most this many lines (groups of nodes) in the text of an aggregated map.
pub const TEXT_GROUPS: usize = 64;

/// At most this many runs of one stage in a bar; the rest is drawn as one "more" share
/// (stages follow the ranks, so a group's GPUs usually hold a few runs).
const MAX_RUNS: usize = 8;

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

/// Consecutive nodes (node-rank order) drawn as one bar of an aggregated map.
struct Group {
    /// The first and last nodes' positions in node-rank order, and their hosts.
    first: usize,
    last: usize,
    first_host: String,
    last_host: String,
    /// Runs of GPUs of one pipeline stage, in rank order: (stage, GPUs).
    runs: Vec<(u64, usize)>,
    /// GPUs in runs past [`MAX_RUNS`], and GPUs that run no rank.
    more: usize,
    idle: usize,
    /// The least and greatest rank, `None` when no rank runs there.
    ranks: Option<(u64, u64)>,
}

impl Group {
    fn gpus(&self) -> usize {
        self.runs.iter().map(|(_, n)| n).sum::<usize>() + self.more + self.idle
    }

    fn label(&self) -> String {
        if self.first == self.last {
            format!("{}: {}", self.first, self.first_host)
        } else {
            format!(
                "{}–{}: {}…{}",
                self.first, self.last, self.first_host, self.last_host
            )
        }
    }

    fn rank_range(&self) -> String {
        match self.ranks {
            Some((a, b)) if a == b => format!("r{a}"),
            Some((a, b)) => format!("r{a}-{b}"),
            None => "-".to_string(),
        }
    }
}

/// `rows` in groups of consecutive nodes, at most `max_groups` of them.
fn groups(plan: &Plan, rows: &[NodeRow], max_groups: usize) -> (usize, Vec<Group>) {
    let size = rows.len().div_ceil(max_groups.max(1)).max(1);
    let groups = rows
        .chunks(size)
        .enumerate()
        .map(|(k, chunk)| {
            let mut group = Group {
                first: k * size,
                last: k * size + chunk.len() - 1,
                first_host: chunk[0].host.clone(),
                last_host: chunk[chunk.len() - 1].host.clone(),
                runs: Vec::new(),
                more: 0,
                idle: 0,
                ranks: None,
            };
            for (rank, _) in chunk.iter().flat_map(|r| &r.cells) {
                let Some(r) = rank else {
                    group.idle += 1;
                    continue;
                };
                group.ranks = Some(
                    group
                        .ranks
                        .map_or((*r, *r), |(a, b)| (a.min(*r), b.max(*r))),
                );
                let stage = stage_and_group(plan, *r).0;
                let open = group.runs.len() < MAX_RUNS && group.more == 0;
                match group.runs.last_mut() {
                    Some((s, n)) if *s == stage && group.more == 0 => *n += 1,
                    _ if open => group.runs.push((stage, 1)),
                    _ => group.more += 1,
                }
            }
            group
        })
        .collect();
    (size, groups)
}

/// What an aggregated map says it is: `what` per group of how many nodes.
fn aggregate_note(world: usize, nodes: usize, per_group: usize, what: &str) -> String {
    format!("aggregated: {world} GPUs on {nodes} nodes, {what} per ≤ {per_group} consecutive nodes")
}

pub fn svg(plan: &Plan, profile: &ClusterProfile) -> String {
    let rows = rows(plan, profile);
    let c = &plan.config;
    let world: usize = rows.iter().map(|r| r.cells.len()).sum();
    if world > MAX_GPUS {
        return aggregated_svg(plan, &rows, world);
    }
    let per_node = rows.iter().map(|r| r.cells.len()).max().unwrap_or(0).max(1);
    let cell = if world <= 64 {
        40.0
    } else if world <= 256 {
        28.0
    } else {
        14.0
    };
    let gap = 2.0;
    let bars = group_bars(c);
    let labels: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| format!("{i}: {}", row.host))
        .collect();
    // Wide enough for its GPUs and, up to 24 characters, its label (longer ones are cut).
    let longest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let label_w = text_width(&"m".repeat(longest.min(24)), 11.0) + 16.0;
    let block_w = (per_node as f64 * (cell + gap) + 16.0).max(label_w);
    let label_chars = ((block_w - 16.0) / text_width("m", 11.0)).floor() as usize;
    let block_h = cell + 30.0 + BAR_STEP * bars.len() as f64;
    let columns = ((1180.0 / block_w).floor() as usize).clamp(1, rows.len().max(1));
    let lines = rows.len().div_ceil(columns);
    let top = 78.0;
    let width = (columns as f64 * block_w + 20.0).max(560.0);
    let height = top + lines as f64 * block_h + 16.0;
    let (mut svg, mut x) = canvas(plan, (width, height), world, rows.len());
    let pp = c.pp.max(1) as usize;
    // Legend: after the stages', what an outline means.
    if c.tp > 1 {
        x += 12.0;
        svg.outline(x, 38.0, 30.0, 16.0, "legend-tp", "#111", 2.0);
        let text = format!("a tensor-parallel group ({} GPUs)", c.tp);
        svg.text(x + 36.0, 50.0, 11.0, Anchor::Start, "legend", &text);
        x += 36.0 + text_width(&text, 11.0);
    }
    for bar in &bars {
        x += 12.0;
        let class = format!("legend-{}", bar.class);
        svg.rect(x, 44.0, 14.0, BAR_H, &class, bar.colours[0], "");
        svg.rect(x + 16.0, 44.0, 14.0, BAR_H, &class, bar.colours[1], "");
        let text = bar.legend(c);
        svg.text(x + 36.0, 50.0, 11.0, Anchor::Start, "legend", &text);
        x += 36.0 + text_width(&text, 11.0);
    }
    svg.note(
        68.0,
        "nodes in node-rank order, GPUs in local-rank order; the number is the rank",
    );

    for (i, row) in rows.iter().enumerate() {
        let (bx, by) = block(
            &mut svg,
            (i, columns),
            (block_w, block_h),
            top,
            ("node", &row.host),
            &fit(&labels[i], label_chars),
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
                            "rank {r}: stage {stage}, tp {}{}, dp {}{} — {} GPU {device}",
                            at.tp,
                            if c.cp > 1 {
                                format!(", cp {}", (r / c.tp.max(1)) % c.cp)
                            } else {
                                String::new()
                            },
                            at.dp,
                            if c.ep > 1 {
                                format!(", ep {}", c.expert_coordinates(*r).ep)
                            } else {
                                String::new()
                            },
                            row.host
                        ),
                    );
                    for (k, bar) in bars.iter().enumerate() {
                        let id = bar.group(c, *r);
                        svg.rect(
                            cx - gap / 2.0,
                            cy + cell + 3.0 + BAR_STEP * k as f64,
                            cell + gap,
                            BAR_H,
                            bar.class,
                            bar.colours[(id % 2) as usize],
                            &format!("{} {id}", bar.class),
                        );
                    }
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

/// A bar's height under the GPUs, and the step from one bar to the next.
const BAR_H: f64 = 5.0;
const BAR_STEP: f64 = 7.0;

/// A bar under the GPUs that marks a group other than tp: the GPUs that share one
/// sequence under context parallelism, or one expert-parallel group's, in two alternating
/// shades so neighbouring groups stand apart.
struct GroupBar {
    class: &'static str,
    colours: [&'static str; 2],
}

impl GroupBar {
    /// The group of `rank`, numbered within the world.
    fn group(&self, c: &crate::model::parallel::ParallelConfig, rank: u64) -> u64 {
        if self.class == "cp-group" {
            // tp and cp are the innermost orders: tp × cp consecutive ranks hold a sequence.
            rank / (c.tp * c.cp).max(1)
        } else {
            // The expert layout orders etp, ep, edp inside a stage: etp × ep consecutive
            // ranks hold one copy of every expert.
            let at = c.expert_coordinates(rank);
            at.pp * c.expert_dp().max(1) + at.edp
        }
    }

    fn legend(&self, c: &crate::model::parallel::ParallelConfig) -> String {
        if self.class == "cp-group" {
            format!(
                "GPUs sharing one sequence (cp {} × tp {}, context parallel)",
                c.cp, c.tp
            )
        } else {
            format!(
                "GPUs holding every expert once (ep {} × etp {}, expert parallel)",
                c.ep, c.etp
            )
        }
    }
}

/// The bars a configuration draws: cp groups where cp > 1, expert groups where ep > 1.
fn group_bars(c: &crate::model::parallel::ParallelConfig) -> Vec<GroupBar> {
    let mut bars = Vec::new();
    if c.cp > 1 {
        bars.push(GroupBar {
            class: "cp-group",
            colours: ["#1b4f72", "#85c1e9"],
        });
    }
    if c.ep > 1 {
        bars.push(GroupBar {
            class: "ep-group",
            colours: ["#6e2c00", "#f0b27a"],
        });
    }
    bars
}

/// The grey block of the `i`-th node (or group) of a map laid out in `columns`, below
/// `top`: drawn (with its tooltip and `label` at the top), and its top left corner returned.
fn block(
    svg: &mut Svg,
    (i, columns): (usize, usize),
    (block_w, block_h): (f64, f64),
    top: f64,
    (class, title): (&str, &str),
    label: &str,
) -> (f64, f64) {
    let bx = 10.0 + (i % columns) as f64 * block_w;
    let by = top + (i / columns) as f64 * block_h;
    svg.rect(
        bx,
        by,
        block_w - 8.0,
        block_h - 6.0,
        class,
        "#f3f3f3",
        title,
    );
    svg.text(bx + 4.0, by + 13.0, 11.0, Anchor::Start, "host", label);
    (bx, by)
}

/// A map's document with its title and the legend of stages (a numbered swatch per
/// stage), and where the legend ends.
fn canvas(plan: &Plan, (width, height): (f64, f64), world: usize, nodes: usize) -> (Svg, f64) {
    let c = &plan.config;
    let mut svg = Svg::new(width, height);
    svg.title(&format!(
        "Rank map: {} — {} GPUs on {}",
        describe(c),
        world,
        nodes_text(nodes)
    ));
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
    (svg, x)
}

/// The map of more than [`MAX_GPUS`] GPUs: a bar per group of nodes, at most
/// [`SVG_GROUPS`] bars of at most [`MAX_RUNS`] + 2 shares each.
fn aggregated_svg(plan: &Plan, rows: &[NodeRow], world: usize) -> String {
    let c = &plan.config;
    let (per_group, groups) = groups(plan, rows, SVG_GROUPS);
    let block_w = 290.0;
    let block_h = 44.0;
    let bar_w = block_w - 16.0;
    let columns = 4;
    let top = 106.0;
    let lines = groups.len().div_ceil(columns);
    let width = columns as f64 * block_w + 20.0;
    let height = top + lines as f64 * block_h + 16.0;
    let (mut svg, _) = canvas(plan, (width, height), world, rows.len());
    let pp = c.pp.max(1) as usize;
    svg.note(68.0, &aggregate_note(world, rows.len(), per_group, "a bar"));
    svg.note(
        82.0,
        "(node-rank order), split by pipeline stage in proportion to its GPUs; light grey: no rank",
    );
    for (i, group) in groups.iter().enumerate() {
        let title = format!(
            "nodes {}–{}: {} GPUs, ranks {}",
            group.first,
            group.last,
            group.gpus(),
            group.rank_range()
        );
        let (bx, by) = block(
            &mut svg,
            (i, columns),
            (block_w, block_h),
            top,
            ("node-group", &title),
            &fit(&group.label(), 44),
        );
        let total = group.gpus().max(1) as f64;
        let mut x = bx + 4.0;
        let shares = group
            .runs
            .iter()
            .map(|(s, n)| {
                (
                    *n,
                    "stage-share",
                    category_colour(*s as usize, pp),
                    format!("stage {s}: {n} GPUs"),
                )
            })
            .chain((group.more > 0).then(|| {
                (
                    group.more,
                    "more-share",
                    "#999999".to_string(),
                    format!("{} GPUs of further stages", group.more),
                )
            }))
            .chain((group.idle > 0).then(|| {
                (
                    group.idle,
                    "idle-share",
                    "#dddddd".to_string(),
                    format!("{} GPUs without a rank", group.idle),
                )
            }));
        for (n, class, fill, title) in shares {
            let w = bar_w * n as f64 / total;
            svg.rect(x, by + 18.0, w, 14.0, class, &fill, &title);
            x += w;
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
        "Rank map: tp {} × pp {} × dp {}, {world} GPUs on {}\n",
        c.tp,
        c.pp,
        c.dp,
        nodes_text(rows.len())
    );
    if world > MAX_GPUS {
        aggregated_text(plan, &rows, world, &mut out);
        return out;
    }
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

/// The text of more than [`MAX_GPUS`] GPUs: a line per group of nodes, at most
/// [`TEXT_GROUPS`] of them, with its stages and ranks.
fn aggregated_text(plan: &Plan, rows: &[NodeRow], world: usize, out: &mut String) {
    let (per_group, groups) = groups(plan, rows, TEXT_GROUPS);
    let note = aggregate_note(world, rows.len(), per_group, "a line");
    for line in [
        note.as_str(),
        "(node-rank order): its nodes, first…last host, ranks, then stage×GPUs in rank",
        "order (+ further stages, . GPUs without a rank)",
    ] {
        out.push_str(&fit(&format!("  {line}"), 80));
        out.push('\n');
    }
    for group in &groups {
        let stages: Vec<String> = group
            .runs
            .iter()
            .map(|(s, n)| format!("{}×{n}", stage_char(*s)))
            .chain((group.more > 0).then(|| format!("+×{}", group.more)))
            .chain((group.idle > 0).then(|| format!(".×{}", group.idle)))
            .collect();
        let line = format!(
            "  {} {} stages {}",
            group.label(),
            group.rank_range(),
            stages.join(" ")
        );
        out.push_str(&fit(&line, 80));
        out.push('\n');
    }
}
