//! The planner on clusters that mix kinds of GPU: on the mixed example clusters the
//! uneven layout it plans is faster, by its own model, than the best plan with an even
//! split, and every stage fits in its own GPUs' memory (checked here from the placement
//! and the memory model, not from the planner's own figures); for random mixes of GPU
//! kinds the split sums to the model's layers, fits every stage and never gives a faster
//! stage fewer layers than a slower one with the same memory unless it is full.

use crate::common;

use pipette::cluster::profile::{
    GpuInventory, GpuSpec, LinkMatrix, NodeProfile, PeakTflops, Provenance, Source,
};
use pipette::cluster::ClusterProfile;
use pipette::config::{settings_from_megatron_args, Settings};
use pipette::model::calibration::Calibration;
use pipette::model::memory::estimate_memory;
use pipette::model::parallel::Device;
use pipette::plan::{plan, MappingMode, MemoryHeadroom, Plan, PlanOptions};
use pipette::report::plan::plan_to_human;
use proptest::prelude::*;

fn preset(name: &str, args: &[&str]) -> Settings {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    settings_from_megatron_args(&args, Some(name), &[]).unwrap()
}

fn even_only(options: &PlanOptions) -> PlanOptions {
    let mut even = options.clone();
    even.space.uneven_layers = false;
    even
}

/// The GPU running `device`.
fn gpu(cluster: &ClusterProfile, device: Device) -> &GpuSpec {
    match &cluster.nodes[device.node].gpus {
        GpuInventory::Known { gpus, .. } => &gpus[device.gpu],
        GpuInventory::Unknown => panic!("no GPUs on node {}", device.node),
    }
}

/// Per stage: its estimated peak per GPU, and the smallest usable memory of the GPUs the
/// placement gives it (memory less `headroom`).
fn stage_fit(
    settings: &Settings,
    cluster: &ClusterProfile,
    p: &Plan,
    headroom: MemoryHeadroom,
) -> Vec<(u64, u64)> {
    let c = &p.config;
    let memory = estimate_memory(
        &settings.model,
        &settings.training,
        c,
        &Calibration::default(),
    );
    let per_stage = (c.tp * c.dp) as usize;
    (0..c.pp as usize)
        .map(|s| {
            let usable = p.placement.devices[per_stage * s..per_stage * (s + 1)]
                .iter()
                .map(|&d| {
                    let m = gpu(cluster, d).memory_bytes;
                    m - headroom.bytes(m)
                })
                .min()
                .unwrap();
            (memory.stages[s].total_bytes, usable)
        })
        .collect()
}

/// Plans `settings` on the mixed `file` with uneven splits and with even splits only, and
/// checks what the issue asks: the uneven layout is faster by the model, every stage fits
/// in its own GPUs, and the report and JSON show the comparison.
fn uneven_beats_even(file: &str, settings: &Settings) -> (Plan, Plan) {
    let cluster = common::example_cluster(file);
    let options = PlanOptions::default();
    let uneven = plan(settings, &cluster, &options).unwrap_or_else(|e| panic!("{e}"));
    let even = plan(settings, &cluster, &even_only(&options)).unwrap_or_else(|e| panic!("{e}"));
    let layers = &uneven.config.layers_per_stage;
    assert!(
        layers.iter().any(|l| *l != layers[0]),
        "{file}: the plan splits evenly: {layers:?}"
    );
    assert!(
        even.config
            .layers_per_stage
            .iter()
            .all(|l| *l == even.config.layers_per_stage[0]),
        "{file}: the even plan is uneven"
    );
    assert!(
        uneven.estimate.iteration_ms < even.estimate.iteration_ms,
        "{file}: uneven {layers:?} {:.1} ms is not below the best even split's {:.1} ms",
        uneven.estimate.iteration_ms,
        even.estimate.iteration_ms
    );
    for (s, (peak, usable)) in stage_fit(settings, &cluster, &uneven, options.headroom)
        .into_iter()
        .enumerate()
    {
        assert!(
            peak <= usable,
            "{file}: stage {s} needs {peak} bytes, its GPUs give {usable}"
        );
    }
    // The search's cost of the winner (on the class-ordered view of the cluster) is the
    // estimate on the cluster itself; the winner is the chosen tie.
    let best = &uneven.top[uneven.ties.chosen];
    assert_eq!(best.config, uneven.config);
    assert!(
        (best.mapped_ms - uneven.estimate.iteration_ms).abs() <= 1e-9 * best.mapped_ms,
        "{file}: mapped {} ms, estimated {} ms",
        best.mapped_ms,
        uneven.estimate.iteration_ms
    );
    assert!(best.mapped_ms <= uneven.baseline_mapping_ms);
    // The report's comparison is the even plan.
    let h = uneven
        .heterogeneous
        .as_ref()
        .expect("a mixed cluster's plan describes its stages");
    assert_eq!(h.stages.len() as u64, uneven.config.pp);
    let compared = h.even_split.as_ref().expect("an even split fits");
    assert_eq!(compared.iteration_ms, even.estimate.iteration_ms);
    assert_eq!(compared.config, even.config);
    let text = plan_to_human(&uneven, None);
    assert!(text.contains("Stages on mixed GPUs"), "{text}");
    assert!(text.contains("the best even split"), "{text}");
    let json = serde_json::to_value(&uneven).unwrap();
    assert!(
        json["heterogeneous"]["stages"][0]["gpu"].is_string(),
        "{json}"
    );
    assert!(json["heterogeneous"]["even_split"]["iteration_ms"].is_number());
    (uneven, even)
}

