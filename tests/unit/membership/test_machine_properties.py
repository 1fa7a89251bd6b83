"""Random interleavings of beats, deaths, leaves, joins, reconstructs, addresses, diagnoses,
probe reports, outcome asks and ticks fed to the membership state machine; after every event,
the invariants written in collectives/membership/state.py hold (I1-I6), and once the job goes
quiet for longer than every deadline, every table of pending work is empty and every table
keyed by what arrives holds only what the job still needs."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectives.membership import tables
from collectives.membership.state import Send
from support.machine import Driver

pytestmark = [pytest.mark.fast, pytest.mark.timeout(120)]

N = 3
KINDS = (
    "beat",
    "die",
    "leave",
    "join",
    "member_join",
    "removed_join",
    "reconstruct",
    "address",
    "diagnose",
    "probed",
    "outcome",
    "tick",
    # every live member at once: the common case, which single steps reach rarely
    "round",
    "addresses",
    "stall",
    # every live member but one reconstructs excluding that one (shrink_group), sometimes
    # one of them with another list
    "shrink",
    # the slow links' handling: a beat with link figures (link 0->1 slow, or well now and
    # then), every live member's at once and the clock on (a flag needs seconds of them),
    # an answer to a proposed schedule
    "links",
    "all_links",
    "ack",
)
# membership changes weigh more: a generation forms only after a death or a join and a round
WEIGHTED = KINDS + ("die", "join", "round", "round", "shrink", "all_links", "all_links", "ack")
steps = st.lists(
    st.tuples(st.sampled_from(WEIGHTED), st.integers(0, 63), st.integers(0, 63)), max_size=80
)


class History:
    """What the invariants need to remember across events."""

    def __init__(self) -> None:
        self.generation = 0
        self.rosters: dict[int, tuple[str, ...]] = {}  # generation -> the roster welcomed
        self.verdicts: dict[tuple[int, int], list[int]] = {}  # (generation, seq) -> culprits
        self.removed: set[str] = set()  # every member id removed from a generation
        # (generation, version) -> the schedule proposed under that number
        self.schedules: dict[tuple[int, int], dict] = {}


def check(d: Driver, h: History, sent: list[Send]) -> None:
    s = d.s
    # I1: generations only grow; a forming generation takes a fresh number
    assert s.generation >= h.generation and s.tried >= s.generation
    if s.forming is not None:
        assert s.forming.generation > s.generation
    # I2: a member id holds at most one rank; a member does not also wait to join
    members = s.members or []
    assert len(set(members)) == len(members)
    assert not set(s.joiners) & set(s.live())
    if s.forming is not None:
        assert len(set(s.forming.members)) == len(s.forming.members)
    # I3: every member of a generation told the same roster, the one installed
    welcomes: dict[int, list[Send]] = defaultdict(list)
    for e in sent:
        if e.msg["t"] == "welcome":
            welcomes[e.msg["generation"]].append(e)
    for gen, told in welcomes.items():
        rosters = {tuple(e.msg["members"]) for e in told}
        assert len(rosters) == 1, rosters
        roster = rosters.pop()
        assert len(told) == len(roster)  # each member once
        assert h.rosters.setdefault(gen, roster) == roster  # never another for that number
        if gen == s.generation:
            assert tuple(members) == roster
    # I4: one verdict per stalled op, of the generation current when it went out (a step
    # can give a verdict and then install the next generation: its welcome moves it on)
    gen = h.generation
    for e in sent:
        if e.msg["t"] == "welcome":
            gen = max(gen, e.msg["generation"])
        if e.msg["t"] == "verdict" and e.msg["evicted"]:
            key = (gen, e.msg["seq"])
            assert h.verdicts.setdefault(key, e.msg["culprits"]) == e.msg["culprits"]
    # I5: a member id removed from a generation is never admitted into a later one
    if s.generation != h.generation:
        assert not set(members) & h.removed, (members, h.removed)
    assert not set(s.joiners) & h.removed
    h.removed |= set(s.failed)
    h.generation = s.generation
    # I6: bounded tables
    assert len(s.joiners) <= max(tables.MAX_JOINERS, s.world_size)
    assert len(s.judgements.diagnoses) <= tables.MAX_PENDING
    assert len(s.judgements.outcome_asks) <= tables.MAX_PENDING
    assert len(s.removed) <= tables.MAX_REMOVED
    # I7 (slow links): one version number, one schedule, sent to each member once; a
    # decision names a version proposed
    told: dict[tuple[int, int], list[bytes]] = defaultdict(list)
    for e in sent:
        t = e.msg["t"]
        if t == "schedule":
            key = (e.msg["generation"], e.msg["version"])
            assert e.msg["generation"] <= s.generation
            assert h.schedules.setdefault(key, e.msg) == e.msg
            told[key].append(e.to)
        elif t in ("sched_go", "sched_drop"):
            assert (e.msg["generation"], e.msg["version"]) in h.schedules
    assert all(len(set(to)) == len(to) for to in told.values()), told


def pick(pool: list[str], i: int) -> str | None:
    return pool[i % len(pool)] if pool else None


def state_msg(d: Driver, kind: str, mid: str, seq: int, b: int) -> dict:
    n = len(d.s.members or ())
    rank = d.s.rank_of(mid) or 0
    return {
        "t": kind,
        "mid": mid,
        "generation": d.s.generation,
        "seq": seq,
        "in_op": True,
        "waiting_on": (rank + 1) % max(n, 1),
        "sent": [b % 2] * n,
        "recv": [0] * n,
    }


def step(d: Driver, kind: str, a: int, b: int, joiners: list[str]) -> list[Send]:
    s = d.s
    live = s.live()
    forming = list(s.forming.members) if s.forming is not None else []
    anyone = live + [j for j in joiners if j in s.joiners] + forming
    if kind == "beat":
        mid = pick(live + list(s.joiners), a)
        return d.beat(mid, seq=b % 8, in_op=bool(b % 2)) if mid else []
    if kind == "die":
        mid = pick(anyone, a)
        return d.die(mid) if mid else []
    if kind == "leave":
        mid = pick(anyone, a)
        return d.arrive(b"l-" + mid.encode(), {"t": "leave", "mid": mid}) if mid else []
    if kind == "join":
        mid = f"j{len(joiners)}"
        joiners.append(mid)
        msg = {"t": "join_request", "mid": mid, "spare": b % 3 == 0}
        return d.arrive(b"jr-" + mid.encode(), msg)
    if kind == "member_join":
        mid = pick(live, a)
        return d.arrive(b"x", {"t": "join_request", "mid": mid}) if mid else []
    if kind == "removed_join":
        mid = pick(sorted(s.removed), a)
        return d.arrive(b"x", {"t": "join_request", "mid": mid}) if mid else []
    if kind == "reconstruct":
        mid = pick(live, a)
        if mid is None:
            return []
        msg = {"t": "reconstruct", "mid": mid, "generation": s.generation, "timeout": 2.0}
        # now and then a list of ranks to drop (any ranks: one out of range, the asker's own)
        exclude = sorted({b % 4, (b >> 2) % 4}) if b % 5 == 0 else []
        return d.arrive(b"r-" + mid.encode(), {**msg, "seq": b % 8, "exclude": exclude})
    if kind == "address":
        mid = pick(forming, a)
        if mid is None or s.forming is None:
            return []
        info = {"tcp": f"tcp://{mid}:1", "pid": 1}
        msg = {"t": "address", "mid": mid, "generation": s.forming.generation, "info": info}
        return d.arrive(b"a-" + mid.encode(), msg)
    if kind == "diagnose":
        mid = pick(live, a)
        if mid is None:
            return []
        msg = state_msg(d, "diagnose", mid, 3 + b % 3, b)
        return d.arrive(b"d-" + mid.encode(), {**msg, "timeout": 1.0, "probe": b % 2 == 0})
    if kind == "probed":
        pending = [(k, x) for k, x in s.judgements.diagnoses.items() if x.probe is not None]
        mid = pick(live, a)
        if not pending or mid is None:
            return []
        (gen, seq), diag = pending[b % len(pending)]
        assert diag.probe is not None
        heard = [None if (b >> i) & 1 else 0.001 for i in range(len(s.members or ()))]
        msg = {
            "t": "probed",
            "mid": mid,
            "generation": gen,
            "seq": seq,
            "token": diag.probe.token,
            "heard": heard,
            "elapsed": 0.1,
        }
        return d.arrive(b"d-" + mid.encode(), msg)
    if kind == "outcome":
        mid = pick(live, a)
        if mid is None:
            return []
        msg = state_msg(d, "outcome", mid, 3 + b % 3, b)
        return d.arrive(b"o-" + mid.encode(), {**msg, "has_data": b % 2 == 0, "timeout": 1.0})
    if kind in ("addresses", "stall"):
        single, pool = ("address", forming) if kind == "addresses" else ("diagnose", live)
        sent = []
        for i in range(len(pool)):
            sent += step(d, single, i, b, joiners)
        return sent + d.tick()
    if kind == "round":  # every live member reconstructs, then (b odd) sends its address
        sent = []
        for i in range(len(live)):
            sent += step(d, "reconstruct", i, b, joiners)
        sent += d.tick()
        return sent + (step(d, "addresses", a, b, joiners) if b % 2 else [])
    if kind == "shrink":
        victim = pick(live, a)
        if victim is None or s.members is None:
            return []
        fresh = s.forming is None and s.round is None  # this step's round alone
        out = s.members.index(victim)
        sent = []
        for i, mid in enumerate(m for m in live if m != victim):
            other = [out, s.members.index(mid)] if b % 3 == 0 and i == 1 else [out]
            msg = {"t": "reconstruct", "mid": mid, "generation": s.generation, "timeout": 2.0}
            sent += d.arrive(b"r-" + mid.encode(), {**msg, "exclude": sorted(set(other))})
        sent += d.tick()
        # I8: an excluded live rank the others agreed on is out of any generation forming
        if fresh and s.forming is not None:
            assert victim not in s.forming.members, (victim, s.forming.members)
        return sent
    if kind == "all_links":
        sent = []
        for i in range(len(live)):
            sent += step(d, "links", i, b, joiners)
        return sent + d.tick(0.3)
    if kind == "links":  # cumulative figures: 100 MB/s per link, 0->1 40x slower but if b % 4
        mid = pick(live, a)
        rank = s.rank_of(mid) if mid else None
        if mid is None or rank is None:
            return []
        n = len(s.members or ())
        rows = [
            [src, int(d.now * 1e8), d.now * (40.0 if b % 4 and (src, rank) == (0, 1) else 1.0)]
            + [int(d.now), d.now * 1e-4, 0.0]
            for src in range(n)
            if src != rank
        ]
        return d.beat(mid, seq=b % 8, links=rows)
    if kind == "ack":
        r = s.failslow.reroute
        mid = pick(live, a)
        if r is None or r.pending is None or mid is None:
            return []
        msg = {"t": "sched_ack", "mid": mid, "generation": s.generation}
        return d.arrive(
            b"hb-" + mid.encode(), {**msg, "version": r.pending.version, "ok": b % 5 > 0}
        )
    assert kind == "tick"
    return d.tick((a % 20) * 0.05)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(steps)
def test_invariants_hold_over_random_interleavings(actions):
    d = Driver(N, heartbeat_timeout=1.0, diagnose_window=0.1)
    h = History()
    check(d, h, d.join_all())
    joiners: list[str] = []
    for kind, a, b in actions:
        check(d, h, step(d, kind, a, b, joiners))
    # quiet for longer than every deadline: the pending work is done, the tables pruned
    check(d, h, d.tick(40.0))
    s = d.s
    assert s.round is None and s.forming is None
    assert not s.judgements.diagnoses and not s.judgements.outcome_asks
    assert set(s.beats) <= s.known()
    assert set(s.judgements.link_history) <= set(s.members or ())
