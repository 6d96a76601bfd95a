"""pipette-run's link and compute probe.

torchrun starts this on every node (static rendezvous, node-major ranks). It measures

* the attained point-to-point bandwidth of every pair of ranks inside each node (every
  GPU pair), both directions;
* the attained bandwidth of every pair of nodes, both directions, between the first rank
  of each node (one GPU pair, i.e. one NIC, per node pair) — or, given
  ``--node-pair-strides``, of each node with the nodes that many places after it around
  the ring of nodes: a few pairs per node, enough to show a slow node or NIC on clusters
  where every pair would take n² measurements;
* the matrix-multiply throughput every rank attains;

and rank 0 prints one line, ``PIPETTE-PROBE-RESULT {json}``, on standard output. Progress
goes to standard output as ``PIPETTE-PROBE-PROGRESS {json}`` lines (rank 0 only).

Pairs are measured in rounds of disjoint pairs (a round-robin tournament, the circle
method), every other rank idle, with a barrier between rounds. A pair measures one
direction at a time: after a handshake the sender streams ``iters`` messages and the
receiver answers with a one-element acknowledgement; bandwidth = iters x size / elapsed on
the sender. Each size is measured ``warmup`` times unrecorded, then ``repeats`` times; the
median is reported. NCCL on GPUs, gloo on CPUs (where each process stands in for a GPU).

This file is embedded in pipette-run (src/profile/probe.rs) and written to a temporary
directory on every node; its command line and output are a contract with that code.
"""

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

PROTOCOL = 1
RESULT = "PIPETTE-PROBE-RESULT "
PROGRESS = "PIPETTE-PROBE-PROGRESS "
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["nccl", "gloo"], required=True)
    p.add_argument("--sizes", required=True, help="message sizes in bytes, comma-separated")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--bytes-per-repeat", type=int, default=256 << 20,
                   help="stream about this many bytes per timed repeat")
    p.add_argument("--max-iters", type=int, default=64)
    p.add_argument("--compute-n", type=int, default=4096)
    p.add_argument("--compute-repeats", type=int, default=5)
    p.add_argument("--compute-dtypes", default="auto",
                   help="comma-separated bf16, fp16, fp32, or auto")
    p.add_argument("--threads", type=int, default=0, help="CPU threads per rank (0: torch's default)")
    p.add_argument("--node-pair-strides", default="",
                   help="comma-separated; measure node i with node i + s (mod nodes) for each s "
                        "instead of every node pair")
    p.add_argument("--timeout", type=float, default=600.0)
    return p.parse_args()


