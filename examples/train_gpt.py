"""A tiny GPT trained data-parallel with gloo: a stand-in for Megatron's pretrain_gpt.py.

pipette-run's end-to-end tests (and anyone without GPUs) launch it exactly as they would
launch Megatron-LM: with torchrun on every node and Megatron-style arguments, e.g.

    torchrun --nproc-per-node 2 examples/train_gpt.py --num-layers 2 --hidden-size 64 \
        --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 \
        --vocab-size 256 --micro-batch-size 1 --global-batch-size 12 --train-iters 20 \
        --save /tmp/ckpt --load /tmp/ckpt --save-interval 5

What it does like Megatron:

- reads Megatron's model and training arguments (`--num-layers`, `--hidden-size`,
  `--num-attention-heads`, `--seq-length`, `--max-position-embeddings`, `--vocab-size`,
  `--micro-batch-size`, `--global-batch-size`, `--train-iters`, `--lr`, `--seed`,
  `--save`, `--load`, `--save-interval`, `--log-interval`, the parallel sizes) and ignores
  every other argument, so a Megatron command line runs unchanged;
- accumulates gradients over global batch / (micro-batch x data-parallel size)
  micro-batches, so the global batch is the same on any number of ranks;
- prints Megatron's iteration line
  (` [date] iteration        5/      20 | consumed samples: ... | lm loss: ... |`);
- every `--save-interval` iterations (and after the last), rank 0 writes
  `SAVE/iter_0000005/mp_rank_00/model_optim_rng.pt` and then
  `SAVE/latest_checkpointed_iteration.txt`, as Megatron's legacy format does;
- with `--load` it resumes from the checkpoint `latest_checkpointed_iteration.txt` names
  (model, optimizer and the iteration), prints Megatron's "successfully loaded checkpoint"
  line and then `resuming training at iteration N` with N the first iteration it runs.

What it does not do: tensor and pipeline parallelism. `--tensor-model-parallel-size` and
`--pipeline-model-parallel-size` are read and printed, but every rank holds the whole model
and the ranks form one data-parallel group (a CPU toy has nothing to split). The data are
synthetic and deterministic: sample `i` of the run is a fixed function of `--seed` and `i`,
so the loss curve does not depend on how many ranks share the batch.

Toy-only arguments (Megatron has no such options): `--toy-iteration-seconds S` makes each
iteration last at least S seconds (so a test can act mid-run); `--toy-fail-at-iteration N`
makes rank `--toy-fail-rank` (default 0) exit with `--toy-fail-code` (default 3) at the
end of iteration N (after its collectives, so the other ranks notice at the next one).

Megatron's straggler report (`--log-straggler`, `--straggler-minmax-count N`): every
`--log-interval` iterations each rank's compute time (forward and backward) over the interval
is gathered and rank 0 prints the lines Megatron's StragglerDetector prints (megatron/core/
utils.py): `[date] | MnRtt/Rnk: 12.30ms/4 | MxRtt/Rnk: 25.10ms/1 | MnEtpt/Rnk: ...TF/1 |
MxEtpt/Rnk: ...TF/4`, and with 1 < N < world size `^^^^ Bottom N Ranks with lowest  Etpt(TF):
v/r, ...,` and `^^^^ Top    N Ranks with highest Etpt(TF): v/r, ...,`. Megatron prints
`Etpt` (estimated TFLOP/s of the rank: the interval's model FLOPs / world size / its compute
time) with two decimals; a CPU toy's figures are far below 0.01 TF, so they are printed with
six (a reader must take any decimal). Megatron's power, temperature, utilisation and clock
fields need a GPU and are left out.

A stand-in for a throttled GPU: `--toy-micro-batch-seconds S` makes each micro-batch's compute
last at least S seconds (like a GPU kernel's fixed time, steadier than a shared CPU), and while
the file `--toy-slow-file PATH` exists (`{host}` in it replaced by the node's `PIPETTE_HOST`,
so one node can be slowed) each micro-batch's compute time is multiplied by
`--toy-slow-factor` (default 2: half speed) by sleeping the difference.
"""

