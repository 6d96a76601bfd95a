//! The planner end to end on the example clusters: the plan's JSON contract, the same plan
//! for the same seed whatever the thread count, pinned settings kept, a clear error (with
//! the smallest need and what would fit) when nothing fits, and errors for profiles the
//! planner cannot use.

use crate::common;

use pipette::cluster::profile::{GpuInventory, GpuSpec, PeakTflops, Provenance, Source};
use pipette::cluster::ClusterProfile;
use pipette::config::{settings_from_megatron_args, Recompute, Settings};
use pipette::model::time::TimeModel;
use pipette::plan::{plan, simpler, MappingMode, Plan, PlanError, PlanOptions};

fn preset(name: &str, args: &[&str]) -> Settings {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    settings_from_megatron_args(&args, Some(name), &[]).unwrap()
}

fn gpu(memory_gib: u64) -> GpuSpec {
    GpuSpec {
        index: 0,
        name: "A100-SXM4-40GB".into(),
        memory_bytes: memory_gib << 30,
        peak_tflops: PeakTflops::new(Some(312.0), 312.0),
        measured_tflops: Vec::new(),
        provenance: Provenance::new(Source::Datasheet),
    }
}

/// A Pipette bandwidth file's nodes with default GPUs of `memory_gib`.
fn pipette_cluster(nodes: usize, per_node: usize, memory_gib: u64) -> ClusterProfile {
    let hosts: Vec<String> = (0..nodes).map(|n| format!("gpu{n}")).collect();
    let rows: Vec<Vec<String>> = (0..nodes)
        .map(|a| {
            (0..nodes)
                .map(|b| {
                    if a == b {
                        "240".into()
                    } else {
                        format!("{}", 20.0 + (a * 7 + b * 3) as f64 % 4.0)
                    }
                })
                .collect()
        })
        .collect();
    let text = serde_json::json!({"gpus": hosts, "bandwidth": rows}).to_string();
    ClusterProfile::from_json_str(&text, "bandwidth.json")
        .unwrap()
        .with_default_gpus(gpu(memory_gib), per_node, 240.0)
        .unwrap()
}

fn quick() -> PlanOptions {
    PlanOptions {
        budget: Some(4_000),
        top_k: 4,
        ..PlanOptions::default()
    }
}

