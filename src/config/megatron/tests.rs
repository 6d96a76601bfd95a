use super::options::OPTIONS;
use super::*;
use crate::config::{
    Constraints, CpCommType, Normalization, PositionEmbedding, Precision, Recompute,
    RecomputeMethod,
};

fn args(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

const TINY: &str = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 \
                    --max-position-embeddings 128 --vocab-size 1000 --global-batch-size 8";

fn settings(extra: &str) -> Result<Settings, ArgsError> {
    settings_from_megatron_args(&args(&format!("{TINY} {extra}")), None, &[])
}

fn contradiction_text(extra: &str) -> String {
    match settings(extra) {
        Err(ArgsError::Contradiction(text)) => text,
        other => panic!("expected a contradiction for {extra:?}, got {other:?}"),
    }
}

#[test]
fn reads_a_gpt_model_with_megatron_defaults() {
    let s = settings("").unwrap();
    let m = &s.model;
    assert_eq!(m.preset, None);
    assert_eq!(
        (m.num_layers, m.hidden_size, m.num_attention_heads),
        (2, 64, 4)
    );
    assert_eq!(m.ffn_hidden_size, 256);
    assert_eq!(m.kv_channels, 16);
    assert_eq!(m.num_query_groups, 4);
    assert_eq!(m.make_vocab_size_divisible_by, 128);
    assert_eq!(m.normalization, Normalization::LayerNorm);
    assert_eq!(m.position_embedding, PositionEmbedding::LearnedAbsolute);
    assert!(m.add_bias_linear && m.add_qkv_bias);
    assert!(!m.swiglu && !m.untie_embeddings_and_output_weights);
    let t = &s.training;
    assert_eq!((t.global_batch_size, t.micro_batch_size), (8, 1));
    assert_eq!(t.precision, Precision::Fp32);
    assert_eq!(t.recompute, Recompute::None);
    assert_eq!(
        (t.tensor_parallel, t.pipeline_parallel, t.virtual_pipeline),
        (1, 1, None)
    );
    assert!(!t.sequence_parallel && !t.distributed_optimizer);
    assert_eq!(s.constraints, Constraints::default());
}

#[test]
fn reads_equals_spelling_and_last_occurrence_wins() {
    let s = settings("--hidden-size=128 --num-layers 4 --num-layers=6").unwrap();
    assert_eq!((s.model.hidden_size, s.model.num_layers), (128, 6));
    assert_eq!(s.model.ffn_hidden_size, 512);
}

#[test]
fn leaves_unknown_options_and_their_values_alone() {
    let s = settings(
        "--lr 1.5e-4 --data-path a b c --split 969,30,1 --tokenizer-model /x/y.model \
         --micro-batch-size=2 --eval-iters 10 -x --weird=value",
    )
    .unwrap();
    assert_eq!(s.training.micro_batch_size, 2);
}

#[test]
fn stops_at_double_dash() {
    let s = settings("-- --num-layers 12").unwrap();
    assert_eq!(s.model.num_layers, 2);
}

#[test]
fn underscore_spelling_is_not_megatrons_but_gets_a_hint() {
    let a = args("--num_layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --vocab-size 100 --global-batch-size 1");
    let err = settings_from_megatron_args(&a, None, &[]).unwrap_err();
    let text = err.to_string();
    assert!(matches!(
        err,
        ArgsError::Missing {
            option: "--num-layers",
            ..
        }
    ));
    assert!(
        text.contains("--num_layers is not Megatron's spelling"),
        "{text}"
    );
}

#[test]
fn missing_model_size_suggests_a_preset() {
    let err = settings_from_megatron_args(&args("--hidden-size 64"), None, &[]).unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("missing --num-layers"), "{text}");
    assert!(
        text.contains("--model PRESET") && text.contains("llama2-7b"),
        "{text}"
    );
    for (drop, option) in [
        ("--hidden-size 64", "--hidden-size"),
        ("--num-attention-heads 4", "--num-attention-heads"),
        ("--seq-length 128", "--seq-length"),
    ] {
        let a = TINY
            .replace(drop, "")
            .replace("--max-position-embeddings 128", "");
        let err = settings_from_megatron_args(&args(&a), None, &[]).unwrap_err();
        assert!(
            matches!(err, ArgsError::Missing { option: o, .. } if o == option),
            "{err}"
        );
    }
}

#[test]
fn bad_values_are_errors_not_panics() {
    for (extra, option) in [
        ("--num-layers abc", "--num-layers"),
        ("--num-layers=-3", "--num-layers"),
        ("--hidden-size 0", "--hidden-size"),
        ("--hidden-size 1e3", "--hidden-size"),
        (
            "--micro-batch-size 99999999999999999999999",
            "--micro-batch-size",
        ),
        ("--normalization layernorm", "--normalization"),
        (
            "--recompute-granularity everything",
            "--recompute-granularity",
        ),
        ("--tokenizer-type Llama3Tokenizer", "--tokenizer-type"),
    ] {
        match settings(extra) {
            Err(ArgsError::InvalidValue { option: o, .. }) => assert_eq!(o, option, "{extra}"),
            other => panic!("{extra}: {other:?}"),
        }
    }
    assert!(matches!(
        settings("--num-layers"),
        Err(ArgsError::MissingValue { .. })
    ));
    assert!(matches!(
        settings("--num-layers --hidden-size 64"),
        Err(ArgsError::MissingValue { .. })
    ));
    assert!(matches!(
        settings("--bf16=yes"),
        Err(ArgsError::FlagWithValue { .. })
    ));
    // Python's int() accepts these, and so do we.
    let s = settings("--num-layers=+0_4 --global-batch-size 00008").unwrap();
    assert_eq!((s.model.num_layers, s.training.global_batch_size), (4, 8));
}

