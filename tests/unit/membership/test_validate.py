"""What the coordinator takes from a message before any handler reads it (membership/validate.py,
recovery.py's bounds, identity.py): in one process, no sockets.

Invariants:
  * a well-formed message of every type passes, reduced to the fields its type has;
  * a field of the wrong type or range, or a missing one, is Invalid, with the field named;
  * a per-rank list (sent, recv, members, failed, heard) longer than the largest group the job can
    have is Invalid before its entries are looked at, however small each entry;
  * a re-registration's generations must leave room for the numbers a coordinator hands out;
  * a message naming a member id is taken only from the connection that proved that id.
"""

from __future__ import annotations

import pytest

from collectives.membership import identity, recovery, validate
from collectives.membership.validate import Invalid
from collectives.common import security

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
    "beat": dict(STATE, links=[[1, 1 << 20, 0.5, 2, 0.01, 0.0]]),
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


def test_every_type_has_a_good_example():
    assert set(GOOD) == set(validate.SCHEMAS)


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_a_good_message_passes_reduced_to_its_fields(kind):
    msg = dict(GOOD[kind], t=kind, extra="dropped")
    out = validate.check(msg)
    assert out["t"] == kind and "extra" not in out
    assert {k: v for k, v in out.items() if k != "t"} == {
        k: (tuple(map(tuple, v)) if k == "done" else v) for k, v in GOOD[kind].items()
    }


@pytest.mark.parametrize(
    "kind,field", [(k, f) for k, fields in sorted(GOOD.items()) for f in fields]
)
def test_a_bad_or_missing_field_is_invalid_and_named(kind, field):
    for value in BAD:
        if value in VALID_TOO.get(field, ()):
            continue  # a value this field may take after all
        if field == "info" and isinstance(value, dict):
            continue  # an address may carry fields of a newer version (scalars)
        with pytest.raises(Invalid, match=field):
            validate.check(dict(GOOD[kind], t=kind, **{field: value}))
    if field in validate.SCHEMAS[kind][0]:  # required: missing is invalid too
        with pytest.raises(Invalid, match=field):
            validate.check({k: v for k, v in dict(GOOD[kind], t=kind).items() if k != field})


@pytest.mark.parametrize("field", validate.PER_RANK)
def test_a_per_rank_list_longer_than_the_job_is_invalid(field):
    kind = {
        "members": "rejoin",
        "failed": "rejoin",
        "heard": "probed",
        "exclude": "reconstruct",
    }.get(field, "beat")
    fill = MID if field == "members" else [0] * 6 if field == "links" else 0

    def entries(k: int) -> list:
        return list(range(k)) if field == "exclude" else [fill] * k  # distinct ranks there

    ok = dict(GOOD[kind], t=kind, **{field: entries(2)})
    if field == "members":
        ok["world_size"] = 2
    validate.check(ok, max_ranks=2)
    with pytest.raises(Invalid, match=f"{kind}.{field} has 3 entries, more than the 2"):
        validate.check(dict(ok, **{field: entries(3)}), max_ranks=2)
    # a megabyte of small entries is refused by its length alone
    with pytest.raises(Invalid, match="more than the 4"):
        validate.check(dict(ok, **{field: [0] * 1_000_000}), max_ranks=4)


@pytest.mark.parametrize(
    "generation,forming,ok",
    [
        (0, -1, True),
        (5, 6, True),
        (5, 5 + recovery.MAX_ATTEMPTS, True),
        (5, 5, False),
        (5, 4, False),
        (5, 6 + recovery.MAX_ATTEMPTS, False),
        (0, validate.MAX_GENERATION, False),
        (validate.MAX_GENERATION, -1, False),
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
    assert identity.speaks_for_itself({"t": "leave", "mid": mid_a}, mid_a.encode())
    assert not identity.speaks_for_itself({"t": "leave", "mid": mid_b}, mid_a.encode())
    assert not identity.speaks_for_itself({"t": "leave", "mid": mid_b}, b"")
    assert identity.speaks_for_itself({"t": "status"}, mid_a.encode())
    assert identity.speaks_for_itself({"t": "leave", "mid": mid_b}, None)  # insecure
    assert identity.new_member(None)[0] is None  # no keys


def test_a_reconstructs_exclusion_list_names_each_rank_once_and_comes_sorted():
    msg = dict(GOOD["reconstruct"], t="reconstruct")
    assert validate.check(dict(msg, exclude=[3, 1]))["exclude"] == [1, 3]
    assert validate.check(dict(msg, exclude=[]))["exclude"] == []
    with pytest.raises(Invalid, match="reconstruct.exclude names a rank twice"):
        validate.check(dict(msg, exclude=[2, 2]))
    for bad in ([-1], [True], ["1"], [1.0], 3):
        with pytest.raises(Invalid, match="reconstruct.exclude"):
            validate.check(dict(msg, exclude=bad))
