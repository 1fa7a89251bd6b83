"""DataParallel and ElasticTrainer.

Invariants:
  * N ranks with global batch B (B/N each, gradients averaged) train exactly like one process
    with batch B: parameters allclose after k steps, and bitwise identical across ranks;
  * the ElasticTrainer's sharding makes training the same function of the data at any world
    size (uneven shards included);
  * the digits example, run by `collectives.launch --elastic`, ends with one `final ...` line
    per live rank, the same params_sha256 everywhere and test_acc >= 0.95, after a worker was
    SIGTERMed (it leaves at once and exits 0), SIGKILLed (a replacement joins and ends
    identical), SIGSTOPped (evicted; after SIGCONT it rejoins and ends identical) -- all sent
    from outside with os.kill -- and after an injected stall (evicted, rejoins), an injected
    self-kill and an admitted joiner.
Every spawned process is in its own session and is killed (with its children) at teardown.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import collectives as cl  # noqa: E402
from collectives.training.elastic import shard_bounds  # noqa: E402
from collectives.training.state import decode_state, encode_state  # noqa: E402
from collectives.transport.address import RankAddress  # noqa: E402
from support.ports import coordinator, rank0_address  # noqa: E402
from support.procs import ProcessSet, clean_env  # noqa: E402
from support.timing import bound, heartbeats, scaled  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_digits.py")
FINAL = re.compile(
    r"final rank=(\d+) world_size=(\d+) generation=(\d+) step=(\d+) "
    r"test_acc=([\d.]+) params_sha256=([0-9a-f]{64})"
)

X = torch.randn(96, 10, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 3, (96,), generator=torch.Generator().manual_seed(1))
STEPS, B, LR = 6, 24, 0.1


ROUND_TIMEOUT = 5.0  # s, scaled: a reconstruct round's deadline


def make_model(seed=1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def make_rank_model(rank):
    """Every rank different (the broadcast must fix that) but rank 0, which holds the
    reference's initial parameters."""
    return make_model() if rank == 0 else make_model(seed=100 + rank)


def reference_params():
    """One process, batch B, plain SGD."""
    m = make_model()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    for s in range(STEPS):
        lo = s * B % len(X)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(X[lo : lo + B]), Y[lo : lo + B]).backward()
        opt.step()
    return [p.detach().clone() for p in m.parameters()]


def dp_body(pg, overlap=True, bucket_mb=25.0, model=None):
    """`model`: this rank's model, made beforehand. cl.simulate runs the ranks on threads, and
    torch.manual_seed + layer init use the one global generator: threads making their models
    at the same time would draw from each other's stream (that raced under load)."""
    m = model if model is not None else make_rank_model(pg.rank)
    dp = cl.DataParallel(m, pg, bucket_mb=bucket_mb, overlap=overlap)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    per = B // pg.world_size
    for s in range(STEPS):
        lo = s * B % len(X) + pg.rank * per
        opt.zero_grad()
        torch.nn.functional.cross_entropy(dp(X[lo : lo + per]), Y[lo : lo + per]).backward()
        dp.sync_gradients()
        opt.step()
    return len(dp.buckets), [p.detach().clone() for p in m.parameters()]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("overlap,bucket_mb", [(True, 25.0), (True, 0.0005), (False, 0.0005)])
def test_data_parallel_matches_single_process(n, overlap, bucket_mb):
    ref = reference_params()
    models = [make_rank_model(r) for r in range(n)]
    results = cl.simulate(
        n, lambda pg: dp_body(pg, overlap, bucket_mb, models[pg.rank]), timeout=20
    )
    for r, (nbuckets, params) in enumerate(results):
        assert nbuckets == (1 if bucket_mb == 25.0 else 2)  # 204 B + 704 B vs 524 B
        for got, want in zip(params, ref):
            assert torch.allclose(got, want, atol=1e-6), f"rank {r} differs from 1 process"
        for got, first in zip(params, results[0][1]):
            assert torch.equal(got, first), f"rank {r} differs bitwise from rank 0"


