//! `pipette doctor`'s report for people: one row per node (identical rows merged under a
//! hostlist), fitted to 80 columns, the NCCL settings, then one line per finding with its
//! fix; and for tools, one JSON object. Pure.

use std::path::Path;

use comfy_table::{presets::NOTHING, ColumnConstraint, ContentArrangement, Row, Table, Width};

use super::{compress_hosts, WIDTH};
use crate::doctor::checks::{bytes_text, gpus_text, group_by, nccl_text, Check, Finding, Severity};
use crate::doctor::facts::{Disk, Gpus, NodeFacts, Reach, Torchrun};

/// The name and version of `pipette doctor --json`'s object.
const SCHEMA: &str = "pipette-doctor";
const SCHEMA_VERSION: u32 = 1;

/// `pipette doctor --json`'s object: every node's facts, the findings and the exit code.
pub fn json(
    nodes: &[NodeFacts],
    findings: &[Finding],
    transport: &str,
    run_dir: &Path,
    exit_code: i32,
) -> serde_json::Value {
    serde_json::json!({
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "transport": transport,
        "run_dir": run_dir.display().to_string(),
        "nodes": nodes,
        "findings": findings,
        "exit_code": exit_code,
    })
}

const HEADERS: [&str; 8] = [
    "NODES", "STATUS", "PYTHON", "TORCH", "MCORE", "SKEW", "FREE", "GPUS",
];
const NODES: usize = 0;
const GPUS: usize = 7;
/// The space between two columns.
const GAP: u16 = 2;

