//! The one validation pass: what serde's types cannot say about a profile (matrices that
//! match the node and GPU counts, unique hosts and GPU indices, plausible figures, real
//! dates), checked in document order, each problem named by its JSON path with what to do.
//! The same pass turns the file's shape into the program's types, so a profile is never
//! built before it is known to be valid.
//!
//! How strict a figure is checked depends on where it came from (its provenance): a figure
//! a person wrote (datasheet, estimated, imported) is refused outside the range any real
//! hardware attains, since it is most likely a typo or a unit mistake; a figure the probe
//! measured is what the hardware did, so it is kept however small (a loaded or broken node
//! is exactly what a profile must show; see [`super::slow`]), down to what no measurement
//! can give at all (below one byte or one operation per second: zero, in effect).

use serde_json::Value;

use super::error::{
    count, field_path, index_path, invalid, missing, quote, show_number, there_are, wrong_type,
};
use super::types::{GpusFile, LinksFile, ProfileFile};
use super::{
    AllRails, ClusterProfile, GpuInventory, GpuSpec, LinkMatrix, MeasuredPerf, NodeProfile,
    ProfileError, Provenance, Source, MAX_PLAUSIBLE_GB_PER_S, MIN_MEASURABLE_GB_PER_S,
    MIN_MEASURABLE_TFLOPS, MIN_PLAUSIBLE_GB_PER_S, TFLOPS_RANGE,
};

/// What to write when `nodes[i].gpu_links` is missing (also serde's missing field).
pub(crate) const GPU_LINKS_HINT: &str = "give the GPU-pair bandwidths in GB/s: {\"provenance\": {...}, \"gb_per_s\": [[...]]}, one row per GPU";

/// How a figure is checked, by where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// Written by a person or another tool: refused outside the plausible range.
    Plausible,
    /// Measured on these nodes: kept down to what a measurement can give at all.
    Measured,
}

impl Check {
    pub(crate) fn of(provenance: &Provenance) -> Check {
        match provenance.source {
            Source::Measured => Check::Measured,
            Source::Datasheet | Source::Imported | Source::Estimated => Check::Plausible,
        }
    }
}

/// Validates a profile file and builds the profile it describes.
pub(crate) fn check(file: ProfileFile, origin: &str) -> Result<ClusterProfile, ProfileError> {
    if file.nodes.is_empty() {
        return Err(invalid(
            origin,
            "nodes",
            "is empty (list at least one node)".into(),
        ));
    }
    let hosts: Vec<String> = file.nodes.iter().map(|n| n.host.clone()).collect();
    check_hosts(origin, &hosts, |i| format!("nodes[{i}].host"))?;

    let mut nodes = Vec::with_capacity(file.nodes.len());
    for (n, node) in file.nodes.into_iter().enumerate() {
        let gpus_path = format!("nodes[{n}].gpus");
        let links_path = format!("nodes[{n}].gpu_links");
        let gpus = match (node.gpus, node.gpu_links) {
            (GpusFile::Unknown, None) => GpuInventory::Unknown,
            (GpusFile::Unknown, Some(_)) => {
                return Err(invalid(
                    origin,
                    &links_path,
                    format!(
                    "is given but {gpus_path} is \"unknown\" (list the GPUs, or remove gpu_links)"
                ),
                ))
            }
            (GpusFile::List(gpus), links) => {
                if gpus.is_empty() {
                    return Err(invalid(
                        origin,
                        &gpus_path,
                        "is empty (list the node's GPUs, or write \"unknown\" to have them profiled)"
                            .into(),
                    ));
                }
                let mut first_of: std::collections::HashMap<_, usize> =
                    std::collections::HashMap::new();
                for (j, gpu) in gpus.iter().enumerate() {
                    if let Some(&first) = first_of.get(&gpu.index) {
                        return Err(invalid(
                            origin,
                            &format!("{gpus_path}[{j}].index"),
                            format!(
                                "repeats index {}, already at {gpus_path}[{first}] (list each GPU once)",
                                gpu.index
                            ),
                        ));
                    }
                    first_of.insert(gpu.index, j);
                    check_gpu(origin, &format!("{gpus_path}[{j}]"), gpu)?;
                }
                let Some(links) = links else {
                    return Err(missing(origin, &links_path, GPU_LINKS_HINT.into()));
                };
                let shape = MatrixShape {
                    size: gpus.len(),
                    count: format!("the node has {}", count(gpus.len(), "GPU")),
                    per: "GPU",
                    order: gpus_path,
                };
                let labels: Vec<String> = gpus
                    .iter()
                    .map(|g| format!("GPU {} of {}", g.index, quote(&node.host)))
                    .collect();
                let links = link_matrix(origin, &links_path, links, &shape, &labels)?;
                GpuInventory::Known { gpus, links }
            }
        };
        nodes.push(NodeProfile {
            host: node.host,
            gpus,
            nvlink_domain: node.nvlink_domain.filter(|d| !d.trim().is_empty()),
        });
    }

    let shape = MatrixShape {
        size: nodes.len(),
        count: there_are(nodes.len(), "node"),
        per: "node",
        order: "nodes".into(),
    };
    let labels: Vec<String> = hosts.iter().map(|h| quote(h)).collect();
    let node_links = link_matrix(origin, "node_links", file.node_links, &shape, &labels)?;
    for (i, perf) in file.measured_perf.iter().enumerate() {
        check_measured_perf(origin, &index_path("measured_perf", i), perf)?;
    }
    Ok(ClusterProfile {
        note: file.note,
        nodes,
        node_links,
        measured_perf: file.measured_perf,
    })
}

