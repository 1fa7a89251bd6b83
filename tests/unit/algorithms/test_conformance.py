"""Conformance over the in-process transport: every collective against numpy.

Invariants checked throughout:
  * all_reduce: the result equals numpy's reduction of the n inputs (exactly for integers and
    MIN/MAX, within a dtype-derived rounding bound for floating SUM/AVG/PRODUCT), and every
    rank holds the *same bytes* (principle 2);
  * reduce: the root gets the reduction, every other rank's buffer is unchanged;
  * broadcast: every rank ends with the source's bytes;
  * all_gather: out[r] is rank r's input; reduce_scatter: out is the reduction of chunk `rank`,
    and neither modifies its input;
  * all_to_all: out[p] on rank r is block r of rank p's input (equal blocks, and uneven ones
    of sizes given per pair), and the input is unchanged;
  * gather: row p of the root's out is rank p's input; scatter: rank p gets row p of the
    root's input; inputs unchanged, non-roots' unused buffers untouched;
  * BAND/BOR/BXOR (integers and bool) in every reducing collective, through ALL_OPS.
The all_reduce matrix is the full cross product (algorithm x op x dtype x count) at world sizes
1 to 4, and every op and count with a rotating sample of three dtypes at 5 to 8 (each dtype is
met at some size by every algorithm), to keep the file fast.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import collectives as cl
from support.timing import bound, scaled
from support.reference import (
    ALL_DTYPES,
    ALL_OPS,
    assert_identical,
    assert_matches,
    expected,
    make_input,
    op_applies,
)

# in-process: part of `make test-fast`
pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

ALGORITHMS = (
    "ring",
    "tree",
    "naive",
    "direct",
    "auto",
    "gloo_ring",
    "halving_doubling",
    "double_tree",
)
FULL_WORLDS = (1, 2, 3, 4)
WORLDS = tuple(range(1, 9))


def counts_for(n: int) -> list[int]:
    """0, 1, fewer than ranks, not a multiple of n, a few thousand."""
    return sorted({0, 1, max(n - 1, 1), 3 * n + 1, 2999})


def dtypes_for(n: int, salt: int) -> tuple[str, ...]:
    if n in FULL_WORLDS:
        return ALL_DTYPES
    k = (n + salt) % len(ALL_DTYPES)
    return tuple(ALL_DTYPES[(k + 4 * i) % len(ALL_DTYPES)] for i in range(3))


def run_all_reduce_cases(n, algorithm, cases, segment_bytes=None):
    """cases: (op, dtype, count). One simulated group runs them all, in order."""

    def body(pg):
        out = []
        for op, dt, c in cases:
            x = make_input(pg.rank, c, dt, op)
            pg.all_reduce(x, op=op, algorithm=algorithm)
            out.append(x)
        return out

    results = cl.simulate(n, body, timeout=20, segment_bytes=segment_bytes)
    for i, (op, dt, c) in enumerate(cases):
        what = f"all_reduce {algorithm} n={n} {op!r} {dt} count={c}"
        got = [results[r][i] for r in range(n)]
        assert all(g.dtype == np.dtype(dt) and g.shape == (c,) for g in got), what
        assert_identical([g.tobytes() for g in got], what)
        ref, tol = expected([make_input(r, c, dt, op) for r in range(n)], op, dt)
        assert_matches(got[0], ref, tol, what)


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_all_reduce_matrix(algorithm, n):
    cases = [
        (op, dt, c)
        for op in ALL_OPS
        for dt in dtypes_for(n, ALGORITHMS.index(algorithm))
        for c in counts_for(n)
        if op_applies(op, dt)
    ]
    run_all_reduce_cases(n, algorithm, cases)


@pytest.mark.parametrize("n", (9, 12))
def test_halving_doubling_past_eight(n):
    """Halving-doubling folds 2(n-p) ranks into others when n is not a power of two p: 9 folds
    one pair into 8, 12 folds four pairs (every op, three dtypes, every count)."""
    cases = [
        (op, dt, c)
        for op in ALL_OPS
        for dt in dtypes_for(n, ALGORITHMS.index("halving_doubling"))
        for c in counts_for(n)
        if op_applies(op, dt)
    ]
    run_all_reduce_cases(n, "halving_doubling", cases)


def test_double_tree_on_nine():
    """The conformance matrix stops at 8 ranks; the double tree is asked for up to 9: an odd
    world, whose trees' roots differ in height (every op, three dtypes, every count)."""
    n = 9
    cases = [
        (op, dt, c)
        for op in ALL_OPS
        for dt in dtypes_for(n, ALGORITHMS.index("double_tree"))
        for c in counts_for(n)
        if op_applies(op, dt)
    ]
    run_all_reduce_cases(n, "double_tree", cases)


