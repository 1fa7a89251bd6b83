"""Driving the membership state machine (collectives/membership/machine.py) without sockets,
threads or a clock: a test feeds it events at times it chooses and reads what it would send."""

from __future__ import annotations

from typing import Any

import msgpack

from collectives.membership import tables
from collectives.membership.machine import Arrived, Died, Machine, Tick
from collectives.membership.protocol import decode_request, pack
from collectives.membership.state import Effect, FailSlow, Note, Send, State, Watch

# A request's progress fields, which the wire nests under `report` (protocol.Report): the
# tests write them flat, as a rank's picture reads.
REPORT_FIELDS = (
    "generation",
    "seq",
    "in_op",
    "waiting_on",
    "sent",
    "recv",
    "has_data",
    "done",
    "sent_age",
)
WITH_REPORT = ("beat", "state", "progress", "diagnose", "outcome", "rejoin")


def wire(msg: dict[str, Any]) -> dict[str, Any]:
    """A request as a test writes it (progress fields flat) as it goes on the wire."""
    if msg.get("t") not in WITH_REPORT or "report" in msg:
        return msg
    report = {k: msg[k] for k in REPORT_FIELDS if k in msg}
    rest = {k: v for k, v in msg.items() if k not in REPORT_FIELDS}
    return {**rest, "report": report}


class Driver:
    """One machine, a clock of the test's own, and every effect it returned (`effects`)."""

    def __init__(
        self,
        world_size: int,
        heartbeat_timeout: float = 5.0,
        diagnose_window: float = 0.3,
        min_world_size: int | None = None,
        now: float = 1000.0,
        failslow_policy: str = "reroute",
    ):
        self.machine = Machine(
            State(
                world_size=world_size,
                heartbeat_timeout=heartbeat_timeout,
                diagnose_window=diagnose_window,
                min_world_size=min_world_size,
                failslow=FailSlow(failslow_policy),
            )
        )
        self.s = self.machine.state
        self.now = now
        self.effects: list[Effect] = []

    def _take(self, effects: list[Effect]) -> list[Send]:
        """The effects kept, each message sent as it goes on the wire (a dict); the sends."""
        wired = [
            Send(e.to, msgpack.unpackb(pack(e.msg))) if isinstance(e, Send) else e for e in effects
        ]
        self.effects += wired
        return [e for e in wired if isinstance(e, Send)]

    def arrive(self, ident: bytes, msg: dict[str, Any]) -> list[Send]:
        """A message arrives, checked as the shell checks it; what the machine sends back."""
        raw = msgpack.packb(wire(msg))
        request = decode_request(raw, tables.max_ranks(self.s))
        if self.machine.stranger(request):
            return []
        return self._take(self.machine.feed(Arrived(ident, request), self.now))

    def tick(self, dt: float = 0.0, sweep: bool = True) -> list[Send]:
        """Move the clock on by dt, ticking as a running coordinator does: often (a gap of a
        quarter heartbeat timeout would be taken for the coordinator's own pause)."""
        step = self.s.heartbeat_timeout / 8
        sent: list[Send] = []
        while True:
            move = min(dt, step)
            self.now += move
            dt -= move
            sent += self._take(self.machine.feed(Tick(sweep), self.now))
            if dt <= 0:
                return sent

    def die(self, mid: str, why: str = "died: its process ended (test)") -> list[Send]:
        return self._take(self.machine.feed(Died(mid, why), self.now))

    # --- what members send ---------------------------------------------------------------------
    def join_all(self, n: int | None = None, prefix: str = "m") -> list[Send]:
        """Ranks 0..n-1 join (member ids prefix0, prefix1, ...; routing ids b'j0', ...)."""
        out: list[Send] = []
        for r in range(self.s.world_size if n is None else n):
            out += self.arrive(
                b"j%d" % r,
                {
                    "t": "join",
                    "rank": r,
                    "world_size": self.s.world_size,
                    "mid": f"{prefix}{r}",
                    "info": {"tcp": f"tcp://h:{r + 1}", "pid": r + 1},
                },
            )
        return out

    def beat(
        self, mid: str, seq: int = -1, in_op: bool = False, kind: str = "beat", **kw: Any
    ) -> list[Send]:
        """A heartbeat of member `mid` (routing id b'hb-' + mid) in its current generation."""
        gen = kw.pop("generation", self.s.generation if mid in (self.s.members or ()) else -1)
        msg = {
            "t": kind,
            "mid": mid,
            "generation": gen,
            "seq": seq,
            "in_op": in_op,
            "waiting_on": kw.pop("waiting_on", None),
            "sent": kw.pop("sent", None),
            "recv": kw.pop("recv", None),
            **kw,
        }
        return self.arrive(b"hb-" + mid.encode(), msg)

    def notes(self) -> list[str]:
        return [e.what for e in self.effects if isinstance(e, Note)]

    def watched(self) -> list[tuple[str, str]]:
        return [(e.mid, e.proc) for e in self.effects if isinstance(e, Watch)]


def kinds(sent: list[Send]) -> list[tuple[bytes, str]]:
    """(routing id, message type) of each message sent, in order."""
    return [(e.to, e.msg["t"]) for e in sent]
