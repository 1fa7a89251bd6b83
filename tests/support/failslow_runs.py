"""The fail-slow scenario (tests/scenarios/test_failslow.py, bench/studies/failslow.py): n
workers on n network-namespace hosts, a standalone coordinator on one more, an 8 MiB
all_reduce(AVG) per step (tests/support/failslow_worker.py); after a healthy stretch tc holds
some links to a rate for good (stall_runs.slow_links: htb classes and u32 filters).

run() returns the workers' results, the coordinator's log and the moment of the slowdown;
speed() says how fast the job ran before it and once adapted.
"""

from __future__ import annotations

import json
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
SECRET = "failslow-netns-test-secret-0123456789"


class Run(NamedTuple):
    results: dict[int, dict]
    log: str  # the coordinator's stderr
    slowed_at: float  # time.monotonic() when tc slowed the links
    stopped_at: float
    seen_at: float | None  # when the coordinator's log first matched `watch` (polled)


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
    after: float = 16.0,
    policy: str | None = None,
    count: int = 2 << 20,
    extra_env: dict | None = None,
    watch: str | None = None,
    then: float | None = None,
) -> Run:
    """Run until `after` seconds past the slowdown (or `then` seconds after the coordinator's
    log matches the regular expression `watch`, if sooner), then stop every worker at one
    step."""
    stop = procs.tmp / "stop"
    env = dict(heartbeats(0.2, 5.0), COLLECTIVES_JOB_SECRET=SECRET)
    if policy:
        env["COLLECTIVES_FAILSLOW_POLICY"] = policy
    address = coordinator_process(
        procs, "coord", n, prefix=hosts.prefix(n), host=hosts.ips[n], env=clean_env(**env)
    )
    port = address.rsplit(":", 1)[1]
    base = clean_env(
        **env,
        WORLD_SIZE=n,
        MASTER_ADDR=hosts.ips[n],
        MASTER_PORT=port,
        COLLECTIVES_CROWDED="0",
        FAILSLOW_COUNT=count,
        FAILSLOW_STOP=str(stop),
        FAILSLOW_TRACE="1",
        **(extra_env or {}),
    )
    names = [f"rank{r}" for r in range(n)]
    for r in range(n):
        procs.spawn(names[r], [*hosts.prefix(r), sys.executable, WORKER], dict(base, RANK=str(r)))
    wait_for_steps(procs, names, healthy_steps, timeout=120)
    slowed_at = time.monotonic()
    # the other links' class as fast as the veth itself: the slowdown must slow those only
    slow_links(hosts, links, rate=rate, fast="100gbit")
    seen_at = None
    end = slowed_at + after
    while time.monotonic() < end:
        for name in names:
            if procs.procs[name].poll() is not None:
                procs.fail(f"{name} ended early")
        if watch and seen_at is None and re.search(watch, procs.stderr("coord")):
            seen_at = time.monotonic()
            if then is not None:
                end = min(end, seen_at + then)
        time.sleep(0.1)
    stopped_at = time.monotonic()
    stop.write_text("stop")
    results = {}
    for r, res in enumerate(procs.wait(names, timeout=180)):
        assert res.code == 0, f"rank {r} exited {res.code}\n{procs.stderr_tail()}"
        results[r] = json.loads(res.out.strip().splitlines()[-1])
    return Run(results, procs.stderr("coord"), slowed_at, stopped_at, seen_at)


class Speed(NamedTuple):
    healthy: float  # median step time before the slowdown (s)
    adapted: float  # median step time of the steps that began `within` s after it
    kept: float  # healthy / adapted: the share of the healthy step rate kept
    slowed: float  # the slowest step after the slowdown


def speed(r: Run, within: float, span: float = 8.0) -> Speed:
    """Step times from rank 0's clock (every rank ends each step together): the median
    before the slowdown (the first steps left out), and over the `span` seconds from
    `within` seconds after it."""
    res = r.results[0]
    steps = list(zip(res["ends"], res["took"]))
    before = [t for end, t in steps[2:] if end < r.slowed_at]
    start = r.slowed_at + within
    later = [t for end, t in steps if start <= end - t and end <= start + span]
    after = [t for end, t in steps if end >= r.slowed_at]
    assert len(before) >= 3 and later, (len(before), len(later), steps)
    healthy, adapted = statistics.median(before), statistics.median(later)
    return Speed(healthy, adapted, healthy / adapted, max(after))


def check_identical(r: Run, n: int):
    """Every rank ran the same steps and holds the same model; nobody left the group."""
    assert set(r.results) == set(range(n)), r.results
    assert len({x["sha256"] for x in r.results.values()}) == 1, r.results
    assert len({x["steps"] for x in r.results.values()}) == 1
    assert all(x["generation"] == 0 for x in r.results.values())