/// A sweep section: a GPU name, and every figure a positive throughput, bandwidth or time.
fn check_measured_perf(origin: &str, path: &str, perf: &MeasuredPerf) -> Result<(), ProfileError> {
    if perf.gpu.trim().is_empty() {
        return Err(invalid(
            origin,
            &field_path(path, "gpu"),
            "is empty (give the device name the GPUs of this profile carry)".into(),
        ));
    }
    let check = Check::of(&perf.provenance);
    for (i, g) in perf.gemms.iter().enumerate() {
        let at = index_path(&field_path(path, "gemms"), i);
        if g.m == 0 || g.n == 0 || g.k == 0 {
            return Err(invalid(
                origin,
                &at,
                "has a zero dimension (m, n and k are at least 1)".into(),
            ));
        }
        check_tflops(origin, &field_path(&at, "tflops"), g.tflops, check)?;
    }
    for (i, a) in perf.attention.iter().enumerate() {
        let at = index_path(&field_path(path, "attention"), i);
        check_tflops(origin, &field_path(&at, "tflops"), a.tflops, check)?;
    }
    let positive = |at: String, x: f64, what: &str| {
        if x.is_finite() && x > 0.0 {
            Ok(())
        } else {
            Err(invalid(
                origin,
                &at,
                format!("is {} (give a positive {what})", show_number(x)),
            ))
        }
    };
    if let Some(hbm) = perf.hbm_gb_per_s {
        positive(field_path(path, "hbm_gb_per_s"), hbm, "bandwidth in GB/s")?;
    }
    for (i, c) in perf.collectives.iter().enumerate() {
        let at = index_path(&field_path(path, "collectives"), i);
        positive(field_path(&at, "us"), c.us, "time in microseconds")?;
    }
    check_provenance(origin, &field_path(path, "provenance"), &perf.provenance)
}

