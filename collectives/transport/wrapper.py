"""ChannelWrapper: the base of everything that sits between an algorithm and its OpChannel.

ProcessGroup builds one OpChannel per operation and passes it through its `channel_wrappers`
(callables ch -> ch) before the algorithm sees it. A wrapper is itself a Channel
(common/channel.py) and says which op it belongs to (OpView); it overrides what it adds:
tracing (teaching/trace.py), stepping (teaching/step.py), emulated link times
(teaching/emulate.py), fault injection (faults.py). What it forwards is listed here, not
looked up by name: a wrapper stacked on a wrapper sees the same names as one on the OpChannel.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..common.channel import Channel
from ..common.ops import ReduceOp


class OpView(Channel, Protocol):
    """A Channel that also says which op it carries: what a wrapper reads of what it wraps
    (an OpChannel, or another wrapper)."""

    @property
    def op_name(self) -> str:
        """The operation, as errors name it ("all_reduce", "send", ...)."""
        ...

    @property
    def seq(self) -> int:
        """The op's sequence number: the group's for a collective, the pair's for send/recv."""
        ...

    @property
    def stream(self) -> int:
        """0 for a collective, 1 for send/recv (each has its own sequence numbers)."""
        ...

    @property
    def deadline(self) -> float:
        """When the op times out (time.monotonic())."""
        ...

    @property
    def abort_peers(self) -> list[int] | None:
        """send/recv: [the peer] on the sending side, [] on the receiving side; None for a
        collective (every rank)."""
        ...


class ChannelWrapper:
    """Forwards the channel interface to the channel it wraps; subclasses override some of it.

    Rooted ops send their "confirm" messages (algorithms/rooted.py) through the outermost
    channel, so a wrapper sees those too.
    """

    def __init__(self, ch: OpView):
        self._ch = ch
        self.rank = ch.rank
        self.size = ch.size
        self.segment_bytes = ch.segment_bytes
        self.link_segment_bytes = ch.link_segment_bytes
        self.leaders_min_bytes = ch.leaders_min_bytes
        self.op_name = ch.op_name
        self.seq = ch.seq
        self.stream = ch.stream
        self.abort_peers = ch.abort_peers

    @property
    def deadline(self) -> float:
        return self._ch.deadline

    @property
    def inner(self) -> OpView:
        """The channel this one wraps."""
        return self._ch

    def send(
        self, peer: int, buf: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        self._ch.send(peer, buf, phase=phase, step=step, chunk=chunk)

    def recv_into(
        self, peer: int, out: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        self._ch.recv_into(peer, out, phase=phase, step=step, chunk=chunk)

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
        self._ch.recv_reduce(peer, out, op, phase=phase, step=step, chunk=chunk)


__all__ = ["ChannelWrapper", "OpView"]
