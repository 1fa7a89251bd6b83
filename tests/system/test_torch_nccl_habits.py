"""The torch backend where frameworks lean on NCCL's habits, in 3 real processes against Gloo.

Invariants (one run of 3 ranks, COLLECTIVES_GLOO_ORDER=1 on the default group):
  * integer AVG (all_reduce, reduce, reduce_scatter_tensor; int64, int32, uint8, negative
    values) equals Gloo's SUM then division rounding toward zero -- NCCL's FuncSumPostDiv,
    `T(x / n)` in C; AVG on bool is refused before any byte moves, as NCCL refuses it;
  * PREMUL_SUM (dist._make_nccl_premul_sum, a float and a tensor factor) equals Gloo's SUM of
    the scaled inputs (all_reduce bitwise, reduce_scatter within rounding), and leaves
    reduce_scatter's input untouched;
  * the group reports its device types as torch's own groups do: cpu among _device_types,
    _get_pg_default_device() and the object-collective device are cpu, _get_backend(cpu)
    answers with this backend's name and another device type raises;
  * with COLLECTIVES_GLOO_ORDER=1, float32 and float64 all_reduce SUM and AVG at 3 ranks equal
    Gloo's bit for bit, from 1 element to past 1 M; a second group made without the switch
    (same processes) is checked only against Gloo within rounding and reports how many sizes
    differed in the last bits (docs/torch_backend.md says why they may).
"""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.abspath(__file__)


@pytest.mark.timeout(90)
def test_nccl_habits_and_gloo_order_at_three_ranks(procs):
    pytest.importorskip("torch")
    from support.ports import torch_store  # here: the workers run this file as a script
    from support.procs import clean_env

    n = 3
    with torch_store() as store:
        for r in range(n):
            procs.spawn(
                f"rank{r}",
                [sys.executable, HERE],
                clean_env(
                    RANK=r,
                    WORLD_SIZE=n,
                    LOCAL_RANK=r,
                    OMP_NUM_THREADS=1,
                    COLLECTIVES_GLOO_ORDER=1,
                    PYTHONWARNINGS="ignore::FutureWarning,ignore::UserWarning",
                    **store,
                ),
                merge_stderr=True,
            )
        results = procs.wait([f"rank{r}" for r in range(n)], 75)
    for r, res in enumerate(results):
        assert res.code == 0, f"rank {r} exited with {res.code}:\n{res.output[-4000:]}"
        assert "HABITS_OK" in res.output, res.output[-3000:]
    print([line for line in results[0].output.splitlines() if "WITHOUT_SWITCH" in line])


