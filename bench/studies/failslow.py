"""Fail-slow links: the speed kept once the coordinator routes around a slowed link, the time
from the slowdown to the new schedule, and false flags on clean runs beside CPU burners.

    python -m bench failslow [--cases link4,link3,tree3,nic4,link6,small4] [--clean-minutes 5]
                             [--burners 4] [--out bench/results/failslow]

Each case is the scenario of tests/scenarios/test_failslow.py (tests/support/failslow_runs.py):
n workers on n network-namespace hosts, a standalone coordinator on one more, an all_reduce
(AVG) of 8 MiB per step (small: 64 KiB), then tc htb holds some links to 40 Mbit/s for good:

  link4   4 workers, the pair 0 <-> 1           (a ring that keeps off both directions)
  link6   6 workers, the pair 0 <-> 1
  link3   3 workers, 0 -> 1 and 1 -> 2           (the seed's pattern: the ring reversed)
  tree3   3 workers, the pair 0 <-> 1           (no ring avoids it: the tree rooted at 2)
  nic4    4 workers, every link of rank 2       (nothing avoids it: reported)
  small4  4 workers, the pair 0 <-> 1, 64 KiB   ("direct": every link, nothing to reroute)
  nic4spare  4 workers and a warm spare on a fifth host, every link of rank 2, policy
          `replace` (the rank removed, the spare takes its place; the adapted window from
          15 s after the slowdown, and the seconds to the spare's first committed step)

Reported per case: the healthy step time (median before the slowdown), the slowest step after
it, the median step from 10 s after it over 8 s, the speed kept (healthy / that), and the
seconds from the slowdown to the coordinator's reroute (or NIC report) as its log shows it
(polled every 0.1 s). Clean runs: 4 workers with nothing slowed, `--burners` processes
spinning on the CPUs beside them, for `--clean-minutes`; every "flagged" line is a false flag.
Needs root (network namespaces). Writes failslow.json, failslow.txt and steps.png to --out.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
from support.failslow_runs import check_identical, check_replaced, nic, pair, run  # noqa: E402
from support.failslow_runs import speed  # noqa: E402
from support.netns import Hosts  # noqa: E402
from support.procs import ProcessSet  # noqa: E402

CASES = {
    "link4": (4, pair(0, 1), 2 << 20, "rerouted from op #"),
    "link6": (6, pair(0, 1), 2 << 20, "rerouted from op #"),
    "link3": (3, [(0, 1), (1, 2)], 2 << 20, "rerouted from op #"),
    "tree3": (3, pair(0, 1), 2 << 20, "rerouted from op #"),
    "nic4": (4, nic(2, 4), 2 << 20, "rank 2's NIC flagged"),
    "small4": (4, pair(0, 1), 16 << 10, "rerouted from op #"),
}
# a warm spare waits; policy `replace`: (ranks, links, count, watch, the rank replaced)
SPARE_CASES = {"nic4spare": (4, nic(2, 4), 2 << 20, "a spare takes the place of rank 2", 2)}
SPARE_WITHIN = 15.0  # s: the adapted window starts this long after the slowdown
NET = 85
BURN = "import time\nend = time.monotonic() + 7200\nwhile time.monotonic() < end: pass\n"


def one_case(name: str, after: float) -> dict:
    n, links, count, watch = CASES[name]
    with tempfile.TemporaryDirectory() as tmp, Hosts(n + 1, NET, tag="fb") as hosts:
        procs = ProcessSet(tmp)
        try:
            r = run(
                procs, hosts, n, links, after=after, count=count, watch=watch, adapted_from=10.0
            )
            check_identical(r, n)
        finally:
            procs.close()
    s = speed(r, 10.0)
    res = r.results[0]
    flags = [ln for ln in r.log.splitlines() if "flagged" in ln or "rerouted" in ln]
    return {
        "case": name,
        "ranks": n,
        "bytes": 4 * (count + 1),
        "links": [list(x) for x in links],
        "healthy_s": s.healthy,
        "slowest_s": s.slowed,
        "adapted_s": s.adapted,
        "kept": s.kept,
        "to_schedule_s": None if r.seen_at is None else r.seen_at - r.slowed_at,
        "log": flags[:6],
        "steps": [[e - r.slowed_at, t] for e, t in zip(res["ends"], res["took"])],
    }


def spare_case(name: str, after: float) -> dict:
    """A SPARE_CASES case: one_case's figures, the adapted window from SPARE_WITHIN s, and
    when the rank was removed and the spare committed its first step."""
    n, links, count, watch, rank = SPARE_CASES[name]
    with tempfile.TemporaryDirectory() as tmp, Hosts(n + 2, NET, tag="fb") as hosts:
        procs = ProcessSet(tmp)
        try:
            r = run(
                procs,
                hosts,
                n,
                links,
                after=max(after, SPARE_WITHIN),
                count=count,
                watch=watch,
                adapted_from=SPARE_WITHIN,
                policy="replace",
                spare=True,
            )
            rep = check_replaced(r, n, rank)
        finally:
            procs.close()
    s = speed(r, SPARE_WITHIN)
    res = r.results[0]
    keep = ("flagged", "rerouted", "replacing", "spare takes")
    flags = [ln for ln in r.log.splitlines() if any(k in ln for k in keep)]
    return {
        "case": name,
        "ranks": n,
        "bytes": 4 * (count + 1),
        "links": [list(x) for x in links],
        "healthy_s": s.healthy,
        "slowest_s": s.slowed,
        "adapted_s": s.adapted,
        "kept": s.kept,
        "to_schedule_s": None if r.seen_at is None else r.seen_at - r.slowed_at,
        "replaced_rank": rep.rank,
        "generation": rep.generation,
        "to_new_generation_s": rep.changed,
        "to_spare_step_s": rep.first_step,
        "log": flags[:10],
        "steps": [[e - r.slowed_at, t] for e, t in zip(res["ends"], res["took"])],
    }


def clean(minutes: float, burners: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp, Hosts(5, NET + 1, tag="fc") as hosts:
        procs = ProcessSet(tmp)
        try:
            for i in range(burners):
                procs.spawn(f"burn{i}", [sys.executable, "-c", BURN], {})
            began = time.monotonic()
            r = run(procs, hosts, 4, [], after=minutes * 60, healthy_steps=5, healthy=0.0)
            ran = time.monotonic() - began
            check_identical(r, 4)
        finally:
            procs.close()
    flags = [ln for ln in r.log.splitlines() if "flagged" in ln]
    steps = r.results[0]["steps"]
    return {
        "minutes": ran / 60,
        "burners": burners,
        "steps": steps,
        "median_step_s": statistics.median(r.results[0]["took"]),
        "false_flags": len(flags),
        "false_flags_per_hour": len(flags) / (ran / 3600),
        "lines": flags[:10],
    }


def plot(cases: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for c in cases:
        xs = [e for e, _ in c["steps"]]
        ys = [t * 1000 for _, t in c["steps"]]
        ax.plot(xs, ys, marker=".", lw=0.8, label=f"{c['case']} (kept {c['kept']:.0%})")
    ax.axvline(0, color="k", ls="--", lw=0.8)
    ax.text(0.2, ax.get_ylim()[1] * 0.9, "links slowed to 40 Mbit/s", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the slowdown (end of step)")
    ax.set_ylabel("step time (ms)")
    ax.set_title("8 MiB all_reduce per step: a slowed link found and routed around")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench failslow", description=__doc__.split("\n")[0])
    p.add_argument("--cases", default="link4,link3,tree3,nic4")
    p.add_argument("--after", type=float, default=20.0, help="seconds run past the slowdown")
    p.add_argument("--clean-minutes", type=float, default=0.0)
    p.add_argument("--burners", type=int, default=4)
    p.add_argument("--out", default="bench/results/failslow")
    args = p.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "# command: python -m bench failslow " + " ".join(sys.argv[1:] if argv is None else argv),
        "# machine: a 2-core VM shared with other work (every step time moves with its load);"
        " tc htb in network namespaces, 40 Mbit/s on the slowed links",
        f"{'case':8} {'ranks':>5} {'bytes':>9} {'healthy ms':>10} {'slowest ms':>10} "
        f"{'adapted ms':>10} {'kept':>6} {'to schedule s':>13}",
    ]
    print("\n".join(lines), flush=True)
    cases = []
    for name in [c for c in args.cases.split(",") if c]:
        c = spare_case(name, args.after) if name in SPARE_CASES else one_case(name, args.after)
        cases.append(c)
        to = "-" if c["to_schedule_s"] is None else f"{c['to_schedule_s']:.1f}"
        lines.append(
            f"{name:8} {c['ranks']:5d} {c['bytes']:9d} {c['healthy_s'] * 1e3:10.0f} "
            f"{c['slowest_s'] * 1e3:10.0f} {c['adapted_s'] * 1e3:10.0f} {c['kept']:6.0%} {to:>13}"
        )
        print(lines[-1], flush=True)
        if "to_spare_step_s" in c:
            lines.append(
                f"    rank {c['replaced_rank']} replaced: generation {c['generation']} "
                f"{c['to_new_generation_s']:.1f} s after the slowdown, the spare's first "
                f"step {c['to_spare_step_s']:.1f} s after it"
            )
            print(lines[-1], flush=True)
        for ln in c["log"]:
            print(f"    {ln}", flush=True)
        (out / "failslow.json").write_text(json.dumps({"cases": cases}, indent=1) + "\n")
    result: dict = {"cases": cases}
    if args.clean_minutes > 0:
        cl = clean(args.clean_minutes, args.burners)
        result["clean"] = cl
        lines.append(
            f"clean: {cl['minutes']:.1f} min, 4 workers beside {cl['burners']} CPU burners, "
            f"{cl['steps']} steps (median {cl['median_step_s'] * 1e3:.0f} ms): "
            f"{cl['false_flags']} false flags ({cl['false_flags_per_hour']:.1f} per hour)"
        )
        print(lines[-1], flush=True)
    (out / "failslow.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "failslow.txt").write_text("\n".join(lines) + "\n")
    if cases:
        plot([c for c in cases if c["case"] != "small4"], out / "steps.png")
    print(f"wrote {out}/failslow.json, failslow.txt, steps.png")


if __name__ == "__main__":
    main()
