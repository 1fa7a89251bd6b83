"""The coordinator's probe round (membership/probing.py): its time bound, and what it makes of
the reports -- a probe not heard from a peer that started well after the listener tells
nothing and is left out, not counted slow."""

import pytest

from collectives.membership import probing
from collectives.membership.protocol import Probed
from collectives.membership.state import Diagnosis, Outbox, ProbeRound

pytestmark = [pytest.mark.fast, pytest.mark.timeout(10)]


@pytest.mark.parametrize("timeout", [1.0, 2.0, 3.0, 10.0, 30.0, 300.0])
def test_the_whole_round_ends_within_twice_the_op_timeout(timeout):
    # waiting for askers, the probe window (doubled on a loaded host), the report grace
    worst = probing.ASK_WAIT * timeout + 2 * probing.window(timeout) + probing.grace(timeout)
    assert worst <= 2 * timeout, worst


def test_the_instruction_goes_to_every_asker_that_can_probe():
    out = Outbox()
    d = Diagnosis(until=0.0, first=0.0, timeout=3.0)
    d.ranks = {0: b"a", 1: b"b", 2: b"c"}
    d.can_probe = {0: True, 1: True, 2: False}
    assert probing.start(out, d, seq=7, token=1, now=0.0)
    sent = out.sent()
    assert [e.to for e in sent] == [b"a", b"b"]
    msg = sent[0].msg
    assert msg.kind == "probe" and msg.peers == [0, 1] and msg.seq == 7
    assert msg.bytes == probing.PROBE_BYTES and msg.window == probing.window(3.0)
    d1 = Diagnosis(until=0.0, first=0.0, timeout=3.0)
    d1.ranks, d1.can_probe = {0: b"a"}, {0: True}
    assert not probing.start(Outbox(), d1, seq=7, token=2, now=0.0)  # one alone measures nothing


def test_reports_of_a_late_starter_are_not_evidence_against_it():
    pr = ProbeRound(token=5, ranks=[0, 1, 2], window=1.0, sent_at=0.0, until=10.0)
    # rank 2 started 0.8 s after ranks 0 and 1 (coordinator clock: receipt - elapsed)
    pr.reports = {
        0: (100.0, {1: 0.001, 2: None}),
        1: (100.0, {0: None, 2: None}),
        2: (100.8, {0: 0.0, 1: 0.0}),
    }
    heard = probing.results(pr)
    assert heard[0] == {1: 0.001}  # 2->0 unknown: 2 started half a window late
    assert heard[1] == {0: None}  # 0->1 not heard although 0 started first: slow
    assert heard[2] == {0: 0.0, 1: 0.0}


def test_a_report_for_another_round_or_of_the_wrong_size_is_ignored():
    d = Diagnosis(until=0.0, first=0.0)
    d.probe = pr = ProbeRound(token=5, ranks=[0, 1], window=1.0, sent_at=0.0, until=10.0)

    def report(token, heard):
        return Probed(mid="m", generation=0, seq=7, token=token, heard=heard, elapsed=1.0)

    probing.take_report(d, 0, report(4, [None, 0.0]), 2, 5.0)
    probing.take_report(d, 0, report(5, [None, 0.0, 0.0]), 2, 5.0)
    probing.take_report(d, 3, report(5, [None, 0.0]), 2, 5.0)
    assert pr.reports == {}
    probing.take_report(d, 1, report(5, [0.002, None]), 2, 5.0)
    assert pr.reports[1] == (4.0, {0: 0.002})


def test_a_probe_report_is_checked_field_by_field():
    import msgpack

    from collectives.membership.protocol import Invalid, decode_request

    def check(msg: dict) -> Probed:
        got = decode_request(msgpack.packb(msg))
        assert isinstance(got, Probed)
        return got

    good = {
        "t": "probed",
        "mid": "m" * 32,
        "generation": 0,
        "seq": 7,
        "token": 5,
        "heard": [None, 0.002, 0],
        "elapsed": 1.0,
    }
    assert check(good).heard == [None, 0.002, 0]
    for bad in (
        {"heard": ["x"]},
        {"heard": [-1.0]},
        {"heard": {"0": 1}},
        {"elapsed": -1},
        {"token": "5"},
    ):
        with pytest.raises(Invalid):
            check({**good, **bad})
