"""The membership state machine driven with event sequences, no sockets and no clock
(membership/machine.py; the driver: tests/support/machine.py): each transition, each rule of a
stall's verdict (evidence, probes, history, the stated rule) and a restart's rebuild."""

from __future__ import annotations

import pytest

from support.machine import Driver, kinds

pytestmark = [pytest.mark.fast, pytest.mark.timeout(30)]

STALL = 3.0  # s: the askers' op timeout


def formed(n: int, **kw: object) -> Driver:
    """A driver whose generation 0 formed with n ranks m0..m(n-1), each beating once."""
    d = Driver(n, **kw)  # type: ignore[arg-type]
    d.join_all()
    for r in range(n):
        d.beat(f"m{r}")
    return d


# --- formation -------------------------------------------------------------------------------
def test_generation_0_forms_once_every_rank_joined_and_all_get_one_roster():
    d = Driver(3)
    assert d.join_all(2) == []  # rank 2 missing: nobody is answered yet
    sent = d.join_all(3)[-3:]
    assert kinds(sent) == [(b"j0", "welcome"), (b"j1", "welcome"), (b"j2", "welcome")]
    assert all(e.msg["members"] == ["m0", "m1", "m2"] for e in sent)
    assert all(e.msg["generation"] == 0 for e in sent)
    assert d.s.members == ["m0", "m1", "m2"] and d.s.generation == 0
    assert "generation 0 formed with 3 ranks" in d.notes()


@pytest.mark.parametrize(
    "msg, says",
    [
        ({"rank": 0, "world_size": 3}, "world_size 3, but the job has world_size 2"),
        ({"rank": 5, "world_size": 2}, "out of range"),
        ({"rank": 0, "world_size": 2, "mid": "other"}, "joined twice"),
    ],
)
def test_a_join_that_cannot_be_right_is_answered_with_an_error(msg, says):
    d = Driver(2)
    d.join_all(1)
    join = {"t": "join", "mid": "x", "info": {"tcp": "tcp://h:9", "pid": 9}, **msg}
    [answer] = d.arrive(b"bad", join)
    assert answer.msg["t"] == "error" and says in answer.msg["message"]


def test_a_join_after_formation_is_told_to_join_as_a_replacement():
    d = formed(2)
    [answer] = d.arrive(
        b"late", {"t": "join", "rank": 1, "world_size": 2, "mid": "z", "info": {"tcp": "t"}}
    )
    assert "init_process_group(join=True)" in answer.msg["message"]


def test_a_death_before_formation_gives_the_place_to_a_waiting_replacement():
    d = Driver(2)
    d.join_all(1)
    d.arrive(b"jr", {"t": "join_request", "mid": "new"})
    sent = d.die("m0")
    assert [e.msg for e in sent] == [{"t": "regroup", "generation": 0, "rank": 0, "world_size": 2}]
    assert sent[0].to == b"jr" and d.s.joined == {} and d.s.joiners == {}


def test_with_min_world_size_generation_0_forms_without_a_dead_rank_and_declares_it():
    d = Driver(3, min_world_size=2)
    d.join_all(2)
    d.die("m1")  # joined, then died: no replacement waits
    assert d.s.members is None  # rank 2 has not joined yet
    d.arrive(b"j2", {"t": "join", "rank": 2, "world_size": 3, "mid": "m2", "info": {"tcp": "t"}})
    assert d.s.members == ["m0", "m1", "m2"] and list(d.s.failed) == ["m1"]
    assert "before generation 0 formed" in d.s.failed["m1"]


# --- heartbeats, deaths, leaves --------------------------------------------------------------
def test_a_silent_member_is_declared_at_the_heartbeat_timeout_and_everybody_told():
    d = formed(3, heartbeat_timeout=1.0)
    d.tick(0.5)
    d.beat("m0")
    d.beat("m1")
    assert list(d.s.failed) == []
    d.tick(0.6)  # m2's last beat is 1.1 s old, the others' 0.6 s
    assert list(d.s.failed) == ["m2"]
    notice = [e for e in d.effects if getattr(e, "msg", {}).get("t") == "failure"]
    assert {e.to for e in notice} == {b"hb-m0", b"hb-m1"}
    assert notice[0].msg["failed_ranks"] == [2] and not notice[0].msg["graceful"]
    assert any(getattr(e, "to", None) == b"hb-m2" and e.msg["t"] == "evicted" for e in d.effects)


