"""A CPU-only runtime layer for megatron-core 0.19.x, loaded by examples/pretrain_gpt.py only
where `torch.cuda.is_available()` is False.

Megatron-LM has no CPU path: `pretrain()` asserts CUDA at start-up and about 90 source lines
on the training path allocate on `device="cuda"`, call `torch.cuda.*` or compare tensor type
names with `torch.cuda.FloatTensor`, none behind a flag. Rather than edit installed files, this
module changes the running process so that those touches land on the CPU:

1. `torch.cuda` functions Megatron calls become CPU equivalents: one "device" numbered 0,
   `set_device`, `synchronize` and `empty_cache` do nothing, streams and events are inert
   objects, memory statistics are 0, the device properties say compute capability 9.0 (the
   tensor-parallel argument check reads them), and the CUDA random generator calls use the
   CPU generator. `torch.cuda.is_available()` stays False, so nothing else (pipette-run's
   trial hook included, which then measures the process's peak RSS) mistakes this for a GPU.
2. A torch function mode, active for the whole process, turns every CUDA device named in a
   tensor factory or `.to()` into the CPU, makes `.cuda()`, `.pin_memory()` and
   `.record_stream()` no-ops, and, for callers inside `megatron.*` only, reports
   `Tensor.type()` as `torch.cuda.*` (the optimizer and gradient clipping check those names).
3. Five of Megatron's own steps are replaced: `initialize_megatron` is called with
   `allow_no_cuda=True` (without it the CUDA assertion stops the run; with a device count of
   1 it still builds the model-parallel groups and seeds the RNG tracker); the JIT warm-up,
   which allocates CUDA tensors to trace fused kernels, is skipped (TorchDynamo is off, so the
   fused functions run eagerly); the tensor-parallel RNG tracker reads and sets the CPU
   generator (CUDA's state setter is queued forever without a device, so `fork()` would not
   switch streams); the MoE alltoall dispatcher's split sizes become numpy arrays as they do
   from a GPU (a CPU tensor stays a tensor, which the all-to-all refuses:
   `all_to_all_single(): incompatible function arguments`); and the "CPU RNG state changed
   within GPU RNG context" warning, which the shared generator raises on every dropout, is
   filtered.

What cannot run on CPU and is refused by Megatron itself: sequence parallelism (torch's
LayerNorm), context parallelism (Transformer Engine's attention), Transformer Engine layers
(use `--transformer-impl local`). The distributed optimizer trains, but loading its
checkpoints without Transformer Engine or Apex hits Megatron bugs this layer does not work
around: keep `--use-distributed-optimizer` off on CPU when a run resumes.

Checked with megatron-core 0.19.2 and torch 2.15.0 (CHECKED_VERSIONS). The names patched here
are private (`_warmup_jit_function`, `_get_cuda_rng_state`, `_set_cuda_rng_state`) or
imported by name (`maybe_move_tensor_to_cpu`), so a new Megatron may move them: `install`
then fails with an error naming what is missing, and the smoke test (tests/real_megatron.rs)
fails loudly.
"""

import contextlib
import functools
import logging
import os
import sys
import types

CHECKED_VERSIONS = ("0.19.2",)

# A CPU-only process answers "how much device memory" with this many bytes; Megatron only
# logs it.
_FAKE_DEVICE_BYTES = 80 << 30


class _InertStream:
    """A CUDA stream or event that has nothing to wait for."""

    def __init__(self, *args, **kwargs):
        self.device = None

    def wait_stream(self, *args, **kwargs):
        return None

    def wait_event(self, *args, **kwargs):
        return None

    def wait(self, *args, **kwargs):
        return None

    def record(self, *args, **kwargs):
        return None

    def record_event(self, *args, **kwargs):
        return _InertStream()

    def synchronize(self):
        return None

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _device_properties(device=None):
    return types.SimpleNamespace(
        name="cpu",
        major=9,
        minor=0,
        total_memory=_FAKE_DEVICE_BYTES,
        multi_processor_count=os.cpu_count() or 1,
        L2_cache_size=0,
    )