/// The whole report: table, NCCL settings, findings and a summary line.
pub fn render(nodes: &[NodeFacts], findings: &[Finding], transport: &str) -> String {
    let (mut out, cut_gpus) = table(nodes, findings);
    let mut below = String::new();
    if cut_gpus {
        below.push_str(&gpu_lines(nodes));
    }
    below.push_str(&python_lines(nodes));
    below.push_str(&nccl_lines(nodes));
    if !below.is_empty() {
        out.push('\n');
        out.push_str(&below);
    }
    if !findings.is_empty() {
        out.push('\n');
    }
    for f in findings {
        let label = match f.severity {
            Severity::Problem => "problem",
            Severity::Warning => "warning",
        };
        out.push_str(&format!(
            "{label}: {}: {}\n  fix: {}\n",
            compress_hosts(&f.hosts),
            f.what,
            f.fix
        ));
    }
    let count = |s: Severity| findings.iter().filter(|f| f.severity == s).count();
    let (problems, warnings) = (count(Severity::Problem), count(Severity::Warning));
    out.push_str(&format!(
        "\n{} node{} checked over {transport}: {}, {}\n",
        nodes.len(),
        plural(nodes.len()),
        match problems {
            0 => "no problem".to_string(),
            n => format!("{n} problem{}", plural(n)),
        },
        match warnings {
            0 => "no warning".to_string(),
            n => format!("{n} warning{}", plural(n)),
        },
    ));
    printable(&out)
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The table: a row per group of nodes whose cells are all alike. A host list wider than
/// its column gets a line of its own (wrapped at its commas), the row below it. Also says
/// whether a GPUS cell was cut short. Laid out by comfy-table; which columns give way, and
/// how far, is [`fit`]'s.
pub fn table(nodes: &[NodeFacts], findings: &[Finding]) -> (String, bool) {
    let mut rows: Vec<(Vec<String>, [String; 7])> = Vec::new();
    for node in nodes {
        let cells = cells(node, findings);
        match rows.iter_mut().find(|(_, c)| *c == cells) {
            Some((hosts, _)) => hosts.push(node.host.clone()),
            None => rows.push((vec![node.host.clone()], cells)),
        }
    }
    let lines: Vec<Vec<String>> = std::iter::once(HEADERS.map(String::from).to_vec())
        .chain(rows.into_iter().map(|(hosts, cells)| {
            std::iter::once(compress_hosts(&hosts))
                .chain(cells)
                .map(|cell| printable(&cell))
                .collect()
        }))
        .collect();
    let widths = fit(&lines);
    let mut table = Table::new();
    // One line a row, whatever the cells hold (a cell of wide characters is cut, not
    // wrapped): the host lines go above the rows by their index.
    table
        .load_preset(NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_truncation_indicator("…");
    // Each host list too wide for its column, on a line of its own above its row.
    let mut above: Vec<Vec<String>> = Vec::new();
    for line in &lines {
        let mut cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .map(|(cell, width)| truncate(cell, *width))
            .collect();
        above.push(match line[NODES].chars().count() > widths[NODES] {
            true => {
                cells[NODES] = String::new();
                wrap_hosts(&line[NODES], WIDTH)
            }
            false => Vec::new(),
        });
        let mut row = Row::from(cells);
        row.max_height(1);
        table.add_row(row);
    }
    for (i, column) in table.column_iter_mut().enumerate() {
        let gap = if i == 0 { 0 } else { GAP };
        column.set_padding((gap, 0));
        column.set_constraint(ColumnConstraint::Absolute(Width::Fixed(
            u16::try_from(widths[i] + usize::from(gap)).unwrap_or(u16::MAX),
        )));
    }
    let mut out = String::new();
    for (hosts, row) in above.iter().zip(table.lines()) {
        for part in hosts {
            out.push_str(part);
            out.push('\n');
        }
        out.push_str(row.trim_end());
        out.push('\n');
    }
    let cut_gpus = lines.iter().any(|l| l[GPUS].chars().count() > widths[GPUS]);
    (out, cut_gpus)
}

/// How far each column may shrink when the table is too wide, in the order they give way.
const SHRINK: [(usize, usize); 5] = [(GPUS, 7), (NODES, 10), (3, 8), (4, 6), (2, 6)];

/// Column widths: each column's widest cell; while the table is wider than [`WIDTH`], the
/// columns of [`SHRINK`] give way in turn (their cells cut with `…`, a host list moved to
/// its own line).
fn fit(lines: &[Vec<String>]) -> Vec<usize> {
    let mut widths: Vec<usize> = (0..HEADERS.len())
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let gaps = usize::from(GAP) * (widths.len() - 1);
    let total = |w: &[usize]| w.iter().sum::<usize>() + gaps;
    for (column, least) in SHRINK {
        let over = total(&widths).saturating_sub(WIDTH);
        let least = least.max(HEADERS[column].len()).min(widths[column]);
        widths[column] = widths[column].saturating_sub(over).max(least);
    }
    widths
}

/// A host list in lines of at most `width`, broken after the commas between its items
/// (never inside brackets); an item wider than a line stays whole.
fn wrap_hosts(list: &str, width: usize) -> Vec<String> {
    let mut items: Vec<String> = Vec::new();
    let mut depth = 0usize;
    let mut item = String::new();
    for c in list.chars() {
        item.push(c);
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => items.push(std::mem::take(&mut item)),
            _ => {}
        }
    }
    items.push(item);
    let mut lines: Vec<String> = vec![String::new()];
    for item in items.into_iter().filter(|i| !i.is_empty()) {
        let last = lines.last_mut().expect("one line at least");
        if !last.is_empty() && last.chars().count() + item.chars().count() > width {
            lines.push(item);
        } else {
            last.push_str(&item);
        }
    }
    lines
}

/// `text` cut to `width` characters, the cut marked with `…`. (comfy-table's own cut
/// wraps at words first and would leave `8×…` where `8× H10…` fits.)
fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// A node's cells after NODES.
fn cells(node: &NodeFacts, findings: &[Finding]) -> [String; 7] {
    let dash = || "-".to_string();
    let status = status(node, findings);
    if !node.reached() {
        return [status, dash(), dash(), dash(), dash(), dash(), dash()];
    }
    let python = &node.python;
    let ran = python.version.is_some();
    let torch = match (&python.torch, &python.torch_error) {
        (Some(v), _) => v.clone(),
        (None, Some(_)) => "none".into(),
        (None, None) => dash(),
    };
    let mcore = match (&python.megatron_core, ran) {
        (Some(v), _) => v.clone(),
        (None, true) => "none".into(),
        (None, false) => dash(),
    };
    // Whole seconds: the measurement is no finer than half a round trip.
    let skew = node
        .clock
        .map_or_else(dash, |c| match c.seconds.round() as i64 {
            0 => "0s".to_string(),
            s => format!("{s:+}s"),
        });
    let free = match &node.disk {
        Disk::Known { free_bytes, .. } => bytes_text(*free_bytes).replace(".0 ", " "),
        _ => dash(),
    };
    let gpus = match &node.gpus {
        Gpus::Listed { gpus } if !gpus.is_empty() => gpus_text(gpus)
            .replace("NVIDIA ", "")
            .replace("GeForce ", "")
            .replace("Tesla ", ""),
        Gpus::Listed { .. } | Gpus::NoNvidiaSmi => "none (CPU node)".into(),
        Gpus::Failed { .. } => "nvidia-smi failed".into(),
        Gpus::Unknown => dash(),
    };
    [
        status,
        python.version.clone().unwrap_or_else(dash),
        torch,
        mcore,
        skew,
        free,
        gpus,
    ]
}

/// The worst that is said of `node`: unreachable, no torchrun, problem, warning, or ok.
fn status(node: &NodeFacts, findings: &[Finding]) -> String {
    let about: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.hosts.contains(&node.host))
        .collect();
    let problem = |check: Option<Check>| {
        about
            .iter()
            .any(|f| f.severity == Severity::Problem && check.is_none_or(|c| f.check == c))
    };
    let text = if matches!(node.reach, Reach::TimedOut { .. }) {
        "no answer"
    } else if problem(Some(Check::Reach)) {
        "unreachable"
    } else if problem(Some(Check::Torchrun)) {
        "no torchrun"
    } else if problem(None) {
        "problem"
    } else if !about.is_empty() {
        "warning"
    } else {
        "ok"
    };
    text.to_string()
}

