//! The link heat map: every ordered node pair (sender row, receiver column, nodes in
//! node-rank order) coloured by the profile's attained bandwidth, links slower than
//! [`SLOW_SHARE`] of the median marked, the pipeline's cuts (where one stage's ranks end
//! and the next one's begin) drawn across, and the hops on the critical path outlined.

use crate::cluster::ClusterProfile;
use crate::plan::Plan;

use super::svg::{scale_colour, Anchor, Svg};
use super::{fit, nodes_in_rank_order, nodes_text, ranks_by_gpu};

/// A link below this share of the median node link is marked slow.
pub const SLOW_SHARE: f64 = 0.8;

/// Up to this many nodes the map draws every node pair; above it, groups of consecutive
/// nodes (a cell per node pair would be n² of them: 10^8 on 10,000 nodes).
pub const MAX_NODES: usize = 128;

/// At most this many groups in the SVG of an aggregated map (cells of 12 px, names shown).
pub const SVG_GROUPS: usize = 64;

/// At most this many groups in the text of an aggregated map (a digit matrix in 80 columns).
pub const TEXT_GROUPS: usize = 32;

/// What the map shows, in node-rank order: a row and column per node, or per group of
/// [`LinkMap::group`] consecutive nodes when aggregated.
struct LinkMap {
    /// Profile positions of the nodes, in node-rank order.
    order: Vec<usize>,
    /// The nodes' hosts, in node-rank order.
    hosts: Vec<String>,
    /// Nodes per row (and column): 1 unless aggregated.
    group: usize,
    /// Each row's name: its host, or its group's first and last hosts.
    labels: Vec<String>,
    /// `gbps[i][j]`: from the `i`-th row to the `j`-th; aggregated, the slowest link
    /// between the two groups. 0 on the diagonal unless [`LinkMap::self_links`] says not.
    gbps: Vec<Vec<f64>>,
    /// Aggregated: whether row `i`'s group holds links of its own (two nodes or more), so
    /// its diagonal cell is drawn. Empty when not aggregated.
    self_links: Vec<bool>,
    min: f64,
    max: f64,
    median: f64,
    /// Where stage `s` (1..pp) begins, in nodes from the left (fractional inside a node).
    cuts: Vec<(usize, f64)>,
    /// Pipeline hops on the critical path that cross nodes, in rows.
    hops: Vec<Hop>,
    /// The NVLink domains among the nodes (`nvlink_domain` in the cluster file), each with
    /// its first and last node rank: inside one, GPUs talk at NVLink rates, not at the
    /// node links drawn. Empty when no node names one.
    domains: Vec<(String, usize, usize)>,
}

/// A pipeline hop on the critical path from one node to another.
struct Hop {
    /// Its row (sender) and column (receiver) in the map.
    row: usize,
    column: usize,
    from_stage: usize,
    to_stage: usize,
    from_host: String,
    to_host: String,
    gbps: f64,
}

