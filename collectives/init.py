"""init_process_group, membership changes, and the default group (cl.all_reduce etc.).

Where the coordinator is:
  COLLECTIVES_COORDINATOR=host:port if set (the launcher sets it), else MASTER_ADDR:MASTER_PORT.
  Under torchrun, MASTER_PORT already belongs to torch's own store, so the coordinator uses
  MASTER_PORT + 1 (documented in the README).
Rank 0 starts a coordinator in-process when it can bind that address (nobody else hosts one);
then rank 0's death cannot be survived.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time

from . import faults
from .api import ProcessGroup
from .errors import CollectiveError, CollectiveTimeout, Evicted, PeerFailure
from .rendezvous import (DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_HEARTBEAT_TIMEOUT, Coordinator,
                         CoordinatorClient)
from .transport.zmq import ZmqTransport, local_ip_towards

log = logging.getLogger("collectives")
_default: ProcessGroup | None = None
# Every Membership whose coordinator link is open: the members (and waiting joiners) this
# process is. SIGTERM announces the departure from each (see _on_sigterm). A plain set
# changed only by whole-object add/discard, read with tuple(): safe from a signal handler.
_open: set = set()
_sigterm_previous = None      # SIGTERM's handler before the library installed _on_sigterm
_sigterm_installed = False


def _env_int(name: str, value):
    if value is not None:
        return int(value)
    raw = os.environ.get(name)
    if raw is None:
        raise ValueError(f"init_process_group: {name.lower()} not given and ${name} is not set "
                         "(launch with `python -m collectives.launch` or torchrun, or pass it)")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"init_process_group: ${name}={raw!r} is not an integer") from None


def _env_float(name: str, value, default: float) -> float:
    value = float(os.environ.get(name, default) if value is None else value)
    if not value > 0:
        raise ValueError(f"init_process_group: {name.lower()} must be > 0, got {value}")
    return value


def coordinator_address(master_addr=None, master_port=None) -> tuple[str, int]:
    explicit = os.environ.get("COLLECTIVES_COORDINATOR")
    if explicit and master_addr is None and master_port is None:
        host, _, port = explicit.rpartition(":")
        return host, int(port)
    addr = master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = _env_int("MASTER_PORT", master_port)
    if master_port is None and os.environ.get("TORCHELASTIC_RUN_ID"):
        port += 1   # torchrun's TCPStore holds MASTER_PORT itself
    if not 0 <= port < 65536:
        raise ValueError(f"init_process_group: master_port {port} is not a TCP port")
    return addr, port


class Membership:
    """Builds a process's successive groups: one coordinator link, one transport per generation."""

    def __init__(self, client: CoordinatorClient, host: str, timeout: float, transport: str,
                 segment_bytes, hosted: Coordinator | None):
        self.client = client
        self.host = host
        self.timeout = timeout
        self.transport = transport
        self.segment_bytes = segment_bytes
        self.hosted = hosted
        _open.add(self)

    def _group(self, rank, world_size, generation, timeout) -> ProcessGroup:
        t = ZmqTransport(rank, world_size, generation, transport=self.transport,
                         bind_host=local_ip_towards(self.host), segment_bytes=self.segment_bytes)
        try:
            if generation == 0:
                generation, infos = self.client.join(t.address_info(), timeout)
            else:
                infos = self.client.exchange_addresses(generation, t.address_info(), timeout)
            t.connect(infos)
        except BaseException:
            t.close(linger=0)
            raise
        t.diagnoser = self.client.diagnose
        t.arbiter = self.client
        self.client.rank = rank
        self.client.start_heartbeat(t)
        return ProcessGroup(t, timeout=self.timeout, on_destroy=self.close, membership=self)

    def first_group(self, rank, world_size, timeout) -> ProcessGroup:
        return self._group(rank, world_size, 0, timeout)

    def join_group(self, timeout) -> ProcessGroup:
        """A replacement worker: wait for the members' next reconstruct(), then join. SIGTERM
        ends the wait (see _sigterm_abandons_join). If the generation it was admitted to does
        not form (another newcomer or a member vanished), it waits for the members' next
        attempt, within the same timeout. A wait that ends without a group (its timeout,
        SIGTERM, an error) withdraws the request: otherwise the coordinator would keep it
        until the heartbeat timeout, and a reconstruct() meanwhile would wait for this
        process to take its place in the next generation."""
        self.client.start_heartbeat(None)
        deadline = time.monotonic() + timeout
        fell_through = 0    # admissions whose generation did not form
        try:
            while True:
                try:
                    with _sigterm_abandons_join(self.client):
                        regroup = self.client.request_join(max(0.0, deadline - time.monotonic()))
                except CollectiveTimeout as exc:
                    if not fell_through:
                        raise
                    # The client's message names what was left of the timeout; say the whole.
                    raise CollectiveTimeout(
                        f"init_process_group(join=True): not admitted within {timeout:g} s "
                        f"({fell_through} admission(s) fell through when their generation "
                        "did not form)", op="init_process_group") from exc
                log.info("admitted as rank %d of generation %d", regroup["rank"],
                         regroup["generation"])
                try:
                    return self._group(regroup["rank"], regroup["world_size"],
                                       regroup["generation"], timeout)
                except CollectiveError as exc:
                    if not _formation_failed(exc) or time.monotonic() >= deadline:
                        raise
                    fell_through += 1
                    log.warning("init_process_group(join=True): %s; waiting to be admitted "
                                "again", exc)
        except BaseException:
            self.client.leave()
            raise

    def reconstruct(self, pg: ProcessGroup, timeout: float) -> ProcessGroup:
        """The next generation, or `pg` itself if nothing changed. If the next generation
        does not form (a member or a joiner vanished after it was told its new rank), `pg`
        is closed already: ask again, and the coordinator forms a generation of those left.
        After `timeout` s of that: PeerFailure, and `pg` may be reconstructed again (it
        stays _unformed); never `pg` back once it is closed."""
        global _default
        start = time.monotonic()
        while True:
            regroup = self.client.regroup(pg.generation, timeout)
            if regroup is None:
                if pg._unformed:
                    raise CollectiveError(
                        f"reconstruct: rank {pg.rank}: the coordinator answered 'unchanged' "
                        f"after this rank's group of generation {pg.generation} was closed "
                        "for a next generation that did not form; refusing to return the "
                        "closed group", op="reconstruct", rank=pg.rank,
                        generation=pg.generation)
                return pg
            pg._retire()
            try:
                new = self._group(regroup["rank"], regroup["world_size"],
                                  regroup["generation"], timeout)
                break
            except CollectiveError as exc:
                if not _formation_failed(exc):
                    raise
                waited = time.monotonic() - start
                if waited > timeout:
                    raise PeerFailure(
                        f"{exc}; gave up after {waited:.1f} s (timeout {timeout:g} s): this "
                        "rank's group is closed; call reconstruct() on it again",
                        op="reconstruct", rank=pg.rank, generation=pg.generation,
                        failed_ranks=getattr(exc, "failed_ranks", ()),
                        peer=getattr(exc, "peer", None)) from exc
                log.warning("%s; retrying", exc)
        pg._unformed = False       # replaced: reconstruct() on it is an error from now on
        log.info("rank %d -> rank %d of generation %d (%d ranks) in %.3f s", pg.rank, new.rank,
                 new.generation, new.world_size, time.monotonic() - start)
        if _default is pg:
            _default = new
        return new

    def leave(self):
        self.client.leave()

    def close_link(self):
        """Close the coordinator link (heartbeat thread, sockets) and nothing else: no leave,
        and a coordinator this process hosts keeps running (see ProcessGroup.close)."""
        _open.discard(self)    # first: a SIGTERM meanwhile has nothing to announce for it
        self.client.close()

    def close(self):
        self.close_link()
        if self.hosted is not None:
            self.hosted.stop()


