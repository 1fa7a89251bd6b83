"""python -m collectives.simulation run --seed S [--trace] | sweep --seeds A:B [--jobs 2]"""

from __future__ import annotations

import argparse
import sys

from .sweep import summary, sweep, traced


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m collectives.simulation")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run one seed; check its properties")
    run.add_argument("--seed", type=int, required=True)
    run.add_argument("--trace", action="store_true", help="print every event")
    sw = sub.add_parser("sweep", help="run seeds A..B-1; print each failing seed's trace")
    sw.add_argument("--seeds", required=True, help="A:B")
    sw.add_argument("--jobs", type=int, default=1)
    sw.add_argument("--traces", type=int, default=3, help="print at most this many traces")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        w, bad = traced(args.seed)
        if args.trace or bad:
            print("\n".join(w.trace))
        print(summary(w))
        for v in bad:
            print(f"VIOLATED {v.prop}: {v.what}")
        print(f"{len(bad)} violation(s)")
        return 1 if bad else 0
    a, b = (int(x) for x in args.seeds.split(":"))
    failing, took = sweep(a, b, args.jobs)
    for o in failing[: args.traces]:
        w, bad = traced(o.seed)
        print("\n".join(w.trace))
        print(summary(w))
        for v in bad:
            print(f"VIOLATED {v.prop}: {v.what}")
        print()
    for o in failing:
        print(f"seed {o.seed}: " + "; ".join(f"{v.prop}: {v.what}" for v in o.violations))
    print(
        f"{b - a} seeds in {took:.1f} s ({1000 * took / max(1, b - a):.1f} ms a run, "
        f"{args.jobs} job(s)): {len(failing)} failing"
    )
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
