"""The coordinator's probe round: link evidence for a stall whose own picture ties.

verdicts.py judges a stalled op from the progress every rank reports (diagnose.judge). When
that picture cannot single out the culprits (one stalled link, its two ends tie), it gathers
more before deciding:

  1. it waits for every live member to ask about the stall: each asks once its own deadline
     passes, and a rank that entered the op later (its previous op ended later, on a slow
     link) asks later, at most one op timeout after the first (ASK_WAIT);
  2. it tells every asker to probe: each sends PROBE_BYTES to every other asker over its data
     links and listens for `window` s (transport/linkprobe.py);
  3. it takes their reports -- per peer, when its probe arrived, or None -- until all are in
     or the window and a grace have passed, and judges again with them (diagnose.judge).

The ranks do not share a clock, so each report also says how long its rank spent since the
instruction arrived; the coordinator, which has one clock for all of them, places every
rank's start on it. A probe that a rank did not hear from a peer that started well after it
(more than half a window: a descheduled process, a late instruction) says nothing about the
link, and is left out rather than counted slow.

The whole diagnosis is bounded by the op timeout T of the askers: at most T waiting for
askers (the state window, 2 heartbeat intervals, runs meanwhile), the probe window (T/3,
within 0.25-2 s; twice that on a rank whose healthy probes arrived late, a loaded host) and a
grace for the reports (T/4, within 0.1-0.5 s): under 2 T for T >= 1 s at the default
heartbeat interval. When every member asks at once, about a second.
"""

from __future__ import annotations

from .protocol import Probe, Probed
from .state import Diagnosis, Outbox, ProbeRound

PROBE_BYTES = 16 << 10  # a healthy link carries it in well under a millisecond; one slowed
#                          to ~20 kbit/s (the scenario tc reproduces) takes over 6 s
ASK_WAIT = 1.0  # of the op timeout: how long to wait for every member to ask


def window(timeout: float) -> float:
    """How long each rank listens for its peers' probes."""
    return min(2.0, max(0.25, timeout / 3))


def grace(timeout: float) -> float:
    """How long after the window the coordinator waits for the reports."""
    return min(0.5, max(0.1, timeout / 4))


def ready_to_probe(d: Diagnosis, live_ranks: list[int], now: float) -> bool:
    """Every live member has asked, or waiting longer would spend the time bound."""
    return set(live_ranks) <= set(d.ranks) or now >= d.first + ASK_WAIT * d.timeout


def start(out: Outbox, d: Diagnosis, seq: int, token: int, now: float) -> bool:
    """Send the probe instruction (named `token`) to the askers that can probe; False if
    fewer than two can (then nothing can be measured: the caller decides on what it has)."""
    part = sorted(r for r in d.ranks if d.can_probe.get(r))
    if len(part) < 2:
        return False
    w = window(d.timeout)
    d.probe = ProbeRound(token, part, w, now, now + 2 * w + grace(d.timeout))
    for r in part:
        out.send(
            d.ranks[r],
            Probe(
                seq=d.asked.get(r, seq),  # the op it asked about: it waits on that
                token=token,
                peers=part,
                bytes=PROBE_BYTES,
                window=w,
            ),
        )
    return True


def take_report(d: Diagnosis, rank: int, msg: Probed, world_size: int, now: float) -> None:
    """A rank's probe report: kept if it answers this round, from a rank in it."""
    pr = d.probe
    if pr is None or msg.token != pr.token or rank not in pr.ranks:
        return
    heard = msg.heard
    if len(heard) != world_size:
        return
    pr.reports[rank] = (now - msg.elapsed, {p: heard[p] for p in pr.ranks if p != rank})


def done(pr: ProbeRound, now: float) -> bool:
    return len(pr.reports) == len(pr.ranks) or now >= pr.until


def results(pr: ProbeRound) -> dict[int, dict[int, float | None]]:
    """rank -> {peer: seconds or None}, the links that tell nothing (see the module's
    docstring) left out."""
    starts = {r: rep[0] for r, rep in pr.reports.items()}
    out = {}
    for r, (_, row) in pr.reports.items():
        out[r] = {
            p: sec
            for p, sec in row.items()
            if p in starts and not (sec is None and starts[p] - starts[r] > pr.window / 2)
        }
    return out
