"""Driving a coordinator's Reroute (membership/reroute.py) in unit tests.

A Reroute speaks the coordinator machine's effects (effects.py) to the members of the State
that holds it (slowlinks.Roster): a message to every live member's heartbeat connection, a
note, a rank removed (declare). A Reroute made alone is served by a State of its own (`state_of`: members m0, m1, ... at
heartbeat connections h0, h1, ...); `tick` and `agree` return the effects, and `told`,
`notes` and `removed` read them as the members and the log would."""

from __future__ import annotations

import re
import weakref
from typing import Any

from collectives.membership.reroute import Reroute
from collectives.membership.slowlinks import Roster
from collectives.membership.state import Beat, Effect, Note, Outbox, Send, State

_served: list[weakref.ref[State]] = []


def serve(s: State) -> State:
    """Give every member of `s` without one a heartbeat connection (h<rank>), and let `tick`
    find `s` as the State of its Reroute (the one it holds now or later: slowlinks._for)."""
    for rank, m in enumerate(s.members or ()):
        if m not in s.beats or not s.beats[m].ident:
            s.beats[m] = Beat(b"h%d" % rank, 0.0)
    _served.append(weakref.ref(s))
    return s


def state_of(r: Reroute) -> State:
    """The State that holds `r` (one `serve` was given), else a new one of its own."""
    for ref in _served:
        s = ref()
        if s is not None and s.failslow.reroute is r:
            serve(s)  # a regroup's new members beat too
            return s
    members = [f"m{i}" for i in range(r.size)]
    s = State(world_size=r.size, heartbeat_timeout=5.0, diagnose_window=1.0, members=members)
    s.generation = r.generation
    s.failslow.reroute = r
    return serve(s)


def tick(r: Reroute, now: float, spare_waiting: int = 0) -> list[Effect]:
    """The judgement due at `now`: its effects."""
    out = Outbox()
    r.tick(out, Roster(state_of(r), out), now, spare_waiting)
    return out.effects


def agree(r: Reroute, now: float) -> list[Effect]:
    """Tick; every rank accepts each schedule that tick proposed; tick again (the decision).
    Returns everything both ticks put out."""
    out = tick(r, now)
    for msg in told(out, "schedule"):
        for rank in range(r.size):
            r.ack(rank, msg.version, True)
    return out + tick(r, now)


def told(effects: list[Effect], *kinds: str) -> list[Any]:
    """The messages sent, each once (one message goes to every member as one record), in
    order; only those of `kinds` where given."""
    seen: set[int] = set()
    msgs = []
    for e in effects:
        if isinstance(e, Send) and id(e.msg) not in seen:
            seen.add(id(e.msg))
            if not kinds or e.msg.kind in kinds:
                msgs.append(e.msg)
    return msgs


def notes(effects: list[Effect]) -> list[str]:
    return [e.what for e in effects if isinstance(e, Note)]


REMOVAL = re.compile(r"^(replacing|removing) rank (\d+): (.*)$", re.S)


def removed(effects: list[Effect]) -> list[tuple[str, int, str]]:
    """The ranks removed for a slow NIC: (replacing -- a spare takes its place -- or
    removing, the rank, the reason)."""
    return [
        (m.group(1), int(m.group(2)), m.group(3))
        for n in notes(effects)
        if (m := REMOVAL.match(n)) is not None
    ]
