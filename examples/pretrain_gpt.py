"""pipette-run's Megatron-LM entry point: a GPT trained by megatron-core's own `pretrain()`.

The megatron-core wheel ships the training loop (`megatron.training.pretrain`) but not the
repository's `pretrain_gpt.py`; this is ours. Launch it as Megatron's would be:

    torchrun --nproc-per-node 2 examples/pretrain_gpt.py --transformer-impl local \
        --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 \
        --max-position-embeddings 64 --micro-batch-size 2 --global-batch-size 8 \
        --train-iters 5 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer \
        --vocab-size 1024 --tensor-model-parallel-size 2 --save ckpt --save-interval 3

Every argument is Megatron's, parsed and validated by Megatron (`parse_and_validate_args`).
The model is megatron-core's GPTModel, built on the local layer spec (`--transformer-impl
local`) or Transformer Engine's (`--transformer-impl transformer_engine`, Megatron's default,
where TE is installed); the data are Megatron's mock GPT dataset (`--mock-data`) or the
indexed data sets `--data-path` names. Checkpoints are Megatron's (`--save`, `--load`,
`--ckpt-format`, default `torch_dist`), and so is every log line.

On a node with GPUs it runs as it stands (NCCL, the default). Where `torch.cuda.is_available()`
is False it loads examples/megatron_cpu.py, a CPU runtime layer of ours (never loaded on a GPU
node), and needs `--distributed-backend gloo --transformer-impl local --no-persist-layer-norm
--no-gradient-accumulation-fusion --no-masked-softmax-fusion`; it adds those itself when they
are missing, so one command line serves both kinds of node. On a GPU node it turns off the
fused kernels whose compiled module (Apex's, or Megatron's CUDA extensions, which the wheel
does not ship) is not installed (KERNEL_ARGUMENTS). Sequence and context parallelism need GPU kernels and
cannot run on CPU.

Two gaps of the megatron-core 0.19.2 wheel are closed on every node: it ships the dataset
index helpers prebuilt but not the Makefile its start-up runs `make` on (so the "compile"
step would exit the process; here it only checks that the prebuilt module imports), and the
`torch_dist` writer asks psutil for the process's resident memory, which a venv without
psutil lacks (here it is read from /proc/self/statm, the same figure).

Checked with megatron-core 0.19.2 and torch 2.15.0 (see CHECKED_VERSIONS in megatron_cpu.py);
tests/real_megatron.rs trains it and fails when a new Megatron breaks it.

This file imports nothing heavy at module level: the `torch_dist` writer starts a
multiprocessing manager with the "spawn" method, whose child re-imports `__main__`, and every
module-level Megatron import would cost each rank seconds more.
"""

import os
import sys

# Megatron's CPU requirements, with the value each takes where the command line is silent.
CPU_ARGUMENTS = (
    ("--distributed-backend", "gloo"),
    ("--transformer-impl", "local"),
    ("--no-persist-layer-norm", None),
    ("--no-gradient-accumulation-fusion", None),
    ("--no-masked-softmax-fusion", None),
)

# Megatron's fused kernels on by default, each with the compiled module it imports when it
# runs (Apex's or Megatron's own CUDA extensions, not in the megatron-core wheel) and the
# argument that turns it off. Where the module is missing the argument is added: the run
# then takes PyTorch's own path instead of stopping with "No module named ...".
KERNEL_ARGUMENTS = (
    ("scaled_masked_softmax_cuda", "--no-masked-softmax-fusion"),
    ("fused_weight_gradient_mlp_cuda", "--no-gradient-accumulation-fusion"),
    ("apex", "--no-persist-layer-norm"),
)


def with_defaults(argv, defaults):
    """`argv` with each (name, value) of `defaults` added where it does not say the name."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    added = []
    for name, value in defaults:
        if name not in given:
            added.append(name)
            if value is not None:
                added.append(value)
    return list(argv) + added


def missing_kernels():
    """The arguments of KERNEL_ARGUMENTS whose module does not import here."""
    from importlib.util import find_spec

    return [(arg, None) for module, arg in KERNEL_ARGUMENTS if find_spec(module) is None]


def close_wheel_gaps():
    """The two gaps of the megatron-core wheel described in the module doc."""
    import megatron.core.datasets.utils as dataset_utils
    import megatron.core.dist_checkpointing.strategies.filesystem_async as filesystem_async

    def prebuilt_helpers():
        try:
            from megatron.core.datasets import helpers_cpp  # noqa: F401
        except ImportError as e:
            raise RuntimeError(
                f"megatron-core's prebuilt dataset helpers do not import ({e}): reinstall "
                "megatron-core for this Python (scripts/setup-megatron-venv)"
            ) from e

    dataset_utils.compile_helpers = prebuilt_helpers

    if not getattr(filesystem_async, "HAVE_PSUTIL", True):
        page = os.sysconf("SC_PAGE_SIZE")

        def resident_bytes():
            with open("/proc/self/statm") as statm:
                return int(statm.read().split()[1]) * page

        filesystem_async._process_memory = resident_bytes


def model_provider(pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None):
    """megatron-core's GPTModel for this rank's pipeline stage."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.training import get_args, print_rank_0
    from megatron.training.argument_utils import core_transformer_config_from_args

    args = get_args()
    print_rank_0("building GPT model ...")
    config = core_transformer_config_from_args(args)
    spec_args = dict(
        num_experts=args.num_experts,
        moe_grouped_gemm=args.moe_grouped_gemm,
        qk_layernorm=args.qk_layernorm,
    )
    if args.transformer_impl == "local":
        layer_spec = gpt_layer_specs.get_gpt_layer_local_spec(
            normalization=args.normalization, **spec_args
        )
    else:
        layer_spec = gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(**spec_args)
    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base,
        pg_collection=pg_collection,
        vp_stage=vp_stage,
    )


