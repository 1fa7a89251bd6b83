"""The coordinator protocol's one schema (membership/protocol.py), recovery.py's bounds and
identity.py: in one process, no sockets.

Invariants:
  * a well-formed request of every type decodes into its record, extra fields dropped, and
    encodes back to the same record (both directions: every reply too);
  * a field of the wrong type or range, or a missing required one, is Invalid, with the field
    named;
  * a per-rank list (sent, recv, sent_age, members, failed, heard, exclude, links) longer than
    the largest group the job can have is Invalid, however small each entry;
  * a re-registration's generations must leave room for the numbers a coordinator hands out;
  * a request naming a member id is taken only from the connection that proved that id.
"""

from __future__ import annotations

import msgpack
import msgspec
import pytest

from collectives.common import security
from collectives.membership import identity, protocol, recovery
from collectives.membership.protocol import Invalid, decode_reply, decode_request, pack
from support.machine import wire

pytestmark = pytest.mark.fast

MID = "m" * 32
STATE = {
    "mid": MID,
    "generation": 0,
    "seq": 1,
    "in_op": True,
    "waiting_on": 0,
    "sent": [1, 1],
    "recv": [0, 0],
}
INFO = {"tcp": "tcp://127.0.0.1:1", "pid": 1}
GOOD = {
    "join": {"rank": 1, "world_size": 2, "mid": MID, "info": INFO},
    "status": {},
    "beat": dict(STATE, links=[[1, 1 << 20, 0.5, 2, 0.01, 0.0, 3, 0.002, 1, 0.004]]),
    "state": STATE,
    "progress": STATE,
    "diagnose": STATE,
    "outcome": dict(STATE, timeout=1.0),
    "leave": {"mid": MID},
    "join_request": {"mid": MID},
    "reconstruct": {"mid": MID, "generation": 0, "timeout": 1.0, "exclude": [0, 3]},
    "address": {"mid": MID, "generation": 1, "info": INFO},
    "rejoin": dict(STATE, rank=0, world_size=2, members=[MID, "n" * 32], failed=[], forming=-1),
    "probed": {
        "mid": MID,
        "generation": 0,
        "seq": 1,
        "token": 1,
        "heard": [0.5, None],
        "elapsed": 0.5,
    },
    "exited": {"proc": "launcher-1-2", "code": 0},
    "sched_ack": {"mid": MID, "generation": 0, "version": 1, "ok": True},
}
VALID_TOO = {"waiting_on": [None], "sent": [None], "recv": [None], "code": [None, -2]}
BAD = [None, {"a": 1}, "x" * 5000, -2, 2**64 - 1, float("nan"), b"\x00" * 10]


def decode(msg: dict, max_ranks: int = protocol.MAX_RANKS) -> protocol.AnyRequest:
    return decode_request(msgpack.packb(wire(msg)), max_ranks)


def test_every_type_has_a_good_example():
    assert set(GOOD) == set(protocol.REQUESTS)


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_a_good_request_decodes_to_its_record_and_back(kind):
    msg = dict(GOOD[kind], t=kind, extra="dropped")
    record = decode(msg)
    assert record.kind == kind
    as_wire = msgspec.to_builtins(record)
    assert "extra" not in as_wire
    sent = wire(dict(GOOD[kind], t=kind))
    for name, value in sent.items():  # every field sent is kept as it was
        kept = as_wire[name]
        if isinstance(value, dict):
            assert {k: kept[k] for k in value} == value, name
        else:
            assert msgpack.unpackb(msgpack.packb(kept)) == value, name  # tuples go as lists
    assert decode_request(pack(record)) == record


def _required(kind: str) -> set[str]:
    cls = next(c for c in protocol.AnyRequest.__args__ if c.__struct_config__.tag == kind)
    fields = {f.name for f in msgspec.structs.fields(cls) if f.required}
    if "report" in fields:  # written flat by the tests: the report's own required fields
        fields = (fields - {"report"}) | {"generation", "seq", "in_op"}
    return fields


@pytest.mark.parametrize(
    "kind,field", [(k, f) for k, fields in sorted(GOOD.items()) for f in fields]
)
def test_a_bad_or_missing_field_is_invalid_and_named(kind, field):
    for value in BAD:
        if value in VALID_TOO.get(field, ()):
            continue  # a value this field may take after all
        if field == "info" and isinstance(value, dict):
            continue  # an address may carry fields of a newer version (dropped)
        with pytest.raises(Invalid, match=field):
            decode(dict(GOOD[kind], t=kind, **{field: value}))
    if field in _required(kind):  # required: missing is invalid too
        with pytest.raises(Invalid, match=field):
            decode({k: v for k, v in dict(GOOD[kind], t=kind).items() if k != field})


PER_RANK = ("sent", "recv", "sent_age", "members", "failed", "heard", "exclude", "links")