/// A link matrix of `shape`, every off-diagonal cell a bandwidth checked as its provenance
/// says; `labels` name the endpoints in the messages. In full (`gb_per_s`) anywhere;
/// sampled (`node_gb_per_s` and `pairs`) in `node_links` only.
fn link_matrix(
    origin: &str,
    path: &str,
    links: LinksFile,
    shape: &MatrixShape,
    labels: &[String],
) -> Result<LinkMatrix, ProfileError> {
    check_provenance(origin, &field_path(path, "provenance"), &links.provenance)?;
    let cells_path = field_path(path, "gb_per_s");
    let check = (Unit::GbPerS, Check::of(&links.provenance));
    let matrix = match (links.gb_per_s, links.node_gb_per_s, links.pairs) {
        (Some(rows), None, None) => {
            let read = |at: &str, cell: &Option<f64>| {
                cell.ok_or_else(|| wrong_type(origin, at, &Value::Null, "a number in GB/s"))
            };
            let cells = bandwidth_cells(origin, &cells_path, &rows, shape, check, labels, read)?;
            LinkMatrix::from_cells(shape.size, cells, links.provenance)
        }
        (None, None, None) => {
            return Err(missing(
                origin,
                &cells_path,
                "give the bandwidths in GB/s, one row per sender, one column per receiver".into(),
            ))
        }
        (Some(_), _, _) => {
            return Err(invalid(
                origin,
                &cells_path,
                "is given beside node_gb_per_s or pairs (give the whole matrix, or a figure per \
                 node and the measured pairs, not both)"
                    .into(),
            ))
        }
        (None, per_node, pairs) => {
            if path != "node_links" {
                let field = if per_node.is_some() {
                    "node_gb_per_s"
                } else {
                    "pairs"
                };
                return Err(invalid(
                    origin,
                    &field_path(path, field),
                    "belongs to node_links only (give the GPU pairs in gb_per_s)".into(),
                ));
            }
            let Some(per_node) = per_node else {
                return Err(missing(
                    origin,
                    &field_path(path, "node_gb_per_s"),
                    "beside pairs, give each node's bandwidth in GB/s, in the order of nodes: \
                     what its pairs not listed attain"
                        .into(),
                ));
            };
            let sample = Sample {
                per_node,
                pairs: pairs.unwrap_or_default(),
                provenance: links.provenance,
            };
            sampled_links(origin, path, sample, shape, check, labels)?
        }
    };
    let nics_at = field_path(path, "nics_per_node");
    let problem = match links.nics_per_node {
        Some(_) if path != "node_links" => Some("belongs to node_links only (remove it here)"),
        Some(0) => Some("is 0 (give the NICs of every node, at least 1)"),
        _ => None,
    };
    if let Some(problem) = problem {
        return Err(ProfileError::InvalidValue {
            origin: origin.to_string(),
            path: nics_at,
            problem: problem.to_string(),
        });
    }
    if let Some(rails) = &links.all_rails {
        check_all_rails(origin, path, rails)?;
    }
    Ok(matrix
        .with_nics_per_node(links.nics_per_node)
        .with_all_rails(links.all_rails))
}

/// `node_links.all_rails`: node links only, at least one rail, both figures positive and
/// finite; the rails together may attain less than rails × one (that is what it measures)
/// but not more than the plausible ceiling of as many links.
fn check_all_rails(origin: &str, path: &str, rails: &AllRails) -> Result<(), ProfileError> {
    let at = field_path(path, "all_rails");
    let problem = if path != "node_links" {
        Some((
            at.clone(),
            "belongs to node_links only (remove it here)".to_owned(),
        ))
    } else if rails.rails == 0 {
        Some((
            field_path(&at, "rails"),
            "is 0 (give the rank pairs that streamed at once, at least 1)".to_owned(),
        ))
    } else {
        let ceiling = MAX_PLAUSIBLE_GB_PER_S * f64::from(rails.rails);
        [
            ("gb_per_s", rails.gb_per_s, ceiling),
            (
                "one_rail_gb_per_s",
                rails.one_rail_gb_per_s,
                MAX_PLAUSIBLE_GB_PER_S,
            ),
        ]
        .into_iter()
        .find(|(_, v, max)| !(v.is_finite() && *v > 0.0 && v <= max))
        .map(|(field, value, max)| {
            (
                field_path(&at, field),
                format!(
                    "is {} (give the attained GB/s, above 0 and at most {}; measure the rails \
                     again with pipette-run profile --reprofile)",
                    show_number(value),
                    show_number(max)
                ),
            )
        })
    };
    match problem {
        Some((path, problem)) => Err(ProfileError::InvalidValue {
            origin: origin.to_string(),
            path,
            problem,
        }),
        None => Ok(()),
    }
}

/// Sampled node links as a file gives them.
struct Sample {
    per_node: Vec<f64>,
    pairs: Vec<(usize, usize, f64)>,
    provenance: Provenance,
}

