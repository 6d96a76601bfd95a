//! The cluster profile file through the library API: the shipped examples, the two imported
//! formats (with the real mpiGraph measurement in data/mpigraph), every class of validation
//! error as a user reads it, round trips, and garbage that must never panic.

use crate::common;

use pipette::cluster::profile::{
    Dtype, GpuInventory, GpuSpec, LinkMatrix, MeasuredTflops, NodeProfile, PeakTflops, Provenance,
    Source, SCHEMA_VERSION,
};
use pipette::cluster::{ClusterProfile, ProfileError};
use proptest::prelude::*;
use serde_json::{json, Value};

const EXAMPLES: [&str; 11] = [
    "a100-2x8.json",
    "a100-4x8-degraded.json",
    "a100-v100-mixed-4x8.json",
    "dgx-b200-16x8.json",
    "dgx-h200-16x8.json",
    "gb200-nvl72-4racks.json",
    "h100-128x8.json",
    "h100-16x8.json",
    "h100-a100-mixed-4x8.json",
    "v100-8x8.json",
    "vtrain-a100.json",
];

fn a100(index: u32) -> GpuSpec {
    GpuSpec {
        index,
        name: "A100-SXM4-80GB".into(),
        memory_bytes: 80 << 30,
        peak_tflops: PeakTflops::new(Some(312.0), 312.0),
        measured_tflops: Vec::new(),
        provenance: Provenance::new(Source::Datasheet),
    }
}

/// A small valid profile as JSON, for the error tests to break one field at a time.
fn base() -> Value {
    let gpu = |i: u32| {
        json!({"index": i, "name": "A100-SXM4-80GB", "memory_bytes": 85899345920u64,
               "peak_tflops": {"bf16": 312.0, "fp16": 312.0}, "provenance": {"source": "datasheet"}})
    };
    let node = |host: &str| {
        json!({"host": host, "gpus": [gpu(0), gpu(1)],
               "gpu_links": {"provenance": {"source": "measured", "date": "2024-05-31", "tool": "nccl-tests"},
                             "gb_per_s": [[0.0, 241.5], [239.0, 0.0]]}})
    };
    json!({
        "schema": SCHEMA_VERSION,
        "nodes": [node("n0"), node("n1")],
        "node_links": {"provenance": {"source": "measured"}, "gb_per_s": [[0.0, 23.5], [23.4, 0.0]]}
    })
}

fn set(mut value: Value, pointer: &str, new: Value) -> Value {
    *value
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("no {pointer}")) = new;
    value
}

fn remove(mut value: Value, pointer: &str, key: &str) -> Value {
    value
        .pointer_mut(pointer)
        .and_then(Value::as_object_mut)
        .and_then(|o| o.remove(key))
        .unwrap_or_else(|| panic!("no {pointer}/{key}"));
    value
}

/// The message a user sees for `value` read as `cluster.json`.
fn error_of(value: &Value) -> String {
    let text = serde_json::to_string_pretty(value).unwrap();
    let err = ClusterProfile::from_json_str(&text, "cluster.json")
        .expect_err("this file should be rejected");
    let message = err.to_string();
    assert!(!message.contains('\n'), "one line: {message}");
    assert!(
        message.starts_with("cluster.json"),
        "names the file: {message}"
    );
    message
}

fn assert_error(value: &Value, expected: &str) {
    let message = error_of(value);
    assert!(
        message.contains(expected),
        "expected {expected:?} in\n{message}"
    );
}

// ---------------------------------------------------------------------------------------
// The examples.

#[test]
fn every_example_loads_and_validates() {
    let dir = common::repo().join("examples/clusters");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    assert_eq!(
        names, EXAMPLES,
        "examples/clusters holds exactly these files"
    );
    for name in EXAMPLES {
        let profile = common::example_cluster(name);
        profile.validate(name).unwrap();
        assert!(profile.gpus_known(), "{name}");
        assert!(
            profile.note.as_deref().unwrap_or("").len() > 40,
            "{name} says what it models"
        );
        assert_ne!(
            profile.node_links.provenance.source,
            Source::Measured,
            "{name} is not a measurement"
        );
        for node in &profile.nodes {
            let links = node.gpu_links().unwrap();
            assert_eq!(links.provenance.source, Source::Estimated, "{name}");
            assert!(node
                .gpus()
                .unwrap()
                .iter()
                .all(|g| g.provenance.source == Source::Datasheet));
        }
    }
}

