"""Driving a coordinator's Reroute (membership/reroute.py) in unit tests."""

from __future__ import annotations

from collectives.membership.reroute import Out, Reroute, ToAll


def agree(r: Reroute, now: float) -> list[Out]:
    """Tick; every rank accepts each schedule that tick proposed; tick again (the decision).
    Returns everything both ticks put out."""
    out = r.tick(now)
    for o in out:
        if isinstance(o, ToAll) and o.msg.kind == "schedule":
            for rank in range(r.size):
                r.ack(rank, o.msg.version, True)
    return out + r.tick(now)
