//! What was decided, and how it compares with what the user wrote: the user's own parallel
//! configuration (the Megatron arguments' tp, pp, micro-batch, virtual stages,
//! recomputation, sequence parallelism, distributed optimizer) costed with the same model
//! as the plan, and `--pin yours` (keep it unless the plan is faster by more than the
//! model's stated error). The dry run and every launch show the result
//! ([`crate::report::plan::YoursReport`]).

use super::JobError;
use crate::cli::resolved::RunConfig;
use crate::cluster::ClusterProfile;
use crate::config::megatron::{parse_pins, Pin};
use crate::config::{Constraints, Settings};
use crate::model::calibration::Calibration;
use crate::model::time::{self, TimeEstimate, TimeRequest};
use crate::model::ParallelConfig;
use crate::plan::{self, MappingMode, Plan, PlanError, PlanOptions};
use crate::report::plan::{PinOutcome, Yours, YoursReport};

/// What was decided for one calibration: the plan to run, the settings and options it was
/// made with, and what it was compared with.
#[derive(Debug, Clone)]
pub struct Decided {
    /// The settings as read, before `--pin yours` (every decision starts from them).
    pub free: Settings,
    /// The settings the plan was made with: `free`, or with the user's configuration
    /// pinned when `--pin yours` kept it (re-plans after the trial or a failure keep it).
    pub settings: Settings,
    /// The planner's options, with the calibration this decision was made under.
    pub options: PlanOptions,
    pub plan: Plan,
    /// The user's configuration costed beside the plan; `None` when the arguments set no
    /// parallel setting.
    pub yours: Option<YoursReport>,
    /// The runner-up on its own best mapping ([`runner_up`]).
    pub runner_up: Option<(ParallelConfig, TimeEstimate)>,
}

/// Plans `free` (the settings as read) on `profile` with `options`, costs the user's
/// configuration beside it, applies `--pin yours`, and finds the runner-up. `ours`, when
/// given, is the plan of `free` already made (the trial's choice).
pub fn decide(
    config: &RunConfig,
    free: &Settings,
    profile: &ClusterProfile,
    options: PlanOptions,
    ours: Option<Plan>,
) -> Result<Decided, JobError> {
    let decision = decide_plan(
        free,
        &config.script.args,
        profile,
        &options,
        pin_yours(config.settings.pin.as_deref())?,
        ours,
    )?;
    let runner_up = runner_up(&decision.plan, &decision.settings, profile, &options);
    Ok(Decided {
        free: free.clone(),
        settings: decision.settings,
        options,
        plan: decision.plan,
        yours: decision.yours,
        runner_up,
    })
}

impl Decided {
    /// Decided again under the trial's fitted `calibration`: `chosen` (the trial's plan)
    /// stays the plan when the plan was ours; the user's configuration is costed again, and
    /// `--pin yours` weighed again, with the new estimates.
    pub fn with_calibration(
        &self,
        config: &RunConfig,
        profile: &ClusterProfile,
        calibration: Calibration,
        chosen: Plan,
    ) -> Result<Decided, JobError> {
        let options = PlanOptions {
            calibration,
            ..self.options.clone()
        };
        // The plan is ours, free of `--pin yours`, unless that pin kept the user's.
        let ours = (self.settings == self.free).then_some(chosen);
        decide(config, &self.free, profile, options, ours)
    }
}

/// The runner-up ([`Plan::runner_up`]) estimated on its own best mapping, so the report
/// can say what tells the winner from it.
pub fn runner_up(
    plan: &Plan,
    settings: &Settings,
    profile: &ClusterProfile,
    options: &PlanOptions,
) -> Option<(ParallelConfig, TimeEstimate)> {
    let second = &plan.top[plan.runner_up()?];
    let request = TimeRequest {
        model: &settings.model,
        training: &settings.training,
        config: &second.config,
        cluster: profile,
        placement: &second.placement,
        calibration: &options.calibration,
        options: options.time_options,
    };
    // The plan's own time model, as the winner's estimate and the table were made with.
    let estimate = time::estimate(&request, plan.search.time_model).ok()?;
    Some((second.config.clone(), estimate))
}

/// Megatron's options that set a parallel setting; a `--recompute-...` option is one too.
const PARALLEL_OPTIONS: [&str; 7] = [
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--micro-batch-size",
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--sequence-parallel",
    "--use-distributed-optimizer",
];

/// Whether the script's arguments set any parallel setting (then the user has a
/// configuration of their own to compare with). Arguments after `--` are not options.
fn wrote_parallel_settings(args: &[String]) -> bool {
    args.iter()
        .take_while(|a| a.as_str() != "--")
        .map(|a| a.split_once('=').map_or(a.as_str(), |(name, _)| name))
        .any(|name| PARALLEL_OPTIONS.contains(&name) || name.starts_with("--recompute-"))
}

/// Whether `--pin` holds `yours`.
pub fn pin_yours(pin: Option<&str>) -> Result<bool, JobError> {
    Ok(match pin {
        Some(text) => parse_pins(text)?.contains(&Pin::Yours),
        None => false,
    })
}