def test_shard_bounds_partition_every_batch():
    for b in (1, 5, 64, 65):
        for k in (1, 2, 3, 4, 7):
            spans = [shard_bounds(b, k, r) for r in range(k)]
            assert spans[0][0] == 0 and spans[-1][1] == b
            assert all(spans[i][1] == spans[i + 1][0] for i in range(k - 1))


def test_state_codec_round_trip():
    m = make_model()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    torch.nn.functional.cross_entropy(m(X[:8]), Y[:8]).backward()
    opt.step()
    state = {"trainer": {"step": 3}, "model": m.state_dict(), "optim": opt.state_dict()}
    header, payload = encode_state(state)
    back = decode_state(header, np.frombuffer(payload, np.uint8))
    m2 = make_model(seed=5)
    opt2 = torch.optim.Adam(m2.parameters(), lr=1e-3)
    m2.load_state_dict(back["model"])
    opt2.load_state_dict(back["optim"])
    assert back["trainer"] == {"step": 3}
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    for k in s1:
        for key in s1[k]:
            assert torch.equal(torch.as_tensor(s1[k][key]), torch.as_tensor(s2[k][key]))


@pytest.mark.timeout(90)
def test_elastic_trainer_same_training_at_any_world_size():
    """3 ranks (uneven shards of a 20-sample batch) vs 1 rank: same parameters."""
    models = {n: [make_model() for _ in range(n)] for n in (1, 3)}  # main thread: see dp_body

    def body(pg):
        m = models[pg.world_size][pg.rank]
        opt = torch.optim.SGD(m.parameters(), lr=LR)
        tr = cl.ElasticTrainer(
            m,
            opt,
            pg,
            (X, Y),
            global_batch=20,
            epochs=2,
            progress=False,
            admit_every=0,
            max_steps=7,
        )
        summary = tr.fit()
        return summary, [p.detach().clone() for p in m.parameters()]

    ((s1, ref),) = cl.simulate(1, body, timeout=30)
    results = cl.simulate(3, body, timeout=30)
    assert s1["step"] == 7 and s1["epoch"] == 1  # 5 steps per epoch: 2 into epoch 1
    for summary, params in results:
        assert summary["step"] == 7 and summary["world_size"] == 3
        for got, want in zip(params, ref):
            assert torch.allclose(got, want, atol=1e-5)
        for got, first in zip(params, results[0][1]):
            assert torch.equal(got, first)


# --- real processes --------------------------------------------------------------------------
def env(**extra):
    """Short heartbeats (docs/faults.md): a dead or frozen worker is declared gone after 1 s
    (more on a busy machine, where a live one can go unscheduled that long: support/timing.py,
    measured when the test runs)."""
    return clean_env(**heartbeats(0.2, 1.0), **extra)


DP_WORKER = textwrap.dedent("""
    import sys, numpy as np, torch, collectives as cl
    sys.path[:0] = {paths!r}
    from test_trainer import dp_body
    torch.set_num_threads(1)
    pg = cl.init_process_group(timeout=20)
    _, params = dp_body(pg, overlap=True, bucket_mb=0.0005)
    np.save({out!r} + f"/rank{{pg.rank}}.npy", np.concatenate([p.numpy().ravel() for p in params]))
    pg.barrier(); pg.destroy()
""")


@pytest.mark.timeout(120)
def test_data_parallel_over_processes(procs, tmp_path):
    # No fault here, so the default heartbeats: the 1 s of env()'s heartbeats evicted a rank that a busy
    # machine left unscheduled for a second.
    here = os.path.dirname(os.path.abspath(__file__))  # test_trainer.py, and support/ above it
    code = DP_WORKER.format(paths=[here, os.path.dirname(here)], out=str(tmp_path))
    procs.spawn(
        "rank0",
        [sys.executable, "-c", code],
        clean_env(RANK=0, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=0),
    )
    procs.spawn(
        "rank1",
        [sys.executable, "-c", code],
        clean_env(RANK=1, WORLD_SIZE=2, COLLECTIVES_COORDINATOR=rank0_address(procs, "rank0")),
    )
    runs = procs.wait(timeout=100)
    assert [r.code for r in runs] == [0, 0], "\n".join(r.output for r in runs)
    ref = np.concatenate([p.numpy().ravel() for p in reference_params()])
    got = [np.load(tmp_path / f"rank{r}.npy") for r in range(2)]
    np.testing.assert_allclose(got[0], ref, atol=1e-6)
    assert got[0].tobytes() == got[1].tobytes()