def tournament(players):
    """Rounds of disjoint pairs covering every pair once (circle method)."""
    players = list(players)
    if len(players) < 2:
        return []
    if len(players) % 2:
        players.append(None)
    n = len(players)
    rounds = []
    for _ in range(n - 1):
        pairs = []
        for i in range(n // 2):
            a, b = players[i], players[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((a, b))
        rounds.append(pairs)
        players = [players[0], players[-1]] + players[1:-1]
    return rounds


def ring_rounds(players, strides):
    """Rounds of disjoint pairs covering player i with player i + s (around the ring) for
    each stride s: a few pairs per player, each pair once, in a few rounds (each pair goes
    to the first round where both its players are free)."""
    n = len(players)
    rounds, busy, seen = [], [], set()
    for s in strides:
        for i in range(n):
            j = (i + s) % n
            if i == j or (min(i, j), max(i, j)) in seen:
                continue
            seen.add((min(i, j), max(i, j)))
            r = next((r for r, used in enumerate(busy) if i not in used and j not in used),
                     len(busy))
            if r == len(busy):
                busy.append(set())
                rounds.append([])
            busy[r].update((i, j))
            rounds[r].append((players[i], players[j]))
    return rounds


def meminfo_total():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


class Probe:
    def __init__(self, args):
        self.args = args
        self.cuda = args.backend == "nccl"
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.node = int(os.environ["GROUP_RANK"])
        if self.cuda:
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
            if args.threads > 0:
                torch.set_num_threads(args.threads)
        kwargs = {"backend": args.backend, "timeout": datetime.timedelta(seconds=args.timeout)}
        if self.cuda:
            kwargs["device_id"] = self.device
        dist.init_process_group(**kwargs)
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def progress(self, phase, done, total):
        if self.rank == 0:
            print(PROGRESS + json.dumps({"phase": phase, "done": done, "total": total}), flush=True)

    def describe(self):
        info = {"rank": self.rank, "node": self.node, "local_rank": self.local_rank,
                "hostname": socket.gethostname(), "pid": os.getpid()}
        if self.cuda:
            props = torch.cuda.get_device_properties(self.device)
            info.update(device="cuda", name=props.name, memory_bytes=int(props.total_memory),
                        capability=[props.major, props.minor],
                        visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
        else:
            info.update(device="cpu", name="cpu", cpu_model=cpu_model(),
                        host_memory_bytes=meminfo_total(), cpus=os.cpu_count(),
                        threads=torch.get_num_threads())
        return info

    def one_way(self, src, dst, buf, tok, iters):
        """Streams iters messages src -> dst; the elapsed seconds on src, None elsewhere."""
        if self.rank == src:
            dist.send(tok, dst)
            dist.recv(tok, dst)
            self.sync()
            start = time.perf_counter()
            for _ in range(iters):
                dist.send(buf, dst)
            dist.recv(tok, dst)
            self.sync()
            return time.perf_counter() - start
        dist.recv(tok, src)
        dist.send(tok, src)
        for _ in range(iters):
            dist.recv(buf, src)
        self.sync()
        dist.send(tok, src)
        return None

    def measure_pair(self, kind, a, b, records):
        args = self.args
        tok = torch.zeros(1, dtype=torch.uint8, device=self.device)
        for src, dst in ((a, b), (b, a)):
            for size in self.sizes:
                buf = torch.empty(size, dtype=torch.uint8, device=self.device)
                iters = max(1, min(args.max_iters, args.bytes_per_repeat // size))
                samples = []
                for k in range(args.warmup + args.repeats):
                    elapsed = self.one_way(src, dst, buf, tok, iters)
                    if elapsed is not None and k >= args.warmup:
                        samples.append(elapsed)
                if self.rank == src:
                    median = statistics.median(samples)
                    records.append({"kind": kind, "src": src, "dst": dst, "size": size,
                                    "iters": iters, "gb_per_s": iters * size / median / 1e9,
                                    "samples_s": samples})

    def run_rounds(self, phase, rounds, kind, records):
        for r, pairs in enumerate(rounds):
            for a, b in pairs:
                if self.rank in (a, b):
                    self.measure_pair(kind, a, b, records)
            dist.barrier()
            self.progress(phase, r + 1, len(rounds))

    def compute(self, records):
        args = self.args
        names = args.compute_dtypes.split(",")
        if names == ["auto"]:
            if self.cuda:
                major = torch.cuda.get_device_properties(self.device).major
                names = ["bf16"] if major >= 8 else ["fp16"]
            else:
                names = ["fp32", "bf16"]
        n = args.compute_n
        inner = 10 if self.cuda else 1
        for name in names:
            dtype = DTYPES[name]
            a = torch.randn(n, n, device=self.device).to(dtype)
            b = torch.randn(n, n, device=self.device).to(dtype)
            for _ in range(2):
                torch.matmul(a, b)
            self.sync()
            times = []
            for _ in range(args.compute_repeats):
                start = time.perf_counter()
                for _ in range(inner):
                    torch.matmul(a, b)
                self.sync()
                times.append((time.perf_counter() - start) / inner)
            median = statistics.median(times)
            records.append({"rank": self.rank, "dtype": name, "n": n,
                            "tflops": 2.0 * n ** 3 / median / 1e12, "samples_s": times})

    def run(self):
        started = time.perf_counter()
        self.sizes = [int(s) for s in self.args.sizes.split(",") if s]
        ranks = [None] * self.world
        dist.all_gather_object(ranks, self.describe())
        by_node = {}
        for info in ranks:
            by_node.setdefault(info["node"], []).append(info)
        for members in by_node.values():
            members.sort(key=lambda i: i["local_rank"])

        # Inside nodes: every node's tournament round r runs at the same time.
        per_node = [tournament([i["rank"] for i in members]) for members in by_node.values()]
        intra = [sum((rounds[r] for rounds in per_node if r < len(rounds)), [])
                 for r in range(max((len(x) for x in per_node), default=0))]
        # Across nodes: the first rank of each node stands for its node.
        leaders = [by_node[node][0]["rank"] for node in sorted(by_node)]
        strides = [int(s) for s in self.args.node_pair_strides.split(",") if s]
        inter = ring_rounds(leaders, strides) if strides else tournament(leaders)
        if self.rank == 0:
            print(PROGRESS + json.dumps({"phase": "plan", "gpu_pair_rounds": len(intra),
                                         "node_pair_rounds": len(inter)}), flush=True)

        links = []
        self.run_rounds("gpu_pairs", intra, "intra", links)
        self.run_rounds("node_pairs", inter, "inter", links)
        compute = []
        dist.barrier()
        self.compute(compute)
        dist.barrier()
        self.progress("compute", 1, 1)

        gathered = [None] * self.world
        dist.all_gather_object(gathered, {"links": links, "compute": compute})
        if self.rank == 0:
            result = {
                "protocol": PROTOCOL,
                "backend": self.args.backend,
                "torch": torch.__version__,
                "world_size": self.world,
                "sizes": self.sizes,
                "warmup": self.args.warmup,
                "repeats": self.args.repeats,
                "ranks": ranks,
                "links": [rec for part in gathered for rec in part["links"]],
                "compute": [rec for part in gathered for rec in part["compute"]],
                "elapsed_s": time.perf_counter() - started,
            }
            print(RESULT + json.dumps(result), flush=True)
        dist.barrier()
        dist.destroy_process_group()


def main():
    Probe(parse_args()).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
