//! The Megatron arguments of a plan: the user's own, with the parallel ones replaced.
//!
//! Rules (megatron-core 0.19.2, `megatron/training/arguments.py` and `TransformerConfig`):
//!
//! - With `--model PRESET`, the preset's arguments come first, less every option the
//!   user's arguments give (and less its precision flag when the user gives `--bf16` or
//!   `--fp16`): the script must see the model the plan was made for.
//! - Every option the plan decides is removed wherever it appears, in every form
//!   (`--opt value`, `--opt=value`, flags, dash or underscore spelling): the options
//!   marked [`Rewrite::Planned`] in config's table of Megatron's options
//!   ([`options::OPTIONS`]), which also says which options take a value and which flags
//!   a plan may refuse. Every other word is kept, byte-for-byte and in order.
//! - The plan's values are appended (before a `--`, which ends Megatron's options):
//!   `--tensor-model-parallel-size`, `--pipeline-model-parallel-size`, the stage split,
//!   `--micro-batch-size`, for a model with experts `--expert-model-parallel-size` and
//!   `--expert-tensor-parallel-size` (both: Megatron's default etp is tp), `--sequence-parallel`
//!   (only at tp > 1: Megatron turns it off at tp = 1), the recomputation,
//!   `--use-distributed-optimizer`.
//! - The stage split, from `layers_per_stage`: nothing when even; virtual stages as
//!   `--num-layers-per-virtual-pipeline-stage` when even and divisible; uneven first and/or
//!   last stage with equal middle stages as `--decoder-first-pipeline-num-layers` /
//!   `--decoder-last-pipeline-num-layers` (with virtual stages as
//!   `--num-virtual-stages-per-pipeline-rank`, every stage divisible by it, as
//!   TransformerConfig requires); anything else as `--pipeline-model-parallel-layout`
//!   (`E` embedding, `t` layer, `L` loss, `|` between stages, virtual stage-major).
//! - Recomputation: selective is `--recompute-granularity selective`; full is
//!   `--recompute-granularity full --recompute-method uniform|block --recompute-num-layers N`.
//! - `--global-batch-size` is the user's; when they gave none, pipette's value is written
//!   (Megatron's default, micro-batch × dp, would change with the plan's micro-batch).
//!   `--max-position-embeddings`, which Megatron requires, is written when missing with
//!   the value the settings chose (the sequence length).
//! - Flags of the user's that Megatron refuses under the plan are dropped, with a note:
//!   `--overlap-param-gather` without the distributed optimizer, `--tp-comm-overlap`
//!   without sequence parallelism, `--overlap-param-gather-with-optimizer-step` without
//!   virtual stages, `--distribute-saved-activations` without full recomputation at tp > 1,
//!   `--no-overlap-p2p-communication` with virtual stages on two pipeline stages.
//! - DeepSpeed scripts (`--deepspeed`, `--deepspeed_config`): the config path points at the
//!   rendered `ds_config.json`, and ZeRO stands in for `--use-distributed-optimizer`.
//!
//! Environment Megatron requires: `CUDA_DEVICE_MAX_CONNECTIONS=1` when tp > 1 or cp > 1
//! (arguments.py asserts it on GPUs before Blackwell).

use std::collections::BTreeSet;

use crate::config::megatron::argparse::arg_words;
use crate::config::megatron::options::{self, Requirement, Rewrite};
use crate::config::{presets, Recompute, Settings};
use crate::model::parallel::ParallelConfig;
use crate::plan::experts::moe_rule_error;

use super::RenderError;

/// The rewritten argument list and what goes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MegatronArgs {
    /// The arguments after SCRIPT, as the training script will see them.
    pub args: Vec<String>,
    /// Environment Megatron requires for these arguments.
    pub env: Vec<(String, String)>,
    /// What was changed beyond the parallel options, for people.
    pub notes: Vec<String>,
    /// The ZeRO stage for `ds_config.json`: the user's `--zero-stage`, else 1 with the
    /// distributed optimizer and 0 without.
    pub zero_stage: u64,
}

