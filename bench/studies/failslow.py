"""Fail-slow links: the speed kept once the coordinator routes around a slowed link, the time
from the slowdown to the new schedule, and false flags on clean runs beside CPU burners.

    python -m bench failslow [--cases link4,link6,link3,tree3,nic4,small4]
                             [--gloo link4,link3,link3m,nic4]
                             [--repeats 3] [--clean-minutes 30] [--burners 4] [--clean-small]
                             [--out bench/results/failslow]

Each case is the scenario of tests/scenarios/test_failslow.py (tests/support/failslow_runs.py):
n workers on n network-namespace hosts, a standalone coordinator on one more, an all_reduce
(AVG) of 8 MiB per step (small: 64 KiB), then tc htb holds some links to 40 Mbit/s for good:

  link4   4 workers, the pair 0 <-> 1           (a ring that keeps off both directions)
  link6   6 workers, the pair 0 <-> 1
  link3   3 workers, 0 -> 1 and 1 -> 2           (the seed's pattern: the ring reversed)
  link3m  3 workers, 1 -> 0 and 2 -> 1           (the same, mirrored: on Gloo's ring)
  tree3   3 workers, the pair 0 <-> 1           (no ring avoids it: the tree rooted at 2)
  nic4    4 workers, every link of rank 2       (nothing avoids it: reported)
  small4  4 workers, the pair 0 <-> 1, 64 KiB   (auto: the binomial tree; the link under the flag's share)
  nic4half     4 workers, every link of rank 2 at half the rate a healthy link measures here
  nic4quarter  the same at a quarter (RATES: how those rates were chosen)
  nic4spare  4 workers and a warm spare on a fifth host, every link of rank 2, policy
          `replace` (the rank removed, the spare takes its place; the adapted window from
          15 s after the slowdown, and the seconds to the spare's first committed step)
  nic4shrink  4 workers, no spare, every link of rank 2, policy `shrink` (the rank removed,
          the others go on as 3; the speed kept is against a healthy world of 3 run first
          on the same hosts, the adapted window from 15 s after the slowdown)

The cases named by --gloo run again over torch.distributed Gloo (the same steps, no
coordinator): the reference that does nothing. Gloo's ring sends to rank r-1 (this library's
to r+1: algorithms/gloo_ring.py), so link3's two links carry none of Gloo's ring and link3m's
carry it: link3m over Gloo is the seed's pattern doing nothing. Every case runs --repeats times, one run of
each case after another (so that a busy minute of the machine falls on one run of several
cases, not on every run of one), a case's Gloo run right after its own. --from adds the runs
(and the clean run) of earlier failslow.json files to the summary.

Reported per case: the healthy step time (the median of the quiet steps before the slowdown),
the slowest step after it, the median quiet step from 10 s after it (each window runs on until
it holds enough quiet steps: failslow_runs.py), the speed kept (healthy / that, a ratio within
one run), and the seconds from the slowdown to the coordinator's reroute (or NIC report) as
its log shows it (polled every 0.1 s): the medians over the runs, and the speed kept's least
and greatest. A run whose two windows the machine left too busy to compare is a run "not
measured", with the reason, and counts in no median. Clean runs: 4 workers with nothing slowed,
`--burners` processes spinning on the CPUs beside them, for `--clean-minutes` (8 MiB steps;
--clean-small: small4's 64 KiB, judged on their latency); every "flagged" line is a false
flag. Needs root (network namespaces). Writes failslow.json,
failslow.txt and steps.png to --out.
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
from support.failslow_runs import (  # noqa: E402
    NotMeasured,
    Run,
    check_identical,
    check_shrunk,
    healthy_time,
    check_replaced,
    nic,
    pair,
    run,
    speed,
)
from support.netns import Hosts  # noqa: E402
from support.procs import ProcessSet  # noqa: E402

CASES = {
    "link4": (4, pair(0, 1), 2 << 20, "rerouted from op #"),
    "link6": (6, pair(0, 1), 2 << 20, "rerouted from op #"),
    "link3": (3, [(0, 1), (1, 2)], 2 << 20, "rerouted from op #"),
    "link3m": (3, [(1, 0), (2, 1)], 2 << 20, "rerouted from op #"),
    "tree3": (3, pair(0, 1), 2 << 20, "rerouted from op #"),
    "nic4": (4, nic(2, 4), 2 << 20, "rank 2's NIC flagged"),
    "small4": (4, pair(0, 1), 16 << 10, "rerouted from op #"),
}
# The NIC cases' tc rate (every other case: 40 Mbit/s): half and a quarter of what a healthy
# link measured here (linkstats.py: bytes over transit) while other runs kept the machine busy
# -- about 380 Mbit/s, the median of the 4 ring links over a healthy minute of nic4half at
# 1100 Mbit/s, which did not slow them. On a quiet machine the same links measure 1.2-2.7
# Gbit/s, where half is about 700-1100 Mbit/s (--rates). Each run's log says the ratio it met:
# "rank 2's NIC runs behind its peers: ... (2.4x slower)".
RATES = {"nic4half": "190mbit", "nic4quarter": "95mbit"}
CASES.update(nic4half=(4, nic(2, 4), 2 << 20, "rank 2's NIC"))
CASES.update(nic4quarter=(4, nic(2, 4), 2 << 20, "rank 2's NIC"))
# a warm spare waits; policy `replace`: (ranks, links, count, watch, the rank replaced)
SPARE_CASES = {"nic4spare": (4, nic(2, 4), 2 << 20, "a spare takes the place of rank 2", 2)}
# no spare; policy `shrink`: (ranks, links, count, watch, the rank removed)
SHRINK_CASES = {"nic4shrink": (4, nic(2, 4), 2 << 20, "removing rank 2", 2)}
SPARE_WITHIN = 15.0  # s: the adapted window starts this long after the slowdown
NET = 85
WITHIN = 10.0  # s after the slowdown: the adapted window starts here (the "within 10 s")
BURN = "import time\nend = time.monotonic() + 7200\nwhile time.monotonic() < end: pass\n"


def one_case(name: str, backend: str, after: float) -> dict:
    """One run of a case: its figures, or, where the machine was too busy to compare the two
    step rates, the reason they were not measured (kept None)."""
    n, links, count, watch = CASES[name]
    with tempfile.TemporaryDirectory() as tmp, Hosts(n + 1, NET, tag="fb") as hosts:
        procs = ProcessSet(tmp)
        try:
            r = run(
                procs,
                hosts,
                n,
                links,
                after=after,
                count=count,
                watch=watch,
                adapted_from=WITHIN,
                backend=backend,
                rate=RATES.get(name, "40mbit"),
            )
            check_identical(r, n)
        finally:
            procs.close()
    return _record(name, backend, r, links, count, WITHIN, ("flagged", "rerouted", "NIC"), 6)


def _record(
    name: str,
    backend: str,
    r: Run,
    links: list[tuple[int, int]],
    count: int,
    within: float,
    keep: tuple[str, ...],
    lines: int,
) -> dict:
    """A run's record: its figures, or, where the machine was too busy to compare the two
    step rates, the reason they were not measured (kept None). `keep`: the words of the
    coordinator's log lines kept (the first `lines` of them)."""
    res = r.results[0]
    out = {
        "case": name,
        "backend": backend,
        "ranks": len(r.results),
        "bytes": 4 * (count + 1),
        "links": [list(x) for x in links],
        "to_schedule_s": None if r.seen_at is None else r.seen_at - r.slowed_at,
        # CPUs the rest of the machine used in the healthy window and in the adapted one
        "foreign_cpus": [
            r.foreign.rate(r.healthy_from, r.slowed_at),
            r.foreign.rate(r.slowed_at + within, r.stopped_at),
        ],
        "healthy_from_s": r.healthy_from - r.slowed_at,
        "log": [ln for ln in r.log.splitlines() if any(k in ln for k in keep)][:lines],
        "steps": [
            [round(e - r.slowed_at, 3), round(t, 4)] for e, t in zip(res["ends"], res["took"])
        ],
    }
    try:
        s = speed(r, within)
    except NotMeasured as exc:
        return dict(
            out,
            kept=None,
            not_measured=str(exc),
            healthy_whole_s=exc.whole[0],
            adapted_whole_s=exc.whole[1],
            foreign_cpus=exc.loads,
        )
    return dict(
        out,
        healthy_s=s.healthy,
        slowest_s=s.slowed,
        adapted_s=s.adapted,
        kept=s.kept,
        quiet_steps=list(s.steps),
    )


