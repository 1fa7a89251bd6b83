"""Turning what the user passed (numpy array or torch tensor) into a flat numpy view, after
checking it, before any byte moves.

A CPU torch tensor shares memory with the numpy view, so results land in the tensor in place.
Two kinds of tensor are staged through a host copy instead, and copied back after the op:
bfloat16 (numpy has no such dtype; it is reduced as float32, then rounded once, identically on
every rank) and CUDA tensors (this is a fallback for machines without NCCL).
"""

from __future__ import annotations

from typing import Any

import sys

import numpy as np

from ..common.ops import SUPPORTED_DTYPES, SUPPORTED_SET


class Staged:
    """A flat numpy array for the algorithms, and how to put the result back."""

    __slots__ = ("array", "_write_back")

    def __init__(self, array: np.ndarray, write_back=None):
        self.array = array
        self._write_back = write_back

    def done(self):
        if self._write_back is not None:
            self._write_back(self.array)


def _torch() -> Any:
    return sys.modules.get("torch")


def is_tensor(obj) -> bool:
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def stage(obj, name: str, op_name: str, writable: bool = True) -> Staged:
    """Check `obj` and return a Staged flat view of it. Raises TypeError / ValueError."""
    if isinstance(obj, np.ndarray):
        flags = obj.flags  # a new object on every read: read once (every op stages)
        if not flags.c_contiguous:
            raise ValueError(
                f"{op_name}: {name} must be C-contiguous (got strides {obj.strides}); "
                "pass np.ascontiguousarray(x) and copy the result back"
            )
        if writable and not flags.writeable:
            raise ValueError(f"{op_name}: {name} is read-only; the result is written in place")
        if obj.dtype not in SUPPORTED_SET:
            raise TypeError(
                f"{op_name}: {name} has unsupported dtype {obj.dtype}; supported: "
                f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}"
            )
        return Staged(obj if obj.ndim == 1 else obj.reshape(-1))
    where = f"{op_name}: {name}"
    if is_tensor(obj):
        return _stage_tensor(obj, where)
    raise TypeError(f"{where} must be a numpy.ndarray or a torch.Tensor, got {type(obj).__name__}")


def _stage_tensor(t, where: str) -> Staged:
    torch = _torch()
    if t.is_sparse or t.layout != torch.strided:
        raise TypeError(f"{where} must be a dense (strided) tensor, got layout {t.layout}")
    if not t.is_contiguous():
        raise ValueError(
            f"{where} must be contiguous (got strides {tuple(t.stride())}); "
            "pass t.contiguous() and copy the result back"
        )
    if t.dtype == torch.bfloat16 or t.device.type != "cpu":
        host = t.detach().to("cpu", torch.float32 if t.dtype == torch.bfloat16 else t.dtype)
        array = host.numpy().reshape(-1)
        if array.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{where} has unsupported dtype {t.dtype}")

        def write_back(a, t=t):
            with torch.no_grad():
                t.copy_(torch.from_numpy(a).view(t.shape))

        return Staged(array, write_back)
    try:
        array = t.detach().numpy()
    except (TypeError, RuntimeError) as exc:
        raise TypeError(f"{where} has unsupported dtype {t.dtype}") from exc
    if array.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{where} has unsupported dtype {t.dtype}; supported: "
            f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}, torch.bfloat16"
        )
    return Staged(array.reshape(-1))


def stage_in_out(buf, out, op_name: str):
    """(staged buf, read only; staged out) of a collective that reads `buf` and writes `out`,
    which must hold the same dtype. The op's own dtype check (check_op_dtype) is the caller's."""
    src = stage(buf, "buf", op_name, writable=False)
    dst = stage(out, "out", op_name)
    if dst.array.dtype != src.array.dtype:
        raise TypeError(f"{op_name}: out has dtype {dst.array.dtype} but buf has {src.array.dtype}")
    return src, dst