/// Sampled links: one figure per endpoint, then each measured pair `[from, to, GB/s]` with
/// endpoints in range, distinct and listed once. Linear in the endpoints and pairs: a
/// path is written only for a message.
fn sampled_links(
    origin: &str,
    path: &str,
    sample: Sample,
    shape: &MatrixShape,
    (unit, check): (Unit, Check),
    labels: &[String],
) -> Result<LinkMatrix, ProfileError> {
    let per_path = field_path(path, "node_gb_per_s");
    if sample.per_node.len() != shape.size {
        return Err(ProfileError::MatrixShape {
            origin: origin.into(),
            path: per_path,
            problem: format!(
                "has {} but {} (one figure per {}, in the order of {})",
                count(sample.per_node.len(), "figure"),
                shape.count,
                shape.per,
                shape.order
            ),
        });
    }
    for (i, &value) in sample.per_node.iter().enumerate() {
        if check_bandwidth(origin, "", value, unit, check, &labels[i], "any node").is_err() {
            let at = index_path(&per_path, i);
            check_bandwidth(origin, &at, value, unit, check, &labels[i], "any node")?;
        }
    }
    let pairs_path = field_path(path, "pairs");
    let mut seen = std::collections::HashMap::with_capacity(sample.pairs.len());
    for (k, &(from, to, value)) in sample.pairs.iter().enumerate() {
        let at = || index_path(&pairs_path, k);
        let endpoint = |i: usize| (i < shape.size).then(|| labels[i].as_str());
        let (Some(a), Some(b)) = (endpoint(from), endpoint(to)) else {
            return Err(invalid(
                origin,
                &at(),
                format!(
                    "names {} {}, but {} (number them from 0 in the order of {})",
                    shape.per,
                    from.max(to),
                    shape.count,
                    shape.order
                ),
            ));
        };
        if from == to {
            return Err(invalid(
                origin,
                &at(),
                format!(
                    "is a {} paired with itself (list pairs of distinct {}s)",
                    shape.per, shape.per
                ),
            ));
        }
        if let Some(first) = seen.insert((from, to), k) {
            return Err(invalid(
                origin,
                &at(),
                format!(
                    "repeats the pair from {a} to {b}, already at {} (list each pair once)",
                    index_path(&pairs_path, first)
                ),
            ));
        }
        if check_bandwidth(origin, "", value, unit, check, a, b).is_err() {
            check_bandwidth(origin, &index_path(&at(), 2), value, unit, check, a, b)?;
        }
    }
    LinkMatrix::sampled(sample.per_node, sample.pairs, sample.provenance).ok_or_else(|| {
        invalid(
            origin,
            &pairs_path,
            "names a node outside the profile".into(),
        )
    })
}

/// A GPU's own figures: a name, memory, TFLOPS in range, real dates.
pub(crate) fn check_gpu(origin: &str, path: &str, gpu: &GpuSpec) -> Result<(), ProfileError> {
    if gpu.name.trim().is_empty() {
        return Err(invalid(
            origin,
            &field_path(path, "name"),
            "is empty (give the GPU model, e.g. \"A100-SXM4-80GB\")".into(),
        ));
    }
    if gpu
        .name
        .chars()
        .any(|c| c.is_control() || crate::log::is_format_char(c))
    {
        return Err(invalid(
            origin,
            &field_path(path, "name"),
            format!(
                "is {:?}, which holds a control or invisible format character (write the GPU model as nvidia-smi prints it)",
                gpu.name
            ),
        ));
    }
    if gpu.memory_bytes == 0 {
        return Err(ProfileError::ZeroMemory {
            origin: origin.into(),
            path: field_path(path, "memory_bytes"),
        });
    }
    let peak = field_path(path, "peak_tflops");
    // A CPU stand-in's peak is the throughput it measured, so its provenance says measured.
    let check = Check::of(&gpu.provenance);
    check_tflops(
        origin,
        &field_path(&peak, "fp16"),
        gpu.peak_tflops.fp16,
        check,
    )?;
    for (key, figure) in [
        ("bf16", gpu.peak_tflops.bf16),
        ("fp8", gpu.peak_tflops.fp8),
        ("fp4", gpu.peak_tflops.fp4),
    ] {
        if let Some(tflops) = figure {
            check_tflops(origin, &field_path(&peak, key), tflops, check)?;
        }
    }
    for (i, measured) in gpu.measured_tflops.iter().enumerate() {
        let at = gpu.measured_path(path, i);
        if gpu.measured_tflops[..i]
            .iter()
            .any(|m| m.dtype == measured.dtype)
        {
            return Err(invalid(
                origin,
                &field_path(&at, "dtype"),
                format!(
                    "is {:?} a second time (give one figure per dtype)",
                    measured.dtype.as_str()
                ),
            ));
        }
        let check = Check::of(&measured.provenance);
        check_tflops(origin, &field_path(&at, "tflops"), measured.tflops, check)?;
        check_provenance(origin, &field_path(&at, "provenance"), &measured.provenance)?;
    }
    check_provenance(origin, &field_path(path, "provenance"), &gpu.provenance)
}

