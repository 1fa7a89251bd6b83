"""The fail-slow scenario (tests/scenarios/test_failslow.py, bench/studies/failslow.py): n
workers on n network-namespace hosts, a standalone coordinator on one more, an 8 MiB
all_reduce(AVG) per step (tests/support/failslow_worker.py); after a healthy stretch tc holds
some links to a rate for good (stall_runs.slow_links: htb classes and u32 filters).

run() returns the workers' results, the coordinator's log and the moment of the slowdown;
speed() says how fast the job ran before it and once adapted.

How the two rates are measured, so that they compare the library with itself and not the
machine at one moment with the machine at another: each is the median step time over a window
of the same length (SPAN s, a few dozen steps or more), the healthy one right before the
slowdown and after a warm-up (the first steps run while the other processes are still
starting and their connections and buffers grow); and the job's processes run at a higher
priority than the rest of the machine (AHEAD: `nice -n -15`). Priority is not enough on
two cores: a step hands data between the ranks hundreds of times, and each hand-over waits
for a core, so another process's burst of work -- a parallel test starting, say -- slows
the steps it overlaps by a third or more whatever the nice value. Those steps are measured,
not guessed: the harness samples the CPU time the rest of the machine uses (Foreign: the
whole machine's, less the job's processes' and its own) every 0.1 s, and each window's
median is over its quiet steps, the ones during which the rest of the machine used less than
QUIET of a CPU; a window runs on until it holds QUIET_STEPS quiet steps (rank 0 writes each
step's time as it ends: $FAILSLOW_TIMES), up to WINDOW_CAP s: a busy machine is measured for
longer rather than not at all. Where a window still found too few quiet steps, the two are
compared whole if the rest of the machine used about as much CPU in each (within QUIET), and
otherwise speed() raises NotMeasured, saying so: the rates were not measured, which says
nothing of the library (the tests skip, which fails under CI=true; the bench reports a row
saying so).
Steps slow for the library's own reasons (a link's test, a schedule still on the slow link) are
quiet steps too, so they count. Before this, a parallel test that started between the two
windows made a job that kept its full rate read 55-71 % (or 140-165 % the other way round).
The thresholds themselves are the issue's.

backend="gloo" runs the same steps over torch.distributed Gloo (failslow_gloo_worker.py), with
no coordinator: the reference that does nothing about a slow link.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

from .ports import coordinator_process
from .procs import clean_env
from .stall_runs import slow_links, wait_for_steps
from .timing import heartbeats

WORKER = str(Path(__file__).resolve().parent / "failslow_worker.py")
GLOO_WORKER = str(Path(__file__).resolve().parent / "failslow_gloo_worker.py")
SPAN = 8.0  # s: the least length of both windows, healthy and adapted
QUIET = 0.25  # CPUs: a step is quiet when the rest of the machine used less than this
QUIET_STEPS = 20  # quiet steps a window runs on for ...
WINDOW_CAP = 60.0  # s: ... up to this long
# The job ahead of the machine's other processes (root runs these scenarios: namespaces).
AHEAD = ["nice", "-n", "-15"] if os.geteuid() == 0 else []
SECRET = "failslow-netns-test-secret-0123456789"


def _cpu_seconds(pid: int | str) -> float:
    """The CPU time (user + system, every thread) a process has used, or 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:
                pass
    return out


TICK = os.sysconf("SC_CLK_TCK")


