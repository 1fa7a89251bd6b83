"""Shared memory for large payloads between ranks on one host; ZeroMQ still carries every message.

Why. Over any socket (tcp or ipc) a payload byte is copied three times on this path: into the
kernel by the sender, out of the kernel into a ZeroMQ message by the receiver's I/O thread, and
from that message into place. On a small machine those copies are the whole cost of a large
all_reduce, and they are why a ZeroMQ byte stream cannot beat Gloo on loopback
(docs/benchmarks.md, "all_reduce against Gloo, 2 ranks"). Through shared memory a byte is
copied once: the sender copies it into memory the receiver has mapped, and the receiver
reduces or copies it from there straight into place.

How. Each rank owns one *arena*: an anonymous memfd cut into fixed-size slots, one per payload
in flight, plus one flag byte per slot. Its peers on the same host map it (through
/proc/<pid>/fd/<fd>, so no name exists anywhere and the kernel frees the memory when the last
process that maps it exits, even after SIGKILL): the flag page read-write, the slots read-only
-- a receiver has no business writing a sender's payloads. The memfd is sealed against
shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW) before anyone maps it, and a peer maps
only an arena so sealed, so nobody can truncate it under another's mapping (which would be a
SIGBUS there). Which process may hand a rank a slot is the transport's business: only the
arena's owner, authenticated, over ipc (zmq.py). A receiver that has mapped a sender's arena
tells it so (zmq.py, _SHM_READY); only then does the sender put payloads for it in slots, so a
receiver that cannot map it (another user, a locked-down /proc) still gets every message.

    sender                                       receiver
    take a free slot (flag 0 -> 1)
    copy the payload into the slot
    send [header, slot, nbytes] over ZeroMQ ---> take the frame; read the slot in place
                                                 (reduce or copy into the caller's buffer)
    (slot is free again)         <-------------- flag 1 -> 0, written into the sender's arena

Only the owner sets a flag to 1 and only the receiver of that slot sets it back to 0, so each
flag has one writer at a time. The ZeroMQ message orders "payload written" before "payload
read" (a syscall and a mutex stand between them). "Payload read" before "flag cleared" is
program order in the receiver, which x86's memory model keeps for loads before stores; on
weaker CPUs the GIL release/acquire around numpy's copy of a large slot orders it as well.

The flag bytes past the slots' are the completion flags of lends (registered.py): the same
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

import numpy as np

FREE, BUSY = 0, 1
_FLAGS_BYTES = 4096   # one page of flags in front of the slots (slots stay page-aligned)
SEALS = getattr(fcntl, "F_SEAL_SHRINK", 0x2) | getattr(fcntl, "F_SEAL_GROW", 0x4)
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
            return ""          # no /proc: no sharing
    return ":".join(parts)


class SendArena:
    """This rank's outgoing slots."""

    def __init__(self, slot_bytes: int, slots: int):
        if not hasattr(os, "memfd_create"):
            raise OSError("os.memfd_create is not available on this platform")
        if slots < 1 or slots > _FLAGS_BYTES or slot_bytes < 1:
            raise ValueError(f"shared memory arena: bad geometry {slots} x {slot_bytes} B")
        self.slot_bytes, self.slots = slot_bytes, slots
        # A unique name lets a peer check that the fd it opens is this arena and not a file
        # that took the same fd number after the arena was closed.
        self.name = f"collectives-arena-{uuid.uuid4().hex}"
        self.fd = os.memfd_create(self.name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, _FLAGS_BYTES + slots * slot_bytes)
            fcntl.fcntl(self.fd, _F_ADD_SEALS, SEALS)   # its size is final: no SIGBUS anywhere
            self.mm = mmap.mmap(self.fd, _FLAGS_BYTES + slots * slot_bytes)
        except BaseException:
            os.close(self.fd)
            raise
        self.flags = np.frombuffer(self.mm, np.uint8, slots, 0)
        self.data = np.frombuffer(self.mm, np.uint8, slots * slot_bytes, _FLAGS_BYTES)
        self._next = 0      # where the search for a free slot starts (round robin)

    def describe(self) -> dict:
        return {"pid": os.getpid(), "fd": self.fd, "name": self.name, "slots": self.slots,
                "slot_bytes": self.slot_bytes}

    def put(self, payload) -> tuple[int, int] | None:
        """Copy `payload` into a free slot and return (slot, nbytes); None if it does not fit or
        every slot is still being read (the caller then sends it over the socket)."""
        src = np.frombuffer(payload, np.uint8)
        n = src.nbytes
        if n > self.slot_bytes:
            return None
        # Round robin, so that a slot just freed is not the one rewritten at once. The flags
        # are the first bytes of the mapping: mmap.find looks for a free one in C, which
        # costs a fraction of a numpy search (this runs for every payload, issue 16).
        mm, nxt = self.mm, self._next
        slot = mm.find(b"\0", nxt, self.slots)
        if slot < 0:
            slot = mm.find(b"\0", 0, nxt)
            if slot < 0:
                return None
        self._next = slot + 1 if slot + 1 < self.slots else 0
        self.flags[slot] = BUSY
        start = slot * self.slot_bytes
        np.copyto(self.data[start:start + n], src)
        return slot, n

    def in_use(self) -> int:
        """Slots a receiver has not handed back yet (bench/stress/soak.py watches that it stays flat:
        a slot never freed is a slow leak that ends with every payload on the socket)."""
        return 0 if self.flags is None else int(np.count_nonzero(self.flags != FREE))

    def close(self):
        self.flags = self.data = None
        try:
            self.mm.close()
        except BufferError:
            pass      # a view is still alive somewhere; the mapping goes with it
        os.close(self.fd)