#[test]
fn plan_json_has_the_contract_keys() {
    let cluster = common::example_cluster("a100-4x8-degraded.json");
    let settings = preset("gpt3-1.3b", &["--global-batch-size", "128"]);
    let result = plan(&settings, &cluster, &quick()).unwrap_or_else(|e| panic!("{e}"));
    let json = serde_json::to_value(&result).unwrap();
    for key in [
        "tp",
        "pp",
        "dp",
        "micro_batch",
        "vpp",
        "recompute",
        "sequence_parallel",
        "distributed_optimizer",
        "layers_per_stage",
    ] {
        assert!(json["config"].get(key).is_some(), "config.{key} is missing");
    }
    let hosts: Vec<String> = cluster.hosts().map(str::to_string).collect();
    let mut order: Vec<String> = json["mapping"]["node_order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap().to_string())
        .collect();
    order.sort();
    assert_eq!(order, hosts, "every host gets one node rank");
    let visible = json["mapping"]["cuda_visible_devices"].as_object().unwrap();
    assert_eq!(visible.len(), 4);
    for (host, devices) in visible {
        let mut devices: Vec<u64> = devices
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        devices.sort_unstable();
        assert_eq!(
            devices,
            (0..8).collect::<Vec<_>>(),
            "{host} sees every GPU once"
        );
    }
    assert!(json["estimate"]["iteration_ms"].as_f64().unwrap() > 0.0);
    assert!(json["estimate"]["peak_memory_bytes"].as_u64().unwrap() > 0);
    assert!(json["baseline_mapping_ms"].as_f64().is_some());

    assert!(json["ties"]["count"].as_u64().unwrap() >= 1);

    // The numbers agree with each other: the plan runs the chosen tie (the simplest
    // within the model's stated error of the fastest).
    let best = &result.top[result.ties.chosen];
    assert_eq!(best.config, result.config);
    assert!((result.estimate.iteration_ms - best.mapped_ms).abs() <= 1e-9 * best.mapped_ms);
    assert!(best.mapped_ms <= result.baseline_mapping_ms);
    assert_eq!(result.baseline_mapping_ms, best.iteration_ms);
    assert!(result.estimate.peak_memory_bytes <= result.estimate.usable_memory_bytes);
    assert!(result
        .top
        .windows(2)
        .all(|w| w[0].mapped_ms <= w[1].mapped_ms));
    assert!(result.stats.fitting <= result.stats.candidates);
    assert_eq!(
        result.stats.evaluations,
        result.stats.ranking_evaluations + result.stats.mapping_evaluations
    );
    assert_eq!(
        result.stats.mapping_evaluations,
        result.top.iter().map(|t| t.evaluations).sum::<u64>()
    );
    // The degraded links are worth avoiding: the search finds a mapping faster than
    // torchrun's order, which the plan runs when it gains the threshold.
    assert!(
        best.searched_ms < result.baseline_mapping_ms,
        "{} vs {}",
        best.searched_ms,
        result.baseline_mapping_ms
    );
    let gain = 1.0 - best.searched_ms / result.baseline_mapping_ms;
    let runs_mapped = result.estimate.iteration_ms < result.baseline_mapping_ms;
    assert_eq!(
        runs_mapped,
        gain >= result.search.mapping_threshold,
        "{best:?}"
    );
}

fn plan_with_threads(threads: usize, settings: &Settings, cluster: &ClusterProfile) -> Plan {
    let options = PlanOptions {
        seed: 42,
        ..quick()
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(|| plan(settings, cluster, &options))
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn same_seed_same_plan_on_one_and_two_threads() {
    let cluster = common::example_cluster("a100-4x8-degraded.json");
    let settings = preset("gpt3-1.3b", &["--global-batch-size", "128"]);
    let one = plan_with_threads(1, &settings, &cluster);
    let two = plan_with_threads(2, &settings, &cluster);
    assert_eq!(
        serde_json::to_string(&one).unwrap(),
        serde_json::to_string(&two).unwrap()
    );
    // Another seed may find another mapping, never a worse-ranked search space.
    let other = plan(
        &settings,
        &cluster,
        &PlanOptions {
            seed: 43,
            ..quick()
        },
    )
    .unwrap();
    assert_eq!(other.stats.candidates, one.stats.candidates);
}

#[test]
fn pinned_settings_are_respected() {
    let args: Vec<String> = [
        "--global-batch-size",
        "128",
        "--tensor-model-parallel-size",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let pins = pipette::config::megatron::parse_pins("tp,pp=2,mbs=2").unwrap();
    let settings = settings_from_megatron_args(&args, Some("gpt3-1.3b"), &pins).unwrap();
    let result = plan(
        &settings,
        &common::example_cluster("a100-4x8-degraded.json"),
        &quick(),
    )
    .unwrap();
    for c in std::iter::once(&result.config).chain(result.top.iter().map(|t| &t.config)) {
        assert_eq!((c.tp, c.pp, c.dp, c.micro_batch), (2, 2, 8, 2), "{c:?}");
    }
}

#[test]
fn nothing_fits_names_the_smallest_need_and_the_fix() {
    // 70B parameters need over a terabyte of weights and optimizer state: 16 GPUs of
    // 16 GiB cannot hold them.
    let cluster = pipette_cluster(2, 8, 16);
    let settings = preset("llama2-70b", &[]);
    let err = plan(&settings, &cluster, &quick()).unwrap_err();
    let text = err.to_string();
    println!("{text}");
    let PlanError::NothingFits {
        smallest_peak_bytes,
        usable_memory_bytes,
        suggestions,
        ..
    } = &err
    else {
        panic!("expected NothingFits, got {err}");
    };
    assert!(smallest_peak_bytes > usable_memory_bytes);
    assert!(
        text.contains("the smallest needs") && text.contains("GiB"),
        "{text}"
    );
    assert!(!text.contains('\n'), "one line: {text}");
    assert!(
        suggestions
            .iter()
            .any(|s| s.contains("GPUs (") && s.contains("nodes of 8")),
        "{suggestions:?}"
    );

    // Pinned no-recomputation and a large micro-batch: unpinning them would fit.
    let mut settings = preset("gpt3-6.7b", &["--global-batch-size", "64"]);
    settings.constraints.recompute = Some(Recompute::None);
    settings.constraints.micro_batch_size = Some(8);
    let cluster = pipette_cluster(2, 8, 16);
    let err = plan(&settings, &cluster, &quick()).unwrap_err();
    println!("{err}");
    let PlanError::NothingFits { suggestions, .. } = &err else {
        panic!("expected NothingFits, got {err}");
    };
    assert!(
        suggestions.iter().any(|s| s.contains("full recomputation")),
        "{err}"
    );
    assert!(
        suggestions.iter().any(|s| s.contains("micro-batch 1")),
        "{err}"
    );
}

#[test]
fn profiles_the_planner_cannot_use_are_errors() {
    let settings = preset("gpt3-1.3b", &["--global-batch-size", "64"]);

    let text = r#"{"gpus": ["a", "b"], "bandwidth": [["240", "20"], ["20", "240"]]}"#;
    let unknown = ClusterProfile::from_json_str(text, "bw.json").unwrap();
    let err = plan(&settings, &unknown, &quick()).unwrap_err();
    assert!(
        matches!(&err, PlanError::UnknownGpus { host } if host == "a"),
        "{err}"
    );
    assert!(err.to_string().contains("pipette profile"), "{err}");

    let mut mixed = pipette_cluster(2, 8, 80);
    if let GpuInventory::Known { gpus, .. } = &mut mixed.nodes[1].gpus {
        gpus.truncate(4);
    }
    mixed = ClusterProfile {
        nodes: mixed
            .nodes
            .into_iter()
            .map(|mut n| {
                if let GpuInventory::Known { gpus, links } = &n.gpus {
                    if gpus.len() == 4 {
                        let rows: Vec<Vec<f64>> =
                            (0..4).map(|i| links.row(i)[..4].to_vec()).collect();
                        n.gpus = GpuInventory::Known {
                            gpus: gpus.clone(),
                            links: pipette::cluster::profile::LinkMatrix::from_rows(
                                &rows,
                                links.provenance.clone(),
                            )
                            .unwrap(),
                        };
                    }
                }
                n
            })
            .collect(),
        ..mixed
    };
    let err = plan(&settings, &mixed, &quick()).unwrap_err();
    assert!(matches!(err, PlanError::MixedGpuCounts { .. }), "{err}");
    assert!(
        err.to_string().contains("gpu1 has 4 GPUs but gpu0 has 8"),
        "{err}"
    );

    let empty = ClusterProfile {
        measured_perf: Vec::new(),
        note: None,
        nodes: Vec::new(),
        node_links: pipette::cluster::profile::LinkMatrix::uniform(
            0,
            1.0,
            Provenance::new(Source::Estimated),
        ),
    };
    assert_eq!(
        plan(&settings, &empty, &quick()).unwrap_err(),
        PlanError::EmptyCluster
    );

    let amp = PlanOptions {
        time_model: TimeModel::Amp,
        ..quick()
    };
    let err = plan(&settings, &pipette_cluster(2, 8, 80), &amp).unwrap_err();
    assert_eq!(err, PlanError::UnsupportedTimeModel(TimeModel::Amp));

    // bf16 on V100s: no tensor cores for it.
    let err = plan(
        &preset("gpt3-1.3b", &["--global-batch-size", "64"]),
        &common::example_cluster("v100-8x8.json"),
        &quick(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("bf16"), "{err}");
}

#[test]
fn the_compat_model_and_the_exhaustive_mode_plan_too() {
    let settings = preset("gpt3-1.3b", &["--global-batch-size", "64"]);
    let cluster = pipette_cluster(4, 8, 80);
    for (time_model, mapping) in [
        (TimeModel::PipetteCompat, MappingMode::Auto),
        (TimeModel::Pipette, MappingMode::Exhaustive),
        (TimeModel::Pipette, MappingMode::Identity),
    ] {
        let options = PlanOptions {
            time_model,
            mapping,
            top_k: 2,
            ..quick()
        };
        let result = plan(&settings, &cluster, &options).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(result.estimate.time.model, time_model);
        assert!(result.estimate.iteration_ms <= result.baseline_mapping_ms * (1.0 + 1e-12));
        let chosen = &result.top[result.ties.chosen];
        assert!((result.estimate.iteration_ms - chosen.mapped_ms).abs() <= 1e-9 * chosen.mapped_ms);
        if mapping == MappingMode::Exhaustive || time_model == TimeModel::PipetteCompat {
            // Uniform default GPUs: only the 4! node orders matter.
            assert!(
                result.top.iter().all(|t| t.evaluations == 24),
                "{:?}",
                result.top
            );
        }
    }
}

#[test]
fn ties_within_the_stated_error_go_to_the_simplest_configuration() {
    let cluster = common::example_cluster("a100-2x8.json");
    let settings = preset("gpt3-13b", &["--global-batch-size", "64"]);
    let options = PlanOptions {
        top_k: 8,
        ..quick()
    };
    let result = plan(&settings, &cluster, &options).unwrap_or_else(|e| panic!("{e}"));
    let ties = result.ties;
    let window = TimeModel::Pipette.stated_error().unwrap();
    assert_eq!(ties.window, window);
    let fastest = result.top[0].mapped_ms;
    // Every tie lies within the stated error of the fastest, and the next one does not.
    for (i, r) in result.top.iter().enumerate() {
        assert_eq!(
            i < ties.count,
            r.mapped_ms <= fastest * (1.0 + window),
            "#{} at {} ms against {fastest} ms",
            i + 1,
            r.mapped_ms
        );
    }
    // This case has ties (else it tests nothing), and the plan runs the simplest of them.
    assert!(ties.count >= 2, "{:?}", result.top);
    let chosen = &result.top[ties.chosen];
    assert_eq!(result.config, chosen.config);
    for r in &result.top[..ties.count] {
        assert_ne!(
            simpler(&r.config, &chosen.config),
            std::cmp::Ordering::Less,
            "{:?} is simpler than the chosen {:?}",
            r.config,
            chosen.config
        );
    }
    assert_eq!(result.estimate.iteration_ms, chosen.mapped_ms);
    // The compatibility model states no error: no ties, the fastest runs.
    let compat = PlanOptions {
        time_model: TimeModel::PipetteCompat,
        ..options
    };
    let result = plan(&settings, &cluster, &compat).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((result.ties.count, result.ties.chosen), (1, 0));
    assert_eq!(result.config, result.top[0].config);
}

#[test]
fn simpler_means_fewer_stages_then_smaller_tp_then_larger_micro_batches() {
    use pipette::model::parallel::ParallelConfig;
    use std::cmp::Ordering::{Equal, Less};
    let c = |tp, pp, mb| ParallelConfig::even(24, tp, pp, 16 / (tp * pp), mb);
    assert_eq!(simpler(&c(8, 1, 1), &c(1, 2, 4)), Less);
    assert_eq!(simpler(&c(1, 2, 1), &c(2, 2, 4)), Less);
    assert_eq!(simpler(&c(2, 2, 4), &c(2, 2, 1)), Less);
    let mut interleaved = c(2, 2, 4);
    interleaved.vpp = Some(2);
    assert_eq!(simpler(&c(2, 2, 4), &interleaved), Less);
    let mut selective = c(2, 2, 4);
    selective.recompute = Recompute::Selective;
    assert_eq!(simpler(&c(2, 2, 4), &selective), Less);
    assert_eq!(simpler(&c(2, 2, 4), &c(2, 2, 4)), Equal);
}

#[test]
fn the_mapping_keeps_torchruns_order_unless_it_gains_the_threshold() {
    // A degraded cluster, where a mapping pays: with no threshold the search's best
    // mapping runs; with a threshold above its gain torchrun's order stays.
    let cluster = common::example_cluster("a100-4x8-degraded.json");
    let settings = preset("gpt3-1.3b", &["--global-batch-size", "128"]);
    let free = PlanOptions {
        mapping_threshold: 0.0,
        ..quick()
    };
    let mapped = plan(&settings, &cluster, &free).unwrap_or_else(|e| panic!("{e}"));
    let chosen = &mapped.top[mapped.ties.chosen];
    assert_eq!(chosen.mapped_ms, chosen.searched_ms);
    let gain = 1.0 - chosen.searched_ms / chosen.iteration_ms;
    assert!(gain > 0.0, "the search found nothing better: {chosen:?}");

    let strict = PlanOptions {
        mapping_threshold: gain + 0.001,
        ..quick()
    };
    let kept = plan(&settings, &cluster, &strict).unwrap_or_else(|e| panic!("{e}"));
    for r in &kept.top {
        // Every configuration whose search gained less than the threshold keeps the order.
        if r.searched_ms > r.iteration_ms * (1.0 - strict.mapping_threshold) {
            assert_eq!(r.mapped_ms, r.iteration_ms, "{r:?}");
        }
    }
    if kept.config == chosen.config {
        let identity = pipette::plan::MappingState::identity(4, 8);
        assert_eq!(kept.mapping.state, identity);
        assert_eq!(kept.estimate.iteration_ms, kept.baseline_mapping_ms);
    }
    assert_eq!(kept.search.mapping_threshold, gain + 0.001);
    assert_eq!(
        PlanOptions::default().mapping_threshold,
        pipette::plan::DEFAULT_MAPPING_THRESHOLD
    );
}

/// The first 16 trays of the example GB200 NVL72 rack: 64 GPUs in one NVLink domain.
fn nvl72_16_trays() -> ClusterProfile {
    let racks = common::example_cluster("gb200-nvl72-4racks.json");
    let trays = racks.at_positions(&(0..16).collect::<Vec<_>>());
    let domain = trays.nodes[0].nvlink_domain.clone();
    assert!(
        domain.is_some(),
        "the example's trays name their NVLink domain"
    );
    assert!(trays.nodes.iter().all(|n| n.nvlink_domain == domain));
    trays
}

/// Issue 30: a 128K-token Llama-3-70B and a 1M-token Llama-3-8B plan on 64 GB200 with a
/// context-parallel size the model chose, Megatron's split rules kept, and every stage's
/// tp × cp ranks on GPUs of one NVLink domain (timing: scripts/bench-plan).
#[test]
fn long_contexts_plan_with_context_parallelism_inside_the_nvlink_domain() {
    let cluster = nvl72_16_trays();
    for (name, seq, batch) in [
        ("llama3-70b", 131_072u64, 64u64),
        ("llama3-8b", 1_048_576, 16),
    ] {
        let s = seq.to_string();
        let b = batch.to_string();
        let settings = preset(
            name,
            &[
                "--seq-length",
                &s,
                "--max-position-embeddings",
                &s,
                "--global-batch-size",
                &b,
            ],
        );
        let plan = plan(&settings, &cluster, &PlanOptions::default())
            .unwrap_or_else(|e| panic!("{name} at {seq} tokens: {e}"));
        let c = &plan.config;
        assert!(c.cp > 1, "{name} at {seq} tokens planned without cp: {c:?}");
        assert_eq!(seq % (2 * c.cp), 0);
        if c.sequence_parallel {
            assert_eq!((seq / c.cp) % c.tp, 0);
        }
        assert_eq!(c.world_size(), 64);
        let block = (c.tp * c.cp) as usize;
        for group in plan.placement.devices.chunks(block) {
            let domain = &cluster.nodes[group[0].node].nvlink_domain;
            assert!(
                group
                    .iter()
                    .all(|d| &cluster.nodes[d.node].nvlink_domain == domain),
                "a tp × cp group leaves the NVLink domain: {group:?}"
            );
        }
        // The estimate shows the exchange and stays finite.
        assert!(plan.estimate.iteration_ms.is_finite() && plan.estimate.iteration_ms > 0.0);
        assert!(plan.estimate.peak_memory_bytes <= plan.estimate.usable_memory_bytes);
    }
}

/// Two racks' trays, four of each: a stage's tp × cp ranks never span the two NVLink
/// domains, though a single rack's trays may share one group.
#[test]
fn context_parallel_groups_never_cross_nvlink_domains() {
    let racks = common::example_cluster("gb200-nvl72-4racks.json");
    let cluster = racks.at_positions(&[14, 15, 16, 17, 18, 19, 20, 21]);
    assert_ne!(
        cluster.nodes[0].nvlink_domain,
        cluster.nodes[7].nvlink_domain
    );
    let s = "131072";
    let settings = preset(
        "llama3-8b",
        &[
            "--seq-length",
            s,
            "--max-position-embeddings",
            s,
            "--global-batch-size",
            "16",
        ],
    );
    let options = PlanOptions {
        mapping: MappingMode::Identity,
        top_k: 8,
        ..PlanOptions::default()
    };
    let plan = plan(&settings, &cluster, &options).unwrap_or_else(|e| panic!("{e}"));
    assert!(plan.top.iter().any(|t| t.config.cp > 1));
    assert!(
        plan.top.iter().any(|t| t.config.tp * t.config.cp > 4),
        "groups span trays"
    );
    for ranked in &plan.top {
        let c = &ranked.config;
        assert!(
            c.tp * c.cp <= 16,
            "{c:?} is wider than one rack's four trays"
        );
        for group in ranked.placement.devices.chunks((c.tp * c.cp) as usize) {
            let domain = &cluster.nodes[group[0].node].nvlink_domain;
            assert!(group
                .iter()
                .all(|d| &cluster.nodes[d.node].nvlink_domain == domain));
        }
    }
}
