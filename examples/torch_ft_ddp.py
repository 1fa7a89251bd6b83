"""Fault-tolerant DDP in plain PyTorch: lose a worker, drop the step, shrink, go on.

    python -m collectives.launch --nproc 3 --elastic examples/torch_ft_ddp.py
    python -m collectives.launch --nproc 3 --elastic --spares 1 examples/torch_ft_ddp.py
    torchrun --nproc-per-node 3 examples/torch_ft_ddp.py --backend gloo   # no recovery

DistributedDataParallel over the "collectives" backend, with COLLECTIVES_TORCH_ELASTIC=1 (set
below): the default group joins the job's coordinator, so it can be rebuilt. When a worker
dies or stalls, the survivors' loss.backward() raises (DDP's gradient all_reduce failed).
Then every survivor:
  1. drops the step: its parameters are those of the last step it finished;
  2. calls dist.shrink_group(the failed ranks): the group of the survivors (and of a warm
     spare, when one waits: it is admitted in the dead rank's place, ranked last);
  3. agrees with the others on the steps kept: the fewest any survivor finished (a rank that
     got one step further takes that step back), and rebuilds DDP on the new group, which
     gives every member rank 0's parameters;
  4. goes on with the global batch split among the ranks there are now.
A spare (COLLECTIVES_SPARE=1, started by `--spares`) calls collectives.torch.
join_process_group() instead of init_process_group, and takes part from step 3.

The last line prints a checksum of the parameters: the same on every rank at the end.
"""

import argparse
import copy
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

os.environ.setdefault("COLLECTIVES_TORCH_ELASTIC", "1")  # before the backend reads it
import collectives.torch as ct  # noqa: E402  (registers the "collectives" backend)

BATCH = 48  # the global batch, split among the ranks there are


def make_model(hidden):
    torch.manual_seed(0)  # the same initial weights everywhere
    return torch.nn.Sequential(
        torch.nn.Linear(16, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)
    )


def batch(step):
    """This rank's share of step `step`'s global batch (the same batch whoever is left)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 16, generator=g)
    y = (x @ torch.linspace(-1, 1, 16)).unsqueeze(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    return x[rank::world], y[rank::world]


def recover(model, done, states):
    """Steps 3 (and a joiner's start): agree on the steps kept, take back a step that was not
    kept, rebuild DDP on the current default group. `states[k]`: the parameters after k steps
    (the last two are kept). A joiner passes done=None."""
    mine = torch.tensor([done if done is not None else 2**62], dtype=torch.int64)
    dist.all_reduce(mine, op=dist.ReduceOp.MIN)  # the fewest steps any member finished
    kept = int(mine)
    if done is not None and kept < done:
        model.load_state_dict(states[kept])  # this rank's extra step is not kept
    return DDP(model), kept  # DDP broadcasts rank 0's parameters to every member


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="collectives", help="collectives or gloo")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--timeout", type=float, default=20.0, help="seconds; every op's deadline")
    p.add_argument("--fault", default="", help="tests: kill|stop:RANK:STEP, in the backward")
    a = p.parse_args()

    model = make_model(a.hidden)
    joiner = os.environ.get("COLLECTIVES_JOIN") == "1"
    if joiner:  # a spare: wait to replace a lost rank
        ct.join_process_group(timeout=timedelta(seconds=a.timeout))
        ddp, step = recover(model, None, {})
        print(f"joined as rank {dist.get_rank()} of {dist.get_world_size()} at step {step}")
    else:
        dist.init_process_group(a.backend, timeout=timedelta(seconds=a.timeout))
        ddp, step = DDP(model), 0
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    if not joiner:
        inject(model, a.fault)

    states = {step: copy.deepcopy(model.state_dict())}
    kept_steps = 0
    t0 = time.perf_counter()
    while step < a.steps:
        x, y = batch(step)
        try:
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()  # DDP's gradient all_reduce: raises if a peer died or stalled
            opt.step()
        except RuntimeError as exc:
            if a.backend != "collectives":
                raise
            failed = ct.failed_ranks()  # whom this rank's failure detector reported gone
            print(f"step {step} dropped ({type(exc).__name__}); excluding ranks {failed}")
            ddp = None  # the old DDP's reducer goes (its hooks with it)
            dist.shrink_group(failed)  # the survivors (+ a waiting spare); the new default
            ddp, step = recover(model, step, states)
            states = {step: copy.deepcopy(model.state_dict())}
            print(
                f"going on from step {step} as rank {dist.get_rank()} of {dist.get_world_size()}",
                flush=True,
            )
            continue
        step += 1
        kept_steps += 1
        states[step] = copy.deepcopy(model.state_dict())  # the last two are kept
        states.pop(step - 2, None)
        if dist.get_rank() == 0 and step % 20 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - t0

    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(
        f"rank {dist.get_rank()}/{dist.get_world_size()} backend {a.backend}: "
        f"{kept_steps / elapsed:.1f} steps/s, {step} steps, parameter checksum {checksum:.12f}",
        flush=True,
    )
    dist.destroy_process_group()


def inject(model, fault):
    """For the tests: `kill:2:5` SIGKILLs rank 2 (`stop`: SIGSTOPs it) in the backward of
    step 5, once the first gradient is computed and DDP is reducing."""
    if not fault:
        return
    kind, rank, at = fault.split(":")
    if dist.get_rank() != int(rank):
        return
    calls = [0]
    per_step = sum(1 for _ in model.parameters())

    def hook(grad):
        calls[0] += 1
        if calls[0] == int(at) * per_step + 1:
            os.kill(os.getpid(), signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        return grad

    for param in model.parameters():
        param.register_hook(hook)


if __name__ == "__main__":
    if "RANK" not in os.environ and os.environ.get("COLLECTIVES_JOIN") != "1":
        sys.exit("run me under `python -m collectives.launch --nproc 3 --elastic` or torchrun")
    main()