/// True when the arguments are those of a DeepSpeed-based script (Megatron-DeepSpeed):
/// `--deepspeed`, `--deepspeed_config`, or their `deepscale` predecessors.
pub fn uses_deepspeed(args: &[String]) -> bool {
    arg_words(args).iter().any(|w| {
        matches!(
            rewrite_of(w.name.as_deref()),
            Some(Rewrite::DeepSpeed | Rewrite::DeepSpeedConfig)
        )
    })
}

/// The Megatron arguments for `config`: see the module doc for the rules.
/// `deepspeed_config` is the path of the rendered `ds_config.json` for DeepSpeed scripts.
pub fn megatron_args(
    settings: &Settings,
    user_args: &[String],
    config: &ParallelConfig,
    deepspeed_config: Option<&str>,
) -> Result<MegatronArgs, RenderError> {
    check_config(settings, config)?;
    let mut notes = Vec::new();

    // The preset's arguments under the user's, then everything up to a `--`.
    let split = user_args.iter().position(|w| w == "--");
    let (user_head, tail) = match split {
        Some(i) => (&user_args[..i], &user_args[i..]),
        None => (user_args, &[][..]),
    };
    let mut base: Vec<String> = Vec::new();
    if let Some(name) = settings.model.preset.as_deref() {
        let preset = presets::lookup(name).map_err(|e| RenderError::Plan(e.to_string()))?;
        base.extend(preset_args_under(&preset.megatron_args(), user_head));
    }
    base.extend(user_head.iter().cloned());

    let items = arg_words(&base);
    let given: BTreeSet<&str> = items.iter().filter_map(|w| w.name.as_deref()).collect();
    let tp_sp = config.tp > 1 && config.sequence_parallel;
    let vpp = config.vpp.filter(|v| *v > 1);
    let full_recompute = matches!(config.recompute, Recompute::Full { .. });
    // Why Megatron would refuse a flag of the user's under this plan, if it would.
    let refused = |requirement: Requirement| {
        let (refused, why) = match requirement {
            Requirement::DistributedOptimizer => (
                !config.distributed_optimizer && deepspeed_config.is_none(),
                "it needs the distributed optimizer, which the plan does not use",
            ),
            Requirement::VirtualStagesAndDistributedOptimizer => (
                vpp.is_none() || !config.distributed_optimizer,
                "it needs virtual pipeline stages and the distributed optimizer",
            ),
            Requirement::SequenceParallelism => (
                !tp_sp,
                "it needs sequence parallelism at tensor-parallel size > 1, which the plan does not use",
            ),
            Requirement::FullRecomputeWithoutSequenceParallelism => (
                !(full_recompute && config.tp > 1 && !config.sequence_parallel),
                "it needs full recomputation at tensor-parallel size > 1 without sequence parallelism",
            ),
            Requirement::NoVirtualStagesOnTwoStages => (
                vpp.is_some() && config.pp <= 2,
                "Megatron refuses it with virtual stages on two pipeline stages",
            ),
        };
        refused.then_some(why)
    };

    let mut kept: Vec<String> = Vec::new();
    let mut zero_stage = None;
    let mut deepspeed_config_written = false;
    for item in &items {
        let text = &base[item.start..item.end];
        let Some(name) = item.name.as_deref() else {
            kept.extend(text.iter().cloned());
            continue;
        };
        match rewrite_of(Some(name)).unwrap_or(Rewrite::Kept) {
            Rewrite::Planned => continue,
            Rewrite::Needs(requirement) => {
                if let Some(why) = refused(requirement) {
                    notes.push(format!("dropped --{name}: {why}"));
                    continue;
                }
            }
            Rewrite::ZeroStage => {
                let value = item.value(&base).unwrap_or_default();
                zero_stage = Some(value.parse::<u64>().ok().filter(|s| *s <= 3).ok_or_else(
                    || RenderError::Args {
                        option: "--zero-stage".into(),
                        message: format!("expects 0, 1, 2 or 3, got {value:?}"),
                    },
                )?);
            }
            Rewrite::DeepSpeedConfig => {
                if let Some(path) = deepspeed_config {
                    // Keep the user's spelling; the value is the rendered config.
                    let option = text[0].split('=').next().unwrap_or(&text[0]);
                    if deepspeed_config_written {
                        notes.push(format!("dropped a second {option}"));
                    } else {
                        kept.extend([option.to_string(), path.to_string()]);
                        notes.push(format!(
                            "{option} points at the rendered ds_config.json (batch sizes follow the plan)"
                        ));
                        deepspeed_config_written = true;
                    }
                    continue;
                }
            }
            Rewrite::Kept | Rewrite::DeepSpeed => {}
        }
        kept.extend(text.iter().cloned());
    }

    // The plan's values.
    let mut planned = vec![
        "--tensor-model-parallel-size".to_string(),
        config.tp.to_string(),
        "--pipeline-model-parallel-size".to_string(),
        config.pp.to_string(),
    ];
    if config.cp > 1 {
        planned.extend(["--context-parallel-size".to_string(), config.cp.to_string()]);
    }
    planned.extend(pipeline_split(settings.model.num_layers, config)?);
    planned.extend([
        "--micro-batch-size".to_string(),
        config.micro_batch.to_string(),
    ]);
    planned.extend(expert_args(settings, config));
    // Values the user may have left to Megatron, whose own default would not be the
    // settings' under this plan (or which Megatron requires).
    let defaults = [
        (
            "global-batch-size",
            settings.training.global_batch_size,
            "Megatron's default, micro-batch × dp, would change with the plan",
        ),
        (
            "max-position-embeddings",
            settings.model.max_position_embeddings,
            "Megatron requires it; the sequence length",
        ),
    ];
    for (name, value, why) in defaults {
        if !given.contains(name) {
            planned.extend([format!("--{name}"), value.to_string()]);
            notes.push(format!("added --{name} {value} ({why})"));
        }
    }
    if tp_sp {
        planned.push("--sequence-parallel".to_string());
    }
    planned.extend(recompute_args(&config.recompute)?);
    if config.distributed_optimizer && deepspeed_config.is_none() {
        planned.push("--use-distributed-optimizer".to_string());
    }
    if let (Some(path), false) = (deepspeed_config, deepspeed_config_written) {
        planned.extend(["--deepspeed_config".to_string(), path.to_string()]);
    }

    let mut args = kept;
    args.extend(planned);
    args.extend(tail.iter().cloned());

    let mut env = Vec::new();
    if config.tp > 1 || config.cp > 1 {
        env.push(("CUDA_DEVICE_MAX_CONNECTIONS".to_string(), "1".to_string()));
    }
    let zero_stage = zero_stage.unwrap_or(u64::from(config.distributed_optimizer));
    Ok(MegatronArgs {
        args,
        env,
        notes,
        zero_stage,
    })
}

