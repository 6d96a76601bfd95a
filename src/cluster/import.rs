//! Readers for bandwidth files written by other tools: the original Pipette bandwidth file
//! and mpiGraph's tables as Pipette kept them. Both measured the network only, so the
//! profiles they give have node links and [`GpuInventory::Unknown`] nodes.
//!
//! Owns recognising a file's format ([`detect`]) and the two foreign layouts. Errors use the
//! JSON paths of the file as written (`bandwidth[2][5]`, `["1"].gpus[3]`).
//!
//! What the original code did, and so what these files hold (yimjinkyu1/date2024_pipette):
//! - Pipette's bandwidth file is written by `strategy/nccl-test/*/round_robin_test.py`: host
//!   names in `"gpus"`, and nccl-tests sendrecv figures in GB/s as strings, the same figure
//!   in both directions; the diagonal holds each host's intra-node figure (Pipette's
//!   annealer reads it for the inner data-parallel cost). We keep the node pairs only.
//! - `mpigraph/log_to_csv.py` writes `{"0": recv table, "1": send table}`; mpiGraph's receive
//!   table has the receiver in the row (MB/s from column to row) and its send table the
//!   sender (MB/s from row to column). Pipette's parser averages the 4×4 rank pairs of each
//!   host pair and fills the diagonal with the row's maximum, an artefact we ignore.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::profile::{
    bandwidth_cells, check_hosts, count, deserialize, field_path, index_path, invalid, median,
    quote, wrong_type, Check, ClusterProfile, Format as Schema, GpuInventory, LinkMatrix,
    MatrixShape, NodeProfile, ProfileError, Provenance, Source, Unit,
};

/// MB/s per GB/s, as Pipette's own reader converts mpiGraph's figures (`MB_to_GB = 1000`).
pub const MB_PER_GB: f64 = 1000.0;

/// The formats [`ClusterProfile::load`] recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `pipette-cluster/1` (or a file that means to be one: it has `schema`, `nodes` or
    /// `node_links`).
    Native,
    /// `{"gpus": [hosts], "bandwidth": [[GB/s]]}`.
    Pipette,
    /// `{"0": {"gpus": ..., "bandwidth": [[MB/s]]}, "1": ...}`.
    MpiGraph,
    Unrecognised,
}

