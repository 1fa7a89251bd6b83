"""Bad input never hangs and never corrupts, over the in-process transport.

* a bad buffer / argument raises ValueError or TypeError at once, before any byte moves
  (proved by driving one rank of a world of two: its peer's mailbox stays empty);
* ranks that disagree (count, dtype, op, algorithm, kind, root) all raise CollectiveMismatch
  naming the rank that differs, well within the timeout, and the group then still works;
* a rank that never joins: every other rank raises CollectiveTimeout naming it after ~timeout;
* garbage frames in a mailbox are dropped with a log line and never enter a reduction.
"""

from __future__ import annotations

import logging
import threading
import time

import msgpack
import numpy as np
import pytest

import collectives as cl
from collectives.transport.wire import DATA, MAGIC, encode_header
from support.timing import bound, scaled

MISMATCH_TIMEOUT = 10.0  # s, scaled: the ops' deadline, which a mismatch must beat by far

# in-process: part of `make test-fast`
pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

try:
    import torch
except ImportError:  # optional extra
    torch = None


def _readonly():
    a = np.ones(4, dtype=np.float32)
    a.flags.writeable = False
    return a


BAD_BUFFERS = {
    # name: (buffer factory, exception type, words the message must contain)
    "read-only": (_readonly, ValueError, "read-only"),
    "non-contiguous": (lambda: np.ones(8, dtype=np.float32)[::2], ValueError, "contiguous"),
    "non-contiguous 2-D": (lambda: np.ones((4, 4), dtype=np.int32).T, ValueError, "contiguous"),
    "float128": (lambda: np.ones(4, dtype=np.longdouble), TypeError, "dtype"),
    "complex": (lambda: np.ones(4, dtype=np.complex64), TypeError, "dtype"),
    "object": (lambda: np.array([1, "a", None], dtype=object), TypeError, "dtype"),
    "list": (lambda: [1.0, 2.0], TypeError, "numpy.ndarray"),
    "bytes": (lambda: b"1234", TypeError, "numpy.ndarray"),
    "scalar": (lambda: 3.0, TypeError, "numpy.ndarray"),
    "None": (lambda: None, TypeError, "numpy.ndarray"),
}
if torch is not None:
    BAD_BUFFERS.update(
        {
            "torch non-contiguous": (lambda: torch.ones(4, 4).t(), ValueError, "contiguous"),
            "torch complex128": (lambda: torch.ones(4, dtype=torch.complex128), TypeError, "dtype"),
            "torch complex": (lambda: torch.ones(4, dtype=torch.complex64), TypeError, "dtype"),
        }
    )

CALLS = {
    # how each method is called with the bad buffer in the position that is written to
    "all_reduce": lambda pg, b: pg.all_reduce(b),
    "reduce": lambda pg, b: pg.reduce(b, dst=1),
    "broadcast": lambda pg, b: pg.broadcast(b, src=1),
    "recv": lambda pg, b: pg.recv(b, 1),
    "all_gather out": lambda pg, b: pg.all_gather(b, np.ones(2, dtype=np.float32)),
    "reduce_scatter out": lambda pg, b: pg.reduce_scatter(b, np.ones(8, dtype=np.float32)),
    "all_to_all out": lambda pg, b: pg.all_to_all(b, np.ones((2, 2), dtype=np.float32)),
    "gather out": lambda pg, b: pg.gather(b, np.ones(2, dtype=np.float32), dst=0),
    "scatter out": lambda pg, b: pg.scatter(b, np.ones((2, 4), dtype=np.float32), src=0),
}
# Inputs that are only read may be read-only; every other bad buffer must be refused there too.
READ_CALLS = {
    "send": lambda pg, b: pg.send(b, 1),
    "all_gather buf": lambda pg, b: pg.all_gather(np.ones((2, 4), dtype=np.float32), b),
    "reduce_scatter buf": lambda pg, b: pg.reduce_scatter(np.ones(2, dtype=np.float32), b),
    "all_to_all buf": lambda pg, b: pg.all_to_all(np.ones((2, 2), dtype=np.float32), b),
    "gather buf": lambda pg, b: pg.gather(np.ones((2, 4), dtype=np.float32), b, dst=0),
    "scatter buf": lambda pg, b: pg.scatter(np.ones(2, dtype=np.float32), b, src=0),
}


