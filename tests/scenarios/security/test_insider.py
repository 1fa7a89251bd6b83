"""One message from a holder of the job secret cannot wreck the job (docs/security.md).

Invariants, each against a real job (tests/security_worker.py; rank 0 hosts the coordinator):
  * a member speaks only for itself: a `leave` naming another member's id, from a connection
    that proved another key, removes nobody, and every sum stays exact;
  * a re-registration (`rejoin`) sent to a coordinator that never restarted, claiming a forming
    generation of 2^31, changes nothing: the next reconstruct() keeps a valid generation and
    every rank sums exactly in it;
  * beats of a megabyte each, naming member ids not their own, leave the coordinator's memory
    within a few MiB, and the job goes on;
  * frames a member sends for ops that never come, up to the stash's bound, are freed once the
    group re-forms without it: the rank's memory comes back to where it was.
"""

from __future__ import annotations

import time
import uuid

import msgpack
import pytest
import zmq

from collectives.common import security
from support.security_world import SECRET, Procs, base_env, finish, rss_kib, start_world, wait_json
from support.timing import scaled


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.close()


def insider(ctx: zmq.Context, port: int) -> zmq.Socket:
    """A socket to the coordinator that holds the job's keys (the shared member key: what any
    holder of the secret can derive) -- not any member's own."""
    keys = security.JobKeys(SECRET.encode())
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 0)
    security.make_client(s, keys)
    s.connect(f"tcp://127.0.0.1:{port}")
    return s


def mids(tmp_path, n) -> list[str]:
    return [wait_json(tmp_path / f"rank{r}.addr.json", 60)["mid"] for r in range(n)]


@pytest.mark.timeout(90)
def test_a_leave_in_another_members_name_removes_nobody(procs, tmp_path):
    env = base_env(COLLECTIVES_JOB_SECRET=SECRET)
    port = start_world(procs, tmp_path, 3, "idle", env)
    victim = mids(tmp_path, 3)[2]
    ctx = zmq.Context()
    s = insider(ctx, port)
    try:
        for _ in range(3):
            s.send(msgpack.packb({"t": "leave", "mid": victim, "pid": 1}))
        time.sleep(1.5)  # two agreements of the idle loop with the leave served
        (tmp_path / "stop").touch()
        finish(procs, tmp_path, 3)  # every rank, rank 2 too, ends with an exact sum
    finally:
        s.close()
        ctx.term()
    assert "dropped a 'leave' message naming member" in procs.err("rank0")


@pytest.mark.timeout(90)
def test_a_rejoin_to_a_coordinator_that_never_restarted_changes_nothing(procs, tmp_path):
    env = base_env(COLLECTIVES_JOB_SECRET=SECRET, TEST_ROGUE="1")
    start_world(procs, tmp_path, 3, "rogue_rejoin", env)
    reports = finish(procs, tmp_path, 3)
    assert {r["generation"] for r in reports} == {0}, reports  # nothing to regroup for


@pytest.mark.timeout(120)
def test_megabyte_beats_in_others_names_leave_the_coordinator_small(procs, tmp_path):
    env = base_env(COLLECTIVES_JOB_SECRET=SECRET)
    port = start_world(procs, tmp_path, 2, "idle", env)
    victim = mids(tmp_path, 2)[1]
    pid = wait_json(tmp_path / "rank0.addr.json", 10)["pid"]
    # a beat as large as the coordinator takes (1 MiB): a million counts
    big = [0] * 1_000_000
    ctx = zmq.Context()
    s = insider(ctx, port)
    try:
        before = rss_kib(pid)
        for i in range(40):
            mid = victim if i % 2 else uuid.uuid4().hex
            s.send(
                msgpack.packb(
                    {
                        "t": "beat",
                        "mid": mid,
                        "generation": 0,
                        "seq": -1,
                        "in_op": False,
                        "waiting_on": None,
                        "sent": big,
                        "recv": None,
                    }
                )
            )
        time.sleep(3.0)  # all served (each is dropped in milliseconds)
        grown = (rss_kib(pid) - before) / 1024
        print(f"rank 0 (coordinator): +{grown:.0f} MiB after 40 beats of 1 MiB")
        (tmp_path / "stop").touch()
        finish(procs, tmp_path, 2)
    finally:
        s.close()
        ctx.term()
    assert grown < 48, f"rank 0 (the coordinator's host) grew by {grown:.0f} MiB"


@pytest.mark.timeout(150)
def test_frames_for_ops_that_never_come_are_freed_with_their_group(procs, tmp_path):
    stash_mib = 96
    env = base_env(
        COLLECTIVES_JOB_SECRET=SECRET,
        TEST_ROGUE="2",
        TEST_FRAMES="160",
        TEST_STASH_BYTES=str(stash_mib << 20),
        COLLECTIVES_TRANSPORT="tcp",
        COLLECTIVES_HEARTBEAT_TIMEOUT=f"{scaled(3):g}",
    )
    start_world(procs, tmp_path, 3, "flood_ahead", env)
    for r in (0, 1):
        assert procs.wait(f"rank{r}", 120) == 0, procs.err(f"rank{r}")[-3000:]
    rep = wait_json(tmp_path / "rank0.json", 5)
    assert rep["ok"] and rep["results"] == [6, 3], rep
    before, after = rep["rss_kib"]
    peak = (rep["hwm_kib"] - before) / 1024
    kept = (after - before) / 1024
    print(
        f"rank 0: VmRSS {before >> 10} MiB before the flood, peak +{peak:.0f} MiB, "
        f"+{kept:.0f} MiB after the group re-formed"
    )
    assert peak > stash_mib / 2, f"the flood never reached rank 0 (peak +{peak:.0f} MiB): {rep}"
    assert kept < stash_mib / 4, (
        f"rank 0 still holds +{kept:.0f} MiB after the group "
        f"re-formed (peak +{peak:.0f} MiB): {rep}"
    )