def summary(runs: list[dict]) -> dict:
    """The medians of a case's measured runs, with the spread of the speed kept."""
    if not runs:
        return {"runs": 0}
    done = [x for x in runs if x["kept"] is not None]
    seen = [x["to_schedule_s"] for x in runs if x["to_schedule_s"] is not None]

    def med(key):
        return statistics.median(x[key] for x in done) if done else None

    kept = [x["kept"] for x in done]
    return {
        "case": runs[0]["case"],
        "backend": runs[0]["backend"],
        "ranks": runs[0]["ranks"],
        "bytes": runs[0]["bytes"],
        "runs": len(runs),
        "measured": len(done),
        "healthy_s": med("healthy_s"),
        "slowest_s": med("slowest_s"),
        "adapted_s": med("adapted_s"),
        "kept": med("kept"),
        "kept_min": min(kept) if kept else None,
        "kept_max": max(kept) if kept else None,
        "to_schedule_s": statistics.median(seen) if seen else None,
        "to_schedule_max_s": max(seen) if seen else None,
        "not_measured": [_not_measured(x) for x in runs if x["kept"] is None],
    }


def _not_measured(x: dict) -> str:
    """Why a run was not measured, with its windows' medians over every step all the same."""
    if "healthy_whole_s" not in x:
        return x["not_measured"]
    h, a = x["healthy_whole_s"], x["adapted_whole_s"]
    return (
        f"{x['not_measured']}; over every step: healthy {h * 1e3:.0f} ms, adapted"
        f" {a * 1e3:.0f} ms ({h / a:.0%}, not a measurement)"
    )


