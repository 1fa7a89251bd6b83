"""The stalled-allreduce scenario, run to the end of the job: the ways to start it and the
checks every run must pass (tests/scenarios/test_stall_*.py).

n workers run tests/support/stall_worker.py: a plain all_reduce(AVG) loop that reconstructs
and drops the step on a CollectiveError, then a final barrier. Links around one worker (the
culprit) are slowed, either by the library's fault injection -- persistent: the rules follow
the processes into every generation (COLLECTIVES_FAULTS_SCOPE=process), so a wrong eviction
shows up as a second stall -- or by tc in network namespaces (slow_links below).

Patterns of slow links around culprit c of n ranks:
  two_links    (c-1) -> c and c -> (c+1): the seed's unstable network, two communications
  whole_host   every link into and out of c: a bad NIC
  via_rank0    c -> 0 and 0 -> c: what a crowded host's star schedules would wait on

Gradient sizes (floats) for the algorithms "auto" picks (group/tuning.py) at 3-5 ranks:
  direct 1000, tree 8970, ring 600000.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .ports import coordinator_process, rank0_address
from .procs import clean_env
from .stall_worker import gradient
from .timing import heartbeats, scaled

WORKER = str(Path(__file__).resolve().parent / "stall_worker.py")
STEPS = 40


def hb() -> dict[str, str]:
    """Heartbeats and the op deadline, grown with the machine's load when the test runs
    (timing.py); the slowed links hold messages far past either."""
    return {**heartbeats(0.2, 2.0), "STALL_TIMEOUT": f"{scaled(3.0):g}"}


SIZES = {"direct": 1000, "tree": 8970, "ring": 600000}


def two_links(culprit: int, n: int) -> list[tuple[int, int]]:
    return [((culprit - 1) % n, culprit), (culprit, (culprit + 1) % n)]


def whole_host(culprit: int, n: int) -> list[tuple[int, int]]:
    return [(culprit, p) for p in range(n) if p != culprit] + [
        (p, culprit) for p in range(n) if p != culprit
    ]


def via_rank0(culprit: int, n: int) -> list[tuple[int, int]]:
    return [(culprit, 0), (0, culprit)]


PATTERNS = {"two_links": two_links, "whole_host": whole_host, "via_rank0": via_rank0}


def delays(links, seconds: float = 60.0) -> str:
    """A fault spec holding every message on `links` for `seconds`."""
    return ";".join(f"delay:{p}->{r}:{seconds:g}s" for p, r in links)


def worker_env(n: int, count: int, **extra) -> dict:
    """The workers' environment: the schedules for a core per rank (COLLECTIVES_CROWDED=0,
    so that the slowed links are the ones the ring-shaped schedules wait on) unless `extra`
    says otherwise."""
    env = dict({"WORLD_SIZE": n, "STALL_COUNT": count, "COLLECTIVES_CROWDED": "0"}, **hb())
    env.update({k: v for k, v in extra.items() if v is not None})
    return clean_env(**env)


def _results(procs, n: int, names, timeout: float) -> dict[int, dict]:
    results = {}
    for r, res in enumerate(procs.wait(names, timeout=timeout)):
        assert res.code == 0, f"rank {r} exited {res.code}\n{procs.stderr_tail()}"
        results[r] = json.loads(res.out.strip().splitlines()[-1])
    return results


def run_hosted(procs, n: int, faults: str, count: int = 1000, **env) -> dict[int, dict]:
    """Bare environment variables: rank 0 hosts the coordinator on a port it binds itself
    (MASTER_PORT=0) and prints; the other ranks are started with that port."""
    base = worker_env(
        n,
        count,
        MASTER_ADDR="127.0.0.1",
        COLLECTIVES_FAULTS=faults,
        COLLECTIVES_FAULTS_SCOPE="process",
        **env,
    )
    procs.spawn("rank0", [sys.executable, WORKER, STEPS], dict(base, RANK="0", MASTER_PORT="0"))
    port = rank0_address(procs, "rank0").rsplit(":", 1)[1]
    for r in range(1, n):
        procs.spawn(
            f"rank{r}", [sys.executable, WORKER, STEPS], dict(base, RANK=str(r), MASTER_PORT=port)
        )
    return _results(procs, n, [f"rank{r}" for r in range(n)], 100)


def run_standalone(procs, n: int, faults: str, count: int = 1000, **env) -> dict[int, dict]:
    """`python -m collectives.coordinator` apart, the workers with bare variables."""
    secret = {"COLLECTIVES_JOB_SECRET": "stall-standalone-test-secret-0123456789"}
    address = coordinator_process(procs, "coord", n, env=clean_env(**hb(), **secret))
    base = worker_env(
        n,
        count,
        COLLECTIVES_COORDINATOR=address,
        **secret,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=address.rsplit(":", 1)[1],
        COLLECTIVES_FAULTS=faults,
        COLLECTIVES_FAULTS_SCOPE="process",
        **env,
    )
    for r in range(n):
        procs.spawn(f"rank{r}", [sys.executable, WORKER, STEPS], dict(base, RANK=str(r)))
    return _results(procs, n, [f"rank{r}" for r in range(n)], 100)


def run_launcher(procs, n: int, faults: str, count: int = 1000, **env) -> dict[int, dict]:
    """Through `python -m collectives.launch`, which hosts the coordinator."""
    procs.spawn(
        "launch",
        [
            sys.executable,
            "-m",
            "collectives.launch",
            "--nproc",
            n,
            "--timeout",
            int(scaled(100)),
            WORKER,
            STEPS,
        ],
        worker_env(n, count, COLLECTIVES_FAULTS=faults, COLLECTIVES_FAULTS_SCOPE="process", **env),
    )
    res = procs.wait("launch", timeout=110)[0]
    assert res.code == 0, f"launcher exited {res.code}\n{res.output[-3000:]}"
    results = {}
    for line in res.out.splitlines():
        m = re.match(r"\[rank (\d+)\] (\{.*\})$", line)
        if m:
            results[int(m.group(1))] = json.loads(m.group(2))
    return results


RUNS = {"hosted": run_hosted, "standalone": run_standalone, "launcher": run_launcher}


def expected_model(n: int, culprit: int, history: list, count: int) -> np.ndarray:
    """What the kept steps imply: at step s the members of that step's generation average
    their gradients (generation 0: all n ranks; later: all but the culprit)."""
    model = np.zeros(count, np.float64)
    for s, (gen, ws) in enumerate(history):
        members = range(n) if gen == 0 else [r for r in range(n) if r != culprit]
        assert ws == len(members), (s, gen, ws)
        model -= 0.01 * np.mean([gradient(s, r, count).astype(np.float64) for r in members], 0)
    return model


def check(
    results: dict,
    n: int,
    culprit: int,
    count: int = 1000,
    crowded: bool = False,
    steps_after_error: int | None = None,
):
    """Exactly the culprit was evicted; every survivor trained every step (STEPS, or
    `steps_after_error` kept steps past the step it dropped: STALL_STEPS_AFTER_ERROR),
    dropped exactly one (the same one), raised one PeerTimeout, passed the final barrier (the
    worker prints its result after it) and holds the same model, the one its kept steps imply."""
    assert set(results) == set(range(n)), results
    assert "evicted" in results[culprit], (culprit, results[culprit])
    survivors = [results[r] for r in range(n) if r != culprit]
    for s in survivors:
        assert "evicted" not in s, (culprit, s)
        assert s["crowded"] == crowded, s
        # a crowded host has more ranks than CPUs: its small receives yielded while they read
        assert s["spin_yields"] or not crowded, s
        if steps_after_error is None:
            assert s["steps"] == STEPS, s
        else:
            assert s["dropped"] and s["steps"] == s["dropped"][0] + steps_after_error, s
        assert len(s["dropped"]) == 1 and len(s["errors"]) == 1, s
        assert s["generation"] >= 1, s
    assert len({s["sha256"] for s in survivors}) == 1, [s["model"] for s in survivors]
    assert len({tuple(s["dropped"]) for s in survivors}) == 1, [s["dropped"] for s in survivors]
    # one event, one error type on every survivor, whichever deadline fired first
    assert {s["errors"][0].split(":")[0] for s in survivors} == {"PeerTimeout"}, survivors
    assert all(s["history"] == survivors[0]["history"] for s in survivors)
    want = expected_model(n, culprit, survivors[0]["history"], count)
    np.testing.assert_allclose(survivors[0]["model"], want[:8], rtol=1e-4, atol=1e-6)


# --- real slow links: tc in network namespaces ---------------------------------------------------
def tc(ns: str, *args: str):
    subprocess.run(["tc", "-n", ns, *args], check=True, capture_output=True, text=True, timeout=20)


def _u32(ns: str, on_dev: tuple, prio: str, match: tuple, flowid: str):
    """A u32 filter sending the packets that `match` (ip fields) to class `flowid`."""
    tc(ns, "filter", "add", *on_dev, "protocol", "ip", "prio", prio, "u32", "match", "ip",
       *match, "flowid", flowid)  # fmt: skip


def slow_links(
    hosts, links, rate: str = "8kbit", spare_port: int | None = None, fast: str = "1gbit"
):
    """Slow each directed link (i, j) between hosts i and j to `rate` with an htb class and
    a u32 filter on i's egress (packets to j's address); every other packet goes through a
    fast class. spare_port: traffic to or from that TCP port (the coordinator's, hosted on a
    worker's host) stays fast, as the links to a coordinator elsewhere would. fast: the
    rate of every other packet's class."""
    for i in sorted({i for i, _ in links}):
        ns, dev = hosts.names[i], hosts.devs[i]
        on_dev = ("dev", dev, "parent", "1:")
        tc(ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
        tc(ns, "class", "add", *on_dev, "classid", "1:10", "htb", "rate", fast)
        tc(ns, "class", "add", *on_dev, "classid", "1:20", "htb", "rate", rate, "ceil", rate,
           "burst", "2k", "cburst", "2k")  # fmt: skip
        if spare_port is not None:
            for field in ("sport", "dport"):
                _u32(ns, on_dev, "1", (field, str(spare_port), "0xffff"), "1:10")
        for a, j in links:
            if a == i:
                _u32(ns, on_dev, "2", ("dst", f"{hosts.ips[j]}/32"), "1:20")


def wait_for_steps(procs, names, step: int, timeout: float = 60.0):
    """Until every worker has reported `step` on stderr (STALL_TRACE=1)."""
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending:
        pending = [n for n in pending if f"step {step}\n" not in procs.stderr(n)]
        if not pending:
            return
        for n in pending:
            if procs.procs[n].poll() is not None:
                procs.fail(f"{n} ended before step {step}")
        if time.monotonic() > deadline:
            procs.fail(f"{pending} did not reach step {step} within {timeout:g} s")
        time.sleep(0.05)


def run_netns(
    procs,
    hosts,
    n: int,
    culprit: int,
    links,
    count: int,
    hosted: bool,
    secret: str = "stall-netns-test-secret-0123456789",
) -> dict[int, dict]:
    """n workers, one per namespace host; the coordinator hosted by rank 0 (hosted) or
    standalone on host n. Once every worker is past step 5, tc slows `links` for good."""
    ips = hosts.ips
    pace = {
        "STALL_PACE": "0.05",
        "STALL_TRACE": "1",
        "COLLECTIVES_JOB_SECRET": secret,
        "STALL_TIMEOUT": f"{scaled(3.0):g}",
    }
    names = [f"rank{r}" for r in range(n)]
    if hosted:
        base = worker_env(n, count, MASTER_ADDR=ips[0], **pace)
        procs.spawn(
            "rank0",
            [*hosts.prefix(0), sys.executable, WORKER, STEPS],
            dict(base, RANK="0", MASTER_PORT="0"),
        )
        port = int(rank0_address(procs, "rank0").rsplit(":", 1)[1])
        first = 1
    else:
        address = coordinator_process(
            procs,
            "coord",
            n,
            prefix=hosts.prefix(n),
            host=ips[n],
            env=clean_env(COLLECTIVES_JOB_SECRET=secret, **hb()),
        )
        port = int(address.rsplit(":", 1)[1])
        base = worker_env(n, count, MASTER_ADDR=ips[n], **pace)
        first = 0
    for r in range(first, n):
        procs.spawn(
            f"rank{r}",
            [*hosts.prefix(r), sys.executable, WORKER, STEPS],
            dict(base, RANK=str(r), MASTER_PORT=str(port)),
        )
    wait_for_steps(procs, names, 5)
    slow_links(hosts, links, spare_port=port if hosted else None)
    return _results(procs, n, names, 120)