def test_a_witness_report_removes_a_member_at_once():
    d = formed(3)
    sent = d.die("m1", "died: its pidfd")
    assert sorted(kinds(sent)) == [
        (b"hb-m0", "failure"),
        (b"hb-m1", "evicted"),
        (b"hb-m2", "failure"),
    ]
    assert d.s.failed == {"m1": "died: its pidfd"}
    assert d.die("m1") == []  # a second witness of the same death: nothing more


def test_a_leave_is_graceful_and_answered_bye():
    d = formed(2)
    sent = d.arrive(b"leaver", {"t": "leave", "mid": "m1"})
    assert kinds(sent) == [(b"hb-m0", "failure"), (b"hb-m1", "evicted"), (b"leaver", "bye")]
    assert sent[0].msg["graceful"]


def test_a_beat_from_a_removed_member_is_answered_evicted():
    d = formed(2)
    d.die("m1")
    assert kinds(d.beat("m1")) == [(b"hb-m1", "evicted")]


# --- reconstruction --------------------------------------------------------------------------
def reconstruct(
    d: Driver, mid: str, seq: int | None = None, exclude: list[int] | None = None
) -> list:
    msg = {"t": "reconstruct", "mid": mid, "generation": d.s.generation, "timeout": 30.0}
    if seq is not None:
        msg["seq"] = seq
    if exclude is not None:
        msg["exclude"] = exclude
    return d.arrive(b"r-" + mid.encode(), msg)


def address(d: Driver, mid: str, gen: int) -> list:
    info = {"tcp": f"tcp://{mid}:1", "pid": 1}
    return d.arrive(
        b"a-" + mid.encode(), {"t": "address", "mid": mid, "generation": gen, "info": info}
    )


def test_a_round_with_nothing_changed_is_answered_unchanged():
    d = formed(2)
    reconstruct(d, "m0")
    reconstruct(d, "m1")
    assert kinds(d.tick()) == [(b"r-m0", "unchanged"), (b"r-m1", "unchanged")]
    assert d.s.round is None and d.s.generation == 0


def test_survivors_regroup_and_the_one_install_welcomes_all_with_one_roster():
    d = formed(3)
    d.die("m1")
    reconstruct(d, "m0")
    reconstruct(d, "m2")
    sent = d.tick()
    assert [(e.to, e.msg["rank"], e.msg["generation"]) for e in sent] == [
        (b"r-m0", 0, 1),
        (b"r-m2", 1, 1),
    ]
    assert address(d, "m0", 1) == []  # the other's address still missing
    sent = address(d, "m2", 1)
    assert kinds(sent) == [(b"a-m0", "welcome"), (b"a-m2", "welcome")]
    assert [e.msg["members"] for e in sent] == [["m0", "m2"], ["m0", "m2"]]
    assert (d.s.generation, d.s.members, d.s.failed) == (1, ["m0", "m2"], {})


def test_a_minority_cannot_expel_a_busy_majority():
    d = formed(3, heartbeat_timeout=100.0)
    reconstruct(d, "m0")
    d.tick(31.0, sweep=False)
    [err] = [e for e in d.effects if getattr(e, "to", None) == b"r-m0"]
    assert err.msg["t"] == "error" and "did not call reconstruct()" in err.msg["message"]
    assert d.s.failed == {}


def test_the_majority_removes_who_did_not_come_by_the_deadline():
    d = formed(3, heartbeat_timeout=100.0)
    reconstruct(d, "m0")
    reconstruct(d, "m1")
    d.tick(31.0, sweep=False)
    assert d.s.failed == {"m2": "did not call reconstruct() before the deadline"}
    assert d.s.forming is not None and d.s.forming.members == ["m0", "m1"]


def test_a_live_rank_the_others_exclude_is_evicted_at_once_and_the_group_forms_without_it():
    d = formed(3, heartbeat_timeout=100.0)
    assert reconstruct(d, "m0", exclude=[2]) == []
    assert d.tick() == [] and d.s.failed == {}  # rank 1 has not asked yet
    reconstruct(d, "m1", exclude=[2])
    sent = d.tick()  # no time passes: the round's deadline (30 s) is not what ends it
    assert d.s.failed == {"m2": "excluded by shrink_group (exclude [2])"}
    assert (b"hb-m2", "evicted") in kinds(sent)
    assert {(b"hb-m0", "failure"), (b"hb-m1", "failure")} <= set(kinds(sent))
    regroup = [e for e in sent if e.msg["t"] == "regroup"]
    assert [(e.to, e.msg["rank"], e.msg["world_size"]) for e in regroup] == [
        (b"r-m0", 0, 2),
        (b"r-m1", 1, 2),
    ]
    address(d, "m0", 1)
    address(d, "m1", 1)
    assert (d.s.generation, d.s.members) == (1, ["m0", "m1"])
    # the excluded rank, asking now, is told it was removed
    assert kinds(reconstruct(d, "m2")) == [(b"r-m2", "evicted")]


