"""Registered buffers: arrays that live in shared memory, so a same-host peer reads them in place.

Why. Through the arena of shm.py a payload byte is copied once into a slot by its sender and
then read by the receiver. If the caller's buffer already lives in memory the peer can map, the
sender need not copy it at all: it *lends* the region, the receiver reduces or copies straight
from it, and says when it is done. For a 2-rank ring all_reduce that removes the sender's
copies (1.5x the buffer copied per rank becomes 0.5x): the copy floor halves. This is
NCCL's ncclMemAlloc + buffer registration, or MPI's shared windows, for CPU processes.

What. `allocate(nbytes)` makes a *pool*: an anonymous memfd of exactly that many bytes
(page-rounded), sealed against shrinking and growing like an arena, and returns a numpy array
over it. Pools are per process, not per group: a pool lives as long as its array (any view of
it, or a torch tensor over it, keeps it alive) and is closed when the array is collected, so a
buffer allocated in a group that is later reconstructed is still registered in the new one.

    owner (sender)                                  peer (receiver)
    piece lies inside pool P: no copy; take a
    free lend flag (its own, 0 -> 1)
    send [header, P's name/fd/size, offset,  -----> map P read-only (once; checks the name,
          nbytes, flag index] over ZeroMQ ipc       the size, the seals), check offset+nbytes
                                                    <= size; reduce/copy from it in place
    the region is lent: the op does not write  <--- count +1 for the flag, in the reader's
    it or return before the count is back           return page (as a slot is handed back)
    (OpChannel's pending sends: the rule for
    zero-copy sends)

The completion is a flag in shared memory, not a message: a message per lend would cost as
much again as the lend itself (most of what a large op spends beyond its copies is per-message
work). The owner rarely waits for one (the peer read the region long before the owner needs
it back), and when it does it sleeps in short steps (wait_lend).

Safety. A peer maps only what the frame names, and takes the frame only from the pool's owner
over ipc (frames.py, FrameParser._from_owner): the memfd's name (a fresh uuid) must match /proc/<pid>/fd/<fd>,
the file must be sealed (against resizing and, as every memfd here, against writers other than
its owner: shm.py) and exactly the announced size, and the region must lie inside it;
anything else is dropped like any malformed frame. The peer maps the pool read-only; the flag
index must be one of the lend flags of the owner's flag page (past its slots' flags).

Which ops lend: see transport/lending.py. After a failure an op ends without waiting for its lends (as it
does for zero-copy sends): the buffer's contents are undefined after a failed op anyway, and a
peer still reading it is in the same aborted op. Memory: a pool dies with its array (owner) and
its mapping with the peer's transport (close); SIGKILL frees both, as for arenas -- nothing has
a name under /dev/shm.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
import uuid
import weakref
from typing import Any

import numpy as np

from .shm import FLAGS_BYTES, PeerArena, SendArena, SlotView, open_sealed, owned_memfd

_PAGE = mmap.PAGESIZE
# The tail of a lend frame: fd, pool size, offset, nbytes, its flag's index, the memfd's uuid.
_LEND = struct.Struct("<iQQQQ32s")
LEND_BYTES = _LEND.size
# What a receiver keeps mapped of its peers' pools: a pool its owner freed is still mapped here
# until pushed out (least recently used first), so the bound is on count and on bytes. Pushing
# out a pool still in use is harmless: its mapping lives until the last view of it goes.
MAX_MAPPED = 256
MAX_MAPPED_BYTES = 1 << 30


class _Pool:
    __slots__ = ("fd", "mm", "name", "size", "start", "__weakref__")

    def __init__(self, nbytes: int) -> None:
        self.size = max(_PAGE, -(-nbytes // _PAGE) * _PAGE)
        self.name = uuid.uuid4().hex
        # sealed like an arena: nobody but this process can write the caller's buffer
        self.fd, self.mm = owned_memfd(f"collectives-buf-{self.name}", self.size)
        self.start: int = np.frombuffer(self.mm, np.uint8, 1).ctypes.data


_pools: dict[int, _Pool] = {}  # start address -> pool (this process's registered memory)
_lock = threading.Lock()


def _release(start: int) -> None:
    """The array over a pool was collected: nothing of ours references the memory any more."""
    with _lock:
        pool = _pools.pop(start, None)
    if pool is not None:
        try:
            pool.mm.close()
        except BufferError:  # a stray view: the mapping goes with it
            pass
        os.close(pool.fd)


def allocate(shape: int | tuple[int, ...], dtype: Any) -> np.ndarray:
    """A zero-filled C-contiguous array of `shape` and `dtype` in a new registered pool.
    Raises OSError where memfds do not exist (the caller then gives plain memory)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"registered buffer: negative dimension in shape {shape}")
    count = int(np.prod(shape, dtype=np.int64))
    if not hasattr(os, "memfd_create"):
        raise OSError("os.memfd_create is not available on this platform")
    pool = _Pool(count * dtype.itemsize)
    base = np.frombuffer(pool.mm, dtype, count)
    with _lock:
        _pools[pool.start] = pool
    weakref.finalize(base, _release, pool.start)
    return base.reshape(shape)


