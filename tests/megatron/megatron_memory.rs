//! The memory model's formula part agrees with Megatron's own
//! `megatron/training/theoretical_memory_usage.py` (megatron-core 0.19.2).
//!
//! Runs `scripts/megatron_memory_reference.py` once, with every case below, in the venv made
//! by `scripts/setup-megatron-venv`. For each case Megatron parses and validates the
//! arguments itself (at world size tp × pp × dp) and evaluates its weight-and-optimizer and
//! activation formulas; we read the same arguments with `settings_from_megatron_args` and
//! run `estimate_memory` on the same configuration.
//!
//! Megatron's figures are for the first pipeline stage only and rest on simplifications, so
//! each comparison is made on Megatron's basis, and the table shows ours on both:
//! - parameters: its count leaves out the linear biases and learned position embeddings
//!   and spreads the final norm over the stages (final norm / pp on each), so we count the
//!   same model without biases and position embeddings and add that share: exact;
//! - weights + optimizer (bf16, 18 or 6 + 12/dp bytes per parameter): the same basis,
//!   within 0.5 %;
//! - activations, within 2 %, where its formula models the setting:
//!   - with sequence parallelism (and selective or no recomputation; with flash attention
//!     the two keep the same), `compute_activation_memory`: sbh·(18 + 4·ffn/h) per layer,
//!     i.e. multi-head attention and a two-matrix MLP. Models with GQA or SwiGLU are
//!     compared with our formula evaluated for that model (query groups = heads, no gate);
//!   - without it, `compute_activation_memory_without_sp`: sbh·(10 + 24/t) per layer, i.e.
//!     also ffn = 4h, times 1.05 "for optimizer and miscellaneous temporaries", which we
//!     divide out; compared where pp > 1, because at pp = 1 its output-layer term counts
//!     bf16 logits (2·sbV/t + 2·sbh) where its own sequence-parallel formula, the loss's
//!     saved fp32 softmax, and we count 4·sbV/t + 4·sbh;
//!   - full recomputation is not modelled by either function: reported, not compared.
//!
//! The test never skips: without the venv it fails and says how to make it.
//! `PIPETTE_MEGATRON_PYTHON` picks another python; `PIPETTE_MEGATRON_VENV` another venv.
//! `PIPETTE_WRITE_REFERENCE=1` rewrites `tests/data/megatron_memory.json` from Megatron's
//! live figures.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use pipette::config::presets;
use pipette::config::{settings_from_megatron_args, ModelSpec, PositionEmbedding, Precision};
use pipette::config::{Recompute, Settings};
use pipette::model::calibration::Calibration;
use pipette::model::memory::{bytes_per_parameter, estimate_memory, MemoryEstimate};
use pipette::model::params::ParameterBreakdown;
use pipette::model::ParallelConfig;
use serde_json::{json, Value};

/// A preset, extra Megatron arguments, and the data-parallel size (world = tp × pp × dp).
struct Case {
    preset: &'static str,
    extra: &'static str,
    dp: u64,
}

