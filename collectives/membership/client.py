"""A process's link to the coordinator (server.py): join, heartbeats (their thread:
heartbeat.py), diagnosis, reconstruction, leave. The messages are listed in protocol.py.

Every socket of the link proves this member's own key (identity.py) to the coordinator, and
the coordinator proves the job's server key to it (common/security.py): a process that
holds the port but not the secret -- a squatter on MASTER_PORT, a job with another secret --
cannot complete a handshake, and a request to it fails at once with an error that says so
(server_check.py), instead of handing it this rank's address or waiting for its answers."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

import msgspec
import zmq

from ..common.config import link_probes
from ..common.variables import (
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_HEARTBEAT_TIMEOUT,
    GRACE_TIMEOUTS,
)
from ..common.errors import (
    CollectiveError,
    CollectiveTimeout,
    CoordinatorLost,
    Evicted,
    PeerFailure,
)
from ..common import security
from ..group.schedbook import ScheduleBook
from ..transport.base import Progress as TransportProgress
from ..transport.zmq.context import term_context
from .clock import REAL, Clock
from . import heartbeat, identity, server_check
from . import rank as rm
from .link import LinkState
from .liveness import process_key
from .protocol import (
    NO_REPORT,
    AnyReply,
    Info,
    Invalid,
    Leave,
    OutcomeAnswer,
    Regroup,
    Report,
    StatusAnswer,
    Unformed,
    Welcome,
    decode_reply,
    pack,
)

log = logging.getLogger("collectives")

ABANDON_POLL = 0.1  # s: how often a join wait looks whether it was abandoned (e.g. SIGTERM)
CLOSE_TIMEOUT = 5.0  # s: CoordinatorClient.close() waits this long for the heartbeat thread,
#                      then as long again at most for the ZeroMQ context to terminate
# this rank's side of a link probe round: (token, peers, bytes, window) -> {peer: s or None}
Prober = Callable[[int, list[int], int, float], dict[int, float | None]]
MAX_REPLY = 64 << 20  # bytes of one message from the coordinator (a welcome lists every rank)


def report_of(p: TransportProgress) -> Report:
    """A transport's progress record (transport/base.py) as the messages carry it."""
    return Report(
        generation=p.generation,
        seq=p.seq,
        in_op=p.in_op,
        waiting_on=p.waiting_on,
        sent=None if p.sent is None else list(p.sent),
        recv=None if p.recv is None else list(p.recv),
        has_data=p.has_data,
        done=[(seq, how) for seq, how in p.done],
        sent_age=None if p.sent_age is None else list(p.sent_age),
    )