class SlotView(np.ndarray):
    """A received payload that lives in a peer's arena: a uint8 array over the slot, plus
    `free_slot()`, which hands the slot back to its sender once the payload has been used."""

    _flags = None
    _slot = -1

    def free_slot(self):
        if self._flags is not None:
            self._flags[self._slot] = FREE
            self._flags = None


class PeerArena:
    """A peer's arena, mapped by a rank that receives from it: its flag page read-write (a
    receiver hands slots back), its slots read-only."""

    def __init__(self, info: dict):
        self.pid = int(info["pid"])
        path = f"/proc/{self.pid}/fd/{int(info['fd'])}"
        self.slots, self.slot_bytes = int(info["slots"]), int(info["slot_bytes"])
        if not (1 <= self.slots <= _FLAGS_BYTES and self.slot_bytes >= 1):
            raise ValueError(f"shared memory arena: bad geometry {self.slots} x "
                             f"{self.slot_bytes} B")
        size = _FLAGS_BYTES + self.slots * self.slot_bytes
        if os.readlink(path) != f"/memfd:{info['name']} (deleted)":
            raise OSError(f"{path} is {os.readlink(path)!r}, not the arena {info['name']!r}")
        with open(path, "r+b") as f:
            if os.fstat(f.fileno()).st_size != size:
                raise OSError(f"{path} is {os.fstat(f.fileno()).st_size} bytes, expected {size}")
            seals = fcntl.fcntl(f.fileno(), _F_GET_SEALS)
            if seals & SEALS != SEALS:
                raise OSError(f"{path} is not sealed against shrinking and growing (seals "
                              f"{seals:#x}): its size could change under this mapping")
            self.flags_mm = mmap.mmap(f.fileno(), _FLAGS_BYTES, access=mmap.ACCESS_WRITE)
            try:
                self.data_mm = mmap.mmap(f.fileno(), self.slots * self.slot_bytes,
                                         access=mmap.ACCESS_READ, offset=_FLAGS_BYTES)
            except BaseException:
                self.flags_mm.close()
                raise
        self.flags = np.frombuffer(self.flags_mm, np.uint8, self.slots, 0)
        self.data = np.frombuffer(self.data_mm, np.uint8)      # read-only

    def view(self, slot: int, nbytes: int) -> SlotView | None:
        """The payload in `slot`, or None if (slot, nbytes) cannot be one of this arena's."""
        if not (0 <= slot < self.slots and 0 <= nbytes <= self.slot_bytes):
            return None
        start = slot * self.slot_bytes
        v = self.data[start:start + nbytes].view(SlotView)
        v._flags, v._slot = self.flags, slot
        return v

    def close(self):
        self.flags = self.data = None
        for mm in (self.flags_mm, self.data_mm):
            try:
                mm.close()
            except BufferError:
                pass     # a view is still alive somewhere; the mapping goes with it


def free_slot(payload) -> None:
    """Hand a received payload's slot back to its sender (no-op for socket payloads)."""
    if isinstance(payload, SlotView):
        payload.free_slot()