/// The checks without which the arguments could not say what the plan means.
fn check_config(settings: &Settings, config: &ParallelConfig) -> Result<(), RenderError> {
    let plan = |m: String| Err(RenderError::Plan(m));
    for (name, value) in [
        ("tp", config.tp),
        ("pp", config.pp),
        ("dp", config.dp),
        ("cp", config.cp),
        ("micro_batch", config.micro_batch),
    ] {
        if value == 0 {
            return plan(format!("{name} is 0"));
        }
    }
    let layers = settings.model.num_layers;
    if config.layers_per_stage.len() as u64 != config.pp
        || config.layers_per_stage.iter().sum::<u64>() != layers
    {
        return plan(format!(
            "layers_per_stage {:?} does not split {layers} layers over pp = {}",
            config.layers_per_stage, config.pp
        ));
    }
    if config
        .vpp
        .is_some_and(|v| v == 0 || (v > 1 && config.pp < 2))
    {
        return plan(format!(
            "virtual stages vpp = {:?} need pp ≥ 2 (pp = {})",
            config.vpp, config.pp
        ));
    }
    if let Some(why) = moe_rule_error(&settings.model, config) {
        return plan(why);
    }
    let batch = config.micro_batch * config.dp;
    if settings.training.global_batch_size % batch != 0 {
        return plan(format!(
            "global batch {} is not a multiple of micro-batch {} × dp {}",
            settings.training.global_batch_size, config.micro_batch, config.dp
        ));
    }
    Ok(())
}

