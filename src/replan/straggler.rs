//! The plans a straggler leaves us: keep the plan, re-map on every node with the straggler
//! at its measured speed, leave it out, or, when the plan has hot spares, swap it for one
//! (the plan kept, the spare in its place). Each is planned and timed by the model on the
//! cluster as it now is (the straggler's GPUs slowed by the measured factor), so that the
//! supervisor ([`crate::supervise::stragglers`]) can weigh them against a restart. Pure.
//!
//! Both re-plans follow the failure rule ([`super::failure::replan`]): the global batch is
//! kept, and tp × pp too when a checkpoint exists, so the checkpoint loads as it is.

use crate::cluster::profile::GpuInventory;
use crate::cluster::ClusterProfile;
use crate::config::Settings;
use crate::launch::CheckpointState;
use crate::model::time::estimate_time;
use crate::plan::{Plan, PlanOptions};

use super::failure::{replan, swap_for_spares, CheckpointFormat, Failed, Replanned};

/// `profile` with every GPU of `host` `slowdown` times slower (its peak and measured
/// throughput divided by it): the cluster as the straggler report measured it.
pub fn slowed(profile: &ClusterProfile, host: &str, slowdown: f64) -> ClusterProfile {
    let mut profile = profile.clone();
    let factor = slowdown.max(1.0);
    for node in profile
        .nodes
        .iter_mut()
        .filter(|n| crate::exec::same_host(&n.host, host))
    {
        if let GpuInventory::Known { gpus, .. } = &mut node.gpus {
            for gpu in gpus {
                gpu.peak_tflops.fp16 /= factor;
                gpu.peak_tflops.bf16 = gpu.peak_tflops.bf16.map(|t| t / factor);
                for m in &mut gpu.measured_tflops {
                    m.tflops /= factor;
                }
            }
        }
    }
    profile
}

/// The choices as the model sees them.
#[derive(Debug, Clone)]
pub struct StragglerChoices {
    /// The running plan on the cluster as it was profiled, ms per iteration (the model's).
    pub healthy_ms: Result<f64, String>,
    /// The running plan on the slowed cluster, ms per iteration (the model's; `Err`: why
    /// the model could not time it).
    pub keep_ms: Result<f64, String>,
    /// Re-planned on every node of the slowed cluster, and its time by the same model.
    pub remap: Result<(f64, Replanned), String>,
    /// Re-planned without the straggler, and its time.
    pub leave_out: Result<(f64, Replanned), String>,
    /// The plan kept with a spare in the straggler's place, and its time; `None` when the
    /// plan has no spare.
    pub swap: Option<Result<(f64, Replanned), String>>,
}

/// The running plan and what the planner needs to plan it again: what a straggler's
/// choices are planned and timed from.
#[derive(Debug, Clone, Copy)]
pub struct RunningPlan<'a> {
    pub settings: &'a Settings,
    pub options: &'a PlanOptions,
    pub plan: &'a Plan,
    /// The cluster as it was profiled.
    pub profile: &'a ClusterProfile,
    /// The attempt's nodes.
    pub hosts: &'a [String],
    /// How the job writes its checkpoints (whether a re-plan may change tp/pp).
    pub format: &'a CheckpointFormat,
}

/// What the `running` plan can become with `host` `slowdown` times slower, resuming from
/// `checkpoint`.
pub fn choices(
    running: &RunningPlan<'_>,
    host: &str,
    slowdown: f64,
    checkpoint: CheckpointState,
) -> StragglerChoices {
    let RunningPlan {
        settings,
        options,
        plan,
        profile,
        hosts,
        format,
    } = *running;
    let slow = slowed(profile, host, slowdown);
    // Every choice timed by the same model and options, so that their ratios hold whatever
    // the planner's own time model: the supervisor scales them to the measured pace.
    let time = |plan: &Plan, cluster: &ClusterProfile| {
        estimate_time(
            &settings.model,
            &settings.training,
            &plan.config,
            cluster,
            &plan.placement,
            &options.calibration,
        )
        .map(|e| e.iteration_ms)
        .map_err(|e| e.to_string())
    };
    let healthy_ms = time(plan, profile);
    let keep_ms = time(plan, &slow);
    let timed = |r: Result<Replanned, String>| {
        let r = r?;
        Ok((time(&r.plan, &r.profile)?, r))
    };
    // A re-map keeps every node: leaving the slow one out is the third choice.
    let mut every_node = options.clone();
    every_node.nodes.min_nodes = hosts.len();
    let remap = timed(
        replan(
            settings,
            &slow,
            Failed {
                survivors: hosts,
                spares: &[],
                previous: &plan.config,
            },
            &every_node,
            checkpoint,
            format,
        )
        .map_err(|e| e.to_string()),
    );
    let rest: Vec<String> = hosts.iter().filter(|h| *h != host).cloned().collect();
    let failed = Failed {
        survivors: &rest,
        spares: &plan.spares,
        previous: &plan.config,
    };
    // On the cluster as profiled: the straggler is not in it, the spare runs at its speed.
    let swap = (!plan.spares.is_empty()).then(|| {
        timed(swap_for_spares(
            settings, profile, failed, options, checkpoint,
        ))
    });
    let leave_out = timed(
        replan(
            settings,
            profile,
            Failed {
                survivors: &rest,
                spares: &[],
                previous: &plan.config,
            },
            options,
            checkpoint,
            format,
        )
        .map_err(|e| e.to_string()),
    );
    StragglerChoices {
        healthy_ms,
        keep_ms,
        remap,
        leave_out,
        swap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::profile::tests::a100;
    use crate::cluster::profile::{LinkMatrix, NodeProfile, Provenance, Source};

    fn node(host: &str) -> NodeProfile {
        NodeProfile {
            host: host.into(),
            gpus: GpuInventory::Known {
                gpus: vec![a100(0), a100(1)],
                links: LinkMatrix::uniform(2, 240.0, Provenance::new(Source::Estimated)),
            },
            nvlink_domain: None,
        }
    }

    #[test]
    fn only_the_stragglers_gpus_are_slowed() {
        let profile = ClusterProfile {
            note: None,
            nodes: vec![node("a"), node("b")],
            node_links: LinkMatrix::uniform(2, 25.0, Provenance::new(Source::Estimated)),
            measured_perf: Vec::new(),
        };
        let slow = slowed(&profile, "b", 2.0);
        let peaks = |p: &ClusterProfile, n: usize| -> Vec<f64> {
            p.nodes[n]
                .gpus()
                .unwrap()
                .iter()
                .map(|g| g.peak_tflops.fp16)
                .collect()
        };
        assert_eq!(peaks(&slow, 0), [312.0, 312.0]);
        assert_eq!(peaks(&slow, 1), [156.0, 156.0]);
        assert_eq!(
            slow.nodes[1].gpus().unwrap()[0].peak_tflops.bf16,
            Some(156.0)
        );
        // A "slowdown" below 1 (a node faster than the rest) changes nothing.
        assert_eq!(peaks(&slowed(&profile, "b", 0.5), 1), [312.0, 312.0]);
    }
}
