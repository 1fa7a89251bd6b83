"""Explain an algorithm by running it: step by step, each rank's buffer, and a picture.

    python -m collectives.explain ring --world-size 3 --count 6        # also tree, naive, direct,
    python -m collectives.explain reduce --world-size 4 --count 4      #   reduce, broadcast
    python -m collectives.explain ring --world-size 3 --count 6 --step # one event per Enter
    python -m collectives.explain crossover --alpha 50us --beta 1GB/s  # ring vs tree, model and run
    python -m collectives.explain stall --world-size 3 --culprit 1     # a stalled op: who waited
                                                                       #   on whom, who was blamed
    python -m collectives.explain all_to_all --world-size 4 --count 2  # also gather, scatter
                                                                       #   (blocks that only move)

How a buffer can tell its own story: rank r starts with 2**r in every element (int64, SUM), so
any value is a set of ranks written in binary -- 5 = 0b101 is "the sum of ranks 0 and 2". The
run is a real cl.simulate run traced with record_data=True; the text and the picture are
replayed from the trace, round by round (see invariants.assign_rounds), and the theory-vs-run
checks of invariants.py are printed at the end.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np

from .. import invariants as inv
from . import exchange
from ...algorithms.chunks import chunk_bounds
from ..simulate import simulate
from ..trace import Tracer, match_messages

ALL_REDUCE = ("ring", "tree", "naive", "direct")
ROOTED = ("reduce", "broadcast")
DESCRIPTION = {
    "ring": "ring all_reduce (reduce-scatter, then all-gather)",
    "tree": "binomial tree all_reduce (reduce to rank 0, then broadcast)",
    "naive": "naive all_reduce (everything to rank 0, then back)",
    "direct": "direct all_reduce (everyone sends everything to everyone)",
    "reduce": "binomial tree reduce",
    "broadcast": "binomial tree broadcast",
}


def initial(algorithm: str, n: int, count: int, root: int = 0) -> list:
    """Each rank's input: 2**r everywhere (for broadcast: the root holds the full set, the
    others nothing yet)."""
    if algorithm == "broadcast":
        return [np.full(count, (1 << n) - 1 if r == root else 0, np.int64) for r in range(n)]
    return [np.full(count, 1 << r, np.int64) for r in range(n)]


def make_fn(algorithm: str, inputs: list, root: int = 0):
    def fn(pg):
        x = inputs[pg.rank].copy()
        if algorithm in ALL_REDUCE:
            pg.all_reduce(x, algorithm=algorithm)
        elif algorithm == "reduce":
            pg.reduce(x, dst=root)
        elif algorithm == "broadcast":
            pg.broadcast(x, src=root)
        else:
            raise ValueError(f"explain: unknown algorithm {algorithm!r}")
        return x
    return fn


@dataclass
class Explained:
    algorithm: str
    n: int
    count: int
    root: int
    events: list          # data events (no confirm messages), each with a "round"
    confirms: int         # how many confirm events were left out
    rounds: int
    states: list          # states[k][r]: rank r's (working) buffer after round k (0 = start)
    messages: list        # messages[k]: list of (send event, recv event) arriving in round k
    finals: list          # each rank's buffer when the op returned
    report: inv.Report
    tracer: Tracer


def explain_run(algorithm: str, n: int, count: int, root: int = 0) -> Explained:
    if algorithm not in ALL_REDUCE + ROOTED:
        raise ValueError(f"explain: unknown algorithm {algorithm!r}; choose one of "
                         f"{', '.join(ALL_REDUCE + ROOTED)}")
    if not 1 <= n <= 62:
        raise ValueError(f"explain: world size must be 1..62 (one bit per rank), got {n}")
    if count < 1:
        raise ValueError(f"explain: count must be >= 1, got {count}")
    if algorithm in ALL_REDUCE:
        root = 0                    # all_reduce has no root (tree reduces to rank 0)
    elif not 0 <= root < n:
        raise ValueError(f"explain: root {root} is not a rank of a world of size {n}")
    inputs = initial(algorithm, n, count, root)
    tracer = Tracer(record_data=True, max_data=1 << 16)
    finals = simulate(n, make_fn(algorithm, inputs, root), wrappers=[tracer.wrap], timeout=30.0)
    every = tracer.sorted_events()
    events = inv.data_events(every)
    rounds = inv.assign_rounds(events)
    report = inv.check(events, algorithm, world_size=n, count=count, itemsize=8, root=root,
                       finals=finals)

    # Replay: after round k, rank r has done every event of round <= k that comes before its
    # first event of a later round.
    by_rank = [[e for e in events if e["rank"] == r] for r in range(n)]
    state = [x.copy() for x in inputs]
    cursor = [0] * n
    states = [[x.copy() for x in state]]
    for k in range(1, rounds + 1):
        for r in range(n):
            evs = by_rank[r]
            while cursor[r] < len(evs) and evs[cursor[r]]["round"] <= k:
                e = evs[cursor[r]]
                if e["kind"] != "send" and e["count"]:
                    state[r][e["offset"]:e["offset"] + e["count"]] = e["data"]
                e["applied"] = k
                cursor[r] += 1
        states.append([x.copy() for x in state])
    messages = [[] for _ in range(rounds + 1)]
    for key, pair in sorted(match_messages(events).items(),
                            key=lambda kv: (kv[0][1], kv[0][2], kv[0][3])):
        messages[pair["send"]["round"]].append((pair["send"], pair["recv"]))
    return Explained(algorithm, n, count, root, events, len(every) - len(events), rounds,
                     states, messages, finals, report, tracer)


# --- text -------------------------------------------------------------------------------------
def label(v: int, n: int) -> str:
    """A value as the set of ranks it sums: '-' none, '0+2' a partial sum, 'ALL' the result."""
    v = int(v)
    if v == 0:
        return "-"
    if v == (1 << n) - 1:
        return "ALL"
    return "+".join(str(r) for r in range(n) if v >> r & 1)


def _cells(buf, bounds, n) -> list:
    cells = []
    for a, b in bounds:
        labels = [label(v, n) for v in buf[a:b]]
        cells.append(labels[0] if len(set(labels)) == 1 else "|".join(labels) if labels else "")
    return cells


def _chunk_name(a, b, bounds) -> str:
    ids = [i for i, (s, e) in enumerate(bounds) if s < b and a < e]
    if not ids:
        return "(empty)"
    name = f"c{ids[0]}" if len(ids) == 1 else f"c{ids[0]}-c{ids[-1]}"
    return f"{name} [{a}:{b}]"


def _round_title(msgs, steps_vary) -> str:
    seen = []
    for s, _ in msgs:
        t = s["phase"] + (f" step {s['step']}" if steps_vary.get(s["phase"]) else "")
        if t not in seen:
            seen.append(t)
    return ", ".join(seen)


def _steps_vary(events) -> dict:
    steps: dict = {}
    for e in events:
        steps.setdefault(e["phase"], set()).add(e["step"])
    return {p: len(s) > 1 for p, s in steps.items()}


def text(x: Explained) -> str:
    n, count = x.n, x.count
    bounds = chunk_bounds(count, n)
    names = [f"c{i} [{a}:{b}]" for i, (a, b) in enumerate(bounds)]
    all_cells = [_cells(s[r], bounds, n) for s in x.states for r in range(n)]
    all_cells += [_cells(f, bounds, n) for f in x.finals]
    width = max([len(c) for row in all_cells for c in row] + [len(nm) for nm in names])
    rootinfo = f", root {x.root}" if x.algorithm in ROOTED else ""
    if x.algorithm == "broadcast":
        legend = ["The root starts with 2**n - 1 in every element, the others with 0:",
                  f"  'ALL' the root's data, '-' nothing yet."]
    else:
        legend = ["Rank r starts with 2**r in every element, so a value names the ranks summed "
                  "into it:",
                  f"  '1' rank 1's own input, '0+2' a partial sum of ranks 0 and 2, 'ALL' the "
                  f"final sum of all {n} ranks, '-' nothing yet."]
    out = [f"{DESCRIPTION[x.algorithm]}: world size {n}, {count} int64 elements, SUM{rootinfo}",
           *legend,
           "Chunks (one per rank): " + ", ".join(names)]
    if x.confirms:
        out.append(f"({x.confirms // 2} empty confirm messages are not shown)")

    def rows(buffers, tag="rank"):
        head = " " * 10 + "  ".join(nm.ljust(width) for nm in names)
        lines = [head.rstrip()]
        for r, buf in enumerate(buffers):
            lines.append(f"  {tag} {r}".ljust(10) + "  ".join(
                c.ljust(width) for c in _cells(buf, bounds, n)).rstrip())
        return lines

    out += ["", "start"] + rows(x.states[0])
    vary = _steps_vary(x.events)
    for k in range(1, x.rounds + 1):
        msgs = x.messages[k]
        out += ["", f"round {k}: {_round_title(msgs, vary)} ({len(msgs)} message"
                    f"{'s' if len(msgs) != 1 else ''})"]
        for s, rcv in msgs:
            what = "added in" if rcv["kind"] == "reduce" else "copied in"
            late = rcv.get("applied", k)
            out.append(f"  rank {s['src']} -> rank {s['dst']}  "
                       f"{_chunk_name(s['offset'], s['offset'] + s['count'], bounds)}  "
                       f"{s['nbytes']} B  {what}" +
                       (f" (in round {late}: rank {s['dst']} takes its messages in a fixed "
                        "order)" if late > k else ""))
        out += rows(x.states[k])
    out += ["", "result (each rank's buffer when the call returned)"] + rows(x.finals)
    out += ["", str(x.report)]
    return "\n".join(out) + "\n"


# --- picture ----------------------------------------------------------------------------------
def draw(x: Explained, path, *, title: str | None = None):
    """Ranks as rows, rounds as columns; each buffer a row of cells coloured by chunk, filled in
    proportion to how many ranks it holds the sum of; arrows are the messages of each round."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n, count = x.n, x.count
    bounds = chunk_bounds(count, n)
    chunk_of = np.zeros(count, dtype=int)
    for i, (a, b) in enumerate(bounds):
        chunk_of[a:b] = i
    cmap = plt.get_cmap("tab10")
    cols = x.rounds + 1
    W, H = 1.0, 1.0
    box_w, box_h = 0.62 * W, 0.42 * H
    cw = box_w / count
    fig, ax = plt.subplots(figsize=(1.4 + 1.45 * cols, 1.1 + 0.62 * n))

    def cell_x(col, i):
        return col * W - box_w / 2 + i * cw

    full = (1 << n) - 1
    for col in range(cols):
        for r in range(n):
            y = -r * H
            buf = x.states[col][r]
            for i in range(count):
                v = int(buf[i])
                k = bin(v).count("1")
                face = cmap(chunk_of[i] % 10)
                alpha = 0.0 if k == 0 else 0.18 + 0.82 * k / n
                ax.add_patch(Rectangle((cell_x(col, i), y - box_h / 2), cw, box_h,
                                       facecolor=face, alpha=alpha, linewidth=0))
                ax.add_patch(Rectangle((cell_x(col, i), y - box_h / 2), cw, box_h, fill=False,
                                       edgecolor="black", linewidth=2.0 if v == full else 0.4))
                if count <= 12 and n > 1:
                    ax.text(cell_x(col, i) + cw / 2, y, str(k), ha="center", va="center",
                            fontsize=6, color="black")
    vary = _steps_vary(x.events)
    for k in range(1, cols):
        for s, rcv in x.messages[k]:
            a, c = s["offset"], s["count"]
            mid = a + c / 2 if c else 0
            color = cmap(chunk_of[min(a, count - 1)] % 10) if c else "grey"
            x0 = cell_x(k - 1, 0) + mid * cw
            x1 = cell_x(k, 0) + mid * cw
            y0, y1 = -s["src"] * H, -s["dst"] * H
            y0 += -box_h / 2 if y1 < y0 else box_h / 2 if y1 > y0 else 0
            y1 += box_h / 2 if y1 < y0 else -box_h / 2 if y1 > y0 else 0
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                        arrowprops=dict(arrowstyle="-|>", color=color, lw=1.4,
                                        linestyle="-" if rcv["kind"] == "reduce" else "--",
                                        shrinkA=1, shrinkB=1,
                                        connectionstyle="arc3,rad=0.08"))
        ax.text(k * W, 0.62 * H, f"round {k}\n{_round_title(x.messages[k], vary)}",
                ha="center", va="bottom", fontsize=7)
    ax.text(0, 0.62 * H, "start", ha="center", va="bottom", fontsize=7)
    for r in range(n):
        ax.text(-box_w / 2 - 0.06 * W, -r * H, f"rank {r}", ha="right", va="center",
                fontsize=8)
    ax.set_xlim(-box_w / 2 - 0.5 * W, (cols - 1) * W + box_w / 2 + 0.05 * W)
    ax.set_ylim(-(n - 1) * H - box_h / 2 - 0.1 * H, 1.0 * H)
    ax.axis("off")
    ax.set_title(title or f"{DESCRIPTION[x.algorithm]}, {n} ranks, {count} elements",
                 fontsize=9)
    fig.text(0.01, 0.01, "cell colour = chunk; fill = share of ranks summed in (number shown); "
             "thick edge = final; solid arrow = received and added, dashed = copied",
             fontsize=6.5)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


