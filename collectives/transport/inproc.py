"""In-process transport: one thread per rank, one queue per rank. For tests and teaching.

Frames are copied when sent (as a network would), so a rank can never see another rank's
buffer change under it. Delivery order per (src, dst) pair is FIFO, as over ZeroMQ, and the
same OpChannel logic vets every frame, so a schedule that works here works over sockets.
"""
from __future__ import annotations

import queue
import threading

from .. import diagnose
from .base import Transport


class InprocWorld:
    """The shared medium: a mailbox per rank and a progress board for diagnosis."""

    def __init__(self, size: int, generation: int = 0):
        self.size = size
        self.generation = generation
        self.mailboxes = [queue.Queue() for _ in range(size)]
        self.transports: list[InprocTransport | None] = [None] * size
        self.lock = threading.Lock()
        # Every stall diagnosis made in this world: (seq, states, culprits, why), for teaching
        # (stall_story.py draws who waited on whom and why the culprit was blamed).
        self.diagnoses: list[tuple] = []

    def transport(self, rank: int) -> "InprocTransport":
        with self.lock:
            t = InprocTransport(self, rank)
            self.transports[rank] = t
            return t


class InprocTransport(Transport):
    def __init__(self, world: InprocWorld, rank: int):
        super().__init__()
        self.world = world
        self.rank = rank
        self.size = world.size
        self.generation = world.generation
        self.mailbox = world.mailboxes[rank]
        self.closed = False

    def post(self, peer, header, payload, zero_copy):
        # bytes() copies: a send never aliases the sender's memory.
        self.world.mailboxes[peer].put((self.rank, header, bytes(memoryview(payload).cast("B"))))
        return None

    def wait_any(self, timeout):
        try:
            return self.mailbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def diagnose(self, seq, waiting_on):
        states = {}
        for r, t in enumerate(self.world.transports):
            if t is None or t.closed:
                states[r] = None
            else:
                states[r] = {"seq": t.seq, "in_op": t.in_op, "waiting_on": t.waiting_on,
                             "sent": t.sent_counts, "recv": t.recv_counts}
        culprits, why = diagnose.blame(seq, states, self.size)
        with self.world.lock:
            self.world.diagnoses.append((seq, states, culprits, why))
        return culprits, why, False

    def close(self, linger: float = 0.0):
        self.closed = True
