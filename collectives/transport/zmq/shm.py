"""Shared memory for large payloads between ranks on one host; ZeroMQ still carries every message.

Why. Over any socket (tcp or ipc) a payload byte is copied three times on this path: into the
kernel by the sender, out of the kernel into a ZeroMQ message by the receiver's I/O thread, and
from that message into place. On a small machine those copies are the whole cost of a large
all_reduce, and they are why a ZeroMQ byte stream cannot beat Gloo on loopback
(docs/benchmarks.md, "all_reduce against Gloo, 2 ranks"). Through shared memory a byte is
copied once: the sender copies it into memory the receiver has mapped, and the receiver
reduces or copies it from there straight into place.

How. Each rank owns one *arena*: an anonymous memfd cut into fixed-size slots, one per payload
in flight, plus one flag byte per slot that only the owner writes. Its peers on the same host
map it (through /proc/<pid>/fd/<fd>, so no name exists anywhere and the kernel frees the memory
when the last process that maps it exits, even after SIGKILL), opened O_RDONLY and mapped
read-only: a receiver has no business writing a sender's payloads. A receiver hands a slot back
through a *return page* of its own (ReturnPage): one byte per flag of the sender, which the
receiver counts up when it is done with a slot, and which the sender maps read-only. So every
shared page has exactly one writer, its owner, and every memfd is sealed twice: against
shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW) before anyone maps it, so nobody can
truncate it under another's mapping (a SIGBUS there); and, once its owner has mapped it,
against any further write (F_SEAL_FUTURE_WRITE, Linux 5.1): no other process -- a peer, or a
process of the same user that finds the fd in /proc -- can open a writable mapping, write(2)
or punch a hole into it; the owner's own mapping stays writable. A peer maps only a memfd so
sealed. What stays open to the same user is reading or writing another process's memory
directly (ptrace, /proc/<pid>/mem): docs/security.md. Which process may hand a rank a slot is
the transport's business: only the arena's owner, authenticated, over ipc (frames.py). A receiver
that has mapped a sender's arena tells it so, naming its return page (frames.py, _SHM_READY);
only then does the sender put payloads for it in slots, so a receiver that cannot map it
(another user, a locked-down /proc) still gets every message.

    sender                                       receiver
    take a free slot (local flag 0 -> 1,
    handed[receiver][slot] += 1)
    copy the payload into the slot
    send [header, slot, nbytes] over ZeroMQ ---> take the frame; read the slot in place
                                                 (reduce or copy into the caller's buffer)
    (slot free again once          <------------ returned[slot] += 1, in the receiver's
     returned == handed)                         return page

Each flag index is held by one receiver at a time, so a byte counter that wraps at 256 is
enough: the slot is back when the receiver's count equals the number of times it was handed to
that receiver. The sender looks at the return pages only when it finds no free flag of its own
(reclaim), so a put costs no more than before. The ZeroMQ message orders "payload written"
before "payload read" (a syscall and a mutex stand between them). "Payload read" before "count
raised" is program order in the receiver, which x86's memory model keeps for loads before
stores; on weaker CPUs the GIL release/acquire around numpy's copy of a large slot orders it as
well.

The flag indices past the slots' are the completion flags of lends (registered.py): the same
protocol, for a region of the sender's registered buffer instead of a slot.

When no slot is free (a receiver that has not caught up, a payload larger than a slot), the
payload simply travels over the socket as it would without an arena: never a wait, so two ranks
that both send before they receive cannot deadlock on slots.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
import uuid
from typing import Any, BinaryIO

import numpy as np

from ..address import ArenaAddress, SealedPage

FREE, BUSY = 0, 1
FLAGS_BYTES = 4096  # one page of flags in front of the slots (slots stay page-aligned)
SEALS = getattr(fcntl, "F_SEAL_SHRINK", 0x2) | getattr(fcntl, "F_SEAL_GROW", 0x4)
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)
ALL_SEALS = SEALS | F_SEAL_FUTURE_WRITE  # what a peer demands of a memfd before mapping it
_F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
_F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)


def shm_host_id() -> str:
    """Processes with equal ids can map each other's arenas: same kernel, same network, pid and
    mount namespaces (so /proc/<pid>/fd/<fd> names the same file for both)."""
    parts = [socket.gethostname()]
    for ns in ("net", "pid", "mnt"):
        try:
            parts.append(str(os.stat(f"/proc/self/ns/{ns}").st_ino))
        except OSError:
            return ""  # no /proc: no sharing
    return ":".join(parts)


def owned_memfd(name: str, size: int) -> tuple[int, mmap.mmap]:
    """(fd, writable mapping) of a new memfd of `size` bytes that only this process can write:
    sealed against resizing before it is mapped, and against every later write once it is
    (the mapping made here stays writable). OSError where the kernel cannot (memfds, or
    F_SEAL_FUTURE_WRITE before Linux 5.1): the caller then does without shared memory."""
    if not hasattr(os, "memfd_create"):
        raise OSError("os.memfd_create is not available on this platform")
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, _F_ADD_SEALS, SEALS)  # its size is final: no SIGBUS anywhere
        mm = mmap.mmap(fd, size)
        try:
            fcntl.fcntl(fd, _F_ADD_SEALS, F_SEAL_FUTURE_WRITE)
        except OSError as exc:
            mm.close()
            raise OSError(
                f"cannot seal shared memory against other writers "
                f"(F_SEAL_FUTURE_WRITE needs Linux 5.1): {exc.strerror}"
            ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd, mm


def open_sealed(pid: int, fd: int, name: str, size: int) -> BinaryIO:
    """Another process's memfd `name` (its fd `fd`), opened read-only after checking that it
    is that memfd, `size` bytes long, and sealed against resizing and writing. The caller
    maps it read-only and closes the file."""
    path = f"/proc/{int(pid)}/fd/{int(fd)}"
    if os.readlink(path) != f"/memfd:{name} (deleted)":
        raise OSError(f"{path} is {os.readlink(path)!r}, not the memfd {name!r}")
    f = open(path, "rb")  # O_RDONLY: a writable mapping cannot come from it
    try:
        if os.fstat(f.fileno()).st_size != size:
            raise OSError(f"{path} is {os.fstat(f.fileno()).st_size} bytes, expected {size}")
        seals = fcntl.fcntl(f.fileno(), _F_GET_SEALS)
        if seals & ALL_SEALS != ALL_SEALS:
            raise OSError(
                f"{path} is not sealed against resizing and other writers (seals "
                f"{seals:#x}): it could change under this mapping"
            )
    except BaseException:
        f.close()
        raise
    return f


def _unmap(mm: mmap.mmap | None) -> None:
    if mm is None:
        return
    try:
        mm.close()
    except BufferError:
        pass  # a view is still alive somewhere; the mapping goes with it


class ReturnPage:
    """A receiver's page of returns for one sender: byte i counts how often this receiver has
    handed back the sender's flag i (a slot or a lend). Only this process writes it; the sender
    maps it read-only (SendArena.attach)."""

    def __init__(self) -> None:
        self.name = f"collectives-ret-{uuid.uuid4().hex}"
        self.fd, self.mm = owned_memfd(self.name, FLAGS_BYTES)
        self.counts = np.frombuffer(self.mm, np.uint8)

    def describe(self) -> SealedPage:
        return SealedPage(pid=os.getpid(), fd=self.fd, name=self.name)

    def close(self) -> None:
        self.counts = None
        _unmap(self.mm)
        os.close(self.fd)


class SendArena:
    """This rank's outgoing slots."""

    def __init__(self, slot_bytes: int, slots: int) -> None:
        if slots < 1 or slots > FLAGS_BYTES or slot_bytes < 1:
            raise ValueError(f"shared memory arena: bad geometry {slots} x {slot_bytes} B")
        self.slot_bytes, self.slots = slot_bytes, slots
        # A unique name lets a peer check that the fd it opens is this arena and not a file
        # that took the same fd number after the arena was closed.
        self.name = f"collectives-arena-{uuid.uuid4().hex}"
        self.fd, self.mm = owned_memfd(self.name, FLAGS_BYTES + slots * slot_bytes)
        self.flags = np.frombuffer(self.mm, np.uint8, FLAGS_BYTES, 0)  # 1: handed out
        self.data = np.frombuffer(self.mm, np.uint8, slots * slot_bytes, FLAGS_BYTES)
        self.holder = np.full(FLAGS_BYTES, -1, np.int32)  # flag -> the receiver holding it
        self.handed: dict[int, Any] = {}  # receiver -> uint8 counts of flags handed to it
        self.returned: dict[
            int, Any
        ] = {}  # receiver -> its return page (read-only), the counts back
        self._maps: list[Any] = []
        self._next = 0  # where the search for a free slot starts (round robin)

    def describe(self) -> ArenaAddress:
        return ArenaAddress(
            pid=os.getpid(),
            fd=self.fd,
            name=self.name,
            slots=self.slots,
            slot_bytes=self.slot_bytes,
        )

    def attach(self, peer: int, info: SealedPage) -> None:
        """Map the return page of receiver `peer` (ReturnPage.describe()), read-only: from now
        on slots may be handed to it. OSError/ValueError/KeyError if it is not one."""
        with open_sealed(info.pid, info.fd, info.name, FLAGS_BYTES) as f:
            mm = mmap.mmap(f.fileno(), FLAGS_BYTES, access=mmap.ACCESS_READ)
        self._maps.append(mm)
        self.returned[peer] = np.frombuffer(mm, np.uint8)
        self.handed[peer] = self.returned[peer].copy()

    def reclaim(self) -> None:
        """Free every flag whose receiver has handed it back (its count caught up)."""
        held = self.flags != FREE
        for peer, back in self.returned.items():
            done = held & (self.holder == peer) & (back == self.handed[peer])
            self.flags[done] = FREE

    def take(self, peer: int, first: int, end: int, start: int) -> int | None:
        """A free flag in [first, end) for receiver `peer`, searched round robin from `start`
        (in C: mmap.find, the flags being the mapping's first bytes; a numpy search per
        payload cost 4x more), now held by `peer`; None if every one is out."""
        mm = self.mm
        for attempt in (0, 1):
            index = mm.find(b"\0", start, end)
            if index < 0:
                index = mm.find(b"\0", first, start)
            if index >= 0:
                break
            if attempt == 0:
                self.reclaim()
        else:
            return None
        self.flags[index] = BUSY
        self.holder[index] = peer
        handed = self.handed[peer]
        handed[index] = (int(handed[index]) + 1) & 0xFF
        return index

    def returned_yet(self, peer: int, index: int, count: int) -> bool:
        return int(self.returned[peer][index]) == count

    def put(self, payload: Any, peer: int) -> tuple[int, int] | None:
        """Copy `payload` into a free slot for receiver `peer` (attached) and return (slot,
        nbytes); None if it does not fit or every slot is still being read (the caller then
        sends it over the socket)."""
        src = np.frombuffer(payload, np.uint8)
        n = src.nbytes
        if n > self.slot_bytes or peer not in self.returned:
            return None
        # Round robin, so that a slot just freed is not the one rewritten at once.
        slot = self.take(peer, 0, self.slots, self._next)
        if slot is None:
            return None
        self._next = slot + 1 if slot + 1 < self.slots else 0
        start = slot * self.slot_bytes
        np.copyto(self.data[start : start + n], src)
        return slot, n

    def in_use(self, first: int = 0, end: int | None = None) -> int:
        """Flags in [first, end) a receiver has not handed back yet (bench/stress/soak.py
        watches that the slots' stays flat: a slot never freed is a slow leak that ends with
        every payload on the socket)."""
        if self.flags is None:
            return 0
        self.reclaim()
        return int(np.count_nonzero(self.flags[first : self.slots if end is None else end]))

    def close(self) -> None:
        self.flags = self.data = None
        self.returned.clear()
        for mm in self._maps:
            _unmap(mm)
        _unmap(self.mm)
        os.close(self.fd)


