"""What the torch backend's methods share (backend.py, exchanges.py): torch's reduce ops and
timeouts read, split sizes and lists of tensors checked, results copied back into torch's
tensors, and the sparse all_reduce."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..common.ops import ReduceOp

# --- reduce ops ------------------------------------------------------------------------------
_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def _torch_op(opts: Any) -> ReduceOp:
    """The library's ReduceOp for a torch ReduceOp (or an options object carrying one)."""
    op = getattr(opts, "reduceOp", opts)
    for name in _OPS:
        if op == getattr(dist.ReduceOp, name):
            return ReduceOp[name]
    raise ValueError(
        f"the collectives backend does not support reduce op {op!r} (supported: {', '.join(_OPS)})"
    )


class Reduction:
    """A torch reduce op as the library runs it, with what NCCL accepts and Gloo refuses:

    * AVG on an integer tensor: SUM on the wire (wrapping, as every integer sum here), then
      each final element divided by the world size rounding toward zero -- NCCL's
      FuncSumPostDiv, `T(x / n)` in C. (The library itself refuses an integer AVG; NCCL
      accepts it and Lightning's sync_dist asks for it on an int64 counter.) AVG on bool is
      refused, as ProcessGroupNCCL refuses it.
    * PREMUL_SUM (dist._make_nccl_premul_sum(factor)): every rank's input multiplied by the
      factor, cast to the tensor's dtype as NCCL casts its scalar, then SUM.
    Float AVG stays the library's: SUM, then one division by n where a chunk becomes final.
    """

    def __init__(self, opts: Any, dtype: torch.dtype, n: int, name: str):
        op = getattr(opts, "reduceOp", opts)
        self.scale: Any = None
        self.int_avg = False
        if op == dist.ReduceOp.PREMUL_SUM:
            factor = getattr(op, "factor", None)
            if factor is None:
                raise ValueError(
                    f"{name}: PREMUL_SUM without a factor (make it with dist._make_nccl_premul_sum)"
                )
            self.op, self.scale = ReduceOp.SUM, factor
            return
        self.op = _torch_op(op)
        if self.op is ReduceOp.AVG and not (dtype.is_floating_point or dtype.is_complex):
            if dtype == torch.bool:
                raise TypeError(f"{name}: cannot use ReduceOp.AVG with boolean inputs (as NCCL)")
            self.op, self.int_avg, self.n = ReduceOp.SUM, True, n

    def prepare(self, t: torch.Tensor) -> torch.Tensor:
        """The input to send: `t` itself, or for PREMUL_SUM a scaled copy (never `t` changed)."""
        if self.scale is None:
            return t
        scale = torch.as_tensor(self.scale).to(device=t.device, dtype=t.dtype).reshape(())
        return t * scale

    def finish(self, t: torch.Tensor) -> None:
        """Turn a finished SUM into an integer AVG, in place (nothing for the other ops)."""
        if not self.int_avg:
            return
        if t.dtype in _WIDE_UNSIGNED:  # torch has no division for these: numpy's (floor =
            a = t.cpu().numpy()  # trunc on unsigned)
            np.floor_divide(a, a.dtype.type(self.n), out=a)
            t.copy_(torch.from_numpy(a))
        else:
            t.copy_(torch.div(t, self.n, rounding_mode="trunc"))


_WIDE_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)


def _timeout(opts: Any) -> float | None:
    """The per-call timeout in torch's options, in seconds, or None (the group's)."""
    t = getattr(opts, "timeout", None)
    if isinstance(t, timedelta) and t.total_seconds() > 0:
        return t.total_seconds()
    return None


_MONITORED_TAG = -7331  # send/recv tag of monitored_barrier's messages (users' tags are >= 0)


def _row_splits(t, split_sizes, n, what, name):
    """Element counts per rank for `t` cut along its first dimension: split_sizes rows each,
    or world_size equal blocks when split_sizes is empty."""
    rows = t.shape[0] if t.dim() else 1
    row = math.prod(t.shape[1:])  # elements per row (1 for a 1-D tensor)
    splits = list(split_sizes or ())
    if not splits:
        if rows % n:
            raise ValueError(
                f"{name}: {what} has {rows} rows, not a multiple of world_size "
                f"({n}); pass {what}_split_sizes"
            )
        return [rows // n * row] * n
    if len(splits) != n or any(int(s) < 0 for s in splits) or sum(splits) != rows:
        raise ValueError(
            f"{name}: {what}_split_sizes must be world_size ({n}) row counts "
            f"adding up to {what}'s {rows} rows, got {splits}"
        )
    return [int(s) * row for s in splits]


def _sparse_all_reduce(pg, t, op, timeout):
    """A sparse COO tensor's SUM over the ranks, as Gloo's: every rank's (indices, values)
    are gathered (padded to the largest count), laid end to end in rank order and coalesced,
    so every rank computes the same sum the same way; the result replaces `t`'s contents."""
    if op is not ReduceOp.SUM:
        raise ValueError(f"all_reduce: sparse tensors take ReduceOp.SUM only (as Gloo), got {op!r}")
    n = pg.world_size
    c = t.detach().coalesce()
    idx, val = c.indices().contiguous(), c.values().contiguous()
    nnz = idx.shape[1]
    counts = torch.empty((n, 1), dtype=torch.int64)
    pg.all_gather(counts, torch.tensor([nnz], dtype=torch.int64), timeout=timeout)
    m = int(counts.max())
    pad_idx = torch.zeros((idx.shape[0], m), dtype=idx.dtype)
    pad_idx[:, :nnz] = idx
    pad_val = torch.zeros((m, *val.shape[1:]), dtype=val.dtype)
    pad_val[:nnz] = val
    all_idx = torch.empty((n, *pad_idx.shape), dtype=idx.dtype)
    all_val = torch.empty((n, *pad_val.shape), dtype=val.dtype)
    pg.all_gather(all_idx, pad_idx, timeout=timeout)
    pg.all_gather(all_val, pad_val, timeout=timeout)
    k = [int(x) for x in counts.reshape(-1)]
    total = torch.sparse_coo_tensor(
        torch.cat([all_idx[r][:, : k[r]] for r in range(n)], 1),
        torch.cat([all_val[r][: k[r]] for r in range(n)]),
        c.shape,
    ).coalesce()
    with torch.no_grad():
        t.copy_(total)


def _as_list(tensors):
    """torch's own groups accept pg.allreduce(tensor) as well as pg.allreduce([tensor])."""
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _check_parts(parts, whole, n, name):
    if len(parts) != n:
        raise ValueError(f"{name}: expected a list of world_size ({n}) tensors, got {len(parts)}")
    for r, p in enumerate(parts):
        if p.numel() != whole.numel() or p.dtype != whole.dtype:
            raise ValueError(
                f"{name}: tensor {r} has {p.numel()} elements of {p.dtype}; the "
                f"collectives backend needs equal sizes ({whole.numel()} of "
                f"{whole.dtype})"
            )


def _into(out, fn):
    """Run fn(o) with o a contiguous tensor, then make sure the result is in `out`."""
    if out.is_contiguous():
        fn(out)
    else:
        tmp = out.contiguous()
        fn(tmp)
        out.copy_(tmp)
