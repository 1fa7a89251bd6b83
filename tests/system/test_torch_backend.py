"""The "collectives" torch.distributed backend, in real processes, checked against Gloo.

Each test starts 2 worker processes running this very file (`python tests/system/test_torch_backend.py
SCENARIO`) with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set -- the address of a TCPStore
the test hosts on a port it bound (port 0), which the workers join as clients -- or under
torchrun --standalone, or under `python -m collectives.launch`. A worker asserts its invariants
itself and exits 0; the test checks every exit code and the lines the workers print. Every worker has a deadline and is
killed and reaped if it overruns, whatever happens.

Invariant of the comparison scenarios: every call made through the "collectives" default group
gives bitwise the same tensors as the same call made through a Gloo group (dist.new_group(
backend="gloo")) of the same processes, on float32, float64 and int64 inputs. With 2 ranks a
reduction has one operation per element, so even float results must be identical.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import pytest

if __name__ == "__main__":  # a worker, run as a script: support/ is one folder up
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.ports import torch_store  # noqa: E402
from support.procs import clean_env  # noqa: E402
from support.timing import SCALE, bound, scaled  # noqa: E402

torch = pytest.importorskip("torch") if __name__ != "__main__" else None

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
PY = sys.executable


# ============================================================================================
# Test side: start workers, reap them, check what they said.
# ============================================================================================
def _env(**extra):
    # the workers' bounds on the test's time scale (support/timing.py)
    env = clean_env(
        OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore::FutureWarning", TEST_TIME_SCALE=f"{SCALE:g}"
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_ranks(procs, scenario, n=2, timeout=60, second_store=False):
    """Run `scenario` on n ranks whose env:// (and tcp://) rendezvous joins a TCPStore this
    process hosts on a free port (a second one, MASTER_PORT2, for a re-init); returns
    [(returncode, output)]."""
    with torch_store() as store, contextlib.ExitStack() as more:
        extra = dict(store)
        if second_store:
            extra["MASTER_PORT2"] = more.enter_context(torch_store())["MASTER_PORT"]
        for r in range(n):
            procs.spawn(
                f"rank{r}",
                [PY, HERE, scenario],
                _env(RANK=r, WORLD_SIZE=n, LOCAL_RANK=r, TEST_DUMP_AFTER=timeout - 10, **extra),
                merge_stderr=True,
            )
        return [(x.code, x.output) for x in procs.wait([f"rank{r}" for r in range(n)], timeout)]


def run_cmd(procs, cmd, timeout=90):
    procs.spawn("cmd", cmd, _env(), merge_stderr=True)
    (x,) = procs.wait("cmd", timeout)
    return x.code, x.output


def assert_ok(results):
    for r, (rc, out) in enumerate(results):
        assert rc == 0, f"rank {r} exited with {rc}:\n{out[-4000:]}"


# --- tests ------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_every_call_matches_gloo(procs):
    """all_reduce (5 ops), broadcast, reduce, all_gather(_into_tensor), reduce_scatter(_tensor),
    gather, scatter, barrier, send/recv, object collectives, blocking and async, float and int."""
    results = run_ranks(procs, "compare")
    assert_ok(results)
    for rc, out in results:
        assert "COMPARED" in out, out[-2000:]


@pytest.mark.timeout(90)
def test_more_calls_match_gloo_on_three_ranks(procs):
    """3 ranks: all_to_all and all_to_all_single (equal, uneven, one side split), the bitwise
    ops in all_reduce / reduce / reduce_scatter(_tensor) on integer and bool tensors,
    all_gather_coalesced, all_gather_into_tensor / reduce_scatter_tensor and their coalesced
    forms, gather and scatter, each bitwise equal to Gloo's result in the same processes;
    then monitored_barrier (passing, a rank missing, wait_all_ranks) and a timeout whose
    message says " Timed out " and keeps the detail."""
    results = run_ranks(procs, "compare3", n=3, timeout=80)
    assert_ok(results)
    for rc, out in results:
        assert "COMPARED3" in out, out[-2000:]
    out0 = results[0][1]
    assert "MONITORED_OK Rank 2 failed to pass monitoredBarrier" in out0, out0[-3000:]
    assert "MONITORED_ALL_OK Ranks 1, 2 failed to pass monitoredBarrier" in out0, out0[-3000:]
    assert "TIMED_OUT_OK" in out0, out0[-3000:]


@pytest.mark.timeout(120)
def test_fsdp2_matches_gloo(procs):
    """FSDP2 (torch.distributed.fsdp.fully_shard, CPU) trains a small MLP, every layer
    sharded over 3 ranks (parameters not divisible by 3: padded shards), for 4 steps over
    "collectives" and then over Gloo in the same processes, from the same initial weights
    and data: the full parameters end bitwise equal. FSDP's all_gather_into_tensor and
    reduce_scatter_tensor went through this library (counted under it)."""
    results = run_ranks(procs, "fsdp", n=3, timeout=100)
    assert_ok(results)
    for rc, out in results:
        assert "FSDP_EQUAL" in out, out[-2000:]


@pytest.mark.timeout(90)  # above run_ranks' 60 s, so a hang shows the workers' output
def test_tcp_init_reinit_timeout_and_abort(procs):
    """init_method tcp://; subgroups; destroy_process_group and a second init; on that second
    group (timeout 3 s, scaled by the load: it bounds the join too) an op whose peer never
    comes raises CollectiveTimeout after the init_process_group timeout (not torch's 30
    minutes); abort() ends an op in flight at once."""
    results = run_ranks(procs, "lifecycle", second_store=True)
    assert_ok(results)
    assert "TIMEOUT_OK" in results[0][1] and "ABORT_OK" in results[0][1], results[0][1][-3000:]


@pytest.mark.timeout(90)
def test_ddp_matches_gloo_and_survives_a_dead_peer(procs):
    """DDP over collectives (default reducer, allreduce hook, fp16 hook) ends with parameters
    equal to the same runs over Gloo; then rank 1 is SIGKILLed in the middle of a backward and
    rank 0's backward raises a Python error (no segfault, no hang) naming the dead rank, seconds
    after the death and well before the group's 30 s deadline."""
    results = run_ranks(procs, "ddp", timeout=80)
    rc0, out0 = results[0]
    rc1, out1 = results[1]
    assert rc1 == -signal.SIGKILL, f"rank 1 should have been killed:\n{out1[-3000:]}"
    assert rc0 == 0, f"rank 0 crashed or failed (rc {rc0}):\n{out0[-4000:]}"
    assert "DDP_EQUAL" in out0, out0[-3000:]
    assert "SURVIVED RuntimeError" in out0 and "PeerFailure" in out0, out0[-3000:]