@pytest.mark.parametrize("n", (2, 3, 5, 8))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_all_reduce_multi_segment(algorithm, n):
    """segment_bytes=64 cuts every chunk into many pipelined segments, of unequal counts
    (chunks differ by one element), so segment bookkeeping is exercised at every hop."""
    cases = [
        (op, dt, c)
        for op in (cl.ReduceOp.SUM, cl.ReduceOp.AVG, cl.ReduceOp.MAX)
        for dt in ("int16", "float16", "float32")
        for c in (1000, 8 * n + 3)
        if op_applies(op, dt)
    ]
    run_all_reduce_cases(n, algorithm, cases, segment_bytes=64)


@pytest.mark.parametrize("n", (2, 3))
def test_auto_picks_the_same_algorithm_everywhere_for_large_buffers(n):
    """400 KB is past every 'direct' and 'tree' crossover: auto must agree across ranks (else
    the descriptors would mismatch) and still be correct."""
    run_all_reduce_cases(
        n, "auto", [(cl.ReduceOp.SUM, "float32", 100_000), (cl.ReduceOp.MIN, "int64", 60_000)]
    )


def test_all_reduce_keeps_shape_and_writes_in_place():
    def body(pg):
        x = np.full((3, 4, 5), pg.rank + 1, dtype=np.int32)
        before = x.__array_interface__["data"][0]
        pg.all_reduce(x)
        return x, before == x.__array_interface__["data"][0]

    for x, same_memory in cl.simulate(3, body):
        assert same_memory and x.shape == (3, 4, 5)
        assert (x == 6).all()  # ranks contribute 1, 2, 3; the sum is 6


# --- reduce ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", WORLDS)
def test_reduce_every_dst(n):
    """Root dst gets the reduction; every other rank's buffer is exactly its input.
    Every op x dtype at n = 2, 3; beyond, each dst gets two ops and three dtypes, rotating."""

    def ops_dtypes(dst):
        if n in (2, 3):
            return ALL_OPS, ALL_DTYPES
        return (
            [ALL_OPS[(dst + k) % len(ALL_OPS)] for k in range(2)],
            dtypes_for(n if n > 4 else 6, dst),
        )

    cases = [
        (dst, op, dt, c)
        for dst in range(n)
        for op in ops_dtypes(dst)[0]
        for dt in ops_dtypes(dst)[1]
        for c in (0, 1, 2 * n + 1, 1500)
        if op_applies(op, dt)
    ]

    def body(pg):
        out = []
        for dst, op, dt, c in cases:
            x = make_input(pg.rank, c, dt, op)
            pg.reduce(x, dst=dst, op=op)
            out.append(x)
        return out

    results = cl.simulate(n, body, timeout=20)
    for i, (dst, op, dt, c) in enumerate(cases):
        what = f"reduce n={n} dst={dst} {op!r} {dt} count={c}"
        inputs = [make_input(r, c, dt, op) for r in range(n)]
        ref, tol = expected(inputs, op, dt)
        assert_matches(results[dst][i], ref, tol, what)
        for r in range(n):
            if r != dst:
                assert results[r][i].tobytes() == inputs[r].tobytes(), (
                    f"{what}: non-root rank {r}'s buffer was modified"
                )


def test_reduce_multi_segment_keeps_inner_nodes_inputs():
    """n=8: ranks 2, 4, 6 are inner nodes of the binomial tree (they add their children's
    segments); with 64-byte segments their buffers must still come back untouched."""
    n, c = 8, 500
    op = cl.ReduceOp.SUM

    def body(pg):
        x = make_input(pg.rank, c, "float32", op)
        pg.reduce(x, dst=3, op=op)
        return x

    results = cl.simulate(n, body, segment_bytes=64)
    inputs = [make_input(r, c, "float32", op) for r in range(n)]
    ref, tol = expected(inputs, op, "float32")
    assert_matches(results[3], ref, tol, "reduce root 3")
    for r in range(n):
        if r != 3:
            assert results[r].tobytes() == inputs[r].tobytes(), f"rank {r} modified"


# --- broadcast -------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", WORLDS)
def test_broadcast_every_src(n):
    """Every dtype from every src at n <= 3; beyond, three dtypes per src, rotating."""
    cases = [
        (src, dt, c)
        for src in range(n)
        for dt in (ALL_DTYPES if n <= 3 else dtypes_for(6, src))
        for c in (0, 1, n + 2, 1200)
    ]

    def body(pg):
        out = []
        for src, dt, c in cases:
            x = make_input(pg.rank, c, dt, cl.ReduceOp.SUM, seed=src)
            pg.broadcast(x, src=src)
            out.append(x.tobytes())
        return out

    results = cl.simulate(n, body, timeout=20)
    for i, (src, dt, c) in enumerate(cases):
        want = make_input(src, c, dt, cl.ReduceOp.SUM, seed=src).tobytes()
        for r in range(n):
            assert results[r][i] == want, f"broadcast n={n} src={src} {dt} count={c}: rank {r}"


