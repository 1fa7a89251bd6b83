"""The coordinator: where ranks find each other, beat their hearts, and change membership.

The messages it serves are listed in protocol.py. Failure detection: a member whose last beat
is older than heartbeat_timeout is declared dead; a diagnosis evicts the culprits; a leave
removes the leaver. Each declaration is sent to every other member's heartbeat thread as
`failure {generation, failed_ranks, reason}` (their current and next operations raise
PeerFailure) and to the removed member as `evicted`.

Nothing from outside is trusted (docs/security.md): the socket is a CURVE server that admits
only clients that know the job's server key, and binds each message to the member id of the
key its connection proved (identity.py; transport/zmq/security.py); every message is checked
field by field before a handler sees it (validate.py); the periodic work logs and goes on
whatever a message did; the tables keyed by what arrives are bounded and pruned (tables.py).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque

import zmq

from ..common import config
from ..common import secret as shared
from ..common.throttle import Throttle
from ..transport.zmq import security
from . import identity, tables, validate
from .formation import Formation
from .liveness import Liveness
from .protocol import pack, unpack
from .recovery import Recovery
from .regroup import Regroup
from .slowlinks import SlowLinks
from .verdicts import Verdicts

log = logging.getLogger("collectives")
MAX_MESSAGE = 1 << 20  # bytes of one request; ZeroMQ drops a connection that sends more

# How often the heartbeat clocks of all members are looked at. Once per message would cost
# O(members) per beat, O(members^2) per interval: 1,000 members beating every 0.5 s kept half a
# core busy (bench/studies/coordinator_load.py). Detection is late by at most this much.
HEARTBEAT_CHECK_EVERY = 0.02


class Coordinator:
    """Rendezvous, heartbeat and membership server. Runs on its own thread: start() / stop().
    Restarted at the same address, it rebuilds the job's state from the members (recovery.py).

    It holds the membership state (members, failed, beats, joiners, joined, round, forming,
    generation) and the socket; its parts, each held by reference, serve their own requests
    and read or change that state: liveness (crash witnesses), formation (generation 0,
    spares), verdicts (stall diagnosis, op outcomes), regroup (reconstruct rounds) and
    recovery (a restart)."""

    def __init__(
        self,
        host: str,
        port: int,
        world_size: int,
        heartbeat_interval: float | None = None,
        heartbeat_timeout: float | None = None,
        diagnose_window: float | None = None,
        keys=security.AUTO,
        detect=None,
        min_world_size: int | None = None,
    ):
        """heartbeat_interval / heartbeat_timeout: default $COLLECTIVES_HEARTBEAT_INTERVAL /
        _TIMEOUT, else 0.5 s / 5 s. keys: the job's security.JobKeys, None (insecure), or AUTO:
        the environment's, else a secret of its own, published for this user's processes on
        this host (common/secret.py, keyed by the port). detect: the crash witnesses besides
        heartbeats (liveness.py; default $COLLECTIVES_FAILURE_DETECTION, else all).
        min_world_size: generation 0 may form without ranks that died before it did, down to
        this many (formation.py; default world_size: a replacement takes their place)."""
        if world_size < 1:
            raise ValueError(f"coordinator: world_size must be >= 1, got {world_size}")
        heartbeat_interval = config.heartbeat_interval(heartbeat_interval)
        heartbeat_timeout = config.heartbeat_timeout(heartbeat_timeout)
        config.raise_open_files()  # idle connections from anyone must not starve it of fds
        self.world_size = world_size
        self.heartbeat_timeout = heartbeat_timeout
        self.keys = security.resolve(keys)
        self.published = None  # the key of the secret file this coordinator wrote
        self.ctx = zmq.Context(io_threads=1)
        self.guard = None
        if self.keys is not None:  # before the socket binds: without it any key gets in
            # any key that completes a handshake (it knows the server's key: it holds the
            # secret), each connection named after the member id its own key gives
            self.guard = security.Guard(
                self.ctx,
                {},
                f"coordinator at {host}:{port or 'any port'}",
                name=identity.connection_name,
            )
        self.sock = self.ctx.socket(zmq.ROUTER)
        security.make_server(self.sock, self.keys)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
        self.sock.setsockopt(zmq.LINGER, 0)
        # crash witnesses (liveness.py); its socket monitor serves the guard too
        self.liveness = Liveness(self, config.failure_detection(detect))
        try:
            if port == 0:
                port = self.sock.bind_to_random_port(f"tcp://{host}")
            else:
                self.sock.bind(f"tcp://{host}:{port}")
            if self.keys is not None and self.keys.origin == "generated":
                # for this user's other processes on this host (the ranks of a job whose
                # rank 0 hosts this coordinator): common/secret.py
                self.published = f"coordinator-{port}"
                shared.publish(self.published, self.keys.secret)
        except BaseException:
            self._close()
            raise
        self.address, self.port = f"{host}:{port}", port
        if self.guard is not None:
            self.guard.who = f"coordinator at {self.address}"
        self.warn = Throttle()
        self.generation = self.tried = 0  # tried: highest generation number handed out
        # The last attempt to form a generation failed: the members have closed their groups,
        # so the next round must form a new generation even if nobody else changed.
        self.dissolved = False
        self.joined: dict[
            int, tuple[bytes, str, dict]
        ] = {}  # generation 0: rank -> (ident, mid, info)
        self.members: list[str] | None = None  # current generation, by rank
        self.failed: dict[str, str] = {}  # mid -> reason, this generation
        self.beats: dict[str, tuple[bytes, float, dict]] = {}  # mid -> (hb ident, time, state)
        self.joiners: dict[str, bytes] = {}  # mid -> ident, waiting to be admitted
        self.round: dict | None = None  # reconstruct barrier in progress
        self.forming: dict | None = None  # new generation collecting addresses
        # (time, what happened), for logs and tests: the last MAX_EVENTS
        self.events: deque[tuple[float, str]] = deque(maxlen=tables.MAX_EVENTS)
        self._stop, self._thread = threading.Event(), None
        self._checked_at = 0.0  # last _check_heartbeats (monotonic)
        self.formation = Formation(self, min_world_size)
        self.verdicts = Verdicts(self, diagnose_window or max(0.3, 2 * heartbeat_interval))
        self.regroup = Regroup(self)
        self.recovery = Recovery(self)
        # fail-slow (slowlinks.py): narrow hooks, not the server's tables
        self.slowlinks = SlowLinks(
            config.failslow_policy(),
            self._to_members,
            self._warn_note,
            lambda rank, why: self._declare([self.members[rank]], why) if self.members else None,
            lambda: bool(self.joiners),
        )
        # request type (protocol.REQUESTS) -> the part that serves it
        self.handlers = {
            "join": self._on_join,
            "status": self._on_status,
            "beat": self._on_beat,
            "state": self._on_state,
            "leave": self._on_leave,
            "diagnose": self.verdicts.on_diagnose,
            "probed": self.verdicts.on_probed,
            "outcome": self.verdicts.on_outcome,
            "progress": self.verdicts.on_progress,
            "join_request": self.regroup.on_join_request,
            "reconstruct": self.regroup.on_reconstruct,
            "address": self.regroup.on_address,
            "rejoin": self.recovery.on_rejoin,
            "exited": self.liveness.on_exited,
            "sched_ack": self._on_sched_ack,  # fail-slow hook
        }

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self):
        # The thread owns the socket: it closes it when its loop ends (serve_forever), so
        # stop() never touches the socket from another thread while the loop may still use it.
        self._thread = threading.Thread(
            target=self.serve_forever, name="collectives-coordinator", daemon=True
        )
        self._thread.start()
        return self

    def request_stop(self):
        """Make serve_forever() return within 50 ms (it then closes its socket). Only sets a
        flag: safe from a signal handler."""
        self._stop.set()

    def stop(self, timeout: float = 5.0):
        """End the loop; its thread closes the socket. Bounded: a loop that does not end within
        `timeout` is logged and left to end by itself (the thread is a daemon)."""
        self.request_stop()
        if self._thread is None:
            self._close()
            return
        self._thread.join(timeout=timeout)
        if self._thread.is_alive():
            log.warning(
                "coordinator: the loop did not stop within %g s; its socket closes when it does",
                timeout,
            )

    def linger(self, poll: float = 0.1):
        """Block while the job still has live members, serving them (on the loop's thread):
        for a process that hosts the coordinator and is done with the group itself -- rank 0
        evicted by a stall, say -- while the others go on. Bounded: every live member either
        leaves (destroy) or misses its heartbeats."""
        if self._thread is None or not self._thread.is_alive() or not self._live():
            return
        print(
            f"[collectives] this process hosts the coordinator: serving the job's "
            f"{len(self._live())} live rank(s) until they finish",
            file=sys.stderr,
            flush=True,
        )
        while self._thread.is_alive() and self._live():
            time.sleep(poll)

    def serve_forever(self):
        try:
            self._loop()
        finally:
            self._close()

    def _close(self):
        """Close the socket (from the thread that owns it), its ZAP handler first, and take
        back the secret this coordinator published."""
        if self.guard is not None:
            self.guard.stop()
        if getattr(self, "liveness", None) is not None:
            self.liveness.close()
        self.sock.close(linger=0)
        self.ctx.term()
        if self.published is not None:
            shared.unpublish(self.published, self.keys.secret)
            self.published = None

    def _note(self, what: str):
        self.events.append((time.time(), what))
        log.info("coordinator: %s", what)

    def _warn_note(self, what: str):  # fail-slow: a slow link is worth a warning
        self.events.append((time.time(), what))
        log.warning("coordinator: %s", what)

    def _to_members(self, msg: dict):  # fail-slow: to every live member's heartbeat socket
        for m in self._live():
            hb = self.beats.get(m)
            if hb and hb[0]:
                self._send(hb[0], msg)

    # --- the loop ------------------------------------------------------------------------------
    def _loop(self):
        while not self._stop.is_set():
            try:
                if self.liveness.poll(20):  # also connection events, pidfds (liveness.py)
                    frames = self.liveness.recv()
                    proved = None if self.keys is None else self.liveness.proved or b""
                    self.handle(frames, proved)
            except zmq.ZMQError as exc:  # out of file descriptors, say: serve on regardless
                if exc.errno == zmq.ETERM:
                    return
                self.warn("zmq", "coordinator: %s; serving on", exc)
                time.sleep(0.01)
            self.tick()

    def handle(self, frames, proved: bytes | None = None):
        """Serve one message (a list of frames off the socket). Whatever it holds, this logs
        (rate-limited) and returns: a message never ends the loop. proved: the member id its
        connection proved (identity.py); None for a caller in this process."""
        if len(frames) != 2:
            self.warn("frames", "coordinator dropped a message of %d frames", len(frames))
            return
        ident, raw = frames
        msg = unpack(raw)
        if msg is None:
            self.warn("malformed", "coordinator dropped a malformed message from %r", ident[:32])
            return
        try:
            msg = validate.check(msg, tables.max_ranks(self))
        except validate.Invalid as exc:
            self.warn("invalid", "coordinator dropped an invalid message: %s", exc)
            if msg.get("t") in tables.ANSWERED:  # a request waits for an answer: say why
                self._send(ident, {"t": "error", "message": f"invalid request: {exc}"})
            return
        if not identity.speaks_for_itself(msg, proved):
            self.warn(
                "impostor",
                "coordinator dropped a %r message naming member %s from "
                "a connection that proved member %r",
                msg["t"],
                msg["mid"],
                proved[:40],
            )
            return
        handler = self.handlers.get(msg["t"])
        if handler is not None and self.recovery.stranger(msg):
            return  # restarted, and this member has not re-registered yet (recovery.py)
        if handler is None:
            self.warn("type", "coordinator dropped a message of unknown type %r", msg["t"])
            return
        try:
            handler(ident, msg)
        except Exception as exc:  # a bad message must not kill the coordinator
            log.warning("coordinator: bad %r message: %s", msg.get("t"), exc, exc_info=True)

    def tick(self):
        """The periodic work, each part on its own: one that fails is logged, not fatal. The
        heartbeat clocks are looked at every HEARTBEAT_CHECK_EVERY s, not after every message:
        with 1,000 members beating, that check was most of the coordinator's time."""
        now = time.monotonic()
        self.recovery.forgive_pause(now)  # a coordinator's pause is nobody's death
        periodic = [
            self.liveness.check,
            self.verdicts.finish_diagnoses,
            self.verdicts.finish_outcomes,
            self.regroup.check_round,
            self._prune,
            self.recovery.end_recovery,
            self.slowlinks.tick,  # fail-slow hook
        ]
        if now - self._checked_at >= HEARTBEAT_CHECK_EVERY:
            self._checked_at = now
            periodic.insert(0, self._check_heartbeats)
        for work in periodic:
            try:
                work()
            except Exception as exc:
                self.warn(work.__name__, "coordinator: %s failed: %r", work.__name__, exc)
                log.debug("coordinator: %s failed", work.__name__, exc_info=True)

    def _prune(self):
        tables.prune(self, time.monotonic())

    def _send(self, ident: bytes, msg: dict):
        try:
            self.sock.send_multipart([ident, pack(msg)], zmq.NOBLOCK)
        except zmq.Again:  # that peer takes nothing (its queue is full): it gets nothing
            self.warn("send", "coordinator: a client's queue is full; a message to it was dropped")

    def _rank_of(self, mid):
        return self.members.index(mid) if self.members and mid in self.members else None

    def _live(self):
        return [m for m in (self.members or []) if m not in self.failed]

    def _forming_has(self, mid):
        return self.forming is not None and mid in self.forming["members"]

    # --- generation 0 --------------------------------------------------------------------------
    def _on_join(self, ident, msg):
        rank, size, mid = int(msg["rank"]), int(msg["world_size"]), msg["mid"]
        problem = None
        if size != self.world_size:
            problem = (
                f"rank {rank} joined with world_size {size}, but the job has world_size "
                f"{self.world_size}"
            )
        elif not 0 <= rank < self.world_size:
            problem = f"rank {rank} is out of range for world_size {self.world_size}"
        elif self.members is not None:
            problem = (
                f"rank {rank} joined after the group was formed; a replacement worker "
                "joins with init_process_group(join=True)"
            )
        elif rank in self.joined and self.joined[rank][1] != mid:
            problem = (
                f"rank {rank} joined twice (pids {self.joined[rank][2].get('pid')} and "
                f"{msg['info'].get('pid')}): two workers were given the same RANK"
            )
        if problem:
            self._send(ident, {"t": "error", "message": problem})
            return
        self.joined[rank] = (ident, mid, msg["info"])
        self.liveness.learn(mid, msg["info"])
        self.formation.form_or_fill()  # once every rank is there

    def _on_status(self, ident, msg):
        missing = [r for r in range(self.world_size) if r not in self.joined]
        self._send(
            ident,
            {
                "t": "status",
                "missing": missing,
                "generation": self.generation,
                "world_size": len(self.members or []),
                "failslow": self.slowlinks.status(),
            },
        )

    # --- heartbeats and failures ---------------------------------------------------------------
    def _on_beat(self, ident, msg):
        mid = msg["mid"]
        self.liveness.beat(mid, ident)  # before the table changes: it compares
        self.beats[mid] = (ident, time.monotonic(), msg)
        self.verdicts.learn(mid, msg)  # of the ops whose outcome is asked
        if (
            self.members is not None
            and mid not in self.members
            and mid not in self.joiners
            and not self._forming_has(mid)
        ):
            self._send(
                ident, {"t": "evicted", "reason": f"not a member of generation {self.generation}"}
            )
        elif mid in self.failed:
            self._send(ident, {"t": "evicted", "reason": self.failed[mid]})
        elif msg.get("links") and (rank := self._rank_of(mid)) is not None:  # fail-slow hook
            self.slowlinks.on_beat(self.generation, len(self.members or ()), rank, msg)

    def _on_sched_ack(self, ident, msg):  # fail-slow hook: an answer to a proposed schedule
        rank = self._rank_of(msg["mid"])
        if rank is not None:
            self.slowlinks.on_ack(self.generation, rank, msg)

    def _on_state(self, ident, msg):
        self._on_beat(ident, msg)
        rank = self._rank_of(msg["mid"])
        if rank is not None:
            self.verdicts.take_state(rank, msg)

    def _check_heartbeats(self):
        if self.members is None:
            return
        now = time.monotonic()
        dead = [
            m
            for m in self._live()
            if now - self.beats.get(m, (b"", now, {}))[1] > self.heartbeat_timeout
        ]
        if dead:
            self._declare(dead, f"sent no heartbeat for {self.heartbeat_timeout:g} s")
        for m in [
            m
            for m in self.joiners
            if now - self.beats.get(m, (b"", now, {}))[1] > self.heartbeat_timeout
        ]:
            del self.joiners[m]
            self._note("a waiting replacement worker went quiet and was forgotten")

    def _declare(self, mids, reason: str, graceful: bool = False, op: int | None = None):
        """Remove members from the current generation and tell everybody. `graceful`: they
        left on purpose (leave, destroy, SIGTERM), after sending everything they had to.
        `op`: they stalled that op (a diagnosis): the others raise PeerTimeout, as the rank
        whose deadline fired first does, not a plain PeerFailure."""
        mids = [m for m in mids if m in self._live()]
        if not mids:
            return
        for m in mids:
            self.failed[m] = reason
        ranks = sorted(self._rank_of(m) for m in mids)
        self._note(f"generation {self.generation}: rank(s) {ranks} removed: {reason}")
        notice = {
            "t": "failure",
            "generation": self.generation,
            "failed_ranks": ranks,
            "reason": reason,
            "graceful": graceful,
            "op": op,
        }
        for m in self._live():
            hb = self.beats.get(m)
            if hb and hb[0]:
                self._send(hb[0], notice)
        for m in mids:
            hb = self.beats.get(m)
            if hb and hb[0]:
                self._send(hb[0], {"t": "evicted", "reason": reason})
            # one that waits in reconstruct() (say it left from a signal handler meanwhile)
            # gets its answer now, not a timeout after the round
            asked = self.round["asked"].pop(m, None) if self.round is not None else None
            if asked is not None:
                self._send(asked, {"t": "evicted", "reason": reason})

    def _on_leave(self, ident, msg):
        mid = msg["mid"]
        if mid in self.joiners:
            del self.joiners[mid]
            self._note(f"a waiting replacement worker withdrew (pid {msg.get('pid')})")
        elif self._forming_has(mid) and mid not in self._live():
            # an admitted joiner that gives up before the generation formed: the formation
            # fails now, not at a heartbeat timeout
            self.forming["gone"].add(mid)
        else:
            self._declare([mid], "left the group", graceful=True)
        self._send(ident, {"t": "bye"})