def assert_refused_before_sending(inproc_world, call, exc_type, words=()):
    """Run `call(pg)` on rank 0 of a world of 2 whose rank 1 does not exist: the error must come
    at once (not after the 2 s timeout), and rank 1's mailbox must stay empty."""
    world, (pg,) = inproc_world(2, ranks=[0], timeout=2.0)
    t0 = time.monotonic()
    with pytest.raises(exc_type) as info:
        call(pg)
    elapsed = time.monotonic() - t0
    assert not isinstance(info.value, cl.CollectiveError), f"{info.value!r} came from the wire"
    assert elapsed < scaled(0.5), f"the error took {elapsed:.2f} s: it waited on the network"
    assert world.mailboxes[1].empty(), "a frame was sent before the argument check"
    for w in words:
        assert w in str(info.value), f"{w!r} not in {info.value}"
    return info.value


# reduce_scatter's `out` as a non-contiguous 2-D view fails its size check first (and so do
# all_to_all's and scatter's, whose sizes differ from the 4 x 4 view's); the 1-D
# non-contiguous case covers those calls.
SIZE_FIRST = ("reduce_scatter out", "all_to_all out", "scatter out")


@pytest.mark.parametrize(
    "bad,call",
    [
        (b, c)
        for b in BAD_BUFFERS
        for c in CALLS
        if c not in SIZE_FIRST or b != "non-contiguous 2-D"
    ],
)
def test_bad_buffer_is_refused_before_any_byte_moves(inproc_world, bad, call):
    make, exc_type, word = BAD_BUFFERS[bad]
    assert_refused_before_sending(
        inproc_world, lambda pg: CALLS[call](pg, make()), exc_type, [word]
    )


@pytest.mark.parametrize(
    "call,bad",
    [
        (c, b)
        for c in READ_CALLS
        for b in BAD_BUFFERS
        if b != "read-only"
        and (c not in ("all_to_all buf", "scatter buf") or b != "non-contiguous 2-D")
    ],
)
def test_bad_input_buffer_is_refused(inproc_world, bad, call):
    make, exc_type, word = BAD_BUFFERS[bad]
    assert_refused_before_sending(
        inproc_world, lambda pg: READ_CALLS[call](pg, make()), exc_type, [word]
    )


def test_read_only_input_is_fine_where_only_read():
    def body(pg):
        x = np.arange(4, dtype=np.float32) + pg.rank
        x.flags.writeable = False
        g = np.zeros((2, 4), dtype=np.float32)
        pg.all_gather(g, x)
        o = np.zeros(2, dtype=np.float32)
        pg.reduce_scatter(o, x)
        a = np.zeros((2, 2), dtype=np.float32)
        pg.all_to_all(a, x.reshape(2, 2))
        h = np.zeros((2, 4), dtype=np.float32)
        pg.gather(h, x, dst=1)
        s = np.zeros(2, dtype=np.float32)
        pg.scatter(s, x.reshape(2, 2), src=0)
        if pg.rank == 0:
            pg.send(x, 1)
            return g, o, a, s, None
        y = np.empty(4, dtype=np.float32)
        pg.recv(y, 0)
        assert np.array_equal(h, g)
        return g, o, a, s, y

    (g0, o0, a0, s0, _), (g1, o1, a1, s1, y1) = cl.simulate(2, body)
    assert np.array_equal(g0, [[0, 1, 2, 3], [1, 2, 3, 4]]) and np.array_equal(g0, g1)
    assert np.array_equal(o0, [1, 3]) and np.array_equal(o1, [5, 7])
    assert np.array_equal(a0, [[0, 1], [1, 2]]) and np.array_equal(a1, [[2, 3], [3, 4]])
    assert np.array_equal(s0, [0, 1]) and np.array_equal(s1, [2, 3])
    assert np.array_equal(y1, [0, 1, 2, 3])


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "uint64"])
@pytest.mark.parametrize("call", ["all_reduce", "reduce", "reduce_scatter"])
def test_avg_on_integers_is_a_value_error(inproc_world, dtype, call):
    x = np.ones(4, dtype=dtype)
    calls = {
        "all_reduce": lambda pg: pg.all_reduce(x, op=cl.ReduceOp.AVG),
        "reduce": lambda pg: pg.reduce(x, dst=0, op=cl.ReduceOp.AVG),
        "reduce_scatter": lambda pg: pg.reduce_scatter(
            np.ones(2, dtype=dtype), x, op=cl.ReduceOp.AVG
        ),
    }
    err = assert_refused_before_sending(inproc_world, calls[call], ValueError, ["AVG"])
    assert dtype in str(err)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op", ["BAND", "BOR", "BXOR"])
