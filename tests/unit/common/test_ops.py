"""Unit tests of the pieces under the algorithms: reduce ops and kernels, how buffers are cut
into chunks and segments, the binomial tree's shape, and buffer staging (numpy / torch)."""

from __future__ import annotations

import numpy as np
import pytest

import collectives as cl
from collectives.group import buffers, tuning
from collectives.algorithms import tree
from collectives.algorithms.chunks import chunk_bounds, segments
from collectives.common.ops import SUPPORTED_DTYPES, as_op, check_op_dtype, finalize, reduce_into
from support.reference import ALL_DTYPES, ALL_OPS, BITWISE_OPS, UFUNC

# in-process: part of `make test-fast`
pytestmark = [pytest.mark.fast, pytest.mark.timeout(30)]

try:
    import torch
except ImportError:  # optional extra
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


# --- ReduceOp -------------------------------------------------------------------------------------
@pytest.mark.parametrize("spelling", ["sum", "SUM", "Sum", "ReduceOp.SUM", cl.ReduceOp.SUM])
def test_as_op_accepts_the_usual_spellings(spelling):
    assert as_op(spelling) is cl.ReduceOp.SUM


@needs_torch
def test_as_op_accepts_torch_distributed_reduce_ops():
    dist = pytest.importorskip("torch.distributed")
    assert as_op(dist.ReduceOp.MAX) is cl.ReduceOp.MAX
    assert as_op(dist.ReduceOp.PRODUCT) is cl.ReduceOp.PRODUCT


@pytest.mark.parametrize("bad", ["bogus", "", None, 3])
def test_as_op_rejects_unknown_ops_listing_the_valid_ones(bad):
    with pytest.raises(ValueError, match="ReduceOp.SUM"):
        as_op(bad)


def test_supported_dtypes_are_bool_and_the_fixed_width_numeric_ones():
    assert {str(d) for d in SUPPORTED_DTYPES} == set(ALL_DTYPES)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("op", ALL_OPS)
def test_check_op_dtype(op, dtype):
    if op is cl.ReduceOp.AVG and np.dtype(dtype).kind != "f":
        with pytest.raises(ValueError, match="AVG"):
            check_op_dtype(op, dtype)
    elif op in BITWISE_OPS and np.dtype(dtype).kind == "f":
        with pytest.raises(
            TypeError,
            match=f"ReduceOp.{op.name} is bitwise: it needs an integer or bool dtype, got {dtype}",
        ):
            check_op_dtype(op, dtype)
    else:
        check_op_dtype(op, dtype)  # no error


@pytest.mark.parametrize(
    "dtype",
    [
        np.complex64,
        np.complex128,
        object,
        "U4",
        np.float128 if hasattr(np, "float128") else np.longdouble,
    ],
)
def test_check_op_dtype_refuses_unsupported(dtype):
    with pytest.raises(TypeError, match="unsupported dtype"):
        check_op_dtype(cl.ReduceOp.SUM, dtype)


# --- kernels -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "op,dtype",
    [
        (op, dt)
        for op in ALL_OPS
        for dt in ALL_DTYPES
        if op not in BITWISE_OPS or np.dtype(dt).kind != "f"
    ],
)
def test_reduce_into_is_in_place_and_matches_numpy(op, dtype):
    """(Bitwise ops on floats are refused before any kernel runs: test_check_op_dtype.)"""
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    lo, hi = (info.min, info.max) if info else (0, 1) if dtype == "bool" else (-100, 100)
    a = rng.integers(lo, hi, 64, endpoint=True, dtype=dtype if info else np.int64).astype(dtype)
    b = rng.integers(lo, hi, 64, endpoint=True, dtype=dtype if info else np.int64).astype(dtype)
    ufunc = UFUNC[op]
    with np.errstate(over="ignore"):
        want = ufunc(a, b)  # integers wrap, the same way on both sides
    dst = a.copy()
    address = dst.__array_interface__["data"][0]
    with np.errstate(over="ignore"):
        reduce_into(op, dst, b.tobytes())  # src may be raw bytes off the wire
    assert dst.__array_interface__["data"][0] == address
    assert dst.tobytes() == want.tobytes()


