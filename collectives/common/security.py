"""Every socket authenticated: CURVE keys derived from the job secret, a ZAP handler that binds
each connection to the rank it proved to be, and rate-limited warnings. (docs/security.md)

Keys. HKDF-SHA256 of the job secret, one label per role, 32 bytes, z85: a CURVE secret key;
zmq.curve_public gives its public key.
  server        every ROUTER of the job: each rank's, and the coordinator's;
  member        every link to the coordinator (requests, heartbeats, leave; joiners too);
  rank g r      rank r's DEALERs in generation g. A rank's ROUTER admits exactly the keys of
                the other ranks of its generation; its ZAP handler names each connection after
                the rank whose key it proved ("3"), ZeroMQ attaches that name to every message
                from it as its User-Id, and ZmqTransport takes a message only if it equals the
                routing id the message claims (b"3").
A peer that does not hold the secret cannot compute the server's public key, so it cannot
complete a handshake: it cannot send a frame, and it reads nothing. A server that does not hold
it cannot answer a handshake, so no rank ever talks to a squatter on the coordinator's port.
Keys are only as secret as the job secret: any holder can derive all of them, so they tell
apart the roles and ranks of one trusted job, not members from each other's malice.

Where no secret is given (keys=AUTO): $COLLECTIVES_JOB_SECRET / _FILE; else nothing if
$COLLECTIVES_INSECURE=1 (warned once); else a secret of this process's own, which only
things in this process (and, published by a coordinator, this user's processes on this host:
common/secret.py) know.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import hmac
import logging
import os
import socket
import threading
import time
from typing import Callable

import zmq
from zmq.utils import z85
from .monitor import MonitorEvent, next_event

from . import config
from . import secret as shared
from .throttle import Throttle

log = logging.getLogger("collectives")

SALT = b"collectives job secret v1"
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"collectives"
HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
# How long a server keeps a connection that has not completed its handshake (ZeroMQ's default:
# 30 s). One of the job's own completes it in milliseconds; one that sends a few bytes of a
# greeting and then nothing holds a file descriptor until this ends.
HANDSHAKE_TIMEOUT = 5.0
_flood = {"at": None, "note": ""}  # the last time a server of this process ran out of fds


def flood_note(within: float = 30.0) -> str:
    """Why a server of this process could not accept connections lately, or ""."""
    at = _flood["at"]
    return _flood["note"] if at is not None and time.monotonic() - at < within else ""


def hkdf_sha256(ikm: bytes, info: bytes, length: int = 32, salt: bytes = SALT) -> bytes:
    """RFC 5869 HKDF with SHA-256: extract a pseudorandom key from `ikm`, expand it for `info`."""
    if not 0 < length <= 255 * 32:
        raise ValueError(f"HKDF-SHA256 cannot give {length} bytes")
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    out, block = b"", b""
    for i in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
    return out[:length]


class KeyPair:
    __slots__ = ("public", "secret")

    def __init__(self, secret_z85: bytes):
        self.secret = secret_z85
        self.public = zmq.curve_public(secret_z85)

    @property
    def raw_public(self) -> bytes:
        """The public key as ZAP reports it (32 raw bytes)."""
        return z85.decode(self.public)

    def __repr__(self) -> str:
        return f"KeyPair(public={self.public.decode()})"


def derive(secret: bytes, label: bytes) -> KeyPair:
    return KeyPair(z85.encode(hkdf_sha256(secret, b"collectives curve " + label)))


class JobKeys:
    """The CURVE keys of one job, derived from its secret (never printed)."""

    def __init__(self, secret: bytes, origin: str = "given"):
        if not isinstance(secret, bytes) or len(secret) < config.SECRET_MIN:
            raise ValueError(f"a job secret must be at least {config.SECRET_MIN} bytes")
        self._secret = secret
        self.origin = origin  # "environment", "launcher", "shared file", "generated", ...
        self.server = derive(secret, b"server")
        self.member = derive(secret, b"member")

    @functools.lru_cache(maxsize=4096)
    def rank(self, generation: int, rank: int) -> KeyPair:
        return derive(self._secret, b"rank %d %d" % (generation, rank))

    def rank_table(self, generation: int, size: int, exclude: int | None = None) -> dict:
        """{raw public key: b"<rank>"} of the ranks of a generation, for a ZAP handler."""
        return {self.rank(generation, r).raw_public: b"%d" % r for r in range(size) if r != exclude}

    @property
    def secret(self) -> bytes:
        """The secret itself: for handing on (the launcher's workers, a published file)."""
        return self._secret

    def __repr__(self) -> str:
        return f"JobKeys({self.origin})"


AUTO = "auto"  # keys=AUTO: from the environment, or insecure, or this process's own
_process_keys: JobKeys | None = None
_process_lock = threading.Lock()
_warned_insecure = False


def process_keys() -> JobKeys:
    """A secret of this process's own, generated once (see the module's docstring)."""
    global _process_keys
    with _process_lock:
        if _process_keys is None:
            _process_keys = JobKeys(shared.generate(), "generated")
        return _process_keys


def warn_insecure() -> None:
    global _warned_insecure
    if not _warned_insecure:
        _warned_insecure = True
        log.warning(
            "COLLECTIVES_INSECURE=1: sockets are not authenticated; anyone who can "
            "reach this job's ports can join it, read and forge its data "
            "(docs/security.md)"
        )


def from_environment() -> JobKeys | None | str:
    """JobKeys of $COLLECTIVES_JOB_SECRET(_FILE); None if $COLLECTIVES_INSECURE=1 (warned
    once); AUTO if neither is set. ValueError if both are, or a value is bad."""
    secret = config.job_secret()
    if config.insecure():
        if secret is not None:
            raise ValueError("COLLECTIVES_INSECURE=1 and a job secret are both set; drop one")
        warn_insecure()
        return None
    return JobKeys(secret, "environment") if secret is not None else AUTO


def resolve(keys: JobKeys | None | str) -> JobKeys | None:
    """keys as given, or for AUTO: the environment's, None (insecure) or process_keys()."""
    if keys is not AUTO:
        return keys
    found = from_environment()
    return process_keys() if found is AUTO else found


# --- sockets -------------------------------------------------------------------------------------
def make_server(sock: zmq.Socket, keys: JobKeys | None) -> None:
    """A CURVE server with the job's server key (before bind); only the handshake timeout
    when insecure."""
    sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_TIMEOUT * 1000))
    if keys is None:
        return
    sock.curve_secretkey = keys.server.secret
    sock.curve_publickey = keys.server.public
    sock.curve_server = True
    sock.zap_domain = ZAP_DOMAIN