#[test]
fn examples_are_written_as_to_json_pretty_writes() {
    // The generator script and ClusterProfile::to_json_pretty agree on the layout, so
    // loading and rewriting an example changes nothing.
    for name in EXAMPLES {
        let path = common::repo().join("examples/clusters").join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        let rewritten = common::example_cluster(name).to_json_pretty();
        assert!(
            rewritten == text,
            "{name}: rewriting changes the file (run scripts/gen-example-clusters, or fix the writer); first difference at line {}",
            text.lines().zip(rewritten.lines()).position(|(a, b)| a != b).unwrap_or(0) + 1
        );
    }
}

fn all_gpu_links(profile: &ClusterProfile) -> Vec<f64> {
    profile
        .nodes
        .iter()
        .flat_map(|n| {
            n.gpu_links()
                .unwrap()
                .links()
                .map(|(_, _, v)| v)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn within(values: &[f64], low: f64, high: f64) -> bool {
    values.iter().all(|v| (low..=high).contains(v))
}

#[test]
fn a100_example_models_nvlink3_and_hdr() {
    let p = common::example_cluster("a100-2x8.json");
    assert_eq!(p.hosts().collect::<Vec<_>>(), ["a100-n00", "a100-n01"]);
    assert_eq!(p.gpu_count(), Some(16));
    let gpu = &p.nodes[0].gpus().unwrap()[3];
    assert_eq!((gpu.index, gpu.name.as_str()), (3, "A100-SXM4-80GB"));
    assert_eq!(gpu.memory_bytes, 85_899_345_920);
    assert_eq!(gpu.peak_tflops.get(Dtype::Bf16), Some(312.0));
    assert!(within(&all_gpu_links(&p), 230.0, 250.0));
    let inter: Vec<f64> = p.node_links.links().map(|(_, _, v)| v).collect();
    assert!(within(&inter, 23.0, 24.0), "{inter:?}");
    let spread = p.node_links.max_link().unwrap() - p.node_links.min_link().unwrap();
    assert!(spread > 0.0, "measurements are never perfectly uniform");
}

#[test]
fn degraded_example_has_slow_node_pairs() {
    let p = common::example_cluster("a100-4x8-degraded.json");
    let healthy = p.node_links.max_link().unwrap();
    let slow: Vec<(usize, usize, f64)> = p
        .node_links
        .links()
        .filter(|&(_, _, v)| v < 0.7 * healthy)
        .collect();
    assert!(slow.len() >= 3, "{slow:?}");
    for (from, to, v) in slow {
        let ratio = v / healthy;
        assert!((0.38..=0.62).contains(&ratio), "{from}->{to}: {ratio}");
    }
}

#[test]
fn v100_example_models_the_dgx1_cube_mesh() {
    let p = common::example_cluster("v100-8x8.json");
    assert_eq!(p.gpu_count(), Some(64));
    let gpu = &p.nodes[5].gpus().unwrap()[0];
    assert_eq!(gpu.name, "V100-SXM2-32GB");
    assert_eq!(gpu.peak_tflops.bf16, None, "V100 has no bf16 tensor cores");
    assert_eq!(gpu.peak_tflops.get(Dtype::Fp16), Some(125.0));
    for node in &p.nodes {
        let links = node.gpu_links().unwrap();
        for i in 0..8 {
            // Six NVLinks per GPU: two NV2 peers (~48) and two NV1 peers (~24); three over PCIe.
            let row: Vec<f64> = (0..8)
                .filter(|&j| j != i)
                .map(|j| links.get(i, j))
                .collect();
            let class =
                |low: f64, high: f64| row.iter().filter(|v| (low..=high).contains(*v)).count();
            assert_eq!(
                (class(46.0, 50.0), class(23.0, 25.0), class(9.5, 10.5)),
                (2, 2, 3),
                "{} GPU {i}: {row:?}",
                node.host
            );
            // The topology is symmetric.
            for j in 0..8 {
                assert!((links.get(i, j) - links.get(j, i)).abs() < 2.0);
            }
        }
    }
    let inter: Vec<f64> = p.node_links.links().map(|(_, _, v)| v).collect();
    assert!(within(&inter, 11.0, 12.0));
}

#[test]
fn mixed_example_holds_v100_pairs_to_edr() {
    let p = common::example_cluster("a100-v100-mixed-4x8.json");
    let names: Vec<&str> = p
        .nodes
        .iter()
        .map(|n| n.gpus().unwrap()[0].name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "A100-SXM4-80GB",
            "A100-SXM4-80GB",
            "V100-SXM2-32GB",
            "V100-SXM2-32GB"
        ]
    );
    assert!((23.0..=24.0).contains(&p.node_links.get(0, 1)));
    for (from, to, v) in p.node_links.links() {
        if from >= 2 || to >= 2 {
            assert!((11.0..=12.0).contains(&v), "{from}->{to}: {v}");
        }
    }
}

#[test]
fn h100_examples_model_nvlink4_and_ndr() {
    for (name, nodes) in [("h100-16x8.json", 16), ("h100-128x8.json", 128)] {
        let p = common::example_cluster(name);
        assert_eq!(p.nodes.len(), nodes);
        assert_eq!(p.gpu_count(), Some(nodes * 8));
        assert_eq!(p.nodes[0].gpus().unwrap()[0].peak_tflops.bf16, Some(989.0));
        assert!(within(&all_gpu_links(&p), 360.0, 400.0), "{name}");
        let inter: Vec<f64> = p.node_links.links().map(|(_, _, v)| v).collect();
        assert!(within(&inter, 43.5, 48.0), "{name}");
    }
}

#[test]
fn the_documented_minimal_profile_loads() {
    let doc = std::fs::read_to_string(common::repo().join("docs/cluster-profile.md")).unwrap();
    let start = doc
        .find("```json\n")
        .expect("docs/cluster-profile.md has a JSON example")
        + 8;
    let end = start + doc[start..].find("```").unwrap();
    let profile = ClusterProfile::from_json_str(&doc[start..end], "docs/cluster-profile.md")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(profile.hosts().collect::<Vec<_>>(), ["node1", "node2"]);
    assert_eq!(profile.nodes[1].gpus, GpuInventory::Unknown);
    assert_eq!(profile.nodes[0].gpu_links().unwrap().get(1, 0), 239.0);
}

// ---------------------------------------------------------------------------------------
// Imported formats.

#[test]
fn shared_mpigraph_measurement_loads() {
    let path = common::shared_mpigraph_path();
    let profile = ClusterProfile::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(profile.nodes.len(), 16);
    assert_eq!(profile.hosts().next(), Some("agpu1475"));
    assert!(profile
        .nodes
        .iter()
        .all(|n| n.gpus == GpuInventory::Unknown));
    assert!(!profile.gpus_known());
    assert_eq!(profile.gpu_count(), None);

    let links: Vec<f64> = profile.node_links.links().map(|(_, _, v)| v).collect();
    assert_eq!(links.len(), 16 * 15);
    assert!(within(&links, 16.3, 19.7), "GB/s, not MB/s: {links:?}");
    assert!(
        profile.node_links.max_link().unwrap() - profile.node_links.min_link().unwrap() > 1.5,
        "the fabric is uneven"
    );

    // Each link is the mean of the send table ("1", row = sender) and the receive table
    // ("0", row = receiver), MB/s / 1000. Recomputed here from the raw file.
    let raw: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let cell =
        |table: &str, row: usize, col: usize| raw[table]["bandwidth"][row][col].as_f64().unwrap();
    for (from, to) in [(0, 1), (1, 0), (3, 14), (15, 2)] {
        let expected = (cell("1", from, to) + cell("0", to, from)) / 2.0 / 1000.0;
        let got = profile.node_links.get(from, to);
        assert!(
            (got - expected).abs() < 1e-9,
            "{from}->{to}: {got} vs {expected}"
        );
    }
    let provenance = &profile.node_links.provenance;
    assert_eq!(provenance.source, Source::Imported);
    assert!(provenance.tool.as_deref().unwrap().contains("mpiGraph"));

    // Round trip, unknown GPUs included.
    let again = ClusterProfile::from_json_str(&profile.to_json_pretty(), "again.json").unwrap();
    assert_eq!(again, profile);
}

#[test]
fn imported_profile_gets_default_gpus() {
    let profile = ClusterProfile::load(common::shared_mpigraph_path()).unwrap();
    let filled = profile
        .clone()
        .with_default_gpus(a100(0), 8, 240.0)
        .unwrap();
    assert!(filled.gpus_known());
    assert_eq!(filled.gpu_count(), Some(128));
    assert_eq!(filled.node_links, profile.node_links, "node links are kept");
    let links = filled.nodes[9].gpu_links().unwrap();
    assert_eq!((links.size(), links.get(2, 5)), (8, 240.0));
    assert_eq!(links.provenance.source, Source::Estimated);
    let again = ClusterProfile::from_json_str(&filled.to_json_pretty(), "filled.json").unwrap();
    assert_eq!(again, filled);
}

#[test]
fn pipette_file_with_string_cells_loads() {
    // As Pipette's round_robin_test.py writes it: nccl-tests figures as strings, the same
    // figure both ways, each host's intra-node figure on the diagonal (not kept).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nccl_test.json");
    std::fs::write(
        &path,
        r#"{
  "gpus": ["agpu1425", "agpu1426", "agpu1427"],
  "bandwidth": [
    ["131.02", "19.62", "18.95"],
    ["19.62", "130.77", "17.1"],
    [18.95, "17.1", "129.5"]
  ]
}"#,
    )
    .unwrap();
    let profile = ClusterProfile::load(&path).unwrap();
    assert_eq!(
        profile.hosts().collect::<Vec<_>>(),
        ["agpu1425", "agpu1426", "agpu1427"]
    );
    assert_eq!(profile.node_links.get(0, 1), 19.62);
    assert_eq!(profile.node_links.get(2, 0), 18.95);
    assert_eq!(profile.node_links.get(1, 2), 17.1);
    assert_eq!(profile.node_links.get(1, 1), 0.0);
    assert_eq!(profile.node_links.provenance.source, Source::Imported);
    assert!(!profile.gpus_known());
}

// ---------------------------------------------------------------------------------------
// Validation: every class of error, as the user reads it.

#[test]
fn base_profile_is_valid() {
    let text = serde_json::to_string(&base()).unwrap();
    let profile = ClusterProfile::from_json_str(&text, "cluster.json").unwrap();
    assert_eq!(profile.gpu_count(), Some(4));
    assert_eq!(profile.nodes[1].gpu_links().unwrap().get(1, 0), 239.0);
}

#[test]
fn syntax_error_names_line_and_column() {
    let err = ClusterProfile::from_json_str(
        "{\n  \"schema\": \"pipette-cluster/1\",\n  \"nodes\": [,]\n}",
        "cluster.json",
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            ProfileError::Syntax {
                line: 3,
                column: 13,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("cluster.json:3:13: not valid JSON: expected value ("),
        "{err}"
    );
    let err = ClusterProfile::from_json_str("{\"schema\": ", "cut.json").unwrap_err();
    assert!(
        err.to_string().contains("(the file is empty or cut short)"),
        "{err}"
    );
}

#[test]
fn missing_fields_are_named_with_what_to_write() {
    assert_error(
        &remove(base(), "/nodes/1", "host"),
        "cluster.json: nodes[1].host is missing (give the node's host name)",
    );
    assert_error(
        &remove(base(), "/nodes/0", "gpus"),
        "nodes[0].gpus is missing (list the node's GPUs, or write \"gpus\": \"unknown\"",
    );
    assert_error(
        &remove(base(), "/nodes/0/gpus/1", "memory_bytes"),
        "nodes[0].gpus[1].memory_bytes is missing (give the GPU's memory in bytes",
    );
    assert_error(
        &remove(base(), "/node_links", "provenance"),
        "node_links.provenance is missing (say where the bandwidths came from",
    );
    assert_error(
        &remove(base(), "", "node_links"),
        "cluster.json: node_links is missing",
    );
    assert_error(
        &remove(base(), "/nodes/1", "gpu_links"),
        "nodes[1].gpu_links is missing (give the GPU-pair bandwidths in GB/s",
    );
    assert_error(
        &remove(base(), "", "schema"),
        "cluster.json: schema is missing (add \"schema\": \"pipette-cluster/1\"",
    );
}

#[test]
fn wrong_types_say_what_was_found_and_expected() {
    assert_error(
        &set(base(), "/nodes/0/gpus/1/memory_bytes", json!("80GB")),
        "cluster.json: nodes[0].gpus[1].memory_bytes is the string \"80GB\" (expected a whole number of bytes, e.g. 85899345920 for 80 GiB)",
    );
    assert_error(
        &set(base(), "/nodes/1/host", json!(7)),
        "nodes[1].host is the number 7 (expected a host name (a string))",
    );
    assert_error(
        &set(base(), "/nodes", json!({})),
        "nodes is an empty object (expected a list of nodes)",
    );
    assert_error(
        &set(base(), "/nodes/0/gpus", json!("none")),
        "nodes[0].gpus is the string \"none\" (expected a list of GPUs, or \"unknown\")",
    );
    assert_error(
        &set(base(), "/nodes/0/gpus/0/index", json!(-1)),
        "nodes[0].gpus[0].index is the number -1 (expected a device index",
    );
    assert_error(
        &set(base(), "/node_links/gb_per_s/0/1", json!("19.6")),
        "node_links.gb_per_s[0][1] is the string \"19.6\" (expected a number in GB/s, without quotes)",
    );
    assert_error(
        &set(base(), "/node_links/gb_per_s/1", json!(23.4)),
        "node_links.gb_per_s[1] is the number 23.4 (expected a row of bandwidths, one per node)",
    );
    assert_error(
        &set(base(), "/nodes/0/gpus/0/peak_tflops/bf16", json!(true)),
        "nodes[0].gpus[0].peak_tflops.bf16 is true (expected a number of TFLOPS",
    );
}

#[test]
fn matrices_must_match_the_node_and_gpu_counts() {
    assert_error(
        &set(base(), "/node_links/gb_per_s", json!([[0.0, 23.5], [23.4, 0.0], [23.0, 23.0]])),
        "cluster.json: node_links.gb_per_s has 3 rows but there are 2 nodes (one row per node, in the order of nodes)",
    );
    assert_error(
        &set(base(), "/node_links/gb_per_s/1", json!([23.4, 0.0, 22.0])),
        "node_links.gb_per_s[1] has 3 columns but there are 2 nodes (one column per node, in the order of nodes)",
    );
    assert_error(
        &set(base(), "/nodes/1/gpu_links/gb_per_s", json!([[0.0, 240.0]])),
        "cluster.json: nodes[1].gpu_links.gb_per_s has 1 row but the node has 2 GPUs (one row per GPU, in the order of nodes[1].gpus)",
    );
    assert_error(
        &set(base(), "/nodes/0/gpu_links/gb_per_s/0", json!([0.0])),
        "nodes[0].gpu_links.gb_per_s[0] has 1 column but the node has 2 GPUs (one column per GPU",
    );
}

#[test]
fn bandwidths_must_be_positive_finite_numbers() {
    assert_error(
        &set(base(), "/node_links/gb_per_s/0/1", json!(-3.0)),
        "cluster.json: node_links.gb_per_s[0][1] is -3 GB/s, a negative bandwidth (correct the figure, or measure the link again)",
    );
    assert_error(
        &set(base(), "/node_links/gb_per_s/1/0", json!(0)),
        "cluster.json: node_links.gb_per_s[1][0] is 0: no bandwidth from \"n1\" to \"n0\" (was the link measured?",
    );
    assert_error(
        &set(base(), "/nodes/0/gpu_links/gb_per_s/0/1", json!(0.0)),
        "nodes[0].gpu_links.gb_per_s[0][1] is 0: no bandwidth from GPU 0 of \"n0\" to GPU 1 of \"n0\"",
    );
    assert_error(
        &set(base(), "/node_links/gb_per_s/0/1", json!(19635.4)),
        "node_links.gb_per_s[0][1] is 19635.4 GB/s, beyond what any link attains (figures from 0.001 to 10000 GB/s are accepted; check the unit",
    );
    assert_error(
        &set(base(), "/nodes/1/gpu_links/gb_per_s/1/0", json!(1e-200)),
        "nodes[1].gpu_links.gb_per_s[1][0] is 1e-200 GB/s, beyond what any link attains",
    );
    // The diagonal is not used: any number, or null, is fine there.
    let fine = set(base(), "/node_links/gb_per_s/0/0", json!(-1.0));
    let fine = set(fine, "/nodes/0/gpu_links/gb_per_s/1/1", Value::Null);
    let text = serde_json::to_string(&fine).unwrap();
    let profile = ClusterProfile::from_json_str(&text, "cluster.json").unwrap();
    assert_eq!(profile.node_links.get(0, 0), 0.0);
}

fn pipette_error(value: Value) -> String {
    let err = ClusterProfile::from_json_str(&value.to_string(), "nccl.json").unwrap_err();
    let message = err.to_string();
    assert!(
        !message.contains('\n') && message.starts_with("nccl.json: "),
        "{message}"
    );
    message
}

#[test]
fn imported_cells_must_parse() {
    let message =
        pipette_error(json!({"gpus": ["a", "b"], "bandwidth": [["0", "fast"], ["19.6", "0"]]}));
    assert!(message.contains("nccl.json: bandwidth[0][1] is \"fast\", not a finite number (write the bandwidth in GB/s, e.g. 19.6)"), "{message}");
    let message =
        pipette_error(json!({"gpus": ["a", "b"], "bandwidth": [["0", "NaN"], ["19.6", "0"]]}));
    assert!(
        message.contains("bandwidth[0][1] is \"NaN\", not a finite number"),
        "{message}"
    );
    let message =
        pipette_error(json!({"gpus": ["a", "b"], "bandwidth": [["0", "19.6"], ["-2", "0"]]}));
    assert!(
        message.contains("bandwidth[1][0] is -2 GB/s, a negative bandwidth"),
        "{message}"
    );
    let message =
        pipette_error(json!({"gpus": ["a", "b"], "bandwidth": [["0", "19.6"], [[1], "0"]]}));
    assert!(
        message.contains("bandwidth[1][0] is a list of 1 item (expected a number in GB/s)"),
        "{message}"
    );
    let message =
        pipette_error(json!({"gpus": ["a", "b"], "bandwidth": [[0, 19600.0], [19400.0, 0]]}));
    assert!(
        message.contains("bandwidth[0][1] is 19600 GB/s, beyond what any link attains")
            && message.contains("mpiGraph tables MB/s"),
        "{message}"
    );
    let message = pipette_error(json!({"gpus": ["a", "b", "a"], "bandwidth": []}));
    assert!(
        message.contains(
            "nccl.json: gpus[2] repeats host \"a\", already at gpus[0] (list each node once)"
        ),
        "{message}"
    );
    let message = pipette_error(json!({"gpus": ["a", "b"], "bandwidth": [[0, 1]]}));
    assert!(
        message.contains(
            "bandwidth has 1 row but gpus lists 2 hosts (one row per host, in the order of gpus)"
        ),
        "{message}"
    );
    let message = pipette_error(json!({"gpus": ["a", "b"]}));
    assert!(
        message.contains("nccl.json: bandwidth is missing"),
        "{message}"
    );
}

#[test]
fn hosts_and_gpus_must_be_unique_and_sane() {
    assert_error(
        &set(base(), "/nodes/1/host", json!("n0")),
        "cluster.json: nodes[1].host repeats host \"n0\", already at nodes[0].host (list each node once)",
    );
    assert_error(
        &set(base(), "/nodes/1/host", json!("n 1")),
        "nodes[1].host is \"n 1\", not a host name",
    );
    assert_error(
        &set(base(), "/nodes/0/gpus/1/index", json!(0)),
        "nodes[0].gpus[1].index repeats index 0, already at nodes[0].gpus[0] (list each GPU once)",
    );
    assert_error(
        &set(base(), "/nodes/0/gpus/0/memory_bytes", json!(0)),
        "cluster.json: nodes[0].gpus[0].memory_bytes is 0 bytes (give the GPU's memory in bytes, e.g. 85899345920 for 80 GiB)",
    );
    assert_error(
        &set(base(), "/nodes/0/gpus/0/peak_tflops/fp16", json!(0)),
        "nodes[0].gpus[0].peak_tflops.fp16 is 0 (give a TFLOPS figure from 0.001 to 100000",
    );
    assert_error(
        &set(base(), "/nodes", json!([])),
        "cluster.json: nodes is empty (list at least one node)",
    );
    assert_error(
        &set(base(), "/nodes/0/gpus", json!([])),
        "nodes[0].gpus is empty (list the node's GPUs, or write \"unknown\"",
    );
}

#[test]
fn schema_version_and_field_names_are_checked() {
    assert_error(
        &set(base(), "/schema", json!("pipette-cluster/2")),
        "cluster.json: schema is \"pipette-cluster/2\", but this pipette-run reads \"pipette-cluster/1\" (write the file in that version",
    );
    assert_error(
        &set(base(), "/schema", json!(1)),
        "schema is the number 1 (expected the string \"pipette-cluster/1\")",
    );
    let mut typo = base();
    typo["nodes"][0]["gpu_link"] = json!({});
    assert_error(&typo, "cluster.json: nodes[0].gpu_link is not a field of a node (its fields are host, gpus, gpu_links, nvlink_domain; check the spelling)");
    assert_error(
        &set(base(), "/node_links/provenance/source", json!("guessed")),
        "node_links.provenance.source is \"guessed\" (write one of \"measured\", \"datasheet\", \"imported\", \"estimated\")",
    );
    assert_error(
        &set(
            base(),
            "/nodes/0/gpu_links/provenance/date",
            json!("31/05/2024"),
        ),
        "nodes[0].gpu_links.provenance.date is \"31/05/2024\", not a date (write YYYY-MM-DD",
    );
    let mut unknown_with_links = base();
    unknown_with_links["nodes"][1]["gpus"] = json!("unknown");
    assert_error(&unknown_with_links, "nodes[1].gpu_links is given but nodes[1].gpus is \"unknown\" (list the GPUs, or remove gpu_links)");
}

#[test]
fn files_in_no_known_format_are_refused() {
    for (text, found) in [
        ("[1, 2]", "the top level is a list of 2 items"),
        (
            "{\"hosts\": 1}",
            "the top level is an object with fields \"hosts\"",
        ),
        ("\"x\"", "the top level is the string \"x\""),
    ] {
        let err = ClusterProfile::from_json_str(text, "what.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!(
                "what.json: not a cluster profile: {found} (expected"
            )),
            "{err}"
        );
        assert!(err.contains("see docs/cluster-profile.md"), "{err}");
    }
}