/// The GPUs in full, grouped by nodes alike (for a table too narrow to show them).
fn gpu_lines(nodes: &[NodeFacts]) -> String {
    let reached: Vec<&NodeFacts> = nodes.iter().filter(|n| n.reached()).collect();
    let groups = group_by(&reached, |node| match &node.gpus {
        Gpus::Listed { gpus } if !gpus.is_empty() => Some(gpus_text(gpus)),
        Gpus::Listed { .. } | Gpus::NoNvidiaSmi => Some("none (CPU node)".into()),
        Gpus::Failed { why } => Some(format!("nvidia-smi failed: {why}")),
        Gpus::Unknown => None,
    });
    groups
        .into_iter()
        .map(|(text, hosts)| format!("GPUs on {}: {text}\n", compress_hosts(&hosts)))
        .collect()
}

/// The python whose versions the table shows, grouped by nodes alike: torchrun's (a
/// venv's, found where pipette-run knows to look, when torchrun is not on the PATH).
fn python_lines(nodes: &[NodeFacts]) -> String {
    let reached: Vec<&NodeFacts> = nodes.iter().filter(|n| n.reached()).collect();
    let groups = group_by(&reached, |node| {
        let python = node.python.executable.clone()?;
        Some(match &node.torchrun {
            Torchrun::Missing {
                venv: Some(venv), ..
            } => format!("{python} (of {venv}, not on the PATH)"),
            _ => python,
        })
    });
    groups
        .into_iter()
        .map(|(text, hosts)| format!("python on {}: {text}\n", compress_hosts(&hosts)))
        .collect()
}

/// The `NCCL_*` variables, grouped by nodes alike.
fn nccl_lines(nodes: &[NodeFacts]) -> String {
    let reached: Vec<&NodeFacts> = nodes.iter().filter(|n| n.reached()).collect();
    group_by(&reached, nccl_text)
        .into_iter()
        .map(|(set, hosts)| match set.is_empty() {
            true => format!("NCCL_*: none set on {}\n", compress_hosts(&hosts)),
            false => format!("NCCL_* on {}: {set}\n", compress_hosts(&hosts)),
        })
        .collect()
}

