"""dist.shrink_group over the "collectives" backend, in real processes.

Each test starts n workers running this very file (`python tests/system/test_torch_shrink.py
SCENARIO`) with COLLECTIVES_TORCH_ELASTIC=1: their default group joins a coordinator the test
starts (COLLECTIVES_COORDINATOR) and torch's rendezvous joins a TCPStore the test hosts; one
test sets nothing, and rank 0 hosts the coordinator (the default). The
last rank is the victim: killed (SIGKILL), stopped (SIGSTOP), or alive but excluded. A worker
asserts its invariants itself and prints "ok ..."; the test checks every exit code and line.
Every worker has a deadline and is killed and reaped whatever happens (a stopped one too).

Invariant: after dist.shrink_group the survivors hold a group of n - 1 ranks, ranked as torch
numbers them (former ranks in order), and an all_reduce over it of (rank + 1) gives
(n - 1) n / 2 on every survivor; the default group is the new one.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import sys
import time
from datetime import timedelta

import pytest

if __name__ == "__main__":  # a worker, run as a script: support/ is one folder up
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import timing  # noqa: E402
from support.ports import coordinator_process, torch_store  # noqa: E402
from support.procs import clean_env  # noqa: E402

if __name__ != "__main__":
    pytest.importorskip("torch")

HERE = os.path.abspath(__file__)
# Where a rank is alive but excluded (or stalls an op), a shorter group timeout: the tests
# that wait for a deadline somewhere wait less.
LIVE_TIMEOUT = 5.0
PY = sys.executable


# ============================================================================================
# Test side
# ============================================================================================
def run_job(
    procs,
    scenario,
    n,
    timeout=90,
    op_timeout=8.0,
    joiner=False,
    elastic=True,
    hosted=True,
    hold_next_port=False,
):
    """Run `scenario` on n elastic ranks (and a joiner, last); returns [(returncode, output)]
    of the survivors and the victim (the last rank), which a SIGSTOP scenario leaves stopped
    until the end. elastic None: COLLECTIVES_TORCH_ELASTIC unset (its default). hosted False:
    no coordinator started by the test and no job secret, as a plain torchrun-style job has
    (rank 0 hosts the coordinator at MASTER_PORT + 1). hold_next_port: MASTER_PORT + 1 is
    taken while the job runs (held here, or by whoever holds it already)."""
    secret = {"COLLECTIVES_JOB_SECRET": secrets.token_hex(16)} if hosted else {}
    members = n - 1 if joiner else n
    where = {}
    if hosted:
        where["COLLECTIVES_COORDINATOR"] = coordinator_process(
            procs, "coordinator", members, env=clean_env(**secret, **timing.heartbeats())
        )
    if elastic is not None:
        where["COLLECTIVES_TORCH_ELASTIC"] = "1" if elastic else "0"
    with torch_store() as store, contextlib.ExitStack() as held:
        if hold_next_port:
            held.enter_context(_listen_or_taken(int(store["MASTER_PORT"]) + 1))
        for r in range(n):
            env = clean_env(
                **secret,
                OMP_NUM_THREADS="1",
                PYTHONWARNINGS="ignore",
                RANK=str(r),
                WORLD_SIZE=str(members),
                **where,
                TEST_OP_TIMEOUT=f"{timing.scaled(op_timeout):g}",
                **store,
                **timing.heartbeats(),
            )
            if joiner and r == n - 1:
                del env["RANK"], env["WORLD_SIZE"]
                env["COLLECTIVES_JOIN"] = "1"
            procs.spawn(f"rank{r}", [PY, HERE, scenario], env, merge_stderr=True)
        names = [f"rank{r}" for r in range(n - 1)]
        results = [(x.code, x.output) for x in procs.wait(names, timeout)]
        if scenario == "stop":  # the stopped victim is still there: end it
            os.kill(procs.procs[f"rank{n - 1}"].pid, signal.SIGKILL)
        (victim,) = procs.wait([f"rank{n - 1}"], timeout)
        return results, (victim.code, victim.output)


@contextlib.contextmanager
def _listen_or_taken(port):
    """Keep `port` taken: listen on it, unless someone else holds it already."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:  # taken already: as good
            pass
        yield


