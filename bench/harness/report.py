"""Text reports: one nccl-tests table per backend, then the comparison against Gloo.

Columns follow nccl-tests: size (B), count (elements), type, redop, root, time (us, the median
of the repeats), algbw and busbw (GB/s, 1e9 bytes), #wrong. The comparison table puts every
backend side by side at each size with `xgloo` = Gloo's time / this backend's time (above 1 is
faster than Gloo) and `%lim` = busbw / the loopback limit's busbw in the same run.
"""

from __future__ import annotations

# Rows measured in the same run that bound the backends from below (printed last): the raw
# ring (limit.py), the latency floor and the copy floor (floors.py).
LIMITS = ("limit", "floor", "copy")
REFERENCES = ("gloo", "mpi", "nccl") + LIMITS  # rows that get no ratio columns
_ABOUT = {
    "limit": "raw ring, no reduction: the loopback limit; with shm a raw shared-memory ring",
    "floor": "latency floor: the bare pyzmq exchange of the algorithm's pattern, PAIR over "
    "ipc, no header or check",
    "copy": "copy floor: the bytes one rank must copy and reduce for the algorithm, on one "
    "core at this moment's bandwidth",
    "mpi": "mpi4py over MPICH under mpiexec (its own processes, half the repeats before the "
    "other backends and half after)",
}


def header(meta: dict) -> str:
    return (
        f"# collectives bench: {meta['collective']}, {meta['nproc']} ranks, "
        f"{meta['dtype']} {meta['op']}, transport {meta['transport']}, "
        f"iters {meta['iters']} (fewer above 4 MiB), warmup {meta['warmup']}, "
        f"repeats {meta['repeats']} (median; min/max in the JSON)\n"
        f"# {meta['machine']}\n# command: {meta['command']}"
    )


def backend_table(name: str, rows: list[dict]) -> str:
    lines = [
        f"#\n# backend: {name}" + (f"  ({_ABOUT[name]})" if name in _ABOUT else ""),
        f"# {'size':>10} {'count':>11} {'type':>8} {'redop':>7} {'root':>5} "
        f"{'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}",
        f"# {'(B)':>10} {'(elements)':>11} {'':>8} {'':>7} {'':>5} "
        f"{'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}",
    ]
    for r in rows:
        wrong = "n/a" if r["wrong"] is None else str(r["wrong"])
        lines.append(
            f"  {r['size']:>10} {r['count']:>11} {r['type']:>8} {r['redop']:>7} "
            f"{r['root']:>5} {r['time_us']:>10.1f} {r['algbw_gbs']:>8.3f} "
            f"{r['busbw_gbs']:>8.3f} {wrong:>7}"
        )
    return "\n".join(lines)


def comparison_table(rows: list[dict], backends: list[str]) -> str:
    """Per size: time and busbw of every backend, its ratio to Gloo and its share of the limit."""
    at = {(r["backend"], r["size"]): r for r in rows}
    sizes = sorted({r["size"] for r in rows})
    has_gloo = any(b == "gloo" for b, _ in at)
    has_mpi = any(b == "mpi" for b, _ in at)
    has_limit = any(b == "limit" for b, _ in at)
    has_floor = any(b in ("floor", "copy") for b, _ in at)
    names = [b for b in backends if b not in LIMITS] + [
        b for b in LIMITS if any(n == b for n, _ in at)
    ]
    head1 = f"# {'size (B)':>10} |"
    head2 = f"# {'':>10} |"
    for b in names:
        cols = []
        if b not in REFERENCES:
            cols = [
                c
                for on, c in (
                    (has_gloo, "xgloo"),
                    (has_mpi, "xmpi"),
                    (has_limit, "%lim"),
                    (has_floor, "/flr"),
                )
                if on
            ]
        width = 21 + 7 * len(cols)
        head1 += f" {b:^{width}} |"
        head2 += f" {'time(us)':>10} {'busbw':>9}" + "".join(f" {c:>6}" for c in cols) + " |"
    lines = [
        "#\n# comparison: median time (us), busbw (GB/s); xgloo = gloo time / time "
        "(>1 = faster than gloo), xmpi the same against MPI; %lim = busbw / limit busbw; "
        "/flr = time / the higher of the latency and copy floors (1 = at the floor)",
        head1,
        head2,
    ]
    for s in sizes:
        line = f"  {s:>10} |"
        gloo, mpi, limit = at.get(("gloo", s)), at.get(("mpi", s)), at.get(("limit", s))
        floors = [at[(f, s)]["time_us"] for f in ("floor", "copy") if (f, s) in at]
        for b in names:
            r = at.get((b, s))
            ref = b in REFERENCES
            show_x, show_m = has_gloo and not ref, has_mpi and not ref
            show_l, show_f = has_limit and not ref, has_floor and not ref
            if r is None:
                line += (
                    f" {'-':>10} {'-':>9}" + " " * (7 * (show_x + show_m + show_l + show_f)) + " |"
                )
                continue
            line += f" {r['time_us']:>10.1f} {r['busbw_gbs']:>9.3f}"
            for show, other in ((show_x, gloo), (show_m, mpi)):
                if show:
                    line += f" {other['time_us'] / r['time_us']:>6.2f}" if other else f" {'-':>6}"
            if show_l:
                pct = (
                    100 * r["busbw_gbs"] / limit["busbw_gbs"]
                    if limit and limit["busbw_gbs"] > 0
                    else None
                )
                line += f" {pct:>5.0f}%" if pct is not None else f" {'-':>6}"
            if show_f:
                line += f" {r['time_us'] / max(floors):>6.2f}" if floors else f" {'-':>6}"
            line += " |"
        lines.append(line)
    return "\n".join(lines)


