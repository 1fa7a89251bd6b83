"""The coordinator's recovery after a restart, in-process (membership/recovery.py, server.py):
it rebuilds its generation from the members' re-registrations, refuses conflicting ones, does
not blame members for its own pause, and answers a round a member is already past. The
restart with real processes: tests/scenarios/test_coordinator_restart.py.
"""

from __future__ import annotations

import msgpack

from collectives.membership.protocol import pack as pack_reply
from support.machine import wire

import time

import pytest

from support.ports import HOST
from support.timing import scaled


def wire_pack(msg: dict) -> bytes:
    """A request as the test writes it (progress fields flat), packed as it goes on the wire."""
    return msgpack.packb(wire(msg))


def as_wire(msg: object) -> dict:
    """A typed reply as it goes on the wire."""
    return msgpack.unpackb(pack_reply(msg))


def rejoin(mid, rank, generation, members, failed=(), forming=-1, **extra):
    return {
        **extra,
        "t": "rejoin",
        "mid": mid,
        "rank": rank,
        "world_size": len(members),
        "generation": generation,
        "members": list(members),
        "failed": list(failed),
        "forming": forming,
        "seq": 7,
        "in_op": False,
        "waiting_on": None,
        "sent": None,
        "recv": None,
    }


@pytest.mark.fast
@pytest.mark.timeout(20)
def test_a_re_registration_tells_the_restarted_coordinator_its_host():
    """The hosts of the members (for the slow links kept by host, membership/hostlinks.py)
    come back with their re-registrations; one that names none leaves none."""
    from collectives.membership.server import Coordinator

    c = Coordinator(HOST, 0, 2, heartbeat_interval=0.05, heartbeat_timeout=0.3, keys=None)
    c._send = lambda ident, msg: None
    m = ["a" * 32, "b" * 32]
    try:
        c.handle([b"i0", wire_pack(rejoin(m[0], 0, 4, m, host="node-a:1"))])
        c.handle([b"i1", wire_pack(rejoin(m[1], 1, 4, m))])
        assert c.state.recovering is None
        assert c.state.failslow.hosts == {m[0]: "node-a:1"}
    finally:
        c.stop()


@pytest.mark.fast
@pytest.mark.timeout(20)
def test_recovery_rebuilds_from_re_registrations_and_refuses_conflicts():
    """In-process, without the loop: the coordinator's recovery on its own (recovery.py).
    The first re-registration installs its generation as it is; the others must agree with
    it; one that does not come back is declared dead after the heartbeat timeout, not at
    once; the generation number never changes."""
    from collectives.membership.server import Coordinator

    c = Coordinator(HOST, 0, 3, heartbeat_interval=0.05, heartbeat_timeout=0.3, keys=None)
    sent = []
    c._send = lambda ident, msg: sent.append((ident, as_wire(msg)))
    m = ["a" * 32, "b" * 32, "c" * 32]
    try:
        c.handle([b"i0", wire_pack(rejoin(m[0], 0, 4, m, forming=5))])
        assert (c.generation, c.members, c.state.recovering) == (4, m, {m[1], m[2]})
        assert sent[-1] == (b"i0", {"t": "rejoined", "generation": 4})
        assert c.state.dissolved and c.state.tried == 5  # the next reconstruct forms a fresh one
        refused = [
            rejoin(m[1], 1, 4, [m[1], m[0], m[2]]),  # another member list
            rejoin("d" * 32, 1, 4, [m[0], "d" * 32, m[2]]),  # rank 1 is m[1]'s
            rejoin(m[1], 1, 3, m),
        ]  # an older generation
        for msg in refused:
            c.handle([b"ix", wire_pack(msg)])
            assert sent[-1][1]["t"] == "evicted", (msg, sent[-1])
        assert (c.generation, c.members, c.state.recovering) == (4, m, {m[1], m[2]})
        c.handle([b"i1", wire_pack(rejoin(m[1], 1, 4, m))])
        assert c.state.recovering == {m[2]} and not c.failed
        t0 = time.monotonic()
        while c.state.recovering is not None and time.monotonic() < t0 + scaled(5):
            for i in (0, 1):  # the two that are back beat
                beat = dict(rejoin(m[i], i, 4, m), t="beat")
                c.handle([b"h%d" % i, wire_pack(beat)])
            c.tick()
            time.sleep(0.02)
        assert time.monotonic() - t0 >= 0.25  # waited for it: not declared at once
        assert list(c.failed) == [m[2]] and c.generation == 4
        notes = [what for _, what in c.events]
        assert "generation 4 rebuilt: 2 of 3 ranks back" in notes, notes
    finally:
        c.stop()