#[test]
fn a100_and_v100_get_layers_by_speed_and_beat_every_even_split() {
    // GPT-3 13B in fp16 (V100 has no bf16): too big for one V100 node's memory unless
    // pipelined, and the A100s are 2.5 times as fast.
    let settings = preset("gpt3-13b", &["--fp16", "--global-batch-size", "64"]);
    let (uneven, even) = uneven_beats_even("a100-v100-mixed-4x8.json", &settings);
    let h = uneven.heterogeneous.as_ref().unwrap();
    // Every A100 stage holds more layers than every V100 stage.
    let on = |name: &str| -> Vec<u64> {
        h.stages
            .iter()
            .filter(|s| s.gpu.starts_with(name))
            .map(|s| s.layers)
            .collect()
    };
    let (a100, v100) = (on("A100"), on("V100"));
    assert!(!a100.is_empty() && !v100.is_empty(), "{h:?}");
    assert!(
        a100.iter().min() > v100.iter().max(),
        "A100 stages {a100:?}, V100 stages {v100:?}"
    );
    eprintln!(
        "a100-v100 gpt3-13b: uneven {:?} {:.1} ms, even {:?} {:.1} ms",
        uneven.config.layers_per_stage,
        uneven.estimate.iteration_ms,
        even.config.layers_per_stage,
        even.estimate.iteration_ms
    );
}

#[test]
fn h100_and_two_kinds_of_a100_get_layers_by_speed_and_memory() {
    let settings = preset("llama2-13b", &["--global-batch-size", "64"]);
    let (uneven, even) = uneven_beats_even("h100-a100-mixed-4x8.json", &settings);
    eprintln!(
        "h100-a100 llama2-13b: uneven {:?} {:.1} ms, even {:?} {:.1} ms\n{}",
        uneven.config.layers_per_stage,
        uneven.estimate.iteration_ms,
        even.config.layers_per_stage,
        even.estimate.iteration_ms,
        plan_to_human(&uneven, None)
    );
}

#[test]
fn mapping_keeps_every_stage_on_its_kind_of_gpu() {
    // Annealing with a budget large enough to try many node swaps: the stages must still
    // sit on the GPUs their layers were sized for.
    let cluster = common::example_cluster("a100-v100-mixed-4x8.json");
    let settings = preset("gpt3-13b", &["--fp16", "--global-batch-size", "64"]);
    let options = PlanOptions {
        mapping: MappingMode::Anneal,
        budget: Some(20_000),
        top_k: 2,
        ..PlanOptions::default()
    };
    let p = plan(&settings, &cluster, &options).unwrap_or_else(|e| panic!("{e}"));
    let h = p.heterogeneous.as_ref().unwrap();
    let per_stage = (p.config.tp * p.config.dp) as usize;
    for stage in &h.stages {
        for &d in &p.placement.devices[per_stage * stage.stage..per_stage * (stage.stage + 1)] {
            assert!(
                stage.gpu.contains(&gpu(&cluster, d).name),
                "stage {} ({}) runs on {}",
                stage.stage,
                stage.gpu,
                gpu(&cluster, d).name
            );
        }
    }
    for (s, (peak, usable)) in stage_fit(&settings, &cluster, &p, options.headroom)
        .into_iter()
        .enumerate()
    {
        assert!(peak <= usable, "stage {s}: {peak} > {usable}");
    }
}

#[test]
fn nothing_fits_names_the_stage_and_its_gpus() {
    // GPT-3 175B on 32 mixed GPUs fits nowhere.
    let cluster = common::example_cluster("a100-v100-mixed-4x8.json");
    let settings = preset("gpt3-175b", &["--fp16", "--global-batch-size", "64"]);
    let err = plan(&settings, &cluster, &PlanOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("no configuration fits"), "{text}");
    assert!(text.contains(" on its stage "), "{text}");
    assert!(
        text.contains("(V100-SXM2-32GB)") || text.contains("(A100-SXM4-80GB)"),
        "{text}"
    );
    // More GPUs of the kind with the most memory.
    assert!(text.contains("A100-SXM4-80GB) would fit"), "{text}");
}