class CoordinatorClient:
    """A process's link to the coordinator: join, heartbeats (own thread), diagnosis,
    reconstruction, leave. One per process; it outlives the groups it builds."""

    def __init__(
        self,
        address: str,
        rank: int | None,
        world_size: int | None,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        keys: Any = security.AUTO,
        heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
        grace: float | None = None,
        clock: Clock = REAL,
    ) -> None:
        """keys: the job's security.JobKeys, None (insecure), or AUTO (identity.client_keys).
        grace: seconds to go on without the coordinator (it died, it restarts) before every
        operation raises CoordinatorLost (default GRACE_TIMEOUTS heartbeat timeouts).
        clock: what the client, its heartbeat thread and its groups read (clock.py)."""
        self.clock = clock
        self.address = address
        self.rank = rank
        self.world_size = world_size
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.grace = grace if grace is not None else GRACE_TIMEOUTS * heartbeat_timeout
        # The coordinator's comings and goings, seen by the heartbeat thread (restart.py says
        # how), and the rosters a re-registration names (link.py)
        self.link = LinkState(address, self.grace)
        self.keys = identity.client_keys(keys, address)
        # its own key: the member id is bound to it, nobody else can speak for this member
        self.pair, self.mid = identity.new_member(self.keys)
        self.link_probes = link_probes()  # takes part in a stall's link probes (probing.py)
        # The rank machine's request side (rank.py): what to ask, which answer counts, when a
        # request fails. The client is its shell for the op thread: it feeds what happened and
        # carries out the effects (_exchange); the link is the one the heartbeat thread keeps.
        self.machine = rm.RankMachine(
            rm.RankState(
                self.mid, heartbeat_interval, heartbeat_timeout, self.link, self.link_probes
            )
        )
        self.ctx = zmq.Context(io_threads=1)
        self.sock = self.new_socket()
        # insecure too: a coordinator that demands keys refuses it in the handshake
        self.handshake = security.HandshakeWatch(self.sock, secure=self.keys is not None)
        self.sock.connect(f"tcp://{address}")
        self._lock = threading.Lock()  # the control socket serves several threads
        self._hb_thread: threading.Thread | None = None
        self.stopping = threading.Event()  # set: the heartbeat thread ends
        self.beat_sent = threading.Event()  # set: the heartbeat thread's first beat went out
        self.transport: Any = None  # this generation's (None: a joiner, not in a group yet)
        self.book: ScheduleBook | None = None  # its group's schedule book (beating.Beating)
        self.left = False
        self.closed = False
        self._abandon = threading.Event()  # set by abandon_join()
        self._abandon_reason = ""

    def new_socket(self) -> zmq.Socket[bytes]:
        """A DEALER that proves this member's own key and takes no reply larger than
        MAX_REPLY."""
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY)
        security.make_client(s, self.keys, self.pair)
        return s

    def _check_server(self, op: str) -> None:
        """Raise if the server at our address has shown it is not this job's coordinator."""
        server_check.check(
            self.handshake,
            self.keys is not None,
            self.address,
            self.rank,
            op,
            self.clock.monotonic(),
        )

    def _send(self, data: bytes, deadline: float, op: str) -> bool:
        """Queue a request (under _lock). ZeroMQ may have no connection to queue it on yet
        (a DEALER whose handshakes fail has none): wait for one until `deadline`, looking at
        the handshakes meanwhile. False if the deadline passed first."""
        while True:
            try:
                self.sock.send(data, zmq.NOBLOCK)
                return True
            except zmq.Again:
                pass
            self._check_server(op)
            if self.clock.monotonic() >= deadline:
                return False
            self.sock.poll(50, zmq.POLLOUT)

    def join(self, info: Info, timeout: float) -> tuple[int, list[Info]]:
        """Generation 0: block until all world_size ranks have joined; (generation, infos).
        A coordinator that dies before it formed forgets the joins: when the connection is
        made again (a new handshake: the launcher restarted it at the same address), the
        join is sent again. The ask, its answer and its deadline -- the timeout holds whatever
        the coordinator does -- are the rank machine's (rank.on_ask_join, _on_reply)."""
        if self.rank is None or self.world_size is None:
            raise ValueError("join: a rank and a world size are needed (a joiner asks to join)")
        ask = rm.AskJoin(self.rank, self.world_size, self._info(info), timeout)
        end = self._exchange(ask, "init_process_group", reconnects=True)
        reply = end.reply if isinstance(end, rm.Replied) else None
        if isinstance(reply, Welcome):
            return reply.generation, list(reply.infos)
        if isinstance(end, rm.Failed) and end.fault.kind != "Timeout":
            raise self._error(end.fault, "init_process_group")
        status = self.status(1.0)
        if status is None:
            silent = server_check.why_silent(self.handshake)
            raise CollectiveTimeout(
                f"init_process_group: rank {self.rank} got no answer from the coordinator at "
                f"{self.address} within {timeout:g} s ({silent})",
                op="init_process_group",
                rank=self.rank,
            )
        missing = status.missing
        flood = security.flood_note()  # this process hosts it, and it ran out of fds
        raise CollectiveTimeout(
            f"init_process_group: rank {self.rank} timed out after {timeout:g} s waiting for "
            f"rank(s) {', '.join(map(str, missing))} to join at {self.address}"
            + (f"; {flood}" if flood else ""),
            op="init_process_group",
            rank=self.rank,
            peer=missing[0] if missing else None,
        )

    def status(self, timeout: float) -> StatusAnswer | None:
        """The coordinator's status (who has joined), or None without an answer in `timeout`
        s (rank.on_ask_status)."""
        end = self._exchange(rm.AskStatus(timeout), "init_process_group")
        if isinstance(end, rm.Failed) and end.fault.kind != "Timeout":
            raise self._error(end.fault, "init_process_group")
        reply = end.reply if isinstance(end, rm.Replied) else None
        return reply if isinstance(reply, StatusAnswer) else None

    def request_join(self, timeout: float, spare: bool = False) -> Regroup:
        """A replacement: wait to be admitted at the members' next reconstruct(); the regroup.
        abandon_join() (another thread, a signal handler) ends the wait early: CollectiveError.
        Either way a caller that gives up should leave(), withdrawing the request."""
        t0 = self.clock.monotonic()
        # proc: the coordinator watches this process from now on (liveness.py), so a death
        # between admission and the address costs no heartbeat timeout
        ask = rm.AskAdmission(os.getpid(), process_key(), timeout, spare)
        end = self._exchange(ask, "init_process_group", abandon=self._abandon)
        if isinstance(end, rm.Failed) and end.fault.kind == "CollectiveError":
            if self._abandon.is_set():
                raise CollectiveError(
                    f"init_process_group(join=True): gave up waiting to be "
                    f"admitted after {self.clock.monotonic() - t0:.1f} s: "
                    f"{self._abandon_reason}",
                    op="init_process_group",
                )
        if isinstance(end, rm.Failed) and end.fault.kind != "Timeout":
            raise self._error(end.fault, "init_process_group")
        reply = end.reply if isinstance(end, rm.Replied) else None
        if not isinstance(reply, Regroup):
            raise CollectiveTimeout(
                f"init_process_group(join=True): not admitted within "
                f"{timeout:g} s (the members admit joiners when they call "
                "reconstruct())",
                op="init_process_group",
            )
        return reply

    def regroup(
        self, generation: int, timeout: float, *, exclude: tuple[int, ...] = ()
    ) -> Regroup | None:
        """reconstruct(): None if nothing changed, else the regroup message (new rank etc.).
        exclude: ranks of this generation to drop at once (every live member outside it
        asks with the same list; the live ones in it are evicted). The ask and its answer
        are the rank machine's (rank.on_ask_reconstruct, _on_reply)."""
        # the report's seq: the last op this member ran (a restarted coordinator compares it:
        # recovery.py)
        ask = rm.AskReconstruct(generation, self.report(self.transport), timeout, exclude)
        end = self._exchange(ask, "reconstruct")
        if isinstance(end, rm.Failed):
            raise self._error(end.fault, "reconstruct")
        reply = end.reply if isinstance(end, rm.Replied) else None
        return reply if isinstance(reply, Regroup) else None

    def exchange_addresses(self, generation: int, info: Info, timeout: float) -> list[Info]:
        """The regroup's second half: send this rank's transport address, get everybody's.
        PeerFailure if the generation does not form (somebody told its new rank vanished):
        a member calls reconstruct() again, a joiner waits to be admitted again. The ask, its
        answer and the roster a re-registration names are the rank machine's
        (rank.on_ask_address, _on_reply)."""
        try:
            end = self._exchange(
                rm.AskAddress(generation, self._info(info), timeout), "reconstruct"
            )
        finally:
            # the machine ends the forming with the request; a shell that raised meanwhile
            # (a squatter's handshake: server_check.py) must not leave it set
            self.link.forming = -1
        if isinstance(end, rm.Failed):
            error = self._error(end.fault, "reconstruct")
            error.generation = generation
            raise error
        reply = end.reply if isinstance(end, rm.Replied) else None
        if isinstance(reply, Unformed):
            failed = reply.failed_ranks
            raise PeerFailure(
                f"reconstruct: {self.who()}: {reply.reason}",
                op="reconstruct",
                rank=self.rank,
                failed_ranks=failed,
                peer=failed[0] if failed else None,
                generation=reply.from_generation,
            )
        if not isinstance(reply, Welcome):
            raise CollectiveError(f"reconstruct: {self.who()}: answered {end}", rank=self.rank)
        return list(reply.infos)

    @staticmethod
    def _info(info: Info) -> Info:
        """A transport address as sent: with this process's pid and its process key (the
        coordinator watches the process through it: liveness.py). Checked here as the
        coordinator checks it: a bad one is this process's bug, said before it is sent."""
        sent = msgspec.structs.replace(info, pid=os.getpid(), proc=process_key())
        return msgspec.convert(msgspec.to_builtins(sent), Info)

    def who(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"a joiner (pid {os.getpid()})"

    def diagnose(
        self,
        seq: int,
        waiting_on: int | None,
        *,
        progress: TransportProgress,
        prober: Prober | None = None,
        timeout: float | None = None,
    ) -> tuple[list[int], str, str | bool]:
        """Ask whom to blame for op `seq` stalling. Same verdict on every rank that asks; the
        coordinator evicts the culprits. Returns (culprits, why, evicted). progress: this
        rank's, as the group handed it with the call (group/judge.py, blame: the stall's record);
        prober: this rank's side of a link probe round (transport/linkprobe.py), run if the
        coordinator asks for one (probing.py); timeout: the op's, which bounds the whole
        diagnosis. What is asked, which answer counts, how a probe round is bounded and
        reported, and when the wait ends are the rank machine's (rank.on_stalled,
        _on_diagnosis, on_probes_done): the rule the simulator's sweep runs."""
        stalled = rm.OpStalled(
            seq, waiting_on, report_of(progress), float(timeout or 0.0), prober is not None
        )
        end = self._exchange(stalled, "diagnose", prober)
        if isinstance(end, rm.Failed):
            raise self._error(end.fault, "diagnose")
        if not isinstance(end, rm.Blame):
            raise CollectiveError(f"diagnose: {self.who()}: answered {end}", rank=self.rank)
        return list(end.culprits), end.why, end.evicted

    def _exchange(
        self,
        event: rm.Event,
        op: str,
        prober: Prober | None = None,
        abandon: threading.Event | None = None,
        reconnects: bool = False,
    ) -> rm.Blame | rm.Replied | rm.Failed:
        """The shell of the rank machine's request side, on the op thread: feed `event` (an
        ask), carry out the effects -- send a request, run a probe round -- and feed what
        comes back (answers, the clock, the coordinator's return) until the machine ends the
        request: a blame, the answer, or a failure (no answer in time, an error, an
        eviction, the coordinator lost, `abandon` set: abandon_join). `reconnects`: a new
        connection of the request socket is a coordinator that may have forgotten the request
        (a join: before the group formed, no re-registration tells), fed as Resume too."""
        with self._lock:
            m = self.machine
            self._sync_group()
            # the first connection carries the request as sent; every later one needs it again
            seen = max(1, self.handshake.handshakes)
            effects = m.feed(event, self.clock.monotonic())
            epoch = self.link.epoch
            while True:
                while effects:
                    e = effects.pop(0)
                    if isinstance(e, (rm.Blame, rm.Replied, rm.Failed)):
                        return e
                    if isinstance(e, rm.Send):
                        deadline = m.state.pending.deadline if m.state.pending else 0.0
                        self._send(pack(e.request), deadline, op)  # unsent: the deadline ends it
                    elif isinstance(e, rm.RunProbes):
                        effects += m.feed(self._run_probes(e, prober), self.clock.monotonic())
                    elif isinstance(e, rm.Note):
                        log.log(logging.WARNING if e.warn else logging.INFO, "%s", e.what)
                pending = m.state.pending
                if pending is None:  # the machine stopped (its error state) and said why
                    why = f"{op}: {self.who()}: the membership machine stopped"
                    return rm.Failed(op, rm.Fault("CollectiveError", why))
                if self.link.epoch != epoch:
                    # The coordinator restarted and knows this member again (restart.py): what
                    # it was asked before may be lost with it
                    epoch = self.link.epoch
                    effects = m.feed(rm.Resume(), self.clock.monotonic())
                    continue
                if reconnects:
                    self.handshake.poll()
                    if self.handshake.handshakes > seen:
                        seen = self.handshake.handshakes
                        effects = m.feed(rm.Resume(), self.clock.monotonic())
                        continue
                effects = m.feed(rm.Waiting(), self.clock.monotonic())
                if effects:
                    continue
                # slices: see to the epoch and the grace (while the coordinator is away, the
                # machine holds the request past its deadline)
                remaining = pending.deadline - self.clock.monotonic()
                wait = min(remaining, ABANDON_POLL) if remaining > 0 else ABANDON_POLL
                reply = self._next_reply(wait, op)
                if reply is not None:
                    received = rm.Received(reply, "request", NO_REPORT)
                    effects = m.feed(received, self.clock.monotonic())
                elif abandon is not None and abandon.is_set():
                    # looked at only when nothing came: an answer already queued (an
                    # admission, say) is taken, not dropped
                    why = f"gave up: {self._abandon_reason}"
                    effects = m.feed(rm.Abandoned(why), self.clock.monotonic())

    def _sync_group(self) -> None:
        """Tell the machine this client's generation, as its transport has it (a probe round
        is bounded by its size, a report names its generation)."""
        t, g = self.transport, self.machine.state.group
        if t is None:
            return
        if g is None or (g.generation, g.rank, g.size) != (t.generation, t.rank, t.size):
            self.machine.feed(rm.NewGroup(t.generation, t.rank, t.size), self.clock.monotonic())

    def _next_reply(self, wait: float, op: str) -> AnyReply | None:
        """The next answer on the request socket within `wait` s, or None; a malformed one is
        dropped. Until a handshake succeeds, looks at the handshakes (and sooner)."""
        if self.handshake is not None and not self.handshake.succeeded:
            self._check_server(op)
            wait = min(wait, 0.05)
        if not self.sock.poll(int(wait * 1000) + 1):
            return None
        try:
            return decode_reply(self.sock.recv())
        except Invalid as exc:
            log.warning("%s: %s: dropped a malformed answer: %s", self.who(), op, exc)
            return None

    def _run_probes(self, e: rm.RunProbes, prober: Prober | None) -> rm.ProbesDone:
        """This rank's side of the probe round the machine bounded (peers, bytes, window)."""
        t0 = self.clock.monotonic()
        heard = prober(e.token, list(e.peers), e.nbytes, e.window) if prober else {}
        size = self.machine.state.group.size if self.machine.state.group else 0
        return rm.ProbesDone(
            e.token, tuple(heard.get(q) for q in range(size)), self.clock.monotonic() - t0
        )

    def _error(self, fault: rm.Fault, op: str) -> CollectiveError:
        """The exception a request's Fault (the rank machine's) describes, naming the op and
        this rank."""
        if fault.kind == "Evicted":
            ranks = [self.rank] if self.rank is not None else []
            return Evicted(fault.message, op=op, rank=self.rank, failed_ranks=ranks)
        if fault.kind == "CoordinatorLost":
            return CoordinatorLost(fault.message, op=op, rank=self.rank)
        if fault.kind == "Timeout":
            return CollectiveTimeout(fault.message, op=op, rank=self.rank)
        return CollectiveError(fault.message, op=op, rank=self.rank)

    def outcome(self, seq: int, timeout: float, progress: TransportProgress) -> str | None:
        """Whether op `seq`, which failed while this rank held its result, counts on every
        survivor ('commit') or on none ('abort'); None if the coordinator cannot tell in
        time. Waits while another survivor still moves data (its own deadline bounds that).
        progress: this rank's, as the group handed it with the call. The ask and its
        answer are the rank machine's (rank.on_ask_outcome, _on_reply)."""
        end = self._exchange(rm.AskOutcome(seq, report_of(progress), timeout), "outcome")
        if isinstance(end, rm.Failed):
            if end.fault.kind == "Timeout":
                return None
            raise self._error(end.fault, "outcome")
        reply = end.reply if isinstance(end, rm.Replied) else None
        return reply.verdict if isinstance(reply, OutcomeAnswer) else None

    def publish(self, progress: TransportProgress) -> None:
        """Send this rank's state now (its op just failed), not at the next heartbeat.
        progress: as the group handed it with the call (group/judge.py, settle). What
        is sent is the rank machine's (rank.on_op_failed); this thread's socket carries it."""
        with self._lock:
            self._sync_group()
            failed = rm.OpFailed(report_of(progress))
            for e in self.machine.feed(failed, self.clock.monotonic()):
                if isinstance(e, rm.Send):
                    try:
                        self.sock.send(pack(e.request), zmq.NOBLOCK)
                    except zmq.Again:
                        pass  # no connection now: the heartbeat carries it when there is one
                elif isinstance(e, rm.Note):
                    log.log(logging.WARNING if e.warn else logging.INFO, "%s", e.what)

    def abandon_join(self, reason: str) -> None:
        """Make a request_join() in progress (or about to start) give up within ABANDON_POLL s.
        Only sets a flag: safe from a signal handler."""
        self._abandon_reason = reason
        self._abandon.set()

    def leave(self, timeout: float = 1.0) -> None:
        """Announce departure (preemption), or withdraw a join request not yet granted. Uses
        its own socket: safe from a signal handler. A no-op once the link is closed (the
        context is gone; a closed link's member was evicted or has left already)."""
        if self.left or self.closed:
            return
        self.left = True
        s = self.new_socket()
        try:
            s.connect(f"tcp://{self.address}")
            if s.poll(int(timeout * 1000), zmq.POLLOUT):
                s.send(pack(Leave(mid=self.mid, pid=os.getpid())), zmq.NOBLOCK)
            s.poll(int(timeout * 1000))
        finally:
            s.close(linger=0)

    # --- heartbeats ----------------------------------------------------------------------------
    def start_heartbeat(self, transport: Any, book: ScheduleBook | None = None) -> None:
        """Beat for `transport`'s generation (None: none yet), whose group's schedule book
        the coordinator's notices go to."""
        self.book = book  # first: see beating.Beating
        self.transport = transport
        if self._hb_thread is None:
            self._hb_thread = threading.Thread(
                target=heartbeat.run, args=(self,), daemon=True, name="collectives-heartbeat"
            )
            self._hb_thread.start()

    def report(self, t: Any) -> Report:
        """Its transport's progress, as the coordinator reads it (a joiner has none yet)."""
        return NO_REPORT if t is None else report_of(t.progress())

    def close(self) -> None:
        """Stop the heartbeat thread and close the sockets; tells the coordinator nothing
        (leave() does). Idempotent. Returns within 2 * CLOSE_TIMEOUT s whatever the thread
        does: a heartbeat thread stuck outside ZeroMQ (in a transport's state, say) keeps its
        socket open, and ctx.term() waits for every socket of the context."""
        if self.closed:
            return
        self.closed = True  # first: a leave() from a signal handler meanwhile does nothing
        self.stopping.set()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=CLOSE_TIMEOUT)
            if self._hb_thread.is_alive():
                log.warning(
                    "coordinator link of %s: the heartbeat thread did not stop within "
                    "%g s; terminating its ZeroMQ context under it",
                    self.who(),
                    CLOSE_TIMEOUT,
                )
        if self.handshake is not None:
            self.handshake.close()
        self.sock.close(linger=0)
        term_context(self.ctx, CLOSE_TIMEOUT, f"coordinator link of {self.who()}")