@pytest.mark.parametrize("n", (3, 8))
def test_broadcast_multi_segment(n):
    def body(pg):
        x = np.arange(1001, dtype=np.float64) * (pg.rank + 1)
        pg.broadcast(x, src=n - 1)
        return x

    for x in cl.simulate(n, body, segment_bytes=64):
        assert np.array_equal(x, np.arange(1001, dtype=np.float64) * n)


# --- all_gather and reduce_scatter -------------------------------------------------------------------
@pytest.mark.parametrize("n", WORLDS)
def test_all_gather(n):
    cases = [(dt, c) for dt in ALL_DTYPES for c in (0, 1, n + 1, 700)]

    def body(pg):
        out = []
        for dt, c in cases:
            x = make_input(pg.rank, c, dt, cl.ReduceOp.SUM)
            keep = x.copy()
            gathered = np.zeros((n, c), dtype=dt)
            pg.all_gather(gathered, x)
            assert np.array_equal(x, keep), "all_gather modified its input"
            out.append(gathered.tobytes())
        return out

    results = cl.simulate(n, body, timeout=20)
    for i, (dt, c) in enumerate(cases):
        want = np.stack([make_input(r, c, dt, cl.ReduceOp.SUM) for r in range(n)]).tobytes()
        for r in range(n):
            assert results[r][i] == want, f"all_gather n={n} {dt} count={c}: rank {r}"


def test_all_gather_multi_segment():
    n, c = 5, 301

    def body(pg):
        x = np.arange(c, dtype=np.int32) + 1000 * pg.rank
        out = np.empty((n, c), dtype=np.int32)
        pg.all_gather(out, x)
        return out

    want = np.stack([np.arange(c, dtype=np.int32) + 1000 * r for r in range(n)])
    for out in cl.simulate(n, body, segment_bytes=64):
        assert np.array_equal(out, want)


@pytest.mark.parametrize("n", WORLDS)
def test_reduce_scatter(n):
    dtypes = ALL_DTYPES if n in (2, 3, 8) else ("int16", "uint64", "float16", "float32")
    cases = [
        (op, dt, c) for op in ALL_OPS for dt in dtypes for c in (0, 1, 3, 500) if op_applies(op, dt)
    ]

    def body(pg):
        out = []
        for op, dt, c in cases:
            x = make_input(pg.rank, n * c, dt, op)
            keep = x.copy()
            o = np.zeros(c, dtype=dt)
            pg.reduce_scatter(o, x, op=op)
            assert x.tobytes() == keep.tobytes(), "reduce_scatter modified its input"
            out.append(o)
        return out

    results = cl.simulate(n, body, timeout=20)
    for i, (op, dt, c) in enumerate(cases):
        ref, tol = expected([make_input(r, n * c, dt, op) for r in range(n)], op, dt)
        for r in range(n):
            what = f"reduce_scatter n={n} {op!r} {dt} count={c} rank {r}"
            assert_matches(results[r][i], ref[r * c : (r + 1) * c], tol[r * c : (r + 1) * c], what)


