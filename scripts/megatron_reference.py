#!/usr/bin/env python3
"""Megatron's own view of Megatron arguments: the reference pipette-run is checked against.

Runs in the venv made by scripts/setup-megatron-venv (megatron-core 0.19.2, CPU torch is
enough). For every argument list it

1. parses and validates the arguments with Megatron's own parser and validate_args
   (megatron.training.arguments), at a world size of tp x pp so that every parallel
   argument is judged as Megatron would judge it;
2. builds the tokenizer with Megatron's build_tokenizer, which sets the padded vocabulary
   (use --tokenizer-type NullTokenizer --vocab-size V: it needs no files or network);
3. builds Megatron's real GPTModel (megatron.training.models.gpt.GPTModelBuilder, the
   local layer spec, on the meta device so that no memory is allocated) and counts
   sum(p.numel()) over its parameters;
4. reports Megatron's theoretical_memory_usage parameter figure for comparison (it leaves
   linear biases and learned position embeddings out).

Usage:
    megatron_reference.py ARGS...            one argument list; prints one JSON object
    megatron_reference.py --batch < FILE     FILE is a JSON list of argument lists;
                                             prints a JSON list, one object per list

Each object is either
    {"parameters": N, "padded_vocab_size": V, "theoretical_parameters": T, "derived": {...}}
or, when Megatron rejects the arguments,
    {"error": "the message Megatron gave"}.

Megatron prints a lot while it validates; all of that goes to stderr, stdout carries the JSON.
"""

import contextlib
import copy
import io
import json
import os
import sys
import traceback
import warnings

# Megatron warns at import about missing Transformer Engine / Apex; the local spec needs neither.
warnings.filterwarnings("ignore")

# Options that choose how the model is built on this machine, not what it is: none of them
# changes a parameter shape. The local layer spec and torch norms need no Transformer Engine
# or Apex; persistent layer norm, gradient-accumulation fusion and RoPE fusion are kernels
# that exist only with Apex / Transformer Engine; CPU initialisation without initialising
# keeps every weight on the meta device.
BUILD_ARGS = [
    "--transformer-impl", "local",
    "--use-cpu-initialization",
    "--no-initialization",
    "--init-model-with-meta-device",
    "--no-persist-layer-norm",
    "--no-gradient-accumulation-fusion",
    "--no-rope-fusion",
]

_STARTED = False


def _start():
    """Imports Megatron and starts a one-process gloo group (once)."""
    global _STARTED
    if _STARTED:
        return
    # Megatron asserts this whenever tp > 1 on GPUs before Blackwell; users set it too.
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.training import arguments

    # STUB (the only one): validate_args asks the GPU for its architecture when tp > 1
    # (megatron.core.utils.get_device_arch_version -> torch.cuda.get_device_properties),
    # which fails on a machine without a GPU. Answer 9 (Hopper): the pre-Blackwell path,
    # which makes Megatron check CUDA_DEVICE_MAX_CONNECTIONS=1 as it does on A100/H100.
    # Nothing else in validate_args or the model depends on the answer.
    arguments.get_device_arch_version = lambda: 9

    # STUB (the second): multi-latent attention builds its rotary embedding without
    # passing --use-cpu-initialization on, so the embedding asks torch.cuda for a device
    # (and YaRN's moves its tables to the GPU whatever it is told; `reference` builds MLA
    # with plain RoPE for that reason). Rotary embeddings hold buffers, not parameters:
    # building them on the CPU changes no count.
    import functools
    from megatron.core.transformer import multi_latent_attention as mla

    mla.RotaryEmbedding = functools.partial(mla.RotaryEmbedding, use_cpu_initialization=True)

    # STUB (the third): the local layer spec gives multi-latent attention the local
    # DotProductAttention, which does not take MLA's separate key and value widths (only
    # Transformer Engine's does). Core attention has no parameters in either: the local
    # one is built without those two widths.
    from megatron.core.transformer import dot_product_attention as dpa

    class _LocalCoreAttention(dpa.DotProductAttention):
        def __init__(self, *a, k_channels=None, v_channels=None, **kw):
            super().__init__(*a, **kw)

    from megatron.core.models import backends

    backends.DotProductAttention = _LocalCoreAttention

    # An in-process store: one rank, no ports.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    _STARTED = True


