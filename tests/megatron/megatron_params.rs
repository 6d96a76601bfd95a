//! Parameter counts of the presets equal Megatron's own count for the same arguments.
//!
//! Runs `scripts/megatron_reference.py` once, with every argument list below, in the venv
//! made by `scripts/setup-megatron-venv` (megatron-core 0.19.2). For each list Megatron
//! parses and validates the arguments itself and builds its real GPTModel (on the meta
//! device); we read the same list with `settings_from_megatron_args` and compare the
//! parameter count, the padded vocabulary and every value Megatron derives. Lists Megatron
//! refuses must be refused by us too.
//!
//! The test never skips: without the venv it fails and says how to make it.
//! `PIPETTE_MEGATRON_PYTHON` picks another python; `PIPETTE_MEGATRON_VENV` another venv.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use pipette::config::megatron::model_from_megatron_args;
use pipette::config::presets::{self, PRESETS};
use pipette::config::{
    settings_from_megatron_args, Normalization, PositionEmbedding, Precision, Recompute,
    RecomputeMethod, Settings,
};
use pipette::model::params::{padded_vocab_size, total_parameters, ParameterBreakdown};
use serde_json::{json, Value};

/// A Megatron argument list and the name it is reported under.
struct Case {
    name: String,
    args: Vec<String>,
}

/// Megatron reads the vocabulary from a tokenizer; NullTokenizer has exactly --vocab-size
/// tokens and needs no files, so the presets' `--vocab-size` is the same model to Megatron.
fn preset_args(name: &str, extra: &str) -> Vec<String> {
    let mut args = presets::preset(name).expect("known preset").megatron_args();
    args.extend(common::words("--tokenizer-type NullTokenizer"));
    args.extend(common::words(extra));
    args
}

fn preset_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = PRESETS
        .iter()
        .map(|p| Case {
            name: p.name.to_string(),
            args: preset_args(p.name, ""),
        })
        .collect();
    // As they are trained: the vocabulary is padded for tp, the stage layout is Megatron's.
    for (name, extra) in [
        (
            "gpt3-175b",
            "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --sequence-parallel",
        ),
        (
            "llama2-70b",
            "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 \
             --num-layers-per-virtual-pipeline-stage 5 --use-distributed-optimizer",
        ),
        ("gpt3-13b", "--tensor-model-parallel-size 2"),
        // 128256 is a multiple of 128 but not of 128 × 8: padded for tp 8.
        (
            "llama3-405b",
            "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 9 --sequence-parallel",
        ),
        (
            "llama3-8b",
            "--tensor-model-parallel-size 2 --use-distributed-optimizer",
        ),
    ] {
        cases.push(Case {
            name: format!("{name} {extra}"),
            args: preset_args(name, extra),
        });
    }
    cases
}

/// A small model and one feature at a time.
const BASE: &str = "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 \
                    --max-position-embeddings 512 --tokenizer-type NullTokenizer \
                    --vocab-size 50257 --micro-batch-size 2 --global-batch-size 16";

fn feature_cases() -> Vec<Case> {
    [
        ("gpt defaults", ""),
        ("gqa", "--group-query-attention --num-query-groups 2"),
        ("gqa, one group", "--group-query-attention"),
        ("groups without gqa flag", "--num-query-groups 2"),
        ("untied", "--untie-embeddings-and-output-weights"),
        ("no bias", "--disable-bias-linear"),
        ("qkv bias only", "--disable-bias-linear --add-qkv-bias"),
        ("swiglu derived ffn", "--swiglu"),
        ("swiglu explicit ffn", "--swiglu --ffn-hidden-size 700"),
        ("explicit ffn", "--ffn-hidden-size 1000"),
        ("rmsnorm", "--normalization RMSNorm"),
        ("rope", "--position-embedding-type rope"),
        ("legacy rope flag", "--use-rotary-position-embeddings"),
        ("no positions", "--position-embedding-type none"),
        ("more positions", "--max-position-embeddings 2048"),
        ("kv channels", "--num-attention-heads 6 --kv-channels 64"),
        ("tp=2 padding", "--tensor-model-parallel-size 2"),
        ("tp=4 padding", "--tensor-model-parallel-size 4 --sequence-parallel"),
        ("divisible by 1", "--make-vocab-size-divisible-by 1 --vocab-size 1001"),
        (
            "llama-like",
            "--swiglu --normalization RMSNorm --disable-bias-linear --position-embedding-type rope \
             --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 4",
        ),
        ("bf16 selective", "--bf16 --recompute-activations"),
        (
            "fp16 full recompute",
            "--fp16 --recompute-granularity full --recompute-method block --recompute-num-layers 1",
        ),
        (
            "interleaved",
            "--num-layers 8 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2",
        ),
        ("equals spelling", "--num-layers=6 --hidden-size=128 --num-attention-heads=4"),
        ("checkpoints", "--save /tmp/ck --save-interval 10 --train-iters 100"),
    ]
    .into_iter()
    .map(|(name, extra)| Case {
        name: name.to_string(),
        args: common::words(&format!("{BASE} {extra}")),
    })
    .collect()
}

