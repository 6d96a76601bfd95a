//! `--pin`: the parallel settings a user fixes, and the [`Constraints`] they become once
//! the Megatron arguments have been read.

use std::fmt;

use super::argparse::parse_count;
use super::read::RawArgs;
use super::{contradiction, ArgsError};
use crate::config::{Constraints, ModelSpec, Recompute, RecomputeMethod, TrainingSettings};

/// A parallel setting the user fixed with `--pin`; the planner searches only the rest.
///
/// `--pin LIST` is comma separated; each item is `tp`, `pp`, `dp`, `mbs`, `vpp`, `sp`,
/// `recompute`, `dist-opt`, `ep`, `etp` or `all`, optionally `=VALUE` (`ep` and `etp`, the
/// expert-parallel and expert tensor-parallel sizes, only for models with experts). Without a value the value is the
/// one in the Megatron arguments. `dp` always needs a value (the arguments do not say it).
/// `all` pins everything the arguments say (tp, pp, mbs, vpp, sp, recompute, dist-opt, and
/// ep and etp for a model with experts), with Megatron's defaults for what they leave out; items after it override it.
/// `yours` pins nothing by itself: the planner searches freely, and the configuration
/// the arguments give runs unless the plan is faster by more than the time model's
/// stated error (pipette-run decides and says so).
///
/// Values: sizes are positive integers (`vpp=1` pins "no interleaving"); `sp` and
/// `dist-opt` take true/false (also yes/no, on/off, 1/0); `recompute` takes `none`,
/// `selective`, `full` (method and layer count from the arguments, else uniform over 1
/// layer), `full:uniform:N` or `full:block:N`. A bare `full` is kept as
/// `Recompute::Full` with `num_layers: 0` until the arguments fill it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    TensorParallel(Option<u64>),
    PipelineParallel(Option<u64>),
    DataParallel(u64),
    MicroBatch(Option<u64>),
    VirtualPipeline(Option<u64>),
    SequenceParallel(Option<bool>),
    Recompute(Option<Recompute>),
    DistributedOptimizer(Option<bool>),
    ContextParallel(Option<u64>),
    ExpertParallel(Option<u64>),
    ExpertTensorParallel(Option<u64>),
    All,
    Yours,
}

impl Pin {
    /// The key as written in `--pin`.
    pub fn key(&self) -> &'static str {
        match self {
            Pin::TensorParallel(_) => "tp",
            Pin::PipelineParallel(_) => "pp",
            Pin::DataParallel(_) => "dp",
            Pin::MicroBatch(_) => "mbs",
            Pin::VirtualPipeline(_) => "vpp",
            Pin::SequenceParallel(_) => "sp",
            Pin::Recompute(_) => "recompute",
            Pin::DistributedOptimizer(_) => "dist-opt",
            Pin::ContextParallel(_) => "cp",
            Pin::ExpertParallel(_) => "ep",
            Pin::ExpertTensorParallel(_) => "etp",
            Pin::All => "all",
            Pin::Yours => "yours",
        }
    }
}

impl fmt::Display for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())?;
        match self {
            Pin::TensorParallel(Some(n))
            | Pin::PipelineParallel(Some(n))
            | Pin::DataParallel(n)
            | Pin::MicroBatch(Some(n))
            | Pin::VirtualPipeline(Some(n))
            | Pin::ContextParallel(Some(n))
            | Pin::ExpertParallel(Some(n))
            | Pin::ExpertTensorParallel(Some(n)) => write!(f, "={n}"),
            Pin::SequenceParallel(Some(b)) | Pin::DistributedOptimizer(Some(b)) => {
                write!(f, "={b}")
            }
            Pin::Recompute(Some(r)) => match r {
                Recompute::None => f.write_str("=none"),
                Recompute::Selective => f.write_str("=selective"),
                // `full` with method and layers left to the arguments (see parse_pins).
                Recompute::Full { num_layers: 0, .. } => f.write_str("=full"),
                Recompute::Full { method, num_layers } => {
                    write!(f, "=full:{}:{num_layers}", method.megatron_name())
                }
            },
            _ => Ok(()),
        }
    }
}

const PIN_KEYS: &str = "tp, pp, dp, cp, mbs, vpp, sp, recompute, dist-opt, ep, etp, all, yours";