fn check_tflops(origin: &str, path: &str, tflops: f64, check: Check) -> Result<(), ProfileError> {
    let (low, high) = match check {
        Check::Plausible => TFLOPS_RANGE,
        Check::Measured => (MIN_MEASURABLE_TFLOPS, TFLOPS_RANGE.1),
    };
    if (low..=high).contains(&tflops) {
        return Ok(());
    }
    let problem = match check {
        Check::Plausible => format!(
            "is {} (give a TFLOPS figure from {low} to {high}, e.g. 312.0 for an A100 in bf16)",
            show_number(tflops)
        ),
        Check::Measured => format!(
            "is {}, which no measurement gives (a measured throughput lies from {} to {high} TFLOPS; measure again)",
            show_number(tflops),
            show_number(low)
        ),
    };
    Err(invalid(origin, path, problem))
}

fn check_provenance(origin: &str, path: &str, provenance: &Provenance) -> Result<(), ProfileError> {
    match &provenance.date {
        Some(date) if !is_iso_date(date) => Err(invalid(
            origin,
            &field_path(path, "date"),
            format!(
                "is {}, not a date (write YYYY-MM-DD, e.g. \"2024-05-31\")",
                quote(date)
            ),
        )),
        _ => Ok(()),
    }
}

/// `YYYY-MM-DD` with a real month and day (leap years included).
fn is_iso_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return false;
    }
    let digits = |range: std::ops::Range<usize>| -> Option<u32> {
        let part = &text[range];
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    };
    let (Some(year), Some(month), Some(day)) = (digits(0..4), digits(5..7), digits(8..10)) else {
        return false;
    };
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

/// Host names must pass [`crate::cluster::host_name_problem`] (non-empty, at most 253 bytes,
/// free of blanks and control characters) and be unique.
pub(crate) fn check_hosts(
    origin: &str,
    hosts: &[String],
    path_of: impl Fn(usize) -> String,
) -> Result<(), ProfileError> {
    // The node list's cap holds for a profile too: 1,000,001 nodes were read.
    if hosts.len() > crate::cluster::MAX_NODES {
        return Err(invalid(
            origin,
            &path_of(crate::cluster::MAX_NODES),
            format!(
                "is past the {} nodes a cluster may have (list at most {})",
                crate::cluster::MAX_NODES,
                crate::cluster::MAX_NODES
            ),
        ));
    }
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (i, host) in hosts.iter().enumerate() {
        if let Some(problem) = crate::cluster::host_name_problem(host) {
            return Err(invalid(
                origin,
                &path_of(i),
                format!(
                    "is {}, not a host name: it {problem} (write the name the launcher reaches the node by, without blanks)",
                    quote(host)
                ),
            ));
        }
        if let Some(&first) = seen.get(&crate::cluster::host_key(host)) {
            return Err(ProfileError::DuplicateHost {
                origin: origin.into(),
                path: path_of(i),
                host: quote(host),
                first: path_of(first),
            });
        }
        seen.insert(crate::cluster::host_key(host), i);
    }
    Ok(())
}

/// The unit a file's bandwidths are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    GbPerS,
    MbPerS,
}

impl Unit {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Unit::GbPerS => "GB/s",
            Unit::MbPerS => "MB/s",
        }
    }

    pub(crate) fn example(self) -> &'static str {
        match self {
            Unit::GbPerS => "19.6",
            Unit::MbPerS => "19600",
        }
    }

    /// The accepted range in this unit: plausible for a figure written by hand, what a
    /// measurement can give at all for a measured one.
    fn range(self, check: Check) -> (f64, f64) {
        let scale = match self {
            Unit::GbPerS => 1.0,
            Unit::MbPerS => 1000.0,
        };
        let min = match check {
            Check::Plausible => MIN_PLAUSIBLE_GB_PER_S,
            Check::Measured => MIN_MEASURABLE_GB_PER_S,
        };
        (min * scale, MAX_PLAUSIBLE_GB_PER_S * scale)
    }
}

/// One link's bandwidth must be finite, positive and within [`Unit::range`].
fn check_bandwidth(
    origin: &str,
    path: &str,
    value: f64,
    unit: Unit,
    check: Check,
    from: &str,
    to: &str,
) -> Result<(), ProfileError> {
    let (min, max) = unit.range(check);
    if !value.is_finite() {
        Err(ProfileError::NotANumber {
            origin: origin.into(),
            path: path.into(),
            found: show_number(value),
            unit: unit.as_str(),
            example: unit.example(),
        })
    } else if value < 0.0 {
        Err(ProfileError::NegativeBandwidth {
            origin: origin.into(),
            path: path.into(),
            value,
            unit: unit.as_str(),
        })
    } else if value == 0.0 {
        Err(ProfileError::ZeroBandwidth {
            origin: origin.into(),
            path: path.into(),
            from: from.into(),
            to: to.into(),
        })
    } else if !(min..=max).contains(&value) {
        // Too large is a unit mistake whatever the source: the hint gives the range people
        // write. Too small for a measured figure: the floor of what a measurement gives.
        let min = if value > max {
            unit.range(Check::Plausible).0
        } else {
            min
        };
        Err(ProfileError::ImplausibleBandwidth {
            origin: origin.into(),
            path: path.into(),
            value,
            unit: unit.as_str(),
            min,
            max,
        })
    } else {
        Ok(())
    }
}