@pytest.mark.timeout(30)
def test_leaving_while_in_reconstruct_is_answered_at_once():
    """A rank preempted (SIGTERM -> leave) while it waits in reconstruct() at a step boundary
    must learn at once that it is out (Evicted), not wait for the round's deadline."""
    from collectives.membership.client import CoordinatorClient

    coord = coordinator(2, heartbeat_interval=0.2, heartbeat_timeout=30)
    clients = [CoordinatorClient(coord.address, r, 2) for r in range(2)]
    try:
        joins = [
            threading.Thread(target=c.join, args=(RankAddress(tcp=f"tcp://127.0.0.1:{i + 1}"), 10))
            for i, c in enumerate(clients)
        ]
        for t in joins:
            t.start()
        for t in joins:
            t.join(15)
        got = {}

        def regroup():
            t0 = time.monotonic()
            try:
                clients[0].regroup(0, timeout=scaled(ROUND_TIMEOUT))
            except cl.CollectiveError as exc:
                got["exc"] = exc
            got["s"] = time.monotonic() - t0

        th = threading.Thread(target=regroup)
        th.start()
        # not a wait: a head start for rank 0 into the round; rank 1 is busy elsewhere
        time.sleep(0.3)
        clients[0].leave()  # what the SIGTERM handler does
        th.join(10)
        assert isinstance(got.get("exc"), cl.Evicted), got
        # not the round's deadline
        assert got["s"] < bound(2.0, below=ROUND_TIMEOUT, below_scaled=True), got
    finally:
        for c in clients:
            c.close()
        coord.stop()


# --- the digits example under faults sent from outside ----------------------------------------
# Two runs of `python -m collectives.launch --elastic ... examples/train_digits.py`, each shared
# by several tests (every run costs seconds of torch start-up per worker). The test reads the
# output as it comes, finds each worker's pid in the line the example prints at start-up
# ("[rank R] [train_digits] launch rank R pid P ..."), and signals it with os.kill when rank 0
# reports a step ("step S world_size K generation G", --print-every).
FINAL_LINE = re.compile(
    r"^\[(rank \d+|join \d+)\] final rank=(\d+) world_size=(\d+) "
    r"generation=(\d+) step=(\d+) test_acc=([\d.]+) "
    r"params_sha256=([0-9a-f]{64})$",
    re.M,
)
STEP_LINE = re.compile(r"\[rank 0\] \[train_digits\] step (\d+) world_size (\d+) generation")
CHANGE_LINE = re.compile(
    r"group change gen (\d+) -> (\d+): left \(old ranks\) ([^,]+), "
    r"joined (\d+), world size (\d+) -> (\d+)"
)