@pytest.mark.fast
@pytest.mark.timeout(20)
def test_a_coordinator_that_paused_declares_nobody_dead_for_it():
    """A coordinator that did not run for longer than the heartbeat timeout (SIGSTOP, a busy
    host) holds no fresh beats when it runs again: that silence is its own, and the members'
    clocks move on by the pause. A member that stays silent afterwards is still declared."""
    from collectives.membership.server import Coordinator

    c = Coordinator(HOST, 0, 2, heartbeat_interval=0.05, heartbeat_timeout=0.3, keys=None)
    c._send = lambda ident, msg: None
    m = ["a" * 32, "b" * 32]
    try:
        c.handle([b"i0", wire_pack(rejoin(m[0], 0, 0, m))])
        c.handle([b"i1", wire_pack(rejoin(m[1], 1, 0, m))])
        c.tick()
        time.sleep(0.6)  # not a wait: "stopped" this long, no loop, no beats taken
        c.tick()
        assert not c.failed, c.failed
        t0 = time.monotonic()
        while not c.failed and time.monotonic() < t0 + scaled(5):
            c.handle([b"h0", wire_pack(dict(rejoin(m[0], 0, 0, m), t="beat"))])
            c.tick()
            time.sleep(0.02)
        assert list(c.failed) == [m[1]]  # the silent one, once its own timeout passed
    finally:
        c.stop()


def _answered_round(seqs, member2, failed=False):
    """A 3-member coordinator (in-process, its answers recorded): members 0 and 1 ask
    reconstruct() with their last op's seq (`seqs`), member 2 beats `member2` = (seq, in_op);
    returns what 0 and 1 were answered by the time the round is checked."""
    from collectives.membership.machine import Died
    from collectives.membership.server import Coordinator

    c = Coordinator("127.0.0.1", 0, 3, heartbeat_interval=0.1, heartbeat_timeout=30.0, keys=None)
    sent = []
    try:
        for r in range(3):
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
        assert c.members == ["m0", "m1", "m2"]
        c._send = lambda ident, msg: sent.append((ident, msg.kind))
        if failed:
            c.feed(Died("m2", "test: failed"))
            sent.clear()
        for r, seq in enumerate(seqs):
            msg = {"t": "reconstruct", "mid": f"m{r}", "generation": c.generation, "timeout": 30.0}
            if seq is not None:
                msg["seq"] = seq
            c.handle([b"r%d" % r, wire_pack(msg)])
        seq, in_op = member2
        c.handle(
            [
                b"b2",
                wire_pack(
                    {
                        "t": "beat",
                        "mid": "m2",
                        "generation": c.generation,
                        "seq": seq,
                        "in_op": in_op,
                        "waiting_on": None,
                        "sent": None,
                        "recv": None,
                    }
                ),
            ]
        )
        c.tick()
        return sorted(t for ident, t in sent if ident in (b"r0", b"r1"))
    finally:
        c.stop()


@pytest.mark.fast
@pytest.mark.timeout(30)
def test_askers_get_unchanged_when_a_member_is_already_past_the_round():
    """A coordinator SIGKILLed while it answered a reconstruct() round 'unchanged' (rank 2
    got it and went on into its next op; ranks 0 and 1 did not, and asked the restarted
    coordinator again) must not wait for rank 2: it is in op #7, waiting for them (bench.stress.chaos
    hung there, 2 runs of 10 minutes out of 2). Rank 2 being past the round is what says so;
    a rank merely still in the op the askers finished, a failure to regroup for, or an asker
    that does not say its seq keep the round waiting (or regrouping) as before."""
    assert _answered_round([6, 6], (7, True)) == ["unchanged", "unchanged"]
    assert _answered_round([6, 6], (6, True)) == []  # still in op #6: it will come
    assert _answered_round([6, None], (7, True)) == []  # an asker did not say
    assert "unchanged" not in _answered_round([6, 6], (7, True), failed=True)