#[test]
fn unreadable_files_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.json");
    let err = ClusterProfile::load(&missing).unwrap_err();
    assert!(matches!(err, ProfileError::Read { .. }));
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "{}: cannot read the cluster profile: ",
            missing.display()
        )),
        "{message}"
    );
    assert_eq!(err.origin(), missing.display().to_string());

    let binary = dir.path().join("binary.json");
    std::fs::write(&binary, b"{\"gpus\": [\"\xff\xfe\"]}").unwrap();
    let err = ClusterProfile::load(&binary).unwrap_err();
    assert!(matches!(err, ProfileError::Syntax { .. }), "{err}");
}

#[test]
fn error_messages_as_users_read_them() {
    let cases = [
        set(base(), "/nodes/1/gpu_links/gb_per_s", json!([[0.0, 240.0]])),
        set(base(), "/nodes/0/gpus/1/memory_bytes", json!("80GB")),
        set(base(), "/node_links/gb_per_s/1/0", json!(0)),
        set(base(), "/nodes/1/host", json!("n0")),
    ];
    let messages: Vec<String> = cases.iter().map(error_of).collect();
    insta::assert_snapshot!(messages.join("\n"), @r#"
    cluster.json: nodes[1].gpu_links.gb_per_s has 1 row but the node has 2 GPUs (one row per GPU, in the order of nodes[1].gpus)
    cluster.json: nodes[0].gpus[1].memory_bytes is the string "80GB" (expected a whole number of bytes, e.g. 85899345920 for 80 GiB)
    cluster.json: node_links.gb_per_s[1][0] is 0: no bandwidth from "n1" to "n0" (was the link measured? measure it again, or leave one of the two out)
    cluster.json: nodes[1].host repeats host "n0", already at nodes[0].host (list each node once)
    "#);
    assert_eq!(
        ProfileError::MissingField {
            origin: "x".into(),
            path: "nodes".into(),
            hint: "h".into()
        }
        .path(),
        Some("nodes")
    );
}

// ---------------------------------------------------------------------------------------
// Round trips.

#[test]
fn round_trip_is_identity() {
    let mut profiles: Vec<ClusterProfile> = EXAMPLES
        .iter()
        .map(|n| common::example_cluster(n))
        .collect();

    let mut measured = common::example_cluster("a100-2x8.json");
    measured.note = None;
    if let GpuInventory::Known { gpus, links } = &mut measured.nodes[1].gpus {
        gpus[2].measured_tflops = vec![MeasuredTflops {
            dtype: Dtype::Bf16,
            tflops: 231.73,
            provenance: Provenance::new(Source::Measured)
                .with_date("2024-05-31")
                .with_tool("pipette probe matmul 8192^3")
                .with_note("median of 20 runs, \"quoted\" \\ and unicode ≈"),
        }];
        links.provenance = Provenance::new(Source::Measured).with_tool("nccl-tests sendrecv_perf");
        links.set(0, 7, 0.1 + 0.2);
    }
    measured.nodes.push(NodeProfile {
        host: "spare".into(),
        gpus: GpuInventory::Unknown,
        nvlink_domain: None,
    });
    let mut node_links = LinkMatrix::uniform(3, 23.5, Provenance::new(Source::Estimated));
    node_links.set(2, 0, 1e-3);
    node_links.set(0, 2, 1234.5678901234);
    measured.node_links = node_links;
    measured.validate("measured").unwrap();
    profiles.push(measured);

    for profile in profiles {
        let text = profile.to_json_pretty();
        let back = ClusterProfile::from_json_str(&text, "round-trip.json")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, profile);
        assert_eq!(back.to_json_pretty(), text);
        let compact = serde_json::to_string(&profile).unwrap();
        let back: ClusterProfile = serde_json::from_str(&compact).unwrap();
        assert_eq!(back, profile);
    }
}