import argparse
import datetime
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    a = p.add_argument
    a("--num-layers", type=int, default=2)
    a("--hidden-size", type=int, default=64)
    a("--ffn-hidden-size", type=int, default=None)
    a("--num-attention-heads", type=int, default=4)
    a("--seq-length", type=int, default=32)
    a("--max-position-embeddings", type=int, default=None)
    a("--vocab-size", type=int, default=256)
    a("--micro-batch-size", type=int, default=1)
    a("--global-batch-size", type=int, default=None)
    a("--train-iters", type=int, default=20)
    a("--exit-interval", type=int, default=None)
    a("--lr", type=float, default=1e-3)
    a("--seed", type=int, default=1234)
    a("--save", default=None)
    a("--load", default=None)
    a("--save-interval", type=int, default=None)
    a("--log-interval", type=int, default=1)
    a("--tensor-model-parallel-size", type=int, default=1)
    a("--pipeline-model-parallel-size", type=int, default=1)
    a("--toy-iteration-seconds", type=float, default=0.0)
    a("--toy-fail-at-iteration", type=int, default=None)
    a("--toy-fail-rank", type=int, default=0)
    a("--toy-fail-code", type=int, default=3)
    a("--toy-micro-batch-seconds", type=float, default=0.0)
    a("--toy-slow-file", default=None)
    a("--toy-slow-factor", type=float, default=2.0)
    a("--log-straggler", action="store_true")
    a("--straggler-minmax-count", type=int, default=1)
    args, unknown = p.parse_known_args(argv)
    args.ignored = unknown
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = 4 * args.hidden_size
    return args


class Block(nn.Module):
    def __init__(self, h, heads, ffn):
        super().__init__()
        self.ln1 = nn.LayerNorm(h)
        self.attn = nn.MultiheadAttention(h, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(h)
        self.mlp = nn.Sequential(nn.Linear(h, ffn), nn.GELU(), nn.Linear(ffn, h))

    def forward(self, x, mask):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, args):
        super().__init__()
        h = args.hidden_size
        self.tok = nn.Embedding(args.vocab_size, h)
        self.pos = nn.Embedding(args.max_position_embeddings, h)
        self.blocks = nn.ModuleList(
            Block(h, args.num_attention_heads, args.ffn_hidden_size) for _ in range(args.num_layers)
        )
        self.ln = nn.LayerNorm(h)
        self.head = nn.Linear(h, args.vocab_size, bias=False)

    def forward(self, tokens):
        s = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(s))
        mask = torch.triu(torch.full((s, s), float("-inf")), diagonal=1)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def sample(args, index):
    """Sample `index` of the run: a fixed sequence of tokens with a learnable pattern."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + index)
    start = torch.randint(0, args.vocab_size, (1,), generator=g)
    step = torch.randint(1, 7, (1,), generator=g)
    seq = (start + step * torch.arange(args.seq_length + 1)) % args.vocab_size
    return seq


def tracker_path(directory):
    return os.path.join(directory, "latest_checkpointed_iteration.txt")


def checkpoint_path(directory, iteration):
    return os.path.join(directory, f"iter_{iteration:07d}", "mp_rank_00", "model_optim_rng.pt")


def save_checkpoint(args, rank, model, optimizer, iteration):
    dist.barrier()
    if rank == 0:
        path = checkpoint_path(args.save, iteration)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        torch.save(
            {"iteration": iteration, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
            tmp,
        )
        os.replace(tmp, path)
        # The tracker names the checkpoint only once the checkpoint is complete.
        tmp = tracker_path(args.save) + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{iteration}")
        os.replace(tmp, tracker_path(args.save))
        print(f"  successfully saved checkpoint from iteration {iteration:7d} to {args.save}", flush=True)
    dist.barrier()


def load_checkpoint(args, rank, model, optimizer):
    if not args.load or not os.path.exists(tracker_path(args.load)):
        if rank == 0 and args.load:
            print(f"WARNING: could not find the metadata file {tracker_path(args.load)}", flush=True)
            print("    will not load any checkpoints and will start from random", flush=True)
        return 0
    with open(tracker_path(args.load)) as f:
        iteration = int(f.read().strip())
    if rank == 0:
        print(f" loading checkpoint from {args.load} at iteration {iteration}", flush=True)
    state = torch.load(checkpoint_path(args.load, iteration), weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if rank == 0:
        print(
            f"  successfully loaded checkpoint from {args.load} [ t 1/1, p 1/1 ] at iteration {iteration}",
            flush=True,
        )
    return iteration


def slow_file(args):
    """The trigger file of this node, or None."""
    if not args.toy_slow_file:
        return None
    return args.toy_slow_file.replace("{host}", os.environ.get("PIPETTE_HOST", "localhost"))


def straggler_report(args, rank, world, compute_ms, flops):
    """Megatron's StragglerDetector lines for one log interval (see the module doc):
    `compute_ms` this rank's compute time over it, `flops` the model FLOPs of the interval."""
    mine = torch.tensor([compute_ms / args.log_interval], dtype=torch.float64)
    every = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(every, mine)
    if rank != 0:
        return
    ms = [t.item() for t in every]
    tf = [flops / args.log_interval / (max(m, 1e-9) * 1e9 * world) for m in ms]
    lo_ms, hi_ms = min(range(world), key=ms.__getitem__), max(range(world), key=ms.__getitem__)
    order = sorted(range(world), key=tf.__getitem__)
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    print(
        f"[{now}] | MnRtt/Rnk: {ms[lo_ms]:.2f}ms/{lo_ms} | MxRtt/Rnk: {ms[hi_ms]:.2f}ms/{hi_ms} |"
        f" MnEtpt/Rnk: {tf[order[0]]:.6f}TF/{order[0]} | MxEtpt/Rnk: {tf[order[-1]]:.6f}TF/{order[-1]}",
        flush=True,
    )
    n = args.straggler_minmax_count
    if 1 < n < world:
        low = "".join(f" {tf[r]:.6f}/{r}," for r in order[:n])
        high = "".join(f" {tf[r]:.6f}/{r}," for r in order[world - n :])
        print(f"^^^^ Bottom {n} Ranks with lowest  Etpt(TF):{low}", flush=True)
        print(f"^^^^ Top    {n} Ranks with highest Etpt(TF):{high}", flush=True)


