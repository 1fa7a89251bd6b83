"""The soak's operations: a seeded generator of mixed collectives and their numpy reference.

Every rank draws op i from numpy.random.default_rng([seed, i]) -- the same on every rank, so
all ranks agree on the sequence without talking -- and rank r's input from
default_rng([seed, i, r]). Each rank can therefore compute every rank's input, hence the
expected result, locally, and check its own result against numpy after every op.

Inputs are small integers (also in float buffers), so that every sum, product, max and min is
exact in every dtype and in any order: a result is compared bit for bit, except AVG (a
division), which is compared with allclose. PRODUCT draws from [-2, 2] (uint8: [0, 3]), so four
factors fit an int8; the other ops from [-8, 8] (unsigned: [0, 15]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import collectives as cl

MAX_BYTES = 4 << 20  # the largest buffer any op moves (the gathered one, if larger)
DTYPES = ["float32", "float64", "float16", "int32", "int64", "int8", "uint8"]
TORCH_DTYPES = {"float32", "float64", "float16", "int32", "int64", "int8", "uint8"}
FLOAT_OPS = ["SUM", "PRODUCT", "MAX", "MIN", "AVG"]
INT_OPS = ["SUM", "PRODUCT", "MAX", "MIN", "BAND", "BOR", "BXOR"]
# every collective with every algorithm it accepts (group/collective.py, group/exchanges.py)
ALGORITHMS = {
    "all_reduce": ["auto", "ring", "tree", "naive", "direct", "hierarchical"],
    "reduce": ["auto", "tree"],
    "broadcast": ["auto", "tree"],
    "all_gather": ["auto", "ring"],
    "reduce_scatter": ["auto", "ring"],
    "all_to_all": ["auto", "pairwise"],
    "gather": ["auto", "linear"],
    "scatter": ["auto", "linear"],
    "barrier": [None],
    "send_recv": [None],
}
# how often each kind comes up: all_reduce most, as in training
WEIGHTS = {
    "all_reduce": 4,
    "reduce": 1,
    "broadcast": 1,
    "all_gather": 1,
    "reduce_scatter": 1,
    "all_to_all": 1,
    "gather": 1,
    "scatter": 1,
    "barrier": 0.5,
    "send_recv": 1,
}
KINDS = list(WEIGHTS)
_P = np.array([WEIGHTS[k] for k in KINDS], float) / sum(WEIGHTS.values())


@dataclass
class Op:
    index: int
    kind: str
    algorithm: str | None
    dtype: str
    op: str | None  # ReduceOp name for reductions
    count: int  # elements per rank block
    root: int
    torch: bool  # buffers are torch tensors instead of numpy arrays

    def describe(self) -> str:
        return (
            f"op #{self.index}: {self.kind} alg={self.algorithm} {self.dtype} x "
            f"{self.count} op={self.op} root={self.root} {'torch' if self.torch else 'numpy'}"
        )


def draw(seed: int, i: int, n: int, max_bytes: int = MAX_BYTES) -> Op:
    """Op #i of the run: the same on every rank."""
    g = np.random.default_rng([seed, i])
    kind = KINDS[int(g.choice(len(KINDS), p=_P))]
    algorithm = ALGORITHMS[kind][int(g.integers(len(ALGORITHMS[kind])))]
    dtype = DTYPES[int(g.integers(len(DTYPES)))]
    ops = INT_OPS if np.dtype(dtype).kind in "iu" else FLOAT_OPS
    op = (
        ops[int(g.integers(len(ops)))]
        if kind in ("all_reduce", "reduce", "reduce_scatter")
        else None
    )
    # log-uniform from 1 element to max_bytes in all (rows of n blocks count n times)
    per_rank = (
        n if kind in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter") else 1
    )
    most = max(1, max_bytes // (np.dtype(dtype).itemsize * per_rank))
    count = int(np.exp(g.uniform(0, np.log(most)))) if kind != "barrier" else 0
    return Op(
        i,
        kind,
        algorithm,
        dtype,
        op,
        max(count, 1) if kind != "barrier" else 0,
        int(g.integers(n)),
        bool(g.integers(3) == 0) and dtype in TORCH_DTYPES,
    )


def inputs(seed: int, op: Op, r: int, n: int) -> np.ndarray:
    """Rank r's input of `op`: `count` elements, or n rows of them where the op takes rows."""
    g = np.random.default_rng([seed, op.index, r])
    rows = n if op.kind in ("reduce_scatter", "all_to_all", "scatter") else 1
    unsigned = np.dtype(op.dtype).kind == "u"
    lo, hi = (
        ((0, 4) if unsigned else (-2, 3))
        if op.op == "PRODUCT"
        else ((0, 16) if unsigned else (-8, 9))
    )
    x = g.integers(lo, hi, size=rows * op.count).astype(op.dtype)
    return x.reshape(n, op.count) if rows > 1 else x


def _reduce(op: str, stack: np.ndarray) -> np.ndarray:
    dt = stack.dtype
    if op == "AVG":
        return (stack.astype(np.float64).sum(0) / len(stack)).astype(dt)
    ufunc = {
        "SUM": np.add,
        "PRODUCT": np.multiply,
        "MAX": np.maximum,
        "MIN": np.minimum,
        "BAND": np.bitwise_and,
        "BOR": np.bitwise_or,
        "BXOR": np.bitwise_xor,
    }[op]
    out = stack[0].copy()
    for row in stack[1:]:  # in rank order, in the dtype (as the library does)
        out = ufunc(out, row, dtype=dt)
    return out


def expected(seed: int, op: Op, r: int, n: int):
    """What rank r must hold after `op` (None: nothing to check on this rank)."""
    k = op.kind
    if k == "barrier":
        return None
    xs = [inputs(seed, op, q, n) for q in range(n)]
    if k == "all_reduce" or (k == "reduce" and r == op.root):
        return _reduce(op.op, np.stack(xs))
    if k == "reduce":
        return None  # a non-root's buffer is unspecified after reduce
    if k == "broadcast":
        return xs[op.root]
    if k == "all_gather" or (k == "gather" and r == op.root):
        return np.stack(xs)
    if k == "gather":
        return None
    if k == "reduce_scatter":
        return _reduce(op.op, np.stack(xs))[r]
    if k == "all_to_all":
        return np.stack([xs[p][r] for p in range(n)])
    if k == "scatter":
        return xs[op.root][r]
    if k == "send_recv":  # rank r receives from its left neighbour
        return xs[(r - 1) % n]
    raise ValueError(k)


def _buf(a: np.ndarray, use_torch: bool):
    if not use_torch:
        return a
    import torch

    return torch.from_numpy(a)  # shares memory: the numpy view sees the result


def run(pg, seed: int, op: Op, timeout: float):
    """Run `op` on group `pg` with this rank's seeded input; return what to check (or None)."""
    r, n = pg.rank, pg.world_size
    x = inputs(seed, op, r, n)
    kw = {} if op.algorithm is None else {"algorithm": op.algorithm}
    red = getattr(cl.ReduceOp, op.op) if op.op else None
    t = op.torch
    if op.kind == "all_reduce":
        pg.all_reduce(_buf(x, t), op=red, timeout=timeout, **kw)
        return x
    if op.kind == "reduce":
        pg.reduce(_buf(x, t), dst=op.root, op=red, timeout=timeout, **kw)
        return x
    if op.kind == "broadcast":
        pg.broadcast(_buf(x, t), src=op.root, timeout=timeout, **kw)
        return x
    if op.kind in ("all_gather", "gather"):
        out = np.zeros((n, op.count), op.dtype)
        if op.kind == "all_gather":
            pg.all_gather(_buf(out, t), _buf(x, t), timeout=timeout, **kw)
        else:
            mine = out if r == op.root else None
            pg.gather(
                None if mine is None else _buf(mine, t),
                _buf(x, t),
                dst=op.root,
                timeout=timeout,
                **kw,
            )
        return out
    if op.kind == "reduce_scatter":
        out = np.zeros(op.count, op.dtype)
        pg.reduce_scatter(_buf(out, t), _buf(x.reshape(-1), t), op=red, timeout=timeout, **kw)
        return out
    if op.kind == "all_to_all":
        out = np.zeros((n, op.count), op.dtype)
        pg.all_to_all(_buf(out, t), _buf(x, t), timeout=timeout, **kw)
        return out
    if op.kind == "scatter":
        out = np.zeros(op.count, op.dtype)
        pg.scatter(
            _buf(out, t), _buf(x, t) if r == op.root else None, src=op.root, timeout=timeout, **kw
        )
        return out
    if op.kind == "barrier":
        pg.barrier(timeout=timeout)
        return None
    if op.kind == "send_recv":  # a ring of pairs: send right, receive from the left
        out = np.zeros(op.count, op.dtype)
        w = pg.send(_buf(x, t), dst=(r + 1) % n, async_op=True, timeout=timeout)
        pg.recv(_buf(out, t), src=(r - 1) % n, timeout=timeout)
        w.wait(timeout)
        return out
    raise ValueError(op.kind)


def check(got, want, op: Op) -> str | None:
    """None if `got` is right, else what is wrong (for the report)."""
    if want is None:
        return None
    got = np.asarray(got).reshape(np.shape(want))
    if op.op == "AVG":
        ok = np.allclose(
            got.astype(np.float64),
            want.astype(np.float64),
            rtol=1e-2 if op.dtype == "float16" else 1e-6,
        )
    else:
        ok = np.array_equal(got, want)
    if ok:
        return None
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    j = int(bad[0]) if bad.size else 0
    return (
        f"{op.describe()}: {bad.size} of {want.size} elements wrong, first at [{j}]: got "
        f"{got.reshape(-1)[j]!r}, want {want.reshape(-1)[j]!r}"
    )