def row(c: dict) -> str:
    def ms(v):
        return "-" if v is None else f"{v * 1e3:.0f}"

    kept = "-" if c["kept"] is None else f"{c['kept']:.0%}"
    spread = "-" if c["kept"] is None else f"{c['kept_min']:.0%}-{c['kept_max']:.0%}"
    to = "-"
    if c["to_schedule_s"] is not None:
        to = f"{c['to_schedule_s']:.1f} (max {c['to_schedule_max_s']:.1f})"
    return (
        f"{c['case']:8} {c['backend']:11} {c['ranks']:5d} {c['bytes']:9d} {ms(c['healthy_s']):>7} "
        f"{ms(c['slowest_s']):>7} {ms(c['adapted_s']):>7} {kept:>5} {spread:>9} "
        f"{c['measured']:>3}/{c['runs']:<3} {to:>15}"
    )


def spare_case(name: str, after: float) -> dict:
    """A SPARE_CASES case: one_case's record (over this library), the adapted window from
    SPARE_WITHIN s, and when the rank was removed and the spare committed its first step."""
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
    keep = ("flagged", "rerouted", "replacing", "spare takes")
    return dict(
        _record(name, "collectives", r, links, count, SPARE_WITHIN, keep, 10),
        ranks=n,  # the ranks the job started with (the spare took one's place)
        replaced_rank=rep.rank,
        generation=rep.generation,
        to_new_generation_s=rep.changed,
        to_spare_step_s=rep.first_step,
    )


def shrink_case(name: str, after: float) -> dict:
    """A SHRINK_CASES case: a healthy world of n - 1 on the same hosts first (its healthy
    window only), then the case; the speed kept is that world's healthy step time over the
    adapted one (from SPARE_WITHIN s), and when the rank was removed."""
    n, links, count, watch, rank = SHRINK_CASES[name]
    with tempfile.TemporaryDirectory() as tmp, Hosts(n + 1, NET, tag="fb") as hosts:
        base_dir, run_dir = pathlib.Path(tmp) / "base", pathlib.Path(tmp) / "run"
        base_dir.mkdir()
        run_dir.mkdir()
        procs = ProcessSet(base_dir)
        try:
            base = run(procs, hosts, n - 1, [], after=0.5, count=count)
        finally:
            procs.close()
        procs = ProcessSet(run_dir)
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
                policy="shrink",
                elastic=True,
            )
            gone = check_shrunk(r, n, rank)
        finally:
            procs.close()
    x = dict(
        _record(name, "collectives", r, links, count, SPARE_WITHIN, ("flagged", "removing"), 10),
        removed_rank=gone.rank,
        generation=gone.generation,
        to_new_generation_s=gone.changed,
    )
    if x["kept"] is None:
        return x
    try:
        healthy = healthy_time(base)
    except NotMeasured as exc:
        return dict(x, kept=None, not_measured=f"the healthy world of {n - 1}: {exc}")
    # the healthy column: the world the job shrank to (its own, of n ranks, kept beside it)
    return dict(x, healthy_n_s=x["healthy_s"], healthy_s=healthy, kept=healthy / x["adapted_s"])


def _removed(x: dict) -> str:
    return (
        f"rank {x['removed_rank']} removed: generation {x['generation']} "
        f"{x['to_new_generation_s']:.1f} s after the slowdown; a healthy world of "
        f"{x['ranks'] - 1}: {x['healthy_s'] * 1e3:.0f} ms a step, of {x['ranks']}: "
        f"{x.get('healthy_n_s', float('nan')) * 1e3:.0f} ms"
    )