/// Reads the value of pipette's `--pin` option (e.g. `tp,pp=2,dp=8`).
pub fn parse_pins(text: &str) -> Result<Vec<Pin>, ArgsError> {
    let bad = |item: &str, reason: String| ArgsError::BadPin {
        pin: item.to_string(),
        reason,
    };
    let mut pins: Vec<Pin> = Vec::new();
    for item in text.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(bad(
                text,
                format!("empty item (write a comma-separated list of {PIN_KEYS})"),
            ));
        }
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (item, None),
        };
        let size = |v: &str| {
            parse_count(v)
                .filter(|n| *n > 0)
                .ok_or_else(|| bad(item, format!("{key} takes a positive integer, got {v:?}")))
        };
        let boolean = |v: &str| {
            parse_bool(v).ok_or_else(|| bad(item, format!("{key} takes true or false, got {v:?}")))
        };
        let pin = match key {
            "tp" => Pin::TensorParallel(value.map(size).transpose()?),
            "pp" => Pin::PipelineParallel(value.map(size).transpose()?),
            "mbs" => Pin::MicroBatch(value.map(size).transpose()?),
            "vpp" => Pin::VirtualPipeline(value.map(size).transpose()?),
            "cp" => Pin::ContextParallel(value.map(size).transpose()?),
            "ep" => Pin::ExpertParallel(value.map(size).transpose()?),
            "etp" => Pin::ExpertTensorParallel(value.map(size).transpose()?),
            "dp" => match value {
                Some(v) => Pin::DataParallel(size(v)?),
                None => {
                    return Err(bad(
                        item,
                        "dp needs a value (the Megatron arguments do not say it): write dp=N"
                            .into(),
                    ))
                }
            },
            "sp" => Pin::SequenceParallel(value.map(boolean).transpose()?),
            "dist-opt" => Pin::DistributedOptimizer(value.map(boolean).transpose()?),
            "recompute" => Pin::Recompute(
                value
                    .map(|v| parse_recompute_pin(v).map_err(|reason| bad(item, reason)))
                    .transpose()?,
            ),
            "all" => match value {
                None => Pin::All,
                Some(_) => {
                    return Err(bad(
                        item,
                        "all takes no value (it pins what the Megatron arguments say)".into(),
                    ))
                }
            },
            "yours" => match value {
                None => Pin::Yours,
                Some(_) => {
                    return Err(bad(
                        item,
                        "yours takes no value (it keeps what the Megatron arguments say unless the plan is clearly faster)".into(),
                    ))
                }
            },
            other => {
                return Err(bad(
                    item,
                    format!("unknown key {other:?} (known: {PIN_KEYS})"),
                ))
            }
        };
        if pins.iter().any(|p| p.key() == pin.key()) {
            return Err(bad(text, format!("{} is pinned twice", pin.key())));
        }
        pins.push(pin);
    }
    Ok(pins)
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Some(true),
        "false" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// `none`, `selective`, `full`, `full:uniform:N`, `full:block:N`. `full` alone is
/// returned with 0 layers, meaning "take method and layers from the arguments".
fn parse_recompute_pin(v: &str) -> Result<Recompute, String> {
    let usage = "recompute takes none, selective, full, full:uniform:N or full:block:N";
    let parts: Vec<&str> = v.split(':').collect();
    match parts.as_slice() {
        ["none"] => Ok(Recompute::None),
        ["selective"] => Ok(Recompute::Selective),
        ["full"] => Ok(Recompute::Full {
            method: RecomputeMethod::Uniform,
            num_layers: 0,
        }),
        ["full", method, n] => {
            let Some(method) = RecomputeMethod::from_megatron_name(method) else {
                return Err(format!("{usage}, got {v:?}"));
            };
            match parse_count(n) {
                Some(num_layers) if num_layers > 0 => Ok(Recompute::Full { method, num_layers }),
                _ => Err(format!("{usage} with N a positive integer, got {v:?}")),
            }
        }
        _ => Err(format!("{usage}, got {v:?}")),
    }
}