#[test]
fn homogeneous_clusters_have_no_stage_report() {
    let cluster = common::example_cluster("a100-2x8.json");
    let settings = preset("gpt3-1.3b", &["--global-batch-size", "64"]);
    let options = PlanOptions {
        budget: Some(2_000),
        top_k: 2,
        ..PlanOptions::default()
    };
    let p = plan(&settings, &cluster, &options).unwrap();
    assert!(p.heterogeneous.is_none());
    let json = serde_json::to_value(&p).unwrap();
    assert!(json.get("heterogeneous").is_none(), "{json}");
}

// Random mixes.

/// A kind of GPU: peak TFLOPS and memory in GiB.
const KINDS: [(f64, u64); 5] = [
    (125.0, 16),
    (125.0, 32),
    (312.0, 40),
    (312.0, 80),
    (989.0, 80),
];

/// A cluster of `counts[k]` nodes of kind `kinds[k]`, 4 GPUs each; every GPU pair and every
/// node pair equally fast, so that a faster GPU makes a faster stage.
fn mixed_cluster(kinds: &[(usize, usize)]) -> ClusterProfile {
    let mut nodes = Vec::new();
    for (k, &(kind, count)) in kinds.iter().enumerate() {
        let (tflops, gib) = KINDS[kind];
        for n in 0..count {
            let gpus = (0..4)
                .map(|i| GpuSpec {
                    index: i,
                    name: format!("GPU{tflops}-{gib}GB"),
                    memory_bytes: gib << 30,
                    peak_tflops: PeakTflops::new(Some(tflops), tflops),
                    measured_tflops: Vec::new(),
                    provenance: Provenance::new(Source::Datasheet),
                })
                .collect();
            nodes.push(NodeProfile {
                host: format!("k{k}n{n}"),
                gpus: GpuInventory::Known {
                    gpus,
                    links: LinkMatrix::uniform(4, 200.0, Provenance::new(Source::Estimated)),
                },
                nvlink_domain: None,
            });
        }
    }
    let count = nodes.len();
    ClusterProfile {
        measured_perf: Vec::new(),
        note: None,
        nodes,
        node_links: LinkMatrix::uniform(count, 20.0, Provenance::new(Source::Estimated)),
    }
}

fn mixes() -> impl Strategy<Value = (Vec<(usize, usize)>, u64)> {
    (
        prop::sample::subsequence((0..KINDS.len()).collect::<Vec<_>>(), 2..=3),
        prop::collection::vec(1usize..=2, 3),
        4u64..=24,
    )
        .prop_map(|(kinds, counts, layers)| {
            (kinds.into_iter().zip(counts).collect::<Vec<_>>(), layers)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn random_mixes_split_all_layers_within_memory_and_by_speed((kinds, layers) in mixes()) {
        let cluster = mixed_cluster(&kinds);
        let layers_arg = layers.to_string();
        let args: Vec<String> = [
            "--num-layers", &layers_arg, "--hidden-size", "2048", "--num-attention-heads", "16",
            "--seq-length", "2048", "--max-position-embeddings", "2048", "--vocab-size",
            "50000", "--global-batch-size", "120", "--bf16",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let settings = settings_from_megatron_args(&args, None, &[]).unwrap();
        let options = PlanOptions {
            mapping: MappingMode::Identity,
            top_k: 1,
            ..PlanOptions::default()
        };
        let p = match plan(&settings, &cluster, &options) {
            Ok(p) => p,
            Err(e) => {
                // (A tiny model on 20 GPUs may have no configuration at all.)
                prop_assert!(
                    e.to_string().contains("no configuration fits")
                        || e.to_string().contains("no parallel configuration"),
                    "{}", e
                );
                return Ok(());
            }
        };
        let c = &p.config;
        prop_assert_eq!(c.layers_per_stage.iter().sum::<u64>(), layers);
        let fit = stage_fit(&settings, &cluster, &p, options.headroom);
        for (s, (peak, usable)) in fit.iter().enumerate() {
            prop_assert!(peak <= usable, "stage {} needs {} > {}", s, peak, usable);
        }
        // Middle stages (the ends carry the embedding and the loss): a faster one with the
        // same usable memory never holds fewer layers unless one more would not fit.
        let per_stage = (c.tp * c.dp) as usize;
        let speed = |s: usize| {
            p.placement.devices[per_stage * s..per_stage * (s + 1)]
                .iter()
                .map(|&d| gpu(&cluster, d).peak_tflops.fp16)
                .fold(f64::INFINITY, f64::min)
        };
        let pp = c.pp as usize;
        for i in 1..pp.saturating_sub(1) {
            for j in 1..pp - 1 {
                if speed(i) > speed(j) && fit[i].1 == fit[j].1
                    && c.layers_per_stage[i] < c.layers_per_stage[j]
                {
                    let mut more = c.clone();
                    more.layers_per_stage[i] += 1;
                    let need = estimate_memory(
                        &settings.model, &settings.training, &more, &Calibration::default(),
                    ).stages[i].total_bytes;
                    prop_assert!(need > fit[i].1,
                        "stage {} (faster) holds {:?} layers, fewer than stage {}",
                        i, c.layers_per_stage, j);
                }
            }
        }
    }
}
