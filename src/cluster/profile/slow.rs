//! Measured figures far below their peers: a GPU that computes far less than the other GPUs
//! of its model, a link far slower than the other links of its matrix, or a figure below
//! what any working part attains. Validation keeps such figures (they are what the node
//! did: a loaded, throttled or broken node is what a profile is for); this module names
//! them, so that people see them and the profile file says so next to the figure. The
//! planner needs no flag: it plans with the figure itself, and so counts a slow part as slow.
//!
//! Only measured figures are judged: a datasheet or an estimate is not a node's behaviour.

use std::fmt;

use super::{
    ClusterProfile, GpuInventory, LinkMatrix, Provenance, Source, MIN_PLAUSIBLE_GB_PER_S,
    TFLOPS_RANGE,
};

/// A figure is far below its peers under this fraction of their median. Inside one node,
/// links differ by up to ~5x by design (a DGX-1's PCIe pairs attain ~10 GB/s, its NVLink
/// pairs 24-48, median ~24), which this fraction leaves alone.
pub const SLOW_FRACTION: f64 = 0.25;

/// Peers needed (the figure included) before a figure is compared with their median.
const MIN_PEERS: usize = 3;

/// One slow figure.
#[derive(Debug, Clone, PartialEq)]
pub struct SlowPart {
    /// The JSON path of the figure, e.g. `nodes[0].gpus[1].measured_tflops.tflops`.
    pub path: String,
    /// What is slow, by how much, and against what, for people.
    pub finding: String,
}

impl fmt::Display for SlowPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slow: {} ({})", self.finding, self.path)
    }
}

impl ClusterProfile {
    /// Every measured figure far below its peers or below what any working part attains,
    /// GPUs first, in node order.
    pub fn slow_parts(&self) -> Vec<SlowPart> {
        let mut slow = self.slow_gpus();
        for (n, node) in self.nodes.iter().enumerate() {
            if let Some(links) = node.gpu_links() {
                let label = |g: usize| {
                    let index = node.gpus().map_or(g as u32, |gpus| gpus[g].index);
                    format!("GPU {index} of {}", node.host)
                };
                slow.extend(slow_links(links, &format!("nodes[{n}].gpu_links"), label));
            }
        }
        let host = |i: usize| self.nodes[i].host.clone();
        slow.extend(slow_links(&self.node_links, "node_links", host));
        slow
    }

    /// Finds the slow parts and notes each in the provenance of its figure, so the file
    /// says so; returns them. Call once, when the profile is assembled.
    pub fn mark_slow(&mut self) -> Vec<SlowPart> {
        let slow = self.slow_parts();
        for part in &slow {
            let note = format!("slow: {}", part.finding);
            if let Some(provenance) = self.provenance_of(&part.path) {
                provenance.note = Some(match provenance.note.take() {
                    Some(old) => format!("{old}; {note}"),
                    None => note,
                });
            }
        }
        slow
    }

    fn slow_gpus(&self) -> Vec<SlowPart> {
        // (path, GPU model, label, figure) of every measured compute figure.
        let mut figures = Vec::new();
        for (n, node) in self.nodes.iter().enumerate() {
            for (g, gpu) in node.gpus().unwrap_or_default().iter().enumerate() {
                let at = format!("nodes[{n}].gpus[{g}]");
                // The first figure (a GPU's only one, a CPU stand-in's bf16): peers
                // measured alike are compared.
                let figure = match gpu.measured_tflops.first() {
                    Some(m) if m.provenance.source == Source::Measured => {
                        Some((format!("{}.tflops", gpu.measured_path(&at, 0)), m.tflops))
                    }
                    _ if gpu.provenance.source == Source::Measured => {
                        Some((format!("{at}.peak_tflops.fp16"), gpu.peak_tflops.fp16))
                    }
                    _ => None,
                };
                if let Some((path, tflops)) = figure {
                    let label = format!("GPU {} of {} ({})", gpu.index, node.host, gpu.name);
                    figures.push((path, gpu.name.as_str(), label, tflops));
                }
            }
        }
        // The peers of every GPU model, found once (80,000 GPUs are one model's peers).
        let mut by_model: std::collections::HashMap<&str, Vec<f64>> =
            std::collections::HashMap::new();
        for (_, name, _, tflops) in &figures {
            by_model.entry(name).or_default().push(*tflops);
        }
        let peers: std::collections::HashMap<&str, Peers> = by_model
            .into_iter()
            .map(|(name, figures)| (name, Peers::of(figures)))
            .collect();
        let mut slow = Vec::new();
        for (path, name, label, tflops) in &figures {
            if let Some(why) = judge(
                *tflops,
                &peers[name],
                TFLOPS_RANGE.0,
                "TFLOPS",
                "GPUs of its model",
            ) {
                slow.push(SlowPart {
                    path: path.clone(),
                    finding: format!("{label} computes {} TFLOPS, {why}", show(*tflops)),
                });
            }
        }
        slow
    }

