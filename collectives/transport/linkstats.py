"""Every inbound link measured from the ops' own frames: no extra traffic.

Each data frame's header carries the time its sender posted it (wire.py, sent_at). The
receiver notes when it took the frame off the transport, and charges the link from the sender
with the time the frame spent on it:

    transit_i = arrived_i - max(sent_i, arrived_{i-1})

where arrived_{i-1} is the previous frame from the same sender: a frame queued behind its
predecessor on the same link waits for it, and that wait is the predecessor's transit, not its
own. Two things are thereby left out of a link's figure that a plain "time spent waiting on
that peer" would include:

* a sender that posts late (a compute straggler, or a rank itself waiting upstream in a ring):
  the clock starts when the frame was posted, not when the receiver began to wait;
* the receiver's own busy time before it began to wait.

What is left is the link and the two transports' queues around it -- for frames that came
in while the receiver was waiting for them. A frame already queued when the receiver asked
for it (the wait returned at once, in less than FRESH) arrived at some unknown moment while
the receiver was busy elsewhere: counting it from its noticing would charge the receiver's
busy time to the link, and a compute straggler's inbound links would read slow. Such a frame
is not timed with the others (it still counts as the predecessor of the next one). A slow
link is always timed: its receiver ends up waiting for it.

A small frame found queued is still evidence: the link delivered it before it was needed. On
a healthy link of small ops nearly every frame is found so (the receiver was busy with another
peer's), so without them a healthy link has too few timed frames to be compared with, and a
slow one has no peers to be judged against. Such frames are counted apart (queued_frames),
with the bound on their transit that the moment they were found gives (queued_seconds: the
same formula, at most the true transit plus the receiver's busy time): the coordinator reads
them as links that keep up, never as slow ones (membership/failslow.py).

Large frames (LARGE_BYTES and up) give a throughput: bytes over the summed transit times.
Small frames give a latency: a running mean of transit. Both run from the same counters, kept
cumulative so that a lost heartbeat loses nothing: the coordinator differences two summaries.

The clocks: sent_at and arrived are wall-clock seconds (time.time()), the same clock on one
host and within a few milliseconds across hosts kept by NTP or PTP. A transit below zero (a
sender's clock ahead) counts as zero; a skew of a few ms is noise beside what a slow link costs
a large frame (a 4 MiB segment takes 0.8 s at 40 Mbit/s and a few ms at 10 Gbit/s).

A link routed around as slow carries next to nothing, so it is tested (linktest.py): a
LINK_TEST frame, timed from its posting and counted apart (tested_frames, and tested_best:
the fastest transit among the frames of the latest test, found queued ones at their bound),
never mixed with the ops' figures. The fastest, not the mean: a test sends a few frames, and
a descheduled sender or receiver (tens of ms on a loaded host) slows some of them, while no
frame crosses a slow link faster than its bytes allow.

How long a rank waited for senders that had not posted yet is kept too (`late`): a rank that
every peer waits for is slow to enter its ops -- a compute straggler, not a slow link.

Written by the op thread (channel.py), read by the heartbeat thread (summary()): the counters
are plain ints and floats updated in place under a lock that costs one acquire per frame.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

# Frames at least this large measure throughput, smaller ones latency. A smaller frame's time
# on a loaded host is mostly its receiver's wake-up, not its bytes: 64 KiB frames on a
# healthy veth read 135-175 Mbit/s on two cores at a load of 10-12 (4 ranks of 64 KiB ops,
# `python -m bench failslow --cases small4`), against peers at 600-750: false flags. The
# zmq transport's ring segments (1 MiB) stay above it.
LARGE_BYTES = 256 << 10
FRESH = 0.0005  # s: a wait that returned a frame sooner found it queued (not measured)


class LinkCounters(NamedTuple):
    """One inbound link's cumulative figures (src -> this rank), as a summary carries them."""

    src: int
    large_bytes: int  # bytes of large frames
    large_seconds: float  # their summed transit
    small_frames: int  # small frames
    small_seconds: float  # their summed transit
    late_seconds: float  # time this rank waited for the sender to post (not the link's)
    queued_frames: int = 0  # small frames found queued (not timed: they kept up)
    queued_seconds: float = 0.0  # the bound on their summed transit (at least the true one)
    tested_frames: int = 0  # LINK_TEST frames (linktest.py)
    tested_best: float = 0.0  # the fastest transit among the latest test's frames

    def wire(self) -> tuple[int, int, float, int, float, float, int, float, int, float]:
        return (
            self.src,
            self.large_bytes,
            round(self.large_seconds, 6),
            self.small_frames,
            round(self.small_seconds, 6),
            round(self.late_seconds, 6),
            self.queued_frames,
            round(self.queued_seconds, 6),
            self.tested_frames,
            round(self.tested_best, 6),
        )

    @classmethod
    def from_wire(cls, row: Any) -> LinkCounters | None:
        """A row of a summary as it arrived, or None if it is not one (never trusted)."""
        if not isinstance(row, (list, tuple)) or len(row) != 10:
            return None
        src, lb, ls, sf, ss, late, qf, qs, tf, ts = row
        if not all(type(x) is int and x >= 0 for x in (src, lb, sf, qf, tf)):
            return None
        if not all(type(x) in (int, float) and 0 <= x < 1e12 for x in (ls, ss, late, qs, ts)):
            return None
        return cls(src, lb, float(ls), sf, float(ss), float(late), qf, float(qs), tf, float(ts))


