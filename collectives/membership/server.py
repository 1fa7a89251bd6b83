"""The coordinator: where ranks find each other, beat their hearts, and change membership.

This is the I/O shell around the membership state machine (machine.py): it receives a message,
decodes and checks it, feeds it to the machine, and sends what the machine returns; it runs
the timers (a Tick every loop) and the crash witnesses (liveness.py), whose reports it feeds
in as deaths. Every decision -- who is a member, who failed, which generation forms, whom a
stall blames -- is the machine's. The messages it serves are listed in protocol.py.

Nothing from outside is trusted (docs/security.md): the socket is a CURVE server that admits
only clients that know the job's server key, and binds each message to the member id of the
key its connection proved (identity.py; common/security.py); every message is checked
field by field before a handler sees it (protocol.decode_request); the periodic work logs and goes on
whatever a message did; the tables keyed by what arrives are bounded and pruned (tables.py).
"""

from __future__ import annotations

import errno
import logging
import sys
import threading
import time
from collections import deque
from typing import Any

import zmq

from ..common import config
from ..common import secret as shared
from ..common.throttle import Throttle
from ..common import security
from .clock import REAL, Clock
from . import identity, tables
from .liveness import Liveness
from .machine import HANDLERS, Arrived, Died, Event, Machine, Tick
from .protocol import (
    AnyReply,
    Error,
    Exited,
    Invalid,
    Status,
    decode_request,
    pack,
    request_kind,
    speaks_for_itself,
)
from .state import Effect, FailSlow, Halt, Joined, Mid, Note, Send, State, Watch

log = logging.getLogger("collectives")
MAX_MESSAGE = 1 << 20  # bytes of one request; ZeroMQ drops a connection that sends more

# How often the work that costs O(members) is done -- the heartbeat clocks of all members
# looked at, the tables pruned (a sweep: machine.Tick). Once per message would cost O(members)
# per beat, O(members^2) per interval: 1,000 members beating every 0.5 s kept half a core busy
# (bench/studies/coordinator_load.py). Detection is late by at most this much.
HEARTBEAT_CHECK_EVERY = 0.02
# s: a coordinator started afresh (Coordinator._restart) listens again at its address within
# this; ZeroMQ releases the old listener on its I/O thread, within milliseconds
REBIND_WITHIN = 5.0


