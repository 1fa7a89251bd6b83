"""What one request costs the coordinator does not grow with the group (membership/regroup.py,
state.py; the figures: bench/studies/membership_scale.py), and the shortcuts that keep it so
miss nothing.

Invariants: while survivors are still asking to reconstruct, a request and the tick after it
look at no member list (State.live) -- N requests, not N^2 looks; while a new generation
collects its addresses, the heartbeat clocks of its members are looked at O(1) times per
address, not once per member per address; while a member's connection is closed, each tick
looks at that member alone; and a forming joiner that goes quiet past the
heartbeat timeout still makes the generation fail, however recently the others' addresses came.
"""

from __future__ import annotations

from typing import Any

import pytest

from collectives.membership.state import State
from support.machine import Driver, kinds

pytestmark = [pytest.mark.fast, pytest.mark.timeout(30)]

N = 200


def formed(n: int, **kw: Any) -> Driver:
    d = Driver(n, **kw)
    d.join_all()
    for r in range(n):
        d.beat(f"m{r}")
    return d


def reconstruct(d: Driver, mid: str) -> list:
    msg = {"t": "reconstruct", "mid": mid, "generation": d.s.generation, "timeout": 30.0}
    return d.arrive(b"r-" + mid.encode(), msg)


def address(d: Driver, mid: str, gen: int) -> list:
    info = {"tcp": f"tcp://{mid}:1", "pid": 1}
    return d.arrive(
        b"a-" + mid.encode(), {"t": "address", "mid": mid, "generation": gen, "info": info}
    )


class Looked(dict):
    """The beats table, counting the lookups of a member's heartbeat clock."""

    looks = 0

    def get(self, key: Any, default: Any = None) -> Any:
        Looked.looks += 1
        return super().get(key, default)


def test_a_round_and_a_formation_cost_o_of_n_not_n_squared(monkeypatch):
    d = formed(N)
    d.die("m0")
    lives = []
    monkeypatch.setattr(State, "live", lambda s, _real=State.live: lives.append(1) or _real(s))
    for r in range(1, N - 1):  # every survivor but the last asks; a tick after each
        reconstruct(d, f"m{r}")
        d.tick(sweep=False)
    assert d.s.round is not None and len(lives) <= 4, len(lives)
    reconstruct(d, f"m{N - 1}")
    regroups = d.tick(sweep=False)
    assert len(regroups) == N - 1 and d.s.forming is not None

    gen = d.s.forming.generation
    d.s.beats = Looked(d.s.beats)
    Looked.looks = 0
    for r in range(1, N):
        address(d, f"m{r}", gen)
        if r < N - 1:
            d.tick(sweep=False)
    assert d.s.generation == gen and len(d.s.members or ()) == N - 1
    # a full look at every member's clock once, then O(1) per address (no sweep ran)
    assert Looked.looks <= 4 * N, Looked.looks


def test_a_joiner_quiet_past_the_timeout_still_unforms_the_generation():
    d = formed(2, heartbeat_timeout=1.0)
    d.arrive(b"jr-a", {"t": "join_request", "mid": "new"})  # its clock starts now, no beat
    d.die("m1")
    reconstruct(d, "m0")
    d.tick(sweep=False)
    gen = d.s.forming.generation
    address(d, "m0", gen)  # a look at every clock: the joiner's is the oldest
    sent = []
    for _ in range(6):  # m0 beats on; the joiner stays quiet
        d.beat("m0")
        sent += d.tick(0.2, sweep=False)
    assert sorted(kinds(sent)) == [(b"a-m0", "unformed"), (b"jr-a", "unformed")]
    assert "sent no heartbeat" in sent[0].msg["reason"]


def test_a_closed_connection_costs_each_tick_o_of_1_until_it_is_judged(monkeypatch):
    """While a member's connection is closed (its grace running), the tick after every
    message looks at that member alone, not at every member (State.known); once past the
    grace it is declared, as before."""
    from collectives.membership import connections
    from collectives.membership.machine import Connection

    d = formed(N)
    d.machine.feed(Connection(fd=7, what="closed", ident=b"hb-m5"), d.now)
    assert "m5" in d.s.connections.down
    looks = []
    monkeypatch.setattr(State, "known", lambda s, _real=State.known: looks.append(1) or _real(s))
    for r in range(N):  # the others beat on inside the grace
        if r != 5:
            d.beat(f"m{r}")
        d.tick(connections.GRACE / (2 * N), sweep=False)
    assert looks == [] and "m5" in d.s.connections.down
    d.tick(connections.GRACE, sweep=False)
    assert list(d.s.failed) == ["m5"]