/// The user's configuration as constraints: everything the arguments say, Megatron's
/// defaults for what they leave out (as `--pin all` reads them); dp follows from the world.
fn yours_constraints(settings: &Settings) -> Constraints {
    let t = &settings.training;
    Constraints {
        tensor_parallel: Some(t.tensor_parallel),
        pipeline_parallel: Some(t.pipeline_parallel),
        data_parallel: None,
        micro_batch_size: Some(t.micro_batch_size),
        virtual_pipeline: Some(t.virtual_pipeline.unwrap_or(1)),
        sequence_parallel: Some(t.sequence_parallel),
        recompute: Some(t.recompute.clone()),
        distributed_optimizer: Some(t.distributed_optimizer),
        context_parallel: Some(t.context_parallel),
        ..crate::config::megatron::expert_pins_of_args(settings)
    }
}

/// The plan to run and what it was compared with.
struct Decision {
    plan: Plan,
    /// `None` when the arguments set no parallel setting.
    yours: Option<YoursReport>,
    /// See [`Decided::settings`].
    settings: Settings,
}

/// Plans `free` (the settings as read, `--pin yours` not applied; `ours`, when given, is
/// that plan already made), costs the user's configuration beside the plan when `args`
/// set any parallel setting, and with `pin_yours` keeps the user's configuration unless
/// the plan is faster by more than the model's stated error.
fn decide_plan(
    free: &Settings,
    args: &[String],
    profile: &ClusterProfile,
    options: &PlanOptions,
    pin_yours: bool,
    ours: Option<Plan>,
) -> Result<Decision, JobError> {
    let ours = match ours {
        Some(plan) => plan,
        None => plan::plan_subset(free, profile, options)?,
    };
    if !wrote_parallel_settings(args) && !pin_yours {
        return Ok(Decision {
            plan: ours,
            yours: None,
            settings: free.clone(),
        });
    }
    let yours = cost_yours(free, profile, options);
    let mut report = YoursReport {
        yours,
        ours: ours.config.clone(),
        ours_ms: ours.estimate.iteration_ms,
        stated_error: options.time_model.stated_error().unwrap_or(0.0),
        pin: PinOutcome::NotAsked,
    };
    if !pin_yours {
        return Ok(Decision {
            plan: ours,
            yours: Some(report),
            settings: free.clone(),
        });
    }
    report.pin = match report.gain() {
        Some(gain) if gain <= report.stated_error => PinOutcome::Kept,
        Some(_) => PinOutcome::Replaced,
        None => PinOutcome::CannotRun,
    };
    if report.pin != PinOutcome::Kept {
        return Ok(Decision {
            plan: ours,
            yours: Some(report),
            settings: free.clone(),
        });
    }
    let mut settings = free.clone();
    settings.constraints = yours_constraints(free);
    let plan = plan::plan_subset(&settings, profile, options)?;
    Ok(Decision {
        plan,
        yours: Some(report),
        settings,
    })
}

