"""The exchanges of a ProcessGroup: all_to_all (equal blocks or uneven splits, as MPI's
Alltoall / Alltoallv), gather and scatter -- collectives whose blocks only move, each checked
before any byte moves and run like the others through the group's core (core.py,
GroupCore.submit). The public methods, with the docstrings help() shows, are ProcessGroup's
(group.py)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..algorithms import linear, pairwise
from .buffers import stage, stage_in_out
from .core import GroupCore
from ..common.channel import Channel
from ..common.ops import ReduceOp, check_op_dtype
from .tuning import pick as _pick
from ..common.types import Buffer
from ..transport.wire import Descriptor
from .work import Work

ALL_TO_ALL = ("pairwise",)
ROOTED_COPY = ("linear",)  # gather and scatter


class Exchanges:
    """all_to_all, gather and scatter of one ProcessGroup, over its core."""

    def __init__(self, core: GroupCore):
        self.core = core

    def all_to_all(
        self,
        out: Buffer,
        buf: Buffer,
        out_splits: Sequence[int] | None,
        in_splits: Sequence[int] | None,
        algorithm: str,
        async_op: bool,
        timeout: float | None,
    ) -> Work | None:
        name = "all_to_all"
        n = self.core.world_size
        src, dst = stage_in_out(buf, out, name)
        a, o = src.array, dst.array
        check_op_dtype(ReduceOp.SUM, a.dtype)
        if o.size and a.size and np.may_share_memory(o, a):
            raise ValueError(
                f"{name}: out and buf overlap; blocks are written while others "
                "are still being sent: pass separate buffers"
            )
        uneven = out_splits is not None or in_splits is not None
        if not uneven:
            for what, obj, arr in (("buf", buf, a), ("out", out, o)):
                shape = tuple(getattr(obj, "shape", ()))
                if not shape or shape[0] != n:
                    raise ValueError(
                        f"{name}: {what} must have world_size ({n}) rows (its "
                        f"first axis), got shape {shape}; for blocks of unequal "
                        "sizes pass out_splits / in_splits"
                    )
            if o.size != a.size:
                raise ValueError(
                    f"{name}: out has {o.size} elements but buf has {a.size}; "
                    "both hold world_size equal blocks"
                )
        send = _split_bounds(in_splits, a.size, n, "in_splits", "buf", name)
        recv = _split_bounds(out_splits, o.size, n, "out_splits", "out", name)
        r = self.core.rank
        if send[r][1] - send[r][0] != recv[r][1] - recv[r][0]:
            raise ValueError(
                f"{name}: rank {r} sends itself {send[r][1] - send[r][0]} "
                f"elements (in_splits[{r}]) but expects "
                f"{recv[r][1] - recv[r][0]} (out_splits[{r}])"
            )
        algorithm = "pairwise" if algorithm == "auto" else algorithm
        _pick(dict.fromkeys(ALL_TO_ALL), algorithm, name)
        # Equal blocks: the count travels in every header and every rank hears from every
        # other, so any difference is seen everywhere. Uneven: only a receiver can tell that
        # a block has the wrong size; a confirm round (unless the commit round follows)
        # makes its finding everybody's.
        desc = Descriptor(
            name, None if uneven else a.size, a.dtype.str, None, algorithm, "v" if uneven else None
        )
        confirm = uneven and not self.core.commits()

        def run(ch: Channel) -> None:
            pairwise.all_to_all(ch, o, a, send, recv, confirm=confirm)

        return self.core.submit(name, desc, timeout, async_op, dst, run)

    def gather(
        self,
        out: Buffer | None,
        buf: Buffer,
        dst: int,
        algorithm: str,
        async_op: bool,
        timeout: float | None,
    ) -> Work | None:
        name = "gather"
        n = self.core.world_size
        self.core.check_rank(dst, "dst", name)
        src = stage(buf, "buf", name, writable=False)
        a = src.array
        check_op_dtype(ReduceOp.SUM, a.dtype)
        staged, o = None, None
        if self.core.rank == dst:
            if out is None:
                raise TypeError(
                    f"{name}: out must be a numpy.ndarray or a torch.Tensor on "
                    f"the destination rank {dst}, got None"
                )
            staged = stage(out, "out", name)
            o = staged.array
            _check_rows(name, "out", out, o, a, n)
        algorithm = "linear" if algorithm == "auto" else algorithm
        _pick(dict.fromkeys(ROOTED_COPY), algorithm, name)
        desc = Descriptor(name, a.size, a.dtype.str, None, algorithm, dst)

        def run(ch: Channel) -> None:
            linear.gather(ch, o, a, dst)

        return self.core.submit(name, desc, timeout, async_op, staged, run)

    def scatter(
        self,
        out: Buffer,
        buf: Buffer | None,
        src: int,
        algorithm: str,
        async_op: bool,
        timeout: float | None,
    ) -> Work | None:
        name = "scatter"
        n = self.core.world_size
        self.core.check_rank(src, "src", name)
        dst = stage(out, "out", name)
        o = dst.array
        check_op_dtype(ReduceOp.SUM, o.dtype)
        a = None
        if self.core.rank == src:
            if buf is None:
                raise TypeError(
                    f"{name}: buf must be a numpy.ndarray or a torch.Tensor on "
                    f"the source rank {src}, got None"
                )
            a = stage(buf, "buf", name, writable=False).array
            _check_rows(name, "buf", buf, a, o, n)
        algorithm = "linear" if algorithm == "auto" else algorithm
        _pick(dict.fromkeys(ROOTED_COPY), algorithm, name)
        desc = Descriptor(name, o.size, o.dtype.str, None, algorithm, src)

        def run(ch: Channel) -> None:
            linear.scatter(ch, o, a, src)

        return self.core.submit(name, desc, timeout, async_op, dst, run)


def _check_rows(
    name: str, what: str, obj: Buffer, rows: np.ndarray, block: np.ndarray, n: int
) -> None:
    """`rows` (the flat view of `obj`) must be world_size rows of `block`'s size and dtype."""
    if rows.dtype != block.dtype:
        raise TypeError(f"{name}: {what} has dtype {rows.dtype} but the block has {block.dtype}")
    shape = tuple(getattr(obj, "shape", ()))
    if rows.size != n * block.size or not shape or (shape[0] != n and block.size):
        raise ValueError(
            f"{name}: {what} must have world_size ({n}) rows of "
            f"{block.size} elements; got shape {shape}"
        )