/// What a matrix must look like, in words for the messages.
pub(crate) struct MatrixShape {
    /// Rows and columns expected.
    pub size: usize,
    /// Why that many, e.g. "there are 4 nodes", "the node has 8 GPUs".
    pub count: String,
    /// One row per what: "node", "GPU", "host".
    pub per: &'static str,
    /// The JSON path of the list the rows follow.
    pub order: String,
}

/// The bandwidths of a matrix of `shape`, row-major: the diagonal, which no format uses, as
/// 0; every other cell as `read` gives it (from its path and value), checked as a bandwidth
/// in `unit` from `labels[i]` to `labels[j]`.
pub(crate) fn bandwidth_cells<C>(
    origin: &str,
    path: &str,
    rows: &[Vec<C>],
    shape: &MatrixShape,
    (unit, check): (Unit, Check),
    labels: &[String],
    read: impl Fn(&str, &C) -> Result<f64, ProfileError>,
) -> Result<Vec<f64>, ProfileError> {
    check_square(origin, path, rows, shape)?;
    let mut cells = Vec::with_capacity(shape.size * shape.size);
    for (i, row) in rows.iter().enumerate() {
        for (j, cell) in row.iter().enumerate() {
            if i == j {
                cells.push(0.0);
                continue;
            }
            let checked = |at: &str| {
                let value = read(at, cell)?;
                check_bandwidth(origin, at, value, unit, check, &labels[i], &labels[j])?;
                Ok::<f64, ProfileError>(value)
            };
            // A cell's path is written only for a message (the check is pure, so the
            // second call fails as the first did): formatting n² paths was most of the
            // time a 2,000-node profile took to read.
            let value = match checked("") {
                Ok(value) => value,
                Err(_) => checked(&format!("{path}[{i}][{j}]"))?,
            };
            cells.push(value);
        }
    }
    Ok(cells)
}

/// `rows` must have `shape.size` rows of `shape.size` cells each.
fn check_square<C>(
    origin: &str,
    path: &str,
    rows: &[Vec<C>],
    shape: &MatrixShape,
) -> Result<(), ProfileError> {
    let per = shape.per;
    let problem = |path: String, found: String, what: &str| ProfileError::MatrixShape {
        origin: origin.into(),
        path,
        problem: format!(
            "has {found} but {} (one {what} per {per}, in the order of {})",
            shape.count, shape.order
        ),
    };
    if rows.len() != shape.size {
        return Err(problem(path.into(), count(rows.len(), "row"), "row"));
    }
    match rows.iter().position(|row| row.len() != shape.size) {
        Some(i) => Err(problem(
            index_path(path, i),
            count(rows[i].len(), "column"),
            "column",
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// N3: a profile of 1,000,001 nodes passed the node list's documented cap.
    #[test]
    fn n3_a_profile_past_the_node_cap_is_refused() {
        let cap = crate::cluster::MAX_NODES;
        let hosts: Vec<String> = (0..=cap).map(|i| format!("n{i}")).collect();
        let e = check_hosts("c.json", &hosts, |i| format!("nodes[{i}].host")).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("nodes[1000000]"), "{text}");
        assert!(text.contains("at most 1000000"), "{text}");
        assert!(check_hosts("c.json", &hosts[..cap], |i| format!("nodes[{i}].host")).is_ok());
    }

    #[test]
    fn dates_must_be_real() {
        for good in ["2024-05-31", "2024-02-29", "2000-02-29", "1999-12-01"] {
            assert!(is_iso_date(good), "{good}");
        }
        for bad in [
            "2024-5-31",
            "2023-02-29",
            "1900-02-29",
            "2024-13-01",
            "2024-04-31",
            "2024-00-10",
            "yesterday",
            "2024-05-3x",
            "+024-05-31",
        ] {
            assert!(!is_iso_date(bad), "{bad}");
        }
    }
}
