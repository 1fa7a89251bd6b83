"""ChannelWrapper: the base of everything that sits between an algorithm and its OpChannel.

ProcessGroup builds one OpChannel per operation and passes it through its `channel_wrappers`
(callables ch -> ch) before the algorithm sees it. A wrapper forwards the channel interface
(rank, size, send, recv_into, recv_reduce, and any other attribute, e.g. segment_bytes) and
overrides what it adds: tracing (teaching/trace.py), stepping (teaching/step.py), emulated link
times (teaching/emulate.py), fault injection (faults.py).
"""

from __future__ import annotations


class ChannelWrapper:
    """Forwards the channel interface to the channel it wraps; subclasses override some of it.

    Rooted ops send their "confirm" messages (algorithms/rooted.py) through the outermost
    channel, so a wrapper sees those too.
    """

    def __init__(self, ch):
        self._ch = ch
        self.rank = ch.rank
        self.size = ch.size

    def __getattr__(self, name):  # segment_bytes, op_name, seq, ... of the inner channel
        return getattr(self._ch, name)

    def send(self, peer, buf, *, phase="", step=0, chunk=0):
        self._ch.send(peer, buf, phase=phase, step=step, chunk=chunk)

    def recv_into(self, peer, out, *, phase="", step=0, chunk=0):
        self._ch.recv_into(peer, out, phase=phase, step=step, chunk=chunk)

    def recv_reduce(self, peer, out, op, *, phase="", step=0, chunk=0):
        self._ch.recv_reduce(peer, out, op, phase=phase, step=step, chunk=chunk)