@pytest.mark.parametrize("call", ["all_reduce", "reduce", "reduce_scatter"])
def test_bitwise_op_on_floats_is_a_type_error(inproc_world, dtype, op, call):
    x = np.ones(4, dtype=dtype)
    rop = getattr(cl.ReduceOp, op)
    calls = {
        "all_reduce": lambda pg: pg.all_reduce(x, op=rop),
        "reduce": lambda pg: pg.reduce(x, dst=0, op=rop),
        "reduce_scatter": lambda pg: pg.reduce_scatter(np.ones(2, dtype=dtype), x, op=rop),
    }
    assert_refused_before_sending(
        inproc_world, calls[call], TypeError, [f"ReduceOp.{op}", "integer or bool", dtype]
    )


ARG_ERRORS = {
    # name: (call, exception type, words the message must contain)
    "dst too large": (lambda pg, x: pg.reduce(x, dst=2), ValueError, ["dst=2", "world_size 2"]),
    "dst negative": (lambda pg, x: pg.reduce(x, dst=-1), ValueError, ["dst=-1"]),
    "dst float": (lambda pg, x: pg.reduce(x, dst=1.0), TypeError, ["dst", "float"]),
    "dst bool": (lambda pg, x: pg.reduce(x, dst=True), TypeError, ["dst", "bool"]),
    "src too large": (lambda pg, x: pg.broadcast(x, src=5), ValueError, ["src=5"]),
    "src string": (lambda pg, x: pg.broadcast(x, src="0"), TypeError, ["src", "str"]),
    "send to self": (lambda pg, x: pg.send(x, 0), ValueError, ["itself"]),
    "recv from nobody": (lambda pg, x: pg.recv(x, 7), ValueError, ["src=7"]),
    "unknown algorithm": (
        lambda pg, x: pg.all_reduce(x, algorithm="bogus"),
        ValueError,
        ["'bogus'", "ring", "tree"],
    ),
    "algorithm for another op": (
        lambda pg, x: pg.broadcast(x, algorithm="ring"),
        ValueError,
        ["'ring'", "broadcast"],
    ),
    "unknown op": (lambda pg, x: pg.all_reduce(x, op="bogus"), ValueError, ["bogus", "SUM"]),
    "timeout zero": (lambda pg, x: pg.all_reduce(x, timeout=0), ValueError, ["timeout"]),
    "timeout negative": (lambda pg, x: pg.barrier(timeout=-1), ValueError, ["timeout"]),
    "timeout nan": (lambda pg, x: pg.all_reduce(x, timeout=float("nan")), ValueError, ["timeout"]),
    "timeout string": (
        lambda pg, x: pg.all_reduce(x, timeout="soon"),
        (TypeError, ValueError),
        ["timeout"],
    ),
    "all_gather rows": (
        lambda pg, x: pg.all_gather(np.zeros((3, 4), np.float32), x),
        ValueError,
        ["world_size (2)"],
    ),
    "all_gather dtype": (
        lambda pg, x: pg.all_gather(np.zeros((2, 4), np.float64), x),
        TypeError,
        ["float64", "float32"],
    ),
    "reduce_scatter size": (
        lambda pg, x: pg.reduce_scatter(np.zeros(3, np.float32), x),
        ValueError,
        ["world_size (2)"],
    ),
    "all_to_all rows": (
        lambda pg, x: pg.all_to_all(np.zeros(4, np.float32), x),
        ValueError,
        ["world_size (2) rows", "out_splits"],
    ),
    "all_to_all sizes": (
        lambda pg, x: pg.all_to_all(np.zeros((2, 3), np.float32), x.reshape(2, 2)),
        ValueError,
        ["6 elements", "buf has 4"],
    ),
    "all_to_all dtype": (
        lambda pg, x: pg.all_to_all(np.zeros((2, 2), np.int32), x.reshape(2, 2)),
        TypeError,
        ["int32", "float32"],
    ),
    "all_to_all overlap": (
        lambda pg, x: pg.all_to_all(x.reshape(2, 2), x.reshape(2, 2)),
        ValueError,
        ["overlap"],
    ),
    "all_to_all splits length": (
        lambda pg, x: pg.all_to_all(np.zeros(4, np.float32), x, in_splits=[1, 1, 2]),
        ValueError,
        ["in_splits", "world_size (2)"],
    ),
    "all_to_all splits sum": (
        lambda pg, x: pg.all_to_all(np.zeros(4, np.float32), x, in_splits=[1, 2]),
        ValueError,
        ["in_splits adds up to 3", "buf has 4"],
    ),
    "all_to_all splits negative": (
        lambda pg, x: pg.all_to_all(np.zeros(4, np.float32), x, out_splits=[5, -1]),
        ValueError,
        ["out_splits", "non-negative"],
    ),
    "all_to_all splits type": (
        lambda pg, x: pg.all_to_all(np.zeros(4, np.float32), x, out_splits=[2.5, 1.5]),
        ValueError,
        ["out_splits", "element counts"],
    ),
    "all_to_all splits not a sequence": (
        lambda pg, x: pg.all_to_all(np.zeros(4, np.float32), x, out_splits=4),
        TypeError,
        ["out_splits", "sequence"],
    ),
    "all_to_all own block": (
        lambda pg, x: pg.all_to_all(
            np.zeros(4, np.float32), x, in_splits=[1, 3], out_splits=[2, 2]
        ),
        ValueError,
        ["rank 0 sends itself 1", "in_splits[0]", "expects 2"],
    ),
    "all_to_all not divisible": (
        lambda pg, x: pg.all_to_all(
            np.zeros(3, np.float32), np.ones(3, np.float32), in_splits=[1, 2]
        ),
        ValueError,
        ["out has 3 elements", "multiple of world_size", "out_splits"],
    ),
    "all_to_all algorithm": (
        lambda pg, x: pg.all_to_all(
            np.zeros((2, 2), np.float32), x.reshape(2, 2), algorithm="ring"
        ),
        ValueError,
        ["'ring'", "pairwise"],
    ),
    "gather without out": (
        lambda pg, x: pg.gather(None, x, dst=0),
        TypeError,
        ["numpy.ndarray", "destination rank 0", "None"],
    ),
    "gather rows": (
        lambda pg, x: pg.gather(np.zeros((3, 4), np.float32), x, dst=0),
        ValueError,
        ["world_size (2) rows of 4"],
    ),
    "gather dtype": (
        lambda pg, x: pg.gather(np.zeros((2, 4), np.float64), x, dst=0),
        TypeError,
        ["float64", "float32"],
    ),
    "gather dst": (lambda pg, x: pg.gather(None, x, dst=2), ValueError, ["dst=2"]),
    "scatter without buf": (
        lambda pg, x: pg.scatter(x, None, src=0),
        TypeError,
        ["numpy.ndarray", "source rank 0", "None"],
    ),
    "scatter rows": (
        lambda pg, x: pg.scatter(x, np.zeros(4, np.float32), src=0),
        ValueError,
        ["world_size (2) rows of 4"],
    ),
    "scatter src": (lambda pg, x: pg.scatter(x, None, src=-1), ValueError, ["src=-1"]),
    "scatter algorithm": (
        lambda pg, x: pg.scatter(x, np.zeros((2, 4), np.float32), algorithm="tree"),
        ValueError,
        ["'tree'", "linear"],
    ),
}


