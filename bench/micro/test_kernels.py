"""reduce_into(op, dst, src) on 1 MiB: the ceiling a reduction puts on any all_reduce."""

import numpy as np
import pytest

from collectives.common.ops import ReduceOp, reduce_into

NBYTES = 1 << 20


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int32", "int64"])
def test_reduce_into(benchmark, dtype, op):
    dst = np.ones(NBYTES // np.dtype(dtype).itemsize, dtype)
    src = np.ones_like(dst)  # ones: SUM stays finite over thousands of rounds, PRODUCT at 1
    benchmark(reduce_into, op, dst, src)
    benchmark.extra_info["GB/s"] = round(NBYTES / benchmark.stats.stats.median / 1e9, 2)


@pytest.mark.parametrize("nbytes", [1 << 10, 1 << 16, 1 << 20])
def test_reduce_into_from_bytes(benchmark, nbytes):
    """What recv_reduce does with a received frame: reduce straight from a bytes buffer."""
    dst = np.ones(nbytes // 4, np.float32)
    payload = bytes(np.ones_like(dst).data)
    benchmark(reduce_into, ReduceOp.SUM, dst, payload)
