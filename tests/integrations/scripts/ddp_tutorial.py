"""The PyTorch DDP tutorial's shape (pytorch.org's "Getting Started with Distributed Data
Parallel"), on the digits: init_process_group from the launcher's environment, a
DistributedSampler, DDP, a rank-0 checkpoint that the others load after a barrier, object
collectives; the backend name is the only change between the collectives and the Gloo run.

    python -m collectives.launch --nproc 3 ddp_tutorial.py --backend collectives --out p.npy
"""

from __future__ import annotations

import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

import digits


def main() -> None:
    a = digits.args(lambda p: p.add_argument("--epochs", type=int, default=1))
    digits.register_backend(a.backend)
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    data = digits.dataset()
    sampler = DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=digits.SEED
    )
    loader = DataLoader(data, batch_size=a.batch, sampler=sampler)
    model = DDP(digits.model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()

    # Rank 0 saves a checkpoint; the others wait, then load it (the tutorial's pattern).
    ckpt = os.path.join(tempfile.gettempdir(), f"ddp_tutorial_{os.environ['MASTER_PORT']}.pt")
    if rank == 0:
        torch.save(model.state_dict(), ckpt)
    dist.barrier()
    model.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=True))

    steps, start = 0, time.perf_counter()
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            if steps == a.steps:
                break
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            steps += 1
    elapsed = time.perf_counter() - start
    dist.barrier()
    if rank == 0:
        os.remove(ckpt)

    # Object collectives: every rank's step count and loss, and rank 0's summary back.
    stats = [None] * world
    dist.all_gather_object(stats, {"rank": rank, "steps": steps})
    assert [s["rank"] for s in stats] == list(range(world)), stats
    summary = [{"steps/s": steps / elapsed}] if rank == 0 else [None]
    dist.broadcast_object_list(summary, src=0)
    print(
        f"rank {rank}: {steps} steps, {summary[0]['steps/s']:.1f} steps/s "
        f"({a.backend}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})",
        flush=True,
    )
    if rank == 0:
        digits.save(model.module, a.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
