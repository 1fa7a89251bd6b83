"""Explain the exchanges -- all_to_all, gather, scatter -- by running them.

    python -m collectives.explain all_to_all --world-size 4 --count 2
    python -m collectives.explain gather --world-size 4 --root 2
    python -m collectives.explain scatter --world-size 3 --step

Nothing is added in these: blocks only move. So every element names its block: the block rank
s sends rank d holds s*64 + d + 1 everywhere and is written "s>d" ('-' is nothing yet). At the
end rank d must hold "0>d", "1>d", ... in that order (for gather: the root, for scatter: each
rank its own), which the run checks, with the theory-vs-run counts of invariants.py.
Each rank's own block is copied locally before the first message; the text shows it in place
from the start. As in run.py, the confirm messages (empty) are bookkeeping and left out, and
the text and the picture go one round of the single-port model at a time (a gather's root
takes its blocks one a round).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import invariants as inv
from ..simulate import simulate
from ..trace import Tracer, match_messages

EXCHANGES = ("all_to_all", "gather", "scatter")
DESCRIPTION = {
    "all_to_all": "pairwise-exchange all_to_all (step s: send to rank r+s, receive from r-s)",
    "gather": "linear gather (every rank sends its block to the root)",
    "scatter": "linear scatter (the root sends every rank its block)",
}
MAX_RANKS = 63


def value(src: int, dst: int) -> int:
    return src * 64 + dst + 1


def block_label(v: Any) -> str:
    v = int(v)
    if v <= 0:
        return "-"
    return f"{(v - 1) // 64}>{(v - 1) % 64}"


def inputs(what: str, n: int, count: int, root: int) -> list:
    """Each rank's input (None where the op takes none: scatter's non-roots)."""
    if what == "all_to_all":
        return [
            np.array([[value(r, d)] * count for d in range(n)], np.int64).reshape(n, count)
            for r in range(n)
        ]
    if what == "gather":
        return [np.full(count, value(r, root), np.int64) for r in range(n)]
    return [
        np.array([[value(root, d)] * count for d in range(n)], np.int64).reshape(n, count)
        if r == root
        else None
        for r in range(n)
    ]


def outputs(what: str, n: int, count: int, root: int, own: bool = True) -> list:
    """Each rank's output buffer before any message (None where the op has none: gather's
    non-roots), with its own block already copied in when `own`."""
    outs: list[np.ndarray | None] = []
    for r in range(n):
        if what == "gather" and r != root:
            outs.append(None)
            continue
        o = np.zeros((n, count) if what != "scatter" else (1, count), np.int64)
        if own:
            if what == "all_to_all":
                o[r] = value(r, r)
            elif what == "gather":
                o[root] = value(root, root)
            elif r == root:
                o[0] = value(root, root)
        outs.append(o.reshape(-1))
    return outs


def wanted(what: str, n: int, count: int, root: int) -> list:
    """What each rank's output must hold at the end."""
    if what == "all_to_all":
        return [np.repeat([value(s, r) for s in range(n)], count) for r in range(n)]
    if what == "gather":
        return [
            np.repeat([value(s, root) for s in range(n)], count) if r == root else None
            for r in range(n)
        ]
    return [np.full(count, value(root, r), np.int64) for r in range(n)]


def make_fn(what: str, ins: list, root: int, count: int) -> Callable[[Any], Any]:
    n = len(ins)

    def fn(pg):
        r = pg.rank
        x = None if ins[r] is None else ins[r].copy()
        if what == "all_to_all":
            out = np.zeros((n, count), np.int64)  # type: np.ndarray | None
            pg.all_to_all(out, x)
        elif what == "gather":
            out = np.zeros((n, count), np.int64) if r == root else None
            pg.gather(out, x, dst=root)
        elif what == "scatter":
            out = np.zeros(count, np.int64)
            pg.scatter(out, x, src=root)
        else:
            raise ValueError(f"explain: unknown exchange {what!r}")
        return None if out is None else out.reshape(-1)

    return fn


@dataclass
class ExplainedExchange:
    algorithm: str  # the op: all_to_all, gather, scatter
    n: int
    count: int  # elements per block
    root: int
    events: list
    confirms: int
    rounds: int
    states: list  # states[k][r]: rank r's output after round k (None: no output)
    messages: list  # messages[k]: (send event, recv event) of round k
    finals: list
    report: inv.Report
    tracer: Tracer