/// `text` with control characters (but line ends) escaped: what nodes print never reaches
/// the terminal as escape sequences.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' => c.to_string(),
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::checks::tests::{good, gpu_node};
    use crate::doctor::checks::{diagnose, Limits};
    use crate::exec::TransportKind;

    /// A GPU node whose versions, NCCL setting and disk make the table wide.
    fn node(host: &str) -> NodeFacts {
        let mut n = gpu_node(host);
        n.python.torch = Some("2.9.0+cu128".into());
        n.nccl.insert("NCCL_IB_HCA".into(), "mlx5_0".into());
        n.disk = Disk::Known {
            dir: "/lustre/runs".into(),
            free_bytes: 1300 << 30,
            writable: true,
        };
        n
    }

    #[test]
    fn alike_nodes_share_a_row_and_every_line_fits_80_columns() {
        let mut nodes: Vec<NodeFacts> = (1..=16)
            .map(|i| node(&format!("gpu-node-{i:03}")))
            .collect();
        nodes[5].python.torch = Some("2.8.0+cu126".into());
        nodes[9] = NodeFacts::unreached(
            "gpu-node-010",
            Reach::Unreachable {
                why: "ssh to gpu-node-010 failed: Connection refused".into(),
            },
        );
        nodes[10].torchrun = Torchrun::Missing {
            name: "torchrun".into(),
            venv: None,
        };
        nodes[11]
            .nccl
            .insert("NCCL_DEBUG".into(), "INFO\u{1b}[31m".into());
        let findings = diagnose(&nodes, &Limits::with_min_free(TransportKind::Ssh, 10 << 30));
        let text = render(&nodes, &findings, "ssh");
        for line in text.lines().take_while(|l| !l.is_empty()) {
            assert!(line.chars().count() <= WIDTH, "{line:?}");
        }
        let table: Vec<&str> = text.lines().take_while(|l| !l.is_empty()).collect();
        assert_eq!(
            table,
            [
                "NODES           STATUS       PYTHON  TORCH        MCORE   SKEW  FREE     GPUS",
                "gpu-node-[001-005,007-009,012-016]",
                "                warning      3.12.1  2.9.0+cu128  0.19.2  0s    1.3 TiB  8× H10…",
                "gpu-node-006    warning      3.12.1  2.8.0+cu126  0.19.2  0s    1.3 TiB  8× H10…",
                "gpu-node-010    unreachable  -       -            -       -     -        -",
                "gpu-node-011    no torchrun  3.12.1  2.9.0+cu128  0.19.2  0s    1.3 TiB  8× H10…",
            ],
            "{text}"
        );
        assert!(
            text.contains(
                "\nGPUs on gpu-node-[001-009,011-016]: 8× NVIDIA H100 80GB HBM3 (80 GiB)\n"
            ),
            "the GPUs in full, the table being too narrow: {text}"
        );
        assert_eq!(
            wrap_hosts("a[1-3,5],bb,c[10-20]", 10),
            ["a[1-3,5],", "bb,", "c[10-20]"]
        );
        assert!(
            text.contains("problem: gpu-node-010: not reached: ssh to gpu-node-010 failed"),
            "{text}"
        );
        assert!(
            text.contains("NCCL_DEBUG=INFO\\u{1b}[31m"),
            "escaped: {text}"
        );
        assert!(!text.contains('\u{1b}'));
        assert!(
            text.ends_with("16 nodes checked over ssh: 2 problems, 2 warnings\n"),
            "{text}"
        );
    }

    #[test]
    fn cpu_nodes_say_so() {
        let mut n = good("localhost");
        n.python.torch = Some("2.9.0+cu128".into());
        n.disk = Disk::Known {
            dir: "/home".into(),
            free_bytes: 1300 << 30,
            writable: true,
        };
        let text = render(std::slice::from_ref(&n), &[], "local");
        assert_eq!(
            text,
            "NODES      STATUS  PYTHON  TORCH        MCORE   SKEW  FREE     GPUS\n\
             localhost  ok      3.12.1  2.9.0+cu128  0.19.2  0s    1.3 TiB  none (CPU node)\n\
             \n\
             python on localhost: /venv/bin/python\n\
             NCCL_*: none set on localhost\n\
             \n\
             1 node checked over local: no problem, no warning\n"
        );
    }
}