def find(arr: np.ndarray) -> tuple[Any, ...] | None:
    """(pool, offset) if the bytes of `arr` lie inside one registered pool of this process."""
    if not _pools or not isinstance(arr, np.ndarray):
        return None
    addr, n = arr.ctypes.data, arr.nbytes
    for start, pool in list(_pools.items()):
        if start <= addr and addr + n <= start + pool.size:
            return pool, addr - start
    return None


def is_registered(arr: Any) -> bool:
    """True if `arr` (numpy array or CPU torch tensor) lives in registered shared memory."""
    if hasattr(arr, "numpy") and not isinstance(arr, np.ndarray):
        try:
            arr = arr.detach().numpy()
        except (TypeError, RuntimeError):
            return False
    return isinstance(arr, np.ndarray) and arr.size > 0 and find(arr) is not None


class LendTracker:
    """Completion of one lend: done once its reader's return page has counted its flag back."""

    __slots__ = ("arena", "peer", "index", "count")

    def __init__(self, arena: SendArena, peer: int, index: int, count: int) -> None:
        self.arena, self.peer, self.index, self.count = arena, peer, index, count

    @property
    def done(self) -> bool:
        return self.arena.returned_yet(self.peer, self.index, self.count)


class Lender:
    """The sending side of one transport. A lend's completion flag is a flag of this rank's
    arena (shm.py) past the slots' flags, taken and handed back as a slot is: only the owner
    takes it, and only the reader of that lend counts it back in its return page, after its
    last read of the region."""

    def __init__(self, arena: SendArena | None) -> None:
        self.arena = None
        if arena is not None and arena.slots < FLAGS_BYTES:
            self.arena = arena
            self.first = arena.slots
        self._next = 0
        self.sent = 0

    def lend(self, payload: Any, peer: int) -> tuple[bytes, LendTracker] | None:
        """(frame tail, tracker) if `payload` lies in a registered pool, receiver `peer` has a
        return page attached and a flag is free."""
        arena = self.arena
        if arena is None or peer not in arena.returned:
            return None
        found = find(payload)
        if found is None:
            return None
        first = self.first
        index = arena.take(peer, first, FLAGS_BYTES, first + self._next)
        if index is None:
            return None  # every flag lent (readers that died mid-op): copy instead
        self._next = index + 1 - first if index + 1 < FLAGS_BYTES else 0
        pool, offset = found
        self.sent += 1
        return _LEND.pack(
            pool.fd, pool.size, offset, payload.nbytes, index, pool.name.encode()
        ), LendTracker(arena, peer, index, int(arena.handed[peer][index]))

    def outstanding(self) -> int:
        return 0 if self.arena is None else self.arena.in_use(self.first, FLAGS_BYTES)

    def close(self) -> None:
        """Let go of the arena: a retired transport keeps no reference to its mapping."""
        self.arena = None


def wait_lend(tracker: LendTracker, timeout: float) -> bool:
    """Sleep in growing steps (20 .. 200 us: a late wake-up costs the op that much) until the
    lend is done or `timeout` passes."""
    if tracker.done:
        return True
    end, step = time.monotonic() + timeout, 20e-6
    while time.monotonic() < end:
        time.sleep(step)
        if tracker.done:
            return True
        step = min(step * 2, 2e-4)
    return tracker.done


class LentView(SlotView):
    """A received payload that lives in the sender's registered buffer (uint8, read-only);
    free_slot() (the transport's release) counts the lend's flag back in this rank's return
    page for the sender."""


class Borrower:
    """The receiving side of one transport: the peers' pools it has mapped (read-only)."""

    def __init__(self) -> None:
        self.mapped: dict[tuple[int, str], tuple[Any, Any]] = {}  # (pid, name) -> (mmap, array)

    def view(self, arena: PeerArena, tail: Any) -> LentView | None:
        """The lent region a frame tail names (from the owner of `arena`, a PeerArena), or
        None if it is not a valid one."""
        if len(tail) != LEND_BYTES:
            return None
        fd, size, offset, nbytes, index, name = _LEND.unpack(tail)
        if not (offset <= size and nbytes <= size - offset and arena.slots <= index < FLAGS_BYTES):
            return None
        pid = arena.pid
        key = (pid, name)
        got = self.mapped.pop(key, None)
        if got is None:
            try:
                got = self._map(pid, fd, size, name.decode("ascii"))
            except (OSError, ValueError, UnicodeDecodeError):
                return None
            while self.mapped and (
                len(self.mapped) >= MAX_MAPPED
                or size + sum(a.size for _, a in self.mapped.values()) > MAX_MAPPED_BYTES
            ):
                _close(self.mapped.pop(next(iter(self.mapped)))[0])
        self.mapped[key] = got  # the most recently used last
        if got[1].size != size:
            return None
        v = got[1][offset : offset + nbytes].view(LentView)
        v.returns_to(arena.flags, index)
        return v

    @staticmethod
    def _map(pid: int, fd: int, size: int, name: str) -> tuple[mmap.mmap, np.ndarray]:
        with open_sealed(pid, fd, f"collectives-buf-{name}", size) as f:
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        return mm, np.frombuffer(mm, np.uint8)

    def close(self) -> None:
        for mm, _ in self.mapped.values():
            _close(mm)
        self.mapped.clear()


def _close(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass  # a view is still alive somewhere; the mapping goes with it