/// Argument lists Megatron refuses, with a piece of Megatron's message that shows it
/// refuses them for the reason the case is about; we must refuse them too.
const REFUSED: &[(&str, &str, &str)] = &[
    ("hidden not divisible by heads", "--num-attention-heads 6", "hidden_size % args.num_attention_heads"),
    ("seq longer than positions", "--seq-length 1024", "max_position_embeddings (512)"),
    ("seq longer than positions, rope", "--seq-length 1024 --position-embedding-type rope", "max_position_embeddings (512)"),
    ("fp16 and bf16", "--fp16 --bf16", "bf16"),
    ("full without method", "--recompute-granularity full --recompute-num-layers 1", "recompute_method must be"),
    ("full without layers", "--recompute-granularity full --recompute-method uniform", "recompute_num_layers must be between"),
    ("selective with method", "--recompute-activations --recompute-method uniform", "recompute method is not yet supported"),
    ("selective with layers", "--recompute-granularity selective --recompute-num-layers 1", "recompute_num_layers must be None"),
    ("save without interval", "--save /tmp/ck", "save_interval"),
    ("pp does not divide layers", "--pipeline-model-parallel-size 3", "divisible by the pipeline-model-parallel size"),
    ("virtual stages without pipeline", "--num-virtual-stages-per-pipeline-rank 2", "should be greater than 1"),
    ("virtual stage size does not divide", "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3", "divisible number of layers per virtual pipeline stage"),
    ("two virtual stage options", "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 --num-virtual-stages-per-pipeline-rank 2", "No more than one"),
    ("not a number", "--hidden-size 2k", "invalid int value"),
    ("bad choice", "--normalization layernorm", "invalid choice"),
    ("flag with value", "--swiglu=true", "ignored explicit argument"),
    ("option without value", "--num-layers", "expected one argument"),
    ("removed option", "--batch-size 4", "--batch-size argument is no longer valid"),
    ("negative", "--num-layers -4", ""),
    ("mla query norm without q-lora", "--position-embedding-type rope --multi-latent-attention --qk-layernorm", "q_lora_rank is None"),
];

fn refused_cases() -> Vec<Case> {
    REFUSED
        .iter()
        .map(|(name, extra, _)| Case {
            name: name.to_string(),
            args: common::words(&format!("{BASE} {extra}")),
        })
        .collect()
}

