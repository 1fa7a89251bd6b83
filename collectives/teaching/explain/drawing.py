"""The pictures of an explanation (matplotlib, imported when drawing): ranks as rows, rounds
as columns; and the crossover plot."""

from __future__ import annotations

import numpy as np

from ..emulate import crossover_bytes
from .run import DESCRIPTION, Explained
from .text import _round_title, _steps_vary


def _uniform_chunks(x: Explained) -> bool:
    """Whether every chunk holds one value throughout (then a cell per chunk says it all)."""
    return all(
        len(set(int(v) for v in buf[a:b])) <= 1
        for state in x.states
        for buf in state
        for a, b in x.bounds
    )


# the legend's line for a rank that sums into a scratch copy (run.Explained.scratch)
SCRATCH = "dashed edge = a scratch copy: the rank's own buffer is returned unchanged"

MAX_COLUMNS = 9  # past this many columns the rounds go on in a second band below


def bands(cols: int) -> list[tuple[int, int]]:
    """The columns each band shows, first and last inclusive: one band up to MAX_COLUMNS,
    else two, the second starting with a repeat of the first's last column (so every round's
    arrows lie within one band).

    >>> bands(15)
    [(0, 7), (7, 14)]
    """
    if cols <= MAX_COLUMNS:
        return [(0, cols - 1)]
    h = (cols + 1) // 2
    return [(0, h - 1), (h - 1, cols - 1)]


