"""What one benchmark run measures, and the nccl-tests arithmetic shared by workers and reports.

A `Spec` is plain data (it crosses into spawned worker processes). The helpers here define,
once for every backend, which buffers a collective uses at a given size, what each rank puts in
them, what the right answer is, and how bytes and time turn into algbw and busbw.

Sizes follow nccl-tests: the size of all_gather and reduce_scatter is the whole gathered
buffer (world_size x the per-rank piece), and that of all_to_all each rank's whole buffer
(world_size blocks, one for each rank), so a size that world_size x itemsize does not divide
is rounded down, and one that leaves no element per rank is skipped.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all")
PER_RANK = ("all_gather", "reduce_scatter", "all_to_all")  # sizes cut into world_size pieces
OPS = ("sum", "avg", "max", "min", "product")
ROOTED = ("broadcast", "reduce")


@dataclasses.dataclass
class Spec:
    collective: str = "all_reduce"
    backends: tuple = ("ring", "tree", "auto", "gloo")
    nproc: int = 2
    sizes: tuple = ()
    dtype: str = "float32"
    op: str = "sum"
    iters: int = 20
    warmup: int = 5
    repeats: int = 5
    transport: str = "shm"
    limit: bool = True
    progress: bool = True
    timeout: float = 60.0


def parse_size(text: str) -> int:
    """'4', '64K', '1M', '64MiB', '1G' -> bytes (binary multiples, as nccl-tests)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgKMG]?)(i?[bB])?\s*", str(text))
    if not m:
        raise ValueError(f"cannot read size {text!r}; write e.g. 4, 64K, 1M, 64M")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def size_range(lo: int, hi: int, factor: int = 2) -> tuple:
    if lo < 1 or hi < lo:
        raise ValueError(f"need 1 <= min-bytes <= max-bytes, got {lo} and {hi}")
    if factor < 2:
        raise ValueError(f"size step factor must be >= 2, got {factor}")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return tuple(out)


def fmt_size(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor: busbw = algbw x this, the per-link rate."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def root_of(collective: str) -> int:
    return 0 if collective in ROOTED else -1


def iters_for(size: int, iters: int) -> int:
    """Timed iterations per repeat at this size: `iters` up to 4 MiB, then scaled down so a
    repeat moves about iters x 4 MiB (at least 3), keeping a 64 MiB sweep to minutes on a
    2-core box. Every backend gets the same count at a given size."""
    cap = 4 << 20
    if size <= cap:
        return iters
    return max(3, min(iters, (iters * cap) // size))


class Layout:
    """The buffers of one collective at one size on one rank, as numpy arrays.

    `buf` is what the collective reads (and, for all_reduce / broadcast / reduce, writes in
    place); `out` is the separate output of all_gather, reduce_scatter and all_to_all (None
    otherwise).
    """

    def __init__(self, spec: Spec, size: int, rank: int):
        n = spec.nproc
        self.collective = spec.collective
        self.dtype = np.dtype(spec.dtype)
        self.rank, self.n = rank, n
        item = self.dtype.itemsize
        if spec.collective in PER_RANK:
            per = size // (item * n)
            self.count = per * n
            self.buf_count = per if spec.collective == "all_gather" else per * n
            self.out_count = per if spec.collective == "reduce_scatter" else per * n
        else:
            self.count = size // item
            self.buf_count, self.out_count = self.count, 0
        self.nbytes = self.count * item
        self.op = spec.op
        self.buf = np.empty(self.buf_count, self.dtype)
        self.out = np.empty(self.out_count, self.dtype) if self.out_count else None
        self._input = self._expected = None  # computed once per size, used per backend

    @property
    def empty(self) -> bool:
        return self.count == 0

    def pattern(self, rank: int, count: int) -> np.ndarray:
        """Small integers 1..5 that differ by rank and position: sums, products and averages
        of a few ranks stay exact in every dtype, so checking needs no tolerance but AVG's."""
        i = np.arange(count, dtype=np.int64)
        return (((i * 7 + rank * 3) % 5) + 1).astype(self.dtype)

    def fill(self):
        """Put this rank's input in place (untimed: before each repeat and each check)."""
        if self._input is None:
            self._input = self.pattern(self.rank, self.buf_count)
        self.buf[...] = self._input
        if self.out is not None:
            self.out[...] = 0

    def expected(self) -> np.ndarray | None:
        """The right contents of the result array on this rank (None: nothing to check)."""
        if self._expected is None:
            self._expected = (self._compute_expected(),)
        return self._expected[0]

    def _compute_expected(self):
        c = self.collective
        if c == "broadcast":
            return self.pattern(0, self.count)
        if c == "all_gather":
            return np.concatenate([self.pattern(r, self.buf_count) for r in range(self.n)])
        if c == "all_to_all":  # block r of every rank's input, in rank order
            per = self.buf_count // self.n
            return np.concatenate(
                [
                    self.pattern(p, self.buf_count)[self.rank * per : (self.rank + 1) * per]
                    for p in range(self.n)
                ]
            )
        if c == "reduce" and self.rank != 0:
            return None
        acc = _reduce_ranks(self, self.buf_count)
        if c == "reduce_scatter":
            return acc[self.rank * self.out_count : (self.rank + 1) * self.out_count]
        return acc

    def result(self) -> np.ndarray:
        return self.out if self.out is not None else self.buf

    def wrong(self, got: np.ndarray | None = None) -> int:
        """#wrong: elements that differ from the expected result (nccl-tests' column)."""
        exp = self.expected()
        if exp is None:
            return 0
        got = self.result() if got is None else np.asarray(got).reshape(-1)
        if got.shape != exp.shape:
            return int(exp.size)
        if self.op == "avg":
            tol = 4 * np.finfo(self.dtype).eps
            bad = ~np.isclose(got.astype(np.float64), exp.astype(np.float64), rtol=tol, atol=0)
            return int(bad.sum())
        return int(np.count_nonzero(got != exp))


def _reduce_ranks(lay: Layout, count: int) -> np.ndarray:
    ufunc = {
        "sum": np.add,
        "avg": np.add,
        "max": np.maximum,
        "min": np.minimum,
        "product": np.multiply,
    }[lay.op]
    acc = lay.pattern(0, count)
    for r in range(1, lay.n):
        ufunc(acc, lay.pattern(r, count), out=acc)
    if lay.op == "avg":
        acc = (acc.astype(np.float64) / lay.n).astype(lay.dtype)
    return acc
