"""Step mode: run a simulation with every rank paused before each send and receive, and let
the events happen one at a time -- from a notebook, a debugger or the terminal.

    s = cl.simulate(3, fn, step=True)        # or Stepper(3, fn); nothing has moved yet
    s.pending()        # {rank: the event it waits to do, or None once it is finished}
    s.can_step(1)      # can rank 1's next event happen now?
    s.messages()       # {(src, dst): (sent, taken)} so far
    e = s.step()       # let one event happen; returns its trace event (a dict)
    s.step(rank=2)     # ... choosing the rank
    for e in s: ...    # every remaining event
    s.results()        # run to the end; what fn returned on each rank
    s.close()          # or use it as a context manager

The stepper only lets an event happen that can complete: a send always can, a receive once its
message has been sent. After each event it waits until every rank is paused again (or done),
so which event comes next depends only on the schedule and the choices made: a stepped run is
deterministic and can be replayed. With no rank given, step() picks the next rank that can
move after the last one that did, round-robin.

While paused, a rank's operation is not timing out: the run uses a long `timeout` (default one
hour). Waiting for ranks to pause again is bounded by `settle_timeout`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator, Sequence

from ..group.group import ProcessGroup
from ..transport.wrapper import ChannelWrapper
from .threads import run_ranks
from .trace import Tracer, op_key

__all__ = ["Stepper", "StepperClosed"]


class StepperClosed(RuntimeError):
    """Raised in a paused rank when its stepper is closed before the run ended."""


class Stepper:
    def __init__(
        self,
        world_size: int,
        fn: Callable[[ProcessGroup], Any],
        *,
        wrappers: Sequence[Callable[[Any], Any]] = (),
        tracer: Tracer | None = None,
        record_data: bool = False,
        timeout: float = 3600.0,
        settle_timeout: float = 30.0,
        segment_bytes: int | None = None,
        hosts: Sequence[Any] | None = None,
    ) -> None:
        self.n = world_size
        self.timeout = timeout
        self.tracer = tracer or Tracer(record_data=record_data)
        self.settle_timeout = settle_timeout
        self._cv = threading.Condition()
        self._paused: dict[int, dict] = {}  # rank -> the event it waits to do
        self._granted: set[int] = set()
        self._done: set[int] = set()
        self._sent: dict = {}  # (opkey, src, dst) -> messages sent
        self._taken: dict = {}  # (opkey, src, dst) -> messages received
        self._last = -1
        self._closed = False
        self._results: list[Any] | None = None
        self._error: BaseException | None = None
        self._finished = threading.Event()

        def body(pg):
            try:
                return fn(pg)
            finally:
                with self._cv:
                    self._done.add(pg.rank)
                    self._cv.notify_all()

        def run():
            try:
                self._results = run_ranks(
                    world_size,
                    body,
                    timeout=timeout,
                    segment_bytes=segment_bytes,
                    hosts=hosts,
                    wrappers=[*wrappers, self.tracer.wrap, self._wrap],
                )
            except BaseException as exc:
                self._error = exc
            finally:
                self._finished.set()
                with self._cv:
                    self._cv.notify_all()

        self._thread = threading.Thread(target=run, daemon=True, name="stepper")
        self._thread.start()

    # --- the wrapper each rank's channel goes through --------------------------------------------
    def _wrap(self, ch):
        return _SteppedChannel(ch, self)

    def wait_turn(self, rank: int, what: dict[str, Any]) -> None:
        """A stepped channel's rank waits here, about to do `what`, until it is stepped."""
        with self._cv:
            self._paused[rank] = what
            self._cv.notify_all()
            try:
                if not self._cv.wait_for(
                    lambda: rank in self._granted or self._closed, timeout=self.timeout
                ):
                    raise StepperClosed(
                        f"rank {rank}: nobody stepped the run for {self.timeout:g} s"
                    )
                if rank not in self._granted:
                    raise StepperClosed(
                        f"rank {rank}: the stepper was closed while this rank "
                        f"waited to {what['kind']} ({what['phase']})"
                    )
            finally:
                self._granted.discard(rank)
                del self._paused[rank]
                self._cv.notify_all()

    def sent_one(self, key: tuple[str, int, int]) -> None:
        """A stepped channel sent the message `key` (op key, from, to)."""
        with self._cv:
            self._sent[key] = self._sent.get(key, 0) + 1

    # --- control ------------------------------------------------------------------------------
    def _settle(self):
        """Wait until every rank is paused or finished; return the paused ones."""

        def quiet():
            return self._finished.is_set() or all(
                r in self._paused or r in self._done for r in range(self.n)
            )

        if not self._cv.wait_for(quiet, timeout=self.settle_timeout):
            running = [r for r in range(self.n) if r not in self._paused and r not in self._done]
            raise TimeoutError(
                f"stepper: rank(s) {running} neither paused nor finished within "
                f"{self.settle_timeout:g} s (blocked outside the channel?)"
            )

    def _ready(self, rank: int) -> bool:
        w = self._paused[rank]
        if w["kind"] == "send":
            return True
        key = (w["opkey"], w["peer"], rank)
        return self._taken.get(key, 0) < self._sent.get(key, 0)

    def can_step(self, rank: int) -> bool:
        """Whether `rank` is paused at an event that can happen now (a send, or a receive
        whose message was sent)."""
        with self._cv:
            self._settle()
            return rank in self._paused and self._ready(rank)

    def messages(self) -> dict:
        """{(src, dst): (messages sent, messages taken)} so far, over every operation."""
        with self._cv:
            out: dict = {}
            for (_, src, dst), k in self._sent.items():
                sent, taken = out.get((src, dst), (0, 0))
                out[(src, dst)] = (sent + k, taken)
            for (_, src, dst), k in self._taken.items():
                sent, taken = out.get((src, dst), (0, 0))
                out[(src, dst)] = (sent, taken + k)
            return out

    def pending(self) -> dict:
        """{rank: what it waits to do (kind, peer, phase, step, chunk, nbytes), or None}."""
        with self._cv:
            self._settle()
            return {
                r: (dict(self._paused[r]) if r in self._paused else None) for r in range(self.n)
            }

    @property
    def done(self) -> bool:
        with self._cv:
            self._settle()
            return self._finished.is_set() or len(self._done) == self.n and not self._paused

    def step(self, rank: int | None = None) -> dict | None:
        """Let one event happen (on `rank`, or the next rank that can move); return the trace
        event it produced, or None when the run is over."""
        with self._cv:
            self._settle()
            if not self._paused:
                return None
            if rank is None:
                order = [(self._last + 1 + i) % self.n for i in range(self.n)]
                ready = [r for r in order if r in self._paused and self._ready(r)]
                if not ready:
                    raise RuntimeError(
                        "stepper: every paused rank waits for a message nobody "
                        f"sent: {self._paused}"
                    )
                rank = ready[0]
            elif rank not in self._paused:
                raise ValueError(f"stepper: rank {rank} is not paused at an event")
            elif not self._ready(rank):
                w = self._paused[rank]
                raise ValueError(
                    f"stepper: rank {rank} waits for a message from rank "
                    f"{w['peer']} that has not been sent yet"
                )
            w = self._paused[rank]
            if w["kind"] != "send":
                key = (w["opkey"], w["peer"], rank)
                self._taken[key] = self._taken.get(key, 0) + 1
            before = len(self.tracer.events)
            self._last = rank
            self._granted.add(rank)
            self._cv.notify_all()
            # Wait for this rank to finish the event: it pauses again or ends.
            self._cv.wait_for(lambda: rank not in self._granted, timeout=self.settle_timeout)
            self._settle()
        new = [e for e in self.tracer.events[before:] if e["rank"] == rank]
        return new[-1] if new else None

    def __iter__(self) -> Iterator[dict]:
        while True:
            e = self.step()
            if e is None:
                return
            yield e

    def results(self) -> list:
        """Run to the end and return each rank's result (raises like cl.simulate)."""
        while self.step() is not None:
            pass
        if not self._finished.wait(self.settle_timeout):
            raise TimeoutError(
                f"stepper: every rank is done but the run did not end within "
                f"{self.settle_timeout:g} s"
            )
        if self._error is not None:
            raise self._error
        assert self._results is not None  # set by the run before _finished
        return self._results

    def close(self) -> None:
        """Stop: paused ranks raise StepperClosed, and the run ends with their errors."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(self.settle_timeout)

    def __enter__(self) -> Stepper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _SteppedChannel(ChannelWrapper):
    def __init__(self, ch: Any, stepper: Stepper) -> None:
        super().__init__(ch)
        self._s = stepper
        self._key = op_key(ch)

    def _what(self, kind, peer, buf, phase, step, chunk):
        return {
            "rank": self.rank,
            "kind": kind,
            "peer": peer,
            "opkey": self._key,
            "op": getattr(self._ch, "op_name", ""),
            "phase": phase,
            "step": step,
            "chunk": chunk,
            "nbytes": int(buf.nbytes),
        }

    def send(self, peer, buf, *, phase="", step=0, chunk=0):
        self._s.wait_turn(self.rank, self._what("send", peer, buf, phase, step, chunk))
        self._ch.send(peer, buf, phase=phase, step=step, chunk=chunk)
        self._s.sent_one((self._key, self.rank, peer))

    def recv_into(self, peer, out, *, phase="", step=0, chunk=0):
        self._s.wait_turn(self.rank, self._what("recv", peer, out, phase, step, chunk))
        self._ch.recv_into(peer, out, phase=phase, step=step, chunk=chunk)

    def recv_reduce(self, peer, out, op, *, phase="", step=0, chunk=0):
        self._s.wait_turn(self.rank, self._what("reduce", peer, out, phase, step, chunk))
        self._ch.recv_reduce(peer, out, op, phase=phase, step=step, chunk=chunk)