class Job:
    """A launcher run (process "launch" of a ProcessSet) whose output the test reads line by
    line as it comes, so that it can wait for a line, then act. The pids of the example's
    workers (printed at start-up) are adopted: killed at teardown, even if the launcher is
    not there to end them."""

    def __init__(self, procs, argv, env):
        self.procs = procs
        self.rc = None
        procs.spawn("launch", argv, env, merge_stderr=True, on_line=self._adopt)

    def _adopt(self, line):
        m = re.search(r"\[train_digits\] (?:launch rank -?\d+|joiner) pid (\d+)", line)
        if m:
            self.procs.adopt(int(m.group(1)))

    @property
    def text(self):
        return self.procs.text("launch")

    def wait_for(self, pattern, timeout=60.0, start=0, check=None):
        """The first line from index `start` on that matches (and passes `check`):
        (index, match). Fails the test, with the output so far, after `timeout` s."""
        return self.procs.wait_for_line("launch", pattern, timeout, start, check)

    def pid(self, launch_rank):
        _, m = self.wait_for(
            rf"^\[rank {launch_rank}\] \[train_digits\] launch rank "
            rf"{launch_rank} pid (\d+)",
            timeout=60,
        )
        return int(m.group(1))

    def finish(self, timeout):
        (run,) = self.procs.wait("launch", timeout)
        self.rc = run.code
        return self

    def finals(self):
        return [
            dict(
                who=w,
                rank=int(r),
                world_size=int(k),
                generation=int(g),
                step=int(s),
                test_acc=float(a),
                sha=h,
            )
            for w, r, k, g, s, a, h in FINAL_LINE.findall(self.text)
        ]

    def changes(self):
        return [tuple(m.groups()) for m in CHANGE_LINE.finditer(self.text)]


def launch_example(procs, nproc, *args, restarts=0):
    argv = [
        sys.executable,
        "-m",
        "collectives.launch",
        "--nproc",
        str(nproc),
        "--elastic",
        "--max-restarts",
        str(restarts),
        "--timeout",
        str(int(scaled(150))),
        "--grace",
        "2",
        EXAMPLE,
        "--no-progress",
        "--print-every",
        "10",
        *args,
    ]
    return Job(procs, argv, env())


def gone_within(pid, seconds):
    """Seconds until pid is gone (reaped by the launcher), or None if it outlives `seconds`
    (scaled: support/timing.py)."""
    seconds = scaled(seconds)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if not os.path.exists(f"/proc/{pid}") or _zombie(pid):
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture(scope="module")
def preempt_kill_join_run(tmp_path_factory):
    """3 launched workers; rank 0 starts a joiner that the members admit at step 10 (world 4).
    Then, from outside: SIGTERM to launch rank 1 (preemption: it leaves at once, exits 0, the
    others go on without a heartbeat timeout), and once the survivors have regrouped, SIGKILL
    to launch rank 2; the launcher starts a replacement, which joins. --await-world-size 3 lets
    a replacement still importing torch at the end join before the final lines."""
    ps = ProcessSet(tmp_path_factory.mktemp("preempt"))
    try:
        job = launch_example(
            ps, 3, "--epochs", "10", "--join-at-step", "10", "--await-world-size", "3", restarts=1
        )
        pids = {r: job.pid(r) for r in (1, 2)}
        i, _ = job.wait_for(STEP_LINE.pattern, check=lambda m: int(m.group(2)) == 4)
        os.kill(pids[1], signal.SIGTERM)
        t0 = time.monotonic()
        i, _ = job.wait_for(
            CHANGE_LINE.pattern, start=i, check=lambda m: m.group(5, 6) == ("4", "3")
        )
        os.kill(pids[2], signal.SIGKILL)
        gone = gone_within(pids[1], 20)
        job.t_term = None if gone is None else time.monotonic() - t0
        job.finish(140)
        yield job
    finally:
        ps.close()