def assert_ok(results, word):
    for r, (rc, out) in enumerate(results):
        assert rc == 0, f"rank {r} exited with {rc}:\n{out[-4000:]}"
        assert f"ok {word}" in out, out[-4000:]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [3, pytest.param(4, marks=pytest.mark.torch_recovery)])
def test_shrink_after_sigkill(procs, n):
    results, (code, _) = run_job(procs, "kill", n)
    assert_ok(results, "shrunk")
    assert code == -signal.SIGKILL


@pytest.mark.timeout(180)
def test_shrink_after_sigkill_with_no_setting(procs):
    """A torchrun-style job that sets nothing of this library's (no COLLECTIVES_TORCH_ELASTIC,
    no coordinator, no secret): rank 2 SIGKILLed, dist.shrink_group([2]) gives the two others
    a working group, as it does over NCCL."""
    results, (code, _) = run_job(procs, "kill", 3, elastic=None, hosted=False)
    assert_ok(results, "shrunk")
    assert code == -signal.SIGKILL


@pytest.mark.timeout(180)
def test_a_job_that_sets_nothing_runs_where_master_port_plus_one_is_taken(procs):
    """MASTER_PORT + 1, where rank 0 would host the coordinator, is another program's: rank
    0 hosts it on a free port and the others read that port from torch's store."""
    results, (code, _) = run_job(procs, "kill", 3, elastic=None, hosted=False, hold_next_port=True)
    assert_ok(results, "shrunk")
    assert code == -signal.SIGKILL


@pytest.mark.torch_recovery
@pytest.mark.timeout(180)
def test_shrink_after_sigstop(procs):
    results, _ = run_job(procs, "stop", 3)
    assert_ok(results, "shrunk")


@pytest.mark.timeout(180)
def test_shrink_excludes_a_live_rank_which_is_evicted(procs):
    """The survivors exclude a live rank: it is evicted (Evicted on its next op, not a
    hang) as soon as every survivor has asked, long before the group's timeout (which the
    reconstruction would otherwise wait out); calling shrink_group itself it gets torch's
    error; an op the group had in flight with SHRINK_DEFAULT finished first."""
    op_timeout = 8.0
    results, victim = run_job(procs, "live", 3, op_timeout=op_timeout)
    assert_ok(results, "shrunk")
    assert_ok([victim], "evicted")
    took = float(re.search(r"ok evicted after ([\d.]+) s", victim[1]).group(1))
    assert took < timing.bound(1.9, below=op_timeout), (took, victim[1][-2000:])


@pytest.mark.torch_recovery
@pytest.mark.timeout(180)
def test_disagreeing_lists_raise_everywhere_then_agreement_works(procs):
    results, victim = run_job(procs, "disagree", 4, op_timeout=LIVE_TIMEOUT)
    assert_ok(results, "shrunk")
    for rc, out in results:
        assert "ok disagreement" in out, out[-3000:]
    assert_ok([victim], "evicted")


@pytest.mark.torch_recovery
@pytest.mark.timeout(180)
def test_shrink_abort_ends_the_op_in_flight(procs):
    results, victim = run_job(procs, "abort", 3, op_timeout=LIVE_TIMEOUT)
    assert_ok(results, "shrunk")
    assert_ok([victim], "evicted")


@pytest.mark.timeout(120)
def test_a_group_that_is_not_elastic_says_how_to_shrink(procs):
    results, victim = run_job(procs, "plain", 2, elastic=False)
    assert_ok(results + [victim], "refused")


@pytest.mark.torch_recovery
@pytest.mark.timeout(180)
def test_reconfigure_admits_a_joiner(procs):
    """3 members call collectives.torch.reconfigure() (nothing to exclude) until the joiner
    waiting in join_process_group() is admitted: 4 ranks, the joiner last, on both sides; a
    new_group of the grown group forms (its name is the same on every member)."""
    results, joiner = run_job(procs, "grow", 4, joiner=True)
    assert_ok(results + [joiner], "grown")


