"""A sub-channel: the channel of an operation seen by a subset of its ranks.

    leaders = SubChannel(ch, [0, 2, 4], "leaders")   # on global rank 2: rank 1 of size 3
    ring.all_reduce(leaders, buf, op)                # a ring over global ranks 0, 2 and 4

rank and size are this rank's index in `members` and len(members); a peer index is turned
into the global rank members[peer] before the message goes to the channel underneath, so any
algorithm of this package runs unchanged on a subset of the group (hierarchical.py runs tree
and ring this way). Phases are prefixed with the sub-group's name ("leaders reduce-scatter"),
so traces and error messages say which part of a composed schedule a message belongs to.
Messages keep their order per pair of global ranks, as on the channel itself: a composed
schedule must not have two sub-groups exchange messages between the same pair of ranks in
different orders on the two sides.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..common.channel import Channel
from ..common.ops import ReduceOp


class SubChannel:
    """A Channel (common/channel.py) over `members` of the channel `ch`."""

    def __init__(
        self,
        ch: Channel,
        members: Sequence[int],
        name: str = "",
        segment_bytes: int | None = None,
    ):
        self._ch = ch
        self.members = list(members)
        if ch.rank not in self.members:
            raise ValueError(f"SubChannel: rank {ch.rank} is not one of {self.members}")
        self.rank = self.members.index(ch.rank)
        self.size = len(self.members)
        self.segment_bytes = segment_bytes or ch.segment_bytes  # the pieces of its schedule
        # A sub-channel's pieces are cut already (segment_bytes, by the schedule that made
        # it), and its schedules are flat: no further cut across hosts, no leader choice.
        self.link_segment_bytes: int | None = None
        self.leaders_min_bytes = 0
        self.name = name

    def _phase(self, phase: str) -> str:
        return f"{self.name} {phase}" if self.name else phase

    def send(
        self, peer: int, buf: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        self._ch.send(self.members[peer], buf, phase=self._phase(phase), step=step, chunk=chunk)

    def recv_into(
        self, peer: int, out: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        self._ch.recv_into(
            self.members[peer], out, phase=self._phase(phase), step=step, chunk=chunk
        )

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
        self._ch.recv_reduce(
            self.members[peer], out, op, phase=self._phase(phase), step=step, chunk=chunk
        )