const TP: &str = "--tensor-model-parallel-size";
const CASES: &[Case] = &[
    // Sequence parallelism + selective recomputation: compute_activation_memory.
    Case { preset: "gpt3-1.3b", extra: "--tensor-model-parallel-size 2 --sequence-parallel --recompute-activations", dp: 4 },
    Case { preset: "gpt3-1.3b", extra: "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --sequence-parallel --recompute-activations --micro-batch-size 2", dp: 1 },
    Case { preset: "gpt3-6.7b", extra: "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --sequence-parallel --recompute-activations --use-distributed-optimizer", dp: 2 },
    Case { preset: "gpt3-13b", extra: "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --sequence-parallel --recompute-activations --global-batch-size 2", dp: 1 },
    Case { preset: "gpt3-13b", extra: "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --sequence-parallel --recompute-activations --use-distributed-optimizer", dp: 4 },
    Case { preset: "gpt3-175b", extra: "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --num-layers-per-virtual-pipeline-stage 3 --sequence-parallel --recompute-activations --use-distributed-optimizer", dp: 2 },
    Case { preset: "gpt3-175b", extra: "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --sequence-parallel --recompute-activations", dp: 1 },
    Case { preset: "gpt3-6.7b", extra: "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --sequence-parallel --recompute-activations --micro-batch-size 2", dp: 1 },
    Case { preset: "llama2-7b", extra: "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel --recompute-activations", dp: 2 },
    Case { preset: "llama2-70b", extra: "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 5 --sequence-parallel --recompute-activations --use-distributed-optimizer", dp: 2 },
    Case { preset: "llama2-13b", extra: "--tensor-model-parallel-size 4 --sequence-parallel --recompute-activations --use-distributed-optimizer", dp: 8 },
    Case { preset: "llama2-70b", extra: "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --sequence-parallel --recompute-activations --micro-batch-size 2", dp: 1 },
    // Sequence parallelism without recomputation: with flash attention the same as selective.
    Case { preset: "gpt3-1.3b", extra: "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --sequence-parallel", dp: 1 },
    // No sequence parallelism: compute_activation_memory_without_sp.
    Case { preset: "gpt3-1.3b", extra: "--pipeline-model-parallel-size 2 --micro-batch-size 4", dp: 2 },
    Case { preset: "gpt3-6.7b", extra: "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4", dp: 1 },
    Case { preset: "gpt3-13b", extra: "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --recompute-activations --use-distributed-optimizer", dp: 2 },
    Case { preset: "gpt3-13b", extra: "--pipeline-model-parallel-size 8 --micro-batch-size 2", dp: 1 },
    Case { preset: "gpt3-175b", extra: "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 12 --recompute-activations", dp: 1 },
    Case { preset: "gpt3-6.7b", extra: "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2", dp: 1 },
    Case { preset: "llama2-7b", extra: "--pipeline-model-parallel-size 4", dp: 1 },
    Case { preset: "llama2-70b", extra: "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --use-distributed-optimizer", dp: 4 },
    Case { preset: "gpt3-1.3b", extra: "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --micro-batch-size 8 --use-distributed-optimizer", dp: 2 },
    Case { preset: "llama2-13b", extra: "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 5 --micro-batch-size 2", dp: 1 },
    // Reported only: settings Megatron's activation formulas do not model as we do.
    Case { preset: "gpt3-1.3b", extra: "--micro-batch-size 4", dp: 8 },
    Case { preset: "gpt3-13b", extra: "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --sequence-parallel --recompute-granularity full --recompute-method uniform --recompute-num-layers 1", dp: 1 },
    Case { preset: "llama2-7b", extra: "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --recompute-granularity full --recompute-method block --recompute-num-layers 4", dp: 2 },
];

impl Case {
    fn name(&self) -> String {
        // Short: the preset and the extra arguments without their option prefixes.
        let extra = self
            .extra
            .replace(TP, "tp")
            .replace("--pipeline-model-parallel-size", "pp")
            .replace("--num-layers-per-virtual-pipeline-stage", "layers/vstage")
            .replace("--num-virtual-stages-per-pipeline-rank", "vstages")
            .replace("--sequence-parallel", "sp")
            .replace("--recompute-activations", "selective")
            .replace("--use-distributed-optimizer", "distopt")
            .replace("--micro-batch-size", "mbs")
            .replace("--global-batch-size", "gbs")
            .replace("--recompute-granularity full --recompute-method", "full")
            .replace("--recompute-num-layers", "n");
        format!("{} {extra} dp {}", self.preset, self.dp)
    }

    fn args(&self) -> Vec<String> {
        let mut args = presets::preset(self.preset)
            .expect("known preset")
            .megatron_args();
        args.extend(common::words("--tokenizer-type NullTokenizer"));
        args.extend(common::words(self.extra));
        args
    }

    fn settings(&self) -> Settings {
        settings_from_megatron_args(&self.args(), None, &[])
            .unwrap_or_else(|e| panic!("{}: we refuse the arguments: {e}", self.name()))
    }

    fn config(&self, s: &Settings) -> ParallelConfig {
        let t = &s.training;
        let mut c = ParallelConfig::even(
            s.model.num_layers,
            t.tensor_parallel,
            t.pipeline_parallel,
            self.dp,
            t.micro_batch_size,
        );
        c.vpp = t.virtual_pipeline;
        c.recompute = t.recompute.clone();
        c.sequence_parallel = t.sequence_parallel;
        c.distributed_optimizer = t.distributed_optimizer;
        c
    }
}

/// Megatron's figures for every case, in the order of `CASES` (one Python process).
fn megatron() -> &'static Vec<Value> {
    static FIGURES: OnceLock<Vec<Value>> = OnceLock::new();
    FIGURES.get_or_init(|| {
        let python = common::venv_python();
        let cases: Vec<Value> = CASES
            .iter()
            .map(|c| {
                let s = c.settings();
                let config = c.config(&s);
                json!({
                    "args": c.args(),
                    "world_size": config.world_size(),
                    "num_microbatches": config.num_microbatches(s.training.global_batch_size),
                })
            })
            .collect();
        let figures = common::run_python_batch(
            &python,
            "megatron_memory_reference.py",
            &[],
            &json!(cases),
            std::time::Duration::from_secs(600),
        );
        assert_eq!(figures.len(), CASES.len());
        for (case, v) in CASES.iter().zip(&figures) {
            assert!(
                v.get("error").is_none(),
                "{}: Megatron refused the arguments: {}",
                case.name(),
                v["error"]
            );
        }
        figures
    })
}