def test_reduce_scatter_multi_segment():
    n, c = 4, 250

    def body(pg):
        x = np.arange(n * c, dtype=np.int64) * (pg.rank + 1)
        o = np.empty(c, dtype=np.int64)
        pg.reduce_scatter(o, x)
        return o

    full = np.arange(n * c, dtype=np.int64) * (n * (n + 1) // 2)  # sum of factors 1..n
    for r, o in enumerate(cl.simulate(n, body, segment_bytes=64)):
        assert np.array_equal(o, full[r * c : (r + 1) * c])


# --- all_to_all, gather, scatter --------------------------------------------------------------------
def block(src: int, dst: int, count: int, dt, seed: int = 0) -> np.ndarray:
    """What rank `src` sends rank `dst`: distinct for every pair (and every element)."""
    return make_input(src, count, dt, cl.ReduceOp.SUM, seed=seed * 1000 + dst + 1)


@pytest.mark.parametrize("n", WORLDS)
def test_all_to_all(n):
    """Equal blocks: rank r's out[p] is rank p's block for r, every dtype at n <= 4 (three,
    rotating, beyond), counts 0, 1 and odd per block; buf is left unchanged."""
    cases = [
        (dt, c)
        for dt in (ALL_DTYPES if n in FULL_WORLDS else dtypes_for(n, 0))
        for c in (0, 1, 3, 2 * n + 1, 301)
    ]

    def body(pg):
        got = []
        for dt, c in cases:
            buf = np.stack([block(pg.rank, p, c, dt) for p in range(n)])
            keep = buf.copy()
            out = np.zeros((n, c), dtype=dt)
            pg.all_to_all(out, buf)
            assert buf.tobytes() == keep.tobytes(), "all_to_all modified its input"
            got.append(out)
        return got

    results = cl.simulate(n, body, timeout=20)
    for i, (dt, c) in enumerate(cases):
        for r in range(n):
            want = np.stack([block(p, r, c, dt) for p in range(n)])
            assert results[r][i].tobytes() == want.tobytes(), (
                f"all_to_all n={n} {dt} count={c}: rank {r}"
            )


def uneven_splits(n: int, salt: int) -> list[list[int]]:
    """sizes[p][q]: elements rank p sends rank q -- 0, 1 and odd sizes, all different."""
    return [[(3 * p + 5 * q + salt) % 7 for q in range(n)] for p in range(n)]


@pytest.mark.parametrize("n", WORLDS)
def test_all_to_all_uneven(n):
    """Splits per pair (Alltoallv): rank r sends sizes[r][q] elements to q and receives
    sizes[p][r] from p, in rank order; some blocks empty; a side without splits is equal."""
    cases = [
        (dt, salt) for dt in ("bool", "int8", "uint64", "float16", "float64") for salt in (0, 3)
    ]

    def body(pg):
        r, got = pg.rank, []
        for dt, salt in cases:
            sizes = uneven_splits(n, salt)
            ins = sizes[r]
            outs = [sizes[p][r] for p in range(n)]
            buf = np.concatenate([block(r, q, ins[q], dt, seed=salt) for q in range(n)])
            out = np.zeros(sum(outs), dtype=dt)
            pg.all_to_all(out, buf, out_splits=outs, in_splits=ins)
            got.append(out)
        # in_splits only: what comes in is equal (2 per rank), what goes out is not
        buf = np.arange(2 * n, dtype=np.int32) + 100 * r
        out = np.zeros(2 * n, dtype=np.int32)
        pg.all_to_all(out, buf, in_splits=[2] * n)
        got.append(out)
        return got

    results = cl.simulate(n, body, timeout=20)
    for i, (dt, salt) in enumerate(cases):
        sizes = uneven_splits(n, salt)
        for r in range(n):
            want = np.concatenate([block(p, r, sizes[p][r], dt, seed=salt) for p in range(n)])
            assert results[r][i].tobytes() == want.tobytes(), (
                f"all_to_all uneven n={n} {dt} salt={salt}: rank {r}"
            )
    for r in range(n):
        want = np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * p for p in range(n)])
        assert np.array_equal(results[r][-1], want)


@pytest.mark.parametrize("n", (2, 3, 5))
def test_all_to_all_multi_segment(n):
    """segment_bytes=64: every block is many segments (equal and uneven forms)."""
    c = 101

    def body(pg):
        r = pg.rank
        buf = np.stack([np.arange(c, dtype=np.float64) + 1000 * r + 100_000 * q for q in range(n)])
        out = np.zeros_like(buf)
        pg.all_to_all(out, buf)
        ins = [c + q for q in range(n)]
        outs = [c + r] * n
        ubuf = np.concatenate([np.full(ins[q], r * 10 + q, np.int16) for q in range(n)])
        uout = np.zeros(sum(outs), np.int16)
        pg.all_to_all(uout, ubuf, out_splits=outs, in_splits=ins)
        return out, uout

    for r, (out, uout) in enumerate(cl.simulate(n, body, segment_bytes=64)):
        assert np.array_equal(
            out, np.stack([np.arange(c) + 1000 * p + 100_000 * r for p in range(n)])
        )
        assert np.array_equal(uout, np.repeat([p * 10 + r for p in range(n)], c + r))


@pytest.mark.parametrize("n", WORLDS)
def test_gather_every_dst(n):
    """Row p of the root's out is rank p's buf; nobody's buf changes; a non-root's out (when
    it passes one) is not touched. Every dtype at n <= 3, three per root beyond."""
    cases = [
        (dst, dt, c)
        for dst in range(n)
        for dt in (ALL_DTYPES if n <= 3 else dtypes_for(6, dst))
        for c in (0, 1, n + 2, 700)
    ]

    def body(pg):
        got = []
        for dst, dt, c in cases:
            buf = make_input(pg.rank, c, dt, cl.ReduceOp.SUM, seed=dst)
            keep = buf.copy()
            out = np.zeros((n, c), dtype=dt) if pg.rank == dst or pg.rank % 2 else None
            pg.gather(out, buf, dst=dst)
            assert buf.tobytes() == keep.tobytes(), "gather modified its input"
            got.append(None if out is None else out.tobytes())
        return got

    results = cl.simulate(n, body, timeout=20)
    for i, (dst, dt, c) in enumerate(cases):
        want = np.stack([make_input(r, c, dt, cl.ReduceOp.SUM, seed=dst) for r in range(n)])
        assert results[dst][i] == want.tobytes(), f"gather n={n} dst={dst} {dt} count={c}"
        for r in range(n):
            if r != dst and results[r][i] is not None:
                assert results[r][i] == bytes(n * c * np.dtype(dt).itemsize), (
                    f"gather wrote into rank {r}'s unused out"
                )