def _split_bounds(
    splits: Sequence[int] | None, size: int, n: int, what: str, buf_name: str, name: str
) -> list[tuple[int, int]]:
    """[(start, end)] of each rank's block in a flat buffer of `size` elements: equal blocks
    when `splits` is None, else consecutive blocks of splits[p] elements."""
    if splits is None:
        if size % n:
            raise ValueError(
                f"{name}: {buf_name} has {size} elements, not a multiple of "
                f"world_size ({n}); pass {what} for blocks of unequal sizes"
            )
        k = size // n
        return [(p * k, (p + 1) * k) for p in range(n)]
    try:
        counts = [int(c) for c in splits]
        bad = any(isinstance(c, bool) or int(c) != c for c in splits)
    except (TypeError, ValueError):
        raise TypeError(
            f"{name}: {what} must be a sequence of world_size ({n}) element counts, got {splits!r}"
        ) from None
    if bad or len(counts) != n or any(c < 0 for c in counts):
        raise ValueError(
            f"{name}: {what} must be world_size ({n}) non-negative element "
            f"counts, got {list(splits)!r}"
        )
    if sum(counts) != size:
        raise ValueError(
            f"{name}: {what} adds up to {sum(counts)} elements but {buf_name} has {size}"
        )
    bounds, start = [], 0
    for c in counts:
        bounds.append((start, start + c))
        start += c
    return bounds
