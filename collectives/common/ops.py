"""Reduction operators and the in-place numpy kernels that apply them.

A reduction is always `dst = dst (op) src`, written into dst, elementwise. The kernels are the
numpy ufuncs with `out=`, so no temporary is allocated and the GIL is released while they run.
AVG is SUM on the wire; the division by the world size happens once, where a chunk becomes
final, so every rank ends with the same bytes. BAND, BOR and BXOR are bitwise, for integer and
bool dtypes only (on bool: and, or, xor).
"""

from __future__ import annotations

import enum

import numpy as np


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    def __repr__(self) -> str:  # ReduceOp.SUM, as users write it
        return f"ReduceOp.{self.name}"

    # Members are singletons and compare by identity: the identity hash agrees with that, in
    # C, where Enum's own is a Python call (every all_reduce looks its op up twice).
    __hash__ = object.__hash__


# Every numeric dtype numpy has a fixed width for, and bool; complex is not reduced here. On
# bool, SUM and MAX are "or", PRODUCT and MIN "and" (numpy's ufuncs, and Gloo's, agree).
SUPPORTED_DTYPES = tuple(
    np.dtype(t)
    for t in (
        "bool",
        "int8",
        "uint8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
)
BITWISE = ("BAND", "BOR", "BXOR")
# A set for the membership tests on every call (a tuple compares dtypes one by one).
SUPPORTED_SET = frozenset(SUPPORTED_DTYPES)
_CHECKED: set = set()  # (op, dtype) pairs check_op_dtype has passed: small and bounded

_UFUNC = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}


def as_op(op: object) -> ReduceOp:
    """Accept ReduceOp, its name ('sum', 'SUM') or a torch.distributed.ReduceOp."""
    if isinstance(op, ReduceOp):
        return op
    name = getattr(op, "name", None) or str(op)
    name = name.split(".")[-1].strip().upper()
    if name in ReduceOp.__members__:
        return ReduceOp[name]
    raise ValueError(
        f"unknown reduce op {op!r}; expected one of "
        f"{', '.join('ReduceOp.' + n for n in ReduceOp.__members__)}"
    )


def check_op_dtype(op: ReduceOp, dtype: np.dtype | str) -> None:
    """Raise before any byte moves if `op` cannot be applied to `dtype`. A pair that passed
    once is remembered (8 ops x 12 dtypes at most): the check is the same every call."""
    if (op, dtype) in _CHECKED:
        return
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_SET:
        raise TypeError(
            f"unsupported dtype {dtype}; supported: {', '.join(str(d) for d in SUPPORTED_DTYPES)}"
        )
    if op is ReduceOp.AVG and dtype.kind != "f":
        raise ValueError(
            f"ReduceOp.AVG needs a floating dtype, got {dtype} "
            "(an integer average would silently truncate)"
        )
    if op.name in BITWISE and dtype.kind not in "biu":
        raise TypeError(
            f"ReduceOp.{op.name} is bitwise: it needs an integer or bool dtype, got {dtype}"
        )
    if isinstance(op, ReduceOp):
        _CHECKED.add((op, dtype))


def reduce_into(op: ReduceOp, dst: np.ndarray, src: np.ndarray | bytes | memoryview) -> None:
    """dst = dst (op) src, in place. `src` may be any buffer of dst's dtype and size."""
    if not isinstance(src, np.ndarray) or src.dtype != dst.dtype:
        src = np.frombuffer(src, dtype=dst.dtype)  # raw bytes (a frame, a shared-memory slot)
    if src.shape != dst.shape:
        src = src.reshape(dst.shape)
    _UFUNC[op](dst, src, out=dst)


def ufunc_of(op: ReduceOp) -> np.ufunc:
    """The elementwise ufunc that reduce_into applies for `op` (AVG: add, then finalize), for
    a caller that reduces raw payloads itself (group/smallop.py) in the same order."""
    return _UFUNC[op]


def finalize(op: ReduceOp, buf: np.ndarray, world_size: int) -> None:
    """Turn a finished SUM into an AVG. Called exactly once per final chunk."""
    if op is ReduceOp.AVG and buf.size:
        np.divide(buf, buf.dtype.type(world_size), out=buf)