pub(super) fn constraints(
    raw: &RawArgs,
    model: &ModelSpec,
    training: &TrainingSettings,
    pins: &[Pin],
) -> Result<Constraints, ArgsError> {
    let mut c = Constraints::default();
    // The pinned value, else the one the arguments give.
    let given =
        |pinned: Option<u64>, value: Option<u64>, key: &'static str, option: &'static str| {
            pinned
                .or(value)
                .ok_or(ArgsError::PinWithoutValue { key, option })
        };
    let vpp_given = raw.layers_per_virtual_stage.is_some() || raw.virtual_stages_per_rank.is_some();
    let vpp_from_args = || training.virtual_pipeline.unwrap_or(1);
    let recompute_from = |pinned: &Option<Recompute>| match pinned {
        None => training.recompute.clone(),
        // `full` without method and layers: the arguments', else uniform over 1 layer.
        Some(Recompute::Full { num_layers: 0, .. }) => match &training.recompute {
            full @ Recompute::Full { .. } => full.clone(),
            _ => Recompute::Full {
                method: RecomputeMethod::Uniform,
                num_layers: 1,
            },
        },
        Some(r) => r.clone(),
    };
    // `all` first, so that the other items override it wherever they stand.
    if pins.contains(&Pin::All) {
        c.tensor_parallel = Some(training.tensor_parallel);
        c.pipeline_parallel = Some(training.pipeline_parallel);
        c.micro_batch_size = Some(given(
            None,
            raw.micro_batch_size,
            "all",
            "--micro-batch-size",
        )?);
        c.virtual_pipeline = Some(vpp_from_args());
        c.sequence_parallel = Some(training.sequence_parallel);
        c.recompute = Some(training.recompute.clone());
        c.distributed_optimizer = Some(training.distributed_optimizer);
        c.context_parallel = Some(training.context_parallel);
        if model.moe.is_some() {
            c.expert_parallel = Some(training.expert_parallel);
            c.expert_tensor_parallel = Some(expert_tensor_parallel_of(training));
        }
    }
    // `a2a+p2p`'s levels fix the context-parallel size (their product).
    if let Some(sizes) = &training.hierarchical_context_parallel {
        c.context_parallel = Some(sizes.iter().product());
    }
    for pin in pins {
        match pin {
            Pin::All | Pin::Yours => {}
            Pin::TensorParallel(v) => {
                c.tensor_parallel = Some(given(
                    *v,
                    raw.tensor_parallel,
                    "tp",
                    "--tensor-model-parallel-size",
                )?)
            }
            Pin::PipelineParallel(v) => {
                c.pipeline_parallel = Some(given(
                    *v,
                    raw.pipeline_parallel,
                    "pp",
                    "--pipeline-model-parallel-size",
                )?)
            }
            Pin::DataParallel(n) => c.data_parallel = Some(*n),
            Pin::MicroBatch(v) => {
                c.micro_batch_size = Some(given(
                    *v,
                    raw.micro_batch_size,
                    "mbs",
                    "--micro-batch-size",
                )?)
            }
            Pin::VirtualPipeline(v) => {
                c.virtual_pipeline = Some(match v {
                    Some(n) => *n,
                    None if vpp_given => vpp_from_args(),
                    None => {
                        return Err(ArgsError::PinWithoutValue {
                            key: "vpp",
                            option: "--num-virtual-stages-per-pipeline-rank",
                        })
                    }
                })
            }
            Pin::SequenceParallel(v) => {
                c.sequence_parallel = Some(v.unwrap_or(training.sequence_parallel))
            }
            Pin::Recompute(v) => c.recompute = Some(recompute_from(v)),
            Pin::DistributedOptimizer(v) => {
                c.distributed_optimizer = Some(v.unwrap_or(training.distributed_optimizer))
            }
            Pin::ContextParallel(v) => {
                let cp = given(*v, raw.context_parallel, "cp", "--context-parallel-size")?;
                if let Some(levels) = c.context_parallel.filter(|l| *l != cp) {
                    return Err(contradiction(format!(
                        "pinned cp={cp}, but --hierarchical-context-parallel-sizes multiply to {levels} (Megatron requires them equal: pin cp={levels} or change the sizes)"
                    )));
                }
                c.context_parallel = Some(cp)
            }
            // Megatron's defaults when the arguments leave them out: ep 1, etp = tp.
            Pin::ExpertParallel(v) => {
                c.expert_parallel = Some(v.unwrap_or(training.expert_parallel))
            }
            Pin::ExpertTensorParallel(v) => {
                c.expert_tensor_parallel = Some(v.unwrap_or(expert_tensor_parallel_of(training)))
            }
        }
    }
    check_pins(model, training, &c)?;
    Ok(c)
}

/// The expert tensor-parallel size the arguments give: `--expert-tensor-parallel-size`,
/// else the tensor-parallel size (arguments.py 569-570).
fn expert_tensor_parallel_of(training: &TrainingSettings) -> u64 {
    training
        .expert_tensor_parallel
        .unwrap_or(training.tensor_parallel)
}

/// The user's expert layout as constraints, for a model with experts (`--pin yours`
/// keeps it as it keeps the rest); nothing for a dense model.
pub fn expert_pins_of_args(settings: &crate::config::Settings) -> Constraints {
    if settings.model.moe.is_none() {
        return Constraints::default();
    }
    Constraints {
        expert_parallel: Some(settings.training.expert_parallel),
        expert_tensor_parallel: Some(expert_tensor_parallel_of(&settings.training)),
        ..Constraints::default()
    }
}

