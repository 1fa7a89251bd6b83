"""explain replay: a recorded multi-process run told one moment at a time.

Invariants (on a recorded run written out by hand, so that the test needs no processes):
  * the moments are in time order: each operation's sends, the signal, the first PeerFailure,
    each new generation, where they fell;
  * a moment's arrows join the processes that sent and took its messages, found through
    the ranks each process had in that generation (renumbered ranks included);
  * the killed process is drawn dead from the signal on, and the PeerFailure moment says how
    long after the signal it came.
"""

from __future__ import annotations

import pytest

from collectives.teaching.explain import views
from collectives.teaching.explain.replay_view import moments, replay_model
from collectives.teaching.failures import Story

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]


def msg(t, gen, rank, kind, src, dst, opkey):
    return {
        "event": "msg",
        "t": t,
        "generation": gen,
        "rank": rank,
        "kind": kind,
        "src": src,
        "dst": dst,
        "op": "all_reduce",
        "opkey": opkey,
        "phase": "exchange",
        "step": 0,
        "nbytes": 32,
    }


def recorded() -> Story:
    s = Story("KILL", 3, 1, 1, 2, t0=100.0)
    ev = [
        ("rank0", msg(100.1, 0, 0, "send", 0, 1, "c0")),
        ("rank1", msg(100.1, 0, 1, "send", 1, 2, "c0")),
        ("rank2", msg(100.1, 0, 2, "send", 2, 0, "c0")),
        ("rank0", msg(100.3, 0, 0, "send", 0, 2, "c1")),  # rank 1 is already stopped
        (
            "rank0",
            {
                "event": "failure",
                "t": 100.35,
                "rank": 0,
                "generation": 0,
                "error": "rank(s) 1 died",
                "step": 2,
            },
        ),
        (
            "rank2",
            {
                "event": "failure",
                "t": 100.36,
                "rank": 2,
                "generation": 0,
                "error": "rank(s) 1 died",
                "step": 2,
            },
        ),
        (
            "rank0",
            {
                "event": "generation",
                "t": 100.5,
                "old_rank": 0,
                "rank": 0,
                "generation": 1,
                "why": "failure",
            },
        ),
        (
            "rank2",
            {
                "event": "generation",
                "t": 100.5,
                "old_rank": 2,
                "rank": 1,
                "generation": 1,
                "why": "failure",
            },
        ),
        ("rank2", msg(100.6, 1, 1, "send", 1, 0, "c0")),  # old rank 2 is rank 1 now
        ("rank0", msg(100.6, 1, 0, "recv", 1, 0, "c0")),
    ]
    s.events = ev
    s.t_signal = 100.32
    return s


def test_moments_fall_in_time_order():
    kinds = [m["kind"] for m in moments(recorded())]
    assert kinds == ["op", "op", "signal", "failure", "generation", "op"]


def test_arrows_join_the_processes_of_each_generation():
    m = replay_model(recorded())
    names = ["rank0", "rank1", "rank2", "joiner", "coord"]
    first, after = m["frames"][0], m["frames"][-1]
    assert {(names[a["src"]], names[a["dst"]]) for a in first["arrows"]} == {
        ("rank0", "rank1"),
        ("rank1", "rank2"),
        ("rank2", "rank0"),
    }
    # generation 1's rank 1 is the process that was rank 2: its message goes 2 -> 0
    assert [(names[a["src"]], names[a["dst"]]) for a in after["arrows"]] == [("rank2", "rank0")]
    assert "generation 1" in after["title"]


def test_the_signal_and_the_failure_are_told():
    m = replay_model(recorded())
    signal = next(f for f in m["frames"] if f["title"].startswith("SIGKILL"))
    failure = next(f for f in m["frames"] if "PeerFailure" in f["title"])
    assert signal["nodes"][1]["color"] == views.DEAD
    assert "0.030 s after the signal" in failure["note"]
    assert "rank(s) 1 died" in views.text(m)
