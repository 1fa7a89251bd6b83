"""The library across real processes over ZeroMQ (tcp and ipc), the launcher, and the standalone
coordinator. Each test starts its worlds through a ProcessSet (tests/support/procs.py), which
kills and reaps every process it started, even when the test fails; whoever hosts the
coordinator binds any free port and reports it (tests/support/ports.py). The checks themselves
run in tests/support/workers.py; each worker writes rank<R>.json, judged here.

To stay fast on 2 cores, one multi-process run per world size batches a few hundred checks.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from support.ports import coordinator_process, rank0_address
from support.procs import ProcessSet, clean_env
from support import timing
from support.timing import bound, scaled

WORKER = str(Path(__file__).resolve().parents[1] / "support" / "workers.py")
PY = sys.executable


def run_world(procs, n, scenario, outdir, host="rank0", transport="tcp", timeout=90.0, **extra):
    """Start n workers of `scenario`; return (per-rank reports, per-rank Result).

    host: who runs the coordinator -- "rank0" (init_process_group starts one in rank 0, as
    when nobody else does: MASTER_PORT=0, rank 0 prints the port it got and the others are
    started with it), "coordinator" (python -m collectives.coordinator --port 0) or "launcher"
    (python -m collectives.launch, which then also starts the workers)."""
    # the workers' own deadlines on the test's time scale (support/workers.py)
    env = clean_env(COLLECTIVES_TRANSPORT=transport, TEST_TIME_SCALE=f"{timing.SCALE:g}", **extra)
    if host == "launcher":
        procs.spawn(
            "launch",
            [
                PY,
                "-m",
                "collectives.launch",
                "--nproc",
                n,
                "--grace",
                "2",
                "--timeout",
                timeout - 10,
                WORKER,
                scenario,
                outdir,
            ],
            env,
        )
        runs = procs.wait("launch", timeout) * n
    else:
        if host == "coordinator":
            # a standalone coordinator needs the job's secret, shared with every rank
            env.setdefault("COLLECTIVES_JOB_SECRET", "test-job-secret-" + "s" * 16)
            env["COLLECTIVES_COORDINATOR"] = coordinator_process(procs, "coordinator", n, env=env)
            first = 0
        else:
            procs.spawn(
                "rank0",
                [PY, WORKER, scenario, outdir],
                dict(env, RANK="0", WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT="0"),
            )
            addr, port = rank0_address(procs, "rank0").rsplit(":", 1)
            env.update(MASTER_ADDR=addr, MASTER_PORT=port)
            first = 1
        for r in range(first, n):
            procs.spawn(
                f"rank{r}",
                [PY, WORKER, scenario, outdir],
                dict(env, RANK=str(r), WORLD_SIZE=str(n)),
            )
        runs = procs.wait([f"rank{r}" for r in range(n)], timeout)
        if host == "coordinator":  # it must stop cleanly on SIGTERM
            procs.procs["coordinator"].send_signal(signal.SIGTERM)
            (coord,) = procs.wait("coordinator", 10)
            assert coord.code == 0, f"coordinator exited {coord.code} on SIGTERM: {coord.err}"
    reports = []
    for r in range(n):
        path = Path(outdir) / f"rank{r}.json"
        assert path.exists(), (
            f"rank {r} wrote no report; exit codes {[x.code for x in runs]}; "
            f"stderr: {runs[r].err[-3000:]}"
        )
        reports.append(json.loads(path.read_text()))
    return reports, runs


def assert_clean(reports, runs):
    for r, rep in enumerate(reports):
        assert not rep["failures"], f"rank {r}:\n" + "\n".join(rep["failures"][:5])
    for r, run in enumerate(runs):
        assert run.code == 0, f"rank {r} exited {run.code}:\n{run.err[-3000:]}"


def assert_identical(reports):
    """Principle 2: every rank that reports a digest for a result has the same bytes."""
    keys = set(reports[0]["digests"])
    for r, rep in enumerate(reports):
        assert set(rep["digests"]) == keys, f"rank {r} ran other checks than rank 0"
        differ = [k for k in keys if rep["digests"][k] != reports[0]["digests"][k]]
        assert not differ, f"rank {r}'s results differ bitwise from rank 0's in {differ[:5]}"


# Each world size over sockets and over shared memory, with the three ways to host the
# coordinator (ipc alone once: shm is ipc plus the arenas). One world runs with every rank on
# one CPU: a crowded host whatever the machine (group/tuning.py, crowded), so the crowded
# schedules -- naive for small all_reduces, the star commit -- are checked everywhere.
@pytest.mark.parametrize(
    "n,transport,host,one_cpu",
    [
        (2, "tcp", "coordinator", False),
        (2, "ipc", "rank0", False),
        (2, "shm", "coordinator", False),
        (3, "tcp", "rank0", False),
        (3, "shm", "launcher", True),
        (4, "tcp", "launcher", False),
        (4, "shm", "rank0", False),
    ],
)
def test_conformance_across_processes(procs, tmp_path, n, transport, host, one_cpu):
    """Every algorithm x op x dtype x count {0,1,7,1000} all_reduce (bitwise ops and bool
    included), and reduce/broadcast from every root, all_gather, reduce_scatter, all_to_all
    (equal and uneven blocks), gather/scatter from every root, send/recv, async ops and big
    pipelined buffers:
    each result equals numpy's (exact for ints/MIN/MAX, within the rounding bound for floats)
    and is bitwise identical on every rank. The (2, tcp) run also passes torch CPU tensors."""
    with_torch = n == 2 and transport == "tcp"
    reports, runs = run_world(
        procs,
        n,
        "conformance",
        tmp_path,
        host=host,
        transport=transport,
        TEST_WITH_TORCH=int(with_torch),
        TEST_ONE_CPU=int(one_cpu),
    )
    assert_clean(reports, runs)
    assert_identical(reports)
    assert reports[0]["checks"] >= 200, reports[0]["checks"]
    for rep in reports:  # the transport asked for is the one the ranks talk over
        assert rep["info"]["routes"] == [transport], rep["info"]["routes"]
        # and with shm, the large payloads (64 KiB segments and up) used the arenas
        assert (rep["info"]["shm_sent"] > 20) == (transport == "shm"), rep["info"]
    if with_torch:
        assert all(rep["info"].get("torch") for rep in reports)
    # every rank made the same call on crowding, and "auto" ran what that call implies
    assert len({rep["info"]["crowded"] for rep in reports}) == 1
    crowded = reports[0]["info"]["crowded"]
    assert crowded or not one_cpu
    # more ranks than CPUs: small receives yield their CPU while they read (tuning.yields)
    assert all(rep["info"]["spin_yields"] for rep in reports) or not one_cpu
    small = "naive" if crowded and n >= 3 else "direct"
    assert small in reports[0]["info"]["auto_ran"], reports[0]["info"]["auto_ran"]
    if host == "launcher":
        check_launched(reports, runs[0])


def check_launched(reports, run):
    """The launcher gave each worker its environment and prefixed every line it printed."""
    out, err = run.out, run.err
    n = len(reports)
    ports = set()
    for r, rep in enumerate(reports):
        env = rep["info"]["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (
            str(r),
            str(r),
            str(n),
            str(n),
        )
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["COLLECTIVES_COORDINATOR"] == f"127.0.0.1:{int(env['MASTER_PORT']) + 1}"
        ports.add(env["MASTER_PORT"])
        assert f"[rank {r}] hello from rank {r}\n" in out and f"[rank {r}] second line\n" in out
        assert f"[rank {r}] stderr of rank {r}\n" in err
    assert len(ports) == 1
    for line in out.splitlines():
        assert line.startswith("[rank "), f"unprefixed line: {line!r}"


@pytest.fixture(scope="module")
def mismatch_world(tmp_path_factory):
    """One 3-rank run of the mismatch scenario, judged by the two tests below."""
    tmp = tmp_path_factory.mktemp("mismatch")
    ps = ProcessSet(tmp)
    try:
        yield run_world(ps, 3, "mismatch", tmp, timeout=60)
    finally:
        ps.close()


def test_mismatch_raises_on_every_rank(mismatch_world):
    """Rank 1 of 3 differs in count, dtype, op, algorithm, then kind, then in all_to_all's
    count and split sizes (these seen by rank 2 alone, from the size of what arrives), a
    gather's root and a scatter's dtype: every rank raises CollectiveMismatch naming rank 1,
    quickly (not at the 20 s timeout), and the next op works."""
    reports, runs = mismatch_world
    assert_clean(reports, runs)
    for r, rep in enumerate(reports):
        got = {e["key"]: e for e in rep["errors"] if e["key"] != "silent"}
        assert set(got) == {
            "count",
            "dtype",
            "op",
            "algorithm",
            "kind",
            "all_to_all",
            "all_to_all splits",
            "gather",
            "scatter",
        }, (r, rep["errors"])
        for key, e in got.items():
            assert "CollectiveMismatch" in e["classes"], e
            assert "rank 1" in e["message"], f"rank {r}, {key}: {e['message']}"
            took = rep["info"][f"{key}_s"]
        assert took < scaled(10), f"rank {r} took {took} s"


def test_silent_mismatch_is_still_a_mismatch(mismatch_world):
    """Rank 1 broadcasts while the others run a tree all_reduce: no data message ever flows
    between rank 1 and a rank running the other op, yet every rank raises CollectiveMismatch
    (not a timeout), well before the op's 3 s timeout."""
    reports, runs = mismatch_world
    for r, rep in enumerate(reports):
        (e,) = [e for e in rep["errors"] if e["key"] == "silent"]
        assert "CollectiveMismatch" in e["classes"], (r, e)
        # the op's timeout is 3 s, scaled alike (support/workers.py)
        quick = bound(2.5, below=3.0, below_scaled=True)
        assert rep["info"]["silent_s"] < quick, rep["info"]["silent_s"]


