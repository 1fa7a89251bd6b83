"""One message from a holder of the job secret cannot wreck the job (docs/security.md).

Invariants, each against a real job (tests/security_worker.py; rank 0 hosts the coordinator):
  * a member speaks only for itself: a `leave` naming another member's id, from a connection
    that proved another key, is dropped (the coordinator's log names the member, once per
    message), removes nobody, and every sum stays exact;
  * a re-registration (`rejoin`) sent to a coordinator that never restarted, claiming a forming
    generation of 2^31, is refused (`evicted`, naming that generation) and changes nothing: the
    next reconstruct() keeps a valid generation and every rank sums exactly in it;
  * beats of a megabyte each, naming member ids not their own, each reach the coordinator and
    are dropped as invalid (one log line each), leave the coordinator's memory within a
    few MiB (keeping them would take 40), and the job goes on; beats of a size it takes, in
    the same names, are each dropped by the name check (naming the member claimed);
  * frames a member sends for ops that never come, up to the stash's bound, are freed once the
    group re-forms without it: the rank's memory comes back to where it was.
"""

from __future__ import annotations

import re
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


BEATS = 40  # of 1 MiB each: 40 MiB that a coordinator keeping them would hold
TOO_LARGE = r"dropped an invalid message: beat\.report\.sent has 1000000 entries"
KEPT_MIB = 16  # what it may grow by over the second round: keeping them would take 40
IN_FLIGHT = 2  # beats sent before waiting for their drops: the most libzmq ever queues
SMALL = 4  # beats of a valid size in others' names


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


def impostor(kind: str) -> str:
    """The coordinator's line for a `kind` message that named another member (server.py); its
    group: the member named."""
    return rf"dropped a '{kind}' message naming member (\w+)"


def wait_dropped(procs, pattern: str, n: int, timeout: float) -> list[str]:
    """The first `n` matches of `pattern` in rank 0's log, once there are `n` (within `timeout`
    s, scaled): the event that says its coordinator served and dropped every message sent (the
    worker runs with TEST_LOG_EVERY_DROP=1: one line per message dropped)."""
    deadline = time.monotonic() + scaled(timeout)
    while len(seen := re.findall(pattern, procs.err("rank0"))) < n:
        assert procs.procs["rank0"].poll() is None, procs.err("rank0")[-3000:]
        assert time.monotonic() < deadline, (
            f"the coordinator dropped {len(seen)} of the {n} messages sent ({pattern!r}) within "
            f"{scaled(timeout):g} s: the others never reached it\n{procs.err('rank0')[-3000:]}"
        )
        time.sleep(0.05)
    return seen[:n]


@pytest.mark.timeout(90)
def test_a_leave_in_another_members_name_removes_nobody(procs, tmp_path):
    env = base_env(COLLECTIVES_JOB_SECRET=SECRET, TEST_LOG_EVERY_DROP="1")
    port = start_world(procs, tmp_path, 3, "idle", env)
    victim = mids(tmp_path, 3)[2]
    ctx = zmq.Context()
    s = insider(ctx, port)
    try:
        for _ in range(3):
            s.send(msgpack.packb({"t": "leave", "mid": victim, "pid": 1}))
        # every leave served, each dropped as another member's (a leave taken would have
        # removed rank 2: its next sum fails, and so does finish())
        assert wait_dropped(procs, impostor("leave"), 3, 30) == [victim] * 3
        (tmp_path / "stop").touch()
        finish(procs, tmp_path, 3)  # every rank, rank 2 too, ends with an exact sum
    finally:
        s.close()
        ctx.term()


@pytest.mark.timeout(90)
def test_a_rejoin_to_a_coordinator_that_never_restarted_changes_nothing(procs, tmp_path):
    env = base_env(COLLECTIVES_JOB_SECRET=SECRET, TEST_ROGUE="1")
    start_world(procs, tmp_path, 3, "rogue_rejoin", env)
    reports = finish(procs, tmp_path, 3)
    assert {r["generation"] for r in reports} == {0}, reports  # nothing to regroup for
    # the re-registration reached the coordinator and was refused for what it claimed (not
    # lost to a failed handshake, which would leave the job unchanged just as well)
    answer = reports[1]["rogue_answer"]
    assert answer is not None, "the coordinator never answered the rogue's re-registration"
    assert answer["t"] == "evicted", answer
    assert "forming generation 2147483648" in answer["reason"], answer


@pytest.mark.timeout(120)
def test_megabyte_beats_in_others_names_leave_the_coordinator_small(procs, tmp_path):
    env = base_env(COLLECTIVES_JOB_SECRET=SECRET, TEST_LOG_EVERY_DROP="1")
    port = start_world(procs, tmp_path, 2, "idle", env)
    victim = mids(tmp_path, 2)[1]
    pid = wait_json(tmp_path / "rank0.addr.json", 10)["pid"]
    # a beat as large as the coordinator takes (1 MiB): a million counts
    big = [0] * 1_000_000
    named = [victim if i % 2 else uuid.uuid4().hex for i in range(BEATS)]  # others' or nobody's
    beats = [
        msgpack.packb(
            {
                "t": "beat",
                "mid": mid,
                "report": {
                    "generation": 0,
                    "seq": -1,
                    "in_op": False,
                    "waiting_on": None,
                    "sent": big,
                    "recv": None,
                },
            }
        )
        for mid in named
    ]
    ctx = zmq.Context()
    s = insider(ctx, port)
    try:
        # Twice: the first round brings the coordinator's allocators to the size that serving
        # such messages takes (freed memory need not go back to the system); the second,
        # measured, must then cost nothing. Sent IN_FLIGHT at a time, each window waited out:
        # libzmq queues what arrives faster than it is served, so 40 sent at once would make
        # the peak (and what the allocator keeps of it) depend on how busy the machine is, not
        # on what the coordinator keeps. Every beat reaches the coordinator and is dropped: too
        # large to be valid (1,000,000 counts for a job of at most a few dozen ranks), before
        # the check of its name.
        dropped = 0
        for round_ in (1, 2):
            if round_ == 2:
                before = rss_kib(pid)
            for start in range(0, BEATS, IN_FLIGHT):
                window = beats[start : start + IN_FLIGHT]
                for raw in window:
                    s.send(raw)
                dropped += len(window)
                wait_dropped(procs, TOO_LARGE, dropped, 60)
        assert not re.findall(impostor("beat"), procs.err("rank0"))  # dropped for size alone
        grown = (rss_kib(pid) - before) / 1024
        print(f"rank 0 (coordinator): +{grown:.1f} MiB over the second {BEATS} beats of 1 MiB")
        # ... and beats in the same names of a size it takes: each passes the size check and is
        # dropped by the name check, which names the member it claimed to be
        template = msgpack.unpackb(beats[0])
        for mid in named[:SMALL]:
            small = {**template["report"], "sent": [0, 0]}
            s.send(msgpack.packb({**template, "mid": mid, "report": small}))
        assert wait_dropped(procs, impostor("beat"), SMALL, 30) == named[:SMALL]
        (tmp_path / "stop").touch()
        finish(procs, tmp_path, 2)
    finally:
        s.close()
        ctx.term()
    assert grown < KEPT_MIB, f"rank 0 (the coordinator's host) grew by {grown:.0f} MiB"


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
