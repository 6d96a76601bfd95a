"""pipette-run's trial-run hook: records each training rank's peak memory at exit.

pipette-run puts the directory holding this file first on PYTHONPATH for a trial run, so
every Python process of the run imports it at start-up (Python's `site` module imports
`sitecustomize`). It never edits or wraps the user's script. In a torchrun worker (it has
LOCAL_RANK; torchrun itself has not) it registers, at exit (atexit, and on SIGTERM, which
torchrun sends when it stops its workers), one line on standard output:

    PIPETTE-TRIAL-RESULT {"protocol": 1, "rank": 0, "local_rank": 0, "host": "...",
        "pid": 123, "peak_rss_bytes": ..., "cuda": {"device": "NVIDIA H100 ...",
        "max_reserved_bytes": ..., "max_allocated_bytes": ...} | null}

- peak RSS from `resource.getrusage` (the process's high-water mark, kilobytes on Linux);
- CUDA figures only when the script imported torch and initialised CUDA: this hook never
  imports torch itself (it looks in `sys.modules` at exit), so it costs nothing else;
- only the worker itself reports: processes it starts (data-loader workers) inherit a
  marker and stay quiet;
- when the worker dies of an exception its script did not catch, and torchrun gave it an
  error file (`TORCHELASTIC_ERROR_FILE`, which torchrun sets for every worker) that the
  script's own `@record` did not write, it writes the file as torch's `@record` does
  (`{"message": {"message": "Type: text", "extraInfo": {"py_callstack": ..., "timestamp":
  ...}}}`), so torchrun's failure report carries the failing rank's traceback;
- it never raises into the user's script;
- it then imports any other `sitecustomize` later on `sys.path` (Debian ships one), as if
  this one were not there.
"""

import os
import sys

PROTOCOL = 1
MARK = "PIPETTE-TRIAL-RESULT "
_REPORTER = "PIPETTE_TRIAL_REPORTER_PID"
_done = False


def _record():
    """The result line's fields."""
    import resource
    import socket

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    peak_bytes = peak if sys.platform == "darwin" else peak * 1024
    cuda = None
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                cuda = {
                    "device": torch.cuda.get_device_name(),
                    "max_reserved_bytes": int(torch.cuda.max_memory_reserved()),
                    "max_allocated_bytes": int(torch.cuda.max_memory_allocated()),
                }
        except Exception:
            cuda = None
    return {
        "protocol": PROTOCOL,
        "rank": int(os.environ.get("RANK", "-1")),
        "local_rank": int(os.environ.get("LOCAL_RANK", "-1")),
        "host": os.environ.get("PIPETTE_HOST") or socket.gethostname(),
        "pid": os.getpid(),
        "peak_rss_bytes": peak_bytes,
        "cuda": cuda,
    }


def _report():
    global _done
    if _done:
        return
    _done = True
    try:
        import json

        line = MARK + json.dumps(_record(), separators=(",", ":")) + "\n"
        # Straight to the file descriptor: sys.stdout may be replaced, closed or buffered.
        os.write(1, line.encode())
    except Exception:
        pass


def _on_sigterm(signum, frame):
    _report()
    import signal

    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _record_exception(kind, value, tb):
    """Writes the worker's error file as torch.distributed.elastic's @record would."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path) or kind is None or issubclass(kind, SystemExit):
        return
    import json
    import time
    import traceback

    data = {
        "message": {
            "message": f"{kind.__name__}: {value}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(kind, value, tb)),
                "timestamp": str(int(time.time())),
            },
        }
    }
    with open(path, "w") as fp:
        json.dump(data, fp)


def _excepthook(kind, value, tb, _previous=sys.excepthook):
    try:
        _record_exception(kind, value, tb)
    except Exception:
        pass
    _previous(kind, value, tb)


def _install():
    if "LOCAL_RANK" not in os.environ:
        return  # torchrun itself, or a Python the run starts outside torchrun
    if os.environ.get(_REPORTER) not in (None, str(os.getpid())):
        return  # a child of a worker
    os.environ[_REPORTER] = str(os.getpid())
    import atexit
    import signal

    atexit.register(_report)
    sys.excepthook = _excepthook
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_sigterm)


def _chain():
    """Imports the next `sitecustomize` on sys.path, as if this one were not there."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved_path = list(sys.path)
    this = sys.modules.get(__name__)
    try:
        import importlib

        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        sys.modules.pop(__name__, None)
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    except Exception:
        pass
    finally:
        sys.path[:] = saved_path
        if this is not None:
            sys.modules[__name__] = this


try:
    _install()
except Exception:
    pass
_chain()