class SlotView(np.ndarray):
    """A received payload that lives in a peer's arena: a uint8 array over the slot, plus
    `free_slot()`, which hands the slot back to its sender once the payload has been used."""

    _flags = None  # the return page's counts (ReturnPage.counts)
    _slot = -1

    def returns_to(self, flags: np.ndarray, slot: int) -> None:
        """Say where free_slot() counts this payload back: flag `slot` of a return page."""
        self._flags, self._slot = flags, slot

    def free_slot(self) -> None:
        if self._flags is not None:
            self._flags[self._slot] = (int(self._flags[self._slot]) + 1) & 0xFF
            self._flags = None


class PeerArena:
    """A peer's arena, mapped read-only by a rank that receives from it, and this rank's return
    page for it (given, or its own), through which it hands slots back."""

    def __init__(self, info: ArenaAddress, returns: ReturnPage | None = None) -> None:
        self.pid = info.pid
        self.slots, self.slot_bytes = info.slots, info.slot_bytes
        if not (1 <= self.slots <= FLAGS_BYTES and self.slot_bytes >= 1):
            raise ValueError(
                f"shared memory arena: bad geometry {self.slots} x {self.slot_bytes} B"
            )
        size = FLAGS_BYTES + self.slots * self.slot_bytes
        with open_sealed(self.pid, info.fd, info.name, size) as f:
            self.data_mm = mmap.mmap(
                f.fileno(),
                self.slots * self.slot_bytes,
                access=mmap.ACCESS_READ,
                offset=FLAGS_BYTES,
            )
        try:
            self.returns = returns if returns is not None else ReturnPage()
        except BaseException:
            _unmap(self.data_mm)
            raise
        self._own_returns = returns is None
        self.flags = self.returns.counts
        self.data = np.frombuffer(self.data_mm, np.uint8)  # read-only

    def view(self, slot: int, nbytes: int) -> SlotView | None:
        """The payload in `slot`, or None if (slot, nbytes) cannot be one of this arena's."""
        if not (0 <= slot < self.slots and 0 <= nbytes <= self.slot_bytes):
            return None
        start = slot * self.slot_bytes
        v = self.data[start : start + nbytes].view(SlotView)
        v.returns_to(self.flags, slot)
        return v

    def close(self) -> None:
        self.flags = self.data = None
        _unmap(self.data_mm)
        if self._own_returns:
            self.returns.close()


def free_slot(payload: object) -> None:
    """Hand a received payload's slot back to its sender (no-op for socket payloads)."""
    if isinstance(payload, SlotView):
        payload.free_slot()