/// Mixture-of-experts models shaped like the published ones, at a size Megatron builds
/// in seconds on a CPU: expert counts, top-k, expert widths and layer patterns scaled down,
/// every kind of tensor kept.
const MOE: &[(&str, &str)] = &[
    (
        "moe: mixtral-like (GQA, SwiGLU experts, top-2 of 8)",
        "--swiglu --normalization RMSNorm --disable-bias-linear --position-embedding-type rope \
         --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2 \
         --num-experts 8 --moe-router-topk 2 --ffn-hidden-size 512 \
         --moe-token-dispatcher-type alltoall",
    ),
    (
        "moe: qwen3-like (GQA, qk-layernorm, wide heads, top-4 of 16)",
        "--swiglu --normalization RMSNorm --disable-bias-linear --position-embedding-type rope \
         --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2 \
         --kv-channels 48 --qk-layernorm --num-experts 16 --moe-router-topk 4 \
         --moe-ffn-hidden-size 64 --moe-token-dispatcher-type alltoall",
    ),
    (
        "moe: deepseek-v3-like (MLA, shared expert, first 3 dense, MTP)",
        "--num-layers 6 --swiglu --normalization RMSNorm --disable-bias-linear \
         --position-embedding-type rope --untie-embeddings-and-output-weights \
         --multi-latent-attention --q-lora-rank 96 --kv-lora-rank 64 --qk-head-dim 32 \
         --qk-pos-emb-head-dim 16 --v-head-dim 32 --qk-layernorm --ffn-hidden-size 384 \
         --num-experts 16 --moe-router-topk 4 --moe-ffn-hidden-size 48 \
         --moe-shared-expert-intermediate-size 48 --moe-layer-freq ([0]*3+[1]*3) \
         --mtp-num-layers 1 --moe-token-dispatcher-type alltoall",
    ),
    (
        "moe: small (GeLU, biases, LayerNorm, every other layer)",
        "--num-experts 4 --moe-ffn-hidden-size 128 --moe-layer-freq 2",
    ),
    (
        "moe: MLA without q-lora, biases, LayerNorm, MTP after a dense layer",
        "--position-embedding-type rope --multi-latent-attention --kv-lora-rank 32 \
         --qk-head-dim 32 --qk-pos-emb-head-dim 16 --v-head-dim 24 \
         --num-experts 4 --moe-layer-freq ([1]*3+[0]*1) --mtp-num-layers 2",
    ),
    (
        "moe: qk-layernorm dense with LayerNorm",
        "--qk-layernorm --group-query-attention --num-query-groups 4",
    ),
];

fn moe_cases() -> Vec<Case> {
    MOE.iter()
        .map(|(name, extra)| Case {
            name: name.to_string(),
            args: common::words(&format!("{BASE} {extra}")),
        })
        .collect()
}

fn all_cases() -> Vec<Case> {
    let mut cases = preset_cases();
    cases.extend(feature_cases());
    cases.extend(refused_cases());
    cases.extend(moe_cases());
    cases
}

/// Total and active parameters of MoE, MLA, multi-token-prediction and QK-norm models equal
/// those of the model megatron-core builds (active: its tensors less the routed experts
/// past the router's top-k in every MoE layer).
#[test]
fn moe_parameter_counts_equal_megatrons() {
    let verdicts = megatron();
    let mut table = String::from("case                                                              total (ours = Megatron)  active\n");
    for case in moe_cases() {
        let v = accepted(&case, verdicts);
        let model = model_from_megatron_args(&case.args, None)
            .unwrap_or_else(|e| panic!("{}: we refuse what Megatron accepts: {e}", case.name));
        let b = ParameterBreakdown::new(&model, 1);
        table.push_str(&format!(
            "{:<66}{:<25}{}\n",
            case.name,
            b.total(),
            b.active()
        ));
        assert_eq!(Some(b.total()), v["parameters"].as_u64(), "{}", case.name);
        assert_eq!(
            Some(b.active()),
            v["active_parameters"].as_u64(),
            "{}",
            case.name
        );
    }
    println!("{table}");
}

/// Megatron's verdict on every case, by case name (one Python process for all).
fn megatron() -> &'static BTreeMap<String, Value> {
    static VERDICTS: OnceLock<BTreeMap<String, Value>> = OnceLock::new();
    VERDICTS.get_or_init(|| {
        let python = common::venv_python();
        let cases = all_cases();
        let lists: Vec<&Vec<String>> = cases.iter().map(|c| &c.args).collect();
        let verdicts = common::run_python_batch(
            &python,
            "megatron_reference.py",
            &["--batch"],
            &json!(lists),
            std::time::Duration::from_secs(600),
        );
        assert_eq!(verdicts.len(), cases.len());
        cases.into_iter().map(|c| c.name).zip(verdicts).collect()
    })
}

fn ours(case: &Case) -> Settings {
    settings_from_megatron_args(&case.args, None, &[])
        .unwrap_or_else(|e| panic!("{}: we refuse what Megatron accepts: {e}", case.name))
}

