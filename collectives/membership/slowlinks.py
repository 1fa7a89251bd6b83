"""The shells around fail-slow handling: the coordinator's part, and a member's two hooks.

Coordinator (SlowLinks): one Reroute (reroute.py) per generation, fed from the beats and the
members' answers, ticked with the coordinator's loop; what it returns is carried out through
four narrow callables the server hands in -- send to every member, write a note, remove a
rank, is a spare waiting -- so this part never reads the server's tables.

Member: beat_fields(t) adds the link summary (transport/linkstats.py) to a heartbeat;
on_notice(t, msg) takes a proposal or a decision (transport/schedbook.py) and returns the
answer to send, if any.

Messages (membership/protocol.py lists the rest):
  beat        {..., links: [[src, large_bytes, large_s, small_frames, small_s, late_s], ...]}
  schedule    {generation, version, start, plan, ops}  coordinator -> every member's heartbeat
                                                  (ops: the plan holds for that many ops)
  sched_ack   {mid, generation, version, ok}      member -> coordinator
  sched_go / sched_drop {generation, version}     coordinator -> every member
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from ..algorithms.schedule import Plan
from ..transport.base import Transport
from ..transport.linkstats import LinkCounters
from .reroute import Note, Replace, Reroute, ToAll

log = logging.getLogger("collectives")
EVAL_EVERY = 0.2  # s between two judgements: the coordinator's loop ticks every few ms


class SlowLinks:
    """The coordinator's fail-slow part (see the module's docstring)."""

    def __init__(
        self,
        policy: str,
        send_all: Callable[[dict], None],
        note: Callable[[str], None],
        replace: Callable[[int, str], None],
        spare_waiting: Callable[[], bool],
    ):
        self.policy = policy
        self._send_all, self._note = send_all, note
        self._replace, self._spare_waiting = replace, spare_waiting
        self.reroute: Reroute | None = None
        self._ticked = 0.0

    def _for(self, generation: int, size: int) -> Reroute:
        r = self.reroute
        if r is None or r.generation != generation or r.size != size:
            r = self.reroute = Reroute(size, generation, self.policy)
        return r

    def on_beat(self, generation: int, size: int, rank: int, msg: dict) -> None:
        if msg.get("generation") != generation or size < 2:
            return
        rows = [c for c in map(LinkCounters.from_wire, msg.get("links") or ()) if c is not None]
        self._for(generation, size).beat(rank, msg.get("seq", -1), rows, time.monotonic())

    def on_ack(self, generation: int, rank: int, msg: dict) -> None:
        r = self.reroute
        if r is not None and r.generation == generation == msg.get("generation"):
            r.ack(rank, msg["version"], msg["ok"])

    def tick(self) -> None:
        r = self.reroute
        now = time.monotonic()
        if r is None or now - self._ticked < EVAL_EVERY:
            return
        self._ticked = now
        for out in r.tick(now, self._spare_waiting()):
            if isinstance(out, ToAll):
                self._send_all(out.msg)
            elif isinstance(out, Note):
                self._note(out.text)
            elif isinstance(out, Replace):
                self._replace(out.rank, out.reason)

    def status(self) -> dict | None:
        return None if self.reroute is None else self.reroute.status()


# --- a member's side -----------------------------------------------------------------------------
def beat_fields(t: Transport | None) -> dict:
    """What a heartbeat adds: this rank's inbound links, cumulative. Never raises: the beat
    matters more than its figures."""
    if t is None:
        return {}
    try:
        return {"links": [row.wire() for row in t.linkstats.summary()]}
    except Exception as exc:  # a bug here must not cost this rank its heartbeat
        log.debug("rank %s: no link figures for the heartbeat: %r", t.rank, exc)
        return {}


NOTICES = ("schedule", "sched_go", "sched_drop")


def on_notice(t: Transport | None, msg: dict) -> dict | None:
    """A proposal or decision from the coordinator; the answer to send back, if any."""
    if t is None or msg.get("generation") != t.generation:
        return None
    version = msg.get("version")
    if type(version) is not int:
        return None
    if msg["t"] == "schedule":
        start = msg.get("start")
        raw = msg.get("plan")
        plan = None if raw is None else Plan.from_wire(raw, t.size)
        ops = msg.get("ops")
        ok = type(start) is int and (raw is None or plan is not None)
        ok = ok and (ops is None or type(ops) is int and ops > 0)
        ok = ok and t.schedules.propose(version, start, plan, ops)
        if ok:
            log.info(
                "rank %d: schedule %d from op #%d: %s",
                t.rank,
                version,
                start,
                "the default" if plan is None else plan.describe(),
            )
        return {"t": "sched_ack", "generation": t.generation, "version": version, "ok": ok}
    t.schedules.decide(version, msg["t"] == "sched_go")
    return None


__all__ = ["NOTICES", "SlowLinks", "beat_fields", "on_notice"]
