"""The coordinator: where ranks find each other, beat their hearts, and learn whom to blame.

One coordinator serves a job. `python -m collectives.launch` hosts it; otherwise rank 0 starts
one in-process when nothing is listening at MASTER_ADDR:MASTER_PORT (then rank 0's death cannot
be survived). It speaks msgpack over a ZeroMQ ROUTER socket:

  join      {rank, world_size, info}        -> welcome {generation, infos} once all have joined
  beat      {rank, generation, seq, in_op, waiting_on}   (every heartbeat_interval, own socket)
  diagnose  {rank, generation, seq, waiting_on}  -> verdict {culprits, why}: the coordinator
            pings every rank's heartbeat thread for a fresh (seq, in_op, waiting_on), waits a
            short window, and applies diagnose.blame -- the same verdict for every asker.
  ping -> state                              (coordinator to a heartbeat thread and back)
"""
from __future__ import annotations

import logging
import os
import threading
import time

import msgpack
import zmq

from . import diagnose
from .errors import CollectiveError, CollectiveTimeout

log = logging.getLogger("collectives")

DEFAULT_HEARTBEAT_INTERVAL = 0.5
DEFAULT_HEARTBEAT_TIMEOUT = 5.0


def _pack(msg: dict) -> bytes:
    return msgpack.packb(msg)


def _unpack(raw: bytes):
    try:
        msg = msgpack.unpackb(raw)
    except Exception:
        return None
    return msg if isinstance(msg, dict) and isinstance(msg.get("t"), str) else None


