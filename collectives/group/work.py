"""Work: the handle an async_op=True call returns, and the thread that runs a group's ops.

A group's operations must run one at a time and in the order they were issued (every rank
numbers them the same way), so each group has one worker thread fed by a FIFO queue. A
blocking call with nothing queued runs directly in the caller's thread, saving a thread hop.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable

from ..common.errors import CollectiveError, CollectiveTimeout


class Work:
    """Like torch.distributed's Work: wait(), is_completed(), exception()."""

    def __init__(self, name: str, fn: Callable[[], object] | None):
        self.name = name
        self._fn: Callable[[], object] | None = fn
        self._done = threading.Event()
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[Work], object]] = []
        self._callback_lock = threading.Lock()

    @classmethod
    def failed(cls, name: str, exc: BaseException) -> "Work":
        """A Work that is over already, with `exc` (an op refused before it ran)."""
        work = cls(name, None)
        work.fail(exc)
        return work

    def execute(self) -> None:
        """Run the op here, in the calling thread (the runner's): once only."""
        exc = None
        try:
            self._fn()  # type: ignore[misc]  # only failed() makes one without fn, never run
        except BaseException as e:  # kept for wait(); the worker thread carries on
            exc = e
        finally:
            self._fn = None
            self._finish(exc)

    def fail(self, exc: BaseException) -> None:
        """End the op with `exc` without running it (refused, or its group shut down)."""
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        self._exc = exc
        with self._callback_lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)

    def add_done_callback(self, fn: Callable[[Work], object]) -> None:
        """Call fn(work) once the op is over (at once if it is), in the thread that ended it."""
        with self._callback_lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the op is over; re-raise its error. timeout=None waits for the op's own
        deadline (every op has one), so this never blocks forever."""
        if not self._done.wait(timeout):
            raise CollectiveTimeout(
                f"{self.name}: Work.wait timed out after {timeout:g} s "
                "(the operation is still running)",
                op=self.name,
            )
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._exc is None

    def exception(self) -> BaseException | None:
        return self._exc

    def result(self) -> None:
        self.wait()
        return None


class DeferredWork(Work):
    """A posted receive (`recv(..., async_op=True)`). It takes its place in the message order
    when issued (its number in the pair's sequence is fixed then), but it occupies the group's
    worker only once somebody waits for it or asks whether it is done. So on two ranks at once
    `w = recv(y, peer, async_op=True); send(x, peer); w.wait()` works, as with Gloo or MPI:
    the send is not queued behind a receive that waits for it. Its deadline counts from then."""

    def __init__(self, name: str, start: Callable[[], Work]):
        super().__init__(name, None)
        self._start: Callable[[], Work] | None = start  # submits the receive to the group
        self._inner: Work | None = None
        self._start_lock = threading.Lock()

    def start(self) -> Work:
        """Submit the receive now (if not yet): it takes the group's worker from here."""
        with self._start_lock:
            if self._inner is None:
                start, self._start = self._start, None
                try:
                    self._inner = start()  # type: ignore[misc]  # None once _inner is set
                except BaseException as exc:  # e.g. the group was destroyed meanwhile
                    self._inner = Work.failed(self.name, exc)
                callbacks, self._callbacks = self._callbacks, []
                for fn in callbacks:
                    self._inner.add_done_callback(fn)
            return self._inner

    def add_done_callback(self, fn: Callable[[Work], object]) -> None:
        """fn(work) once the receive is over; it starts only when waited on or polled."""
        with self._start_lock:
            if self._inner is None:
                self._callbacks.append(fn)
                return
        self._inner.add_done_callback(fn)

    def wait(self, timeout: float | None = None) -> bool:
        return self.start().wait(timeout)

    def is_completed(self) -> bool:
        return self.start().is_completed()

    def is_success(self) -> bool:
        return self.start().is_success()

    def exception(self) -> BaseException | None:
        return self._inner.exception() if self._inner is not None else None


class OpRunner:
    """Runs a group's operations in issue order on one worker thread."""

    def __init__(self, name: str):
        self._queue: queue.Queue[Work | None] = queue.Queue()
        self._outstanding = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._name = name

    def idle(self) -> bool:
        """Nothing queued or running on the worker thread."""
        return self._outstanding == 0

    def on_worker(self) -> bool:
        """Called from an op that the worker thread runs (its own calls run inline)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, work: Work, async_op: bool) -> Work:
        with self._lock:
            inline = not async_op and self._outstanding == 0
            if not inline:
                self._outstanding += 1
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                    self._thread.start()
        if inline:
            work.execute()
            work.wait()
            return work
        self._queue.put(work)
        if not async_op:
            work.wait()
        return work

    def _loop(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            work.execute()
            with self._lock:
                self._outstanding -= 1

    def drain(self, timeout: float) -> bool:
        """Wait (bounded) for queued ops to finish."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._outstanding == 0:
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)

    def stop(self) -> None:
        """End the worker thread after the ops queued so far. An op still queued when it
        does not end within 5 s (one stuck in a wait) fails instead of never completing."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)
            self._thread = None
        while True:
            try:
                work = self._queue.get_nowait()
            except queue.Empty:
                return
            if work is not None:
                work.fail(
                    CollectiveError(
                        f"{work.name}: the process group was shut down before this operation ran",
                        op=work.name,
                    )
                )