/// Recognises a format by its top-level keys.
pub fn detect(root: &Map<String, Value>) -> Format {
    let has = |key: &str| root.contains_key(key);
    if has("schema") || has("nodes") || has("node_links") {
        Format::Native
    } else if has("gpus") || has("bandwidth") {
        Format::Pipette
    } else if !root.is_empty()
        && root
            .keys()
            .all(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
    {
        Format::MpiGraph
    } else {
        Format::Unrecognised
    }
}

/// A Pipette bandwidth file, or one of mpiGraph's tables. Other keys are ignored, as
/// Pipette's own reader ignores them. Cells are read by [`read_table`]: numbers or numeric
/// strings, and the diagonal is not read at all.
#[derive(Debug, Deserialize)]
struct Table {
    gpus: Vec<String>,
    bandwidth: Vec<Vec<Value>>,
}

/// mpiGraph's two tables, as Pipette's `log_to_csv.py` keys them.
#[derive(Debug, Deserialize)]
struct MpiGraphTables {
    #[serde(rename = "0", default, deserialize_with = "present")]
    receive: Option<Table>,
    #[serde(rename = "1", default, deserialize_with = "present")]
    send: Option<Table>,
}

/// A table that is there must be a table: `"0": null` is refused, not taken for absent.
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Table>, D::Error> {
    Table::deserialize(deserializer).map(Some)
}

/// Reads the original Pipette bandwidth file: `"gpus"` lists the hosts, `"bandwidth"` the
/// attained GB/s from row host to column host, as numbers or as strings such as `"19.6"`.
pub fn pipette_bandwidth(root: &Value, origin: &str) -> Result<ClusterProfile, ProfileError> {
    let table: Table = deserialize(root, origin, Schema::Pipette)?;
    let hosts = check_table_hosts(origin, "", &table)?;
    let cells = read_table(origin, "", &table, Unit::GbPerS)?;
    let provenance = Provenance::new(Source::Imported)
        .with_tool("Pipette bandwidth file (nccl-tests sendrecv)")
        .with_note(format!(
            "read from {origin}; GB/s; the diagonal (Pipette's intra-node figure) is not kept"
        ));
    finish(origin, hosts, cells, provenance, "Pipette bandwidth file")
}

/// Reads mpiGraph's tables as Pipette's `log_to_csv.py` kept them: `"0"` the receive table
/// (row = receiver), `"1"` the send table (row = sender), MB/s. Both are turned to row =
/// sender and each link gets the median of the tables that have it (with the two tables, the
/// mean of the send-side and receive-side figures), divided by [`MB_PER_GB`].
pub fn mpigraph(root: &Value, origin: &str) -> Result<ClusterProfile, ProfileError> {
    let keys = root.as_object().map(Map::keys).into_iter().flatten();
    if let Some(key) = keys
        .into_iter()
        .find(|k| k.as_str() != "0" && k.as_str() != "1")
    {
        return Err(invalid(
            origin,
            &field_path("", key),
            "is not a table Pipette's mpiGraph parser writes (it writes \"0\", the receive table, and \"1\", the send table; remove the others)".into(),
        ));
    }
    let tables: MpiGraphTables = deserialize(root, origin, Schema::MpiGraph)?;
    let mut hosts: Option<(Vec<String>, String)> = None;
    // Every table, oriented row = sender.
    let mut oriented: Vec<Vec<f64>> = Vec::new();
    let mut tables_read: Vec<&str> = Vec::new();
    for (key, table) in [("0", &tables.receive), ("1", &tables.send)] {
        let Some(table) = table else {
            continue;
        };
        let path = field_path("", key);
        let table_hosts = check_table_hosts(origin, &path, table)?;
        let gpus_path = field_path(&path, "gpus");
        match &hosts {
            Some((first, first_path)) if *first != table_hosts => {
                return Err(invalid(
                    origin,
                    &gpus_path,
                    format!(
                        "lists other hosts than {first_path} (both tables must cover the same hosts in the same order)"
                    ),
                ));
            }
            Some(_) => {}
            None => hosts = Some((table_hosts.clone(), gpus_path)),
        }
        let cells = read_table(origin, &path, table, Unit::MbPerS)?;
        let n = table_hosts.len();
        if key == "0" {
            // Receive table: row = receiver; transpose to row = sender.
            oriented.push((0..n * n).map(|k| cells[(k % n) * n + k / n]).collect());
            tables_read.push("receive table \"0\" transposed");
        } else {
            oriented.push(cells);
            tables_read.push("send table \"1\"");
        }
    }
    let Some((hosts, _)) = hosts else {
        return Err(invalid(
            origin,
            "",
            "has no mpiGraph table (expected \"0\", the receive table, and \"1\", the send table)"
                .into(),
        ));
    };
    let n = hosts.len();
    let cells: Vec<f64> = (0..n * n)
        .map(|k| median(&oriented.iter().map(|t| t[k]).collect::<Vec<_>>()) / MB_PER_GB)
        .collect();
    let provenance = Provenance::new(Source::Imported)
        .with_tool("mpiGraph (as kept by Pipette's log_to_csv.py)")
        .with_note(format!(
            "read from {origin}; MB/s / 1000; per-link median of: {}",
            tables_read.join(", ")
        ));
    finish(origin, hosts, cells, provenance, "mpiGraph tables")
}

/// `parent.gpus`: the host names, checked.
fn check_table_hosts(
    origin: &str,
    parent: &str,
    table: &Table,
) -> Result<Vec<String>, ProfileError> {
    let path = field_path(parent, "gpus");
    if table.gpus.is_empty() {
        return Err(invalid(
            origin,
            &path,
            "is empty (list the hosts that were measured)".into(),
        ));
    }
    check_hosts(origin, &table.gpus, |i| index_path(&path, i))?;
    Ok(table.gpus.clone())
}

/// `parent.bandwidth`: a square table in `unit`, row-major, every off-diagonal cell a
/// plausible bandwidth; the diagonal is not read and is 0.
fn read_table(
    origin: &str,
    parent: &str,
    table: &Table,
    unit: Unit,
) -> Result<Vec<f64>, ProfileError> {
    let path = field_path(parent, "bandwidth");
    let hosts = &table.gpus;
    let n = hosts.len();
    let shape = MatrixShape {
        size: n,
        count: format!("{} lists {}", field_path(parent, "gpus"), count(n, "host")),
        per: "host",
        order: field_path(parent, "gpus"),
    };
    let labels: Vec<String> = hosts.iter().map(|h| quote(h)).collect();
    let read = |at: &str, cell: &Value| read_cell(origin, at, cell, unit);
    // Another tool's figures are checked as written ones: a unit mistake is likely.
    let check = Check::Plausible;
    bandwidth_cells(
        origin,
        &path,
        &table.bandwidth,
        &shape,
        (unit, check),
        &labels,
        read,
    )
}

/// A number, or a string holding one (`"19.6"`, blanks around it allowed).
fn read_cell(origin: &str, path: &str, cell: &Value, unit: Unit) -> Result<f64, ProfileError> {
    match cell {
        Value::Number(n) => Ok(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(ProfileError::NotANumber {
                origin: origin.into(),
                path: path.into(),
                found: quote(s),
                unit: unit.as_str(),
                example: unit.example(),
            }),
        },
        _ => Err(wrong_type(
            origin,
            path,
            cell,
            &format!("a number in {}", unit.as_str()),
        )),
    }
}

fn finish(
    origin: &str,
    hosts: Vec<String>,
    cells: Vec<f64>,
    provenance: Provenance,
    what: &str,
) -> Result<ClusterProfile, ProfileError> {
    let profile = ClusterProfile {
        measured_perf: Vec::new(),
        note: Some(format!(
            "imported from {origin} ({what}): node links only; GPUs unknown until profiled or given defaults"
        )),
        node_links: LinkMatrix::from_cells(hosts.len(), cells, provenance),
        nodes: hosts
            .into_iter()
            .map(|host| NodeProfile {
                host,
                gpus: GpuInventory::Unknown,
                nvlink_domain: None,
            })
            .collect(),
    };
    profile.validate(origin)?;
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn root(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn detects_formats_by_their_keys() {
        assert_eq!(detect(&root(json!({"schema": "x"}))), Format::Native);
        assert_eq!(detect(&root(json!({"nodes": []}))), Format::Native);
        assert_eq!(
            detect(&root(json!({"gpus": [], "bandwidth": []}))),
            Format::Pipette
        );
        assert_eq!(detect(&root(json!({"bandwidth": []}))), Format::Pipette);
        assert_eq!(detect(&root(json!({"0": {}, "1": {}}))), Format::MpiGraph);
        assert_eq!(
            detect(&root(json!({"0": {}, "x": {}}))),
            Format::Unrecognised
        );
        assert_eq!(detect(&root(json!({}))), Format::Unrecognised);
    }

    #[test]
    fn pipette_file_gives_node_links_and_unknown_gpus() {
        // Cells are numbers or strings; the diagonal is not read at all.
        let file = json!({
            "gpus": ["a", "b", "c"],
            "bandwidth": [["130.2", "19.6", " 19.5 "], [19.4, "x", "18.0"], ["17.5", "18.5", null]]
        });
        let profile = pipette_bandwidth(&file, "p.json").unwrap();
        assert_eq!(profile.hosts().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(!profile.gpus_known());
        assert_eq!(profile.node_links.get(0, 1), 19.6);
        assert_eq!(profile.node_links.get(0, 2), 19.5);
        assert_eq!(profile.node_links.get(1, 0), 19.4);
        assert_eq!(profile.node_links.get(2, 1), 18.5);
        assert_eq!(profile.node_links.get(0, 0), 0.0);
        assert_eq!(profile.node_links.provenance.source, Source::Imported);
    }

    #[test]
    fn mpigraph_orients_both_tables_by_sender() {
        // Link a -> b: send table says 20000, receive table (row b, column a) says 18000.
        // Link b -> a: send table says 16000, receive table (row a, column b) says 14000.
        let file = json!({
            "0": {"gpus": ["a", "b"], "bandwidth": [[14000.0, 14000.0], [18000.0, 18000.0]]},
            "1": {"gpus": ["a", "b"], "bandwidth": [[20000.0, 20000.0], [16000.0, 16000.0]]}
        });
        let profile = mpigraph(&file, "m.json").unwrap();
        assert_eq!(profile.node_links.get(0, 1), 19.0);
        assert_eq!(profile.node_links.get(1, 0), 15.0);

        let recv_only = json!({"0": {"gpus": ["a", "b"], "bandwidth": [[0, 14000], [18000, 0]]}});
        let profile = mpigraph(&recv_only, "m.json").unwrap();
        assert_eq!(profile.node_links.get(0, 1), 18.0);
        assert_eq!(profile.node_links.get(1, 0), 14.0);
    }

    #[test]
    fn mpigraph_tables_must_agree_on_hosts() {
        let file = json!({
            "0": {"gpus": ["a", "b"], "bandwidth": [[0, 1], [1, 0]]},
            "1": {"gpus": ["b", "a"], "bandwidth": [[0, 1], [1, 0]]}
        });
        let err = mpigraph(&file, "m.json").unwrap_err().to_string();
        assert!(
            err.starts_with("m.json: [\"1\"].gpus lists other hosts than [\"0\"].gpus"),
            "{err}"
        );

        let file = json!({"0": {"gpus": ["a"], "bandwidth": [[0]]}, "2": {}});
        let err = mpigraph(&file, "m.json").unwrap_err().to_string();
        assert!(err.starts_with("m.json: [\"2\"] is not a table"), "{err}");
    }

    #[test]
    fn mpigraph_errors_name_the_table_cell() {
        let file = json!({"1": {"gpus": ["a", "b"], "bandwidth": [[0, "fast"], [1, 0]]}});
        let err = mpigraph(&file, "m.json").unwrap_err().to_string();
        assert!(err.starts_with("m.json: [\"1\"].bandwidth[0][1] is \"fast\", not a finite number (write the bandwidth in MB/s"), "{err}");
    }
}