def test_an_exclusion_of_a_dead_rank_forms_at_once_too():
    d = formed(3)
    d.die("m1")
    reconstruct(d, "m0", exclude=[1])
    reconstruct(d, "m2", exclude=[1])
    sent = d.tick()
    assert [(e.to, e.msg["t"], e.msg["world_size"]) for e in sent] == [
        (b"r-m0", "regroup", 2),
        (b"r-m2", "regroup", 2),
    ]


@pytest.mark.parametrize(
    "lists, says",
    [
        ({"m0": [3], "m1": [2, 3]}, "rank 0 excludes [3]; rank 1 excludes [2, 3]"),
        ({"m0": [3], "m1": None}, "rank 0 excludes [3]; rank 1 excludes []"),
        # the excluded rank itself asks (a plain reconstruct): its list differs
        ({"m0": [3], "m3": None}, "rank 0 excludes [3]; rank 3 excludes []"),
    ],
)
def test_askers_whose_exclusion_lists_differ_all_get_an_error_naming_the_lists(lists, says):
    d = formed(4, heartbeat_timeout=100.0)
    for mid, exclude in lists.items():
        reconstruct(d, mid, exclude=exclude)
    sent = d.tick()
    assert sorted(e.to for e in sent) == sorted(b"r-" + m.encode() for m in lists)
    for e in sent:
        assert e.msg["t"] == "error" and "disagree about the ranks to exclude" in e.msg["message"]
        assert says in e.msg["message"]
    assert d.s.failed == {} and d.s.round is None and d.s.forming is None
    # nothing changed: asking again with one list works
    for mid in ("m0", "m1", "m2"):
        reconstruct(d, mid, exclude=[3])
    d.tick()
    assert list(d.s.failed) == ["m3"] and d.s.forming is not None


@pytest.mark.parametrize(
    "mid, exclude, says",
    [
        ("m0", [0], "rank 0 excludes itself"),
        ("m1", [3], "rank(s) [3] are not ranks of generation 0 (3 ranks)"),
    ],
)
def test_an_exclusion_list_that_cannot_be_right_is_refused(mid, exclude, says):
    d = formed(3)
    [answer] = reconstruct(d, mid, exclude=exclude)
    assert answer.msg["t"] == "error" and says in answer.msg["message"]
    assert d.s.round is None


def test_the_list_of_an_asker_removed_meanwhile_no_longer_counts():
    d = formed(4, heartbeat_timeout=100.0)
    reconstruct(d, "m1", exclude=[3])
    d.die("m1")  # then it died: the others exclude it too
    reconstruct(d, "m0", exclude=[1, 3])
    reconstruct(d, "m2", exclude=[1, 3])
    sent = d.tick()
    assert not [e for e in sent if e.msg["t"] == "error"], sent
    assert d.s.failed["m3"] == "excluded by shrink_group (exclude [1, 3])"
    assert d.s.forming is not None and d.s.forming.members == ["m0", "m2"]


def test_a_minority_cannot_exclude_a_live_majority():
    d = formed(3, heartbeat_timeout=100.0)
    reconstruct(d, "m0", exclude=[1, 2])
    [err] = d.tick()
    assert err.to == b"r-m0" and err.msg["t"] == "error"
    assert "a minority of the 3 live ranks cannot exclude live rank(s) [1, 2]" in err.msg["message"]
    assert d.s.failed == {}


def test_a_joiner_is_admitted_and_a_spare_only_into_an_empty_place():
    d = formed(2)
    d.arrive(b"jr-a", {"t": "join_request", "mid": "spare1", "spare": True})
    reconstruct(d, "m0")
    reconstruct(d, "m1")
    assert kinds(d.tick()) == [(b"r-m0", "unchanged"), (b"r-m1", "unchanged")]  # no room
    d.die("m1")
    reconstruct(d, "m0")
    sent = d.tick()
    assert [(e.to, e.msg["rank"], e.msg["world_size"]) for e in sent] == [
        (b"r-m0", 0, 2),
        (b"jr-a", 1, 2),
    ]


