"""The text of an explanation: each rank's buffer after each round, the messages of each
round, the theory-vs-run checks; and the crossover table."""

from __future__ import annotations

from typing import Any, Sequence

from ..emulate import crossover_bytes
from .run import DESCRIPTION, ROOTED, Explained


def label(v: int, n: int) -> str:
    """A value as the set of ranks it sums: '-' none, '0+2' a partial sum, 'ALL' the result."""
    v = int(v)
    if v == 0:
        return "-"
    if v == (1 << n) - 1:
        return "ALL"
    return "+".join(str(r) for r in range(n) if v >> r & 1)


def _cells(buf: Any, bounds: list, n: int) -> list:
    cells = []
    for a, b in bounds:
        labels = [label(v, n) for v in buf[a:b]]
        cells.append(labels[0] if len(set(labels)) == 1 else "|".join(labels) if labels else "")
    return cells


def _chunk_name(a: int, b: int, bounds: list) -> str:
    ids = [i for i, (s, e) in enumerate(bounds) if s < b and a < e]
    if not ids:
        return "(empty)"
    name = f"c{ids[0]}" if len(ids) == 1 else f"c{ids[0]}-c{ids[-1]}"
    return f"{name} [{a}:{b}]"


def _round_title(msgs: list, steps_vary: dict) -> str:
    if not msgs:
        # in the single-port model a round can pass with every port waiting: its sends are
        # taken in a later round, where they are drawn
        return "no message taken (sent now, taken later)"
    seen = []
    for s, _ in msgs:
        t = s["phase"] + (f" step {s['step']}" if steps_vary.get(s["phase"]) else "")
        if t not in seen:
            seen.append(t)
    return ", ".join(seen)


def _steps_vary(events: list[dict]) -> dict:
    steps: dict = {}
    for e in events:
        steps.setdefault(e["phase"], set()).add(e["step"])
    return {p: len(s) > 1 for p, s in steps.items()}


def hosts_line(hosts: Sequence[Any]) -> str:
    """'host 0: ranks 0, 1 (leaders 0, 1); host 1: ranks 2, 3 (leaders 2, 3)': a host's first
    k ranks lead, k the fewest ranks any host has (algorithms/hierarchical.py)."""
    parts = []
    k = min(list(hosts).count(h) for h in set(hosts))
    for h in dict.fromkeys(hosts):
        ranks = [r for r, v in enumerate(hosts) if v == h]
        lead = ", ".join(map(str, ranks[:k]))
        parts.append(
            f"host {h}: rank{'s' if len(ranks) > 1 else ''} "
            f"{', '.join(map(str, ranks))} (leader{'s' if k > 1 else ''} {lead})"
        )
    return "; ".join(parts)