/// Pinned values Megatron would refuse for this model, caught before any planning.
fn check_pins(
    model: &ModelSpec,
    training: &TrainingSettings,
    c: &Constraints,
) -> Result<(), ArgsError> {
    let heads = model.num_attention_heads;
    let groups = model.num_query_groups;
    let layers = model.num_layers;
    let global = training.global_batch_size;
    if let Some(tp) = c.tensor_parallel {
        if heads % tp != 0 {
            return Err(contradiction(format!(
                "pinned tp={tp} does not divide --num-attention-heads {heads} (Megatron splits whole heads across tensor-parallel ranks: pin a divisor of {heads})"
            )));
        }
        if groups % tp != 0 && tp % groups != 0 {
            return Err(contradiction(format!(
                "pinned tp={tp} is neither a multiple nor a divisor of the {groups} query groups (--num-query-groups): pin a divisor of {groups}"
            )));
        }
    }
    if let Some(pp) = c.pipeline_parallel {
        // An uneven split (first and last stages apart from equal middle ones, as
        // `--decoder-first/last-pipeline-num-layers` say it) needs a layer per stage.
        if pp > layers {
            return Err(contradiction(format!(
                "pinned pp={pp} is more than --num-layers {layers} (each pipeline stage needs a layer at least: pin at most {layers})"
            )));
        }
        if layers % pp != 0 && c.virtual_pipeline.is_some_and(|v| v > 1) {
            return Err(contradiction(format!(
                "pinned pp={pp} does not divide --num-layers {layers}, and the pinned virtual stages need equal stages (pin a divisor of {layers}, or vpp=1)"
            )));
        }
        if let Some(vpp) = c.virtual_pipeline.filter(|v| *v > 1) {
            if (layers / pp) % vpp != 0 {
                return Err(contradiction(format!(
                    "pinned vpp={vpp} does not divide the {} layers of each of the pinned pp={pp} stages (--num-layers {layers})",
                    layers / pp
                )));
            }
        }
    }
    if let Some(cp) = c.context_parallel.filter(|cp| *cp > 1) {
        let s = model.seq_length;
        if s % cp.saturating_mul(2) != 0 {
            // arguments.py: each rank takes two of 2·cp load-balanced chunks.
            return Err(contradiction(format!(
                "cp={cp} needs --seq-length {s} to be a multiple of 2 × {cp} (Megatron splits each sequence into 2·cp chunks: choose a cp whose double divides {s})"
            )));
        }
    }
    check_expert_pins(model, c)?;
    if let Some(mbs) = c.micro_batch_size {
        if global % mbs != 0 {
            return Err(contradiction(format!(
                "pinned mbs={mbs} does not divide --global-batch-size {global} (pin a divisor of {global})"
            )));
        }
    }
    if let Some(dp) = c.data_parallel {
        let step = dp.saturating_mul(c.micro_batch_size.unwrap_or(1));
        if global % step != 0 {
            return Err(contradiction(format!(
                "pinned dp={dp}{} does not divide --global-batch-size {global} (each step takes the same number of micro-batches on every data-parallel rank)",
                c.micro_batch_size
                    .map(|m| format!(" × mbs={m}"))
                    .unwrap_or_default()
            )));
        }
    }
    Ok(())
}

/// Pinned expert sizes Megatron would refuse for this model (arguments.py 1600-1603,
/// TransformerConfig's bias rule).
fn check_expert_pins(model: &ModelSpec, c: &Constraints) -> Result<(), ArgsError> {
    let (ep, etp) = (c.expert_parallel, c.expert_tensor_parallel);
    let Some(moe) = &model.moe else {
        return match (ep, etp) {
            (Some(n), _) | (_, Some(n)) if n > 1 => Err(contradiction(format!(
                "pinned ep/etp={n} needs a model with experts (--num-experts): drop the pin"
            ))),
            _ => Ok(()),
        };
    };
    if let Some(ep) = ep.filter(|ep| moe.num_experts % ep != 0) {
        return Err(contradiction(format!(
            "pinned ep={ep} does not divide --num-experts {} (each expert-parallel rank holds the same number of experts: pin a divisor of {})",
            moe.num_experts, moe.num_experts
        )));
    }
    if let Some(etp) = etp.filter(|etp| *etp > 1) {
        if model.add_bias_linear {
            return Err(contradiction(format!(
                "pinned etp={etp} with linear biases (Megatron supports expert biases only at --expert-tensor-parallel-size 1: pin etp=1 or add --disable-bias-linear)"
            )));
        }
        if moe.ffn_hidden_size % etp != 0 {
            return Err(contradiction(format!(
                "pinned etp={etp} does not divide --moe-ffn-hidden-size {} (each expert's MLP is split evenly over the expert tensor-parallel ranks)",
                moe.ffn_hidden_size
            )));
        }
    }
    Ok(())
}