#[test]
fn derives_ffn_like_megatron() {
    assert_eq!(settings("--swiglu").unwrap().model.ffn_hidden_size, 128);
    let big = "--hidden-size 4096 --num-attention-heads 32 --swiglu";
    assert_eq!(settings(big).unwrap().model.ffn_hidden_size, 10880);
    let s = settings("--hidden-size 5120 --num-attention-heads 40 --swiglu").unwrap();
    assert_eq!(s.model.ffn_hidden_size, 13632);
    assert_eq!(
        settings("--ffn-hidden-size 100")
            .unwrap()
            .model
            .ffn_hidden_size,
        100
    );
    assert!(matches!(
        settings("--hidden-size 16 --num-attention-heads 4 --swiglu"),
        Err(ArgsError::Contradiction(_))
    ));
}

#[test]
fn derives_heads_groups_and_channels() {
    let s = settings("--kv-channels 32").unwrap();
    assert_eq!(s.model.kv_channels, 32);
    // Query groups count only with --group-query-attention, and default to 1 there.
    assert_eq!(
        settings("--num-query-groups 2")
            .unwrap()
            .model
            .num_query_groups,
        4
    );
    let gqa = settings("--group-query-attention --num-query-groups 2").unwrap();
    assert_eq!(gqa.model.num_query_groups, 2);
    assert_eq!(
        settings("--group-query-attention")
            .unwrap()
            .model
            .num_query_groups,
        1
    );
    let text = contradiction_text("--group-query-attention --num-query-groups 3");
    assert!(text.contains("--num-attention-heads 4") && text.contains("--num-query-groups 3"));
    let text = contradiction_text("--num-attention-heads 6");
    assert!(
        text.contains("--hidden-size 64") && text.contains("--kv-channels"),
        "{text}"
    );
    // With --kv-channels the hidden size need not divide.
    assert_eq!(
        settings("--num-attention-heads 6 --kv-channels 16")
            .unwrap()
            .model
            .kv_channels,
        16
    );
}

#[test]
fn positions_biases_and_norms() {
    let s =
        settings("--position-embedding-type rope --normalization RMSNorm --disable-bias-linear")
            .unwrap();
    assert_eq!(s.model.position_embedding, PositionEmbedding::Rope);
    assert_eq!(s.model.normalization, Normalization::RMSNorm);
    assert!(!s.model.add_bias_linear && !s.model.add_qkv_bias);
    let s =
        settings("--use-rotary-position-embeddings --disable-bias-linear --add-qkv-bias").unwrap();
    assert_eq!(s.model.position_embedding, PositionEmbedding::Rope);
    assert!(!s.model.add_bias_linear && s.model.add_qkv_bias);
    let s = settings("--position-embedding-type=none").unwrap();
    assert_eq!(s.model.position_embedding, PositionEmbedding::None);
    assert_eq!(
        settings("--position-embedding-type yarn")
            .unwrap()
            .model
            .position_embedding,
        PositionEmbedding::Rope
    );
    assert!(matches!(
        settings("--position-embedding-type relative"),
        Err(ArgsError::Unmodelled { .. })
    ));
    assert!(matches!(
        settings("--no-position-embedding"),
        Err(ArgsError::Contradiction(_))
    ));
    assert!(settings("--no-position-embedding --position-embedding-type rope").is_ok());
}

#[test]
fn max_positions_default_to_seq_length_and_must_cover_it() {
    let a = args("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 300 --vocab-size 10 --global-batch-size 1");
    let s = settings_from_megatron_args(&a, None, &[]).unwrap();
    assert_eq!(s.model.max_position_embeddings, 300);
    let text = contradiction_text("--seq-length 256");
    assert!(text.contains("--seq-length 256") && text.contains("--max-position-embeddings 128"));
    // Megatron checks it for rotary positions too.
    contradiction_text("--seq-length 256 --position-embedding-type rope");
}

