"""Explain an algorithm by running it: step by step, each rank's buffer, and a picture.

    python -m collectives.explain ring --world-size 3 --count 6        # also tree, naive, direct,
                                                                       #   halving_doubling,
    python -m collectives.explain hierarchical -n 4 --hosts 0,0,1,1    #   hierarchical (on hosts),
    python -m collectives.explain reduce --world-size 4 --count 4      #   reduce, broadcast
    python -m collectives.explain ring --world-size 3 --count 6 --step # one event per Enter
    python -m collectives.explain crossover --alpha 50us --beta 1GB/s  # ring vs tree, model and run
    python -m collectives.explain slowlink                             # one link 10x slower
    python -m collectives.explain slowlink -n 4 --slow 0-1             # and the schedule the
                                                                       #   library picks around it
    python -m collectives.explain stall --world-size 3 --culprit 1     # a stalled op: who waited
                                                                       #   on whom, who was blamed
    python -m collectives.explain crash --signal KILL                  # a real job loses rank 1;
    python -m collectives.explain reconstruct                          #   generation 1, renumbered;
    python -m collectives.explain join                                 #   a joiner gets the model
    python -m collectives.explain replay --html run.html               # the same job's messages,
                                                                       #   every process, replayed
    python -m collectives.explain all_to_all --world-size 4 --count 2  # also gather, scatter
                                                                       #   (blocks that only move)
    python -m collectives.explain io [COLLECTIVE] --out docs/img       # each collective's input
                                                                       #   and output, per rank
    python -m collectives.explain ring -n 4 -c 8 --html ring.html      # a page that plays the
                                                                       #   rounds (any algorithm)

Rank r starts with 2**r in every element (int64, SUM), so any value is a set of ranks written
in binary -- 5 = 0b101 is "the sum of ranks 0 and 2".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import IO, Any, Sequence

from ..emulate import parse_beta, parse_time
from ..step import Stepper
from . import exchange
from .drawing import crossover_plot, draw
from .run import (
    ALL_REDUCE,
    DEFAULT_SIZES,
    ROOTED,
    crossover,
    default_hosts,
    explain_run,
    initial,
    make_fn,
    parse_hosts,
)
from .text import crossover_text, label, text


DEFAULT_DIR = "explain_out"


def default_out(name: str) -> str:
    """Where a picture goes without --out: explain_out/ (in .gitignore), made if missing."""
    os.makedirs(DEFAULT_DIR, exist_ok=True)
    return os.path.join(DEFAULT_DIR, name)


def step_interactively(
    algorithm: str,
    n: int,
    count: int,
    root: int = 0,
    stream_in: IO[str] | None = None,
    stream_out: IO[str] | None = None,
    hosts: Sequence[Any] | None = None,
) -> int:
    """Run with every rank paused at each send/receive; Enter lets the next event happen,
    'c' runs to the end, 'q' stops."""
    stream_in = stream_in or sys.stdin
    stream_out = stream_out or sys.stdout
    if algorithm in exchange.EXCHANGES:
        # blocks only move: show each rank's output, one label per block
        fn = exchange.make_fn(algorithm, exchange.inputs(algorithm, n, count, root), root, count)
        state = exchange.outputs(algorithm, n, count, root)

        def show(buf):
            return " ".join(exchange.block_cells(buf, count)) if buf is not None else "no output"
    else:
        inputs = initial(algorithm, n, count, root)
        fn = make_fn(algorithm, inputs, root)
        state = [x.copy() for x in inputs]

        def show(buf):
            return " ".join(label(v, n) for v in buf)

    if hosts is None and algorithm == "hierarchical":
        hosts = default_hosts(n)
    stepper = Stepper(n, fn, record_data=True, hosts=hosts)
    interactive, k = True, 0
    try:
        while not stepper.done:
            if interactive:
                for r, p in sorted(stepper.pending().items()):
                    if p is not None:
                        print(
                            f"    rank {r} waits to {p['kind']} {p['phase']} chunk "
                            f"{p['chunk']} {'to' if p['kind'] == 'send' else 'from'} rank "
                            f"{p['peer']}",
                            file=stream_out,
                        )
                print(
                    "[Enter] next event, c continue, q quit> ", end="", file=stream_out, flush=True
                )
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
                state[e["rank"]][e["offset"] : e["offset"] + e["count"]] = e["data"]
            arrow = (
                f"rank {e['rank']} -> rank {e['peer']}"
                if e["kind"] == "send"
                else f"rank {e['rank']} <- rank {e['peer']} ({'added' if e['kind'] == 'reduce' else 'copied'})"
            )
            print(
                f"event {k}: {e['phase']} step {e['step']} chunk {e['chunk']}: {arrow}, "
                f"{e['nbytes']} B; rank {e['rank']} now holds "
                f"[{show(state[e['rank']])}]",
                file=stream_out,
            )
        results = stepper.results()
    finally:
        stepper.close()
    print(
        "result: " + "; ".join(f"rank {r} [{show(res)}]" for r, res in enumerate(results)),
        file=stream_out,
    )
    return 0


def save_model(model: dict, path: str | None) -> None:
    """Keep the model a picture was drawn from (JSON): the picture and any text quoting it
    then come from one source (tests/unit/teaching/test_figures.py redraws docs/img's)."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(model, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"model: {path}")


def failure_view(
    what: str,
    n: int,
    victim: int,
    sig: str,
    out: str | None,
    page: str | None,
    no_plot: bool,
    model_json: str | None = None,
) -> int:
    """Run the failure story (real processes, teaching/failures.py) and tell one part of it."""
    from .. import failures
    from . import html, views

    story = failures.run_story(sig, n=n, victim=victim)
    if what == "crash":
        model = views.crash_model(story, failures.stepped_crash(n, victim))
    elif what == "reconstruct":
        model = views.reconstruct_model(story, failures.stepped_redo(n - 1))
    else:
        model = views.join_model(story, failures.stepped_handover(n))
    sys.stdout.write(views.text(model))
    if not no_plot:
        print(f"picture: {views.draw_panels(model, out or default_out(f'explain_{what}.png'))}")
    if page:
        print(f"page: {html.write(model, page)}")
    save_model(model, model_json)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m collectives.explain",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "what",
        choices=ALL_REDUCE
        + ROOTED
        + exchange.EXCHANGES
        + ("crossover", "slowlink", "stall", "crash", "reconstruct", "join", "replay", "io"),
    )
    p.add_argument(
        "collective",
        nargs="?",
        default=None,
        help="io: the collective to picture (default: all of them; one of "
        "all_reduce, reduce, broadcast, all_gather, reduce_scatter, all_to_all, "
        "gather, scatter, barrier, send_recv)",
    )
    p.add_argument(
        "--signal",
        choices=("KILL", "STOP"),
        default="KILL",
        help="crash / reconstruct / join: how the victim fails (default KILL: the "
        "kernel closes its connections; STOP: only heartbeats tell)",
    )
    p.add_argument(
        "--victim",
        type=int,
        default=1,
        help="crash / reconstruct / join: the rank that fails (default 1)",
    )
    p.add_argument(
        "--links",
        default=None,
        help="stall: the links to hold back, e.g. '2->0,1->0' (quoted: > is the "
        "shell's) or 2:0,1:0 (default: into and out of --culprit)",
    )
    p.add_argument(
        "--culprit",
        type=int,
        default=1,
        help="stall: the rank whose links (in and out) are slowed (default 1)",
    )
    p.add_argument(
        "--world-size", "-n", type=int, default=None, help="ranks (default 3; 8 for crossover)"
    )
    p.add_argument(
        "--count",
        "-c",
        type=int,
        default=None,
        help="elements (default 6; for all_to_all, gather, scatter: per block, default 1)",
    )
    p.add_argument(
        "--root", type=int, default=0, help="root of reduce / broadcast / gather / scatter"
    )
    p.add_argument(
        "--hosts",
        default=None,
        help="the host of each rank, e.g. 0,0,1,1 (sets the world size if -n is "
        "not given); hierarchical defaults to two hosts of half the ranks",
    )
    p.add_argument(
        "--out",
        "-o",
        default=None,
        help="picture path (.png or .svg; default explain_out/explain_<what>_"
        "<n>x<count>.png, explain_out/crossover.png: a folder .gitignore "
        "covers)",
    )
    p.add_argument("--no-plot", action="store_true", help="text only")
    p.add_argument(
        "--html",
        default=None,
        help="also write one self-contained page here that plays, steps and scrubs "
        "through the rounds (no network resources; #step=K opens step K)",
    )
    p.add_argument(
        "--model-json",
        default=None,
        help="crash / reconstruct / join / slowlink: also keep the model the picture is "
        "drawn from (JSON) here",
    )
    p.add_argument(
        "--slow",
        default=None,
        help="slowlink: these links slow (0-1: the pair both ways; 0->1 or 0:1 one way; "
        "comma-separated): draw the schedule the library chooses around them, with the cost "
        "model's predicted times (default 4 ranks)",
    )
    p.add_argument(
        "--factor",
        type=float,
        default=50.0,
        help="slowlink --slow: how many times less throughput the slow links have (default 50: "
        "40 Mbit/s beside 2 Gbit/s)",
    )
    p.add_argument(
        "--bytes",
        type=int,
        default=4 << 20,
        help="slowlink --slow: the all_reduce's size (default 4 MiB)",
    )
    p.add_argument("--chrome", default=None, help="also write the Chrome trace JSON here")
    p.add_argument("--json", default=None, help="also write the plain JSON trace here")
    p.add_argument("--step", action="store_true", help="pause at every send/receive")
    p.add_argument("--alpha", default="50us", help="crossover: per-message latency")
    p.add_argument("--beta", default="1GB/s", help="crossover: link bandwidth (or time per byte)")
    p.add_argument(
        "--sizes",
        default=None,
        help="crossover: comma-separated byte sizes (default 64 B .. 4 MiB, x4)",
    )
    p.add_argument(
        "--segment-bytes",
        type=int,
        default=None,
        help="crossover: cut every message into segments of this many bytes (default: one "
        "segment a message, as the formulas; double_tree: the model's best segment count)",
    )
    a = p.parse_args(argv)
    try:
        if a.what == "crossover":
            n = a.world_size or 8
            alpha, beta = parse_time(a.alpha), parse_beta(a.beta)
            sizes = [int(float(s)) for s in a.sizes.split(",")] if a.sizes else DEFAULT_SIZES
            rows = crossover(
                alpha,
                beta,
                n,
                sizes,
                algorithms=("ring", "tree", "halving_doubling", "double_tree"),
                segment_bytes=a.segment_bytes,
            )
            sys.stdout.write(crossover_text(rows, alpha, beta, n))
            if not a.no_plot:
                path = crossover_plot(rows, alpha, beta, n, a.out or default_out("crossover.png"))
                print(f"picture: {path}")
            return 0
        if a.what == "slowlink":
            from . import html, views
            from .slow_link_view import slow_link, slow_link_model

            alpha, beta = parse_time(a.alpha), parse_beta(a.beta)
            if a.slow:
                from .reroute_view import parse_slow, reroute_model

                n = a.world_size or 4
                model = reroute_model(n, parse_slow(a.slow, n), a.bytes, alpha, beta, a.factor)
            else:
                model = slow_link_model(slow_link(a.world_size or 8, alpha=alpha, beta=beta))
            sys.stdout.write(views.text(model))
            if not a.no_plot:
                out = a.out or default_out("rerouted.png" if a.slow else "slow_link.png")
                print(f"picture: {views.draw_panels(model, out)}")
            if a.html:
                print(f"page: {html.write(model, a.html)}")
            save_model(model, a.model_json)
            return 0
        if a.what == "io":
            from . import io

            names = [a.collective] if a.collective else list(io.COLLECTIVES)
            for name in names:
                pic = io.run_io(name, a.world_size or 4, a.root)
                sys.stdout.write(io.text(pic) + "\n")
                if not a.no_plot:
                    out = (
                        os.path.join(a.out, f"io_{name}.png")
                        if a.out
                        else default_out(f"io_{name}.png")
                    )
                    print(f"picture: {io.draw(pic, out)}\n")
            return 0
        hosts = parse_hosts(a.hosts) if a.hosts else None
        n = a.world_size or (len(hosts) if hosts else 3)
        if a.what == "stall":
            from .. import stall

            links = None
            if a.links:
                try:
                    links = [
                        tuple(int(v) for v in part.replace("->", ":").split(":"))
                        for part in a.links.split(",")
                    ]
                except ValueError:
                    raise ValueError(
                        f"explain stall: --links takes src->dst pairs, "
                        f"comma-separated (e.g. 2->0,1->0), got {a.links!r}"
                    ) from None
            story = stall.run_stall(n, a.culprit, links=links)
            sys.stdout.write(stall.text(story))
            if not links:  # the stepped twin holds the culprit's two links
                from ..failures import stepped_stall

                st = stepped_stall(n, a.culprit)
                print(
                    f"Stepped (teaching/step.py, no clock: the held links' messages are "
                    f"never taken): stalled links "
                    f"{', '.join(f'{p}->{r}' for p, r in st.stalled)}; blamed rank "
                    f"{', '.join(map(str, st.blamed))} -- {st.why}."
                )
            if not a.no_plot:
                out = a.out or default_out(f"explain_stall_{n}.png")
                print(f"picture: {stall.draw(story, out)}")
            if a.html:
                from . import html, views

                print(f"page: {html.write(views.stall_model(story), a.html)}")
            return 0
        if a.what == "replay":
            from .. import failures
            from . import html, views
            from .replay_view import replay_model

            model = replay_model(failures.run_story(a.signal, n=n, victim=a.victim))
            sys.stdout.write(views.text(model))
            if a.out:
                print(f"picture: {views.draw_panels(model, a.out, per_row=4)}")
            if a.html:
                print(f"page: {html.write(model, a.html)}")
            save_model(model, a.model_json)
            return 0
        if a.what in ("crash", "reconstruct", "join"):
            return failure_view(
                a.what, n, a.victim, a.signal, a.out, a.html, a.no_plot, a.model_json
            )
        count = a.count if a.count is not None else 1 if a.what in exchange.EXCHANGES else 6
        if a.step:
            return step_interactively(a.what, n, count, a.root, hosts=hosts)
        if a.what in exchange.EXCHANGES:
            x: Any = exchange.explain_exchange(a.what, n, count, a.root)
        else:
            x = explain_run(a.what, n, count, a.root, hosts=hosts)
    except ValueError as exc:
        p.error(str(exc))
    sys.stdout.write((exchange.text if a.what in exchange.EXCHANGES else text)(x))
    if a.html:
        from . import html

        print(f"page: {html.write(html.grid_model(x), a.html)}")
    if a.chrome:
        x.tracer.save_chrome(a.chrome)
        print(f"chrome trace: {a.chrome}")
    if a.json:
        x.tracer.save_json(a.json)
        print(f"trace: {a.json}")
    if not a.no_plot:
        path = (exchange.draw if a.what in exchange.EXCHANGES else draw)(
            x, a.out or default_out(f"explain_{a.what}_{n}x{count}.png")
        )
        print(f"picture: {path}")
    return 0 if x.report.ok else 1