class Coordinator:
    """Rendezvous and heartbeat server. Runs on its own thread: start() / stop()."""

    def __init__(self, host: str, port: int, world_size: int,
                 heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
                 diagnose_window: float | None = None):
        if world_size < 1:
            raise ValueError(f"coordinator: world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.generation = 0
        self.diagnose_window = diagnose_window or max(0.3, 2 * heartbeat_interval)
        self.ctx = zmq.Context(io_threads=1)
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        try:
            if port == 0:
                port = self.sock.bind_to_random_port(f"tcp://{host}")
            else:
                self.sock.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError:
            self.sock.close()
            self.ctx.term()
            raise
        self.address = f"{host}:{port}"
        self.port = port
        self.joined: dict[int, tuple[bytes, dict]] = {}   # rank -> (identity, info)
        self.members: list[dict] | None = None
        self.beats: dict[int, tuple[bytes, float, dict]] = {}  # rank -> (hb identity, time, state)
        self.diagnoses: dict[tuple, dict] = {}             # (generation, seq) -> pending verdict
        self._stop = threading.Event()
        self._thread = None

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self):
        self._thread = threading.Thread(target=self._loop, name="collectives-coordinator",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sock.close(linger=0)
        self.ctx.term()

    def serve_forever(self):
        try:
            self._loop()
        finally:
            self.sock.close(linger=0)
            self.ctx.term()

    # --- the loop ------------------------------------------------------------------------------
    def _loop(self):
        while not self._stop.is_set():
            if self.sock.poll(50):
                frames = self.sock.recv_multipart()
                if len(frames) != 2:
                    log.warning("coordinator dropped a message of %d frames", len(frames))
                    continue
                ident, raw = frames
                msg = _unpack(raw)
                if msg is None:
                    log.warning("coordinator dropped a malformed message from %r", ident[:32])
                    continue
                handler = getattr(self, "_on_" + msg["t"], None)
                if handler is None:
                    log.warning("coordinator dropped a message of unknown type %r", msg["t"])
                    continue
                try:
                    handler(ident, msg)
                except Exception as exc:  # a bad message must not kill the coordinator
                    log.warning("coordinator: bad %r message: %s", msg.get("t"), exc)
            self._finish_diagnoses()

    def _send(self, ident: bytes, msg: dict):
        self.sock.send_multipart([ident, _pack(msg)])

    def _on_join(self, ident, msg):
        rank, size = int(msg["rank"]), int(msg["world_size"])
        if size != self.world_size:
            self._send(ident, {"t": "error", "message":
                               f"rank {rank} joined with world_size {size}, but the job has "
                               f"world_size {self.world_size}"})
            return
        if not 0 <= rank < self.world_size:
            self._send(ident, {"t": "error", "message":
                               f"rank {rank} is out of range for world_size {self.world_size}"})
            return
        if self.members is not None:
            self._send(ident, {"t": "error", "message":
                               f"rank {rank} joined after the group was formed"})
            return
        old = self.joined.get(rank)
        if old is not None and old[1].get("pid") != msg["info"].get("pid"):
            self._send(ident, {"t": "error", "message":
                               f"rank {rank} joined twice (pids {old[1].get('pid')} and "
                               f"{msg['info'].get('pid')}): two workers were given the same RANK"})
            return
        self.joined[rank] = (ident, msg["info"])
        if len(self.joined) == self.world_size:
            self.members = [self.joined[r][1] for r in range(self.world_size)]
            for r in range(self.world_size):
                self._send(self.joined[r][0], {"t": "welcome", "generation": self.generation,
                                               "infos": self.members})

    def _on_status(self, ident, msg):
        missing = [r for r in range(self.world_size) if r not in self.joined]
        self._send(ident, {"t": "status", "missing": missing})

    def _on_beat(self, ident, msg):
        self.beats[int(msg["rank"])] = (ident, time.monotonic(), msg)

    def _on_state(self, ident, msg):
        rank = int(msg["rank"])
        self.beats[rank] = (ident, time.monotonic(), msg)
        for d in self.diagnoses.values():
            d["states"][rank] = {"seq": msg["seq"], "in_op": msg["in_op"],
                                 "waiting_on": msg["waiting_on"]}

    def _on_diagnose(self, ident, msg):
        key = (msg["generation"], msg["seq"])
        d = self.diagnoses.get(key)
        if d is None:
            d = {"askers": [], "states": {}, "until": time.monotonic() + self.diagnose_window}
            self.diagnoses[key] = d
            for rank, (hb_ident, _, _) in self.beats.items():
                self._send(hb_ident, {"t": "ping"})
        d["askers"].append(ident)
        d["states"][int(msg["rank"])] = {"seq": msg["seq"], "in_op": True,
                                         "waiting_on": msg["waiting_on"]}

    def _finish_diagnoses(self):
        now = time.monotonic()
        for key in [k for k, d in self.diagnoses.items()
                    if now >= d["until"] or len(d["states"]) == self.world_size]:
            d = self.diagnoses.pop(key)
            culprits, why = diagnose.blame(key[1], d["states"], self.world_size)
            for ident in d["askers"]:
                self._send(ident, {"t": "verdict", "culprits": culprits, "why": why})


class CoordinatorClient:
    """A rank's link to the coordinator: join, heartbeats (own thread), diagnosis."""

    def __init__(self, address: str, rank: int, world_size: int,
                 heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL):
        self.address = address
        self.rank = rank
        self.world_size = world_size
        self.heartbeat_interval = heartbeat_interval
        self.ctx = zmq.Context(io_threads=1)
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://{address}")
        self._hb_thread = None
        self._stop = threading.Event()
        self.transport = None

    def _request(self, msg: dict, want: str, timeout: float):
        self.sock.send(_pack(msg))
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.sock.poll(int(remaining * 1000) + 1):
                return None
            reply = _unpack(self.sock.recv())
            if reply is None:
                continue
            if reply["t"] == "error":
                raise CollectiveError(f"rendezvous at {self.address}: {reply['message']}",
                                      op="init_process_group", rank=self.rank)
            if reply["t"] == want:
                return reply

    def join(self, info: dict, timeout: float) -> tuple[int, list[dict]]:
        """Block until all world_size ranks have joined; return (generation, infos)."""
        info = dict(info, pid=os.getpid())
        reply = self._request({"t": "join", "rank": self.rank, "world_size": self.world_size,
                               "info": info}, "welcome", timeout)
        if reply is None:
            status = self._request({"t": "status"}, "status", 1.0)
            if status is None:
                raise CollectiveTimeout(
                    f"init_process_group: rank {self.rank} got no answer from the coordinator at "
                    f"{self.address} within {timeout:g} s (is MASTER_ADDR/MASTER_PORT right, and "
                    "is rank 0 or the launcher running?)", op="init_process_group",
                    rank=self.rank)
            missing = status["missing"]
            raise CollectiveTimeout(
                f"init_process_group: rank {self.rank} timed out after {timeout:g} s waiting for "
                f"rank(s) {', '.join(map(str, missing))} to join at {self.address}",
                op="init_process_group", rank=self.rank, peer=missing[0] if missing else None)
        return reply["generation"], reply["infos"]

    def diagnose(self, seq: int, waiting_on):
        """Ask whom to blame for op `seq` stalling. Same verdict on every rank that asks."""
        t = self.transport
        reply = self._request({"t": "diagnose", "rank": self.rank, "seq": seq,
                               "generation": t.generation if t else 0,
                               "waiting_on": waiting_on}, "verdict",
                              timeout=max(2.0, 4 * self.heartbeat_interval))
        if reply is None:
            raise TimeoutError("no verdict from the coordinator")
        return reply["culprits"], reply["why"]

    # --- heartbeats ----------------------------------------------------------------------------
    def start_heartbeat(self, transport):
        self.transport = transport
        self._hb_thread = threading.Thread(target=self._beat_loop, daemon=True,
                                           name=f"collectives-heartbeat-{self.rank}")
        self._hb_thread.start()

    def _state(self, t):
        return {"rank": self.rank, "generation": t.generation, "seq": t.seq,
                "in_op": t.in_op, "waiting_on": t.waiting_on}

    def _beat_loop(self):
        # Its own socket: zmq sockets belong to one thread.
        hb = self.ctx.socket(zmq.DEALER)
        hb.setsockopt(zmq.LINGER, 0)
        hb.connect(f"tcp://{self.address}")
        t = self.transport
        try:
            next_beat = 0.0
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_beat:
                    hb.send(_pack(dict(self._state(t), t="beat")))
                    next_beat = now + self.heartbeat_interval
                if hb.poll(int(max(0.0, next_beat - now) * 1000) + 1):
                    msg = _unpack(hb.recv())
                    if msg is not None and msg["t"] == "ping":
                        hb.send(_pack(dict(self._state(t), t="state")))
        finally:
            hb.close(linger=0)

    def close(self):
        self._stop.set()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=5)
        self.sock.close(linger=0)
        self.ctx.term()
