"""The wire header every message carries: msgpack [MAGIC, type, generation, op sequence, source,
message index, phase, step, chunk, descriptor, sent_at]. The payload travels beside it, raw.
sent_at is the sender's wall clock when it posted the frame (0.0: not stamped): the receiver
times each link from it (linkstats.py).

OpChannel (channel.py) decides what a frame may be used for; this module only says what one is.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

MAGIC = 0xC011EC  # protocol identifier and version; anything else on our sockets is dropped
# Message types. Point-to-point messages have their own sequence numbers per pair of ranks, so
# they live in their own "stream" and never look stale or early to a collective (or back).
# PROBE carries only an op's descriptor: a rank stalled in a receive sends it to everyone, so
# that ranks whose schedules both begin by waiting (e.g. a tree reduce on one rank against a
# broadcast on another) still see each other's descriptors and raise CollectiveMismatch.
# LINK_PROBE is a timed probe of one link, sent while a stall is diagnosed (linkprobe.py): its
# message index field carries the probe round's token, its payload is filler of a fixed size.
DATA, ABORT, P2P_DATA, P2P_ABORT, PROBE, LINK_PROBE = 0, 1, 2, 3, 4, 5
STREAM_OF = {DATA: 0, ABORT: 0, P2P_DATA: 1, P2P_ABORT: 1, PROBE: 0, LINK_PROBE: 0}


class Descriptor(NamedTuple):
    """What an op is, as every rank of the group must agree: its header carries it (as a list,
    Descriptor.wire) and a receiver that finds another one raises CollectiveMismatch."""

    kind: str  # "all_reduce", "send/recv", ...
    count: int | None  # type: ignore[assignment]  # elements (None: uneven blocks); not tuple.count
    dtype: str  # numpy's dtype.str
    op: Any  # the ReduceOp's value, for reducing ops; else None
    algorithm: str
    root: Any = None  # a rooted op's root, a send/recv's tag, "v" for uneven blocks

    def wire(self) -> list:
        """The form the header carries (msgpack: a list; a frame's list is compared to it)."""
        return list(self)


# Fields of the header list, in order.
H_MAGIC, H_TYPE, H_GEN, H_SEQ, H_SRC, H_INDEX, H_PHASE, H_STEP, H_CHUNK, H_DESC, H_SENT = range(11)


def encode_header(
    mtype, generation, seq, src, index, phase, step, chunk, desc, sent_at: float = 0.0
) -> bytes:
    return msgpack.packb(
        [MAGIC, mtype, generation, seq, src, index, phase, step, chunk, desc, sent_at]
    )


def decode_header(raw) -> list | None:
    """The header as a list, or None if these bytes are not one of ours (every field's type
    checked: what arrives is never trusted)."""
    try:
        h = msgpack.unpackb(raw)
    except Exception:
        return None
    if type(h) is not list or len(h) != 11:
        return None
    # Unpacked into names, not tested in a loop: this runs for every message received.
    magic, mtype, gen, seq, src, index, phase, step, chunk, desc, sent_at = h
    if (
        magic != MAGIC
        or type(mtype) is not int
        or type(gen) is not int
        or type(seq) is not int
        or type(src) is not int
        or type(index) is not int
        or type(step) is not int
        or type(chunk) is not int
        or type(phase) is not str
        or not (desc is None or type(desc) is list or type(desc) is dict)
        or type(sent_at) is not float
    ):
        return None
    return h
