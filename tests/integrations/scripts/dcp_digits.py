"""torch.distributed.checkpoint on the digits: a DDP model trained a few steps is saved with
dcp.save, loaded into a fresh model with dcp.load (parameters equal), trained on, then saved
with dcp.async_save (torch requires a CPU backend among the group's device types for it) and
loaded again. The backend name is the only change between the two runs.

    python -m collectives.launch --nproc 2 dcp_digits.py --backend collectives --out p.npy
"""

from __future__ import annotations

import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

import digits


def train(model, opt, loader, steps):
    loss_fn = torch.nn.CrossEntropyLoss()
    for i, (x, y) in enumerate(loader):
        if i == steps:
            break
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()


def main() -> None:
    a = digits.args()
    digits.register_backend(a.backend)
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    data = digits.dataset()
    loader = DataLoader(
        data, batch_size=a.batch, sampler=DistributedSampler(data, world, rank, seed=digits.SEED)
    )
    model = DDP(digits.model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, loader, a.steps // 2)

    # One directory for the job: rank 0 makes it, the others learn its name.
    where = [tempfile.mkdtemp(prefix="dcp_digits_") if rank == 0 else None]
    dist.broadcast_object_list(where, src=0)
    first, second = os.path.join(where[0], "first"), os.path.join(where[0], "second")

    dcp.save({"model": model.state_dict()}, checkpoint_id=first)
    fresh = DDP(digits.model())
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=first)
    fresh.load_state_dict(state["model"])
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(p, q), "dcp.load did not restore what dcp.save wrote"

    train(model, opt, loader, a.steps - a.steps // 2)
    future = dcp.async_save({"model": model.state_dict()}, checkpoint_id=second)
    future.result(timeout=120)
    again = DDP(digits.model())
    state = {"model": again.state_dict()}
    dcp.load(state, checkpoint_id=second)
    again.load_state_dict(state["model"])
    for p, q in zip(model.parameters(), again.parameters()):
        assert torch.equal(p, q), "dcp.load did not restore what dcp.async_save wrote"
    dist.barrier()
    print(f"rank {rank}: save, load and async_save over {dist.get_backend()} ok", flush=True)
    if rank == 0:
        digits.save(model.module, a.out)
        shutil.rmtree(where[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