# ============================================================================================
# Worker side
# ============================================================================================
def _check_sum(dist, torch, n):
    t = torch.full((4,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    assert t.tolist() == [n * (n + 1) / 2] * 4, (t, n)


def _shrunk(dist, torch, ct, old_rank, n, exclude, flags=None, t_fail=None):
    kw = {} if flags is None else {"shrink_flags": flags}
    new = dist.shrink_group(exclude, **kw)
    assert dist.group.WORLD is new, "the default group is the shrunk one"
    m = n - len(exclude)
    assert dist.get_world_size() == m and new.size() == m
    survivors = [r for r in range(n) if r not in exclude]
    assert dist.get_rank() == survivors.index(old_rank), (dist.get_rank(), old_rank)
    _check_sum(dist, torch, m)
    took = "" if t_fail is None else f" {time.monotonic() - t_fail:.3f}s"
    print(f"ok shrunk rank {old_rank} -> {dist.get_rank()} of {m}{took}", flush=True)


def _wait_evicted(dist, torch, deadline_s, since=None):
    """The excluded live rank: its group is told Evicted; its next op raises it. `since`:
    say how long after it the eviction came."""
    from collectives import Evicted

    group = dist.group.WORLD
    end = time.monotonic() + deadline_s
    while not isinstance(group.collectives_group.failure, Evicted):
        assert time.monotonic() < end, "not evicted in time"
        time.sleep(0.05)
    took = "" if since is None else f" after {time.monotonic() - since:.3f} s"
    try:
        dist.all_reduce(torch.ones(1))
    except Exception as exc:
        assert "Evicted" in repr(exc) or "evicted" in str(exc), repr(exc)
        print(f"ok evicted{took}", flush=True)
    else:
        raise AssertionError("an op of an evicted rank succeeded")


def _until_in_flight(dist, deadline_s):
    """Return once this rank's transport is inside a collective (the one in flight)."""
    transport = dist.group.WORLD.collectives_group.transport
    end = time.monotonic() + deadline_s
    while not transport.progress().in_op:
        if time.monotonic() > end:
            raise AssertionError(f"no collective in flight within {deadline_s:g} s")
        time.sleep(0.005)


def grow(dist, torch, ct, op_timeout):
    if os.environ.get("COLLECTIVES_JOIN") == "1":
        group = ct.join_process_group(timeout=timedelta(seconds=op_timeout), wait=60)
        assert dist.group.WORLD is group and dist.is_initialized()
    else:
        dist.init_process_group("collectives", timeout=timedelta(seconds=op_timeout))
        _check_sum(dist, torch, 3)
        end = time.monotonic() + 6 * op_timeout
        while dist.get_world_size() == 3:  # until the joiner has asked to be admitted
            assert time.monotonic() < end, "the joiner was not admitted"
            ct.reconfigure()
    assert dist.get_world_size() == 4
    _check_sum(dist, torch, 4)
    sub = dist.new_group([1, 2, 3])  # the same name on survivors and joiner: it forms
    if dist.get_rank() > 0:
        t = torch.ones(2)
        dist.all_reduce(t, group=sub)
        assert t.tolist() == [3.0, 3.0], t
    print(f"ok grown: rank {dist.get_rank()} of 4", flush=True)
    dist.destroy_process_group()


def worker(scenario):
    import torch
    import torch.distributed as dist

    import collectives.torch as ct

    op_timeout = float(os.environ["TEST_OP_TIMEOUT"])
    if scenario == "grow":
        grow(dist, torch, ct, op_timeout)
        return
    dist.init_process_group("collectives", timeout=timedelta(seconds=op_timeout))
    rank, n = dist.get_rank(), dist.get_world_size()
    victim = n - 1
    _check_sum(dist, torch, n)
    if scenario in ("kill", "stop"):
        if rank == victim:
            os.kill(os.getpid(), signal.SIGKILL if scenario == "kill" else signal.SIGSTOP)
        t = torch.ones(1 << 16)
        try:
            for _ in range(100):
                dist.all_reduce(t)
        except Exception:
            t_fail = time.monotonic()
        else:
            raise AssertionError("all_reduce went on without the victim")
        failed = ct.failed_ranks()
        assert failed == [victim], failed
        _shrunk(dist, torch, ct, rank, n, failed, t_fail=t_fail)
    elif scenario == "plain":  # COLLECTIVES_TORCH_ELASTIC=0: the store's group
        if rank == 0:
            try:
                dist.shrink_group([1])
            except RuntimeError as exc:
                assert "COLLECTIVES_TORCH_ELASTIC=1" in str(exc), exc
            else:
                raise AssertionError("a group without a coordinator shrank")
        dist.barrier()  # the group is still whole
        print("ok refused", flush=True)
    elif scenario == "live":
        work = dist.all_reduce(torch.ones(1 << 12), async_op=True)  # in flight at the shrink
        t0 = time.monotonic()  # the survivors call shrink_group about now
        if rank == victim:
            try:
                dist.shrink_group([victim])
            except RuntimeError as exc:
                assert "is in the exclusion list" in str(exc), exc
            else:
                raise AssertionError("the excluded rank's shrink_group returned")
            work.wait()
            _wait_evicted(dist, torch, 4 * op_timeout, since=t0)
        else:
            _shrunk(dist, torch, ct, rank, n, [victim])
            assert work.is_completed() and work.is_success()  # SHRINK_DEFAULT: it finished
    elif scenario == "disagree":
        if rank == victim:
            _wait_evicted(dist, torch, 6 * op_timeout)
        else:
            mine = [1, victim] if rank == 2 else [victim]
            try:
                dist.shrink_group(mine)
            except ValueError as exc:  # CollectiveMismatch is a ValueError too
                assert "disagree" in str(exc) and "excludes [1, 3]" in str(exc), exc
                print(f"ok disagreement: {exc}", flush=True)
            else:
                raise AssertionError("disagreeing lists gave a group")
            assert dist.get_world_size() == n  # nothing changed
            _shrunk(dist, torch, ct, rank, n, [victim])
    elif scenario == "abort":
        if rank == victim:
            _wait_evicted(dist, torch, 4 * op_timeout)
        else:
            import threading

            work = dist.all_reduce(torch.ones(8), async_op=True)  # the victim never joins
            raised = []

            def waiter():
                try:
                    work.wait()
                except Exception as exc:
                    raised.append((time.monotonic(), exc))

            th = threading.Thread(target=waiter)
            th.start()
            _until_in_flight(dist, op_timeout)  # blocked on the victim
            assert not raised, raised
            t0 = time.monotonic()
            holder = []
            sh = threading.Thread(
                target=lambda: holder.append(dist.shrink_group([victim], shrink_flags=1))
            )
            sh.start()
            th.join(op_timeout)
            assert raised, "the op in flight did not end"
            when, exc = raised[0]
            assert when - t0 < op_timeout / 4, (when - t0, exc)
            assert "SHRINK_ABORT" in str(exc), exc
            sh.join(4 * op_timeout)
            assert holder, "shrink_group did not return"
            _check_sum(dist, torch, n - 1)
            print(f"ok shrunk (the op in flight raised after {when - t0:.3f} s)", flush=True)
    dist.destroy_process_group()


def _until_in_flight(dist, deadline_s):
    """Return once this rank's transport is inside a collective (the one in flight)."""
    transport = dist.group.WORLD.collectives_group.transport
    end = time.monotonic() + deadline_s
    while not transport.progress().in_op:
        if time.monotonic() > end:
            raise AssertionError(f"no collective in flight within {deadline_s:g} s")
        time.sleep(0.005)


if __name__ == "__main__":
    worker(sys.argv[1])