@pytest.mark.timeout(60)
def test_under_torchrun(procs):
    # --standalone: torchrun's agent hosts the store on a port it binds (port 0) itself
    rc, out = run_cmd(
        procs,
        [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", HERE, "basic"],
        timeout=55,
    )
    assert rc == 0, out[-4000:]
    assert out.count("BASIC_OK") == 2, out[-3000:]


@pytest.mark.timeout(90)
def test_example_under_collectives_launch(procs):
    rc, out = run_cmd(
        procs,
        [
            PY,
            "-m",
            "collectives.launch",
            "--nproc",
            "2",
            os.path.join(ROOT, "examples", "torch_ddp.py"),
            "--steps",
            "5",
        ],
        timeout=85,
    )
    assert rc == 0, out[-4000:]
    sums = {line.rsplit(" ", 1)[-1] for line in out.splitlines() if "parameter checksum" in line}
    assert len(sums) == 1 and out.count("parameter checksum") == 2, out[-3000:]


def test_import_registers_backend_without_shadowing_torch():
    """`import collectives.torch` registers the backend; inside the package `torch` is still
    PyTorch (the submodule named torch does not shadow it)."""
    import torch.distributed as dist

    import collectives.group.group
    import collectives.group.buffers
    import collectives.torch
    import collectives.torch.backend as tb

    assert "COLLECTIVES" in dist.Backend._plugins
    assert dist.Backend.COLLECTIVES == "collectives"
    assert tb.torch is torch and hasattr(tb.torch, "Tensor")
    assert collectives.group.buffers.is_tensor(torch.zeros(1))
    from collectives.torch.helpers import Reduction, _torch_op

    assert _torch_op(dist.ReduceOp.MAX).name == "MAX"
    assert _torch_op(dist.ReduceOp.BXOR).name == "BXOR"
    with pytest.raises(ValueError, match="does not support reduce op.*PREMUL_SUM"):
        _torch_op(dist.ReduceOp.PREMUL_SUM)
    # PREMUL_SUM needs its factor (dist._make_nccl_premul_sum); integer AVG is NCCL's
    with pytest.raises(ValueError, match="PREMUL_SUM without a factor"):
        Reduction(dist.ReduceOp.PREMUL_SUM, torch.float32, 2, "all_reduce")
    plan = Reduction(dist.ReduceOp.AVG, torch.int64, 3, "all_reduce")
    assert plan.op.name == "SUM" and plan.int_avg
    t = torch.tensor([-7, 7, 8])
    plan.finish(t)
    assert t.tolist() == [-2, 2, 2]  # rounded toward zero, as C's x / n
    u = torch.tensor([7, 8], dtype=torch.uint32)
    plan.finish(u)
    assert u.tolist() == [2, 2]


# ============================================================================================
# Worker side (python tests/system/test_torch_backend.py SCENARIO).
# ============================================================================================
def _worker(scenario):
    import faulthandler
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import collectives.torch  # noqa: F401

    # Every thread's stack on stderr, then exit, before run_ranks' deadline kills us
    # silently: a hang shows where it is.
    faulthandler.dump_traceback_later(float(os.environ.get("TEST_DUMP_AFTER", 70)), exit=True)

    def same(a, b, what):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (
            f"{what}: collectives gave {a}, gloo gave {b}"
        )

    def compare():
        dist.init_process_group("collectives", timeout=timedelta(seconds=20))
        r, n = dist.get_rank(), dist.get_world_size()
        gloo = dist.new_group(backend="gloo")
        assert dist.get_backend() == "collectives"
        for dtype in (torch.float32, torch.float64, torch.int64):

            def x(k=5, seed=0):
                g = torch.Generator().manual_seed(1000 * seed + 10 * r + 1)
                if dtype.is_floating_point:
                    return torch.randn(k, generator=g).to(dtype)
                return torch.randint(-9, 10, (k,), generator=g).to(dtype)

            def both(fn, *inputs, what):
                """fn(group, *copies) on each backend; compare every input afterwards."""
                mine = [t.clone() for t in inputs]
                theirs = [t.clone() for t in inputs]
                fn(None, *mine)
                fn(gloo, *theirs)
                for i, (a, b) in enumerate(zip(mine, theirs)):
                    same(a, b, f"{what} ({dtype}, arg {i})")

            for op in ("SUM", "PRODUCT", "MIN", "MAX"):
                rop = getattr(dist.ReduceOp, op)
                both(lambda g, t: dist.all_reduce(t, op=rop, group=g), x(), what=op)
                both(
                    lambda g, t: dist.all_reduce(t, op=rop, group=g, async_op=True).wait(),
                    x(7, 1),
                    what=f"async {op}",
                )
                for root in range(n):

                    def red(g, t):
                        dist.reduce(t, dst=root, op=rop, group=g)
                        if r != root:  # non-root contents are unspecified (Gloo: scratch)
                            t.zero_()

                    both(red, x(3, 2), what=f"reduce {op} to {root}")
            if dtype.is_floating_point:  # Gloo has no AVG: compare with SUM / n
                a = x(6, 3)
                b = a.clone()
                dist.all_reduce(a, op=dist.ReduceOp.AVG)
                dist.all_reduce(b, group=gloo)
                same(a, b / n, "AVG")
            for root in range(n):
                both(
                    lambda g, t: dist.broadcast(t, src=root, group=g),
                    x(4, 4),
                    what=f"broadcast from {root}",
                )
            both(
                lambda g, *o: dist.all_gather(list(o), x(3, 5), group=g),
                *[torch.zeros(3, dtype=dtype) for _ in range(n)],
                what="all_gather",
            )
            both(
                lambda g, o: dist.all_gather_into_tensor(o, x(3, 6), group=g),
                torch.zeros(3 * n, dtype=dtype),
                what="all_gather_into_tensor",
            )
            both(
                lambda g, o: dist.all_gather_into_tensor(o, x(3, 6), group=g, async_op=True).wait(),
                torch.zeros(3 * n, dtype=dtype),
                what="all_gather_into_tensor async",
            )
            both(
                lambda g, o: dist.reduce_scatter(o, [x(2, 7 + i) for i in range(n)], group=g),
                torch.zeros(2, dtype=dtype),
                what="reduce_scatter",
            )
            both(
                lambda g, o: dist.reduce_scatter_tensor(
                    o, x(2 * n, 8), op=dist.ReduceOp.MAX, group=g
                ),
                torch.zeros(2, dtype=dtype),
                what="reduce_scatter_tensor MAX",
            )
            for root in range(n):

                def gat(g, *o):
                    dist.gather(x(2, 9), list(o) if r == root else None, dst=root, group=g)

                both(
                    gat, *[torch.zeros(2, dtype=dtype) for _ in range(n)], what=f"gather to {root}"
                )

                def sca(g, o):
                    dist.scatter(
                        o,
                        [x(2, 10 + i) for i in range(n)] if r == root else None,
                        src=root,
                        group=g,
                    )

                both(sca, torch.zeros(2, dtype=dtype), what=f"scatter from {root}")
            # send/recv: rank 0 -> 1 then 1 -> 0, blocking and async.
            if r == 0:
                dist.send(x(4, 11), dst=1)
                t = torch.zeros(4, dtype=dtype)
                dist.irecv(t, src=1).wait()
                ref = torch.zeros(4, dtype=dtype)
                dist.recv(ref, src=1, group=gloo)
            else:
                t = torch.zeros(4, dtype=dtype)
                dist.recv(t, src=0)
                ref = torch.zeros(4, dtype=dtype)
                dist.isend(x(4, 12), dst=0).wait()
                dist.send(x(4, 12), dst=0, group=gloo)
            if r == 0:
                same(t, ref, "send/recv")
            else:
                g = torch.Generator().manual_seed(1000 * 11 + 1)
                exp = (
                    torch.randn(4, generator=g).to(dtype)
                    if dtype.is_floating_point
                    else torch.randint(-9, 10, (4,), generator=g).to(dtype)
                )
                same(t, exp, "send/recv")

            # Both ranks post a receive, then send, then wait (fine over Gloo); and a batch.
            def exchange(g, got):
                req = dist.irecv(got, src=1 - r, group=g)
                dist.send(x(4, 13), dst=1 - r, group=g)
                req.wait()

            both(exchange, torch.zeros(4, dtype=dtype), what="irecv, send, wait")

            def batch(g, a, b):
                ops = [
                    dist.P2POp(dist.irecv, a, 1 - r, group=g),
                    dist.P2POp(dist.irecv, b, 1 - r, group=g),
                    dist.P2POp(dist.isend, x(4, 14), 1 - r, group=g),
                    dist.P2POp(dist.isend, x(4, 15), 1 - r, group=g),
                ]
                for req in dist.batch_isend_irecv(ops):
                    req.wait()

            both(
                batch,
                torch.zeros(4, dtype=dtype),
                torch.zeros(4, dtype=dtype),
                what="batch_isend_irecv, receives first",
            )
        # bf16 goes through a float32 staging copy: compare with Gloo (both exact for n=2 SUM).
        a = (torch.arange(8, dtype=torch.float32) / 3 + r).to(torch.bfloat16)
        b = a.clone()
        dist.all_reduce(a)
        dist.all_reduce(b, group=gloo)
        same(a, b, "bfloat16 all_reduce")
        # Object collectives.
        objs, ref = [None] * n, [None] * n
        dist.all_gather_object(objs, {"rank": r, "s": "x" * (r + 1)})
        dist.all_gather_object(ref, {"rank": r, "s": "x" * (r + 1)}, group=gloo)
        assert objs == ref == [{"rank": i, "s": "x" * (i + 1)} for i in range(n)], objs
        lst = [{"from": 0}, 42] if r == 0 else [None, None]
        dist.broadcast_object_list(lst, src=0)
        assert lst == [{"from": 0}, 42], lst
        # Barrier, blocking and async; a future's value is a list (never None, see the module).
        dist.barrier()
        w = dist.barrier(async_op=True)
        w.wait()
        assert w.is_completed() and w.get_future().value() == []
        t = torch.ones(3)
        pg = dist.distributed_c10d._get_default_group()
        pg.allreduce(t).wait()  # a bare tensor, as torch's own groups accept
        assert torch.equal(t, torch.full((3,), float(n))), t
        t = torch.ones(3)
        fut = dist.all_reduce(t, async_op=True).get_future()
        assert torch.equal(fut.wait()[0], torch.full((3,), float(n)))
        # Errors: bad input raises before any byte moves, and the group stays usable.
        try:
            dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)
        except TypeError as exc:
            assert "ReduceOp.BAND is bitwise" in str(exc), exc
        else:
            raise AssertionError("BAND on floats should be refused")
        t = torch.ones(2)
        dist.all_reduce(t)
        same(t, torch.full((2,), float(n)), "after a refused op")
        print("COMPARED", flush=True)
        dist.destroy_process_group()

    def compare3():
        dist.init_process_group("collectives", timeout=timedelta(seconds=20))
        r, n = dist.get_rank(), dist.get_world_size()
        assert n == 3 and dist.get_backend() == "collectives"
        gloo = dist.new_group(backend="gloo")
        assert dist.get_backend(gloo) == "gloo"

        def x(shape, dtype, seed, rank=None):
            """rank's input (default: this rank's), distinct per rank, seed and dtype"""
            g = torch.Generator().manual_seed(1000 * seed + 10 * (r if rank is None else rank) + 1)
            if dtype.is_floating_point:
                return torch.randn(shape, generator=g).to(dtype)
            if dtype == torch.bool:
                return torch.randint(0, 2, shape, generator=g).bool()
            return torch.randint(-99 if dtype.is_signed else 0, 100, shape, generator=g).to(dtype)

        def both(fn, *outs, what):
            mine = [t.clone() for t in outs]
            theirs = [t.clone() for t in outs]
            fn(None, *mine)
            fn(gloo, *theirs)
            for i, (a, b) in enumerate(zip(mine, theirs)):
                same(a, b, f"{what} (arg {i})")

        for dtype in (torch.float32, torch.int64, torch.uint8, torch.bfloat16):
            # all_to_all: equal blocks, then rank r sends rank q (r + 2q) % 4 rows of 3
            both(
                lambda g, *o: dist.all_to_all(
                    list(o), [x((2, 3), dtype, 1 + q) for q in range(n)], group=g
                ),
                *[torch.zeros(2, 3, dtype=dtype) for _ in range(n)],
                what=f"all_to_all {dtype}",
            )
            # (Gloo's list form takes equal sizes only: the uneven one against the inputs)
            got = [torch.zeros((p + 2 * r) % 4, 3, dtype=dtype) for p in range(n)]
            dist.all_to_all(got, [x(((r + 2 * q) % 4, 3), dtype, 2 + q) for q in range(n)])
            for p in range(n):
                same(
                    got[p],
                    x(((p + 2 * r) % 4, 3), dtype, 2 + r, rank=p),
                    f"all_to_all uneven {dtype} from {p}",
                )
            both(
                lambda g, o: dist.all_to_all_single(o, x((3 * n, 2), dtype, 3), group=g),
                torch.zeros(3 * n, 2, dtype=dtype),
                what=f"all_to_all_single {dtype}",
            )
            ins = [(r + q) % 3 for q in range(n)]
            outs = [(p + r) % 3 for p in range(n)]
            both(
                lambda g, o: dist.all_to_all_single(
                    o, x((sum(ins), 4), dtype, 4), outs, ins, group=g
                ),
                torch.zeros(sum(outs), 4, dtype=dtype),
                what=f"all_to_all_single splits {dtype}",
            )
            both(
                lambda g, o: dist.all_to_all_single(o, x((n, 5), dtype, 5), None, [1] * n, group=g),
                torch.zeros(n, 5, dtype=dtype),
                what=f"all_to_all_single input splits only {dtype}",
            )
            both(
                lambda g, o: dist.all_to_all_single(
                    o, x((2 * n,), dtype, 6), group=g, async_op=True
                ).wait(),
                torch.zeros(2 * n, dtype=dtype),
                what=f"all_to_all_single async {dtype}",
            )
        for dtype in (torch.int32, torch.uint8, torch.int64, torch.bool):
            for op in ("BAND", "BOR", "BXOR"):
                rop = getattr(dist.ReduceOp, op)
                both(
                    lambda g, t: dist.all_reduce(t, op=rop, group=g),
                    x((7,), dtype, 7),
                    what=f"all_reduce {op} {dtype}",
                )
                for root in range(n):

                    def red(g, t):
                        dist.reduce(t, dst=root, op=rop, group=g)
                        if r != root:
                            t.zero_()

                    both(red, x((5,), dtype, 8), what=f"reduce {op} {dtype} to {root}")
                both(
                    lambda g, o: dist.reduce_scatter_tensor(
                        o, x((2 * n,), dtype, 9), op=rop, group=g
                    ),
                    torch.zeros(2, dtype=dtype),
                    what=f"reduce_scatter_tensor {op} {dtype}",
                )
                both(
                    lambda g, o: dist.reduce_scatter(
                        o, [x((3,), dtype, 10 + q) for q in range(n)], op=rop, group=g
                    ),
                    torch.zeros(3, dtype=dtype),
                    what=f"reduce_scatter {op} {dtype}",
                )
        for dtype in (torch.float32, torch.int64):
            shapes = [(2, 2), (1,), (3,)]
            both(
                lambda g, *o: dist.all_gather_coalesced(
                    [list(o[k * 3 : (k + 1) * 3]) for k in range(n)],
                    [x(sh, dtype, 20 + i) for i, sh in enumerate(shapes)],
                    group=g,
                ),
                *[torch.zeros(sh, dtype=dtype) for _ in range(n) for sh in shapes],
                what=f"all_gather_coalesced {dtype}",
            )
            both(
                lambda g, o: dist.all_gather_into_tensor(o, x((2, 3), dtype, 21), group=g),
                torch.zeros(2 * n, 3, dtype=dtype),
                what=f"all_gather_into_tensor {dtype}",
            )
            both(
                lambda g, o: dist.reduce_scatter_tensor(o, x((n, 4), dtype, 22), group=g),
                torch.zeros(1, 4, dtype=dtype),
                what=f"reduce_scatter_tensor {dtype}",
            )

            def coalesced_gather(g, *o):
                with dist._coalescing_manager(group=g, async_ops=True) as cm:
                    for i, out in enumerate(o):
                        dist.all_gather_into_tensor(out, x((i + 1,), dtype, 23 + i), group=g)
                cm.wait()

            both(
                coalesced_gather,
                *[torch.zeros(n * (i + 1), dtype=dtype) for i in range(3)],
                what=f"all_gather_into_tensor coalesced {dtype}",
            )

            def coalesced_scatter(g, *o):
                with dist._coalescing_manager(group=g, async_ops=True) as cm:
                    for i, out in enumerate(o):
                        dist.reduce_scatter_tensor(
                            out, x((n * (i + 1),), dtype, 26 + i), op=dist.ReduceOp.MAX, group=g
                        )
                cm.wait()

            both(
                coalesced_scatter,
                *[torch.zeros(i + 1, dtype=dtype) for i in range(3)],
                what=f"reduce_scatter_tensor coalesced {dtype}",
            )
            for root in range(n):

                def gat(g, *o):
                    dist.gather(
                        x((2, 2), dtype, 30), list(o) if r == root else None, dst=root, group=g
                    )

                both(
                    gat,
                    *[torch.zeros(2, 2, dtype=dtype) for _ in range(n)],
                    what=f"gather to {root}",
                )

                def sca(g, o):
                    dist.scatter(
                        o,
                        [x((3,), dtype, 31 + q) for q in range(n)] if r == root else None,
                        src=root,
                        group=g,
                    )

                both(sca, torch.zeros(3, dtype=dtype), what=f"scatter from {root}")
        # monitored_barrier: dist.monitored_barrier accepts Gloo groups only, so the group's
        # own method (as torch's tests call it on a group).
        pg = dist.distributed_c10d._get_default_group()
        pg.monitored_barrier(timedelta(seconds=10))
        if r != 2:
            try:
                pg.monitored_barrier(timedelta(seconds=1))  # rank 2 does not come
            except RuntimeError as exc:
                assert r == 0 or "monitored barrier failed there" in str(exc), exc
                assert r != 0 or "Timed out" in str(exc), exc
                if r == 0:
                    print("MONITORED_OK", str(exc).split(": ", 1)[1], flush=True)
            else:
                raise AssertionError("the monitored barrier passed without rank 2")
        dist.barrier()
        if r == 0:
            try:
                pg.monitored_barrier(timedelta(seconds=1), wait_all_ranks=True)
            except RuntimeError as exc:
                print("MONITORED_ALL_OK", str(exc).split(": ", 1)[1], flush=True)
            else:
                raise AssertionError("the monitored barrier passed alone")
        dist.barrier()
        t = torch.full((3,), float(r))
        dist.all_reduce(t)  # the group works on
        same(t, torch.full((3,), 3.0), "after the monitored barriers")
        # A timeout (rank 2 does not come): the message says " Timed out " and who was waited
        # on; in a fresh group, as a timeout breaks its group.
        short = dist.new_group(timeout=timedelta(seconds=2))
        store = dist.distributed_c10d._get_default_store()
        if r != 2:
            try:
                dist.all_reduce(torch.ones(2), group=short)
            except RuntimeError as exc:
                assert " Timed out " in str(exc) and "rank 2" in str(exc), exc
                assert (
                    "CollectiveTimeout" in type(exc).__name__ or "PeerTimeout" in type(exc).__name__
                ), type(exc)
                if r == 0:
                    print(f"TIMED_OUT_OK {exc}", flush=True)
            else:
                raise AssertionError("no timeout")
        print("COMPARED3", flush=True)
        store.set(f"bye-{r}", b"1")
        if r == 0:  # rank 0 hosts the store: it leaves last
            store.wait([f"bye-{p}" for p in range(n)], timedelta(seconds=30))
        os._exit(0)  # `short` is broken: skip its (bounded, but slow) teardown

    def fsdp():
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("collectives", timeout=timedelta(seconds=30))
        r = dist.get_rank()
        gloo = dist.new_group(backend="gloo")
        ops = []
        dist.group.WORLD.collectives_group.channel_wrappers.append(
            lambda ch: (ops.append(ch.op_name), ch)[1]
        )

        def train(group):
            torch.manual_seed(0)
            model = torch.nn.Sequential(
                torch.nn.Linear(8, 31),
                torch.nn.ReLU(),
                torch.nn.Linear(31, 17),
                torch.nn.ReLU(),
                torch.nn.Linear(17, 4),
            )
            mesh = DeviceMesh.from_group(group, "cpu")
            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            data = torch.Generator().manual_seed(r)
            for _ in range(4):
                loss = model(torch.randn(16, 8, generator=data)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            return [p.full_tensor().detach().clone() for p in model.parameters()]

        mine = train(dist.group.WORLD)
        assert {"all_gather", "reduce_scatter"} <= set(ops), sorted(set(ops))
        theirs = train(gloo)
        assert len(mine) == 6
        for i, (a, b) in enumerate(zip(mine, theirs)):
            same(a, b, f"FSDP parameter {i}")
        print(f"FSDP_EQUAL after {len(ops)} operations", flush=True)
        dist.destroy_process_group()

    def lifecycle():
        r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        url = f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}"
        # the second group's timeout bounds its join too: a loaded host's late rank needs scale
        second = scaled(3)
        for attempt in range(2):  # init, destroy, init again on a new port
            dist.init_process_group(
                "collectives",
                init_method=url,
                rank=r,
                world_size=n,
                timeout=timedelta(seconds=20 if attempt == 0 else second),
            )
            if attempt == 1:
                return timeouts(second)
            t = torch.full((4,), float(r + 1))
            dist.all_reduce(t)
            assert torch.equal(t, torch.full((4,), n * (n + 1) / 2)), t
            sub = dist.new_group(ranks=[1])  # a one-rank group of this backend
            if r == 1:
                t = torch.ones(2)
                dist.all_reduce(t, group=sub)
                assert torch.equal(t, torch.ones(2))
            pair = dist.new_group(ranks=[0, 1], timeout=timedelta(seconds=10))
            t = torch.full((2,), float(r))
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pair)
            assert torch.equal(t, torch.full((2,), float(n - 1)))
            dist.destroy_process_group()
            assert not dist.is_initialized()
            url = f"tcp://127.0.0.1:{int(os.environ['MASTER_PORT2'])}"

    def basic():
        dist.init_process_group("collectives", timeout=timedelta(seconds=20))
        r, n = dist.get_rank(), dist.get_world_size()
        t = torch.full((3,), float(r + 1))
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((3,), n * (n + 1) / 2)), t
        dist.barrier()
        print("BASIC_OK", flush=True)
        dist.destroy_process_group()

    def ddp():
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("collectives", timeout=timedelta(seconds=30))
        r = dist.get_rank()
        gloo = dist.new_group(backend="gloo")

        def train(group, hook=None, steps=4, kill_at=None):
            torch.manual_seed(0)
            model = torch.nn.Sequential(
                torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
            )
            if r == 1:  # DDP must broadcast rank 0's initial weights
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1.0)
            # Small buckets: several all_reduce per backward, in flight together.
            m = DDP(model, process_group=group, bucket_cap_mb=0.001)
            if hook is not None:
                m.register_comm_hook(group, hook)
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            data = torch.Generator().manual_seed(r)
            for step in range(steps):
                loss = m(torch.randn(16, 8, generator=data)).pow(2).mean()
                opt.zero_grad()
                if step == kill_at and r == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                loss.backward()
                opt.step()
            return [p.detach().clone() for p in m.parameters()]

        for name, hook in (
            ("default", None),
            ("allreduce_hook", default_hooks.allreduce_hook),
            ("fp16_compress_hook", default_hooks.fp16_compress_hook),
        ):
            mine, ref = train(None, hook), train(gloo, hook)
            for i, (a, b) in enumerate(zip(mine, ref)):
                same(a, b, f"DDP {name} parameter {i}")
        print("DDP_EQUAL", flush=True)

        # A fresh group of this backend with a 30 s deadline: the death must be noticed from
        # the dropped connection (PeerFailure) in a few seconds, not at the deadline.
        group = dist.new_group(timeout=timedelta(seconds=scaled(30)))
        t0 = time.monotonic()
        try:
            train(group, steps=6, kill_at=2)
        except RuntimeError as exc:
            took = time.monotonic() - t0
            assert took < bound(12, below=30, below_scaled=True), f"took {took:.1f} s"
            assert "PeerFailure" in str(exc) and "rank 1" in str(exc), exc
            print(f"SURVIVED {type(exc).__name__} after {took:.1f} s: {exc}", flush=True)
            os._exit(0)  # the peer is dead: skip the (bounded, but slow) teardown
        raise AssertionError("rank 0 should have seen an error when rank 1 died")

    def timeouts(op_timeout):
        from collectives.common.errors import CollectiveError, CollectiveTimeout

        r = dist.get_rank()
        store = dist.distributed_c10d._get_default_store()
        if r == 0:
            t0 = time.monotonic()
            try:
                dist.all_reduce(torch.ones(4))  # rank 1 never calls it
            except CollectiveTimeout as exc:
                took = time.monotonic() - t0
                assert 0.8 * op_timeout < took < op_timeout + scaled(7), (took, op_timeout)
                assert "timed out" in str(exc) and "rank 1" in str(exc), exc
                print(f"TIMEOUT_OK after {took:.1f} s: {exc}", flush=True)
            else:
                raise AssertionError("no timeout")
            store.set("rank0-timed-out", b"1")
        else:
            store.wait(["rank0-timed-out"], timedelta(seconds=20))
        g = dist.new_group(timeout=timedelta(seconds=60))
        if r == 0:
            w = dist.all_reduce(torch.ones(4), group=g, async_op=True)  # nobody answers
            time.sleep(0.5)  # not a wait: the op left in flight a moment before the abort
            t0 = time.monotonic()
            dist.distributed_c10d._abort_process_group(g)
            try:
                w.wait()
            except CollectiveError as exc:
                took = time.monotonic() - t0
                assert took < bound(10, below=60), took  # at once, not at the deadline
                assert "abort" in str(exc), exc
                print(f"ABORT_OK after {took:.1f} s: {exc}", flush=True)
            else:
                raise AssertionError("abort did not interrupt the op")
            store.set("rank0-done", b"1")
            store.wait(["rank1-bye"], timedelta(seconds=30))  # rank 0 hosts the store
        else:
            store.wait(["rank0-done"], timedelta(seconds=30))
            store.set("rank1-bye", b"1")
        os._exit(0)

    {
        "compare": compare,
        "compare3": compare3,
        "lifecycle": lifecycle,
        "basic": basic,
        "ddp": ddp,
        "fsdp": fsdp,
    }[scenario]()


if __name__ == "__main__":
    _worker(sys.argv[1])