def test_a_generation_whose_joiner_dies_does_not_form_and_its_members_are_told():
    d = formed(2)
    d.arrive(b"jr-a", {"t": "join_request", "mid": "new"})
    reconstruct(d, "m0")
    reconstruct(d, "m1")
    d.tick()
    gen = d.s.forming.generation
    d.die("new", "died: its pidfd")
    sent = d.tick()
    # the joiner's last address is told too: it is gone, and nothing waits for it
    assert sorted(kinds(sent)) == [
        (b"jr-a", "unformed"),
        (b"r-m0", "unformed"),
        (b"r-m1", "unformed"),
    ]
    assert d.s.forming is None and d.s.dissolved and d.s.tried == gen
    # the next attempt takes a fresh number
    reconstruct(d, "m0")
    reconstruct(d, "m1")
    assert {e.msg["generation"] for e in d.tick()} == {gen + 1}


def test_a_removed_member_id_is_never_admitted_again():
    d = formed(2)
    d.die("m1")
    [answer] = d.arrive(b"again", {"t": "join_request", "mid": "m1"})
    assert answer.msg["t"] == "error" and "join as a new one" in answer.msg["message"]
    assert "m1" not in d.s.joiners


# --- a stall's verdict -----------------------------------------------------------------------
def ask(d: Driver, r: int, state: dict, probe: bool = True, age: float = 3.0) -> list:
    """Rank r's op deadline passed: it asks, with its picture. The pings of the diagnosis
    are answered with the same pictures, each once its rank has asked (taken then): each
    frame counted in `sent` left `age` s before (Progress.sent_age)."""
    msg = {
        "t": "diagnose",
        "mid": f"m{r}",
        "generation": d.s.generation,
        "seq": 5,
        "in_op": True,
        "timeout": STALL,
        "probe": probe,
        **state,
    }
    sent = d.arrive(b"d%d" % r, msg)
    PINGS.extend(
        (int(e.to.decode().removeprefix("hb-m")), e.msg["token"])
        for e in sent
        if e.msg["t"] == "ping"
    )
    ASKED[r] = (state, age)
    for q, token in [(q, t) for q, t in PINGS if q in ASKED]:
        PINGS.remove((q, token))
        answer(d, q, token, *ASKED[q])
    return sent


ASKED: dict[int, tuple[dict, float]] = {}  # the pictures of the ranks in this test's stall
PINGS: list[tuple[int, int]] = []  # (rank, token): the pings not answered yet


def answer(d: Driver, r: int, token: int, state: dict, age: float) -> None:
    """Rank r answers a diagnosis's ping with `state`; its sends left `age` s ago."""
    sent_age = [age if k else None for k in state.get("sent") or ()] or None
    d.beat(
        f"m{r}",
        seq=5,
        in_op=True,
        kind="state",
        token=token,
        sent_age=sent_age,
        **{k: v for k, v in state.items() if k in ("waiting_on", "sent", "recv")},
    )


@pytest.fixture(autouse=True)
def _fresh_pictures():
    ASKED.clear()
    PINGS.clear()


def verdicts(sent: list) -> dict:
    return {e.to: e.msg for e in sent if e.msg["t"] == "verdict"}


# one stalled link, 2 -> 1: its two ends tie
TIE = {
    0: {"waiting_on": 1, "sent": [0, 0, 0], "recv": [0, 0, 0]},
    1: {"waiting_on": 2, "sent": [0, 0, 0], "recv": [0, 0, 0]},
    2: {"waiting_on": None, "sent": [0, 1, 0], "recv": [0, 0, 0]},
}


def test_evidence_decides_when_one_rank_explains_every_stalled_link():
    """Links 2->0 and 0->1 stalled: rank 0 alone touches both."""
    d = formed(3)
    chain = {
        0: {"waiting_on": 2, "sent": [0, 1, 0], "recv": [0, 0, 0]},
        1: {"waiting_on": 0, "sent": [0, 0, 0], "recv": [0, 0, 0]},
        2: {"waiting_on": None, "sent": [1, 0, 0], "recv": [0, 0, 0]},
    }
    for r in range(3):
        ask(d, r, chain[r])
    v = verdicts(d.tick())
    assert {i: m["culprits"] for i, m in v.items()} == {b"d0": [0], b"d1": [0], b"d2": [0]}
    assert v[b"d0"]["evidence"]["decided_by"] == "the stalled op" and v[b"d0"]["stall"]
    assert list(d.s.failed) == ["m0"]