fn link_map(plan: &Plan, profile: &ClusterProfile, max_groups: usize) -> LinkMap {
    let ranks = ranks_by_gpu(plan, profile);
    let order = nodes_in_rank_order(&ranks);
    let mut position = vec![usize::MAX; profile.nodes.len()];
    for (p, &node) in order.iter().enumerate() {
        position[node] = p;
    }
    let position = |node: usize| position.get(node).copied().filter(|&p| p != usize::MAX);
    let size = profile.node_links.size();
    let link = |a: usize, b: usize| {
        if a != b && a < size && b < size {
            profile.node_links.get(a, b)
        } else {
            0.0
        }
    };
    let n = order.len();
    let group = if n > MAX_NODES {
        n.div_ceil(max_groups.max(1))
    } else {
        1
    };
    let (gbps, self_links, min, max, median) = if group == 1 {
        every_pair(&order, link)
    } else {
        grouped(profile, &order, &position, group)
    };
    let c = &plan.config;
    // Megatron orders ranks tp, cp, dp, then pp: a stage holds world / pp consecutive ranks.
    let per_stage = (c.tp * c.cp * c.dp).max(1);
    let cuts = (1..c.pp as usize)
        .filter_map(|s| {
            let rank = s as u64 * per_stage;
            let device = plan.placement.devices.get(rank as usize)?;
            let at = position(device.node)?;
            let on_node: Vec<u64> = ranks[device.node].iter().flatten().copied().collect();
            let first = on_node.iter().min().copied().unwrap_or(rank);
            let share = (rank - first) as f64 / on_node.len().max(1) as f64;
            Some((s, at as f64 + share))
        })
        .collect();
    let host = |node: usize| profile.nodes[node].host.clone();
    let mut hops: Vec<Hop> = Vec::new();
    for h in &plan.estimate.time.pipeline.hops {
        let (a, b) = (h.activation.from.node, h.activation.to.node);
        if a == b {
            continue;
        }
        let (Some(row), Some(column)) = (position(a), position(b)) else {
            continue;
        };
        hops.push(Hop {
            row: row / group,
            column: column / group,
            from_stage: h.from_stage,
            to_stage: h.to_stage,
            from_host: host(a),
            to_host: host(b),
            gbps: link(a, b),
        });
    }
    // Runs of consecutive nodes (node-rank order) in one NVLink domain.
    let mut domains: Vec<(String, usize, usize)> = Vec::new();
    for (p, &node) in order.iter().enumerate() {
        let Some(id) = profile.nodes[node].nvlink_domain.as_ref() else {
            continue;
        };
        match domains.last_mut() {
            Some((last, _, end)) if last == id && *end + 1 == p => *end = p,
            _ => domains.push((id.clone(), p, p)),
        }
    }
    let hosts: Vec<String> = order.iter().map(|&n| host(n)).collect();
    let labels = if group == 1 {
        hosts.clone()
    } else {
        hosts
            .chunks(group)
            .map(|g| match g {
                [one] => one.clone(),
                _ => format!("{}…{}", g[0], g[g.len() - 1]),
            })
            .collect()
    };
    LinkMap {
        hosts,
        group,
        labels,
        order,
        gbps,
        self_links,
        min,
        max,
        median,
        cuts,
        hops,
        domains,
    }
}

type Cells = (Vec<Vec<f64>>, Vec<bool>, f64, f64, f64);

/// A cell per ordered node pair, and the figures' least, greatest and median.
fn every_pair(order: &[usize], link: impl Fn(usize, usize) -> f64) -> Cells {
    let gbps: Vec<Vec<f64>> = order
        .iter()
        .map(|&a| order.iter().map(|&b| link(a, b)).collect())
        .collect();
    let mut values: Vec<f64> = gbps
        .iter()
        .enumerate()
        .flat_map(|(i, row)| {
            row.iter()
                .enumerate()
                .filter(move |(j, _)| *j != i)
                .map(|(_, v)| *v)
        })
        .collect();
    values.sort_by(f64::total_cmp);
    let median = values.get(values.len() / 2).copied().unwrap_or(0.0);
    (
        gbps,
        Vec::new(),
        values.first().copied().unwrap_or(0.0),
        values.last().copied().unwrap_or(0.0),
        median,
    )
}

/// A cell per ordered pair of groups of `group` consecutive nodes (in `order`): the slowest
/// link between them, read from the figures the profile holds — every cell of a full
/// matrix; the measured pairs and the per-node figures of a sampled one (an unmeasured
/// pair attains its slower end's figure, so the slowest of them between two groups is the
/// lesser of the groups' slowest nodes). Time and memory are linear in the figures held,
/// never n² for a sampled matrix. The median is the median of those figures.
fn grouped(
    profile: &ClusterProfile,
    order: &[usize],
    position: &dyn Fn(usize) -> Option<usize>,
    group: usize,
) -> Cells {
    let links = &profile.node_links;
    let rows = order.len().div_ceil(group);
    let row_of = |node: usize| position(node).map(|p| p / group);
    let members = |row: usize| (order.len() - row * group).min(group);
    let mut gbps = vec![vec![f64::INFINITY; rows]; rows];
    let mut figures: Vec<f64> = Vec::new();
    for (a, b, v) in links.links() {
        figures.push(v);
        if let (Some(i), Some(j)) = (row_of(a), row_of(b)) {
            gbps[i][j] = gbps[i][j].min(v);
        }
    }
    if let Some(per_node) = links.per_endpoint() {
        let mut slowest = vec![f64::INFINITY; rows];
        for (node, v) in per_node.iter().enumerate() {
            figures.push(*v);
            if let Some(i) = row_of(node) {
                slowest[i] = slowest[i].min(*v);
            }
        }
        for (i, row) in gbps.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                if i != j || members(i) > 1 {
                    *cell = cell.min(slowest[i].min(slowest[j]));
                }
            }
        }
    }
    let self_links: Vec<bool> = (0..rows).map(|i| members(i) > 1).collect();
    for row in &mut gbps {
        for cell in row.iter_mut().filter(|c| !c.is_finite()) {
            *cell = 0.0;
        }
    }
    let median = if figures.is_empty() {
        0.0
    } else {
        let middle = figures.len() / 2;
        *figures.select_nth_unstable_by(middle, f64::total_cmp).1
    };
    (
        gbps,
        self_links,
        links.min_link().unwrap_or(0.0),
        links.max_link().unwrap_or(0.0),
        median,
    )
}

