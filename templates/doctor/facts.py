# pipette doctor's Python facts (see probe.sh): the interpreter, PyTorch and megatron-core
# as torchrun's python sees them, one JSON line after `facts=`.
import json
import platform
import sys

facts = {"python": platform.python_version(), "executable": sys.executable}
try:
    import torch

    facts["torch"] = torch.__version__
    facts["cuda"] = torch.version.cuda
    facts["cuda_devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
except Exception as e:  # any failure to import is what the user must see
    facts["torch_error"] = (f"{type(e).__name__}: {e}".splitlines() or [""])[0]
try:
    from importlib.metadata import version

    facts["megatron_core"] = version("megatron-core")
except Exception:
    facts["megatron_core"] = None
print("facts=" + json.dumps(facts))