def test_a_late_senders_fresh_frames_blame_nobody():
    """The seed's stall beside CPU burners: links 1->2 and 2->0 held; rank 0 came late to the
    op, short of CPU, and sent to 1 and 2 just before its picture, after theirs. Its frames
    are in no stalled link (they left after the receivers' pictures were taken), so rank 0
    alone touches no set of stalled links: only 2->0 is proven, its ends tie, the probes
    find 1->2 and 2->0 slow, and rank 2 goes. Judged on the pictures as they stand, the
    links 2->0, 0->1 and 0->2 had all pointed at rank 0."""
    d = formed(3)
    late = {
        0: ({"waiting_on": 2, "sent": [0, 1, 1], "recv": [0, 0, 0]}, 0.05),
        1: ({"waiting_on": 0, "sent": [1, 0, 1], "recv": [0, 0, 0]}, 3.0),
        2: ({"waiting_on": 0, "sent": [1, 1, 0], "recv": [0, 0, 0]}, 3.0),
    }
    for r in (1, 2, 0):
        ask(d, r, late[r][0], age=late[r][1])
    heard = {0: [None, 0.001, None], 1: [0.001, None, 0.001], 2: [0.001, None, None]}
    v = probes_heard(d, heard)
    assert v[b"d0"]["culprits"] == [2] and v[b"d0"]["evidence"]["decided_by"] == "probes"
    assert v[b"d0"]["evidence"]["stalled"] == [[2, 0]]
    assert v[b"d0"]["evidence"]["unproven"] == [[0, 1], [0, 2]]
    assert list(d.s.failed) == ["m2"]


def test_a_picture_taken_before_the_ping_proves_no_link_into_its_rank():
    """The asker's own picture (in its diagnose) was taken at a moment the coordinator cannot
    place: while its rank leaves the ping unanswered, no link into it counts as stalled,
    however long ago its sender's bytes left; the verdict waits the window out for it."""
    d = formed(3, diagnose_window=0.3)
    sent = d.arrive(
        b"d0",
        {
            "t": "diagnose",
            "mid": "m0",
            "generation": 0,
            "seq": 5,
            "in_op": True,
            "timeout": STALL,
            "probe": False,
            "waiting_on": 2,
            "sent": [0, 0, 0],
            "recv": [0, 0, 0],
        },
    )
    tokens = {e.to: e.msg["token"] for e in sent if e.msg["t"] == "ping"}
    assert set(tokens) == {b"hb-m0", b"hb-m1", b"hb-m2"}  # the asker is pinged too
    answer(d, 1, tokens[b"hb-m1"], {"waiting_on": None, "sent": [0, 0, 0], "recv": [0, 0, 0]}, 3)
    answer(d, 2, tokens[b"hb-m2"], {"waiting_on": None, "sent": [1, 0, 0], "recv": [0, 0, 0]}, 3)
    assert not verdicts(d.tick())  # rank 0's answer is waited for
    # the window passes; with a link unproven the probes would speak first, and the other
    # ranks may still ask: one op timeout (probing.ASK_WAIT); nobody can probe, so it decides
    assert not verdicts(d.tick(0.5))
    v = verdicts(d.tick(STALL))[b"d0"]
    assert v["evidence"]["stalled"] == [] and v["evidence"]["unproven"] == [[2, 0]]
    # and once its answer is in, the same frame, 3 s old, proves the link
    d2 = formed(3)
    for r, state in ((1, {"waiting_on": None, "sent": [0, 0, 0]}), (2, {"sent": [1, 0, 0]})):
        ASKED[r] = ({**state, "recv": [0, 0, 0]}, 3.0)
    ask(d2, 0, {"waiting_on": 2, "sent": [0, 0, 0], "recv": [0, 0, 0]}, probe=False)
    v2 = verdicts(d2.tick(STALL + 0.1))[b"d0"]  # a tie; nobody else asks or probes
    assert v2["evidence"]["stalled"] == [[2, 0]] and v2["evidence"]["unproven"] == []


def test_a_silent_rank_is_blamed_first():
    d = formed(3)
    d.die("m2")
    ask(d, 0, TIE[0])
    ask(d, 1, TIE[1])
    v = verdicts(d.tick())
    assert v[b"d0"]["culprits"] == [2] and not v[b"d0"]["stall"]  # announced as a death


def probe_round(d: Driver, heard: dict) -> dict:
    """Every rank asks about the tie; the machine asks for probes; each reports `heard`."""
    for r in range(3):
        ask(d, r, TIE[r])
    return probes_heard(d, heard)


