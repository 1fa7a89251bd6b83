"""Train a small model with DistributedDataParallel over the "collectives" backend.

    python -m collectives.launch --nproc 2 examples/torch_ddp.py
    torchrun --nproc-per-node 2 examples/torch_ddp.py --backend collectives
    torchrun --nproc-per-node 2 examples/torch_ddp.py --backend gloo     # the same run on Gloo

Every rank trains on its own shard of a synthetic regression problem; DDP averages gradients
through the backend after every backward. The last line prints a checksum of the parameters:
it is identical on every rank, and identical to the Gloo run's.
"""

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import collectives.torch  # noqa: F401  (registers the "collectives" backend)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="collectives", help="collectives or gloo")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds; every op's deadline")
    a = p.parse_args()

    # env:// reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (set by torchrun or the launcher).
    dist.init_process_group(a.backend, init_method="env://", timeout=timedelta(seconds=a.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial weights everywhere
    model = torch.nn.Sequential(
        torch.nn.Linear(16, a.hidden), torch.nn.Tanh(), torch.nn.Linear(a.hidden, 1)
    )
    ddp = DDP(model)  # broadcasts rank 0's weights, hooks the grads
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    w_true = torch.linspace(-1, 1, 16)

    t0 = time.perf_counter()
    for step in range(a.steps):
        x = torch.randn(32, 16, generator=data)
        y = (x @ w_true).unsqueeze(1)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()  # all_reduce of gradient buckets happens here
        opt.step()
        if rank == 0 and (step % 5 == 0 or step == a.steps - 1):
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - t0

    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(
        f"rank {rank}/{world} backend {a.backend}: {a.steps / elapsed:.1f} steps/s, "
        f"parameter checksum {checksum:.12f}",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" not in os.environ:
        raise SystemExit("run me under `python -m collectives.launch --nproc 2` or torchrun")
    main()
