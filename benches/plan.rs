//! The full planner (candidates, memory filter, ranking, rank mapping of the best
//! configurations) on 16, 64, 1024 and 8192 GPUs. `scripts/bench-plan` prints the same
//! cases as a table with evaluation counts; this is the statistically careful timing.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use pipette::cluster::ClusterProfile;
use pipette::config::settings_from_megatron_args;
use pipette::plan::{plan, PlanOptions};

#[path = "support/clusters.rs"]
mod clusters;

fn example(name: &str) -> ClusterProfile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/clusters")
        .join(name);
    ClusterProfile::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn full_plan(c: &mut Criterion) {
    let cases = [
        (16, example("a100-2x8.json"), "gpt3-13b"),
        (
            64,
            clusters::generated(
                8,
                8,
                &clusters::gpu("A100-SXM4-80GB", 312.0),
                240.0,
                23.5,
                64,
            ),
            "gpt3-13b",
        ),
        (1024, example("h100-128x8.json"), "gpt3-175b"),
        (
            8192,
            clusters::generated(
                1024,
                8,
                &clusters::gpu("H100-SXM5-80GB", 989.0),
                380.0,
                46.5,
                8192,
            ),
            "gpt3-175b",
        ),
    ];
    let options = PlanOptions::default();
    let mut group = c.benchmark_group("plan");
    for (gpus, cluster, model) in &cases {
        let settings = settings_from_megatron_args(&[], Some(model), &[]).unwrap();
        // The big cases take seconds each: criterion's fewest samples.
        group.sample_size(10);
        group.warm_up_time(Duration::from_millis(if *gpus >= 1024 { 1 } else { 500 }));
        group.measurement_time(Duration::from_secs(match *gpus {
            8192.. => 40,
            1024.. => 20,
            _ => 5,
        }));
        group.bench_function(format!("{gpus} GPUs, {model}"), |b| {
            b.iter(|| plan(&settings, cluster, &options).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, full_plan);
criterion_main!(benches);
