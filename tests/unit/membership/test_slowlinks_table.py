"""The coordinator's fail-slow side as a handler table (membership/slowlinks.py), through the
machine's own interface (Machine.feed) and wire messages.

Invariants: every fail-slow event has exactly one handler (slowlinks.HANDLERS serves the
events of slowlinks.Event and nothing else); a link far behind its peers, beaten into the
machine for seconds, makes the judgement send one `schedule` to every member's heartbeat
connection, with a warning note naming the link; every member's `sched_ack` and the next
judgement send one `sched_go` to each, with the note of the new schedule; what a fail-slow
event makes is the machine's own effects (Send, Note), nothing else."""

from __future__ import annotations

from typing import get_args

import pytest

from collectives.membership import slowlinks
from collectives.membership.state import Note, Send
from support.machine import Driver

pytestmark = [pytest.mark.fast, pytest.mark.timeout(20)]

N = 3
SLOW = (0, 1)  # 40x slower than its peers


def test_every_fail_slow_event_has_one_handler():
    assert set(slowlinks.HANDLERS) == set(get_args(slowlinks.Event))
    assert len(set(slowlinks.HANDLERS.values())) == len(slowlinks.HANDLERS)


def _beats(d: Driver, seq: int) -> None:
    """Every member's beat with its inbound links' figures, cumulative: 100 MB/s a link, SLOW
    40 times slower; then the clock on past the next judgement."""
    for rank, mid in enumerate(d.s.members or ()):
        rows = [
            [src, int(d.now * 1e8), d.now * (40.0 if (src, rank) == SLOW else 1.0)]
            + [int(d.now), d.now * 1e-4, 0.0, int(d.now), d.now * 1e-4, 0, 0.0]
            for src in range(N)
            if src != rank
        ]
        d.beat(mid, seq=seq, links=rows)
    d.tick(slowlinks.EVAL_EVERY + 0.05)


def test_a_slow_link_reads_handler_to_effects_through_the_machine():
    d = Driver(N, heartbeat_timeout=5.0)
    d.join_all()
    members = list(d.s.members or ())
    heartbeats = {b"hb-" + m.encode() for m in members}
    for seq in range(40):  # 10 s of figures: the link's slowness sustained
        _beats(d, seq)
        if any(e.msg["t"] == "schedule" for e in d.effects if isinstance(e, Send)):
            break
    proposals = [e for e in d.effects if isinstance(e, Send) and e.msg["t"] == "schedule"]
    assert {e.to for e in proposals} == heartbeats and len(proposals) == N, proposals
    assert any(
        e.warn and e.what.startswith("link 0->1 flagged as slow")
        for e in d.effects
        if isinstance(e, Note)
    ), d.notes()
    version = proposals[0].msg["version"]
    d.effects.clear()
    for m in members:
        d.arrive(
            b"hb-" + m.encode(),
            {"t": "sched_ack", "mid": m, "generation": 0, "version": version, "ok": True},
        )
    assert d.effects == []  # an answer is counted, nothing sent yet
    d.tick(slowlinks.EVAL_EVERY + 0.05)
    go = [e for e in d.effects if isinstance(e, Send)]
    assert [e.msg["t"] for e in go] == ["sched_go"] * N and {e.to for e in go} == heartbeats
    assert any(n.startswith("rerouted from op #") for n in d.notes()), d.notes()
    assert {type(e) for e in d.effects} <= {Send, Note}
