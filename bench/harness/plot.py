"""The PNG: busbw vs size and latency vs size, log-log, one line per backend plus the limit
and the floors (black: solid the raw ring, dashed the latency floor, dotted the copy floor)."""

from __future__ import annotations


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on a benchmark box
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from .report import LIMITS
    from .spec import fmt_size

    meta, rows = result["meta"], result["results"]
    names = [b for b in (*meta["backends"], *LIMITS) if any(r["backend"] == b for r in rows)]
    dashed = {"limit": "-", "floor": "--", "copy": ":"}
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(12, 4.8))
    for name in names:
        pts = sorted(
            (r["size"], r["busbw_gbs"], r["time_us"], r["time_us_min"], r["time_us_max"])
            for r in rows
            if r["backend"] == name
        )
        sizes = [p[0] for p in pts]
        style = dict(linestyle=dashed[name], color="black") if name in dashed else dict(marker=".")
        ax_bw.plot(sizes, [max(p[1], 1e-6) for p in pts], label=name, **style)
        (line,) = ax_t.plot(sizes, [p[2] for p in pts], label=name, **style)
        # The spread of the repeats, so a reader sees how much of a gap is noise.
        ax_t.fill_between(
            sizes,
            [p[3] for p in pts],
            [p[4] for p in pts],
            color=line.get_color(),
            alpha=0.15,
            linewidth=0,
        )
    for ax, ylabel in ((ax_bw, "busbw (GB/s)"), (ax_t, "time (us, median; band: min-max)")):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_size(int(round(x)))))
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(
        f"{meta['collective']}, {meta['nproc']} ranks, {meta['dtype']} {meta['op']}, "
        f"{meta['transport']} loopback, {meta['machine']}",
        fontsize="medium",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