def probes_heard(d: Driver, heard: dict) -> dict:
    """The machine asks every asker to probe (no verdict yet); each reports `heard`: the
    verdicts that follow."""
    sent = d.tick()
    probes = {e.to: e.msg for e in sent if e.msg["t"] == "probe"}
    assert set(probes) == {b"d0", b"d1", b"d2"} and not verdicts(sent)
    for r in range(3):
        d.arrive(
            b"d%d" % r,
            {
                "t": "probed",
                "mid": f"m{r}",
                "generation": 0,
                "seq": 5,
                "token": probes[b"d%d" % r]["token"],
                "heard": heard[r],
                "elapsed": 0.1,
            },
        )
    return verdicts(d.tick())


def test_probes_decide_a_tie():
    """2 -> 1 stalled, and the probes find 2 -> 0 slow too: rank 2 alone explains both."""
    d = formed(3)
    v = probe_round(d, {0: [None, 0.001, None], 1: [0.001, None, None], 2: [0.001, 0.001, None]})
    assert v[b"d0"]["culprits"] == [2] and v[b"d0"]["evidence"]["decided_by"] == "probes"


ONLY_2_TO_1 = {0: [None, 0.001, 0.001], 1: [0.001, None, None], 2: [0.001, 0.001, None]}


def test_history_breaks_a_tie_the_probes_leave():
    d = formed(3)
    d.s.judgements.link_history["m1"] = 1  # an earlier stall found rank 1 on a bad link
    v = probe_round(d, ONLY_2_TO_1)
    assert v[b"d0"]["culprits"] == [1] and v[b"d0"]["evidence"]["decided_by"] == "history"


def test_the_stated_rule_is_the_last_resort_and_says_so():
    d = formed(3)
    v = probe_round(d, ONLY_2_TO_1)
    assert v[b"d0"]["culprits"] == [2] and v[b"d0"]["evidence"]["decided_by"] == "rule"
    assert "rule: the highest rank goes" in v[b"d0"]["why"]
    assert d.s.judgements.link_history == {"m1": 1, "m2": 1}  # for the next tie


def test_one_verdict_per_stalled_op_whoever_asks_later():
    d = formed(3)
    first = probe_round(d, ONLY_2_TO_1)
    [again] = ask(d, 0, TIE[0])  # asked again (a client that resent after a restart)
    assert again.msg == first[b"d0"]


# --- outcomes ----------------------------------------------------------------------------------
def test_an_op_counts_once_every_survivor_holds_its_result():
    d = formed(3)
    d.die("m2")
    for r in (0, 1):
        d.arrive(
            b"o%d" % r,
            {
                "t": "outcome",
                "mid": f"m{r}",
                "generation": 0,
                "seq": 4,
                "in_op": False,
                "waiting_on": None,
                "sent": None,
                "recv": None,
                "has_data": True,
                "timeout": 5.0,
            },
        )
    sent = d.tick()
    assert sorted((e.to, e.msg["verdict"]) for e in sent) == [(b"o0", "commit"), (b"o1", "commit")]


# --- a restart's rebuild -----------------------------------------------------------------------
def rejoin(mid: str, rank: int, gen: int, members: list, **kw: object) -> dict:
    return {
        "t": "rejoin",
        "mid": mid,
        "rank": rank,
        "world_size": len(members),
        "generation": gen,
        "members": members,
        "failed": [],
        "forming": -1,
        "seq": 7,
        "in_op": False,
        "waiting_on": None,
        "sent": None,
        "recv": None,
        **kw,
    }


def test_a_restart_rebuilds_from_the_re_registrations():
    m = ["a", "b", "c"]
    d = Driver(3, heartbeat_timeout=1.0)
    beat = {"t": "beat", "mid": "a", "generation": 4, "seq": 1, "in_op": False}
    assert d.arrive(b"x", {**beat, "waiting_on": None, "sent": None, "recv": None}) == []
    assert kinds(d.arrive(b"i0", rejoin("a", 0, 4, m))) == [(b"i0", "rejoined")]
    assert (d.s.generation, d.s.members, d.s.recovering) == (4, m, {"b", "c"})
    assert kinds(d.arrive(b"i9", rejoin("b", 0, 4, ["b", "a", "c"]))) == [(b"i9", "evicted")]
    assert kinds(d.arrive(b"i1", rejoin("b", 1, 4, m, failed=[2])))[0] == (b"i1", "rejoined")
    assert list(d.s.failed) == ["c"] and d.s.recovering is None  # c reported failed by b
    assert d.s.generation == 4  # never changed by a rebuild