# --- stepping in the terminal -----------------------------------------------------------------
def step_interactively(algorithm, n, count, root=0, stream_in=None, stream_out=None) -> int:
    """Run with every rank paused at each send/receive; Enter lets the next event happen,
    'c' runs to the end, 'q' stops."""
    from ..step import Stepper
    stream_in = stream_in or sys.stdin
    stream_out = stream_out or sys.stdout
    if algorithm in exchange.EXCHANGES:
        # blocks only move: show each rank's output, one label per block
        fn = exchange.make_fn(algorithm, exchange.inputs(algorithm, n, count, root), root,
                              count)
        state = exchange.outputs(algorithm, n, count, root)

        def show(buf):
            return " ".join(exchange._cells(buf, count)) if buf is not None else "no output"
    else:
        inputs = initial(algorithm, n, count, root)
        fn = make_fn(algorithm, inputs, root)
        state = [x.copy() for x in inputs]

        def show(buf):
            return " ".join(label(v, n) for v in buf)

    stepper = Stepper(n, fn, record_data=True)
    interactive, k = True, 0
    try:
        while not stepper.done:
            if interactive:
                for r, p in sorted(stepper.pending().items()):
                    if p is not None:
                        print(f"    rank {r} waits to {p['kind']} {p['phase']} chunk "
                              f"{p['chunk']} {'to' if p['kind'] == 'send' else 'from'} rank "
                              f"{p['peer']}", file=stream_out)
                print("[Enter] next event, c continue, q quit> ", end="", file=stream_out,
                      flush=True)
                answer = stream_in.readline()
                if answer == "" or answer.strip().lower() == "c":
                    interactive = False
                elif answer.strip().lower() == "q":
                    stepper.close()
                    print("stopped", file=stream_out)
                    return 1
            e = stepper.step()
            if e is None:
                break
            k += 1
            if e["kind"] != "send" and e["count"] and state[e["rank"]] is not None:
                state[e["rank"]][e["offset"]:e["offset"] + e["count"]] = e["data"]
            arrow = (f"rank {e['rank']} -> rank {e['peer']}" if e["kind"] == "send"
                     else f"rank {e['rank']} <- rank {e['peer']} ({'added' if e['kind'] == 'reduce' else 'copied'})")
            print(f"event {k}: {e['phase']} step {e['step']} chunk {e['chunk']}: {arrow}, "
                  f"{e['nbytes']} B; rank {e['rank']} now holds "
                  f"[{show(state[e['rank']])}]", file=stream_out)
        results = stepper.results()
    finally:
        stepper.close()
    print("result: " + "; ".join(f"rank {r} [{show(res)}]"
                                 for r, res in enumerate(results)), file=stream_out)
    return 0


