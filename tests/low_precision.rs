//! FP8 through the real binary: the predicted BF16→FP8 speed-up of the development set's
//! dense pairs (`data/moe/fp8-pairs.json`, Llama-3.1-405B on 512 H100 and 128 GB200, same
//! layout in both precisions) within 10 % of the measured one, and the plan report saying
//! what the same plan would take in BF16.

mod common;

use serde_json::Value;

/// 32 GB200 compute trays of 4 GPUs in one NVLink domain: GPU pairs inside a tray and
/// across trays at the NVLink 5 rate attained (about 80 % of 900 GB/s per direction, as
/// the example clusters take NVLink's attained share).
fn gb200_trays(dir: &std::path::Path) -> String {
    let gpu = serde_json::json!({
        "name": "NVIDIA GB200", "memory_bytes": 186_000_000_000u64,
        "peak_tflops": {"bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0, "fp4": 10000.0},
        "provenance": {"source": "datasheet"}
    });
    let square = |n: usize| -> Vec<Vec<f64>> {
        (0..n)
            .map(|i| (0..n).map(|j| if i == j { 0.0 } else { 720.0 }).collect())
            .collect()
    };
    let nodes: Vec<Value> = (0..32)
        .map(|n| {
            let gpus: Vec<Value> = (0..4)
                .map(|i| {
                    let mut g = gpu.clone();
                    g["index"] = i.into();
                    g
                })
                .collect();
            serde_json::json!({
                "host": format!("tray-{n:02}"), "gpus": gpus,
                "gpu_links": {"provenance": {"source": "estimated", "note": "NVLink 5"},
                              "gb_per_s": square(4)}
            })
        })
        .collect();
    let file = serde_json::json!({
        "schema": "pipette-cluster/1", "nodes": nodes,
        "node_links": {"provenance": {"source": "estimated", "note": "one NVLink domain"},
                       "gb_per_s": square(32)}
    });
    let path = dir.join("gb200-32x4.json");
    std::fs::write(&path, file.to_string()).unwrap();
    path.display().to_string()
}

/// The pair's layout costed in `precision`. Context parallelism 2 is costed as what it
/// gives each GPU: half of every sequence (seq 4,096 of 8,192) on dp × cp replicas, the
/// global batch counted in half-sequences; 126 layers over 8 stages as 16 × 7 + 14 (no
/// interleaving: the bubble scales with the stage time in both precisions). The recipe
/// overlaps tensor-parallel communication (NeMo's llama31_405b performance recipe).
fn step_ms(cluster: &str, row: &Value, fp8: bool) -> f64 {
    let n = |k: &str| row[k].as_u64().unwrap();
    let cp = n("cp");
    let dp = n("gpus") / (n("tp") * n("pp") * cp);
    let mut args: Vec<String> = [
        "estimate",
        "--json",
        "--cluster",
        cluster,
        "--mbs",
        "1",
        "--sequence-parallel",
        "--distributed-optimizer",
        "--layers-per-stage",
        "16,16,16,16,16,16,16,14",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend([
        "--tp".into(),
        n("tp").to_string(),
        "--pp".into(),
        n("pp").to_string(),
    ]);
    args.extend(["--dp".into(), (dp * cp).to_string(), "--".into()]);
    let model = "--num-layers 126 --hidden-size 16384 --ffn-hidden-size 53248 \
                 --num-attention-heads 128 --group-query-attention --num-query-groups 8 \
                 --max-position-embeddings 8192 --swiglu --normalization RMSNorm \
                 --position-embedding-type rope --untie-embeddings-and-output-weights \
                 --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --bf16 \
                 --use-distributed-optimizer --sequence-parallel --overlap-grad-reduce \
                 --overlap-param-gather --tp-comm-overlap";
    args.extend(model.split_whitespace().map(str::to_string));
    args.extend(["--seq-length".into(), (n("seq_len") / cp).to_string()]);
    args.extend([
        "--global-batch-size".into(),
        (n("global_batch") * cp).to_string(),
    ]);
    if fp8 {
        args.extend(["--fp8-format".into(), "hybrid".into()]);
    }
    let v: Value = serde_json::from_str(&common::run_clean("pipette", &args)).unwrap();
    v["time"]["iteration_ms"].as_f64().unwrap()
}

#[test]
fn predicted_fp8_speedups_of_the_dense_pairs_are_within_ten_percent() {
    let dir = tempfile::tempdir().unwrap();
    let data: Value = serde_json::from_str(
        &std::fs::read_to_string(common::repo().join("data/moe/fp8-pairs.json")).unwrap(),
    )
    .unwrap();
    let rows = data["rows"].as_array().unwrap();
    let gb200 = gb200_trays(dir.path());
    let mut checked = 0;
    for (gpu, gpus, cluster) in [
        ("H100", 512, "examples/clusters/h100-128x8.json".to_string()),
        ("GB200", 128, gb200),
    ] {
        let pick = |precision: &str| {
            rows.iter()
                .find(|r| r["gpu"] == gpu && r["gpus"] == gpus && r["precision"] == precision)
                .unwrap()
        };
        let (bf16, fp8) = (pick("bf16"), pick("fp8"));
        let measured = bf16["step_time_s"].as_f64().unwrap() / fp8["step_time_s"].as_f64().unwrap();
        let predicted = step_ms(&cluster, bf16, false) / step_ms(&cluster, fp8, true);
        let error = predicted / measured - 1.0;
        eprintln!(
            "{gpu} x{gpus}: measured {measured:.3}, predicted {predicted:.3} ({:+.1} %)",
            error * 100.0
        );
        assert!(
            error.abs() <= 0.10,
            "{gpu}: measured {measured:.3}, predicted {predicted:.3}"
        );
        checked += 1;
    }
    assert_eq!(checked, 2);
}

#[test]
fn the_plan_report_says_what_the_same_plan_takes_in_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let fp8 = ["--fp8-format", "hybrid"];
    let cluster = "examples/clusters/h100-16x8.json";
    let shown = common::pinned_llama2_13b_dry_run(cluster, &dir.path().join("run"), false, &fp8);
    assert!(
        shown.contains("FP8 hybrid, delayed recipe: the same plan in BF16 would take"),
        "{shown}"
    );
    let json = common::pinned_llama2_13b_dry_run(cluster, &dir.path().join("run2"), true, &fp8);
    let v: Value = serde_json::from_str(&json).unwrap();
    let e = &v["plan"]["estimate"];
    let bf16 = e["in_16_bit"]["iteration_ms"].as_f64().unwrap();
    assert!(bf16 > e["iteration_ms"].as_f64().unwrap());
    assert!(
        e["in_16_bit"]["peak_memory_bytes"].as_u64().unwrap()
            < e["peak_memory_bytes"].as_u64().unwrap()
    );
}