@pytest.mark.parametrize("n", WORLDS)
def test_scatter_every_src(n):
    """Rank p's out is row p of the root's buf; the root's buf is unchanged."""
    cases = [
        (src, dt, c)
        for src in range(n)
        for dt in (ALL_DTYPES if n <= 3 else dtypes_for(6, src + 1))
        for c in (0, 1, n + 2, 700)
    ]

    def body(pg):
        got = []
        for src, dt, c in cases:
            buf = np.stack([block(src, p, c, dt) for p in range(n)]) if pg.rank == src else None
            keep = None if buf is None else buf.copy()
            out = np.zeros(c, dtype=dt)
            pg.scatter(out, buf, src=src)
            assert buf is None or buf.tobytes() == keep.tobytes(), "scatter modified its input"
            got.append(out.tobytes())
        return got

    results = cl.simulate(n, body, timeout=20)
    for i, (src, dt, c) in enumerate(cases):
        for r in range(n):
            assert results[r][i] == block(src, r, c, dt).tobytes(), (
                f"scatter n={n} src={src} {dt} count={c}: rank {r}"
            )


@pytest.mark.parametrize("n", (3, 8))
def test_gather_scatter_multi_segment(n):
    c = 333

    def body(pg):
        r = pg.rank
        g = np.zeros((n, c), np.int32) if r == n - 1 else None
        pg.gather(g, np.arange(c, dtype=np.int32) * (r + 1), dst=n - 1)
        s = np.zeros(c, np.int32)
        pg.scatter(s, np.arange(n * c, dtype=np.int32).reshape(n, c) if r == 1 else None, src=1)
        return g, s

    results = cl.simulate(n, body, segment_bytes=64)
    assert np.array_equal(results[n - 1][0], np.arange(c) * np.arange(1, n + 1)[:, None])
    for r, (_, s) in enumerate(results):
        assert np.array_equal(s, np.arange(r * c, (r + 1) * c))


@pytest.mark.parametrize("n", (2, 3, 4))
def test_all_to_all_gather_scatter_mismatches_raise_on_every_rank(n):
    """Rank n-1 differs from the others in one way per case (its count, its splits -- which
    only the rank that receives from it can see --, its root, its kind): every rank raises
    CollectiveMismatch, at once (not at the 5 s timeout), and the next op works."""
    last = n - 1
    cases = {
        "a2a count": lambda pg, odd: pg.all_to_all(np.zeros((n, 2 + odd)), np.ones((n, 2 + odd))),
        "a2a splits": lambda pg, odd: pg.all_to_all(  # rank n-1 sends rank 0 two
            np.zeros(n), np.ones(n + odd), out_splits=[1] * n, in_splits=[1 + odd] + [1] * (n - 1)
        ),
        "gather root": lambda pg, odd: pg.gather(np.zeros((n, 2)), np.ones(2), dst=odd),
        "scatter count": lambda pg, odd: pg.scatter(
            np.zeros(2 + odd), np.zeros((n, 2 + odd)), src=0
        ),
        "kind": lambda pg, odd: (
            pg.gather(np.zeros((n, 2)), np.ones(2))
            if odd
            else pg.scatter(np.zeros(2), np.zeros((n, 2)))
        ),
    }

    def body(pg):
        got = {}
        for name, call in cases.items():
            t0 = time.monotonic()
            try:
                call(pg, int(pg.rank == last))
                got[name] = "returned"
            except cl.CollectiveMismatch:
                quick = time.monotonic() - t0 < bound(2.5, below=5.0, below_scaled=True)
                got[name] = "mismatch" if quick else "slow"
            x = np.ones(3)
            pg.all_reduce(x)
            assert (x == n).all()
        return got

    for r, got in enumerate(cl.simulate(n, body, timeout=scaled(5))):
        assert got == dict.fromkeys(cases, "mismatch"), f"rank {r}: {got}"


