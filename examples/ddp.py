"""A plain PyTorch DDP script, with no Megatron arguments: pipette-run launches it as
torchrun would (planning off). gloo on CPU, a one-layer model wrapped in
DistributedDataParallel, a few steps of SGD whose gradients DDP all-reduces.

    pipette-run --nproc-per-node 2 examples/ddp.py --steps 3
    torchrun    --nproc-per-node 2 examples/ddp.py --steps 3

Every rank prints one line with what torchrun gave it (rank, world size, local rank,
node rank), so a test can compare pipette-run's launch with torchrun's rule. Options
for tests: --fail-rank R raises an exception on rank R after the first step (the
other ranks then wait to be stopped);
--step-seconds S makes each step last S seconds (a long-running job); --tag WORD is
ignored (it marks the job's processes).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def say(line):
    """Prints `line` in one write: the workers of a node share torchrun's stdout, and
    print() writes a line's text and its newline separately when Python runs unbuffered
    (PYTHONUNBUFFERED=1, as under most launchers), so two ranks' lines can interleave into
    one ("... host node-addp: rank 1 ..."). One write of a short line to a pipe is atomic."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_to_be_stopped(rank, error):
    """With --fail-rank, the other ranks wait to be stopped when they lose their peer, as
    NCCL ranks do (they block until a watchdog or the launcher ends them) instead of
    failing at once as gloo's do. Then the failing rank is the only one that ends by itself,
    which a test can count on: torchrun's root cause is the failure with the smallest
    time stamp in whole seconds, the lowest rank among equals, so a peer that failed in
    the same second could take its place."""
    say(f"ddp: rank {rank} lost a peer ({str(error).splitlines()[0][:80]}); waiting to be stopped")
    while True:
        time.sleep(60)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--fail-rank", type=int, default=-1)
    # Unused: a word on the command line by which a test finds the job's processes.
    parser.add_argument("--tag", default="")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    say(
        f"ddp: rank {rank} world {world} local_rank {os.environ['LOCAL_RANK']} "
        f"local_world {os.environ['LOCAL_WORLD_SIZE']} node_rank {os.environ['GROUP_RANK']} "
        f"host {os.environ.get('PIPETTE_HOST', '-')}"
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        x = torch.full((2, 4), float(rank + 1))
        try:
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == args.fail_rank:
                raise RuntimeError(f"rank {rank} fails on purpose after step {step}")
            # Every rank holds the same weights after DDP's all-reduce: their sum says so.
            total = model.module.weight.detach().sum().clone()
            dist.all_reduce(total)
        except RuntimeError as e:
            if args.fail_rank < 0 or rank == args.fail_rank:
                raise
            wait_to_be_stopped(rank, e)
        if rank == 0:
            say(f"ddp: step {step} world {world} loss {loss.item():.4f}")
        time.sleep(args.step_seconds)
    dist.destroy_process_group()
    say(f"ddp: rank {rank} done")


if __name__ == "__main__":
    main()