def text(x: Explained) -> str:
    n, count = x.n, x.count
    bounds = x.bounds
    names = [f"c{i} [{a}:{b}]" for i, (a, b) in enumerate(bounds)]
    all_cells = [_cells(s[r], bounds, n) for s in x.states for r in range(n)]
    all_cells += [_cells(f, bounds, n) for f in x.finals]
    width = max([len(c) for row in all_cells for c in row] + [len(nm) for nm in names])
    rootinfo = f", root {x.root}" if x.algorithm in ROOTED else ""
    if x.algorithm == "broadcast":
        legend = [
            "The root starts with 2**n - 1 in every element, the others with 0:",
            "  'ALL' the root's data, '-' nothing yet.",
        ]
    else:
        legend = [
            "Rank r starts with 2**r in every element, so a value names the ranks summed into it:",
            f"  '1' rank 1's own input, '0+2' a partial sum of ranks 0 and 2, 'ALL' the "
            f"final sum of all {n} ranks, '-' nothing yet.",
        ]
    out = [
        f"{DESCRIPTION[x.algorithm]}: world size {n}, {count} int64 elements, SUM{rootinfo}",
        *legend,
    ]
    if x.hosts is not None:
        out.append(
            "Hosts: "
            + hosts_line(x.hosts)
            + ("; only leaders send across hosts" if x.algorithm == "hierarchical" else "")
        )
    per = (
        "host and leader: leader j's ring gets part j, one chunk per host"
        if x.algorithm == "hierarchical" and x.hosts is not None
        else "rank"
    )
    out.append(f"Chunks (one per {per}): " + ", ".join(names))
    if x.confirms:
        out.append(f"({x.confirms // 2} empty confirm messages are not shown)")

    def rows(buffers, tag="rank"):
        labels = [
            f"  {tag} {r}" + (f" (host {x.hosts[r]})" if x.hosts is not None else "")
            for r in range(len(buffers))
        ]
        lw = max([10] + [len(s) + 2 for s in labels])
        head = " " * lw + "  ".join(nm.ljust(width) for nm in names)
        lines = [head.rstrip()]
        for lab, buf in zip(labels, buffers):
            lines.append(
                lab.ljust(lw) + "  ".join(c.ljust(width) for c in _cells(buf, bounds, n)).rstrip()
            )
        return lines

    out += ["", "start"] + rows(x.states[0])
    vary = _steps_vary(x.events)
    for k in range(1, x.rounds + 1):
        msgs = x.messages[k]
        out += [
            "",
            f"round {k}: {_round_title(msgs, vary)} ({len(msgs)} message"
            f"{'s' if len(msgs) != 1 else ''})",
        ]
        for s, rcv in msgs:
            what = "added in" if rcv["kind"] == "reduce" else "copied in"
            late = rcv.get("applied", k)
            across = x.hosts is not None and x.hosts[s["src"]] != x.hosts[s["dst"]]
            out.append(
                f"  rank {s['src']} -> rank {s['dst']}  "
                f"{_chunk_name(s['offset'], s['offset'] + s['count'], bounds)}  "
                f"{s['nbytes']} B  {what}"
                + ("  [across hosts]" if across else "")
                + (
                    f" (in round {late}: rank {s['dst']} takes its messages in a fixed order)"
                    if late > k
                    else ""
                )
            )
        out += rows(x.states[k])
    out += ["", "result (each rank's buffer when the call returned)"] + rows(x.finals)
    out += ["", str(x.report)]
    return "\n".join(out) + "\n"


def _size(b: float) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b:g} B"


def crossover_text(rows: list, alpha: float, beta: float, n: int) -> str:
    algs = list(rows[0][1]) if rows else []
    star = crossover_bytes(n, alpha, beta)
    out = [
        f"all_reduce on {n} ranks, alpha = {alpha * 1e6:g} us, beta = {beta * 1e9:g} ns/B "
        f"({1 / beta / 1e9:g} GB/s); times in us"
        if beta
        else f"all_reduce on {n} ranks, alpha = {alpha * 1e6:g} us, beta = 0"
    ]
    head = (
        ["size"]
        + [f"{a} {k}" for a in algs for k in ("model", "emulated")]
        + ["faster (model)", "faster (emulated)"]
    )
    table = [head]
    for nbytes, row in rows:
        cells = [_size(nbytes)]
        for a in algs:
            mod, emu = row[a]
            cells += ["-" if mod is None else f"{mod * 1e6:.1f}", f"{emu * 1e6:.1f}"]
        mods = {a: row[a][0] for a in algs if row[a][0] is not None}
        cells.append(min(mods, key=mods.get) if mods else "-")  # type: ignore[arg-type]
        cells.append(min(algs, key=lambda a: row[a][1]))
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    out += ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in table]
    if star is not None:
        out.append(
            f"alpha-beta model: ring and tree cost the same at N* = alpha*(n-1-ceil(log2 n)) / "
            f"(beta*(ceil(log2 n) - (n-1)/n)) = {star:,.0f} B; tree is faster below, ring above"
        )
    if "ring" in algs and "tree" in algs:
        flips = [
            (pb, nb)
            for (nb, row), (pb, prev) in zip(rows[1:], rows[:-1])
            if (row["ring"][1] < row["tree"][1]) != (prev["ring"][1] < prev["tree"][1])
        ]
        if flips:
            out.append(
                "emulated runs: the faster of ring and tree changes between "
                + ", ".join(f"{_size(a)} and {_size(b)}" for a, b in flips)
            )
    return "\n".join(out) + "\n"