# --- barrier, send/recv, async ------------------------------------------------------------------------
@pytest.mark.parametrize("n", (1, 2, 3, 5, 8))
def test_barrier_nobody_leaves_early(n):
    """Rank r arrives r * 30 ms late; whoever leaves the barrier must see every rank arrived."""
    arrived = [False] * n
    lock = threading.Lock()

    def body(pg):
        time.sleep(0.03 * pg.rank)  # not a wait: the ranks arrive in turn
        with lock:
            arrived[pg.rank] = True
        pg.barrier()
        with lock:
            return all(arrived)

    assert cl.simulate(n, body) == [True] * n


@pytest.mark.parametrize("n", (2, 3, 5))
def test_send_recv_ring_shift(n):
    """Rank r sends to r+1 and receives from r-1: everyone ends with its left neighbour's data.
    Two messages per pair, to check per-pair ordering; various dtypes and sizes."""

    def body(pg):
        r = pg.rank
        got = []
        for dt, c in (("float32", 10), ("int8", 0), ("uint64", 3000)):
            mine = make_input(r, c, dt, cl.ReduceOp.SUM)
            w = pg.send(mine, (r + 1) % n, async_op=True)
            inbox = np.empty(c, dtype=dt)
            pg.recv(inbox, (r - 1) % n)
            w.wait()
            got.append(inbox.tobytes())
        return got

    for r, got in enumerate(cl.simulate(n, body)):
        left = (r - 1) % n
        want = [
            make_input(left, c, dt, cl.ReduceOp.SUM).tobytes()
            for dt, c in (("float32", 10), ("int8", 0), ("uint64", 3000))
        ]
        assert got == want, f"rank {r}"


def test_send_recv_interleaved_with_collectives():
    """Point-to-point messages have their own sequence numbers: a send posted before a
    collective is matched by a recv issued after it, and neither confuses the other."""

    def body(pg):
        x = np.full(4, pg.rank + 1.0)
        if pg.rank == 0:
            w = pg.send(np.arange(5, dtype=np.int32), 1, async_op=True)
            pg.all_reduce(x)
            w.wait(timeout=10)
            return x, None
        pg.all_reduce(x)
        y = np.empty(5, dtype=np.int32)
        pg.recv(y, 0)
        return x, y

    (x0, _), (x1, y1) = cl.simulate(2, body)
    assert (x0 == 3).all() and (x1 == 3).all()
    assert np.array_equal(y1, np.arange(5))


@pytest.mark.parametrize("n", (2, 3, 5))
def test_recv_any_takes_whichever_rank_sends_and_keeps_each_ranks_order(n):
    """Rank 0 receives from any source 2(n-1) times while every other rank sends it two
    messages (k, then k + 100, k its rank): recv_any returns the sender, the data is that
    sender's, each sender's two come in the order sent, and the collectives interleaved with
    them (an all_reduce each side of the receives) are undisturbed."""

    def body(pg):
        r = pg.rank
        x = np.full(2, r + 1.0)
        pg.all_reduce(x)
        got = []
        if r == 0:
            for _ in range(2 * (n - 1)):
                b = np.zeros(3)
                got.append((pg.recv_any(b), b[0]))
        else:
            time.sleep(0.01 * (n - r))  # not a wait: later ranks first, arrival order varies
            pg.send(np.full(3, float(r)), 0)
            pg.send(np.full(3, r + 100.0), 0)
        y = np.full(2, r + 1.0)
        pg.all_reduce(y)
        return x[0], y[0], got

    results = cl.simulate(n, body)
    total = n * (n + 1) / 2
    assert all(x == y == total for x, y, _ in results)
    got = results[0][2]
    assert sorted(s for s, _ in got) == sorted(list(range(1, n)) * 2)
    for s in range(1, n):
        assert [v for src, v in got if src == s] == [s, s + 100.0], got


def test_recv_any_times_out_naming_what_it_waited_for():
    def body(pg):
        if pg.rank == 0:
            with pytest.raises(cl.CollectiveTimeout, match="recv from any source"):
                pg.recv_any(np.zeros(2), timeout=0.3)
        return True

    assert cl.simulate(2, body) == [True, True]


@pytest.mark.timeout(20)
def test_posted_receive_does_not_block_a_later_send():
    """Both ranks post a receive, then send, then wait (the MPI/Gloo exchange idiom). The send
    must not queue behind the posted receive: each rank gets the other's data well within the
    5 s op timeout (before posted receives were deferred, this waited until it)."""

    def body(pg):
        peer = 1 - pg.rank
        got = np.zeros(3000)
        t0 = time.monotonic()
        w = pg.recv(got, peer, async_op=True)
        pg.send(np.full(3000, pg.rank + 1.0), peer)
        w.wait()
        return got, time.monotonic() - t0

    quick = bound(2.0, below=5.0, below_scaled=True)  # well within the op timeout
    for r, (got, took) in enumerate(cl.simulate(2, body, timeout=scaled(5.0))):
        assert (got == 2 - r).all() and took < quick, (r, took)


