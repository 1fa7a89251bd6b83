"""Stall recovery figures: from a stalled all_reduce's start to the verdict (the error every
survivor raises) and to the survivors' next completed step, per case, with the link probes
of a tied diagnosis (membership/probing.py) and without them (COLLECTIVES_LINK_PROBES=0, the
tie rule alone: what the library did before it probed).

    python -m bench stall [--repeats 3] [--json FILE]

Each run is the stall scenario of tests/scenarios/test_stall_culprit.py: n workers
(tests/support/stall_worker.py, rank 0 hosting the coordinator, op timeout 3 s) whose
culprit's links are held for 60 s from the first op on, in every generation. "right" counts
the runs that evicted exactly the culprit and finished in step; a run that evicted a healthy
rank stalls again on the link left behind and does not finish ("wrong"). Times are seconds
after the stalled op began, medians over the survivors and repeats, with min and max.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
from support.procs import ProcessSet  # noqa: E402  (the harness the stall tests use)
from support.stall_runs import PATTERNS, SIZES, check, delays, run_hosted  # noqa: E402

CASES = [
    (3, 0, "two_links", "tree"),
    (3, 1, "two_links", "direct"),
    (3, 2, "whole_host", "direct"),
    (4, 0, "two_links", "tree"),
    (5, 3, "two_links", "tree"),
]


def one_run(n, culprit, pattern, size, probes: bool):
    """(right, [verdict s], [next step s]) of one run; a run that went wrong says how on
    stderr (its first lines)."""
    with tempfile.TemporaryDirectory() as tmp:
        procs = ProcessSet(tmp)
        try:
            results = run_hosted(
                procs,
                n,
                delays(PATTERNS[pattern](culprit, n)),
                SIZES[size],
                COLLECTIVES_LINK_PROBES="1" if probes else "0",
            )
            check(results, n, culprit, SIZES[size])
        except AssertionError as exc:
            print(
                f"  n={n} culprit={culprit} {pattern} {size} probes={probes}: {str(exc)[:600]}",
                file=sys.stderr,
                flush=True,
            )
            return False, [], []
        finally:
            procs.close()
    rec = [results[r]["recovery"][0] for r in range(n) if r != culprit]
    return True, [r[0] for r in rec], [r[1] for r in rec if len(r) > 1]


def spread(xs) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench stall", description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--only", metavar="N,CULPRIT", help="one case, e.g. 3,0")
    args = p.parse_args(argv)
    rows = []
    print(f"{'case':<34} {'probes':>6} {'right':>6} {'verdict s':>18} {'next step s':>18}")
    cases = CASES
    if args.only:
        cases = [c for c in CASES if f"{c[0]},{c[1]}" == args.only]
    for n, culprit, pattern, size in cases:
        for probes in (True, False):
            right, verdict, nxt = 0, [], []
            for _ in range(args.repeats):
                ok, v, s = one_run(n, culprit, pattern, size, probes)
                right += ok
                verdict += v
                nxt += s
            case = f"n={n} culprit={culprit} {pattern} {size}"
            print(
                f"{case:<34} {'on' if probes else 'off':>6} {right:>3}/{args.repeats:<2} "
                f"{spread(verdict):>18} {spread(nxt):>18}",
                flush=True,
            )
            rows.append(
                {
                    "n": n,
                    "culprit": culprit,
                    "pattern": pattern,
                    "size": size,
                    "probes": probes,
                    "right": right,
                    "repeats": args.repeats,
                    "verdict_s": verdict,
                    "next_step_s": nxt,
                }
            )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
