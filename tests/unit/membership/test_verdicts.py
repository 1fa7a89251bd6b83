"""The coordinator's handlers and verdicts, in one process, fed what a member gone bad (or a bug)
might send: every table keyed by what arrives stays bounded, and no message -- of thousands
generated -- makes handle() or the periodic work raise (membership/server.py, verdicts.py,
tables.py). The Coordinator binds a socket on 127.0.0.1 port 0 that these tests never use:
they call handle() and tick() directly. (Through real sockets and processes:
tests/test_security.py, tests/scenarios/security/.)
"""

from __future__ import annotations

import time

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectives.membership import protocol
from collectives.membership.machine import HANDLERS
from collectives.membership.server import Coordinator
from support.fuzz import values
from support.machine import wire

pytestmark = pytest.mark.fast


def wire_pack(msg: dict) -> bytes:
    """A request as the test writes it (progress fields flat), packed as it goes on the wire."""
    return msgpack.packb(wire(msg))


FIELDS = [
    "rank",
    "world_size",
    "mid",
    "info",
    "generation",
    "seq",
    "in_op",
    "waiting_on",
    "sent",
    "recv",
    "has_data",
    "done",
    "timeout",
    "pid",
]


@pytest.mark.timeout(60)
def test_tables_keyed_by_what_arrives_are_bounded():
    """10,000 beats from ids that are no member, 10,000 join requests, diagnoses and outcome
    asks of random ops: every table stays within its bound, and the strangers' beats are
    forgotten once quiet for the heartbeat timeout."""
    from collectives.membership import tables

    c = Coordinator("127.0.0.1", 0, 2, heartbeat_interval=0.1, heartbeat_timeout=0.2, keys=None)
    try:
        for r in (0, 1):
            c.handle(
                [
                    b"j%d" % r,
                    wire_pack(
                        {
                            "t": "join",
                            "rank": r,
                            "world_size": 2,
                            "mid": f"member{r}",
                            "info": {"tcp": "tcp://x:1", "pid": 1},
                        }
                    ),
                ]
            )
        assert c.members == ["member0", "member1"]
        landed = 0
        for i in range(10_000):
            c.handle(
                [
                    b"x",
                    wire_pack(
                        {
                            "t": "beat",
                            "mid": f"stranger{i}",
                            "generation": 0,
                            "seq": 0,
                            "in_op": False,
                            "waiting_on": None,
                            "sent": None,
                            "recv": None,
                        }
                    ),
                ]
            )
            c.handle([b"x", wire_pack({"t": "join_request", "mid": f"joiner{i}"})])
            c.handle(
                [
                    b"x",
                    wire_pack(
                        {
                            "t": "diagnose",
                            "mid": "member0",
                            "generation": 0,
                            "seq": i,
                            "in_op": True,
                            "waiting_on": 1,
                            "sent": [0, 0],
                            "recv": [0, 0],
                        }
                    ),
                ]
            )
            c.handle(
                [
                    b"x",
                    wire_pack(
                        {
                            "t": "outcome",
                            "mid": "member1",
                            "generation": 0,
                            "seq": i,
                            "in_op": True,
                            "waiting_on": None,
                            "sent": None,
                            "recv": None,
                            "timeout": 100.0,
                        }
                    ),
                ]
            )
            if i % 500 == 0:
                j = c.state.judgements
                landed = max(landed, min(len(j.diagnoses), len(j.outcome_asks)))
                c.tick()
        c.tick()
        # they landed (a message that did not decode would prove nothing here): strangers'
        # beats are kept, diagnoses and outcome asks were pending
        assert any(m.startswith("stranger") for m in c.state.beats)
        assert landed > 0
        assert len(c.state.beats) <= max(tables.MAX_BEATS, 8) + 2 + len(c.joiners)
        assert len(c.joiners) <= tables.MAX_JOINERS
        assert len(c.state.judgements.diagnoses) <= tables.MAX_PENDING
        assert len(c.state.judgements.outcome_asks) <= tables.MAX_PENDING
        assert len(c.events) <= tables.MAX_EVENTS
        # Strangers' beats expire: tick as the serving loop does (a gap between ticks longer
        # than heartbeat_timeout / 4 would count as the coordinator's own pause and move every
        # heartbeat clock on by it, membership/recovery.py), until they are gone.
        deadline = time.monotonic() + 10
        while any(m.startswith("stranger") for m in c.state.beats) and time.monotonic() < deadline:
            time.sleep(0.01)
            c.tick()
        assert not any(m.startswith("stranger") for m in c.state.beats), len(c.state.beats)
    finally:
        c.stop()


def _coordinator_fuzz_target():
    c = Coordinator("127.0.0.1", 0, 3, heartbeat_interval=0.1, heartbeat_timeout=0.5, keys=None)
    for r in range(3):  # a formed group, so that messages reach the deeper handlers
        c.handle(
            [
                b"j%d" % r,
                wire_pack(
                    {
                        "t": "join",
                        "rank": r,
                        "world_size": 3,
                        "mid": f"m{r}",
                        "info": {"tcp": "tcp://x:1", "pid": 1},
                    }
                ),
            ]
        )
    assert c.members is not None
    return c