@pytest.mark.timeout(20)
def test_posted_receives_match_messages_in_posting_order():
    """Receives from the same rank, waited in reverse order or followed by a blocking one: the
    first posted still gets the first message sent (as in MPI); is_completed() alone starts a
    posted receive."""

    def body(pg):
        if pg.rank == 0:
            for k in range(1, 5):
                pg.send(np.full(4, float(k)), 1)
            return None
        a, b, c, d = (np.zeros(4) for _ in range(4))
        wa = pg.recv(a, 0, async_op=True)
        wb = pg.recv(b, 0, async_op=True)
        wb.wait()
        assert wa.is_completed() and wa.is_success() and wa.exception() is None
        wc = pg.recv(c, 0, async_op=True)
        pg.recv(d, 0)  # blocking: after the one posted before it
        assert wc.is_completed()
        we = pg.recv(np.zeros(4), 0, async_op=True, timeout=0.5)
        deadline = time.monotonic() + 5  # nobody sends a 5th: polling alone runs it out
        while not we.is_completed() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert isinstance(we.exception(), cl.CollectiveTimeout)
        return a, b, c, d

    _, (a, b, c, d) = cl.simulate(2, body)
    assert [x[0] for x in (a, b, c, d)] == [1, 2, 3, 4]


def test_posted_receive_checks_arguments_at_once_and_fails_cleanly_after_destroy():
    """Bad arguments raise when the receive is posted, not when it is waited on; a receive
    posted on a group destroyed before it ran raises on wait(), naming the group's fate."""

    def body(pg):
        if pg.rank == 1:
            with pytest.raises(ValueError, match="timeout must be > 0"):
                pg.recv(np.zeros(2), 0, async_op=True, timeout=0)
            with pytest.raises(TypeError, match="timeout must be a number"):
                pg.recv(np.zeros(2), 0, async_op=True, timeout="5")
            w = pg.recv(np.zeros(2), 0, async_op=True)
            pg.destroy()
            with pytest.raises(cl.CollectiveError, match="destroyed"):
                w.wait()
            assert isinstance(w.exception(), cl.CollectiveError)
        return True

    assert cl.simulate(2, body) == [True, True]


@pytest.mark.parametrize("algorithm", ("ring", "tree", "direct"))
def test_async_ops_complete_in_issue_order(algorithm):
    """Several async ops in flight; waited in reverse order; each result is right."""
    n = 3

    def body(pg):
        bufs = [np.full(50, (pg.rank + 1) * (k + 1), dtype=np.int64) for k in range(4)]
        works = [pg.all_reduce(b, algorithm=algorithm, async_op=True) for b in bufs]
        assert all(isinstance(w, cl.Work) for w in works)
        g = np.zeros((n, 2), dtype=np.int64)
        wg = pg.all_gather(g, np.full(2, pg.rank, dtype=np.int64), async_op=True)
        for w in reversed(works):
            assert w.wait(timeout=10) is True
            assert w.is_completed() and w.exception() is None
        wg.wait(timeout=10)
        return [b[0] for b in bufs], g

    for sums, g in cl.simulate(n, body):
        assert sums == [6 * (k + 1) for k in range(4)]  # sum of (r+1)(k+1) over r = 6(k+1)
        assert np.array_equal(g, np.repeat(np.arange(n), 2).reshape(n, 2))


def test_async_failure_is_kept_in_work():
    """A failing async op: is_completed() becomes True, exception() holds the error, wait()
    raises it; the next op on the group still works."""

    def body(pg):
        x = np.ones(8 if pg.rank == 0 else 9, dtype=np.float32)
        w = pg.all_reduce(x, async_op=True, timeout=5)
        with pytest.raises(cl.CollectiveMismatch):
            w.wait(timeout=10)
        assert w.is_completed() and isinstance(w.exception(), cl.CollectiveMismatch)
        y = np.ones(3, dtype=np.float32)
        pg.all_reduce(y)
        return y

    for y in cl.simulate(2, body):
        assert (y == 2).all()


def test_async_blocking_after_async_waits_its_turn():
    """A blocking op issued while async ops are queued runs after them, not inline."""

    def body(pg):
        a = np.full(10, pg.rank + 1.0)
        w = pg.all_reduce(a, async_op=True)
        b = np.full(10, 10.0 * (pg.rank + 1))
        pg.all_reduce(b)  # must not overtake `a` (sequence numbers would clash)
        assert w.is_completed()
        return a[0], b[0]

    assert cl.simulate(2, body) == [(3.0, 30.0)] * 2


