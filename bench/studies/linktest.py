"""What testing a link routed around costs, and whether a recovered link comes back.

    python -m bench linktest [--keep 240] [--recover 75] [--count 2097152]
                             [--out bench/results/failslow]

Two runs of the fail-slow scenario (tests/support/failslow_runs.py: 4 workers on network-
namespace hosts, all_reduces of --count float32 (8 MiB; 16384: small4's 64 KiB, a link
flagged on its latency), the pair 0 <-> 1 held to 40 Mbit/s):

  kept     the link stays slow for --keep seconds: the coordinator reroutes, then tests the
           link (membership/reroute.py: after 30 s, doubling). Reported: the tests, the step
           time around each (its steps from the test to 2 s after it, against the median
           step of the adapted window) and their summed excess over the run: the tests'
           cost as a fraction of the job's time (an upper bound: any slow step in those
           2 s counts).
  recover  the slowdown is lifted 5 s after the reroute; reported: when the link is cleared
           and the default schedule returns (seconds after the lift), and the step time
           before the slowdown, on the plan, and after the return.

Every coordinator line is stamped when the harness saw it (polled every 0.1 s). Needs root.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
from support.failslow_runs import check_identical, pair, run  # noqa: E402
from support.netns import Hosts  # noqa: E402
from support.procs import ProcessSet  # noqa: E402
from support.stall_runs import tc  # noqa: E402

NET = 86
N = 4
AFTER_TEST = 2.0  # s after a test whose steps count as its cost


class Watch(threading.Thread):
    """Stamps each new line of the coordinator's log with the monotonic time it was seen;
    lift: seconds after the first reroute to lift the slowdown (None: never)."""

    def __init__(self, procs, hosts, lift: float | None):
        super().__init__(daemon=True)
        self.procs, self.hosts, self.lift = procs, hosts, lift
        self.lines: list[tuple[float, str]] = []
        self.lifted_at: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        seen = 0
        rerouted_at = None
        while not self.stop.is_set():
            try:
                text = self.procs.stderr("coord")
            except Exception:
                text = ""
            new = text.splitlines()[seen:]
            now = time.monotonic()
            for ln in new:
                self.lines.append((now, ln))
                if rerouted_at is None and "rerouted from op #" in ln:
                    rerouted_at = now
            seen += len(new)
            if self.lift is not None and rerouted_at and self.lifted_at is None:
                if now >= rerouted_at + self.lift:
                    for i in (0, 1):
                        tc(self.hosts.names[i], "qdisc", "del", "dev", self.hosts.devs[i], "root")
                    self.lifted_at = time.monotonic()
            time.sleep(0.1)

    def at(self, pattern: str) -> list[float]:
        return [t for t, ln in self.lines if pattern in ln]


def one(seconds: float, lift: float | None, count: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp, Hosts(N + 1, NET, tag="lt") as hosts:
        procs = ProcessSet(tmp)
        w = Watch(procs, hosts, lift)
        try:
            w.start()
            r = run(procs, hosts, N, pair(0, 1), after=seconds, count=count, adapted_from=10.0)
            check_identical(r, N)
            times = [
                (float(e), float(d))
                for e, d in (ln.split() for ln in (procs.tmp / "times").read_text().splitlines())
            ]
        finally:
            w.stop.set()
            w.join(2)
            procs.close()
    healthy = statistics.median(d for e, d in times if r.healthy_from <= e <= r.slowed_at)
    rerouted = w.at("rerouted from op #")
    out = {
        "healthy_step_s": healthy,
        "slowed_at": 0.0,
        "rerouted_s": (rerouted[0] - r.slowed_at) if rerouted else None,
        "run_s": r.stopped_at - r.slowed_at,
        "log": [(round(t - r.slowed_at, 1), ln) for t, ln in w.lines],
    }
    if lift is None:
        start = r.slowed_at + 10.0
        window = [(e, d) for e, d in times if start <= e <= r.stopped_at]
        median = statistics.median(d for _, d in window)
        tests = w.at("testing link")
        per = []
        for t in tests:
            near = [d for e, d in window if t - 0.3 <= e - d and e - d <= t + AFTER_TEST]
            per.append(
                {
                    "at_s": round(t - r.slowed_at, 1),
                    "steps": len(near),
                    "excess_s": round(sum(max(0.0, d - median) for d in near), 3),
                    "slowest_s": round(max(near, default=0.0), 3),
                }
            )
        span = window[-1][0] - window[0][0] + window[0][1]
        out.update(
            adapted_step_s=median,
            kept=healthy / median,
            tests=per,
            tests_cost=sum(x["excess_s"] for x in per) / span,
            window_s=span,
            steps=len(window),
        )
    else:
        assert w.lifted_at is not None, "the slowdown was never lifted"
        cleared = [t for t in w.at("cleared") if t > w.lifted_at]
        back = [t for t in w.at("back to the default schedule") if t > w.lifted_at]
        plan = [d for e, d in times if rerouted and rerouted[0] + 1 <= e <= w.lifted_at]
        after = [d for e, d in times if back and e >= back[0] + 2]
        out.update(
            lifted_s=w.lifted_at - r.slowed_at,
            cleared_after_lift_s=(cleared[0] - w.lifted_at) if cleared else None,
            default_after_lift_s=(back[0] - w.lifted_at) if back else None,
            plan_step_s=statistics.median(plan) if plan else None,
            default_step_s=statistics.median(after) if after else None,
        )
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keep", type=float, default=240.0)
    p.add_argument("--recover", type=float, default=75.0)
    p.add_argument("--count", type=int, default=2 << 20)
    p.add_argument("--out", default="bench/results/failslow")
    args = p.parse_args(argv)
    res = {}
    if args.keep > 0:
        res["kept"] = one(args.keep, None, args.count)
        print(json.dumps({k: v for k, v in res["kept"].items() if k != "log"}, indent=1))
    if args.recover > 0:
        res["recover"] = one(args.recover, 5.0, args.count)
        print(json.dumps({k: v for k, v in res["recover"].items() if k != "log"}, indent=1))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "linktest.json" if args.count == 2 << 20 else f"linktest-{args.count}.json"
    (out / name).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