impl LinkMap {
    /// Where `v` sits on the colour scale, 0 (red) to 1 (green). The scale starts at half
    /// the fastest link at most, so a few per cent of spread between healthy links stays
    /// green and red means slow.
    fn share(&self, v: f64) -> f64 {
        let low = self.low();
        if self.max > low {
            (v - low) / (self.max - low)
        } else {
            1.0
        }
    }

    fn low(&self) -> f64 {
        self.min.min(self.max * 0.5)
    }

    fn slow(&self, v: f64) -> bool {
        v < SLOW_SHARE * self.median
    }

    /// Whether cell `(i, j)` holds a figure: off the diagonal, or on it for a group of
    /// nodes with links among them.
    fn has_cell(&self, i: usize, j: usize) -> bool {
        i != j || self.self_links.get(i).copied().unwrap_or(false)
    }

    /// The rows (and columns) of the map.
    fn rows(&self) -> usize {
        self.labels.len()
    }

    /// `at` (in nodes from the left) in rows.
    fn in_rows(&self, at: f64) -> f64 {
        at / self.group as f64
    }

    /// What an aggregated map says about its cells, in lines; none when not aggregated.
    fn aggregate_note(&self) -> Vec<String> {
        if self.group == 1 {
            return Vec::new();
        }
        vec![
            format!(
                "aggregated: {} nodes in {} groups of ≤ {} consecutive (node-rank order);",
                self.order.len(),
                self.rows(),
                self.group
            ),
            "a cell: the slowest link between two groups (measured pairs, per-node figures)"
                .to_string(),
        ]
    }

    /// The notes above the map: the aggregation's, and the NVLink domains (at most four
    /// named, the rest counted).
    fn notes(&self) -> Vec<String> {
        let mut notes = self.aggregate_note();
        if !self.domains.is_empty() {
            let named: Vec<String> = self
                .domains
                .iter()
                .take(4)
                .map(|(id, a, b)| format!("{id} node ranks {a}–{b}"))
                .collect();
            let more = match self.domains.len() {
                n if n > 4 => format!(" and {} more", n - 4),
                _ => String::new(),
            };
            notes.push(
                "NVLink domains: their GPUs talk at NVLink rates, not the node links drawn:"
                    .to_string(),
            );
            notes.push(format!("{}{more}", named.join(", ")));
        }
        notes
    }

    /// A cell's tooltip.
    fn cell_title(&self, i: usize, j: usize, v: f64) -> String {
        if self.group == 1 {
            format!("{} → {}: {v:.1} GB/s", self.labels[i], self.labels[j])
        } else {
            format!(
                "{} → {}: slowest link {v:.1} GB/s",
                self.labels[i], self.labels[j]
            )
        }
    }

    fn slow_links(&self) -> Vec<(usize, usize, f64)> {
        let mut out = Vec::new();
        for (i, row) in self.gbps.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                if self.has_cell(i, j) && self.slow(*v) {
                    out.push((i, j, *v));
                }
            }
        }
        out.sort_by(|a, b| a.2.total_cmp(&b.2));
        out
    }
}