#[test]
fn serde_deserialize_reports_the_same_errors() {
    let err = serde_json::from_value::<ClusterProfile>(set(
        base(),
        "/nodes/0/gpus/0/memory_bytes",
        json!(0),
    ))
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("cluster profile: nodes[0].gpus[0].memory_bytes is 0 bytes"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------
// Garbage never panics.

/// JSON built from the words the readers look for, so that garbage gets past the first
/// checks and exercises the deep ones.
fn json_garbage() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("schema".to_string()),
        Just("nodes".to_string()),
        Just("node_links".to_string()),
        Just("host".to_string()),
        Just("gpus".to_string()),
        Just("gpu_links".to_string()),
        Just("gb_per_s".to_string()),
        Just("provenance".to_string()),
        Just("source".to_string()),
        Just("bandwidth".to_string()),
        Just("0".to_string()),
        Just("1".to_string()),
        "[a-z_]{0,6}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop_oneof![Just(0.0), Just(-1.0), Just(19.6), Just(1e300)].prop_map(Value::from),
        Just(json!(SCHEMA_VERSION)),
        Just(json!("unknown")),
        Just(json!("measured")),
        Just(json!("NaN")),
        Just(json!("19.6")),
        ".{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn check_outcome(result: Result<ClusterProfile, ProfileError>) {
    match result {
        Ok(profile) => {
            // Whatever is accepted is valid and survives a round trip.
            profile.validate("accepted").unwrap();
            let back = ClusterProfile::from_json_str(&profile.to_json_pretty(), "again").unwrap();
            assert_eq!(back, profile);
        }
        Err(err) => {
            let message = err.to_string();
            assert!(
                !message.contains('\n') && !message.contains('\r'),
                "{message}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check_outcome(ClusterProfile::from_json_str(&String::from_utf8_lossy(&bytes), "garbage.json"));
    }

    #[test]
    fn random_json_never_panics(value in json_garbage()) {
        check_outcome(ClusterProfile::from_value(&value, "garbage.json"));
        check_outcome(ClusterProfile::from_json_str(&value.to_string(), "garbage.json"));
    }

    #[test]
    fn a_profile_with_one_field_replaced_never_panics(
        pick in any::<prop::sample::Index>(),
        replacement in json_garbage(),
    ) {
        let mut value = base();
        let pointers = pointers(&value, "");
        let pointer = &pointers[pick.index(pointers.len())];
        *value.pointer_mut(pointer).unwrap() = replacement;
        check_outcome(ClusterProfile::from_value(&value, "mutated.json"));
    }

    #[test]
    fn imported_files_with_one_cell_replaced_never_panic(
        row in 0usize..3, col in 0usize..3, replacement in json_garbage(),
    ) {
        let mut pipette = json!({"gpus": ["a", "b", "c"], "bandwidth": [["0", "19.6", "18"], [19, "0", "17.5"], ["18.1", "17", "0"]]});
        pipette["bandwidth"][row][col] = replacement.clone();
        check_outcome(ClusterProfile::from_value(&pipette, "nccl.json"));
        let mut graph = json!({"0": {"gpus": ["a", "b", "c"], "bandwidth": [[0, 19600, 18000], [19000, 0, 17500], [18100, 17000, 0]]},
                               "1": {"gpus": ["a", "b", "c"], "bandwidth": [[0, 19600, 18000], [19000, 0, 17500], [18100, 17000, 0]]}});
        graph["1"]["bandwidth"][row][col] = replacement;
        check_outcome(ClusterProfile::from_value(&graph, "mpigraph.json"));
    }
}

/// Every JSON pointer in `value`, itself included.
fn pointers(value: &Value, at: &str) -> Vec<String> {
    let mut out = vec![at.to_string()];
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                out.extend(pointers(item, &format!("{at}/{i}")));
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                out.extend(pointers(item, &format!("{at}/{key}")));
            }
        }
        _ => {}
    }
    out
}

/// The GB200 NVL72 example: 4 racks of 18 trays of 4 GPUs, each rack one NVLink domain,
/// four NICs per tray; FP8 and FP4 peaks from the datasheet.
#[test]
fn the_gb200_nvl72_example_has_four_domains_of_eighteen_trays() {
    let p = common::example_cluster("gb200-nvl72-4racks.json");
    assert_eq!((p.nodes.len(), p.gpu_count()), (72, Some(288)));
    let mut domains: Vec<&str> = p
        .nodes
        .iter()
        .map(|n| n.nvlink_domain.as_deref().unwrap())
        .collect();
    domains.dedup();
    assert_eq!(domains.len(), 4);
    assert!(p.nodes[..18]
        .iter()
        .all(|n| n.nvlink_domain == p.nodes[0].nvlink_domain));
    assert_eq!(p.node_links.nics_per_node, Some(4));
    let peak = p.nodes[0].gpus().unwrap()[0].peak_tflops;
    assert_eq!((peak.fp8, peak.fp4), (Some(5000.0), Some(10000.0)));
}