def make_client(sock: zmq.Socket, keys: JobKeys | None, pair: KeyPair | None = None) -> None:
    """A CURVE client proving `pair` (default: the member key) to the job's servers (before
    connect); nothing when insecure."""
    if keys is None:
        return
    pair = pair or keys.member
    sock.curve_serverkey = keys.server.public
    sock.curve_publickey = pair.public
    sock.curve_secretkey = pair.secret


def user_id(frame: zmq.Frame) -> bytes | None:
    """The User-Id ZeroMQ attached to a received frame (copy=False): the name our ZAP handler
    gave its connection; None for a connection without one (inproc, or insecure)."""
    try:
        value = frame.get("User-Id")
    except (zmq.ZMQError, AttributeError):
        return None
    return value.encode() if isinstance(value, str) else value


class Guard:
    """The ZAP handler of one ZeroMQ context, on a thread of its own: admits the keys in
    `allowed` ({raw public key: user id}) and refuses every other, and watches the server
    sockets given to watch() for handshakes that fail before ZAP is asked (a peer without the
    secret, or without CURVE). Every refusal is logged (rate-limited) and counted.

    Start it before any server socket of the context binds: without a ZAP handler, ZeroMQ
    lets any client key in. stop() from the thread that owns the watched sockets, before
    closing them and terminating the context."""

    def __init__(
        self,
        ctx: zmq.Context,
        allowed: dict[bytes, bytes],
        who: str,
        name: Callable[[bytes], bytes | None] | None = None,
    ):
        """name: admit every CURVE key, naming its connection name(raw public key) -- for a
        server whose clients prove the job secret by knowing its public key, and prove who
        they are by their own keys (membership/identity.py)."""
        self.ctx, self.allowed, self.who, self.name = ctx, dict(allowed), who, name
        self.zap = ctx.socket(zmq.REP)
        self.zap.setsockopt(zmq.LINGER, 0)
        self.zap.bind(ZAP_ENDPOINT)
        self.watched: list[tuple[zmq.Socket, zmq.Socket]] = []  # (server socket, monitor)
        self.refused = 0
        self.warn = Throttle()
        self._stop = threading.Event()
        self._watch_lock = threading.Lock()
        self._fds_checked = 0.0
        self._thread = threading.Thread(target=self._loop, daemon=True, name="collectives-zap")
        self._thread.start()

    def watch(self, sock: zmq.Socket) -> None:
        mon = sock.get_monitor_socket(HANDSHAKE_FAILED)
        with self._watch_lock:
            self.watched.append((sock, mon))

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.zap, zmq.POLLIN)
        polled = set()
        try:
            while not self._stop.is_set():
                with self._watch_lock:
                    for _, mon in self.watched:
                        if mon not in polled:
                            polled.add(mon)
                            poller.register(mon, zmq.POLLIN)
                for sock, _ in poller.poll(100):
                    if sock is self.zap:
                        self._answer(self.zap.recv_multipart())
                    else:
                        self.on_event(next_event(sock))
                now = time.monotonic()
                if now >= self._fds_checked + 0.5:
                    self._fds_checked = now
                    self._check_fds(now)
        except zmq.ContextTerminated:
            pass
        finally:
            with self._watch_lock:
                for _, mon in self.watched:
                    mon.close(linger=0)
            self.zap.close(linger=0)

    def _answer(self, frames: list[bytes]) -> None:
        # ZAP 1.0 (RFC 27): version, request id, domain, address, identity, mechanism, creds
        if len(frames) < 6:
            return  # not a ZAP request; a REP socket must still answer something
        version, request_id, _, address, _, mechanism = frames[:6]
        creds = frames[6:]
        who = None
        if mechanism == b"CURVE" and creds:
            who = self.name(creds[0]) if self.name else self.allowed.get(creds[0])
        if who is not None:
            self.zap.send_multipart([version, request_id, b"200", b"OK", who, b""])
            return
        self.refused += 1
        self.warn(
            "zap",
            "%s refused a connection from %s: its %s key is not one of this "
            "job's (it does not hold this job's secret)",
            self.who,
            address.decode(errors="replace")[:64],
            mechanism.decode(errors="replace"),
        )
        self.zap.send_multipart([version, request_id, b"400", b"not a key of this job", b"", b""])

    def _check_fds(self, now: float) -> None:
        """Whether this process can still open a file: one that cannot, cannot accept a
        connection either (libzmq retries in silence; a monitor of its failures would be
        written thousands of times a second, and holds the socket's lock meanwhile)."""
        try:
            os.close(os.open(os.devnull, os.O_RDONLY))
            return
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                return
        _flood["at"], _flood["note"] = (
            now,
            (
                f"{self.who} cannot accept connections: this process has as many files open as it "
                f"may (limit {config.open_files()[1]}); connections that never authenticate are "
                f"each dropped after {HANDSHAKE_TIMEOUT:g} s -- a flood of them (too many "
                "unauthenticated connections) keeps the job's own out"
            ),
        )
        self.warn("accept", "%s", _flood["note"])

    def on_event(self, event: MonitorEvent) -> None:
        if event.kind & (
            zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        ):
            self.refused += 1
            self.warn(
                "handshake",
                "%s refused a connection on %s: its handshake failed (the "
                "peer does not hold this job's secret, or speaks no CURVE)",
                self.who,
                event.endpoint,
            )

    def stop(self, timeout: float = 5.0) -> None:
        """Switch the monitors off (their last event is read by the thread), then end it."""
        with self._watch_lock:
            socks = [s for s, _ in self.watched]
        for sock in socks:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("%s: its ZAP handler thread did not stop within %g s", self.who, timeout)


