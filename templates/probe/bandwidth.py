"""pipette-run's link and compute probe.

torchrun starts this on every node (static rendezvous, node-major ranks). It measures

* the attained point-to-point bandwidth of every pair of ranks inside each node (every
  GPU pair), both directions;
* the attained bandwidth of every pair of nodes, both directions, between the first rank
  of each node (one GPU pair, i.e. one NIC, per node pair) — or, given
  ``--node-pair-strides``, of each node with the nodes that many places after it around
  the ring of nodes: a few pairs per node, enough to show a slow node or NIC on clusters
  where every pair would take n² measurements;
* the rails of one node pair, the first (nodes 0 and 1): local rank i of node 0 with local
  rank i of node 1 for i below ``--rails`` (the node's NICs; 0: as many as both nodes have
  ranks), every pair streaming at the same time, each direction: what a collective spread
  over the NICs attains, beside the one pair (one NIC) measured alone. The first pair
  because its one-NIC figure is always measured (every pair, or stride 1 around the ring),
  so the two compare on the same nodes; one sample, as the fabric's rails are alike;
* the matrix-multiply throughput every rank attains;
* with ``--sweep``, the performance tables of the model being planned: on the first rank
  of every kind of device, GEMMs at the given shapes in the three layouts of a linear
  layer, causal ``scaled_dot_product_attention`` at the given shapes, and the bandwidth of
  a large device copy; then all-reduce and all-gather times over message sizes for groups
  of the first 2, 4, ... ranks and of all of them. Each part stops starting new shapes
  after the time budget (what it skipped is counted); with ``--sweep-only`` as well, the
  sweep alone (the links and matmul figures of these nodes are cached already: their
  lists come back empty);

and rank 0 prints one line, ``PIPETTE-PROBE-RESULT {json}``, on standard output. Progress
goes to standard output as ``PIPETTE-PROBE-PROGRESS {json}`` lines (rank 0 only).

Pairs are measured in rounds of disjoint pairs (a round-robin tournament, the circle
method), every other rank idle, with a barrier between rounds. A pair measures one
direction at a time: after a handshake the sender streams ``iters`` messages and the
receiver answers with a one-element acknowledgement; bandwidth = iters x size / elapsed on
the sender. Each size is measured ``warmup`` times unrecorded, then ``repeats`` times; the
median is reported. The rails phase runs every rail's repeat at once: all ranks meet at a
barrier before each one. NCCL on GPUs, gloo on CPUs (where each process stands in for a GPU).

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

PROTOCOL = 2
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
    p.add_argument("--rails", type=int, default=0,
                   help="rails of the first node pair measured at once (0: as many as both "
                        "nodes have ranks)")
    p.add_argument("--sweep", default="",
                   help="JSON: dtype, gemms [[m, n, k, layout]], attention [[heads, seq, dim]], "
                        "hbm_bytes, collective_sizes, repeats, budget_s")
    p.add_argument("--sweep-only", action="store_true",
                   help="measure the sweep alone, no links and no matmul figures")
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


def rail_pairs(by_node, rails):
    """The rails of the first node pair: (local rank i of the first node, local rank i of
    the second) for i below rails (0: as many as both nodes have ranks); none with fewer
    than two, which the node pair itself measured."""
    nodes = sorted(by_node)
    if len(nodes) < 2:
        return []
    first, second = by_node[nodes[0]], by_node[nodes[1]]
    k = min(len(first), len(second))
    if rails > 0:
        k = min(k, rails)
    if k < 2:
        return []
    return [(first[i]["rank"], second[i]["rank"]) for i in range(k)]


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

    def measure_rails(self, pairs, records):
        """Every rail pair streams at the same time, one direction and size at a time:
        all ranks (the idle ones too) meet at a barrier before each run, so the rails' runs
        overlap; each sender records its own figure, kind "rails"."""
        args = self.args
        tok = torch.zeros(1, dtype=torch.uint8, device=self.device)
        mine = next(((a, b) for a, b in pairs if self.rank in (a, b)), None)
        for forward in (True, False):
            for size in self.sizes:
                iters = max(1, min(args.max_iters, args.bytes_per_repeat // size))
                buf = torch.empty(size, dtype=torch.uint8, device=self.device) if mine else None
                samples = []
                for k in range(args.warmup + args.repeats):
                    dist.barrier()
                    if mine is None:
                        continue
                    src, dst = mine if forward else (mine[1], mine[0])
                    elapsed = self.one_way(src, dst, buf, tok, iters)
                    if elapsed is not None and k >= args.warmup:
                        samples.append(elapsed)
                if samples:
                    median = statistics.median(samples)
                    records.append({"kind": "rails", "src": src, "dst": dst, "size": size,
                                    "iters": iters, "gb_per_s": iters * size / median / 1e9,
                                    "samples_s": samples})
        dist.barrier()

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

    def timed(self, fn, flops_hint, repeats):
        """Median seconds of one call of fn: one warm-up, then repeats timed runs of enough
        calls to take about a millisecond each on a GPU."""
        inner = max(1, min(20, int(2e11 / max(flops_hint, 1.0)))) if self.cuda else 1
        fn()
        self.sync()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            self.sync()
            times.append((time.perf_counter() - start) / inner)
        return statistics.median(times)

    def attempt(self, measure):
        """measure(), or None when the device refused the shape (out of memory, no kernel
        for it): the sweep goes on without it."""
        try:
            return measure()
        except RuntimeError:
            if self.cuda:
                torch.cuda.empty_cache()
            return None

    def sweep_device(self, spec, deadline):
        """GEMMs, attention and a large copy on this rank's device."""
        dtype = DTYPES[spec["dtype"]]
        repeats = int(spec.get("repeats", 3))
        dev = self.device
        out = {"rank": self.rank, "dtype": spec["dtype"], "gemms": [], "attention": [],
               "hbm_gb_per_s": None, "skipped": 0}
        for m, n, k, layout in spec.get("gemms", []):
            if time.perf_counter() > deadline:
                out["skipped"] += 1
                continue
            flops = 2.0 * m * n * k

            def gemm(m=m, n=n, k=k, layout=layout, flops=flops):
                # fwd: x (m x k) times W^T (W: n x k); dgrad: dy (m x k) times W (k x n);
                # wgrad: dy^T (dy: k x m) times x (k x n).
                if layout == "fwd":
                    a = torch.randn(m, k, device=dev, dtype=dtype)
                    b = torch.randn(n, k, device=dev, dtype=dtype).t()
                elif layout == "dgrad":
                    a = torch.randn(m, k, device=dev, dtype=dtype)
                    b = torch.randn(k, n, device=dev, dtype=dtype)
                else:
                    a = torch.randn(k, m, device=dev, dtype=dtype).t()
                    b = torch.randn(k, n, device=dev, dtype=dtype)
                return self.timed(lambda: torch.matmul(a, b), flops, repeats)

            seconds = self.attempt(gemm)
            if seconds is None:
                out["skipped"] += 1
            else:
                out["gemms"].append({"m": m, "n": n, "k": k, "layout": layout,
                                     "tflops": flops / seconds / 1e12})
        sdpa = torch.nn.functional.scaled_dot_product_attention
        for heads, seq, dim in spec.get("attention", []):
            if time.perf_counter() > deadline:
                out["skipped"] += 1
                continue
            flops = 2.0 * heads * seq * seq * dim

            def attention(heads=heads, seq=seq, dim=dim, flops=flops):
                q, k_, v = (torch.randn(1, heads, seq, dim, device=dev, dtype=dtype)
                            for _ in range(3))
                return self.timed(lambda: sdpa(q, k_, v, is_causal=True), flops, repeats)

            seconds = self.attempt(attention)
            if seconds is None:
                out["skipped"] += 1
            else:
                out["attention"].append({"batch_heads": heads, "seq": seq, "head_dim": dim,
                                         "tflops": flops / seconds / 1e12})
        size = int(spec.get("hbm_bytes", 0))
        if size > 0 and time.perf_counter() <= deadline:
            def copy():
                src = torch.empty(size, dtype=torch.uint8, device=dev)
                dst = torch.empty_like(src)
                return self.timed(lambda: dst.copy_(src), 1e12, repeats)

            seconds = self.attempt(copy)
            if seconds is not None:
                out["hbm_gb_per_s"] = 2.0 * size / seconds / 1e9
        return out

    def sweep_collectives(self, spec, deadline):
        """All-reduce and all-gather over the first 2, 4, ... ranks and all of them."""
        sizes = [int(s) for s in spec.get("collective_sizes", [])]
        repeats = int(spec.get("repeats", 3))
        groups = []
        g = 2
        while g < self.world:
            groups.append(g)
            g *= 2
        if self.world >= 2:
            groups.append(self.world)
        records = []
        skipped = 0
        for g in groups:
            # Every rank creates every group (torch requires it); members measure.
            group = dist.new_group(list(range(g))) if g < self.world else None
            for size in sizes:
                # Rank 0 decides for everyone whether time is left, so all stop together.
                go = torch.tensor([1 if time.perf_counter() <= deadline else 0],
                                  dtype=torch.int32, device=self.device)
                dist.broadcast(go, 0)
                if not go.item():
                    skipped += 1
                    continue
                if self.rank < g:
                    buf = torch.ones(max(1, size // 4), dtype=torch.float32, device=self.device)
                    parts = [torch.empty_like(buf) for _ in range(g)]
                    ar = self.timed(lambda: dist.all_reduce(buf, group=group), 1e12, repeats)
                    ag = self.timed(lambda: dist.all_gather(parts, buf, group=group), 1e12, repeats)
                    if self.rank == 0:
                        records.append({"op": "all_reduce", "ranks": g, "bytes": buf.numel() * 4,
                                        "us": ar * 1e6})
                        records.append({"op": "all_gather", "ranks": g, "bytes": buf.numel() * 4,
                                        "us": ag * 1e6})
                dist.barrier()
        return records, skipped

    def sweep(self, ranks):
        spec = json.loads(self.args.sweep)
        deadline = time.perf_counter() + float(spec.get("budget_s", 60))
        # The first rank of every kind of device measures it; the others wait.
        first = {}
        for info in ranks:
            first.setdefault(info["name"], info["rank"])
        mine = None
        if first.get(ranks[self.rank]["name"]) == self.rank:
            mine = self.sweep_device(spec, deadline)
            mine["name"] = ranks[self.rank]["name"]
        dist.barrier()
        self.progress("sweep", 1, 2)
        # The collectives get a budget of their own.
        collectives, skipped = self.sweep_collectives(
            spec, time.perf_counter() + float(spec.get("budget_s", 60)))
        self.progress("sweep", 2, 2)
        return mine, collectives, skipped

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
        rails = rail_pairs(by_node, self.args.rails)
        links = []
        compute = []
        if not self.args.sweep_only:
            if self.rank == 0:
                print(PROGRESS + json.dumps({"phase": "plan", "gpu_pair_rounds": len(intra),
                                             "node_pair_rounds": len(inter)}), flush=True)
            self.run_rounds("gpu_pairs", intra, "intra", links)
            self.run_rounds("node_pairs", inter, "inter", links)
            if rails:
                self.measure_rails(rails, links)
            dist.barrier()
            self.compute(compute)
            dist.barrier()
            self.progress("compute", 1, 1)
        devices, collectives, skipped = None, [], 0
        if self.args.sweep:
            devices, collectives, skipped = self.sweep(ranks)

        gathered = [None] * self.world
        dist.all_gather_object(gathered, {"links": links, "compute": compute, "sweep": devices})
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
                "sweep": [part["sweep"] for part in gathered if part["sweep"]],
                "collectives": collectives,
                "collectives_skipped": skipped,
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