# The batch's tensors: name, dtype name, whether it has one row per sample of the sequence.
_BATCH = (
    ("tokens", "int64"),
    ("labels", "int64"),
    ("loss_mask", "float32"),
    ("position_ids", "int64"),
)


def get_batch(data_iterator, vp_stage):
    """The micro-batch on this rank: read on tensor-parallel rank 0 of the first and last
    pipeline stages, broadcast to the others of its tensor-parallel group. Middle stages
    take their input from the previous stage and get None."""
    import torch
    from megatron.core import parallel_state
    from megatron.training import get_args
    from megatron.training.utils import is_first_or_last_pipeline_stage

    if not is_first_or_last_pipeline_stage(vp_stage):
        return None, None, None, None, None
    args = get_args()
    device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    shape = (args.micro_batch_size, args.seq_length)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    if tp_rank == 0:
        data = next(data_iterator)
        batch = {name: data[name].to(device) for name, _ in _BATCH}
    else:
        batch = {
            name: torch.empty(shape, dtype=getattr(torch, dtype), device=device)
            for name, dtype in _BATCH
        }
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        for name, _ in _BATCH:
            torch.distributed.broadcast(
                batch[name],
                parallel_state.get_tensor_model_parallel_src_rank(),
                group=parallel_state.get_tensor_model_parallel_group(),
            )
    # The causal mask is built inside attention (the dataset's mask is not needed).
    return batch["tokens"], batch["labels"], batch["loss_mask"], None, batch["position_ids"]


def loss_func(loss_mask, output_tensor):
    """Summed masked loss, its token count, and Megatron's "lm loss" report."""
    import torch

    losses = output_tensor.view(-1).float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    tokens = mask.sum().clone().detach().to(torch.int)
    return loss, tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), tokens.view(1)])}


def forward_step(data_iterator, model):
    from functools import partial

    from megatron.core.utils import get_attr_wrapped_model

    vp_stage = get_attr_wrapped_model(model, "vp_stage")
    tokens, labels, loss_mask, attention_mask, position_ids = get_batch(data_iterator, vp_stage)
    output = model(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask)
    return output, partial(loss_func, loss_mask)


def datasets_provider(train_val_test_num_samples, vp_stage=None):
    """Megatron's GPT data sets: the mock one with --mock-data, else those of --data-path."""
    from functools import partial

    from megatron.core import parallel_state
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
    from megatron.training import get_args, get_tokenizer
    from megatron.training.utils import get_blend_and_blend_per_split, is_first_or_last_pipeline_stage

    args = get_args()
    blend, blend_per_split = get_blend_and_blend_per_split(args)
    config = GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=blend,
        blend_per_split=blend_per_split,
        split=args.split,
        path_to_cache=args.data_cache_path,
        tokenizer=get_tokenizer(),
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=False,
    )

    def built_here(vp_stage=None):
        return (
            is_first_or_last_pipeline_stage(vp_stage)
            and parallel_state.get_tensor_model_parallel_rank() == 0
        )

    kind = MockGPTDataset if args.mock_data else GPTDataset
    return BlendedMegatronDatasetBuilder(
        kind, train_val_test_num_samples, partial(built_here, vp_stage=vp_stage), config
    ).build()


def main():
    import torch

    if torch.cuda.is_available():
        sys.argv[1:] = with_defaults(sys.argv[1:], missing_kernels())
    else:
        sys.argv[1:] = with_defaults(sys.argv[1:], CPU_ARGUMENTS)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import megatron_cpu

        megatron_cpu.install()
    close_wheel_gaps()

    from megatron.core.enums import ModelType
    from megatron.training import pretrain
    from megatron.training.argument_utils import pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    args = parse_and_validate_args(args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
    datasets_provider.is_distributed = True
    pretrain(
        pretrain_cfg_container_from_args(args),
        datasets_provider,
        ModelType.encoder_or_decoder,
        forward_step,
        model_provider=model_provider,
    )


if __name__ == "__main__":
    main()