def mismatch(secure: bool) -> str:
    """What a handshake that failed on the mechanism (CURVE on one side, none on the other)
    says about the server, from a client that is `secure` or not."""
    if secure:
        return "runs without authentication (no CURVE)"
    return "requires authentication (a job secret, CURVE)"


def server_mechanism(host: str, port: int, timeout: float = 1.0) -> bytes | None:
    """The security mechanism (b"NULL", b"CURVE", ...) a ZeroMQ server at host:port states in
    its ZMTP 3 greeting, read over a plain TCP connection of its own; None if it states none
    in time (not ZeroMQ, gone). A server that finds a client's mechanism wrong may close before
    the client has read why (libzmq then reports a handshake failure without detail); this
    asks it directly. It sends nothing but a greeting (with the NULL mechanism) and reads
    nothing but the server's."""
    greeting = (
        b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31
    )
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(greeting)
            got = b""
            while len(got) < 32:
                more = s.recv(64 - len(got))
                if not more:
                    break
                got += more
    except OSError:
        return None
    if len(got) < 32 or got[0] != 0xFF or got[9] != 0x7F or got[10] < 3:
        return None
    return got[12:32].rstrip(b"\0") or None


class HandshakeWatch:
    """A client socket's handshakes with the server it connects to (a socket monitor, read by
    whoever uses the socket): whether one succeeded, and why none could. A server that does
    not hold the job secret (a squatter on its port, or a job with another secret) fails
    every handshake; one that accepts TCP but speaks no ZeroMQ never completes one."""

    EVENTS = (
        zmq.EVENT_CONNECTED
        | zmq.EVENT_HANDSHAKE_SUCCEEDED
        | HANDSHAKE_FAILED
        | zmq.EVENT_DISCONNECTED
    )

    def __init__(self, sock: zmq.Socket, secure: bool = True):
        """secure: this side proves keys (CURVE); False: it runs insecure (NULL)."""
        self.sock = sock
        self.secure = secure
        self.mismatch = False  # the server runs the other way (secure / insecure)
        self.mon = sock.get_monitor_socket(self.EVENTS)
        self.succeeded = False
        self.handshakes = 0  # succeeded, counted: one more is a server come back
        self.failures = 0  # handshakes failed, or connections lost before one
        self.connected_at = None  # a TCP connection exists, no handshake yet since then
        self.first_failure = None  # when the first one failed
        self.last = ""

    def poll(self) -> None:
        """Take the events that are here; never waits."""
        while True:
            try:
                event = next_event(self.mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event.kind
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.succeeded, self.connected_at = True, None
                self.handshakes += 1
            elif kind == zmq.EVENT_CONNECTED:
                self.connected_at = time.monotonic()
            elif (
                kind & HANDSHAKE_FAILED
                and event.value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
            ):
                self._failed()
                self.mismatch = True
                self.last = "it " + mismatch(self.secure)
            elif kind & HANDSHAKE_FAILED:
                self._failed()
                reasons: dict[int, str] = {
                    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "it refused this job's key",
                    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "it does not speak this job's CURVE keys",
                }
                self.last = reasons.get(kind, "the handshake failed")
            elif (
                kind == zmq.EVENT_DISCONNECTED
                and self.connected_at is not None
                and not self.succeeded
            ):
                self._failed()
                self.last = "it closed the connection during the handshake"

    def probe(self, address: str) -> bytes | None:
        """After failures without detail: ask the server its mechanism (server_mechanism);
        one that is not this side's is a mismatch. The mechanism, or None if it said none."""
        host, _, port = address.rpartition(":")
        theirs = server_mechanism(host.strip("[]"), int(port), 2.0) if port.isdigit() else None
        if theirs in (b"NULL", b"CURVE") and theirs != (b"CURVE" if self.secure else b"NULL"):
            self.mismatch = True
            self.last = "it " + mismatch(self.secure)
        return theirs

    def _failed(self) -> None:
        self.failures += 1
        self.connected_at = None
        if self.first_failure is None:
            self.first_failure = time.monotonic()

    def problem(self, stuck_after: float = 5.0) -> str | None:
        """Why the server cannot be this job's, or None while nothing says so."""
        self.poll()
        if self.succeeded:
            return None
        if self.mismatch:
            return self.last
        # A server that finds the mechanism wrong may close before saying why (a failure
        # without detail): a later attempt (every 100 ms) says it. Wait a few for it.
        if self.failures:
            waited = time.monotonic() - (self.first_failure or 0.0)
            if (self.failures >= 3 and waited > 1.0) or waited > 3.0:
                return self.last
        if self.connected_at is not None and time.monotonic() - self.connected_at > stuck_after:
            return f"it accepted a connection but completed no handshake in {stuck_after:g} s"
        return None

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        # the monitor's last event (MONITOR_STOPPED) is read before its socket closes
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                if next_event(self.mon, zmq.NOBLOCK).kind == zmq.EVENT_MONITOR_STOPPED:
                    break
            except zmq.Again:
                time.sleep(0.005)
            except zmq.ZMQError:
                break
        self.mon.close(linger=0)