@pytest.mark.parametrize("case", list(ARG_ERRORS))
def test_bad_argument_names_what_is_wrong(inproc_world, case):
    call, exc_type, words = ARG_ERRORS[case]
    x = np.ones(4, dtype=np.float32)
    assert_refused_before_sending(inproc_world, lambda pg: call(pg, x), exc_type, words)


def test_refused_calls_do_not_desynchronise_the_group():
    """Only rank 0 makes bad calls; if any of them consumed an op sequence number, the next
    good op would pair different sequence numbers and fail."""

    def body(pg):
        if pg.rank == 0:
            for bad in (
                lambda: pg.all_reduce(_readonly()),
                lambda: pg.all_reduce(np.ones(3, np.int32), op=cl.ReduceOp.AVG),
                lambda: pg.broadcast(np.ones(3), src=9),
                lambda: pg.all_reduce(np.ones(3), algorithm="nope"),
                lambda: pg.send(np.ones(3, dtype=np.complex64), 1),
                lambda: pg.all_to_all(np.ones(4), np.ones(4), in_splits=[4, 1]),
                lambda: pg.gather(None, np.ones(3)),
                lambda: pg.all_reduce(np.ones(3), op=cl.ReduceOp.BXOR),
            ):
                with pytest.raises((ValueError, TypeError)):
                    bad()
        x = np.full(3, pg.rank + 1.0)
        pg.all_reduce(x)
        y = np.full(2, float(pg.rank))
        if pg.rank == 0:
            pg.send(y, 1)
        else:
            pg.recv(y, 0)
        return x, y

    for x, y in cl.simulate(2, body, timeout=5):
        assert (x == 3).all() and (y == 0).all()


