#!/usr/bin/env python3
"""Megatron's own theoretical memory figures: the reference src/model/memory.rs is checked against.

Runs in the venv made by scripts/setup-megatron-venv (megatron-core 0.19.2; a CPU is enough),
and reuses scripts/megatron_reference.py's start-up (its one stub and its build options). For
every case it

1. parses and validates the arguments with Megatron's own parse_args and validate_args at
   the case's world size (tp x pp x dp), so Megatron derives the data-parallel size, the
   virtual pipeline size, the recompute settings and so on itself;
2. builds the tokenizer (build_tokenizer), which sets the padded vocabulary;
3. calls megatron.training.theoretical_memory_usage:
   - compute_weight_and_optimizer_memory(args): bytes of weights, gradients and optimizer
     state on the most loaded shard (the first pipeline stage, with the embedding);
   - the same with the distributed optimizer off, divided by 18: the parameters of that
     shard in Megatron's count (no linear biases, no learned position embeddings);
   - compute_activation_memory(args, m): the sequence-parallel + selective-recompute formula;
   - compute_activation_memory_without_sp(args, m): the formula report_theoretical_memory
     uses for everything else (it includes a 1.05 overhead factor);
   and says which of the two report_theoretical_memory would pick.

Usage:
    megatron_memory_reference.py < CASES.json

CASES.json is a JSON list of objects
    {"args": [ARG, ...], "world_size": N, "num_microbatches": M}
("num_microbatches" may be left out: Megatron's global batch / (micro batch x dp) is used).
It prints a JSON list with one object per case, either
    {"weight_and_optimizer_bytes": F, "shard_parameters": F,
     "activation_bytes_sp": F, "activation_bytes_no_sp": F, "report_uses": "sp" | "no_sp",
     "num_microbatches": M, "derived": {...}}
or, when Megatron rejects the arguments, {"error": "the message Megatron gave"}.

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

warnings.filterwarnings("ignore")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_reference  # noqa: E402  (the shared start-up: one stub, the build options)


def reference(case):
    """Megatron's theoretical memory figures for one case (a dict, see the module doc)."""
    megatron_reference._start()
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    from megatron.training import arguments
    from megatron.training.theoretical_memory_usage import (
        compute_activation_memory,
        compute_activation_memory_without_sp,
        compute_weight_and_optimizer_memory,
    )

    sys.argv = ["pretrain_gpt.py"] + list(case["args"]) + megatron_reference.BUILD_ARGS
    args = arguments.parse_args()
    args.world_size = int(case["world_size"])
    arguments.validate_args(args)
    build_tokenizer(args)  # sets args.padded_vocab_size

    derived_microbatches = args.global_batch_size // (
        args.micro_batch_size * args.data_parallel_size
    )
    m = case.get("num_microbatches", derived_microbatches)

    # Each function may change args (compute_weight_and_optimizer_memory sets
    # num_query_groups): give each its own copy.
    weights = compute_weight_and_optimizer_memory(copy.copy(args))
    plain = copy.copy(args)
    plain.use_distributed_optimizer = False
    shard_parameters = compute_weight_and_optimizer_memory(plain) / 18
    with_sp = compute_activation_memory(copy.copy(args), m)
    without_sp = compute_activation_memory_without_sp(copy.copy(args), m)
    # report_theoretical_memory's choice between the two.
    uses_sp = args.sequence_parallel and args.recompute_granularity == "selective"

    return {
        "weight_and_optimizer_bytes": weights,
        "shard_parameters": shard_parameters,
        "activation_bytes_sp": with_sp,
        "activation_bytes_no_sp": without_sp,
        "report_uses": "sp" if uses_sp else "no_sp",
        "num_microbatches": m,
        "derived": {
            "num_microbatches": derived_microbatches,
            "data_parallel_size": args.data_parallel_size,
            "tensor_model_parallel_size": args.tensor_model_parallel_size,
            "pipeline_model_parallel_size": args.pipeline_model_parallel_size,
            "virtual_pipeline_model_parallel_size": args.virtual_pipeline_model_parallel_size,
            "sequence_parallel": args.sequence_parallel,
            "recompute_granularity": args.recompute_granularity,
            "use_distributed_optimizer": args.use_distributed_optimizer,
            "padded_vocab_size": args.padded_vocab_size,
            "micro_batch_size": args.micro_batch_size,
        },
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
            lines = [l for l in log.getvalue().splitlines() if "error:" in l]
            message = lines[-1] if lines else f"exit({error.code})"
        elif not message:
            frame = traceback.extract_tb(error.__traceback__)[-1]
            message = f"{frame.line} ({os.path.basename(frame.filename)}:{frame.lineno})"
        return {"error": f"{type(error).__name__}: {message}" if message else type(error).__name__}
    finally:
        sys.stderr.write(log.getvalue())


def main():
    cases = json.load(sys.stdin)
    if not isinstance(cases, list) or not all(
        isinstance(c, dict)
        and isinstance(c.get("args"), list)
        and all(isinstance(a, str) for a in c["args"])
        and isinstance(c.get("world_size"), int)
        for c in cases
    ):
        sys.exit(
            "megatron_memory_reference.py: stdin must be a JSON list of "
            '{"args": [strings], "world_size": int, "num_microbatches": int (optional)}'
        )
    out = [judged(case) for case in cases]
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