@pytest.fixture(scope="module")
def stop_stall_kill_run(tmp_path_factory):
    """4 launched workers. From outside: SIGSTOP to launch rank 3 at step >= 20, SIGCONT once
    the others have regrouped without it (it finds itself evicted and rejoins). Through the
    example's flags: launch rank 1 stalls in an all_reduce at step 70 for 5 s with a 2 s
    collective timeout (the others' op times out, the coordinator blames and evicts it, it
    rejoins), and launch rank 2 SIGKILLs itself at step 120 (no replacement)."""
    ps = ProcessSet(tmp_path_factory.mktemp("stall"))
    try:
        # the stall outlasts the op deadline, both scaled (support/timing.py)
        job = launch_example(
            ps,
            4,
            "--epochs",
            "8",
            "--timeout",
            f"{scaled(2):g}",
            "--stall-rank",
            "1",
            "--stall-at-step",
            "70",
            "--stall-seconds",
            f"{scaled(5):g}",
            "--kill-rank",
            "2",
            "--kill-at-step",
            "120",
            "--await-world-size",
            "3",
        )
        pid = job.pid(3)
        i, _ = job.wait_for(STEP_LINE.pattern, check=lambda m: int(m.group(1)) >= 20)
        os.kill(pid, signal.SIGSTOP)
        try:
            job.wait_for(
                CHANGE_LINE.pattern,
                start=i,
                timeout=30,
                check=lambda m: m.group(5, 6) == ("4", "3"),
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        job.finish(140)
        yield job
    finally:
        ps.close()


def assert_identical_finals(job, world_size):
    got = job.finals()
    assert job.rc == 0, job.text
    assert sorted(f["rank"] for f in got) == list(range(world_size)), job.text
    assert len({f["sha"] for f in got}) == 1, job.text
    assert {f["world_size"] for f in got} == {world_size}, job.text
    assert len({(f["step"], f["generation"]) for f in got}) == 1, job.text
    assert all(f["test_acc"] >= 0.95 for f in got), job.text
    return got


@pytest.mark.timeout(180)
def test_digits_sigterm_preemption_leaves_at_once(preempt_kill_join_run):
    job = preempt_kill_join_run
    assert job.t_term is not None and job.t_term < scaled(10), (
        f"the preempted worker still ran {job.t_term} s after SIGTERM:\n{job.text}"
    )
    assert re.search(
        r"^\[rank 1\] \[train_digits\] launch rank 1 left \(preempted\)", job.text, re.M
    ), job.text
    assert "[launch] rank 1 failed" not in job.text, job.text  # it exited 0
    # the others regrouped without it: 4 -> 3, naming the leaver
    assert any(c[4:] == ("4", "3") and c[2] != "none" for c in job.changes()), job.text
    assert not [f for f in job.finals() if f["who"] == "rank 1"], job.text


@pytest.mark.timeout(180)
def test_digits_survives_sigkill_and_replacement_ends_identical(preempt_kill_join_run):
    job = preempt_kill_join_run
    assert "[launch] rank 2 failed (signal SIGKILL)" in job.text, job.text
    got = assert_identical_finals(job, 3)
    # launch rank 0 and the joiner it started print through rank 0's pipes; the launcher's
    # replacement prints as [join 1]: all three hold the same parameters
    assert sorted(f["who"] for f in got) == ["join 1", "rank 0", "rank 0"], job.text
    changes = job.changes()
    assert any(c[4:] == ("3", "4") and c[3] == "1" for c in changes), job.text  # join-at-step
    assert any(c[4:] == ("3", "2") for c in changes), job.text  # SIGKILL
    assert any(c[4:] == ("2", "3") and c[3] == "1" for c in changes), job.text  # replacement


@pytest.mark.timeout(180)
@pytest.mark.long
def test_digits_survives_sigstop_stall_and_kill(stop_stall_kill_run):
    """Three faults in one run of the example: marker `long` (`make test-long`). `make test`
    checks each on its own: a SIGSTOPped ElasticTrainer rank evicted and readmitted
    (test_elastic_cleanup.py), the example through a stalled all_reduce with its culprit
    evicted and the survivors identical (test_stall.py's demo-stall case), a killed rank and
    the launcher's replacement ending identical (the preemption run above), SIGSTOP, SIGKILL
    and SIGTERM in a row with joiners (test_faults.py)."""
    job = stop_stall_kill_run
    got = assert_identical_finals(job, 3)
    text = job.text
    assert re.search(r"rank 1 stalls for [\d.]+ s", text), text
    assert "[launch] rank 2 failed (signal SIGKILL)" in text, text
    # the frozen rank and the stalled one were each evicted and rejoined
    assert re.search(r"^\[rank 3\] final ", text, re.M), text
    assert re.search(r"^\[rank 1\] final ", text, re.M), text
    assert sum(int(c[3]) for c in job.changes()) >= 2, text  # two ranks joined again
    assert got[0]["generation"] >= 3, text
