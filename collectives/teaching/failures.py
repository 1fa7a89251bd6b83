"""Failures as a story (`python -m collectives.explain crash|reconstruct|join`): a real job of
worker processes loses a rank, drops the step it was in, forms the next generation with the
ranks renumbered, and admits a joiner that is given the model.

    story = run_story("KILL")     # SIGKILL: the kernel closes the dead rank's connections
    story = run_story("STOP")     # SIGSTOP: no signal at all; heartbeats find it
    print(text(story, "crash"))   # also "reconstruct", "join"

The driver (this module) hosts the coordinator on port 0 in this process (short heartbeats:
0.2 s, declared dead after 2 s, well after a closed connection is noticed) and starts `n`
workers (failure_worker.py), each a process of its own that reports JSON events. Rank
`victim` stops after `stop_at` steps; the driver sends it the signal once every other rank has
finished that step, and starts a joiner once the survivors have formed the next generation.
Every process is killed and reaped on the way out, whatever happened.

What is timed (detection: signal -> the survivors' PeerFailure) is real and varies from run to
run; the sequence of events -- who failed, which step was dropped, the new ranks, the
admission, the final model -- does not, and the tests check it.

stepped_crash() tells the same first moments on the in-process transport with the stepper
(teaching/step.py), deterministically: a rank stops in the middle of a ring all_reduce, the
others run until they cannot move, and the commit-or-drop rule (membership/diagnose.py) is
applied to what each survivor holds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..common import config

HB = {"COLLECTIVES_HEARTBEAT_INTERVAL": "0.2", "COLLECTIVES_HEARTBEAT_TIMEOUT": "2"}


@dataclass
class Story:
    signal: str  # "KILL" or "STOP"
    n: int
    victim: int  # rank of generation 0 that was killed or stopped
    stop_at: int  # steps it finished before
    steps: int
    events: list = field(default_factory=list)  # (proc, event dict), in arrival order
    coordinator: list = field(default_factory=list)  # (seconds since start, what happened)
    t0: float = 0.0  # wall time of the start
    t_signal: float | None = None  # wall time the signal was sent
    joined: bool = False

    def of(self, kind: str, proc: str | None = None) -> list:
        return [e for p, e in self.events if e["event"] == kind and (proc is None or p == proc)]

    @property
    def failures(self) -> list:
        return self.of("failure")

    @property
    def detection(self) -> float | None:
        """Seconds from the signal to the first survivor's PeerFailure."""
        f = self.failures
        return None if not f or self.t_signal is None else min(e["t"] for e in f) - self.t_signal

    def renumbering(self) -> dict:
        """{rank in generation 0: rank in generation 1} for the survivors."""
        return {e["old_rank"]: e["rank"] for e in self.of("generation") if e["why"] == "failure"}

    def finals(self) -> dict:
        return {p: e for p, e in self.events if e["event"] == "done"}


def _reader(proc: subprocess.Popen, name: str, story: Story, cv: threading.Condition):
    for line in proc.stdout:  # type: ignore[union-attr]
        try:
            e = json.loads(line)
        except ValueError:
            continue
        with cv:
            story.events.append((name, e))
            cv.notify_all()


