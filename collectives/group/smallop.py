"""The small-op path: a synchronous all_reduce of a few bytes, run by the calling thread
against the sockets with as little Python between them as the guarantees allow.

A small all_reduce (direct: one message deep, every rank sends everyone its buffer; naive on a
crowded host: through rank 0), and the commit round that follows it in a group that survives
failures, is a handful of frames; above the transport its cost is the Python of the general path: a loop over pieces,
a wait loop that asks the transport for any frame, vets it, times it and files it. Here, per
message:

* the frame goes out as OpChannel.send does (the plan's prebuilt header, the same counts and
  sent clock that stall diagnosis reads), without the loop over pieces;
* the receive reads the awaited peer's own link first (Transport.take_now, never blocking)
  and takes the frame there when it is this op's next data message from that peer, every
  check of admit() and _check_taken() passed, timing its link for fail-slow as the general
  path would (OpChannel.take_small); a header that is byte for byte the one the plan's
  prebuilt forms make of the message awaited is not decoded (HeaderForms.sent_at); a frame
  not there yet is waited for on that link and the ROUTER alone for a slice
  (Transport.wait_peer; a failure's wake-up or any ZeroMQ frame ends it at once), after
  reading the link for a few microseconds first where every rank of the host has a CPU
  (the spin: group/core.py, GroupCore.spin; transport/zmq/receiving.py, _spin); anything
  else -- a stash, an abort, another op's or another peer's frame, a wrong size, a longer
  wait -- goes the general way, deadline, failure notice, probes and stall diagnosis included;
* the commit round (algorithms/commit.py) runs here, right after the data, with the same
  messages in the same order; the core runs it where this path does not.

The reduction is direct.all_reduce's or naive.all_reduce's, operand for operand (the same bytes
on every rank, and the same bytes as the general path). A buffer this path does not fit (larger
than a message or sent zero-copy, not contiguous) or a channel that is wrapped (tracing, fault
injection) runs the algorithm itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..algorithms import commit, direct, naive
from ..common.ops import ReduceOp, finalize, ufunc_of
from ..transport.channel import OpChannel
from ..transport.wrapper import OpView


def fits(ch: OpChannel, buf: np.ndarray) -> bool:
    """Whether `buf` travels as one small message of `ch`'s transport (no pieces, no
    zero-copy send to wait for)."""
    return (
        buf.flags.c_contiguous
        and buf.nbytes <= ch.segment_bytes
        and buf.nbytes < ch.t.zero_copy_bytes
    )


def direct_all_reduce(ch: OpView, buf: np.ndarray, op: ReduceOp) -> None:
    """direct.all_reduce of a small buffer over an unwrapped OpChannel (see the module)."""
    if type(ch) is not OpChannel or not fits(ch, buf):
        direct.all_reduce(ch, buf, op)
        return
    n, r = ch.size, ch.rank
    release = ch.t.release
    for peer in range(n):
        if peer != r:
            ch.send_small(peer, buf, "exchange", 0, r)
    ufunc = ufunc_of(op)  # what reduce_into applies: dst = dst (op) src
    mine = None  # this rank's buffer, where it is added in after rank 1's (rank order)
    if r != 0:  # rank 0's is where the sum starts
        payload = ch.take_small(0, buf, "exchange", 0, 0)
        if r == 1:  # rank 0's, then this rank's: one ufunc, no copy
            if buf.nbytes:
                ufunc(_as_array(payload, buf), buf, out=buf)
        else:
            mine = buf.copy()
            if buf.nbytes:
                buf[...] = _as_array(payload, buf)
        release(payload)
    for peer in range(1, n):
        if peer == r:
            if mine is not None:
                ufunc(buf, mine, out=buf)
        else:
            payload = ch.take_small(peer, buf, "exchange", 0, peer)
            if buf.nbytes:
                ufunc(buf, _as_array(payload, buf), out=buf)
            release(payload)
    finalize(op, buf, n)
    _commit_round(ch)


def naive_all_reduce(ch: OpView, buf: np.ndarray, op: ReduceOp) -> None:
    """naive.all_reduce of a small buffer over an unwrapped OpChannel (see the module)."""
    if type(ch) is not OpChannel or not fits(ch, buf):
        naive.all_reduce(ch, buf, op)
        return
    n = ch.size
    release = ch.t.release
    if ch.rank == 0:
        ufunc = ufunc_of(op)  # what reduce_into applies: dst = dst (op) src
        for peer in range(1, n):
            # labelled as naive's receive is (step peer - 1); sent as step 0
            payload = ch.take_small(peer, buf, "reduce", peer - 1, 0, sent_step=0)
            if buf.nbytes:
                ufunc(buf, _as_array(payload, buf), out=buf)
            release(payload)
        finalize(op, buf, n)
        for peer in range(1, n):
            ch.send_small(peer, buf, "broadcast", 0, 0)
    else:
        ch.send_small(0, buf, "reduce", 0, 0)
        payload = ch.take_small(0, buf, "broadcast", 0, 0)
        if buf.nbytes:
            buf[...] = _as_array(payload, buf)
        release(payload)
    _commit_round(ch)


def _as_array(payload: Any, buf: np.ndarray) -> np.ndarray:
    """A received payload (its size checked by take_small) as an array of buf's dtype and
    shape; a flat buffer (what the group stages) needs no reshape."""
    got: np.ndarray = np.frombuffer(payload, buf.dtype)
    return got if buf.ndim == 1 else got.reshape(buf.shape)


def _commit_round(ch: OpChannel) -> None:
    """The commit round the op owes, if any (the group's core, core.py, runs it otherwise):
    commit.commit's all-to-all or star round, message for message (the same empty messages,
    phase and order, so the same counts for stall diagnosis and the same verdicts), sent and
    taken the small way, right after the data. This rank holds its result from here on.
    Dissemination (more ranks than commit.ALL_TO_ALL_MAX) is left to commit.commit."""
    star = ch.commit_star
    n, r = ch.size, ch.rank
    if not ch.commit_owed or (not star and n > commit.ALL_TO_ALL_MAX):
        return
    ch.hold_result()
    ch.commit_owed = False
    token = commit.TOKEN
    release = ch.t.release
    if star:
        if r == 0:
            for peer in range(1, n):
                release(ch.take_small(peer, token, "commit", 0, 0))
            for peer in range(1, n):
                ch.send_small(peer, token, "commit", 0, 0)
        else:
            ch.send_small(0, token, "commit", 0, 0)
            release(ch.take_small(0, token, "commit", 0, 0))
        return
    for peer in range(n):
        if peer != r:
            ch.send_small(peer, token, "commit", 0, 0)
    for peer in range(n):
        if peer != r:
            release(ch.take_small(peer, token, "commit", 0, 0))


__all__ = ["direct_all_reduce", "fits", "naive_all_reduce"]
