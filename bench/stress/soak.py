"""Soak: thousands of mixed, checked collectives at N ranks, and nothing may leak.

    python -m bench soak [--minutes 30] [--nproc 4] [--ops 10000] [--seed 0] [--out PATH]

N real processes (bench/stress/soak_worker.py) and a coordinator run `--ops` operations drawn from a
seeded generator (bench/stress/soak_ops.py: every collective, every algorithm each accepts, sizes
log-uniform from one element to 4 MiB, 7 dtypes, every reduce op a dtype takes, numpy and torch
buffers), checking each result against numpy computed locally from the seeded inputs. The run
ends after `--ops` operations or `--minutes`, whichever comes first (the ranks agree on it).

At the start, the middle and the end, each rank samples its open fds, threads, RSS,
shared-memory slots in use, arenas mapped, ipc endpoints bound and /dev/shm files (bench/stress/resources.py).
Exit status 1 if any result was wrong, a rank failed, or any of these grew past its bound
(resources.BOUNDS) between the middle and the end; the table says which.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import secrets
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from support.procs import ProcessSet, clean_env  # noqa: E402  (the tests' process harness)

from bench.stress import resources  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__.split("\n")[0])
    p.add_argument(
        "--minutes",
        type=float,
        default=30.0,
        help="stop after this long even if --ops are not done (default 30)",
    )
    p.add_argument("--nproc", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--ops", type=int, default=10000, help="operations (default 10000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--max-bytes",
        type=int,
        default=4 << 20,
        help="the largest buffer of any op (default 4 MiB)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="write PATH.json and PATH.txt (e.g. bench/results/soak/4ranks_10000ops)",
    )
    a = p.parse_args(argv)
    if a.nproc < 2 or a.ops < 2 or a.minutes <= 0:
        p.error("--nproc and --ops must be >= 2, --minutes > 0")
    return a


def run(a) -> tuple[dict, list[str]]:
    from collectives.membership.server import Coordinator

    secret = secrets.token_hex(16)
    os.environ["COLLECTIVES_JOB_SECRET"] = secret  # the coordinator's, and the workers'
    coord = Coordinator("127.0.0.1", 0, a.nproc).start()
    seconds = a.minutes * 60
    with tempfile.TemporaryDirectory() as tmp:
        ps = ProcessSet(tmp, coordinator=coord)
        try:
            for r in range(a.nproc):
                env = clean_env(RANK=r, WORLD_SIZE=a.nproc, COLLECTIVES_COORDINATOR=coord.address)
                ps.spawn(
                    f"r{r}",
                    [
                        sys.executable,
                        ROOT / "bench" / "stress" / "soak_worker.py",
                        "--ops",
                        a.ops,
                        "--seconds",
                        seconds,
                        "--seed",
                        a.seed,
                        "--max-bytes",
                        a.max_bytes,
                    ],
                    env,
                )
            # the workers stop by themselves at --seconds; the margin covers start-up, the
            # op in flight and the last samples
            results = ps.wait(timeout=seconds + 120)
            for e in list(_drain(ps)):
                pass
            failures = [
                f"rank {r} exited with status {res.code}: {res.err[-800:]}"
                for r, res in enumerate(results)
                if res.code != 0
            ]
            return {"events": ps.seen}, failures
        finally:
            ps.close()


def _drain(ps):
    """Every event the reader threads queued (the workers have exited)."""
    while not ps.events.empty():
        e = ps.events.get()
        ps.seen.append(e)
        yield e


def summarize(events: list[dict], a) -> tuple[str, dict, list[str]]:
    samples: dict = {}
    done, wrong = {}, []
    for e in events:
        if e["event"] == "sample":
            # by process, not rank: a rank that leaves and rejoins may come back as another
            samples.setdefault(int(e["proc"][1:]), {})[e["phase"]] = {
                k: e[k] for k in resources.FIELDS
            }
        elif e["event"] == "done":
            done[e["proc"]] = e
        elif e["event"] == "wrong":
            wrong.append(f"rank {e['rank']}: {e['error']}")
    failures = list(wrong)
    complete = {r: s for r, s in samples.items() if len(s) == 3}
    if len(complete) != a.nproc or len(done) != a.nproc:
        failures.append(f"only ranks {sorted(done)} finished (of {a.nproc})")
    text, leaks = resources.table(complete)
    failures += leaks
    ops = max((d["ops"] for d in done.values()), default=0)
    seconds = max((d["seconds"] for d in done.values()), default=0)
    n_wrong = sum(d["wrong"] for d in done.values())
    kinds = next(iter(done.values()))["kinds"] if done else {}
    rejoins = max((d.get("rejoins", 0) for d in done.values()), default=0)
    generation = max((d.get("generation", 0) for d in done.values()), default=0)
    head = (
        f"soak: {a.nproc} ranks, {ops} ops in {seconds:.0f} s (seed {a.seed}, sizes up to "
        f"{a.max_bytes >> 20} MiB), {n_wrong} wrong results\n"
        f"{rejoins} times the last rank left and joined again (generation {generation} at "
        f"the end)\n"
        "ops by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + "\n"
        "resources per rank (bound: growth allowed from the middle to the end)\n"
    )
    record = {
        "nproc": a.nproc,
        "ops": ops,
        "seconds": seconds,
        "seed": a.seed,
        "max_bytes": a.max_bytes,
        "wrong": n_wrong,
        "kinds": kinds,
        "rejoins": rejoins,
        "generation": generation,
        "bounds": resources.BOUNDS,
        "samples": {str(r): s for r, s in complete.items()},
        "failures": failures,
    }
    return head + text, record, failures


def main(argv=None) -> int:
    a = parse_args(argv)
    result, failures = run(a)
    text, record, found = summarize(result["events"], a)
    failures = failures + found
    record["failures"] = failures
    return resources.conclude(
        text, record, failures, a.out, "every result right, nothing grew past its bound"
    )


if __name__ == "__main__":
    sys.exit(main())
