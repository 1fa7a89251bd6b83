"""The small-op path (group/smallop.py): a 4-byte all_reduce over ZeroMQ transports with fast
links, where the calling thread reads the awaited peer's link itself (OpChannel.take_small),
keeps the op path's guarantees:

* it is the path these ops take (frames are taken by take_now or wait_peer, not by the
  general wait); with a spin before each sleep (receiving.py, _spin) the same holds;
* a rank that stops calling is blamed by name by every other rank: the stall diagnosis
  (membership/diagnose.py, blame) reads the sent/recv counts and send ages the path keeps;
* a peer whose process is gone (its transport closed) is found by failure detection
  (PeerWatch) and ends the wait as a PeerFailure naming it, not at the op's deadline;
* in a group that survives failures (a membership: every collective ends with a commit round,
  which the path runs itself right after the data), the round's messages take the path too,
  and a rank that stalls in the round, or dies before its token, is blamed or found the same.

Three transports in one process are enough (they publish the same pid, so their fast links
are confirmed). Nothing here is timed: the deadlines only bound waits that must fail.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import collectives as cl
from collectives.common.errors import CollectiveTimeout, PeerFailure
from collectives.group import smallop
from collectives.membership.diagnose import blame
from collectives.transport.channel import OpChannel
from collectives.transport.zmq.transport import ZmqTransport
from support.timing import scaled

pytestmark = pytest.mark.timeout(90)

WARM = 20  # ops before the one that fails: the plan is kept and the fast links confirmed


class Survivor:
    """A membership that is never asked anything here: it makes the group one that survives
    failures, whose collectives end with a commit round (algorithms/commit.py)."""

    def leave(self) -> None:
        pass

    def close_link(self) -> None:
        pass

    def reconstruct(self, pg, timeout, *, exclude=()):
        raise AssertionError("not asked in these tests")


class World:
    """n ZmqTransports (ipc, fast links) in this process, each under a ProcessGroup; a stall
    is judged on every rank's progress, as the coordinator does."""

    def __init__(
        self,
        n: int,
        timeout: float,
        commits: bool = False,
        crowded: bool = False,
        spin: float | None = None,
        yields: bool = False,
    ):
        self.ts: list[ZmqTransport] = []
        self.ts = [ZmqTransport(r, n, transport="ipc", keys=None) for r in range(n)]
        infos = [t.address_info() for t in self.ts]
        for t in self.ts:
            t.connect(infos)
        self.pgs = [
            cl.ProcessGroup(
                t, timeout=timeout, membership=Survivor() if commits else None, judge=self
            )
            for t in self.ts
        ]
        for pg in self.pgs:
            # crowded: small all_reduces run naive and the commit round is the star
            pg._crowded = crowded
            if spin is not None:  # a small receive spins this long before it sleeps
                pg._spin = spin
                pg._spin_yields = yields  # giving its CPU away between reads
        self.verdicts: list[list[int]] = []
        self.taken_fast = [0] * n
        for t in self.ts:
            t.take_now = self._counting(t, t.take_now)  # type: ignore[method-assign]
            t.wait_peer = self._counting(t, t.wait_peer)  # type: ignore[method-assign]

    def _counting(self, t: ZmqTransport, take):
        """take (take_now or wait_peer), counting the frames it takes in taken_fast."""

        def counted(peer: int, *args):
            got = take(peer, *args)
            if got is not None:
                self.taken_fast[t.rank] += 1
            return got

        return counted

    def spin_next(self) -> None:
        """The next small wait of every rank spins first (none is skipped after an empty
        spin: receiving.py, _spin)."""
        for t in self.ts:
            t.receiver._spin_skip = 0

    def diagnose(self, seq, waiting_on, *, progress=None, prober=None, timeout=None):
        states = {r: None if t.closed else t.progress() for r, t in enumerate(self.ts)}
        culprits, why = blame(seq, states, len(self.ts))
        self.verdicts.append(culprits)
        return culprits, why, False

    def close(self) -> None:
        for pg in self.pgs:
            pg.close()