/// The plan's expert layout, for a model with experts: both sizes always, as Megatron's
/// default etp (= tp) would differ from the plan's.
fn expert_args(settings: &Settings, config: &ParallelConfig) -> Vec<String> {
    if settings.model.moe.is_none() {
        return Vec::new();
    }
    vec![
        "--expert-model-parallel-size".to_string(),
        config.ep.to_string(),
        "--expert-tensor-parallel-size".to_string(),
        config.etp.to_string(),
    ]
}

/// The options that give Megatron the plan's layers on each pipeline stage.
pub fn pipeline_split(
    num_layers: u64,
    config: &ParallelConfig,
) -> Result<Vec<String>, RenderError> {
    let stages = &config.layers_per_stage;
    let pp = stages.len();
    let vpp = config.vpp.filter(|v| *v > 1);
    let option = |name: &str, value: u64| vec![format!("--{name}"), value.to_string()];
    if pp <= 1 {
        return Ok(Vec::new());
    }
    let first = stages[0];
    let last = stages[pp - 1];
    let middle = &stages[1..pp - 1];
    let divisible = |n: u64| vpp.is_none_or(|v| n % v == 0);

    if stages.iter().all(|s| *s == first) {
        return Ok(match vpp {
            None => Vec::new(),
            Some(v) if first % v == 0 => option("num-layers-per-virtual-pipeline-stage", first / v),
            Some(_) => layout(stages, vpp),
        });
    }
    // Uneven first and/or last stage: the middle stages must hold equal, non-zero shares.
    let middle_equal = middle.windows(2).all(|w| w[0] == w[1]);
    let middle_share = middle.first().copied();
    let expressible = middle_equal
        && middle_share != Some(0)
        && first > 0
        && last > 0
        && stages.iter().all(|s| divisible(*s));
    if !expressible {
        return Ok(layout(stages, vpp));
    }
    let mut args = Vec::new();
    // With two stages both ends are named; otherwise only the ends that differ.
    if middle_share != Some(first) {
        args.extend(option("decoder-first-pipeline-num-layers", first));
    }
    if middle_share != Some(last) {
        args.extend(option("decoder-last-pipeline-num-layers", last));
    }
    if let Some(v) = vpp {
        args.extend(option("num-virtual-stages-per-pipeline-rank", v));
    }
    debug_assert_eq!(stages.iter().sum::<u64>(), num_layers);
    Ok(args)
}

/// `--pipeline-model-parallel-layout`: one entry per (virtual stage, pipeline rank) in
/// Megatron's order (virtual stage-major); each rank's layers split over its virtual
/// stages as evenly as possible, the earlier chunks taking the remainder.
fn layout(stages: &[u64], vpp: Option<u64>) -> Vec<String> {
    let v = vpp.unwrap_or(1);
    let pp = stages.len();
    let chunk = |rank: usize, chunk: u64| stages[rank] / v + u64::from(chunk < stages[rank] % v);
    let mut entries = Vec::new();
    for c in 0..v {
        for rank in 0..pp {
            let mut entry = String::new();
            if c == 0 && rank == 0 {
                entry.push('E');
            }
            match chunk(rank, c) {
                0 => {}
                1 => entry.push('t'),
                n => entry.push_str(&format!("t*{n}")),
            }
            if c == v - 1 && rank == pp - 1 {
                entry.push('L');
            }
            entries.push(entry);
        }
    }
    vec![
        "--pipeline-model-parallel-layout".to_string(),
        entries.join("|"),
    ]
}