def draw(x: Explained, path: str, *, title: str | None = None) -> str:
    """Ranks as rows, rounds as columns; each buffer a row of cells (coloured by chunk where
    the algorithm has chunks), filled in proportion to how many ranks it holds the sum of;
    arrows are the messages of each round.

    Past 8 elements, one cell per chunk (each chunk holds one value in these runs); a message
    from the last rank to the first (the ring's wrap-around) is drawn as two short arrows, off
    the bottom and in at the top, so it does not cross every row. Past MAX_COLUMNS columns
    the rounds continue in a second band below, so that the picture reads at page width."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n, count = x.n, x.count
    bounds = x.bounds
    per_chunk = count > 8 and _uniform_chunks(x)
    # cells: (first element, elements) of each cell drawn
    cells = list(bounds) if per_chunk else [(i, i + 1) for i in range(count)]
    chunk_of = np.zeros(count, dtype=int)
    for i, (a, b) in enumerate(bounds):
        chunk_of[a:b] = i
    cmap = plt.get_cmap("tab10")
    cols = x.rounds + 1
    W, H = 1.0, 1.0
    box_w, box_h = 0.62 * W, 0.42 * H
    cw = box_w / len(cells)
    wrap = x.algorithm == "ring" and n > 3
    parts = bands(cols)
    width = max(e - s for s, e in parts) + 1
    band_h = n * H + (0.9 if wrap else 0.5) * H + 0.9 * H  # rows, the wrap's arrows, titles
    fig, ax = plt.subplots(figsize=(1.4 + 1.45 * width, 0.6 + (0.7 + 0.62 * n) * len(parts)))

    def band_of(col, arrow=False):
        """(band, local column) of a column; an arrow into `col` is in the band holding
        both col-1 and col."""
        for i, (s, e) in enumerate(parts):
            if (s < col <= e) if arrow else (s <= col <= e):
                return i, col - s
        return 0, col

    def y_of(band, r):
        return -band * band_h - r * H

    def x_of(local, elem):
        """x of element position `elem` (fractional) in local column `local`'s box."""
        for i, (a, b) in enumerate(cells):
            if elem < b or i == len(cells) - 1:
                return local * W - box_w / 2 + (i + (elem - a) / max(b - a, 1)) * cw
        return local * W

    full = (1 << n) - 1
    thick = 2.0 if cw > 0.06 else 1.2
    for bi, (s0, e0) in enumerate(parts):
        for col in range(s0, e0 + 1):
            local = col - s0
            for r in range(n):
                y = y_of(bi, r)
                buf = x.states[col][r]
                for i, (a, b) in enumerate(cells):
                    v = int(buf[a]) if b > a else 0
                    k = bin(v).count("1")
                    face = cmap(chunk_of[min(a, count - 1)] % 10) if x.chunked else cmap(0)
                    alpha = 0.0 if k == 0 else 0.18 + 0.82 * k / n
                    x0 = local * W - box_w / 2 + i * cw
                    ax.add_patch(
                        Rectangle(
                            (x0, y - box_h / 2),
                            cw,
                            box_h,
                            facecolor=face,
                            alpha=alpha,
                            linewidth=0,
                        )
                    )
                    ax.add_patch(
                        Rectangle(
                            (x0, y - box_h / 2),
                            cw,
                            box_h,
                            fill=False,
                            edgecolor="black",
                            linewidth=thick if v == full else 0.4,
                            linestyle="--" if r in x.scratch and 0 < col < cols - 1 else "-",
                        )
                    )
                    if len(cells) <= 12 and n > 1:
                        ax.text(
                            x0 + cw / 2,
                            y,
                            str(k),
                            ha="center",
                            va="center",
                            fontsize=6,
                            color="black",
                        )
        top = y_of(bi, 0) + 0.62 * H
        if bi == 0:
            ax.text(0, top, "start", ha="center", va="bottom", fontsize=7)
        else:
            ax.text(0, top, f"after round {s0}", ha="center", va="bottom", fontsize=7)
        for r in range(n):
            host = f"\nhost {x.hosts[r]}" if x.hosts is not None else ""
            ax.text(
                -box_w / 2 - 0.06 * W,
                y_of(bi, r),
                f"rank {r}{host}",
                ha="right",
                va="center",
                fontsize=8,
            )
    vary = _steps_vary(x.events)
    for k in range(1, cols):
        bi, local = band_of(k, arrow=True)
        for s, rcv in x.messages[k]:
            a, c = s["offset"], s["count"]
            mid = a + c / 2 if c else 0
            if not x.chunked:
                color = cmap(s["src"] % 10)  # whole buffers: tell the messages by sender
            else:
                color = cmap(chunk_of[min(a, count - 1)] % 10) if c else "grey"
            x0, x1 = x_of(local - 1, mid), x_of(local, mid)
            style = dict(
                arrowstyle="-|>",
                color=color,
                lw=1.4,
                linestyle="-" if rcv["kind"] == "reduce" else "--",
                shrinkA=1,
                shrinkB=1,
            )
            if wrap and s["src"] == n - 1 and s["dst"] == 0:
                # off the bottom row, and in at the top: the ring closes
                y0 = y_of(bi, n - 1) - box_h / 2
                ytop = y_of(bi, 0)
                xm = (x0 + x1) / 2
                ax.annotate("", xy=(xm, y0 - 0.32 * H), xytext=(x0, y0), arrowprops=style)
                ax.annotate(
                    "", xy=(x1, ytop + box_h / 2), xytext=(xm, ytop + 0.36 * H), arrowprops=style
                )
                ax.text(
                    xm,
                    y0 - 0.36 * H,
                    f"to {s['dst']}",
                    ha="center",
                    va="top",
                    fontsize=5.5,
                    color=color,
                )
                continue
            y0, y1 = y_of(bi, s["src"]), y_of(bi, s["dst"])
            y0 += -box_h / 2 if y1 < y0 else box_h / 2 if y1 > y0 else 0
            y1 += box_h / 2 if y1 < y0 else -box_h / 2 if y1 > y0 else 0
            ax.annotate(
                "",
                xy=(x1, y1),
                xytext=(x0, y0),
                arrowprops=dict(style, connectionstyle="arc3,rad=0.08"),
            )
        head = textwrap.fill(_round_title(x.messages[k], vary), 22)
        ax.text(
            local * W,
            y_of(bi, 0) + 0.62 * H,
            f"round {k}\n{head}",
            ha="center",
            va="bottom",
            fontsize=7,
        )
    if x.hosts is not None:
        # Each host a grey band behind its ranks' rows (a host's ranks need not be adjacent);
        # a dotted line between rows of different hosts.
        for bi in range(len(parts)):
            for r in range(n):
                shade = 0.93 if x.hosts[r] % 2 == 0 else 0.84
                ax.add_patch(
                    Rectangle(
                        (-box_w / 2 - 0.45 * W, y_of(bi, r) - H / 2),
                        (width - 1) * W + box_w + 0.5 * W,
                        H,
                        facecolor=(shade, shade, shade),
                        linewidth=0,
                        zorder=-1,
                    )
                )
                if r and x.hosts[r] != x.hosts[r - 1]:
                    yl = y_of(bi, r) + H / 2
                    ax.plot(
                        [-box_w / 2 - 0.45 * W, (width - 1) * W + box_w / 2 + 0.05 * W],
                        [yl, yl],
                        color="grey",
                        linestyle=":",
                        linewidth=0.8,
                    )
    ax.set_xlim(-box_w / 2 - 0.5 * W, (width - 1) * W + box_w / 2 + 0.05 * W)
    ax.set_ylim(y_of(len(parts) - 1, n - 1) - box_h / 2 - (0.5 if wrap else 0.1) * H, 1.0 * H)
    ax.axis("off")
    heading = title or f"{DESCRIPTION[x.algorithm]}, {n} ranks, {count} elements"
    ax.set_title(textwrap.fill(heading, 14 * width), fontsize=9, pad=28)
    ax.text(  # under the rows, however many lines it takes (bbox_inches="tight" keeps it)
        0.0,
        -0.02,
        textwrap.fill(
            ("cell colour = chunk; " if x.chunked else "arrow colour = sender; ")
            + "fill = share of ranks summed in (number shown); "
            "thick edge = final; solid arrow = received and added, dashed = copied"
            + ("; one cell per chunk" if per_chunk else "")
            + (f"; {SCRATCH}" if x.scratch else "")
            + ("; grey bands = hosts" if x.hosts is not None else ""),
            20 * width,
        ),
        fontsize=6.5,
        transform=ax.transAxes,
        ha="left",
        va="top",
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def crossover_plot(rows: list, alpha: float, beta: float, n: int, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    sizes = [nb for nb, _ in rows]
    for i, alg in enumerate(rows[0][1]):
        color = plt.get_cmap("tab10")(i)
        mod = [row[alg][0] for _, row in rows]
        if all(v is not None for v in mod):
            ax.plot(sizes, [v * 1e6 for v in mod], "-", color=color, label=f"{alg}: model")
        ax.plot(
            sizes,
            [row[alg][1] * 1e6 for _, row in rows],
            "o",
            color=color,
            mfc="none",
            label=f"{alg}: emulated run",
        )
    star = crossover_bytes(n, alpha, beta)
    if star is not None:
        ax.axvline(star, color="grey", linestyle=":", label=f"N* = {star:,.0f} B")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("buffer size (bytes)")
    ax.set_ylabel("all_reduce time (us)")
    ax.set_title(
        f"all_reduce, {n} ranks, alpha {alpha * 1e6:g} us, {1 / beta / 1e9:g} GB/s"
        if beta
        else f"all_reduce, {n} ranks"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