/// The user's configuration costed with the same model and calibration as the plan, on
/// torchrun's default order (as the user's own launch would place it).
fn cost_yours(settings: &Settings, profile: &ClusterProfile, options: &PlanOptions) -> Yours {
    let mut pinned = settings.clone();
    pinned.constraints = yours_constraints(settings);
    let mut identity = options.clone();
    identity.mapping = MappingMode::Identity;
    identity.space.uneven_layers = false;
    identity.top_k = 1;
    match plan::plan(&pinned, profile, &identity) {
        Ok(p) => Yours::Costed {
            config: p.config,
            iteration_ms: p.estimate.iteration_ms,
            peak_memory_bytes: p.estimate.peak_memory_bytes,
        },
        Err(PlanError::NothingFits {
            config_of_smallest,
            smallest_peak_bytes,
            usable_memory_bytes,
            ..
        }) => Yours::DoesNotFit {
            reason: format!(
                "it needs {:.1} GiB per GPU, {:.1} GiB are usable",
                smallest_peak_bytes as f64 / GIB,
                usable_memory_bytes as f64 / GIB
            ),
            config: *config_of_smallest,
        },
        Err(e @ PlanError::NoCandidates { .. }) => Yours::Invalid {
            reason: why_invalid(settings, profile).unwrap_or_else(|| e.to_string()),
        },
        Err(e) => Yours::Invalid {
            reason: e.to_string(),
        },
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// Which of Megatron's rules (see [`crate::plan::space`]) the user's configuration breaks
/// on this cluster, in words; `None` when it breaks none of these.
fn why_invalid(settings: &Settings, profile: &ClusterProfile) -> Option<String> {
    let t = &settings.training;
    let m = &settings.model;
    let (tp, pp, mbs) = (t.tensor_parallel, t.pipeline_parallel, t.micro_batch_size);
    let nodes = profile.nodes.len() as u64;
    let world = profile.gpu_count()? as u64;
    let per_node = world / nodes.max(1);
    if m.num_attention_heads % tp != 0 || m.num_query_groups % tp != 0 {
        return Some(format!(
            "tp {tp} does not divide the {} attention heads and {} query groups",
            m.num_attention_heads, m.num_query_groups
        ));
    }
    if per_node % tp != 0 {
        return Some(format!(
            "tp {tp} does not divide the {per_node} GPUs of a node (a tensor-parallel group stays inside one node)"
        ));
    }
    if world % (tp * pp) != 0 {
        return Some(format!(
            "tp {tp} × pp {pp} = {} does not divide the {world} GPUs",
            tp * pp
        ));
    }
    if m.num_layers % pp != 0 {
        return Some(format!(
            "pp {pp} does not divide the {} layers",
            m.num_layers
        ));
    }
    let dp = world / (tp * pp);
    if t.global_batch_size % (mbs * dp) != 0 {
        return Some(format!(
            "the global batch {} is not a multiple of micro-batch {mbs} × dp {dp}",
            t.global_batch_size
        ));
    }
    if let Some(v) = t.virtual_pipeline.filter(|v| *v > 1) {
        let microbatches = t.global_batch_size / (mbs * dp);
        if pp <= 2 {
            return Some(format!(
                "{v} virtual stages need more than 2 pipeline stages (pp {pp})"
            ));
        }
        if (m.num_layers / pp) % v != 0 {
            return Some(format!(
                "{v} virtual stages do not divide the {} layers of a stage",
                m.num_layers / pp
            ));
        }
        if microbatches % pp != 0 {
            return Some(format!(
                "the interleaved schedule needs the {microbatches} micro-batches to be a multiple of pp {pp}"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parallel_settings_are_found_in_either_spelling() {
        assert!(wrote_parallel_settings(&words(
            "--lr 1 --tensor-model-parallel-size 2"
        )));
        assert!(wrote_parallel_settings(&words("--micro-batch-size=4")));
        assert!(wrote_parallel_settings(&words("--recompute-activations")));
        assert!(!wrote_parallel_settings(&words(
            "--num-layers 4 --hidden-size 64"
        )));
        assert!(!wrote_parallel_settings(&words(
            "--lr 1 -- --sequence-parallel"
        )));
    }

    /// llama2-7b on two A100 nodes with `args`.
    fn decided(args: &str, pin: bool) -> Decision {
        let args = words(&format!("--global-batch-size 64 {args}"));
        let settings =
            crate::config::settings_from_megatron_args(&args, Some("llama2-7b"), &[]).unwrap();
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/clusters/a100-2x8.json");
        let profile = ClusterProfile::load(path).unwrap();
        decide_plan(
            &settings,
            &args,
            &profile,
            &PlanOptions::default(),
            pin,
            None,
        )
        .unwrap()
    }

    #[test]
    fn pin_yours_keeps_yours_only_within_the_stated_error() {
        // No parallel setting written: nothing to compare.
        assert!(decided("", false).yours.is_none());
        // Ours is 18 % faster: reported; with the pin, ours still runs.
        let replaced = decided(
            "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --micro-batch-size 2",
            true,
        );
        let report = replaced.yours.as_ref().unwrap();
        assert_eq!(report.pin, PinOutcome::Replaced);
        assert!(report.gain().unwrap() > report.stated_error);
        assert_eq!(replaced.plan.config, report.ours);
        assert!(report
            .to_human()
            .contains("--pin yours: ours runs (faster by"));
        // Within the stated error: yours runs, and stays pinned for the re-plans.
        let kept = decided(
            "--pipeline-model-parallel-size 2 --micro-batch-size 1 --use-distributed-optimizer --recompute-activations",
            true,
        );
        let report = kept.yours.as_ref().unwrap();
        assert_eq!(report.pin, PinOutcome::Kept, "{}", report.to_human());
        let Yours::Costed { config, .. } = &report.yours else {
            panic!("yours runs: {:?}", report.yours);
        };
        assert_eq!(&kept.plan.config.tp, &config.tp);
        assert_eq!(kept.plan.config.recompute, config.recompute);
        assert_eq!(kept.settings.constraints.pipeline_parallel, Some(2));
        // Not valid: ours runs, and the reason is Megatron's rule.
        let invalid = decided("--tensor-model-parallel-size 3", true);
        let report = invalid.yours.as_ref().unwrap();
        assert_eq!(report.pin, PinOutcome::CannotRun);
        assert!(report.to_human().contains(
            "yours is not a valid configuration: tp 3 does not divide the 32 attention heads"
        ));
        // Too big: said so, with the memory it needs.
        let big = decided(
            "--pipeline-model-parallel-size 2 --micro-batch-size 1",
            false,
        );
        assert!(matches!(
            big.yours.as_ref().unwrap().yours,
            Yours::DoesNotFit { .. }
        ));
    }

    #[test]
    fn pin_yours_is_read_from_the_list() {
        assert!(pin_yours(Some("yours")).unwrap());
        assert!(pin_yours(Some("tp=2,yours")).unwrap());
        assert!(!pin_yours(Some("all")).unwrap());
        assert!(!pin_yours(None).unwrap());
        assert!(pin_yours(Some("yours=1")).is_err());
    }
}
