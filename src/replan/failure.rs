//! The plan for the survivors of a failure.
//!
//! The rule (see DESIGN.md, "Re-planning and checkpoints"):
//!
//! 1. The global batch is the user's and stays; only how it is split changes (fewer
//!    data-parallel ranks, more gradient accumulation). A `dp` the user pinned is released:
//!    fewer nodes cannot keep it.
//! 2. When a checkpoint exists, prefer a plan that keeps tensor and pipeline parallelism as
//!    they were (and the virtual stages, the distributed optimizer and an even layer
//!    split): every rank's model shard is then the same, so the checkpoint loads without
//!    resharding, in any checkpoint format.
//! 3. When no such plan exists on the survivors (tp × pp no longer divides their GPUs, or
//!    nothing fits in memory), change tp/pp only when the checkpoint format can be
//!    resharded: Megatron's `torch_dist` (the default), `torch_dcp` and `fsdp_dtensor`
//!    reshard model weights across tp/pp, but with the distributed optimizer its state
//!    reshards across tp/pp only when saved with `--dist-ckpt-optim-fully-reshardable`.
//!    The legacy `torch` format never reshards. Say so either way. A tp, pp or vpp the
//!    user pinned is released then, when no plan on the survivors can keep it.
//! 4. With no checkpoint yet (or no `--save`), any plan will do: the job starts again.
//!
//! Plans with the same planner options (and seed) as the first launch. Pure: the checkpoint
//! is read by the supervisor's driver ([`crate::launch::read_checkpoint`]) and passed in.

use crate::cluster::profile::{DeviceSelection, NodeSelection};
use crate::cluster::ClusterProfile;
use crate::config::Settings;
use crate::launch::CheckpointState;
use crate::model::parallel::ParallelConfig;
use crate::plan::{plan, Plan, PlanError, PlanOptions};

/// How the user's checkpoints are written: `--ckpt-format` and whether the distributed
/// optimizer's state is saved fully reshardable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointFormat {
    /// `torch_dist` unless the arguments say otherwise (Megatron's default).
    pub format: String,
    /// `--dist-ckpt-optim-fully-reshardable`.
    pub optimizer_fully_reshardable: bool,
}

impl CheckpointFormat {
    /// Whether a checkpoint saved under `config` loads under another tp/pp; `Err` says why
    /// not.
    pub fn reshards_tp_pp(&self, config: &ParallelConfig) -> Result<(), String> {
        if !matches!(
            self.format.as_str(),
            "torch_dist" | "torch_dcp" | "fsdp_dtensor"
        ) {
            return Err(format!(
                "checkpoints in the {} format cannot be resharded to another tp/pp (use --ckpt-format torch_dist)",
                self.format
            ));
        }
        if config.distributed_optimizer && !self.optimizer_fully_reshardable {
            return Err(format!(
                "the distributed optimizer's state in {} checkpoints reshards only across dp unless saved with --dist-ckpt-optim-fully-reshardable",
                self.format
            ));
        }
        Ok(())
    }
}

/// The checkpoint format the Megatron arguments ask for.
pub fn checkpoint_format(args: &[String]) -> CheckpointFormat {
    let mut format = "torch_dist".to_string();
    let mut fully = false;
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let mut words = args[..end].iter().peekable();
    while let Some(word) = words.next() {
        let Some(body) = word.strip_prefix("--") else {
            continue;
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n.replace('_', "-"), Some(v.to_string())),
            None => (body.replace('_', "-"), None),
        };
        match name.as_str() {
            "ckpt-format" => {
                if let Some(value) = inline.or_else(|| words.next().cloned()) {
                    format = value;
                }
            }
            "dist-ckpt-optim-fully-reshardable" => fully = true,
            _ => {}
        }
    }
    CheckpointFormat {
        format,
        optimizer_fully_reshardable: fully,
    }
}

/// The plan for the survivors and how it relates to the last one.
#[derive(Debug, Clone)]
pub struct Replanned {
    pub plan: Plan,
    /// The survivors' part of the profile.
    pub profile: ClusterProfile,
    /// tp and pp are as before: the checkpoint loads as it is.
    pub kept_tp_pp: bool,
    /// tp or pp changed and the checkpoint is resharded on load.
    pub resharded: bool,
    /// What people should know (why tp/pp changed, why a pin was released).
    pub notes: Vec<String>,
}

/// Why no plan could be made for the survivors.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplanError {
    #[error("no node is left to run on")]
    NoSurvivors,
    #[error("the cluster profile does not cover the survivors: {0} (a bug in pipette-run; please report it)")]
    Profile(String),
    #[error("no plan keeps tp={tp} pp={pp} on the {nodes} remaining node(s) ({keep}), and {why}")]
    CannotReshard {
        tp: u64,
        pp: u64,
        nodes: usize,
        keep: String,
        why: String,
    },
    #[error("no plan for the {nodes} remaining node(s): {source}")]
    Plan {
        nodes: usize,
        #[source]
        source: PlanError,
    },
}

