"""Worker processes for tests/system/test_zmq_processes.py:
`python tests/support/workers.py SCENARIO OUTDIR`.

Each worker joins with cl.init_process_group() (RANK, WORLD_SIZE and the coordinator address
come from the environment, as under the launcher), runs SCENARIO, and writes what it saw to
OUTDIR/rank<R>.json for the test to judge: failures it found itself, a digest of every result
(so the test can check that all ranks ended with the same bytes), and the errors it caught.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import sys
import time
import traceback

import numpy as np

import collectives as cl  # noqa: E402

# the test's time scale (tests/support/timing.py), handed over by test_zmq_processes.py
SCALE = float(os.environ.get("TEST_TIME_SCALE", "1"))

S, A, MX, MN, P = (
    cl.ReduceOp.SUM,
    cl.ReduceOp.AVG,
    cl.ReduceOp.MAX,
    cl.ReduceOp.MIN,
    cl.ReduceOp.PRODUCT,
)
BAND, BOR, BXOR = cl.ReduceOp.BAND, cl.ReduceOp.BOR, cl.ReduceOp.BXOR
# A representative subset: every op, every kind of dtype (bool, signed, unsigned, float,
# 1..8 bytes).
PAIRS = [
    (S, "float32"),
    (S, "int64"),
    (S, "uint8"),
    (A, "float16"),
    (A, "float64"),
    (MX, "int8"),
    (MN, "uint16"),
    (P, "float32"),
    (P, "int32"),
    (BAND, "int32"),
    (BOR, "bool"),
    (BXOR, "uint16"),
]
COUNTS = (0, 1, 7, 1000)
ALGORITHMS = ("ring", "tree", "naive", "direct", "auto")


# The inputs and the numpy reference are the in-process conformance tests' own (reference.py,
# importable here: this script's folder is first on sys.path).
from reference import assert_matches, expected, make_input  # noqa: E402


class Report:
    def __init__(self, rank):
        self.rank = rank
        self.failures: list[str] = []
        self.digests: dict[str, str] = {}
        self.errors: list[dict] = []
        self.info: dict = {}
        self.checks = 0

    def check(self, key, got, ref, tol=None, same_everywhere=True):
        self.checks += 1
        got = np.asarray(got)
        try:
            if tol is None:
                tol = np.zeros(np.asarray(ref).shape)
            assert_matches(
                got.reshape(-1),
                np.asarray(ref).reshape(-1),
                np.asarray(tol).reshape(-1),
                f"rank {self.rank} {key}",
            )
        except AssertionError as exc:
            self.failures.append(str(exc))
        if same_everywhere:
            self.digests[key] = hashlib.sha256(got.tobytes()).hexdigest()

    def error(self, key, exc):
        self.errors.append(
            {
                "key": key,
                "type": type(exc).__name__,
                "message": str(exc),
                "peer": getattr(exc, "peer", None),
                "op": getattr(exc, "op", None),
                "failed_ranks": list(getattr(exc, "failed_ranks", ())),
                "classes": [c.__name__ for c in type(exc).__mro__],
            }
        )

    def write(self, outdir):
        # Whole or not at all: a test reads the file as soon as it exists, and a signal may
        # end the rank in the middle of a write (os.replace is atomic within a directory).
        path = os.path.join(outdir, f"rank{self.rank}.json")
        with open(path + ".part", "w") as f:
            json.dump(self.__dict__, f)
        os.replace(path + ".part", path)


def inputs(n, count, dtype, op, seed=0):
    return [make_input(q, count, dtype, op, seed) for q in range(n)]


# --- scenarios -------------------------------------------------------------------------------
def conformance(pg, rep, with_torch):
    """Every algorithm x PAIRS x COUNTS all_reduce, then the other collectives, each checked
    against numpy here and by digest across ranks in the test."""
    n, r = pg.world_size, pg.rank
    rep.info["routes"] = sorted(set(pg.transport.kinds.values()))

    def all_reduces(algorithms):
        for alg in algorithms:
            for count in COUNTS:
                for op, dt in PAIRS:
                    xs = inputs(n, count, dt, op)
                    buf = xs[r].copy()
                    pg.all_reduce(buf, op=op, algorithm=alg)
                    ref, tol = expected(xs, op, dt)
                    rep.check(f"all_reduce/{alg}/{op.name}/{dt}/{count}", buf, ref, tol)

    all_reduces(ALGORITHMS)
    # Large enough for zero-copy sends and, with 64 KiB segments, many pipelined segments.
    for alg in ("ring", "tree", "naive", "direct", "halving_doubling", "double_tree"):
        xs = inputs(n, 300_000, "float32", S, seed=1)
        buf = xs[r].copy()
        pg.all_reduce(buf, op=S, algorithm=alg)
        ref, tol = expected(xs, S, "float32")
        rep.check(f"all_reduce/{alg}/big", buf, ref, tol)
    for root in range(n):
        for count, (op, dt) in zip(
            COUNTS, [(S, "float32"), (MX, "int16"), (P, "float64"), (A, "float32")]
        ):
            xs = inputs(n, count, dt, op, seed=root)
            buf = xs[r].copy()
            pg.reduce(buf, dst=root, op=op)
            ref, tol = expected(xs, op, dt)
            if r == root:
                rep.check(f"reduce/{root}/{count}", buf, ref, tol, same_everywhere=False)
            else:
                rep.check(f"reduce/{root}/{count}/kept", buf, xs[r], same_everywhere=False)
        for count, dt in zip(
            COUNTS + (300_000,), ("int32", "uint64", "float16", "float64", "float32")
        ):
            data = make_input(root, count, dt, S, seed=7)
            buf = data.copy() if r == root else np.zeros(count, dt)
            pg.broadcast(buf, src=root)
            rep.check(f"broadcast/{root}/{count}", buf, data)
    for count in COUNTS:
        for dt in ("float32", "int64"):
            xs = inputs(n, count, dt, S, seed=3)
            out = np.full((n, count), 99, dt)
            pg.all_gather(out, xs[r])
            rep.check(f"all_gather/{dt}/{count}", out, np.stack(xs))
        for op, dt in ((S, "float32"), (MN, "int32"), (A, "float64")):
            xs = inputs(n, n * count, dt, op, seed=4)
            out = np.zeros(count, dt)
            pg.reduce_scatter(out, xs[r], op=op)
            ref, tol = expected(xs, op, dt)
            rep.check(
                f"reduce_scatter/{op.name}/{dt}/{count}",
                out,
                ref[r * count : (r + 1) * count],
                tol[r * count : (r + 1) * count],
                same_everywhere=False,
            )
    for root in range(n):  # the bitwise ops in the other reducing collectives
        for count, (op, dt) in zip((1, 1000, 7), ((BAND, "uint8"), (BOR, "int64"), (BXOR, "bool"))):
            xs = inputs(n, count, dt, op, seed=20 + root)
            buf = xs[r].copy()
            pg.reduce(buf, dst=root, op=op)
            if r == root:
                rep.check(
                    f"reduce/{op.name}/{root}", buf, expected(xs, op, dt)[0], same_everywhere=False
                )
    for op, dt in ((BAND, "int16"), (BOR, "uint32"), (BXOR, "int8")):
        xs = inputs(n, n * 333, dt, op, seed=21)
        out = np.zeros(333, dt)
        pg.reduce_scatter(out, xs[r], op=op)
        rep.check(
            f"reduce_scatter/{op.name}/{dt}",
            out,
            expected(xs, op, dt)[0][r * 333 : (r + 1) * 333],
            same_everywhere=False,
        )
    all_to_all_gather_scatter(pg, rep)
    for count in (0, 7, 1000):  # send/recv round the ring; even ranks send first
        xs = inputs(n, count, "float64", S, seed=5)
        got = np.zeros(count)
        right, left = (r + 1) % n, (r - 1) % n
        if r % 2 == 0:
            pg.send(xs[r], dst=right)
            pg.recv(got, src=left)
        else:
            pg.recv(got, src=left)
            pg.send(xs[r], dst=right)
        rep.check(f"send_recv/{count}", got, xs[left], same_everywhere=False)
    # async_op: three ops in flight, waited in order.
    xs = [inputs(n, 1000, "float32", S, seed=10 + k) for k in range(3)]
    bufs = [x[r].copy() for x in xs]
    works = [
        pg.all_reduce(b, algorithm=alg, async_op=True)
        for b, alg in zip(bufs, ("ring", "tree", "direct"))
    ]
    for k, (w, b) in enumerate(zip(works, bufs)):
        w.wait()
        ref, tol = expected(xs[k], S, "float32")
        rep.check(f"async/{k}", b, ref, tol)
    pg.barrier()
    # What "auto" ran for all_reduce (small buffers: naive on a crowded host, else direct).
    rep.info["crowded"] = pg.crowded
    rep.info["spin_yields"] = pg._spin_yields  # small receives give their CPU away
    rep.info["auto_ran"] = sorted(
        {plan.algorithm for key, plan in pg._plans.items() if key[3] == "auto"}
    )
    # halving_doubling and double_tree after auto's plans are read: the group keeps at most 256
    # all_reduce plans, and more would push auto's out before the test reads which it ran.
    all_reduces(("halving_doubling", "double_tree"))
    # How many payloads went through shared memory, and how many found no slot free.
    rep.info["shm_sent"] = pg.transport.sender.shm_sent
    rep.info["shm_fallbacks"] = pg.transport.sender.shm_fallbacks
    if with_torch:
        torch_tensors(pg, rep)


def all_to_all_gather_scatter(pg, rep):
    """all_to_all (equal and uneven blocks), gather to and scatter from every root; block
    (p, q) -- what rank p sends rank q -- is make_input(p, ..., seed=q), distinct per pair.
    The large cases (300 000 float32 per rank) go in several 64 KiB segments."""
    n, r = pg.world_size, pg.rank

    def block(p, q, count, dt, seed=0):
        return make_input(p, count, dt, S, seed=100 * seed + q + 1)

    for count, dt in (
        (0, "float32"),
        (1, "int64"),
        (7, "bool"),
        (1000, "float16"),
        (300_000 // n, "float32"),
    ):
        buf = np.stack([block(r, q, count, dt) for q in range(n)])
        out = np.zeros_like(buf)
        pg.all_to_all(out, buf)
        rep.check(
            f"all_to_all/{dt}/{count}",
            out,
            np.stack([block(p, r, count, dt) for p in range(n)]),
            same_everywhere=False,
        )
    for salt, dt, scale in ((1, "int32", 1), (2, "float64", 1), (3, "uint8", 40_000)):
        sizes = [[((3 * p + 5 * q + salt) % 7) * scale for q in range(n)] for p in range(n)]
        ins, outs = sizes[r], [sizes[p][r] for p in range(n)]
        buf = np.concatenate([block(r, q, ins[q], dt, salt) for q in range(n)])
        out = np.zeros(sum(outs), dt)
        pg.all_to_all(out, buf, out_splits=outs, in_splits=ins)
        rep.check(
            f"all_to_all_v/{dt}/{salt}",
            out,
            np.concatenate([block(p, r, sizes[p][r], dt, salt) for p in range(n)]),
            same_everywhere=False,
        )
    for root in range(n):
        for count, dt in ((0, "int16"), (5, "float32"), (100_000, "float64")):
            xs = inputs(n, count, dt, S, seed=30 + root)
            out = np.zeros((n, count), dt) if r == root else None
            pg.gather(out, xs[r], dst=root)
            if r == root:
                rep.check(f"gather/{root}/{dt}/{count}", out, np.stack(xs), same_everywhere=False)
            buf = np.stack([block(root, q, count, dt, 40) for q in range(n)]) if r == root else None
            got = np.zeros(count, dt)
            pg.scatter(got, buf, src=root)
            rep.check(
                f"scatter/{root}/{dt}/{count}",
                got,
                block(root, r, count, dt, 40),
                same_everywhere=False,
            )


def scale(pg, rep):
    """A lean conformance pass for many ranks on few cores (8, 16): every all_reduce algorithm
    at counts 0, 1, odd and multi-segment with three op/dtype pairs, then each other collective
    once, each checked against numpy here and by digest across ranks in the test."""
    n, r = pg.world_size, pg.rank
    rep.info["routes"] = sorted(set(pg.transport.kinds.values()))
    pairs = [(S, "float32"), (MX, "int16"), (A, "float64")]
    for alg in ("ring", "tree", "direct", "naive", "hierarchical", "auto"):
        counts = (0, 1, 2 * n + 1) if alg in ("direct", "naive") else (0, 1, 2 * n + 1, 40_000)
        for count in counts:  # 40,000 x 4-8 B: several 64 KiB segments per chunk
            for op, dt in pairs:
                xs = inputs(n, count, dt, op, seed=count)
                buf = xs[r].copy()
                pg.all_reduce(buf, op=op, algorithm=alg)
                rep.check(f"all_reduce/{alg}/{op.name}/{dt}/{count}", buf, *expected(xs, op, dt))
    for root in (0, n - 1):
        data = make_input(root, 2 * n + 1, "int32", S, seed=7)
        buf = data.copy() if r == root else np.zeros(2 * n + 1, "int32")
        pg.broadcast(buf, src=root)
        rep.check(f"broadcast/{root}", buf, data)
        xs = inputs(n, 2 * n + 1, "float32", S, seed=root)
        buf = xs[r].copy()
        pg.reduce(buf, dst=root)
        ref, tol = expected(xs, S, "float32")
        rep.check(
            f"reduce/{root}",
            buf,
            *((ref, tol) if r == root else (xs[r], None)),
            same_everywhere=False,
        )
    xs = inputs(n, 5, "int64", S, seed=3)
    out = np.full((n, 5), 99, "int64")
    pg.all_gather(out, xs[r])
    rep.check("all_gather", out, np.stack(xs))
    xs = inputs(n, n * 3, "float32", S, seed=4)
    out = np.zeros(3, "float32")
    pg.reduce_scatter(out, xs[r])
    ref, tol = expected(xs, S, "float32")
    rep.check(
        "reduce_scatter", out, ref[3 * r : 3 * r + 3], tol[3 * r : 3 * r + 3], same_everywhere=False
    )
    got = np.zeros(7)
    w = pg.send(np.full(7, r + 1.0), dst=(r + 1) % n, async_op=True)
    pg.recv(got, src=(r - 1) % n)
    w.wait()
    rep.check("send_recv", got, np.full(7, (r - 1) % n + 1.0), same_everywhere=False)
    pg.barrier()


def torch_tensors(pg, rep):
    import torch

    n, r = pg.world_size, pg.rank
    for alg in ("ring", "tree"):
        t = torch.arange(10, dtype=torch.float32) * (r + 1)
        pg.all_reduce(t, algorithm=alg)
        rep.check(f"torch/f32/{alg}", t.numpy(), np.arange(10) * n * (n + 1) / 2)
    t = torch.full((3, 5), r + 1.0, dtype=torch.bfloat16)  # small integers: exact in bf16
    pg.all_reduce(t, op=cl.ReduceOp.SUM)
    rep.check("torch/bf16", t.float().numpy(), np.full((3, 5), n * (n + 1) / 2))
    t = torch.arange(6, dtype=torch.int64) if r == 0 else torch.zeros(6, dtype=torch.int64)
    pg.broadcast(t, src=0)
    rep.check("torch/broadcast/i64", t.numpy(), np.arange(6))
    out = torch.zeros(n, 2, dtype=torch.float64)
    pg.all_gather(out, torch.tensor([r, -r], dtype=torch.float64))
    rep.check("torch/all_gather", out.numpy(), np.array([[q, -q] for q in range(n)]))
    rep.info["torch"] = torch.__version__


def all_reduce_ok(pg, rep, key):
    n = pg.world_size
    buf = np.full(5, pg.rank + 1, np.int64)
    pg.all_reduce(buf)
    rep.check(key, buf, np.full(5, n * (n + 1) // 2))


def mismatch(pg, rep, outdir):
    """Rank 1 differs from the others in one way per case; afterwards the group still works."""
    r, n = pg.rank, pg.world_size
    cases = {
        "count": lambda: pg.all_reduce(np.ones(8 if r == 1 else 7, np.float32)),
        "dtype": lambda: pg.all_reduce(np.ones(7, np.float64 if r == 1 else np.float32)),
        "op": lambda: pg.all_reduce(
            np.ones(7, np.float32), op=cl.ReduceOp.MAX if r == 1 else cl.ReduceOp.SUM
        ),
        "algorithm": lambda: pg.all_reduce(
            np.ones(7, np.float32), algorithm="tree" if r == 1 else "ring"
        ),
        "kind": lambda: (
            pg.reduce(np.ones(7, np.float32), dst=0)
            if r == 1
            else pg.all_reduce(np.ones(7, np.float32), algorithm="ring")
        ),
        "all_to_all": lambda: pg.all_to_all(
            np.zeros((n, 2 + (r == 1))), np.ones((n, 2 + (r == 1)))
        ),
        # rank 1 sends rank 2 one element more than rank 2 expects: only rank 2 can see it
        "all_to_all splits": lambda: pg.all_to_all(
            np.zeros(n),
            np.ones(n + (r == 1)),
            out_splits=[1] * n,
            in_splits=[1 + (r == 1 and q == 2) for q in range(n)],
        ),
        "gather": lambda: pg.gather(np.zeros((n, 2)), np.ones(2), dst=1 if r == 1 else 0),
        "scatter": lambda: pg.scatter(
            np.zeros(2, np.float32 if r == 1 else np.float64),
            np.zeros((n, 2), np.float32 if r == 1 else np.float64),
        ),
    }
    for name, call in cases.items():
        t0 = time.monotonic()
        try:
            call()
            rep.failures.append(f"rank {r}: mismatch in {name} raised nothing")
        except cl.CollectiveMismatch as exc:
            rep.error(name, exc)
            rep.info[f"{name}_s"] = time.monotonic() - t0
        except Exception as exc:  # the wrong error is a failure, with its text
            rep.failures.append(f"rank {r}: mismatch in {name} raised {exc!r}")
        all_reduce_ok(pg, rep, f"after/{name}")
    # Last, as it may leave the group unusable (a stall is a failure): no message ever flows
    # between rank 1 and a rank running the other op -- rank 1 waits for rank 0 in broadcast,
    # rank 0 waits for rank 1 in the tree's reduce -- so no header can show the mismatch.
    t0 = time.monotonic()
    try:
        if r == 1:
            pg.broadcast(np.ones(7, np.float32), src=0, timeout=3.0 * SCALE)
        else:
            pg.all_reduce(np.ones(7, np.float32), algorithm="tree", timeout=3.0 * SCALE)
        rep.failures.append(f"rank {r}: silent mismatch raised nothing")
    except cl.CollectiveError as exc:
        rep.error("silent", exc)
    rep.info["silent_s"] = time.monotonic() - t0
    # Leave only when every rank has its verdict, as a job leaves after its last op: a rank
    # that left at once would race its own abort frames (in flight to a rank still waiting)
    # with the coordinator's "rank left" notice, a different event from the one under test.
    open(os.path.join(outdir, f"silent-done-{r}"), "w").close()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(
        os.path.exists(os.path.join(outdir, f"silent-done-{q}")) for q in range(n)
    ):
        time.sleep(0.02)


def never_joins(pg, rep):
    """Rank 2 never calls the op; ranks 0 and 1 time out (2 s) and must name rank 2."""
    if pg.rank == 2:
        time.sleep(6)  # not a wait: absent past the others' timeout and their diagnosis
        return
    t0 = time.monotonic()
    try:
        pg.all_reduce(np.ones(4, np.float32), timeout=2.0)
        rep.failures.append(f"rank {pg.rank}: all_reduce without rank 2 returned")
    except (cl.CollectiveTimeout, cl.PeerFailure) as exc:
        rep.error("timeout", exc)
    rep.info["waited_s"] = time.monotonic() - t0
    # Stay (as rank 2 does) until both have had their verdict: the first to leave would
    # otherwise reach the other, on a loaded machine, as "rank 0 left" before its own.
    time.sleep(max(0.0, 5.0 - (time.monotonic() - t0)))  # not a wait: present until then


def garbage(pg, rep):
    """Rank 0 throws junk at rank 1's ROUTER between correct ops; rank 1 must drop it (and log
    it) and go on computing correct results."""
    import msgpack
    import zmq

    from collectives.transport import wire

    all_reduce_ok(pg, rep, "before")
    if pg.rank == 0:
        t = pg.transport
        endpoint = t.routes[1]  # rank 1's ROUTER (tcp in this scenario)
        ctx = zmq.Context()
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.ROUTING_ID, b"1")  # a routing id that rank 1's ROUTER accepts
        raw.connect(endpoint)
        raw.send(b"not even a header")  # 1 frame
        raw.send_multipart([b"\x00\xff garbage", b"payload"])  # junk header
        raw.send_multipart([msgpack.packb(["wrong", "shape"]), b""])  # not our header
        seq = t.progress().seq
        raw.send_multipart(
            [
                wire.encode_header(wire.DATA, t.generation, seq + 1, 1, 0, "x", 0, 0, None),
                b"\x00" * 20,
            ]
        )  # rank 1 to itself
        raw.close(linger=2000)
        nobody = ctx.socket(zmq.DEALER)
        nobody.setsockopt(zmq.ROUTING_ID, b"junk-id")  # not a rank at all
        nobody.connect(endpoint)
        nobody.send_multipart([b"\x01\x02", b"\x03"])
        nobody.close(linger=2000)
        ctx.term()
        # From rank 0's own socket: a frame of another generation and one of an old op --
        # a real peer's stale traffic, which only the header can tell apart.
        old_seq = max(seq - 1, 0)
        t.post(
            1,
            wire.encode_header(wire.DATA, t.generation + 7, seq + 1, 0, 0, "x", 0, 0, None),
            np.zeros(5, np.int64),
            False,
        )
        t.post(
            1,
            wire.encode_header(wire.DATA, t.generation, old_seq, 0, 0, "x", 0, 0, None),
            np.zeros(5, np.int64),
            False,
        )
        if t.tcp_endpoint and t.routes[1].startswith("tcp://"):
            host, port = t.routes[1][len("tcp://") :].rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=5) as s:  # not ZeroMQ
                s.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(range(256)) * 4)
        # not a wait: the junk lands before or in the next op, and must not reach a sum
        time.sleep(0.5)
    for k in range(3):
        all_reduce_ok(pg, rep, f"after/{k}")
    xs = inputs(pg.world_size, 1000, "float32", S)
    buf = xs[pg.rank].copy()
    pg.all_reduce(buf, algorithm="ring")
    rep.check("after/ring", buf, *expected(xs, S, "float32"))


def report_env(pg, rep):
    """What the launcher (or the test) gave this process, and a line on each stream."""
    rep.info["env"] = {
        k: os.environ.get(k)
        for k in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "COLLECTIVES_COORDINATOR",
        )
    }
    rep.info["pid"] = os.getpid()
    print(f"hello from rank {pg.rank}\nsecond line", flush=True)
    print(f"stderr of rank {pg.rank}", file=sys.stderr, flush=True)


def fail_rank1(pg, rep, outdir):
    """Rank 1 exits with status 3 after one op; the others would run for a minute."""
    all_reduce_ok(pg, rep, "before")
    rep.info["pid"] = os.getpid()
    rep.write(outdir)
    pg.barrier()  # every rank has written its pid before rank 1 fails
    if pg.rank == 1:
        print("rank 1 fails now", flush=True)
        os._exit(3)
    time.sleep(60)  # not a wait: the others run on until the launcher ends them


def wait_for_signal(pg, rep, outdir):
    def on_term(signum, frame):
        print(f"rank {pg.rank} got {signal.Signals(signum).name}", flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    rep.info["pid"] = os.getpid()
    rep.write(outdir)  # the test signals once both files exist: handlers are in place
    print(f"rank {pg.rank} waiting", flush=True)
    time.sleep(60)  # not a wait: until the signal ends it


def main():
    scenario, outdir = sys.argv[1], sys.argv[2]
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    with_torch = os.environ.get("TEST_WITH_TORCH") == "1"
    if with_torch:
        import torch  # noqa: F401  (before any op, so buffers.py sees it)
    if os.environ.get("TEST_ONE_CPU") == "1":  # every rank on one CPU: a crowded host
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    pg = cl.init_process_group(
        timeout=float(os.environ.get("TEST_OP_TIMEOUT", "20")), segment_bytes=64 << 10
    )
    rep = Report(pg.rank)
    report_env(pg, rep)
    code = 0
    try:
        if scenario == "conformance":
            conformance(pg, rep, with_torch)
        elif scenario == "scale":
            scale(pg, rep)
        elif scenario == "mismatch":
            mismatch(pg, rep, outdir)
        elif scenario == "never_joins":
            never_joins(pg, rep)
        elif scenario == "garbage":
            garbage(pg, rep)
        elif scenario == "fail_rank1":
            fail_rank1(pg, rep, outdir)
        elif scenario == "wait_for_signal":
            wait_for_signal(pg, rep, outdir)
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    except Exception as exc:
        rep.failures.append(f"rank {pg.rank} raised {exc!r}\n{traceback.format_exc()}")
        code = 1
    rep.write(outdir)
    sys.stdout.flush()
    sys.stderr.flush()
    pg.destroy()  # announces the departure; a peer finishing its last op still completes
    os._exit(code)


if __name__ == "__main__":
    main()