/// The recomputation options.
pub fn recompute_args(recompute: &Recompute) -> Result<Vec<String>, RenderError> {
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect();
    Ok(match recompute {
        Recompute::None => Vec::new(),
        Recompute::Selective => words(&["--recompute-granularity", "selective"]),
        Recompute::Full { method, num_layers } => {
            if *num_layers == 0 {
                return Err(RenderError::Plan(
                    "full recomputation over 0 layers (the plan must say how many)".into(),
                ));
            }
            let method = method.megatron_name();
            let n = num_layers.to_string();
            words(&[
                "--recompute-granularity",
                "full",
                "--recompute-method",
                method,
                "--recompute-num-layers",
                &n,
            ])
        }
    })
}

/// The preset's arguments without the options the user's arguments give.
fn preset_args_under(preset: &[String], user: &[String]) -> Vec<String> {
    let user_items = arg_words(user);
    let user_names: BTreeSet<&str> = user_items
        .iter()
        .filter_map(|w| w.name.as_deref())
        .collect();
    let user_precision = user_names.contains("bf16") || user_names.contains("fp16");
    let mut out = Vec::new();
    // Preset values never start with a dash, so every option's value is the next word.
    let mut i = 0;
    while i < preset.len() {
        let name = preset[i].trim_start_matches('-');
        let mut end = i + 1;
        if preset.get(end).is_some_and(|w| !w.starts_with("--")) {
            end += 1;
        }
        let precision = name == "bf16" || name == "fp16";
        let overridden = user_names.contains(name) || (precision && user_precision);
        if !overridden {
            out.extend(preset[i..end].iter().cloned());
        }
        i = end;
    }
    out
}

