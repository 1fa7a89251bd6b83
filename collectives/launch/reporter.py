"""The launcher as a witness: it reaps its workers, so it knows at once that one ended, and
tells the coordinator (`exited {proc, code}`; membership/liveness.py declares the member).

A worker is named by its process key (liveness.process_key: boot id, pid namespace, pid,
start time), taken right after it was started, while its pid surely names it; the member sends
the same key with its address. The message goes on a DEALER that proves the job's member key,
fire and forget: the coordinator answers nothing, and a report that cannot be sent (the
coordinator restarting) only leaves the detection to the other witnesses.
"""

from __future__ import annotations

import zmq

from ..membership.liveness import process_key
from ..membership.protocol import Exited, pack
from ..common import security

CLOSE_LINGER_MS = 1000  # a report still queued at the end gets this long to go out


class ExitReporter:
    def __init__(self, address: str, keys):
        self.ctx = zmq.Context(io_threads=1)
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, CLOSE_LINGER_MS)
        self.sock.setsockopt(zmq.SNDHWM, 1000)
        security.make_client(self.sock, keys)
        self.sock.connect(f"tcp://{address}")
        self.keys: dict[int, str | None] = {}  # pid -> process key

    def started(self, pid: int):
        """Call right after a worker started (its pid cannot be reused before it is reaped)."""
        self.keys[pid] = process_key(pid)

    def ended(self, pid: int, code: int):
        key = self.keys.pop(pid, None)
        if key is None:
            return
        try:
            self.sock.send(pack(Exited(proc=key, code=code)), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # no connection now: the connection and heartbeat witnesses remain

    def close(self):
        self.sock.close()
        self.ctx.term()
