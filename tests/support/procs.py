"""ProcessSet: the one harness for every test that runs real processes.

Invariants:
  * every process runs in a session of its own, so that a signal to its process group reaches
    whatever it started too (a worker under `ip netns exec`, say); processes that a child
    starts in sessions of their own (the launcher's workers) can be adopted, and are killed
    too -- only if the pid still names the same process;
  * stdout is read on a thread of its own: every line is kept (lines(), text()), and each line
    that is a JSON object is also an event with "proc" set to the process's name; the last
    event of every process is {"event": "exit", "code": ..., "t": ...}. stderr goes to
    TMP/NAME.stderr (or into stdout, with merge_stderr=True);
  * every wait has a deadline, and a wait that fails says what it waited for, with the last
    events and the processes' output;
  * close() kills and reaps every process, whatever happened, then stops the in-test
    coordinator if there is one.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from collectives.launch.hosting import dies_with_parent

from .timing import scaled

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass
class Result:
    code: int | None
    out: str
    err: str

    @property
    def output(self) -> str:
        return self.out + self.err


def clean_env(**extra) -> dict:
    """os.environ without anything that would tie a child to another job, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "COLLECTIVES_COORDINATOR",
            "COLLECTIVES_TRANSPORT",
            "COLLECTIVES_JOIN",
            "COLLECTIVES_FAULTS",
            "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_USE_AGENT_STORE",
            "MPI_LOCALRANKID",
        )
        # a test run inside mpiexec, mpirun or a Slurm job must not hand on its place
        and not k.startswith(("OMPI_COMM_WORLD_", "PMI_", "SLURM_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _dies_with_test():
    """Every child is SIGKILLed when the test process dies, so a pytest killed outright (by
    hand, or pytest-timeout's thread method, which exits without teardown) leaves no workers
    holding CPUs, ports and namespaces. Linux delivers the signal when the forking *thread*
    ends, so only children forked by the main thread, which lives as long as the process, get it."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return dies_with_parent(signal.SIGKILL)


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for whoever adopts it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start_time(pid: int):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class ProcessSet:
    stderr_chars = 1500  # of each process's stderr, in a failed wait's message

    def __init__(self, tmp_path, coordinator=None):
        self.tmp = Path(tmp_path)
        self.coordinator = coordinator  # a Coordinator in the test process, or None
        self.procs: dict[str, subprocess.Popen] = {}
        self.events: queue.Queue = queue.Queue()  # filled by the reader threads
        self.seen: list[dict] = []  # every event taken off the queue, in order
        self._lines: dict[str, list[str]] = {}
        self._readers: dict[str, threading.Thread] = {}
        self._cond = threading.Condition()
        self.adopted: dict[int, str | None] = {}  # pid -> its start time when adopted

    @classmethod
    def factory(cls, tmp_path):
        """A fixture's body (`yield from Job.factory(tmp_path)`): yields make(world_size, **kw)
        -> cls(world_size, tmp_path, **kw), and closes every one made at teardown."""
        made = []

        def make(*args, **kw):
            made.append(cls(*args, tmp_path, **kw))
            return made[-1]

        yield make
        for m in made:
            m.close()

    # --- processes ---------------------------------------------------------------------------
    def spawn(
        self, name: str, argv, env, *, merge_stderr: bool = False, stdin=None, on_line=None
    ) -> subprocess.Popen:
        """Start `argv` as process `name` (cwd: the repository). on_line(line) is called from
        the reader thread for every line of stdout (e.g. to adopt the pids it names)."""
        with open(self.tmp / f"{name}.stderr", "w") as err:  # the child keeps its own copy
            p = subprocess.Popen(
                [str(a) for a in argv],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL if stdin is None else stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_stderr else err,
                text=True,
                start_new_session=True,
                preexec_fn=_dies_with_test(),
            )
        self.procs[name] = p
        self._lines[name] = []
        t = threading.Thread(target=self._read, args=(name, p, on_line), daemon=True)
        self._readers[name] = t
        t.start()
        return p

    def _read(self, name, p, on_line):
        for line in p.stdout:
            line = line.rstrip("\n")
            with self._cond:
                self._lines[name].append(line)
                self._cond.notify_all()
            if on_line is not None:
                on_line(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not an event: a stray print, or a line cut short by a kill
            if isinstance(event, dict):
                event["proc"] = name
                self.events.put(event)
        # stdout closed: the process is gone or going; its exit is its last event
        code = p.wait()
        self.events.put({"event": "exit", "proc": name, "code": code, "t": time.time()})
        with self._cond:
            self._cond.notify_all()

    def adopt(self, pid: int):
        """Kill `pid` too at close() (if it is still the same process)."""
        self.adopted[pid] = _start_time(pid)

    def adopted_alive(self) -> list[int]:
        """The adopted processes still running (the same process, not a zombie): what close()
        would kill."""
        alive = []
        for pid, started in self.adopted.items():
            if started is None or _start_time(pid) != started:
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in ("Z", "X"):
                alive.append(pid)
        return alive

    def lines(self, name) -> list[str]:
        with self._cond:
            return list(self._lines[name])

    def text(self, name) -> str:
        return "\n".join(self.lines(name))

    def stderr(self, name) -> str:
        path = self.tmp / f"{name}.stderr"
        return path.read_text() if path.exists() else ""

    # --- waiting -----------------------------------------------------------------------------
    def wait(self, names=None, timeout: float = 60.0) -> list[Result]:
        """Wait for the processes `names` (default: all) to exit; their Results. A process
        still running after `timeout` s in all (scaled: timing.py) fails the test, after every
        one is killed."""
        names = (
            list(self.procs)
            if names is None
            else [names]
            if isinstance(names, str)
            else list(names)
        )
        timeout = scaled(timeout)
        deadline = time.monotonic() + timeout
        for name in names:
            try:
                self.procs[name].wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                self.fail(f"{name} still ran after {timeout:g} s")
        results = []
        for name in names:
            self._readers[name].join(10)  # a grandchild holding the pipe must not hang us
            results.append(
                Result(self.procs[name].returncode, self.text(name) + "\n", self.stderr(name))
            )
        return results

    def wait_for_line(
        self, name, pattern, timeout: float = 60.0, start: int = 0, check=None
    ) -> tuple[int, re.Match]:
        """The first stdout line of `name` from index `start` on that matches `pattern` (and
        passes `check`): (index, match). Fails the test after `timeout` s, or once `name`
        ended without it (`timeout` scaled: timing.py)."""
        timeout = scaled(timeout)
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        i = start
        with self._cond:
            while True:
                lines = self._lines[name]
                while i < len(lines):
                    m = rx.search(lines[i])
                    if m and (check is None or check(m)):
                        return i, m
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or not self._readers[name].is_alive():
                    break
                self._cond.wait(min(left, 0.5))
        self.fail(f"no line of {name} matching {pattern!r} within {timeout:g} s")

    def wait_for_file(self, path, timeout: float = 30.0, what: str = "") -> str:
        """The contents of `path` once it exists and is not empty (`timeout` scaled)."""
        timeout = scaled(timeout)
        deadline = time.monotonic() + timeout
        path = Path(path)
        while time.monotonic() < deadline:
            if path.exists() and path.read_text().strip():
                return path.read_text().strip()
            time.sleep(0.05)
        self.fail(f"no {what or path} within {timeout:g} s")

    def wait_for(self, predicate, timeout, what: str = "event", ends=None):
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
        """Every event seen so far, then the new ones as they come, for `timeout` s (scaled:
        timing.py)."""
        timeout = scaled(timeout)
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
        out = "\n".join(
            f"--- {n} stdout ---\n" + "\n".join(self.lines(n)[-30:])
            for n in self.procs
            if self.lines(n)
        )
        raise AssertionError(
            f"{why}; last events: {self.seen[-12:]}\n{notes}{out}\n{self.stderr_tail()}"
        )

    def notes(self) -> list[str]:
        """What the in-test coordinator noted (its thread appends: read a copy)."""
        return [what for _, what in list(self.coordinator.events)]

    def stderr_tail(self) -> str:
        out = []
        for name in self.procs:
            text = self.stderr(name)[-self.stderr_chars :]
            if text.strip():
                out.append(f"--- {name} stderr ---\n{text}")
        return "\n".join(out)

    # --- teardown ------------------------------------------------------------------------------
    def kill(self):
        """SIGKILL every process (its whole session) and every adopted one still alive."""
        # SIGCONT after SIGKILL: a process the test stopped must not be left stopped, whatever
        # the kernel does with a kill sent to a stopped process.
        self.signal_running(signal.SIGKILL, signal.SIGCONT)
        for pid, started in self.adopted.items():
            if started is not None and _start_time(pid) == started:
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except OSError:
                        pass

    def close(self, reap_timeout: float = 10.0):
        self.kill()
        self.reap(reap_timeout)
        if self.coordinator is not None:
            self.coordinator.stop()

    def signal_running(self, *signals):
        """Send each of `signals` to the process group of every process not yet reaped."""
        for p in self.procs.values():
            if p.poll() is None:
                for sig in signals:
                    try:
                        os.killpg(p.pid, sig)
                    except OSError:
                        pass  # the group is gone already

    def reap(self, timeout: float):
        """Wait for every process, `timeout` s in all; one still running after that is left
        (the test's teardown must end, whatever a process does)."""
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
