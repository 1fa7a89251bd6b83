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

With --transport shm the library moves large payloads through shared memory, which the socket
limit does not bound; there the limit is a raw shared-memory ring instead: each segment is copied
once into the sender's arena (collectives/transport/zmq/shm.py, the library's own slots) and once out
of it by the receiver, with only a raw pyzmq message per segment to say it is there. One copy in
and one out is the least any process-to-process transfer of a byte costs.

The same sockets also give the harness a barrier that involves no backend under test.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import zmq

from collectives.transport.zmq import shm

SEGMENTS = (256 << 10, 1 << 20, 4 << 20)  # pyzmq peaks somewhere around a few MiB per message
ARENA_SLOTS = 16  # of max(SEGMENTS) bytes each: as many as the library's own arena has
ZERO_COPY = 1 << 16  # below this, copying into a zmq message is cheaper than tracking a buffer


class RawRing:
    def __init__(self, rank: int, size: int, transport: str = "tcp", timeout: float = 60.0):
        self.rank, self.size = rank, size
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.push = self.ctx.socket(zmq.PUSH)
        for s in (self.pull, self.push):
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))  # every wait has a deadline
            s.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
        self._ipc_path = None
        if transport in ("ipc", "shm"):
            self._ipc_path = os.path.join(
                tempfile.gettempdir(), f"bench-limit-{os.getpid()}-{rank}.sock"
            )
            self.address = "ipc://" + self._ipc_path
            self.pull.bind(self.address)
        else:
            port = self.pull.bind_to_random_port("tcp://127.0.0.1")
            self.address = f"tcp://127.0.0.1:{port}"
        self.timeout = timeout
        self.arena = self.peer_arena = None
        if transport == "shm":
            self.arena = shm.SendArena(max(SEGMENTS), ARENA_SLOTS)
            self.returns = shm.ReturnPage()  # how this rank hands its left's slots back
            self.address = {
                "zmq": self.address,
                "arena": self.arena.describe(),
                "returns": self.returns.describe(),
            }
        self._src = np.empty(0, np.uint8)
        self._dst = np.empty(0, np.uint8)
        self._token = np.zeros(1, np.uint8)
        self._ref = np.zeros(2, np.int64)

    def connect(self, addresses: list):
        right, left = addresses[(self.rank + 1) % self.size], addresses[(self.rank - 1) % self.size]
        if self.arena is not None:
            self.peer_arena = shm.PeerArena(left["arena"], self.returns)
            self.arena.attach(1, right["returns"])
            right = right["zmq"]
        self.push.connect(right)
        self.barrier()  # the first messages also prove every link is up

    def _recv(self, out: np.ndarray, what: str):
        try:
            got = self.pull.recv_into(out)
        except zmq.Again:
            raise TimeoutError(
                f"bench limit: rank {self.rank} timed out waiting for rank "
                f"{(self.rank - 1) % self.size} ({what})"
            ) from None
        if got != out.nbytes:
            raise RuntimeError(
                f"bench limit: rank {self.rank} got {got} bytes, expected {out.nbytes} ({what})"
            )

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
        if self.arena is not None:
            return self._exchange_shm(bounds)
        for s, e in bounds:  # all sends queue at once: ZeroMQ's I/O thread does the rest
            self.push.send(self._src[s:e], copy=(e - s) < ZERO_COPY)
        for s, e in bounds:
            self._recv(self._dst[s:e], "exchange")

    def _exchange_shm(self, bounds):
        """Copy each segment into a slot and say which; copy each arriving one out, free it.
        When every slot is in flight, take a segment from the left first: the right
        neighbour frees ours the same way, so the ring always moves."""
        todo = list(bounds)
        deadline = time.monotonic() + self.timeout
        for s, e in bounds:
            while True:
                put = self.arena.put(self._src[s:e], 1)
                if put is not None:
                    break
                if todo:
                    self._take_shm(todo.pop(0))
                elif time.monotonic() > deadline:
                    raise TimeoutError(
                        f"bench limit: rank {self.rank} found no free slot "
                        f"for {self.timeout:g} s (exchange)"
                    )
                else:
                    time.sleep(50e-6)  # the right neighbour frees ours: leave it the core
            self._ref[:] = put
            self.push.send(self._ref)
        while todo:
            self._take_shm(todo.pop(0))

    def _take_shm(self, bounds):
        s, e = bounds
        self._recv(self._ref, "exchange")
        view = self.peer_arena.view(int(self._ref[0]), int(self._ref[1]))
        if view is None or view.nbytes != e - s:
            raise RuntimeError(f"bench limit: rank {self.rank} got a bad slot {self._ref}")
        np.copyto(self._dst[s:e], view)
        shm.free_slot(view)

    def close(self):
        self.pull.close(0)
        self.push.close(2000)  # let the last frames reach a peer that still waits for them
        self.ctx.term()
        if self.peer_arena is not None:
            self.peer_arena.close()
        if self.arena is not None:
            self.arena.close()
            self.returns.close()
        if self._ipc_path and os.path.exists(self._ipc_path):
            os.unlink(self._ipc_path)