/// Plans `settings` again on `survivors` (hosts of `profile`, kept in the profile's order)
/// after a failure of `previous` (see the module doc for the rule).
pub fn replan(
    settings: &Settings,
    profile: &ClusterProfile,
    survivors: &[String],
    previous: &ParallelConfig,
    options: &PlanOptions,
    checkpoint: CheckpointState,
    format: &CheckpointFormat,
) -> Result<Replanned, ReplanError> {
    let selections: Vec<NodeSelection<'_>> = profile
        .nodes
        .iter()
        .filter(|n| survivors.contains(&n.host))
        .map(|n| NodeSelection {
            host: &n.host,
            devices: DeviceSelection::All,
        })
        .collect();
    if selections.is_empty() {
        return Err(ReplanError::NoSurvivors);
    }
    let nodes = selections.len();
    let profile = profile.subset(&selections).map_err(ReplanError::Profile)?;
    let mut notes = Vec::new();
    let mut free = settings.clone();
    if let Some(dp) = free.constraints.data_parallel.take() {
        notes.push(format!(
            "released the pinned dp={dp}: fewer nodes cannot keep it"
        ));
    }

    if !checkpoint.exists() {
        let plan =
            plan(&free, &profile, options).map_err(|source| ReplanError::Plan { nodes, source })?;
        notes.push("no checkpoint saved yet: planned afresh, training starts again".into());
        let kept = plan.config.tp == previous.tp && plan.config.pp == previous.pp;
        return Ok(Replanned {
            plan,
            profile,
            kept_tp_pp: kept,
            resharded: false,
            notes,
        });
    }

    let mut keep = free.clone();
    keep.constraints.tensor_parallel = Some(previous.tp);
    keep.constraints.pipeline_parallel = Some(previous.pp);
    keep.constraints.virtual_pipeline = Some(previous.vpp.unwrap_or(1));
    keep.constraints.distributed_optimizer = Some(previous.distributed_optimizer);
    let mut keep_options = options.clone();
    let even = previous
        .layers_per_stage
        .iter()
        .all(|l| Some(l) == previous.layers_per_stage.first());
    if even {
        keep_options.space.uneven_layers = false;
    }
    let kept = plan(&keep, &profile, &keep_options);
    let keep_error = match kept {
        Ok(plan) if plan.config.layers_per_stage == previous.layers_per_stage => {
            return Ok(Replanned {
                plan,
                profile,
                kept_tp_pp: true,
                resharded: false,
                notes,
            });
        }
        Ok(_) => "the layer split would change".to_string(),
        Err(e) => e.to_string(),
    };
    if let Err(why) = format.reshards_tp_pp(previous) {
        return Err(ReplanError::CannotReshard {
            tp: previous.tp,
            pp: previous.pp,
            nodes,
            keep: keep_error,
            why,
        });
    }
    // A tp, pp or vpp the user pinned that the survivors cannot hold is released, as dp is:
    // the checkpoint reshards, so the job can go on with another layout.
    let plan = match plan(&free, &profile, options) {
        Ok(plan) => plan,
        Err(pinned_error) => {
            let pins = &mut free.constraints;
            let released: Vec<String> = [
                ("tp", pins.tensor_parallel.take()),
                ("pp", pins.pipeline_parallel.take()),
                ("vpp", pins.virtual_pipeline.take()),
            ]
            .into_iter()
            .filter_map(|(name, pin)| pin.map(|value| format!("{name}={value}")))
            .collect();
            if released.is_empty() {
                return Err(ReplanError::Plan {
                    nodes,
                    source: pinned_error,
                });
            }
            notes.push(format!(
                "released the pinned {}: the {nodes} remaining node(s) cannot keep it",
                released.join(", ")
            ));
            plan(&free, &profile, options).map_err(|source| ReplanError::Plan { nodes, source })?
        }
    };
    notes.push(format!(
        "tp×pp changes from {}×{} to {}×{} ({keep_error} with the old layout); the {} checkpoint is resharded when it loads",
        previous.tp, previous.pp, plan.config.tp, plan.config.pp, format.format
    ));
    let kept_tp_pp = plan.config.tp == previous.tp && plan.config.pp == previous.pp;
    Ok(Replanned {
        plan,
        profile,
        kept_tp_pp,
        resharded: !kept_tp_pp,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn checkpoint_format_follows_megatron_defaults() {
        let f = checkpoint_format(&words("--save /ck --save-interval 5"));
        assert_eq!(f.format, "torch_dist");
        assert!(!f.optimizer_fully_reshardable);
        let f = checkpoint_format(&words(
            "--ckpt-format torch --dist-ckpt-optim-fully-reshardable",
        ));
        assert_eq!(f.format, "torch");
        assert!(f.optimizer_fully_reshardable);
        assert_eq!(
            checkpoint_format(&words("--ckpt-format=torch_dcp -- --ckpt-format torch")).format,
            "torch_dcp"
        );
    }

    #[test]
    fn resharding_needs_a_distributed_format_and_a_reshardable_optimizer() {
        let mut config = ParallelConfig::even(4, 2, 2, 2, 1);
        let dist = checkpoint_format(&[]);
        assert!(dist.reshards_tp_pp(&config).is_ok());
        config.distributed_optimizer = true;
        let why = dist.reshards_tp_pp(&config).unwrap_err();
        assert!(why.contains("--dist-ckpt-optim-fully-reshardable"), "{why}");
        let fully = checkpoint_format(&words("--dist-ckpt-optim-fully-reshardable"));
        assert!(fully.reshards_tp_pp(&config).is_ok());
        let legacy = checkpoint_format(&words("--ckpt-format torch"));
        assert!(legacy
            .reshards_tp_pp(&config)
            .unwrap_err()
            .contains("torch format"));
    }
}
