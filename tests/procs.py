"""Worker processes of the multi-process tests, and the JSON events they report.

ProcessSet is the machinery that tests/cluster.py (Cluster), tests/test_elastic_cleanup.py
(Workers) and tests/test_formation.py (Job) share; each adds its own worker script and env.

Invariants:
  * every worker runs in a session of its own, so that a signal to its process group reaches
    whatever it started too (a worker under `ip netns exec`, say);
  * a worker's stderr goes to TMP/NAME.stderr, its stdout is read on a thread of its own, one
    JSON object a line, each an event with "proc" set to the worker's name; the last event
    of every worker is {"event": "exit", "code": ..., "t": ...};
  * a wait has a deadline, and a wait that fails says what it waited for, with the last
    events and the workers' stderr;
  * close() kills and reaps every worker, whatever happened, then stops the in-test
    coordinator if there is one.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time


class ProcessSet:
    stderr_chars = 1500     # of each worker's stderr, in a failed wait's message

    def __init__(self, tmp_path, coordinator=None):
        self.tmp = tmp_path
        self.coordinator = coordinator              # a Coordinator in the test process, or None
        self.procs: dict[str, subprocess.Popen] = {}
        self.events: queue.Queue = queue.Queue()    # filled by the reader threads
        self.seen: list[dict] = []                  # every event taken off the queue, in order

    @classmethod
    def factory(cls, tmp_path):
        """A fixture's body (`yield from Job.factory(tmp_path)`): yields make(world_size, **kw)
        -> cls(world_size, tmp_path, **kw), and closes every one made at teardown."""
        made = []

        def make(world_size, **kw):
            made.append(cls(world_size, tmp_path, **kw))
            return made[-1]
        yield make
        for m in made:
            m.close()

    # --- processes ---------------------------------------------------------------------------
    def spawn(self, name: str, argv, env) -> subprocess.Popen:
        """Start `argv` as worker `name`. (Subclasses' spawn() builds argv and env for their
        worker script and calls this.)"""
        with open(self.tmp / f"{name}.stderr", "w") as err:    # the child keeps its own copy
            p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                                 start_new_session=True)
        self.procs[name] = p
        threading.Thread(target=self._read, args=(name, p), daemon=True).start()
        return p

    def _read(self, name, p):
        for line in p.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue        # not an event: a stray print, or a line cut short by a kill
            event["proc"] = name
            self.events.put(event)
        # stdout closed: the process is gone or going; its exit is its last event
        code = p.wait()
        self.events.put({"event": "exit", "proc": name, "code": code, "t": time.time()})

    # --- waiting for events --------------------------------------------------------------------
    def wait_for(self, predicate, timeout: float, what: str = "event", ends=None):
        """Return the first event (already seen or new) for which predicate(event) is true.

        Events are looked at in the order they came. `ends(event)` true means the awaited
        event can no longer come (its process ended without it): fail at once rather than at
        the deadline."""
        for e in self._events(timeout, what):
            if predicate(e):
                return e
            if ends is not None and ends(e):
                self.fail(f"no {what}, and there will be none after {e}")

    def _events(self, timeout, what):
        """Every event seen so far, then the new ones as they come, for `timeout` s."""
        yield from self.seen
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.fail(f"no {what} within {timeout:g} s")
            try:
                e = self.events.get(timeout=remaining)
            except queue.Empty:
                continue
            self.seen.append(e)
            yield e

    def fail(self, why: str):
        notes = f"coordinator: {self.notes()[-8:]}\n" if self.coordinator is not None else ""
        raise AssertionError(f"{why}; last events: {self.seen[-12:]}\n{notes}"
                             f"{self.stderr_tail()}")

    def notes(self) -> list[str]:
        """What the in-test coordinator noted (its thread appends: read a copy)."""
        return [what for _, what in list(self.coordinator.events)]

    def stderr_tail(self) -> str:
        out = []
        for name in self.procs:
            path = self.tmp / f"{name}.stderr"
            text = path.read_text()[-self.stderr_chars:] if path.exists() else ""
            if text.strip():
                out.append(f"--- {name} stderr ---\n{text}")
        return "\n".join(out)

    # --- teardown ------------------------------------------------------------------------------
    def close(self, reap_timeout: float = 10.0):
        # SIGCONT after SIGKILL: a worker the test stopped must not be left stopped, whatever
        # the kernel does with a kill sent to a stopped process.
        self.signal_running(signal.SIGKILL, signal.SIGCONT)
        self.reap(reap_timeout)
        if self.coordinator is not None:
            self.coordinator.stop()

    def signal_running(self, *signals):
        """Send each of `signals` to the process group of every worker not yet reaped."""
        for p in self.procs.values():
            if p.poll() is None:
                for sig in signals:
                    try:
                        os.killpg(p.pid, sig)
                    except OSError:
                        pass        # the group is gone already

    def reap(self, timeout: float):
        """Wait for every worker, `timeout` s in all; one still running after that is left
        (the test's teardown must end, whatever a worker does)."""
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