# --- mismatches between ranks ------------------------------------------------------------------------
def _all_reduce(count=4, dtype="float32", op=cl.ReduceOp.SUM, algorithm="ring"):
    return lambda pg: pg.all_reduce(np.ones(count, dtype=dtype), op=op, algorithm=algorithm)


def _all_to_all(count, splits=False, more=0):
    """count elements per block; with splits, the uneven form with equal splits, except
    that `more` extra elements go to the next rank (which alone can notice)."""

    def call(pg):
        n = pg.world_size
        if not splits:
            return pg.all_to_all(np.zeros((n, count), np.float32), np.ones((n, count), np.float32))
        ins = [count + more * (p == (pg.rank + 1) % n) for p in range(n)]
        return pg.all_to_all(
            np.zeros(n * count, np.float32),
            np.ones(sum(ins), np.float32),
            out_splits=[count] * n,
            in_splits=ins,
        )

    return call


def _gather(dst=0, count=4):
    return lambda pg: pg.gather(
        np.zeros((pg.world_size, count), np.float32), np.ones(count, np.float32), dst=dst
    )


def _scatter(src=0, dtype="float32"):
    return lambda pg: pg.scatter(np.zeros(4, dtype), np.zeros((pg.world_size, 4), dtype), src=src)


MISMATCHES = {
    # name: (what the ranks that agree call, what the odd rank calls)
    "count": (_all_reduce(count=4), _all_reduce(count=5)),
    "count zero": (_all_reduce(count=4), _all_reduce(count=0)),
    "dtype": (_all_reduce(dtype="float32"), _all_reduce(dtype="float64")),
    "dtype same size": (_all_reduce(dtype="float32"), _all_reduce(dtype="int32")),
    "op": (_all_reduce(op=cl.ReduceOp.SUM), _all_reduce(op=cl.ReduceOp.MAX)),
    "algorithm": (_all_reduce(algorithm="ring"), _all_reduce(algorithm="tree")),
    "algorithm direct/naive": (_all_reduce(algorithm="direct"), _all_reduce(algorithm="naive")),
    "kind all_reduce/broadcast": (
        _all_reduce(algorithm="tree"),
        lambda pg: pg.broadcast(np.ones(4, np.float32), src=0),
    ),
    "kind all_reduce/barrier": (_all_reduce(), lambda pg: pg.barrier()),
    "kind reduce/broadcast": (
        lambda pg: pg.reduce(np.ones(4, np.float32), dst=0),
        lambda pg: pg.broadcast(np.ones(4, np.float32), src=0),
    ),
    "kind all_gather/reduce_scatter": (
        lambda pg: pg.all_gather(np.zeros((pg.world_size, 4), np.float32), np.ones(4, np.float32)),
        lambda pg: pg.reduce_scatter(
            np.zeros(4, np.float32), np.ones(4 * pg.world_size, np.float32)
        ),
    ),
    "broadcast root": (
        lambda pg: pg.broadcast(np.ones(4, np.float32), src=0),
        lambda pg: pg.broadcast(np.ones(4, np.float32), src=1),
    ),
    "reduce root": (
        lambda pg: pg.reduce(np.ones(4, np.float32), dst=1),
        lambda pg: pg.reduce(np.ones(4, np.float32), dst=0),
    ),
    "op bitwise": (
        _all_reduce(dtype="int32", op=cl.ReduceOp.BAND),
        _all_reduce(dtype="int32", op=cl.ReduceOp.BOR),
    ),
    "all_to_all count": (_all_to_all(4), _all_to_all(5)),
    "all_to_all form": (_all_to_all(4), _all_to_all(4, splits=True)),
    "kind all_to_all/all_gather": (
        _all_to_all(4),
        lambda pg: pg.all_gather(np.zeros((pg.world_size, 4), np.float32), np.ones(4, np.float32)),
    ),
    "gather root": (_gather(dst=0), _gather(dst=1)),
    "gather count": (_gather(count=4), _gather(count=3)),
    "scatter root": (_scatter(src=1), _scatter(src=0)),
    "scatter dtype": (_scatter(dtype="float32"), _scatter(dtype="int32")),
    "kind gather/scatter": (_gather(dst=0), _scatter(src=0)),
    "kind scatter/broadcast": (
        _scatter(src=0),
        lambda pg: pg.broadcast(np.ones(4, np.float32), src=0),
    ),
}


