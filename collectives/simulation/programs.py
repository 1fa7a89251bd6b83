"""Each rank's program of one collective: the ordered sends and receives the real algorithm
makes, recorded once per (algorithm, ranks, count) and replayed in virtual time (world.py).

The algorithms (algorithms/) are pure schedules over a Channel, and none of them branches on
the values it receives: a channel that records each call and hands back zeros gives, rank by
rank, exactly the order of messages the algorithm makes over a real transport. The commit
round (algorithms/commit.py) that a group surviving failures runs after every collective is
recorded the same way, after a HOLD step: from there on the rank holds its result.

An op under a schedule the coordinator chose around slow links (algorithms/schedule.py, Plan)
runs what the group runs (group/rerouted.py): `choose` picks the schedule for the plan, the
algorithm and the size, and `run_schedule` runs it over the plan's order; its program is
recorded from those same calls (`rerouted_programs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Literal

import numpy as np

from ..algorithms import commit, ring, tree
from ..algorithms.costmodel import Schedule
from ..algorithms.schedule import Plan
from ..common.ops import ReduceOp
from ..group import rerouted

Kind = Literal["send", "recv", "hold"]
SEGMENT_BYTES = 4 << 20  # the transport's pipelining unit (transport/base.py)


@dataclass(frozen=True)
class Step:
    kind: Kind
    peer: int = -1
    nbytes: int = 0
    phase: str = ""


class RecordingChannel:
    """A Channel (common/channel.py) that records what one rank does; receives give zeros."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size
        self.steps: list[Step] = []

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def segment_bytes(self) -> int:
        return SEGMENT_BYTES

    @property
    def link_segment_bytes(self) -> int | None:
        return None

    @property
    def leaders_min_bytes(self) -> int:
        return 0

    def send(
        self, peer: int, buf: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        self.steps.append(Step("send", peer, int(buf.nbytes), phase))

    def recv_into(
        self, peer: int, out: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        out[...] = 0
        self.steps.append(Step("recv", peer, int(out.nbytes), phase))

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
        self.steps.append(Step("recv", peer, int(out.nbytes), phase))


Algorithm = Callable[[RecordingChannel, np.ndarray, ReduceOp], None]
ALGORITHMS: dict[str, Algorithm] = {"ring": ring.all_reduce, "tree": tree.all_reduce}


Programs = tuple[tuple[Step, ...], ...]


@lru_cache(maxsize=None)
def programs(algorithm: str, n: int, count: int) -> Programs:
    """Rank r's program of an all_reduce of `count` float32 over n ranks, commit round
    included where the group runs one (n > commit.SKIP_AT_MOST)."""
    return _record(n, lambda ch, arr: ALGORITHMS[algorithm](ch, arr, ReduceOp.SUM), count)


def chosen(plan: Plan | None, algorithm: str, count: int) -> Schedule | None:
    """The schedule an all_reduce of `algorithm` runs under `plan` (None: the default), as
    the group chooses it (group/rerouted.py, choose: the same on every rank)."""
    if plan is None:
        return None
    return rerouted.choose(plan, algorithm, False, 4 * count, None, 1)


@lru_cache(maxsize=256)
def rerouted_programs(schedule: Schedule, n: int, count: int) -> Programs:
    """Each rank's program of an all_reduce run under `schedule` (rerouted.run_schedule)."""

    def run(ch: RecordingChannel, arr: np.ndarray) -> None:
        rerouted.run_schedule(schedule, ch, arr, ReduceOp.SUM, None)  # type: ignore[arg-type]

    return _record(n, run, count)


def _record(n: int, run: Callable[[RecordingChannel, np.ndarray], None], count: int) -> Programs:
    out = []
    for r in range(n):
        ch = RecordingChannel(r, n)
        run(ch, np.zeros(count, dtype=np.float32))
        if n > commit.SKIP_AT_MOST:
            ch.steps.append(Step("hold"))
            commit.commit(ch)
        out.append(tuple(ch.steps))
    return tuple(out)