def run_story(
    sig: str = "KILL",
    n: int = 3,
    victim: int = 1,
    stop_at: int = 2,
    steps: int = 5,
    join: bool = True,
    timeout: float = 60.0,
    watch_grace: float = 0.25,
) -> Story:
    """Run the job; raise RuntimeError (with the workers' stderr) if it does not end well.
    With SIGKILL the workers also watch their peers' connections (closed by the kernel when
    the process ends; transport/zmq/peerwatch.py, down for `watch_grace` s) beside the
    coordinator's witnesses (the victim's pidfd, its closed connection): whichever speaks first
    is named. With SIGSTOP nothing closes, and only the heartbeats tell."""
    from ..common.secret import generate as generate_secret
    from ..membership.server import Coordinator
    from ..common.security import JobKeys

    if sig not in ("KILL", "STOP"):
        raise ValueError(f"failure story: signal must be KILL or STOP, got {sig!r}")
    if n < 3 or not 0 <= victim < n:
        raise ValueError(
            f"failure story: needs n >= 3 and a victim among them (n={n}, victim={victim})"
        )
    story = Story(sig, n, victim, stop_at, steps, t0=time.time(), joined=join)
    # A secret of this job's own, given to the coordinator and (in the environment) to the
    # workers: every socket is authenticated, as in any job (docs/security.md).
    secret = generate_secret()
    coord = Coordinator(
        "127.0.0.1", 0, n, heartbeat_interval=0.2, heartbeat_timeout=2.0, keys=JobKeys(secret)
    ).start()
    cv = threading.Condition()
    procs: dict[str, subprocess.Popen] = {}
    errs: dict[str, str] = {}
    env = config.child_environment(("COLLECTIVES_", "RANK", "WORLD_SIZE", "MASTER_"))
    env.update(
        HB,
        COLLECTIVES_COORDINATOR=coord.address,
        COLLECTIVES_JOB_SECRET=secret.decode(),
        PYTHONUNBUFFERED="1",
    )
    story_args = json.dumps(
        {
            "steps": steps,
            "stop_at": stop_at,
            "stop_rank": victim,
            "want": n if join else n - 1,
            "op_timeout": 20.0,
            "watch_grace": watch_grace if sig == "KILL" else 0.0,
        }
    )

    def spawn(name, **extra):
        p = subprocess.Popen(
            [sys.executable, "-m", "collectives.teaching.failure_worker", story_args],
            env={**env, **extra},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        procs[name] = p
        threading.Thread(target=_reader, args=(p, name, story, cv), daemon=True).start()

        def drain():
            errs[name] = p.stderr.read()[-3000:]  # type: ignore[union-attr]

        threading.Thread(target=drain, daemon=True).start()

    def broken():  # a worker that ended badly (the victim's end is the story)
        return any(
            p.poll() not in (None, 0)
            for nm, p in procs.items()
            if not (nm == f"rank{victim}" and story.t_signal)
        )

    def wait(pred, what):
        deadline = time.monotonic() + timeout
        with cv:
            while not pred() and not broken() and time.monotonic() < deadline:
                cv.wait(0.2)
            if not pred():
                raise RuntimeError(
                    f"failure story: no {what} within {timeout:g} s; "
                    f"events {story.events[-6:]}; stderr "
                    + "; ".join(f"{k}: {v[-800:]}" for k, v in errs.items() if v)
                )

    try:
        for r in range(n):
            spawn(f"rank{r}", RANK=str(r), WORLD_SIZE=str(n))
        wait(
            lambda: len(story.of("step")) >= (n - 1) * stop_at + stop_at and story.of("waiting"),
            f"{stop_at} steps on every rank",
        )
        time.sleep(0.2)  # the survivors are inside the next all_reduce by now
        story.t_signal = time.time()
        os.kill(procs[f"rank{victim}"].pid, getattr(signal, f"SIG{sig}"))
        wait(lambda: len(story.of("generation")) >= n - 1, "next generation")
        if join:
            spawn("joiner", COLLECTIVES_JOIN="1")
        wait(lambda: len(story.finals()) >= (n if join else n - 1), "end of training")
    finally:
        for p in procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(10)
        story.coordinator = [
            (t - story.t0 if t > 1e9 else t, what) for t, what in list(coord.events)
        ]
        coord.stop()
    return story


# --- the first moments, stepped in-process ------------------------------------------------------
@dataclass
class SteppedCrash:
    n: int
    victim: int
    after: int  # events the victim did before it stopped
    log: list  # lines: every event let through
    pending: dict  # rank -> what it waits to do when nobody can move (None: done)
    held: dict  # survivor -> holds the op's result (diagnose.holds_result's answer)
    outcome: str  # 'commit' or 'abort'


def stepped_crash(n: int = 3, victim: int = 1, after: int = 2, count: int = 6) -> SteppedCrash:
    """A ring all_reduce on the stepper; rank `victim` stops after `after` events, the others
    go on until none can move. Which survivor holds its result decides (diagnose.outcome):
    all -> commit, any without -> abort, the same answer for every survivor."""
    from ..membership.diagnose import outcome
    from .step import Stepper

    if not 0 <= victim < n:
        raise ValueError(f"stepped crash: victim {victim} is not a rank of {n}")

    def fn(pg):
        x = np.full(count, 1 << pg.rank, np.int64)
        pg.all_reduce(x, algorithm="ring")
        return x

    s = Stepper(n, fn)
    log, done_by = [], {r: 0 for r in range(n)}
    try:
        while True:
            pend = s.pending()
            movable = [
                r
                for r, p in pend.items()
                if p is not None and (r != victim or done_by[r] < after) and s.can_step(r)
            ]
            if not movable:
                break
            r = movable[0]
            e = s.step(rank=r)
            done_by[r] += 1
            if e is not None:
                arrow = "->" if e["kind"] == "send" else "<-"
                log.append(
                    f"rank {r} {e['kind']:<6} {arrow} rank {e['peer']}  {e['phase']} "
                    f"step {e['step']} chunk {e['chunk']}"
                )
        pend = s.pending()
    finally:
        s.close()
    held = {r: pend[r] is None for r in range(n) if r != victim}
    return SteppedCrash(n, victim, after, log, pend, held, outcome(held.values()) or "abort")


@dataclass
class SteppedStall:
    n: int
    culprit: int
    log: list  # every event let through
    pending: dict  # rank -> what it waits to do when nobody can move
    links: dict  # (src, dst) -> (sent, taken)
    stalled: list  # (src, dst): sent more than taken, and the receiver waits
    blamed: list
    why: str


def stepped_stall(n: int = 3, culprit: int = 1, count: int = 6) -> SteppedStall:
    """A ring all_reduce on the stepper where the links into and out of `culprit` deliver
    nothing (their messages are sent, never taken). Once nobody can move, the snapshot a
    diagnosis takes -- each rank's peer waited on, messages sent and taken per link -- is
    judged by the library's own rule (membership/diagnose.py blame): deterministic, no clock."""
    from ..membership.diagnose import blame, stalled_links
    from ..transport.base import Progress
    from .step import Stepper

    if n < 3 or not 0 <= culprit < n:
        raise ValueError(
            f"stepped stall: needs n >= 3 and a culprit among them (n={n}, culprit={culprit})"
        )
    held = {((culprit - 1) % n, culprit), (culprit, (culprit + 1) % n)}

    def fn(pg):
        x = np.full(count, 1 << pg.rank, np.int64)
        pg.all_reduce(x, algorithm="ring")
        return x

    s = Stepper(n, fn)
    log = []
    try:
        while True:
            pend = s.pending()
            movable = [
                r
                for r, p in pend.items()
                if p is not None
                and s.can_step(r)
                and (p["kind"] == "send" or (p["peer"], r) not in held)
            ]
            if not movable:
                break
            e = s.step(rank=movable[0])
            if e is not None:
                arrow = "->" if e["kind"] == "send" else "<-"
                log.append(
                    f"rank {e['rank']} {e['kind']:<6} {arrow} rank {e['peer']}  "
                    f"{e['phase']} step {e['step']} chunk {e['chunk']}"
                )
        pend, links = s.pending(), s.messages()
    finally:
        s.close()
    states: dict[int, Progress | None] = {
        r: Progress(
            generation=0,
            seq=0,
            in_op=pend[r] is not None,
            waiting_on=pend[r]["peer"] if pend[r] and pend[r]["kind"] != "send" else None,
            sent=tuple(links.get((r, d), (0, 0))[0] for d in range(n)),
            recv=tuple(links.get((p, r), (0, 0))[1] for p in range(n)),
        )
        for r in range(n)
    }
    blamed, why = blame(0, states, n)
    return SteppedStall(n, culprit, log, pend, links, stalled_links(0, states), blamed, why)


def stepped_log(n: int, fn) -> list:
    """Every event of fn on n stepped ranks, one line each (the stepper's own order)."""
    from .step import Stepper

    log = []
    with Stepper(n, fn) as s:
        for e in s:
            arrow = "->" if e["kind"] == "send" else "<-"
            log.append(
                f"rank {e['rank']} {e['kind']:<6} {arrow} rank {e['peer']}  "
                f"{e['phase']} step {e['step']} chunk {e['chunk']}"
            )
        s.results()
    return log


def stepped_redo(survivors: int = 2, count: int = 4) -> list:
    """The dropped step done again on the new generation: a ring all_reduce of `survivors`
    ranks, stepped (the ranks are dense again, so the schedule is the plain one)."""

    def fn(pg):
        x = np.ones(count)
        pg.all_reduce(x, algorithm="ring")
        return x

    return stepped_log(survivors, fn)


def stepped_handover(n: int = 3, count: int = 5) -> list:
    """The joiner given the model: rank 0's broadcast of (step, model) to n ranks, stepped."""

    def fn(pg):
        x = np.arange(count, dtype=np.float64) if pg.rank == 0 else np.zeros(count)
        pg.broadcast(x, src=0)
        return x

    return stepped_log(n, fn)