class Coordinator:
    """Rendezvous, heartbeat and membership server. Runs on its own thread: start() / stop().
    Restarted at the same address, it rebuilds the job's state from the members (recovery.py).

    It holds the socket, the crash witnesses (liveness) and the membership state machine
    (machine); `state` is the machine's, read-only from here (members, generation, failed...
    are shortcuts to it)."""

    def __init__(
        self,
        host: str,
        port: int,
        world_size: int,
        heartbeat_interval: float | None = None,
        heartbeat_timeout: float | None = None,
        diagnose_window: float | None = None,
        keys: Any = security.AUTO,
        detect: str | None = None,
        min_world_size: int | None = None,
        clock: Clock = REAL,
    ):
        """heartbeat_interval / heartbeat_timeout: default $COLLECTIVES_HEARTBEAT_INTERVAL /
        _TIMEOUT, else 0.5 s / 5 s. keys: the job's security.JobKeys, None (insecure), or AUTO:
        the environment's, else a secret of its own, published for this user's processes on
        this host (common/secret.py, keyed by the port). detect: the crash witnesses besides
        heartbeats (liveness.py; default $COLLECTIVES_FAILURE_DETECTION, else all).
        min_world_size: generation 0 may form without ranks that died before it did, down to
        this many (formation.py; default world_size: a replacement takes their place).
        clock: what the coordinator and its witnesses read; the machine takes `now` from it
        with each event (clock.py)."""
        self.clock = clock
        if world_size < 1:
            raise ValueError(f"coordinator: world_size must be >= 1, got {world_size}")
        heartbeat_interval = config.heartbeat_interval(heartbeat_interval)
        heartbeat_timeout = config.heartbeat_timeout(heartbeat_timeout)
        config.raise_open_files()  # idle connections from anyone must not starve it of fds
        self.world_size = world_size
        self.heartbeat_timeout = heartbeat_timeout
        window = diagnose_window or max(0.3, 2 * heartbeat_interval)

        def fresh() -> State:  # the job's state as a coordinator starts: also after a Halt
            return State(
                world_size=world_size,
                heartbeat_timeout=heartbeat_timeout,
                diagnose_window=window,
                min_world_size=min_world_size,
                failslow=FailSlow(
                    config.failslow_policy(),
                    config.failslow_min_world(world_size),
                    config.failslow_spare_wait(),
                ),
            )

        self._fresh_state = fresh
        self.machine = Machine(fresh())
        self.state = self.machine.state
        self.detect = config.failure_detection(detect)
        self.keys = security.resolve(keys)
        self.published: str | None = None  # the key of the secret file this coordinator wrote
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
        self.host = host
        self.sock, self.liveness = self._socket()
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
        # (time, what happened), for logs and tests: the last MAX_EVENTS
        self.events: deque[tuple[float, str]] = deque(maxlen=tables.MAX_EVENTS)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._checked_at = 0.0  # last look at the heartbeat clocks (monotonic)

    def _socket(self) -> tuple[zmq.Socket[bytes], Liveness]:
        """The ROUTER the members talk to, unbound, and its crash witnesses (liveness.py; its
        socket monitor serves the guard too)."""
        sock = self.ctx.socket(zmq.ROUTER)
        security.make_server(sock, self.keys)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
        sock.setsockopt(zmq.LINGER, 0)
        # through self.state: a restart (_restart) gives the coordinator a new one
        liveness = Liveness(
            sock, self.guard, self.detect, known=lambda: self.state.known(), clock=self.clock
        )
        return sock, liveness

    def _restart(self) -> None:
        """The machine halted (machine.Halted): start the coordinator afresh at the same
        address, as if its process had crashed and been started again. Its connections close,
        so every member finds a new coordinator (a new handshake) and re-registers
        (restart.py), and the fresh state is rebuilt from them (recovery.py)."""
        self.liveness.close()
        self.sock.close(linger=0)
        self.machine = Machine(self._fresh_state())
        self.state = self.machine.state
        self.sock, self.liveness = self._socket()
        # the old listener is closed on ZeroMQ's I/O thread, not at once: bind again until it
        # is gone, within a bound
        deadline = self.clock.monotonic() + REBIND_WITHIN
        while True:
            try:
                self.sock.bind(f"tcp://{self.address}")
                break
            except zmq.ZMQError as exc:
                if exc.errno != errno.EADDRINUSE or self.clock.monotonic() > deadline:
                    raise ConnectionError(
                        f"coordinator at {self.address}: cannot listen again after a "
                        f"restart ({exc})"
                    ) from exc
                time.sleep(0.01)
        log.warning("coordinator at %s: started afresh; the members re-register", self.address)

    # --- the machine's state, read-only --------------------------------------------------------
    @property
    def members(self) -> list[Mid] | None:
        return self.state.members

    @property
    def generation(self) -> int:
        return self.state.generation

    @property
    def failed(self) -> dict[Mid, str]:
        return self.state.failed

    @property
    def joined(self) -> dict[int, Joined]:
        return self.state.joined

    @property
    def joiners(self) -> dict[Mid, bytes]:
        return self.state.joiners

    def _live(self) -> list[Mid]:
        return self.state.live()

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> Coordinator:
        # The thread owns the socket: it closes it when its loop ends (serve_forever), so
        # stop() never touches the socket from another thread while the loop may still use it.
        self._thread = threading.Thread(
            target=self.serve_forever, name="collectives-coordinator", daemon=True
        )
        self._thread.start()
        return self

    def request_stop(self) -> None:
        """Make serve_forever() return within 50 ms (it then closes its socket). Only sets a
        flag: safe from a signal handler."""
        self._stop.set()

    def stop(self, timeout: float = 5.0) -> None:
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

    def linger(self, poll: float = 0.1) -> None:
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

    def serve_forever(self) -> None:
        try:
            self._loop()
        finally:
            self._close()

    def _close(self) -> None:
        """Close the socket (from the thread that owns it), its ZAP handler first, and take
        back the secret this coordinator published."""
        if self.guard is not None:
            self.guard.stop()
        self.liveness.close()
        self.sock.close(linger=0)
        self.ctx.term()
        if self.published is not None and self.keys is not None:
            shared.unpublish(self.published, self.keys.secret)
            self.published = None

    # --- the loop ------------------------------------------------------------------------------
    def _loop(self) -> None:
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
            if self.machine.halted is not None:
                self._restart()

    def handle(self, frames: list[bytes], proved: bytes | None = None) -> None:
        """Serve one message (a list of frames off the socket): decode, check, feed to the
        machine, send what it says. Whatever it holds, this logs (rate-limited) and returns:
        a message never ends the loop. proved: the member id its connection proved
        (identity.py); None for a caller in this process."""
        if len(frames) != 2:
            self.warn("frames", "coordinator dropped a message of %d frames", len(frames))
            return
        ident, raw = frames
        try:
            request = decode_request(raw, tables.max_ranks(self.state))
        except Invalid as exc:
            self.warn("invalid", "coordinator dropped an invalid message: %s", exc)
            kind = request_kind(raw)
            if kind in tables.ANSWERED:  # a request waits for an answer: say why
                self._send(ident, Error(message=f"invalid request: {exc}"))
            return
        if not speaks_for_itself(request, proved):
            self.warn(
                "impostor",
                "coordinator dropped a %r message naming member %s from "
                "a connection that proved member %r",
                request.kind,
                "" if isinstance(request, (Status, Exited)) else request.mid,
                (proved or b"")[:40],
            )
            return
        if isinstance(request, Exited):  # a launcher's report: for the witnesses
            self.liveness.on_exited(request.proc, request.code)
            self._feed_deaths()
            return
        if self.machine.stranger(request):
            return  # restarted, and this member has not re-registered yet (recovery.py)
        self._feed_observed()  # the connection it came on first (a closed one came back)
        self.feed(Arrived(ident, request))

    @property
    def handlers(self) -> tuple[str, ...]:
        """The requests served: the machine's, and the launchers' reports (`exited`)."""
        return (*(str(t.__struct_config__.tag) for t in HANDLERS), "exited")

    def tick(self) -> None:
        """The periodic work: the witnesses' findings, then the machine's clock. A sweep (the
        heartbeat clocks, the tables' pruning) every HEARTBEAT_CHECK_EVERY s, not after every
        message: with 1,000 members beating, those were most of the coordinator's time."""
        now = self.clock.monotonic()
        try:
            self.liveness.check()
        except Exception as exc:
            self.warn("check", "coordinator: the witnesses' check failed: %r", exc)
        self._feed_deaths()
        self._feed_observed()
        sweep = now - self._checked_at >= HEARTBEAT_CHECK_EVERY
        if sweep:
            self._checked_at = now
        self.feed(Tick(sweep))

    def feed(self, event: Event) -> None:
        """Feed one event to the machine now, and carry out its effects."""
        self._apply(self.machine.feed(event, self.clock.monotonic()))

    def _feed_deaths(self) -> None:
        for mid, why in self.liveness.take_ended():
            self.feed(Died(mid, why))

    def _feed_observed(self) -> None:
        """What the witness saw of the connections and pidfd watches, for the machine."""
        for event in self.liveness.take_observed():
            self.feed(event)

    def _apply(self, effects: list[Effect]) -> None:
        # the notes first: whoever sees a message's effect (a rank that goes on, a test that
        # saw it go on) then finds the coordinator's record of why in `events`, never before it
        for e in sorted(effects, key=lambda e: not isinstance(e, Note)):
            if isinstance(e, Send):
                self._send(e.to, e.msg)
            elif isinstance(e, Watch):
                self.liveness.learn(e.mid, e.proc)
            elif isinstance(e, Note) and e.detail:
                log.debug("coordinator: %s", e.what)
            elif isinstance(e, Note):
                self.events.append((self.clock.time(), e.what))
                log.log(logging.WARNING if e.warn else logging.INFO, "coordinator: %s", e.what)
            elif isinstance(e, Halt):  # the loop starts the coordinator afresh (_restart)
                what = f"{e.during} raised {e.error!r}: the coordinator starts afresh"
                self.events.append((self.clock.time(), what))
                log.error("coordinator: %s", what, exc_info=e.error)

    def _send(self, ident: bytes, msg: AnyReply) -> None:
        try:
            self.sock.send_multipart([ident, pack(msg)], zmq.NOBLOCK)
        except zmq.Again:  # that peer takes nothing (its queue is full): it gets nothing
            self.warn("send", "coordinator: a client's queue is full; a message to it was dropped")