fn no_calibration() -> Calibration {
    Calibration {
        activation_factor: 1.0,
        overhead_bytes: 0,
        allocator_slack: 0.0,
        ..Calibration::default()
    }
}

fn estimate(model: &ModelSpec, s: &Settings, config: &ParallelConfig) -> MemoryEstimate {
    estimate_memory(model, &s.training, config, &no_calibration())
}

/// The model as Megatron's parameter count sees it: no linear biases, no learned positions.
fn parameter_basis(model: &ModelSpec) -> ModelSpec {
    ModelSpec {
        add_bias_linear: false,
        add_qkv_bias: false,
        position_embedding: match model.position_embedding {
            PositionEmbedding::LearnedAbsolute => PositionEmbedding::None,
            other => other,
        },
        ..model.clone()
    }
}

/// Which of Megatron's activation formulas models a case, if one does.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Formula {
    /// compute_activation_memory: sequence parallelism, no score term.
    Sp,
    /// compute_activation_memory_without_sp, its 1.05 divided out.
    NoSp,
}

fn formula(config: &ParallelConfig) -> Result<Formula, &'static str> {
    if matches!(config.recompute, Recompute::Full { .. }) {
        return Err("full recompute: not modelled by Megatron");
    }
    if config.sequence_parallel && config.tp > 1 {
        return Ok(Formula::Sp);
    }
    if config.pp == 1 {
        return Err("pp 1 without SP: Megatron counts bf16 logits");
    }
    Ok(Formula::NoSp)
}

/// The model as Megatron's activation formula sees it: multi-head attention and a
/// two-matrix MLP (and, without sequence parallelism, ffn = 4h).
fn activation_basis(model: &ModelSpec, formula: Formula) -> ModelSpec {
    let mut m = ModelSpec {
        swiglu: false,
        num_query_groups: model.num_attention_heads,
        ..model.clone()
    };
    if formula == Formula::NoSp {
        m.ffn_hidden_size = 4 * m.hidden_size;
    }
    m
}

fn error_pct(ours: f64, theirs: f64) -> f64 {
    100.0 * (ours - theirs) / theirs
}

const MIB: f64 = 1024.0 * 1024.0;