fn accepted<'a>(case: &Case, verdicts: &'a BTreeMap<String, Value>) -> &'a Value {
    let v = &verdicts[&case.name];
    assert!(
        v.get("error").is_none(),
        "{}: Megatron refused the arguments: {}",
        case.name,
        v["error"]
    );
    v
}

#[test]
fn preset_parameter_counts_equal_megatrons() {
    let verdicts = megatron();
    let mut table = String::from(
        "preset (and parallel args)                        ours              Megatron          Megatron theoretical\n",
    );
    for case in preset_cases() {
        let v = accepted(&case, verdicts);
        let s = ours(&case);
        let tp = s.training.tensor_parallel;
        let count = total_parameters(&s.model, tp);
        table.push_str(&format!(
            "{:<50} {:<18}{:<18}{}\n",
            case.name,
            count,
            v["parameters"].as_u64().unwrap_or_default(),
            v["theoretical_parameters"].as_u64().unwrap_or_default()
        ));
        assert_eq!(Some(count), v["parameters"].as_u64(), "{}", case.name);
        // The mixture-of-experts presets: the parameters one token meets too.
        if s.model.moe.is_some() {
            assert_eq!(
                Some(ParameterBreakdown::new(&s.model, tp).active()),
                v["active_parameters"].as_u64(),
                "{} (active)",
                case.name
            );
        }
        assert_eq!(
            Some(padded_vocab_size(&s.model, tp)),
            v["padded_vocab_size"].as_u64(),
            "{}",
            case.name
        );
    }
    println!("{table}");
}

#[test]
fn presets_read_without_arguments_are_the_models_megatron_builds() {
    let verdicts = megatron();
    for p in PRESETS {
        let case = Case {
            name: p.name.to_string(),
            args: preset_args(p.name, ""),
        };
        let model = p.model().unwrap();
        assert_eq!(
            Some(total_parameters(&model, 1)),
            accepted(&case, verdicts)["parameters"].as_u64(),
            "{}",
            p.name
        );
    }
}

#[test]
fn feature_parameter_counts_equal_megatrons() {
    let verdicts = megatron();
    for case in feature_cases() {
        let v = accepted(&case, verdicts);
        let s = ours(&case);
        let tp = s.training.tensor_parallel;
        assert_eq!(
            Some(total_parameters(&s.model, tp)),
            v["parameters"].as_u64(),
            "{}",
            case.name
        );
        assert_eq!(
            Some(padded_vocab_size(&s.model, tp)),
            v["padded_vocab_size"].as_u64(),
            "{}",
            case.name
        );
    }
}