def _replaced(x: dict) -> str:
    return (
        f"rank {x['replaced_rank']} replaced: generation {x['generation']} "
        f"{x['to_new_generation_s']:.1f} s after the slowdown, the spare's first step "
        f"{x['to_spare_step_s']:.1f} s after it"
    )


def clean(minutes: float, burners: int, count: int = 2 << 20) -> dict:
    with tempfile.TemporaryDirectory() as tmp, Hosts(5, NET + 1, tag="fc") as hosts:
        procs = ProcessSet(tmp)
        try:
            for i in range(burners):
                procs.spawn(f"burn{i}", [sys.executable, "-c", BURN], {})
            began = time.monotonic()
            r = run(
                procs,
                hosts,
                4,
                [],
                after=minutes * 60,
                healthy_steps=5,
                healthy=0.0,
                count=count,
            )
            ran = time.monotonic() - began
            check_identical(r, 4)
        finally:
            procs.close()
    # a link or NIC flagged, or a NIC named behind its peers (slownic.py): each a false flag
    flags = [ln for ln in r.log.splitlines() if "flagged" in ln or "runs behind" in ln]
    steps = r.results[0]["steps"]
    return {
        "minutes": ran / 60,
        "burners": burners,
        "bytes": 4 * (count + 1),
        "steps": steps,
        "median_step_s": statistics.median(r.results[0]["took"]),
        "false_flags": len(flags),
        "false_flags_per_hour": len(flags) / (ran / 3600),
        "lines": flags[:10],
    }