def run_mismatch(n, odd, good, bad, timeout=None):
    """Every rank calls `good` except `odd`, which calls `bad`; then all do a correct
    all_reduce. Returns per rank (exception, seconds it took, result of the next op).
    timeout: the ops' (default MISMATCH_TIMEOUT s, scaled)."""
    timeout = scaled(MISMATCH_TIMEOUT) if timeout is None else timeout

    def body(pg):
        t0 = time.monotonic()
        try:
            (bad if pg.rank == odd else good)(pg)
            exc = None
        except cl.CollectiveError as e:
            exc = e
        took = time.monotonic() - t0
        x = np.full(3, pg.rank + 1, dtype=np.int64)
        pg.all_reduce(x, timeout=scaled(5))
        return exc, took, x

    return cl.simulate(n, body, timeout=timeout)


@pytest.mark.parametrize("n,odd", [(2, 1), (3, 2), (3, 0), (5, 3)])
@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatch_raises_on_every_rank_naming_the_odd_rank(case, n, odd):
    good, bad = MISMATCHES[case]
    results = run_mismatch(n, odd, good, bad)
    quick = bound(MISMATCH_TIMEOUT / 2, below=MISMATCH_TIMEOUT, below_scaled=True)
    for r, (exc, took, x) in enumerate(results):
        assert isinstance(exc, cl.CollectiveMismatch), f"rank {r} raised {exc!r}"
        assert took < quick, f"rank {r} needed {took:.2f} s: found by timeout, not header"
        assert exc.rank == r and exc.op is not None
        if r == odd:
            # From the odd rank's side it is the others that differ: it names one of them.
            assert exc.peer != odd and 0 <= exc.peer < n, f"odd rank {r}: peer {exc.peer}"
        else:
            assert exc.peer == odd, f"rank {r} blamed rank {exc.peer}, not {odd}: {exc}"
            assert f"rank {odd}" in str(exc), str(exc)
        # After the mismatch the group is still usable: ranks add 1..n.
        assert (x == n * (n + 1) // 2).all(), f"rank {r}: next op gave {x}"


@pytest.mark.parametrize("n,odd", [(2, 1), (3, 2), (3, 0), (5, 3)])
def test_all_to_all_split_mismatch_raises_on_every_rank_naming_the_sender(n, odd):
    """Rank `odd` sends its right neighbour one element more than that rank expects (uneven
    form): only the neighbour can see it, from the size of what arrives, yet every rank
    raises CollectiveMismatch naming rank `odd` and the sizes, at once."""
    results = run_mismatch(n, odd, _all_to_all(4, splits=True), _all_to_all(4, splits=True, more=1))
    quick = bound(MISMATCH_TIMEOUT / 2, below=MISMATCH_TIMEOUT, below_scaled=True)
    for r, (exc, took, x) in enumerate(results):
        assert isinstance(exc, cl.CollectiveMismatch), f"rank {r} raised {exc!r}"
        assert took < quick and exc.rank == r and exc.peer == odd, (r, exc.peer, exc)
        assert f"rank {odd} sent 20 bytes" in str(exc) and "expected 16" in str(exc), str(exc)
        assert (x == n * (n + 1) // 2).all(), f"rank {r}: next op gave {x}"


def test_mismatch_message_says_what_differs():
    results = run_mismatch(2, 1, _all_reduce(dtype="float32"), _all_reduce(dtype="float64"))
    for exc, _, _ in results:
        assert "dtype" in str(exc) and "all_reduce" in str(exc), str(exc)


# --- a rank that never joins --------------------------------------------------------------------------
NEVER_JOINS = [
    # (algorithm, absent rank, stalled op is the group's first, absent rank leaves at once)
    ("ring", 2, True, False),
    ("ring", 0, True, False),
    ("ring", 0, False, False),
    ("ring", 1, True, True),
    ("tree", 0, True, False),
    ("tree", 1, False, False),
    ("naive", 0, True, False),
    ("naive", 2, False, True),
    ("direct", 1, True, False),
]


@pytest.mark.parametrize("algorithm,absent,first_op,leaves", NEVER_JOINS)
def test_rank_that_never_joins_is_named_after_timeout(algorithm, absent, first_op, leaves):
    """n=3. The absent rank either idles past the others' deadline (alive, never enters the
    op) or returns at once (its group is destroyed). The others raise CollectiveTimeout with
    .peer == the absent rank, after about `timeout` seconds. first_op: the stalled op is the
    group's very first (op #0), where 'has not entered yet' and 'finished' look alike unless
    the transport tells them apart."""
    n, timeout = 3, 0.6
    raised = threading.Semaphore(0)  # one release per rank that has raised

    def body(pg):
        if not first_op:
            pg.all_reduce(np.ones(2))
        if pg.rank == absent:
            if not leaves:  # alive and idle until the others have raised, however long
                for _ in range(n - 1):  # that takes on a loaded machine
                    raised.acquire(timeout=10)
            return None
        t0 = time.monotonic()
        try:
            with pytest.raises(cl.CollectiveTimeout) as info:
                pg.all_reduce(np.ones(1000, dtype=np.float32), algorithm=algorithm, timeout=timeout)
        finally:
            raised.release()
        return info.value, time.monotonic() - t0

    results = cl.simulate(n, body, timeout=10)
    for r, res in enumerate(results):
        if r == absent:
            continue
        exc, took = res
        assert exc.peer == absent, f"rank {r} blamed {exc.peer}: {exc}"
        assert f"rank {absent}" in str(exc), str(exc)
        # raised at the deadline, not at some later one (the slack grows with the load)
        assert 0.8 * timeout <= took <= timeout + scaled(1.5), f"rank {r} raised after {took:.2f} s"


def test_recv_from_a_rank_that_never_sends_names_it():
    """n=3: rank 2 waits for rank 1, which never sends. CollectiveTimeout after ~timeout,
    blaming rank 1 (the group's collective progress is irrelevant to a point-to-point op)."""
    timeout = 0.6

    def body(pg):
        if pg.rank != 2:
            return None
        t0 = time.monotonic()
        with pytest.raises(cl.CollectiveTimeout) as info:
            pg.recv(np.empty(4), 1, timeout=timeout)
        return info.value, time.monotonic() - t0

    exc, took = cl.simulate(3, body)[2]
    assert exc.peer == 1 and "rank 1" in str(exc), str(exc)
    assert 0.8 * timeout <= took <= timeout + scaled(1.5)


def test_send_recv_size_mismatch_raises_on_the_receiver_and_the_pair_goes_on():
    def body(pg):
        if pg.rank == 0:
            pg.send(np.ones(4, dtype=np.float32), 1)
            pg.send(np.arange(3, dtype=np.int64), 1)
            return None
        with pytest.raises(cl.CollectiveMismatch) as info:
            pg.recv(np.empty(5, dtype=np.float32), 0, timeout=5)
        y = np.empty(3, dtype=np.int64)
        pg.recv(y, 0, timeout=5)
        return info.value, y

    exc, y = cl.simulate(2, body)[1]
    assert exc.peer == 0 and "count 5 vs 4" in str(exc), str(exc)
    assert np.array_equal(y, [0, 1, 2])


# --- garbage on the wire --------------------------------------------------------------------------------
def test_garbage_frames_are_dropped_and_logged(caplog):
    """Rank 0 puts malformed and misaddressed frames into rank 1's mailbox just before its
    real data for op #1 (FIFO: rank 1 must read them first). Each would poison the sum with
    1e300 if it were used; rank 1 must drop each one with a log line and finish correctly."""
    caplog.set_level(logging.DEBUG, logger="collectives")
    count = 4
    desc = ["all_reduce", count, np.dtype(np.float64).str, "sum", "direct", None]
    poison = np.full(count, 1e300).tobytes()

    def frame(mtype=DATA, gen=0, seq=1, src=0, index=0):
        return encode_header(mtype, gen, seq, src, index, "exchange", 0, 0, desc)

    garbage = [
        (0, b"\xc1\xff not msgpack at all", poison),  # raw bytes
        (0, msgpack.packb({"magic": MAGIC}), poison),  # not a list
        (0, msgpack.packb([0xBAD, DATA, 0, 1, 0, 0, "exchange", 0, 0, desc]), poison),  # MAGIC
        (0, msgpack.packb([MAGIC, "x", 0, 1, 0, 0, "", 0, 0, desc]), poison),  # wrong field type
        (0, frame(gen=7), poison),  # other generation
        (0, frame(seq=0), poison),  # stale (op #0)
        (0, frame(src=1), poison),  # claims another src
        (0, frame(mtype=9), poison),  # unknown type
    ]

    def body(pg):
        x = np.full(count, pg.rank + 1.0)
        pg.all_reduce(x, algorithm="direct")  # op #0
        if pg.rank == 0:
            for item in garbage:
                pg.transport.world.mailboxes[1].put(item)
        y = np.full(count, 10.0 * (pg.rank + 1))
        pg.all_reduce(y, algorithm="direct")  # op #1
        z = np.full(count, 100.0 * (pg.rank + 1))
        pg.all_reduce(z, algorithm="ring")  # op #2
        return x, y, z

    for x, y, z in cl.simulate(2, body, timeout=5):
        assert (x == 3).all() and (y == 30).all() and (z == 300).all()
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "collectives")
    assert text.count("malformed") >= 4, text
    assert "generation 7" in text, text
    assert "stale" in text, text
    assert "claiming to be from rank 1" in text, text
    assert "unknown type" in text, text


def test_garbage_frame_while_nobody_is_in_an_op_does_not_break_the_next_one(caplog):
    """Garbage that arrives between ops is met by the next op, which drops it and goes on."""
    caplog.set_level(logging.WARNING, logger="collectives")
    ready = threading.Barrier(2)

    def body(pg):
        pg.barrier()
        if pg.rank == 1:
            pg.transport.world.mailboxes[0].put((1, b"junk", b"junk"))
        ready.wait(5)
        x = np.full(5, pg.rank + 1.0)
        pg.all_reduce(x, algorithm="ring")
        return x

    for x in cl.simulate(2, body, timeout=5):
        assert (x == 3).all()
    assert any("malformed" in r.getMessage() for r in caplog.records)