def _derived(args):
    """The values Megatron derived from the arguments (what pipette-run must derive too)."""
    num_query_groups = (
        args.num_query_groups if args.group_query_attention else args.num_attention_heads
    )
    return {
        "num_layers": args.num_layers,
        "hidden_size": args.hidden_size,
        "ffn_hidden_size": args.ffn_hidden_size,
        "num_attention_heads": args.num_attention_heads,
        "num_query_groups": num_query_groups,
        "kv_channels": args.kv_channels,
        "seq_length": args.seq_length,
        "max_position_embeddings": args.max_position_embeddings,
        "position_embedding_type": args.position_embedding_type,
        "normalization": args.normalization,
        "add_bias_linear": args.add_bias_linear,
        "add_qkv_bias": args.add_qkv_bias,
        "swiglu": args.swiglu,
        "untie_embeddings_and_output_weights": args.untie_embeddings_and_output_weights,
        "global_batch_size": args.global_batch_size,
        "micro_batch_size": args.micro_batch_size,
        "recompute_granularity": args.recompute_granularity,
        "recompute_method": args.recompute_method,
        "recompute_num_layers": args.recompute_num_layers,
        "sequence_parallel": args.sequence_parallel,
        "use_distributed_optimizer": args.use_distributed_optimizer,
        "tensor_model_parallel_size": args.tensor_model_parallel_size,
        "pipeline_model_parallel_size": args.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": args.virtual_pipeline_model_parallel_size,
        "bf16": args.bf16,
        "fp16": args.fp16,
    }


def reference(case):
    """Megatron's verdict on one argument list (a dict, see the module doc)."""
    _start()
    import torch
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    from megatron.training import arguments
    from megatron.training.argument_utils import core_transformer_config_from_args
    from megatron.training.argument_utils import gpt_config_from_args
    from megatron.training.models.gpt import GPTModelBuilder
    from megatron.training.theoretical_memory_usage import compute_weight_and_optimizer_memory

    sys.argv = ["pretrain_gpt.py"] + list(case) + BUILD_ARGS
    args = arguments.parse_args()
    # The world a tp x pp run needs at data-parallel size 1 (parse_args read WORLD_SIZE).
    args.world_size = args.tensor_model_parallel_size * args.pipeline_model_parallel_size
    arguments.validate_args(args)
    build_tokenizer(args)  # sets args.padded_vocab_size, padded for the real tp
    derived = _derived(args)
    derived["padded_vocab_size"] = args.padded_vocab_size

    # TransformerConfig's own checks at the real parallel sizes (heads and query groups
    # against tp, recompute options, ...).
    core_transformer_config_from_args(args)

    # Build the whole model in this one process: with tp = pp = 1 every weight is whole, so
    # the count is the model's total over all tp x pp ranks, each parameter counted once.
    # The vocabulary stays padded for the real tp (args.padded_vocab_size).
    whole = copy.copy(args)
    whole.tensor_model_parallel_size = 1
    whole.pipeline_model_parallel_size = 1
    whole.virtual_pipeline_model_parallel_size = None
    whole.sequence_parallel = False
    # Experts whole on this one rank, each counted once.
    whole.expert_model_parallel_size = 1
    whole.expert_tensor_parallel_size = 1
    model_config = gpt_config_from_args(whole)
    if getattr(model_config, "multi_latent_attention", False):
        model_config.rope_type = "rope"  # see the second STUB in _start
    # The alltoall and flex dispatchers set up CUDA buffers when built; dispatchers hold no
    # parameters, so the count is built with the allgather one (validate_args above
    # judged the user's).
    if getattr(model_config, "num_moe_experts", None):
        model_config.moe_token_dispatcher_type = "allgather"
    pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    with torch.device("meta"):
        model = GPTModelBuilder(model_config).build_model(
            pg_collection, pre_process=True, post_process=True
        )
    parameters = sum(p.numel() for p in model.parameters())
    # Active per token: the routed experts past the router's top-k in every MoE layer
    # (decoder and multi-token prediction) are not used by a given token.
    topk = args.moe_router_topk if args.num_experts else 0
    inactive = sum(
        p.numel()
        for name, p in model.named_parameters()
        if ".local_experts." in name
        and int(name.split(".local_experts.")[1].split(".")[0]) >= topk
    )
    if any(p.device.type != "meta" for p in model.parameters()):
        raise RuntimeError("a parameter left the meta device (memory was allocated)")

    # theoretical_memory_usage: with tp = pp = 1 and no distributed optimizer its weight
    # and optimizer memory is 18 bytes times its parameter count.
    theory = copy.copy(whole)
    theory.use_distributed_optimizer = False
    theory.world_size = 1
    theory.data_parallel_size = 1
    theory.expert_tensor_parallel_size = 1
    theory.expert_model_parallel_size = 1
    theoretical = round(compute_weight_and_optimizer_memory(theory) / 18)

    return {
        "parameters": parameters,
        "active_parameters": parameters - inactive,
        "padded_vocab_size": args.padded_vocab_size,
        "theoretical_parameters": theoretical,
        "derived": derived,
    }


def judged(case):
    """reference(), with Megatron's refusal (assertion, argparse exit, ...) as an error."""
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(sys.stderr), contextlib.redirect_stderr(log):
            return reference(case)
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
    if sys.argv[1:] == ["--batch"]:
        cases = json.load(sys.stdin)
        if not isinstance(cases, list) or not all(
            isinstance(c, list) and all(isinstance(a, str) for a in c) for c in cases
        ):
            sys.exit("megatron_reference.py --batch: stdin must be a JSON list of lists of strings")
        out = [judged(case) for case in cases]
    else:
        out = judged(sys.argv[1:])
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
