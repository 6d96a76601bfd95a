//! The link heat map: every ordered node pair (sender row, receiver column, nodes in
//! node-rank order) coloured by the profile's attained bandwidth, links slower than
//! [`SLOW_SHARE`] of the median marked, the pipeline's cuts (where one stage's ranks end
//! and the next one's begin) drawn across, and the hops on the critical path outlined.

use crate::cluster::ClusterProfile;
use crate::plan::Plan;

use super::svg::{scale_colour, Anchor, Svg};
use super::{fit, nodes_in_rank_order, ranks_by_gpu};

/// A link below this share of the median node link is marked slow.
pub const SLOW_SHARE: f64 = 0.8;

/// What the map shows, in node-rank order.
struct LinkMap {
    /// Profile positions of the nodes, in node-rank order.
    order: Vec<usize>,
    hosts: Vec<String>,
    /// `gbps[i][j]`: from the `i`-th node to the `j`-th (0 on the diagonal).
    gbps: Vec<Vec<f64>>,
    min: f64,
    max: f64,
    median: f64,
    /// Where stage `s` (1..pp) begins, in nodes from the left (fractional inside a node).
    cuts: Vec<(usize, f64)>,
    /// Node pairs (positions in `order`) a pipeline hop on the critical path crosses.
    /// (sender, receiver, from stage, to stage).
    hops: Vec<(usize, usize, usize, usize)>,
}

fn link_map(plan: &Plan, profile: &ClusterProfile) -> LinkMap {
    let ranks = ranks_by_gpu(plan, profile);
    let order = nodes_in_rank_order(&ranks);
    let position = |node: usize| order.iter().position(|&n| n == node);
    let size = profile.node_links.size();
    let gbps: Vec<Vec<f64>> = order
        .iter()
        .map(|&a| {
            order
                .iter()
                .map(|&b| {
                    if a != b && a < size && b < size {
                        profile.node_links.get(a, b)
                    } else {
                        0.0
                    }
                })
                .collect()
        })
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
    let c = &plan.config;
    let per_stage = (c.tp * c.dp).max(1);
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
    let hops = plan
        .estimate
        .time
        .pipeline
        .hops
        .iter()
        .filter_map(|h| {
            let (a, b) = (h.activation.from.node, h.activation.to.node);
            (a != b).then_some((position(a)?, position(b)?, h.from_stage, h.to_stage))
        })
        .collect();
    LinkMap {
        hosts: order
            .iter()
            .map(|&n| profile.nodes[n].host.clone())
            .collect(),
        order,
        gbps,
        min: values.first().copied().unwrap_or(0.0),
        max: values.last().copied().unwrap_or(0.0),
        median,
        cuts,
        hops,
    }
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

    fn slow_links(&self) -> Vec<(usize, usize, f64)> {
        let mut out = Vec::new();
        for (i, row) in self.gbps.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                if i != j && self.slow(*v) {
                    out.push((i, j, *v));
                }
            }
        }
        out.sort_by(|a, b| a.2.total_cmp(&b.2));
        out
    }
}

pub fn svg(plan: &Plan, profile: &ClusterProfile) -> String {
    let map = link_map(plan, profile);
    let n = map.order.len();
    let cell = if n <= 16 {
        40.0
    } else if n <= 64 {
        12.0
    } else {
        6.0
    };
    let names = cell >= 12.0;
    let left = if names { 130.0 } else { 60.0 };
    let top = 126.0;
    let side = n as f64 * cell;
    let width = (left + side + 40.0).max(760.0);
    let height = top + side + 50.0;
    let mut svg = Svg::new(width, height);
    svg.title(&format!(
        "Node links: attained bandwidth, {} nodes in node-rank order (row sends, column receives)",
        n
    ));
    if n < 2 {
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
                &format!("{i}: {}", map.hosts[i]),
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
            if i == j {
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
                &format!("{} → {}: {v:.1} GB/s", map.hosts[i], map.hosts[j]),
            );
            if cell >= 40.0 {
                svg.text(
                    x + cell / 2.0,
                    y + cell / 2.0 + 4.0,
                    10.0,
                    Anchor::Middle,
                    "gbps",
                    &format!("{v:.0}"),
                );
            }
            if map.slow(v) {
                let m = cell * 0.2;
                let w = (cell / 12.0).max(1.0);
                svg.line(
                    (x + m, y + m),
                    (x + cell - m, y + cell - m),
                    "slow",
                    "#111",
                    w,
                    "",
                );
                svg.line(
                    (x + cell - m, y + m),
                    (x + m, y + cell - m),
                    "slow",
                    "#111",
                    w,
                    "",
                );
            }
        }
    }
    for (a, b, _, _) in &map.hops {
        svg.outline(
            left + *b as f64 * cell,
            top + *a as f64 * cell,
            cell,
            cell,
            "hop",
            "#000",
            (cell / 10.0).max(1.5),
        );
    }
    for (stage, at) in &map.cuts {
        let p = at * cell;
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
    let map = link_map(plan, profile);
    let n = map.order.len();
    let mut out = format!("Node links: attained bandwidth, {n} nodes in node-rank order\n");
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
    let cut_before = |i: usize| {
        map.cuts
            .iter()
            .any(|(_, at)| at.fract() == 0.0 && *at as usize == i)
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
                line.push(if i == j {
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
        out.push_str(&format!("  {} slow link(s), slowest first:\n", slow.len()));
        for (i, j, v) in slow.iter().take(8) {
            out.push_str(&fit(
                &format!("    {} → {}: {v:.1} GB/s", map.hosts[*i], map.hosts[*j]),
                80,
            ));
            out.push('\n');
        }
        if slow.len() > 8 {
            out.push_str(&format!("    ... and {} more\n", slow.len() - 8));
        }
    }
    for (stage, at) in &map.cuts {
        let i = (at.floor() as usize).min(n - 1);
        out.push_str(&fit(
            &format!("  stage {stage} begins on node rank {i} ({})", map.hosts[i]),
            80,
        ));
        out.push('\n');
    }
    for (a, b, from, to) in &map.hops {
        out.push_str(&fit(
            &format!(
                "  critical hop stage {from} → {to}: {} → {} at {:.1} GB/s",
                map.hosts[*a], map.hosts[*b], map.gbps[*a][*b]
            ),
            80,
        ));
        out.push('\n');
    }
    out
}