@pytest.fixture
def world():
    made: list[World] = []

    def build(
        n: int,
        timeout: float,
        commits: bool = False,
        crowded: bool = False,
        spin: float | None = None,
        yields: bool = False,
    ) -> World:
        w = World(n, timeout, commits, crowded, spin, yields)
        made.append(w)
        return w

    yield build
    for w in made:
        w.close()


def _run(pgs, fn):
    """fn(rank, pg) on a thread per group; {rank: what it returned or raised}."""
    out: dict[int, object] = {}

    def one(pg):
        try:
            out[pg.rank] = fn(pg.rank, pg)
        except BaseException as exc:  # noqa: BLE001 -- the test reads it
            out[pg.rank] = exc

    threads = [threading.Thread(target=one, args=(pg,), daemon=True) for pg in pgs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(scaled(60))
    assert not any(t.is_alive() for t in threads), "an op never ended"
    return out


def _warm(w: World) -> None:
    """WARM exact 4-byte sums on every rank, most of them taken on the small-op path."""

    def ops(rank, pg):
        sums = []
        for i in range(WARM):
            buf = np.array([rank + 0.25 * i], np.float32)
            pg.all_reduce(buf)
            sums.append(float(buf[0]))
        return sums

    n = len(w.pgs)
    want = [float(sum(range(n)) + n * 0.25 * i) for i in range(WARM)]
    assert _run(w.pgs, ops) == {r: want for r in range(n)}
    # (not on every rank: one that always waits, as naive's ranks wait on rank 0, or any
    # rank on a busy machine, takes its frames in the general wait)
    assert any(w.taken_fast), f"no frame was taken on the small-op path: {w.taken_fast}"


# a small receive's spin before it sleeps (receiving.py, _spin): off, and long enough that
# most frames are taken by it, the waits for what never comes included (2 ranks: their fast
# links are confirmed within the warm ops, so the wait that fails reads one), keeping its CPU
# or giving it away between reads (yields: a host with fewer CPUs than ranks)
SPINS = pytest.mark.parametrize(
    "n, spin, yields",
    [(3, 0.0, False), (2, 1e-3, False), (2, 1e-3, True)],
    ids=["sleeps", "spins", "yields"],
)


@SPINS
def test_a_rank_that_stops_calling_is_blamed_by_every_other(world, monkeypatch, n, spin, yields):
    yielded: list[int] = []
    real_yield = os.sched_yield
    monkeypatch.setattr(os, "sched_yield", lambda: yielded.append(1) or real_yield())
    w = world(n, timeout=scaled(2.0), spin=spin, yields=yields)
    _warm(w)
    w.spin_next()
    yielded.clear()
    last = n - 1
    got = _run(w.pgs[:last], lambda r, pg: pg.all_reduce(np.ones(1, np.float32)))  # it idles
    for r in range(last):
        exc = got[r]
        assert isinstance(exc, CollectiveTimeout), exc
        assert exc.peer == last and f"rank {last}" in str(exc), exc
    assert w.verdicts and all(v == [last] for v in w.verdicts), w.verdicts
    assert bool(yielded) == yields, "the waits did not read the link as asked"


# (a yielding wait ends as a spin does when the link closes: test_fastlink.py)
@pytest.mark.parametrize("spin", [0.0, 1e-3], ids=["sleeps", "spins"])
def test_a_dead_peer_ends_the_wait_as_a_peer_failure(world, spin):
    w = world(2, timeout=scaled(30.0), spin=spin)
    _warm(w)
    w.spin_next()
    w.ts[0].watch_peers(grace=scaled(0.5))  # failure detection: a connection down too long
    w.ts[1].close(linger=0)  # rank 1's process is gone: its sockets and links close
    got = _run(w.pgs[:1], lambda r, pg: pg.all_reduce(np.ones(1, np.float32)))
    exc = got[0]
    assert isinstance(exc, PeerFailure), exc
    assert 1 in exc.failed_ranks, exc


def _op_that_may_fail(pg) -> None:
    """The stalled rank's op: it fails or not once the others gave up; theirs is tested."""
    try:
        pg.all_reduce(np.ones(1, np.float32))
    except Exception:  # noqa: BLE001
        pass


class CommitStall:
    """Makes one rank hold its result and then stop, before the first message of its commit
    round (the small-op path runs it right after the data), until released."""

    def __init__(self) -> None:
        self.who: ZmqTransport | None = None
        self.reached = threading.Event()  # the rank stopped there
        self.go = threading.Event()
        self.rounds = 0  # commit rounds the small-op path ran

    def hold(self, original, ch: OpChannel) -> None:
        original(ch)
        if ch.t is self.who and ch.seq >= WARM:
            self.reached.set()
            self.go.wait(scaled(60))


@pytest.fixture
def commit_stall(monkeypatch):
    stall = CommitStall()
    original = OpChannel.hold_result
    monkeypatch.setattr(OpChannel, "hold_result", lambda ch: stall.hold(original, ch))
    # the small-op path's own commit round, counted: it is the one these ops run
    commit_round = smallop._commit_round

    def counted(ch: OpChannel) -> None:
        stall.rounds += 1
        commit_round(ch)

    monkeypatch.setattr(smallop, "_commit_round", counted)
    yield stall
    stall.go.set()


@pytest.mark.parametrize(
    "n, crowded, waiting_on_it",
    [(3, False, (0, 1)), (2, True, (0,)), (3, True, (0,))],
    ids=["direct", "direct-star", "naive-star"],
)
def test_a_rank_that_stalls_in_the_commit_round_is_blamed_by_those_waiting_on_it(
    world, commit_stall, n, crowded, waiting_on_it
):
    """The last rank holds its result and stops before its commit message. Those waiting on
    it for that message blame it; in the star (crowded) only rank 0 does: rank 1 waits on rank
    0 there, and the diagnosis may blame the link 0->1 for that, as it does on the general
    path (naive.all_reduce, commit.commit) too."""
    w = world(n, timeout=scaled(2.0), commits=True, crowded=crowded)
    _warm(w)
    assert commit_stall.rounds == n * WARM  # every op's, on every rank
    last = n - 1
    commit_stall.who = w.ts[last]
    stalled = threading.Thread(target=_op_that_may_fail, args=(w.pgs[last],), daemon=True)
    stalled.start()
    got = _run(w.pgs[:last], lambda r, pg: pg.all_reduce(np.ones(1, np.float32)))
    commit_stall.go.set()
    stalled.join(scaled(30))
    for r in range(last):
        exc = got[r]
        assert isinstance(exc, CollectiveTimeout), exc
        assert "commit" in str(exc), exc  # it waited in the commit round
        if r in waiting_on_it:
            assert exc.peer == last and f"rank {last}" in str(exc), exc
    assert w.verdicts and [last] in w.verdicts, w.verdicts
    if not crowded:
        assert all(v == [last] for v in w.verdicts), w.verdicts


def test_a_peer_dead_before_its_commit_message_ends_the_wait_as_a_peer_failure(world, commit_stall):
    w = world(2, timeout=scaled(30.0), commits=True)
    _warm(w)
    w.ts[0].watch_peers(grace=scaled(0.5))
    commit_stall.who = w.ts[1]

    def dies_in_commit_round() -> None:
        """Rank 1 holds its result, then its process is gone before its commit message."""
        closer = threading.Thread(
            target=lambda: commit_stall.reached.wait(scaled(60)) and w.ts[1].close(linger=0),
            daemon=True,
        )
        closer.start()
        _op_that_may_fail(w.pgs[1])  # its sockets close under it, as in a death

    dying = threading.Thread(target=dies_in_commit_round, daemon=True)
    dying.start()
    got = _run(w.pgs[:1], lambda r, pg: pg.all_reduce(np.ones(1, np.float32)))
    commit_stall.go.set()
    dying.join(scaled(30))
    exc = got[0]
    assert commit_stall.reached.is_set()
    assert isinstance(exc, PeerFailure), exc
    assert 1 in exc.failed_ranks, exc
    assert w.ts[0].progress().has_data  # it failed in the commit round, holding its result