# --- the crossover ----------------------------------------------------------------------------
DEFAULT_SIZES = [64 << (2 * i) for i in range(9)]     # 64 B .. 4 MiB


def crossover(alpha: float, beta: float, n: int = 8, sizes=DEFAULT_SIZES,
              algorithms=("ring", "tree"), segment_bytes: int | None = None) -> list:
    """Rows of (nbytes, {algorithm: (model seconds, emulated seconds)}), float32 buffers."""
    from ..emulate import LinkModel, ring_time, tree_time
    model_fn = {"ring": ring_time, "tree": tree_time}
    rows = []
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        row = {}
        for alg in algorithms:
            m = LinkModel(alpha, beta)
            simulate(n, lambda pg, alg=alg: pg.all_reduce(np.ones(count, np.float32),
                                                          algorithm=alg),
                     wrappers=[m.wrap], segment_bytes=segment_bytes or max(nbytes, 1 << 20))
            f = model_fn.get(alg)
            row[alg] = (f(count * 4, n, alpha, beta) if f else None, m.makespan())
        rows.append((count * 4, row))
    return rows


def _size(b) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b:g} B"


def crossover_text(rows, alpha, beta, n) -> str:
    from ..emulate import crossover_bytes
    algs = list(rows[0][1]) if rows else []
    star = crossover_bytes(n, alpha, beta)
    out = [f"all_reduce on {n} ranks, alpha = {alpha * 1e6:g} us, beta = {beta * 1e9:g} ns/B "
           f"({1 / beta / 1e9:g} GB/s); times in us" if beta else
           f"all_reduce on {n} ranks, alpha = {alpha * 1e6:g} us, beta = 0"]
    head = ["size"] + [f"{a} {k}" for a in algs for k in ("model", "emulated")] + [
        "faster (model)", "faster (emulated)"]
    table = [head]
    for nbytes, row in rows:
        cells = [_size(nbytes)]
        for a in algs:
            mod, emu = row[a]
            cells += ["-" if mod is None else f"{mod * 1e6:.1f}", f"{emu * 1e6:.1f}"]
        mods = {a: row[a][0] for a in algs if row[a][0] is not None}
        cells.append(min(mods, key=mods.get) if mods else "-")
        cells.append(min(algs, key=lambda a: row[a][1]))
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    out += ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in table]
    if star is not None:
        out.append(f"alpha-beta model: ring and tree cost the same at N* = alpha*(n-1-log2 n) / "
                   f"(beta*(log2 n - (n-1)/n)) = {star:,.0f} B; tree is faster below, ring above")
    if "ring" in algs and "tree" in algs:
        flips = [(pb, nb) for (nb, row), (pb, prev) in zip(rows[1:], rows[:-1])
                 if (row["ring"][1] < row["tree"][1]) != (prev["ring"][1] < prev["tree"][1])]
        if flips:
            out.append("emulated runs: the faster algorithm changes between " +
                       ", ".join(f"{_size(a)} and {_size(b)}" for a, b in flips))
    return "\n".join(out) + "\n"