/// What rewriting does with the option named (dashed), if it is one of Megatron's.
fn rewrite_of(name: Option<&str>) -> Option<Rewrite> {
    options::find(name?).map(|o| o.rewrite)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{settings_from_megatron_args, RecomputeMethod};

    fn w(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    const TINY: &str = "--num-layers 8 --hidden-size 64 --num-attention-heads 8 --seq-length 32 \
                        --max-position-embeddings 32 --vocab-size 100 --global-batch-size 16";

    fn settings(args: &str) -> Settings {
        settings_from_megatron_args(&w(args), None, &[]).unwrap()
    }

    fn config(tp: u64, pp: u64, dp: u64, stages: &[u64]) -> ParallelConfig {
        let mut c = ParallelConfig::even(stages.iter().sum(), tp, pp, dp, 1);
        c.layers_per_stage = stages.to_vec();
        c
    }

    #[test]
    fn parallel_options_are_replaced_in_every_form() {
        let user = format!(
            "{TINY} --tensor-model-parallel-size 4 --pipeline-model-parallel-size=2 \
             --micro_batch_size 3 --sequence-parallel --recompute-activations --my-opt x \
             --recompute-granularity=full --recompute-method block --recompute-num-layers 1 \
             --use-distributed-optimizer --num-layers-per-virtual-pipeline-stage 2 --tail"
        );
        let s = settings(TINY);
        let c = config(2, 1, 8, &[8]);
        let out = megatron_args(&s, &w(&user), &c, None).unwrap();
        assert_eq!(
            out.args,
            w(&format!(
                "{TINY} --my-opt x --tail --tensor-model-parallel-size 2 \
                 --pipeline-model-parallel-size 1 --micro-batch-size 1"
            ))
        );
        assert_eq!(
            out.env,
            vec![("CUDA_DEVICE_MAX_CONNECTIONS".into(), "1".into())]
        );
        assert!(out.notes.is_empty(), "{:?}", out.notes);
    }

    #[test]
    fn plan_features_are_written() {
        let s = settings(TINY);
        let mut c = config(2, 2, 2, &[4, 4]);
        c.vpp = Some(2);
        c.sequence_parallel = true;
        c.distributed_optimizer = true;
        c.recompute = Recompute::Full {
            method: RecomputeMethod::Block,
            num_layers: 1,
        };
        let out = megatron_args(&s, &w(TINY), &c, None).unwrap();
        assert_eq!(
            out.args,
            w(&format!(
                "{TINY} --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
                 --num-layers-per-virtual-pipeline-stage 2 --micro-batch-size 1 \
                 --sequence-parallel --recompute-granularity full --recompute-method block \
                 --recompute-num-layers 1 --use-distributed-optimizer"
            ))
        );
        c.recompute = Recompute::Selective;
        c.tp = 1;
        let out = megatron_args(&s, &w(TINY), &c, None).unwrap();
        let text = out.args.join(" ");
        assert!(text.ends_with("--recompute-granularity selective --use-distributed-optimizer"));
        assert!(!text.contains("--sequence-parallel"), "no SP at tp = 1");
        assert!(out.env.is_empty());
    }

    #[test]
    fn stage_splits() {
        let split = |stages: &[u64], vpp: Option<u64>| {
            let mut c = config(1, stages.len() as u64, 1, stages);
            c.vpp = vpp;
            pipeline_split(stages.iter().sum(), &c).unwrap().join(" ")
        };
        assert_eq!(split(&[8], None), "");
        assert_eq!(split(&[4, 4], None), "");
        assert_eq!(
            split(&[4, 4], Some(2)),
            "--num-layers-per-virtual-pipeline-stage 2"
        );
        assert_eq!(
            split(&[3, 5], None),
            "--decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 5"
        );
        assert_eq!(
            split(&[6, 8, 8, 8], None),
            "--decoder-first-pipeline-num-layers 6"
        );
        assert_eq!(
            split(&[8, 8, 8, 6], None),
            "--decoder-last-pipeline-num-layers 6"
        );
        assert_eq!(
            split(&[2, 4, 4, 6], Some(2)),
            "--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 6 \
             --num-virtual-stages-per-pipeline-rank 2"
        );
        // Middle stages differ, or a stage is not divisible by the virtual stages.
        assert_eq!(
            split(&[3, 3, 2, 2], None),
            "--pipeline-model-parallel-layout Et*3|t*3|t*2|t*2L"
        );
        assert_eq!(
            split(&[3, 5], Some(2)),
            "--pipeline-model-parallel-layout Et*2|t*3|t|t*2L"
        );
        assert_eq!(
            split(&[3, 3], Some(2)),
            "--pipeline-model-parallel-layout Et*2|t*2|t|tL"
        );
    }

    #[test]
    fn preset_args_come_first_under_the_users() {
        let s = settings_from_megatron_args(&w("--fp16 --num-layers 4"), Some("gpt3-1.3b"), &[])
            .unwrap();
        let c = config(1, 1, 8, &[4]);
        let out = megatron_args(&s, &w("--fp16 --num-layers 4"), &c, None).unwrap();
        let text = out.args.join(" ");
        assert!(
            text.starts_with("--hidden-size 2048 --num-attention-heads 16"),
            "{text}"
        );
        assert!(
            !text.contains("--bf16") && !text.contains("--num-layers 24"),
            "{text}"
        );
        assert!(
            text.contains("--global-batch-size 512 --fp16 --num-layers 4"),
            "{text}"
        );
    }

    #[test]
    fn defaults_megatron_requires_are_written() {
        let args = "--num-layers 8 --hidden-size 64 --num-attention-heads 8 --seq-length 32 \
                    --vocab-size 100 --micro-batch-size 2 -- --global-batch-size 4";
        let s = settings_from_megatron_args(
            &w(args),
            None,
            &[crate::config::megatron::Pin::DataParallel(2)],
        )
        .unwrap();
        let c = config(1, 1, 2, &[8]);
        let out = megatron_args(&s, &w(args), &c, None).unwrap();
        assert_eq!(
            out.args.join(" "),
            "--num-layers 8 --hidden-size 64 --num-attention-heads 8 --seq-length 32 \
             --vocab-size 100 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 \
             --micro-batch-size 1 --global-batch-size 4 --max-position-embeddings 32 \
             -- --global-batch-size 4"
        );
        assert_eq!(out.notes.len(), 2);
    }

    #[test]
    fn flags_megatron_would_refuse_are_dropped_with_a_note() {
        let user = format!("{TINY} --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap");
        let s = settings(&format!("{TINY} --use-distributed-optimizer"));
        let c = config(2, 1, 8, &[8]);
        let out = megatron_args(&s, &w(&user), &c, None).unwrap();
        let text = out.args.join(" ");
        assert!(text.contains("--overlap-grad-reduce"));
        assert!(!text.contains("--overlap-param-gather") && !text.contains("--tp-comm-overlap"));
        assert_eq!(out.notes.len(), 2, "{:?}", out.notes);
    }

    #[test]
    fn deepspeed_scripts() {
        let user = format!("{TINY} --deepspeed --deepspeed_config ds.json --zero-stage 2");
        assert!(uses_deepspeed(&w(&user)));
        assert!(!uses_deepspeed(&w(TINY)));
        assert!(uses_deepspeed(&w("--deepspeed_config=x.json")));
        let s = settings(TINY);
        let mut c = config(1, 1, 8, &[8]);
        c.distributed_optimizer = true;
        let out = megatron_args(&s, &w(&user), &c, Some("/run/ds_config.json")).unwrap();
        let text = out.args.join(" ");
        assert!(text.contains("--deepspeed --deepspeed_config /run/ds_config.json --zero-stage 2"));
        assert!(!text.contains("--use-distributed-optimizer"));
        assert_eq!(out.zero_stage, 2);
        let out = megatron_args(
            &s,
            &w(&format!("{TINY} --deepspeed")),
            &c,
            Some("/r/ds.json"),
        )
        .unwrap();
        assert!(out
            .args
            .join(" ")
            .ends_with("--deepspeed_config /r/ds.json"));
        assert_eq!(out.zero_stage, 1);
        let bad = megatron_args(&s, &w(&format!("{TINY} --zero-stage 9")), &c, Some("/x"));
        assert!(matches!(bad, Err(RenderError::Args { .. })));
    }

    #[test]
    fn inconsistent_plans_are_bugs() {
        let s = settings(TINY);
        for c in [
            config(1, 2, 8, &[4, 3]),
            config(1, 1, 8, &[4, 4]),
            config(1, 1, 3, &[8]),
            ParallelConfig {
                vpp: Some(2),
                ..config(1, 1, 8, &[8])
            },
            ParallelConfig {
                recompute: Recompute::Full {
                    method: RecomputeMethod::Uniform,
                    num_layers: 0,
                },
                ..config(1, 1, 8, &[8])
            },
        ] {
            assert!(
                matches!(
                    megatron_args(&s, &w(TINY), &c, None),
                    Err(RenderError::Plan(_))
                ),
                "{c:?}"
            );
        }
    }

    #[test]
    fn the_plans_context_parallel_size_replaces_the_users_and_needs_the_connections_variable() {
        let s = settings(&format!(
            "{TINY} --context-parallel-size=2 --cp-comm-type a2a"
        ));
        let user = w(&format!(
            "{TINY} --context-parallel-size=2 --cp-comm-type a2a"
        ));
        let c = ParallelConfig {
            cp: 2,
            dp: 4,
            ..config(1, 1, 8, &[8])
        };
        let out = megatron_args(&s, &user, &c, None).unwrap();
        let text = out.args.join(" ");
        assert!(text.contains("--context-parallel-size 2"), "{text}");
        assert!(!text.contains("--context-parallel-size=2"), "{text}");
        // The exchange stays the user's choice.
        assert!(text.contains("--cp-comm-type a2a"), "{text}");
        assert_eq!(out.env.len(), 1);
        // A plan without context parallelism drops the user's size and the variable.
        let out = megatron_args(&s, &user, &config(1, 1, 8, &[8]), None).unwrap();
        assert!(!out.args.join(" ").contains("--context-parallel-size"));
        assert!(out.env.is_empty());
    }
}
