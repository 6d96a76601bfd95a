"""Gathers what scripts/gpu-check measured into one JSON file and prints a short summary.

Reads the work directory gpu-check filled: fit.json (`pipette calibrate` at micro-batches 1
and 4), check.json (the independent trial at micro-batch 2), after.json (`pipette estimate
--calibration fit.json` at the check's layout), the profile (with its sweep), and the main
job's run directory and logs. Exits 1 when a rank reported no peak, the job left no
torch_dist checkpoint or no Megatron parameter-count line, or the calibrated estimate
misses the independent trial by more than 10 %.
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys

LIMIT_PCT = 10.0


def load(path):
    with open(path) as f:
        return json.load(f)


def run(*command):
    try:
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def gpus():
    """What nvidia-smi says of every GPU, or [] without one."""
    text = run(
        "nvidia-smi",
        "--query-gpu=index,name,memory.total,driver_version,pci.bus_id",
        "--format=csv,noheader,nounits",
    )
    rows = []
    for line in (text or "").splitlines():
        index, name, memory, driver, bus = [f.strip() for f in line.split(",")]
        rows.append(
            {"index": int(index), "name": name, "memory_mib": int(memory), "driver": driver, "pci_bus_id": bus}
        )
    return rows


def versions():
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for package in ("torch", "megatron-core"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    try:
        import torch

        out["torch_cuda_build"] = torch.version.cuda
    except ImportError:
        out["torch_cuda_build"] = None
    return out


def rank_peak(rank):
    """A rank's peak: CUDA's max reserved where CUDA ran, else the process's peak RSS."""
    cuda = rank.get("cuda")
    if cuda:
        return {
            "kind": "cuda_max_reserved",
            "bytes": cuda.get("max_reserved_bytes"),
            "max_allocated_bytes": cuda.get("max_allocated_bytes"),
            "device": cuda.get("device"),
        }
    return {"kind": "peak_rss", "bytes": rank.get("peak_rss_bytes")}


def trial_summary(trial):
    m = trial["measurement"]
    return {
        "config": m.get("config"),
        "iteration_ms": m.get("iteration_ms"),
        "ranks": [dict(rank=r.get("rank"), host=r.get("host"), **rank_peak(r)) for r in m.get("ranks", [])],
        "peak": trial.get("peak"),
    }


def job_summary(work):
    log = ""
    for name in ("job.out", "job.log"):
        path = os.path.join(work, name)
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                log += f.read()
    run_dir = os.path.join(work, "run")
    for root, _, files in os.walk(os.path.join(run_dir, "logs")):
        for name in files:
            with open(os.path.join(root, name), errors="replace") as f:
                log += f.read()
    parameters = sorted(set(re.findall(r"number of parameters on \([^)]*\) model parallel rank \([^)]*\): \d+", log)))
    iterations = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", log)]
    save = os.path.join(work, "save")
    latest = None
    shards = []
    try:
        with open(os.path.join(save, "latest_checkpointed_iteration.txt")) as f:
            latest = int(f.read().strip())
        shards = sorted(
            n for n in os.listdir(os.path.join(save, f"iter_{latest:07d}")) if n.endswith(".distcp")
        )
    except (OSError, ValueError):
        pass
    events = []
    try:
        with open(os.path.join(run_dir, "events.jsonl")) as f:
            events = [json.loads(line) for line in f if line.strip()]
    except OSError:
        pass
    launch = next((e for e in events if e.get("event") == "launch"), {})
    end = next((e for e in events if e.get("event") == "exit"), {})
    return {
        "config": launch.get("config"),
        "exit_code": end.get("code"),
        "megatron_parameter_lines": parameters,
        "iteration_ms": iterations,
        "checkpoint": {"iteration": latest, "format": "torch_dist", "shards": shards},
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("gpu", "cpu"), required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--profile", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--wall-s", type=float, required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("model", nargs=argparse.REMAINDER)
    a = p.parse_args()
    model = [w for w in a.model if w != "--"]

    fit = load(os.path.join(a.work, "fit.json"))
    check = load(os.path.join(a.work, "check.json"))
    after = load(os.path.join(a.work, "after.json"))
    profile = load(a.profile)

    check_trial = check["trials"][0]
    measured = check_trial["peak"]["measured"]
    calibrated = after["memory"]["peak_bytes"]
    after_pct = (calibrated - measured) / measured * 100.0
    commit = run("git", "-C", a.repo, "rev-parse", "HEAD")
    dirty = bool(run("git", "-C", a.repo, "status", "--porcelain", "--untracked-files=no"))

    result = {
        "schema": "pipette-gpu-check/1",
        "provenance": {
            "measured_by": "scripts/gpu-check" + (" --cpu" if a.mode == "cpu" else ""),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": platform.node(),
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "gpus": gpus(),
            "versions": versions(),
            "pipette_commit": commit,
            "pipette_tree_dirty": dirty,
            "model_args": model,
            "wall_s": a.wall_s,
        },
        "profile": profile,
        "trials": [trial_summary(t) for t in fit["trials"]],
        "memory_fit": fit.get("memory_fit"),
        "independent_trial": {
            "trial": trial_summary(check_trial),
            "measured_peak_bytes": measured,
            "error_before_pct": check_trial["peak"].get("error_before_pct"),
            "calibrated_estimate_bytes": calibrated,
            "error_after_pct": after_pct,
        },
        "job": job_summary(a.work),
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")

    problems = []
    for t in result["trials"] + [result["independent_trial"]["trial"]]:
        for r in t["ranks"]:
            if not r.get("bytes"):
                problems.append(f"rank {r.get('rank')} reported no peak in trial {t['config']}")
        if not t["ranks"]:
            problems.append(f"no rank reported in trial {t['config']}")
    job = result["job"]
    if job["exit_code"] != 0:
        problems.append(f"the main job ended with exit code {job['exit_code']}")
    if not job["megatron_parameter_lines"]:
        problems.append("the main job's log holds no Megatron 'number of parameters' line")
    if not job["checkpoint"]["shards"]:
        problems.append("the main job left no torch_dist checkpoint")
    if abs(after_pct) > LIMIT_PCT:
        problems.append(f"the calibrated estimate misses the independent trial by {after_pct:+.1f} %")

    mib = 1 << 20
    gpu_names = sorted({g["name"] for g in result["provenance"]["gpus"]}) or ["cpu"]
    print(f"gpu-check ({a.mode}, {', '.join(gpu_names)}): {a.out}")
    for t in result["trials"]:
        peaks = [r["bytes"] // mib if r.get("bytes") else None for r in t["ranks"]]
        err = (t.get("peak") or {}).get("error_before_pct")
        print(f"  trial micro-batch {t['config'].get('micro_batch')}: peak per rank {peaks} MiB, default estimate {err:+.1f} %")
    print(
        f"  independent trial micro-batch 2: measured {measured / mib:.0f} MiB; default estimate "
        f"{result['independent_trial']['error_before_pct']:+.1f} %, calibrated {after_pct:+.1f} %"
    )
    its = job["iteration_ms"]
    print(
        f"  main job {job['config'] and {k: job['config'].get(k) for k in ('tp', 'pp', 'dp', 'micro_batch')}}: "
        f"exit {job['exit_code']}, {len(its)} iteration lines"
        + (f", last {its[-1]:.1f} ms" if its else "")
        + f", checkpoint at {job['checkpoint']['iteration']} ({len(job['checkpoint']['shards'])} shards)"
    )
    print(f"  wall time {a.wall_s:.0f} s")
    for line in problems:
        print(f"gpu-check: {line}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