@pytest.mark.parametrize("field", PER_RANK)
def test_a_per_rank_list_longer_than_the_job_is_invalid(field):
    kind = {
        "members": "rejoin",
        "failed": "rejoin",
        "heard": "probed",
        "exclude": "reconstruct",
    }.get(field, "beat")
    fill = MID if field == "members" else [0] * 10 if field == "links" else 0

    def entries(k: int) -> list:
        return list(range(k)) if field == "exclude" else [fill] * k  # distinct ranks there

    ok = dict(GOOD[kind], t=kind, **{field: entries(2)})
    if field == "members":
        ok["world_size"] = 2
    decode(ok, max_ranks=2)
    where = f"report.{field}" if field in ("sent", "recv", "sent_age") else field
    with pytest.raises(Invalid, match=f"{kind}.{where} has 3 entries, more than the 2"):
        decode(dict(ok, **{field: entries(3)}), max_ranks=2)
    # a megabyte of small entries is refused by its length alone
    with pytest.raises(Invalid, match="more than the 4"):
        decode(dict(ok, **{field: entries(1_000_000)}), max_ranks=4)


REPLIES = [
    protocol.Welcome(generation=1, infos=[protocol.Info(tcp="tcp://a:1", pid=2)], members=[MID]),
    protocol.Regroup(generation=2, rank=0, world_size=3),
    protocol.Unformed(generation=3, from_generation=2, failed_ranks=[1], reason="gone"),
    protocol.Unchanged(generation=2),
    protocol.Verdict(
        seq=4,
        culprits=[2],
        why="slow",
        evicted=True,
        stall=True,
        evidence=protocol.Evidence(decided_by="probes", stalled=[(2, 0)], unproven=[(0, 1)]),
    ),
    protocol.Probe(seq=4, token=9, peers=[0, 1, 2], bytes=16384, window=1.0),
    protocol.OutcomeAnswer(seq=4, verdict="commit"),
    protocol.Ping(token=3),
    protocol.Ping(),
    protocol.Failure(generation=2, failed_ranks=[1], reason="died", op=None),
    protocol.Evicted(reason="stalled"),
    protocol.Schedule(generation=2, version=1, start=10, plan=[[0, 2, 1], False, [], True]),
    protocol.SchedGo(generation=2, version=1),
    protocol.SchedDrop(generation=2, version=1),
    protocol.StatusAnswer(missing=[1], generation=0, world_size=0),
    protocol.Rejoined(generation=2),
    protocol.Bye(),
    protocol.Error(message="no"),
]


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: r.kind)
def test_every_reply_round_trips(reply):
    assert decode_reply(pack(reply)) == reply


def test_a_reply_is_checked_too():
    raw = msgpack.packb({"t": "regroup", "generation": 1, "rank": -1, "world_size": 2})
    with pytest.raises(Invalid, match="rank"):
        decode_reply(raw)
    with pytest.raises(Invalid):
        decode_reply(b"\xc1 not msgpack")


@pytest.mark.parametrize(
    "generation,forming,ok",
    [
        (0, -1, True),
        (5, 6, True),
        (5, 5 + recovery.MAX_ATTEMPTS, True),
        (5, 5, False),
        (5, 4, False),
        (5, 6 + recovery.MAX_ATTEMPTS, False),
        (0, protocol.MAX_GENERATION, False),
        (protocol.MAX_GENERATION, -1, False),
    ],
)
def test_a_rejoin_must_leave_room_for_the_generations_to_come(generation, forming, ok):
    problem = recovery.rejoin_out_of_bounds(generation, forming)
    assert (problem is None) == ok, problem


def test_a_member_id_is_the_fingerprint_of_its_own_key():
    keys = security.JobKeys(b"s" * 32)
    a, mid_a = identity.new_member(keys)
    b, mid_b = identity.new_member(keys)
    assert mid_a != mid_b and len(mid_a) == 32
    assert identity.mid_of(a.raw_public) == mid_a
    assert identity.connection_name(a.raw_public) == mid_a.encode()
    speaks = protocol.speaks_for_itself
    assert speaks(protocol.Leave(mid=mid_a), mid_a.encode())
    assert not speaks(protocol.Leave(mid=mid_b), mid_a.encode())
    assert not speaks(protocol.Leave(mid=mid_b), b"")
    assert speaks(protocol.Status(), mid_a.encode())
    assert speaks(protocol.Leave(mid=mid_b), None)  # insecure
    assert identity.new_member(None)[0] is None  # no keys


def test_a_reconstructs_exclusion_list_names_each_rank_once_and_comes_sorted():
    msg = dict(GOOD["reconstruct"], t="reconstruct")
    assert decode(dict(msg, exclude=[3, 1])).exclude == [1, 3]
    assert decode(dict(msg, exclude=[])).exclude == []
    with pytest.raises(Invalid, match="reconstruct.exclude names a rank twice"):
        decode(dict(msg, exclude=[2, 2]))
    for bad in ([-1], [True], ["1"], [1.0], 3):
        with pytest.raises(Invalid, match="exclude"):
            decode(dict(msg, exclude=bad))
