"""CUDA tensors through the "collectives" backend, staged through host memory
(group/buffers.py), where torch sees a GPU; without one every test here skips ("no CUDA
device").

Invariants (2 ranks sharing GPU 0, which NCCL refuses: two ranks on one device):
  * all_reduce (SUM, AVG, integer AVG), broadcast, all_gather_into_tensor and
    reduce_scatter_tensor on CUDA tensors give the same values as the same calls on CPU
    copies, and the results stay on the GPU;
  * DDP with device_ids=[0] on both ranks trains 5 steps and both ranks end with the same
    parameters, equal within 1e-6 to the same run on CPU over Gloo.
"""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
HERE = os.path.abspath(__file__)


@pytest.mark.timeout(120)
def test_cuda_tensors_and_ddp_on_one_shared_gpu(procs):
    from support.ports import torch_store
    from support.procs import clean_env

    with torch_store() as store:
        for r in range(2):
            procs.spawn(
                f"rank{r}",
                [sys.executable, HERE],
                clean_env(RANK=r, WORLD_SIZE=2, LOCAL_RANK=r, OMP_NUM_THREADS=1, **store),
                merge_stderr=True,
            )
        results = procs.wait(["rank0", "rank1"], 110)
    for r, res in enumerate(results):
        assert res.code == 0, f"rank {r} exited with {res.code}:\n{res.output[-4000:]}"
        assert "CUDA_OK" in res.output, res.output[-3000:]


def _worker() -> None:
    from datetime import timedelta

    import torch.distributed as dist

    import collectives.torch  # noqa: F401

    dist.init_process_group("collectives", timeout=timedelta(seconds=60))
    r = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    dev = torch.device("cuda", 0)
    assert torch.device("cuda") in dist.distributed_c10d._get_default_group()._device_types

    def check(fn, *tensors):
        gpu = [t.to(dev) for t in tensors]
        cpu = [t.clone() for t in tensors]
        fn(None, *gpu)
        fn(gloo, *cpu)
        for g, c in zip(gpu, cpu):
            assert g.device == dev and torch.equal(g.cpu(), c), (g, c)

    x = torch.arange(6, dtype=torch.float32) + r
    check(lambda g, t: dist.all_reduce(t, group=g), x)
    check(lambda g, t: dist.broadcast(t, src=1, group=g), x)
    check(
        lambda g, o: dist.all_gather_into_tensor(o, (x + 1).to(o.device), group=g), torch.zeros(12)
    )
    check(lambda g, o: dist.reduce_scatter_tensor(o, (x * 2).to(o.device), group=g), torch.zeros(3))
    a = torch.tensor([7 + r, -8], device=dev)
    dist.all_reduce(a, op=dist.ReduceOp.AVG)  # NCCL's integer AVG: 15 // 2, -8
    assert a.tolist() == [7, -8], a

    def train(model):
        torch.manual_seed(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(5):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(10 * step + r))
            opt.zero_grad()
            model(x.to(next(model.parameters()).device)).square().mean().backward()
            opt.step()
        return torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])

    def net():
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    from torch.nn.parallel import DistributedDataParallel as DDP

    mine = train(DDP(net().to(dev), device_ids=[0]))
    ref = train(DDP(net(), process_group=gloo))
    assert (mine - ref).abs().max() <= 1e-6, (mine - ref).abs().max()
    both = [torch.zeros_like(mine) for _ in range(2)]
    dist.all_gather(both, mine, group=gloo)
    assert torch.equal(both[0], both[1])
    print("CUDA_OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker()
