"""What each collective takes and gives: one picture per collective, ranks as rows, each rank's
buffer before and after (the style of NCCL's documentation), drawn from a real run
(`python -m collectives.explain io`).

Every element names where it came from. Rank r's input element j is written `j` as a letter
and r as a digit: `b2` is element b of rank 2. Nothing is made up for the picture: each
collective is run on `cl.simulate` threads with inputs that encode (element, set of ranks) --
value = j * 2**n + sum of 2**r over the ranks summed in -- and the picture decodes what each
rank's buffer holds after the call: `b2` moved as it was, `Σb` the sum of element b over every
rank, `b0+b1` a partial sum, `·` nothing (a buffer the collective does not write).

The public collectives are the eleven of collectives.__all__: all_reduce, reduce, broadcast,
all_gather, reduce_scatter, all_to_all, gather, scatter, barrier, send and recv (one picture
for the pair: a send is half of a message).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..simulate import simulate

COLLECTIVES = (
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "gather",
    "scatter",
    "barrier",
    "send_recv",
)
CALLS = {
    "all_reduce": "pg.all_reduce(buf, op=SUM)",
    "reduce": "pg.reduce(buf, dst=ROOT, op=SUM)",
    "broadcast": "pg.broadcast(buf, src=ROOT)",
    "all_gather": "pg.all_gather(out, buf)",
    "reduce_scatter": "pg.reduce_scatter(out, buf, op=SUM)",
    "all_to_all": "pg.all_to_all(out, buf)",
    "gather": "pg.gather(out, buf, dst=ROOT)",
    "scatter": "pg.scatter(out, buf, src=ROOT)",
    "barrier": "pg.barrier()",
    "send_recv": "pg.send(buf, dst=1) on rank 0, pg.recv(buf, src=0) on rank 1",
}
SAYS = {
    "all_reduce": "every rank ends with the sum of every rank's buffer",
    "reduce": "the root ends with the sum; the others' buffers are left as they were",
    "broadcast": "every rank ends with the root's buffer",
    "all_gather": "every rank ends with every rank's buffer, in rank order",
    "reduce_scatter": "rank r ends with element r of the sum",
    "all_to_all": "rank r's element d goes to rank d, as its element r (a transpose)",
    "gather": "the root ends with every rank's buffer, in rank order; the others get nothing",
    "scatter": "rank r ends with element r of the root's buffer",
    "barrier": "no data: nobody leaves before everyone has arrived",
    "send_recv": "rank 1's buffer ends as rank 0's; the other ranks take no part",
}


@dataclass
class InOut:
    collective: str
    n: int
    root: int
    before: list  # per rank: list of labels (None: this rank passes no buffer)
    after: list  # per rank: list of labels (None: this rank gets no buffer)


def _value(j: int, r: int, n: int) -> int:
    return (j << n) + (1 << r)


def _label(v: int, n: int) -> str:
    """Decode value -> 'b2', 'Σb', 'b0+b1' or '·'."""
    v = int(v)
    if v == 0:
        return "·"
    mask = v & ((1 << n) - 1)
    k = bin(mask).count("1")
    q = v >> n
    if k == 0 or q % k:
        return "?"
    letter = string.ascii_lowercase[q // k]
    ranks = [r for r in range(n) if mask >> r & 1]
    if k == n and n > 1:
        return "Σ" + letter
    return "+".join(f"{letter}{r}" for r in ranks)


def run_io(collective: str, n: int = 4, root: int = 0) -> InOut:
    """Run `collective` on n threads and decode each rank's buffers before and after."""
    if collective not in COLLECTIVES:
        raise ValueError(
            f"explain io: unknown collective {collective!r}; one of {', '.join(COLLECTIVES)}"
        )
    if not 2 <= n <= 8:
        raise ValueError(f"explain io: world size must be 2..8 (one letter per element), got {n}")
    if not 0 <= root < n:
        raise ValueError(f"explain io: root {root} is not a rank of a world of size {n}")

    def vec(r, elems):
        return np.array([_value(j, r, n) for j in elems], np.int64)

    def fn(pg: Any) -> tuple:
        r = pg.rank
        buf: Any
        out: Any
        if collective in ("all_reduce", "reduce"):
            buf = vec(r, range(n))
            before = buf.copy()
            (pg.all_reduce(buf) if collective == "all_reduce" else pg.reduce(buf, dst=root))
            return before, buf
        if collective == "broadcast":
            buf = vec(r, range(n)) if r == root else np.zeros(n, np.int64)
            before = buf.copy()
            pg.broadcast(buf, src=root)
            return before, buf
        if collective in ("all_gather", "gather"):
            buf = vec(r, [0])
            out = np.zeros((n, 1), np.int64) if collective == "all_gather" or r == root else None
            if collective == "all_gather":
                pg.all_gather(out, buf)
            else:
                pg.gather(out, buf, dst=root)
            return buf.copy(), None if out is None else out.reshape(-1)
        if collective == "reduce_scatter":
            buf, out = vec(r, range(n)), np.zeros(1, np.int64)
            pg.reduce_scatter(out, buf)
            return buf, out
        if collective == "all_to_all":
            buf, out = vec(r, range(n)).reshape(n, 1), np.zeros((n, 1), np.int64)
            pg.all_to_all(out, buf)
            return buf.reshape(-1), out.reshape(-1)
        if collective == "scatter":
            buf = vec(r, range(n)).reshape(n, 1) if r == root else None
            out = np.zeros(1, np.int64)
            pg.scatter(out, buf, src=root)
            return None if buf is None else buf.reshape(-1), out
        if collective == "barrier":
            pg.barrier()
            return "barrier", "barrier"
        # send_recv: rank 0 sends to rank 1; the others take no part
        if r == 0:
            buf = vec(0, range(n))
            pg.send(buf, 1)
            return buf.copy(), buf
        if r == 1:
            buf = np.zeros(n, np.int64)
            before = buf.copy()
            pg.recv(buf, 0)
            return before, buf
        return None, None

    results = simulate(n, fn, timeout=30.0)

    def labels(b):
        if b is None:
            return None
        if isinstance(b, str):
            return []
        return [_label(v, n) for v in b]

    return InOut(
        collective, n, root, [labels(b) for b, _ in results], [labels(a) for _, a in results]
    )


