//! Every argument list render writes is one that Megatron's own parser and validate_args
//! accept, and Megatron reads from it the plan we meant.
//!
//! Builds a matrix of plans by hand (presets × parallel settings: tensor, pipeline and
//! data parallel sizes, micro-batches, virtual stages, uneven stages in all three forms,
//! GQA, untied embeddings, selective and full recomputation, sequence parallelism, the
//! distributed optimizer, user arguments with parallel options to replace and options of
//! the script's own), renders each, and runs every argument list — with the environment
//! its launch script exports — through `scripts/megatron_validate.py` in one Python
//! process: megatron-core 0.19.2's `parse_args`, `validate_args` at the world size the
//! scripts start, `TransformerConfig`, and the micro-batch calculator. For each plan
//! Megatron must accept, and derive the plan's parallel sizes, micro-batches,
//! recomputation and the layers on every pipeline stage. Deliberately wrong lists (tp not
//! dividing the heads or the query groups, an uneven split Megatron cannot build, virtual
//! stages that do not divide, a missing CUDA_DEVICE_MAX_CONNECTIONS) must be refused, so
//! the check can fail.
//!
//! The matrix is written here, so it tests render alone; last come the plans the planner
//! makes on the mixed-GPU example clusters (layers split by GPU speed and memory, rendered
//! as first/last stage counts or as `--pipeline-model-parallel-layout`), so the uneven
//! layouts it really produces are judged by Megatron too.
//! Never skips: without the venv it fails and says how to make it
//! (`PIPETTE_MEGATRON_PYTHON` picks the python, else `scripts/setup-megatron-venv`'s).

use crate::common;

use common::words;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use pipette::cluster::ClusterProfile;
use pipette::config::megatron::Pin;
use pipette::config::{settings_from_megatron_args, LowBits, Recompute, RecomputeMethod, Settings};
use pipette::model::parallel::ParallelConfig;
use pipette::plan::{plan, MappingMode, PlanOptions};
use pipette::render::{render, LaunchSpec, RenderInput, ScriptInvocation, Templates};
use serde_json::{json, Value};

/// One plan: the user's arguments, the settings read from them, the configuration.
struct Case {
    name: String,
    user_args: Vec<String>,
    settings: Settings,
    config: ParallelConfig,
    /// The training script's own options (name, is a flag), known to its parser.
    script_options: Vec<(&'static str, bool)>,
}

impl Case {
    fn new(preset: Option<&str>, user: &str, tp: u64, pp: u64, dp: u64, mbs: u64) -> Self {
        Self::with_pins(preset, user, &[], tp, pp, dp, mbs)
    }

    fn with_pins(
        preset: Option<&str>,
        user: &str,
        pins: &[Pin],
        tp: u64,
        pp: u64,
        dp: u64,
        mbs: u64,
    ) -> Self {
        let user_args = common::words(user);
        let settings = settings_from_megatron_args(&user_args, preset, pins)
            .unwrap_or_else(|e| panic!("{preset:?} {user}: {e}"));
        let layers = settings.model.num_layers;
        assert_eq!(layers % pp, 0, "use .stages() for uneven splits");
        Case {
            name: format!(
                "{} tp{tp} pp{pp} dp{dp} mbs{mbs}",
                preset.unwrap_or("custom")
            ),
            user_args,
            settings,
            config: ParallelConfig::even(layers, tp, pp, dp, mbs),
            script_options: Vec::new(),
        }
    }

    fn vpp(mut self, v: u64) -> Self {
        self.config.vpp = Some(v);
        self.name += &format!(" vpp{v}");
        self
    }

    fn stages(mut self, stages: &[u64]) -> Self {
        assert_eq!(stages.len() as u64, self.config.pp);
        self.config.layers_per_stage = stages.to_vec();
        self.name += &format!(" stages{stages:?}");
        self
    }

    fn sp(mut self) -> Self {
        self.config.sequence_parallel = true;
        self.name += " sp";
        self
    }

    fn dist_opt(mut self) -> Self {
        self.config.distributed_optimizer = true;
        self.name += " dist-opt";
        self
    }

    fn selective(mut self) -> Self {
        self.config.recompute = Recompute::Selective;
        self.name += " selective";
        self
    }

    fn full(mut self, method: RecomputeMethod, num_layers: u64) -> Self {
        self.config.recompute = Recompute::Full { method, num_layers };
        self.name += &format!(" full-{method:?}-{num_layers}");
        self
    }

