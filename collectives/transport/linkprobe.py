"""Timed link probes: evidence for a stall diagnosis that the stalled op's picture cannot give.

When a stalled op shows one bad link and its two ends tie (membership/diagnose.py), the
coordinator tells every rank in the stall to probe: each sends one LINK_PROBE frame of
`nbytes` bytes to every peer named, over the same transport and links that carry the data
(the same sockets, shared memory aside, and the same injected link faults), then listens for
the peers' probes for `window` seconds -- twice that where a probe that did arrive came late
(past half the window: the host is loaded right now). A rank reports, per peer, how long after
it began listening that peer's probe arrived, or None if it did not.

Why a payload and not an empty frame: a link slowed to a trickle still carries a few bytes
quickly once the stalled op's backlog has drained; a probe of a few KiB takes seconds on such
a link and microseconds on a healthy one. Why one-way and not a round trip: a round trip
crosses both directions of a pair, and a slow link is often slow one way only.

Frames of other kinds that arrive meanwhile are handled as a wait in an op would handle them:
those of later ops (or point-to-point) are kept, the rest dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from .base import Transport
from .wire import LINK_PROBE, LINK_TEST, STREAM_OF, Header, decode_header, encode_header

log = logging.getLogger("collectives")


class StalledOp(NamedTuple):
    """The op whose stall is diagnosed, as this rank runs it (its OpChannel's)."""

    rank: int
    size: int
    seq: int
    op_name: str


def probe_links(
    t: Transport, op: StalledOp, token: int, peers: Iterable[int], nbytes: int, window: float
) -> dict[int, float | None]:
    """Run this rank's side of a probe round for op `op.seq` over transport `t`. Returns
    {peer: seconds until its probe arrived, or None}."""
    peers = [p for p in peers if p != op.rank and 0 <= p < op.size]
    header = encode_header(LINK_PROBE, t.generation, op.seq, op.rank, token, "probe", 0, 0, None)
    filler = bytes(nbytes)
    start = time.monotonic()
    for p in peers:
        try:
            t.post(p, header, filler, False)
        except Exception as exc:  # a dead peer: its link shows as not heard
            log.debug("rank %d could not probe rank %d: %s", op.rank, p, exc)
    heard: dict[int, float] = {}
    deadline, extended = start + window, False
    while len(heard) < len(peers):
        now = time.monotonic()
        if now >= deadline:
            if extended or not heard or max(heard.values()) < window / 2:
                break
            # A healthy link answered late: this machine is slow right now (a loaded host, a
            # descheduled peer). Listen one window more before calling the rest slow.
            deadline, extended = start + 2 * window, True
            continue
        got = t.next_frame(min(deadline - now, 0.1))
        if got is None:
            continue
        src, raw, payload = got
        h = decode_header(raw)
        if (
            h is not None
            and h.type == LINK_PROBE
            and h.src == src
            and h.generation == t.generation
            and h.number == token  # the round, not the op: a rank past the stalled op
        ):  # probes from its next one (membership/verdicts.py judges both stalls as one)
            heard.setdefault(src, time.monotonic() - start)
            t.release(payload)
            continue
        _keep_or_drop(t, op, src, h, payload)
    log.info(
        "rank %d probed its links for op #%d: %s",
        op.rank,
        op.seq,
        ", ".join(f"{p}->{op.rank} {_ms(heard.get(p))}" for p in peers),
    )
    return {p: heard.get(p) for p in peers}


def _keep_or_drop(t: Transport, op: StalledOp, src: int, h: Header | None, payload: Any) -> None:
    """A frame that is not this round's probe: kept if a later op (or a send/recv) of this
    generation may want it, else dropped."""
    if (
        h is None
        or h.type not in STREAM_OF
        or h.type in (LINK_PROBE, LINK_TEST)
        or h.generation != t.generation
        or h.src != src
    ):
        t.release(payload)
        return
    stream = STREAM_OF[h.type]
    if stream == 0 and h.seq <= op.seq:
        t.release(payload)  # the stalled op's (or older): nobody will take it
        return
    try:
        t.early.put(
            op.rank,
            src,
            stream,
            h,
            payload,
            h.seq - op.seq if stream == 0 else None,
            op.op_name,
            t.generation,
        )
    except Exception:
        t.release(payload)


def _ms(seconds: float | None) -> str:
    return "not heard" if seconds is None else f"{seconds * 1000:.0f} ms"