# The speed targets (2 ranks, float32 SUM all_reduce), checked in the same run.
TARGETS = (
    ("4 B time / gloo", (4, 4), "time", "<=", 0.5),
    ("64K-1M busbw / gloo", (64 << 10, 1 << 20), "busbw", ">=", 2.0),
    ("16M-64M busbw / gloo", (16 << 20, 64 << 20), "busbw", ">=", 1.3),
    ("16M-64M busbw / limit", (16 << 20, 64 << 20), "limit", ">=", 0.85),
)


def targets_table(rows: list[dict], backends: list[str]) -> str:
    """Worst ratio over each size band for every library backend; '-' where not measured."""
    at = {(r["backend"], r["size"]): r for r in rows}
    names = [b for b in backends if b not in REFERENCES]
    if not names or not any(b == "gloo" for b, _ in at):
        return ""
    lines = [
        "#\n# speed targets (worst ratio in the band; OK/MISS)",
        f"# {'target':>24} {'want':>7} |" + "".join(f" {b:>12} |" for b in names),
    ]
    for label, (lo, hi), kind, cmp, want in TARGETS:
        line = f"  {label:>24} {cmp + str(want):>7} |"
        for b in names:
            ratios = []
            for (name, size), r in at.items():
                if name != b or not lo <= size <= hi:
                    continue
                ref = at.get(("limit" if kind == "limit" else "gloo", size))
                if ref is None:
                    continue
                ratios.append(
                    r["time_us"] / ref["time_us"]
                    if kind == "time"
                    else r["busbw_gbs"] / ref["busbw_gbs"]
                )
            if not ratios:
                line += f" {'-':>12} |"
                continue
            worst = max(ratios) if cmp == "<=" else min(ratios)
            ok = worst <= want if cmp == "<=" else worst >= want
            line += f" {worst:>7.2f} {'OK' if ok else 'MISS':>4} |"
        lines.append(line)
    return "\n".join(lines)


def security_table(rows: list[dict], backends: list[str]) -> str:
    """Per size: each library backend's time with authentication (CURVE, the default) over its
    time without (NAME-insecure, --insecure), in the same run."""
    at = {(r["backend"], r["size"]): r for r in rows}
    pairs = [b for b in backends if f"{b}-insecure" in backends]
    if not pairs:
        return ""
    lines = [
        "#\n# cost of authentication: time with CURVE / time with COLLECTIVES_INSECURE=1 "
        "(1.00 = free)",
        f"# {'size (B)':>10} |" + "".join(f" {b:>12} |" for b in pairs),
    ]
    for s in sorted({r["size"] for r in rows}):
        line = f"  {s:>10} |"
        for b in pairs:
            sec, ins = at.get((b, s)), at.get((f"{b}-insecure", s))
            line += (
                f" {sec['time_us'] / ins['time_us']:>12.3f} |" if sec and ins else f" {'-':>12} |"
            )
        lines.append(line)
    return "\n".join(lines)


def render(result: dict) -> str:
    meta, rows = result["meta"], result["results"]
    order = [b for b in meta["backends"] if any(r["backend"] == b for r in rows)]
    order += [b for b in LIMITS if any(r["backend"] == b for r in rows)]
    parts = [header(meta)]
    for name, why in result["skipped"].items():
        parts.append(f"# {name} skipped: {why}")
    for b in order:
        parts.append(backend_table(b, [r for r in rows if r["backend"] == b]))
    wrong = sum(r["wrong"] or 0 for r in rows)
    if len(order) > 1:
        parts.append(comparison_table(rows, order))
    text = security_table(rows, order)
    if text:
        parts.append(text)
    if (meta["collective"], meta["nproc"], meta["dtype"], meta["op"]) == (
        "all_reduce",
        2,
        "float32",
        "sum",
    ):
        text = targets_table(rows, order)
        if text:
            parts.append(text)
    parts.append(f"#\n# out of bounds values: {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    return "\n".join(parts)