def _stub_cuda(torch):
    cuda = torch.cuda
    cpu_generator = torch.random.default_generator

    def no_op(*args, **kwargs):
        return None

    def zero(*args, **kwargs):
        return 0

    stubs = {
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": no_op,
        "synchronize": no_op,
        "empty_cache": no_op,
        "ipc_collect": no_op,
        "Stream": _InertStream,
        "Event": _InertStream,
        "ExternalStream": _InertStream,
        "current_stream": lambda *a, **k: _InertStream(),
        "default_stream": lambda *a, **k: _InertStream(),
        "stream": lambda *a, **k: contextlib.nullcontext(),
        "device": lambda *a, **k: contextlib.nullcontext(),
        "is_current_stream_capturing": lambda: False,
        "get_device_properties": _device_properties,
        "get_device_capability": lambda *a, **k: (9, 0),
        "get_device_name": lambda *a, **k: "cpu",
        "mem_get_info": lambda *a, **k: (_FAKE_DEVICE_BYTES, _FAKE_DEVICE_BYTES),
        "memory_allocated": zero,
        "max_memory_allocated": zero,
        "memory_reserved": zero,
        "max_memory_reserved": zero,
        "reset_peak_memory_stats": no_op,
        "reset_max_memory_allocated": no_op,
        "memory_stats": lambda *a, **k: {},
        "get_rng_state": lambda device="cuda": torch.get_rng_state(),
        "set_rng_state": lambda state, device="cuda": torch.set_rng_state(state),
        "get_rng_state_all": lambda: [torch.get_rng_state()],
        "set_rng_state_all": lambda states: torch.set_rng_state(states[0]),
        "manual_seed": lambda seed: cpu_generator.manual_seed(int(seed)),
        "manual_seed_all": lambda seed: cpu_generator.manual_seed(int(seed)),
        "seed": lambda: cpu_generator.seed(),
        "initial_seed": lambda: cpu_generator.initial_seed(),
    }
    for name, stub in stubs.items():
        setattr(cuda, name, stub)
    cuda.random.get_rng_state = stubs["get_rng_state"]
    cuda.random.set_rng_state = stubs["set_rng_state"]
    cuda.random.manual_seed = stubs["manual_seed"]


def _is_cuda_device(device):
    import torch

    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True  # a bare index means a CUDA device in torch
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return False


def _make_mode(torch):
    from torch.overrides import TorchFunctionMode

    Tensor = torch.Tensor
    cpu = torch.device("cpu")
    to = Tensor.to
    identity = {Tensor.cuda, Tensor.pin_memory}

    class CpuDevices(TorchFunctionMode):
        """Sends every CUDA placement Megatron asks for to the CPU."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if "device" in kwargs and _is_cuda_device(kwargs["device"]):
                kwargs["device"] = cpu
            if func in identity:
                return args[0]
            if func is Tensor.record_stream:
                return None
            if func is to:
                args = tuple(cpu if _is_cuda_device(a) else a for a in args)
            if func is Tensor.type and len(args) == 1 and not kwargs:
                name = func(*args)
                caller = sys._getframe(1).f_globals.get("__name__", "")
                if caller.startswith("megatron.") and name.startswith("torch."):
                    return "torch.cuda." + name[len("torch.") :]
                return name
            return func(*args, **kwargs)

    return CpuDevices()


def _patch_megatron():
    missing = []

    def need(module, name):
        if not hasattr(module, name):
            missing.append(f"{module.__name__}.{name}")
            return False
        return True

    import torch
    import megatron.core.tensor_parallel.random as tp_random
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.moe.token_dispatcher as token_dispatcher
    import megatron.training.initialize as initialize
    import megatron.training.training as training

    if need(training, "initialize_megatron"):
        training.initialize_megatron = functools.partial(
            training.initialize_megatron, allow_no_cuda=True
        )
    if need(initialize, "_warmup_jit_function"):
        initialize._warmup_jit_function = lambda *args, **kwargs: None
    if need(tp_random, "_get_cuda_rng_state") and need(tp_random, "_set_cuda_rng_state"):
        tp_random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
        tp_random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)

    # The alltoall dispatcher asks for its split sizes "on the host, as numpy" and gets them
    # so only from CUDA tensors (moe_utils.maybe_move_tensor_to_cpu converts when
    # `tensor.is_cuda`); a CPU tensor stays a tensor, which all_to_all_single refuses as a
    # list of sizes. The dispatcher imported the function by name, so both names change.
    if need(moe_utils, "maybe_move_tensor_to_cpu") and need(
        token_dispatcher, "maybe_move_tensor_to_cpu"
    ):

        def on_host(tensor, as_numpy=False, record_stream=False):
            if as_numpy and torch.is_tensor(tensor):
                return tensor.detach().numpy().copy()
            return tensor

        moe_utils.maybe_move_tensor_to_cpu = on_host
        token_dispatcher.maybe_move_tensor_to_cpu = on_host

    class _DropSharedGeneratorWarning(logging.Filter):
        def filter(self, record):
            return "CPU RNG state changed within GPU RNG context" not in record.getMessage()

    logging.getLogger(tp_random.__name__).addFilter(_DropSharedGeneratorWarning())
    if missing:
        raise RuntimeError(
            "examples/megatron_cpu.py was checked with megatron-core "
            f"{', '.join(CHECKED_VERSIONS)} and cannot find {', '.join(missing)} in this "
            "Megatron: pin megatron-core to a checked version (scripts/setup-megatron-venv) or "
            "update the CPU layer"
        )


def install():
    """Makes this process run Megatron on the CPU. Call before importing megatron."""
    # The fused kernels are `torch.compile`d at import; eager on CPU (no inductor build).
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    # Megatron's argument check requires it whenever tp > 1; it means nothing on CPU.
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    import torch

    torch._dynamo.config.disable = True
    _stub_cuda(torch)
    mode = _make_mode(torch)
    # Entered for the life of the process; never exited.
    mode.__enter__()
    _patch_megatron()
