"""A rank's transport address: what it advertises so that its peers can reach it (tcp, ipc,
its shared-memory arena, its fast link), as typed records the transport owns and reads.

The membership layer carries them in its welcome unchanged (membership/protocol.py: Info is a
RankAddress), the torch rendezvous puts them in its store. The bounds are the wire's: a record
decoded from a peer is checked here, before the transport reads it."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta, Struct

MAX_RANKS = 1 << 20
MAX_STR = 512  # an endpoint, a host id, a memfd's name

Name = Annotated[str, Meta(min_length=1, max_length=MAX_STR)]
Text = Annotated[str, Meta(max_length=MAX_STR)]
Rank = Annotated[int, Meta(ge=0, le=MAX_RANKS)]
Pid = Annotated[int, Meta(ge=1, le=1 << 31)]
Fd = Annotated[int, Meta(ge=0, le=1 << 31)]


class SealedPage(Struct, frozen=True):
    """A sealed memfd in another process, mapped through /proc/<pid>/fd/<fd> (shm.open_sealed):
    a receiver's return page (shm.ReturnPage)."""

    pid: Pid
    fd: Fd
    name: Name


class ArenaAddress(SealedPage, frozen=True):
    """A rank's shared-memory arena (shm.SendArena.describe): its slots and their size."""

    slots: Annotated[int, Meta(ge=1, le=1 << 16)]
    slot_bytes: Annotated[int, Meta(ge=1, le=1 << 40)]


class RankAddress(Struct, frozen=True, omit_defaults=True):
    """How to reach one rank (ZmqTransport.address_info), with what its peers' transports
    check before they connect (ZmqTransport.connect): its host, segment size and pid.
    lrank and proc are the membership layer's: the RANK the process started with (faults.py
    follows processes across generations) and its process key (membership/liveness.py)."""

    tcp: Name | None = None
    pid: Pid | None = None
    rank: Rank | None = None
    ipc: Name | None = None
    host: Text | None = None
    shm: ArenaAddress | None = None
    shm_host: Text | None = None
    segment_bytes: Annotated[int, Meta(ge=1, le=1 << 40)] | None = None
    fast: Name | None = None
    cpus: Name | None = None
    lrank: Rank | None = None
    proc: Name | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RankAddress)


def encode(address: RankAddress) -> bytes:
    """An address as bytes for a store (the torch rendezvous): msgpack, as the welcome sends it."""
    return _encoder.encode(address)


def decode(raw: bytes) -> RankAddress:
    """An address from a store; ValueError names the field that is not what it should be."""
    try:
        return _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise ValueError(f"a rank's address record is malformed: {exc}") from exc