    /// The provenance that covers the figure at `path` (as [`SlowPart::path`] names it).
    fn provenance_of(&mut self, path: &str) -> Option<&mut Provenance> {
        if path.starts_with("node_links") {
            return Some(&mut self.node_links.provenance);
        }
        let (n, rest) = path.strip_prefix("nodes[")?.split_once(']')?;
        let GpuInventory::Known { gpus, links } =
            &mut self.nodes.get_mut(n.parse::<usize>().ok()?)?.gpus
        else {
            return None;
        };
        if rest.starts_with(".gpu_links") {
            return Some(&mut links.provenance);
        }
        let (g, rest) = rest.strip_prefix(".gpus[")?.split_once(']')?;
        let gpu = gpus.get_mut(g.parse::<usize>().ok()?)?;
        if let Some(rest) = rest.strip_prefix(".measured_tflops") {
            let i = match rest.strip_prefix('[') {
                Some(index) => index.split_once(']')?.0.parse::<usize>().ok()?,
                None => 0,
            };
            gpu.measured_tflops.get_mut(i).map(|m| &mut m.provenance)
        } else {
            Some(&mut gpu.provenance)
        }
    }
}

/// The slow links of one measured matrix at `path`; `label` names an endpoint. Of a
/// sampled matrix, the measured pairs are judged (the other links take their figures).
fn slow_links(matrix: &LinkMatrix, path: &str, label: impl Fn(usize) -> String) -> Vec<SlowPart> {
    if matrix.provenance.source != Source::Measured {
        return Vec::new();
    }
    let peers = Peers::of(matrix.links().map(|(_, _, v)| v).collect());
    matrix
        .links()
        .enumerate()
        .filter_map(|(k, (from, to, v))| {
            let why = judge(
                v,
                &peers,
                MIN_PLAUSIBLE_GB_PER_S,
                "GB/s",
                "links of its matrix",
            )?;
            Some(SlowPart {
                path: if matrix.is_sampled() {
                    format!("{path}.pairs[{k}][2]")
                } else {
                    format!("{path}.gb_per_s[{from}][{to}]")
                },
                finding: format!(
                    "{} to {} attains {} GB/s, {why}",
                    label(from),
                    label(to),
                    show(v)
                ),
            })
        })
        .collect()
}

/// The figures a figure is judged against (itself included): how many, and their median,
/// found once for all of them (a median per figure would be quadratic in the links).
struct Peers {
    count: usize,
    median: f64,
}

impl Peers {
    fn of(figures: Vec<f64>) -> Peers {
        Peers {
            count: figures.len(),
            median: median(&figures),
        }
    }
}

/// Why `value` is slow among `peers`, if it is.
fn judge(value: f64, peers: &Peers, floor: f64, unit: &str, whose: &str) -> Option<String> {
    let Peers { count, median } = *peers;
    if value < floor {
        Some(format!(
            "below {floor} {unit}, less than any working part attains (is the node loaded, throttled or broken?)"
        ))
    } else if count >= MIN_PEERS && value < SLOW_FRACTION * median {
        Some(format!(
            "under a quarter of the median of the {count} {whose} ({} {unit})",
            show(median)
        ))
    } else {
        None
    }
}

pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Four significant digits: enough to see how slow, short enough to read.
fn show(x: f64) -> String {
    super::error::show_number(format!("{x:.3e}").parse().unwrap_or(x))
}

#[cfg(test)]
mod tests {
    use super::super::{GpuSpec, MeasuredTflops, NodeProfile, PeakTflops};
    use super::*;
    use crate::cluster::profile::Dtype;

    fn measured() -> Provenance {
        Provenance::new(Source::Measured).with_date("2026-11-24")
    }

    /// A CPU stand-in as the probe writes it: its peak is the throughput it measured.
    fn cpu(index: u32, tflops: f64) -> GpuSpec {
        GpuSpec {
            index,
            name: "cpu".into(),
            memory_bytes: 1 << 30,
            peak_tflops: PeakTflops::new(Some(tflops), tflops),
            measured_tflops: vec![MeasuredTflops {
                dtype: Dtype::Bf16,
                tflops,
                provenance: measured(),
            }],
            provenance: measured(),
        }
    }