class Foreign:
    """How much CPU the rest of the machine used: sampled (sample()) as the machine's busy
    time (user, nice, system) less the job's processes' and this process's own."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        self.samples: list[tuple[float, float]] = []  # (time.monotonic(), foreign s so far)

    def sample(self) -> None:
        with open("/proc/stat") as f:
            user, nice, system = (int(x) for x in f.readline().split()[1:4])
        job = sum(_cpu_seconds(p) for top in self.pids for p in _descendants(top))
        self.samples.append(
            (time.monotonic(), (user + nice + system) / TICK - job - _cpu_seconds("self"))
        )

    def rate(self, t0: float, t1: float) -> float:
        """CPUs the rest of the machine used over [t0, t1], from the samples around it; inf
        (not known to be quiet) where no two samples span any of it."""
        if not self.samples or t0 >= self.samples[-1][0]:
            # begun after the last sample: nothing measured it (clamped to the last sample,
            # it would span no time and read 0, quiet)
            return float("inf")
        t1 = min(t1, self.samples[-1][0])  # a window that runs past the last sample: up to it
        before = [x for x in self.samples if x[0] <= t0]
        after = [x for x in self.samples if x[0] >= t1]
        if not before or not after:
            return float("inf")  # not sampled: not known to be quiet
        (a, fa), (b, fb) = before[-1], after[0]
        if b <= a:
            return float("inf")
        return (fb - fa) / (b - a)

    def quiet(self, steps: list[tuple[float, float]]) -> list[float]:
        """The durations of the steps (end, duration) during which the rest of the machine
        used less than QUIET of a CPU."""
        return [t for e, t in steps if self.rate(e - t, e) < QUIET]


class NotMeasured(Exception):
    """The healthy and adapted step rates could not be compared: the rest of the machine was
    too busy in one window or both (which says nothing of the library). `whole`: the medians
    over every step of each window all the same, for the record; `loads`: the CPUs the rest
    of the machine used in each; `kept_at_most`: the most of the healthy rate the job can have
    kept however the load is read (kept_at_most()): a library that does nothing keeps 2-9 %,
    far below it under any load, so a test fails on this bound where it lies under its own."""

    def __init__(
        self,
        why: str,
        whole: tuple[float, float],
        loads: list[float],
        kept_at_most: float = float("inf"),
    ):
        super().__init__(why)
        self.whole = whole
        self.loads = loads
        self.kept_at_most = kept_at_most


def most_stretch(load: float, processes: int, cores: int) -> float:
    """The most `load` CPUs of other work can stretch a step of a job of `processes`
    processes on `cores` cores: were every one of them running flat out all step, they would
    share the cores with the load, (processes + load) / cores times as long as with the
    cores to themselves. A real step waits on the network and its hand-overs for much of
    its time, so the true stretch is smaller."""
    return max(1.0, (processes + load) / cores)


def kept_at_most(r: Run, later: list[tuple[float, float]], whole: tuple[float, float]) -> float:
    """The healthy window's median over the median of the adapted steps whose load is known
    (sampled over: a step begun after the last sample is not), with all the slowness the load
    could explain taken off: the peak foreign CPUs over any of those steps, the job's
    processes (the workers and the coordinator) on this machine's cores. inf where fewer
    than BOUNDING_STEPS adapted steps were sampled."""
    known = [(t, load) for e, t in later if math.isfinite(load := r.foreign.rate(e - t, e))]
    if len(known) < BOUNDING_STEPS:
        return float("inf")
    cores = len(os.sched_getaffinity(0))
    stretch = most_stretch(max(load for _, load in known), len(r.results) + 1, cores)
    return whole[0] / statistics.median(t for t, _ in known) * stretch


class Run(NamedTuple):
    results: dict[int, dict]
    log: str  # the coordinator's stderr
    slowed_at: float  # time.monotonic() when tc slowed the links
    stopped_at: float
    seen_at: float | None  # when the coordinator's log first matched `watch` (polled)
    healthy_from: float  # time.monotonic() when the healthy window began (warm-up done)
    foreign: Foreign  # the rest of the machine's CPU, sampled through the run
    spare: dict | None = None  # run(spare=True): the warm spare's results


def pair(a: int, b: int) -> list[tuple[int, int]]:
    return [(a, b), (b, a)]


def nic(r: int, n: int) -> list[tuple[int, int]]:
    return [(r, p) for p in range(n) if p != r] + [(p, r) for p in range(n) if p != r]


def run(
    procs,
    hosts,
    n: int,
    links,
    *,
    rate: str = "40mbit",
    healthy_steps: int = 20,
    healthy: float = SPAN,
    after: float = 16.0,
    policy: str | None = None,
    count: int = 2 << 20,
    extra_env: dict | None = None,
    watch: str | None = None,
    then: float | None = None,
    then_steps: int | None = None,
    adapted_from: float | None = None,
    spare: bool = False,
    elastic: bool | None = None,
    backend: str = "collectives",
) -> Run:
    """Warm up for `healthy_steps` steps, run healthy for `healthy` seconds more (the healthy
    window), slow the links, run until `after` seconds past the slowdown (or `then` seconds
    after the coordinator's log matches the regular expression `watch`, if sooner), then stop
    every worker at one step; `then_steps`: once rank 0 has ended that many more steps after
    the match (a schedule decided from op N starts within a few ops of every rank, whatever
    the ops' pace: a fixed time after the decision may stop the job before op N). Each
    window -- the healthy one, and with `adapted_from` the one from that many seconds after
    the slowdown to the end -- runs on until it holds QUIET_STEPS quiet steps, up to
    WINDOW_CAP s. backend="gloo": the same over Gloo, with no
    coordinator (its log is empty).

    spare: the workers survive a rank removed from the job (FAILSLOW_ELASTIC), and a warm
    spare waits on one more host (host n + 1, its links untouched) from before the healthy
    window on; a rank that the coordinator removes may end early (cleanly), and the spare's
    results come back in Run.spare. elastic (default: spare): the workers survive a rank
    removed, with or without a spare (the `shrink` policy's job goes on one rank fewer)."""
    elastic = spare if elastic is None else elastic
    stop = procs.tmp / "stop"
    times = procs.tmp / "times"  # rank 0's step times, as they end
    env = dict(heartbeats(0.2, 5.0), COLLECTIVES_JOB_SECRET=SECRET)
    if policy:
        env["COLLECTIVES_FAILSLOW_POLICY"] = policy
    base = clean_env(
        **env,
        WORLD_SIZE=n,
        COLLECTIVES_CROWDED="0",
        FAILSLOW_COUNT=count,
        FAILSLOW_STOP=str(stop),
        FAILSLOW_TRACE="1",
        **({"FAILSLOW_ELASTIC": "1"} if elastic else {}),
        # the stop file ends the run: a small gradient's steps pass the worker's default cap
        # (2,000) within windows that run on for a busy machine
        FAILSLOW_MAX_STEPS=str(10**7),
        **(extra_env or {}),
    )
    if backend == "gloo":
        worker, jobs = GLOO_WORKER, []
        base["FAILSLOW_GLOO_STORE"] = str(procs.tmp / "gloo-store")
    else:
        worker, jobs = WORKER, ["coord"]
        address = coordinator_process(
            procs,
            "coord",
            n,
            prefix=[*hosts.prefix(n), *AHEAD],
            host=hosts.ips[n],
            # elastic: the coordinator's notes (joins, removals, generations) are logged too
            env=clean_env(**env, **({"COLLECTIVES_DEBUG": "INFO"} if elastic else {})),
        )
        base.update(MASTER_ADDR=hosts.ips[n], MASTER_PORT=address.rsplit(":", 1)[1])
    names = [f"rank{r}" for r in range(n)]
    for r in range(n):
        argv = [*hosts.prefix(r), *AHEAD, sys.executable, worker]
        env_r = dict(base, RANK=str(r))
        if backend == "gloo":  # Gloo's connections on the host's link, not the loopback
            env_r["GLOO_SOCKET_IFNAME"] = hosts.devs[r]
        if r == 0:
            env_r["FAILSLOW_TIMES"] = str(times)
        procs.spawn(names[r], argv, env_r)
    if spare:
        _spawn_spare(procs, hosts, n, base)
    foreign = Foreign([procs.procs[x].pid for x in [*jobs, *names, *(["spare"] if spare else [])]])
    wait_for_steps(procs, names, healthy_steps, timeout=120)
    if spare:
        _wait_for_spare(procs)
    foreign.sample()  # the healthy window's first steps have a sample before them
    healthy_from = time.monotonic()
    if healthy > 0:
        _measure(procs, names, foreign, times, healthy_from, healthy)
    slowed_at = time.monotonic()
    # the other links' class as fast as the veth itself: the slowdown must slow those only
    slow_links(hosts, links, rate=rate, fast="100gbit")
    seen_at = None
    steps_at_seen = 0
    end = slowed_at + after
    while time.monotonic() < end:
        _check_running(procs, names, leave=elastic)
        if watch and jobs and seen_at is None and re.search(watch, procs.stderr("coord")):
            seen_at = time.monotonic()
            steps_at_seen = len(_step_times(times))
            if then is not None:
                end = min(end, seen_at + then)
        if then_steps is not None and seen_at is not None:
            if len(_step_times(times)) >= steps_at_seen + then_steps:
                break
        foreign.sample()
        time.sleep(0.1)
    if adapted_from is not None:
        start = slowed_at + adapted_from
        _measure(
            procs, names, foreign, times, start, max(SPAN, time.monotonic() - start), leave=elastic
        )
    stopped_at = time.monotonic()
    stop.write_text("stop")
    results = {}
    for r, res in enumerate(procs.wait(names, timeout=180)):
        assert res.code == 0, f"rank {r} exited {res.code}\n{procs.stderr_tail()}"
        results[r] = json.loads(res.out.strip().splitlines()[-1])
    spared = None
    if spare:
        (res,) = procs.wait(["spare"], timeout=60)
        assert res.code == 0, f"the spare exited {res.code}\n{procs.stderr_tail()}"
        spared = json.loads(res.out.strip().splitlines()[-1])
    log = procs.stderr("coord") if jobs else ""
    return Run(results, log, slowed_at, stopped_at, seen_at, healthy_from, foreign, spared)


def _spawn_spare(procs, hosts, n: int, base: dict) -> None:
    """A warm spare on host n + 1: a joiner (no RANK) that waits to take a removed rank's
    place (COLLECTIVES_SPARE=1)."""
    env = dict(base, COLLECTIVES_JOIN="1", COLLECTIVES_SPARE="1", FAILSLOW_JOINER="1")
    env.pop("RANK", None)
    argv = [*hosts.prefix(n + 1), *AHEAD, sys.executable, WORKER]
    procs.spawn("spare", argv, env)


def _wait_for_spare(procs, timeout: float = 60.0) -> None:
    """Until the coordinator has the spare waiting (its log says so)."""
    deadline = time.monotonic() + timeout
    while "a spare worker waits to join" not in procs.stderr("coord"):
        if procs.procs["spare"].poll() is not None:
            procs.fail("the spare ended before it waited to join")
        if time.monotonic() > deadline:
            procs.fail(f"the spare did not wait to join within {timeout:g} s")
        time.sleep(0.05)


def _check_running(procs, names, leave: bool = False) -> None:
    """Every worker still runs (leave: or ended cleanly -- a rank removed from the job)."""
    for name in names:
        code = procs.procs[name].poll()
        if code is not None and not (leave and code == 0):
            procs.fail(f"{name} ended early")


def _step_times(path: Path) -> list[tuple[float, float]]:
    """The steps (end, duration) a worker has written to $FAILSLOW_TIMES so far."""
    try:
        lines = path.read_text().split("\n")[:-1]  # whole lines only: the last may be half written
    except OSError:
        return []
    return [(float(e), float(t)) for e, t in (ln.split() for ln in lines)]


def _measure(
    procs, names, foreign: Foreign, times: Path, start: float, least: float, leave: bool = False
) -> None:
    """Run on (sampling the rest of the machine) until the window from `start` is at least
    `least` s long and holds QUIET_STEPS quiet steps (rank 0's, written to `times`), or
    WINDOW_CAP s long."""
    while True:
        now = time.monotonic()
        long_enough = now - start >= least
        steps = [(e, t) for e, t in _step_times(times) if start <= e - t]
        if long_enough and len(foreign.quiet(steps)) >= QUIET_STEPS:
            return
        if now - start >= max(least, WINDOW_CAP):
            return
        _check_running(procs, names, leave)
        foreign.sample()
        time.sleep(0.1)


class Speed(NamedTuple):
    healthy: float  # median quiet step time over the healthy window, before the slowdown (s)
    adapted: float  # median quiet step time of the steps that began `within` s after it
    kept: float  # healthy / adapted: the share of the healthy step rate kept
    slowed: float  # the slowest step after the slowdown
    steps: tuple[int, int]  # the quiet steps in each window (healthy, adapted)
    all_steps: tuple[float, float]  # the medians over every step of each window, for the record


MIN_STEPS = 10  # fewer in a window, and its median is one noisy step or two
# enough sampled steps to bound what was kept (kept_at_most): a job that does nothing has
# slow steps, a few in a window, and the bound credits each with the window's peak load
BOUNDING_STEPS = 5


def speed(r: Run, within: float) -> Speed:
    """Step times from rank 0's clock (every rank ends each step together): the median of
    the quiet steps (the module's docstring) of the healthy window (after the warm-up, up to
    the slowdown) and of the window from `within` seconds after it to the end of the run
    (run(adapted_from=within)). Each window holds only the steps wholly inside it. Raises
    NotMeasured where the machine was too busy to compare the two."""
    res = r.results[0]
    steps = list(zip(res["ends"], res["took"]))
    start = r.slowed_at + within
    before = [(e, t) for e, t in steps if r.healthy_from <= e - t and e <= r.slowed_at]
    later = [(e, t) for e, t in steps if start <= e - t]
    after = [t for e, t in steps if e >= r.slowed_at]

    qb, ql = r.foreign.quiet(before), r.foreign.quiet(later)
    whole = (statistics.median(t for _, t in before), statistics.median(t for _, t in later))
    if len(qb) < MIN_STEPS or len(ql) < MIN_STEPS:
        # No quiet stretch: like is compared with like only if the rest of the machine took
        # as much CPU in one window as in the other; else the rates cannot be compared.
        loads = [r.foreign.rate(w[0][0] - w[0][1], w[-1][0]) for w in (before, later) if w]
        # a window not sampled reads inf: two of them are not "alike" (inf - inf is nan, and
        # nan > QUIET is false), so only finite loads are compared
        alike = len(loads) == 2 and all(math.isfinite(x) for x in loads)
        if not alike or abs(loads[0] - loads[1]) > QUIET:
            raise NotMeasured(
                f"the machine was too busy to time the steps: quiet steps {len(qb)} of "
                f"{len(before)} healthy, {len(ql)} of {len(later)} adapted; the rest of the "
                f"machine used {[round(x, 2) for x in loads]} CPUs in the two windows",
                whole,
                loads,
                kept_at_most(r, later, whole),
            )
        qb, ql = [t for _, t in before], [t for _, t in later]
    healthy, adapted = statistics.median(qb), statistics.median(ql)
    return Speed(
        healthy,
        adapted,
        healthy / adapted,
        max(after),
        (len(qb), len(ql)),
        whole,
    )


def check_identical(r: Run, n: int):
    """Every rank ran the same steps and holds the same model; nobody left the group."""
    assert set(r.results) == set(range(n)), r.results
    assert len({x["sha256"] for x in r.results.values()}) == 1, r.results
    assert len({x["steps"] for x in r.results.values()}) == 1
    assert all(x["generation"] == 0 for x in r.results.values())


class Replaced(NamedTuple):
    rank: int  # the rank removed
    generation: int  # the generation the others and the spare ended in
    first_step: float  # s from the slowdown to the spare's first committed step
    changed: float  # s from the slowdown to the survivors' new generation (rank 0's clock)


def check_replaced(r: Run, n: int, rank: int) -> Replaced:
    """`rank` was removed (and exited cleanly, saying so); the spare took a place: every
    remaining rank and the spare ran the same steps, ended in one generation past 0 with n
    ranks, and hold the same model."""
    assert set(r.results) == set(range(n)), r.results
    gone = r.results[rank]
    assert gone["evicted"], gone
    assert r.spare is not None and r.spare["evicted"] is None, r.spare
    stay = [x for k, x in r.results.items() if k != rank] + [r.spare]
    assert all(x["evicted"] is None for x in stay), stay
    assert len({x["sha256"] for x in stay}) == 1, stay
    assert len({x["steps"] for x in stay}) == 1, stay
    assert len({x["generation"] for x in stay}) == 1 and stay[0]["generation"] > 0, stay
    assert all(x["world_size"] == n for x in stay), stay
    assert r.spare["ends"], r.spare
    changed = r.results[0]["changes"][0][0] if r.results[0]["changes"] else float("nan")
    return Replaced(
        rank,
        stay[0]["generation"],
        r.spare["ends"][0] - r.slowed_at,
        changed - r.slowed_at,
    )


def healthy_time(r: Run) -> float:
    """The median quiet step time of the healthy window alone (a baseline run's, say: one
    world size's healthy pace, to compare another run's adapted window with). Raises
    NotMeasured where the window holds fewer than MIN_STEPS quiet steps."""
    res = r.results[0]
    before = [
        (e, t) for e, t in zip(res["ends"], res["took"]) if r.healthy_from <= e - t <= r.slowed_at
    ]
    quiet = r.foreign.quiet(before)
    if len(quiet) < MIN_STEPS:
        whole = statistics.median(t for _, t in before) if before else float("nan")
        raise NotMeasured(
            f"the machine was too busy to time the healthy steps: {len(quiet)} quiet of "
            f"{len(before)}",
            (whole, whole),
            [],
        )
    return statistics.median(quiet)


class Shrunk(NamedTuple):
    rank: int  # the rank removed
    generation: int  # the generation the others ended in
    changed: float  # s from the slowdown to the survivors' new generation (rank 0's clock)


def check_shrunk(r: Run, n: int, rank: int) -> Shrunk:
    """`rank` was removed (and exited cleanly, saying so), no spare in its place: the n - 1
    others ran the same steps, ended in one generation past 0 with n - 1 ranks, and hold the
    same model."""
    assert set(r.results) == set(range(n)), r.results
    gone = r.results[rank]
    assert gone["evicted"], gone
    stay = [x for k, x in r.results.items() if k != rank]
    assert all(x["evicted"] is None for x in stay), stay
    assert len({x["sha256"] for x in stay}) == 1, stay
    assert len({x["steps"] for x in stay}) == 1, stay
    assert len({x["generation"] for x in stay}) == 1 and stay[0]["generation"] > 0, stay
    assert all(x["world_size"] == n - 1 for x in stay), stay
    assert r.results[0]["changes"], r.results[0]
    return Shrunk(rank, stay[0]["generation"], r.results[0]["changes"][0][0] - r.slowed_at)