@pytest.fixture(scope="module")
def fuzz_coordinator():
    c = _coordinator_fuzz_target()
    yield c
    c.stop()


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(
    kind=st.sampled_from(list(protocol.REQUESTS) + ["nope"]),
    fields=st.dictionaries(
        st.sampled_from(FIELDS),
        st.one_of(
            values,
            st.sampled_from(["m0", "m1", "m2"]),
            st.integers(-2, 4),
            st.lists(st.integers(0, 3), max_size=4),
        ),
        max_size=8,
    ),
    raw=st.one_of(st.none(), st.binary(max_size=40)),
)
def test_fuzz_coordinator_handlers(fuzz_coordinator, kind, fields, raw):
    """The coordinator's handle() and periodic work never raise, whatever arrives."""
    c = fuzz_coordinator
    msg = wire(dict(fields, t=kind))  # a request's progress fields nested, as it sends them
    try:
        data = msgpack.packb(msg) if raw is None else raw
    except (TypeError, ValueError, OverflowError):
        data = b"\x00"
    c.handle([b"fuzz", data])
    c.tick()
    for key in c.state.judgements.given:
        assert key[0] == c.generation


def test_every_request_has_a_handler_and_every_handler_a_request():
    """Dispatch is explicit (machine.HANDLERS, each request to the function that serves it):
    every request the protocol lists is served, and nothing else is."""
    c = Coordinator("127.0.0.1", 0, 2, heartbeat_interval=0.1, heartbeat_timeout=0.5, keys=None)
    try:
        assert set(c.handlers) == set(protocol.REQUESTS)
        assert all(callable(h) for h in HANDLERS.values())
    finally:
        c.stop()


@pytest.mark.timeout(30)
def test_a_stall_that_waits_on_an_earlier_ops_is_judged_with_it():
    """Links 0-1 and 0-2 slowed: rank 2 got through op #6 and asks about op #7, ranks 0 and 1
    ask about op #6. Op #7's diagnosis joins op #6's: one probe round over all three ranks
    (each told the op it asked about), one verdict -- rank 0 alone, not 'ranks 0 and 1 never
    entered op #7' -- sent to each asker under its own op."""
    c = Coordinator("127.0.0.1", 0, 3, diagnose_window=0.01, keys=None)
    sent = []
    c._send = lambda ident, msg: sent.append((ident, msgpack.unpackb(protocol.pack(msg))))
    try:
        for r in range(3):
            info = {"tcp": "tcp://x:1", "pid": 1}
            msg = {"t": "join", "rank": r, "world_size": 3, "mid": f"m{r}", "info": info}
            c.handle([b"j%d" % r, msgpack.packb(wire(msg))])
        states = {
            0: dict(seq=6, in_op=True, waiting_on=1, sent=[0, 1, 1], recv=[0, 0, 1]),
            1: dict(seq=6, in_op=True, waiting_on=0, sent=[1, 0, 1], recv=[0, 0, 1]),
            2: dict(seq=7, in_op=True, waiting_on=0, sent=[0, 0, 0], recv=[0, 0, 0]),
        }

        def ask(r, kind="diagnose"):
            msg = dict(states[r], t=kind, mid=f"m{r}", generation=0)
            if kind == "diagnose":
                msg.update(timeout=3.0, probe=True)
            c.handle([b"d%d" % r, msgpack.packb(wire(msg))])

        ask(2)
        for r in (0, 1):
            ask(r, "state")  # their answers to the coordinator's ping, before they ask
        time.sleep(0.02)  # not a wait: the clock moves past the answers' arrival
        c.tick()
        assert list(c.state.judgements.diagnoses) == [(0, 6)], c.state.judgements.diagnoses
        assert c.state.judgements.merged == {(0, 7): (0, 6)}
        ask(0)
        ask(1)
        sent.clear()
        c.tick()
        probes = {ident: m for ident, m in sent if m["t"] == "probe"}
        assert {i: m["seq"] for i, m in probes.items()} == {b"d0": 6, b"d1": 6, b"d2": 7}
        token = probes[b"d0"]["token"]
        heard = {0: [None, None, None], 1: [None, None, 0.01], 2: [None, 0.01, None]}
        for r in range(3):
            report = {
                "t": "probed",
                "mid": f"m{r}",
                "generation": 0,
                "seq": probes[b"d%d" % r]["seq"],
                "token": token,
                "heard": heard[r],
                "elapsed": 0.1,
            }
            c.handle([b"d%d" % r, msgpack.packb(wire(report))])
        sent.clear()
        c.tick()
        verdicts = {ident: m for ident, m in sent if m["t"] == "verdict"}
        assert {i: (m["culprits"], m["seq"]) for i, m in verdicts.items()} == {
            b"d0": ([0], 6),
            b"d1": ([0], 6),
            b"d2": ([0], 7),
        }, verdicts
        assert verdicts[b"d2"]["evidence"]["decided_by"] == "probes"
        assert set(c.failed) == {"m0"}
    finally:
        c.stop()