    fn script_options(mut self, options: &[(&'static str, bool)]) -> Self {
        self.script_options = options.to_vec();
        self
    }

    fn world(&self) -> u64 {
        self.config.world_size()
    }

    /// Renders the case on `world / G` nodes of G GPUs (G the largest of 8, 4, 2, 1 that
    /// divides the world), hosts `node00..`, GPUs in order.
    fn render(&self) -> LaunchSpec {
        let world = self.world();
        let nproc = [8, 4, 2, 1].into_iter().find(|g| world % g == 0).unwrap();
        let hosts: Vec<String> = (0..world / nproc).map(|i| format!("node{i:02}")).collect();
        let cvd: BTreeMap<String, Vec<u32>> = hosts
            .iter()
            .map(|h| (h.clone(), (0..nproc as u32).collect()))
            .collect();
        let script = ScriptInvocation::python("pretrain_gpt.py", self.user_args.clone());
        let input = RenderInput::new(&self.settings, script, &self.config, &hosts, &cvd);
        render(&input, &Templates::embedded()).unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }

    /// What Megatron must derive from the rendered arguments: with experts, the expert
    /// layout too.
    fn expected(&self) -> Value {
        let mut expected = self.expected_dense();
        if self.settings.model.moe.is_some() {
            expected["expert_model_parallel_size"] = json!(self.config.ep);
            expected["expert_tensor_parallel_size"] = json!(self.config.etp);
        }
        expected
    }

    fn expected_dense(&self) -> Value {
        let c = &self.config;
        let global = self.settings.training.global_batch_size;
        let (granularity, method, layers) = match &c.recompute {
            Recompute::None => (Value::Null, Value::Null, Value::Null),
            Recompute::Selective => (json!("selective"), Value::Null, Value::Null),
            Recompute::Full { method, num_layers } => (
                json!("full"),
                json!(match method {
                    RecomputeMethod::Uniform => "uniform",
                    RecomputeMethod::Block => "block",
                }),
                json!(num_layers),
            ),
        };
        json!({
            "tensor_model_parallel_size": c.tp,
            "pipeline_model_parallel_size": c.pp,
            "virtual_pipeline_model_parallel_size": c.vpp.filter(|v| *v > 1),
            "data_parallel_size": c.dp,
            "micro_batch_size": c.micro_batch,
            "global_batch_size": global,
            "num_microbatches": global / (c.micro_batch * c.dp),
            "sequence_parallel": c.tp > 1 && c.sequence_parallel,
            "use_distributed_optimizer": c.distributed_optimizer,
            "recompute_granularity": granularity,
            "recompute_method": method,
            "recompute_num_layers": layers,
            "num_layers": self.settings.model.num_layers,
            "layers_per_stage": c.layers_per_stage,
            "context_parallel_size": c.cp,
            "cp_comm_type": [self.settings.training.cp_comm_type.megatron_name()],
            "fp8": self.settings.training.low_precision.as_ref()
                .filter(|l| l.bits == LowBits::Fp8)
                .map(|l| l.format.clone()),
        })
    }
}

use RecomputeMethod::{Block, Uniform};

/// Arguments a real run adds that have nothing to do with parallelism, and which must pass
/// through untouched.
const TRAINING: &str = "--lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --weight-decay 0.1 \
                        --clip-grad 1.0 --train-iters 1000 --log-interval 10 --seed 1234";

fn cases() -> Vec<Case> {
    let g13 = Some("gpt3-1.3b");
    let g67 = Some("gpt3-6.7b");
    let g13b = Some("gpt3-13b");
    let g175 = Some("gpt3-175b");
    let l7 = Some("llama2-7b");
    let l13 = Some("llama2-13b");
    let l70 = Some("llama2-70b");
    let custom = "--num-layers 12 --hidden-size 1024 --num-attention-heads 16 \
                  --group-query-attention --num-query-groups 4 --swiglu --normalization RMSNorm \
                  --untie-embeddings-and-output-weights --position-embedding-type rope \
                  --disable-bias-linear --seq-length 2048 --max-position-embeddings 2048 \
                  --vocab-size 32000 --global-batch-size 64 --bf16";
    vec![
        // GPT-3 1.3B: 24 layers, 16 heads, batch 512.
        Case::new(g13, TRAINING, 1, 1, 16, 4),
        Case::new(g13, "", 2, 1, 8, 2).sp().selective(),
        Case::new(g13, "", 1, 2, 8, 1).stages(&[11, 13]),
        Case::new(g13, "", 1, 4, 4, 2).vpp(2),
        Case::new(g13, "--fp16", 4, 2, 2, 1)
            .vpp(2)
            .stages(&[10, 14]),
        // GPT-3 6.7B: 32 layers, 32 heads, batch 1024.
        Case::new(g67, TRAINING, 4, 2, 4, 1)
            .sp()
            .dist_opt()
            .full(Uniform, 1),
        Case::new(g67, "", 8, 1, 4, 2).sp().dist_opt(),
        Case::new(g67, "", 2, 4, 2, 1).vpp(4).selective(),
        Case::new(g67, "", 1, 4, 4, 1).stages(&[7, 9, 9, 7]),
        Case::new(g67, "", 2, 4, 4, 1)
            .stages(&[5, 9, 9, 9])
            .dist_opt(),
        // GPT-3 13B: 40 layers, 40 heads.
        Case::new(g13b, "", 8, 2, 2, 1)
            .sp()
            .dist_opt()
            .full(Block, 2),
        Case::new(g13b, "", 4, 4, 2, 1).vpp(5).sp(),
        Case::new(g13b, "", 2, 4, 4, 1).stages(&[9, 10, 11, 10]),
        Case::new(g13b, "", 1, 8, 2, 2).vpp(5),
        // GPT-3 175B: 96 layers, 96 heads, batch 1536.
        Case::new(g175, "", 8, 16, 4, 1).sp().dist_opt().selective(),
        Case::new(g175, "", 8, 12, 2, 1).vpp(2).sp(),
        Case::new(g175, "", 4, 8, 4, 1)
            .stages(&[11, 12, 12, 12, 12, 12, 12, 13])
            .full(Uniform, 2),
        // Llama 2 7B: 32 layers, 32 heads, untied embeddings, batch 1024.
        Case::new(l7, TRAINING, 1, 1, 8, 4).selective().dist_opt(),
        Case::new(l7, "", 2, 2, 4, 2).sp().dist_opt(),
        Case::new(l7, "", 4, 4, 1, 1).vpp(2),
        Case::new(l7, "", 2, 4, 2, 1).stages(&[7, 9, 8, 8]),
        Case::new(l7, "", 8, 1, 2, 1).sp().full(Uniform, 1),
        // Llama 2 13B: 40 layers, 40 heads.
        Case::new(l13, "", 4, 2, 4, 1).sp().dist_opt().selective(),
        Case::new(l13, "", 2, 5, 2, 1).full(Block, 4),
        Case::new(l13, "", 8, 4, 2, 1).vpp(5).sp().dist_opt(),
        Case::new(l13, "", 4, 4, 2, 1).stages(&[8, 11, 11, 10]).sp(),
        // Llama 2 70B: 80 layers, 64 heads in 8 query groups (GQA).
        Case::new(l70, "", 8, 4, 4, 1).sp().dist_opt().selective(),
        Case::new(l70, "", 8, 8, 2, 1).vpp(5).sp().dist_opt(),
        Case::new(l70, "", 4, 10, 2, 1)
            .stages(&[7, 8, 8, 8, 8, 8, 8, 8, 8, 9])
            .full(Uniform, 1),
        Case::new(l70, "", 2, 16, 1, 1).vpp(2),
        Case::new(l70, "", 8, 2, 4, 1).vpp(2).stages(&[38, 42]).sp(),
        // A model written out in full: GQA, SwiGLU, untied, three stages of 3, 4, 5 layers.
        Case::new(None, custom, 4, 3, 2, 1)
            .stages(&[3, 4, 5])
            .sp()
            .dist_opt(),
        Case::new(None, custom, 2, 3, 2, 2)
            .vpp(2)
            .stages(&[4, 4, 4]),
        // Qwen3's dense shape: the same with query/key norms.
        Case::new(None, &format!("{custom} --qk-layernorm"), 4, 2, 4, 1)
            .stages(&[6, 6])
            .sp(),
        // The user's own parallel options are replaced; the script's options pass through.
        Case::new(
            None,
            &format!(
                "{custom} --tensor-model-parallel-size 8 --pipeline-model-parallel-size=6 \
                 --micro-batch-size 16 --recompute-activations --sequence-parallel \
                 --use-distributed-optimizer --save /ckpt --save-interval 50 \
                 --my-data-path /data/corpus --my-flag {TRAINING}"
            ),
            2,
            2,
            2,
            4,
        )
        .script_options(&[("--my-data-path", false), ("--my-flag", true)]),
        // Neither --global-batch-size nor --max-position-embeddings: both are written.
        Case::with_pins(
            None,
            "--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 \
             --vocab-size 1000 --micro-batch-size 2",
            &[Pin::DataParallel(4)],
            2,
            1,
            4,
            1,
        ),
        // Flags Megatron would refuse under the plan are dropped.
        Case::new(
            l7,
            "--overlap-grad-reduce --overlap-param-gather --no-overlap-p2p-communication",
            1,
            2,
            4,
            1,
        )
        .vpp(2),
    ]
}

/// A wrong list and a fragment of the reason Megatron must give.
struct Wrong {
    name: &'static str,
    case: Value,
    because: &'static str,
}

fn as_case(args: &[String], world: u64, env: &[(String, String)]) -> Value {
    let env: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    json!({"args": args, "world_size": world, "env": env})
}

fn replace(args: &[String], option: &str, value: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        if args[i] == option {
            if let Some(v) = value {
                out.extend([option.to_string(), v.to_string()]);
            }
            i += 2;
        } else {
            out.push(args[i].clone());
            i += 1;
        }
    }
    out
}

fn wrong_cases() -> Vec<Wrong> {
    let mut wrong = Vec::new();
    // tp = 3 does not divide Llama 2 7B's 32 heads (rendered as any plan would be).
    let c = Case::new(Some("llama2-7b"), "", 3, 1, 4, 1);
    let spec = c.render();
    wrong.push(Wrong {
        name: "tp does not divide the heads",
        case: as_case(&spec.megatron_args, c.world(), &spec.nodes[0].env),
        because: "num_attention_heads",
    });
    // tp = 4 is neither a divisor nor a multiple of 6 query groups (Megatron replicates
    // key/value heads when tp is a multiple of the groups, so tp 16 over 8 groups is fine).
    let c = Case::new(
        None,
        "--num-layers 4 --hidden-size 1536 --num-attention-heads 24 --group-query-attention \
         --num-query-groups 6 --seq-length 512 --max-position-embeddings 512 --vocab-size 1000 \
         --global-batch-size 8",
        4,
        1,
        2,
        1,
    );
    let spec = c.render();
    wrong.push(Wrong {
        name: "tp does not divide the query groups",
        case: as_case(&spec.megatron_args, c.world(), &spec.nodes[0].env),
        because: "num_query_groups",
    });
    // 32 layers, pp 4, first stage 6: the 26 others do not split evenly over 3 stages.
    let c = Case::new(Some("gpt3-6.7b"), "", 1, 4, 4, 1).stages(&[7, 9, 9, 7]);
    let spec = c.render();
    let args = replace(
        &spec.megatron_args,
        "--decoder-first-pipeline-num-layers",
        Some("6"),
    );
    let args = replace(&args, "--decoder-last-pipeline-num-layers", None);
    wrong.push(Wrong {
        name: "an uneven split with unequal middle stages",
        case: as_case(&args, c.world(), &spec.nodes[0].env),
        because: "divisible",
    });
    // 8 layers per stage in virtual stages of 3.
    let c = Case::new(Some("gpt3-1.3b"), "", 1, 4, 4, 2).vpp(2);
    let spec = c.render();
    let args = replace(
        &spec.megatron_args,
        "--num-layers-per-virtual-pipeline-stage",
        Some("4"),
    );
    wrong.push(Wrong {
        name: "virtual stages that do not divide the stage",
        case: as_case(&args, c.world(), &spec.nodes[0].env),
        because: "divisible",
    });
    // A layout with a layer too few.
    let c = Case::new(Some("gpt3-13b"), "", 2, 4, 4, 1).stages(&[9, 10, 11, 10]);
    let spec = c.render();
    let args = replace(
        &spec.megatron_args,
        "--pipeline-model-parallel-layout",
        Some("Et*9|t*10|t*11|t*9L"),
    );
    wrong.push(Wrong {
        name: "a layout that does not hold every layer",
        case: as_case(&args, c.world(), &spec.nodes[0].env),
        because: "num_layers",
    });
    // tp > 1 without the variable the launch scripts export.
    let c = Case::new(Some("llama2-7b"), "", 2, 2, 4, 2);
    let spec = c.render();
    wrong.push(Wrong {
        name: "tp > 1 without CUDA_DEVICE_MAX_CONNECTIONS=1",
        case: as_case(&spec.megatron_args, c.world(), &[]),
        because: "CUDA_DEVICE_MAX_CONNECTIONS",
    });
    // The same list at a world size the plan does not start.
    wrong.push(Wrong {
        name: "a world that tp × pp does not divide",
        case: as_case(&spec.megatron_args, 6, &spec.nodes[0].env),
        because: "world size",
    });
    // More layers kept in BF16 at the start than a stage holds (32 layers over pp 4): the
    // planner's space leaves such a pp out for the same reason.
    let c = Case::new(
        Some("gpt3-6.7b"),
        "--fp8-format e4m3 --fp8-recipe tensorwise --first-last-layers-bf16 \
         --num-layers-at-start-in-bf16 9",
        1,
        4,
        2,
        1,
    );
    let spec = c.render();
    wrong.push(Wrong {
        name: "more BF16 layers at the start than a stage holds",
        case: as_case(&spec.megatron_args, c.world(), &spec.nodes[0].env),
        because: "num_layers_at_start_in_bf16",
    });
    wrong
}

/// Megatron's verdict on every case, in order (one Python process).
fn megatron_verdicts(cases: &[Value]) -> Vec<Value> {
    common::run_python_batch(
        &common::venv_python(),
        "megatron_validate.py",
        &[],
        &json!(cases),
        Duration::from_secs(300),
    )
}

/// The planner's plans on the mixed example clusters, as cases.
fn planned_mixed_cases() -> Vec<Case> {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/clusters");
    [
        (
            "a100-v100-mixed-4x8.json",
            "gpt3-13b",
            "--fp16 --global-batch-size 64",
        ),
        (
            "a100-v100-mixed-4x8.json",
            "gpt3-6.7b",
            "--fp16 --global-batch-size 64",
        ),
        (
            "h100-a100-mixed-4x8.json",
            "llama2-13b",
            "--global-batch-size 64",
        ),
        (
            "h100-a100-mixed-4x8.json",
            "gpt3-13b",
            "--global-batch-size 128",
        ),
    ]
    .into_iter()
    .map(|(file, preset, user)| {
        let cluster = ClusterProfile::load(examples.join(file)).unwrap();
        let user_args = common::words(user);
        let settings = settings_from_megatron_args(&user_args, Some(preset), &[]).unwrap();
        let options = PlanOptions {
            budget: Some(2_000),
            top_k: 2,
            ..PlanOptions::default()
        };
        let plan = plan(&settings, &cluster, &options).unwrap_or_else(|e| panic!("{e}"));
        let stages = &plan.config.layers_per_stage;
        assert!(
            stages.iter().any(|l| *l != stages[0]),
            "{file} {preset}: the planner split evenly ({stages:?})"
        );
        Case {
            name: format!("{preset} planned on {file} stages{stages:?}"),
            user_args,
            settings,
            config: plan.config,
            script_options: Vec::new(),
        }
    })
    .collect()
}

/// Issue 30: context-parallel and FP8 configurations the planner ranks best (every mapped
/// one of each plan) for long sequences on the example clusters: across the network
/// (H100 nodes), inside NVLink domains (GB200 trays), with each `--cp-comm-type`.
fn planned_long_context_cases() -> Vec<Case> {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/clusters");
    let gb200 = ClusterProfile::load(examples.join("gb200-nvl72-4racks.json"))
        .unwrap()
        .at_positions(&(0..8).collect::<Vec<_>>());
    let four = [0, 1, 2, 3];
    let h100 = ClusterProfile::load(examples.join("h100-16x8.json"))
        .unwrap()
        .at_positions(&four);
    let b200 = ClusterProfile::load(examples.join("dgx-b200-16x8.json"))
        .unwrap()
        .at_positions(&four);
    let long = |seq: u64, batch: u64, extra: &str| {
        format!(
            "--seq-length {seq} --max-position-embeddings {seq} --global-batch-size {batch} {extra}"
        )
    };
    let plans = [
        (&h100, "llama3-8b", long(32_768, 64, "--fp8-format hybrid")),
        (
            &h100,
            "llama3-8b",
            long(
                65_536,
                32,
                "--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 4",
            ),
        ),
        (
            &b200,
            "llama3-70b",
            long(65_536, 32, "--fp8-format e4m3 --fp8-recipe tensorwise"),
        ),
        (
            &b200,
            "llama3-8b",
            long(
                32_768,
                32,
                "--fp8-format hybrid --fp8-recipe mxfp8 --first-last-layers-bf16 \
                 --num-layers-at-start-in-bf16 2 --num-layers-at-end-in-bf16 3",
            ),
        ),
        (
            &b200,
            "llama3-8b",
            long(131_072, 16, "--cp-comm-type allgather"),
        ),
        (
            &gb200,
            "llama3-8b",
            long(131_072, 16, "--fp8-format hybrid --cp-comm-type a2a"),
        ),
        (
            &gb200,
            "llama3-70b",
            long(32_768, 32, "--fp8-format hybrid --fp8-param-gather"),
        ),
    ];
    let mut cases = Vec::new();
    for (cluster, preset, user) in plans {
        let user_args = words(&user);
        let settings = settings_from_megatron_args(&user_args, Some(preset), &[])
            .unwrap_or_else(|e| panic!("{preset} {user}: {e}"));
        // Megatron judges the configurations; where their ranks run does not matter here.
        let options = PlanOptions {
            mapping: MappingMode::Identity,
            top_k: 4,
            ..PlanOptions::default()
        };
        let plan =
            plan(&settings, cluster, &options).unwrap_or_else(|e| panic!("{preset} {user}: {e}"));
        for ranked in &plan.top {
            let c = &ranked.config;
            cases.push(Case {
                name: format!(
                    "{preset} {user} planned tp{} cp{} pp{} dp{} mbs{}",
                    c.tp, c.cp, c.pp, c.dp, c.micro_batch
                ),
                user_args: user_args.clone(),
                settings: settings.clone(),
                config: c.clone(),
                script_options: Vec::new(),
            });
        }
    }
    let interesting = cases
        .iter()
        .filter(|c| c.config.cp > 1 || c.settings.training.low_precision.is_some())
        .count();
    assert!(interesting >= 20, "only {interesting} CP or FP8 plans");
    assert!(
        cases.iter().filter(|c| c.config.cp > 1).count() >= 10,
        "the planner chose context parallelism too rarely"
    );
    assert!(cases
        .iter()
        .any(|c| c.config.cp > 1 && c.settings.training.low_precision.is_some()));
    cases
}

#[test]
fn megatron_accepts_every_rendered_argument_list_and_refuses_wrong_ones() {
    let mut cases = cases();
    cases.extend(planned_mixed_cases());
    cases.extend(planned_long_context_cases());
    assert!(cases.len() >= 30, "the matrix has {} plans", cases.len());
    let mut inputs = Vec::new();
    for case in &cases {
        let spec = case.render();
        // Every node exports the same Megatron-relevant environment; judge node 0's.
        let mut input = as_case(&spec.megatron_args, case.world(), &spec.nodes[0].env);
        input["script_options"] = case
            .script_options
            .iter()
            .map(|(name, flag)| json!({"name": name, "flag": flag}))
            .collect();
        inputs.push(input);
    }
    let wrong = wrong_cases();
    inputs.extend(wrong.iter().map(|w| w.case.clone()));

    let verdicts = megatron_verdicts(&inputs);
    assert_eq!(verdicts.len(), inputs.len());
    let mut failures = misread_cases(&cases, &inputs, &verdicts);
    for (w, verdict) in wrong.iter().zip(&verdicts[cases.len()..]) {
        match verdict.get("error").and_then(Value::as_str) {
            Some(error) if error.contains(w.because) => {}
            Some(error) => failures.push(format!(
                "{}: refused, but not because of {:?}: {error}",
                w.name, w.because
            )),
            None => failures.push(format!("{}: Megatron accepted a wrong list", w.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn user_arguments_pass_through_byte_for_byte_and_in_order() {
    // The case with the user's own parallel options and the script's options: everything
    // but the parallel options comes first, as written.
    let case = cases()
        .into_iter()
        .find(|c| !c.script_options.is_empty())
        .unwrap();
    let spec = case.render();
    let custom: Vec<String> = case.user_args[..case
        .user_args
        .iter()
        .position(|a| a == "--tensor-model-parallel-size")
        .unwrap()]
        .to_vec();
    let mut kept = custom;
    kept.extend(common::words(
        "--save /ckpt --save-interval 50 --my-data-path /data/corpus --my-flag",
    ));
    kept.extend(common::words(TRAINING));
    assert_eq!(spec.megatron_args[..kept.len()], kept[..]);
    assert_eq!(
        spec.megatron_args[kept.len()..].join(" "),
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --micro-batch-size 4"
    );
}

/// The trial run's arguments (`pipette::trial::trial_args`: short, no checkpoints, no
/// evaluation) are ones Megatron accepts, for a run measured in iterations and for one
/// measured in samples — where `--train-iters` beside `--lr-decay-samples` is refused, as
/// the last case checks, so the trial must keep counting in samples.
#[test]
fn megatron_accepts_the_trial_arguments() {
    let checkpoints = "--save /ckpt --save-interval 50 --load /ckpt --eval-interval 100 \
                       --eval-iters 10";
    let by_iterations = format!("{TRAINING} {checkpoints}");
    let by_samples = format!(
        "--lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --train-samples 2000000 \
         --lr-decay-samples 1900000 --lr-warmup-samples 20000 {checkpoints}"
    );
    let trial = |user: &str| {
        let (args, _) = pipette::trial::trial_args(&common::words(user), 5, 512);
        args.join(" ")
    };
    let cases = [
        Case::new(Some("gpt3-1.3b"), &trial(&by_iterations), 2, 2, 4, 2),
        Case::new(Some("llama2-7b"), &trial(&by_samples), 2, 2, 4, 1).sp(),
    ];
    let mut inputs: Vec<Value> = cases
        .iter()
        .map(|case| {
            let spec = case.render();
            as_case(&spec.megatron_args, case.world(), &spec.nodes[0].env)
        })
        .collect();
    // What the trial must not do: iterations beside a sample-based schedule.
    let mut mixed = replace(&cases[1].render().megatron_args, "--train-samples", None);
    mixed.extend(["--train-iters".to_string(), "5".to_string()]);
    inputs.push(as_case(
        &mixed,
        cases[1].world(),
        &cases[1].render().nodes[0].env,
    ));

    let verdicts = megatron_verdicts(&inputs);
    for (case, verdict) in cases.iter().zip(&verdicts) {
        assert_eq!(
            verdict.get("derived"),
            Some(&case.expected()),
            "{}: Megatron's verdict on the trial arguments: {verdict}",
            case.name
        );
    }
    let refused = verdicts[cases.len()]["error"].as_str().unwrap_or_default();
    assert!(
        refused.contains("iteration-based"),
        "Megatron was expected to refuse --train-iters beside --lr-decay-samples: {}",
        verdicts[cases.len()]
    );
}

/// Mixture-of-experts models the planner plans (issue 29): each one's best configurations
/// (the plan's ranked list, mapped) on example clusters, with pins, rendered and judged by
/// Megatron: every one accepted, with the expert layout, stages and batches we meant.
/// Shapes: the Mixtral and Qwen3 presets, and DeepSeek-V3-like models small enough to plan
/// quickly in a debug build (MLA, a shared expert, dense first layers, one MTP layer, 61-
/// and 13-layer stacks that need uneven stages).
fn planned_moe_cases() -> Vec<Case> {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/clusters");
    let deepseek_like = |layers: u64, dense: u64| {
        format!(
            "--num-layers {layers} --hidden-size 1024 --ffn-hidden-size 2816 \
             --num-attention-heads 16 --multi-latent-attention --q-lora-rank 384 \
             --kv-lora-rank 128 --qk-head-dim 64 --qk-pos-emb-head-dim 32 --v-head-dim 64 \
             --qk-layernorm --swiglu --normalization RMSNorm --disable-bias-linear \
             --position-embedding-type rope --untie-embeddings-and-output-weights \
             --num-experts 64 --moe-ffn-hidden-size 256 --moe-shared-expert-intermediate-size 256 \
             --moe-router-topk 6 --moe-layer-freq ([0]*{dense}+[1]*{}) \
             --moe-router-score-function sigmoid --moe-router-enable-expert-bias \
             --moe-token-dispatcher-type alltoall --mtp-num-layers 1 --seq-length 2048 \
             --max-position-embeddings 2048 --vocab-size 32000 --global-batch-size 256 --bf16",
            layers - dense
        )
    };
    let runs: Vec<(&str, Option<&str>, String, &str)> = vec![
        ("h100-16x8.json", Some("mixtral-8x7b"), String::new(), ""),
        (
            "h100-16x8.json",
            Some("mixtral-8x7b"),
            String::new(),
            "ep=8,etp=1",
        ),
        ("h100-16x8.json", Some("qwen3-30b-a3b"), String::new(), ""),
        ("a100-2x8.json", None, deepseek_like(13, 1), ""),
        ("h100-16x8.json", None, deepseek_like(61, 3), "pp=8"),
        ("a100-2x8.json", None, deepseek_like(13, 1), "etp=2,tp=2"),
        // Long context with experts (issue 30): the expert groups fold out of tp × cp × dp.
        (
            "h100-16x8.json",
            Some("qwen3-30b-a3b"),
            "--seq-length 32768 --max-position-embeddings 32768 --global-batch-size 64".to_string(),
            "cp=2",
        ),
    ];
    let mut cases = Vec::new();
    for (file, preset, user, pins) in runs {
        let cluster = ClusterProfile::load(examples.join(file)).unwrap();
        let user_args = words(&user);
        let pins = if pins.is_empty() {
            Vec::new()
        } else {
            pipette::config::megatron::parse_pins(pins).unwrap()
        };
        let settings = settings_from_megatron_args(&user_args, preset, &pins)
            .unwrap_or_else(|e| panic!("{preset:?} {pins:?}: {e}"));
        let options = PlanOptions {
            budget: Some(500),
            top_k: 4,
            ..PlanOptions::default()
        };
        let plan = plan(&settings, &cluster, &options)
            .unwrap_or_else(|e| panic!("{file} {preset:?} {pins:?}: {e}"));
        // The plan says its expert layout; an expert group of 8 ranks runs its all-to-all
        // inside one node of 8 GPUs, whatever the mapping.
        let experts = plan
            .experts
            .as_ref()
            .expect("an MoE plan names its experts");
        assert_eq!((experts.ep, experts.etp), (plan.config.ep, plan.config.etp));
        if plan.config.ep * plan.config.etp <= 8 {
            assert_eq!(
                experts.group_nodes,
                1,
                "{file} {preset:?}: {}",
                experts.line()
            );
        }
        for ranked in &plan.top {
            let c = &ranked.config;
            cases.push(Case {
                name: format!(
                    "{} on {file} pinned {pins:?}: tp{} cp{} pp{} dp{} ep{} etp{} mbs{} stages{:?}",
                    preset.unwrap_or("deepseek-like"),
                    c.tp,
                    c.cp,
                    c.pp,
                    c.dp,
                    c.ep,
                    c.etp,
                    c.micro_batch,
                    c.layers_per_stage
                ),
                user_args: user_args.clone(),
                settings: settings.clone(),
                config: c.clone(),
                script_options: Vec::new(),
            });
        }
    }
    cases
}

#[test]
fn megatron_accepts_every_planned_moe_configuration() {
    let cases = planned_moe_cases();
    assert!(
        cases.len() >= 20,
        "{} planned MoE configurations",
        cases.len()
    );
    assert!(
        cases.iter().any(|c| c.config.ep > 1) && cases.iter().any(|c| c.config.etp > 1),
        "the plans split experts"
    );
    assert!(
        cases.iter().any(|c| c.config.ep > 1 && c.config.cp > 1),
        "a plan with both context and expert parallelism"
    );
    assert!(
        cases.iter().any(|c| c
            .config
            .layers_per_stage
            .iter()
            .any(|l| *l != c.config.layers_per_stage[0])),
        "an uneven split among the plans"
    );
    let mut inputs = Vec::new();
    for case in &cases {
        let spec = case.render();
        inputs.push(as_case(
            &spec.megatron_args,
            case.world(),
            &spec.nodes[0].env,
        ));
    }
    // Wrong on purpose, so the check can fail: an expert group that does not fold into
    // the world, and tensor parallelism without sequence parallelism.
    let first = &cases[0];
    let spec = first.render();
    let world = first.world();
    let too_wide = (world / first.config.pp * 2).to_string();
    let folded = replace(
        &spec.megatron_args,
        "--expert-tensor-parallel-size",
        Some(&too_wide),
    );
    inputs.push(as_case(&folded, world, &spec.nodes[0].env));
    let tp_case = cases
        .iter()
        .find(|c| c.config.tp > 1)
        .expect("a plan with tp > 1");
    let tp_spec = tp_case.render();
    let mut no_sp = tp_spec.megatron_args.clone();
    no_sp.retain(|a| a != "--sequence-parallel");
    inputs.push(as_case(&no_sp, tp_case.world(), &tp_spec.nodes[0].env));

    // MoE option combinations Megatron's TransformerConfig refuses (issue 29 item 2): each
    // appended to a planned list (the last occurrence wins), refused by our reader before
    // anything launches, and by Megatron.
    let shared = cases
        .iter()
        .find(|c| {
            c.settings
                .model
                .moe
                .as_ref()
                .is_some_and(|m| m.shared_expert_ffn.is_some())
        })
        .expect("a plan with a shared expert");
    let shared_spec = shared.render();
    let refused: [(&str, &str, &str); 4] = [
        (
            "--moe-token-dispatcher-type allgather --moe-shared-expert-overlap",
            "alltoall or flex",
            "moe_shared_expert_overlap only works with alltoall or flex",
        ),
        (
            "--moe-expert-capacity-factor 1.0 --moe-router-load-balancing-type sinkhorn",
            "sinkhorn load balancing",
            "moe_expert_capacity_factor only works with",
        ),
        (
            "--moe-pad-expert-input-to-capacity",
            "needs --moe-expert-capacity-factor",
            "moe_expert_capacity_factor must be set",
        ),
        (
            "--moe-router-enable-expert-bias --moe-router-score-function softmax",
            "score function",
            "Expert bias for aux-loss-free routing",
        ),
    ];
    let mut failures = Vec::new();
    for (extra, ours, _) in &refused {
        let mut args = shared_spec.megatron_args.clone();
        args.extend(words(extra));
        match settings_from_megatron_args(&args, None, &[]) {
            Err(e) if e.to_string().contains(ours) => {}
            other => failures.push(format!("{extra}: our reader gave {other:?}")),
        }
        inputs.push(as_case(&args, shared.world(), &shared_spec.nodes[0].env));
    }

    let verdicts = megatron_verdicts(&inputs);
    assert_eq!(verdicts.len(), inputs.len());
    failures.extend(misread_cases(&cases, &inputs, &verdicts));
    let theirs = refused.iter().map(|(_, _, theirs)| *theirs);
    for (verdict, because) in verdicts[cases.len()..].iter().zip(
        [
            "expert_tensor_model_pipeline_parallel",
            "sequence parallelism",
        ]
        .into_iter()
        .chain(theirs),
    ) {
        match verdict.get("error").and_then(Value::as_str) {
            Some(error) if error.contains(because) => {}
            other => failures.push(format!(
                "a wrong list was not refused for {because:?}: {other:?}"
            )),
        }
    }
    println!(
        "{} planned MoE configurations judged by Megatron",
        cases.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// What Megatron refused or read otherwise than we meant, one text per such case: each of
/// `cases` against its verdict (the first `cases.len()` of `verdicts`).
fn misread_cases(cases: &[Case], inputs: &[Value], verdicts: &[Value]) -> Vec<String> {
    let mut failures = Vec::new();
    for ((case, input), verdict) in cases.iter().zip(inputs).zip(verdicts) {
        match verdict.get("derived") {
            Some(derived) if *derived == case.expected() => {}
            Some(derived) => failures.push(format!(
                "{}: Megatron read\n  {derived}\nexpected\n  {}\nfrom {}",
                case.name,
                case.expected(),
                input["args"]
            )),
            None => failures.push(format!(
                "{}: Megatron refused: {}\nargs: {}",
                case.name, verdict["error"], input["args"]
            )),
        }
    }
    failures
}