#[test]
fn derived_settings_equal_megatrons() {
    let verdicts = megatron();
    for case in preset_cases().into_iter().chain(feature_cases()) {
        let d = &accepted(&case, verdicts)["derived"];
        let s = ours(&case);
        let (m, t) = (&s.model, &s.training);
        let name = &case.name;
        let int = |key: &str| d[key].as_u64();
        assert_eq!(Some(m.num_layers), int("num_layers"), "{name}");
        assert_eq!(Some(m.hidden_size), int("hidden_size"), "{name}");
        assert_eq!(Some(m.ffn_hidden_size), int("ffn_hidden_size"), "{name}");
        assert_eq!(
            Some(m.num_attention_heads),
            int("num_attention_heads"),
            "{name}"
        );
        assert_eq!(Some(m.num_query_groups), int("num_query_groups"), "{name}");
        assert_eq!(Some(m.kv_channels), int("kv_channels"), "{name}");
        assert_eq!(Some(m.seq_length), int("seq_length"), "{name}");
        assert_eq!(
            Some(m.max_position_embeddings),
            int("max_position_embeddings"),
            "{name}"
        );
        let position = match m.position_embedding {
            PositionEmbedding::LearnedAbsolute => "learned_absolute",
            PositionEmbedding::Rope => "rope",
            PositionEmbedding::None => "none",
        };
        assert_eq!(d["position_embedding_type"], position, "{name}");
        let norm = match m.normalization {
            Normalization::LayerNorm => "LayerNorm",
            Normalization::RMSNorm => "RMSNorm",
        };
        assert_eq!(d["normalization"], norm, "{name}");
        assert_eq!(d["add_bias_linear"], m.add_bias_linear, "{name}");
        assert_eq!(d["add_qkv_bias"], m.add_qkv_bias, "{name}");
        assert_eq!(d["swiglu"], m.swiglu, "{name}");
        assert_eq!(
            d["untie_embeddings_and_output_weights"], m.untie_embeddings_and_output_weights,
            "{name}"
        );
        // Megatron's data-parallel size is 1 in the reference (world = tp × pp), and every
        // case gives --global-batch-size, so the global batch is the one written.
        assert_eq!(
            Some(t.global_batch_size),
            int("global_batch_size"),
            "{name}"
        );
        assert_eq!(Some(t.micro_batch_size), int("micro_batch_size"), "{name}");
        assert_eq!(
            Some(t.tensor_parallel),
            int("tensor_model_parallel_size"),
            "{name}"
        );
        assert_eq!(
            Some(t.pipeline_parallel),
            int("pipeline_model_parallel_size"),
            "{name}"
        );
        assert_eq!(
            t.virtual_pipeline,
            int("virtual_pipeline_model_parallel_size"),
            "{name}"
        );
        assert_eq!(d["bf16"], t.precision == Precision::Bf16, "{name}");
        assert_eq!(d["fp16"], t.precision == Precision::Fp16, "{name}");
        assert_eq!(
            d["use_distributed_optimizer"], t.distributed_optimizer,
            "{name}"
        );
        // Megatron turns sequence parallelism off at tp 1; we keep the user's intent.
        assert_eq!(
            d["sequence_parallel"],
            t.sequence_parallel && t.tensor_parallel > 1,
            "{name}"
        );
        let (granularity, method, layers) = match &t.recompute {
            Recompute::None => (Value::Null, Value::Null, Value::Null),
            Recompute::Selective => ("selective".into(), Value::Null, Value::Null),
            Recompute::Full { method, num_layers } => (
                "full".into(),
                match method {
                    RecomputeMethod::Uniform => "uniform",
                    RecomputeMethod::Block => "block",
                }
                .into(),
                (*num_layers).into(),
            ),
        };
        assert_eq!(d["recompute_granularity"], granularity, "{name}");
        assert_eq!(d["recompute_method"], method, "{name}");
        assert_eq!(d["recompute_num_layers"], layers, "{name}");
    }
}

#[test]
fn we_refuse_what_megatron_refuses() {
    let verdicts = megatron();
    for (case, (_, _, reason)) in refused_cases().into_iter().zip(REFUSED) {
        let v = &verdicts[&case.name];
        let error = v["error"].as_str().unwrap_or_else(|| {
            panic!(
                "{}: Megatron accepted the arguments ({} parameters); the case is wrong",
                case.name, v["parameters"]
            )
        });
        assert!(
            error.contains(reason),
            "{}: Megatron refuses for another reason than the case is about: {error}",
            case.name
        );
        let ours = settings_from_megatron_args(&case.args, None, &[]);
        assert!(
            ours.is_err(),
            "{}: Megatron refuses ({}) but we accept",
            case.name,
            v["error"]
        );
    }
}

/// The reference figures in tests/data are what Megatron 0.19.2 builds; they let other
/// parts of pipette use the counts without Python, and they catch a silent version change.
#[test]
fn committed_reference_figures_are_megatrons() {
    let verdicts = megatron();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/megatron_params.json");
    let mut live = BTreeMap::new();
    for case in preset_cases() {
        let v = &verdicts[&case.name];
        live.insert(
            case.name.clone(),
            serde_json::json!({
                "args": case.args.join(" "),
                "parameters": v["parameters"],
                "padded_vocab_size": v["padded_vocab_size"],
                "theoretical_parameters": v["theoretical_parameters"],
            }),
        );
    }
    if std::env::var_os("PIPETTE_WRITE_REFERENCE").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&live).unwrap() + "\n").unwrap();
    }
    let text = std::fs::read_to_string(&path).expect("tests/data/megatron_params.json");
    let committed: BTreeMap<String, Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(
        committed, live,
        "tests/data/megatron_params.json differs from Megatron's counts \
         (rewrite it with PIPETTE_WRITE_REFERENCE=1 cargo test --test megatron_params)"
    );
}