#[test]
fn vocabulary_from_tokenizers() {
    let base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --global-batch-size 1";
    let vocab = |extra: &str| {
        settings_from_megatron_args(&args(&format!("{base} {extra}")), None, &[])
            .map(|s| s.model.vocab_size)
    };
    assert_eq!(vocab("--tokenizer-type GPT2BPETokenizer"), Ok(50257));
    assert_eq!(
        vocab("--tokenizer-type GPT2BPETokenizer --vocab-size 7"),
        Ok(50257)
    );
    assert_eq!(
        vocab("--tokenizer-type NullTokenizer --vocab-size 1000"),
        Ok(1000)
    );
    assert!(matches!(
        vocab("--tokenizer-type NullTokenizer"),
        Err(ArgsError::Missing {
            option: "--vocab-size",
            ..
        })
    ));
    assert_eq!(
        vocab("--tokenizer-type Llama2Tokenizer --vocab-size 32000"),
        Ok(32000)
    );
    assert!(matches!(
        vocab("--tokenizer-type Llama2Tokenizer --tokenizer-model /t.model"),
        Err(ArgsError::UnknownVocabulary { .. })
    ));
    assert_eq!(
        vocab("--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Llama-2-7b-hf"),
        Ok(32000)
    );
    assert_eq!(
        vocab("--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B"),
        Ok(128256)
    );
    assert!(matches!(
        vocab(""),
        Err(ArgsError::Missing {
            option: "--vocab-size",
            ..
        })
    ));
    assert_eq!(
        vocab("--vocab-size 5 --make-vocab-size-divisible-by 8"),
        Ok(5)
    );
    // A preset supplies the size a tokenizer file would.
    let s = settings_from_megatron_args(
        &args("--tokenizer-type Llama2Tokenizer --tokenizer-model /t.model"),
        Some("llama2-7b"),
        &[],
    )
    .unwrap();
    assert_eq!(s.model.vocab_size, 32000);
}

#[test]
fn low_precision_options_are_read_with_megatrons_names_and_defaults() {
    use crate::config::{LowBits, LowPrecision};
    let low = |args: &str| settings(args).unwrap().training.low_precision;
    assert_eq!(low("--bf16"), None);
    assert_eq!(
        low("--bf16 --fp8-format hybrid"),
        Some(LowPrecision {
            bits: LowBits::Fp8,
            format: "hybrid".into(),
            recipe: "delayed".into(),
            param_gather: false,
            bf16_layers_at_start: 0,
            bf16_layers_at_end: 0,
        })
    );
    let mx = low("--bf16 --fp8-format e4m3 --fp8-recipe mxfp8 --fp8-param-gather").unwrap();
    assert_eq!((mx.recipe.as_str(), mx.param_gather), ("mxfp8", true));
    let fp4 = low("--bf16 --fp4-format e2m1").unwrap();
    assert_eq!((fp4.bits, fp4.recipe.as_str()), (LowBits::Fp4, "nvfp4"));
    let text = contradiction_text("--bf16 --fp8-format hybrid --fp4-format e2m1");
    assert!(text.contains("choose one"), "{text}");
    assert!(contradiction_text("--bf16 --fp4-param-gather").contains("--fp4-format"));
    assert!(settings("--bf16 --fp8-recipe fast").is_err());
}

#[test]
fn first_and_last_layers_in_bf16_are_read_with_megatrons_defaults_and_rule() {
    let low = |args: &str| settings(args).unwrap().training.low_precision.unwrap();
    let ends = |args: &str| {
        let l = low(args);
        (l.bf16_layers_at_start, l.bf16_layers_at_end)
    };
    let mx = "--bf16 --fp8-format e4m3 --fp8-recipe mxfp8";
    assert_eq!(ends(mx), (0, 0));
    // One each by default (TransformerConfig), either count set alone.
    assert_eq!(ends(&format!("{mx} --first-last-layers-bf16")), (1, 1));
    assert_eq!(
        ends(&format!(
            "{mx} --first-last-layers-bf16 --num-layers-at-start-in-bf16 0 \
             --num-layers-at-end-in-bf16 4"
        )),
        (0, 4)
    );
    // The counts mean nothing without the flag, as in Megatron.
    assert_eq!(ends(&format!("{mx} --num-layers-at-end-in-bf16 4")), (0, 0));
    // Delayed scaling (the default recipe) cannot keep them: Megatron raises.
    let text = contradiction_text("--bf16 --fp8-format hybrid --first-last-layers-bf16");
    assert!(text.contains("Delayed scaling"), "{text}");
    assert!(settings(&format!(
        "{mx} --first-last-layers-bf16 --num-layers-at-start-in-bf16 -1"
    ))
    .is_err());
}

#[test]
fn bf16_layers_of_a_stage_count_the_model_s_first_and_last_layers_once() {
    use crate::config::{LowBits, LowPrecision};
    let low = |start, end| LowPrecision {
        bits: LowBits::Fp8,
        format: "e4m3".into(),
        recipe: "mxfp8".into(),
        param_gather: false,
        bf16_layers_at_start: start,
        bf16_layers_at_end: end,
    };
    // 12 layers over pp 3: stages [0, 4), [4, 8), [8, 12).
    let per_stage = |l: &LowPrecision| [0, 4, 8].map(|s| l.bf16_layers_in(s, 4, 12));
    assert_eq!(per_stage(&low(1, 1)), [1, 0, 1]);
    assert_eq!(per_stage(&low(0, 0)), [0, 0, 0]);
    assert_eq!(per_stage(&low(4, 2)), [4, 0, 2]);
    assert_eq!(per_stage(&low(5, 0)), [4, 1, 0]);
    // Overlapping ends on a short model: each layer once.
    assert_eq!(low(3, 3).bf16_layers_in(0, 4, 4), 4);
    assert_eq!(low(3, 3).bf16_layers_in(2, 2, 4), 2);
}

#[test]
fn precision_flags() {
    assert_eq!(
        settings("--bf16").unwrap().training.precision,
        Precision::Bf16
    );
    assert_eq!(
        settings("--fp16").unwrap().training.precision,
        Precision::Fp16
    );
    let text = contradiction_text("--fp16 --bf16");
    assert!(text.contains("--fp16") && text.contains("--bf16"));
}

