"""The wire header every message carries: msgpack [MAGIC, type, generation, op sequence, source,
message index, phase, step, chunk, descriptor, sent_at]. The payload travels beside it, raw.
sent_at is the sender's wall clock when it posted the frame (0.0: not stamped): the receiver
times each link from it (linkstats.py).

Decoded, a header is a Header record: every field checked for its type, the descriptor slot read
as what the message type says it carries -- the op's Descriptor (data, probes) or an Abort (why
an op ended early). OpChannel (channel.py) decides what a frame may be used for; this module
only says what one is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple
import struct

import msgpack

MAGIC = 0xC011EC  # protocol identifier and version; anything else on our sockets is dropped
# Message types. Point-to-point messages have their own sequence numbers per pair of ranks, so
# they live in their own "stream" and never look stale or early to a collective (or back).
# PROBE carries only an op's descriptor: a rank stalled in a receive sends it to everyone, so
# that ranks whose schedules both begin by waiting (e.g. a tree reduce on one rank against a
# broadcast on another) still see each other's descriptors and raise CollectiveMismatch.
# LINK_PROBE is a timed probe of one link, sent while a stall is diagnosed (linkprobe.py): its
# message index field carries the probe round's token, its payload is filler of a fixed size.
# LINK_TEST is a timed test of a link routed around as slow (linktest.py), sent while the ops
# run: its receiver times it (linkstats.py) and drops it; its index field carries the test's
# token.
DATA, ABORT, P2P_DATA, P2P_ABORT, PROBE, LINK_PROBE, LINK_TEST = 0, 1, 2, 3, 4, 5, 6
STREAM_OF = {
    DATA: 0,
    ABORT: 0,
    P2P_DATA: 1,
    P2P_ABORT: 1,
    PROBE: 0,
    LINK_PROBE: 0,
    LINK_TEST: 0,
}


class Descriptor(NamedTuple):
    """What an op is, as every rank of the group must agree: its header carries it (a msgpack
    array) and a receiver that finds another one raises CollectiveMismatch."""

    kind: str  # "all_reduce", "send/recv", ...
    count: int | None  # type: ignore[assignment]  # elements (None: uneven blocks); not tuple.count
    dtype: str  # numpy's dtype.str
    op: Any  # the ReduceOp's value, for reducing ops; else None
    algorithm: str
    root: Any = None  # a rooted op's root, a send/recv's tag, "v" for uneven blocks


class Abort(NamedTuple):
    """Why an op ended early, as an ABORT message says it (channel.py, OpChannel.abort)."""

    kind: str  # "mismatch" or "timeout" ("" where the sender said none)
    culprit: int | None  # the rank to blame, as the sender saw it
    message: str
    desc: Descriptor | None = None  # a mismatch: the sender's own call ...
    culprit_desc: Descriptor | None = None  # ... and the culprit's, as its frame said


class Header(NamedTuple):
    """A message's header, decoded and checked (decode_header)."""

    type: int  # DATA, ABORT, P2P_DATA, P2P_ABORT, PROBE, LINK_PROBE or LINK_TEST
    generation: int
    seq: int  # the op: the group's sequence number, or a send/recv pair's
    src: int  # the rank that sent it (checked against the connection that delivered it)
    number: int  # messages sent to this peer before it in the op (LINK_PROBE, LINK_TEST: a token)
    phase: str
    step: int
    chunk: int
    desc: Descriptor | None  # the op's descriptor (data and probes)
    abort: Abort | None  # why the op ended (ABORT, P2P_ABORT)
    sent: float  # the sender's wall clock at posting (0.0: not stamped; linkstats.py)


def encode_header(
    mtype: int,
    generation: int,
    seq: int,
    src: int,
    index: int,
    phase: str,
    step: int,
    chunk: int,
    desc: Sequence[Any] | Abort | None,
    sent_at: float = 0.0,
) -> bytes:
    """The header's bytes; `desc`: the op's Descriptor (a tuple: msgpack writes an array), or
    for an ABORT the Abort, which travels as a map."""
    if isinstance(desc, Abort):
        info: dict[str, Any] = {"kind": desc.kind, "culprit": desc.culprit, "message": desc.message}
        if desc.desc is not None or desc.culprit_desc is not None:
            info["desc"], info["culprit_desc"] = desc.desc, desc.culprit_desc
        packed: bytes = msgpack.packb(
            [MAGIC, mtype, generation, seq, src, index, phase, step, chunk, info, sent_at]
        )
        return packed
    packed = msgpack.packb(
        [MAGIC, mtype, generation, seq, src, index, phase, step, chunk, desc, sent_at]
    )
    return packed


class _Form:
    """One header form: the leading bytes, and the struct that packs the rest around the
    constants src and tail (phase, step, chunk, descriptor)."""

    __slots__ = ("head", "rest", "lead", "src", "tail")

    def __init__(self, head: bytes, rest: struct.Struct, src: bytes, tail: bytes) -> None:
        self.head, self.rest, self.src, self.tail = head, rest, src, tail
        # rest without its last field (sent_at's 8 bytes): what a received header is matched to
        self.lead = struct.Struct(rest.format[:-1])