def test_reduce_into_keeps_dst_shape():
    dst = np.ones((2, 3), dtype=np.float32)
    reduce_into(cl.ReduceOp.SUM, dst, np.arange(6, dtype=np.float32))
    assert dst.shape == (2, 3) and np.array_equal(dst, np.arange(1, 7).reshape(2, 3))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_finalize_divides_avg_once_and_leaves_other_ops(dtype):
    x = np.array([3, 6, 9, 0], dtype=dtype)
    finalize(cl.ReduceOp.AVG, x, 3)
    assert np.array_equal(x, [1, 2, 3, 0]) and x.dtype == np.dtype(dtype)
    for op in (cl.ReduceOp.SUM, cl.ReduceOp.PRODUCT, cl.ReduceOp.MIN, cl.ReduceOp.MAX):
        y = np.array([3, 6], dtype=dtype)
        finalize(op, y, 3)
        assert np.array_equal(y, [3, 6])
    finalize(cl.ReduceOp.AVG, np.empty(0, dtype=dtype), 3)  # empty: nothing to do, no error


# --- chunks and segments --------------------------------------------------------------------------
@pytest.mark.parametrize("parts", range(1, 10))
@pytest.mark.parametrize("count", [0, 1, 2, 5, 8, 9, 100, 1001])
def test_chunk_bounds_partition_evenly(count, parts):
    bounds = chunk_bounds(count, parts)
    assert len(bounds) == parts
    assert bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])), "contiguous, no overlap"
    sizes = [e - s for s, e in bounds]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    "start,end,seg", [(0, 0, 4), (5, 5, 1), (0, 10, 3), (7, 20, 13), (0, 10, 100), (3, 4, 1)]
)
def test_segments_cover_the_range_and_never_vanish(start, end, seg):
    pieces = segments(start, end, seg)
    assert len(pieces) >= 1, "an empty range still yields one (empty) piece"
    assert pieces[0][0] == start and pieces[-1][1] == max(start, end)
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    assert all(0 <= e - s <= seg for s, e in pieces)


# --- the binomial tree ----------------------------------------------------------------------------
@pytest.mark.parametrize("n", range(1, 18))
def test_binomial_tree_spans_every_rank_once(n):
    """Each v > 0 has one parent < v and appears among that parent's children; depth is
    at most ceil(log2 n)."""
    seen = {0}
    for v in range(n):
        for c in tree.children_of(v, n):
            assert tree.parent_of(c) == v and c not in seen and c < n
            seen.add(c)
    assert seen == set(range(n))
    depth = max((bin(v).count("1") for v in range(n)), default=0)
    assert depth <= max(n - 1, 0).bit_length()


# --- staging buffers ------------------------------------------------------------------------------
def test_stage_numpy_is_a_flat_view_of_the_same_memory():
    x = np.zeros((2, 3), dtype=np.int16)
    s = buffers.stage(x, "buf", "test")
    s.array[4] = 7
    assert x[1, 1] == 7 and s.array.shape == (6,)


@needs_torch
def test_stage_torch_shares_memory_and_bfloat16_is_written_back():
    t = torch.zeros(4, dtype=torch.float32)
    s = buffers.stage(t, "buf", "test")
    s.array[0] = 5
    s.done()
    assert t[0].item() == 5
    b = torch.zeros(3, dtype=torch.bfloat16)
    s = buffers.stage(b, "buf", "test")
    assert s.array.dtype == np.float32  # numpy has no bfloat16: staged as float32
    s.array[:] = [1.5, 2.0, 1.00390625]  # the last one is not a bfloat16 value
    s.done()
    assert b.tolist() == [1.5, 2.0, 1.0]  # rounded once, on the way back


def test_auto_always_names_a_real_algorithm():
    from collectives.group.group import ALL_REDUCE

    for n in range(1, 17):
        for nbytes in (0, 4, 1 << 10, 1 << 16, 1 << 20, 1 << 26):
            assert tuning.all_reduce_algorithm(nbytes, n) in ALL_REDUCE