#[test]
fn recomputation_like_megatron() {
    let r = |extra: &str| settings(extra).map(|s| s.training.recompute);
    assert_eq!(r("--recompute-activations"), Ok(Recompute::Selective));
    assert_eq!(
        r("--recompute-granularity selective"),
        Ok(Recompute::Selective)
    );
    assert_eq!(
        r("--recompute-granularity full --recompute-method block --recompute-num-layers 2"),
        Ok(Recompute::Full {
            method: RecomputeMethod::Block,
            num_layers: 2
        })
    );
    // --recompute-activations wins over --recompute-granularity full (arguments.py 589).
    assert_eq!(
        r("--recompute-granularity full --recompute-activations"),
        Ok(Recompute::Selective)
    );
    for bad in [
        "--recompute-method uniform",
        "--recompute-num-layers 1",
        "--recompute-granularity selective --recompute-method uniform",
        "--recompute-activations --recompute-num-layers 1",
        "--recompute-granularity full",
        "--recompute-granularity full --recompute-method uniform",
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 3",
    ] {
        let text = contradiction_text(bad);
        assert!(text.contains("--recompute"), "{bad}: {text}");
    }
}

#[test]
fn batch_sizes() {
    let s = settings("--micro-batch-size 4").unwrap();
    assert_eq!(
        (s.training.global_batch_size, s.training.micro_batch_size),
        (8, 4)
    );
    let text = contradiction_text("--micro-batch-size 3");
    assert!(text.contains("--global-batch-size 8") && text.contains("--micro-batch-size 3"));
    // Without a global batch: Megatron's micro × dp once dp is pinned, else an error.
    let a = args("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --vocab-size 10 --micro-batch-size 2");
    let err = settings_from_megatron_args(&a, None, &[]).unwrap_err();
    assert!(matches!(
        err,
        ArgsError::Missing {
            option: "--global-batch-size",
            ..
        }
    ));
    assert!(err.to_string().contains("--pin dp=N"), "{err}");
    let s = settings_from_megatron_args(&a, None, &[Pin::DataParallel(8)]).unwrap();
    assert_eq!(s.training.global_batch_size, 16);
}

#[test]
fn parallel_hints_and_virtual_stages() {
    let t = |extra: &str| {
        settings(&format!("--num-layers 8 {extra}")).map(|s| {
            (
                s.training.tensor_parallel,
                s.training.pipeline_parallel,
                s.training.virtual_pipeline,
            )
        })
    };
    assert_eq!(
        t("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4"),
        Ok((2, 4, None))
    );
    assert_eq!(
        t("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2"),
        Ok((1, 2, Some(2)))
    );
    assert_eq!(
        t("--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2"),
        Ok((1, 4, Some(2)))
    );
    // One virtual stage per rank is no interleaving.
    assert_eq!(
        t("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 4"),
        Ok((1, 2, None))
    );
    for bad in [
        "--pipeline-model-parallel-size 3",
        "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3",
        "--num-virtual-stages-per-pipeline-rank 2",
        "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --no-overlap-p2p-communication",
        "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --num-layers-per-virtual-pipeline-stage 2",
        "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 3",
    ] {
        assert!(matches!(t(bad), Err(ArgsError::Contradiction(_))), "{bad}");
    }
}

#[test]
fn sequence_parallel_at_tp1_is_kept_as_intent() {
    let s = settings("--sequence-parallel --use-distributed-optimizer").unwrap();
    assert!(s.training.sequence_parallel && s.training.distributed_optimizer);
}

#[test]
fn checkpoints_and_iterations() {
    let s = settings("--save /ck --load /ck --save-interval 100 --train-iters 5000").unwrap();
    assert_eq!(s.training.save.as_deref(), Some("/ck"));
    assert_eq!(s.training.load.as_deref(), Some("/ck"));
    assert_eq!(
        (s.training.save_interval, s.training.train_iters),
        (Some(100), Some(5000))
    );
    assert_eq!(
        settings("--persistent-save-interval 7")
            .unwrap()
            .training
            .save_interval,
        Some(7)
    );
    let text = contradiction_text("--save /ck");
    assert!(text.contains("--save-interval"));
}