def plot(runs: list[dict], path: pathlib.Path) -> None:
    """Each case's step times around the slowdown: of its run that kept the median speed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    keys = dict.fromkeys((x["case"], x["backend"]) for x in runs)
    for case, backend in keys:
        mine = [x for x in runs if (x["case"], x["backend"]) == (case, backend)]
        done = sorted((x for x in mine if x["kept"] is not None), key=lambda x: x["kept"])
        c = done[len(done) // 2] if done else mine[0]
        xs = [e for e, _ in c["steps"]]
        ys = [t * 1000 for _, t in c["steps"]]
        kept = "not measured" if c["kept"] is None else f"kept {c['kept']:.0%}"
        gloo = backend == "gloo"
        ax.plot(
            xs,
            ys,
            marker="" if gloo else ".",
            ls=":" if gloo else "-",
            lw=1.0 if gloo else 0.8,
            label=f"{case}{' (Gloo)' if gloo else ''} ({kept})",
        )
    ax.axvline(0, color="k", ls="--", lw=0.8)
    ax.text(0.2, ax.get_ylim()[1] * 0.9, "links slowed to 40 Mbit/s", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the slowdown (end of step)")
    ax.set_ylabel("step time (ms)")
    ax.set_title("8 MiB all_reduce per step: a slowed link found and routed around; Gloo dotted")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench failslow", description=__doc__.split("\n")[0])
    p.add_argument("--cases", default="link4,link6,link3,tree3,nic4,small4")
    p.add_argument(
        "--gloo",
        default="link4,link3,link3m,nic4",
        help="cases also run over torch.distributed Gloo, the reference that does nothing",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs of each case (median, min-max)")
    p.add_argument("--after", type=float, default=20.0, help="seconds run past the slowdown")
    p.add_argument(
        "--rates",
        default="",
        help="CASE=RATE,... tc rates for the NIC cases in place of RATES (e.g. nic4half=700mbit:"
        " half of what the healthy links measure on a quieter machine)",
    )
    p.add_argument("--clean-minutes", type=float, default=0.0)
    p.add_argument("--burners", type=int, default=4)
    p.add_argument(
        "--clean-small", action="store_true", help="the clean run's steps of 64 KiB (small4's)"
    )
    p.add_argument(
        "--from",
        dest="earlier",
        default="",
        help="failslow.json files of earlier runs (comma-separated): their runs and clean run"
        " are summarized with this one's (--repeats 0: summarized alone)",
    )
    p.add_argument("--out", default="bench/results/failslow")
    args = p.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for item in [x for x in args.rates.split(",") if x]:
        case, _, rate = item.partition("=")
        if case not in RATES or not rate:
            p.error(f"--rates: {item!r} is not CASE=RATE for one of {', '.join(RATES)}")
        RATES[case] = rate
    names = [c for c in args.cases.split(",") if c]
    gloo = [c for c in args.gloo.split(",") if c]
    for c in names + gloo:
        alone = {**SPARE_CASES, **SHRINK_CASES}  # over this library only
        if c not in CASES and not (c in alone and c in names and c not in gloo):
            p.error(f"no case {c!r}; one of: {', '.join(CASES)}, {', '.join(alone)}")
    # each case over this library, then over Gloo: the two runs as close in time as can be
    plan = [
        (c, backend)
        for c in dict.fromkeys(names + gloo)
        for backend, chosen in (("collectives", names), ("gloo", gloo))
        if c in chosen
    ]
    command = "python -m bench failslow " + " ".join(sys.argv[1:] if argv is None else argv)
    runs: list[dict] = []
    result: dict = {"command": command, "repeats": args.repeats, "cases": [], "runs": runs}
    for f in [f for f in args.earlier.split(",") if f]:
        earlier = json.loads(pathlib.Path(f).read_text())
        runs += [
            dict(x, steps=[[round(e, 3), round(t, 4)] for e, t in x["steps"]])
            for x in earlier.get("runs", [])
        ]
        if "clean" in earlier:
            result["clean"] = dict(earlier["clean"], source=f)
    lines = [
        f"# command: {command}",
        "# machine: a 2-core VM shared with other work (every step time moves with its load);"
        " tc htb in network namespaces, 40 Mbit/s on the slowed links"
        + "".join(f"; {c}: {RATES[c]}" for c in RATES if c in names),
        f"# each case run {args.repeats} times here, each over this library then over Gloo, one"
        " case after another; medians of the measured runs, the speed kept's min-max beside it",
        f"{'case':8} {'backend':11} {'ranks':>5} {'bytes':>9} {'healthy':>7} {'slowest':>7} "
        f"{'adapted':>7} {'kept':>5} {'kept span':>9} {'runs':>7} {'to schedule s':>15}",
        f"{'':8} {'':11} {'':5} {'':9} {'ms':>7} {'ms':>7} {'ms':>7}",
    ]
    if args.earlier:
        lines.insert(1, f"# with the runs of {args.earlier}")
    print("\n".join(lines), flush=True)
    for i in range(args.repeats if plan else 0):
        for name, backend in plan:
            if name in SPARE_CASES:
                x = spare_case(name, args.after)
            elif name in SHRINK_CASES:
                x = shrink_case(name, args.after)
            else:
                x = one_case(name, backend, args.after)
            runs.append(x)
            kept = "not measured" if x["kept"] is None else f"kept {x['kept']:.0%}"
            print(f"  run {i + 1}: {name} {backend}: {kept}", flush=True)
            if "to_spare_step_s" in x:
                print(f"    {_replaced(x)}", flush=True)
            if "removed_rank" in x and x["kept"] is not None:
                print(f"    {_removed(x)}", flush=True)
            for ln in x["log"]:
                print(f"    {ln}", flush=True)
            (out / "failslow.json").write_text(json.dumps(result, indent=1) + "\n")
    head = len(lines)
    for name, backend in dict.fromkeys(plan + [(x["case"], x["backend"]) for x in runs]):
        c = summary([x for x in runs if (x["case"], x["backend"]) == (name, backend)])
        if not c["runs"]:
            continue
        result["cases"].append(c)
        lines.append(row(c))
        lines += [f"    not measured: {why}" for why in c["not_measured"]]
        lines += [
            f"    {_replaced(x)}"
            for x in runs
            if (x["case"], x["backend"]) == (name, backend) and "to_spare_step_s" in x
        ]
        lines += [
            f"    {_removed(x)}"
            for x in runs
            if (x["case"], x["backend"]) == (name, backend)
            and "removed_rank" in x
            and x["kept"] is not None
        ]
    print("\n".join(lines[head:]), flush=True)
    if args.clean_minutes > 0:
        small = CASES["small4"][2]
        result["clean"] = clean(
            args.clean_minutes, args.burners, small if args.clean_small else 2 << 20
        )
    if "clean" in result:
        cl = result["clean"]
        lines.append(
            f"clean: {cl['minutes']:.1f} min, 4 workers of {cl.get('bytes', 8388612)} B steps beside"
            f" {cl['burners']} CPU burners, "
            f"{cl['steps']} steps (median {cl['median_step_s'] * 1e3:.0f} ms): "
            f"{cl['false_flags']} false flags ({cl['false_flags_per_hour']:.1f} per hour)"
            + (f" (from {cl['source']})" if "source" in cl else "")
        )
        print(lines[-1], flush=True)
    (out / "failslow.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "failslow.txt").write_text("\n".join(lines) + "\n")
    if runs:
        plot([x for x in runs if x["case"] != "small4"], out / "steps.png")
    print(f"wrote {out}/failslow.json, failslow.txt" + (", steps.png" if runs else ""))


if __name__ == "__main__":
    main()