def text(x: InOut) -> str:
    call = CALLS[x.collective].replace("ROOT", str(x.root))
    out = [f"{x.collective}: {call}, {x.n} ranks -- {SAYS[x.collective]}"]
    w = max([4] + [len(c) for side in (x.before, x.after) for row in side if row for c in row])

    def cells(row):
        if row is None:
            return "(none)"
        if not row:
            return "(no data)"
        return " ".join(c.ljust(w) for c in row).rstrip()

    width = max(len(cells(b)) for b in x.before)
    out.append(f"          {'before'.ljust(width)}   after")
    for r in range(x.n):
        out.append(f"  rank {r}  {cells(x.before[r]).ljust(width)}   {cells(x.after[r])}".rstrip())
    return "\n".join(out) + "\n"


def draw(x: InOut, path: str) -> str:
    """Ranks as rows; each rank's buffer before (left) and after (right), one cell per element,
    coloured by the element (a, b, c, ...); a sum shown darker, with a thick edge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    n = x.n
    cmap = plt.get_cmap("tab10")
    cw, ch, gap = 0.62, 0.5, 1.6
    width = max([1] + [len(row) for side in (x.before, x.after) for row in side if row])
    right0 = width * cw + gap
    fig, ax = plt.subplots(figsize=(1.6 + (2 * width * cw + gap) * 0.95, 1.2 + 0.55 * n))

    def row_cells(x0, y, row):
        if row is None:
            ax.text(
                x0 + width * cw / 2,
                y,
                "(no buffer)",
                ha="center",
                va="center",
                fontsize=8,
                color="grey",
            )
            return
        if not row:
            ax.add_patch(
                Rectangle(
                    (x0, y - ch / 2),
                    width * cw,
                    ch,
                    facecolor="#dddddd",
                    edgecolor="black",
                    linewidth=0.5,
                )
            )
            ax.text(
                x0 + width * cw / 2,
                y,
                "arrived" if x0 == 0 else "left",
                ha="center",
                va="center",
                fontsize=8,
            )
            return
        for i, lab in enumerate(row):
            letter = lab.lstrip("Σ")[:1]
            known = letter in string.ascii_lowercase
            summed = lab.startswith("Σ") or "+" in lab
            face = cmap(string.ascii_lowercase.index(letter) % 10) if known else "white"
            ax.add_patch(
                Rectangle(
                    (x0 + i * cw, y - ch / 2),
                    cw,
                    ch,
                    facecolor=face,
                    alpha=0.85 if summed else 0.4 if known else 0.0,
                    linewidth=0,
                )
            )
            ax.add_patch(
                Rectangle(
                    (x0 + i * cw, y - ch / 2),
                    cw,
                    ch,
                    fill=False,
                    edgecolor="black",
                    linewidth=1.8 if summed else 0.5,
                )
            )
            ax.text(
                x0 + i * cw + cw / 2,
                y,
                lab,
                ha="center",
                va="center",
                fontsize=8 if len(lab) <= 4 else 6,
            )

    for r in range(n):
        y = -r * 0.8
        ax.text(-0.15, y, f"rank {r}", ha="right", va="center", fontsize=9)
        row_cells(0.0, y, x.before[r])
        row_cells(right0, y, x.after[r])
    mid_y = -(n - 1) * 0.8 / 2
    ax.add_patch(
        FancyArrowPatch(
            (width * cw + 0.25, mid_y),
            (right0 - 0.25, mid_y),
            arrowstyle="-|>",
            mutation_scale=18,
            color="#444444",
            lw=2,
        )
    )
    ax.text(width * cw / 2, 0.55, "before", ha="center", fontsize=9, weight="bold")
    ax.text(right0 + width * cw / 2, 0.55, "after", ha="center", fontsize=9, weight="bold")
    call = CALLS[x.collective].replace("ROOT", str(x.root))
    ax.set_title(f"{x.collective}: {call}\n{SAYS[x.collective]}", fontsize=9)
    ax.set_xlim(-1.1, right0 + width * cw + 0.1)
    ax.set_ylim(-(n - 1) * 0.8 - 0.45, 0.85)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.text(
        0.01,
        0.01,
        "b2: element b of rank 2;  Σb: element b summed over every rank;  ·: not written",
        fontsize=7,
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
