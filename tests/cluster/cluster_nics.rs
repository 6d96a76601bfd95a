//! `node_links.nics_per_node`: `examples/clusters/h100-16x8.json` as shipped (no NIC count)
//! and with `nics_per_node: 8` (a DGX H100's compute NICs). The dry run says which was
//! assumed, and a tp 2 layout's data-parallel reduce, which crosses the nodes, moves as the
//! bandwidth its rings get does.

use crate::common;

use serde_json::Value;

const SHIPPED: &str = "examples/clusters/h100-16x8.json";

fn with_eight_nics(dir: &std::path::Path) -> String {
    let text =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(SHIPPED))
            .unwrap();
    let mut file: Value = serde_json::from_str(&text).unwrap();
    file["node_links"]["nics_per_node"] = 8.into();
    let path = dir.join("h100-16x8-nics.json");
    std::fs::write(&path, serde_json::to_string(&file).unwrap()).unwrap();
    path.display().to_string()
}

fn dry_run(cluster: &str, run_dir: &std::path::Path, json: bool) -> String {
    common::pinned_llama2_13b_dry_run(cluster, run_dir, json, &[])
}

#[test]
fn the_dry_run_says_which_nic_count_was_assumed_and_the_estimate_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let eight = with_eight_nics(dir.path());

    let shown = dry_run(SHIPPED, &dir.path().join("a"), false);
    assert!(
        shown.contains("NICs per node: not in the cluster file, 1 assumed"),
        "{shown}"
    );
    let shown = dry_run(&eight, &dir.path().join("b"), false);
    assert!(
        shown.contains("NICs per node: 8 (node_links.nics_per_node)"),
        "{shown}"
    );
    let report: Value =
        serde_json::from_str(&dry_run(&eight, &dir.path().join("c"), true)).unwrap();
    assert_eq!(report["cluster_profile"]["nics_per_node"], 8);
    let report: Value =
        serde_json::from_str(&dry_run(SHIPPED, &dir.path().join("d"), true)).unwrap();
    assert_eq!(report["cluster_profile"]["nics_per_node"], Value::Null);

    // tp 2 × pp 4 × dp 16: each stage's 32 GPUs fill four nodes, each node holding four
    // replicas of each of the two dp rings. Eight NICs give each ring 8 × 4/8 = 4 links.
    let one = dry_run(SHIPPED, &dir.path().join("e"), true);
    let many = dry_run(&eight, &dir.path().join("f"), true);
    let (one, many): (Value, Value) = (
        serde_json::from_str(&one).unwrap(),
        serde_json::from_str(&many).unwrap(),
    );
    assert_eq!(one["plan"]["config"], many["plan"]["config"]);
    assert_eq!(one["plan"]["config"]["tp"], 2);
    let dp = |v: &Value, key: &str| {
        v["plan"]["estimate"]["time"]["data_parallel"][key]
            .as_f64()
            .unwrap()
    };
    let ratio = dp(&one, "reduce_ms") / dp(&many, "reduce_ms");
    assert!((ratio - 4.0).abs() < 1e-6, "reduce ratio {ratio}");
    let link = |v: &Value| {
        v["plan"]["estimate"]["time"]["data_parallel"]["bottleneck"]["link"]["gb_per_s"]
            .as_f64()
            .unwrap()
    };
    assert!((link(&many) / link(&one) - 4.0).abs() < 1e-6);
    let ms = |v: &Value| v["plan"]["estimate"]["iteration_ms"].as_f64().unwrap();
    assert!(ms(&many) < ms(&one), "{} vs {}", ms(&many), ms(&one));
}
