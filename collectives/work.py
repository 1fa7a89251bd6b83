"""Work: the handle an async_op=True call returns, and the thread that runs a group's ops.

A group's operations must run one at a time and in the order they were issued (every rank
numbers them the same way), so each group has one worker thread fed by a FIFO queue. A
blocking call with nothing queued runs directly in the caller's thread, saving a thread hop.
"""
from __future__ import annotations

import queue
import threading
import time

from .errors import CollectiveTimeout


class Work:
    """Like torch.distributed's Work: wait(), is_completed(), exception()."""

    def __init__(self, name: str, fn):
        self.name = name
        self._fn = fn
        self._done = threading.Event()
        self._exc: BaseException | None = None

    def _run(self):
        try:
            self._fn()
        except BaseException as exc:  # kept for wait(); the worker thread carries on
            self._exc = exc
        finally:
            self._fn = None
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the op is over; re-raise its error. timeout=None waits for the op's own
        deadline (every op has one), so this never blocks forever."""
        if not self._done.wait(timeout):
            raise CollectiveTimeout(f"{self.name}: Work.wait timed out after {timeout:g} s "
                                    "(the operation is still running)", op=self.name)
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._exc is None

    def exception(self) -> BaseException | None:
        return self._exc

    def result(self):
        self.wait()
        return None


class OpRunner:
    """Runs a group's operations in issue order on one worker thread."""

    def __init__(self, name: str):
        self._queue: queue.Queue = queue.Queue()
        self._outstanding = 0
        self._lock = threading.Lock()
        self._thread = None
        self._name = name

    def idle(self) -> bool:
        """Nothing queued or running on the worker thread."""
        return self._outstanding == 0

    def submit(self, work: Work, async_op: bool) -> Work:
        with self._lock:
            inline = not async_op and self._outstanding == 0
            if not inline:
                self._outstanding += 1
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name=self._name,
                                                    daemon=True)
                    self._thread.start()
        if inline:
            work._run()
            work.wait()
            return work
        self._queue.put(work)
        if not async_op:
            work.wait()
        return work

    def _loop(self):
        while True:
            work = self._queue.get()
            if work is None:
                return
            work._run()
            with self._lock:
                self._outstanding -= 1

    def drain(self, timeout: float):
        """Wait (bounded) for queued ops to finish."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._outstanding == 0:
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)

    def stop(self):
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)
            self._thread = None
