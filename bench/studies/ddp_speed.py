"""DDP training steps per second: torch.distributed Gloo vs the "collectives" backend.

    python bench/studies/ddp_speed.py                       # 2 local ranks, default MLP
    python bench/studies/ddp_speed.py --nproc 2 --hidden 1024 --layers 4 --steps 30 --rounds 3

Both backends run in the same processes, on the same model, data and bucket sizes: every
worker initialises the default group on "collectives" and a Gloo group with
dist.new_group(backend="gloo"), wraps one copy of the model in DDP over each, and alternates
timed rounds (Gloo, collectives, Gloo, ...) so that background load hits both alike. A round
is `--steps` full steps (forward, backward with DDP's bucketed all_reduce, SGD step) after
`--warmup` untimed ones; the figure is the median round, as steps/s on rank 0. At the end the
two models' parameters are compared: they must be bitwise equal (the backends agree) where
the floats are summed in the same order -- 2 ranks, or COLLECTIVES_GLOO_ORDER=1 (the torch
backend's all_reduce in Gloo's ring order) -- and within float rounding (rtol 1e-4) otherwise:
past 2 ranks the backend's own schedules sum in another order than Gloo's.

Standalone: it starts its own workers (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) unless those
variables are already set (torchrun or `python -m collectives.launch` run it as a worker).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--hidden", type=int, default=1024, help="width of the hidden layers")
    p.add_argument("--layers", type=int, default=3, help="number of hidden layers")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--steps", type=int, default=20, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=120.0)
    return p.parse_args(argv)


def worker(a):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import collectives.torch  # noqa: F401
    from collectives.common import config

    torch.set_num_threads(1)
    dist.init_process_group("collectives", timeout=timedelta(seconds=a.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=a.timeout))

    def model():
        torch.manual_seed(0)
        dims = [256] + [a.hidden] * a.layers + [10]
        mods = []
        for i in range(len(dims) - 1):
            mods += [torch.nn.Linear(dims[i], dims[i + 1]), torch.nn.ReLU()]
        return torch.nn.Sequential(*mods[:-1])

    runs = {}
    for name, group in (("gloo", gloo), ("collectives", None)):
        m = DDP(model(), process_group=group, bucket_cap_mb=a.bucket_mb)
        runs[name] = (
            m,
            torch.optim.SGD(m.parameters(), lr=0.01),
            torch.Generator().manual_seed(rank),
        )
    n_params = sum(p.numel() for p in runs["gloo"][0].parameters())

    def steps(name, k):
        m, opt, gen = runs[name]
        for _ in range(k):
            x = torch.randn(a.batch, 256, generator=gen)
            y = torch.randint(0, 10, (a.batch,), generator=gen)
            loss = torch.nn.functional.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    for name in runs:
        steps(name, a.warmup)
    rates = {name: [] for name in runs}
    for _ in range(a.rounds):
        for name in runs:
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            steps(name, a.steps)
            rates[name].append(a.steps / (time.perf_counter() - t0))

    pairs = list(zip(runs["gloo"][0].parameters(), runs["collectives"][0].parameters()))
    same = all(torch.equal(p, q) for p, q in pairs)
    # the same order of summation: 2 ranks (a + b either way), or Gloo's order asked for
    bitwise = world <= 2 or config.gloo_order()
    close = all(torch.allclose(p, q, rtol=1e-4, atol=1e-6) for p, q in pairs)
    diff = max(float((p - q).detach().abs().max()) for p, q in pairs)
    if rank == 0:
        g, c = (statistics.median(rates[k]) for k in ("gloo", "collectives"))
        print(
            f"DDP, {world} ranks, MLP {a.layers}x{a.hidden} ({n_params / 1e6:.2f} M params, "
            f"{n_params * 4 / 2**20:.1f} MiB of gradients per step), batch {a.batch}, "
            f"bucket {a.bucket_mb:g} MB, median of {a.rounds} rounds x {a.steps} steps"
        )
        print(
            f"  gloo         {g:8.1f} steps/s   (rounds: "
            f"{', '.join(f'{r:.1f}' for r in rates['gloo'])})"
        )
        print(
            f"  collectives  {c:8.1f} steps/s   (rounds: "
            f"{', '.join(f'{r:.1f}' for r in rates['collectives'])})"
        )
        print(f"  collectives / gloo = {c / g:.2f}; parameters bitwise equal: {same}", flush=True)
        if not (bitwise or same):
            print(
                f"  (summed in another order than Gloo's: within rtol 1e-4: {close}, largest "
                f"difference {diff:.2g}; COLLECTIVES_GLOO_ORDER=1 sums in Gloo's order)",
                flush=True,
            )
    dist.destroy_process_group()
    if not (same if bitwise else close):
        raise SystemExit("the two runs ended with different parameters")


def launch(a):
    import torch.distributed as dist

    # The store the workers' env:// rendezvous joins, bound here to any free port and kept
    # for the whole run (TORCHELASTIC_USE_AGENT_STORE: they connect as clients, as under
    # torchrun).
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        a.nproc,
        True,
        wait_for_workers=False,
        timeout=timedelta(seconds=a.timeout + 120),
    )
    procs = []
    for r in range(a.nproc):
        env = dict(
            os.environ,
            RANK=str(r),
            WORLD_SIZE=str(a.nproc),
            LOCAL_RANK=str(r),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(store.port),
            TORCHELASTIC_USE_AGENT_STORE="True",
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen([sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env=env)
        )
    deadline = time.monotonic() + a.timeout + 120
    rc = 0
    try:
        for p in procs:
            rc = rc or p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        rc = 1
        print("ddp_speed: workers overran their deadline; killed", file=sys.stderr)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return rc


if __name__ == "__main__":
    args = parse()
    if "RANK" in os.environ:
        worker(args)
    else:
        sys.exit(launch(args))
