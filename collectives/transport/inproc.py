"""In-process transport: one thread per rank, one queue per rank. For tests and teaching.

Frames are copied when sent (as a network would), so a rank can never see another rank's
buffer change under it. Delivery order per (src, dst) pair is FIFO, as over ZeroMQ, and the
same OpChannel logic vets every frame, so a schedule that works here works over sockets.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from .base import Frame, Progress, Prober, Transport

PROBE_WINDOW = 1.0  # seconds a modelled probe round listens (see probe)

# rank -> its progress (Progress) or None (gone): what a stall is judged on
States = dict[int, "Progress | None"]
Heard = dict[int, "dict[int, float | None]"]  # rank -> {peer: seconds until heard, or None}
# blame(seq, states, world_size, probe) -> (culprits, why): membership/diagnose.py's
Blame = Callable[[int, States, int, Callable[[], Heard]], tuple[list[int], str]]


class InprocWorld:
    """The shared medium: a mailbox per rank, and every rank's progress for diagnosis.

    blame: (seq, states, world_size, probe) -> (culprits, why), e.g.
    membership.diagnose.blame; given one, the world judges a stalled op on every rank's
    progress (as the coordinator does) when a rank's group asks it (diagnose: the world is
    the judge handed to each rank's ProcessGroup, group/judge.py); a group without a judge
    blames the rank waited on. Where that picture ties, it
    calls probe() for link evidence: here a model of the coordinator's probe round
    (linkprobe.py) read off the injected link faults -- a probe over a link that drops its
    frames, or holds them for PROBE_WINDOW s or more, is not heard.

    hosts: the host of each rank (any labels), for teaching hierarchical schedules on one
    machine: [0, 0, 1, 1] plays two hosts of two ranks. Default: all on one host."""

    def __init__(
        self,
        size: int,
        generation: int = 0,
        blame: Blame | None = None,
        hosts: Sequence[Hashable] | None = None,
    ):
        if hosts is not None and len(hosts) != size:
            raise ValueError(
                f"hosts: one host per rank expected ({size}), got {len(hosts)}: {list(hosts)!r}"
            )
        self.size = size
        self.generation = generation
        self.blame = blame
        self.hosts = None if hosts is None else list(hosts)
        self.mailboxes: list[queue.Queue[Frame]] = [queue.Queue() for _ in range(size)]
        self.transports: list[InprocTransport | None] = [None] * size
        self.lock = threading.Lock()
        # Every stall diagnosis made in this world: (seq, states, culprits, why), for teaching
        # (teaching/stall.py draws who waited on whom and why the culprit was blamed).
        self.diagnoses: list[tuple[int, States, list[int], str]] = []
        # The probe rounds those diagnoses asked for: (seq, {rank: {peer: seconds or None}}).
        self.probes: list[tuple[int, Heard]] = []

    def transport(self, rank: int) -> "InprocTransport":
        with self.lock:
            t = InprocTransport(self, rank)
            self.transports[rank] = t
            return t

    def probe(self, states: States) -> Heard:
        """What a probe round would report, from the injected link faults: rank r ->
        {peer p: seconds until p's probe arrived, or None}. Ranks with no state (gone) and
        ranks not inside an op (they would not be probing) take no part."""
        part = [r for r, s in states.items() if s is not None and s.in_op]
        heard: Heard = {}
        for r in part:
            t = self.transports[r]
            faults = t.link_faults if t is not None else {}
            row: dict[int, float | None] = {}
            for p in part:
                if p == r:
                    continue
                kind, seconds = faults.get(p, ("none", 0.0))
                held = kind == "drop" or (kind == "delay" and seconds >= PROBE_WINDOW)
                row[p] = None if held else (seconds if kind == "delay" else 0.0)
            heard[r] = row
        return heard

    def diagnose(
        self,
        seq: int,
        waiting_on: int | None,
        *,
        progress: Progress | None = None,
        prober: Prober | None = None,
        timeout: float | None = None,
    ) -> tuple[list[int], str, bool | str]:
        """Judge a stalled op `seq` on every rank's progress, each read here, the asker's
        `progress` too (nobody is evicted here)."""
        states = {
            r: None if t is None or t.closed else t.progress()
            for r, t in enumerate(self.transports)
        }

        def probe() -> Heard:
            heard = self.probe(states)
            with self.lock:
                self.probes.append((seq, heard))
            return heard

        assert self.blame is not None  # a group is handed the world as judge only with one
        culprits, why = self.blame(seq, states, self.size, probe)
        with self.lock:
            self.diagnoses.append((seq, states, culprits, why))
        return culprits, why, False


class InprocTransport(Transport):
    def __init__(self, world: InprocWorld, rank: int):
        super().__init__()
        self.world = world
        self.rank = rank
        self.size = world.size
        self.generation = world.generation
        self.hosts = world.hosts
        self.mailbox = world.mailboxes[rank]
        self.closed = False

    def post(self, peer: int, header: bytes, payload: Any, zero_copy: bool) -> None:
        # bytes() copies: a send never aliases the sender's memory.
        self.world.mailboxes[peer].put((self.rank, header, bytes(memoryview(payload).cast("B"))))
        return None

    def wait_any(self, timeout: float) -> Frame | None:
        try:
            return self.mailbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self, linger: float = 0.0) -> None:
        self.closed = True