def crossover_plot(rows, alpha, beta, n, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ..emulate import crossover_bytes
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    sizes = [nb for nb, _ in rows]
    for i, alg in enumerate(rows[0][1]):
        color = plt.get_cmap("tab10")(i)
        mod = [row[alg][0] for _, row in rows]
        if all(v is not None for v in mod):
            ax.plot(sizes, [v * 1e6 for v in mod], "-", color=color, label=f"{alg}: model")
        ax.plot(sizes, [row[alg][1] * 1e6 for _, row in rows], "o", color=color, mfc="none",
                label=f"{alg}: emulated run")
    star = crossover_bytes(n, alpha, beta)
    if star is not None:
        ax.axvline(star, color="grey", linestyle=":", label=f"N* = {star:,.0f} B")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("buffer size (bytes)")
    ax.set_ylabel("all_reduce time (us)")
    ax.set_title(f"ring vs tree, {n} ranks, alpha {alpha * 1e6:g} us, "
                 f"{1 / beta / 1e9:g} GB/s" if beta else f"ring vs tree, {n} ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


# --- command line -----------------------------------------------------------------------------
def main(argv=None) -> int:
    from ..emulate import parse_beta, parse_time
    p = argparse.ArgumentParser(prog="python -m collectives.explain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=ALL_REDUCE + ROOTED + exchange.EXCHANGES +
                   ("crossover", "stall"))
    p.add_argument("--culprit", type=int, default=1,
                   help="stall: the rank whose links (in and out) are slowed (default 1)")
    p.add_argument("--world-size", "-n", type=int, default=None,
                   help="ranks (default 3; 8 for crossover)")
    p.add_argument("--count", "-c", type=int, default=None,
                   help="elements (default 6; for all_to_all, gather, scatter: per block, "
                        "default 1)")
    p.add_argument("--root", type=int, default=0,
                   help="root of reduce / broadcast / gather / scatter")
    p.add_argument("--out", "-o", default=None,
                   help="picture path (.png or .svg; default explain_<what>_<n>x<count>.png, "
                        "crossover.png)")
    p.add_argument("--no-plot", action="store_true", help="text only")
    p.add_argument("--chrome", default=None, help="also write the Chrome trace JSON here")
    p.add_argument("--json", default=None, help="also write the plain JSON trace here")
    p.add_argument("--step", action="store_true", help="pause at every send/receive")
    p.add_argument("--alpha", default="50us", help="crossover: per-message latency")
    p.add_argument("--beta", default="1GB/s", help="crossover: link bandwidth (or time per byte)")
    p.add_argument("--sizes", default=None,
                   help="crossover: comma-separated byte sizes (default 64 B .. 4 MiB, x4)")
    p.add_argument("--segment-bytes", type=int, default=None,
                   help="crossover: pipeline segment size (default: no pipelining, as the "
                        "textbook model)")
    a = p.parse_args(argv)
    try:
        if a.what == "crossover":
            n = a.world_size or 8
            alpha, beta = parse_time(a.alpha), parse_beta(a.beta)
            sizes = ([int(float(s)) for s in a.sizes.split(",")] if a.sizes else DEFAULT_SIZES)
            rows = crossover(alpha, beta, n, sizes, segment_bytes=a.segment_bytes)
            sys.stdout.write(crossover_text(rows, alpha, beta, n))
            if not a.no_plot:
                path = crossover_plot(rows, alpha, beta, n, a.out or "crossover.png")
                print(f"picture: {path}")
            return 0
        n = a.world_size or 3
        if a.what == "stall":
            from .. import stall
            story = stall.run_stall(n, a.culprit)
            sys.stdout.write(stall.text(story))
            if not a.no_plot:
                print(f"picture: {stall.draw(story, a.out or f'explain_stall_{n}.png')}")
            return 0
        count = a.count if a.count is not None else \
            1 if a.what in exchange.EXCHANGES else 6
        if a.step:
            return step_interactively(a.what, n, count, a.root)
        if a.what in exchange.EXCHANGES:
            x = exchange.explain_exchange(a.what, n, count, a.root)
        else:
            x = explain_run(a.what, n, count, a.root)
    except ValueError as exc:
        p.error(str(exc))
    sys.stdout.write((exchange.text if a.what in exchange.EXCHANGES else text)(x))
    if a.chrome:
        x.tracer.save_chrome(a.chrome)
        print(f"chrome trace: {a.chrome}")
    if a.json:
        x.tracer.save_json(a.json)
        print(f"trace: {a.json}")
    if not a.no_plot:
        path = (exchange.draw if a.what in exchange.EXCHANGES else draw)(
            x, a.out or f"explain_{a.what}_{n}x{count}.png")
        print(f"picture: {path}")
    return 0 if x.report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