#[test]
fn formulas_agree_with_megatrons_theoretical_memory_usage() {
    let figures = megatron();
    let mut params_table = format!(
        "{:<100} {:>13} {:>13} {:>15} {:>9} | {:>10} {:>10} {:>10} {:>8}\n",
        "case (first stage; MiB)",
        "params ours",
        "ours basis",
        "Megatron",
        "diff",
        "W+O ours",
        "ours basis",
        "Megatron",
        "err %"
    );
    let mut act_table = format!(
        "{:<100} {:>10} {:>10} {:>10} {:>10} {:>8}  {}\n",
        "case (first stage; MiB)",
        "act ours",
        "ours basis",
        "Megatron",
        "compared",
        "err %",
        "formula"
    );
    let mut failures = Vec::new();
    let mut compared = 0;
    for (case, v) in CASES.iter().zip(figures) {
        let name = case.name();
        let s = case.settings();
        let config = case.config(&s);
        let m = config.num_microbatches(s.training.global_batch_size);
        assert_eq!(
            v["derived"]["num_microbatches"].as_u64(),
            Some(m),
            "{name}: micro-batches"
        );
        assert_eq!(
            v["derived"]["virtual_pipeline_model_parallel_size"].as_u64(),
            config.vpp,
            "{name}: virtual stages"
        );
        assert_eq!(
            s.training.precision,
            Precision::Bf16,
            "{name}: Megatron's estimate is for bf16"
        );

        // Parameters and weights + optimizer on Megatron's basis.
        let ours = estimate(&s.model, &s, &config);
        let basis = estimate(&parameter_basis(&s.model), &s, &config);
        let final_norm_share = if config.pp > 1 {
            ParameterBreakdown::new(&s.model, config.tp).final_norm as f64 / config.pp as f64
        } else {
            0.0
        };
        let (w, g, o) = bytes_per_parameter(Precision::Bf16);
        let per_param = (w + g) as f64
            + o as f64
                / if config.distributed_optimizer {
                    config.dp as f64
                } else {
                    1.0
                };
        let params_basis = basis.stages[0].params as f64 + final_norm_share;
        let theirs_params = v["shard_parameters"].as_f64().unwrap();
        let weights_basis =
            basis.stages[0].weights_and_optimizer_bytes as f64 + final_norm_share * per_param;
        let theirs_weights = v["weight_and_optimizer_bytes"].as_f64().unwrap();
        let weights_err = error_pct(weights_basis, theirs_weights);
        params_table.push_str(&format!(
            "{:<100} {:>13} {:>13.1} {:>15.1} {:>9.2} | {:>10.1} {:>10.1} {:>10.1} {:>8.4}\n",
            name,
            ours.stages[0].params,
            params_basis,
            theirs_params,
            params_basis - theirs_params,
            ours.stages[0].weights_and_optimizer_bytes as f64 / MIB,
            weights_basis / MIB,
            theirs_weights / MIB,
            weights_err
        ));
        if (params_basis - theirs_params).abs() > 0.5 {
            failures.push(format!(
                "{name}: parameters {params_basis} on Megatron's basis, Megatron {theirs_params}"
            ));
        }
        if weights_err.abs() > 0.5 {
            failures.push(format!(
                "{name}: weights + optimizer off by {weights_err:.3} %"
            ));
        }

        // Activations on the first stage.
        let ours_act = ours.stages[0].activations.total() as f64;
        match formula(&config) {
            Ok(f) => {
                let basis = estimate(&activation_basis(&s.model, f), &s, &config);
                let basis_act = basis.stages[0].activations.total() as f64;
                let (raw, theirs, label) = match f {
                    Formula::Sp => {
                        let x = v["activation_bytes_sp"].as_f64().unwrap();
                        (x, x, "compute_activation_memory")
                    }
                    Formula::NoSp => {
                        let x = v["activation_bytes_no_sp"].as_f64().unwrap();
                        (x, x / 1.05, "compute_activation_memory_without_sp / 1.05")
                    }
                };
                let err = error_pct(basis_act, theirs);
                act_table.push_str(&format!(
                    "{:<100} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>8.4}  {}\n",
                    name,
                    ours_act / MIB,
                    basis_act / MIB,
                    raw / MIB,
                    theirs / MIB,
                    err,
                    label
                ));
                compared += 1;
                if err.abs() > 2.0 {
                    failures.push(format!("{name}: activations off by {err:.3} % ({label})"));
                }
            }
            Err(why) => {
                let report = if v["report_uses"] == "sp" {
                    "activation_bytes_sp"
                } else {
                    "activation_bytes_no_sp"
                };
                act_table.push_str(&format!(
                    "{:<100} {:>10.1} {:>10} {:>10.1} {:>10} {:>8}  not compared: {why}\n",
                    name,
                    ours_act / MIB,
                    "-",
                    v[report].as_f64().unwrap() / MIB,
                    "-",
                    "-"
                ));
            }
        }
    }
    eprintln!("\nParameters and weights + optimizer, first stage, one GPU:\n{params_table}");
    eprintln!("Activations, first stage, one GPU:\n{act_table}");
    eprintln!(
        "{} cases; activations compared on {compared} of them",
        CASES.len()
    );
    assert!(compared >= 20, "only {compared} activation comparisons");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Megatron's figures are committed in tests/data so that other parts of pipette can use
/// them without Python; this catches a silent change of Megatron's formulas.
#[test]
fn committed_reference_figures_are_megatrons() {
    let figures = megatron();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/megatron_memory.json");
    let mut live = BTreeMap::new();
    for (case, v) in CASES.iter().zip(figures) {
        let s = case.settings();
        let config = case.config(&s);
        let mut entry = v.clone();
        entry["args"] = json!(case.args().join(" "));
        entry["world_size"] = json!(config.world_size());
        live.insert(case.name(), entry);
    }
    if std::env::var_os("PIPETTE_WRITE_REFERENCE").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&live).unwrap() + "\n").unwrap();
    }
    let text = std::fs::read_to_string(&path).expect("tests/data/megatron_memory.json");
    let committed: BTreeMap<String, Value> = serde_json::from_str(&text).unwrap();
    let rewrite = "rewrite it with PIPETTE_WRITE_REFERENCE=1 cargo test --test megatron_memory";
    assert_eq!(
        committed.keys().collect::<Vec<_>>(),
        live.keys().collect::<Vec<_>>(),
        "tests/data/megatron_memory.json has other cases ({rewrite})"
    );
    for (name, want) in &live {
        assert!(
            same(&committed[name], want),
            "{name}: tests/data/megatron_memory.json differs from Megatron's figures \
             ({rewrite})\ncommitted: {}\nlive: {want}",
            committed[name]
        );
    }
}

/// JSON values equal up to float parsing (1e-12 relative).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| same(v, w))
        }
        _ => a == b,
    }
}
