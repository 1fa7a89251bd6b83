"""A view's model drawn as a row of panels, one per moment (PNG, matplotlib, imported when
drawing); html.py plays the same model as a page."""

from __future__ import annotations

MAX_LINES = 9  # of a panel's note and text


def draw_panels(model: dict, path: str, per_row: int = 3) -> str:
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frames = model["frames"]
    rows = (len(frames) + per_row - 1) // per_row
    fig, axes = plt.subplots(rows, per_row, figsize=(4.6 * per_row, 3.9 * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= len(frames):
            continue
        f = frames[i]
        ax.set_xlim(0, 600)
        ax.set_ylim(450, 20)
        ax.set_aspect("equal")
        nodes = f["nodes"]
        for a in f["arrows"]:
            p, q = nodes[a["src"]], nodes[a["dst"]]
            ax.annotate(
                "",
                xy=(q["x"], q["y"]),
                xytext=(p["x"], p["y"]),
                arrowprops=dict(
                    arrowstyle="-|>",
                    color=a["color"],
                    lw=1.4 if a["dashed"] else 2.2,
                    linestyle="--" if a["dashed"] else "-",
                    shrinkA=17,
                    shrinkB=17,
                    connectionstyle=f"arc3,rad={-a.get('bend', 0.12)}",
                ),
            )
            if a.get("label"):
                b = a.get("bend", 0.12)
                mx = (p["x"] + q["x"]) / 2 + b * 0.75 * (q["y"] - p["y"])
                my = (p["y"] + q["y"]) / 2 - b * 0.75 * (q["x"] - p["x"])
                ax.text(
                    mx,
                    my,
                    a["label"],
                    fontsize=6.5,
                    color=a["color"],
                    ha="center",
                    va="center",
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85),
                )
        for nd in nodes:
            if nd.get("hidden"):
                continue
            ax.add_patch(
                plt.Circle(
                    (nd["x"], nd["y"]),
                    42,
                    facecolor=nd["color"],
                    edgecolor="#333",
                    lw=2.5 if nd.get("bold") else 0.8,
                    linestyle="--" if nd.get("dashed") else "-",
                )
            )
            ax.text(
                nd["x"],
                nd["y"] - 6,
                nd["label"],
                ha="center",
                va="center",
                fontsize=7.5,
                weight="bold",
                color=nd["text"],
            )
            if nd["sub"]:
                ax.text(
                    nd["x"],
                    nd["y"] + 14,
                    nd["sub"],
                    ha="center",
                    va="center",
                    fontsize=5.5,
                    color=nd["text"],
                )
        ax.set_title(textwrap.fill(f"{i}. {f['title']}", 48), fontsize=8.5)
        # Wrapped, never cut: a panel says what the text says (at most MAX_LINES lines,
        # and then it says the text has the rest).
        lines = textwrap.wrap(f["note"], 80) if f.get("note") else []
        for ln in f.get("text", []):
            lines += textwrap.wrap(ln, 80, subsequent_indent="  ") if ln else []
        if len(lines) > MAX_LINES:
            lines = lines[: MAX_LINES - 1] + ["... (the text output has the rest)"]
        ax.text(
            10,
            365,
            "\n".join(lines),
            ha="left",
            va="top",
            fontsize=6.3,
            color="#333",
            family="monospace",
        )
    fig.suptitle(model["title"], fontsize=11)
    fig.text(0.01, 0.005, model.get("legend", ""), fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
