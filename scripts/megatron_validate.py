#!/usr/bin/env python3
"""Megatron's own verdict on argument lists pipette-run renders (tests/render/render_megatron.rs).

Runs in the venv made by scripts/setup-megatron-venv (megatron-core 0.19.2, CPU torch). For
every case it does what a Megatron training script does with its arguments before the first
GPU kernel:

1. sets the environment the rendered launch script sets (CUDA_DEVICE_MAX_CONNECTIONS, ...),
   and removes every variable the case does not set, so Megatron judges our environment;
2. parses the arguments with Megatron's own parser (megatron.training.arguments.parse_args)
   and runs validate_args at the world size the launch scripts start (tp x pp x dp);
3. builds the TransformerConfig (core_transformer_config_from_args), whose __post_init__
   checks heads and query groups against tp, the recompute options, uneven pipeline stages
   and pipeline layouts;
4. builds Megatron's micro-batch calculator (global batch against micro-batch x dp), as
   megatron.training.initialize does;
5. for a mixture-of-experts model, the two checks Megatron makes after validate_args and
   before the first step, which a CPU process cannot reach: initialize_model_parallel's
   fold of the expert groups (the world divisible by etp x ep x pp, parallel_state.py) and
   the MoE layer's refusal of tensor parallelism without sequence parallelism
   (moe_layer.py), written out with the same conditions and messages;
6. reports what Megatron understood: the parallel sizes, the micro-batches, and the
   transformer layers each pipeline rank builds (Megatron's get_num_layers_to_build, per
   virtual stage, summed), so the test can check that Megatron reads the plan we meant;
   for a mixture-of-experts model also the expert-parallel and expert tensor-parallel sizes.

The one stub is the one scripts/megatron_reference.py uses: validate_args asks the GPU for
its architecture when tp > 1, which fails without a GPU; the answer is 9 (Hopper), the path
on which Megatron requires CUDA_DEVICE_MAX_CONNECTIONS=1. The one added argument is
--no-rope-fusion (MACHINE_ARGS): the fused RoPE kernel comes with Transformer Engine, which
a CPU venv lacks.

Usage:
    megatron_validate.py < CASES.json > VERDICTS.json

CASES.json is a JSON list of {"args": [str], "world_size": int, "env": {str: str},
"script_options": [{"name": "--opt", "flag": bool}]}: script_options are the training
script's own options, added to Megatron's parser as a script's extra_args_provider adds
them. The output is a JSON list with, per case, either {"derived": {...}} or
{"error": "message"}.
Megatron prints a lot while it validates; all of that goes to stderr.
"""

import contextlib
import io
import json
import os
import sys
import traceback
import warnings

# Megatron warns at import about missing Transformer Engine / Apex; validation needs neither.
warnings.filterwarnings("ignore")

# How kernels are built on this machine, not what is trained or how it is split: RoPE
# fusion is a Transformer Engine kernel, and this CPU venv has no Transformer Engine
# (TransformerConfig refuses apply_rope_fusion without it). GPU nodes have it.
MACHINE_ARGS = ["--no-rope-fusion"]

# Variables a case may set; anything else in this process's environment is left alone.
_CASE_VARIABLES = set()


def _start():
    """Imports Megatron and installs the one stub."""
    from megatron.training import arguments

    # STUB (the only one), as in megatron_reference.py: no GPU to ask for its architecture.
    arguments.get_device_arch_version = lambda: 9


def _set_environment(env):
    """The case's environment: its variables set, those of earlier cases removed."""
    for name in _CASE_VARIABLES - set(env):
        os.environ.pop(name, None)
    # Megatron reads these; a case that does not set them must not inherit them from us.
    for name in ("CUDA_DEVICE_MAX_CONNECTIONS",):
        if name not in env:
            os.environ.pop(name, None)
    for name, value in env.items():
        os.environ[name] = value
        _CASE_VARIABLES.add(name)


def _layers_per_stage(config):
    """Transformer layers on each pipeline rank, as Megatron's model builder counts them."""
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp = config.pipeline_model_parallel_size
    vpp = config.virtual_pipeline_model_parallel_size
    layout = config.pipeline_model_parallel_layout
    # The model builder runs with the virtual pipeline size set; the layout reads it.
    parallel_state.set_virtual_pipeline_model_parallel_world_size(vpp)
    try:
        stages = []
        for pp_rank in range(pp):
            total = 0
            for vp_stage in range(vpp or 1):
                stage = vp_stage if vpp is not None else None
                if layout is not None:
                    total += layout.get_num_layers_to_build(
                        layer_type=LayerType.decoder, vp_stage=stage, pp_rank=pp_rank
                    )
                else:
                    total += get_num_layers_to_build(config, vp_stage=stage, pp_rank=pp_rank)
            stages.append(total)
        return stages
    finally:
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)