# --- worker side ------------------------------------------------------------------------------
def _worker() -> None:
    import faulthandler
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import collectives.torch  # noqa: F401

    faulthandler.dump_traceback_later(65, exit=True)
    dist.init_process_group("collectives", timeout=timedelta(seconds=30))
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")

    def same(a, b, what):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{what}: collectives {a}, gloo {b}"

    def ints(k, dtype, seed):
        g = torch.Generator().manual_seed(100 * seed + r)
        lo = -1000 if dtype.is_signed else 0
        return torch.randint(lo, 1000 if dtype != torch.uint8 else 80, (k,), generator=g).to(dtype)

    # Integer AVG: sum, then divide rounding toward zero (NCCL), on every rank the same.
    for dtype in (torch.int64, torch.int32, torch.uint8):
        a = ints(11, dtype, 1)
        ref = a.clone()
        dist.all_reduce(a, op=dist.ReduceOp.AVG)
        dist.all_reduce(ref, group=gloo)
        same(a, torch.div(ref, n, rounding_mode="trunc"), f"all_reduce AVG {dtype}")
        for root in range(n):
            a = ints(5, dtype, 2)
            ref = a.clone()
            dist.reduce(a, dst=root, op=dist.ReduceOp.AVG)
            dist.reduce(ref, dst=root, group=gloo)
            if r == root:
                same(a, torch.div(ref, n, rounding_mode="trunc"), f"reduce AVG {dtype}")
        out, ref = torch.zeros(4, dtype=dtype), torch.zeros(4, dtype=dtype)
        inp = ints(4 * n, dtype, 3)
        dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG)
        dist.reduce_scatter_tensor(ref, inp, group=gloo)
        same(out, torch.div(ref, n, rounding_mode="trunc"), f"reduce_scatter AVG {dtype}")
    # A counter as Lightning's sync_dist logs it: one int64 element, AVG.
    c = torch.tensor(8 + r, dtype=torch.int64)
    dist.all_reduce(c, op=dist.ReduceOp.AVG)
    assert c.item() == (8 * n + n * (n - 1) // 2) // n, c
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.bool), op=dist.ReduceOp.AVG)
    except TypeError as exc:
        assert "AVG with boolean" in str(exc), exc
    else:
        raise AssertionError("AVG on bool should be refused")

    # PREMUL_SUM: scale, then sum (Gloo refuses it; compared with Gloo's SUM of the scaled).
    for factor in (0.25, torch.tensor([3.0])):
        op = dist._make_nccl_premul_sum(factor)
        a = torch.randn(7, generator=torch.Generator().manual_seed(r))
        ref = a * (factor if isinstance(factor, float) else factor.item())
        dist.all_reduce(a, op=op)
        dist.all_reduce(ref, group=gloo)
        same(a, ref, f"all_reduce PREMUL_SUM {factor}")
        inp = torch.randn(2 * n, generator=torch.Generator().manual_seed(10 + r))
        kept = inp.clone()
        out, ref = torch.zeros(2), torch.zeros(2)
        dist.reduce_scatter_tensor(out, inp, op=op)
        dist.reduce_scatter_tensor(
            ref, inp * (factor if isinstance(factor, float) else factor.item()), group=gloo
        )
        torch.testing.assert_close(out, ref)  # (Gloo's order is all_reduce's only)
        same(inp, kept, "reduce_scatter's input after PREMUL_SUM")

    # Devices, as torch's own groups report them.
    pg = c10d._get_default_group()
    assert torch.device("cpu") in pg._device_types, pg._device_types
    assert c10d._get_pg_default_device() == torch.device("cpu")
    assert c10d._get_object_coll_device() == "cpu"
    assert c10d._device_capability() == [d.type for d in pg._device_types]
    assert pg._get_backend(torch.device("cpu")).name() == "collectives"
    try:
        pg._get_backend(torch.device("meta"))
    except RuntimeError as exc:
        assert "No backend type associated with device type meta" in str(exc), exc
    else:
        raise AssertionError("meta has no backend")

    # Gloo's order with the switch: bitwise; without it (a second group): within rounding.
    os.environ["COLLECTIVES_GLOO_ORDER"] = "0"
    fast = dist.new_group(backend="collectives")
    differed = 0
    for dtype in (torch.float32, torch.float64):
        for k in (1, 2, 5, 1000, 65537, 1 << 20 | 3):
            x = torch.randn(k, generator=torch.Generator().manual_seed(1000 * r + k)).to(dtype)
            mine, ref, other = x.clone(), x.clone(), x.clone()
            dist.all_reduce(mine)
            dist.all_reduce(ref, group=gloo)
            dist.all_reduce(other, group=fast)
            same(mine, ref, f"all_reduce SUM {dtype} x {k} with COLLECTIVES_GLOO_ORDER=1")
            torch.testing.assert_close(other, ref)
            differed += not torch.equal(other, ref)
            mine = x.clone()
            dist.all_reduce(mine, op=dist.ReduceOp.AVG)
            same(mine, ref / n, f"all_reduce AVG {dtype} x {k} with COLLECTIVES_GLOO_ORDER=1")
    print(f"WITHOUT_SWITCH {differed} of 12 sizes differed from Gloo in the last bits", flush=True)
    print("HABITS_OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker()
