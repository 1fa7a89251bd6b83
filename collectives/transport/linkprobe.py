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

from .wire import H_GEN, H_INDEX, H_SEQ, H_SRC, H_TYPE, LINK_PROBE, STREAM_OF, decode_header
from .wire import encode_header

log = logging.getLogger("collectives")


def probe_links(ch, token: int, peers, nbytes: int, window: float) -> dict:
    """Run this rank's side of a probe round for op `ch.seq` (ch: the stalled op's
    OpChannel). Returns {peer: seconds until its probe arrived, or None}."""
    t = ch.t
    peers = [p for p in peers if p != ch.rank and 0 <= p < ch.size]
    header = encode_header(LINK_PROBE, t.generation, ch.seq, ch.rank, token, "probe", 0, 0, None)
    filler = bytes(nbytes)
    start = time.monotonic()
    for p in peers:
        try:
            t.post(p, header, filler, False)
        except Exception as exc:  # a dead peer: its link shows as not heard
            log.debug("rank %d could not probe rank %d: %s", ch.rank, p, exc)
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
            and h[H_TYPE] == LINK_PROBE
            and h[H_SRC] == src
            and h[H_GEN] == t.generation
            and h[H_INDEX] == token  # the round, not the op: a rank past the stalled op
        ):  # probes from its next one (membership/verdicts.py judges both stalls as one)
            heard.setdefault(src, time.monotonic() - start)
            t.release(payload)
            continue
        _keep_or_drop(ch, src, h, payload)
    log.info(
        "rank %d probed its links for op #%d: %s",
        ch.rank,
        ch.seq,
        ", ".join(f"{p}->{ch.rank} {_ms(heard.get(p))}" for p in peers),
    )
    return {p: heard.get(p) for p in peers}


def _keep_or_drop(ch, src, h, payload):
    """A frame that is not this round's probe: kept if a later op (or a send/recv) of this
    generation may want it, else dropped."""
    t = ch.t
    if (
        h is None
        or h[H_TYPE] not in STREAM_OF
        or h[H_TYPE] == LINK_PROBE
        or h[H_GEN] != t.generation
        or h[H_SRC] != src
    ):
        t.release(payload)
        return
    stream = STREAM_OF[h[H_TYPE]]
    if stream == 0 and h[H_SEQ] <= ch.seq:
        t.release(payload)  # the stalled op's (or older): nobody will take it
        return
    try:
        t.early.put(
            ch.rank,
            src,
            stream,
            h,
            payload,
            h[H_SEQ] - ch.seq if stream == 0 else None,
            ch.op_name,
            t.generation,
        )
    except Exception:
        t.release(payload)


def _ms(seconds) -> str:
    return "not heard" if seconds is None else f"{seconds * 1000:.0f} ms"