pub fn svg(plan: &Plan, profile: &ClusterProfile) -> String {
    let map = link_map(plan, profile, SVG_GROUPS);
    let n = map.rows();
    let note = map.notes();
    let cell = if n <= 16 {
        40.0
    } else if n <= 64 {
        12.0
    } else {
        6.0
    };
    let names = cell >= 12.0;
    let left = if names { 130.0 } else { 60.0 };
    // An aggregated map says so, and NVLink domains are named, in lines above the matrix.
    let top = 126.0 + 14.0 * note.len() as f64;
    let side = n as f64 * cell;
    let width = (left + side + 40.0).max(760.0);
    let height = top + side + 50.0;
    let title = format!(
        "Node links: attained bandwidth, {} in node-rank order (row sends, column receives)",
        nodes_text(map.order.len())
    );
    if n < 2 {
        // Nothing to draw: a canvas of the title and why, not an empty matrix's.
        let mut svg = Svg::new(760.0, 64.0);
        svg.title(&title);
        svg.text(
            10.0,
            50.0,
            12.0,
            Anchor::Start,
            "legend",
            "one node: no link crosses the network",
        );
        return svg.finish();
    }
    let mut svg = Svg::new(width, height);
    svg.title(&title);
    svg.note(
        42.0,
        &format!(
            "{:.1}–{:.1} GB/s, median {:.1}; ✕ marks a link below {:.0} % of the median",
            map.min,
            map.max,
            map.median,
            SLOW_SHARE * 100.0
        ),
    );
    svg.note(98.0, "blue dashes: where a pipeline stage begins (s1, s2, ...); thick outline: a pipeline hop on the critical path");
    for (k, line) in note.iter().enumerate() {
        svg.note(114.0 + 14.0 * k as f64, line);
    }
    // Colour scale.
    for k in 0..=10 {
        let t = k as f64 / 10.0;
        svg.rect(
            10.0 + k as f64 * 22.0,
            50.0,
            22.0,
            12.0,
            "legend-scale",
            &scale_colour(t),
            "",
        );
    }
    svg.text(
        10.0,
        76.0,
        10.0,
        Anchor::Start,
        "legend",
        &format!("{:.1} GB/s", map.low()),
    );
    svg.text(
        252.0,
        76.0,
        10.0,
        Anchor::End,
        "legend",
        &format!("{:.1} GB/s", map.max),
    );
    for i in 0..n {
        let y = top + i as f64 * cell;
        if names {
            svg.text(
                left - 4.0,
                y + cell / 2.0 + 4.0,
                (cell * 0.8).min(11.0),
                Anchor::End,
                "host",
                &format!("{i}: {}", map.labels[i]),
            );
        } else if i % 8 == 0 {
            svg.text(
                left - 4.0,
                y + cell,
                9.0,
                Anchor::End,
                "host",
                &i.to_string(),
            );
        }
        if cell >= 40.0 || i % 8 == 0 || names {
            svg.text(
                left + i as f64 * cell + cell / 2.0,
                top - 6.0,
                9.0,
                Anchor::Middle,
                "host",
                &i.to_string(),
            );
        }
        for j in 0..n {
            let x = left + j as f64 * cell;
            if !map.has_cell(i, j) {
                svg.rect(x, y, cell, cell, "self", "#ffffff", "");
                continue;
            }
            let v = map.gbps[i][j];
            svg.rect(
                x,
                y,
                cell,
                cell,
                "link",
                &scale_colour(map.share(v)),
                &map.cell_title(i, j, v),
            );
            if cell >= 40.0 {
                svg.text(
                    x + cell / 2.0 - 3.0,
                    y + cell / 2.0 + 8.0,
                    10.0,
                    Anchor::Middle,
                    "gbps",
                    &format!("{v:.0}"),
                );
            }
            if map.slow(v) {
                // With a figure in the cell, a small ✕ in its top right corner, clear of
                // the figure and of a hop's outline; without, across the cell.
                let (x0, y0, side, w) = if cell >= 40.0 {
                    (x + cell - 16.0, y + 5.0, 10.0, 2.0)
                } else {
                    let m = cell * 0.2;
                    (x + m, y + m, cell - 2.0 * m, (cell / 12.0).max(1.0))
                };
                svg.line((x0, y0), (x0 + side, y0 + side), "slow", "#111", w, "");
                svg.line((x0 + side, y0), (x0, y0 + side), "slow", "#111", w, "");
            }
        }
    }
    for hop in &map.hops {
        svg.outline(
            left + hop.column as f64 * cell,
            top + hop.row as f64 * cell,
            cell,
            cell,
            "hop",
            "#000",
            (cell / 10.0).max(1.5),
        );
    }
    for (stage, at) in &map.cuts {
        let p = map.in_rows(*at) * cell;
        svg.line(
            (left + p, top - 2.0),
            (left + p, top + side),
            "cut",
            "#1f4fd8",
            2.5,
            "6 3",
        );
        svg.line(
            (left, top + p),
            (left + side + 2.0, top + p),
            "cut",
            "#1f4fd8",
            2.5,
            "6 3",
        );
        svg.text(
            left + side + 4.0,
            top + p + 4.0,
            10.0,
            Anchor::Start,
            "cut-label",
            &format!("s{stage}"),
        );
    }
    svg.finish()
}

