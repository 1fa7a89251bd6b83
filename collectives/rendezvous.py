"""The coordinator: where ranks find each other, beat their hearts, and change membership.

One coordinator serves a job. `python -m collectives.launch` hosts it; otherwise rank 0 starts
one in-process when nothing is listening at MASTER_ADDR:MASTER_PORT (then rank 0's death cannot
be survived). Every process is a *member* with a random id (`mid`); its rank is its position in
the current generation's member list. Messages are msgpack dicts over a ZeroMQ ROUTER:

  join        {rank, world_size, mid, info}   -> welcome {generation 0, infos} once all joined
  join_request {mid}                          a replacement waits; admitted at the next regroup
  beat/state  {mid, generation, seq, in_op, waiting_on, sent, recv}   (heartbeat thread)
  diagnose    {mid, generation, seq, ...}     -> verdict {culprits, why}; culprits are evicted
  outcome     {mid, generation, seq, state}   -> outcome {verdict: commit | abort} of an op that
                                              failed while the asker held its result; the
                                              same for every survivor (diagnose.outcome)
  progress    {mid, generation, seq, state}   a rank's op ended in failure: its state now
  leave       {mid}                           preemption: the others are told at once
  reconstruct {mid, generation}               a barrier of the live members, then either
              -> unchanged                    nobody failed, nobody waits to join, and the
                                              last attempt to form a generation did not fail
              -> regroup {generation, rank, world_size}; each answers
                 address {mid, generation, info} -> welcome {generation, infos}
                 or, when one of them vanishes first,
                                -> unformed {generation, from_generation, failed_ranks, reason}
                 (the members call reconstruct again; the joiners that are still there wait
                 for that next attempt, which gets a fresh generation number)

Failure detection: a member whose last beat is older than heartbeat_timeout is declared dead;
a diagnosis evicts the culprits; a leave removes the leaver. Each declaration is sent to every
other member's heartbeat thread as `failure {generation, failed_ranks, reason}` (their current
and next operations raise PeerFailure) and to the removed member as `evicted`.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid

import msgpack
import zmq

from . import diagnose
from .errors import CollectiveError, CollectiveTimeout, Evicted, PeerFailure, PeerTimeout
from .transport.zmq import term_context

log = logging.getLogger("collectives")

DEFAULT_HEARTBEAT_INTERVAL = 0.5   # 10 beats per timeout: one lost beat is never a death
DEFAULT_HEARTBEAT_TIMEOUT = 5.0    # torchft's default; a GC pause or a busy host is not a death
ABANDON_POLL = 0.1   # s: how often a join wait looks whether it was abandoned (e.g. SIGTERM)
CLOSE_TIMEOUT = 5.0  # s: CoordinatorClient.close() waits this long for the heartbeat thread,
#                      then as long again at most for the ZeroMQ context to terminate


def _pack(msg: dict) -> bytes:
    return msgpack.packb(msg)


def _unpack(raw: bytes):
    try:
        msg = msgpack.unpackb(raw)
    except Exception:
        return None
    return msg if isinstance(msg, dict) and isinstance(msg.get("t"), str) else None


class Coordinator:
    """Rendezvous, heartbeat and membership server. Runs on its own thread: start() / stop()."""

    def __init__(self, host: str, port: int, world_size: int,
                 heartbeat_interval: float | None = None,
                 heartbeat_timeout: float | None = None,
                 diagnose_window: float | None = None):
        """heartbeat_interval / heartbeat_timeout default to $COLLECTIVES_HEARTBEAT_INTERVAL /
        $COLLECTIVES_HEARTBEAT_TIMEOUT, else 0.5 s / 5 s."""
        if world_size < 1:
            raise ValueError(f"coordinator: world_size must be >= 1, got {world_size}")
        heartbeat_interval = heartbeat_interval or float(os.environ.get(
            "COLLECTIVES_HEARTBEAT_INTERVAL", DEFAULT_HEARTBEAT_INTERVAL))
        heartbeat_timeout = heartbeat_timeout or float(os.environ.get(
            "COLLECTIVES_HEARTBEAT_TIMEOUT", DEFAULT_HEARTBEAT_TIMEOUT))
        self.world_size = world_size
        self.heartbeat_timeout = heartbeat_timeout
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
        self.generation = 0
        self.tried = 0                          # highest generation number handed out
        # The last attempt to form a generation failed: the members have closed their groups,
        # so the next round must form a new generation even if nobody else changed.
        self.dissolved = False
        self.joined: dict[int, tuple[bytes, str, dict]] = {}  # generation 0: rank -> (ident, mid, info)
        self.members: list[str] | None = None   # current generation, by rank
        self.failed: dict[str, str] = {}        # mid -> reason, this generation
        self.beats: dict[str, tuple[bytes, float, dict]] = {}  # mid -> (hb ident, time, state)
        self.joiners: dict[str, bytes] = {}     # mid -> ident, waiting to be admitted
        self.round: dict | None = None          # reconstruct barrier in progress
        self.forming: dict | None = None        # new generation collecting addresses
        self.diagnoses: dict[tuple, dict] = {}  # (generation, seq) -> pending verdict
        self.verdicts: dict[tuple, dict] = {}   # (generation, seq) -> verdict given
        # Ops of the current generation whose outcome was asked: seq -> {"askers": [ident],
        # "held": {rank: bool}, "until": t}; and the outcomes given (see diagnose.outcome).
        self.outcome_asks: dict[int, dict] = {}
        self.outcomes: dict[int, str] = {}
        self.events: list[tuple[float, str]] = []  # (time, what happened), for logs and tests
        self._stop = threading.Event()
        self._thread = None

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self):
        # The thread owns the socket: it closes it when its loop ends (serve_forever), so
        # stop() never touches the socket from another thread while the loop may still use it.
        self._thread = threading.Thread(target=self.serve_forever, name="collectives-coordinator",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0):
        """End the loop; its thread closes the socket. Bounded: a loop that does not end within
        `timeout` is logged and left to end by itself (the thread is a daemon)."""
        self._stop.set()
        if self._thread is None:
            self.sock.close(linger=0)
            self.ctx.term()
            return
        self._thread.join(timeout=timeout)
        if self._thread.is_alive():
            log.warning("coordinator: the loop did not stop within %g s; its socket closes "
                        "when it does", timeout)

    def serve_forever(self):
        try:
            self._loop()
        finally:
            self.sock.close(linger=0)
            self.ctx.term()

    def _note(self, what: str):
        self.events.append((time.time(), what))
        log.info("coordinator: %s", what)

    # --- the loop ------------------------------------------------------------------------------
    def _loop(self):
        while not self._stop.is_set():
            if self.sock.poll(20):
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
            self._check_heartbeats()
            self._finish_diagnoses()
            self._finish_outcomes()
            self._check_round()

    def _send(self, ident: bytes, msg: dict):
        self.sock.send_multipart([ident, _pack(msg)])

    def _rank_of(self, mid):
        try:
            return self.members.index(mid)
        except (ValueError, AttributeError):
            return None

    def _live(self):
        return [m for m in (self.members or []) if m not in self.failed]

    # --- generation 0 --------------------------------------------------------------------------
    def _on_join(self, ident, msg):
        rank, size, mid = int(msg["rank"]), int(msg["world_size"]), msg["mid"]
        problem = None
        if size != self.world_size:
            problem = (f"rank {rank} joined with world_size {size}, but the job has world_size "
                       f"{self.world_size}")
        elif not 0 <= rank < self.world_size:
            problem = f"rank {rank} is out of range for world_size {self.world_size}"
        elif self.members is not None:
            problem = (f"rank {rank} joined after the group was formed; a replacement worker "
                       "joins with init_process_group(join=True)")
        elif rank in self.joined and self.joined[rank][1] != mid:
            problem = (f"rank {rank} joined twice (pids {self.joined[rank][2].get('pid')} and "
                       f"{msg['info'].get('pid')}): two workers were given the same RANK")
        if problem:
            self._send(ident, {"t": "error", "message": problem})
            return
        self.joined[rank] = (ident, mid, msg["info"])
        if len(self.joined) == self.world_size:
            self.members = [self.joined[r][1] for r in range(self.world_size)]
            infos = [self.joined[r][2] for r in range(self.world_size)]
            now = time.monotonic()
            for r in range(self.world_size):
                ident_r, mid_r, _ = self.joined[r]
                self.beats.setdefault(mid_r, (b"", now, {}))
                self._send(ident_r, {"t": "welcome", "generation": 0, "infos": infos})
            self._note(f"generation 0 formed with {self.world_size} ranks")

    def _on_status(self, ident, msg):
        missing = [r for r in range(self.world_size) if r not in self.joined]
        self._send(ident, {"t": "status", "missing": missing, "generation": self.generation,
                           "world_size": len(self.members or [])})

    # --- heartbeats and failures ---------------------------------------------------------------
    def _on_beat(self, ident, msg):
        mid = msg["mid"]
        self.beats[mid] = (ident, time.monotonic(), msg)
        self._learn(mid, msg)
        if self.members is not None and mid not in self.members and mid not in self.joiners \
                and not self._forming_has(mid):
            self._send(ident, {"t": "evicted", "reason": "not a member of generation "
                               f"{self.generation}"})
        elif mid in self.failed:
            self._send(ident, {"t": "evicted", "reason": self.failed[mid]})

    def _on_state(self, ident, msg):
        self._on_beat(ident, msg)
        rank = self._rank_of(msg["mid"])
        if rank is None:
            return
        for (gen, _), d in self.diagnoses.items():
            if gen == msg.get("generation"):
                d["states"][rank] = _state_of(msg)

    def _check_heartbeats(self):
        if self.members is None:
            return
        now = time.monotonic()
        dead = [m for m in self._live()
                if now - self.beats.get(m, (b"", now, {}))[1] > self.heartbeat_timeout]
        if dead:
            self._declare(dead, f"sent no heartbeat for {self.heartbeat_timeout:g} s")
        for m in [m for m in self.joiners
                  if now - self.beats.get(m, (b"", now, {}))[1] > self.heartbeat_timeout]:
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
        notice = {"t": "failure", "generation": self.generation, "failed_ranks": ranks,
                  "reason": reason, "graceful": graceful, "op": op}
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

    # --- stall diagnosis -----------------------------------------------------------------------
    def _on_diagnose(self, ident, msg):
        rank = self._rank_of(msg["mid"])
        gen = msg["generation"]
        if rank is None or gen != self.generation:
            self._send(ident, {"t": "verdict", "culprits": [], "why": "stale generation",
                               "evicted": False})
            return
        key = (gen, msg["seq"])
        if key in self.verdicts:
            self._send(ident, self.verdicts[key])
            return
        d = self.diagnoses.get(key)
        if d is None:
            d = {"askers": [], "states": {}, "until": time.monotonic() + self.diagnose_window}
            self.diagnoses[key] = d
            for m in self.members:
                hb = self.beats.get(m)
                if m in self.failed:
                    d["states"][self._rank_of(m)] = None
                elif hb and hb[0]:
                    self._send(hb[0], {"t": "ping"})
        d["askers"].append(ident)
        d["states"][rank] = _state_of(msg)

    def _finish_diagnoses(self):
        now = time.monotonic()
        n = len(self.members or [])
        for key in [k for k, d in self.diagnoses.items()
                    if now >= d["until"] or len(d["states"]) == n]:
            d = self.diagnoses.pop(key)
            gen, seq = key
            if gen != self.generation:
                verdict = {"t": "verdict", "culprits": [], "why": "stale generation",
                           "evicted": False}
            elif key in self.verdicts:
                verdict = self.verdicts[key]     # the same verdict for every asker
            else:
                log.debug("coordinator: diagnosing op #%d of generation %d from %r", seq, gen,
                          d["states"])
                culprits, why = diagnose.blame(seq, d["states"], n)
                # One event, one error on every rank: culprits this stall removes make it a
                # stall everywhere (PeerTimeout, the notice says so); culprits already removed
                # (dead, left) were announced as a PeerFailure, and the askers raise that too.
                earlier = [r for r in culprits if self.members[r] in self.failed]
                stalled = bool(culprits) and not earlier
                if earlier:
                    why = self.failed[self.members[earlier[0]]]
                verdict = {"t": "verdict", "culprits": culprits, "why": why, "evicted": True,
                           "stall": stalled}
                self.verdicts[key] = verdict
                if stalled:
                    self._declare([self.members[r] for r in culprits],
                                  f"stalled op #{seq}: rank(s) {culprits} {why}", op=seq)
            for ident in d["askers"]:
                self._send(ident, verdict)

    # --- the outcome of an op that failed while some held its result ---------------------------
    def _learn(self, mid, state):
        """What a member's report says of the ops whose outcome is asked. Facts only ever
        accumulate (an older report, arriving late over another socket, adds nothing false)."""
        if not self.outcome_asks or state.get("generation") != self.generation:
            return
        rank = self._rank_of(mid)
        if rank is None:
            return
        for seq, ask in self.outcome_asks.items():
            if rank not in ask["held"]:
                held = diagnose.holds_result(seq, state)
                if held is not None:
                    ask["held"][rank] = held

    def _on_progress(self, ident, msg):
        self._learn(msg["mid"], msg)

    def _on_outcome(self, ident, msg):
        rank = self._rank_of(msg["mid"])
        seq = int(msg["seq"])
        if rank is None or msg["generation"] != self.generation:
            self._send(ident, {"t": "outcome", "seq": seq, "verdict": None,
                               "why": "stale generation"})
            return
        if seq in self.outcomes:
            self._send(ident, {"t": "outcome", "seq": seq, "verdict": self.outcomes[seq]})
            return
        ask = self.outcome_asks.get(seq)
        if ask is None:
            ask = self.outcome_asks[seq] = {"askers": [], "held": {},
                                            "until": time.monotonic() + float(msg["timeout"])}
            for m in self._live():
                hb = self.beats.get(m)
                if hb:
                    self._learn(m, hb[2])
                    if hb[0] and m != msg["mid"]:
                        self._send(hb[0], {"t": "ping"})   # fresh states, sooner
        ask["askers"].append(ident)
        self._learn(msg["mid"], msg)

    def _finish_outcomes(self):
        now = time.monotonic()
        for seq in list(self.outcome_asks):
            ask = self.outcome_asks[seq]
            verdict = diagnose.outcome(ask["held"].get(self._rank_of(m)) for m in self._live())
            if verdict is None and now < ask["until"]:
                continue
            del self.outcome_asks[seq]
            if verdict is not None:
                self.outcomes[seq] = verdict
                self._note(f"generation {self.generation}: op #{seq} "
                           f"{'counts' if verdict == 'commit' else 'is dropped'} on every "
                           "survivor")
            for ident in ask["askers"]:
                self._send(ident, {"t": "outcome", "seq": seq, "verdict": verdict})

    # --- reconstruction ------------------------------------------------------------------------
    def _on_join_request(self, ident, msg):
        if self._forming_has(msg["mid"]):
            # a joiner told 'unformed' asks again, but the next attempt already took it: its
            # regroup is on the way
            return
        self.joiners[msg["mid"]] = ident
        self.beats.setdefault(msg["mid"], (b"", time.monotonic(), {}))
        self._note(f"a replacement worker waits to join (pid {msg.get('pid')})")

    def _on_reconstruct(self, ident, msg):
        mid = msg["mid"]
        if self.members is None or mid not in self.members or mid in self.failed:
            reason = self.failed.get(mid, f"not a member of generation {self.generation}")
            self._send(ident, {"t": "evicted", "reason": reason})
            return
        if msg["generation"] != self.generation:
            self._send(ident, {"t": "error", "message":
                               f"reconstruct from generation {msg['generation']}, but the group "
                               f"is at generation {self.generation}"})
            return
        if self.round is None:
            self.round = {"asked": {}, "timeout": float(msg["timeout"]),
                          "deadline": time.monotonic() + float(msg["timeout"])}
        self.round["asked"][mid] = ident

    def _check_round(self):
        r = self.round
        if r is None or self.forming is not None:
            if self.forming is not None:
                self._check_forming()
            return
        live = self._live()
        waiting = [m for m in live if m not in r["asked"]]
        if waiting and time.monotonic() < r["deadline"]:
            return
        self.round = None
        if waiting:
            ranks = sorted(self._rank_of(m) for m in waiting)
            if 2 * len([m for m in live if m in r["asked"]]) < len(live):
                # A minority must not expel a majority that is busy elsewhere (e.g. in an op):
                # the askers are told instead, and nobody is removed.
                for ident in r["asked"].values():
                    self._send(ident, {"t": "error", "message":
                               f"rank(s) {ranks} did not call reconstruct() within the "
                               "deadline (are all ranks calling the same collectives?)"})
                return
            self._declare(waiting, "did not call reconstruct() before the deadline")
        asked = {m: i for m, i in r["asked"].items() if m in self._live()}
        if not self.failed and not self.joiners and not self.dissolved:
            for ident in asked.values():
                self._send(ident, {"t": "unchanged", "generation": self.generation})
            return
        old = [m for m in self.members if m in asked]
        new_members = old + list(self.joiners)
        idents = dict(asked)
        idents.update(self.joiners)
        self.joiners = {}
        # A fresh number for every attempt: an address sent for an attempt that failed
        # can never be taken for the next one.
        gen = self.tried = max(self.tried, self.generation) + 1
        self.forming = {"generation": gen, "members": new_members, "idents": idents,
                        "infos": {}, "gone": set(),
                        "deadline": time.monotonic() + r["timeout"]}
        for rank, m in enumerate(new_members):
            self._send(idents[m], {"t": "regroup", "generation": gen, "rank": rank,
                                   "world_size": len(new_members)})

    def _forming_has(self, mid):
        return self.forming is not None and mid in self.forming["members"]

    def _on_address(self, ident, msg):
        f = self.forming
        gen = msg["generation"]
        if f is None or gen != f["generation"] or msg["mid"] not in f["members"]:
            if self.generation < gen <= self.tried:
                # for an attempt that failed: its sender has been told so ('unformed')
                log.debug("coordinator: dropped an address for failed generation %d", gen)
                return
            self._send(ident, {"t": "error", "message": "address for a generation not forming"})
            return
        f["infos"][msg["mid"]] = msg["info"]
        f["idents"][msg["mid"]] = ident
        self._check_forming()

    def _vanished(self, f) -> dict:
        """Forming members that cannot be part of it, each with why: removed from the old
        generation meanwhile (heartbeat timeout, leave), a joiner that left or went quiet,
        or one whose address is still missing at the deadline. Heartbeats, not only the
        deadline (the reconstruct timeout, 30 s by default): the members wait for this."""
        now = time.monotonic()
        why = {}
        for m in f["members"]:
            quiet = now - self.beats.get(m, (b"", now, {}))[1]
            if m in f["gone"]:
                why[m] = "left"
            elif m in self.failed:
                why[m] = self.failed[m]
            elif quiet > self.heartbeat_timeout:
                why[m] = f"sent no heartbeat for {quiet:.1f} s"
            elif m not in f["infos"] and now >= f["deadline"]:
                why[m] = "sent no address before the deadline"
        return why

    def _unform(self, f, vanished: dict):
        """Give up generation f: tell every member of it that is still there ('unformed'; an
        old member's retry of reconstruct() then forms a new generation, see `dissolved`),
        requeue its joiners for that attempt, and evict the old members that vanished."""
        gen = f["generation"]
        lost = [m for m in f["members"] if m in vanished]
        failed_ranks = sorted(self._rank_of(m) for m in lost if m in self.members)
        reason = f"generation {gen} did not form: " + "; ".join(
            f"new rank {f['members'].index(m)} "
            f"({'old rank %d' % self._rank_of(m) if m in self.members else 'a joiner'}) "
            f"{vanished[m]}" for m in lost)
        self._declare([m for m in lost if m in self.members], reason)
        requeued = {}
        for m in f["members"]:
            if m in vanished and m in self.members:
                # removed: if it is only slow, its wait for the welcome ends now
                self._send(f["idents"][m], {"t": "evicted", "reason": reason})
                continue
            self._send(f["idents"][m], {"t": "unformed", "generation": gen,
                                        "from_generation": self.generation,
                                        "failed_ranks": failed_ranks, "reason": reason})
            if m not in self.members and m not in vanished:
                requeued[m] = f["idents"][m]
        self.joiners = {**requeued, **self.joiners}   # first in line, in their order
        self.forming = None
        self.dissolved = True
        self._note(reason)

    def _check_forming(self):
        f = self.forming
        vanished = self._vanished(f)
        if vanished:
            self._unform(f, vanished)
            return
        if len(f["infos"]) < len(f["members"]):
            return
        old_size = len(self.members)
        self.generation = f["generation"]
        self.members = f["members"]
        self.failed = {}
        self.outcome_asks, self.outcomes = {}, {}
        self.dissolved = False
        infos = [f["infos"][m] for m in self.members]
        now = time.monotonic()
        for m in self.members:
            hb = self.beats.get(m, (b"", now, {}))
            self.beats[m] = (hb[0], now, hb[2])   # a fresh start for the timeout clock
            self._send(f["idents"][m], {"t": "welcome", "generation": self.generation,
                                        "infos": infos})
        self.forming = None
        self._note(f"generation {self.generation} formed: {old_size} -> {len(self.members)} ranks")


def _state_of(msg):
    return {"seq": msg["seq"], "in_op": msg["in_op"], "waiting_on": msg["waiting_on"],
            "sent": msg.get("sent"), "recv": msg.get("recv")}


class CoordinatorClient:
    """A process's link to the coordinator: join, heartbeats (own thread), diagnosis,
    reconstruction, leave. One per process; it outlives the groups it builds."""

    def __init__(self, address: str, rank: int | None, world_size: int | None,
                 heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL):
        self.address = address
        self.rank = rank
        self.world_size = world_size
        self.heartbeat_interval = heartbeat_interval
        self.mid = uuid.uuid4().hex
        self.ctx = zmq.Context(io_threads=1)
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://{address}")
        self._lock = threading.Lock()          # the control socket serves several threads
        self._hb_thread = None
        self._stop = threading.Event()
        self.transport = None
        self.left = False
        self.closed = False
        self._abandon = threading.Event()      # set by abandon_join()
        self._abandon_reason = ""

    def _request(self, msg: dict | None, want: tuple, timeout: float, op: str = "rendezvous",
                 abandon: threading.Event | None = None, match_seq: int | None = None):
        """Send `msg` (if any) and wait for a reply whose type is in `want`; None after
        `timeout` s, or once `abandon` is set. A wait that can be abandoned polls in slices of
        ABANDON_POLL s: whoever abandons it may be a signal handler, which can only set a flag
        (the zmq poll it interrupts resumes afterwards)."""
        with self._lock:
            if msg is not None:
                self.sock.send(_pack(msg))
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                wait = remaining if abandon is None else min(remaining, ABANDON_POLL)
                if not self.sock.poll(int(wait * 1000) + 1):
                    # checked only when nothing came: an answer already queued (an admission,
                    # say) is taken, not dropped
                    if abandon is not None and abandon.is_set():
                        return None
                    continue
                reply = _unpack(self.sock.recv())
                if reply is None:
                    continue
                if reply["t"] == "error":
                    raise CollectiveError(f"{op}: coordinator at {self.address}: "
                                          f"{reply['message']}", op=op, rank=self.rank)
                if reply["t"] == "evicted" and "evicted" not in want:
                    raise Evicted(f"{op}: rank {self.rank} was removed from the group: "
                                  f"{reply['reason']}", op=op, rank=self.rank,
                                  failed_ranks=[self.rank] if self.rank is not None else ())
                if reply["t"] in want and (match_seq is None or reply.get("seq") == match_seq):
                    return reply

    def join(self, info: dict, timeout: float) -> tuple[int, list[dict]]:
        """Generation 0: block until all world_size ranks have joined; (generation, infos)."""
        reply = self._request({"t": "join", "rank": self.rank, "world_size": self.world_size,
                               "mid": self.mid, "info": dict(info, pid=os.getpid())},
                              ("welcome",), timeout, "init_process_group")
        if reply is None:
            status = self._request({"t": "status"}, ("status",), 1.0, "init_process_group")
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

    def request_join(self, timeout: float) -> dict:
        """A replacement: wait to be admitted at the members' next reconstruct(); the regroup.
        abandon_join() (another thread, a signal handler) ends the wait early: CollectiveError.
        Either way a caller that gives up should leave(), withdrawing the request."""
        t0 = time.monotonic()
        reply = self._request({"t": "join_request", "mid": self.mid, "pid": os.getpid()},
                              ("regroup",), timeout, "init_process_group", abandon=self._abandon)
        if reply is None and self._abandon.is_set():
            raise CollectiveError(f"init_process_group(join=True): gave up waiting to be "
                                  f"admitted after {time.monotonic() - t0:.1f} s: "
                                  f"{self._abandon_reason}", op="init_process_group")
        if reply is None:
            raise CollectiveTimeout(f"init_process_group(join=True): not admitted within "
                                    f"{timeout:g} s (the members admit joiners when they call "
                                    "reconstruct())", op="init_process_group")
        return reply

    def regroup(self, generation: int, timeout: float):
        """reconstruct(): None if nothing changed, else the regroup message (new rank etc.)."""
        reply = self._request({"t": "reconstruct", "mid": self.mid, "generation": generation,
                               "timeout": timeout}, ("unchanged", "regroup"), timeout + 5.0,
                              "reconstruct")
        if reply is None:
            raise CollectiveTimeout(f"reconstruct: rank {self.rank} got no answer from the "
                                    f"coordinator within {timeout + 5:g} s", op="reconstruct",
                                    rank=self.rank)
        return None if reply["t"] == "unchanged" else reply

    def exchange_addresses(self, generation: int, info: dict, timeout: float) -> list[dict]:
        """The regroup's second half: send this rank's transport address, get everybody's.
        PeerFailure if the generation does not form (somebody told its new rank vanished):
        a member calls reconstruct() again, a joiner waits to be admitted again."""
        reply = self._request({"t": "address", "mid": self.mid, "generation": generation,
                               "info": dict(info, pid=os.getpid())}, ("welcome", "unformed"),
                              timeout + 35.0, "reconstruct")
        if reply is None:
            raise CollectiveTimeout(f"reconstruct: {self._who()}: generation {generation} did "
                                    f"not form within {timeout + 35:g} s", op="reconstruct",
                                    rank=self.rank, generation=generation)
        if reply["t"] == "unformed":
            failed = reply["failed_ranks"]
            raise PeerFailure(f"reconstruct: {self._who()}: {reply['reason']}",
                              op="reconstruct", rank=self.rank, failed_ranks=failed,
                              peer=failed[0] if failed else None,
                              generation=reply["from_generation"])
        return reply["infos"]

    def _who(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else \
            f"a joiner (pid {os.getpid()})"

    def diagnose(self, seq: int, waiting_on):
        """Ask whom to blame for op `seq` stalling. Same verdict on every rank that asks; the
        coordinator evicts the culprits. Returns (culprits, why, evicted)."""
        t = self.transport
        msg = dict(self._state(t), t="diagnose", seq=seq, waiting_on=waiting_on)
        reply = self._request(msg, ("verdict",), max(2.0, 4 * self.heartbeat_interval),
                              "diagnose")
        if reply is None:
            raise TimeoutError("no verdict from the coordinator")
        evicted = reply.get("evicted", False) and ("stalled" if reply.get("stall") else "failed")
        return reply["culprits"], reply["why"], evicted

    def outcome(self, seq: int, timeout: float) -> str | None:
        """Whether op `seq`, which failed while this rank held its result, counts on every
        survivor ('commit') or on none ('abort'); None if the coordinator cannot tell in
        time. Waits while another survivor still moves data (its own deadline bounds that)."""
        t = self.transport
        msg = dict(self._state(t), t="outcome", seq=seq, timeout=timeout)
        reply = self._request(msg, ("outcome",), timeout + 5.0, "outcome", match_seq=seq)
        return None if reply is None else reply["verdict"]

    def publish(self):
        """Send this rank's state now (its op just failed), not at the next heartbeat."""
        with self._lock:
            self.sock.send(_pack(dict(self._state(self.transport), t="progress")))

    def abandon_join(self, reason: str):
        """Make a request_join() in progress (or about to start) give up within ABANDON_POLL s.
        Only sets a flag: safe from a signal handler."""
        self._abandon_reason = reason
        self._abandon.set()

    def leave(self, timeout: float = 1.0):
        """Announce departure (preemption), or withdraw a join request not yet granted. Uses
        its own socket: safe from a signal handler. A no-op once the link is closed (the
        context is gone; a closed link's member was evicted or has left already)."""
        if self.left or self.closed:
            return
        self.left = True
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        try:
            s.connect(f"tcp://{self.address}")
            s.send(_pack({"t": "leave", "mid": self.mid, "pid": os.getpid()}))
            s.poll(int(timeout * 1000))
        finally:
            s.close(linger=0)

    # --- heartbeats ----------------------------------------------------------------------------
    def start_heartbeat(self, transport):
        self.transport = transport
        if self._hb_thread is None:
            self._hb_thread = threading.Thread(target=self._beat_loop, daemon=True,
                                               name="collectives-heartbeat")
            self._hb_thread.start()

    def _state(self, t):
        if t is None:
            return {"mid": self.mid, "generation": -1, "seq": -1, "in_op": False,
                    "waiting_on": None, "sent": None, "recv": None}
        return {"mid": self.mid, "generation": t.generation, "seq": t.seq, "in_op": t.in_op,
                "waiting_on": t.waiting_on, "sent": t.sent_counts, "recv": t.recv_counts,
                "has_data": t.has_data, "done": [[s, how] for s, how in t.done.items()]}

    def _beat_loop(self):
        # Its own socket: a zmq socket belongs to one thread.
        hb = self.ctx.socket(zmq.DEALER)
        hb.setsockopt(zmq.LINGER, 0)
        hb.connect(f"tcp://{self.address}")
        try:
            next_beat = 0.0
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_beat:
                    hb.send(_pack(dict(self._state(self.transport), t="beat")))
                    next_beat = now + self.heartbeat_interval
                if hb.poll(int(max(0.0, next_beat - now) * 1000) + 1):
                    msg = _unpack(hb.recv())
                    if msg is not None:
                        self._on_notice(hb, msg)
        except zmq.ContextTerminated:
            pass        # close() gave up waiting for this thread and terminated the context
        finally:
            hb.close(linger=0)

    def _on_notice(self, hb, msg):
        t = self.transport
        if msg["t"] == "ping":
            hb.send(_pack(dict(self._state(t), t="state")))
        elif msg["t"] == "failure" and t is not None and msg["generation"] == t.generation:
            ranks = msg["failed_ranks"]
            # a stall's culprits: the same error type as the rank whose deadline fired first
            cls = PeerTimeout if msg.get("op") is not None else PeerFailure
            failure = cls(
                f"rank(s) {', '.join(map(str, ranks))} of generation {t.generation} "
                f"{msg['reason']}; call reconstruct() to go on without them",
                failed_ranks=ranks, generation=t.generation, rank=t.rank,
                peer=ranks[0] if ranks else None)
            failure.graceful = bool(msg.get("graceful"))
            t.interrupt(failure)
        elif msg["t"] == "evicted" and t is not None and not isinstance(t.failure, Evicted):
            t.interrupt(Evicted(f"rank {t.rank} of generation {t.generation} was removed from "
                                f"the group: {msg['reason']}", failed_ranks=[t.rank],
                                generation=t.generation, rank=t.rank))

    def close(self):
        """Stop the heartbeat thread and close the sockets; tells the coordinator nothing
        (leave() does). Idempotent. Returns within 2 * CLOSE_TIMEOUT s whatever the thread
        does: a heartbeat thread stuck outside ZeroMQ (in a transport's state, say) keeps its
        socket open, and ctx.term() waits for every socket of the context."""
        if self.closed:
            return
        self.closed = True     # first: a leave() from a signal handler meanwhile does nothing
        self._stop.set()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=CLOSE_TIMEOUT)
            if self._hb_thread.is_alive():
                log.warning("coordinator link of %s: the heartbeat thread did not stop within "
                            "%g s; terminating its ZeroMQ context under it", self._who(),
                            CLOSE_TIMEOUT)
        self.sock.close(linger=0)
        term_context(self.ctx, CLOSE_TIMEOUT, f"coordinator link of {self._who()}")