class HeaderForms:
    """The data headers of one op's plan, prebuilt: per (type, generation, source, phase, step,
    chunk) the bytes that never change, so that a frame's header is those plus its sequence,
    index and send time, packed in one struct call. It decodes exactly as encode_header's
    does (msgpack's fixed-width int64 and float64). Kept per plan (group/collective.py);
    bounded."""

    MAX = 1024  # forms kept; a plan's phases x steps x chunks stay below it

    __slots__ = ("desc", "_forms")

    def __init__(self, desc: Sequence[Any] | None) -> None:
        self.desc = desc
        self._forms: dict[tuple[int, int, int, str, int, int], _Form] = {}

    def __len__(self) -> int:
        """Forms kept."""
        return len(self._forms)

    def encode(
        self,
        mtype: int,
        generation: int,
        seq: int,
        src: int,
        index: int,
        phase: str,
        step: int,
        chunk: int,
        sent_at: float,
    ) -> bytes:
        key = (mtype, generation, src, phase, step, chunk)
        f = self._forms.get(key)
        if f is None:
            if len(self._forms) >= self.MAX:
                self._forms.clear()
            f = self._forms[key] = self._form(mtype, generation, src, phase, step, chunk)
        return f.head + f.rest.pack(0xD3, seq, f.src, 0xD3, index, f.tail, 0xCB, sent_at)

    def sent_at(
        self,
        raw: Any,
        mtype: int,
        generation: int,
        seq: int,
        src: int,
        index: int,
        phase: str,
        step: int,
        chunk: int,
    ) -> float | None:
        """The sent_at of the header `raw` if it is byte for byte what encode() makes of these
        fields (it then decodes to exactly them, descriptor included: checked once, when the
        form was made); None if it is anything else (decode_header it then)."""
        key = (mtype, generation, src, phase, step, chunk)
        f = self._forms.get(key)
        if f is None:
            if len(self._forms) >= self.MAX:
                self._forms.clear()
            f = self._forms[key] = self._form(mtype, generation, src, phase, step, chunk)
        lead = f.head + f.lead.pack(0xD3, seq, f.src, 0xD3, index, f.tail, 0xCB)
        k = len(lead)
        if len(raw) != k + 8 or raw[:k] != lead:
            return None
        sent: float = _F64.unpack_from(raw, k)[0]
        return sent

    def _form(
        self, mtype: int, generation: int, src: int, phase: str, step: int, chunk: int
    ) -> _Form:
        pack = msgpack.packb
        # [MAGIC, type, generation, seq, src, index, phase, step, chunk, desc, sent_at]
        head = b"\x9b" + pack(MAGIC) + pack(mtype) + pack(generation)
        src_b = pack(src)
        tail = pack(phase) + pack(step) + pack(chunk) + pack(self.desc)
        rest = struct.Struct(f">Bq{len(src_b)}sBq{len(tail)}sBd")
        return _Form(head, rest, src_b, tail)


_F64 = struct.Struct(">d")  # msgpack's float 64, as sent_at travels

# Records are made with tuple.__new__ on the receive path: a NamedTuple's own __new__ is a
# Python function, and the header of every message received is decoded here (bench/micro).
_record = tuple.__new__


class _NotOurs(Exception):
    """A field that is not what our messages carry: the frame is dropped (decode_header)."""


def _descriptor(value: Any) -> Descriptor | None:
    """A descriptor slot as a Descriptor, or None for none."""
    if value is None:
        return None
    if type(value) is list and len(value) == 6 and type(value[0]) is str:
        return _record(Descriptor, value)
    raise _NotOurs


def _abort(info: Any, src: int) -> Abort:
    """An ABORT's map as an Abort. A missing culprit is the sender."""
    if type(info) is not dict:
        raise _NotOurs
    kind, message = info.get("kind", ""), info.get("message", "no reason given")
    culprit = info.get("culprit", src)
    if (
        type(kind) is not str
        or type(message) is not str
        or not (culprit is None or type(culprit) is int)
    ):
        raise _NotOurs
    return Abort(
        kind, culprit, message, _descriptor(info.get("desc")), _descriptor(info.get("culprit_desc"))
    )


def decode_header(raw: Any) -> Header | None:
    """The header as a Header, or None if these bytes are not one of ours (every field's type
    checked: what arrives is never trusted)."""
    try:
        h = msgpack.unpackb(raw)
    except Exception:
        return None
    if type(h) is not list or len(h) != 11:
        return None
    # Unpacked into names, not tested in a loop: this runs for every message received.
    magic, mtype, gen, seq, src, index, phase, step, chunk, desc, sent = h
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
        or type(sent) is not float
    ):
        return None
    if mtype == ABORT or mtype == P2P_ABORT:
        try:
            abort = _abort(desc, src)
        except _NotOurs:
            return None
        return _record(Header, (mtype, gen, seq, src, index, phase, step, chunk, None, abort, sent))
    if desc is not None:  # _descriptor, written out: every data frame passes here
        if type(desc) is not list or len(desc) != 6 or type(desc[0]) is not str:
            return None
        desc = _record(Descriptor, desc)
    return _record(Header, (mtype, gen, seq, src, index, phase, step, chunk, desc, None, sent))


__all__ = ["Abort", "Descriptor", "Header", "HeaderForms", "decode_header", "encode_header"]
