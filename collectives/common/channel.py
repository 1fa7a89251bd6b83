"""The Channel: everything an algorithm sees of one collective operation.

An algorithm (algorithms/) is a schedule over this interface and nothing else, as Gloo's
algorithms see only a Context and its Pairs. The transport's OpChannel (transport/channel.py)
implements it; so do the views that algorithms compose (algorithms/subgroup.py, a subset of the
ranks; algorithms/gloo_ring.py, the ranks mirrored) and the wrappers between a group and its
algorithms (transport/wrapper.py: tracing, stepping, emulated links, fault injection).

It lives in the ground layer because both sides name it: the algorithms are typed against it,
and the transport's wrappers hold one. algorithms/__init__.py exports it as
`collectives.algorithms.Channel`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .ops import ReduceOp


class Channel(Protocol):
    """One op's view of the group. Every transfer is labelled with its phase, step and chunk,
    which travel in the message header (traces, error messages, mismatch detection)."""

    @property
    def rank(self) -> int:
        """This rank's index, 0 .. size - 1."""
        ...

    @property
    def size(self) -> int:
        """The number of ranks taking part."""
        ...

    @property
    def segment_bytes(self) -> int:
        """The pipelining unit: a large buffer is sent as pieces of at most this many bytes."""
        ...

    @property
    def link_segment_bytes(self) -> int | None:
        """Pieces across hosts (hierarchical.py): at most this many bytes where that is smaller
        than segment_bytes; None: segment_bytes. A transport across a slow link sets it."""
        ...

    @property
    def leaders_min_bytes(self) -> int:
        """hierarchical.py: below this many bytes, one leader per host instead of k; 0: the
        k-leader schedule at any size."""
        ...

    def send(
        self, peer: int, buf: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        """Start sending `buf` to `peer`; the buffer must not change until the op ends."""
        ...

    def recv_into(
        self, peer: int, out: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        """Block until `peer`'s next message arrives; copy it into `out`."""
        ...

    def recv_reduce(
        self,
        peer: int,
        out: np.ndarray,
        op: ReduceOp,
        *,
        phase: str = "",
        step: int = 0,
        chunk: int = 0,
    ) -> None:
        """Block until `peer`'s next message arrives; reduce it into `out` (out = out op msg)."""
        ...


__all__ = ["Channel"]
