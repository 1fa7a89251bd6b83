"""The membership scale study (bench/studies/membership_scale.py) at a small N, in-process.

Invariants: N members beating every interval put N / interval requests a second into the
coordinator and get nothing back while nobody fails; a silent member is declared within the
heartbeat timeout plus one sweep, a closed connection within its grace plus one sweep, a pidfd's
death at once; each fault ends in a new generation of every survivor, one rank smaller; the
coordinator's CPU is measured for every event kind it was fed. A machine that never declares a
silent member dead makes the study fail (StudyFailed, exit status 1), not report.

The figures checked are virtual seconds: the study's clock does not move with the host's load,
so they are exact, not scaled.
"""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if ROOT not in sys.path:  # bench/ is a repo-root tool, not part of the installed package
    sys.path.insert(0, ROOT)

from bench.studies import membership_scale as ms  # noqa: E402
from collectives.membership import connections, machine  # noqa: E402
from collectives.membership.server import HEARTBEAT_CHECK_EVERY  # noqa: E402

N, INTERVAL, TIMEOUT, STEADY, LATENCY = 60, 0.5, 2.0, 1.0, 0.0002

pytestmark = pytest.mark.fast


def _run() -> ms.Run:
    return ms.study(N, INTERVAL, TIMEOUT, STEADY, LATENCY, seed=1)


def test_small_run_is_sane():
    r = _run()
    assert r.members == N
    # every member beats once per interval; nothing is sent back while nobody fails
    assert r.steady_in_per_s == pytest.approx(N / INTERVAL, rel=0.05)
    assert r.steady_out_per_s == 0
    silent, closed, pidfd = r.faults
    assert [f.kind for f in r.faults] == ["silent", "connection", "pidfd"]
    # one sweep late at most (server.HEARTBEAT_CHECK_EVERY), plus the wire both ways
    sweep = HEARTBEAT_CHECK_EVERY + 2 * LATENCY
    assert TIMEOUT <= silent.detection_s <= TIMEOUT + sweep
    assert connections.GRACE <= closed.detection_s <= connections.GRACE + sweep
    assert 0 <= pidfd.detection_s <= sweep
    for k, f in enumerate(r.faults, start=1):
        assert f.generation == k and f.world_size == N - k
        # a reconstruction is three message rounds (reconstruct, regroup/address, welcome)
        assert 0 < f.reconstruction_s <= 6 * LATENCY + 2 * HEARTBEAT_CHECK_EVERY
        assert f.messages_out >= 3 * (N - k)  # notices, regroups, welcomes
    # the CPU was measured for what was fed, and gives a finite capacity
    for kind in ("join", "beat", "reconstruct", "address", "Tick", "Tick sweep", "Died"):
        assert r.costs_us[kind].count > 0 and r.costs_us[kind].mean_us > 0
    assert r.beats_per_s_one_core > N / INTERVAL
    assert r.largest_n_at_interval == int(r.beats_per_s_one_core * INTERVAL)
    assert r.welcome_bytes > N * 20  # the roster and every address, to each member


def test_a_silent_member_never_declared_fails_the_study(monkeypatch, capsys):
    """Detection broken (the heartbeat clocks never looked at): the study raises, and its
    command exits 1 naming the fault."""
    monkeypatch.setattr(machine, "check_heartbeats", lambda s, out, now: None)
    with pytest.raises(ms.StudyFailed, match="silent: rank .* no failure notice"):
        _run()
    code = ms.main(["--members", str(N), "--heartbeat-timeout", str(TIMEOUT), "--steady", "1"])
    assert code == 1
    assert "no failure notice" in capsys.readouterr().err
