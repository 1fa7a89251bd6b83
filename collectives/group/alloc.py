"""Registered buffers for a group: pg.alloc / pg.alloc_tensor (and cl.empty for the default group).

An array from here lives in shared memory (transport/zmq/registered.py), so that a peer on the same
host reads it in place during a collective instead of the sender copying it into a slot first:
about half the copies of a large all_reduce. Any other array works as before; this only makes
the same calls faster. Where the group's transport has no shared memory (tcp, ipc, the in-process
simulation, a platform without memfd) the array is ordinary memory, and `is_registered` says so.

Lifetime: the memory lives as long as the array (or any view of it, or a tensor over it) and is
freed with it. It is not tied to the group: after reconstruct() the same array is registered in
the new group too, and after destroy() it stays an ordinary, valid array.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import numpy as np

from ..transport.zmq import registered
from .core import GroupCore

log = logging.getLogger("collectives")


def _numpy_dtype(dtype: Any) -> np.dtype:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        try:
            found: np.dtype = torch.empty(0, dtype=dtype).numpy().dtype
            return found
        except (TypeError, RuntimeError):
            raise TypeError(
                f"alloc_tensor: dtype {dtype} has no numpy equivalent, so it cannot "
                "live in a registered buffer (bfloat16: allocate float32)"
            ) from None
    out: np.dtype = np.dtype(dtype)
    return out


def is_registered(buf: Any) -> bool:
    """True if `buf` (numpy array or CPU tensor) lives in registered shared memory."""
    return registered.is_registered(buf)


class Allocations:
    """alloc and alloc_tensor of one ProcessGroup, over its core (the transport says whether
    same-host shared memory is on)."""

    def __init__(self, core: GroupCore):
        self.core = core

    def alloc(self, shape: int | tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = _numpy_dtype(dtype)
        if self.core.transport.shares_memory():
            try:
                return registered.allocate(shape, dtype)
            except OSError as exc:
                log.info(
                    "rank %d: alloc%s gives ordinary memory: %s",
                    self.core.rank,
                    (tuple(np.atleast_1d(shape)),),
                    exc,
                )
        return np.zeros(shape, dtype)

    def alloc_tensor(self, shape: int | tuple[int, ...], dtype: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is None:
            raise RuntimeError("alloc_tensor: import torch first (collectives never imports it)")
        return torch.from_numpy(self.alloc(shape, torch.float32 if dtype is None else dtype))
