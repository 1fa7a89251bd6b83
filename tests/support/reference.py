"""The numpy reference every conformance test compares with: per-rank inputs whose reduction
numpy computes exactly (or within a bound derived from the dtype), so that a test can state
its invariant in one line. Used in the test process and by the worker processes
(tests/support/workers.py)."""

from __future__ import annotations

import numpy as np

import collectives as cl

INT_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
FLOAT_DTYPES = ("float16", "float32", "float64")
ALL_DTYPES = ("bool",) + INT_DTYPES + FLOAT_DTYPES
BITWISE_OPS = (cl.ReduceOp.BAND, cl.ReduceOp.BOR, cl.ReduceOp.BXOR)
ALL_OPS = (
    cl.ReduceOp.SUM,
    cl.ReduceOp.PRODUCT,
    cl.ReduceOp.MAX,
    cl.ReduceOp.MIN,
    cl.ReduceOp.AVG,
) + BITWISE_OPS
UFUNC = {
    cl.ReduceOp.SUM: np.add,
    cl.ReduceOp.AVG: np.add,
    cl.ReduceOp.PRODUCT: np.multiply,
    cl.ReduceOp.MIN: np.minimum,
    cl.ReduceOp.MAX: np.maximum,
    cl.ReduceOp.BAND: np.bitwise_and,
    cl.ReduceOp.BOR: np.bitwise_or,
    cl.ReduceOp.BXOR: np.bitwise_xor,
}


def op_applies(op, dtype) -> bool:
    """AVG is defined on floating dtypes only (on ints it raises ValueError), BAND/BOR/BXOR on
    integers and bool only (on floats TypeError); both refusals are tested apart."""
    kind = np.dtype(dtype).kind
    if op is cl.ReduceOp.AVG:
        return kind == "f"
    return op not in BITWISE_OPS or kind in "biu"


def make_input(rank: int, count: int, dtype, op, seed: int = 0) -> np.ndarray:
    """Rank `rank`'s contribution: distinct per rank and per element, small enough that SUM
    stays far from overflow, and for PRODUCT made of factors in {-1, 1, 2} (ints: product of
    8 of them is at most 256 in magnitude, and integer wrap-around is the same in numpy and
    the library since multiplication mod 2^k does not depend on order) or in [0.5, 1.5]
    (floats)."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng([seed, rank, count, dtype.num, list(cl.ReduceOp).index(op)])
    if op is cl.ReduceOp.PRODUCT:
        if dtype.kind == "f":
            return rng.uniform(0.5, 1.5, count).astype(dtype)
        vals = rng.choice([-1, 1, 2] if dtype.kind == "i" else [1, 2, 3], count)
        return vals.astype(dtype)
    if dtype.kind == "f":
        return rng.uniform(-4, 4, count).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, count).astype(dtype)  # as many False as True
    if dtype.kind == "i":
        return rng.integers(-12, 13, count).astype(dtype)
    return rng.integers(0, 25, count).astype(dtype)


def expected(inputs, op, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(reference result, allowed absolute error per element).

    Integers, bool and MIN/MAX must match exactly (error 0). Floating SUM/AVG/PRODUCT: the library
    may add in another order than numpy, and every addition rounds, so the bound is
    (n + 1) * eps(dtype) * (sum of |terms|) -- the textbook bound for n-1 additions plus the
    final rounding (and the division, for AVG), with a small floor for float16 subnormals."""
    dtype = np.dtype(dtype)
    stack = np.stack(inputs) if inputs else np.empty((0, 0), dtype)
    n = len(inputs)
    if dtype.kind != "f" or op in (cl.ReduceOp.MIN, cl.ReduceOp.MAX):
        with np.errstate(over="ignore"):
            ref = UFUNC[op].reduce(stack, axis=0, dtype=dtype)
        return ref, np.zeros(ref.shape)
    wide = stack.astype(np.float64)
    eps = float(np.finfo(dtype).eps)
    if op is cl.ReduceOp.PRODUCT:
        ref = np.prod(wide, axis=0)
        scale = np.abs(ref)
    else:
        ref = np.sum(wide, axis=0)
        scale = np.sum(np.abs(wide), axis=0)
        if op is cl.ReduceOp.AVG:
            ref, scale = ref / n, scale / n
    return ref, (n + 1) * eps * scale + float(np.finfo(dtype).tiny)


def assert_matches(got: np.ndarray, ref: np.ndarray, tol: np.ndarray, what: str = ""):
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    if not tol.any():
        bad = np.nonzero(got != ref)[0]
    else:
        bad = np.nonzero(np.abs(got.astype(np.float64) - ref) > tol)[0]
    assert bad.size == 0, (
        f"{what}: {bad.size} wrong element(s), first at {bad[0]}: "
        f"got {got[bad[0]]!r}, expected {ref[bad[0]]!r}"
    )


def assert_identical(per_rank_bytes, what: str = ""):
    """Principle 2: every rank ends with the same bytes."""
    first = per_rank_bytes[0]
    for r, b in enumerate(per_rank_bytes):
        assert b == first, f"{what}: rank {r}'s result differs bitwise from rank 0's"