def test_rank_that_never_joins_is_named(procs, tmp_path):
    """Ranks 0 and 1 wait for rank 2 in vain: both raise within seconds of the 2 s timeout,
    naming rank 2 -- CollectiveTimeout, or PeerFailure once failure detection has declared
    rank 2 stalled (the rank that times out first may tell the other)."""
    t0 = time.monotonic()
    reports, runs = run_world(procs, 3, "never_joins", tmp_path, timeout=60)
    assert_clean(reports, runs)
    for r in (0, 1):
        (e,) = reports[r]["errors"]
        assert "CollectiveTimeout" in e["classes"] or "PeerFailure" in e["classes"], e
        assert "rank 2" in e["message"] or "rank(s) 2" in e["message"], e
        assert e["peer"] == 2 or e["failed_ranks"] == [2], e
        assert reports[r]["info"]["waited_s"] < scaled(15), reports[r]["info"]
    assert time.monotonic() - t0 < scaled(40)


def test_garbage_on_the_socket_is_dropped(procs, tmp_path):
    """Junk frames, foreign headers and raw TCP bytes at rank 1 from sockets without the job's
    keys: refused at the handshake, with a log line; another generation and an old op from
    the real peer: dropped with a log line; never reduced; every later result is right.
    (Junk from a socket that does hold the keys: tests/scenarios/test_security.py.)"""
    reports, runs = run_world(procs, 2, "garbage", tmp_path, transport="tcp")
    assert_clean(reports, runs)
    err = runs[1].err
    for needle in (
        "refused a connection",  # unkeyed DEALERs, raw TCP bytes
        "dropped a frame of generation",
    ):  # a real peer, another generation
        assert needle in err, f"rank 1 did not log {needle!r}; its stderr:\n{err[-3000:]}"


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_launcher_ends_the_job_when_a_worker_fails(procs, tmp_path):
    """Rank 1 exits 3; the launcher ends ranks 0 and 2 (which would sleep 60 s) and exits 3,
    naming rank 1 and its exit code, within seconds."""
    t0 = time.monotonic()
    procs.spawn(
        "launch",
        [
            PY,
            "-m",
            "collectives.launch",
            "--nproc",
            "3",
            "--grace",
            "1",
            WORKER,
            "fail_rank1",
            tmp_path,
        ],
        clean_env(),
    )
    (run,) = procs.wait("launch", 45)
    rc, out, err = run.code, run.out, run.err
    assert rc == 3, (rc, err[-2000:])
    assert "rank 1 failed (exit code 3)" in err, err[-2000:]
    assert time.monotonic() - t0 < scaled(30)
    assert "[rank 1] rank 1 fails now" in out
    for r in range(3):
        pid = json.loads((tmp_path / f"rank{r}.json").read_text())["info"]["pid"]
        assert _dead(pid), f"rank {r} (pid {pid}) outlived the launcher"


def test_launcher_forwards_sigterm(procs, tmp_path):
    p = procs.spawn(
        "launch",
        [
            PY,
            "-m",
            "collectives.launch",
            "--nproc",
            "2",
            "--grace",
            "3",
            WORKER,
            "wait_for_signal",
            tmp_path,
        ],
        clean_env(),
    )
    deadline = time.monotonic() + scaled(30)
    while len(list(tmp_path.glob("rank*.json"))) < 2:  # both joined and installed handlers
        assert time.monotonic() < deadline and p.poll() is None, "workers never started"
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    (run,) = procs.wait("launch", 20)
    rc, out, err = run.code, run.out, run.err
    assert rc == 128 + signal.SIGTERM, (rc, err[-2000:])
    for r in range(2):
        assert f"[rank {r}] rank {r} got SIGTERM" in out, out
        pid = json.loads((tmp_path / f"rank{r}.json").read_text())["info"]["pid"]
        assert _dead(pid)
