"""Shared-memory payloads (transport/zmq/shm.py): slots go out, come back, and never hold a wait.

Two ZmqTransports in one process (one thread per rank) are enough here: an arena is mapped
through /proc/<pid>/fd/<fd> whether the peer is another process or this one. Real processes
over shm are covered by test_zmq_processes.py (conformance) and by every fault and trainer
test, which use the default transport ("auto", which is shm on one host).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

import numpy as np
import pytest
from msgspec.structs import replace

import collectives as cl
from collectives.transport.zmq import shm
from collectives.transport.zmq.transport import ZmqTransport

pytestmark = pytest.mark.timeout(60)


def make_pair(mode="shm", segment_bytes=None, n=2):
    ts = [ZmqTransport(r, n, transport=mode, segment_bytes=segment_bytes) for r in range(n)]
    infos = [t.address_info() for t in ts]
    for t in ts:
        t.connect(infos)
    if mode == "shm":
        # Each rank's "I mapped your arena" note travels like any message; take them in now,
        # so that the counts below do not depend on when the first one arrives.
        deadline = time.monotonic() + 10
        while any(t.sender.shm_ready != set(range(n)) - {t.rank} for t in ts):
            assert time.monotonic() < deadline, [t.sender.shm_ready for t in ts]
            for t in ts:
                t.receiver.read_ahead()
            time.sleep(0.001)
    return ts


def run_ranks(groups, body, join_s=30):
    """Run body(rank, group) on one thread per rank; return the results. Fails if any rank
    raised (naming it) or is still running after join_s."""
    out, errors = [None] * len(groups), []

    def run(r):
        try:
            out[r] = body(r, groups[r])
        except BaseException as exc:  # surfaced below, with the rank
            errors.append((r, exc))

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(len(groups))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(join_s)
    assert not any(th.is_alive() for th in threads), "a rank is still running"
    assert not errors, errors
    return out


def assert_every_slot_free(groups):
    """Every payload sent was read (or dropped) and handed its slot back."""
    for g in groups:
        arena = g.transport.sender.arena
        assert arena.in_use(0, shm.FLAGS_BYTES) == 0, (g.rank, arena.flags)


@pytest.fixture
def groups(request):
    made = []

    def make(**kw):
        gs = [cl.ProcessGroup(t, timeout=10.0) for t in make_pair(**kw)]
        made.extend(gs)
        return gs

    yield make
    for g in made:
        g.destroy()


def test_arena_slots_go_out_and_come_back():
    """A payload put in a slot is read back byte for byte through the peer's mapping; the slot
    is busy until the reader frees it; a payload larger than a slot, or a full arena, gives
    None (the caller then uses the socket)."""
    arena = shm.SendArena(slot_bytes=4096, slots=2)
    peer = shm.PeerArena(arena.describe())
    try:
        data = np.arange(1000, dtype=np.int32)
        assert arena.put(data, 1) is None  # no return page attached: the socket
        arena.attach(1, peer.returns.describe())
        assert arena.in_use() == 0
        slot, nbytes = arena.put(data, 1)
        assert nbytes == data.nbytes and arena.flags[slot] == shm.BUSY
        assert arena.in_use() == 1  # what bench/stress/soak.py samples
        view = peer.view(slot, nbytes)
        assert np.array_equal(np.frombuffer(view, np.int32), data)
        assert arena.put(np.zeros(4097, np.uint8), 1) is None  # larger than a slot
        other = arena.put(np.ones(10, np.uint8), 1)
        assert other is not None and other[0] != slot
        assert arena.put(np.ones(10, np.uint8), 1) is None  # both slots in flight
        assert arena.in_use() == 2
        shm.free_slot(view)
        assert arena.in_use() == 1 and arena.flags[slot] == shm.FREE
        shm.free_slot(view)  # a second free is a no-op
        assert arena.put(np.ones(10, np.uint8), 1)[0] == slot
        assert peer.view(2, 10) is None and peer.view(0, 4097) is None  # not one of ours
    finally:
        peer.close()
        arena.close()


def test_large_payloads_travel_in_shared_memory_and_every_slot_returns(groups):
    """rank r contributes r+1 everywhere; the sum is 3. Every segment of a 16 MiB ring
    all_reduce goes through an arena, and when the op is over every slot is free again."""
    gs = groups(mode="shm")
    assert [g.transport.kinds for g in gs] == [{1: "shm"}, {0: "shm"}]
    n = 4 << 20

    def body(r, g):
        x = np.full(n, r + 1.0, np.float32)
        g.all_reduce(x, algorithm="ring")
        return x

    out = run_ranks(gs, body)
    assert all((x == 3.0).all() for x in out)
    assert all(
        g.transport.sender.shm_sent >= 4 and g.transport.sender.shm_fallbacks == 0 for g in gs
    )
    assert_every_slot_free(gs)


def test_full_arena_falls_back_to_the_socket_and_stays_correct(monkeypatch, groups):
    """With two 64 KiB slots and 16 segments sent before the first receive, most segments find
    no free slot: they take the socket instead, in order, and the result is still exact."""
    monkeypatch.setenv("COLLECTIVES_SHM_BYTES", str(2 * 65536))
    gs = groups(mode="shm", segment_bytes=65536)
    n = 1 << 19  # 2 MiB of float32: 1 MiB chunks, 16 segments

    def body(r, g):
        x = np.arange(n, dtype=np.float32) * (r + 1)
        g.all_reduce(x, algorithm="ring")
        return x

    out = run_ranks(gs, body)
    want = np.arange(n, dtype=np.float32) * 3
    assert all(np.array_equal(x, want) for x in out)
    assert all(g.transport.sender.shm_sent > 0 and g.transport.sender.shm_fallbacks > 0 for g in gs)
    assert_every_slot_free(gs)


def test_slots_of_an_aborted_op_come_back(groups):
    """Ranks that call different things raise CollectiveMismatch; the payloads they had sent
    each other are dropped, and their slots are handed back, not lost: after one more op
    every slot is free."""
    gs = groups(mode="shm")

    def body(r, g):
        x = np.ones(1 << 18, np.float32 if r == 0 else np.int32)  # same bytes, other dtype
        with pytest.raises(cl.CollectiveMismatch):
            g.all_reduce(x, algorithm="ring")
        y = np.full(1 << 18, r + 1.0)
        g.all_reduce(y, algorithm="ring")
        return y

    out = run_ranks(gs, body)
    assert all((y == 3.0).all() for y in out)
    assert all(g.transport.sender.shm_sent > 0 for g in gs)
    assert_every_slot_free(gs)


def test_shm_bytes_zero_means_sockets(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_SHM_BYTES", "0")
    ts = make_pair(mode="auto")
    try:
        assert [t.kinds for t in ts] == [{1: "ipc"}, {0: "ipc"}]
    finally:
        for t in ts:
            t.close(linger=0)
    with pytest.raises(ValueError, match="COLLECTIVES_SHM_BYTES=0"):
        ZmqTransport(0, 2, transport="shm")
    monkeypatch.setenv("COLLECTIVES_SHM_BYTES", "lots")
    with pytest.raises(ValueError, match="COLLECTIVES_SHM_BYTES must be a number"):
        ZmqTransport(0, 2, transport="auto")


def test_an_arena_that_cannot_be_mapped_costs_speed_not_messages(caplog):
    """Rank 0 cannot map rank 1's arena (its announced fd is an ordinary file here; elsewhere
    another user or a locked-down /proc). With transport "shm" that is an error naming both
    ranks. With "auto" rank 0 says so in the log and never tells rank 1 it may send slots, so
    rank 1's payloads take the socket while rank 0's still go through shared memory, and the
    sums are exact."""
    ts = [ZmqTransport(r, 2, transport="shm") for r in range(2)]
    try:
        infos = [t.address_info() for t in ts]
        with tempfile.TemporaryFile() as f:
            infos[1] = replace(infos[1], shm=replace(infos[1].shm, fd=f.fileno()))
            with pytest.raises(
                ConnectionError,
                match=r"rank 0 cannot map rank 1's shared "
                r"memory.*COLLECTIVES_TRANSPORT=auto",
            ):
                ts[0].connect(infos)
    finally:
        for t in ts:
            t.close(linger=0)

    ts = [ZmqTransport(r, 2, transport="auto") for r in range(2)]
    infos = [t.address_info() for t in ts]
    with tempfile.TemporaryFile() as f:
        forged = [infos[0], replace(infos[1], shm=replace(infos[1].shm, fd=f.fileno()))]
        ts[0].connect(forged)
        ts[1].connect(infos)
    assert "rank 0 cannot map rank 1's shared memory" in caplog.text
    gs = [cl.ProcessGroup(t, timeout=10.0) for t in ts]
    try:

        def body(r, g):
            x = np.arange(1 << 20, dtype=np.float32) * (r + 1)
            for _ in range(2):
                g.all_reduce(x, algorithm="ring")
            return x

        out = run_ranks(gs, body)
        want = np.arange(1 << 20, dtype=np.float32) * 6  # (1 + 2), then twice that
        assert all(np.array_equal(x, want) for x in out)
        assert ts[0].sender.shm_sent > 0 and ts[1].sender.shm_sent == 0
        assert ts[0].sender.shm_ready == {1} and ts[1].sender.shm_ready == set()
    finally:
        for g in gs:
            g.destroy()


def test_shm_mode_refuses_a_peer_on_another_host():
    ts = [ZmqTransport(r, 2, transport="shm") for r in range(2)]
    try:
        infos = [t.address_info() for t in ts]
        infos[1] = replace(infos[1], shm_host="elsewhere:1:2:3")
        with pytest.raises(ConnectionError, match="rank 1 is not on this host"):
            ts[0].connect(infos)
        infos[1] = replace(infos[1], host="elsewhere:1")  # auto: tcp to it, no error
        auto = ZmqTransport(0, 2, transport="auto")
        try:
            auto.connect(infos)
            assert auto.kinds == {1: "tcp"}
        finally:
            auto.close(linger=0)
    finally:
        for t in ts:
            t.close(linger=0)


def test_arena_memory_has_no_name_to_leak():
    """The arena is an anonymous memfd: nothing appears under /dev/shm or the temp dir, so a
    rank killed with SIGKILL leaves nothing behind (the kernel frees the pages)."""

    def ours():  # other tests (under pytest-xdist) and torch may use /dev/shm meanwhile
        names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
        return {n for n in names if "collectives" in n}

    before = ours()
    arena = shm.SendArena(4096, 2)
    try:
        assert ours() == before
        assert os.readlink(f"/proc/self/fd/{arena.fd}").startswith("/memfd:collectives-arena")
    finally:
        arena.close()


def _arena_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("memfd:collectives-arena" in line for line in f)


def test_a_closed_transport_unmaps_its_arena_while_the_object_lives():
    """close() unmaps this rank's arena and the peers' it mapped, even while the transport
    object is still referenced (a retired group keeps its transport): bench.stress.soak found each
    generation's arena left mapped, with an fd, because the registered-buffer lender held a
    view of its flag page (mmap cannot close under a live view)."""
    before = _arena_mappings()
    ts = [ZmqTransport(r, 2, transport="shm") for r in range(2)]
    try:
        infos = [t.address_info() for t in ts]
        for t in ts:
            t.connect(infos)
        assert _arena_mappings() > before
    finally:
        for t in ts:
            t.close(linger=0)
    assert _arena_mappings() == before, "a closed transport left an arena mapped"
    assert ts  # the objects live on


def test_a_small_open_files_limit_keeps_same_host_peers_off_ipc(monkeypatch, caplog):
    """libzmq's ipc listener aborts the process when accept() finds no free descriptor; where
    the limit is small enough for idle connections from anyone to fill it, "auto" uses tcp
    (and says why). An explicit "ipc" or "shm" raises the soft limit to the hard one and is
    honoured where that is enough, and refused with an error that names the limit and the way
    out where it is not, before anything listens; a large limit keeps ipc and shared memory."""
    from collectives.common import config
    from collectives.transport.zmq import transport as zt

    monkeypatch.setattr(config, "open_files_limit", lambda: zt.IPC_MIN_OPEN_FILES - 1)
    monkeypatch.setattr(config, "raise_open_files", lambda: None)  # the hard limit is as low
    with caplog.at_level("INFO", logger="collectives"):
        ts = make_pair("auto")
    try:
        assert [t.mode for t in ts] == ["tcp", "tcp"] and all(t.ipc_path is None for t in ts)
        assert set(ts[0].kinds.values()) == {"tcp"}, ts[0].kinds
        assert "libzmq's ipc listener aborts" in caplog.text
    finally:
        for t in ts:
            t.close(linger=0)
    for mode in ("ipc", "shm"):
        with pytest.raises(
            ValueError,
            match=rf"rank 0: transport '{mode}' needs an open-files "
            rf"limit of at least {zt.IPC_MIN_OPEN_FILES}.*ulimit -n",
        ):
            zt.ZmqTransport(0, 2, transport=mode)
    # a soft limit below it, a hard one above: raised, and the explicit choice honoured
    raised = []
    monkeypatch.setattr(
        config, "open_files_limit", lambda: 1 << 20 if raised else zt.IPC_MIN_OPEN_FILES - 1
    )
    monkeypatch.setattr(config, "raise_open_files", lambda: raised.append(True))
    explicit = make_pair("shm")
    try:
        assert [t.mode for t in explicit] == ["shm", "shm"] and raised
    finally:
        for t in explicit:
            t.close(linger=0)
    monkeypatch.setattr(config, "open_files_limit", lambda: zt.IPC_MIN_OPEN_FILES)
    roomy = make_pair("auto")
    try:
        assert [t.mode for t in roomy] == ["auto", "auto"] and roomy[0].ipc_path
        assert set(roomy[0].kinds.values()) == {"shm"}, roomy[0].kinds
    finally:
        for t in roomy:
            t.close(linger=0)
