"""The loopback limit: what raw pyzmq moves between the same processes, with no library on top.

Each rank binds one PULL socket and PUSHes to its ring successor, over the same kind of socket
the library uses (tcp or ipc). To measure a collective of S bytes, every rank sends
busbw_factor x S bytes to its successor while receiving as many from its predecessor, in
segments, zero-copy, into place (recv_into), with no headers, reduction or ordering between
steps. So its busbw is the bus bandwidth a ring of raw sockets sustains, the ceiling for any
algorithm whose busbw is defined the nccl-tests way; its time at tiny sizes is one one-way hop,
the floor under any collective's latency (for 2 ranks; larger groups need more hops).
The harness runs it with several segment sizes (SEGMENTS) and reports the best at each size,
so the limit is not an artefact of one segment size that happens to suit this machine badly.

The same sockets also give the harness a barrier that involves no backend under test.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np
import zmq

SEGMENTS = (256 << 10, 1 << 20, 4 << 20)   # pyzmq peaks somewhere around a few MiB per message
ZERO_COPY = 1 << 16     # below this, copying into a zmq message is cheaper than tracking a buffer


class RawRing:
    def __init__(self, rank: int, size: int, transport: str = "tcp", timeout: float = 60.0):
        self.rank, self.size = rank, size
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.push = self.ctx.socket(zmq.PUSH)
        for s in (self.pull, self.push):
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))   # every wait has a deadline
            s.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
        self._ipc_path = None
        if transport == "ipc":
            self._ipc_path = os.path.join(tempfile.gettempdir(),
                                          f"bench-limit-{os.getpid()}-{rank}.sock")
            self.address = "ipc://" + self._ipc_path
            self.pull.bind(self.address)
        else:
            port = self.pull.bind_to_random_port("tcp://127.0.0.1")
            self.address = f"tcp://127.0.0.1:{port}"
        self._src = np.empty(0, np.uint8)
        self._dst = np.empty(0, np.uint8)
        self._token = np.zeros(1, np.uint8)

    def connect(self, addresses: list[str]):
        self.push.connect(addresses[(self.rank + 1) % self.size])
        self.barrier()   # the first messages also prove every link is up

    def _recv(self, out: np.ndarray, what: str):
        try:
            got = self.pull.recv_into(out)
        except zmq.Again:
            raise TimeoutError(f"bench limit: rank {self.rank} timed out waiting for rank "
                               f"{(self.rank - 1) % self.size} ({what})") from None
        if got != out.nbytes:
            raise RuntimeError(f"bench limit: rank {self.rank} got {got} bytes, expected "
                               f"{out.nbytes} ({what})")

    def barrier(self):
        """A token goes round the ring twice: after the first lap everyone has arrived, the
        second lets everyone go. 2n one-way hops; used only outside timed regions."""
        for _ in range(2):
            if self.rank == 0:
                self.push.send(self._token)
                self._recv(self._token, "barrier")
            else:
                self._recv(self._token, "barrier")
                self.push.send(self._token)

    def exchange(self, nbytes: int, segment: int = 1 << 20):
        """Send nbytes to the successor and receive nbytes from the predecessor, segmented."""
        nbytes = max(int(nbytes), 1)
        if self._src.nbytes < nbytes:
            self._src = np.ones(nbytes, np.uint8)
            self._dst = np.empty(nbytes, np.uint8)
        bounds = [(s, min(s + segment, nbytes)) for s in range(0, nbytes, segment)]
        for s, e in bounds:   # all sends queue at once: ZeroMQ's I/O thread does the rest
            self.push.send(self._src[s:e], copy=(e - s) < ZERO_COPY)
        for s, e in bounds:
            self._recv(self._dst[s:e], "exchange")

    def close(self):
        self.pull.close(0)
        self.push.close(2000)   # let the last frames reach a peer that still waits for them
        self.ctx.term()
        if self._ipc_path and os.path.exists(self._ipc_path):
            os.unlink(self._ipc_path)