def _formation_failed(exc: CollectiveError) -> bool:
    """Whether a next generation failed to form in a way that asking again can mend: a
    peer vanished ('unformed', a PeerFailure), or the coordinator refused an address. Not
    when this rank itself was removed (Evicted) or a deadline passed (CollectiveTimeout:
    the time is spent)."""
    return not isinstance(exc, (Evicted, CollectiveTimeout))


@contextlib.contextmanager
def _sigterm_abandons_join(client: CoordinatorClient):
    """While this process waits to be admitted (the join timeout: often a minute or more),
    SIGTERM ends the wait within ABANDON_POLL s: the handler marks the join abandoned, then
    does what SIGTERM did before: a handler of the caller's runs (ElasticTrainer's marks the
    rank preempted and returns; the abandoned join then raises CollectiveError, and fit()
    returns), and where SIGTERM had its default action, the process exits as with the
    library's handler (128 + SIGTERM; join_group withdraws the request on the way out).
    Needed because a signal does not end a zmq poll: after a handler that returns, the wait
    would go on until admission or timeout. Main thread only (signal.signal's rule)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (signal.SIG_IGN, None):   # ignored, or a handler not set from Python
        yield
        return

    def on_sigterm(signum, frame):
        client.abandon_join(f"{signal.Signals(signum).name} while waiting to be admitted")
        if callable(previous):
            previous(signum, frame)
        else:
            sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _on_sigterm(signum, frame):
    """SIGTERM (preemption): announce the departure first, so the others do not wait for the
    heartbeat timeout, then do what SIGTERM did before (exit, where it had no handler). From
    every membership open now, not the one of the init_process_group that installed this:
    a rank that rejoined (init_process_group(join=True) again) has closed the old link, and
    leaving through it would announce nothing."""
    for membership in tuple(_open):
        membership.leave()
    if callable(_sigterm_previous):
        _sigterm_previous(signum, frame)
    else:
        sys.exit(128 + signum)


def _install_sigterm():
    """Install _on_sigterm, once per process: a later init_process_group (a rejoin) adds no
    handler on top of it, nor on top of one installed meanwhile (ElasticTrainer.fit()'s, which
    puts this one back when it returns). Main thread only (signal.signal's rule)."""
    global _sigterm_previous, _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        # The program chose to survive SIGTERM: it stays in the group, so announcing a
        # departure (and exiting) would be wrong. Leave its choice alone.
        return
    _sigterm_previous = previous
    signal.signal(signal.SIGTERM, _on_sigterm)
    _sigterm_installed = True


def init_process_group(rank=None, world_size=None, master_addr=None, master_port=None,
                       timeout: float = 30.0, *, join: bool | None = None,
                       transport: str | None = None, heartbeat_interval: float | None = None,
                       heartbeat_timeout: float | None = None,
                       segment_bytes: int | None = None) -> ProcessGroup:
    """Join the job and return its ProcessGroup (also the default group for cl.all_reduce etc.).

    None arguments come from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. `timeout` is the
    default deadline of every operation and of the rendezvous itself. join=True (or RANK unset
    and COLLECTIVES_JOIN=1) waits to be admitted into a running job at its next reconstruct().
    heartbeat_interval / heartbeat_timeout (or COLLECTIVES_HEARTBEAT_INTERVAL / _TIMEOUT):
    how often workers beat, and after how long without a beat the coordinator declares one
    dead (the timeout takes effect where the coordinator is hosted).
    """
    global _default
    if join is None:
        join = rank is None and "RANK" not in os.environ and \
            os.environ.get("COLLECTIVES_JOIN", "") not in ("", "0")
    if not timeout > 0:
        raise ValueError(f"init_process_group: timeout must be > 0 seconds, got {timeout}")
    transport = transport or os.environ.get("COLLECTIVES_TRANSPORT", "auto")
    if transport not in ("auto", "tcp", "ipc", "shm"):
        raise ValueError(f"init_process_group: transport must be auto, tcp, ipc or shm, "
                         f"got {transport!r}")
    hb = _env_float("COLLECTIVES_HEARTBEAT_INTERVAL", heartbeat_interval,
                    DEFAULT_HEARTBEAT_INTERVAL)
    hb_timeout = _env_float("COLLECTIVES_HEARTBEAT_TIMEOUT", heartbeat_timeout,
                            DEFAULT_HEARTBEAT_TIMEOUT)
    host, port = coordinator_address(master_addr, master_port)

    hosted = None
    if not join:
        rank = _env_int("RANK", rank)
        world_size = _env_int("WORLD_SIZE", world_size)
        if world_size < 1:
            raise ValueError(f"init_process_group: world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"init_process_group: rank {rank} is not in 0..{world_size - 1}")
        if port == 0 and rank != 0:
            raise ValueError("init_process_group: master_port 0 (any free port) is for rank 0, "
                             "which then hosts the coordinator and prints the port it got; "
                             "give the other ranks that port")
        if rank == 0:
            try:
                hosted = Coordinator(host, port, world_size, heartbeat_interval=hb,
                                     heartbeat_timeout=hb_timeout).start()
            except Exception:  # the address is taken: the launcher (or someone) hosts one
                if port == 0:
                    raise
                hosted = None
            if port == 0:
                # Bound, not guessed: no other process can take the port between a pick
                # and a bind. Whoever starts the other ranks reads it from this line.
                port = hosted.port
                print(f"collectives: rank 0 hosts the coordinator at {host}:{port}",
                      file=sys.stderr, flush=True)
    elif port == 0:
        raise ValueError("init_process_group: a joiner needs the coordinator's port; "
                         "master_port 0 means 'any free port' for rank 0 only")
    client = CoordinatorClient(f"{host}:{port}", rank, world_size, heartbeat_interval=hb)
    membership = Membership(client, host, timeout, transport, segment_bytes, hosted)
    try:
        pg = membership.join_group(timeout) if join else \
            membership.first_group(rank, world_size, timeout)
    except BaseException:
        membership.close()
        raise
    _install_sigterm()
    faults.from_environment(pg)
    _default = pg
    return pg


def default_group() -> ProcessGroup:
    if _default is None:
        raise CollectiveError("no default process group: call cl.init_process_group() first")
    return _default


def destroy_process_group():
    global _default
    if _default is not None:
        _default.destroy()
        _default = None


def _twin(name):
    def call(*args, **kwargs):
        return getattr(default_group(), name)(*args, **kwargs)
    call.__name__ = name
    call.__doc__ = f"{name} on the default group (see ProcessGroup.{name})."
    return call


all_reduce = _twin("all_reduce")
reduce = _twin("reduce")
broadcast = _twin("broadcast")
all_gather = _twin("all_gather")
reduce_scatter = _twin("reduce_scatter")
barrier = _twin("barrier")
send = _twin("send")
recv = _twin("recv")


def get_rank() -> int:
    return default_group().rank


def get_world_size() -> int:
    return default_group().world_size
