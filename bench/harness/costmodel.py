"""The alpha-beta cost model: time(size) = alpha + beta x size, fitted per backend.

alpha is the fixed cost of one operation (latency: rounds x per-message overhead) and beta the
cost per byte (1 / beta is the effective algorithm bandwidth). The fit minimises the *relative*
error over all measured sizes, so 4 B and 64 MiB points count alike. With the fits, the size
where two algorithms cost the same is (alpha_a - alpha_b) / (beta_b - beta_a); those crossovers
are what `algorithm="auto"` uses (collectives/group/tuning.py).

Regenerate the crossovers on a new machine (all_reduce, one world size per run):

    python -m bench --backends direct,tree,ring --nproc 2 --json /tmp/ar2.json --no-limit
    python -m bench costmodel /tmp/ar2.json --write     # updates collectives/group/tuning.py

`--write` changes only the numbers of DIRECT_MAX_BYTES[nproc] and (for nproc > 2, the only
case where "auto" considers the tree) TREE_MAX_BYTES, rounded to a power of two.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import sys

import numpy as np

ALGORITHMS = ("direct", "tree", "ring", "naive")  # what "auto" may choose between
TUNING = os.path.join(os.path.dirname(__file__), "..", "..", "collectives", "group", "tuning.py")


def fit(points) -> tuple[float, float]:
    """(alpha us, beta us/B) minimising sum(((alpha + beta s) - t) / t)^2, both >= 0."""
    s = np.array([p[0] for p in points], float)
    t = np.array([p[1] for p in points], float)
    a = np.stack([1 / t, s / t], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if alpha < 0:  # pure bandwidth
        alpha, beta = 0.0, float(np.sum(s / t) / np.sum((s / t) ** 2))
    elif beta < 0:  # pure latency
        alpha, beta = float(np.sum(1 / t) / np.sum((1 / t) ** 2)), 0.0
    return float(alpha), float(beta)


def fits(result: dict) -> dict[str, tuple[float, float]]:
    out = {}
    for name in {r["backend"] for r in result["results"]}:
        pts = [(r["size"], r["time_us"]) for r in result["results"] if r["backend"] == name]
        if len(pts) >= 2:
            out[name] = fit(pts)
    return out


def crossover(lo: tuple, hi: tuple) -> float | None:
    """Size below which `lo` (lower alpha) beats `hi`; None if `lo` never wins, inf if always."""
    (a1, b1), (a2, b2) = lo, hi
    if a1 >= a2 and b1 >= b2:
        return None
    if b1 <= b2:
        return math.inf if a1 <= a2 else None
    return (a2 - a1) / (b1 - b2)


def crossovers(model: dict) -> dict:
    """{'direct_max': bytes, 'tree_max': bytes} from the fitted algorithms (None: not measured)."""
    out = {"direct_max": None, "tree_max": None}
    others = [model[a] for a in ("tree", "ring") if a in model]
    if "direct" in model and others:
        xs = [crossover(model["direct"], o) for o in others]
        out["direct_max"] = 0 if any(x is None for x in xs) else min(xs)
    if "tree" in model and "ring" in model:
        x = crossover(model["tree"], model["ring"])
        out["tree_max"] = 0 if x is None else x
    return out


def measured_crossover(result: dict, a: str, b: str) -> int | None:
    """The largest measured size at which `a` was still faster than `b` (median times)."""
    ta = {r["size"]: r["time_us"] for r in result["results"] if r["backend"] == a}
    tb = {r["size"]: r["time_us"] for r in result["results"] if r["backend"] == b}
    wins = [s for s in sorted(set(ta) & set(tb)) if ta[s] < tb[s]]
    return wins[-1] if wins else None


def pow2(x: float, cap: int) -> int:
    if x <= 0:
        return 0
    return int(2 ** round(math.log2(min(x, cap))))


def summary(result: dict) -> str:
    model = fits(result)
    if not model:
        return ""
    rows = result["results"]
    names = [b for b in (*result["meta"]["backends"], "limit") if b in model]
    lines = [
        "#",
        "# cost model: time = alpha + beta x size (relative least squares)",
        f"# {'backend':>8} {'alpha (us)':>11} {'1/beta (GB/s)':>14}",
    ]
    for b in names:
        a, beta = model[b]
        bw = f"{1e-3 / beta:14.3f}" if beta > 0 else f"{'inf':>14}"
        lines.append(f"  {b:>8} {a:11.1f} {bw}")
    lines += [
        "#",
        "# predicted vs measured time (us)",
        f"# {'size (B)':>10} |" + "".join(f" {b:>19} |" for b in names),
    ]
    for s in sorted({r["size"] for r in rows}):
        line = f"  {s:>10} |"
        for b in names:
            m = next((r["time_us"] for r in rows if r["backend"] == b and r["size"] == s), None)
            a, beta = model[b]
            line += f" {a + beta * s:9.1f} {m:9.1f} |" if m is not None else f" {'-':>19} |"
        lines.append(line)
    if result["meta"]["collective"] == "all_reduce":
        cross = crossovers(model)
        for key, (a, b) in (("direct_max", ("direct", "ring")), ("tree_max", ("tree", "ring"))):
            if cross[key] is None:
                continue
            meas = measured_crossover(result, a, b)
            lines.append(
                f"# crossover {a} -> {'tree/ring' if key == 'direct_max' else b}: "
                f"model {_fmt_x(cross[key])}, measured: {a} last faster than {b} at "
                f"{meas if meas is not None else 'no size'} B"
            )
    return "\n".join(lines)


def link_model(result: dict) -> tuple[float, float] | None:
    """(alpha us, beta us/B) of one link in the single-port model (docs/proofs.md), read off
    the ring's fit: the ring costs 2(n-1) alpha + 2(n-1)/n N beta, so its fitted alpha is
    2(n-1) link alphas and its beta 2(n-1)/n link betas. None without a ring (or n < 2)."""
    n = result["meta"]["nproc"]
    model = fits(result)
    if "ring" not in model or n < 2:
        return None
    a, b = model["ring"]
    return a / (2 * (n - 1)), b / (2 * (n - 1) / n)


def link_summary(result: dict) -> str:
    """Every algorithm with a closed form (collectives.teaching.emulate.cost) predicted from
    the one link model the ring gives, beside its measured time: what the model explains of
    a real run, and what it does not (a crowded host, per-message work that is not the
    ring's)."""
    from collectives.teaching.emulate import COSTED, cost

    link = link_model(result)
    if link is None or result["meta"]["collective"] != "all_reduce":
        return ""
    n, (alpha, beta) = result["meta"]["nproc"], link
    rows = result["results"]
    names = [b for b in result["meta"]["backends"] if b in COSTED]
    bw = f"{1e-3 / beta:.3f} GB/s" if beta > 0 else "inf"
    lines = [
        "#",
        f"# one link, fitted on the ring: alpha {alpha:.1f} us, 1/beta {bw}; each algorithm",
        "# predicted by its closed form (emulate.cost) beside its measured time (us)",
        f"# {'size (B)':>10} |" + "".join(f" {b:>23} |" for b in names),
    ]
    for s in sorted({r["size"] for r in rows}):
        line = f"  {s:>10} |"
        for b in names:
            m = next((r["time_us"] for r in rows if r["backend"] == b and r["size"] == s), None)
            pred = cost(b, n).time(s, alpha, beta)
            line += f" {pred:11.1f} {m:11.1f} |" if m is not None else f" {'-':>23} |"
        lines.append(line)
    return "\n".join(lines)


def _fmt_x(x) -> str:
    if x == math.inf:
        return "never (always faster)"
    return f"{x:.0f} B"


# --- writing collectives/group/tuning.py ------------------------------------------------------------
def _value(node):
    """Evaluate the integer literals and << * + of tuning.py's constants (nothing else)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp):
        ops = {
            ast.LShift: lambda a, b: a << b,
            ast.Mult: lambda a, b: a * b,
            ast.Add: lambda a, b: a + b,
        }
        if type(node.op) in ops:
            return ops[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    raise ValueError(f"tuning.py: cannot read {ast.dump(node)}")


def _literal(n: int) -> str:
    for shift in (20, 10):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} << {shift}"
    return str(n)


def write_tuning(
    nproc: int, direct_max: int | None, tree_max: int | None, path: str = TUNING
) -> list[str]:
    """Rewrite only the assignments of DIRECT_MAX_BYTES and TREE_MAX_BYTES; return changes."""
    src = open(path).read()
    lines = src.splitlines(keepends=True)
    changes, edits = [], []
    for node in ast.parse(src).body:
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            continue
        name = node.targets[0].id
        if name == "DIRECT_MAX_BYTES" and direct_max is not None:
            table = _value(node.value)
            old = table.get(nproc)
            table[nproc] = direct_max
            text = ", ".join(f"{k}: {_literal(v)}" for k, v in sorted(table.items()))
            edits.append((node, f"DIRECT_MAX_BYTES = {{{text}}}\n"))
            changes.append(f"DIRECT_MAX_BYTES[{nproc}]: {old} -> {direct_max}")
        elif name == "TREE_MAX_BYTES" and tree_max is not None:
            edits.append((node, f"TREE_MAX_BYTES = {_literal(tree_max)}\n"))
            changes.append(f"TREE_MAX_BYTES: {_value(node.value)} -> {tree_max}")
    for node, text in sorted(edits, key=lambda e: -e[0].lineno):
        lines[node.lineno - 1 : node.end_lineno] = [text]
    with open(path, "w") as f:
        f.write("".join(lines))
    return changes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench costmodel",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("json", help="a result file of `python -m bench ... --json FILE`")
    p.add_argument(
        "--write", action="store_true", help="store the crossovers in collectives/group/tuning.py"
    )
    p.add_argument(
        "--links",
        action="store_true",
        help="also fit one link's alpha and beta on the ring and predict every other "
        "algorithm from its closed form, beside its measured time",
    )
    p.add_argument("--tuning", default=TUNING, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    with open(args.json) as f:
        result = json.load(f)
    print(summary(result) or "# no backend has two or more sizes: nothing to fit")
    if args.links:
        print(link_summary(result) or "# --links needs an all_reduce result with a ring")
    if not args.write:
        return 0
    meta = result["meta"]
    if meta["collective"] != "all_reduce":
        sys.exit("costmodel --write: the crossovers are for all_reduce results only")
    cross = crossovers(fits(result))
    cap = max(meta["sizes"])
    direct = None if cross["direct_max"] is None else pow2(cross["direct_max"], cap)
    tree = None
    if cross["tree_max"] is not None and meta["nproc"] > 2:
        tree = pow2(cross["tree_max"], cap)
    if direct is None and tree is None:
        sys.exit(
            "costmodel --write: need direct with tree/ring (and tree with ring at "
            "nproc > 2) in the result to set any crossover"
        )
    for change in write_tuning(meta["nproc"], direct, tree, args.tuning):
        print(f"# {os.path.relpath(args.tuning)}: {change}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