/// A bandwidth as one digit, 0 (slowest) to 9 (fastest).
fn digit(map: &LinkMap, v: f64) -> char {
    let d = (map.share(v) * 9.0).round().clamp(0.0, 9.0) as u32;
    char::from_digit(d, 10).unwrap_or('?')
}

pub fn text(plan: &Plan, profile: &ClusterProfile) -> String {
    let map = link_map(plan, profile, TEXT_GROUPS);
    let n = map.rows();
    let mut out = format!(
        "Node links: attained bandwidth, {} in node-rank order\n",
        nodes_text(map.order.len())
    );
    if n < 2 {
        out.push_str("  one node: no link crosses the network\n");
        return out;
    }
    out.push_str(&format!(
        "  {:.1}–{:.1} GB/s, median {:.1}; slow: below {:.0} % of the median\n",
        map.min,
        map.max,
        map.median,
        SLOW_SHARE * 100.0
    ));
    for line in map.notes() {
        out.push_str(&fit(&format!("  {line}"), 80));
        out.push('\n');
    }
    let cut_before = |i: usize| {
        map.cuts.iter().any(|(_, at)| {
            let at = map.in_rows(*at);
            at.fract() == 0.0 && at as usize == i
        })
    };
    if n <= 32 {
        out.push_str(
            "  row sends, column receives: 0 (half the fastest or less) to 9 (the fastest),\n  ! slow, | and - where a pipeline stage begins\n",
        );
        for i in 0..n {
            if i > 0 && cut_before(i) {
                out.push_str(&format!("     {}\n", "-".repeat(2 * n)));
            }
            let mut line = format!("  {i:>3}");
            for j in 0..n {
                line.push(if j > 0 && cut_before(j) { '|' } else { ' ' });
                line.push(if !map.has_cell(i, j) {
                    '·'
                } else if map.slow(map.gbps[i][j]) {
                    '!'
                } else {
                    digit(&map, map.gbps[i][j])
                });
            }
            out.push_str(&line);
            out.push('\n');
        }
    }
    let slow = map.slow_links();
    if slow.is_empty() {
        out.push_str("  no slow link\n");
    } else {
        let what = if map.group == 1 {
            "slow link(s)"
        } else {
            "slow group pair(s)"
        };
        out.push_str(&format!("  {} {what}, slowest first:\n", slow.len()));
        for (i, j, v) in slow.iter().take(8) {
            out.push_str(&fit(
                &format!("    {} → {}: {v:.1} GB/s", map.labels[*i], map.labels[*j]),
                80,
            ));
            out.push('\n');
        }
        if slow.len() > 8 {
            out.push_str(&format!("    ... and {} more\n", slow.len() - 8));
        }
    }
    for (stage, at) in &map.cuts {
        let i = (at.floor() as usize).min(map.order.len() - 1);
        out.push_str(&fit(
            &format!("  stage {stage} begins on node rank {i} ({})", map.hosts[i]),
            80,
        ));
        out.push('\n');
    }
    for hop in &map.hops {
        out.push_str(&fit(
            &format!(
                "  critical hop stage {} → {}: {} → {} at {:.1} GB/s",
                hop.from_stage, hop.to_stage, hop.from_host, hop.to_host, hop.gbps
            ),
            80,
        ));
        out.push('\n');
    }
    out
}