class _Link:
    __slots__ = (
        "large_bytes",
        "large_seconds",
        "small_frames",
        "small_seconds",
        "late",
        "last",
        "queued_frames",
        "queued_seconds",
        "tested_frames",
        "tested_best",
        "test_token",
    )

    def __init__(self) -> None:
        self.large_bytes = self.small_frames = self.queued_frames = self.tested_frames = 0
        self.large_seconds = self.small_seconds = self.late = self.queued_seconds = 0.0
        self.tested_best = 0.0
        self.test_token = -1  # the test tested_best is of
        self.last = 0.0  # when the previous frame from this sender arrived


class LinkStats:
    """The running figures of every inbound link of one rank (one per transport)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._links = [_Link() for _ in range(size)]
        self._lock = threading.Lock()

    def arrived(
        self,
        src: int,
        nbytes: int,
        sent_at: float,
        now: float,
        waiting_since: float,
        seen_arriving: bool = True,
    ) -> None:
        """A data frame of `nbytes` from `src`, posted at `sent_at` (the sender's clock), was
        taken at `now`; this rank had been waiting for it since `waiting_since` (or `now` if
        it was not waiting: it had been busy, or the frame was for a later wait).
        seen_arriving: it came in while this rank waited (else it was found queued)."""
        if not 0 <= src < self.size or sent_at <= 0:
            return
        # max() and min() written as the comparisons they make (the same result for every
        # float, NaN included): this runs for every data frame taken
        with self._lock:
            link = self._links[src]
            last = link.last
            transit = now - (last if last > sent_at else sent_at)
            if not transit > 0.0:
                transit = 0.0
            link.last = now
            if sent_at > waiting_since:
                link.late += (now if now < sent_at else sent_at) - waiting_since
            if not seen_arriving:
                if nbytes < LARGE_BYTES:  # it kept up: counted apart, its transit a bound
                    link.queued_frames += 1
                    link.queued_seconds += transit
                return
            if nbytes >= LARGE_BYTES:
                link.large_bytes += nbytes
                link.large_seconds += transit
            else:
                link.small_frames += 1
                link.small_seconds += transit

    def tested(self, src: int, sent_at: float, now: float, token: int) -> None:
        """A LINK_TEST frame of test `token` from `src` (linktest.py), posted at `sent_at`,
        taken at `now`. Its transit counts from its posting, never from its predecessor's
        taking (the ops' formula): on a link routed around, its predecessor is a commit
        message that its receiver, busy with the other peers, often takes late, by which
        time a 64 KiB test frame had mostly crossed (a link held to 40 Mbit/s read 1-2 ms
        so, under small ops). From its posting, it is a bound (at least the true transit),
        so a test never reads a link faster than it is."""
        if not 0 <= src < self.size or sent_at <= 0:
            return
        with self._lock:
            link = self._links[src]
            transit = max(0.0, now - sent_at)
            link.last = now  # the next frame from src queued behind it
            link.tested_frames += 1
            if token != link.test_token:  # a new test: its frames alone
                link.test_token, link.tested_best = token, transit
            else:
                link.tested_best = min(link.tested_best, transit)

    def summary(self) -> list[LinkCounters]:
        """Every inbound link that carried anything, cumulative (bounded: one row per rank)."""
        with self._lock:
            return [
                LinkCounters(
                    src,
                    x.large_bytes,
                    x.large_seconds,
                    x.small_frames,
                    x.small_seconds,
                    x.late,
                    x.queued_frames,
                    x.queued_seconds,
                    x.tested_frames,
                    x.tested_best,
                )
                for src, x in enumerate(self._links)
                if x.large_bytes or x.small_frames or x.queued_frames or x.tested_frames
            ]


__all__ = ["LARGE_BYTES", "LinkCounters", "LinkStats"]
