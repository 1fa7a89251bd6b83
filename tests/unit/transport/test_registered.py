"""Registered buffers (transport/zmq/registered.py), in-process: what a lend frame may name,
and how many peer pools a receiver keeps mapped. Across real ranks: test_registered_processes.py.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from collectives.transport.zmq import registered, shm

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]


@pytest.mark.fast
def test_a_lend_frame_names_only_what_lies_inside_the_pool():
    """A lend's flag is busy until its reader frees it; the reader maps a pool only if the
    memfd the frame names is the one announced (name, size, seals), the region lies inside
    it and the flag is one of the lend flags of the owner's flag page; anything else is no
    view at all. A pool is freed with its array."""
    x = registered.allocate(4096, np.uint8)
    x[:] = 7
    arena = shm.SendArena(4096, 2)
    peer = shm.PeerArena(arena.describe())
    arena.attach(1, peer.returns.describe())
    lender, b = registered.Lender(arena), registered.Borrower()
    try:
        tail, tracker = lender.lend(x[100:300], 1)
        v = b.view(peer, tail)
        assert v is not None and v.nbytes == 200 and (v == 7).all()
        assert not v.flags.writeable  # mapped read-only
        assert not tracker.done and lender.outstanding() == 1
        shm.free_slot(v)
        assert tracker.done and lender.outstanding() == 0
        assert lender.lend(np.zeros(4096, np.uint8), 1) is None  # not registered memory
        fd, size, offset, nbytes, index, name = registered._LEND.unpack(tail)
        pack = registered._LEND.pack
        for bad in (
            pack(fd, size, 4000, 200, index, name),  # past the end
            pack(fd, size + 4096, 0, 8, index, name),  # size misstated
            pack(fd, size, 0, 8, index, b"0" * 32),  # another memfd's name
            pack(0, size, 0, 8, index, b"1" * 32),  # not a pool at all
            pack(fd, size, 0, 8, 1, name),  # a slot's flag, not a lend's
            pack(fd, size, 0, 8, 4096, name),  # past the flag page
            tail[:-1],
        ):  # truncated
            assert b.view(peer, bad) is None, (
                registered._LEND.unpack(bad) if len(bad) == registered.LEND_BYTES else bad
            )
    finally:
        b.close()
        peer.close()
        arena.close()
    pool, _ = registered.find(x)
    start = pool.start
    del x, v, pool
    gc.collect()
    assert start not in registered._pools  # freed with its array


@pytest.mark.fast
def test_a_receiver_keeps_a_bounded_number_of_peer_pools_mapped(monkeypatch):
    """Pools whose owner freed them stay mapped by a reader only until pushed out (least
    recently used first, bounded in count and bytes); a view of a pushed-out pool stays
    valid, since its mapping lives as long as the view."""
    monkeypatch.setattr(registered, "MAX_MAPPED", 2)
    arena = shm.SendArena(4096, 1)
    peer = shm.PeerArena(arena.describe())
    arena.attach(1, peer.returns.describe())
    lender, b = registered.Lender(arena), registered.Borrower()
    try:
        xs = [registered.allocate(4096, np.uint8) for _ in range(3)]
        views = []
        for i, x in enumerate(xs):
            x[:] = i
            views.append(b.view(peer, lender.lend(x, 1)[0]))
            if i == 0:
                b.view(peer, lender.lend(xs[0], 1)[0])  # used again: most recent
        assert len(b.mapped) == 2
        assert [bytes(v[:1]) for v in views] == [b"\0", b"\1", b"\2"]
        monkeypatch.setattr(registered, "MAX_MAPPED_BYTES", 4096)
        xs.append(registered.allocate(4096, np.uint8))
        b.view(peer, lender.lend(xs[3], 1)[0])  # a new pool: the bytes bound applies
        assert len(b.mapped) == 1
    finally:
        b.close()
        peer.close()
        arena.close()