# --- torch tensors -------------------------------------------------------------------------------------
try:
    import torch
except ImportError:  # torch is an optional extra
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
TORCH_DTYPES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
)


@needs_torch
@pytest.mark.parametrize("algorithm", ("ring", "tree", "naive", "direct"))
def test_torch_all_reduce(algorithm):
    """Small integer-valued inputs: exact in every dtype (bfloat16 included), so the result
    must equal torch's own sum / max exactly, and be the same bytes on every rank."""
    n = 3
    cases = [(dt, op, c) for dt in TORCH_DTYPES for op in ("SUM", "MAX") for c in (0, 1, 7, 1000)]

    def inp(r, dt, c):
        return ((torch.arange(c) * (r + 3)) % 11 - 5 * (dt != "uint8")).to(getattr(torch, dt))

    def body(pg):
        out = []
        for dt, op, c in cases:
            t = inp(pg.rank, dt, c)
            ptr = t.data_ptr()
            pg.all_reduce(t, op=getattr(cl.ReduceOp, op), algorithm=algorithm)
            assert t.data_ptr() == ptr, "the tensor must be updated in place"
            out.append(t)
        return out

    results = cl.simulate(n, body)
    for i, (dt, op, c) in enumerate(cases):
        stack = torch.stack([inp(r, dt, c) for r in range(n)])
        ref = stack.sum(0, dtype=stack.dtype) if op == "SUM" else stack.max(0).values
        for r in range(n):
            got = results[r][i]
            assert got.dtype == getattr(torch, dt)
            assert torch.equal(got, ref), f"torch {algorithm} {dt} {op} count={c} rank {r}"
            assert (
                got.view(torch.uint8).numpy().tobytes()
                == results[0][i].view(torch.uint8).numpy().tobytes()
            )


@needs_torch
def test_torch_bfloat16_avg_is_rounded_once_and_identical():
    n = 3

    def body(pg):
        t = (torch.linspace(-2, 2, 257) * (pg.rank + 1)).to(torch.bfloat16)
        pg.all_reduce(t, op=cl.ReduceOp.AVG, algorithm="ring")
        return t

    results = cl.simulate(n, body)
    exact = (
        sum((torch.linspace(-2, 2, 257) * (r + 1)).to(torch.bfloat16).float() for r in range(n)) / n
    )
    for t in results:
        assert t.dtype == torch.bfloat16
        assert torch.equal(t.view(torch.int16), results[0].view(torch.int16))
        # one rounding to bfloat16 (8 bits of mantissa) plus float32 noise
        assert torch.allclose(t.float(), exact, rtol=2**-8, atol=1e-6)


@needs_torch
def test_torch_other_collectives():
    n = 3

    def body(pg):
        r = pg.rank
        b = torch.full((4,), float(r), dtype=torch.bfloat16)
        pg.broadcast(b, src=2)
        red = torch.arange(6, dtype=torch.int32) + r
        pg.reduce(red, dst=1)
        g = torch.zeros(n, 2, dtype=torch.float16)
        pg.all_gather(g, torch.full((2,), r + 0.5, dtype=torch.float16))
        rs = torch.zeros(2, dtype=torch.float64)
        pg.reduce_scatter(rs, torch.arange(2.0 * n, dtype=torch.float64) * (r + 1))
        return b, red, g, rs

    for r, (b, red, g, rs) in enumerate(cl.simulate(n, body)):
        assert torch.equal(b, torch.full((4,), 2.0, dtype=torch.bfloat16))
        want_red = (
            torch.arange(6, dtype=torch.int32) * n + 3
            if r == 1
            else torch.arange(6, dtype=torch.int32) + r
        )
        assert torch.equal(red, want_red)
        assert torch.equal(g, torch.tensor([[0.5] * 2, [1.5] * 2, [2.5] * 2], dtype=torch.float16))
        assert torch.equal(rs, torch.arange(2.0 * r, 2.0 * r + 2, dtype=torch.float64) * 6)


# --- one large buffer ----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", (2,))
def test_all_reduce_64_mib_ring(n):
    """64 MiB of float32 per rank, ring, default segments: values are small integers, so the
    sum is exact and every element can be checked."""
    count = (64 << 20) // 4

    def body(pg):
        x = (np.arange(count, dtype=np.int64) % 1000).astype(np.float32)
        x += pg.rank
        pg.all_reduce(x, algorithm="ring", timeout=60)
        return x

    results = cl.simulate(n, body, timeout=60)
    want = (np.arange(count, dtype=np.int64) % 1000).astype(np.float32) * n + n * (n - 1) / 2
    assert np.array_equal(results[0], want)
    assert results[0].tobytes() == results[1].tobytes()