def explain_exchange(what: str, n: int, count: int, root: int = 0) -> ExplainedExchange:
    if what not in EXCHANGES:
        raise ValueError(f"explain: unknown exchange {what!r}; one of {', '.join(EXCHANGES)}")
    if not 1 <= n <= MAX_RANKS:
        raise ValueError(f"explain: world size must be 1..{MAX_RANKS}, got {n}")
    if count < 1:
        raise ValueError(f"explain: count must be >= 1, got {count}")
    if what == "all_to_all":
        root = 0  # no root
    elif not 0 <= root < n:
        raise ValueError(f"explain: root {root} is not a rank of a world of size {n}")
    tracer = Tracer(record_data=True, max_data=1 << 16)
    finals = simulate(
        n,
        make_fn(what, inputs(what, n, count, root), root, count),
        wrappers=[tracer.wrap],
        timeout=30.0,
    )
    every = tracer.sorted_events()
    events = inv.data_events(every)
    report = inv.check(events, what, world_size=n, count=count, itemsize=8, root=root)
    # Rounds of the single-port model, as run.py draws the reductions (invariants.port_rounds;
    # after check, which gives the events their depth): a gather's root takes its n-1 blocks
    # one a round, though they are all one message deep.
    rounds = inv.port_rounds(events)
    for e in events:
        e["round"] = e["slot"]
    want = wanted(what, n, count, root)
    wrong = [
        r
        for r in range(n)
        if (want[r] is None) != (finals[r] is None)
        or (want[r] is not None and not np.array_equal(want[r], finals[r]))
    ]
    report.rows.append(
        (
            "every block where it belongs",
            "rank d: 0>d, 1>d, ..."
            if what == "all_to_all"
            else f"root {root}: 0>{root}, 1>{root}, ..."
            if what == "gather"
            else f"rank d: {root}>d",
            "all ranks",
            "all ranks" if not wrong else "WRONG on ranks " + ",".join(map(str, wrong)),
            not wrong,
        )
    )

    state = outputs(what, n, count, root)
    states = [[None if s is None else s.copy() for s in state]]
    by_rank = [[e for e in events if e["rank"] == r] for r in range(n)]
    cursor = [0] * n
    for k in range(1, rounds + 1):
        for r in range(n):
            while cursor[r] < len(by_rank[r]) and by_rank[r][cursor[r]]["round"] <= k:
                e = by_rank[r][cursor[r]]
                if e["kind"] != "send" and e["count"] and state[r] is not None:
                    state[r][e["offset"] : e["offset"] + e["count"]] = e["data"]
                cursor[r] += 1
        states.append([None if s is None else s.copy() for s in state])
    messages = [[] for _ in range(rounds + 1)]  # type: list[list[tuple[dict, dict]]]
    for _, pair in sorted(
        match_messages(events).items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3])
    ):
        # drawn in the round its receiver's port takes it
        messages[pair["recv"].get("arrival", pair["send"]["round"])].append(
            (pair["send"], pair["recv"])
        )
    return ExplainedExchange(
        what,
        n,
        count,
        root,
        events,
        len(every) - len(events),
        rounds,
        states,
        messages,
        finals,
        report,
        tracer,
    )