def validate(case):
    """Megatron's reading of one case (raises when Megatron refuses it)."""
    _start()
    from megatron.core.num_microbatches_calculator import _build_num_microbatches_calculator
    from megatron.training import arguments
    from megatron.training.argument_utils import core_transformer_config_from_args

    _set_environment(case.get("env", {}))

    def script_options(parser):
        # What a training script adds with extra_args_provider (its own options).
        group = parser.add_argument_group("the training script's own options")
        for option in case.get("script_options", []):
            if option.get("flag"):
                group.add_argument(option["name"], action="store_true")
            else:
                group.add_argument(option["name"])
        return parser

    sys.argv = ["pretrain_gpt.py"] + list(case["args"]) + MACHINE_ARGS
    args = arguments.parse_args(extra_args_provider=script_options)
    # parse_args read WORLD_SIZE; the launch scripts start this many ranks.
    args.world_size = int(case["world_size"])
    arguments.validate_args(args)
    config = core_transformer_config_from_args(args)
    # As megatron.training.global_vars.set_global_variables builds it.
    calculator = _build_num_microbatches_calculator(
        rank=0,
        global_batch_size=args.global_batch_size,
        micro_batch_size=args.micro_batch_size,
        data_parallel_size=args.data_parallel_size * args.gtp_weight_remat_size,
        decrease_batch_size_if_needed=args.decrease_batch_size_if_needed,
        step_batch_size_schedule=args.step_batch_size_schedule,
        seq_length=args.seq_length,
    )
    if args.num_experts is not None:
        _check_expert_layout(args)
    derived = {
        "tensor_model_parallel_size": args.tensor_model_parallel_size,
        "pipeline_model_parallel_size": args.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": args.virtual_pipeline_model_parallel_size,
        "data_parallel_size": args.data_parallel_size,
        "micro_batch_size": args.micro_batch_size,
        "global_batch_size": args.global_batch_size,
        "num_microbatches": calculator.get(),
        "sequence_parallel": args.sequence_parallel,
        "use_distributed_optimizer": args.use_distributed_optimizer,
        "recompute_granularity": args.recompute_granularity,
        "recompute_method": args.recompute_method,
        "recompute_num_layers": args.recompute_num_layers,
        "num_layers": args.num_layers,
        "layers_per_stage": _layers_per_stage(config),
        "context_parallel_size": args.context_parallel_size,
        "cp_comm_type": args.cp_comm_type,
        "fp8": args.fp8,
    }
    if args.num_experts is not None:
        derived["expert_model_parallel_size"] = args.expert_model_parallel_size
        derived["expert_tensor_parallel_size"] = args.expert_tensor_parallel_size
    return derived


def _check_expert_layout(args):
    """Megatron's MoE checks past validate_args (megatron-core 0.19.2), same conditions."""
    # parallel_state.initialize_model_parallel: the expert rank generator's fold.
    folded = (
        args.expert_tensor_parallel_size
        * args.expert_model_parallel_size
        * args.pipeline_model_parallel_size
    )
    if args.world_size % folded != 0:
        raise RuntimeError(
            f"world_size ({args.world_size}) is not divisible by "
            f"expert_tensor_model_pipeline_parallel size ({folded})"
        )
    # moe_layer.py: MoELayer.forward in training.
    if args.tensor_model_parallel_size > 1 and not args.sequence_parallel:
        raise ValueError(
            "During training, performance may degrade if MoE and tensor parallelism"
            "are enabled without also enabling sequence parallelism."
        )


def judged(case):
    """validate(), with Megatron's refusal (assertion, argparse exit, ...) as an error."""
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(sys.stderr), contextlib.redirect_stderr(log):
            return {"derived": validate(case)}
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # argparse and validate_args exit(); asserts; ValueError
        message = str(error).strip()
        if isinstance(error, SystemExit):
            # argparse wrote its message to stderr before exiting.
            lines = [l for l in log.getvalue().splitlines() if "error:" in l]
            message = lines[-1] if lines else f"exit({error.code})"
        elif not message:
            # A bare assert: name the check that failed.
            frame = traceback.extract_tb(error.__traceback__)[-1]
            message = f"{frame.line} ({os.path.basename(frame.filename)}:{frame.lineno})"
        return {"error": f"{type(error).__name__}: {message}" if message else type(error).__name__}
    finally:
        sys.stderr.write(log.getvalue())


def main():
    cases = json.load(sys.stdin)
    well_formed = isinstance(cases, list) and all(
        isinstance(c, dict)
        and isinstance(c.get("args"), list)
        and all(isinstance(a, str) for a in c["args"])
        and isinstance(c.get("world_size"), int)
        and isinstance(c.get("env", {}), dict)
        and isinstance(c.get("script_options", []), list)
        for c in cases
    )
    if not well_formed:
        sys.exit(
            "megatron_validate.py: stdin must be a JSON list of "
            '{"args": [str], "world_size": int, "env": {str: str}}'
        )
    out = [judged(case) for case in cases]
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
