"""Fast links (transport/zmq/fastlink.py): small same-host messages bypass ZeroMQ, only from the
rank that published the connecting pid, and never out of order against ZeroMQ's messages.

Two ZmqTransports in one process are enough for the link itself (both publish this pid);
real processes over fast links are every process test on one host (test_zmq_processes.py
conformance, the fault tests), where the links are on by default.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import numpy as np
import pytest

from collectives.common.errors import PeerFailure
from collectives.transport.zmq.fastlink import FastLinks
from collectives.transport.zmq.receiving import SPIN_SKIP, SPIN_SKIP_MAX
from collectives.transport.base import OpContext
from collectives.transport.zmq.transport import ZmqTransport
from support.timing import bound, scaled

pytestmark = pytest.mark.timeout(60)


def pair(mode="ipc"):
    ts = [ZmqTransport(r, 2, transport=mode, keys=None) for r in range(2)]
    infos = [t.address_info() for t in ts]
    for t in ts:
        t.connect(infos)
    return ts


def take(t, n, timeout=10.0):
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, got
        frame = t.wait_any(0.05)
        if frame is not None:
            got.append((frame[1], bytes(frame[2])))
    return got


def test_a_connection_from_another_pid_is_refused_and_the_rank_is_confirmed(caplog):
    links = FastLinks(0)
    try:
        links.pids = {1: 2**22 + 12345}  # rank 1 published a pid that is not ours
        strangers = []
        with caplog.at_level(logging.WARNING, logger="collectives"):
            for _ in range(40):  # a stranger that keeps connecting
                stranger = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                stranger.connect("\0" + links.name)
                stranger.settimeout(5)
                strangers.append(stranger)
                links.accept()
        for stranger in strangers:
            assert stranger.recv(1) == b"", "a connection from an unknown pid must be closed"
            stranger.close()
        assert not links.inbound and not links.waiting
        refusals = [r for r in caplog.records if "refused a fast link" in r.getMessage()]
        assert len(refusals) <= 5, len(refusals)  # throttled: not one line per connection
        links.pids = {1: __import__("os").getpid()}
        rank1 = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rank1.connect("\0" + links.name)
        rank1.settimeout(5)
        links.accept()
        assert rank1.recv(1) == b"\x01" and list(links.waiting) == [1]
        rank1.close()
    finally:
        links.close()


def test_messages_keep_their_order_across_zeromq_and_the_fast_link():
    a, b = pair()
    try:
        big = np.arange(1 << 15, dtype=np.float32)  # 128 KiB: zero-copy, over ZeroMQ
        a.begin_op(OpContext(0, 0))
        a.post(1, b"h0", b"s0", False)  # the link is not confirmed yet: ZeroMQ
        take(b, 1)  # b accepts the link meanwhile
        a.post(1, b"h0b", b"s0", False)  # op 0 went over ZeroMQ: so does the rest of it
        a.begin_op(OpContext(0, 1))
        tracker = a.post(1, b"h1", b"s1", False)  # confirmed now: FAST_ON, then fast
        assert tracker is None and 1 in a.fast.ready, "the link was not confirmed"
        a.post(1, b"h2", big, True)  # ZeroMQ (two frames) ...
        a.post(1, b"h3", b"s3", False)  # ... so the rest of this op too
        a.begin_op(OpContext(0, 2))
        a.post(1, b"h4", b"s4", False)  # a new op: fast again
        assert take(b, 1)[0][0] == b"h0b", "the first fast message overtook ZeroMQ's"
        got = dict(take(b, 4))
        assert got[b"h2"] == big.tobytes() and got[b"h1"] == b"s1"
        # h4 (op 2) may overtake op 1's ZeroMQ messages (the early stash orders ops); within
        # op 1, h1 < h2 < h3 always.
        order = [h for h in got if h != b"h4"]
        assert order == [b"h1", b"h2", b"h3"] and len(got) == 4, list(got)
    finally:
        for t in (a, b):
            t.close(0)


def test_fast_links_off_and_over_tcp(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_FAST_LINKS", "0")
    t = ZmqTransport(0, 2, transport="ipc", keys=None)
    assert t.fast is None and t.address_info().fast is None
    t.close(0)
    monkeypatch.delenv("COLLECTIVES_FAST_LINKS")
    t = ZmqTransport(0, 2, transport="tcp", keys=None)
    assert t.fast is None
    t.close(0)


def test_a_full_link_never_blocks_the_sender_and_order_holds():
    """A rank that sends a peer more than a socket buffer before that peer reads (isend
    loops on both sides) must not wait on it: the rest of the op takes ZeroMQ, in order."""
    a, b = pair()
    try:
        a.begin_op(OpContext(0, 0))
        a.post(1, b"warm", b"", False)
        take(b, 1)  # b accepts a's link
        a.begin_op(OpContext(1, 7))
        payload = np.ones(4096, np.float32)  # 16 KiB: a small message
        # what the fast link answered each send (False: full, the message goes over ZeroMQ)
        answers: list[bool] = []
        fast_send = a.fast.send

        def send(peer, s, msg):
            answers.append(fast_send(peer, s, msg))
            return answers[-1]

        a.fast.send = send
        t0 = time.monotonic()
        for i in range(64):  # 1 MiB: far past the link's buffer
            a.post(1, b"m%02d" % i, payload, False)
        assert time.monotonic() - t0 < scaled(5)  # never waited on the peer
        assert 1 in a.fast.ready and False in answers, f"the link never filled up: {answers}"
        # once full, the rest of the op went over ZeroMQ: the link was not tried again
        assert answers[-1] is False and answers.count(False) == 1, answers
        got = [h for h, _ in take(b, 64)]
        assert got == [b"m%02d" % i for i in range(64)], got
    finally:
        for t in (a, b):
            t.close(0)


LONG_WAIT = 20.0  # s: a wait_peer that is not ended early lasts this long (the test fails)


def _confirm_link(a, b):
    """Rank 0's (a's) fast link to rank 1 (b) confirmed, and b reading it: two frames, the
    first over ZeroMQ, the second announced over ZeroMQ (FAST_ON) and sent fast."""
    a.begin_op(OpContext(0, 0))
    a.post(1, b"h0", b"s0", False)  # over ZeroMQ until the link is confirmed
    take(b, 1)
    a.begin_op(OpContext(0, 1))
    a.post(1, b"h1", b"s1", False)  # FAST_ON over ZeroMQ, then fast
    assert take(b, 1) == [(b"h1", b"s1")] and 0 in b.fast.by_peer


def _later(fn, delay=0.1):
    """fn() on another thread after `delay` s, while the caller waits."""
    timer = threading.Timer(delay, fn)
    timer.start()
    return timer


def _link_closes_while_it_reads(a, b, yields):
    """The peer's process goes (a closes: its link closes) while b's wait reads the link,
    spinning for longer than the test may last: the wait ends at once, with nothing."""
    b.receiver._spin_skip = 0  # the next wait reads first
    timer = _later(lambda: a.close(0))
    t0 = time.monotonic()
    assert b.wait_peer(0, LONG_WAIT, spin=LONG_WAIT, yields=yields) is None
    assert time.monotonic() - t0 < bound(2.0, below=LONG_WAIT), "read past the link's end"
    timer.join()
    assert 0 not in b.fast.by_peer


def test_a_wait_on_one_peers_link_takes_its_frame_and_ends_for_anything_else():
    """Transport.wait_peer (a small receive's wait, channel.py take_small): it takes the
    awaited peer's fast frame when it comes, and ends at once, with nothing, for whatever
    only the general wait takes -- a failure's wake-up (interrupt) or a frame over ZeroMQ
    -- never sleeping out its timeout past them."""
    a, b = pair()
    try:
        _confirm_link(a, b)
        assert b.wait_peer(0, 0.001) is None  # nothing there: the time is up

        timer = _later(lambda: a.post(1, b"h2", b"s2", False))
        got = b.wait_peer(0, LONG_WAIT)
        timer.join()
        assert got is not None and (got[0], got[1], bytes(got[2])) == (0, b"h2", b"s2")

        failure = PeerFailure("rank 0 failed", rank=1, failed_ranks=[0])
        timer = _later(lambda: b.interrupt(failure))
        t0 = time.monotonic()
        assert b.wait_peer(0, LONG_WAIT) is None
        assert time.monotonic() - t0 < bound(2.0, below=LONG_WAIT), "slept past a wake-up"
        timer.join()
        b.failure = None  # (the wake-up frame stays for the general wait, which drops it)
        assert b.wait_any(0.05) is None

        big = np.arange(1 << 15, dtype=np.float32)  # zero-copy: two frames, over ZeroMQ
        timer = _later(lambda: a.post(1, b"h3", big, True))
        t0 = time.monotonic()
        assert b.wait_peer(0, LONG_WAIT) is None
        assert time.monotonic() - t0 < bound(2.0, below=LONG_WAIT), "slept past a frame"
        timer.join()
        [(header, payload)] = take(b, 1)  # the general wait has it
        assert header == b"h3" and payload == big.tobytes()
    finally:
        for t in (a, b):
            t.close(0)


def test_a_yielding_wait_gives_its_cpu_away_between_reads_and_ends_within_its_timeout(
    monkeypatch,
):
    """wait_peer's spin where the host has fewer CPUs than ranks (yields: receiving.py,
    _spin): between its reads it gives the CPU away (os.sched_yield), so that the peer it
    waits for may run; a frame that comes meanwhile is taken there, with no poll. A spin
    that keeps its CPU never yields. Asked to spin longer than the wait may last, the wait
    still ends when its timeout is up, and at once when the link closes."""
    yielded = []
    real_yield = os.sched_yield
    monkeypatch.setattr(os, "sched_yield", lambda: yielded.append(1) or real_yield())
    a, b = pair()
    try:
        _confirm_link(a, b)
        rx = b.receiver

        timer = _later(lambda: a.post(1, b"h2", b"s2", False))
        got = b.wait_peer(0, LONG_WAIT, spin=LONG_WAIT, yields=True)
        timer.join()
        assert got is not None and (got[1], bytes(got[2])) == (b"h2", b"s2")
        assert rx._peer_poll is None, "it slept in a poll: the spin did not take the frame"
        assert yielded, "it read the link without giving the CPU away"

        yielded.clear()
        timer = _later(lambda: a.post(1, b"h3", b"s3", False))
        got = b.wait_peer(0, LONG_WAIT, spin=LONG_WAIT)  # keeps its CPU
        timer.join()
        assert got is not None and (got[1], bytes(got[2])) == (b"h3", b"s3")
        assert not yielded, "a spin that keeps its CPU yielded it"

        t0 = time.monotonic()
        assert b.wait_peer(0, scaled(0.2), spin=LONG_WAIT, yields=True) is None
        assert time.monotonic() - t0 < bound(2.0, below=LONG_WAIT), "spun past its timeout"
        assert yielded

        _link_closes_while_it_reads(a, b, yields=True)
    finally:
        for t in (a, b):
            t.close(0)


def test_a_spinning_wait_takes_a_frame_that_comes_meanwhile_and_backs_off_when_none_does():
    """wait_peer's spin (receiving.py, _spin): a frame that comes while the wait reads the
    link is taken there, with no poll; a spin that finds nothing makes the next SPIN_SKIP
    waits sleep at once, twice as many after each further empty spin, and a spin that finds
    its frame starts over; a link that closes (the peer's process gone) ends a spin at once.
    Nothing is timed: a spin that did not end as it should would last LONG_WAIT."""
    a, b = pair()
    try:
        _confirm_link(a, b)
        rx = b.receiver

        timer = _later(lambda: a.post(1, b"h2", b"s2", False))
        got = b.wait_peer(0, LONG_WAIT, spin=LONG_WAIT)
        timer.join()
        assert got is not None and (got[0], got[1], bytes(got[2])) == (0, b"h2", b"s2")
        assert rx._peer_poll is None, "it slept in a poll: the spin did not take the frame"

        assert b.wait_peer(0, 0.001, spin=0.001) is None  # nothing comes: the spin gives up
        skips = SPIN_SKIP
        while skips < SPIN_SKIP_MAX:
            assert rx._spin_skip == skips
            for _ in range(skips):  # they sleep at once: none spins LONG_WAIT
                assert b.wait_peer(0, 0.001, spin=LONG_WAIT) is None
            assert b.wait_peer(0, 0.001, spin=0.001) is None  # spins, finds nothing
            skips *= 2
        assert rx._spin_skip == SPIN_SKIP_MAX

        rx._spin_skip = 0  # (the next wait spins) a frame already there: taken at once
        a.post(1, b"h3", b"s3", False)
        got = b.wait_peer(0, LONG_WAIT, spin=LONG_WAIT)
        assert got is not None and (got[1], bytes(got[2])) == (b"h3", b"s3")
        assert b.wait_peer(0, 0.001, spin=0.001) is None
        assert rx._spin_skip == SPIN_SKIP, "a spin that found its frame did not start over"

        _link_closes_while_it_reads(a, b, yields=False)
    finally:
        for t in (a, b):
            t.close(0)