    fn cluster(hosts_tflops: &[(&str, f64)], node_links: Provenance) -> ClusterProfile {
        let n = hosts_tflops.len();
        ClusterProfile {
            measured_perf: Vec::new(),
            note: None,
            nodes: hosts_tflops
                .iter()
                .map(|(host, tflops)| NodeProfile {
                    host: (*host).into(),
                    gpus: GpuInventory::Known {
                        gpus: vec![cpu(0, *tflops)],
                        links: LinkMatrix::uniform(1, 1.0, measured()),
                    },
                    nvlink_domain: None,
                })
                .collect(),
            node_links: LinkMatrix::uniform(n, 2.5, node_links),
        }
    }

    #[test]
    fn a_measured_figure_below_the_old_floor_is_kept_and_reported_slow() {
        // What a loaded 2-core machine measured (issue 17): under 0.001 TFLOPS.
        let mut profile = cluster(&[("node-a", 0.00093238112051)], measured());
        profile.validate("the measured profile").unwrap();
        let slow = profile.mark_slow();
        assert_eq!(slow.len(), 1, "{slow:?}");
        assert_eq!(slow[0].path, "nodes[0].gpus[0].measured_tflops.tflops");
        assert_eq!(
            slow[0].to_string(),
            "slow: GPU 0 of node-a (cpu) computes 0.0009324 TFLOPS, below 0.001 TFLOPS, less \
             than any working part attains (is the node loaded, throttled or broken?) \
             (nodes[0].gpus[0].measured_tflops.tflops)"
        );
        // The file says so next to the figure, and reads back with the figure kept.
        let text = profile.to_json_pretty();
        assert!(
            text.contains("\"note\": \"slow: GPU 0 of node-a (cpu) computes"),
            "{text}"
        );
        let back = ClusterProfile::from_json_str(&text, "cache.json").unwrap();
        assert_eq!(back, profile);
        assert_eq!(
            back.nodes[0].gpus().unwrap()[0].peak_tflops.fp16,
            0.00093238112051
        );
        assert_eq!(back.slow_parts(), slow, "reading it back finds the same");
    }

    #[test]
    fn a_written_figure_below_the_floor_is_still_a_typo() {
        let mut profile = cluster(&[("node-a", 0.00093238112051)], measured());
        if let GpuInventory::Known { gpus, .. } = &mut profile.nodes[0].gpus {
            gpus[0].provenance = Provenance::new(Source::Datasheet);
        }
        let err = profile.validate("cluster.json").unwrap_err().to_string();
        assert_eq!(
            err,
            "cluster.json: nodes[0].gpus[0].peak_tflops.fp16 is 0.00093238112051 (give a \
             TFLOPS figure from 0.001 to 100000, e.g. 312.0 for an A100 in bf16)"
        );
        // A measured figure that no measurement can give is refused too.
        let mut profile = cluster(&[("node-a", 0.0)], measured());
        let err = profile.validate("m.json").unwrap_err().to_string();
        assert!(
            err.contains("fp16 is 0, which no measurement gives"),
            "{err}"
        );
        profile.node_links = LinkMatrix::uniform(1, 1.0, measured());
        profile.nodes[0].gpus = GpuInventory::Known {
            gpus: vec![cpu(0, 1.0)],
            links: LinkMatrix::uniform(1, 1.0, measured()),
        };
        profile.validate("m.json").unwrap();
    }

    #[test]
    fn a_node_far_below_its_peers_is_slow_and_its_peers_are_not() {
        let mut profile = cluster(
            &[("a", 2.0), ("b", 2.1), ("c", 1.9), ("d", 0.3)],
            measured(),
        );
        profile.node_links.set(2, 1, 0.2);
        profile.node_links.set(0, 3, 1.4);
        let slow = profile.slow_parts();
        let paths: Vec<&str> = slow.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "nodes[3].gpus[0].measured_tflops.tflops",
                "node_links.gb_per_s[2][1]"
            ]
        );
        assert!(
            slow[0].finding.ends_with(
                "under a quarter of the median of the 4 GPUs of its model (1.95 TFLOPS)"
            ),
            "{}",
            slow[0].finding
        );
        assert!(
            slow[1].finding.starts_with("c to b attains 0.2 GB/s"),
            "{}",
            slow[1].finding
        );

        // Figures that were not measured are not judged.
        let mut estimated = cluster(
            &[("a", 2.0), ("b", 2.1)],
            Provenance::new(Source::Estimated),
        );
        estimated.node_links.set(0, 1, 0.0001);
        assert_eq!(estimated.slow_parts(), []);
    }

    #[test]
    fn median_is_the_mean_of_two() {
        assert_eq!(median(&[2.0, 4.0]), 3.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[7.0]), 7.0);
        assert!(median(&[]).is_nan());
    }
}