def main():
    args = parse_args(sys.argv[1:])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dp = world
    gbs = args.global_batch_size or args.micro_batch_size * dp
    if gbs % (args.micro_batch_size * dp) != 0:
        sys.exit(
            f"global batch size ({gbs}) is not divisible by micro batch size "
            f"({args.micro_batch_size}) times data parallel size ({dp})"
        )
    micro_batches = gbs // (args.micro_batch_size * dp)
    if rank == 0:
        print(
            f"using world size: {world}, data-parallel size: {dp}, "
            f"tensor-model-parallel size: {args.tensor_model_parallel_size} (not split: toy), "
            f"pipeline-model-parallel size: {args.pipeline_model_parallel_size} (not split: toy)",
            flush=True,
        )
        print(
            f"setting number of micro-batches to constant {micro_batches} "
            f"(global batch {gbs}, micro-batch {args.micro_batch_size})",
            flush=True,
        )
        if args.ignored:
            print(f"ignored arguments: {' '.join(args.ignored)}", flush=True)

    torch.manual_seed(args.seed)
    model = TinyGPT(args)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    iteration = load_checkpoint(args, rank, model, optimizer)
    if rank == 0 and iteration > 0:
        print(f"resuming training at iteration {iteration + 1}", flush=True)

    started = time.time()
    n_params = sum(p.numel() for p in model.parameters())
    compute_ms = 0.0
    while iteration < args.train_iters:
        t0 = time.time()
        iteration += 1
        optimizer.zero_grad()
        total = torch.zeros(1)
        first = (iteration - 1) * gbs + rank * micro_batches * args.micro_batch_size
        slow = slow_file(args)
        factor = args.toy_slow_factor if slow and os.path.exists(slow) else 1.0
        for m in range(micro_batches):
            c0 = time.time()
            base = first + m * args.micro_batch_size
            batch = torch.stack([sample(args, base + i) for i in range(args.micro_batch_size)])
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            (loss / micro_batches).backward()
            total += loss.detach() / micro_batches
            spent = max(time.time() - c0, args.toy_micro_batch_seconds) * factor
            rest = spent - (time.time() - c0)
            if rest > 0:
                time.sleep(rest)
            compute_ms += spent * 1000
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dp
        dist.all_reduce(total)
        optimizer.step()
        if args.toy_fail_at_iteration == iteration and rank == args.toy_fail_rank:
            # After the iteration's collectives: the other ranks notice only at the next.
            print(f"rank {rank}: failing at iteration {iteration} as asked", flush=True)
            sys.exit(args.toy_fail_code)
        rest = args.toy_iteration_seconds - (time.time() - t0)
        if rest > 0:
            time.sleep(rest)
        if rank == 0 and iteration % args.log_interval == 0:
            now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
            ms = (time.time() - t0) * 1000
            print(
                f" [{now}] iteration {iteration:8d}/{args.train_iters:8d} |"
                f" consumed samples: {iteration * gbs:12d} |"
                f" elapsed time per iteration (ms): {ms:.1f} |"
                f" learning rate: {args.lr:.6E} | global batch size: {gbs:5d} |"
                f" lm loss: {total.item() / dp:.6E} | loss scale: 1.0 |"
                f" number of skipped iterations:   0 | number of nan iterations:   0 |",
                flush=True,
            )
        if args.log_straggler and iteration % args.log_interval == 0:
            flops = 6.0 * n_params * gbs * args.seq_length * args.log_interval
            straggler_report(args, rank, world, compute_ms, flops)
            compute_ms = 0.0
        if args.save and args.save_interval and iteration % args.save_interval == 0:
            save_checkpoint(args, rank, model, optimizer, iteration)
        if args.exit_interval and iteration % args.exit_interval == 0:
            # Megatron's --exit-interval: stop here (a chunk of a longer run), saved.
            break
    if args.save and not (args.save_interval and iteration % args.save_interval == 0):
        save_checkpoint(args, rank, model, optimizer, iteration)
    if rank == 0:
        print(f"[after training is done] {time.time() - started:.1f} s, iteration {iteration}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