#[test]
fn context_parallelism_is_read_and_its_rules_kept() {
    let s = settings("--context-parallel-size 2 --cp-comm-type a2a").unwrap();
    assert_eq!(s.training.context_parallel, 2);
    assert_eq!(s.training.cp_comm_type, CpCommType::A2a);
    // A hint unless pinned.
    assert_eq!(s.constraints.context_parallel, None);
    let s = settings("--cp-comm-type p2p p2p").unwrap();
    assert_eq!(s.training.cp_comm_type, CpCommType::P2p);
    // a2a+p2p: the levels are required and fix the size.
    let text = contradiction_text("--cp-comm-type a2a+p2p");
    assert!(
        text.contains("--hierarchical-context-parallel-sizes"),
        "{text}"
    );
    let s = settings("--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2").unwrap();
    assert_eq!(s.constraints.context_parallel, Some(4));
    let text = contradiction_text(
        "--context-parallel-size 8 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2",
    );
    assert!(text.contains("multiply to 4"), "{text}");
    assert!(matches!(
        settings("--cp-comm-type ring"),
        Err(ArgsError::InvalidValue { .. })
    ));
    assert!(matches!(
        settings("--cp-comm-type p2p a2a"),
        Err(ArgsError::InvalidValue { .. })
    ));
    // `--pin cp` takes the arguments' value; Megatron's 2·cp chunks must divide the sequence.
    let pins = parse_pins("cp").unwrap();
    let a = args(&format!("{TINY} --context-parallel-size 2"));
    let c = settings_from_megatron_args(&a, None, &pins)
        .unwrap()
        .constraints;
    assert_eq!(c.context_parallel, Some(2));
    let pins = parse_pins("cp=3").unwrap();
    match settings_from_megatron_args(&a, None, &pins) {
        Err(ArgsError::Contradiction(text)) => assert!(text.contains("2 × 3"), "{text}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(parse_pins("cp=4").unwrap()[0].to_string(), "cp=4");
}

#[test]
fn the_checkpoint_format_is_read_once_with_the_settings() {
    let plain = settings("--save /ck --save-interval 5").unwrap();
    assert_eq!(
        plain.training.checkpoint,
        crate::config::CheckpointFormat::default()
    );
    assert_eq!(plain.training.checkpoint.format, "torch_dist");
    let s = settings("--ckpt-format torch --dist-ckpt-optim-fully-reshardable").unwrap();
    assert_eq!(s.training.checkpoint.format, "torch");
    assert!(s.training.checkpoint.optimizer_fully_reshardable);
    // `--` ends Megatron's options: what follows is the script's own.
    let ended = args("--ckpt-format=torch_dcp -- --ckpt-format torch");
    let s = settings_from_megatron_args(&[args(TINY), ended].concat(), None, &[]).unwrap();
    assert_eq!(s.training.checkpoint.format, "torch_dcp");
}

#[test]
fn unsupported_and_removed_options() {
    for extra in ["--padded-vocab-size 1024", "--hybrid-layer-pattern M*M*"] {
        assert!(
            matches!(settings(extra), Err(ArgsError::Unmodelled { .. })),
            "{extra}"
        );
    }
    // Values that leave the feature off are fine.
    assert!(
        settings("--num-experts 0 --context-parallel-size 1 --expert-model-parallel-size=1")
            .is_ok()
    );
    let text = contradiction_text("--batch-size 4");
    assert!(text.contains("--micro-batch-size"));
    contradiction_text("--checkpoint-activations");
}

#[test]
fn absurd_sizes_are_refused() {
    let text =
        contradiction_text("--hidden-size 4000000000000 --num-attention-heads 1 --num-layers 1000");
    assert!(text.contains("too large"), "{text}");
    let text = contradiction_text("--num-layers 100000");
    assert!(text.contains("over 65536"), "{text}");
}

#[test]
fn preset_values_are_defaults_the_user_overrides() {
    let s = settings_from_megatron_args(&[], Some("llama2-7b"), &[]).unwrap();
    assert_eq!(s.model.preset.as_deref(), Some("llama2-7b"));
    assert_eq!((s.model.num_layers, s.model.seq_length), (32, 4096));
    let a =
        args("--num-layers 4 --seq-length 2048 --fp16 --micro-batch-size 2 --global-batch-size 64");
    let s = settings_from_megatron_args(&a, Some("llama2-7b"), &[]).unwrap();
    assert_eq!(
        (s.model.num_layers, s.model.seq_length, s.model.hidden_size),
        (4, 2048, 4096)
    );
    assert_eq!(s.training.precision, Precision::Fp16);
    assert_eq!(
        (s.training.micro_batch_size, s.training.global_batch_size),
        (2, 64)
    );
    // Longer sequences than the preset's positions need more positions, as in Megatron.
    let err = settings_from_megatron_args(&args("--seq-length 8192"), Some("llama2-7b"), &[]);
    assert!(matches!(err, Err(ArgsError::Contradiction(_))));
    let a = args("--seq-length 8192 --max-position-embeddings 8192");
    assert!(settings_from_megatron_args(&a, Some("llama2-7b"), &[]).is_ok());
    // The user's vocabulary replaces the preset's.
    let a = args("--tokenizer-type NullTokenizer --vocab-size 1000");
    let s = settings_from_megatron_args(&a, Some("gpt3-1.3b"), &[]).unwrap();
    assert_eq!(s.model.vocab_size, 1000);
    let err = settings_from_megatron_args(&[], Some("gpt-5"), &[]).unwrap_err();
    assert!(matches!(err, ArgsError::UnknownPreset { .. }));
    assert!(err.to_string().contains("gpt3-1.3b"));
}

#[test]
fn parses_pins() {
    assert_eq!(
        parse_pins("tp,pp=2, dp=8 ,mbs=1,vpp,sp=false,recompute=selective,dist-opt=on"),
        Ok(vec![
            Pin::TensorParallel(None),
            Pin::PipelineParallel(Some(2)),
            Pin::DataParallel(8),
            Pin::MicroBatch(Some(1)),
            Pin::VirtualPipeline(None),
            Pin::SequenceParallel(Some(false)),
            Pin::Recompute(Some(Recompute::Selective)),
            Pin::DistributedOptimizer(Some(true)),
        ])
    );
    assert_eq!(
        parse_pins("all,dp=4"),
        Ok(vec![Pin::All, Pin::DataParallel(4)])
    );
    assert_eq!(
        parse_pins("recompute=full:block:2"),
        Ok(vec![Pin::Recompute(Some(Recompute::Full {
            method: RecomputeMethod::Block,
            num_layers: 2
        }))])
    );
    for bad in [
        "",
        "tp,",
        "dp",
        "tp=0",
        "tp=x",
        "zz",
        "tp,tp=2",
        "all=1",
        "sp=maybe",
        "recompute=full:uniform",
        "recompute=full:fast:1",
        "recompute=full:block:0",
    ] {
        assert!(
            matches!(parse_pins(bad), Err(ArgsError::BadPin { .. })),
            "{bad:?}"
        );
    }
    let text = parse_pins("tensor=2").unwrap_err().to_string();
    assert!(text.contains("tp, pp, dp"), "{text}");
    for pin in parse_pins("tp=2,pp,dp=8,recompute=full:uniform:1,sp=true,all,vpp=1").unwrap() {
        assert_eq!(parse_pins(&pin.to_string()), Ok(vec![pin]));
    }
    let full = parse_pins("recompute=full").unwrap();
    assert_eq!(full[0].to_string(), "recompute=full");
}

#[test]
fn pins_take_values_from_the_args() {
    let extra = "--num-layers 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 \
                 --micro-batch-size 2 --sequence-parallel --recompute-activations";
    let a = args(&format!("{TINY} {extra}"));
    let c = settings_from_megatron_args(
        &a,
        None,
        &parse_pins("tp,pp,mbs,sp,recompute,dist-opt").unwrap(),
    )
    .unwrap()
    .constraints;
    assert_eq!(c.tensor_parallel, Some(2));
    assert_eq!(c.pipeline_parallel, Some(4));
    assert_eq!(c.micro_batch_size, Some(2));
    assert_eq!(c.sequence_parallel, Some(true));
    assert_eq!(c.recompute, Some(Recompute::Selective));
    assert_eq!(c.distributed_optimizer, Some(false));
    assert_eq!((c.data_parallel, c.virtual_pipeline), (None, None));
    // Explicit values win over the args.
    let c = settings_from_megatron_args(&a, None, &parse_pins("tp=4,dp=2,recompute=full").unwrap())
        .unwrap()
        .constraints;
    assert_eq!((c.tensor_parallel, c.data_parallel), (Some(4), Some(2)));
    assert_eq!(
        c.recompute,
        Some(Recompute::Full {
            method: RecomputeMethod::Uniform,
            num_layers: 1
        })
    );
    // `all` pins everything the args say, with Megatron's defaults for the rest.
    let c = settings_from_megatron_args(&a, None, &[Pin::All, Pin::DataParallel(1)])
        .unwrap()
        .constraints;
    assert_eq!(
        c,
        Constraints {
            tensor_parallel: Some(2),
            pipeline_parallel: Some(4),
            data_parallel: Some(1),
            micro_batch_size: Some(2),
            virtual_pipeline: Some(1),
            sequence_parallel: Some(true),
            recompute: Some(Recompute::Selective),
            distributed_optimizer: Some(false),
            context_parallel: Some(1),
            expert_parallel: None,
            expert_tensor_parallel: None,
        }
    );
}

#[test]
fn pins_the_args_do_not_give_are_errors() {
    for (pin, key) in [
        ("tp", "tp"),
        ("pp", "pp"),
        ("mbs", "mbs"),
        ("vpp", "vpp"),
        ("all", "all"),
    ] {
        let err =
            settings_from_megatron_args(&args(TINY), None, &parse_pins(pin).unwrap()).unwrap_err();
        assert!(
            matches!(err, ArgsError::PinWithoutValue { key: k, .. } if k == key),
            "{pin}: {err}"
        );
    }
}

#[test]
fn pinned_values_megatron_would_refuse() {
    let a = args(&format!("{TINY} --num-layers 6"));
    for (pins, what) in [
        ("tp=3", "--num-attention-heads 4"),
        // A pp that does not divide the layers splits them unevenly (first and last
        // stages apart), but not into more stages than layers, nor with virtual stages.
        ("pp=7", "--num-layers 6"),
        ("pp=4,vpp=2", "virtual stages need equal stages"),
        ("pp=2,vpp=2", "vpp=2"),
        ("ep=2", "needs a model with experts"),
        ("mbs=3", "--global-batch-size 8"),
        ("dp=3", "--global-batch-size 8"),
        ("dp=2,mbs=8", "mbs=8"),
    ] {
        match settings_from_megatron_args(&a, None, &parse_pins(pins).unwrap()) {
            Err(ArgsError::Contradiction(text)) => {
                assert!(text.contains(what), "{pins}: {text}")
            }
            other => panic!("{pins}: {other:?}"),
        }
    }
    let gqa = args(&format!(
        "{TINY} --num-attention-heads 8 --group-query-attention --num-query-groups 2"
    ));
    assert!(settings_from_megatron_args(&gqa, None, &parse_pins("tp=4").unwrap()).is_ok());
    assert!(settings_from_megatron_args(&gqa, None, &parse_pins("tp=8").unwrap()).is_ok());
    assert!(settings_from_megatron_args(&a, None, &parse_pins("pp=4").unwrap()).is_ok());
    // Experts: ep divides them; etp > 1 needs no biases and divides the expert width.
    let moe = args(&format!("{TINY} --num-layers 6 --num-experts 8"));
    for (pins, what) in [("ep=3", "ep=3"), ("etp=2", "linear biases")] {
        match settings_from_megatron_args(&moe, None, &parse_pins(pins).unwrap()) {
            Err(ArgsError::Contradiction(text)) => {
                assert!(text.contains(what), "{pins}: {text}")
            }
            other => panic!("{pins}: {other:?}"),
        }
    }
    let c = settings_from_megatron_args(&moe, None, &parse_pins("ep=4,etp=1").unwrap())
        .unwrap()
        .constraints;
    assert_eq!(
        (c.expert_parallel, c.expert_tensor_parallel),
        (Some(4), Some(1))
    );
}

#[test]
fn error_messages_are_one_line() {
    let cases = [
        "--fp16 --bf16",
        "--num-attention-heads 6",
        "--seq-length 999",
        "--micro-batch-size 3",
        "--recompute-granularity full",
        "--hybrid-layer-pattern M*M*",
        "--num-layers x",
    ];
    for extra in cases {
        let text = settings(extra).unwrap_err().to_string();
        assert!(!text.contains('\n') && !text.is_empty(), "{extra}: {text}");
    }
}

proptest::proptest! {
    #[test]
    fn never_panics_on_any_words(words in proptest::collection::vec(
        proptest::prop_oneof![
            proptest::sample::select(OPTIONS.iter().map(|o| format!("--{}", o.name)).collect::<Vec<_>>()),
            "[-+=_a-zA-Z0-9]{0,12}",
            proptest::sample::select(vec!["0".to_string(), "1".into(), "18446744073709551615".into(), "--".into(), "-1".into(), "=".into()]),
        ],
        0..24,
    )) {
        let _ = settings_from_megatron_args(&words, None, &[]);
        let _ = settings_from_megatron_args(&words, Some("gpt3-1.3b"), &[Pin::All]);
        let _ = parse_pins(&words.join(","));
    }
}

fn moe_settings(extra: &str) -> Result<Settings, ArgsError> {
    read_settings(&args(&format!("{TINY} {extra}")), None, &[])
}

#[test]
fn reads_mixture_of_experts_with_megatron_defaults() {
    let s = moe_settings("--num-experts 8").unwrap();
    let moe = s.model.moe.unwrap();
    assert_eq!((moe.num_experts, moe.router_topk), (8, 2));
    assert_eq!(moe.ffn_hidden_size, 256, "defaults to --ffn-hidden-size");
    assert_eq!(moe.layers, vec![true, true]);
    assert_eq!(moe.dispatcher, crate::config::Dispatcher::Allgather);
    assert_eq!(moe.capacity_factor, None);
    assert_eq!(s.training.expert_parallel, 1);
    assert_eq!(s.training.expert_tensor_parallel, None);

    let s = moe_settings(
        "--num-experts 64 --moe-router-topk 6 --moe-ffn-hidden-size 32 \
         --moe-shared-expert-intermediate-size 64 --moe-layer-freq ([0]*1+[1]*1) \
         --expert-model-parallel-size 8 --expert-tensor-parallel-size 1 --moe-grouped-gemm \
         --moe-token-dispatcher-type alltoall --moe-router-load-balancing-type seq_aux_loss none \
         --moe-expert-capacity-factor 1.25 --moe-token-drop-policy position \
         --recompute-granularity selective --recompute-modules moe_act layernorm \
         --disable-bias-linear",
    )
    .unwrap();
    let moe = s.model.moe.unwrap();
    assert_eq!(moe.layers, vec![false, true]);
    assert_eq!((moe.router_topk, moe.ffn_hidden_size), (6, 32));
    assert_eq!(moe.shared_expert_ffn, Some(64));
    assert!(moe.grouped_gemm);
    assert_eq!(moe.dispatcher, crate::config::Dispatcher::Alltoall);
    assert_eq!(moe.load_balancing, crate::config::LoadBalancing::SeqAuxLoss);
    assert_eq!(moe.capacity_factor, Some(1.25));
    assert_eq!(moe.drop_policy, crate::config::DropPolicy::Position);
    assert_eq!(
        (
            s.training.expert_parallel,
            s.training.expert_tensor_parallel
        ),
        (8, Some(1))
    );
    use crate::config::RecomputeModule::{Layernorm, MoeAct};
    assert_eq!(s.training.recompute_modules, vec![MoeAct, Layernorm]);
}

#[test]
fn reads_multi_latent_attention_mtp_and_qk_norms() {
    let s = moe_settings(
        "--multi-latent-attention --q-lora-rank 24 --kv-lora-rank 16 --qk-head-dim 8 \
         --qk-pos-emb-head-dim 4 --v-head-dim 8 --mtp-num-layers 1 --qk-layernorm",
    )
    .unwrap();
    let mla = s.model.mla.unwrap();
    assert_eq!(
        (
            mla.q_lora_rank,
            mla.kv_lora_rank,
            mla.qk_head_dim,
            mla.qk_pos_emb_head_dim,
            mla.v_head_dim
        ),
        (Some(24), 16, 8, 4, 8)
    );
    assert_eq!(s.model.mtp_layers, 1);
    assert!(s.model.qk_layernorm);
    let mla = moe_settings("--multi-latent-attention")
        .unwrap()
        .model
        .mla
        .unwrap();
    assert_eq!(
        (mla.q_lora_rank, mla.kv_lora_rank, mla.v_head_dim),
        (None, 32, 128)
    );
}

#[test]
fn moe_arguments_megatron_refuses_are_refused() {
    for (extra, needle) in [
        ("--expert-model-parallel-size 2", "needs --num-experts"),
        ("--num-experts 4 --moe-router-topk 5", "more than --num-experts"),
        ("--num-experts 4 --moe-layer-freq [1]*3", "--moe-layer-freq"),
        ("--num-experts 4 --recompute-granularity selective --recompute-modules moe_act", "grouped"),
        ("--recompute-granularity selective --recompute-modules mla_up_proj", "multi-latent"),
        ("--multi-latent-attention --group-query-attention", "grouped-query"),
        ("--num-layers-per-virtual-pipeline-stage 1 --decoder-first-pipeline-num-layers 1 --pipeline-model-parallel-size 2", "num-virtual-stages"),
    ] {
        match moe_settings(extra) {
            Err(ArgsError::Contradiction(text)) => assert!(text.contains(needle), "{extra}: {text}"),
            other => panic!("{extra}: {other:?}"),
        }
    }
    assert!(matches!(
        moe_settings("--moe-layer-freq [1]*x"),
        Err(ArgsError::InvalidValue { .. })
    ));
    assert!(matches!(
        moe_settings("--recompute-modules everything"),
        Err(ArgsError::InvalidValue { .. })
    ));
}

/// Megatron's rules among the MoE options and with linear biases (TransformerConfig,
/// SharedExpertMLP, TEGroupedMLP): each combination it refuses gets our error, naming the
/// options and the way out; the same options with the way out taken are read. The same
/// lists are put to Megatron itself in tests/render_megatron.rs.
#[test]
fn moe_option_combinations_megatron_refuses_are_refused() {
    let e = "--num-experts 8 --disable-bias-linear";
    for (bad, needle, fixed) in [
        (
            format!("{e} --moe-shared-expert-intermediate-size 64 --moe-shared-expert-overlap"),
            "alltoall or flex",
            format!("{e} --moe-shared-expert-intermediate-size 64 --moe-shared-expert-overlap --moe-token-dispatcher-type alltoall"),
        ),
        (
            format!("{e} --moe-expert-capacity-factor 1.0 --moe-router-load-balancing-type aux_loss sinkhorn"),
            "sinkhorn",
            format!("{e} --moe-expert-capacity-factor 1.0 --moe-router-load-balancing-type aux_loss none"),
        ),
        (
            format!("{e} --moe-pad-expert-input-to-capacity"),
            "needs --moe-expert-capacity-factor",
            format!("{e} --moe-pad-expert-input-to-capacity --moe-expert-capacity-factor 1.0"),
        ),
        (
            format!("{e} --moe-router-enable-expert-bias"),
            "score function",
            format!("{e} --moe-router-enable-expert-bias --moe-router-score-function sigmoid"),
        ),
        (
            "--num-experts 8 --moe-shared-expert-intermediate-size 64".to_string(),
            "add --disable-bias-linear",
            format!("{e} --moe-shared-expert-intermediate-size 64"),
        ),
        (
            "--num-experts 8 --moe-grouped-gemm --swiglu".to_string(),
            "bias-dropout fusion",
            "--num-experts 8 --moe-grouped-gemm --swiglu --no-bias-dropout-fusion".to_string(),
        ),
        (
            "--num-experts 8 --moe-grouped-gemm --no-bias-dropout-fusion".to_string(),
            "bias-GeLU fusion",
            "--num-experts 8 --moe-grouped-gemm --no-bias-dropout-fusion --no-bias-gelu-fusion"
                .to_string(),
        ),
    ] {
        match moe_settings(&bad) {
            Err(ArgsError::Contradiction(text)) => assert!(text.contains(needle), "{bad}: {text}"),
            other => panic!("{bad}: {other:?}"),
        }
        moe_settings(&fixed).unwrap_or_else(|e| panic!("{fixed}: {e}"));
    }
    // Without experts the options are Megatron's no-ops, and ours.
    moe_settings("--moe-pad-expert-input-to-capacity --moe-router-enable-expert-bias").unwrap();
}

#[test]
fn uneven_stages_as_written_skip_megatrons_divisibility_check() {
    let a = "--num-layers 61 --hidden-size 64 --num-attention-heads 4 --seq-length 128 \
             --vocab-size 1000 --global-batch-size 8 --pipeline-model-parallel-size 16 \
             --decoder-first-pipeline-num-layers 1";
    let s = read_settings(&args(a), None, &[]).unwrap();
    assert_eq!(s.training.first_stage_layers, Some(1));
    assert!(read_settings(
        &args(&a.replace("--decoder-first-pipeline-num-layers 1", "")),
        None,
        &[]
    )
    .is_err());
}

#[test]
fn a_dense_model_with_qk_layernorm_plans() {
    // Qwen3's dense models: the query/key norms are priced (activations and kernels), so
    // the model plans instead of launching with planning off.
    let s = settings("--qk-layernorm --group-query-attention --num-query-groups 4").unwrap();
    assert!(s.model.qk_layernorm);
}
