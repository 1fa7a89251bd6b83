"""Frames that arrived before this rank wanted them (Transport.early), bounded.

A frame for a later op (or from another peer than the one awaited) is kept until this rank gets
there, per (source rank, stream). Without a bound, one peer -- a member gone bad, or anyone on
an unauthenticated (COLLECTIVES_INSECURE) job -- could fill this rank's memory with frames for
ops that never come. So the stash holds at most MAX_BYTES of payload in all, and a collective's
frame at most MAX_AHEAD ops ahead of this rank (a send/recv frame: at most MAX_AHEAD messages
waiting from its sender); a frame past either bound fails the op in progress with an error
naming its sender. Both are far above what a correct program needs: with the commit round a
peer is at most one op ahead; without it (the torch backend, small groups) a rank that only
sends (a reduce's leaves, a broadcast's root) may run ahead by as many ops as it likes, which
is why the bound is large.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ..common.errors import CollectiveError

MAX_BYTES = 1 << 30
MAX_AHEAD = 1024


def _nbytes(payload: Any) -> int:
    try:
        return memoryview(payload).nbytes
    except TypeError:
        return 0


Item = tuple[Any, Any]  # (header: wire.Header, payload buffer)


class _Queue(deque[Item]):
    """A deque of (header, payload) whose popleft keeps its owner's byte count."""

    def __init__(self, owner: EarlyFrames):
        super().__init__()
        self.owner = owner

    def popleft(self) -> Item:
        item = super().popleft()
        self.owner.nbytes -= _nbytes(item[1])
        return item


class EarlyFrames(dict[tuple[int, int], deque[Item]]):
    """(src, stream) -> deque of (header, payload); read as a dict of deques (base.py), filled
    through put() only."""

    def __init__(self, max_bytes: int | None = None, max_ahead: int | None = None):
        super().__init__()
        self.max_bytes = MAX_BYTES if max_bytes is None else max_bytes
        self.max_ahead = MAX_AHEAD if max_ahead is None else max_ahead
        self.nbytes = 0

    def put(
        self,
        rank: int,
        src: int,
        stream: int,
        header: Any,
        payload: Any,
        ahead: int | None,
        op: str | None = None,
        generation: int | None = None,
    ) -> None:
        """Keep a frame; `ahead`: how many ops past this rank's current one it is (None for
        send/recv, where the frames already waiting count). Raises CollectiveError naming
        `src` if a bound would be passed (the caller releases the payload)."""
        queue = self.get((src, stream))
        if queue is None:
            queue = self[(src, stream)] = _Queue(self)
        n = _nbytes(payload)
        far = len(queue) + 1 if ahead is None else ahead
        what = None
        if far > self.max_ahead:
            what = (
                f"{far} {'messages' if ahead is None else 'ops'} ahead of this rank "
                f"(at most {self.max_ahead})"
            )
        elif self.nbytes + n > self.max_bytes:
            what = f"more than {self.max_bytes} bytes of frames for ops this rank has not reached"
        if what is not None:
            raise CollectiveError(
                f"rank {rank} refused a frame from rank {src}: {what}; "
                "that rank runs too far ahead, or misbehaves",
                op=op,
                rank=rank,
                peer=src,
                generation=generation,
            )
        queue.append((header, payload))
        self.nbytes += n


def drop_all(early: dict[tuple[int, int], deque[Item]], release: Callable[[Any], None]) -> int:
    """Empty a transport's stash (it is closing: those ops will never run), handing every
    payload to `release` (a slot goes back to its sender); the bytes dropped. Without this a
    retired transport -- the group of an old generation, still referenced -- would keep up to
    MAX_BYTES of frames that a misbehaving peer sent ahead."""
    dropped = 0
    for queue in list(early.values()):
        while queue:
            _, payload = deque.popleft(queue)
            dropped += _nbytes(payload)
            release(payload)
    early.clear()
    if isinstance(early, EarlyFrames):
        early.nbytes = 0
    return dropped


def take(queue: deque[Item], match: Callable[[Any], bool]) -> Item | None:
    """Remove and return the first (header, payload) of `queue` whose header `match`es, or
    None. Frames of different ops may arrive in any order (a later op's over a fast link
    before an earlier op's over ZeroMQ, fastlink.py), so this op's may sit behind another's."""
    for i, item in enumerate(queue):
        if match(item[0]):
            del queue[i]
            if isinstance(queue, _Queue):
                queue.owner.nbytes -= _nbytes(item[1])
            return item
    return None