# --- text -------------------------------------------------------------------------------------
def block_cells(buf: Any, count: int) -> list:
    """The labels of the blocks in `buf` (`count` elements each); none for no buffer."""
    if buf is None:
        return []
    return [block_label(buf[i * count]) for i in range(len(buf) // count)]


def text(x: ExplainedExchange) -> str:
    n, count = x.n, x.count
    ins = inputs(x.algorithm, n, count, x.root)
    cols_in = [f"to {d}" for d in range(n)] if x.algorithm != "gather" else ["block"]
    cols_out = [f"from {s}" for s in range(n)] if x.algorithm != "scatter" else ["block"]
    width = max(6, *(len(c) for c in cols_in + cols_out), len(block_label(value(n - 1, n - 1))))
    rootinfo = f", root {x.root}" if x.algorithm != "all_to_all" else ""
    out = [
        f"{DESCRIPTION[x.algorithm]}: world size {n}, {count} int64 element"
        f"{'s' if count != 1 else ''} per block{rootinfo}",
        "Every block is named source>destination: '1>2' is the block rank 1 sends rank 2, "
        "'-' nothing yet.",
        "Each rank's own block is copied locally, without a message.",
    ]
    if x.confirms:
        out.append(f"({x.confirms // 2} empty confirm messages are not shown)")

    def rows(buffers, cols, what):
        lines = [(" " * 10 + "  ".join(c.ljust(width) for c in cols)).rstrip()]
        for r, buf in enumerate(buffers):
            cells = block_cells(None if buf is None else np.asarray(buf).reshape(-1), count)
            lines.append(
                f"  rank {r}".ljust(10)
                + ("  ".join(c.ljust(width) for c in cells) if cells else f"({what})").rstrip()
            )
        return lines

    out += ["", "input"] + rows(ins, cols_in, "no input")
    out += ["", "output at the start"] + rows(x.states[0], cols_out, "no output")
    for k in range(1, x.rounds + 1):
        msgs = x.messages[k]
        steps = sorted({s["step"] for s, _ in msgs})
        title = (
            f"{msgs[0][0]['phase']}"
            + (f" step {steps[0]}" if x.algorithm == "all_to_all" and len(steps) == 1 else "")
            if msgs
            else ""
        )
        out += ["", f"round {k}: {title} ({len(msgs)} message{'s' if len(msgs) != 1 else ''})"]
        for s, rcv in msgs:
            label = block_label(rcv["data"][0]) if rcv.get("data") else "(empty)"
            out.append(f"  rank {s['src']} -> rank {s['dst']}  {label}  {s['nbytes']} B")
        out += rows(x.states[k], cols_out, "no output")
    out += ["", "result (each rank's output when the call returned)"]
    out += rows(x.finals, cols_out, "no output")
    out += ["", str(x.report)]
    return "\n".join(out) + "\n"


# --- picture ----------------------------------------------------------------------------------
def draw(x: ExplainedExchange, path: str, *, title: str | None = None) -> str:
    """Ranks as rows, rounds as columns; each rank's output as a row of cells, one per block,
    coloured by the rank that sent it; arrows are the messages of each round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n, count = x.n, x.count
    blocks = n if x.algorithm != "scatter" else 1
    cmap = plt.get_cmap("tab10")
    cols = x.rounds + 1
    W, H = 1.0, 1.0
    box_w, box_h = 0.62 * W, 0.42 * H
    cw = box_w / blocks
    fig, ax = plt.subplots(figsize=(1.4 + 1.45 * cols, 1.1 + 0.62 * n))

    def cell_x(col, i):
        return col * W - box_w / 2 + i * cw

    for col in range(cols):
        for r in range(n):
            y = -r * H
            buf = x.states[col][r]
            if buf is None:
                ax.text(col * W, y, "no output", ha="center", va="center", fontsize=6, color="grey")
                continue
            for i in range(blocks):
                v = int(buf[i * count])
                face = cmap(((v - 1) // 64) % 10) if v else "white"
                ax.add_patch(
                    Rectangle(
                        (cell_x(col, i), y - box_h / 2),
                        cw,
                        box_h,
                        facecolor=face,
                        alpha=0.8 if v else 0.0,
                        linewidth=0,
                    )
                )
                ax.add_patch(
                    Rectangle(
                        (cell_x(col, i), y - box_h / 2),
                        cw,
                        box_h,
                        fill=False,
                        edgecolor="black",
                        linewidth=0.5,
                    )
                )
                if blocks <= 8 and v:
                    ax.text(
                        cell_x(col, i) + cw / 2,
                        y,
                        block_label(v),
                        ha="center",
                        va="center",
                        fontsize=5.5,
                    )
    for k in range(1, cols):
        for s, _ in x.messages[k]:
            slot = s["src"] if blocks > 1 else 0  # the sender's row of the output
            x0 = cell_x(k - 1, 0) + box_w / 2
            x1 = cell_x(k, slot) + cw / 2
            y0, y1 = -s["src"] * H, -s["dst"] * H
            y0 += -box_h / 2 if y1 < y0 else box_h / 2 if y1 > y0 else 0
            y1 += box_h / 2 if y1 < y0 else -box_h / 2 if y1 > y0 else 0
            ax.annotate(
                "",
                xy=(x1, y1),
                xytext=(x0, y0),
                arrowprops=dict(
                    arrowstyle="-|>",
                    color=cmap(s["src"] % 10),
                    lw=1.2,
                    linestyle="--",
                    shrinkA=1,
                    shrinkB=1,
                    connectionstyle="arc3,rad=0.08",
                ),
            )
        ax.text(k * W, 0.62 * H, f"round {k}", ha="center", va="bottom", fontsize=7)
    ax.text(0, 0.62 * H, "start", ha="center", va="bottom", fontsize=7)
    for r in range(n):
        ax.text(-box_w / 2 - 0.06 * W, -r * H, f"rank {r}", ha="right", va="center", fontsize=8)
    ax.set_xlim(-box_w / 2 - 0.5 * W, (cols - 1) * W + box_w / 2 + 0.05 * W)
    ax.set_ylim(-(n - 1) * H - box_h / 2 - 0.1 * H, 1.0 * H)
    ax.axis("off")
    ax.set_title(title or f"{DESCRIPTION[x.algorithm]}, {n} ranks", fontsize=9)
    fig.text(
        0.01,
        0.01,
        "each rank's output, one cell per block, coloured by the rank that sent "
        "it (s>d: from s to d); dashed arrow = copied in",
        fontsize=6.5,
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
